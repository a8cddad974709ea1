"""Masked SSIM / MS-SSIM / photometric terms on every backend against the float64 oracle of the masked
semantics (tests/_mask_truth.py, plain torch ops, no splatloss code): values and the gradients to BOTH
images, on a real photograph with an irregular soft mask, every padding, odd sizes."""

from __future__ import annotations

import pytest
import torch
from _mask_truth import masked_l1_gaussian, masked_lp, masked_ms_ssim, masked_ssim, soft_mask

import splatloss
from conftest import backend_params, device_for, photo_pair, rel

NAMES = ("reference",) + tuple(p.values[0] for p in backend_params())
# Bars: values 2e-5 absolute, gradients 1e-4 normwise (max-norm relative) for fp32 inputs.
# Measured (fp32 inputs, 37x45 astronaut crop, soft mask, every padding): values <= 4.4e-8, gradients
# <= 3.9e-6; masked MS-SSIM at 163x167: values 3.6e-8, gradients <= 9.2e-6 (the shared masked composition; the cpu and
# triton kernels compute the same statistics fused); float64 inputs agree to ~1e-13.
VALUE_TOL, GRAD_TOL = 2e-5, 1e-4


def _both_grads(fn, x, y):
    xr, yr = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
    v = fn(xr, yr)
    gx, gy = torch.autograd.grad(v.sum(), (xr, yr))
    return v.detach(), gx, gy


@pytest.mark.parametrize("name", backend_params(NAMES, slow_triton=True))
@pytest.mark.parametrize("padding", ["same", "reflect", "valid"])
def test_all_ones_mask_equals_unmasked(name, padding):
    dev = device_for(name)
    dtype = torch.float32 if name == "triton" else torch.float64
    x, y = photo_pair(29, 33, seed=3, dtype=dtype, device=dev)
    ones = torch.ones(29, 33, device=dev, dtype=torch.bool)
    a, gxa, gya = _both_grads(lambda p, q: splatloss.ssim(p, q, mask=ones, padding=padding, backend=name), x, y)
    b, gxb, gyb = _both_grads(lambda p, q: splatloss.ssim(p, q, padding=padding, backend=name), x, y)
    if dtype == torch.float64:  # round-off (measured ~1e-15 values, ~1e-13 gradients)
        assert abs(a.item() - b.item()) <= 1e-12
        assert rel(gxa, gxb) <= 1e-10 and rel(gya, gyb) <= 1e-10
        return
    # Triton computes in fp32, the masked path through its map kernels and the unmasked one through
    # its mean kernels: two roundings of one float64 value. Each must meet the backend's bar against
    # float64 (values 1e-6, gradients 1e-5; measured <= 1e-7 and <= 7.3e-6), so they agree within the
    # sum of the two (measured <= 1e-5 between them).
    t, gxt, gyt = _both_grads(
        lambda p, q: splatloss.ssim(p, q, padding=padding, backend="reference"), x.cpu().double(), y.cpu().double()
    )
    for what, v, gx, gy in (("masked", a, gxa, gya), ("unmasked", b, gxb, gyb)):
        assert abs(v.item() - t.item()) <= 1e-6, what
        assert rel(gx, gxt) <= 1e-5 and rel(gy, gyt) <= 1e-5, what
    assert abs(a.item() - b.item()) <= 2e-6
    assert rel(gxa, gxb) <= 2e-5 and rel(gya, gyb) <= 2e-5


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) for n in ("reference", "torch")]
    + backend_params(NAMES[2:], slow_triton=True),
)
def test_masked_ms_ssim_equals_oracle(name):
    # three scales (two masked pyramid steps, odd sides at both) keep the Triton interpreter short
    dev = device_for(name)
    x, y = photo_pair(45, 51, seed=3, dtype=torch.float32, device=dev)
    m = soft_mask(45, 51, seed=2)
    weights = (0.3, 0.3, 0.4)
    v, gx, gy = _both_grads(lambda a, b: splatloss.ms_ssim(a, b, weights=weights, mask=m.to(dev), backend=name), x, y)
    tv, tgx, tgy = _both_grads(lambda a, b: masked_ms_ssim(a, b, m, weights), x.cpu().double(), y.cpu().double())
    assert abs(v.item() - tv.item()) <= VALUE_TOL
    assert rel(gx, tgx) <= GRAD_TOL and rel(gy, tgy) <= GRAD_TOL


