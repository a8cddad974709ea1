"""End to end on the CPU: the renderer, the default scene, Adam and densification learn the scene."""

import math

import pytest
import torch

pytest.importorskip("gsplat")

from splatloss.splat.gaussians import Gaussians  # noqa: E402
from splatloss.splat.renderer import render  # noqa: E402
from splatloss.splat.scenes import default_scene  # noqa: E402
from splatloss.splat.strategy import DensifyStrategy  # noqa: E402


def _psnr(g, views):
    with torch.no_grad():
        mse = [float(((render(g, v)["image"].clamp(0, 1) - v.image) ** 2).mean()) for v in views]
    return sum(-10 * math.log10(m) for m in mse) / len(mse)


@pytest.mark.slow
def test_short_training_learns_held_out_views():
    torch.manual_seed(0)
    scene = default_scene(image_size=32, n_train=16, n_test=4, n_points=800, supersample=2)
    g = Gaussians.from_points(scene.points, scene.colors)
    lrs = {"means": 1e-3, "quats": 1e-3, "log_scales": 1e-2, "opacity_logits": 5e-2, "colors": 1e-2}
    opt = torch.optim.Adam([{"params": [getattr(g, k)], "lr": v, "name": k} for k, v in lrs.items()], eps=1e-15)
    strat = DensifyStrategy(
        extent=scene.extent, grow_grad2d=1e-3, refine_start=50, refine_every=50, refine_stop=200, max_gaussians=1500
    )
    before = _psnr(g, scene.test)
    for step in range(250):
        view = scene.train[step % len(scene.train)]
        out = render(g, view)
        strat.pre_backward(out)
        loss = (out["image"] - view.image).abs().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        strat.post_step(g, opt, out, step)
    after = _psnr(g, scene.test)
    assert g.num > 800  # densification grew the set
    print(f"held-out PSNR {before:.2f} -> {after:.2f} dB, {g.num} Gaussians")
    assert after > before + 6.0, (before, after)
