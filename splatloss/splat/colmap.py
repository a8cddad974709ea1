"""COLMAP models, text (``*.txt``) or binary (``*.bin``, as Mip-NeRF 360 ships them), plus images.

The binary layout (little-endian, as COLMAP's ``model/reconstruction_io`` writes it):

- ``cameras.bin``: ``uint64`` count; per camera ``int32`` id, ``int32`` model id, ``uint64`` width,
  ``uint64`` height, then the model's parameters as ``float64``.
- ``images.bin``: ``uint64`` count; per image ``int32`` id, ``float64`` qw qx qy qz tx ty tz,
  ``int32`` camera id, the name as a NUL-terminated string, ``uint64`` number of 2D points, then
  per point ``float64`` x y and ``int64`` point id.
- ``points3D.bin``: ``uint64`` count; per point ``uint64`` id, ``float64`` x y z, ``uint8`` r g b,
  ``float64`` error, ``uint64`` track length, then per track element ``int32`` image id and
  ``int32`` point2D index.
"""

from __future__ import annotations

import math
import os
import struct

import numpy as np
import torch

from splatloss.splat.views import (
    SceneData,
    box_downscale,
    check_intrinsics,
    check_points,
    check_same_size,
    check_view_sizes,
    make_view,
    read_image,
    view_names,
)

__all__ = ["load_colmap"]

# COLMAP camera model id -> (name, number of parameters).
_MODEL_IDS = {
    0: ("SIMPLE_PINHOLE", 3),
    1: ("PINHOLE", 4),
    2: ("SIMPLE_RADIAL", 4),
    3: ("RADIAL", 5),
    4: ("OPENCV", 8),
    5: ("OPENCV_FISHEYE", 8),
    6: ("FULL_OPENCV", 12),
    7: ("FOV", 5),
    8: ("SIMPLE_RADIAL_FISHEYE", 4),
    9: ("RADIAL_FISHEYE", 5),
    10: ("THIN_PRISM_FISHEYE", 12),
}
# Supported models -> (number of params, index of fx, fy, cx, cy, first distortion parameter).
_LAYOUTS = {
    "SIMPLE_PINHOLE": (3, 0, 0, 1, 2, 3),
    "PINHOLE": (4, 0, 1, 2, 3, 4),
    "SIMPLE_RADIAL": (4, 0, 0, 1, 2, 3),
    "RADIAL": (5, 0, 0, 1, 2, 3),
    "OPENCV": (8, 0, 1, 2, 3, 4),
}
_UNDISTORT = (
    "undistort the images first (e.g. `colmap image_undistorter --image_path images --input_path sparse/0 "
    "--output_path undistorted`, which writes PINHOLE cameras) and point data.path at the result"
)


def _qvec_to_rotmat(q) -> np.ndarray:
    w, x, y, z = np.asarray(q, dtype=np.float64) / np.linalg.norm(q)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


def _camera(where: str, cid: int, mdl: str, w: int, h: int, params: list) -> tuple:
    if mdl not in _LAYOUTS or len(params) != _LAYOUTS[mdl][0]:
        raise ValueError(
            f"load_colmap: {where}: expected camera model PINHOLE (4 params), SIMPLE_PINHOLE (3), "
            f"SIMPLE_RADIAL (4), RADIAL (5) or OPENCV (8), got {mdl} with {len(params)} params; "
            f"{_UNDISTORT}"
        )
    _, ifx, ify, icx, icy, idist = _LAYOUTS[mdl]
    if any(p != 0.0 for p in params[idist:]):
        raise ValueError(
            f"load_colmap: {where}: camera {cid} ({mdl}) has non-zero distortion {params[idist:]}; this "
            f"pipeline renders pinhole cameras only, so {_UNDISTORT}"
        )
    fx, fy, cx, cy = params[ifx], params[ify], params[icx], params[icy]
    check_intrinsics(fx, fy, cx, cy, w, h, f"load_colmap: {where}: camera {cid} ({mdl})")
    return (w, h, fx, fy, cx, cy)


# ------------------------------------------------------------------------------------------------
# Text model
# ------------------------------------------------------------------------------------------------


def _text_lines(fn: str):
    with open(fn) as fh:
        for n, line in enumerate(fh, 1):
            s = line.strip()
            if s and not s.startswith("#"):
                yield n, s


