"""The loaded C kernel: its ctypes interface, the thread pool that runs it, and the raw calls.

Why a small C file compiled with the system compiler: the SSIM forward+backward is a handful of
separable filters whose cost is memory traffic between passes. Written as one streaming pass over
ring buffers a few rows high (``_ssim_cpu.c``), it reads the two images and writes the gradient,
and nothing map-sized exists in between; inductor fuses the point-wise work but still materialises
every filtered map. The C file compiles in 2 to 3 s at first use (cached), image sizes are run-time arguments
(no recompilation for new shapes or MS-SSIM scales), and it needs nothing beyond torch and a C
compiler: the same compiler ``torch.compile`` itself needs on the CPU.

The functions here take contiguous tensors in the accumulation dtype and return plain tensors
without autograd; :mod:`.functions` wraps them as differentiable custom ops.
"""

from __future__ import annotations

import ctypes
import math
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional, Tuple

import torch

from .build import FIXED_TAPS, build, compiler

__all__ = [
    "get",
    "require",
    "unavailable_reason",
    "forward",
    "backward",
    "l1_means",
    "masked_forward",
    "masked_backward",
    "masked_l1_sums",
    "masked_weights",
    "down2",
    "down2_backward",
    "fma_peak",
    "fma_lanes",
    "FIXED_TAPS",
]

_lock = threading.Lock()
_libs: dict = {}  # (torch dtype, fixed taps or 0) -> ctypes library (or None after a failure)
_reason: Optional[str] = None
_pool: Optional[ThreadPoolExecutor] = None
_pool_size = 0
# Column tiles of gradient columns (0 sweeps whole rows), the same forward and backward. Chosen with a
# scratch timing loop (thread CPU time) on a Xeon with 48 KiB L1d / 2 MiB L2: tiles sized for L1
# were slower (narrow tiles read the images in short strided rows the prefetcher does not follow),
# whole rows were best up to 1920 columns, and at 7680 columns, where the backward's ring buffers
# outgrow L2, 1024-column backward tiles cut its time by about 40 %.
BWD_TILE = 1024


def _load(dtype: torch.dtype, taps: int):
    real = "double" if dtype == torch.float64 else "float"
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (looked for $CC, cc, gcc, clang)")
    lib = ctypes.CDLL(str(build(cc, real, taps)))
    R = ctypes.c_double if real == "double" else ctypes.c_float
    P, I = ctypes.c_void_p, ctypes.c_int
    lib.splat_ssim_workspace.restype = ctypes.c_size_t
    lib.splat_ssim_workspace.argtypes = [I, I, I]
    lib.splat_ssim_fwd.restype = None
    lib.splat_ssim_fwd.argtypes = [P, P, I, I, P, I, R, R, I, I, P, P, I, I, P, P]
    lib.splat_ssim_bwd.restype = None
    lib.splat_ssim_bwd.argtypes = [P, P, I, I, P, I, R, R, R, R, I, I, P, P, P, I, I, R, P, P, P, P]
    lib.splat_mssim_workspace.restype = ctypes.c_size_t
    lib.splat_mssim_workspace.argtypes = [I, I, I]
    lib.splat_mssim_fwd.restype = None
    lib.splat_mssim_fwd.argtypes = [P, P, P, I, I, P, I, R, R, I, I, P, P, I, I]
    lib.splat_mssim_bwd.restype = None
    lib.splat_mssim_bwd.argtypes = [P, P, P, I, I, P, I, R, R, R, R, I, I, P, P, P, I, I, R, P, P]
    lib.splat_mssim_centre_rows.restype = None
    lib.splat_mssim_centre_rows.argtypes = [P, I, I, I, I, I, P, P, I]
    lib.splat_masked_l1_rows_tiled.restype = None
    lib.splat_masked_l1_rows_tiled.argtypes = [P, P, P, I, I, I, I, P]
    lib.splat_l1_rows_tiled.restype = None
    lib.splat_l1_rows_tiled.argtypes = [P, P, I, I, I, I, I, P]
    lib.splat_down2_fwd.restype = None
    lib.splat_down2_fwd.argtypes = [P, I, I, I, P]
    lib.splat_fma_peak.restype = ctypes.c_double
    lib.splat_fma_peak.argtypes = [ctypes.c_long, P]
    lib.splat_down2_bwd.restype = None
    lib.splat_down2_bwd.argtypes = [P, I, I, I, P, I]
    lib.splat_down2_bwd_scaled.restype = None
    lib.splat_down2_bwd_scaled.argtypes = [P, I, I, I, P, I, P]
    return lib


