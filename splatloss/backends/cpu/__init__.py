"""The compiled CPU kernel behind ``backend="torch"`` on CPU tensors: build, cache, load, run.

Why a small C file compiled with the system compiler rather than ``torch.compile``: the SSIM
forward+backward is a handful of separable filters whose cost is memory traffic between passes.
Written as one streaming pass over ring buffers a few rows high (``_ssim_cpu.c``), it reads the
two images and writes the gradient, and nothing map-sized exists in between; inductor fuses the
point-wise work but still materialises every filtered map. The C file compiles in about half a
second (inductor took 9-15 s cold for the reference SSIM / MS-SSIM graphs, and ran them 12x slower:
docs/performance.md), image sizes are run-time arguments (no
recompilation for new shapes or MS-SSIM scales, no dynamic-shape guards), and it needs nothing
beyond torch and a C compiler: the same compiler ``torch.compile`` itself needs on the CPU.

Without a compiler (or with ``SPLATLOSS_NO_CPU_KERNEL=1``) :func:`get` returns ``None``, the backend
keeps to its plain torch-ops path, and a warning says so once.

The shared library is cached under ``$SPLATLOSS_CACHE_DIR`` (default
``$XDG_CACHE_HOME/splatloss`` or ``~/.cache/splatloss``), keyed by the source, the flags, the
compiler's version and the CPU's feature flags (the build uses ``-march=native``), and written
atomically, so concurrent processes never load a half-written file.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import math
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from ...config import SSIMConfig
from ...reference import accumulation_dtype

__all__ = ["get", "unavailable_reason", "cpu_kernel", "fast_path_ok", "ssim_stats", "ssim_mean_and_grad", "ms_ssim", "dssim_l1"]

_SOURCE = Path(__file__).with_name("_ssim_cpu.c")
_BASE_FLAGS = ["-O3", "-fPIC", "-shared", "-fno-math-errno", "-ffp-contract=fast", "-std=gnu11"]

_lock = threading.Lock()
_libs: dict = {}  # (torch dtype, fixed taps or 0) -> ctypes library (or None after a failure)
_reason: Optional[str] = None
_warned = False
_pool: Optional[ThreadPoolExecutor] = None
# Column tiles (map columns forward, gradient columns backward; 0 sweeps whole rows). Chosen with a
# scratch timing loop (thread CPU time) on a Xeon with 48 KiB L1d / 2 MiB L2: tiles sized for L1
# were slower (narrow tiles read the images in short strided rows the prefetcher does not follow),
# whole rows were best up to 1920 columns, and at 7680 columns, where the backward's ring buffers
# outgrow L2, 1024-column backward tiles cut its time by about 40 %.
FWD_TILE = 0
BWD_TILE = 1024
FIXED_TAPS = 11  # window size with its own build (the default)
_pool_size = 0


def _cache_dir() -> Path:
    env = os.environ.get("SPLATLOSS_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "splatloss"


def _compiler() -> Optional[str]:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_signature() -> str:
    """The CPU's feature flags (the build is -march=native: never load it on another CPU)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return platform.processor() + platform.machine()


def _build(cc: str, real: str, taps: int = 0) -> Path:
    src = _SOURCE.read_bytes()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    key_flags = None
    errors = []
    # -march=native first; a compiler that does not know it gets the portable build.
    for arch in (["-march=native"], []):
        flags = _BASE_FLAGS + arch + [f"-DREAL={real}"] + ([f"-DFIXED_TAPS={taps}"] if taps else [])
        key = hashlib.sha256(src + " ".join(flags).encode() + version.encode() + _cpu_signature().encode())
        out = _cache_dir() / f"ssim_cpu_{real}_k{taps}_{key.hexdigest()[:16]}.so"
        if out.exists():
            return out
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        try:
            proc = subprocess.run([cc, *flags, "-o", tmp, str(_SOURCE)], capture_output=True, text=True, timeout=300)
            if proc.returncode == 0:
                os.replace(tmp, out)  # atomic: other processes see the old state or the whole file
                return out
            errors.append(proc.stderr.strip()[-500:])
            key_flags = flags
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise RuntimeError(f"{cc} {' '.join(key_flags or [])} failed: {errors[-1] if errors else ''}")


