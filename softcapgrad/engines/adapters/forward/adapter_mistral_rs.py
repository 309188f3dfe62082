"""mistral.rs from its Python wheel: ``Runner(Which.Plain(model_id=folder))``, the plain loader with its automatic
architecture and dtype. The Python API returns no logits and no prompt log-probabilities, only the log-probabilities
of each generated token with its top alternatives: every prefix of the prompt is sent once, one token is generated,
and the top-K alternatives with K the whole vocabulary give that position's full row of log-probabilities.

The architecture registry is the wheel's own ``mistralrs.Architecture`` enum (plain text models); route
``multimodal`` asks its ``MultimodalArchitecture`` loader instead (``Which.MultimodalPlain``), which holds Gemma 3,
Gemma 3n and Gemma 4: does it run a text-only checkpoint of those types?

The KV cache's dtype is the engine's own choice: on an x86 CPU with AVX-512F, or AVX2 with FMA and F16C, mistral.rs
stores an f32 model's keys and values in f16 unless ``MISTRALRS_CPU_KV_F32=1`` (the public repository's
mistralrs-core/src/kv_cache/mod.rs, ``cpu_kv_f16``; the 0.9.5 wheel ships no source, its binary holds the same
variable and log line). The choice is read from the engine's own log line, printed on stdout at the first append,
and the row is judged in f16 where it appears; the ``kv32`` routes set the variable."""

from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np

import adapter_protocol as protocol

ROUTES = {
    "default": "Which.Plain of the folder as given (automatic architecture and dtype), one request per prefix",
    "rope-theta": "the same with config.json holding rope_theta at its top level, as transformers 4.x and the "
                  "published Gemma checkpoints write it (transformers 5 writes rope_parameters only)",
    "multimodal": "Which.MultimodalPlain with the MultimodalArchitecture of the model type (its Gemma 3, Gemma 3n, "
                  "Gemma 4 loaders) on the text-only folder, rope_theta at the top as for rope-theta",
    "kv32": "rope-theta's folder and request, with MISTRALRS_CPU_KV_F32=1: the KV cache kept in f32",
    "multimodal-kv32": "multimodal's loader and folder, with MISTRALRS_CPU_KV_F32=1: the KV cache kept in f32",
}
# routes that may share one process (catalog.processes): the KV cache's f32 setting is read once per process
PROCESSES = (("default", "rope-theta", "multimodal"), ("kv32", "multimodal-kv32"))
KV_F32 = "MISTRALRS_CPU_KV_F32"  # 1: the KV cache stays f32 on a CPU where the engine would store it in f16
KV_F16_LINE = "Using f16 KV cache on CPU"  # the engine's log line (stdout) when it stores the cache in f16
KV_SEEN: list[bool] = []  # the choice is made once per process (a OnceLock): the first variant's log line says it
MULTIMODAL = {"gemma3_text": "Gemma3", "gemma3n_text": "Gemma3n", "gemma4_text": "Gemma4"}  # type -> loader
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # the prompt's text unchanged: no turn markers


def which(run: protocol.Run, kind: str, folder):
    """The loader the route asks for: the plain one, or the multimodal architecture of the model type."""
    import mistralrs

    if not run.route.startswith("multimodal"):
        claimed(kind)
        return mistralrs.Which.Plain(model_id=str(folder))
    names = [n for n in dir(mistralrs.MultimodalArchitecture) if not n.startswith("_")]
    if MULTIMODAL.get(kind) not in names:
        raise protocol.NoArchitecture(f"mistralrs.MultimodalArchitecture has no loader for {kind}; it holds "
                                      f"{', '.join(sorted(names))}")
    return mistralrs.Which.MultimodalPlain(model_id=str(folder),
                                           arch=getattr(mistralrs.MultimodalArchitecture, MULTIMODAL[kind]))


def claimed(kind: str) -> None:
    import mistralrs

    names = [n for n in dir(mistralrs.Architecture) if not n.startswith("_")]
    if kind.replace("_", "").lower() not in {n.replace("_", "").lower() for n in names}:
        raise protocol.NoArchitecture(f"mistralrs.Architecture (its plain text models) has no {kind}; it holds "
                                      f"{', '.join(sorted(names))}")


# The decoder of Gemma's own tokenizer.json. mistral.rs refuses a lone Fuse decoder ("can't determine decoder
# type"), which the stand-in tokenizer has; the tokenizer is parity's stand-in, not part of the model under test,
# so it is given the decoder the published checkpoints carry (on pieces <tN> it decodes the same text).
GEMMA_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
    {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}


