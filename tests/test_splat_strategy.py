"""Densification / pruning: the 3DGS rules on real renders, Adam moments kept in step."""

import math

import pytest
import torch

pytest.importorskip("gsplat")

from splatloss.splat.gaussians import Gaussians  # noqa: E402
from splatloss.splat.renderer import render  # noqa: E402
from splatloss.splat.scenes import View, look_at  # noqa: E402
from splatloss.splat.strategy import DensifyStrategy  # noqa: E402


def _setup(n=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    means = (torch.rand(n, 3, generator=g) * 2 - 1) * 0.7
    gs = Gaussians.from_points(means, torch.rand(n, 3, generator=g), seed=seed)
    with torch.no_grad():
        gs.log_scales[: n // 2] = math.log(0.02)  # small: duplicated when their gradient is high
        gs.log_scales[n // 2 :] = math.log(0.15)  # large: split
        gs.opacity_logits[:3] = math.log(0.001 / 0.999)  # nearly transparent: pruned
    view = View(
        torch.rand(24, 24, 3, generator=g),
        torch.tensor(look_at((0.2, -3.0, 1.0)), dtype=torch.float32),
        torch.tensor([[30.0, 0, 12], [0, 30, 12], [0, 0, 1]]),
        24,
        24,
    )
    opt = torch.optim.Adam([{"params": [getattr(gs, k)], "lr": 1e-3, "name": k} for k in Gaussians.param_names])
    return gs, view, opt


def _step(gs, view, opt, strat, step):
    out = render(gs, view)
    strat.pre_backward(out)
    loss = (out["image"] - view.image).abs().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return strat.post_step(gs, opt, out, step), out


def test_refine_duplicates_splits_prunes_and_keeps_adam_state():
    gs, view, opt = _setup()
    strat = DensifyStrategy(
        extent=1.0, grow_grad2d=0.0, grow_scale3d=0.05, refine_start=0, refine_every=2, max_gaussians=None
    )
    next(gr for gr in opt.param_groups if gr["name"] == "log_scales")["lr"] = 0.0  # scales stay known
    assert _step(gs, view, opt, strat, 1)[0] is False  # accumulate only
    visible_count = strat.count.clone()
    changed, out = _step(gs, view, opt, strat, 2)
    assert changed
    st = strat.last_stats
    drawn = int((visible_count > 0).sum())
    assert drawn > 20
    # grow_grad2d = 0: every drawn Gaussian with a non-zero gradient grows.
    assert st["duplicated"] > 0 and st["split"] > 0 and st["pruned"] >= 1
    assert gs.num == 60 - st["split"] - st["pruned"] + st["duplicated"] + 2 * st["split"]
    for k in Gaussians.param_names:
        p = getattr(gs, k)
        group = next(gr for gr in opt.param_groups if gr["name"] == k)
        assert group["params"][0] is p and p.shape[0] == gs.num
        state = opt.state[p]
        assert state["exp_avg"].shape == p.shape and state["exp_avg_sq"].shape == p.shape
        # New rows (appended at the end) start with zero moments.
        n_new = st["duplicated"] + 2 * st["split"]
        assert (state["exp_avg"][-n_new:] == 0).all() and (state["exp_avg_sq"][-n_new:] == 0).all()
    # Split children have scales / 1.6 and their parent's colour.
    children = gs.log_scales[-2 * st["split"] :].detach()
    assert torch.allclose(children, torch.full_like(children, math.log(0.15 / 1.6)), atol=1e-5)
    # Pruned ones are gone: no surviving Gaussian has the pruned opacity.
    assert (torch.sigmoid(gs.opacity_logits) > 0.0015).all()
    # Training continues on the new tensors.
    changed, _ = _step(gs, view, opt, strat, 3)
    assert not changed and all(getattr(gs, k).grad is not None for k in Gaussians.param_names)


def test_high_threshold_grows_nothing_and_cap_is_respected():
    gs, view, opt = _setup()
    strat = DensifyStrategy(extent=1.0, grow_grad2d=1e9, refine_start=0, refine_every=2)
    _step(gs, view, opt, strat, 1)
    _step(gs, view, opt, strat, 2)
    assert strat.last_stats["duplicated"] == 0 and strat.last_stats["split"] == 0
    assert gs.num == 60 - strat.last_stats["pruned"]

    gs, view, opt = _setup()
    strat = DensifyStrategy(
        extent=1.0, grow_grad2d=0.0, grow_scale3d=0.05, refine_start=0, refine_every=2, max_gaussians=64
    )
    _step(gs, view, opt, strat, 1)
    _step(gs, view, opt, strat, 2)
    assert strat.last_stats["duplicated"] + strat.last_stats["split"] == 4
    assert gs.num <= 64 + strat.last_stats["split"]


def test_opacity_reset_and_state_dict():
    gs, view, opt = _setup()
    strat = DensifyStrategy(extent=1.0, refine_start=10, reset_every=2, prune_opa=0.01)
    _step(gs, view, opt, strat, 1)
    _step(gs, view, opt, strat, 2)
    assert strat.n_resets == 1
    assert float(torch.sigmoid(gs.opacity_logits.detach()).max()) <= 0.02 + 1e-6
    sd = strat.state_dict()
    other = DensifyStrategy(extent=1.0)
    other.load_state_dict(sd)
    assert other.n_resets == 1 and torch.equal(other.grad2d, strat.grad2d)
    with pytest.raises(ValueError, match=r"missing keys \['count'\]"):
        other.load_state_dict({"grad2d": None, "n_resets": 0})


def test_after_refine_stop_nothing_changes():
    gs, view, opt = _setup()
    strat = DensifyStrategy(extent=1.0, grow_grad2d=0.0, refine_start=0, refine_stop=2, refine_every=2)
    _step(gs, view, opt, strat, 1)
    assert _step(gs, view, opt, strat, 2)[0] is False and gs.num == 60


def test_strategy_argument_errors():
    with pytest.raises(ValueError, match="extent out of range, got 0"):
        DensifyStrategy(extent=0)
    with pytest.raises(ValueError, match="refine_every must be an integer >= 1, got 0"):
        DensifyStrategy(extent=1.0, refine_every=0)
    with pytest.raises(ValueError, match="max_gaussians must be an integer >= 1 or None, got -5"):
        DensifyStrategy(extent=1.0, max_gaussians=-5)
    with pytest.raises(ValueError, match="prune_opa out of range, got 1.5"):
        DensifyStrategy(extent=1.0, prune_opa=1.5)
