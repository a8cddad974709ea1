"""Triton backend: fused SSIM kernels with an analytic adjoint backward (``backend="triton"``).

Imported lazily by :func:`splatloss.backends.resolve`; runs on CUDA tensors, or on CPU tensors in
the Triton interpreter when ``TRITON_INTERPRET=1`` was set before Triton was imported (that is how
the test suite proves the kernels). Entry points follow docs/CONTRACT.md; the kernels, their
bytes-per-pixel model and the save-vs-recompute choice are described in ``ssim.py`` and in the
README's "Triton kernels" section.
"""

from .ssim import ssim_map, ssim_mean_and_grad, ssim_stats

__all__ = ["ssim_map", "ssim_stats", "ssim_mean_and_grad"]
