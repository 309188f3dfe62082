"""The suite's two tiers (conftest): without --build-engines a live engine test whose environment is not built is
skipped, nothing is built, and the run's last line counts what was left out and names the command that runs it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

SUITE = '''
import pytest

@pytest.mark.engine_environments("transformers-4")
def test_live(engine_environment):
    assert engine_environment("transformers-4").state == "installed"

@pytest.mark.engine_environments("main")
def test_in_the_main_environment():
    pass
'''


def test_a_missing_environment_is_left_out_counted_and_not_built(tmp_path):
    suite, cache = tmp_path / "suite", tmp_path / "cache"
    suite.mkdir()
    shutil.copy(HERE / "conftest.py", suite / "conftest.py")
    (suite / "test_live.py").write_text(SUITE)
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-rs",
                           str(suite)], cwd=suite, env=env, capture_output=True, text=True, timeout=120)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 1 skipped" in lines[-2], lines
    assert lines[-1] == ("1 live engine test was left out (environments not built): make test-engines builds them, "
                         "two at a time, and runs them"), lines
    assert "(transformers-4): make test-engines" in done.stdout
    built = [p.name for p in (cache / "softcapgrad" / "engines").glob("*") if not p.name.endswith(".lock")]
    assert built == [], built
