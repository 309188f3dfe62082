import json

import pytest
from typer.testing import CliRunner

from softcapgrad.cli.app import app


@pytest.fixture(scope="session")
def cli():
    """Run the app in-process; return (exit code, parsed JSON or None, stdout, stderr)."""
    runner = CliRunner()

    def run(*args: str):
        result = runner.invoke(app, list(args))
        parsed = None
        if "--json" in args and result.exit_code in (0, 1):
            parsed = json.loads(result.stdout)
        return result.exit_code, parsed, result.stdout, result.stderr

    return run
