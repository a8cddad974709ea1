"""Column bodies: one image column per lane (per thread), taps unrolled into registers.

Per input row each thread sums its own K taps in registers (the loads of neighbouring threads
overlap: L1 hits), around the row's own pixel at the lane's centre tap, and the vertical pass
moves the row into the open windows, each around its centre row's shift (:func:`vmoments`;
under a mask :func:`vmoments_masked`, which moves each row with its filtered mask): no
cross-thread reduction, no barrier in the forward. The
backward's horizontal adjoint needs the partial derivatives of the neighbouring columns: they go
through a scratch row in global memory (written and read back by the same CTA around one barrier,
so it stays in L1), as Triton has no shared-memory API. Windows up to ``launch.COLUMN_TAPS`` taps.

The adjoint: the gradient at input pixel ``q`` gathers, through the window, the partial
derivatives of every map value that used ``q`` (docs/triton.md, "How they work"): ``g[q] = sum_p P[p] w[q - p + pad]``
over map positions ``p`` (``P`` is zero off the map), i.e. the partials convolved with the window:
the column kernels, masked or not, vertically (pending sums, :func:`push_moved`) then
horizontally (through the scratch row, :func:`hadjoint_moved`); the ring kernels through a ring
(:mod:`.ring`). With "reflect" padding a padded
sample is a copy of an input pixel, so ``q`` also gathers through its mirror images ``-q`` and
``2 (n - 1) - q`` (extra taps at the borders only).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = [
    "load_taps",
    "pack",
    "unpack",
    "words",
    "stage_row",
    "add_tap",
    "hmoments",
    "add_masked_tap",
    "hmoments_masked",
    "vmoments_masked",
    "vmoments_masked_kept",
    "vmoments_kept",
    "push",
    "hadjoint_moved",
    "push_moved",
    "vadjoint_taps",
    "vmoments",
]


@triton.jit
def load_taps(w_ptr, K: tl.constexpr):
    """The K window taps as a tuple of scalars, loaded once per program (uniform registers)."""
    t = ()
    for a in tl.static_range(K):
        t = t + (tl.load(w_ptr + a),)
    return t


@triton.jit
def pack(a, b):
    """Two float32 values per lane as one 64-bit word, ``a`` in its low half (the float at the even
    address), bit for bit (NaN payloads, signed zeros, subnormals): values stored in pairs take one
    64-bit load or store where they took two (:func:`unpack`). Only where the pairs do not cost
    registers: the moments kernels' kept rows and pending sums in pairs spilled at 64 registers
    (tools/check_kernels.py)."""
    lo = a.to(tl.int32, bitcast=True).to(tl.uint32).to(tl.int64)
    return (b.to(tl.int32, bitcast=True).to(tl.int64) << 32) | lo


@triton.jit
def unpack(v):
    """The two float32 values of 64-bit words made by :func:`pack`: ``(low, high)``."""
    return v.to(tl.int32).to(tl.float32, bitcast=True), (v >> 32).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def words(lane, BW: tl.constexpr):
    """The 64-bit words of a scratch block of ``2 BW`` floats, one per lane: ``lane`` (a lane's own
    float pointer, ``ptr + arange(BW)``, ``ptr`` at an even offset) gives word ``l`` at floats
    ``2 l``, ``2 l + 1``, ``BW`` words on the next block's."""
    return (lane + tl.arange(0, BW)).to(tl.pointer_type(tl.int64))


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
    wt,
    K: tl.constexpr,
    PAD: tl.constexpr,
    REFLECT: tl.constexpr,
    L1: tl.constexpr,
    EDGE: tl.constexpr,
    INSIDE: tl.constexpr,
):
    """Horizontal pass of padded input row ``r`` for the lanes whose windows start at padded column
    ``c0`` [BW] (element offsets ``x_lane`` / ``y_lane`` of column ``c0`` in row 0), around the row's
    own shift: ``s = (x + y) / 2`` at the lane's centre tap (``K // 2``; 0 where that is not
    finite, or in a zero-padded row). Returns the window sums of x', y', x'^2 + y'^2 (only the
    sum enters SSIM), x'y' (``x' = x - s``), the L1 sum and ``s``. Each lane reads its own K
    taps (neighbouring lanes read the same addresses: L1 hits) and sums them in registers: no
    cross-lane traffic. With ``L1``, also the sum of ``|x - y|`` over the pixels the lane owns
    (tap PAD, or with "valid" tap 0 and, for the last map column ``l1_last``, every tap), else 0.

    Why a shift per row and lane: in a window where the row is flat the differences are exact
    zeros, so the moments of a flat window carry no rounding at all (:func:`vmoments` moves them
    to the window's centre-row shift); around one shift per program, ``E[x'^2] - mu'^2`` cancels
    at the magnitude of ``(level - shift)^2`` where SSIM's partials are of order ``1 / C2``.

    ``EDGE`` False is the interior of the image: every lane valid and every tap inside the row,
    so the loads need no mask and no clamp (tap ``a`` is the lane's first address plus ``a``
    columns: an immediate offset when columns are contiguous). ``EDGE`` True masks each tap (zero
    padding) or mirrors it ("reflect"). A row outside the image (zero padding) is read clamped to
    the nearest row and its sums and shift scaled by 0: no row test enters the tap loop. (A NaN /
    Inf in that border row gives the padded row NaN, in map rows whose windows hold the border row
    anyway.) ``INSIDE``: the caller only passes rows inside the image (the forward under "valid"
    padding), read as they are."""
    rr = r
    if REFLECT:  # padded position i holds input -i, or 2 (n - 1) - i past the end (no edge repeat)
        rr = tl.where(rr < 0, -rr, rr)
        rr = tl.where(rr >= H, 2 * (H - 1) - rr, rr)
        rowf = 1.0
    elif INSIDE:
        rowf = 1.0
    else:
        rowf = tl.where((rr >= 0) & (rr < H), 1.0, 0.0)
        rr = tl.minimum(tl.maximum(rr, 0), H - 1)
    xrow = x_ptr + x_lane + rr.to(tl.int64) * sx_h  # column c0 of row rr
    yrow = y_ptr + y_lane + rr.to(tl.int64) * sy_h
    CT: tl.constexpr = K // 2
    # the centre tap first (the row's shift), then each tap loaded and summed at once (the centre
    # tap's samples reused), so that no more than one tap's samples are live
    if EDGE:
        cc = c0 + CT
        if REFLECT:
            cc = tl.where(cc < 0, -cc, cc)
            cc = tl.where(cc >= W, 2 * (W - 1) - cc, cc)
        ok_c = lane_ok & (cc >= 0) & (cc < W)
        dc = (cc - c0).to(tl.int64)
        xc = tl.load(xrow + dc * sx_w, mask=ok_c, other=0.0).to(tl.float32)
        yc = tl.load(yrow + dc * sy_w, mask=ok_c, other=0.0).to(tl.float32)
    else:
        xc = tl.load(xrow + CT * sx_w).to(tl.float32)
        yc = tl.load(yrow + CT * sy_w).to(tl.float32)
    s = 0.5 * xc + 0.5 * yc
    s = tl.where(s - s == 0.0, s, 0.0)  # a NaN / Inf centre: shift 0 (the row's sums carry it)
    h1 = tl.zeros(c0.shape, dtype=tl.float32)
    h2 = tl.zeros(c0.shape, dtype=tl.float32)
    h11 = tl.zeros(c0.shape, dtype=tl.float32)
    h12 = tl.zeros(c0.shape, dtype=tl.float32)
    l1 = tl.zeros(c0.shape, dtype=tl.float32)
    for a in tl.static_range(K):
        if EDGE:
            c = c0 + a
            if REFLECT:
                c = tl.where(c < 0, -c, c)
                c = tl.where(c >= W, 2 * (W - 1) - c, c)
            ok = lane_ok & (c >= 0) & (c < W)
            if a == CT:
                xv = xc
                yv = yc
            else:
                d = (c - c0).to(tl.int64)
                xv = tl.load(xrow + d * sx_w, mask=ok, other=0.0).to(tl.float32)
                yv = tl.load(yrow + d * sy_w, mask=ok, other=0.0).to(tl.float32)
        else:
            ok = True
            if a == CT:
                xv = xc
                yv = yc
            else:
                xv = tl.load(xrow + a * sx_w).to(tl.float32)
                yv = tl.load(yrow + a * sy_w).to(tl.float32)
        h1, h2, h11, h12, l1 = add_tap(h1, h2, h11, h12, l1, xv - s, yv - s, wt[a], ok, l1_own, l1_last, a, PAD, L1)
    if not (REFLECT or INSIDE):
        h1 *= rowf
        h2 *= rowf
        h11 *= rowf
        h12 *= rowf
        s *= rowf
    return h1, h2, h11, h12, l1, s


