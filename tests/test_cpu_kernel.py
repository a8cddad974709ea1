"""The C kernel of backend="cpu": its fallbacks, its threading and its cache.

Agreement with the reference and with the torch backend (values and gradients, every padding, window
and dtype, second order) is the conformance suite's job (tests/backends/); here: what the kernel adds.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from splatloss import backends, multiscale
from splatloss.backends.cpu import build, functions, library
from splatloss.config import SSIMConfig

CPU = backends.get("cpu")


def _pair(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=g, dtype=dtype)
    y = (0.7 * x + 0.3 * torch.rand(shape, generator=g, dtype=dtype)).clamp(0, 1)
    return x, y


def _stats_and_grads(x, y, cfg, gs, gc):
    x = x.clone().requires_grad_(True)
    y = y.clone().requires_grad_(True)
    s, c = CPU.ssim_stats(x, y, cfg)
    gx, gy = torch.autograd.grad((s * gs + c * gc).sum(), (x, y))
    return s.detach(), c.detach(), gx, gy


def test_kernel_builds_here_and_is_used_by_cpu_never_by_torch():
    assert library.get(torch.float32) is not None, library.unavailable_reason()
    x, y = _pair((1, 2, 20, 30))
    x.requires_grad_(True)
    s, _ = CPU.ssim_stats(x, y, SSIMConfig())
    assert type(s.grad_fn).__name__.startswith("_StatsFusedFn")  # the kernel, gradient in the forward pass
    s2, _ = backends.get("torch").ssim_stats(x, y, SSIMConfig())
    assert type(s2.grad_fn).__name__.startswith("_SSIMStatsFn")  # the torch-ops Function
    torch.testing.assert_close(s, s2, rtol=0, atol=1e-6)


def test_threads_split_rows_without_changing_results():
    """More threads split each plane into row strips; values and gradients stay bitwise equal."""
    x, y = _pair((1, 2, 150, 67))
    gs, gc = torch.tensor([[0.3, -1.0]]), torch.tensor([[1.5, 0.2]])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _stats_and_grads(x, y, SSIMConfig(), gs, gc)
        torch.set_num_threads(3)  # more strips than planes, even on a 2-core machine
        assert library._strips(150 - 10, 2) > 1
        three = _stats_and_grads(x, y, SSIMConfig(), gs, gc)
    finally:
        torch.set_num_threads(before)
    for a, b in zip(one, three):
        assert torch.equal(a, b)


_NO_COMPILER = textwrap.dedent(
    """
    import warnings, torch, splatloss
    x = torch.rand(1, 3, 40, 40, requires_grad=True)
    y = torch.rand(1, 3, 40, 40)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = splatloss.ssim(x, y)
        a.backward()
        b = splatloss.ssim(x, y)
        c = splatloss.ms_ssim(torch.rand(1, 1, 170, 170), torch.rand(1, 1, 170, 170))
        explained = splatloss.backends.explain(x)
    ours = [w for w in caught if "C kernel of backend='cpu' is unavailable" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert "no C compiler found" in str(ours[0].message), str(ours[0].message)
    assert "auto -> 'torch'" in explained and "no C compiler found" in explained, explained
    assert splatloss.backends.resolve("auto", x).name == "torch"
    assert splatloss.backends.available()["cpu"] is False
    ref = splatloss.ssim(x, y, backend="reference")
    assert abs(float(a) - float(ref)) < 1e-6 and float(a) == float(b)
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    try:
        splatloss.ssim(x, y, backend="cpu")
    except ValueError as exc:
        msg = str(exc)
        assert "backend='cpu' is not available" in msg and "install a C compiler (gcc or clang)" in msg, msg
        assert "use backend='torch'" in msg, msg
    else:
        raise AssertionError("backend='cpu' without a compiler did not raise")
    print("OK")
    """
)


@pytest.mark.parametrize("how", ["empty PATH", "CC missing"])
@pytest.mark.slow
def test_without_a_compiler_auto_runs_torch_warns_once_and_cpu_is_an_error(tmp_path, how):
    """A real environment without a compiler (a subprocess): no compiler on the PATH, or $CC naming
    one that does not exist ($CC, when set, is the only compiler tried)."""
    env = dict(os.environ, SPLATLOSS_CACHE_DIR=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    if how == "empty PATH":
        env["PATH"] = str(tmp_path)
        env.pop("CC", None)
    else:
        env["CC"] = str(tmp_path / "no-such-cc")
    proc = subprocess.run([sys.executable, "-c", _NO_COMPILER], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-2000:]


@pytest.mark.slow
def test_cached_library_is_reused_and_keyed_by_source(tmp_path, monkeypatch):
    monkeypatch.setenv("SPLATLOSS_CACHE_DIR", str(tmp_path))
    cc = build.compiler()
    first = build.build(cc, "float")
    mtime = first.stat().st_mtime_ns
    assert build.build(cc, "float") == first and first.stat().st_mtime_ns == mtime
    assert build.build(cc, "double") != first
    assert build.build(cc, "float", 11) not in (first, build.build(cc, "double"))
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".so"] * 3  # no temporaries left


@pytest.mark.parametrize("tile", [16, 48])
def test_column_tiles_give_the_same_numbers(monkeypatch, tile):
    """Column tiling (used for very wide images) recomputes tile borders; nothing may change."""
    cfg = SSIMConfig(padding="same")
    x, y = _pair((1, 2, 33, 131), torch.float64, seed=5)
    gs, gc = torch.tensor([[0.7, -0.4]], dtype=torch.float64), torch.tensor([[0.3, 1.1]], dtype=torch.float64)
    whole = _stats_and_grads(x, y, cfg, gs, gc)
    monkeypatch.setattr(library, "BWD_TILE", tile)
    tiled = _stats_and_grads(x, y, cfg, gs, gc)
    for a, b in zip(whole, tiled):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("size", [(40, 40), (41, 37), (33, 50)])
def test_pyramid_step_and_its_adjoint_match_torch_ops(size):
    x = torch.rand(2, 3, *size, dtype=torch.float64, requires_grad=True)
    fast = functions.down2(x)
    assert type(fast.grad_fn).__name__.startswith("_Down2Fn")
    slow = multiscale.downsample2x(x)
    torch.testing.assert_close(fast, slow, rtol=1e-15, atol=1e-15)
    g = torch.randn_like(fast)
    (gf,) = torch.autograd.grad(fast, x, g)
    (gs,) = torch.autograd.grad(slow, x, g)
    torch.testing.assert_close(gf, gs, rtol=1e-15, atol=1e-15)
    torch.testing.assert_close(functions._down2_adjoint_torch(g, size), gs, rtol=1e-15, atol=1e-15)


@pytest.mark.parametrize(
    "size, pad, threads, tile",
    [((40, 40), 0, 1, 0), ((101, 37), 5, 3, 0), ((99, 53), 0, 3, 15), ((38, 51), 5, 1, 16), ((97, 21), 0, 2, 0)],
)
def test_next_scale_written_by_the_kernel_pass_is_the_pyramid_step(monkeypatch, size, pad, threads, tile):
    """MS-SSIM's next scale, written by the forward and by the fused pass as they read the images,
    is down2's bit for bit: odd sides, "same" padding, row strips over threads, column tiles."""
    x, y = _pair((1, 2, *size), seed=7)
    lib = library.get(torch.float32)
    w = SSIMConfig().window_1d(torch.float32, "cpu")
    if tile:
        monkeypatch.setattr(library, "BWD_TILE", tile)
    want = library.down2(lib, x), library.down2(lib, y)
    ones = torch.ones(1, 2)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        assert threads == 1 or library._strips(size[0] - 10, 2) > 1  # strips of the map rows, and of the rows
        fwd = library.forward(lib, x, y, w, 1e-4, 9e-4, pad, down=True)
        fused = library.backward(lib, x, y, w, 1e-4, 9e-4, ones, ones, True, False, pad, with_forward=True, down=True)
        unfused = library.forward(lib, x, y, w, 1e-4, 9e-4, pad)
    finally:
        torch.set_num_threads(before)
    for got in (fwd[2:], fused[4:]):
        for a, b in zip(got, want):
            assert a.shape == b.shape and torch.equal(a, b)
    for a, b in zip(fwd[:2], unfused):  # the means as without it
        assert torch.equal(a, b)


def test_threaded_kernel_works_in_a_forked_child():
    """A fork after the thread pool exists (DataLoader workers) must not wait on absent threads."""
    import multiprocessing as mp

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        x, y = _pair((1, 2, 120, 40))
        parent = CPU.ssim_stats(x, y, SSIMConfig())[0]  # creates the pool here
        assert library._pool is not None
        ctx = mp.get_context("fork")
        with ctx.Pool(1) as pool:
            child = pool.apply_async(_child_ssim, (x, y)).get(timeout=60)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(child, parent)


def _child_ssim(x, y):
    torch.set_num_threads(2)
    return CPU.ssim_stats(x, y, SSIMConfig())[0]
