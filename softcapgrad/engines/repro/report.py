"""The REPORT.md of a reproduction bundle, and the writing of every bundle of a parity run (parity --repro).

A report says what was expected (the reference's log-probability at the worst position, with and without the cap),
what came back (the engine's, from the outputs parity kept of that very run), the setting that fixes it (a route of
the same engine that kept the cap, where one did) and, for the transformers engines, the source lines read from the
installed files of the version that ran: where the model passes the cap to its attention function, and whether the
attention implementation it picked names the cap at all. Elsewhere the source line is said to be not located.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

from softcapgrad.core.checks import InputError
from softcapgrad.engines.forward import bundle_check, catalog
from softcapgrad.engines.repro import repro


def site_of(engine: catalog.Engine, st, interpreter: dict | None) -> Path | None:
    """The site-packages folder of the transformers the engine ran (None: not known here)."""
    if interpreter is not None:
        origin = (interpreter.get("modules") or {}).get("transformers")
        return Path(origin).parent.parent if origin else None
    if st is not None and st.path is not None:
        found = sorted(st.path.glob("lib/python*/site-packages/transformers"))
        return found[0].parent if found else None
    import importlib.util

    spec = importlib.util.find_spec("transformers")  # located, not imported
    return Path(spec.origin).parent.parent if spec is not None and spec.origin else None


def source_lines(site: Path | None, model_type: str, attention: str) -> list[str]:
    """Where the installed transformers passes the attention cap, and whether the implementation that ran names it:
    file:line and the line's text, each read from the file."""
    if site is None:
        return []
    said = []
    modeling = site / "transformers" / "models" / model_type / f"modeling_{model_type}.py"
    try:
        for i, line in enumerate(modeling.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"\bsoftcap\s*=\s*self\.", line):
                said.append(f"`transformers/models/{model_type}/{modeling.name}:{i}` passes the cap to the attention "
                            f"function: `{line.strip()}`")
                break
    except OSError:
        return []
    integration = site / "transformers" / "integrations" / f"{attention}_attention.py"
    try:
        text = integration.read_text(encoding="utf-8")
    except OSError:
        return said
    for i, line in enumerate(text.splitlines(), 1):
        if line.startswith(f"def {attention}_attention_forward("):
            said.append(f"`transformers/integrations/{integration.name}:{i}` defines `{attention}_attention_forward`, "
                        "the implementation that ran; the word softcap occurs nowhere in that file, so the keyword "
                        "ends in its `**kwargs`"
                        if "softcap" not in text else
                        f"`transformers/integrations/{integration.name}:{i}` defines `{attention}_attention_forward` "
                        "(the file mentions softcap; where it is lost was not located)")
            break
    return said


def fix(rows: list[dict], row: dict) -> str:
    """The route of the same engine that kept this cap on this model, as the setting to change."""
    if row["verdict"] == "unused by transformers":
        return ("None needed in the engine: transformers' own code never passes this cap to its attention, and the "
                "engine applies it as config.json sets it.")
    engine = catalog.engines().get(row["engine"])
    keeps = [r["route"] for r in rows if (r["engine"], r["model"], r["cap"]) == (row["engine"], row["model"],
                                                                                  row["cap"]) and r["verdict"] == "applied"]
    if not keeps:
        return "No route of this engine tried by parity kept the cap."
    text = engine.route(keeps[0]).text if engine else ""
    return f"Route `{keeps[0]}` of the same engine kept it: {text}."


def _versions(versions: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in versions.items()) or "not recorded"


def reproduce(requirements_text: str, script: str = "reproduce.py") -> list[str]:
    """REPORT.md's last section: the steps, one shell command a line, that install the pinned set from the public
    indexes into a fresh virtual environment and run the script."""
    return ["## Reproduce", "", "In a fresh virtual environment (`python -m venv`, then activate it), in this folder:",
            "", "```sh", repro.install(requirements_text), f"python {script}   # --json for the numbers as JSON",
            "```", ""]


def commands(text: str) -> list[str]:
    """The lines of a REPORT.md's shell block, each whole, as a shell takes them."""
    block = text.split("```sh\n", 1)[1].split("```", 1)[0] if "```sh\n" in text else ""
    return [line for line in block.splitlines() if line.strip()]


