"""View-dependent colour: spherical harmonics up to degree 3 in the Gaussians, the CPU renderer,
densification, the .ply (3DGS layout) and training with 3DGS's degree schedule."""

import math

import numpy as np
import pytest
import torch

pytest.importorskip("gsplat")

from test_train import make_cfg  # noqa: E402

from splatloss.lightning.module import SplatModule  # noqa: E402
from splatloss.splat.gaussians import SH_C0, Gaussians, read_ply  # noqa: E402
from splatloss.splat.renderer import render  # noqa: E402
from splatloss.splat.scenes import View, look_at  # noqa: E402
from splatloss.splat.strategy import DensifyStrategy  # noqa: E402
from splatloss.train import train  # noqa: E402

pytestmark = pytest.mark.usefixtures("scenes_built_once")

COMPOSITORS = ["torch", "numba"]
EYE = (0.3, -3.0, 1.0)

# The real SH constants as the 3DGS reference writes them out (utils/sh_utils.py), not gsplat's.
C1 = 0.4886025119029199
C2 = (1.0925484305920792, -1.0925484305920792, 0.31539156525252005, -1.0925484305920792, 0.5462742152960396)
C3 = (
    -0.5900435899266435,
    2.890611442640554,
    -0.4570457994644658,
    0.3731763325901154,
    -0.4570457994644658,
    1.445305721320277,
    -0.5900435899266435,
)


def eval_sh_3dgs(deg, sh, dirs):
    """3DGS's ``eval_sh``: ``sh [..., 3, (deg + 1)^2]`` (channel, coefficient), unit ``dirs [..., 3]``."""
    result = SH_C0 * sh[..., 0]
    if deg > 0:
        x, y, z = dirs[..., 0:1], dirs[..., 1:2], dirs[..., 2:3]
        result = result - C1 * y * sh[..., 1] + C1 * z * sh[..., 2] - C1 * x * sh[..., 3]
        if deg > 1:
            xx, yy, zz = x * x, y * y, z * z
            xy, yz, xz = x * y, y * z, x * z
            result = (
                result
                + C2[0] * xy * sh[..., 4]
                + C2[1] * yz * sh[..., 5]
                + C2[2] * (2.0 * zz - xx - yy) * sh[..., 6]
                + C2[3] * xz * sh[..., 7]
                + C2[4] * (xx - yy) * sh[..., 8]
            )
            if deg > 2:
                result = (
                    result
                    + C3[0] * y * (3 * xx - yy) * sh[..., 9]
                    + C3[1] * xy * z * sh[..., 10]
                    + C3[2] * y * (4 * zz - xx - yy) * sh[..., 11]
                    + C3[3] * z * (2 * zz - 3 * xx - 3 * yy) * sh[..., 12]
                    + C3[4] * x * (4 * zz - xx - yy) * sh[..., 13]
                    + C3[5] * z * (xx - yy) * sh[..., 14]
                    + C3[6] * x * (xx - 3 * yy) * sh[..., 15]
                )
    return result


def _view(w=20, h=14, dtype=torch.float32):
    return View(
        image=torch.zeros(h, w, 3),
        viewmat=torch.tensor(look_at(EYE), dtype=dtype),
        K=torch.tensor([[18.0, 0, w / 2 + 0.3], [0, 18.0, h / 2 - 0.2], [0, 0, 1]], dtype=dtype),
        width=w,
        height=h,
    )


