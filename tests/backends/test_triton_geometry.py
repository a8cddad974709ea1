"""Triton's CUDA launch geometry, run in the interpreter (or on CUDA): the same numbers as float64.

The interpreter normally runs one wide program; here it runs the exact CUDA geometry (128 lanes,
channel packing, column strips with halos) with 8-row chunks (ROWS is a runtime argument, so this
is the compiled code's logic) to prove the strip / chunk / lane seams. The interpreter's time is
per row a program streams (its chunk plus the window's halo rows), whatever the lane count: the
images are as short as the chunks they exercise, and as wide as their column strips need.
"""

import importlib

import pytest
import torch

import splatloss
from conftest import TOL, assert_rel, device_for, make_pair
from splatloss import reference
from splatloss.config import SSIMConfig

pytestmark = [pytest.mark.triton, pytest.mark.slow]

#: rows per program (the chunk height) in the CUDA geometry these tests run
ROWS = 8


@pytest.fixture
def cuda_geometry(monkeypatch):
    """The CUDA launch geometry in the interpreter, in chunks of exactly ``ROWS`` rows."""
    tri_launch = importlib.import_module("splatloss.backends.triton.launch")
    monkeypatch.setattr(tri_launch, "FORCE_CUDA_GEOMETRY", True)
    monkeypatch.setattr(tri_launch, "CUDA_ROWS", ROWS)
    monkeypatch.setattr(tri_launch, "ROW_STEPS", ())


@pytest.mark.parametrize(
    "shape,padding,window_size",
    [
        # lanes packed 4 channels per program, 2 (fwd) / 3 (bwd) row chunks, short last chunks
        ((1, 3, 22, 40), "valid", 11),
        ((1, 1, 8, 150), "reflect", 11),  # two column strips per row, mirrored borders at strip edges
        # 32-deep tap tiles, 64-lane programs, 2 strips x 2 chunks (16 rows: "reflect" needs more than 15)
        ((1, 1, 16, 45), "reflect", 31),
        ((1, 2, 12, 300), "same", 11),  # interior strips (unmasked rows) between edge strips, padded rows
        ((1, 1, 10, 300), "valid", 5),  # interior strips, a short last strip
        ((1, 1, 10, 290), "reflect", 9),  # interior strips beside mirrored edge strips
    ],
)
def test_cuda_launch_geometry(cuda_geometry, shape, padding, window_size):
    tri = splatloss.backends.get("triton")
    dev = device_for("triton")
    cfg = SSIMConfig(padding=padding, window_size=window_size, sigma=1.5 if window_size == 11 else 5.0)
    x, y = make_pair(shape, seed=3, device=dev)
    g = torch.Generator().manual_seed(4)
    gs, gc = (
        torch.randn(shape[:2], generator=g, dtype=torch.float64),
        torch.randn(shape[:2], generator=g, dtype=torch.float64),
    )
    xr, yr = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
    s, c = tri.ssim_stats(xr, yr, cfg)
    gx, gy = torch.autograd.grad((s * gs.float().to(dev)).sum() + (c * gc.float().to(dev)).sum(), [xr, yr])
    x6, y6 = x.double().cpu().requires_grad_(True), y.double().cpu().requires_grad_(True)
    s6, c6 = reference.ssim_stats(x6, y6, cfg)
    gx6, gy6 = torch.autograd.grad((s6 * gs).sum() + (c6 * gc).sum(), [x6, y6])
    tol = TOL["triton"]
    assert_rel(s, s6, tol["values"], "ssim mean")
    assert_rel(c, c6, tol["values"], "cs mean")
    assert_rel(gx, gx6, tol["grads"], "grad img1")
    assert_rel(gy, gy6, tol["grads"], "grad img2")
    assert_rel(tri.ssim_map(x, y, cfg), reference.ssim_map(x6.detach(), y6.detach(), cfg), tol["map"], "ssim map")


@pytest.mark.parametrize("layout", ["contiguous", "hwc"])
def test_cuda_geometry_fused_loss(cuda_geometry, layout):
    """The fused D-SSIM + L1 loss (L1 ownership across strips and chunks) on interior and edge
    strips, on a contiguous pair and on an (H, W, C) render seen as (1, C, H, W) (column stride 3:
    the unmasked pass with strided taps), against float64."""
    dev = device_for("triton")
    x, y = make_pair((1, 3, 10, 300), seed=5, device=dev)  # 2 row chunks, 3 (fwd) / 2 (bwd) strips
    if layout == "hwc":
        x, y = (t[0].permute(1, 2, 0).contiguous().permute(2, 0, 1)[None] for t in (x, y))
    xr, yr = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
    loss = splatloss.dssim_l1(xr, yr, 0.2, padding="same", backend="triton")
    gx, gy = torch.autograd.grad(loss, [xr, yr])
    x6, y6 = x.double().cpu().requires_grad_(True), y.double().cpu().requires_grad_(True)
    loss6 = splatloss.dssim_l1(x6, y6, 0.2, padding="same", backend="reference")
    gx6, gy6 = torch.autograd.grad(loss6, [x6, y6])
    tol = TOL["triton"]
    assert_rel(loss.detach().reshape(1), loss6.detach().reshape(1), tol["values"], "loss")
    assert_rel(gx, gx6, tol["grads"], "grad img1")
    assert_rel(gy, gy6, tol["grads"], "grad img2")


