"""Gaussian splatting parts: Gaussians, the renderer (gsplat on CUDA, gsplat's torch pieces plus our
compositor on CPU), scenes and datasets, densification. Imports gsplat lazily (inside render).

Needs the ``train`` extra (gsplat, scikit-image, numba): ``pip install 'splatloss[train]'``.
"""

from splatloss.extras import require_train_extra

require_train_extra("splatloss.splat", ("gsplat", "skimage", "numba"))

from splatloss.splat.gaussians import Gaussians  # noqa: E402
from splatloss.splat.renderer import render  # noqa: E402
from splatloss.splat.scenes import (  # noqa: E402
    SceneData,
    View,
    ViewDataset,
    default_scene,
    load_blender,
    load_colmap,
    load_nerfstudio,
    load_scene,
)

__all__ = [
    "Gaussians",
    "render",
    "SceneData",
    "View",
    "ViewDataset",
    "default_scene",
    "load_blender",
    "load_colmap",
    "load_nerfstudio",
    "load_scene",
]
