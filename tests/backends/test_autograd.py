"""Autograd behaviour every backend shares: gradcheck in float64, adjoint support, no-grad, one-image
gradients, accumulation, second order and torch.func where a backend promises them."""

import pytest
import torch

import splatloss
from conftest import DTYPES, SECOND_ORDER, TOL, assert_rel, backend_params, device_for, make_pair, side
from splatloss import reference
from splatloss.config import SSIMConfig

F64 = backend_params([n for n in ("torch", "cpu", "triton") if torch.float64 in DTYPES[n]])
SECOND = backend_params(SECOND_ORDER)
WITH_REF = backend_params(slow_triton=True) + ["reference"]
# gradcheck's fast mode compares random projections of the Jacobians (seconds instead of minutes);
# in float64 it holds far tighter bars than the default rtol 1e-3, which a 1 % error in the SSIM
# term's gradient of the "valid" statistics passes in fast mode.
FAST = dict(fast_mode=True, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("padding", ["valid", "same", "reflect"])
@pytest.mark.parametrize("backend", F64)
@pytest.mark.slow
def test_gradcheck_float64_map(backend, padding):
    cfg = SSIMConfig(padding=padding, window_size=5, sigma=1.0)
    x, y = make_pair((1, 2, 7, 8), torch.float64, seed=3, requires_grad=True)
    b = splatloss.backends.get(backend)
    fn = lambda p, q: b.ssim_map(p, q, cfg, return_cs=True)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, y), check_forward_ad=backend in SECOND_ORDER, **FAST)


@pytest.mark.parametrize("padding", ["valid", "same", "reflect"])
@pytest.mark.parametrize("backend", SECOND)
@pytest.mark.slow
def test_gradcheck_and_gradgradcheck_float64_stats(backend, padding):
    cfg = SSIMConfig(padding=padding, window_size=5, sigma=1.0)
    x, y = make_pair((2, 1, 7, 8), torch.float64, seed=3, requires_grad=True)
    b = splatloss.backends.get(backend)
    fn = lambda p, q: b.ssim_stats(p, q, cfg)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, y), check_forward_ad=True, **FAST)
    # the backward is built from differentiable torch ops: second order works too
    assert torch.autograd.gradgradcheck(fn, (x, y), **FAST)


@pytest.mark.parametrize("backend", SECOND)
@pytest.mark.slow
def test_gradcheck_and_gradgradcheck_of_the_public_losses(backend):
    x, y = make_pair((1, 1, 21, 19), torch.float64, seed=4, requires_grad=True)
    kw = dict(window_size=3, sigma=0.8, weights=(0.3, 0.4, 0.3), tau=0.01, backend=backend)
    assert torch.autograd.gradcheck(lambda a, b: splatloss.ms_ssim(a, b, **kw), (x, y), **FAST)
    x1 = x[..., :14, :15].detach().clone().requires_grad_(True)
    y1 = y[..., :14, :15].detach()
    ms = dict(window_size=3, sigma=0.8, weights=(0.5, 0.5), tau=0.01, backend=backend)
    for fn in (
        lambda a: splatloss.ms_ssim(a, y1, **ms),
        lambda a: splatloss.dssim_l1(a, y1, 0.2, padding="same", window_size=5, backend=backend),
        lambda a: splatloss.ssim(a, y1, padding="same", window_size=5, backend=backend),
    ):
        assert torch.autograd.gradgradcheck(fn, (x1,), **FAST)