def _load(dtype: torch.dtype, taps: int):
    real = "double" if dtype == torch.float64 else "float"
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (looked for $CC, cc, gcc, clang)")
    lib = ctypes.CDLL(str(_build(cc, real, taps)))
    R = ctypes.c_double if real == "double" else ctypes.c_float
    P, I = ctypes.c_void_p, ctypes.c_int
    lib.splat_ssim_workspace.restype = ctypes.c_size_t
    lib.splat_ssim_workspace.argtypes = [I, I, I]
    lib.splat_ssim_fwd.restype = None
    lib.splat_ssim_fwd.argtypes = [P, P, I, I, P, I, R, R, I, I, P, P, I, I]
    lib.splat_ssim_bwd.restype = None
    lib.splat_ssim_bwd.argtypes = [P, P, I, I, P, I, R, R, R, R, I, I, P, P, P, I, I, R]
    lib.splat_l1_rows.restype = None
    lib.splat_l1_rows.argtypes = [P, P, I, I, P]
    lib.splat_down2_fwd.restype = None
    lib.splat_down2_fwd.argtypes = [P, I, I, I, P]
    lib.splat_down2_bwd.restype = None
    lib.splat_down2_bwd.argtypes = [P, I, I, I, P, I]
    return lib


def get(dtype: torch.dtype, taps: int = 0):
    """The loaded kernel library for ``dtype`` (float32 or float64) and a window of ``taps`` taps,
    or ``None`` (warned once).

    The default window (11 taps) gets a build with the tap count fixed at compile time (about 10%
    faster: unrolled tap loops, taps kept in registers); other sizes share the generic build.
    """
    global _reason, _warned
    key = (dtype, taps if taps == FIXED_TAPS else 0)
    lib = _libs.get(key, False)
    if lib is not False:
        return lib
    with _lock:
        if key not in _libs:
            if os.environ.get("SPLATLOSS_NO_CPU_KERNEL", "0") not in ("", "0"):
                _reason = "SPLATLOSS_NO_CPU_KERNEL is set"
                _libs[key] = None
            else:
                try:
                    _libs[key] = _load(*key)
                except Exception as exc:  # no compiler, compile error, unloadable library
                    _reason = f"{type(exc).__name__}: {exc}"
                    _libs[key] = None
        lib = _libs[key]
        if lib is None and not _warned:
            _warned = True
            warnings.warn(
                "splatloss: the compiled CPU SSIM kernel is unavailable "
                f"({_reason}); backend='torch' runs on its plain torch-ops path, which gives the "
                "same values but is several times slower. Install a C compiler (gcc or clang) "
                "for the fast path.",
                RuntimeWarning,
                stacklevel=3,
            )
    return lib


def unavailable_reason() -> Optional[str]:
    """Why the kernel could not be built or loaded (``None`` if it loaded or was never tried)."""
    return _reason


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


