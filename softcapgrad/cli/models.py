"""Real models and files: scan (saved tensors) and audit-model (a transformers model)."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from softcapgrad.core.checks import fp32_cap, positive
from softcapgrad.core.names import STACK_PATHS
from softcapgrad.cli.common import (
    choice, emit, InputError, Json, not_with, one_of, pick, Plot, Report, seed_in_range, Wide
)
from softcapgrad.cli.limits import Bound, FP32_MAX, FP32_NORMAL, path_given, SEED


def scan(
    file: Annotated[Path, typer.Argument(parser=path_given, metavar="FILE",
                                         help="A .pt, .npy or .safetensors file of pre-cap values.")],
    cap: Annotated[float, typer.Option(callback=Bound(FP32_NORMAL, FP32_MAX, "the stacks compute a/c in fp32 "
                                                                             "(normal range)"),
                                       help="Cap c > 0 (a normal float32).")] = 30.0,
    dtype: Annotated[Optional[str], typer.Option(help="Scores format the model rounds the values to: bf16 (default), fp16 "
                                                      "or fp32; for every --path that is a stack name.")] = None,
    path: Annotated[Optional[list[str]], typer.Option(
        "--path", help=f"A real stack (repeatable, or all; default torch-eager-cpu): {one_of(STACK_PATHS)}; the old "
                       "names eager-bf16, eager-fp16, fp32-upcast, sigmoid-bf16, remedy fix their format.")] = None,
    key: Annotated[Optional[list[str]], typer.Option("--key", help="Only these tensors (repeatable).")] = None,
    stored_as: Annotated[
        Optional[str], typer.Option("--stored-as", help="Format of a .npy whose format np.save lost (an ml_dtypes array).")
    ] = None,
    json_out: Json = False,
    wide: Wide = False,
) -> None:
    """Do the pre-cap values in a file reach each path's dead zone."""

    def build() -> Report:
        from softcapgrad.laws import formats
        from softcapgrad.files.scan import scan_report
        from softcapgrad.stacks.registry import STACKS, resolve_scores

        c = fp32_cap("--cap", cap)
        every = any(p.strip().lower() == "all" for p in path or [])
        names = list(STACKS) if every else list(dict.fromkeys(path or ["torch-eager-cpu"]))
        scores = formats.canonical_name(dtype or "bf16")
        for name in names:
            stack, fixed = resolve_scores(name, dtype, "--dtype")  # a bad name, or a format it cannot take, fails first
            if fixed is None and scores not in stack.formats:
                if every:
                    continue
                raise InputError(f"--path {name} takes {', '.join(stack.formats)} scores, not --dtype {dtype}")
        if every:
            names = [n for n in names if scores in STACKS[n].formats]
        return scan_report(file, c, names, key, stored_as, scores)

    emit(build, json_out, wide, command="scan")


