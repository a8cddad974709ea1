"""COLMAP models: ``sparse/0/{cameras,images,points3D}.txt`` plus images."""

from __future__ import annotations

import os

import numpy as np
import torch

from splatloss.splat.views import SceneData, View, _check_sizes, _downscale, _read_image

__all__ = ["load_colmap"]


def _qvec_to_rotmat(q) -> np.ndarray:
    w, x, y, z = np.asarray(q, dtype=np.float64) / np.linalg.norm(q)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


def _colmap_lines(fn: str):
    if not os.path.isfile(fn):
        raise ValueError(f"load_colmap: expected the COLMAP text model file {fn!r}, it does not exist")
    with open(fn) as fh:
        for n, line in enumerate(fh, 1):
            s = line.strip()
            if s and not s.startswith("#"):
                yield n, s


def load_colmap(path: str, downscale: int = 1, test_every: int = 8, images_dir: str = "images") -> SceneData:
    """Load a COLMAP text model: ``sparse/0/{cameras,images,points3D}.txt`` (or the files directly
    in ``path/sparse`` or ``path``) and ``path/images_dir/<name>``.

    Camera models PINHOLE and SIMPLE_PINHOLE are supported, and SIMPLE_RADIAL / RADIAL / OPENCV
    when their distortion coefficients are all zero (undistorted images). Every
    ``test_every``-th image (sorted by name) is held out, the convention of the 3DGS papers.
    """
    if not os.path.isdir(path):
        raise ValueError(f"load_colmap: dataset directory {path!r} does not exist")
    if not isinstance(downscale, int) or downscale < 1:
        raise ValueError(f"load_colmap: downscale must be an integer >= 1, got {downscale!r}")
    if not isinstance(test_every, int) or test_every < 2:
        raise ValueError(f"load_colmap: test_every must be an integer >= 2, got {test_every!r}")
    model = None
    for cand in (os.path.join(path, "sparse", "0"), os.path.join(path, "sparse"), path):
        if os.path.isfile(os.path.join(cand, "cameras.txt")):
            model = cand
            break
    if model is None:
        raise ValueError(
            f"load_colmap: expected cameras.txt, images.txt and points3D.txt in {path!r}/sparse/0, "
            f"{path!r}/sparse or {path!r}; found no cameras.txt"
        )

    cameras = {}
    fn = os.path.join(model, "cameras.txt")
    for n, s in _colmap_lines(fn):
        tok = s.split()
        try:
            cid, mdl, w, h = int(tok[0]), tok[1], int(tok[2]), int(tok[3])
            params = [float(t) for t in tok[4:]]
        except (ValueError, IndexError):
            raise ValueError(
                f"load_colmap: {fn}:{n}: expected 'CAMERA_ID MODEL WIDTH HEIGHT PARAMS...', got {s!r}"
            ) from None
        # model -> (number of params, index of fx, fy, cx, cy, first distortion parameter)
        layouts = {
            "SIMPLE_PINHOLE": (3, 0, 0, 1, 2, 3),
            "PINHOLE": (4, 0, 1, 2, 3, 4),
            "SIMPLE_RADIAL": (4, 0, 0, 1, 2, 3),
            "RADIAL": (5, 0, 0, 1, 2, 3),
            "OPENCV": (8, 0, 1, 2, 3, 4),
        }
        if mdl not in layouts or len(params) != layouts[mdl][0]:
            raise ValueError(
                f"load_colmap: {fn}:{n}: expected camera model PINHOLE (4 params) or SIMPLE_PINHOLE "
                f"(3 params) (or SIMPLE_RADIAL / RADIAL / OPENCV with zero distortion), got {mdl} with "
                f"{len(params)} params"
            )
        _, ifx, ify, icx, icy, idist = layouts[mdl]
        if any(p != 0.0 for p in params[idist:]):
            raise ValueError(
                f"load_colmap: {fn}:{n}: camera {cid} ({mdl}) has distortion {params[idist:]}; expected "
                f"undistorted images (run COLMAP's image_undistorter, which writes PINHOLE cameras)"
            )
        fx, fy, cx, cy = params[ifx], params[ify], params[icx], params[icy]
        cameras[cid] = (w, h, fx, fy, cx, cy)

    fn = os.path.join(model, "images.txt")
    entries = []
    if not os.path.isfile(fn):
        raise ValueError(f"load_colmap: expected the COLMAP text model file {fn!r}, it does not exist")
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
        if cid not in cameras:
            raise ValueError(f"load_colmap: {fn}:{n}: camera id {cid} is not in cameras.txt (has {sorted(cameras)})")
        entries.append((" ".join(tok[9:]), q, t, cid))
    if not entries:
        raise ValueError(
            f"load_colmap: {fn!r} lists no images (expected lines 'IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME')"
        )
    entries.sort(key=lambda e: e[0])

    views = []
    for name, q, t, cid in entries:
        w, h, fx, fy, cx, cy = cameras[cid]
        img = _read_image(os.path.join(path, images_dir, name), (0.0, 0.0, 0.0))
        if img.shape[:2] != (h, w):
            raise ValueError(
                f"load_colmap: image {name!r} is {img.shape[0]}x{img.shape[1]} but cameras.txt says {h}x{w}"
            )
        img = _downscale(img, downscale)
        s = img.shape[1] / w
        M = np.eye(4)
        M[:3, :3] = _qvec_to_rotmat(q)
        M[:3, 3] = t
        K = np.array([[fx * s, 0, cx * s], [0, fy * s, cy * s], [0, 0, 1]])
        views.append(
            View(
                image=torch.from_numpy(img.astype(np.float32)),
                viewmat=torch.from_numpy(M.astype(np.float32)),
                K=torch.from_numpy(K.astype(np.float32)),
                width=img.shape[1],
                height=img.shape[0],
                name=name,
            )
        )
    _check_sizes(views, "load_colmap")

    fn = os.path.join(model, "points3D.txt")
    pts, cols = [], []
    for n, s in _colmap_lines(fn):
        tok = s.split()
        try:
            pts.append([float(v) for v in tok[1:4]])
            cols.append([int(v) / 255.0 for v in tok[4:7]])
        except ValueError:
            raise ValueError(
                f"load_colmap: {fn}:{n}: expected 'POINT3D_ID X Y Z R G B ERROR TRACK...', got {s!r}"
            ) from None
        if len(pts[-1]) != 3 or len(cols[-1]) != 3:
            raise ValueError(f"load_colmap: {fn}:{n}: expected 'POINT3D_ID X Y Z R G B ERROR TRACK...', got {s!r}")
    if not pts:
        raise ValueError(f"load_colmap: {fn!r} has no points; Gaussians are initialised from them")
    points = torch.tensor(pts, dtype=torch.float32)
    colors = torch.tensor(cols, dtype=torch.float32)
    centers = torch.stack([torch.linalg.inv(v.viewmat)[:3, 3] for v in views])
    extent = float((centers - centers.mean(0)).norm(dim=-1).max()) * 1.1
    test = [v for k, v in enumerate(views) if k % test_every == 0]
    train = [v for k, v in enumerate(views) if k % test_every != 0]
    if not train:
        raise ValueError(f"load_colmap: {len(views)} image(s) leave no training view with test_every={test_every}")
    return SceneData(train, test, points, colors, max(extent, 1e-3), (0.0, 0.0, 0.0))
