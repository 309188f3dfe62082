"""Each format's storage bits come from its finfo: float64 is 64 bits, not the 6 a name prefix once gave it."""

import pytest

from softcapgrad.laws import formats


@pytest.mark.parametrize("name, bits", [("fp64", 64), ("fp32", 32), ("bf16", 16), ("fp16", 16), ("fp8_e4m3", 8),
                                        ("fp6_e2m3fn", 6), ("fp6_e3m2fn", 6), ("fp4_e2m1fn", 4)])
def test_bit_width_per_format(name, bits):
    assert formats.bit_width(formats.resolve(name)) == bits
