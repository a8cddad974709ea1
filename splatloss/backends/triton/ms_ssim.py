"""MS-SSIM on Triton: the SSIM kernels at every scale, and a fused 2x2 pyramid step.

``_down_fwd_kernel`` is TF ``ssim_multiscale``'s pyramid step in one pass: an odd side is padded
by repeating its last row / column (bottom / right) and 2x2 blocks are averaged, here by clamping
the read index instead of materialising the padded copy; it reads the input in its own dtype and
strides and writes the half-size image in float32 (the accumulation dtype: fp16 2x2 means would
round). So the pyramid never makes a full-size copy (the torch path first casts fp16 images to
fp32 and, for odd sides, pads them). ``_down_bwd_kernel`` is its adjoint: each input pixel gets a
quarter of its block's upstream gradient, twice that for the repeated last row / column of an odd
side (it stands in both rows / columns of the block). 4 B read + 1 B-equivalent written per
input pixel-channel forward; 1 B read + 4 B written backward.

The loop over scales, the terms and their product are :mod:`splatloss.multiscale`'s, with
``ssim.ssim_stats`` per scale (autograd through both) and this fused step as the pyramid, so the
metric's relu clamp and the loss's smooth positive extension (``tau``) are every backend's.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

from ... import multiscale
from ._common import check_inputs, device_guard, functorch_guard, launch_options
from .ssim import ssim_stats

__all__ = ["downsample2x", "ms_ssim"]

Tensor = torch.Tensor

BLOCK = 1024
WARPS = 4


@triton.jit
def _down_fwd_kernel(in_ptr, out_ptr, C, H, W, Ho, Wo, N, s_b, s_c, s_h, s_w, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # output elements [B*C*Ho*Wo]
    ok = offs < N
    j = offs % Wo
    rest = offs // Wo
    i = rest % Ho
    bc = rest // Ho
    base = (bc // C) * s_b + (bc % C) * s_c
    r0 = 2 * i
    r1 = tl.minimum(2 * i + 1, H - 1)  # odd H: the last row stands in for the missing one
    c0 = 2 * j
    c1 = tl.minimum(2 * j + 1, W - 1)
    v = tl.load(in_ptr + base + r0 * s_h + c0 * s_w, mask=ok, other=0.0).to(tl.float32)
    v += tl.load(in_ptr + base + r0 * s_h + c1 * s_w, mask=ok, other=0.0).to(tl.float32)
    v += tl.load(in_ptr + base + r1 * s_h + c0 * s_w, mask=ok, other=0.0).to(tl.float32)
    v += tl.load(in_ptr + base + r1 * s_h + c1 * s_w, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, 0.25 * v, mask=ok)


@triton.jit
def _down_bwd_kernel(g_ptr, out_ptr, C, H, W, Ho, Wo, N, sg_b, sg_c, sg_h, sg_w, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # input elements [B*C*H*W]
    ok = offs < N
    c = offs % W
    rest = offs // W
    r = rest % H
    bc = rest // H
    g = tl.load(g_ptr + (bc // C) * sg_b + (bc % C) * sg_c + (r // 2) * sg_h + (c // 2) * sg_w, mask=ok, other=0.0).to(
        tl.float32
    )
    mult = tl.where((H % 2 == 1) & (r == H - 1), 2.0, 1.0) * tl.where((W % 2 == 1) & (c == W - 1), 2.0, 1.0)
    tl.store(out_ptr + offs, (0.25 * mult * g).to(out_ptr.dtype.element_ty), mask=ok)


@torch.library.custom_op("splatloss::triton_downsample2x", mutates_args=())
def _down_op(x: Tensor) -> Tensor:
    B, C, H, W = x.shape
    Ho, Wo = (H + 1) // 2, (W + 1) // 2
    out = torch.empty((B, C, Ho, Wo), dtype=torch.float32, device=x.device)
    n = out.numel()
    with device_guard(x):
        _down_fwd_kernel[(triton.cdiv(n, BLOCK),)](
            x, out, C, H, W, Ho, Wo, n, *x.stride(), BLOCK=BLOCK, **launch_options(WARPS)
        )
    return out


@_down_op.register_fake
def _(x):
    B, C, H, W = x.shape
    return x.new_empty((B, C, (H + 1) // 2, (W + 1) // 2), dtype=torch.float32)


@torch.library.custom_op("splatloss::triton_downsample2x_bwd", mutates_args=())
def _down_bwd_op(g: Tensor, x: Tensor) -> Tensor:
    B, C, H, W = x.shape
    out = torch.empty((B, C, H, W), dtype=x.dtype, device=x.device)  # contiguous
    n = out.numel()
    with device_guard(g):
        _down_bwd_kernel[(triton.cdiv(n, BLOCK),)](
            g, out, C, H, W, g.shape[2], g.shape[3], n, *g.stride(), BLOCK=BLOCK, **launch_options(WARPS)
        )
    return out


@_down_bwd_op.register_fake
def _(g, x):
    return x.new_empty(x.shape)


def _down_setup(ctx, inputs, output):
    (x,) = inputs
    ctx.save_for_backward(x)  # only its shape and dtype are used; it is alive anyway


def _down_backward(ctx, g):
    (x,) = ctx.saved_tensors
    return _down_bwd_op(g, x)


_down_op.register_autograd(_down_backward, setup_context=_down_setup)


def downsample2x(x: Tensor) -> Tensor:
    """``(B, C, H, W)`` -> ``(B, C, ceil(H/2), ceil(W/2))`` float32, TF's pyramid step."""
    with functorch_guard():
        return _down_op(x)


def ms_ssim(img1: Tensor, img2: Tensor, cfg, weights: Sequence[float], tau: Optional[float] = None) -> Tensor:
    """MS-SSIM per image ``[B]`` (TF ``ssim_multiscale`` conventions; ``tau`` as in
    ``splatloss.functional.ms_ssim``: None = relu-clamped metric, a float = the loss's smooth
    positive extension)."""
    check_inputs(img1, img2, cfg)
    # the fused step reads any float dtype and writes float32 itself: no cast of the full-size images
    stats = lambda x, y: ssim_stats(x, y, cfg)  # noqa: E731
    return multiscale.ms_ssim(stats, img1, img2, weights, tau, down=downsample2x, cast=False)