def _forward(lib, x: torch.Tensor, y: torch.Tensor, window: torch.Tensor, c1: float, c2: float,
             pad: int = 0, l1: bool = False):
    """Means of the SSIM and cs maps per plane of ``x``, ``y`` [B, C, H, W] (contiguous), seen with
    ``pad`` zero rows / columns around them ("valid" on that), each ``[B, C]``; with ``l1`` also
    the mean of ``|x - y|`` per plane."""
    B, C, H, W = x.shape
    K = window.numel()
    Hp, Wp = H + 2 * pad - K + 1, W + 2 * pad - K + 1
    P = B * C
    rows = torch.empty(P, Hp, 2, dtype=torch.float64)  # per-map-row sums: partition-independent
    ns = _strips(Hp, P)
    nws = lib.splat_ssim_workspace(W + 2 * pad, K, FWD_TILE)
    workspaces = threading.local()
    esz = x.element_size()
    xp, yp, rp, gp = x.data_ptr(), y.data_ptr(), rows.data_ptr(), window.data_ptr()

    def task(t: int) -> None:
        ws = getattr(workspaces, "buf", None)
        if ws is None:
            ws = workspaces.buf = torch.empty(nws, dtype=x.dtype)  # the kernel zeroes what it uses
        p, s = divmod(t, ns)
        m0, m1 = _bounds(Hp, ns, s)
        off = p * H * W * esz
        lib.splat_ssim_fwd(xp + off, yp + off, H, W, gp, K, c1, c2, m0, m1, ws.data_ptr(),
                           rp + (p * Hp + m0) * 16, FWD_TILE, pad)

    _run(task, P * ns)
    sums = rows.sum(dim=1) / float(Hp * Wp)  # [P, 2], summed in float64 in a fixed order
    sums = sums.to(x.dtype).view(B, C, 2)
    out = (sums[..., 0].contiguous(), sums[..., 1].contiguous())
    if l1:
        l1rows = torch.empty(P, H, dtype=torch.float64)
        for p in range(P):
            off = p * H * W * esz
            lib.splat_l1_rows(xp + off, yp + off, H, W, l1rows.data_ptr() + p * H * 8)
        out += ((l1rows.sum(dim=1) / float(H * W)).to(x.dtype).view(B, C),)
    return out


def _backward(lib, x, y, window, c1, c2, gs: torch.Tensor, gc: torch.Tensor, need_x: bool, need_y: bool,
              pad: int = 0, gl1: Optional[torch.Tensor] = None):
    """Gradients of ``sum(gs * mean ssim + gc * mean cs + gl1 * mean |x - y|)`` (all per plane,
    ``[B, C]``) w.r.t. ``x`` and ``y`` (None where not needed)."""
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
    ns = _strips(H, P)
    tile = BWD_TILE if W > 2.5 * BWD_TILE else 0
    nws = lib.splat_ssim_workspace(W + 2 * pad, K, tile)
    workspaces = threading.local()
    esz = x.element_size()
    xp, yp, gp = x.data_ptr(), y.data_ptr(), window.data_ptr()
    gxp = gx.data_ptr() if need_x else 0
    gyp = gy.data_ptr() if need_y else 0

    def task(t: int) -> None:
        ws = getattr(workspaces, "buf", None)
        if ws is None:
            ws = workspaces.buf = torch.empty(nws, dtype=x.dtype)  # the kernel zeroes what it uses
        p, s = divmod(t, ns)
        q0, q1 = _bounds(H, ns, s)
        off = p * H * W * esz
        lib.splat_ssim_bwd(
            xp + off, yp + off, H, W, gp, K, c1, c2, gsl[p], gcl[p], q0, q1, ws.data_ptr(),
            (gxp + off) if need_x else None, (gyp + off) if need_y else None, tile, pad, gll[p],
        )

    _run(task, P * ns)
    return gx, gy


_use_cpu_kernel = True


@contextlib.contextmanager
def cpu_kernel(enabled: bool):
    """Turn the compiled CPU kernel on or off inside a ``with`` block (benchmarks, tests).

    Off, ``backend="torch"`` runs its plain torch-ops path on the CPU too (the same numbers to fp32
    round-off, slower). A process-wide switch, not meant for use from several threads at once.

    Examples:
        >>> from splatloss.config import SSIMConfig
        >>> from splatloss.backends.torch_fused import ssim_stats
        >>> x, y = torch.rand(1, 1, 16, 16), torch.rand(1, 1, 16, 16)
        >>> with cpu_kernel(False):
        ...     slow, _ = ssim_stats(x, y, SSIMConfig())
        >>> fast, _ = ssim_stats(x, y, SSIMConfig())
        >>> bool(torch.allclose(slow, fast, atol=1e-6))
        True
    """
    global _use_cpu_kernel
    before = _use_cpu_kernel
    _use_cpu_kernel = bool(enabled)
    try:
        yield
    finally:
        _use_cpu_kernel = before


