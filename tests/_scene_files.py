"""Write scenes to disk in the formats users bring: COLMAP binary (the byte layout COLMAP documents
and writes), COLMAP text, nerfstudio ``transforms.json``, with real PNGs and .ply files.

Independent of the loaders: these writers follow the formats' own definitions, so that reading
their output back tests the loaders against the formats, not against themselves.
"""

import json
import math
import os
import struct
import zlib

import numpy as np
import skimage.io

PINHOLE, SIMPLE_PINHOLE, SIMPLE_RADIAL, OPENCV = 1, 0, 2, 4  # COLMAP camera model ids


def write_png(path, arr):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    skimage.io.imsave(path, (np.clip(arr, 0, 1) * 255).round().astype(np.uint8), check_contrast=False)


def rotmat_to_qvec(R):
    """Unit quaternion (w, x, y, z) of a rotation matrix, from its largest component (Shepperd's method)."""
    R = np.asarray(R, dtype=np.float64)
    tr = R[0, 0] + R[1, 1] + R[2, 2]
    k = int(np.argmax([tr, R[0, 0], R[1, 1], R[2, 2]]))
    if k == 0:
        w = math.sqrt(1 + tr) / 2
        q = [w, (R[2, 1] - R[1, 2]) / (4 * w), (R[0, 2] - R[2, 0]) / (4 * w), (R[1, 0] - R[0, 1]) / (4 * w)]
    elif k == 1:
        x = math.sqrt(1 + R[0, 0] - R[1, 1] - R[2, 2]) / 2
        q = [(R[2, 1] - R[1, 2]) / (4 * x), x, (R[0, 1] + R[1, 0]) / (4 * x), (R[0, 2] + R[2, 0]) / (4 * x)]
    elif k == 2:
        y = math.sqrt(1 - R[0, 0] + R[1, 1] - R[2, 2]) / 2
        q = [(R[0, 2] - R[2, 0]) / (4 * y), (R[0, 1] + R[1, 0]) / (4 * y), y, (R[1, 2] + R[2, 1]) / (4 * y)]
    else:
        z = math.sqrt(1 - R[0, 0] - R[1, 1] + R[2, 2]) / 2
        q = [(R[1, 0] - R[0, 1]) / (4 * z), (R[0, 2] + R[2, 0]) / (4 * z), (R[1, 2] + R[2, 1]) / (4 * z), z]
    return q


def box_downscale(img, n):
    h, w = img.shape[0] // n * n, img.shape[1] // n * n
    return img[:h, :w].reshape(h // n, n, w // n, n, *img.shape[2:]).mean(axis=(1, 3))


def write_colmap_binary(model_dir, cameras, images, points):
    """cameras: [(id, model_id, w, h, params)]; images: [(id, qvec, tvec, camera_id, name)];
    points: [(xyz, rgb uint8)]. Each image gets two 2D points, each point a track of length 2."""
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "cameras.bin"), "wb") as fh:
        fh.write(struct.pack("<Q", len(cameras)))
        for cid, mid, w, h, params in cameras:
            fh.write(struct.pack("<iiQQ", cid, mid, w, h))
            fh.write(struct.pack(f"<{len(params)}d", *params))
    with open(os.path.join(model_dir, "images.bin"), "wb") as fh:
        fh.write(struct.pack("<Q", len(images)))
        for iid, q, t, cid, name in images:
            fh.write(struct.pack("<i4d3di", iid, *q, *t, cid))
            fh.write(name.encode() + b"\0")
            fh.write(struct.pack("<Q", 2))
            fh.write(struct.pack("<ddq", 1.5, 2.5, 0))
            fh.write(struct.pack("<ddq", 3.5, 4.5, -1))
    with open(os.path.join(model_dir, "points3D.bin"), "wb") as fh:
        fh.write(struct.pack("<Q", len(points)))
        for k, (xyz, rgb) in enumerate(points):
            fh.write(struct.pack("<Q3d3Bd", k + 1, *map(float, xyz), *map(int, rgb), 0.25))
            fh.write(struct.pack("<Q", 2))
            fh.write(struct.pack("<iiii", 1, 0, 2, 1))


