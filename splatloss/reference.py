"""Plain-torch SSIM and MS-SSIM through autograd: the oracle every backend is tested against.

Readable first, never optimised: one 2-D depthwise convolution per statistic, gradients by
autograd. Inputs are already validated ``(B, C, H, W)`` tensors of one float dtype on one device
(``splatloss.functional`` does the checking); the computation runs in float64 whatever the input
(the oracle must not lose flat images' small variances to float32 cancellation), values come back
in the accumulation dtype (float32 for fp16 / bf16 / fp32, float64 for fp64), and the gradients
autograd returns are in the input's dtype.

Conventions (see docs/conventions.md):

* population (co)variances: ``sigma_xy = E_w[x y] - E_w[x] E_w[y]``;
* ``SSIM = (2 mu_x mu_y + C1)(2 sigma_xy + C2) / ((mu_x^2 + mu_y^2 + C1)(sigma_x^2 + sigma_y^2 + C2))``,
  ``cs`` the second factor alone;
* padding "valid" (no padding), "same" (zeros), "reflect" (mirror without repeating the edge);
* MS-SSIM as TF's ``tf.image.ssim_multiscale``: "valid" SSIM per scale, cs at scales 1..M-1 and
  SSIM at scale M (means per image and channel), each clamped with relu, raised to its weight,
  multiplied over scales per channel, then averaged over channels. Between scales, an odd side
  is padded by repeating its last row / column (bottom / right) and 2x2 blocks are averaged.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from . import multiscale
from .config import MS_SSIM_WEIGHTS, SSIMConfig, accumulation_dtype
from .multiscale import downsample2x

__all__ = ["ssim_map", "ssim_stats", "ms_ssim", "downsample2x", "accumulation_dtype"]


def _filter(x: torch.Tensor, window_2d: torch.Tensor, padding: str) -> torch.Tensor:
    """Weighted local mean of every channel of ``x`` [B, C, H, W] under the window."""
    channels = x.shape[1]
    k = window_2d.shape[-1]
    r = k // 2
    if padding == "same":
        x = F.pad(x, (r, r, r, r))  # zeros
    elif padding == "reflect":
        x = F.pad(x, (r, r, r, r), mode="reflect")
    weight = window_2d.expand(channels, 1, k, k)  # one copy of the window per channel
    return F.conv2d(x, weight, groups=channels)


def _free_bytes(device: torch.device) -> Optional[int]:
    """Memory the device can still give (CPU: available physical memory), or None where unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu" and hasattr(os, "sysconf"):
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        except (ValueError, OSError):
            return None
    return None


def check_memory(img: torch.Tensor, cfg: SSIMConfig) -> None:
    """Refuse, before allocating, a call whose 2-D convolutions cannot fit in memory.

    Each convolution unfolds every window: about ``8 * B * window_size^2 * H' * W'`` bytes in float64
    (measured on CPU to within 8 %), which a large window makes enormous (a 2001-pixel window on a
    2K image wants tens of GB). The backends that filter separably need none of it.
    """
    b, _, h, w = img.shape
    k = cfg.window_size
    hp, wp = (h - k + 1, w - k + 1) if cfg.padding == "valid" else (h, w)
    need = 8 * b * k * k * max(hp, 0) * max(wp, 0)
    free = _free_bytes(img.device)
    if free is not None and need > free:
        raise ValueError(
            f"backend='reference' with window_size={k} on {b} image(s) of {h}x{w} needs about {need / 2**30:.1f} GiB "
            f"for its unfolded 2-D windows, more than the {free / 2**30:.1f} GiB free on {img.device}; use "
            "backend='torch' (separable filtering, the same numbers to float round-off), a smaller window_size, "
            "or a smaller batch"
        )


def ssim_map(img1: torch.Tensor, img2: torch.Tensor, cfg: SSIMConfig, return_cs: bool = False):
    """SSIM map ``[B, C, H', W']`` (and the contrast-structure map when ``return_cs``).

    ``H' = H - window_size + 1`` with "valid" padding, ``H`` otherwise.

    Examples:
        >>> x = torch.rand(1, 3, 16, 16)
        >>> m = ssim_map(x, x, SSIMConfig())
        >>> m.shape, bool(torch.allclose(m, torch.ones_like(m)))
        (torch.Size([1, 3, 6, 6]), True)
    """
    # The oracle computes in float64 whatever the input (E[x^2] - E[x]^2 cancels in float32 on flat
    # images: 6.9e-4 normwise gradient error on a flat JPEG photograph) and returns the
    # accumulation dtype; autograd brings the gradients back in the input's dtype.
    check_memory(img1, cfg)
    acc = accumulation_dtype(img1.dtype)
    x = img1.to(torch.float64)
    y = img2.to(torch.float64)
    w1 = cfg.window_1d(torch.float64, x.device)
    w2 = torch.outer(w1, w1)  # [k, k], sums to 1

    mu_x = _filter(x, w2, cfg.padding)
    mu_y = _filter(y, w2, cfg.padding)
    var_x = _filter(x * x, w2, cfg.padding) - mu_x * mu_x
    var_y = _filter(y * y, w2, cfg.padding) - mu_y * mu_y
    cov_xy = _filter(x * y, w2, cfg.padding) - mu_x * mu_y

    c1, c2 = cfg.C1, cfg.C2
    luminance = (2 * mu_x * mu_y + c1) / (mu_x * mu_x + mu_y * mu_y + c1)
    cs = (2 * cov_xy + c2) / (var_x + var_y + c2)
    ssim = luminance * cs
    if return_cs:
        return ssim.to(acc), cs.to(acc)
    return ssim.to(acc)


def ssim_stats(img1: torch.Tensor, img2: torch.Tensor, cfg: SSIMConfig) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-image, per-channel means of the SSIM map and of the cs map: ``([B, C], [B, C])``."""
    ssim, cs = ssim_map(img1, img2, cfg, return_cs=True)
    return ssim.mean(dim=(-2, -1)), cs.mean(dim=(-2, -1))


def ms_ssim(
    img1: torch.Tensor,
    img2: torch.Tensor,
    cfg: SSIMConfig,
    weights: Sequence[float] = MS_SSIM_WEIGHTS,
    tau: Optional[float] = None,
) -> torch.Tensor:
    """MS-SSIM per image, shape ``[B]``, exactly as TF's ``ssim_multiscale`` (relu-clamped terms).

    ``prod_{j<M} relu(cs_j)^{w_j} * relu(ssim_M)^{w_M}`` per channel, then the mean over channels;
    ``cs_j`` / ``ssim_M`` are the means of the maps at scale ``j`` (with ``cfg.padding``).
    With ``tau`` (the training loss), relu is replaced by the smooth positive extension
    ``x if x >= tau else tau^2 / (2 tau - x)``. The composition (pyramid, terms, product) is
    :mod:`splatloss.multiscale`'s, with this module's :func:`ssim_stats` per scale.

    Examples:
        >>> x = torch.rand(2, 3, 161, 161)
        >>> ms_ssim(x, x, SSIMConfig())
        tensor([1., 1.])
    """
    acc = accumulation_dtype(img1.dtype)
    x, y = img1.to(torch.float64), img2.to(torch.float64)  # the pyramid and the product in float64 too
    return multiscale.ms_ssim(lambda a, b: ssim_stats(a, b, cfg), x, y, weights, tau).to(acc)
