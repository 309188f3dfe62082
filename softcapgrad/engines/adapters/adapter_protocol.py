"""The adapter side of an engine run: arguments in, logits and a description out, one reason line on failure.

An adapter is a script run by its engine environment's own interpreter, in isolated mode, with the
child's temporary folder as its working folder. softcapgrad is not installed there: an adapter
imports the standard library, numpy, its engine's packages and this module only.

    python -I -c BOOTSTRAP ADAPTER WORK ROUTE VARIANT...

reads ``WORK/ids.npy`` (int64 token ids) and one transformers folder ``WORK/VARIANT`` per variant,
and writes ``WORK/out/ROUTE/VARIANT.npy`` ([tokens, vocab], logits or log-probabilities) and
``WORK/out/ROUTE/info.json``. A variant that fails is named with its reason under ``failed`` in
info.json and the others still run. Exit codes: 0 done (at least one variant), 3 the engine has no
such architecture, 1 every variant failed; on 1 and 3 the last line on stderr is ``reason: ...``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable

import numpy as np

NO_ARCHITECTURE = 3
FAILED = 1


class NoArchitecture(Exception):
    """The engine's own registry does not claim this model type (the message says which registry was read)."""


@dataclass
class Run:
    work: Path
    route: str
    variants: list[str]
    ids: np.ndarray  # int64 [tokens]
    did: str = ""  # one line: what ran, as the engine reports it
    precision: str = "fp32"
    output: str = "logits"  # or "logprobs"
    notes: list[str] = field(default_factory=list)
    packages: tuple[str, ...] = ()  # distributions whose versions info.json records

    def folder(self, variant: str) -> Path:
        return self.work / variant

    def config(self, variant: str) -> dict:
        return json.loads((self.folder(variant) / "config.json").read_text(encoding="utf-8"))

    def scratch(self, name: str) -> Path:
        """A folder of its own under the work folder, for converted files."""
        path = self.work / "scratch" / self.route / name
        path.mkdir(parents=True, exist_ok=True)
        return path


@contextlib.contextmanager
def captured_log(fds: tuple[int, ...] = (1, 2), echo: int = 2):
    """File descriptors ``fds`` into one file for the duration (an engine's native code logs there, not through
    Python's streams); echoed on ``echo`` after. Yields a list that holds the text once the block ends."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(fd) for fd in fds]
    with tempfile.TemporaryFile(mode="w+b") as log:
        for fd in fds:
            os.dup2(log.fileno(), fd)
        text: list[str] = []
        try:
            yield text
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip(fds, saved):
                os.dup2(copy, fd)
                os.close(copy)
            log.seek(0)
            data = log.read().decode("utf-8", "replace")
            os.write(echo, data.encode("utf-8", "replace"))
            text.append(data)


def versions(packages) -> dict:
    out = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def reason(text: str, code: int) -> int:
    print("reason: " + " ".join(str(text).split())[:400], file=sys.stderr)
    return code


def main(routes: dict[str, str], run_variant: Callable[[Run, str], np.ndarray], argv: list[str] | None = None) -> int:
    """Parse ``WORK ROUTE VARIANT...``, call ``run_variant(run, variant)`` for each variant, write the results.

    ``routes`` maps each route id to one line saying what it does; ``run_variant`` returns [tokens, vocab]
    and may set ``run.did``, ``run.precision``, ``run.output``, ``run.notes`` and ``run.packages``."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3:
        return reason("usage: WORK ROUTE VARIANT...", FAILED)
    work, route, variants = Path(argv[0]), argv[1], argv[2:]
    if route not in routes:
        return reason(f"unknown route {route!r}; this adapter has {', '.join(routes)}", FAILED)
    run = Run(work, route, variants, np.load(work / "ids.npy", allow_pickle=False).astype(np.int64).reshape(-1))
    out = work / "out" / route
    out.mkdir(parents=True, exist_ok=True)
    failed = {}
    for variant in variants:
        try:
            values = np.asarray(run_variant(run, variant))
            if values.ndim != 2 or values.shape[0] != run.ids.size:
                raise ValueError(f"the engine returned an array of shape {values.shape}, expected "
                                 f"[{run.ids.size}, vocabulary]")
            np.save(out / f"{variant}.npy", values.astype(np.float64), allow_pickle=False)
        except NoArchitecture as err:
            return reason(f"the engine has no such architecture: {err}", NO_ARCHITECTURE)
        except Exception as err:  # noqa: BLE001 -- any failure of the engine is the variant's reason
            traceback.print_exc(file=sys.stderr)
            failed[variant] = " ".join(f"{type(err).__name__}: {err}".split())[:400]
    if len(failed) == len(variants):
        return reason(failed[variants[0]], FAILED)
    info = {"route": route, "route_text": routes[route], "did": run.did, "precision": run.precision,
            "output": run.output, "notes": run.notes, "versions": versions(run.packages), "failed": failed}
    (out / "info.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0
