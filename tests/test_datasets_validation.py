"""Bad scene files are refused when loading, each with a message that names the file (and the camera,
image, frame or point): COLMAP cameras, poses, points and image folders; corrupt images; truncated
.ply files; NaN in transforms.json. The scenes are real files written by tests/_scene_files.py."""

import json
import os
import struct

import numpy as np
import pytest
from _scene_files import scene_to_colmap, scene_to_nerfstudio, write_ply_points, write_png

from splatloss.splat.blender import load_blender
from splatloss.splat.colmap import load_colmap
from splatloss.splat.gaussians import Gaussians
from splatloss.splat.nerfstudio import load_nerfstudio
from splatloss.splat.scenes import default_scene


@pytest.fixture(scope="module")
def scene():
    return default_scene(image_size=16, n_train=10, n_test=2, n_points=40, supersample=1)


# ------------------------------------------------------------------------------------------------
# COLMAP: one value of one file replaced, in the binary and the text model
# ------------------------------------------------------------------------------------------------

# Byte offsets of the first record's values in the binary files (the layouts in splatloss/splat/colmap.py).
_BIN_OFFSET = {"cameras": 8 + 24, "images": 8 + 4 + 4 * 8, "points3D": 8 + 8}  # fx; tx; x


def _set_first_value(model, what, binary, value):
    """Replace fx of the first camera, tx of the first image or x of the first point."""
    if binary:
        fn = os.path.join(model, f"{what}.bin")
        raw = bytearray(open(fn, "rb").read())
        raw[_BIN_OFFSET[what] : _BIN_OFFSET[what] + 8] = struct.pack("<d", value)
        open(fn, "wb").write(bytes(raw))
        return fn
    fn = os.path.join(model, f"{what}.txt")
    lines = open(fn).read().splitlines()
    k = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    tok = lines[k].split()
    tok[{"cameras": 4, "images": 5, "points3D": 1}[what]] = repr(float(value))
    lines[k] = " ".join(tok)
    open(fn, "w").write("\n".join(lines) + "\n")
    return fn


@pytest.fixture(params=[True, False], ids=["bin", "txt"])
def colmap_dir(request, tmp_path, scene):
    written = scene_to_colmap(scene, str(tmp_path), binary=request.param)
    return str(tmp_path), os.path.join(str(tmp_path), "sparse", "0"), request.param, sorted(written)


@pytest.mark.parametrize(
    "value,message",
    [
        (0.0, r"the focal length must be > 0 pixels, got \{'fx': 0.0\}"),
        (-20.0, r"the focal length must be > 0 pixels, got \{'fx': -20.0\}"),
        (float("nan"), r"the intrinsics must be finite numbers, got \{'fx': nan\}"),
    ],
)
def test_colmap_camera_focal_length(colmap_dir, value, message):
    root, model, binary, _ = colmap_dir
    fn = _set_first_value(model, "cameras", binary, value)
    with pytest.raises(ValueError, match=rf"load_colmap: {fn}.*camera 1 \(PINHOLE\): {message}"):
        load_colmap(root)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_colmap_non_finite_pose(colmap_dir, value):
    root, model, binary, names = colmap_dir
    fn = _set_first_value(model, "images", binary, value)
    with pytest.raises(
        ValueError,
        match=rf"load_colmap: {fn}.*the pose of image '{names[0]}.png' must be .* finite numbers.*tvec \[{value}",
    ):
        load_colmap(root)


def test_colmap_non_finite_point(colmap_dir):
    root, model, binary, _ = colmap_dir
    fn = _set_first_value(model, "points3D", binary, float("nan"))
    where = "point id 1" if binary else "line 1"
    with pytest.raises(
        ValueError,
        match=rf"load_colmap: '{fn}': 1 of 40 initial points have NaN or infinite coordinates, the first at {where}",
    ):
        load_colmap(root)


def test_colmap_images_folder_missing_empty_or_incomplete(colmap_dir):
    root, model, binary, names = colmap_dir
    images = os.path.join(root, "images")
    files = sorted(os.listdir(images))
    os.remove(os.path.join(images, files[3]))
    msg = (
        rf"1 of the 12 images that '.*images.{'bin' if binary else 'txt'}' names are "
        rf"missing from '{images}', the first '.*{files[3]}'"
    )
    with pytest.raises(ValueError, match=msg):
        load_colmap(root)
    for f in files[:3] + files[4:]:
        os.remove(os.path.join(images, f))
    msg = rf"the images folder '{images}' is empty; expected the 12 images .*'{names[0]}.png'"
    with pytest.raises(ValueError, match=msg):
        load_colmap(root)
    write_png(os.path.join(images, "other.png"), np.zeros((16, 16, 3)))
    with pytest.raises(ValueError, match=rf"'{images}' holds 1 other files \(e.g. 'other.png'\); expected the 12"):
        load_colmap(root)
    with pytest.raises(ValueError, match=r"the images folder '.*photos' does not exist; expected the 12 images"):
        load_colmap(root, images_dir="photos")


