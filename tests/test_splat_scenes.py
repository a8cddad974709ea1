"""Default scene, Blender and COLMAP loaders (on scenes written here), ViewDataset."""

import json
import math
import os

import numpy as np
import pytest
import torch

from splatloss.splat.scenes import (
    SceneData,
    ViewDataset,
    default_scene,
    load_blender,
    load_colmap,
    load_scene,
    look_at,
)

skio = pytest.importorskip("skimage.io")


@pytest.fixture(scope="module")
def small_scene():
    return default_scene(image_size=32, n_train=16, n_test=4, n_points=400, supersample=2)


def test_default_scene_shapes_and_determinism(small_scene):
    s = small_scene
    assert isinstance(s, SceneData) and len(s.train) == 16 and len(s.test) == 4
    assert s.points.shape == (400, 3) and s.colors.shape == (400, 3)
    for v in s.train + s.test:
        assert v.image.shape == (32, 32, 3) and v.image.dtype == torch.float32
        assert 0 <= float(v.image.min()) and float(v.image.max()) <= 1
        # The box is in view and so is the background.
        covered = (v.image.sum(-1) > 0).float().mean()
        assert 0.3 < covered < 0.98
    again = default_scene(image_size=32, n_train=16, n_test=4, n_points=400, supersample=2)
    assert torch.equal(again.train[3].image, s.train[3].image)
    assert torch.equal(again.points, s.points) and torch.equal(again.colors, s.colors)
    # Held-out cameras are not training cameras.
    train_pos = torch.stack([torch.linalg.inv(v.viewmat)[:3, 3] for v in s.train])
    for v in s.test:
        pos = torch.linalg.inv(v.viewmat)[:3, 3]
        assert (train_pos - pos).norm(dim=-1).min() > 0.3


def test_default_scene_points_project_onto_their_colour(small_scene):
    # Surface points carry the texture colour; projected with the view's camera they must land on
    # pixels of about that colour (checks the ray caster and the camera convention agree).
    s = small_scene
    v = s.train[0]
    cam = (v.viewmat[:3, :3] @ s.points.T).T + v.viewmat[:3, 3]
    uv = (v.K @ cam.T).T
    uv = uv[:, :2] / uv[:, 2:]
    eye = torch.linalg.inv(v.viewmat)[:3, 3]
    # A point is seen when its face's outward normal points toward the camera (the box is convex).
    axis = s.points.abs().argmax(-1)
    normal = torch.zeros_like(s.points)
    normal[torch.arange(len(axis)), axis] = torch.sign(s.points[torch.arange(len(axis)), axis])
    facing = ((eye - s.points) * normal).sum(-1) > 0
    inside = (uv[:, 0] > 1) & (uv[:, 0] < 31) & (uv[:, 1] > 1) & (uv[:, 1] < 31)
    sel = facing & inside
    assert sel.sum() > 50
    col, row = uv[sel, 0].long(), uv[sel, 1].long()

    def err(r, c):
        return float((v.image[r, c] - s.colors[sel]).abs().mean(-1).median())

    # Colours differ by texture detail below the pixel footprint; the projected pixel must match
    # better than any neighbour (a half-pixel or axis-convention error would not) or a mirror image.
    aligned = err(row, col)
    assert aligned < 0.1
    for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
        assert aligned < 0.85 * err(row + dr, col + dc), (dr, dc)
    assert err(row, 31 - col) > 2 * aligned


def test_default_scene_errors():
    with pytest.raises(ValueError, match="image_size must be an integer >= 4, got 2"):
        default_scene(image_size=2)
    with pytest.raises(ValueError, match="camera_distance must exceed the box's half-diagonal"):
        default_scene(camera_distance=1.0)
    with pytest.raises(ValueError, match=r"fov_deg must be in \(0, 180\), got 180"):
        default_scene(fov_deg=180)
    with pytest.raises(ValueError, match="half_size must be > 0, got -1"):
        default_scene(half_size=-1)


def _write_png(path, arr):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    skio.imsave(path, (np.clip(arr, 0, 1) * 255).round().astype(np.uint8), check_contrast=False)


