"""Time the Triton kernels under other launch geometries on a CUDA GPU, and profile them per launch.

The launch geometry (lanes per program, rows streamed per program, the column kernels' register
ceiling, which sets how many programs an SM holds) is chosen by
``splatloss/backends/triton/launch.py``. This script overrides it for a sweep: each geometry runs
the same losses on the same inputs (``tools/bench.py``'s), with the rows as given (not measured:
:mod:`splatloss.backends.triton.tune` is off during the sweep), is timed with ``triton.testing.do_bench``
(``--graphed``: replayed from a CUDA graph, the kernels' own time without Python) and checked
against the default geometry's value (a geometry changes only which program sums which rows, so
the loss may differ in its last bits, never more). Each record carries the registers and spilled
bytes of the kernels compiled for it (the driver's figures). The records, with the device's name,
go to ``--json``; the fastest geometry per (op, mode, shape) is printed last.

``--profile`` times each kernel of each loss at the default geometry with ``torch.profiler``
(device time per call of every launch, by kernel name): what each launch costs, to set beside the
cost model's per-launch estimates (``tools/sass_cost.py``).

    python tools/geometry_sweep.py --json geometry.json
    python tools/geometry_sweep.py --shapes 1x3x1080x1920 --graphed --maxnreg 64,96,128 --rows 128
    python tools/geometry_sweep.py --profile --shapes 1x3x1080x1920 --ops ssim,ms_ssim --json profile.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench  # noqa: E402  (tools/bench.py: the same losses and inputs as the benchmark)

from splatloss.backends.triton import launch, tune  # noqa: E402


def _csv(s):
    return [v for v in s.split(",") if v]


def compiled_kernels() -> dict:
    """``{id: (name, warps, registers, spilled bytes)}`` of every kernel of the Triton backend
    compiled so far in this process (registers and spills as the driver loaded them)."""
    import importlib
    import pkgutil

    from triton.runtime.jit import JITFunction

    import splatloss.backends.triton as pkg

    found = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        module = importlib.import_module(f"{pkg.__name__}.{info.name}")
        for obj in vars(module).values():
            if not isinstance(obj, JITFunction):
                continue
            for cache in getattr(obj, "device_caches", {}).values():
                kernels = cache[0] if isinstance(cache, tuple) else cache
                for k in kernels.values():
                    found[id(k)] = (
                        getattr(k, "name", obj.__name__),
                        getattr(getattr(k, "metadata", None), "num_warps", None),
                        getattr(k, "n_regs", None),
                        getattr(k, "n_spills", None),
                    )
    return found


def sweep(args, dtype) -> list:
    from triton.testing import do_bench

    default_rows, default_lanes, default_nreg = launch.CUDA_ROWS, launch.cuda_lanes, launch.COLUMN_MAXNREG
    # a swept ceiling is forced on the lean forward launches too (launch.lean_fwd_maxnreg)
    default_fwd_nreg = launch.FWD_MAXNREG, launch.FWD_MAXNREG_SM80
    rows_s, lanes_s, nreg_s = (bench._ints(f"--{n}", getattr(args, n)) for n in ("rows", "lanes", "maxnreg"))
    lib = "splatloss-triton-graphed" if args.graphed else "splatloss-triton"
    records, seen = [], set(compiled_kernels())
    default_tune, tune.ENABLED = tune.ENABLED, False  # each geometry as given, not the measured rows
    try:
        for shape_s in _csv(args.shapes):
            shape = tuple(int(v) for v in shape_s.split("x"))
            x, y = bench.make_inputs(*shape, dtype, "cuda")
            for op, mode in itertools.product(_csv(args.ops), _csv(args.modes)):
                if args.graphed and mode != "fwdbwd":
                    continue
                ref = None
                for geo in [(None, None, None)] + list(itertools.product(rows_s, lanes_s, nreg_s)):
                    rows, lanes, nreg = geo
                    launch.CUDA_ROWS = default_rows if rows is None else rows
                    launch.cuda_lanes = default_lanes if lanes is None else (lambda k, n=lanes: n if k <= 15 else 64)
                    launch.COLUMN_MAXNREG = default_nreg if nreg is None else nreg
                    launch.FWD_MAXNREG, launch.FWD_MAXNREG_SM80 = default_fwd_nreg if nreg is None else (nreg, nreg)
                    rec = dict(
                        op=op,
                        mode=mode,
                        shape=shape_s,
                        dtype=args.dtype,
                        graphed=args.graphed,
                        rows=rows or default_rows,
                        lanes=lanes or default_lanes(11),
                        maxnreg=nreg or default_nreg,
                        default=rows is None,
                    )
                    try:
                        call = bench.make_call(bench.make_loss(lib, op, "cuda"), x, y, mode)
                        value = float(call().detach())
                        torch.cuda.synchronize()
                        ref = value if ref is None else ref
                        rec["value"], rec["rel_diff_vs_default"] = value, abs(value - ref) / max(abs(ref), 1e-30)
                        rec["median_ms"] = do_bench(call, warmup=25, rep=100, return_mode="median")
                    except Exception as exc:  # a geometry the kernels refuse: record why, go on
                        rec["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                    now = compiled_kernels()
                    rec["kernels"] = [now[k] for k in now if k not in seen]  # compiled for this geometry
                    seen = set(now)
                    print(json.dumps(rec), flush=True)
                    records.append(rec)
    finally:
        launch.CUDA_ROWS, launch.cuda_lanes, launch.COLUMN_MAXNREG = default_rows, default_lanes, default_nreg
        launch.FWD_MAXNREG, launch.FWD_MAXNREG_SM80 = default_fwd_nreg
        tune.ENABLED = default_tune
    print("\n# fastest geometry per configuration (default in brackets)")
    key = lambda r: (r["op"], r["mode"], r["shape"])  # noqa: E731
    for k, group in itertools.groupby(sorted(records, key=key), key=key):
        timed = [r for r in group if "median_ms" in r]
        if not timed or not any(r["default"] for r in timed):
            continue
        best = min(timed, key=lambda r: r["median_ms"])
        dflt = next(r for r in timed if r["default"])
        g = lambda r: f"rows {r['rows']} lanes {r['lanes']} maxnreg {r['maxnreg']} {r['median_ms'] * 1e3:.0f} us"  # noqa: E731
        print(f"{k}: {g(best)} [{g(dflt)}]")
    return records


def profile(args, dtype) -> list:
    """Device time per call of each kernel of each loss, default geometry (torch.profiler)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    calls_per = 10
    records = []
    for shape_s in _csv(args.shapes):
        shape = tuple(int(v) for v in shape_s.split("x"))
        x, y = bench.make_inputs(*shape, dtype, "cuda")
        for op, mode in itertools.product(_csv(args.ops), _csv(args.modes)):
            try:
                call = bench.make_call(bench.make_loss("splatloss-triton", op, "cuda"), x, y, mode)
                for _ in range(3):
                    call()
                torch.cuda.synchronize()
                with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(calls_per):
                        call()
                    torch.cuda.synchronize()
            except Exception as exc:
                rec = dict(op=op, mode=mode, shape=shape_s, error=f"{type(exc).__name__}: {str(exc)[:200]}")
                print(json.dumps(rec), flush=True)
                records.append(rec)
                continue
            kernels = []
            for ev in prof.key_averages():
                us = device_us(ev)
                if us:
                    kernels.append(dict(name=ev.key, launches=ev.count / calls_per, us=us / calls_per))
            kernels.sort(key=lambda k: -k["us"])
            sequence = _last_call_launches(prof, calls_per)
            rec = dict(
                op=op,
                mode=mode,
                shape=shape_s,
                dtype=args.dtype,
                kernels=kernels,
                total_us=sum(k["us"] for k in kernels),
                launches=sequence,
            )
            print(f"\n# {op} {mode} {shape_s} {args.dtype}: {rec['total_us']:.0f} us of device time per call")
            for k in kernels:
                print(f"  {k['us']:9.1f} us  {k['launches']:4.1f} x  {k['name'][:90]}")
            if args.launches:
                print("  launches of the last call, in order:")
                for name, us in sequence:
                    print(f"    {us:9.1f} us  {name[:90]}")
            records.append(rec)
    return records


