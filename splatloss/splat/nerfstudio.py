"""nerfstudio scenes: a ``transforms.json`` plus images (what ``ns-process-data`` writes).

The file holds the intrinsics ``fl_x, fl_y, cx, cy, w, h`` globally or per frame (a frame's own
value wins), optional distortion ``k1 k2 k3 k4 p1 p2`` (refused unless zero), ``frames`` each with a
``file_path`` (relative to the folder) and a 4x4 camera->world ``transform_matrix`` in the OpenGL
frame (x right, y up, z backward), optionally a frame's ``mask_path`` (a one-channel image: zero
pixels do not count in the loss), and optionally ``ply_file_path``: the initial point cloud.
"""

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
    check_points,
    check_pose,
    check_same_size,
    check_view_sizes,
    make_view,
    random_points,
    read_image,
    read_mask,
    view_names,
)

__all__ = ["load_nerfstudio", "train_eval_split_fraction"]

_INTRINSICS = ("fl_x", "fl_y", "cx", "cy", "w", "h")
_DISTORTION = ("k1", "k2", "k3", "k4", "p1", "p2")


def train_eval_split_fraction(n_images: int, train_fraction: float = 0.9) -> tuple:
    """nerfstudio's default split (``eval_mode="fraction"``, ``train_split_fraction=0.9``).

    As ``nerfstudio.data.utils.dataparsers_utils.get_train_eval_split_fraction``: of the images
    sorted by file name, ``ceil(n * train_fraction)`` evenly spaced ones
    (``np.linspace(0, n - 1, n_train, dtype=int)``) train and the rest are held out.

    Examples:
        >>> train_eval_split_fraction(10)
        ([0, 1, 2, 3, 4, 5, 6, 7, 9], [8])
    """
    n_train = math.ceil(n_images * train_fraction)
    i_train = np.linspace(0, n_images - 1, n_train, dtype=int)
    i_eval = np.setdiff1d(np.arange(n_images), i_train)
    return [int(i) for i in i_train], [int(i) for i in i_eval]


def _read_ply_points(fn: str):
    """Positions and colours (uint8 red/green/blue, or none: grey) of a binary or ASCII .ply."""
    with open(fn, "rb") as fh:
        data = fh.read()
    end = data.find(b"end_header\n")
    if not data.startswith(b"ply") or end < 0:
        raise ValueError(f"load_nerfstudio: ply_file_path {fn!r} is not a .ply file (no 'ply' ... 'end_header')")
    header = data[:end].decode("ascii", "replace").splitlines()
    body = data[end + len("end_header\n") :]
    fmt = next((line.split()[1] for line in header if line.startswith("format")), "")
    types = {"float": "f4", "float32": "f4", "double": "f8", "float64": "f8", "uchar": "u1", "uint8": "u1",
             "char": "i1", "int8": "i1", "short": "i2", "int16": "i2", "ushort": "u2", "uint16": "u2",
             "int": "i4", "int32": "i4", "uint": "u4", "uint32": "u4"}  # fmt: skip
    count, props, in_vertex = 0, [], False
    for line in header:
        tok = line.split()
        if tok[:1] == ["element"]:
            in_vertex = tok[1:2] == ["vertex"]
            if in_vertex:
                try:
                    count = int(tok[2])
                except (IndexError, ValueError):
                    raise ValueError(
                        f"load_nerfstudio: {fn!r}: expected 'element vertex <count>' in the header, got {line!r}"
                    ) from None
        elif tok[:1] == ["property"] and in_vertex:
            if tok[1] == "list" or tok[1] not in types:
                raise ValueError(f"load_nerfstudio: {fn!r}: unsupported vertex property {line!r}")
            props.append((tok[2], types[tok[1]]))
    names = [p[0] for p in props]
    if not {"x", "y", "z"} <= set(names):
        raise ValueError(f"load_nerfstudio: {fn!r}: expected vertex properties x, y, z, got {names}")
    if fmt == "ascii":
        rows = body.decode("ascii", "replace").splitlines()[:count]
        try:
            arr = np.loadtxt(rows, ndmin=2) if rows else np.zeros((0, len(names)))
        except ValueError as e:
            raise ValueError(f"load_nerfstudio: {fn!r}: the ASCII vertex list cannot be read: {e}") from None
        if arr.shape != (count, len(names)):
            raise ValueError(
                f"load_nerfstudio: {fn!r}: the header promises {count} vertices of {len(names)} properties, the "
                f"file holds {arr.shape[0]} rows of {arr.shape[1]} values (truncated?); re-export the point cloud"
            )
        table = {n: arr[:, i] for i, n in enumerate(names)}
    elif fmt in ("binary_little_endian", "binary_big_endian"):
        order = "<" if fmt == "binary_little_endian" else ">"
        dt = np.dtype([(n, order + t) for n, t in props])
        if len(body) < count * dt.itemsize:
            raise ValueError(
                f"load_nerfstudio: {fn!r} is truncated: the header promises {count} vertices of {dt.itemsize} bytes "
                f"({count * dt.itemsize} bytes), the file holds {len(body)} after the header; re-export the point cloud"
            )
        rec = np.frombuffer(body, dtype=dt, count=count)
        table = {n: rec[n] for n in names}
    else:
        raise ValueError(f"load_nerfstudio: {fn!r}: unsupported ply format {fmt!r}")
    pts = np.stack([table["x"], table["y"], table["z"]], -1).astype(np.float32)
    if len(pts) == 0:
        raise ValueError(f"load_nerfstudio: {fn!r} has no vertices; Gaussians are initialised from them")
    check_points(pts, f"load_nerfstudio: ply_file_path {fn!r}", [f"vertex {i}" for i in range(len(pts))])
    if {"red", "green", "blue"} <= set(names):
        cols = np.stack([table["red"], table["green"], table["blue"]], -1).astype(np.float32) / 255.0
    else:
        cols = np.full_like(pts, 0.5)
    return torch.from_numpy(pts), torch.from_numpy(np.ascontiguousarray(cols))


