"""Triton SSIM kernels, run in the Triton interpreter (TRITON_INTERPRET=1, set by conftest.py).

Truth is ``splatloss.reference`` evaluated in float64 on the very same input values: the kernels
compute in fp32, so "equal to 1e-5 relative" is checked against the exact answer rather than
against the fp32 reference's own round-off. Relative errors are normwise (``max|a - b| /
max|b|``): SSIM maps and gradients cross zero, where a pointwise relative error means nothing.
fp16 / bf16 gradients are compared with the reference's own gradient in that dtype (both are
the rounding of an fp32 value), within one unit in the last place of the dtype.
"""

import importlib

import pytest
import torch

import splatloss
from splatloss import reference
from splatloss.config import SSIMConfig

tri = importlib.import_module("splatloss.backends.triton")
tri_ssim = importlib.import_module("splatloss.backends.triton.ssim")
tri_common = importlib.import_module("splatloss.backends.triton._common")

pytestmark = [pytest.mark.triton, pytest.mark.slow]

REL = 1e-5  # normwise relative tolerance against the float64 reference
ULP = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def _pair(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=g, dtype=torch.float64)
    y = (0.6 * x + 0.4 * torch.rand(shape, generator=g, dtype=torch.float64)).clamp(0, 1)
    return x.to(dtype), y.to(dtype)


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _assert_rel(a, b, tol=REL, what=""):
    err = _rel(a, b)
    assert err <= tol, f"{what}: normwise relative error {err:.3g} > {tol:.1g}"


def _assert_grad(a, ref64, ref_lowp, dtype, what):
    """fp32: within REL of the float64 gradient; fp16 / bf16: within one ulp of the reference's own
    gradient in that dtype (plus REL of the scale for values near the dtype's resolution)."""
    assert a.dtype == dtype, f"{what}: gradient dtype {a.dtype}, expected {dtype}"
    if dtype == torch.float32:
        _assert_rel(a, ref64, what=what)
    else:
        a, b = a.double(), ref_lowp.double()
        bound = ULP[dtype] * b.abs() + REL * b.abs().max() + 2.0**-24
        worst = float(((a - b).abs() - bound).max())
        assert worst <= 0, f"{what}: fp16/bf16 gradient off by more than one ulp ({worst:.3g} over)"


def _stats_and_grads(mod, x, y, cfg, gs, gc):
    xr, yr = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
    s, c = mod.ssim_stats(xr, yr, cfg)
    gx, gy = torch.autograd.grad((s * gs).sum() + (c * gc).sum(), [xr, yr])
    return s.detach(), c.detach(), gx, gy


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("padding", ["valid", "same", "reflect"])
def test_ssim_stats_values_and_both_gradients(padding, dtype):
    """2x3x37x53: SSIM and cs means per (B, C), and the gradients of both images under a random
    upstream gradient on both outputs."""
    cfg = SSIMConfig(padding=padding)
    x, y = _pair((2, 3, 37, 53), dtype)
    g = torch.Generator().manual_seed(1)
    gs, gc = torch.randn(2, 3, generator=g), torch.randn(2, 3, generator=g)
    s, c, gx, gy = _stats_and_grads(tri, x, y, cfg, gs, gc)
    s64, c64, gx64, gy64 = _stats_and_grads(reference, x.double(), y.double(), cfg, gs.double(), gc.double())
    assert s.dtype == torch.float32 and s.shape == (2, 3)
    _assert_rel(s, s64, what="ssim mean")
    _assert_rel(c, c64, what="cs mean")
    _, _, gx_lp, gy_lp = (None, None, None, None)
    if dtype != torch.float32:
        _, _, gx_lp, gy_lp = _stats_and_grads(reference, x, y, cfg, gs, gc)
    _assert_grad(gx, gx64, gx_lp, dtype, "grad img1")
    _assert_grad(gy, gy64, gy_lp, dtype, "grad img2")