def device_us(ev) -> float:
    """A torch.profiler average's own device time in us (``self_cuda_time_total`` on older torch)."""
    us = getattr(ev, "self_device_time_total", None)
    return getattr(ev, "self_cuda_time_total", 0) if us is None else us


def _last_call_launches(prof, calls: int) -> list:
    """``[(kernel name, device us)]`` of the last of ``calls`` profiled calls, in launch order."""
    from torch.autograd import DeviceType

    events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    events.sort(key=lambda e: e.time_range.start)
    per_call = len(events) // max(calls, 1)
    return [(e.name, e.time_range.elapsed_us()) for e in events[len(events) - per_call :]]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="1x3x1080x1920,5x3x1080x1920", help="BxCxHxW list")
    p.add_argument("--ops", default="ssim,dssim_l1,ms_ssim", help=f"subset of {','.join(bench.OPS)}")
    p.add_argument("--modes", default="fwdbwd,fwd")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--rows", default="16,32,64,128,256", help="rows streamed per program")
    p.add_argument("--lanes", default="64,128", help="lanes (columns) per program of the column kernels")
    p.add_argument(
        "--maxnreg",
        default=str(launch.COLUMN_MAXNREG),
        help="register ceilings of the column kernels (64: 32 resident warps per SM; the kernels that "
        "launch with 255 keep it)",
    )
    p.add_argument("--graphed", action="store_true", help="time forward + backward replayed from a CUDA graph")
    p.add_argument("--profile", action="store_true", help="device time per kernel at the default geometry")
    p.add_argument("--launches", action="store_true", help="with --profile: each launch of the last call, in order")
    p.add_argument("--json", help="write the records here")
    args = p.parse_args(argv)
    for name, given, allowed in (("--ops", args.ops, bench.OPS), ("--modes", args.modes, bench.MODES)):
        if not _csv(given) or any(v not in allowed for v in _csv(given)):
            raise SystemExit(f"{name} must be a subset of {','.join(allowed)}, got {given!r}")
    if args.dtype not in ("float32", "bfloat16", "float16"):
        raise SystemExit(f"--dtype must be float32, bfloat16 or float16, got {args.dtype!r}")
    for name in ("--rows", "--lanes", "--maxnreg"):
        bench._ints(name, getattr(args, name[2:]))
    if not torch.cuda.is_available():
        raise SystemExit("geometry_sweep.py times compiled kernels: it needs a CUDA device")
    dtype = getattr(torch, args.dtype)
    records = profile(args, dtype) if args.profile else sweep(args, dtype)
    if args.json:
        info = bench.machine_info("cuda")
        bench.write_json(args.json, {"machine": info, "records": records})
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