def fast_path_ok(img1: torch.Tensor, img2: torch.Tensor, cfg: SSIMConfig) -> bool:
    """CPU, switch on, no torch.func transform or forward-mode tangent, kernel built and loaded."""
    if not _use_cpu_kernel or img1.device.type != "cpu":
        return False
    if img1.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        return False
    if torch._C._are_functorch_transforms_active():
        return False
    from torch.autograd import forward_ad  # dual tensors need a jvp rule this kernel lacks

    if forward_ad._current_level >= 0:
        for t in (img1, img2):
            if forward_ad.unpack_dual(t).tangent is not None:
                return False
    return get(accumulation_dtype(img1.dtype), cfg.window_size) is not None


def padded(x: torch.Tensor, y: torch.Tensor, cfg: SSIMConfig):
    """Accumulation dtype and padding: ``(x, y, pad)`` for a kernel that computes a "valid" SSIM
    of ``x``, ``y`` seen with ``pad`` zero rows / columns around them.

    "same" (zeros) costs no copy: the kernel reads the zeros implicitly. "reflect" is an
    ``F.pad`` copy whose adjoint (the fold-back of the mirrored border) autograd takes care of."""
    acc = accumulation_dtype(x.dtype)
    x, y = x.to(acc), y.to(acc)
    r = cfg.window_size // 2
    if cfg.padding == "same":
        return x, y, r
    if cfg.padding == "reflect":
        x, y = F.pad(x, (r, r, r, r), mode="reflect"), F.pad(y, (r, r, r, r), mode="reflect")
    return x, y, 0


def unpad_grad(g: torch.Tensor, cfg: SSIMConfig, size) -> torch.Tensor:
    """Adjoint of :func:`padded`'s copy ("reflect"), for a gradient w.r.t. the padded image."""
    if cfg.padding == "reflect":
        r = cfg.window_size // 2
        shape = g.shape[:2] + tuple(size)
        return torch.ops.aten.reflection_pad2d_backward(g, g.new_empty(shape), [r, r, r, r])
    return g


def _batched(t: Optional[torch.Tensor]) -> bool:
    """Whether ``t`` is a vmap-batched tensor (legacy or functorch): no plain memory to hand to C."""
    return t is not None and (
        torch._C._are_functorch_transforms_active() or "Batched" in str(torch._C._dispatch_keys(t))
    )


def _torch_ops_grads(x, y, w, pad, c1, c2, g_s, g_c, need_x, need_y):
    """The same gradients through the torch-ops adjoint (differentiable, vmappable): used under
    ``create_graph=True`` and for batched upstreams. ``g_s`` / ``g_c`` are ``[B, C]`` or None."""
    from ..torch_fused import _backward as torch_ops_backward  # imported here: it imports us

    k = w.shape[0]
    n = (x.shape[-2] + 2 * pad - k + 1) * (x.shape[-1] + 2 * pad - k + 1)
    g_s = None if g_s is None else (g_s / n)[..., None, None]
    g_c = None if g_c is None else (g_c / n)[..., None, None]
    return torch_ops_backward(x, y, w, "same" if pad else "valid", c1, c2, g_s, g_c, need_x, need_y)


class SSIMStatsCPUFn(torch.autograd.Function):
    """(x, y) -> per-(B, C) means of the SSIM and cs maps ("valid" on x, y seen with ``pad`` zero
    rows / columns around them), compiled kernel.

    Saves only the two inputs: the backward recomputes the statistics row by row as it writes the
    gradient. Under ``create_graph=True`` the backward runs the torch-ops adjoint instead, so a
    double backward works (at torch-ops speed) instead of failing.
    """

    @staticmethod
    def forward(ctx, x, y, w, c1, c2, pad):
        x, y = x.contiguous(), y.contiguous()
        ctx.set_materialize_grads(False)
        ctx.c1, ctx.c2, ctx.pad = c1, c2, pad
        ctx.save_for_backward(x, y, w)
        return _forward(get(x.dtype, w.numel()), x, y, w, c1, c2, pad)

    @staticmethod
    def backward(ctx, g_s, g_c):
        x, y, w = ctx.saved_tensors
        need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        none = (None,) * 4
        if (g_s is None and g_c is None) or not (need_x or need_y):
            return (None, None) + none
        if torch.is_grad_enabled() or _batched(g_s) or _batched(g_c):
            # create_graph=True needs a differentiable backward, and autograd.grad(...,
            # is_grads_batched=True) vmaps it over batched upstreams: both take the torch ops.
            return _torch_ops_grads(x, y, w, ctx.pad, ctx.c1, ctx.c2, g_s, g_c, need_x, need_y) + none
        zeros = torch.zeros(x.shape[:2], dtype=x.dtype)
        g_s = zeros if g_s is None else g_s
        g_c = zeros if g_c is None else g_c
        gx, gy = _backward(get(x.dtype, w.numel()), x, y, w, ctx.c1, ctx.c2, g_s, g_c, need_x, need_y, ctx.pad)
        return (gx, gy) + none


