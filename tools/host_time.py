"""Host time of an eager Triton loss call, measured without a GPU: what a training loop feels on one
1080p view, where the host, not the kernels, bounds the call.

The Triton backend runs through Triton's real launch path -- kernels compiled for sm_90 by ptxas,
``JITFunction.run``, the generated C launcher -- over a stub CUDA driver (``libcuda.so.1`` built
here from :data:`STUB_SOURCE`: every driver call succeeds, a kernel launch only counts itself). The
tensors are CPU tensors of the real shape: Triton's launcher takes their pointers as device
pointers and nothing runs on them, so every microsecond measured is the host's: argument checks,
dispatch, autograd, allocations, launch set-up. Per case and call it prints:

* host microseconds, the median of thread-CPU time per call (``time.thread_time``: another job on
  the machine does not count), the cases alternating in rounds in one process;
* Triton launches (counted by the stub driver), aten allocations, aten ops and host
  synchronisations (``aten._local_scalar_dense``: ``.item()``, ``.tolist()``, ``bool(t)``), counted
  by a dispatch mode over one call;
* beside them the anchors ``F.l1_loss(x, y)`` forward + backward and an empty
  ``torch.autograd.Function``, and each case as a multiple of the L1 anchor.

The anchors' tensors are small (1x3x8x8): an aten op's host cost on a GPU does not depend on the
size it launches for, and at 1080p a CPU tensor would compute. Run::

    ./dev bench --host                          # 1x3x1080x1920 float32
    python tools/host_time.py --shape 1x3x256x256 --rounds 5 --json host.json

Must run in a fresh process: the stub driver is installed before Triton is imported.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STUB_SOURCE = r"""
#include "cuda.h"
#include <string.h>
unsigned long long splatloss_stub_launches = 0;
static int ctx_, mod_, fun_;
CUresult cuGetErrorString(CUresult e, const char **s) { *s = "stub driver"; return CUDA_SUCCESS; }
CUresult cuCtxGetCurrent(CUcontext *c) { *c = (CUcontext)&ctx_; return CUDA_SUCCESS; }
CUresult cuCtxSetCurrent(CUcontext c) { return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { *c = (CUcontext)&ctx_; return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice *d, int i) { *d = i; return CUDA_SUCCESS; }
CUresult cuModuleLoadData(CUmodule *m, const void *image) { *m = (CUmodule)&mod_; return CUDA_SUCCESS; }
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *n) { *f = (CUfunction)&fun_; return CUDA_SUCCESS; }
CUresult cuFuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f) {
  *v = a == CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK ? 1024 : 0;
  return CUDA_SUCCESS;
}
CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) { return CUDA_SUCCESS; }
CUresult cuFuncSetCacheConfig(CUfunction f, CUfunc_cache c) { return CUDA_SUCCESS; }
CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
  switch (a) {  /* an H100 SXM */
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
  case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *v = 32; break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = 232448; break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *v = 233472; break;
  case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *v = 65536; break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
  default: *v = 1000;
  }
  return CUDA_SUCCESS;
}
CUresult cuOccupancyMaxActiveClusters(int *n, CUfunction f, const CUlaunchConfig *c) { *n = 1; return CUDA_SUCCESS; }
CUresult cuCtxGetLimit(size_t *v, CUlimit l) { *v = 0; return CUDA_SUCCESS; }
CUresult cuCtxSetLimit(CUlimit l, size_t v) { return CUDA_SUCCESS; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return CUDA_SUCCESS; }
CUresult cuPointerGetAttribute(void *out, CUpointer_attribute a, CUdeviceptr p) {
  *(CUdeviceptr *)out = p;
  return CUDA_SUCCESS;
}
CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
  splatloss_stub_launches++;
  return CUDA_SUCCESS;
}
"""

#: aten ops that allocate a tensor of their own (the rest: views, arithmetic, copies; an
#: arithmetic op allocates its output too, and counts as an op).
ALLOCATING = (
    "empty.memory_format",
    "empty_strided.default",
    "empty_like.default",
    "new_empty.default",
    "new_empty_strided.default",
    "zeros.default",
    "zeros_like.default",
    "ones_like.default",
    "full.default",
    "new_zeros.default",
    "new_ones.default",
    "scalar_tensor.default",
)


#: aten ops that make a view (no work on a GPU, whatever the tensor's size).
VIEWS = (
    "detach.default",
    "view.default",
    "expand.default",
    "select.int",
    "slice.Tensor",
    "as_strided.default",
    "alias.default",
    "_reshape_alias.default",
    "unsqueeze.default",
    "squeeze.dim",
    "permute.default",
    "t.default",
    "transpose.int",
)


def build_stub(directory: Path) -> Path:
    """Compile the stub driver into ``directory/libcuda.so.1`` (against the ``cuda.h`` that Triton
    ships) unless it is there from an earlier run of the same source."""
    import importlib.util

    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        raise SystemExit("host_time: triton is not installed (pip install 'splatloss[triton]')")
    include = Path(spec.origin).parent / "backends" / "nvidia" / "include"
    directory.mkdir(parents=True, exist_ok=True)
    lib = directory / "libcuda.so.1"
    src = directory / "stub_cuda.c"
    if not (lib.exists() and src.exists() and src.read_text() == STUB_SOURCE):
        src.write_text(STUB_SOURCE)
        tmp = directory / f".libcuda.so.1.{os.getpid()}"
        cmd = ["gcc", "-O2", "-shared", "-fPIC", f"-I{include}", "-Wl,-soname,libcuda.so.1", str(src), "-o", str(tmp)]
        try:
            subprocess.run(cmd, check=True, capture_output=True, text=True)
        except FileNotFoundError:
            raise SystemExit("host_time: needs a C compiler (gcc) to build the stub CUDA driver") from None
        except subprocess.CalledProcessError as err:
            raise SystemExit(f"host_time: building the stub CUDA driver failed:\n{err.stderr}") from None
        os.replace(tmp, lib)
    return lib


def install_stub_driver(directory: Path):
    """Load the stub driver and make Triton's CUDA driver the active one over it; returns the
    launch counter (a ctypes view of the stub's count). Call before anything imports Triton."""
    if "triton" in sys.modules:
        raise SystemExit("host_time: Triton was imported before the stub driver was installed; run it as a script")
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        os.environ.pop("TRITON_INTERPRET")  # the kernels must be JIT functions, not interpreted ones
    lib_path = build_stub(directory)
    os.environ["TRITON_LIBCUDA_PATH"] = str(directory)
    lib = ctypes.CDLL(str(lib_path), mode=ctypes.RTLD_GLOBAL)  # the launcher's dlopen finds this one

    from triton.backends.nvidia.driver import CudaDriver
    from triton.runtime import driver

    active = CudaDriver()
    # torch's CPU build has no CUDA runtime: device 0, the default stream, an sm_90 part
    active.get_current_device = lambda: 0
    active.set_current_device = lambda index: None
    active.get_current_stream = lambda index=None: 0
    active.get_device_capability = lambda index=None: (9, 0)
    driver.set_active(active)
    return ctypes.c_ulonglong.in_dll(lib, "splatloss_stub_launches")


def parse_shape(text: str):
    try:
        dims = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        dims = ()
    if len(dims) != 4 or min(dims) < 1:
        raise argparse.ArgumentTypeError(
            f"--shape must be BxCxHxW with positive sides, e.g. 1x3x1080x1920, got {text!r}"
        )
    return dims


def make_cases(shape, dtype):
    """The calls measured, by name: each a function that makes one call (inputs made here, once)."""
    import torch
    import torch.nn.functional as F

    import splatloss as sl
    from splatloss.functional import ms_ssim_min_size

    B, C, H, W = shape
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(shape, generator=gen).to(dtype).requires_grad_()
    y = torch.rand(shape, generator=gen).to(dtype)
    mask = (torch.rand((B, 1, H, W), generator=gen) > 0.1).to(torch.float32)
    small_x = torch.rand(1, 3, 8, 8, generator=gen).requires_grad_()
    small_y = torch.rand(1, 3, 8, 8, generator=gen)
    tri = {"backend": "triton"}

    class Empty(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a

        @staticmethod
        def backward(ctx, g):
            return g

    def step(loss_fn, inp):
        def call():
            inp.grad = None
            loss_fn().backward()

        return call

    def forward(loss_fn):
        def call():
            with torch.no_grad():
                loss_fn()

        return call

    cases = {
        "F.l1_loss fwd+bwd (anchor)": step(lambda: F.l1_loss(small_x, small_y), small_x),
        "empty autograd.Function fwd+bwd (anchor)": step(lambda: Empty.apply(small_x).sum(), small_x),
        "ssim loss fwd": forward(lambda: 1 - sl.ssim(x, y, **tri)),
        "ssim loss fwd+bwd": step(lambda: 1 - sl.ssim(x, y, **tri), x),
        "dssim_l1 valid fwd+bwd": step(lambda: sl.dssim_l1(x, y, 0.2, **tri), x),
        "dssim_l1 same fwd": forward(lambda: sl.dssim_l1(x, y, 0.2, padding="same", **tri)),
        "dssim_l1 same fwd+bwd": step(lambda: sl.dssim_l1(x, y, 0.2, padding="same", **tri), x),
        "masked dssim_l1 same fwd+bwd": step(lambda: sl.dssim_l1(x, y, 0.2, padding="same", mask=mask, **tri), x),
    }
    if min(H, W) >= ms_ssim_min_size(sl.SSIMConfig(), 5):
        cases["ms_ssim loss fwd"] = forward(lambda: 1 - sl.ms_ssim(x, y, **tri))
        cases["ms_ssim loss fwd+bwd"] = step(lambda: 1 - sl.ms_ssim(x, y, **tri), x)
    return cases


def counts(call, launches, image: int) -> dict:
    """Triton launches, aten allocations, aten ops and host synchronisations of one ``call()``. A
    host synchronisation is a read of a tensor's values on the host: ``aten._local_scalar_dense``
    (``.item()``, ``bool(t)``, ``float(t)``) or ``Tensor.tolist()`` (which on CPU tensors reads memory
    without dispatching; on CUDA it copies to the host and waits). "image ops": the aten ops (not
    allocations) that touch a tensor of at least ``image`` elements, work a kernel would do on a GPU
    (and that here runs on the CPU, inside the measured time)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = {"allocations": 0, "aten ops": 0, "image ops": 0, "host syncs": 0}

    def large(values) -> bool:
        return any(isinstance(v, torch.Tensor) and v.numel() >= image for v in values)

    tolist = torch.Tensor.tolist

    def counted_tolist(self, *a, **k):
        seen["host syncs"] += 1
        return tolist(self, *a, **k)

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__
            if name == "_local_scalar_dense.default":
                seen["host syncs"] += 1
            elif name in ALLOCATING:
                seen["allocations"] += 1
            else:
                seen["aten ops"] += 1
            out = func(*args, **(kwargs or {}))
            if name not in ALLOCATING and name not in VIEWS:
                flat = [*args, *(kwargs or {}).values(), *(out if isinstance(out, (tuple, list)) else (out,))]
                seen["image ops"] += large(flat)
            return out

    before = launches.value
    torch.Tensor.tolist = counted_tolist
    try:
        with Count():
            call()
    finally:
        torch.Tensor.tolist = tolist
    return {"launches": launches.value - before, **seen}


def verify(cases: dict) -> dict:
    """Per case, whether each launch through the cached compiled kernel hands Triton's launcher what
    ``kernel[grid]`` hands it (grid, compiled function, metadata, every argument: tensors by dtype,
    shape and strides, the rest by value), one call each way; a list of mismatches, empty when equal."""
    import torch
    from triton.backends.nvidia import driver as nvidia

    from splatloss.backends.triton import launch

    seen = []
    real = nvidia.CudaLauncher.__call__

    def describe(a):
        if isinstance(a, torch.Tensor):
            return ("tensor", a.dtype, tuple(a.shape), a.stride())
        return a

    def recording(self, gx, gy, gz, stream, function, metadata, launch_metadata, enter, exit_, *args):
        seen.append(((gx, gy, gz), stream, function, metadata, tuple(describe(a) for a in args)))
        return real(self, gx, gy, gz, stream, function, metadata, launch_metadata, enter, exit_, *args)

    out = {}
    nvidia.CudaLauncher.__call__ = recording
    try:
        for name, call in cases.items():
            runs = []
            for cached in (False, True):
                launch.CACHED = cached
                seen.clear()
                call()
                runs.append(list(seen))
            plain, fast = runs
            bad = [] if plain == fast else [f"{len(plain)} launches through kernel[grid], {len(fast)} cached"]
            if len(plain) == len(fast):
                bad = [f"launch {i}: {p} != {f}" for i, (p, f) in enumerate(zip(plain, fast)) if p != f]
            out[name] = bad
    finally:
        nvidia.CudaLauncher.__call__ = real
        launch.CACHED = True
    return out


def measure(cases: dict, rounds: int, calls: int) -> dict:
    """Per case, thread-CPU microseconds of each call, the cases alternating round by round."""
    times = {name: [] for name in cases}
    for _ in range(rounds):
        for name, call in cases.items():
            for _ in range(calls):
                t0 = time.thread_time_ns()
                call()
                times[name].append((time.thread_time_ns() - t0) / 1e3)
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--shape", type=parse_shape, default=(1, 3, 1080, 1920), help="BxCxHxW (default 1x3x1080x1920)")
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    parser.add_argument("--rounds", type=int, default=15, help="alternated rounds (default 15)")
    parser.add_argument("--calls", type=int, default=20, help="calls per case and round (default 20)")
    parser.add_argument("--counts-only", action="store_true", help="print the counts, skip the timing")
    parser.add_argument(
        "--verify", action="store_true", help="check that cached launches pass what kernel[grid] passes (exit 1 if not)"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--stub-dir", type=Path, default=None, help="where to build the stub driver")
    args = parser.parse_args(argv)
    if min(args.shape[2:]) < 11:  # the cases' default window must fit inside "valid" images
        parser.error(f"--shape needs images of at least 11x11 (the 11-tap window), got {args.shape[2]}x{args.shape[3]}")
    if args.rounds < 1 or args.calls < 1:
        parser.error(f"--rounds and --calls must be at least 1, got {args.rounds} and {args.calls}")
    if args.json is not None and not os.access(args.json.parent if str(args.json.parent) else ".", os.W_OK):
        parser.error(f"--json: cannot write to the folder of {args.json}")

    stub_dir = args.stub_dir or Path(tempfile.gettempdir()) / f"splatloss-stub-cuda-{os.getuid()}"
    launches = install_stub_driver(stub_dir)

    import torch

    from splatloss.backends.triton import launch

    # CPU tensors pass the backend's device check as in the interpreter (the kernels are already JIT
    # functions: Triton decides at import), and get the geometry of a CUDA device
    os.environ["TRITON_INTERPRET"] = "1"
    launch.FORCE_CUDA_GEOMETRY = True

    cases = make_cases(args.shape, getattr(torch, args.dtype))
    for name, call in cases.items():  # compile (ptxas, cached by Triton on disk) and warm every path
        for _ in range(3):
            call()
    table = {name: counts(call, launches, args.shape[2] * args.shape[3]) for name, call in cases.items()}
    mismatches = verify(cases) if args.verify else {}
    if not args.counts_only:
        times = measure(cases, args.rounds, args.calls)
        for name in cases:
            table[name]["host us"] = statistics.median(times[name])
            q = statistics.quantiles(times[name], n=4)
            table[name]["host us iqr"] = (q[0], q[2])
        anchor = table["F.l1_loss fwd+bwd (anchor)"]["host us"]
        for row in table.values():
            row["x l1"] = row["host us"] / anchor

    shape = "x".join(map(str, args.shape))
    print(f"host time per eager call, {shape} {args.dtype}, Triton {_version('triton')}, torch {torch.__version__}")
    print(f"machine: {_cpu()}; {args.rounds} rounds x {args.calls} calls, thread-CPU medians")
    head = f"{'case':42s} {'host us':>8s} {'x l1':>6s} {'launches':>8s} {'allocs':>6s} {'aten ops':>8s}"
    print(head + f" {'image ops':>9s} {'syncs':>5s}")
    for name, row in table.items():
        us = f"{row['host us']:8.1f} {row['x l1']:6.2f}" if "host us" in row else f"{'-':>8s} {'-':>6s}"
        counted = f"{row['launches']:8d} {row['allocations']:6d} {row['aten ops']:8d} {row['image ops']:9d}"
        print(f"{name:42s} {us} {counted} {row['host syncs']:5d}")
    for name, bad in mismatches.items():
        print(f"verify {name}: {'the same launches' if not bad else 'MISMATCH'}")
        for line in bad:
            print(f"  {line}")
    if args.json is not None:
        out = {"shape": shape, "dtype": args.dtype, "machine": _cpu(), "rounds": args.rounds, "calls": args.calls}
        out["triton"], out["torch"], out["cases"] = _version("triton"), torch.__version__, table
        if args.verify:
            out["verify"] = mismatches
        tmp = args.json.with_name(args.json.name + ".tmp")
        tmp.write_text(json.dumps(out, indent=1, default=str) + "\n")
        os.replace(tmp, args.json)
    return 1 if any(mismatches.values()) else 0


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} CPUs"
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # nothing half-written: the JSON is written whole at the end, or not at all
        print("host_time: interrupted; no results written", file=sys.stderr)
        sys.exit(130)
