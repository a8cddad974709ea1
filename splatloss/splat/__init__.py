"""Gaussian splatting parts: Gaussians, the renderer (gsplat on CUDA, gsplat's torch pieces plus our
compositor on CPU), scenes and datasets, densification. Imports gsplat lazily (inside render).

Needs the ``train`` extra (gsplat, scikit-image, numba): ``pip install 'splatloss[train]'``.
"""

import importlib.util as _importlib_util
import sys as _sys


def _missing_train_extra() -> list:
    missing = []
    for mod in ("gsplat", "skimage", "numba"):
        if mod in _sys.modules:
            if _sys.modules[mod] is None:
                missing.append(mod)
        elif _importlib_util.find_spec(mod) is None:
            missing.append(mod)
    return missing


if _missing_train_extra():
    raise ImportError(
        f"splatloss.splat needs the training dependencies; {', '.join(_missing_train_extra())} "
        "could not be imported. Install them with: pip install 'splatloss[train]'"
    )

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
