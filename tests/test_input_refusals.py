"""What cannot be computed right is refused with an error naming the argument, before anything runs.

Masks with NaN, infinite or negative weights; constants a float32 computation cannot hold; a
reference-backend call whose unfolded windows cannot fit in memory. Each is either computed to the
float64 answer or refused with a message that names the value and the fix, on every entry point.
"""

from __future__ import annotations

import pytest
import torch

import splatloss
from conftest import make_pair
from splatloss import MSSSIMLoss, PhotometricLoss, SSIMLoss
from splatloss.compat import fused_ssim

BACKENDS = ("reference", "torch", "cpu", pytest.param("triton", marks=pytest.mark.triton))


def _entry_points(mask, backend):
    x, y = make_pair((1, 3, 24, 24), mix=0.9)
    return {
        "ssim": lambda: splatloss.ssim(x, y, mask=mask, backend=backend, padding="same"),
        "ssim_map": lambda: splatloss.ssim_map(x, y, mask=mask, backend=backend),
        "dssim_l1": lambda: splatloss.dssim_l1(x, y, mask=mask, backend=backend, padding="same"),
        "ms_ssim": lambda: splatloss.ms_ssim(x, y, mask=mask, backend=backend, padding="same", weights=(0.5, 0.5)),
        "dssim_with_gradient": lambda: splatloss.dssim_with_gradient(x, y, mask=mask, backend=backend),
        "SSIMLoss": lambda: SSIMLoss(backend=backend)(x, y, mask=mask),
        "MSSSIMLoss": lambda: MSSSIMLoss(backend=backend, padding="same", weights=(0.5, 0.5))(x, y, mask=mask),
        "PhotometricLoss": lambda: PhotometricLoss.dssim_l1(backend=backend)(x, y, mask=mask),
    }


def _bad_mask(kind):
    m = torch.ones(1, 1, 24, 24)
    m[0, 0, 3, 4] = {"nan": float("nan"), "inf": float("inf"), "negative": -0.5}[kind]
    return m


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["nan", "inf", "negative"])
def test_a_mask_with_a_nan_inf_or_negative_weight_is_refused_everywhere(kind, backend):
    word = {"nan": "1 NaN", "inf": "1 infinite", "negative": "1 negative"}[kind]
    for name, call in _entry_points(_bad_mask(kind), backend).items():
        with pytest.raises(ValueError, match=f"mask weights must be finite and >= 0.*got {word} weight;"):
            call()
    x, y = make_pair((1, 3, 24, 24), mix=0.9)
    with pytest.raises(ValueError, match="mask weights must be finite and >= 0"):
        fused_ssim(x, y, mask=_bad_mask(kind))


def test_weights_above_one_and_zeros_are_accepted_as_relative_weights():
    # the statistics are mask-normalised: weights in [0, 2] mean what the same weights halved mean
    # (measured equal: halving is exact in binary); the all-ones mask is tests/backends/test_masked_losses.py's
    x, y = make_pair((1, 3, 24, 24), mix=0.9)
    soft = torch.rand(1, 1, 24, 24, generator=torch.Generator().manual_seed(0)) * 2
    soft[..., :4, :] = 0
    got = float(splatloss.ssim(x, y, mask=soft, backend="torch"))
    assert got == pytest.approx(float(splatloss.ssim(x, y, mask=soft / 2, backend="torch")), abs=1e-6)


