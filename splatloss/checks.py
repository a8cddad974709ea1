"""Input checks shared by the functions, the loss modules and the drop-ins, and the batch reduction.

Every check raises a ``TypeError`` or ``ValueError`` that names the argument, says what was expected
and what came, and, where there is one, the fix. What is validated, and what each backend then
guarantees, is stated once in ``docs/validation.md``.

Examples:
    >>> import torch
    >>> x, y, unbatched = check_pair(torch.rand(3, 8, 8), torch.rand(3, 8, 8))
    >>> x.shape, unbatched
    (torch.Size([1, 3, 8, 8]), True)
    >>> check_reduction("avg")
    Traceback (most recent call last):
    ...
    ValueError: reduction must be one of ('mean', 'sum', 'none'), got 'avg'
"""

from __future__ import annotations

import math
import numbers
from typing import Optional, Sequence, Tuple

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .config import MS_SSIM_WEIGHTS, SSIMConfig, accumulation_dtype

__all__ = [
    "REDUCTIONS",
    "FLOAT_DTYPES",
    "BACKENDS",
    "check_pair",
    "check_size",
    "check_ms_size",
    "ms_ssim_min_size",
    "check_mask",
    "check_reduction",
    "check_weights",
    "check_tau",
    "check_fraction",
    "check_backend",
    "check_constants",
    "reduce",
]

REDUCTIONS = ("mean", "sum", "none")
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: The backend names a call may ask for (``splatloss.backends`` implements them).
BACKENDS = ("auto", "reference", "torch", "cpu", "triton")


def _shape(t: torch.Tensor) -> Tuple[int, ...]:
    return tuple(t.shape)