def folder_for(run: protocol.Run, variant: str):
    """A copy of the folder with Gemma's tokenizer decoder; on route rope-theta also rope_theta at the top."""
    folder = run.scratch(variant)
    for path in run.folder(variant).iterdir():
        if path.is_file():
            shutil.copyfile(path, folder / path.name)
    tokenizer = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    tokenizer["decoder"] = GEMMA_DECODER
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    if run.route == "default":
        return folder
    config = run.config(variant)
    theta = (config.get("rope_parameters") or {}).get("rope_theta")
    if theta is not None and "rope_theta" not in config:
        config["rope_theta"] = theta
    (folder / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return folder


def vocabulary(folder) -> dict[str, int]:
    model = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    vocab = model["vocab"]
    pieces = vocab.items() if isinstance(vocab, dict) else ((p[0], i) for i, p in enumerate(vocab))
    return {piece: int(i) for piece, i in pieces}


def prompt_text(runner, ids: list[int], vocab: dict[str, int]) -> str:
    """A text the engine's own tokenizer reads back as exactly ``ids`` (its detokenized text, or the pieces
    separated by spaces)."""
    pieces = {i: p for p, i in vocab.items()}
    candidates = [runner.detokenize_text(ids, False), " ".join(pieces[i] for i in ids)]
    for text in candidates:
        if list(runner.tokenize_text(text, False, False)) == ids:
            return text
    raise RuntimeError("no text found that mistral.rs's tokenizer reads back as the prompt's token ids")


def kv_cache_f16(log: str) -> bool:
    """Whether this process's engine stores the KV cache in f16: its log line, seen now or for an earlier variant."""
    if not KV_SEEN:
        KV_SEEN.append(KV_F16_LINE in log)
    return KV_SEEN[0]


def run_variant(run: protocol.Run, variant: str) -> np.ndarray:
    if run.route.endswith("kv32"):
        os.environ[KV_F32] = "1"  # read once, at the engine's first KV append: before any runner exists
    with protocol.captured_log(fds=(1,), echo=1) as log:  # the engine logs on stdout from its native code
        rows = requests(run, variant)
    f16 = kv_cache_f16(log[0])
    run.precision = "fp16" if f16 else "fp32"
    kv = ("f16 (the engine's CPU default here: its log says so; MISTRALRS_CPU_KV_F32=1 keeps f32)" if f16 else
          "f32" + (" (MISTRALRS_CPU_KV_F32=1)" if os.environ.get(KV_F32) == "1" else " (no f16 line in the log)"))
    run.did += f", KV cache {kv}"
    return rows


def requests(run: protocol.Run, variant: str) -> np.ndarray:
    import mistralrs

    kind = run.config(variant).get("model_type", "?")
    folder = folder_for(run, variant)
    loader = which(run, kind, folder)
    template = run.scratch("template") / "chat_template.json"
    template.write_text(json.dumps({"chat_template": TEMPLATE}), encoding="utf-8")
    runner = mistralrs.Runner(which=loader, token_source="none", chat_template=str(template))
    vocab = vocabulary(folder)
    size = int(run.config(variant)["vocab_size"])
    ids = [int(i) for i in run.ids]
    rows = np.full((len(ids), size), np.nan)
    for t in range(1, len(ids) + 1):
        request = mistralrs.ChatCompletionRequest(
            messages=[{"role": "user", "content": prompt_text(runner, ids[:t], vocab)}], model="default",
            max_tokens=1, logprobs=True, top_logprobs=size, temperature=0.0)
        response = runner.send_chat_completion_request(request)
        if response.usage.prompt_tokens != t:
            raise RuntimeError(f"mistral.rs read {response.usage.prompt_tokens} prompt tokens, not {t}")
        for top in response.choices[0].logprobs.content[0].top_logprobs:
            rows[t - 1, top.token if isinstance(top.token, int) else vocab[top.token]] = top.logprob
    missing = int(np.isnan(rows).sum())
    if missing:
        raise RuntimeError(f"mistral.rs returned {rows.size - missing} of {rows.size} log-probabilities")
    run.output = "logprobs"
    said = f"Which.MultimodalPlain({MULTIMODAL.get(kind)})" if run.route.startswith("multimodal") else "Which.Plain"
    run.did = (f"mistralrs Runner, {said} (architecture and dtype automatic, the log reports F32), chat "
               f"completion with a pass-through template, max_tokens=1, top_logprobs={size} per prefix")
    run.notes = [f"top-K with K = {size}, the whole vocabulary: one request per prompt prefix",
                 "a probability that underflows float32 comes back as -inf (log of a zero softmax entry)"]
    run.packages = ("mistralrs",)
    return rows


if __name__ == "__main__":
    sys.exit(protocol.main(ROUTES, run_variant))
