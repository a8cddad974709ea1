"""The SSIM backward kernel (the analytic adjoint) and its launcher.

``ssim_bwd_kernel``: one program per (lane group, row chunk, column strip of ``F - (K - 1)``
gradient columns). Computes the moments on the map positions whose windows reach its pixels,
forms the partial derivatives of ``gs * SSIM + gc * cs`` (``gs`` / ``gc`` one scalar per (image,
channel) for the means, or map-sized upstream gradients for ``ssim_map``; ``HAS_CS == 2``: of
``gc * cs`` alone), applies the adjoint window (horizontal through a scratch row, vertical
through pending sums or a ring) and writes both image gradients once; optionally adds an L1 term
``l1 * sign(x - y)`` (the fused photometric loss) and sums the SSIM values (cs with
``HAS_CS == 2``) and ``|x - y|`` it computed on the way: a loss's value and gradient in one pass.
Column body (:mod:`.columns`) up to ``COLUMN_TAPS`` taps, ring body (:mod:`.ring`) above.

Bytes per pixel-channel (fp32 I/O, DRAM): reads x, y = 8 B; writes grad_x (and grad_y) = 4 B
(8 B); an upstream map adds 4 B (+ 4 B with cs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .bodies import interior, l1_sign_term, lanes, stage_partials, store_grad, store_sums
from .columns import hadjoint_cols, hmoments, load_taps, push, vadjoint_taps
from .launch import COLUMN_TAPS, SIZES, bwd_maxnreg, device_guard, geometry, launch_options, problem
from .moments import local_shift, partials
from .ring import hadjoint, ring_vsum, row_moments

__all__ = ["ssim_bwd_kernel", "launch_bwd"]


@triton.jit
def _bwd_columns(
    x_ptr, y_ptr, w_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr,
    BC, C, H, W, Ho, Wo, n_chunks, n_strips, ROWS,
    sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sg_b, sg_c, sg_h, sg_w, so_b, so_c, so_h, so_w, c1, c2,
    K: tl.constexpr, PAD: tl.constexpr, REFLECT: tl.constexpr, F: tl.constexpr, BW: tl.constexpr,
    UPSTREAM_MAP: tl.constexpr, HAS_CS: tl.constexpr, HAS_L1: tl.constexpr, NEED1: tl.constexpr,
    NEED2: tl.constexpr, WRITE_SUMS: tl.constexpr, EDGE: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    group, chunk, strip, f, bc, lane_ok, b, ch = lanes(pid, BC, C, n_chunks, n_strips, F, BW)
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
    shift = local_shift(x_ptr, y_ptr, x_base, y_base, q_r0, n_rows, q_c, qcol_ok, sx_h, sx_w, sy_h, sy_w, F, BW)
    wt = load_taps(w_ptr, K)
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
    else:
        l1 = 0.0
    acc_s = zero  # the SSIM map's sum (cs in cs-only mode, where partials returns cs for it)
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
        h1, h2, h11, h12, _ = hmoments(
            x_ptr, y_ptr, x_lane, y_lane, r, p_c - PAD, H, W, sx_h, sx_w, sy_h, sy_w,
            lane_ok, lane_ok, lane_ok, shift, wt, K, PAD, REFLECT, False, EDGE,
        )  # fmt: skip
        mu1, v1 = push(v1, h1, wt, K, True)
        mu2, v2 = push(v2, h2, wt, K, True)
        e11, v11 = push(v11, h11, wt, K, True)  # E[x'^2] + E[y'^2]: only their sum enters B2
        e12, v12 = push(v12, h12, wt, K, True)

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
        d1, d2, dsq, dxy, ssim, cs = partials(mu1, mu2, e11, None, e12, gs, gc, c1, c2, shift, HAS_CS)
        if WRITE_SUMS:
            own = valid & own_c & (p >= q_r0) & (p < q_r0 + n_rows)
            acc_s += tl.where(own, ssim, 0.0)

        # 3. horizontal adjoint through the scratch row
        buf = scr + (i % 2) * (4 * BW)
        stage_partials(buf, ar, valid, dsq, dxy, d1, d2, NEED1, NEED2, BW)
        h_sq = hadjoint_cols(buf, w_ptr, wt, q_c0, W, f, F, BW, K, PAD, REFLECT)
        h_xy = hadjoint_cols(buf + BW, w_ptr, wt, q_c0, W, f, F, BW, K, PAD, REFLECT)

        # 4. vertical adjoint: map row p enters gradient rows q = p - PAD + j with tap j (and the
        #    mirrored taps under "reflect"); gradient row q = p - PAD completes
        wa = vadjoint_taps(w_ptr, wt, p, H, K, PAD, REFLECT)
        g_sq, a_sq = push(a_sq, h_sq, wa, K, False)
        g_xy, a_xy = push(a_xy, h_xy, wa, K, False)
        q = p - PAD
        out = qcol_ok & (i >= 2 * (K - 1)) & (q < q_r0 + n_rows)
        q64 = q.to(tl.int64)
        # gradient column q_c is the last tap of the lane's window: K - 1 columns past its start
        xq = tl.load(x_ptr + x_lane + q64 * sx_h + (K - 1) * sx_w, mask=out, other=0.0).to(tl.float32) - shift
        yq = tl.load(y_ptr + y_lane + q64 * sy_h + (K - 1) * sy_w, mask=out, other=0.0).to(tl.float32) - shift
        o_offs = o_base + q64 * so_h + q_c.to(tl.int64) * so_w
        l1_term, acc_l = l1_sign_term(xq, yq, l1, out, acc_l, HAS_L1, WRITE_SUMS)
        if NEED1:
            g1, a_1 = push(
                a_1, hadjoint_cols(buf + 2 * BW, w_ptr, wt, q_c0, W, f, F, BW, K, PAD, REFLECT), wa, K, False
            )
            store_grad(gx_ptr, o_offs, out, g1, xq, yq, g_sq, g_xy, l1_term, 1, HAS_L1)
        if NEED2:
            g2, a_2 = push(
                a_2, hadjoint_cols(buf + 3 * BW, w_ptr, wt, q_c0, W, f, F, BW, K, PAD, REFLECT), wa, K, False
            )
            store_grad(gy_ptr, o_offs, out, g2, yq, xq, g_sq, g_xy, l1_term, -1, HAS_L1)
    if WRITE_SUMS:
        # per program and channel: the SSIM (cs) and, with HAS_L1, |x - y| sums of the pixels it owns
        store_sums(sum_ptr, acc_s, BC, n_chunks * n_strips, 2, F, BW)
        if HAS_L1:
            store_sums(sum_ptr + 1, acc_l, BC, n_chunks * n_strips, 2, F, BW)


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
    shift = local_shift(x_ptr, y_ptr, x_base, y_base, q_r0, n_rows, q_c, qcol_ok, sx_h, sx_w, sy_h, sy_w, F, BW)

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
    else:
        l1 = 0.0
    acc_s = tl.zeros([BW], dtype=tl.float32)
    acc_l = tl.zeros([BW], dtype=tl.float32)
    for i in range(0, n_rows + 2 * (K - 1)):
        # 1. padded input row r enters; moments of map row p = r - (K - 1) + PAD
        r = q_r0 - (K - 1) + i
        h1, h2, h11, h22, h12, _ = row_moments(
            x_ptr, y_ptr, x_base, y_base, r, q_c0 - (K - 1) + f, H, W, sx_h, sx_w, sy_h, sy_w, w_ptr,
            lane_ok, f, f, shift, K, KP, REFLECT, False, F == BW,
        )  # fmt: skip
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
        mu1, mu2, e11, e22, e12 = ring_vsum(mring, ring_offs, live, wv, KP, BW)

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
        d1, d2, dsq, dxy, ssim, cs = partials(mu1, mu2, e11, e22, e12, gs, gc, c1, c2, shift, HAS_CS)
        if WRITE_SUMS:
            own = valid & own_c & (p >= q_r0) & (p < q_r0 + n_rows)
            acc_s += tl.where(own, ssim, 0.0)

        # 3. horizontal adjoint through the scratch row, into the rings of adjoined partials
        buf = scr + (i % 2) * (4 * BW)
        stage_partials(buf, ar, valid, dsq, dxy, d1, d2, NEED1, NEED2, BW)
        aslot = aring + (i % KP) * BW + ar
        tl.store(aslot, hadjoint(buf, w_ptr, q_c0, W, f, F, BW, K, KP, PAD, REFLECT))
        tl.store(aslot + KP * BW, hadjoint(buf + BW, w_ptr, q_c0, W, f, F, BW, K, KP, PAD, REFLECT))
        if NEED1:
            tl.store(aslot + 2 * KP * BW, hadjoint(buf + 2 * BW, w_ptr, q_c0, W, f, F, BW, K, KP, PAD, REFLECT))
        if NEED2:
            tl.store(aslot + 3 * KP * BW, hadjoint(buf + 3 * BW, w_ptr, q_c0, W, f, F, BW, K, KP, PAD, REFLECT))
        tl.debug_barrier()

        # 4. vertical adjoint: gradient row q = p - PAD gathers map rows q + PAD - g (ring age g)
        #    with tap g, plus the taps through its mirror images under "reflect"
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
        out = qcol_ok & (i >= 2 * (K - 1)) & (q < q_r0 + n_rows)
        q64 = q.to(tl.int64)
        xq = tl.load(x_ptr + x_base + q64 * sx_h + q_c.to(tl.int64) * sx_w, mask=out, other=0.0).to(tl.float32) - shift
        yq = tl.load(y_ptr + y_base + q64 * sy_h + q_c.to(tl.int64) * sy_w, mask=out, other=0.0).to(tl.float32) - shift
        g_sq = tl.sum(tl.load(aring + ring_offs, mask=live, other=0.0) * wa, axis=0)
        g_xy = tl.sum(tl.load(aring + KP * BW + ring_offs, mask=live, other=0.0) * wa, axis=0)
        o_offs = o_base + q64 * so_h + q_c.to(tl.int64) * so_w
        l1_term, acc_l = l1_sign_term(xq, yq, l1, out, acc_l, HAS_L1, WRITE_SUMS)
        if NEED1:
            g1 = tl.sum(tl.load(aring + 2 * KP * BW + ring_offs, mask=live, other=0.0) * wa, axis=0)
            store_grad(gx_ptr, o_offs, out, g1, xq, yq, g_sq, g_xy, l1_term, 1, HAS_L1)
        if NEED2:
            g2 = tl.sum(tl.load(aring + 3 * KP * BW + ring_offs, mask=live, other=0.0) * wa, axis=0)
            store_grad(gy_ptr, o_offs, out, g2, yq, xq, g_sq, g_xy, l1_term, -1, HAS_L1)
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
    NEED2: tl.constexpr, WRITE_SUMS: tl.constexpr,
):  # fmt: skip
    if K <= COLUMN_TAPS:
        # interior programs read their rows without masks (``hmoments``); one loop or the other
        strip = tl.program_id(0) % n_strips
        if interior(strip * (F - (K - 1)) - (K - 1), W, K, F, BW):
            _bwd_columns(
                x_ptr, y_ptr, w_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr, BC, C, H, W, Ho, Wo,
                n_chunks, n_strips, ROWS, sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sg_b, sg_c, sg_h, sg_w, so_b,
                so_c, so_h, so_w, c1, c2, K, PAD, REFLECT, F, BW, UPSTREAM_MAP, HAS_CS, HAS_L1, NEED1, NEED2,
                WRITE_SUMS, False
            )  # fmt: skip
        else:
            _bwd_columns(
                x_ptr, y_ptr, w_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr, BC, C, H, W, Ho, Wo,
                n_chunks, n_strips, ROWS, sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sg_b, sg_c, sg_h, sg_w, so_b,
                so_c, so_h, so_w, c1, c2, K, PAD, REFLECT, F, BW, UPSTREAM_MAP, HAS_CS, HAS_L1, NEED1, NEED2,
                WRITE_SUMS, True
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
    B, C, H, W, K, pad, reflect, Ho, Wo = problem(img1, window, padding)
    BC = B * C
    geo = geometry(W + K - 1, H, K, BC, img1.device, halo=True, maxnreg=bwd_maxnreg(K, reflect))
    step = geo.f - (K - 1)
    n_strips = triton.cdiv(W, step)
    n_chunks = triton.cdiv(H, geo.rows)
    n_groups = triton.cdiv(BC, geo.bw // geo.f)
    n_prog = n_groups * n_chunks * n_strips
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
        ssim_bwd_kernel[(n_prog,)](
            img1, img2, window, g_s, g_cs if g_cs is not None else g_s, l1 if l1 is not None else g_s,
            gx if gx is not None else scratch, gy if gy is not None else scratch, scratch, sum_buf,
            BC, C, H, W, Ho, Wo, n_chunks, n_strips, geo.rows,
            *img1.stride(), *img2.stride(), *g_strides, *out_strides, float(c1), float(c2),
            K=K, KP=geo.kp, PAD=pad, REFLECT=reflect, F=geo.f, BW=geo.bw, UPSTREAM_MAP=upstream_map,
            HAS_CS=2 if cs_only else g_cs is not None, HAS_L1=l1 is not None, NEED1=need1, NEED2=need2,
            WRITE_SUMS=sums, **launch_options(geo.warps, maxnreg=bwd_maxnreg(K, reflect)),
        )  # fmt: skip
    if sums:
        per_bc = sum_buf.sum(dim=1)  # fixed order: deterministic
        abs_sum = per_bc[:, 1].view(B, C) if l1 is not None else None
        return gx, gy, per_bc[:, 0].view(B, C), abs_sum
    return gx, gy
