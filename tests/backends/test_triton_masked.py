"""Masked SSIM in the Triton kernels: the mask is read inside the kernels (no torch composition),
values and the gradients to both images against the float64 oracle of the masked semantics
(tests/_mask_truth.py) and the float64 reference backend, in the interpreter on CPU or compiled on a
GPU.

Tolerances: values 2e-5 absolute and gradients 1e-4 normwise, the bars of tests/backends/
test_masks.py; measured here (fp32, 14x17 and 13x16, soft masks): values <= 7e-8, gradients <= 4e-7.
"""

import pytest
import torch
from _mask_truth import masked_lp, masked_ssim, masked_ssim_stats, soft_mask

import splatloss
from conftest import device_for, make_pair, rel
from splatloss.backends import get
from splatloss.config import SSIMConfig

pytestmark = pytest.mark.triton

VALUE_TOL, GRAD_TOL = 2e-5, 1e-4
T = "triton"


@pytest.fixture
def launches(monkeypatch):
    """The masked kernels' launches, recorded (each launcher still runs)."""
    from splatloss.backends.triton import masked_ssim as mod

    seen = []
    for name in ("launch_masked_fwd", "launch_masked_bwd"):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _real=real, _name=name, **k: seen.append(_name) or _real(*a, **k))
    return seen


def _grads(fn, x, y):
    xr, yr = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
    v = fn(xr, yr)
    gx, gy = torch.autograd.grad(v.sum(), (xr, yr))
    return v.detach(), gx, gy


@pytest.mark.parametrize(
    "padding,window_size",
    [
        pytest.param("same", 5, marks=pytest.mark.slow),
        pytest.param("valid", 7, marks=pytest.mark.slow),
        pytest.param("reflect", 5, marks=pytest.mark.slow),
    ],
)
def test_masked_ssim_loss_equals_the_float64_oracle(launches, padding, window_size):
    dev = device_for(T)
    x, y = make_pair((2, 2, 14, 17), seed=5, device=dev)
    m = soft_mask(14, 17, seed=1)
    v, gx, gy = _grads(
        lambda a, b: splatloss.ssim(
            a, b, mask=m.to(dev), padding=padding, window_size=window_size, reduction="none", backend=T
        ),
        x,
        y,
    )
    assert launches == ["launch_masked_bwd"]  # the loss: one pass, its gradient computed in the forward
    tv, tgx, tgy = _grads(
        lambda a, b: masked_ssim(a, b, m.double(), padding=padding, window_size=window_size),
        x.cpu().double(),
        y.cpu().double(),
    )
    assert float((v.cpu().double() - tv).abs().max()) <= VALUE_TOL
    assert rel(gx.cpu(), tgx) <= GRAD_TOL and rel(gy.cpu(), tgy) <= GRAD_TOL


@pytest.mark.slow
@pytest.mark.parametrize("padding", ["same", "reflect"])
def test_masked_stats_both_means_and_gradients(launches, padding):
    # ssim and cs means per (image, channel), an upstream on each, a mask per image and channel
    dev = device_for(T)
    cfg = SSIMConfig(window_size=5, padding=padding)
    x, y = make_pair((1, 2, 13, 16), seed=7, device=dev)
    m = torch.stack([soft_mask(13, 16, seed=2), soft_mask(13, 16, seed=3)])[None]  # (1, 2, H, W)
    up_s, up_c = torch.tensor([[0.7, -1.3]]), torch.tensor([[2.0, 0.4]])

    def run(backend, a, b, mask):
        s, c = get(backend).masked_ssim_stats(a, b, mask, cfg)
        return s, c, (up_s.to(s) * s + up_c.to(c) * c).sum()

    xr, yr = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
    s, c, v = run(T, xr, yr, m.to(dev))
    gx, gy = torch.autograd.grad(v, (xr, yr))
    assert launches == ["launch_masked_fwd", "launch_masked_bwd"]
    x6, y6 = x.cpu().double().requires_grad_(True), y.cpu().double().requires_grad_(True)
    s6, c6, v6 = run("reference", x6, y6, m.double())
    tgx, tgy = torch.autograd.grad(v6, (x6, y6))
    ts, tc = masked_ssim_stats(x.cpu().double(), y.cpu().double(), m.double(), window_size=5, padding=padding)
    assert torch.allclose(s6, ts, atol=1e-12) and torch.allclose(c6, tc, atol=1e-12)  # the reference is the oracle
    assert (s.cpu().double() - ts).abs().max() <= VALUE_TOL and (c.cpu().double() - tc).abs().max() <= VALUE_TOL
    assert rel(gx.cpu(), tgx) <= GRAD_TOL and rel(gy.cpu(), tgy) <= GRAD_TOL


