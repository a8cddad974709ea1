"""Fused L1 + D-SSIM and MS-SSIM on the Triton kernels (interpreter), against float64 truth.

See tests/test_triton_ssim.py for the tolerance conventions (normwise relative error against the
float64 reference on the same input values; fp16 gradients within one fp16 ulp of the
reference's own fp16 gradient).
"""

import importlib

import pytest
import torch

import splatloss
from splatloss import reference
from splatloss.config import SSIMConfig

tri = importlib.import_module("splatloss.backends.triton")
tri_ms = importlib.import_module("splatloss.backends.triton.ms_ssim")

pytestmark = [pytest.mark.triton, pytest.mark.slow]

REL = 1e-5


def _pair(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=g, dtype=torch.float64)
    y = (0.6 * x + 0.4 * torch.rand(shape, generator=g, dtype=torch.float64)).clamp(0, 1)
    return x, y


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _dssim_l1_reference(x, y, cfg, lam):
    l1 = (x - y).abs().mean(dim=(1, 2, 3))
    return (1 - lam) * l1 + lam * (1 - reference.ssim_stats(x, y, cfg)[0].mean(dim=1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("padding", ["valid", "same"])
def test_fused_dssim_l1_values_and_both_gradients(padding, dtype):
    """The fused kernel pair: value per image and gradients of both images under a random
    per-image upstream gradient ("valid" also checks that L1 counts the pixels the map drops)."""
    cfg = SSIMConfig(padding=padding)
    x64, y64 = _pair((2, 3, 37, 53))
    up = torch.tensor([0.7, -1.3], dtype=torch.float64)
    x, y = x64.to(dtype).requires_grad_(True), y64.to(dtype).requires_grad_(True)
    v = tri.dssim_l1(x, y, cfg, 0.2)
    gx, gy = torch.autograd.grad((v * up.float()).sum(), [x, y])
    xr, yr = x.detach().double().requires_grad_(True), y.detach().double().requires_grad_(True)
    vr = _dssim_l1_reference(xr, yr, cfg, 0.2)
    gxr, gyr = torch.autograd.grad((vr * up).sum(), [xr, yr])
    assert v.shape == (2,) and v.dtype == torch.float32
    assert _rel(v, vr) <= REL
    assert gx.dtype == dtype and gy.dtype == dtype
    if dtype == torch.float32:
        assert _rel(gx, gxr) <= REL and _rel(gy, gyr) <= REL
    else:
        # reference in fp16: autograd rounds its fp32 gradient to fp16, as the kernel does
        xl, yl = x.detach().clone().requires_grad_(True), y.detach().clone().requires_grad_(True)
        vl = _dssim_l1_reference(xl.float(), yl.float(), cfg, 0.2)
        gxl, gyl = torch.autograd.grad((vl * up.float()).sum(), [xl, yl])
        for a, b in ((gx, gxl), (gy, gyl)):
            a, b = a.double(), b.double()
            assert bool(((a - b).abs() <= 2.0**-10 * b.abs() + REL * b.abs().max() + 2.0**-24).all())


def test_dssim_l1_through_the_public_api():
    x64, y64 = _pair((1, 3, 24, 26), seed=1)
    x = x64.float().requires_grad_(True)
    v = splatloss.dssim_l1(x, y64.float(), 0.2, padding="same", backend="triton")
    (g,) = torch.autograd.grad(v, [x])
    xr = x64.clone().requires_grad_(True)
    vr = _dssim_l1_reference(xr, y64, SSIMConfig(padding="same"), 0.2).mean()
    (gr,) = torch.autograd.grad(vr, [xr])
    assert _rel(v, vr) <= REL and _rel(g, gr) <= REL


def test_pyramid_kernel_equals_the_reference_step_on_odd_sides():
    x64, _ = _pair((2, 3, 37, 53), seed=2)
    x = x64.float().requires_grad_(True)
    d = tri_ms.downsample2x(x)
    xr = x64.clone().requires_grad_(True)
    dr = reference.downsample2x(xr)
    assert d.shape == (2, 3, 19, 27) and d.dtype == torch.float32
    up = torch.randn(dr.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    (g,) = torch.autograd.grad((d * up.float()).sum(), [x])
    (gr,) = torch.autograd.grad((dr * up).sum(), [xr])
    assert _rel(d, dr) <= 1e-6 and _rel(g, gr) <= 1e-6
    # fp16 input is read as fp16 and averaged in fp32: no full-size fp32 copy is made
    dh = tri_ms.downsample2x(x64.half())
    assert dh.dtype == torch.float32 and _rel(dh, reference.downsample2x(x64.half().double())) <= 1e-6


def test_ms_ssim_163x171_value_and_both_gradients():
    """All five scales (163 -> 82 -> 41 -> 21 -> 11 rows, odd sides repeat-padded), TF conventions,
    through splatloss.ms_ssim(backend="triton")."""
    x64, y64 = _pair((1, 1, 163, 171), seed=4)
    x, y = x64.float().requires_grad_(True), y64.float().requires_grad_(True)
    v = splatloss.ms_ssim(x, y, backend="triton")
    gx, gy = torch.autograd.grad(v, [x, y])
    xr, yr = x64.clone().requires_grad_(True), y64.clone().requires_grad_(True)
    vr = splatloss.ms_ssim(xr, yr, backend="reference")
    gxr, gyr = torch.autograd.grad(vr, [xr, yr])
    assert _rel(v, vr) <= REL
    assert _rel(gx, gxr) <= REL and _rel(gy, gyr) <= REL
    assert bool((gx != 0).all()) and bool((gy != 0).all())  # no row or column dropped by the pyramid


def test_ms_ssim_loss_on_negative_structure_keeps_a_gradient():
    """y = 1 - x inverts the structure (cs < 0 at every scale): the metric is 0 like TF's, the loss
    (tau, the core's smooth positive extension) stays positive with a finite, non-zero gradient,
    equal to the reference's."""
    x64, _ = _pair((1, 2, 45, 47), seed=5)
    y64 = 1 - x64
    w = (0.3, 0.3, 0.4)
    x = x64.float().requires_grad_(True)
    metric = splatloss.ms_ssim(x, y64.float(), weights=w, backend="triton")
    assert float(metric.detach()) == 0.0
    loss = splatloss.ms_ssim(x, y64.float(), weights=w, tau=0.01, backend="triton")
    (g,) = torch.autograd.grad(loss, [x])
    xr = x64.clone().requires_grad_(True)
    loss_r = splatloss.ms_ssim(xr, y64, weights=w, tau=0.01, backend="reference")
    (gr,) = torch.autograd.grad(loss_r, [xr])
    assert float(loss.detach()) > 0 and bool(torch.isfinite(g).all()) and float(g.abs().max()) > 0
    assert _rel(loss, loss_r) <= REL and _rel(g, gr) <= REL
