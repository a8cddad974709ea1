"""Scenes: the generated default scene, Blender and COLMAP loaders, and a view dataset.

Camera convention everywhere (as gsplat): ``viewmat`` is the 4x4 world->camera matrix in the
OpenCV frame (x right, y down, z forward), ``K`` the 3x3 pinhole intrinsics, and pixel ``(row i,
column j)`` has its centre at image coordinates ``(j + 0.5, i + 0.5)``.

The default scene is generated, never downloaded: photographs that ship inside scikit-image
(astronaut, coffee, chelsea, rocket, immunohistochemistry, hubble deep field) are textured onto the
six faces of a box, and ground truth is ray-cast from known cameras on a ring around it. Textures
are prefiltered to the pixel footprint (resized to about the size a face covers in the image, then
every pixel averages ``supersample x supersample`` rays), so the ground truth has no aliasing the
Gaussians could not represent. Train and test cameras interleave on the ring, so the held-out views
are new viewpoints between training viewpoints.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = [
    "View",
    "SceneData",
    "default_scene",
    "load_blender",
    "load_colmap",
    "load_scene",
    "ViewDataset",
    "look_at",
]


@dataclass
class View:
    """One camera and its image.

    Attributes:
        image: ``[H, W, 3]`` float32 in ``[0, 1]``.
        viewmat: ``[4, 4]`` world->camera (OpenCV frame: x right, y down, z forward).
        K: ``[3, 3]`` pinhole intrinsics in pixels.
        width, height: image size in pixels.
        name: an identifier (file name or ``train_007``).
    """

    image: torch.Tensor
    viewmat: torch.Tensor
    K: torch.Tensor
    width: int
    height: int
    name: str = ""


@dataclass
class SceneData:
    """Training and held-out views plus points to initialise Gaussians from.

    Attributes:
        train, test: lists of :class:`View`.
        points: ``[P, 3]`` float32 initial positions.
        colors: ``[P, 3]`` float32 in ``[0, 1]`` initial colours.
        extent: scene radius (used to scale learning rates and densification thresholds).
        background: RGB the images were composited on (the renderer should use it).
    """

    train: list
    test: list
    points: torch.Tensor
    colors: torch.Tensor
    extent: float
    background: tuple = field(default=(0.0, 0.0, 0.0))


def look_at(eye, target=(0.0, 0.0, 0.0), up=(0.0, 0.0, 1.0)) -> np.ndarray:
    """World->camera 4x4 matrix (OpenCV frame) for a camera at ``eye`` looking at ``target``."""
    eye = np.asarray(eye, dtype=np.float64)
    forward = np.asarray(target, dtype=np.float64) - eye
    forward /= np.linalg.norm(forward)
    right = np.cross(forward, np.asarray(up, dtype=np.float64))
    right /= np.linalg.norm(right)
    down = np.cross(forward, right)
    R = np.stack([right, down, forward])  # rows: camera axes in world coordinates
    M = np.eye(4)
    M[:3, :3] = R
    M[:3, 3] = -R @ eye
    return M


# ------------------------------------------------------------------------------------------------
# Default scene: a photo-textured box
# ------------------------------------------------------------------------------------------------

# Faces of the box [-h, h]^3: (axis, sign, u-axis, v-axis, photograph). u runs along the image's
# columns and v down its rows; the axes are chosen so that every photograph appears upright and
# unmirrored when seen from outside.
_FACES = (
    (0, +1, (0, 1, 0), (0, 0, -1), "astronaut"),
    (0, -1, (0, -1, 0), (0, 0, -1), "coffee"),
    (1, +1, (-1, 0, 0), (0, 0, -1), "chelsea"),
    (1, -1, (1, 0, 0), (0, 0, -1), "rocket"),
    (2, +1, (1, 0, 0), (0, -1, 0), "immunohistochemistry"),
    (2, -1, (1, 0, 0), (0, 1, 0), "hubble_deep_field"),
)


def _photo(name: str) -> np.ndarray:
    import skimage.data

    img = getattr(skimage.data, name)()
    img = np.asarray(img, dtype=np.float32)[..., :3] / 255.0
    h, w = img.shape[:2]
    s = min(h, w)  # centre square crop: faces are square
    return img[(h - s) // 2 : (h - s) // 2 + s, (w - s) // 2 : (w - s) // 2 + s]


def _bilinear(tex: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Sample ``tex [S, S, 3]`` at normalised coordinates u, v in [0, 1] (texel centres at (k+.5)/S)."""
    S = tex.shape[0]
    x = np.clip(u * S - 0.5, 0, S - 1)
    y = np.clip(v * S - 0.5, 0, S - 1)
    x0 = np.floor(x).astype(np.int64)
    y0 = np.floor(y).astype(np.int64)
    x1 = np.minimum(x0 + 1, S - 1)
    y1 = np.minimum(y0 + 1, S - 1)
    fx = (x - x0)[..., None]
    fy = (y - y0)[..., None]
    top = tex[y0, x0] * (1 - fx) + tex[y0, x1] * fx
    bot = tex[y1, x0] * (1 - fx) + tex[y1, x1] * fx
    return top * (1 - fy) + bot * fy


