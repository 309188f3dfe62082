"""What every option may hold, checked as the parser reads it, before any work.

Each numeric option carries a :class:`Bound` as its callback: the range no run can leave (what the
machine, a format or a loop's time allows); a command narrows it further where the range depends
on another option (a cap in a format). Each path option and argument is read through
:func:`path_given`, so a name the operating system would refuse is one line, never a traceback.
``tests/test_fuzz_cli.py`` finds both on every option of the app and draws values at and past them.
"""

import math
from dataclasses import dataclass
from pathlib import Path

import typer

from softcapgrad.core.checks import FP32_NORMAL_RANGE, InputError, usable_path

FP64_MAX = 1.7976931348623157e308
FP32_NORMAL, FP32_MAX = FP32_NORMAL_RANGE
SEED_MAX = 2**63 - 1  # torch and numpy generators take seeds in [0, 2^63)


@dataclass(frozen=True)
class Bound:
    """lo ≤ value ≤ hi (an open end with ``lo_open`` / ``hi_open``), for an int or a float option, each value
    of a repeatable one too; ``why`` says where the range comes from."""

    lo: float
    hi: float
    why: str
    lo_open: bool = False
    hi_open: bool = False

    def __call__(self, ctx: typer.Context, param: typer.CallbackParam, value):
        option = param.opts[0] if param.opts else param.name
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is not None:
                self.check(option, v)
        return value

    def check(self, option: str, v) -> None:
        above = v > self.lo if self.lo_open else v >= self.lo
        below = v < self.hi if self.hi_open else v <= self.hi
        if (isinstance(v, int) or math.isfinite(v)) and above and below:
            return
        if isinstance(v, int):
            raise InputError(f"{option} {v}: must lie in {self.lo:,}..{self.hi:,}: {self.why}")
        shown = f"{'(' if self.lo_open else '['}{self.lo:.4g}, {self.hi:.4g}{')' if self.hi_open else ']'}"
        raise InputError(f"{option} {v:g}: {self.why}, so it must lie in {shown}")


CAP = Bound(0.0, FP64_MAX, "a cap is a finite float64 > 0 (each command narrows it to its formats' normal range)",
            lo_open=True)
FINITE = Bound(-FP64_MAX, FP64_MAX, "a finite float64")
SEED = Bound(0, SEED_MAX, "torch and numpy generators take seeds below 2^63")


def path_given(value) -> Path:
    """A path option's parser: the name as a Path, or one line when the operating system would refuse it."""
    try:
        return usable_path("", str(value) if isinstance(value, Path) else value)
    except InputError as err:
        raise typer.BadParameter(str(err)) from None


NOTHING = "none"  # --out none: write nothing, for every command with --out


def out_folder(ctx: typer.Context, param: typer.CallbackParam, value: Path | None) -> Path | None:
    """Every --out's callback, after :func:`path_given`: ``none`` (any case) means write nothing, as no --out
    does; a folder of that name is given by its full path."""
    return None if value is not None and str(value).lower() == NOTHING else value
