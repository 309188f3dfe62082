"""softcapgrad engines (list, install, remove) and parity's refusals before running, each one line and exit 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from softcapgrad.cli.app import app

pytest.importorskip("transformers")


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def test_the_listing_says_each_engines_state(cache):
    result = CliRunner().invoke(app, ["engines", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["engine"]: r for r in json.loads(result.output)["rows"]}
    assert rows["transformers"]["state"] == "installed" and rows["transformers"]["environment"] == "main"
    assert rows["transformers-4"]["state"] == "not installed"
    assert rows["transformers-4"]["path"].startswith(str(cache / "softcapgrad" / "engines" / "transformers-4-"))


def test_parity_with_an_engine_not_installed_names_the_command(cache):
    result = CliRunner().invoke(app, ["parity", "--engine", "transformers-4"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "softcapgrad: error: engine transformers-4: its environment transformers-4 is not installed: "
        "softcapgrad engines install transformers-4 (or parity --install)"]


def test_an_unknown_engine_is_refused(cache):
    for command in (["parity", "--engine", "nosuch"], ["engines", "install", "nosuch"]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
        assert "nosuch" in result.output


def test_removing_what_is_not_there_says_so(cache):
    result = CliRunner().invoke(app, ["engines", "remove", "onnx", "transformers"])
    assert result.exit_code == 0
    assert "onnx: was not installed." in result.output and "main: softcapgrad's own, kept." in result.output


def test_parity_that_knows_nothing_can_run_exits_2(cache, monkeypatch):
    """An engine that declares the types it converts (Engine.types; Keras Hub once did) and holds none asked for:
    before building anything, one line and exit 2."""
    import dataclasses

    from softcapgrad.engines.forward import catalog

    declared = dataclasses.replace(catalog.CATALOG["kerashub"], types=("gemma2", "gemma3_text"))
    monkeypatch.setitem(catalog.CATALOG, "kerashub", declared)
    result = CliRunner().invoke(app, ["parity", "--model-type", "vaultgemma", "--engine", "kerashub"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "softcapgrad: error: no engine asked for has the architecture vaultgemma (kerashub converts gemma2, "
        "gemma3_text): nothing to run"]


@pytest.mark.parametrize("planted, said", [
    (None, "--update: cannot read"),
    ("not json", "is not JSON"),
    ('{"rows": []}', "holds no parity results"),
    ('{"params": {"seed": 7, "seq_len": 16, "set": []}, "models": [], "rows": [], "engines": []}',
     "measured with another seed (seed 7)"),
])
def test_update_refuses_what_it_cannot_merge_before_any_work(cache, tmp_path, planted, said):
    out = tmp_path / "out"
    out.mkdir()
    if planted is not None:
        (out / "parity.json").write_text(planted, encoding="utf-8")
    result = CliRunner().invoke(app, ["parity", "--engine", "transformers", "--out", str(out), "--update"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1 and said in result.output
    assert sorted(p.name for p in out.iterdir()) == (["parity.json"] if planted else [])


def test_update_replaces_only_the_engines_measured_again():
    from softcapgrad.engines.forward import parity

    def results(engine, verdict, models):
        return {"params": {}, "models": [{"model": m} for m in models],
                "rows": [{"engine": engine, "model": m, "route": r, "verdict": verdict}
                         for m in models for r in ("default", "eager")],
                "engines": [{"engine": engine, "model": m, "route": "default"} for m in models]}

    old = results("transformers", "applied", ["gemma2", "vaultgemma"])
    old["rows"] += results("onnx", "applied", ["gemma2"])["rows"]
    merged = parity.merge(old, results("transformers", "ignored", ["gemma2"]))
    assert [(r["engine"], r["model"], r["verdict"]) for r in merged["rows"]] == [
        ("transformers", "gemma2", "ignored"), ("transformers", "gemma2", "ignored"),
        ("onnx", "gemma2", "applied"), ("onnx", "gemma2", "applied"),
        ("transformers", "vaultgemma", "applied"), ("transformers", "vaultgemma", "applied")]
    assert [m["model"] for m in merged["models"]] == ["gemma2", "vaultgemma"]


def test_the_answer_never_calls_a_row_its_precision_cannot_decide_applied():
    """A bf16 row whose rounding bound spans the cap's effect is named as undecided, with the route that decides."""
    from softcapgrad.cli.parity_report import answer_of as _answer

    def row(route, verdict):
        return {"engine": "vllm_cpu", "route": route, "model": "vaultgemma", "cap": "attention", "verdict": verdict}

    data = {"models": [{"model": "vaultgemma", "reach": {"attention": 4.0}}],
            "rows": [row("default", "not bound"), row("fp32", "applied")]}
    first, second, _ = _answer(data)
    assert first.startswith("Every engine that ran applied every cap its precision lets this judge")
    assert second.startswith("Undecided (neither reference ten times nearer): vllm_cpu (default) cannot tell, in its "
                             "precision, the attention cap of vaultgemma; route fp32 keeps it.")
    data["rows"] = [row("fp32", "applied")]
    assert _answer(data)[0].startswith("Every engine that ran applied every cap it was given")


