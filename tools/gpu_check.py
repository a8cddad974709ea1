"""The GPU check: one prepared script for a short GPU lease, most valuable step first, each step
under its own time guard, everything it measured written to one Markdown table with the device.

    python tools/gpu_check.py --budget 840 --fused-ssim-src shared/fused-ssim

Steps (each skipped, and said so, when less time is left than it needs; a failed step is recorded
and the next one runs):

1. ``table``: eager and CUDA-graphed forward and forward + backward at 1x3x1080x1920 and
   5x3x2160x3840, float32 (``tools/bench.py`` on CUDA: ``triton.testing.do_bench`` medians), beside
   fused-ssim; the Triton backend's default path (the one-launch kernels) and its two-launch
   variant (``splatloss.backends.triton.split.ENABLED``) side by side.
2. ``host``: host time per eager call on this machine: the wall time of back-to-back eager calls
   against the CUDA events' device time over the same calls (a call is host-bound where the first
   exceeds the second).
3. ``conformance``: the ``gpu``-marked tests on CUDA (``pytest -m gpu tests/backends``).
4. ``gsplat``: a real 3DGS training loop on CUDA (gsplat's rasterizer, compiled on first use) on the
   embedded scene, D-SSIM + L1 through splatloss against L1 + fused-ssim: ms per step over 1000 steps.

fused-ssim is not on PyPI as a wheel: ``--fused-ssim-src`` names a source checkout to build with
``pip install --no-build-isolation`` first (skipped where ``import fused_ssim`` already works).
Writes ``--out`` (default ``docs/gpu_check_run.md``) atomically and the raw records beside it
(``.json``), after every step, so that a lease that ends early keeps what was measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Seconds each step needs at least (its own timeout is what is left of the budget, at most ``most``).
STEPS = {
    "table": {"least": 120, "most": 420},
    "host": {"least": 30, "most": 90},
    "conformance": {"least": 90, "most": 300},
    "gsplat": {"least": 120, "most": 360},
}
SHAPES = (("1080x1920", "1"), ("2160x3840", "5"))


class Run:
    """The records of one check and the time left in its budget."""

    def __init__(self, budget: float, out: Path):
        self.start = time.monotonic()
        self.budget = budget
        self.out = out
        self.records = {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.start)

    def save(self) -> None:
        js = self.out.with_suffix(".json")
        for path, text in ((js, json.dumps(self.records, indent=1, default=str)), (self.out, markdown(self.records))):
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(text + "\n")
            os.replace(tmp, path)


def sh(cmd, timeout: float, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(1, timeout), **kw)


def device_info() -> dict:
    import torch
    import triton

    p = torch.cuda.get_device_properties(0)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], **_quiet())
    return {
        "gpu": p.name,
        "sms": p.multi_processor_count,
        "capability": f"sm_{p.major}{p.minor}",
        "driver": smi.stdout.strip() if smi.returncode == 0 else "unknown",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": sys.version.split()[0],
    }


def _quiet() -> dict:
    return {"capture_output": True, "text": True}


def build_fused_ssim(src, timeout: float) -> str:
    probe = sh([sys.executable, "-c", "import fused_ssim"], 60)
    if probe.returncode == 0:
        return "installed"
    if src is None:
        return "not installed (no --fused-ssim-src)"
    proc = sh([sys.executable, "-m", "pip", "install", "--no-build-isolation", "-q", str(src)], timeout)
    return "built from source" if proc.returncode == 0 else f"build failed: {proc.stderr[-500:]}"


BENCH_VARIANT = (
    "import sys; from splatloss.backends.triton import split; split.ENABLED = {enabled}; "
    "from tools import bench; sys.exit(bench.main(sys.argv[1:]))"
)


def table(run: Run, timeout: float) -> dict:
    """tools/bench.py on CUDA at both shapes, the default path with fused-ssim and the two-launch
    variant beside it; records by variant and shape."""
    out, deadline = {}, time.monotonic() + timeout
    for variant, enabled, libs in (
        ("one launch (default)", False, "splatloss-triton,splatloss-triton-graphed,fused_ssim"),
        ("two launches", True, "splatloss-triton,splatloss-triton-graphed"),
    ):
        for size, batch in SHAPES:
            left = deadline - time.monotonic()
            if left < 20:
                out[f"{variant} {batch}x3x{size}"] = "skipped: the step's time ran out"
                continue
            js = run.out.with_name(f"bench_{'split' if enabled else 'default'}_{batch}x{size}.json")
            args = ["--device", "cuda", "--sizes", size, "--batch", batch, "--channels", "3", "--dtype", "float32"]
            args += ["--ops", "ssim,dssim_l1,ms_ssim,dssim_l1_masked", "--modes", "fwd,fwdbwd", "--libs", libs]
            args += ["--repeats", "3", "--json", str(js)]
            try:
                proc = sh([sys.executable, "-c", BENCH_VARIANT.format(enabled=enabled), *args], left)
            except subprocess.TimeoutExpired:
                out[f"{variant} {batch}x3x{size}"] = "timed out"
                continue
            if proc.returncode != 0 or not js.exists():
                out[f"{variant} {batch}x3x{size}"] = f"failed: {proc.stderr[-800:]}"
                continue
            out[f"{variant} {batch}x3x{size}"] = json.loads(js.read_text()).get("records", [])
    return out


def host_times(calls: int = 200) -> dict:
    """Per call: wall time of ``calls`` eager calls back to back (synchronised once, at the end)
    against the CUDA events' device time over the same calls, 1x3x1080x1920 float32, fwd + bwd."""
    import torch

    import splatloss as sl

    x = torch.rand(1, 3, 1080, 1920, device="cuda", requires_grad=True)
    y = torch.rand(1, 3, 1080, 1920, device="cuda")
    m = (torch.rand(1, 1, 1080, 1920, device="cuda") > 0.1).float()
    cases = {
        "F.l1_loss": lambda: torch.nn.functional.l1_loss(x, y),
        "ssim loss": lambda: 1 - sl.ssim(x, y, backend="triton"),
        "dssim_l1 same": lambda: sl.dssim_l1(x, y, 0.2, padding="same", backend="triton"),
        "masked dssim_l1 same": lambda: sl.dssim_l1(x, y, 0.2, padding="same", mask=m, backend="triton"),
        "ms_ssim loss": lambda: 1 - sl.ms_ssim(x, y, backend="triton"),
    }
    try:
        from fused_ssim import fused_ssim

        cases["fused-ssim D-SSIM + L1"] = lambda: 0.8 * (x - y).abs().mean() + 0.2 * (1 - fused_ssim(x, y))
    except ImportError:
        pass
    out = {}
    for name, fn in cases.items():
        for _ in range(10):
            x.grad = None
            fn().backward()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        for _ in range(calls):
            x.grad = None
            fn().backward()
        end.record()
        host = (time.perf_counter() - t0) / calls
        end.synchronize()
        wall = (time.perf_counter() - t0) / calls
        out[name] = {
            "host enqueue us": host * 1e6,
            "wall us": wall * 1e6,
            "device us": start.elapsed_time(end) * 1e3 / calls,
        }
    return out