def _gaussians(n=30, seed=0, sh_degree=3, rest_scale=0.3, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    means = (torch.rand(n, 3, generator=g) * 2 - 1) * 0.8
    quats = torch.randn(n, 4, generator=g)
    log_scales = torch.rand(n, 3, generator=g) - 2.0
    op = torch.rand(n, generator=g) * 0.6 + 0.2
    colors = torch.randn(n, 3, generator=g) * 0.5
    rest = None
    if sh_degree > 0:
        rest = torch.randn(n, (sh_degree + 1) ** 2 - 1, 3, generator=g) * rest_scale
    return Gaussians(means, quats, log_scales, torch.logit(op), colors, rest).to(dtype)


def test_degree_0_is_view_independent_colour_as_before():
    g0 = _gaussians(sh_degree=0)
    assert g0.sh_degree == 0 and g0.param_names == Gaussians.param_names and not hasattr(g0, "sh_rest")
    assert set(g0.state_dict()) == set(Gaussians.param_names)
    # Gaussians of degree 3 evaluated at degree 0 render the same image, bit for bit, whatever sh_rest
    # holds; and sh_rest gets no gradient there.
    g3 = _gaussians(sh_degree=3)
    with torch.no_grad():
        for k in Gaussians.param_names:
            getattr(g3, k).copy_(getattr(g0, k))
    assert g3.active_sh_degree == 0 and float(g3.sh_rest.detach().abs().sum()) > 1.0
    for compositor in COMPOSITORS:
        a = render(g0, _view(), compositor=compositor, background=(0.1, 0.2, 0.3))
        b = render(g3, _view(), compositor=compositor, background=(0.1, 0.2, 0.3))
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["alpha"], b["alpha"])
        a["image"].sum().backward()
        b["image"].sum().backward()
        for k in Gaussians.param_names:
            assert torch.equal(getattr(g0, k).grad, getattr(g3, k).grad), k
        assert g3.sh_rest.grad is None
        g0.zero_grad(set_to_none=True)
        g3.zero_grad(set_to_none=True)


def test_zero_higher_coefficients_render_as_degree_0():
    # 3DGS initialises sh_rest at zero: raising the degree changes nothing until they are trained.
    g = Gaussians.random(40, extent=0.8, seed=1, sh_degree=3)
    assert tuple(g.sh_rest.shape) == (40, 15, 3) and not g.sh_rest.any()
    base = render(g, _view())["image"]
    for d in (1, 2, 3):
        g.set_active_sh_degree(d)
        assert torch.equal(render(g, _view())["image"], base), d


@pytest.mark.parametrize("compositor", COMPOSITORS)
@pytest.mark.parametrize("degree", [1, 2, 3])
def test_render_evaluates_sh_toward_the_camera(degree, compositor):
    """The colour of each Gaussian is 3DGS's eval_sh at the direction camera centre -> mean, + 0.5,
    clamped at 0: the render equals that of degree-0 Gaussians whose DC term gives that colour."""
    d64 = torch.float64
    g = _gaussians(n=30, seed=2 + degree, sh_degree=degree, dtype=d64)
    g.set_active_sh_degree(degree)
    view = _view(dtype=d64)
    dirs = g.means.detach() - torch.tensor(EYE, dtype=d64)  # the camera centre is look_at's eye
    dirs = dirs / dirs.norm(dim=-1, keepdim=True)
    sh = torch.cat([g.colors.detach()[:, None], g.sh_rest.detach()], 1).transpose(1, 2)  # [N, 3, K]
    rgb = (eval_sh_3dgs(degree, sh, dirs) + 0.5).clamp_min(0.0)
    # The view-dependent part matters here: it moves the colours by more than 0.05 on average.
    assert float((rgb - (SH_C0 * g.colors.detach() + 0.5).clamp_min(0)).abs().mean()) > 0.05
    flat = _gaussians(n=30, seed=2 + degree, sh_degree=0, dtype=d64)  # the same Gaussians, DC only
    assert torch.equal(flat.means, g.means)
    with torch.no_grad():
        flat.colors.copy_((rgb - 0.5) / SH_C0)  # in float64 (the constructor would round to float32)
    got = render(g, view, compositor=compositor, background=(0.1, 0.2, 0.3))["image"]
    want = render(flat, view, compositor=compositor, background=(0.1, 0.2, 0.3))["image"]
    assert float(want.detach().abs().max()) > 0.1
    # float64 through both renders: round-off (measured 2.2e-16; the reversed direction gives 0.39-0.60).
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("compositor", COMPOSITORS)
def test_gradient_reaches_sh_rest(compositor):
    g = _gaussians(n=30, seed=7, sh_degree=3)
    g.set_active_sh_degree(3)
    out = render(g, _view(), compositor=compositor)
    (out["image"] * torch.linspace(0, 1, 3)).sum().backward()
    grad = g.sh_rest.grad
    assert grad is not None and grad.shape == (30, 15, 3) and torch.isfinite(grad).all()
    drawn = (out["radii"] > 0).all(-1)
    assert (grad[drawn].abs().sum(dim=(1, 2)) > 0).all() and (grad[~drawn] == 0).all()
    # At degree 1 only the first three higher coefficients are used.
    g.zero_grad(set_to_none=True)
    g.set_active_sh_degree(1)
    render(g, _view(), compositor=compositor)["image"].sum().backward()
    assert g.sh_rest.grad[:, :3].abs().sum() > 0 and (g.sh_rest.grad[:, 3:] == 0).all()