@triton.jit
def _rebased(m1, m2, e11, e12, h1, h2, h11, h12, t, w):
    """Add one row's horizontal sums (around the row's shift ``s_r``), moved to another shift
    ``S = s_r - t``, with vertical weight ``w``: ``x - S = (x - s_r) + t``, so the row's sums
    become ``h1 + t``, ``h11 + 2 t (h1 + h2) + 2 t^2``, ``h12 + t (h1 + h2) + t^2``. ``t`` is 0 (and
    every term exact) where the row and the window's centre row have the same shift."""
    u = h1 + t
    v = h2 + t
    z = t * (u + h2)
    return m1 + w * u, m2 + w * v, e11 + w * (h11 + 2.0 * z), e12 + w * (h12 + z)


@triton.jit
def vmoments(state, h1, h2, h11, h12, s, wt, K: tl.constexpr):
    """Vertical pass of one new row (sums ``h*`` around its shift ``s``, :func:`hmoments`) for
    windows whose moments are formed around their centre row's shift (the filter, the window's
    tap ``a`` on the ``a``-th row of the window).

    ``state`` (a tuple of tuples, per lane: ``ring1, ring2, ring11, ring12, hist, p1, p2, p11,
    p12``; all zeros before the first row): ``hist``, the shifts of the last ``K - 1`` rows (oldest first);
    ``ring*``, the sums of the last ``C = K // 2`` rows (oldest first); ``p*``, the pending sums
    of the ``C`` windows whose centre row has arrived but not their last row (slot ``j - 1``: the
    window centred ``j`` rows back), each around its centre's shift. The new row joins every
    pending window (moved to its shift), completes the oldest, and opens the window it is the
    centre of (with the ring's ``C`` rows moved to the new shift): ``K - 1`` moved rows per row,
    each (row, window) pair once. Returns the completed window's moments and shift, and the
    state one row on."""
    C: tl.constexpr = K // 2
    ring1 = state[0]
    ring2 = state[1]
    ring11 = state[2]
    ring12 = state[3]
    hist = state[4]
    p1 = state[5]
    p2 = state[6]
    p11 = state[7]
    p12 = state[8]
    q1 = ()
    q2 = ()
    q11 = ()
    q12 = ()
    ts = ()  # the new row's shift minus that of the row j back, j = 1..C
    for j in tl.static_range(1, C + 1):
        ts = ts + (s - hist[K - 1 - j],)
    for j in tl.static_range(1, C + 1):  # pending window centred j rows back: the row is its tap C + j
        a1, a2, a11, a12 = _rebased(
            p1[j - 1], p2[j - 1], p11[j - 1], p12[j - 1], h1, h2, h11, h12, ts[j - 1], wt[C + j]
        )
        q1 = q1 + (a1,)
        q2 = q2 + (a2,)
        q11 = q11 + (a11,)
        q12 = q12 + (a12,)
    done_s = hist[C]  # the completed window's centre row: C rows back
    # the window centred on the new row: the row itself (tap C, no move), then the ring's rows
    n1 = wt[C] * h1
    n2 = wt[C] * h2
    n11 = wt[C] * h11
    n12 = wt[C] * h12
    for k in tl.static_range(C):  # ring row k is C - k rows back: tap k, moved by its shift - s
        n1, n2, n11, n12 = _rebased(n1, n2, n11, n12, ring1[k], ring2[k], ring11[k], ring12[k], -ts[C - 1 - k], wt[k])
    o1 = (n1,)
    o2 = (n2,)
    o11 = (n11,)
    o12 = (n12,)
    r1 = ()
    r2 = ()
    r11 = ()
    r12 = ()
    for j in tl.static_range(C - 1):
        o1 = o1 + (q1[j],)
        o2 = o2 + (q2[j],)
        o11 = o11 + (q11[j],)
        o12 = o12 + (q12[j],)
        r1 = r1 + (ring1[j + 1],)
        r2 = r2 + (ring2[j + 1],)
        r11 = r11 + (ring11[j + 1],)
        r12 = r12 + (ring12[j + 1],)
    nh = ()
    for j in tl.static_range(1, K - 1):
        nh = nh + (hist[j],)
    done = (q1[C - 1], q2[C - 1], q11[C - 1], q12[C - 1], done_s)
    state = (r1 + (h1,), r2 + (h2,), r11 + (h11,), r12 + (h12,), nh + (s,), o1, o2, o11, o12)
    return done, state


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
    lane_ok, wt, K: tl.constexpr, REFLECT: tl.constexpr, EDGE: tl.constexpr,
):  # fmt: skip
    """:func:`hmoments` under a mask (``m_lane``: offsets of column ``c0`` of the mask in row 0):
    window sums of ``m``, ``m x'``, ``m y'``, ``m (x'^2 + y'^2)``, ``m x'y'`` around the row's
    own shift ``s`` (the images' mean at the lane's centre tap, as :func:`hmoments`; it does not
    look at the mask), ``s``, and the mask at the centre tap as the sums took it. The mask is
    padded with ones where the images are zero-padded ("same": a padded sample is ``x' = -s``
    with weight 1; a padded row has ``s = 0``) and mirrored with them ("reflect"), as
    docs/conventions.md states."""
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
    CT: tl.constexpr = K // 2
    if EDGE:
        cc = c0 + CT
        if REFLECT:
            cc = tl.where(cc < 0, -cc, cc)
            cc = tl.where(cc >= W, 2 * (W - 1) - cc, cc)
        ok_c = lane_ok & (cc >= 0) & (cc < W)
        dc = (cc - c0).to(tl.int64)
        xc = tl.load(xrow + dc * sx_w, mask=ok_c, other=0.0).to(tl.float32)
        yc = tl.load(yrow + dc * sy_w, mask=ok_c, other=0.0).to(tl.float32)
    else:
        xc = tl.load(xrow + CT * sx_w).to(tl.float32)
        yc = tl.load(yrow + CT * sy_w).to(tl.float32)
    s = 0.5 * xc + 0.5 * yc
    s = tl.where(s - s == 0.0, s, 0.0) * rowf  # a NaN / Inf centre or a zero-padded row: shift 0
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
            if a == CT:
                xv = xc * rowf - s
                yv = yc * rowf - s
            else:
                xv = tl.load(xrow + d * sx_w, mask=ok, other=0.0).to(tl.float32) * rowf - s
                yv = tl.load(yrow + d * sy_w, mask=ok, other=0.0).to(tl.float32) * rowf - s
            mv = tl.load(mrow + d * sm_w, mask=ok, other=1.0) * rowf + mpad  # zero padding: mask 1
            if a == CT:
                mcen = mv
            h0, h1, h2, h11, h12 = add_masked_tap(h0, h1, h2, h11, h12, mv, xv, yv, wt[a])
    else:
        for a in tl.static_range(K):
            if a == CT:
                xv = xc * rowf - s
                yv = yc * rowf - s
            else:
                xv = tl.load(xrow + a * sx_w).to(tl.float32) * rowf - s
                yv = tl.load(yrow + a * sy_w).to(tl.float32) * rowf - s
            mv = tl.load(mrow + a * sm_w) * rowf + mpad
            if a == CT:
                mcen = mv
            h0, h1, h2, h11, h12 = add_masked_tap(h0, h1, h2, h11, h12, mv, xv, yv, wt[a])
    return h0, h1, h2, h11, h12, s, mcen


