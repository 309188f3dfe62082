"""Answers agree with their own tables, and values a format cannot hold are refused, not computed.

A cap outside a format's normal numbers either rounds to 0 or inf or loses the digits of a/c; the
run that followed printed a horizon its own probe contradicted, a NaN gradient, or a/c = ∞, with
exit 0. Each must now be one line on stderr naming the format's range, exit 2.
"""

import re

import pytest


def _one_line_error(cli, *args) -> str:
    code, _, out, err = cli(*args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (code, out, err)
    return err


@pytest.mark.parametrize("args, fmt_range", [
    (("horizon", "--cap", "1e-45"), "bfloat16, whose normal numbers lie in [1.175e-38, 3.39e+38]"),
    (("horizon", "--cap", "1e-300"), "bfloat16, whose normal numbers lie in [1.175e-38, 3.39e+38]"),
    (("horizon", "--dtype", "fp16", "--cap", "1e5"), "float16, whose normal numbers lie in [6.104e-05, 6.55e+04]"),
    (("knee", "--cap", "1e-45"), "bfloat16, whose normal numbers lie in"),
    (("knee", "--dtype", "fp8_e3m4", "--cap", "30"), "float8_e3m4, whose normal numbers lie in [0.25, 15.5]"),
    (("dynamics", "--dtype", "fp16", "--cap", "70000"), "float16, whose normal numbers lie in"),
    (("identity", "--cap", "1e-320"), "float64, whose normal numbers lie in [2.225e-308, 1.798e+308]"),
    (("ratchet", "--cap", "1e308"), "must lie in [0, 4.731e+307]"),
    (("horizon", "--path", "torch-eager-cpu", "--cap", "1e39"), "must lie in [1.175e-38, 3.403e+38]"),
])
def test_a_cap_the_format_cannot_hold_is_refused_naming_the_range(cli, args, fmt_range):
    assert fmt_range in _one_line_error(cli, *args)


def test_caps_inside_the_range_still_answer(cli):
    code, data, _, _ = cli("ratchet", "--cap", "1e307", "--json")
    assert code == 0 and all(r["a"] < float("inf") for r in data["rows"])
    code, data, _, _ = cli("horizon", "--dtype", "fp64", "--cap", "1e-300", "--json")
    assert code == 0 and data["rows"][0]["first_zero_grad_input"] > 0
    code, _, _, _ = cli("knee", "--dtype", "all", "--cap", "30", "--json")  # under 'all' a horizon is a real number
    assert code == 0


@pytest.mark.slow
def test_horizon_all_paths_answer_spans_every_row_of_its_tables(cli):
    code, data, _, _ = cli("horizon", "--path", "all", "--cap", "30", "--cap", "50", "--json")
    assert code == 0
    for fmt, sentence in zip(("bfloat16", "float32"), data["answer"]):
        assert sentence.startswith(f"With {fmt} scores")
        for c in (30.0, 50.0):
            values = [r["first_zero_grad_input"] for r in data["rows"]
                      if r["scores"] == fmt and r["cap"] == c and r["first_zero_grad_input"] is not None]
            part = sentence.split(f"at c = {c:g} from ")[1].split(";")[0]
            lo, hi = float(part.split(" ")[2]), float(part.split(" to ")[1].split(" ")[0])
            assert (lo, hi) == (pytest.approx(min(values), rel=1e-7), pytest.approx(max(values), rel=1e-7))  # 8 digits


@pytest.mark.slow
def test_horizon_answer_counts_cells_without_a_figure_in_a_sentence(cli):
    code, data, _, _ = cli("horizon", "--path", "all", "--scores", "fp16", "--json")
    assert code == 0
    missing = sum(r["first_zero_grad_input"] is None for r in data["rows"])
    assert missing > 1
    assert data["answer"][-1] == f"{missing} cells of the table have no figure here (see the source column)."
    assert not any("is " + str(missing) in s for s in data["answer"])


def test_knee_states_the_sigmoid_gradient_law(cli):
    code, data, _, _ = cli("knee", "--fn", "sigmoid", "--dtype", "all", "--json")
    assert code == 0 and "y(1 − y)" in data["answer"][0] and "1 − y²" not in data["answer"][0]
    code, data, _, _ = cli("knee", "--dtype", "all", "--json")
    assert "1 − y²" in data["answer"][0]


def test_knee_sigmoid_plot_draws_the_sigmoid_knees(tmp_path):
    pytest.importorskip("matplotlib")
    from softcapgrad.laws import formats
    from softcapgrad.laws.knee import knee_report
    from softcapgrad.ledger import figures

    report = knee_report([formats.resolve("bf16"), formats.resolve("fp16")], [], ["exact"], ["sigmoid"])
    fig = figures.knee_figure(report)
    drawn = [list(c.get_offsets()[:, 1]) for c in fig.axes[0].collections]
    assert [r["knee_exact"] for r in report.tables[0].rows] in drawn
    assert "sigmoid" in fig.axes[0].get_ylabel()
