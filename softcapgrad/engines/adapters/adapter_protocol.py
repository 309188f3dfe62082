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

ROUTE may name several routes, comma-separated, that the adapter lets share one process (its ``PROCESSES``
literal), and WORK several work folders (one per model), joined by ``os.pathsep``: each folder in turn becomes
the working folder, and its routes run one after another on the variants it holds, each into its own
``out/ROUTE``. There a route that gives no logits writes ``out/ROUTE/reason.json`` (its exit code and reason) in
place of ``info.json``, and the process exits 0. Each route's ``cpu_s`` and ``wall_s`` are this process's own, the
first's counted from the start.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable

import numpy as np

NO_ARCHITECTURE = 3
FAILED = 1
START = time.monotonic()  # about when this process started: the first route's wall clock counts from here


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


def _seconds() -> tuple[float, float]:
    """This process's CPU seconds (with the children it waited for) since it started, and the wall clock."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system, time.monotonic()


def main(routes: dict[str, str], run_variant: Callable[[Run, str], np.ndarray], argv: list[str] | None = None) -> int:
    """Parse ``WORK[:WORK...] ROUTE[,ROUTE...] VARIANT...``, call ``run_variant(run, variant)`` for each work folder,
    route and variant, write the results.

    ``routes`` maps each route id to one line saying what it does; ``run_variant`` returns [tokens, vocab]
    and may set ``run.did``, ``run.precision``, ``run.output``, ``run.notes`` and ``run.packages``."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3:
        return reason("usage: WORK ROUTE VARIANT...", FAILED)
    works, asked, variants = [Path(w) for w in argv[0].split(os.pathsep)], argv[1].split(","), argv[2:]
    unknown = [r for r in asked if r not in routes]
    if unknown:
        return reason(f"unknown route {unknown[0]!r}; this adapter has {', '.join(routes)}", FAILED)
    if len(works) == 1 and len(asked) == 1:
        code, why = _route(Run(works[0], asked[0], variants, _ids(works[0])), routes, run_variant, (0.0, START))
        return code if why is None else reason(why, code)
    since = (0.0, START)
    for work in works:  # each model's folder in turn, as the working folder; the variants it holds
        os.chdir(work)
        held = [v for v in variants if (work / v).is_dir()]
        for route in asked:
            code, why = _route(Run(work, route, held, _ids(work)), routes, run_variant, since)
            spent = _seconds()
            if why is not None:
                traced = {"code": code, "reason": " ".join(str(why).split())[:400], "cpu_s": spent[0] - since[0],
                          "wall_s": spent[1] - since[1]}
                (work / "out" / route / "reason.json").write_text(json.dumps(traced, sort_keys=True) + "\n",
                                                                  encoding="utf-8")
            since = spent
    return 0


def _ids(work: Path) -> np.ndarray:
    return np.load(work / "ids.npy", allow_pickle=False).astype(np.int64).reshape(-1)


def _route(run: Run, routes: dict[str, str], run_variant, since: tuple[float, float]) -> tuple[int, str | None]:
    """One route's variants into ``out/ROUTE``: its exit code, and its reason where it gave no logits."""
    out = run.work / "out" / run.route
    out.mkdir(parents=True, exist_ok=True)
    failed = {}
    if not run.variants:
        return FAILED, f"no variant folder in {run.work}"
    for variant in run.variants:
        try:
            values = np.asarray(run_variant(run, variant))
            if values.ndim != 2 or values.shape[0] != run.ids.size:
                raise ValueError(f"the engine returned an array of shape {values.shape}, expected "
                                 f"[{run.ids.size}, vocabulary]")
            np.save(out / f"{variant}.npy", values.astype(np.float64), allow_pickle=False)
        except NoArchitecture as err:
            return NO_ARCHITECTURE, f"the engine has no such architecture: {err}"
        except Exception as err:  # noqa: BLE001 -- any failure of the engine is the variant's reason
            traceback.print_exc(file=sys.stderr)
            failed[variant] = " ".join(f"{type(err).__name__}: {err}".split())[:400]
    if len(failed) == len(run.variants):
        return FAILED, failed[run.variants[0]]
    cpu, wall = _seconds()
    info = {"route": run.route, "route_text": routes[run.route], "did": run.did, "precision": run.precision,
            "output": run.output, "notes": run.notes, "versions": versions(run.packages), "failed": failed,
            "cpu_s": cpu - since[0], "wall_s": wall - since[1]}
    (out / "info.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0, None
