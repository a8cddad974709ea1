"""Masked SSIM statistics as one composition of torch ops, shared by every backend.

Semantics. A mask ``m`` holds weights in [0, 1] per pixel (bool or float), shaped ``(B, 1, H, W)``,
``(1, 1, H, W)``, ``(H, W)`` or ``(B, C, H, W)``. Let ``X, Y`` be the padded images and ``M`` the
padded mask: ``"same"`` pads the images with zeros and the mask with **ones** (the zero border counts
as present black pixels, as 3DGS treats it), ``"reflect"`` mirrors images and mask, ``"valid"`` pads
nothing. With ``F`` the window filter over the padded arrays and ``W = F(M)``::

    mu_x = F(M X) / W,  E[x^2] = F(M X^2) / W,  E[xy] = F(M X Y) / W   (likewise for y)

and the SSIM and cs maps follow as usual. The value of an image is, per channel, the mean of the map
weighted by the mask at each map position's centre pixel (``m`` itself for "same"/"reflect", ``m``
cropped by ``window_size // 2`` for "valid"), then the plain mean over channels; a channel whose
weights sum to 0 counts as SSIM 1 with zero gradient (nothing to compare). With a mask of ones this
is exactly the unmasked SSIM for every padding.

What runs: the six filtered channels ``F(M), F(MX), F(MY), F(MX^2), F(MY^2), F(MXY)`` in one
separable depthwise convolution (the moments of ``x - s``, ``s`` a per-plane constant, as the torch
backend does against float32 cancellation), in the accumulation dtype; gradients to both images
by autograd through these ops. A map position with ``W = 0`` has a zero centre weight, so its
statistics are computed with ``W`` replaced by 1 and never reach the value or the gradient.
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F

from ..config import SSIMConfig, accumulation_dtype

__all__ = ["masked_ssim_map", "masked_ssim_stats", "weighted_channel_mean"]

Tensor = torch.Tensor


def _pad(t: Tensor, padding: str, lo: int, hi: int, value: float) -> Tensor:
    if padding == "valid":
        return t
    if padding == "same":
        return F.pad(t, (lo, hi, lo, hi), value=value)
    return F.pad(t, (lo, hi, lo, hi), mode="reflect")


def _sep_filter_valid(x: Tensor, w: Tensor) -> Tensor:
    n, k = x.shape[1], w.shape[0]
    x = F.conv2d(x, w.view(1, 1, 1, k).expand(n, 1, 1, k), groups=n)
    return F.conv2d(x, w.view(1, 1, k, 1).expand(n, 1, k, 1), groups=n)


def masked_ssim_map(img1: Tensor, img2: Tensor, mask: Tensor, cfg: SSIMConfig) -> Tuple[Tensor, Tensor, Tensor]:
    """``(ssim_map, cs_map, centre_weights)``, each ``[B, C, H', W']`` in the accumulation dtype.

    ``mask`` is a float tensor that broadcasts to the images as ``(B or 1, 1 or C, H, W)``.
    """
    acc = accumulation_dtype(img1.dtype)
    x, y = img1.to(acc), img2.to(acc)
    b, c, h, wd = x.shape
    m = mask.to(acc).expand(b, c, h, wd)
    k = cfg.window_size
    lo, hi = k // 2, k - 1 - k // 2
    # per-plane shift against float32 cancellation; constant of the computation (no gradient)
    s = (0.5 * (x.mean(dim=(-2, -1), keepdim=True) + y.mean(dim=(-2, -1), keepdim=True))).detach()
    X, Y = _pad(x, cfg.padding, lo, hi, 0.0) - s, _pad(y, cfg.padding, lo, hi, 0.0) - s
    M = _pad(m, cfg.padding, lo, hi, 1.0)
    w = cfg.window_1d(acc, x.device)
    stacked = torch.cat([M, M * X, M * Y, M * X * X, M * Y * Y, M * X * Y], dim=1)
    W, fx, fy, fxx, fyy, fxy = _sep_filter_valid(stacked, w).chunk(6, dim=1)
    Wsafe = torch.where(W > 0, W, torch.ones_like(W))
    mu_x, mu_y = fx / Wsafe, fy / Wsafe
    vx = fxx / Wsafe - mu_x * mu_x
    vy = fyy / Wsafe - mu_y * mu_y
    cov = fxy / Wsafe - mu_x * mu_y
    mx, my = mu_x + s, mu_y + s  # the unshifted means for the luminance term
    c1, c2 = cfg.C1, cfg.C2
    cs = (2 * cov + c2) / (vx + vy + c2)
    lum = (2 * mx * my + c1) / (mx * mx + my * my + c1)
    r = k // 2
    centre = m[..., r : r + cs.shape[-2], r : r + cs.shape[-1]] if cfg.padding == "valid" else m
    return lum * cs, cs, centre


def weighted_channel_mean(values: Tensor, weights: Tensor) -> Tensor:
    """Per channel ``sum w v / sum w`` ``[B, C]``; 1 with zero gradient where the weights sum to 0."""
    den = weights.sum(dim=(-2, -1))
    num = (weights * values).sum(dim=(-2, -1))
    nonempty = den > 0
    return torch.where(nonempty, num / torch.where(nonempty, den, torch.ones_like(den)), torch.ones_like(num))


def masked_ssim_stats(img1: Tensor, img2: Tensor, mask: Tensor, cfg: SSIMConfig) -> Tuple[Tensor, Tensor]:
    """``(ssim_mean, cs_mean)``, each ``[B, C]``, under the masked semantics."""
    smap, cmap, centre = masked_ssim_map(img1, img2, mask, cfg)
    return weighted_channel_mean(smap, centre), weighted_channel_mean(cmap, centre)
