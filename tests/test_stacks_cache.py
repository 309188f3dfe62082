"""The dead-zone cache: a repeated scan of an eager CPU stack needs numpy alone and prints the same bytes; a
corrupt, foreign or mis-shaped cache file is ignored and rewritten, never executed; the key holds the CPU
capability and torch's version, so a cached answer is the one a measurement here would give."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from softcapgrad.laws import formats
from softcapgrad.stacks import cache, registry

# One scan through the real command line; after it, whether torch was imported (stderr's last line).
_SCAN = """
import sys
from softcapgrad.cli.app import app
try:
    app(["scan", *sys.argv[1:]])
except SystemExit as stop:
    assert stop.code in (0, None), stop.code
print("torch" in sys.modules, file=sys.stderr)
"""


def _scan(tmp_path, *args):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "COLUMNS": "100"}
    proc = subprocess.run([sys.executable, "-c", _SCAN, *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-800:]
    *said, imported = proc.stderr.strip().splitlines()
    return proc.stdout, imported == "True", said


def _files(tmp_path):
    return sorted((tmp_path / "cache" / "softcapgrad" / "stacks").glob("dead-zones-*.json"))


@pytest.mark.skipif(cache.key() is None, reason="this CPU's flags cannot be read: nothing is cached")
def test_a_second_scan_imports_no_torch_prints_the_same_bytes_and_survives_a_corrupt_cache(tmp_path):
    data = tmp_path / "v.npy"
    np.save(data, np.linspace(-200.0, 200.0, 4001, dtype=np.float32))
    args = (str(data), "--path", "torch-eager-cpu", "--path", "eager-fp16", "--path", "sigmoid-bf16")
    first, torch_first, _ = _scan(tmp_path, *args)
    assert torch_first  # measured: the eager stacks need torch
    [kept] = _files(tmp_path)
    again, torch_again, quiet = _scan(tmp_path, *args)
    assert again == first and not torch_again and not quiet
    planted = kept.read_text().replace('"above": 104.0', '"above": "__import__(\'os\').system(\'true\')"')
    impossible = kept.read_text().replace('"above": 104.0', '"above": -5.0')  # "a ≥ -5": every value dead
    assert planted != kept.read_text() != impossible
    for broken, why in (("{not json", "it is not JSON"),
                        (json.dumps({"format": cache.FORMAT, "key": {"other": 1}, "zones": {}}),
                         "it is not a cache of this format and key"),
                        (planted, "it holds an entry of another shape"),
                        (impossible, "a ≥ -5 is no dead zone")):
        kept.write_text(broken)
        out, measured, said = _scan(tmp_path, *args)
        assert out == first and measured  # ignored, measured again
        assert len(said) == 1 and said[0].startswith("softcapgrad: the dead-zone cache ") and why in said[0]
        assert json.loads(kept.read_text())["key"] == cache.key()  # and rewritten


def test_the_key_holds_the_cpu_capability_and_torchs_version(monkeypatch):
    cache.key.cache_clear()
    try:
        native = cache.key()
        if native is None:
            pytest.skip("this CPU's flags cannot be read")
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
        cache.key.cache_clear()
        scalar = cache.key()
        assert scalar["aten_cpu_capability"] == "default" and cache._file(scalar) != cache._file(native)
        from importlib import metadata

        assert native["versions"]["torch"] == metadata.version("torch")
    finally:
        monkeypatch.undo()
        cache.key.cache_clear()


def test_only_eager_cpu_stacks_are_kept():
    kept = {name for name, s in registry.STACKS.items() if cache.cacheable(s)}
    assert "torch-eager-cpu" in kept
    assert all(registry.STACKS[n].device == "cpu" and registry.STACKS[n].engine == "torch-eager" for n in kept)
    assert not {"torch-compile-cpu", "torch-eager-cuda", "jax-jit-cpu"} & kept


def test_an_entry_of_another_shape_is_refused():
    good = {"path": "p", "scores": "bfloat16", "cap": 30.0, "above": 104.0, "below": -104.0, "one_sided": False,
            "source": "measured", "reason": "r"}
    assert cache._valid(good)
    for bad in ({**good, "above": "104"}, {**good, "one_sided": 0}, {**good, "cap": True}, {**good, "extra": 1},
                {k: v for k, v in good.items() if k != "reason"}, {**good, "below": float("nan")}):
        assert not cache._valid(bad)


# --- values the law does not allow, and files someone else may have written -----------------------------


@pytest.fixture()
def measured(tmp_path, monkeypatch):
    """A cache of its own holding torch-eager-cpu's measured bf16 zone at c = 30; the file and the entry's name."""
    if cache.key() is None:
        pytest.skip("this CPU's flags cannot be read: nothing is cached")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "_said", set(), raising=False)
    registry.dead_zone.cache_clear()
    zone = registry.dead_zone("torch-eager-cpu", 30.0, "bfloat16")
    assert (zone.above, zone.below, zone.source) == (104.0, -104.0, "measured")
    [path] = _files(tmp_path)
    [name] = json.loads(path.read_text())["zones"]
    yield path, name
    registry.dead_zone.cache_clear()


def _edit(path, name, **fields):
    data = json.loads(path.read_text())
    data["zones"][name].update(fields)
    path.write_text(json.dumps(data))


def _scan_counts(tmp_path) -> tuple[int, float]:
    """The scan's dead count of 4,001 values from -200 to 200 (bf16 scores, c = 30), and the first zero it used."""
    from softcapgrad.files.scan import scan_report

    data = tmp_path / "v.npy"
    np.save(data, np.linspace(-200.0, 200.0, 4001, dtype=np.float32))
    registry.dead_zone.cache_clear()
    report = scan_report(data, 30.0, ["torch-eager-cpu"], None, scores="bfloat16")
    [row] = [t for t in report.tables if t.key == "dead"][0].rows
    return row["count"], row["first_zero_grad_input"]


