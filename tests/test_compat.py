"""Drop-in entry points equal what they replace: pytorch_msssim 1.0 (installed) and fused-ssim."""

import pytest
import torch
import torch.nn.functional as F

import splatloss
from conftest import assert_rounded_once, make_pair
from splatloss import compat

pytorch_msssim = pytest.importorskip("pytorch_msssim")


@pytest.mark.parametrize("shape", [(2, 3, 37, 53), (1, 1, 64, 64), (3, 5, 20, 31)])
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(size_average=False),
        dict(win_size=7, win_sigma=1.0, K=(0.02, 0.05)),
        dict(nonnegative_ssim=True, size_average=False),
    ],
)
def test_ssim_equals_pytorch_msssim(shape, kwargs):
    x, y = make_pair(shape, seed=shape[-1], scale=255.0)  # the package's default data_range=255
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    theirs = pytorch_msssim.ssim(xa, y, **kwargs)
    ours = compat.ssim(xb, y, **kwargs)
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, atol=2e-6, rtol=1e-5)
    (ga,) = torch.autograd.grad(theirs.sum(), xa)
    (gb,) = torch.autograd.grad(ours.sum(), xb)
    torch.testing.assert_close(gb, ga, atol=1e-8, rtol=2e-4)
    # with data_range=255 the gradients are O(1e-6): atol=1e-8 is ~0.3 % of them. Normwise
    # (measured <= 1.6e-6, fp32 round-off):
    assert float((gb - ga).abs().max()) <= 2e-5 * float(ga.abs().max())


def test_ssim_data_range_1_and_float64():
    x, y = make_pair((1, 3, 30, 33), torch.float64, seed=1)
    torch.testing.assert_close(
        compat.ssim(x, y, data_range=1.0), pytorch_msssim.ssim(x, y, data_range=1.0), atol=1e-7, rtol=1e-6
    )


