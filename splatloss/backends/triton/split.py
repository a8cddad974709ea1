"""The SSIM backward in two lean launches: the moments, then their adjoint (:data:`ENABLED`).

The one-launch backward (:mod:`.backward`) carries, per lane, the moments' vertical state and the
adjoint's pending sums at once, which holds it at 128 registers (16 resident warps per SM on
sm_90). Here the work is cut where the two meet, the map's moments:

- ``ssim_moments_kernel`` is the lean forward's walk (:func:`.forward._fwd_columns`'s geometry:
  one lane per map column, the last rows' sums and shifts kept in scratch) that stores each map
  pixel's four moments (E[x'], E[y'], E[x'^2 + y'^2], E[x'y'] around the centre row's shift;
  rows and channels padded to whole programs, so that the stores take no mask);
- ``ssim_adjoint_kernel`` walks the gradient rows as :func:`.backward._bwd_columns` does, reading
  the moments back: the partials of ``gs * SSIM + gc * cs`` (:func:`.moments.partials`), the
  vertical adjoint through pending sums moved to each row's shift, the horizontal one through a
  scratch row; the rows' shifts (formed again from the two pixels at each lane's centre) and the
  lanes' SSIM (cs) and ``|x - y|`` sums in its scratch, its rows in three loops (shifts only,
  pending sums only, the chunk's gradient rows);
- ``moments_scales_kernel`` / ``adjoint_scales_kernel``: the same over MS-SSIM's coarser scales.

Each launch fits 64 registers on sm_90 (32 resident warps per SM) without a spill in its loops.
The moments, partials, shifts and sums are the one-launch kernel's, computed by the same device
functions in the same order: the same bits (in the interpreter). The cost is the moments: 16 B per
map pixel-channel written and read back, and their memory while the backward runs (at most
:data:`MAX_MOMENTS_BYTES` per pair of launches). Windows up to ``COLUMN_TAPS`` taps, zero padding
("same", "valid"), one gradient, columns contiguous or a constant stride apart: the launches the
one-launch kernel runs at 128 registers (:func:`.launch.bwd_maxnreg`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .bodies import interior, l1_sign_term, lanes, scale_of, store_grad, store_sums
from .columns import (
    hadjoint_moved,
    hmoments,
    load_taps,
    pack,
    push,
    push_moved,
    stage_row,
    unpack,
    vmoments_kept,
    words,
)
from .launch import (
    COLUMN_MAXNREG,
    COLUMN_TAPS,
    SIZES,
    batched_rows,
    cdiv,
    device_arch,
    device_guard,
    fwd_maxnreg,
    geometry,
    launch_kernel,
    launch_options,
    out_size,
    padding_shape,
    problem,
    rows_over_groups,
    shared_column_stride,
)
from .moments import partials

__all__ = [
    "ssim_moments_kernel",
    "ssim_adjoint_kernel",
    "moments_scales_kernel",
    "adjoint_scales_kernel",
    "launch_bwd_split",
    "launch_bwd_scales_split",
    "split_eligible",
    "scales_split_eligible",
    "row_shift",
    "all_scales_eligible",
    "lean_geometry",
    "KEPT_ROWS",
    "MAX_MOMENTS_BYTES",
    "image_group",
    "split_group",
]

#: Scratch rows per kept input row of the moments kernel (:func:`.columns.vmoments_kept`).
KEPT_ROWS = tl.constexpr(4)


@triton.jit
def _vmoments_shifts_kept(state, h1, h2, h11, h12, s, wt, i, lane, K: tl.constexpr, BW: tl.constexpr):
    """:func:`.columns.vmoments_kept` with the last ``K // 2`` rows' shifts kept in the program's
    scratch too (the vertical pass reads no older one), twice over so that they are consecutive
    from slot ``i % (K // 2)``, past the four sums' rows: ``state`` is the pending windows' sums
    alone. The same moments bit for bit."""
    HALF: tl.constexpr = K // 2
    base = lane + (KEPT_ROWS * HALF + i % HALF) * BW
    last = ()
    for k in tl.static_range(HALF):  # slot base + k: row i - HALF + k
        last = last + (tl.load(base + k * BW),)
    hist = (tl.zeros_like(h1),) * (K - 1 - HALF) + last
    done, full = vmoments_kept((hist,) + state, h1, h2, h11, h12, s, wt, i, lane, 0, K, BW)
    tl.store(base, s)  # row i replaces row i - HALF
    tl.store(base + HALF * BW, s)
    return done, (full[1], full[2], full[3], full[4])


@triton.jit
def _moments_columns(
    pid, x_ptr, y_ptr, w_ptr, mo_ptr, scr_ptr, BC, C, H, W, Ho, Wo, WP, n_chunks, n_strips, ROWS,
    sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w,
    K: tl.constexpr, PAD: tl.constexpr, F: tl.constexpr, BW: tl.constexpr, SAME: tl.constexpr, EDGE: tl.constexpr,
):  # fmt: skip
    group, chunk, strip, f, bc, lane_ok, b, ch = lanes(pid, BC, C, n_chunks, n_strips, F, BW)
    p_c = strip * F + f  # map column of each lane
    x_lane = b * sx_b + ch * sx_c + (p_c - PAD).to(tl.int64) * sx_w  # first tap of each lane's window, row 0
    if SAME:  # both images' strides the same: one offset serves both
        y_lane = x_lane
    else:
        y_lane = b * sy_b + ch * sy_c + (p_c - PAD).to(tl.int64) * sy_w
    p_r0 = chunk * ROWS  # first map row of this chunk
    n_rows = tl.minimum(ROWS, Ho - p_r0)
    wt = load_taps(w_ptr, K)
    zero = tl.zeros([BW], dtype=tl.float32)
    ring = (zero,) * (K // 2)
    state = (ring, ring, ring, ring)
    lane = scr_ptr + pid.to(tl.int64) * ((KEPT_ROWS + 2) * (K // 2) * BW) + tl.arange(0, BW)
    for j in tl.static_range((KEPT_ROWS + 2) * (K // 2)):
        tl.store(lane + j * BW, zero)
    # the window's first K - 1 rows complete no map row; then each row completes map row p. One loop
    # for both: ptxas unrolls a loop of constant count, and tools/sass_cost.py counts the SASS by the
    # loops of the IR, so the first rows stay in the loop with the others
    at = mo_ptr + 4 * ((bc.to(tl.int64) * Ho + p_r0) * WP + p_c)  # map row p's moments
    for i in tl.range(0, n_rows + K - 1, num_stages=1):
        # padded input row p_r0 - PAD + i enters; from i = K - 1 map row p = p_r0 + i - (K - 1) completes
        h1, h2, h11, h12, _, s = hmoments(
            x_ptr, y_ptr, x_lane, y_lane, p_r0 - PAD + i, p_c - PAD, H, W, sx_h, sx_w, sy_h, sy_w,
            lane_ok, lane_ok, lane_ok, wt, K, PAD, False, False, EDGE, PAD == 0,
        )  # fmt: skip
        done, state = _vmoments_shifts_kept(state, h1, h2, h11, h12, s, wt, i, lane, K, BW)
        if i >= K - 1:
            mu1, mu2, e11, e12, _ = done  # around the map row's centre-row shift, which the adjoint forms again
            # no mask: the buffer's rows and channels are padded to whole strips and lane groups
            wo = at.to(tl.pointer_type(tl.int64))  # the four in two 64-bit words (16-byte aligned)
            tl.store(wo, pack(mu1, mu2))
            tl.store(wo + 1, pack(e11, e12))
            at += 4 * WP


@triton.jit(do_not_specialize=SIZES + ("WP",))
def ssim_moments_kernel(
    x_ptr, y_ptr, w_ptr, mo_ptr, scr_ptr, BC, C, H, W, Ho, Wo, WP, n_chunks, n_strips, ROWS,
    sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w,
    K: tl.constexpr, PAD: tl.constexpr, F: tl.constexpr, BW: tl.constexpr, SW: tl.constexpr,
    SAME: tl.constexpr,
):  # fmt: skip
    if SW > 0:  # both images' columns SW apart: immediate tap offsets
        sx_w = SW
        sy_w = SW
    strip = tl.program_id(0) % n_strips
    if interior(strip * F - PAD, W, K, F, BW):
        _moments_columns(
            tl.program_id(0), x_ptr, y_ptr, w_ptr, mo_ptr, scr_ptr, BC, C, H, W, Ho, Wo, WP, n_chunks, n_strips, ROWS,
            sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, K, PAD, F, BW, SAME, False,
        )  # fmt: skip
    else:
        _moments_columns(
            tl.program_id(0), x_ptr, y_ptr, w_ptr, mo_ptr, scr_ptr, BC, C, H, W, Ho, Wo, WP, n_chunks, n_strips, ROWS,
            sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, K, PAD, F, BW, SAME, True,
        )  # fmt: skip


@triton.jit
def row_shift(x_ptr, y_ptr, x_lane, y_lane, r, c0, H, W, sx_h, sx_w, sy_h, sy_w, lane_ok, K: tl.constexpr,
               EDGE: tl.constexpr):  # fmt: skip
    """The shift of padded input row ``r`` at each lane's centre tap, as :func:`.columns.hmoments`
    forms it under zero padding (``(x + y) / 2``; 0 where not finite or off the image)."""
    rowf = tl.where((r >= 0) & (r < H), 1.0, 0.0)
    rr = tl.minimum(tl.maximum(r, 0), H - 1)
    xrow = x_ptr + x_lane + rr.to(tl.int64) * sx_h
    yrow = y_ptr + y_lane + rr.to(tl.int64) * sy_h
    CT: tl.constexpr = K // 2
    if EDGE:
        cc = c0 + CT
        ok_c = lane_ok & (cc >= 0) & (cc < W)
        dc = (cc - c0).to(tl.int64)
        xc = tl.load(xrow + dc * sx_w, mask=ok_c, other=0.0).to(tl.float32)
        yc = tl.load(yrow + dc * sy_w, mask=ok_c, other=0.0).to(tl.float32)
    else:
        xc = tl.load(xrow + CT * sx_w).to(tl.float32)
        yc = tl.load(yrow + CT * sy_w).to(tl.float32)
    s = 0.5 * xc + 0.5 * yc
    s = tl.where(s - s == 0.0, s, 0.0)
    return s * rowf


@triton.jit
def _mask_and_planes(m_ptr, mo_ptr, group, bc, b, ch, p_c, C, Ho, WP, sm_b, sm_c, sm_w, PAD: tl.constexpr,
                     F: tl.constexpr, BW: tl.constexpr):  # fmt: skip
    """The masked launches' mask and moments: ``(m_base, m_col, mo_base)``, the mask read at
    ``m_base + m_col + row * sm_h`` (``m_col``: column ``p_c - PAD``), a map row's moments at
    ``mo_base + 5 WP p`` (four per column, then the inverses). With one channel per program the
    bases are the program's (scalars) and ``m_col`` a 32-bit column offset: no 64-bit offset per
    lane to hold through the rows."""
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
def _adjoint_row(
    i, pend, x_ptr, y_ptr, w_ptr, mo, gs_ptr, gc_ptr, gs, gc, l1, gx_ptr, gy_ptr,
    scr, x_lane, y_lane, b, ch, g_base, q_r0, n_rows, q_c0, q_c, f, p_c, lane_ok, pcol_ok, qcol_ok, own_c, wt,
    H, W, Ho, WP, sx_h, sx_w, sy_h, sy_w, sg_h, sg_w, so_b, so_c, so_h, so_w, c1, c2, m_base, m_col, sm_h, sm_w,
    K: tl.constexpr, PAD: tl.constexpr, F: tl.constexpr, BW: tl.constexpr, UPSTREAM_MAP: tl.constexpr,
    HAS_CS: tl.constexpr, HAS_L1: tl.constexpr, NEED1: tl.constexpr, NEED2: tl.constexpr,
    WRITE_SUMS: tl.constexpr, SAME: tl.constexpr, EDGE: tl.constexpr, OUT: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """Step ``i >= K - 1`` of :func:`_adjoint_columns`: padded input row ``r`` enters (its shift),
    map row ``p = r - (K - 1) + PAD`` (moments from the moments' launch, around the shift of their
    centre row) forms its partials and enters the pending sums; with ``OUT`` gradient row ``p -
    PAD`` completes and is stored (:func:`.backward._bwd_columns`, steps 2 to 4). ``MASKED``: the
    masked launch's (:mod:`.masked_split`): the moments are the masked sums and their inverse
    ``1 / F(M)`` (at ``mo``, :func:`_mask_and_planes`), the upstream is weighted by the centre mask
    and the gradient row by the mask (:func:`.masked_kernels.masked_bwd_kernel`'s steps 2 to 4)."""
    ar = tl.arange(0, BW)
    a_sq, a_xy, a_1, a_2 = pend
    # the shifts of the last K - 1 input rows, kept in the program's scratch (each lane its own
    # slots, twice over, so that the K - 1 newest are consecutive from slot i % (K - 1))
    SUMS_AT: tl.constexpr = 10 * BW + 32  # the scratch's layout (:func:`_adjoint_columns`)
    RING_AT: tl.constexpr = SUMS_AT + 2 * BW
    PEND_AT: tl.constexpr = RING_AT + 2 * (K - 1) * BW
    ring = scr + RING_AT + ar
    base = ring + (i % (K - 1)) * BW
    shift = tl.load(base + (K // 2) * BW)  # map row p's centre row
    r = q_r0 - (K - 1) + i
    s = row_shift(x_ptr, y_ptr, x_lane, y_lane, r, p_c - PAD, H, W, sx_h, sx_w, sy_h, sy_w, lane_ok, K, EDGE)
    p = r - (K - 1) + PAD
    valid = pcol_ok & (p >= 0) & (p < Ho)
    if MASKED:
        at = mo + p.to(tl.int64) * (5 * WP) + 4 * p_c
    else:
        at = mo + 4 * p.to(tl.int64) * WP
    wo = at.to(tl.pointer_type(tl.int64))  # the moments' two 64-bit words (the moments kernels' stores)
    mu1, mu2 = unpack(tl.load(wo, mask=valid, other=0))
    e11, e12 = unpack(tl.load(wo + 1, mask=valid, other=0))
    if MASKED:  # the four masked sums, their inverse and the centre mask of map position p
        inv = tl.load(at + 4 * WP - 3 * p_c, mask=valid, other=1.0)
        mc = tl.load(m_base + m_col + (p + (K // 2 - PAD)).to(tl.int64) * sm_h + (K // 2) * sm_w, mask=valid,
                     other=0.0)  # fmt: skip
        dmu = (mu1 - mu2) * inv  # the differences from the sums, as in the forward kernel
        dvar = (e11 - 2.0 * e12) * inv
        d1, d2, dsq, dxy, ssim, cs = partials(
            mu1 * inv, mu2 * inv, e11 * inv, None, e12 * inv, gs * mc, gc * mc, c1, c2, shift, dmu, dvar, HAS_CS
        )
    else:
        if UPSTREAM_MAP:
            g_offs = g_base + p.to(tl.int64) * sg_h + p_c.to(tl.int64) * sg_w
            gs = tl.load(gs_ptr + g_offs, mask=valid, other=0.0).to(tl.float32)
            if HAS_CS:
                gc = tl.load(gc_ptr + g_offs, mask=valid, other=0.0).to(tl.float32)
            else:
                gc = 0.0
        d1, d2, dsq, dxy, ssim, cs = partials(mu1, mu2, e11, None, e12, gs, gc, c1, c2, shift, None, None, HAS_CS)
    if WRITE_SUMS:  # the lanes' sums in the program's scratch (each lane its own slot): two fewer registers
        own = valid & own_c & (p >= q_r0) & (p < q_r0 + n_rows)
        if MASKED:  # the centre-weighted SSIM deficit
            tl.store(scr + SUMS_AT + ar, tl.load(scr + SUMS_AT + ar) + tl.where(own, mc * (1.0 - ssim), 0.0))
        else:
            tl.store(scr + SUMS_AT + ar, tl.load(scr + SUMS_AT + ar) + tl.where(own, ssim, 0.0))
    if MASKED:  # the partials w.r.t. the sums
        dsq = tl.where(valid, dsq * inv, 0.0)
        dxy = tl.where(valid, dxy * inv, 0.0)
        d1 = d1 * inv
        d2 = d2 * inv
    else:
        dsq = tl.where(valid, dsq, 0.0)
        dxy = tl.where(valid, dxy, 0.0)
    e = 2.0 * dsq + dxy
    # vertical adjoint: map row p enters gradient rows p - PAD + j with tap j, the means' partials
    # moved to each row's shift; gradient row q = p - PAD completes
    g_sq, a_sq = push(a_sq, dsq, wt, K, False)
    if MASKED:  # the x'y' partials' pending sums in the scratch: eight registers fewer (64, no spill)
        # slots 2 j and 2 j + 1 in one 64-bit word per lane (an odd last slot alone after them)
        pw = words(scr + PEND_AT + ar, BW)
        kept = ()
        for j in tl.static_range((K - 1) // 2):
            lo, hi = unpack(tl.load(pw + j * BW))
            kept = kept + (lo, hi)
        if (K - 1) % 2 == 1:
            kept = kept + (tl.load(scr + PEND_AT + (K - 2) * BW + ar),)
        g_xy, kept = push(kept, dxy, wt, K, False)
        for j in tl.static_range((K - 1) // 2):
            tl.store(pw + j * BW, pack(kept[2 * j], kept[2 * j + 1]))
        if (K - 1) % 2 == 1:
            tl.store(scr + PEND_AT + (K - 2) * BW + ar, kept[K - 2])
    else:
        g_xy, a_xy = push(a_xy, dxy, wt, K, False)
    hist = ()  # read where the moved sums need them, not before the partials
    for j in tl.static_range(K - 1):
        hist = hist + (shift if j == K // 2 else tl.load(base + j * BW),)
    g1 = 0.0
    g2 = 0.0
    if NEED1:
        g1, a_1 = push_moved(a_1, tl.where(valid, d1, 0.0), e, hist, s, shift, wt, K)
    if NEED2:
        g2, a_2 = push_moved(a_2, tl.where(valid, d2, 0.0), e, hist, s, shift, wt, K)
    q_shift = hist[0]
    tl.store(base, s)  # row i replaces row i - (K - 1)
    tl.store(base + (K - 1) * BW, s)
    if OUT:
        # horizontal adjoint of gradient row q through the scratch row (double-buffered: one barrier)
        buf = scr + (i % 2) * (5 * BW)
        stage_row(buf, 2.0 * g_sq, g_xy, g1, g2, tl.where(pcol_ok, q_shift, 0.0), NEED1, NEED2, BW, MASKED)
        tl.debug_barrier()
        q64 = (p - PAD).to(tl.int64)
        out = qcol_ok
        xq = tl.load(x_ptr + x_lane + q64 * sx_h + (K - 1) * sx_w, mask=out, other=0.0).to(tl.float32)
        yq = tl.load(y_ptr + y_lane + q64 * sy_h + (K - 1) * sy_w, mask=out, other=0.0).to(tl.float32)
        if MASKED:  # the mask of gradient pixel q
            mq = tl.load(m_base + m_col + q64 * sm_h + (K - 1) * sm_w, mask=out, other=0.0)
        else:
            mq = None
        gx, gy = hadjoint_moved(buf, wt, q_c0, W, f, xq, yq, NEED1, NEED2, F, BW, K, PAD, False, EDGE, MASKED)
        if SAME:  # gradient column q_c is the last tap of the lane's window
            o_offs = x_lane + q64 * sx_h + (K - 1) * sx_w
        else:
            o_offs = b * so_b + ch * so_c + q64 * so_h + q_c.to(tl.int64) * so_w
        # the L1 term (sign and |x - y| of the pixels; MASKED: weighted by the mask)
        if HAS_L1 and WRITE_SUMS:
            l1_term, lane_l = l1_sign_term(xq, yq, l1, out, tl.load(scr + SUMS_AT + BW + ar), mq, HAS_L1, True)
            tl.store(scr + SUMS_AT + BW + ar, lane_l)
        else:
            l1_term, _ = l1_sign_term(xq, yq, l1, out, 0.0, mq, HAS_L1, False)
        if MASKED:
            gx = mq * gx
            gy = mq * gy
            l1_term = mq * l1_term
        if NEED1:
            store_grad(gx_ptr, o_offs, out, gx, xq, yq, None, None, l1_term, 1, HAS_L1)
        if NEED2:
            store_grad(gy_ptr, o_offs, out, gy, yq, xq, None, None, l1_term, -1, HAS_L1)
    return a_sq, a_xy, a_1, a_2


@triton.jit
def _adjoint_columns(
    pid, x_ptr, y_ptr, w_ptr, mo_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr,
    BC, C, H, W, Ho, Wo, WP, n_chunks, n_strips, ROWS,
    sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sg_b, sg_c, sg_h, sg_w, so_b, so_c, so_h, so_w, c1, c2,
    m_ptr, sm_b, sm_c, sm_h, sm_w,
    K: tl.constexpr, PAD: tl.constexpr, F: tl.constexpr, BW: tl.constexpr, UPSTREAM_MAP: tl.constexpr,
    HAS_CS: tl.constexpr, HAS_L1: tl.constexpr, NEED1: tl.constexpr, NEED2: tl.constexpr,
    WRITE_SUMS: tl.constexpr, SAME: tl.constexpr, EDGE: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    # MASKED: the masked launch's (:func:`.masked_split.masked_adjoint_kernel`; the mask at m_ptr,
    # strides sm_*; per-channel upstreams already divided by the channel's centre-weight sum, and
    # with HAS_L1 the L1 weight (1 - lam) / (the image's mask sum); no upstream map)
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
    if MASKED:
        m_base, m_col, mo = _mask_and_planes(m_ptr, mo_ptr, group, bc, b, ch, p_c, C, Ho, WP, sm_b, sm_c, sm_w, PAD,
                                             F, BW)  # fmt: skip
    else:
        m_base = m_ptr
        m_col = 0
    q_r0 = chunk * ROWS
    n_rows = tl.minimum(ROWS, H - q_r0)
    wt = load_taps(w_ptr, K)
    zero = tl.zeros([BW], dtype=tl.float32)
    # scratch (stays in L1/L2): two rows of 5 values per lane (the horizontal adjoint's, double-buffered:
    # one barrier per row; read up to K - 1 past a row), then the lanes' two sums and the rows' shifts,
    # each lane its own slots; MASKED: then the x'y' partials' K - 1 pending sums
    SUMS_AT: tl.constexpr = 10 * BW + 32
    RING_AT: tl.constexpr = SUMS_AT + 2 * BW
    PEND_AT: tl.constexpr = RING_AT + 2 * (K - 1) * BW
    scr = scr_ptr + pid.to(tl.int64) * (PEND_AT + (K - 1) * BW if MASKED else PEND_AT)
    sel = group if F == BW else bc
    sel_ok = True if F == BW else lane_ok
    if UPSTREAM_MAP:
        g_base = b * sg_b + ch * sg_c
        gs = 0.0
        gc = 0.0
    else:
        g_base = 0
        gs = tl.load(gs_ptr + sel, mask=sel_ok, other=0.0).to(tl.float32)
        if HAS_CS:
            gc = tl.load(gc_ptr + sel, mask=sel_ok, other=0.0).to(tl.float32)
        else:
            gc = 0.0
    if HAS_L1:
        l1 = tl.load(l1_ptr + sel, mask=sel_ok, other=0.0).to(tl.float32)
    else:
        l1 = 0.0
    if WRITE_SUMS:
        tl.store(scr + SUMS_AT + tl.arange(0, BW), zero)
        tl.store(scr + SUMS_AT + BW + tl.arange(0, BW), zero)
    if not MASKED:
        mo = mo_ptr + 4 * (bc.to(tl.int64) * Ho * WP + p_c)
    # 1. the first K - 1 input rows complete no map row: their shifts only (the pending sums of
    #    rows of zeros are zeros)
    ring = scr + RING_AT + tl.arange(0, BW)  # the rows' shifts (:func:`_adjoint_row`)
    for j in tl.static_range(K - 1):
        sj = row_shift(x_ptr, y_ptr, x_lane, y_lane, q_r0 - (K - 1) + j, p_c - PAD, H, W, sx_h, sx_w, sy_h, sy_w,
                        lane_ok, K, EDGE)  # fmt: skip
        tl.store(ring + j * BW, sj)
        tl.store(ring + (j + K - 1) * BW, sj)
    if MASKED:
        for j in tl.static_range(K - 1):
            tl.store(scr + PEND_AT + j * BW + tl.arange(0, BW), zero)
        pend = ((zero,) * (K - 1), (), (zero,) * (K - 1), (zero,) * (K - 1))
    else:
        pend = ((zero,) * (K - 1), (zero,) * (K - 1), (zero,) * (K - 1), (zero,) * (K - 1))
    # 2. the next K - 1 complete map rows whose gradient rows lie above the chunk: the pending sums
    for i in tl.range(K - 1, 2 * (K - 1), num_stages=1):
        pend = _adjoint_row(
            i, pend, x_ptr, y_ptr, w_ptr, mo, gs_ptr, gc_ptr, gs, gc, l1, gx_ptr, gy_ptr,
            scr, x_lane, y_lane, b, ch, g_base, q_r0, n_rows, q_c0, q_c, f, p_c, lane_ok, pcol_ok, qcol_ok, own_c, wt,
            H, W, Ho, WP, sx_h, sx_w, sy_h, sy_w, sg_h, sg_w, so_b, so_c, so_h, so_w, c1, c2, m_base, m_col, sm_h,
            sm_w, K, PAD, F, BW, UPSTREAM_MAP, HAS_CS, HAS_L1, NEED1, NEED2, WRITE_SUMS, SAME, EDGE, False, MASKED,
        )  # fmt: skip
    # 3. the chunk's gradient rows
    for i in tl.range(2 * (K - 1), n_rows + 2 * (K - 1), num_stages=1):
        pend = _adjoint_row(
            i, pend, x_ptr, y_ptr, w_ptr, mo, gs_ptr, gc_ptr, gs, gc, l1, gx_ptr, gy_ptr,
            scr, x_lane, y_lane, b, ch, g_base, q_r0, n_rows, q_c0, q_c, f, p_c, lane_ok, pcol_ok, qcol_ok, own_c, wt,
            H, W, Ho, WP, sx_h, sx_w, sy_h, sy_w, sg_h, sg_w, so_b, so_c, so_h, so_w, c1, c2, m_base, m_col, sm_h,
            sm_w, K, PAD, F, BW, UPSTREAM_MAP, HAS_CS, HAS_L1, NEED1, NEED2, WRITE_SUMS, SAME, EDGE, True, MASKED,
        )  # fmt: skip
    if WRITE_SUMS:
        # per program and channel: the SSIM (cs; MASKED: the centre-weighted SSIM deficit) and, with
        # HAS_L1, |x - y| (MASKED: masked) sums of the pixels it owns. The slots' address formed anew
        # (program_id(1) is 0 in this 1-D grid, which the compiler cannot know): the loops' address
        # would otherwise be held past them, spilled (8 B)
        sums = scr + SUMS_AT + tl.program_id(1) * BW + tl.arange(0, BW)
        store_sums(sum_ptr, tl.load(sums), BC, n_chunks * n_strips, 2, F, BW, pid)
        if HAS_L1:
            store_sums(sum_ptr + 1, tl.load(sums + BW), BC, n_chunks * n_strips, 2, F, BW, pid)


@triton.jit(do_not_specialize=SIZES + ("WP",))
def ssim_adjoint_kernel(
    x_ptr, y_ptr, w_ptr, mo_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr,
    BC, C, H, W, Ho, Wo, WP, n_chunks, n_strips, ROWS,
    sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sg_b, sg_c, sg_h, sg_w, so_b, so_c, so_h, so_w, c1, c2,
    K: tl.constexpr, PAD: tl.constexpr, F: tl.constexpr, BW: tl.constexpr, UPSTREAM_MAP: tl.constexpr,
    HAS_CS: tl.constexpr, HAS_L1: tl.constexpr, NEED1: tl.constexpr, NEED2: tl.constexpr,
    WRITE_SUMS: tl.constexpr, SW: tl.constexpr, SAME: tl.constexpr,
):  # fmt: skip
    if SW > 0:  # both images' columns SW apart: immediate tap offsets
        sx_w = SW
        sy_w = SW
    strip = tl.program_id(0) % n_strips
    if interior(strip * (F - (K - 1)) - (K - 1), W, K, F, BW):
        _adjoint_columns(
            tl.program_id(0), x_ptr, y_ptr, w_ptr, mo_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr,
            BC, C, H, W, Ho, Wo, WP, n_chunks, n_strips, ROWS, sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w,
            sg_b, sg_c, sg_h, sg_w, so_b, so_c, so_h, so_w, c1, c2, x_ptr, 0, 0, 0, 0, K, PAD, F, BW, UPSTREAM_MAP,
            HAS_CS, HAS_L1, NEED1, NEED2, WRITE_SUMS, SAME, False, False,
        )  # fmt: skip
    else:
        _adjoint_columns(
            tl.program_id(0), x_ptr, y_ptr, w_ptr, mo_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr,
            BC, C, H, W, Ho, Wo, WP, n_chunks, n_strips, ROWS, sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w,
            sg_b, sg_c, sg_h, sg_w, so_b, so_c, so_h, so_w, c1, c2, x_ptr, 0, 0, 0, 0, K, PAD, F, BW, UPSTREAM_MAP,
            HAS_CS, HAS_L1, NEED1, NEED2, WRITE_SUMS, SAME, True, False,
        )  # fmt: skip


#: Run the two lean launches where they apply. Off: the one-launch kernels, the path a GPU has
#: timed, run everywhere; the GPU check (``tools/gpu_check.py``) turns this on to time the two
#: launches against them, and only a GPU measurement makes them a default.
ENABLED = False


def split_eligible(img1, img2, K: int, reflect: bool, need1: bool, need2: bool) -> bool:
    """Whether :func:`.backward.launch_bwd` runs the two lean launches (with :data:`ENABLED`): the
    launches its one-launch kernel runs at 128 registers (:func:`.launch.bwd_maxnreg`: the column
    body, no "reflect", one gradient, columns contiguous or a constant stride apart)."""
    if not ENABLED:
        return False
    strided = (img1.stride(3) != 1 or img2.stride(3) != 1) and not shared_column_stride(img1, img2)
    return K <= COLUMN_TAPS.value and not reflect and not (need1 and need2) and not strided


def scales_split_eligible(reflect: bool, need1: bool, need2: bool) -> bool:
    """Whether :func:`.backward.launch_bwd_scales` runs the two lean launches (with :data:`ENABLED`;
    its windows are column windows): zero padding, one gradient."""
    return ENABLED and not reflect and not (need1 and need2)


def all_scales_eligible(img1, img2, dims, K: int, padding: str, need1: bool, need2: bool) -> bool:
    """Whether MS-SSIM runs its finest scale in the coarser scales' two launches
    (:func:`.backward.launch_bwd_scales` with ``first``; ``dims``: every scale's ``(H, W)``, the
    finest first): where :func:`scales_split_eligible`, column windows, both images contiguous and
    of one dtype, float32, float16 or bfloat16 (the finest scale's programs read the images in their
    own dtype, the coarser scales float32), and every scale's moments within
    :data:`MAX_MOMENTS_BYTES` (a larger batch runs the finest scale on its own, in groups of
    images)."""
    _, reflect = padding_shape(K, padding)
    if not ((need1 or need2) and len(dims) > 1 and K <= COLUMN_TAPS.value):
        return False
    if not scales_split_eligible(reflect, need1, need2):
        return False
    if img1.dtype != img2.dtype or not (img1.is_contiguous() and img2.is_contiguous()):
        return False
    if img1.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return False
    B, C = img1.shape[:2]
    geo_a = scales_split_geometry(B, C, dims, K, padding, img1.device)[0]
    return 4 * sum(_moments_sizes(B * C, dims, K, padding, geo_a)) <= MAX_MOMENTS_BYTES  # float32 elements


def _moments_sizes(BC: int, dims, K: int, padding: str, geo_a):
    """Elements of each scale's moments in the scales' launches (channels padded to whole lane
    groups, map rows to whole strips; 4 a map pixel)."""
    dh = out_size(dims[0][0], K, padding) - dims[0][0]
    G = geo_a.bw // geo_a.f
    gp = cdiv(BC, G) * G
    return [gp * (h + dh) * cdiv(w + dh, geo_a.f) * geo_a.f * 4 for h, w in dims]


def split_geometry(img1, img2, window, padding: str):
    """The two launches' geometry and register ceilings: ``(geo_a, geo_b, reg_a, reg_b)``
    (:func:`lean_geometry`), their rows planned for a group of images (:func:`split_group`), or
    over every group's launch where the groups are uneven."""
    B, C, H, W, K, pad, reflect, Ho, Wo = problem(img1, window, padding)
    group = split_group(img1, window, padding)
    dev = img1.device
    geo_a, reg_a = lean_geometry(Wo, Ho, K, group * C, dev, False)
    geo_b, reg_b = lean_geometry(W + K - 1, H, K, group * C, dev, True)
    # uneven groups: rows planned over every group's launch (:func:`.launch.rows_over_groups`)
    geo_a = rows_over_groups(geo_a, reg_a, Wo, Ho, K, B, group, C, dev, halo=False)
    geo_b = rows_over_groups(geo_b, reg_b, W + K - 1, H, K, B, group, C, dev, halo=True)
    return geo_a, geo_b, reg_a, reg_b


def split_group(img1, window, padding: str) -> int:
    """Images per pair of launches (:func:`image_group`), counted in map pixel-channels (the map's
    rows padded to whole strips of the moments' launch) at the unmasked moments' 16 B each, masked
    or not: the masked pair's moments (20 B a pixel) get the same pixels, so a batch runs in the
    same groups either way (five 1080p RGB images: 498 MB of moments in one group, 622 MB masked)."""
    B, C, H, W, K, pad, reflect, Ho, Wo = problem(img1, window, padding)
    f = geometry(Wo, Ho, K, C, img1.device).f  # map columns per strip: the same for any batch
    return image_group(B, C * Ho * cdiv(Wo, f) * f * 16)


def lean_geometry(frame: int, rows: int, K: int, bc: int, device, halo: bool):
    """A launch's geometry (:func:`.launch.geometry`) and register ceiling: the lean forward's
    (:func:`.launch.fwd_maxnreg`: 64 on sm_90) where a program holds one channel; 128 where its
    rows are short enough that it holds several (each lane then loads its own channel's upstream
    and L1 weights: 8 to 40 B spilled at 64), images narrower than half a program."""
    lean = fwd_maxnreg(K, lean=True, arch=device_arch(device))
    geo = geometry(frame, rows, K, bc, device, halo=halo, maxnreg=lean)
    if geo.f < geo.bw:
        return geometry(frame, rows, K, bc, device, halo=halo, maxnreg=COLUMN_MAXNREG), COLUMN_MAXNREG
    return geo, lean


#: The moments buffer of one pair of launches at most (bytes, at 16 B per map pixel and channel;
#: the masked pair's 20 B moments hold as many pixels, 640 MiB: :func:`split_group`): a larger
#: batch runs in groups of images one after the other, each group at least one image.
MAX_MOMENTS_BYTES = 512 * 2**20


def image_group(B: int, per_image: int) -> int:
    """Images per pair of launches for a batch of ``B`` whose moments take ``per_image`` bytes an
    image: as few groups as :data:`MAX_MOMENTS_BYTES` allows, as even as can be (five images of
    which four fit: three and two, not four and one, whose second pair would fill a fifth of the
    first's waves), each at least one image."""
    most = max(1, min(B, MAX_MOMENTS_BYTES // per_image))
    return cdiv(B, cdiv(B, most))


def launch_bwd_split(
    img1, img2, window, padding: str, c1: float, c2: float, g_s, g_cs, need1: bool, need2: bool,
    l1, gx, gy, sums: bool, cs_only: bool, rows_a: int, rows_b: int,
):  # fmt: skip
    """Both launches, as :func:`.backward.launch_bwd` asks (its arguments; ``gx`` / ``gy`` the
    gradients to write, None where not needed; ``l1`` float32 contiguous or None; ``g_s`` a
    ``[B, C]`` float32 tensor or a map, ``g_cs`` likewise or None), with ``rows_a`` / ``rows_b``
    rows per program, over groups of images whose moments take at most :data:`MAX_MOMENTS_BYTES`.
    Returns the one-launch kernel's ``[B*C, P, 2]`` partial sums (SSIM or cs, ``|x - y|``) when
    ``sums``, else a placeholder."""
    B, C, H, W, K, pad, reflect, Ho, Wo = problem(img1, window, padding)
    dev = img1.device
    geo_a, geo_b, reg_a, reg_b = split_geometry(img1, img2, window, padding)
    G = geo_a.bw // geo_a.f  # channels per program of the moments' launch
    n_strips_a = cdiv(Wo, geo_a.f)
    wp = n_strips_a * geo_a.f  # map rows padded to whole strips: the moments' launch stores without masks
    group = split_group(img1, window, padding)
    # channels padded to whole lane groups, for the same reason
    moments = torch.empty((cdiv(group * C, G) * G, Ho, wp, 4), dtype=torch.float32, device=dev)
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
        x, y = img1[b0:b1], img2[b0:b1]
        gs = g_s[b0:b1]
        gc = g_cs[b0:b1] if g_cs is not None else gs
        w1 = l1[b0:b1] if l1 is not None else gs
        sb = sum_buf[b0 * C : b1 * C] if sums else sum_buf
        n_prog_a = cdiv(BC, G) * n_chunks_a * n_strips_a
        n_prog_b = cdiv(BC, geo_b.bw // geo_b.f) * n_chunks_b * n_strips_b
        if scratch_a is None or scratch_a.shape[0] < n_prog_a:
            scratch_a = torch.empty(
                (n_prog_a, (KEPT_ROWS.value + 2) * (K // 2) * geo_a.bw), dtype=torch.float32, device=dev
            )
            scratch_b = torch.empty((n_prog_b, (12 + 2 * (K - 1)) * geo_b.bw + 32), dtype=torch.float32, device=dev)
        ox = gx[b0:b1] if gx is not None else scratch_b
        oy = gy[b0:b1] if gy is not None else scratch_b
        with device_guard(img1):
            launch_kernel(ssim_moments_kernel, (n_prog_a,),
                x, y, window, moments, scratch_a, BC, C, H, W, Ho, Wo, wp, n_chunks_a, n_strips_a, rows_a,
                *x.stride(), *y.stride(), K=K, PAD=pad, F=geo_a.f, BW=geo_a.bw, SW=sw, SAME=same_xy,
                **launch_options(geo_a.warps, maxnreg=reg_a),
            )  # fmt: skip
            launch_kernel(ssim_adjoint_kernel, (n_prog_b,),
                x, y, window, moments, gs, gc, w1, ox, oy, scratch_b, sb,
                BC, C, H, W, Ho, Wo, wp, n_chunks_b, n_strips_b, rows_b,
                *x.stride(), *y.stride(), *(gs.stride() if gs.dim() == 4 else (0, 0, 0, 0)), *out.stride(),
                float(c1), float(c2), K=K, PAD=pad, F=geo_b.f, BW=geo_b.bw, UPSTREAM_MAP=gs.dim() == 4,
                HAS_CS=2 if cs_only else g_cs is not None, HAS_L1=l1 is not None, NEED1=need1, NEED2=need2,
                WRITE_SUMS=sums, SW=sw, SAME=same, **launch_options(geo_b.warps, maxnreg=reg_b),
            )  # fmt: skip
    return sum_buf


# ------------------------------------------------------------------------------------------------
# MS-SSIM's coarser scales: both launches over every coarser scale at once, as
# .backward.ssim_bwd_scales_kernel (the scales' pairs one after the other in one flat buffer, each
# program finding its scale: .bodies.scale_of), each scale's moments one after the other in one
# buffer (channels and rows padded as above).
# ------------------------------------------------------------------------------------------------


@triton.jit
def _moments_offset(scale, GP, H1, W1, DH, NS: tl.constexpr, FA: tl.constexpr):
    """Element offset of scale ``scale``'s moments: the scales before it, each ``GP`` (padded)
    channels x ``H_s + DH`` map rows x its map rows padded to whole ``FA``-lane strips x 4."""
    h = H1
    w = W1
    off = (scale * 0).to(tl.int64)
    for s in tl.static_range(NS):
        size = GP.to(tl.int64) * (h + DH) * (((w + DH + FA - 1) // FA) * FA) * 4
        off += tl.where(s < scale, size, 0)
        h = (h + 1) // 2
        w = (w + 1) // 2
    return off


@triton.jit
def _scale_base(ptr, first_ptr, scale, o, N0, FIRST: tl.constexpr):
    """Where scale ``scale``'s pair (or gradient) starts: at element ``o`` of the flat buffer
    ``ptr``; with ``FIRST``, scale 0 is ``first_ptr`` (the images themselves) and the flat buffer
    holds the scales after it, ``N0`` elements (scale 0's) earlier."""
    base = ptr + o
    if FIRST:
        base = ptr + (o - N0)
        if scale == 0:
            base = first_ptr
    return base


@triton.jit(do_not_specialize=("BC", "C", "H1", "W1", "DH", "ROWS", "GP", "N0"))
def moments_scales_kernel(
    x_ptr, y_ptr, w_ptr, mo_ptr, scr_ptr, BC, C, H1, W1, DH, ROWS, GP, x0_ptr, y0_ptr, N0,
    NS: tl.constexpr, K: tl.constexpr, PAD: tl.constexpr, F: tl.constexpr, BW: tl.constexpr,
    FIRST: tl.constexpr, OWN0: tl.constexpr,
):  # fmt: skip
    # OWN0 (with FIRST): scale 0 read in its own dtype (float16 / bfloat16 images), a body of its own
    pid = tl.program_id(0)
    scale, H, W, start, o, _, n_chunks, n_strips = scale_of(pid, BC, H1, W1, ROWS, DH, DH, NS, F, BW // F, 1)
    hw = H.to(tl.int64) * W
    chw = hw * C
    WP = ((W + DH + F - 1) // F) * F
    mo = mo_ptr + _moments_offset(scale, GP, H1, W1, DH, NS, F)
    scr = scr_ptr + start.to(tl.int64) * ((KEPT_ROWS + 2) * (K // 2) * BW)
    if OWN0:
        if scale == 0:
            _moments_columns(
                pid - start, x0_ptr, y0_ptr, w_ptr, mo, scr, BC, C, H, W, H + DH, W + DH, WP, n_chunks, n_strips,
                ROWS, chw, hw, W, 1, chw, hw, W, 1, K, PAD, F, BW, True, True,
            )  # fmt: skip
        else:
            _moments_columns(
                pid - start, x_ptr + (o - N0), y_ptr + (o - N0), w_ptr, mo, scr, BC, C, H, W, H + DH, W + DH, WP,
                n_chunks, n_strips, ROWS, chw, hw, W, 1, chw, hw, W, 1, K, PAD, F, BW, True, True,
            )  # fmt: skip
    else:
        _moments_columns(
            pid - start, _scale_base(x_ptr, x0_ptr, scale, o, N0, FIRST),
            _scale_base(y_ptr, y0_ptr, scale, o, N0, FIRST), w_ptr, mo, scr, BC, C, H, W, H + DH, W + DH, WP,
            n_chunks, n_strips, ROWS, chw, hw, W, 1, chw, hw, W, 1, K, PAD, F, BW, True, True,
        )  # fmt: skip


@triton.jit
def _adjoint_scale(
    pid, xb, yb, w_ptr, mo, u, gxb, gyb, scr, sums, x_ptr, BC, C, H, W, DH, WP, n_chunks, n_strips, ROWS, c1, c2,
    K: tl.constexpr, PAD: tl.constexpr, F: tl.constexpr, BW: tl.constexpr, MODE: tl.constexpr,
    NEED1: tl.constexpr, NEED2: tl.constexpr,
):  # fmt: skip
    # one scale's adjoint (contiguous planes; MODE 0: the SSIM map's mean, 2: the cs map's)
    hw = H.to(tl.int64) * W
    chw = hw * C
    _adjoint_columns(
        pid, xb, yb, w_ptr, mo, u, u, u, gxb, gyb, scr, sums,
        BC, C, H, W, H + DH, W + DH, WP, n_chunks, n_strips, ROWS, chw, hw, W, 1, chw, hw, W, 1, 0, 0, 0, 0,
        chw, hw, W, 1, c1, c2, x_ptr, 0, 0, 0, 0, K, PAD, F, BW, False, MODE, False, NEED1, NEED2, True, True, True,
        False,
    )  # fmt: skip


@triton.jit(do_not_specialize=("BC", "C", "H1", "W1", "DH", "ROWS", "GP", "N0"))
def adjoint_scales_kernel(
    x_ptr, y_ptr, w_ptr, mo_ptr, u_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr, BC, C, H1, W1, DH, ROWS, GP, c1, c2,
    x0_ptr, y0_ptr, gx0_ptr, gy0_ptr, N0,
    NS: tl.constexpr, K: tl.constexpr, PAD: tl.constexpr, F: tl.constexpr, BW: tl.constexpr, FA: tl.constexpr,
    NEED1: tl.constexpr, NEED2: tl.constexpr, FIRST: tl.constexpr, OWN0: tl.constexpr,
):  # fmt: skip
    # OWN0 (with FIRST): scale 0's pair read in its own dtype (float16 / bfloat16 images), a body of
    # its own; its gradients are float32, as every scale's
    pid = tl.program_id(0)
    STEP: tl.constexpr = F - (K - 1)
    scale, H, W, start, o, so, n_chunks, n_strips = scale_of(pid, BC, H1, W1, ROWS, 0, 0, NS, STEP, BW // F, 2)
    WP = ((W + DH + FA - 1) // FA) * FA
    mo = mo_ptr + _moments_offset(scale, GP, H1, W1, DH, NS, FA)
    scr = scr_ptr + start.to(tl.int64) * ((12 + 2 * (K - 1)) * BW + 32)
    u = u_ptr + scale * BC
    if OWN0:  # the scales after the first at their place in the flat buffers
        xb = x_ptr + (o - N0)
        yb = y_ptr + (o - N0)
    else:
        xb = _scale_base(x_ptr, x0_ptr, scale, o, N0, FIRST)
        yb = _scale_base(y_ptr, y0_ptr, scale, o, N0, FIRST)
    gxb = _scale_base(gx_ptr, gx0_ptr, scale, o, N0, FIRST)
    gyb = _scale_base(gy_ptr, gy0_ptr, scale, o, N0, FIRST)
    if scale == NS - 1:  # the last scale: the SSIM map's mean
        _adjoint_scale(
            pid - start, xb, yb, w_ptr, mo, u, gxb, gyb, scr, sum_ptr + so, x_ptr, BC, C, H, W, DH, WP, n_chunks,
            n_strips, ROWS, c1, c2, K, PAD, F, BW, 0, NEED1, NEED2,
        )  # fmt: skip
    elif OWN0:
        if scale == 0:  # the cs map's mean, of the images themselves
            _adjoint_scale(
                pid - start, x0_ptr, y0_ptr, w_ptr, mo, u, gxb, gyb, scr, sum_ptr + so, x_ptr, BC, C, H, W, DH, WP,
                n_chunks, n_strips, ROWS, c1, c2, K, PAD, F, BW, 2, NEED1, NEED2,
            )  # fmt: skip
        else:  # the cs map's mean
            _adjoint_scale(
                pid - start, xb, yb, w_ptr, mo, u, gxb, gyb, scr, sum_ptr + so, x_ptr, BC, C, H, W, DH, WP,
                n_chunks, n_strips, ROWS, c1, c2, K, PAD, F, BW, 2, NEED1, NEED2,
            )  # fmt: skip
    else:  # the cs map's mean
        _adjoint_scale(
            pid - start, xb, yb, w_ptr, mo, u, gxb, gyb, scr, sum_ptr + so, x_ptr, BC, C, H, W, DH, WP, n_chunks,
            n_strips, ROWS, c1, c2, K, PAD, F, BW, 2, NEED1, NEED2,
        )  # fmt: skip


def scales_split_geometry(B: int, C: int, dims, K: int, padding: str, device):
    """The coarser scales' two launches: ``(geo_a, rows_a, geo_b, n_groups_b, chunks_b, reg_a, reg_b)``,
    the moments' geometry and rows, the adjoint's geometry, lane groups and programs per row chunk
    of each scale (:func:`.launch.batched_rows` plans its rows)."""
    BC = B * C
    maps = [(out_size(h, K, padding), out_size(w, K, padding)) for h, w in dims]
    geo_a, reg_a = lean_geometry(maps[0][1], maps[0][0], K, BC, device, False)
    per_chunk_a = [cdiv(BC, geo_a.bw // geo_a.f) * cdiv(wo, geo_a.f) for _, wo in maps]
    rows_a = batched_rows(per_chunk_a, [ho for ho, _ in maps], K, geo_a.warps, reg_a, device, halo=False)
    geo_b, reg_b = lean_geometry(dims[0][1] + K - 1, dims[0][0], K, BC, device, True)
    n_groups_b = cdiv(BC, geo_b.bw // geo_b.f)
    chunks_b = [n_groups_b * cdiv(w, geo_b.f - (K - 1)) for _, w in dims]
    return geo_a, rows_a, geo_b, n_groups_b, chunks_b, reg_a, reg_b


def launch_bwd_scales_split(
    x, y, B: int, C: int, dims, window, padding: str, c1, c2, u, gx, gy, rows_b: int, first=None
):  # fmt: skip
    """Both launches over MS-SSIM's coarser scales (:func:`.backward.launch_bwd_scales`'s arguments;
    ``u`` the scales' unit upstreams ``[len(dims), B*C]``, ``gx`` / ``gy`` the flat gradients or
    None), the adjoint at ``rows_b`` rows per program. ``first``: ``(x0, y0, gx0, gy0)``, the finest
    scale's pair (contiguous float32, float16 or bfloat16, ``dims[0]``) and its float32 gradients
    (None where not asked for), in
    the same launches as the scales after it, which ``x``, ``y``, ``gx``, ``gy`` then hold. Returns
    ``(slots, sum_buf)``: each scale's programs per channel group and their partial sums (SSIM or
    cs)."""
    K = window.shape[0]
    pad, _ = padding_shape(K, padding)
    BC = B * C
    dev = x.device
    geo_a, rows_a, geo_b, n_groups_b, chunks_b, reg_a, reg_b = scales_split_geometry(B, C, dims, K, padding, dev)
    dh = out_size(dims[0][0], K, padding) - dims[0][0]
    G = geo_a.bw // geo_a.f
    gp = cdiv(BC, G) * G
    moments = torch.empty(sum(_moments_sizes(BC, dims, K, padding, geo_a)), dtype=torch.float32, device=dev)
    n_prog_a = sum(cdiv(BC, G) * cdiv(h + dh, rows_a) * cdiv(w + dh, geo_a.f) for h, w in dims)
    heights = [h for h, _ in dims]
    slots = [p // n_groups_b * cdiv(h, rows_b) for p, h in zip(chunks_b, heights)]  # programs per group
    n_prog_b = sum(n_groups_b * s for s in slots)
    scratch_a = torch.empty((n_prog_a, (KEPT_ROWS.value + 2) * (K // 2) * geo_a.bw), dtype=torch.float32, device=dev)
    scratch_b = torch.empty((n_prog_b, (12 + 2 * (K - 1)) * geo_b.bw + 32), dtype=torch.float32, device=dev)
    sum_buf = torch.empty(2 * BC * sum(slots), dtype=torch.float32, device=dev)
    ox = gx if gx is not None else scratch_b
    oy = gy if gy is not None else scratch_b
    if first is None:
        x0, y0, ox0, oy0, n0 = x, y, ox, oy, 0  # unused (FIRST off)
    else:
        x0, y0, gx0, gy0 = first
        ox0 = gx0 if gx0 is not None else scratch_b
        oy0 = gy0 if gy0 is not None else scratch_b
        n0 = BC * dims[0][0] * dims[0][1]
    own0 = x0.dtype != x.dtype  # float16 / bfloat16 images read as they are, the coarser scales float32
    with device_guard(x):
        launch_kernel(moments_scales_kernel, (n_prog_a,),
            x, y, window, moments, scratch_a, BC, C, dims[0][0], dims[0][1], dh, rows_a, gp, x0, y0, n0, NS=len(dims),
            K=K, PAD=pad, F=geo_a.f, BW=geo_a.bw, FIRST=first is not None, OWN0=own0,
            **launch_options(geo_a.warps, maxnreg=reg_a),
        )  # fmt: skip
        launch_kernel(adjoint_scales_kernel, (n_prog_b,),
            x, y, window, moments, u, ox, oy, scratch_b, sum_buf, BC, C, dims[0][0], dims[0][1], dh, rows_b, gp,
            float(c1), float(c2), x0, y0, ox0, oy0, n0, NS=len(dims), K=K, PAD=pad, F=geo_b.f, BW=geo_b.bw,
            FA=geo_a.f, NEED1=ox is not scratch_b, NEED2=oy is not scratch_b, FIRST=first is not None, OWN0=own0,
            **launch_options(geo_b.warps, maxnreg=reg_b),
        )  # fmt: skip
    return slots, sum_buf