# The law's count: each value rounded to bf16 as the model stores it, then |a| ≥ 104 (103.9 rounds to 104).
EXPECTED = int(np.sum(np.abs(np.linspace(-200.0, 200.0, 4001, dtype=np.float32).astype(formats.resolve("bf16"))
                             .astype(np.float64)) >= 104))


@pytest.mark.parametrize("fields, said", [
    ({"above": -5.0, "below": 5.0}, "a ≥ -5 is no dead zone (the law: a ≥ h or a ≤ −h with 0 < h ≤ 3.38953e+38, "
                                    "the largest bfloat16)"),
    ({"above": 1e39, "below": -1e39}, "a ≥ 1e+39 is no dead zone"),
    ({"below": 0.0}, "a ≤ 0 is no dead zone"),
    ({"above": 104.1, "below": -104.1}, "104.1 is not a bfloat16 value"),
    ({"above": 30.0, "below": -104.0}, "its one_sided flag contradicts its two sides"),
    ({"cap": 50.0}, "its stack, format or cap is not its name's"),
    ({"scores": "float16"}, "its stack, format or cap is not its name's"),
    ({"source": "recorded"}, "its source is 'recorded'; only measured zones are kept"),
    ({"reason": "two\nlines"}, "its reason is not one line of text"),
])
def test_an_entry_the_law_does_not_allow_is_ignored_said_and_measured_again(measured, tmp_path, caplog, fields,
                                                                             said):
    path, name = measured
    _edit(path, name, **fields)
    with caplog.at_level("WARNING", logger=cache.__name__):
        assert _scan_counts(tmp_path) == (EXPECTED, 104.0)  # not the planted zone's counts
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("softcapgrad: the dead-zone cache entry for torch-eager-cpu (bfloat16 scores, c = ")
    assert f" in {path} is ignored: {said}" in line and line.endswith("; measuring again") and "\n" not in line
    assert json.loads(path.read_text())["zones"][name]["above"] == 104.0  # measured again and replaced
    caplog.clear()
    assert _scan_counts(tmp_path) == (EXPECTED, 104.0) and not caplog.records  # the replaced entry is used quietly


def test_the_cache_is_read_only_where_no_one_else_may_have_written_it(measured, tmp_path, caplog, monkeypatch):
    path, name = measured
    _edit(path, name, above=200.0, below=-200.0)  # a possible zone, but not what was measured: used only if trusted
    path.chmod(0o646)
    with caplog.at_level("WARNING", logger=cache.__name__):
        assert _scan_counts(tmp_path) == (EXPECTED, 104.0)
    assert [r.getMessage() for r in caplog.records] == [
        f"softcapgrad: the dead-zone cache {path} is ignored: it is writable by others; measuring again"]
    assert path.stat().st_mode & 0o777 == 0o644  # rewritten by its owner, for its owner
    caplog.clear()
    _edit(path, name, above=200.0, below=-200.0)
    real = os.lstat

    def lstat(p, *args, **kwargs):  # the cache's folder reads as another user's (the tests run as root)
        info = real(p, *args, **kwargs)
        if os.fsdecode(p) == str(path.parent):
            return os.stat_result(list(info)[:4] + [4242] + list(info)[5:10])
        return info

    monkeypatch.setattr(os, "lstat", lstat)
    with caplog.at_level("WARNING", logger=cache.__name__):
        assert _scan_counts(tmp_path) == (EXPECTED, 104.0)
    assert [r.getMessage() for r in caplog.records] == [
        f"softcapgrad: the dead-zone cache {path} is ignored: its folder {path.parent} is owned by another user "
        f"(uid 4242); measuring again, and keeping nothing until {path.parent} is removed"]
    assert json.loads(path.read_text())["zones"][name]["above"] == 200.0  # nothing written into that folder


def test_the_cache_writes_for_its_owner_alone_whatever_the_umask(tmp_path, monkeypatch):
    if cache.key() is None:
        pytest.skip("this CPU's flags cannot be read: nothing is cached")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    good = {"path": "torch-eager-cpu", "scores": "bfloat16", "cap": 30.0, "above": 104.0, "below": -104.0,
            "one_sided": False, "source": "measured", "reason": "r"}
    name = cache.entry("torch-eager-cpu", "bfloat16", 30.0, (60.0, 15.0, 0.0))
    mask = os.umask(0o002)
    try:
        cache.store(name, good)
    finally:
        os.umask(mask)
    [path] = _files(tmp_path)
    assert (path.stat().st_mode & 0o777, path.parent.stat().st_mode & 0o777) == (0o644, 0o755)
    assert cache.lookup(name) == good