@pytest.mark.parametrize("padding", ["valid", "same"])
def test_ssim_map_and_cs_map_under_map_upstream(padding):
    cfg = SSIMConfig(padding=padding)
    x, y = _pair((2, 3, 37, 53))
    out = []
    for mod, dt in ((tri, torch.float32), (reference, torch.float64)):
        xr, yr = x.to(dt).requires_grad_(True), y.to(dt).requires_grad_(True)
        m, cs = mod.ssim_map(xr, yr, cfg, return_cs=True)
        g = torch.Generator().manual_seed(2)  # the same upstream values for both (drawn in float64)
        gm = torch.randn(m.shape, generator=g, dtype=torch.float64).to(dt)
        gc = torch.randn(m.shape, generator=g, dtype=torch.float64).to(dt)
        grads = torch.autograd.grad((m * gm).sum() + (cs * gc).sum(), [xr, yr])
        out.append((m.detach(), cs.detach()) + grads)
    expect_h = 37 - 10 if padding == "valid" else 37
    assert out[0][0].shape == (2, 3, expect_h, 53 - (10 if padding == "valid" else 0))
    for a, b, what in zip(out[0], out[1], ("ssim map", "cs map", "grad img1", "grad img2")):
        _assert_rel(a, b, what=what)


def test_public_api_runs_the_kernels_and_matches_reference():
    """splatloss.ssim / ssim_map / dssim_with_gradient with backend="triton" (the path bench.py and
    users take), against backend="reference" in float64."""
    x, y = _pair((1, 2, 29, 31))
    xr, yr = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
    v = splatloss.ssim(xr, yr, padding="same", backend="triton")
    gx, gy = torch.autograd.grad(v, [xr, yr])
    x64, y64 = x.double().requires_grad_(True), y.double().requires_grad_(True)
    v64 = splatloss.ssim(x64, y64, padding="same", backend="reference")
    gx64, gy64 = torch.autograd.grad(v64, [x64, y64])
    _assert_rel(v, v64, what="ssim")
    _assert_rel(gx, gx64, what="grad img1")
    _assert_rel(gy, gy64, what="grad img2")
    buf = torch.empty_like(x)
    d, g = splatloss.dssim_with_gradient(x, y, grad=buf, padding="same", backend="triton")
    assert g is buf
    _assert_rel(d, 1 - v64, what="dssim (one-pass kernel)")
    _assert_rel(g, -gx64, what="dssim gradient (one-pass kernel)")


@pytest.mark.parametrize(
    "shape,padding,window_size",
    [
        ((1, 3, 70, 40), "valid", 11),  # lanes packed 4 (fwd) / 2 (bwd) channels per program, 3 row chunks
        ((1, 1, 20, 150), "reflect", 11),  # two column strips per row, mirrored borders at strip edges
        ((1, 1, 36, 45), "reflect", 31),  # 32-deep tap tiles, 64-lane programs, 2 strips x 2 chunks
    ],
)
def test_cuda_launch_geometry(monkeypatch, shape, padding, window_size):
    """The interpreter normally runs one wide program; here it runs the exact CUDA geometry
    (128 lanes, channel packing, column strips with halos) with 32-row chunks (ROWS is a runtime
    argument, so this is the compiled code's logic) to prove the strip / chunk / lane seams."""
    monkeypatch.setattr(tri_common, "FORCE_CUDA_GEOMETRY", True)
    monkeypatch.setattr(tri_common, "CUDA_ROWS", 32)
    cfg = SSIMConfig(padding=padding, window_size=window_size, sigma=1.5 if window_size == 11 else 5.0)
    x, y = _pair(shape, seed=3)
    g = torch.Generator().manual_seed(4)
    gs, gc = torch.randn(shape[:2], generator=g), torch.randn(shape[:2], generator=g)
    s, c, gx, gy = _stats_and_grads(tri, x, y, cfg, gs, gc)
    s64, c64, gx64, gy64 = _stats_and_grads(reference, x.double(), y.double(), cfg, gs.double(), gc.double())
    _assert_rel(s, s64, what="ssim mean")
    _assert_rel(c, c64, what="cs mean")
    _assert_rel(gx, gx64, what="grad img1")
    _assert_rel(gy, gy64, what="grad img2")
    m = tri.ssim_map(x, y, cfg)
    _assert_rel(m, reference.ssim_map(x.double(), y.double(), cfg), what="ssim map")


