"""COLMAP (binary and text) and nerfstudio scenes written here from the default scene's views, read
back; their bad inputs; RGBA alpha as a mask."""

import json
import os
import shutil
import struct

import numpy as np
import pytest
import torch
from _scene_files import (
    OPENCV,
    SIMPLE_PINHOLE,
    SIMPLE_RADIAL,
    box_downscale,
    scene_to_colmap,
    scene_to_nerfstudio,
    write_png,
)

from splatloss.splat.colmap import load_colmap
from splatloss.splat.nerfstudio import load_nerfstudio, train_eval_split_fraction
from splatloss.splat.scenes import ViewDataset, default_scene, load_scene


@pytest.fixture(scope="module")
def scene():
    return default_scene(image_size=16, n_train=10, n_test=2, n_points=40, supersample=1)


def _q8(img):
    return torch.from_numpy((np.clip(np.asarray(img), 0, 1) * 255).round() / 255).float()


def _assert_views_match(loaded, written, scale=1, image=None):
    for v in loaded:
        src = written[v.name]
        torch.testing.assert_close(v.viewmat, src.viewmat, atol=2e-5, rtol=0)
        K = src.K.clone()
        K[:2] /= scale
        torch.testing.assert_close(v.K, K, atol=1e-5, rtol=0)
        expect = _q8(src.image.numpy()) if image is None else image(src)
        torch.testing.assert_close(v.image, expect, atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------------
# COLMAP
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("binary", [True, False], ids=["bin", "txt"])
def test_colmap_round_trip(tmp_path, scene, binary):
    written = scene_to_colmap(scene, str(tmp_path), binary=binary)
    s = load_colmap(str(tmp_path), test_every=4)
    names = sorted(written)
    assert [v.name for v in s.test] == names[::4]
    assert sorted(v.name for v in s.train) == [n for k, n in enumerate(names) if k % 4]
    _assert_views_match(s.train + s.test, written)
    torch.testing.assert_close(s.points, scene.points, atol=0, rtol=0)
    torch.testing.assert_close(s.colors, _q8(scene.colors.numpy()), atol=1e-6, rtol=0)
    assert s.background == (0.0, 0.0, 0.0) and s.extent > 0


def test_colmap_binary_preferred_and_same_as_text(tmp_path, scene):
    scene_to_colmap(scene, str(tmp_path / "t"), binary=False)
    scene_to_colmap(scene, str(tmp_path / "b"), binary=True)
    a, b = load_colmap(str(tmp_path / "t")), load_colmap(str(tmp_path / "b"))
    for va, vb in zip(a.train + a.test, b.train + b.test):
        assert va.name == vb.name
        torch.testing.assert_close(va.viewmat, vb.viewmat, atol=0, rtol=0)
        torch.testing.assert_close(va.K, vb.K, atol=0, rtol=0)


@pytest.mark.parametrize(
    "model_id,extra", [(SIMPLE_PINHOLE, ()), (OPENCV, (0.0, 0.0, 0.0, 0.0)), (SIMPLE_RADIAL, (0.0,))]
)
def test_colmap_camera_models_without_distortion(tmp_path, scene, model_id, extra):
    written = scene_to_colmap(scene, str(tmp_path), model_id=model_id, extra=extra)
    s = load_colmap(str(tmp_path))
    _assert_views_match(s.train + s.test, written)


def test_colmap_downscale_reads_images_n_and_scales_intrinsics(tmp_path, scene):
    written = scene_to_colmap(scene, str(tmp_path), downscaled=(2,))
    # Make images_2 distinguishable from a resize of images/: a constant offset.
    for name in written:
        p = str(tmp_path / "images_2" / f"{name}.png")
        write_png(p, box_downscale(written[name].image.numpy(), 2) * 0.5 + 0.25)
    s = load_colmap(str(tmp_path), downscale=2)
    assert s.train[0].image.shape == (8, 8, 3) and (s.train[0].height, s.train[0].width) == (8, 8)
    _assert_views_match(
        s.train + s.test, written, scale=2, image=lambda v: _q8(box_downscale(v.image.numpy(), 2) * 0.5 + 0.25)
    )
    # Without images_2/ the full images are box-filtered.
    shutil.rmtree(tmp_path / "images_2")
    s = load_colmap(str(tmp_path), downscale=2)
    _assert_views_match(
        s.train + s.test, written, scale=2, image=lambda v: torch.from_numpy(box_downscale(_q8(v.image).numpy(), 2))
    )


def test_colmap_downscale_wrong_size_images_n(tmp_path, scene):
    written = scene_to_colmap(scene, str(tmp_path), downscaled=(4,))
    write_png(str(tmp_path / "images_4" / f"{sorted(written)[0]}.png"), np.zeros((8, 8, 3)))
    with pytest.raises(ValueError, match=r"is 8x8, expected about 4x4 \(the camera's 16x16 / 4\); regenerate"):
        load_colmap(str(tmp_path), downscale=4)


def test_colmap_distortion_refused(tmp_path, scene):
    scene_to_colmap(scene, str(tmp_path), model_id=OPENCV, extra=(0.1, 0.0, 0.0, 0.0))
    with pytest.raises(
        ValueError,
        match=r"camera 1 \(OPENCV\) has non-zero distortion \[0.1, 0.0, 0.0, 0.0\].*colmap image_undist",
    ):
        load_colmap(str(tmp_path))
    scene_to_colmap(scene, str(tmp_path / "r"), model_id=SIMPLE_RADIAL, extra=(-0.02,))
    with pytest.raises(ValueError, match=r"\(SIMPLE_RADIAL\) has non-zero distortion \[-0.02\].*undistort"):
        load_colmap(str(tmp_path / "r"))


def test_colmap_binary_bad_inputs(tmp_path, scene):
    scene_to_colmap(scene, str(tmp_path))
    model = tmp_path / "sparse" / "0"
    cams = (model / "cameras.bin").read_bytes()
    # A fisheye model: refused, naming the supported ones.
    (model / "cameras.bin").write_bytes(cams[:12] + struct.pack("<i", 5) + cams[16:] + struct.pack("<4d", 0, 0, 0, 0))
    with pytest.raises(ValueError, match="expected camera model PINHOLE .*, got OPENCV_FISHEYE with 8 params"):
        load_colmap(str(tmp_path))
    (model / "cameras.bin").write_bytes(cams[:12] + struct.pack("<i", 99) + cams[16:])
    with pytest.raises(ValueError, match=r"camera 1 has unknown model id 99; expected one of \[0, 1"):
        load_colmap(str(tmp_path))
    (model / "cameras.bin").write_bytes(cams[:-8])
    with pytest.raises(ValueError, match=r"cameras.bin' ends after .* bytes in the middle of a record.*model_conv"):
        load_colmap(str(tmp_path))
    (model / "cameras.bin").write_bytes(cams)
    images = (model / "images.bin").read_bytes()
    (model / "images.bin").write_bytes(images[: 8 + 4 + 56 + 4 + 3])  # cut inside the first name
    with pytest.raises(ValueError, match="an image name has no terminating NUL byte"):
        load_colmap(str(tmp_path))
    (model / "images.bin").write_bytes(images[: 8 + 4 + 56] + struct.pack("<i", 7) + images[8 + 4 + 56 + 4 :])
    with pytest.raises(ValueError, match=r"images.bin image 1: camera id 7 is not in cameras.bin \(has \[1\]\)"):
        load_colmap(str(tmp_path))
    (model / "images.bin").write_bytes(struct.pack("<Q", 0))
    with pytest.raises(ValueError, match="images.bin' lists no images"):
        load_colmap(str(tmp_path))
    (model / "images.bin").write_bytes(images)
    (model / "points3D.bin").write_bytes(struct.pack("<Q", 0))
    with pytest.raises(ValueError, match="points3D.bin' has no points; Gaussians are initialised from them"):
        load_colmap(str(tmp_path))
    os.remove(model / "points3D.bin")
    with pytest.raises(ValueError, match=r"has cameras.bin but not points3D.bin; expected the three files"):
        load_colmap(str(tmp_path))


def test_colmap_argument_errors(tmp_path):
    with pytest.raises(ValueError, match=r"expected cameras, images and points3D \(.bin or .txt\) in"):
        load_colmap(str(tmp_path))
    with pytest.raises(ValueError, match="downscale must be an integer >= 1, got 0"):
        load_colmap(str(tmp_path), downscale=0)
    with pytest.raises(ValueError, match="test_every must be an integer >= 2, got 1"):
        load_colmap(str(tmp_path), test_every=1)


# ------------------------------------------------------------------------------------------------
# nerfstudio
# ------------------------------------------------------------------------------------------------


def test_nerfstudio_split_rule():
    # nerfstudio's get_train_eval_split_fraction at 0.9: ceil(0.9 n) evenly spaced training frames.
    assert train_eval_split_fraction(10) == ([0, 1, 2, 3, 4, 5, 6, 7, 9], [8])
    assert train_eval_split_fraction(12)[1] == [10]
    assert train_eval_split_fraction(20)[1] == [9, 18]
    tr, ev = train_eval_split_fraction(30)
    assert ev == [9, 19, 28]
    assert len(tr) == 27 and sorted(tr + ev) == list(range(30)) and tr[0] == 0 and tr[-1] == 29


@pytest.mark.parametrize("per_frame", [False, True], ids=["global", "per-frame"])
def test_nerfstudio_round_trip(tmp_path, scene, per_frame):
    written = scene_to_nerfstudio(scene, str(tmp_path), per_frame=per_frame)
    s = load_nerfstudio(str(tmp_path))
    names = sorted(written)
    i_train, i_eval = train_eval_split_fraction(len(names))
    assert [v.name for v in s.train] == [names[i] for i in i_train]
    assert [v.name for v in s.test] == [names[i] for i in i_eval] == [names[10]]
    _assert_views_match(s.train + s.test, written)
    torch.testing.assert_close(s.points, scene.points, atol=0, rtol=0)
    torch.testing.assert_close(s.colors, _q8(scene.colors.numpy()), atol=1e-6, rtol=0)
    assert s.train[0].mask is None and "mask" not in ViewDataset(s.train)[0]
    assert load_scene("nerfstudio", str(tmp_path)).train[0].name == s.train[0].name


def test_nerfstudio_random_points_without_ply_and_downscale(tmp_path, scene):
    written = scene_to_nerfstudio(scene, str(tmp_path), ply=False, downscaled=(2,))
    s = load_nerfstudio(str(tmp_path), n_points=123, downscale=2)
    assert s.points.shape == (123, 3) and s.colors.shape == (123, 3)
    centers = torch.stack([torch.linalg.inv(v.viewmat)[:3, 3] for v in s.train + s.test])
    c0 = centers.mean(0)
    half = 0.3 * float((centers - c0).norm(dim=-1).median())  # well inside the camera ring
    assert float((s.points - c0).abs().max()) <= half + 1e-5
    _assert_views_match(s.train + s.test, written, scale=2, image=lambda v: _q8(box_downscale(v.image.numpy(), 2)))


def test_nerfstudio_alpha_as_mask(tmp_path, scene):
    def alpha(v):
        a = np.ones((v.height, v.width))
        a[: v.height // 2] = 0.0
        a[:, :3] = 0.4
        return a

    written = scene_to_nerfstudio(scene, str(tmp_path), rgba_alpha=alpha)
    s = load_nerfstudio(str(tmp_path), alpha_as_mask=True)
    for v in s.train + s.test:
        torch.testing.assert_close(v.mask, _q8(alpha(written[v.name])), atol=1e-6, rtol=0)
        rgba = _q8(np.concatenate([written[v.name].image.numpy(), alpha(written[v.name])[..., None]], -1))
        torch.testing.assert_close(v.image, rgba[..., :3] * rgba[..., 3:], atol=1e-6, rtol=0)  # on black
    item = ViewDataset(s.train)[0]
    assert item["mask"].shape == (16, 16)
    assert load_nerfstudio(str(tmp_path)).train[0].mask is None


def test_nerfstudio_bad_inputs(tmp_path, scene):
    with pytest.raises(ValueError, match="dataset directory .* does not exist"):
        load_nerfstudio(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match=r"transforms.json' \(nerfstudio's layout\), it does not exist"):
        load_nerfstudio(str(tmp_path))
    with pytest.raises(
        ValueError, match=r"train_fraction must be in \(0, 1\) \(nerfstudio's default is 0.9\), got 1.5$"
    ):
        load_nerfstudio(str(tmp_path), train_fraction=1.5)
    with pytest.raises(TypeError, match="alpha_as_mask must be true or false, got 'yes'"):
        load_nerfstudio(str(tmp_path), alpha_as_mask="yes")
    scene_to_nerfstudio(scene, str(tmp_path))
    fn = tmp_path / "transforms.json"
    good = json.loads(fn.read_text())

    def bad(**changes):
        meta = json.loads(json.dumps(good))
        for k, v in changes.items():
            if v is None:
                meta.pop(k)
            else:
                meta[k] = v
        fn.write_text(json.dumps(meta))

    fn.write_text("{oops")
    with pytest.raises(ValueError, match="is not valid JSON"):
        load_nerfstudio(str(tmp_path))
    bad(frames=[])
    with pytest.raises(ValueError, match="must be an object with a non-empty 'frames' list"):
        load_nerfstudio(str(tmp_path))
    bad(fl_x=None)
    with pytest.raises(ValueError, match=r"expected a number for 'fl_x' \(in the frame or at the top level"):
        load_nerfstudio(str(tmp_path))
    bad(k1=0.05)
    with pytest.raises(ValueError, match=r"non-zero distortion \{'k1': 0.05\}.*undistort the images first"):
        load_nerfstudio(str(tmp_path))
    bad(camera_model="OPENCV_FISHEYE")
    with pytest.raises(ValueError, match="camera_model must be OPENCV or PINHOLE .*got 'OPENCV_FISHEYE'"):
        load_nerfstudio(str(tmp_path))
    bad(w=20)
    with pytest.raises(ValueError, match=r"is 16x16 but .* says h=16, w=20"):
        load_nerfstudio(str(tmp_path))
    bad(ply_file_path="missing.ply")
    with pytest.raises(ValueError, match=r"ply_file_path .*missing.ply' does not exist \(remove the key"):
        load_nerfstudio(str(tmp_path))
    (tmp_path / "bad.ply").write_bytes(b"not a ply")
    bad(ply_file_path="bad.ply")
    with pytest.raises(ValueError, match=r"bad.ply' is not a .ply file"):
        load_nerfstudio(str(tmp_path))
    frames = json.loads(json.dumps(good["frames"]))
    frames[0]["transform_matrix"] = [[1, 0], [0, 1]]
    bad(frames=frames)
    with pytest.raises(ValueError, match=r"transform_matrix must be 4x4, got shape \(2, 2\)"):
        load_nerfstudio(str(tmp_path))
    frames[0] = {"file_path": "images/x.png"}
    bad(frames=frames)
    with pytest.raises(ValueError, match="frame 0 must have 'file_path' and 'transform_matrix'"):
        load_nerfstudio(str(tmp_path))


def test_load_scene_unknown_kind():
    with pytest.raises(ValueError, match="kind must be 'default', 'blender', 'colmap' or 'nerfstudio', got 'llff'"):
        load_scene("llff", "x")
