"""Ring bodies, for windows wider than ``launch.COLUMN_TAPS`` (whose pending sums would not fit
in registers): the horizontal pass is one ``[KP, BW]`` load of the K taps, its result goes into a
ring of the last ``KP >= K`` rows in the per-program scratch, and the vertical pass is a weighted
sum over the ring (:func:`ring_vsum`). The backward's adjoint is the column bodies' (see
:mod:`.columns`), with ``[KP, BW]`` tiles instead of unrolled taps."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["row_moments", "hadjoint", "hadjoint_moved", "ring_vsum", "window_taus"]


@triton.jit
def row_moments(
    x_ptr,
    y_ptr,
    x_base,
    y_base,
    r,
    cols0,
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
    K: tl.constexpr,
    KP: tl.constexpr,
    REFLECT: tl.constexpr,
    L1: tl.constexpr,
):
    """Horizontal pass of padded input row ``r`` around the row's own shift ``s`` [BW] (``(x + y) /
    2`` at each lane's centre tap ``K // 2``; 0 where that is not finite or zero-padded, as in
    :func:`.columns.hmoments`): window sums of x', y', x'^2, y'^2, x'y' (``x' = x - s``; a
    zero-padded sample is ``x = 0``; taps past K load nothing, so a NaN pixel only reaches its
    true footprint) for the lanes whose windows start at padded columns ``cols0`` [BW] (bases
    ``x_base`` / ``y_base`` [BW]). Returns them, the L1 sum and ``s``.

    The K taps of every lane are one ``[KP, BW]`` load (tap ``a`` in row ``a``, rows >= K masked):
    each thread reads its own lanes' taps (L1 hits after the first) and reduces them in registers;
    the centre tap is loaded once more as a [BW] row for the shift. With ``L1``, also returns the
    sum of ``|x - y|`` over the taps ``own_lo <= a < own_hi`` of each lane (the input pixels this
    lane owns, so that every pixel is counted once), else 0."""
    taps = tl.arange(0, KP)
    w = tl.load(w_ptr + taps, mask=taps < K, other=0.0)[:, None]
    rr = r
    c = cols0[None, :] + taps[:, None]  # [KP, BW]
    cc = cols0 + K // 2  # the centre tap [BW]
    if REFLECT:  # padded position i holds input -i, or 2 (n - 1) - i past the end (no edge repeat)
        rr = tl.where(rr < 0, -rr, rr)
        rr = tl.where(rr >= H, 2 * (H - 1) - rr, rr)
        c = tl.where(c < 0, -c, c)
        c = tl.where(c >= W, 2 * (W - 1) - c, c)
        cc = tl.where(cc < 0, -cc, cc)
        cc = tl.where(cc >= W, 2 * (W - 1) - cc, cc)
    row_ok = (rr >= 0) & (rr < H)
    ok = row_ok & (taps < K)[:, None] & (c >= 0) & (c < W) & lane_ok[None, :]
    ok_c = row_ok & (cc >= 0) & (cc < W) & lane_ok
    c64 = c.to(tl.int64)
    r64 = rr.to(tl.int64)
    x_row = x_base + r64 * sx_h
    y_row = y_base + r64 * sy_h
    xc = tl.load(x_ptr + x_row + cc.to(tl.int64) * sx_w, mask=ok_c, other=0.0).to(tl.float32)
    yc = tl.load(y_ptr + y_row + cc.to(tl.int64) * sy_w, mask=ok_c, other=0.0).to(tl.float32)
    sh = 0.5 * xc + 0.5 * yc
    sh = tl.where(sh - sh == 0.0, sh, 0.0)  # a NaN / Inf centre: shift 0 (the row's sums carry it)
    xv = tl.load(x_ptr + x_row[None, :] + c64 * sx_w, mask=ok, other=0.0).to(tl.float32) - sh[None, :]
    yv = tl.load(y_ptr + y_row[None, :] + c64 * sy_w, mask=ok, other=0.0).to(tl.float32) - sh[None, :]
    wx = w * xv
    wy = w * yv
    m1 = tl.sum(wx, axis=0)
    m2 = tl.sum(wy, axis=0)
    e11 = tl.sum(wx * xv, axis=0)
    e22 = tl.sum(wy * yv, axis=0)
    e12 = tl.sum(wx * yv, axis=0)
    if L1:
        own = ok & (taps[:, None] >= own_lo[None, :]) & (taps[:, None] < own_hi[None, :])
        l1 = tl.sum(tl.where(own, tl.abs(xv - yv), 0.0), axis=0)
    else:
        l1 = 0.0
    return m1, m2, e11, e22, e12, l1, sh


@triton.jit
def hadjoint(
    buf,
    w_ptr,
    q_c0,
    W,
    f,
    F: tl.constexpr,
    BW: tl.constexpr,
    K: tl.constexpr,
    KP: tl.constexpr,
    PAD: tl.constexpr,
    REFLECT: tl.constexpr,
):
    """Horizontal adjoint of one scratch row ``buf`` [BW] of partials. Lane ``l`` is frame column
    ``f = l % F``, holding map column ``q_c0 - (K - 1) + PAD + f``; gradient column ``q = q_c0 + f``
    gathers ``w[a] * frame[f + K - 1 - a]``, plus, under "reflect", the same taps through its
    mirror images (padded columns ``-q`` and ``2 (W - 1) - q``)."""
    taps = tl.arange(0, KP)
    w = tl.load(w_ptr + taps, mask=taps < K, other=0.0)[:, None]
    frame = buf + (tl.arange(0, BW) - f)[None, :]  # start of each lane's frame
    shift = (K - 1) - taps[:, None]  # [KP, 1]
    tap_ok = (taps < K)[:, None]
    t = f[None, :]
    idx = t + shift  # [KP, BW]
    v = tl.load(frame + idx, mask=tap_ok & (idx < F), other=0.0)
    if REFLECT:
        q = q_c0 + t
        idx_l = shift - 2 * q_c0 - t
        ok_l = tap_ok & (q >= 1) & (q <= PAD) & (idx_l >= 0) & (idx_l < F)
        v += tl.load(frame + idx_l, mask=ok_l, other=0.0)
        idx_r = shift + 2 * (W - 1) - 2 * q_c0 - t
        ok_r = tap_ok & (q >= W - 1 - PAD) & (q <= W - 2) & (idx_r >= 0) & (idx_r < F)
        v += tl.load(frame + idx_r, mask=ok_r, other=0.0)
    return tl.sum(w * v, axis=0)


@triton.jit
def _moved_tile(src, mask, xq, yq, BW: tl.constexpr, NEED1: tl.constexpr, NEED2: tl.constexpr):
    """Source columns ``src`` [KP, BW] of a staged row (:func:`hadjoint_moved`): each one's terms
    of the two gradients at the lanes' pixels ``(xq, yq)`` [1, BW], as in
    :func:`.columns.hadjoint_moved`."""
    v_sq2 = tl.load(src, mask=mask, other=0.0)
    v_xy = tl.load(src + BW, mask=mask, other=0.0)
    sh = tl.load(src + 4 * BW, mask=mask, other=0.0)
    dx = xq - sh
    dy = yq - sh
    if NEED1:
        t1 = tl.load(src + 2 * BW, mask=mask, other=0.0) + v_sq2 * dx + v_xy * dy
    else:
        t1 = dx * 0.0
    if NEED2:
        t2 = tl.load(src + 3 * BW, mask=mask, other=0.0) + v_sq2 * dy + v_xy * dx
    else:
        t2 = dy * 0.0
    return t1, t2


@triton.jit
def hadjoint_moved(
    buf,
    w_ptr,
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
    KP: tl.constexpr,
    PAD: tl.constexpr,
    REFLECT: tl.constexpr,
):
    """:func:`.columns.hadjoint_moved` with ``[KP, BW]`` tiles: the staged row ``buf`` holds per
    frame column ``2 d/dE[x'^2]``, ``d/dE[x'y']``, the means' partials of x and y and the row's
    shift, ``BW`` apart; gradient column ``q = q_c0 + f`` gathers each tap's terms against its
    source column's shift (and under "reflect" through its mirror images)."""
    taps = tl.arange(0, KP)
    w = tl.load(w_ptr + taps, mask=taps < K, other=0.0)[:, None]
    frame = buf + (tl.arange(0, BW) - f)[None, :]  # start of each lane's frame
    back = (K - 1) - taps[:, None]  # [KP, 1]
    tap_ok = (taps < K)[:, None]
    t = f[None, :]
    xt = xq[None, :]
    yt = yq[None, :]
    idx = t + back  # [KP, BW]
    t1, t2 = _moved_tile(frame + idx, tap_ok & (idx < F), xt, yt, BW, NEED1, NEED2)
    g1 = tl.sum(w * t1, axis=0)
    g2 = tl.sum(w * t2, axis=0)
    if REFLECT:  # each mirror image reduced on its own: fewer tiles live at once
        q = q_c0 + t
        idx_l = back - 2 * q_c0 - t
        ok_l = tap_ok & (q >= 1) & (q <= PAD) & (idx_l >= 0) & (idx_l < F)
        m1, m2 = _moved_tile(frame + idx_l, ok_l, xt, yt, BW, NEED1, NEED2)
        g1 += tl.sum(w * m1, axis=0)
        g2 += tl.sum(w * m2, axis=0)
        idx_r = back + 2 * (W - 1) - 2 * q_c0 - t
        ok_r = tap_ok & (q >= W - 1 - PAD) & (q <= W - 2) & (idx_r >= 0) & (idx_r < F)
        m1, m2 = _moved_tile(frame + idx_r, ok_r, xt, yt, BW, NEED1, NEED2)
        g1 += tl.sum(w * m1, axis=0)
        g2 += tl.sum(w * m2, axis=0)
    return g1, g2


@triton.jit
def ring_vsum(ring, ring_offs, live, wv, tau, KP: tl.constexpr, BW: tl.constexpr):
    """Vertical pass over the 5 rings of moment rows (x', y', x'^2, y'^2, x'y' around each row's
    shift; ring ``j`` at ``ring + j * KP * BW``): each ring's live slots weighted by ``wv`` [KP, 1]
    and summed, every row moved to the window's shift by ``tau`` [KP, BW] (the row's shift minus the
    window's: ``x - S = x' + tau``, so ``x'^2`` becomes ``x'^2 + 2 tau x' + tau^2``; exact zeros
    where the shifts agree). Only the K newest rows are ``live``: 0 * NaN of an older row would be
    NaN."""
    h1 = tl.load(ring + ring_offs, mask=live, other=0.0)
    h2 = tl.load(ring + KP * BW + ring_offs, mask=live, other=0.0)
    u = h1 + tau
    v = h2 + tau
    mu1 = tl.sum(u * wv, axis=0)
    mu2 = tl.sum(v * wv, axis=0)
    h11 = tl.load(ring + 2 * KP * BW + ring_offs, mask=live, other=0.0)
    e11 = tl.sum((h11 + tau * (h1 + u)) * wv, axis=0)
    h22 = tl.load(ring + 3 * KP * BW + ring_offs, mask=live, other=0.0)
    e22 = tl.sum((h22 + tau * (h2 + v)) * wv, axis=0)
    h12 = tl.load(ring + 4 * KP * BW + ring_offs, mask=live, other=0.0)
    e12 = tl.sum((h12 + tau * (h1 + v)) * wv, axis=0)
    return mu1, mu2, e11, e22, e12


@triton.jit
def window_taus(sring, slots, i, live, KP: tl.constexpr, BW: tl.constexpr, K: tl.constexpr):
    """The shifts' ring (``sring`` [KP, BW] slots, row ``i`` in slot ``i % KP``): the window that
    ends at row ``i`` takes its centre row's shift ``S`` [BW] (``K // 2`` rows back); returns
    ``(tau, S)``, ``tau`` [KP, BW] each live row's shift minus ``S`` (0 elsewhere)."""
    ar = tl.arange(0, BW)
    centre = tl.load(sring + ((i - K // 2 + KP) % KP) * BW + ar)
    s_rows = tl.load(sring + slots[:, None] * BW + ar[None, :], mask=live, other=0.0)
    return tl.where(live, s_rows - centre[None, :], 0.0), centre
