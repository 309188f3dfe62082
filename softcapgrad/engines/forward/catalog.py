"""The engines parity knows: each one's environment, adapter script and routes, and how a route is judged.

An engine is an adapter script (``adapters/forward/adapter_<adapter>.py``) run by an environment's interpreter: a
virtual environment of its own (``requirements/<environment>.txt``) or ``main``, softcapgrad's own
interpreter for engines that need only torch and transformers. A route is one way its users run it:
``default`` is the engine's own documented default (loader, exporter, attention choice, precision,
KV cache); further routes name the one documented option that changes what the default does to a
cap (``eager`` attention, ``fp32`` where the default is bf16, flash attention off or on, ``q8_0``).

A route in fp32 is judged on the whole vocabulary; a route in a lower precision (bf16, fp16, an
8-bit format) on each position's top ``TOP_K`` tokens, where its tails are rounding noise.

Engines whose adapter and requirements exist but which this catalog does not list are found by
file name (``discovered``): their routes are read from the adapter's ``ROUTES`` literal, their
precision from the route's name.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from softcapgrad.engines.environments.environments import ADAPTER_PATH, ADAPTERS, MAIN, REQUIREMENTS, adapter_file

# Every file in adapters/ and its forward/ and training/ is named adapter_*.py: the folders are on the child's import
# path, and a module named after a package (transformers.py, onnx.py) would shadow it for the adapter that imports it.
PREFIX = "adapter_"
SHARED = ("protocol", "transformers_load", "llamacpp_sources", "monitor_check")  # imported or run by adapters: no engine of their own
TOP_K = 8
LOW = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11, "q8_0": 2.0 ** -8, "q4_0": 2.0 ** -4, "int8": 2.0 ** -8,
       "nf4": 2.0 ** -4}
FP16_TABLE = 2.0 ** -11  # llama.cpp's GELU reads an fp16 table: one rounding to fp16 in every MLP
ONCE = {"llamacpp": FP16_TABLE}  # engines found by file name that round one step coarser than their precision


@dataclass(frozen=True)
class Route:
    id: str
    text: str
    precision: str = "fp32"
    argument: str = ""  # the adapter's own route id, when it differs from ``id``
    once: float = 0.0  # unit roundoff of a step the engine rounds once to a coarser format than its precision

    @property
    def top_k(self) -> int:
        """0: judged on the whole vocabulary; K: on each position's K most likely tokens."""
        return 0 if self.precision == "fp32" else TOP_K

    @property
    def unit(self) -> float:
        return LOW.get(self.precision, 2.0 ** -24)

    @property
    def adapter_route(self) -> str:
        return self.argument or self.id


@dataclass(frozen=True)
class Engine:
    name: str
    environment: str  # requirements/<environment>.txt, or MAIN
    adapter: str  # adapters/forward/adapter_<adapter>.py (script())
    routes: tuple[Route, ...]
    text: str  # what the engine is, in a few words
    types: tuple[str, ...] | None = None  # model types the engine claims (None: the adapter says, exit 3)

    def route(self, rid: str) -> Route:
        for r in self.routes:
            if r.id == rid:
                return r
        raise KeyError(rid)


_TF = (Route("default", "AutoModelForCausalLM.from_pretrained(folder): the attention implementation and dtype "
                        "transformers picks by itself"),
       Route("eager", 'the same with attn_implementation="eager", the documented setting for soft-capped models'))

CATALOG: dict[str, Engine] = {e.name: e for e in (
    Engine("transformers", MAIN, "transformers", _TF, "transformers as constraints.txt pins it (main environment)"),
    Engine("transformers-4", "transformers-4", "transformers", _TF, "transformers 4.57.6, the last 4.x release"),
    Engine("transformers-5.0", "transformers-5.0", "transformers", _TF, "transformers 5.0.0"),
    Engine("torchexport", MAIN, "torchexport",
           (Route("default", "torch.export.export of the model as from_pretrained loads it; the exported module"),
            Route("eager", 'the same, loaded with attn_implementation="eager"')),
           "torch.export (main environment)"),
    Engine("inductor", MAIN, "torchexport",
           (Route("default", "torch.export.export, then torch.compile (inductor, C++ kernels)", argument="inductor"),
            Route("eager", 'the same, loaded with attn_implementation="eager"', argument="inductor-eager")),
           "torch.compile with inductor (main environment)"),
    Engine("onnx", "onnx", "onnx",
           (Route("default", "torch.onnx.export (dynamo) of the model as from_pretrained loads it -> ONNX Runtime"),
            Route("eager", 'the same, loaded with attn_implementation="eager"')),
           "torch.onnx.export + ONNX Runtime (own environment)"),
    Engine("llamacpp", "llamacpp", "llamacpp",
           (Route("default", "llama.cpp's convert_hf_to_gguf.py with its default --outtype auto (f16 tensors here), "
                             "llama_cpp.Llama defaults: flash attention off, f16 KV cache", "fp16", once=FP16_TABLE),
            Route("f32", "--outtype f32; flash attention off, f16 KV cache (keys and values rounded to fp16: "
                         "judged as an fp16 row)", "fp16", once=FP16_TABLE),
            Route("f32-fa", "--outtype f32; flash_attn=True, f16 KV cache (judged as an fp16 row)", "fp16",
                  once=FP16_TABLE),
            Route("f32-kv32", "--outtype f32; flash attention off, f32 KV cache", once=FP16_TABLE),
            Route("q8_0", "--outtype q8_0; flash attention off, f16 KV cache", "q8_0", once=FP16_TABLE),
            Route("q8_0-fa", "--outtype q8_0; flash_attn=True, f16 KV cache", "q8_0", once=FP16_TABLE)),
           "llama.cpp through its own converter and llama-cpp-python (own environment, built from source)"),
    Engine("vllm_cpu", "vllm_cpu", "vllm_cpu",
           (Route("default", "vllm.LLM(model=folder) with its defaults: dtype auto (bf16 on this CPU), its CPU "
                             "attention backend", "bf16"),
            Route("fp32", "vllm.LLM(model=folder, dtype='float32')"),
            Route("transformers-impl", "vllm.LLM(model=folder, model_impl='transformers'): vLLM's Transformers "
                                       "modelling backend in place of its native class, dtype auto (bf16 here)",
                  "bf16")),
           "vLLM on the CPU, the vllm-cpu build (own environment)"),
    Engine("kerashub", "kerashub", "kerashub",
           (Route("default", "Keras Hub's from_preset of the transformers folder (keras-nlp: GemmaBackbone built "
                             "from config.json), JAX backend, fp32"),
            Route("score", "GemmaCausalLM.score(scoring_mode='logits') of that backbone"),
            Route("generate", "the logits generate's sampler sees: GemmaCausalLM.call_with_cache one token at a "
                              "time")),
           # its loader's registry decides (adapter: NoArchitecture)
           "Keras Hub (or keras-nlp 0.14 to 0.15) on JAX (own environment)"),
)}