def _read_text(model: str):
    cameras = {}
    fn = os.path.join(model, "cameras.txt")
    for n, s in _text_lines(fn):
        tok = s.split()
        try:
            cid, mdl, w, h = int(tok[0]), tok[1], int(tok[2]), int(tok[3])
            params = [float(t) for t in tok[4:]]
        except (ValueError, IndexError):
            raise ValueError(
                f"load_colmap: {fn}:{n}: expected 'CAMERA_ID MODEL WIDTH HEIGHT PARAMS...', got {s!r}"
            ) from None
        cameras[cid] = _camera(f"{fn}:{n}", cid, mdl, w, h, params)

    fn = os.path.join(model, "images.txt")
    entries = []
    with open(fn) as fh:
        raw = [(n, line.strip()) for n, line in enumerate(fh, 1) if not line.startswith("#")]
    while raw and not raw[-1][1]:
        raw.pop()
    # images.txt alternates a pose line and a (possibly empty) 2D-points line.
    for n, s in raw[::2]:
        tok = s.split()
        try:
            if len(tok) < 10:
                raise ValueError
            q = [float(t) for t in tok[1:5]]
            t = [float(t) for t in tok[5:8]]
            cid = int(tok[8])
        except ValueError:
            raise ValueError(
                f"load_colmap: {fn}:{n}: expected 'IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME', got {s!r}"
            ) from None
        entries.append((f"{fn}:{n}", " ".join(tok[9:]), q, t, cid))

    fn = os.path.join(model, "points3D.txt")
    pts, cols, labels = [], [], []
    for n, s in _text_lines(fn):
        tok = s.split()
        try:
            p = [float(v) for v in tok[1:4]]
            c = [int(v) / 255.0 for v in tok[4:7]]
            if len(p) != 3 or len(c) != 3:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"load_colmap: {fn}:{n}: expected 'POINT3D_ID X Y Z R G B ERROR TRACK...', got {s!r}"
            ) from None
        pts.append(p)
        cols.append(c)
        labels.append(f"line {n}")
    return cameras, entries, pts, cols, labels


# ------------------------------------------------------------------------------------------------
# Binary model
# ------------------------------------------------------------------------------------------------


class _Reader:
    def __init__(self, fn: str):
        self.fn = fn
        with open(fn, "rb") as fh:
            self.buf = fh.read()
        self.pos = 0

    def read(self, fmt: str):
        size = struct.calcsize("<" + fmt)
        if self.pos + size > len(self.buf):
            raise ValueError(
                f"load_colmap: {self.fn!r} ends after {len(self.buf)} bytes in the middle of a record; expected "
                f"a complete COLMAP binary model (re-export it with `colmap model_converter --output_type BIN`)"
            )
        out = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return out

    def string(self) -> str:
        end = self.buf.find(b"\0", self.pos)
        if end < 0:
            raise ValueError(f"load_colmap: {self.fn!r}: an image name has no terminating NUL byte (truncated file)")
        s = self.buf[self.pos : end].decode("utf-8")
        self.pos = end + 1
        return s


def _read_binary(model: str):
    cameras = {}
    r = _Reader(os.path.join(model, "cameras.bin"))
    (count,) = r.read("Q")
    for _ in range(count):
        cid, mid, w, h = r.read("iiQQ")
        if mid not in _MODEL_IDS:
            raise ValueError(
                f"load_colmap: {r.fn}: camera {cid} has unknown model id {mid}; expected one of "
                f"{sorted(_MODEL_IDS)} (is this a COLMAP cameras.bin?)"
            )
        mdl, n_params = _MODEL_IDS[mid]
        params = list(r.read(f"{n_params}d"))
        cameras[cid] = _camera(f"{r.fn} camera {cid}", cid, mdl, int(w), int(h), params)

    entries = []
    r = _Reader(os.path.join(model, "images.bin"))
    (count,) = r.read("Q")
    for _ in range(count):
        iid, qw, qx, qy, qz, tx, ty, tz, cid = r.read("i7di")
        name = r.string()
        (n2d,) = r.read("Q")
        r.read(f"{n2d * 24}x")  # skip x, y (float64) and point id (int64)
        entries.append((f"{r.fn} image {iid}", name, [qw, qx, qy, qz], [tx, ty, tz], cid))

    pts, cols, labels = [], [], []
    r = _Reader(os.path.join(model, "points3D.bin"))
    (count,) = r.read("Q")
    for _ in range(count):
        pid, x, y, z, cr, cg, cb, _err, track = r.read("Q3d3BdQ")
        r.read(f"{track * 8}x")  # image id and point2D index, int32 each
        pts.append([x, y, z])
        cols.append([cr / 255.0, cg / 255.0, cb / 255.0])
        labels.append(f"point id {pid}")
    return cameras, entries, pts, cols, labels


