"""A smooth camera path through the training views, rendered as a video (``render_traj=true``).

The path (:func:`camera_path`): the training cameras, ordered by their angle around the centre of
their positions in the plane they spread over most (the two principal axes of the camera centres,
which follows the ring of an object-centric capture and the sweep of a forward-facing one), thinned
to at most ``n_keyframes`` evenly spaced along that order, are the keyframes. Between them the
camera centre follows a periodic cubic spline (C2: no jolt in speed or direction) and the rotation
is slerped between the neighbouring keyframes' rotations, both against the same parameter, the
cumulative distance between keyframe centres, so the camera moves at a steady pace. The path is
closed: the video loops. The intrinsics and image size are those of the first training view.

The video (:func:`write_video`): MP4 (H.264) when ``imageio-ffmpeg`` is installed (``pip install
imageio-ffmpeg``, which ships its own ffmpeg), else an animated GIF written with Pillow.
"""

from __future__ import annotations

import math
import os
from typing import Callable, List, Sequence

import numpy as np
import torch

from splatloss.atomic import atomic_output
from splatloss.splat.views import View

__all__ = ["camera_path", "render_path", "write_video", "render_trajectory", "video_format"]


def _centres_and_rotations(views: Sequence[View]):
    """Camera centres ``[N, 3]`` and camera->world rotations ``[N, 3, 3]`` (float64)."""
    M = np.stack([np.asarray(v.viewmat.detach().cpu(), dtype=np.float64) for v in views])
    R = M[:, :3, :3]
    centres = -np.einsum("nji,nj->ni", R, M[:, :3, 3])  # c = -R^T t
    return centres, np.transpose(R, (0, 2, 1))


def camera_path(views: Sequence[View], n_frames: int = 120, n_keyframes: int = 12) -> List[np.ndarray]:
    """``n_frames`` world->camera 4x4 matrices (float64) along a closed smooth path through ``views``.

    Args:
        views: the training views (at least 2, with distinct camera centres).
        n_frames: frames of the path (>= 2).
        n_keyframes: at most this many views are passed through (>= 2), evenly spaced in their
            order around the capture; fewer keyframes give a smoother, rounder path.
    """
    from scipy.interpolate import CubicSpline
    from scipy.spatial.transform import Rotation, Slerp

    if not isinstance(n_frames, int) or isinstance(n_frames, bool) or n_frames < 2:
        raise ValueError(f"camera_path: n_frames must be an integer >= 2, got {n_frames!r}")
    if not isinstance(n_keyframes, int) or isinstance(n_keyframes, bool) or n_keyframes < 2:
        raise ValueError(f"camera_path: n_keyframes must be an integer >= 2, got {n_keyframes!r}")
    if len(views) < 2:
        raise ValueError(f"camera_path: needs at least 2 training views to pass through, got {len(views)}")
    centres, rots = _centres_and_rotations(views)
    mean = centres.mean(0)
    # The plane the centres spread over most: the first two principal axes.
    _, _, axes = np.linalg.svd(centres - mean, full_matrices=False)
    uv = (centres - mean) @ axes[:2].T
    order = np.argsort(np.arctan2(uv[:, 1], uv[:, 0]), kind="stable")
    if len(order) > n_keyframes:
        order = order[np.round(np.linspace(0, len(order), n_keyframes, endpoint=False)).astype(int)]
    key_c, key_r = centres[order], rots[order]
    # Keyframes at one place give a zero-length segment: keep the first of each run.
    keep = [0] + [i for i in range(1, len(order)) if np.linalg.norm(key_c[i] - key_c[i - 1]) > 1e-9]
    key_c, key_r = key_c[keep], key_r[keep]
    if len(key_c) < 2:
        raise ValueError("camera_path: the training cameras all sit at one position; there is no path through them")
    closed_c = np.concatenate([key_c, key_c[:1]])
    t = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(closed_c, axis=0), axis=1))])
    spline = CubicSpline(t, closed_c, bc_type="periodic")
    slerp = Slerp(t, Rotation.from_matrix(np.concatenate([key_r, key_r[:1]])))
    s = np.linspace(0.0, t[-1], n_frames, endpoint=False)
    pos, c2w_rot = spline(s), slerp(s).as_matrix()
    out = []
    for c, Rc in zip(pos, c2w_rot):
        M = np.eye(4)
        M[:3, :3] = Rc.T
        M[:3, 3] = -Rc.T @ c
        out.append(M)
    return out


