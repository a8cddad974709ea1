"""splatloss: exact, fast SSIM / MS-SSIM and photometric losses for Gaussian splatting.

Public names only; importing splatloss imports neither Triton, Lightning, Hydra nor gsplat.
"""

from .config import MS_SSIM_WEIGHTS, SSIMConfig
from .functional import dssim, dssim_l1, dssim_with_gradient, ms_ssim, ssim, ssim_map

__all__ = [
    "SSIMConfig",
    "MS_SSIM_WEIGHTS",
    "ssim",
    "ssim_map",
    "ms_ssim",
    "dssim",
    "dssim_l1",
    "dssim_with_gradient",
]

__version__ = "0.1.0"
