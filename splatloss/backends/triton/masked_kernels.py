"""The masked SSIM kernels and their launchers (the ops are :mod:`.masked_ssim`'s).

Kernels (column bodies, windows up to ``COLUMN_TAPS``; wider windows take the shared fallback):

* ``masked_fwd_kernel``: the forward kernel's stream (:mod:`.forward`) with a fifth horizontal and
  vertical sum, ``F(M)``, the four moment sums weighted by the mask per tap
  (:func:`.columns.hmoments_masked`), around each input row's own shift per lane and moved to
  each window's centre-row shift with the row's filtered mask (:func:`.columns.vmoments_masked`:
  exact zeros in flat windows, as unmasked), the moments divided by ``F(M)``, and the SSIM / cs
  deficits ``1 - value`` summed with the centre mask as weight.
* ``masked_bwd_kernel``: the backward kernel's stream (:mod:`.backward`). With ``N_P = F(M P)``
  and ``mu_P = N_P / F(M)``, the partial derivative of the value with respect to ``N_P`` is the
  unmasked one with respect to ``mu_P`` divided by ``F(M)`` (the mask gets no gradient, so
  ``F(M)``'s own derivative is not needed), and ``N_P``'s derivative with respect to the pixel
  ``q`` carries the factor ``M(q)``: the gradient is the unmasked adjoint of the partials over
  ``F(M)``, times ``M(q)``: the unmasked kernel's vertical adjoint with the means' partials moved
  to each gradient row's shift, then its horizontal adjoint against each map column's shift
  (:func:`.columns.push_moved`, :func:`.columns.hadjoint_moved`). The upstream at map position
  ``p`` is the channel's scalar times the centre mask at ``p`` (already divided by the channel's
  weight sum on the host). With one gradient under zero padding the backward can run as two lean
  launches instead (:data:`.split.ENABLED`, off by default), the masked moments and their adjoint
  (:mod:`.masked_split`, the same gradients; this kernel runs by default and where they do not apply).

Costs per pixel-channel beyond the unmasked kernels: one more read (the mask, 4 B, or none where
it broadcasts over channels and stays in cache), a fifth filtered sum and a multiply per tap.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import launch
from .bodies import interior, l1_sign_term, lanes, store_grad, store_sums
from .columns import (
    hadjoint_moved,
    hmoments_masked,
    load_taps,
    push,
    push_moved,
    stage_row,
    vadjoint_taps,
    vmoments_masked,
    vmoments_masked_kept,
)
from .launch import (
    MAXNREG,
    SIZES,
    device_guard,
    fwd_maxnreg,
    geometry,
    launch_kernel,
    launch_options,
    problem,
    shared_column_stride,
)
from .masked_split import (
    KEPT_SUMS,
    _vmoments_masked_shifts_kept,
    launch_masked_bwd_split,
    masked_split_eligible,
    masked_split_geometry,
)
from .moments import partials, ssim_cs
from .split import lean_geometry

__all__ = ["launch_masked_bwd", "launch_masked_fwd", "masked_bwd_kernel", "masked_fwd_kernel"]

Tensor = torch.Tensor

#: Scratch rows per kept input row of the masked forward's 64-register launches: the five sums, the
#: shifts twice, the five pending sums (:func:`.masked_split._vmoments_masked_shifts_kept`).
FWD_SCRATCH_ROWS = tl.constexpr(KEPT_SUMS.value + 2 + 5)


@triton.jit
def _masked_fwd_columns(
    x_ptr, y_ptr, m_ptr, w_ptr, s_ptr, cs_ptr, l1_ptr, scr_ptr, BC, C, H, W, Ho, Wo, n_chunks, n_strips, ROWS,
    sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sm_b, sm_c, sm_h, sm_w, c1, c2,
    K: tl.constexpr, PAD: tl.constexpr, REFLECT: tl.constexpr, F: tl.constexpr, BW: tl.constexpr,
    HAS_L1: tl.constexpr, KEEP: tl.constexpr,
    EDGE: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    group, chunk, strip, f, bc, lane_ok, b, ch = lanes(pid, BC, C, n_chunks, n_strips, F, BW)
    x_base = b * sx_b + ch * sx_c
    y_base = b * sy_b + ch * sy_c
    m_base = b * sm_b + ch * sm_c
    p_c = strip * F + f  # map column of each lane
    x_lane = x_base + (p_c - PAD).to(tl.int64) * sx_w  # first tap of each lane's window, row 0
    y_lane = y_base + (p_c - PAD).to(tl.int64) * sy_w
    m_lane = m_base + (p_c - PAD).to(tl.int64) * sm_w
    CEN: tl.constexpr = K // 2 - PAD  # a map position's centre pixel, in image coordinates: p + CEN
    mc_lane = m_base + (p_c + CEN).to(tl.int64) * sm_w
    col_ok = lane_ok & (p_c < Wo)
    p_r0 = chunk * ROWS  # first map row of this chunk
    n_rows = tl.minimum(ROWS, Ho - p_r0)
    wt = load_taps(w_ptr, K)
    zero = tl.zeros([BW], dtype=tl.float32)
    # the vertical pass's state (:func:`.columns.vmoments_masked`): the last rows' shifts and sums,
    # the windows whose centre row has arrived; with KEEP (the 64-register launches) the last rows'
    # sums and shifts and all five pending sums in the program's scratch instead
    # (:func:`.masked_split._vmoments_masked_shifts_kept`, as the masked moments kernel keeps them)
    ring = (zero,) * (K // 2)
    if KEEP:
        state = ()
        lane = scr_ptr + pid.to(tl.int64) * (FWD_SCRATCH_ROWS * (K // 2) * BW) + tl.arange(0, BW)
        for j in tl.static_range(FWD_SCRATCH_ROWS * (K // 2)):
            tl.store(lane + j * BW, zero)
    else:
        state = (ring, ring, ring, ring, ring, (zero,) * (K - 1), ring, ring, ring, ring, ring)
    acc_s = zero
    acc_c = zero
    acc_l = zero  # HAS_L1 ("same" padding, CEN = 0): every pixel is one map position's centre
    for i in tl.range(0, n_rows + K - 1, num_stages=1):
        r_in = p_r0 - PAD + i
        h0, h1, h2, h11, h12, s, mcen = hmoments_masked(
            x_ptr, y_ptr, m_ptr, x_lane, y_lane, m_lane, r_in, p_c - PAD, H, W, sx_h, sx_w, sy_h, sy_w, sm_h, sm_w,
            lane_ok, wt, K, REFLECT, EDGE,
        )  # fmt: skip
        if KEEP:
            done, state = _vmoments_masked_shifts_kept(state, h0, h1, h2, h11, h12, s, wt, i, lane, K, BW, 5)
        else:
            done, state = vmoments_masked(state, h0, h1, h2, h11, h12, s, wt, K)
        fm, f1, f2, f11, f12, shift = done  # F(M) and the weighted sums around the window's shift
        inv = 1.0 / tl.where(fm > 0, fm, 1.0)
        # the differences from the sums: exactly 0 where both images agree (see moments.ratios)
        dmu = (f1 - f2) * inv
        dvar = (f11 - 2.0 * f12) * inv
        ssim, cs = ssim_cs(f1 * inv, f2 * inv, f11 * inv, None, f12 * inv, c1, c2, shift, dmu, dvar)
        p = p_r0 + i - (K - 1)
        ok = col_ok & (i >= K - 1)
        mc = tl.load(m_ptr + mc_lane + (p + CEN).to(tl.int64) * sm_h, mask=ok, other=0.0)
        acc_s += tl.where(ok, mc * (1.0 - ssim), 0.0)  # deficits: exactly 0 where SSIM is exactly 1
        acc_c += tl.where(ok, mc * (1.0 - cs), 0.0)
        if HAS_L1:  # the masked |x - y| at the centre pixel (column p_c: tap PAD of the lane's window)
            p64 = p.to(tl.int64)
            xc = tl.load(x_ptr + x_lane + PAD * sx_w + p64 * sx_h, mask=ok, other=0.0).to(tl.float32)
            yc = tl.load(y_ptr + y_lane + PAD * sy_w + p64 * sy_h, mask=ok, other=0.0).to(tl.float32)
            acc_l += tl.where(ok, mc * tl.abs(xc - yc), 0.0)
    store_sums(s_ptr, acc_s, BC, n_chunks * n_strips, 1, F, BW)
    store_sums(cs_ptr, acc_c, BC, n_chunks * n_strips, 1, F, BW)
    if HAS_L1:
        store_sums(l1_ptr, acc_l, BC, n_chunks * n_strips, 1, F, BW)


@triton.jit(do_not_specialize=SIZES)
def masked_fwd_kernel(
    x_ptr, y_ptr, m_ptr, w_ptr, s_ptr, cs_ptr, l1_ptr, scr_ptr, BC, C, H, W, Ho, Wo, n_chunks, n_strips, ROWS,
    sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sm_b, sm_c, sm_h, sm_w, c1, c2,
    K: tl.constexpr, PAD: tl.constexpr, REFLECT: tl.constexpr, F: tl.constexpr, BW: tl.constexpr,
    HAS_L1: tl.constexpr, KEEP: tl.constexpr,
):  # fmt: skip
    strip = tl.program_id(0) % n_strips
    if interior(strip * F - PAD, W, K, F, BW):
        _masked_fwd_columns(
            x_ptr, y_ptr, m_ptr, w_ptr, s_ptr, cs_ptr, l1_ptr, scr_ptr, BC, C, H, W, Ho, Wo, n_chunks, n_strips,
            ROWS, sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sm_b, sm_c, sm_h, sm_w, c1, c2, K, PAD, REFLECT, F,
            BW, HAS_L1, KEEP, False,
        )  # fmt: skip
    else:
        _masked_fwd_columns(
            x_ptr, y_ptr, m_ptr, w_ptr, s_ptr, cs_ptr, l1_ptr, scr_ptr, BC, C, H, W, Ho, Wo, n_chunks, n_strips,
            ROWS, sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sm_b, sm_c, sm_h, sm_w, c1, c2, K, PAD, REFLECT, F,
            BW, HAS_L1, KEEP, True,
        )  # fmt: skip


@triton.jit
def _masked_bwd_columns(
    x_ptr, y_ptr, m_ptr, w_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr,
    BC, C, H, W, Ho, Wo, n_chunks, n_strips, ROWS,
    sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sm_b, sm_c, sm_h, sm_w, so_b, so_c, so_h, so_w, c1, c2,
    K: tl.constexpr, PAD: tl.constexpr, REFLECT: tl.constexpr, F: tl.constexpr, BW: tl.constexpr,
    HAS_CS: tl.constexpr, HAS_L1: tl.constexpr, NEED1: tl.constexpr, NEED2: tl.constexpr,
    WRITE_SUMS: tl.constexpr, SAME_XY: tl.constexpr, EDGE: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    group, chunk, strip, f, bc, lane_ok, b, ch = lanes(pid, BC, C, n_chunks, n_strips, F, BW)
    if SAME_XY:  # the images share their strides: one offset per lane and row for both
        sy_b = sx_b
        sy_c = sx_c
        sy_h = sx_h
        sy_w = sx_w
    x_base = b * sx_b + ch * sx_c
    y_base = b * sy_b + ch * sy_c
    m_base = b * sm_b + ch * sm_c
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
    m_lane = m_base + (p_c - PAD).to(tl.int64) * sm_w
    q_r0 = chunk * ROWS
    n_rows = tl.minimum(ROWS, H - q_r0)
    wt = load_taps(w_ptr, K)
    zero = tl.zeros([BW], dtype=tl.float32)
    # scratch (stays in L1/L2): two rows of 5 values per lane, as in the backward kernel, then the
    # last K // 2 input rows' five sums and centre masks (:func:`.columns.vmoments_masked_kept`)
    scr = scr_ptr + pid.to(tl.int64) * ((10 + 6 * (K // 2)) * BW + 32)
    lane = scr + ar  # the lane's own floats: one pointer for the kept rows
    KEPT: tl.constexpr = 10 * BW + 32
    for j in tl.static_range(6 * (K // 2)):
        tl.store(lane + KEPT + j * BW, zero)

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
    acc_s = zero
    acc_l = zero
    # the moments' vertical state (:func:`.columns.vmoments_masked`), and the pending vertical
    # adjoint sums of the partials (slot j: gradient row j + 1 steps ahead), per map column
    ring = (zero,) * (K // 2)
    state = ((zero,) * (K - 1), ring, ring, ring, ring, ring)
    a_sq = (zero,) * (K - 1)
    a_xy = (zero,) * (K - 1)
    a_1 = (zero,) * (K - 1)
    a_2 = (zero,) * (K - 1)
    for i in tl.range(0, n_rows + 2 * (K - 1), num_stages=1):
        # 1. padded input row r enters; the masked moments of map row p = r - (K - 1) + PAD
        #    complete, around the shift of their centre row
        r = q_r0 - (K - 1) + i
        h0, h1, h2, h11, h12, s, mcen = hmoments_masked(
            x_ptr, y_ptr, m_ptr, x_lane, y_lane, m_lane, r, p_c - PAD, H, W, sx_h, sx_w, sy_h, sy_w, sm_h, sm_w,
            lane_ok, wt, K, REFLECT, EDGE,
        )  # fmt: skip
        hist = state[0]  # shifts of rows r - (K - 1) .. r - 1
        done, state, mcen = vmoments_masked_kept(state, h0, h1, h2, h11, h12, s, mcen, wt, i, lane, KEPT, K, BW)
        fm, f1, f2, f11, f12, shift = done
        inv = 1.0 / tl.where(fm > 0, fm, 1.0)

        # 2. partial derivatives on map row p (upstream: the channel's scalar times the centre
        #    mask) with respect to the sums N_P = F(M P): those w.r.t. mu_P over F(M); zero off the map
        p = r - (K - 1) + PAD
        valid = pcol_ok & (i >= K - 1) & (p >= 0) & (p < Ho)
        mc = tl.where(valid, mcen, 0.0)  # the centre mask, read with the centre row's taps
        dmu = (f1 - f2) * inv  # the differences from the sums, as in the forward kernel
        dvar = (f11 - 2.0 * f12) * inv
        d1, d2, dsq, dxy, ssim, cs = partials(
            f1 * inv, f2 * inv, f11 * inv, None, f12 * inv, gs * mc, gc * mc, c1, c2, shift, dmu, dvar, HAS_CS
        )
        if WRITE_SUMS:
            own = valid & own_c & (p >= q_r0) & (p < q_r0 + n_rows)
            acc_s += tl.where(own, mc * (1.0 - ssim), 0.0)
        dsq = tl.where(valid, dsq * inv, 0.0)
        dxy = tl.where(valid, dxy * inv, 0.0)
        e = 2.0 * dsq + dxy

        # 3. vertical adjoint (as the backward kernel's): map row p enters gradient rows
        #    q = p - PAD + j with tap j, the means' partials moved to each row's shift
        wa = vadjoint_taps(w_ptr, wt, p, H, K, PAD, REFLECT)
        g_sq, a_sq = push(a_sq, dsq, wa, K, False)
        g_xy, a_xy = push(a_xy, dxy, wa, K, False)
        buf = scr + (i % 2) * (5 * BW)
        g1 = 0.0
        g2 = 0.0
        if NEED1:
            g1, a_1 = push_moved(a_1, tl.where(valid, d1 * inv, 0.0), e, hist, s, shift, wa, K)
        if NEED2:
            g2, a_2 = push_moved(a_2, tl.where(valid, d2 * inv, 0.0), e, hist, s, shift, wa, K)
        stage_row(buf, 2.0 * g_sq, g_xy, g1, g2, tl.where(pcol_ok, hist[0], 0.0), NEED1, NEED2, BW, False)
        tl.debug_barrier()

        # 4. horizontal adjoint of gradient row q = p - PAD through the scratch row, times the
        #    mask at q
        q = p - PAD
        out = qcol_ok & (i >= 2 * (K - 1)) & (q < q_r0 + n_rows)
        q64 = q.to(tl.int64)
        ql = tl.minimum(tl.maximum(q, 0), H - 1).to(tl.int64)  # clamped (masked anyway): no induction pointers
        # gradient column q_c is the last tap of the lane's window: K - 1 columns past its start
        xq = tl.load(x_ptr + x_lane + ql * sx_h + (K - 1) * sx_w, mask=out, other=0.0).to(tl.float32)
        yq = tl.load(y_ptr + y_lane + ql * sy_h + (K - 1) * sy_w, mask=out, other=0.0).to(tl.float32)
        mq = tl.load(m_ptr + m_lane + ql * sm_h + (K - 1) * sm_w, mask=out, other=0.0)
        gx, gy = hadjoint_moved(buf, wt, q_c0, W, f, xq, yq, NEED1, NEED2, F, BW, K, PAD, REFLECT, EDGE, False)
        # the L1 term (sign and |x - y| of the pixels), weighted by the mask
        l1_term, acc_l = l1_sign_term(xq, yq, l1, out, acc_l, mq, HAS_L1, WRITE_SUMS)
        o_offs = o_base + q64 * so_h + q_c.to(tl.int64) * so_w
        if NEED1:
            store_grad(gx_ptr, o_offs, out, mq * gx, xq, yq, None, None, mq * l1_term, 1, HAS_L1)
        if NEED2:
            store_grad(gy_ptr, o_offs, out, mq * gy, yq, xq, None, None, mq * l1_term, -1, HAS_L1)
    if WRITE_SUMS:
        # per program and channel: the centre-weighted SSIM deficit and, with HAS_L1, the masked |x - y|
        store_sums(sum_ptr, acc_s, BC, n_chunks * n_strips, 2, F, BW)
        if HAS_L1:
            store_sums(sum_ptr + 1, acc_l, BC, n_chunks * n_strips, 2, F, BW)


@triton.jit(do_not_specialize=SIZES)
def masked_bwd_kernel(
    x_ptr, y_ptr, m_ptr, w_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr,
    BC, C, H, W, Ho, Wo, n_chunks, n_strips, ROWS,
    sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sm_b, sm_c, sm_h, sm_w, so_b, so_c, so_h, so_w, c1, c2,
    K: tl.constexpr, PAD: tl.constexpr, REFLECT: tl.constexpr, F: tl.constexpr, BW: tl.constexpr,
    HAS_CS: tl.constexpr, HAS_L1: tl.constexpr, NEED1: tl.constexpr, NEED2: tl.constexpr,
    WRITE_SUMS: tl.constexpr, SAME_XY: tl.constexpr, SW: tl.constexpr,
):  # fmt: skip
    if SW > 0:  # both images' columns SW apart: immediate tap offsets (launch.COLUMN_STRIDES)
        sx_w = SW
        sy_w = SW
    strip = tl.program_id(0) % n_strips
    if interior(strip * (F - (K - 1)) - (K - 1), W, K, F, BW):
        _masked_bwd_columns(
            x_ptr, y_ptr, m_ptr, w_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr, BC, C, H, W, Ho, Wo,
            n_chunks, n_strips, ROWS, sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sm_b, sm_c, sm_h, sm_w,
            so_b, so_c, so_h, so_w, c1, c2, K, PAD, REFLECT, F, BW, HAS_CS, HAS_L1, NEED1, NEED2, WRITE_SUMS,
            SAME_XY, False,
        )  # fmt: skip
    else:
        _masked_bwd_columns(
            x_ptr, y_ptr, m_ptr, w_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr, BC, C, H, W, Ho, Wo,
            n_chunks, n_strips, ROWS, sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, sm_b, sm_c, sm_h, sm_w,
            so_b, so_c, so_h, so_w, c1, c2, K, PAD, REFLECT, F, BW, HAS_CS, HAS_L1, NEED1, NEED2, WRITE_SUMS,
            SAME_XY, True,
        )  # fmt: skip


#: The masked backward's launch: (256 lanes and 8 warps per program, else 128 and 4; the register
#: ceiling), for the light variants (one gradient, "same" / "valid") of float32 images that share
#: their strides (columns contiguous or a few elements apart, :data:`.launch.COLUMN_STRIDES`; the
#: mask's contiguous), the other light ones ("light_other": images with strides apart, a y offset
#: per lane beside x's, in half precision, or other column strides), and the heavy ones (both
#: gradients, or "reflect" with its mirrored taps). The light kernel keeps its last ``K // 2``
#: rows' sums and centre masks in scratch (:func:`.columns.vmoments_masked_kept`) and, with shared
#: strides, one offset per lane for both images. At 128 registers the light kernels spill 8 B
#: (sm_90, the 1080p loss), so both take 168: three 4-warp programs (12 warps) per SM. The heavy
#: variants spill 88 to 160 B at 168 and take 255: one 8-warp program. tools/check_kernels.py
#: checks each.
BWD_LAUNCH = {"light": (False, 168), "light_other": (False, 168), "heavy": (True, MAXNREG)}


def launch_masked_fwd(img1, img2, mask, window, padding: str, c1: float, c2: float, l1: bool = False):
    """``(ssim_deficit, cs_deficit)``: ``1 - map`` summed with the centre mask as weight, as the
    programs' partial sums, ``[B * C, P]`` each (:mod:`.partials` reduces them: the mean is ``1 -
    deficit / sum of the weights``, exactly 1 where every value is, however the sums round). ``l1``
    ("same" padding, where every pixel is one map position's centre): also the partial sums of
    ``mask * |x - y|``, last (the fused loss without a gradient)."""
    if l1 and padding != "same":
        raise ValueError(f'launch_masked_fwd sums the masked |x - y| under "same" padding only, got {padding!r}')
    B, C, H, W, K, pad, reflect, Ho, Wo = problem(img1, window, padding)
    BC = B * C
    # without "reflect" it keeps its last rows and its pending sums in scratch: the lean launches'
    # geometry and registers (64 on sm_90, 32 warps per SM; 128 for images narrower than a program);
    # under "reflect" the ceiling of a kernel summing both maps (SSIM and cs)
    keep = not reflect
    if keep:
        geo, maxnreg = lean_geometry(Wo, Ho, K, BC, img1.device, False)
    else:
        maxnreg = fwd_maxnreg(K, reflect, both_maps=True)
        geo = geometry(Wo, Ho, K, BC, img1.device, maxnreg=maxnreg)
    n_strips = launch.cdiv(Wo, geo.f)

    def run(rows: int):
        n_chunks = launch.cdiv(Ho, rows)
        n_prog = launch.cdiv(BC, geo.bw // geo.f) * n_chunks * n_strips
        s = torch.empty((BC, n_chunks * n_strips), dtype=torch.float32, device=img1.device)
        cs = torch.empty_like(s)
        l1_sums = torch.empty_like(s) if l1 else s
        per_prog = FWD_SCRATCH_ROWS.value * (K // 2) * geo.bw if keep else 1
        scratch = torch.empty((n_prog, per_prog), dtype=torch.float32, device=img1.device)
        with device_guard(img1):
            launch_kernel(masked_fwd_kernel, (n_prog,),
                img1, img2, mask, window, s, cs, l1_sums, scratch, BC, C, H, W, Ho, Wo, n_chunks, n_strips, rows,
                *img1.stride(), *img2.stride(), *mask.stride(), float(c1), float(c2),
                K=K, PAD=pad, REFLECT=reflect, F=geo.f, BW=geo.bw, HAS_L1=l1, KEEP=keep,
                **launch_options(geo.warps, maxnreg=maxnreg),
            )  # fmt: skip
        return s, cs, l1_sums

    s, cs, l1_sums = run(geo.rows)
    return (s, cs, l1_sums) if l1 else (s, cs)


def launch_masked_bwd(
    img1,
    img2,
    mask,
    window,
    padding,
    c1,
    c2,
    g_s,
    g_cs,
    need1,
    need2,
    sums=False,
    grad_dtype=None,
    l1=None,
):
    """Gradients of ``sum(g_s * ssim_sum + g_cs * cs_sum)`` (the centre-weighted sums; ``g_cs`` may
    be None), ``(grad1 or None, grad2 or None)`` in img1's layout, and with ``sums`` also the
    partial sums computed on the way, ``[B * C, P, 2]``: the centre-weighted SSIM deficit's
    (``1 - SSIM``, as :func:`launch_masked_fwd`) and, with ``l1``, the masked ``|x - y|``'s.
    ``l1``: optional ``[B, C]`` weight of ``mask * sign(x - y)`` added to the gradients (the fused
    masked loss's L1 term).

    Under "reflect" the two gradients take one launch each: with both, the kernel's mirrored taps
    and its two sets of pending adjoint sums spill registers at sm_90 even at 255 (8 to 16 B,
    tools/check_kernels.py)."""
    dev = img1.device
    g_s = g_s.to(torch.float32).contiguous()
    g_cs = g_cs.to(torch.float32).contiguous() if g_cs is not None else None
    l1 = l1.to(torch.float32).contiguous() if l1 is not None else None
    gx = torch.empty_like(img1, dtype=grad_dtype) if need1 else None
    gy = None
    if need2:
        gy = (
            torch.empty_like(img2, dtype=grad_dtype)
            if gx is None
            else torch.empty_strided(gx.shape, gx.stride(), dtype=grad_dtype or img2.dtype, device=dev)
        )
    args = (img1, img2, mask, window, padding, c1, c2, g_s, g_cs, l1)
    if need1 and need2 and padding == "reflect":
        parts = _masked_bwd(*args, gx, None, sums)
        _masked_bwd(*args, None, gy, False)
    else:
        parts = _masked_bwd(*args, gx, gy, sums)
    return (gx, gy, parts) if sums else (gx, gy)


def _masked_bwd(img1, img2, mask, window, padding, c1, c2, g_s, g_cs, l1, gx, gy, sums):
    """One launch of the masked backward kernel writing ``gx`` and / or ``gy`` (None: not computed);
    with ``sums`` the programs' ``[B * C, P, 2]`` partial SSIM and L1 sums (the second only with
    ``l1``), else None."""
    B, C, H, W, K, pad, reflect, Ho, Wo = problem(img1, window, padding)
    BC = B * C
    need1, need2 = gx is not None, gy is not None
    same_xy = img1.stride() == img2.stride()
    sw = shared_column_stride(img1, img2)
    lean = same_xy and (img1.stride(3) == 1 or sw) and mask.stride(3) == 1
    lean = lean and img1.dtype == img2.dtype == torch.float32
    kind = "heavy" if (need1 and need2) or reflect else ("light" if lean else "light_other")
    wide, maxnreg = BWD_LAUNCH[kind]
    geo = geometry(W + K - 1, H, K, BC, img1.device, halo=True, maxnreg=maxnreg, wide_halo=wide)
    n_strips = launch.cdiv(W, geo.f - (K - 1))
    dev = img1.device
    out = gx if need1 else gy

    def run(rows: int):  # writes the gradients (never reads them): safe to run again
        n_chunks = launch.cdiv(H, rows)
        n_prog = launch.cdiv(BC, geo.bw // geo.f) * n_chunks * n_strips
        scratch = torch.empty((n_prog, (10 + 6 * (K // 2)) * geo.bw + 32), dtype=torch.float32, device=dev)
        # two sums per program and channel: the SSIM's and the L1's (the second written only with l1)
        sum_buf = torch.empty((BC, n_chunks * n_strips, 2) if sums else (1,), dtype=torch.float32, device=dev)
        with device_guard(img1):
            launch_kernel(masked_bwd_kernel, (n_prog,),
                img1, img2, mask, window, g_s, g_cs if g_cs is not None else g_s, l1 if l1 is not None else g_s,
                gx if need1 else scratch, gy if need2 else scratch, scratch, sum_buf,
                BC, C, H, W, Ho, Wo, n_chunks, n_strips, rows,
                *img1.stride(), *img2.stride(), *mask.stride(), *out.stride(), float(c1), float(c2),
                K=K, PAD=pad, REFLECT=reflect, F=geo.f, BW=geo.bw, HAS_CS=g_cs is not None, HAS_L1=l1 is not None,
                NEED1=need1, NEED2=need2, WRITE_SUMS=sums, SAME_XY=same_xy, SW=sw,
                **launch_options(geo.warps, maxnreg=maxnreg),
            )  # fmt: skip
        return sum_buf

    if masked_split_eligible(img1, img2, K, reflect, need1, need2):
        # the masked moments and their adjoint as two lean launches (:mod:`.masked_split`, 32 warps
        # per SM on sm_90; the same gradients) where :data:`.split.ENABLED` turns them on
        geo_a, geo_b, _, _ = masked_split_geometry(img1, window, padding)
        sum_buf = launch_masked_bwd_split(
            img1, img2, mask, window, padding, c1, c2, g_s, g_cs, l1, gx, gy, sums, geo_a.rows, geo_b.rows
        )
    else:
        sum_buf = run(geo.rows)
    return sum_buf if sums else None
