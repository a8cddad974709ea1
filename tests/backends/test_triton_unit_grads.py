"""The Triton losses compute their gradient in the forward and scale it in the backward.

``splatloss.ssim`` / ``dssim`` (``Backend.ssim_mean``), ``dssim_l1`` and every MS-SSIM scale run
the backward kernel once in the forward when an input requires a gradient, for a unit upstream
gradient per image (and channel), and keep that float32 gradient; the backward multiplies it by
the upstream scalars. These tests hold that path to the one that recomputes in the backward (the
``ssim_stats`` / ``ssim_map`` ops) and to the float64 reference, with upstream gradients that are
not uniform, in low precision, and through the recompute fallback.
"""

import pytest
import torch

import splatloss
from conftest import TOL, assert_rel, device_for, make_pair
from splatloss.config import SSIMConfig

pytestmark = pytest.mark.triton

# Two fp32 gradients of the same loss, one scaled after the kernel and one with the scale inside
# it, differ by rounding only: a few fp32 ulps of the gradient's scale, normwise.
SAME_GRADIENT = 1e-6


def _backend():
    return splatloss.backends.get("triton")


def _f64_grads(loss_fn, x, y, need2):
    x6 = x.detach().double().cpu().requires_grad_()
    y6 = y.detach().double().cpu().requires_grad_(need2)
    loss_fn(x6, y6, "reference").backward()
    return x6.grad, (y6.grad if need2 else None)


@pytest.mark.slow  # the fast tier runs this path through the conformance suite's Triton mean case
@pytest.mark.parametrize("need2", [False, True])
def test_ssim_loss_gradient_from_the_forward_matches_the_recomputed_one(need2):
    dev = device_for("triton")
    cfg = SSIMConfig(window_size=5, padding="reflect")
    x, y = make_pair((2, 2, 19, 22), seed=5, device=dev)
    w = torch.tensor([0.3, 1.7], device=dev)  # a different upstream gradient per image

    def loss(a, b, backend):
        per_image = splatloss.ssim(a, b, window_size=5, padding="reflect", backend=backend, reduction="none")
        return (w.to(per_image) * per_image).sum()

    xa, ya = x.clone().requires_grad_(), y.clone().requires_grad_(need2)
    out = loss(xa, ya, "triton")
    gx, gy = torch.autograd.grad(out, (xa, ya)) if need2 else torch.autograd.grad(out, xa) + (None,)
    # the same loss through ssim_stats, whose backward recomputes the moments
    xb, yb = x.clone().requires_grad_(), y.clone().requires_grad_(need2)
    s, _ = _backend().ssim_stats(xb, yb, cfg)
    out_b = (w * s.mean(dim=1)).sum()
    ref = torch.autograd.grad(out_b, (xb, yb) if need2 else (xb,))
    torch.testing.assert_close(out, out_b, rtol=1e-6, atol=1e-7)
    assert_rel(gx, ref[0], SAME_GRADIENT, "grad x: forward-computed vs recomputed")
    truth = _f64_grads(loss, x, y, need2)
    assert_rel(gx, truth[0], TOL["triton"]["grads"], "grad x vs float64")
    if need2:
        assert_rel(gy, ref[1], SAME_GRADIENT, "grad y: forward-computed vs recomputed")
        assert_rel(gy, truth[1], TOL["triton"]["grads"], "grad y vs float64")


@pytest.mark.slow
def test_dssim_l1_gradient_from_the_forward_and_the_recompute_fallback():
    # The op's backward recomputes when an input needs a gradient its forward did not compute:
    # called with need1=False on an input that requires one, it takes that path.
    from splatloss.backends.triton import dssim_l1 as mod
    from splatloss.backends.triton.glue import window_taps

    dev = device_for("triton")
    cfg = SSIMConfig(window_size=7, padding="same")
    x, y = make_pair((2, 3, 18, 20), seed=11, device=dev)
    g = torch.tensor([1.0, -2.5], device=dev)
    args = (window_taps(cfg, dev), cfg.padding, float(cfg.C1), float(cfg.C2), 0.2)
    grads = []
    for need in (True, False):
        xa = x.clone().requires_grad_()
        loss, _, _ = mod._dssim_l1_op(xa, y, *args, need, False, 1.0)
        (gx,) = torch.autograd.grad((g * loss).sum(), xa)
        grads.append(gx)
    assert_rel(grads[0], grads[1], SAME_GRADIENT, "forward-computed vs recomputed")
    x6 = x.double().requires_grad_()
    ref = splatloss.dssim_l1(x6, y.double(), 0.2, window_size=7, padding="same", backend="reference", reduction="none")
    (g.double() * ref).sum().backward()
    assert_rel(grads[0], x6.grad, TOL["triton"]["grads"], "vs float64")