# ------------------------------------------------------------------------------------------------
# Loader
# ------------------------------------------------------------------------------------------------


def _check_images_present(folder: str, entries: list, images_file: str) -> None:
    """The images folder exists and holds every image the model names; else one message that says
    how many are missing and names the first."""
    names = [e[1] for e in entries]
    example = ", ".join(repr(n) for n in names[:3]) + (", ..." if len(names) > 3 else "")
    if not os.path.isdir(folder):
        raise ValueError(
            f"load_colmap: the images folder {folder!r} does not exist; expected the {len(names)} images that "
            f"{images_file!r} names ({example}); set data.scene.images_dir (the folder's name) if they are elsewhere"
        )
    missing = [n for n in names if not os.path.isfile(os.path.join(folder, n))]
    if len(missing) == len(names):
        held = sorted(os.listdir(folder))
        holds = "is empty" if not held else f"holds {len(held)} other files (e.g. {held[0]!r})"
        raise ValueError(
            f"load_colmap: the images folder {folder!r} {holds}; expected the {len(names)} images that "
            f"{images_file!r} names ({example})"
        )
    if missing:
        raise ValueError(
            f"load_colmap: {len(missing)} of the {len(names)} images that {images_file!r} names are missing from "
            f"{folder!r}, the first {os.path.join(folder, missing[0])!r}"
        )


def _find_model(path: str):
    """(folder, "bin" | "txt") of the model: ``sparse/0``, ``sparse`` or ``path`` itself."""
    for cand in (os.path.join(path, "sparse", "0"), os.path.join(path, "sparse"), path):
        for ext in ("bin", "txt"):
            if os.path.isfile(os.path.join(cand, f"cameras.{ext}")):
                missing = [f for f in (f"images.{ext}", f"points3D.{ext}") if not os.path.isfile(os.path.join(cand, f))]
                if missing:
                    raise ValueError(
                        f"load_colmap: {cand!r} has cameras.{ext} but not {' and '.join(missing)}; expected the "
                        f"three files cameras, images and points3D of one COLMAP model (all .{ext})"
                    )
                return cand, ext
    raise ValueError(
        f"load_colmap: expected cameras, images and points3D (.bin or .txt) in {path!r}/sparse/0, "
        f"{path!r}/sparse or {path!r}; found no cameras.bin or cameras.txt"
    )