def check_pair(img1, img2) -> Tuple[torch.Tensor, torch.Tensor, bool]:
    """Validate two images; return them as ``(B, C, H, W)`` of one dtype, and whether unbatched."""
    for name, t in (("img1", img1), ("img2", img2)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in FLOAT_DTYPES:
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


def check_size(img: torch.Tensor, cfg: SSIMConfig, what: str = "images") -> None:
    """The images' sides against the smallest one ``cfg`` can filter (:meth:`SSIMConfig.min_size`)."""
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
        else:
            why = f"padding='reflect' mirrors window_size // 2 = {cfg.pad} pixels"
        raise ValueError(
            f"{what} must be at least {need}x{need} because {why}, got {h}x{w}; "
            "use a smaller window_size or padding='same'"
        )


def ms_ssim_min_size(cfg: SSIMConfig, scales: int) -> int:
    """Smallest image side MS-SSIM with ``scales`` scales accepts under ``cfg``.

    The coarsest scale has side ``ceil(H / 2^(scales-1))`` and must be at least
    ``cfg.min_size()``, i.e. ``H >= (cfg.min_size() - 1) * 2^(scales-1) + 1`` (161 for the default
    11x11 window, 5 scales, "valid").

    Examples:
        >>> ms_ssim_min_size(SSIMConfig(), 5)
        161
    """
    return (cfg.min_size() - 1) * 2 ** (scales - 1) + 1


def check_ms_size(img: torch.Tensor, cfg: SSIMConfig, scales: int) -> None:
    """The images' sides against :func:`ms_ssim_min_size`."""
    h, w = img.shape[-2:]
    need = ms_ssim_min_size(cfg, scales)
    if h < need or w < need:
        raise ValueError(
            f"ms_ssim with {scales} scales, window_size={cfg.window_size} and padding={cfg.padding!r} needs images "
            f"of at least {need}x{need} (the coarsest scale, 1/{2 ** (scales - 1)} of the size, must be at least "
            f"{cfg.min_size()} pixels), got {h}x{w}; use fewer scales (a shorter weights sequence, e.g. "
            f"weights={MS_SSIM_WEIGHTS[:3]}), a smaller window_size, or padding='same'"
        )


def check_mask(mask, img: torch.Tensor) -> Optional[torch.Tensor]:
    """Validate ``mask`` against the ``(B, C, H, W)`` images ``img``; return it as a float tensor in
    the accumulation dtype shaped ``(B or 1, 1 or C, H, W)``, each image's weights divided by its
    largest one (None stays None).

    A mask is boolean, or floating with finite, non-negative weights; a NaN, an infinity or a
    negative weight is refused (it has no meaning as a weight, and the backends would disagree on it).
    Weights are relative: every statistic is a ratio of mask-weighted sums, so each image's mask is
    scaled to a largest weight of 1 (in the mask's own precision, or float32 for a half-precision
    mask, before the cast to the images' accumulation dtype), which keeps weights from 1e-44 to
    3e38, and float64 weights beyond float32's range, inside what a float32 computation holds.
    The ``"same"`` padding's weight of 1 is then the image's largest weight. A mask of one weight
    (ones, or any constant) is the unmasked value.

    The values are read to the host once per mask and version (``tensor._version`` moves on every
    in-place change): a mask used again unchanged is neither read (no GPU -> CPU synchronisation)
    nor scaled again. A write the version counter does not see (through a NumPy array sharing the
    mask's memory, or through ``mask.data``) is not seen here either: pass such a mask as a new
    tensor (``mask.clone()``). A mask whose weights are all the same positive number (a mask of
    ones) is no mask: None comes back, and the call computes the unmasked value, bit for bit.
    """
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
    acc = accumulation_dtype(img.dtype)
    if torch.compiler.is_compiling() or (m.is_cuda and torch.cuda.is_current_stream_capturing()):
        # No Python branch on a tensor inside a traced graph or a CUDA graph being captured (reading
        # the answer would synchronise): the check runs as an assertion op on the device.
        if m.dtype != torch.bool:
            _assert_mask_values(m)
        return _normalised(m, acc)
    if m.requires_grad and torch.is_grad_enabled():
        # the scaling is part of the graph (each call builds its own); the values are checked once
        _check_mask_once(mask, m)
        return _normalised(m, acc)
    if mask.is_inference():  # an inference tensor has no version counter: checked at every use
        return _prepared(m, acc)
    return _check_mask_once(mask, m, acc)


#: Masks already checked, by the tensor that owns their memory (a view's base): for each view of it
#: (shape, strides, offset) and accumulation dtype, the version checked and, when one is asked for,
#: the scaled mask. Weak keys: an entry lives as long as the user's tensor. A stored scaled mask never
#: shares the user's memory or holds a graph, so it keeps the key alive through no reference.
_checked: "WeakIdKeyDictionary" = WeakIdKeyDictionary()


def _check_mask_once(mask: torch.Tensor, m: torch.Tensor, acc: Optional[torch.dtype] = None):
    """Check ``m`` (``mask`` as 4-D) unless this version of it was checked; with ``acc``, return the
    scaled mask in ``acc``, computed once per version."""
    root = mask if mask._base is None else mask._base
    key = (tuple(m.shape), m.stride(), m.storage_offset(), m.dtype, acc)
    seen = _checked.get(root)
    version = mask._version
    hit = None if seen is None else seen.get(key)
    if hit is not None and hit[0] == version:
        return hit[1]
    if acc is None:
        _check_mask_values(m)
        out = None
    else:
        out = _prepared(m, acc)
    if seen is None:
        seen = _checked.setdefault(root, {})
    seen[key] = (version, out)
    return out


def _prepared(m: torch.Tensor, acc: torch.dtype) -> Optional[torch.Tensor]:
    """``m`` checked and scaled (:func:`_normalised`), or None where every weight is the same
    positive number: such a mask means no mask, and the call then computes the unmasked value
    itself, bit for bit."""
    if m.numel() == 0:
        return m.to(acc)
    if m.dtype == torch.bool:
        uniform = bool(m.all())
    else:
        lo, hi = _check_mask_values(m)
        uniform = lo == hi > 0
    if uniform:
        return None
    with torch.no_grad():
        return _normalised(m, acc)


def _normalised(m: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """``m`` with each image's weights divided by its largest (an empty image's stay 0), in ``acc``.

    The division runs in the mask's dtype, float32 at least, before the cast: a float64 mask whose
    weights lie outside float32's range (1e-50, 1e39) keeps its meaning. Dividing by a largest weight
    of 1 changes nothing, bit for bit, so a mask of ones or of zeros and ones is used as given."""
    work = torch.promote_types(m.dtype, acc)
    mw = m.to(work)
    if mw.numel() == 0:
        return mw.to(acc)
    top = mw.amax(dim=(1, 2, 3), keepdim=True)
    scaled = mw / torch.where(top > 0, top, torch.ones_like(top))
    return scaled.to(acc)


def _assert_mask_values(m: torch.Tensor) -> None:
    if m.numel() == 0:
        return
    lo, hi = torch.aminmax(m)
    top = torch.finfo(m.dtype).max
    torch._assert_async((lo >= 0) & (hi <= top), "mask weights must be finite and >= 0")


def _check_mask_values(m: torch.Tensor) -> Tuple[float, float]:
    """The smallest and largest weight of ``m``, read once; a ValueError counting the NaN, infinite
    and negative weights where there are any."""
    if m.numel() == 0 or m.dtype == torch.bool:
        return 0.0, 1.0
    # One pass over the mask: the smallest and largest weight (both NaN where any weight is NaN);
    # ``hi <= max`` is False for NaN and +inf, ``lo >= 0`` for negatives and NaN.
    lo, hi = torch.aminmax(m.detach())
    top = torch.finfo(m.dtype).max
    # both bounds in one read (one synchronisation on a GPU); NaN fails both comparisons
    lo, hi = torch.stack((lo, hi)).tolist()
    if not (lo >= 0 and hi <= top):
        m = m.detach()
        valid = (m >= 0) & (m <= top)
        bad = m[~valid]
        n_nan = int(torch.isnan(bad).sum())
        n_inf = int(torch.isinf(bad).sum())
        n_neg = int(bad.numel() - n_nan - n_inf)
        what = ", ".join(f"{n} {kind}" for n, kind in ((n_nan, "NaN"), (n_inf, "infinite"), (n_neg, "negative")) if n)
        raise ValueError(
            f"mask weights must be finite and >= 0 (bool, or float weights in [0, 1]), got {what} "
            f"weight{'s' if bad.numel() > 1 else ''}; replace them, e.g. mask.nan_to_num(0.0).clamp(0, 1)"
        )
    return lo, hi


def check_reduction(reduction) -> str:
    """``reduction`` is one of :data:`REDUCTIONS`."""
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    return reduction


def check_backend(backend) -> str:
    """``backend`` is one of :data:`BACKENDS` (whether it can run is :func:`splatloss.backends.resolve`'s)."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def check_weights(weights, name: str = "weights") -> Tuple[float, ...]:
    """MS-SSIM scale weights: a non-empty sequence of finite numbers >= 0, not all zero."""
    if isinstance(weights, torch.Tensor):
        if weights.dim() != 1:
            raise ValueError(f"{name} must be a 1-D sequence of scale weights, got a tensor of shape {_shape(weights)}")
        weights = weights.tolist()
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise TypeError(f"{name} must be a sequence of numbers (one per scale), got {type(weights).__name__}")
    if len(weights) == 0:
        raise ValueError(f"{name} must have one entry per scale (at least 1), got an empty sequence")
    out = []
    for i, v in enumerate(weights):
        if not isinstance(v, numbers.Real) or isinstance(v, bool):
            raise TypeError(f"{name}[{i}] must be a real number, got {v!r} ({type(v).__name__})")
        v = float(v)
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be finite and >= 0, got {name}[{i}] = {v!r}")
        out.append(v)
    if sum(out) <= 0:
        raise ValueError(f"{name} must not all be zero, got {tuple(out)}")
    return tuple(out)


def check_tau(tau) -> Optional[float]:
    """The smooth positive extension's threshold: a number in (0, 1), or None (relu, the metric)."""
    if tau is None:
        return None
    if not isinstance(tau, numbers.Real) or isinstance(tau, bool) or not (0 < float(tau) < 1):
        raise ValueError(f"tau must be a number in (0, 1) or None, got {tau!r}")
    return float(tau)


def check_fraction(name: str, value) -> float:
    """A mixing weight in [0, 1] (``lam``, ``lambda_dssim``, ``alpha``)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not (0.0 <= float(value) <= 1.0):
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)


#: The range of constants a float32 computation holds (measured on every float32 backend against the
#: float64 reference): ``C1`` and ``C2`` must stay normal float32 numbers with room to spare
#: (``1e-36 .. 1e36``; the smallest normal float32 is 1.2e-38), and the images' squares must not
#: overflow (``data_range <= 1e18``; float32 overflows at 3.4e38). Inside it the float32 backends equal
#: float64 to round-off (values 1e-7, gradients 1e-6 at data_range 1e18 and at C = 1e-36).
FLOAT32_MIN_C = 1e-36
FLOAT32_MAX_C = 1e36
FLOAT32_MAX_RANGE = 1e18


def check_constants(cfg: SSIMConfig, dtype: torch.dtype) -> None:
    """Refuse constants a float32 computation cannot hold; float64 input holds them all.

    float16, bfloat16 and float32 inputs are computed in float32, so they need ``1e-36 <= C1, C2 <=
    1e36`` and ``data_range <= 1e18``; outside, the error says which value and gives the fix (float64
    input, or images rescaled to [0, 1] with ``data_range=1.0``).
    """
    if accumulation_dtype(dtype) == torch.float64:
        return
    fix = "pass float64 images (computed in float64), or rescale the images to [0, 1] and use data_range=1.0"
    if cfg.data_range > FLOAT32_MAX_RANGE:
        raise ValueError(
            f"data_range={cfg.data_range:g} is too large for {dtype} input: at most {FLOAT32_MAX_RANGE:g}, "
            f"since the squared pixel values overflow float32 above it; {fix}"
        )
    for name in ("C1", "C2"):
        value = getattr(cfg, name)
        if FLOAT32_MIN_C <= value <= FLOAT32_MAX_C:
            continue
        given = getattr(cfg, name.lower())
        k = name.replace("C", "k")
        what = (
            f"{name.lower()}={value:g}"
            if given is not None
            else f"{name} = ({k} * data_range)^2 = {value:g} ({k}={getattr(cfg, k):g}, data_range={cfg.data_range:g})"
        )
        raise ValueError(
            f"{what} is outside the range {dtype} input is computed in: {name} must be between "
            f"{FLOAT32_MIN_C:g} and {FLOAT32_MAX_C:g} in float32; {fix}"
        )


def reduce(per_image: torch.Tensor, reduction: str, unbatched: bool) -> torch.Tensor:
    """Reduce per-image values ``[B]`` over the batch; ``"none"`` drops the batch dim of an unbatched call."""
    if reduction == "mean":
        return per_image.mean()
    if reduction == "sum":
        return per_image.sum()
    return per_image[0] if unbatched else per_image
