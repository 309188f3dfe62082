"""parity --repro DIR (reproduction bundles), parity --engine X --python PATH (the user's interpreter) and the
provenance parity.json records (the CPU, each environment's pinned set, the date).

The fast tests replace parity's measurement by planted results; the live ones (slow) run transformers 4.57.6 and
5.0.0 from their environments: a bundle of a row that drops the attention cap, run in its engine's environment,
reproduces its verdict; and the 5.0.0 interpreter given by path runs the transformers engine."""

from __future__ import annotations

import ast
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import types

import numpy as np
import pytest
from typer.testing import CliRunner

from softcapgrad.cli.app import app
from softcapgrad.engines.environments import provenance
from softcapgrad.engines.repro import repro, report as report_md
from softcapgrad.engines.forward import bundle_check

pytest.importorskip("transformers")

CPUINFO = ("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Planted Xeon 9999\n"
           "flags\t\t: fpu sse2 avx avx2 f16c avx512f avx512bw avx512_bf16 amx_tile amx_bf16\n\n"
           "processor\t: 1\nmodel name\t: Planted Xeon 9999\nflags\t\t: fpu\n")
EPOCH = "1780000000"  # 2026-05-28 UTC
TOKENS, VOCAB, C_ATT, C_FINAL = 6, 10, 50.0, 30.0


