"""Numbers the library can be trusted with: autocast regions, half-precision rays, and clear errors for
calls that torch would otherwise reject with an error naming none of the arguments."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "backends"))

import splatloss  # noqa: E402
from conftest import assert_rounded_once, photo_pair  # noqa: E402


def _autocast_cases():
    g = torch.Generator().manual_seed(0)
    y = photo_pair(161, 163, seed=1, dtype=torch.float32)[1]
    rays_t = torch.rand(4096, 3, generator=g)
    mask = torch.rand(161, 163, generator=g)
    return {
        "ssim_map": lambda p: splatloss.ssim_map(p, y).mean(),
        "ssim_map-torch": lambda p: splatloss.ssim_map(p, y, backend="torch").mean(),
        "ms_ssim-torch": lambda p: splatloss.ms_ssim(p, y, backend="torch"),
        "ms_ssim": lambda p: splatloss.ms_ssim(p, y),
        "ssim-masked-torch": lambda p: splatloss.ssim(p, y, mask=mask, backend="torch"),
        "zhao_mix": lambda p: splatloss.PhotometricLoss.zhao_mix()(p, y),
        "s3im": lambda p: splatloss.s3im(p.flatten(2)[0].T[:4096], rays_t, generator=torch.Generator().manual_seed(0)),
        "S3IMLoss": lambda p: splatloss.S3IMLoss()(p.flatten(2)[0].T[:4096], rays_t),
        "compat.ms_ssim": lambda p: splatloss.compat.ms_ssim(p, y, data_range=1.0),
    }


@pytest.mark.parametrize("backward_inside", [False, True], ids=["backward-after", "backward-inside"])
@pytest.mark.parametrize("name", list(_autocast_cases()))
def test_4_autocast_computes_what_it_computes_without(name, backward_inside):
    """Inside torch.autocast (bf16) every entry point computes in float32 as without it: the same
    value and gradient, bit for bit, also where the backward runs inside the region."""
    fn = _autocast_cases()[name]
    x = photo_pair(161, 163, seed=1, dtype=torch.float32)[0]
    torch.manual_seed(0)
    p0 = x.clone().requires_grad_(True)
    v0 = fn(p0)
    v0.backward()
    torch.manual_seed(0)
    p1 = x.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        v1 = fn(p1)
        if backward_inside:
            v1.backward()
    if not backward_inside:
        v1.backward()
    assert v1.dtype == v0.dtype == torch.float32
    assert torch.equal(v1, v0)
    assert torch.equal(p1.grad, p0.grad)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_7_s3im_half_precision_rays_gradient_rounded_once(dtype):
    g = torch.Generator().manual_seed(3)
    pred = torch.rand(4096, 3, generator=g).to(dtype)
    target = (pred.float() + 0.05 * torch.randn(4096, 3, generator=g)).clamp(0, 1).to(dtype)
    p = pred.clone().requires_grad_(True)
    splatloss.s3im(p, target, generator=torch.Generator().manual_seed(7)).backward()
    p64 = pred.double().requires_grad_(True)
    splatloss.s3im(p64, target.double(), generator=torch.Generator().manual_seed(7)).backward()
    assert_rounded_once(p.grad, p64.grad, dtype, "s3im")


def test_8_compat_ms_ssim_with_more_weights_than_the_size_holds():
    x = torch.rand(1, 3, 161, 161)
    with pytest.raises(
        ValueError,
        match=r"weights: 6 scales halve the images 5 times, so their smaller side must be at least 321 for the "
        r"coarsest scale to hold the 11x11 window, got \(161, 161\); pass at most 5 weights for this size",
    ):
        splatloss.compat.ms_ssim(x, x, data_range=1.0, weights=[1 / 6] * 6)
    big = torch.rand(1, 3, 321, 321)
    assert splatloss.compat.ms_ssim(big, big, data_range=1.0, weights=[1 / 6] * 6).item() == pytest.approx(1.0)


def test_8_dssim_with_gradient_refuses_a_grad_buffer_whose_elements_share_memory():
    x, y = torch.rand(1, 3, 16, 16), torch.rand(1, 3, 16, 16)
    shared = torch.empty(1, 1, 1, 1).expand(1, 3, 16, 16)
    with pytest.raises(
        ValueError,
        match=r"grad must own one element per pixel of img1 to be overwritten, got a view with strides \(1, 0, 0, 0\)",
    ):
        splatloss.dssim_with_gradient(x, y, grad=shared)
    strided = torch.empty(1, 3, 16, 32)[..., ::2]  # a view with its own elements is fine
    value, g = splatloss.dssim_with_gradient(x, y, grad=strided)
    assert g is strided and torch.equal(g, splatloss.dssim_with_gradient(x, y)[1])


@pytest.mark.parametrize("kind", ["uncorrelated", "noisy"])
@pytest.mark.parametrize("padding", ["valid", "same"])
def test_6_sigma_a_tenth_on_the_torch_backend(kind, padding):
    """sigma=0.1 (one tap carries the window): values and gradients within the window options' bars
    of float64 (measured <= 1e-7 values, <= 4.2e-6 gradients; the local variance of x - y is formed as
    var_x + var_y - 2 cov, which does not cancel the shifted moments' O(1) terms)."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(1, 3, 40, 41, generator=g)
    y = (
        torch.rand(1, 3, 40, 41, generator=g)
        if kind == "uncorrelated"
        else (x + 0.05 * torch.randn(x.shape, generator=g)).clamp(0, 1)
    )
    x64 = x.double().requires_grad_(True)
    truth = splatloss.ssim(x64, y.double(), sigma=0.1, padding=padding, backend="reference")
    truth.backward()
    xf = x.clone().requires_grad_(True)
    value = splatloss.ssim(xf, y, sigma=0.1, padding=padding, backend="torch")
    value.backward()
    assert abs(value.item() - truth.item()) <= 1e-6
    assert float((xf.grad.double() - x64.grad).abs().max() / x64.grad.abs().max()) <= 3e-5
    smap = splatloss.ssim_map(x, y, sigma=0.1, padding=padding, backend="torch")
    tmap = splatloss.ssim_map(x.double(), y.double(), sigma=0.1, padding=padding, backend="reference")
    assert float((smap.double() - tmap).abs().max()) <= 1e-5


def test_6_the_sigma_error_suggests_no_sigma_float32_cannot_hold():
    with pytest.raises(
        ValueError,
        match=r"sigma must be at least 1e-150 .* got 1e-200; a sigma below 0.3 makes a window of nearly one tap, "
        r"where float32 gradients lose digits \(up to 1e-4 off float64\): pass float64 images",
    ):
        splatloss.SSIMConfig(sigma=1e-200)