@pytest.mark.slow
def test_render_gradients_match_finite_differences_at_degree_3_float64():
    gs = _gaussians(n=10, seed=8, sh_degree=3, dtype=torch.float64)
    view = _view(w=16, h=12, dtype=torch.float64)
    names = gs.param_names
    w = torch.randn(12, 16, 3, generator=torch.Generator().manual_seed(9), dtype=torch.float64)

    def f(*params):
        g2 = Gaussians.__new__(Gaussians)
        torch.nn.Module.__init__(g2)
        for k, p in zip(names, params):
            g2.__dict__[k] = p  # plain tensors: gradcheck differentiates through them
        g2.sh_degree = g2.active_sh_degree = 3
        return (render(g2, view, background=(0.1, 0.2, 0.3), compositor="numba")["image"] * w).sum()

    params = tuple(getattr(gs, k).detach().clone().requires_grad_() for k in names)
    assert torch.autograd.gradcheck(f, params, eps=1e-6, atol=1e-6, rtol=1e-4)


def test_errors():
    z = torch.zeros
    with pytest.raises(
        ValueError, match=r"sh_rest must have shape \(2, K, 3\) with K in \[0, 3, 8, 15\].*got \(2, 5, 3\)"
    ):
        Gaussians(z(2, 3), z(2, 4), z(2, 3), z(2), z(2, 3), z(2, 5, 3))
    with pytest.raises(ValueError, match=r"sh_degree must be an integer in 0..3, got 4"):
        Gaussians.from_points(torch.rand(5, 3), sh_degree=4)
    g = Gaussians.random(4, sh_degree=2)
    with pytest.raises(ValueError, match=r"degree must be an integer in 0..2 \(the Gaussians' sh_degree\), got 3"):
        g.set_active_sh_degree(3)


def test_densification_carries_sh_rest_and_its_adam_state():
    g = Gaussians.random(60, extent=0.8, seed=3, sh_degree=3)
    with torch.no_grad():
        g.sh_rest.normal_(0, 0.2, generator=torch.Generator().manual_seed(4))
        g.log_scales[:30] = math.log(0.02)  # small: duplicated
        g.log_scales[30:] = math.log(0.15)  # large: split
        g.opacity_logits[:3] = math.log(0.001 / 0.999)  # pruned
    g.set_active_sh_degree(3)
    v = _view(24, 24)
    view = View(torch.rand(24, 24, 3, generator=torch.Generator().manual_seed(5)), v.viewmat, v.K, 24, 24)
    opt = torch.optim.Adam([{"params": [getattr(g, k)], "lr": 1e-3, "name": k} for k in g.param_names])
    strat = DensifyStrategy(extent=1.0, grow_grad2d=0.0, grow_scale3d=0.05, refine_start=0, refine_every=2)
    for step in (1, 2):
        out = render(g, view)
        strat.pre_backward(out)
        opt.zero_grad()
        (out["image"] - view.image).abs().mean().backward()
        opt.step()
        rows_before = {tuple(r.flatten().tolist()) for r in g.sh_rest.detach()}
        changed = strat.post_step(g, opt, out, step)
    st = strat.last_stats
    assert changed and st["duplicated"] > 0 and st["split"] > 0 and st["pruned"] >= 1
    p = g.sh_rest
    group = next(gr for gr in opt.param_groups if gr["name"] == "sh_rest")
    assert group["params"][0] is p and p.shape == (g.num, 15, 3)
    state = opt.state[p]
    assert state["exp_avg"].shape == p.shape and state["exp_avg_sq"].shape == p.shape
    n_new = st["duplicated"] + 2 * st["split"]
    assert (state["exp_avg"][-n_new:] == 0).all() and (state["exp_avg"][:-n_new] != 0).any()
    # Every Gaussian keeps its own coefficients or its parent's (duplicates and both split children).
    rows = [tuple(r.flatten().tolist()) for r in p.detach()]
    assert set(rows) <= rows_before and len(set(rows)) == g.num - n_new + st["split"]


