"""The backend contract: what every SSIM backend implements, and the compositions they may share.

Inputs to a backend are already validated ``(B, C, H, W)`` tensors of one float dtype on one
device (``splatloss.functional`` checks them) and a validated :class:`~splatloss.config.SSIMConfig`.
Values come back in the accumulation dtype (float32 for fp16 / bf16 / fp32, float64 for fp64),
gradients in the input dtype.

A new backend subclasses :class:`Backend`, implements :meth:`~Backend.ssim_map` and
:meth:`~Backend.ssim_stats`, and overrides a shared composition only where it has something
faster that computes the same numbers (a fused L1 + D-SSIM kernel, a fused pyramid step).
"""

from __future__ import annotations

import abc
import functools
from typing import Callable, Optional, Sequence, Tuple

import torch

from .. import multiscale
from ..config import SSIMConfig, accumulation_dtype
from . import masked

__all__ = ["Backend"]

Tensor = torch.Tensor


def _compile_time_constant(fn: Callable) -> Callable:
    """A copy of ``fn`` that ``torch.compile`` runs once at trace time and treats as a constant
    (what ``torch.compiler.assume_constant_result`` marks), for the environment checks behind the
    backend choice: building the C kernel or importing Triton cannot be traced.

    The mark is set directly because the public decorator imports ``torch._dynamo``, which imports
    Triton, and ``import splatloss`` must not.
    """

    @functools.wraps(fn)
    def constant():
        return fn()

    constant._dynamo_marked_constant = True
    return constant


class Backend(abc.ABC):
    """One SSIM implementation; every entry point below works on every backend.

    ``ssim_map`` and ``ssim_stats`` are the backend's own; ``ssim_mean``, ``ms_ssim``, ``dssim_l1``
    and ``ssim_mean_and_grad`` have shared default compositions built from ``ssim_stats``.
    """

    #: The name ``splatloss.backends.get`` knows this backend by.
    name: str = ""

    def __repr__(self) -> str:
        return f"<splatloss backend {self.name!r}>"

    @abc.abstractmethod
    def ssim_map(self, img1: Tensor, img2: Tensor, cfg: SSIMConfig, return_cs: bool = False):
        """SSIM map ``[B, C, H', W']`` (``H' = H - window_size + 1`` for "valid", else ``H``), and
        the contrast-structure map too when ``return_cs``."""

    @abc.abstractmethod
    def ssim_stats(self, img1: Tensor, img2: Tensor, cfg: SSIMConfig) -> Tuple[Tensor, Tensor]:
        """``(ssim_mean, cs_mean)``, each ``[B, C]``: the maps' means per image and channel."""

    def ssim_mean(self, img1: Tensor, img2: Tensor, cfg: SSIMConfig) -> Tensor:
        """``ssim_mean`` ``[B, C]`` alone (what :func:`splatloss.ssim` reduces): a backend whose
        cost depends on which mean gets a gradient overrides it."""
        return self.ssim_stats(img1, img2, cfg)[0]

    def ms_ssim(
        self, img1: Tensor, img2: Tensor, cfg: SSIMConfig, weights: Sequence[float], tau: Optional[float] = None
    ) -> Tensor:
        """MS-SSIM per image ``[B]``: :func:`splatloss.multiscale.ms_ssim` over this backend's
        :meth:`ssim_stats` (``tau=None``: relu, the metric; a float: the loss's smooth extension)."""
        return multiscale.ms_ssim(lambda x, y: self.ssim_stats(x, y, cfg), img1, img2, weights, tau)

    def dssim_l1(self, img1: Tensor, img2: Tensor, cfg: SSIMConfig, lam: float) -> Tensor:
        """``(1 - lam) * mean|x - y| + lam * (1 - mean SSIM)`` per image ``[B]``."""
        acc = accumulation_dtype(img1.dtype)
        l1 = (img1.to(acc) - img2.to(acc)).abs().mean(dim=(1, 2, 3))  # [B]
        s, _ = self.ssim_stats(img1, img2, cfg)
        return (1 - lam) * l1 + lam * (1 - s.mean(dim=1))

    def masked_ssim_map(self, img1: Tensor, img2: Tensor, mask: Tensor, cfg: SSIMConfig):
        """Masked ``(ssim_map, cs_map, centre_weights)`` ``[B, C, H', W']`` (semantics in
        :mod:`splatloss.backends.masked`; ``mask`` a float tensor broadcasting as ``(B|1, 1|C, H, W)``).
        Every backend runs the shared torch-ops composition of that module, gradients by autograd."""
        return masked.masked_ssim_map(img1, img2, mask, cfg)

    def masked_ssim_stats(self, img1: Tensor, img2: Tensor, mask: Tensor, cfg: SSIMConfig) -> Tuple[Tensor, Tensor]:
        """Masked ``(ssim_mean, cs_mean)``, each ``[B, C]`` (an empty channel counts as 1)."""
        return masked.masked_ssim_stats(img1, img2, mask, cfg)

    def masked_dssim_l1(self, img1: Tensor, img2: Tensor, mask: Tensor, cfg: SSIMConfig, lam: float) -> Tensor:
        """Masked ``(1 - lam) * L1 + lam * (1 - SSIM)`` per image ``[B]``: ``L1 = sum m |x - y| / sum m``
        over channels and pixels (0 when the mask is empty) and the masked SSIM of :meth:`masked_ssim_stats`."""
        acc = accumulation_dtype(img1.dtype)
        mf = mask.to(acc).expand(img1.shape)
        den = mf.sum(dim=(1, 2, 3))
        num = (mf * (img1.to(acc) - img2.to(acc)).abs()).sum(dim=(1, 2, 3))
        l1 = torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(num))
        s, _ = self.masked_ssim_stats(img1, img2, mask, cfg)
        return (1 - lam) * l1 + lam * (1 - s.mean(dim=1))

    def ssim_mean_and_grad(
        self, img1: Tensor, img2: Tensor, cfg: SSIMConfig, upstream: Tensor
    ) -> Tuple[Tensor, Tensor]:
        """``(ssim_mean [B, C], d sum(upstream * ssim_mean) / d img1)``, returning no graph.

        ``upstream`` is ``[B, C]`` in the accumulation dtype; the gradient comes back in ``img1``'s
        dtype. This default runs one local autograd pass on detached copies.
        """
        with torch.enable_grad():
            x = img1.detach().requires_grad_(True)
            s, _ = self.ssim_stats(x, img2.detach(), cfg)
            (g,) = torch.autograd.grad((s * upstream.to(s.dtype)).sum(), x)
        return s.detach(), g.to(img1.dtype)
