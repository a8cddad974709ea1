#!/usr/bin/env python
"""Time SSIM, MS-SSIM and the D-SSIM + L1 loss: every splatloss backend beside every installed peer.

Same inputs for everyone, one process, runs alternating (the library order rotates each round)
after a warm-up; medians, ratios to a baseline (pytorch-msssim by default) and, with ``--memory``,
the added peak memory of each library measured in a fresh process. On a CUDA machine the same
script times the Triton backend and fused-ssim with ``triton.testing.do_bench``.

``dssim_l1_masked`` is 3DGS's loss with an irregular soft alpha mask (``mask=``), ``ms_ssim_masked``
the MS-SSIM loss with it; peers have no mask argument, so their rows time the workaround gsplat and
nerfstudio use: both images multiplied by the mask, then the unmasked loss (a different loss, timed
for its cost).

Examples::

    python tools/bench.py --threads 1                       # 1x3x256x256 and 1x3x720x1280, one thread
    python tools/bench.py --sizes 720x1280 --memory --cold-start --json bench.json --plot bench.png
    python tools/bench.py --full                            # 256x256 .. 1080x1920, C 1/3, B 1/8

How memory is measured: each (library, op, size) runs in a fresh Python process. After one warm-up
call (compilation, caches; its gradient dropped), two more calls run, each after dropping the
previous one's gradient, and each is measured one way; the figure is the larger of the two. Both
count the gradient the call leaves in ``x.grad``.

- Torch's allocator: torch's profiler (``profile_memory=True``) records every allocation and free
  of torch's CPU allocator in order; the figure is the largest number of bytes the call had
  allocated and not yet freed at any moment. Exact to the byte and the same on every run, but blind
  to memory that bypasses torch's allocator (a library's own ``malloc``).
- The resident set: glibc is told to serve every allocation of 64 KiB or more with mmap and hand it
  back on free (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``), so the resident set follows
  live memory; the kernel's peak-RSS counter is reset (``/proc/self/clear_refs``) and the figure
  is the peak RSS during the call minus the RSS just before it. It sees every allocator, but reads
  low by up to a few hundred KiB (Linux samples the peak from per-CPU counters that lag) and misses
  smaller allocations that glibc serves from memory already resident, so a call of a few hundred
  KiB can read as 0.

Each is a lower bound of what the call added; at 1x3x720x1280 forward + backward on an AVX2 core
they agreed within 2.1 % for splatloss-torch, the reference and pytorch-msssim. The JSON keeps
both (``peak_allocated_bytes``, ``peak_rss_added_bytes``). On CUDA the figure is
``torch.cuda.max_memory_allocated`` over the call minus the memory allocated before it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _early_threads(argv) -> None:
    """Set the OpenMP / MKL thread counts before torch is imported (torch reads them at start)."""
    n = None
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            n = argv[i + 1]
        elif a.startswith("--threads="):
            n = a.split("=", 1)[1]
    if n is not None:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(n)


_early_threads(sys.argv[1:])

import torch  # noqa: E402

from splatloss.atomic import atomic_output  # noqa: E402

OPS = ("ssim", "ms_ssim", "dssim_l1", "dssim_l1_masked", "ms_ssim_masked")
#: The masked ops and the unmasked op the peers' workaround runs for each.
MASKED = {"dssim_l1_masked": "dssim_l1", "ms_ssim_masked": "ms_ssim"}
MODES = ("fwdbwd", "fwd")
SPLAT_LIBS = ("splatloss-torch", "splatloss-torch-ops", "splatloss-reference", "splatloss-triton")
PEER_LIBS = ("pytorch_msssim", "piq", "torchmetrics", "kornia", "fused_ssim")
# The design not taken, for comparison: torch.compile (inductor) of the plain autograd reference.
# Not in the default set: each op, mode and size compiles anew (tens of seconds each).
# "splatloss-triton-graphed": the Triton loss forward + backward captured once in a CUDA graph and
# replayed (torch.cuda.make_graphed_callables): the kernels' own time, without Python and launch
# overhead.
EXTRA_LIBS = ("compiled-reference", "splatloss-triton-graphed")
DEFAULT_LIBS = SPLAT_LIBS + PEER_LIBS
ALL_LIBS = DEFAULT_LIBS + EXTRA_LIBS
LAM = 0.2  # 3DGS: (1 - lam) * L1 + lam * (1 - SSIM)
PADDING = {"padding": "valid"}  # splatloss's ssim / ms_ssim padding (--padding); dssim_l1 is 3DGS's "same"
# The arithmetic floor, FMA per pixel-channel: the five moment maps x, y, x^2, y^2, xy filtered with
# 2 x 11 separable taps (forward) and three adjoint maps filtered the same way (backward), at the
# core's measured FMA peak. MS-SSIM counts every scale's pixels.
FLOOR_FMA = {"fwd": 5 * 22, "fwdbwd": 5 * 22 + 3 * 22}
MS_SCALES = 5


# ------------------------------------------------------------------------------------------------
# Libraries: each entry builds ``loss(x, y) -> scalar`` for an op, or says why it cannot
# ------------------------------------------------------------------------------------------------


class Unavailable(Exception):
    """This library cannot run this op here (not installed, needs CUDA, no such op)."""


def _splat(backend: str, op: str, device: str, plain_torch: bool = False):
    from splatloss import functional as SF

    if backend == "triton" and device != "cuda":
        raise Unavailable("needs CUDA (the CPU only runs Triton's interpreter, which is no benchmark)")
    if plain_torch:
        if device != "cpu":
            raise Unavailable("the compiled kernel is CPU-only; on other devices 'torch' is already the torch-ops path")
    if op == "ssim":
        fn = lambda x, y: 1 - SF.ssim(x, y, backend=backend, **PADDING)  # noqa: E731
    elif op == "ms_ssim":
        fn = lambda x, y: 1 - SF.ms_ssim(x, y, backend=backend, **PADDING)  # noqa: E731
    elif op == "dssim_l1_masked":  # 3DGS's loss with an irregular soft (1, 1, H, W) alpha mask
        masks = {}

        def fn(x, y):
            return SF.dssim_l1(x, y, LAM, padding="same", backend=backend, mask=_mask_for(x, masks))

    elif op == "ms_ssim_masked":  # the MS-SSIM loss under the same alpha mask
        masks = {}

        def fn(x, y):
            return 1 - SF.ms_ssim(x, y, backend=backend, mask=_mask_for(x, masks), **PADDING)

    else:  # 3DGS's loss: zero ("same") padding
        fn = lambda x, y: SF.dssim_l1(x, y, LAM, padding="same", backend=backend)  # noqa: E731
    return fn


def alpha_mask(h: int, w: int, device="cpu") -> torch.Tensor:
    """An irregular soft ``(1, 1, H, W)`` alpha: an object with a wavy outline (1), transparent background
    (0), a soft edge, and a transparent hole inside the object; the same for every run of a size."""
    yy = torch.linspace(-1, 1, h, device=device)[:, None]
    xx = torch.linspace(-1, 1, w, device=device)[None, :]
    r = (xx * xx + 1.5 * yy * yy).sqrt() + 0.06 * torch.sin(9 * xx) * torch.cos(7 * yy)
    alpha = torch.sigmoid(20 * (0.6 - r))
    hole = ((xx - 0.2) ** 2 + (yy + 0.15) ** 2).sqrt()
    return (alpha * torch.sigmoid(30 * (hole - 0.12)))[None, None]


def _mask_for(x: torch.Tensor, cache: dict) -> torch.Tensor:
    key = (tuple(x.shape[-2:]), x.device)
    if key not in cache:
        cache[key] = alpha_mask(*key[0], device=x.device)
    return cache[key]


def _multiply_by_mask(loss):
    """What gsplat and nerfstudio do with a mask: multiply both images by it, then the unmasked loss
    (masked pixels turn black, leak into their neighbours' statistics and still count in the means)."""
    masks = {}

    def fn(x, y):
        m = _mask_for(x, masks)
        return loss(x * m, y * m)

    return fn


def _pytorch_msssim(op: str, device: str):
    try:
        import pytorch_msssim as pm
    except ImportError as exc:
        raise Unavailable(f"not installed ({exc})")
    if op == "ssim":
        return lambda x, y: 1 - pm.ssim(x, y, data_range=1.0, size_average=True)
    if op == "ms_ssim":
        return lambda x, y: 1 - pm.ms_ssim(x, y, data_range=1.0, size_average=True)
    return lambda x, y: (1 - LAM) * (x - y).abs().mean() + LAM * (1 - pm.ssim(x, y, data_range=1.0, size_average=True))


def _piq(op: str, device: str):
    try:
        import piq
    except Exception as exc:  # ImportError, or torchvision failing to load beside this torch
        raise Unavailable(f"not installed or not importable ({type(exc).__name__}: {str(exc)[:80]})")
    if op == "ssim":
        return lambda x, y: 1 - piq.ssim(x, y, data_range=1.0)
    if op == "ms_ssim":
        return lambda x, y: 1 - piq.multi_scale_ssim(x, y, data_range=1.0)
    return lambda x, y: (1 - LAM) * (x - y).abs().mean() + LAM * (1 - piq.ssim(x, y, data_range=1.0))


def _torchmetrics(op: str, device: str):
    try:
        from torchmetrics.functional.image import (
            multiscale_structural_similarity_index_measure as tm_ms,
        )
        from torchmetrics.functional.image import (
            structural_similarity_index_measure as tm_ssim,
        )
    except ImportError as exc:
        raise Unavailable(f"not installed ({exc})")
    if op == "ssim":
        return lambda x, y: 1 - tm_ssim(x, y, data_range=1.0)
    if op == "ms_ssim":
        return lambda x, y: 1 - tm_ms(x, y, data_range=1.0)
    return lambda x, y: (1 - LAM) * (x - y).abs().mean() + LAM * (1 - tm_ssim(x, y, data_range=1.0))


def _kornia(op: str, device: str):
    try:
        import kornia
    except ImportError as exc:
        raise Unavailable(f"not installed ({exc})")
    if op == "ms_ssim":
        # kornia.losses.MS_SSIMLoss is Zhao et al.'s mixed MS-SSIM + L1 loss with its own sigmas,
        # not MS-SSIM: timing it beside MS-SSIM would compare different things.
        raise Unavailable("has no plain MS-SSIM (MS_SSIMLoss is a different, mixed loss)")
    ssim = lambda x, y: kornia.metrics.ssim(x, y, window_size=11, max_val=1.0).mean()  # noqa: E731
    if op == "ssim":
        return lambda x, y: 1 - ssim(x, y)
    return lambda x, y: (1 - LAM) * (x - y).abs().mean() + LAM * (1 - ssim(x, y))


def _fused_ssim(op: str, device: str):
    try:
        from fused_ssim import fused_ssim
    except Exception as exc:
        raise Unavailable(f"not installed ({type(exc).__name__})")
    if device != "cuda":
        raise Unavailable("CUDA only")
    if op == "ms_ssim":
        raise Unavailable("has no MS-SSIM")

    def float32_only(x):
        # its kernels read float: a refusal of the dtype, not a CUDA failure (later rows stay unmarked)
        if x.dtype != torch.float32:
            raise Unavailable("float32 only")

    def ssim_loss(x, y):
        float32_only(x)
        return 1 - fused_ssim(x, y, padding="valid", train=torch.is_grad_enabled())

    def dssim_l1(x, y):
        float32_only(x)
        ssim = fused_ssim(x, y, padding="same", train=torch.is_grad_enabled())
        return (1 - LAM) * (x - y).abs().mean() + LAM * (1 - ssim)

    return ssim_loss if op == "ssim" else dssim_l1


def _graphed(loss):
    """``loss`` captured in a CUDA graph on its first forward + backward, replayed after."""
    graphs = {}

    def fn(x, y):
        if not torch.is_grad_enabled():
            raise Unavailable("graphed forward + backward only")
        key = (x.shape, x.dtype, x.stride(), y.shape, y.stride())
        if key not in graphs:
            sample = (x.detach().clone().requires_grad_(x.requires_grad), y.detach().clone())
            graphs[key] = torch.cuda.make_graphed_callables(loss, sample)
        return graphs[key](x, y)

    return fn


def _compiled_reference(op: str, device: str):
    from splatloss import functional as SF

    if op == "ssim":
        fn = lambda x, y: 1 - SF.ssim(x, y, backend="reference")  # noqa: E731
    elif op == "ms_ssim":
        fn = lambda x, y: 1 - SF.ms_ssim(x, y, backend="reference")  # noqa: E731
    else:
        fn = lambda x, y: SF.dssim_l1(x, y, LAM, padding="same", backend="reference")  # noqa: E731
    return torch.compile(fn, dynamic=False)


def make_loss(lib: str, op: str, device: str):
    """``loss(x, y)`` for ``lib`` and ``op``; raises :class:`Unavailable` with the reason."""
    if op in MASKED and lib == "compiled-reference":
        raise Unavailable("not timed with a mask")
    if op in MASKED and not lib.startswith("splatloss"):
        # no mask argument: the peers' usual workaround, a different loss, timed for its cost
        return _multiply_by_mask(make_loss(lib, MASKED[op], device))
    if lib == "splatloss-torch":  # what "auto" runs: the C kernel on the CPU, torch ops elsewhere
        return _splat("cpu" if device == "cpu" else "torch", op, device)
    if lib == "splatloss-torch-ops":
        return _splat("torch", op, device, plain_torch=True)
    if lib == "splatloss-reference":
        return _splat("reference", op, device)
    if lib == "splatloss-triton":
        return _splat("triton", op, device)
    if lib == "splatloss-triton-graphed":
        return _graphed(_splat("triton", op, device))
    if lib == "compiled-reference":
        return _compiled_reference(op, device)
    return {
        "pytorch_msssim": _pytorch_msssim,
        "piq": _piq,
        "torchmetrics": _torchmetrics,
        "kornia": _kornia,
        "fused_ssim": _fused_ssim,
    }[lib](op, device)


# ------------------------------------------------------------------------------------------------
# Inputs and one timed call
# ------------------------------------------------------------------------------------------------


def make_inputs(b, c, h, w, dtype, device, seed=0):
    """A rendered-looking pair: a smooth random image and a noisy, shifted copy of it."""
    g = torch.Generator().manual_seed(seed)
    base = torch.rand(b, c, (h + 7) // 8, (w + 7) // 8, generator=g)
    base = torch.nn.functional.interpolate(base, size=(h, w), mode="bilinear", align_corners=False)
    x = (base + 0.05 * torch.randn(b, c, h, w, generator=g)).clamp(0, 1)
    y = (0.9 * base + 0.05 + 0.05 * torch.randn(b, c, h, w, generator=g)).clamp(0, 1)
    return x.to(device=device, dtype=dtype), y.to(device=device, dtype=dtype)


def make_call(loss, x, y, mode):
    """A closure running one forward (no graph) or one forward+backward of ``loss`` on ``x``, ``y``."""
    if mode == "fwd":
        xi = x.detach()

        def call():
            with torch.no_grad():
                return loss(xi, y)

        call.reset = lambda: None
        return call
    xg = x.detach().clone().requires_grad_(True)

    def call():
        xg.grad = None
        out = loss(xg, y)
        out.backward()
        return out

    call.reset = lambda: setattr(xg, "grad", None)
    return call


def floor_fma(op: str, mode: str, shape) -> float:
    """FMA lanes of the arithmetic floor of ``op`` in ``mode`` on ``shape`` (see FLOOR_FMA)."""
    b, c, h, w = shape
    pixels = 0
    for _ in range(MS_SCALES if op in ("ms_ssim", "ms_ssim_masked") else 1):
        pixels += h * w
        h, w = (h + 1) // 2, (w + 1) // 2
    return FLOOR_FMA[mode] * b * c * pixels


class FmaPeak:
    """The core's FMA rate, measured with the C kernel's own microkernel (same compiler, flags and
    vector type as the kernel): one short run per call of :meth:`sample`, timed on the wall clock and
    on this process's CPU time, so each timed round has its own peak beside it."""

    def __init__(self, seconds: float = 0.02):
        from splatloss.backends.cpu import library

        self.library = library
        self.lib = library.get(torch.float32, library.FIXED_TAPS)
        if self.lib is None:
            raise Unavailable(f"the C kernel is unavailable: {library.unavailable_reason()}")
        rate = library.fma_peak(self.lib, seconds, 3)
        self.iters = max(1, int(rate * seconds / library.fma_lanes(self.lib, 1)))
        self.vector_width = int(self.lib.splat_ssim_vector_width())

    def sample(self):
        """(lanes per second on the wall clock, lanes per second of process CPU time)."""
        c0, t0 = time.process_time(), time.perf_counter()
        lanes = self.library.fma_lanes(self.lib, self.iters)
        return lanes / max(time.perf_counter() - t0, 1e-9), lanes / max(time.process_time() - c0, 1e-9)


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


#: Relative tolerance of the value check (:func:`check_values`): float32 / float64, and half precision.
VALUE_RTOL = {True: 1e-3, False: 5e-2}


def same_loss(lib: str, op: str) -> bool:
    """Whether ``lib``'s ``op`` is the very loss splatloss computes (so their values must agree):
    every splatloss library; fused-ssim's D-SSIM + L1 ("same" padding, as 3DGS) and SSIM when
    splatloss's SSIM padding is "valid" (fused-ssim's); pytorch-msssim's SSIM likewise (11-tap
    Gaussian, sigma 1.5, "valid"). The other peers' conventions differ (MS-SSIM pyramids, masks
    multiplied in, downsampling)."""
    if lib.startswith("splatloss") or lib == "compiled-reference":
        return True
    valid = PADDING["padding"] == "valid"
    if lib == "fused_ssim":
        return op == "dssim_l1" or (op == "ssim" and valid)
    return lib == "pytorch_msssim" and op == "ssim" and valid


def check_values(records, dtype) -> None:
    """Mark every record whose first call's loss value disagrees with the first splatloss
    library's on the same inputs (``value_mismatch``, ``?`` in the table, a warning on stderr): a
    time is only worth printing for a call that computed the loss."""
    ref = next((r for r in records if r["lib"].startswith("splatloss") and "value" in r), None)
    if ref is None:
        return
    rtol = VALUE_RTOL[dtype in (torch.float32, torch.float64)]
    for r in records:
        if r is ref or "value" not in r or not same_loss(r["lib"], r["op"]):
            continue
        if not abs(r["value"] - ref["value"]) <= rtol * max(abs(ref["value"]), 1e-3):
            r["value_mismatch"] = f"{r['value']:.6g} against {ref['lib']}'s {ref['value']:.6g}"
            print(
                f"warning: {r['lib']} {r['op']} {r['mode']} {r['batch']}x{r['channels']}x{r['height']}x{r['width']}: "
                f"loss {r['value_mismatch']} (relative tolerance {rtol:g}); its time is marked '?'",
                file=sys.stderr,
            )


#: The first library call that raised on CUDA in this process ("lib op mode shape: error"), or None.
#: A call that fails on CUDA can leave the device in a state where later work silently does not
#: run (after a CUDA graph capture failed part-way, fused-ssim, which launches on the legacy
#: default stream without checking its launches, timed 2 to 4 times too fast in one run), so every
#: CUDA record timed after it carries ``after_cuda_error`` and the table marks it with ``!``.
CUDA_FAILURE = None


def time_config(libs, op, mode, shape, dtype, device, repeats, warmup, baseline, peak=None):
    """Median time of each library on one configuration, runs alternating; list of records."""
    global CUDA_FAILURE
    b, c, h, w = shape
    x, y = make_inputs(b, c, h, w, dtype, device)
    calls, records = {}, {}
    for lib in libs:
        rec = dict(
            op=op,
            mode=mode,
            lib=lib,
            batch=b,
            channels=c,
            height=h,
            width=w,
            dtype=str(dtype).replace("torch.", ""),
            device=device,
            threads=torch.get_num_threads(),
        )
        records[lib] = rec
        try:
            call = make_call(make_loss(lib, op, device), x, y, mode)
            _sync(device)
            t0 = time.perf_counter()
            out = call()  # first call: compiles / builds caches
            _sync(device)
            rec["first_call_ms"] = 1e3 * (time.perf_counter() - t0)
            if isinstance(out, torch.Tensor) and out.numel() == 1:
                rec["value"] = float(out.detach().double())
            for _ in range(warmup):
                call()
            calls[lib] = call
        except Unavailable as exc:
            rec["skipped"] = str(exc)
        except Exception as exc:  # a library that fails on this input: say so, keep going
            rec["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            if device == "cuda" and CUDA_FAILURE is None:
                CUDA_FAILURE = f"{lib} {op} {mode} {'x'.join(map(str, shape))}: {rec['error'][:120]}"
                print(
                    f"warning: {CUDA_FAILURE}; the CUDA rows timed after it are marked '!' (re-time them "
                    "in a fresh process)",
                    file=sys.stderr,
                )
    times = {lib: [] for lib in calls}
    cpu = {lib: [] for lib in calls}  # process CPU time: less disturbed by other jobs on a shared machine
    if device == "cuda":
        from triton.testing import do_bench

        for lib, call in calls.items():
            times[lib] = [do_bench(call, warmup=25, rep=max(100, 20 * repeats), return_mode="median")]
    else:
        order = list(calls)
        fmas = floor_fma(op, mode, shape)
        floors = {lib: [] for lib in calls}  # per run: (time / floor on the wall, on CPU time)
        peaks = []
        for r in range(repeats):
            k = r % len(order) if order else 0
            for lib in order[k:] + order[:k]:  # rotate: nobody always runs right after the same peer
                c0, t0 = time.process_time(), time.perf_counter()
                calls[lib]()
                times[lib].append(1e3 * (time.perf_counter() - t0))
                cpu[lib].append(1e3 * (time.process_time() - c0))
                if peak is not None:  # the peak right after each run: the same state of the machine
                    pw, pc = peak.sample()
                    peaks.append((pw, pc))
                    floors[lib].append((times[lib][-1] * 1e-3 * pw / fmas, cpu[lib][-1] * 1e-3 * pc / fmas))
        if peak is not None:
            for lib, fl in floors.items():
                if fl:
                    records[lib]["floor_fma"] = fmas
                    records[lib]["fma_peak_lanes_per_s"] = statistics.median(p for p, _ in peaks)
                    records[lib]["x_floor"] = statistics.median(a for a, _ in fl)
                    records[lib]["cpu_x_floor"] = statistics.median(b for _, b in fl)
    check_values(list(records.values()), dtype)
    for lib, ts in times.items():
        if CUDA_FAILURE is not None:
            records[lib]["after_cuda_error"] = CUDA_FAILURE
        records[lib]["median_ms"] = statistics.median(ts)
        records[lib]["times_ms"] = [round(t, 3) for t in ts]
        if cpu[lib]:
            records[lib]["cpu_median_ms"] = statistics.median(cpu[lib])
    base = records.get(baseline, {}).get("median_ms")
    for rec in records.values():
        if base and "median_ms" in rec:
            rec[f"speedup_vs_{baseline}"] = base / rec["median_ms"]
    cbase = records.get(baseline, {}).get("cpu_median_ms")
    for rec in records.values():
        if cbase and "cpu_median_ms" in rec:
            rec[f"cpu_speedup_vs_{baseline}"] = cbase / rec["cpu_median_ms"]
    return list(records.values())


# ------------------------------------------------------------------------------------------------
# Memory and cold start: fresh processes
# ------------------------------------------------------------------------------------------------


def _status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, val = line.split(":")
                out[key] = int(val.split()[0]) * 1024
    return out


def memory_child(lib, op, mode, shape, dtype, device):
    """Run in a fresh process: added peak memory of one call, as a dict (printed as JSON)."""
    b, c, h, w = shape
    x, y = make_inputs(b, c, h, w, dtype, device)
    try:
        call = make_call(make_loss(lib, op, device), x, y, mode)
    except Unavailable as exc:
        return {"skipped": str(exc)}
    call()  # warm-up: compilation, lazy imports and caches are not the call's memory
    call.reset()  # drop the warm-up's gradient: the measured call allocates (and keeps) its own
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        call()
        torch.cuda.synchronize()
        return {"peak_added_bytes": torch.cuda.max_memory_allocated() - before, "method": "cuda_max_memory_allocated"}
    import gc

    from torch.profiler import ProfilerActivity, profile

    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = _status()["VmRSS"]
    call()
    rss = _status()["VmHWM"] - before
    call.reset()
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        call()
    allocated = _peak_allocated(prof.profiler.kineto_results.events())
    return {
        "peak_added_bytes": max(allocated, rss),
        "peak_allocated_bytes": allocated,
        "peak_rss_added_bytes": rss,
        "method": "max(cpu_allocator_peak, peak_rss_delta_mmap)",
    }


def _peak_allocated(events):
    """The largest running total of torch's CPU allocations less frees over the profiled events."""
    cpu = torch._C._autograd.DeviceType.CPU
    deltas = [(e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]" and e.device_type() == cpu]
    total = peak = 0
    for _, nbytes in sorted(deltas, key=lambda d: d[0]):  # stable: same-instant events keep their order
        total += nbytes
        peak = max(peak, total)
    return peak


def run_memory(lib, op, mode, shape, dtype, device, threads):
    env = dict(os.environ)
    env.update(
        MALLOC_MMAP_THRESHOLD_="65536",
        MALLOC_TRIM_THRESHOLD_="65536",
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
    )
    b, c, h, w = shape
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--_memory-child",
        lib,
        op,
        mode,
        f"{b}x{c}x{h}x{w}",
        str(dtype).replace("torch.", ""),
        device,
        "--threads",
        str(threads),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:200]}
    return json.loads(lines[-1])


def cold_start_child(op, shape, dtype):
    """Fresh process with an empty kernel cache: time of the first and second forward+backward."""
    b, c, h, w = shape
    t0 = time.perf_counter()
    loss = make_loss("splatloss-torch", op, "cpu")
    x, y = make_inputs(b, c, h, w, dtype, "cpu")
    call = make_call(loss, x, y, "fwdbwd")
    t1 = time.perf_counter()
    call()
    t2 = time.perf_counter()
    call()
    t3 = time.perf_counter()
    return {"import_ms": 1e3 * (t1 - t0), "first_call_ms": 1e3 * (t2 - t1), "second_call_ms": 1e3 * (t3 - t2)}


def run_cold_start(op, shape, dtype, threads):
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, SPLATLOSS_CACHE_DIR=cache, OMP_NUM_THREADS=str(threads))
        b, c, h, w = shape
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--_cold-child",
            op,
            f"{b}x{c}x{h}x{w}",
            str(dtype).replace("torch.", ""),
            "--threads",
            str(threads),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:200]}
    return json.loads(lines[-1])