def test_ply_round_trip_at_degree_3(tmp_path):
    g = _gaussians(n=23, seed=11, sh_degree=3)
    path = tmp_path / "point_cloud.ply"
    g.export_ply(str(path))
    d = read_ply(str(path))
    names = list(d)
    rest = [f"f_rest_{i}" for i in range(45)]
    assert names == ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"] + rest + [
        "opacity",
        "scale_0",
        "scale_1",
        "scale_2",
        "rot_0",
        "rot_1",
        "rot_2",
        "rot_3",
    ]
    # Channel-major, as 3DGS's save_ply: f_rest_{c * 15 + j} is coefficient j + 1 of channel c.
    sh = g.sh_rest.detach().numpy()
    for c in range(3):
        for j in range(15):
            np.testing.assert_array_equal(d[f"f_rest_{c * 15 + j}"], sh[:, j, c])
    back = Gaussians.from_ply(str(path))
    assert back.sh_degree == 3 and back.param_names == g.param_names
    for k in g.param_names:
        assert torch.equal(getattr(back, k), getattr(g, k)), k
    g0 = _gaussians(n=5, sh_degree=0)
    g0.export_ply(str(path))
    assert not [k for k in read_ply(str(path)) if k.startswith("f_rest")]
    assert Gaussians.from_ply(str(path)).sh_degree == 0


def test_module_schedule_and_learning_rate():
    lr = {"means": 1e-3, "quats": 1e-3, "log_scales": 1e-3, "opacity_logits": 1e-3, "colors": 1e-2}
    g = Gaussians.random(10, sh_degree=3)
    with pytest.raises(ValueError, match=r"SH degree 3: lr needs a 'sh_rest' rate.*model.lr.sh_rest"):
        SplatModule(g, torch.nn.L1Loss(), lr)
    with pytest.raises(ValueError, match=r"sh_degree=2 but the Gaussians given have SH degree 3"):
        SplatModule(g, torch.nn.L1Loss(), {**lr, "sh_rest": 5e-4}, sh_degree=2)
    with pytest.raises(ValueError, match=r"sh_degree_interval must be an integer >= 1, got 0"):
        SplatModule(g, torch.nn.L1Loss(), {**lr, "sh_rest": 5e-4}, sh_degree_interval=0)
    m = SplatModule(g, torch.nn.L1Loss(), {**lr, "sh_rest": 5e-4}, sh_degree_interval=1000)
    assert [m.sh_degree_at(s) for s in (0, 999, 1000, 2999, 3000, 10**6)] == [0, 0, 1, 2, 3, 3]
    opt = m.configure_optimizers()
    assert [(gr["name"], gr["lr"]) for gr in opt.param_groups][-1] == ("sh_rest", 5e-4)
    assert opt.param_groups[-1]["params"][0] is g.sh_rest


