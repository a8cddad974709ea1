"""Lightning pieces: :class:`SplatModule`, its data module and the loss / metrics callbacks.

Importing this package imports Lightning (the core ``splatloss`` package never does). Needs the
``train`` extra: ``pip install 'splatloss[train]'``.
"""

from splatloss.extras import require_train_extra

require_train_extra("splatloss.lightning", ("lightning", "hydra", "omegaconf", "gsplat"))

from .callbacks import HeldOutMetrics, LossTerms, RunInterrupted, StepProgressBar, StopOnSignal  # noqa: E402
from .data import ResumableLoader, SceneDataModule, StepViewSampler, check_scene  # noqa: E402
from .module import SplatModule, TrainingDiverged  # noqa: E402

__all__ = [
    "SplatModule",
    "TrainingDiverged",
    "SceneDataModule",
    "StepViewSampler",
    "ResumableLoader",
    "check_scene",
    "LossTerms",
    "HeldOutMetrics",
    "StepProgressBar",
    "StopOnSignal",
    "RunInterrupted",
]
