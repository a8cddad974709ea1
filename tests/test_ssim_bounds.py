"""SSIM and cs stay within [-1, 1] and equal 1 exactly for identical images, on the float32 backends
with the analytic algebra (torch ops and the C kernel), every padding.

Flat two-level images are the hard case: the local variances are formed from moments of magnitude 1
while C2 is 9e-4, and a denominator that rounds independently of its numerator put SSIM(x, x) at
1 + 2.4e-5 on the C kernel.
"""

import numpy as np
import pytest
import torch
from skimage import data

from splatloss import backends
from splatloss.config import SSIMConfig

PADDINGS = ("valid", "same", "reflect")


def _two_level(seed: int, h: int = 96, w: int = 128, lo: float = 0.2, hi: float = 0.8) -> torch.Tensor:
    """Piecewise-constant rectangles at ``hi`` on a ``lo`` background, [1, 3, h, w] float32."""
    rng = np.random.default_rng(seed)
    img = np.full((3, h, w), lo, dtype=np.float32)
    for _ in range(6):
        r0, c0 = rng.integers(0, h - 20), rng.integers(0, w - 20)
        img[:, r0 : r0 + rng.integers(10, 40), c0 : c0 + rng.integers(10, 50)] = hi
    return torch.from_numpy(img)[None]


def _photo() -> torch.Tensor:
    return torch.from_numpy(data.astronaut()[:64, :80].astype(np.float32) / 255).permute(2, 0, 1)[None].contiguous()


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_ssim_of_an_image_with_itself_is_exactly_one(backend, padding):
    cfg = SSIMConfig(padding=padding)
    for x in (_two_level(0), _two_level(1), _photo()):
        s, c = backends.get(backend).ssim_stats(x, x.clone(), cfg)
        assert torch.equal(s, torch.ones_like(s)), s  # was 1.0000029 (cpu, two-level, "valid")
        assert torch.equal(c, torch.ones_like(c)), c


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_ssim_and_cs_stay_within_one_for_near_identical_images(backend, padding):
    """Perturbations at the float32 rounding level: the maps' maxima and the means stay <= 1 (the
    torch backend reached 1 + 1 ulp on the photograph, the kernel 1 + 2 ulp)."""
    cfg = SSIMConfig(padding=padding)
    b = backends.get(backend)
    for x in (_two_level(2), _photo()):
        for seed, amp in [(0, 1e-7), (1, 5e-7), (2, 1e-6)]:
            g = torch.Generator().manual_seed(seed)
            y = x + (torch.rand(x.shape, generator=g) - 0.5) * amp
            s, c = b.ssim_stats(x, y, cfg)
            assert s.max() <= 1 and c.max() <= 1, (s, c)
            m, cm = b.ssim_map(x, y, cfg, return_cs=True)
            assert m.max() <= 1 and cm.max() <= 1 and m.min() >= -1 and cm.min() >= -1