@pytest.mark.slow
def test_training_with_sh_degree_3_exports_45_f_rest(tmp_path):
    cfg = make_cfg(
        tmp_path,
        ["loss=l1", "trainer.max_steps=40", "model.sh_degree=3", "model.sh_degree_interval=10"]
        + ["model.strategy.refine_start=1", "model.strategy.refine_every=10"],
    )
    metrics = train(cfg)
    assert metrics["psnr"] > metrics["psnr_init"] + 1.0, metrics
    d = read_ply(str(tmp_path / "point_cloud.ply"))
    assert sorted(k for k in d if k.startswith("f_rest")) == sorted(f"f_rest_{i}" for i in range(45))
    assert d["x"].shape[0] == metrics["num_gaussians"] != 400  # densified
    rest = np.stack([d[f"f_rest_{i}"] for i in range(45)], 1).reshape(-1, 3, 15)  # [N, channel, coefficient]
    # Each degree was trained: its coefficients moved from their zero start (degree 3 from step 30).
    for deg, sl in ((1, slice(0, 3)), (2, slice(3, 8)), (3, slice(8, 15))):
        assert np.abs(rest[:, :, sl]).max() > 1e-4, deg


@pytest.mark.slow
def test_sh_run_resumes_exactly(tmp_path):
    # The degree rises at steps 3, 6, 9; the checkpoint at step 8 holds densified Gaussians with
    # sh_rest and its Adam moments; the resumed run must end where the uninterrupted one does.
    common = [
        "loss=l1",
        "trainer.max_steps=12",
        "export_ply=false",
        "callbacks.checkpoint.every_n_train_steps=4",
        "model.sh_degree=3",
        "model.sh_degree_interval=3",
        "model.strategy.refine_start=1",
        "model.strategy.refine_every=3",
        "model.strategy.grow_grad2d=0.0",
        "model.strategy.max_gaussians=5000",
    ]
    m_ref = train(make_cfg(tmp_path / "ref", common))
    ref_state = torch.load(tmp_path / "ref" / "checkpoints" / "last.ckpt", weights_only=False)
    run = tmp_path / "run"
    cut = make_cfg(run, common + ["+callbacks.stop._target_=test_train.StopAt", "+callbacks.stop.step=10"])
    with pytest.raises(RuntimeError, match="simulated crash at step 10"):
        train(cut)
    m_res = train(make_cfg(run, common + ["resume=true"]))
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    assert state["state_dict"]["gaussians.sh_rest"].shape == (m_ref["num_gaussians"], 15, 3)
    for k, v in ref_state["state_dict"].items():
        assert torch.equal(state["state_dict"][k], v), k
    ref_adam, adam = ref_state["optimizer_states"][0]["state"], state["optimizer_states"][0]["state"]
    assert len(adam) == len(ref_adam) == 6
    for i in ref_adam:
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(adam[i][name], ref_adam[i][name]), (i, name)
    assert m_res["psnr"] == m_ref["psnr"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="gsplat's CUDA rasterizer needs a GPU")
def test_cuda_sh_matches_cpu():
    # Not yet run (written without a GPU); the tolerance is test_cuda_matches_cpu's.
    for degree in (1, 3):
        gs = _gaussians(n=200, seed=12, sh_degree=3)
        gs.set_active_sh_degree(degree)
        view = _view(w=40, h=32)
        w = torch.rand(32, 40, 3, generator=torch.Generator().manual_seed(13))
        cpu = render(gs, view, background=(0.2, 0.3, 0.4))
        (cpu["image"] * w).sum().backward()
        gg = _gaussians(n=200, seed=12, sh_degree=3).cuda()
        gg.set_active_sh_degree(degree)
        gpu = render(
            gg, View(view.image.cuda(), view.viewmat.cuda(), view.K.cuda(), 40, 32), background=(0.2, 0.3, 0.4)
        )
        (gpu["image"] * w.cuda()).sum().backward()
        torch.testing.assert_close(gpu["image"].cpu(), cpu["image"], atol=1e-4, rtol=0)
        torch.testing.assert_close(gg.sh_rest.grad.cpu(), gs.sh_rest.grad, atol=1e-4, rtol=1e-3)