@pytest.mark.parametrize("backend", ("torch", "cpu", pytest.param("triton", marks=pytest.mark.triton)))
@pytest.mark.parametrize(
    "options, message",
    [
        ({"data_range": 1e20}, r"data_range=1e\+20 is too large for torch.float32 input: at most 1e\+18"),
        ({"data_range": 1e-20}, r"C1 = \(k1 \* data_range\)\^2 = 1e-44 \(k1=0.01, data_range=1e-20\) is outside"),
        ({"c1": 1e-50, "c2": 1e-50}, r"c1=1e-50 is outside the range torch.float32 input is computed in"),
        ({"c2": 1e40}, r"c2=1e\+40 is outside the range"),
    ],
)
def test_constants_float32_cannot_hold_are_refused_and_float64_computes_them(backend, options, message):
    x, y = make_pair((1, 3, 24, 24), mix=0.9)
    with pytest.raises(ValueError, match=message + ".*pass float64 images"):
        splatloss.ssim(x, y, backend=backend, **options)
    with pytest.raises(ValueError, match=message):
        PhotometricLoss.dssim_l1(backend=backend, **options)(x, y)
    if backend != "triton":  # float64 input is computed in float64 and equals the reference
        got = splatloss.ssim(x.double(), y.double(), backend=backend, **options)
        want = splatloss.ssim(x.double(), y.double(), backend="reference", **options)
        assert torch.isfinite(got) and abs(float(got) - float(want)) < 1e-12


@pytest.mark.parametrize("backend", ("torch", "cpu"))
def test_constants_at_the_edges_of_the_float32_range_equal_float64(backend):
    # The accepted range is where the float32 backends were measured equal to float64.
    x, y = make_pair((1, 3, 24, 24), mix=0.9)
    for options, scale in (({"data_range": 1e18}, 1e18), ({"data_range": 1e-15}, 1e-15), ({"c1": 1e-36}, 1.0)):
        xs = (x.double() * scale).float().requires_grad_(True)
        ys = (y.double() * scale).float()
        value = splatloss.ssim(xs, ys, backend=backend, **options)
        (g,) = torch.autograd.grad(value, xs)
        x64 = (x.double() * scale).requires_grad_(True)
        truth = splatloss.ssim(x64, ys.double(), backend="reference", **options)
        (g64,) = torch.autograd.grad(truth, x64)
        assert abs(float(value) - float(truth)) < 1e-6
        assert float((g.double() - g64).abs().max() / g64.abs().max()) < 1e-5


def test_the_reference_refuses_a_window_it_cannot_hold_before_allocating():
    x = torch.rand(1, 1, 4096, 4096)  # a 4001-pixel window needs about 1 TB of unfolded windows
    with pytest.raises(ValueError, match=r"backend='reference' with window_size=4001 on 1 image\(s\) of 4096x4096"):
        splatloss.ssim(x, x, window_size=4001, backend="reference")


@pytest.mark.slow
def test_under_torch_compile_a_bad_argument_gives_the_eager_message():
    # torch.compile (default, graph breaks allowed) hands the exception through unchanged; with
    # fullgraph=True PyTorch wraps any exception raised while tracing, and the message is kept in it.
    x, y = make_pair((1, 3, 24, 24), mix=0.9)
    for call, message in (
        (lambda a, b: splatloss.ssim(a, b, window_size=4), "window_size must be an odd integer >= 3, got 4"),
        (lambda a, b: splatloss.ssim(a, b, padding="zeros"), "padding must be one of"),
        (lambda a, b: splatloss.ssim(a, b, mask=torch.ones(3, 3)), r"mask must be shaped \(B, 1, H, W\)"),
    ):
        torch._dynamo.reset()
        with pytest.raises(ValueError, match=message):
            torch.compile(call)(x, y)
        torch._dynamo.reset()
        with pytest.raises(Exception, match=message):
            torch.compile(call, fullgraph=True)(x, y)


def test_modules_check_their_options_when_constructed_outside_any_compiled_region():
    # torch.compile(module, fullgraph=True) then never traces a bad option: the eager ValueError is
    # raised by the constructor, before compilation.
    for make in (
        lambda: splatloss.SSIMLoss(window_size=4),
        lambda: splatloss.MSSSIMLoss(window_size=4),
        lambda: splatloss.PhotometricLoss(dssim=0.2, l1=0.8, window_size=4),
    ):
        with pytest.raises(ValueError, match="window_size must be an odd integer >= 3, got 4"):
            make()