class _TexturedBox:
    def __init__(self, half: float, texture_size: int):
        from skimage.transform import resize

        self.half = half
        # Prefilter: anti-aliased resize to about the footprint a face has in the supersampled image.
        self.textures = [
            resize(_photo(f[4]), (texture_size, texture_size), anti_aliasing=True).astype(np.float32)
            for f in _FACES
        ]

    def face_uv(self, face: int, p: np.ndarray):
        _, _, ua, va, _ = _FACES[face]
        h = self.half
        u = (p @ np.asarray(ua, dtype=np.float64) + h) / (2 * h)
        v = (p @ np.asarray(va, dtype=np.float64) + h) / (2 * h)
        return u, v

    def color_at(self, face: int, p: np.ndarray) -> np.ndarray:
        u, v = self.face_uv(face, p)
        return _bilinear(self.textures[face], u, v)

    def raycast(self, origin: np.ndarray, dirs: np.ndarray, background) -> np.ndarray:
        """Colour of each ray ``dirs [R, 3]`` from ``origin``: nearest box face or the background."""
        h = self.half
        best_t = np.full(dirs.shape[0], np.inf)
        best_face = np.full(dirs.shape[0], -1)
        with np.errstate(divide="ignore", invalid="ignore"):
            for fi, (axis, sign, _, _, _) in enumerate(_FACES):
                d = dirs[:, axis]
                t = (sign * h - origin[axis]) / d
                p = origin[None] + t[:, None] * dirs
                others = [a for a in range(3) if a != axis]
                inside = (np.abs(p[:, others[0]]) <= h) & (np.abs(p[:, others[1]]) <= h)
                # Only faces seen from outside (a ray entering the box) count.
                hit = inside & (t > 0) & (d * sign < 0) & (t < best_t)
                best_t[hit] = t[hit]
                best_face[hit] = fi
        out = np.empty((dirs.shape[0], 3), dtype=np.float32)
        out[:] = np.asarray(background, dtype=np.float32)
        for fi in range(len(_FACES)):
            m = best_face == fi
            if m.any():
                p = origin[None] + best_t[m, None] * dirs[m]
                out[m] = self.color_at(fi, p)
        return out


def _ring_cameras(n: int, radius: float, elevations, phase: float) -> list:
    eyes = []
    for k in range(n):
        az = phase + 2 * math.pi * k / n
        el = elevations[k % len(elevations)]
        eyes.append(
            (radius * math.cos(el) * math.cos(az), radius * math.cos(el) * math.sin(az), radius * math.sin(el))
        )
    return eyes


