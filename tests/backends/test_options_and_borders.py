"""Every backend at the edges of the options and shapes: windows and constants, tiny images and
borders, odd sizes, a photograph against scikit-image.

The reference is evaluated in float64 on the very inputs a backend saw (fp32 inputs are exact in
float64), so each check measures a backend's own error, not the fp32 reference's round-off.
"""

import pytest
import torch

import splatloss
from conftest import (
    DTYPES,
    FP64_REL,
    MAX_WINDOW,
    TOL,
    assert_rel,
    backend_params,
    device_for,
    has_cuda,
    make_pair,
    photo_arrays,
    side,
)
from splatloss import reference
from splatloss.config import SSIMConfig


def _f64(t):
    return t.detach().double().cpu().requires_grad_(True)


def _get(name):
    return splatloss.backends.get(name)


WINDOW_OPTIONS = [
    dict(window="uniform", window_size=7),
    dict(window_size=5, sigma=0.7, c1=0.001, c2=0.002, data_range=2.0),
    dict(window_size=3, padding="reflect", k1=0.02, k2=0.05),
    dict(window_size=15, sigma=3.0, padding="same"),
    dict(window_size=31, sigma=5.0, padding="reflect"),
    # box window, C1 / C2 given, images in [0, 255] (moments shifted by data_range / 2)
    dict(window="uniform", window_size=7, c1=6.5, c2=58.5, data_range=255.0, padding="same"),
]


def _backend_dtypes():
    out = []
    for p in backend_params(slow_triton=True):
        for dtype in (torch.float32, torch.float64):
            if dtype in DTYPES[p.values[0]]:
                out.append(pytest.param(*p.values, dtype, marks=p.marks, id=f"{p.id}-{str(dtype)[6:]}"))
    return out


@pytest.mark.parametrize("kw", WINDOW_OPTIONS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
@pytest.mark.parametrize("backend,dtype", _backend_dtypes())
def test_window_and_constant_options(backend, dtype, kw):
    """Public API, reduction="none", per-image weights on the upstream; float64 reference truth. The
    window and constants are runtime arguments of every kernel: float64 inputs hold them to round-off."""
    dev = device_for(backend)
    h, w = side(backend, 23, 16), side(backend, 29, 17)
    if MAX_WINDOW[backend] is not None and kw.get("window_size", 11) > MAX_WINDOW[backend]:
        pytest.skip("beyond this backend's window (tested in test_refusals.py)")
    x, y = make_pair((2, 3, h, w), dtype, seed=13, device=dev)
    scale = kw.get("data_range", 1.0) if kw.get("data_range", 1.0) > 2 else 1.0
    x, y = (x * scale).requires_grad_(True), (y * scale).requires_grad_(True)
    got = splatloss.ssim(x, y, backend=backend, reduction="none", **kw)
    up = torch.tensor([1.0, -2.0], dtype=torch.float64)
    got_g = torch.autograd.grad((got * up.to(got)).sum(), (x, y))
    x6, y6 = _f64(x), _f64(y)
    ref6 = splatloss.ssim(x6, y6, backend="reference", reduction="none", **kw)
    ref6_g = torch.autograd.grad((ref6 * up).sum(), (x6, y6))
    tol_v, tol_g = (FP64_REL, FP64_REL) if dtype == torch.float64 else (TOL[backend]["values"], TOL[backend]["grads"])
    assert_rel(got, ref6, tol_v, "ssim")
    for a, b, what in zip(got_g, ref6_g, ("grad x", "grad y")):
        assert_rel(a, b, tol_g, what)
    cs = splatloss.ssim_map(x.detach(), y.detach(), backend=backend, return_cs=True, **kw)[1]
    cs6 = splatloss.ssim_map(x6.detach(), y6.detach(), backend="reference", return_cs=True, **kw)[1]
    assert_rel(cs.mean(dim=(1, 2, 3)), cs6.mean(dim=(1, 2, 3)), tol_v, "cs mean")


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


def _odd_size_cases():
    """Every backend x entry; MS-SSIM at 165x167 in the Triton interpreter is left to
    tests/backends/test_ms_ssim.py's 163x171 case (slow there)."""
    out = []
    for p in backend_params(slow_triton=True) + [pytest.param("reference", id="reference")]:
        for what in ("ssim", "ssim-same", "ms_ssim", "ms_ssim-tau"):
            if what.startswith("ms") and p.values[0] == "triton" and not has_cuda():
                continue
            out.append(pytest.param(*p.values, what, marks=p.marks, id=f"{p.id}-{what}"))
    return out


@pytest.mark.parametrize("backend,what", _odd_size_cases())
def test_every_pixel_gets_a_finite_gradient_at_odd_sizes(backend, what):
    """165x167 (odd at every pyramid scale for MS-SSIM): no row or column dropped by a border."""
    dev = device_for(backend)
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
    from _truth import skimage_ssim, to_torch

    h, w = side(backend, 64, 16), side(backend, 80, 16)
    a, b = photo_arrays(h, w, seed=3)
    x, y = to_torch(a), to_torch(b)
    got = splatloss.ssim(x.float().to(device_for(backend)), y.float().to(device_for(backend)), backend=backend)
    # fp32 against scikit-image's float64: the backends' value tolerance of an O(1) number
    assert abs(float(got) - skimage_ssim(a, b)) <= TOL[backend]["values"]
