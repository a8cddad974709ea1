"""Ahead-of-time compilation of every Triton kernel for sm_80 and sm_90 (no GPU needed).

Runs tools/check_kernels.py as CI does: it compiles each kernel at the constexprs, warp counts
and register ceiling the launchers use and fails on any register spill or on shared memory over
the architecture's limit. The interpreter tests prove the numbers; this proves the compiler
accepts the same code and that it fits the hardware.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.triton, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]


def test_check_kernels_compiles_everything_without_spills():
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "check_kernels.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,  # a cold Triton cache: about 19 min on a 2-core machine with a test run beside it
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    # One row per compiled kernel: call, kernel, sm, warps, regs, spill B, smem B, limit, seconds.
    row = re.compile(
        r"^(?P<call>.+?)\s+(?P<kernel>\w+_kernel)\s+(?P<sm>80|90)\s+\d+\s+\d+\s+(?P<spill>\d+)\s+\d+\s+\d+"
    )
    rows = [m for m in map(row.match, proc.stdout.splitlines()) if m]
    per_arch = {sm: [m for m in rows if m["sm"] == sm] for sm in ("80", "90")}
    # Every kernel variant the table of public calls launches, for both architectures (118 each today).
    assert len(per_arch["80"]) == len(per_arch["90"]) >= 58, {k: len(v) for k, v in per_arch.items()}
    assert all(int(m["spill"]) == 0 for m in rows)
    assert "no spills, shared memory within limits" in proc.stdout
