"""Views, scenes and the view dataset, plus the image helpers every loader shares.

Camera convention everywhere (as gsplat): ``viewmat`` is the 4x4 world->camera matrix in the
OpenCV frame (x right, y down, z forward), ``K`` the 3x3 pinhole intrinsics, and pixel ``(row i,
column j)`` has its centre at image coordinates ``(j + 0.5, i + 0.5)``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

__all__ = [
    "View",
    "SceneData",
    "ViewDataset",
    "look_at",
    "read_image",
    "read_mask",
    "check_same_size",
    "check_intrinsics",
    "check_pose",
    "check_points",
    "check_view_sizes",
    "box_downscale",
    "make_view",
    "view_name",
    "view_names",
    "random_points",
]


@dataclass
class View:
    """One camera and its image.

    Attributes:
        image: ``[H, W, 3]`` float32 in ``[0, 1]``.
        viewmat: ``[4, 4]`` world->camera (OpenCV frame: x right, y down, z forward).
        K: ``[3, 3]`` pinhole intrinsics in pixels.
        width, height: image size in pixels.
        name: an identifier without a file extension (the image's stem, or ``train_007``); renders
            are written as ``<name>.png``.
        mask: optional ``[H, W]`` float32 weights in ``[0, 1]`` (the alpha of an RGBA image with
            ``alpha_as_mask=True``): pixels of weight 0 do not count in the loss.
    """

    image: torch.Tensor
    viewmat: torch.Tensor
    K: torch.Tensor
    width: int
    height: int
    name: str = ""
    mask: Optional[torch.Tensor] = None


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


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# PNG colour types with several 16-bit samples per pixel -> (Pillow mode, its raw mode's name
# without the byte order, or None: the pixel's bytes read through an 8-bit mode of the same width).
_PNG16 = {2: ("RGB", "RGB;16"), 6: ("RGBA", "RGBA;16"), 4: ("RGBA", None)}


def _png16_color_type(path: str) -> Optional[int]:
    """The colour type of a 16-bit PNG of several samples per pixel (RGB, RGBA, grey + alpha), else None."""
    with open(path, "rb") as fh:
        head = fh.read(26)
    if len(head) < 26 or head[:8] != _PNG_SIGNATURE or head[12:16] != b"IHDR" or head[24] != 16:
        return None
    return head[25] if head[25] in _PNG16 else None


def _read_png16(path: str, color_type: int) -> np.ndarray:
    """A 16-bit RGB, RGBA or grey + alpha PNG as uint16 ``[H, W, C]``.

    Pillow decodes these into 8 bits per sample (its raw modes ``RGB;16B`` / ``RGBA;16B`` keep each
    sample's high byte), so they are decoded twice, keeping the high bytes and then the low ones
    (``;16L`` reads a big-endian sample's second byte); the PNG unfiltering is Pillow's both times,
    at the file's own bytes per pixel. Grey + alpha (4 bytes a pixel) is read as 8-bit RGBA, which
    has that width, and its byte pairs joined."""
    from PIL import Image

    mode, raw = _PNG16[color_type]
    passes = [f"{raw}B", f"{raw}L"] if raw else [mode]
    planes = []
    for rawmode in passes:
        with Image.open(path) as im:
            if im.mode != mode or len(im.tile) != 1:
                raise ValueError(f"Pillow opens it as mode {im.mode!r} in {len(im.tile)} tiles, expected {mode!r} in 1")
            t = im.tile[0]  # (codec, extents, offset, raw mode): a named tuple from Pillow 11, a tuple before
            im.tile = [t._replace(args=rawmode) if hasattr(t, "_replace") else (t[0], t[1], t[2], rawmode)]
            im.load()
            planes.append(np.asarray(im, dtype=np.uint16))
    if raw:
        return (planes[0] << 8) | planes[1]
    b = planes[0]
    return np.stack([(b[..., 0] << 8) | b[..., 1], (b[..., 2] << 8) | b[..., 3]], axis=-1)


def _decode(path: str) -> np.ndarray:
    """The pixels of an image file as stored (uint8, uint16 or float); ``ValueError`` naming the file
    when it is missing, empty or cannot be decoded."""
    if not os.path.isfile(path):
        raise ValueError(f"image file {path!r} does not exist")
    if os.path.getsize(path) == 0:
        raise ValueError(f"image file {path!r} cannot be read (it is empty: 0 bytes); replace it")
    import skimage.io

    color_type = _png16_color_type(path)
    if color_type is not None:
        try:
            return _read_png16(path, color_type)
        except Exception as e:
            import PIL

            raise ValueError(
                f"image file {path!r} cannot be read as a 16-bit PNG ({type(e).__name__}: {e}; Pillow "
                f"{PIL.__version__}): the file is corrupt or truncated (replace it), or this Pillow decodes it "
                "otherwise (convert it to a 16-bit TIFF)"
            ) from None
    try:
        img = np.asarray(skimage.io.imread(path))
    except Exception as e:  # each decoder raises its own type (OSError, ValueError, SyntaxError, ...)
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(
            f"image file {path!r} cannot be read ({reason}); expected a complete PNG, JPEG or TIFF image: "
            "the file is corrupt or truncated, replace it"
        ) from None
    if img.size == 0:
        raise ValueError(f"image file {path!r} is empty (shape {img.shape})")
    return img


def read_image(path: str, background, keep_alpha: bool = False):
    """Read an image as float32 ``[H, W, 3]`` in [0, 1], RGBA composited onto ``background``.

    8-bit and 16-bit images keep every bit (a 16-bit value ``v`` reads as ``v / 65535``); grey
    images become three equal channels, grey + alpha an RGBA image of them. With ``keep_alpha``
    returns ``(rgb, alpha [H, W])`` (alpha all ones for an image without one). A file that is
    missing, cannot be decoded (corrupt or truncated), is empty, is not grey, RGB or RGBA, or holds
    values outside [0, 1] (a float image with NaN, inf, or HDR values) raises ``ValueError`` naming
    the file.
    """
    img = _decode(path)
    if img.dtype == np.uint8:
        img = img.astype(np.float32) / 255.0
    elif img.dtype == np.uint16:
        img = img.astype(np.float32) / 65535.0
    elif img.dtype.kind == "f":
        img = img.astype(np.float32)
        bad = ~np.isfinite(img) | (img < 0) | (img > 1)
        if bad.any():
            finite = img[np.isfinite(img)]
            span = f"[{finite.min():g}, {finite.max():g}]" if finite.size else "no finite value"
            raise ValueError(
                f"image file {path!r}: a floating-point image must hold values in [0, 1], got "
                f"{int((~np.isfinite(img)).sum())} NaN or infinite values and range {span}; tone-map or "
                "convert it to 8-bit or 16-bit"
            )
    else:
        raise ValueError(f"image file {path!r}: expected 8-bit, 16-bit or float pixels in [0, 1], got {img.dtype}")
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=-1)
    elif img.ndim == 3 and img.shape[-1] == 2:  # grey + alpha
        img = np.concatenate([np.repeat(img[..., :1], 3, axis=-1), img[..., 1:]], axis=-1)
    if img.ndim != 3 or img.shape[-1] not in (3, 4):
        raise ValueError(f"image {path!r}: expected an RGB or RGBA image, got shape {img.shape}")
    alpha = np.ones(img.shape[:2], dtype=np.float32)
    if img.shape[-1] == 4:  # composite onto the background, as NeRF-synthetic training does
        alpha = np.ascontiguousarray(img[..., 3])
        a = img[..., 3:4]
        img = img[..., :3] * a + np.asarray(background, dtype=np.float32) * (1 - a)
    img = np.ascontiguousarray(img)
    return (img, alpha) if keep_alpha else img


def read_mask(path: str, where: str) -> np.ndarray:
    """A one-channel mask image as float32 ``[H, W]``: 1 where the pixel is non-zero (counts in the
    loss), 0 where it is zero, nerfstudio's reading of ``mask_path``. ``ValueError`` prefixed by
    ``where`` for a file that is missing, undecodable or of more than one channel."""
    try:
        m = _decode(path)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    if m.ndim == 3 and m.shape[-1] == 1:
        m = m[..., 0]
    if m.ndim != 2:
        raise ValueError(
            f"{where}: the mask {path!r} must have one channel (black: ignored, white: counted), got shape "
            f"{m.shape}; save it as a greyscale image"
        )
    return np.ascontiguousarray(m > 0, dtype=np.float32)


def check_same_size(first: tuple, path: str, img: np.ndarray, where: str) -> tuple:
    """``first``: ``(path, (H, W))`` of the first image read, or None. Returns it (or this image's, when
    None); raises ``ValueError`` prefixed by ``where`` naming both files when ``img`` has another size
    (the pipeline trains on views of one size)."""
    if first is None:
        return (path, tuple(img.shape[:2]))
    if tuple(img.shape[:2]) != first[1]:
        (h0, w0), (h, w) = first[1], img.shape[:2]
        raise ValueError(
            f"{where}: all images must have the same size, got {h0}x{w0} ({first[0]!r}) and {h}x{w} ({path!r}); "
            "resize or crop them to one size"
        )
    return first


def check_intrinsics(fx, fy, cx, cy, width, height, where: str) -> None:
    """Focal lengths finite and > 0, principal point finite, size at least 1x1 pixel; else a
    ``ValueError`` prefixed by ``where`` (the file and camera)."""
    values = {"fx": fx, "fy": fy, "cx": cx, "cy": cy}
    bad = {k: v for k, v in values.items() if not math.isfinite(float(v))}
    if bad:
        raise ValueError(f"{where}: the intrinsics must be finite numbers, got {bad}")
    small = {k: v for k, v in (("fx", fx), ("fy", fy)) if not float(v) > 0}
    if small:
        raise ValueError(f"{where}: the focal length must be > 0 pixels, got {small}")
    if not (math.isfinite(float(width)) and math.isfinite(float(height)) and width >= 1 and height >= 1):
        raise ValueError(f"{where}: the image size must be at least 1x1 pixel, got width {width}, height {height}")


def check_pose(matrix, where: str, tol: float = 1e-3) -> np.ndarray:
    """A 4x4 rigid transform (camera->world or world->camera) as float64: finite, bottom row
    ``0 0 0 1``, a rotation block (orthonormal to ``tol``, determinant +1). Else a ``ValueError``
    prefixed by ``where`` (the file and the image) that shows the matrix."""
    M = np.asarray(matrix, dtype=np.float64)
    if M.shape != (4, 4):
        raise ValueError(f"{where}: the pose must be a 4x4 matrix, got shape {M.shape}")
    if not np.isfinite(M).all():
        raise ValueError(f"{where}: the pose has NaN or infinite entries: {M.tolist()}")
    if not np.allclose(M[3], [0.0, 0.0, 0.0, 1.0], atol=tol, rtol=0):
        raise ValueError(f"{where}: the pose's bottom row must be [0, 0, 0, 1], got {M[3].tolist()}")
    R = M[:3, :3]
    err = float(np.abs(R.T @ R - np.eye(3)).max())
    if err > tol or np.linalg.det(R) < 0:
        raise ValueError(
            f"{where}: the pose's 3x3 block must be a rotation (orthonormal, determinant +1), got determinant "
            f"{np.linalg.det(R):.6g} and |R^T R - I| up to {err:.3g}: {R.tolist()}"
        )
    return M


def check_points(points: np.ndarray, where: str, labels=None) -> None:
    """``[P, 3]`` initial points all finite; else a ``ValueError`` prefixed by ``where`` (the file)
    naming the first bad point (``labels[i]``: its line or id) and how many there are."""
    pts = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    bad = np.flatnonzero(~np.isfinite(pts).all(axis=1))
    if bad.size:
        i = int(bad[0])
        which = labels[i] if labels is not None else f"point {i}"
        raise ValueError(
            f"{where}: {bad.size} of {len(pts)} initial points have NaN or infinite coordinates, the first at "
            f"{which}: {pts[i].tolist()}; remove them from the point cloud"
        )


def check_view_sizes(views: list, where: str) -> None:
    """Raise ``ValueError`` (prefixed by ``where``) unless every view's image is ``[H, W, 3]`` of its
    declared size, all views share one size, and either all or none carry a mask of that size."""
    for v in views:
        shape = tuple(v.image.shape)
        if len(shape) != 3 or shape[2] != 3 or shape[:2] != (v.height, v.width):
            raise ValueError(
                f"{where}: view {v.name!r} declares {v.height}x{v.width} and expects an image of shape "
                f"({v.height}, {v.width}, 3), got {shape}"
            )
        if v.mask is not None and tuple(v.mask.shape) != (v.height, v.width):
            raise ValueError(
                f"{where}: view {v.name!r} expects a mask of shape ({v.height}, {v.width}), got {tuple(v.mask.shape)}"
            )
    with_mask = [v.mask is not None for v in views]
    if any(with_mask) and not all(with_mask):
        a = views[with_mask.index(True)].name
        b = views[with_mask.index(False)].name
        raise ValueError(f"{where}: either every view has a mask or none does, got one on {a!r} and none on {b!r}")
    sizes = {(v.height, v.width) for v in views}
    if len(sizes) > 1:
        first = views[0]
        odd = next(v for v in views if (v.height, v.width) != (first.height, first.width))
        raise ValueError(
            f"{where}: all images must have the same size, got {first.height}x{first.width} "
            f"({first.name}) and {odd.height}x{odd.width} ({odd.name})"
        )


def box_downscale(img: np.ndarray, factor: int) -> np.ndarray:
    """Mean over ``factor x factor`` blocks (``[H, W, ...]``), the ragged right / bottom edge cropped:
    pixel coordinate ``x`` maps to ``x / factor``."""
    if factor == 1:
        return img
    h, w = img.shape[0] // factor * factor, img.shape[1] // factor * factor
    rest = img.shape[2:]
    return img[:h, :w].reshape(h // factor, factor, w // factor, factor, *rest).mean(axis=(1, 3))


def make_view(img: np.ndarray, alpha, viewmat: np.ndarray, K: np.ndarray, name: str) -> View:
    """A :class:`View` from numpy arrays (``alpha [H, W]`` or None: no mask)."""
    return View(
        image=torch.from_numpy(np.ascontiguousarray(img, dtype=np.float32)),
        viewmat=torch.from_numpy(np.asarray(viewmat, dtype=np.float32)),
        K=torch.from_numpy(np.asarray(K, dtype=np.float32)),
        width=int(img.shape[1]),
        height=int(img.shape[0]),
        name=name,
        mask=None if alpha is None else torch.from_numpy(np.ascontiguousarray(alpha, dtype=np.float32)),
    )


def view_name(file_name: str) -> str:
    """A view name: the file's path without its extension (``images/r_0.png`` -> ``r_0``)."""
    return os.path.splitext(os.path.basename(file_name))[0]


def view_names(paths, where: str) -> list:
    """Names of the views of ``paths`` (image files relative to the dataset's folder): the files'
    stems (``images/r_0.png`` -> ``r_0``) when those are all distinct; else, for images of one file
    name in several folders (a camera rig's ``cam0/0001.png`` and ``cam1/0001.png``), each path
    without its extension and with its folders joined by ``_`` (``cam0_0001``), so that every view's
    renders get a file of their own. Two paths that still read the same raise ``ValueError``
    prefixed by ``where``."""
    paths = [str(p) for p in paths]
    names = [view_name(p) for p in paths]
    if len(set(names)) == len(names):
        return names
    parts = [os.path.normpath(p.replace("\\", "/")).replace("\\", "/").split("/") for p in paths]
    names = ["_".join(q for q in p[:-1] if q not in (".", "")) + "_" + view_name(p[-1]) if len(p) > 1
             else view_name(p[-1]) for p in parts]  # fmt: skip
    seen = {}
    for p, n in zip(paths, names):
        if n in seen:
            raise ValueError(
                f"{where}: the images {seen[n]!r} and {p!r} would both be named {n!r} (their renders would "
                "overwrite each other); rename one of them"
            )
        seen[n] = p
    return names


def random_points(n: int, extent: float, seed: int):
    """``n`` points uniform in the cube ``[-extent, extent]^3`` and uniform colours, from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    pts = (torch.rand(n, 3, generator=g) * 2 - 1) * extent
    cols = torch.rand(n, 3, generator=g)
    return pts, cols


class ViewDataset(torch.utils.data.Dataset):
    """A list of :class:`View` as a map-style dataset; items are dicts of tensors.

    Items: ``image [H, W, 3]``, ``viewmat [4, 4]``, ``K [3, 3]``, ``index`` (int64 scalar), and
    ``mask [H, W]`` when the views carry one.
    Use ``batch_size=None`` or a collate that keeps one view per step (the renderer draws one
    camera at a time); ``ViewDataset.views[i]`` gives the :class:`View` itself.
    """

    def __init__(self, views: list):
        if not views:
            raise ValueError("ViewDataset: expected at least one view, got an empty list")
        check_view_sizes(views, "ViewDataset")
        self.views = list(views)

    def __len__(self) -> int:
        return len(self.views)

    def __getitem__(self, i: int) -> dict:
        v = self.views[i]
        item = {"image": v.image, "viewmat": v.viewmat, "K": v.K, "index": torch.tensor(i)}
        if v.mask is not None:
            item["mask"] = v.mask
        return item
