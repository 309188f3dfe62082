"""The engine child: isolated from the caller's folder, its process group killed on every way out, and every
failure (a crash, a hang, nothing written, a refusal) an outcome with its measured reason, never an exception."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from softcapgrad.engines.forward import runner

SCRIPT_HEAD = "import sys, time, json, os\nimport numpy as np\nimport adapter_protocol as protocol\n"


def _work(tmp_path: Path, name: str = "work", tokens: int = 5) -> Path:
    work = tmp_path / name
    work.mkdir()
    runner.write_ids(work, np.arange(tokens))
    (work / "capped").mkdir()
    return work


def _adapter(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "adapter.py"
    path.write_text(SCRIPT_HEAD + body, encoding="utf-8")
    return path


ECHO = """
def run_variant(run, variant):
    run.did = "numpy from " + np.__file__
    run.notes = [os.getcwd(), repr(sys.path), repr(sys.flags.isolated)]
    return np.zeros((run.ids.size, 7))

raise SystemExit(protocol.main({"default": "zeros"}, run_variant))
"""


def test_nothing_from_the_callers_folder_is_importable(tmp_path, monkeypatch):
    plant = tmp_path / "plant"
    (plant / "multiprocessing").mkdir(parents=True)
    marker = tmp_path / "MARKER"
    for module in (plant / "numpy.py", plant / "adapter_protocol.py", plant / "multiprocessing" / "__init__.py"):
        module.write_text(f"open({str(marker)!r}, 'a').write('ran')\n", encoding="utf-8")
    monkeypatch.chdir(plant)
    monkeypatch.setenv("PYTHONPATH", str(plant))
    monkeypatch.setenv("PYTHONSTARTUP", str(plant / "numpy.py"))
    work = _work(tmp_path)
    outcome = runner.run(sys.executable, _adapter(tmp_path, ECHO + "\nimport multiprocessing\n"), "default", work,
                         ["capped"], timeout=120)
    assert outcome.reason is None, outcome.reason
    assert not marker.exists()
    assert outcome.logits["capped"].shape == (5, 7)
    cwd, path, isolated = outcome.info["notes"]
    assert Path(cwd) == work and str(plant) not in path and isolated == "1"
    assert "plant" not in outcome.info["did"]


@pytest.mark.parametrize("body, reason", [
    ("raise SystemExit(protocol.reason('the converter said no', 1))", "the converter said no"),
    ("print('last words', file=sys.stderr); raise SystemExit(1)", "last words"),
    ("os.abort()", "crashed: signal SIGABRT"),
    ("raise SystemExit(0)", "the engine exited 0 but wrote no readable info.json"),
])
def test_a_failing_engine_is_a_reason(tmp_path, body, reason):
    outcome = runner.run(sys.executable, _adapter(tmp_path, body), "default", _work(tmp_path), ["capped"], 120)
    assert outcome.logits == {} and outcome.reason.startswith(reason)


def test_no_such_architecture_is_exit_3(tmp_path):
    body = ("def run_variant(run, variant):\n    raise protocol.NoArchitecture('registry X lists no gemma9')\n"
            "raise SystemExit(protocol.main({'default': 'x'}, run_variant))\n")
    outcome = runner.run(sys.executable, _adapter(tmp_path, body), "default", _work(tmp_path), ["capped"], 120)
    assert outcome.no_architecture and "registry X lists no gemma9" in outcome.reason


SOCKET = """
import socket, tempfile
def run_variant(run, variant):
    open("temporary", "w").write(tempfile.gettempdir())
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(os.path.join(tempfile.mkdtemp(prefix="pymp-"), "listener-" + "x" * 8))  # as a process pool names it
    listener.close()
    if run.route == "hang":
        time.sleep(600)
    return np.zeros((run.ids.size, 7))

