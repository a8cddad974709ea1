"""Loss modules: function/module equality, the MS-SSIM loss where scales go negative, PhotometricLoss."""

import math

import pytest
import torch
import torch.nn.functional as F
from _mask_truth import masked_ssim
from _truth import photo, to_torch

import splatloss
from conftest import assert_rounded_once, make_pair
from splatloss import MSSSIMLoss, PhotometricLoss, SSIMLoss
from splatloss.config import SSIMConfig
from splatloss.reference import downsample2x, ssim_stats

# ------------------------------------------------------------------------------------------------
# Modules equal their functions
# ------------------------------------------------------------------------------------------------


def test_ssim_loss_equals_one_minus_ssim():
    x, y = make_pair((2, 3, 30, 31), seed=0, mix=0.7)
    for kw in (dict(), dict(padding="same", window_size=7, sigma=1.0), dict(reduction="none", data_range=2.0, k2=0.05)):
        torch.testing.assert_close(SSIMLoss(**kw)(x, y), 1 - splatloss.ssim(x, y, **kw))


def test_msssim_loss_equals_one_minus_ms_ssim():
    x, y = make_pair((2, 1, 165, 161), seed=1, mix=0.7)
    torch.testing.assert_close(MSSSIMLoss()(x, y), 1 - splatloss.ms_ssim(x, y, tau=0.01))
    torch.testing.assert_close(
        MSSSIMLoss(tau=None, reduction="sum")(x, y), (1 - splatloss.ms_ssim(x, y, reduction="none")).sum()
    )
    torch.testing.assert_close(
        MSSSIMLoss(reduction="none")(x[0], y[0]), 1 - splatloss.ms_ssim(x[0], y[0], tau=0.01, reduction="none")
    )


# ------------------------------------------------------------------------------------------------
# The MS-SSIM loss where some scale's cs <= 0
# ------------------------------------------------------------------------------------------------