@pytest.mark.slow
@pytest.mark.parametrize("cs", [False, True])
def test_term_op_recompute_fallback(cs):
    from splatloss.backends.triton import ssim as mod
    from splatloss.backends.triton.glue import window_taps

    dev = device_for("triton")
    cfg = SSIMConfig(window_size=3, padding="valid")
    x, y = make_pair((1, 2, 16, 17), seed=13, device=dev)
    args = (window_taps(cfg, dev), cfg.padding, float(cfg.C1), float(cfg.C2), cs)
    up = torch.tensor([[0.5, -1.5]], device=dev)
    grads = []
    for need in (True, False):
        xa, ya = x.clone().requires_grad_(), y.clone().requires_grad_()
        t, _, _ = mod._term_op(xa, ya, *args, need, need, 1.0)
        grads.append(torch.autograd.grad((up * t).sum(), (xa, ya)))
    for a, b in zip(*grads):
        assert_rel(a, b, SAME_GRADIENT, f"cs={cs}: forward-computed vs recomputed")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs_keep_a_float32_unit_gradient(dtype):
    # The unit-upstream gradient of a mean is ~1 / (H W): kept in the input's half precision it
    # would round (fp16: below its smallest normal); it is kept in float32 and the backward
    # returns the input's dtype.
    dev = device_for("triton")
    x, y = make_pair((1, 1, 24, 24), dtype=dtype, seed=17, device=dev)
    x.requires_grad_()
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = 1 - splatloss.ssim(x, y, window_size=3, backend="triton")
    assert any(t.dtype == torch.float32 and t.shape == x.shape for t in saved)
    loss.backward()
    assert x.grad.dtype == dtype
    x6 = x.detach().double().requires_grad_()
    (1 - splatloss.ssim(x6, y.double(), window_size=3, backend="reference")).backward()
    # one rounding of the float32 gradient to the dtype (half an ulp) above the kernels' bar
    ulp = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}[dtype]
    assert_rel(x.grad, x6.grad, TOL["triton"]["grads"] + ulp, "vs float64")


@pytest.mark.slow
def test_ms_ssim_scales_from_the_forward_match_the_recomputed_composition():
    # Triton MS-SSIM (one ssim_term per scale, the cs or SSIM gradient computed in the forward)
    # against the shared composition over ssim_stats (every scale recomputed in the backward).
    from splatloss import multiscale
    from splatloss.backends.triton.ms_ssim import downsample2x

    dev = device_for("triton")
    cfg = SSIMConfig(window_size=3)
    weights = (0.3, 0.3, 0.4)
    x, y = make_pair((1, 2, 26, 29), seed=19, device=dev)
    xa = x.clone().requires_grad_()
    (ga,) = torch.autograd.grad(1 - _backend().ms_ssim(xa, y, cfg, weights, tau=0.01).mean(), xa)
    xb = x.clone().requires_grad_()
    stats = lambda a, b: _backend().ssim_stats(a, b, cfg)  # noqa: E731
    ms = multiscale.ms_ssim(stats, xb, y, weights, 0.01, down=downsample2x, cast=False)
    (gb,) = torch.autograd.grad(1 - ms.mean(), xb)
    assert_rel(ga, gb, SAME_GRADIENT, "MS-SSIM: forward-computed vs recomputed")


def test_no_gradient_wanted_runs_the_forward_kernel_only(monkeypatch):
    # Under no_grad (evaluation) the loss reads the images once and computes no gradient.
    from splatloss.backends.triton import ssim as mod

    calls = []
    real_fwd, real_bwd = mod.launch_fwd, mod.launch_bwd
    monkeypatch.setattr(mod, "launch_fwd", lambda *a, **k: calls.append("fwd") or real_fwd(*a, **k))
    monkeypatch.setattr(mod, "launch_bwd", lambda *a, **k: calls.append("bwd") or real_bwd(*a, **k))
    x, y = make_pair((1, 1, 12, 12), seed=23, device=device_for("triton"))
    x.requires_grad_()
    with torch.no_grad():
        splatloss.ssim(x, y, window_size=3, backend="triton")
    assert calls == ["fwd"]
    (1 - splatloss.ssim(x, y, window_size=3, backend="triton")).backward()
    assert calls == ["fwd", "bwd"]  # with a gradient: one pass, in the forward; none in the backward
