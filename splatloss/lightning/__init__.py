"""Lightning pieces: :class:`SplatModule`, its data module and the loss / metrics callbacks.

Importing this package imports Lightning (the core ``splatloss`` package never does).
"""

from .callbacks import HeldOutMetrics, LossTerms, StepProgressBar
from .data import ResumableLoader, SceneDataModule, StepViewSampler, check_scene
from .module import SplatModule

__all__ = ["SplatModule", "SceneDataModule", "StepViewSampler", "ResumableLoader", "check_scene", "LossTerms", "HeldOutMetrics", "StepProgressBar"]