class DSSIML1CPUFn(torch.autograd.Function):
    """(x, y) -> per image ``(1 - lam) * mean|x - y| + lam * (1 - mean SSIM)`` ``[B]``, one kernel:
    the L1 term's gradient is added in the same pass that writes the SSIM gradient."""

    @staticmethod
    def forward(ctx, x, y, w, c1, c2, pad, lam):
        x, y = x.contiguous(), y.contiguous()
        ctx.c1, ctx.c2, ctx.pad, ctx.lam = c1, c2, pad, lam
        ctx.save_for_backward(x, y, w)
        s, _, l1 = _forward(get(x.dtype, w.numel()), x, y, w, c1, c2, pad, l1=True)  # [B, C] each
        return (1 - lam) * l1.mean(dim=1) + lam * (1 - s.mean(dim=1))

    @staticmethod
    def backward(ctx, g):
        x, y, w = ctx.saved_tensors
        need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        none = (None,) * 5
        if not (need_x or need_y):
            return (None, None) + none
        C = x.shape[1]
        g_s = (-ctx.lam / C) * g[:, None].expand(-1, C)  # d loss / d mean-SSIM of each plane
        g_l1 = ((1 - ctx.lam) / C) * g[:, None].expand(-1, C)  # d loss / d mean|x - y| of each plane
        if torch.is_grad_enabled() or _batched(g):
            gx, gy = _torch_ops_grads(x, y, w, ctx.pad, ctx.c1, ctx.c2, g_s, None, need_x, need_y)
            sg = torch.sign(x - y) * (g_l1 / (x.shape[-2] * x.shape[-1]))[..., None, None]
            return (None if gx is None else gx + sg, None if gy is None else gy - sg) + none
        gx, gy = _backward(get(x.dtype, w.numel()), x, y, w, ctx.c1, ctx.c2, g_s, torch.zeros_like(g_s),
                           need_x, need_y, ctx.pad, g_l1)
        return (gx, gy) + none


