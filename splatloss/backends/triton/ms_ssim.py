"""MS-SSIM on Triton: the SSIM kernels at every scale, and a fused 2x2 pyramid step.

``_down_fwd_kernel`` is TF ``ssim_multiscale``'s pyramid step in one pass: an odd side is padded
by repeating its last row / column (bottom / right) and 2x2 blocks are averaged, here by clamping
the read index instead of materialising the padded copy; it reads the input in its own dtype and
strides and writes the half-size image in float32 (the accumulation dtype: fp16 2x2 means would
round). So the pyramid never pads an odd side (the torch path pads a copy). fp16 / bf16 images
reach it already cast to float32 by the backend (``TritonBackend.ms_ssim``): one cast at the top,
so every scale's gradient is summed in float32 and the cast's backward rounds the sum once.
``_down_bwd_kernel`` is its adjoint: each input pixel gets a quarter of its block's upstream
gradient, twice that for the repeated last row / column of an odd side (it stands in both rows /
columns of the block). 4 B read + 1 B-equivalent written per
input pixel-channel forward; 1 B read + 4 B written backward.

The loop over scales, the terms and their product are :mod:`splatloss.multiscale`'s, with
``ssim.ssim_term`` per scale (autograd through both) and this fused step as the pyramid, so the
metric's relu clamp and the loss's smooth positive extension (``tau``) are every backend's.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

from ... import multiscale
from . import launch
from .glue import check_inputs, eager, functorch_guard, refuse_double_backward, with_autograd
from .launch import device_guard, launch_options
from .ssim import ssim_term

__all__ = ["downsample2x", "ms_ssim"]

Tensor = torch.Tensor

WARPS = 4


def _tile(width: int, rows: int, device: torch.device) -> tuple:
    """(rows, columns) of a program's tile: on CUDA one row of one channel, the row's width rounded
    up to a power of two, 128..1024 columns; in the interpreter (one program at a time, at a cost
    per operation) as many rows as make about 16k elements."""
    block = min(1024, max(128, triton.next_power_of_2(width)))
    if device.type == "cuda" or launch.FORCE_CUDA_GEOMETRY:
        return 1, block
    return min(triton.next_power_of_2(rows), max(1, 16384 // block)), block


#: Sizes compiled as plain integers (no variant per image size; see launch.SIZES).
_DOWN_SIZES = ("C", "H", "W", "Ho", "Wo", "N_ROWS")


@triton.jit(do_not_specialize=_DOWN_SIZES)
def _down_fwd_kernel(
    in_ptr, out_ptr, C, H, W, Ho, Wo, N_ROWS, s_b, s_c, s_h, s_w, RB: tl.constexpr, BLOCK: tl.constexpr
):
    # a tile of RB output rows (row = bc * Ho + i) x BLOCK columns: divisions per row, none per pixel
    row = tl.program_id(0) * RB + tl.arange(0, RB)[:, None]  # [RB, 1]
    i = row % Ho
    bc = row // Ho
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)[None, :]  # output columns [1, BLOCK]
    ok = (row < N_ROWS) & (j < Wo)
    base = in_ptr + ((bc // C).to(tl.int64) * s_b + (bc % C).to(tl.int64) * s_c)
    row0 = base + (2 * i).to(tl.int64) * s_h
    row1 = base + tl.minimum(2 * i + 1, H - 1).to(tl.int64) * s_h  # odd H: the last row stands in
    c0 = (2 * j).to(tl.int64) * s_w
    c1 = tl.minimum(2 * j + 1, W - 1).to(tl.int64) * s_w  # odd W: the last column stands in
    v = tl.load(row0 + c0, mask=ok, other=0.0).to(tl.float32)
    v += tl.load(row0 + c1, mask=ok, other=0.0).to(tl.float32)
    v += tl.load(row1 + c0, mask=ok, other=0.0).to(tl.float32)
    v += tl.load(row1 + c1, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row.to(tl.int64) * Wo + j, 0.25 * v, mask=ok)


@triton.jit(do_not_specialize=_DOWN_SIZES)
def _down_bwd_kernel(
    g_ptr, out_ptr, C, H, W, Ho, Wo, N_ROWS, sg_b, sg_c, sg_h, sg_w, RB: tl.constexpr, BLOCK: tl.constexpr
):
    # a tile of RB input rows (row = bc * H + r) x BLOCK columns; the gradient is written contiguous
    row = tl.program_id(0) * RB + tl.arange(0, RB)[:, None]  # [RB, 1]
    r = row % H
    bc = row // H
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)[None, :]  # input columns [1, BLOCK]
    ok = (row < N_ROWS) & (c < W)
    g_row = g_ptr + ((bc // C).to(tl.int64) * sg_b + (bc % C).to(tl.int64) * sg_c + (r // 2).to(tl.int64) * sg_h)
    g = tl.load(g_row + (c // 2).to(tl.int64) * sg_w, mask=ok, other=0.0).to(tl.float32)
    # each input pixel gets a quarter of its block's gradient; the repeated last row / column of an
    # odd side stands in both rows / columns of its block: twice that
    scale = tl.where((H % 2 == 1) & (r == H - 1), 0.5, 0.25)
    g = g * scale * tl.where((W % 2 == 1) & (c == W - 1), 2.0, 1.0)
    tl.store(out_ptr + row.to(tl.int64) * W + c, g.to(out_ptr.dtype.element_ty), mask=ok)


def _down_impl(x: Tensor) -> Tensor:
    B, C, H, W = x.shape
    Ho, Wo = (H + 1) // 2, (W + 1) // 2
    out = torch.empty((B, C, Ho, Wo), dtype=torch.float32, device=x.device)
    n_rows = B * C * Ho
    rb, block = _tile(Wo, n_rows, x.device)
    with device_guard(x):
        _down_fwd_kernel[(triton.cdiv(n_rows, rb), triton.cdiv(Wo, block))](
            x, out, C, H, W, Ho, Wo, n_rows, *x.stride(), RB=rb, BLOCK=block, **launch_options(WARPS)
        )
    return out


_down_op = torch.library.custom_op("splatloss::triton_downsample2x", _down_impl, mutates_args=())


@_down_op.register_fake
def _(x):
    B, C, H, W = x.shape
    return x.new_empty((B, C, (H + 1) // 2, (W + 1) // 2), dtype=torch.float32)


def _down_bwd_impl(g: Tensor, x: Tensor) -> Tensor:
    B, C, H, W = x.shape
    out = torch.empty((B, C, H, W), dtype=x.dtype, device=x.device)  # contiguous
    n_rows = B * C * H
    rb, block = _tile(W, n_rows, g.device)
    with device_guard(g):
        _down_bwd_kernel[(triton.cdiv(n_rows, rb), triton.cdiv(W, block))](
            g, out, C, H, W, g.shape[2], g.shape[3], n_rows, *g.stride(), RB=rb, BLOCK=block, **launch_options(WARPS)
        )
    return out


_down_bwd_op = torch.library.custom_op("splatloss::triton_downsample2x_bwd", _down_bwd_impl, mutates_args=())


@_down_bwd_op.register_fake
def _(g, x):
    return x.new_empty(x.shape)


def _down_setup(ctx, inputs, output):
    (x,) = inputs
    ctx.save_for_backward(x)  # only its shape and dtype are used; it is alive anyway


def _down_backward(ctx, g):
    refuse_double_backward("downsample2x")
    (x,) = ctx.saved_tensors
    # eager: the kernel directly (no custom-op dispatch); a compiled backward's trace: the op
    return (_down_bwd_impl if eager(g, x) else _down_bwd_op)(g, x)


_down_call = with_autograd(_down_op, _down_impl, _down_setup, _down_backward)


def downsample2x(x: Tensor) -> Tensor:
    """``(B, C, H, W)`` -> ``(B, C, ceil(H/2), ceil(W/2))`` float32, TF's pyramid step."""
    with functorch_guard():
        return _down_call(x)


def ms_ssim(img1: Tensor, img2: Tensor, cfg, weights: Sequence[float], tau: Optional[float] = None) -> Tensor:
    """MS-SSIM per image ``[B]`` (TF ``ssim_multiscale`` conventions; ``tau`` as in
    ``splatloss.functional.ms_ssim``: None = relu-clamped metric, a float = the loss's smooth
    positive extension)."""
    check_inputs(img1, img2, cfg)
    # one term per scale (its gradient computed in the forward when one is needed: ssim_term); the
    # fused step writes float32 (fp16 / bf16 images arrive cast once by TritonBackend.ms_ssim)
    term = lambda last, x, y: ssim_term(x, y, cfg, cs=not last)  # noqa: E731
    terms = multiscale.scale_terms(term, (img1, img2), len(weights), down=downsample2x, cast=False)
    return multiscale.combine(terms, weights, tau)