@pytest.mark.parametrize("name", backend_params(NAMES, slow_triton=True))
@pytest.mark.parametrize("padding", ["same", pytest.param("valid", marks=pytest.mark.slow)])
def test_photometric_every_term_masked(name, padding):
    dev = device_for(name)
    x, y = photo_pair(35, 38, seed=3, dtype=torch.float64 if name != "triton" else torch.float32, device=dev)
    m = soft_mask(35, 38, seed=5)
    w = dict(l1=0.3, l2=0.1, dssim=0.2, l1_gaussian=0.4)
    loss = splatloss.PhotometricLoss(weights=w, padding=padding, l1_sigma=2.0, reduction="none", backend=name)
    v, gx, gy = _both_grads(lambda a, b: loss(a, b, mask=m.to(dev, x.dtype)), x, y)

    def truth(a, b):
        return (
            0.3 * masked_lp(a, b, m)
            + 0.1 * masked_lp(a, b, m, p=2)
            + 0.2 * (1 - masked_ssim(a, b, m, padding=padding))
            + 0.4 * masked_l1_gaussian(a, b, m, l1_sigma=2.0, padding=padding)
        )

    tv, tgx, tgy = _both_grads(truth, x.cpu().double(), y.cpu().double())
    assert abs(v.item() - tv.item()) <= VALUE_TOL
    assert rel(gx, tgx) <= GRAD_TOL and rel(gy, tgy) <= GRAD_TOL
    # msssim term separately (three scales: needs a bigger image than the other terms; it takes no
    # padding, so once)
    if padding != "same":
        return
    xb, yb = photo_pair(45, 51, seed=3, dtype=x.dtype, device=dev)
    mb = soft_mask(45, 51, seed=6)
    ws = (0.3, 0.3, 0.4)
    ms = splatloss.PhotometricLoss(weights=dict(msssim=1.0), ms_weights=ws, tau=None, backend=name)
    value = ms(xb, yb, mask=mb.to(dev, x.dtype))
    assert abs(value.item() - (1 - masked_ms_ssim(xb.cpu(), yb.cpu(), mb, weights=ws)).item()) <= VALUE_TOL


def test_unmasked_gaussian_l1_is_the_all_ones_value():
    x, y = photo_pair(64, 64, seed=3, dtype=torch.float64, device="cpu")
    loss = splatloss.PhotometricLoss(weights=dict(l1_gaussian=1.0), padding="same")
    plain = loss(x, y)
    ones = loss(x, y, mask=torch.ones(64, 64, dtype=torch.float64))
    assert torch.allclose(plain, ones, rtol=1e-12, atol=0)
    assert torch.allclose(plain, masked_l1_gaussian(x, y, None, l1_sigma=loss.l1_sigma, padding="same"), rtol=1e-12)


@pytest.mark.parametrize("name", ["reference", "torch", "cpu"])
@pytest.mark.slow
def test_gradcheck_float64(name):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(1, 2, 12, 13, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.rand(1, 2, 12, 13, dtype=torch.float64, generator=g, requires_grad=True)
    m = soft_mask(12, 13, seed=4)
    for padding in ("same", "reflect", "valid"):
        fn = lambda a, b: splatloss.ssim(a, b, mask=m, window_size=5, padding=padding, backend=name)  # noqa: E731
        # fast mode at tight float64 bars (see tests/backends/test_autograd.py)
        assert torch.autograd.gradcheck(fn, (x, y), fast_mode=True, atol=1e-8, rtol=1e-6)


def test_dssim_with_gradient_masked():
    x, y = photo_pair(31, 30, seed=3, dtype=torch.float64, device="cpu")
    m = soft_mask(31, 30, seed=7)
    value, g = splatloss.dssim_with_gradient(x, y, mask=m, padding="same")
    tv, tg, _ = _both_grads(lambda a, b: 1 - masked_ssim(a, b, m, padding="same"), x, y)
    assert abs(value.item() - tv.item()) <= 1e-12 and rel(g, tg) <= 1e-10
