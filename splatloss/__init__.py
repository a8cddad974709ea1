"""splatloss: exact, fast SSIM / MS-SSIM and photometric losses for Gaussian splatting.

Public names only; importing splatloss imports neither Triton, Lightning, Hydra nor gsplat.
"""

from .compat import fused_ssim
from .config import MS_SSIM_WEIGHTS, SSIMConfig
from .functional import dssim, dssim_l1, dssim_with_gradient, ms_ssim, ssim, ssim_map
from .losses import MSSSIMLoss, PhotometricLoss, S3IMLoss, SSIMLoss
from .rays import s3im

__all__ = [
    "SSIMConfig",
    "MS_SSIM_WEIGHTS",
    "ssim",
    "ssim_map",
    "ms_ssim",
    "dssim",
    "dssim_l1",
    "dssim_with_gradient",
    "SSIMLoss",
    "MSSSIMLoss",
    "PhotometricLoss",
    "s3im",
    "S3IMLoss",
    "fused_ssim",
]

__version__ = "0.1.0"