raise SystemExit(protocol.main({"default": "a socket", "hang": "a socket, then a hang"}, run_variant))
"""


@pytest.mark.parametrize("route, timeout", [("default", 120), ("hang", 10)])
def test_a_deep_work_folder_leaves_the_child_room_for_its_sockets(tmp_path, route, timeout):
    """Engines name Unix sockets under their temporary folder (107 bytes at most): under a deep WORK the child gets
    a short folder of its own instead, removed once it ran, stopped or not."""
    deep = tmp_path / ("d" * 60) / ("e" * 40)
    deep.mkdir(parents=True)
    work = _work(deep)
    outcome = runner.run(sys.executable, _adapter(tmp_path, SOCKET), route, work, ["capped"], timeout)
    assert outcome.reason == (None if route == "default" else f"no answer in {timeout} s (stopped)"), outcome.reason
    used = (work / "temporary").read_text(encoding="utf-8")
    assert len(used) <= runner.SOCKET_ROOM and not Path(used).exists(), used


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def test_a_hanging_engine_and_what_it_started_are_killed(tmp_path):
    pidfile = tmp_path / "grandchild"
    body = (f"import subprocess\np = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            f"open({str(pidfile)!r}, 'w').write(str(p.pid))\ntime.sleep(600)\n")
    outcome = runner.run(sys.executable, _adapter(tmp_path, body), "default", _work(tmp_path), ["capped"], 3)
    assert outcome.reason == "no answer in 3 s (stopped)"
    time.sleep(0.5)
    assert not _alive(int(pidfile.read_text()))


@pytest.mark.parametrize("command", [["parity", "--engine", "transformers"],
                                     ["train-parity", "--engine", "transformers", "--model-type", "gemma2"]])
def test_sigterm_during_parity_kills_the_child_and_leaves_no_folder(tmp_path, command):
    """The parent gets SIGTERM while an engine (or a training route) runs: one line, exit 143, no child left, no
    temporary folder."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    parent = subprocess.Popen([sys.executable, "-m", "softcapgrad", *command,
                               "--seq-len", "12"], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child = None
    deadline = time.monotonic() + 240
    while child is None and time.monotonic() < deadline and parent.poll() is None:
        time.sleep(0.2)
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
                    if int(stat[1]) == parent.pid and b"-I" in (proc / "cmdline").read_bytes():
                        child = int(proc.name)
                except (OSError, IndexError, ValueError):
                    continue
    assert child is not None, parent.communicate()
    parent.send_signal(signal.SIGTERM)
    out, err = parent.communicate(timeout=60)
    assert parent.returncode == 143
    assert err.strip().splitlines() == [
        "softcapgrad: terminated; the engine's processes were stopped and the temporary folder removed"]
    assert not _alive(child)
    assert list(tmp.iterdir()) == []


def test_one_failing_variant_is_named_and_the_others_still_run(tmp_path):
    body = ("def run_variant(run, variant):\n"
            "    if variant == 'final-off':\n        raise RuntimeError('cannot convert a config without the cap')\n"
            "    return np.ones((run.ids.size, 3))\n"
            "raise SystemExit(protocol.main({'default': 'x'}, run_variant))\n")
    work = _work(tmp_path)
    (work / "final-off").mkdir()
    outcome = runner.run(sys.executable, _adapter(tmp_path, body), "default", work, ["capped", "final-off"], 120)
    assert outcome.reason is None and list(outcome.logits) == ["capped"]
    assert outcome.info["failed"] == {"final-off": "RuntimeError: cannot convert a config without the cap"}


def test_every_variant_failing_is_the_first_ones_reason(tmp_path):
    body = ("def run_variant(run, variant):\n    raise RuntimeError('no ' + variant)\n"
            "raise SystemExit(protocol.main({'default': 'x'}, run_variant))\n")
    work = _work(tmp_path)
    (work / "final-off").mkdir()
    outcome = runner.run(sys.executable, _adapter(tmp_path, body), "default", work, ["capped", "final-off"], 120)
    assert outcome.logits == {} and outcome.reason == "RuntimeError: no capped"


