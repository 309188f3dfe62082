"""The command line: JSON for every subcommand, bad input as one line and exit code 2."""

import subprocess
import sys

import pytest


def test_version(cli):
    code, _, out, _ = cli("--version")
    assert code == 0 and out.startswith("softcapgrad ")


def test_identity_json(cli):
    code, data, _, _ = cli("identity", "--points", "20000", "--at", "8", "--json")
    assert code == 0 and data["command"] == "identity"
    assert data["max_abs_error"] <= 1e-15
    assert [r["a_over_c"] for r in data["rows"]] == [1.0, 2.0, 4.0, 8.0]
    assert set(data) >= {"params", "rows", "notes", "closed_forms"}


def test_ratchet_json(cli):
    code, data, _, _ = cli("ratchet", "--cap", "30", "--cap", "50", "--level", "0.9", "--json")
    assert code == 0
    assert [(r["cap"], r["f"]) for r in data["rows"]] == [(30.0, 0.9), (50.0, 0.9)]
    assert data["rows"][1]["a"] == pytest.approx(50 / 30 * data["rows"][0]["a"])


def test_knee_json_row_fields(cli):
    code, data, _, _ = cli("knee", "--dtype", "bf16", "--cap", "30", "--json")
    assert code == 0
    (row,) = data["rows"]
    assert row["dtype"] == "bfloat16" and row["mantissa_bits"] == 7
    assert row["horizons"][0]["cap"] == 30.0
    assert row["horizons"][0]["horizon"] == pytest.approx(30 * row["knee_exact"])
    for key in ("knee_doc_formula", "knee_exact", "first_saturating_input"):
        assert isinstance(row[key], float)
    assert [b["backend"] for b in data["backends"]] == ["exact"]


def test_knee_all_backends_reports_torch_gaps(cli):
    code, data, _, _ = cli("knee", "--dtype", "fp8_e4m3fn", "--dtype", "fp32", "--backend", "all", "--json")
    assert code == 0
    torch_rows = {b["dtype"]: b for b in data["backends"] if b["backend"] == "torch"}
    assert not torch_rows["float8_e4m3fn"]["supported"] and torch_rows["float32"]["supported"]


def test_horizon_json(cli):
    code, data, _, _ = cli("horizon", "--json")
    assert code == 0
    rows = {r["cap"]: r for r in data["rows"]}
    assert set(rows) == {30.0, 50.0}
    assert rows[30.0]["probes"][0]["a"] == 120.0 and rows[30.0]["probes"][0]["grad_autograd"] == 0.0
    assert rows[50.0]["first_zero_grad_input"] > rows[50.0]["horizon"]
    assert data["approach"][-1]["grad_autograd"] == 0.0


def test_output_is_deterministic(cli):
    first = cli("knee", "--dtype", "all", "--cap", "30")[2]
    assert first == cli("knee", "--dtype", "all", "--cap", "30")[2]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["knee", "--cap", "0"], "--cap"),
        (["knee", "--cap", "-3"], "--cap"),
        (["knee", "--cap", "nan"], "--cap"),
        (["knee", "--cap", "inf"], "--cap"),
        (["knee", "--dtype", "fp7"], "known: bfloat16"),
        (["knee", "--backend", "jax"], "--backend"),
        (["identity", "--cap", "0"], "--cap"),
        (["identity", "--points", "0"], "--points"),
        (["identity", "--range", "3", "3"], "--range"),
        (["identity", "--range", "4", "-4"], "--range"),
        (["ratchet", "--level", "1"], "--level"),
        (["ratchet", "--level", "-0.5"], "--level"),
        (["ratchet", "--cap", "nan"], "--cap"),
        (["horizon", "--dtype", "fp4_e2m1fn"], "--dtype"),
        (["horizon", "--cap", "0"], "--cap"),
    ],
)
def test_bad_input_one_line_exit_2(cli, args, needle):
    code, _, out, err = cli(*args)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("softcapgrad: error:")


def test_module_entry_point_bad_input_has_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "softcapgrad", "knee", "--cap", "0"], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


FAST_INVOCATIONS = [
    ["identity", "--points", "2001"],
    ["ratchet"],
    ["knee", "--dtype", "bf16", "--cap", "30"],
    ["knee", "--dtype", "all", "--cap", "30", "--cap", "50"],
    ["horizon"],
    ["dynamics"],
    ["gate-demo", "--section", "cost", "--section", "competition"],
    ["tether-demo", "--section", "clamp", "--section", "anchors"],
]


@pytest.mark.parametrize("argv", FAST_INVOCATIONS, ids=lambda a: " ".join(a))
def test_every_command_leads_with_one_to_three_sentences(cli, argv):
    code, data, _, _ = cli(*argv, "--json")
    assert code == 0
    assert 1 <= len(data["answer"]) <= 3
    assert all(s.endswith(".") and s[0].isupper() for s in data["answer"])


