"""SSIM, MS-SSIM and D-SSIM as functions: input checks, backend choice and reduction, in one place.

Images are ``(B, C, H, W)`` (an unbatched ``(C, H, W)`` is treated as ``B = 1`` and its batch
dimension is dropped again from map / ``reduction="none"`` outputs), any channel count, contiguous
or channels-last, float16 / bfloat16 / float32 / float64. Values come back in the accumulation
dtype (float32, or float64 for float64 input), gradients in each input's dtype (for fp16 / bf16,
the exact gradient rounded once: partial gradients are added in float32).

Every function takes the SSIM options, the fields of :class:`splatloss.config.SSIMConfig`
(``data_range``, ``window_size``, ``sigma``, ``window``, ``k1``, ``k2``, ``c1``, ``c2``,
``padding``), as keywords or as one validated ``config=SSIMConfig(...)``, and
``backend="auto" | "reference" | "torch" | "cpu" | "triton"`` (see :mod:`splatloss.backends`;
:func:`splatloss.backends.explain` says what ``"auto"`` picks).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import backends
from .checks import (
    FLOAT_DTYPES,
    REDUCTIONS,
    check_constants,
    check_fraction,
    check_mask,
    check_ms_size,
    check_pair,
    check_reduction,
    check_size,
    check_tau,
    check_weights,
    ms_ssim_min_size,
    reduce,
)
from .config import MS_SSIM_WEIGHTS, SSIMConfig, accumulation_dtype, resolve, takes_options, without_autocast
from .multiscale import smooth_positive

__all__ = [
    "ssim",
    "ssim_map",
    "ms_ssim",
    "dssim",
    "dssim_l1",
    "dssim_with_gradient",
    "REDUCTIONS",
    "DEFAULT_TAU",
    "smooth_positive",
    "ms_ssim_min_size",
]

#: Default threshold of the smooth positive extension used by the MS-SSIM *loss* (see ms_ssim).
DEFAULT_TAU = 0.01


def prepare(img1, img2, config: Optional[SSIMConfig], options, mask, backend: str):
    """The checks every entry point runs, once: the configuration, the images (as ``(B, C, H, W)``),
    the constants against the images' dtype, the mask; and the backend for them.

    Returns ``(cfg, img1, img2, mask, unbatched, backend)``; the loss modules call it too, so that a
    loss of several terms validates its inputs once.
    """
    cfg = resolve(config, options)
    x, y, unbatched = check_pair(img1, img2)
    check_constants(cfg, x.dtype)
    m = check_mask(mask, x)
    impl = backends.resolve(backend, x)
    if m is not None and m.requires_grad and torch.is_grad_enabled() and impl.fused_masks:
        # The fused masked kernels differentiate the images only: a mask that requires grad runs the
        # torch-ops composition, whose autograd gives the gradient to the mask as well.
        impl = backends.get("torch")
    return cfg, x, y, m, unbatched, impl


@without_autocast
@takes_options
def ssim_map(
    img1: torch.Tensor,
    img2: torch.Tensor,
    *,
    backend: str = "auto",
    return_cs: bool = False,
    mask: Optional[torch.Tensor] = None,
    config: Optional[SSIMConfig] = None,
    **options,
):
    """Per-pixel SSIM map ``(B, C, H', W')`` (``H' = H - window_size + 1`` for "valid", else ``H``).

    ``SSIM = (2 mu_x mu_y + C1)(2 sigma_xy + C2) / ((mu_x^2 + mu_y^2 + C1)(sigma_x^2 + sigma_y^2 + C2))``
    with window-weighted means and population (co)variances. With ``return_cs=True`` also returns
    the contrast-structure map (the second factor). With ``mask``, the maps of the masked statistics
    (``docs/conventions.md``, "Masks"). Options and ``config`` as :func:`ssim`.

    Examples:
        >>> x = torch.rand(2, 3, 32, 32)
        >>> ssim_map(x, x).shape
        torch.Size([2, 3, 22, 22])
        >>> ssim_map(x, x, padding="same").shape
        torch.Size([2, 3, 32, 32])
    """
    cfg, x, y, m, unbatched, impl = prepare(img1, img2, config, options, mask, backend)
    check_size(x, cfg)
    if m is None:
        out = impl.ssim_map(x, y, cfg, return_cs=return_cs)
    else:
        smap, cmap, _ = impl.masked_ssim_map(x, y, m, cfg)
        out = (smap, cmap) if return_cs else smap
    if unbatched:
        out = tuple(o[0] for o in out) if return_cs else out[0]
    return out


@without_autocast
@takes_options
def ssim(
    img1: torch.Tensor,
    img2: torch.Tensor,
    *,
    reduction: str = "mean",
    backend: str = "auto",
    mask: Optional[torch.Tensor] = None,
    config: Optional[SSIMConfig] = None,
    **options,
) -> torch.Tensor:
    """Structural similarity (Wang et al. 2004): the mean of the SSIM map over channels and pixels.

    With the defaults (11x11 Gaussian, sigma 1.5, K1 0.01, K2 0.03, ``padding="valid"``) it equals
    scikit-image's ``structural_similarity(gaussian_weights=True, sigma=1.5,
    use_sample_covariance=False, data_range=1.0, channel_axis=...)``; the other published
    conventions are in :mod:`splatloss.conventions`.

    Args:
        img1, img2: ``(B, C, H, W)`` or ``(C, H, W)`` float images, values nominally in ``[0, data_range]``.
        reduction: ``"mean"`` over the batch (a scalar), ``"sum"``, or ``"none"`` (shape ``(B,)``).
        backend: ``"auto" | "reference" | "torch" | "cpu" | "triton"`` (:mod:`splatloss.backends`).
        mask: optional per-pixel weights, bool or finite and >= 0, shaped ``(B, 1, H, W)``,
            ``(1, 1, H, W)``, ``(H, W)`` or ``(B, C, H, W)``: the masked statistics of
            ``docs/conventions.md`` ("Masks"). Weights are relative: each image's are divided by
            its largest (so ``"same"``'s padding weighs as much as the largest weight), and a mask
            of one weight (ones, any constant) gives exactly the unmasked value. A mask that
            requires grad gets its gradient (by the torch-ops composition on every backend).
        config: an :class:`~splatloss.config.SSIMConfig` holding the options below, validated once
            (what the loss modules pass); options given beside it replace its fields.
        data_range, window_size, sigma, window, k1, k2, c1, c2, padding: the SSIM options, the fields
            of :class:`~splatloss.config.SSIMConfig` (defaults as there).

    Returns:
        SSIM in the accumulation dtype (float32, or float64 for float64 inputs).

    Examples:
        >>> x = torch.rand(2, 3, 32, 32)
        >>> round(float(ssim(x, x)), 4)
        1.0
        >>> ssim(x, 1 - x, reduction="none").shape
        torch.Size([2])
    """
    check_reduction(reduction)
    cfg, x, y, m, unbatched, impl = prepare(img1, img2, config, options, mask, backend)
    check_size(x, cfg)
    out = impl.ssim_reduced(x, y, cfg, reduction, m)
    return out[0] if unbatched and reduction == "none" else out


@without_autocast
@takes_options
def dssim(
    img1: torch.Tensor,
    img2: torch.Tensor,
    *,
    reduction: str = "mean",
    backend: str = "auto",
    mask: Optional[torch.Tensor] = None,
    config: Optional[SSIMConfig] = None,
    **options,
) -> torch.Tensor:
    """Structural dissimilarity ``1 - SSIM`` (the arguments of :func:`ssim`).

    Note this is ``1 - SSIM``, as 3DGS uses it, not ``(1 - SSIM) / 2``.

    Examples:
        >>> x = torch.rand(1, 1, 16, 16)
        >>> abs(float(dssim(x, x))) < 1e-6
        True
    """
    check_reduction(reduction)
    cfg, x, y, m, unbatched, impl = prepare(img1, img2, config, options, mask, backend)
    check_size(x, cfg)
    out = impl.ssim_reduced(x, y, cfg, reduction, m, dssim=True)
    return out[0] if unbatched and reduction == "none" else out


@without_autocast
@takes_options
def ms_ssim(
    img1: torch.Tensor,
    img2: torch.Tensor,
    *,
    weights=MS_SSIM_WEIGHTS,
    reduction: str = "mean",
    backend: str = "auto",
    tau: Optional[float] = None,
    mask: Optional[torch.Tensor] = None,
    config: Optional[SSIMConfig] = None,
    **options,
) -> torch.Tensor:
    """Multi-scale SSIM exactly as TF's ``tf.image.ssim_multiscale`` (Wang, Simoncelli, Bovik 2003).

    ``M = len(weights)`` scales; between scales an odd side is padded by repeating its last row /
    column (bottom / right) and 2x2 blocks are averaged, so no pixel is dropped. Per channel:
    ``prod_{j<M} f(cs_j)^{w_j} * f(ssim_M)^{w_M}``, then the mean over channels.

    ``f`` is how negative terms are handled:

    * ``tau=None`` (the metric, default): ``f = relu`` as TF. A pair whose cs at some scale is
      ``<= 0`` scores 0, and its gradient there is 0 (or undefined): fine for evaluation, dead
      for training.
    * ``tau=0.01`` (what :class:`splatloss.MSSSIMLoss` uses): ``f(x) = x`` for ``x >= tau`` and
      ``tau^2 / (2 tau - x)`` below, a positive C1 extension with a never-zero slope. It equals the
      metric whenever every term is ``>= tau``, and keeps a finite, non-zero gradient when a scale
      goes negative (e.g. ``img2 = 1 - img1``).

    Images must be at least ``(min_side - 1) * 2^(M-1) + 1`` pixels on each side (161 for the
    defaults); smaller images raise a ValueError naming the options. A ``mask`` (as :func:`ssim`)
    goes down the same pyramid as the images and each scale uses its own. The other arguments are
    those of :func:`ssim`.

    Examples:
        >>> x = torch.rand(1, 3, 161, 170)
        >>> round(float(ms_ssim(x, x)), 4)
        1.0
        >>> float(ms_ssim(x, 1 - x))
        0.0
        >>> float(ms_ssim(x, 1 - x, tau=0.01)) > 0
        True
    """
    check_reduction(reduction)
    weights = check_weights(weights)
    tau = check_tau(tau)
    cfg, x, y, m, unbatched, impl = prepare(img1, img2, config, options, mask, backend)
    check_ms_size(x, cfg, len(weights))
    return reduce(impl.ms_ssim(x, y, cfg, weights, tau, m), reduction, unbatched)


@without_autocast
@takes_options
def dssim_l1(
    img1: torch.Tensor,
    img2: torch.Tensor,
    lam: float = 0.2,
    *,
    reduction: str = "mean",
    backend: str = "auto",
    mask: Optional[torch.Tensor] = None,
    config: Optional[SSIMConfig] = None,
    **options,
) -> torch.Tensor:
    """The 3DGS photometric loss ``(1 - lam) * L1 + lam * (1 - SSIM)`` per image, then reduced.

    ``L1`` is the mean absolute difference over channels and pixels. 3DGS (Kerbl et al. 2023) uses
    ``lam=0.2`` and ``padding="same"``. Runs the backend's fused kernel where it has one ("cpu",
    "triton"). With ``mask``: ``L1 = sum m |x - y| / sum m`` over channels and pixels per image (0
    when the mask is empty) and the masked SSIM of :func:`ssim`. The other arguments are those of
    :func:`ssim`.

    Examples:
        >>> x, y = torch.rand(1, 3, 24, 24), torch.rand(1, 3, 24, 24)
        >>> a = dssim_l1(x, y, 0.2, padding="same")
        >>> b = 0.8 * (x - y).abs().mean() + 0.2 * (1 - ssim(x, y, padding="same"))
        >>> bool(torch.allclose(a, b))
        True
    """
    check_reduction(reduction)
    lam = check_fraction("lam", lam)
    cfg, x, y, m, unbatched, impl = prepare(img1, img2, config, options, mask, backend)
    check_size(x, cfg)
    out = impl.dssim_l1_reduced(x, y, cfg, lam, reduction, m)
    return out[0] if unbatched and reduction == "none" else out


@without_autocast
@takes_options
def dssim_with_gradient(
    img1: torch.Tensor,
    img2: torch.Tensor,
    *,
    grad: Optional[torch.Tensor] = None,
    reduction: str = "mean",
    backend: str = "auto",
    mask: Optional[torch.Tensor] = None,
    config: Optional[SSIMConfig] = None,
    **options,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """D-SSIM (``1 - SSIM``) and its gradient w.r.t. ``img1``, without building an autograd graph.

    The in-place interface FastCUDASSIM.jl users know (``dssim_with_gradient!``): pass a
    preallocated ``grad`` of ``img1``'s shape and floating dtype and it is overwritten and
    returned. Takes the arguments of :func:`ssim`; ``reduction`` is ``"mean"`` or ``"sum"`` (a
    scalar loss). ``img2`` gets no gradient.

    Runs the backend's ``ssim_mean_and_grad`` (a direct pass without autograd on "torch", "cpu" and
    "triton"; one small local autograd pass on detached copies on "reference" and with a mask).
    Either way the inputs' ``.grad`` is untouched and the results carry no graph.

    Returns:
        ``(dssim, grad)``: the reduced D-SSIM (accumulation dtype) and ``d dssim / d img1``.

    Examples:
        >>> x, y = torch.rand(1, 3, 16, 16), torch.rand(1, 3, 16, 16)
        >>> buf = torch.empty_like(x)
        >>> value, g = dssim_with_gradient(x, y, grad=buf)
        >>> g is buf, g.shape
        (True, torch.Size([1, 3, 16, 16]))
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum' for dssim_with_gradient, got {reduction!r}")
    cfg, x, y, m, unbatched, impl = prepare(img1, img2, config, options, mask, backend)
    check_size(x, cfg)
    if grad is not None:
        if not isinstance(grad, torch.Tensor):
            raise TypeError(f"grad must be a torch.Tensor or None, got {type(grad).__name__}")
        if grad.shape != img1.shape or grad.dtype not in FLOAT_DTYPES or grad.device != img1.device:
            raise ValueError(
                f"grad must be a floating tensor shaped like img1 {tuple(img1.shape)} on {img1.device}, "
                f"got shape {tuple(grad.shape)}, dtype {grad.dtype} on {grad.device}"
            )
        if any(st == 0 and n > 1 for st, n in zip(grad.stride(), grad.shape)):
            raise ValueError(
                f"grad must own one element per pixel of img1 to be overwritten, got a view with strides "
                f"{grad.stride()} (an expanded or broadcast tensor, whose elements share memory); pass "
                "torch.empty_like(img1), or grad=None for a new tensor"
            )
    b, c = x.shape[:2]
    # d(1 - mean_c ssim_bc) = -1/C per (B, C); "mean" over the batch divides by B as well (an empty
    # batch has no upstream to scale: its value is NaN, torch's mean of nothing, and its gradient empty).
    scale = -1.0 / (c * (max(b, 1) if reduction == "mean" else 1))
    upstream = torch.full((b, c), scale, dtype=accumulation_dtype(x.dtype), device=x.device)
    with torch.no_grad():
        s, g = impl.ssim_mean_and_grad(x.detach(), y.detach(), cfg, upstream, m)
        value = 1 - s.mean(dim=1)
        value = value.mean() if reduction == "mean" else value.sum()
        if unbatched:
            g = g[0]
        if grad is None:
            grad = g.to(img1.dtype)
        else:
            grad.copy_(g)
    return value, grad
