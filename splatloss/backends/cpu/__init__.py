"""The "cpu" backend: a small C kernel compiled with the system compiler at first use.

One streaming pass over ring buffers a few rows high computes the SSIM statistics, and one more
writes the gradient; nothing map-sized exists in between (see :mod:`.library`). The package splits
along its seams: :mod:`.build` (compiler discovery and the on-disk cache), :mod:`.library` (the
ctypes interface and the thread pool), :mod:`.functions` (the kernel as differentiable custom
ops). This module holds the backend object.

What the kernel does not do itself runs in the torch ops of :mod:`splatloss.backends.torch_fused`,
with the same algebra and the same numbers to round-off: the SSIM *maps* (the kernel only reduces),
forward-mode AD and torch.func transforms (the custom ops have no jvp / vmap rule), and a
differentiable backward for double backward.
"""

from __future__ import annotations

from typing import Optional

import torch

from ... import multiscale
from ...config import SSIMConfig
from .. import masked, torch_fused
from ..base import Backend, compile_time_constant
from . import functions
from .build import compiler
from .library import get, unavailable_reason

__all__ = ["CPUBackend", "BACKEND", "available", "get", "unavailable_reason", "compiler"]


def _kernel_ready() -> bool:
    return get(torch.float32) is not None


# Building cannot be traced: torch.compile runs it once at trace time and keeps the answer.
_kernel_ready_constant = compile_time_constant(_kernel_ready)


def available() -> bool:
    """Whether the kernel builds and loads here (compiles it on the first call, about a second).

    Examples:
        >>> isinstance(available(), bool)
        True
    """
    if torch.compiler.is_compiling():
        return _kernel_ready_constant()
    return _kernel_ready()


def why_unavailable() -> Optional[str]:
    """Why the kernel cannot run here, with the fix; ``None`` when it can."""
    if available():
        return None
    found = compiler()
    what = unavailable_reason() if found else "no C compiler found ($CC if set, else cc, gcc, clang)"
    return f"{what}; install a C compiler (gcc or clang) or use backend='torch'"


def _torch_ops_only(img1: torch.Tensor, img2: torch.Tensor) -> bool:
    """Whether these inputs need the torch-ops path: an empty batch (torch's results: empty, and
    NaN for a mean over no image, as on the "torch" backend), a torch.func transform (no vmap rule)
    or a forward-mode tangent (no jvp rule) on the inputs."""
    if img1.shape[0] == 0:
        return True
    if torch.compiler.is_compiling():
        return False
    if torch._C._are_functorch_transforms_active():
        return True
    from torch.autograd import forward_ad

    if forward_ad._current_level >= 0:
        return any(forward_ad.unpack_dual(t).tangent is not None for t in (img1, img2))
    return False


class CPUBackend(Backend):
    """The compiled C kernel on CPU tensors: SSIM statistics, the fused L1 + D-SSIM, the fused
    MS-SSIM pyramid, the graph-free value-and-gradient pass, and the masked statistics and masked
    L1 + D-SSIM (the masked *maps* run the shared composition of :mod:`..masked`)."""

    name = "cpu"

    def ssim_map(self, img1, img2, cfg: SSIMConfig, return_cs=False):
        return torch_fused.ssim_map(img1, img2, cfg, return_cs=return_cs)

    def ssim_stats(self, img1, img2, cfg: SSIMConfig):
        if _torch_ops_only(img1, img2):
            return torch_fused.ssim_stats(img1, img2, cfg)
        return functions.ssim_stats(img1, img2, cfg)

    fused_masks = True

    def ms_ssim(self, img1, img2, cfg: SSIMConfig, weights, tau=None, mask=None):
        if mask is not None:
            if cfg.padding == "reflect" or _torch_ops_only(img1, img2) or functions._tracing(img1, img2, mask):
                return super().ms_ssim(img1, img2, cfg, weights, tau, mask)  # the shared pyramid, masked stats
            return multiscale.combine(functions.masked_ms_terms(img1, img2, mask, cfg, len(weights)), weights, tau)
        if _torch_ops_only(img1, img2):
            return torch_fused.BACKEND.ms_ssim(img1, img2, cfg, weights, tau)
        return multiscale.combine(functions.ms_terms(img1, img2, cfg, len(weights)), weights, tau)

    def dssim_l1(self, img1, img2, cfg: SSIMConfig, lam, mask=None):
        """``(1 - lam) * L1 + lam * (1 - SSIM)`` per image ``[B]``, masked or not, fused in the kernel
        (masked: for "valid" and "same")."""
        return self.dssim_l1_terms(img1, img2, cfg, lam, mask)[0]

    def dssim_l1_terms(self, img1, img2, cfg: SSIMConfig, lam, mask=None):
        """:meth:`dssim_l1` and its terms, the kernel's own L1 and SSIM sums."""
        if _torch_ops_only(img1, img2):  # the shared composition, as on the other backends
            return self.composed_dssim_l1_terms(img1, img2, cfg, lam, mask)
        if mask is None:
            loss, terms = functions.dssim_l1(img1, img2, cfg, lam)
        else:
            loss, terms = functions.masked_dssim_l1(img1, img2, mask, cfg, lam)
        return loss, terms[:, 0], terms[:, 1]

    def masked_ssim_stats(self, img1, img2, mask, cfg: SSIMConfig):
        if _torch_ops_only(img1, img2):
            return masked.masked_ssim_stats(img1, img2, mask, cfg)
        return functions.masked_ssim_stats(img1, img2, mask, cfg)

    def ssim_mean(self, img1, img2, cfg: SSIMConfig, mask=None):
        """The SSIM mean alone: masked, its gradient computed in the forward's sweep when an input
        needs one (MS-SSIM's scales, which use the cs mean, take :meth:`masked_ssim_stats`)."""
        if mask is None or _torch_ops_only(img1, img2):
            return super().ssim_mean(img1, img2, cfg, mask)
        return functions.masked_ssim_stats(img1, img2, mask, cfg, fused=True)[0]

    def ssim_mean_and_grad(self, img1, img2, cfg: SSIMConfig, upstream, mask=None):
        if mask is not None or img1.shape[0] == 0:
            return super().ssim_mean_and_grad(img1, img2, cfg, upstream, mask)
        s, g = functions.ssim_mean_and_grad(img1, img2, cfg, upstream)
        return s, g.to(img1.dtype)


#: The backend object ``splatloss.backends.get("cpu")`` returns.
BACKEND = CPUBackend()
