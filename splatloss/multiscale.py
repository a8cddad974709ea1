"""The MS-SSIM composition, written once: pyramid step, loop over scales, clamping, weighted product.

Every backend and the reference build MS-SSIM from these pieces, so a convention changes here and
nowhere else:

* :func:`downsample2x`, TF ``ssim_multiscale``'s pyramid step: an odd side is padded by repeating its
  last row / column (bottom / right), then 2x2 blocks are averaged. A backend may fuse this step
  into its own kernel (it must compute the same thing) and pass it as ``down``.
* :func:`levels` / :func:`ms_terms`, the loop over scales: scale 0 is the input cast once to the
  accumulation dtype, every further scale is the previous one halved (fp16 2x2 means would round).
  The one cast comes first so that the scales' gradients add up in float32 and reach an fp16 /
  bf16 input rounded once. The terms are the mean cs at scales ``1..M-1`` and the mean SSIM at scale ``M``, each
  ``[B, C]``, given a backend's per-scale statistics ``stats(x, y) -> (ssim_mean, cs_mean)``.
* :func:`combine`, the product: per channel ``prod_j f(term_j) ** w_j``, then the mean over channels;
  ``f`` is relu (the metric, TF's convention) or :func:`smooth_positive` (the training loss, with
  its threshold ``tau``).
"""

from __future__ import annotations

import functools
from typing import Callable, Iterator, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from .config import to_accumulation_dtype

__all__ = [
    "downsample2x",
    "smooth_positive",
    "levels",
    "ms_terms",
    "scale_terms",
    "combine",
    "weights_tensor",
    "ms_ssim",
]

Tensor = torch.Tensor
Stats = Callable[..., Tuple[Tensor, Tensor]]


def downsample2x(x: Tensor) -> Tensor:
    """Halve each side: repeat the last row / column of an odd side, then average 2x2 blocks.

    This is TF ``ssim_multiscale``'s pyramid step (SYMMETRIC pad of the remainder at the
    bottom / right, then 2x2 VALID average pooling), so every input pixel feeds the next scale
    and keeps a gradient. ``(H, W) -> (ceil(H / 2), ceil(W / 2))``.

    Examples:
        >>> x = torch.arange(9.0).view(1, 1, 3, 3)
        >>> downsample2x(x)
        tensor([[[[2.0000, 3.5000],
                  [6.5000, 8.0000]]]])
    """
    h, w = x.shape[-2:]
    if h % 2 or w % 2:
        x = F.pad(x, (0, w % 2, 0, h % 2), mode="replicate")
    return F.avg_pool2d(x, kernel_size=2, stride=2)


def smooth_positive(x: Tensor, tau: float) -> Tensor:
    """``x`` for ``x >= tau``, ``tau^2 / (2 tau - x)`` below: positive, C1, slope never zero.

    Value and slope match at ``tau`` (both ``tau`` and 1); as ``x -> -inf`` it decays like
    ``tau^2 / |x|``, so ``f(x)^w`` has a finite, non-zero derivative everywhere.

    Examples:
        >>> smooth_positive(torch.tensor([-1.0, 0.0, 0.01, 0.5]), 0.01)
        tensor([9.8039e-05, 5.0000e-03, 1.0000e-02, 5.0000e-01])
    """
    # The denominator uses min(x, tau) so the unused branch never divides by zero (a NaN there
    # would leak into the gradient through torch.where's backward).
    below = (tau * tau) / (2 * tau - torch.clamp(x, max=tau))
    return torch.where(x >= tau, x, below)


def levels(
    images: Sequence[Tensor], scales: int, down: Callable[[Tensor], Tensor] = downsample2x, cast: bool = True
) -> Iterator[Tuple[Tensor, ...]]:
    """The pyramid: ``images`` at scale 0, then each halved by ``down``, ``scales`` levels.

    The tensors (the two images, and e.g. a weight mask that follows them) are cast to their
    accumulation dtype once, before scale 0: the gradients of every scale then add up in float32
    and the cast's backward rounds the sum to an fp16 / bf16 input's dtype once. ``cast=False``
    passes them as given (a caller that casts itself, or whose ``stats`` and ``down`` return
    gradients summed in float32 already).
    """
    level = tuple(to_accumulation_dtype(t) for t in images) if cast else tuple(images)
    for j in range(scales):
        if j > 0:
            level = tuple(down(t) for t in level)
        yield level