@triton.jit
def _rebased_masked(m0, m1, m2, e11, e12, h0, h1, h2, h11, h12, t, w):
    """:func:`_rebased` under a mask: the row's masked sums (``h0 = F_h(M)`` where the unmasked
    sums have the taps' sum, 1) moved to the shift ``S = s_r - t``: ``h1 + t h0``, ``h11 + 2 t (h1
    + h2) + 2 t^2 h0``, ``h12 + t (h1 + h2) + t^2 h0``. Exact where ``t`` is 0."""
    u = h1 + t * h0
    v = h2 + t * h0
    z = t * (u + h2)
    return m0 + w * h0, m1 + w * u, m2 + w * v, e11 + w * (h11 + 2.0 * z), e12 + w * (h12 + z)


@triton.jit
def vmoments_masked(state, h0, h1, h2, h11, h12, s, wt, K: tl.constexpr):
    """:func:`vmoments` under a mask: the same state with a fifth sum, the filtered mask (``state``:
    ``ring0, ring1, ring2, ring11, ring12, hist, p0, p1, p2, p11, p12``; zeros before the first row),
    each row moved to its window's centre-row shift with its filtered mask
    (:func:`_rebased_masked`). Returns the completed window's ``F(M)``, its four weighted moment
    sums and its shift, and the state one row on."""
    C: tl.constexpr = K // 2
    ring0 = state[0]
    ring1 = state[1]
    ring2 = state[2]
    ring11 = state[3]
    ring12 = state[4]
    hist = state[5]
    p0 = state[6]
    p1 = state[7]
    p2 = state[8]
    p11 = state[9]
    p12 = state[10]
    q0 = ()
    q1 = ()
    q2 = ()
    q11 = ()
    q12 = ()
    ts = ()  # the new row's shift minus that of the row j back, j = 1..C
    for j in tl.static_range(1, C + 1):
        ts = ts + (s - hist[K - 1 - j],)
    for j in tl.static_range(1, C + 1):  # pending window centred j rows back: the row is its tap C + j
        a0, a1, a2, a11, a12 = _rebased_masked(
            p0[j - 1], p1[j - 1], p2[j - 1], p11[j - 1], p12[j - 1], h0, h1, h2, h11, h12, ts[j - 1], wt[C + j]
        )
        q0 = q0 + (a0,)
        q1 = q1 + (a1,)
        q2 = q2 + (a2,)
        q11 = q11 + (a11,)
        q12 = q12 + (a12,)
    done_s = hist[C]  # the completed window's centre row: C rows back
    # the window centred on the new row: the row itself (tap C, no move), then the ring's rows
    n0 = wt[C] * h0
    n1 = wt[C] * h1
    n2 = wt[C] * h2
    n11 = wt[C] * h11
    n12 = wt[C] * h12
    for k in tl.static_range(C):  # ring row k is C - k rows back: tap k, moved by its shift - s
        n0, n1, n2, n11, n12 = _rebased_masked(
            n0, n1, n2, n11, n12, ring0[k], ring1[k], ring2[k], ring11[k], ring12[k], -ts[C - 1 - k], wt[k]
        )
    o0 = (n0,)
    o1 = (n1,)
    o2 = (n2,)
    o11 = (n11,)
    o12 = (n12,)
    r0 = ()
    r1 = ()
    r2 = ()
    r11 = ()
    r12 = ()
    for j in tl.static_range(C - 1):
        o0 = o0 + (q0[j],)
        o1 = o1 + (q1[j],)
        o2 = o2 + (q2[j],)
        o11 = o11 + (q11[j],)
        o12 = o12 + (q12[j],)
        r0 = r0 + (ring0[j + 1],)
        r1 = r1 + (ring1[j + 1],)
        r2 = r2 + (ring2[j + 1],)
        r11 = r11 + (ring11[j + 1],)
        r12 = r12 + (ring12[j + 1],)
    nh = ()
    for j in tl.static_range(1, K - 1):
        nh = nh + (hist[j],)
    done = (q0[C - 1], q1[C - 1], q2[C - 1], q11[C - 1], q12[C - 1], done_s)
    state = (r0 + (h0,), r1 + (h1,), r2 + (h2,), r11 + (h11,), r12 + (h12,), nh + (s,), o0, o1, o2, o11, o12)
    return done, state


