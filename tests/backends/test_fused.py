"""The fused entry points: dssim_l1, dssim_with_gradient and ssim_mean_and_grad, on every backend."""

import pytest
import torch

import splatloss
from conftest import TOL, ULP, assert_rel, backend_params, device_for, make_pair, side
from splatloss import reference
from splatloss.config import SSIMConfig


def _dssim_l1_truth(x, y, cfg, lam):
    l1 = (x - y).abs().mean(dim=(1, 2, 3))
    return (1 - lam) * l1 + lam * (1 - reference.ssim_stats(x, y, cfg)[0].mean(dim=1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("padding", ["valid", "same", "reflect"])
def test_dssim_l1_values_and_both_gradients(backend, padding, dtype):
    """Backend object, a random per-image upstream ("valid" also checks that L1 counts the pixels
    the map drops); one pixel equal in both images (|x - y|' is 0 there, as torch's abs)."""
    cfg = SSIMConfig(padding=padding)
    x64, y64 = make_pair((2, 3, side(backend, 37, 16), side(backend, 53, 17)), torch.float64, seed=7)
    y64[0, 0, 3, 4] = x64[0, 0, 3, 4]
    dev = device_for(backend)
    up = torch.tensor([0.7, -1.3], dtype=torch.float64)
    x, y = x64.to(dev, dtype).requires_grad_(True), y64.to(dev, dtype).requires_grad_(True)
    v = splatloss.backends.get(backend).dssim_l1(x, y, cfg, 0.2)
    gx, gy = torch.autograd.grad((v * up.to(v)).sum(), [x, y])
    xr, yr = x.detach().double().cpu().requires_grad_(True), y.detach().double().cpu().requires_grad_(True)
    vr = _dssim_l1_truth(xr, yr, cfg, 0.2)
    gxr, gyr = torch.autograd.grad((vr * up).sum(), [xr, yr])
    assert v.shape == (2,) and v.dtype == torch.float32
    assert_rel(v, vr, TOL[backend]["values"], "dssim_l1")
    assert gx.dtype == dtype and gy.dtype == dtype
    if dtype == torch.float32:
        assert_rel(gx, gxr, TOL[backend]["grads"], "grad x")
        assert_rel(gy, gyr, TOL[backend]["grads"], "grad y")
    else:
        # reference in fp32 on the fp16 values: autograd rounds its gradient to fp16, as a kernel does
        xl, yl = x.detach().cpu().clone().requires_grad_(True), y.detach().cpu().clone().requires_grad_(True)
        vl = _dssim_l1_truth(xl.float(), yl.float(), cfg, 0.2)
        gxl, gyl = torch.autograd.grad((vl * up.float()).sum(), [xl, yl])
        for a, b in ((gx, gxl), (gy, gyl)):
            a, b = a.double().cpu(), b.double()
            tol = ULP[torch.float16] * b.abs() + TOL[backend]["grads"] * b.abs().max() + 2.0**-24
            assert bool(((a - b).abs() <= tol).all())


@pytest.mark.parametrize("backend", backend_params())
def test_dssim_l1_through_the_public_api(backend):
    x64, y64 = make_pair((1, 3, 24, 26), torch.float64, seed=1)
    dev = device_for(backend)
    x = x64.float().to(dev).requires_grad_(True)
    v = splatloss.dssim_l1(x, y64.float().to(dev), 0.2, padding="same", backend=backend)
    (g,) = torch.autograd.grad(v, [x])
    xr = x64.clone().requires_grad_(True)
    vr = _dssim_l1_truth(xr, y64, SSIMConfig(padding="same"), 0.2).mean()
    (gr,) = torch.autograd.grad(vr, [xr])
    assert_rel(v, vr, TOL[backend]["values"], "dssim_l1")
    assert_rel(g, gr, TOL[backend]["grads"], "grad")


@pytest.mark.parametrize("backend", backend_params(slow_triton=True) + ["reference"])
def test_dssim_with_gradient_uses_no_graph_and_matches_autograd(backend):
    """Value and gradient without a graph, against autograd through dssim on the same backend, and
    against the float64 reference; a given buffer is filled in place."""
    dev = device_for(backend)
    x, y = make_pair((2, 3, side(backend, 29, 16), side(backend, 33, 17)), seed=101, device=dev)
    for reduction in ("mean", "sum"):
        value, g = splatloss.dssim_with_gradient(x, y, reduction=reduction, padding="same", backend=backend)
        assert value.grad_fn is None and g.grad_fn is None and g.dtype == x.dtype
        xr = x.clone().requires_grad_()
        expected = splatloss.dssim(xr, y, reduction=reduction, padding="same", backend=backend)
        (eg,) = torch.autograd.grad(expected, xr)
        torch.testing.assert_close(value, expected.detach())
        torch.testing.assert_close(g, eg, atol=1e-8, rtol=1e-5)
        x6 = x.double().cpu().requires_grad_()
        v6 = splatloss.dssim(x6, y.double().cpu(), reduction=reduction, padding="same", backend="reference")
        (g6,) = torch.autograd.grad(v6, x6)
        if backend != "reference":
            assert_rel(value, v6, TOL[backend]["values"], f"dssim {reduction}")
            assert_rel(g, g6, TOL[backend]["grads"], f"dssim gradient {reduction}")
    buf = torch.full_like(x, float("nan"))
    value, g = splatloss.dssim_with_gradient(x, y, grad=buf, backend=backend)
    assert g is buf and bool(torch.isfinite(buf).all())
    xr = x.clone().requires_grad_()
    (eg,) = torch.autograd.grad(splatloss.dssim(xr, y, backend=backend), xr)
    torch.testing.assert_close(buf, eg, atol=1e-8, rtol=1e-5)


@pytest.mark.parametrize("padding", ["valid", "same", "reflect"])
def test_ssim_mean_and_grad_equals_autograd_of_the_reference(backend, padding):
    """Backend object: (ssim_mean [B, C], d(sum upstream * ssim_mean)/d img1) with no graph."""
    cfg = SSIMConfig(padding=padding)
    dev = device_for(backend)
    x, y = make_pair((2, 3, side(backend, 29, 16), side(backend, 33, 17)), seed=3, device=dev)
    up = torch.randn(2, 3, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    mean, g = splatloss.backends.get(backend).ssim_mean_and_grad(x, y, cfg, up.float().to(dev))
    assert mean.grad_fn is None and g.grad_fn is None
    assert mean.shape == (2, 3) and mean.dtype == torch.float32 and g.dtype == x.dtype and g.shape == x.shape
    x6 = x.double().cpu().requires_grad_()
    m6 = reference.ssim_stats(x6, y.double().cpu(), cfg)[0]
    (g6,) = torch.autograd.grad((m6 * up).sum(), x6)
    assert_rel(mean, m6, TOL[backend]["values"], "ssim mean")
    assert_rel(g, g6, TOL[backend]["grads"], "grad")
