"""Engine environments that are not installed are built side by side, each once, and an installed one is not
touched: in the background (environments.start, what the suite's engine_environments mark relies on: conftest), and
for ``engines install`` and ``parity --install`` (environments.build_all; SIGTERM meanwhile: test_engine_trust)."""

from __future__ import annotations

import threading

import pytest

from softcapgrad.core.checks import InputError
from softcapgrad.engines.environments import environments as envs


@pytest.fixture()
def fake(monkeypatch):
    """Environments a, b, c, of which c is installed; a build waits until the others have started too."""
    built, started = [], threading.Barrier(2, timeout=10)

    def state(name, root=None, path=None):
        return envs.State(name, "installed" if name == "c" else "not installed", None, None, {}, 0, "")

    def install(name, root=None, say=lambda line: None, path=None):
        started.wait()  # a second build must start before the first ends: raises BrokenBarrierError otherwise
        built.append(name)
        if name == "b":
            raise InputError("engine environment b could not be installed: no wheel for it")
        return envs.State(name, "installed", None, None, {}, 0, "")

    monkeypatch.setattr(envs, "state", state)
    monkeypatch.setattr(envs, "install", install)
    return built


def test_the_missing_ones_build_at_the_same_time_each_once(fake):
    builds = envs.start(["a", "b", "c", "a", envs.MAIN])
    assert sorted(builds) == ["a", "b"]  # c is installed, main is never built, a is named twice
    assert builds["a"].result(timeout=20).state == "installed"
    with pytest.raises(InputError, match="no wheel"):  # a failed build is its one-line reason, for whoever waits
        builds["b"].result(timeout=20)
    assert sorted(fake) == ["a", "b"]


def test_nothing_to_build_starts_nothing(fake):
    assert envs.start(["c", envs.MAIN]) == {} and fake == []


def test_build_all_runs_builds_at_once_and_returns_each_outcome(fake):
    done = envs.build_all(["a", "b", "c", "a", envs.MAIN], jobs=2)
    assert sorted(done) == ["a", "b"] and done["a"].state == "installed"
    assert isinstance(done["b"], InputError) and "no wheel" in str(done["b"])  # the caller says every failure



def test_never_more_than_the_bound_build_at_once(monkeypatch):
    """Six missing environments, started in the background and built by build_all: at most BUILDS_AT_ONCE run at
    any moment, and with the bound raised to 6 they do all run together (so the count can see more than 2)."""
    running, most, lock = [0], [0], threading.Lock()
    names = [f"e{i}" for i in range(6)]

    def state(name, root=None, path=None):
        return envs.State(name, "not installed", None, None, {}, 0, "")

    def install(name, root=None, say=lambda line: None, path=None):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        threading.Event().wait(0.2)
        with lock:
            running[0] -= 1
        return envs.State(name, "installed", None, None, {}, 0, "")

    monkeypatch.setattr(envs, "state", state)
    monkeypatch.setattr(envs, "install", install)
    for builds in (lambda: [f.result(timeout=20) for f in envs.start(names).values()],
                   lambda: envs.build_all(names, jobs=16)):
        most[0] = 0
        builds()
        assert most[0] == envs.BUILDS_AT_ONCE
    monkeypatch.setattr(envs, "BUILDS_AT_ONCE", 6)
    most[0] = 0
    [f.result(timeout=20) for f in envs.start(names).values()]
    assert most[0] == 6
