"""Where and with what a parity run was measured: the CPU, each environment's full pinned set, the date.

The CPU matters because the kernels an engine runs depend on it (oneDNN, XNNPACK, llama.cpp and inductor pick
AVX2, AVX-512, native bf16 or AMX code by the flags): a row measured on one CPU can differ in its last bits from
the same row on another. The facts are recorded as read, never used to decide a verdict; a row merged from a run
on another CPU than the rest is marked (``mark_other_cpus``).
"""

from __future__ import annotations

import datetime
import json
import os
from collections import Counter
from pathlib import Path

# The flags that change which kernels run: AVX2, AVX-512 (foundation), native bf16 dot products, AMX, fp16 conversion.
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile", "f16c")
CPUINFO = Path("/proc/cpuinfo")


def cpu_facts(text: str) -> dict:
    """The CPU's model name and its kernel-changing flags, from the text of a cpuinfo file (its first processor;
    a machine's processors share them). Unknown parts are said so, never guessed."""
    model, flags = "", None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "features") and flags is None:  # x86 calls them flags, arm64 features
            flags = set(value.split())
    found = [f for f in KERNEL_FLAGS if flags and f in flags]
    return {"model": model or "not recorded", "flags": found if flags is not None else None}


def read_cpu(path: Path | None = None) -> dict:
    try:
        return cpu_facts((path or CPUINFO).read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return cpu_facts("")


def cpu_label(facts: dict | None) -> str | None:
    """One string naming the CPU and its flags, to compare rows by (None: not recorded)."""
    if not facts:
        return None
    flags = facts.get("flags")
    return f"{facts.get('model')} [{' '.join(flags) if flags is not None else 'flags not recorded'}]"


def today() -> str:
    """The run's date (UTC), or the one SOURCE_DATE_EPOCH names, as reproducible builds set it."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    when = (datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc) if epoch.isdigit()
            else datetime.datetime.now(datetime.timezone.utc))
    return when.date().isoformat()


def main_packages() -> dict:
    """Every distribution installed in softcapgrad's own environment, with its version."""
    from importlib import metadata

    found = {d.metadata["Name"]: d.version for d in metadata.distributions() if d.metadata["Name"]}
    return dict(sorted(found.items(), key=lambda kv: kv[0].lower()))


def stamp_python(folder: Path | None) -> str | None:
    """The Python version a built environment's stamp records (None: not recorded)."""
    from softcapgrad.engines.environments.environments import STAMP

    if folder is None:
        return None
    try:
        stamp = json.loads((folder / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return stamp.get("python") if isinstance(stamp, dict) and isinstance(stamp.get("python"), str) else None


def environment_record(st, interpreter: dict | None = None) -> dict:
    """One environment's full pinned set, its interpreter and its Python; ``interpreter``: a probed one (``--python``).
    A built environment's set is its stamp's (every distribution its build installed)."""
    import platform

    from softcapgrad.engines.environments.environments import MAIN

    if interpreter is not None:
        return {"python": interpreter["version"], "interpreter": interpreter["path"], "given": True,
                "packages": dict(interpreter["packages"])}
    if st.name == MAIN:
        return {"python": platform.python_version(), "interpreter": "softcapgrad's own", "packages": main_packages()}
    return {"python": stamp_python(st.path), "interpreter": f"{st.path.name}/bin/python" if st.path else None,
            "packages": dict(st.versions)}  # the folder's name in the cache, not the machine's path to it


def record(states: dict, cpu: dict, interpreter: dict | None = None, date: str | None = None) -> dict:
    """parity.json's provenance: the CPU, the date and each installed environment's record (``states``: environment
    -> State, as parity plans them; ``interpreter``: the probed ``--python``, recorded for the environment it
    replaces)."""
    envs = {}
    for name, st in sorted(states.items()):
        if st is not None and st.state == "installed":
            envs[name] = environment_record(st, interpreter)
    return {"cpu": cpu, "date": date or today(), "environments": envs}


def mark_other_cpus(rows: list[dict]) -> list[dict]:
    """Each row with ``other_cpu`` set where its ``cpu`` differs from the one most rows were measured on; rows
    that recorded none are left unmarked (nothing is known of them)."""
    known = Counter(r["cpu"] for r in rows if r.get("cpu"))
    if len(known) < 2:
        return [{k: v for k, v in r.items() if k != "other_cpu"} for r in rows]
    most = known.most_common(1)[0][0]
    out = []
    for r in rows:
        r = {k: v for k, v in r.items() if k != "other_cpu"}
        if r.get("cpu") and r["cpu"] != most:
            r["other_cpu"] = True
        out.append(r)
    return out


def carried(old: dict | None, new: dict | None) -> dict | None:
    """The provenance of merged results (``--update``): the new run's, with every earlier run's record kept under
    ``earlier`` (their rows may still be there); the old one's where the new run recorded none."""
    if not (old and new):
        return new or old
    earlier = [*old.get("earlier", []), {k: v for k, v in old.items() if k != "earlier"}]
    return {**new, "earlier": earlier}


def said(provenance: dict | None) -> str:
    """One sentence for parity.md: when and on which CPU."""
    if not provenance:
        return ""
    cpu = provenance.get("cpu") or {}
    flags = cpu.get("flags")
    shown = ", ".join(flags) if flags else "none of " + ", ".join(KERNEL_FLAGS) if flags == [] else "not recorded"
    return (f"Measured on {provenance.get('date')}; CPU: {cpu.get('model', 'not recorded')} (kernel flags: {shown}); "
            "parity.json holds each environment's full pinned set.")
