"""The fused torch backend against the reference: values, both gradients, gradcheck, autograd modes."""

import pytest
import torch

import splatloss
from splatloss import reference
from splatloss.backends import torch_fused
from splatloss.config import SSIMConfig

# (dtype, atol, rtol) for "torch vs reference", per map pixel / gradient element. fp32: the fp32
# *reference* itself is up to 1.3e-5 off the fp64 result per map pixel (its direct 121-tap
# convolutions of x^2 and mu^2 cancel), the fused backend ~2e-6; gradients are O(5) under a
# standard-normal upstream, their fp32 errors up to 3e-5 (reference) and 8e-6 (torch).
# test_fp32_torch_backend_is_accurate pins the fused path against the fp64 truth more tightly.
TOL = {torch.float32: (5e-5, 1e-4), torch.float64: (1e-12, 1e-10)}
TOL_GRAD = {torch.float32: (1e-4, 1e-4), torch.float64: (1e-12, 1e-10)}
PADDINGS = ["valid", "same", "reflect"]


@pytest.fixture(params=["cpu-kernel", "torch-ops"])
def cpu_path(request):
    """Run a test on both CPU paths of backend="torch": the compiled kernel (the default where a C
    compiler exists) and the plain torch-ops autograd.Function (no compiler, torch.func, GPUs)."""
    from splatloss.backends import _cpu_kernel

    with _cpu_kernel.cpu_kernel(request.param == "cpu-kernel"):
        yield request.param