def write_colmap_text(model_dir, cameras, images, points):
    names = {0: "SIMPLE_PINHOLE", 1: "PINHOLE", 2: "SIMPLE_RADIAL", 3: "RADIAL", 4: "OPENCV"}
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "cameras.txt"), "w") as fh:
        fh.write("# Camera list with one line of data per camera:\n")
        for cid, mid, w, h, params in cameras:
            fh.write(f"{cid} {names[mid]} {w} {h} {' '.join(repr(float(p)) for p in params)}\n")
    with open(os.path.join(model_dir, "images.txt"), "w") as fh:
        fh.write("# Image list with two lines of data per image:\n")
        for iid, q, t, cid, name in images:
            fh.write(
                f"{iid} {' '.join(repr(float(x)) for x in q)} {' '.join(repr(float(x)) for x in t)} {cid} {name}\n"
            )
            fh.write("1.5 2.5 -1\n")
    with open(os.path.join(model_dir, "points3D.txt"), "w") as fh:
        for k, (xyz, rgb) in enumerate(points):
            fh.write(f"{k + 1} {' '.join(repr(float(v)) for v in xyz)} {' '.join(str(int(c)) for c in rgb)} 0.25 1 0\n")


def _views(scene):
    return sorted(scene.train + scene.test, key=lambda v: v.name)


def scene_to_colmap(scene, root, binary=True, downscaled=(), model_id=PINHOLE, extra=(), n_points=None):
    """Write ``scene``'s views (train and test, sorted by name) as a COLMAP model in ``root``.

    ``downscaled``: factors N for which ``images_N/`` (box-filtered copies) is written too.
    ``extra``: distortion parameters appended to the camera's (with model_id OPENCV / SIMPLE_RADIAL).
    Returns {name stem: view}.
    """
    views = _views(scene)
    v0 = views[0]
    fx, fy, cx, cy = (float(v0.K[0, 0]), float(v0.K[1, 1]), float(v0.K[0, 2]), float(v0.K[1, 2]))
    if model_id in (SIMPLE_PINHOLE, SIMPLE_RADIAL):
        params = [fx, cx, cy, *extra]
    else:
        params = [fx, fy, cx, cy, *extra]
    cameras = [(1, model_id, v0.width, v0.height, params)]
    images = []
    for k, v in enumerate(views):
        M = v.viewmat.double().numpy()
        name = f"{v.name}.png"
        images.append((k + 1, rotmat_to_qvec(M[:3, :3]), M[:3, 3].tolist(), 1, name))
        img = v.image.numpy()
        write_png(os.path.join(root, "images", name), img)
        for n in downscaled:
            write_png(os.path.join(root, f"images_{n}", name), box_downscale(img, n))
    pts = scene.points.numpy()[:n_points]
    cols = (scene.colors.numpy()[:n_points] * 255).round().astype(np.uint8)
    points = list(zip(pts, cols))
    (write_colmap_binary if binary else write_colmap_text)(os.path.join(root, "sparse", "0"), cameras, images, points)
    return {v.name: v for v in views}


