import json
import os
import tempfile

import pytest
from typer.testing import CliRunner

from softcapgrad.cli.app import app

# torch.compile caches the C++ it builds on disk; a graph compiled without an explicit vector width takes
# its ISA from ATEN_CPU_CAPABILITY, which the cache key does not hold. A suite run under one capability
# would otherwise load another's kernels (wrong gradients, or a build against the wrong precompiled
# header), so each capability gets a cache of its own.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(
    tempfile.gettempdir(), f"torchinductor-softcapgrad-{os.environ.get('ATEN_CPU_CAPABILITY') or 'native'}"))
# The suite's compiled graphs are small: inductor's pool of compile workers costs more to start on 2 cores than
# it saves (the stacks compile in-process for the same reason, stacks/runners.py), and make test's two workers
# would each start one. The same kernels are generated either way.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


@pytest.fixture(scope="session")
def cli():
    """Run the app in-process; return (exit code, parsed JSON or None, stdout, stderr). ``env`` holds variables
    set for the run alone (COLUMNS is read when the report is printed; a CliRunner's stdout is no terminal)."""
    runner = CliRunner()

    def run(*args: str, env: dict | None = None):
        result = runner.invoke(app, list(args), env=env)
        parsed = None
        if "--json" in args and result.exit_code in (0, 1, 4):  # 4: parity judged no cap, its JSON printed
            parsed = json.loads(result.stdout)
        return result.exit_code, parsed, result.stdout, result.stderr

    return run


# --- engine environments ------------------------------------------------------------------------
# A test that runs an engine from its own environment names it with @pytest.mark.engine_environments(NAME, ...).
# Two tiers. By default (make test) nothing is built: a test whose environments are all installed runs, any other
# is skipped with LEFT_OUT in its reason, and the run ends with one line counting them and naming the command that
# runs them. With --build-engines (make test-engines) every environment the selected tests name and this machine
# lacks is built once collection is done, in the background and environments.BUILDS_AT_ONCE at a time (two
# worker processes starting the same list wait on each other's locks, so the bound holds across them). The fixture
# ``engine_environment(NAME)`` returns the environment's State: as built, waited for, or refused in one line.
_BUILDS: dict = {}
LEFT_OUT = "live engine test: its environment is not built"
TIER_TWO = "make test-engines"
_LEFT_OUT: set = set()


def pytest_addoption(parser):
    parser.addoption("--build-engines", action="store_true",
                     help="build the engine environments the selected tests name (two at a time) and run their "
                          "tests; without it a test whose environments are not all installed is skipped")


def pytest_configure(config):
    config.addinivalue_line("markers", "engine_environments(*names): the engine environments the test runs in; "
                                       "built first with --build-engines, skipped without it unless installed")
    config.addinivalue_line("markers", "downloads: installs packages from the package indexes into a fresh virtual "
                                       "environment; runs only with --build-engines")


def _environments(item) -> list[str]:
    return [n for mark in item.iter_markers("engine_environments") for n in mark.args]


def pytest_collection_modifyitems(config, items):
    # Modules holding a slow test run first, each module's tests still together and in order: on two workers the
    # long tests then overlap each other instead of one of them running alone at the end.
    slow = {item.module for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.module not in slow)
    if config.getoption("--build-engines"):
        return
    for item in items:  # the network and minutes of installing: the engines tier's, whatever is built here
        if item.get_closest_marker("downloads") is not None:
            item.add_marker(pytest.mark.skip(reason=f"installs packages from the package indexes: {TIER_TWO}"))
    from softcapgrad.engines.environments import environments

    states: dict = {}
    for item in items:
        missing = [n for n in _environments(item) if n != environments.MAIN
                   and states.setdefault(n, environments.state(n).state) != "installed"]
        if missing:
            item.add_marker(pytest.mark.skip(reason=f"{LEFT_OUT} ({', '.join(missing)}): {TIER_TWO}"))


def pytest_collection_finish(session):
    names = [n for item in session.items for n in _environments(item)]
    if names and session.config.getoption("--build-engines") and not session.config.option.collectonly:
        from softcapgrad.engines.environments import environments

        _BUILDS.update(environments.start(names))


def pytest_runtest_logreport(report):
    """Counted where the reports arrive: in the one process, or in pytest-xdist's controller."""
    if report.skipped and LEFT_OUT in str(report.longrepr):
        _LEFT_OUT.add(report.nodeid)


def pytest_sessionfinish(session):
    for build in _BUILDS.values():  # finished, not left to the interpreter's exit
        build.exception()


def pytest_unconfigure(config):
    if _LEFT_OUT and not hasattr(config, "workerinput"):
        n = len(_LEFT_OUT)
        print(f"{n} live engine test{'s were' if n > 1 else ' was'} left out (environments not built): "
              f"{TIER_TWO} builds them, two at a time, and runs them")


@pytest.fixture(scope="session")
def engine_environment(request):
    from softcapgrad.engines.environments import environments

    build_them = request.config.getoption("--build-engines")

    def ready(name: str):
        build = _BUILDS.get(name)
        return build.result() if build is not None else environments.ready(name, build_them)

    return ready
