"""``parity --repro DIR``: for each engine route with a finding, a folder its maintainer can run without softcapgrad.

A bundle holds the tiny model folders the route ran (config.json, safetensors, the stand-in tokenizer), the token
ids, the reference's log-probabilities as .npy data, bundle.json (each cap's recorded verdict, tolerance and which
reference it is judged against), requirements.txt (the pinned set the engine ran with), reproduce.py (a few lines
that run the engine as its users do, then the comparison of forward/bundle_check.py: standard library and numpy
only) and REPORT.md, to paste into an upstream issue. Nothing in a bundle is run when it is written.

A finding is a row whose verdict is neither "applied" nor one that says nothing of the engine ("not set", "no such
architecture", a cap transformers leaves unused that the engine leaves unused too, an engine whose environment is
not built here).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np

from softcapgrad.engines.forward import bundle_check, catalog, verdict
from softcapgrad.engines.forward.parity import FOLDERS

NOT_FINDINGS = ("applied", "not set", "no such architecture")
CHECK = Path(bundle_check.__file__)
RATIO_HINT = "judged by which reference is"


def is_finding(row: dict) -> bool:
    if row["verdict"] in NOT_FINDINGS or ("c" in row and row["c"] is None):  # no cap set: nothing to judge
        return False
    if row["verdict"] == "could not run" and "softcapgrad engines install" in (row.get("hint") or ""):
        return False  # its environment is not built on this machine: nothing was run, nothing found
    return row["verdict"] != "unused by transformers" or "the engine applies it" in (row.get("hint") or "")


def findings(rows: list[dict]) -> dict:
    """(model, engine, route) -> that run's rows, for every run with at least one finding, in the rows' order."""
    runs: dict = {}
    for r in rows:
        runs.setdefault((r["model"], r["engine"], r["route"]), []).append(r)
    return {key: found for key, found in runs.items() if any(is_finding(r) for r in found)}


def spec(row: dict, run_rows: list[dict], output: str, have: set) -> dict:
    """How the bundle's script judges one cap, as parity judged it: the engine run it reads (a folder name), the
    expected form and the form without the cap (a reference file, or "own cap" / "own": from the engine's own
    logits without the final cap), and the verdict the script should print when it reproduces the row."""
    final = next((r for r in run_rows if r["cap"] == "final"), {})
    own = final.get("verdict") == "ignores the folder's caps"
    off = FOLDERS["final off"]
    labels = ("the reference with the cap", "the reference without it")
    if row["cap"] == "attention":
        if row["verdict"] == "unused by transformers":
            run, expected, without = off, "final off", "attention forced"
            labels = ("transformers as shipped (the cap unused)", "transformers with the cap forced on")
        elif own or off not in have:
            run, expected, without = FOLDERS["capped"], "capped", "attention off"
        else:
            run, expected, without = off, "final off", "uncapped"
    else:
        run = FOLDERS["capped"]
        attention = next((r for r in run_rows if r["cap"] == "attention"), {})
        if own or output == "logprobs" or off not in have:
            expected, without = (("attention off", "uncapped") if attention.get("verdict") == "ignored"
                                 else ("capped", "final off"))
        else:
            expected, without = "own cap", "own"
            labels = ("c·tanh(a/c) of the engine's own logits a without the cap", "those logits a")
    plain = row["verdict"] in ("applied", "ignored", "different", "not bound", "not finite", "could not run")
    further = row.get("fits") or row.get("outside_form") or (row.get("hint") or "").startswith(verdict.OWN_PAIR)
    expect = row["verdict"] if plain and not further else None  # a named form or the engine's own pair: not repeated
    if row["verdict"] == "unused by transformers":  # only those the engine applies are findings
        expect = "applies the cap"
    ref = lambda name: name if name in ("own cap", "own") else f"reference/{FOLDERS.get(name, name.replace(' ', '-'))}.npy"  # noqa: E731
    return {"cap": row["cap"], "c": row.get("c"), "recorded": row["verdict"], "expect": expect, "run": run,
            "expected": ref(expected), "without": ref(without), "tolerance": row.get("tolerance") or 0.0,
            "top_k": row.get("top_k") or 0, "ratio": RATIO_HINT in (row.get("hint") or ""), "output": output,
            "note": row.get("hint") or "", "reference_forms": (expected, without), "labels": labels,
            "kind": "unused" if row["verdict"] == "unused by transformers" else "cap"}


def folder_name(model: str, engine: str, route: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", f"{model}--{engine}--{route}").strip("._")[:120] or "run"


def engine_code(engine: catalog.Engine, route: catalog.Route) -> str:
    """The lines of reproduce.py that run the engine: transformers as its users load it, or the adapter parity ran
    (copied beside the script, with the protocol it imports)."""
    if engine.adapter == "transformers":
        option = ', attn_implementation="eager"' if route.adapter_route.endswith("eager") else ""
        said = ("the setting transformers documents for soft-capped models" if option else
                "nothing else: transformers picks the attention implementation and the dtype by itself")
        return (f"import torch\nfrom transformers import AutoModelForCausalLM\n\n\n"
                f"def engine_logits(folder, ids):\n"
                f"    # route {route.id}: {said}\n"
                f"    model, loading = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True{option},\n"
                f"                                                          output_loading_info=True)\n"
                f"    if loading[\"missing_keys\"]:  # they would be initialised at random: the logits would mean nothing\n"
                f"        raise RuntimeError(f\"{{len(loading['missing_keys'])}} tensors of the model are not in the \"\n"
                f"                           f\"folder, such as {{sorted(loading['missing_keys'])[0]}}\")\n"
                f"    model.eval()\n"
                f"    with torch.no_grad():\n"
                f"        x = torch.as_tensor(ids, dtype=torch.long).reshape(1, -1)\n"
                f"        return model(input_ids=x, use_cache=False).logits[0].float().numpy()\n")
    return ("import sys\nfrom pathlib import Path as _Path\n\n"
            "sys.path.insert(0, str(_Path(__file__).resolve().parent / \"adapter\"))\n"
            f"import adapter_protocol as protocol  # noqa: E402\nimport adapter_{engine.adapter} as adapter  # noqa: E402\n\n\n"
            f"def engine_logits(folder, ids):\n"
            f"    # route {route.id}: {route.text}\n"
            f"    run = protocol.Run(folder.parent, {route.adapter_route!r}, [folder.name], ids)\n"
            f"    return adapter.run_variant(run, folder.name)\n")


def assemble(doc: str, code: str, check: Path, entry: str) -> str:
    """A bundle's reproduce.py: its docstring ``doc``, offline settings, the lines ``code`` that run the library, then
    the standalone comparison ``check`` (without its docstring, which is about softcapgrad) and ``main(entry)``."""
    head = (f'"""{doc}\n"""\n\nimport os\n\nos.environ.setdefault("HF_HUB_OFFLINE", "1")\n'
            f'os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")\n\n')
    comparison = check.read_text(encoding="utf-8").split('"""', 2)[2].lstrip("\n")
    return head + code + "\n\n# --- the comparison ---\n\n" + comparison + (
        f"\n\nif __name__ == \"__main__\":\n    raise SystemExit(main({entry}))\n")