def _blender(tmp_path, sizes=((12, 10), (12, 10), (12, 10))):
    rng = np.random.default_rng(0)
    eyes = [(3.0, 0.5, 1.0), (-1.0, 3.0, 0.5), (0.5, -3.0, 2.0)]
    frames = {"train": [], "test": []}
    mats = {}
    for k, (eye, (h, w)) in enumerate(zip(eyes, sizes)):
        split = "train" if k < 2 else "test"
        M = look_at(eye)
        c2w = np.linalg.inv(M)
        c2w[:3, 1:3] *= -1  # OpenCV -> OpenGL, as Blender stores it
        rgba = rng.uniform(size=(h, w, 4))
        rgba[..., 3] = (rgba[..., 3] > 0.5).astype(float)
        _write_png(str(tmp_path / split / f"r_{k}.png"), rgba)
        frames[split].append({"file_path": f"./{split}/r_{k}", "transform_matrix": c2w.tolist()})
        mats[f"r_{k}"] = (M, rgba)
    for split in frames:
        with open(tmp_path / f"transforms_{split}.json", "w") as fh:
            json.dump({"camera_angle_x": 0.9, "frames": frames[split]}, fh)
    return mats


def test_load_blender(tmp_path):
    mats = _blender(tmp_path)
    s = load_blender(str(tmp_path), n_points=50)
    assert len(s.train) == 2 and len(s.test) == 1 and s.points.shape == (50, 3)
    for v in s.train + s.test:
        M, rgba = mats[v.name]
        torch.testing.assert_close(v.viewmat, torch.tensor(M, dtype=torch.float32), atol=1e-5, rtol=0)
        f = 0.5 * 10 / math.tan(0.45)
        torch.testing.assert_close(v.K, torch.tensor([[f, 0, 5], [0, f, 6], [0, 0, 1]], dtype=torch.float32))
        rgb8 = (np.clip(rgba, 0, 1) * 255).round() / 255
        expect = rgb8[..., :3] * rgb8[..., 3:] + (1 - rgb8[..., 3:])  # on white
        torch.testing.assert_close(v.image, torch.tensor(expect, dtype=torch.float32), atol=1e-6, rtol=0)
    assert s.background == (1.0, 1.0, 1.0)


