"""Loss modules: thin ``nn.Module`` twins of the functions, plus the weighted photometric loss.

Modules only hold validated configuration (a frozen :class:`~splatloss.config.SSIMConfig`, checked
when the module is built, so a bad Hydra config fails before training) and pass it, as one object,
to :mod:`splatloss.functional` and the backends. They take the SSIM options as keywords (or one
``config=``), exactly as the functions do.
"""

from __future__ import annotations

import math
import numbers
from typing import Dict, Mapping, Optional

import torch
import torch.nn as nn

from . import functional
from .checks import (
    check_backend,
    check_fraction,
    check_ms_size,
    check_reduction,
    check_size,
    check_tau,
    check_weights,
    reduce,
)
from .config import (
    K1,
    K2,
    MS_SSIM_WEIGHTS,
    SSIMConfig,
    accumulation_dtype,
    resolve,
    takes_options,
    to_accumulation_dtype,
    without_autocast,
)
from .filtering import window_filter
from .functional import DEFAULT_TAU
from .rays import S3IMConfig, s3im_loss_with_config

__all__ = ["SSIMLoss", "MSSSIMLoss", "S3IMLoss", "PhotometricLoss", "TERMS"]

#: Terms PhotometricLoss knows, each an unweighted per-image loss value:
#: ``l1`` mean |pred - target|; ``l2`` mean (pred - target)^2; ``dssim`` 1 - SSIM;
#: ``msssim`` 1 - MS-SSIM (with the smooth positive extension, see MSSSIMLoss);
#: ``l1_gaussian`` the L1 error weighted by the coarsest-scale Gaussian (Zhao et al. 2017);
#: ``s3im`` 1 - S3IM of the image's pixels taken as a batch of rays (Xie et al. 2023).
TERMS = ("l1", "l2", "dssim", "msssim", "l1_gaussian", "s3im")


