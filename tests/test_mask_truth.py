"""The masked float64 oracle (tests/_mask_truth.py) against the unmasked outside truth and its own semantics."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _mask_truth import masked_l1_gaussian, masked_lp, masked_ms_ssim, masked_ssim, soft_mask
from _truth import distort, photo, skimage_ssim, tf_ms_ssim, to_torch


@pytest.fixture(scope="module")
def pair():
    a = photo("astronaut", 100, 140, 37, 45)
    b = distort(a, seed=3)
    return a, b


def test_all_ones_equals_skimage(pair):
    a, b = pair
    x, y = to_torch(a), to_torch(b)
    got = masked_ssim(x, y, torch.ones(37, 45, dtype=torch.float64), padding="valid").item()
    # measured |got - skimage| = 1e-16 (both float64)
    assert abs(got - skimage_ssim(a, b)) < 1e-12


@pytest.mark.slow
def test_all_ones_ms_ssim_equals_tf():
    a = photo("coffee", 20, 30, 171, 165)
    b = distort(a, seed=5)
    x, y = to_torch(a), to_torch(b)
    got = masked_ms_ssim(x, y, torch.ones(171, 165, dtype=torch.float64), padding="valid").item()
    assert abs(got - tf_ms_ssim(a, b)) < 1e-12


@pytest.mark.parametrize("padding", ["same", "reflect", "valid"])
def test_masked_pixels_do_not_matter(pair, padding):
    """Pixels with weight 0 never enter any statistic, so changing them changes nothing."""
    a, b = pair
    x, y = to_torch(a), to_torch(b)
    m = soft_mask(37, 45, seed=1)
    assert (m == 0).any() and ((m > 0) & (m < 1)).any()
    x2 = torch.where(m == 0, torch.rand_like(x), x)
    y2 = torch.where(m == 0, torch.rand_like(y), y)
    v1, v2 = masked_ssim(x, y, m, padding=padding), masked_ssim(x2, y2, m, padding=padding)
    assert torch.allclose(v1, v2, rtol=0, atol=1e-14)
    # ... and they get no gradient
    x.requires_grad_(True)
    masked_ssim(x, y, m, padding=padding).sum().backward()
    assert x.grad[..., m == 0].abs().max() == 0


def test_empty_channel_is_one_with_zero_gradient(pair):
    a, b = pair
    x, y = to_torch(a).requires_grad_(True), to_torch(b)
    m = torch.ones(1, 3, 37, 45, dtype=torch.float64)
    m[:, 1] = 0
    v = masked_ssim(x, y, m, padding="same")
    v.sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad[:, 1].abs().max() == 0
    full = masked_ssim(x.detach()[:, [0, 2]], y[:, [0, 2]], padding="same")
    assert torch.allclose(v, (2 * full + 1) / 3, rtol=0, atol=1e-14)
    assert masked_ssim(x, y, torch.zeros(37, 45), padding="valid").item() == 1.0


def test_masked_lp_and_gaussian_l1(pair):
    a, b = pair
    x, y = to_torch(a), to_torch(b)
    m = soft_mask(37, 45, seed=2)
    e = (x - y).abs()
    assert torch.allclose(masked_lp(x, y, m), (m * e).sum() * 1 / (3 * m.sum()), rtol=1e-14)
    assert torch.allclose(masked_lp(x, y, None, p=2), (e * e).mean(), rtol=1e-14)
    assert masked_lp(x, y, torch.zeros(37, 45)).item() == 0.0
    # all ones: sum G(e) / sum G(1) with the zero-padded blur normalised at the border
    g = masked_l1_gaussian(x, y, None)
    assert torch.allclose(g, masked_l1_gaussian(x, y, torch.ones(37, 45)), rtol=0, atol=0)
    assert not torch.allclose(g, e.mean(), rtol=1e-3)  # the border normalisation matters on a 37x45 image
    assert masked_l1_gaussian(x, y, torch.zeros(37, 45)).item() == 0.0


@pytest.mark.slow
def test_gradcheck_oracle():
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(1, 2, 13, 12, dtype=torch.float64, generator=gen, requires_grad=True)
    y = torch.rand(1, 2, 13, 12, dtype=torch.float64, generator=gen, requires_grad=True)
    m = soft_mask(13, 12, seed=4)
    for padding in ("same", "reflect", "valid"):
        fn = lambda a, b: masked_ssim(a, b, m, window_size=5, padding=padding)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (x, y), fast_mode=True, atol=1e-8, rtol=1e-6)  # tight bars (test_autograd)
    assert np.isfinite(masked_ssim(x, y, m, window_size=5).item())
