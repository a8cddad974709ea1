"""The host-time benchmark (tools/host_time.py): the Triton backend through Triton's real launch path
over a stub CUDA driver. Its counts are checked here on a small shape; its times are the
benchmark's to report, not a test's."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.triton, pytest.mark.slow]

#: Triton launches per call. Forward: the kernel and the launch that forms the loss from its partial
#: sums. With a gradient: the backward kernel in the forward (the gradient computed there), the
#: loss's launch, the kept gradient's scaling in the backward; masked, the weights' launch first.
LAUNCHES = {
    "F.l1_loss fwd+bwd (anchor)": 0,
    "empty autograd.Function fwd+bwd (anchor)": 0,
    "ssim loss fwd": 2,
    "ssim loss fwd+bwd": 3,
    "dssim_l1 valid fwd+bwd": 3,
    "dssim_l1 same fwd": 2,
    "dssim_l1 same fwd+bwd": 3,
    "masked dssim_l1 same fwd+bwd": 4,
}


def test_launches_and_no_host_synchronisation_on_the_training_paths(tmp_path):
    out = tmp_path / "host.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the compiled kernels
    proc = subprocess.run(
        [sys.executable, "tools/host_time.py", "--shape", "1x3x64x64", "--counts-only", "--verify", "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    cases = report["cases"]
    assert {name: row["launches"] for name, row in cases.items()} == LAUNCHES
    for name, row in cases.items():
        # no read of a tensor on the host, and no image-sized work outside the kernels (a mask's
        # sums are taken once per mask, not once a call)
        assert row["host syncs"] == 0, name
        assert row["image ops"] == 0, name
    # every cached launch hands Triton's launcher what kernel[grid] hands it
    assert report["verify"] and all(bad == [] for bad in report["verify"].values()), report["verify"]


def test_refuses_a_bad_shape_and_runs_only_as_a_fresh_process():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "tools/host_time.py", "--shape", "1x3x64"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2 and "--shape must be BxCxHxW" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "tools/host_time.py", "--shape", "1x3x8x8"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2 and "--shape needs images of at least 11x11" in proc.stderr
    code = "import triton\nfrom tools import host_time\nhost_time.install_stub_driver(None)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "Triton was imported before the stub driver" in proc.stderr