def get(dtype: torch.dtype, taps: int = 0):
    """The loaded kernel library for ``dtype`` (float32 or float64) and a window of ``taps`` taps,
    or ``None`` when it cannot be built or loaded here (:func:`unavailable_reason` says why).

    The default window (11 taps) gets a build with the tap count fixed at compile time (about 10%
    faster: unrolled tap loops, taps kept in registers); other sizes share the generic build.
    """
    global _reason
    key = (dtype, taps if taps == FIXED_TAPS else 0)
    lib = _libs.get(key, False)
    if lib is not False:
        return lib
    with _lock:
        if key not in _libs:
            try:
                _libs[key] = _load(*key)
            except Exception as exc:  # no compiler, compile error, unloadable library
                _reason = f"{type(exc).__name__}: {exc}"
                _libs[key] = None
        return _libs[key]


def unavailable_reason() -> Optional[str]:
    """Why the kernel could not be built or loaded (``None`` if it loaded or was never tried)."""
    return _reason


def require(dtype: torch.dtype, taps: int):
    """The loaded kernel library for ``dtype`` and ``taps`` (as :func:`get`); a RuntimeError that says
    why when it cannot be built or loaded here."""
    lib = get(dtype, taps)
    if lib is None:
        raise RuntimeError(f"the splatloss C kernel is unavailable: {_reason}")
    return lib


def _after_fork_in_child() -> None:
    """A forked child (e.g. a DataLoader worker) inherits the pool object but none of its threads,
    and possibly a held lock: start both afresh there."""
    global _lock, _pool, _pool_size
    _lock = threading.Lock()
    _pool, _pool_size = None, 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _run(fn, ntasks: int) -> None:
    """Run ``fn(t)`` for t in range(ntasks) on torch's intra-op thread count (ctypes calls
    release the GIL, so Python threads run the C code in parallel)."""
    global _pool, _pool_size
    threads = max(1, torch.get_num_threads())
    if threads == 1 or ntasks == 1:
        for t in range(ntasks):
            fn(t)
        return
    with _lock:
        if _pool is None or _pool_size != threads:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="splatloss")
            _pool_size = threads
        pool = _pool
    for f in [pool.submit(fn, t) for t in range(ntasks)]:
        f.result()


