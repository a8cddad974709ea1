"""Lightning pieces: :class:`SplatModule`, its data module and the loss / metrics callbacks.

Importing this package imports Lightning (the core ``splatloss`` package never does).
"""

from .callbacks import HeldOutMetrics, LossTerms
from .data import EpochPermutationSampler, SceneDataModule, check_scene
from .module import SplatModule

__all__ = ["SplatModule", "SceneDataModule", "EpochPermutationSampler", "check_scene", "LossTerms", "HeldOutMetrics"]
