"""Numerical edges, on every backend: extreme data ranges and constants, degenerate windows, fp32
accuracy on a flat photograph, empty channels, and the pytorch_msssim-compatible argument types.

The truth is the float64 reference (every backend agrees with scikit-image in float64 elsewhere,
tests/test_reference.py); each tolerance comes with the error measured before and after the fix.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from skimage import data

import splatloss
from conftest import backend_params, device_for, make_pair
from splatloss import compat
from splatloss.config import SSIMConfig

BACKENDS = ("reference", "torch", "cpu", "triton")
# every backend as pytest params: Triton marked triton, and slow where it runs in the interpreter
CASES = list(BACKENDS[:3]) + backend_params(["triton"], slow_triton=True)


def _flat_jpeg_pair():
    """A 64x64 crop of the astronaut photograph (grey wall behind her shoulder, and the shoulder:
    mean 0.82, std 0.045) and its JPEG quality-10 round trip: flat, blocky, realistic. float64."""
    crop = data.astronaut()[150:214, 310:374]
    buf = io.BytesIO()
    Image.fromarray(crop).save(buf, format="JPEG", quality=10)
    jpeg = np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))

    def to_t(a):
        return torch.from_numpy(a.astype(np.float64) / 255.0).permute(2, 0, 1)[None].contiguous()

    return to_t(crop), to_t(jpeg)


def _relerr(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).norm() / b.norm())


# ----------------------------------------------------------------------------------------------
# fp32 accuracy on a flat photograph
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("padding", ["valid", "same"])
@pytest.mark.parametrize("backend", CASES)
def test_fp32_flat_photograph_matches_float64(backend, padding):
    """fp32 value within 2e-5 and both gradients within 3e-5 (normwise) of float64.

    Measured (value / grad_x / grad_y, "valid"; "same" alike) before -> after the fix:
    reference 5.5e-5 / 6.9e-4 / 6.4e-4 -> 2.9e-8 / 4.0e-8 / 4.4e-8 (fp32 inputs computed in float64),
    torch     1.2e-6 / 8.0e-5 / 6.8e-5 -> 2.9e-8 / 8.6e-8 / 8.9e-8 (moments around local shifts per row and tile),
    cpu       1.2e-5 / 7.3e-5 / 6.3e-5 -> 3.1e-8 / 5.1e-7 / 4.8e-7 (the C kernel shifts per plane too),
    triton    2.2e-6 / 2.1e-5 / 2.2e-5 -> 2.9e-8 / 6.9e-7 / 6.3e-7 (moments of x - s: s was data_range / 2,
              now a local mean of each program).
    """
    x64, y64 = _flat_jpeg_pair()
    xr, yr = x64.clone().requires_grad_(True), y64.clone().requires_grad_(True)
    truth = splatloss.ssim(xr, yr, padding=padding, backend="reference")
    gx64, gy64 = torch.autograd.grad(truth, (xr, yr))

    dev = device_for(backend)
    x, y = x64.float().to(dev).requires_grad_(True), y64.float().to(dev).requires_grad_(True)
    value = splatloss.ssim(x, y, padding=padding, backend=backend)
    gx, gy = (g.cpu() for g in torch.autograd.grad(value, (x, y)))
    assert value.dtype == torch.float32 and gx.dtype == torch.float32
    errs = (abs(float(value.detach()) - float(truth.detach())), _relerr(gx, gx64), _relerr(gy, gy64))
    print(f"{backend} {padding}: value {errs[0]:.2e} grad_x {errs[1]:.2e} grad_y {errs[2]:.2e}")
    assert errs[0] < 2e-5, errs
    assert max(errs[1:]) < 3e-5, errs


# ----------------------------------------------------------------------------------------------
# Extreme data ranges and constants
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", CASES)
def test_huge_data_range(backend):
    """ssim(x * 1e10, y * 1e10, data_range=1e10) = ssim(x, y): the C kernel formed 1 / (B1 B2) in
    fp32 (B1 ~ B2 ~ 1e19, product overflows) and returned NaN. Measured after: 3.2e-10 (reference),
    3.4e-9 (torch, cpu), 7.1e-9 -> 3.4e-9 (triton, local moment shift)."""
    x, y = make_pair((1, 3, 20, 20), torch.float64, seed=0, mix=0.0)
    truth = float(splatloss.ssim(x, y, backend="reference"))
    dev = device_for(backend)
    value = splatloss.ssim((x * 1e10).float().to(dev), (y * 1e10).float().to(dev), data_range=1e10, backend=backend)
    assert abs(float(value) - truth) < 1e-6, (float(value), truth)


@pytest.mark.parametrize("backend", CASES)
def test_tiny_constants_on_black(backend):
    """Two black images with C1 = C2 = 1e-20 are identical: SSIM 1 (was inf on the C kernel, whose
    B1 B2 = 1e-40 is below fp32's normal range)."""
    z = torch.zeros(1, 3, 16, 16, device=device_for(backend))
    value = splatloss.ssim(z, z, c1=1e-20, c2=1e-20, backend=backend)
    assert float(value) == 1.0


@pytest.mark.parametrize("backend", CASES)
def test_extreme_constants_gradients(backend):
    """The gradients at those extremes are finite and equal the float64 ones (scale-invariance:
    d ssim / d(x * 1e10) = 1e-10 d ssim / dx; identical images: the gradient is 0)."""
    x, y = make_pair((1, 3, 20, 20), torch.float64, seed=1, mix=0.0)
    xr = x.clone().requires_grad_(True)
    (g64,) = torch.autograd.grad(splatloss.ssim(xr, y, backend="reference"), xr)
    dev = device_for(backend)
    xs = (x * 1e10).float().to(dev).requires_grad_(True)
    (g,) = torch.autograd.grad(splatloss.ssim(xs, (y * 1e10).float().to(dev), data_range=1e10, backend=backend), xs)
    g = g.cpu()
    # measured 6.8e-8 (reference) .. 9.9e-8 (torch), fp32 round-off; triton 9.4e-8 (NaN while it
    # formed 1 / (B1 B2) in float32; it now divides by B1 and B2 in turn)
    assert _relerr(g * 1e10, g64) < 1e-6

    z = torch.zeros(1, 3, 16, 16, device=dev, requires_grad=True)
    (gz,) = torch.autograd.grad(
        splatloss.ssim(z, torch.zeros(1, 3, 16, 16, device=dev), c1=1e-20, c2=1e-20, backend=backend), z
    )
    assert torch.equal(gz, torch.zeros_like(gz))


# ----------------------------------------------------------------------------------------------
# Degenerate windows, empty channels and sides
# ----------------------------------------------------------------------------------------------


def test_sigma_that_underflows_is_refused():
    with pytest.raises(ValueError, match=r"sigma must be at least 1e-150 .* got 1e-200"):
        SSIMConfig(sigma=1e-200)
    for backend in BACKENDS:
        with pytest.raises(ValueError, match="sigma must be at least 1e-150"):
            splatloss.ssim(torch.rand(1, 1, 16, 16), torch.rand(1, 1, 16, 16), sigma=1e-200, backend=backend)
    # the smallest accepted sigma gives a one-tap window: SSIM of single pixels, finite
    w = SSIMConfig(sigma=1e-150).window_1d(torch.float64)
    assert torch.equal(w, torch.eye(11, dtype=torch.float64)[5])


@pytest.mark.parametrize("backend", list(BACKENDS[:3]) + backend_params(["triton"]))
def test_zero_channels_same_error_everywhere(backend):
    z = torch.rand(1, 0, 16, 16)
    for fn in (splatloss.ssim, splatloss.ssim_map, splatloss.dssim, splatloss.dssim_l1):
        with pytest.raises(ValueError, match=r"at least one channel, got shape \(1, 0, 16, 16\)"):
            fn(z, z, backend=backend)
    with pytest.raises(ValueError, match="at least one channel"):
        splatloss.dssim_with_gradient(z, z, backend=backend)
    with pytest.raises(ValueError, match="at least one channel"):
        splatloss.ms_ssim(torch.rand(1, 0, 161, 161), torch.rand(1, 0, 161, 161), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS[:3])
def test_an_empty_batch_gives_torchs_results(backend):
    """No image in the batch: empty per-image results and maps, NaN for a mean over no image (torch's
    mean of nothing), empty gradients, on every backend but Triton (which refuses it:
    tests/test_triton_launchers.py). The "cpu" backend, on more than one thread, used to divide by
    the plane count: two threads here, as users have them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _empty_batch_results(backend)
    finally:
        torch.set_num_threads(threads)


def _empty_batch_results(backend):
    z = torch.rand(0, 3, 180, 180)
    m = torch.ones(0, 1, 180, 180)
    zg = z.clone().requires_grad_(True)
    for value in (
        splatloss.ssim(z, z, backend=backend),
        splatloss.ssim(z, z, padding="same", backend=backend),
        splatloss.ssim(z, z, mask=m, backend=backend),
        splatloss.dssim_l1(z, z, backend=backend),
        splatloss.dssim_l1(z, z, mask=m, padding="same", backend=backend),
        splatloss.ms_ssim(z, z, backend=backend),
        splatloss.PhotometricLoss(l1=0.8, dssim=0.2, backend=backend)(z, z),
        splatloss.dssim_with_gradient(z, z, backend=backend)[0],
    ):
        assert value.shape == () and value.isnan()
    assert splatloss.ssim(z, z, reduction="none", backend=backend).shape == (0,)
    assert splatloss.ms_ssim(z, z, reduction="none", backend=backend).shape == (0,)
    assert splatloss.ssim_map(z, z, backend=backend).shape == (0, 3, 170, 170)
    value, grad = splatloss.dssim_with_gradient(z, z, reduction="sum", backend=backend)
    assert value == 0 and grad.shape == z.shape
    (g,) = torch.autograd.grad(splatloss.dssim_l1(zg, z, backend=backend), zg)
    assert g.shape == z.shape


def test_empty_side_with_same_padding_says_why():
    z = torch.rand(1, 3, 0, 16)
    with pytest.raises(ValueError, match=r"padding='same' needs at least one row and one column, got 0x16") as e:
        splatloss.ssim(z, z, padding="same")
    assert "reflect" not in str(e.value)
    with pytest.raises(ValueError, match=r"mirrors window_size // 2 = 5 pixels.*got 4x16"):
        splatloss.ssim(torch.rand(1, 3, 4, 16), torch.rand(1, 3, 4, 16), padding="reflect")


# ----------------------------------------------------------------------------------------------
# compat: what pytorch_msssim accepts
# ----------------------------------------------------------------------------------------------


def test_compat_accepts_numpy_and_0d_tensors_like_pytorch_msssim():
    pm = pytest.importorskip("pytorch_msssim")
    g = torch.Generator().manual_seed(3)
    x = torch.rand(1, 3, 180, 180, generator=g) * 255
    y = (x + 20 * torch.randn(1, 3, 180, 180, generator=g)).clamp(0, 255)
    w = [0.0448, 0.2856, 0.3001, 0.2363, 0.1333]
    cases = [
        dict(data_range=np.float64(255.0), K=np.array([0.01, 0.03])),
        dict(data_range=torch.tensor(255.0), K=torch.tensor([0.01, 0.03])),
        dict(data_range=np.array(255.0), K=(torch.tensor(0.01), np.float32(0.03))),
    ]
    for kw in cases:
        ours = compat.ssim(x, y, **kw)
        theirs = pm.ssim(x, y, **kw)
        assert abs(float(ours) - float(theirs)) < 1e-5  # measured 1.2e-7: fp32 round-off
    for weights in (np.array(w), torch.tensor(w), torch.tensor(w, dtype=torch.float64)):
        ours = compat.ms_ssim(x, y, data_range=torch.tensor(255.0), weights=weights)
        theirs = pm.ms_ssim(x, y, data_range=torch.tensor(255.0), weights=weights)
        assert abs(float(ours) - float(theirs)) < 1e-5  # measured 8.3e-7
    module = compat.SSIM(data_range=np.float32(255.0), K=np.array([0.01, 0.03]), channel=3)
    assert abs(float(module(x, y)) - float(pm.ssim(x, y, data_range=255.0))) < 1e-5


def test_compat_bad_numpy_inputs_say_what_was_expected():
    x = torch.rand(1, 3, 32, 32)
    with pytest.raises(ValueError, match=r"K must be a pair \(K1, K2\), got an array of shape \(3,\)"):
        compat.ssim(x, x, K=np.array([0.01, 0.03, 0.1]))
    with pytest.raises(ValueError, match=r"data_range must be a number or a one-element array / tensor"):
        compat.ssim(x, x, data_range=np.array([255.0, 1.0]))