def _coarse_inverted_pair(size=161, seed=0):
    """Fine detail identical, coarse structure inverted: cs > 0 at scale 1, < 0 at coarse scales."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(
        torch.arange(size, dtype=torch.float32), torch.arange(size, dtype=torch.float32), indexing="ij"
    )
    coarse = 0.25 * torch.sin(2 * math.pi * xx / size) * torch.cos(2 * math.pi * yy / size)
    fine = 0.2 * (torch.rand(size, size, generator=g) - 0.5)
    a = (0.5 + coarse + fine)[None, None]
    b = (0.5 - coarse + fine)[None, None]
    return a, b


def _scale_terms(a, b, scales=5):
    """Per-scale MS-SSIM terms (cs, then SSIM at the last scale), the smallest over channels."""
    cfg = SSIMConfig()
    out = []
    for j in range(scales):
        if j:
            a, b = downsample2x(a), downsample2x(b)
        s, c = ssim_stats(a, b, cfg)
        out.append(float((c if j < scales - 1 else s).min()))
    return out


@pytest.mark.parametrize("case", ["inverted", "coarse_inverted"])
@pytest.mark.parametrize("backend", ["torch", pytest.param("reference", marks=pytest.mark.slow)])
def test_msssim_loss_gradient_alive_where_scales_go_negative(case, backend):
    if case == "inverted":
        a = to_torch(photo("astronaut", 100, 100, 163, 167), torch.float32)
        b = 1 - a
    else:
        a, b = _coarse_inverted_pair()
    terms = _scale_terms(a.double(), b.double())
    assert min(terms) <= 0  # the case really has a non-positive term
    if case == "coarse_inverted":
        assert terms[0] > 0.3 and min(terms[2:]) < 0, terms
    x = a.clone().requires_grad_()
    # the metric (relu, as TF): 0, and a dead gradient
    metric = splatloss.ms_ssim(x, b, backend=backend)
    assert float(metric.detach()) == 0.0
    (gm,) = torch.autograd.grad(metric, x)
    assert not bool((torch.isfinite(gm) & (gm != 0)).any())
    # the loss: finite, < 1 only by a little, gradient finite and non-zero at every pixel
    loss = MSSSIMLoss(backend=backend)(x, b)
    assert bool(torch.isfinite(loss)) and 0.0 < float(1 - loss.detach()) < 0.01
    (g,) = torch.autograd.grad(loss, x)
    assert bool(torch.isfinite(g).all()) and bool((g != 0).all())
    # the same through PhotometricLoss's msssim term
    (g2,) = torch.autograd.grad(PhotometricLoss(msssim=1.0, backend=backend)(x, b), x)
    torch.testing.assert_close(g2, g)


def test_peer_is_dead_on_the_same_case():
    # What the loss is protecting against: pytorch_msssim returns 0 with a zero or NaN gradient.
    pytorch_msssim = pytest.importorskip("pytorch_msssim")
    a, b = _coarse_inverted_pair()
    x = a.clone().requires_grad_()
    v = pytorch_msssim.ms_ssim(x, b, data_range=1.0)
    (g,) = torch.autograd.grad(v, x)
    assert float(v.detach()) == 0.0 and not bool((torch.isfinite(g) & (g != 0)).any())


def test_msssim_loss_recovers_from_inverted_start():
    # Gradient descent from an inverted image: the smooth extension drives the negative scales
    # back up, and the metric leaves 0.
    target = to_torch(photo("coffee", 50, 150, 161, 161, gray=True), torch.float32)

    def descend(loss_fn, steps):
        x = (1 - target).clone().requires_grad_()
        opt = torch.optim.Adam([x], lr=0.05)
        for _ in range(steps):
            opt.zero_grad()
            loss_fn(x, target).backward()
            opt.step()
        return x.detach()

    # relu (the metric as a loss, as every peer): zero gradient, the image never moves
    stuck = descend(MSSSIMLoss(tau=None), 3)
    torch.testing.assert_close(stuck, 1 - target)
    # the smooth extension: out of the dead zone (measured: metric ~0.76 after 30 steps)
    x = descend(MSSSIMLoss(), 30)
    assert float(splatloss.ms_ssim(x, target)) > 0.6


# ------------------------------------------------------------------------------------------------
# PhotometricLoss
# ------------------------------------------------------------------------------------------------


def test_presets_and_weights():
    assert PhotometricLoss.l1().weights == {
        "l1": 1.0,
        "l2": 0.0,
        "dssim": 0.0,
        "msssim": 0.0,
        "l1_gaussian": 0.0,
        "s3im": 0.0,
    }
    assert PhotometricLoss.l2().weights["l2"] == 1.0
    assert PhotometricLoss.ssim().weights["dssim"] == 1.0
    assert PhotometricLoss.msssim().weights["msssim"] == 1.0
    d = PhotometricLoss.dssim_l1()
    assert (
        d.weights["l1"] == pytest.approx(0.8) and d.weights["dssim"] == pytest.approx(0.2) and d.cfg.padding == "same"
    )
    z = PhotometricLoss.zhao_mix()
    assert (
        z.weights["msssim"] == pytest.approx(0.84)
        and z.weights["l1_gaussian"] == pytest.approx(0.16)
        and z.l1_sigma == 8.0
    )
    m = PhotometricLoss.msssim_l1(alpha=0.5)
    assert m.weights["msssim"] == 0.5 and m.weights["l1"] == 0.5
    w = PhotometricLoss(weights={"l1": 0.8, "dssim": 0.2})
    assert w.weights["l1"] == 0.8 and w.weights["dssim"] == 0.2


def test_3dgs_loss_equals_its_formula_and_logs_terms():
    x, y = make_pair((2, 3, 40, 37), seed=3, mix=0.7)
    xr = x.clone().requires_grad_()
    loss = PhotometricLoss.dssim_l1()
    total = loss(xr, y)
    l1 = (x - y).abs().mean()
    ssim = splatloss.ssim(x, y, padding="same")
    torch.testing.assert_close(total, 0.8 * l1 + 0.2 * (1 - ssim))
    assert sorted(loss.terms) == ["dssim", "l1"]
    torch.testing.assert_close(loss.terms["l1"], l1)
    torch.testing.assert_close(loss.terms["dssim"], 1 - ssim, atol=1e-6, rtol=1e-5)
    assert all(not t.requires_grad for t in loss.terms.values())
    # gradients equal the composed expression's, through the reference backend
    (g,) = torch.autograd.grad(total, xr)
    xr2 = x.clone().requires_grad_()
    ref = 0.8 * (xr2 - y).abs().mean() + 0.2 * (1 - splatloss.ssim(xr2, y, padding="same", backend="reference"))
    (g_ref,) = torch.autograd.grad(ref, xr2)
    torch.testing.assert_close(g, g_ref, atol=1e-7, rtol=1e-4)


def test_set_weight_changes_the_total():
    x, y = make_pair((1, 3, 24, 24), seed=4, mix=0.7)
    loss = PhotometricLoss.dssim_l1()
    loss(x, y)
    terms = dict(loss.terms)
    loss.set_weight("dssim", 0.5)
    loss.set_weight("l2", 2.0)
    total = loss(x, y)
    expected = 0.8 * terms["l1"] + 0.5 * terms["dssim"] + 2.0 * ((x - y) ** 2).mean()
    torch.testing.assert_close(total, expected, atol=1e-6, rtol=1e-5)
    assert "l2" in loss.terms
    loss.set_weight("dssim", 0.0)
    loss(x, y)
    assert "dssim" not in loss.terms


def test_all_terms_with_all_ones_mask_equal_no_mask():
    x, y = make_pair((2, 3, 170, 163), seed=5, mix=0.7)
    loss = PhotometricLoss(l1=0.3, l2=0.2, dssim=0.2, msssim=0.2, l1_gaussian=0.1, reduction="none")
    plain = loss(x, y)
    plain_terms = dict(loss.terms)
    masked = loss(x, y, mask=torch.ones(2, 1, 170, 163, dtype=torch.bool))
    torch.testing.assert_close(masked, plain, atol=1e-6, rtol=1e-5)
    for k in plain_terms:
        torch.testing.assert_close(loss.terms[k], plain_terms[k], atol=1e-6, rtol=1e-5)


def test_mask_selects_pixels():
    x, y = make_pair((2, 2, 30, 32), seed=6, mix=0.7)
    mask = torch.zeros(2, 1, 30, 32)
    mask[:, :, 5:20, 8:30] = 1.0
    loss = PhotometricLoss(l1=1.0, l2=1.0, dssim=1.0, reduction="none")
    total = loss(x, y, mask=mask)
    sel = mask.expand_as(x).bool()
    d = x - y
    l1 = torch.stack([d[i].abs()[sel[i]].mean() for i in range(2)])
    l2 = torch.stack([(d[i] ** 2)[sel[i]].mean() for i in range(2)])
    # the SSIM term: the masked statistics (float64 oracle in tests/_mask_truth.py)
    dssim = (1 - masked_ssim(x, y, mask, padding="valid")).float()
    torch.testing.assert_close(total, l1 + l2 + dssim)
    # pixels outside the mask get no gradient from the L1/L2 terms
    xr = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(PhotometricLoss.l1()(xr, y, mask=mask), xr)
    assert bool((g[~sel] == 0).all()) and bool((g[sel] != 0).all())
    # an all-zero mask gives 0, not NaN: l1 -> 0, and an empty channel counts as SSIM 1
    zero = PhotometricLoss(l1=1.0, dssim=1.0)(x, y, mask=torch.zeros(30, 32))
    assert float(zero) == 0.0


def test_masked_msssim_follows_the_pyramid():
    x, y = make_pair((1, 1, 161, 165), seed=7, mix=0.7)
    mask = torch.ones(1, 1, 161, 165)
    mask[..., :, 80:] = 0.0
    loss = PhotometricLoss(msssim=1.0, backend="reference")
    v = loss(x, y, mask=mask)
    v_torch = PhotometricLoss(msssim=1.0, backend="torch")(x, y, mask=mask)
    torch.testing.assert_close(v, v_torch, atol=1e-5, rtol=1e-5)
    # changing the target where the mask is 0 (and far from its edge) changes nothing
    y2 = y.clone()
    y2[..., :, 140:] = 0.5
    torch.testing.assert_close(loss(x, y2, mask=mask), v)


def test_zhao_mix_gaussian_weighted_l1():
    x, y = make_pair((1, 3, 64, 70), seed=8, mix=0.7)  # "same" padding: 5 scales fit any size
    loss = PhotometricLoss.zhao_mix(padding="same", backend="reference")
    total = loss(x, y)
    # independent: 2-D Gaussian (sigma 8, 49 taps) convolution of |x - y| with zero padding, normalised by
    # the blur of the ones (the zero-padded border is not counted as pixels): the all-ones-mask value
    r = 24
    t = torch.arange(-r, r + 1, dtype=torch.float64)
    g1 = torch.exp(-(t**2) / (2 * 64.0))
    g2 = torch.outer(g1, g1) / g1.sum() ** 2
    err = (x - y).abs().double()
    blurred = F.conv2d(err, g2.expand(3, 1, 49, 49), padding=r, groups=3)
    weight = F.conv2d(torch.ones_like(err), g2.expand(3, 1, 49, 49), padding=r, groups=3)
    l1g = blurred.sum() / weight.sum()
    torch.testing.assert_close(loss.terms["l1_gaussian"].double(), l1g, atol=1e-6, rtol=1e-5)
    ms = splatloss.ms_ssim(x, y, padding="same", tau=0.01)
    torch.testing.assert_close(total, 0.84 * (1 - ms) + 0.16 * l1g.float(), atol=1e-6, rtol=1e-5)


def test_photometric_half_precision_and_unbatched():
    x, y = make_pair((3, 40, 41), seed=9, mix=0.7)
    loss = PhotometricLoss.dssim_l1(reduction="none")
    full = loss(x, y)
    half = loss(x.half(), y.half())
    assert full.shape == () and half.dtype == torch.float32
    # measured: |full - half| = 2.9e-6 (the fp16 rounding of the inputs); the former bound 1e-3 was
    # 350x that. fp16 input is computed in fp32: equal to the fp32 loss of the rounded values.
    assert abs(float(full - half)) < 2e-5
    torch.testing.assert_close(half, loss(x.half().float(), y.half().float()), atol=1e-6, rtol=1e-6)


SMALL_MS = dict(window_size=3, sigma=0.8, ms_weights=(0.2, 0.3, 0.5))  # three scales on a 23x29 image


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(
    "terms",
    [
        dict(msssim=0.84, l1=0.16, **SMALL_MS),  # msssim_l1: an MS-SSIM term and a pixelwise one
        dict(l1=0.3, l2=0.2, dssim=0.2, msssim=0.3, padding="reflect", **SMALL_MS),  # the fused pair and more
        dict(l2=0.5, dssim=0.5),  # D-SSIM apart from the pixelwise terms
    ],
    ids=["msssim_l1", "four_terms", "l2_dssim"],
)
def test_photometric_half_precision_gradient_is_rounded_once(terms, dtype):
    """Several terms on fp16 / bf16 images: the gradient is the float64 gradient rounded once to the
    dtype (the terms' gradients add up in fp32; summed in the dtype they are 1.6e-4 (fp16) to 4.7e-3
    (bf16) of the scale beyond half an ulp)."""
    x, y = make_pair((2, 3, 23, 29), dtype, seed=3)
    mask = torch.rand(2, 1, 23, 29, generator=torch.Generator().manual_seed(1))
    xg = x.detach().requires_grad_(True)
    value = PhotometricLoss(**terms)(xg, y, mask)
    (g,) = torch.autograd.grad(value, xg)
    x64 = x.detach().double().requires_grad_(True)
    (truth,) = torch.autograd.grad(PhotometricLoss(**terms, backend="reference")(x64, y.double(), mask.double()), x64)
    assert value.dtype == torch.float32
    assert_rounded_once(g, truth, dtype, f"PhotometricLoss({terms}) gradient")


def test_hydra_target_builds_the_presets():
    instantiate = pytest.importorskip("hydra.utils").instantiate
    loss = instantiate({"_target_": "splatloss.PhotometricLoss.dssim_l1", "lambda_dssim": 0.3, "backend": "torch"})
    assert isinstance(loss, PhotometricLoss) and loss.weights["dssim"] == pytest.approx(0.3)
    loss = instantiate({"_target_": "splatloss.losses.PhotometricLoss", "l1": 0.5, "msssim": 0.5, "window_size": 7})
    assert loss.cfg.window_size == 7
    loss = instantiate({"_target_": "splatloss.MSSSIMLoss", "weights": [0.5, 0.5], "padding": "same"})
    assert loss.weights == (0.5, 0.5)
    # a weights mapping and MS-SSIM scale weights arrive as OmegaConf containers
    loss = instantiate(
        {"_target_": "splatloss.PhotometricLoss", "weights": {"l1": 0.8, "dssim": 0.2}, "ms_weights": [0.5, 0.5]}
    )
    assert loss.weights["l1"] == 0.8 and loss.weights["dssim"] == 0.2 and loss.ms_weights == (0.5, 0.5)


X = torch.rand(1, 3, 40, 40)


@pytest.mark.parametrize(
    "call,exc,message",
    [
        (lambda: PhotometricLoss(), ValueError, "PhotometricLoss needs at least one term with a weight > 0"),
        (lambda: PhotometricLoss(l1=-0.1), ValueError, "weight of term 'l1' must be a finite number >= 0, got -0.1"),
        (
            lambda: PhotometricLoss(l1="0.8"),
            TypeError,
            r"weight of term 'l1' must be a real number >= 0, got '0.8' \(str\)",
        ),
        (
            lambda: PhotometricLoss(weights={"ssim": 1.0}),
            ValueError,
            r"unknown loss term 'ssim'; terms are \('l1', 'l2', 'dssim', 'msssim', 'l1_gaussian', 's3im'\)",
        ),
        (
            lambda: PhotometricLoss(l1=1.0, weights={"l1": 0.5}),
            ValueError,
            r"term 'l1' is weighted twice: l1=1.0 and weights\['l1'\]=0.5",
        ),
        (
            lambda: PhotometricLoss(weights=[("l1", 1.0)]),
            TypeError,
            "weights must be a mapping of term name to weight, got list",
        ),
        (lambda: PhotometricLoss.l1().set_weight("lpips", 1.0), ValueError, "unknown loss term 'lpips'"),
        (
            lambda: PhotometricLoss.l1().set_weight("l1", float("inf")),
            ValueError,
            "weight of term 'l1' must be a finite number >= 0, got inf",
        ),
        (
            lambda: PhotometricLoss.dssim_l1(lambda_dssim=1.2),
            ValueError,
            r"lambda_dssim must be a number in \[0, 1\], got 1.2",
        ),
        (lambda: PhotometricLoss.zhao_mix(alpha=-0.1), ValueError, r"alpha must be a number in \[0, 1\], got -0.1"),
        (
            lambda: PhotometricLoss.l1(backend="gpu"),
            ValueError,
            r"backend must be one of \('auto', 'reference', 'torch', 'cpu', 'triton'\), got 'gpu'",
        ),
        (
            lambda: PhotometricLoss.l1(reduction="mean_all"),
            ValueError,
            r"reduction must be one of \('mean', 'sum', 'none'\), got 'mean_all'",
        ),
        (lambda: PhotometricLoss.l1(window_size=4), ValueError, "window_size must be an odd integer >= 3, got 4"),
        (lambda: PhotometricLoss.l1(l1_sigma=0), ValueError, "l1_sigma must be a finite number > 0, got 0"),
        (
            lambda: PhotometricLoss.msssim(ms_weights=[-1.0]),
            ValueError,
            r"ms_weights must be finite and >= 0, got ms_weights\[0\] = -1.0",
        ),
        (lambda: PhotometricLoss.msssim(tau=2.0), ValueError, r"tau must be a number in \(0, 1\) or None, got 2.0"),
        (lambda: MSSSIMLoss(tau=-1), ValueError, r"tau must be a number in \(0, 1\) or None, got -1"),
        (lambda: SSIMLoss(backend="fast"), ValueError, r"backend must be one of .* got 'fast'"),
        (lambda: MSSSIMLoss(weights=[]), ValueError, "weights must have one entry per scale"),
        (
            lambda: PhotometricLoss.l1()(X, X, mask=torch.ones(1, 1, 40, 39)),
            ValueError,
            r"mask must be shaped \(B, 1, H, W\), \(1, 1, H, W\), \(H, W\) or \(B, C, H, W\) for images of shape "
            r"\(1, 3, 40, 40\), got shape \(1, 1, 40, 39\)",
        ),
        (
            lambda: PhotometricLoss.l1()(X, X, mask=torch.ones(1, 2, 40, 40)),
            ValueError,
            r"for images of shape \(1, 3, 40, 40\), got shape \(1, 2, 40, 40\); give one weight per pixel",
        ),
        (lambda: PhotometricLoss.l1()(X, X, mask=[1]), TypeError, "mask must be a torch.Tensor or None, got list"),
        (
            lambda: PhotometricLoss.l1()(X, X, mask=torch.ones(40, 40, device="meta")),
            ValueError,
            "mask must be on the images' device cpu, got meta",
        ),
        (
            lambda: PhotometricLoss(l1_gaussian=1.0)(X, X),
            ValueError,
            r"the l1_gaussian term filters with a 49x49 Gaussian \(l1_sigma=8.0\) and padding='valid', so images "
            r"must be at least 49x49, got 40x40",
        ),
        (
            lambda: PhotometricLoss.msssim()(X, X),
            ValueError,
            "ms_ssim with 5 scales, window_size=11 and padding='valid' needs images of at least 161x161",
        ),
        (lambda: PhotometricLoss.l1()(X, X[:, :2]), ValueError, "img1 and img2 must have the same shape"),
    ],
)
def test_error_messages(call, exc, message):
    with pytest.raises(exc, match=message):
        call()
