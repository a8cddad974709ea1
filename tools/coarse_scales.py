"""Time MS-SSIM's coarser scales' backward launch at each program width on a CUDA GPU.

The coarser scales of a 1080p MS-SSIM run as one launch (``backward.launch_bwd_scales``) in programs
of 256 lanes and 8 warps (the plan) or of 128 lanes and 4 warps; on a shape's first call
:mod:`splatloss.backends.triton.tune` measures both, each with its list of rows per program. This
script times the launch (its kernel, by torch.profiler's device time per launch) five ways on the
same random pair: each width at its planned rows, each width at the rows its own list keeps, and
the default (both lists measured), and checks that the narrow programs' gradient is the wide ones'
bit for bit. The records go to ``--json``.

    python tools/coarse_scales.py --batch 1 --json coarse_1080p.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from geometry_sweep import device_us  # noqa: E402  (a profiler average's device time)

KERNEL = "ssim_bwd_scales_kernel"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1, help="images of 3x1080x1920")
    p.add_argument("--calls", type=int, default=20, help="profiled launches per way")
    p.add_argument("--json", type=Path, help="write the records here")
    args = p.parse_args(argv)
    if args.batch < 1 or args.calls < 1:
        raise SystemExit(f"--batch and --calls must be at least 1, got {args.batch} and {args.calls}")
    if args.json is not None:  # before the GPU work, not after it
        folder = args.json.resolve().parent
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise SystemExit(f"--json {args.json}: the folder {folder} is not a writable directory")
    if not torch.cuda.is_available():
        raise SystemExit("tools/coarse_scales.py times CUDA launches: it needs a CUDA device, torch sees none")
    from torch.profiler import ProfilerActivity, profile

    from splatloss.backends.triton import backward, glue, tune
    from splatloss.backends.triton.ms_ssim import _coarse_dims
    from splatloss.config import SSIMConfig

    dev = torch.device("cuda")
    cfg = SSIMConfig()
    dims = _coarse_dims(1080, 1920, 5)
    n = sum(args.batch * 3 * h * w for h, w in dims)
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.rand(n, device=dev, generator=gen)
    y = (x + 0.1 * torch.rand(n, device=dev, generator=gen)).clamp(0, 1)
    call = (x, y, args.batch, 3, dims, glue.window_taps(cfg, dev), cfg.padding, float(cfg.C1), float(cfg.C2))
    records = {"gpu": torch.cuda.get_device_name(dev), "batch": args.batch, "dims": dims, "ways": {}}
    enabled = tune.ENABLED
    grads = {}
    try:
        for way, wide, measured in (
            ("wide, planned rows", True, False),
            ("narrow, planned rows", False, False),
            ("wide, measured rows", True, True),
            ("narrow, measured rows", False, True),
            ("default: both widths measured", None, True),
        ):
            tune.ENABLED = measured
            tune.clear()
            for _ in range(3):  # compile, measure the list, warm
                gx = backward.launch_bwd_scales(*call, True, False, wide=wide)[0]
            grads[way] = gx
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.calls):
                    backward.launch_bwd_scales(*call, True, False, wide=wide)
                torch.cuda.synchronize()
            us = [device_us(ev) / ev.count for ev in prof.key_averages() if ev.key == KERNEL]
            kept = {str(k[5]): str(v) for k, v in tune.chosen().items()}
            records["ways"][way] = {"kernel_us": us[0] if us else None, "kept": kept}
            print(f"{way:32s} {us[0] if us else float('nan'):8.1f} us  kept {kept}", flush=True)
    finally:
        tune.ENABLED = enabled
        tune.clear()
    same = all(torch.equal(g, grads["wide, planned rows"]) for g in grads.values())
    records["gradients_bit_equal"] = same
    print(f"gradients bit-equal across the ways: {same}")
    if args.json:
        tmp = args.json.with_name(args.json.name + ".tmp")
        tmp.write_text(json.dumps(records, indent=1))
        os.replace(tmp, args.json)  # atomic: a reader sees the old file or the whole new one
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