def test_load_blender_errors(tmp_path):
    with pytest.raises(ValueError, match="dataset directory .* does not exist"):
        load_blender(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match=r"expected .*transforms_train.json.* \(NeRF-synthetic layout\)"):
        load_blender(str(tmp_path))
    _blender(tmp_path)
    (tmp_path / "transforms_test.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        load_blender(str(tmp_path))
    (tmp_path / "transforms_test.json").write_text(json.dumps({"frames": []}))
    with pytest.raises(
        ValueError, match=r"must be an object with 'camera_angle_x' and 'frames', got keys \['frames'\]"
    ):
        load_blender(str(tmp_path))
    (tmp_path / "transforms_test.json").write_text(
        json.dumps(
            {"camera_angle_x": 0.9, "frames": [{"file_path": "./test/r_2", "transform_matrix": [[1, 0], [0, 1]]}]}
        )
    )
    with pytest.raises(ValueError, match=r"transform_matrix must be 4x4, got shape \(2, 2\)"):
        load_blender(str(tmp_path))
    (tmp_path / "transforms_test.json").write_text(
        json.dumps(
            {"camera_angle_x": 0.9, "frames": [{"file_path": "./test/missing", "transform_matrix": np.eye(4).tolist()}]}
        )
    )
    with pytest.raises(ValueError, match="image file .*missing.png' does not exist"):
        load_blender(str(tmp_path))


def test_load_blender_mismatched_sizes(tmp_path):
    _blender(tmp_path, sizes=((12, 10), (12, 10), (8, 10)))
    with pytest.raises(
        ValueError, match=r"all images must have the same size, got 12x10 \('.*r_0.png'\) and 8x10 \('.*test/r_2.png'\)"
    ):
        load_blender(str(tmp_path))


def _rotmat_to_qvec(R):
    w = math.sqrt(max(0.0, 1 + R[0, 0] + R[1, 1] + R[2, 2])) / 2
    return [w, (R[2, 1] - R[1, 2]) / (4 * w), (R[0, 2] - R[2, 0]) / (4 * w), (R[1, 0] - R[0, 1]) / (4 * w)]


def _colmap(tmp_path, n_images=9, model="PINHOLE", params="20 21 8 6", size=(12, 16)):
    sparse = tmp_path / "sparse" / "0"
    sparse.mkdir(parents=True)
    (sparse / "cameras.txt").write_text(f"# Camera list\n1 {model} 16 12 {params}\n")
    lines = ["# Image list", "#   IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME"]
    mats = {}
    rng = np.random.default_rng(1)
    for k in range(n_images):
        a = 2 * math.pi * k / n_images
        M = look_at((3 * math.cos(a), 3 * math.sin(a), 1.0 + 0.1 * k))
        q = _rotmat_to_qvec(M[:3, :3])
        t = M[:3, 3]
        name = f"img_{k:02d}.png"
        lines.append(f"{k + 1} {' '.join(repr(float(x)) for x in q)} {' '.join(repr(float(x)) for x in t)} 1 {name}")
        lines.append("")  # the 2D points line, empty
        _write_png(str(tmp_path / "images" / name), rng.uniform(size=size + (3,)))
        mats[name[: -len(".png")]] = M
    (sparse / "images.txt").write_text("\n".join(lines) + "\n")
    (sparse / "points3D.txt").write_text("# 3D points\n1 0.1 0.2 0.3 255 0 128 0.5 1 0\n2 -1 0 1 0 255 0 0.2 2 0\n")
    return mats


def test_load_colmap(tmp_path):
    mats = _colmap(tmp_path)
    s = load_colmap(str(tmp_path), test_every=4)
    names_test = [v.name for v in s.test]
    assert names_test == ["img_00", "img_04", "img_08"] and len(s.train) == 6
    for v in s.train + s.test:
        torch.testing.assert_close(v.viewmat, torch.tensor(mats[v.name], dtype=torch.float32), atol=1e-5, rtol=0)
        torch.testing.assert_close(v.K, torch.tensor([[20.0, 0, 8], [0, 21, 6], [0, 0, 1]]))
        assert v.image.shape == (12, 16, 3)
    torch.testing.assert_close(s.points, torch.tensor([[0.1, 0.2, 0.3], [-1.0, 0.0, 1.0]]))
    torch.testing.assert_close(s.colors, torch.tensor([[1.0, 0.0, 128 / 255], [0.0, 1.0, 0.0]]))
    half = load_colmap(str(tmp_path), downscale=2)
    torch.testing.assert_close(half.train[0].K, torch.tensor([[10.0, 0, 4], [0, 10.5, 3], [0, 0, 1]]))
    assert half.train[0].image.shape == (6, 8, 3)


def test_load_colmap_errors(tmp_path):
    with pytest.raises(ValueError, match="dataset directory .* does not exist"):
        load_colmap(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match=r"expected cameras, images and points3D \(.bin or .txt\)"):
        load_colmap(str(tmp_path))
    _colmap(tmp_path, model="OPENCV", params="20 21 8 6 0.1 0 0 0")
    with pytest.raises(
        ValueError,
        match=r"camera 1 \(OPENCV\) has non-zero distortion \[0.1, 0.0, 0.0, 0.0\].*colmap image_undistorter",
    ):
        load_colmap(str(tmp_path))
    (tmp_path / "sparse" / "0" / "cameras.txt").write_text("1 FISHEYE 16 12 20 8 6 0.1\n")
    with pytest.raises(ValueError, match="expected camera model PINHOLE .*, got FISHEYE with 4 params"):
        load_colmap(str(tmp_path))
    (tmp_path / "sparse" / "0" / "cameras.txt").write_text("1 PINHOLE sixteen 12 1 2 3 4\n")
    with pytest.raises(ValueError, match="cameras.txt:1: expected 'CAMERA_ID MODEL WIDTH HEIGHT PARAMS...'"):
        load_colmap(str(tmp_path))
    (tmp_path / "sparse" / "0" / "cameras.txt").write_text("1 PINHOLE 16 12 20 21 8 6\n")
    os.remove(tmp_path / "sparse" / "0" / "points3D.txt")
    with pytest.raises(ValueError, match="has cameras.txt but not points3D.txt"):
        load_colmap(str(tmp_path))
    (tmp_path / "sparse" / "0" / "points3D.txt").write_text("1 0.1 zero 0.3 255 0 128 0.5\n")
    with pytest.raises(ValueError, match="points3D.txt:1: expected 'POINT3D_ID X Y Z R G B ERROR TRACK...'"):
        load_colmap(str(tmp_path))
    (tmp_path / "sparse" / "0" / "points3D.txt").write_text("1 0.1 0.2 0.3 255 0 128 0.5\n")
    images_txt = (tmp_path / "sparse" / "0" / "images.txt").read_text()
    (tmp_path / "sparse" / "0" / "images.txt").write_text("1 1 0 0 0 0 0 3 img_00.png\n\n")
    with pytest.raises(ValueError, match="images.txt:1: expected 'IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME'"):
        load_colmap(str(tmp_path))
    (tmp_path / "sparse" / "0" / "images.txt").write_text("1 1 0 0 0 0 0 3 7 img_00.png\n\n")
    with pytest.raises(ValueError, match=r"images.txt:1: camera id 7 is not in cameras.txt \(has \[1\]\)"):
        load_colmap(str(tmp_path))
    (tmp_path / "sparse" / "0" / "images.txt").write_text(images_txt)
    (tmp_path / "sparse" / "0" / "cameras.txt").write_text("1 PINHOLE 16 13 20 21 8 6\n")
    with pytest.raises(ValueError, match=r"image 'img_00.png' is 12x16 but its camera says 13x16"):
        load_colmap(str(tmp_path))


@pytest.mark.parametrize("model,params", [("OPENCV", "20 21 8 6 0 0 0 0"), ("SIMPLE_RADIAL", "20 8 6 0")])
def test_load_colmap_zero_distortion_models(tmp_path, model, params):
    _colmap(tmp_path, model=model, params=params)
    s = load_colmap(str(tmp_path))
    fy = 21.0 if model == "OPENCV" else 20.0
    torch.testing.assert_close(s.train[0].K, torch.tensor([[20.0, 0, 8], [0, fy, 6], [0, 0, 1]]))


def test_load_colmap_mismatched_sizes(tmp_path):
    _colmap(tmp_path, model="PINHOLE")
    sparse = tmp_path / "sparse" / "0"
    (sparse / "cameras.txt").write_text("1 PINHOLE 16 12 20 21 8 6\n2 SIMPLE_PINHOLE 16 10 20 8 5\n")
    txt = (sparse / "images.txt").read_text().replace(" 1 img_03.png", " 2 img_03.png")
    (sparse / "images.txt").write_text(txt)
    _write_png(str(tmp_path / "images" / "img_03.png"), np.zeros((10, 16, 3)))
    with pytest.raises(
        ValueError,
        match=r"all images must have the same size, got 12x16 \('.*images/img_00.png'\) and 10x16 \('.*img_03.png'\)",
    ):
        load_colmap(str(tmp_path))


def test_load_scene_and_dataset(tmp_path, small_scene):
    with pytest.raises(ValueError, match="kind='blender' needs a dataset path, got None"):
        load_scene("blender")
    with pytest.raises(ValueError, match="kind must be 'default', 'blender', 'colmap' or 'nerfstudio', got 'nerf'"):
        load_scene("nerf")
    ds = ViewDataset(small_scene.train)
    assert len(ds) == 16
    item = ds[5]
    assert torch.equal(item["image"], small_scene.train[5].image) and int(item["index"]) == 5
    assert item["viewmat"].shape == (4, 4) and item["K"].shape == (3, 3)
    with pytest.raises(ValueError, match="expected at least one view, got an empty list"):
        ViewDataset([])
    odd = small_scene.train[1]
    odd = type(odd)(odd.image[:20], odd.viewmat, odd.K, odd.width, 20, "odd")
    with pytest.raises(
        ValueError, match=r"ViewDataset: all images must have the same size, got 32x32 \(train_000\) and 20x32 \(odd\)"
    ):
        ViewDataset([small_scene.train[0], odd])
    liar = type(odd)(odd.image, odd.viewmat, odd.K, 32, 32, "liar")
    with pytest.raises(
        ValueError, match=r"view 'liar' declares 32x32 and expects an image of shape \(32, 32, 3\), got \(20, 32, 3\)"
    ):
        ViewDataset([liar])
