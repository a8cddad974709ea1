"""Backend choice, in one place.

Every backend implements the contract of :class:`splatloss.backends.base.Backend` (``ssim_map``,
``ssim_stats``, ``ms_ssim``, ``dssim_l1``, ``ssim_mean_and_grad``) for already-validated
``(B, C, H, W)`` inputs. By name:

* ``"reference"``: :mod:`splatloss.reference`, plain torch ops and autograd, the oracle;
* ``"torch"``: :mod:`splatloss.backends.torch_fused`, an analytic forward and backward in torch ops,
  on any device; never the C kernel;
* ``"cpu"``: :mod:`splatloss.backends.cpu`, a C kernel compiled at first use (CPU tensors);
* ``"triton"``: :mod:`splatloss.backends.triton`, CUDA, or the CPU interpreter when
  ``TRITON_INTERPRET=1`` was set before Triton was imported;
* ``"auto"``: Triton for CUDA tensors (not float64), ``"cpu"`` for CPU tensors when the kernel
  compiled (else ``"torch"``, with one warning), ``"torch"`` elsewhere (MPS, XPU).
  :func:`explain` says which one and why.

Nothing here imports Triton until a Triton backend is asked for or probed.
"""

from __future__ import annotations

import importlib
import os
import warnings
from typing import Dict, Optional

import torch

from ..checks import BACKENDS, check_backend
from . import cpu as _cpu
from . import reference as _reference
from . import torch_fused as _torch
from .base import Backend, compile_time_constant

__all__ = ["NAMES", "BACKENDS", "Backend", "get", "resolve", "explain", "available"]

NAMES = BACKENDS[1:]

# Outcome of the one attempt to import the Triton backend: the backend object, or why it failed.
_triton_backend: Optional[Backend] = None
_triton_error: Optional[str] = None
_triton_tried = False
_warned_no_cpu_kernel = False


def _load_triton() -> bool:
    """Import ``splatloss.backends.triton`` once; remember its backend object or why it failed."""
    global _triton_backend, _triton_error, _triton_tried
    if not _triton_tried:
        _triton_tried = True
        try:
            mod = importlib.import_module("splatloss.backends.triton")  # optional: imported on first use only
        except Exception as exc:  # ImportError, or triton failing to initialise
            _triton_error = f"importing splatloss.backends.triton failed ({type(exc).__name__}: {exc})"
        else:
            _triton_backend = mod.BACKEND
    return _triton_backend is not None


# Under torch.compile the import happens once at trace time and its outcome is a constant.
_load_triton_constant = compile_time_constant(_load_triton)


def _triton_loaded() -> bool:
    return _load_triton_constant() if torch.compiler.is_compiling() else _load_triton()


def _cpu_for_auto() -> bool:
    """Whether "auto" runs the C kernel on CPU tensors; warns once when it cannot."""
    global _warned_no_cpu_kernel
    ok = _cpu.available()
    if not ok and not _warned_no_cpu_kernel:
        _warned_no_cpu_kernel = True
        warnings.warn(
            f"splatloss: the C kernel of backend='cpu' is unavailable ({_cpu.why_unavailable()}); "
            "backend='auto' runs backend='torch' on CPU tensors, the same values but several times slower",
            RuntimeWarning,
            stacklevel=4,
        )
    return ok


_cpu_for_auto_constant = compile_time_constant(_cpu_for_auto)


def _auto_cpu() -> bool:
    return _cpu_for_auto_constant() if torch.compiler.is_compiling() else _cpu_for_auto()


def _triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def get(name: str) -> Backend:
    """The backend object called ``name`` (one of :data:`NAMES`), or a ValueError saying why it
    cannot load here and what to do instead.

    Examples:
        >>> get("torch").name
        'torch'
    """
    if name == "auto":
        raise ValueError(
            f"get() takes a backend name from {NAMES}, got 'auto'; use resolve('auto', img) to let splatloss "
            "choose for a tensor"
        )
    check_backend(name)
    if name == "reference":
        return _reference.BACKEND
    if name == "torch":
        return _torch.BACKEND
    if name == "cpu":
        if not _cpu.available():
            raise ValueError(f"backend='cpu' is not available: {_cpu.why_unavailable()}")
        return _cpu.BACKEND
    if not _triton_loaded():
        raise ValueError(f"backend='triton' is not available: {_triton_error}; use backend='torch' or 'auto'")
    return _triton_backend


