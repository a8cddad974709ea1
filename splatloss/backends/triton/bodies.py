"""Program-level pieces shared by the forward and backward kernels, column and ring bodies alike:
which lanes a program holds, whether it may read without masks, and the epilogues (the partials'
scratch row, the gradient store, the per-program sums)."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["interior", "l1_sign_term", "lanes", "scale_of", "store_grad", "store_sums"]


@triton.jit
def lanes(pid, BC, C, n_chunks, n_strips, F: tl.constexpr, BW: tl.constexpr):
    """Program -> (lane group, row chunk, column strip); per lane: frame column, (b, c), validity."""
    strip = pid % n_strips
    rest = pid // n_strips
    chunk = rest % n_chunks
    group = rest // n_chunks
    ar = tl.arange(0, BW)
    f = ar % F
    bc = group * (BW // F) + ar // F
    lane_ok = bc < BC
    b = (bc // C).to(tl.int64)
    ch = (bc % C).to(tl.int64)
    return group, chunk, strip, f, bc, lane_ok, b, ch


@triton.jit
def interior(c_first, W, K: tl.constexpr, F: tl.constexpr, BW: tl.constexpr):
    """Whether a program's rows can be read without masks: one channel per program (every lane
    valid) and every tap of every lane inside the row (``c_first``: the input column of lane 0's
    first tap). A scalar: the program takes the unmasked horizontal pass (``hmoments``) or the
    masked one, the same for every row."""
    if F == BW:
        res = (c_first >= 0) & (c_first + F + K - 2 < W)
    else:
        res = False  # several channels per program: always the masked pass
    return res


#: Size arguments compiled as plain integers: Triton would otherwise specialise each that equals 1 or


@triton.jit
def l1_sign_term(xq, yq, l1, out, acc_l, wq, HAS_L1: tl.constexpr, WRITE_SUMS: tl.constexpr):
    """The fused loss's L1 term of one gradient row, ``l1 * sign(x - y)`` (0 without ``HAS_L1``),
    and ``acc_l`` plus, with ``WRITE_SUMS``, this row's ``|x - y|`` (the loss's value), weighted by
    ``wq`` (the mask at the pixels; None: unweighted)."""
    if HAS_L1:
        dl = xq - yq
        l1_term = l1 * (tl.where(dl > 0, 1.0, 0.0) - tl.where(dl < 0, 1.0, 0.0))
        if WRITE_SUMS:
            if wq is None:
                acc_l += tl.where(out, tl.abs(dl), 0.0)
            else:
                acc_l += tl.where(out, wq * tl.abs(dl), 0.0)
    else:
        l1_term = 0.0
    return l1_term, acc_l


@triton.jit
def store_grad(ptr, o_offs, out, g, own, other, g_sq, g_xy, l1_term, SIGN: tl.constexpr, HAS_L1: tl.constexpr):
    """Finish and store one image's gradient row: ``g + 2 own' g_sq + other' g_xy`` (``g``: the
    adjoined partials of the image's own mean; ``g_sq`` / ``g_xy``: the adjoined E[x'^2] / E[x'y']
    partials, applied at the pixel itself; ``own`` / ``other``: the two images' shifted pixels),
    plus ``SIGN`` times the L1 term. One image at a time: the second image's adjoint is formed
    after the first gradient is stored, so that both are never live at once."""
    if g_sq is None:  # the adjoint applied the pixels' terms itself (:func:`.columns.hadjoint_moved`)
        gv = g
    else:
        gv = g + 2.0 * own * g_sq + other * g_xy
    if HAS_L1:
        if SIGN > 0:
            gv += l1_term
        else:
            gv -= l1_term
    tl.store(ptr + o_offs, gv.to(ptr.dtype.element_ty), mask=out)


@triton.jit
def store_sums(ptr, acc, BC, n_slots, STRIDE: tl.constexpr, F: tl.constexpr, BW: tl.constexpr, prog=None):
    """The sums epilogue: reduce a program's per-lane sums ``acc`` [BW] to one per channel it holds
    and store them at ``ptr + STRIDE * (bc * n_slots + slot)``, where ``n_slots`` programs cover
    one channel group and ``slot`` is this program's place among them (from its id again, so
    that its group, chunk and strip need not stay live). Torch adds the ``n_slots`` values in a
    fixed order: no atomics, bitwise reproducible. ``prog``: the program's place in its launch
    (default: its id; a launch of several problems passes its place among its problem's)."""
    G: tl.constexpr = BW // F
    if prog is None:
        prog = tl.program_id(0)
    gbc = (prog // n_slots) * G + tl.arange(0, G)
    offs = STRIDE * (gbc.to(tl.int64) * n_slots + prog % n_slots)
    tl.store(ptr + offs, tl.sum(tl.reshape(acc, [G, F]), axis=1), mask=gbc < BC)


@triton.jit
def scale_of(
    pid, BC, H1, W1, ROWS, DROWS, DCOLS, NS: tl.constexpr, COLS: tl.constexpr, G: tl.constexpr, SUMS: tl.constexpr
):
    """Program ``pid`` of a launch over MS-SSIM's coarser scales (their pairs one after the other,
    each contiguous ``(B, C, H_s, W_s)``, each side TF's ceil half of the scale's before, ``H1 x
    W1`` the first): its scale, that scale's ``H, W``, its first program ``start``, the element
    offset of its pair (and gradients) and of its partial sums (``SUMS`` per channel and program),
    its row chunks and column strips. A scale's programs: ``ceil(BC / G)`` channel groups x chunks
    of ``ROWS`` of its ``H + DROWS`` rows x strips of ``COLS`` of its ``W + DCOLS`` columns."""
    n_groups = (BC + G - 1) // G
    h = H1
    w = W1
    first = pid * 0
    off = first.to(tl.int64)
    soff = off
    scale, H, W, start, o, so, n_chunks, n_strips = first, h, w, first, off, off, first, first
    for s in tl.static_range(NS):
        n_st = (w + DCOLS + COLS - 1) // COLS
        n_ck = (h + DROWS + ROWS - 1) // ROWS
        take = pid >= first
        scale = tl.where(take, s, scale)
        H = tl.where(take, h, H)
        W = tl.where(take, w, W)
        start = tl.where(take, first, start)
        o = tl.where(take, off, o)
        so = tl.where(take, soff, so)
        n_chunks = tl.where(take, n_ck, n_chunks)
        n_strips = tl.where(take, n_st, n_strips)
        first += n_groups * n_ck * n_st
        off += BC.to(tl.int64) * h.to(tl.int64) * w
        soff += SUMS * BC.to(tl.int64) * (n_ck * n_st)
        h = (h + 1) // 2
        w = (w + 1) // 2
    return scale, H, W, start, o, so, n_chunks, n_strips
