"""A kept gradient scaled in place by its upstream, or left alone where the upstream is the one
its forward assumed.

The fused losses compute their gradient in the forward, for an upstream gradient they assume
(``expect``: for the per-image D-SSIM + L1 losses, the ``1 / B`` of the default mean over the
batch of ``loss.backward()``). The backward must return ``unit * (upstream / expect)``; in torch
that is one pass over the gradient (8 B read and written per float32 pixel-channel: at five 1080p
RGB images about 80 us of an H100's bandwidth, 8 % of the loss, modelled), even where the factor
is exactly 1. Here each program reads its upstream scalars first and returns at once where they
equal ``expect``: then nothing but those scalars is read. Where they differ, the program
multiplies its block by ``k = div_rn(upstream, expect)``, the IEEE-rounded quotient, so the
numbers are those of :func:`scaled` in torch ops; where ``k`` overflows and the upstream does not
(``|expect| < 1`` and an upstream near float32's largest), by ``1 / expect`` (rounded) and then by
the upstream instead, which overflows only where the gradient itself does.

The upstreams are one per leading index: per image (the gradient's blocks of ``C * H * W``, any
dense layout), or per image and channel, in planes (NCHW: blocks of ``H * W``) or interleaved
(channels-last: blocks of ``H * W * C``, channel ``i % C`` at element ``i``).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .launch import device_guard, launch_kernel, next_power_of_2

__all__ = ["addressable", "f32_quotient", "rescale_", "scaled"]

Tensor = torch.Tensor

#: Elements per program.
BLOCK = 4096


@triton.jit
def _factors(u, expect, recip):
    # g * f1 * f2: (g * k) * 1 with k = u / expect; where k overflows and u does not, (g * recip) * u
    k = tl.math.div_rn(u, expect)
    big = (tl.abs(k) == float("inf")) & (tl.abs(u) < float("inf"))
    return tl.where(big, recip, k), tl.where(big, u, 1.0)


@triton.jit(do_not_specialize=("N_PER", "NBLK", "CH"))
def _rescale_kernel(
    g_ptr, u_ptr, expect, recip, N_PER, NBLK, CH, INTERLEAVED: tl.constexpr, CP2: tl.constexpr, BLOCK: tl.constexpr
):
    pid = tl.program_id(0)
    q = pid // NBLK  # the block of memory: an image, or a plane
    start = (pid % NBLK).to(tl.int64) * BLOCK  # 64-bit scalars (a block may pass 2**31 elements),
    at = g_ptr + (q.to(tl.int64) * N_PER + start) + tl.arange(0, BLOCK)  # 32-bit lane offsets
    live = tl.arange(0, BLOCK) < tl.minimum(N_PER - start, BLOCK).to(tl.int32)
    if INTERLEAVED:  # the image's CH upstreams, channel (start + lane) % CH at each element
        c = tl.arange(0, CP2)
        uc = tl.load(u_ptr + q * CH + c, mask=c < CH, other=expect)
        if tl.sum((uc != expect).to(tl.int32), axis=0) > 0:  # a NaN upstream scales too
            u = tl.load(u_ptr + q * CH + ((start + tl.arange(0, BLOCK)) % CH).to(tl.int32), mask=live, other=expect)
            f1, f2 = _factors(u, expect, recip)
            tl.store(at, tl.load(at, mask=live) * f1 * f2, mask=live)
    else:
        u = tl.load(u_ptr + q)
        if u != expect:  # a NaN upstream scales too (NaN != NaN)
            f1, f2 = _factors(u, expect, recip)
            tl.store(at, tl.load(at, mask=live) * f1 * f2, mask=live)


@functools.lru_cache(maxsize=256)
def f32_quotient(numerator: float, *divisors: float) -> float:
    """``numerator / divisors[0] / divisors[1] ...``, each step rounded to float32: as autograd's
    mean backwards round the upstreams, and ``1 / expect`` as the kernel and :func:`scaled` use it."""
    from ..base import stepwise_quotient  # here, so that the kernels above keep their lines

    return stepwise_quotient(torch.float32, numerator, *divisors)


def _layout(g: Tensor, P: int):
    """``(blocks, channels interleaved or 1)`` of ``g`` for ``P`` upstreams, or None where the
    kernel cannot address them: per image (``P = B``: any dense layout with the batch outermost),
    per plane (``P = B * C``, NCHW), per image and channel interleaved (channels-last)."""
    if g.dim() != 4 or g.numel() == 0:
        return None
    B, C = g.shape[:2]
    outer = B == 1 or g.stride(0) * B == g.numel()
    dense = g.is_contiguous() or g.is_contiguous(memory_format=torch.channels_last)
    if P == B and dense and outer:
        return B, 1
    if P == B * C and g.is_contiguous():
        return B * C, 1
    if P == B * C and g.is_contiguous(memory_format=torch.channels_last) and outer:
        return B, C
    return None


def addressable(g: Tensor, upstream: Tensor) -> bool:
    """Whether :func:`rescale_` takes ``g`` with these upstreams (see :func:`_layout`)."""
    return g.dtype == torch.float32 and g.device == upstream.device and _layout(g, upstream.numel()) is not None


def rescale_(g: Tensor, upstream: Tensor, expect: float) -> Tensor:
    """``g`` (float32 ``[B, C, H, W]``) times ``upstream / expect`` in place, ``upstream`` one value
    per image (``[B]``) or per image and channel (``[B, C]``); the blocks whose upstreams equal
    ``expect`` are not touched. The numbers are :func:`scaled`'s. Returns ``g``."""
    u = upstream.reshape(-1)
    if u.dtype != torch.float32 or not u.is_contiguous():
        u = u.to(torch.float32).contiguous()
    layout = _layout(g, u.numel()) if g.dtype == torch.float32 and g.device == u.device else None
    if layout is None:
        raise ValueError(
            f"rescale_ takes a float32 [B, C, H, W] gradient with one upstream per image or per image and channel "
            f"on its device, its blocks dense in memory; got {g.dtype} {tuple(g.shape)} strides {tuple(g.stride())} "
            f"on {g.device} with {u.numel()} upstreams on {u.device}"
        )
    blocks, ch = layout
    n_per = g.numel() // blocks
    nblk = triton.cdiv(n_per, BLOCK)
    with device_guard(g):
        launch_kernel(_rescale_kernel, (blocks * nblk,),
            g, u, float(expect), f32_quotient(1.0, float(expect)), n_per, nblk, ch,
            INTERLEAVED=ch > 1, CP2=max(2, next_power_of_2(ch)), BLOCK=BLOCK, num_warps=4,
        )  # fmt: skip
    return g


def scaled(g: Tensor, u: Tensor, expect: float, out: Tensor) -> Tensor:
    """``g * (u / expect)`` into ``out`` in torch ops, ``u`` broadcast against ``g``; where
    ``u / expect`` overflows and ``u`` does not, ``(g * (1 / expect)) * u``: the kernel's numbers
    (two passes where ``expect`` is not 1: only where the kernel cannot take the layout)."""
    if expect == 1.0:
        return torch.mul(g, u, out=out)
    k = u / expect
    big = k.isinf() & u.isfinite()
    f1 = torch.where(big, torch.full_like(k, f32_quotient(1.0, float(expect))), k)
    f2 = torch.where(big, u, torch.ones_like(u))
    return torch.mul(g * f1, f2, out=out)