def test_an_export_of_transformers_sdpa_model_is_named_as_the_cause():
    """ExecuTorch's direct route exports the model as transformers loads it at sdpa: the answer says that sdpa drops
    the attention cap, not that the engine ignored it; a route whose account names no sdpa export still reads
    "ignored", and transformers' own sdpa route too."""
    from softcapgrad.cli.parity_report import answer_of as _answer

    def row(engine, route, verdict):
        return {"engine": engine, "route": route, "model": "gemma2", "cap": "attention", "verdict": verdict}

    def ran(engine, route, did):
        return {"engine": engine, "route": route, "model": "gemma2", "did": did}

    data = {"models": [{"model": "gemma2", "reach": {"attention": 4.0}}],
            "rows": [row("executorch_rt", "direct", "ignored"), row("executorch_rt", "direct-eager", "applied"),
                     row("openvino_intel", "fp32-kv32", "ignored"), row("transformers-4", "default", "ignored")],
            "engines": [ran("executorch_rt", "direct", "torch.export.export of the model as from_pretrained loads it "
                                                       "(attention sdpa), to_edge_transform_and_lower"),
                        ran("openvino_intel", "fp32-kv32", "attention: the exporter's own choice"),
                        ran("transformers-4", "default", "AutoModelForCausalLM.from_pretrained, attention sdpa")]}
    first = _answer(data)[0]
    assert ("executorch_rt (direct) exports the model at transformers' sdpa attention, which drops the attention "
            "cap of gemma2; route direct-eager keeps it") in first
    assert "openvino_intel (fp32-kv32) ignored the attention cap" in first
    assert "transformers-4 (default) ignored the attention cap" in first


def test_a_wider_bound_never_names_the_fix_of_a_stricter_finding():
    """mistral.rs's f16-KV route passes a final cap within fp16's 15-nat bound that its f32-KV route finds 21 nats
    off: the f16 route is not "the route that keeps it"; an fp32 route is the fix of an fp16 finding."""
    from softcapgrad.cli.parity_report import _fix

    def row(route, verdict, tolerance):
        return {"engine": "mistral_rs", "route": route, "model": "gemma3_text", "cap": "final", "verdict": verdict,
                "tolerance": tolerance}

    strict, wide = row("multimodal-kv32", "different", 0.00183), row("multimodal", "applied", 15.0)
    assert _fix([strict, wide], strict) == "no route of it tried here keeps it"
    strict, wide = row("multimodal-kv32", "applied", 0.00183), row("multimodal", "different", 15.0)
    assert _fix([strict, wide], wide) == "route multimodal-kv32 keeps it"


