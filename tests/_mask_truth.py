"""Float64 oracle of masked SSIM / MS-SSIM / L1 / L2 / Gaussian-weighted L1, in plain torch ops.

Nothing here imports splatloss: these are the masked values (and, through autograd, the gradients
to both images) every backend must reproduce.

Semantics. A mask ``m`` holds weights in [0, 1] per pixel, broadcast to ``(B, C, H, W)``. Let
``X, Y`` be the padded images and ``M`` the padded mask: ``"same"`` pads the images with zeros and
the mask with ONES (the zero border counts as present black pixels), ``"reflect"`` mirrors images
and mask, ``"valid"`` pads nothing. With ``F`` the window filter over the padded arrays (a full 2-D
correlation with the outer product of the 1-D window, not the separable form the library uses) and
``W = F(M)``::

    mu_x = F(M X) / W,  E[x^2] = F(M X^2) / W,  E[xy] = F(M X Y) / W   (likewise for y)

and the SSIM and cs maps follow as usual. The value of an image is, per channel, the mean of the
map weighted by the mask at each map position's centre pixel (``m`` itself for "same"/"reflect",
``m`` cropped by ``window_size // 2`` for "valid"), then the plain mean over channels; a channel
whose weights sum to 0 counts as SSIM 1 with zero gradient. A map position with ``W = 0`` has a
zero centre weight (the window's taps are positive), so its statistics never reach the value; they
are computed with ``W`` replaced by 1 so that no NaN reaches the gradient.

MS-SSIM: the mask goes down the same pyramid as the images (replicate-pad an odd side at the
bottom / right, 2x2 mean) and each scale uses its own mask as above; the terms are the masked cs
means at scales 1..M-1 and the masked SSIM mean at the coarsest scale, combined per channel as
``prod relu(term_j) ** w_j`` and averaged over channels.

L1 / L2: ``sum m |x - y| / sum m`` (``(x - y)^2`` for L2) over channels and pixels per image, 0
when the mask is empty. Gaussian-weighted L1 (Zhao et al.): ``sum G(m |x - y|) / sum G(m)`` with
``G`` the normalised Gaussian blur (taps out to ``ceil(3 sigma)``) over arrays padded as the SSIM
padding pads images ("same": zeros for both, so the blur is normalised at the border); without a
mask the value is the all-ones-mask value.

Design of the library's analytic backward (the adjoint of the normalised statistics). Per channel,
with ``S`` the SSIM (or cs) map, ``c`` the centre weights and ``Z = sum c``, the value is
``v = sum c S / Z``; its upstream gives ``g = dv/dS = c / Z`` per map position (0 for an empty
channel). Through the usual SSIM partials ``S`` depends on ``mu_x, mu_y, E[x^2], E[y^2], E[xy]``;
call their partials ``a_x = g dS/dmu_x``, ``b_x = g dS/dE[x^2]``, ``d = g dS/dE[xy]``. Each
statistic is ``N / W`` with ``N = F(M P)`` for a pixel product ``P`` (``X``, ``X^2``, ``XY``), so
the adjoint of the filter ``F^T`` (a correlation with the flipped window, i.e. the same symmetric
window, then the adjoint of the padding: "same" crops, "reflect" folds the mirrored border back,
"valid" nothing) applied to ``h / W`` gives the pixel-space weight of ``P``. Hence::

    dv/dX = M * ( F^T(a_x / W) + 2 X F^T(b_x / W) + Y F^T(d / W) )      (cropped / folded by the padding adjoint)
    dv/dY = M * ( F^T(a_y / W) + 2 Y F^T(b_y / W) + X F^T(d / W) )

The three filtered maps ``A = F^T(a / W), B = F^T(b / W), D = F^T(d / W)`` per image are exactly the
unmasked backward's three filtered maps with the upstream pre-divided by ``W`` and the result
multiplied by ``M``: the backward costs the unmasked one plus one division and one product per
pixel. The forward adds one filtered channel ``W = F(M)`` to the five (``F(MX), F(MY), F(MX^2),
F(MY^2), F(MXY)``: the products are formed with ``M`` before filtering) -- six filtered channels
instead of five in the same streaming pass of the C kernel; a mask shared by all channels
(``(B, 1, H, W)``) filters ``W`` once per image, not per channel. With ``M = 1`` every extra term
is an exact multiply by 1 (and ``W = 1`` away from a "same" border), which is why an all-ones mask
equals the unmasked result to round-off. The centre weights ``c`` enter only through ``g``; the
mask itself gets no gradient.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

TF_WEIGHTS = (0.0448, 0.2856, 0.3001, 0.2363, 0.1333)


def window_1d(window_size: int = 11, sigma: float = 1.5, window: str = "gaussian") -> torch.Tensor:
    """Taps at offsets ``i - window_size // 2``, normalised, float64."""
    if window == "uniform":
        return torch.full((window_size,), 1.0 / window_size, dtype=torch.float64)
    x = torch.arange(window_size, dtype=torch.float64) - window_size // 2
    g = torch.exp(-(x * x) / (2.0 * sigma * sigma))
    return g / g.sum()