@triton.jit
def load_kept(lane, i, KEPT: tl.constexpr, NQ: tl.constexpr, K: tl.constexpr, BW: tl.constexpr):
    """The last ``C = K // 2`` rows of ``NQ`` quantities kept in a program's scratch instead of
    registers: from ``KEPT`` floats past ``lane`` (the lane's own pointer into the scratch),
    quantity ``q``'s row in slot ``v`` at ``(q C + v) BW``, row ``i`` of the stream in slot
    ``i % C``. Each lane reads back only what it wrote (no barrier; the slots stay in L1). Returns
    ``NQ`` tuples, each the ``C`` rows oldest first (row ``i - C`` .. ``i - 1``), the ring that
    :func:`vmoments` would carry in registers."""
    C: tl.constexpr = K // 2
    ring = ()
    for q in tl.static_range(NQ):
        rows = ()
        for k in tl.static_range(C):  # ring row k is C - k rows back: row i - (C - k), slot (i + k) % C
            rows = rows + (tl.load(lane + KEPT + (q * C + (i + k) % C) * BW),)
        ring = ring + (rows,)
    return ring


@triton.jit
def store_kept(lane, i, values, KEPT: tl.constexpr, NQ: tl.constexpr, K: tl.constexpr, BW: tl.constexpr):
    """Keep row ``i``'s ``values`` (``NQ``, one per quantity) in slot ``i % C`` (:func:`load_kept`):
    the oldest row's, read before."""
    C: tl.constexpr = K // 2
    for q in tl.static_range(NQ):
        tl.store(lane + KEPT + (q * C + i % C) * BW, values[q])


