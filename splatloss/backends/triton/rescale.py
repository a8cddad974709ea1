"""A kept gradient scaled in place by its upstream, or left alone where the upstream is the one
its forward assumed.

The fused losses compute their gradient in the forward, for an upstream gradient they assume
(``expect``: for the per-image D-SSIM + L1 losses, the ``1 / B`` of the default mean over the
batch of ``loss.backward()``). The backward must return ``unit * (upstream / expect)``; in torch
that is one pass over the gradient (8 B read and written per float32 pixel-channel: at five 1080p
RGB images about 80 us of an H100's bandwidth, 8 % of the loss, modelled), even where the factor
is exactly 1. Here each program reads its leading index's upstream scalar first and returns at once where it
equals ``expect``: then nothing but that scalar is read. Where it differs, the program multiplies
its block by ``div_rn(upstream, expect)``, the IEEE-rounded quotient, so the numbers are those of
``unit * (upstream / expect)`` in torch ops.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import device_guard

__all__ = ["rescale_"]

Tensor = torch.Tensor

#: Elements per program.
BLOCK = 4096


@triton.jit(do_not_specialize=("N_PER", "NBLK"))
def _rescale_kernel(g_ptr, u_ptr, expect, N_PER, NBLK, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    p = pid // NBLK
    u = tl.load(u_ptr + p)
    if u != expect:  # a NaN upstream scales too (NaN != NaN)
        k = tl.math.div_rn(u, expect)
        start = (pid % NBLK).to(tl.int64) * BLOCK  # 64-bit scalars (an image may pass 2**31 elements),
        at = g_ptr + (p.to(tl.int64) * N_PER + start) + tl.arange(0, BLOCK)  # 32-bit lane offsets
        live = tl.arange(0, BLOCK) < tl.minimum(N_PER - start, BLOCK).to(tl.int32)
        tl.store(at, tl.load(at, mask=live) * k, mask=live)


def rescale_(g: Tensor, upstream: Tensor, expect: float) -> Tensor:
    """``g`` (float32, dense, its leading indices outermost in memory: the ``P = upstream.numel()``
    blocks of ``g.numel() / P`` elements one after the other) times ``upstream[p] / expect`` in
    block ``p``, in place; blocks whose upstream equals ``expect`` are not touched. Returns ``g``."""
    u = upstream.reshape(-1)
    if u.dtype != torch.float32 or not u.is_contiguous():
        u = u.to(torch.float32).contiguous()
    P = u.numel()
    n_per = g.numel() // P
    if g.dtype != torch.float32 or g.numel() != P * n_per or g.device != u.device:
        raise ValueError(
            f"rescale_ takes a float32 gradient of upstream.numel() = {P} equal blocks on the upstream's device, "
            f"got {g.dtype} {tuple(g.shape)} on {g.device}"
        )
    nblk = triton.cdiv(n_per, BLOCK)
    with device_guard(g):
        _rescale_kernel[(P * nblk,)](g, u, float(expect), n_per, nblk, BLOCK=BLOCK, num_warps=4)
    return g
