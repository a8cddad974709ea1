"""Memory layouts, batch / channel counts and run-to-run determinism on every backend."""

import pytest
import torch

import splatloss
from conftest import (
    DETERMINISTIC,
    TOL,
    assert_rel,
    backend_params,
    device_for,
    has_cuda,
    make_pair,
    side,
)
from splatloss import reference
from splatloss.config import SSIMConfig

LOWP = [torch.float16, torch.bfloat16]


def _stats_and_grads(fn, x, y, cfg, gs, gc):
    xr, yr = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
    s, c = fn(xr, yr, cfg)
    gx, gy = torch.autograd.grad((s * gs.to(s)).sum() + (c * gc.to(c)).sum(), [xr, yr])
    return s.detach(), c.detach(), gx, gy


def _layouts(x, y):
    """Non-contiguous and channels-last versions of (x, y), each holding the same values."""
    h, w = x.shape[2], x.shape[3]

    def strided(t):
        big = torch.zeros(*t.shape[:2], h + 4, 2 * w + 8, dtype=t.dtype, device=t.device)
        big[..., 2 : 2 + h, 5 : 5 + 2 * w : 2] = t
        return big[..., 2 : 2 + h, 5 : 5 + 2 * w : 2]

    forms = {
        "channels_last": lambda t: t.contiguous(memory_format=torch.channels_last),
        "transposed": lambda t: t.transpose(-1, -2).contiguous().transpose(-1, -2),
        "interleaved": lambda t: torch.stack([t, torch.zeros_like(t)], dim=-1)[..., 0],
        "strided_slice": strided,
        # a renderer's (H, W, C) output seen as (1, C, H, W)
        "hwc_view": lambda t: t[0].permute(1, 2, 0).contiguous().permute(2, 0, 1)[None],
    }
    return {name: (f(x), f(y)) for name, f in forms.items()}


@pytest.mark.parametrize("backend", backend_params(slow_triton=True) + ["reference"])
def test_layouts_give_the_contiguous_result(backend):
    """channels-last, transposed storage, interleaved / strided slices and an HWC view: the values and
    the gradient of the contiguous input (torch / cpu: atol 2e-6 / 2e-7; triton: bitwise), and the
    gradient keeps a channels-last input's layout on Triton."""
    dev = device_for(backend)
    x, y = make_pair((1, 3, side(backend, 40, 16), side(backend, 45, 17)), seed=41, device=dev)
    xc = x.clone().requires_grad_()
    expected = splatloss.ssim(xc, y, backend=backend, reduction="none")
    (expected_g,) = torch.autograd.grad(expected.mean(), xc)
    for name, (a, b) in _layouts(x, y).items():
        assert not a.is_contiguous() or name == "channels_last", name
        a = a.detach().requires_grad_()
        got = splatloss.ssim(a, b, backend=backend, reduction="none")
        (g,) = torch.autograd.grad(got.mean(), a)
        if backend == "triton":
            assert torch.equal(got, expected) and torch.equal(g, expected_g), name
        else:
            torch.testing.assert_close(got, expected.detach(), atol=2e-6, rtol=1e-5, msg=name)
            torch.testing.assert_close(g, expected_g, atol=2e-7, rtol=1e-4, msg=name)
        if name == "channels_last" and backend == "triton":
            assert g.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.slow
@pytest.mark.triton
def test_masked_layouts_give_the_contiguous_result():
    """The masked 3DGS loss on Triton with a gradient of the render: each layout of the pair (and a
    pair whose strides differ), the same loss and gradient bits as contiguous inputs. The layouts
    take different backward launches (shared column strides as a constant, 128 registers; strides
    apart, 168)."""
    dev = device_for("triton")
    x, y = make_pair((1, 3, 16, 17), seed=43, device=dev)
    m = torch.rand(1, 1, 16, 17, generator=torch.Generator().manual_seed(3)).to(dev)

    def run(a, b):
        a = a.detach().requires_grad_()
        loss = splatloss.dssim_l1(a, b, 0.2, mask=m, backend="triton")
        (g,) = torch.autograd.grad(loss, a)
        return loss.detach(), g

    want = run(x, y)
    forms = _layouts(x, y)
    forms["apart"] = (forms["channels_last"][0], y)
    for name, (a, b) in forms.items():
        got = run(a, b)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), name


@pytest.mark.parametrize("b,c", [(1, 1), (4, 1), (1, 4), (3, 6)])
def test_batch_and_channel_counts_are_independent_planes(backend, b, c):
    """Each (image, channel) plane is its own SSIM: a batch equals its planes run one at a time."""
    dev = device_for(backend)
    cfg = SSIMConfig(padding="same")
    x, y = make_pair((b, c, side(backend, 27, 16), side(backend, 31, 17)), seed=b * 10 + c, device=dev)
    bk = splatloss.backends.get(backend)
    s, cs = bk.ssim_stats(x, y, cfg)
    assert s.shape == (b, c) and cs.shape == (b, c)
    planes = [(i, j) for i in range(b) for j in range(c)]
    if backend == "triton" and not has_cuda():  # the interpreter (seconds a call): every image index
        planes = [(k % b, k % c) for k in range(max(b, c))]  # and every channel index at least once
    for i, j in planes:
        one = bk.ssim_stats(x[i : i + 1, j : j + 1], y[i : i + 1, j : j + 1], cfg)
        torch.testing.assert_close(one[0][0, 0], s[i, j], atol=1e-7, rtol=0)
        torch.testing.assert_close(one[1][0, 0], cs[i, j], atol=1e-7, rtol=0)
    x6, y6 = x.double().cpu(), y.double().cpu()
    assert_rel(s, reference.ssim_stats(x6, y6, cfg)[0], TOL[backend]["values"], "ssim mean")


@pytest.mark.parametrize("backend", backend_params(DETERMINISTIC, slow_triton=True))
def test_bitwise_deterministic(backend):
    cfg = SSIMConfig(padding="same")
    x, y = make_pair((2, 2, side(backend, 24, 16), side(backend, 31, 17)), seed=5, device=device_for(backend))
    gs, gc = torch.ones(2, 2), torch.full((2, 2), 0.5)
    fn = splatloss.backends.get(backend).ssim_stats
    first = _stats_and_grads(fn, x, y, cfg, gs, gc)
    second = _stats_and_grads(fn, x, y, cfg, gs, gc)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    ms = [splatloss.ms_ssim(x, y, backend=backend, window_size=3, weights=(0.5, 0.5)) for _ in range(2)]
    assert torch.equal(ms[0], ms[1])
