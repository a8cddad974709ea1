"""The compiled CPU kernel behind backend="torch": its fallbacks, its threading and its cache.

Agreement with the reference and with the torch backend (values and gradients, every padding, window
and dtype, second order) is the conformance suite's job (tests/backends/); here: what the kernel adds.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from splatloss.backends import cpu as _cpu_kernel
from splatloss.backends import torch_fused
from splatloss.config import SSIMConfig


def _pair(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=g, dtype=dtype)
    y = (0.7 * x + 0.3 * torch.rand(shape, generator=g, dtype=dtype)).clamp(0, 1)
    return x, y


def _stats_and_grads(x, y, cfg, gs, gc):
    x = x.clone().requires_grad_(True)
    y = y.clone().requires_grad_(True)
    s, c = torch_fused.ssim_stats(x, y, cfg)
    gx, gy = torch.autograd.grad((s * gs + c * gc).sum(), (x, y))
    return s.detach(), c.detach(), gx, gy


def test_kernel_builds_here_and_is_used():
    assert _cpu_kernel.get(torch.float32) is not None, _cpu_kernel.unavailable_reason()
    x, y = _pair((1, 2, 20, 30))
    x.requires_grad_(True)
    s, _ = torch_fused.ssim_stats(x, y, SSIMConfig())
    assert type(s.grad_fn).__name__.startswith("SSIMStatsCPUFn")
    with _cpu_kernel.cpu_kernel(False):
        s2, _ = torch_fused.ssim_stats(x, y, SSIMConfig())
    assert not type(s2.grad_fn).__name__.startswith("SSIMStatsCPUFn")


def test_threads_split_rows_without_changing_results():
    """More threads split each plane into row strips; values and gradients stay bitwise equal."""
    x, y = _pair((1, 2, 150, 67))
    gs, gc = torch.tensor([[0.3, -1.0]]), torch.tensor([[1.5, 0.2]])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _stats_and_grads(x, y, SSIMConfig(), gs, gc)
        torch.set_num_threads(3)  # more strips than planes, even on a 2-core machine
        assert _cpu_kernel._strips(150 - 10, 2) > 1
        three = _stats_and_grads(x, y, SSIMConfig(), gs, gc)
    finally:
        torch.set_num_threads(before)
    for a, b in zip(one, three):
        assert torch.equal(a, b)


_NO_COMPILER = textwrap.dedent(
    """
    import warnings, torch, splatloss
    from splatloss.backends import cpu as _cpu_kernel
    x = torch.rand(1, 3, 40, 40, requires_grad=True)
    y = torch.rand(1, 3, 40, 40)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = splatloss.ssim(x, y, backend="torch")
        a.backward()
        b = splatloss.ssim(x, y, backend="torch")
        c = splatloss.ms_ssim(torch.rand(1, 1, 170, 170), torch.rand(1, 1, 170, 170), backend="torch")
    ours = [w for w in caught if "compiled CPU SSIM kernel is unavailable" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert "no C compiler found" in str(ours[0].message), str(ours[0].message)
    ref = splatloss.ssim(x, y, backend="reference")
    assert abs(float(a) - float(ref)) < 1e-6 and float(a) == float(b)
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    print("OK")
    """
)


def test_without_a_compiler_the_backend_works_and_warns_once(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path), SPLATLOSS_CACHE_DIR=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    env.pop("CC", None)
    proc = subprocess.run([sys.executable, "-c", _NO_COMPILER], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-2000:]


def test_cached_library_is_reused_and_keyed_by_source(tmp_path, monkeypatch):
    monkeypatch.setenv("SPLATLOSS_CACHE_DIR", str(tmp_path))
    cc = _cpu_kernel._compiler()
    first = _cpu_kernel._build(cc, "float")
    mtime = first.stat().st_mtime_ns
    assert _cpu_kernel._build(cc, "float") == first and first.stat().st_mtime_ns == mtime
    assert _cpu_kernel._build(cc, "double") != first
    assert _cpu_kernel._build(cc, "float", 11) not in (first, _cpu_kernel._build(cc, "double"))
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".so"] * 3  # no temporaries left


@pytest.mark.parametrize("fwd_tile,bwd_tile", [(16, 16), (32, 48)])
def test_column_tiles_give_the_same_numbers(monkeypatch, fwd_tile, bwd_tile):
    """Column tiling (used for very wide images) recomputes tile borders; nothing may change."""
    cfg = SSIMConfig(padding="same")
    x, y = _pair((1, 2, 33, 131), torch.float64, seed=5)
    gs, gc = torch.tensor([[0.7, -0.4]], dtype=torch.float64), torch.tensor([[0.3, 1.1]], dtype=torch.float64)
    whole = _stats_and_grads(x, y, cfg, gs, gc)
    monkeypatch.setattr(_cpu_kernel, "FWD_TILE", fwd_tile)
    monkeypatch.setattr(_cpu_kernel, "BWD_TILE", bwd_tile)
    tiled = _stats_and_grads(x, y, cfg, gs, gc)
    for a, b in zip(whole, tiled):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("size", [(40, 40), (41, 37), (33, 50)])
def test_pyramid_step_and_its_adjoint_match_torch_ops(size):
    x = torch.rand(2, 3, *size, dtype=torch.float64, requires_grad=True)
    fast = _cpu_kernel.Down2CPUFn.apply(x)
    slow = _cpu_kernel._down2_torch(x)
    torch.testing.assert_close(fast, slow, rtol=1e-15, atol=1e-15)
    g = torch.randn_like(fast)
    (gf,) = torch.autograd.grad(fast, x, g)
    (gs,) = torch.autograd.grad(slow, x, g)
    torch.testing.assert_close(gf, gs, rtol=1e-15, atol=1e-15)
    torch.testing.assert_close(_cpu_kernel._down2_adjoint_torch(g, size), gs, rtol=1e-15, atol=1e-15)


def test_threaded_kernel_works_in_a_forked_child():
    """A fork after the thread pool exists (DataLoader workers) must not wait on absent threads."""
    import multiprocessing as mp

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        x, y = _pair((1, 2, 120, 40))
        parent = torch_fused.ssim_stats(x, y, SSIMConfig())[0]  # creates the pool here
        assert _cpu_kernel._pool is not None
        ctx = mp.get_context("fork")
        with ctx.Pool(1) as pool:
            child = pool.apply_async(_child_ssim, (x, y)).get(timeout=60)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(child, parent)


def _child_ssim(x, y):
    torch.set_num_threads(2)
    return torch_fused.ssim_stats(x, y, SSIMConfig())[0]
