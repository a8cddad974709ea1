"""The generated default scene: a photo-textured box.

The default scene is generated, never downloaded: photographs that ship inside scikit-image
(astronaut, coffee, chelsea, rocket, immunohistochemistry, hubble deep field) are textured onto the
six faces of a box, and ground truth is ray-cast from known cameras on a ring around it. Textures
are prefiltered to the pixel footprint (resized to about the size a face covers in the image, then
every pixel averages ``supersample x supersample`` rays), so the ground truth has no aliasing the
Gaussians could not represent. Train and test cameras interleave on the ring, so the held-out views
are new viewpoints between training viewpoints.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from splatloss.splat.views import SceneData, View, look_at

__all__ = ["default_scene"]

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
            resize(_photo(f[4]), (texture_size, texture_size), anti_aliasing=True).astype(np.float32) for f in _FACES
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
        eyes.append((radius * math.cos(el) * math.cos(az), radius * math.cos(el) * math.sin(az), radius * math.sin(el)))
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
    for name, val, lo in (
        ("image_size", image_size, 4),
        ("n_train", n_train, 1),
        ("n_test", n_test, 1),
        ("n_points", n_points, 1),
        ("supersample", supersample, 1),
    ):
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
