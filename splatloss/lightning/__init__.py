"""Lightning pieces: :class:`SplatModule`, its data module and the loss / metrics callbacks.

Importing this package imports Lightning (the core ``splatloss`` package never does). Needs the
``train`` extra: ``pip install 'splatloss[train]'``.
"""

import importlib.util as _importlib_util
import sys as _sys


def _missing_train_extra() -> list:
    missing = []
    for mod in ("lightning", "hydra", "omegaconf", "gsplat"):
        if mod in _sys.modules:
            if _sys.modules[mod] is None:
                missing.append(mod)
        elif _importlib_util.find_spec(mod) is None:
            missing.append(mod)
    return missing


if _missing_train_extra():
    raise ImportError(
        f"splatloss.lightning needs the training dependencies; {', '.join(_missing_train_extra())} "
        "could not be imported. Install them with: pip install 'splatloss[train]'"
    )

from .callbacks import HeldOutMetrics, LossTerms, StepProgressBar, StopOnSignal  # noqa: E402
from .data import ResumableLoader, SceneDataModule, StepViewSampler, check_scene  # noqa: E402
from .module import SplatModule  # noqa: E402

__all__ = [
    "SplatModule",
    "SceneDataModule",
    "StepViewSampler",
    "ResumableLoader",
    "check_scene",
    "LossTerms",
    "HeldOutMetrics",
    "StepProgressBar",
    "StopOnSignal",
]
