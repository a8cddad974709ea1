"""SSIM and cs stay within [-1, 1] and equal 1 exactly for identical images, on the float32 backends
with the analytic algebra (torch ops, the C kernel and the Triton kernels), every padding.

Flat two-level images are the hard case: the local variances are formed from moments of magnitude 1
while C2 is 9e-4, and a denominator that rounds independently of its numerator put SSIM(x, x) at
1 + 2.4e-5 on the C kernel; the Triton kernels' maps reached 1 + 6e-7 on near-identical images, and
their loss of a constant image with itself 1 - 1.2e-7 when it also formed the gradient.
"""

import numpy as np
import pytest
import torch
from skimage import data

from conftest import backend_cases, backend_params, device_for, has_cuda, side
from splatloss import backends, functional
from splatloss.config import SSIMConfig

PADDINGS = ("valid", "same", "reflect")
BACKENDS = backend_params(("torch", "cpu", "triton"), slow_triton=True)  # Triton's interpreter: slow tier


def _two_level(seed: int, h: int = 96, w: int = 128, lo: float = 0.2, hi: float = 0.8) -> torch.Tensor:
    """Piecewise-constant rectangles at ``hi`` on a ``lo`` background, [1, 3, h, w] float32."""
    rng = np.random.default_rng(seed)
    img = np.full((3, h, w), lo, dtype=np.float32)
    for _ in range(6):
        r0, c0 = rng.integers(0, h - 20), rng.integers(0, w - 20)
        img[:, r0 : r0 + rng.integers(10, 40), c0 : c0 + rng.integers(10, 50)] = hi
    return torch.from_numpy(img)[None]


def _photo(h: int = 64, w: int = 80) -> torch.Tensor:
    return torch.from_numpy(data.astronaut()[:h, :w].astype(np.float32) / 255).permute(2, 0, 1)[None].contiguous()


def _images(backend: str, seeds):
    """Two-level images (one per seed) and the photograph, on the backend's device; smaller for
    Triton in the interpreter, and there one batch of the same size (the interpreter's cost is per
    operation, not per element, and a program holds every plane of a small batch)."""
    h, w = side(backend, 96, 40), side(backend, 128, 48)
    imgs = [_two_level(s, h, w) for s in seeds] + [_photo(min(h, 64), min(w, 80))]
    if backend == "triton" and not has_cuda():  # (on a GPU the photograph is smaller than the others)
        imgs = [torch.cat(imgs)]
    return [x.to(device_for(backend)) for x in imgs]


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_ssim_of_an_image_with_itself_is_exactly_one(backend, padding):
    cfg = SSIMConfig(padding=padding)
    for x in _images(backend, (0, 1)):
        s, c = backends.get(backend).ssim_stats(x, x.clone(), cfg)
        assert torch.equal(s, torch.ones_like(s)), s  # was 1.0000029 (cpu, two-level, "valid")
        assert torch.equal(c, torch.ones_like(c)), c


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_ssim_and_cs_stay_within_one_for_near_identical_images(backend, padding):
    """Perturbations at the float32 rounding level: the maps' maxima and the means stay <= 1 (the
    torch backend reached 1 + 1 ulp on the photograph, the kernel 1 + 2 ulp)."""
    cfg = SSIMConfig(padding=padding)
    b = backends.get(backend)
    for x in _images(backend, (2,)):
        # every amplitude's perturbation as one batch (each image is its own plane)
        ys = []
        for seed, amp in [(0, 1e-7), (1, 5e-7), (2, 1e-6)]:
            g = torch.Generator().manual_seed(seed)
            ys.append(x + (torch.rand(x.shape, generator=g) - 0.5).to(x.device) * amp)
        x3, y3 = torch.cat([x] * len(ys)), torch.cat(ys)
        s, c = b.ssim_stats(x3, y3, cfg)
        assert s.max() <= 1 and c.max() <= 1, (s, c)
        m, cm = b.ssim_map(x3, y3, cfg, return_cs=True)
        assert m.max() <= 1 and cm.max() <= 1 and m.min() >= -1 and cm.min() >= -1


@pytest.mark.parametrize("backend, padding", backend_cases(PADDINGS))
def test_a_constant_image_with_itself_is_one_with_or_without_the_gradient(backend, padding):
    """The loss forms the gradient in its forward where an input requires one: the value it sums
    must be the plain forward's, exactly 1, and the gradient 0 to round-off (a pixel's gradient is of
    order 1 / pixels, 1e-3 here; "same" padding leaves 4e-11 on the C kernel, 1e-16 in float64)."""
    x = torch.full((1, 3, 20, 24), 0.37, device=device_for(backend))
    assert functional.ssim(x, x.clone(), padding=padding, backend=backend).item() == 1.0
    xg = x.clone().requires_grad_(True)
    v = functional.ssim(xg, x.clone(), padding=padding, backend=backend)
    v.backward()
    assert v.item() == 1.0, v.item()
    assert xg.grad.abs().max() <= 1e-9, xg.grad.abs().max()


MASKED_BACKENDS = [*backend_params(("torch", "cpu")), *backend_params(("triton",), slow_triton=True)]


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("backend", MASKED_BACKENDS)
def test_masked_ssim_stays_within_one_and_is_one_for_identical_images(backend, padding):
    """The masked statistics normalise each moment by the filtered mask: the same ratios, the same
    bounds (the torch composition's mean reached 1 + 3.6e-7 on near-identical images)."""
    cfg = SSIMConfig(padding=padding)
    b = backends.get(backend)
    g = torch.Generator().manual_seed(0)
    for x in _images(backend, (2,)):
        m = (torch.rand(x.shape[-2:], generator=g) > 0.3).to(x)[None, None]
        # the identical pair and every amplitude's perturbation as one batch (each image its own plane)
        ys = [x.clone()]
        for seed, amp in [(0, 1e-7), (1, 5e-7), (2, 1e-6)]:
            gy = torch.Generator().manual_seed(seed)
            ys.append(x + (torch.rand(x.shape, generator=gy) - 0.5).to(x.device) * amp)
        s, c = b.masked_ssim_stats(torch.cat([x] * len(ys)), torch.cat(ys), m, cfg)
        n = x.shape[0]
        assert torch.equal(s[:n], torch.ones_like(s[:n])) and torch.equal(c[:n], torch.ones_like(c[:n])), (s, c)
        assert s.max() <= 1 and c.max() <= 1 and s.min() >= -1 and c.min() >= -1, (s, c)
