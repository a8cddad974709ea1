"""Ahead-of-time compilation of the Triton kernels for sm_90 and sm_80 (no GPU needed).

Runs tools/check_kernels.py as CI does: it compiles each kernel at the constexprs, warp counts
and register ceiling the launchers use and fails on any register spill or on shared memory over
the architecture's limit. The interpreter tests prove the numbers; this proves the compiler
accepts the same code and that it fits the hardware.

What the suite compiles, and why not everything twice (``./dev kernels`` does compile every call
for both architectures; with an empty Triton cache each variant costs seconds of a core):

- sm_90, every call of ``check_kernels.aot_calls`` but the 1080p ones. sm_90 is the tighter
  architecture for most variants: in the table ``./dev kernels`` prints, its register count is at
  least sm_80's for all but a few (the channels-last backward, 242 against 248, the evaluation's
  forward, 124 against 125, the lean forward, which sm_80 runs at 72 registers where sm_90 fits
  64, and the masked backward in bfloat16, which spills 8 B at 128 on sm_80 and so takes 168
  everywhere), and the heaviest variants sit at the 255-register ceiling on both.
- sm_80, the heaviest variant of each kernel family, and the two where sm_80 needs more registers
  than sm_90: the fused backward at the default window (255 registers) and at the largest
  (K = 31), the forward at both, the map with ``cs`` (the heaviest 4-warp forward), the
  channels-last backward, the evaluation's forward (at 72 registers there) at the default window
  and at 9 taps, MS-SSIM's lean forward, the masked backward's two lean launches (float32,
  and bfloat16 with a mask per channel and the second image's gradient), MS-SSIM in fp16 (the downsampling, pyramid
  backward and combine kernels, half-precision stores, the coarser scales' backward launch) and
  without a gradient (their forward launch), the pyramid step's own backward (called
  alone) and the masked kernels under "reflect" (254 / 255 registers). A spill of
  any family on sm_80 shows in its heaviest variant first.
- The 1080p calls (the cost model's) for both architectures are compiled by
  tests/test_sass_cost.py::test_cost_json_structure_no_spills, which fails on any spill or shared
  memory over the limit in them, so they are not compiled a second time here.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.triton, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]

FAMILIES = {
    "ssim_bwd_kernel",
    "ssim_fwd_kernel",
    "ssim_bwd_scales_kernel",
    "ssim_fwd_scales_kernel",
    "ssim_moments_kernel",
    "ssim_adjoint_kernel",
    "moments_scales_kernel",
    "adjoint_scales_kernel",
    "down_fwd_kernel",
    "down_bwd_kernel",
    "pyramid_kernel",
    "chain_kernel",
    "means_kernel",
    "dssim_l1_kernel",
    "combine_fwd_kernel",
    "combine_bwd_kernel",
    "masked_bwd_kernel",
    "masked_fwd_kernel",
    "masked_moments_kernel",
    "masked_adjoint_kernel",
    "masked_weights_kernel",
    "masked_reduce_kernel",
    "rescale_kernel",
}

# the sm_80 calls (labels of check_kernels.aot_calls), as --only patterns; the two-launch variant's
# kernel families come from the calls named with "(two launches)"
SM80_CALLS = (
    r"dssim_l1 reflect K=(11|31) (both grads|no grad)",
    r"ssim_map \+cs reflect K=11 both grads",
    r"ssim same channels-last( \(two launches\))?",
    r"ssim same no grad",
    r"ssim same no grad K=9",
    r"dssim_l1 same no grad K=(9|11)",
    r"ms_ssim same no grad",
    r"masked dssim_l1 valid K=11 grad x( \(two launches\))?",
    r"masked dssim_l1 same K=11 grad y, per channel bf16( \(two launches\))?",
    r"ms_ssim loss float16( \(two launches\))?",
    r"ms_ssim odd sides, both grads",
    r"ms_ssim no grad",
    r"pyramid step alone",
    r"masked dssim_l1 reflect K=9 both grads",
    r"masked ms_ssim reflect K=9",
)

PARTS = {
    # (architecture, --only pattern, the least number of calls it must compile)
    "sm_90-every-call": (90, r"^(?!1080p )", 50),
    "sm_80-heaviest-per-family": (80, "^(" + "|".join(SM80_CALLS) + ")$", 15),
}


# A change to a device function shared by most kernels (columns.py) recompiles them all: with a cold
# Triton cache the sm_90 part has taken over 900 s on a busy 2-core machine; the subprocess keeps
# its own 1500 s limit.
@pytest.mark.timeout(1600)
@pytest.mark.parametrize("part", PARTS)
def test_check_kernels_compiles_everything_without_spills(part):
    arch, only, least = PARTS[part]
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "check_kernels.py"), "--arch", str(arch), "--only", only],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,  # a cold Triton cache: minutes on a 2-core machine with a test run beside it
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    # One row per compiled kernel: call, kernel, sm, warps, regs, spill B, smem B, limit, seconds.
    row = re.compile(
        r"^(?P<call>.+?)\s+(?P<kernel>\w+_kernel)\s+(?P<sm>80|90)\s+\d+\s+\d+\s+(?P<spill>\d+)\s+\d+\s+\d+"
    )
    rows = [m for m in map(row.match, proc.stdout.splitlines()) if m]
    calls = {m["call"] for m in rows}
    assert {m["sm"] for m in rows} == {str(arch)}
    assert len(calls) >= least, sorted(calls)
    assert not any(c.startswith("1080p") for c in calls)
    # every kernel family the public calls launch
    assert {m["kernel"] for m in rows} == FAMILIES, sorted({m["kernel"] for m in rows})
    assert all(int(m["spill"]) == 0 for m in rows)
    assert "no spills, shared memory within limits" in proc.stdout
