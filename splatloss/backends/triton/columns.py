"""Column bodies: one image column per lane (per thread), taps unrolled into registers.

Per input row each thread sums its own K taps in registers (the loads of neighbouring threads
overlap: L1 hits), and the vertical pass adds the row into the ``K - 1`` open map rows held as
per-thread pending sums (:func:`push`): no cross-thread reduction, no barrier in the forward. The
backward's horizontal adjoint needs the partial derivatives of the neighbouring columns: they go
through a scratch row in global memory (written and read back by the same CTA around one barrier,
so it stays in L1), as Triton has no shared-memory API. Windows up to ``launch.COLUMN_TAPS`` taps.

The adjoint: the gradient at input pixel ``q`` gathers, through the window, the partial
derivatives of every map value that used ``q`` (DESIGN.md): ``g[q] = sum_p P[p] w[q - p + pad]``
over map positions ``p`` (``P`` is zero off the map), i.e. the partials convolved with the window,
horizontally (through the scratch row) then vertically (pending sums here, a ring in
:mod:`.ring`). With "reflect" padding a padded sample is a copy of an input pixel, so ``q`` also
gathers through its mirror images ``-q`` and ``2 (n - 1) - q`` (extra taps at the borders only).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = [
    "load_taps",
    "add_tap",
    "hmoments",
    "add_masked_tap",
    "hmoments_masked",
    "push",
    "hadjoint_cols",
    "vadjoint_taps",
]


@triton.jit
def load_taps(w_ptr, K: tl.constexpr):
    """The K window taps as a tuple of scalars, loaded once per program (uniform registers)."""
    t = ()
    for a in tl.static_range(K):
        t = t + (tl.load(w_ptr + a),)
    return t


@triton.jit
def add_tap(h1, h2, h11, h12, l1, xv, yv, w, ok, l1_own, l1_last, a: tl.constexpr, PAD: tl.constexpr, L1: tl.constexpr):
    """Add tap ``a`` (shifted samples ``xv``, ``yv``, weight ``w``) to a lane's horizontal sums:
    the sample's products first (``x'^2 + y'^2`` and ``x'y'``, two multiplies and a fused
    multiply-add), then one fused multiply-add per sum."""
    sq = xv * xv + yv * yv
    xy = xv * yv
    h1 += w * xv
    h2 += w * yv
    h11 += w * sq
    h12 += w * xy
    if L1:
        if PAD > 0:
            if a == PAD:
                l1 += tl.where(ok & l1_own, tl.abs(xv - yv), 0.0)
        elif a == 0:
            l1 += tl.where(ok & l1_own, tl.abs(xv - yv), 0.0)
        else:
            l1 += tl.where(ok & l1_own & l1_last, tl.abs(xv - yv), 0.0)
    return h1, h2, h11, h12, l1


@triton.jit
def hmoments(
    x_ptr,
    y_ptr,
    x_lane,
    y_lane,
    r,
    c0,
    H,
    W,
    sx_h,
    sx_w,
    sy_h,
    sy_w,
    lane_ok,
    l1_own,
    l1_last,
    shift,
    wt,
    K: tl.constexpr,
    PAD: tl.constexpr,
    REFLECT: tl.constexpr,
    L1: tl.constexpr,
    EDGE: tl.constexpr,
):
    """Horizontal pass of padded input row ``r`` for the lanes whose windows start at padded column
    ``c0`` [BW] (element offsets ``x_lane`` / ``y_lane`` of column ``c0`` in row 0): window sums of
    x', y', x'^2 + y'^2 (only the sum enters SSIM), x'y' (``x' = x - shift``; a zero-padded sample
    is ``x = 0``, i.e. ``x' = -shift``). Each lane reads its own K
    taps (neighbouring lanes read the same addresses: L1 hits) and sums them in registers: no
    cross-lane traffic. With ``L1``, also the sum of ``|x - y|`` over the pixels the lane owns
    (tap PAD, or with "valid" tap 0 and, for the last map column ``l1_last``, every tap), else 0.

    ``EDGE`` False is the interior of the image: every lane valid and every tap inside the row,
    so the loads need no mask and no clamp (tap ``a`` is the lane's first address plus ``a``
    columns: an immediate offset when columns are contiguous). ``EDGE`` True masks each tap (zero
    padding) or mirrors it ("reflect"). A row outside the image (zero padding) is read clamped to
    the nearest row and its samples scaled by 0 (``x' = 0 * x - shift``, the multiply fused into
    the shift): no row test enters the tap loop. (A NaN / Inf in that border row gives the padded
    row NaN, in map rows whose windows hold the border row anyway.)"""
    rr = r
    if REFLECT:  # padded position i holds input -i, or 2 (n - 1) - i past the end (no edge repeat)
        rr = tl.where(rr < 0, -rr, rr)
        rr = tl.where(rr >= H, 2 * (H - 1) - rr, rr)
        rowf = 1.0
    else:
        rowf = tl.where((rr >= 0) & (rr < H), 1.0, 0.0)
        rr = tl.minimum(tl.maximum(rr, 0), H - 1)
    xrow = x_ptr + x_lane + rr.to(tl.int64) * sx_h  # column c0 of row rr
    yrow = y_ptr + y_lane + rr.to(tl.int64) * sy_h
    h1 = tl.zeros(c0.shape, dtype=tl.float32)
    h2 = tl.zeros(c0.shape, dtype=tl.float32)
    h11 = tl.zeros(c0.shape, dtype=tl.float32)
    h12 = tl.zeros(c0.shape, dtype=tl.float32)
    l1 = tl.zeros(c0.shape, dtype=tl.float32)
    if EDGE:
        for a in tl.static_range(K):
            c = c0 + a
            if REFLECT:
                c = tl.where(c < 0, -c, c)
                c = tl.where(c >= W, 2 * (W - 1) - c, c)
            ok = lane_ok & (c >= 0) & (c < W)
            d = (c - c0).to(tl.int64)
            xv = tl.load(xrow + d * sx_w, mask=ok, other=0.0).to(tl.float32) * rowf - shift
            yv = tl.load(yrow + d * sy_w, mask=ok, other=0.0).to(tl.float32) * rowf - shift
            h1, h2, h11, h12, l1 = add_tap(h1, h2, h11, h12, l1, xv, yv, wt[a], ok, l1_own, l1_last, a, PAD, L1)
    else:
        for a in tl.static_range(K):
            xv = tl.load(xrow + a * sx_w).to(tl.float32) * rowf - shift
            yv = tl.load(yrow + a * sy_w).to(tl.float32) * rowf - shift
            h1, h2, h11, h12, l1 = add_tap(h1, h2, h11, h12, l1, xv, yv, wt[a], True, l1_own, l1_last, a, PAD, L1)
    return h1, h2, h11, h12, l1


@triton.jit
def add_masked_tap(h0, h1, h2, h11, h12, mv, xv, yv, w):
    """Add tap (weight ``w``, mask ``mv``, shifted samples ``xv``, ``yv``) to a lane's masked
    horizontal sums: ``m``, ``m x'``, ``m y'``, ``m (x'^2 + y'^2)``, ``m x'y'``. (Weighting the
    tap by ``w m`` once instead saves a multiply per tap but made the backward with both gradients
    spill at sm_90.)"""
    xm = mv * xv
    ym = mv * yv
    sq = xm * xv + ym * yv
    xy = xm * yv
    h0 += w * mv
    h1 += w * xm
    h2 += w * ym
    h11 += w * sq
    h12 += w * xy
    return h0, h1, h2, h11, h12


@triton.jit
def hmoments_masked(
    x_ptr, y_ptr, m_ptr, x_lane, y_lane, m_lane, r, c0, H, W, sx_h, sx_w, sy_h, sy_w, sm_h, sm_w,
    lane_ok, shift, wt, K: tl.constexpr, REFLECT: tl.constexpr, EDGE: tl.constexpr,
):  # fmt: skip
    """:func:`hmoments` under a mask (``m_lane``: offsets of column ``c0`` of the mask in row 0):
    window sums of ``m``, ``m x'``, ``m y'``, ``m (x'^2 + y'^2)``, ``m x'y'``. The mask is padded
    with ones where the images are zero-padded ("same": a padded sample is ``x' = -shift`` with
    weight 1) and mirrored with them ("reflect"), as docs/conventions.md states."""
    rr = r
    if REFLECT:  # padded position i holds input -i, or 2 (n - 1) - i past the end (no edge repeat)
        rr = tl.where(rr < 0, -rr, rr)
        rr = tl.where(rr >= H, 2 * (H - 1) - rr, rr)
        rowf = 1.0
    else:
        rowf = tl.where((rr >= 0) & (rr < H), 1.0, 0.0)
        rr = tl.minimum(tl.maximum(rr, 0), H - 1)
    mpad = 1.0 - rowf  # a zero-padded row: mask 1
    xrow = x_ptr + x_lane + rr.to(tl.int64) * sx_h  # column c0 of row rr
    yrow = y_ptr + y_lane + rr.to(tl.int64) * sy_h
    mrow = m_ptr + m_lane + rr.to(tl.int64) * sm_h
    h0 = tl.zeros(c0.shape, dtype=tl.float32)
    h1 = tl.zeros(c0.shape, dtype=tl.float32)
    h2 = tl.zeros(c0.shape, dtype=tl.float32)
    h11 = tl.zeros(c0.shape, dtype=tl.float32)
    h12 = tl.zeros(c0.shape, dtype=tl.float32)
    if EDGE:
        for a in tl.static_range(K):
            c = c0 + a
            if REFLECT:
                c = tl.where(c < 0, -c, c)
                c = tl.where(c >= W, 2 * (W - 1) - c, c)
            ok = lane_ok & (c >= 0) & (c < W)
            d = (c - c0).to(tl.int64)
            xv = tl.load(xrow + d * sx_w, mask=ok, other=0.0).to(tl.float32) * rowf - shift
            yv = tl.load(yrow + d * sy_w, mask=ok, other=0.0).to(tl.float32) * rowf - shift
            mv = tl.load(mrow + d * sm_w, mask=ok, other=1.0) * rowf + mpad  # zero padding: mask 1
            h0, h1, h2, h11, h12 = add_masked_tap(h0, h1, h2, h11, h12, mv, xv, yv, wt[a])
    else:
        for a in tl.static_range(K):
            xv = tl.load(xrow + a * sx_w).to(tl.float32) * rowf - shift
            yv = tl.load(yrow + a * sy_w).to(tl.float32) * rowf - shift
            mv = tl.load(mrow + a * sm_w) * rowf + mpad
            h0, h1, h2, h11, h12 = add_masked_tap(h0, h1, h2, h11, h12, mv, xv, yv, wt[a])
    return h0, h1, h2, h11, h12


@triton.jit
def push(pending, h, wt, K: tl.constexpr, REVERSED: tl.constexpr):
    """Add a new row ``h`` [BW] to the ``K - 1`` pending sums (slot j: the row j + 1 steps ahead)
    and return the row it completes and the pending sums one row on. Slot j (0 = the completed
    row) takes tap ``K - 1 - j`` (``REVERSED``: the filter) or ``j`` (the adjoint). Each new slot
    is one fused multiply-add into the slot it moves to; the newest starts as a product."""
    if REVERSED:
        done = pending[0] + wt[K - 1] * h
        out = ()
        for j in tl.static_range(1, K - 1):
            out = out + (pending[j] + wt[K - 1 - j] * h,)
        return done, out + (wt[0] * h,)
    else:
        done = pending[0] + wt[0] * h
        out = ()
        for j in tl.static_range(1, K - 1):
            out = out + (pending[j] + wt[j] * h,)
        return done, out + (wt[K - 1] * h,)


@triton.jit
def hadjoint_cols(
    buf,
    w_ptr,
    wt,
    q_c0,
    W,
    f,
    F: tl.constexpr,
    BW: tl.constexpr,
    K: tl.constexpr,
    PAD: tl.constexpr,
    REFLECT: tl.constexpr,
):
    """Horizontal adjoint of one scratch row ``buf`` [BW] of partials, one gradient column per
    lane. Lane ``l`` is frame column ``f = l % F`` holding map column ``q_c0 - (K - 1) + PAD + f``;
    gradient column ``q = q_c0 + f`` (lanes ``f < F - (K - 1)``) gathers ``w[a] * frame[f + K - 1 -
    a]``, plus, under "reflect", the same taps through its mirror images (padded columns ``-q``
    and ``2 (W - 1) - q``). The direct taps need no mask: for the lanes whose result is kept they
    stay inside the frame (the other lanes may read the next frame; their results are dropped)."""
    ar = tl.arange(0, BW)
    acc = tl.zeros([BW], dtype=tl.float32)
    for a in tl.static_range(K):
        v = tl.load(buf + ar + (K - 1 - a))
        if REFLECT:
            frame = buf + ar - f
            q = q_c0 + f
            idx_l = (K - 1 - a) - 2 * q_c0 - f
            ok_l = (q >= 1) & (q <= PAD) & (idx_l >= 0) & (idx_l < F)
            v += tl.load(frame + idx_l, mask=ok_l, other=0.0)
            idx_r = (K - 1 - a) + 2 * (W - 1) - 2 * q_c0 - f
            ok_r = (q >= W - 1 - PAD) & (q <= W - 2) & (idx_r >= 0) & (idx_r < F)
            v += tl.load(frame + idx_r, mask=ok_r, other=0.0)
        acc += wt[a] * v
    return acc


@triton.jit
def vadjoint_taps(w_ptr, wt, p, H, K: tl.constexpr, PAD: tl.constexpr, REFLECT: tl.constexpr):
    """Weights with which map row ``p`` enters the K pending gradient rows ``q = p - PAD + j``:
    tap ``j``, plus, under "reflect", the taps through the mirror images of ``q`` (padded rows
    ``-q`` and ``2 (H - 1) - q``): ``w[j - 2 q]`` for ``1 <= q <= PAD`` and ``w[2 (H - 1) - 2 q + j]``
    for ``H - 1 - PAD <= q <= H - 2``. Scalars (one per row, the same for every lane)."""
    if REFLECT:
        out = ()
        for j in tl.static_range(K):
            q = p - PAD + j
            t_lo = j - 2 * q
            t_hi = 2 * (H - 1) - 2 * q + j
            wj = wt[j]
            wj += tl.load(
                w_ptr + t_lo,
                mask=(q >= 1) & (q <= PAD) & (t_lo >= 0) & (t_lo < K),
                other=0.0,
            )
            wj += tl.load(
                w_ptr + t_hi,
                mask=(q >= H - 1 - PAD) & (q <= H - 2) & (t_hi >= 0) & (t_hi < K),
                other=0.0,
            )
            out = out + (wj,)
        return out
    else:
        return wt
