"""The C kernel's fused pass: with an input that needs a gradient, one sweep computes the value and
the gradient for a mean loss's upstream, and the backward hands it on or scales it. The value must be the forward-only
value bit for bit, the gradient the same whatever the threads, the column tiles or how many times
the graph is walked, and an upstream the unit gradient cannot serve (SSIM and cs both used) must
still get the exact gradient. The masked 3DGS loss and masked SSIM mean too: their gradients
divide by the mask's sums, read from the mask before the sweep, and must be the split backward's
for the same upstream; masked MS-SSIM's scales likewise, one node for every scale."""

import pytest
import torch

from splatloss import backends
from splatloss.backends.cpu import functions, library
from splatloss.config import SSIMConfig

CPU = backends.get("cpu")
WEIGHTS = (0.2, 0.3, 0.5)


def _pair(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=g)
    return x, (0.7 * x + 0.3 * torch.rand(shape, generator=g)).clamp(0, 1)


def _mask_for(x):
    """A soft (1, 1, H, W) mask with holes, the same for every call at a size."""
    H, W = x.shape[-2:]
    m = torch.rand((1, 1, H, W), generator=torch.Generator().manual_seed(1000 * H + W))
    return torch.where(m < 0.25, torch.zeros_like(m), m)


OPS = {
    "ssim": lambda x, y, cfg: CPU.ssim_stats(x, y, cfg)[0],
    "dssim_l1": lambda x, y, cfg: CPU.dssim_l1(x, y, cfg, 0.2),
    "dssim_l1_masked": lambda x, y, cfg: CPU.dssim_l1(x, y, cfg, 0.2, mask=_mask_for(x)),
    "ssim_masked": lambda x, y, cfg: CPU.ssim_mean(x, y, cfg, _mask_for(x)),
    "ms_ssim": lambda x, y, cfg: CPU.ms_ssim(x, y, cfg, WEIGHTS, tau=0.05),
    "ms_ssim_masked": lambda x, y, cfg: CPU.ms_ssim(x, y, cfg, WEIGHTS, tau=0.05, mask=_mask_for(x)),
}


def _value_and_grads(op, x, y, cfg, retain=False):
    x = x.clone().requires_grad_(True)
    y = y.clone().requires_grad_(True)
    v = OPS[op](x, y, cfg)
    up = torch.linspace(0.5, 1.5, v.numel()).view(v.shape)
    grads = torch.autograd.grad((v * up).sum(), (x, y), retain_graph=retain)
    if retain:
        again = torch.autograd.grad((v * up).sum(), (x, y))
        for a, b in zip(grads, again):
            assert torch.equal(a, b)  # the second walk recomputes the unit gradient: same bits
    return (v.detach(),) + grads


