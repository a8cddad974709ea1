"""Scenes: one entry point, :func:`load_scene`, over the default scene and the dataset loaders.

The parts live in their own modules and are re-exported here: :mod:`splatloss.splat.views`
(:class:`View`, :class:`SceneData`, :class:`ViewDataset`, :func:`look_at`),
:mod:`splatloss.splat.synthetic` (:func:`default_scene`), :mod:`splatloss.splat.blender`
(:func:`load_blender`) and :mod:`splatloss.splat.colmap` (:func:`load_colmap`).

Camera convention everywhere (as gsplat): ``viewmat`` is the 4x4 world->camera matrix in the
OpenCV frame (x right, y down, z forward), ``K`` the 3x3 pinhole intrinsics, and pixel ``(row i,
column j)`` has its centre at image coordinates ``(j + 0.5, i + 0.5)``.
"""

from __future__ import annotations

from splatloss.splat.blender import load_blender
from splatloss.splat.colmap import load_colmap
from splatloss.splat.synthetic import default_scene
from splatloss.splat.views import SceneData, View, ViewDataset, look_at

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


def load_scene(kind: str = "default", path: str | None = None, **kwargs) -> SceneData:
    """Dispatch: ``kind`` = "default" | "blender" | "colmap" (the last two need ``path``)."""
    if kind == "default":
        return default_scene(**kwargs)
    if kind in ("blender", "colmap"):
        if not path:
            raise ValueError(f"load_scene: kind={kind!r} needs a dataset path, got {path!r}")
        return (load_blender if kind == "blender" else load_colmap)(path, **kwargs)
    raise ValueError(f"load_scene: kind must be 'default', 'blender' or 'colmap', got {kind!r}")
