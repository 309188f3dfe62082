"""The scan against brute force: formats, file kinds, special values, one-sided zones, sampling, progress."""

import contextlib
import functools
import math

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.numpy import save_file as save_np
from safetensors.torch import save_file as save_pt

import recipes as paths
from softcapgrad.laws import formats
from softcapgrad.core import progress
from softcapgrad.files import scan, scantally, tensorfiles
from softcapgrad.core.checks import InputError

C = 30.0
BF16 = np.dtype(ml_dtypes.bfloat16)


@functools.cache
def _zone(name: str) -> scan.DeadZone:
    return {z.path: z for z in scan.dead_zones([name], C)}[name]


def _brute(values: np.ndarray, zone: scan.DeadZone) -> int:
    """Values whose torch conversion to the zone's scores format lies in the zone, one value at a time."""
    target = formats.torch_dtype(formats.resolve(zone.scores))
    x = torch.from_numpy(np.asarray(values, dtype=np.float64) if values.dtype.itemsize > 4 else values.astype(np.float32))
    scored = x.to(target).double().numpy()
    return int(np.count_nonzero((scored >= zone.first_zero) | (scored <= zone.first_zero_below)))


def _one(path, names=("eager-bf16",), **kw) -> scan.Scan:
    zones = scan.dead_zones(list(names), C)
    sources = scan.select(scan.open_sources(path, kw.get("stored_as")), kw.get("keys"), path)
    return scan.scan_sources(sources, C, zones)[0]


def _mixed(seed: int = 0, n: int = 20_000) -> np.ndarray:
    """Normal values, the bf16 rounding midpoints around the eager-bf16 horizon, ±inf and NaN."""
    a = np.random.default_rng(seed).normal(0, 60, n).astype(np.float32)
    edge = np.array([103.5, 103.75, 104.0, 104.25, 104.5], dtype=np.float32)  # 103.75: a tie that rounds to 104
    a[:20] = np.concatenate([edge, -edge, np.nextafter(edge, 0), [np.inf, -np.inf, np.nan, 0.0, -0.0]])
    return a


def test_sigmoid_dead_zone_is_one_sided_and_its_negative_end_searched():
    z = _zone("sigmoid-bf16")
    assert z.one_sided and 0 < z.first_zero < -z.first_zero_below
    recipe, fmt = paths.RECIPES["sigmoid-bf16"], formats.resolve("bf16")
    below = np.array([-z.first_zero_below], dtype=np.float64).astype(fmt)
    before = formats.neighbours_below(fmt, -z.first_zero_below, 1)[:1]  # the value just inside
    assert paths.gradient(recipe, -below, C)[0] == 0.0 and paths.gradient(recipe, -before, C)[0] != 0.0
    for name in ("eager-bf16", "fp32-upcast", "remedy"):
        zone = _zone(name)
        assert not zone.one_sided and zone.first_zero_below == -zone.first_zero


def test_a_real_stacks_zone_feeds_the_scan():
    from softcapgrad.stacks import registry as stacks

    zone = scan.from_stack(stacks.dead_zone("torch-eager-cpu", C, "bfloat16"))
    assert (zone.scores, zone.first_zero, zone.first_zero_below) == ("bfloat16", 104.0, -104.0)
    assert _one_from(np.array([103.5, 104.0, -200.0], np.float32), [zone]).beyond[0]["count"] == 2


def test_large_negative_values_live_for_the_sigmoid_dead_for_tanh(tmp_path):
    a = np.concatenate([np.full(1000, -500.0), np.full(10, 500.0)]).astype(np.float32)
    np.save(tmp_path / "neg.npy", a)
    s = _one(tmp_path / "neg.npy", ("sigmoid-bf16", "eager-bf16"))
    beyond = {b["path"]: b for b in s.beyond}
    assert beyond["sigmoid-bf16"]["count"] == 10 and beyond["sigmoid-bf16"]["below"] == 0
    assert beyond["eager-bf16"]["count"] == 1010
    past = [row for row in s.histogram if "sigmoid-bf16" in row["past"]]
    assert past and all(not row["a_over_c"].startswith("-") for row in past)