def report(run_rows: list[dict], rows: list[dict], got: list[dict], specs: list[dict], info: dict, reference,
           sources: list[str], requirements_text: str = "") -> str:
    first = run_rows[0]
    caps = ", ".join(f"{k} {v}" for k, v in reference.caps.items() if v is not None)
    lines = [f"# {first['engine']} ({first['route']}): soft-caps of a tiny {first['model']}", "",
             f"Engine: {first['engine']}, route `{first['route']}`: {info.get('did') or info.get('how')}.",
             f"Versions: {_versions(info.get('versions', {}))}.",
             f"Model: a tiny {reference.model_type} (the folders here: config.json, model.safetensors, a stand-in "
             f"tokenizer), caps {caps}; its weights are scaled so that every cap binds (largest |a/c| "
             + ", ".join(f"{k} {v:.3g}" for k, v in reference.reach.items() if isinstance(v, float))
             + f"); {reference.ids.size} token ids in ids.npy.",
             "The reference is transformers in fp32 with eager attention, the caps on and each switched off; its "
             "log-probabilities are in reference/.", ""]
    for row, g, s in zip([r for r in run_rows if repro.is_finding(r)], got, specs):
        lines += [f"## The {row['cap']} cap (c = {row.get('c')}): {row['verdict']}", ""]
        if "position" in g:
            on, off = s["labels"]
            lines += [f"- Expected: at position {g['position']}, token id {g['token_id']}, log-probability "
                      f"{g['reference']:.6g} ({on}; {off}: {g['without_cap']:.6g}).",
                      f"- Came back: {g['engine']:.6g}; the largest difference over the positions judged is "
                      f"{g['error']:.3g} from {on} and {g['error_without']:.3g} from {off}, against a tolerance "
                      f"of {g['tolerance']:.3g}; reproduce.py says: {g['verdict']}."]
            if g.get("moved") is not None:
                lines.append(f"- Removing the cap from config.json moves the engine's log-probabilities by "
                             f"{g['moved']:.3g}: the engine applies the cap that transformers leaves unused.")
        else:
            lines.append(f"- Came back: {g.get('why', 'nothing')}.")
        if row.get("hint"):
            lines.append(f"- parity's note: {row['hint']}.")
        lines += [f"- The setting that fixes it: {fix(rows, row)}",
                  "- The source: " + ("; ".join(sources) + "." if sources and row["cap"] == "attention" else
                                      "not located by this tool."), ""]
    lines += reproduce(requirements_text)
    return "\n".join(lines)


def _outputs(kept: Path, engine: str, route: str, runs: list[str], reason: str | None) -> dict:
    folder = kept / "outputs" / f"{engine}--{route}"
    out = {}
    for run in runs:
        path = folder / f"{run}.npy"
        out[run] = np.load(path, allow_pickle=False) if path.exists() else (reason or "no output")
    return out


def write_all(stage: Path, results: list, states: dict, interpreter: dict | None) -> list[dict]:
    """Every bundle of ``results`` (Parity, measured with ``keep``) in the folder ``stage``, with INDEX.md; one
    entry per bundle (its folder and the caps it holds)."""
    import shutil

    known = catalog.engines()
    rows = [r for p in results for r in p.rows]
    written = []
    for p in results:
        infos = {(e["engine"], e["route"]): e for e in p.engines}
        for (model, name, route_id), run_rows in repro.findings(p.rows).items():
            engine = known[name]
            route = engine.route(route_id)
            info = infos.get((name, route_id), {})
            bundle = stage / repro.folder_name(model, name, route_id)
            pinned = interpreter["packages"] if interpreter else None
            caps = repro.write_bundle(bundle, p.kept, run_rows, p.reference, engine, route, info, pinned)
            data = json.loads((bundle / "bundle.json").read_text(encoding="utf-8"))
            outputs = _outputs(p.kept, name, route_id, data["runs"], info.get("reason"))
            got = [bundle_check.check(s, bundle, outputs) for s in data["caps"]]
            attention = re.search(r"\battention (\w+)", info.get("did") or "")
            sources = (source_lines(site_of(engine, states.get(engine.environment), interpreter),
                                    p.reference.model_type, attention[1]) if engine.adapter == "transformers"
                       and attention else [])
            pins = (bundle / "requirements.txt").read_text(encoding="utf-8")
            (bundle / "REPORT.md").write_text(report(run_rows, rows, got, data["caps"], info, p.reference, sources,
                                                     pins), encoding="utf-8")
            written.append({"bundle": bundle.name, "caps": ", ".join(caps),
                            "verdicts": ", ".join(r["verdict"] for r in run_rows if repro.is_finding(r))})
    for p in results:
        if p.kept is not None:
            shutil.rmtree(p.kept, ignore_errors=True)
    index = ["# Reproduction bundles", "", "One folder per engine route with a finding; each has its REPORT.md.", ""]
    index += [f"- `{w['bundle']}`: {w['caps']} ({w['verdicts']})" for w in written] or ["No finding: every cap that "
                                                                                        "ran was applied."]
    (stage / "INDEX.md").write_text("\n".join(index) + "\n", encoding="utf-8")
    return written


def target(path: Path) -> Path:
    """--repro DIR, checked before any work: a new name or an empty folder, in a folder that takes new files."""
    from softcapgrad.core.files import writable_folder

    path = Path(path)
    if os.path.lexists(path):
        if path.is_symlink() or not path.is_dir():
            raise InputError(f"--repro {path}: exists and is not a folder; give a new name or an empty folder")
        if any(path.iterdir()):
            raise InputError(f"--repro {path}: exists and is not empty; give a new name or an empty folder")
    writable_folder(path.parent if str(path.parent) else Path("."), "--repro")
    return path


def stage(path: Path) -> Path:
    """A folder beside DIR (the same file system) that becomes DIR with one rename."""
    import tempfile

    from softcapgrad.core.files import umask_mode

    path.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f".{path.name[:64]}.", suffix=".repro-tmp", dir=path.parent))
    os.chmod(folder, umask_mode(0o777))
    return folder


def put_in_place(staged: Path, path: Path) -> None:
    """The stage renamed to DIR (an empty DIR is replaced; a DIR that filled meanwhile is refused, nothing moved)."""
    try:
        os.rename(staged, path)
    except OSError as err:
        raise InputError(f"--repro {path}: cannot be put in place ({err.strerror or err}); nothing written") from None
