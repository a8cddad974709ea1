"""Pieces shared by the Triton ops: launch geometry, input checks, device functions.

How a program filters
---------------------
A program owns a strip of ``F`` map (or gradient) columns of one image channel -- or, when a whole
row fits in ``F``, ``G = BW // F`` channel rows side by side ("lanes": one column of one channel
per lane, ``BW`` lanes) -- and streams down ``ROWS`` rows of it. Per input row it does the
horizontal pass of the five statistics (x, y, x^2, y^2, xy) with one ``[KP, BW]`` load of the K taps
(exact fp32 products and sums), pushes the result into a ring of the last ``KP >= K`` rows, and
the vertical pass is a weighted sum over the ring. Both passes are K-tap 1-D filters: separable,
about 2 * 5 * K multiply-adds per pixel-channel for the moments.

The rings and the row of partial derivatives that the backward's horizontal adjoint must read at
shifted columns live in a per-program scratch area in global memory (a few tens of KB, written
and read back by the same CTA between barriers, so it stays in L1/L2): Triton has no shared-memory
API, register tensors cannot be shifted, and rings held in registers spilled at K = 11 (check
scripts/check_kernels.py).

The adjoint
-----------
The gradient at input pixel ``q`` gathers, through the window, the partial derivatives of every
map value that used ``q`` (DESIGN.md): ``g[q] = sum_p P[p] w[q - p + pad]`` over map positions
``p`` (``P`` is zero off the map), i.e. the partials convolved with the window, horizontally
(through the scratch row) then vertically (through a ring). With "reflect" padding a padded
sample is a copy of an input pixel, so ``q`` also gathers through its mirror images ``-q`` and
``2 (n - 1) - q`` (extra taps at the borders only).
"""

from __future__ import annotations

import contextlib
import os
from typing import Dict, NamedTuple, Optional

import torch
import triton
import triton.language as tl

#: Largest window the kernels accept. Tap / ring tiles are ``KP = next_pow2(K)`` rows deep; up to
#: 15 taps programs have 128 lanes, 17..31 taps 64 lanes (so a thread still holds 8 values of each
#: ``[KP, lanes]`` tile and nothing spills, scripts/check_kernels.py); 33+ taps would need 32-lane
#: programs, narrower than the backward's ``K - 1`` halo, so they are refused.
MAX_WINDOW = 31

_PADDING_CODE = {"valid": 0, "same": 1, "reflect": 2}


class Geometry(NamedTuple):
    """Launch geometry: ``bw`` lanes per program, frame width ``f`` (map columns per strip in the
    forward; gradient columns + ``K - 1`` halo in the backward), ``rows`` streamed per program,
    ring depth ``kp`` (next power of two >= window size), ``warps``."""

    bw: int
    f: int
    rows: int
    kp: int
    warps: int


#: Rows streamed per program on CUDA; the interpreter (one program at a time) uses wider and longer
#: programs, see :func:`geometry`. Tests set ``FORCE_CUDA_GEOMETRY`` to run the CUDA geometry in
#: the interpreter.
CUDA_ROWS = 128
FORCE_CUDA_GEOMETRY = False

#: Register ceiling passed to every launch (and to scripts/check_kernels.py). Without it ptxas
#: chose 128 registers plus a 4-byte spill for several backward variants at sm_80; with it they
#: take 150-255 registers and spill nothing (one 256-thread CTA per SM for the ring kernels).
MAXNREG = 255


def launch_options(num_warps: int, hip: Optional[bool] = None) -> dict:
    """Keyword options of a kernel launch: ``num_warps``, and the register ceiling only on NVIDIA
    (Triton's HIP backend rejects ``maxnreg``). ``hip`` defaults to whether torch was built for
    ROCm."""
    if hip is None:
        hip = torch.version.hip is not None
    return {"num_warps": num_warps} if hip else {"num_warps": num_warps, "maxnreg": MAXNREG}


def device_guard(t: torch.Tensor):
    """Context in which to launch on ``t``'s device: Triton launches on the current CUDA device and
    stream, not the tensor's, so a tensor on ``cuda:1`` needs ``torch.cuda.device(1)`` around the
    launch. A no-op for CPU tensors (the interpreter)."""
    if t.device.type == "cuda":
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()