@pytest.mark.parametrize("kind", [".npy", ".safetensors", ".pt"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
def test_counts_against_brute_force_in_every_kind(kind, dtype, tmp_path, monkeypatch):
    monkeypatch.setattr(tensorfiles, "CHUNK", 4096)  # several chunks per tensor
    fmt = formats.resolve(dtype)
    with np.errstate(over="ignore"):
        a = _mixed().astype(fmt)
    path = tmp_path / f"t{kind}"
    if kind == ".npy":
        np.save(path, a)
    elif kind == ".safetensors":
        save_np({"x": a}, str(path)) if fmt.type.__module__ == "numpy" else save_pt({"x": torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)}, str(path))
    else:
        t = torch.from_numpy(a) if fmt.type.__module__ == "numpy" else torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        torch.save({"x": t}, path)
    names = ("eager-bf16", "eager-fp16", "fp32-upcast", "sigmoid-bf16")
    s = _one(path, names)
    wide = a.astype(np.float64)
    assert s.count == int(np.count_nonzero(~np.isnan(wide))) and s.nan_count == int(np.isnan(wide).sum())
    assert s.inf_count == int(np.isinf(wide).sum())
    assert s.max_abs == float(np.abs(wide[np.isfinite(wide)]).max())
    for b in s.beyond:
        assert b["count"] == _brute(a if fmt.itemsize > 2 else a.astype(np.float32), _zone(b["path"])), b


def test_fp8_counted_in_its_own_format(tmp_path):
    values = np.array([1.0, 2.0, 96.0, 104.0, 448.0, -448.0, -104.0, np.nan], dtype=np.float32)
    e4m3 = values.astype(ml_dtypes.float8_e4m3fn)
    torch.save({"w": torch.from_numpy(e4m3.view(np.uint8)).view(torch.float8_e4m3fn)}, tmp_path / "f8.pt")
    save_pt({"w": torch.from_numpy(e4m3.view(np.uint8)).view(torch.float8_e4m3fn)}, str(tmp_path / "f8.safetensors"))
    for path in (tmp_path / "f8.pt", tmp_path / "f8.safetensors"):
        s = _one(path)
        assert s.dtype == "float8_e4m3fn" and s.count == 7 and s.nan_count == 1
        assert s.beyond[0]["count"] == _brute(e4m3.astype(np.float32), _zone("eager-bf16")) == 4


def test_npy_of_ml_dtypes_big_endian_and_long_double(tmp_path):
    a = _mixed(1, 5000)
    np.save(tmp_path / "bf16.npy", a.astype(ml_dtypes.bfloat16))  # saved as void 'V2'
    np.save(tmp_path / "be.npy", a.astype(">f4"))
    np.save(tmp_path / "ld.npy", a.astype(np.longdouble))
    e4m3 = np.array([1.0, 240.0, -448.0], dtype=np.float32).astype(ml_dtypes.float8_e4m3fn)
    np.save(tmp_path / "f8.npy", e4m3)  # saved as void 'V1': the format must be named
    native = _one_from(a)
    assert _one(tmp_path / "bf16.npy").beyond[0]["count"] == _brute(a.astype(BF16).astype(np.float32), _zone("eager-bf16"))
    for name in ("be.npy", "ld.npy"):
        s = _one(tmp_path / name)
        assert (s.count, s.nan_count, s.inf_count, s.max_abs, s.beyond) == (native.count, native.nan_count, native.inf_count, native.max_abs, native.beyond)
    with pytest.raises(InputError, match="--stored-as"):
        _one(tmp_path / "f8.npy")
    assert _one(tmp_path / "f8.npy", stored_as="fp8_e4m3fn").beyond[0]["count"] == 2


def _one_from(a: np.ndarray, zones=None) -> scan.Scan:
    source = scan.Source("a", a.dtype.name, a.size, a.nbytes, lambda: [lambda: a])
    return scan.scan_sources([source], C, zones or [_zone("eager-bf16")])[0]


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta:UserWarning")
def test_sparse_tensors_count_their_implicit_zeros(tmp_path):
    dense = torch.zeros(60, 50)
    dense[::7, ::3] = torch.linspace(-300, 300, dense[::7, ::3].numel()).reshape(dense[::7, ::3].shape)
    torch.save({"coo": dense.to_sparse(), "csr": dense.to_sparse_csr(), "dense": dense}, tmp_path / "sp.pt")
    zones = scan.dead_zones(["eager-bf16"], C)
    got = {s.name: s for s in scan.scan_sources(scan.open_sources(tmp_path / "sp.pt"), C, zones)}
    for name in ("coo", "csr"):
        assert (got[name].count, got[name].max_abs, got[name].beyond) == (got["dense"].count, got["dense"].max_abs, got["dense"].beyond)
        assert got[name].histogram == got["dense"].histogram


def test_empty_and_all_nan_tensors_have_no_quantiles(tmp_path):
    save_np({"empty": np.zeros((0, 4), np.float32), "nan": np.full(10, np.nan, np.float32), "ok": np.ones(3, np.float32)},
            str(tmp_path / "e.safetensors"))
    zones = scan.dead_zones(["eager-bf16"], C)
    got = {s.name: s for s in scan.scan_sources(scan.open_sources(tmp_path / "e.safetensors"), C, zones)}
    for name in ("empty", "nan"):
        s = got[name]
        assert s.count == 0 and s.max_abs is None and s.attenuation_quantiles == []
        assert s.beyond[0]["fraction"] is None and all(row["fraction"] is None for row in s.histogram)
    assert got["nan"].nan_count == 10
    assert 1.0 < got["ok"].attenuation_quantiles[0]["abs_a"] <= 1 + 2.0**-8  # the upper end of 1.0's bin


def test_thousands_of_tensors_and_non_float_ones_skipped(tmp_path):
    rng = np.random.default_rng(2)
    tensors = {f"layer{i}.w": (rng.normal(0, 40, 16) + (120 if i % 500 == 0 else 0)).astype(np.float32) for i in range(3000)}
    tensors["steps"] = np.arange(3, dtype=np.int64)
    tensors["mask"] = np.ones(4, dtype=np.uint8)
    save_np(tensors, str(tmp_path / "many.safetensors"))
    report = scan.scan_report(tmp_path / "many.safetensors", C, ["eager-bf16"], None)
    rows = report.tables[0].rows
    assert len(rows) == 3000 and not {"steps", "mask"} & {r["name"] for r in rows}
    dead = [r for r in report.tables[1].rows if r["path"] == "eager-bf16"]
    assert len(dead) == 3000 and sum(r["count"] for r in dead) == sum(_brute(v, _zone("eager-bf16")) for v in tensors.values() if v.dtype.kind == "f")
    with pytest.raises(InputError, match="'mask' holds U8, not floating-point"):
        scan.scan_report(tmp_path / "many.safetensors", C, ["eager-bf16"], ["mask"])


def test_sampled_distribution_exact_counts(tmp_path, monkeypatch):
    monkeypatch.setattr(scantally, "SAMPLE_FROM", 1000)
    a = _mixed(3, 50_000)
    s = _one_from(a)
    assert s.sample_step == scantally.SAMPLE_STEPS[0]  # 50,000 values: the smallest step
    assert s.beyond[0]["count"] == _brute(a, _zone("eager-bf16"))
    finite = np.sort(np.abs(a[~np.isnan(a)].astype(np.float64)))
    median = [q for q in s.attenuation_quantiles if q["q"] == 0.5][0]["abs_a"]
    assert abs(median - finite[finite.size // 2]) < 0.03 * finite[finite.size // 2]  # every 7th of 50,000 values
    assert math.isclose(sum(row["fraction"] for row in s.histogram), 1.0)


def test_progress_reports_every_byte(tmp_path, monkeypatch):
    monkeypatch.setattr(scan, "PROGRESS_BYTES", 0)
    monkeypatch.setattr(tensorfiles, "CHUNK", 1000)
    np.save(tmp_path / "p.npy", np.ones(4500, np.float32))
    seen = []

    @contextlib.contextmanager
    def reporter(description, total):
        seen.append((description, total))
        yield lambda n=1.0: seen.append(n)

    with progress.reporting(reporter):
        scan.scan_report(tmp_path / "p.npy", C, ["eager-bf16"], None)
    assert seen[0] == ("scanning p.npy", 18_000) and sum(seen[1:]) == 18_000


def test_cli_stored_as_and_unreadable_formats(cli, tmp_path):
    np.save(tmp_path / "f8.npy", np.array([1.0, 300.0], np.float32).astype(ml_dtypes.float8_e5m2))
    code, data, _, _ = cli("scan", str(tmp_path / "f8.npy"), "--stored-as", "fp8_e5m2", "--json")
    assert code == 0 and [(r["path"], r["count"]) for r in data["dead"]] == [("torch-eager-cpu", 1)]
    for args, needle in (([str(tmp_path / "f8.npy")], "--stored-as"), ([str(tmp_path / "f8.npy"), "--stored-as", "bf16"], "2-byte")):
        code, _, _, err = cli("scan", *args)
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
