"""mask= on every public entry point: the accepted shapes and dtypes, and a clear error for each bad mask."""

from __future__ import annotations

import pytest
import torch
from _mask_truth import masked_lp, masked_maps, masked_ms_ssim, masked_ssim, soft_mask

import splatloss
from conftest import make_pair
from splatloss import compat


def test_mask_shapes_all_mean_the_same():
    x, y = make_pair((2, 3, 24, 27), torch.float64, mix=0.7)
    m = soft_mask(24, 27, seed=1)
    want = masked_ssim(x, y, m, padding="same")
    for shaped in (m, m[None, None], m[None, None].expand(2, 1, 24, 27), m.expand(2, 3, 24, 27)):
        got = splatloss.ssim(x, y, mask=shaped, padding="same", reduction="none")
        assert torch.allclose(got, want, rtol=0, atol=1e-13), tuple(shaped.shape)
    # a per-image, per-channel mask is per channel
    per = torch.stack([m, torch.ones_like(m), m.flip(0)])[None].expand(2, 3, 24, 27)
    assert torch.allclose(splatloss.ssim(x, y, mask=per, reduction="none"), masked_ssim(x, y, per), atol=1e-13)


def test_bool_mask_equals_float_mask():
    x, y = make_pair((2, 3, 24, 27), torch.float64, mix=0.7)
    mb = soft_mask(24, 27, seed=2) > 0.5
    a = splatloss.ssim(x, y, mask=mb)
    b = splatloss.ssim(x, y, mask=mb.double())
    assert a.item() == b.item()
    assert splatloss.ssim(x.float(), y.float(), mask=mb.half()).dtype == torch.float32


def test_every_entry_point_takes_a_mask():
    x, y = make_pair((1, 3, 161, 163), torch.float64, mix=0.7)
    m = soft_mask(161, 163, seed=3)
    s = masked_ssim(x, y, m, padding="same").item()
    smap, cmap, _ = masked_maps(x, y, m, padding="valid")
    assert splatloss.ssim(x, y, mask=m, padding="same").item() == pytest.approx(s, abs=1e-13)
    assert splatloss.dssim(x, y, mask=m, padding="same").item() == pytest.approx(1 - s, abs=1e-13)
    got_s, got_c = splatloss.ssim_map(x, y, mask=m, return_cs=True)
    assert torch.allclose(got_s, smap, atol=1e-13) and torch.allclose(got_c, cmap, atol=1e-13)
    ms = masked_ms_ssim(x, y, m).item()
    assert splatloss.ms_ssim(x, y, mask=m).item() == pytest.approx(ms, abs=1e-12)
    assert 1 - splatloss.MSSSIMLoss(tau=None)(x, y, mask=m).item() == pytest.approx(ms, abs=1e-12)
    assert splatloss.SSIMLoss(padding="same")(x, y, mask=m).item() == pytest.approx(1 - s, abs=1e-13)
    l1 = masked_lp(x, y, m).item()
    assert splatloss.dssim_l1(x, y, 0.2, mask=m, padding="same").item() == pytest.approx(
        0.8 * l1 + 0.2 * (1 - s), abs=1e-13
    )
    assert splatloss.PhotometricLoss.dssim_l1(padding="same")(x, y, mask=m).item() == pytest.approx(
        0.8 * l1 + 0.2 * (1 - s), abs=1e-13
    )
    value, g = splatloss.dssim_with_gradient(x, y, mask=m, padding="same")
    assert value.item() == pytest.approx(1 - s, abs=1e-13) and g.shape == x.shape
    assert compat.fused_ssim(x, y, mask=m).item() == pytest.approx(s, abs=1e-13)
    assert compat.fused_ssim(x, y, train=False, mask=m).item() == pytest.approx(s, abs=1e-13)


def test_empty_mask_is_ssim_one_and_zero_l1():
    x, y = make_pair((2, 3, 24, 27), torch.float64, mix=0.7)
    z = torch.zeros(24, 27)
    assert splatloss.ssim(x, y, mask=z).item() == 1.0
    assert splatloss.dssim_l1(x, y, 0.2, mask=z).item() == 0.0
    xr = x.clone().requires_grad_(True)
    splatloss.ssim(xr, y, mask=z).backward()
    assert bool((xr.grad == 0).all())


X = torch.rand(1, 3, 20, 22)
BAD = [
    # (B, 1, H, W) with B=2 for a batch of 1: passes torch.broadcast_shapes, then failed in expand_as
    (
        torch.ones(2, 1, 20, 22),
        ValueError,
        r"mask must be shaped \(B, 1, H, W\), \(1, 1, H, W\), \(H, W\) or \(B, C, H, W\) for images of shape "
        r"\(1, 3, 20, 22\), got shape \(2, 1, 20, 22\); give one weight per pixel",
    ),
    (torch.ones(1, 2, 20, 22), ValueError, r"for images of shape \(1, 3, 20, 22\), got shape \(1, 2, 20, 22\)"),
    (torch.ones(20, 21), ValueError, r"for images of shape \(1, 3, 20, 22\), got shape \(20, 21\)"),
    (torch.ones(1, 1, 1, 20, 22), ValueError, r"got shape \(1, 1, 1, 20, 22\)"),
    (
        torch.ones(20, 22, dtype=torch.uint8),
        TypeError,
        r"mask must be a bool tensor or a float tensor of weights in \[0, 1\], got dtype torch.uint8; "
        r"convert it with mask.bool\(\)",
    ),
    (torch.ones(20, 22, dtype=torch.int64), TypeError, r"got dtype torch.int64"),
    (
        torch.ones(20, 22, device="meta"),
        ValueError,
        r"mask must be on the images' device cpu, got meta; move it with mask.to\(img.device\)",
    ),
    ([[1.0]], TypeError, r"mask must be a torch.Tensor or None, got list"),
]


@pytest.mark.parametrize("mask,exc,match", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
@pytest.mark.parametrize(
    "call",
    [
        lambda m: splatloss.ssim(X, X, mask=m),
        lambda m: splatloss.ssim_map(X, X, mask=m),
        lambda m: splatloss.dssim_l1(X, X, mask=m),
        lambda m: splatloss.dssim_with_gradient(X, X, mask=m),
        lambda m: splatloss.SSIMLoss()(X, X, mask=m),
        lambda m: splatloss.PhotometricLoss.l1()(X, X, mask=m),
        lambda m: compat.fused_ssim(X, X, mask=m),
    ],
    ids=["ssim", "ssim_map", "dssim_l1", "dssim_with_gradient", "SSIMLoss", "PhotometricLoss", "fused_ssim"],
)
def test_bad_mask_errors(call, mask, exc, match):
    with pytest.raises(exc, match=match):
        call(mask)


def test_bad_mask_errors_ms_ssim():
    x = torch.rand(1, 3, 161, 161)
    with pytest.raises(ValueError, match=r"got shape \(2, 1, 161, 161\)"):
        splatloss.ms_ssim(x, x, mask=torch.ones(2, 1, 161, 161))
    with pytest.raises(TypeError, match=r"got dtype torch.int32"):
        splatloss.MSSSIMLoss()(x, x, mask=torch.ones(161, 161, dtype=torch.int32))