# ------------------------------------------------------------------------------------------------
# Output
# ------------------------------------------------------------------------------------------------


def machine_info(device):
    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": platform.processor(),
        "logical_cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def _fmt_mb(b):
    return "" if b is None else f"{b / 2**20:.1f}"


DTYPES = ("float32", "float16", "bfloat16", "float64")


def _dtype_suffix(record) -> str:
    """`` bfloat16`` after the shape of a record that is not float32 (float32 goes unsaid)."""
    dt = record.get("dtype", "float32")
    return "" if dt == "float32" else f" {dt}"


def _lib_label(r, after_cuda_error: str, value_mismatch: str) -> str:
    """A record's library name with the marks of :data:`CUDA_FAILURE` and :func:`check_values`."""
    return (
        r["lib"]
        + (after_cuda_error if "after_cuda_error" in r else "")
        + (value_mismatch if "value_mismatch" in r else "")
    )


def print_table(results, baseline, file=sys.stdout):
    key = f"speedup_vs_{baseline}"
    mkey = f"memory_ratio_vs_{baseline}"
    head = (
        f"{'op':9} {'mode':6} {'shape':25} {'library':21} {'median ms':>10} {'x ' + baseline[:14]:>17} "
        f"{'cpu ms':>8} {'x floor':>8} {'peak MB':>8} {'x mem':>6} {'first ms':>9}"
    )
    print(head, file=file)
    print("-" * len(head), file=file)
    for r in results:
        shape = f"{r['batch']}x{r['channels']}x{r['height']}x{r['width']}" + _dtype_suffix(r)
        if "median_ms" in r:
            ratio = f"{r[key]:.2f}" if key in r else ""
            mem = _fmt_mb(r.get("peak_added_bytes"))
            mratio = f"{r[mkey]:.1f}" if mkey in r else ""
            cpu = f"{r['cpu_median_ms']:.1f}" if "cpu_median_ms" in r else ""
            floor = f"{r['cpu_x_floor']:.2f}" if "cpu_x_floor" in r else ""
            lib = _lib_label(r, " !", " ?")
            print(
                f"{r['op']:9} {r['mode']:6} {shape:25} {lib:21} {r['median_ms']:10.2f} {ratio:>17} "
                f"{cpu:>8} {floor:>8} {mem:>8} {mratio:>6} {r.get('first_call_ms', 0):9.0f}",
                file=file,
            )
        else:
            why = r.get("skipped") or r.get("error", "")
            print(f"{r['op']:9} {r['mode']:6} {shape:25} {r['lib']:21} {'-':>10}  ({why[:70]})", file=file)