@pytest.mark.parametrize("command, params", [
    (["parity", "--model-type", "gemma2", "--engine", "transformers"],
     {"engines": ["transformers", "onnx"], "model": ["gemma2"]}),
    (["train-parity", "--model-type", "gemma2", "--engine", "transformers"],
     {"engines": ["transformers"], "model_types": ["gemma2", "nanochat"]}),
])
def test_a_partial_run_does_not_replace_fuller_results(tmp_path, command, params):
    """Results that hold an engine or a type this run leaves out stay: one line, exit 2, before any work."""
    import json

    name = "parity.json" if command[0] == "parity" else "train-parity.json"
    (tmp_path / name).write_text(json.dumps({"params": params, "rows": []}), encoding="utf-8")
    result = CliRunner().invoke(app, [*command, "--out", str(tmp_path)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "that this run does not measure" in lines[0]
    assert ("onnx" if command[0] == "parity" else "nanochat") in lines[0]
    assert json.loads((tmp_path / name).read_text(encoding="utf-8"))["params"] == params


# --- every environment the project builds, by one name each ------------------------------------


def _listed(*args: str) -> list[dict]:
    result = CliRunner().invoke(app, ["engines", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["rows"]


def test_the_listing_holds_every_environment_the_project_builds(cache):
    from softcapgrad.engines.environments import environments

    assert "train-peft" in environments.names() and "litgpt" in environments.names()  # the files are read
    assert {r["environment"] for r in _listed()} == {"main", *environments.names()}


def test_parity_and_train_parity_call_each_engine_by_one_name(cache):
    """An engine both checks run in one environment has one name, the listing's; no former spelling is printed."""
    from softcapgrad.engines.environments.environments import FORMER, MAIN
    from softcapgrad.engines.forward import catalog
    from softcapgrad.engines.training import routes

    forward = {e.environment: name for name, e in catalog.engines().items() if e.environment != MAIN}
    shared = {name: forward[env] for name, env in routes.ENGINES.items() if env in forward}
    assert shared and all(name == parity_name for name, parity_name in shared.items()), shared
    printed = {r[k] for r in _listed() for k in ("engine", "environment")}
    assert not printed & set(FORMER) and set(FORMER.values()) <= printed


@pytest.mark.parametrize("name", ["train-peft", "peft-trl"])
def test_install_and_remove_take_a_training_environment(cache, monkeypatch, name):
    from test_engine_trust import _plant

    from softcapgrad.engines.environments import environments

    asked = []
    monkeypatch.setattr(environments, "build_all", lambda names, jobs, say=None: asked.extend(names) or {})
    result = CliRunner().invoke(app, ["engines", "install", name, "--json"])
    assert result.exit_code == 0, result.output
    assert asked == ["train-peft"] and json.loads(result.output)["params"]["environments"] == ["train-peft"]
    here = _plant(cache / "softcapgrad" / "engines", "train-peft")
    result = CliRunner().invoke(app, ["engines", "remove", name])
    assert result.exit_code == 0 and "train-peft: removed" in result.output and not here.exists()


def test_a_former_spelling_is_read_as_the_engines_name_and_never_printed(cache):
    result = CliRunner().invoke(app, ["engines", "remove", "lit_gpt", "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["params"]["environments"] == ["litgpt"]
    result = CliRunner().invoke(app, ["parity", "--engine", "mlxlm"])
    assert result.exit_code == 2 and "engine mlx-lm: its environment mlx-lm is not installed" in result.output
    assert "mlxlm" not in result.output


def test_the_size_column_is_the_bytes_on_disk(cache):
    from test_engine_trust import _plant

    here = _plant(cache / "softcapgrad" / "engines", "train-fused")
    planted = sum(p.stat().st_size for p in here.rglob("*") if p.is_file())
    (here / "blob").write_bytes(b"\0" * (3 * 2 ** 20 - planted))  # the folder's files: 3 MiB exactly
    (here / "blob").chmod(0o644)
    rows = {r["environment"]: r for r in _listed()}
    assert rows["train-fused"]["state"] == "installed"
    assert rows["train-fused"]["size_bytes"] == 3 * 2 ** 20 and rows["train-fused"]["size"] == "3.0 MiB"
    assert rows["train-axolotl"]["size_bytes"] is None and rows["train-axolotl"]["size"] == "—"
    table = CliRunner().invoke(app, ["engines"], env={"COLUMNS": "200"}).output
    assert next(line for line in table.splitlines() if line.startswith("│") and "train-fused" in line).count(
        "3.0 MiB") == 1


def test_sizes_read_in_mib_below_a_gib_and_in_gib_above():
    from softcapgrad.cli.engines import size_text

    assert (size_text(0), size_text(2 ** 20 // 2), size_text(5 * 2 ** 30 // 2)) == ("—", "0.5 MiB", "2.5 GiB")