@triton.jit
def vmoments_kept(state, h1, h2, h11, h12, s, wt, i, lane, KEPT: tl.constexpr, K: tl.constexpr, BW: tl.constexpr):
    """:func:`vmoments` with the last ``K // 2`` rows' four sums kept in the program's scratch
    (:func:`load_kept`; ``4 (K // 2)`` rows of ``BW`` floats from ``KEPT``, zeros before the first
    row) instead of registers: ``state`` is ``hist, p1, p2, p11, p12``. The same sums bit for bit.
    (The shifts kept there too, ``hist`` would leave the registers, but the forward then spilled
    more at 64 registers, not less: the loads are scheduled early and their values stay live.)"""
    ring = load_kept(lane, i, KEPT, 4, K, BW)
    done, full = vmoments(ring + state, h1, h2, h11, h12, s, wt, K)
    store_kept(lane, i, (h1, h2, h11, h12), KEPT, 4, K, BW)
    return done, (full[4], full[5], full[6], full[7], full[8])


@triton.jit
def vmoments_masked_kept(
    state, h0, h1, h2, h11, h12, s, mcen, wt, i, lane, KEPT: tl.constexpr, K: tl.constexpr, BW: tl.constexpr
):
    """:func:`vmoments_masked` with the last ``K // 2`` rows' five sums and centre masks ``mcen``
    (:func:`hmoments_masked`) kept in the program's scratch (:func:`load_kept`; ``6 (K // 2)``
    rows of ``BW`` floats from ``KEPT``, zeros before the first row) instead of registers:
    ``state`` is ``hist, p0, p1, p2, p11, p12``. The same sums bit for bit. Returns the completed
    window's moments and shift, the state one row on, and the centre mask of the row ``K // 2``
    rows back (the completed window's centre row)."""
    ring = load_kept(lane, i, KEPT, 6, K, BW)
    done, full = vmoments_masked((ring[0], ring[1], ring[2], ring[3], ring[4]) + state, h0, h1, h2, h11, h12, s, wt, K)
    store_kept(lane, i, (h0, h1, h2, h11, h12, mcen), KEPT, 6, K, BW)
    return done, (full[5], full[6], full[7], full[8], full[9], full[10]), ring[5][0]


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
def push_moved(pending, d, e, hist, s, shift, wt, K: tl.constexpr):
    """:func:`push` (the adjoint, not reversed) of a map row's partial ``d`` of a mean, with the
    shift correction of each gradient row: slot ``j`` (gradient row ``q_j``, shift ``hist[j]``,
    the newest ``s``) takes ``d + e (s(q_j) - shift)``, ``e = 2 d/dE[x'^2] + d/dE[x'y']`` and
    ``shift`` the map row's (its centre row's): the pixel-shift differences that the horizontal
    adjoint applies are taken against each row's own shift. Exact zeros where the shifts agree."""
    done = pending[0] + wt[0] * (d + e * (hist[0] - shift))
    out = ()
    for j in tl.static_range(1, K - 1):
        out = out + (pending[j] + wt[j] * (d + e * (hist[j] - shift)),)
    return done, out + (wt[K - 1] * (d + e * (s - shift)),)