def _frame_mask(root: str, fr: dict, where: str, pre_downscaled: bool, downscale: int, size: tuple):
    """The frame's ``mask_path`` as ``[H, W]`` weights at the size of the image read (``size``), or
    None without one. With the image from ``images_N/``, the mask comes from the ``<folder>_N/`` copy
    beside the mask's folder (what nerfstudio's downscaling writes) when it exists; otherwise the
    full-size mask, box-filtered by the caller."""
    rel = fr.get("mask_path")
    if rel is None:
        return None
    if not isinstance(rel, str) or not rel:
        raise ValueError(f"load_nerfstudio: {where}: mask_path must be a file path (a string), got {rel!r}")
    full = os.path.join(root, rel)
    mask_file = full
    want = size
    if pre_downscaled:
        parent, base = os.path.split(os.path.normpath(rel))
        small = os.path.join(root, f"{parent}_{downscale}" if parent else f"masks_{downscale}", base)
        if os.path.isfile(small):
            mask_file = small
        else:
            want = None  # the full-size mask, box-filtered to the small image's size below
    if not os.path.isfile(mask_file):
        raise ValueError(f"load_nerfstudio: {where}: mask_path {mask_file!r} does not exist")
    m = read_mask(mask_file, f"load_nerfstudio: {where}: mask_path")
    if want is None:
        shrunk = box_downscale(m, downscale)
        if shrunk.shape != tuple(size):
            raise ValueError(
                f"load_nerfstudio: {where}: mask_path {mask_file!r} is {m.shape[0]}x{m.shape[1]}, which downscaled "
                f"by {downscale} is not the {size[0]}x{size[1]} image read; write the mask's {downscale}x smaller "
                f"copy beside it ({parent or 'masks'}_{downscale}/)"
            )
        return shrunk
    if m.shape != tuple(want):
        raise ValueError(
            f"load_nerfstudio: {where}: mask_path {mask_file!r} is {m.shape[0]}x{m.shape[1]}, expected the image's "
            f"{want[0]}x{want[1]}"
        )
    return m