def test_each_childs_cpu_time_is_its_own_when_routes_run_side_by_side(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    def body(work: str) -> str:
        return ("def run_variant(run, variant):\n"
                f"    {work}\n    return np.zeros((run.ids.size, 2))\n"
                "raise SystemExit(protocol.main({'default': 'x'}, run_variant))\n")

    burn = "end = time.process_time() + 1.5\n    while time.process_time() < end: pass"
    jobs = []
    for name, work in (("burn", burn), ("sleep", "time.sleep(1.5)")):
        folder = tmp_path / name
        folder.mkdir()
        jobs.append((_adapter(folder, body(work)), _work(folder)))
    with ThreadPoolExecutor(2) as pool:
        burnt, slept = pool.map(lambda job: runner.run(sys.executable, job[0], "default", job[1], ["capped"], 120),
                                jobs)
    assert burnt.reason is None and slept.reason is None
    assert burnt.cpu_s >= 1.5 and slept.cpu_s < 1.0  # the sleeper's own CPU: its start-up, not the burner's loop


def test_a_reason_in_terminal_colours_is_plain_text(tmp_path):
    body = ("def run_variant(run, variant):\n    raise RuntimeError('\\x1b[96mThis is step 3/3\\x1b[0m of exporting')\n"
            "raise SystemExit(protocol.main({'default': 'x'}, run_variant))\n")
    work = _work(tmp_path)
    outcome = runner.run(sys.executable, _adapter(tmp_path, body), "default", work, ["capped"], 120)
    assert outcome.reason == "RuntimeError: This is step 3/3 of exporting"


# --- routes sharing one child ------------------------------------------------------------------------------------

SHARED = """
ROUTES = {"burn": "burns CPU", "none": "no such architecture", "crash": "kills itself", "pid": "says its process"}
PROCESSES = (("burn", "none", "crash", "pid"),)

def run_variant(run, variant):
    if run.route == "burn":
        end = time.process_time() + 1.0
        while time.process_time() < end:
            pass
    if run.route == "none":
        raise protocol.NoArchitecture("registry Y lists no gemma9")
    if run.route == "crash" and os.environ.get("CRASH_IN") in ("any", os.path.basename(os.getcwd())):
        os.kill(os.getpid(), 9)
    return np.full((run.ids.size, 3), float(os.getpid()))

raise SystemExit(protocol.main(ROUTES, run_variant))
"""


def _shared(script: Path, routes: list[str], tmp_path: Path) -> dict:
    item = (tmp_path / "w", _work(tmp_path, "inputs", 4), ["capped"])
    return runner.run_copied_batch(sys.executable, script, routes, [item], 120)[0]


def test_routes_in_one_child_each_get_their_own_outcome_and_time(tmp_path):
    """One child runs the routes one after another: each has its logits or its own reason (a route without the
    architecture does not stop the next), and their CPU seconds add up to the child's, the burner's the most."""
    script = _adapter(tmp_path, SHARED)
    done = _shared(script, ["burn", "none", "pid"], tmp_path)
    assert list(done) == ["burn", "none", "pid"]
    assert done["burn"].reason is None and done["pid"].reason is None
    assert done["none"].no_architecture and "registry Y lists no gemma9" in done["none"].reason
    pids = {float(done[r].logits["capped"][0, 0]) for r in ("burn", "pid")}
    assert len(pids) == 1  # one process ran both
    assert done["burn"].cpu_s >= 1.0 > done["pid"].cpu_s
    assert not (tmp_path / "w").exists()


def test_a_route_the_shared_child_did_not_finish_runs_again_alone(tmp_path, monkeypatch):
    """The child dies in the second of three routes: the first keeps its result; the second and third run again, each
    in a child of its own (where, in another folder, the second no longer crashes)."""
    monkeypatch.setenv("CRASH_IN", "w")
    monkeypatch.setattr(runner, "PASSED", runner.PASSED + ("CRASH_IN",))
    script = _adapter(tmp_path, SHARED)
    done = _shared(script, ["burn", "crash", "pid"], tmp_path)
    assert all(o.reason is None for o in done.values()), {r: o.reason for r, o in done.items()}
    pid = {r: float(o.logits["capped"][0, 0]) for r, o in done.items()}
    assert len(set(pid.values())) == 3  # the shared child, then one child for each route it left


def test_a_route_that_crashes_alone_too_is_a_crash(tmp_path, monkeypatch):
    monkeypatch.setenv("CRASH_IN", "any")
    monkeypatch.setattr(runner, "PASSED", runner.PASSED + ("CRASH_IN",))
    done = _shared(_adapter(tmp_path, SHARED), ["crash", "pid"], tmp_path)
    assert done["crash"].reason == "crashed: signal SIGKILL" and done["pid"].reason is None


def test_once_stopping_no_child_starts(tmp_path):
    runner.stop_all()
    try:
        done = _shared(_adapter(tmp_path, SHARED), ["pid"], tmp_path)
    finally:
        runner.clear_stop()
    assert done["pid"].reason == "stopped: the run is ending" and done["pid"].logits == {}


def test_the_routes_an_adapter_lets_share_a_process_and_the_rest_alone(tmp_path):
    from softcapgrad.engines.forward import catalog

    script = _adapter(tmp_path, SHARED.replace('PROCESSES = (("burn", "none", "crash", "pid"),)',
                                               'PROCESSES = (("burn", "pid"),)'))
    routes = tuple(catalog.Route(r, r) for r in ("none", "burn", "crash", "pid"))
    engine = catalog.Engine("planted", "main", script, routes, "planted")
    assert catalog.processes(engine) == [("none",), ("burn", "pid"), ("crash",)]
    mistral = catalog.engines()["mistral_rs"]  # its KV setting is read once per process: two children
    assert catalog.processes(mistral) == [("default", "rope-theta", "multimodal"), ("kv32", "multimodal-kv32")]


def test_one_child_runs_each_model_it_is_given_on_the_variants_each_holds(tmp_path):
    """Two models in one child: each model's folder is the working folder while it runs, each gets its own outcome
    on the variants it holds (the second has an 'uncapped' folder, the first not), and one process ran them all."""
    body = SHARED.replace("return np.full((run.ids.size, 3), float(os.getpid()))",
                          "run.notes = [os.getcwd()]\n    return np.full((run.ids.size, 3), float(os.getpid()))")
    script = _adapter(tmp_path, body)
    first, second = _work(tmp_path, "one", 4), _work(tmp_path, "two", 6)
    (second / "uncapped").mkdir()
    items = [(tmp_path / "w1", first, ["capped"]), (tmp_path / "w2", second, ["capped", "uncapped"])]
    done = runner.run_copied_batch(sys.executable, script, ["pid", "burn"], items, 120)
    assert [sorted(d) for d in done] == [["burn", "pid"], ["burn", "pid"]]
    assert sorted(done[0]["pid"].logits) == ["capped"] and sorted(done[1]["pid"].logits) == ["capped", "uncapped"]
    assert done[0]["pid"].logits["capped"].shape == (4, 3) and done[1]["burn"].logits["uncapped"].shape == (6, 3)
    assert [d["pid"].info["notes"] for d in done] == [[str(tmp_path / "w1")], [str(tmp_path / "w2")]]
    assert len({float(d[r].logits["capped"][0, 0]) for d in done for r in d}) == 1
    assert sum(d[r].cpu_s for d in done for r in d) >= 2.0  # the two burns, each counted once


def test_every_route_an_adapter_lets_share_a_process_is_one_of_its_routes():
    from softcapgrad.engines.forward import catalog

    for engine in catalog.engines().values():
        path = catalog._adapter_file(engine)
        routes = catalog._literal_routes(path)
        for group in catalog._literal(path, "PROCESSES") or ():
            assert set(group) <= set(routes), (engine.name, group)
        assert sum(len(g) for g in catalog.processes(engine)) == len(engine.routes)
