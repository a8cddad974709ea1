"""Drop-in entry points: the calls fused-ssim and pytorch_msssim users already write.

Switching is a one-line import change, and the numbers stay the same:

* ``fused_ssim(img1, img2, padding="same", train=True)`` as the fused-ssim package (Taming 3DGS):
  11x11 Gaussian window, sigma 1.5, ``C1 = 0.01^2``, ``C2 = 0.03^2`` (data range 1), "same" (zero)
  or "valid" padding, the mean of the SSIM map over everything.
* ``ssim``, ``ms_ssim``, ``SSIM``, ``MS_SSIM`` with pytorch_msssim 1.0's signature and defaults
  (``data_range=255``, ``size_average``, ``win_size``, ``win_sigma``, ``K``, ``channel``,
  ``weights``, ``nonnegative_ssim``), returning what pytorch_msssim returns for the same call --
  including its MS-SSIM pyramid, which averages 2x2 blocks with *zero* padding on both sides of an
  odd side (``avg_pool2d(padding=side % 2)``). That differs from TF / Wang's MS-SSIM by up to ~1e-2
  on odd sizes; :func:`splatloss.ms_ssim` is the TF-exact one.

All of them run on the splatloss backends (``backend="auto"`` by default), so they get the analytic
backward, fp32 accumulation for fp16/bf16 and gradients for both images.
"""

from __future__ import annotations

import numbers
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from . import conventions, functional, multiscale
from .checks import check_size, check_weights
from .config import K1, K2, SSIMConfig, without_autocast

__all__ = ["fused_ssim", "ssim", "ms_ssim", "SSIM", "MS_SSIM"]


