"""The Triton losses keep the gradient their forward computed for the upstream they expect -- the
default mean over the batch for D-SSIM + L1, and for the SSIM mean that of the D-SSIM loss
``1 - ssim(x, y)`` -- and the backward hands it on: untouched where the upstream is that one,
scaled in place where it is not (per image, or per image and channel), recomputed on a second
walk of the graph. Every path must give the gradient of the upstream it actually got."""

import pytest
import torch

import splatloss
from conftest import device_for, make_pair
from splatloss.backends.triton import dssim_l1 as tri_dssim_l1
from splatloss.backends.triton import glue, rescale
from splatloss.backends.triton import ssim as tri_ssim

pytestmark = pytest.mark.triton

T = "triton"
SHAPE = (2, 3, 14, 19)
# the masked ones in the slow tier (the interpreter: 2-6 s each)
LOSSES = [
    pytest.param(n, marks=pytest.mark.slow) if "masked" in n else n
    for n in ("dssim_l1", "dssim_l1 masked", "dssim", "dssim masked")
]


def _mask(x):
    return torch.linspace(0, 1, x.shape[-1], device=x.device).expand(1, 1, *x.shape[-2:]).contiguous()


def _loss(name, x, y, reduction="mean", backend=T):
    m = _mask(x) if name.endswith("masked") else None
    kw = dict(padding="same", mask=m, reduction=reduction, backend=backend, window_size=5)
    if name.startswith("dssim_l1"):
        return splatloss.dssim_l1(x, y, 0.2, **kw)
    return splatloss.dssim(x, y, **kw)


def _reference_grad(name, x, y, weights):
    """float64 gradient of sum_b weights[b] * loss_b."""
    x64 = x.detach().double().cpu().requires_grad_(True)
    per = _loss(name, x64, y.double().cpu(), "none", "reference")
    (per * weights.double()).sum().backward()
    return x64.grad


def _grad(fn, x, y, retain=False):
    x = x.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(fn(x, y), x, retain_graph=retain)
    return g


def _close(g, ref):
    err = ((g.double().cpu() - ref).abs().max() / ref.abs().max()).item()
    assert err < 3e-6, err


def test_the_expected_upstreams():
    x, _ = make_pair(SHAPE, device=device_for(T))
    assert glue.batch_mean_upstream(x) == pytest.approx(1 / 2, rel=1e-7)
    assert glue.dssim_mean_upstream(x) == pytest.approx(-1 / 6, rel=1e-7)
    for f in (glue.batch_mean_upstream, glue.dssim_mean_upstream):  # converted anyway: nothing baked in
        assert f(x.to(torch.bfloat16)) == 1.0


@pytest.mark.parametrize("op", ["dssim_l1", "ssim_term"])
def test_the_forward_gradient_is_handed_on_as_the_gradient(op):
    """``loss.backward()`` of the mean over the batch (D-SSIM + L1) and of ``1 - ssim`` (the SSIM
    term): x.grad is the tensor the forward wrote, with its values."""
    x, y = make_pair(SHAPE, seed=1, device=device_for(T))
    x.requires_grad_(True)
    cfg = splatloss.SSIMConfig(padding="same", window_size=5)
    args = (glue.window_taps(cfg, x.device), "same", float(cfg.C1), float(cfg.C2))
    if op == "dssim_l1":
        out, gx, _ = tri_dssim_l1._dssim_l1_call(x, y, *args, 0.2, True, False, glue.batch_mean_upstream(x))
        loss = out.mean()
    else:
        out, gx, _ = tri_ssim._term_call(x, y, *args, False, True, False, glue.dssim_mean_upstream(x))
        loss = 1 - out.mean(dim=1).mean()
    kept, ptr = gx.clone(), gx.data_ptr()
    del gx  # (a reference held here would make autograd copy the gradient into x.grad)
    loss.backward()
    assert x.grad.data_ptr() == ptr
    assert torch.equal(x.grad, kept)


@pytest.mark.parametrize("name", LOSSES)
def test_an_upstream_other_than_the_expected_one_is_scaled(name):
    """Upstreams per image of 1 / B (D-SSIM + L1's expected one), 3.0 and -0.25, through
    reduction="none"; reduction="sum", a weighted mean and the plain mean. All against float64."""
    x, y = make_pair((3,) + SHAPE[1:], seed=2, device=device_for(T))
    w = torch.tensor([1 / 3, 3.0, -0.25], device=x.device)
    for fn, weights in (
        (lambda a, b: (_loss(name, a, b, "none") * w).sum(), w.cpu()),
        (lambda a, b: _loss(name, a, b, "sum"), torch.ones(3)),
        (lambda a, b: 2.5 * _loss(name, a, b), torch.full((3,), 2.5 / 3)),
        (lambda a, b: _loss(name, a, b), torch.full((3,), 1 / 3)),
    ):
        _close(_grad(fn, x, y), _reference_grad(name, x, y, weights))


