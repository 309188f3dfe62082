"""Generated invocations of every subcommand: an answer, a changed verdict or one line of error, quickly.

Each generated command line must end with exit code 0, 1 or 2; never a traceback; exactly one line
on stderr when it exits 2; and within a time bound. Values are drawn from what users mistype:
zero, negatives, NaN, infinities, numbers past a format's range or an integer type, words,
unwritable paths, files of the wrong kind. ``SOFTCAPGRAD_FUZZ_EXAMPLES`` raises the count for a
long local run; CI runs the default.
"""

from __future__ import annotations

import json
import os
import signal
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from softcapgrad.cli.app import app

EXAMPLES = int(os.environ.get("SOFTCAPGRAD_FUZZ_EXAMPLES", "12"))
LIMIT_S = 60  # seconds per invocation on a 2-core machine; the defaults take a few

NUMBERS = st.one_of(
    st.sampled_from(["0", "-0", "-1", "1", "2", "0.5", "30", "50", "120", "1e-3", "nan", "-nan", "inf", "-inf",
                     "1e308", "1e39", "1e-320", "1e999", "3.5", "abc", "", "1,5", "0x10",
                     # past a format's range: below bf16's and fp32's normals, past fp16's max, near float64's
                     "1e-45", "1e-300", "1e-39", "70000", "65504", "3.4e38", "1e307", "2.2e-308"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
INTEGERS = st.one_of(
    st.sampled_from(["0", "-1", "1", "2", "7", "48", "1024", "2147483648", str(2**63), str(2**70), "1.5", "x", ""]),
    st.integers(-(2**40), 2**40).map(str),
)
WORDS = st.sampled_from(["all", "ALL", "bf16", "BF16", "torch.bfloat16", "e4m3", "fp8_e4m3fn", "float4_e2m1fn", "fp64",
                         "half", "fp7", "tanh", "Sigmoid", "exact", "numpy", "torch", "jax", "eager", "remedy",
                         "competition", "cost", "wd", "anchors", "", "eager-bf16", "nonsense"])


STACK_NAMES = st.sampled_from(["torch-eager-cpu", "EAGER-BF16", "fp32-upcast", "sigmoid-bf16", "jax-jit-cpu",
                                "tanh-approx-cuda", "torch-eager-cuda", "fused-fp32", "nope", ""])


def _option(name: str, values) -> st.SearchStrategy[list[str]]:
    return values.map(lambda v: [name, v])


def _command(name: str, options: dict[str, st.SearchStrategy]) -> st.SearchStrategy[list[str]]:
    chosen = st.lists(st.sampled_from(sorted(options)), max_size=4)
    flags = st.lists(st.sampled_from(["--json", "--wide"]), max_size=2, unique=True)

    def build(keys: list[str], extra: list[str], draw_values: list[list[str]]) -> list[str]:
        return [*name.split(), *[part for pair in draw_values for part in pair], *extra]

    return chosen.flatmap(
        lambda keys: st.tuples(*[_option(k, options[k]) for k in keys]).flatmap(
            lambda pairs: flags.map(lambda extra: build(keys, extra, list(pairs)))
        )
    )


COMMANDS = {
    "identity": {"--cap": NUMBERS, "--points": INTEGERS, "--at": NUMBERS},
    "ratchet": {"--cap": NUMBERS, "--level": NUMBERS},
    "knee": {"--cap": NUMBERS, "--dtype": WORDS, "--backend": WORDS, "--fn": WORDS},
    "horizon": {"--cap": NUMBERS, "--dtype": WORDS, "--at": NUMBERS, "--sweep": INTEGERS},
    "dynamics": {"--a0": NUMBERS, "--cap": NUMBERS, "--lr": NUMBERS, "--threshold": NUMBERS, "--classes": INTEGERS,
                 "--correct": NUMBERS, "--max-steps": INTEGERS, "--dtype": WORDS, "--backward": WORDS},
    "gate-demo": {"--section": st.sampled_from(["cost", "stability", "competition", "COST", "nope"]),
                  "--seed": INTEGERS, "--tokens": INTEGERS, "--heads": INTEGERS, "--model-dim": INTEGERS,
                  "--kv-heads": INTEGERS, "--head-dim": INTEGERS},
    "tether-demo": {"--section": st.sampled_from(["clamp", "floor", "anchors", "Floor", "nope"]), "--seed": INTEGERS},
    "horizon --path": {"--path": STACK_NAMES, "--scores": WORDS, "--cap": NUMBERS, "--at": NUMBERS},
    "stacks": {"--record": st.sampled_from(["out.json", "a-file/out.json", "out.txt", ""])},
    "audit-model": {"--model-type": st.sampled_from(["gemma2", "llama", "LLAMA", "nope", ""]),
                    "--set": st.sampled_from(["final_logit_softcapping=30", "attn_logit_softcapping=-1", "x=1", "=",
                                              "num_hidden_layers=abc", "vocab_size=0", "hidden_size=100000000"]),
                    "--attn": st.sampled_from(["eager", "sdpa", "nope", "all"]), "--dtype": WORDS,
                    "--seq-len": INTEGERS, "--batch": INTEGERS, "--scale-logits": NUMBERS, "--seed": INTEGERS},
}


class _TookTooLong(Exception):
    pass


@contextmanager
def _time_limit(seconds: int):
    def stop(signum, frame):
        raise _TookTooLong(f"over {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


LOG = os.environ.get("SOFTCAPGRAD_FUZZ_LOG")  # a long local run: one JSON line per invocation, to count exit codes


def _log(argv: list[str], code: int, note: str = "") -> None:
    if LOG:
        with open(LOG, "a", encoding="utf-8") as f:
            f.write(json.dumps({"argv": argv, "code": code, "note": note}) + "\n")


def check_invocation(runner, argv: list[str]) -> None:
    with _time_limit(LIMIT_S):
        result = runner.invoke(app, argv)
    _log(argv, result.exit_code, "" if result.exit_code in (0, 1, 2) else result.stderr[-300:])
    assert not isinstance(result.exception, _TookTooLong), f"{argv} ran over {LIMIT_S} s"
    assert result.exit_code in (0, 1, 2), (argv, result.exit_code, result.stderr[-2000:])
    if result.exit_code in (0, 1):  # an answer: never empty, never a bare NaN where a number belongs
        assert result.stdout.strip(), (argv, "exit 0 with no output")
        if "--json" not in argv:
            assert not result.stdout.lstrip().startswith(("┏", "┌", "•")), (argv, "no answer before the tables")
            cells = [c.strip() for line in result.stdout.splitlines() if "│" in line for c in line.split("│")]
            assert "NaN" not in cells, (argv, "a NaN where a number belongs")
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, argv
    if result.exit_code == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("softcapgrad: error:"), (argv, result.stderr)
        assert result.stdout == "", argv
    elif "--json" in argv:
        assert not list(_nans(json.loads(result.stdout))), (argv, list(_nans(json.loads(result.stdout))))


def _nans(value, where="$"):
    """Paths in a JSON document that hold a NaN (as the renderer writes it, the string "nan")."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _nans(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _nans(v, f"{where}[{i}]")
    elif value == "nan" or (isinstance(value, float) and value != value):
        yield where


FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                derandomize="SOFTCAPGRAD_FUZZ_EXAMPLES" not in os.environ,  # CI: the same examples every run
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_generated_invocations(command, runner):
    @FUZZ
    @given(_command(command, COMMANDS[command]))
    def run(argv):
        check_invocation(runner, argv)

    run()


@FUZZ
@given(st.sampled_from(sorted(COMMANDS)), st.sampled_from(["--nope", "--cap=", "--json=1", "extra-arg", "--dtype"]))
def test_parser_errors_are_one_line(runner, command, bad):
    check_invocation(runner, [command, bad])


@pytest.fixture(scope="module")
def runner():
    from typer.testing import CliRunner

    return CliRunner()


@pytest.fixture(scope="module")
def odd_files(tmp_path_factory):
    """Files a user might hand to scan by mistake, or that stress its reader."""
    import ml_dtypes
    import torch

    d = tmp_path_factory.mktemp("odd")
    rng = np.random.default_rng(0)
    files = {}

    def put(name, array):
        np.save(d / name, array)
        files[name] = d / name

    put("plain.npy", (rng.standard_normal(1000) * 80).astype(np.float32))
    put("inf.npy", np.array([np.inf, -np.inf, 1.0, 200.0], dtype=np.float32))
    put("empty.npy", np.zeros(0, dtype=np.float32))
    put("allnan.npy", np.full(10, np.nan, dtype=np.float32))
    put("bf16.npy", (rng.standard_normal(100) * 80).astype(ml_dtypes.bfloat16))
    put("fp8.npy", (rng.standard_normal(100) * 8).astype(ml_dtypes.float8_e4m3fn))
    put("bigendian.npy", (rng.standard_normal(100) * 80).astype(">f4"))
    put("longdouble.npy", (rng.standard_normal(100) * 80).astype(np.longdouble))
    put("ints.npy", np.arange(10))
    put("complex.npy", np.ones(4, dtype=np.complex64))
    torch.save({"s": torch.eye(3).to_sparse()}, d / "sparse.pt")
    files["sparse.pt"] = d / "sparse.pt"
    torch.save({f"t{i}": torch.full((2,), float(i)) for i in range(2000)}, d / "many.pt")
    files["many.pt"] = d / "many.pt"
    w = torch.linspace(-300, 300, 4096).reshape(64, 64)
    for name, t in {"transposed.pt": w.t(), "strided.pt": w.reshape(-1)[::7], "permuted.pt": w.reshape(8, 8, 64).permute(2, 0, 1),
                    "param.pt": torch.nn.Parameter(w.clone()), "bf16-strided.pt": w.to(torch.bfloat16)[:, ::3]}.items():
        torch.save({"x": t}, d / name)
        files[name] = d / name
    (d / "notes.txt").write_text("hello")
    files["notes.txt"] = d / "notes.txt"
    (d / "broken.npy").write_bytes(b"\x93NUMPY garbage")
    files["broken.npy"] = d / "broken.npy"
    files["folder"] = d
    files["missing.npy"] = d / "missing.npy"
    return files


@FUZZ
@given(name=st.sampled_from(["plain.npy", "inf.npy", "empty.npy", "allnan.npy", "bf16.npy", "fp8.npy", "bigendian.npy",
                             "longdouble.npy", "ints.npy", "complex.npy", "sparse.pt", "many.pt", "notes.txt",
                             "broken.npy", "folder", "missing.npy", "transposed.pt", "strided.pt", "permuted.pt",
                             "param.pt", "bf16-strided.pt"]),
       cap=NUMBERS, json=st.booleans())
def test_scan_of_odd_files(runner, odd_files, name, cap, json):
    check_invocation(runner, ["scan", str(odd_files[name]), "--cap", cap, *(["--json"] if json else [])])


@pytest.mark.parametrize("argv", [
    ["identity", "--points", "20000", "--plot", "a-file/x.png"],
    ["identity", "--points", "20000", "--plot", "figure.jpg"],
    ["identity", "--points", "20000", "--plot", "."],
    ["reproduce", "--out", "a-file/results", "--only", "^attenuation"],
    ["reproduce", "--out", "a-file", "--only", "^attenuation"],
    ["reproduce", "--only", "(", "--out", "unused"],
])
def test_unwritable_outputs_fail_before_computing(runner, argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("not a folder")
    result = runner.invoke(app, argv)
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"], "nothing was written"


@pytest.mark.parametrize("argv", [
    ["dynamics", "--a0", "0", "--classes", "1.5"],  # typer's own click raised past the one-line handler
    ["dynamics", "--correct", "710"],  # e^710 overflowed; the run is already converged
    ["dynamics", "--threshold", "1e-20"],  # unreachable under the cap: refused, not 100,000 steps
    ["horizon", "--at", "3.4028235677973366e+38"],  # past bf16's largest value: a cast overflow
    ["horizon", "--cap", "8.507058919493342e+37"],  # the default probe 4c past bf16's largest value
    ["identity", "--points", "2001", "--at", "400"],  # sech² underflowed, 1/sech² overflowed
    ["gate-demo", "--section", "stability", "--json"],  # the naive sigmoid's ∞/∞ left a bare NaN
    ["dynamics", "--lr", "5e-324"],  # lr·p·sech² underflowed: the step count divided by 0
    ["dynamics", "--lr", "2.2250738585072014e-308"],  # and overflowed just above it
    ["dynamics", "--a0", "10000", "--lr", "1e-20"],  # sech²(333)·1e-20·1e-3 underflows as well
], ids=lambda argv: " ".join(argv))
def test_invocations_that_once_failed(runner, argv):
    check_invocation(runner, argv)


@pytest.mark.parametrize("name, cap", [("inf.npy", "1"), ("plain.npy", "1e-320"), ("allnan.npy", "30"),
                                       ("bf16.npy", "30"), ("sparse.pt", "30"), ("longdouble.npy", "30")])
def test_scans_that_once_failed(runner, odd_files, name, cap):
    check_invocation(runner, ["scan", str(odd_files[name]), "--cap", cap, "--json"])


# --- the shell around the command: pipes, COLUMNS, umask, in a child process --------------------------------

FAST = [["ratchet"], ["knee", "--dtype", "all"], ["knee", "--fn", "sigmoid"], ["horizon", "--cap", "30"],
        ["stacks"], ["identity", "--points", "2001"], ["ratchet", "--json"], ["knee", "--dtype", "bf16", "--cap", "1e-45"]]
COLUMNS = st.sampled_from(["0", "-1", "abc", "", "1", "39", "40", "80", "100", "1000", None])
PLUMBING = st.sampled_from(["pipe", "reader-leaves", "closed-stdout"])


def _child(argv: list[str], columns: str | None, mask: int, plumbing: str, plot: str | None):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = columns
    argv = [*argv, *(["--plot", plot] if plot else [])]

    # the umask and the closed descriptor are set by a shell: a preexec_fn would run this process's fork
    # handlers (jax warns in them) in the child
    import shlex

    line = f"umask {mask:03o} && exec {shlex.join([sys.executable, '-m', 'softcapgrad', *argv])}"
    child = subprocess.Popen(["/bin/sh", "-c", line + (" >&-" if plumbing == "closed-stdout" else "")], env=env,
                             stdout=None if plumbing == "closed-stdout" else subprocess.PIPE, stderr=subprocess.PIPE)
    if plumbing == "reader-leaves":
        first = child.stdout.readline()
        child.stdout.close()
        out = first
    else:
        out = child.stdout.read() if child.stdout else b""
        if child.stdout:
            child.stdout.close()
    err = child.stderr.read().decode()
    child.stderr.close()
    return child.wait(timeout=LIMIT_S * 2), out.decode(), err


@FUZZ
@given(argv=st.sampled_from(FAST), columns=COLUMNS, mask=st.sampled_from([0o022, 0o077, 0o002, 0o027]),
       plumbing=PLUMBING, plot=st.booleans())
def test_generated_plumbing(tmp_path_factory, argv, columns, mask, plumbing, plot):
    import stat

    png = None
    if plot and argv[0] in ("ratchet", "knee", "horizon", "identity") and "--json" not in argv:
        png = str(tmp_path_factory.mktemp("plot") / "f.png")
    code, out, err = _child(argv, columns, mask, plumbing, png)
    _log([f"COLUMNS={columns}", f"umask={mask:o}", plumbing, *argv, *(["--plot", "f.png"] if png else [])], code,
         err[-300:] if code not in (0, 2, 141) else "")
    if plumbing == "closed-stdout":
        assert code == 2 and "standard output is closed" in err and len(err.strip().splitlines()) == 1, (argv, code, err)
        return
    if "1e-45" in argv:
        assert code == 2 and "bfloat16, whose normal numbers lie in" in err, (argv, code, err)
        return
    assert code in ((0, 141) if plumbing == "reader-leaves" else (0,)), (argv, columns, plumbing, code, err)
    assert "Traceback" not in err and (err == "" or plumbing != "reader-leaves"), err
    assert out.strip(), (argv, columns, "exit 0 with no output")
    if png and plumbing == "pipe":
        assert stat.S_IMODE(os.stat(png).st_mode) == 0o666 & ~mask
    if plumbing == "pipe" and "--json" not in argv:
        width = int(columns) if columns and columns.isdigit() and int(columns) > 0 else 100
        assert max(len(line) for line in out.splitlines()) <= max(40, width), (argv, columns)
        assert "…" not in out


# --- every numeric option at its bound and past it, read from the app itself --------------------------------------
#
# Each numeric option of every subcommand carries a Bound (softcapgrad.cli.limits) as its callback, checked as the
# parser reads the value. The options come from the app's own click parameters, so a new numeric option without a
# Bound fails test_every_numeric_option_has_a_bound. A legal value at a bound can mean a long run (--points at its
# most, --steps and --seeds at theirs), so each drawn value is followed by one path of the same command that no file
# system takes: the parser reads the values in the order given, so an exit 2 that names the path proves the drawn
# value passed its check and that nothing ran. The numpy-only commands also run for real with the legal values.

import math

from cliparams import kind as _kind, label as _label, params as _params
from softcapgrad.cli.limits import Bound, path_given

BOUND_LIMIT_S = 10  # one invocation that the parser refuses, or a numpy-only command at one bound


def _given(param, value: str) -> list[str]:
    """The command-line words that give ``param`` the ``value`` (each of a pair such as --range LO HI)."""
    return [*([] if param.param_type_name == "argument" else [param.opts[0]]), *[value] * max(param.nargs, 1)]


NUMERIC = _params("int") + _params("float")
PATHS = _params("path")
CHEAP = {("ratchet",), ("knee",), ("dynamics",)}  # numpy alone: a run at any legal value takes well under a second


def test_every_numeric_option_has_a_bound():
    assert len(NUMERIC) >= 30, [(w, p.name) for w, p in NUMERIC]  # the app's options were found
    missing = [f"{' '.join(w)} {p.opts[0]}" for w, p in NUMERIC if not isinstance(_bound(p), Bound)]
    assert not missing, f"numeric options without a Bound: {missing}"
    unread = [f"{' '.join(w)} {_label(p)}" for w, p in PATHS if getattr(p.type, "func", None) is not path_given]
    assert not unread, f"path options not read through path_given: {unread}"


def _bound(param) -> Bound | None:
    return getattr(param.callback, "__wrapped__", None)


def test_every_numeric_option_is_listed_with_its_bound_in_the_docs():
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "commands.md").read_text(encoding="utf-8")
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]) for line in text.splitlines() if line.startswith("| `")}
    missing = [f"{' '.join(w)} {p.opts[0]}" for w, p in NUMERIC if (f"`{' '.join(w)}`", f"`{p.opts[0]}`") not in rows]
    assert not missing, f"docs/commands.md lists no bound for {missing}"


def _edges(bound: Bound, integer: bool) -> list[str]:
    """The values at each end of ``bound`` and just past it, and what no number option takes."""
    if integer:
        lo, hi = int(bound.lo), int(bound.hi)
        values = [lo, hi, lo - 1, hi + 1, 0, -1, 2**63, -(2**70)]
        return [str(v) for v in values] + ["1.5", "abc", ""]
    values = [bound.lo, bound.hi, math.nextafter(bound.lo, -math.inf), math.nextafter(bound.hi, math.inf), 0.0, -1.0,
              5e-324, -5e-324, 1e308, -1e308]
    return [repr(v) for v in values] + ["nan", "-nan", "inf", "-inf", "1e999", "1,5", "abc", ""]


def _inside(bound: Bound, text: str, integer: bool) -> bool | None:
    """Whether ``text`` is a number inside ``bound`` (None: not a number of the option's type at all)."""
    try:
        v = int(text) if integer else float(text)
    except ValueError:
        return None
    if not integer and not math.isfinite(v):
        return False
    return (v > bound.lo if bound.lo_open else v >= bound.lo) and (v < bound.hi if bound.hi_open else v <= bound.hi)


def _poison(words):
    """A path parameter of the command, and a name of it that no file system takes (a NUL byte)."""
    found = [p for w, p in PATHS if w == words]
    assert found, f"{' '.join(words)} takes no path: its numeric options need another invalid companion here"
    return found[0], "no\0name"


def _bound_case(runner, words, param, value: str, real: bool) -> None:
    bound, integer = _bound(param), _kind(param) == "int"
    inside = _inside(bound, value, integer)
    poison, bad = _poison(words)
    argv = [*words, *_given(param, value)]
    if not (real and inside):
        argv += _given(poison, bad)
    with _time_limit(BOUND_LIMIT_S):
        result = runner.invoke(app, argv)
    lines = result.stderr.strip().splitlines()
    assert not isinstance(result.exception, _TookTooLong), f"{argv} ran over {BOUND_LIMIT_S} s"
    assert "Traceback" not in result.stderr and result.exit_code in (0, 2), (argv, result.exit_code, result.stderr)
    if real and inside:
        check_invocation(runner, argv)
        return
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("softcapgrad: error:"), (argv, lines)
    named = _label(poison) if inside else _label(param)
    assert named in lines[0], (argv, f"expected the error to name {named}", lines[0])


@pytest.mark.parametrize("words, param", NUMERIC, ids=lambda x: " ".join(x) if isinstance(x, tuple) else x.opts[0])
def test_each_numeric_option_at_its_bounds_and_past_them(runner, words, param):
    for value in _edges(_bound(param), _kind(param) == "int"):
        _bound_case(runner, words, param, value, real=False)
        if words in CHEAP:
            _bound_case(runner, words, param, value, real=True)


def _near(bound: Bound, integer: bool) -> st.SearchStrategy[str]:
    """Numbers near either end of ``bound``, any number at all, and the edges themselves."""
    if integer:
        lo, hi = int(bound.lo), int(bound.hi)
        return st.one_of(st.integers(lo - 3, lo + 3), st.integers(hi - 3, hi + 3), st.integers()).map(str)
    return st.one_of(st.floats(), st.sampled_from(_edges(bound, False)),
                     st.floats(bound.lo, bound.hi).map(repr),
                     st.sampled_from([bound.lo, bound.hi]).map(lambda v: repr(v * (1 + 2**-40)))
                     )


@settings(max_examples=int(os.environ.get("SOFTCAPGRAD_FUZZ_EXAMPLES", "150")), deadline=None, database=None,
          derandomize="SOFTCAPGRAD_FUZZ_EXAMPLES" not in os.environ,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data(), case=st.sampled_from(NUMERIC))
def test_generated_values_near_the_bounds(runner, data, case):
    words, param = case
    value = data.draw(_near(_bound(param), _kind(param) == "int"))
    _bound_case(runner, words, param, value, real=False)
