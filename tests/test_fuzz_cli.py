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