def default_scene(
    image_size: int = 64,
    n_train: int = 24,
    n_test: int = 6,
    n_points: int = 3000,
    supersample: int = 4,
    camera_distance: float = 4.0,
    fov_deg: float = 40.0,
    half_size: float = 1.0,
    seed: int = 0,
) -> SceneData:
    """Generate the embedded scene: a box textured with six scikit-image photographs.

    Cameras sit on a ring of radius ``camera_distance`` around the box at alternating elevations
    (20 and 35 degrees) and look at its centre; test cameras are placed halfway (in azimuth)
    between training cameras. Everything is deterministic for a given ``seed``.

    Args:
        image_size: width = height of every view, in pixels.
        n_train, n_test: numbers of training and held-out views (>= 1 each).
        n_points: points sampled on the visible faces (with their texture colours) to initialise
            Gaussians from.
        supersample: rays per pixel side used to render ground truth (anti-aliasing).
        camera_distance: distance of the cameras from the box centre.
        fov_deg: horizontal field of view.
        half_size: the box is ``[-half_size, half_size]^3``.
        seed: seed of the point sampling.

    Returns:
        SceneData with a black background.

    Examples:
        >>> scene = default_scene(image_size=16, n_train=2, n_test=1, n_points=10, supersample=1)
        >>> len(scene.train), len(scene.test), tuple(scene.train[0].image.shape)
        (2, 1, (16, 16, 3))
    """
    for name, val, lo in (("image_size", image_size, 4), ("n_train", n_train, 1), ("n_test", n_test, 1),
                          ("n_points", n_points, 1), ("supersample", supersample, 1)):
        if not isinstance(val, int) or val < lo:
            raise ValueError(f"default_scene: {name} must be an integer >= {lo}, got {val!r}")
    if not 0 < fov_deg < 180:
        raise ValueError(f"default_scene: fov_deg must be in (0, 180), got {fov_deg!r}")
    if not half_size > 0:
        raise ValueError(f"default_scene: half_size must be > 0, got {half_size!r}")
    if camera_distance <= math.sqrt(3) * half_size:
        raise ValueError(
            f"default_scene: camera_distance must exceed the box's half-diagonal "
            f"{math.sqrt(3) * half_size:.3f}, got {camera_distance}"
        )
    background = (0.0, 0.0, 0.0)
    f = 0.5 * image_size / math.tan(math.radians(fov_deg) / 2)
    # Texture resolution: a face is 2*half_size wide; seen from the nearest camera distance it covers
    # about f * 2h / (d - h) pixels; rendering supersamples by `supersample` per side.
    tex = int(math.ceil(f * 2 * half_size / (camera_distance - half_size) * supersample))
    box = _TexturedBox(half_size, max(tex, 8))
    K = np.array([[f, 0, image_size / 2], [0, f, image_size / 2], [0, 0, 1]], dtype=np.float64)

    ss = supersample
    # Sub-pixel sample positions (pixel centre at +0.5), ss x ss per pixel.
    sub = (np.arange(image_size * ss) + 0.5) / ss
    jj, ii = np.meshgrid(sub, sub)  # [Hs, Ws]
    cam_dirs = np.stack([(jj - K[0, 2]) / f, (ii - K[1, 2]) / f, np.ones_like(jj)], -1).reshape(-1, 3)

    def make_view(eye, name):
        M = look_at(eye)
        R = M[:3, :3]
        dirs = cam_dirs @ R  # camera -> world: R^T d, written row-wise
        rgb = box.raycast(np.asarray(eye, dtype=np.float64), dirs, background)
        rgb = rgb.reshape(image_size, ss, image_size, ss, 3).mean(axis=(1, 3))
        return View(
            image=torch.from_numpy(np.ascontiguousarray(rgb, dtype=np.float32)),
            viewmat=torch.from_numpy(M.astype(np.float32)),
            K=torch.from_numpy(K.astype(np.float32)),
            width=image_size,
            height=image_size,
            name=name,
        )

    elevs = (math.radians(20.0), math.radians(35.0))
    train_eyes = _ring_cameras(n_train, camera_distance, elevs, 0.0)
    test_eyes = _ring_cameras(n_test, camera_distance, (math.radians(27.5),), math.pi / n_train)
    train = [make_view(e, f"train_{k:03d}") for k, e in enumerate(train_eyes)]
    test = [make_view(e, f"test_{k:03d}") for k, e in enumerate(test_eyes)]

    # Initial points: uniform on the faces some training camera sees from outside.
    rng = np.random.default_rng(seed)
    visible = []
    for fi, (axis, sign, _, _, _) in enumerate(_FACES):
        if any(sign * e[axis] > half_size for e in train_eyes):
            visible.append(fi)
    face_of = rng.choice(np.asarray(visible), size=n_points)
    pts = rng.uniform(-half_size, half_size, size=(n_points, 3))
    cols = np.empty((n_points, 3), dtype=np.float32)
    for fi in visible:
        m = face_of == fi
        axis, sign = _FACES[fi][0], _FACES[fi][1]
        pts[m, axis] = sign * half_size
        cols[m] = box.color_at(fi, pts[m])
    return SceneData(
        train=train,
        test=test,
        points=torch.from_numpy(pts.astype(np.float32)),
        colors=torch.from_numpy(cols),
        extent=float(camera_distance),
        background=background,
    )