@pytest.mark.parametrize("hw", [(161, 161), (163, 171), (176, 192), (201, 167)])
def test_ms_ssim_equals_pytorch_msssim_including_odd_sizes(hw):
    x, y = make_pair((2, 3) + hw, seed=hw[0] + hw[1])
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    theirs = pytorch_msssim.ms_ssim(xa, y, data_range=1.0)
    ours = compat.ms_ssim(xb, y, data_range=1.0)
    torch.testing.assert_close(ours, theirs, atol=2e-6, rtol=1e-5)
    (ga,) = torch.autograd.grad(theirs, xa)
    (gb,) = torch.autograd.grad(ours, xb)
    torch.testing.assert_close(gb, ga, atol=1e-8, rtol=2e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_ms_ssim_half_precision_gradient_is_rounded_once(dtype):
    """The scales' gradients add up in fp32 and reach the fp16 / bf16 image rounded once (summed in the
    dtype they are 4.1e-4 (fp16) / 2.3e-3 (bf16) of the scale beyond half an ulp of float64 truth)."""
    x, y = make_pair((1, 3, 165, 163), dtype, seed=2)
    xg = x.detach().requires_grad_(True)
    (g,) = torch.autograd.grad(compat.ms_ssim(xg, y, data_range=1.0), xg)
    x64 = x.detach().double().requires_grad_(True)
    (truth,) = torch.autograd.grad(compat.ms_ssim(x64, y.double(), data_range=1.0, backend="reference"), x64)
    assert_rounded_once(g, truth, dtype, "compat.ms_ssim gradient")


def test_ms_ssim_options_equal_pytorch_msssim():
    x, y = make_pair((2, 2, 170, 165), seed=3, scale=255.0)
    kw = dict(size_average=False, weights=[0.2, 0.3, 0.5], K=(0.01, 0.04))
    torch.testing.assert_close(compat.ms_ssim(x, y, **kw), pytorch_msssim.ms_ssim(x, y, **kw), atol=2e-6, rtol=1e-5)
    # and the odd-size pyramid really is pytorch_msssim's, not TF's: they differ here
    tf_style = splatloss.ms_ssim(x, y, data_range=255.0, weights=kw["weights"], k2=0.04, reduction="none")
    assert float((compat.ms_ssim(x, y, **kw) - tf_style).abs().max()) > 1e-4


def test_modules_equal_pytorch_msssim_modules():
    x, y = make_pair((2, 3, 165, 170), seed=4)
    for ours, theirs in (
        (compat.SSIM(data_range=1.0, channel=3), pytorch_msssim.SSIM(data_range=1.0, channel=3)),
        (
            compat.SSIM(data_range=1.0, channel=3, size_average=False, win_size=9),
            pytorch_msssim.SSIM(data_range=1.0, channel=3, size_average=False, win_size=9),
        ),
        (compat.MS_SSIM(data_range=1.0, channel=3), pytorch_msssim.MS_SSIM(data_range=1.0, channel=3)),
        (
            compat.MS_SSIM(data_range=1.0, channel=3, weights=[0.5, 0.5]),
            pytorch_msssim.MS_SSIM(data_range=1.0, channel=3, weights=[0.5, 0.5]),
        ),
    ):
        torch.testing.assert_close(ours(x, y), theirs(x, y), atol=2e-6, rtol=1e-5)


def test_fused_ssim_conventions():
    x, y = make_pair((2, 3, 40, 45), seed=5)
    # fused-ssim: 11x11 Gaussian (sigma 1.5), C1 = 0.01^2, C2 = 0.03^2, "same" = zero padding, mean of the map
    w = torch.exp(-((torch.arange(11, dtype=torch.float64) - 5) ** 2) / (2 * 1.5**2))
    w2 = torch.outer(w, w) / w.sum() ** 2
    win = w2.expand(3, 1, 11, 11)
    conv = lambda t: F.conv2d(t.double(), win, padding=5, groups=3)  # noqa: E731
    mu1, mu2 = conv(x), conv(y)
    s1, s2, s12 = conv(x * x) - mu1**2, conv(y * y) - mu2**2, conv(x * y) - mu1 * mu2
    c1, c2 = 0.01**2, 0.03**2
    smap = ((2 * mu1 * mu2 + c1) * (2 * s12 + c2)) / ((mu1**2 + mu2**2 + c1) * (s1 + s2 + c2))
    torch.testing.assert_close(compat.fused_ssim(x, y).double(), smap.mean(), atol=2e-6, rtol=1e-5)
    # "valid" is the same map with the 5-pixel border cropped, as fused-ssim does
    torch.testing.assert_close(
        compat.fused_ssim(x, y, padding="valid").double(), smap[..., 5:-5, 5:-5].mean(), atol=2e-6, rtol=1e-5
    )
    assert splatloss.fused_ssim is compat.fused_ssim


def test_fused_ssim_train_flag():
    x, y = make_pair((1, 3, 24, 24), seed=6)
    xr = x.clone().requires_grad_()
    out = compat.fused_ssim(xr, y)
    assert out.requires_grad
    (1 - out).backward()
    assert xr.grad is not None and bool((xr.grad != 0).any())
    inf = compat.fused_ssim(xr, y, train=False)
    assert not inf.requires_grad
    torch.testing.assert_close(inf, out.detach())


X = torch.rand(1, 3, 32, 32)


@pytest.mark.parametrize(
    "call,exc,message",
    [
        (
            lambda: compat.fused_ssim(X, X, padding="reflect"),
            ValueError,
            r"padding must be 'same' or 'valid' \(as fused-ssim\), got 'reflect'",
        ),
        (lambda: compat.fused_ssim(X, X, train="yes"), TypeError, "train must be a bool, got str"),
        (
            lambda: compat.ssim(X, X, win=torch.ones(3, 1, 1, 11)),
            ValueError,
            "win \\(a custom window tensor\\) is not supported by splatloss.compat",
        ),
        (lambda: compat.ssim(X, X, K=(0.01,)), ValueError, r"K must be a pair \(K1, K2\), got \(0.01,\)"),
        (lambda: compat.ssim(X, X, win_size=10), ValueError, "^win_size must be an odd integer >= 3, got 10"),
        (lambda: compat.ssim(X, X, win_size=2.5), TypeError, r"^win_size must be an odd integer >= 3, got 2.5"),
        (lambda: compat.ssim(X, X, win_sigma=-1.0), ValueError, "^win_sigma must be a finite number > 0, got -1.0"),
        (lambda: compat.SSIM(K=(0.01, float("nan"))), ValueError, r"^K\[1\] must be a finite number > 0, got nan"),
        (
            lambda: compat.ssim(X[None], X[None]),
            ValueError,
            r"X is 5-D \(1, 1, 3, 32, 32\): 3-D \(volumetric\) SSIM is not supported",
        ),
        (
            lambda: compat.ssim(X[0], X[0]),
            ValueError,
            r"X must be a 4-D \(N, C, H, W\) tensor, got shape \(3, 32, 32\)",
        ),
        (
            lambda: compat.ms_ssim(X, X),
            ValueError,
            r"Image size should be larger than 160 due to the 4 downsamplings in ms-ssim \(as pytorch_msssim\), got "
            r"\(32, 32\)",
        ),
        (lambda: compat.SSIM(channel=0), ValueError, "channel must be an integer >= 1, got 0"),
        (lambda: compat.MS_SSIM(spatial_dims=3), ValueError, "spatial_dims must be 2 .* got 3"),
        (
            lambda: compat.SSIM(channel=1)(X, X),
            ValueError,
            r"this module was built for channel=1, got an input with 3 channels \(1, 3, 32, 32\)",
        ),
        (
            lambda: compat.MS_SSIM(weights=[-0.1, 1.0]),
            ValueError,
            r"weights must be finite and >= 0, got weights\[0\] = -0.1",
        ),
    ],
)
def test_error_messages(call, exc, message):
    with pytest.raises(exc, match=message):
        call()