@pytest.mark.slow
def test_all_ones_mask_is_the_unmasked_value(launches):
    dev = device_for(T)
    x, y = make_pair((1, 3, 12, 15), seed=9, device=dev)
    ones = torch.ones(12, 15, dtype=torch.bool, device=dev)
    a = _grads(lambda p, q: splatloss.ssim(p, q, mask=ones, window_size=5, backend=T), x, y)
    b = _grads(lambda p, q: splatloss.ssim(p, q, window_size=5, backend=T), x, y)
    # a mask of one weight is no mask (splatloss.checks.check_mask): the unmasked kernels run, so the
    # value and both gradients are the unmasked ones bit for bit
    assert launches == []
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])


@pytest.mark.slow
def test_empty_channel_counts_as_one_and_gets_no_gradient(launches):
    dev = device_for(T)
    cfg = SSIMConfig(window_size=5, padding="same")
    x, y = make_pair((1, 2, 12, 12), seed=11, device=dev)
    m = torch.ones(1, 2, 12, 12, device=dev)
    m[:, 1] = 0  # channel 1 empty
    xr = x.clone().requires_grad_(True)
    s, c = get(T).masked_ssim_stats(xr, y, m, cfg)
    (g,) = torch.autograd.grad(s.sum() + c.sum(), xr)
    assert s[0, 1].item() == 1.0 and c[0, 1].item() == 1.0
    assert bool((g[:, 1] == 0).all()) and float(g[:, 0].abs().max()) > 0


@pytest.mark.slow
def test_dssim_l1_and_ms_ssim_under_a_mask_run_the_masked_kernels(launches):
    dev = device_for(T)
    x, y = make_pair((1, 2, 24, 26), seed=13, device=dev)
    m = soft_mask(24, 26, seed=4)
    v, gx, gy = _grads(lambda a, b: splatloss.dssim_l1(a, b, 0.2, mask=m.to(dev), window_size=3, backend=T), x, y)
    tv, tgx, tgy = _grads(
        lambda a, b: splatloss.dssim_l1(a, b, 0.2, mask=m.double(), window_size=3, backend="reference"),
        x.cpu().double(),
        y.cpu().double(),
    )
    assert launches == ["launch_masked_bwd"]
    assert abs(v.item() - tv.item()) <= VALUE_TOL
    assert rel(gx.cpu(), tgx) <= GRAD_TOL and rel(gy.cpu(), tgy) <= GRAD_TOL
    launches.clear()
    w = (0.5, 0.5)
    v, gx, gy = _grads(lambda a, b: splatloss.ms_ssim(a, b, mask=m.to(dev), weights=w, window_size=3, backend=T), x, y)
    tv, tgx, tgy = _grads(
        lambda a, b: splatloss.ms_ssim(a, b, mask=m.double(), weights=w, window_size=3, backend="reference"),
        x.cpu().double(),
        y.cpu().double(),
    )
    assert launches.count("launch_masked_fwd") == 2  # one per scale
    assert abs(v.item() - tv.item()) <= VALUE_TOL
    assert rel(gx.cpu(), tgx) <= GRAD_TOL and rel(gy.cpu(), tgy) <= GRAD_TOL


def _oracle_dssim_l1(x, y, m, lam, padding, window_size):
    """Per image ``(1 - lam) * sum m |x - y| / sum m + lam * (1 - masked SSIM)``, float64."""
    return (1 - lam) * masked_lp(x, y, m, p=1) + lam * (
        1 - masked_ssim(x, y, m, padding=padding, window_size=window_size)
    )


