"""Pieces shared by the Triton ops: launch geometry, input checks, device functions.

How a program filters
---------------------
A program owns a strip of ``F`` map (or gradient) columns of one image channel -- or, when a whole
row fits in ``F``, ``G = BW // F`` channel rows side by side ("lanes": one column of one channel
per lane, ``BW`` lanes) -- and streams down ``ROWS`` rows of it. Both passes are K-tap 1-D
filters: separable, about 2 * 4 * K multiply-adds per pixel-channel for the moments (x, y,
x^2 + y^2, xy: the two squares only enter SSIM as their sum).

Column kernels (up to ``COLUMN_TAPS`` taps): one lane per thread. Per input row each thread sums
its own K taps in registers (the loads of neighbouring threads overlap: L1 hits), and the
vertical pass adds the row into the ``K - 1`` open map rows held as per-thread pending sums
(:func:`_push`): no cross-thread reduction, no barrier in the forward. The backward's horizontal
adjoint needs the partial derivatives of the neighbouring columns: they go through a scratch row
in global memory (written and read back by the same CTA around one barrier, so it stays in L1),
as Triton has no shared-memory API.

Ring kernels (wider windows, whose pending sums would not fit in registers): the horizontal pass
is one ``[KP, BW]`` load of the K taps, the result goes into a ring of the last ``KP >= K`` rows
in the per-program scratch, and the vertical pass is a weighted sum over the ring.

The adjoint
-----------
The gradient at input pixel ``q`` gathers, through the window, the partial derivatives of every
map value that used ``q`` (DESIGN.md): ``g[q] = sum_p P[p] w[q - p + pad]`` over map positions
``p`` (``P`` is zero off the map), i.e. the partials convolved with the window, horizontally
(through the scratch row) then vertically (pending sums, or a ring). With "reflect" padding a padded
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

#: Register ceilings passed to the launches (and seen by scripts/check_kernels.py). Column kernels
#: (``K <= COLUMN_TAPS``): 128 registers, so that four 4-warp CTAs (16 warps, 8-warp programs: two)
#: are resident per SM; their pending sums fit without spilling at sm_80 and sm_90 (checked for
#: every launched variant by scripts/check_kernels.py), except the "reflect" backward's (its
#: mirrored taps: ``ssim._bwd_maxnreg``). Those and the ring kernels: 255, without which ptxas
#: chose 128 registers plus a 4-byte spill for several ring-kernel backward variants at sm_80.
COLUMN_MAXNREG = 128
MAXNREG = 255


def launch_options(num_warps: int, hip: Optional[bool] = None, maxnreg: int = MAXNREG) -> dict:
    """Keyword options of a kernel launch: ``num_warps``, and the register ceiling ``maxnreg`` only
    on NVIDIA (Triton's HIP backend rejects it). ``hip`` defaults to whether torch was built for
    ROCm."""
    if hip is None:
        hip = torch.version.hip is not None
    return {"num_warps": num_warps} if hip else {"num_warps": num_warps, "maxnreg": maxnreg}


def device_guard(t: torch.Tensor):
    """Context in which to launch on ``t``'s device: Triton launches on the current CUDA device and
    stream, not the tensor's, so a tensor on ``cuda:1`` needs ``torch.cuda.device(1)`` around the
    launch. A no-op for CPU tensors (the interpreter)."""
    if t.device.type == "cuda":
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()


#: Windows up to this many taps run the column kernels: one image column per thread, taps unrolled
#: into registers, the vertical sums as pending per-thread sums (registers grow with K: at 13+ taps
#: the heaviest backward variants spilled). Wider windows run the ring kernels (``[KP, lanes]``
#: tiles through an L1-resident scratch ring), whose registers do not grow with K.
COLUMN_TAPS = tl.constexpr(11)


def cuda_lanes(window_size: int) -> int:
    """Lanes (columns) per program on CUDA: 128, or 64 for the ring kernels' 32-deep tap tiles
    (K = 17..31)."""
    return 128 if triton.next_power_of_2(window_size) <= 16 else 64


def cuda_warps(window_size: int) -> int:
    """Warps per program: one thread per lane for the column kernels; for the ring kernels each
    thread holds ``KP * lanes / (32 * warps)`` <= 8 values of every ``[KP, lanes]`` tile, so that
    no kernel spills (scripts/check_kernels.py)."""
    lanes = cuda_lanes(window_size)
    if window_size <= COLUMN_TAPS.value:
        return lanes // 32
    return max(4, (triton.next_power_of_2(window_size) * lanes) // (8 * 32))


def geometry(frame: int, rows: int, window_size: int, bc: int, device: torch.device, halo: bool = False) -> Geometry:
    """Geometry for rows of ``frame`` lanes of work (map width, or image width + K - 1 halo).

    On CUDA: 128 lanes (64 for windows of 17..31 taps), 128 rows per program; rows of at most
    half the lanes are packed several channels per program (MS-SSIM's coarse scales). ``halo``
    (the backward, whose programs recompute ``K - 1`` columns of their neighbours): the column
    kernels take 256 lanes and 8 warps, so that the recomputed halo is 4 %, not 8 %, of the work. In the
    interpreter programs run one after the other at a cost per operation, not per element: one
    program takes every row and column (up to 2048 lanes) of as many channels as fit.
    """
    kp = triton.next_power_of_2(window_size)
    need = triton.next_power_of_2(max(frame, 1))
    if device.type == "cuda" or FORCE_CUDA_GEOMETRY:
        lanes = cuda_lanes(window_size)
        warps = cuda_warps(window_size)
        if halo and window_size <= COLUMN_TAPS.value:
            lanes, warps = 2 * lanes, 2 * warps
        return Geometry(
            bw=lanes,
            f=min(lanes, need),
            rows=CUDA_ROWS,
            kp=kp,
            warps=warps,
        )
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
    if e22 is None:  # e11 holds E[x'^2] + E[y'^2]
        b2 = (e11 - mu1 * mu1 - mu2 * mu2) + c2
    else:
        b2 = (e11 - mu1 * mu1) + (e22 - mu2 * mu2) + c2
    cs = a2 / b2
    ssim = (a1 / b1) * cs
    return ssim, cs


@triton.jit
def _partials(mu1, mu2, e11, e22, e12, gs, gc, c1, c2, shift, HAS_CS: tl.constexpr):
    """Partial derivatives of ``gs * SSIM + gc * cs`` (``gc`` only with ``HAS_CS``; ``HAS_CS == 2``:
    of ``gc * cs`` alone, ``gs`` ignored, cs returned in the SSIM's place) w.r.t. the shifted
    moments (mu1, mu2, E[x'^2] = E[y'^2] (shared), E[x'y']), ``x' = x - shift``; ``m = mu +
    shift`` the true means. Returns them and (SSIM, cs).

    With ``S = l cs``, ``l = A1 / B1``, ``cs = A2 / B2``, ``A1 = 2 m1 m2 + C1``,
    ``B1 = m1^2 + m2^2 + C1``, ``A2 = 2 (E[x'y'] - mu1 mu2) + C2``,
    ``B2 = E[x'^2] - mu1^2 + E[y'^2] - mu2^2 + C2``:

    * d/dE[x'^2] = -(gs S + gc cs) / B2 (``p_sq``), d/dE[x'y'] = 2 (gs l + gc) / B2 (``p_xy``);
    * d/dmu1 = gs (2 cs / B1) (m2 - l m1) - 2 p_sq mu1 - p_xy mu2 (the luminance term, through
      m1, then the variance and covariance terms, through mu1: ``A2`` and ``B2`` depend on mu1 as
      on E[x'^2] and E[x'y'] times ``-2 mu1`` and ``-mu2``); d/dmu2 likewise.

    ``m2 - l m1`` is one fused multiply-add, rounded once: it is where the two luminance terms
    cancel."""
    a2 = 2.0 * (e12 - mu1 * mu2) + c2
    if e22 is None:  # e11 holds E[x'^2] + E[y'^2]
        b2 = (e11 - mu1 * mu1 - mu2 * mu2) + c2
    else:
        b2 = (e11 - mu1 * mu1) + (e22 - mu2 * mu2) + c2
    # Divide by B1 and B2 one at a time, never by their product: with data_range = 1e10 both are
    # ~1e20 (the product overflows fp32), with C1 = C2 = 1e-20 on black both are 1e-20 (1 / (B1 B2)
    # overflows, A1 A2 underflows). Every factor below stays within a few orders of 1 / data_range.
    inv_b2 = 1.0 / b2
    cs = a2 * inv_b2
    if HAS_CS == 2:  # cs alone (MS-SSIM's finer scales): no luminance term
        ssim = cs  # (the SSIM is not computed: the sums take cs)
        p_sq = -(gc * cs) * inv_b2
        p_xy = 2.0 * inv_b2 * gc
        p_mu1 = -2.0 * p_sq * mu1 - p_xy * mu2
        p_mu2 = -2.0 * p_sq * mu2 - p_xy * mu1
    else:
        m1 = mu1 + shift
        m2 = mu2 + shift
        a1 = 2.0 * m1 * m2 + c1
        b1 = m1 * m1 + m2 * m2 + c1
        inv_b1 = 1.0 / b1
        lum = a1 * inv_b1
        ssim = lum * cs
        if HAS_CS:
            p_sq = -(gs * ssim + gc * cs) * inv_b2
            p_xy = 2.0 * inv_b2 * (gs * lum + gc)
        else:
            p_sq = -(gs * ssim) * inv_b2
            p_xy = 2.0 * inv_b2 * (gs * lum)
        k_l = 2.0 * gs * cs * inv_b1
        p_mu1 = k_l * (m2 - lum * m1) - 2.0 * p_sq * mu1 - p_xy * mu2
        p_mu2 = k_l * (m1 - lum * m2) - 2.0 * p_sq * mu2 - p_xy * mu1
    return p_mu1, p_mu2, p_sq, p_xy, ssim, cs


# ------------------------------------------------------------------------------------------------
# Column-per-thread device functions (one image column per lane, taps unrolled, sums in registers)
# ------------------------------------------------------------------------------------------------


@triton.jit
def _taps(w_ptr, K: tl.constexpr):
    """The K window taps as a tuple of scalars, loaded once per program (uniform registers)."""
    t = ()
    for a in tl.static_range(K):
        t = t + (tl.load(w_ptr + a),)
    return t


@triton.jit
def _tap(h1, h2, h11, h12, l1, xv, yv, w, ok, l1_own, l1_last, a: tl.constexpr, PAD: tl.constexpr, L1: tl.constexpr):
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
def _hmoments(
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
            h1, h2, h11, h12, l1 = _tap(h1, h2, h11, h12, l1, xv, yv, wt[a], ok, l1_own, l1_last, a, PAD, L1)
    else:
        for a in tl.static_range(K):
            xv = tl.load(xrow + a * sx_w).to(tl.float32) * rowf - shift
            yv = tl.load(yrow + a * sy_w).to(tl.float32) * rowf - shift
            h1, h2, h11, h12, l1 = _tap(h1, h2, h11, h12, l1, xv, yv, wt[a], True, l1_own, l1_last, a, PAD, L1)
    return h1, h2, h11, h12, l1


@triton.jit
def _push(pending, h, wt, K: tl.constexpr, REVERSED: tl.constexpr):
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
def _hadjoint_cols(
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
def _vadjoint_taps(w_ptr, wt, p, H, K: tl.constexpr, PAD: tl.constexpr, REFLECT: tl.constexpr):
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
