"""The engines: what each needs, and running one in a child process with a time limit.

An engine runs in its own process (``python -m softcapgrad.engines.child``), one thread, so that a
crash, a hang or a memory blow-up in a converter or a runtime is a row with its reason and never
takes the command down. The child reads transformers directories the parent wrote (config.json and
model.safetensors: no code, no pickle) and writes each variant's logits as .npy (read back without
pickle). CPU time is the child's own (user + system, from the kernel's accounting of children).
"""

from __future__ import annotations

import importlib.util
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

EXTRA = "parity"
TIMEOUT = 120.0  # seconds of wall clock per engine (both variants, conversion included); a shared machine is slow


@dataclass(frozen=True)
class Engine:
    name: str
    module: str  # softcapgrad.engines.<module>: logits(folder, ids, work) -> [tokens, vocab]
    needs: tuple[str, ...]  # import names
    how: str  # the path the weights take
    once: float  # unit roundoff of a step rounded once to a coarser format than fp32 (0: none)
    precision: str  # the formats, in words
    types: tuple[str, ...]  # model types the engine runs
    refusals: tuple[tuple[str, str], ...] = ()  # (model type, why not) known before running


FP16 = 2.0 ** -11

ENGINES = {
    "onnx": Engine("onnx", "onnx", ("onnxruntime", "onnx", "onnxscript"),
                   "torch.onnx.export (dynamo) -> ONNX Runtime, CPU", 0.0, "fp32", ("gemma2", "gemma3_text")),
    "llamacpp": Engine("llamacpp", "llamacpp", ("llama_cpp", "gguf"),
                       "GGUF (f32 tensors, llama.cpp's metadata keys) -> llama.cpp, CPU, f32 KV cache", FP16,
                       "fp32, GELU from an fp16 table", ("gemma2",),
                       (("gemma3_text", "the GGUF conversion here covers Gemma 2 only (llama.cpp's own converter refuses "
                                        "a Gemma 3 that sets attn_logit_softcapping: it asserts it is None)"),)),
    "kerashub": Engine("kerashub", "kerashub", ("keras", "keras_hub", "jax"),
                       "Keras Hub's Gemma backbone .from_preset of the transformers directory, JAX backend, CPU", 0.0,
                       "fp32", ("gemma2", "gemma3_text")),
    "torchexport": Engine("torchexport", "torchexport", ("torch",),
                          "torch.export.export -> the exported program's module", 0.0, "fp32",
                          ("gemma2", "gemma3_text")),
    "inductor": Engine("inductor", "torchexport", ("torch",),
                       "torch.export.export -> torch.compile (inductor, C++ kernels) of the exported program", 0.0,
                       "fp32", ("gemma2", "gemma3_text")),
}

NOT_HERE = (  # engines that need a GPU: what a run would check, no figures
    ("vLLM", "its attention backends (FlashAttention, FlashInfer, Triton) take the attention cap as a kernel "
             "argument and the sampler applies the final cap: the same two switched-off references would tell "
             "which backend drops or alters which cap"),
    ("SGLang", "its Triton and FlashInfer attention kernels take the cap as logit_cap: the same comparison per "
               "attention backend"),
    ("TensorRT-LLM", "its fused attention plugin and the engine's final cap, after a checkpoint conversion: the "
                     "same comparison on the built engine"),
)


def missing(engine: Engine) -> str | None:
    """One line naming the extra to install, or None when every module the engine needs is importable."""
    absent = [name for name in engine.needs if importlib.util.find_spec(name) is None]
    if not absent:
        return None
    return (f"engine {engine.name} needs {', '.join(absent)}, not installed here: "
            f"pip install 'softcapgrad[{EXTRA}]'")


@dataclass(frozen=True)
class Outcome:
    logits: dict  # variant folder name -> [tokens, vocab] float64, or empty
    reason: str | None  # why it could not run
    cpu_s: float
    wall_s: float


def _environment() -> dict:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3",
               XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
               JAX_PLATFORMS="cpu", TORCHINDUCTOR_COMPILE_THREADS="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(engine: Engine, work: Path, variants: list[str], timeout: float = TIMEOUT) -> Outcome:
    """The engine on each variant folder under ``work`` (with ``work/ids.npy``), in a child process."""
    command = [sys.executable, "-m", "softcapgrad.engines.child", engine.name, engine.module, str(work), *variants]
    cpu0, wall0 = _children_cpu(), time.perf_counter()
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env=_environment(), start_new_session=True)
    except OSError as err:
        return Outcome({}, f"could not start: {err}", 0.0, 0.0)
    try:
        _, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the child's own session: it and whatever it started
        child.communicate()
        return Outcome({}, f"no answer in {timeout:.0f} s (stopped)", _children_cpu() - cpu0,
                       time.perf_counter() - wall0)
    cpu, wall = _children_cpu() - cpu0, time.perf_counter() - wall0
    if child.returncode != 0:
        return Outcome({}, _last_line(err, child.returncode), cpu, wall)
    out = {}
    for variant in variants:
        path = work / f"{engine.name}.{variant}.npy"
        try:
            out[variant] = np.load(path, allow_pickle=False).astype(np.float64)
        except (OSError, ValueError) as error:
            return Outcome({}, f"no logits for {variant}: {error}", cpu, wall)
    return Outcome(out, None, cpu, wall)


def _last_line(err: bytes, code: int) -> str:
    """The child's reason: its one-line message, or the last line of what it printed, or the signal."""
    text = err.decode("utf-8", "replace").strip().splitlines()
    marked = [line[len("reason: "):] for line in text if line.startswith("reason: ")]
    if marked:
        return marked[-1][:300]
    if code < 0:
        return f"crashed: signal {signal.Signals(-code).name}"
    return (text[-1][:300] if text else f"exit code {code}")


def write_ids(work: Path, ids: np.ndarray) -> None:
    np.save(work / "ids.npy", np.asarray(ids, dtype=np.int64).reshape(-1), allow_pickle=False)


def versions(engine: Engine) -> dict:
    """Installed versions of what the engine imports (from the package metadata; nothing is imported)."""
    from importlib import metadata

    names = {"llama_cpp": "llama-cpp-python", "keras_hub": "keras-hub"}
    out = {}
    for module in engine.needs:
        try:
            out[module] = metadata.version(names.get(module, module))
        except metadata.PackageNotFoundError:
            pass
    return out