@pytest.mark.parametrize("padding, window_size", [("same", 11), ("reflect", 9)])
def test_cuda_geometry_masked_loss(cuda_geometry, padding, window_size):
    """The masked kernels' CUDA geometry on interior and edge strips, two row chunks, one gradient
    (a render's): the fused masked D-SSIM + L1 ("same": the backward in 128-lane programs) and the
    masked SSIM under "reflect" (256-lane programs), value and gradient against float64."""
    dev = device_for("triton")
    x, y = make_pair((1, 1, 10, 300), seed=8, device=dev)
    m = torch.rand((1, 1, 10, 300), generator=torch.Generator().manual_seed(9)) * 0.5 + 0.5

    def run(name, x, y, m):
        xr = x.clone().requires_grad_(True)
        if padding == "same":
            out = splatloss.dssim_l1(xr, y, 0.2, padding=padding, mask=m, backend=name)
        else:
            out = splatloss.ssim(xr, y, padding=padding, window_size=window_size, mask=m, backend=name).sum()
        return out.detach().reshape(1), torch.autograd.grad(out, [xr])[0]

    got = run("triton", x, y, m.to(dev))
    truth = run("reference", x.double().cpu(), y.double().cpu(), m.double())
    tol = TOL["triton"]
    assert_rel(got[0], truth[0], tol["values"], "value")
    assert_rel(got[1], truth[1], tol["grads"], "gradient")


def test_cuda_geometry_map_backward_on_interior_strips(cuda_geometry):
    """The SSIM map's backward (a map-sized upstream gradient, both images) on interior and edge
    strips of the CUDA geometry (2 row chunks), against float64."""
    tri = splatloss.backends.get("triton")
    dev = device_for("triton")
    cfg = SSIMConfig(padding="same")
    x, y = make_pair((1, 1, 12, 300), seed=6, device=dev)
    up = torch.randn((1, 1, 12, 300), generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    xr, yr = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
    gx, gy = torch.autograd.grad((tri.ssim_map(xr, yr, cfg) * up.float().to(dev)).sum(), [xr, yr])
    x6, y6 = x.double().cpu().requires_grad_(True), y.double().cpu().requires_grad_(True)
    gx6, gy6 = torch.autograd.grad((reference.ssim_map(x6, y6, cfg) * up).sum(), [x6, y6])
    tol = TOL["triton"]
    assert_rel(gx, gx6, tol["grads"], "grad img1")
    assert_rel(gy, gy6, tol["grads"], "grad img2")


def test_a_grid_under_one_wave_runs_short_programs(monkeypatch):
    """The default rows per program on the model GPU: a 22x50 image fills one of the 132 SMs' slots,
    so its programs stream 16 rows (2 row chunks, forward and backward) instead of 128; the chunk
    seams give the float64 numbers."""
    tri_launch = importlib.import_module("splatloss.backends.triton.launch")
    monkeypatch.setattr(tri_launch, "FORCE_CUDA_GEOMETRY", True)
    cpu = torch.device("cpu")
    assert tri_launch.geometry(50, 22, 11, 1, cpu).rows == 16
    assert tri_launch.geometry(60, 22, 11, 1, cpu, halo=True).rows == 16
    tri = splatloss.backends.get("triton")
    cfg = SSIMConfig(padding="same")
    x, y = make_pair((1, 1, 22, 50), seed=5, device=device_for("triton"))
    xr, yr = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
    s, _ = tri.ssim_stats(xr, yr, cfg)
    gx, gy = torch.autograd.grad(s.sum(), [xr, yr])
    x6, y6 = x.double().cpu().requires_grad_(True), y.double().cpu().requires_grad_(True)
    s6, _ = reference.ssim_stats(x6, y6, cfg)
    gx6, gy6 = torch.autograd.grad(s6.sum(), [x6, y6])
    tol = TOL["triton"]
    assert_rel(s, s6, tol["values"], "ssim mean")
    assert_rel(gx, gx6, tol["grads"], "grad img1")
    assert_rel(gy, gy6, tol["grads"], "grad img2")
