"""The reference itself against outside truth: scikit-image SSIM and TF-convention MS-SSIM."""

import numpy as np
import pytest
import torch
from _truth import TF_WEIGHTS, distort, photo, skimage_ssim, tf_ms_ssim, tf_ssim_per_channel, to_torch

from splatloss import reference
from splatloss.config import SSIMConfig

# (photo, top, left, H, W): odd and even sizes, textured and flat regions
PHOTO_CROPS = [
    ("astronaut", 40, 120, 64, 80),
    ("astronaut", 0, 300, 47, 61),  # the flat studio background: a cancellation-prone region
    ("coffee", 100, 200, 53, 71),
    ("chelsea", 60, 90, 72, 58),
]

# The bound, 2e-5, is for float32 inputs (measured here: up to 7.9e-6 for SSIM, 2.1e-6 for MS-SSIM).
# In float64 the reference and the outside truth agree to ~4e-15: 2e-5 there would hide a
# convention slip (window truncation, covariance, pyramid padding) smaller than the fp32 round-off.
TOL = {torch.float64: 1e-12, torch.float32: 2e-5}


@pytest.mark.parametrize("name,top,left,h,w", PHOTO_CROPS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_ssim_matches_skimage_on_photographs(name, top, left, h, w, dtype):
    a = photo(name, top, left, h, w)
    b = distort(a, seed=h * w)
    expected = skimage_ssim(a, b)
    got = reference.ssim_map(to_torch(a, dtype), to_torch(b, dtype), SSIMConfig()).mean()
    assert got.dtype == dtype
    assert abs(float(got) - expected) < TOL[dtype], (float(got), expected)


@pytest.mark.parametrize("h,w", [(11, 11), (23, 40), (32, 17)])
@pytest.mark.parametrize("channels", [1, 3])
def test_ssim_matches_skimage_on_random_images(h, w, channels):
    rng = np.random.default_rng(h + w + channels)
    a = rng.random((h, w, channels))
    b = np.clip(0.7 * a + 0.3 * rng.random((h, w, channels)), 0, 1)
    if channels == 1:
        a, b = a[..., 0], b[..., 0]
    expected = skimage_ssim(a, b)
    for dtype in (torch.float64, torch.float32):
        got = reference.ssim_map(to_torch(a, dtype), to_torch(b, dtype), SSIMConfig()).mean()
        assert abs(float(got) - expected) < TOL[dtype], (dtype, float(got), expected)


def test_ssim_grayscale_photo_and_data_range():
    a = photo("chelsea", 100, 100, 45, 51, gray=True)
    b = distort(a, seed=3)
    expected = skimage_ssim(a, b)
    got = reference.ssim_map(to_torch(a), to_torch(b), SSIMConfig()).mean()
    assert abs(float(got) - expected) < TOL[torch.float64]
    # data_range scales C1 and C2: images in [0, 255] with data_range=255 give the same SSIM
    got255 = reference.ssim_map(to_torch(a * 255), to_torch(b * 255), SSIMConfig(data_range=255.0)).mean()
    assert abs(float(got255) - expected) < 1e-9


def test_tf_numpy_truth_is_sane():
    # The test's own TF implementation: identical images give 1 at every scale, and its
    # single-scale SSIM agrees with scikit-image (two independent implementations).
    a = photo("coffee", 50, 50, 40, 44)
    b = distort(a, seed=1)
    s, _ = tf_ssim_per_channel(a, b)
    assert abs(float(s.mean()) - skimage_ssim(a, b)) < 1e-12
    big = photo("coffee", 0, 0, 170, 161)
    assert abs(tf_ms_ssim(big, big) - 1.0) < 1e-12


MS_CROPS = [
    ("astronaut", 100, 100, 161, 161),  # the smallest size 5 scales accept
    pytest.param("coffee", 80, 150, 163, 171, marks=pytest.mark.slow),  # odd at every scale
    pytest.param("chelsea", 20, 30, 176, 192, marks=pytest.mark.slow),  # even
    pytest.param("astronaut", 200, 180, 187, 165, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name,top,left,h,w", MS_CROPS)
def test_ms_ssim_matches_tf_convention(name, top, left, h, w):
    a = photo(name, top, left, h, w)
    b = distort(a, seed=h + w, noise=0.05)
    expected = tf_ms_ssim(a, b)
    for dtype in (torch.float64, torch.float32):
        got = reference.ms_ssim(to_torch(a, dtype), to_torch(b, dtype), SSIMConfig())
        assert got.shape == (1,)
        assert abs(float(got) - expected) < TOL[dtype], (dtype, float(got), expected)


def test_ms_ssim_random_odd_sizes_and_fewer_scales():
    rng = np.random.default_rng(7)
    a = rng.random((83, 97, 2))
    b = np.clip(a + 0.2 * rng.standard_normal(a.shape), 0, 1)
    weights = TF_WEIGHTS[:4]  # 4 scales need >= 81 pixels
    expected = tf_ms_ssim(a, b, weights=weights)
    got = reference.ms_ssim(to_torch(a), to_torch(b), SSIMConfig(), weights=weights)
    assert abs(float(got) - expected) < TOL[torch.float64]


def test_ms_ssim_relu_clamps_negative_terms_like_tf():
    a = photo("astronaut", 0, 0, 165, 170)
    b = 1.0 - a  # cs < 0 at every scale: TF gives exactly 0
    assert tf_ms_ssim(a, b) == 0.0
    assert float(reference.ms_ssim(to_torch(a), to_torch(b), SSIMConfig())) == 0.0


def test_downsample_repeats_last_row_and_column():
    x = torch.arange(15.0).reshape(1, 1, 3, 5)
    y = reference.downsample2x(x)
    assert y.shape == (1, 1, 2, 3)
    # bottom-right block is the corner pixel repeated 4 times; the last row is averaged with itself
    assert float(y[0, 0, 1, 2]) == 14.0
    assert float(y[0, 0, 1, 0]) == (10 + 11 + 10 + 11) / 4
    assert float(y[0, 0, 0, 2]) == (4 + 4 + 9 + 9) / 4


@pytest.mark.parametrize("padding", ["same", "reflect"])
def test_padded_maps_keep_size_and_interior_equals_valid(padding):
    torch.manual_seed(0)
    x, y = torch.rand(1, 2, 30, 33, dtype=torch.float64), torch.rand(1, 2, 30, 33, dtype=torch.float64)
    full = reference.ssim_map(x, y, SSIMConfig(padding=padding))
    valid = reference.ssim_map(x, y, SSIMConfig())
    assert full.shape == x.shape
    torch.testing.assert_close(full[..., 5:-5, 5:-5], valid, rtol=0, atol=1e-14)


def test_reflect_padding_is_mirror_without_edge_repeat():
    # An image whose reflect extension is itself periodic: the map of x vs a shifted x at the
    # border equals that of the explicitly mirrored image.
    torch.manual_seed(1)
    x, y = torch.rand(1, 1, 20, 20, dtype=torch.float64), torch.rand(1, 1, 20, 20, dtype=torch.float64)
    xm = torch.nn.functional.pad(x, (5, 5, 5, 5), mode="reflect")
    ym = torch.nn.functional.pad(y, (5, 5, 5, 5), mode="reflect")
    assert float(xm[0, 0, 5, 4]) == float(x[0, 0, 0, 1])  # mirror: edge sample not repeated
    torch.testing.assert_close(
        reference.ssim_map(x, y, SSIMConfig(padding="reflect")),
        reference.ssim_map(xm, ym, SSIMConfig()),
        rtol=0,
        atol=1e-14,
    )


def test_same_padding_is_zero_padding_like_3dgs():
    torch.manual_seed(2)
    x, y = torch.rand(1, 3, 19, 21, dtype=torch.float64), torch.rand(1, 3, 19, 21, dtype=torch.float64)
    # 3DGS's ssim(): conv2d(img, window, padding=window_size // 2, groups=C) on each statistic
    w = SSIMConfig().window_1d(torch.float64)
    win = torch.outer(w, w).expand(3, 1, 11, 11)
    conv = lambda t: torch.nn.functional.conv2d(t, win, padding=5, groups=3)  # noqa: E731
    mu1, mu2 = conv(x), conv(y)
    s1, s2, s12 = conv(x * x) - mu1**2, conv(y * y) - mu2**2, conv(x * y) - mu1 * mu2
    c1, c2 = 0.01**2, 0.03**2
    expected = ((2 * mu1 * mu2 + c1) * (2 * s12 + c2)) / ((mu1**2 + mu2**2 + c1) * (s1 + s2 + c2))
    torch.testing.assert_close(reference.ssim_map(x, y, SSIMConfig(padding="same")), expected, rtol=0, atol=1e-13)


def test_uniform_window_matches_skimage_uniform():
    from skimage.metrics import structural_similarity

    a = photo("coffee", 10, 10, 40, 41)
    b = distort(a, seed=9)
    expected = structural_similarity(a, b, win_size=7, use_sample_covariance=False, data_range=1.0, channel_axis=-1)
    got = reference.ssim_map(to_torch(a), to_torch(b), SSIMConfig(window="uniform", window_size=7)).mean()
    assert abs(float(got) - expected) < 1e-10


def test_reference_values_in_accumulation_dtype_and_grads_in_input_dtype():
    x = torch.rand(1, 1, 16, 16, dtype=torch.float16, requires_grad=True)
    y = torch.rand(1, 1, 16, 16, dtype=torch.float16)
    m = reference.ssim_map(x, y, SSIMConfig())
    assert m.dtype == torch.float32
    m.mean().backward()
    assert x.grad.dtype == torch.float16