def load_colmap(
    path: str,
    downscale: int = 1,
    test_every: int = 8,
    images_dir: str = "images",
) -> SceneData:
    """Load a COLMAP model: ``sparse/0/{cameras,images,points3D}.{bin,txt}`` (or the files directly
    in ``path/sparse`` or ``path``; binary preferred when both exist) and ``path/images_dir/<name>``.

    Camera models PINHOLE and SIMPLE_PINHOLE are supported, and SIMPLE_RADIAL / RADIAL / OPENCV
    when their distortion coefficients are all zero (undistorted images); distorted cameras are
    refused (undistort them with ``colmap image_undistorter``). Every ``test_every``-th image
    (sorted by name) is held out, the convention of the 3DGS papers.

    ``downscale=N`` reads ``path/<images_dir>_N/<name>`` when that folder exists (the pre-downscaled
    copies Mip-NeRF 360 ships) and box-filters the full images by N otherwise; the intrinsics are
    scaled to the size of the image actually read. View names are the image files' stems, or their
    paths with the folders joined by ``_`` where a camera rig's folders hold images of one file name
    (``cam0/0001.png`` -> ``cam0_0001``, :func:`~splatloss.splat.views.view_names`).
    """
    if not os.path.isdir(path):
        raise ValueError(f"load_colmap: dataset directory {path!r} does not exist")
    if not isinstance(downscale, int) or isinstance(downscale, bool) or downscale < 1:
        raise ValueError(f"load_colmap: downscale must be an integer >= 1, got {downscale!r}")
    if not isinstance(test_every, int) or isinstance(test_every, bool) or test_every < 2:
        raise ValueError(f"load_colmap: test_every must be an integer >= 2, got {test_every!r}")
    model, ext = _find_model(path)
    cameras, entries, pts, cols, labels = (_read_binary if ext == "bin" else _read_text)(model)
    images_file = os.path.join(model, "images." + ext)
    if not entries:
        raise ValueError(f"load_colmap: {images_file!r} lists no images")
    for where, name, q, t, cid in entries:
        if cid not in cameras:
            raise ValueError(f"load_colmap: {where}: camera id {cid} is not in cameras.{ext} (has {sorted(cameras)})")
        if not (all(math.isfinite(v) for v in q + t) and math.hypot(*q) > 0):
            raise ValueError(
                f"load_colmap: {where}: the pose of image {name!r} must be a non-zero quaternion and a translation "
                f"of finite numbers, got qvec {q} and tvec {t}; re-run the reconstruction or drop the image"
            )
    if not pts:
        raise ValueError(
            f"load_colmap: {os.path.join(model, 'points3D.' + ext)!r} has no points; Gaussians are initialised "
            f"from them"
        )
    check_points(pts, f"load_colmap: {os.path.join(model, 'points3D.' + ext)!r}", labels)
    entries.sort(key=lambda e: e[1])

    small_dir = os.path.join(path, f"{images_dir}_{downscale}")
    pre_downscaled = downscale > 1 and os.path.isdir(small_dir)
    _check_images_present(small_dir if pre_downscaled else os.path.join(path, images_dir), entries, images_file)
    views = []
    first = None
    names = view_names([e[1] for e in entries], f"load_colmap: {images_file!r}")
    for (where, name, q, t, cid), view_id in zip(entries, names):
        w, h, fx, fy, cx, cy = cameras[cid]
        if pre_downscaled:
            src = os.path.join(small_dir, name)
            img = read_image(src, (0.0, 0.0, 0.0))
            # Tools round w / N either way (Mip-NeRF 360 and nerfstudio's downscaler differ).
            if abs(img.shape[1] - w / downscale) > 1 or abs(img.shape[0] - h / downscale) > 1:
                raise ValueError(
                    f"load_colmap: {os.path.join(small_dir, name)!r} is {img.shape[0]}x{img.shape[1]}, expected "
                    f"about {h / downscale:.0f}x{w / downscale:.0f} (the camera's {h}x{w} / {downscale}); "
                    f"regenerate {small_dir!r} or remove it to resize the full images instead"
                )
        else:
            src = os.path.join(path, images_dir, name)
            img = read_image(src, (0.0, 0.0, 0.0))
            if img.shape[:2] != (h, w):
                raise ValueError(
                    f"load_colmap: image {name!r} is {img.shape[0]}x{img.shape[1]} but its camera says {h}x{w} "
                    f"({src!r}; camera {cid} of {where})"
                )
            # Box filter over N x N blocks (the ragged right / bottom edge cropped): x maps to x / N.
            img = box_downscale(img, downscale)
        first = check_same_size(first, src, img, "load_colmap")
        if pre_downscaled:
            sx, sy = img.shape[1] / w, img.shape[0] / h
        else:
            sx = sy = 1.0 / downscale
        M = np.eye(4)
        M[:3, :3] = _qvec_to_rotmat(q)
        M[:3, 3] = t
        K = np.array([[fx * sx, 0, cx * sx], [0, fy * sy, cy * sy], [0, 0, 1]])
        views.append(make_view(img, None, M, K, view_id))
    check_view_sizes(views, "load_colmap")

    points = torch.tensor(pts, dtype=torch.float32)
    colors = torch.tensor(cols, dtype=torch.float32)
    centers = torch.stack([torch.linalg.inv(v.viewmat)[:3, 3] for v in views])
    extent = float((centers - centers.mean(0)).norm(dim=-1).max()) * 1.1
    test = [v for k, v in enumerate(views) if k % test_every == 0]
    train = [v for k, v in enumerate(views) if k % test_every != 0]
    if not train:
        raise ValueError(f"load_colmap: {len(views)} image(s) leave no training view with test_every={test_every}")
    return SceneData(train, test, points, colors, max(extent, 1e-3), (0.0, 0.0, 0.0))