@pytest.mark.parametrize("name", LOSSES)
def test_in_place_scaling_gives_the_out_of_place_bits(monkeypatch, name):
    """The kernel's ``g * div_rn(u, e)`` per block is torch's ``g * (u / e)``, bit for bit, whether
    the upstream is the expected one or not; channels-last images too."""
    x, y = make_pair((3,) + SHAPE[1:], seed=4, device=device_for(T))
    w = torch.tensor([1 / 3, 0.7, 5.0], device=x.device)

    def fn(a, b):
        return (_loss(name, a, b, "none") * w).sum()

    for layout in (torch.contiguous_format, torch.channels_last):
        xl, yl = x.contiguous(memory_format=layout), y.contiguous(memory_format=layout)
        in_place = _grad(fn, xl, yl)
        with monkeypatch.context() as mp:
            mp.setattr(glue, "_in_place", lambda *a: False)
            out_of_place = _grad(fn, xl, yl)
        assert torch.equal(in_place, out_of_place)


def test_per_channel_upstreams_reach_their_channels(monkeypatch):
    """The SSIM mean's upstream is one value per image and channel: in NCHW each plane is one block,
    channels-last interleaves them (channel ``i % C`` at element ``i``). Distinct upstreams per
    channel, the expected one among them: in place equals out of place, in either layout."""
    x, y = make_pair((2, 3, 13, 16), seed=8, device=device_for(T))
    cfg = splatloss.SSIMConfig(padding="same", window_size=5)
    e = glue.dssim_mean_upstream(x)
    w = torch.tensor([[e, 2.0, -0.5], [0.25, e, 3.0]], device=x.device)
    grads = []
    for layout in (torch.contiguous_format, torch.channels_last):
        xl, yl = x.contiguous(memory_format=layout), y.contiguous(memory_format=layout)
        for in_place in (True, False):
            with monkeypatch.context() as mp:
                if not in_place:
                    mp.setattr(glue, "_in_place", lambda *a: False)
                grads.append(_grad(lambda a, b: (tri_ssim.ssim_term(a, b, cfg) * w).sum(), xl, yl))
    assert all(torch.equal(g, grads[0]) for g in grads[1:])


@pytest.mark.parametrize("name", LOSSES)
def test_a_second_walk_of_the_graph_recomputes(name):
    """retain_graph=True: the first backward scaled the kept gradient in place (upstream 2.5 times
    the expected one), so the second must not scale it again: it recomputes (another kernel pass,
    so not the same bits), and both are the float64 gradient."""
    x, y = make_pair(SHAPE, seed=5, device=device_for(T))
    x = x.requires_grad_(True)
    loss = 2.5 * _loss(name, x, y)
    (first,) = torch.autograd.grad(loss, x, retain_graph=True)
    (second,) = torch.autograd.grad(loss, x)
    truth = _reference_grad(name, x, y, torch.full((2,), 2.5 / 2))
    _close(first, truth)
    _close(second, truth)


@pytest.mark.parametrize("name", LOSSES)
def test_an_upstream_near_the_float32_limit_is_not_overflowed(name):
    """The expected upstreams are below 1 in magnitude (1 / B, -1 / (B C)), so ``u / e`` overflows
    for an upstream near float32's largest where the gradient does not: the kernel then scales by
    ``(g / e) * u``. Finite, and the float64 gradient; the out-of-place pass likewise."""
    x, y = make_pair((3,) + SHAPE[1:], seed=6, device=device_for(T))
    w = torch.tensor([3e38, -2e38, 1 / 3], device=x.device)
    truth = _reference_grad(name, x, y, w.cpu())
    for layout in (torch.contiguous_format, torch.channels_last):
        xl, yl = x.contiguous(memory_format=layout), y.contiguous(memory_format=layout)
        g = _grad(lambda a, b: (_loss(name, a, b, "none") * w).sum(), xl, yl)
        assert torch.isfinite(g).all()
        _close(g, truth)


def test_scaled_matches_the_kernel_where_the_quotient_overflows(monkeypatch):
    x, y = make_pair((3,) + SHAPE[1:], seed=7, device=device_for(T))
    w = torch.tensor([3e38, 0.5, -3e38], device=x.device)

    def fn(a, b):
        return (_loss("dssim", a, b, "none") * w).sum()

    in_place = _grad(fn, x, y)
    monkeypatch.setattr(glue, "_in_place", lambda *a: False)
    assert torch.equal(in_place, _grad(fn, x, y))


def test_rescale_refuses_what_it_cannot_scale():
    g = torch.zeros(2, 3, 4, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"float32 \[B, C, H, W\] gradient"):
        rescale.rescale_(g, torch.ones(2), 1.0)
    with pytest.raises(ValueError, match="one upstream per image or per image and channel"):
        rescale.rescale_(torch.zeros(2, 3, 4, 5), torch.ones(5), 1.0)
    with pytest.raises(ValueError, match="strides"):  # a plane-strided view: not dense per image
        rescale.rescale_(torch.zeros(2, 3, 4, 10)[..., ::2], torch.ones(2), 1.0)
