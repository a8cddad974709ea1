"""S3IM: stochastic structural similarity of a batch of rays (Xie et al., ICCV 2023).

NeRF-style training renders a random batch of ``N`` rays, not an image, so there are no
neighbourhoods for SSIM to compare. S3IM makes *virtual patches*: ``R`` copies of the batch (the
first in the given order, each further one randomly permuted) are concatenated and laid out as one
``(1, C, patch_height, R * N / patch_height)`` image, and SSIM with a small strided Gaussian window
compares the predicted and the target "image". Each SSIM window then mixes rays from all over the
scene, which is what gives the loss its non-local, structural signal.

The formula, exactly as the authors' code computes it (and as the float64 implementation in the
tests does):

1. ``idx = cat([arange(N), randperm(N), ..., randperm(N)])`` (``R`` blocks, each permutation drawn
   in turn by ``torch.randperm(N, generator=generator, device=pred.device)``), the same indices for
   prediction and target;
2. ``P = pred[idx].permute(1, 0).reshape(1, C, patch_height, -1)`` (likewise ``T`` from target);
3. a ``kernel_size x kernel_size`` Gaussian window, sigma 1.5, taps at offsets
   ``i - kernel_size // 2`` for ``i = 0 .. kernel_size - 1``, normalised to sum 1;
4. window means and population (co)variances by correlating with the window, zero padding
   ``(kernel_size - 1) // 2`` on every side and stride ``stride``;
5. ``SSIM = (2 mu_p mu_t + C1)(2 sigma_pt + C2) / ((mu_p^2 + mu_t^2 + C1)(sigma_p^2 + sigma_t^2 + C2))``
   with ``C1 = (k1 * data_range)^2``, ``C2 = (k2 * data_range)^2``; the value is the mean of the map.

Ray batches are small (thousands of rays), so this runs on plain torch ops and autograd, on any
device, with even kernels and strides as well as odd ones.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from .checks import FLOAT_DTYPES
from .config import K1, K2, without_autocast

__all__ = ["s3im", "s3im_with_config", "s3im_loss_with_config", "S3IMConfig", "s3im_window", "S3IM_SIGMA"]

#: Standard deviation of the S3IM window in pixels (the authors' value; not an option there either).
S3IM_SIGMA = 1.5


def _positive_int(name: str, value) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"{name} must be a positive integer, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return int(value)


def _positive_real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive real number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def _check_rays(pred, target) -> None:
    for name, t in (("pred", pred), ("target", target)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of ray colours, got {type(t).__name__}")
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"{name} must have a floating dtype (float16, bfloat16, float32 or float64), got {t.dtype}; "
                "convert integer colours with colours.float() / 255 and keep data_range=1.0"
            )
        if t.dim() != 2:
            raise ValueError(
                f"{name} must be an (N, C) batch of N ray colours with C channels, got shape {tuple(t.shape)}; "
                "flatten an image batch with img.permute(0, 2, 3, 1).reshape(-1, C)"
            )
    if pred.shape != target.shape:
        raise ValueError(f"pred and target must have the same shape, got {tuple(pred.shape)} and {tuple(target.shape)}")
    if pred.device != target.device:
        raise ValueError(f"pred and target must be on the same device, got {pred.device} and {target.device}")
    n, c = pred.shape
    if n == 0 or c == 0:
        raise ValueError(f"pred and target must hold at least one ray with at least one channel, got shape {(n, c)}")


def s3im_window(kernel_size: int, dtype: torch.dtype = torch.float64, device="cpu") -> torch.Tensor:
    """The 1-D S3IM window: ``exp(-(i - kernel_size // 2)^2 / (2 * 1.5^2))``, normalised to sum 1.

    Built in float64 and then cast; the 2-D window is its outer product.

    Examples:
        >>> s3im_window(4)
        tensor([0.1365, 0.2658, 0.3319, 0.2658], dtype=torch.float64)
    """
    offsets = torch.arange(kernel_size, dtype=torch.float64) - (kernel_size // 2)
    w = torch.exp(-(offsets * offsets) / (2.0 * S3IM_SIGMA * S3IM_SIGMA))
    return (w / w.sum()).to(dtype=dtype, device=device)


@dataclass(frozen=True)
class S3IMConfig:
    """S3IM settings, validated once (see :func:`s3im` for their meaning).

    Examples:
        >>> S3IMConfig().patch_height
        64
        >>> S3IMConfig(stride=0)
        Traceback (most recent call last):
        ...
        ValueError: stride must be a positive integer, got 0
    """

    kernel_size: int = 4
    stride: int = 4
    repeats: int = 10
    patch_height: int = 64
    data_range: float = 1.0
    k1: float = K1
    k2: float = K2

    def __post_init__(self):
        for name in ("kernel_size", "stride", "repeats", "patch_height"):
            object.__setattr__(self, name, _positive_int(name, getattr(self, name)))
        for name in ("data_range", "k1", "k2"):
            object.__setattr__(self, name, _positive_real(name, getattr(self, name)))

    @property
    def C1(self) -> float:
        """``(k1 * data_range) ** 2``."""
        return (self.k1 * self.data_range) ** 2

    @property
    def C2(self) -> float:
        """``(k2 * data_range) ** 2``."""
        return (self.k2 * self.data_range) ** 2


def s3im(
    pred: torch.Tensor,
    target: torch.Tensor,
    *,
    kernel_size: int = 4,
    stride: int = 4,
    repeats: int = 10,
    patch_height: int = 64,
    generator: Optional[torch.Generator] = None,
    data_range: float = 1.0,
    k1: float = K1,
    k2: float = K2,
) -> torch.Tensor:
    """Stochastic structural similarity of two ``(N, C)`` batches of ray colours (S3IM, Xie et al. 2023).

    ``repeats`` copies of the batch (the first in order, each further one permuted by
    ``torch.randperm(N, generator=generator, device=pred.device)``) form one virtual
    ``(1, C, patch_height, repeats * N / patch_height)`` image per input, compared by SSIM with a
    ``kernel_size x kernel_size`` Gaussian window (sigma 1.5), zero padding ``(kernel_size - 1) // 2``
    and stride ``stride``; the value is the mean of that SSIM map (see the module docstring for
    the formula). The loss the authors train with is ``1 - s3im`` (:class:`splatloss.S3IMLoss`).

    Args:
        pred, target: ``(N, C)`` float ray colours in ``[0, data_range]``, same shape and device.
        kernel_size: side of the square window (default 4, even sizes allowed).
        stride: stride of the window over the virtual image (default 4).
        repeats: number of copies ``R`` of the batch (default 10).
        patch_height: height of the virtual image; ``repeats * N`` must be a multiple of it.
        generator: the ``torch.Generator`` the permutations are drawn from (on ``pred``'s device);
            ``None`` uses torch's global generator.
        data_range, k1, k2: ``C1 = (k1 * data_range)^2``, ``C2 = (k2 * data_range)^2``.

    Returns:
        A 0-d tensor in the accumulation dtype (float32, or float64 for float64 inputs); gradients
        flow to both inputs through autograd.

    Examples:
        >>> g = torch.Generator().manual_seed(0)
        >>> rays = torch.rand(4096, 3, generator=g)
        >>> float(s3im(rays, rays, generator=g))
        1.0
        >>> value = s3im(rays, (rays + 0.1 * torch.randn(4096, 3, generator=g)).clamp(0, 1), generator=g)
        >>> 0.0 < float(value) < 1.0
        True
    """
    cfg = S3IMConfig(
        kernel_size=kernel_size,
        stride=stride,
        repeats=repeats,
        patch_height=patch_height,
        data_range=data_range,
        k1=k1,
        k2=k2,
    )
    return s3im_with_config(pred, target, cfg, generator=generator)


@without_autocast
def s3im_with_config(
    pred: torch.Tensor, target: torch.Tensor, cfg: S3IMConfig, generator: Optional[torch.Generator] = None
) -> torch.Tensor:
    """:func:`s3im` with settings already validated in an :class:`S3IMConfig` (what the modules call).

    Examples:
        >>> rays = torch.rand(640, 3)
        >>> float(s3im_with_config(rays, rays, S3IMConfig()))
        1.0
    """
    width = _check_s3im_call(pred, target, cfg, generator)
    lum, cs, d_lum, d_cs = _s3im_maps(pred, target, cfg, width, generator)
    return (lum * cs).mean()


@without_autocast
def s3im_loss_with_config(
    pred: torch.Tensor, target: torch.Tensor, cfg: S3IMConfig, generator: Optional[torch.Generator] = None
) -> torch.Tensor:
    """The S3IM loss ``1 - s3im`` with relative precision: the dissimilarity is formed directly, as
    ``(1 - l) + l (1 - cs)`` per window, never as one minus a number close to 1 (see :func:`_s3im_maps`).

    Examples:
        >>> rays = torch.rand(640, 3)
        >>> float(s3im_loss_with_config(rays, rays, S3IMConfig()))
        0.0
    """
    width = _check_s3im_call(pred, target, cfg, generator)
    lum, cs, d_lum, d_cs = _s3im_maps(pred, target, cfg, width, generator)
    return (d_lum + lum * d_cs).mean()


def _s3im_maps(pred, target, cfg: S3IMConfig, width: int, generator):
    """The S3IM window maps ``(l, cs, 1 - l, 1 - cs)``, each ``[1, C, H', W']``, the dissimilarities
    computed without subtracting from 1.

    With ``d = p - t``: ``1 - l = (mu_p - mu_t)^2 / (mu_p^2 + mu_t^2 + C1)`` and ``1 - cs = var(d) /
    (var_p + var_t + C2)``, ``cov = (var_p + var_t - var(d)) / 2``. The moments are taken of the
    virtual images shifted by their own mean (and ``d`` by its own), the zero padding shifted with
    them so each window still sees the same samples: variances do not change under a shift, and
    ``E[x'^2] - E[x']^2`` then does not cancel in float32 where the local variance is small against
    the squared mean (near-white colours, a prediction close to its target).
    """
    n, c = pred.shape
    kernel_size, stride, repeats, patch_height = cfg.kernel_size, cfg.stride, cfg.repeats, cfg.patch_height
    pad = (kernel_size - 1) // 2
    # 1-2. The virtual image: the same ray indices for prediction and target.
    blocks = [torch.arange(n, device=pred.device)]
    for _ in range(repeats - 1):
        blocks.append(torch.randperm(n, generator=generator, device=pred.device))
    idx = torch.cat(blocks)
    acc = torch.float64 if pred.dtype == torch.float64 or target.dtype == torch.float64 else torch.float32
    # cast, then gather: each ray's gradients from its repeats add up in the accumulation dtype and
    # the cast's backward rounds their sum to an fp16 / bf16 input's dtype once
    p = pred.to(acc)[idx].permute(1, 0).reshape(1, c, patch_height, width)
    t = target.to(acc)[idx].permute(1, 0).reshape(1, c, patch_height, width)

    # 3-4. Window statistics of the shifted, zero-padded virtual images (shifts are constants of
    # the computation: no gradient flows through them).
    p, t = F.pad(p, (pad, pad, pad, pad)), F.pad(t, (pad, pad, pad, pad))
    with torch.no_grad():
        shift = 0.5 * (p + t).mean(dim=(-2, -1), keepdim=True)  # [1, C, 1, 1]
        d_shift = (p - t).mean(dim=(-2, -1), keepdim=True)
    ps, ts = p - shift, t - shift
    ds = (p - t) - d_shift
    w1 = s3im_window(kernel_size, acc, pred.device)
    win = torch.outer(w1, w1).expand(c, 1, kernel_size, kernel_size)
    stacked = torch.cat([ps, ts, ds, ps * ps, ts * ts, ds * ds], dim=1)  # [1, 6C, H + 2 pad, W + 2 pad]
    mom = F.conv2d(stacked, win.repeat(6, 1, 1, 1), stride=stride, groups=6 * c)
    mp, mt, md, epp, ett, edd = mom.chunk(6, dim=1)
    var_p = epp - mp * mp
    var_t = ett - mt * mt
    var_d = (edd - md * md).clamp_min(0)  # a variance; rounding cannot make it negative
    diff = md + d_shift  # the window mean of p - t (the window sums to 1)
    mu_p, mu_t = mp + shift, mt + shift

    # 5. The maps.
    c1, c2 = cfg.C1, cfg.C2
    b1 = mu_p * mu_p + mu_t * mu_t + c1
    b2 = var_p + var_t + c2
    lum = (2 * mu_p * mu_t + c1) / b1
    cs = (var_p + var_t - var_d + c2) / b2
    return lum, cs, diff * diff / b1, var_d / b2


def _check_s3im_call(pred, target, cfg: S3IMConfig, generator) -> int:
    """The checks of an S3IM call; returns the virtual image's width."""
    _check_rays(pred, target)
    kernel_size, repeats, patch_height = cfg.kernel_size, cfg.repeats, cfg.patch_height
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        if generator.device.type != pred.device.type:
            raise ValueError(
                f"generator must be on the rays' device type ({pred.device.type}) for torch.randperm, got a "
                f"generator on {generator.device}; create it with torch.Generator(device=pred.device)"
            )
    n, c = pred.shape
    total = repeats * n
    if total % patch_height:
        raise ValueError(
            f"repeats * N = {repeats} * {n} = {total} rays must be a multiple of patch_height = {patch_height} "
            f"to lay them out as a (1, {c}, {patch_height}, repeats * N / patch_height) image; use a batch size "
            f"or patch_height that divides it (e.g. N a multiple of {patch_height // math.gcd(repeats, patch_height)})"
        )
    width = total // patch_height
    pad = (kernel_size - 1) // 2
    if patch_height + 2 * pad < kernel_size or width + 2 * pad < kernel_size:
        raise ValueError(
            f"the {kernel_size}x{kernel_size} S3IM window (zero padding {pad}) does not fit the virtual "
            f"{patch_height}x{width} image of repeats * N = {total} rays with patch_height = {patch_height}; "
            "use more rays or repeats, a different patch_height, or a smaller kernel_size"
        )
    return width
