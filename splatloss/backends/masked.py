"""Masked SSIM statistics as one composition of torch ops: the shared fallback of every backend
that does not compute them itself (:attr:`splatloss.backends.base.Backend.fused_masks`).

What is computed is the masked semantics of ``docs/conventions.md`` ("Masks"): the window statistics
normalised by the filtered mask, ``mu_x = F(M X) / F(M)`` and likewise for the second moments, the mask
padded with ones for "same" and mirrored for "reflect", the maps averaged with the mask at each map
position's centre, an empty channel counting as SSIM 1.

What runs: the six filtered channels ``F(M), F(MX), F(MY), F(MX^2), F(MY^2), F(MXY)`` in one
separable depthwise convolution (the moments of ``x - s``, ``s`` a per-plane constant, as the torch
backend does against float32 cancellation), in the accumulation dtype; gradients to both images
by autograd through these ops for the maps, and for the per-channel means (what ssim, ms_ssim and the
losses use) by the analytic backward of :class:`_MaskedStats`, which keeps only the inputs for backward and
recomputes the forward there. A map position with ``F(M) = 0`` has a zero centre weight, so its
statistics are computed with ``F(M)`` replaced by 1 and never reach the value or the gradient.
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F

from ..config import SSIMConfig, accumulation_dtype
from ..filtering import pad, separable_valid

__all__ = ["masked_ssim_map", "masked_ssim_stats", "masked_stats_backward", "weighted_channel_mean"]

Tensor = torch.Tensor


def plane_shift(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The mean of ``(x + y) / 2`` over the finite pixels of each plane, ``[B, C, 1, 1]``, detached."""
    with torch.no_grad():
        z = 0.5 * (x + y)
        finite = torch.isfinite(z)
        total = torch.where(finite, z, torch.zeros_like(z)).sum(dim=(-2, -1), keepdim=True)
        return total / finite.sum(dim=(-2, -1), keepdim=True).clamp_min(1).to(z.dtype)


def masked_ssim_map(img1: Tensor, img2: Tensor, mask: Tensor, cfg: SSIMConfig) -> Tuple[Tensor, Tensor, Tensor]:
    """``(ssim_map, cs_map, centre_weights)``, each ``[B, C, H', W']`` in the accumulation dtype,
    gradients to both images by autograd through the torch ops.

    ``mask`` is a float tensor that broadcasts to the images as ``(B or 1, 1 or C, H, W)``.
    """
    acc = accumulation_dtype(img1.dtype)
    x, y = img1.to(acc), img2.to(acc)
    m = mask.to(acc).expand(x.shape)
    w = cfg.window_1d(acc, x.device)
    *_, lum, cs, centre, _ = _stats(x, y, m, w, cfg.padding, cfg.C1, cfg.C2)
    return lum * cs, cs, centre


def weighted_channel_mean(values: Tensor, weights: Tensor) -> Tensor:
    """Per channel ``sum w v / sum w`` ``[B, C]``; 1 with zero gradient where the weights sum to 0."""
    den = weights.sum(dim=(-2, -1))
    num = (weights * values).sum(dim=(-2, -1))
    nonempty = den > 0
    return torch.where(nonempty, num / torch.where(nonempty, den, torch.ones_like(den)), torch.ones_like(num))


def _stats(x: Tensor, y: Tensor, m: Tensor, w: Tensor, padding: str, c1: float, c2: float):
    """Forward quantities in the accumulation dtype (no graph): the padded shifted images and mask,
    ``W``, the shifted means, the SSIM algebra's parts, the centre weights and their sums."""
    k = w.shape[0]
    lo, hi = k // 2, k - 1 - k // 2
    s = plane_shift(x, y)  # over the finite pixels: a NaN pixel reaches only its footprint
    X, Y = pad(x, padding, lo, hi, 0.0) - s, pad(y, padding, lo, hi, 0.0) - s
    M = pad(m, padding, lo, hi, 1.0)
    stacked = torch.cat([M, M * X, M * Y, M * X * X, M * Y * Y, M * X * Y], dim=1)
    W, fx, fy, fxx, fyy, fxy = separable_valid(stacked, w).chunk(6, dim=1)
    W = torch.where(W > 0, W, torch.ones_like(W))
    mu_x, mu_y = fx / W, fy / W
    dmu = mu_x - mu_y
    mx, my = mu_x + s, mu_y + s
    # each denominator is its numerator plus a non-negative difference (the variance of x - y, and
    # the means' squared difference): round-off cannot put a ratio above 1, identical windows give
    # exactly 1
    a1 = 2 * mx * my + c1
    a2 = 2 * (fxy / W - mu_x * mu_y) + c2
    b1 = a1 + dmu * dmu
    b2 = a2 + ((fxx + fyy - 2 * fxy) / W - dmu * dmu).clamp(min=0)
    lum = a1 / b1
    cs = a2 / b2
    r = k // 2
    centre = m[..., r : r + cs.shape[-2], r : r + cs.shape[-1]] if padding == "valid" else m
    return X, Y, M, W, mu_x, mu_y, mx, my, b1, b2, lum, cs, centre, (lo, hi)