def render_path(render_fn: Callable, views: Sequence[View], path: Sequence[np.ndarray]) -> np.ndarray:
    """Render each world->camera matrix of ``path`` with the first view's intrinsics and size.

    ``render_fn(view)`` returns the image ``[H, W, 3]`` (or the renderer's dict with ``"image"``);
    e.g. ``SplatModule.render_view``, or ``lambda v: render(gaussians, v)``. Returns uint8
    ``[N, H, W, 3]`` frames.
    """
    v0 = views[0]
    frames = []
    with torch.no_grad():
        for M in path:
            view = View(
                image=torch.zeros(0, device=v0.image.device),
                viewmat=torch.as_tensor(M, dtype=torch.float32),
                K=v0.K.detach().cpu().float(),
                width=v0.width,
                height=v0.height,
                name="trajectory",
            )
            out = render_fn(view)
            img = out["image"] if isinstance(out, dict) else out
            frames.append((img.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy())
    return np.stack(frames)


def video_format() -> str:
    """``"mp4"`` when imageio-ffmpeg is importable (it ships an ffmpeg binary), else ``"gif"``."""
    try:
        import imageio_ffmpeg  # noqa: F401
    except ImportError:
        return "gif"
    return "mp4"


def write_video(frames: np.ndarray, stem: str, fps: float = 30.0) -> str:
    """Write uint8 ``[N, H, W, 3]`` frames to ``<stem>.mp4`` (H.264, when imageio-ffmpeg is
    installed) or ``<stem>.gif`` (Pillow), atomically; returns the path written."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or len(frames) == 0:
        raise ValueError(
            f"write_video: expected uint8 frames [N, H, W, 3] with N >= 1, got {frames.dtype} {frames.shape}"
        )
    if not (isinstance(fps, (int, float)) and math.isfinite(fps) and fps > 0):
        raise ValueError(f"write_video: fps must be a number > 0, got {fps!r}")
    if video_format() == "mp4":
        import imageio.v2 as iio

        # H.264 in yuv420p needs even sides: pad by repeating the last row / column.
        h, w = frames.shape[1:3]
        frames = np.pad(frames, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), mode="edge")
        path = f"{stem}.mp4"
        with atomic_output(path) as tmp:
            with iio.get_writer(
                tmp, format="FFMPEG", mode="I", fps=fps, codec="libx264", pixelformat="yuv420p",
                macro_block_size=1, output_params=["-crf", "18"],
            ) as writer:  # fmt: skip
                for f in frames:
                    writer.append_data(f)
        return path
    from PIL import Image

    path = f"{stem}.gif"
    images = [Image.fromarray(f) for f in frames]
    with atomic_output(path) as tmp:
        images[0].save(
            tmp, format="GIF", save_all=True, append_images=images[1:], duration=max(int(round(1000 / fps)), 20),
            loop=0,
        )  # fmt: skip
    return path


def render_trajectory(
    render_fn: Callable,
    views: Sequence[View],
    stem: str,
    n_frames: int = 120,
    fps: float = 30.0,
    n_keyframes: int = 12,
) -> str:
    """Render the scene along :func:`camera_path` through ``views`` and write it with
    :func:`write_video` to ``<stem>.mp4`` or ``<stem>.gif``; returns the path written."""
    path = camera_path(views, n_frames=n_frames, n_keyframes=n_keyframes)
    os.makedirs(os.path.dirname(os.path.abspath(stem)), exist_ok=True)
    return write_video(render_path(render_fn, views, path), stem, fps=fps)
