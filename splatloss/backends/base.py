"""The backend contract: what every SSIM backend implements, and the compositions they may share.

Inputs to a backend are already validated ``(B, C, H, W)`` tensors of one float dtype on one
device (``splatloss.functional`` checks them) and a validated :class:`~splatloss.config.SSIMConfig`.
Values come back in the accumulation dtype (float32 for fp16 / bf16 / fp32, float64 for fp64),
gradients in the input dtype: the float64 gradient rounded once (a composition of several pieces
casts fp16 / bf16 images to float32 once, first, and adds the pieces' gradients in float32).

A new backend subclasses :class:`Backend`, implements :meth:`~Backend.ssim_map` and
:meth:`~Backend.ssim_stats`, and overrides a shared composition only where it has something
faster that computes the same numbers (a fused L1 + D-SSIM kernel, a fused pyramid step).

Masks are part of the contract: every composition takes ``mask=None`` (validated, a float tensor
broadcasting as ``(B|1, 1|C, H, W)``; semantics in ``docs/conventions.md``). The masked statistics
come from :meth:`~Backend.masked_ssim_stats` and :meth:`~Backend.masked_ssim_map`: a backend that
computes them itself overrides both and sets :attr:`~Backend.fused_masks`; one that cannot keeps the
shared fallback, the torch-ops composition of :mod:`splatloss.backends.masked`.
"""

from __future__ import annotations

import abc
import functools
from typing import Callable, Optional, Sequence, Tuple

import torch

from .. import multiscale
from ..config import SSIMConfig, accumulation_dtype, to_accumulation_dtype
from . import masked

__all__ = ["Backend", "compile_time_constant", "masked_l1", "reduce_batch", "stepwise_quotient"]

Tensor = torch.Tensor


@functools.lru_cache(maxsize=256)
def stepwise_quotient(dtype: torch.dtype, numerator: float, *divisors: float) -> float:
    """``numerator / divisors[0] / divisors[1] ...`` in ``dtype``, each step rounded to it: the
    upstreams autograd's mean backwards hand a loss's per-image or per-plane terms (``1 / B``;
    ``-1 / B`` then ``/ C`` for ``1 - ssim``), which the backends' fused passes compute their
    gradients for."""
    q = torch.full((), numerator, dtype=dtype)
    for d in divisors:
        q = q / d
    return float(q.item())


def compile_time_constant(fn: Callable) -> Callable:
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


def reduce_batch(per_image: Tensor, reduction: str) -> Tensor:
    """Per-image values ``[B]`` reduced over the batch: "mean", "sum", or "none" (as they are)."""
    if reduction == "mean":
        return per_image.mean()
    if reduction == "sum":
        return per_image.sum()
    return per_image


def masked_l1(img1: Tensor, img2: Tensor, mask: Optional[Tensor]) -> Tensor:
    """Mean absolute difference per image ``[B]`` in the accumulation dtype; with ``mask``,
    ``sum m |x - y| / sum m`` over channels and pixels (0 when the mask is empty)."""
    acc = accumulation_dtype(img1.dtype)
    diff = (img1.to(acc) - img2.to(acc)).abs()
    if mask is None:
        return diff.mean(dim=(1, 2, 3))
    mf = mask.to(acc).expand(img1.shape)
    den = mf.sum(dim=(1, 2, 3))
    num = (mf * diff).sum(dim=(1, 2, 3))
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(num))


