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
columns of the block). 4 B read + 1 B-equivalent written per input pixel-channel forward.
:func:`ms_terms` runs every scale's term and this step in one op, whose backward fuses the
adjoint with each scale's own gradient (``_down_bwd_kernel`` stays the adjoint of
:func:`downsample2x` called on its own). The terms' weighted product is :mod:`.combine`'s, one
launch each way, the function of :func:`splatloss.multiscale.combine` (the metric's relu clamp
and the loss's smooth positive extension, ``tau``), held to it by
tests/backends/test_triton_ms_combine.py, special values included.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import triton
import triton.language as tl

from . import combine, glue, launch
from .backward import launch_bwd, launch_bwd_scales
from .forward import launch_fwd_scales
from .glue import check_inputs, eager, functorch_guard, map_numel, refuse_double_backward, with_autograd
from .launch import COLUMN_TAPS, cdiv, device_guard, launch_options, next_power_of_2
from .ssim import _term_impl

__all__ = ["downsample2x", "ms_ssim"]

Tensor = torch.Tensor

WARPS = 4


def _tile(width: int, rows: int, device: torch.device) -> tuple:
    """(rows, columns) of a program's tile: on CUDA one row of one channel, the row's width rounded
    up to a power of two, 128..1024 columns; in the interpreter (one program at a time, at a cost
    per operation) as many rows as make about 16k elements."""
    block = min(1024, max(128, next_power_of_2(width)))
    if device.type == "cuda" or launch.FORCE_CUDA_GEOMETRY:
        return 1, block
    return min(next_power_of_2(rows), max(1, 16384 // block)), block


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
    return _down_into(x, torch.empty((B, C, (H + 1) // 2, (W + 1) // 2), dtype=torch.float32, device=x.device))


def _down_into(x: Tensor, out: Tensor) -> Tensor:
    """The 2x2 step of ``x`` written into ``out`` (contiguous float32 ``(B, C, ceil(H/2), ceil(W/2))``)."""
    B, C, H, W = x.shape
    Ho, Wo = (H + 1) // 2, (W + 1) // 2
    n_rows = B * C * Ho
    rb, block = _tile(Wo, n_rows, x.device)
    with device_guard(x):
        _down_fwd_kernel[(cdiv(n_rows, rb), cdiv(Wo, block))](
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
        _down_bwd_kernel[(cdiv(n_rows, rb), cdiv(W, block))](
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


# ------------------------------------------------------------------------------------------------
# MS-SSIM's scales as one op: every scale's term in the forward, the pyramid's backward as one
# launch per scale.
#
# Each scale's term is ssim._term_impl's pass (the backward kernel run in the forward for a unit
# upstream gradient per image and channel, its SSIM or cs values summed on the way), each coarser
# pair made by the 2x2 step above. Composed with autograd scale by scale, the backward would be
# three launches per scale, each with full-size traffic: the scale's kept gradient times its
# upstream scalars (read 4 B, write 4 B per pixel-channel), the 2x2 step's adjoint of the coarser
# scale's gradient (read 1 B, write 4 B) and autograd's sum of the two (read 8 B, write 4 B): 25 B
# per pixel-channel and 13 launches for five scales. Here one op holds every scale, so its
# backward is _up_kernel once per scale, coarsest first: grad_j = G_j * d_j + up(grad_(j+1))
# (G_j the kept unit gradient, d_j the [B, C] upstream of scale j's term, up the 2x2 step's
# adjoint): 5 B read and 4 B written per pixel-channel, five launches. The arithmetic is the
# composition's (one product, one power-of-two scaling, one sum per pixel), so the interpreter's
# gradients are bit for bit the scale-by-scale composition's; a compiler that contracts the
# product and the sum into a fused multiply-add rounds once instead of twice.
#
# The op keeps what the scale-by-scale terms kept (every scale's float32 unit gradient, for each
# image that needs one); an input that needs a gradient its forward did not compute gets the whole
# forward again, with that gradient. The coarser scales' terms are one launch (with a gradient
# backward.launch_bwd_scales, without forward.launch_fwd_scales): their pairs are made into one
# flat buffer per image, so that their short grids (at one 1080p image 264, 102, 27 and 15
# programs of 25 and 16 rows, each grid's time one program's walk) run side by side, not one after
# the other; their kept gradients are one flat buffer per image too (_split views it).
# ------------------------------------------------------------------------------------------------

_UP_SIZES = ("C", "H", "W", "N_ROWS", "M", "J")


@triton.jit(do_not_specialize=_UP_SIZES)
def _up_kernel(
    g_ptr,
    d_ptr,
    coarse_ptr,
    out_ptr,
    C,
    H,
    W,
    N_ROWS,
    M,
    J,
    sg_b,
    sg_c,
    sg_h,
    sg_w,
    sc_b,
    sc_c,
    sc_h,
    sc_w,
    so_b,
    so_c,
    so_h,
    so_w,
    HAS_COARSE: tl.constexpr,
    RB: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # a tile of RB rows of scale J (row = bc * H + r) x BLOCK columns: its kept unit gradient times
    # the scale's upstream scalar, plus the 2x2 step's adjoint of the coarser scale's gradient
    row = tl.program_id(0) * RB + tl.arange(0, RB)[:, None]  # [RB, 1]
    r = row % H
    bc = row // H
    b = (bc // C).to(tl.int64)
    ch = (bc % C).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)[None, :]  # [1, BLOCK]
    live = row < N_ROWS
    ok = live & (c < W)
    u = tl.load(d_ptr + bc.to(tl.int64) * M + J, mask=live, other=0.0)  # [RB, 1]
    g_at = g_ptr + b * sg_b + ch * sg_c + r.to(tl.int64) * sg_h + c.to(tl.int64) * sg_w
    g = tl.load(g_at, mask=ok, other=0.0) * u
    if HAS_COARSE:
        c_at = coarse_ptr + b * sc_b + ch * sc_c + (r // 2).to(tl.int64) * sc_h + (c // 2).to(tl.int64) * sc_w
        up = tl.load(c_at, mask=ok, other=0.0)
        # each pixel gets a quarter of its block's gradient; the repeated last row / column of an
        # odd side stands in both rows / columns of its block: twice that (as in _down_bwd_kernel)
        up = up * tl.where((H % 2 == 1) & (r == H - 1), 0.5, 0.25)
        g = g + up * tl.where((W % 2 == 1) & (c == W - 1), 2.0, 1.0)
    o_at = out_ptr + b * so_b + ch * so_c + r.to(tl.int64) * so_h + c.to(tl.int64) * so_w
    tl.store(o_at, g, mask=ok)


def _chain_impl(d: Tensor, grads: List[Tensor]) -> Tensor:
    """The input's gradient from every scale's kept unit gradient ``grads`` (finest first) and
    the ``[B, C, M]`` upstream of the terms ``d``: one launch per scale, coarsest first. float32,
    in the layout of ``grads[0]``."""
    d = d.to(torch.float32).contiguous()
    M = len(grads)
    acc = None
    for j in reversed(range(M)):
        g = grads[j]
        B, C, H, W = g.shape
        out = torch.empty_like(g, dtype=torch.float32)
        coarse = g if acc is None else acc  # any pointer when there is no coarser scale
        n_rows = B * C * H
        rb, block = _tile(W, n_rows, g.device)
        with device_guard(g):
            _up_kernel[(cdiv(n_rows, rb), cdiv(W, block))](
                g,
                d,
                coarse,
                out,
                C,
                H,
                W,
                n_rows,
                M,
                j,
                *g.stride(),
                *coarse.stride(),
                *out.stride(),
                HAS_COARSE=acc is not None,
                RB=rb,
                BLOCK=block,
                **launch_options(WARPS),
            )
        acc = out
    return acc


_chain_op = torch.library.custom_op("splatloss::triton_ms_pyramid_bwd", _chain_impl, mutates_args=())


@_chain_op.register_fake
def _(d, grads):
    return torch.empty_like(grads[0], dtype=torch.float32)


def _coarse_dims(H: int, W: int, scales: int) -> List[Tuple[int, int]]:
    """``(H_s, W_s)`` of scales ``1 .. scales - 1``: TF's pyramid halves each side, rounding up."""
    dims = []
    for _ in range(scales - 1):
        H, W = (H + 1) // 2, (W + 1) // 2
        dims.append((H, W))
    return dims


def _split(flat: Tensor, B: int, C: int, dims) -> List[Tensor]:
    """The coarser scales' ``(B, C, H_s, W_s)`` views of a flat buffer laid out scale after scale."""
    out, at = [], 0
    for h, w in dims:
        out.append(flat[at : at + B * C * h * w].view(B, C, h, w))
        at += B * C * h * w
    return out


def _terms_impl(
    img1: Tensor,
    img2: Tensor,
    window: Tensor,
    padding: str,
    c1: float,
    c2: float,
    scales: int,
    need1: bool,
    need2: bool,
) -> List[Tensor]:
    """``[terms [B, C, M], G1_0, G1_c, G2_0, G2_c]``: the mean cs at scales ``1..M-1`` and the mean
    SSIM at scale ``M``; for each image that needs one, scale 0's unit gradient (``G*_0``) and the
    coarser scales' (``G*_c``, flat, scale after scale: :func:`_split`), float32; empty where not
    computed. The coarser scales' pairs are made into one flat buffer each, and their terms run as
    one launch (:func:`.backward.launch_bwd_scales` with a gradient, :func:`.forward.launch_fwd_scales`
    without; windows up to ``COLUMN_TAPS`` taps, else one launch per scale)."""
    B, C, H, W = img1.shape
    dims = _coarse_dims(H, W, scales)
    dev = img1.device
    empty = img1.new_empty(0, dtype=torch.float32)
    t0, g1_0, g2_0 = _term_impl(img1, img2, window, padding, c1, c2, scales > 1, need1, need2)
    if not dims:
        return [t0.unsqueeze(-1), g1_0, empty, g2_0, empty.clone()]
    total = sum(B * C * h * w for h, w in dims)
    xf = torch.empty(total, dtype=torch.float32, device=dev)
    yf = torch.empty(total, dtype=torch.float32, device=dev)
    xs, ys = _split(xf, B, C, dims), _split(yf, B, C, dims)
    for j in range(len(dims)):
        _down_into(img1 if j == 0 else xs[j - 1], xs[j])
        _down_into(img2 if j == 0 else ys[j - 1], ys[j])
    K = window.shape[0]
    g1_c = g2_c = None
    if (need1 or need2) and K <= COLUMN_TAPS.value:
        g1_c, g2_c, terms = launch_bwd_scales(xf, yf, B, C, dims, window, padding, c1, c2, need1, need2)
    elif K <= COLUMN_TAPS.value:
        sums = launch_fwd_scales(xf, yf, B, C, dims, window, padding, c1, c2)
        terms = [t / map_numel(x, window, padding) for t, x in zip(sums, xs)]
    else:
        g1_c = torch.empty_like(xf) if need1 else None
        g2_c = torch.empty_like(yf) if need2 else None
        g1s = _split(g1_c, B, C, dims) if need1 else [None] * len(dims)
        g2s = _split(g2_c, B, C, dims) if need2 else [None] * len(dims)
        terms = []
        for j in range(len(dims)):
            last = j == len(dims) - 1
            if need1 or need2:
                n = map_numel(xs[j], window, padding)
                unit = torch.full((B, C), 1.0 / n, dtype=torch.float32, device=dev)
                *_, t_sum, _ = launch_bwd(
                    xs[j], ys[j], window, padding, c1, c2, unit, None if last else unit, need1, need2,
                    grad1=g1s[j], grad2=g2s[j], sums=True, grad_dtype=torch.float32, cs_only=not last,
                )  # fmt: skip
                terms.append(t_sum / n)
            else:
                terms.append(_term_impl(xs[j], ys[j], window, padding, c1, c2, not last, False, False)[0])
    return [
        torch.stack([t0, *terms], dim=-1),
        g1_0,
        g1_c if g1_c is not None else empty,
        g2_0,
        g2_c if g2_c is not None else empty.clone(),
    ]


_terms_op = torch.library.custom_op("splatloss::triton_ms_terms", _terms_impl, mutates_args=())


@_terms_op.register_fake
def _(img1, img2, window, padding, c1, c2, scales, need1, need2):
    B, C, H, W = img1.shape
    total = sum(B * C * h * w for h, w in _coarse_dims(H, W, scales))
    g1_0, g2_0 = glue.fake_unit_grads(img1, img2, need1, need2)
    g1_c = img1.new_empty(total if need1 else 0, dtype=torch.float32)
    g2_c = img1.new_empty(total if need2 else 0, dtype=torch.float32)
    return [img1.new_empty((B, C, scales), dtype=torch.float32), g1_0, g1_c, g2_0, g2_c]


def _terms_save(ctx, inputs, output):
    img1, img2, window, padding, c1, c2, scales, need1, need2 = inputs
    grads = output[1:]
    ctx.save_for_backward(img1, img2, window, *grads)
    ctx.mark_non_differentiable(*grads)
    ctx.set_materialize_grads(False)  # no zero-filled upstream gradients for the kept gradients
    ctx.cfg = (padding, c1, c2, scales)


def _terms_backward(ctx, *grads):
    refuse_double_backward("ms_ssim")
    # the custom op hands its outputs' gradients over as one list, the eager Function one by one
    g_terms = grads[0][0] if isinstance(grads[0], (list, tuple)) else grads[0]
    rest = (None,) * 7
    need1, need2 = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
    if not (need1 or need2) or g_terms is None:
        return (None, None) + rest
    padding, c1, c2, scales = ctx.cfg
    img1, img2, window, g1_0, g1_c, g2_0, g2_c = ctx.saved_tensors
    if (need1 and g1_0.numel() == 0) or (need2 and g2_0.numel() == 0):
        again = (_terms_impl if eager(img1, img2) else _terms_op)(
            img1, img2, window, padding, c1, c2, scales, need1, need2
        )
        g1_0, g1_c, g2_0, g2_c = again[1:]
    B, C, H, W = img1.shape
    dims = _coarse_dims(H, W, scales)
    chain = _chain_impl if eager(g_terms, img1, img2) else _chain_op
    gx = chain(g_terms, [g1_0, *_split(g1_c, B, C, dims)]).to(img1.dtype) if need1 else None
    gy = chain(g_terms, [g2_0, *_split(g2_c, B, C, dims)]).to(img2.dtype) if need2 else None
    return (gx, gy) + rest


_terms_call = with_autograd(_terms_op, _terms_impl, _terms_save, _terms_backward)


def ms_terms(img1: Tensor, img2: Tensor, cfg, scales: int) -> Tensor:
    """The ``[B, C, M]`` MS-SSIM terms of ``scales`` scales (:func:`splatloss.multiscale.ms_terms`'s),
    differentiable with respect to both images through the fused pyramid backward."""
    window = glue.window_taps(cfg, img1.device)
    need1, need2 = glue.wants_grad(img1), glue.wants_grad(img2)
    args = (img1, img2, window, cfg.padding, float(cfg.C1), float(cfg.C2), int(scales), need1, need2)
    return _terms_call(*args)[0]


def ms_ssim(img1: Tensor, img2: Tensor, cfg, weights: Sequence[float], tau: Optional[float] = None) -> Tensor:
    """MS-SSIM per image ``[B]`` (TF ``ssim_multiscale`` conventions; ``tau`` as in
    ``splatloss.functional.ms_ssim``: None = relu-clamped metric, a float = the loss's smooth
    positive extension)."""
    check_inputs(img1, img2, cfg)
    # every scale's term (its gradient computed in the forward when one is needed) in one op, whose
    # backward is one launch per scale; the fused step writes float32 (fp16 / bf16 images arrive
    # cast once by TritonBackend.ms_ssim)
    with functorch_guard():
        terms = ms_terms(img1, img2, cfg, len(weights))
    return combine.combine(terms, weights, tau)