def script(engine: catalog.Engine, route: catalog.Route, model: str) -> str:
    return assemble(f"Reproduces what parity found for {engine.name}, route {route.id}, on a tiny {model}: python "
                    f"reproduce.py [--json].\n\nRun offline in the engine's environment (requirements.txt). It "
                    f"prints, for each cap, the reference's and the engine's log-probabilities at the worst position, "
                    f"and the verdict.", engine_code(engine, route), CHECK, "engine_logits")


def requirements(environment: str, versions: dict, pinned: dict | None) -> str:
    """The pinned set: the environment's requirements file as built, else the versions it ran (the main
    environment, or an interpreter given with --python) of the packages the engine needs."""
    from softcapgrad.engines.environments import environments

    if pinned is None and environment != environments.MAIN:
        text = environments.requirements_file(environment).read_text(encoding="utf-8")
    else:
        from softcapgrad.engines.environments.provenance import main_packages

        every = pinned or main_packages()  # the main environment's: softcapgrad's own interpreter
        names = list(dict.fromkeys([*versions, "numpy", "safetensors"]))
        text = "".join(f"{n}=={every.get(n) or versions.get(n)}\n" for n in names
                       if (every.get(n) or versions.get(n)) not in (None, "not installed"))
    if install(text) != PLAIN_INSTALL:
        text = f"# torch's CPU build is served by torch's own index, not PyPI: {install(text)}\n" + text
    return text


