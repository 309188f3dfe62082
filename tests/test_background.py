"""core.background: a computation in a forked second process, its value or its error brought back."""

import subprocess
import sys

SCRIPT = r"""
import os, sys
from softcapgrad.core.background import beside

parent = os.getpid()
wait = beside(lambda: (os.getpid(), sum(range(10))))
pid, total = wait()
assert total == 45 and pid != parent, (pid, parent)

def fails():
    raise ValueError("from the second process")

wait = beside(fails)
try:
    wait()
except ValueError as err:
    assert "second process" in str(err)
else:
    raise AssertionError("the error was not raised again")

slow = beside(lambda: __import__("time").sleep(60))
slow.abandon()  # killed and reaped at once, not after a minute
print("ok")
"""


def test_value_error_and_abandon_across_the_fork():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_with_torch_imported_it_runs_in_this_process():
    code = "import os, torch\nfrom softcapgrad.core.background import beside\nprint(beside(os.getpid)() == os.getpid())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
