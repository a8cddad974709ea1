"""The C kernel's fused masked SSIM and masked L1 + D-SSIM ("cpu" backend) against the float64 oracle of
the masked semantics (tests/_mask_truth.py) and against the shared torch-ops composition: every mask
shape the API takes, bool masks, empty channels, thread counts, the column-tiled backward, double
backward, gradcheck and torch.compile."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _mask_truth import masked_lp, masked_ssim, masked_ssim_stats, soft_mask
from _truth import distort, photo, to_torch

import splatloss
from conftest import photo_pair, rel
from splatloss import SSIMConfig
from splatloss.backends import cpu, get

pytestmark = pytest.mark.skipif(not cpu.available(), reason="no C compiler here")

# Bars: values 2e-5 absolute, gradients 1e-4 normwise (max-norm relative) for fp32.
# Measured against the float64 oracle (fp32 inputs, astronaut crops, soft masks, every padding): values
# <= 3.3e-8, gradients <= 3.9e-6; float64 inputs: values ~1e-14, gradients ~3e-13.
VALUE_TOL, GRAD_TOL = 2e-5, 1e-4
LAM = 0.2


def _cfg(padding, window_size=11):
    return SSIMConfig(window_size=window_size, padding=padding)


def _grads(fn, x, y):
    xr, yr = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
    v = fn(xr, yr)
    gx, gy = torch.autograd.grad(v.sum(), (xr, yr))
    return v.detach(), gx, gy


def _oracle_dssim_l1(x, y, m, padding):
    return (1 - LAM) * masked_lp(x, y, m) + LAM * (1 - masked_ssim(x, y, m, padding=padding))


@pytest.mark.parametrize("shape", ["B1HW", "11HW", "1CHW", "BCHW", "HW", "bool"])
@pytest.mark.parametrize("padding", ["same", "valid", "reflect"])
def test_every_mask_shape_equals_oracle(shape, padding):
    x, y = photo_pair(31, 40, seed=3, dtype=torch.float32, batch=2)
    base = torch.stack([soft_mask(31, 40, seed=s) for s in range(6)]).view(2, 3, 31, 40)
    m = {
        "B1HW": base[:, :1],
        "11HW": base[:1, :1],
        "1CHW": base[:1],
        "BCHW": base,
        "HW": base[0, 0],
        "bool": base[:, :1] > 0.5,
    }[shape]
    got = _grads(lambda a, b: splatloss.ssim(a, b, mask=m, padding=padding, backend="cpu", reduction="none"), x, y)
    want = _grads(lambda a, b: masked_ssim(a, b, m, padding=padding), x.double(), y.double())
    assert (got[0].double() - want[0]).abs().max().item() <= VALUE_TOL
    assert rel(got[1], want[1]) <= GRAD_TOL and rel(got[2], want[2]) <= GRAD_TOL


def test_empty_channel_counts_as_one_with_zero_gradient():
    x, y = photo_pair(30, 34, seed=3, dtype=torch.float64, batch=2)
    m = torch.stack([soft_mask(30, 34, seed=s) for s in range(6)]).view(2, 3, 30, 34).clone()
    m[0, 1] = 0  # an empty channel
    m[1] = 0  # an empty image
    for padding in ("same", "valid"):
        s, gx, gy = _grads(
            lambda a, b: get("cpu").masked_ssim_stats(a, b, m, _cfg(padding))[0], x, y
        )  # [B, C] summed: gradients of every channel together
        ts, tgx, tgy = _grads(lambda a, b: masked_ssim_stats(a, b, m, padding=padding)[0], x, y)
        assert s[0, 1] == 1 and (s[1] == 1).all()
        assert (gx[0, 1] == 0).all() and (gx[1] == 0).all() and (gy[1] == 0).all()
        assert (s - ts).abs().max() <= 1e-12 and rel(gx, tgx) <= 1e-10 and rel(gy, tgy) <= 1e-10
        v, gx, _ = _grads(lambda a, b: get("cpu").dssim_l1(a, b, _cfg(padding), LAM, m), x, y)
        assert v[1] == 0 and (gx[1] == 0).all()  # empty mask: L1 0, SSIM 1


@pytest.mark.parametrize("padding", ["same", "valid", "reflect"])
def test_all_ones_mask_equals_unmasked_kernel(padding):
    x, y = photo_pair(29, 33, seed=3, dtype=torch.float32)
    ones = torch.ones(1, 1, 29, 33)
    a = _grads(lambda p, q: get("cpu").dssim_l1(p, q, _cfg(padding), LAM, ones), x, y)
    b = _grads(lambda p, q: get("cpu").dssim_l1(p, q, _cfg(padding), LAM), x, y)
    # fp32 round-off of the extra multiply by 1 and the division by W = F(1) (measured <= 1.5e-8 values,
    # <= 1.2e-6 gradients normwise)
    assert (a[0] - b[0]).abs().max().item() <= 1e-6
    assert rel(a[1], b[1]) <= 1e-5 and rel(a[2], b[2]) <= 1e-5


@pytest.mark.parametrize("padding", [pytest.param("same", marks=pytest.mark.slow), "valid"])
def test_threads_and_column_tiles_do_not_change_the_result(padding):
    # 2600 columns: the backward sweeps 1024-column tiles (library.BWD_TILE) above 2.5 tiles.
    a = np.tile(photo("astronaut", 100, 0, 24, 512), (1, 6, 1))[:, :2600]
    x, y = to_torch(a, torch.float32)[:, :2], to_torch(distort(a, seed=3), torch.float32)[:, :2]
    m = soft_mask(24, 2600, seed=4)[None, None].float()
    fn = lambda a, b: get("cpu").dssim_l1(a, b, _cfg(padding), LAM, m)  # noqa: E731
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _grads(fn, x, y)
        torch.set_num_threads(3)
        three = _grads(fn, x, y)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one[0], three[0]) and torch.equal(one[1], three[1]) and torch.equal(one[2], three[2])
    want = _grads(lambda a, b: _oracle_dssim_l1(a, b, m, padding), x.double(), y.double())
    assert (one[0].double() - want[0]).abs().max().item() <= VALUE_TOL
    assert rel(one[1], want[1]) <= GRAD_TOL and rel(one[2], want[2]) <= GRAD_TOL


def test_other_window_sizes_use_the_generic_build():
    x, y = photo_pair(30, 31, seed=3, dtype=torch.float64)
    m = soft_mask(30, 31, seed=2)
    for k in (3, 7):
        got = _grads(lambda a, b: splatloss.ssim(a, b, mask=m, window_size=k, padding="same", backend="cpu"), x, y)
        want = _grads(lambda a, b: masked_ssim(a, b, m, window_size=k, padding="same"), x, y)
        assert abs(got[0].item() - want[0].item()) <= 1e-12
        assert rel(got[1], want[1]) <= 1e-10 and rel(got[2], want[2]) <= 1e-10


def test_double_backward_runs_the_torch_ops_adjoint():
    x, y = photo_pair(20, 23, seed=3, dtype=torch.float64)
    m = soft_mask(20, 23, seed=1)[None, None]
    xr = x.clone().requires_grad_(True)
    for backend in ("cpu", "torch"):
        if backend == "cpu":
            v = get("cpu").dssim_l1(xr, y, _cfg("same"), LAM, m).sum()
        else:  # the shared torch-ops composition
            v = splatloss.dssim_l1(xr, y, LAM, mask=m, padding="same", backend="torch", reduction="sum")
        (g,) = torch.autograd.grad(v, xr, create_graph=True)
        (gg,) = torch.autograd.grad(g.square().sum(), xr)
        if backend == "cpu":
            first, second = g.detach(), gg
    assert rel(first, g) <= 1e-10 and rel(second, gg) <= 1e-8


# gradcheck's fast mode (random projections of the Jacobians) at tight float64 bars, as test_autograd
FAST = dict(fast_mode=True, atol=1e-8, rtol=1e-6)


@pytest.mark.slow
def test_gradcheck_float64():
    x, y = photo_pair(14, 15, seed=3, dtype=torch.float64, channels=2)
    m = soft_mask(14, 15, seed=3)[None, None]
    xr, yr = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
    for padding in ("same", "valid", "reflect"):
        cfg = _cfg(padding, window_size=5)
        assert torch.autograd.gradcheck(lambda a, b: get("cpu").dssim_l1(a, b, cfg, LAM, m), (xr, yr), **FAST)
        assert torch.autograd.gradcheck(lambda a, b: get("cpu").masked_ssim_stats(a, b, m, cfg), (xr, yr), **FAST)


@pytest.mark.slow
def test_masked_ms_ssim_gradcheck_and_double_backward_float64():
    """Masked MS-SSIM's one node for every scale: gradcheck of the fused sweeps' gradients, and a
    double backward (its torch-ops walk) against the shared masked composition's."""
    x, y = photo_pair(21, 19, seed=3, dtype=torch.float64, channels=2)
    m = soft_mask(21, 19, seed=2)[None, None]
    kw = dict(window_size=3, sigma=0.8, weights=(0.3, 0.4, 0.3), tau=0.01, mask=m)
    xr, yr = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
    for padding in ("valid", "same"):
        fn = lambda a, b: splatloss.ms_ssim(a, b, padding=padding, backend="cpu", **kw)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (xr, yr), **FAST)
        out = []
        for backend in ("cpu", "torch"):
            v = splatloss.ms_ssim(xr, y, padding=padding, backend=backend, **kw)
            (g,) = torch.autograd.grad(v, xr, create_graph=True)
            (gg,) = torch.autograd.grad(g.square().sum(), xr)
            out.append((g.detach(), gg))
        assert rel(out[0][0], out[1][0]) <= 1e-10 and rel(out[0][1], out[1][1]) <= 1e-8


