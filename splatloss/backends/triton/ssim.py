"""SSIM on Triton: forward (map or per-image/channel means) and the analytic adjoint backward.

Kernels
-------
(Launch geometry and the streaming scheme are described in ``_common``.)

Each kernel has two bodies, chosen at compile time by the window size:

* column kernels (``K <= COLUMN_TAPS``, the default 11-tap window): one image column per
  thread. The K taps of a row are unrolled into per-thread sums (each thread loads its own taps;
  neighbours share them through L1), and the vertical pass keeps, per statistic, the ``K - 1``
  map rows still open as per-thread pending sums: a new row enters each with one fused
  multiply-add and completes the oldest. No tile reductions, no barrier in the forward, one per
  row in the backward (its horizontal adjoint reads the neighbouring columns' partials). A
  program whose lanes and taps all lie inside the image runs a copy of the row loop whose loads
  have no masks (``_interior``, ``_hmoments``); edge programs run the masked copy. 128 registers
  (16 resident warps per SM), except the "reflect" backward (255).
* ring kernels (13..31 taps): ``[KP, lanes]`` tiles of the taps and a ring of the last rows in an
  L1-resident scratch (registers of the column kernels grow with K: at 13+ taps the heaviest
  backward variants spilled).

``_ssim_fwd_kernel``: one program per (lane group, row chunk, column strip). Streams down the
rows: horizontal K-tap pass of x', y', x'^2 (+ y'^2), x'y' per input row (``x' = x - s``, ``s`` a
local mean), vertical K-tap pass, then either writes the SSIM (and cs) map row, or accumulates
per-lane sums that end as one partial sum per (channel, program) in a ``[B*C, programs]`` buffer
torch adds in a fixed order: no atomics, bitwise reproducible. In "stats_l1" mode it also sums
``|x - y|`` over the pixels each lane owns (the fused 3DGS loss).

``_ssim_bwd_kernel``: one program per (lane group, row chunk, column strip of ``F - (K - 1)``
gradient columns). Computes the moments on the map positions whose windows reach its pixels,
forms the partial derivatives of ``gs * SSIM + gc * cs`` (``gs`` / ``gc`` one scalar per (image,
channel) for the means, or map-sized upstream gradients for ``ssim_map``; ``HAS_CS == 2``: of
``gc * cs`` alone), applies the adjoint window (horizontal through a scratch row, vertical
through pending sums or a ring) and writes both image gradients once; optionally adds an L1 term
``l1 * sign(x - y)`` (the fused photometric loss) and sums the SSIM values (cs with
``HAS_CS == 2``) and ``|x - y|`` it computed on the way: a loss's value and gradient in one pass
(``ssim_term`` and ``dssim_l1`` with a gradient, ``ssim_mean_and_grad``).

Save, recompute, or neither
---------------------------
A loss (``ssim_term``: the mean SSIM or cs per image and channel, under ``splatloss.ssim``,
``dssim_l1`` and every MS-SSIM scale) whose input requires a gradient runs the backward kernel in
its forward, for a unit upstream gradient per (image, channel), summing the SSIM values on the way:
one pass over the moments, which keeps the finished float32 gradient (4 B per pixel-channel and
input) for the backward, which only multiplies it by the upstream scalars. Saving the partial
derivative maps instead (fused-ssim keeps three) would keep 12 B and still need a second pass;
recomputing in the backward (what ``ssim_map`` does, its upstream being a map) computes the
moments twice. Without a gradient to compute (``torch.no_grad()``, evaluation) the forward kernel
runs alone, 8 B read.

Bytes per pixel-channel (fp32 I/O, DRAM traffic; halo re-reads served by L2 and the L1/L2-resident
scratch not counted, see docs/triton.md for both and for what the static cost model says of saving
the partial maps instead):

* ``ssim_stats`` forward: reads x, y = 8 B; writes 2 floats per program (negligible).
* ``ssim_stats`` backward: reads x, y = 8 B; writes grad_x (and grad_y) = 4 B (8 B). 12 B for one
  gradient, so forward + backward = 20 B.
* ``ssim_term`` with a gradient: the backward kernel's 12 B in the forward, then the scaling in the
  backward reads and writes 4 B each: 20 B (fused-ssim ~52 B, FastCUDASSIM.jl ~44 B).
* ``ssim_map`` forward: 8 B + 4 B map (+ 4 B cs map); backward adds the upstream map reads: 4 B
  (+ 4 B) on top of the 12 B above.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ._common import (
    COLUMN_MAXNREG,
    COLUMN_TAPS,
    MAXNREG,
    _hadjoint,
    _hadjoint_cols,
    _hmoments,
    _local_shift,
    _partials,
    _push,
    _row_moments,
    _ssim_cs,
    _taps,
    _vadjoint_taps,
    check_inputs,
    device_guard,
    functorch_guard,
    geometry,
    launch_options,
    out_size,
    padding_code,
    window_taps,
)

__all__ = ["ssim_map", "ssim_stats", "ssim_term", "launch_fwd", "launch_bwd"]


@triton.jit
def _lanes(pid, BC, C, n_chunks, n_strips, F: tl.constexpr, BW: tl.constexpr):
    """Program -> (lane group, row chunk, column strip); per lane: frame column, (b, c), validity."""
    strip = pid % n_strips
    rest = pid // n_strips
    chunk = rest % n_chunks
    group = rest // n_chunks
    ar = tl.arange(0, BW)
    f = ar % F
    bc = group * (BW // F) + ar // F
    lane_ok = bc < BC
    b = (bc // C).to(tl.int64)
    ch = (bc % C).to(tl.int64)
    return group, chunk, strip, f, bc, lane_ok, b, ch


@triton.jit
def _interior(c_first, W, K: tl.constexpr, F: tl.constexpr, BW: tl.constexpr):
    """Whether a program's rows can be read without masks: one channel per program (every lane
    valid) and every tap of every lane inside the row (``c_first``: the input column of lane 0's
    first tap). A scalar: the program takes the unmasked horizontal pass (``_hmoments``) or the
    masked one, the same for every row."""
    if F == BW:
        res = (c_first >= 0) & (c_first + F + K - 2 < W)
    else:
        res = False  # several channels per program: always the masked pass
    return res


#: Size arguments compiled as plain integers: Triton would otherwise specialise each that equals 1 or
#: is a multiple of 16, compiling a new variant for new image sizes / MS-SSIM scales for no gain.
_SIZES = ("BC", "C", "H", "W", "Ho", "Wo", "n_chunks", "n_strips", "ROWS")


@triton.jit
def _fwd_columns(
    x_ptr,
    y_ptr,
    w_ptr,
    s_ptr,
    cs_ptr,
    l1_ptr,
    scr_ptr,
    BC,
    C,
    H,
    W,
    Ho,
    Wo,
    n_chunks,
    n_strips,
    ROWS,
    sx_b,
    sx_c,
    sx_h,
    sx_w,
    sy_b,
    sy_c,
    sy_h,
    sy_w,
    c1,
    c2,
    K: tl.constexpr,
    KP: tl.constexpr,
    PAD: tl.constexpr,
    REFLECT: tl.constexpr,
    F: tl.constexpr,
    BW: tl.constexpr,
    WRITE_MAP: tl.constexpr,
    WRITE_CS: tl.constexpr,
    HAS_L1: tl.constexpr,
    EDGE: tl.constexpr,
):
    pid = tl.program_id(0)
    group, chunk, strip, f, bc, lane_ok, b, ch = _lanes(pid, BC, C, n_chunks, n_strips, F, BW)
    x_base = b * sx_b + ch * sx_c
    y_base = b * sy_b + ch * sy_c
    p_c = strip * F + f  # map column of each lane
    x_lane = x_base + (p_c - PAD).to(tl.int64) * sx_w  # first tap of each lane's window, row 0
    y_lane = y_base + (p_c - PAD).to(tl.int64) * sy_w
    col_ok = lane_ok & (p_c < Wo)
    p_r0 = chunk * ROWS  # first map row of this chunk
    n_rows = tl.minimum(ROWS, Ho - p_r0)
    shift = _local_shift(
        x_ptr,
        y_ptr,
        x_base,
        y_base,
        p_r0,
        n_rows,
        p_c,
        col_ok,
        sx_h,
        sx_w,
        sy_h,
        sy_w,
        F,
        BW,
    )
    wt = _taps(w_ptr, K)
    zero = tl.zeros([BW], dtype=tl.float32)
    # pending vertical sums: slot j of map row p_r0 + i - (K - 1) + j + 1 (row p_r0 + i - (K - 1)
    # completes at step i)
    v1 = (zero,) * (K - 1)
    v2 = (zero,) * (K - 1)
    v11 = (zero,) * (K - 1)
    v12 = (zero,) * (K - 1)
    acc_s = zero
    acc_c = zero
    acc_l1 = zero
    # L1 ownership: each input pixel is counted by one lane and one row step. Lane p_c owns
    # input column p_c (tap PAD); with "valid" the last map column also owns the K - 1 columns
    # past the map, and the last chunk the rows past it.
    last_col = p_c == Wo - 1
    last_chunk = p_r0 + n_rows == Ho
    for i in tl.range(0, n_rows + K - 1, num_stages=1):
        # padded input row p_r0 - PAD + i enters; map row p = p_r0 + i - (K - 1) completes
        r_in = p_r0 - PAD + i
        h1, h2, h11, h12, l1_row = _hmoments(
            x_ptr, y_ptr, x_lane, y_lane, r_in, p_c - PAD, H, W, sx_h, sx_w, sy_h, sy_w,
            lane_ok, col_ok, last_col, shift, wt, K, PAD, REFLECT, HAS_L1, EDGE,
        )  # fmt: skip
        if HAS_L1:
            row_own = ((r_in >= p_r0) & (r_in < p_r0 + n_rows)) | (last_chunk & (r_in >= Ho) & (r_in < H))
            acc_l1 += tl.where(row_own, l1_row, 0.0)
        mu1, v1 = _push(v1, h1, wt, K, True)
        mu2, v2 = _push(v2, h2, wt, K, True)
        e11, v11 = _push(v11, h11, wt, K, True)  # E[x'^2] + E[y'^2]: only their sum enters B2
        e12, v12 = _push(v12, h12, wt, K, True)
        ssim, cs = _ssim_cs(mu1, mu2, e11, None, e12, c1, c2, shift)
        p = p_r0 + i - (K - 1)
        ok = col_ok & (i >= K - 1)
        if WRITE_MAP:
            # maps are contiguous [B*C, Ho, Wo]
            offs = (bc.to(tl.int64) * Ho + p) * Wo + p_c
            tl.store(s_ptr + offs, ssim, mask=ok)
            if WRITE_CS:
                tl.store(cs_ptr + offs, cs, mask=ok)
        else:
            acc_s += tl.where(ok, ssim, 0.0)
            acc_c += tl.where(ok, cs, 0.0)
    if not WRITE_MAP:
        # one partial sum per (channel, chunk, strip): [BC, n_chunks * n_strips]
        G: tl.constexpr = BW // F
        gbc = group * G + tl.arange(0, G)
        offs = gbc.to(tl.int64) * (n_chunks * n_strips) + chunk * n_strips + strip
        tl.store(s_ptr + offs, tl.sum(tl.reshape(acc_s, [G, F]), axis=1), mask=gbc < BC)
        tl.store(cs_ptr + offs, tl.sum(tl.reshape(acc_c, [G, F]), axis=1), mask=gbc < BC)
        if HAS_L1:
            tl.store(
                l1_ptr + offs,
                tl.sum(tl.reshape(acc_l1, [G, F]), axis=1),
                mask=gbc < BC,
            )


@triton.jit(do_not_specialize=_SIZES)
def _ssim_fwd_kernel(
    x_ptr,
    y_ptr,
    w_ptr,
    s_ptr,
    cs_ptr,
    l1_ptr,
    scr_ptr,
    BC,
    C,
    H,
    W,
    Ho,
    Wo,
    n_chunks,
    n_strips,
    ROWS,
    sx_b,
    sx_c,
    sx_h,
    sx_w,
    sy_b,
    sy_c,
    sy_h,
    sy_w,
    c1,
    c2,
    K: tl.constexpr,
    KP: tl.constexpr,
    PAD: tl.constexpr,
    REFLECT: tl.constexpr,
    F: tl.constexpr,
    BW: tl.constexpr,
    WRITE_MAP: tl.constexpr,
    WRITE_CS: tl.constexpr,
    HAS_L1: tl.constexpr,
):
    if K <= COLUMN_TAPS:
        # interior programs read their rows without masks (``_hmoments``); one loop or the other
        strip = tl.program_id(0) % n_strips
        if _interior(strip * F - PAD, W, K, F, BW):
            _fwd_columns(
                x_ptr, y_ptr, w_ptr, s_ptr, cs_ptr, l1_ptr, scr_ptr, BC, C, H, W, Ho, Wo, n_chunks, n_strips, ROWS,
                sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, c1, c2, K, KP, PAD, REFLECT, F, BW, WRITE_MAP, WRITE_CS,
                HAS_L1, False
            )  # fmt: skip
        else:
            _fwd_columns(
                x_ptr, y_ptr, w_ptr, s_ptr, cs_ptr, l1_ptr, scr_ptr, BC, C, H, W, Ho, Wo, n_chunks, n_strips, ROWS,
                sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, c1, c2, K, KP, PAD, REFLECT, F, BW, WRITE_MAP, WRITE_CS,
                HAS_L1, True
            )  # fmt: skip
    else:
        pid = tl.program_id(0)
        group, chunk, strip, f, bc, lane_ok, b, ch = _lanes(pid, BC, C, n_chunks, n_strips, F, BW)
        x_base = b * sx_b + ch * sx_c
        y_base = b * sy_b + ch * sy_c
        ar = tl.arange(0, BW)
        slots = tl.arange(0, KP)
        p_c = strip * F + f  # map column of each lane
        col_ok = lane_ok & (p_c < Wo)
        p_r0 = chunk * ROWS  # first map row of this chunk
        n_rows = tl.minimum(ROWS, Ho - p_r0)
        shift = _local_shift(
            x_ptr,
            y_ptr,
            x_base,
            y_base,
            p_r0,
            n_rows,
            p_c,
            col_ok,
            sx_h,
            sx_w,
            sy_h,
            sy_w,
            F,
            BW,
        )

        # scratch: 5 rings of the last KP horizontal-pass rows (slot i % KP), zeroed so that rows not
        # yet written (weight 0) cannot inject NaN
        ring = scr_ptr + pid.to(tl.int64) * (5 * KP * BW)
        ring_offs = slots[:, None] * BW + ar[None, :]  # [KP, BW]
        for j in tl.static_range(5):
            tl.store(ring + j * KP * BW + ring_offs, tl.zeros([KP, BW], dtype=tl.float32))
        acc_s = tl.zeros([BW], dtype=tl.float32)
        acc_c = tl.zeros([BW], dtype=tl.float32)
        acc_l1 = tl.zeros([BW], dtype=tl.float32)
        # L1 ownership: each input pixel is counted by one lane and one row step. Lane p_c owns
        # input column p_c (tap PAD); with "valid" the last map column also owns the K - 1 columns
        # past the map, and the last chunk the rows past it.
        own_lo = tl.where(col_ok, PAD, K)
        if PAD == 0:
            own_hi = tl.where(col_ok, tl.where(p_c == Wo - 1, K, 1), 0)
        else:
            own_hi = tl.where(col_ok, PAD + 1, 0)
        last_chunk = p_r0 + n_rows == Ho
        for i in range(0, n_rows + K - 1):
            # padded input row p_r0 - PAD + i enters the ring
            r_in = p_r0 - PAD + i
            row_own = ((r_in >= p_r0) & (r_in < p_r0 + n_rows)) | (last_chunk & (r_in >= Ho) & (r_in < H))
            h1, h2, h11, h22, h12, l1_row = _row_moments(
                x_ptr,
                y_ptr,
                x_base,
                y_base,
                r_in,
                p_c - PAD,
                H,
                W,
                sx_h,
                sx_w,
                sy_h,
                sy_w,
                w_ptr,
                lane_ok,
                own_lo,
                own_hi,
                shift,
                K,
                KP,
                REFLECT,
                HAS_L1,
                F == BW,
            )
            if HAS_L1:
                acc_l1 += tl.where(row_own, l1_row, 0.0)
            slot = ring + (i % KP) * BW + ar
            tl.store(slot, h1)
            tl.store(slot + KP * BW, h2)
            tl.store(slot + 2 * KP * BW, h11)
            tl.store(slot + 3 * KP * BW, h22)
            tl.store(slot + 4 * KP * BW, h12)
            tl.debug_barrier()
            # map row p = p_r0 + i - (K - 1) uses the K newest rows: a slot written g rows ago holds tap K-1-g
            age = (i - slots + KP) % KP
            wv = tl.load(w_ptr + (K - 1 - age), mask=age < K, other=0.0)[:, None]
            live = (age < K)[:, None]  # only the K newest rows: 0 * NaN of an older row would be NaN
            mu1 = tl.sum(tl.load(ring + ring_offs, mask=live, other=0.0) * wv, axis=0)
            mu2 = tl.sum(tl.load(ring + KP * BW + ring_offs, mask=live, other=0.0) * wv, axis=0)
            e11 = tl.sum(
                tl.load(ring + 2 * KP * BW + ring_offs, mask=live, other=0.0) * wv,
                axis=0,
            )
            e22 = tl.sum(
                tl.load(ring + 3 * KP * BW + ring_offs, mask=live, other=0.0) * wv,
                axis=0,
            )
            e12 = tl.sum(
                tl.load(ring + 4 * KP * BW + ring_offs, mask=live, other=0.0) * wv,
                axis=0,
            )
            ssim, cs = _ssim_cs(mu1, mu2, e11, e22, e12, c1, c2, shift)
            p = p_r0 + i - (K - 1)
            ok = col_ok & (i >= K - 1)
            if WRITE_MAP:
                # maps are contiguous [B*C, Ho, Wo]
                offs = (bc.to(tl.int64) * Ho + p) * Wo + p_c
                tl.store(s_ptr + offs, ssim, mask=ok)
                if WRITE_CS:
                    tl.store(cs_ptr + offs, cs, mask=ok)
            else:
                acc_s += tl.where(ok, ssim, 0.0)
                acc_c += tl.where(ok, cs, 0.0)
        if not WRITE_MAP:
            # one partial sum per (channel, chunk, strip): [BC, n_chunks * n_strips]
            G: tl.constexpr = BW // F
            gbc = group * G + tl.arange(0, G)
            offs = gbc.to(tl.int64) * (n_chunks * n_strips) + chunk * n_strips + strip
            tl.store(s_ptr + offs, tl.sum(tl.reshape(acc_s, [G, F]), axis=1), mask=gbc < BC)
            tl.store(cs_ptr + offs, tl.sum(tl.reshape(acc_c, [G, F]), axis=1), mask=gbc < BC)
            if HAS_L1:
                tl.store(
                    l1_ptr + offs,
                    tl.sum(tl.reshape(acc_l1, [G, F]), axis=1),
                    mask=gbc < BC,
                )


@triton.jit
def _bwd_columns(
    x_ptr,
    y_ptr,
    w_ptr,
    gs_ptr,
    gc_ptr,
    l1_ptr,
    gx_ptr,
    gy_ptr,
    scr_ptr,
    sum_ptr,
    BC,
    C,
    H,
    W,
    Ho,
    Wo,
    n_chunks,
    n_strips,
    ROWS,
    sx_b,
    sx_c,
    sx_h,
    sx_w,
    sy_b,
    sy_c,
    sy_h,
    sy_w,
    sg_b,
    sg_c,
    sg_h,
    sg_w,
    so_b,
    so_c,
    so_h,
    so_w,
    c1,
    c2,
    K: tl.constexpr,
    KP: tl.constexpr,
    PAD: tl.constexpr,
    REFLECT: tl.constexpr,
    F: tl.constexpr,
    BW: tl.constexpr,
    UPSTREAM_MAP: tl.constexpr,
    HAS_CS: tl.constexpr,
    HAS_L1: tl.constexpr,
    NEED1: tl.constexpr,
    NEED2: tl.constexpr,
    WRITE_SUMS: tl.constexpr,
    EDGE: tl.constexpr,
):
    pid = tl.program_id(0)
    group, chunk, strip, f, bc, lane_ok, b, ch = _lanes(pid, BC, C, n_chunks, n_strips, F, BW)
    x_base = b * sx_b + ch * sx_c
    y_base = b * sy_b + ch * sy_c
    o_base = b * so_b + ch * so_c
    ar = tl.arange(0, BW)

    STEP: tl.constexpr = F - (K - 1)  # gradient columns per strip
    q_c0 = strip * STEP
    q_c = q_c0 + f  # gradient column of each lane (valid for f < STEP)
    qcol_ok = lane_ok & (f < STEP) & (q_c < W)
    p_c = q_c0 - (K - 1) + PAD + f  # map column whose partials the lane holds
    pcol_ok = lane_ok & (p_c >= 0) & (p_c < Wo)
    own_c = pcol_ok & (p_c >= q_c0) & (p_c < q_c0 + STEP)  # map columns this strip sums
    x_lane = x_base + (p_c - PAD).to(tl.int64) * sx_w  # first tap of each lane's window, row 0
    y_lane = y_base + (p_c - PAD).to(tl.int64) * sy_w
    q_r0 = chunk * ROWS
    n_rows = tl.minimum(ROWS, H - q_r0)
    shift = _local_shift(
        x_ptr,
        y_ptr,
        x_base,
        y_base,
        q_r0,
        n_rows,
        q_c,
        qcol_ok,
        sx_h,
        sx_w,
        sy_h,
        sy_w,
        F,
        BW,
    )
    wt = _taps(w_ptr, K)
    zero = tl.zeros([BW], dtype=tl.float32)

    # scratch (stays in L1/L2): two rows of up to 4 partials (double-buffered: one barrier per
    # row), read back at shifted columns by the horizontal adjoint
    scr = scr_ptr + pid.to(tl.int64) * (8 * BW + 32)

    # per-channel scalars: one value per program when it holds one channel (uniform registers)
    sel = group if F == BW else bc
    sel_ok = True if F == BW else lane_ok
    if UPSTREAM_MAP:
        g_base = b * sg_b + ch * sg_c
    else:
        gs = tl.load(gs_ptr + sel, mask=sel_ok, other=0.0).to(tl.float32)
        if HAS_CS:
            gc = tl.load(gc_ptr + sel, mask=sel_ok, other=0.0).to(tl.float32)
        else:
            gc = 0.0
    if HAS_L1:
        l1 = tl.load(l1_ptr + sel, mask=sel_ok, other=0.0).to(tl.float32)
    acc_s = zero  # the SSIM map's sum (cs in cs-only mode, where _partials returns cs for it)
    acc_l = zero
    # pending vertical sums of the moments (slot j: map row j + 1 steps ahead) and of the
    # horizontally adjoined partials (slot j: gradient row j + 1 steps ahead)
    v1 = (zero,) * (K - 1)
    v2 = (zero,) * (K - 1)
    v11 = (zero,) * (K - 1)
    v12 = (zero,) * (K - 1)
    a_sq = (zero,) * (K - 1)
    a_xy = (zero,) * (K - 1)
    a_1 = (zero,) * (K - 1)
    a_2 = (zero,) * (K - 1)
    for i in tl.range(0, n_rows + 2 * (K - 1), num_stages=1):
        # 1. padded input row r enters; moments of map row p = r - (K - 1) + PAD complete
        r = q_r0 - (K - 1) + i
        h1, h2, h11, h12, _ = _hmoments(
            x_ptr, y_ptr, x_lane, y_lane, r, p_c - PAD, H, W, sx_h, sx_w, sy_h, sy_w,
            lane_ok, lane_ok, lane_ok, shift, wt, K, PAD, REFLECT, False, EDGE,
        )  # fmt: skip
        mu1, v1 = _push(v1, h1, wt, K, True)
        mu2, v2 = _push(v2, h2, wt, K, True)
        e11, v11 = _push(v11, h11, wt, K, True)  # E[x'^2] + E[y'^2]: only their sum enters B2
        e12, v12 = _push(v12, h12, wt, K, True)

        # 2. partial derivatives on map row p; zero off the map
        p = r - (K - 1) + PAD
        valid = pcol_ok & (i >= K - 1) & (p >= 0) & (p < Ho)
        if UPSTREAM_MAP:
            g_offs = g_base + p.to(tl.int64) * sg_h + p_c.to(tl.int64) * sg_w
            gs = tl.load(gs_ptr + g_offs, mask=valid, other=0.0).to(tl.float32)
            if HAS_CS:
                gc = tl.load(gc_ptr + g_offs, mask=valid, other=0.0).to(tl.float32)
            else:
                gc = 0.0
        d1, d2, dsq, dxy, ssim, cs = _partials(mu1, mu2, e11, None, e12, gs, gc, c1, c2, shift, HAS_CS)
        if WRITE_SUMS:
            own = valid & own_c & (p >= q_r0) & (p < q_r0 + n_rows)
            acc_s += tl.where(own, ssim, 0.0)

        # 3. horizontal adjoint through the scratch row
        buf = scr + (i % 2) * (4 * BW)
        tl.store(buf + ar, tl.where(valid, dsq, 0.0))
        tl.store(buf + BW + ar, tl.where(valid, dxy, 0.0))
        if NEED1:
            tl.store(buf + 2 * BW + ar, tl.where(valid, d1, 0.0))
        if NEED2:
            tl.store(buf + 3 * BW + ar, tl.where(valid, d2, 0.0))
        tl.debug_barrier()
        h_sq = _hadjoint_cols(buf, w_ptr, wt, q_c0, W, f, F, BW, K, PAD, REFLECT)
        h_xy = _hadjoint_cols(buf + BW, w_ptr, wt, q_c0, W, f, F, BW, K, PAD, REFLECT)

        # 4. vertical adjoint: map row p enters gradient rows q = p - PAD + j with tap j (and the
        #    mirrored taps under "reflect"); gradient row q = p - PAD completes
        wa = _vadjoint_taps(w_ptr, wt, p, H, K, PAD, REFLECT)
        g_sq, a_sq = _push(a_sq, h_sq, wa, K, False)
        g_xy, a_xy = _push(a_xy, h_xy, wa, K, False)
        q = p - PAD
        out = qcol_ok & (i >= 2 * (K - 1)) & (q < q_r0 + n_rows)
        q64 = q.to(tl.int64)
        # gradient column q_c is the last tap of the lane's window: K - 1 columns past its start
        xq = tl.load(x_ptr + x_lane + q64 * sx_h + (K - 1) * sx_w, mask=out, other=0.0).to(tl.float32) - shift
        yq = tl.load(y_ptr + y_lane + q64 * sy_h + (K - 1) * sy_w, mask=out, other=0.0).to(tl.float32) - shift
        o_offs = o_base + q64 * so_h + q_c.to(tl.int64) * so_w
        if HAS_L1:
            dl = xq - yq
            l1_term = l1 * (tl.where(dl > 0, 1.0, 0.0) - tl.where(dl < 0, 1.0, 0.0))
            if WRITE_SUMS:
                acc_l += tl.where(out, tl.abs(dl), 0.0)
        if NEED1:
            g1, a_1 = _push(
                a_1,
                _hadjoint_cols(buf + 2 * BW, w_ptr, wt, q_c0, W, f, F, BW, K, PAD, REFLECT),
                wa,
                K,
                False,
            )
            gx = g1 + 2.0 * xq * g_sq + yq * g_xy
            if HAS_L1:
                gx += l1_term
            tl.store(gx_ptr + o_offs, gx.to(gx_ptr.dtype.element_ty), mask=out)
        if NEED2:
            g2, a_2 = _push(
                a_2,
                _hadjoint_cols(buf + 3 * BW, w_ptr, wt, q_c0, W, f, F, BW, K, PAD, REFLECT),
                wa,
                K,
                False,
            )
            gy = g2 + 2.0 * yq * g_sq + xq * g_xy
            if HAS_L1:
                gy -= l1_term
            tl.store(gy_ptr + o_offs, gy.to(gy_ptr.dtype.element_ty), mask=out)
    if WRITE_SUMS:
        # per program and channel: the SSIM (cs) and, with HAS_L1, |x - y| sums of the pixels it owns
        # (the program's slot from its id again: its group, chunk and strip need not stay live)
        G: tl.constexpr = BW // F
        prog = tl.program_id(0)
        per_group = n_chunks * n_strips
        gbc = (prog // per_group) * G + tl.arange(0, G)
        offs = 2 * (gbc.to(tl.int64) * per_group + prog % per_group)
        tl.store(sum_ptr + offs, tl.sum(tl.reshape(acc_s, [G, F]), axis=1), mask=gbc < BC)
        if HAS_L1:
            tl.store(sum_ptr + offs + 1, tl.sum(tl.reshape(acc_l, [G, F]), axis=1), mask=gbc < BC)


@triton.jit(do_not_specialize=_SIZES)
def _ssim_bwd_kernel(
    x_ptr,
    y_ptr,
    w_ptr,
    gs_ptr,
    gc_ptr,
    l1_ptr,
    gx_ptr,
    gy_ptr,
    scr_ptr,
    sum_ptr,
    BC,
    C,
    H,
    W,
    Ho,
    Wo,
    n_chunks,
    n_strips,
    ROWS,
    sx_b,
    sx_c,
    sx_h,
    sx_w,
    sy_b,
    sy_c,
    sy_h,
    sy_w,
    sg_b,
    sg_c,
    sg_h,
    sg_w,
    so_b,
    so_c,
    so_h,
    so_w,
    c1,
    c2,
    K: tl.constexpr,
    KP: tl.constexpr,
    PAD: tl.constexpr,
    REFLECT: tl.constexpr,
    F: tl.constexpr,
    BW: tl.constexpr,
    UPSTREAM_MAP: tl.constexpr,
    HAS_CS: tl.constexpr,
    HAS_L1: tl.constexpr,
    NEED1: tl.constexpr,
    NEED2: tl.constexpr,
    WRITE_SUMS: tl.constexpr,
):
    if K <= COLUMN_TAPS:
        # interior programs read their rows without masks (``_hmoments``); one loop or the other
        strip = tl.program_id(0) % n_strips
        if _interior(strip * (F - (K - 1)) - (K - 1), W, K, F, BW):
            _bwd_columns(
                x_ptr, y_ptr, w_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr, BC, C, H, W, Ho, Wo,
                n_chunks, n_strips, ROWS, sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sg_b, sg_c, sg_h, sg_w, so_b,
                so_c, so_h, so_w, c1, c2, K, KP, PAD, REFLECT, F, BW, UPSTREAM_MAP, HAS_CS, HAS_L1, NEED1, NEED2,
                WRITE_SUMS, False
            )  # fmt: skip
        else:
            _bwd_columns(
                x_ptr, y_ptr, w_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr, BC, C, H, W, Ho, Wo,
                n_chunks, n_strips, ROWS, sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sg_b, sg_c, sg_h, sg_w, so_b,
                so_c, so_h, so_w, c1, c2, K, KP, PAD, REFLECT, F, BW, UPSTREAM_MAP, HAS_CS, HAS_L1, NEED1, NEED2,
                WRITE_SUMS, True
            )  # fmt: skip
    else:
        pid = tl.program_id(0)
        group, chunk, strip, f, bc, lane_ok, b, ch = _lanes(pid, BC, C, n_chunks, n_strips, F, BW)
        x_base = b * sx_b + ch * sx_c
        y_base = b * sy_b + ch * sy_c
        o_base = b * so_b + ch * so_c
        ar = tl.arange(0, BW)
        slots = tl.arange(0, KP)

        STEP: tl.constexpr = F - (K - 1)  # gradient columns per strip
        q_c0 = strip * STEP
        q_c = q_c0 + f  # gradient column of each lane (valid for f < STEP)
        qcol_ok = lane_ok & (f < STEP) & (q_c < W)
        p_c = q_c0 - (K - 1) + PAD + f  # map column whose partials the lane holds
        pcol_ok = lane_ok & (p_c >= 0) & (p_c < Wo)
        own_c = pcol_ok & (p_c >= q_c0) & (p_c < q_c0 + STEP)  # map columns this strip sums
        q_r0 = chunk * ROWS
        n_rows = tl.minimum(ROWS, H - q_r0)
        shift = _local_shift(
            x_ptr,
            y_ptr,
            x_base,
            y_base,
            q_r0,
            n_rows,
            q_c,
            qcol_ok,
            sx_h,
            sx_w,
            sy_h,
            sy_w,
            F,
            BW,
        )

        # scratch (stays in L1/L2): two 4-row buffers of partials (double-buffered: one barrier per
        # row suffices), 4 rings of horizontally-adjoined partial rows, 5 rings of moment rows
        scr = scr_ptr + pid.to(tl.int64) * ((8 + 9 * KP) * BW)
        aring = scr + 8 * BW
        mring = aring + 4 * KP * BW
        ring_offs = slots[:, None] * BW + ar[None, :]  # [KP, BW]
        for j in tl.static_range(9):
            tl.store(aring + j * KP * BW + ring_offs, tl.zeros([KP, BW], dtype=tl.float32))

        if UPSTREAM_MAP:
            g_base = b * sg_b + ch * sg_c
        else:
            gs = tl.load(gs_ptr + bc, mask=lane_ok, other=0.0).to(tl.float32)
            if HAS_CS:
                gc = tl.load(gc_ptr + bc, mask=lane_ok, other=0.0).to(tl.float32)
            else:
                gc = 0.0
        if HAS_L1:
            l1 = tl.load(l1_ptr + bc, mask=lane_ok, other=0.0).to(tl.float32)
        acc_s = tl.zeros([BW], dtype=tl.float32)
        acc_l = tl.zeros([BW], dtype=tl.float32)
        for i in range(0, n_rows + 2 * (K - 1)):
            # 1. padded input row r enters; moments of map row p = r - (K - 1) + PAD
            r = q_r0 - (K - 1) + i
            h1, h2, h11, h22, h12, _ = _row_moments(
                x_ptr,
                y_ptr,
                x_base,
                y_base,
                r,
                q_c0 - (K - 1) + f,
                H,
                W,
                sx_h,
                sx_w,
                sy_h,
                sy_w,
                w_ptr,
                lane_ok,
                f,
                f,
                shift,
                K,
                KP,
                REFLECT,
                False,
                F == BW,
            )
            mslot = mring + (i % KP) * BW + ar
            tl.store(mslot, h1)
            tl.store(mslot + KP * BW, h2)
            tl.store(mslot + 2 * KP * BW, h11)
            tl.store(mslot + 3 * KP * BW, h22)
            tl.store(mslot + 4 * KP * BW, h12)
            tl.debug_barrier()
            age = (i - slots + KP) % KP
            wv = tl.load(w_ptr + (K - 1 - age), mask=age < K, other=0.0)[:, None]
            live = (age < K)[:, None]  # only the K newest rows: 0 * NaN of an older row would be NaN
            mu1 = tl.sum(tl.load(mring + ring_offs, mask=live, other=0.0) * wv, axis=0)
            mu2 = tl.sum(tl.load(mring + KP * BW + ring_offs, mask=live, other=0.0) * wv, axis=0)
            e11 = tl.sum(
                tl.load(mring + 2 * KP * BW + ring_offs, mask=live, other=0.0) * wv,
                axis=0,
            )
            e22 = tl.sum(
                tl.load(mring + 3 * KP * BW + ring_offs, mask=live, other=0.0) * wv,
                axis=0,
            )
            e12 = tl.sum(
                tl.load(mring + 4 * KP * BW + ring_offs, mask=live, other=0.0) * wv,
                axis=0,
            )

            # 2. partial derivatives on map row p; zero off the map
            p = r - (K - 1) + PAD
            valid = pcol_ok & (i >= K - 1) & (p >= 0) & (p < Ho)
            if UPSTREAM_MAP:
                g_offs = g_base + p.to(tl.int64) * sg_h + p_c.to(tl.int64) * sg_w
                gs = tl.load(gs_ptr + g_offs, mask=valid, other=0.0).to(tl.float32)
                if HAS_CS:
                    gc = tl.load(gc_ptr + g_offs, mask=valid, other=0.0).to(tl.float32)
                else:
                    gc = 0.0
            d1, d2, dsq, dxy, ssim, cs = _partials(mu1, mu2, e11, e22, e12, gs, gc, c1, c2, shift, HAS_CS)
            if WRITE_SUMS:
                own = valid & own_c & (p >= q_r0) & (p < q_r0 + n_rows)
                acc_s += tl.where(own, ssim, 0.0)

            # 3. horizontal adjoint through the scratch row
            buf = scr + (i % 2) * (4 * BW) + ar
            tl.store(buf, tl.where(valid, dsq, 0.0))
            tl.store(buf + BW, tl.where(valid, dxy, 0.0))
            if NEED1:
                tl.store(buf + 2 * BW, tl.where(valid, d1, 0.0))
            if NEED2:
                tl.store(buf + 3 * BW, tl.where(valid, d2, 0.0))
            tl.debug_barrier()
            buf = scr + (i % 2) * (4 * BW)
            aslot = aring + (i % KP) * BW + ar
            tl.store(aslot, _hadjoint(buf, w_ptr, q_c0, W, f, F, BW, K, KP, PAD, REFLECT))
            tl.store(
                aslot + KP * BW,
                _hadjoint(buf + BW, w_ptr, q_c0, W, f, F, BW, K, KP, PAD, REFLECT),
            )
            if NEED1:
                tl.store(
                    aslot + 2 * KP * BW,
                    _hadjoint(buf + 2 * BW, w_ptr, q_c0, W, f, F, BW, K, KP, PAD, REFLECT),
                )
            if NEED2:
                tl.store(
                    aslot + 3 * KP * BW,
                    _hadjoint(buf + 3 * BW, w_ptr, q_c0, W, f, F, BW, K, KP, PAD, REFLECT),
                )
            tl.debug_barrier()

            # 4. vertical adjoint: gradient row q = p - PAD gathers map rows q + PAD - g (ring age g)
            #    with tap g, plus the taps through its mirror images under "reflect"
            q = p - PAD
            wa = tl.load(w_ptr + age, mask=age < K, other=0.0)
            if REFLECT:
                dt = age - 2 * q  # through padded row -q
                wa += tl.load(
                    w_ptr + dt,
                    mask=(age < K) & (q >= 1) & (q <= PAD) & (dt >= 0) & (dt < K),
                    other=0.0,
                )
                db = 2 * (H - 1) - 2 * q + age  # through padded row 2 (H - 1) - q
                wa += tl.load(
                    w_ptr + db,
                    mask=(age < K) & (q >= H - 1 - PAD) & (q <= H - 2) & (db >= 0) & (db < K),
                    other=0.0,
                )
            wa = wa[:, None]
            out = qcol_ok & (i >= 2 * (K - 1)) & (q < q_r0 + n_rows)
            q64 = q.to(tl.int64)
            xq = (
                tl.load(
                    x_ptr + x_base + q64 * sx_h + q_c.to(tl.int64) * sx_w,
                    mask=out,
                    other=0.0,
                ).to(tl.float32)
                - shift
            )
            yq = (
                tl.load(
                    y_ptr + y_base + q64 * sy_h + q_c.to(tl.int64) * sy_w,
                    mask=out,
                    other=0.0,
                ).to(tl.float32)
                - shift
            )
            g_sq = tl.sum(tl.load(aring + ring_offs, mask=live, other=0.0) * wa, axis=0)
            g_xy = tl.sum(tl.load(aring + KP * BW + ring_offs, mask=live, other=0.0) * wa, axis=0)
            o_offs = o_base + q64 * so_h + q_c.to(tl.int64) * so_w
            if HAS_L1:
                dl = xq - yq
                l1_term = l1 * (tl.where(dl > 0, 1.0, 0.0) - tl.where(dl < 0, 1.0, 0.0))
                if WRITE_SUMS:
                    acc_l += tl.where(out, tl.abs(dl), 0.0)
            if NEED1:
                gx = (
                    tl.sum(
                        tl.load(aring + 2 * KP * BW + ring_offs, mask=live, other=0.0) * wa,
                        axis=0,
                    )
                    + 2.0 * xq * g_sq
                    + yq * g_xy
                )
                if HAS_L1:
                    gx += l1_term
                tl.store(gx_ptr + o_offs, gx.to(gx_ptr.dtype.element_ty), mask=out)
            if NEED2:
                gy = (
                    tl.sum(
                        tl.load(aring + 3 * KP * BW + ring_offs, mask=live, other=0.0) * wa,
                        axis=0,
                    )
                    + 2.0 * yq * g_sq
                    + xq * g_xy
                )
                if HAS_L1:
                    gy -= l1_term
                tl.store(gy_ptr + o_offs, gy.to(gy_ptr.dtype.element_ty), mask=out)
        if WRITE_SUMS:
            # per program and channel: the SSIM (cs) and, with HAS_L1, |x - y| sums of the pixels it owns
            # (the program's slot from its id again: its group, chunk and strip need not stay live)
            G: tl.constexpr = BW // F
            prog = tl.program_id(0)
            per_group = n_chunks * n_strips
            gbc = (prog // per_group) * G + tl.arange(0, G)
            offs = 2 * (gbc.to(tl.int64) * per_group + prog % per_group)
            tl.store(sum_ptr + offs, tl.sum(tl.reshape(acc_s, [G, F]), axis=1), mask=gbc < BC)
            if HAS_L1:
                tl.store(sum_ptr + offs + 1, tl.sum(tl.reshape(acc_l, [G, F]), axis=1), mask=gbc < BC)


# ------------------------------------------------------------------------------------------------
# Launchers (plain functions on tensors; the custom ops below call them)
# ------------------------------------------------------------------------------------------------


def _geometry(img1, window, padding: str):
    B, C, H, W = img1.shape
    K = window.shape[0]
    code = padding_code(padding)
    pad = 0 if code == 0 else K // 2
    return (
        B,
        C,
        H,
        W,
        K,
        pad,
        code == 2,
        out_size(H, K, padding),
        out_size(W, K, padding),
    )


def launch_fwd(img1, img2, window, padding: str, c1: float, c2: float, mode: str):
    """Run the forward kernel. ``mode``: "stats" -> ``(ssim_sum, cs_sum)``, each ``[B, C]`` fp32
    sums over the map; "stats_l1" -> ``(ssim_sum, cs_sum, abs_diff_sum)``, the last summed over
    the image (the fused photometric loss); "map" -> ``(ssim_map, empty)``; "map_cs" ->
    ``(ssim_map, cs_map)``."""
    B, C, H, W, K, pad, reflect, Ho, Wo = _geometry(img1, window, padding)
    BC = B * C
    geo = geometry(Wo, Ho, K, BC, img1.device)
    n_strips = triton.cdiv(Wo, geo.f)
    n_chunks = triton.cdiv(Ho, geo.rows)
    n_groups = triton.cdiv(BC, geo.bw // geo.f)
    n_prog = n_groups * n_chunks * n_strips
    dev = img1.device
    stats = mode in ("stats", "stats_l1")
    l1 = None
    if stats:
        s = torch.empty((BC, n_chunks * n_strips), dtype=torch.float32, device=dev)
        cs = torch.empty_like(s)
        l1 = torch.empty_like(s) if mode == "stats_l1" else None
    else:
        s = torch.empty((B, C, Ho, Wo), dtype=torch.float32, device=dev)
        cs = torch.empty(
            (B, C, Ho, Wo) if mode == "map_cs" else (0,),
            dtype=torch.float32,
            device=dev,
        )
    # the ring kernels (K > COLUMN_TAPS) keep 5 rings of KP rows per program; the column kernels none
    ring = K > COLUMN_TAPS.value
    scratch = torch.empty((n_prog, 5 * geo.kp * geo.bw) if ring else (1,), dtype=torch.float32, device=dev)
    with device_guard(img1):
        _ssim_fwd_kernel[(n_prog,)](
            img1,
            img2,
            window,
            s,
            cs if mode != "map" else s,
            l1 if l1 is not None else s,
            scratch,
            BC,
            C,
            H,
            W,
            Ho,
            Wo,
            n_chunks,
            n_strips,
            geo.rows,
            *img1.stride(),
            *img2.stride(),
            float(c1),
            float(c2),
            K=K,
            KP=geo.kp,
            PAD=pad,
            REFLECT=reflect,
            F=geo.f,
            BW=geo.bw,
            WRITE_MAP=not stats,
            WRITE_CS=mode == "map_cs",
            HAS_L1=l1 is not None,
            **launch_options(geo.warps, maxnreg=COLUMN_MAXNREG if K <= COLUMN_TAPS.value else MAXNREG),
        )
    if stats:
        # fixed-order reduction of the per-program partial sums: deterministic, no atomics
        out = (s.sum(dim=1).view(B, C), cs.sum(dim=1).view(B, C))
        return out + (l1.sum(dim=1).view(B, C),) if l1 is not None else out
    return s, cs


def _bwd_maxnreg(K: int, reflect: bool) -> int:
    """Register ceiling of a backward launch: 128 (16 resident warps per SM) for the column
    kernels; under "reflect" their mirrored vertical taps do not fit in 128 registers (up to 440 B
    of spills with both gradients), so those, like the ring kernels, get 255."""
    return COLUMN_MAXNREG if K <= COLUMN_TAPS.value and not reflect else MAXNREG


def launch_bwd(
    img1,
    img2,
    window,
    padding: str,
    c1: float,
    c2: float,
    g_s,
    g_cs,
    need1: bool,
    need2: bool,
    l1=None,
    grad1=None,
    sums: bool = False,
    grad_dtype=None,
    cs_only: bool = False,
):
    """Run the backward kernel.

    ``g_s`` / ``g_cs``: ``[B, C]`` scalars (already divided by the map size) or ``[B, C, H', W']``
    maps; ``g_cs`` may be None. ``l1``: optional ``[B, C]`` weight of ``sign(x - y)`` added to
    the gradient of img1 (subtracted from img2's). ``grad1``: optional preallocated output for
    img1's gradient (any strides). ``sums``: also return the ``[B, C]`` sums of the SSIM map (of
    the cs map with ``cs_only``), and with ``l1`` of ``|x - y|`` over the image (else None),
    computed in the same pass.
    ``grad_dtype``: the gradients' dtype (default: each input's). ``cs_only``: ``g_s`` is ignored
    (the kernel forms no luminance term). Returns ``(grad1 or None, grad2 or None[, map_sum,
    abs_diff_sum])``, the gradients in img1's memory layout
    (img2's when it is the only one).
    """
    B, C, H, W, K, pad, reflect, Ho, Wo = _geometry(img1, window, padding)
    BC = B * C
    geo = geometry(W + K - 1, H, K, BC, img1.device, halo=True)
    step = geo.f - (K - 1)
    n_strips = triton.cdiv(W, step)
    n_chunks = triton.cdiv(H, geo.rows)
    n_groups = triton.cdiv(BC, geo.bw // geo.f)
    n_prog = n_groups * n_chunks * n_strips
    dev = img1.device
    upstream_map = g_s.dim() == 4
    if upstream_map:
        if g_cs is not None and g_cs.stride() != g_s.stride():
            g_s, g_cs = (
                g_s.contiguous(),
                g_cs.contiguous(),
            )  # one set of strides serves both
        g_strides = g_s.stride()
    else:
        g_s = g_s.to(torch.float32).contiguous()
        g_cs = g_cs.to(torch.float32).contiguous() if g_cs is not None else None
        g_strides = (0, 0, 0, 0)
    gx = (grad1 if grad1 is not None else torch.empty_like(img1, dtype=grad_dtype)) if need1 else None
    gy = None
    if need2:
        gy = (
            torch.empty_like(img2, dtype=grad_dtype)
            if gx is None
            else torch.empty_strided(gx.shape, gx.stride(), dtype=grad_dtype or img2.dtype, device=dev)
        )
    out = gx if gx is not None else gy
    out_strides = out.stride() if out is not None else (0, 0, 0, 0)
    if l1 is not None:
        l1 = l1.to(torch.float32).contiguous()
    # per program: two rows of 4 partials (+ 32 floats: the horizontal adjoint of the column kernels
    # reads up to K - 1 past a row for lanes it drops), and for the ring kernels 9 rings of KP rows
    per_prog = 8 * geo.bw + (32 if K <= COLUMN_TAPS.value else 9 * geo.kp * geo.bw)
    scratch = torch.empty((n_prog, per_prog), dtype=torch.float32, device=dev)
    sum_buf = torch.empty((BC, n_chunks * n_strips, 2) if sums else (1,), dtype=torch.float32, device=dev)
    with device_guard(img1):
        _ssim_bwd_kernel[(n_prog,)](
            img1,
            img2,
            window,
            g_s,
            g_cs if g_cs is not None else g_s,
            l1 if l1 is not None else g_s,
            gx if gx is not None else scratch,
            gy if gy is not None else scratch,
            scratch,
            sum_buf,
            BC,
            C,
            H,
            W,
            Ho,
            Wo,
            n_chunks,
            n_strips,
            geo.rows,
            *img1.stride(),
            *img2.stride(),
            *g_strides,
            *out_strides,
            float(c1),
            float(c2),
            K=K,
            KP=geo.kp,
            PAD=pad,
            REFLECT=reflect,
            F=geo.f,
            BW=geo.bw,
            UPSTREAM_MAP=upstream_map,
            HAS_CS=2 if cs_only else g_cs is not None,
            HAS_L1=l1 is not None,
            NEED1=need1,
            NEED2=need2,
            WRITE_SUMS=sums,
            **launch_options(geo.warps, maxnreg=_bwd_maxnreg(K, reflect)),
        )
    if sums:
        per_bc = sum_buf.sum(dim=1)  # fixed order: deterministic
        abs_sum = per_bc[:, 1].view(B, C) if l1 is not None else None
        return gx, gy, per_bc[:, 0].view(B, C), abs_sum
    return gx, gy


# ------------------------------------------------------------------------------------------------
# Registered ops: opaque to torch.compile (no graph break), with an autograd formula
# ------------------------------------------------------------------------------------------------

Tensor = torch.Tensor


def _fake_grads(img1: Tensor, img2: Tensor, need1: bool, need2: bool) -> Tuple[Tensor, Tensor]:
    """Gradients as :func:`launch_bwd` allocates them: img1's layout, and img2's gradient in img1's
    layout too when both are computed (img2's own layout only when it is the sole gradient)."""
    gx = torch.empty_like(img1) if need1 else img1.new_empty(0)
    if not need2:
        return gx, img2.new_empty(0)
    return gx, (torch.empty_like(img1, dtype=img2.dtype) if need1 else torch.empty_like(img2))


def _map_numel(img: Tensor, window: Tensor, padding: str) -> int:
    K = window.shape[0]
    return out_size(img.shape[-2], K, padding) * out_size(img.shape[-1], K, padding)


@torch.library.custom_op("splatloss::triton_ssim_stats", mutates_args=())
def _stats_op(img1: Tensor, img2: Tensor, window: Tensor, padding: str, c1: float, c2: float) -> Tuple[Tensor, Tensor]:
    s, cs = launch_fwd(img1, img2, window, padding, c1, c2, "stats")
    n = _map_numel(img1, window, padding)
    return s / n, cs / n


@_stats_op.register_fake
def _(img1, img2, window, padding, c1, c2):
    shape = img1.shape[:2]
    return img1.new_empty(shape, dtype=torch.float32), img1.new_empty(shape, dtype=torch.float32)


@torch.library.custom_op("splatloss::triton_ssim_stats_bwd", mutates_args=())
def _stats_bwd_op(
    g_s: Tensor,
    g_cs: Tensor,
    img1: Tensor,
    img2: Tensor,
    window: Tensor,
    padding: str,
    c1: float,
    c2: float,
    need1: bool,
    need2: bool,
) -> Tuple[Tensor, Tensor]:
    n = _map_numel(img1, window, padding)
    gx, gy = launch_bwd(img1, img2, window, padding, c1, c2, g_s / n, g_cs / n, need1, need2)
    return (gx if need1 else img1.new_empty(0)), (gy if need2 else img2.new_empty(0))


@_stats_bwd_op.register_fake
def _(g_s, g_cs, img1, img2, window, padding, c1, c2, need1, need2):
    return _fake_grads(img1, img2, need1, need2)


def _save(ctx, inputs, output):
    img1, img2, window, padding, c1, c2 = inputs[:6]
    # Only the inputs are kept (references, no copies): the backward recomputes the moments.
    ctx.save_for_backward(img1, img2, window)
    ctx.cfg = (padding, c1, c2)
    ctx.extra = inputs[6:]


def _zeros_if_none(g: Optional[Tensor], like_shape, device) -> Tensor:
    return g if g is not None else torch.zeros(like_shape, dtype=torch.float32, device=device)


def _stats_backward(ctx, g_s, g_cs):
    img1, img2, window = ctx.saved_tensors
    need1, need2 = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
    if not (need1 or need2):
        return None, None, None, None, None, None
    shape = img1.shape[:2]
    g_s = _zeros_if_none(g_s, shape, img1.device)
    g_cs = _zeros_if_none(g_cs, shape, img1.device)
    gx, gy = _stats_bwd_op(g_s, g_cs, img1, img2, window, *ctx.cfg, need1, need2)
    return (gx if need1 else None), (gy if need2 else None), None, None, None, None


_stats_op.register_autograd(_stats_backward, setup_context=_save)


@torch.library.custom_op("splatloss::triton_ssim_map", mutates_args=())
def _map_op(
    img1: Tensor,
    img2: Tensor,
    window: Tensor,
    padding: str,
    c1: float,
    c2: float,
    return_cs: bool,
) -> Tuple[Tensor, Tensor]:
    s, cs = launch_fwd(img1, img2, window, padding, c1, c2, "map_cs" if return_cs else "map")
    return s, cs if return_cs else img1.new_empty(0, dtype=torch.float32)


@_map_op.register_fake
def _(img1, img2, window, padding, c1, c2, return_cs):
    B, C, H, W = img1.shape
    K = window.shape[0]
    shape = (B, C, out_size(H, K, padding), out_size(W, K, padding))
    s = img1.new_empty(shape, dtype=torch.float32)
    return s, (img1.new_empty(shape, dtype=torch.float32) if return_cs else img1.new_empty(0, dtype=torch.float32))


@torch.library.custom_op("splatloss::triton_ssim_map_bwd", mutates_args=())
def _map_bwd_op(
    g_s: Tensor,
    g_cs: Tensor,
    img1: Tensor,
    img2: Tensor,
    window: Tensor,
    padding: str,
    c1: float,
    c2: float,
    has_cs: bool,
    need1: bool,
    need2: bool,
) -> Tuple[Tensor, Tensor]:
    gx, gy = launch_bwd(img1, img2, window, padding, c1, c2, g_s, g_cs if has_cs else None, need1, need2)
    return (gx if need1 else img1.new_empty(0)), (gy if need2 else img2.new_empty(0))


@_map_bwd_op.register_fake
def _(g_s, g_cs, img1, img2, window, padding, c1, c2, has_cs, need1, need2):
    return _fake_grads(img1, img2, need1, need2)


def _map_backward(ctx, g_s, g_cs):
    img1, img2, window = ctx.saved_tensors
    (return_cs,) = ctx.extra
    need1, need2 = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
    if not (need1 or need2):
        return None, None, None, None, None, None, None
    B, C, H, W = img1.shape
    K = window.shape[0]
    shape = (B, C, out_size(H, K, ctx.cfg[0]), out_size(W, K, ctx.cfg[0]))
    g_s = _zeros_if_none(g_s, shape, img1.device)
    has_cs = bool(return_cs) and g_cs is not None
    g_cs = g_cs if has_cs else g_s
    gx, gy = _map_bwd_op(g_s, g_cs, img1, img2, window, *ctx.cfg, has_cs, need1, need2)
    return (
        (gx if need1 else None),
        (gy if need2 else None),
        None,
        None,
        None,
        None,
        None,
    )


_map_op.register_autograd(_map_backward, setup_context=_save)


def save_unit_grads(ctx, img1: Tensor, img2: Tensor, window: Tensor, gx: Tensor, gy: Tensor) -> None:
    """setup_context of an op whose forward also returned its gradients for a unit upstream
    gradient (``gx`` / ``gy``, float32, empty where not computed): keep them with the inputs."""
    ctx.save_for_backward(img1, img2, window, gx, gy)
    ctx.mark_non_differentiable(gx, gy)
    ctx.set_materialize_grads(False)  # no zero-filled upstream gradients for gx / gy (4 B each)


def backward_from_unit_grads(ctx, upstream: Optional[Tensor], dims: int, recompute) -> tuple:
    """The backward of such an op (nine inputs, the two images first): scale the kept gradients by
    ``upstream``, one scalar per leading index (``dims`` of them: per image, or per image and
    channel), one elementwise pass each, and return them in each input's dtype. An input that
    needs a gradient its forward did not compute (it did not need one then) gets
    ``recompute(img1, img2, window, need1, need2) -> (gx, gy)``."""
    need1, need2 = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
    rest = (None,) * 7
    if not (need1 or need2) or upstream is None:
        return (None, None) + rest
    img1, img2, window, gx, gy = ctx.saved_tensors
    if (need1 and gx.numel() == 0) or (need2 and gy.numel() == 0):
        gx, gy = recompute(img1, img2, window, need1, need2)
        return (gx if need1 else None, gy if need2 else None) + rest
    u = upstream.to(torch.float32)
    u = u.reshape(u.shape + (1,) * (4 - dims))
    return ((gx * u).to(img1.dtype) if need1 else None, (gy * u).to(img2.dtype) if need2 else None) + rest


@torch.library.custom_op("splatloss::triton_ssim_term", mutates_args=())
def _term_op(
    img1: Tensor,
    img2: Tensor,
    window: Tensor,
    padding: str,
    c1: float,
    c2: float,
    cs: bool,
    need1: bool,
    need2: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    """The ``[B, C]`` mean of the SSIM map (or of the cs map when ``cs``), and, for each image
    that needs one (``need1`` / ``need2``), the gradient of that mean with respect to it: the
    backward kernel's pass, which computes every SSIM value on its way to the gradient, run in
    the forward (8 B read + 4 B written per gradient); the backward then only scales it."""
    n = _map_numel(img1, window, padding)
    empty = img1.new_empty(0, dtype=torch.float32)
    if not (need1 or need2):
        s, c = launch_fwd(img1, img2, window, padding, c1, c2, "stats")
        return (c if cs else s) / n, empty, empty.clone()
    unit = torch.full(img1.shape[:2], 1.0 / n, dtype=torch.float32, device=img1.device)
    gx, gy, t_sum, _ = launch_bwd(
        img1,
        img2,
        window,
        padding,
        c1,
        c2,
        unit,
        unit if cs else None,
        need1,
        need2,
        sums=True,
        grad_dtype=torch.float32,
        cs_only=cs,
    )
    return t_sum / n, (gx if need1 else empty), (gy if need2 else empty.clone())


def _fake_unit_grads(img1: Tensor, img2: Tensor, need1: bool, need2: bool) -> Tuple[Tensor, Tensor]:
    """float32 gradients in the layouts :func:`launch_bwd` gives them (see :func:`_fake_grads`)."""
    gx, gy = _fake_grads(img1, img2, need1, need2)
    return gx.to(torch.float32), gy.to(torch.float32)


@_term_op.register_fake
def _(img1, img2, window, padding, c1, c2, cs, need1, need2):
    gx, gy = _fake_unit_grads(img1, img2, need1, need2)
    return img1.new_empty(img1.shape[:2], dtype=torch.float32), gx, gy


def _term_save(ctx, inputs, output):
    img1, img2, window, padding, c1, c2, cs, need1, need2 = inputs
    save_unit_grads(ctx, img1, img2, window, *output[1:])
    ctx.cfg = (padding, c1, c2, cs)


def _term_backward(ctx, g_t, _gx, _gy):
    padding, c1, c2, cs = ctx.cfg

    def recompute(img1, img2, window, need1, need2):
        zero = torch.zeros_like(g_t)
        g_s, g_cs = (zero, g_t) if cs else (g_t, zero)
        return _stats_bwd_op(g_s, g_cs, img1, img2, window, padding, c1, c2, need1, need2)

    return backward_from_unit_grads(ctx, g_t, 2, recompute)


_term_op.register_autograd(_term_backward, setup_context=_term_save)


def wants_grad(t: Tensor) -> bool:
    """Whether autograd will ask for a gradient of ``t`` (decided in the forward)."""
    return torch.is_grad_enabled() and t.requires_grad


# ------------------------------------------------------------------------------------------------
# Backend entry points (splatloss/backends/base.py)
# ------------------------------------------------------------------------------------------------


def _args(img1: Tensor, img2: Tensor, cfg):
    check_inputs(img1, img2, cfg)
    # (the kernels take the moments of x - s, s a local mean of each program: _common._local_shift)
    return window_taps(cfg, img1.device), cfg.padding, float(cfg.C1), float(cfg.C2)


def ssim_stats(img1: Tensor, img2: Tensor, cfg) -> Tuple[Tensor, Tensor]:
    """Per-image, per-channel means of the SSIM and cs maps, ``([B, C], [B, C])`` float32.

    Forward: one streaming pass over both images (8 B per pixel-channel with fp32 input). Backward
    (upstream one scalar per (B, C)): one pass recomputing the moments, 8 B read + 4 B written
    per gradient asked for.

    Examples:
        >>> from splatloss.config import SSIMConfig
        >>> x = torch.rand(1, 3, 16, 16)  # on CPU this runs in the Triton interpreter
        >>> s, cs = ssim_stats(x, x, SSIMConfig())
        >>> s.shape, bool(torch.allclose(s, torch.ones(1, 3)))
        (torch.Size([1, 3]), True)
    """
    with functorch_guard():
        return _stats_op(img1, img2, *_args(img1, img2, cfg))


def ssim_term(img1: Tensor, img2: Tensor, cfg, cs: bool = False) -> Tensor:
    """The ``[B, C]`` mean of the SSIM map (of the cs map when ``cs``) float32, for a loss.

    When an input requires a gradient, the forward computes the mean's gradient too, in the
    backward kernel's single pass (its SSIM values summed on the way), and keeps it (float32, 4 B
    per pixel-channel and input) for the backward, which only scales it by the upstream
    gradient: one pass over the moments instead of two. Without a gradient to compute it is the
    forward kernel's pass (8 B read).

    Examples:
        >>> from splatloss.config import SSIMConfig
        >>> x = torch.rand(1, 3, 16, 16, requires_grad=True)  # on CPU: the Triton interpreter
        >>> s = ssim_term(x, x.detach(), SSIMConfig())
        >>> (1 - s.mean()).backward()
        >>> bool(torch.allclose(s, torch.ones(1, 3))), x.grad.shape
        (True, torch.Size([1, 3, 16, 16]))
    """
    with functorch_guard():
        s, _, _ = _term_op(img1, img2, *_args(img1, img2, cfg), bool(cs), wants_grad(img1), wants_grad(img2))
    return s


def ssim_map(img1: Tensor, img2: Tensor, cfg, return_cs: bool = False):
    """SSIM map ``[B, C, H', W']`` float32 (and the cs map when ``return_cs``)."""
    with functorch_guard():
        s, cs = _map_op(img1, img2, *_args(img1, img2, cfg), bool(return_cs))
    return (s, cs) if return_cs else s


def ssim_mean_and_grad(img1: Tensor, img2: Tensor, cfg, upstream: Tensor) -> Tuple[Tensor, Tensor]:
    """``(ssim_mean [B, C], d(sum(upstream * ssim_mean)) / d img1)`` in ONE pass, no autograd.

    The backward kernel already computes every SSIM value of the map on its way to the
    gradient, so it also sums them: read x, y once, write the gradient once -- 12 B per
    pixel-channel with fp32 I/O, the floor for a loss value plus its gradient."""
    window, padding, c1, c2 = _args(img1, img2, cfg)
    n = _map_numel(img1, window, padding)
    g = (upstream.to(device=img1.device, dtype=torch.float32) / n).expand(img1.shape[:2])
    gx, _, s_sum, _ = launch_bwd(
        img1.detach(),
        img2.detach(),
        window,
        padding,
        c1,
        c2,
        g,
        None,
        True,
        False,
        sums=True,
    )
    return s_sum / n, gx