def conformance(timeout: float) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/backends", "-q", "-n", "8", "-p", "no:cacheprovider"]
    proc = sh(cmd, timeout)
    tail = proc.stdout.strip().splitlines()[-1:] or [""]
    failures = proc.stdout[-3000:] if proc.returncode else ""
    return {"returncode": proc.returncode, "summary": tail[0], "failures": failures}


def gsplat_steps(steps: int = 1000) -> dict:
    """ms per training step on CUDA over ``steps`` steps: D-SSIM + L1 through splatloss against
    L1 + fused-ssim, the same Gaussians, views and Adam settings."""
    import torch

    import splatloss as sl
    from splatloss.splat.gaussians import Gaussians
    from splatloss.splat.renderer import render
    from splatloss.splat.synthetic import default_scene

    scene = default_scene(image_size=256, n_points=20000)
    views = [(v, v.image.permute(2, 0, 1)[None].cuda()) for v in scene.train]
    for v, _ in views:
        v.viewmat, v.K = v.viewmat.cuda(), v.K.cuda()
    losses = {"splatloss dssim_l1": lambda p, t: sl.dssim_l1(p, t, 0.2, padding="same", backend="triton")}
    try:
        from fused_ssim import fused_ssim

        losses["l1 + fused_ssim"] = lambda p, t: 0.8 * (p - t).abs().mean() + 0.2 * (1 - fused_ssim(p, t))
    except ImportError:
        pass
    out = {}
    for name, loss_fn in losses.items():
        g = Gaussians.from_points(torch.as_tensor(scene.points), torch.as_tensor(scene.colors)).cuda()
        opt = torch.optim.Adam(g.parameters(), lr=1e-3)
        bg = torch.as_tensor(scene.background, dtype=torch.float32, device="cuda")

        def step(i):
            v, target = views[i % len(views)]
            pred = render(g, v, background=bg)["image"].permute(2, 0, 1)[None]
            loss = loss_fn(pred, target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss

        for i in range(20):  # gsplat's kernels compile on first use; warm both losses alike
            step(i)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(steps):
            last = step(i)
        torch.cuda.synchronize()
        out[name] = {"ms per step": (time.perf_counter() - t0) * 1e3 / steps, "last loss": float(last)}
    return out


def markdown(rec: dict) -> str:
    dev = rec.get("device", {})
    lines = [
        "# GPU check run",
        "",
        f"{dev.get('gpu', 'no GPU')} ({dev.get('capability', '?')}, {dev.get('sms', '?')} SMs, driver "
        f"{dev.get('driver', '?')}), torch {dev.get('torch', '?')}, Triton {dev.get('triton', '?')}; started "
        f"{rec.get('started')}; fused-ssim: {rec.get('fused_ssim', 'not tried')}. Written by `tools/gpu_check.py`.",
        "",
    ]
    tab = rec.get("table")
    if isinstance(tab, dict):
        lines += ["## Eager and CUDA-graphed, ms (do_bench medians)", "", "| variant, shape | loss | pass | lib | ms |"]
        lines += ["|---|---|---|---|---:|"]
        for key, recs in tab.items():
            if not isinstance(recs, list):
                lines.append(f"| {key} | {recs} | | | |")
                continue
            for r in recs:
                ms = r.get("ms", r.get("time_ms"))
                lines.append(f"| {key} | {r.get('op')} | {r.get('mode')} | {r.get('lib')} | {ms} |")
        lines.append("")
    for step, title in (("host", "Host time per eager call, 1x3x1080x1920 fwd + bwd"), ("gsplat", "gsplat training")):
        val = rec.get(step)
        if isinstance(val, dict):
            lines += [f"## {title}", "", "| case | " + " | ".join(next(iter(val.values()), {}).keys()) + " |"]
            lines.append("|---" * (1 + len(next(iter(val.values()), {}))) + "|")
            for name, row in val.items():
                cells = " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in row.values())
                lines.append(f"| {name} | {cells} |")
            lines.append("")
        elif val is not None:
            lines += [f"## {title}", "", str(val), ""]
    if "conformance" in rec:
        lines += ["## Conformance on CUDA", "", f"`pytest -m gpu tests/backends`: {rec['conformance']}", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=840, help="seconds for the whole check (default 840)")
    p.add_argument("--fused-ssim-src", type=Path, default=None, help="a fused-ssim source checkout to build first")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "gpu_check_run.md", help="the Markdown table")
    p.add_argument("--steps", default="table,host,conformance,gsplat", help="steps to run, in this order")
    p.add_argument("--_child", choices=("host", "gsplat"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._child:  # a step run in its own process, under the parent's timeout: its records on stdout
        print(json.dumps(host_times() if args._child == "host" else gsplat_steps()))
        return 0
    steps = [s for s in args.steps.split(",") if s]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        p.error(f"--steps: unknown {unknown}, choose from {list(STEPS)}")
    if args.budget < 60:
        p.error(f"--budget must be at least 60 seconds, got {args.budget}")
    if not os.access(args.out.parent, os.W_OK):
        p.error(f"--out: cannot write to the folder {args.out.parent}")
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("gpu_check needs a CUDA GPU, but torch sees none here")
    run = Run(args.budget, args.out)
    run.records["device"] = device_info()
    run.records["fused_ssim"] = build_fused_ssim(args.fused_ssim_src, min(300.0, run.left() / 3))
    run.save()
    for step in steps:
        need = STEPS[step]
        left = run.left()
        if left < need["least"]:
            run.records[step] = f"skipped: {left:.0f} s left, the step needs {need['least']} s"
            run.save()
            continue
        timeout = min(need["most"], left - 10)
        t0 = time.monotonic()
        print(f"[gpu_check] {step} (up to {timeout:.0f} s)", flush=True)
        try:
            if step == "table":
                run.records[step] = table(run, timeout)
            elif step == "conformance":
                run.records[step] = conformance(timeout)
            else:  # in a child process, so that the step's timeout holds (gsplat compiles on first use)
                proc = sh([sys.executable, str(Path(__file__).resolve()), "--_child", step], timeout)
                last = proc.stdout.strip().splitlines()[-1:] or [""]
                run.records[step] = json.loads(last[0]) if proc.returncode == 0 else f"failed: {proc.stderr[-800:]}"
        except subprocess.TimeoutExpired:
            run.records[step] = f"timed out after {timeout:.0f} s"
        except Exception as err:  # a failed step is recorded; the next one still runs
            run.records[step] = f"failed: {type(err).__name__}: {err}"
        run.records.setdefault("step seconds", {})[step] = round(time.monotonic() - t0, 1)
        run.save()
    print(markdown(run.records))
    return 0


if __name__ == "__main__":
    if __package__ in (None, ""):  # run as python tools/gpu_check.py: the repository root importable
        sys.path.insert(0, str(ROOT))
    sys.exit(main())
