"""The format registry and the switch search."""

import ml_dtypes
import numpy as np
import pytest

from softcapgrad.laws import formats


@pytest.mark.parametrize(
    "spelling, canonical",
    [("bf16", "bfloat16"), ("bfloat16", "bfloat16"), ("half", "float16"), ("fp16", "float16"),
     ("float32", "float32"), ("fp32", "float32"), ("fp64", "float64"), ("double", "float64"),
     ("fp8_e4m3fn", "float8_e4m3fn"), ("e5m2", "float8_e5m2"), ("float4_e2m1fn", "float4_e2m1fn"), ("BF16", "bfloat16")],
)
def test_spellings(spelling, canonical):
    assert formats.resolve(spelling).name == canonical


def test_unknown_format_lists_known():
    with pytest.raises(formats.UnknownFormat, match="known: bfloat16"):
        formats.resolve("fp7")


def test_all_expands_and_dedupes():
    names = [d.name for d in formats.resolve_many(["bf16", "all", "bfloat16"])]
    assert names[0] == "bfloat16" and len(names) == len(set(names)) == len(formats.FORMAT_NAMES)


@pytest.mark.parametrize("name", formats.FORMAT_NAMES)
def test_below_one_is_the_neighbour_of_one(name):
    dtype = formats.resolve(name)
    f = formats.facts(dtype)
    below = np.array([f.below_one], dtype=np.float64).astype(dtype)
    assert float(below[0]) == f.below_one < 1.0  # representable
    if dtype.itemsize <= 2:
        values = formats.positive_values(dtype).astype(np.float64)
        assert values[np.searchsorted(values, 1.0) - 1] == f.below_one


def test_subnormal_neighbour_formats_are_flagged():
    assert formats.facts(formats.resolve("float6_e2m3fn")).below_one_is_subnormal
    assert formats.facts(formats.resolve("float4_e2m1fn")).below_one_is_subnormal
    assert not formats.facts(formats.resolve("bf16")).below_one_is_subnormal


def test_positive_values_counts():
    # bf16: 2^15 patterns with sign 0, minus +0, minus inf and 127 NaN payloads... counted from finfo
    values = formats.positive_values(np.dtype(ml_dtypes.bfloat16)).astype(np.float64)
    assert values[0] == float(ml_dtypes.finfo(ml_dtypes.bfloat16).smallest_subnormal)
    assert values[-1] == float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    assert len(values) == 2**15 - 1 - 2**7  # sign-0 patterns, less +0 and the all-ones exponent (inf, NaN)
    assert np.all(np.diff(values) > 0)


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_bisection_matches_enumeration(name):
    dtype = formats.resolve(name)
    pred = lambda v: v.astype(np.float64) >= 3.3  # noqa: E731
    enumerated = formats.find_switch(dtype, pred, method="enumeration")
    bisected = formats.find_switch(dtype, pred, method="bisection")
    assert (bisected.first_true, bisected.last_false) == (enumerated.first_true, enumerated.last_false)
    assert (enumerated.method, bisected.method) == ("enumeration", "bisection")


def test_bisection_on_wide_format_finds_boundary_and_checks_window():
    found = formats.find_switch(np.dtype(np.float32), lambda v: v >= np.float32(2.5))
    assert found.first_true == 2.5 and found.last_false == float(np.nextafter(np.float32(2.5), np.float32(0)))
    assert found.method == "bisection" and found.monotone and found.checked == 2 * 4096 + 1


def test_non_monotone_predicate_is_reported():
    found = formats.find_switch(np.dtype(ml_dtypes.bfloat16), lambda v: (v.astype(np.float64) > 2) & (v.astype(np.float64) != 3))
    assert found.first_true > 2 and not found.monotone