@triton.jit
def _moved_terms(v_sq2, v_xy, u1, u2, sh, xq, yq, NEED1: tl.constexpr, NEED2: tl.constexpr):
    """One source lane's terms of the two gradients at a pixel ``(xq, yq)``: ``u1 + v_sq2 (xq - sh)
    + v_xy (yq - sh)`` and the same for y with the roles swapped (0 where not needed)."""
    dx = xq - sh
    dy = yq - sh
    t1 = u1 + v_sq2 * dx + v_xy * dy if NEED1 else 0.0
    t2 = u2 + v_sq2 * dy + v_xy * dx if NEED2 else 0.0
    return t1, t2


@triton.jit
def stage_row(
    buf, v_sq2, v_xy, u1, u2, sh, NEED1: tl.constexpr, NEED2: tl.constexpr, BW: tl.constexpr, PAIRED: tl.constexpr
):
    """Stage one gradient row's values for :func:`hadjoint_moved` in the scratch row ``buf`` (a
    float pointer at an even offset, ``5 BW`` floats): per lane (frame column) ``l``, word ``l`` of
    the first ``2 BW`` floats holds ``(v_sq2, v_xy)`` (:func:`pack`: one 64-bit load per tap where
    it took two), then ``BW`` floats each of ``u1`` (with ``NEED1``), ``u2`` (with ``NEED2``) and
    the shift ``sh``. ``PAIRED`` with one gradient: word ``l`` of the next ``2 BW`` floats holds
    that gradient's partial and the shift, one 64-bit load more in place of two; a kernel with the
    registers to spare asks for it (the masked adjoint: tools/check_kernels.py; the SSIM adjoint
    spilled 32 B with it at 64 registers on sm_90)."""
    ar = tl.arange(0, BW)
    tl.store(words(buf + ar, BW), pack(v_sq2, v_xy))
    if PAIRED and NEED1 != NEED2:
        if NEED1:
            tl.store(words(buf + 2 * BW + ar, BW), pack(u1, sh))
        else:
            tl.store(words(buf + 2 * BW + ar, BW), pack(u2, sh))
    else:
        if NEED1:
            tl.store(buf + 2 * BW + ar, u1)
        if NEED2:
            tl.store(buf + 3 * BW + ar, u2)
        tl.store(buf + 4 * BW + ar, sh)