PLAIN_INSTALL = "pip install -r requirements.txt"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def install(requirements_text: str) -> str:
    """The install command a bundle's REPORT.md gives. A CPU build of torch (a pin ``torch==X+cpu``) is served only by
    torch's own index, so the command names it with --extra-index-url: PyPI stays the index for everything else
    (transformers, tokenizers, ... are not on torch's; --index-url would replace PyPI and leave them unfound)."""
    cpu = re.search(r"^torch==\S+\+cpu\s*$", requirements_text, flags=re.MULTILINE)
    return f"pip install --extra-index-url {TORCH_CPU_INDEX} -r requirements.txt" if cpu else PLAIN_INSTALL


def copy_adapter(source: Path, bundle: Path) -> None:
    """The adapter's script into ``bundle``/adapter, with every adapter module it imports, and theirs (read with
    ast, not run)."""
    import ast

    from softcapgrad.engines.environments.requirements import adapter_file

    folder = bundle / "adapter"
    folder.mkdir()
    todo = [source]
    while todo:
        path = todo.pop()
        shutil.copy2(path, folder / path.name)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        todo += [adapter_file(f"{name}.py") for name in sorted(names) if name.startswith(catalog.PREFIX)
                 and not (folder / f"{name}.py").exists() and adapter_file(f"{name}.py").is_file()]


def write_bundle(bundle: Path, kept: Path, run_rows: list[dict], reference, engine: catalog.Engine,
                 route: catalog.Route, info: dict, pinned: dict | None) -> list[str]:
    """One bundle in the new folder ``bundle`` (all but its REPORT.md); the caps it holds."""
    outputs = kept / "outputs" / f"{engine.name}--{route.id}"
    output = (outputs / "output.txt").read_text(encoding="utf-8") if (outputs / "output.txt").exists() else "logits"
    have = {p.stem for p in outputs.glob("*.npy")} if outputs.is_dir() else set()
    have = have or {FOLDERS[v] for v in ("capped", "final off")}  # nothing came back: the runs it was given
    specs = [spec(r, run_rows, output, have) for r in run_rows if is_finding(r)]
    runs = list(dict.fromkeys(s["run"] for s in specs))
    if any(s["kind"] == "unused" for s in specs):  # the folder without any cap: does removing it move the engine?
        runs.append(FOLDERS["uncapped"])
    bundle.mkdir(parents=True)
    (bundle / "reference").mkdir()
    shutil.copy2(kept / "model" / "ids.npy", bundle / "ids.npy")
    for run in runs:
        shutil.copytree(kept / "model" / run, bundle / run)
    if any(n in (s["expected"], s["without"]) for s in specs for n in ("own cap", "own")) and "final-off" not in runs:
        shutil.copytree(kept / "model" / "final-off", bundle / "final-off")
        runs.append("final-off")
    for s in specs:
        for name, file in zip(s.pop("reference_forms"), (s["expected"], s["without"])):
            if file.startswith("reference/"):
                np.save(bundle / file, verdict.log_probs(reference.logits[name]), allow_pickle=False)
    if engine.adapter != "transformers":
        copy_adapter(catalog.script(engine.adapter), bundle)
    data = {"engine": engine.name, "route": route.id, "model": run_rows[0]["model"], "runs": runs, "caps": specs,
            "versions": info.get("versions", {})}
    (bundle / "bundle.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    (bundle / "reproduce.py").write_text(script(engine, route, run_rows[0]["model"]), encoding="utf-8")
    (bundle / "requirements.txt").write_text(requirements(engine.environment, info.get("versions", {}), pinned), encoding="utf-8")
    return [s["cap"] for s in specs]
