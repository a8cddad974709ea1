"""The named SSIM conventions, each with its parameters, in one place.

Papers and libraries report "SSIM" with different windows, constants, paddings and covariance
estimators, and the numbers differ in the second or third decimal. Each convention below is one
:class:`Convention`; the metrics the pipeline logs, the Lightning callbacks and the drop-ins of
:mod:`splatloss.compat` all take theirs from here. ``docs/conventions.md`` has the table.

==================  ===========================================================================
name                what it matches
==================  ===========================================================================
``splatloss``       splatloss's default: 11x11 Gaussian (sigma 1.5), K1 0.01, K2 0.03, "valid",
                    population covariance; scikit-image with ``gaussian_weights=True, sigma=1.5,
                    use_sample_covariance=False``; the default of every function
``3dgs``            what 3D Gaussian Splatting trains with and reports: the same window, zero
                    ("same") padding to the image size
``fused_ssim``      the fused-ssim package: as ``3dgs`` ("same"; "valid" on request), data range 1
``skimage``         scikit-image's ``structural_similarity`` defaults: 7x7 uniform window, sample
                    covariance (N / (N - 1), N = 49), "valid"
``pytorch_msssim``  pytorch-msssim 1.0: 11x11 Gaussian, "valid", ``data_range=255`` by default, its
                    own MS-SSIM pyramid (zero-padded 2x2 means on odd sides)
``tf_ms_ssim``      TF's ``tf.image.ssim_multiscale``: 11x11 Gaussian, "valid", Wang 2003 weights,
                    odd sides repeat-padded before 2x2 means; what :func:`splatloss.ms_ssim` computes
==================  ===========================================================================

Examples:
    >>> get("3dgs").config().padding
    'same'
    >>> cfg = get("skimage").config(data_range=255.0)
    >>> cfg.window, cfg.window_size, round(cfg.C2, 6)
    ('uniform', 7, 57.328163)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

import torch

from .config import MS_SSIM_WEIGHTS, SSIMConfig
from .functional import ssim

__all__ = ["Convention", "CONVENTIONS", "get", "ms_ssim_weights_for", "ssim_3dgs", "ssim_skimage"]


@dataclass(frozen=True)
class Convention:
    """One published way of computing SSIM.

    Attributes:
        name: the key in :data:`CONVENTIONS`.
        matches: the implementation (or paper) whose numbers it reproduces.
        options: the :class:`~splatloss.config.SSIMConfig` options that differ from the defaults.
        data_range: the data range that implementation assumes when none is given.
        sample_covariance: whether (co)variances are sample estimates (times ``N / (N - 1)`` for a
            window of ``N`` equal taps) rather than population ones.
        ms_weights: MS-SSIM scale weights, finest first, where the convention defines MS-SSIM.
        ms_pyramid: how an odd side is halved between MS-SSIM scales: ``"repeat"`` (TF, Wang 2003:
            repeat the last row / column, then 2x2 means) or ``"zeros"`` (pytorch-msssim:
            ``avg_pool2d`` with zero padding on both sides).
    """

    name: str
    matches: str
    options: Mapping[str, Any] = field(default_factory=dict)
    data_range: float = 1.0
    sample_covariance: bool = False
    ms_weights: Optional[Tuple[float, ...]] = None
    ms_pyramid: Optional[str] = None

    def config(self, data_range: Optional[float] = None, **overrides) -> SSIMConfig:
        """The :class:`SSIMConfig` that computes this convention for images of ``data_range``
        (default: the convention's own), with any option overridden.

        Sample covariance is folded into the constants: the factor ``s = N / (N - 1)`` scales every
        (co)variance and appears only in the contrast-structure term, ``(2 s v_xy + C2) / (s (v_x +
        v_y) + C2) = (2 v_xy + C2 / s) / (v_x + v_y + C2 / s)``, so population statistics with
        ``C2 / s`` give the same number exactly.
        """
        dr = self.data_range if data_range is None else data_range
        options = dict(self.options, data_range=dr, **overrides)
        if self.sample_covariance and options.get("c2") is None:
            cfg = SSIMConfig(**options)
            n = cfg.window_size**2
            options["c2"] = cfg.C2 / (n / (n - 1))
        return SSIMConfig(**options)


CONVENTIONS: Dict[str, Convention] = {
    c.name: c
    for c in (
        Convention(
            "splatloss",
            "scikit-image structural_similarity(gaussian_weights=True, sigma=1.5, use_sample_covariance=False)",
            ms_weights=MS_SSIM_WEIGHTS,
            ms_pyramid="repeat",
        ),
        Convention("3dgs", "3D Gaussian Splatting's utils/loss_utils.py ssim (Kerbl et al. 2023)", {"padding": "same"}),
        Convention("fused_ssim", "fused-ssim (Taming 3DGS), padding='same'", {"padding": "same"}),
        Convention(
            "skimage",
            "scikit-image structural_similarity defaults",
            {"window": "uniform", "window_size": 7},
            sample_covariance=True,
        ),
        Convention(
            "pytorch_msssim",
            "pytorch-msssim 1.0 ssim / ms_ssim",
            data_range=255.0,
            ms_weights=MS_SSIM_WEIGHTS,
            ms_pyramid="zeros",
        ),
        Convention(
            "tf_ms_ssim",
            "TF tf.image.ssim_multiscale (Wang, Simoncelli & Bovik 2003)",
            ms_weights=MS_SSIM_WEIGHTS,
            ms_pyramid="repeat",
        ),
    )
}


def get(name: str) -> Convention:
    """The convention called ``name``, or a ValueError listing the known ones."""
    if not isinstance(name, str) or name not in CONVENTIONS:
        raise ValueError(f"unknown SSIM convention {name!r}; the conventions are {tuple(CONVENTIONS)}")
    return CONVENTIONS[name]


def ssim_3dgs(pred: torch.Tensor, target: torch.Tensor, data_range: float = 1.0) -> torch.Tensor:
    """Per-image SSIM ``(B,)`` as 3D Gaussian Splatting reports it (``utils/loss_utils.py``'s ``ssim``,
    which its ``metrics.py`` uses): the ``3dgs`` convention.

    Examples:
        >>> x = torch.rand(1, 3, 16, 16)
        >>> round(float(ssim_3dgs(x, x)[0]), 6)
        1.0
    """
    return ssim(pred, target, reduction="none", config=get("3dgs").config(data_range))


def ssim_skimage(pred: torch.Tensor, target: torch.Tensor, data_range: float = 1.0) -> torch.Tensor:
    """Per-image SSIM ``(B,)`` in scikit-image's default convention,
    ``skimage.metrics.structural_similarity(im1, im2, data_range=data_range, channel_axis=-1)``: the
    ``skimage`` convention.

    Examples:
        >>> x = torch.rand(1, 3, 16, 16)
        >>> round(float(ssim_skimage(x, x)[0]), 6)
        1.0
    """
    return ssim(pred, target, reduction="none", config=get("skimage").config(data_range))


def ms_ssim_weights_for(size: int, window_size: int = 11) -> tuple:
    """The standard MS-SSIM weights truncated to the scales a ``size``-pixel side allows with
    "valid" padding, renormalised to sum to 1; all five, unchanged, when the image is large enough (>= 161 px
    for an 11-px window). The metric stays comparable between runs on one scene, not with
    full five-scale MS-SSIM numbers published for large images.

    Examples:
        >>> len(ms_ssim_weights_for(256)), len(ms_ssim_weights_for(64))
        (5, 3)
    """
    scales = 0
    while scales < len(MS_SSIM_WEIGHTS) and size >= (window_size - 1) * 2**scales + 1:
        scales += 1
    if scales == 0:
        raise ValueError(f"images of side {size} are too small for SSIM with a {window_size}-px window")
    if scales == len(MS_SSIM_WEIGHTS):
        return tuple(MS_SSIM_WEIGHTS)  # the standard metric, as published (its weights sum to 1.0001)
    w = MS_SSIM_WEIGHTS[:scales]
    total = sum(w)
    return tuple(x / total for x in w)
