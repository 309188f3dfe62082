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