def test_the_cpu_facts_are_read_from_the_text_not_the_machine():
    assert provenance.cpu_facts(CPUINFO) == {"model": "Planted Xeon 9999",
                                             "flags": ["avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "f16c"]}
    arm = provenance.cpu_facts("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert arm == {"model": "not recorded", "flags": []}  # no x86 kernel flag, and no model name given
    assert provenance.cpu_facts("") == {"model": "not recorded", "flags": None}  # nothing read: not "no flags"
    assert provenance.cpu_label(provenance.cpu_facts("")) == "not recorded [flags not recorded]"


def test_a_row_from_another_cpu_than_most_is_marked_and_unknown_ones_are_not():
    rows = [{"cpu": "A"}, {"cpu": "A"}, {"cpu": "B"}, {}]
    assert [r.get("other_cpu", False) for r in provenance.mark_other_cpus(rows)] == [False, False, True, False]
    assert not any("other_cpu" in r for r in provenance.mark_other_cpus([{"cpu": "A", "other_cpu": True}, {}]))


def _reference():
    rng = np.random.default_rng(0)
    final_off, uncapped = rng.normal(0, 20, (TOKENS, VOCAB)), rng.normal(0, 20, (TOKENS, VOCAB))
    capped = C_FINAL * np.tanh(final_off / C_FINAL)
    return types.SimpleNamespace(caps={"attention": C_ATT, "final": C_FINAL}, reach={"attention": 4.0, "final": 4.0},
                                 scales={}, ids=np.arange(TOKENS, dtype=np.int64), model_type="gemma2", width=64,
                                 logits={"capped": capped, "final off": final_off, "uncapped": uncapped,
                                         "attention off": C_FINAL * np.tanh(uncapped / C_FINAL)})


def _rows(engine: str) -> list[dict]:
    base = {"engine": engine, "model": "gemma2", "hint": "", "top_k": 0, "max_logit": 30.0, "error_off": 0.0,
            "where": "token 0, id 0", "reach": 4.0}
    return [{**base, "route": "default", "cap": "attention", "c": C_ATT, "verdict": "ignored", "error": 9.0,
             "tolerance": 1e-3},
            {**base, "route": "default", "cap": "final", "c": C_FINAL, "verdict": "applied", "error": 1e-7,
             "tolerance": 1e-4},
            {**base, "route": "eager", "cap": "attention", "c": C_ATT, "verdict": "applied", "error": 0.0,
             "tolerance": 1e-3},
            {**base, "route": "eager", "cap": "final", "c": C_FINAL, "verdict": "applied", "error": 0.0,
             "tolerance": 1e-4}]


@pytest.fixture()
def planted(tmp_path, monkeypatch):
    """parity's measurement replaced: one engine's two routes on a planted gemma2 whose default route gives the
    reference without the attention cap (to 1e-9); the CPU read from a planted file, the date fixed."""
    from softcapgrad.engines.forward import parity, parity_run
    from softcapgrad.engines.environments import provenance as prov

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)
    (tmp_path / "cpuinfo").write_text(CPUINFO, encoding="utf-8")
    monkeypatch.setattr(prov, "CPUINFO", tmp_path / "cpuinfo")
    (tmp_path / "cache").mkdir()
    reference = _reference()

    def measure(src, engines, states, n, s, timeout, label, advance=None, jobs=1, keep=None):
        engine = engines[0].name
        if keep is not None:
            for folder in ("capped", "final-off"):
                (keep / "model" / folder).mkdir(parents=True)
                (keep / "model" / folder / "config.json").write_text("{}", encoding="utf-8")
            np.save(keep / "model" / "ids.npy", reference.ids)
            out = keep / "outputs" / f"{engine}--default"
            out.mkdir(parents=True)
            np.save(out / "final-off.npy", reference.logits["uncapped"] + 1e-9)
            np.save(out / "capped.npy", C_FINAL * np.tanh(reference.logits["uncapped"] / C_FINAL))
        infos = [{"engine": engine, "route": r, "model": label, "cpu_s": 1.0, "wall_s": 1.0, "reason": None,
                  "did": f"ran, attention {'sdpa' if r == 'default' else 'eager'}", "how": r,
                  "versions": {"transformers": "4.57.6", "torch": "2.13.0+cpu"}} for r in ("default", "eager")]
        return parity.Parity(label, reference, _rows(engine), infos, kept=keep)

    def measure_all(sources, engines, states, n, s, timeout, advance=None, jobs=1):
        return [measure(src, engines, states, n, s, timeout, label, advance, jobs, keep)
                for label, src, keep in sources]

    monkeypatch.setattr(parity_run, "measure_all", measure_all)
    return tmp_path


def _parity(*args):
    return CliRunner().invoke(app, ["parity", *args])


def test_parity_json_records_the_cpu_the_date_and_each_environments_pinned_set(planted):
    from importlib import metadata

    result = _parity("--engine", "transformers", "--out", str(planted / "out"))
    assert result.exit_code == 0, result.output
    data = json.loads((planted / "out" / "parity.json").read_text(encoding="utf-8"))
    record = data["provenance"]
    assert record["cpu"] == provenance.cpu_facts(CPUINFO) and record["date"] == "2026-05-28"
    packages = record["environments"]["main"]["packages"]
    assert packages["transformers"] == metadata.version("transformers") and packages["numpy"] == metadata.version(
        "numpy")
    assert len(packages) == len({d.metadata["Name"] for d in metadata.distributions()})  # every one, not a subset
    assert {r["cpu"] for r in data["rows"]} == {provenance.cpu_label(record["cpu"])}
    assert not any("other_cpu" in r for r in data["rows"])
    assert "Measured on 2026-05-28; CPU: Planted Xeon 9999 (kernel flags: avx2, avx512f" in (
        planted / "out" / "parity.md").read_text(encoding="utf-8")


def test_an_update_on_another_cpu_marks_the_rows_measured_there(planted):
    out = planted / "out"
    assert _parity("--engine", "transformers", "--out", str(out)).exit_code == 0
    data = json.loads((out / "parity.json").read_text(encoding="utf-8"))
    data["rows"] += [{**r, "engine": e} for e in ("onnx", "llamacpp") for r in data["rows"]]  # three on the first CPU
    data["engines"] += [{**x, "engine": e} for e in ("onnx", "llamacpp") for x in data["engines"]]
    (out / "parity.json").write_text(json.dumps(data), encoding="utf-8")
    (planted / "cpuinfo").write_text(CPUINFO.replace("Planted Xeon 9999", "Planted EPYC 1"), encoding="utf-8")
    result = _parity("--engine", "transformers", "--out", str(out), "--update")
    assert result.exit_code == 0, result.output
    merged = json.loads((out / "parity.json").read_text(encoding="utf-8"))
    marked = {(r["engine"], r.get("other_cpu", False)) for r in merged["rows"]}
    assert marked == {("transformers", True), ("onnx", False), ("llamacpp", False)}
    assert merged["provenance"]["cpu"]["model"] == "Planted EPYC 1"
    assert [e["cpu"]["model"] for e in merged["provenance"]["earlier"]] == ["Planted Xeon 9999"]
    assert (out / "parity.md").read_text(encoding="utf-8").count("(measured on another CPU)") == 4


@pytest.mark.parametrize("engine", ["transformers", "onnx"])
def test_a_bundle_holds_the_model_the_data_a_standalone_script_and_the_report(planted, engine, monkeypatch):
    from softcapgrad.engines.forward import catalog
    from softcapgrad.engines.environments import environments

    monkeypatch.setattr(environments, "ready", lambda *a, **k: environments.main_state())  # onnx: as if installed
    monkeypatch.setattr(subprocess, "Popen", None)  # nothing in a bundle may run while it is written
    target = planted / "bundles"
    result = _parity("--engine", engine, "--repro", str(target))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in planted.iterdir()) == ["bundles", "cache", "cpuinfo"]  # no stage left beside it
    bundle = target / f"gemma2--{engine}--default"
    assert sorted(p.name for p in target.iterdir()) == ["INDEX.md", bundle.name]  # eager applied both: no bundle
    data = json.loads((bundle / "bundle.json").read_text(encoding="utf-8"))
    assert [(s["cap"], s["run"], s["expected"], s["without"], s["expect"]) for s in data["caps"]] == [
        ("attention", "final-off", "reference/final-off.npy", "reference/uncapped.npy", "ignored")]
    reference = _reference()
    assert np.array_equal(np.load(bundle / "reference" / "uncapped.npy"),
                          bundle_check.log_probs(reference.logits["uncapped"]))
    got = bundle_check.check(data["caps"][0], bundle, {"final-off": reference.logits["uncapped"] + 1e-9})
    assert got["verdict"] == "ignored" and got["error"] > 1.0 and got["error_without"] < 1e-6
    report = (bundle / "REPORT.md").read_text(encoding="utf-8")
    assert f"log-probability {got['reference']:.6g} (the reference with the cap" in report and f"Came back: {got['engine']:.6g}" in report
    assert "Route `eager` of the same engine kept it" in report
    # torch's CPU build is on torch's index only: the install step names it, and PyPI stays the index for the rest
    assert "torch==2.13.0+cpu\n" in (bundle / "requirements.txt").read_text(encoding="utf-8")
    assert report_md.commands(report) == [
        f"pip install --extra-index-url {repro.TORCH_CPU_INDEX} -r requirements.txt",
        "python reproduce.py   # --json for the numbers as JSON"]
    code = (bundle / "reproduce.py").read_text(encoding="utf-8")
    imported = {a.name.split(".")[0] for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(ast.parse(code)) if isinstance(n, ast.ImportFrom)}
    assert "softcapgrad" not in code and imported <= {"os", "json", "sys", "pathlib", "numpy", "torch", "transformers",
                                                      "adapter_protocol", f"adapter_{engine}"}
    pins = (bundle / "requirements.txt").read_text(encoding="utf-8")
    if engine == "onnx":  # the adapter parity ran, beside the script, and the environment's own pinned file
        assert {p.name for p in (bundle / "adapter").iterdir()} == {"adapter_onnx.py", "adapter_protocol.py",
                                                                     "adapter_transformers_load.py"}
        assert environments.requirements_file("onnx").read_text(encoding="utf-8") in pins
    else:
        assert "AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True,\n" in code
        from importlib import metadata

        assert f"transformers=={metadata.version('transformers')}\n" in pins  # the environment's, as it ran
        assert f"numpy=={metadata.version('numpy')}\n" in pins
    assert catalog.engines()[engine].route("default")


def test_repro_refuses_a_folder_that_holds_something_or_a_file_before_any_work(planted):
    full = planted / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine", encoding="utf-8")
    (planted / "a-file").write_text("x", encoding="utf-8")
    for target, said in ((full, "exists and is not empty"), (planted / "a-file", "exists and is not a folder")):
        result = _parity("--engine", "transformers", "--repro", str(target), "--out", str(planted / "out"))
        assert result.exit_code == 2 and said in result.output and len(result.output.strip().splitlines()) == 1
    assert sorted(p.name for p in planted.iterdir()) == ["a-file", "cache", "cpuinfo", "full"]
    assert [p.name for p in full.iterdir()] == ["keep.txt"]
    assert _parity("--engine", "transformers", "--repro", str(planted / "empty")).exit_code == 0  # a new name


def _script(folder, name: str, body: str):
    path = folder / name
    path.write_text("#!/bin/sh\n" + body + "\n", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_python_refuses_what_is_no_working_interpreter_in_one_line(planted, monkeypatch):
    from softcapgrad.engines.forward import interpreter

    monkeypatch.setattr(interpreter, "PROBE_TIMEOUT", 1.0)
    plain = planted / "plain.txt"
    plain.write_text("print(1)\n", encoding="utf-8")
    cases = [(planted / "missing", "no such file"), (plain, "not executable"), (planted, "is a folder"),
             (_script(planted, "talks", "echo hello"), "not a Python interpreter"),
             (_script(planted, "fails", "exit 3"), "not a Python interpreter (it did not answer the probe, exit code 3)"),
             (_script(planted, "hangs", "sleep 30"), "no answer in 1 s (stopped)")]
    for path, said in cases:
        start = time.monotonic()
        result = _parity("--engine", "transformers", "--python", str(path), "--out", str(planted / "out"))
        assert result.exit_code == 2 and said in result.output, (path, result.output)
        assert len(result.output.strip().splitlines()) == 1 and time.monotonic() - start < 15
    assert not (planted / "out").exists()


def test_python_refuses_an_interpreter_without_the_engine_and_wrong_company(planted):
    bare = planted / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    result = _parity("--engine", "transformers", "--python", str(bare / "bin" / "python"))
    assert result.exit_code == 2 and "engine transformers cannot be imported there (no module numpy, transformers, " \
                                      "torch in Python 3." in result.output
    for args, said in ((["--python", sys.executable], "give exactly one --engine NAME"),
                       (["--engine", "transformers", "--engine", "onnx", "--python", sys.executable], "exactly one"),
                       (["--engine", "transformers", "--python", sys.executable, "--install"], "--install does not"),
                       (["x", "--server", "http://127.0.0.1:1", "--python", sys.executable], "--python does not")):
        result = _parity(*args)
        assert result.exit_code == 2 and said in result.output, (args, result.output)


# --- live: the engines' own environments ---------------------------------------------------------------------


def _live(*args):
    result = CliRunner().invoke(app, ["parity", "--seq-len", "12", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.slow
@pytest.mark.engine_environments("transformers-4")
def test_a_bundle_run_in_its_engines_environment_reproduces_its_row(engine_environment, tmp_path):
    """transformers 4.57.6 picks sdpa for Gemma 2 and drops the attention cap: its bundle, run by that environment's
    interpreter in a folder of its own (no softcapgrad on its path), prints the same verdict."""
    env = engine_environment("transformers-4")
    shown = _live("--engine", "transformers-4", "--repro", str(tmp_path / "b"))
    found = [(r["route"], r["cap"], r["verdict"]) for r in shown["rows"] if r["verdict"] != "applied"]
    assert found == [("default", "attention", "ignored")]
    bundle = tmp_path / "b" / "gemma2--transformers-4--default"
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["INDEX.md", bundle.name]
    moved = shutil.copytree(bundle, tmp_path / "elsewhere")  # stands alone: nothing points back at parity's folders
    run = subprocess.run([str(env.python), "-I", "reproduce.py", "--json"], cwd=moved, capture_output=True, text=True,
                         timeout=600, env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path),
                                           "OMP_NUM_THREADS": "1", "HF_HOME": str(tmp_path / "hf")})
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout)["caps"]
    assert [(g["cap"], g["verdict"], g["recorded"], g["reproduced"]) for g in got] == [
        ("attention", "ignored", "ignored", True)]
    row = next(r for r in shown["rows"] if r["route"] == "default" and r["cap"] == "attention")
    assert got[0]["error"] == pytest.approx(row["error"], rel=1e-3)  # the same fp32 run: the same worst error
    report = (moved / "REPORT.md").read_text(encoding="utf-8")
    assert "transformers/integrations/sdpa_attention.py:" in report and "attn_implementation=\"eager\"" in report


@pytest.mark.slow
@pytest.mark.engine_environments("transformers-5.0")
def test_python_runs_the_engine_with_the_interpreter_given_and_records_it(engine_environment, tmp_path):
    """The transformers engine (softcapgrad's own 5.24.0 keeps Gemma 2's attention cap by default) given the
    transformers-5.0 environment's interpreter by path: 5.0.0's sdpa drops it, and the run says which ran."""
    env = engine_environment("transformers-5.0")
    shown = _live("--engine", "transformers", "--python", str(env.python), "--out", str(tmp_path / "out"))
    verdicts = {(r["route"], r["cap"]): r["verdict"] for r in shown["rows"]}
    assert verdicts[("default", "attention")] == "ignored" and verdicts[("eager", "attention")] == "applied"
    assert shown["params"]["python"] == str(env.python)
    data = json.loads((tmp_path / "out" / "parity.json").read_text(encoding="utf-8"))
    probed = subprocess.run([str(env.python), "-I", "-c", "import sys; print(sys.version)"], capture_output=True,
                            text=True, check=True).stdout.strip()
    from softcapgrad.engines.forward.parity import private

    for e in data["engines"]:  # the file writes the engines cache as <engines>
        assert e["interpreter"] == private(str(env.python)) and e["python"] == probed
        assert e["versions"]["transformers"] == env.versions["transformers"] == "5.0.0"
    recorded = data["provenance"]["environments"]["main"]
    assert recorded["given"] and recorded["packages"]["transformers"] == "5.0.0"
    assert {k: v for k, v in recorded["packages"].items() if k in env.versions} == env.versions


def test_the_bundles_comparison_gives_each_verdict_from_its_numbers():
    """bundle_check.judge on planted log-probabilities: the two forms 1.0 apart, the tolerance 1e-3."""
    expected = bundle_check.log_probs(np.zeros((3, 4)))
    without = bundle_check.log_probs(np.array([[0.0, 1.0, 0.0, 0.0]] * 3))
    say = lambda lp, **k: bundle_check.judge(lp, expected, without, 1e-3, **k)["verdict"]  # noqa: E731
    assert say(expected + 5e-4) == "applied" and say(without - 5e-4) == "ignored" and say(expected + 0.3) == "different"
    assert bundle_check.judge(expected, expected, expected + 1e-3, 1e-3)["verdict"] == "not bound"  # forms ≤ 10 tol
    assert say(expected + 0.02, ratio=True) == "applied" and say((expected + without) / 2, ratio=True) == "not bound"
    got = bundle_check.judge(without, expected, without, 1e-3)
    assert (got["position"], got["token_id"], got["engine"]) == (0, 1, float(without[0, 1]))  # the worst entry
    moved = bundle_check.unused(expected, np.ones((3, 4)) * [0, 2, 0, 0], {"error": 0.0, "error_without": 1.0}, 1e-3, 0)
    assert moved["verdict"] == "applies the cap" and moved["moved"] > 0.5  # removing it moved the engine
    agrees = bundle_check.unused(expected, np.zeros((3, 4)), {"error": 0.0, "error_without": 1.0}, 1e-3, 0)
    assert agrees == {"verdict": "agrees with transformers", "moved": 0.0}


@pytest.mark.slow
@pytest.mark.engine_environments("kerashub")
def test_an_adapter_bundle_runs_the_adapter_beside_it_in_its_environment(engine_environment, tmp_path):
    """Keras Hub applies Gemma 3's attention cap, which transformers leaves unused: its bundle carries the adapter
    parity ran and, run by the Keras Hub environment's interpreter, says the same."""
    env = engine_environment("kerashub")
    _live("--engine", "kerashub", "--model-type", "gemma3_text+attention", "--repro", str(tmp_path / "b"))
    bundle = tmp_path / "b" / "gemma3_text+attention--kerashub--default"
    run = subprocess.run([str(env.python), "-I", "reproduce.py", "--json"], cwd=bundle, capture_output=True,
                         text=True, timeout=600, env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)})
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout)["caps"]
    assert [(g["cap"], g["verdict"], g["reproduced"]) for g in got] == [("attention", "applies the cap", True)]


