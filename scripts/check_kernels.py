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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


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


# ------------------------------------------------------------------------------------------------
# --cost: the kernels the loss calls launch, recorded at run time, compiled and counted
# ------------------------------------------------------------------------------------------------

#: Machines of the estimate (vendor figures): SMs, warp schedulers per SM, boost clock (Hz), DRAM
#: bandwidth (B/s). sm_90: H100 SXM5; sm_80: A100 SXM4 80 GB.
MACHINES = {
    90: dict(name="H100 SXM", sms=132, schedulers=4, clock=1.755e9, dram=3.35e12),
    80: dict(name="A100 SXM 80GB", sms=108, schedulers=4, clock=1.41e9, dram=2.039e12),
}

#: The modelled cost of a torch glue kernel (an elementwise op or reduction a call issues outside
#: the Triton kernels): one warp-instruction per 8 elements read or written (a load or store, the
#: op and address arithmetic per 32-element warp access), and its inputs and outputs moved
#: through DRAM once.
GLUE_WARP_INSTR_PER_ELEMENT = 1 / 8

#: The shape of the cost model's calls (one 1080p RGB frame, fp32).
COST_SHAPE = (1, 3, 1080, 1920)


class Launch(NamedTuple):
    fn: object  # the JITFunction
    grid: tuple
    args: Dict[str, object]  # bound arguments by name
    compile: Dict[int, tuple]  # arch -> (signature, constexprs, attrs, options)


class _TensorInfo(NamedTuple):
    nbytes: int  # bytes of the tensor's elements (at most its storage)

    @staticmethod
    def of(t) -> "_TensorInfo":
        return _TensorInfo(min(t.numel() * t.element_size(), t.untyped_storage().nbytes()))


class Glue(NamedTuple):
    op: str
    elements: int  # elements read + written
    nbytes: int  # bytes read + written


