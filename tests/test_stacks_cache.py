"""The dead-zone cache: a repeated scan of an eager CPU stack needs numpy alone and prints the same bytes; a
corrupt, foreign or mis-shaped cache file is ignored and rewritten, never executed; the key holds the CPU
capability and torch's version, so a cached answer is the one a measurement here would give."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

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
    return proc.stdout, proc.stderr.strip().splitlines()[-1] == "True"


def _files(tmp_path):
    return sorted((tmp_path / "cache" / "softcapgrad" / "stacks").glob("dead-zones-*.json"))


@pytest.mark.skipif(cache.key() is None, reason="this CPU's flags cannot be read: nothing is cached")
def test_a_second_scan_imports_no_torch_prints_the_same_bytes_and_survives_a_corrupt_cache(tmp_path):
    data = tmp_path / "v.npy"
    np.save(data, np.linspace(-200.0, 200.0, 4001, dtype=np.float32))
    args = (str(data), "--path", "torch-eager-cpu", "--path", "eager-fp16", "--path", "sigmoid-bf16")
    first, torch_first = _scan(tmp_path, *args)
    assert torch_first  # measured: the eager stacks need torch
    [kept] = _files(tmp_path)
    again, torch_again = _scan(tmp_path, *args)
    assert again == first and not torch_again
    planted = kept.read_text().replace('"above": 104.0', '"above": "__import__(\'os\').system(\'true\')"')
    assert planted != kept.read_text()
    for broken in ("{not json", json.dumps({"format": cache.FORMAT, "key": {"other": 1}, "zones": {}}),
                   planted):
        kept.write_text(broken)
        out, measured = _scan(tmp_path, *args)
        assert out == first and measured  # ignored, measured again
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