@triton.jit
def _staged_terms(w, one, xq, yq, ok, NEED1: tl.constexpr, NEED2: tl.constexpr, BW: tl.constexpr, PAIRED: tl.constexpr):
    """One source column's terms (:func:`_moved_terms`) from a staged row (:func:`stage_row`): its
    word pointers ``w`` and its shift's float pointers ``one`` (the partials ``2 BW`` and ``BW``
    before them; with ``PAIRED`` and one gradient, its partial and shift the word ``BW`` words after
    ``w``); ``ok``: a load mask (None: all), zeros where it is False."""
    if PAIRED and NEED1 != NEED2:
        if ok is None:
            v_sq2, v_xy = unpack(tl.load(w))
            u, sh = unpack(tl.load(w + BW))
        else:
            v_sq2, v_xy = unpack(tl.load(w, mask=ok, other=0))
            u, sh = unpack(tl.load(w + BW, mask=ok, other=0))
        u1 = u if NEED1 else 0.0
        u2 = u if NEED2 else 0.0
    elif ok is None:
        v_sq2, v_xy = unpack(tl.load(w))
        u1 = tl.load(one - 2 * BW) if NEED1 else 0.0
        u2 = tl.load(one - BW) if NEED2 else 0.0
        sh = tl.load(one)
    else:
        v_sq2, v_xy = unpack(tl.load(w, mask=ok, other=0))
        u1 = tl.load(one - 2 * BW, mask=ok, other=0.0) if NEED1 else 0.0
        u2 = tl.load(one - BW, mask=ok, other=0.0) if NEED2 else 0.0
        sh = tl.load(one, mask=ok, other=0.0)
    return _moved_terms(v_sq2, v_xy, u1, u2, sh, xq, yq, NEED1, NEED2)


