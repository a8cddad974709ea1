"""The SSIM forward kernel (map or per-program sums) and its launcher.

``ssim_fwd_kernel``: one program per (lane group, row chunk, column strip) (:mod:`.launch`).
Streams down the rows: horizontal K-tap pass of x', y', x'^2 (+ y'^2), x'y' per input row
(``x' = x - s``, ``s`` the row's own pixel at each lane's centre tap), vertical K-tap pass moving
each window to its centre row's shift (:func:`.columns.vmoments`, :func:`.ring.ring_vsum`), then
either writes the SSIM (and cs) map row, or accumulates per-lane sums that end as one partial sum
per (channel, program) in a ``[B*C, programs]`` buffer torch adds in a fixed order: no atomics,
bitwise reproducible. In "stats_l1" mode it also sums ``|x - y|`` over the pixels each lane owns
(the fused 3DGS loss). The body is chosen at compile time by the window size: the column body
(:mod:`.columns`) up to ``COLUMN_TAPS`` taps, in an unmasked copy for programs whose taps all lie
inside the image and a masked copy for the others; the ring body (:mod:`.ring`) above.

Bytes per pixel-channel (fp32 I/O, DRAM): reads x, y = 8 B; the stats modes write 2 floats per
program (negligible), the map modes 4 B per map (SSIM, cs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .bodies import interior, lanes, scale_of, store_sums
from .columns import hmoments, load_taps, vmoments, vmoments_kept
from .launch import (
    COLUMN_TAPS,
    SIZES,
    batched_rows,
    cdiv,
    check_scales,
    device_arch,
    device_guard,
    fwd_maxnreg,
    geometry,
    launch_kernel,
    launch_options,
    out_size,
    padding_shape,
    problem,
)
from .moments import ssim_cs
from .partials import means as partial_means
from .ring import ring_vsum, row_moments, window_taus

__all__ = ["ssim_fwd_kernel", "launch_fwd", "ssim_fwd_scales_kernel", "launch_fwd_scales"]


#: Scratch rows per kept input row of the column kernels (:func:`.columns.vmoments_kept`): its four
#: sums.
KEPT_ROWS = tl.constexpr(4)


@triton.jit
def _store_row(
    s_ptr, cs_ptr, bc, p, p_c, Ho, Wo, ok, ssim, cs, acc_s, acc_c, WRITE_MAP: tl.constexpr, WRITE_CS: tl.constexpr,
    SUM_CS: tl.constexpr,
):  # fmt: skip
    """Write map row ``p`` (maps are contiguous ``[B*C, Ho, Wo]``) or add it to the lanes' sums (cs
    only with ``SUM_CS``)."""
    if WRITE_MAP:
        offs = (bc.to(tl.int64) * Ho + p) * Wo + p_c
        tl.store(s_ptr + offs, ssim, mask=ok)
        if WRITE_CS:
            tl.store(cs_ptr + offs, cs, mask=ok)
    else:
        acc_s += tl.where(ok, ssim, 0.0)
        if SUM_CS:
            acc_c += tl.where(ok, cs, 0.0)
    return acc_s, acc_c


@triton.jit
def _fwd_columns(
    pid, x_ptr, y_ptr, w_ptr, s_ptr, cs_ptr, l1_ptr, scr_ptr, BC, C, H, W, Ho, Wo, n_chunks, n_strips, ROWS,
    sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, c1, c2,
    K: tl.constexpr, PAD: tl.constexpr, REFLECT: tl.constexpr, F: tl.constexpr, BW: tl.constexpr,
    WRITE_MAP: tl.constexpr, WRITE_CS: tl.constexpr, HAS_L1: tl.constexpr, KEEP: tl.constexpr,
    EDGE: tl.constexpr,
):  # fmt: skip
    group, chunk, strip, f, bc, lane_ok, b, ch = lanes(pid, BC, C, n_chunks, n_strips, F, BW)
    x_base = b * sx_b + ch * sx_c
    y_base = b * sy_b + ch * sy_c
    p_c = strip * F + f  # map column of each lane
    x_lane = x_base + (p_c - PAD).to(tl.int64) * sx_w  # first tap of each lane's window, row 0
    y_lane = y_base + (p_c - PAD).to(tl.int64) * sy_w
    col_ok = lane_ok & (p_c < Wo)
    p_r0 = chunk * ROWS  # first map row of this chunk
    n_rows = tl.minimum(ROWS, Ho - p_r0)
    wt = load_taps(w_ptr, K)
    zero = tl.zeros([BW], dtype=tl.float32)
    # the vertical pass's state (:func:`vmoments`): the last rows' shifts and sums, the windows
    # whose centre row has arrived; with KEEP (the 64-register launches) the last K // 2 rows' sums
    # in the program's scratch instead (:func:`vmoments_kept`: KEPT_ROWS rows of BW floats per kept
    # row, zeros before the first row; stays in L1)
    ring = (zero,) * (K // 2)
    if KEEP:
        state = ((zero,) * (K - 1), ring, ring, ring, ring)
        lane = scr_ptr + pid.to(tl.int64) * (KEPT_ROWS * (K // 2) * BW) + tl.arange(0, BW)
        for j in tl.static_range(KEPT_ROWS * (K // 2)):
            tl.store(lane + j * BW, zero)
    else:
        state = (ring, ring, ring, ring, (zero,) * (K - 1), ring, ring, ring, ring)
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
        h1, h2, h11, h12, l1_row, s = hmoments(
            x_ptr, y_ptr, x_lane, y_lane, r_in, p_c - PAD, H, W, sx_h, sx_w, sy_h, sy_w,
            lane_ok, col_ok, last_col, wt, K, PAD, REFLECT, HAS_L1, EDGE, PAD == 0,
        )  # fmt: skip
        if HAS_L1:
            row_own = ((r_in >= p_r0) & (r_in < p_r0 + n_rows)) | (last_chunk & (r_in >= Ho) & (r_in < H))
            acc_l1 += tl.where(row_own, l1_row, 0.0)
        if KEEP:
            done, state = vmoments_kept(state, h1, h2, h11, h12, s, wt, i, lane, 0, K, BW)
        else:
            done, state = vmoments(state, h1, h2, h11, h12, s, wt, K)
        mu1, mu2, e11, e12, shift = done  # e11: E[x'^2] + E[y'^2] (only their sum enters B2)
        ssim, cs = ssim_cs(mu1, mu2, e11, None, e12, c1, c2, shift, None, None)
        p = p_r0 + i - (K - 1)
        ok = col_ok & (i >= K - 1)
        acc_s, acc_c = _store_row(
            s_ptr, cs_ptr, bc, p, p_c, Ho, Wo, ok, ssim, cs, acc_s, acc_c, WRITE_MAP, WRITE_CS, not HAS_L1
        )
    if not WRITE_MAP:
        # one partial sum per (channel, chunk, strip): [BC, n_chunks * n_strips]
        store_sums(s_ptr, acc_s, BC, n_chunks * n_strips, 1, F, BW, pid)
        if not HAS_L1:  # the fused loss needs the SSIM sum alone
            store_sums(cs_ptr, acc_c, BC, n_chunks * n_strips, 1, F, BW, pid)
        if HAS_L1:
            store_sums(l1_ptr, acc_l1, BC, n_chunks * n_strips, 1, F, BW, pid)


@triton.jit
def _fwd_ring(
    x_ptr, y_ptr, w_ptr, s_ptr, cs_ptr, l1_ptr, scr_ptr, BC, C, H, W, Ho, Wo, n_chunks, n_strips, ROWS,
    sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, c1, c2,
    K: tl.constexpr, KP: tl.constexpr, REFLECT: tl.constexpr, PAD: tl.constexpr, F: tl.constexpr,
    BW: tl.constexpr, WRITE_MAP: tl.constexpr, WRITE_CS: tl.constexpr, HAS_L1: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    group, chunk, strip, f, bc, lane_ok, b, ch = lanes(pid, BC, C, n_chunks, n_strips, F, BW)
    x_base = b * sx_b + ch * sx_c
    y_base = b * sy_b + ch * sy_c
    ar = tl.arange(0, BW)
    slots = tl.arange(0, KP)
    p_c = strip * F + f  # map column of each lane
    col_ok = lane_ok & (p_c < Wo)
    p_r0 = chunk * ROWS  # first map row of this chunk
    n_rows = tl.minimum(ROWS, Ho - p_r0)

    # scratch: 5 rings of the last KP horizontal-pass rows and one of their shifts (slot i % KP),
    # zeroed so that rows not yet written (weight 0) cannot inject NaN
    ring = scr_ptr + pid.to(tl.int64) * (6 * KP * BW)
    sring = ring + 5 * KP * BW
    ring_offs = slots[:, None] * BW + ar[None, :]  # [KP, BW]
    for j in tl.static_range(6):
        tl.store(ring + j * KP * BW + ring_offs, tl.zeros([KP, BW], dtype=tl.float32))
    acc_s = tl.zeros([BW], dtype=tl.float32)
    acc_c = tl.zeros([BW], dtype=tl.float32)
    acc_l1 = tl.zeros([BW], dtype=tl.float32)
    # L1 ownership: as in the column body, by taps own_lo <= a < own_hi of each lane
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
        h1, h2, h11, h22, h12, l1_row, sh = row_moments(
            x_ptr, y_ptr, x_base, y_base, r_in, p_c - PAD, H, W, sx_h, sx_w, sy_h, sy_w, w_ptr,
            lane_ok, own_lo, own_hi, K, KP, REFLECT, HAS_L1,
        )  # fmt: skip
        if HAS_L1:
            acc_l1 += tl.where(row_own, l1_row, 0.0)
        slot = ring + (i % KP) * BW + ar
        tl.store(slot, h1)
        tl.store(slot + KP * BW, h2)
        tl.store(slot + 2 * KP * BW, h11)
        tl.store(slot + 3 * KP * BW, h22)
        tl.store(slot + 4 * KP * BW, h12)
        tl.store(slot + 5 * KP * BW, sh)
        tl.debug_barrier()
        # map row p = p_r0 + i - (K - 1) uses the K newest rows: a slot written g rows ago holds tap K-1-g
        age = (i - slots + KP) % KP
        wv = tl.load(w_ptr + (K - 1 - age), mask=age < K, other=0.0)[:, None]
        live = (age < K)[:, None]  # only the K newest rows: 0 * NaN of an older row would be NaN
        tau, shift = window_taus(sring, slots, i, live, KP, BW, K)
        mu1, mu2, e11, e22, e12 = ring_vsum(ring, ring_offs, live, wv, tau, KP, BW)
        ssim, cs = ssim_cs(mu1, mu2, e11, e22, e12, c1, c2, shift, None, None)
        p = p_r0 + i - (K - 1)
        ok = col_ok & (i >= K - 1)
        acc_s, acc_c = _store_row(
            s_ptr, cs_ptr, bc, p, p_c, Ho, Wo, ok, ssim, cs, acc_s, acc_c, WRITE_MAP, WRITE_CS, not HAS_L1
        )
    if not WRITE_MAP:
        store_sums(s_ptr, acc_s, BC, n_chunks * n_strips, 1, F, BW)
        if not HAS_L1:
            store_sums(cs_ptr, acc_c, BC, n_chunks * n_strips, 1, F, BW)
        if HAS_L1:
            store_sums(l1_ptr, acc_l1, BC, n_chunks * n_strips, 1, F, BW)


@triton.jit(do_not_specialize=SIZES)
def ssim_fwd_kernel(
    x_ptr, y_ptr, w_ptr, s_ptr, cs_ptr, l1_ptr, scr_ptr, BC, C, H, W, Ho, Wo, n_chunks, n_strips, ROWS,
    sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, c1, c2,
    K: tl.constexpr, KP: tl.constexpr, PAD: tl.constexpr, REFLECT: tl.constexpr, F: tl.constexpr, BW: tl.constexpr,
    WRITE_MAP: tl.constexpr, WRITE_CS: tl.constexpr, HAS_L1: tl.constexpr, KEEP: tl.constexpr,
):  # fmt: skip
    if K <= COLUMN_TAPS:
        # interior programs read their rows without masks (``hmoments``); one loop or the other
        strip = tl.program_id(0) % n_strips
        if interior(strip * F - PAD, W, K, F, BW):
            _fwd_columns(
                tl.program_id(0), x_ptr, y_ptr, w_ptr, s_ptr, cs_ptr, l1_ptr, scr_ptr, BC, C, H, W, Ho, Wo, n_chunks,
                n_strips, ROWS, sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, c1, c2, K, PAD, REFLECT, F, BW,
                WRITE_MAP, WRITE_CS, HAS_L1, KEEP, False
            )  # fmt: skip
        else:
            _fwd_columns(
                tl.program_id(0), x_ptr, y_ptr, w_ptr, s_ptr, cs_ptr, l1_ptr, scr_ptr, BC, C, H, W, Ho, Wo, n_chunks,
                n_strips, ROWS, sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, c1, c2, K, PAD, REFLECT, F, BW,
                WRITE_MAP, WRITE_CS, HAS_L1, KEEP, True
            )  # fmt: skip
    else:
        _fwd_ring(
            x_ptr, y_ptr, w_ptr, s_ptr, cs_ptr, l1_ptr, scr_ptr, BC, C, H, W, Ho, Wo, n_chunks, n_strips, ROWS,
            sx_b, sx_c, sx_h, sx_w, sy_b, sy_c, sy_h, sy_w, c1, c2, K, KP, REFLECT, PAD, F, BW, WRITE_MAP, WRITE_CS,
            HAS_L1,
        )  # fmt: skip


def launch_fwd(img1, img2, window, padding: str, c1: float, c2: float, mode: str, raw: bool = False):
    """Run the forward kernel. ``mode``: "stats" -> ``(ssim_sum, cs_sum)``, each ``[B, C]`` fp32
    sums over the map; "stats_l1" -> ``(ssim_sum, None, abs_diff_sum)``, the last summed over
    the image (the fused photometric loss, which needs no cs); "map" -> ``(ssim_map, empty)``;
    "map_cs" -> ``(ssim_map, cs_map)``. ``raw`` (the stats modes): each sum as the programs'
    partial sums, ``[B * C, P]`` (for :func:`.partials.means`)."""
    B, C, H, W, K, pad, reflect, Ho, Wo = problem(img1, window, padding)
    BC = B * C
    # the SSIM statistics of contiguous rows, and the fused loss's SSIM and L1 sums under "same"
    # padding: 64 registers (fwd_maxnreg; 128 under "reflect"; the fused loss under "valid", whose
    # last map column sums the L1 of K pixels, spills 40 B at 64)
    contiguous = img1.stride(3) == 1 and img2.stride(3) == 1
    lean = contiguous and (mode == "stats" or (mode == "stats_l1" and pad > 0))
    maxnreg = fwd_maxnreg(K, reflect, mode == "map_cs", lean, device_arch(img1.device))
    keep = lean and not reflect  # the last rows' sums in scratch (elsewhere it spilled 8 B at 128)
    geo = geometry(Wo, Ho, K, BC, img1.device, maxnreg=maxnreg)
    n_strips = cdiv(Wo, geo.f)
    n_groups = cdiv(BC, geo.bw // geo.f)
    dev = img1.device
    stats = mode in ("stats", "stats_l1")
    # the ring kernels (K > COLUMN_TAPS) keep 6 rings of KP rows per program; the column kernels the
    # last K // 2 rows' four sums
    ring = K > COLUMN_TAPS.value

    def run(rows: int):
        n_chunks = cdiv(Ho, rows)
        n_prog = n_groups * n_chunks * n_strips
        l1 = None
        if stats:
            s = torch.empty((BC, n_chunks * n_strips), dtype=torch.float32, device=dev)
            l1 = torch.empty_like(s) if mode == "stats_l1" else None
            cs = torch.empty_like(s) if l1 is None else None  # the fused loss sums no cs
        else:
            s = torch.empty((B, C, Ho, Wo), dtype=torch.float32, device=dev)
            cs = torch.empty((B, C, Ho, Wo) if mode == "map_cs" else (0,), dtype=torch.float32, device=dev)
        per_prog = 6 * geo.kp * geo.bw if ring else KEPT_ROWS.value * (K // 2) * geo.bw if keep else 1
        scratch = torch.empty((n_prog, per_prog), dtype=torch.float32, device=dev)
        with device_guard(img1):
            launch_kernel(ssim_fwd_kernel, (n_prog,),
                img1, img2, window, s, cs if cs is not None and mode != "map" else s, l1 if l1 is not None else s,
                scratch,
                BC, C, H, W, Ho, Wo, n_chunks, n_strips, rows, *img1.stride(), *img2.stride(), float(c1), float(c2),
                K=K, KP=geo.kp, PAD=pad, REFLECT=reflect, F=geo.f, BW=geo.bw,
                WRITE_MAP=not stats, WRITE_CS=mode == "map_cs", HAS_L1=l1 is not None, KEEP=keep,
                **launch_options(geo.warps, maxnreg=maxnreg),
            )  # fmt: skip
        return s, cs, l1

    s, cs, l1 = run(geo.rows)
    if stats and raw:
        return (s, cs, l1) if l1 is not None else (s, cs)
    if stats:
        # fixed-order reduction of the per-program partial sums: deterministic, no atomics
        if l1 is not None:
            return s.sum(dim=1).view(B, C), None, l1.sum(dim=1).view(B, C)
        return s.sum(dim=1).view(B, C), cs.sum(dim=1).view(B, C)
    return s, cs


# ------------------------------------------------------------------------------------------------
# MS-SSIM's coarser scales in one launch, without a gradient: as .backward's ssim_bwd_scales_kernel
# (the scales' pairs one after the other in one flat buffer, each program finding its scale), the
# forward's stats pass at every scale (its SSIM and cs sums; the caller keeps cs at every scale but
# the last, SSIM there).
# ------------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=("BC", "C", "H1", "W1", "DH", "ROWS"))
def ssim_fwd_scales_kernel(
    x_ptr, y_ptr, w_ptr, s_ptr, cs_ptr, scr_ptr, BC, C, H1, W1, DH, ROWS, c1, c2,
    NS: tl.constexpr, K: tl.constexpr, PAD: tl.constexpr, REFLECT: tl.constexpr, F: tl.constexpr,
    BW: tl.constexpr, KEEP: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    _, H, W, start, o, so, n_chunks, n_strips = scale_of(pid, BC, H1, W1, ROWS, DH, DH, NS, F, BW // F, 1)
    hw = H.to(tl.int64) * W
    chw = hw * C
    _fwd_columns(
        pid - start, x_ptr + o, y_ptr + o, w_ptr, s_ptr + so, cs_ptr + so, s_ptr,
        scr_ptr + start.to(tl.int64) * (KEPT_ROWS * (K // 2) * BW), BC, C, H, W, H + DH, W + DH,
        n_chunks, n_strips, ROWS, chw, hw, W, 1, chw, hw, W, 1, c1, c2, K, PAD, REFLECT, F, BW, False, False, False,
        KEEP, True,
    )  # fmt: skip


def launch_fwd_scales(x, y, B: int, C: int, dims, window, padding: str, c1: float, c2: float, out=None):
    """MS-SSIM's coarser scales' map sums in one launch (:func:`ssim_fwd_scales_kernel`).

    ``x``, ``y``, ``dims``: as :func:`.backward.launch_bwd_scales`'s. Returns one ``[B, C]``
    float32 mean over the map per scale: of the cs map at every scale but the last, of the SSIM map
    there (the terms; the kernel forms both, only these are reduced, in one launch:
    :func:`.partials.means`), views of ``out`` (float32 ``(B, C, len(dims))``) when it is given.
    Windows up to ``COLUMN_TAPS`` taps (the column body) only."""
    K = window.shape[0]
    check_scales(K, dims)
    pad, reflect = padding_shape(K, padding)
    BC = B * C
    dev = x.device
    maxnreg = fwd_maxnreg(K, reflect, False, True, device_arch(dev))
    keep = not reflect
    maps = [(out_size(h, K, padding), out_size(w, K, padding)) for h, w in dims]
    geo = geometry(maps[0][1], maps[0][0], K, BC, dev, maxnreg=maxnreg)
    n_groups = cdiv(BC, geo.bw // geo.f)
    per_chunk = [n_groups * cdiv(wo, geo.f) for _, wo in maps]
    heights = [ho for ho, _ in maps]

    def run(rows: int):
        slots = [p // n_groups * cdiv(ho, rows) for p, ho in zip(per_chunk, heights)]  # programs per channel group
        n_prog = sum(n_groups * s for s in slots)
        s_buf = torch.empty(BC * sum(slots), dtype=torch.float32, device=dev)
        cs_buf = torch.empty_like(s_buf)
        per_prog = KEPT_ROWS.value * (K // 2) * geo.bw if keep else 1
        scratch = torch.empty((n_prog, per_prog), dtype=torch.float32, device=dev)
        with device_guard(x):
            launch_kernel(ssim_fwd_scales_kernel, (n_prog,),
                x, y, window, s_buf, cs_buf, scratch, BC, C, dims[0][0], dims[0][1], maps[0][0] - dims[0][0], rows,
                float(c1), float(c2), NS=len(dims), K=K, PAD=pad, REFLECT=reflect, F=geo.f, BW=geo.bw, KEEP=keep,
                **launch_options(geo.warps, maxnreg=maxnreg),
            )  # fmt: skip
        return slots, s_buf, cs_buf

    planned = batched_rows(per_chunk, heights, K, geo.warps, maxnreg, dev, halo=False)
    slots, s_buf, cs_buf = run(planned)
    if out is None:
        out = torch.empty((B, C, len(dims)), dtype=torch.float32, device=dev)
    # fixed-order reduction of the per-program partial sums: deterministic, no atomics
    partial_means(cs_buf, BC, slots, [ho * wo for ho, wo in maps], out.view(BC, len(dims)), last=s_buf)
    return [out[:, :, j] for j in range(len(dims))]