def test_uniform_window_given_constants_and_data_range():
    """Box window of 7 taps, C1 / C2 given directly, images in [0, 255] (the moments' shift is
    data_range / 2 = 127.5): values and gradient against the float64 reference."""
    cfg = SSIMConfig(window="uniform", window_size=7, c1=6.5, c2=58.5, data_range=255.0, padding="same")
    x, y = _pair((1, 2, 20, 23), seed=8)
    x, y = x * 255, y * 255
    gs, gc = torch.tensor([[1.0, -0.5]]), torch.tensor([[0.25, 2.0]])
    s, c, gx, gy = _stats_and_grads(tri, x, y, cfg, gs, gc)
    s64, c64, gx64, gy64 = _stats_and_grads(reference, x.double(), y.double(), cfg, gs.double(), gc.double())
    for a, b, what in ((s, s64, "ssim"), (c, c64, "cs"), (gx, gx64, "grad img1"), (gy, gy64, "grad img2")):
        _assert_rel(a, b, what=what)


def test_bitwise_deterministic():
    cfg = SSIMConfig(padding="same")
    x, y = _pair((2, 2, 24, 31), seed=5)
    gs, gc = torch.ones(2, 2), torch.full((2, 2), 0.5)
    first = _stats_and_grads(tri, x, y, cfg, gs, gc)
    second = _stats_and_grads(tri, x, y, cfg, gs, gc)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_one_image_grad_no_grad_and_layouts():
    cfg = SSIMConfig()
    x, y = _pair((1, 3, 26, 27), seed=6)
    # only img2 requires grad
    yr = y.clone().requires_grad_(True)
    s, _ = tri.ssim_stats(x, yr, cfg)
    (gy,) = torch.autograd.grad(s.sum(), [yr])
    y64 = y.double().requires_grad_(True)
    (gy64,) = torch.autograd.grad(reference.ssim_stats(x.double(), y64, cfg)[0].sum(), [y64])
    _assert_rel(gy, gy64, what="grad img2 alone")
    # no_grad: nothing recorded
    with torch.no_grad():
        s2, _ = tri.ssim_stats(x.requires_grad_(True), yr, cfg)
    assert s2.grad_fn is None
    x.requires_grad_(False)
    # channels-last and a strided view give bitwise the contiguous result; gradients keep the layout
    xl = x.contiguous(memory_format=torch.channels_last).requires_grad_(True)
    yl = y.contiguous(memory_format=torch.channels_last)
    sl, _ = tri.ssim_stats(xl, yl, cfg)
    (gl,) = torch.autograd.grad(sl.sum(), [xl])
    xc = x.clone().requires_grad_(True)
    sc, _ = tri.ssim_stats(xc, y, cfg)
    (gc,) = torch.autograd.grad(sc.sum(), [xc])
    assert torch.equal(sl, sc) and torch.equal(gl, gc)
    assert gl.is_contiguous(memory_format=torch.channels_last)
    big = torch.zeros(1, 3, 30, 60)
    big[..., 2:28, 5:59:2] = x
    view = big[..., 2:28, 5:59:2]
    assert not view.is_contiguous()
    assert torch.equal(tri.ssim_stats(view, y, cfg)[0], sc.detach())


def test_torch_compile_traces_without_graph_breaks():
    cfg = SSIMConfig(padding="same")
    x, y = _pair((1, 2, 20, 23), seed=7)

    def loss(a, b):
        s, c = tri.ssim_stats(a, b, cfg)
        return 1 - s.mean() + 0.1 * c.mean()

    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)  # raises on a graph break
    xa = x.clone().requires_grad_(True)
    xb = x.clone().requires_grad_(True)
    la, lb = loss(xa, y), compiled(xb, y)
    (ga,) = torch.autograd.grad(la, [xa])
    (gb,) = torch.autograd.grad(lb, [xb])
    assert torch.equal(la, lb) and torch.equal(ga, gb)


