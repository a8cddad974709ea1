"""Validated SSIM configuration: window, constants and padding, checked once; the accumulation dtype.

Every backend receives an :class:`SSIMConfig` that has already passed validation, so kernels never
re-check user input. Hydra can build it through ``_target_: splatloss.config.SSIMConfig``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import torch

__all__ = [
    "SSIMConfig",
    "K1",
    "K2",
    "MS_SSIM_WEIGHTS",
    "PADDINGS",
    "WINDOWS",
    "OPTIONS",
    "min_size",
    "accumulation_dtype",
    "to_accumulation_dtype",
    "resolve",
    "takes_options",
    "without_autocast",
]

#: The SSIM stability constants' factors of Wang et al. 2004, ``C1 = (K1 * data_range)^2`` and
#: ``C2 = (K2 * data_range)^2``: the defaults of every SSIM, MS-SSIM and S3IM option ``k1`` / ``k2``.
K1 = 0.01
K2 = 0.03

#: Wang, Simoncelli & Bovik 2003 (and TF ``ssim_multiscale``) power factors, finest scale first.
MS_SSIM_WEIGHTS = (0.0448, 0.2856, 0.3001, 0.2363, 0.1333)

#: "valid": no padding, the map shrinks by ``window_size - 1`` (skimage, TF, pytorch-msssim);
#: "same": zero padding (3DGS reference, fused-ssim); "reflect": mirror padding without repeating
#: the edge sample (``torch.nn.functional.pad(mode="reflect")``, numpy "reflect", scipy "mirror").
PADDINGS = ("valid", "same", "reflect")

#: Smallest Gaussian sigma accepted: ``2 * sigma**2`` must stay a positive float64 (it underflows to
#: 0 below about 1e-162, making the window 0 / 0). Far below it the window is one tap anyway.
SIGMA_MIN = 1e-150
WINDOWS = ("gaussian", "uniform")


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 input, float32 for everything else (fp16, bf16, fp32).

    Every backend computes in this dtype and returns its values in it.

    Examples:
        >>> accumulation_dtype(torch.float16), accumulation_dtype(torch.float64)
        (torch.float32, torch.float64)
    """
    return torch.float64 if dtype == torch.float64 else torch.float32


def to_accumulation_dtype(t: torch.Tensor) -> torch.Tensor:
    """``t`` in its accumulation dtype (itself when already there; non-float tensors unchanged).

    A composition of several differentiable pieces (the scales of MS-SSIM, the L1 and SSIM terms
    of a loss) casts its fp16 / bf16 inputs once, first: the pieces' gradients then add up in
    float32 and the cast's backward rounds their sum to the input dtype once, instead of each piece
    rounding its share and the sum rounding again.

    Examples:
        >>> to_accumulation_dtype(torch.ones(2, dtype=torch.bfloat16)).dtype
        torch.float32
    """
    return t.to(accumulation_dtype(t.dtype)) if t.is_floating_point() else t


#: The device types whose ``torch.autocast`` region :func:`without_autocast` leaves.
_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps")


#: Whether any device's autocast is on (one query; a torch without it asks device by device).
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