class SSIMLoss(nn.Module):
    """``1 - SSIM`` as a module (the twin of :func:`splatloss.ssim`; takes the same keywords).

    Examples:
        >>> loss = SSIMLoss(padding="same")
        >>> x = torch.rand(2, 3, 32, 32, requires_grad=True)
        >>> value = loss(x, torch.rand(2, 3, 32, 32))
        >>> value.backward()
        >>> x.grad.shape
        torch.Size([2, 3, 32, 32])
    """

    @takes_options
    def __init__(
        self, *, reduction: str = "mean", backend: str = "auto", config: Optional[SSIMConfig] = None, **options
    ):
        super().__init__()
        self.cfg = resolve(config, options)
        self.reduction = check_reduction(reduction)
        self.backend = check_backend(backend)

    def forward(self, pred: torch.Tensor, target: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``1 - SSIM``; ``mask``: per-pixel weights with the semantics of :func:`splatloss.ssim`."""
        return functional.dssim(
            pred, target, reduction=self.reduction, backend=self.backend, mask=mask, config=self.cfg
        )

    def extra_repr(self) -> str:
        return f"{self.cfg}, reduction={self.reduction!r}, backend={self.backend!r}"


class MSSSIMLoss(nn.Module):
    """``1 - MS-SSIM`` as a module (the twin of :func:`splatloss.ms_ssim`), safe to train with.

    How a non-positive term is handled: the metric (TF) clamps each scale's cs (and the last
    scale's SSIM) with relu, so as soon as one scale's term is ``<= 0`` the product is 0 and its
    gradient is 0 or NaN: training stalls exactly where the images disagree most (e.g. an
    inverted image, or fine detail that agrees while coarse structure is inverted). This loss
    replaces relu by the smooth positive extension ``f(x) = x`` for ``x >= tau`` and
    ``tau^2 / (2 tau - x)`` below (``tau=0.01`` by default): continuous with continuous slope at
    ``tau``, always positive, slope never zero. The loss therefore equals ``1 - ms_ssim`` whenever
    every term is ``>= tau``, and otherwise stays finite with a non-zero gradient that pushes the
    negative scale up. ``tau=None`` gives back the exact metric (and its dead gradients).

    Examples:
        >>> loss = MSSSIMLoss()
        >>> x = torch.rand(1, 3, 161, 161, requires_grad=True)
        >>> value = loss(x, 1 - x.detach())  # every scale anti-correlated
        >>> value.backward()
        >>> bool(torch.isfinite(x.grad).all()), bool((x.grad != 0).any())
        (True, True)
    """

    @takes_options
    def __init__(
        self,
        *,
        weights=MS_SSIM_WEIGHTS,
        reduction: str = "mean",
        backend: str = "auto",
        tau: Optional[float] = DEFAULT_TAU,
        config: Optional[SSIMConfig] = None,
        **options,
    ):
        super().__init__()
        self.cfg = resolve(config, options)
        self.weights = check_weights(weights)
        self.tau = check_tau(tau)
        self.reduction = check_reduction(reduction)
        self.backend = check_backend(backend)

    def forward(self, pred: torch.Tensor, target: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``1 - MS-SSIM``; ``mask``: per-pixel weights going down the pyramid (:func:`splatloss.ms_ssim`)."""
        per_image = functional.ms_ssim(
            pred,
            target,
            weights=self.weights,
            tau=self.tau,
            reduction="none",
            backend=self.backend,
            mask=mask,
            config=self.cfg,
        )
        unbatched = per_image.dim() == 0
        return reduce(1 - per_image.reshape(-1), self.reduction, unbatched)

    def extra_repr(self) -> str:
        return (
            f"{self.cfg}, weights={self.weights}, tau={self.tau}, reduction={self.reduction!r}, "
            f"backend={self.backend!r}"
        )


# ------------------------------------------------------------------------------------------------
# PhotometricLoss
# ------------------------------------------------------------------------------------------------


class S3IMLoss(nn.Module):
    """``1 - s3im(pred, target)`` for ``(N, C)`` batches of ray colours (S3IM, Xie et al. 2023).

    The module twin of :func:`splatloss.s3im`: ``repeats`` copies of the batch (the first in order,
    the others permuted) laid out as a ``patch_height``-high virtual image, compared by SSIM with a
    ``kernel_size x kernel_size`` Gaussian window (sigma 1.5) and stride ``stride``. The defaults are
    the paper's. The options are validated when the module is built.

    Args:
        kernel_size, stride, repeats, patch_height, data_range, k1, k2: see :func:`splatloss.s3im`.
        generator: the ``torch.Generator`` the permutations are drawn from (on the rays' device);
            ``None`` uses torch's global generator.

    Examples:
        >>> loss = S3IMLoss()
        >>> pred = torch.rand(4096, 3, requires_grad=True)
        >>> value = loss(pred, torch.rand(4096, 3))
        >>> value.backward()
        >>> float(loss(pred, pred.detach()))
        0.0
    """

    def __init__(
        self,
        kernel_size: int = 4,
        stride: int = 4,
        repeats: int = 10,
        patch_height: int = 64,
        *,
        data_range: float = 1.0,
        k1: float = K1,
        k2: float = K2,
        generator: Optional[torch.Generator] = None,
    ):
        super().__init__()
        self.cfg = S3IMConfig(kernel_size, stride, repeats, patch_height, data_range, k1, k2)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        self.generator = generator

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return s3im_loss_with_config(pred, target, self.cfg, generator=self.generator)

    def extra_repr(self) -> str:
        return str(self.cfg)


def _check_weight(name: str, value) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"weight of term {name!r} must be a real number >= 0, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"weight of term {name!r} must be a finite number >= 0, got {value!r}")
    return value


def _weighted_mean(values: torch.Tensor, mask: Optional[torch.Tensor], dims) -> torch.Tensor:
    """Mean of ``values`` over ``dims``, weighted by ``mask`` (broadcast) when given."""
    if mask is None:
        return values.mean(dim=dims)
    m = mask.expand_as(values)
    # An all-zero mask gives 0 (nothing to compare), never 0/0.
    return (values * m).sum(dim=dims) / m.sum(dim=dims).clamp_min(torch.finfo(values.dtype).tiny)


class PhotometricLoss(nn.Module):
    """Weighted sum of photometric terms, with an optional per-pixel mask and per-term logging.

    ``total = sum_t weight_t * term_t`` per image, then ``reduction`` over the batch. Terms (each
    unweighted, per image): ``l1`` = mean |pred - target|; ``l2`` = mean (pred - target)^2;
    ``dssim`` = 1 - SSIM; ``msssim`` = 1 - MS-SSIM with the smooth positive extension of
    :class:`MSSSIMLoss` (``tau``); ``l1_gaussian`` = the L1 error map filtered with the
    coarsest-scale Gaussian of Zhao et al. 2017 (``l1_sigma``, default ``0.5 * 2^(M-1)`` = 8 for 5
    scales), then averaged; ``s3im`` = 1 - S3IM (Xie et al. 2023) of each image's pixels taken as a
    batch of ``H * W`` rays (:func:`splatloss.s3im`; ``repeats * H * W`` must be a multiple of
    ``s3im_patch_height``). A term whose weight is 0 is not computed.

    Presets (classmethods, usable as Hydra ``_target_: splatloss.PhotometricLoss.dssim_l1``):

    * :meth:`dssim_l1` -- 3DGS (Kerbl et al. 2023): ``(1 - lambda_dssim) L1 + lambda_dssim D-SSIM``,
      ``lambda_dssim = 0.2``, zero ("same") padding as its reference code;
    * :meth:`zhao_mix` -- Zhao et al. 2017 "Mix": ``alpha (1 - MS-SSIM) + (1 - alpha) G_sigma_M * L1``,
      ``alpha = 0.84``; :meth:`msssim_l1` the same with a plain L1;
    * :meth:`l1`, :meth:`l2`, :meth:`ssim` (D-SSIM only), :meth:`msssim`.

    Args:
        l1, l2, dssim, msssim, l1_gaussian, s3im: term weights (>= 0, at least one > 0).
        weights: the same as a mapping ``{"l1": 0.8, "dssim": 0.2}`` (for configs); a term may be
            given one way or the other, not both.
        data_range, window_size, sigma, window, k1, k2, c1, c2, padding: the SSIM configuration
            shared by the ``dssim`` and ``msssim`` terms (see :class:`~splatloss.config.SSIMConfig`).
        ms_weights: MS-SSIM scale weights (Wang 2003 by default); tau: see :class:`MSSSIMLoss`.
        l1_sigma: sigma of the ``l1_gaussian`` weighting.
        s3im_kernel_size, s3im_stride, s3im_repeats, s3im_patch_height: the ``s3im`` term's options
            (:func:`splatloss.s3im`; ``data_range``, ``k1``, ``k2`` are shared with SSIM).
        reduction: ``"mean"`` | ``"sum"`` | ``"none"`` over the batch.
        backend: SSIM backend.

    Call ``loss(pred, target, mask=None)`` with ``(B, C, H, W)`` images; ``mask`` holds per-pixel
    weights (bool, or finite and >= 0), shaped ``(B, 1, H, W)``, ``(1, 1, H, W)``, ``(H, W)``,
    ``(B, H, W)`` or ``(B, C, H, W)``. The SSIM terms use the masked statistics of
    ``docs/conventions.md`` ("Masks"); the MS-SSIM term sends the mask down the same pyramid as the
    images; L1 / L2 are
    ``sum m |x - y| / sum m`` over channels and pixels per image (0 when the mask is empty); the
    Gaussian-weighted L1 is ``sum G(m |x - y|) / sum G(m)`` (without a mask: the all-ones value). The
    ``s3im`` term takes no mask. After each call ``loss.terms`` holds the detached, unweighted,
    batch-averaged value of every computed term and ``loss.weights`` the current weights,
    changed with ``loss.set_weight(name, value)``.

    The 3DGS pair (``l1`` and ``dssim``) runs as one L1 + D-SSIM call, the backend's fused kernel
    when it has one, masked or not.

    Examples:
        >>> loss = PhotometricLoss.dssim_l1()          # 3DGS: 0.8 L1 + 0.2 D-SSIM, "same" padding
        >>> pred = torch.rand(1, 3, 32, 32, requires_grad=True)
        >>> total = loss(pred, torch.rand(1, 3, 32, 32))
        >>> sorted(loss.terms), loss.weights["dssim"]
        (['dssim', 'l1'], 0.2)
        >>> total.backward()
        >>> loss.set_weight("dssim", 0.3)
        >>> mask = torch.ones(1, 1, 32, 32)
        >>> bool(torch.isclose(loss(pred, pred.detach(), mask=mask), torch.tensor(0.0)))
        True
    """

    @takes_options
    def __init__(
        self,
        l1: float = 0.0,
        l2: float = 0.0,
        dssim: float = 0.0,
        msssim: float = 0.0,
        l1_gaussian: float = 0.0,
        s3im: float = 0.0,
        *,
        weights: Optional[Mapping[str, float]] = None,
        ms_weights=MS_SSIM_WEIGHTS,
        tau: Optional[float] = DEFAULT_TAU,
        l1_sigma: Optional[float] = None,
        s3im_kernel_size: int = 4,
        s3im_stride: int = 4,
        s3im_repeats: int = 10,
        s3im_patch_height: int = 64,
        reduction: str = "mean",
        backend: str = "auto",
        config: Optional[SSIMConfig] = None,
        **options,
    ):
        super().__init__()
        given = {
            "l1": l1,
            "l2": l2,
            "dssim": dssim,
            "msssim": msssim,
            "l1_gaussian": l1_gaussian,
            "s3im": s3im,
        }
        w = {name: _check_weight(name, v) for name, v in given.items()}
        if weights is not None:
            if not isinstance(weights, Mapping):
                raise TypeError(f"weights must be a mapping of term name to weight, got {type(weights).__name__}")
            for name, v in weights.items():
                if name not in TERMS:
                    raise ValueError(f"unknown loss term {name!r}; terms are {TERMS}")
                if w[name] != 0.0:
                    raise ValueError(f"term {name!r} is weighted twice: {name}={w[name]} and weights[{name!r}]={v}")
                w[name] = _check_weight(name, v)
        if not any(v > 0 for v in w.values()):
            raise ValueError(f"PhotometricLoss needs at least one term with a weight > 0, got {w}")
        self.weights: Dict[str, float] = w
        self.cfg = resolve(config, options)
        self.ms_weights = check_weights(ms_weights, "ms_weights")
        self.tau = check_tau(tau)
        if l1_sigma is None:
            l1_sigma = 0.5 * 2 ** (len(self.ms_weights) - 1)
        if not isinstance(l1_sigma, numbers.Real) or isinstance(l1_sigma, bool) or not (0 < float(l1_sigma) < math.inf):
            raise ValueError(f"l1_sigma must be a finite number > 0, got {l1_sigma!r}")
        self.l1_sigma = float(l1_sigma)
        self.s3im_cfg = S3IMConfig(
            s3im_kernel_size,
            s3im_stride,
            s3im_repeats,
            s3im_patch_height,
            data_range=self.cfg.data_range,
            k1=self.cfg.k1,
            k2=self.cfg.k2,
        )
        self.reduction = check_reduction(reduction)
        self.backend = check_backend(backend)
        self.terms: Dict[str, torch.Tensor] = {}

    # -- presets ----------------------------------------------------------------------------------

    @classmethod
    def l1(cls, **kwargs) -> "PhotometricLoss":
        """Plain L1."""
        return cls(l1=1.0, **kwargs)

    @classmethod
    def l2(cls, **kwargs) -> "PhotometricLoss":
        """Plain L2 (mean squared error)."""
        return cls(l2=1.0, **kwargs)

    @classmethod
    def ssim(cls, **kwargs) -> "PhotometricLoss":
        """D-SSIM alone (``1 - SSIM``)."""
        return cls(dssim=1.0, **kwargs)

    @classmethod
    def msssim(cls, **kwargs) -> "PhotometricLoss":
        """``1 - MS-SSIM`` alone (smooth positive extension, see :class:`MSSSIMLoss`)."""
        return cls(msssim=1.0, **kwargs)

    @classmethod
    def dssim_l1(cls, lambda_dssim: float = 0.2, *, padding: str = "same", **kwargs) -> "PhotometricLoss":
        """3DGS: ``(1 - lambda_dssim) L1 + lambda_dssim (1 - SSIM)``, zero padding as 3DGS's ``ssim``
        (the ``3dgs`` convention of :mod:`splatloss.conventions`)."""
        lam = check_fraction("lambda_dssim", lambda_dssim)
        return cls(l1=1.0 - lam, dssim=lam, padding=padding, **kwargs)

    @classmethod
    def msssim_l1(cls, alpha: float = 0.84, **kwargs) -> "PhotometricLoss":
        """``alpha (1 - MS-SSIM) + (1 - alpha) L1`` with a plain (unweighted) L1."""
        a = check_fraction("alpha", alpha)
        return cls(msssim=a, l1=1.0 - a, **kwargs)

    @classmethod
    def zhao_mix(cls, alpha: float = 0.84, **kwargs) -> "PhotometricLoss":
        """Zhao et al. 2017 Mix: ``alpha (1 - MS-SSIM) + (1 - alpha) G_sigma_M * L1``, ``alpha = 0.84``."""
        a = check_fraction("alpha", alpha)
        return cls(msssim=a, l1_gaussian=1.0 - a, **kwargs)

    # -- weights ----------------------------------------------------------------------------------

    def set_weight(self, name: str, value: float) -> None:
        """Change one term's weight (>= 0); callbacks schedule weights through this."""
        if name not in TERMS:
            raise ValueError(f"unknown loss term {name!r}; terms are {TERMS}")
        self.weights[name] = _check_weight(name, value)

    def get_extra_state(self) -> torch.Tensor:
        """The term weights, in :data:`TERMS` order, as a float64 tensor: ``state_dict()`` carries
        them (``_extra_state``), so a checkpoint keeps weights a schedule or callback has set."""
        return torch.tensor([self.weights[name] for name in TERMS], dtype=torch.float64)

    def set_extra_state(self, state) -> None:
        """Take the weights :meth:`get_extra_state` saved (``load_state_dict``)."""
        if not isinstance(state, torch.Tensor) or tuple(state.shape) != (len(TERMS),):
            got = f"shape {tuple(state.shape)}" if isinstance(state, torch.Tensor) else type(state).__name__
            raise ValueError(
                f"PhotometricLoss state '_extra_state' must hold the {len(TERMS)} term weights {TERMS} as a 1-D "
                f"tensor, got {got}; load a state_dict saved from a PhotometricLoss"
            )
        self.weights = {name: _check_weight(name, v) for name, v in zip(TERMS, state.tolist())}

    def extra_repr(self) -> str:
        active = {k: v for k, v in self.weights.items() if v > 0}
        return f"weights={active}, {self.cfg}, reduction={self.reduction!r}, backend={self.backend!r}"

    # -- forward ----------------------------------------------------------------------------------

    @without_autocast
    def forward(self, pred: torch.Tensor, target: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if isinstance(mask, torch.Tensor) and mask.dim() == 3:  # (B, H, W), e.g. a batch of alphas
            mask = mask[:, None]
        w = self.weights
        if not any(v > 0 for v in w.values()):
            raise ValueError(
                f"PhotometricLoss has no term with a weight > 0 to compute, got weights {w}; give at least one term "
                "a weight > 0 with set_weight(name, value) before calling the loss"
            )
        given_mask = mask
        cfg, x, y, mask, unbatched, impl = functional.prepare(pred, target, self.cfg, None, mask, self.backend)
        acc = accumulation_dtype(x.dtype)
        per_term: Dict[str, torch.Tensor] = {}  # name -> [B]

        fused_pair = w["l1"] > 0 and w["dssim"] > 0
        pixelwise = (not fused_pair and w["l1"] > 0) or w["l2"] > 0 or w["l1_gaussian"] > 0  # share one diff
        paths = fused_pair + pixelwise + (not fused_pair and w["dssim"] > 0) + (w["msssim"] > 0) + (w["s3im"] > 0)
        if paths > 1:
            # Terms computed apart each return a gradient; cast fp16 / bf16 images to float32 once,
            # first, so those add up in float32 and the cast's backward rounds their sum once (one
            # term alone rounds once by itself, so it reads the images as given).
            x, y = to_accumulation_dtype(x), to_accumulation_dtype(y)
        if fused_pair:
            # 3DGS pair in one call (the backend's fused L1 + D-SSIM when it has one, masked too):
            # w_l1 L1 + w_d D = (w_l1 + w_d) * dssim_l1(lam = w_d / (w_l1 + w_d)).
            check_size(x, cfg)
            scale = w["l1"] + w["dssim"]
            lam = w["dssim"] / scale
            pair, l1_val, d_val = impl.dssim_l1_terms(x, y, cfg, lam, mask)  # the terms as computed, logged
            total = scale * pair
            logged = {"l1": l1_val, "dssim": d_val}
        else:
            total = None
            logged = {}

        diff = None
        if pixelwise:
            diff = x.to(acc) - y.to(acc)  # [B, C, H, W]
        if not fused_pair and w["l1"] > 0:
            per_term["l1"] = _weighted_mean(diff.abs(), mask, (1, 2, 3))
        if w["l2"] > 0:
            per_term["l2"] = _weighted_mean(diff * diff, mask, (1, 2, 3))
        if not fused_pair and w["dssim"] > 0:
            check_size(x, cfg)
            per_term["dssim"] = 1 - impl.ssim_mean(x, y, cfg, mask).mean(dim=1)
        if w["msssim"] > 0:
            check_ms_size(x, cfg, len(self.ms_weights))
            per_term["msssim"] = 1 - impl.ms_ssim(x, y, cfg, self.ms_weights, self.tau, mask)
        if w["l1_gaussian"] > 0:
            per_term["l1_gaussian"] = self._l1_gaussian(diff, mask)
        if w["s3im"] > 0:
            per_term["s3im"] = self._s3im(x, y, given_mask)  # any mask, a mask of ones too, is refused

        for name, value in per_term.items():
            term = w[name] * value
            total = term if total is None else total + term
            logged[name] = value.detach()
        self.terms = {name: v.mean() for name, v in logged.items()}
        return reduce(total, self.reduction, unbatched)

    def _s3im(self, x, y, mask) -> torch.Tensor:
        """1 - S3IM per image, its ``H * W`` pixels taken as a batch of rays ``(H * W, C)``."""
        if mask is not None:
            raise ValueError(
                "the s3im term takes no mask: it compares rays, not neighbourhoods; pass only the rays (pixels) "
                "to train on, or set the s3im weight to 0 for masked calls"
            )
        rays_x = x.flatten(2).transpose(1, 2)  # [B, H * W, C]
        rays_y = y.flatten(2).transpose(1, 2)
        return torch.stack([s3im_loss_with_config(rays_x[b], rays_y[b], self.s3im_cfg) for b in range(x.shape[0])])

    def _l1_gaussian(self, diff, mask) -> torch.Tensor:
        # Normalised Gaussian taps out to 3 sigma: 2 * ceil(3 sigma) + 1 taps.
        g = SSIMConfig(window_size=2 * math.ceil(3 * self.l1_sigma) + 1, sigma=self.l1_sigma).window_1d(
            diff.dtype, diff.device
        )
        k = g.shape[0]
        if self.cfg.padding == "valid" and min(diff.shape[-2:]) < k:
            raise ValueError(
                f"the l1_gaussian term filters with a {k}x{k} Gaussian (l1_sigma={self.l1_sigma}) and padding='valid', "
                f"so images must be at least {k}x{k}, got {diff.shape[-2]}x{diff.shape[-1]}; use padding='same' or "
                f"a smaller l1_sigma"
            )
        if self.cfg.padding == "reflect" and min(diff.shape[-2:]) <= k // 2:
            raise ValueError(
                f"the l1_gaussian term mirrors {k // 2} pixels (l1_sigma={self.l1_sigma}) with padding='reflect', "
                f"so images "
                f"must be at least {k // 2 + 1}x{k // 2 + 1}, got {diff.shape[-2]}x{diff.shape[-1]}; use padding='same'"
            )
        err = diff.abs()
        if mask is None:  # the all-ones value: the zero-padded blur is normalised at the border too
            mask = torch.ones((1, 1) + tuple(err.shape[-2:]), dtype=err.dtype, device=err.device)
        m = mask.expand_as(err)
        num = window_filter(err * m, g, self.cfg.padding).sum(dim=(1, 2, 3))
        den = window_filter(m.contiguous(), g, self.cfg.padding).sum(dim=(1, 2, 3))
        return num / den.clamp_min(torch.finfo(err.dtype).tiny)