@pytest.mark.parametrize("padding", ["valid", "same"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_value_with_a_gradient_is_the_forward_value_bit_for_bit(op, padding):
    cfg = SSIMConfig(padding=padding)
    x, y = _pair((2, 3, 61, 75))
    with torch.no_grad():
        plain = OPS[op](x, y, cfg)
    fused = _value_and_grads(op, x, y, cfg)[0]
    assert torch.equal(plain, fused)


@pytest.mark.parametrize("op", sorted(OPS))
def test_column_tiles_and_row_strips_own_each_map_pixel_once(monkeypatch, op):
    """Wide planes are swept in column tiles, and threads split rows into strips: each tile and
    strip adds only the map pixels it owns, so value and gradient do not change."""
    cfg = SSIMConfig(padding="same")
    x, y = _pair((1, 2, 150, 137), seed=3)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        whole = _value_and_grads(op, x, y, cfg)
        monkeypatch.setattr(library, "BWD_TILE", 24)
        torch.set_num_threads(3)
        split = _value_and_grads(op, x, y, cfg)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(whole[0], split[0], rtol=2e-7, atol=0)  # lanes regroup across tiles
    for a, b in zip(whole[1:], split[1:]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("padding", ["valid", "same"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_in_column_tiles_and_strips_the_value_is_still_the_forwards(monkeypatch, op, padding):
    """Tiles and strips change how the sums are grouped; the forward alone and the fused pass
    (the L1 sums of D-SSIM + L1 taken as its gradient rows pass) must still group them alike."""
    cfg = SSIMConfig(padding=padding)
    x, y = _pair((1, 2, 150, 137), seed=7)
    monkeypatch.setattr(library, "BWD_TILE", 24)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        with torch.no_grad():
            plain = OPS[op](x, y, cfg)
        fused = _value_and_grads(op, x, y, cfg)[0]
    finally:
        torch.set_num_threads(before)
    assert torch.equal(plain, fused)


@pytest.mark.parametrize("op", sorted(OPS))
def test_threads_do_not_change_a_bit(op):
    x, y = _pair((1, 2, 150, 67), seed=1)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _value_and_grads(op, x, y, SSIMConfig())
        torch.set_num_threads(3)
        three = _value_and_grads(op, x, y, SSIMConfig())
    finally:
        torch.set_num_threads(before)
    for a, b in zip(one, three):
        assert torch.equal(a, b)


@pytest.mark.parametrize("op", sorted(OPS))
def test_a_second_backward_through_the_graph_gives_the_same_gradient(op):
    x, y = _pair((1, 3, 70, 64), seed=2)
    _value_and_grads(op, x, y, SSIMConfig(padding="same"), retain=True)


def test_ssim_and_cs_both_used_get_the_exact_gradient():
    """The unit gradient is that of the SSIM mean; an upstream on the cs mean too takes the kernel's
    general backward (compared with the float64 torch ops)."""
    x, y = _pair((1, 2, 48, 52), seed=4)
    cfg = SSIMConfig()
    xs = x.clone().requires_grad_(True)
    s, c = CPU.ssim_stats(xs, y, cfg)
    (g,) = torch.autograd.grad((s * 0.7 + c * 1.3).sum(), xs)
    xd = x.double().requires_grad_(True)
    sd, cd = backends.get("torch").ssim_stats(xd, y.double(), cfg)
    (gd,) = torch.autograd.grad((sd * 0.7 + cd * 1.3).sum(), xd)
    assert float((g.double() - gd).norm() / gd.norm()) < 1e-6  # measured 6e-8


@pytest.mark.parametrize("padding", ["valid", "same"])
@pytest.mark.parametrize("mask_shape", [(1, 1), (3, 1), (3, 3)])
def test_the_masked_fused_gradient_is_the_split_backwards_for_the_mean_loss(padding, mask_shape):
    """The fused masked pass against the forward + recomputing backward (the op traced code runs),
    both images needing a gradient, masks shared or per image and channel, an empty channel
    included: the same value and, for the upstream of ``loss.mean()`` (the one the fused pass
    computes its gradient for), the same gradient bit for bit."""
    cfg = SSIMConfig(padding=padding)
    x, y = _pair((3, 3, 47, 58), seed=5)
    m = torch.rand(mask_shape + (47, 58), generator=torch.Generator().manual_seed(6))
    m = torch.where(m < 0.3, torch.zeros_like(m), m)
    if mask_shape == (3, 3):
        m[1, 2] = 0  # an empty channel: no gradient from its SSIM
    results = []
    for split in (False, True):
        xs, ys = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
        xp, yp, mp, pad = functions.masked_padded(xs, ys, m, cfg)
        args = (xp, yp, mp, cfg.window_1d(xp.dtype, "cpu"), cfg.C1, cfg.C2, pad, 0.2)
        fn = functions._MDSSIML1Fn if split else functions._MDSSIML1FusedFn
        v = fn.apply(*args)[0]
        results.append((v.detach(),) + torch.autograd.grad(v.mean(), (xs, ys)))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_masked_ssim_and_cs_both_used_get_the_exact_gradient():
    """The masked fused pass's unit gradient is the SSIM mean's; an upstream on the cs mean too
    takes the recomputing backward (compared with the float64 torch ops of the shared fallback)."""
    x, y = _pair((1, 2, 48, 52), seed=4)
    m = _mask_for(x)
    cfg = SSIMConfig(padding="same")
    xs = x.clone().requires_grad_(True)
    s, c = functions.masked_ssim_stats(xs, y, m, cfg, fused=True)
    (g,) = torch.autograd.grad((s * 0.7 + c * 1.3).sum(), xs)
    xd = x.double().requires_grad_(True)
    sd, cd = backends.get("torch").masked_ssim_stats(xd, y.double(), m.double(), cfg)
    (gd,) = torch.autograd.grad((sd * 0.7 + cd * 1.3).sum(), xd)
    assert float((g.double() - gd).norm() / gd.norm()) < 1e-6
    # and the SSIM mean alone through the unit gradient, scaled per plane
    xs = x.clone().requires_grad_(True)
    s, _ = functions.masked_ssim_stats(xs, y, m, cfg, fused=True)
    up = torch.tensor([[0.4, 1.7]])
    (g,) = torch.autograd.grad((s * up).sum(), xs)
    xd = x.double().requires_grad_(True)
    sd, _ = backends.get("torch").masked_ssim_stats(xd, y.double(), m.double(), cfg)
    (gd,) = torch.autograd.grad((sd * up.double()).sum(), xd)
    assert float((g.double() - gd).norm() / gd.norm()) < 1e-6


@pytest.mark.parametrize("padding", ["valid", "same"])
@pytest.mark.parametrize("need", ["x", "y", "both"])
def test_the_masked_ms_ssim_fused_gradient_is_the_float64_torch_ops(padding, need):
    """Masked MS-SSIM's scales each computed with their unit gradient in one sweep (one node for
    every scale) against the float64 torch ops of the shared masked pyramid: masks per image, an
    empty channel, odd sides at every scale; a create_graph backward (the torch-ops walk) gives the
    same first-order gradient and a second order."""
    cfg = SSIMConfig(padding=padding)
    x, y = _pair((2, 2, 45, 51), seed=8)
    m = torch.rand((2, 1, 45, 51), generator=torch.Generator().manual_seed(9))
    m = torch.where(m < 0.3, torch.zeros_like(m), m)
    m = torch.cat([m, torch.zeros_like(m)], dim=1)  # (2, 2): image 0 channel 1 and image 1 channel 1 empty
    m[1, 1] = m[1, 0]
    up = torch.tensor([0.6, 1.4])

    def grads(backend, a, b, create_graph=False):
        a, b = a.clone().requires_grad_(need in ("x", "both")), b.clone().requires_grad_(need in ("y", "both"))
        v = backends.get(backend).ms_ssim(a, b, cfg, WEIGHTS, tau=0.05, mask=m.to(a.dtype))
        wrt = [t for t in (a, b) if t.requires_grad]
        return v, torch.autograd.grad((v * up.to(v.dtype)).sum(), wrt, create_graph=create_graph), wrt

    v, g, _ = grads("cpu", x, y)
    vd, gd, _ = grads("torch", x.double(), y.double())
    assert float((v.double() - vd).abs().max()) < 2e-6
    for a, b in zip(g, gd):
        assert float((a.double() - b).norm() / b.norm()) < 1e-5  # measured <= 1.0e-6
    v2, g2, wrt = grads("cpu", x, y, create_graph=True)
    assert torch.equal(v, v2)
    for a, b in zip(g2, gd):  # float32 torch ops: another rounding, the same bar
        assert float((a.double() - b).norm() / b.norm()) < 1e-5
    (h,) = torch.autograd.grad(g2[0].square().sum(), wrt[0])
    assert torch.isfinite(h).all() and h.abs().max() > 0


@pytest.mark.parametrize("op", ["ssim", "dssim_l1", "ssim_masked", "dssim_l1_masked"])
def test_an_upstream_near_the_float32_limit_is_not_overflowed(op):
    """The fused gradient is computed for a mean loss's upstream (-1 / (B C) or 1 / B); another
    upstream u scales it by u / that, which overflows for u near float32's largest where the
    gradient itself does not: it is then scaled by 1 / that and by u (against float64)."""
    x, y = _pair((1, 3, 40, 44), seed=8)
    cfg = SSIMConfig(padding="same")
    xs = x.clone().requires_grad_(True)
    v = OPS[op](xs, y, cfg)
    up = torch.full_like(v, 3e38)
    (g,) = torch.autograd.grad(v, xs, grad_outputs=up)
    xd = x.double().requires_grad_(True)
    vd = OPS[op](xd, y.double(), cfg)
    (gd,) = torch.autograd.grad(vd, xd, grad_outputs=up.double())
    assert torch.isfinite(g).all()
    assert float((g.double() - gd).norm() / gd.norm()) < 1e-5


@pytest.mark.parametrize("padding", ["valid", "same"])
@pytest.mark.parametrize("shape", [(3, 3, 47, 58), (1, 1, 33, 90)])
def test_the_masked_fused_sums_are_the_forwards_in_float64(padding, shape):
    """The float64 sums themselves, not only the float32 value they round to (which hides a last-bit
    difference in most draws): the fused pass runs the forward's own code for each map row and
    sums the L1 term in the forward's lanes, so its sums of c ssim, c cs, c, m |x - y| and m are
    the forward's bit for bit, for masks shared or per plane (and m's from the mask alone too)."""
    B, C, H, W = shape
    x, y = _pair(shape, seed=9)
    cfg = SSIMConfig(padding=padding)
    for mask_shape in ((1, 1), (B, C)):
        m = torch.rand(mask_shape + (H, W), generator=torch.Generator().manual_seed(10))
        xp, yp, mp, pad = functions.masked_padded(x, y, torch.where(m < 0.3, torch.zeros_like(m), m), cfg)
        w = cfg.window_1d(xp.dtype, "cpu")
        lib = library.require(xp.dtype, w.numel())
        plain = library.masked_forward(lib, xp, yp, mp, w, cfg.C1, cfg.C2, pad, l1=True)
        g = torch.full((B, C), -0.01)
        fused = library.masked_backward(
            lib, xp, yp, mp, w, cfg.C1, cfg.C2, g, g * 0, False, True, pad, g, with_forward=True, l1=True
        )[2:]
        for a, b in zip(plain, fused):  # c ssim, c cs, c, m |x - y|, m
            assert torch.equal(a, b)
        weights = library.masked_weights(lib, mp, B, C, w.numel(), pad)
        assert torch.equal(weights[0], plain[2]) and torch.equal(weights[1], plain[4])


@pytest.mark.parametrize("shape", [(1, 3, 24, 20), (3, 1, 24, 20), (3, 3, 24, 20)])
def test_the_mean_losses_hand_the_fused_gradient_on_untouched(monkeypatch, shape):
    """``1 - ssim(x, y)``, ``dssim`` and 3DGS's loss (masked or not), reduced by the mean: the
    upstream that reaches each fused op is the one its gradient was computed for, so the backward
    multiplies by nothing (the factor it would scale by is 1 everywhere)."""
    import splatloss

    factors = []
    scaled = functions._scaled

    def spy(unit, k):
        factors.append(bool((k == 1).all()))
        return scaled(unit, k)

    monkeypatch.setattr(functions, "_scaled", spy)
    x, y = _pair(shape, seed=11)
    m = _mask_for(x)
    losses = [
        lambda a: 1 - splatloss.ssim(a, y, backend="cpu"),
        lambda a: splatloss.dssim(a, y, backend="cpu"),
        lambda a: splatloss.dssim_l1(a, y, backend="cpu"),
        lambda a: 1 - splatloss.ssim(a, y, mask=m, backend="cpu"),
        lambda a: splatloss.dssim_l1(a, y, mask=m, backend="cpu"),
    ]
    for loss in losses:
        factors.clear()
        loss(x.clone().requires_grad_(True)).backward()
        assert factors == [True]
