"""SSIM, MS-SSIM and D-SSIM as functions: input checks, backend choice and reduction, in one place.

Images are ``(B, C, H, W)`` (an unbatched ``(C, H, W)`` is treated as ``B = 1`` and its batch
dimension is dropped again from map / ``reduction="none"`` outputs), any channel count, contiguous
or channels-last, float16 / bfloat16 / float32 / float64. Values come back in the accumulation
dtype (float32, or float64 for float64 input), gradients in each input's dtype.

Every function takes the window and constant keywords of :class:`splatloss.config.SSIMConfig`
(``data_range``, ``window_size``, ``sigma``, ``window``, ``k1``, ``k2``, ``c1``, ``c2``,
``padding``) and ``backend="auto" | "reference" | "torch" | "cpu" | "triton"`` (see
:mod:`splatloss.backends`; :func:`splatloss.backends.explain` says what ``"auto"`` picks).
"""

from __future__ import annotations

import math
import numbers
from typing import Optional, Sequence, Tuple

import torch

from . import backends, multiscale
from .config import MS_SSIM_WEIGHTS, SSIMConfig, accumulation_dtype
from .multiscale import smooth_positive

__all__ = ["ssim", "ssim_map", "ms_ssim", "dssim", "dssim_l1", "dssim_with_gradient", "REDUCTIONS", "smooth_positive"]

REDUCTIONS = ("mean", "sum", "none")
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

#: Default threshold of the smooth positive extension used by the MS-SSIM *loss* (see ms_ssim).
DEFAULT_TAU = 0.01


# ----------------------------------------------------------------------------------------------
# Input checks
# ----------------------------------------------------------------------------------------------


def _shape(t: torch.Tensor) -> Tuple[int, ...]:
    return tuple(t.shape)