@pytest.mark.parametrize("fn", ["ssim_map", "ssim_stats"])
@pytest.mark.parametrize("backend", SECOND)
def test_batched_gradients_vmap_over_backward(backend, fn):
    # autograd.grad(is_grads_batched=True) vmaps the backward (jacobians, gradcheck's batched mode)
    cfg = SSIMConfig(padding="same", window_size=5, sigma=1.0)
    x, y = make_pair((2, 2, 7, 8), torch.float64, seed=3, requires_grad=True)
    out = getattr(splatloss.backends.get(backend), fn)(x, y, cfg)[0]
    ref = getattr(reference, fn)(x, y, cfg)[0]
    eye = torch.eye(out.numel(), dtype=out.dtype).reshape(-1, *out.shape)
    jac = torch.autograd.grad(out, (x, y), eye, is_grads_batched=True)
    jac_ref = torch.autograd.grad(ref, (x, y), eye, is_grads_batched=True)
    for a, b in zip(jac, jac_ref):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_backward_is_the_adjoint_not_the_pixelwise_partials(backend):
    """An upstream gradient at one map pixel reaches exactly that pixel's 11x11 window in the image."""
    dtype = torch.float64 if torch.float64 in DTYPES[backend] else torch.float32
    x, y = make_pair((1, 1, 31, 31), dtype, seed=8, device=device_for(backend), requires_grad=True)
    s = splatloss.backends.get(backend).ssim_map(x, y, SSIMConfig())
    up = torch.zeros_like(s)
    up[0, 0, 7, 12] = 1.0
    gx, gy = torch.autograd.grad((s * up).sum(), (x, y))
    support = torch.zeros_like(gx, dtype=torch.bool)
    support[0, 0, 7:18, 12:23] = True
    assert bool((gx[support] != 0).all()) and bool((gx[~support] == 0).all())
    assert bool((gy[support] != 0).all()) and bool((gy[~support] == 0).all())
    if dtype == torch.float64:
        ref = torch.autograd.grad((reference.ssim_map(x, y, SSIMConfig()) * up).sum(), (x, y))
        torch.testing.assert_close(gx, ref[0], atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(gy, ref[1], atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("backend", WITH_REF)
def test_autograd_grad_does_not_accumulate_and_matches_backward(backend):
    x, y = make_pair(
        (1, 3, side(backend, 30, 16), side(backend, 31, 17)), seed=51, device=device_for(backend), requires_grad=True
    )
    loss = 1 - splatloss.ssim(x, y, backend=backend)
    gx, gy = torch.autograd.grad(loss, (x, y))
    assert x.grad is None and y.grad is None
    (1 - splatloss.ssim(x, y, backend=backend)).backward()
    torch.testing.assert_close(x.grad, gx)
    torch.testing.assert_close(y.grad, gy)
    # a second backward accumulates into .grad, as autograd always does
    (1 - splatloss.ssim(x, y, backend=backend)).backward()
    torch.testing.assert_close(x.grad, 2 * gx)


@pytest.mark.parametrize("backend", WITH_REF)
def test_only_one_image_requires_grad_or_neither(backend):
    x, y = make_pair((1, 2, side(backend, 25, 16), side(backend, 27, 17)), seed=61, device=device_for(backend))
    both_x, both_y = x.clone().requires_grad_(), y.clone().requires_grad_()
    gx_both, gy_both = torch.autograd.grad(splatloss.ssim(both_x, both_y, backend=backend), (both_x, both_y))
    xr = x.clone().requires_grad_()
    (gx,) = torch.autograd.grad(splatloss.ssim(xr, y, backend=backend), xr)
    torch.testing.assert_close(gx, gx_both)
    yr = y.clone().requires_grad_()
    (gy,) = torch.autograd.grad(splatloss.ssim(x, yr, backend=backend), yr)
    torch.testing.assert_close(gy, gy_both)
    if backend != "reference":  # img2 alone against the float64 truth, at the backend's bar
        y6 = y.double().cpu().requires_grad_()
        (gy6,) = torch.autograd.grad(splatloss.ssim(x.double().cpu(), y6, backend="reference"), y6)
        assert_rel(gy, gy6, TOL[backend]["grads"], "grad img2 alone")
    out = splatloss.ssim(x, y, backend=backend)
    assert not out.requires_grad and out.grad_fn is None


class _CountSaved:
    def __init__(self):
        self.n = 0

    def pack(self, t):
        self.n += 1
        return t

    def unpack(self, t):
        return t


@pytest.mark.parametrize("fn", ["ssim", "ms_ssim"])
def test_no_grad_saves_nothing(backend, fn):
    dev = device_for(backend)
    small = backend == "triton" and dev.type == "cpu"
    x, y = make_pair((1, 1, 24, 24) if small else (1, 1, 161, 161), seed=71, device=dev)
    kw = dict(window_size=3, weights=(0.5, 0.5)) if small and fn == "ms_ssim" else {}
    x.requires_grad_(True)
    counter = _CountSaved()
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
        with torch.no_grad():
            out = getattr(splatloss, fn)(x, y, backend=backend, **kw)
        assert counter.n == 0 and out.grad_fn is None
        getattr(splatloss, fn)(x, y, backend=backend, **kw)
        assert counter.n > 0  # the hook does see what a graph saves


@pytest.mark.parametrize("backend", SECOND)
def test_create_graph_double_backward(backend):
    x, y = make_pair((1, 1, 20, 21), torch.float64, seed=81, requires_grad=True)
    hs = []
    for name in (backend, "reference"):
        (gx,) = torch.autograd.grad(splatloss.ssim(x, y, backend=name), x, create_graph=True)
        (hx,) = torch.autograd.grad((gx * gx).sum(), y)
        hs.append(hx)
    torch.testing.assert_close(hs[0], hs[1], atol=1e-12, rtol=1e-9)


@pytest.mark.parametrize("backend", SECOND + ["reference"])
def test_torch_func_grad_vmap_jvp(backend):
    x, y = make_pair((3, 2, 24, 26), torch.float64, seed=91)
    f = lambda a, b: splatloss.ssim(a, b, backend=backend)  # noqa: E731
    g_func = torch.func.grad(f, argnums=(0, 1))(x, y)
    xr, yr = x.clone().requires_grad_(), y.clone().requires_grad_()
    g_ag = torch.autograd.grad(f(xr, yr), (xr, yr))
    for a, b in zip(g_func, g_ag):
        torch.testing.assert_close(a, b)
    # vmap over the batch (each sample is an unbatched (C, H, W) image)
    per = torch.func.vmap(f)(x, y)
    torch.testing.assert_close(per, splatloss.ssim(x, y, backend=backend, reduction="none"))
    per_grad = torch.func.vmap(torch.func.grad(f))(x, y)
    torch.testing.assert_close(per_grad, g_ag[0] * 3)  # mean over 3 images scales by 1/3
    # jvp (forward mode) equals the directional derivative from reverse mode
    tx, ty = torch.randn_like(x), torch.randn_like(y)
    _, tangent = torch.func.jvp(f, (x, y), (tx, ty))
    torch.testing.assert_close(tangent, (g_ag[0] * tx).sum() + (g_ag[1] * ty).sum())
    # MS-SSIM loss through jvp and grad
    xm, ym = make_pair((1, 1, 81, 83), torch.float64, seed=92)
    fm = lambda a, b: splatloss.ms_ssim(a, b, backend=backend, weights=(0.2, 0.3, 0.5), tau=0.01)  # noqa: E731
    gm = torch.func.grad(fm)(xm, ym)
    t = torch.randn_like(xm)
    _, tm = torch.func.jvp(lambda a: fm(a, ym), (xm,), (t,))
    torch.testing.assert_close(tm, (gm * t).sum())


@pytest.mark.parametrize("backend", backend_params(["triton"], slow_triton=True))
def test_triton_torch_compile_traces_without_graph_breaks(backend):
    cfg = SSIMConfig(padding="same")
    x, y = make_pair((1, 2, 20, 23), seed=7, device=device_for(backend))
    tri = splatloss.backends.get(backend)

    def loss(a, b):
        s, c = tri.ssim_stats(a, b, cfg)
        return 1 - s.mean() + 0.1 * c.mean()

    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)  # raises on a graph break
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    la, lb = loss(xa, y), compiled(xb, y)
    (ga,) = torch.autograd.grad(la, [xa])
    (gb,) = torch.autograd.grad(lb, [xb])
    assert torch.equal(la, lb) and torch.equal(ga, gb)
