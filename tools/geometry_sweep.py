"""Time the Triton kernels under other launch geometries on a CUDA GPU.

The launch geometry (lanes per program, rows streamed per program) is chosen by
``splatloss/backends/triton/launch.py``. This script overrides it for a sweep: each geometry runs
the same losses on the same inputs (``tools/bench.py``'s), is timed with ``triton.testing.do_bench``
and checked against the default geometry's value (a geometry changes only which program sums which
rows, so the loss may differ in its last bits, never more). The records, with the device's name, go
to ``--json``; the fastest geometry per (op, mode, shape) is printed last.

    python tools/geometry_sweep.py --json geometry.json
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

from splatloss.backends.triton import launch  # noqa: E402


def _csv(s):
    return [v for v in s.split(",") if v]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="1x3x1080x1920,5x3x1080x1920", help="BxCxHxW list")
    p.add_argument("--ops", default="ssim,dssim_l1,ms_ssim", help=f"subset of {','.join(bench.OPS)}")
    p.add_argument("--modes", default="fwdbwd,fwd")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--rows", default="16,32,64,128,256", help="rows streamed per program")
    p.add_argument("--lanes", default="64,128", help="lanes (columns) per program of the column kernels")
    p.add_argument("--json", help="write the records here")
    args = p.parse_args(argv)
    for name, given, allowed in (("--ops", args.ops, bench.OPS), ("--modes", args.modes, bench.MODES)):
        if not _csv(given) or any(v not in allowed for v in _csv(given)):
            raise SystemExit(f"{name} must be a subset of {','.join(allowed)}, got {given!r}")
    try:
        rows_lanes = [int(v) for v in _csv(args.rows)], [int(v) for v in _csv(args.lanes)]
    except ValueError:
        raise SystemExit(f"--rows and --lanes take integers, got {args.rows!r} and {args.lanes!r}")
    if any(v < 1 for v in rows_lanes[0] + rows_lanes[1]):
        raise SystemExit(f"--rows and --lanes must be >= 1, got {args.rows!r} and {args.lanes!r}")
    if not torch.cuda.is_available():
        raise SystemExit("geometry_sweep.py times compiled kernels: it needs a CUDA device")
    from triton.testing import do_bench

    dtype = getattr(torch, args.dtype)
    default_rows, default_lanes = launch.CUDA_ROWS, launch.cuda_lanes
    records = []
    for shape_s in _csv(args.shapes):
        shape = tuple(int(v) for v in shape_s.split("x"))
        x, y = bench.make_inputs(*shape, dtype, "cuda")
        for op, mode in itertools.product(_csv(args.ops), _csv(args.modes)):
            ref = None
            for rows, lanes in [(None, None)] + list(itertools.product(*rows_lanes)):
                launch.CUDA_ROWS = default_rows if rows is None else rows
                launch.cuda_lanes = default_lanes if lanes is None else (lambda k, n=lanes: n if k <= 15 else 64)
                rec = dict(
                    op=op,
                    mode=mode,
                    shape=shape_s,
                    dtype=args.dtype,
                    rows=rows or default_rows,
                    lanes=lanes or default_lanes(11),
                    default=rows is None,
                )
                try:
                    call = bench.make_call(bench.make_loss("splatloss-triton", op, "cuda"), x, y, mode)
                    value = float(call().detach())
                    torch.cuda.synchronize()
                    ref = value if ref is None else ref
                    rec["value"], rec["rel_diff_vs_default"] = value, abs(value - ref) / max(abs(ref), 1e-30)
                    rec["median_ms"] = do_bench(call, warmup=25, rep=100, return_mode="median")
                except Exception as exc:  # a geometry the kernels refuse: record why, go on
                    rec["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                print(json.dumps(rec), flush=True)
                records.append(rec)
    launch.CUDA_ROWS, launch.cuda_lanes = default_rows, default_lanes
    print("\n# fastest geometry per configuration (default in brackets)")
    key = lambda r: (r["op"], r["mode"], r["shape"])  # noqa: E731
    for k, group in itertools.groupby(sorted(records, key=key), key=key):
        timed = [r for r in group if "median_ms" in r]
        if not timed:
            continue
        best = min(timed, key=lambda r: r["median_ms"])
        dflt = next(r for r in timed if r["default"])
        print(
            f"{k}: rows {best['rows']} lanes {best['lanes']} {best['median_ms'] * 1e3:.0f} us "
            f"[rows {dflt['rows']} lanes {dflt['lanes']} {dflt['median_ms'] * 1e3:.0f} us]"
        )
    if args.json:
        info = bench.machine_info("cuda")
        bench.write_json(args.json, {"machine": info, "records": records})
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
