"""MS-SSIM on every backend: float64 reference, TF's definition on a photograph, both gradients."""

import importlib

import pytest
import torch

import splatloss
from conftest import (
    TOL,
    assert_rel,
    backend_params,
    device_for,
    has_cuda,
    make_pair,
    photo_arrays,
    rel,
    side,
)
from splatloss import reference


def _f64(t):
    return t.detach().double().cpu().requires_grad_(True)


def _big(params):
    """Full-size MS-SSIM cases; Triton in the interpreter runs the first only, marked slow. The fast
    tier keeps the first case of each other backend."""
    out = []
    for b in backend_params(slow_triton=True):
        for i, p in enumerate(params[:1] if b.values[0] == "triton" and not has_cuda() else params):
            marks = list(b.marks) + ([pytest.mark.slow] if i else [])
            out.append(pytest.param(*b.values, *p, marks=marks))
    return out


@pytest.mark.parametrize(
    "backend,padding,tau", _big([("valid", None), ("valid", 0.01), ("same", None), ("same", 0.01)])
)
def test_ms_ssim_163x171_values_and_both_gradients(backend, padding, tau):
    """All five scales (163 -> 82 -> 41 -> 21 -> 11 rows, odd sides repeat-padded), per-image upstream.
    Gradients here are at most 1.3e-3 ("valid") / 4.9e-4 ("same"): normwise against float64 truth
    (measured torch / cpu: values <= 5e-6, gradients <= 3.5e-5; triton <= 1e-5)."""
    # two channels (one for Triton in the interpreter, where each plane is a program run serially)
    x, y = make_pair((2, side(backend, 2, 1), 163, 171), seed=11, device=device_for(backend))
    x.requires_grad_(True), y.requires_grad_(True)
    kw = dict(padding=padding, tau=tau, reduction="none")
    got = splatloss.ms_ssim(x, y, backend=backend, **kw)
    up = torch.tensor([0.7, -1.3], dtype=torch.float64)
    got_g = torch.autograd.grad((got * up.to(got)).sum(), (x, y))
    x6, y6 = _f64(x), _f64(y)
    ref6 = splatloss.ms_ssim(x6, y6, backend="reference", **kw)
    ref6_g = torch.autograd.grad((ref6 * up).sum(), (x6, y6))
    assert got.shape == (2,) and got.dtype == torch.float32
    assert_rel(got, ref6, TOL[backend]["ms_values"], "ms_ssim")
    for a, b, what in zip(got_g, ref6_g, ("grad x", "grad y")):
        assert a.dtype == torch.float32
        assert_rel(a, b, TOL[backend]["ms_grads"], what)
        assert bool((a != 0).all()), f"{what}: a row or column dropped by the pyramid"


# Triton in the interpreter runs the same five-scale forward, held to float64 with both gradients,
# in test_ms_ssim_163x171_values_and_both_gradients; here on a GPU only.
@pytest.mark.parametrize("backend", [p for p in backend_params() if p.values[0] != "triton" or has_cuda()])
def test_ms_ssim_of_a_photograph_equals_tf_definition(backend):
    """TF's ssim_multiscale, written from its definition in numpy float64 (tests/_truth.py), on a
    photograph and a plausible rendering of it; the same 2e-5 bar as the public API's test."""
    from _truth import tf_ms_ssim, to_torch

    a, b = photo_arrays(176, 176, seed=2)
    x, y = to_torch(a), to_torch(b)
    dev = device_for(backend)
    got = splatloss.ms_ssim(x.float().to(dev), y.float().to(dev), backend=backend)
    assert abs(float(got) - tf_ms_ssim(a, b)) < 2e-5


def test_ms_ssim_loss_on_negative_structure_keeps_a_gradient(backend):
    """y = 1 - x inverts the structure (cs < 0 at every scale): the metric is 0 like TF's, the loss
    (tau, the smooth positive extension) stays positive with a finite, non-zero gradient equal to
    the float64 reference's."""
    x, _ = make_pair((1, side(backend, 2, 1), 45, 47), seed=5, device=device_for(backend))
    y = 1 - x
    w = (0.3, 0.3, 0.4)
    x.requires_grad_(True)
    metric = splatloss.ms_ssim(x, y, weights=w, backend=backend)
    assert float(metric.detach()) == 0.0
    loss = splatloss.ms_ssim(x, y, weights=w, tau=0.01, backend=backend)
    (g,) = torch.autograd.grad(loss, [x])
    xr = _f64(x)
    loss_r = splatloss.ms_ssim(xr, y.double().cpu(), weights=w, tau=0.01, backend="reference")
    (gr,) = torch.autograd.grad(loss_r, [xr])
    assert float(loss.detach()) > 0 and bool(torch.isfinite(g).all()) and float(g.abs().max()) > 0
    assert_rel(loss, loss_r, TOL[backend]["ms_values"], "loss")
    assert_rel(g, gr, TOL[backend]["ms_grads"], "grad")


@pytest.mark.triton
def test_triton_pyramid_kernel_equals_the_reference_step_on_odd_sides():
    tri_ms = importlib.import_module("splatloss.backends.triton.ms_ssim")
    dev = "cuda" if has_cuda() else "cpu"
    x64, _ = make_pair((2, 3, 37, 53), torch.float64, seed=2)
    x = x64.float().to(dev).requires_grad_(True)
    d = tri_ms.downsample2x(x)
    xr = x64.clone().requires_grad_(True)
    dr = reference.downsample2x(xr)
    assert d.shape == (2, 3, 19, 27) and d.dtype == torch.float32
    up = torch.randn(dr.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    (g,) = torch.autograd.grad((d * up.float().to(dev)).sum(), [x])
    (gr,) = torch.autograd.grad((dr * up).sum(), [xr])
    assert rel(d, dr) <= 1e-6 and rel(g, gr) <= 1e-6
    # fp16 input is read as fp16 and averaged in fp32: no full-size fp32 copy is made
    dh = tri_ms.downsample2x(x64.half().to(dev))
    assert dh.dtype == torch.float32 and rel(dh, reference.downsample2x(x64.half().double())) <= 1e-6


@pytest.mark.parametrize("backend", ["reference", "torch", "cpu"])
def test_ms_ssim_differentiates_after_a_call_under_inference_mode(backend):
    # The scale weights' tensor is made once per (weights, dtype, device); made during an
    # inference-mode evaluation it must still serve a later training step (autograd saves it).
    x, y = make_pair((1, 1, 40, 44), seed=9)
    w = (0.35, 0.65)  # weights of their own: the first call of this test makes their tensor
    with torch.inference_mode():
        value = splatloss.ms_ssim(x, y, weights=w, backend=backend)
    x.requires_grad_(True)
    (g,) = torch.autograd.grad(splatloss.ms_ssim(x, y, weights=w, backend=backend), x)
    assert float(value) > 0 and bool(torch.isfinite(g).all()) and float(g.abs().max()) > 0