def write_ply_points(path, pts, cols):
    """A binary little-endian .ply with float x y z and uchar red green blue (as ns-process-data writes)."""
    dt = np.dtype([("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("red", "u1"), ("green", "u1"), ("blue", "u1")])
    rec = np.empty(len(pts), dtype=dt)
    rec["x"], rec["y"], rec["z"] = pts[:, 0], pts[:, 1], pts[:, 2]
    c = (np.asarray(cols) * 255).round().astype(np.uint8)
    rec["red"], rec["green"], rec["blue"] = c[:, 0], c[:, 1], c[:, 2]
    header = (
        f"ply\nformat binary_little_endian 1.0\nelement vertex {len(pts)}\nproperty float x\nproperty float y\n"
        "property float z\nproperty uchar red\nproperty uchar green\nproperty uchar blue\nend_header\n"
    )
    with open(path, "wb") as fh:
        fh.write(header.encode("ascii"))
        fh.write(rec.tobytes())


def scene_to_nerfstudio(scene, root, per_frame=False, ply=True, rgba_alpha=None, downscaled=()):
    """Write ``scene``'s views as a nerfstudio ``transforms.json`` folder.

    Intrinsics at the top level, or in every frame with ``per_frame``; OpenGL camera->world poses;
    ``ply_file_path`` to the scene's points with ``ply``. ``rgba_alpha``: a function view -> alpha
    [H, W], the images are then written as RGBA. Returns {name stem: view}.
    """
    views = _views(scene)
    v0 = views[0]
    intr = {
        "fl_x": float(v0.K[0, 0]), "fl_y": float(v0.K[1, 1]), "cx": float(v0.K[0, 2]), "cy": float(v0.K[1, 2]),
        "w": v0.width, "h": v0.height,
    }  # fmt: skip
    meta = {"camera_model": "OPENCV", "k1": 0.0, "k2": 0.0, "p1": 0.0, "p2": 0.0, "frames": []}
    if not per_frame:
        meta.update(intr)
    for v in views:
        c2w = np.linalg.inv(v.viewmat.double().numpy())
        c2w[:3, 1:3] *= -1  # OpenCV -> OpenGL camera axes, as nerfstudio stores them
        rel = f"images/{v.name}.png"
        img = v.image.numpy()
        if rgba_alpha is not None:
            img = np.concatenate([img, rgba_alpha(v)[..., None]], -1)
        write_png(os.path.join(root, rel), img)
        for n in downscaled:
            write_png(os.path.join(root, f"images_{n}", f"{v.name}.png"), box_downscale(img, n))
        fr = {"file_path": rel, "transform_matrix": c2w.tolist()}
        if per_frame:
            fr.update(intr)
        meta["frames"].append(fr)
    if ply:
        write_ply_points(os.path.join(root, "points.ply"), scene.points.numpy(), scene.colors.numpy())
        meta["ply_file_path"] = "points.ply"
    with open(os.path.join(root, "transforms.json"), "w") as fh:
        json.dump(meta, fh)
    return {v.name: v for v in views}


def _png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
    return np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))


def write_png16(path, arr):
    """A 16-bit PNG of ``arr`` (uint16; ``[H, W]`` grey, ``[H, W, 2]`` grey + alpha, ``[H, W, 3]`` RGB,
    ``[H, W, 4]`` RGBA), encoded as the PNG specification defines it: IHDR, one zlib IDAT, IEND, the
    rows filtered in turn with each of the five filter types (None, Sub, Up, Average, Paeth), so
    that a reader's unfiltering of every type is exercised."""
    arr = np.asarray(arr)
    if arr.dtype != np.uint16:
        raise TypeError(f"write_png16 expects uint16, got {arr.dtype}")
    h, w = arr.shape[:2]
    channels = 1 if arr.ndim == 2 else arr.shape[2]
    color_type = {1: 0, 2: 4, 3: 2, 4: 6}[channels]
    rows = np.frombuffer(arr.astype(">u2").tobytes(), dtype=np.uint8).reshape(h, -1).astype(np.int64)
    bpp = 2 * channels  # bytes per complete pixel: the filters' left neighbour is bpp bytes back
    raw = []
    for i in range(h):
        x = rows[i]
        prior = rows[i - 1] if i else np.zeros_like(x)
        left = np.concatenate([np.zeros(bpp, np.int64), x[:-bpp]])
        up_left = np.concatenate([np.zeros(bpp, np.int64), prior[:-bpp]])
        kind = i % 5
        pred = [np.zeros_like(x), left, prior, (left + prior) // 2, _paeth(left, prior, up_left)][kind]
        raw.append(bytes([kind]) + ((x - pred) % 256).astype(np.uint8).tobytes())
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(b"\x89PNG\r\n\x1a\n")
        fh.write(_png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, color_type, 0, 0, 0)))
        fh.write(_png_chunk(b"IDAT", zlib.compress(b"".join(raw))))
        fh.write(_png_chunk(b"IEND", b""))


def scene_to_blender(scene, root, downscaled=(), camera_angle_x=None, extra=None, frame_extra=None):
    """Write ``scene``'s views as a NeRF-synthetic ("Blender") folder: ``transforms_{train,test}.json``
    (``camera_angle_x`` from the first view's focal length unless given, OpenGL camera->world poses,
    ``file_path`` without extension) and ``{train,test}/<name>.png``. ``extra``: keys added to both
    json files; ``frame_extra``: keys added to every frame. Returns {name stem: view}."""
    views = {}
    for split in ("train", "test"):
        frames = []
        for v in getattr(scene, split):
            c2w = np.linalg.inv(v.viewmat.double().numpy())
            c2w[:3, 1:3] *= -1  # OpenCV -> OpenGL camera axes, as Blender stores them
            write_png(os.path.join(root, split, f"{v.name}.png"), v.image.numpy())
            frames.append({"file_path": f"./{split}/{v.name}", "transform_matrix": c2w.tolist(), **(frame_extra or {})})
            views[v.name] = v
        v0 = scene.train[0]
        fov = camera_angle_x if camera_angle_x is not None else 2 * math.atan(0.5 * v0.width / float(v0.K[0, 0]))
        with open(os.path.join(root, f"transforms_{split}.json"), "w") as fh:
            json.dump({"camera_angle_x": fov, **(extra or {}), "frames": frames}, fh)
    return views