def load_nerfstudio(
    path: str,
    downscale: int = 1,
    train_fraction: float = 0.9,
    n_points: int = 3000,
    seed: int = 0,
    white_background: bool = False,
    alpha_as_mask: bool = False,
) -> SceneData:
    """Load a nerfstudio scene: ``path/transforms.json`` and the images it names.

    Frames are sorted by ``file_path`` and split with nerfstudio's rule
    (:func:`train_eval_split_fraction`). Initial points come from ``ply_file_path`` when given,
    otherwise ``n_points`` uniform ones in a cube around the cameras' centroid (half-width half
    their median distance from it). ``downscale=N`` reads the
    ``images_N/`` copies (nerfstudio's layout: ``images/x.png`` -> ``images_N/x.png``) when they
    exist and box-filters the full images otherwise; intrinsics follow the size read. RGBA images
    are composited on the background; with ``alpha_as_mask`` the alpha is also kept as
    ``View.mask``. A frame's ``mask_path`` (relative to ``path``; nerfstudio's reading: a
    one-channel image whose non-zero pixels count) becomes ``View.mask``, box-filtered as the image
    (or read from the ``masks_N/`` copy beside ``images_N/``), times the alpha with
    ``alpha_as_mask``; the frames without one count every pixel. View names are the image files'
    stems (:func:`~splatloss.splat.views.view_names`). When the rule holds out nothing (fewer
    than 10 frames at 0.9), the last frame is held out so that there is something to evaluate on.
    """
    if not os.path.isdir(path):
        raise ValueError(f"load_nerfstudio: dataset directory {path!r} does not exist")
    if not isinstance(downscale, int) or isinstance(downscale, bool) or downscale < 1:
        raise ValueError(f"load_nerfstudio: downscale must be an integer >= 1, got {downscale!r}")
    if not isinstance(train_fraction, (int, float)) or not 0 < train_fraction < 1:
        raise ValueError(
            f"load_nerfstudio: train_fraction must be in (0, 1) (nerfstudio's default is 0.9), got {train_fraction!r}"
        )
    if not isinstance(alpha_as_mask, bool):
        raise TypeError(f"load_nerfstudio: alpha_as_mask must be true or false, got {alpha_as_mask!r}")
    fn = os.path.join(path, "transforms.json")
    if not os.path.isfile(fn):
        raise ValueError(f"load_nerfstudio: expected {fn!r} (nerfstudio's layout), it does not exist")
    try:
        with open(fn) as fh:
            meta = json.load(fh)
    except json.JSONDecodeError as e:
        raise ValueError(f"load_nerfstudio: {fn!r} is not valid JSON: {e}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("frames"), list) or not meta["frames"]:
        got = sorted(meta) if isinstance(meta, dict) else type(meta).__name__
        raise ValueError(f"load_nerfstudio: {fn!r} must be an object with a non-empty 'frames' list, got {got}")
    model = meta.get("camera_model", "OPENCV")
    if model not in ("OPENCV", "PINHOLE", "SIMPLE_PINHOLE"):
        raise ValueError(
            f"load_nerfstudio: {fn!r}: camera_model must be OPENCV or PINHOLE (perspective), got {model!r}; "
            f"fisheye and equirectangular cameras are not supported"
        )
    background = (1.0, 1.0, 1.0) if white_background else (0.0, 0.0, 0.0)
    frames = []
    for k, fr in enumerate(meta["frames"]):
        if not isinstance(fr, dict) or "file_path" not in fr or "transform_matrix" not in fr:
            raise ValueError(
                f"load_nerfstudio: {fn!r} frame {k} must have 'file_path' and 'transform_matrix', got {fr!r}"
            )
        frames.append(fr)
    # nerfstudio sorts the frames by file name before splitting.
    frames.sort(key=lambda f: f["file_path"])
    views, masks, paths = [], [], []
    first = None
    for k, fr in enumerate(frames):
        where = f"{fn!r} frame {fr['file_path']!r}"
        intr = {}
        for key in _INTRINSICS:
            val = fr.get(key, meta.get(key))
            if not isinstance(val, (int, float)) or isinstance(val, bool):
                raise ValueError(
                    f"load_nerfstudio: {where}: expected a number for {key!r} (in the frame or at the top level; "
                    f"nerfstudio needs fl_x, fl_y, cx, cy, w, h), got {val!r}"
                )
            intr[key] = float(val)
        check_intrinsics(
            intr["fl_x"], intr["fl_y"], intr["cx"], intr["cy"], intr["w"], intr["h"], f"load_nerfstudio: {where}"
        )
        dist = {d: fr.get(d, meta.get(d, 0.0)) for d in _DISTORTION}
        for d, v in dist.items():
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise ValueError(f"load_nerfstudio: {where}: expected a finite number for {d!r}, got {v!r}")
        if any(float(v) != 0.0 for v in dist.values()):
            nonzero = {d: v for d, v in dist.items() if float(v) != 0.0}
            raise ValueError(
                f"load_nerfstudio: {where}: non-zero distortion {nonzero}; this pipeline renders pinhole cameras "
                f"only: undistort the images first (e.g. `colmap image_undistorter`, or ns-process-data on "
                f"undistorted images) and set the coefficients to 0"
            )
        try:
            c2w = np.asarray(fr["transform_matrix"], dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(
                f"load_nerfstudio: {where}: transform_matrix must be a 4x4 list of numbers, "
                f"got {fr['transform_matrix']!r}"
            ) from None
        if c2w.shape == (3, 4):
            c2w = np.vstack([c2w, [0, 0, 0, 1]])
        if c2w.shape != (4, 4):
            raise ValueError(f"load_nerfstudio: {where}: transform_matrix must be 4x4, got shape {c2w.shape}")
        check_pose(c2w, f"load_nerfstudio: {where}: transform_matrix")
        rel = fr["file_path"]
        full = os.path.join(path, rel)
        w, h = intr["w"], intr["h"]
        small = None
        if downscale > 1:
            parent, base = os.path.split(os.path.normpath(rel))
            cand = os.path.join(path, f"{parent}_{downscale}" if parent else f"images_{downscale}", base)
            small = cand if os.path.isfile(cand) else None
        src = small or full
        img, alpha = read_image(src, background, keep_alpha=True)
        first = check_same_size(first, src, img, "load_nerfstudio")
        mask = _frame_mask(path, fr, where, small is not None, downscale, img.shape[:2])
        if small is None:
            if img.shape[:2] != (round(h), round(w)):
                raise ValueError(
                    f"load_nerfstudio: image {src!r} is {img.shape[0]}x{img.shape[1]} but {where} says h={h:g}, w={w:g}"
                )
            img, alpha = box_downscale(img, downscale), box_downscale(alpha, downscale)
            mask = None if mask is None else box_downscale(mask, downscale)
            sx = sy = 1.0 / downscale
        else:
            sx, sy = img.shape[1] / w, img.shape[0] / h
        if alpha_as_mask:
            mask = alpha if mask is None else mask * alpha
        masks.append(mask)
        c2w = c2w.copy()
        c2w[:3, 1:3] *= -1  # OpenGL -> OpenCV camera axes (y down, z forward)
        viewmat = np.linalg.inv(c2w)
        K = np.array([[intr["fl_x"] * sx, 0, intr["cx"] * sx], [0, intr["fl_y"] * sy, intr["cy"] * sy], [0, 0, 1]])
        views.append(make_view(img, None, viewmat, K, ""))
        paths.append(rel)
    if any(m is not None for m in masks):  # every view carries a mask or none does
        for v, m in zip(views, masks):
            ones = np.ones((v.height, v.width), np.float32)
            v.mask = torch.from_numpy(ones if m is None else np.ascontiguousarray(m, np.float32))
    for v, name in zip(views, view_names(paths, f"load_nerfstudio: {fn!r}")):
        v.name = name
    check_view_sizes(views, "load_nerfstudio")
    if len(views) < 2:
        raise ValueError(f"load_nerfstudio: {fn!r} has {len(views)} frame; need at least 2 (train and eval)")
    i_train, i_eval = train_eval_split_fraction(len(views), float(train_fraction))
    if not i_eval:
        i_eval = [len(views) - 1]
        i_train = [i for i in range(len(views)) if i != i_eval[0]]
    centers = torch.stack([torch.linalg.inv(v.viewmat)[:3, 3] for v in views])
    extent = max(float((centers - centers.mean(0)).norm(dim=-1).max()) * 1.1, 1e-3)
    ply = meta.get("ply_file_path")
    if ply:
        ply_fn = os.path.join(path, ply)
        if not os.path.isfile(ply_fn):
            raise ValueError(
                f"load_nerfstudio: ply_file_path {ply_fn!r} does not exist (remove the key for random points)"
            )
        points, colors = _read_ply_points(ply_fn)
    else:
        # Random points in a cube around the point the cameras surround: centred on their centroid, of
        # half-width 0.3 times their median distance from it (3DGS: +-1.3 for Blender's cameras at ~4).
        # Half the distance put points a few tenths from the cameras: floaters that held-out PSNR
        # never recovered from (300 steps, 32 px: 9.97 -> 9.28 dB at 0.5, 9.11 -> 10.71 dB at 0.3).
        c0 = centers.mean(0)
        half = 0.3 * float((centers - c0).norm(dim=-1).median())
        points, colors = random_points(n_points, max(half, 1e-3), seed)
        points = points + c0
    return SceneData([views[i] for i in i_train], [views[i] for i in i_eval], points, colors, extent, background)