@pytest.mark.parametrize("width", [80, 100])
@pytest.mark.parametrize("argv", FAST_INVOCATIONS, ids=lambda a: " ".join(a))
def test_tables_fit_without_cutting_a_number(cli, argv, width):
    """Rich cuts an over-wide cell to '…'; no table may need to, at 100 columns or 80 (there tables wrap text or fold)."""
    code, _, out, err = cli(*argv, env={"COLUMNS": str(width)})
    assert code == 0, err
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= width
    answer_line = out.splitlines()[0]
    assert answer_line[0].isupper() and not answer_line.startswith(("┏", "┌"))


@pytest.mark.parametrize("command, values", [
    ("knee", ["bfloat16", "float8_e4m3fn", "exact", "numpy", "torch", "sigmoid"]),
    ("gate-demo", ["competition", "backward", "laguna", "cost", "stability"]),
    ("tether-demo", ["collapse", "wd", "clamp", "floor", "anchors"]),
    ("dynamics", ["eager", "remedy"]),
])
def test_help_lists_the_accepted_values(cli, command, values):
    code, _, out, _ = cli(command, "--help")
    flat = " ".join(out.replace("│", " ").split())
    assert code == 0 and all(v in flat for v in values)


@pytest.mark.parametrize("argv, expected", [
    (["knee", "--dtype", "BF16", "--backend", "NumPy"], ("bfloat16", "numpy")),
    (["knee", "--dtype", "torch.bfloat16", "--fn", "TANH"], ("bfloat16", "exact")),
])
def test_choices_ignore_case_and_module_prefixes(cli, argv, expected):
    code, data, _, _ = cli(*argv, "--json")
    assert code == 0 and (data["rows"][0]["dtype"], data["backends"][-1]["backend"]) == expected


def test_a_near_miss_gets_a_suggestion(cli):
    code, _, _, err = cli("knee", "--backend", "nump")
    assert code == 2 and "did you mean 'numpy'?" in err


def test_parser_errors_are_one_line_too(cli):
    code, _, out, err = cli("dynamics", "--classes", "1.5")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == ["softcapgrad: error: dynamics: Invalid value for '--classes': "
                                        "'1.5' is not a valid int."]


@pytest.mark.parametrize("argv, option", [
    (["horizon", "--path", "eager-bf16", "--dtype", "fp16"], "--dtype"),
    (["horizon", "--sigmoid-scale", "3"], "--sigmoid-scale"),
    (["gate-demo", "--section", "competition", "--heads", "8"], "--heads"),
    (["gate-demo", "--section", "cost", "--seed", "3"], "--seed"),
    (["tether-demo", "--section", "floor", "--seed", "3"], "--seed"),
    (["knee", "--fn", "sigmoid", "--cap", "30"], "--cap"),
    (["reproduce", "--force"], "--force"),
    (["reproduce", "--only", "knee", "--figures"], "--figures"),
])
def test_options_a_run_would_ignore_are_refused(cli, argv, option):
    code, _, _, err = cli(*argv)
    assert code == 2 and f"{option} does not apply" in err


def test_an_interrupt_is_one_line_and_leaves_no_file(cli, tmp_path, monkeypatch):
    from softcapgrad.laws import attenuation

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(attenuation, "identity_report", interrupted)
    target = tmp_path / "figure.png"
    code, _, out, err = cli("identity", "--plot", str(target))
    assert code == 130 and out == "" and err.strip().splitlines() == [
        "softcapgrad: interrupted; no file was written or changed"]
    assert list(tmp_path.iterdir()) == []


def test_progress_reports_only_through_an_installed_reporter():
    from contextlib import contextmanager

    from softcapgrad.core import progress

    seen = []
    with progress.task("quiet", 3) as advance:  # nothing installed: a no-op
        advance(1)

    @contextmanager
    def reporter(description, total):
        seen.append((description, total))
        yield lambda n=1.0: seen.append(n)

    with progress.reporting(reporter), progress.task("scanning", 10) as advance:
        advance(4)
    assert seen == [("scanning", 10), 4]


def test_a_title_one_word_too_long_wraps_in_even_lines_not_to_a_lone_fragment(cli):
    """knee's pre-cap table title is 101 characters: at 100 columns it used to end on a line holding `0`."""
    from softcapgrad.core.report import title_lines

    code, data, _, _ = cli("knee", "--cap", "30", "--json")
    title = "pre-cap inputs: the horizon c·x_knee, and the first input whose gradient through the cap is exactly 0"
    assert code == 0 and len(title) == 101 and "horizon_rows" in data
    code, _, out, err = cli("knee", "--cap", "30", env={"COLUMNS": "100"})
    assert code == 0, err
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("pre-cap inputs"))
    shown = [lines[at].rstrip(), lines[at + 1].rstrip()]
    assert " ".join(shown) == title and min(map(len, shown)) >= 40
    for width in (40, 57, 100):  # as many lines as greedy wrapping needs, none longer than the width
        got = title_lines(title, width)
        assert " ".join(got) == title and max(map(len, got)) <= width and max(map(len, got)) - min(map(len, got)) < 20