def _literal(path: Path, name: str):
    """The value of the literal ``NAME = ...`` at an adapter script's top level, read without running it (None where
    there is none)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                try:
                    return ast.literal_eval(node.value)
                except ValueError:
                    return None
    return None


def _literal_routes(path: Path) -> dict[str, str]:
    """The ``ROUTES = {...}`` literal of an adapter script."""
    value = _literal(path, "ROUTES")
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def models_per_process(engine: Engine) -> int:
    """How many models one child of the engine may run one after another: its adapter's ``MODELS_PER_PROCESS``
    literal, 1 where it has none (a new child per model). An adapter sets it where nothing a model leaves in the
    process (a compiler's caches, a registry) changes what the next one computes: measured, the same bits."""
    value = _literal(_adapter_file(engine), "MODELS_PER_PROCESS")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def _adapter_file(engine: Engine) -> Path:
    return engine.adapter if isinstance(engine.adapter, Path) else script(engine.adapter)


def processes(engine: Engine) -> list[tuple[str, ...]]:
    """The engine's routes (the adapter's ids) grouped by the child that runs them, in route order: those its
    adapter's ``PROCESSES`` literal (a tuple of tuples of route ids) lets share one process together, each other
    route alone. An adapter lists routes there only where nothing one route sets outlives it in the process."""
    value = _literal(_adapter_file(engine), "PROCESSES")
    listed = value if isinstance(value, tuple) else ()
    shared = [tuple(str(r) for r in g) for g in listed if isinstance(g, (tuple, list))]
    groups: dict = {}
    for route in engine.routes:
        key = next((g for g in shared if route.adapter_route in g), route.adapter_route)
        groups.setdefault(key, []).append(route.adapter_route)
    return [tuple(g) for g in groups.values()]


def _precision(rid: str) -> str:
    for name in LOW:
        if name in rid.replace("-", "_"):
            return name
    return "fp32"


def script(adapter: str) -> Path:
    """The file of the adapter (or shared adapter module) named ``adapter``."""
    return adapter_file(f"{PREFIX}{adapter}.py")


def _letters(name: str) -> str:
    return name.replace("-", "").replace("_", "")


def discovered() -> dict[str, Engine]:
    """Engines with an adapter (adapter_ADAPTER.py) and a requirements file NAME.txt that the catalog does not list,
    paired by their letters (``-`` and ``_`` aside: a module name cannot hold ``-``); the engine is called NAME."""
    files = {_letters(p.stem): p.stem for p in REQUIREMENTS.glob("*.txt")}
    out = {}
    for path in sorted((ADAPTERS / "forward").glob(f"{PREFIX}*.py")):
        adapter = path.stem.removeprefix(PREFIX)
        name = files.get(_letters(adapter))
        if adapter in SHARED or name is None or name in CATALOG:
            continue
        routes = _literal_routes(path)
        if routes:
            once = ONCE.get(name, 0.0)
            out[name] = Engine(name, name, adapter,
                               tuple(Route(k, v, _precision(k), once=once) for k, v in routes.items()),
                               f"{name} (own environment)")
    return out


def engines() -> dict[str, Engine]:
    """Every engine: the catalog's, then the discovered ones, in name order after them."""
    return {**CATALOG, **discovered()}


def environments() -> list[str]:
    """Each environment an engine uses, once (main first)."""
    return list(dict.fromkeys(e.environment for e in engines().values()))


NOT_HERE = (  # engines that need a GPU: what a run would check; the data cited is not ours and says so
    ("vLLM (CUDA backends)", "FlashAttention, FlashInfer and Triton take the attention cap as a kernel argument; "
                             "the same references per backend would tell which drops or alters it"),
    ("SGLang", "its Triton and FlashInfer kernels take the cap as logit_cap: the same comparison per backend"),
    ("flash-attn softcap", "computes tanh with the PTX tanh.approx.f32 instruction; recorded GPU data "
                           "(cuda-h200-2026-11-30.json, one H200, torch 2.11.0+cu130, an independent script) "
                           "has it return exactly 1.0 from x = 8.0, where fp32 tanh does from 9.01"),
    ("FlexAttention", "a score_mod c*tanh(s/c); the same recorded GPU data finds its fp32 zero-gradient input "
                      "equal to eager's (270.33 at c = 30): the parity comparison itself is not measured"),
)