def markdown_table(results, baseline):
    """The timed records as a GitHub-flavoured markdown table (what README / docs show)."""
    key, ckey, mkey = f"speedup_vs_{baseline}", f"cpu_speedup_vs_{baseline}", f"memory_ratio_vs_{baseline}"
    lines = [
        f"| op | mode | B x C x H x W | library | wall ms (median) | x {baseline} | CPU ms (median) | x {baseline} "
        f"(CPU) "
        f"| x arithmetic floor (CPU) | added peak MiB | x less memory |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if "median_ms" not in r:
            continue
        shape = f"{r['batch']}x{r['channels']}x{r['height']}x{r['width']}" + _dtype_suffix(r)
        mem = r.get("peak_added_bytes")
        lib = _lib_label(r, " (timed after a CUDA failure)", " (value differs)")
        lines.append(
            f"| {r['op']} | {r['mode']} | {shape} | {lib} | {r['median_ms']:.1f} | "
            + (f"{r[key]:.1f}" if key in r else "")
            + " | "
            + (f"{r['cpu_median_ms']:.1f}" if "cpu_median_ms" in r else "")
            + " | "
            + (f"{r[ckey]:.1f}" if ckey in r else "")
            + " | "
            + (f"{r['cpu_x_floor']:.2f}" if "cpu_x_floor" in r else "")
            + " | "
            + ("" if mem is None else f"{mem / 2**20:.1f}")
            + " | "
            + (f"{r[mkey]:.1f}" if mkey in r else "")
            + " |"
        )
    return "\n".join(lines)


def write_json(path, payload):
    with atomic_output(path) as tmp:
        Path(tmp).write_text(json.dumps(payload, indent=1))


def plot(results, path, baseline):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = [op for op in OPS if any(r["op"] == op and "median_ms" in r for r in results)]
    if not ops:
        return
    fig, axes = plt.subplots(1, len(ops), figsize=(5.5 * len(ops), 4.5), squeeze=False)
    for ax, op in zip(axes[0], ops):
        rows = [r for r in results if r["op"] == op and r["mode"] == "fwdbwd" and "median_ms" in r]
        if not rows:
            rows = [r for r in results if r["op"] == op and "median_ms" in r]
        for lib in [l for l in ALL_LIBS if any(r["lib"] == l for r in rows)]:
            pts = sorted(
                (r["batch"] * r["channels"] * r["height"] * r["width"] / 1e6, r["median_ms"])
                for r in rows
                if r["lib"] == lib
            )
            color = plt.get_cmap("tab10")(ALL_LIBS.index(lib) % 10)  # one colour per library everywhere
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=lib, color=color)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("pixel-channels (millions)")
        ax.set_ylabel("median time (ms)")
        ax.set_title(f"{op}: {rows[0]['mode'] if rows else ''}, {rows[0]['threads'] if rows else ''} thread(s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, dpi=110, format=Path(path).suffix.lstrip(".") or "png")
    plt.close(fig)


# ------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------


def _csv(s):
    return [p.strip() for p in s.split(",") if p.strip()]


def _size(s):
    try:
        h, w = (int(v) for v in s.lower().split("x"))
    except ValueError:
        h = w = 0
    if h < 1 or w < 1:
        raise SystemExit(f"--sizes are HxW with H, W >= 1, e.g. 720x1280, got {s!r}")
    return h, w


def _ints(name, given):
    """A comma-separated list of integers >= 1 given to option ``name``, or exit naming it."""
    try:
        values = [int(v) for v in _csv(given)]
    except ValueError:
        raise SystemExit(f"{name} takes integers, got {given!r}")
    if not values or any(v < 1 for v in values):
        raise SystemExit(f"{name} must list integers >= 1, got {given!r}")
    return values


def _check_outputs(args):
    """Refuse, before anything runs, a --json or --plot path that cannot be written."""
    from splatloss.atomic import check_output_file

    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path is not None:
            try:
                check_output_file(flag, path)
            except ValueError as exc:
                raise SystemExit(str(exc)) from None


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sizes", default="256x256,720x1280", help="HxW list (default: 256x256,720x1280)")
    p.add_argument("--channels", default="3", help="channel counts, e.g. 1,3")
    p.add_argument("--batch", default="1", help="batch sizes, e.g. 1,8")
    p.add_argument("--ops", default=",".join(OPS), help=f"subset of {','.join(OPS)}")
    p.add_argument("--modes", default=",".join(MODES), help="fwdbwd (forward+backward) and/or fwd (forward, no graph)")
    p.add_argument(
        "--libs",
        default=",".join(DEFAULT_LIBS),
        help=f"subset of {','.join(ALL_LIBS)} (default: all but {','.join(EXTRA_LIBS)})",
    )
    p.add_argument("--baseline", default="pytorch_msssim", help="library the ratios are taken against")
    p.add_argument("--dtype", default="float32", help="input dtypes, e.g. float32,bfloat16 (float16, float64 too)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads (and OMP/MKL); default: torch's own choice (recorded in the results)",
    )
    p.add_argument("--repeats", type=int, default=7, help="timed rounds per configuration (median taken)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per library after the first")
    p.add_argument("--memory", action="store_true", help="added peak memory per library, fresh process each")
    p.add_argument("--memory-modes", default="fwdbwd", help="modes to measure memory for (default fwdbwd)")
    p.add_argument(
        "--cold-start",
        action="store_true",
        help="first-call time of splatloss-torch (first op, last shape) in a fresh process with an empty kernel cache",
    )
    p.add_argument(
        "--padding",
        default="valid",
        choices=["valid", "same", "reflect"],
        help="splatloss's padding for ssim and ms_ssim (dssim_l1 is 3DGS's 'same'; peers keep their own)",
    )
    p.add_argument("--no-floor", action="store_true", help="skip the FMA-peak runs (CPU)")
    p.add_argument("--full", action="store_true", help="sizes 256x256..1080x1920, channels 1,3, batch 1,8")
    p.add_argument(
        "--gpu-table",
        action="store_true",
        help="the GPU check's one table: splatloss-triton vs fused-ssim vs pytorch-msssim; SSIM, D-SSIM + L1, "
        "MS-SSIM, masked D-SSIM + L1; fwd and fwdbwd; float32 and bfloat16; batch 1 and 5; 1080p and 4K",
    )
    p.add_argument("--json", help="write every record (and the machine) to this JSON file")
    p.add_argument("--plot", help="write a plot of time against size to this image file")
    p.add_argument(
        "--markdown",
        metavar="JSON",
        help="print the records of a --json file as a markdown table (and --plot them) and exit",
    )
    p.add_argument("--_memory-child", nargs=6, help=argparse.SUPPRESS)
    p.add_argument("--_cold-child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.full:
        args.sizes, args.channels, args.batch = "256x256,512x512,720x1280,1080x1920", "1,3", "1,8"
    if args.gpu_table:
        args.sizes, args.channels, args.batch = "1080x1920,2160x3840", "3", "1,5"
        args.ops, args.modes, args.dtype = "ssim,dssim_l1,ms_ssim,dssim_l1_masked", "fwd,fwdbwd", "float32,bfloat16"
        args.libs = "splatloss-triton,splatloss-triton-graphed,fused_ssim,pytorch_msssim"
    return args


def _check_counts_and_device(args):
    """Refuse, before anything runs, counts and a device the run cannot use."""
    for flag, value, least in (
        ("--threads", args.threads, 1),
        ("--repeats", args.repeats, 1),
        ("--warmup", args.warmup, 0),
    ):
        if value is not None and value < least:
            raise SystemExit(f"{flag} must be an integer >= {least}, got {value}")
    if args.device not in ("cpu", "cuda"):
        raise SystemExit(f"--device must be cpu or cuda, got {args.device!r}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda needs a CUDA GPU, but torch sees none here; use --device cpu")
    if args.gpu_table and args.device != "cuda":
        raise SystemExit("--gpu-table is the GPU check's table (1080p and 4K on CUDA); run it on a CUDA machine")
    if args.baseline not in ALL_LIBS:
        raise SystemExit(f"--baseline must be one of {ALL_LIBS}, got {args.baseline!r}")


def main(argv=None):
    args = parse_args(argv)
    _check_counts_and_device(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    # Fresh processes (memory, cold start) run with the count this one uses, whoever chose it.
    args.threads = torch.get_num_threads()
    if args._memory_child:
        lib, op, mode, shape, dt, device = args._memory_child
        print(
            json.dumps(memory_child(lib, op, mode, tuple(int(v) for v in shape.split("x")), getattr(torch, dt), device))
        )
        return 0
    _check_outputs(args)
    if args.markdown:
        payload = json.loads(Path(args.markdown).read_text())
        print(markdown_table(payload["results"], payload.get("baseline", args.baseline)))
        if args.plot:
            plot(payload["results"], args.plot, payload.get("baseline", args.baseline))
        return 0
    if args._cold_child:
        op, shape, dt = args._cold_child
        print(json.dumps(cold_start_child(op, tuple(int(v) for v in shape.split("x")), getattr(torch, dt))))
        return 0

    dtype_names = _csv(args.dtype)
    bad = [d for d in dtype_names if d not in DTYPES]
    if bad or not dtype_names:
        raise SystemExit(f"--dtype must be a subset of {DTYPES}, got {args.dtype!r}")
    dtypes = [getattr(torch, d) for d in dtype_names]
    dtype = dtypes[0]
    libs = _csv(args.libs)
    unknown = [l for l in libs if l not in ALL_LIBS]
    if unknown:
        raise SystemExit(f"unknown libraries {unknown}; choose from {ALL_LIBS}")
    ops = _csv(args.ops)
    if any(o not in OPS for o in ops):
        raise SystemExit(f"--ops must be a subset of {OPS}, got {ops}")
    modes = _csv(args.modes)
    if any(m not in MODES for m in modes):
        raise SystemExit(f"--modes must be a subset of {MODES}, got {modes}")
    sizes = [_size(s) for s in _csv(args.sizes)]
    batches, channels = _ints("--batch", args.batch), _ints("--channels", args.channels)
    shapes = [(b, c, h, w) for b in batches for c in channels for h, w in sizes]

    PADDING["padding"] = args.padding
    peak = None
    info = machine_info(args.device)
    if args.device == "cpu" and not args.no_floor:
        try:
            peak = FmaPeak()
        except Unavailable as exc:
            print(f"# no arithmetic floor: {exc}")
        else:
            w, c = peak.sample()
            info["fma_peak_glanes_per_s"] = round(c / 1e9, 1)
            info["kernel_vector_lanes"] = peak.vector_width
    print(f"# {info}", flush=True)
    if peak is not None:
        print(
            "# 'x floor': CPU time over the arithmetic floor (176 FMA per pixel-channel forward+backward, "
            "110 forward, every MS-SSIM scale counted) at the FMA peak measured after each run",
            flush=True,
        )
    results = []
    for dtype, shape in [(d, s) for d in dtypes for s in shapes]:
        for op in ops:
            for mode in modes:
                recs = time_config(
                    libs, op, mode, shape, dtype, args.device, args.repeats, args.warmup, args.baseline, peak
                )
                if args.memory and mode in _csv(args.memory_modes):
                    for r in recs:
                        if "median_ms" in r:
                            r.update(run_memory(r["lib"], op, mode, shape, dtype, args.device, args.threads))
                    base = next((r.get("peak_added_bytes") for r in recs if r["lib"] == args.baseline), None)
                    for r in recs:
                        if base and r.get("peak_added_bytes"):
                            r[f"memory_ratio_vs_{args.baseline}"] = base / r["peak_added_bytes"]
                results.extend(recs)
                print_table(recs, args.baseline)
                print(flush=True)
    cold = None
    if args.cold_start and args.device == "cpu":
        b, c, h, w = shapes[-1]
        cold = {op: run_cold_start(op, shapes[-1], dtype, args.threads) for op in ops[:1]}
        for op, rec in cold.items():
            print(f"cold start {op} {b}x{c}x{h}x{w}: {rec}")
    print("\n# summary (all configurations)")
    print_table(results, args.baseline)
    if args.json:
        write_json(
            args.json,
            {
                "machine": info,
                "argv": sys.argv[1:],
                "baseline": args.baseline,
                "results": results,
                "cold_start": cold,
            },
        )
        print(f"wrote {args.json}")
    if args.plot:
        plot(results, args.plot, args.baseline)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