@triton.jit
def hadjoint_moved(
    buf,
    wt,
    q_c0,
    W,
    f,
    xq,
    yq,
    NEED1: tl.constexpr,
    NEED2: tl.constexpr,
    F: tl.constexpr,
    BW: tl.constexpr,
    K: tl.constexpr,
    PAD: tl.constexpr,
    REFLECT: tl.constexpr,
    EDGE: tl.constexpr,
    PAIRED: tl.constexpr,
):
    """Horizontal adjoint of one gradient row around the map columns' own shifts: the scratch row
    ``buf`` holds (:func:`stage_row`), per frame column (lane ``l`` is frame column ``f = l % F``,
    map column ``q_c0 - (K - 1) + PAD + f``; the taps of the kept lanes stay inside the frame), the
    vertically adjoined ``2 d/dE[x'^2]``, ``d/dE[x'y']``, the means' partials of x and y (with the
    rows' shift corrections, :func:`push_moved`) and the row's shift there. Gradient column
    ``q = q_c0 + f`` (pixel ``xq``, ``yq``) gathers, per tap, its source column's terms
    (:func:`_moved_terms`: the pixel's difference against that column's shift, exact zeros in a
    flat row), under "reflect" also through its mirror images (only in ``EDGE`` programs: an
    interior strip's gradient columns lie more than ``K // 2`` from either border). ``PAIRED``: the
    row staged so (:func:`stage_row`). Returns both gradients (0 where not needed)."""
    ar = tl.arange(0, BW)
    w = words(buf + ar, BW)
    one = buf + 4 * BW + ar  # the shifts
    g1 = tl.zeros([BW], dtype=tl.float32)
    g2 = tl.zeros([BW], dtype=tl.float32)
    for a in tl.static_range(K):
        t1, t2 = _staged_terms(w + (K - 1 - a), one + (K - 1 - a), xq, yq, None, NEED1, NEED2, BW, PAIRED)
        if REFLECT and EDGE:
            q = q_c0 + f
            for side in tl.static_range(2):
                if side == 0:
                    idx = (K - 1 - a) - 2 * q_c0 - f
                    ok = (q >= 1) & (q <= PAD) & (idx >= 0) & (idx < F)
                else:
                    idx = (K - 1 - a) + 2 * (W - 1) - 2 * q_c0 - f
                    ok = (q >= W - 1 - PAD) & (q <= W - 2) & (idx >= 0) & (idx < F)
                # the frame's column idx: lane l's frame starts at column l - f
                m1, m2 = _staged_terms(w - f + idx, one - f + idx, xq, yq, ok, NEED1, NEED2, BW, PAIRED)
                t1 += m1
                t2 += m2
        g1 += wt[a] * t1
        g2 += wt[a] * t2
    return g1, g2


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
