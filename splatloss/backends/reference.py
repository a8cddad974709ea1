"""The "reference" backend: :mod:`splatloss.reference` (plain torch ops, gradients by autograd) behind
the backend contract, so the oracle can be asked for by name like any other backend."""

from __future__ import annotations

from .. import reference as oracle
from ..config import accumulation_dtype
from . import masked
from .base import Backend

__all__ = ["ReferenceBackend", "BACKEND"]


class ReferenceBackend(Backend):
    """Readable, unoptimised, any device and dtype; every other backend is tested against it."""

    name = "reference"

    def ssim_map(self, img1, img2, cfg, return_cs=False):
        return oracle.ssim_map(img1, img2, cfg, return_cs=return_cs)

    def ssim_stats(self, img1, img2, cfg):
        return oracle.ssim_stats(img1, img2, cfg)

    # Masked statistics: the shared torch-ops composition, run in float64 like the rest of the oracle
    # (in float32 its variances lose flat images to cancellation), values back in the accumulation
    # dtype; the casts' autograd rounds the float64 gradients once to the inputs' dtype.
    def masked_ssim_map(self, img1, img2, mask, cfg):
        acc = accumulation_dtype(img1.dtype)
        out = masked.masked_ssim_map(img1.double(), img2.double(), mask.double(), cfg)
        return tuple(t.to(acc) for t in out)

    def masked_ssim_stats(self, img1, img2, mask, cfg):
        acc = accumulation_dtype(img1.dtype)
        return tuple(t.to(acc) for t in masked.masked_ssim_stats(img1.double(), img2.double(), mask.double(), cfg))

    def ms_ssim(self, img1, img2, cfg, weights, tau=None, mask=None):
        if mask is not None:
            return super().ms_ssim(img1, img2, cfg, weights, tau, mask)
        return oracle.ms_ssim(img1, img2, cfg, weights, tau=tau)


#: The backend object ``splatloss.backends.get("reference")`` returns.
BACKEND = ReferenceBackend()