def _strips(rows: int, planes: int) -> int:
    """Row strips per plane: one when single-threaded (each strip of the backward recomputes
    ``window_size - 1`` rows of statistics), else enough tasks to keep every thread busy."""
    threads = max(1, torch.get_num_threads())
    if threads == 1:
        return 1
    want = math.ceil(2 * threads / planes)
    return max(1, min(want, rows // 32 if rows >= 64 else 1))


def _bounds(n: int, parts: int, i: int) -> Tuple[int, int]:
    return (n * i) // parts, (n * (i + 1)) // parts


def _tile(W: int) -> int:
    """Column tile of a plane W pixels wide (0: whole rows); the forward and the fused pass use the
    same one, so their row sums are the same numbers."""
    return BWD_TILE if W > 2.5 * BWD_TILE else 0


def _next_scale(x: torch.Tensor, down: bool):
    """``(dx, dy, bytes per plane)``: MS-SSIM's next scale of two images shaped as ``x``, for a
    kernel pass to write as it reads them (:func:`down2`'s numbers bit for bit), or
    ``(None, None, 0)``."""
    if not down:
        return None, None, 0
    B, C, H, W = x.shape
    Ho, Wo = (H + 1) // 2, (W + 1) // 2
    dx = torch.empty(B, C, Ho, Wo, dtype=x.dtype)
    return dx, torch.empty_like(dx), Ho * Wo * x.element_size()


def forward(
    lib,
    x: torch.Tensor,
    y: torch.Tensor,
    window: torch.Tensor,
    c1: float,
    c2: float,
    pad: int = 0,
    l1: bool = False,
    down: bool = False,
):
    """Means of the SSIM and cs maps per plane of ``x``, ``y`` [B, C, H, W] (contiguous), seen with
    ``pad`` zero rows / columns around them ("valid" on that), each ``[B, C]``; with ``l1`` also
    the mean of ``|x - y|`` per plane; with ``down`` also MS-SSIM's next scale of ``x`` and ``y``
    (:func:`down2` of each, written in the same pass), last."""
    B, C, H, W = x.shape
    K = window.numel()
    Hp, Wp = H + 2 * pad - K + 1, W + 2 * pad - K + 1
    P = B * C
    rows = torch.zeros(P, Hp, 2, dtype=torch.float64)  # per-map-row sums: partition-independent
    ns = _strips(Hp, P)
    tile = _tile(W)
    nws = lib.splat_ssim_workspace(W + 2 * pad, K, tile)
    workspaces = threading.local()
    esz = x.element_size()
    xp, yp, rp, gp = x.data_ptr(), y.data_ptr(), rows.data_ptr(), window.data_ptr()
    dx, dy, dsz = _next_scale(x, down)

    def task(t: int) -> None:
        ws = getattr(workspaces, "buf", None)
        if ws is None:
            ws = workspaces.buf = torch.empty(nws, dtype=x.dtype)  # the kernel zeroes what it uses
        p, s = divmod(t, ns)
        m0, m1 = _bounds(Hp, ns, s)
        off = p * H * W * esz
        nxt = (dx.data_ptr() + p * dsz, dy.data_ptr() + p * dsz) if down else (None, None)
        lib.splat_ssim_fwd(
            xp + off, yp + off, H, W, gp, K, c1, c2, m0, m1, ws.data_ptr(), rp + p * Hp * 16, tile, pad, *nxt
        )

    _run(task, P * ns)
    out = _means(rows, Hp * Wp, x.dtype, B, C) + (l1_means(lib, x, y, K, pad) if l1 else ())
    return out + (dx, dy) if down else out


def _means(rows: torch.Tensor, n: int, dtype: torch.dtype, B: int, C: int):
    sums = rows.sum(dim=1) / float(n)  # [P, 2], summed in float64 in a fixed order
    sums = sums.to(dtype).view(B, C, 2)
    return sums[..., 0].contiguous(), sums[..., 1].contiguous()


def l1_means(lib, x: torch.Tensor, y: torch.Tensor, K: int, pad: int = 0):
    """``(mean |x - y|,)`` per plane of contiguous ``x``, ``y`` [B, C, H, W], ``[B, C]``: summed as
    :func:`backward`'s fused pass sums it for a ``K``-tap window and ``pad`` (the same column tiles
    and lanes), so the forward alone and the fused pass give the same numbers."""
    B, C, H, W = x.shape
    P, esz = B * C, x.element_size()
    xp, yp = x.data_ptr(), y.data_ptr()
    l1rows = torch.zeros(P, H, dtype=torch.float64)
    tile = _tile(W)
    for p in range(P):
        off = p * H * W * esz
        lib.splat_l1_rows_tiled(xp + off, yp + off, H, W, K, tile, pad, l1rows.data_ptr() + p * H * 8)
    return ((l1rows.sum(dim=1) / float(H * W)).to(x.dtype).view(B, C),)


def backward(
    lib,
    x,
    y,
    window,
    c1,
    c2,
    gs: torch.Tensor,
    gc: torch.Tensor,
    need_x: bool,
    need_y: bool,
    pad: int = 0,
    gl1: Optional[torch.Tensor] = None,
    with_forward: bool = False,
    l1: bool = False,
    down: bool = False,
):
    """Gradients of ``sum(gs * mean ssim + gc * mean cs + gl1 * mean |x - y|)`` (all per plane,
    ``[B, C]``) w.r.t. ``x`` and ``y`` (None where not needed).

    ``with_forward``: the forward in the same pass, ``(gx, gy, ssim_mean, cs_mean)`` with the means
    bit for bit those of :func:`forward` (one sweep instead of two: the statistics the gradient
    needs are those the forward computes); with ``l1`` also ``mean |x - y|``, bit for bit
    :func:`l1_means`'s. ``down``: MS-SSIM's next scale of ``x`` and ``y`` (:func:`down2` of each,
    written in the same pass) appended."""
    B, C, H, W = x.shape
    K = window.numel()
    Hp, Wp = H + 2 * pad - K + 1, W + 2 * pad - K + 1
    P = B * C
    scale = 1.0 / float(Hp * Wp)
    gsl = (gs.reshape(P).double() * scale).tolist()
    gcl = (gc.reshape(P).double() * scale).tolist()
    gll = [0.0] * P if gl1 is None else (gl1.reshape(P).double() / float(H * W)).tolist()
    gx = torch.empty_like(x) if need_x else None
    gy = torch.empty_like(y) if need_y else None
    rows = torch.zeros(P, Hp, 2, dtype=torch.float64) if with_forward else None
    ns = _strips(H, P)
    tile = _tile(W)
    nws = lib.splat_ssim_workspace(W + 2 * pad, K, tile)
    workspaces = threading.local()
    esz = x.element_size()
    xp, yp, gp = x.data_ptr(), y.data_ptr(), window.data_ptr()
    gxp = gx.data_ptr() if need_x else 0
    gyp = gy.data_ptr() if need_y else 0
    rp = rows.data_ptr() if with_forward else 0
    l1 = l1 and with_forward
    l1rows = torch.zeros(P, H, dtype=torch.float64) if l1 else None  # per image row, as l1_means's
    lp = l1rows.data_ptr() if l1 else 0
    dx, dy, dsz = _next_scale(x, down)

    def task(t: int) -> None:
        ws = getattr(workspaces, "buf", None)
        if ws is None:
            ws = workspaces.buf = torch.empty(nws, dtype=x.dtype)  # the kernel zeroes what it uses
        p, s = divmod(t, ns)
        q0, q1 = _bounds(H, ns, s)
        off = p * H * W * esz
        lib.splat_ssim_bwd(
            xp + off,
            yp + off,
            H,
            W,
            gp,
            K,
            c1,
            c2,
            gsl[p],
            gcl[p],
            q0,
            q1,
            ws.data_ptr(),
            (gxp + off) if need_x else None,
            (gyp + off) if need_y else None,
            tile,
            pad,
            gll[p],
            (rp + p * Hp * 16) if with_forward else None,
            (lp + p * H * 8) if l1 else None,
            (dx.data_ptr() + p * dsz) if down else None,
            (dy.data_ptr() + p * dsz) if down else None,
        )

    _run(task, P * ns)
    out = (gx, gy)
    if with_forward:
        out += _means(rows, Hp * Wp, x.dtype, B, C)
        if l1:
            out += ((l1rows.sum(dim=1) / float(H * W)).to(x.dtype).view(B, C),)
    return out + (dx, dy) if down else out


def _mask_plane(m: torch.Tensor, B: int, C: int):
    """Byte offset of plane ``p = b * C + c``'s mask in ``m`` ``(B|1, C|1, H, W)`` (broadcast
    without a copy)."""
    Bm, Cm, H, W = m.shape
    size = H * W * m.element_size()

    def offset(p: int) -> int:
        b, c = divmod(p, C)
        return ((b if Bm > 1 else 0) * Cm + (c if Cm > 1 else 0)) * size

    return offset


def masked_forward(
    lib,
    x: torch.Tensor,
    y: torch.Tensor,
    m: torch.Tensor,
    window: torch.Tensor,
    c1: float,
    c2: float,
    pad: int = 0,
    l1: bool = False,
):
    """Masked statistics per plane of ``x``, ``y`` [B, C, H, W] and the mask ``m`` [B|1, C|1, H, W]
    (contiguous, the images' dtype), seen with ``pad`` zero rows / columns around the images and
    ``pad`` rows / columns of ones around the mask: ``(sum c ssim, sum c cs, sum c)`` each ``[B, C]``
    in float64 (``c`` the centre weights), and with ``l1`` also ``(sum m |x - y|, sum m)`` [B, C]."""
    B, C, H, W = x.shape
    K = window.numel()
    Hp = H + 2 * pad - K + 1
    P = B * C
    rows = torch.empty(P, Hp, 3, dtype=torch.float64)  # per-map-row sums: partition-independent
    ns = _strips(Hp, P)
    nws = lib.splat_mssim_workspace(W + 2 * pad, K, 0)
    workspaces = threading.local()
    esz = x.element_size()
    xp, yp, mp, rp, gp = x.data_ptr(), y.data_ptr(), m.data_ptr(), rows.data_ptr(), window.data_ptr()
    moff = _mask_plane(m, B, C)

    def task(t: int) -> None:
        ws = getattr(workspaces, "buf", None)
        if ws is None:
            ws = workspaces.buf = torch.empty(nws, dtype=x.dtype)  # the kernel zeroes what it uses
        p, s = divmod(t, ns)
        m0, m1 = _bounds(Hp, ns, s)
        off = p * H * W * esz
        lib.splat_mssim_fwd(
            xp + off,
            yp + off,
            mp + moff(p),
            H,
            W,
            gp,
            K,
            c1,
            c2,
            m0,
            m1,
            ws.data_ptr(),
            rp + (p * Hp + m0) * 24,
            0,  # whole rows
            pad,
        )

    _run(task, P * ns)
    sums = rows.sum(dim=1).view(B, C, 3)  # summed in float64 in a fixed order
    out = (sums[..., 0], sums[..., 1], sums[..., 2])
    if l1:
        out += masked_l1_sums(lib, x, y, m, pad)
    return out


def masked_l1_sums(lib, x: torch.Tensor, y: torch.Tensor, m: torch.Tensor, pad: int = 0):
    """``(sum m |x - y|, sum m)`` per plane ``[B, C]`` in float64 (arguments as in
    :func:`masked_forward`; the L1 term is over the pixels), summed as :func:`masked_backward`'s
    fused pass sums them for ``pad``."""
    B, C, H, W = x.shape
    P, esz = B * C, x.element_size()
    xp, yp, mp = x.data_ptr(), y.data_ptr(), m.data_ptr()
    moff = _mask_plane(m, B, C)
    l1rows = torch.zeros(P, H, 2, dtype=torch.float64)
    for p in range(P):
        off = p * H * W * esz
        lib.splat_masked_l1_rows_tiled(xp + off, yp + off, mp + moff(p), H, W, pad, 0, l1rows.data_ptr() + p * H * 16)
    l1sums = l1rows.sum(dim=1).view(B, C, 2)
    return l1sums[..., 0], l1sums[..., 1]


def masked_weights(lib, m: torch.Tensor, B: int, C: int, K: int, pad: int = 0):
    """What the masked means divide by, from the mask ``m`` ``(B|1, C|1, H, W)`` alone, for ``B x C``
    planes: ``(sum c, sum m)`` ``[B, C]`` in float64, the centre weights' sums of
    :func:`masked_forward` and the mask sums of :func:`masked_l1_sums`, bit for bit (the same lanes,
    layouts and reductions), one read of each distinct mask plane."""
    _, _, H, W = m.shape
    Hp, Wp = H + 2 * pad - K + 1, W + 2 * pad - K + 1
    moff = _mask_plane(m, B, C)
    work = torch.empty((Wp + 2 * 64) // 64 * 64 + 64, dtype=m.dtype)  # a vector-padded map row
    centre = torch.zeros(1, Hp, 3, dtype=torch.float64)  # masked_forward's layout and reduction
    rows = torch.empty(Hp, dtype=torch.float64)
    mrows = torch.zeros(1, H, 2, dtype=torch.float64)  # masked_l1_sums's
    done: dict = {}
    z = torch.empty(B * C, dtype=torch.float64)
    msum = torch.empty(B * C, dtype=torch.float64)
    for p in range(B * C):
        o = moff(p)
        if o not in done:
            mp = m.data_ptr() + o
            lib.splat_mssim_centre_rows(mp, H, W, K, 0, Hp, work.data_ptr(), rows.data_ptr(), pad)
            centre[0, :, 2] = rows
            mrows.zero_()
            lib.splat_masked_l1_rows_tiled(mp, mp, mp, H, W, pad, 1, mrows.data_ptr())  # m alone
            done[o] = (centre.sum(dim=1)[0, 2], mrows.sum(dim=1)[0, 1])
        z[p], msum[p] = done[o]
    return z.view(B, C), msum.view(B, C)


def masked_backward(
    lib,
    x,
    y,
    m,
    window,
    c1,
    c2,
    gs: torch.Tensor,
    gc: torch.Tensor,
    need_x: bool,
    need_y: bool,
    pad: int = 0,
    gl1: Optional[torch.Tensor] = None,
    with_forward: bool = False,
    l1: bool = False,
):
    """Gradients of ``sum(gs * sum(c ssim) + gc * sum(c cs) + gl1 * sum(m |x - y|))`` (coefficients
    per plane ``[B, C]``, sums over each plane's map / pixels) w.r.t. ``x`` and ``y`` (None where not
    needed); arguments as in :func:`masked_forward`.

    ``with_forward``: the forward in the same pass, ``(gx, gy, sum c ssim, sum c cs, sum c)`` with
    the sums bit for bit :func:`masked_forward`'s (the plane is then swept in whole rows, as the
    forward sweeps it); with ``l1`` also ``(sum m |x - y|, sum m)``, bit for bit
    :func:`masked_l1_sums`'s."""
    B, C, H, W = x.shape
    K = window.numel()
    P = B * C
    gsl = gs.reshape(P).double().tolist()
    gcl = gc.reshape(P).double().tolist()
    gll = [0.0] * P if gl1 is None else gl1.reshape(P).double().tolist()
    gx = torch.empty_like(x) if need_x else None
    gy = torch.empty_like(y) if need_y else None
    ns = _strips(H, P)
    tile = BWD_TILE if W > 2.5 * BWD_TILE and not with_forward else 0
    nws = lib.splat_mssim_workspace(W + 2 * pad, K, tile)
    Hp = H + 2 * pad - K + 1
    rows = torch.zeros(P, Hp, 3, dtype=torch.float64) if with_forward else None  # per map row, as the forward's
    rp = rows.data_ptr() if with_forward else 0
    l1 = l1 and with_forward
    l1rows = torch.zeros(P, H, 2, dtype=torch.float64) if l1 else None  # per image row, as masked_l1_sums's
    lp = l1rows.data_ptr() if l1 else 0
    workspaces = threading.local()
    esz = x.element_size()
    xp, yp, mp, gp = x.data_ptr(), y.data_ptr(), m.data_ptr(), window.data_ptr()
    gxp = gx.data_ptr() if need_x else 0
    gyp = gy.data_ptr() if need_y else 0
    moff = _mask_plane(m, B, C)

    def task(t: int) -> None:
        ws = getattr(workspaces, "buf", None)
        if ws is None:
            ws = workspaces.buf = torch.empty(nws, dtype=x.dtype)  # the kernel zeroes what it uses
        p, s = divmod(t, ns)
        q0, q1 = _bounds(H, ns, s)
        off = p * H * W * esz
        lib.splat_mssim_bwd(
            xp + off,
            yp + off,
            mp + moff(p),
            H,
            W,
            gp,
            K,
            c1,
            c2,
            gsl[p],
            gcl[p],
            q0,
            q1,
            ws.data_ptr(),
            (gxp + off) if need_x else None,
            (gyp + off) if need_y else None,
            tile,
            pad,
            gll[p],
            (rp + p * Hp * 24) if with_forward else None,
            (lp + p * H * 16) if l1 else None,
        )

    _run(task, P * ns)
    if with_forward:
        sums = rows.sum(dim=1).view(B, C, 3)  # summed in float64 in masked_forward's order
        out = (gx, gy, sums[..., 0], sums[..., 1], sums[..., 2])
        if l1:
            l1sums = l1rows.sum(dim=1).view(B, C, 2)
            out += (l1sums[..., 0], l1sums[..., 1])
        return out
    return gx, gy


def fma_lanes(lib, iters: int) -> float:
    """Run the FMA microkernel for ``iters`` rounds; the number of FMA lanes it computed (time it)."""
    sink = torch.empty(64, dtype=torch.float64)
    return lib.splat_fma_peak(int(iters), sink.data_ptr())


def fma_peak(lib, seconds: float = 0.05, repeats: int = 5, clock=time.perf_counter) -> float:
    """The core's measured FMA rate in lanes per second (the median of ``repeats`` timed runs of about
    ``seconds`` each, one thread) with the kernel's own vector type and compiler flags: the arithmetic
    peak that the benchmark measures the kernel against. ``clock``: the timer (``time.thread_time``
    counts only the time this thread ran, on a shared machine)."""
    sink = torch.empty(64, dtype=torch.float64)
    iters = 1 << 16
    while True:  # grow until one run takes long enough to time
        t0 = clock()
        lanes = lib.splat_fma_peak(iters, sink.data_ptr())
        dt = clock() - t0
        if dt >= seconds / 4 or iters > 1 << 34:
            break
        iters *= 2
    iters = max(1, int(iters * seconds / max(dt, 1e-9)))
    rates = []
    for _ in range(repeats):
        t0 = clock()
        lanes = lib.splat_fma_peak(iters, sink.data_ptr())
        rates.append(lanes / (clock() - t0))
    return statistics.median(rates)


def down2(lib, x: torch.Tensor) -> torch.Tensor:
    """TF ``ssim_multiscale``'s pyramid step on a contiguous ``[B, C, H, W]`` (the C version of
    :func:`splatloss.multiscale.downsample2x`)."""
    B, C, H, W = x.shape
    out = torch.empty(B, C, (H + 1) // 2, (W + 1) // 2, dtype=x.dtype)
    lib.splat_down2_fwd(x.data_ptr(), B * C, H, W, out.data_ptr())
    return out


def down2_backward(
    lib, g: torch.Tensor, size, acc: Optional[torch.Tensor] = None, scale: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Adjoint of :func:`down2` for an upstream ``g``: a new image-sized gradient, or added in place
    to ``acc`` (contiguous, image-sized) when given, ``acc`` first scaled per plane by ``scale``
    ``[B, C]`` when that is given (one pass)."""
    g = g.contiguous()
    B, C = g.shape[:2]
    H, W = size
    out = torch.empty(B, C, H, W, dtype=g.dtype) if acc is None else acc
    if scale is None:
        lib.splat_down2_bwd(g.data_ptr(), B * C, H, W, out.data_ptr(), 0 if acc is None else 1)
    else:
        sc = scale.to(g.dtype).contiguous()
        lib.splat_down2_bwd_scaled(g.data_ptr(), B * C, H, W, out.data_ptr(), 0 if acc is None else 1, sc.data_ptr())
    return out