def _pair(b, c, h, w, dtype, seed, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(b, c, h, w, generator=g, dtype=dtype)
    # correlated, so SSIM is far from 0 and both terms matter
    y = (0.6 * x + 0.4 * torch.rand(b, c, h, w, generator=g, dtype=dtype)).clamp(0, 1)
    return x.requires_grad_(requires_grad), y.requires_grad_(requires_grad)


def _close(a, b, dtype, grad=False):
    atol, rtol = (TOL_GRAD if grad else TOL)[dtype]
    torch.testing.assert_close(a, b, atol=atol, rtol=rtol)


def _normwise(got, truth, tol, what=""):
    """max|got - truth| / max|truth| <= tol. Gradients of a mean over the image are O(1e-3) to
    O(1e-4) per pixel, so the per-element atol=1e-4 of TOL_GRAD is a large fraction of the
    gradient itself there; this pins them relative to their own scale against float64 truth."""
    err = float((got.detach().double() - truth.detach().double()).abs().max() / truth.detach().double().abs().max())
    assert err <= tol, f"{what}: normwise relative error {err:.3g} > {tol:.1g}"


def _f64(t):
    return t.detach().double().requires_grad_(True)


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("channels", [1, 3, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ssim_map_and_cs_values_and_both_gradients(padding, channels, dtype):
    cfg = SSIMConfig(padding=padding)
    x, y = _pair(2, channels, 37, 53, dtype, seed=channels)
    s_ref, c_ref = reference.ssim_map(x, y, cfg, return_cs=True)
    s, c = torch_fused.ssim_map(x, y, cfg, return_cs=True)
    _close(s, s_ref, dtype)
    _close(c, c_ref, dtype)
    g = torch.Generator().manual_seed(99)
    up_s = torch.randn(s.shape, generator=g, dtype=dtype)
    up_c = torch.randn(s.shape, generator=g, dtype=dtype)
    ref_grads = torch.autograd.grad((s_ref * up_s).sum() + (c_ref * up_c).sum(), (x, y), retain_graph=True)
    grads = torch.autograd.grad((s * up_s).sum() + (c * up_c).sum(), (x, y))
    for got, exp in zip(grads, ref_grads):
        assert got.dtype == dtype
        _close(got, exp, dtype, grad=True)
    # only the SSIM map used (cs output unused -> None upstream inside the Function)
    ref_only = torch.autograd.grad((s_ref * up_s).sum(), (x, y))
    only = torch.autograd.grad((torch_fused.ssim_map(x, y, cfg) * up_s).sum(), (x, y))
    for got, exp in zip(only, ref_only):
        _close(got, exp, dtype, grad=True)


@pytest.mark.parametrize("padding", PADDINGS)
def test_fp32_torch_backend_is_accurate(padding):
    # fp32 fused path against the fp64 reference: values to 1e-5, gradients (O(5)) to 4e-5.
    cfg = SSIMConfig(padding=padding)
    x64, y64 = _pair(2, 3, 37, 53, torch.float64, seed=1)
    x32, y32 = x64.detach().float().requires_grad_(), y64.detach().float().requires_grad_()
    s64, c64 = reference.ssim_map(x64, y64, cfg, return_cs=True)
    s32, c32 = torch_fused.ssim_map(x32, y32, cfg, return_cs=True)
    torch.testing.assert_close(s32.double(), s64.detach(), atol=1e-5, rtol=0)
    torch.testing.assert_close(c32.double(), c64.detach(), atol=1e-5, rtol=0)
    g = torch.Generator().manual_seed(99)
    up = torch.randn(s64.shape, generator=g, dtype=torch.float64)
    g64 = torch.autograd.grad((s64 * up).sum(), (x64, y64))
    g32 = torch.autograd.grad((s32 * up.float()).sum(), (x32, y32))
    for a, b in zip(g32, g64):
        torch.testing.assert_close(a.double(), b, atol=4e-5, rtol=0)


@pytest.mark.parametrize("padding", PADDINGS)
def test_ssim_stats_values_and_gradients(padding, cpu_path):
    cfg = SSIMConfig(padding=padding)
    x, y = _pair(3, 2, 37, 53, torch.float32, seed=5)
    ref = reference.ssim_stats(x, y, cfg)
    got = torch_fused.ssim_stats(x, y, cfg)
    up = [torch.randn(3, 2, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    ref_g = torch.autograd.grad((ref[0] * up[0]).sum() + (ref[1] * up[1]).sum(), (x, y))
    got_g = torch.autograd.grad((got[0] * up[0]).sum() + (got[1] * up[1]).sum(), (x, y))
    for a, b in zip(got, ref):
        _close(a, b, torch.float32)
    for a, b in zip(got_g, ref_g):
        _close(a, b, torch.float32, grad=True)
    # against float64 truth (measured: values <= 1.3e-7, gradients <= 1.1e-6 normwise)
    x6, y6 = _f64(x), _f64(y)
    ref6 = reference.ssim_stats(x6, y6, cfg)
    ref6_g = torch.autograd.grad((ref6[0] * up[0].double()).sum() + (ref6[1] * up[1].double()).sum(), (x6, y6))
    for a, b, what in zip(got + got_g, ref6 + ref6_g, ("ssim mean", "cs mean", "grad x", "grad y")):
        _normwise(a, b, 1e-6 if what.endswith("mean") else 1e-5, what)


@pytest.mark.parametrize(
    "kw",
    [
        dict(window="uniform", window_size=7),
        dict(window_size=5, sigma=0.7, c1=0.001, c2=0.002, data_range=2.0),
        dict(window_size=3, padding="reflect", k1=0.02, k2=0.05),
        dict(window_size=15, sigma=3.0, padding="same"),
    ],
)
def test_window_and_constant_options(kw, cpu_path):
    x, y = _pair(2, 3, 37, 53, torch.float32, seed=13)
    ref = splatloss.ssim(x, y, backend="reference", reduction="none", **kw)
    got = splatloss.ssim(x, y, backend="torch", reduction="none", **kw)
    _close(got, ref, torch.float32)
    up = torch.tensor([1.0, -2.0])
    got_g = torch.autograd.grad((got * up).sum(), (x, y))
    for a, b in zip(got_g, torch.autograd.grad((ref * up).sum(), (x, y))):
        _close(a, b, torch.float32, grad=True)
    # against float64 truth (measured: values <= 1.2e-7, gradients <= 2.3e-6 normwise; max |grad| ~4e-3)
    x6, y6 = _f64(x), _f64(y)
    ref6 = splatloss.ssim(x6, y6, backend="reference", reduction="none", **kw)
    _normwise(got, ref6, 1e-6, "ssim")
    for a, b, what in zip(got_g, torch.autograd.grad((ref6 * up.double()).sum(), (x6, y6)), ("grad x", "grad y")):
        _normwise(a, b, 1e-5, what)


@pytest.mark.parametrize("padding", ["valid", "same"])
@pytest.mark.parametrize("tau", [None, 0.01])
def test_ms_ssim_values_and_gradients_vs_reference(padding, tau, cpu_path):
    x, y = _pair(2, 2, 163, 171, torch.float32, seed=11)
    kw = dict(padding=padding, tau=tau, reduction="none")
    ref = splatloss.ms_ssim(x, y, backend="reference", **kw)
    got = splatloss.ms_ssim(x, y, backend="torch", **kw)
    _close(got, ref, torch.float32)
    up = torch.tensor([0.7, -1.3])
    ref_g = torch.autograd.grad((ref * up).sum(), (x, y))
    got_g = torch.autograd.grad((got * up).sum(), (x, y))
    for a, b in zip(got_g, ref_g):
        _close(a, b, torch.float32, grad=True)
    # The gradients here are at most 1.3e-3 ("valid") / 4.9e-4 ("same"): TOL_GRAD's atol=1e-4 is up
    # to 20 % of them. Against float64 truth, normwise (measured: values <= 5e-6, gradients
    # <= 3.5e-5; the fp32 reference's own gradient is 5.1e-5 off):
    x6, y6 = _f64(x), _f64(y)
    ref6 = splatloss.ms_ssim(x6, y6, backend="reference", **kw)
    _normwise(got, ref6, 2e-5, "ms_ssim")
    for a, b, what in zip(got_g, torch.autograd.grad((ref6 * up.double()).sum(), (x6, y6)), ("grad x", "grad y")):
        _normwise(a, b, 1e-4, what)


@pytest.mark.parametrize("padding", PADDINGS)
def test_gradcheck_float64_map(padding):
    cfg = SSIMConfig(padding=padding, window_size=5, sigma=1.0)
    x, y = _pair(1, 2, 7, 8, torch.float64, seed=3)
    fn_map = lambda a, b: torch_fused.ssim_map(a, b, cfg, return_cs=True)  # noqa: E731
    assert torch.autograd.gradcheck(fn_map, (x, y), check_forward_ad=True)


@pytest.mark.parametrize("padding", PADDINGS)
def test_gradcheck_float64_stats(padding, cpu_path):
    cfg = SSIMConfig(padding=padding, window_size=5, sigma=1.0)
    x, y = _pair(2, 1, 7, 8, torch.float64, seed=3)
    fn_stats = lambda a, b: torch_fused.ssim_stats(a, b, cfg)  # noqa: E731
    assert torch.autograd.gradcheck(fn_stats, (x, y), check_forward_ad=True)
    # the backward is built from differentiable torch ops: second order works too
    assert torch.autograd.gradgradcheck(fn_stats, (x, y))


@pytest.mark.parametrize("fn", ["ssim_map", "ssim_stats"])
def test_batched_gradients_vmap_over_backward(fn):
    # autograd.grad(is_grads_batched=True) vmaps the backward (jacobians, gradcheck's batched mode)
    cfg = SSIMConfig(padding="same", window_size=5, sigma=1.0)
    x, y = _pair(2, 2, 7, 8, torch.float64, seed=3)
    out = getattr(torch_fused, fn)(x, y, cfg)[0]
    ref = getattr(reference, fn)(x, y, cfg)[0]
    eye = torch.eye(out.numel(), dtype=out.dtype).reshape(-1, *out.shape)
    jac = torch.autograd.grad(out, (x, y), eye, is_grads_batched=True)
    jac_ref = torch.autograd.grad(ref, (x, y), eye, is_grads_batched=True)
    for a, b in zip(jac, jac_ref):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_gradcheck_ms_ssim_loss_float64():
    x, y = _pair(1, 1, 21, 19, torch.float64, seed=4)
    kw = dict(window_size=3, sigma=0.8, weights=(0.3, 0.4, 0.3), tau=0.01, backend="torch")
    assert torch.autograd.gradcheck(lambda a, b: splatloss.ms_ssim(a, b, **kw), (x, y))


def test_backward_is_the_adjoint_not_the_pixelwise_partials():
    # An upstream gradient at one map pixel reaches exactly that pixel's 11x11 window in the image.
    cfg = SSIMConfig()
    x, y = _pair(1, 1, 31, 31, torch.float64, seed=8)
    s = torch_fused.ssim_map(x, y, cfg)
    up = torch.zeros_like(s)
    up[0, 0, 7, 12] = 1.0
    gx, gy = torch.autograd.grad((s * up).sum(), (x, y))
    support = torch.zeros_like(gx, dtype=torch.bool)
    support[0, 0, 7:18, 12:23] = True
    assert bool((gx[support] != 0).all()) and bool((gx[~support] == 0).all())
    assert bool((gy[support] != 0).all()) and bool((gy[~support] == 0).all())
    ref = torch.autograd.grad((reference.ssim_map(x, y, cfg) * up).sum(), (x, y))
    _close(gx, ref[0], torch.float64)
    _close(gy, ref[1], torch.float64)


@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_every_pixel_gets_gradient_at_odd_sizes(backend, cpu_path):
    x, y = _pair(1, 2, 165, 167, torch.float32, seed=21)
    for loss in (
        splatloss.ms_ssim(x, y, backend=backend),
        splatloss.ms_ssim(x, y, backend=backend, tau=0.01),
        splatloss.ssim(x, y, backend=backend),
        splatloss.ssim(x, y, backend=backend, padding="same"),
    ):
        gx, gy = torch.autograd.grad(loss, (x, y))
        assert bool((gx != 0).all()) and bool((gy != 0).all())
        assert bool(torch.isfinite(gx).all()) and bool(torch.isfinite(gy).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_half_precision_within_1e3_of_fp32(dtype, backend, cpu_path):
    x, y = _pair(2, 3, 161, 165, torch.float32, seed=31, requires_grad=False)
    xh, yh = x.to(dtype).requires_grad_(), y.to(dtype)
    for fn in (splatloss.ssim, splatloss.ms_ssim, splatloss.dssim):
        full = fn(x, y, backend=backend, reduction="none")
        half = fn(xh, yh, backend=backend, reduction="none")
        assert half.dtype == torch.float32
        assert float((half - full).detach().abs().max()) < 1e-3, fn.__name__
        # the 1e-3 above is the bar (measured: 7e-6 fp16, 5.7e-5 bf16, all input rounding);
        # half inputs are computed in fp32, so they equal the fp32 result on the rounded values
        rounded = fn(xh.detach().float(), yh.float(), backend=backend, reduction="none")
        torch.testing.assert_close(half.detach(), rounded, atol=1e-6, rtol=0, msg=fn.__name__)
    for padding in ("same", "reflect"):
        full = splatloss.ssim(x, y, backend=backend, padding=padding)
        half = splatloss.ssim(xh, yh, backend=backend, padding=padding)
        assert abs(float((half - full).detach())) < 1e-3
    (g,) = torch.autograd.grad(splatloss.ssim(xh, yh, backend=backend), xh)
    assert g.dtype == dtype and bool(torch.isfinite(g).all())
    # the gradient is the float64 one (same rounded inputs) rounded to the dtype: half an ulp, plus
    # fp16's subnormal step (|g| <= 4.2e-5 here, below fp16's smallest normal 6.1e-5), plus the fp32
    # computation's own error (1e-5 of the scale, as tests/test_triton_ssim.py) where it tips a rounding
    x64 = xh.detach().double().requires_grad_()
    (g64,) = torch.autograd.grad(splatloss.ssim(x64, yh.double(), backend="reference"), x64)
    half_ulp = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}[dtype]
    sub = 2.0**-24 if dtype == torch.float16 else 0.0
    over = float(((g.double() - g64).abs() - (half_ulp * g64.abs() + sub + 1e-5 * float(g64.abs().max()))).max())
    assert over <= 0, f"{dtype} gradient off the float64 truth by {over:.3g} beyond half an ulp"


@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_channels_last_and_non_contiguous(backend, cpu_path):
    x, y = _pair(2, 3, 40, 45, torch.float32, seed=41, requires_grad=False)
    expected = splatloss.ssim(x, y, backend=backend, reduction="none")
    expected_g = torch.autograd.grad(splatloss.ssim(x.requires_grad_(), y, backend=backend), x)[0]
    x = x.detach()
    variants = {
        "channels_last": (x.to(memory_format=torch.channels_last), y.to(memory_format=torch.channels_last)),
        "transposed": (x.transpose(-1, -2).contiguous().transpose(-1, -2), y.transpose(-1, -2).contiguous().transpose(-1, -2)),
        "sliced": (torch.cat([x, x], dim=-1)[..., ::2], torch.cat([y, y], dim=-1)[..., ::2]),
    }
    variants["sliced"] = (
        torch.stack([x, torch.zeros_like(x)], dim=-1)[..., 0],
        torch.stack([y, torch.zeros_like(y)], dim=-1)[..., 0],
    )
    for name, (a, b) in variants.items():
        assert not a.is_contiguous() or name == "channels_last"
        a = a.detach().requires_grad_()
        got = splatloss.ssim(a, b, backend=backend, reduction="none")
        torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5, msg=name)
        (g,) = torch.autograd.grad(got.mean(), a)
        torch.testing.assert_close(g, expected_g, atol=2e-7, rtol=1e-4, msg=name)


@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_autograd_grad_does_not_accumulate_and_matches_backward(backend):
    x, y = _pair(1, 3, 30, 31, torch.float32, seed=51)
    loss = 1 - splatloss.ssim(x, y, backend=backend)
    gx, gy = torch.autograd.grad(loss, (x, y))
    assert x.grad is None and y.grad is None
    loss2 = 1 - splatloss.ssim(x, y, backend=backend)
    loss2.backward()
    torch.testing.assert_close(x.grad, gx)
    torch.testing.assert_close(y.grad, gy)
    # a second backward accumulates into .grad, as autograd always does
    (1 - splatloss.ssim(x, y, backend=backend)).backward()
    torch.testing.assert_close(x.grad, 2 * gx)


@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_only_one_image_requires_grad_or_neither(backend):
    x, y = _pair(1, 2, 25, 27, torch.float32, seed=61, requires_grad=False)
    both_x, both_y = x.clone().requires_grad_(), y.clone().requires_grad_()
    gx_both, gy_both = torch.autograd.grad(splatloss.ssim(both_x, both_y, backend=backend), (both_x, both_y))
    xr = x.clone().requires_grad_()
    (gx,) = torch.autograd.grad(splatloss.ssim(xr, y, backend=backend), xr)
    torch.testing.assert_close(gx, gx_both)
    yr = y.clone().requires_grad_()
    (gy,) = torch.autograd.grad(splatloss.ssim(x, yr, backend=backend), yr)
    torch.testing.assert_close(gy, gy_both)
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
def test_no_grad_saves_nothing(fn, cpu_path):
    x, y = _pair(1, 1, 161, 161, torch.float32, seed=71)
    counter = _CountSaved()
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
        with torch.no_grad():
            out = getattr(splatloss, fn)(x, y, backend="torch")
        assert counter.n == 0 and out.grad_fn is None
        getattr(splatloss, fn)(x, y, backend="torch")
        assert counter.n > 0  # the hook does see what a graph saves


def test_create_graph_double_backward():
    x, y = _pair(1, 1, 20, 21, torch.float64, seed=81)
    for backend in ("torch", "reference"):
        (gx,) = torch.autograd.grad(splatloss.ssim(x, y, backend=backend), x, create_graph=True)
        (hx,) = torch.autograd.grad((gx * gx).sum(), y)
        if backend == "torch":
            h_torch = hx
    torch.testing.assert_close(h_torch, hx, atol=1e-12, rtol=1e-9)


@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_torch_func_grad_vmap_jvp(backend):
    x, y = _pair(3, 2, 24, 26, torch.float64, seed=91, requires_grad=False)
    f = lambda a, b: splatloss.ssim(a, b, backend=backend)  # noqa: E731
    # grad
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
    expected = (g_ag[0] * tx).sum() + (g_ag[1] * ty).sum()
    torch.testing.assert_close(tangent, expected)
    # MS-SSIM loss through jvp and grad
    xm, ym = _pair(1, 1, 81, 83, torch.float64, seed=92, requires_grad=False)
    fm = lambda a, b: splatloss.ms_ssim(a, b, backend=backend, weights=(0.2, 0.3, 0.5), tau=0.01)  # noqa: E731
    gm = torch.func.grad(fm)(xm, ym)
    t = torch.randn_like(xm)
    _, tm = torch.func.jvp(lambda a: fm(a, ym), (xm,), (t,))
    torch.testing.assert_close(tm, (gm * t).sum())


def test_dssim_with_gradient_uses_no_graph_and_matches_autograd(cpu_path):
    x, y = _pair(2, 3, 29, 33, torch.float32, seed=101, requires_grad=False)
    for reduction in ("mean", "sum"):
        value, g = splatloss.dssim_with_gradient(x, y, reduction=reduction, padding="same")
        assert value.grad_fn is None and g.grad_fn is None
        xr = x.clone().requires_grad_()
        expected = splatloss.dssim(xr, y, reduction=reduction, padding="same")
        (eg,) = torch.autograd.grad(expected, xr)
        torch.testing.assert_close(value, expected.detach())
        torch.testing.assert_close(g, eg, atol=1e-8, rtol=1e-5)
    buf = torch.full_like(x, float("nan"))
    value, g = splatloss.dssim_with_gradient(x, y, grad=buf, backend="reference")
    assert g is buf and bool(torch.isfinite(buf).all())
    xr = x.clone().requires_grad_()
    (eg,) = torch.autograd.grad(splatloss.dssim(xr, y), xr)
    torch.testing.assert_close(buf, eg, atol=1e-8, rtol=1e-5)