# ------------------------------------------------------------------------------------------------
# Loaders
# ------------------------------------------------------------------------------------------------


def _read_image(path: str, background) -> np.ndarray:
    if not os.path.isfile(path):
        raise ValueError(f"image file {path!r} does not exist")
    import skimage.io

    img = np.asarray(skimage.io.imread(path))
    if img.dtype == np.uint8:
        img = img.astype(np.float32) / 255.0
    elif img.dtype == np.uint16:
        img = img.astype(np.float32) / 65535.0
    else:
        img = img.astype(np.float32)
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=-1)
    if img.ndim != 3 or img.shape[-1] not in (3, 4):
        raise ValueError(f"image {path!r}: expected an RGB or RGBA image, got shape {img.shape}")
    if img.shape[-1] == 4:  # composite onto the background, as NeRF-synthetic training does
        a = img[..., 3:4]
        img = img[..., :3] * a + np.asarray(background, dtype=np.float32) * (1 - a)
    return np.ascontiguousarray(img)


def _check_sizes(views: list, where: str) -> None:
    for v in views:
        shape = tuple(v.image.shape)
        if len(shape) != 3 or shape[2] != 3 or shape[:2] != (v.height, v.width):
            raise ValueError(
                f"{where}: view {v.name!r} declares {v.height}x{v.width} and expects an image of shape "
                f"({v.height}, {v.width}, 3), got {shape}"
            )
    sizes = {(v.height, v.width) for v in views}
    if len(sizes) > 1:
        first = views[0]
        odd = next(v for v in views if (v.height, v.width) != (first.height, first.width))
        raise ValueError(
            f"{where}: all images must have the same size, got {first.height}x{first.width} "
            f"({first.name}) and {odd.height}x{odd.width} ({odd.name})"
        )


