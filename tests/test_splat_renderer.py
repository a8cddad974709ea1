"""The CPU renderer: tile lists equal gsplat's, images equal a per-pixel loop written after gsplat's
CUDA rasterizer, gradients equal finite differences (float64)."""

import math

import pytest
import torch

pytest.importorskip("gsplat")

from gsplat.cuda._torch_impl import _fully_fused_projection, _isect_tiles, _quat_scale_to_covar_preci  # noqa: E402

from splatloss.splat.gaussians import Gaussians  # noqa: E402
from splatloss.splat.renderer import composite_tiles, isect_tiles, render  # noqa: E402
from splatloss.splat.scenes import View, look_at  # noqa: E402


def _view(w=20, h=14, eye=(0.3, -3.0, 1.0), f=18.0, dtype=torch.float32):
    return View(
        image=torch.zeros(h, w, 3),
        viewmat=torch.tensor(look_at(eye), dtype=dtype),
        K=torch.tensor([[f, 0, w / 2 + 0.3], [0, f, h / 2 - 0.2], [0, 0, 1]], dtype=dtype),
        width=w,
        height=h,
    )


def _scene(n=30, seed=0, opacity=(0.1, 0.7), scale=(-2.0, -1.0), dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    means = (torch.rand(n, 3, generator=g) * 2 - 1) * 0.8
    quats = torch.randn(n, 4, generator=g)
    log_scales = torch.rand(n, 3, generator=g) * (scale[1] - scale[0]) + scale[0]
    op = torch.rand(n, generator=g) * (opacity[1] - opacity[0]) + opacity[0]
    colors = torch.randn(n, 3, generator=g)
    gs = Gaussians(means, quats, log_scales, torch.logit(op), colors)
    return gs.to(dtype)


def _reference_image(gs, view, bg):
    """Per-pixel loop in float64 following gsplat's CUDA forward (rasterize_to_pixels_fwd)."""
    d = torch.float64
    means = gs.means.detach().to(d)
    covars, _ = _quat_scale_to_covar_preci(
        gs.quats.detach().to(d), gs.log_scales.detach().to(d).exp(), compute_preci=False
    )
    vm, K = view.viewmat.to(d), view.K.to(d)
    radii, m2d, depths, conics, _ = _fully_fused_projection(means, covars, vm[None], K[None], view.width, view.height)
    radii, m2d, depths, conics = radii[0], m2d[0], depths[0], conics[0]
    op = torch.sigmoid(gs.opacity_logits.detach().to(d))
    rgb = (gs.colors.detach().to(d) * 0.28209479177387814 + 0.5).clamp_min(0)
    order = [i for i in torch.argsort(depths).tolist() if (radii[i] > 0).all()]
    img = torch.zeros(view.height, view.width, 3, dtype=d)
    alpha = torch.zeros(view.height, view.width, dtype=d)
    stats = {"terminated": 0, "clamped": 0}
    for y in range(view.height):
        for x in range(view.width):
            T = 1.0
            c = torch.zeros(3, dtype=d)
            for i in order:
                dx, dy = x + 0.5 - m2d[i, 0], y + 0.5 - m2d[i, 1]
                a, b, cc = conics[i]
                sigma = 0.5 * (a * dx * dx + cc * dy * dy) + b * dx * dy
                if sigma < 0:
                    continue
                al = float(op[i] * torch.exp(-sigma))
                if al > 0.999:
                    stats["clamped"] += 1
                    al = 0.999
                if al < 1 / 255:
                    continue
                nT = T * (1 - al)
                if nT <= 1e-4:
                    stats["terminated"] += 1
                    break
                c += al * T * rgb[i]
                T = nT
            img[y, x] = c + T * torch.as_tensor(bg, dtype=d)
            alpha[y, x] = 1 - T
    return img, alpha, stats


def test_isect_tiles_matches_gsplat():
    gs = _scene(n=40, seed=1)
    view = _view(w=37, h=29)
    covars, _ = _quat_scale_to_covar_preci(gs.quats, gs.log_scales.exp(), compute_preci=False)
    radii, m2d, depths, _, _ = _fully_fused_projection(gs.means, covars, view.viewmat[None], view.K[None], 37, 29)
    ts, tw, th = 8, 5, 4
    per_ref, isect_ids, flat_ref = _isect_tiles(m2d, radii, depths, ts, tw, th)
    tiles, gids, per = isect_tiles(m2d[0], radii[0], depths[0], ts, tw, th)
    assert tiles.numel() > 40  # the scene overlaps many tiles
    assert torch.equal(per, per_ref[0].long())
    assert torch.equal(tiles, (isect_ids >> 32).long())
    assert torch.equal(gids, flat_ref.long())


COMPOSITORS = ["torch", "numba"]


@pytest.mark.parametrize("compositor", COMPOSITORS)
@pytest.mark.parametrize(
    "tile_size,groups,bg",
    [
        (8, 4, (0.0, 0.0, 0.0)),
        pytest.param(4, 1, (0.2, 0.5, 1.0), marks=pytest.mark.slow),
        pytest.param(16, 3, (1.0, 1.0, 1.0), marks=pytest.mark.slow),
    ],
)
def test_render_matches_per_pixel_loop(tile_size, groups, bg, compositor):
    # Include opaque, large Gaussians so some pixels terminate early (T <= 1e-4) and alphas clamp.
    gs = _scene(n=60, seed=2, opacity=(0.6, 0.99), scale=(-1.3, -0.4))
    view = _view(w=21, h=13)
    with torch.no_grad():  # three nearly opaque Gaussians centred on pixel centres: alpha clamps
        c2w = torch.linalg.inv(view.viewmat)
        for i, (px, py, z) in enumerate([(10.5, 6.5, 2.0), (3.5, 2.5, 2.2), (17.5, 9.5, 2.4)]):
            cam = torch.tensor([(px - view.K[0, 2]) / view.K[0, 0] * z, (py - view.K[1, 2]) / view.K[1, 1] * z, z])
            gs.means[i] = c2w[:3, :3] @ cam + c2w[:3, 3]
            gs.opacity_logits[i] = math.log(0.99995 / 0.00005)
    out = render(gs, view, background=bg, tile_size=tile_size, groups=groups, compositor=compositor)
    ref_img, ref_alpha, stats = _reference_image(gs, view, bg)
    assert out["image"].shape == (13, 21, 3) and out["alpha"].shape == (13, 21, 1)
    assert stats["terminated"] > 10 and stats["clamped"] > 0, stats  # the scene exercises both rules
    torch.testing.assert_close(out["image"].double(), ref_img, atol=2e-5, rtol=0)
    torch.testing.assert_close(out["alpha"][..., 0].double(), ref_alpha, atol=2e-5, rtol=0)


@pytest.mark.parametrize("compositor", COMPOSITORS)
def test_render_outputs_for_densification(compositor):
    gs = _scene(n=30, seed=3)
    out = render(gs, _view(), compositor=compositor)
    assert out["means2d"].shape == (30, 2) and out["radii"].shape == (30, 2)
    assert out["width"] == 20 and out["height"] == 14 and out["n_cameras"] == 1
    out["image"].sum().backward()
    g = out["means2d"].grad
    assert g is not None and g.shape == (30, 2)
    visible = (out["radii"] > 0).all(-1)
    assert visible.any() and (g[~visible] == 0).all() and (g[visible].abs().sum(-1) > 0).any()
    for name in Gaussians.param_names:
        assert getattr(gs, name).grad is not None and torch.isfinite(getattr(gs, name).grad).all()


@pytest.mark.parametrize("compositor", COMPOSITORS)
def test_max_per_tile_keeps_nearest(compositor):
    gs = _scene(n=40, seed=4, opacity=(0.5, 0.99), scale=(-1.2, -0.6))
    view = _view()
    full = render(gs, view, compositor=compositor)["image"]
    capped_big = render(gs, view, max_per_tile=1000, compositor=compositor)["image"]
    capped = render(gs, view, max_per_tile=2, compositor=compositor)["image"]
    torch.testing.assert_close(capped_big, full, atol=0, rtol=0)
    assert (capped - full).abs().max() > 1e-3


def test_composite_gradcheck_float64():
    g = torch.Generator().manual_seed(5)
    T, P, K = 2, 9, 5
    pix = torch.rand(T, P, 2, generator=g, dtype=torch.float64) * 4
    m2d = (torch.rand(T, K, 2, generator=g, dtype=torch.float64) * 4).requires_grad_()
    L = torch.rand(T, K, 2, 2, generator=g, dtype=torch.float64) * 0.4 + torch.eye(2, dtype=torch.float64) * 0.5
    cov = L @ L.transpose(-1, -2)
    inv = torch.linalg.inv(cov)
    con = torch.stack([inv[..., 0, 0], inv[..., 0, 1], inv[..., 1, 1]], -1).requires_grad_()
    opa = (torch.rand(T, K, generator=g, dtype=torch.float64) * 0.8 + 0.1).requires_grad_()
    col = torch.rand(T, K, 3, generator=g, dtype=torch.float64).requires_grad_()
    bg = torch.rand(3, generator=g, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: composite_tiles(pix, *a), (m2d, con, opa, col, bg), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("compositor", COMPOSITORS)
@pytest.mark.slow
def test_render_gradients_match_finite_differences_float64(compositor):
    gs = _scene(n=12, seed=6, opacity=(0.2, 0.8), scale=(-1.6, -1.0), dtype=torch.float64)
    view = _view(w=16, h=12, dtype=torch.float64)
    names = Gaussians.param_names
    w = torch.randn(12, 16, 4, generator=torch.Generator().manual_seed(7), dtype=torch.float64)

    def f(*params):
        g2 = Gaussians.__new__(Gaussians)
        torch.nn.Module.__init__(g2)
        for k, p in zip(names, params):
            g2.__dict__[k] = p  # plain tensors: gradcheck differentiates through them
        out = render(g2, view, background=(0.1, 0.2, 0.3), compositor=compositor)
        return (torch.cat([out["image"], out["alpha"]], -1) * w).sum()

    params = tuple(getattr(gs, k).detach().clone().requires_grad_() for k in names)
    assert torch.autograd.gradcheck(f, params, eps=1e-6, atol=1e-6, rtol=1e-4)


def test_compositors_agree_on_a_textured_scene():
    # The two CPU compositors on a realistic load (400 Gaussians, many layers): same image, alpha
    # and gradients of every parameter under a random upstream gradient, to fp32 round-off.
    gs = _scene(n=400, seed=8, opacity=(0.05, 0.95), scale=(-2.5, -1.5))
    view = _view(w=40, h=32, f=36.0)
    up = torch.randn(32, 40, 4, generator=torch.Generator().manual_seed(9))
    res = {}
    for comp in COMPOSITORS:
        gs.zero_grad(set_to_none=True)
        out = render(gs, view, background=(0.3, 0.1, 0.9), compositor=comp)
        (torch.cat([out["image"], out["alpha"]], -1) * up).sum().backward()
        res[comp] = (
            out["image"].detach(),
            out["alpha"].detach(),
            out["means2d"].grad.clone(),
            {k: getattr(gs, k).grad.clone() for k in ("means", "log_scales", "opacity_logits", "colors")},
        )
    a, b = res["torch"], res["numba"]
    torch.testing.assert_close(a[0], b[0], atol=2e-6, rtol=0)
    torch.testing.assert_close(a[1], b[1], atol=2e-6, rtol=0)
    # gradients normwise: measured <= 3.3e-7 of their scale (the former 1e-4 was 300x that)
    torch.testing.assert_close(a[2], b[2], atol=5e-6 * float(a[2].abs().max()), rtol=0)
    for k in a[3]:
        torch.testing.assert_close(a[3][k], b[3][k], atol=5e-6 * float(a[3][k].abs().max()), rtol=0)


def test_render_errors():
    gs = _scene(n=5)
    view = _view()
    with pytest.raises(ValueError, match="backend must be 'auto', 'cuda' or 'cpu', got 'gpu'"):
        render(gs, view, backend="gpu")
    with pytest.raises(ValueError, match="backend='cuda' needs the Gaussians on a CUDA device"):
        render(gs, view, backend="cuda")
    with pytest.raises(ValueError, match=r"background must have 3 values \(RGB\), got shape \(4,\)"):
        render(gs, view, background=(0, 0, 0, 0))
    bad = View(view.image, torch.eye(3), view.K, view.width, view.height)
    with pytest.raises(ValueError, match=r"expected viewmat \[4, 4\] and K \[3, 3\], got \(3, 3\)"):
        render(gs, bad)
    with pytest.raises(ValueError, match="compositor must be 'auto', 'numba' or 'torch', got 'c'"):
        render(gs, view, compositor="c")
    with pytest.raises(TypeError, match="view must have viewmat, K, width and height"):
        render(gs, object())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="gsplat's CUDA rasterizer needs a GPU")
def test_cuda_matches_cpu():
    gs = _scene(n=200, seed=10, opacity=(0.1, 0.9), scale=(-2.5, -1.5))
    view = _view(w=40, h=32, f=36.0)
    cpu = render(gs, view, background=(0.2, 0.3, 0.4))
    gpu = render(
        gs.cuda(), View(view.image.cuda(), view.viewmat.cuda(), view.K.cuda(), 40, 32), background=(0.2, 0.3, 0.4)
    )
    torch.testing.assert_close(gpu["image"].cpu(), cpu["image"], atol=1e-4, rtol=0)
    torch.testing.assert_close(gpu["alpha"].cpu(), cpu["alpha"], atol=1e-4, rtol=0)
    assert torch.equal(gpu["radii"].cpu().reshape(-1, 2), cpu["radii"])


@pytest.mark.parametrize("compositor", COMPOSITORS)
def test_nothing_in_view_renders_background(compositor):
    gs = _scene(n=10, seed=11)
    with torch.no_grad():
        gs.means += torch.tensor([0.0, -10.0, 0.0])  # behind the camera at y = -3
    out = render(gs, _view(), background=(0.25, 0.5, 0.75), compositor=compositor)
    assert (out["radii"] == 0).all()
    torch.testing.assert_close(out["image"], torch.tensor([0.25, 0.5, 0.75]).expand(14, 20, 3))
    assert (out["alpha"] == 0).all()
    out["image"].sum().backward()
    assert (gs.means.grad == 0).all() and (gs.colors.grad == 0).all()
