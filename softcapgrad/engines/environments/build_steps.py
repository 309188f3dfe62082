"""One step of an environment's build, and stopping every step under way at once.

A step is a child in a process group of its own (``python -m venv``, pip, a ``# then:`` script), its output read
line by line into progress lines; the group is killed however the step ends. Builds that run side by side run their
steps on worker threads, where no signal handler can be set: the main thread, interrupted (Ctrl-C, or SIGTERM through
``child.terminating``), calls ``stop_all``, which kills every step's group and makes each later step fail at once, so
that each build unwinds into its own clean-up (environments._build removes its temporary folder)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable

from softcapgrad.core import child

STEPS = child.Stoppable()  # the steps running now, on every build's thread


class BuildError(Exception):
    """An environment could not be built: the message is the failing step's last line."""


def run(command: list[str], cwd: Path, say: Callable[[str], None], what: str, total: int,
        scratch: Path | None = None) -> None:
    """Run one build step, one progress line per package pip reports; its last line is the error. ``scratch``: its
    TMPDIR, inside the build, so that a build stopped midway leaves none of pip's temporary folders behind."""
    if STEPS.stopped:
        raise BuildError(f"{what}: stopped")
    done, env = 0, None if scratch is None else {**os.environ, "TMPDIR": str(scratch)}
    with subprocess.Popen(command, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env,
                          stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True) as process:
        STEPS.started(process)
        tail = []
        try:
            for line in process.stdout:
                line = line.rstrip()
                if line:
                    tail = (tail + [line])[-20:]
                words = line.split()
                if words[:1] in (["Collecting"], ["Processing"], ["Found"]) and len(words) > 1:
                    done += 1
                    package = os.path.basename(words[1])  # "Processing" names a file: its name alone
                    say(f"{what}: {words[0].lower()} {package} ({done}/{total})" if total else f"{what}: {line}")
                elif line.startswith(("Installing collected packages", "Successfully", "Uninstalling")):
                    say(f"{what}: {line[:160]}")
            process.wait()
        finally:
            child.kill(process)  # its whole group (pip's build backends too), however the step ends
            STEPS.ended(process)
    if STEPS.stopped:
        raise BuildError(f"{what}: stopped")
    if process.returncode != 0:
        errors = [t for t in tail if t.startswith("ERROR")] or tail or [f"exit code {process.returncode}"]
        raise BuildError(f"{what}: {errors[-1][:300]}")


def stop_all() -> None:
    """Kill every step under way (its whole process group); every later step fails at once, until ``clear_stop``."""
    STEPS.stop_all()


def clear_stop() -> None:
    STEPS.clear()
