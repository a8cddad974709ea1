"""The SSIM backward kernel (the analytic adjoint) and its launcher.

``ssim_bwd_kernel``: one program per (lane group, row chunk, column strip of ``F - (K - 1)``
gradient columns). Computes the moments on the map positions whose windows reach its pixels,
forms the partial derivatives of ``gs * SSIM + gc * cs`` (``gs`` / ``gc`` one scalar per (image,
channel) for the means, or map-sized upstream gradients for ``ssim_map``; ``HAS_CS == 2``: of
``gc * cs`` alone), applies the adjoint window (horizontal through a scratch row, vertical
through pending sums or a ring; the column body takes the vertical adjoint first, so that the
horizontal one can form each pixel's difference against each map column's shift) and writes both
image gradients once; optionally adds an L1 term
``l1 * sign(x - y)`` (the fused photometric loss) and sums the SSIM values (cs with
``HAS_CS == 2``) and ``|x - y|`` it computed on the way: a loss's value and gradient in one pass.
Column body (:mod:`.columns`) up to ``COLUMN_TAPS`` taps, ring body (:mod:`.ring`) above.

Bytes per pixel-channel (fp32 I/O, DRAM): reads x, y = 8 B; writes grad_x (and grad_y) = 4 B
(8 B); an upstream map adds 4 B (+ 4 B with cs).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .bodies import interior, l1_sign_term, lanes, scale_of, store_grad, store_sums
from .columns import hadjoint_moved, hmoments, load_taps, push, push_moved, stage_row, vadjoint_taps, vmoments
from .glue import unit_upstreams
from .launch import (
    COLUMN_TAPS,
    SIZES,
    batched_rows,
    bwd_maxnreg,
    cdiv,
    check_scales,
    device_guard,
    geometry,
    launch_kernel,
    launch_options,
    out_size,
    padding_shape,
    problem,
    shared_column_stride,
)
from .moments import partials
from .partials import means as partial_means
from .ring import hadjoint_moved as hadjoint_moved_ring
from .ring import ring_vsum, row_moments, window_taus
from .split import (
    launch_bwd_scales_split,
    launch_bwd_split,
    scales_split_eligible,
    scales_split_geometry,
    split_eligible,
    split_geometry,
)

__all__ = ["ssim_bwd_kernel", "launch_bwd", "ssim_bwd_scales_kernel", "launch_bwd_scales"]


@triton.jit
def _bwd_columns(
    pid, x_ptr, y_ptr, w_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr,
    BC, C, H, W, Ho, Wo, n_chunks, n_strips, ROWS,
    sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sg_b, sg_c, sg_h, sg_w, so_b, so_c, so_h, so_w, c1, c2,
    K: tl.constexpr, PAD: tl.constexpr, REFLECT: tl.constexpr, F: tl.constexpr, BW: tl.constexpr,
    UPSTREAM_MAP: tl.constexpr, HAS_CS: tl.constexpr, HAS_L1: tl.constexpr, NEED1: tl.constexpr,
    NEED2: tl.constexpr, WRITE_SUMS: tl.constexpr, EDGE: tl.constexpr,
):  # fmt: skip
    group, chunk, strip, f, bc, lane_ok, b, ch = lanes(pid, BC, C, n_chunks, n_strips, F, BW)
    x_base = b * sx_b + ch * sx_c
    y_base = b * sy_b + ch * sy_c
    o_base = b * so_b + ch * so_c

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
    wt = load_taps(w_ptr, K)
    zero = tl.zeros([BW], dtype=tl.float32)

    # scratch (stays in L1/L2): two rows of 5 values per lane (double-buffered: one barrier per
    # row), read back at shifted columns by the horizontal adjoint
    scr = scr_ptr + pid.to(tl.int64) * (10 * BW + 32)

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
    else:
        l1 = 0.0
    acc_s = zero  # the SSIM map's sum (cs in cs-only mode, where partials returns cs for it)
    acc_l = zero
    # the moments' vertical state (:func:`vmoments`), and the pending vertical adjoint sums of the
    # partials (slot j: gradient row j + 1 steps ahead), per map column
    ring = (zero,) * (K // 2)
    state = (ring, ring, ring, ring, (zero,) * (K - 1), ring, ring, ring, ring)
    a_sq = (zero,) * (K - 1)
    a_xy = (zero,) * (K - 1)
    a_1 = (zero,) * (K - 1)
    a_2 = (zero,) * (K - 1)
    for i in tl.range(0, n_rows + 2 * (K - 1), num_stages=1):
        # 1. padded input row r enters; moments of map row p = r - (K - 1) + PAD complete, around
        #    the shift of their centre row
        r = q_r0 - (K - 1) + i
        h1, h2, h11, h12, _, s = hmoments(
            x_ptr, y_ptr, x_lane, y_lane, r, p_c - PAD, H, W, sx_h, sx_w, sy_h, sy_w,
            lane_ok, lane_ok, lane_ok, wt, K, PAD, REFLECT, False, EDGE, False,
        )  # fmt: skip
        hist = state[4]  # shifts of rows r - (K - 1) .. r - 1
        done, state = vmoments(state, h1, h2, h11, h12, s, wt, K)
        mu1, mu2, e11, e12, shift = done  # e11: E[x'^2] + E[y'^2] (only their sum enters B2)

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
        d1, d2, dsq, dxy, ssim, cs = partials(mu1, mu2, e11, None, e12, gs, gc, c1, c2, shift, None, None, HAS_CS)
        if WRITE_SUMS:
            own = valid & own_c & (p >= q_r0) & (p < q_r0 + n_rows)
            acc_s += tl.where(own, ssim, 0.0)
        dsq = tl.where(valid, dsq, 0.0)
        dxy = tl.where(valid, dxy, 0.0)
        e = 2.0 * dsq + dxy

        # 3. vertical adjoint: map row p enters gradient rows q = p - PAD + j with tap j (and the
        #    mirrored taps under "reflect"), the means' partials moved to each row's shift;
        #    gradient row q = p - PAD completes
        wa = vadjoint_taps(w_ptr, wt, p, H, K, PAD, REFLECT)
        g_sq, a_sq = push(a_sq, dsq, wa, K, False)
        g_xy, a_xy = push(a_xy, dxy, wa, K, False)
        buf = scr + (i % 2) * (5 * BW)
        g1 = 0.0
        g2 = 0.0
        if NEED1:
            g1, a_1 = push_moved(a_1, tl.where(valid, d1, 0.0), e, hist, s, shift, wa, K)
        if NEED2:
            g2, a_2 = push_moved(a_2, tl.where(valid, d2, 0.0), e, hist, s, shift, wa, K)
        stage_row(buf, 2.0 * g_sq, g_xy, g1, g2, tl.where(pcol_ok, hist[0], 0.0), NEED1, NEED2, BW, False)
        tl.debug_barrier()

        # 4. horizontal adjoint of gradient row q through the scratch row
        q = p - PAD
        out = qcol_ok & (i >= 2 * (K - 1)) & (q < q_r0 + n_rows)
        q64 = q.to(tl.int64)
        # gradient column q_c is the last tap of the lane's window: K - 1 columns past its start
        xq = tl.load(x_ptr + x_lane + q64 * sx_h + (K - 1) * sx_w, mask=out, other=0.0).to(tl.float32)
        yq = tl.load(y_ptr + y_lane + q64 * sy_h + (K - 1) * sy_w, mask=out, other=0.0).to(tl.float32)
        gx, gy = hadjoint_moved(buf, wt, q_c0, W, f, xq, yq, NEED1, NEED2, F, BW, K, PAD, REFLECT, EDGE, False)
        o_offs = o_base + q64 * so_h + q_c.to(tl.int64) * so_w
        l1_term, acc_l = l1_sign_term(xq, yq, l1, out, acc_l, None, HAS_L1, WRITE_SUMS)
        if NEED1:
            store_grad(gx_ptr, o_offs, out, gx, xq, yq, None, None, l1_term, 1, HAS_L1)
        if NEED2:
            store_grad(gy_ptr, o_offs, out, gy, yq, xq, None, None, l1_term, -1, HAS_L1)
    if WRITE_SUMS:
        # per program and channel: the SSIM (cs) and, with HAS_L1, |x - y| sums of the pixels it owns
        store_sums(sum_ptr, acc_s, BC, n_chunks * n_strips, 2, F, BW, pid)
        if HAS_L1:
            store_sums(sum_ptr + 1, acc_l, BC, n_chunks * n_strips, 2, F, BW, pid)


@triton.jit
def _bwd_ring(
    x_ptr, y_ptr, w_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr,
    BC, C, H, W, Ho, Wo, n_chunks, n_strips, ROWS,
    sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sg_b, sg_c, sg_h, sg_w, so_b, so_c, so_h, so_w, c1, c2,
    K: tl.constexpr, KP: tl.constexpr, PAD: tl.constexpr, REFLECT: tl.constexpr, F: tl.constexpr, BW: tl.constexpr,
    UPSTREAM_MAP: tl.constexpr, HAS_CS: tl.constexpr, HAS_L1: tl.constexpr, NEED1: tl.constexpr,
    NEED2: tl.constexpr, WRITE_SUMS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    group, chunk, strip, f, bc, lane_ok, b, ch = lanes(pid, BC, C, n_chunks, n_strips, F, BW)
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

    # scratch (stays in L1/L2): two rows of 5 values per lane (double-buffered: one barrier per
    # row suffices), 5 rings of partial rows (d/dE[x'^2], d/dE[x'y'], the means', the map row's
    # shift), 5 rings of moment rows and one of their shifts
    scr = scr_ptr + pid.to(tl.int64) * ((10 + 11 * KP) * BW)
    pring = scr + 10 * BW
    mring = pring + 5 * KP * BW
    msring = mring + 5 * KP * BW
    ring_offs = slots[:, None] * BW + ar[None, :]  # [KP, BW]
    for j in tl.static_range(11):
        tl.store(pring + j * KP * BW + ring_offs, tl.zeros([KP, BW], dtype=tl.float32))

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
    else:
        l1 = 0.0
    acc_s = tl.zeros([BW], dtype=tl.float32)
    acc_l = tl.zeros([BW], dtype=tl.float32)
    for i in range(0, n_rows + 2 * (K - 1)):
        # 1. padded input row r enters; moments of map row p = r - (K - 1) + PAD, around the shift
        #    of their centre row
        r = q_r0 - (K - 1) + i
        h1, h2, h11, h22, h12, _, sh = row_moments(
            x_ptr, y_ptr, x_base, y_base, r, q_c0 - (K - 1) + f, H, W, sx_h, sx_w, sy_h, sy_w, w_ptr,
            lane_ok, f, f, K, KP, REFLECT, False,
        )  # fmt: skip
        mslot = mring + (i % KP) * BW + ar
        tl.store(mslot, h1)
        tl.store(mslot + KP * BW, h2)
        tl.store(mslot + 2 * KP * BW, h11)
        tl.store(mslot + 3 * KP * BW, h22)
        tl.store(mslot + 4 * KP * BW, h12)
        tl.store(mslot + 5 * KP * BW, sh)
        tl.debug_barrier()
        age = (i - slots + KP) % KP
        wv = tl.load(w_ptr + (K - 1 - age), mask=age < K, other=0.0)[:, None]
        live = (age < K)[:, None]  # only the K newest rows: 0 * NaN of an older row would be NaN
        tau, shift = window_taus(msring, slots, i, live, KP, BW, K)
        mu1, mu2, e11, e22, e12 = ring_vsum(mring, ring_offs, live, wv, tau, KP, BW)

        # 2. partial derivatives on map row p; zero off the map; into the partials' rings
        p = r - (K - 1) + PAD
        valid = pcol_ok & (i >= K - 1) & (p >= 0) & (p < Ho)
        if UPSTREAM_MAP:
            g_offs = g_base + p.to(tl.int64) * sg_h + p_c.to(tl.int64) * sg_w
            gs = tl.load(gs_ptr + g_offs, mask=valid, other=0.0).to(tl.float32)
            if HAS_CS:
                gc = tl.load(gc_ptr + g_offs, mask=valid, other=0.0).to(tl.float32)
            else:
                gc = 0.0
        d1, d2, dsq, dxy, ssim, cs = partials(mu1, mu2, e11, e22, e12, gs, gc, c1, c2, shift, None, None, HAS_CS)
        if WRITE_SUMS:
            own = valid & own_c & (p >= q_r0) & (p < q_r0 + n_rows)
            acc_s += tl.where(own, ssim, 0.0)
        pslot = pring + (i % KP) * BW + ar
        tl.store(pslot, tl.where(valid, dsq, 0.0))
        tl.store(pslot + KP * BW, tl.where(valid, dxy, 0.0))
        if NEED1:
            tl.store(pslot + 2 * KP * BW, tl.where(valid, d1, 0.0))
        if NEED2:
            tl.store(pslot + 3 * KP * BW, tl.where(valid, d2, 0.0))
        tl.store(pslot + 4 * KP * BW, shift)
        tl.debug_barrier()

        # 3. vertical adjoint: gradient row q = p - PAD gathers map rows q + PAD - g (ring age g)
        #    with tap g, plus the taps through its mirror images under "reflect"; the means'
        #    partials moved to the row's own shift
        q = p - PAD
        wa = tl.load(w_ptr + age, mask=age < K, other=0.0)
        if REFLECT:
            dt = age - 2 * q  # through padded row -q
            wa += tl.load(w_ptr + dt, mask=(age < K) & (q >= 1) & (q <= PAD) & (dt >= 0) & (dt < K), other=0.0)
            db = 2 * (H - 1) - 2 * q + age  # through padded row 2 (H - 1) - q
            wa += tl.load(
                w_ptr + db, mask=(age < K) & (q >= H - 1 - PAD) & (q <= H - 2) & (db >= 0) & (db < K), other=0.0
            )
        wa = wa[:, None]
        p_sq = tl.load(pring + ring_offs, mask=live, other=0.0)
        p_xy = tl.load(pring + KP * BW + ring_offs, mask=live, other=0.0)
        s_q = tl.load(msring + ((i - (K - 1) + KP) % KP) * BW + ar)  # row q's shift
        tau_q = s_q[None, :] - tl.load(pring + 4 * KP * BW + ring_offs, mask=live, other=0.0)
        e_tau = (2.0 * p_sq + p_xy) * tau_q
        buf = scr + (i % 2) * (5 * BW)
        tl.store(buf + ar, 2.0 * tl.sum(p_sq * wa, axis=0))
        tl.store(buf + BW + ar, tl.sum(p_xy * wa, axis=0))
        if NEED1:
            p_1 = tl.load(pring + 2 * KP * BW + ring_offs, mask=live, other=0.0)
            tl.store(buf + 2 * BW + ar, tl.sum((p_1 + e_tau) * wa, axis=0))
        if NEED2:
            p_2 = tl.load(pring + 3 * KP * BW + ring_offs, mask=live, other=0.0)
            tl.store(buf + 3 * BW + ar, tl.sum((p_2 + e_tau) * wa, axis=0))
        tl.store(buf + 4 * BW + ar, tl.where(pcol_ok, s_q, 0.0))
        tl.debug_barrier()

        # 4. horizontal adjoint of gradient row q through the staged row
        out = qcol_ok & (i >= 2 * (K - 1)) & (q < q_r0 + n_rows)
        q64 = q.to(tl.int64)
        xq = tl.load(x_ptr + x_base + q64 * sx_h + q_c.to(tl.int64) * sx_w, mask=out, other=0.0).to(tl.float32)
        yq = tl.load(y_ptr + y_base + q64 * sy_h + q_c.to(tl.int64) * sy_w, mask=out, other=0.0).to(tl.float32)
        gx, gy = hadjoint_moved_ring(buf, w_ptr, q_c0, W, f, xq, yq, NEED1, NEED2, F, BW, K, KP, PAD, REFLECT)
        o_offs = o_base + q64 * so_h + q_c.to(tl.int64) * so_w
        l1_term, acc_l = l1_sign_term(xq, yq, l1, out, acc_l, None, HAS_L1, WRITE_SUMS)
        if NEED1:
            store_grad(gx_ptr, o_offs, out, gx, xq, yq, None, None, l1_term, 1, HAS_L1)
        if NEED2:
            store_grad(gy_ptr, o_offs, out, gy, yq, xq, None, None, l1_term, -1, HAS_L1)
    if WRITE_SUMS:
        store_sums(sum_ptr, acc_s, BC, n_chunks * n_strips, 2, F, BW)
        if HAS_L1:
            store_sums(sum_ptr + 1, acc_l, BC, n_chunks * n_strips, 2, F, BW)


@triton.jit(do_not_specialize=SIZES)
def ssim_bwd_kernel(
    x_ptr, y_ptr, w_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr,
    BC, C, H, W, Ho, Wo, n_chunks, n_strips, ROWS,
    sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sg_b, sg_c, sg_h, sg_w, so_b, so_c, so_h, so_w, c1, c2,
    K: tl.constexpr, KP: tl.constexpr, PAD: tl.constexpr, REFLECT: tl.constexpr, F: tl.constexpr, BW: tl.constexpr,
    UPSTREAM_MAP: tl.constexpr, HAS_CS: tl.constexpr, HAS_L1: tl.constexpr, NEED1: tl.constexpr,
    NEED2: tl.constexpr, WRITE_SUMS: tl.constexpr, SW: tl.constexpr,
):  # fmt: skip
    if SW > 0:  # both images' columns SW apart (channels-last, (H, W, C) renders): immediate tap offsets
        sx_w = SW
        sy_w = SW
    if K <= COLUMN_TAPS:
        # interior programs read their rows without masks (``hmoments``); one loop or the other
        strip = tl.program_id(0) % n_strips
        if interior(strip * (F - (K - 1)) - (K - 1), W, K, F, BW):
            _bwd_columns(
                tl.program_id(0), x_ptr, y_ptr, w_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr, BC, C,
                H, W, Ho, Wo, n_chunks, n_strips, ROWS, sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sg_b, sg_c,
                sg_h, sg_w, so_b, so_c, so_h, so_w, c1, c2, K, PAD, REFLECT, F, BW, UPSTREAM_MAP, HAS_CS, HAS_L1,
                NEED1, NEED2, WRITE_SUMS, False
            )  # fmt: skip
        else:
            _bwd_columns(
                tl.program_id(0), x_ptr, y_ptr, w_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr, BC, C,
                H, W, Ho, Wo, n_chunks, n_strips, ROWS, sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sg_b, sg_c,
                sg_h, sg_w, so_b, so_c, so_h, so_w, c1, c2, K, PAD, REFLECT, F, BW, UPSTREAM_MAP, HAS_CS, HAS_L1,
                NEED1, NEED2, WRITE_SUMS, True
            )  # fmt: skip
    else:
        _bwd_ring(
            x_ptr, y_ptr, w_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr, BC, C, H, W, Ho, Wo,
            n_chunks, n_strips, ROWS, sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sg_b, sg_c, sg_h, sg_w, so_b,
            so_c, so_h, so_w, c1, c2, K, KP, PAD, REFLECT, F, BW, UPSTREAM_MAP, HAS_CS, HAS_L1, NEED1, NEED2,
            WRITE_SUMS,
        )  # fmt: skip


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
    grad2=None,
    raw_sums: bool = False,
):
    """Run the backward kernel.

    ``g_s`` / ``g_cs``: ``[B, C]`` scalars (already divided by the map size) or ``[B, C, H', W']``
    maps; ``g_cs`` may be None. ``l1``: optional ``[B, C]`` weight of ``sign(x - y)`` added to
    the gradient of img1 (subtracted from img2's). ``grad1`` / ``grad2``: optional preallocated
    outputs for the images' gradients (any strides; ``grad2`` in ``grad1``'s when both are
    given). ``sums``: also return the ``[B, C]`` sums of the SSIM map (of the cs map with
    ``cs_only``), and with ``l1`` of ``|x - y|`` over the image (else None), computed in the same
    pass.
    ``grad_dtype``: the gradients' dtype (default: each input's). ``cs_only``: ``g_s`` is ignored
    (the kernel forms no luminance term). Returns ``(grad1 or None, grad2 or None[, map_sum,
    abs_diff_sum])``, the gradients in img1's memory layout
    (img2's when it is the only one). ``raw_sums``: instead of the two sums, the programs' partial
    sums as written, ``[B * C, P, 2]`` (for :func:`.partials.means`), and None.
    """
    B, C, H, W, K, pad, reflect, Ho, Wo = problem(img1, window, padding)
    BC = B * C
    # columns a few elements apart in both images (channels-last, an (H, W, C) render and its target):
    # the stride a constexpr, so that each tap is an immediate offset as with contiguous rows
    sw = shared_column_stride(img1, img2)
    strided = (img1.stride(3) != 1 or img2.stride(3) != 1) and not sw
    maxnreg = bwd_maxnreg(K, reflect, need1 and need2, strided)
    geo = geometry(W + K - 1, H, K, BC, img1.device, halo=True, maxnreg=maxnreg)
    step = geo.f - (K - 1)
    n_strips = cdiv(W, step)
    n_groups = cdiv(BC, geo.bw // geo.f)
    dev = img1.device
    upstream_map = g_s.dim() == 4
    if upstream_map:
        if g_cs is not None and g_cs.stride() != g_s.stride():
            g_s, g_cs = g_s.contiguous(), g_cs.contiguous()  # one set of strides serves both
        g_strides = g_s.stride()
    else:
        g_s = g_s.to(torch.float32).contiguous()
        g_cs = g_cs.to(torch.float32).contiguous() if g_cs is not None else None
        g_strides = (0, 0, 0, 0)
    gx = (grad1 if grad1 is not None else torch.empty_like(img1, dtype=grad_dtype)) if need1 else None
    gy = None
    if need2:
        gy = (
            grad2
            if grad2 is not None
            else torch.empty_like(img2, dtype=grad_dtype)
            if gx is None
            else torch.empty_strided(gx.shape, gx.stride(), dtype=grad_dtype or img2.dtype, device=dev)
        )
    out = gx if gx is not None else gy
    out_strides = out.stride() if out is not None else (0, 0, 0, 0)
    if l1 is not None:
        l1 = l1.to(torch.float32).contiguous()
    # per program: two rows of 5 values per lane (the column kernels + 32 floats: their horizontal
    # adjoint reads up to K - 1 past a row for lanes it drops), the ring kernels 11 rings of KP rows
    per_prog = 10 * geo.bw + (32 if K <= COLUMN_TAPS.value else 11 * geo.kp * geo.bw)

    def run(rows: int):  # writes the gradients (never reads them): safe to run again
        n_chunks = cdiv(H, rows)
        n_prog = n_groups * n_chunks * n_strips
        scratch = torch.empty((n_prog, per_prog), dtype=torch.float32, device=dev)
        sum_buf = torch.empty((BC, n_chunks * n_strips, 2) if sums else (1,), dtype=torch.float32, device=dev)
        with device_guard(img1):
            launch_kernel(ssim_bwd_kernel, (n_prog,),
                img1, img2, window, g_s, g_cs if g_cs is not None else g_s, l1 if l1 is not None else g_s,
                gx if gx is not None else scratch, gy if gy is not None else scratch, scratch, sum_buf,
                BC, C, H, W, Ho, Wo, n_chunks, n_strips, rows,
                *img1.stride(), *img2.stride(), *g_strides, *out_strides, float(c1), float(c2),
                K=K, KP=geo.kp, PAD=pad, REFLECT=reflect, F=geo.f, BW=geo.bw, UPSTREAM_MAP=upstream_map,
                HAS_CS=2 if cs_only else g_cs is not None, HAS_L1=l1 is not None, NEED1=need1, NEED2=need2,
                WRITE_SUMS=sums, SW=sw, **launch_options(geo.warps, maxnreg=maxnreg),
            )  # fmt: skip
        return sum_buf

    if split_eligible(img1, img2, K, reflect, need1, need2):
        # the moments and their adjoint as two lean launches (:mod:`.split`, 32 warps per SM on
        # sm_90; the same gradients) where :data:`.split.ENABLED` turns them on
        geo_a, geo_b, _, _ = split_geometry(img1, img2, window, padding)
        sum_buf = launch_bwd_split(
            img1, img2, window, padding, c1, c2, g_s, g_cs, need1, need2, l1, gx, gy, sums, cs_only,
            geo_a.rows, geo_b.rows,
        )  # fmt: skip
    else:
        sum_buf = run(geo.rows)
    if sums and raw_sums:
        return gx, gy, sum_buf, None
    if sums:
        per_bc = sum_buf.sum(dim=1)  # fixed order: deterministic
        abs_sum = per_bc[:, 1].view(B, C) if l1 is not None else None
        return gx, gy, per_bc[:, 0].view(B, C), abs_sum
    return gx, gy


# ------------------------------------------------------------------------------------------------
# MS-SSIM's coarser scales in one launch.
#
# Each coarser scale is a small grid (at one 1080p image: 264, 102, 27 and 15 programs) whose time
# is one program's serial walk over its rows and the window's halo rows, whatever the grid's size:
# launched one after the other, four such walks. Here the scales' pairs lie one after the other in
# one flat buffer (each contiguous, (B, C, H_s, W_s), H_s and W_s TF's ceil halves of the scale
# before), and one launch holds every scale's programs: each program walks the scales' sizes to
# find its own, then runs the column body on it with the scale's unit upstream (cs at every scale
# but the last, SSIM there), its place among the scale's programs, and the scale's offsets in the
# gradient, scratch and partial-sum buffers. The arithmetic per pixel is the per-scale launch's
# (the masked edge pass for every program: the interior pass's unmasked reads give the same values).
# ------------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=("BC", "C", "H1", "W1", "DH", "ROWS"))
def ssim_bwd_scales_kernel(
    x_ptr, y_ptr, w_ptr, u_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr, BC, C, H1, W1, DH, ROWS, c1, c2,
    NS: tl.constexpr, K: tl.constexpr, PAD: tl.constexpr, REFLECT: tl.constexpr, F: tl.constexpr,
    BW: tl.constexpr, NEED1: tl.constexpr, NEED2: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    STEP: tl.constexpr = F - (K - 1)
    scale, H, W, start, o, so, n_chunks, n_strips = scale_of(pid, BC, H1, W1, ROWS, 0, 0, NS, STEP, BW // F, 2)
    hw = H.to(tl.int64) * W
    chw = hw * C
    lp = pid - start
    scr = scr_ptr + start.to(tl.int64) * (10 * BW + 32)
    u = u_ptr + scale * BC
    if scale == NS - 1:  # the last scale: the SSIM map's mean
        _bwd_columns(
            lp, x_ptr + o, y_ptr + o, w_ptr, u, u, u, gx_ptr + o, gy_ptr + o, scr, sum_ptr + so, BC, C, H, W,
            H + DH, W + DH, n_chunks, n_strips, ROWS, chw, hw, W, 1, chw, hw, W, 1, 0, 0, 0, 0, chw, hw, W, 1, c1, c2,
            K, PAD, REFLECT, F, BW, False, 0, False, NEED1, NEED2, True, True,
        )  # fmt: skip
    else:  # the cs map's mean
        _bwd_columns(
            lp, x_ptr + o, y_ptr + o, w_ptr, u, u, u, gx_ptr + o, gy_ptr + o, scr, sum_ptr + so, BC, C, H, W,
            H + DH, W + DH, n_chunks, n_strips, ROWS, chw, hw, W, 1, chw, hw, W, 1, 0, 0, 0, 0, chw, hw, W, 1, c1, c2,
            K, PAD, REFLECT, F, BW, False, 2, False, NEED1, NEED2, True, True,
        )  # fmt: skip


def launch_bwd_scales(
    x, y, B: int, C: int, dims, window, padding: str, c1: float, c2: float, need1: bool, need2: bool,
    wide: Optional[bool] = None, out=None, first=None,
):  # fmt: skip
    """MS-SSIM's coarser scales' terms and unit gradients in one launch (:func:`ssim_bwd_scales_kernel`).

    ``x``, ``y``: flat float32 buffers holding the scales' pairs one after the other, each
    ``(B, C, H_s, W_s)`` contiguous; ``dims``: their ``(H_s, W_s)``, each TF's ceil half of the one
    before. The last scale's term is its SSIM mean, the others' their cs means. Returns ``(gx, gy,
    terms)``: each image's gradients of the scales' terms for a unit upstream, flat in the pairs'
    layout (None where not asked for), and the terms, one ``[B, C]`` float32 tensor per scale:
    views of ``out`` (float32 ``(B, C, len(dims))``, e.g. MS-SSIM's terms past the finest scale)
    when it is given, written by one launch (:func:`.partials.means`). Windows up to
    ``COLUMN_TAPS`` taps (the column body) only.

    ``wide``: on CUDA the programs span 256 lanes of 8 warps (True) or 128 lanes of 4 warps (False):
    the launch model puts them level (the narrow ones recompute twice the halo's share, and twice
    as many fit an SM); None: the wide ones (the width a GPU has timed), a bool: that width. The
    gradients are the same bits either way.

    ``first``: ``(x0, y0, gx0, gy0)``, the finest scale too, in the same launches (the two lean
    ones, :func:`.split.launch_bwd_scales_split`; where :func:`.split.all_scales_eligible`): its
    pair (contiguous ``(B, C) + dims[0]``, float32, float16 or bfloat16) and the float32 tensors to
    write its unit gradients into (None where not asked for); ``x``, ``y`` then hold the scales
    after it (float32), and the returned gradients are theirs."""
    K = window.shape[0]
    if first is not None:
        return _bwd_all_scales(x, y, B, C, dims, window, padding, c1, c2, out, first)
    check_scales(K, dims)
    pad, reflect = padding_shape(K, padding)
    BC = B * C
    dev = x.device
    maxnreg = bwd_maxnreg(K, reflect, need1 and need2, False)
    H1, W1 = dims[0]
    heights = [h for h, _ in dims]
    geo = geometry(W1 + K - 1, H1, K, BC, dev, halo=True, maxnreg=maxnreg, wide_halo=True if wide is None else wide)
    step = geo.f - (K - 1)
    n_groups = cdiv(BC, geo.bw // geo.f)
    chunks = [n_groups * cdiv(w, step) for _, w in dims]
    dh = out_size(H1, K, padding) - H1  # map side - image side: 0, or 1 - K ("valid")
    sizes = [out_size(h, K, padding) * out_size(w, K, padding) for h, w in dims]
    u = unit_upstreams(sizes, BC, dev)
    gx = torch.empty_like(x) if need1 else None
    gy = torch.empty_like(y) if need2 else None
    if out is None:
        out = torch.empty((B, C, len(dims)), dtype=torch.float32, device=dev)

    def run(rows):  # writes the gradients (never reads them)
        slots = [p // n_groups * cdiv(h, rows) for p, h in zip(chunks, heights)]  # programs per group
        n_prog = sum(n_groups * s for s in slots)
        scratch = torch.empty((n_prog, 10 * geo.bw + 32), dtype=torch.float32, device=dev)
        sum_buf = torch.empty(2 * BC * sum(slots), dtype=torch.float32, device=dev)
        with device_guard(x):
            launch_kernel(ssim_bwd_scales_kernel, (n_prog,),
                x, y, window, u, gx if gx is not None else scratch, gy if gy is not None else scratch, scratch,
                sum_buf, BC, C, H1, W1, dh, rows, float(c1), float(c2), NS=len(dims), K=K, PAD=pad, REFLECT=reflect,
                F=geo.f, BW=geo.bw, NEED1=need1, NEED2=need2, **launch_options(geo.warps, maxnreg=maxnreg),
            )  # fmt: skip
        partial_means(sum_buf, BC, slots, sizes, out.view(BC, len(dims)), width=2)  # fixed order: deterministic
        return [out[:, :, j] for j in range(len(dims))]

    if wide is None and scales_split_eligible(reflect, need1, need2):
        # the moments and their adjoint as two lean launches (:mod:`.split`; the same gradients and
        # sums) where :data:`.split.ENABLED` turns them on
        _, _, geo_b, _, chunks_b, _, reg_b = scales_split_geometry(B, C, dims, K, padding, dev)
        plan_b = batched_rows(chunks_b, heights, K, geo_b.warps, reg_b, dev)

        slots, sum_buf = launch_bwd_scales_split(x, y, B, C, dims, window, padding, c1, c2, u, gx, gy, plan_b)
        partial_means(sum_buf, BC, slots, sizes, out.view(BC, len(dims)), width=2)  # fixed order
        return gx, gy, [out[:, :, j] for j in range(len(dims))]
    return gx, gy, run(batched_rows(chunks, heights, K, geo.warps, maxnreg, dev))


def _bwd_all_scales(x, y, B: int, C: int, dims, window, padding: str, c1: float, c2: float, out, first):
    """:func:`launch_bwd_scales` with ``first``: every scale in the two lean launches."""
    K = window.shape[0]
    check_scales(K, dims)
    BC = B * C
    dev = x.device
    x0, _, gx0, gy0 = first
    gx = torch.empty_like(x) if gx0 is not None else None
    gy = torch.empty_like(y) if gy0 is not None else None
    sizes = [out_size(h, K, padding) * out_size(w, K, padding) for h, w in dims]
    u = unit_upstreams(sizes, BC, dev)
    _, _, geo_b, _, chunks_b, _, reg_b = scales_split_geometry(B, C, dims, K, padding, dev)
    plan_b = batched_rows(chunks_b, [h for h, _ in dims], K, geo_b.warps, reg_b, dev)

    def run(rows):
        slots, sum_buf = launch_bwd_scales_split(
            x, y, B, C, dims, window, padding, c1, c2, u, gx, gy, rows, first=first
        )  # fmt: skip
        partial_means(sum_buf, BC, slots, sizes, out.view(BC, len(dims)), width=2)  # fixed order: deterministic
        return [out[:, :, j] for j in range(len(dims))]

    terms = run(plan_b)
    return gx, gy, terms
