#!/usr/bin/env python
"""Compile every Triton kernel of splatloss ahead of time for sm_80 and sm_90 -- no GPU needed.

For each kernel, at the constexpr values, warp counts and register ceiling (``maxnreg``) the launchers really use
(``splatloss.backends.triton._common.geometry`` on CUDA), this runs
``triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", arch, 32))``,
then reads the cubin's resource usage with the cuobjdump bundled with Triton
(``--dump-resource-usage``): registers per thread, stack / local bytes (register spills land
there) and static shared memory, plus the shared memory Triton itself allocates
(``metadata.shared``). It prints one row per kernel and architecture and exits non-zero when any
kernel fails to compile, spills (stack or local bytes > 0), or needs more shared memory per block
than the architecture allows.

The interpreter (``TRITON_INTERPRET=1``, the correctness tests) accepts things the compiler
rejects; this script is the other half of the proof. Run: ``python scripts/check_kernels.py``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, NamedTuple

os.environ.pop("TRITON_INTERPRET", None)  # compile for real, never interpret

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import importlib  # noqa: E402

# the package re-exports functions named like its modules (ms_ssim, dssim_l1): import the modules
_common = importlib.import_module("splatloss.backends.triton._common")
ms_ssim_mod = importlib.import_module("splatloss.backends.triton.ms_ssim")
ssim_mod = importlib.import_module("splatloss.backends.triton.ssim")

#: Max shared memory per block (bytes, opt-in): A100 (sm_80) 163 KB, H100 (sm_90) 227 KB.
SHARED_LIMIT = {80: 166912, 90: 232448}

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


class Case(NamedTuple):
    label: str
    fn: object
    constexprs: Dict[str, object]
    dtype: str  # element type of the image pointers ("fp32", "fp16", "bf16")
    warps: int


def _signature(fn, constexprs: Dict[str, object], dtype: str) -> Dict[str, str]:
    """Types of every argument: image pointers in ``dtype``, other pointers fp32, c1/c2 fp32,
    all other scalars i32 (Triton's own type for Python ints below 2**31)."""
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in ("x_ptr", "y_ptr", "gx_ptr", "gy_ptr", "in_ptr", "out_ptr"):
            sig[name] = "*" + dtype
        elif name.endswith("_ptr"):
            sig[name] = "*fp32"
        elif name in ("c1", "c2", "shift"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def cases(quick: bool = False) -> List[Case]:
    """The configurations the launchers use on CUDA (see the module docstring)."""
    out: List[Case] = []
    windows = range(3, _common.MAX_WINDOW + 1, 2)
    if quick:
        windows = (11,)

    def fwd(label, K, padding, mode, dtype="fp32", F=None, l1=False):
        kp = triton.next_power_of_2(K)
        lanes = _common.cuda_lanes(kp)
        F = lanes if F is None else F
        pad = 0 if padding == "valid" else K // 2
        const = dict(
            K=K,
            KP=kp,
            PAD=pad,
            REFLECT=padding == "reflect",
            F=F,
            BW=lanes,
            WRITE_MAP=mode != "stats",
            WRITE_CS=mode == "map_cs",
            HAS_L1=l1,
        )
        out.append(Case(label, ssim_mod._ssim_fwd_kernel, const, dtype, _common.cuda_warps(kp)))

    def bwd(
        label,
        K,
        padding,
        dtype="fp32",
        F=None,
        upstream_map=False,
        cs=True,
        l1=False,
        need1=True,
        need2=True,
        sums=False,
    ):
        kp = triton.next_power_of_2(K)
        lanes = _common.cuda_lanes(kp)
        F = lanes if F is None else F
        pad = 0 if padding == "valid" else K // 2
        const = dict(
            K=K,
            KP=kp,
            PAD=pad,
            REFLECT=padding == "reflect",
            F=F,
            BW=lanes,
            UPSTREAM_MAP=upstream_map,
            HAS_CS=cs,
            HAS_L1=l1,
            NEED1=need1,
            NEED2=need2,
            WRITE_SUMS=sums,
        )
        out.append(Case(label, ssim_mod._ssim_bwd_kernel, const, dtype, _common.cuda_warps(kp)))

    # every window size, heaviest flags
    for K in windows:
        fwd(f"ssim fwd stats reflect K={K}", K, "reflect", "stats", l1=True)
        bwd(f"ssim bwd all-flags reflect K={K}", K, "reflect", upstream_map=True, l1=True, sums=True)
    if not quick:
        # the paths of the public API at the default window
        fwd("ssim_stats fwd valid fp16", 11, "valid", "stats", "fp16")
        fwd("ssim_map fwd valid +cs fp32", 11, "valid", "map_cs")
        fwd("ssim_map fwd same bf16", 11, "same", "map", "bf16")
        # channel packing: every frame width below the lane count (one compile per width)
        for F in (1, 2, 4, 8, 16, 32, 64):
            fwd(f"ssim_stats fwd packed F={F}", 11, "same", "stats", F=F)
        for F in (16, 32, 64):
            bwd(f"ssim_stats bwd packed F={F}", 11, "same", F=F)
        fwd("ssim_stats fwd K=31 packed F=32", 31, "same", "stats", F=32)
        bwd("ssim_stats bwd K=31 packed F=32", 31, "same", F=32)
        bwd("ssim_stats bwd valid fp16", 11, "valid", "fp16")
        bwd("ssim_map bwd same +cs bf16", 11, "same", "bf16", upstream_map=True)
        bwd("ssim_map bwd valid no-cs", 11, "valid", upstream_map=True, cs=False)
        bwd("mean_and_grad bwd same", 11, "same", cs=False, need2=False, sums=True)
        bwd("dssim_l1 bwd same", 11, "same", cs=False, l1=True)
        bwd("ssim_stats bwd img2 only", 11, "same", need1=False)
        for dtype in ("fp32", "fp16", "bf16"):
            c = dict(BLOCK=ms_ssim_mod.BLOCK)
            out.append(Case(f"downsample fwd {dtype}", ms_ssim_mod._down_fwd_kernel, c, dtype, ms_ssim_mod.WARPS))
            out.append(Case(f"downsample bwd {dtype}", ms_ssim_mod._down_bwd_kernel, c, dtype, ms_ssim_mod.WARPS))
        fwd("dssim_l1 fwd same fp16", 11, "same", "stats", "fp16", l1=True)
    return out


def resource_usage(cubin: bytes) -> Dict[str, int]:
    """REG / STACK / SHARED / LOCAL of the single function in ``cubin`` (cuobjdump)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as fh:
        fh.write(cubin)
        path = fh.name
    try:
        text = subprocess.run(
            [CUOBJDUMP, "--dump-resource-usage", path], capture_output=True, text=True, check=True
        ).stdout
    finally:
        os.unlink(path)
    line = next(ln for ln in text.splitlines() if "REG:" in ln)
    return {k: int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", line)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, nargs="+", default=[80, 90], help="SM versions (default 80 90)")
    ap.add_argument("--quick", action="store_true", help="default window only")
    args = ap.parse_args(argv)

    failures = []
    header = f"{'kernel':<40} {'sm':>3} {'warps':>5} {'regs':>5} {'spill B':>7} {'smem B':>7} {'limit':>7} {'s':>5}"
    print(header)
    print("-" * len(header))
    for case in cases(args.quick):
        for arch in args.arch:
            t0 = time.perf_counter()
            try:
                src = ASTSource(
                    fn=case.fn, signature=_signature(case.fn, case.constexprs, case.dtype), constexprs=case.constexprs
                )
                k = triton.compile(
                    src,
                    target=GPUTarget("cuda", arch, 32),
                    options={"num_warps": case.warps, "maxnreg": _common.MAXNREG},
                )
                use = resource_usage(k.asm["cubin"])
            except Exception as exc:  # a compile error is a failure of this check, reported per case
                failures.append(f"{case.label} sm_{arch}: compile failed: {type(exc).__name__}: {exc}")
                print(f"{case.label:<40} {arch:>3} {case.warps:>5}  COMPILE FAILED ({type(exc).__name__})")
                continue
            spill = use.get("STACK", 0) + use.get("LOCAL", 0)
            smem = max(int(k.metadata.shared), use.get("SHARED", 0))
            dt = time.perf_counter() - t0
            flag = ""
            if spill > 0:
                failures.append(f"{case.label} sm_{arch}: {spill} B of stack/local (register spills)")
                flag = "  SPILL"
            if smem > SHARED_LIMIT[arch]:
                failures.append(f"{case.label} sm_{arch}: {smem} B shared > {SHARED_LIMIT[arch]}")
                flag += "  SMEM"
            print(
                f"{case.label:<40} {arch:>3} {case.warps:>5} {use['REG']:>5} {spill:>7} {smem:>7} "
                f"{SHARED_LIMIT[arch]:>7} {dt:>5.1f}{flag}",
                flush=True,
            )
    if failures:
        print(f"\n{len(failures)} problem(s):")
        for f in failures:
            print("  " + f)
        return 1
    print(
        "\nall kernels compiled for "
        + ", ".join(f"sm_{a}" for a in args.arch)
        + ": no spills, shared memory within limits"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