def test_rows_that_say_nothing_of_the_engine_get_no_bundle():
    row = {"hint": ""}
    assert [repro.is_finding({**row, "verdict": v}) for v in ("applied", "not set", "no such architecture",
                                                              "ignored", "different", "not bound")] == [
        False, False, False, True, True, True]
    absent = "environment onnx not installed: softcapgrad engines install onnx"
    assert not repro.is_finding({"verdict": "could not run", "hint": absent})
    assert repro.is_finding({"verdict": "could not run", "hint": "RuntimeError: the exporter failed"})
    assert not repro.is_finding({"verdict": "could not run", "hint": "RuntimeError: the exporter failed", "c": None})
    unused = {"verdict": "unused by transformers"}
    assert not repro.is_finding({**unused, "hint": "the engine agrees with transformers, which never passes it"})
    assert repro.is_finding({**unused, "hint": "dead config; the engine applies it: removing it moves ..."})


def test_an_interrupted_run_leaves_no_bundle_folder_and_no_stage(planted, monkeypatch):
    from softcapgrad.engines.forward import parity_run

    def interrupted(sources, *args, **kwargs):
        keep = sources[0][2]
        (keep / "model").mkdir(parents=True)  # half of what a measurement keeps, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(parity_run, "measure_all", interrupted)
    result = _parity("--engine", "transformers", "--repro", str(planted / "bundles"))
    assert result.exit_code != 0
    assert sorted(p.name for p in planted.iterdir()) == ["cache", "cpuinfo"]