class Backend(abc.ABC):
    """One SSIM implementation; every entry point below works on every backend, masked or not.

    ``ssim_map`` and ``ssim_stats`` are the backend's own; ``masked_ssim_map`` and
    ``masked_ssim_stats`` are its own when :attr:`fused_masks`, else the shared fallback; ``ssim_mean``,
    ``ms_ssim``, ``dssim_l1`` and ``ssim_mean_and_grad`` are shared compositions of those.
    """

    #: The name ``splatloss.backends.get`` knows this backend by.
    name: str = ""
    #: Whether the backend computes masked statistics itself (``False``: the torch-ops fallback of
    #: :mod:`splatloss.backends.masked` computes them, gradients by its analytic backward).
    fused_masks: bool = False

    def __repr__(self) -> str:
        return f"<splatloss backend {self.name!r}>"

    @abc.abstractmethod
    def ssim_map(self, img1: Tensor, img2: Tensor, cfg: SSIMConfig, return_cs: bool = False):
        """SSIM map ``[B, C, H', W']`` (``H' = H - window_size + 1`` for "valid", else ``H``), and
        the contrast-structure map too when ``return_cs``."""

    @abc.abstractmethod
    def ssim_stats(self, img1: Tensor, img2: Tensor, cfg: SSIMConfig) -> Tuple[Tensor, Tensor]:
        """``(ssim_mean, cs_mean)``, each ``[B, C]``: the maps' means per image and channel."""

    def masked_ssim_map(self, img1: Tensor, img2: Tensor, mask: Tensor, cfg: SSIMConfig):
        """Masked ``(ssim_map, cs_map, centre_weights)``, each ``[B, C, H', W']``."""
        return masked.masked_ssim_map(img1, img2, mask, cfg)

    def masked_ssim_stats(self, img1: Tensor, img2: Tensor, mask: Tensor, cfg: SSIMConfig) -> Tuple[Tensor, Tensor]:
        """Masked ``(ssim_mean, cs_mean)``, each ``[B, C]`` (an empty channel counts as 1)."""
        return masked.masked_ssim_stats(img1, img2, mask, cfg)

    def stats(self, img1: Tensor, img2: Tensor, cfg: SSIMConfig, mask: Optional[Tensor] = None):
        """:meth:`ssim_stats`, or :meth:`masked_ssim_stats` when a mask is given."""
        if mask is None:
            return self.ssim_stats(img1, img2, cfg)
        return self.masked_ssim_stats(img1, img2, mask, cfg)

    def ssim_mean(self, img1: Tensor, img2: Tensor, cfg: SSIMConfig, mask: Optional[Tensor] = None) -> Tensor:
        """``ssim_mean`` ``[B, C]`` alone (what :func:`splatloss.ssim` reduces): a backend whose
        cost depends on which mean gets a gradient overrides it."""
        return self.stats(img1, img2, cfg, mask)[0]

    def ms_ssim(
        self,
        img1: Tensor,
        img2: Tensor,
        cfg: SSIMConfig,
        weights: Sequence[float],
        tau: Optional[float] = None,
        mask: Optional[Tensor] = None,
    ) -> Tensor:
        """MS-SSIM per image ``[B]`` over this backend's statistics at each scale (``tau=None``: relu,
        the metric; a float: the loss's smooth extension). A mask goes down the same pyramid as the
        images (repeat-pad an odd side, 2x2 mean) and each scale uses its own. The images are cast
        to the accumulation dtype once, before scale 0 (:func:`splatloss.multiscale.levels`)."""
        if mask is None:
            terms = multiscale.ms_terms(lambda x, y: self.ssim_stats(x, y, cfg), (img1, img2), len(weights))
        else:
            stats = lambda x, y, m: self.masked_ssim_stats(x, y, m, cfg)  # noqa: E731
            terms = multiscale.ms_terms(stats, (img1, img2, mask), len(weights))
        return self.combine_terms(terms, weights, tau)

    def combine_terms(self, terms: Tensor, weights: Sequence[float], tau: Optional[float] = None) -> Tensor:
        """MS-SSIM's ``[B, C, M]`` terms -> ``[B]``: :func:`splatloss.multiscale.combine`'s function
        (a backend may compute it in its own kernels)."""
        return multiscale.combine(terms, weights, tau)

    def dssim_l1(
        self, img1: Tensor, img2: Tensor, cfg: SSIMConfig, lam: float, mask: Optional[Tensor] = None
    ) -> Tensor:
        """``(1 - lam) * L1 + lam * (1 - SSIM)`` per image ``[B]`` (:func:`masked_l1` and the
        (masked) SSIM of :meth:`ssim_mean`). The images are cast to the accumulation dtype once,
        first, so the two terms' gradients add up in float32 and reach fp16 / bf16 inputs rounded once."""
        return self.dssim_l1_terms(img1, img2, cfg, lam, mask)[0]

    def ssim_reduced(
        self,
        img1: Tensor,
        img2: Tensor,
        cfg: SSIMConfig,
        reduction: str,
        mask: Optional[Tensor] = None,
        dssim: bool = False,
    ) -> Tensor:
        """SSIM (``dssim``: ``1 - SSIM``) per image, reduced over the batch by ``reduction`` ("mean",
        "sum", "none": ``[B]``): what :func:`splatloss.ssim` / :func:`splatloss.dssim` return. A
        backend that forms the reduction in its own kernels (one op, one autograd node) overrides it."""
        s = self.ssim_mean(img1, img2, cfg, mask).mean(dim=1)
        return reduce_batch(1 - s if dssim else s, reduction)

    def dssim_l1_reduced(
        self,
        img1: Tensor,
        img2: Tensor,
        cfg: SSIMConfig,
        lam: float,
        reduction: str,
        mask: Optional[Tensor] = None,
    ) -> Tensor:
        """:meth:`dssim_l1` reduced over the batch by ``reduction`` (as :meth:`ssim_reduced`)."""
        return reduce_batch(self.dssim_l1(img1, img2, cfg, lam, mask), reduction)

    def dssim_l1_terms(
        self, img1: Tensor, img2: Tensor, cfg: SSIMConfig, lam: float, mask: Optional[Tensor] = None
    ) -> Tuple[Tensor, Tensor, Tensor]:
        """``(loss, l1, dssim)``, each ``[B]``: :meth:`dssim_l1` and its two terms as computed, without
        a graph (what a loss logs; a term recovered from the total loses the digits a small weight
        scaled away). A backend whose fused :meth:`dssim_l1` does not return its terms gets them from
        one more pass without a graph: its SSIM mean and :func:`masked_l1`."""
        if type(self).dssim_l1 is not Backend.dssim_l1:
            loss = self.dssim_l1(img1, img2, cfg, lam, mask)
            with torch.no_grad():
                x, y = to_accumulation_dtype(img1.detach()), to_accumulation_dtype(img2.detach())
                m = None if mask is None else mask.detach()
                return loss, masked_l1(x, y, m), 1 - self.ssim_mean(x, y, cfg, m).mean(dim=1)
        return self.composed_dssim_l1_terms(img1, img2, cfg, lam, mask)

    def composed_dssim_l1_terms(
        self, img1: Tensor, img2: Tensor, cfg: SSIMConfig, lam: float, mask: Optional[Tensor] = None
    ) -> Tuple[Tensor, Tensor, Tensor]:
        """:meth:`dssim_l1_terms` as the shared composition: :func:`masked_l1` and the (masked) SSIM of
        :meth:`ssim_mean`, the images cast to the accumulation dtype once, first."""
        x, y = to_accumulation_dtype(img1), to_accumulation_dtype(img2)
        l1, d = masked_l1(x, y, mask), 1 - self.ssim_mean(x, y, cfg, mask).mean(dim=1)
        return (1 - lam) * l1 + lam * d, l1.detach(), d.detach()

    def ssim_mean_and_grad(
        self, img1: Tensor, img2: Tensor, cfg: SSIMConfig, upstream: Tensor, mask: Optional[Tensor] = None
    ) -> Tuple[Tensor, Tensor]:
        """``(ssim_mean [B, C], d sum(upstream * ssim_mean) / d img1)``, returning no graph.

        ``upstream`` is ``[B, C]`` in the accumulation dtype; the gradient comes back in ``img1``'s
        dtype. This default runs one local autograd pass on detached copies.
        """
        with torch.enable_grad():
            x = img1.detach().requires_grad_(True)
            m = None if mask is None else mask.detach()
            s = self.ssim_mean(x, img2.detach(), cfg, m)
            (g,) = torch.autograd.grad((s * upstream.to(s.dtype)).sum(), x)
        return s.detach(), g.to(img1.dtype)