def _downscale(img: np.ndarray, factor: int) -> np.ndarray:
    if factor == 1:
        return img
    h, w = img.shape[0] // factor * factor, img.shape[1] // factor * factor
    return img[:h, :w].reshape(h // factor, factor, w // factor, factor, 3).mean(axis=(1, 3))


def _random_points(n: int, extent: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    pts = (torch.rand(n, 3, generator=g) * 2 - 1) * extent
    cols = torch.rand(n, 3, generator=g)
    return pts, cols


def load_blender(
    path: str,
    downscale: int = 1,
    white_background: bool = True,
    n_points: int = 3000,
    seed: int = 0,
) -> SceneData:
    """Load a NeRF-synthetic ("Blender") scene: ``transforms_{train,test}.json`` plus images.

    Each json has ``camera_angle_x`` (horizontal field of view, radians) and ``frames``, each with a
    ``file_path`` (relative to ``path``, ``.png`` appended when it has no extension) and a 4x4
    camera->world ``transform_matrix`` in the OpenGL frame (x right, y up, z backward). RGBA images
    are composited on white (or black). With no point cloud in the format, initial points are
    uniform in the cube the cameras look into (half-width 1.3, the NeRF-synthetic convention).
    """
    if not os.path.isdir(path):
        raise ValueError(f"load_blender: dataset directory {path!r} does not exist")
    if not isinstance(downscale, int) or downscale < 1:
        raise ValueError(f"load_blender: downscale must be an integer >= 1, got {downscale!r}")
    background = (1.0, 1.0, 1.0) if white_background else (0.0, 0.0, 0.0)
    splits = {}
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
        fov = float(meta["camera_angle_x"])
        views = []
        for k, fr in enumerate(meta["frames"]):
            if not isinstance(fr, dict) or "file_path" not in fr or "transform_matrix" not in fr:
                raise ValueError(
                    f"load_blender: {fn!r} frame {k} must have 'file_path' and 'transform_matrix', got {fr!r}"
                )
            c2w = np.asarray(fr["transform_matrix"], dtype=np.float64)
            if c2w.shape != (4, 4):
                raise ValueError(
                    f"load_blender: {fn!r} frame {k}: transform_matrix must be 4x4, got shape {c2w.shape}"
                )
            img_path = os.path.join(path, fr["file_path"])
            if not os.path.splitext(img_path)[1]:
                img_path += ".png"
            img = _downscale(_read_image(img_path, background), downscale)
            H, W = img.shape[:2]
            f = 0.5 * W / math.tan(0.5 * fov)
            c2w = c2w.copy()
            c2w[:3, 1:3] *= -1  # OpenGL -> OpenCV camera axes
            viewmat = np.linalg.inv(c2w)
            K = np.array([[f, 0, W / 2], [0, f, H / 2], [0, 0, 1]])
            views.append(
                View(
                    image=torch.from_numpy(img.astype(np.float32)),
                    viewmat=torch.from_numpy(viewmat.astype(np.float32)),
                    K=torch.from_numpy(K.astype(np.float32)),
                    width=W,
                    height=H,
                    name=os.path.basename(img_path),
                )
            )
        if not views:
            raise ValueError(f"load_blender: {fn!r} has no frames")
        splits[split] = views
    _check_sizes(splits["train"] + splits["test"], "load_blender")
    cams = torch.stack([torch.linalg.inv(v.viewmat)[:3, 3] for v in splits["train"]])
    extent = float(cams.norm(dim=-1).max())
    pts, cols = _random_points(n_points, 1.3, seed)
    return SceneData(splits["train"], splits["test"], pts, cols, extent, background)


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
        raise ValueError(f"load_colmap: {fn!r} lists no images (expected lines 'IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME')")
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
            raise ValueError(f"load_colmap: {fn}:{n}: expected 'POINT3D_ID X Y Z R G B ERROR TRACK...', got {s!r}") from None
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


def load_scene(kind: str = "default", path: str | None = None, **kwargs) -> SceneData:
    """Dispatch: ``kind`` = "default" | "blender" | "colmap" (the last two need ``path``)."""
    if kind == "default":
        return default_scene(**kwargs)
    if kind in ("blender", "colmap"):
        if not path:
            raise ValueError(f"load_scene: kind={kind!r} needs a dataset path, got {path!r}")
        return (load_blender if kind == "blender" else load_colmap)(path, **kwargs)
    raise ValueError(f"load_scene: kind must be 'default', 'blender' or 'colmap', got {kind!r}")


class ViewDataset(torch.utils.data.Dataset):
    """A list of :class:`View` as a map-style dataset; items are dicts of tensors.

    Items: ``image [H, W, 3]``, ``viewmat [4, 4]``, ``K [3, 3]``, ``index`` (int64 scalar).
    Use ``batch_size=None`` or a collate that keeps one view per step (the renderer draws one
    camera at a time); ``ViewDataset.views[i]`` gives the :class:`View` itself.
    """

    def __init__(self, views: list):
        if not views:
            raise ValueError("ViewDataset: expected at least one view, got an empty list")
        _check_sizes(views, "ViewDataset")
        self.views = list(views)

    def __len__(self) -> int:
        return len(self.views)

    def __getitem__(self, i: int) -> dict:
        v = self.views[i]
        return {"image": v.image, "viewmat": v.viewmat, "K": v.K, "index": torch.tensor(i)}
