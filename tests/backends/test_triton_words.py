"""Pairs of float32 values kept as one 64-bit word per lane (``columns.pack`` / ``unpack`` /
``words``): the staged rows of the horizontal adjoints and the moments' planes store and load
them that way. Bit for bit, special values included, and at the float positions the layout names:
word ``l`` of a block holds floats ``2 l`` (low half) and ``2 l + 1``."""

import pytest
import torch
import triton
import triton.language as tl

from conftest import device_for
from splatloss.backends.triton.columns import pack, unpack, words

pytestmark = pytest.mark.triton
DEV = device_for("triton")


@triton.jit
def _round_trip(src, blk, out, BW: tl.constexpr):
    ar = tl.arange(0, BW)
    a = tl.load(src + ar)
    b = tl.load(src + BW + ar)
    w = words(blk + ar, BW)
    tl.store(w, pack(a, b))
    lo, hi = unpack(tl.load(w))
    tl.store(out + ar, lo)
    tl.store(out + BW + ar, hi)


def _specials(bw: int) -> torch.Tensor:
    v = torch.randn(2 * bw, generator=torch.Generator().manual_seed(3))
    bits = v.view(torch.int32)
    bits[0] = 0x7FC00123  # a quiet NaN with a payload
    bits[1] = -0x00400001  # a negative NaN (sign bit set)
    v[2] = -0.0
    v[3] = float("inf")
    v[bw] = float("-inf")
    v[bw + 1] = 1e-42  # subnormal
    v[bw + 2] = -1e-45
    v[bw + 3] = torch.finfo(torch.float32).max
    return v


def test_pairs_round_trip_bit_for_bit_at_the_named_floats():
    bw = 32
    src = _specials(bw).to(DEV)
    blk = torch.zeros(2 * bw, dtype=torch.float32, device=DEV)
    out = torch.empty(2 * bw, dtype=torch.float32, device=DEV)
    _round_trip[(1,)](src, blk, out, BW=bw)
    s, o, k = src.cpu().view(torch.int32), out.cpu().view(torch.int32), blk.cpu().view(torch.int32)
    assert torch.equal(o, s)  # unpack(pack(a, b)) == (a, b), every bit
    # the block as floats: lane l's a at 2 l, its b at 2 l + 1 (the layout the kernels' readers index)
    assert torch.equal(k[0::2], s[:bw])
    assert torch.equal(k[1::2], s[bw:])
