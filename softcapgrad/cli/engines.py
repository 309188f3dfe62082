"""parity: the same weights through the transformers reference and each export or serving engine."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from softcapgrad.cli.common import bounded, emit, InputError, Json, not_with, pick, Report, seed_in_range, Wide

FILES = ("parity.json", "parity.md", "figures/parity.png")
DEFAULT_SETS = ["final_logit_softcapping=30", "attn_logit_softcapping=50"]
COLOURS = {"applied": "tab:green", "ignored": "tab:red", "different": "tab:orange", "not finite": "tab:purple",
           "not bound": "tab:olive", "unused by transformers": "tab:olive", "could not run": "lightgrey", "not set": "white"}


def parity_figure(rows: list[dict]):
    """Engines × caps (per model): the verdict as a colour, the largest log-prob error as text."""
    from softcapgrad.core.plot import DPI, SIZE, pyplot

    plt = pyplot()
    columns = list(dict.fromkeys((r["model"], r["cap"]) for r in rows))
    engines = list(dict.fromkeys(r["engine"] for r in rows))
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    for r in rows:
        x, y = columns.index((r["model"], r["cap"])), engines.index(r["engine"])
        added = r["verdict"] == "unused by transformers" and "the engine applies it" in (r.get("hint") or "")
        colour = "tab:red" if added else COLOURS.get(r["verdict"], "white")
        ax.add_patch(plt.Rectangle((x - 0.48, y - 0.48), 0.96, 0.96, color=colour, ec="k"))
        error = "" if r["error"] is None else f"\n{r['error']:.2g}"
        text = "applied by the engine,\nunused by transformers" if added else r["verdict"]
        ax.text(x, y, text + error, ha="center", va="center", fontsize=7)
    ax.set_xlim(-0.5, len(columns) - 0.5)
    ax.set_ylim(len(engines) - 0.5, -0.5)
    ax.set_xticks(range(len(columns)), [f"{m}\n{c} cap" for m, c in columns], fontsize=7)
    ax.set_yticks(range(len(engines)), engines, fontsize=8)
    ax.set_title("verdict per engine and cap; below it, the largest |Δ log-prob| against the capped form", fontsize=9)
    fig.tight_layout()
    return fig


def _answer(results) -> tuple[str, ...]:
    rows = [r for p in results for r in p.rows]
    bad = [f"{r['engine']} {r['verdict']} the {r['cap']} cap of {r['model']}" + (f" ({r['hint']})" if r.get("hint") else "")
           for r in rows if r["verdict"] in ("ignored", "different", "not finite")]
    bad += [f"{r['engine']} applies the {r['cap']} cap of {r['model']} that transformers leaves unused"
            for r in rows if r["verdict"] == "unused by transformers" and "the engine applies it" in r.get("hint", "")]
    ok = sorted({r["engine"] for r in rows if r["verdict"] == "applied"})
    missing = sorted({r["engine"] for r in rows if r["verdict"] == "could not run"})
    reach = "; ".join(f"{p.model}: largest |a/c| " + ", ".join(f"{k} {v:.3g}" for k, v in p.reference.reach.items()
                                                                if v is not None) for p in results)
    first = ("Every engine that ran applied every cap it was given" if not bad else
             "Caps lost, altered or added: " + "; ".join(bad)) + f" (inputs built so that each cap binds; {reach})."
    second = f"Applied by: {', '.join(ok) or 'none'}."
    third = (f"Could not run somewhere (rows give why): {', '.join(missing)}." if missing else
             "Every engine listed ran.") + " vLLM, SGLang and TensorRT-LLM need a GPU: not measured here."
    return first, second, third


def parity_report(results, out: Optional[Path], params: dict) -> Report:
    from softcapgrad.core.report import Table
    from softcapgrad.engines import parity

    rows = [{"engine": r["engine"], "model": r["model"], "cap": r["cap"], "verdict": r["verdict"],
             "error": r["error"], "error_off": r["error_off"], "tolerance": r["tolerance"], "where": r["where"],
             "note": r.get("hint", ""), "precap_error": r.get("precap_error"), "reach": r["reach"]}
            for p in results for r in p.rows]
    engines = [{"engine": e["engine"], "model": e["model"], "cpu_s": e["cpu_s"], "wall_s": e["wall_s"],
                "reason": e["reason"] or "", "how": e["how"]} for p in results for e in p.engines]
    return Report(
        command="parity", params=params,
        tables=(
            Table("rows", "verdict per engine and cap (log-prob errors over the whole vocabulary)", rows,
                  ("engine", "model", "cap", "verdict", "error", "error_off", "tolerance"),
                  wide=("where", "note", "precap_error", "reach")),
            Table("engines", "engines: CPU time (user + system) of the child process, conversion included", engines,
                  ("engine", "model", "cpu_s", "wall_s"), wide=("reason", "how")),
            Table("not_measured", "not measured here", parity.not_here(), ("engine", "verdict"), wide=("would_check",)),
        ),
        notes=(f"written: {', '.join(str(out / f) for f in FILES)}" if out else "nothing written (no --out)",
               "error: largest |Δ log-prob| against the capped form; error off: against the uncapped form; the final "
               "cap is judged on the engine's own pre-cap logits, the attention cap against transformers fp32 eager"),
        answer=_answer(results),
    )


def parity(
    directory: Annotated[Optional[Path], typer.Argument(help="A local Gemma 2 model directory (config.json, safetensors "
                                                             "weights; never downloaded).")] = None,
    model_type: Annotated[Optional[list[str]], typer.Option(
        "--model-type", help="gemma2 or gemma3_text, built tiny (repeatable; default gemma2, caps 30 and 50).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Config field KEY=VALUE (repeatable).")] = None,
    engine: Annotated[Optional[list[str]], typer.Option(
        "--engine", help="onnx, llamacpp, kerashub, torchexport, inductor, or all (repeatable; default all).")] = None,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Tokens of the random input.")] = 16,
    seed: Annotated[Optional[int], typer.Option(help="Seed of the weights and token ids (default 0).")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds each engine may take, conversion included.")] = 120.0,
    out: Annotated[Optional[Path], typer.Option(help="Folder for parity.json, parity.md and figures/parity.png.")] = None,
    json_out: Json = False,
    wide: Wide = False,
) -> None:
    """Do a model's soft-caps survive export: the same weights through each engine, a verdict per cap."""

    def build() -> Report:
        import importlib.util

        if importlib.util.find_spec("transformers") is None:
            raise InputError("parity needs transformers: pip install 'softcapgrad[hf]'")
        import json

        from softcapgrad.core import progress
        from softcapgrad.core.files import writable_folder, write_atomic
        from softcapgrad.engines import parity as run, runner
        from softcapgrad.models import audit

        names = pick("--engine", engine, tuple(runner.ENGINES))
        if engine and not any(e.strip().lower() == "all" for e in engine):
            for name in names:  # an engine asked for by name must be installed
                absent = runner.missing(runner.ENGINES[name])
                if absent:
                    raise InputError(absent)
        if directory is not None:
            not_with({"--model-type": model_type}, "with a model directory")
        types = [] if directory is not None else list(dict.fromkeys(model_type or ["gemma2"]))
        for t in types:
            if t not in ("gemma2", "gemma3_text"):
                raise InputError(f"--model-type {t}: parity runs gemma2 and gemma3_text")
        n = bounded("--seq-len", seq_len, 2, 512)
        s = seed_in_range(seed)
        if not 1 <= timeout <= 3600:
            raise InputError(f"--timeout {timeout:g}: must lie in 1..3600 seconds")
        if out is not None:
            writable_folder(out, "--out")
        sources = []
        if directory is not None:
            sources.append((str(directory), audit.source(directory, None, set_ or [])))
        for t in types:
            from softcapgrad.models.tiny import HEAD_DIM

            head = [f"query_pre_attn_scalar={HEAD_DIM}"]  # llama.cpp and Keras Hub derive the scale from the head size
            sources.append((t, audit.source(None, t, head + DEFAULT_SETS + (set_ or []))))
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            results = []
            with progress.task("parity: engines", len(names) * len(sources)) as advance:
                for label, src in sources:
                    results.append(run.measure(src, names, n, s, timeout, label, advance))
        finally:
            torch.set_num_threads(threads)
        params = {"model": str(directory) if directory else types, "set": set_ or [], "engines": names,
                  "seq_len": n, "seed": s, "timeout": timeout, "out": str(out) if out else None}
        report = parity_report(results, out, params)
        if out is not None:
            write_atomic(out / "parity.json", json.dumps({"params": params, "answer": list(report.answer),
                                                           **run.as_dict(results)}, indent=1, sort_keys=True) + "\n")
            write_atomic(out / "parity.md", run.markdown(results, report.answer))
            try:
                from softcapgrad.ledger.figures import save

                (out / "figures").mkdir(parents=True, exist_ok=True)
                save(parity_figure([r for p in results for r in p.rows]), out / "figures" / "parity.png")
            except InputError:
                pass  # matplotlib is an extra: the tables are written without it
        return report

    emit(build, json_out, wide, command="parity")
