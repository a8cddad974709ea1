"""Triton backend: fused SSIM kernels with an analytic adjoint backward (``backend="triton"``).

Imported lazily by :mod:`splatloss.backends` (importing splatloss never imports Triton); runs on CUDA
tensors, or on CPU tensors in the Triton interpreter when ``TRITON_INTERPRET=1`` was set before
Triton was imported (that is how the test suite proves the kernels). :data:`BACKEND` implements
:class:`splatloss.backends.base.Backend`. One module per op (``ssim``: stats, map and loss
term; ``masked_ssim``: the masked statistics, their kernels in ``masked_kernels``;
``dssim_l1``; ``ms_ssim``: the pyramid step and the scales as one op; ``combine``: MS-SSIM's
product of the terms); the kernels in ``forward`` / ``backward``; the
jitted bodies they share in ``moments`` (the SSIM formula), ``columns`` / ``ring`` (the filters)
and ``bodies`` (lanes and epilogues); launch geometry in ``launch``; host glue in ``glue``.
``tools/check_kernels.py`` compiles every kernel for sm_80 / sm_90.
"""

from __future__ import annotations

from ..base import Backend
from . import combine as _combine
from . import dssim_l1 as _dssim_l1
from . import masked_ssim as _masked_ssim
from . import ms_ssim as _ms_ssim
from . import ssim as _ssim

__all__ = ["TritonBackend", "BACKEND"]


class TritonBackend(Backend):
    """The Triton kernels behind the backend contract (float32 / float16 / bfloat16 inputs)."""

    name = "triton"

    def ssim_map(self, img1, img2, cfg, return_cs=False):
        return _ssim.ssim_map(img1, img2, cfg, return_cs=return_cs)

    def ssim_stats(self, img1, img2, cfg):
        return _ssim.ssim_stats(img1, img2, cfg)

    # Masked statistics in the kernels (windows up to 11 taps; wider ones take the shared torch
    # fallback); the masked maps (ssim_map with a mask) are the shared fallback's. The 3DGS loss
    # under a mask is fused as the unmasked one is ("same" / "valid"; under "reflect" the L1 term's
    # registers would spill, so it is the base class's composition, as MS-SSIM under a mask is).
    fused_masks = True

    def masked_ssim_stats(self, img1, img2, mask, cfg):
        if not _masked_ssim.fits(cfg):
            return super().masked_ssim_stats(img1, img2, mask, cfg)
        return _masked_ssim.masked_ssim_stats(img1, img2, mask, cfg)

    def ssim_mean(self, img1, img2, cfg, mask=None):
        if mask is not None:
            if not _masked_ssim.fits(cfg):
                return super().ssim_mean(img1, img2, cfg, mask)
            return _masked_ssim.masked_ssim_term(img1, img2, mask, cfg)
        return _ssim.ssim_term(img1, img2, cfg)

    # The losses' means over the batch in the op that forms them (one autograd node, no reduction
    # launched after the kernels): what a training loop calls once a step.
    def ssim_reduced(self, img1, img2, cfg, reduction, mask=None, dssim=False):
        if mask is None and reduction == "mean":
            return _ssim.ssim_loss(img1, img2, cfg, dssim)
        return super().ssim_reduced(img1, img2, cfg, reduction, mask, dssim)

    def dssim_l1_reduced(self, img1, img2, cfg, lam, reduction, mask=None):
        if reduction == "mean":
            if mask is None:
                return _dssim_l1.dssim_l1(img1, img2, cfg, lam, mean=True)
            if _masked_ssim.fits_fused_loss(cfg):
                return _masked_ssim.masked_dssim_l1(img1, img2, mask, cfg, lam, mean=True)
        return super().dssim_l1_reduced(img1, img2, cfg, lam, reduction, mask)

    def ms_ssim(self, img1, img2, cfg, weights, tau=None, mask=None):
        if mask is not None:
            return super().ms_ssim(img1, img2, cfg, weights, tau, mask)
        # fp16 / bf16 images go in as they are: every scale keeps its unit gradient in float32, the
        # pyramid's adjoint adds them up in float32 and rounds the sum once to the input dtype
        # (each scale rounding its share would round several times)
        return _ms_ssim.ms_ssim(img1, img2, cfg, weights, tau=tau)

    def combine_terms(self, terms, weights, tau=None):
        # one launch each way instead of a dozen torch ops forward and forty backward (masked
        # MS-SSIM's scales come here; unmasked ones go through _ms_ssim.ms_ssim, which calls it too)
        return _combine.combine(terms, weights, tau)

    def dssim_l1(self, img1, img2, cfg, lam, mask=None):
        if mask is not None:
            if not _masked_ssim.fits_fused_loss(cfg):
                return super().dssim_l1(img1, img2, cfg, lam, mask)
            return _masked_ssim.masked_dssim_l1(img1, img2, mask, cfg, lam)
        return _dssim_l1.dssim_l1(img1, img2, cfg, lam)

    def dssim_l1_terms(self, img1, img2, cfg, lam, mask=None):
        # the terms from the partial sums the fused loss is formed of, in its launch (no second pass)
        if mask is None:
            return _dssim_l1.dssim_l1_terms(img1, img2, cfg, lam)
        if _masked_ssim.fits_fused_loss(cfg):
            return _masked_ssim.masked_dssim_l1_terms(img1, img2, mask, cfg, lam)
        return self.composed_dssim_l1_terms(img1, img2, cfg, lam, mask)  # what dssim_l1 composes there

    def ssim_mean_and_grad(self, img1, img2, cfg, upstream, mask=None):
        if mask is not None:
            return super().ssim_mean_and_grad(img1, img2, cfg, upstream, mask)
        return _ssim.ssim_mean_and_grad(img1, img2, cfg, upstream)


#: The backend object ``splatloss.backends.get("triton")`` returns.
BACKEND = TritonBackend()
