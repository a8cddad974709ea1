"""NeRF-synthetic ("Blender") scenes: ``transforms_{train,test}.json`` plus images."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import torch

from splatloss.splat.views import (
    SceneData,
    box_downscale,
    check_intrinsics,
    check_pose,
    check_same_size,
    check_view_sizes,
    make_view,
    random_points,
    read_image,
    view_names,
)

__all__ = ["load_blender"]

# Keys of instant-ngp style transforms (which Blender-format converters write): intrinsics in pixels
# of the full-size image, and OpenCV distortion coefficients; a frame's own value wins.
_INTRINSICS = ("fl_x", "fl_y", "cx", "cy", "camera_angle_y")
_DISTORTION = ("k1", "k2", "k3", "k4", "p1", "p2")


def _number(value, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"load_blender: {where}: {key!r} must be a finite number, got {value!r}")
    return float(value)


def _intrinsics(meta: dict, fr: dict, width: int, height: int, where: str, image: str):
    """``(fx, fy, cx, cy)`` in pixels of the full-size image: ``fl_x`` / ``fl_y`` / ``cx`` / ``cy``
    where given (in the frame or the file), else from ``camera_angle_x`` (and ``camera_angle_y``)
    with the principal point at the centre. Non-zero distortion coefficients, and ``w`` / ``h``
    other than the size of ``image``, are refused."""
    vals = {k: _number(fr.get(k, meta.get(k)), k, where) for k in _INTRINSICS + _DISTORTION if k in fr or k in meta}
    distorted = {k: vals[k] for k in _DISTORTION if vals.get(k, 0.0) != 0.0}
    if distorted:
        raise ValueError(
            f"load_blender: {where}: non-zero distortion {distorted}; this pipeline renders pinhole cameras only: "
            "undistort the images first (e.g. `colmap image_undistorter`) and set the coefficients to 0 or "
            "remove them"
        )
    for key, size in (("w", width), ("h", height)):
        given = fr.get(key, meta.get(key))
        if given is not None and _number(given, key, where) != size:
            raise ValueError(
                f"load_blender: {where}: {key!r} is {given!r} but the image {image!r} is {height}x{width} (h x w); "
                f"the intrinsics are in pixels of that size: correct {key!r} or the image"
            )
    fov_x = meta["camera_angle_x"]
    fx = vals["fl_x"] if "fl_x" in vals else 0.5 * width / math.tan(0.5 * fov_x)
    if "fl_y" in vals:
        fy = vals["fl_y"]
    elif "camera_angle_y" in vals:
        fy = 0.5 * height / math.tan(0.5 * vals["camera_angle_y"])
    else:
        fy = fx
    cx, cy = vals.get("cx", width / 2), vals.get("cy", height / 2)
    check_intrinsics(fx, fy, cx, cy, width, height, f"load_blender: {where}")
    return fx, fy, cx, cy


def load_blender(
    path: str,
    downscale: int = 1,
    white_background: bool = True,
    n_points: int = 3000,
    seed: int = 0,
    alpha_as_mask: bool = False,
) -> SceneData:
    """Load a NeRF-synthetic ("Blender") scene: ``transforms_{train,test}.json`` plus images.

    Each json has ``camera_angle_x`` (horizontal field of view, radians) and ``frames``, each with a
    ``file_path`` (relative to ``path``, ``.png`` appended when it has no extension) and a 4x4
    camera->world ``transform_matrix`` in the OpenGL frame (x right, y up, z backward). RGBA images
    are composited on white (or black). With no point cloud in the format, initial points are
    uniform in the cube the cameras look into (half-width 1.3, the NeRF-synthetic convention).
    With ``alpha_as_mask`` each view also keeps its alpha as ``View.mask`` (ones for RGB images), so
    that the loss ignores the transparent background. View names are the image files' stems (within
    a split; :func:`~splatloss.splat.views.view_names`).

    The instant-ngp keys ``fl_x``, ``fl_y``, ``cx``, ``cy`` and ``camera_angle_y`` (in the file or a
    frame; a frame's value wins) replace the intrinsics ``camera_angle_x`` implies; ``w`` and ``h``,
    when given, must be the image's size; distortion coefficients ``k1 k2 k3 k4 p1 p2`` must be 0
    (this pipeline renders pinhole cameras). With
    ``downscale=N`` the images are box-filtered over N x N blocks and the intrinsics divided by N
    (pixel coordinate ``x`` becomes ``x / N``).
    """
    if not os.path.isdir(path):
        raise ValueError(f"load_blender: dataset directory {path!r} does not exist")
    if not isinstance(downscale, int) or downscale < 1:
        raise ValueError(f"load_blender: downscale must be an integer >= 1, got {downscale!r}")
    if not isinstance(alpha_as_mask, bool):
        raise TypeError(f"load_blender: alpha_as_mask must be true or false, got {alpha_as_mask!r}")
    background = (1.0, 1.0, 1.0) if white_background else (0.0, 0.0, 0.0)
    splits = {}
    first = None
    for split in ("train", "test"):
        fn = os.path.join(path, f"transforms_{split}.json")
        if not os.path.isfile(fn):
            raise ValueError(f"load_blender: expected {fn!r} (NeRF-synthetic layout), it does not exist")
        try:
            with open(fn) as fh:
                meta = json.load(fh)
        except json.JSONDecodeError as e:
            raise ValueError(f"load_blender: {fn!r} is not valid JSON: {e}") from None
        if not isinstance(meta, dict) or "camera_angle_x" not in meta or "frames" not in meta:
            got = sorted(meta) if isinstance(meta, dict) else type(meta).__name__
            raise ValueError(
                f"load_blender: {fn!r} must be an object with 'camera_angle_x' and 'frames', got keys {got}"
            )
        fov = meta["camera_angle_x"]
        if not isinstance(fov, (int, float)) or isinstance(fov, bool) or not 0 < fov < math.pi:
            raise ValueError(
                f"load_blender: {fn!r}: camera_angle_x must be the horizontal field of view in radians, a number in "
                f"(0, pi), got {fov!r}"
            )
        if not isinstance(meta["frames"], list):
            raise ValueError(f"load_blender: {fn!r}: 'frames' must be a list, got {type(meta['frames']).__name__}")
        views = []
        paths = []
        for k, fr in enumerate(meta["frames"]):
            if not isinstance(fr, dict) or "file_path" not in fr or "transform_matrix" not in fr:
                raise ValueError(
                    f"load_blender: {fn!r} frame {k} must have 'file_path' and 'transform_matrix', got {fr!r}"
                )
            try:
                c2w = np.asarray(fr["transform_matrix"], dtype=np.float64)
            except (TypeError, ValueError):
                raise ValueError(
                    f"load_blender: {fn!r} frame {k}: transform_matrix must be a 4x4 list of numbers, got "
                    f"{fr['transform_matrix']!r}"
                ) from None
            if c2w.shape != (4, 4):
                raise ValueError(f"load_blender: {fn!r} frame {k}: transform_matrix must be 4x4, got shape {c2w.shape}")
            check_pose(c2w, f"load_blender: {fn!r} frame {k} ({fr['file_path']!r}): transform_matrix")
            img_path = os.path.normpath(os.path.join(path, fr["file_path"]))
            if not os.path.splitext(img_path)[1]:
                img_path += ".png"
            img, alpha = read_image(img_path, background, keep_alpha=True)
            first = check_same_size(first, img_path, img, "load_blender")
            where = f"{fn!r} frame {k} ({fr['file_path']!r})"
            fx, fy, cx, cy = _intrinsics(meta, fr, img.shape[1], img.shape[0], where, img_path)
            img = box_downscale(img, downscale)
            alpha = box_downscale(alpha, downscale) if alpha_as_mask else None
            c2w = c2w.copy()
            c2w[:3, 1:3] *= -1  # OpenGL -> OpenCV camera axes
            viewmat = np.linalg.inv(c2w)
            # Box filtering maps pixel coordinate x to x / downscale: the full-size intrinsics over it.
            n = downscale
            K = np.array([[fx / n, 0, cx / n], [0, fy / n, cy / n], [0, 0, 1]])
            views.append(make_view(img, alpha, viewmat, K, ""))
            paths.append(os.path.relpath(img_path, path))
        if not views:
            raise ValueError(f"load_blender: {fn!r} has no frames")
        for v, name in zip(views, view_names(paths, f"load_blender: {fn!r}")):
            v.name = name
        splits[split] = views
    check_view_sizes(splits["train"] + splits["test"], "load_blender")
    cams = torch.stack([torch.linalg.inv(v.viewmat)[:3, 3] for v in splits["train"]])
    extent = float(cams.norm(dim=-1).max())
    pts, cols = random_points(n_points, 1.3, seed)
    return SceneData(splits["train"], splits["test"], pts, cols, extent, background)