def test_errors_name_what_was_expected():
    x, y = _pair((1, 1, 20, 20))
    with pytest.raises(TypeError, match=r"takes float32, float16 or bfloat16 images, got torch.float64"):
        tri.ssim_stats(x.double(), y.double(), SSIMConfig())
    with pytest.raises(ValueError, match=r"supports window_size <= 31 .*got 33; use backend='torch'"):
        tri.ssim_stats(x, y, SSIMConfig(window_size=33, padding="same"))
    with pytest.raises(ValueError, match=r"needs CUDA tensors, got a tensor on cpu; set TRITON_INTERPRET=1"):
        import os

        old = os.environ["TRITON_INTERPRET"]
        os.environ["TRITON_INTERPRET"] = "0"
        try:
            tri.ssim_map(x, y, SSIMConfig())
        finally:
            os.environ["TRITON_INTERPRET"] = old
    with pytest.raises(ValueError, match=r"must be at least 11x11 .*got 20x9"):
        tri.ssim_stats(x[..., :9], y[..., :9], SSIMConfig())
    # second derivatives are not implemented: create_graph=True gives a first-order gradient, and
    # differentiating that again is a clear error, never a silent zero
    xr = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(tri.ssim_stats(xr, y, SSIMConfig())[0].sum(), [xr], create_graph=True)
    with pytest.raises(RuntimeError, match=r"triton_ssim_stats_bwd.* no autograd formula was registered"):
        g.sum().backward()
    with pytest.raises(ValueError, match=r"does not support torch.func transforms .*use backend='torch'"):
        torch.func.grad(lambda a: tri.ssim_stats(a, y, SSIMConfig())[0].sum())(x)


def test_bfloat16_inputs():
    """bf16 in, fp32 values equal the float64 reference; bf16 gradients within one bf16 ulp of the
    reference's own bf16 gradient."""
    cfg = SSIMConfig(padding="same")
    x, y = _pair((1, 2, 20, 23), torch.bfloat16, seed=9)
    gs, gc = torch.tensor([[1.0, 0.5]]), torch.tensor([[0.3, -1.0]])
    s, c, gx, gy = _stats_and_grads(tri, x, y, cfg, gs, gc)
    s64, c64, gx64, gy64 = _stats_and_grads(reference, x.double(), y.double(), cfg, gs.double(), gc.double())
    _, _, gx_lp, gy_lp = _stats_and_grads(reference, x, y, cfg, gs, gc)
    _assert_rel(s, s64, what="ssim mean")
    _assert_rel(c, c64, what="cs mean")
    _assert_grad(gx, gx64, gx_lp, torch.bfloat16, "grad img1")
    _assert_grad(gy, gy64, gy_lp, torch.bfloat16, "grad img2")


@pytest.mark.parametrize(
    "shape,padding,window_size",
    [
        ((1, 2, 6, 7), "reflect", 11),  # mirror images at both borders of every row and column
        ((2, 1, 3, 4), "same", 11),  # image smaller than the window
        ((1, 1, 11, 12), "valid", 11),  # a single map row
        ((1, 1, 1, 1), "same", 3),  # one pixel
        ((1, 3, 17, 16), "reflect", 31),  # the largest window, reflect at its minimum size
    ],
)
def test_tiny_images_and_borders(shape, padding, window_size):
    cfg = SSIMConfig(padding=padding, window_size=window_size, sigma=5.0 if window_size == 31 else 1.5)
    x, y = _pair(shape, seed=10)
    gs, gc = torch.ones(shape[:2]), torch.full(shape[:2], 0.3)
    s, c, gx, gy = _stats_and_grads(tri, x, y, cfg, gs, gc)
    s64, c64, gx64, gy64 = _stats_and_grads(reference, x.double(), y.double(), cfg, gs.double(), gc.double())
    for a, b, what in ((s, s64, "ssim"), (c, c64, "cs"), (gx, gx64, "grad img1"), (gy, gy64, "grad img2")):
        _assert_rel(a, b, what=what)
    _assert_rel(tri.ssim_map(x, y, cfg), reference.ssim_map(x.double(), y.double(), cfg), what="map")
