"""The masked SSIM backward in two lean launches: the masked moments, then their adjoint.

The one-launch masked backward (:func:`.masked_kernels.masked_bwd_kernel`) carries, per lane, the
masked moments' vertical state (five sums) and the adjoint's pending sums at once: 128 to 168
registers. As the unmasked backward does (:mod:`.split`), the work is cut where the two meet:

- ``masked_moments_kernel`` walks the rows as :func:`.masked_kernels.masked_fwd_kernel` does
  (the last rows' five sums and shifts in the program's scratch) and stores, per map pixel, the
  four mask-weighted moment sums ``F(M x')``, ``F(M y')``, ``F(M (x'^2 + y'^2))``, ``F(M x'y')``
  around the centre row's shift, and ``1 / F(M)`` (1 where ``F(M)`` is 0), each map row's four
  moments per column then its inverses: 20 B per map pixel-channel;
- ``masked_adjoint_kernel`` is :func:`.split.ssim_adjoint_kernel`'s walk (the same device
  function, :func:`.split._adjoint_columns`, with ``MASKED``) with the masked partials:
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

from .bodies import interior, lanes
from .columns import (
    hmoments_masked,
    load_kept,
    load_taps,
    pack,
    store_kept,
    vmoments_masked,
)
from .launch import (
    COLUMN_MAXNREG,
    SIZES,
    cdiv,
    device_guard,
    geometry,
    launch_kernel,
    launch_options,
    problem,
    rows_over_groups,
    shared_column_stride,
)
from .split import _adjoint_columns, _mask_and_planes, split_eligible, split_group

__all__ = [
    "masked_moments_kernel",
    "masked_adjoint_kernel",
    "launch_masked_bwd_split",
    "masked_split_eligible",
    "masked_split_geometry",
]

#: Register ceilings of the two launches where a program holds one channel (several: 128, as
#: :func:`.split.lean_geometry`): the unmasked pair's 64, eight 4-warp programs (32 warps) per SM on
#: sm_90, against the one-launch masked kernel's 16 or 12 (tools/check_kernels.py: no spill on sm_80
#: or sm_90). The moments fit with four of their five pending sums in the scratch
#: (:data:`PENDING_KEPT`; all five in registers spilled 104 B at 64 and 72 B at 72), the adjoint with
#: its x'y' partials' pending sums there (``split._adjoint_row`` under ``MASKED``; in registers it
#: spilled 32 B at 64: the centre mask and the inverse beside the partials).
MOMENTS_MAXNREG = 64
ADJOINT_MAXNREG = 64

#: Scratch rows per kept input row of the moments kernel: the five sums, then the shifts twice.
KEPT_SUMS = tl.constexpr(5)
#: Pending sums kept in the scratch, not registers (the first of: the filtered mask, the weighted
#: x', y', x'^2 + y'^2 and x'y' sums), one row per pending window each, after the shifts.
PENDING_KEPT = tl.constexpr(4)
#: Scratch rows per kept input row of the moments kernel in all.
SCRATCH_ROWS = tl.constexpr(KEPT_SUMS.value + 2 + PENDING_KEPT.value)


@triton.jit
def _vmoments_masked_shifts_kept(
    state, h0, h1, h2, h11, h12, s, wt, i, lane, K: tl.constexpr, BW: tl.constexpr, KEPT_P: tl.constexpr
):
    """:func:`.columns.vmoments_masked` with the last ``K // 2`` rows' five sums and shifts kept in
    the program's scratch (the sums as :func:`.columns.load_kept` keeps them; the shifts past them,
    twice over, so that they are consecutive from slot ``i % (K // 2)``), and the first ``KEPT_P``
    of the pending windows' five sums (the filtered mask, the weighted x', y', x'^2 + y'^2, x'y')
    there too, after the shifts: ``state`` is the other ``5 - KEPT_P`` alone. The same sums bit for
    bit (the vertical pass reads no older shift)."""
    HALF: tl.constexpr = K // 2
    base = lane + (KEPT_SUMS * HALF + i % HALF) * BW
    last = ()
    for k in tl.static_range(HALF):  # slot base + k: row i - HALF + k
        last = last + (tl.load(base + k * BW),)
    hist = (tl.zeros_like(h1),) * (K - 1 - HALF) + last
    pend = lane + (KEPT_SUMS + 2) * HALF * BW
    kept = ()
    for q in tl.static_range(KEPT_P):
        p = ()
        for k in tl.static_range(HALF):
            p = p + (tl.load(pend + (q * HALF + k) * BW),)
        kept = kept + (p,)
    ring = load_kept(lane, i, 0, KEPT_SUMS, K, BW)
    done, full = vmoments_masked(ring + (hist,) + kept + state, h0, h1, h2, h11, h12, s, wt, K)
    store_kept(lane, i, (h0, h1, h2, h11, h12), 0, KEPT_SUMS, K, BW)
    tl.store(base, s)  # row i replaces row i - HALF
    tl.store(base + HALF * BW, s)
    for q in tl.static_range(KEPT_P):
        for k in tl.static_range(HALF):
            tl.store(pend + (q * HALF + k) * BW, full[6 + q][k])
    out = ()
    for q in tl.static_range(KEPT_P, 5):
        out = out + (full[6 + q],)
    return done, out


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
    state = (ring,) * (5 - PENDING_KEPT)
    lane = scr_ptr + pid.to(tl.int64) * (SCRATCH_ROWS * (K // 2) * BW) + tl.arange(0, BW)
    for j in tl.static_range(SCRATCH_ROWS * (K // 2)):
        tl.store(lane + j * BW, zero)
    # one loop from the window's first row, the stores from its K-th (as .split's moments kernel)
    at = mo_base + p_r0.to(tl.int64) * (5 * WP) + 4 * p_c  # map row p's moments; its inverses 4 WP on
    for i in tl.range(0, n_rows + K - 1, num_stages=1):
        h0, h1, h2, h11, h12, s, _ = hmoments_masked(
            x_ptr, y_ptr, m_base, x_lane, y_lane, m_col, p_r0 - PAD + i, p_c - PAD, H, W, sx_h, sx_w, sy_h, sy_w,
            sm_h, sm_w, lane_ok, wt, K, False, EDGE,
        )  # fmt: skip
        done, state = _vmoments_masked_shifts_kept(state, h0, h1, h2, h11, h12, s, wt, i, lane, K, BW, PENDING_KEPT)
        if i >= K - 1:
            fm, f1, f2, f11, f12, _ = done  # around the centre row's shift, which the adjoint forms again
            # no mask: the planes' rows and channels are padded to whole strips and lane groups
            wo = at.to(tl.pointer_type(tl.int64))  # the four in two 64-bit words (16-byte aligned)
            tl.store(wo, pack(f1, f2))
            tl.store(wo + 1, pack(f11, f12))
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
    # .split's adjoint with MASKED (no upstream map: its strides unused)
    if interior(strip * (F - (K - 1)) - (K - 1), W, K, F, BW):
        _adjoint_columns(
            tl.program_id(0), x_ptr, y_ptr, w_ptr, mo_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr,
            BC, C, H, W, Ho, Wo, WP, n_chunks, n_strips, ROWS, sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w,
            0, 0, 0, 0, so_b, so_c, so_h, so_w, c1, c2, m_ptr, sm_b, sm_c, sm_h, sm_w, K, PAD, F, BW, False,
            HAS_CS, HAS_L1, NEED1, NEED2, WRITE_SUMS, SAME, False, True,
        )  # fmt: skip
    else:
        _adjoint_columns(
            tl.program_id(0), x_ptr, y_ptr, w_ptr, mo_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr, scr_ptr, sum_ptr,
            BC, C, H, W, Ho, Wo, WP, n_chunks, n_strips, ROWS, sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w,
            0, 0, 0, 0, so_b, so_c, so_h, so_w, c1, c2, m_ptr, sm_b, sm_c, sm_h, sm_w, K, PAD, F, BW, False,
            HAS_CS, HAS_L1, NEED1, NEED2, WRITE_SUMS, SAME, True, True,
        )  # fmt: skip


def masked_split_eligible(img1, img2, K: int, reflect: bool, need1: bool, need2: bool) -> bool:
    """Whether :func:`.masked_kernels.launch_masked_bwd` runs the two lean launches: where the
    unmasked backward does (:func:`.split.split_eligible`, with its switch)."""
    return split_eligible(img1, img2, K, reflect, need1, need2)


def masked_split_geometry(img1, window, padding: str):
    """The two launches' geometry and register ceilings: ``(geo_a, geo_b, reg_a, reg_b)``
    (:data:`MOMENTS_MAXNREG`, :data:`ADJOINT_MAXNREG`)."""
    B, C, H, W, K, pad, reflect, Ho, Wo = problem(img1, window, padding)
    group = split_group(img1, window, padding)
    dev = img1.device
    geo_a, reg_a = _geometry(Wo, Ho, K, group * C, dev, False, MOMENTS_MAXNREG)  # rows for a group of images
    # the adjoint in 4-warp programs: seven per SM at 72 registers (28 warps), 8-warp ones three (24)
    geo_b, reg_b = _geometry(W + K - 1, H, K, group * C, dev, True, ADJOINT_MAXNREG, wide_halo=False)
    # uneven groups (five images: three and two): rows planned over every group's launch, so that
    # the smaller last group does not run the first group's rows on a fraction of a wave
    geo_a = rows_over_groups(geo_a, reg_a, Wo, Ho, K, B, group, C, dev, halo=False)
    geo_b = rows_over_groups(geo_b, reg_b, W + K - 1, H, K, B, group, C, dev, halo=True)
    return geo_a, geo_b, reg_a, reg_b


def _geometry(frame: int, rows: int, K: int, bc: int, device, halo: bool, maxnreg: int, wide_halo: bool = True):
    """:func:`.split.lean_geometry` at the ceiling ``maxnreg``."""
    geo = geometry(frame, rows, K, bc, device, halo=halo, maxnreg=maxnreg, wide_halo=wide_halo)
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
    of as many map pixels as :data:`.split.MAX_MOMENTS_BYTES` holds of the unmasked moments
    (:func:`.split.split_group`). Returns the one-launch kernel's
    ``[B*C, P, 2]`` partial sums when ``sums``, else a placeholder."""
    B, C, H, W, K, pad, reflect, Ho, Wo = problem(img1, window, padding)
    dev = img1.device
    geo_a, geo_b, reg_a, reg_b = masked_split_geometry(img1, window, padding)
    G = geo_a.bw // geo_a.f  # channels per program of the moments' launch
    n_strips_a = cdiv(Wo, geo_a.f)
    wp = n_strips_a * geo_a.f  # map rows padded to whole strips: the moments' launch stores without masks
    group = split_group(img1, window, padding)
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
                (n_prog_a, SCRATCH_ROWS.value * (K // 2) * geo_a.bw), dtype=torch.float32, device=dev
            )
            scratch_b = torch.empty((n_prog_b, (12 + 3 * (K - 1)) * geo_b.bw + 32), dtype=torch.float32, device=dev)
        ox = gx[b0:b1] if gx is not None else scratch_b
        oy = gy[b0:b1] if gy is not None else scratch_b
        with device_guard(img1):
            launch_kernel(masked_moments_kernel, (n_prog_a,),
                x, y, m, window, moments, scratch_a, BC, C, H, W, Ho, Wo, wp, n_chunks_a, n_strips_a, rows_a,
                *x.stride(), *y.stride(), *m.stride(), K=K, PAD=pad, F=geo_a.f, BW=geo_a.bw, SW=sw, SAME=same_xy,
                **launch_options(geo_a.warps, maxnreg=reg_a),
            )  # fmt: skip
            launch_kernel(masked_adjoint_kernel, (n_prog_b,),
                x, y, m, window, moments, gs, gc, w1, ox, oy, scratch_b, sb,
                BC, C, H, W, Ho, Wo, wp, n_chunks_b, n_strips_b, rows_b,
                *x.stride(), *y.stride(), *m.stride(), *out.stride(), float(c1), float(c2),
                K=K, PAD=pad, F=geo_b.f, BW=geo_b.bw, HAS_CS=g_cs is not None, HAS_L1=l1 is not None,
                NEED1=gx is not None, NEED2=gy is not None, WRITE_SUMS=sums, SW=sw, SAME=same,
                **launch_options(geo_b.warps, maxnreg=reg_b),
            )  # fmt: skip
    return sum_buf
