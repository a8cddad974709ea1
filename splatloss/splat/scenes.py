"""Scenes: one entry point, :func:`load_scene`, over the default scene and the dataset loaders.

The parts live in their own modules and are re-exported here: :mod:`splatloss.splat.views`
(:class:`View`, :class:`SceneData`, :class:`ViewDataset`, :func:`look_at`),
:mod:`splatloss.splat.synthetic` (:func:`default_scene`), :mod:`splatloss.splat.blender`
(:func:`load_blender`), :mod:`splatloss.splat.colmap` (:func:`load_colmap`) and
:mod:`splatloss.splat.nerfstudio` (:func:`load_nerfstudio`).

Camera convention everywhere (as gsplat): ``viewmat`` is the 4x4 world->camera matrix in the
OpenCV frame (x right, y down, z forward), ``K`` the 3x3 pinhole intrinsics, and pixel ``(row i,
column j)`` has its centre at image coordinates ``(j + 0.5, i + 0.5)``.
"""

from __future__ import annotations

from splatloss.splat.blender import load_blender
from splatloss.splat.colmap import load_colmap
from splatloss.splat.nerfstudio import load_nerfstudio
from splatloss.splat.synthetic import default_scene
from splatloss.splat.views import SceneData, View, ViewDataset, look_at

__all__ = [
    "View",
    "SceneData",
    "default_scene",
    "load_blender",
    "load_colmap",
    "load_nerfstudio",
    "load_scene",
    "ViewDataset",
    "look_at",
]


_LOADERS = {"blender": load_blender, "colmap": load_colmap, "nerfstudio": load_nerfstudio}


def load_scene(kind: str = "default", path: str | None = None, **kwargs) -> SceneData:
    """Dispatch: ``kind`` = "default" | "blender" | "colmap" | "nerfstudio" (all but the first need ``path``)."""
    if kind == "default":
        return default_scene(**kwargs)
    if kind in _LOADERS:
        if not path:
            raise ValueError(f"load_scene: kind={kind!r} needs a dataset path, got {path!r}")
        return _LOADERS[kind](path, **kwargs)
    raise ValueError(f"load_scene: kind must be 'default', 'blender', 'colmap' or 'nerfstudio', got {kind!r}")
