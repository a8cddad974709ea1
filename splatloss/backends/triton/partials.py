"""Means of the kernels' per-program partial sums, several reductions in one launch.

The SSIM kernels write one partial sum per program and (image, channel) instead of adding into
one number with atomics (whose order, and so whose rounding, would change from run to run). What
is left is a short fixed-order sum per (image, channel) and a division by the map's size. In torch
that is a reduction and a division per buffer: for MS-SSIM at five scales eleven launches of a
few microseconds each (and a stack), about as long on a GPU as its 2x2 pyramid. Here one launch
takes up to :data:`MAX_SEGMENTS` buffers ("segments": a scale each) and writes their means where
the caller wants them, e.g. straight into MS-SSIM's ``[B, C, M]`` terms.

A segment ``k`` holds ``S_k`` partial sums per (image, channel) row, ``WIDTH`` values each (the
first is summed), rows one after the other: ``BC * S_k * WIDTH`` values, the segments one after
the other in one buffer. The program of row ``bc`` and segment ``k`` sums its ``S_k`` values in a
fixed order (a block of lanes, then the block's sum), so the result does not change from run to
run, and divides by ``N_k`` with IEEE rounding.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

from .launch import device_guard, launch_options, next_power_of_2

__all__ = ["means", "dssim_l1_loss", "MAX_SEGMENTS"]

Tensor = torch.Tensor

#: Segments one launch takes (MS-SSIM's default five scales: the finest in its own launch, which
#: runs before the pyramid, the four coarser ones in one).
MAX_SEGMENTS = 4

#: Sizes compiled as plain integers (no variant per shape; see launch.SIZES).
_SIZES = ("BC", "S0", "S1", "S2", "S3", "OUT_ROW", "OUT_COL")


@triton.jit(do_not_specialize=_SIZES)
def _means_kernel(
    a_ptr, b_ptr, out_ptr, BC, S0, S1, S2, S3, N0, N1, N2, N3, OUT_ROW, OUT_COL,
    NSEG: tl.constexpr, WIDTH: tl.constexpr, LAST_B: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    bc = tl.program_id(0)
    k = tl.program_id(1)
    S = tl.where(k == 0, S0, tl.where(k == 1, S1, tl.where(k == 2, S2, S3)))
    N = tl.where(k == 0, N0, tl.where(k == 1, N1, tl.where(k == 2, N2, N3)))
    before = tl.where(k > 0, S0, 0) + tl.where(k > 1, S1, 0) + tl.where(k > 2, S2, 0)  # rows' sizes
    start = (before.to(tl.int64) * BC + bc.to(tl.int64) * S) * WIDTH
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s0 in range(0, S, BLOCK):
        i = s0 + tl.arange(0, BLOCK)
        at = start + i.to(tl.int64) * WIDTH
        live = i < S
        if LAST_B:  # the last segment lies at the same place in the second buffer
            acc += tl.load(a_ptr + at, mask=live & (k != NSEG - 1), other=0.0)
            acc += tl.load(b_ptr + at, mask=live & (k == NSEG - 1), other=0.0)
        else:
            acc += tl.load(a_ptr + at, mask=live, other=0.0)
    total = tl.sum(acc, axis=0)
    tl.store(out_ptr + bc.to(tl.int64) * OUT_ROW + k.to(tl.int64) * OUT_COL, tl.math.div_rn(total, N))


def means(
    buf: Tensor,
    BC: int,
    slots: Sequence[int],
    sizes: Sequence[int],
    out: Tensor,
    width: int = 1,
    last: Optional[Tensor] = None,
) -> Tensor:
    """``out[bc, k] = sum(partials of row bc in segment k) / sizes[k]`` for the segments of ``buf``
    (float32, contiguous): segment ``k`` has ``slots[k]`` partial sums of ``width`` values per row
    (the first one summed), the segments one after the other. ``last``: a second buffer of
    ``buf``'s layout from which the last segment is read instead. ``out``: float32, any
    ``(BC, len(slots))`` view (e.g. ``terms.view(B * C, M)[:, 1:]``). One launch per
    :data:`MAX_SEGMENTS` segments. Returns ``out``."""
    n = len(slots)
    if not (n == len(sizes) == out.shape[1]) or out.shape[0] != BC:
        raise ValueError(f"means: {n} segments, {len(sizes)} sizes, out of shape {tuple(out.shape)} for {BC} rows")
    row, col = out.stride()
    buf = buf.reshape(-1)  # a view: the buffers are contiguous
    last = last.reshape(-1) if last is not None else None
    at = 0
    for k0 in range(0, n, MAX_SEGMENTS):
        seg = list(slots[k0 : k0 + MAX_SEGMENTS])
        div = [float(s) for s in sizes[k0 : k0 + MAX_SEGMENTS]]
        nseg = len(seg)
        use_last = last is not None and k0 + nseg == n
        longest = max(seg)
        block = max(16, min(1024, next_power_of_2(longest)))
        a = buf[at:]
        with device_guard(buf):
            _means_kernel[(BC, nseg)](
                a, last[at:] if use_last else a, out[:, k0:], BC, *(seg + [0] * (MAX_SEGMENTS - nseg)),
                *(div + [1.0] * (MAX_SEGMENTS - nseg)), row, col, NSEG=nseg, WIDTH=width, LAST_B=use_last,
                BLOCK=block, **launch_options(1 if block <= 128 else 4),
            )  # fmt: skip
        at += BC * width * sum(seg)
    return out


@triton.jit(do_not_specialize=("C", "P"))
def _dssim_l1_kernel(
    s_ptr, l1_ptr, out_ptr, C, P, lam, n_map, n_img, WIDTH: tl.constexpr, BLOCK: tl.constexpr
):  # fmt: skip
    # image b: its channels' partial sums of SSIM and |x - y|, P per channel, WIDTH apart
    b = tl.program_id(0).to(tl.int64)
    acc_s = tl.zeros([BLOCK], dtype=tl.float32)
    acc_l1 = tl.zeros([BLOCK], dtype=tl.float32)
    for c in range(0, C):
        row = (b * C + c) * P
        for s0 in range(0, P, BLOCK):
            i = s0 + tl.arange(0, BLOCK)
            at = (row + i) * WIDTH
            acc_s += tl.load(s_ptr + at, mask=i < P, other=0.0)
            acc_l1 += tl.load(l1_ptr + at, mask=i < P, other=0.0)
    s = tl.sum(acc_s, axis=0)
    l1 = tl.sum(acc_l1, axis=0)
    loss = tl.math.div_rn(l1 * (1.0 - lam), n_img) + lam * (1.0 - tl.math.div_rn(s, n_map))
    tl.store(out_ptr + b, loss)


def dssim_l1_loss(s: Tensor, l1: Tensor, B: int, C: int, lam: float, n_map: int, n_img: int, width: int = 1) -> Tensor:
    """The 3DGS loss per image ``[B]``, ``(1 - lam) L1 + lam (1 - SSIM)``, from the kernels'
    partial sums: ``s`` of the SSIM map and ``l1`` of ``|x - y|``, ``P`` per (image, channel) row,
    ``width`` values apart (``s`` and ``l1`` may be one buffer's two interleaved components);
    ``n_map``, ``n_img``: the map's and the image's pixel-channels per image. One launch."""
    P = s.numel() // (B * C * width)
    out = torch.empty(B, dtype=torch.float32, device=s.device)
    block = max(16, min(1024, next_power_of_2(P)))
    with device_guard(s):
        _dssim_l1_kernel[(B,)](
            s, l1, out, C, P, float(lam), float(n_map), float(n_img), WIDTH=width, BLOCK=block,
            **launch_options(1 if block <= 128 else 4),
        )  # fmt: skip
    return out
