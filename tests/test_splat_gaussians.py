"""Gaussians: construction, checks, .ply export (3DGS layout, atomic), resizing on load."""

import math
import os

import numpy as np
import pytest
import torch

from splatloss.splat.gaussians import SH_C0, Gaussians, read_ply, rgb_to_sh, sh_to_rgb


def test_from_points_initialisation():
    pts = torch.tensor([[0.0, 0, 0], [1, 0, 0], [0, 2, 0], [0, 0, 3]])
    cols = torch.tensor([[0.0, 0.5, 1.0]] * 4)
    g = Gaussians.from_points(pts, cols, init_opacity=0.3)
    assert g.num == 4
    torch.testing.assert_close(g.means.detach(), pts)
    torch.testing.assert_close(g.rgb.detach(), cols)
    torch.testing.assert_close(g.opacities.detach(), torch.full((4,), 0.3))
    # Scale: mean distance to the 3 nearest neighbours (point 0: (1 + 2 + 3) / 3 = 2).
    assert math.isclose(float(g.scales[0, 0].detach()), 2.0, rel_tol=1e-5)
    torch.testing.assert_close(g.quats.detach().norm(dim=-1), torch.ones(4))
    assert set(dict(g.named_parameters())) == set(Gaussians.param_names)
    torch.testing.assert_close(sh_to_rgb(rgb_to_sh(cols)), cols)
    assert math.isclose(SH_C0, 0.5 / math.sqrt(math.pi))


def test_random_is_deterministic():
    a, b = Gaussians.random(50, extent=2.0, seed=3), Gaussians.random(50, extent=2.0, seed=3)
    assert torch.equal(a.means, b.means) and float(a.means.detach().abs().max()) <= 2.0
    assert not torch.equal(a.means, Gaussians.random(50, extent=2.0, seed=4).means)


def test_errors():
    with pytest.raises(ValueError, match=r"points must have shape \[N, 3\] with N >= 1, got \(5, 2\)"):
        Gaussians.from_points(torch.zeros(5, 2))
    with pytest.raises(ValueError, match=r"colors must have shape \(5, 3\), got \(4, 3\)"):
        Gaussians.from_points(torch.rand(5, 3), torch.rand(4, 3))
    with pytest.raises(ValueError, match=r"init_opacity must be in \(0, 1\), got 1.0"):
        Gaussians.from_points(torch.rand(5, 3), init_opacity=1.0)
    with pytest.raises(ValueError, match=r"quats must have shape \(2, 4\), got \(2, 3\)"):
        Gaussians(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.zeros(2, 3))
    with pytest.raises(TypeError, match=r"means must be a torch.Tensor of shape \[N, 3\], got list"):
        Gaussians([[0, 0, 0]], torch.zeros(1, 4), torch.zeros(1, 3), torch.zeros(1), torch.zeros(1, 3))
    with pytest.raises(ValueError, match="n must be an integer >= 1, got 0"):
        Gaussians.random(0)


def test_export_ply_layout_and_atomic_overwrite(tmp_path):
    g = Gaussians.random(17, seed=1)
    path = tmp_path / "sub" / "point_cloud.ply"
    g.export_ply(str(path))
    raw = path.read_bytes()
    header = raw[: raw.index(b"end_header\n")].decode()
    names = [line.split()[2] for line in header.splitlines() if line.startswith("property")]
    assert names == [
        "x",
        "y",
        "z",
        "nx",
        "ny",
        "nz",
        "f_dc_0",
        "f_dc_1",
        "f_dc_2",
        "opacity",
        "scale_0",
        "scale_1",
        "scale_2",
        "rot_0",
        "rot_1",
        "rot_2",
        "rot_3",
    ]
    assert "element vertex 17" in header and "format binary_little_endian 1.0" in header
    assert len(raw) == raw.index(b"end_header\n") + len(b"end_header\n") + 17 * 17 * 4
    d = read_ply(str(path))
    np.testing.assert_array_equal(d["x"], g.means[:, 0].detach().numpy())
    np.testing.assert_array_equal(d["opacity"], g.opacity_logits.detach().numpy())
    np.testing.assert_array_equal(d["scale_2"], g.log_scales[:, 2].detach().numpy())
    np.testing.assert_array_equal(d["rot_0"], g.quats[:, 0].detach().numpy())
    np.testing.assert_array_equal(d["f_dc_1"], g.colors[:, 1].detach().numpy())
    # Overwrite with a different count: replaced whole, no temporary files left behind.
    Gaussians.random(5, seed=2).export_ply(str(path))
    assert read_ply(str(path))["x"].shape == (5,)
    assert os.listdir(path.parent) == ["point_cloud.ply"]


def test_read_ply_rejects_other_files(tmp_path):
    p = tmp_path / "x.ply"
    p.write_bytes(b"not a ply")
    with pytest.raises(ValueError, match="is not a ply file"):
        read_ply(str(p))


def test_load_state_dict_resizes():
    big = Gaussians.random(30, seed=0)
    small = Gaussians.random(10, seed=1)
    small.load_state_dict(big.state_dict())
    assert small.num == 30 and torch.equal(small.means, big.means)
    assert isinstance(small.means, torch.nn.Parameter)