@pytest.mark.slow
def test_compiles_fullgraph_with_the_kernel_ops():
    from torch._dynamo.testing import CompileCounterWithBackend

    x, y = photo_pair(24, 28, seed=3, dtype=torch.float32)
    m = soft_mask(24, 28, seed=1)[None, None].float()
    cases = {
        "splatloss.cpu_masked_ssim_stats": lambda a, b: splatloss.ssim(a, b, mask=m, padding="same"),
        "splatloss.cpu_masked_dssim_l1": lambda a, b: get("cpu").dssim_l1(a, b, _cfg("same"), LAM, m).sum(),
    }
    for op, fn in cases.items():
        counter = CompileCounterWithBackend("aot_eager")
        xc = x.clone().requires_grad_(True)
        value = torch.compile(fn, fullgraph=True, backend=counter)(xc, y)
        (grad,) = torch.autograd.grad(value, xc)
        ref, ref_grad, _ = _grads(fn, x, y)
        assert counter.frame_count == 1
        assert any(op in str(n.target) for g in counter.graphs for n in g.graph.nodes), op
        assert abs(value.item() - ref.item()) <= 1e-7 and rel(grad, ref_grad) <= 1e-6


@pytest.mark.parametrize("which", ["x", "y"])
def test_one_image_needing_a_gradient(which):
    x, y = photo_pair(26, 29, seed=3, dtype=torch.float64)
    m = soft_mask(26, 29, seed=6)[None, None]
    _, gx, gy = _grads(lambda a, b: get("cpu").dssim_l1(a, b, _cfg("same"), LAM, m), x, y)
    a = x.clone().requires_grad_(which == "x")
    b = y.clone().requires_grad_(which == "y")
    v = get("cpu").dssim_l1(a, b, _cfg("same"), LAM, m).sum()
    (g,) = torch.autograd.grad(v, a if which == "x" else b)
    assert rel(g, gx if which == "x" else gy) <= 1e-12
