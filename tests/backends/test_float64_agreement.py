"""In float64 the compiled CPU kernel and the torch-ops backend compute the same numbers to round-off
(rtol 1e-12): both SSIM outputs under random upstreams, runtime windows and constants, MS-SSIM and the
fused L1 + D-SSIM, every padding, both images' gradients."""

import pytest
import torch

import splatloss
from conftest import make_pair
from splatloss.config import SSIMConfig

TIGHT = dict(rtol=1e-12, atol=1e-13)


def _stats_and_grads(name, x, y, cfg, gs, gc):
    x, y = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
    s, c = splatloss.backends.get(name).ssim_stats(x, y, cfg)
    gx, gy = torch.autograd.grad((s * gs + c * gc).sum(), (x, y))
    return s.detach(), c.detach(), gx, gy


@pytest.mark.parametrize("padding", ["valid", "same", "reflect"])
def test_stats_under_both_upstreams(padding):
    cfg = SSIMConfig(padding=padding)
    x, y = make_pair((2, 3, 29, 41), torch.float64, seed=1)
    g = torch.Generator().manual_seed(2)
    gs, gc = torch.randn(2, 3, generator=g, dtype=torch.float64), torch.randn(2, 3, generator=g, dtype=torch.float64)
    for a, b in zip(_stats_and_grads("cpu", x, y, cfg, gs, gc), _stats_and_grads("torch", x, y, cfg, gs, gc)):
        torch.testing.assert_close(a, b, **TIGHT)


@pytest.mark.parametrize(
    "cfg",
    [SSIMConfig(window_size=7, sigma=1.0), SSIMConfig(window="uniform", window_size=5),
     SSIMConfig(c1=0.02, c2=0.05, window_size=3)],
    ids=["gauss7", "uniform5", "c1c2-3"],
)  # fmt: skip
def test_window_and_constants_are_runtime_arguments(cfg):
    x, y = make_pair((1, 1, 23, 19), torch.float64, seed=3)
    gs, gc = torch.ones(1, 1, dtype=torch.float64), torch.full((1, 1), 0.5, dtype=torch.float64)
    for a, b in zip(_stats_and_grads("cpu", x, y, cfg, gs, gc), _stats_and_grads("torch", x, y, cfg, gs, gc)):
        torch.testing.assert_close(a, b, **TIGHT)


@pytest.mark.parametrize("padding", ["valid", "same", "reflect"])
def test_ms_ssim(padding):
    x, y = make_pair((2, 2, 45, 51), torch.float64, seed=6)
    kw = dict(window_size=3, sigma=0.8, weights=(0.2, 0.3, 0.5), tau=0.01, padding=padding, reduction="none")

    def run(name):
        a, b = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
        v = splatloss.ms_ssim(a, b, backend=name, **kw)
        return (v, *torch.autograd.grad(v.sum(), (a, b)))

    for a, b in zip(run("cpu"), run("torch")):
        torch.testing.assert_close(a, b, **TIGHT)


@pytest.mark.parametrize("padding", ["valid", "same", "reflect"])
def test_fused_dssim_l1(padding):
    x, y = make_pair((2, 3, 26, 31), torch.float64, seed=7)
    y[0, 0, 3, 4] = x[0, 0, 3, 4]  # |x - y|' at equality is 0, as torch's abs backward

    def run(name):
        a, b = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
        v = splatloss.dssim_l1(a, b, 0.3, padding=padding, reduction="none", backend=name)
        return (v, *torch.autograd.grad((v * torch.tensor([1.0, -2.0], dtype=v.dtype)).sum(), (a, b)))

    for a, b in zip(run("cpu"), run("torch")):
        torch.testing.assert_close(a, b, **TIGHT)