def test_colmap_pre_downscaled_images_of_mixed_sizes(tmp_path, scene):
    # Each is within a pixel of the camera's size / 2, so only their sizes differ from each other.
    written = scene_to_colmap(scene, str(tmp_path), downscaled=(2,))
    odd = os.path.join(str(tmp_path), "images_2", f"{sorted(written)[5]}.png")
    write_png(odd, np.zeros((7, 8, 3)))
    with pytest.raises(
        ValueError, match=rf"load_colmap: all images must have the same size, got 8x8 \('.*'\) and 7x8 \('{odd}'\)"
    ):
        load_colmap(str(tmp_path), downscale=2)


def _corrupt(path):
    raw = open(path, "rb").read()
    open(path, "wb").write(raw[: len(raw) // 2])


def test_colmap_corrupt_image(colmap_dir):
    root, _, _, names = colmap_dir
    bad = os.path.join(root, "images", f"{names[2]}.png")
    _corrupt(bad)
    with pytest.raises(ValueError, match=rf"image file '{bad}' cannot be read \(.*\).*corrupt or truncated"):
        load_colmap(root)
    open(bad, "wb").write(b"")
    with pytest.raises(ValueError, match=rf"image file '{bad}' cannot be read"):
        load_colmap(root)


def test_float_image_with_nan_refused(tmp_path, scene):
    import skimage.io

    written = scene_to_colmap(scene, str(tmp_path), binary=False)
    name = sorted(written)[1]
    img = np.full((16, 16, 3), 0.5, dtype=np.float32)
    img[3, 4, 1] = np.nan
    skimage.io.imsave(str(tmp_path / "images" / f"{name}.tif"), img, check_contrast=False)
    images_txt = tmp_path / "sparse" / "0" / "images.txt"
    images_txt.write_text(images_txt.read_text().replace(f"{name}.png", f"{name}.tif"))
    msg = rf"image file '.*{name}\.tif': a floating-point image must hold values in \[0, 1\], got 1 NaN"
    with pytest.raises(ValueError, match=msg):
        load_colmap(str(tmp_path))


# ------------------------------------------------------------------------------------------------
# nerfstudio: NaN in transforms.json, truncated or NaN .ply, corrupt image
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def ns_dir(tmp_path, scene):
    scene_to_nerfstudio(scene, str(tmp_path))
    fn = tmp_path / "transforms.json"
    return tmp_path, fn, json.loads(fn.read_text())


def test_nerfstudio_nan_in_transforms_json(ns_dir):
    root, fn, good = ns_dir
    meta = json.loads(json.dumps(good))
    meta["frames"][4]["transform_matrix"][1][3] = float("nan")
    fn.write_text(json.dumps(meta))  # json writes NaN, and reads it back as a float
    path = meta["frames"][4]["file_path"]
    with pytest.raises(
        ValueError, match=rf"load_nerfstudio: '{fn}' frame '{path}': transform_matrix: the pose has NaN or infinite"
    ):
        load_nerfstudio(str(root))
    meta = json.loads(json.dumps(good))
    meta["fl_y"] = float("nan")
    fn.write_text(json.dumps(meta))
    msg = rf"'{fn}' frame '.*': the intrinsics must be finite numbers, got \{{'fy': nan\}}"
    with pytest.raises(ValueError, match=msg):
        load_nerfstudio(str(root))
    meta["fl_y"] = 0
    fn.write_text(json.dumps(meta))
    msg = rf"'{fn}' frame '.*': the focal length must be > 0 pixels, got \{{'fy': 0.0\}}"
    with pytest.raises(ValueError, match=msg):
        load_nerfstudio(str(root))
    meta = json.loads(json.dumps(good))
    meta["k2"] = float("nan")
    fn.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=rf"'{fn}' frame '.*': expected a finite number for 'k2', got nan"):
        load_nerfstudio(str(root))


def test_nerfstudio_pose_that_is_not_rigid(ns_dir):
    root, fn, good = ns_dir
    meta = json.loads(json.dumps(good))
    m = np.array(meta["frames"][0]["transform_matrix"])
    m[:3, :3] *= 2.0  # a scaled rotation: the camera's rays would be wrong
    meta["frames"][0]["transform_matrix"] = m.tolist()
    fn.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"transform_matrix: the pose's 3x3 block must be a rotation .*determinant 8"):
        load_nerfstudio(str(root))
    m[:3, :3] /= 2.0
    m[3] = [0, 0, 1, 1]
    meta["frames"][0]["transform_matrix"] = m.tolist()
    fn.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"the pose's bottom row must be \[0, 0, 0, 1\], got \[0.0, 0.0, 1.0, 1.0\]"):
        load_nerfstudio(str(root))


