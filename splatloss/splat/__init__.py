"""Gaussian splatting parts: Gaussians, the renderer (gsplat on CUDA, gsplat's torch pieces plus our
compositor on CPU), scenes and datasets, densification. Imports gsplat lazily (inside render)."""

from splatloss.splat.gaussians import Gaussians
from splatloss.splat.renderer import render
from splatloss.splat.scenes import SceneData, View, ViewDataset, default_scene, load_blender, load_colmap, load_scene

__all__ = [
    "Gaussians",
    "render",
    "SceneData",
    "View",
    "ViewDataset",
    "default_scene",
    "load_blender",
    "load_colmap",
    "load_scene",
]
