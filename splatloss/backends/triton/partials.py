"""Means of the kernels' per-program partial sums, several reductions in one launch.

The SSIM kernels write one partial sum per program and (image, channel) instead of adding into
one number with atomics (whose order, and so whose rounding, would change from run to run). What
is left is a short fixed-order sum per (image, channel) and a division by the map's size. In torch
that is a reduction and a division per buffer: for MS-SSIM at five scales eleven launches of a
few microseconds each (and a stack), about as long on a GPU as its 2x2 pyramid. Here one launch
takes up to :data:`MAX_SEGMENTS` buffers ("segments": a scale each) and writes their means where
the caller wants them, e.g. straight into MS-SSIM's ``[B, C, M]`` terms.

A segment ``k`` holds ``S_k`` partial sums per (image, channel) row, ``WIDTH`` values each (the
first is summed), rows one after the other: ``BC * S_k * WIDTH`` values, the segments one after
the other in one buffer. The program of row ``bc`` and segment ``k`` sums its ``S_k`` values in a
fixed order (a block of lanes, then the block's sum), so the result does not change from run to
run, and divides by ``N_k`` with IEEE rounding.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

from .launch import device_guard, launch_kernel, launch_options, next_power_of_2

__all__ = ["means", "dssim_l1_loss", "masked_weights", "masked_means", "masked_dssim_l1_loss", "MAX_SEGMENTS"]

Tensor = torch.Tensor

#: Segments one launch takes: MS-SSIM's default five scales.
MAX_SEGMENTS = 5

#: Sizes compiled as plain integers (no variant per shape; see launch.SIZES).
_SIZES = ("BC", "S0", "S1", "S2", "S3", "S4", "OUT_ROW", "OUT_COL")


@triton.jit(do_not_specialize=_SIZES)
def _means_kernel(
    a_ptr, b_ptr, out_ptr, BC, S0, S1, S2, S3, S4, N0, N1, N2, N3, N4, OUT_ROW, OUT_COL,
    NSEG: tl.constexpr, WIDTH: tl.constexpr, LAST_B: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    bc = tl.program_id(0)
    k = tl.program_id(1)
    S = tl.where(k == 0, S0, tl.where(k == 1, S1, tl.where(k == 2, S2, tl.where(k == 3, S3, S4))))
    N = tl.where(k == 0, N0, tl.where(k == 1, N1, tl.where(k == 2, N2, tl.where(k == 3, N3, N4))))
    before = tl.where(k > 0, S0, 0) + tl.where(k > 1, S1, 0) + tl.where(k > 2, S2, 0) + tl.where(k > 3, S3, 0)
    start = (before.to(tl.int64) * BC + bc.to(tl.int64) * S) * WIDTH
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s0 in range(0, S, BLOCK):
        i = s0 + tl.arange(0, BLOCK)
        at = start + i.to(tl.int64) * WIDTH
        live = i < S
        if LAST_B:  # the last segment lies at the same place in the second buffer
            acc += tl.load(a_ptr + at, mask=live & (k != NSEG - 1), other=0.0)
            acc += tl.load(b_ptr + at, mask=live & (k == NSEG - 1), other=0.0)
        else:
            acc += tl.load(a_ptr + at, mask=live, other=0.0)
    total = tl.sum(acc, axis=0)
    tl.store(out_ptr + bc.to(tl.int64) * OUT_ROW + k.to(tl.int64) * OUT_COL, tl.math.div_rn(total, N))


def means(
    buf: Tensor,
    BC: int,
    slots: Sequence[int],
    sizes: Sequence[int],
    out: Tensor,
    width: int = 1,
    last: Optional[Tensor] = None,
) -> Tensor:
    """``out[bc, k] = sum(partials of row bc in segment k) / sizes[k]`` for the segments of ``buf``
    (float32, contiguous): segment ``k`` has ``slots[k]`` partial sums of ``width`` values per row
    (the first one summed), the segments one after the other. ``last``: a second buffer of
    ``buf``'s layout from which the last segment is read instead. ``out``: float32, any
    ``(BC, len(slots))`` view (e.g. ``terms.view(B * C, M)[:, 1:]``). One launch per
    :data:`MAX_SEGMENTS` segments. Returns ``out``."""
    n = len(slots)
    if not (n == len(sizes) == out.shape[1]) or out.shape[0] != BC:
        raise ValueError(f"means: {n} segments, {len(sizes)} sizes, out of shape {tuple(out.shape)} for {BC} rows")
    row, col = out.stride()
    buf = buf.reshape(-1)  # a view: the buffers are contiguous
    last = last.reshape(-1) if last is not None else None
    at = 0
    for k0 in range(0, n, MAX_SEGMENTS):
        seg = list(slots[k0 : k0 + MAX_SEGMENTS])
        div = [float(s) for s in sizes[k0 : k0 + MAX_SEGMENTS]]
        nseg = len(seg)
        use_last = last is not None and k0 + nseg == n
        longest = max(seg)
        block = max(16, min(1024, next_power_of_2(longest)))
        a = buf[at:]
        with device_guard(buf):
            launch_kernel(_means_kernel, (BC, nseg),
                a, last[at:] if use_last else a, out[:, k0:], BC, *(seg + [0] * (MAX_SEGMENTS - nseg)),
                *(div + [1.0] * (MAX_SEGMENTS - nseg)), row, col, NSEG=nseg, WIDTH=width, LAST_B=use_last,
                BLOCK=block, **launch_options(1 if block <= 128 else 4),
            )  # fmt: skip
        at += BC * width * sum(seg)
    return out


@triton.jit
def _image_loss(
    s_ptr, l1_ptr, b, C, P, lam, n_map, n_img, KIND: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr
):
    # image b: its channels' partial sums of SSIM (and |x - y|), P per channel, WIDTH apart
    acc_s = tl.zeros([BLOCK], dtype=tl.float32)
    acc_l1 = tl.zeros([BLOCK], dtype=tl.float32)
    for c in range(0, C):
        row = (b * C + c) * P
        for s0 in range(0, P, BLOCK):
            i = s0 + tl.arange(0, BLOCK)
            at = (row + i) * WIDTH
            acc_s += tl.load(s_ptr + at, mask=i < P, other=0.0)
            if KIND == 0:
                acc_l1 += tl.load(l1_ptr + at, mask=i < P, other=0.0)
    s = tl.math.div_rn(tl.sum(acc_s, axis=0), n_map)
    l1 = tl.sum(acc_l1, axis=0)
    if KIND == 0:  # the 3DGS loss, and its two terms as they enter it
        return tl.math.div_rn(l1 * (1.0 - lam), n_img) + lam * (1.0 - s), tl.math.div_rn(l1, n_img), 1.0 - s
    elif KIND == 1:  # SSIM
        return s, l1, s
    else:  # D-SSIM
        return 1.0 - s, l1, s


@triton.jit(do_not_specialize=("B", "C", "P"))
def _dssim_l1_kernel(
    s_ptr, l1_ptr, out_ptr, t_ptr, B, C, P, lam, n_map, n_img,
    KIND: tl.constexpr, MEAN: tl.constexpr, TERMS: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    if MEAN:  # one program: the batch's mean as one image of B * C rows (n_map, n_img: the batch's)
        first = tl.program_id(0).to(tl.int64)  # 0, as an int64 tensor
        loss, _, _ = _image_loss(s_ptr, l1_ptr, first, B * C, P, lam, n_map, n_img, KIND, WIDTH, BLOCK)
        tl.store(out_ptr, loss)
    else:  # a program per image
        b = tl.program_id(0).to(tl.int64)
        loss, l1, d = _image_loss(s_ptr, l1_ptr, b, C, P, lam, n_map, n_img, KIND, WIDTH, BLOCK)
        tl.store(out_ptr + b, loss)
        if TERMS:  # the 3DGS loss's L1 and D-SSIM terms
            tl.store(t_ptr + b, l1)
            tl.store(t_ptr + B + b, d)


#: The losses :func:`dssim_l1_loss` forms from the partial sums: the 3DGS loss, SSIM, D-SSIM.
LOSS_KINDS = {"dssim_l1": 0, "ssim": 1, "dssim": 2}


def dssim_l1_loss(
    s: Tensor, l1: Optional[Tensor], B: int, C: int, lam: float, n_map: int, n_img: int, width: int = 1,
    mean: bool = False, kind: str = "dssim_l1", terms: Optional[Tensor] = None,
) -> Tensor:  # fmt: skip
    """The 3DGS loss per image ``[B]``, ``(1 - lam) L1 + lam (1 - SSIM)``, from the kernels'
    partial sums: ``s`` of the SSIM map and ``l1`` of ``|x - y|``, ``P`` per (image, channel) row,
    ``width`` values apart (``s`` and ``l1`` may be one buffer's two interleaved components);
    ``n_map``, ``n_img``: the map's and the image's pixel-channels per image. ``kind`` "ssim" or
    "dssim": the image's SSIM or ``1 - SSIM`` instead (``l1`` and ``lam`` unused). ``mean``: their
    mean over the batch instead, a 0-dim tensor (one program adds the images in order). ``terms``
    (the 3DGS loss per image): a float32 ``[2, B]`` tensor to write the losses' L1 and D-SSIM terms
    into, as they enter them. One launch."""
    P = s.numel() // (B * C * width)
    out = torch.empty(() if mean else (B,), dtype=torch.float32, device=s.device)
    block = max(16, min(1024, next_power_of_2(P)))
    if mean:  # the batch's pixel-channels: its mean is the loss of the batch as one image
        n_map, n_img = n_map * B, n_img * B
    with device_guard(s):
        launch_kernel(_dssim_l1_kernel, (1 if mean else B,),
            s, l1 if l1 is not None else s, out, terms if terms is not None else out, B, C, P, float(lam),
            float(n_map), float(n_img), KIND=LOSS_KINDS[kind], MEAN=mean, TERMS=terms is not None, WIDTH=width,
            BLOCK=block, **launch_options(1 if block <= 128 else 4),
        )  # fmt: skip
    return out


# ------------------------------------------------------------------------------------------------
# Under a mask: the weights before the kernel, the means or the loss after it
# ------------------------------------------------------------------------------------------------
#
# A masked mean is ``1 - deficit / z`` (``z``: the sum of the mask at the map positions' centres,
# masked_ssim.py), the constant 1 for a channel whose ``z`` is 0; the 3DGS loss weighs the masked
# ``|x - y|`` by ``(1 - lam) / sum M`` over the image's channels. In torch ops that was about ten
# launches before the kernel (the inverses, their scales) and as many after it (the sums of the
# partials, the means, the loss): on a GPU longer than the small launches' work, and host time on
# every call. Here one launch before and one after. ``z`` and the L1 term's plane sums are read
# through strides, so a mask shared by the channels or the images is summed once.


@triton.jit
def _inverse(z):
    """``1 / z`` with IEEE rounding where ``z > 0``, else 0 (an empty channel or image has no weight)."""
    return tl.where(z > 0, tl.math.div_rn(1.0, tl.where(z > 0, z, 1.0)), 0.0)


@triton.jit(do_not_specialize=("B", "C", "sz_b", "sz_c", "sl_b", "sl_c"))
def _masked_weights_kernel(
    z_ptr, zl_ptr, out_ptr, B, C, sz_b, sz_c, sl_b, sl_c, scale_s, scale_l1,
    HAS_L1: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK_C)
    live = c < C
    z = tl.load(z_ptr + b * sz_b + c * sz_c, mask=live, other=0.0)
    inv = _inverse(z)
    tl.store(out_ptr + b * C + c, scale_s * inv, mask=live)
    if HAS_L1:
        den = tl.sum(tl.load(zl_ptr + b * sl_b + c * sl_c, mask=live, other=0.0), axis=0)
        w = _inverse(den)
        tl.store(out_ptr + B * C + b * C + c, scale_l1 * w + tl.zeros([BLOCK_C], dtype=tl.float32), mask=live)


def masked_weights(z: Tensor, scale_s: float, zl: Optional[Tensor] = None, scale_l1: float = 0.0) -> Tensor:
    """``[1 or 2, B, C]`` float32: ``scale_s / z`` (0 where ``z`` is 0) and, with ``zl``, the L1
    term's ``scale_l1 / sum_c zl[b, c]`` (0 for an empty image), broadcast over the channels.
    ``z``, ``zl``: ``[B, C]`` float32, any strides (a broadcast mask's sums: stride 0). One launch."""
    B, C = z.shape
    out = torch.empty((2 if zl is not None else 1, B, C), dtype=torch.float32, device=z.device)
    zl_ = zl if zl is not None else z
    with device_guard(z):
        launch_kernel(_masked_weights_kernel, (B,),
            z, zl_, out, B, C, *z.stride(), *zl_.stride(), float(scale_s), float(scale_l1),
            HAS_L1=zl is not None, BLOCK_C=max(2, next_power_of_2(C)), **launch_options(1),
        )  # fmt: skip
    return out


@triton.jit
def _masked_image(
    s_ptr, l1_ptr, z_ptr, zl_ptr, out_ptr, b, C, P, sz_b, sz_c, sl_b, sl_c, lam,
    LOSS: tl.constexpr, HAS_L1: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    # image b: its channels' partial sums of the centre-weighted deficit (and of the masked |x - y|),
    # P per channel, WIDTH apart; the means stored, or the loss returned (LOSS)
    sum_means = 0.0
    sum_l1 = 0.0
    den = 0.0
    for c in range(0, C):
        row = (b * C + c) * P
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        acc_l1 = tl.zeros([BLOCK], dtype=tl.float32)
        for s0 in range(0, P, BLOCK):
            i = s0 + tl.arange(0, BLOCK)
            at = (row + i) * WIDTH
            acc += tl.load(s_ptr + at, mask=i < P, other=0.0)
            if HAS_L1:
                acc_l1 += tl.load(l1_ptr + at, mask=i < P, other=0.0)
        z = tl.load(z_ptr + b * sz_b + c * sz_c)
        inv = _inverse(z)
        v = 1.0 - tl.sum(acc, axis=0) * inv
        v = tl.where(v < -1.0, -1.0, tl.where(v > 1.0, 1.0, v))  # NaN stays NaN
        mean = tl.where(z > 0, v, 1.0)
        if LOSS:
            sum_means += mean
            if HAS_L1:
                sum_l1 += tl.sum(acc_l1, axis=0)
                den += tl.load(zl_ptr + b * sl_b + c * sl_c)
        else:
            tl.store(out_ptr + b * C + c, mean)
    d = 1.0 - tl.math.div_rn(sum_means, C.to(tl.float32))
    loss = lam * d
    l1 = 0.0
    if HAS_L1:
        w = _inverse(den)
        loss += (1.0 - lam) * w * sum_l1
        l1 = w * sum_l1
    return loss, l1, d


@triton.jit(do_not_specialize=("B", "C", "P", "sz_b", "sz_c", "sl_b", "sl_c"))
def _masked_reduce_kernel(
    s_ptr, l1_ptr, z_ptr, zl_ptr, out_ptr, t_ptr, B, C, P, sz_b, sz_c, sl_b, sl_c, lam,
    LOSS: tl.constexpr, MEAN: tl.constexpr, TERMS: tl.constexpr, HAS_L1: tl.constexpr, WIDTH: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    if MEAN:  # one program: the batch's mean loss, the (image, channel) rows in order, an image's
        # loss formed at its last channel as the per-image programs form it (one loop of rows, as theirs)
        total = 0.0
        sum_means = 0.0
        sum_l1 = 0.0
        den = 0.0
        first = tl.program_id(0).to(tl.int64)  # 0, as an int64 tensor
        for r in range(0, B * C):
            b = first + r // C
            c = r % C
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            acc_l1 = tl.zeros([BLOCK], dtype=tl.float32)
            for s0 in range(0, P, BLOCK):
                i = s0 + tl.arange(0, BLOCK)
                at = ((first + r) * P + i) * WIDTH
                acc += tl.load(s_ptr + at, mask=i < P, other=0.0)
                if HAS_L1:
                    acc_l1 += tl.load(l1_ptr + at, mask=i < P, other=0.0)
            z = tl.load(z_ptr + b * sz_b + c * sz_c)
            v = 1.0 - tl.sum(acc, axis=0) * _inverse(z)
            v = tl.where(v < -1.0, -1.0, tl.where(v > 1.0, 1.0, v))  # NaN stays NaN
            sum_means += tl.where(z > 0, v, 1.0)
            loss = lam * (1.0 - tl.math.div_rn(sum_means, C.to(tl.float32)))
            if HAS_L1:
                sum_l1 += tl.sum(acc_l1, axis=0)
                den += tl.load(zl_ptr + b * sl_b + c * sl_c)
                loss += (1.0 - lam) * _inverse(den) * sum_l1
            last = c == C - 1
            total += tl.where(last, loss, 0.0)
            sum_means = tl.where(last, 0.0, sum_means)
            sum_l1 = tl.where(last, 0.0, sum_l1)
            den = tl.where(last, 0.0, den)
        tl.store(out_ptr, tl.math.div_rn(total, B.to(tl.float32)))
    else:
        b = tl.program_id(0).to(tl.int64)
        loss, l1, d = _masked_image(
            s_ptr, l1_ptr, z_ptr, zl_ptr, out_ptr, b, C, P, sz_b, sz_c, sl_b, sl_c, lam, LOSS, HAS_L1, WIDTH, BLOCK
        )
        if LOSS:
            tl.store(out_ptr + b, loss)
            if TERMS:  # the loss's L1 and D-SSIM terms
                tl.store(t_ptr + b, l1)
                tl.store(t_ptr + B + b, d)


def _masked_reduce(s, l1, z, zl, B, C, lam, width, loss, mean=False, terms=None):
    P = s.numel() // (B * C * width)
    out = torch.empty(() if mean else (B,) if loss else (B, C), dtype=torch.float32, device=s.device)
    block = max(16, min(1024, next_power_of_2(P)))
    zl_ = zl if zl is not None else z
    with device_guard(s):
        launch_kernel(_masked_reduce_kernel, (1 if mean else B,),
            s, l1 if l1 is not None else s, z, zl_, out, terms if terms is not None else out, B, C, P, *z.stride(),
            *zl_.stride(), float(lam), LOSS=loss, MEAN=mean, TERMS=terms is not None, HAS_L1=l1 is not None,
            WIDTH=width, BLOCK=block,
            **launch_options(1 if block <= 128 else 4),
        )  # fmt: skip
    return out


def masked_means(s: Tensor, z: Tensor, width: int = 1) -> Tensor:
    """``[B, C]`` masked means ``1 - deficit / z`` within [-1, 1] (the constant 1 where ``z`` is 0;
    exactly 1 where every value is 1, where a sum of values over ``z`` would round differently)
    from the kernels' partial sums of the centre-weighted deficit ``1 - value``: ``P`` per
    (image, channel) row, ``width`` values apart. ``z``: ``[B, C]`` float32, any strides. One launch."""
    B, C = z.shape
    return _masked_reduce(s, None, z, None, B, C, 0.0, width, loss=False)


def masked_dssim_l1_loss(
    s: Tensor, l1: Optional[Tensor], z: Tensor, zl: Optional[Tensor], lam: float, width: int = 1, mean: bool = False,
    terms: Optional[Tensor] = None,
) -> Tensor:  # fmt: skip
    """The masked 3DGS loss per image ``[B]``, ``(1 - lam) sum M |x - y| / sum M + lam (1 - masked
    SSIM)``, from the partial sums of the deficit ``s`` and of the masked ``|x - y|`` ``l1`` (as
    :func:`dssim_l1_loss`; ``l1`` None: the SSIM part alone, ``lam (1 - masked SSIM)``), ``z`` the
    centre weights and ``zl`` the mask's plane sums (``[B, C]``, any strides; ``sum M`` is their sum
    over the channels). ``mean``: the loss's mean over the batch instead, a 0-dim tensor (one
    program adds the images in order). ``terms``: a float32 ``[2, B]`` tensor to write the losses' L1
    terms (0 without ``l1``) and D-SSIM terms into, as they enter them. One launch."""
    B, C = z.shape
    if (l1 is None) != (zl is None):
        raise ValueError("masked_dssim_l1_loss: give l1 and zl together, or neither")
    return _masked_reduce(s, l1, z, zl, B, C, lam, width, loss=True, mean=mean, terms=terms)
