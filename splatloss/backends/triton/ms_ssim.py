"""MS-SSIM on Triton: the SSIM kernels at every scale, and a fused 2x2 pyramid step.

``_down_fwd_kernel`` is TF ``ssim_multiscale``'s pyramid step in one pass: an odd side is padded
by repeating its last row / column (bottom / right) and 2x2 blocks are averaged, here by clamping
the read index instead of materialising the padded copy; it reads the input in its own dtype and
strides and writes the half-size image in float32 (the accumulation dtype: fp16 2x2 means would
round). So the pyramid never pads an odd side (the torch path pads a copy). Contiguous fp16 /
bf16 images of one dtype are read as they are, by the pyramid's launch and by the finest scale's
kernels (every coarser scale is float32); other ones are cast to float32 at the top of the op.
Either way every scale's gradient is summed in float32 and rounded to the input dtype once, by
the backward's last store (``_chain_kernel``).
``_down_bwd_kernel`` is its adjoint: each input pixel gets a quarter of its block's upstream
gradient, twice that for the repeated last row / column of an odd side (it stands in both rows /
columns of the block). 4 B read + 1 B-equivalent written per input pixel-channel forward.
:func:`ms_terms` runs every scale's term and the whole pyramid (``_pyramid_kernel``, the same
step at every scale in one launch) in one op, whose backward fuses the adjoint with each scale's
own gradient, every scale in one launch (``_chain_kernel``; ``_down_bwd_kernel`` stays the adjoint
of :func:`downsample2x` called on its own). The terms' weighted product is :mod:`.combine`'s, one
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
from .backward import launch_bwd_scales
from .forward import launch_fwd_scales
from .glue import check_inputs, eager, functorch_guard, refuse_double_backward, with_autograd
from .launch import COLUMN_TAPS, cdiv, device_guard, launch_kernel, launch_options, next_power_of_2
from .split import all_scales_eligible
from .ssim import term_into

__all__ = ["downsample2x", "ms_ssim"]

Tensor = torch.Tensor

WARPS = 4
#: Warps of the whole-pyramid launches: _pyramid_kernel's 8 x 64 tiles of the first coarser scale
#: (4 elements a thread; 1632 programs of 8 make 3.09 waves of an H100's 528, 3060 of 4 make 2.90
#: of its 1056), _chain_kernel's 16 x 128 of the image.
WARPS_PYRAMID = 4
WARPS_CHAIN = 8


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
        launch_kernel(
            _down_fwd_kernel,
            (cdiv(n_rows, rb), cdiv(Wo, block)),
            x,
            out,
            C,
            H,
            W,
            Ho,
            Wo,
            n_rows,
            *x.stride(),
            RB=rb,
            BLOCK=block,
            **launch_options(WARPS),
        )
    return out


# ------------------------------------------------------------------------------------------------
# The whole pyramid in one launch.
#
# Launched once per scale and image, the 2x2 step is eight launches for MS-SSIM's five scales, six
# of them on grids far smaller than the GPU. Here a program owns a tile of the first coarser scale,
# TILE_ROWS x TILE_COLS pixels of one (image, channel), both images, and every coarser scale's tile
# under it (half the rows and columns each step): it writes its tile of one scale, waits at a
# barrier for its own threads, and reads that tile back for the next, the whole way down. A pixel of
# a coarser scale reads its 2x2 block (the repeated last row / column of an odd side included) only
# from its own program's tile of the scale before, so no program waits for another. The arithmetic
# per pixel is _down_fwd_kernel's, the same bits.
# ------------------------------------------------------------------------------------------------

_PYRAMID_SIZES = ("BC", "C", "H", "W")


@triton.jit
def _step_tile(
    src, s_b, s_c, s_h, s_w, dst, b, ch, bc, i0, j0, Hs, Ws, Hd, Wd, R: tl.constexpr, BW: tl.constexpr
):  # fmt: skip
    # rows [i0, i0 + R) x columns [j0, j0 + BW) of the coarser scale (Hd x Wd, contiguous planes at
    # dst) from the scale before (Hs x Ws at src, strides s_*): _down_fwd_kernel's sum per pixel
    i = i0 + tl.arange(0, R)[:, None]
    j = j0 + tl.arange(0, BW)[None, :]
    ok = (i < Hd) & (j < Wd)
    base = src + (b * s_b + ch * s_c)
    row0 = base + (2 * i).to(tl.int64) * s_h
    row1 = base + tl.minimum(2 * i + 1, Hs - 1).to(tl.int64) * s_h  # odd side: the last row stands in
    c0 = (2 * j).to(tl.int64) * s_w
    c1 = tl.minimum(2 * j + 1, Ws - 1).to(tl.int64) * s_w
    v00 = tl.load(row0 + c0, mask=ok, other=0.0).to(tl.float32)
    v01 = tl.load(row0 + c1, mask=ok, other=0.0).to(tl.float32)
    v10 = tl.load(row1 + c0, mask=ok, other=0.0).to(tl.float32)
    v11 = tl.load(row1 + c1, mask=ok, other=0.0).to(tl.float32)
    v = v00 + v01
    v += v10
    v += v11
    tl.store(dst + (bc * Hd + i).to(tl.int64) * Wd + j, 0.25 * v, mask=ok)


@triton.jit(do_not_specialize=_PYRAMID_SIZES)
def _pyramid_kernel(
    x_ptr, y_ptr, xo_ptr, yo_ptr, BC, C, H, W, sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w,
    LEVELS: tl.constexpr, TILE_ROWS: tl.constexpr, TILE_COLS: tl.constexpr,
):  # fmt: skip
    n_tr = tl.cdiv((H + 1) // 2, TILE_ROWS)
    bc = tl.program_id(0) // n_tr
    tr = tl.program_id(0) % n_tr
    b = (bc // C).to(tl.int64)
    ch = (bc % C).to(tl.int64)
    H1 = (H + 1) // 2
    W1 = (W + 1) // 2
    _step_tile(x_ptr, sx_b, sx_c, sx_h, sx_w, xo_ptr, b, ch, bc, tr * TILE_ROWS, tl.program_id(1) * TILE_COLS, H, W,
               H1, W1, TILE_ROWS, TILE_COLS)  # fmt: skip
    _step_tile(y_ptr, sy_b, sy_c, sy_h, sy_w, yo_ptr, b, ch, bc, tr * TILE_ROWS, tl.program_id(1) * TILE_COLS, H, W,
               H1, W1, TILE_ROWS, TILE_COLS)  # fmt: skip
    off = 0
    Hs = H1
    Ws = W1
    for lv in tl.static_range(1, LEVELS):
        tl.debug_barrier()  # this program's tile of the scale before, written by all its threads
        Hd = (Hs + 1) // 2
        Wd = (Ws + 1) // 2
        nxt = off + BC.to(tl.int64) * Hs * Ws
        hw = Hs.to(tl.int64) * Ws
        _step_tile(xo_ptr + off, hw * C, hw, Ws, 1, xo_ptr + nxt, b, ch, bc, tr * (TILE_ROWS >> lv),
                   tl.program_id(1) * (TILE_COLS >> lv), Hs, Ws, Hd, Wd, TILE_ROWS >> lv, TILE_COLS >> lv)  # fmt: skip
        _step_tile(yo_ptr + off, hw * C, hw, Ws, 1, yo_ptr + nxt, b, ch, bc, tr * (TILE_ROWS >> lv),
                   tl.program_id(1) * (TILE_COLS >> lv), Hs, Ws, Hd, Wd, TILE_ROWS >> lv, TILE_COLS >> lv)  # fmt: skip
        off = nxt
        Hs = Hd
        Ws = Wd


def _pyramid_tile(levels: int, H1: int, W1: int, device: torch.device) -> tuple:
    """(rows, columns) of a program's tile of the first coarser scale (``H1 x W1``): powers of two
    that halve ``levels - 1`` times to at least one row and 8 columns; on CUDA 8 x 64 (for up to
    four levels: the image's tile of :func:`_chain_tile`), in the interpreter (one program at a
    time, at a cost per operation) as large as makes about 16k elements."""
    rows, cols = max(8, 1 << (levels - 1)), max(64, 8 << (levels - 1))
    if device.type == "cuda" or launch.FORCE_CUDA_GEOMETRY:
        return rows, cols
    cols = max(cols, min(1024, next_power_of_2(W1)))
    return max(rows, min(next_power_of_2(H1), 16384 // cols)), cols


def _pyramid_into(x: Tensor, y: Tensor, xf: Tensor, yf: Tensor, levels: int) -> None:
    """Every coarser scale of ``x`` and ``y`` (``(B, C, H, W)``, any strides and float dtype) into
    the flat float32 buffers ``xf``, ``yf`` (scale after scale, each contiguous ``(B, C, H_s,
    W_s)``: :func:`_split`), ``levels`` scales, in one launch (:func:`_pyramid_kernel`)."""
    B, C, H, W = x.shape
    rows, cols = _pyramid_tile(levels, (H + 1) // 2, (W + 1) // 2, x.device)
    grid = (B * C * cdiv((H + 1) // 2, rows), cdiv((W + 1) // 2, cols))
    with device_guard(x):
        launch_kernel(_pyramid_kernel, grid,
            x, y, xf, yf, B * C, C, H, W, *x.stride(), *y.stride(), LEVELS=levels, TILE_ROWS=rows, TILE_COLS=cols,
            **launch_options(WARPS_PYRAMID),
        )  # fmt: skip


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
        launch_kernel(
            _down_bwd_kernel,
            (cdiv(n_rows, rb), cdiv(W, block)),
            g,
            out,
            C,
            H,
            W,
            g.shape[2],
            g.shape[3],
            n_rows,
            *g.stride(),
            RB=rb,
            BLOCK=block,
            **launch_options(WARPS),
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
# launch.
#
# Each scale's term is ssim._term_impl's pass (the backward kernel run in the forward for a unit
# upstream gradient per image and channel, its SSIM or cs values summed on the way), each coarser
# pair made by the 2x2 step above. Composed with autograd scale by scale, the backward would be
# three launches per scale, each with full-size traffic: the scale's kept gradient times its
# upstream scalars (read 4 B, write 4 B per pixel-channel), the 2x2 step's adjoint of the coarser
# scale's gradient (read 1 B, write 4 B) and autograd's sum of the two (read 8 B, write 4 B): 25 B
# per pixel-channel and 13 launches for five scales. Here one op holds every scale, so its
# backward is one launch of _chain_kernel, coarsest scale first: grad_j = G_j * d_j + up(grad_(j+1))
# (G_j the kept unit gradient, d_j the [B, C] upstream of scale j's term, up the 2x2 step's
# adjoint), each program walking its own tiles up the pyramid as _pyramid_kernel walks them down:
# 5 B read and 4 B written per pixel-channel (and a third more for the coarser scales' finished
# gradients, written and read back). The arithmetic is the composition's (one product, one
# power-of-two scaling, one sum per pixel), so the interpreter's gradients are bit for bit the
# scale-by-scale composition's; a compiler that contracts the product and the sum into a fused
# multiply-add rounds once instead of twice.
#
# The op keeps what the scale-by-scale terms kept (every scale's float32 unit gradient, for each
# image that needs one); an input that needs a gradient its forward did not compute gets the whole
# forward again, with that gradient. The coarser scales' terms are one launch (with a gradient
# backward.launch_bwd_scales, without forward.launch_fwd_scales): their pairs are made into one
# flat buffer per image, so that their short grids (at one 1080p image 264, 102, 27 and 15
# programs of 25 and 16 rows, each grid's time one program's walk) run side by side, not one after
# the other; their kept gradients are one flat buffer per image too (_split views it). Every
# scale's mean is written straight into the [B, C, M] terms by partials.means: one launch for the
# finest scale, one for the others (in torch, a sum and a division per scale, and a stack).
# ------------------------------------------------------------------------------------------------

_CHAIN_SIZES = ("BC", "C", "H", "W", "M")


@triton.jit
def _level_of(H, W, BC, LV: tl.constexpr):
    # (H_lv, W_lv, where scale lv starts in the flat buffers of scales 1, 2, ...): TF's ceil halves
    Hs = H
    Ws = W
    off = BC.to(tl.int64) * 0
    for k in tl.static_range(1, LV + 1):
        if k > 1:
            off += BC.to(tl.int64) * Hs * Ws  # scale k - 1's planes
        Hs = (Hs + 1) // 2
        Ws = (Ws + 1) // 2
    return Hs, Ws, off


@triton.jit
def _to_bf16(v):
    # float32 -> bfloat16 rounded to nearest, ties to even (as torch and the GPU's conversion round;
    # the interpreter's own cast truncates); a NaN stays a (quiet) NaN
    bits = v.to(tl.uint32, bitcast=True)
    r = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    r = tl.where(v != v, 0x7FC0, r)
    return r.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _up_tile(
    g, g_h, g_w, u, coarse, Wc, out, o_h, o_w, i0, j0, H, W, HAS_COARSE: tl.constexpr, R: tl.constexpr,
    BW: tl.constexpr, BF16: tl.constexpr,
):  # fmt: skip
    # rows [i0, i0 + R) x columns [j0, j0 + BW) of one plane of scale J (H x W; g, out: the kept
    # unit gradient's plane and the output's, coarse: the coarser scale's finished plane, Wc wide):
    # the kept gradient times the scale's upstream u, plus the 2x2 step's adjoint of the coarser one
    r = i0 + tl.arange(0, R)[:, None]
    c = j0 + tl.arange(0, BW)[None, :]
    ok = (r < H) & (c < W)
    v = tl.load(g + r.to(tl.int64) * g_h + c.to(tl.int64) * g_w, mask=ok, other=0.0) * u
    if HAS_COARSE:
        up = tl.load(coarse + (r // 2).to(tl.int64) * Wc + (c // 2), mask=ok, other=0.0)
        # each pixel gets a quarter of its block's gradient; the repeated last row / column of an
        # odd side stands in both rows / columns of its block: twice that (as in _down_bwd_kernel)
        up = up * tl.where((H % 2 == 1) & (r == H - 1), 0.5, 0.25)
        v = v + up * tl.where((W % 2 == 1) & (c == W - 1), 2.0, 1.0)
    if BF16:  # out is bfloat16
        v = _to_bf16(v)
    tl.store(out + r.to(tl.int64) * o_h + c.to(tl.int64) * o_w, v.to(out.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=_CHAIN_SIZES)
def _chain_kernel(
    g0_ptr, gc_ptr, d_ptr, scr_ptr, out_ptr, BC, C, H, W, M, sg_b, sg_c, sg_h, sg_w, so_b, so_c, so_h, so_w,
    LEVELS: tl.constexpr, TILE_ROWS: tl.constexpr, TILE_COLS: tl.constexpr, OUT_BF16: tl.constexpr,
):  # fmt: skip
    # a tile of TILE_ROWS x TILE_COLS of one (image, channel) plane of the finest scale and every
    # coarser scale's tile above it (half the rows and columns each step), coarsest first: each
    # scale's finished tile is written to the scratch planes, read back after a barrier for the
    # finer scale's adjoint (only from this program's own tile), and the finest into the output
    n_tr = tl.cdiv(H, TILE_ROWS)
    bc = tl.program_id(0) // n_tr
    tr = tl.program_id(0) % n_tr
    tc = tl.program_id(1)
    bc64 = bc.to(tl.int64)
    for k in tl.static_range(LEVELS, 0, -1):
        Hs, Ws, off = _level_of(H, W, BC, k)
        plane = off + bc64 * Hs * Ws
        u = tl.load(d_ptr + bc64 * M + k)
        if k < LEVELS:
            tl.debug_barrier()  # the coarser scale's tile, written by all this program's threads
            Hc, Wc, off_c = _level_of(H, W, BC, k + 1)
            _up_tile(gc_ptr + plane, Ws, 1, u, scr_ptr + off_c + bc64 * Hc * Wc, Wc, scr_ptr + plane, Ws, 1,
                     tr * (TILE_ROWS >> k), tc * (TILE_COLS >> k), Hs, Ws, True, TILE_ROWS >> k,
                     TILE_COLS >> k, False)  # fmt: skip
        else:
            _up_tile(gc_ptr + plane, Ws, 1, u, scr_ptr, 1, scr_ptr + plane, Ws, 1, tr * (TILE_ROWS >> k),
                     tc * (TILE_COLS >> k), Hs, Ws, False, TILE_ROWS >> k, TILE_COLS >> k, False)  # fmt: skip
    b = bc64 // C
    ch = bc64 % C
    u = tl.load(d_ptr + bc64 * M)
    if LEVELS > 0:
        tl.debug_barrier()
        Hc, Wc, off_c = _level_of(H, W, BC, 1)
        _up_tile(g0_ptr + b * sg_b + ch * sg_c, sg_h, sg_w, u, scr_ptr + off_c + bc64 * Hc * Wc, Wc,
                 out_ptr + b * so_b + ch * so_c, so_h, so_w, tr * TILE_ROWS, tc * TILE_COLS, H, W, True, TILE_ROWS,
                 TILE_COLS, OUT_BF16)  # fmt: skip
    else:
        _up_tile(g0_ptr + b * sg_b + ch * sg_c, sg_h, sg_w, u, g0_ptr, 1, out_ptr + b * so_b + ch * so_c, so_h,
                 so_w, tr * TILE_ROWS, tc * TILE_COLS, H, W, False, TILE_ROWS, TILE_COLS, OUT_BF16)  # fmt: skip


def _chain_tile(levels: int, H: int, W: int, device: torch.device) -> tuple:
    """(rows, columns) of a program's tile of the finest scale (``H x W``): powers of two that halve
    ``levels`` times to at least one row and 8 columns; on CUDA 16 x 128 (for up to four coarser
    scales), in the interpreter as large as makes about 16k elements."""
    rows, cols = max(16, 1 << levels), max(128, 8 << levels)
    if device.type == "cuda" or launch.FORCE_CUDA_GEOMETRY:
        return rows, cols
    cols = max(cols, min(1024, next_power_of_2(W)))
    return max(rows, min(next_power_of_2(H), 16384 // cols)), cols


def _chain_impl(d: Tensor, g0: Tensor, gc: Tensor, dtype: torch.dtype) -> Tensor:
    """The input's gradient from the finest scale's kept unit gradient ``g0`` (``(B, C, H, W)``),
    the coarser scales' ``gc`` (flat, scale after scale: :func:`_split`) and the ``[B, C, M]``
    upstream of the terms ``d``, in one launch (:func:`_chain_kernel`): summed in float32, rounded
    once to ``dtype`` (the input's) as it is stored, in the layout of ``g0``."""
    d = d.to(torch.float32).contiguous()
    B, C, H, W = g0.shape
    M = d.shape[-1]
    out = torch.empty_like(g0, dtype=dtype)
    scratch = torch.empty_like(gc) if M > 1 else gc
    rows, cols = _chain_tile(M - 1, H, W, g0.device)
    with device_guard(g0):
        launch_kernel(_chain_kernel, (B * C * cdiv(H, rows), cdiv(W, cols)),
            g0, gc if M > 1 else g0, d, scratch if M > 1 else g0, out, B * C, C, H, W, M, *g0.stride(),
            *out.stride(), LEVELS=M - 1, TILE_ROWS=rows, TILE_COLS=cols,
            OUT_BF16=dtype == torch.bfloat16, **launch_options(WARPS_CHAIN),
        )  # fmt: skip
    return out


_chain_op = torch.library.custom_op("splatloss::triton_ms_pyramid_bwd", _chain_impl, mutates_args=())


@_chain_op.register_fake
def _(d, g0, gc, dtype):
    return torch.empty_like(g0, dtype=dtype)


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


def _pyramid_pair(img1: Tensor, img2: Tensor, B: int, C: int, dims):
    """Both images' coarser scales (``dims``), each image's in one flat float32 buffer
    (:func:`_split`): ``(xf, yf)``."""
    total = sum(B * C * h * w for h, w in dims)
    xf = torch.empty(total, dtype=torch.float32, device=img1.device)
    yf = torch.empty(total, dtype=torch.float32, device=img1.device)
    _pyramid_into(img1, img2, xf, yf, len(dims))
    return xf, yf


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
    terms = torch.empty((B, C, scales), dtype=torch.float32, device=dev)  # each scale's mean written in place
    K = window.shape[0]
    every = [(H, W)] + dims
    if all_scales_eligible(img1, img2, every, K, padding, need1, need2):
        # every scale in one pair of launches: the finest scale's programs and the coarser ones'
        # share the waves, so the coarser scales need not fill the GPU on their own; fp16 / bf16
        # images are read as they are (the finest scale's programs convert as they load), their
        # unit gradients float32
        xf, yf = _pyramid_pair(img1, img2, B, C, dims)
        g1_0 = torch.empty_like(img1, dtype=torch.float32) if need1 else None
        g2_0 = torch.empty_like(img2, dtype=torch.float32) if need2 else None
        first = (img1, img2, g1_0, g2_0)
        g1_c, g2_c, _ = launch_bwd_scales(
            xf, yf, B, C, every, window, padding, c1, c2, need1, need2, out=terms, first=first
        )  # fmt: skip
        return [
            terms,
            g1_0 if need1 else empty,
            g1_c if need1 else empty.clone(),
            g2_0 if need2 else empty.clone(),
            g2_c if need2 else empty.clone(),
        ]
    # elsewhere the finest scale's kernels and the pyramid's launch read fp16 / bf16 images as they
    # are where both are contiguous and of one dtype, other ones cast to float32 first; the coarser
    # scales are float32, every unit gradient too
    half = img1.dtype in (torch.float16, torch.bfloat16)
    if not (half and img1.dtype == img2.dtype and img1.is_contiguous() and img2.is_contiguous()):
        img1, img2 = img1.to(torch.float32), img2.to(torch.float32)
    g1_0, g2_0 = term_into(terms[:, :, 0], img1, img2, window, padding, c1, c2, scales > 1, need1, need2)
    if not dims:
        return [terms, g1_0, empty, g2_0, empty.clone()]
    xf, yf = _pyramid_pair(img1, img2, B, C, dims)
    xs, ys = _split(xf, B, C, dims), _split(yf, B, C, dims)
    g1_c = g2_c = None
    coarse = terms[:, :, 1:]
    if (need1 or need2) and K <= COLUMN_TAPS.value:
        g1_c, g2_c, _ = launch_bwd_scales(xf, yf, B, C, dims, window, padding, c1, c2, need1, need2, out=coarse)
    elif K <= COLUMN_TAPS.value:
        launch_fwd_scales(xf, yf, B, C, dims, window, padding, c1, c2, out=coarse)
    else:
        g1_c = torch.empty_like(xf) if need1 else None
        g2_c = torch.empty_like(yf) if need2 else None
        g1s = _split(g1_c, B, C, dims) if need1 else [None] * len(dims)
        g2s = _split(g2_c, B, C, dims) if need2 else [None] * len(dims)
        for j in range(len(dims)):
            cs = j < len(dims) - 1
            term_into(coarse[:, :, j], xs[j], ys[j], window, padding, c1, c2, cs, need1, need2, g1s[j], g2s[j])
    return [
        terms,
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
    chain = _chain_impl if eager(g_terms, img1, img2) else _chain_op
    gx = chain(g_terms, g1_0, g1_c, img1.dtype) if need1 else None
    gy = chain(g_terms, g2_0, g2_c, img2.dtype) if need2 else None
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
    # backward is one launch; the fused step writes float32, and fp16 / bf16 images are copied
    # to float32 inside the op, by the pyramid's launch where they are contiguous (_terms_impl)
    with functorch_guard():
        terms = ms_terms(img1, img2, cfg, len(weights))
    return combine.combine(terms, weights, tau)
