"""softcapgrad --help at 100 columns lists every command with its whole one-line summary, none cut short."""

import os
import subprocess
import sys

from softcapgrad.cli.app import COMMANDS


def test_help_lists_every_command_whole_at_100_columns():
    env = {**os.environ, "COLUMNS": "100"}
    done = subprocess.run([sys.executable, "-m", "softcapgrad", "--help"], capture_output=True, text=True, env=env,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    listed = done.stdout.split("Commands:\n", 1)[1].splitlines()
    assert not any(line.endswith("...") for line in listed)
    assert [line.split(None, 1) for line in listed if line.strip()] == [[name, summary]
                                                                        for name, *_, summary in COMMANDS]
    assert max(map(len, done.stdout.splitlines())) <= 100