@pytest.mark.parametrize(
    "padding,mask_shape,grads",
    [
        ("same", (2, 1), "both"),
        pytest.param("valid", (1, 1), "both", marks=pytest.mark.slow),
        pytest.param("reflect", (2, 2), "both", marks=pytest.mark.slow),  # composed: one launch per gradient
        pytest.param("same", (1, 2), "y", marks=pytest.mark.slow),
        pytest.param("valid", (2, 1), "none", marks=pytest.mark.slow),
        ("same", (2, 2), "none"),  # the forward kernel sums the masked |x - y| at the map's centres
    ],
)
def test_fused_masked_dssim_l1_equals_the_float64_oracle(launches, padding, mask_shape, grads):
    # one pass of the masked backward kernel: the masked L1 and its gradient w m sign(x - y) inside it
    # ("same", "valid"; "reflect": the composition); per-image upstream weights, masks per image /
    # channel, both images' gradients, one or none (the forward kernel alone: under "same" with the
    # masked L1 in it, under "valid" beside it in torch ops)
    dev = device_for(T)
    lam, K = 0.3, 5
    x, y = make_pair((2, 2, 13, 16), seed=21, device=dev)
    m = torch.stack([soft_mask(13, 16, seed=s) for s in range(mask_shape[0] * mask_shape[1])])
    m = m.view(*mask_shape, 13, 16)
    m[-1, -1, :4] = 0  # an empty band: sum m and the centre weights differ from the plane's
    up = torch.tensor([0.7, -1.9], dtype=torch.float64)

    def run(backend, a, b, mask):
        a, b = a.clone().requires_grad_(grads in ("x", "both")), b.clone().requires_grad_(grads in ("y", "both"))
        with torch.set_grad_enabled(grads != "none"):
            v = splatloss.dssim_l1(
                a, b, lam, mask=mask, padding=padding, window_size=K, reduction="none", backend=backend
            )
        if grads == "none":
            return v.detach(), None
        wrt = [t for t in (a, b) if t.requires_grad]
        return v.detach(), torch.autograd.grad((v * up.to(v)).sum(), wrt)

    v, g = run(T, x, y, m.to(dev))
    assert launches == (["launch_masked_fwd"] if grads == "none" else ["launch_masked_bwd"])
    x6, y6 = x.cpu().double(), y.cpu().double()
    tv = _oracle_dssim_l1(x6, y6, m.double(), lam, padding, K)
    assert float((v.cpu().double() - tv).abs().max()) <= VALUE_TOL
    if g is not None:
        x6.requires_grad_(grads in ("x", "both"))
        y6.requires_grad_(grads in ("y", "both"))
        wrt = [t for t in (x6, y6) if t.requires_grad]
        tg = torch.autograd.grad((_oracle_dssim_l1(x6, y6, m.double(), lam, padding, K) * up).sum(), wrt)
        assert all(rel(a.cpu(), b) <= GRAD_TOL for a, b in zip(g, tg))


@pytest.mark.slow
def test_fused_masked_dssim_l1_empty_mask_and_bfloat16(launches):
    # an image whose mask is empty: L1 0, SSIM 1, loss 0 and no gradient; bfloat16 inputs as float32 ones
    dev = device_for(T)
    x, y = make_pair((2, 3, 12, 14), seed=23, device=dev)
    m = torch.ones(2, 1, 12, 14, device=dev)
    m[1] = 0
    xr = x.clone().requires_grad_(True)
    v = splatloss.dssim_l1(xr, y, 0.2, mask=m, padding="same", window_size=5, reduction="none", backend=T)
    (gx,) = torch.autograd.grad(v.sum(), xr)
    assert v[1].item() == 0.0 and bool((gx[1] == 0).all()) and v[0].item() > 0
    xb, yb = x.bfloat16().requires_grad_(True), y.bfloat16()
    vb = splatloss.dssim_l1(xb, yb, 0.2, mask=m, padding="same", window_size=5, reduction="none", backend=T)
    (gb,) = torch.autograd.grad(vb.sum(), xb)
    assert gb.dtype == torch.bfloat16
    x32 = xb.detach().float().requires_grad_(True)
    v32 = splatloss.dssim_l1(x32, yb.float(), 0.2, mask=m, padding="same", window_size=5, reduction="none", backend=T)
    (g32,) = torch.autograd.grad(v32.sum(), x32)
    assert torch.equal(vb, v32) and torch.equal(gb, g32.bfloat16())


def test_reflect_windows_over_nine_taps_take_the_shared_fallback(launches):
    # the masked backward spills registers at 11 taps under "reflect": the torch composition instead
    dev = device_for(T)
    x, y = make_pair((1, 2, 16, 18), seed=3, device=dev)
    m = soft_mask(16, 18, seed=6)
    v = splatloss.dssim_l1(x, y, 0.2, mask=m.to(dev), padding="reflect", window_size=11, backend=T)
    assert launches == []
    tv = _oracle_dssim_l1(x.cpu().double(), y.cpu().double(), m.double(), 0.2, "reflect", 11)
    assert abs(v.item() - tv.item()) <= VALUE_TOL
