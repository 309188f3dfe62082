"""A new recording of the CUDA stacks, measured on a machine with CUDA: ``softcapgrad stacks --record FILE``.

Every CUDA stack of the registry (first zero-gradient inputs at c = 30 and 50 for each scores format
it takes, its fp32 knee) and transformers' Gemma 2 through its own capping code, written in the
format softcapgrad.stacks.recording reads.
"""

from __future__ import annotations

from pathlib import Path

from softcapgrad.core.checks import InputError
from softcapgrad.core.files import write_atomic
from softcapgrad.core.report import Report, Table
from softcapgrad.laws.formats import positive_values, resolve
from softcapgrad.models import gemma2
from softcapgrad.stacks import registry as stacks
from softcapgrad.stacks.recording import QUANTITIES, Recording, Row, dumps


CAPS = (30.0, 50.0)


def _versions() -> dict[str, str]:
    import shutil
    import subprocess

    import torch

    out = {"torch": torch.__version__, "cuda": str(torch.version.cuda), "driver": "not recorded"}
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=False)
        if smi.returncode == 0 and smi.stdout.strip():
            out["driver"] = smi.stdout.strip().splitlines()[0]
    for name in ("triton", "jax", "transformers"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            out[name] = "not installed"
    return out


def _model_rows(device: str) -> list[Row]:
    """transformers' Gemma 2 on ``device``, eager and compiled: its final-logit cap and attention-score cap."""
    import numpy as np
    import torch

    values = positive_values(resolve("bf16"))
    model = gemma2.tiny_model(final_cap=CAPS[0], attn_cap=CAPS[1], device=device)
    rows = []
    for path, compile_ in (("torch-eager-cuda", False), ("torch-compile-cuda", True)):
        final = torch.compile(model) if compile_ else None
        attention = torch.compile(model.model.layers[0].self_attn) if compile_ else None
        for site, c, (_, grad) in (("Gemma 2 final logits", CAPS[0], gemma2.final_cap(model, values, final)),
                                   ("Gemma 2 eager attention", CAPS[1],
                                    gemma2.attention_cap(model, values, attention))):
            zero = grad == 0.0
            i = int(np.argmax(zero))
            misses = np.flatnonzero(~zero[i:])
            value = float(values[i].astype(np.float64)) if zero.any() else None
            last = float(values[i + misses[-1]].astype(np.float64)) if zero.any() and misses.size else None
            rows.append(Row(path, QUANTITIES[0], "bfloat16", c, value, None if value is None else last is None, last,
                            site, "transformers' Gemma 2 in bf16, its own capping code"))
    return rows


def measure() -> Recording:
    """Every CUDA stack measured live on this machine's GPU: first zero-gradient inputs at c = 30 and 50 for each
    scores format it takes, its fp32 knee, and transformers' Gemma 2 when installed."""
    import datetime

    import torch

    if not torch.cuda.is_available():
        raise InputError("stacks --record needs a CUDA device: torch.cuda.is_available() is False on this machine")
    rows, skipped = [], []
    for stack in stacks.STACKS.values():
        if stack.device != "cuda":
            continue
        why = stacks.runs_here(stack)
        if why:
            skipped.append(f"{stack.name} ({why})")
            continue
        for fmt in stack.formats:
            for c in CAPS:
                r = stacks.first_zero(stack.name, fmt, c)
                rows.append(Row(stack.name, QUANTITIES[0], fmt, c, r.value, r.monotone, r.last_unsaturated))
        if stack.has_knee:
            r = stacks.knee(stack.name, "float32")
            rows.append(Row(stack.name, QUANTITIES[1], "float32", None, r.value, r.monotone, r.last_unsaturated))
    try:
        rows += _model_rows("cuda")
    except ImportError:
        skipped.append("transformers' Gemma 2 (transformers is not installed)")
    device = torch.cuda.get_device_name()
    today = datetime.date.today().isoformat()
    provenance = f"measured on one {device} on {today} by softcapgrad stacks --record"
    if skipped:
        provenance += f"; not measured: {', '.join(skipped)}"
    return Recording(device, today, _versions(), provenance, tuple(rows))


def record_report(path: Path):
    """Measure, write the recording atomically, and report its rows."""
    recording = measure()
    write_atomic(path, dumps(recording))
    rows = [{"path": r.path, "site": r.site, "scores": r.scores, "cap": r.cap, "quantity": r.quantity,
             "value": r.value, "monotone": r.monotone} for r in recording.rows]
    return Report(
        command="stacks",
        params={"record": str(path), "device": recording.device, "versions": recording.versions},
        tables=(Table("rows", f"recorded on {recording.device}", rows,
                      ("path", "scores", "cap", "quantity", "value", "monotone"), wide=("site",)),),
        notes=(f"wrote {path}", recording.provenance),
        answer=(f"Measured {len(rows)} rows on {recording.device} (torch {recording.versions['torch']}) and wrote {path}.",),
    )
