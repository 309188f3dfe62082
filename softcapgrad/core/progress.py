"""Progress of long computations, reported without printing from the computing modules.

A module wraps its long loop in ``with progress.task("what", total) as advance:`` and calls
``advance(n)``. By default nothing is shown; the command line installs a reporter (rich, on
stderr, only for a terminal and never under ``--json``) with :func:`reporting`.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Callable, Iterator

Advance = Callable[[float], None]
Reporter = Callable[[str, "float | None"], "contextlib.AbstractContextManager[Advance]"]

_reporter: ContextVar[Reporter | None] = ContextVar("softcapgrad_progress", default=None)


@contextlib.contextmanager
def task(description: str, total: float | None = None) -> Iterator[Advance]:
    reporter = _reporter.get()
    if reporter is None:
        yield lambda n=1.0: None
        return
    with reporter(description, total) as advance:
        yield advance


@contextlib.contextmanager
def reporting(reporter: Reporter) -> Iterator[None]:
    token = _reporter.set(reporter)
    try:
        yield
    finally:
        _reporter.reset(token)
