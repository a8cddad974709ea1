"""Every backend against the float64 reference: SSIM / cs maps and means, both images' gradients.

The reference is evaluated in float64 on the very inputs a backend saw (fp32 inputs are exact in
float64), so each check measures a backend's own error, not the fp32 reference's round-off.
"""

import pytest
import torch

import splatloss
from conftest import (
    DTYPES,
    FP64,
    MAP_ATOL_FP32,
    MAX_WINDOW,
    PADDINGS,
    TOL,
    assert_rel,
    backend_cases,
    backend_params,
    device_for,
    make_pair,
    side,
)
from splatloss import reference
from splatloss.config import SSIMConfig


def _f64(t):
    return t.detach().double().cpu().requires_grad_(True)


def _get(name):
    return splatloss.backends.get(name)


@pytest.mark.parametrize(
    "backend,channels,padding",
    backend_cases([(c, p) for c in (1, 5) for p in PADDINGS]) + backend_cases([(3, p) for p in PADDINGS]),
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_ssim_map_and_cs_map_values_and_both_gradients(backend, dtype, channels, padding):
    """Both maps used under random per-pixel upstreams, both images needing gradients (public API),
    then the SSIM map alone (the cs output unused: a None upstream inside the backward)."""
    if dtype not in DTYPES[backend]:
        pytest.skip(f"{backend} refuses {dtype} (tested in test_errors.py)")
    dev = device_for(backend)
    h, w = side(backend, 37, 16), side(backend, 53, 17)
    cfg = dict(padding=padding)
    x, y = make_pair((2, channels, h, w), dtype, seed=channels, device=dev)
    x.requires_grad_(True), y.requires_grad_(True)
    s, c = splatloss.ssim_map(x, y, backend=backend, return_cs=True, **cfg)
    x6, y6 = _f64(x), _f64(y)
    s6, c6 = splatloss.ssim_map(x6, y6, backend="reference", return_cs=True, **cfg)
    g = torch.Generator().manual_seed(99)
    up_s = torch.randn(s6.shape, generator=g, dtype=torch.float64)
    up_c = torch.randn(s6.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad((s * up_s.to(s)).sum() + (c * up_c.to(c)).sum(), (x, y), retain_graph=True)
    exp = torch.autograd.grad((s6 * up_s).sum() + (c6 * up_c).sum(), (x6, y6), retain_graph=True)
    only = torch.autograd.grad((s * up_s.to(s)).sum(), (x, y))
    only6 = torch.autograd.grad((s6 * up_s).sum(), (x6, y6))
    assert s.shape == s6.shape and c.shape == c6.shape
    for a in got + only:
        assert a.dtype == dtype and a.device == x.device
    pairs = [(s, s6, "ssim map"), (c, c6, "cs map")]
    gpairs = [(a, b, f"grad {i}") for i, (a, b) in enumerate(zip(got + only, exp + only6))]
    if dtype == torch.float64:
        for a, b, what in pairs + gpairs:
            torch.testing.assert_close(a.detach().cpu(), b.detach(), atol=FP64[0], rtol=FP64[1], msg=what)
    elif backend == "triton":
        for a, b, what in pairs:
            assert_rel(a, b, TOL[backend]["values"], what)
        for a, b, what in gpairs:
            assert_rel(a, b, TOL[backend]["grads"], what)
    else:
        # per pixel: map values to 1e-5, gradients (O(5)) to 4e-5 (measured ~2e-6 / ~8e-6)
        for a, b, what in pairs:
            torch.testing.assert_close(a.detach().double().cpu(), b.detach(), atol=MAP_ATOL_FP32["values"], rtol=0)
        for a, b, what in gpairs:
            torch.testing.assert_close(a.double().cpu(), b, atol=MAP_ATOL_FP32["grads"], rtol=0, msg=what)


@pytest.mark.parametrize("padding", PADDINGS)
def test_ssim_stats_values_and_both_gradients(backend, padding):
    """Backend object: SSIM and cs means per (B, C) under random per-(B, C) upstreams on both."""
    dev = device_for(backend)
    cfg = SSIMConfig(padding=padding)
    x, y = make_pair((3, 2, side(backend, 37, 16), side(backend, 53, 17)), seed=5, device=dev)
    x.requires_grad_(True), y.requires_grad_(True)
    up = [torch.randn(3, 2, generator=torch.Generator().manual_seed(i), dtype=torch.float64) for i in range(2)]
    got = _get(backend).ssim_stats(x, y, cfg)
    got_g = torch.autograd.grad((got[0] * up[0].to(got[0])).sum() + (got[1] * up[1].to(got[1])).sum(), (x, y))
    x6, y6 = _f64(x), _f64(y)
    ref = reference.ssim_stats(x6, y6, cfg)
    ref_g = torch.autograd.grad((ref[0] * up[0]).sum() + (ref[1] * up[1]).sum(), (x6, y6))
    assert got[0].dtype == torch.float32 and got[0].shape == (3, 2)
    for a, b, what in zip(got, ref, ("ssim mean", "cs mean")):
        assert_rel(a, b, TOL[backend]["values"], what)
    for a, b, what in zip(got_g, ref_g, ("grad x", "grad y")):
        assert a.dtype == torch.float32
        assert_rel(a, b, TOL[backend]["grads"], what)


WINDOW_OPTIONS = [
    dict(window="uniform", window_size=7),
    dict(window_size=5, sigma=0.7, c1=0.001, c2=0.002, data_range=2.0),
    dict(window_size=3, padding="reflect", k1=0.02, k2=0.05),
    dict(window_size=15, sigma=3.0, padding="same"),
    dict(window_size=31, sigma=5.0, padding="reflect"),
    # box window, C1 / C2 given, images in [0, 255] (moments shifted by data_range / 2)
    dict(window="uniform", window_size=7, c1=6.5, c2=58.5, data_range=255.0, padding="same"),
]


@pytest.mark.parametrize("kw", WINDOW_OPTIONS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_window_and_constant_options(backend, kw):
    """Public API, reduction="none", per-image weights on the upstream; float64 reference truth."""
    dev = device_for(backend)
    h, w = side(backend, 37, 16), side(backend, 53, 17)
    if MAX_WINDOW[backend] is not None and kw.get("window_size", 11) > MAX_WINDOW[backend]:
        pytest.skip("beyond this backend's window (tested in test_errors.py)")
    x, y = make_pair((2, 3, h, w), seed=13, device=dev)
    scale = kw.get("data_range", 1.0) if kw.get("data_range", 1.0) > 2 else 1.0
    x, y = (x * scale).requires_grad_(True), (y * scale).requires_grad_(True)
    got = splatloss.ssim(x, y, backend=backend, reduction="none", **kw)
    up = torch.tensor([1.0, -2.0], dtype=torch.float64)
    got_g = torch.autograd.grad((got * up.to(got)).sum(), (x, y))
    x6, y6 = _f64(x), _f64(y)
    ref6 = splatloss.ssim(x6, y6, backend="reference", reduction="none", **kw)
    ref6_g = torch.autograd.grad((ref6 * up).sum(), (x6, y6))
    assert_rel(got, ref6, TOL[backend]["values"], "ssim")
    for a, b, what in zip(got_g, ref6_g, ("grad x", "grad y")):
        assert_rel(a, b, TOL[backend]["grads"], what)
    cs = splatloss.ssim_map(x.detach(), y.detach(), backend=backend, return_cs=True, **kw)[1]
    cs6 = splatloss.ssim_map(x6.detach(), y6.detach(), backend="reference", return_cs=True, **kw)[1]
    assert_rel(cs.mean(dim=(1, 2, 3)), cs6.mean(dim=(1, 2, 3)), TOL[backend]["values"], "cs mean")


@pytest.mark.parametrize(
    "shape,padding,window_size",
    [
        ((1, 2, 6, 7), "reflect", 11),  # mirror images at both borders of every row and column
        ((2, 1, 3, 4), "same", 11),  # image smaller than the window
        ((1, 1, 11, 12), "valid", 11),  # a single map row
        ((1, 1, 1, 1), "same", 3),  # one pixel
        ((1, 3, 17, 16), "reflect", 31),  # the largest window, reflect at its minimum size
        ((1, 4, 13, 21), "valid", 3),  # four channels, odd sides
    ],
)
def test_tiny_images_and_borders(backend, shape, padding, window_size):
    """Backend object: stats, both gradients and the map at the edges of what each padding allows."""
    dev = device_for(backend)
    cfg = SSIMConfig(padding=padding, window_size=window_size, sigma=5.0 if window_size == 31 else 1.5)
    x, y = make_pair(shape, seed=10, device=dev)
    x.requires_grad_(True), y.requires_grad_(True)
    gs, gc = torch.ones(shape[:2], dtype=torch.float64), torch.full(shape[:2], 0.3, dtype=torch.float64)
    b = _get(backend)
    s, c = b.ssim_stats(x, y, cfg)
    gx, gy = torch.autograd.grad((s * gs.to(s)).sum() + (c * gc.to(c)).sum(), (x, y))
    x6, y6 = _f64(x), _f64(y)
    s6, c6 = reference.ssim_stats(x6, y6, cfg)
    gx6, gy6 = torch.autograd.grad((s6 * gs).sum() + (c6 * gc).sum(), (x6, y6))
    tol = TOL[backend]
    for a, r, what, t in (
        (s, s6, "ssim", "values"),
        (c, c6, "cs", "values"),
        (gx, gx6, "grad x", "grads"),
        (gy, gy6, "grad y", "grads"),
    ):
        assert_rel(a, r, tol[t], what)
    assert_rel(
        b.ssim_map(x.detach(), y.detach(), cfg), reference.ssim_map(x6.detach(), y6.detach(), cfg), tol["map"], "map"
    )


@pytest.mark.parametrize("what", ["ssim", "ssim-same", "ms_ssim", "ms_ssim-tau"])
@pytest.mark.parametrize("backend", backend_params(slow_triton=True) + ["reference"])
def test_every_pixel_gets_a_finite_gradient_at_odd_sizes(backend, what):
    """165x167 (odd at every pyramid scale for MS-SSIM): no row or column dropped by a border."""
    dev = device_for(backend)
    if what.startswith("ms_ssim") and backend == "triton" and dev.type == "cpu":
        pytest.skip("MS-SSIM at 165x167 in the Triton interpreter: tests/backends/test_ms_ssim.py (slow)")
    hw = (165, 167) if what.startswith("ms") else (side(backend, 165, 17), side(backend, 167, 17))
    x, y = make_pair((1, 2, *hw), seed=21, device=dev)
    x.requires_grad_(True), y.requires_grad_(True)
    fn = {
        "ssim": lambda: splatloss.ssim(x, y, backend=backend),
        "ssim-same": lambda: splatloss.ssim(x, y, backend=backend, padding="same"),
        "ms_ssim": lambda: splatloss.ms_ssim(x, y, backend=backend),
        "ms_ssim-tau": lambda: splatloss.ms_ssim(x, y, backend=backend, tau=0.01),
    }[what]
    gx, gy = torch.autograd.grad(fn(), (x, y))
    assert bool((gx != 0).all()) and bool((gy != 0).all())
    assert bool(torch.isfinite(gx).all()) and bool(torch.isfinite(gy).all())


@pytest.mark.parametrize("backend", backend_params())
def test_photograph_matches_scikit_image(backend):
    """A real photograph and a plausible rendering of it: ``ssim`` equals scikit-image's."""
    from _truth import skimage_ssim

    from conftest import photo_pair

    h, w = side(backend, 64, 16), side(backend, 80, 16)
    x, y, a, b = photo_pair(h, w, seed=3)
    got = splatloss.ssim(x.float().to(device_for(backend)), y.float().to(device_for(backend)), backend=backend)
    # fp32 against scikit-image's float64: the backends' value tolerance of an O(1) number
    assert abs(float(got) - skimage_ssim(a, b)) <= TOL[backend]["values"]
