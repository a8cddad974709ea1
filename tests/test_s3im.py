"""S3IM against a float64 implementation of the published formula written here (no splatloss code)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from _truth import distort, photo

from splatloss import s3im


def formula_s3im(pred, target, *, kernel_size, stride, repeats, patch_height, generator, data_range=1.0):
    """The authors' S3IM in float64: R copies (first in order, then randperm in turn), the
    (1, C, patch_height, -1) layout, a k x k Gaussian (sigma 1.5, taps at i - k // 2), zero padding
    (k - 1) // 2, stride, E[x^2] - E[x]^2 variances, mean of the map."""
    n, c = pred.shape
    idx = [torch.arange(n)] + [torch.randperm(n, generator=generator) for _ in range(repeats - 1)]
    idx = torch.cat(idx)
    p = pred.double()[idx].permute(1, 0).reshape(1, c, patch_height, -1)
    t = target.double()[idx].permute(1, 0).reshape(1, c, patch_height, -1)
    g = torch.tensor(
        [math.exp(-((i - kernel_size // 2) ** 2) / (2 * 1.5**2)) for i in range(kernel_size)], dtype=torch.float64
    )
    g = g / g.sum()
    win = torch.outer(g, g).expand(c, 1, kernel_size, kernel_size)

    def filt(z):
        return F.conv2d(z, win, padding=(kernel_size - 1) // 2, stride=stride, groups=c)

    mu1, mu2 = filt(p), filt(t)
    s11 = filt(p * p) - mu1 * mu1
    s22 = filt(t * t) - mu2 * mu2
    s12 = filt(p * t) - mu1 * mu2
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    smap = ((2 * mu1 * mu2 + c1) * (2 * s12 + c2)) / ((mu1 * mu1 + mu2 * mu2 + c1) * (s11 + s22 + c2))
    return smap.mean()


def _rays(n: int, seed: int):
    """N random pixels of a real photograph and of a distorted rendering of it, as ray colours."""
    img = photo("astronaut", 100, 120, 96, 96)
    ren = distort(img, seed)
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randperm(96 * 96, generator=gen)[:n]
    target = torch.from_numpy(img.reshape(-1, 3))[pick]
    pred = torch.from_numpy(ren.reshape(-1, 3))[pick]
    return pred, target


@pytest.mark.parametrize("repeats", [1, 10])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_s3im_equals_formula_value_and_gradient(repeats, dtype):
    pred64, target64 = _rays(1024, seed=3)
    kw = dict(kernel_size=4, stride=4, repeats=repeats, patch_height=64)
    pred = pred64.to(dtype).requires_grad_(True)
    target = target64.to(dtype).requires_grad_(True)
    value = s3im(pred, target, generator=torch.Generator().manual_seed(7), **kw)
    gp, gt = torch.autograd.grad(value, (pred, target))

    p_ref = pred.detach().double().requires_grad_(True)
    t_ref = target.detach().double().requires_grad_(True)
    truth = formula_s3im(p_ref, t_ref, generator=torch.Generator().manual_seed(7), **kw)
    gp_ref, gt_ref = torch.autograd.grad(truth, (p_ref, t_ref))

    assert value.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert gp.dtype == dtype and gt.dtype == dtype
    assert 0.2 < float(truth.detach()) < 0.95  # a real, imperfect rendering, not a degenerate case
    if dtype == torch.float64:
        # measured: value 1.1e-16, gradients 4.4e-15 normwise (the shifted moments vs the formula's raw ones)
        vtol, gtol = 1e-12, 1e-11
    else:
        # measured: value 1.4e-8 (R=1) and 6.6e-8 (R=10), gradients 3.5e-7 normwise (fp32 round-off)
        vtol, gtol = 1e-6, 2e-6
    verr = abs(float(value.detach()) - float(truth.detach()))
    gerrs = [float((g.double() - g_ref).norm() / g_ref.norm()) for g, g_ref in ((gp, gp_ref), (gt, gt_ref))]
    print(f"s3im {dtype} R={repeats}: value {verr:.2e}, gradients {gerrs[0]:.2e} {gerrs[1]:.2e}")
    assert verr < vtol
    assert max(gerrs) < gtol, gerrs


def test_s3im_other_geometry_and_repeat_one_is_unpermuted():
    pred, target = _rays(600, seed=5)
    kw = dict(kernel_size=3, stride=2, repeats=2, patch_height=40, data_range=1.0)
    value = s3im(pred, target, generator=torch.Generator().manual_seed(1), **kw)
    truth = formula_s3im(pred, target, generator=torch.Generator().manual_seed(1), **kw)
    assert abs(float(value) - float(truth)) < 1e-12  # measured 2.2e-16
    # repeats=1 draws no permutation: the value does not depend on the generator's state
    a = s3im(pred, target, repeats=1, patch_height=60, generator=torch.Generator().manual_seed(1))
    b = s3im(pred, target, repeats=1, patch_height=60, generator=torch.Generator().manual_seed(2))
    assert float(a) == float(b)
    # more repeats draw different permutations from different seeds
    c = s3im(pred, target, repeats=4, patch_height=60, generator=torch.Generator().manual_seed(1))
    d = s3im(pred, target, repeats=4, patch_height=60, generator=torch.Generator().manual_seed(2))
    assert float(c) != float(d)


def test_s3im_identical_rays_is_one():
    pred, _ = _rays(640, seed=2)
    assert float(s3im(pred.float(), pred.float(), generator=torch.Generator().manual_seed(0))) == 1.0


def test_s3im_half_precision_accumulates_in_float32():
    pred, target = _rays(640, seed=4)
    gen = torch.Generator().manual_seed(3)
    v = s3im(pred.half(), target.half(), generator=gen)
    truth = formula_s3im(
        pred.half(),
        target.half(),
        kernel_size=4,
        stride=4,
        repeats=10,
        patch_height=64,
        generator=torch.Generator().manual_seed(3),
    )
    assert v.dtype == torch.float32
    assert abs(float(v) - float(truth)) < 1e-6  # measured 8.5e-9: fp32 round-off on the rounded inputs


@pytest.mark.parametrize(
    "args, kwargs, kind, match",
    [
        (
            (torch.rand(1000, 3), torch.rand(1000, 3)),
            {},
            ValueError,
            r"10 \* 1000 = 10000 rays must be a multiple of "
            r"patch_height = 64",
        ),
        (
            (torch.rand(64, 3), torch.rand(64, 3)),
            {"repeats": 1, "patch_height": 64, "kernel_size": 4},
            ValueError,
            "does not fit the virtual 64x1 image",
        ),
        ((torch.rand(64, 3, 1), torch.rand(64, 3, 1)), {}, ValueError, r"must be an \(N, C\) batch"),
        ((torch.rand(64, 3), torch.rand(64, 4)), {}, ValueError, "same shape"),
        ((torch.rand(0, 3), torch.rand(0, 3)), {}, ValueError, "at least one ray"),
        ((torch.rand(64, 3), torch.zeros(64, 3, dtype=torch.uint8)), {}, TypeError, "floating dtype"),
        (([0.5] * 3, torch.rand(64, 3)), {}, TypeError, "must be a torch.Tensor"),
        ((torch.rand(64, 3), torch.rand(64, 3)), {"kernel_size": 0}, ValueError, "kernel_size must be a positive"),
        ((torch.rand(64, 3), torch.rand(64, 3)), {"stride": 2.0}, TypeError, "stride must be a positive integer"),
        ((torch.rand(64, 3), torch.rand(64, 3)), {"repeats": True}, TypeError, "repeats must be a positive integer"),
        ((torch.rand(64, 3), torch.rand(64, 3)), {"data_range": -1.0}, ValueError, "data_range must be a finite"),
        ((torch.rand(64, 3), torch.rand(64, 3)), {"generator": 3}, TypeError, "generator must be a torch.Generator"),
    ],
)
def test_s3im_errors(args, kwargs, kind, match):
    with pytest.raises(kind, match=match):
        s3im(*args, **kwargs)


def test_s3im_generator_on_another_device_type():
    rays = torch.rand(64, 3, device="meta")  # a device type the CPU generator cannot draw on
    with pytest.raises(ValueError, match="generator must be on the rays' device type"):
        s3im(rays, rays, generator=torch.Generator())


# ----------------------------------------------------------------------------------------------
# The module and the PhotometricLoss term
# ----------------------------------------------------------------------------------------------


def test_s3im_loss_module_equals_one_minus_function():
    from splatloss import S3IMLoss

    pred, target = _rays(640, seed=6)
    pred = pred.float().requires_grad_(True)
    module = S3IMLoss(kernel_size=3, stride=2, repeats=5, patch_height=32, generator=torch.Generator().manual_seed(4))
    value = module(pred, target.float())
    truth = 1 - s3im(
        pred,
        target.float(),
        kernel_size=3,
        stride=2,
        repeats=5,
        patch_height=32,
        generator=torch.Generator().manual_seed(4),
    )
    # The module forms the dissimilarity directly (relative precision); 1 - s3im subtracts a float32
    # number close to 1, so the two agree to float32 round-off of 1 (measured 4.5e-8 here).
    assert abs(float(value.detach()) - float(truth.detach())) < 2e-7
    value.backward()
    assert pred.grad is not None and torch.isfinite(pred.grad).all()
    with pytest.raises(TypeError, match="generator must be a torch.Generator or None, got int"):
        S3IMLoss(generator=0)
    with pytest.raises(ValueError, match="patch_height must be a positive integer, got 0"):
        S3IMLoss(patch_height=0)


def test_photometric_loss_s3im_term_takes_each_image_as_rays():
    from splatloss import PhotometricLoss

    g = torch.Generator().manual_seed(0)
    pred, target = torch.rand(2, 3, 16, 16, generator=g), torch.rand(2, 3, 16, 16, generator=g)
    loss = PhotometricLoss(l1=0.5, s3im=0.5, s3im_patch_height=32)
    torch.manual_seed(11)
    total = loss(pred, target)
    torch.manual_seed(11)  # the term draws its permutations from the global generator, image by image
    expected = []
    for b in range(2):
        rays_p = pred[b].permute(1, 2, 0).reshape(-1, 3)  # pixel (i, j) is ray i * W + j
        rays_t = target[b].permute(1, 2, 0).reshape(-1, 3)
        expected.append(1 - s3im(rays_p, rays_t, patch_height=32))
    s3im_term = torch.stack(expected)
    l1 = (pred - target).abs().mean(dim=(1, 2, 3))
    assert torch.allclose(total, (0.5 * l1 + 0.5 * s3im_term).mean(), rtol=0, atol=1e-7)  # measured 0 (fp32)
    assert abs(float(loss.terms["s3im"]) - float(s3im_term.mean())) < 1e-7  # measured 0
    with pytest.raises(ValueError, match="the s3im term takes no mask"):
        loss(pred, target, mask=torch.ones(2, 1, 16, 16))
    with pytest.raises(ValueError, match=r"10 \* 256 = 2560 rays must be a multiple of patch_height = 48"):
        PhotometricLoss(s3im=1.0, s3im_patch_height=48)(pred, target)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_s3im_loss_keeps_relative_precision_on_near_white_rays(seed):
    # Near-white colours against a prediction 0.9995x of them: 1 - S3IM is about 1e-6, a few float32
    # ulps of 1, so forming it as 1 - s3im in float32 loses it (6 % and more off float64); the loss is
    # formed directly and must stay within 1e-3 relative of float64 in the module, the function and
    # the photometric loss's term.
    from splatloss import PhotometricLoss, S3IMLoss
    from splatloss.rays import S3IMConfig, s3im_loss_with_config

    gen = torch.Generator().manual_seed(seed)
    target = 0.95 + 0.05 * torch.rand(4096, 3, generator=gen, dtype=torch.float64)
    pred = 0.9995 * target
    kw = dict(kernel_size=4, stride=4, repeats=10, patch_height=64)
    truth = 1 - formula_s3im(pred, target, generator=torch.Generator().manual_seed(seed), **kw)
    module = S3IMLoss(generator=torch.Generator().manual_seed(seed))(pred.float(), target.float())
    direct = s3im_loss_with_config(pred.float(), target.float(), S3IMConfig(), torch.Generator().manual_seed(seed))
    for got in (module, direct):
        assert abs(float(got) / float(truth) - 1) < 1e-3, (float(got), float(truth))
    # The photometric loss's term sees a (1, 3, 64, 64) image as 4096 rays, permuted by the global generator.
    img_t, img_p = target.float().T.reshape(1, 3, 64, 64), pred.float().T.reshape(1, 3, 64, 64)
    torch.manual_seed(seed)
    term = PhotometricLoss(s3im=1.0)(img_p, img_t)
    torch.manual_seed(seed)
    rays_t, rays_p = img_t.double().flatten(2).transpose(1, 2)[0], img_p.double().flatten(2).transpose(1, 2)[0]
    truth_term = 1 - formula_s3im(rays_p, rays_t, generator=None, **kw)
    assert abs(float(term) / float(truth_term) - 1) < 1e-3, (float(term), float(truth_term))