def masked_stats_backward(
    x: Tensor,
    y: Tensor,
    m: Tensor,
    w: Tensor,
    padding: str,
    c1: float,
    c2: float,
    g_s,
    g_c,
    need_x: bool = True,
    need_y: bool = True,
):
    """Gradients ``(d v / d x, d v / d y)`` (None where not needed) of ``v = sum(g_s * ssim_mean +
    g_c * cs_mean)`` under the masked semantics, in torch ops (differentiable in the upstreams and
    inputs, so it also serves a backward that must itself be differentiable).

    ``x``, ``y`` are ``[B, C, H, W]`` and ``m`` the mask expanded to them, all in the accumulation
    dtype; ``w`` the 1-D window in that dtype; ``g_s`` / ``g_c`` ``[B, C]`` upstreams or None. The
    adjoint of the normalised statistics (each ``N / W`` with ``N = F(M P)``), recomputing the
    forward from ``x, y, m``."""
    X, Y, M, W, mu_x, mu_y, mx, my, b1, b2, lum, cs, centre, (lo, hi) = _stats(x, y, m, w, padding, c1, c2)
    z = centre.sum(dim=(-2, -1), keepdim=True)
    scale = torch.where(z > 0, 1 / torch.where(z > 0, z, torch.ones_like(z)), torch.zeros_like(z)) * centre
    g_s = torch.zeros_like(z[..., 0, 0]) if g_s is None else g_s
    g_c = torch.zeros_like(z[..., 0, 0]) if g_c is None else g_c
    h_s = g_s.to(x.dtype)[..., None, None] * scale  # dv / d ssim_map
    h_c = g_c.to(x.dtype)[..., None, None] * scale  # dv / d cs_map
    # partials of the maps' value w.r.t. the shifted mean, the variances and the covariance
    d_lum = h_s * cs  # dv / d lum
    d_mx = d_lum * 2 * (my - lum * mx) / b1
    d_my = d_lum * 2 * (mx - lum * my) / b1
    d_cs = h_s * lum + h_c
    d_cov = d_cs * 2 / b2
    d_var = -d_cs * cs / b2
    # to the normalised moments mu, E[x^2], E[xy], then to N = F(M P) through 1 / W
    a_x = (d_mx - 2 * d_var * mu_x - d_cov * mu_y) / W
    a_y = (d_my - 2 * d_var * mu_y - d_cov * mu_x) / W
    b = d_var / W
    d = d_cov / W
    k = w.shape[0]
    full = separable_valid(F.pad(torch.cat([a_x, a_y, b, d], dim=1), (k - 1, k - 1, k - 1, k - 1)), w.flip(0))
    A_x, A_y, B, D = full.chunk(4, dim=1)  # on the padded grid
    gX = M * (A_x + 2 * X * B + Y * D)
    gY = M * (A_y + 2 * Y * B + X * D)
    if padding == "same":
        H, Wd = x.shape[-2:]
        gX, gY = gX[..., lo : lo + H, lo : lo + Wd], gY[..., lo : lo + H, lo : lo + Wd]
    elif padding == "reflect":
        gX = torch.ops.aten.reflection_pad2d_backward(gX, x, [lo, hi, lo, hi])
        gY = torch.ops.aten.reflection_pad2d_backward(gY, y, [lo, hi, lo, hi])
    return (gX if need_x else None), (gY if need_y else None)


class _MaskedStats(torch.autograd.Function):
    """Masked ``(ssim_mean, cs_mean)`` with the analytic backward: the adjoint of the normalised
    statistics (each ``N / W`` with ``N = F(M P)``), recomputing the forward from ``x, y, m``."""

    @staticmethod
    def forward(ctx, img1, img2, mask, cfg):
        acc = accumulation_dtype(img1.dtype)
        x, y = img1.to(acc), img2.to(acc)
        m = mask.to(acc).expand(x.shape)
        w = cfg.window_1d(acc, x.device)
        *_, lum, cs, centre, _ = _stats(x, y, m, w, cfg.padding, cfg.C1, cfg.C2)
        out_s, out_c = weighted_channel_mean(lum * cs, centre), weighted_channel_mean(cs, centre)
        ctx.save_for_backward(x, y, m)
        ctx.cfg, ctx.dtypes = cfg, (img1.dtype, img2.dtype)
        return out_s, out_c

    @staticmethod
    def backward(ctx, g_s, g_c):
        x, y, m = ctx.saved_tensors
        cfg = ctx.cfg
        w = cfg.window_1d(x.dtype, x.device)
        need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        gX, gY = masked_stats_backward(x, y, m, w, cfg.padding, cfg.C1, cfg.C2, g_s, g_c, need_x, need_y)
        gx = gX.to(ctx.dtypes[0]) if need_x else None
        gy = gY.to(ctx.dtypes[1]) if need_y else None
        return gx, gy, None, None


def masked_ssim_stats(img1: Tensor, img2: Tensor, mask: Tensor, cfg: SSIMConfig) -> Tuple[Tensor, Tensor]:
    """``(ssim_mean, cs_mean)``, each ``[B, C]``, under the masked semantics, with the analytic backward
    (the adjoint of the normalised statistics; the mask gets no gradient)."""
    return _MaskedStats.apply(img1, img2, mask.detach(), cfg)