def audit_model(
    directory: Annotated[
        Optional[Path], typer.Argument(parser=path_given, metavar="[directory]",
                                       help="A local model directory with config.json (weights used when present; "
                                            "never downloaded).")
    ] = None,
    model_type: Annotated[Optional[str], typer.Option("--model-type", help="A transformers model type, built tiny from its config (see --set).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Config field KEY=VALUE (repeatable; SUB.KEY inside a sub-config).")] = None,
    attn: Annotated[
        Optional[list[str]], typer.Option("--attn", help="Attention implementation (repeatable): eager, sdpa, flex_attention, "
                                                        "flash_attention_2, or all (the default).")
    ] = None,
    dtype: Annotated[str, typer.Option(help="Format of the parameters: bf16, fp16 or fp32.")] = "bf16",
    autocast: Annotated[Optional[str], typer.Option(help="Run under torch.autocast in bf16 or fp16 (with --dtype fp32).")] = None,
    inputs: Annotated[
        Optional[Path], typer.Option("--inputs", parser=path_given, metavar="<path>",
                                     help="Token ids: .npy or .pt integer array (1-D or 2-D), or .txt (one sequence "
                                          "a line).")
    ] = None,
    batch: Annotated[Optional[int], typer.Option(callback=Bound(1, 4096, "one batch on one machine"),
                                                 help="Sequences of random token ids (1 to 4096; default 2; not with "
                                                      "--inputs).")] = None,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", callback=Bound(1, 1 << 20, "one batch on one machine"),
                                                   help="Length of the random sequences (1 to 2^20; default 16; not "
                                                        "with --inputs).")] = None,
    seed: Annotated[Optional[int], typer.Option(callback=SEED, help="Seed of the random weights, token ids and dropout "
                                                                    "(0 to 2^63 − 1; default 0).")] = None,
    scale_logits: Annotated[float, typer.Option(
        "--scale-logits", callback=Bound(0.0, FP32_MAX, "the output layer is scaled in its format (at most float32's "
                                                        "range)", lo_open=True),
        help="Multiply the output embedding's logits by K > 0: a confident model.")] = 1.0,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    patch: Annotated[Optional[str], typer.Option("--patch", help="tether: patch TetherGate in at the head gates "
                                                                 "(eager) and check step 0 bit for bit, instead of "
                                                                 "the caps' audit.")] = None,
    gates: Annotated[bool, typer.Option("--gates", help="Each gate's opening (quantiles) and inputs past its format's "
                                                        "first zero, on the shipped text (or --inputs), instead of "
                                                        "the caps' audit.")] = False,
    json_out: Json = False,
    wide: Wide = False,
    plot: Plot = None,
) -> None:
    """Which soft-caps a transformers model applies, in which format and path, and how much of a batch is dead."""

    def build() -> Report:
        import importlib.util

        if importlib.util.find_spec("transformers") is None:
            raise InputError("audit-model needs transformers: pip install 'softcapgrad[hf]'")
        import torch

        from softcapgrad.models import audit
        from softcapgrad.models.inputs import logits_fit, tokens_fit
        from softcapgrad.laws import formats

        if patch is not None:
            choice("--patch", patch, ("tether",))
            not_with({"--attn": attn, "--plot": plot}, "with --patch: the patch is checked eagerly, in one table")
        if gates:
            not_with({"--attn": attn, "--patch": patch, "--plot": plot, "--batch": batch, "--seq-len": seq_len,
                      "--autocast": autocast}, "with --gates: one eager forward of the text (or --inputs)")
        implementations = pick("--attn", attn, audit.IMPLEMENTATIONS)
        params_format = formats.resolve(dtype).name
        if params_format not in audit.FORMATS:
            raise InputError(f"--dtype {dtype}: the model is built in bf16, fp16 or fp32")
        low = None
        if autocast is not None:
            low = formats.resolve(autocast).name
            if low not in ("bfloat16", "float16"):
                raise InputError(f"--autocast {autocast}: autocast runs in bf16 or fp16")
            if params_format != "float32":
                not_with({"--autocast": autocast}, f"with --dtype {dtype}: autocast lowers fp32 parameters")
        device_name = choice("--device", device, ("cpu", "cuda"))
        if device_name == "cuda" and not torch.cuda.is_available():
            raise InputError("--device cuda: no CUDA device here")
        k = positive("--scale-logits", scale_logits)
        s = seed_in_range(seed)
        if inputs is not None:
            not_with({"--batch": batch, "--seq-len": seq_len}, "with --inputs: the file gives the batch")
            ids = audit.read_token_ids(inputs)
        elif not gates:
            b = 2 if batch is None else batch
            n = 16 if seq_len is None else seq_len
            tokens_fit(b, n, "--batch × --seq-len")
        src = audit.source(directory, model_type, set_ or [])
        if gates:
            from softcapgrad.models.gate_audit import audit_gates

            if inputs is not None:
                tokens_fit(*ids.shape, f"--inputs {inputs}")
                logits_fit(src.config, ids.numel(), f"--inputs {inputs}")
                audit.check_ids(ids, src.config, f"--inputs {inputs}")
            return audit_gates(src, ids if inputs is not None else None, params_format, device_name, s,
                               {"model": str(directory) if directory else model_type, "set": set_ or [],
                                "inputs": str(inputs) if inputs else None})
        if inputs is None:
            logits_fit(src.config, b * n, "--batch × --seq-len")
            ids = audit.random_ids(src.config, b, n, s)
        else:
            tokens_fit(*ids.shape, f"--inputs {inputs}")
            logits_fit(src.config, ids.numel(), f"--inputs {inputs}")
            audit.check_ids(ids, src.config, f"--inputs {inputs}")
        if patch is not None:
            from softcapgrad.models.tether_audit import patch_report

            return patch_report(src, ids, params_format, low, s, k, device_name,
                                {"model": str(directory) if directory else model_type, "set": set_ or []})
        return audit.audit_model(src, implementations, ids, params_format, low, s, k, device_name,
                                 {"model": str(directory) if directory else model_type, "set": set_ or [],
                                  "inputs": str(inputs) if inputs else None})

    def unprompted() -> Report:  # nothing may ask a question: stdin is empty for the whole command
        from softcapgrad.models.source import no_stdin

        with no_stdin():
            return build()

    emit(unprompted, json_out, wide, plot, "audit-model")
