"""One computation in a second process while this one does another: ``wait = beside(fn); ...; wait()``.

The second process is a fork of this one, so it shares everything imported so far and needs no
arguments sent; what ``fn`` returns comes back pickled through a pipe, and an exception it raises is
raised again by ``wait()``. Fork before importing torch or jax: neither supports forking once its
thread pools run: once either is imported, or where fork is missing (not POSIX), ``fn`` simply runs
in ``wait()``. An interrupt
or error here ends the second process, which is always reaped.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from typing import Callable, TypeVar

from softcapgrad.core import progress

T = TypeVar("T")


def beside(fn: Callable[[], T]) -> Callable[[], T]:
    if not hasattr(os, "fork") or any(name in sys.modules for name in ("torch", "jax")):
        def here() -> T:
            return fn()

        here.abandon = lambda: None  # type: ignore[attr-defined]
        return here
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the second process: compute, send, leave without running the parent's exit handlers
        os.close(read)
        code = 0
        try:
            with progress.reporting(None):
                result = ("value", fn())
        except BaseException as err:  # noqa: BLE001 - sent back and raised in the parent
            result, code = ("error", err), 1
        try:
            payload = pickle.dumps(result)
        except Exception as err:  # noqa: BLE001 - an exception that cannot be pickled
            payload, code = pickle.dumps(("error", RuntimeError(f"{type(err).__name__}: {err}"))), 1
        with os.fdopen(write, "wb") as sink:
            sink.write(payload)
        os._exit(code)
    os.close(write)
    done = False

    def wait() -> T:
        nonlocal done
        try:
            with os.fdopen(read, "rb") as source:
                payload = source.read()
        finally:
            if not done:
                done = True
                _reap(pid, payload_read=True)
        kind, value = pickle.loads(payload)
        if kind == "error":
            raise value
        return value

    def _abandon() -> None:
        nonlocal done
        if not done:
            done = True
            os.close(read)
            _reap(pid, payload_read=False)

    wait.abandon = _abandon  # type: ignore[attr-defined]
    return wait


def _reap(pid: int, payload_read: bool) -> None:
    if not payload_read:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.waitpid(pid, 0)