def without_autocast(fn: Callable) -> Callable:
    """``fn`` run with every active ``torch.autocast`` region switched off.

    Autocast would run the filters (convolutions, matrix products) in float16 / bfloat16, against
    the accumulation dtype every backend promises: under autocast a call computes what it computes
    without (half-precision inputs are read as they are and accumulated in float32). The backward
    ops autograd records then run in that precision too.

    Examples:
        >>> f = without_autocast(lambda a, b: a @ b)
        >>> with torch.autocast("cpu", dtype=torch.bfloat16):
        ...     f(torch.ones(2, 2), torch.ones(2, 2)).dtype
        torch.float32
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not _any_autocast():  # one query where none is on (a training loop's every call)
            return fn(*args, **kwargs)
        active = [d for d in _AUTOCAST_DEVICES if torch.is_autocast_enabled(d)]
        if not active:
            return fn(*args, **kwargs)
        with contextlib.ExitStack() as stack:
            for d in active:
                stack.enter_context(torch.autocast(d, enabled=False))
            return fn(*args, **kwargs)

    return wrapper


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _positive_float(name: str, value) -> float:
    if not _is_real(value):
        raise TypeError(f"{name} must be a positive real number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return value


@dataclass(frozen=True)
class SSIMConfig:
    """SSIM settings shared by every backend.

    Args:
        window_size: side of the square window, odd and >= 3 (default 11).
        sigma: standard deviation of the Gaussian window in pixels, >= 1e-150 (default 1.5).
            Ignored by the uniform window.
        window: ``"gaussian"`` (normalised to sum 1) or ``"uniform"`` (box of equal taps).
        k1, k2: stability constants, ``C1 = (k1 * data_range) ** 2``, ``C2 = (k2 * data_range) ** 2``.
        c1, c2: give ``C1`` / ``C2`` directly (overrides ``k1`` / ``k2``), > 0.
        data_range: dynamic range of the images (1.0 for images in [0, 1]; never 255 by default).
        padding: ``"valid"`` | ``"same"`` (zeros) | ``"reflect"`` (mirror, edge not repeated).

    Examples:
        >>> cfg = SSIMConfig()
        >>> cfg.C1, round(cfg.C2, 10)
        (0.0001, 0.0009)
        >>> w = cfg.window_1d(torch.float64, "cpu")
        >>> w.shape, round(float(w.sum()), 12)
        (torch.Size([11]), 1.0)
        >>> SSIMConfig(window_size=10)
        Traceback (most recent call last):
        ...
        ValueError: window_size must be an odd integer >= 3, got 10
    """

    window_size: int = 11
    sigma: float = 1.5
    window: str = "gaussian"
    k1: float = K1
    k2: float = K2
    c1: Optional[float] = None
    c2: Optional[float] = None
    data_range: float = 1.0
    padding: str = "valid"

    def __post_init__(self):
        ws = self.window_size
        if not isinstance(ws, numbers.Integral) or isinstance(ws, bool):
            raise TypeError(f"window_size must be an odd integer >= 3, got {ws!r} ({type(ws).__name__})")
        if ws < 3 or ws % 2 == 0:
            raise ValueError(f"window_size must be an odd integer >= 3, got {ws}")
        object.__setattr__(self, "window_size", int(ws))
        object.__setattr__(self, "sigma", _positive_float("sigma", self.sigma))
        if self.sigma < SIGMA_MIN:
            raise ValueError(
                f"sigma must be at least {SIGMA_MIN:g} (below about 1e-162, 2 * sigma**2 underflows to 0 in "
                f"float64 and the Gaussian window is NaN), got {self.sigma!r}; a sigma below 0.3 makes a window "
                "of nearly one tap, where float32 gradients lose digits (up to 1e-4 off float64): pass float64 "
                "images for windows that narrow"
            )
        if not isinstance(self.window, str) or self.window not in WINDOWS:
            raise ValueError(f"window must be one of {WINDOWS}, got {self.window!r}")
        object.__setattr__(self, "k1", _positive_float("k1", self.k1))
        object.__setattr__(self, "k2", _positive_float("k2", self.k2))
        if self.c1 is not None:
            object.__setattr__(self, "c1", _positive_float("c1", self.c1))
        if self.c2 is not None:
            object.__setattr__(self, "c2", _positive_float("c2", self.c2))
        object.__setattr__(self, "data_range", _positive_float("data_range", self.data_range))
        if not isinstance(self.padding, str) or self.padding not in PADDINGS:
            raise ValueError(f"padding must be one of {PADDINGS}, got {self.padding!r}")

    @property
    def C1(self) -> float:
        """Luminance constant: ``c1`` if given, else ``(k1 * data_range) ** 2``."""
        return self.c1 if self.c1 is not None else (self.k1 * self.data_range) ** 2

    @property
    def C2(self) -> float:
        """Contrast-structure constant: ``c2`` if given, else ``(k2 * data_range) ** 2``."""
        return self.c2 if self.c2 is not None else (self.k2 * self.data_range) ** 2

    @property
    def pad(self) -> int:
        """Half window: the border each side loses with "valid" or gains by padding."""
        return self.window_size // 2

    def window_1d(self, dtype: torch.dtype = torch.float32, device="cpu") -> torch.Tensor:
        """1-D window of ``window_size`` taps summing to 1; the 2-D window is its outer product.

        The Gaussian taps are ``exp(-(i - r)^2 / (2 sigma^2))`` for ``i = 0..window_size-1``,
        ``r = window_size // 2``, normalised in float64 and then cast (as scipy's
        ``gaussian_filter`` with ``truncate`` giving the same radius, and TF's ``_fspecial_gauss``).
        """
        n = self.window_size
        if self.window == "uniform":
            w = torch.full((n,), 1.0 / n, dtype=torch.float64)
        else:
            x = torch.arange(n, dtype=torch.float64) - (n // 2)
            w = torch.exp(-(x * x) / (2.0 * self.sigma * self.sigma))
            w = w / w.sum()
        return w.to(dtype=dtype, device=device)

    def min_size(self) -> int:
        """Smallest image side this configuration can filter (see :func:`min_size`)."""
        return min_size(self.window_size, self.padding)


def min_size(window_size: int, padding: str) -> int:
    """Smallest image side (H or W) that one SSIM evaluation accepts.

    "valid" needs the whole window inside the image; "reflect" needs the mirrored border
    (``window_size // 2``) to exist, so a side of at least ``window_size // 2 + 1``; "same" (zero
    padding) accepts any side >= 1.
    """
    if padding == "valid":
        return window_size
    if padding == "reflect":
        return window_size // 2 + 1
    return 1


#: The SSIM options (the :class:`SSIMConfig` fields), in order: every function, loss module and
#: backend takes exactly these, either as keywords or as one ``config=SSIMConfig(...)``.
OPTIONS = tuple(f.name for f in dataclasses.fields(SSIMConfig))


def resolve(config: Optional[SSIMConfig] = None, options: Optional[Mapping[str, Any]] = None) -> SSIMConfig:
    """The one validated :class:`SSIMConfig` for a call: ``config`` (default: ``SSIMConfig()``) with
    the keyword ``options`` given beside it replacing its fields.

    Examples:
        >>> resolve(None, {"padding": "same"}).padding
        'same'
        >>> resolve(SSIMConfig(window_size=7), {"padding": "same"}).window_size
        7
        >>> resolve(None, {"win_size": 7})
        Traceback (most recent call last):
        ...
        TypeError: unexpected keyword argument 'win_size'; the SSIM options are data_range, window_size, sigma, \
