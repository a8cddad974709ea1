"""Dataset files as users bring them: 16-bit PNGs, Blender downscaling, intrinsics and distortion
keys, nerfstudio per-frame masks (``mask_path``), COLMAP camera rigs whose images share file names."""

import json
import os

import numpy as np
import pytest
import torch
from _scene_files import (
    PINHOLE,
    box_downscale,
    rotmat_to_qvec,
    scene_to_blender,
    scene_to_colmap,
    scene_to_nerfstudio,
    write_colmap_binary,
    write_colmap_text,
    write_png,
    write_png16,
)

from splatloss.lightning.callbacks import render_file_name
from splatloss.splat.blender import load_blender
from splatloss.splat.colmap import load_colmap
from splatloss.splat.nerfstudio import load_nerfstudio
from splatloss.splat.scenes import default_scene
from splatloss.splat.views import read_image


@pytest.fixture(scope="module")
def scene():
    return default_scene(image_size=32, n_train=4, n_test=2, n_points=40, supersample=1)


# ------------------------------------------------------------------------------------------------
# 16-bit PNGs
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("channels", [1, 2, 3, 4], ids=["grey", "grey+alpha", "rgb", "rgba"])
def test_16bit_png_read_at_16_bits(tmp_path, channels):
    rng = np.random.default_rng(3)
    shape = (5, 7) if channels == 1 else (5, 7, channels)
    arr = rng.integers(0, 65536, size=shape, dtype=np.uint16)
    path = str(tmp_path / "x.png")
    write_png16(path, arr)
    rgb, alpha = read_image(path, (0.0, 0.0, 0.0), keep_alpha=True)
    x = arr.astype(np.float64) / 65535.0
    if channels == 1:
        want_rgb, want_alpha = np.repeat(x[..., None], 3, -1), np.ones(shape)
    elif channels == 2:
        want_rgb, want_alpha = np.repeat(x[..., :1] * x[..., 1:], 3, -1), x[..., 1]
    else:
        a = x[..., 3:] if channels == 4 else np.ones(shape[:2] + (1,))
        want_rgb, want_alpha = x[..., :3] * a, a[..., 0]
    # float32 of a 16-bit value divided by 65535, times a float32 alpha: within 2 float32 roundings.
    np.testing.assert_allclose(rgb, want_rgb, atol=3e-7, rtol=0)
    np.testing.assert_allclose(alpha, want_alpha, atol=1e-7, rtol=0)


def test_16bit_png_scene_through_the_loader(tmp_path, scene):
    written = scene_to_colmap(scene, str(tmp_path))
    rng = np.random.default_rng(4)
    arrays = {}
    for name in written:  # the same scene with 16-bit images whose low byte matters
        arr = rng.integers(0, 65536, size=(32, 32, 3), dtype=np.uint16)
        write_png16(str(tmp_path / "images" / f"{name}.png"), arr)
        arrays[name] = arr
    s = load_colmap(str(tmp_path), test_every=3)
    for v in s.train + s.test:
        want = torch.from_numpy(arrays[v.name].astype(np.float32) / 65535.0)
        torch.testing.assert_close(v.image, want, atol=0, rtol=0)