def _record_calls(archs):
    """Run the four loss calls on CPU tensors of COST_SHAPE with every Triton launch intercepted:
    the launch is bound and specialised by Triton's own binder for each architecture (which
    integers are 1 or multiples of 16, pointer alignment, constexprs, num_warps, maxnreg) and
    recorded, nothing runs. The package is told to plan CUDA launches (its CUDA geometry) and
    its input check to accept CPU tensors; torch ops outside the kernels (glue) are recorded by
    a dispatch mode. Outputs of the skipped kernels are uninitialised: only shapes matter."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from triton.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    import splatloss

    if not hasattr(_common, "FORCE_CUDA_GEOMETRY"):
        raise RuntimeError(
            "splatloss.backends.triton._common.FORCE_CUDA_GEOMETRY is gone: the cost model needs a "
            "switch that makes the launchers plan CUDA launches for CPU tensors"
        )
    backends = {a: make_backend(GPUTarget("cuda", a, 32)) for a in archs}
    current: List = []

    def run(self, *args, grid, warmup, **kwargs):
        kwargs = dict(kwargs)
        kwargs.setdefault("debug", False)
        per_arch = {}
        bound = None
        for a, be in backends.items():
            binder = create_function_from_signature(self.signature, self.params, be)
            bound, spec, opts = binder(*args, **kwargs)
            options, signature, constexprs, attrs = self._pack_args(be, kwargs, bound, spec, opts)
            per_arch[a] = (signature, constexprs, attrs, options)
        if callable(grid):
            grid = grid(bound)
        # tensors as their sizes only: a reference held here would make autograd copy the gradient
        args_info = {n: _TensorInfo.of(v) if isinstance(v, torch.Tensor) else v for n, v in bound.items()}
        current.append(Launch(self, tuple(int(g) for g in grid), args_info, per_arch))
        return None

    view_like = ("empty", "view", "expand", "as_strided", "alias", "detach", "unsqueeze", "squeeze", "permute")

    class GlueMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
            ns = getattr(func, "namespace", "aten")
            if ns == "aten" and not any(v in name for v in view_like):
                ins = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
                outs = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
                in_ptrs = {t.untyped_storage().data_ptr() for t in ins}
                new = [t for t in outs if t.untyped_storage().data_ptr() not in in_ptrs]
                inplace = name.endswith("_") and not name.endswith("__")
                if new or inplace:  # a kernel (not a view or an allocation)
                    uniq = {t.untyped_storage().data_ptr(): t for t in ins + outs}.values()  # in-place: once
                    el = sum(t.numel() for t in uniq)
                    nb = sum(min(t.numel() * t.element_size(), t.untyped_storage().nbytes()) for t in uniq)
                    current.append(Glue(name, el, nb))
            return out

    def loss_ssim(x, y):
        return 1 - splatloss.ssim(x, y, padding="same", backend="triton")

    def loss_dssim_l1(x, y):
        return splatloss.dssim_l1(x, y, 0.2, padding="same", backend="triton")

    def loss_ms_ssim(x, y):
        return 1 - splatloss.ms_ssim(x, y, tau=0.01, backend="triton")

    calls = {
        "ssim_loss_fwd_bwd": (loss_ssim, False),
        "ssim_loss_fwd_bwd_both_grads": (loss_ssim, True),
        "dssim_l1_fwd_bwd": (loss_dssim_l1, False),
        "ms_ssim_loss_fwd_bwd": (loss_ms_ssim, False),
    }
    recorded = {}
    saved = (JITFunction.run, _common.FORCE_CUDA_GEOMETRY, os.environ.get("TRITON_INTERPRET"))
    JITFunction.run = run
    _common.FORCE_CUDA_GEOMETRY = True
    os.environ["TRITON_INTERPRET"] = "1"  # only so that the input check accepts CPU tensors
    try:
        gen = torch.Generator().manual_seed(0)
        for name, (loss, both) in calls.items():
            x = torch.rand(COST_SHAPE, generator=gen).requires_grad_(True)
            y = torch.rand(COST_SHAPE, generator=gen).requires_grad_(both)
            for _ in range(2):  # the second call: caches (window taps) warm, as in a training loop
                x.grad = y.grad = None
                current.clear()
                with GlueMode():
                    loss(x, y).backward()
            recorded[name] = list(current)
    finally:
        JITFunction.run = saved[0]
        _common.FORCE_CUDA_GEOMETRY = saved[1]
        if saved[2] is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved[2]
    return recorded


def _disasm(cubin: bytes) -> str:
    nvdisasm = os.path.join(os.path.dirname(CUOBJDUMP), "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as fh:
        fh.write(cubin)
        path = fh.name
    try:
        return subprocess.run([nvdisasm, "-c", "-gi", path], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)


def _compile_key(launch: Launch, arch: int) -> str:
    sig, const, attrs, opts = launch.compile[arch]
    return repr(
        (launch.fn.fn.__module__, launch.fn.fn.__qualname__, arch, sig, const, attrs, sorted(opts.__dict__.items()))
    )


def cost_main(archs, json_path=None) -> int:
    import json

    import sass_cost

    recorded = _record_calls(archs)
    compiled: Dict[str, dict] = {}
    failures: List[str] = []
    report = {"shape": list(COST_SHAPE), "dtype": "float32", "machines": {}, "arch": {}, "spills": 0}
    total_spill = 0
    pixels = 1
    for d in COST_SHAPE:
        pixels *= d
    for arch in archs:
        mach = MACHINES[arch]
        report["machines"][f"sm_{arch}"] = mach
        issue_rate = mach["sms"] * mach["schedulers"] * mach["clock"]
        calls_out = {}
        for call, items in recorded.items():
            tot = dict(warp_instructions=0.0, bar=0.0, dram=0.0, scratch=0.0, issue_s=0.0, bound_s=0.0)
            kernels = []
            min_warps = None
            for it in items:
                if isinstance(it, Glue):
                    wi = it.elements * GLUE_WARP_INSTR_PER_ELEMENT
                    t_issue, t_dram = wi / issue_rate, it.nbytes / mach["dram"]
                    tot["warp_instructions"] += wi
                    tot["dram"] += it.nbytes
                    tot["issue_s"] += t_issue
                    tot["bound_s"] += max(t_issue, t_dram)
                    kernels.append(dict(kernel=f"torch {it.op}", glue=True, warp_instructions=wi, dram_bytes=it.nbytes))
                    continue
                key = _compile_key(it, arch)
                if key not in compiled:
                    sig, const, attrs, opts = it.compile[arch]
                    t0 = time.perf_counter()
                    k = triton.compile(
                        ASTSource(it.fn, sig, const, attrs), target=GPUTarget("cuda", arch, 32), options=opts.__dict__
                    )
                    use = resource_usage(k.asm["cubin"])
                    func = sass_cost.parse_sass(_disasm(k.asm["cubin"]))[0]
                    ir = sass_cost.ttgir_loops(k.asm["ttgir"])
                    compiled[key] = dict(
                        k=k,
                        use=use,
                        func=func,
                        ir=ir,
                        access=sass_cost.pointer_access(k.asm["ttgir"]),
                        seconds=time.perf_counter() - t0,
                    )
                c = compiled[key]
                k, use, func, ir = c["k"], c["use"], c["func"], c["ir"]
                warps = k.metadata.num_warps
                spill = use.get("STACK", 0) + use.get("LOCAL", 0)
                smem = max(int(k.metadata.shared), use.get("SHARED", 0))
                programs = 1
                for g in it.grid:
                    programs *= g
                ints = {
                    n: int(v) for n, v in it.args.items() if isinstance(v, (int, bool)) and not isinstance(v, float)
                }
                iters, entries = sass_cost.loop_iterations(ir, {n: ints.get(n) for n in ir[0]}, it.grid)
                trips, matched = sass_cost.loop_trips(func, ir[2], iters, entries)
                counts = sass_cost.warp_counts(func, trips, programs)
                wi = counts.instructions * warps
                read = written = scratch = 0
                for n, mode in c["access"].items():
                    t = it.args.get(n)
                    if not isinstance(t, _TensorInfo):
                        continue
                    nb = t.nbytes
                    if mode == "rw":
                        scratch += nb  # written and read back by the same program: assumed cached
                    elif mode == "r":
                        read += nb
                    else:
                        written += nb
                ctas, res_warps = sass_cost.resident_warps(arch, use["REG"], warps, smem)
                min_warps = res_warps if min_warps is None else min(min_warps, res_warps)
                t_issue, t_dram = wi / issue_rate, (read + written) / mach["dram"]
                tot["warp_instructions"] += wi
                tot["bar"] += counts.bar_sync
                tot["dram"] += read + written
                tot["scratch"] += scratch
                tot["issue_s"] += t_issue
                tot["bound_s"] += max(t_issue, t_dram)
                if spill:
                    failures.append(f"{it.fn.fn.__name__} sm_{arch}: {spill} B of stack/local (register spills)")
                if smem > SHARED_LIMIT[arch]:
                    failures.append(f"{it.fn.fn.__name__} sm_{arch}: {smem} B shared > {SHARED_LIMIT[arch]}")
                total_spill += spill
                kernels.append(
                    dict(
                        kernel=it.fn.fn.__name__,
                        grid=list(it.grid),
                        warps=warps,
                        registers=use["REG"],
                        spill_bytes=spill,
                        shared_bytes=smem,
                        resident_ctas=ctas,
                        resident_warps=res_warps,
                        sass_instructions=len(func.instrs),
                        loops=len(func.loops),
                        loop_iterations_per_program=[t / programs for t in trips],
                        loops_matched_by=matched,
                        warp_instructions=wi,
                        bar_sync=counts.bar_sync,
                        dram_read_bytes=read,
                        dram_write_bytes=written,
                        scratch_bytes=scratch,
                        estimate_us=max(t_issue, t_dram) * 1e6,
                    )
                )
            calls_out[call] = dict(
                warp_instructions_per_pixel=tot["warp_instructions"] / pixels,
                bar_per_pixel=tot["bar"] / pixels,
                dram_bytes_per_pixel=tot["dram"] / pixels,
                scratch_bytes_per_pixel=tot["scratch"] / pixels,
                min_warps_per_sm=min_warps,
                estimate_issue_us=tot["issue_s"] * 1e6,
                estimate_us=tot["bound_s"] * 1e6,
                launches=len(items),
                kernels=kernels,
            )
        report["arch"][f"sm_{arch}"] = {"calls": calls_out}
    report["spills"] = total_spill
    main_arch = f"sm_{90 if 90 in archs else archs[0]}"
    report["calls"] = {
        name: {k: v for k, v in c.items() if k != "kernels"} for name, c in report["arch"][main_arch]["calls"].items()
    }
    report["calls_arch"] = main_arch

    hdr = (
        f"{'call':<30} {'sm':>3} {'warp-instr/px':>13} {'bar/px':>8} {'DRAM B/px':>9} {'warps/SM':>8} "
        f"{'issue us':>8} {'est us':>8} {'launches':>8}"
    )
    print(hdr)
    print("-" * len(hdr))
    for arch in archs:
        for name, c in report["arch"][f"sm_{arch}"]["calls"].items():
            print(
                f"{name:<30} {arch:>3} {c['warp_instructions_per_pixel']:>13.1f} {c['bar_per_pixel']:>8.3f} "
                f"{c['dram_bytes_per_pixel']:>9.1f} {c['min_warps_per_sm']!s:>8} {c['estimate_issue_us']:>8.0f} "
                f"{c['estimate_us']:>8.0f} {c['launches']:>8}"
            )
    print(
        f"\nmodelled, not measured: {COST_SHAPE} fp32; estimate on "
        + ", ".join(f"sm_{a}: {MACHINES[a]['name']}" for a in archs)
        + f"; total spills {total_spill} B"
    )
    if json_path:
        tmp = json_path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(report, fh, indent=1)
        os.replace(tmp, json_path)
    if failures:
        print(f"\n{len(failures)} problem(s):")
        for f in failures:
            print("  " + f)
        return 1
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, nargs="+", default=[80, 90], help="SM versions (default 80 90)")
    ap.add_argument("--quick", action="store_true", help="default window only")
    ap.add_argument(
        "--cost", action="store_true", help="static cost of the kernels the loss calls launch (see docs/triton.md)"
    )
    ap.add_argument("--json", metavar="FILE", help="with --cost: write the figures to FILE")
    args = ap.parse_args(argv)
    if args.cost:
        return cost_main(args.arch, args.json)
    if args.json:
        ap.error("--json needs --cost")

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