def _filter2d(t: torch.Tensor, w1: torch.Tensor) -> torch.Tensor:
    """Full 2-D 'valid' correlation of each plane of ``t`` [B, C, H, W] with ``outer(w1, w1)``."""
    k = w1.shape[0]
    w2 = torch.outer(w1, w1).to(t)
    b, c, h, w = t.shape
    return F.conv2d(t.reshape(b * c, 1, h, w), w2.view(1, 1, k, k)).reshape(b, c, h - k + 1, w - k + 1)


def _pad(t: torch.Tensor, padding: str, r_lo: int, r_hi: int, value: float) -> torch.Tensor:
    if padding == "valid" or (r_lo == 0 and r_hi == 0):
        return t
    if padding == "same":
        return F.pad(t, (r_lo, r_hi, r_lo, r_hi), value=value)
    if padding == "reflect":
        return F.pad(t, (r_lo, r_hi, r_lo, r_hi), mode="reflect")
    raise ValueError(padding)


def full_mask(mask: Optional[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The mask as float64 ``(B, C, H, W)`` like ``x`` (ones when ``mask`` is None)."""
    if mask is None:
        return torch.ones_like(x, dtype=torch.float64)
    m = mask.to(torch.float64)
    if m.dim() == 2:
        m = m[None, None]
    return m.expand(x.shape).contiguous()


def masked_maps(
    x, y, mask=None, *, window_size=11, sigma=1.5, window="gaussian", k1=0.01, k2=0.03, data_range=1.0, padding="valid"
):
    """The masked SSIM and cs maps ``[B, C, H', W']`` and the centre weights of each map position."""
    x, y = x.to(torch.float64), y.to(torch.float64)
    m = full_mask(mask, x)
    w1 = window_1d(window_size, sigma, window)
    k = window_size
    lo, hi = (k // 2, k - 1 - k // 2) if padding != "valid" else (0, 0)
    X, Y = _pad(x, padding, lo, hi, 0.0), _pad(y, padding, lo, hi, 0.0)
    M = _pad(m, padding, lo, hi, 1.0)
    W = _filter2d(M, w1)
    Wsafe = torch.where(W > 0, W, torch.ones_like(W))
    mu_x = _filter2d(M * X, w1) / Wsafe
    mu_y = _filter2d(M * Y, w1) / Wsafe
    exx = _filter2d(M * X * X, w1) / Wsafe
    eyy = _filter2d(M * Y * Y, w1) / Wsafe
    exy = _filter2d(M * X * Y, w1) / Wsafe
    vx, vy, cov = exx - mu_x * mu_x, eyy - mu_y * mu_y, exy - mu_x * mu_y
    c1, c2 = (k1 * data_range) ** 2, (k2 * data_range) ** 2
    lum = (2 * mu_x * mu_y + c1) / (mu_x * mu_x + mu_y * mu_y + c1)
    cs = (2 * cov + c2) / (vx + vy + c2)
    if padding == "valid":
        centre = m[..., k // 2 : k // 2 + cs.shape[-2], k // 2 : k // 2 + cs.shape[-1]]
    else:
        centre = m
    return lum * cs, cs, centre


def _channel_mean(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per channel ``sum w v / sum w`` [B, C]; 1 (no gradient) where the weights sum to 0."""
    den = weights.sum(dim=(-2, -1))
    num = (weights * values).sum(dim=(-2, -1))
    safe = torch.where(den > 0, den, torch.ones_like(den))
    return torch.where(den > 0, num / safe, torch.ones_like(num))


def masked_ssim_stats(x, y, mask=None, **cfg):
    """``(ssim_mean, cs_mean)`` per channel ``[B, C]`` under the masked semantics."""
    s, c, centre = masked_maps(x, y, mask, **cfg)
    return _channel_mean(s, centre), _channel_mean(c, centre)


def masked_ssim(x, y, mask=None, **cfg) -> torch.Tensor:
    """Masked SSIM per image ``[B]``."""
    return masked_ssim_stats(x, y, mask, **cfg)[0].mean(dim=1)


def downsample(t: torch.Tensor) -> torch.Tensor:
    h, w = t.shape[-2:]
    if h % 2 or w % 2:
        t = F.pad(t, (0, w % 2, 0, h % 2), mode="replicate")
    b, c, h, w = t.shape
    return t.reshape(b, c, h // 2, 2, w // 2, 2).mean(dim=(3, 5))


def masked_ms_ssim(x, y, mask=None, weights: Sequence[float] = TF_WEIGHTS, **cfg) -> torch.Tensor:
    """Masked MS-SSIM per image ``[B]`` (relu of the terms, as TF's metric)."""
    x, y = x.to(torch.float64), y.to(torch.float64)
    m = full_mask(mask, x)
    terms = []
    for j in range(len(weights)):
        if j > 0:
            x, y, m = downsample(x), downsample(y), downsample(m)
        s, c = masked_ssim_stats(x, y, m, **cfg)
        terms.append(c if j < len(weights) - 1 else s)
    t = torch.relu(torch.stack(terms, dim=-1))
    w = torch.tensor(list(weights), dtype=torch.float64)
    return torch.prod(t**w, dim=-1).mean(dim=-1)


def masked_lp(x, y, mask=None, p: int = 1) -> torch.Tensor:
    """``sum m |x - y|^p / sum m`` over channels and pixels per image ``[B]`` (0 when empty)."""
    x, y = x.to(torch.float64), y.to(torch.float64)
    m = full_mask(mask, x)
    e = (x - y).abs() if p == 1 else (x - y) ** 2
    den = m.sum(dim=(1, 2, 3))
    num = (m * e).sum(dim=(1, 2, 3))
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(num))


def masked_l1_gaussian(x, y, mask=None, l1_sigma: float = 1.5, padding: str = "same") -> torch.Tensor:
    """Zhao et al.'s Gaussian-weighted L1 with a mask: ``sum G(m |x - y|) / sum G(m)`` per image."""
    x, y = x.to(torch.float64), y.to(torch.float64)
    m = full_mask(mask, x)
    r = int(math.ceil(3 * l1_sigma))
    t = torch.arange(-r, r + 1, dtype=torch.float64)
    g = torch.exp(-(t * t) / (2 * l1_sigma * l1_sigma))
    g = g / g.sum()
    e = (x - y).abs()
    num = _filter2d(_pad(m * e, padding, r, r, 0.0), g).sum(dim=(1, 2, 3))
    den = _filter2d(_pad(m, padding, r, r, 0.0), g).sum(dim=(1, 2, 3))
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(num))


def soft_mask(h: int, w: int, seed: int = 0) -> torch.Tensor:
    """An irregular soft mask ``(H, W)`` in [0, 1]: a blob of ones, a zero hole, a smooth ramp between."""
    gen = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(
        torch.linspace(-1, 1, h, dtype=torch.float64), torch.linspace(-1, 1, w, dtype=torch.float64), indexing="ij"
    )
    cx, cy = (torch.rand(2, generator=gen, dtype=torch.float64) - 0.5) * 0.6
    blob = torch.sigmoid(8 * (0.55 - ((xx - cx) ** 2 + 1.6 * (yy - cy) ** 2).sqrt() - 0.1 * torch.sin(7 * xx)))
    hole = ((xx + 0.5) ** 2 + (yy - 0.4) ** 2) < 0.05
    noise = torch.rand(h, w, generator=gen, dtype=torch.float64) * 0.2
    return torch.where(hole, torch.zeros_like(blob), (blob + noise).clamp(0, 1))