def _check_pair(img1, img2) -> Tuple[torch.Tensor, torch.Tensor, bool]:
    """Validate two images; return them as ``(B, C, H, W)`` of one dtype, and whether unbatched."""
    for name, t in (("img1", img1), ("img2", img2)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _FLOAT_DTYPES:
            raise TypeError(
                f"{name} must have a floating dtype (float16, bfloat16, float32 or float64), got {t.dtype}; "
                "convert integer images with img.float() / 255 and keep data_range=1.0"
            )
        if t.dim() not in (3, 4):
            raise ValueError(
                f"{name} must be a (B, C, H, W) or (C, H, W) tensor, got shape {_shape(t)} ({t.dim()} dims)"
            )
    if img1.shape != img2.shape:
        raise ValueError(f"img1 and img2 must have the same shape, got {_shape(img1)} and {_shape(img2)}")
    if img1.shape[-3] == 0:  # checked here so that every backend gives this one error
        raise ValueError(
            f"images must have at least one channel, got shape {_shape(img1)}; a (B, C, H, W) image needs C >= 1"
        )
    if img1.device != img2.device:
        raise ValueError(f"img1 and img2 must be on the same device, got {img1.device} and {img2.device}")
    unbatched = img1.dim() == 3
    if unbatched:
        img1, img2 = img1.unsqueeze(0), img2.unsqueeze(0)
    if img1.dtype != img2.dtype:
        # One dtype for the backends: promote (fp16 + fp32 -> fp32); gradients still come back in
        # each input's own dtype through the cast's backward.
        common = torch.promote_types(img1.dtype, img2.dtype)
        img1, img2 = img1.to(common), img2.to(common)
    return img1, img2, unbatched


def _check_size(img: torch.Tensor, cfg: SSIMConfig, what: str = "images") -> None:
    h, w = img.shape[-2:]
    need = cfg.min_size()
    if h < need or w < need:
        if cfg.padding == "same":
            raise ValueError(
                f"{what} with padding='same' needs at least one row and one column, got {h}x{w}; "
                "an empty image has no SSIM (drop it from the batch)"
            )
        if cfg.padding == "valid":
            why = f"the window (window_size={cfg.window_size}) must fit inside them with padding='valid'"
            fix = "use a smaller window_size or padding='same'"
        else:
            why = f"padding='reflect' mirrors window_size // 2 = {cfg.pad} pixels"
            fix = "use a smaller window_size or padding='same'"
        raise ValueError(f"{what} must be at least {need}x{need} because {why}, got {h}x{w}; {fix}")


def _check_mask(mask, img: torch.Tensor) -> Optional[torch.Tensor]:
    """Validate ``mask`` against the ``(B, C, H, W)`` images ``img``; return it as a float tensor in
    the accumulation dtype shaped ``(B or 1, 1 or C, H, W)`` (None stays None)."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(
            f"mask must be a bool tensor or a float tensor of weights in [0, 1], got dtype {mask.dtype}; "
            "convert it with mask.bool() (or mask.float() / 255 for an 8-bit alpha channel)"
        )
    if mask.device != img.device:
        raise ValueError(
            f"mask must be on the images' device {img.device}, got {mask.device}; move it with mask.to(img.device)"
        )
    b, c, h, w = img.shape
    m = mask[None, None] if mask.dim() == 2 else mask
    ok = m.dim() == 4 and tuple(m.shape[-2:]) == (h, w) and m.shape[0] in (1, b) and m.shape[1] in (1, c)
    if not ok:
        raise ValueError(
            f"mask must be shaped (B, 1, H, W), (1, 1, H, W), (H, W) or (B, C, H, W) for images of shape "
            f"{(b, c, h, w)}, got shape {_shape(mask)}; give one weight per pixel, e.g. alpha[:, None] for a "
            "(B, H, W) alpha"
        )
    return m.to(accumulation_dtype(img.dtype))


def _check_reduction(reduction) -> None:
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def _check_weights(weights) -> Tuple[float, ...]:
    if isinstance(weights, torch.Tensor):
        if weights.dim() != 1:
            raise ValueError(
                f"weights must be a 1-D sequence of scale weights, got a tensor of shape {_shape(weights)}"
            )
        weights = weights.tolist()
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise TypeError(f"weights must be a sequence of numbers (one per scale), got {type(weights).__name__}")
    if len(weights) == 0:
        raise ValueError("weights must have one entry per scale (at least 1), got an empty sequence")
    out = []
    for i, v in enumerate(weights):
        if not isinstance(v, numbers.Real) or isinstance(v, bool):
            raise TypeError(f"weights[{i}] must be a real number, got {v!r} ({type(v).__name__})")
        v = float(v)
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"weights must be finite and >= 0, got weights[{i}] = {v!r}")
        out.append(v)
    if sum(out) <= 0:
        raise ValueError(f"weights must not all be zero, got {tuple(out)}")
    return tuple(out)


def ms_ssim_min_size(cfg: SSIMConfig, scales: int) -> int:
    """Smallest image side MS-SSIM with ``scales`` scales accepts under ``cfg``.

    The coarsest scale has side ``ceil(H / 2^(scales-1))`` and must be at least
    ``cfg.min_size()``, i.e. ``H >= (cfg.min_size() - 1) * 2^(scales-1) + 1`` (161 for the default
    11x11 window, 5 scales, "valid").
    """
    return (cfg.min_size() - 1) * 2 ** (scales - 1) + 1


def _check_ms_size(img: torch.Tensor, cfg: SSIMConfig, scales: int) -> None:
    h, w = img.shape[-2:]
    need = ms_ssim_min_size(cfg, scales)
    if h < need or w < need:
        raise ValueError(
            f"ms_ssim with {scales} scales, window_size={cfg.window_size} and padding={cfg.padding!r} needs images "
            f"of at least {need}x{need} (the coarsest scale, 1/{2 ** (scales - 1)} of the size, must be at least "
            f"{cfg.min_size()} pixels), got {h}x{w}; use fewer scales (a shorter weights sequence, e.g. "
            f"weights={MS_SSIM_WEIGHTS[:3]}), a smaller window_size, or padding='same'"
        )


def _make_cfg(data_range, window_size, sigma, window, k1, k2, c1, c2, padding) -> SSIMConfig:
    return SSIMConfig(
        window_size=window_size,
        sigma=sigma,
        window=window,
        k1=k1,
        k2=k2,
        c1=c1,
        c2=c2,
        data_range=data_range,
        padding=padding,
    )


def _reduce(per_image: torch.Tensor, reduction: str, unbatched: bool) -> torch.Tensor:
    if reduction == "mean":
        return per_image.mean()
    if reduction == "sum":
        return per_image.sum()
    return per_image[0] if unbatched else per_image


# ----------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------


def ssim_map(
    img1: torch.Tensor,
    img2: torch.Tensor,
    *,
    data_range: float = 1.0,
    window_size: int = 11,
    sigma: float = 1.5,
    window: str = "gaussian",
    k1: float = 0.01,
    k2: float = 0.03,
    c1: Optional[float] = None,
    c2: Optional[float] = None,
    padding: str = "valid",
    backend: str = "auto",
    return_cs: bool = False,
    mask: Optional[torch.Tensor] = None,
):
    """Per-pixel SSIM map ``(B, C, H', W')`` (``H' = H - window_size + 1`` for "valid", else ``H``).

    ``SSIM = (2 mu_x mu_y + C1)(2 sigma_xy + C2) / ((mu_x^2 + mu_y^2 + C1)(sigma_x^2 + sigma_y^2 + C2))``
    with window-weighted means and population (co)variances. With ``return_cs=True`` also returns
    the contrast-structure map (the second factor). With ``mask``, the maps of the masked statistics
    (see :func:`ssim`).

    Examples:
        >>> x = torch.rand(2, 3, 32, 32)
        >>> ssim_map(x, x).shape
        torch.Size([2, 3, 22, 22])
        >>> ssim_map(x, x, padding="same").shape
        torch.Size([2, 3, 32, 32])
    """
    cfg = _make_cfg(data_range, window_size, sigma, window, k1, k2, c1, c2, padding)
    x, y, unbatched = _check_pair(img1, img2)
    _check_size(x, cfg)
    m = _check_mask(mask, x)
    if m is None:
        out = backends.resolve(backend, x).ssim_map(x, y, cfg, return_cs=return_cs)
    else:
        smap, cmap, _ = backends.resolve(backend, x).masked_ssim_map(x, y, m, cfg)
        out = (smap, cmap) if return_cs else smap
    if unbatched:
        out = tuple(o[0] for o in out) if return_cs else out[0]
    return out


def ssim(
    img1: torch.Tensor,
    img2: torch.Tensor,
    *,
    data_range: float = 1.0,
    window_size: int = 11,
    sigma: float = 1.5,
    window: str = "gaussian",
    k1: float = 0.01,
    k2: float = 0.03,
    c1: Optional[float] = None,
    c2: Optional[float] = None,
    padding: str = "valid",
    reduction: str = "mean",
    backend: str = "auto",
    mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Structural similarity (Wang et al. 2004): the mean of the SSIM map over channels and pixels.

    With the defaults (11x11 Gaussian, sigma 1.5, K1 0.01, K2 0.03, ``padding="valid"``) it equals
    scikit-image's ``structural_similarity(gaussian_weights=True, sigma=1.5,
    use_sample_covariance=False, data_range=1.0, channel_axis=...)``.

    Args:
        img1, img2: ``(B, C, H, W)`` or ``(C, H, W)`` float images, values nominally in ``[0, data_range]``.
        reduction: ``"mean"`` over the batch (a scalar), ``"sum"``, or ``"none"`` (shape ``(B,)``).
        mask: optional per-pixel weights. A mask ``m`` holds weights in [0, 1] per pixel (bool or
            float), shaped ``(B, 1, H, W)``, ``(1, 1, H, W)``, ``(H, W)`` or ``(B, C, H, W)``. Let ``X, Y``
            be the padded images and ``M`` the
            padded mask: ``"same"`` pads the images with zeros and the mask with **ones** (the zero border
            counts as present black pixels, as 3DGS treats it), ``"reflect"`` mirrors images and mask,
            ``"valid"`` pads nothing. With ``F`` the window filter over the padded arrays and ``W = F(M)``:
            ``mu_x = F(M X) / W``, ``E[x^2] = F(M X^2) / W``, ``E[xy] = F(M X Y) / W`` (likewise for y), and
            the SSIM and cs maps follow as usual. The value of an image is, per channel, the mean of the map
            weighted by the mask at each map position's centre pixel (``m`` itself for "same"/"reflect",
            ``m`` cropped by ``window_size // 2`` for "valid"), then the plain mean over channels; a channel
            whose weights sum to 0 counts as SSIM 1 with zero gradient (nothing to compare). With a mask of
            ones this is exactly the unmasked SSIM for every padding.

    Returns:
        SSIM in the accumulation dtype (float32, or float64 for float64 inputs).

    Examples:
        >>> x = torch.rand(2, 3, 32, 32)
        >>> round(float(ssim(x, x)), 4)
        1.0
        >>> ssim(x, 1 - x, reduction="none").shape
        torch.Size([2])
    """
    _check_reduction(reduction)
    cfg = _make_cfg(data_range, window_size, sigma, window, k1, k2, c1, c2, padding)
    x, y, unbatched = _check_pair(img1, img2)
    _check_size(x, cfg)
    m = _check_mask(mask, x)
    impl = backends.resolve(backend, x)
    s = impl.ssim_mean(x, y, cfg) if m is None else impl.masked_ssim_stats(x, y, m, cfg)[0]  # [B, C]
    return _reduce(s.mean(dim=1), reduction, unbatched)


def dssim(img1: torch.Tensor, img2: torch.Tensor, **kwargs) -> torch.Tensor:
    """Structural dissimilarity ``1 - SSIM`` (takes every keyword of :func:`ssim`).

    Note this is ``1 - SSIM``, as 3DGS uses it, not ``(1 - SSIM) / 2``.

    Examples:
        >>> x = torch.rand(1, 1, 16, 16)
        >>> abs(float(dssim(x, x))) < 1e-6
        True
    """
    reduction = kwargs.pop("reduction", "mean")
    _check_reduction(reduction)
    per_image = ssim(img1, img2, reduction="none", **kwargs)
    unbatched = per_image.dim() == 0
    return _reduce(1 - per_image.reshape(-1), reduction, unbatched)


def ms_ssim(
    img1: torch.Tensor,
    img2: torch.Tensor,
    *,
    data_range: float = 1.0,
    weights: Sequence[float] = MS_SSIM_WEIGHTS,
    window_size: int = 11,
    sigma: float = 1.5,
    window: str = "gaussian",
    k1: float = 0.01,
    k2: float = 0.03,
    c1: Optional[float] = None,
    c2: Optional[float] = None,
    padding: str = "valid",
    reduction: str = "mean",
    backend: str = "auto",
    tau: Optional[float] = None,
    mask: Optional[torch.Tensor] = None,
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
    defaults); smaller images raise a ValueError naming the options.

    With ``mask`` (see :func:`ssim` for its meaning at one scale) the mask goes down the same pyramid
    as the images (repeat-pad an odd side, 2x2 mean) and each scale uses its own mask.

    Examples:
        >>> x = torch.rand(1, 3, 161, 170)
        >>> round(float(ms_ssim(x, x)), 4)
        1.0
        >>> float(ms_ssim(x, 1 - x))
        0.0
        >>> float(ms_ssim(x, 1 - x, tau=0.01)) > 0
        True
    """
    _check_reduction(reduction)
    weights = _check_weights(weights)
    if tau is not None:
        if not isinstance(tau, numbers.Real) or isinstance(tau, bool) or not (0 < float(tau) < 1):
            raise ValueError(f"tau must be a number in (0, 1) or None, got {tau!r}")
        tau = float(tau)
    cfg = _make_cfg(data_range, window_size, sigma, window, k1, k2, c1, c2, padding)
    x, y, unbatched = _check_pair(img1, img2)
    _check_ms_size(x, cfg, len(weights))
    m = _check_mask(mask, x)
    impl = backends.resolve(backend, x)
    if m is None:
        per_image = impl.ms_ssim(x, y, cfg, weights, tau=tau)
    else:
        terms = multiscale.ms_terms(lambda a, b, mj: impl.masked_ssim_stats(a, b, mj, cfg), (x, y, m), len(weights))
        per_image = multiscale.combine(terms, weights, tau)
    return _reduce(per_image, reduction, unbatched)


def dssim_l1(
    img1: torch.Tensor,
    img2: torch.Tensor,
    lam: float = 0.2,
    *,
    data_range: float = 1.0,
    window_size: int = 11,
    sigma: float = 1.5,
    window: str = "gaussian",
    k1: float = 0.01,
    k2: float = 0.03,
    c1: Optional[float] = None,
    c2: Optional[float] = None,
    padding: str = "valid",
    reduction: str = "mean",
    backend: str = "auto",
    mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The 3DGS photometric loss ``(1 - lam) * L1 + lam * (1 - SSIM)`` per image, then reduced.

    ``L1`` is the mean absolute difference over channels and pixels. 3DGS (Kerbl et al. 2023) uses
    ``lam=0.2`` and ``padding="same"``. Runs the backend's fused kernel where it has one ("cpu",
    "triton"). With ``mask``: ``L1 = sum m |x - y| / sum m`` over channels and pixels per image (0
    when the mask is empty) and the masked SSIM of :func:`ssim`.

    Examples:
        >>> x, y = torch.rand(1, 3, 24, 24), torch.rand(1, 3, 24, 24)
        >>> a = dssim_l1(x, y, 0.2, padding="same")
        >>> b = 0.8 * (x - y).abs().mean() + 0.2 * (1 - ssim(x, y, padding="same"))
        >>> bool(torch.allclose(a, b))
        True
    """
    _check_reduction(reduction)
    if not isinstance(lam, numbers.Real) or isinstance(lam, bool) or not (0.0 <= float(lam) <= 1.0):
        raise ValueError(f"lam must be a number in [0, 1], got {lam!r}")
    lam = float(lam)
    cfg = _make_cfg(data_range, window_size, sigma, window, k1, k2, c1, c2, padding)
    x, y, unbatched = _check_pair(img1, img2)
    _check_size(x, cfg)
    m = _check_mask(mask, x)
    impl = backends.resolve(backend, x)
    if m is None:
        per_image = impl.dssim_l1(x, y, cfg, lam)  # [B]
    else:
        per_image = impl.masked_dssim_l1(x, y, m, cfg, lam)  # [B]
    return _reduce(per_image, reduction, unbatched)


def dssim_with_gradient(
    img1: torch.Tensor,
    img2: torch.Tensor,
    *,
    grad: Optional[torch.Tensor] = None,
    reduction: str = "mean",
    backend: str = "auto",
    mask: Optional[torch.Tensor] = None,
    **kwargs,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """D-SSIM (``1 - SSIM``) and its gradient w.r.t. ``img1``, without building an autograd graph.

    The in-place interface FastCUDASSIM.jl users know (``dssim_with_gradient!``): pass a
    preallocated ``grad`` of ``img1``'s shape and floating dtype and it is overwritten and
    returned. Takes the keywords of :func:`ssim`; ``reduction`` is ``"mean"`` or ``"sum"`` (a
    scalar loss). ``img2`` gets no gradient. ``mask`` as in :func:`ssim`.

    Runs the backend's ``ssim_mean_and_grad`` (a direct pass without autograd on "torch", "cpu" and
    "triton"; one small local autograd pass on detached copies on "reference"). Either way the
    inputs' ``.grad`` is untouched and the results carry no graph.

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
    if "padding" not in kwargs:
        kwargs["padding"] = "valid"
    cfg = _make_cfg(
        kwargs.pop("data_range", 1.0),
        kwargs.pop("window_size", 11),
        kwargs.pop("sigma", 1.5),
        kwargs.pop("window", "gaussian"),
        kwargs.pop("k1", 0.01),
        kwargs.pop("k2", 0.03),
        kwargs.pop("c1", None),
        kwargs.pop("c2", None),
        kwargs.pop("padding"),
    )
    if kwargs:
        raise TypeError(f"dssim_with_gradient got unexpected keyword arguments {sorted(kwargs)}")
    x, y, unbatched = _check_pair(img1, img2)
    _check_size(x, cfg)
    if grad is not None:
        if not isinstance(grad, torch.Tensor):
            raise TypeError(f"grad must be a torch.Tensor or None, got {type(grad).__name__}")
        if grad.shape != img1.shape or grad.dtype not in _FLOAT_DTYPES or grad.device != img1.device:
            raise ValueError(
                f"grad must be a floating tensor shaped like img1 {_shape(img1)} on {img1.device}, "
                f"got shape {_shape(grad)}, dtype {grad.dtype} on {grad.device}"
            )
    m = _check_mask(mask, x)
    impl = backends.resolve(backend, x)
    b, c = x.shape[:2]
    # d(1 - mean_c ssim_bc) = -1/C per (B, C); "mean" over the batch divides by B as well.
    scale = -1.0 / (c * (b if reduction == "mean" else 1))
    upstream = torch.full((b, c), scale, dtype=accumulation_dtype(x.dtype), device=x.device)
    if m is not None:  # one local autograd pass through the masked statistics, on detached copies
        with torch.enable_grad():
            xd = x.detach().requires_grad_(True)
            s, _ = impl.masked_ssim_stats(xd, y.detach(), m.detach(), cfg)
            (g,) = torch.autograd.grad((s * upstream).sum(), xd)
        s = s.detach()
    with torch.no_grad():
        if m is None:
            s, g = impl.ssim_mean_and_grad(x.detach(), y.detach(), cfg, upstream)
        value = 1 - s.mean(dim=1)
        value = value.mean() if reduction == "mean" else value.sum()
        if unbatched:
            g = g[0]
        if grad is None:
            grad = g.to(img1.dtype)
        else:
            grad.copy_(g)
    return value, grad
