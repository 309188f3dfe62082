"""The one way a figure is drawn and written, for every layer that draws one beside its report.

matplotlib is an optional extra (``pip install 'softcapgrad[plot]'``), imported only inside these
functions, with the non-interactive Agg backend. Every figure is 8 × 4.5 inches at 100 dpi
(800 × 450 px) and is saved without a timestamp or software tag, so regenerating it leaves the
bytes unchanged.
"""

from __future__ import annotations

from pathlib import Path

from softcapgrad.core.checks import InputError
from softcapgrad.core.files import write_atomic

SIZE = (8.0, 4.5)
DPI = 100


def pyplot():
    """matplotlib.pyplot on the Agg backend, with the house's font sizes; one line naming the extra if absent."""
    try:
        import matplotlib
    except ImportError:
        raise InputError("--plot needs matplotlib: pip install 'softcapgrad[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.titlesize": 9, "figure.titlesize": 10})
    return plt


def png_bytes(fig) -> bytes:
    """A PNG with fixed metadata (no software tag, no time); the figure is closed."""
    import io

    plt = pyplot()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def save(fig, path: Path) -> Path:
    """Write the figure atomically: an interrupt leaves the old file or none, never a partial PNG."""
    write_atomic(path, png_bytes(fig))
    return path