@without_autocast
def fused_ssim(
    img1: torch.Tensor,
    img2: torch.Tensor,
    padding: str = "same",
    train: bool = True,
    mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """SSIM as the fused-ssim package computes it: the mean of the 11x11 (sigma 1.5) SSIM map.

    Args:
        img1, img2: ``(B, C, H, W)`` images in [0, 1] (``C1 = 0.01^2``, ``C2 = 0.03^2``).
        padding: ``"same"`` (zero padding, fused-ssim's default and 3DGS's) or ``"valid"``.
        train: ``False`` computes without recording anything for backward (fused-ssim's
            inference mode); ``True`` gives gradients (to both images here; fused-ssim only
            differentiates ``img1``).
        mask: optional per-pixel weights in [0, 1] (bool or float, ``(B, 1, H, W)``, ``(1, 1, H, W)``,
            ``(H, W)`` or ``(B, C, H, W)``), with the masked statistics of :func:`splatloss.ssim`
            (an extension: fused-ssim has no mask).

    Examples:
        >>> x = torch.rand(1, 3, 32, 32, requires_grad=True)
        >>> loss = 1 - fused_ssim(x, torch.rand(1, 3, 32, 32))
        >>> loss.backward()
        >>> round(float(fused_ssim(x, x, train=False)), 4)
        1.0
    """
    if padding not in ("same", "valid"):
        raise ValueError(f"padding must be 'same' or 'valid' (as fused-ssim), got {padding!r}")
    if not isinstance(train, bool):
        raise TypeError(f"train must be a bool, got {type(train).__name__}")
    cfg = conventions.get("fused_ssim").config(padding=padding)
    if train:
        return functional.ssim(img1, img2, mask=mask, config=cfg)
    with torch.no_grad():
        return functional.ssim(img1, img2, mask=mask, config=cfg)


# ------------------------------------------------------------------------------------------------
# pytorch_msssim 1.0
# ------------------------------------------------------------------------------------------------


def _number(name: str, value):
    """A number as pytorch_msssim takes it: Python / numpy scalars, or one-element numpy arrays and
    tensors (0-d included), as a Python number; anything else is returned for SSIMConfig to judge."""
    if isinstance(value, (np.ndarray, torch.Tensor)):
        n = value.size if isinstance(value, np.ndarray) else value.numel()
        if n != 1:
            raise ValueError(
                f"{name} must be a number or a one-element array / tensor, got an array of shape {tuple(value.shape)}"
            )
        return value.item()
    return value


def _pair(K):
    """``K`` as pytorch_msssim unpacks it (``K1, K2 = K``): a sequence, numpy array or tensor of two."""
    if isinstance(K, (np.ndarray, torch.Tensor)):
        if tuple(K.shape) != (2,):
            raise ValueError(f"K must be a pair (K1, K2), got an array of shape {tuple(K.shape)}")
        K = K.tolist()
    if isinstance(K, (str, bytes)) or not isinstance(K, Sequence) or len(K) != 2:
        raise ValueError(f"K must be a pair (K1, K2), got {K!r}")
    return (_number("K[0]", K[0]), _number("K[1]", K[1]))


def _weights(weights):
    """Scale weights as pytorch_msssim takes them (a sequence, numpy array or tensor), checked."""
    if isinstance(weights, np.ndarray):
        weights = weights.tolist()
    return check_weights(weights)


def _config(data_range, win_size, win_sigma, win, K) -> SSIMConfig:
    if win is not None:
        raise ValueError(
            "win (a custom window tensor) is not supported by splatloss.compat; pass win_size and win_sigma "
            "for a Gaussian window, or use splatloss.ssim(window='uniform', ...)"
        )
    K = _pair(K)
    data_range = _number("data_range", data_range)
    try:
        return conventions.get("pytorch_msssim").config(
            data_range, window_size=win_size, sigma=win_sigma, k1=K[0], k2=K[1]
        )
    except (TypeError, ValueError) as e:  # named as the caller named them (pytorch_msssim's arguments)
        message = str(e)
        for ours, theirs in _ARGUMENT_NAMES.items():
            if message.startswith(ours + " "):
                message = theirs + message[len(ours) :]
                break
        raise type(e)(message) from None


#: SSIMConfig's fields by the names pytorch_msssim's functions give them.
_ARGUMENT_NAMES = {"window_size": "win_size", "sigma": "win_sigma", "k1": "K[0]", "k2": "K[1]"}


def _check_4d(X, Y):
    for name, t in (("X", X), ("Y", Y)):
        if isinstance(t, torch.Tensor) and t.dim() == 5:
            raise ValueError(
                f"{name} is 5-D {tuple(t.shape)}: 3-D (volumetric) SSIM is not supported by splatloss.compat; "
                f"expected (N, C, H, W)"
            )
        if isinstance(t, torch.Tensor) and t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D (N, C, H, W) tensor, got shape {tuple(t.shape)}")


def _per_channel_ssim(X, Y, cfg, backend):
    cfg, x, y, _, _, impl = functional.prepare(X, Y, cfg, None, None, backend)
    check_size(x, cfg)
    return impl.ssim_stats(x, y, cfg)  # ([B, C], [B, C])


@without_autocast
def ssim(
    X: torch.Tensor,
    Y: torch.Tensor,
    data_range: float = 255,
    size_average: bool = True,
    win_size: int = 11,
    win_sigma: float = 1.5,
    win: Optional[torch.Tensor] = None,
    K=(K1, K2),
    nonnegative_ssim: bool = False,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """``pytorch_msssim.ssim``: "valid" Gaussian SSIM, a scalar (``size_average``) or ``(N,)``.

    Note pytorch_msssim's ``data_range=255`` default, kept here so the same call gives the same
    number; pass ``data_range=1.0`` for images in [0, 1].

    Examples:
        >>> x = torch.rand(2, 3, 32, 32)
        >>> round(float(ssim(x, x, data_range=1.0)), 4)
        1.0
        >>> ssim(x, x, data_range=1.0, size_average=False).shape
        torch.Size([2])
    """
    _check_4d(X, Y)
    cfg = _config(data_range, win_size, win_sigma, win, K)
    s, _ = _per_channel_ssim(X, Y, cfg, backend)
    if nonnegative_ssim:
        s = torch.relu(s)
    return s.mean() if size_average else s.mean(dim=1)


@without_autocast
def ms_ssim(
    X: torch.Tensor,
    Y: torch.Tensor,
    data_range: float = 255,
    size_average: bool = True,
    win_size: int = 11,
    win_sigma: float = 1.5,
    win: Optional[torch.Tensor] = None,
    weights: Optional[Sequence[float]] = None,
    K=(K1, K2),
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """``pytorch_msssim.ms_ssim``, including its pyramid (zero-padded 2x2 means on odd sides).

    Like pytorch_msssim it needs the smaller side to exceed ``(win_size - 1) * 2^4`` whatever the
    number of weights, and clamps each term with relu (so it has dead gradients where a term is
    negative; :class:`splatloss.MSSSIMLoss` does not).

    Examples:
        >>> x = torch.rand(1, 3, 161, 161)
        >>> round(float(ms_ssim(x, x, data_range=1.0)), 4)
        1.0
    """
    _check_4d(X, Y)
    cfg = _config(data_range, win_size, win_sigma, win, K)
    w = _weights(conventions.get("pytorch_msssim").ms_weights if weights is None else weights)
    cfg, x, y, _, _, impl = functional.prepare(X, Y, cfg, None, None, backend)
    smaller = min(x.shape[-2:])
    need = (win_size - 1) * 2**4
    if smaller <= need:
        raise ValueError(
            f"Image size should be larger than {need} due to the 4 downsamplings in ms-ssim (as pytorch_msssim), "
            f"got {tuple(x.shape[-2:])}; use splatloss.ms_ssim with fewer scales or padding='same' for small images"
        )
    # pytorch_msssim's size check counts 4 halvings whatever the number of weights; with more weights
    # its coarsest scales are smaller than the window, where it skips the filter (another SSIM there)
    coarsest = (win_size - 1) * 2 ** (len(w) - 1) + 1  # smallest side whose last scale holds the window
    if smaller < coarsest:
        fits = max(n for n in range(1, len(w) + 1) if (win_size - 1) * 2 ** (n - 1) + 1 <= smaller)
        raise ValueError(
            f"weights: {len(w)} scales halve the images {len(w) - 1} times, so their smaller side must be at least "
            f"{coarsest} for the coarsest scale to hold the {win_size}x{win_size} window, got {tuple(x.shape[-2:])}; "
            f"pass at most {fits} weights for this size (pytorch_msssim skips the window at the scales it does not "
            "fit, which this drop-in does not copy), or use splatloss.ms_ssim(..., padding='same')"
        )
    # pytorch_msssim's own pyramid step (zeros on both sides of an odd side, counted in the mean);
    # the loop over scales, the relu clamp and the product are splatloss.multiscale's.
    terms = multiscale.ms_terms(lambda a, b: impl.ssim_stats(a, b, cfg), (x, y), len(w), down=_pytorch_msssim_down)
    val = multiscale.combine(terms, w)  # [B]
    return val.mean() if size_average else val


def _pytorch_msssim_down(x: torch.Tensor) -> torch.Tensor:
    """pytorch_msssim's pyramid step: 2x2 means, an odd side zero-padded by one on both sides."""
    return F.avg_pool2d(x, kernel_size=2, padding=(x.shape[-2] % 2, x.shape[-1] % 2))


def _check_channel(channel, spatial_dims):
    if not isinstance(channel, numbers.Integral) or isinstance(channel, bool) or channel < 1:
        raise ValueError(f"channel must be an integer >= 1, got {channel!r}")
    if spatial_dims != 2:
        raise ValueError(
            f"spatial_dims must be 2 (3-D SSIM is not supported by splatloss.compat), got {spatial_dims!r}"
        )


def _check_input_channels(X, channel):
    if isinstance(X, torch.Tensor) and X.dim() == 4 and X.shape[1] != channel:
        raise ValueError(
            f"this module was built for channel={channel}, got an input with {X.shape[1]} channels {tuple(X.shape)}"
        )


class SSIM(nn.Module):
    """``pytorch_msssim.SSIM`` module (same arguments and defaults, ``data_range=255``).

    Examples:
        >>> m = SSIM(data_range=1.0, channel=1)
        >>> x = torch.rand(1, 1, 24, 24)
        >>> round(float(m(x, x)), 4)
        1.0
    """

    def __init__(
        self,
        data_range: float = 255,
        size_average: bool = True,
        win_size: int = 11,
        win_sigma: float = 1.5,
        channel: int = 3,
        spatial_dims: int = 2,
        K=(K1, K2),
        nonnegative_ssim: bool = False,
        *,
        backend: str = "auto",
    ):
        super().__init__()
        _check_channel(channel, spatial_dims)
        _config(data_range, win_size, win_sigma, None, K)  # validate now
        data_range = _number("data_range", data_range)
        self.data_range, self.size_average, self.win_size, self.win_sigma = (
            data_range,
            size_average,
            win_size,
            win_sigma,
        )
        self.channel, self.K, self.nonnegative_ssim, self.backend = channel, _pair(K), nonnegative_ssim, backend

    def forward(self, X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        _check_input_channels(X, self.channel)
        return ssim(
            X,
            Y,
            data_range=self.data_range,
            size_average=self.size_average,
            win_size=self.win_size,
            win_sigma=self.win_sigma,
            K=self.K,
            nonnegative_ssim=self.nonnegative_ssim,
            backend=self.backend,
        )


class MS_SSIM(nn.Module):
    """``pytorch_msssim.MS_SSIM`` module (same arguments and defaults, ``data_range=255``).

    Examples:
        >>> m = MS_SSIM(data_range=1.0, channel=3)
        >>> x = torch.rand(1, 3, 161, 161)
        >>> round(float(m(x, x)), 4)
        1.0
    """

    def __init__(
        self,
        data_range: float = 255,
        size_average: bool = True,
        win_size: int = 11,
        win_sigma: float = 1.5,
        channel: int = 3,
        spatial_dims: int = 2,
        weights: Optional[Sequence[float]] = None,
        K=(K1, K2),
        *,
        backend: str = "auto",
    ):
        super().__init__()
        _check_channel(channel, spatial_dims)
        _config(data_range, win_size, win_sigma, None, K)
        data_range = _number("data_range", data_range)
        self.weights = None if weights is None else _weights(weights)
        self.data_range, self.size_average, self.win_size, self.win_sigma = (
            data_range,
            size_average,
            win_size,
            win_sigma,
        )
        self.channel, self.K, self.backend = channel, _pair(K), backend

    def forward(self, X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        _check_input_channels(X, self.channel)
        return ms_ssim(
            X,
            Y,
            data_range=self.data_range,
            size_average=self.size_average,
            win_size=self.win_size,
            win_sigma=self.win_sigma,
            weights=self.weights,
            K=self.K,
            backend=self.backend,
        )
