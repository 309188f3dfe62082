"""Files a cache writes, writable by their owner alone whatever the umask: what its trust check later accepts."""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator

_MASK_LOCK = threading.Lock()
_MASK_HELD: list = [0, 0]  # how many blocks hold the owner-only mask, and the umask from before the first


@contextlib.contextmanager
def owner_writes_only() -> Iterator[None]:
    """Meanwhile files and folders are made (by this process and the children it starts) writable by their owner
    alone, whatever the umask: a cache that trusts only what no one else could have changed writes so. The umask is
    the process's: blocks that overlap on several threads (builds side by side) share one change, undone by the last
    to end."""
    with _MASK_LOCK:
        if _MASK_HELD[0] == 0:
            _MASK_HELD[1] = os.umask(0o022)
            os.umask(_MASK_HELD[1] | 0o022)
        _MASK_HELD[0] += 1
    try:
        yield
    finally:
        with _MASK_LOCK:
            _MASK_HELD[0] -= 1
            if _MASK_HELD[0] == 0:
                os.umask(_MASK_HELD[1])