def cuda_lanes(kp: int) -> int:
    """Lanes (columns) per program on CUDA: 128, or 64 for 32-deep tap tiles (K = 17..31)."""
    return 128 if kp <= 16 else 64


def cuda_warps(kp: int) -> int:
    """Warps per program: each thread holds ``KP * lanes / (32 * warps)`` values of every
    ``[KP, lanes]`` tap / ring tile, kept at <= 8 so that no kernel spills (check_kernels.py)."""
    return max(4, (kp * cuda_lanes(kp)) // (8 * 32))


def geometry(frame: int, rows: int, window_size: int, bc: int, device: torch.device) -> Geometry:
    """Geometry for rows of ``frame`` lanes of work (map width, or image width + K - 1 halo).

    On CUDA: 128 lanes (64 for windows of 17..31 taps), 128 rows per program; rows of at most
    half the lanes are packed several channels per program (MS-SSIM's coarse scales). In the
    interpreter programs run one after the other at a cost per operation, not per element: one
    program takes every row and column (up to 2048 lanes) of as many channels as fit.
    """
    kp = triton.next_power_of_2(window_size)
    need = triton.next_power_of_2(max(frame, 1))
    if device.type == "cuda" or FORCE_CUDA_GEOMETRY:
        lanes = cuda_lanes(kp)
        return Geometry(bw=lanes, f=min(lanes, need), rows=CUDA_ROWS, kp=kp, warps=cuda_warps(kp))
    f = min(need, 2048)
    bw = f * min(triton.next_power_of_2(bc), max(1, 2048 // f))
    return Geometry(bw=bw, f=f, rows=max(rows, 1), kp=kp, warps=4)


def check_inputs(img1: torch.Tensor, img2: torch.Tensor, cfg) -> None:
    """What only the Triton backend cannot do (functional has already validated the rest)."""
    if img1.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(
            "the triton backend computes in float32 and takes float32, float16 or bfloat16 images, "
            f"got {img1.dtype}; use backend='torch' or 'reference' for float64"
        )
    if img2.dtype != img1.dtype:
        raise TypeError(f"img1 and img2 must have the same dtype, got {img1.dtype} and {img2.dtype}")
    if img1.dim() != 4 or img2.shape != img1.shape:
        raise ValueError(
            f"the triton backend expects two (B, C, H, W) images of one shape, got "
            f"{tuple(img1.shape)} and {tuple(img2.shape)}"
        )
    if img1.device != img2.device:
        raise ValueError(f"img1 and img2 must be on one device, got {img1.device} and {img2.device}")
    if img1.device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(
            f"the triton backend needs CUDA tensors, got a tensor on {img1.device.type}; "
            "set TRITON_INTERPRET=1 (before importing triton) to run the kernels in the interpreter"
        )
    if cfg.window_size > MAX_WINDOW:
        raise ValueError(
            f"the triton backend supports window_size <= {MAX_WINDOW} (wider programs than its halo), "
            f"got {cfg.window_size}; use backend='torch' for larger windows"
        )
    if img1.shape[0] == 0 or img1.shape[1] == 0:
        raise ValueError(
            f"the triton backend needs at least one image and one channel, got shape {tuple(img1.shape)}; "
            "drop empty batches before the loss, or use backend='torch' (empty / NaN results)"
        )
    h, w = img1.shape[-2:]
    need = cfg.min_size()
    if h < need or w < need:
        raise ValueError(
            f"images must be at least {need}x{need} for window_size={cfg.window_size} and "
            f"padding={cfg.padding!r}, got {h}x{w}"
        )


class functorch_guard:
    """Turn torch's message for a ``torch.func.grad`` / ``jvp`` transform over our custom ops
    ("...autograd.Function with functorch transforms... must override the setup_context...") into
    an error that says what to do. (``vmap`` works, through torch's per-sample fallback.)"""

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if kind is RuntimeError and "functorch transforms" in str(exc):
            raise ValueError(
                "the triton backend does not support torch.func transforms (grad, jvp, jacrev, ...); "
                "use backend='torch' or 'reference' with torch.func"
            ) from exc
        return False


def padding_code(padding: str) -> int:
    if padding not in _PADDING_CODE:
        raise ValueError(f"padding must be one of {tuple(_PADDING_CODE)}, got {padding!r}")
    return _PADDING_CODE[padding]


def out_size(n: int, window_size: int, padding: str) -> int:
    """Side of the SSIM map: shrinks by ``window_size - 1`` with "valid", unchanged otherwise."""
    return n - window_size + 1 if padding == "valid" else n


_WINDOWS: Dict[tuple, torch.Tensor] = {}


def window_taps(cfg, device: torch.device) -> torch.Tensor:
    """The 1-D window as a float32 tensor on ``device``, built once per (window, device)."""
    key = (cfg.window, cfg.window_size, cfg.sigma, str(device))
    w = _WINDOWS.get(key)
    if w is None:
        w = cfg.window_1d(torch.float32, device).contiguous()
        _WINDOWS[key] = w
    return w


# ------------------------------------------------------------------------------------------------
# Device functions
# ------------------------------------------------------------------------------------------------


@triton.jit
def _local_shift(
    x_ptr,
    y_ptr,
    x_base,
    y_base,
    r0,
    n_rows,
    cols,
    ok,
    sx_h,
    sx_w,
    sy_h,
    sy_w,
    F: tl.constexpr,
    BW: tl.constexpr,
):
    """The moment shift of each lane [BW]: the mean of ``(x + y) / 2`` over the finite pixels of
    three rows (first, middle, last of the ``n_rows`` from ``r0``) at the lanes' columns ``cols``
    (where ``ok``), one number per channel (per group of ``F`` lanes; a scalar when the program
    holds one channel), 0 if none is finite.

    Why local: the shift must be near the pixels' values for the moments of ``x - shift`` to
    avoid fp32 cancellation (``_ssim_cs``); ``data_range / 2`` is far from a dark image's values
    (gradient 1.7e-5 from float64 on images in [0, 0.01]) and a whole-plane mean costs a pass.
    One number per channel and program, because the backward's horizontal adjoint mixes the
    lanes of a channel. Finite pixels only, so a NaN / Inf pixel cannot reach beyond its own
    footprint through the shift; exactly 0 on black images (tiny C1 / C2 stay exact)."""
    G: tl.constexpr = BW // F
    tot = tl.zeros([BW], dtype=tl.float32)
    cnt = tl.zeros([BW], dtype=tl.float32)
    for k in tl.static_range(3):
        r = (r0 + (k * (n_rows - 1)) // 2).to(tl.int64)
        c = cols.to(tl.int64)
        xv = tl.load(x_ptr + x_base + r * sx_h + c * sx_w, mask=ok, other=0.0).to(tl.float32)
        yv = tl.load(y_ptr + y_base + r * sy_h + c * sy_w, mask=ok, other=0.0).to(tl.float32)
        good = ok & (xv - xv == 0.0) & (yv - yv == 0.0)
        tot += tl.where(good, 0.5 * xv + 0.5 * yv, 0.0)
        cnt += tl.where(good, 1.0, 0.0)
    if G == 1:  # one channel per program: a scalar (no per-lane copy, no layout conversion)
        tot_s = tl.sum(tot, axis=0)
        cnt_s = tl.sum(cnt, axis=0)
        res = tl.where(cnt_s > 0.0, tot_s / tl.maximum(cnt_s, 1.0), 0.0)
    else:
        tot_g = tl.sum(tl.reshape(tot, [G, F]), axis=1)
        cnt_g = tl.sum(tl.reshape(cnt, [G, F]), axis=1)
        s_g = tl.where(cnt_g > 0.0, tot_g / tl.maximum(cnt_g, 1.0), 0.0)
        res = tl.reshape(tl.broadcast_to(s_g[:, None], [G, F]), [BW])
    return res


@triton.jit
def _row_moments(
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
    (``x' = x - shift``, ``shift`` from :func:`_local_shift`: a scalar with ``SCALAR_SHIFT``, else
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
def _hadjoint(
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
def _ssim_cs(mu1, mu2, e11, e22, e12, c1, c2, shift):
    """SSIM and contrast-structure from the moments of the *shifted* images ``x - shift``,
    ``y - shift`` (same formula as reference.ssim_map: population (co)variances).

    Why shifted: ``var = E[x^2] - mu^2`` cancels catastrophically in fp32 where the local variance
    is small against ``mu^2`` (flat regions, MS-SSIM's coarse scales); moments of ``x - shift``
    with ``shift`` a local mean (:func:`_local_shift`) remove most of it. Variances and covariance
    are shift-invariant; the luminance term uses the true means ``mu + shift``."""
    m1 = mu1 + shift
    m2 = mu2 + shift
    a1 = 2.0 * m1 * m2 + c1
    a2 = 2.0 * (e12 - mu1 * mu2) + c2
    b1 = m1 * m1 + m2 * m2 + c1
    b2 = (e11 - mu1 * mu1) + (e22 - mu2 * mu2) + c2
    cs = a2 / b2
    ssim = (a1 / b1) * cs
    return ssim, cs


@triton.jit
def _partials(mu1, mu2, e11, e22, e12, gs, gc, c1, c2, shift):
    """Partial derivatives of ``gs * SSIM + gc * cs`` w.r.t. the shifted moments (mu1, mu2,
    E[x'^2] = E[y'^2] (shared), E[x'y']), ``x' = x - shift``; ``m = mu + shift`` the true means.

    With ``S = A1 A2 / (B1 B2)``, ``A1 = 2 m1 m2 + C1``, ``B1 = m1^2 + m2^2 + C1``,
    ``A2 = 2 (E[x'y'] - mu1 mu2) + C2``, ``B2 = E[x'^2] - mu1^2 + E[y'^2] - mu2^2 + C2``:
    dS/dmu1 = 2 (m2 A2 - mu2 A1) / (B1 B2) + 2 S (mu1 / B2 - m1 / B1), dS/dE[x'^2] = -S / B2,
    dS/dE[x'y'] = 2 A1 / (B1 B2) (evaluated as ``2 (m2 / B1) cs - 2 (mu2 / B2) l`` etc. with
    ``l = A1 / B1``, ``cs = A2 / B2``); for ``cs = A2 / B2``: dcs/dmu1 = 2 (mu1 cs - mu2) / B2,
    dcs/dE[x'^2] = -cs / B2, dcs/dE[x'y'] = 2 / B2. Returns them and (SSIM, cs).
    """
    m1 = mu1 + shift
    m2 = mu2 + shift
    a1 = 2.0 * m1 * m2 + c1
    a2 = 2.0 * (e12 - mu1 * mu2) + c2
    b1 = m1 * m1 + m2 * m2 + c1
    b2 = (e11 - mu1 * mu1) + (e22 - mu2 * mu2) + c2
    # Divide by B1 and B2 one at a time, never by their product: with data_range = 1e10 both are
    # ~1e20 (the product overflows fp32), with C1 = C2 = 1e-20 on black both are 1e-20 (1 / (B1 B2)
    # overflows, A1 A2 underflows). Every factor below stays within a few orders of 1 / data_range.
    inv_b1 = 1.0 / b1
    inv_b2 = 1.0 / b2
    lum = a1 * inv_b1
    cs = a2 * inv_b2
    ssim = lum * cs
    p_mu1 = gs * (2.0 * (m2 * inv_b1 * cs - mu2 * inv_b2 * lum) + 2.0 * ssim * (mu1 * inv_b2 - m1 * inv_b1)) + gc * (
        2.0 * (mu1 * cs - mu2) * inv_b2
    )
    p_mu2 = gs * (2.0 * (m1 * inv_b1 * cs - mu1 * inv_b2 * lum) + 2.0 * ssim * (mu2 * inv_b2 - m2 * inv_b1)) + gc * (
        2.0 * (mu2 * cs - mu1) * inv_b2
    )
    p_sq = -(gs * ssim + gc * cs) * inv_b2
    p_xy = 2.0 * inv_b2 * (gs * lum + gc)
    return p_mu1, p_mu2, p_sq, p_xy, ssim, cs