def ssim_stats(img1: torch.Tensor, img2: torch.Tensor, cfg) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(ssim_mean, cs_mean)`` [B, C] through the kernel; the caller checked :func:`fast_path_ok`."""
    x, y, pad = padded(img1, img2, cfg)
    w = cfg.window_1d(x.dtype, "cpu")
    return SSIMStatsCPUFn.apply(x, y, w, cfg.C1, cfg.C2, pad)


def dssim_l1(img1: torch.Tensor, img2: torch.Tensor, cfg, lam: float) -> torch.Tensor:
    """Per image ``(1 - lam) * mean|x - y| + lam * (1 - mean SSIM)`` ``[B]``; the caller checked
    :func:`fast_path_ok`. "valid" and "same" run fused; "reflect" adds a torch L1 to the kernel's
    SSIM (its padded copy must not enter the L1 term)."""
    if cfg.padding == "reflect":
        acc = accumulation_dtype(img1.dtype)
        l1 = (img1.to(acc) - img2.to(acc)).abs().mean(dim=(1, 2, 3))
        s, _ = ssim_stats(img1, img2, cfg)
        return (1 - lam) * l1 + lam * (1 - s.mean(dim=1))
    x, y, pad = padded(img1, img2, cfg)
    w = cfg.window_1d(x.dtype, "cpu")
    return DSSIML1CPUFn.apply(x, y, w, cfg.C1, cfg.C2, pad, float(lam))


def ssim_mean_and_grad(img1: torch.Tensor, img2: torch.Tensor, cfg, upstream: torch.Tensor):
    """``(ssim_mean [B, C], d sum(upstream * ssim_mean) / d img1)`` without a graph (accumulation
    dtype); the caller checked :func:`fast_path_ok`."""
    with torch.no_grad():
        x, y, pad = padded(img1.detach(), img2.detach(), cfg)
        x, y = x.contiguous(), y.contiguous()
        lib = get(x.dtype, cfg.window_size)
        w = cfg.window_1d(x.dtype, "cpu")
        s, _ = _forward(lib, x, y, w, cfg.C1, cfg.C2, pad)
        up = upstream.to(x.dtype)
        gx, _ = _backward(lib, x, y, w, cfg.C1, cfg.C2, up, torch.zeros_like(up), True, False, pad)
    return s, unpad_grad(gx, cfg, img1.shape[-2:])


# ----------------------------------------------------------------------------------------------
# MS-SSIM: the pyramid step in the kernel library too (torch's CPU avg_pool2d forward+backward
# cost about as much as the SSIM of the finer scale it feeds)
# ----------------------------------------------------------------------------------------------


def _down2_torch(x: torch.Tensor) -> torch.Tensor:
    """The same pyramid step in torch ops (``functional._downsample2x``), for transforms."""
    h, w = x.shape[-2:]
    if h % 2 or w % 2:
        x = F.pad(x, (0, w % 2, 0, h % 2), mode="replicate")
    return F.avg_pool2d(x, kernel_size=2, stride=2)


def _down2_adjoint_torch(g: torch.Tensor, size) -> torch.Tensor:
    """Adjoint of the pyramid step in torch ops (differentiable in ``g``, vmap-friendly)."""
    h, w = size
    up = g.repeat_interleave(2, dim=-2).repeat_interleave(2, dim=-1) * 0.25  # [.., 2*ceil(h/2), 2*ceil(w/2)]
    if h % 2:
        up = torch.cat([up[..., : h - 1, :], up[..., h - 1 : h, :] + up[..., h:, :]], dim=-2)
    if w % 2:
        up = torch.cat([up[..., : w - 1], up[..., w - 1 : w] + up[..., w:]], dim=-1)
    return up


class Down2CPUFn(torch.autograd.Function):
    """TF ``ssim_multiscale`` pyramid step (repeat an odd side's last row / column, 2x2 mean)."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        B, C, H, W = x.shape
        ctx.size = (H, W)
        out = torch.empty(B, C, (H + 1) // 2, (W + 1) // 2, dtype=x.dtype)
        get(x.dtype, FIXED_TAPS).splat_down2_fwd(x.data_ptr(), B * C, H, W, out.data_ptr())
        return out

    @staticmethod
    def backward(ctx, g):
        if torch.is_grad_enabled() or _batched(g):
            return _down2_adjoint_torch(g, ctx.size)
        g = g.contiguous()
        B, C = g.shape[:2]
        H, W = ctx.size
        gx = torch.empty(B, C, H, W, dtype=g.dtype)
        get(g.dtype, FIXED_TAPS).splat_down2_bwd(g.data_ptr(), B * C, H, W, gx.data_ptr(), 0)
        return gx


def _down2(x: torch.Tensor) -> torch.Tensor:
    B, C, H, W = x.shape
    out = torch.empty(B, C, (H + 1) // 2, (W + 1) // 2, dtype=x.dtype)
    get(x.dtype, FIXED_TAPS).splat_down2_fwd(x.data_ptr(), B * C, H, W, out.data_ptr())
    return out


class MSTermsCPUFn(torch.autograd.Function):
    """(x, y) -> MS-SSIM terms ``[B, C, M]`` (cs at scales 1..M-1, SSIM at scale M), pyramid and
    all scales in one node.

    Saves the two pyramids (a third of an image each beyond the inputs). The backward walks the
    scales coarse to fine, adding each scale's kernel gradient to the adjoint of the pyramid step
    from the coarser one in place, so no per-scale gradient is summed by autograd.
    """

    @staticmethod
    def forward(ctx, x, y, w, c1, c2, pad, scales):
        x, y = x.contiguous(), y.contiguous()
        lib = get(x.dtype, w.numel())
        xs, ys, terms = [x], [y], []
        for j in range(scales):
            if j > 0:
                xs.append(_down2(xs[-1]))
                ys.append(_down2(ys[-1]))
            s, c = _forward(lib, xs[j], ys[j], w, c1, c2, pad)
            terms.append(c if j < scales - 1 else s)
        ctx.c1, ctx.c2, ctx.pad, ctx.scales = c1, c2, pad, scales
        ctx.save_for_backward(w, *xs, *ys)
        return torch.stack(terms, dim=-1)

    @staticmethod
    def backward(ctx, g):
        w, *pyr = ctx.saved_tensors
        M = ctx.scales
        xs, ys = pyr[:M], pyr[M:]
        need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        none = (None,) * 5
        if not (need_x or need_y):
            return (None, None) + none
        plain = not (torch.is_grad_enabled() or _batched(g))
        if not plain:  # the saved levels carry no graph: rebuild them from the inputs in torch ops
            xs, ys = [xs[0]], [ys[0]]
            for _ in range(M - 1):
                xs.append(_down2_torch(xs[-1]))
                ys.append(_down2_torch(ys[-1]))
        lib = get(xs[0].dtype, w.numel())
        zeros = torch.zeros(xs[0].shape[:2], dtype=xs[0].dtype)
        gx = gy = None
        for j in range(M - 1, -1, -1):
            g_s = g[..., j] if j == M - 1 else None
            g_c = g[..., j] if j < M - 1 else None
            if plain:
                gxj, gyj = _backward(lib, xs[j], ys[j], w, ctx.c1, ctx.c2, zeros if g_s is None else g_s,
                                     zeros if g_c is None else g_c, need_x, need_y, ctx.pad)
                B, C, H, W = xs[j].shape
                for acc, coarse in ((gxj, gx), (gyj, gy)):
                    if acc is not None and coarse is not None:  # acc += pyramid-step adjoint of coarse
                        lib.splat_down2_bwd(coarse.contiguous().data_ptr(), B * C, H, W, acc.data_ptr(), 1)
            else:  # create_graph / batched upstreams: the same walk in differentiable torch ops
                gxj, gyj = _torch_ops_grads(xs[j], ys[j], w, ctx.pad, ctx.c1, ctx.c2, g_s, g_c, need_x, need_y)
                size = xs[j].shape[-2:]
                if gx is not None:
                    gxj = gxj + _down2_adjoint_torch(gx, size)
                if gy is not None:
                    gyj = gyj + _down2_adjoint_torch(gy, size)
            gx, gy = gxj, gyj
        return (gx, gy) + none


def ms_ssim(img1: torch.Tensor, img2: torch.Tensor, cfg: SSIMConfig, weights, tau=None) -> torch.Tensor:
    """MS-SSIM per image ``[B]`` through the kernel (pyramid and per-scale statistics); the caller
    checked :func:`fast_path_ok`. Same composition as ``functional`` (its ``_combine_ms``)."""
    from ...functional import _combine_ms  # imported here: functional imports the backends

    if cfg.padding != "reflect":  # zeros or none: the kernel pads implicitly, one node for all
        x, y, pad = padded(img1, img2, cfg)
        w = cfg.window_1d(x.dtype, "cpu")
        return _combine_ms(MSTermsCPUFn.apply(x, y, w, cfg.C1, cfg.C2, pad, len(weights)), weights, tau)
    acc = accumulation_dtype(img1.dtype)
    x, y = img1.to(acc), img2.to(acc)
    terms = []
    for j in range(len(weights)):
        if j > 0:
            x = Down2CPUFn.apply(x)
            y = Down2CPUFn.apply(y) if y.requires_grad else Down2CPUFn.apply(y.detach())
        s, c = ssim_stats(x, y, cfg)  # [B, C] each
        terms.append(c if j < len(weights) - 1 else s)
    return _combine_ms(torch.stack(terms, dim=-1), weights, tau)
