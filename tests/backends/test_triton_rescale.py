"""The fused D-SSIM + L1 losses on Triton keep the gradient their forward computed for the upstream
of the default mean over the batch, and the backward hands it on: untouched where the upstream is
that one, scaled in place where it is not (per image), recomputed on a second walk of the graph.
Every path must give the gradient of the upstream it actually got."""

import pytest
import torch

import splatloss
from conftest import device_for, make_pair
from splatloss.backends.triton import dssim_l1 as tri_dssim_l1
from splatloss.backends.triton import glue, rescale

pytestmark = pytest.mark.triton

T = "triton"
SHAPE = (2, 3, 14, 19)


def _mask(x):
    return torch.linspace(0, 1, x.shape[-1], device=x.device).expand(1, 1, *x.shape[-2:]).contiguous()


def _loss(x, y, masked, reduction="mean"):
    m = _mask(x) if masked else None
    return splatloss.dssim_l1(x, y, 0.2, padding="same", mask=m, reduction=reduction, backend=T, window_size=5)


def _reference_grad(x, y, masked, weights):
    """float64 gradient of sum_b weights[b] * loss_b."""
    x64 = x.detach().double().cpu().requires_grad_(True)
    m = _mask(x64) if masked else None
    per = splatloss.dssim_l1(
        x64, y.double().cpu(), 0.2, padding="same", mask=m, reduction="none", backend="reference", window_size=5
    )
    (per * weights.double()).sum().backward()
    return x64.grad


def _grad(loss_fn, x, y, masked, retain=False):
    x = x.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(loss_fn(x, y, masked), x, retain_graph=retain)
    return g


def _close(g, ref):
    err = ((g.double().cpu() - ref).abs().max() / ref.abs().max()).item()
    assert err < 3e-6, err


def test_the_forward_gradient_is_handed_on_as_the_gradient():
    """``loss.mean().backward()``: x.grad is the tensor the forward wrote, with its values."""
    x, y = make_pair(SHAPE, seed=1, device=device_for(T))
    x.requires_grad_(True)
    cfg = splatloss.SSIMConfig(padding="same", window_size=5)
    window = glue.window_taps(cfg, x.device)
    e = glue.batch_mean_upstream(x)
    assert e == pytest.approx(1 / SHAPE[0], rel=1e-7)
    assert glue.batch_mean_upstream(x.to(torch.bfloat16)) == 1.0  # converted anyway: nothing baked in
    loss, gx, _ = tri_dssim_l1._dssim_l1_call(x, y, window, "same", float(cfg.C1), float(cfg.C2), 0.2, True, False, e)
    kept, ptr = gx.clone(), gx.data_ptr()
    del gx  # (a reference held here would make autograd copy the gradient into x.grad)
    loss.mean().backward()
    assert x.grad.data_ptr() == ptr
    assert torch.equal(x.grad, kept)


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
def test_an_upstream_other_than_the_mean_is_scaled_per_image(masked):
    """Upstreams per image of 1 / B (the expected one: untouched), 3.0 and -0.25 (scaled), through
    reduction="none"; and reduction="sum" and a weighted mean. All against float64."""
    x, y = make_pair((3,) + SHAPE[1:], seed=2, device=device_for(T))
    w = torch.tensor([1 / 3, 3.0, -0.25], device=x.device)
    for fn, weights in (
        (lambda a, b, mk: (_loss(a, b, mk, "none") * w).sum(), w.cpu()),
        (lambda a, b, mk: _loss(a, b, mk, "sum"), torch.ones(3)),
        (lambda a, b, mk: 2.5 * _loss(a, b, mk), torch.full((3,), 2.5 / 3)),
        (lambda a, b, mk: _loss(a, b, mk), torch.full((3,), 1 / 3)),
    ):
        _close(_grad(fn, x, y, masked), _reference_grad(x, y, masked, weights))


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
def test_in_place_scaling_gives_the_out_of_place_bits(monkeypatch, masked):
    """The kernel's ``g * div_rn(u, e)`` per image is torch's ``g * (u / e)``, bit for bit, whether
    the image's upstream is the expected one or not; channels-last images too."""
    x, y = make_pair((3,) + SHAPE[1:], seed=4, device=device_for(T))
    w = torch.tensor([1 / 3, 0.7, 5.0], device=x.device)

    def fn(a, b, mk):
        return (_loss(a, b, mk, "none") * w).sum()

    for layout in (torch.contiguous_format, torch.channels_last):
        xl, yl = x.contiguous(memory_format=layout), y.contiguous(memory_format=layout)
        in_place = _grad(fn, xl, yl, masked)
        with monkeypatch.context() as mp:
            mp.setattr(glue, "_in_place", lambda *a: False)
            out_of_place = _grad(fn, xl, yl, masked)
        assert torch.equal(in_place, out_of_place)


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
def test_a_second_walk_of_the_graph_recomputes(masked):
    """retain_graph=True: the first backward scaled the kept gradient in place (upstream 2.5 / B),
    so the second must not scale it again."""
    x, y = make_pair(SHAPE, seed=5, device=device_for(T))
    x = x.requires_grad_(True)
    loss = 2.5 * _loss(x, y, masked)
    (first,) = torch.autograd.grad(loss, x, retain_graph=True)
    (second,) = torch.autograd.grad(loss, x)
    torch.testing.assert_close(second, first, rtol=1e-6, atol=1e-9)
    _close(first, _reference_grad(x, y, masked, torch.full((2,), 2.5 / 2)))


def test_rescale_refuses_what_it_cannot_scale():
    g = torch.zeros(2, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="float32 gradient"):
        rescale.rescale_(g, torch.ones(2), 1.0)
    with pytest.raises(ValueError, match="equal blocks"):
        rescale.rescale_(torch.zeros(7), torch.ones(2), 1.0)