def test_nerfstudio_truncated_or_nan_ply(ns_dir, scene):
    root, _, _ = ns_dir
    ply = root / "points.ply"
    raw = ply.read_bytes()
    ply.write_bytes(raw[:-7])
    msg = (
        rf"'{ply}' is truncated: the header promises 40 vertices of 15 bytes \(600 bytes\), "
        rf"the file holds 593"
    )
    with pytest.raises(ValueError, match=msg):
        load_nerfstudio(str(root))
    pts = scene.points.numpy().copy()
    pts[7, 2] = np.nan
    write_ply_points(str(ply), pts, scene.colors.numpy())
    msg = rf"ply_file_path '{ply}': 1 of 40 initial points have NaN .* the first at vertex 7"
    with pytest.raises(ValueError, match=msg):
        load_nerfstudio(str(root))
    header = (
        "ply\nformat ascii 1.0\nelement vertex 3\nproperty float x\nproperty float y\nproperty float z\nend_header\n"
    )
    ply.write_text(header + "0 0 0\n1 1 1\n")
    msg = rf"'{ply}': the header promises 3 vertices of 3 properties, the file holds 2 rows"
    with pytest.raises(ValueError, match=msg):
        load_nerfstudio(str(root))
    ply.write_text(header.replace("vertex 3", "vertex three"))
    with pytest.raises(ValueError, match=rf"'{ply}': expected 'element vertex <count>' in the header"):
        load_nerfstudio(str(root))


def test_nerfstudio_corrupt_image(ns_dir):
    root, _, good = ns_dir
    bad = os.path.join(str(root), good["frames"][3]["file_path"])
    _corrupt(bad)
    with pytest.raises(ValueError, match=rf"image file '{bad}' cannot be read"):
        load_nerfstudio(str(root))


# ------------------------------------------------------------------------------------------------
# Blender, and the Gaussians' own .ply
# ------------------------------------------------------------------------------------------------


def _blender(root, scene):
    for split, views in (("train", scene.train[:3]), ("test", scene.test)):
        frames = []
        for v in views:
            c2w = np.linalg.inv(v.viewmat.double().numpy())
            c2w[:3, 1:3] *= -1
            write_png(os.path.join(root, split, f"{v.name}.png"), v.image.numpy())
            frames.append({"file_path": f"./{split}/{v.name}", "transform_matrix": c2w.tolist()})
        with open(os.path.join(root, f"transforms_{split}.json"), "w") as fh:
            json.dump({"camera_angle_x": 0.7, "frames": frames}, fh)


def test_blender_nan_and_corrupt_files(tmp_path, scene):
    root = str(tmp_path)
    _blender(root, scene)
    load_blender(root)
    fn = tmp_path / "transforms_train.json"
    meta = json.loads(fn.read_text())
    meta["camera_angle_x"] = float("nan")
    fn.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=rf"load_blender: '{fn}': camera_angle_x must be .* in \(0, pi\), got nan"):
        load_blender(root)
    meta["camera_angle_x"] = 0.7
    meta["frames"][1]["transform_matrix"][0][0] = float("nan")
    fn.write_text(json.dumps(meta))
    msg = (
        rf"load_blender: '{fn}' frame 1 \('./train/.*'\): transform_matrix: the pose has "
        rf"NaN"
    )
    with pytest.raises(ValueError, match=msg):
        load_blender(root)
    _blender(root, scene)
    bad = os.path.join(root, "test", f"{scene.test[0].name}.png")
    _corrupt(bad)
    with pytest.raises(ValueError, match=rf"image file '{bad}' cannot be read"):
        load_blender(root)


def test_gaussians_ply_truncated_or_nan(tmp_path, scene):
    g = Gaussians.from_points(scene.points, scene.colors)
    fn = str(tmp_path / "g.ply")
    g.export_ply(fn)
    raw = open(fn, "rb").read()
    open(fn, "wb").write(raw[:-10])
    with pytest.raises(ValueError, match=rf"read_ply: '{fn}' is truncated: the header promises 40 vertices"):
        Gaussians.from_ply(fn)
    with torch_no_grad():
        g.means[3, 0] = float("nan")
    g.export_ply(fn)
    msg = rf"Gaussians.from_ply: '{fn}' has NaN or infinite values in the fields \['x'\]"
    with pytest.raises(ValueError, match=msg):
        Gaussians.from_ply(fn)


def torch_no_grad():
    import torch

    return torch.no_grad()