def ms_terms(
    stats: Stats,
    images: Sequence[Tensor],
    scales: int,
    down: Callable[[Tensor], Tensor] = downsample2x,
    cast: bool = True,
) -> Tensor:
    """The MS-SSIM terms ``[B, C, M]``: ``stats(*level)`` gives ``(ssim_mean, cs_mean)`` per scale;
    the term is the cs mean at scales ``1..M-1`` and the SSIM mean at the coarsest scale ``M``."""
    return scale_terms(lambda last, *level: stats(*level)[0 if last else 1], images, scales, down, cast)


def scale_terms(
    term: Callable[..., Tensor],
    images: Sequence[Tensor],
    scales: int,
    down: Callable[[Tensor], Tensor] = downsample2x,
    cast: bool = True,
) -> Tensor:
    """:func:`ms_terms` for a backend that computes one term at a time: ``term(last, *level)`` is
    the ``[B, C]`` SSIM mean of the level when ``last`` (the coarsest scale), its cs mean otherwise."""
    pyramid = enumerate(levels(images, scales, down, cast))
    return torch.stack([term(j == scales - 1, *level) for j, level in pyramid], dim=-1)


def combine(terms: Tensor, weights: Sequence[float], tau: Optional[float] = None) -> Tensor:
    """``[B, C, M]`` terms -> ``[B]``: per channel ``prod_j f(term_j) ** w_j``, then the channel mean.

    ``f`` is relu for ``tau=None`` (TF's metric: a term ``<= 0`` scores 0) and
    :func:`smooth_positive` with threshold ``tau`` otherwise (the loss: never a dead gradient).

    Examples:
        >>> t = torch.tensor([[[0.9, 0.8], [-0.1, 0.5]]])  # B=1, C=2, M=2
        >>> combine(t, (0.5, 0.5))
        tensor([0.4243])
    """
    t = torch.relu(terms) if tau is None else smooth_positive(terms, tau)
    f = t ** weights_tensor(weights, terms)
    # the product as M - 1 multiplies, not torch.prod: prod's backward counts the zero factors on
    # the host (a synchronisation per call, which also stops a CUDA graph capture)
    return functools.reduce(torch.mul, f.unbind(-1)).mean(dim=-1)


#: The scale weights as tensors, one per (weights, dtype, device): made once, so that a call copies
#: nothing from the host (a copy from pageable host memory cannot be captured in a CUDA graph).
_WEIGHTS_CACHE: dict = {}


def weights_tensor(weights: Sequence[float], like: Tensor) -> Tensor:
    """The scale weights as a tensor of ``like``'s dtype and device, built once per (weights, dtype,
    device) (:func:`combine`'s exponents; a backend computing the product in its own kernel reads
    the same tensor)."""
    if torch.compiler.is_compiling():  # a constant of the traced graph
        return torch.tensor(list(weights), dtype=like.dtype, device=like.device)
    key = (tuple(float(v) for v in weights), like.dtype, like.device)
    w = _WEIGHTS_CACHE.get(key)
    if w is None:
        # a normal tensor even when the first call runs under torch.inference_mode(): autograd
        # saves the exponent for the backward of every later call
        with torch.inference_mode(False):
            w = _WEIGHTS_CACHE[key] = torch.tensor(key[0], dtype=like.dtype, device=like.device)
    return w


def ms_ssim(
    stats: Stats,
    img1: Tensor,
    img2: Tensor,
    weights: Sequence[float],
    tau: Optional[float] = None,
    down: Callable[[Tensor], Tensor] = downsample2x,
    cast: bool = True,
) -> Tensor:
    """MS-SSIM per image ``[B]`` from a backend's per-scale ``stats(x, y) -> (ssim_mean, cs_mean)``:
    :func:`combine` of :func:`ms_terms` with ``len(weights)`` scales."""
    return combine(ms_terms(stats, (img1, img2), len(weights), down, cast), weights, tau)
