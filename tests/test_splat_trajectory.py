"""The camera path of ``render_traj=true``: through the training cameras, smooth, rigid; rendered and
written as a video (GIF here, MP4 where imageio-ffmpeg is installed)."""

import math

import numpy as np
import pytest
import torch

pytest.importorskip("gsplat")

from splatloss.splat.gaussians import Gaussians  # noqa: E402
from splatloss.splat.renderer import render  # noqa: E402
from splatloss.splat.scenes import View, default_scene, look_at  # noqa: E402
from splatloss.splat.trajectory import camera_path, render_path, render_trajectory, video_format  # noqa: E402


def _ring(n, radius=4.0, height=1.0):
    K = torch.tensor([[20.0, 0, 8], [0, 20.0, 8], [0, 0, 1]])
    views = []
    for k in range(n):
        a = 2 * math.pi * k / n
        M = look_at((radius * math.cos(a), radius * math.sin(a), height))
        views.append(View(torch.zeros(16, 16, 3), torch.tensor(M, dtype=torch.float32), K, 16, 16, f"v{k}"))
    return views


def _centre(M):
    return -M[:3, :3].T @ M[:3, 3]


def _angle(Ra, Rb):
    return math.acos(np.clip((np.trace(Ra.T @ Rb) - 1) / 2, -1, 1))


def test_path_passes_through_the_cameras_and_slerps_between_them():
    views = _ring(8)
    rng = np.random.default_rng(0)
    shuffled = [views[i] for i in rng.permutation(8)]  # the order given does not matter
    path = camera_path(shuffled, n_frames=32, n_keyframes=8)
    assert len(path) == 32
    keys = {tuple(np.round(_centre(v.viewmat.double().numpy()), 6)) for v in views}
    # Equal spacing: every 4th frame is a camera, exactly.
    for M in path[::4]:
        c = tuple(np.round(_centre(M), 6))
        assert c in keys
        match = next(v for v in views if tuple(np.round(_centre(v.viewmat.double().numpy()), 6)) == c)
        np.testing.assert_allclose(M, match.viewmat.double().numpy(), atol=1e-6)
    # Half-way between two cameras the rotation is half-way along the geodesic between theirs.
    for k in range(0, 32, 4):
        Ra, Rm, Rb = path[k][:3, :3], path[k + 2][:3, :3], path[(k + 4) % 32][:3, :3]
        assert _angle(Ra, Rm) == pytest.approx(_angle(Ra, Rb) / 2, abs=1e-9)
        assert _angle(Rm, Rb) == pytest.approx(_angle(Ra, Rb) / 2, abs=1e-9)


def test_path_is_rigid_smooth_and_thinned_to_the_keyframes():
    scene = default_scene(image_size=16, n_train=24, n_test=2, n_points=10, supersample=1)
    path = camera_path(scene.train, n_frames=96, n_keyframes=12)
    for M in path:
        R = M[:3, :3]
        np.testing.assert_allclose(R.T @ R, np.eye(3), atol=1e-9)
        assert np.linalg.det(R) == pytest.approx(1.0, abs=1e-9)
        np.testing.assert_array_equal(M[3], [0, 0, 0, 1])
    c = np.stack([_centre(M) for M in path])
    step = np.linalg.norm(np.diff(np.concatenate([c, c[:1]]), axis=0), axis=1)
    # A steady pace around a closed loop; turning angle per frame small everywhere (no kink).
    assert step.max() / step.min() < 1.5
    d = np.diff(np.concatenate([c, c[:2]]), axis=0)
    cos = (d[:-1] * d[1:]).sum(1) / np.linalg.norm(d[:-1], axis=1) / np.linalg.norm(d[1:], axis=1)
    assert np.degrees(np.arccos(np.clip(cos, -1, 1))).max() < 10
    # 24 cameras alternating two heights, thinned to 12 evenly spaced: all at one height.
    assert np.ptp(c[::8, 2]) < 1e-6


@pytest.mark.slow
def test_render_trajectory_writes_the_rendered_frames(tmp_path):
    from PIL import Image

    scene = default_scene(image_size=16, n_train=6, n_test=2, n_points=200, supersample=1)
    g = Gaussians.from_points(scene.points, scene.colors)

    def fn(v):
        return render(g, v, backend="cpu")

    path = camera_path(scene.train, n_frames=5)
    frames = render_path(fn, scene.train, path)
    assert frames.shape == (5, 16, 16, 3) and frames.dtype == np.uint8
    first = View(scene.train[0].image, torch.tensor(path[0], dtype=torch.float32), scene.train[0].K, 16, 16)
    expect = (render(g, first, backend="cpu")["image"].detach().clamp(0, 1) * 255).round().to(torch.uint8).numpy()
    np.testing.assert_array_equal(frames[0], expect)
    out = render_trajectory(fn, scene.train, str(tmp_path / "sub" / "traj"), n_frames=5, fps=10)
    assert out == str(tmp_path / "sub" / f"traj.{video_format()}")
    if video_format() == "gif":
        with Image.open(out) as im:
            assert im.n_frames == 5 and im.size == (16, 16) and im.info["duration"] == 100 and im.info["loop"] == 0
            im.seek(0)
            # GIF keeps 256 colours per frame: close to the render, not equal.
            assert np.abs(np.asarray(im.convert("RGB"), dtype=float) - frames[0]).mean() < 4


def test_mp4_where_imageio_ffmpeg_is_installed(tmp_path):
    pytest.importorskip("imageio_ffmpeg")
    import imageio.v2 as iio

    from splatloss.splat.trajectory import write_video

    frames = np.random.default_rng(0).integers(0, 255, size=(4, 15, 17, 3), dtype=np.uint8)
    out = write_video(frames, str(tmp_path / "t"), fps=5)
    assert out.endswith(".mp4")
    back = iio.mimread(out)
    assert len(back) == 4 and back[0].shape == (16, 18, 3)  # padded to even sides for yuv420p


def test_path_errors():
    views = _ring(4)
    with pytest.raises(ValueError, match="n_frames must be an integer >= 2, got 1"):
        camera_path(views, n_frames=1)
    with pytest.raises(ValueError, match="n_keyframes must be an integer >= 2, got 1"):
        camera_path(views, n_keyframes=1)
    with pytest.raises(ValueError, match="needs at least 2 training views to pass through, got 1"):
        camera_path(views[:1])
    with pytest.raises(ValueError, match="the training cameras all sit at one position"):
        camera_path([views[0], views[0]])


@pytest.mark.slow
def test_training_with_render_traj_writes_the_video(tmp_path):
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict
    from PIL import Image

    from splatloss.train import CONFIG_DIR, train

    scene = ["image_size=32", "n_train=4", "n_test=2", "n_points=300", "supersample=1"]
    overrides = [f"data.scene.{o}" for o in scene] + ["trainer.max_steps=5", "~logger", "export_ply=false"]
    overrides.append("render_traj=true")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    with open_dict(cfg):
        cfg.output_dir = str(tmp_path)
        cfg.loss_name = "dssim_l1"
    train(cfg)
    out = tmp_path / f"traj.{video_format()}"
    assert out.is_file()
    if video_format() == "gif":
        with Image.open(out) as im:
            assert im.n_frames == 120 and im.size == (32, 32)