# ------------------------------------------------------------------------------------------------
# Blender: downscaling, intrinsics keys, distortion keys
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("factor", [2, 3, 5])
def test_blender_downscale_intrinsics_follow_the_pixels(tmp_path, scene, factor):
    written = scene_to_blender(scene, str(tmp_path))
    s = load_blender(str(tmp_path), downscale=factor, n_points=10)
    for v in s.train + s.test:
        src = written[v.name]
        # Box filtering maps pixel coordinate x to x / factor (the ragged edge cropped): K / factor.
        want = src.K.double().clone()
        want[:2] /= factor
        torch.testing.assert_close(v.K.double(), want, atol=1e-5, rtol=0)
        assert (v.height, v.width) == (32 // factor, 32 // factor)


def test_blender_intrinsics_keys_are_used(tmp_path, scene):
    # instant-ngp style transforms: fl_x, fl_y, cx, cy (what COLMAP-converted Blender scenes carry).
    scene_to_blender(scene, str(tmp_path), extra={"fl_x": 30.0, "fl_y": 31.0, "cx": 15.0, "cy": 17.5})
    s = load_blender(str(tmp_path), n_points=10)
    want = torch.tensor([[30.0, 0, 15.0], [0, 31.0, 17.5], [0, 0, 1]])
    for v in s.train + s.test:
        torch.testing.assert_close(v.K, want, atol=0, rtol=0)
    s = load_blender(str(tmp_path), downscale=2, n_points=10)
    torch.testing.assert_close(s.test[0].K, torch.tensor([[15.0, 0, 7.5], [0, 15.5, 8.75], [0, 0, 1]]))


@pytest.mark.parametrize("where", ["top", "frame"])
@pytest.mark.parametrize("key", ["k1", "k2", "k3", "k4", "p1", "p2"])
def test_blender_distortion_refused_naming_the_key(tmp_path, scene, key, where):
    extra = {key: 0.05}
    scene_to_blender(scene, str(tmp_path), **({"extra": extra} if where == "top" else {"frame_extra": extra}))
    with pytest.raises(ValueError, match=rf"transforms_train.json.*non-zero distortion \{{'{key}': 0.05\}}.*undistort"):
        load_blender(str(tmp_path), n_points=10)


def test_blender_zero_distortion_accepted(tmp_path, scene):
    scene_to_blender(scene, str(tmp_path), extra={"k1": 0.0, "k2": 0.0, "p1": 0.0, "p2": 0.0})
    assert len(load_blender(str(tmp_path), n_points=10).train) == 4


def test_blender_bad_intrinsics_key(tmp_path, scene):
    scene_to_blender(scene, str(tmp_path), extra={"fl_x": "wide"})
    with pytest.raises(ValueError, match=r"transforms_train.json.*'fl_x' must be a finite number, got 'wide'"):
        load_blender(str(tmp_path), n_points=10)


# ------------------------------------------------------------------------------------------------
# nerfstudio: mask_path
# ------------------------------------------------------------------------------------------------


def _masks(root, names, size=32, folder="masks"):
    rng = np.random.default_rng(5)
    out = {}
    for n in names:
        m = (rng.uniform(size=(size, size)) > 0.3).astype(np.float64)
        write_png(os.path.join(root, folder, f"{n}.png"), m)
        out[n] = m
    return out


def _add_mask_paths(root, names, folder="masks"):
    fn = os.path.join(root, "transforms.json")
    with open(fn) as fh:
        meta = json.load(fh)
    for fr in meta["frames"]:
        stem = os.path.splitext(os.path.basename(fr["file_path"]))[0]
        if stem in names:
            fr["mask_path"] = f"{folder}/{stem}.png"
    with open(fn, "w") as fh:
        json.dump(meta, fh)


def test_nerfstudio_mask_path_becomes_the_views_mask(tmp_path, scene):
    written = scene_to_nerfstudio(scene, str(tmp_path))
    masks = _masks(str(tmp_path), written)
    _add_mask_paths(str(tmp_path), set(written))
    s = load_nerfstudio(str(tmp_path))
    for v in s.train + s.test:
        assert v.mask is not None, v.name
        torch.testing.assert_close(v.mask, torch.from_numpy(masks[v.name]).float(), atol=0, rtol=0)
    s = load_nerfstudio(str(tmp_path), downscale=2)  # box-filtered as the image: fractional weights
    for v in s.train + s.test:
        torch.testing.assert_close(v.mask, torch.from_numpy(box_downscale(masks[v.name], 2)).float())


def test_nerfstudio_mask_path_with_images_n(tmp_path, scene):
    written = scene_to_nerfstudio(scene, str(tmp_path), downscaled=(2,))
    masks = _masks(str(tmp_path), written)
    _add_mask_paths(str(tmp_path), set(written))
    s = load_nerfstudio(str(tmp_path), downscale=2)  # no masks_2/: the full masks box-filtered
    for v in s.train + s.test:
        torch.testing.assert_close(v.mask, torch.from_numpy(box_downscale(masks[v.name], 2)).float())
    small = _masks(str(tmp_path), written, size=16, folder="masks_2")  # nerfstudio's downscaled copies
    s = load_nerfstudio(str(tmp_path), downscale=2)
    for v in s.train + s.test:
        torch.testing.assert_close(v.mask, torch.from_numpy(small[v.name]).float(), atol=0, rtol=0)


def test_nerfstudio_mask_path_times_alpha(tmp_path, scene):
    alpha = {v.name: np.linspace(0, 1, 32 * 32).reshape(32, 32) for v in scene.train + scene.test}
    written = scene_to_nerfstudio(scene, str(tmp_path), rgba_alpha=lambda v: alpha[v.name])
    masks = _masks(str(tmp_path), written)
    _add_mask_paths(str(tmp_path), set(written))
    s = load_nerfstudio(str(tmp_path), alpha_as_mask=True)
    for v in s.train + s.test:
        a8 = (alpha[v.name] * 255).round() / 255
        torch.testing.assert_close(v.mask, torch.from_numpy(masks[v.name] * a8).float(), atol=1e-7, rtol=0)


def test_nerfstudio_mask_path_on_some_frames(tmp_path, scene):
    written = scene_to_nerfstudio(scene, str(tmp_path))
    some = sorted(written)[:2]
    masks = _masks(str(tmp_path), some)
    _add_mask_paths(str(tmp_path), set(some))
    s = load_nerfstudio(str(tmp_path))
    for v in s.train + s.test:
        want = masks[v.name] if v.name in masks else np.ones((32, 32))
        torch.testing.assert_close(v.mask, torch.from_numpy(want).float(), atol=0, rtol=0)


def test_nerfstudio_mask_path_errors(tmp_path, scene):
    written = scene_to_nerfstudio(scene, str(tmp_path))
    _add_mask_paths(str(tmp_path), set(written))
    with pytest.raises(ValueError, match=r"transforms.json.*mask_path.*masks/.*\.png' does not exist"):
        load_nerfstudio(str(tmp_path))
    _masks(str(tmp_path), written, size=16)
    with pytest.raises(ValueError, match=r"mask_path .*masks/.*\.png' is 16x16, expected the image's 32x32"):
        load_nerfstudio(str(tmp_path))


# ------------------------------------------------------------------------------------------------
# COLMAP camera rigs: images of one file name in several folders
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("binary", [True, False], ids=["bin", "txt"])
def test_colmap_rig_images_get_distinct_names(tmp_path, scene, binary):
    views = scene.train + scene.test
    v0 = views[0]
    params = [float(v0.K[0, 0]), float(v0.K[1, 1]), float(v0.K[0, 2]), float(v0.K[1, 2])]
    images, expect = [], {}
    for k, v in enumerate(views):
        name = f"cam{k % 2}/frame_{k // 2:04d}.png"  # cam0/frame_0000.png, cam1/frame_0000.png, ...
        M = v.viewmat.double().numpy()
        images.append((k + 1, rotmat_to_qvec(M[:3, :3]), M[:3, 3].tolist(), 1, name))
        write_png(str(tmp_path / "images" / name), v.image.numpy())
        expect[name] = v
    pts = [(p, (c * 255).round().astype(np.uint8)) for p, c in zip(scene.points.numpy(), scene.colors.numpy())]
    write = write_colmap_binary if binary else write_colmap_text
    write(str(tmp_path / "sparse" / "0"), [(1, PINHOLE, 32, 32, params)], images, pts)
    s = load_colmap(str(tmp_path), test_every=2)
    loaded = s.train + s.test
    names = [v.name for v in loaded]
    assert sorted(names) == sorted(n[: -len(".png")].replace("/", "_") for n in expect)
    # The renders of the held-out views are written as <name>.png: one file per view.
    files = [render_file_name(v.name) for v in loaded]
    assert len(set(files)) == len(files), files
    for v in loaded:
        src = expect[v.name.replace("_", "/", 1) + ".png"]
        torch.testing.assert_close(v.viewmat, src.viewmat, atol=2e-5, rtol=0)


def test_flat_colmap_names_stay_the_stems(tmp_path, scene):
    written = scene_to_colmap(scene, str(tmp_path))
    s = load_colmap(str(tmp_path), test_every=3)
    assert sorted(v.name for v in s.train + s.test) == sorted(written)


def test_blender_names_stay_the_stems(tmp_path, scene):
    written = scene_to_blender(scene, str(tmp_path))
    s = load_blender(str(tmp_path), n_points=10)
    assert sorted(v.name for v in s.train + s.test) == sorted(written)


def test_rig_name_clash_after_joining_refused(tmp_path, scene):
    views = scene.train[:3]
    v0 = views[0]
    params = [float(v0.K[0, 0]), float(v0.K[1, 1]), float(v0.K[0, 2]), float(v0.K[1, 2])]
    names = ["a/b_c.png", "a_b/c.png", "a/c.png"]  # a_b_c twice once the folders are joined
    images = []
    for k, (v, name) in enumerate(zip(views, names)):
        M = v.viewmat.double().numpy()
        images.append((k + 1, rotmat_to_qvec(M[:3, :3]), M[:3, 3].tolist(), 1, name))
        write_png(str(tmp_path / "images" / name), v.image.numpy())
    pts = [(p, (c * 255).round().astype(np.uint8)) for p, c in zip(scene.points.numpy(), scene.colors.numpy())]
    write_colmap_text(str(tmp_path / "sparse" / "0"), [(1, PINHOLE, 32, 32, params)], images, pts)
    with pytest.raises(ValueError, match=r"'a/b_c.png' and 'a_b/c.png' would both be named 'a_b_c'"):
        load_colmap(str(tmp_path), test_every=2)


# ------------------------------------------------------------------------------------------------
# Through the real CLI
# ------------------------------------------------------------------------------------------------


def _write_rig(root, scene):
    views = scene.train + scene.test
    v0 = views[0]
    params = [float(v0.K[0, 0]), float(v0.K[1, 1]), float(v0.K[0, 2]), float(v0.K[1, 2])]
    images = []
    for k, v in enumerate(views):
        name = f"cam{k // 3}/frame_{k % 3:04d}.png"  # two cameras, three frames each
        M = v.viewmat.double().numpy()
        images.append((k + 1, rotmat_to_qvec(M[:3, :3]), M[:3, 3].tolist(), 1, name))
        write_png(str(root / "images" / name), v.image.numpy())
    pts = [(p, (c * 255).round().astype(np.uint8)) for p, c in zip(scene.points.numpy(), scene.colors.numpy())]
    write_colmap_binary(str(root / "sparse" / "0"), [(1, PINHOLE, 32, 32, params)], images, pts)


@pytest.mark.slow
def test_rig_and_masked_scenes_train_through_the_cli(tmp_path, scene):
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _write_rig(tmp_path / "rig", scene)
    written = scene_to_nerfstudio(scene, str(tmp_path / "ns"))
    _masks(str(tmp_path / "ns"), written)
    _add_mask_paths(str(tmp_path / "ns"), set(written))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    runs = {
        # Sorted by name, every 3rd held out: cam0/frame_0000.png and cam1/frame_0000.png.
        "rig": ["data=colmap", f"data.path={tmp_path}/rig", "data.scene.test_every=3"],
        "ns": ["data=nerfstudio", f"data.path={tmp_path}/ns"],
    }
    for name, overrides in runs.items():
        cmd = [sys.executable, os.path.join(root, "scripts", "train.py"), *overrides, "trainer.max_steps=2"]
        cmd += [f"hydra.run.dir={tmp_path / name}", "~logger", "export_ply=false"]
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
    finals = sorted(os.listdir(tmp_path / "rig" / "renders" / "final"))
    assert finals == ["cam0_frame_0000.png", "cam1_frame_0000.png"]
    assert json.loads((tmp_path / "ns" / "metrics.json").read_text())["steps"] == 2


@pytest.mark.parametrize("key,value", [("w", 64), ("h", 31)])
def test_blender_size_keys_must_match_the_images(tmp_path, scene, key, value):
    scene_to_blender(scene, str(tmp_path), extra={"w": 32, "h": 32, key: value})
    with pytest.raises(ValueError, match=rf"transforms_train.json.*'{key}' is {value} but the image .* is 32x32"):
        load_blender(str(tmp_path), n_points=10)
    scene_to_blender(scene, str(tmp_path), extra={"w": 32, "h": 32})
    assert len(load_blender(str(tmp_path), n_points=10).test) == 2


def test_truncated_16bit_png_is_named(tmp_path):
    path = tmp_path / "x.png"
    write_png16(str(path), np.full((6, 5, 3), 40000, dtype=np.uint16))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 30])  # the IDAT's end and IEND cut off
    message = r"x.png' cannot be read as a 16-bit PNG \(OSError: image file is truncated; Pillow .*\): .*replace it"
    with pytest.raises(ValueError, match=message):
        read_image(str(path), (0.0, 0.0, 0.0))