def _auto_wants_triton(img) -> bool:
    """Whether ``"auto"`` should try Triton for ``img``: CUDA tensors, except float64.

    The Triton kernels compute in float32 and refuse float64 input; the torch path computes float64
    in float64, so "auto" gives float64 users the precision they asked for instead of an error.
    Both paths equal ``reference`` to their dtype's round-off, so this is a choice, not a fallback
    to different numbers.
    """
    return img.device.type == "cuda" and img.dtype != torch.float64


def _auto(img: torch.Tensor) -> str:
    if _auto_wants_triton(img) and _triton_loaded():
        return "triton"
    if img.device.type == "cpu" and _auto_cpu():
        return "cpu"
    return "torch"


def resolve(name: str, img: torch.Tensor) -> Backend:
    """The backend object for ``name`` able to run on ``img``'s device, or a ValueError saying why.

    Never falls back silently to a different backend: ``"cpu"`` or ``"triton"`` that cannot run is
    an error; only ``"auto"`` chooses (see :func:`explain`).

    Examples:
        >>> resolve("torch", torch.zeros(1)).name
        'torch'
        >>> resolve("numba", torch.zeros(1))
        Traceback (most recent call last):
        ...
        ValueError: backend must be one of ('auto', 'reference', 'torch', 'cpu', 'triton'), got 'numba'
    """
    check_backend(name)
    if name == "auto":
        return get(_auto(img))
    if name == "cpu" and img.device.type != "cpu":
        raise ValueError(
            f"backend='cpu' runs the C kernel on CPU tensors, got a tensor on {img.device.type}; "
            "use backend='auto' or 'torch' (or move the tensors to the CPU)"
        )
    if name == "triton" and img.device.type != "cuda" and not _triton_interpreted():
        raise ValueError(
            f"backend='triton' needs CUDA tensors, got a tensor on {img.device.type}; "
            "use backend='torch' (or 'auto'), or set TRITON_INTERPRET=1 before importing triton "
            "to run the kernels in the Triton interpreter on the CPU"
        )
    return get(name)


def explain(img: torch.Tensor) -> str:
    """Which backend ``"auto"`` picks for ``img``, and why.

    Examples:
        >>> explain(torch.zeros(1, 1, 8, 8, dtype=torch.float64)).split(":")[0]
        "auto -> 'cpu' for a float64 tensor on cpu"
    """
    name = _auto(img)
    head = f"auto -> {name!r} for a {str(img.dtype).replace('torch.', '')} tensor on {img.device.type}"
    dev = img.device.type
    if name == "triton":
        why = "CUDA tensors run the fused Triton kernels"
    elif name == "cpu":
        why = "CPU tensors run the compiled C kernel"
    elif dev == "cuda" and img.dtype == torch.float64:
        why = "the Triton kernels compute in float32, so float64 stays on the torch ops (computed in float64)"
    elif dev == "cuda":
        why = f"Triton is unavailable ({_triton_error}), so the torch ops run"
    elif dev == "cpu":
        why = f"the C kernel is unavailable ({_cpu.why_unavailable()}), so the torch ops run"
    else:
        why = f"{dev} tensors run the torch ops (the C kernel is CPU-only, Triton CUDA-only)"
    return f"{head}: {why}"


def available() -> Dict[str, bool]:
    """Which backends can run here (the C kernel is built and Triton imported on the first call).

    ``"triton": True`` means the kernels import; on a CPU tensor they still only run when
    ``TRITON_INTERPRET=1``.

    Examples:
        >>> flags = available()
        >>> flags["torch"], flags["reference"]
        (True, True)
    """
    return {"reference": True, "torch": True, "cpu": _cpu.available(), "triton": _load_triton()}
