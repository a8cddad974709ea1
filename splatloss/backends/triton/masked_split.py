"""The masked SSIM backward in two lean launches: the masked moments, then their adjoint.

The one-launch masked backward (:func:`.masked_kernels.masked_bwd_kernel`) carries, per lane, the
masked moments' vertical state (five sums) and the adjoint's pending sums at once: 128 to 168
registers. As the unmasked backward does (:mod:`.split`), the work is cut where the two meet:

- ``masked_moments_kernel`` walks the rows as :func:`.masked_kernels.masked_fwd_kernel` does
  (the last rows' five sums and shifts in the program's scratch) and stores, per map pixel, the
  four mask-weighted moment sums ``F(M x')``, ``F(M y')``, ``F(M (x'^2 + y'^2))``, ``F(M x'y')``
  around the centre row's shift, and ``1 / F(M)`` (1 where ``F(M)`` is 0), each map row's four
  moments per column then its inverses: 20 B per map pixel-channel;
- ``masked_adjoint_kernel`` is :func:`.split.ssim_adjoint_kernel`'s walk with the masked partials:
  with ``N_P = F(M P)`` and ``mu_P = N_P / F(M)``, the partials with respect to the sums are the
  unmasked ones with respect to the means over ``F(M)``, the upstream at map position ``p`` is the
  channel's scalar times the centre mask at ``p`` (read from the mask), and the gradient at pixel
  ``q`` is the unmasked adjoint of those partials times ``M(q)``; the fused loss's L1 term is
  weighted by ``M(q)`` too, its sums are the centre-weighted SSIM deficit ``M (1 - SSIM)`` and
  ``M |x - y|``.

The moments, partials, shifts and sums are the one-launch kernel's, formed by the same device
functions in the same order: the same gradients bit for bit in the interpreter (the per-program
sums follow the programs' rows and strips, so the loss value's last bits may differ). Where it
applies: as :func:`.split.split_eligible` (column windows, zero padding, one gradient, columns
contiguous or a constant stride apart), with the same switch (:data:`.split.ENABLED`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .bodies import interior, l1_sign_term, lanes, store_grad, store_sums
from .columns import (
    hadjoint_moved,
    hmoments_masked,
    load_kept,
    load_taps,
    push,
    push_moved,
    store_kept,
    vmoments_masked,
)
from .launch import (
    COLUMN_MAXNREG,
    SIZES,
    cdiv,
    device_guard,
    geometry,
    launch_options,
    problem,
    shared_column_stride,
)
from .moments import partials
from .split import row_shift, split_eligible, split_group

__all__ = [
    "masked_moments_kernel",
    "masked_adjoint_kernel",
    "launch_masked_bwd_split",
    "masked_split_eligible",
    "masked_split_geometry",
]

#: Register ceilings of the two launches where a program holds one channel (several: 128, as
#: :func:`.split.lean_geometry`). At the unmasked pair's 64 the masked moments spill 104 B (the
#: fifth sum's pending windows and the mask's taps) and the adjoint 32 B (the centre mask and the
#: inverse beside the partials, sm_90, float32); at 80 and 72 neither spills
#: (tools/check_kernels.py): six 4-warp programs (24 warps) and three 8-warp programs (24 warps)
#: per SM on sm_90, against the one-launch masked kernel's 16 or 12.
MOMENTS_MAXNREG = 80
ADJOINT_MAXNREG = 72
#: Bytes of the masked moments per map pixel-channel: four moment sums and 1 / F(M).
MOMENTS_BYTES = 20

#: Scratch rows per kept input row of the moments kernel: the five sums, then the shifts twice.
KEPT_SUMS = tl.constexpr(5)


@triton.jit
def _mask_and_planes(m_ptr, mo_ptr, group, bc, b, ch, p_c, C, Ho, WP, sm_b, sm_c, sm_w, PAD: tl.constexpr,
                     F: tl.constexpr, BW: tl.constexpr):  # fmt: skip
    """The mask's and the moments' bases and per-lane offsets: ``(m_base, m_col, mo_base)``, the
    mask read at ``m_base + m_col + row * sm_h`` (``m_col``: column ``p_c - PAD``), a map row's
    moments at ``mo_base + 5 WP p`` (four per column, then the inverses). With one channel per
    program the bases are the program's (scalars) and ``m_col`` a 32-bit column offset: no 64-bit
    offset per lane to hold through the rows."""
    if F == BW:
        g64 = group.to(tl.int64)
        m_base = m_ptr + (g64 // C) * sm_b + (g64 % C) * sm_c
        m_col = (p_c - PAD) * sm_w
        mo_base = mo_ptr + g64 * Ho * (5 * WP)
    else:
        m_base = m_ptr
        m_col = b * sm_b + ch * sm_c + (p_c - PAD).to(tl.int64) * sm_w
        mo_base = mo_ptr + bc.to(tl.int64) * Ho * (5 * WP)
    return m_base, m_col, mo_base


@triton.jit
def _vmoments_masked_shifts_kept(state, h0, h1, h2, h11, h12, s, wt, i, lane, K: tl.constexpr, BW: tl.constexpr):
    """:func:`.columns.vmoments_masked` with the last ``K // 2`` rows' five sums and shifts kept in
    the program's scratch (the sums as :func:`.columns.load_kept` keeps them; the shifts past them,
    twice over, so that they are consecutive from slot ``i % (K // 2)``): ``state`` is the pending
    windows' five sums alone. The same sums bit for bit (the vertical pass reads no older shift)."""
    HALF: tl.constexpr = K // 2
    base = lane + (KEPT_SUMS * HALF + i % HALF) * BW
    last = ()
    for k in tl.static_range(HALF):  # slot base + k: row i - HALF + k
        last = last + (tl.load(base + k * BW),)
    hist = (tl.zeros_like(h1),) * (K - 1 - HALF) + last
    ring = load_kept(lane, i, 0, KEPT_SUMS, K, BW)
    done, full = vmoments_masked(ring + (hist,) + state, h0, h1, h2, h11, h12, s, wt, K)
    store_kept(lane, i, (h0, h1, h2, h11, h12), 0, KEPT_SUMS, K, BW)
    tl.store(base, s)  # row i replaces row i - HALF
    tl.store(base + HALF * BW, s)
    return done, (full[6], full[7], full[8], full[9], full[10])


@triton.jit
def _masked_moments_columns(
    pid, x_ptr, y_ptr, m_ptr, w_ptr, mo_ptr, scr_ptr, BC, C, H, W, Ho, Wo, WP, n_chunks, n_strips, ROWS,
    sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sm_b, sm_c, sm_h, sm_w,
    K: tl.constexpr, PAD: tl.constexpr, F: tl.constexpr, BW: tl.constexpr, SAME: tl.constexpr, EDGE: tl.constexpr,
):  # fmt: skip
    group, chunk, strip, f, bc, lane_ok, b, ch = lanes(pid, BC, C, n_chunks, n_strips, F, BW)
    p_c = strip * F + f  # map column of each lane
    x_lane = b * sx_b + ch * sx_c + (p_c - PAD).to(tl.int64) * sx_w  # first tap of each lane's window, row 0
    if SAME:  # both images' strides the same: one offset serves both
        y_lane = x_lane
    else:
        y_lane = b * sy_b + ch * sy_c + (p_c - PAD).to(tl.int64) * sy_w
    m_base, m_col, mo_base = _mask_and_planes(m_ptr, mo_ptr, group, bc, b, ch, p_c, C, Ho, WP, sm_b, sm_c, sm_w, PAD,
                                              F, BW)  # fmt: skip
    p_r0 = chunk * ROWS  # first map row of this chunk
    n_rows = tl.minimum(ROWS, Ho - p_r0)
    wt = load_taps(w_ptr, K)
    zero = tl.zeros([BW], dtype=tl.float32)
    ring = (zero,) * (K // 2)
    state = (ring, ring, ring, ring, ring)
    lane = scr_ptr + pid.to(tl.int64) * ((KEPT_SUMS + 2) * (K // 2) * BW) + tl.arange(0, BW)
    for j in tl.static_range((KEPT_SUMS + 2) * (K // 2)):
        tl.store(lane + j * BW, zero)
    # one loop from the window's first row, the stores from its K-th (as .split's moments kernel)
    at = mo_base + p_r0.to(tl.int64) * (5 * WP) + 4 * p_c  # map row p's moments; its inverses 4 WP on
    for i in tl.range(0, n_rows + K - 1, num_stages=1):
        h0, h1, h2, h11, h12, s, _ = hmoments_masked(
            x_ptr, y_ptr, m_base, x_lane, y_lane, m_col, p_r0 - PAD + i, p_c - PAD, H, W, sx_h, sx_w, sy_h, sy_w,
            sm_h, sm_w, lane_ok, wt, K, False, EDGE,
        )  # fmt: skip
        done, state = _vmoments_masked_shifts_kept(state, h0, h1, h2, h11, h12, s, wt, i, lane, K, BW)
        if i >= K - 1:
            fm, f1, f2, f11, f12, _ = done  # around the centre row's shift, which the adjoint forms again
            # no mask: the planes' rows and channels are padded to whole strips and lane groups
            tl.store(at, f1)
            tl.store(at + 1, f2)
            tl.store(at + 2, f11)
            tl.store(at + 3, f12)
            tl.store(at + 4 * WP - 3 * p_c, 1.0 / tl.where(fm > 0, fm, 1.0))
            at += 5 * WP


@triton.jit(do_not_specialize=SIZES + ("WP",))
def masked_moments_kernel(
    x_ptr, y_ptr, m_ptr, w_ptr, mo_ptr, scr_ptr, BC, C, H, W, Ho, Wo, WP, n_chunks, n_strips, ROWS,
    sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sm_b, sm_c, sm_h, sm_w,
    K: tl.constexpr, PAD: tl.constexpr, F: tl.constexpr, BW: tl.constexpr, SW: tl.constexpr, SAME: tl.constexpr,
):  # fmt: skip
    if SW > 0:  # both images' columns SW apart: immediate tap offsets
        sx_w = SW
        sy_w = SW
    strip = tl.program_id(0) % n_strips
    if interior(strip * F - PAD, W, K, F, BW):
        _masked_moments_columns(
            tl.program_id(0), x_ptr, y_ptr, m_ptr, w_ptr, mo_ptr, scr_ptr, BC, C, H, W, Ho, Wo, WP,
            n_chunks, n_strips, ROWS, sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sm_b, sm_c, sm_h, sm_w,
            K, PAD, F, BW, SAME, False,
        )  # fmt: skip
    else:
        _masked_moments_columns(
            tl.program_id(0), x_ptr, y_ptr, m_ptr, w_ptr, mo_ptr, scr_ptr, BC, C, H, W, Ho, Wo, WP,
            n_chunks, n_strips, ROWS, sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sm_b, sm_c, sm_h, sm_w,
            K, PAD, F, BW, SAME, True,
        )  # fmt: skip


@triton.jit
def _masked_adjoint_row(
    i, pend, x_ptr, y_ptr, m_base, w_ptr, mo_base, gs, gc, l1, gx_ptr, gy_ptr,
    scr, x_lane, y_lane, m_col, b, ch, q_r0, n_rows, q_c0, q_c, f, p_c, lane_ok, pcol_ok, qcol_ok, own_c, wt,
    H, W, Ho, WP, sx_h, sx_w, sy_h, sy_w, sm_h, sm_w, so_b, so_c, so_h, so_w, c1, c2,
    K: tl.constexpr, PAD: tl.constexpr, F: tl.constexpr, BW: tl.constexpr, HAS_CS: tl.constexpr,
    HAS_L1: tl.constexpr, NEED1: tl.constexpr, NEED2: tl.constexpr, WRITE_SUMS: tl.constexpr,
    SAME: tl.constexpr, EDGE: tl.constexpr, OUT: tl.constexpr,
):  # fmt: skip
    """Step ``i >= K - 1`` of :func:`_masked_adjoint_columns`: padded input row ``r`` enters (its
    shift), map row ``p = r - (K - 1) + PAD`` forms its masked partials from the moments' launch
    and enters the pending sums; with ``OUT`` gradient row ``p - PAD`` completes, times the mask,
    and is stored (:func:`.masked_kernels.masked_bwd_kernel`'s steps 2 to 4)."""
    ar = tl.arange(0, BW)
    a_sq, a_xy, a_1, a_2 = pend
    SUMS_AT: tl.constexpr = 10 * BW + 32  # the scratch's layout (:func:`_masked_adjoint_columns`)
    RING_AT: tl.constexpr = SUMS_AT + 2 * BW
    ring = scr + RING_AT + ar
    base = ring + (i % (K - 1)) * BW
    shift = tl.load(base + (K // 2) * BW)  # map row p's centre row
    r = q_r0 - (K - 1) + i
    s = row_shift(x_ptr, y_ptr, x_lane, y_lane, r, p_c - PAD, H, W, sx_h, sx_w, sy_h, sy_w, lane_ok, K, EDGE)
    p = r - (K - 1) + PAD
    valid = pcol_ok & (p >= 0) & (p < Ho)
    at = mo_base + p.to(tl.int64) * (5 * WP) + 4 * p_c
    f1 = tl.load(at, mask=valid, other=0.0)
    f2 = tl.load(at + 1, mask=valid, other=0.0)
    f11 = tl.load(at + 2, mask=valid, other=0.0)
    f12 = tl.load(at + 3, mask=valid, other=0.0)
    inv = tl.load(at + 4 * WP - 3 * p_c, mask=valid, other=1.0)
    # the centre mask of map position p (image row p + K // 2 - PAD, the window's centre column)
    mc = tl.load(m_base + m_col + (p + (K // 2 - PAD)).to(tl.int64) * sm_h + (K // 2) * sm_w, mask=valid, other=0.0)
    dmu = (f1 - f2) * inv  # the differences from the sums, as in the forward kernel
    dvar = (f11 - 2.0 * f12) * inv
    d1, d2, dsq, dxy, ssim, cs = partials(
        f1 * inv, f2 * inv, f11 * inv, None, f12 * inv, gs * mc, gc * mc, c1, c2, shift, dmu, dvar, HAS_CS
    )
    if WRITE_SUMS:  # the lanes' sums in the program's scratch (each lane its own slot)
        own = valid & own_c & (p >= q_r0) & (p < q_r0 + n_rows)
        tl.store(scr + SUMS_AT + ar, tl.load(scr + SUMS_AT + ar) + tl.where(own, mc * (1.0 - ssim), 0.0))
    dsq = tl.where(valid, dsq * inv, 0.0)
    dxy = tl.where(valid, dxy * inv, 0.0)
    e = 2.0 * dsq + dxy
    # vertical adjoint: map row p enters gradient rows p - PAD + j with tap j, the means' partials
    # moved to each row's shift; gradient row q = p - PAD completes
    g_sq, a_sq = push(a_sq, dsq, wt, K, False)
    g_xy, a_xy = push(a_xy, dxy, wt, K, False)
    hist = ()
    for j in tl.static_range(K - 1):
        hist = hist + (shift if j == K // 2 else tl.load(base + j * BW),)
    if NEED1:
        g1, a_1 = push_moved(a_1, tl.where(valid, d1 * inv, 0.0), e, hist, s, shift, wt, K)
    if NEED2:
        g2, a_2 = push_moved(a_2, tl.where(valid, d2 * inv, 0.0), e, hist, s, shift, wt, K)
    q_shift = hist[0]
    tl.store(base, s)  # row i replaces row i - (K - 1)
    tl.store(base + (K - 1) * BW, s)
    if OUT:
        # horizontal adjoint of gradient row q through the scratch row (double-buffered: one barrier)
        buf = scr + (i % 2) * (5 * BW)
        tl.store(buf + ar, 2.0 * g_sq)
        tl.store(buf + BW + ar, g_xy)
        if NEED1:
            tl.store(buf + 2 * BW + ar, g1)
        if NEED2:
            tl.store(buf + 3 * BW + ar, g2)
        tl.store(buf + 4 * BW + ar, tl.where(pcol_ok, q_shift, 0.0))
        tl.debug_barrier()
        q64 = (p - PAD).to(tl.int64)
        out = qcol_ok
        xq = tl.load(x_ptr + x_lane + q64 * sx_h + (K - 1) * sx_w, mask=out, other=0.0).to(tl.float32)
        yq = tl.load(y_ptr + y_lane + q64 * sy_h + (K - 1) * sy_w, mask=out, other=0.0).to(tl.float32)
        mq = tl.load(m_base + m_col + q64 * sm_h + (K - 1) * sm_w, mask=out, other=0.0)
        gx, gy = hadjoint_moved(buf, wt, q_c0, W, f, xq, yq, NEED1, NEED2, F, BW, K, PAD, False, EDGE)
        if SAME:  # gradient column q_c is the last tap of the lane's window
            o_offs = x_lane + q64 * sx_h + (K - 1) * sx_w
        else:
            o_offs = b * so_b + ch * so_c + q64 * so_h + q_c.to(tl.int64) * so_w
        # the L1 term (sign and |x - y| of the pixels), weighted by the mask
        if HAS_L1 and WRITE_SUMS:
            l1_term, lane_l = l1_sign_term(xq, yq, l1, out, tl.load(scr + SUMS_AT + BW + ar), mq, HAS_L1, True)
            tl.store(scr + SUMS_AT + BW + ar, lane_l)
        else:
            l1_term, _ = l1_sign_term(xq, yq, l1, out, 0.0, mq, HAS_L1, False)
        if NEED1:
            store_grad(gx_ptr, o_offs, out, mq * gx, xq, yq, None, None, mq * l1_term, 1, HAS_L1)
        if NEED2:
            store_grad(gy_ptr, o_offs, out, mq * gy, yq, xq, None, None, mq * l1_term, -1, HAS_L1)
    return a_sq, a_xy, a_1, a_2


@triton.jit
def _masked_adjoint_columns(
    pid, x_ptr, y_ptr, m_ptr, w_ptr, mo_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr,
    BC, C, H, W, Ho, Wo, WP, n_chunks, n_strips, ROWS,
    sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sm_b, sm_c, sm_h, sm_w, so_b, so_c, so_h, so_w, c1, c2,
    K: tl.constexpr, PAD: tl.constexpr, F: tl.constexpr, BW: tl.constexpr, HAS_CS: tl.constexpr,
    HAS_L1: tl.constexpr, NEED1: tl.constexpr, NEED2: tl.constexpr, WRITE_SUMS: tl.constexpr,
    SAME: tl.constexpr, EDGE: tl.constexpr,
):  # fmt: skip
    group, chunk, strip, f, bc, lane_ok, b, ch = lanes(pid, BC, C, n_chunks, n_strips, F, BW)
    STEP: tl.constexpr = F - (K - 1)  # gradient columns per strip
    q_c0 = strip * STEP
    q_c = q_c0 + f  # gradient column of each lane (valid for f < STEP)
    qcol_ok = lane_ok & (f < STEP) & (q_c < W)
    p_c = q_c0 - (K - 1) + PAD + f  # map column whose partials the lane holds
    pcol_ok = lane_ok & (p_c >= 0) & (p_c < Wo)
    own_c = pcol_ok & (p_c >= q_c0) & (p_c < q_c0 + STEP)  # map columns this strip sums
    x_lane = b * sx_b + ch * sx_c + (p_c - PAD).to(tl.int64) * sx_w  # first tap of each lane's window, row 0
    if SAME:  # the images and the gradient in one layout: one offset serves all three
        y_lane = x_lane
    else:
        y_lane = b * sy_b + ch * sy_c + (p_c - PAD).to(tl.int64) * sy_w
    m_base, m_col, mo_base = _mask_and_planes(m_ptr, mo_ptr, group, bc, b, ch, p_c, C, Ho, WP, sm_b, sm_c, sm_w, PAD,
                                              F, BW)  # fmt: skip
    q_r0 = chunk * ROWS
    n_rows = tl.minimum(ROWS, H - q_r0)
    wt = load_taps(w_ptr, K)
    zero = tl.zeros([BW], dtype=tl.float32)
    # scratch (stays in L1/L2), as .split's adjoint: two rows of 5 values per lane, then the lanes'
    # two sums and the rows' shifts, each lane its own slots
    SUMS_AT: tl.constexpr = 10 * BW + 32
    RING_AT: tl.constexpr = SUMS_AT + 2 * BW
    scr = scr_ptr + pid.to(tl.int64) * (RING_AT + 2 * (K - 1) * BW)
    # per-channel upstream scalars (already divided by the channel's centre-weight sum)
    sel = group if F == BW else bc
    sel_ok = True if F == BW else lane_ok
    gs = tl.load(gs_ptr + sel, mask=sel_ok, other=0.0).to(tl.float32)
    if HAS_CS:
        gc = tl.load(gc_ptr + sel, mask=sel_ok, other=0.0).to(tl.float32)
    else:
        gc = 0.0
    if HAS_L1:  # the fused loss's L1 weight: (1 - lam) / (the image's mask sum), per channel
        l1 = tl.load(l1_ptr + sel, mask=sel_ok, other=0.0).to(tl.float32)
    else:
        l1 = 0.0
    if WRITE_SUMS:
        tl.store(scr + SUMS_AT + tl.arange(0, BW), zero)
        tl.store(scr + SUMS_AT + BW + tl.arange(0, BW), zero)
    # 1. the first K - 1 input rows complete no map row: their shifts only
    ring = scr + RING_AT + tl.arange(0, BW)
    for j in tl.static_range(K - 1):
        sj = row_shift(x_ptr, y_ptr, x_lane, y_lane, q_r0 - (K - 1) + j, p_c - PAD, H, W, sx_h, sx_w, sy_h, sy_w,
                       lane_ok, K, EDGE)  # fmt: skip
        tl.store(ring + j * BW, sj)
        tl.store(ring + (j + K - 1) * BW, sj)
    pend = ((zero,) * (K - 1), (zero,) * (K - 1), (zero,) * (K - 1), (zero,) * (K - 1))
    # 2. the next K - 1 complete map rows whose gradient rows lie above the chunk: the pending sums
    for i in tl.range(K - 1, 2 * (K - 1), num_stages=1):
        pend = _masked_adjoint_row(
            i, pend, x_ptr, y_ptr, m_base, w_ptr, mo_base, gs, gc, l1, gx_ptr, gy_ptr,
            scr, x_lane, y_lane, m_col, b, ch, q_r0, n_rows, q_c0, q_c, f, p_c, lane_ok, pcol_ok, qcol_ok, own_c,
            wt, H, W, Ho, WP, sx_h, sx_w, sy_h, sy_w, sm_h, sm_w, so_b, so_c, so_h, so_w, c1, c2,
            K, PAD, F, BW, HAS_CS, HAS_L1, NEED1, NEED2, WRITE_SUMS, SAME, EDGE, False,
        )  # fmt: skip
    # 3. the chunk's gradient rows
    for i in tl.range(2 * (K - 1), n_rows + 2 * (K - 1), num_stages=1):
        pend = _masked_adjoint_row(
            i, pend, x_ptr, y_ptr, m_base, w_ptr, mo_base, gs, gc, l1, gx_ptr, gy_ptr,
            scr, x_lane, y_lane, m_col, b, ch, q_r0, n_rows, q_c0, q_c, f, p_c, lane_ok, pcol_ok, qcol_ok, own_c,
            wt, H, W, Ho, WP, sx_h, sx_w, sy_h, sy_w, sm_h, sm_w, so_b, so_c, so_h, so_w, c1, c2,
            K, PAD, F, BW, HAS_CS, HAS_L1, NEED1, NEED2, WRITE_SUMS, SAME, EDGE, True,
        )  # fmt: skip
    if WRITE_SUMS:
        # per program and channel: the centre-weighted SSIM deficit and, with HAS_L1, the masked
        # |x - y| (the slots' address formed anew, as in .split's adjoint)
        sums = scr + SUMS_AT + tl.program_id(1) * BW + tl.arange(0, BW)
        store_sums(sum_ptr, tl.load(sums), BC, n_chunks * n_strips, 2, F, BW, pid)
        if HAS_L1:
            store_sums(sum_ptr + 1, tl.load(sums + BW), BC, n_chunks * n_strips, 2, F, BW, pid)


@triton.jit(do_not_specialize=SIZES + ("WP",))
def masked_adjoint_kernel(
    x_ptr, y_ptr, m_ptr, w_ptr, mo_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr,
    BC, C, H, W, Ho, Wo, WP, n_chunks, n_strips, ROWS,
    sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sm_b, sm_c, sm_h, sm_w, so_b, so_c, so_h, so_w, c1, c2,
    K: tl.constexpr, PAD: tl.constexpr, F: tl.constexpr, BW: tl.constexpr, HAS_CS: tl.constexpr,
    HAS_L1: tl.constexpr, NEED1: tl.constexpr, NEED2: tl.constexpr, WRITE_SUMS: tl.constexpr,
    SW: tl.constexpr, SAME: tl.constexpr,
):  # fmt: skip
    if SW > 0:  # both images' columns SW apart: immediate tap offsets
        sx_w = SW
        sy_w = SW
    strip = tl.program_id(0) % n_strips
    if interior(strip * (F - (K - 1)) - (K - 1), W, K, F, BW):
        _masked_adjoint_columns(
            tl.program_id(0), x_ptr, y_ptr, m_ptr, w_ptr, mo_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr,
            scr_ptr, sum_ptr, BC, C, H, W, Ho, Wo, WP, n_chunks, n_strips, ROWS, sx_b, sx_c, sx_h, sx_w,
            sy_b, sy_c, sy_h, sy_w, sm_b, sm_c, sm_h, sm_w, so_b, so_c, so_h, so_w, c1, c2, K, PAD, F, BW,
            HAS_CS, HAS_L1, NEED1, NEED2, WRITE_SUMS, SAME, False,
        )  # fmt: skip
    else:
        _masked_adjoint_columns(
            tl.program_id(0), x_ptr, y_ptr, m_ptr, w_ptr, mo_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr,
            scr_ptr, sum_ptr, BC, C, H, W, Ho, Wo, WP, n_chunks, n_strips, ROWS, sx_b, sx_c, sx_h, sx_w,
            sy_b, sy_c, sy_h, sy_w, sm_b, sm_c, sm_h, sm_w, so_b, so_c, so_h, so_w, c1, c2, K, PAD, F, BW,
            HAS_CS, HAS_L1, NEED1, NEED2, WRITE_SUMS, SAME, True,
        )  # fmt: skip


def masked_split_eligible(img1, img2, K: int, reflect: bool, need1: bool, need2: bool) -> bool:
    """Whether :func:`.masked_kernels.launch_masked_bwd` runs the two lean launches: where the
    unmasked backward does (:func:`.split.split_eligible`, with its switch)."""
    return split_eligible(img1, img2, K, reflect, need1, need2)


def masked_split_geometry(img1, window, padding: str):
    """The two launches' geometry and register ceilings: ``(geo_a, geo_b, reg_a, reg_b)``
    (:data:`MOMENTS_MAXNREG`, :data:`ADJOINT_MAXNREG`)."""
    B, C, H, W, K, pad, reflect, Ho, Wo = problem(img1, window, padding)
    bc = split_group(img1, window, padding, MOMENTS_BYTES) * C  # rows planned for a group of images
    geo_a, reg_a = _geometry(Wo, Ho, K, bc, img1.device, False, MOMENTS_MAXNREG)
    geo_b, reg_b = _geometry(W + K - 1, H, K, bc, img1.device, True, ADJOINT_MAXNREG)
    return geo_a, geo_b, reg_a, reg_b


def _geometry(frame: int, rows: int, K: int, bc: int, device, halo: bool, maxnreg: int):
    """:func:`.split.lean_geometry` at the ceiling ``maxnreg``."""
    geo = geometry(frame, rows, K, bc, device, halo=halo, maxnreg=maxnreg)
    if geo.f < geo.bw:
        return geometry(frame, rows, K, bc, device, halo=halo, maxnreg=COLUMN_MAXNREG), COLUMN_MAXNREG
    return geo, maxnreg


def launch_masked_bwd_split(
    img1, img2, mask, window, padding: str, c1: float, c2: float, g_s, g_cs, l1, gx, gy, sums: bool,
    rows_a: int, rows_b: int,
):  # fmt: skip
    """Both launches, as :func:`.masked_kernels.launch_masked_bwd` asks (``g_s`` / ``g_cs`` / ``l1``
    float32 ``[B, C]`` contiguous, ``g_cs`` and ``l1`` optional; ``gx`` / ``gy`` the gradient to
    write, the other None), with ``rows_a`` / ``rows_b`` rows per program, over groups of images
    whose moments take at most :data:`.split.MAX_MOMENTS_BYTES`. Returns the one-launch kernel's
    ``[B*C, P, 2]`` partial sums when ``sums``, else a placeholder."""
    B, C, H, W, K, pad, reflect, Ho, Wo = problem(img1, window, padding)
    dev = img1.device
    geo_a, geo_b, reg_a, reg_b = masked_split_geometry(img1, window, padding)
    G = geo_a.bw // geo_a.f  # channels per program of the moments' launch
    n_strips_a = cdiv(Wo, geo_a.f)
    wp = n_strips_a * geo_a.f  # map rows padded to whole strips: the moments' launch stores without masks
    group = split_group(img1, window, padding, MOMENTS_BYTES)
    gp = cdiv(group * C, G) * G  # channels padded to whole lane groups, for the same reason
    # per map row: four moments per column, then the columns' 1 / F(M)
    moments = torch.empty((gp, Ho, 5 * wp), dtype=torch.float32, device=dev)
    n_strips_b = cdiv(W, geo_b.f - (K - 1))
    n_chunks_a = cdiv(Ho, rows_a)
    n_chunks_b = cdiv(H, rows_b)
    sum_buf = torch.empty((B * C, n_chunks_b * n_strips_b, 2) if sums else (1,), dtype=torch.float32, device=dev)
    sw = shared_column_stride(img1, img2)
    same_xy = img1.stride() == img2.stride()
    out = gx if gx is not None else gy
    same = same_xy and out.stride() == img1.stride()
    scratch_a = scratch_b = None
    for b0 in range(0, B, group):
        b1 = min(B, b0 + group)
        BC = (b1 - b0) * C
        x, y, m = img1[b0:b1], img2[b0:b1], mask[b0:b1]
        gs = g_s[b0:b1]
        gc = g_cs[b0:b1] if g_cs is not None else gs
        w1 = l1[b0:b1] if l1 is not None else gs
        sb = sum_buf[b0 * C : b1 * C] if sums else sum_buf
        n_prog_a = cdiv(BC, G) * n_chunks_a * n_strips_a
        n_prog_b = cdiv(BC, geo_b.bw // geo_b.f) * n_chunks_b * n_strips_b
        if scratch_a is None or scratch_a.shape[0] < n_prog_a:
            scratch_a = torch.empty(
                (n_prog_a, (KEPT_SUMS.value + 2) * (K // 2) * geo_a.bw), dtype=torch.float32, device=dev
            )
            scratch_b = torch.empty((n_prog_b, (12 + 2 * (K - 1)) * geo_b.bw + 32), dtype=torch.float32, device=dev)
        ox = gx[b0:b1] if gx is not None else scratch_b
        oy = gy[b0:b1] if gy is not None else scratch_b
        with device_guard(img1):
            masked_moments_kernel[(n_prog_a,)](
                x, y, m, window, moments, scratch_a, BC, C, H, W, Ho, Wo, wp, n_chunks_a, n_strips_a, rows_a,
                *x.stride(), *y.stride(), *m.stride(), K=K, PAD=pad, F=geo_a.f, BW=geo_a.bw, SW=sw, SAME=same_xy,
                **launch_options(geo_a.warps, maxnreg=reg_a),
            )  # fmt: skip
            masked_adjoint_kernel[(n_prog_b,)](
                x, y, m, window, moments, gs, gc, w1, ox, oy, scratch_b, sb,
                BC, C, H, W, Ho, Wo, wp, n_chunks_b, n_strips_b, rows_b,
                *x.stride(), *y.stride(), *m.stride(), *out.stride(), float(c1), float(c2),
                K=K, PAD=pad, F=geo_b.f, BW=geo_b.bw, HAS_CS=g_cs is not None, HAS_L1=l1 is not None,
                NEED1=gx is not None, NEED2=gy is not None, WRITE_SUMS=sums, SW=sw, SAME=same,
                **launch_options(geo_b.warps, maxnreg=reg_b),
            )  # fmt: skip
    return sum_buf