window, k1, k2, c1, c2, padding (or config=SSIMConfig(...))
    """
    options = options or {}
    for key in options:
        if key not in OPTIONS:
            raise TypeError(
                f"unexpected keyword argument {key!r}; the SSIM options are "
                f"{', '.join(OPTION_ORDER)} (or config=SSIMConfig(...))"
            )
    if config is None:
        if all(type(v) in _PLAIN for v in options.values()):
            # a loss called with the same keywords step after step: validated once (the config is
            # frozen); the types are part of the key, so 1 and True stay apart
            return _validated(tuple((k, type(v), v) for k, v in sorted(options.items())))
        return SSIMConfig(**options)
    if not isinstance(config, SSIMConfig):
        raise TypeError(f"config must be a splatloss.SSIMConfig or None, got {type(config).__name__}")
    return dataclasses.replace(config, **options) if options else config


#: Option values whose validated config :func:`resolve` keeps (immutable, compared by value).
_PLAIN = (int, float, str, bool, type(None))


@functools.lru_cache(maxsize=256)
def _validated(items: tuple) -> SSIMConfig:
    return SSIMConfig(**{k: v for k, _, v in items})


#: The options in the order the documentation and error messages list them (users think of
#: ``data_range`` first).
OPTION_ORDER = ("data_range",) + tuple(name for name in OPTIONS if name != "data_range")


def takes_options(fn: Callable) -> Callable:
    """Give ``fn(..., config=None, **options)`` the signature that ``help()`` and ``inspect`` show:
    each SSIM option as a keyword-only parameter with its default, before ``config``.

    The options themselves are declared once, as the fields of :class:`SSIMConfig`; ``fn`` builds its
    configuration with :func:`resolve`.
    """
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    fields = {f.name: f for f in dataclasses.fields(SSIMConfig)}
    extra = [
        inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, default=fields[name].default, annotation=fields[name].type
        )
        for name in OPTION_ORDER
    ]
    at = next((i for i, p in enumerate(params) if p.name == "config"), len(params))
    fn.__signature__ = sig.replace(parameters=params[:at] + extra + params[at:])
    return fn
