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
        if "--json" in args and result.exit_code in (0, 1):
            parsed = json.loads(result.stdout)
        return result.exit_code, parsed, result.stdout, result.stderr

    return run


# --- engine environments ------------------------------------------------------------------------
# A test that runs an engine from its own environment names it with @pytest.mark.engine_environments(NAME, ...).
# Once collection is done, every such environment the selected tests need and this machine lacks starts building,
# all side by side and in the background (environments.start): the builds overlap each other and the tests that
# run before theirs. The fixture ``engine_environment(NAME)`` waits for its build (or builds it then, for an
# environment no mark named) and returns its State; a failed build fails each test that waits on it, with the
# build's own one-line reason. The end of the run waits for a build still under way.
_BUILDS: dict = {}


def pytest_configure(config):
    config.addinivalue_line("markers", "engine_environments(*names): the engine environments the test runs in, "
                                       "built side by side once collection is done")


def pytest_collection_finish(session):
    names = [n for item in session.items for mark in item.iter_markers("engine_environments") for n in mark.args]
    if names and not session.config.option.collectonly:
        from softcapgrad.engines import environments

        _BUILDS.update(environments.start(names))


def pytest_sessionfinish(session):
    for build in _BUILDS.values():  # finished, not left to the interpreter's exit
        build.exception()


@pytest.fixture(scope="session")
def engine_environment():
    from softcapgrad.engines import environments

    def ready(name: str):
        build = _BUILDS.get(name)
        return build.result() if build is not None else environments.ready(name, True)

    return ready
