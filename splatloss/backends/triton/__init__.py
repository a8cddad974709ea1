"""Triton backend: fused SSIM kernels with an analytic adjoint backward (``backend="triton"``).

Imported lazily by :func:`splatloss.backends.resolve`; runs on CUDA tensors, or on CPU tensors in
the Triton interpreter when ``TRITON_INTERPRET=1`` was set before Triton was imported (that is how
the test suite proves the kernels). Entry points follow docs/CONTRACT.md; one file per op
(``ssim.py``, ``dssim_l1.py``, ``ms_ssim.py``), shared device code in ``_common.py``. The
bytes-per-pixel model and the save-vs-recompute choice are in ``ssim.py`` and in the README's
"Triton kernels" section; ``scripts/check_kernels.py`` compiles every kernel for sm_80 / sm_90.
"""

from .dssim_l1 import dssim_l1
from .ms_ssim import ms_ssim
from .ssim import ssim_map, ssim_mean_and_grad, ssim_stats

__all__ = ["ssim_map", "ssim_stats", "ms_ssim", "dssim_l1", "ssim_mean_and_grad"]
