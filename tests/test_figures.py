"""Figures: valid PNGs of the stated size, drawn from exactly the report's data."""

import struct

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("matplotlib")

from softcapgrad.laws import formats  # noqa: E402
from softcapgrad.ledger import figures  # noqa: E402
from softcapgrad.laws.attenuation import identity_report, ratchet_report  # noqa: E402
from softcapgrad.laws.horizon import horizon_report  # noqa: E402
from softcapgrad.laws.knee import knee_report  # noqa: E402
from softcapgrad.laws.dynamics import Setting, dynamics_report  # noqa: E402
from softcapgrad.demos.gates import Config, Shape, gate_demo_report  # noqa: E402
from softcapgrad.demos.tether_demo import tether_demo_report  # noqa: E402


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def _rows(report, key):
    return next(t.rows for t in report.tables if t.key == key)


def _save(fig, tmp_path, name):
    path = figures.save(fig, tmp_path / name)
    assert _png_size(path) == (800, 450)
    return path


def test_attenuation_figure(tmp_path):
    report = identity_report(30.0, 100, -1.0, 1.0, [1.0], curve=True)
    fig = figures.attenuation_figure(report)
    exact, asym = fig.axes[0].lines[:2]
    curve = _rows(report, "curve")
    assert list(exact.get_ydata()) == [r["attenuation"] for r in curve]
    assert list(asym.get_ydata()) == [r["asymptote"] for r in curve]
    marks = [line.get_xdata()[0] for line in fig.axes[0].lines[2:]]
    assert marks == [r["a_over_c"] for r in _rows(report, "horizons")]
    _save(fig, tmp_path, "a.png")


def test_knee_figure(tmp_path):
    report = knee_report([formats.resolve("bf16"), formats.resolve("fp16")], [], ["exact", "numpy"], ["tanh"])
    fig = figures.knee_figure(report)
    exact = fig.axes[0].collections[2].get_offsets()[:, 1]
    assert list(exact) == [r["knee_exact"] for r in report.tables[0].rows]
    _save(fig, tmp_path, "k.png")


def test_horizon_figure(tmp_path):
    report = horizon_report([30.0], np.dtype(ml_dtypes.bfloat16), None, 2, curve=True)
    fig = figures.horizon_figure(report)
    curve = _rows(report, "curve")
    exact, staircase, zeros = fig.axes[0].lines
    assert list(exact.get_ydata()) == [r["grad_exact"] for r in curve]
    assert list(staircase.get_ydata()) == [r["grad_autograd"] for r in curve if r["grad_autograd"] > 0]
    assert list(zeros.get_xdata()) == [r["a"] for r in curve if r["grad_autograd"] == 0]
    _save(fig, tmp_path, "h.png")


def test_ratchet_figure(tmp_path):
    report = ratchet_report([30.0], [0.9, 0.99], curve=True)
    fig = figures.ratchet_figure(report)
    curve = _rows(report, "curve")
    assert list(fig.axes[0].lines[0].get_ydata()) == [r["a"] for r in curve]
    assert list(fig.axes[1].lines[0].get_ydata()) == [r["gradient"] for r in curve]
    _save(fig, tmp_path, "r.png")


def test_dynamics_figure_shades_stalled_region(tmp_path):
    report = dynamics_report(40.0, Setting(cap=30.0), np.dtype(ml_dtypes.bfloat16), [20.0, 60.0, 110.0, 120.0])
    fig = figures.dynamics_figure([report])
    sweep = _rows(report, "sweep")
    line = fig.axes[0].lines[0]
    assert list(line.get_ydata()) == [r["ratio"] for r in sweep if r["status"] == "converged"]
    (span,) = fig.axes[0].patches
    assert (span.get_x(), span.get_x() + span.get_width()) == (110.0, 120.0)
    _save(fig, tmp_path, "d.png")


def test_gates_figure(tmp_path):
    report = gate_demo_report(["competition"], 0, Shape(), Config(), [48], [16])
    fig = figures.gates_figure(report)
    rows = report.tables[0].rows
    heights = [bar.get_height() for bar in fig.axes[0].patches]
    assert heights == [r["softmax"] for r in rows] + [r["softmax_after"] for r in rows]
    _save(fig, tmp_path, "g.png")


def test_tether_figure(tmp_path):
    report = tether_demo_report(["collapse", "wd"], 0, curve=True)
    fig = figures.tether_figure(report)
    curve = _rows(report, "collapse_curve")
    assert list(fig.axes[0].lines[1].get_ydata()) == [r["tether_mean_gate"] for r in curve]
    _save(fig, tmp_path, "t.png")


def test_figures_are_deterministic(tmp_path):
    report = ratchet_report([30.0], [0.9], curve=True)
    a = figures.save(figures.ratchet_figure(report), tmp_path / "1.png").read_bytes()
    b = figures.save(figures.ratchet_figure(report), tmp_path / "2.png").read_bytes()
    assert a == b and b"Software" not in a


def test_plot_option_and_missing_extra(cli, tmp_path, monkeypatch):
    code, _, _, _ = cli("ratchet", "--plot", str(tmp_path / "r.png"))
    assert code == 0 and _png_size(tmp_path / "r.png") == (800, 450)
    code, _, _, err = cli("ratchet", "--plot", str(tmp_path / "r.svg"))
    assert code == 2 and ".png" in err

    def missing():
        raise figures.InputError("--plot needs matplotlib: pip install 'softcapgrad[plot]'")

    monkeypatch.setattr(figures, "pyplot", missing)
    code, _, _, err = cli("knee", "--plot", str(tmp_path / "k.png"))
    assert code == 2 and "pip install 'softcapgrad[plot]'" in err and len(err.strip().splitlines()) == 1


def test_parity_figure_grows_with_its_matrix_and_names_every_verdict_drawn():
    from softcapgrad.engines.forward.figure import CELL, parity_figure

    verdicts = ["applied", "ignored", "ignores the folder's caps", "no such architecture"]
    rows = [{"engine": f"e{i}", "route": "default", "model": f"m{j}", "cap": cap, "verdict": verdicts[(i + j) % 4],
             "error": 0.5 if (i + j) % 4 < 3 else None, "hint": ""}
            for i in range(40) for j in range(13) for cap in ("attention", "final")]
    fig = parity_figure(rows)
    width, height = fig.get_size_inches()
    assert width >= CELL[0] * 26 and height >= CELL[1] * 40  # 26 columns (13 types x 2 caps), 40 engine rows
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == verdicts
    assert sum(1 for t in fig.axes[0].texts if t.get_text() == "0.5") == 3 * 40 * 13 * 2 // 4
