"""Padding and separable window filtering in torch ops: the one implementation the torch-ops paths
share (the torch backend, the masked statistics, the Gaussian-weighted L1).

The window is :meth:`splatloss.config.SSIMConfig.window_1d`; the 2-D window is its outer product, so
filtering is a correlation along W, then along H. The reference backend filters with the 2-D window
in one convolution instead, so that the oracle does not share this code.

Examples:
    >>> import torch
    >>> x = torch.rand(1, 2, 9, 9)
    >>> w = torch.full((3,), 1 / 3)
    >>> separable_valid(x, w).shape, window_filter(x, w, "same").shape
    (torch.Size([1, 2, 7, 7]), torch.Size([1, 2, 9, 9]))
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

__all__ = ["pad", "separable_valid", "window_filter"]


def pad(x: torch.Tensor, padding: str, lo: int, hi: Optional[int] = None, value: float = 0.0) -> torch.Tensor:
    """Pad the last two dims by ``lo`` before and ``hi`` (default ``lo``) after, as ``padding`` says:
    "valid" nothing, "same" the constant ``value`` (zeros for images), "reflect" a mirror that does not
    repeat the edge sample."""
    hi = lo if hi is None else hi
    if padding == "same":
        return F.pad(x, (lo, hi, lo, hi), value=value)
    if padding == "reflect":
        return F.pad(x, (lo, hi, lo, hi), mode="reflect")
    return x


def separable_valid(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Valid separable correlation of every channel of ``x`` ``[B, N, H, W]`` with the taps ``w`` ``[k]``:
    ``[B, N, H - k + 1, W - k + 1]``."""
    n, k = x.shape[1], w.shape[0]
    x = F.conv2d(x, w.view(1, 1, 1, k).expand(n, 1, 1, k), groups=n)  # along W
    return F.conv2d(x, w.view(1, 1, k, 1).expand(n, 1, k, 1), groups=n)  # along H


def window_filter(x: torch.Tensor, w: torch.Tensor, padding: str) -> torch.Tensor:
    """Pad by half the window as ``padding`` says, then :func:`separable_valid`."""
    return separable_valid(pad(x, padding, w.shape[0] // 2), w)
