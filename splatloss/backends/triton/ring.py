"""Ring bodies, for windows wider than ``launch.COLUMN_TAPS`` (whose pending sums would not fit
in registers): the horizontal pass is one ``[KP, BW]`` load of the K taps, its result goes into a
ring of the last ``KP >= K`` rows in the per-program scratch, and the vertical pass is a weighted
sum over the ring (:func:`ring_vsum`). The backward's adjoint is the column bodies' (see
:mod:`.columns`), with ``[KP, BW]`` tiles instead of unrolled taps."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["row_moments", "hadjoint", "ring_vsum"]


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
    shift,
    K: tl.constexpr,
    KP: tl.constexpr,
    REFLECT: tl.constexpr,
    L1: tl.constexpr,
    SCALAR_SHIFT: tl.constexpr,
):
    """Horizontal pass of padded input row ``r``: window sums of x', y', x'^2, y'^2, x'y'
    (``x' = x - shift``, ``shift`` from :func:`local_shift`: a scalar with ``SCALAR_SHIFT``, else
    [BW]; a zero-padded sample is ``x = 0``, i.e. ``x' = -shift``; taps past K load nothing, so a
    NaN pixel only reaches its true footprint) for the lanes whose windows start at padded columns
    ``cols0`` [BW] (bases ``x_base`` / ``y_base`` [BW]).

    The K taps of every lane are one ``[KP, BW]`` load (tap ``a`` in row ``a``, rows >= K masked):
    each thread reads its own lanes' taps (L1 hits after the first) and reduces them in registers.
    With ``L1``, also returns the sum of ``|x - y|`` over the taps ``own_lo <= a < own_hi`` of each
    lane (the input pixels this lane owns, so that every pixel is counted once), else 0."""
    taps = tl.arange(0, KP)
    w = tl.load(w_ptr + taps, mask=taps < K, other=0.0)[:, None]
    rr = r
    c = cols0[None, :] + taps[:, None]  # [KP, BW]
    if REFLECT:  # padded position i holds input -i, or 2 (n - 1) - i past the end (no edge repeat)
        rr = tl.where(rr < 0, -rr, rr)
        rr = tl.where(rr >= H, 2 * (H - 1) - rr, rr)
        c = tl.where(c < 0, -c, c)
        c = tl.where(c >= W, 2 * (W - 1) - c, c)
    ok = (rr >= 0) & (rr < H) & (taps < K)[:, None] & (c >= 0) & (c < W) & lane_ok[None, :]
    c64 = c.to(tl.int64)
    r64 = rr.to(tl.int64)
    if SCALAR_SHIFT:
        sh = shift
    else:
        sh = shift[None, :]
    xv = tl.load(x_ptr + (x_base + r64 * sx_h)[None, :] + c64 * sx_w, mask=ok, other=0.0).to(tl.float32) - sh
    yv = tl.load(y_ptr + (y_base + r64 * sy_h)[None, :] + c64 * sy_w, mask=ok, other=0.0).to(tl.float32) - sh
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
    return m1, m2, e11, e22, e12, l1


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
def ring_vsum(ring, ring_offs, live, wv, KP: tl.constexpr, BW: tl.constexpr):
    """Vertical pass over the 5 rings of moment rows (x', y', x'^2, y'^2, x'y'; ring ``j`` at
    ``ring + j * KP * BW``): each ring's live slots weighted by ``wv`` [KP, 1] and summed. Only
    the K newest rows are ``live``: 0 * NaN of an older row would be NaN."""
    mu1 = tl.sum(tl.load(ring + ring_offs, mask=live, other=0.0) * wv, axis=0)
    mu2 = tl.sum(tl.load(ring + KP * BW + ring_offs, mask=live, other=0.0) * wv, axis=0)
    e11 = tl.sum(tl.load(ring + 2 * KP * BW + ring_offs, mask=live, other=0.0) * wv, axis=0)
    e22 = tl.sum(tl.load(ring + 3 * KP * BW + ring_offs, mask=live, other=0.0) * wv, axis=0)
    e12 = tl.sum(tl.load(ring + 4 * KP * BW + ring_offs, mask=live, other=0.0) * wv, axis=0)
    return mu1, mu2, e11, e22, e12
