"""Backend choice, in one place.

A backend is a module exposing, for already-validated ``(B, C, H, W)`` inputs of one float dtype
on one device (see docs/CONTRACT.md):

* ``ssim_map(img1, img2, cfg, return_cs=False)`` -> ``[B, C, H', W']`` (and the cs map);
* ``ssim_stats(img1, img2, cfg)`` -> ``(ssim_mean, cs_mean)``, each ``[B, C]``;
* optionally ``ms_ssim(img1, img2, cfg, weights)`` and a fused ``dssim_l1(img1, img2, cfg, lam)``.

Backends: ``"reference"`` (:mod:`splatloss.reference`, autograd through plain torch ops),
``"torch"`` (:mod:`splatloss.backends.torch_fused`, analytic forward and backward in torch ops, any
device), ``"triton"`` (:mod:`splatloss.backends.triton`, CUDA, or the CPU interpreter when
``TRITON_INTERPRET=1``) and ``"auto"`` (Triton on CUDA when importable, else ``"torch"``; never
Triton on CPU). Nothing here imports Triton until a Triton backend is asked for or probed.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Dict, Optional

import torch

__all__ = ["BACKENDS", "available", "resolve"]

BACKENDS = ("auto", "torch", "reference", "triton")

# Outcome of the one attempt to import the Triton backend: the module, or the reason it failed.
_triton_module: Optional[ModuleType] = None
_triton_error: Optional[str] = None
_triton_tried = False


def _load_triton() -> Optional[ModuleType]:
    """Import ``splatloss.backends.triton`` once; remember the module or why it failed."""
    global _triton_module, _triton_error, _triton_tried
    if not _triton_tried:
        _triton_tried = True
        try:
            mod = importlib.import_module("splatloss.backends.triton")
        except Exception as exc:  # ImportError, or triton failing to initialise
            _triton_error = f"importing splatloss.backends.triton failed ({type(exc).__name__}: {exc})"
        else:
            missing = [name for name in ("ssim_map", "ssim_stats") if not hasattr(mod, name)]
            if missing:
                _triton_error = f"splatloss.backends.triton does not provide {', '.join(missing)}"
            else:
                _triton_module = mod
    return _triton_module


def _load_torch() -> ModuleType:
    return importlib.import_module("splatloss.backends.torch_fused")


def _load_reference() -> ModuleType:
    return importlib.import_module("splatloss.reference")


def available() -> Dict[str, bool]:
    """Which backends can be imported here (Triton is probed, i.e. imported, on first call).

    ``"triton": True`` means the kernels import; on a CPU tensor they still only run when
    ``TRITON_INTERPRET=1``.

    Examples:
        >>> flags = available()
        >>> flags["torch"], flags["reference"]
        (True, True)
    """
    return {"reference": True, "torch": True, "triton": _load_triton() is not None}


def _triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _auto_wants_triton(img) -> bool:
    """Whether ``"auto"`` should try Triton for ``img``: CUDA tensors, except float64.

    The Triton kernels compute in float32 and refuse float64 input; the torch path computes float64
    in float64, so "auto" gives float64 users the precision they asked for instead of an error.
    Both paths equal ``reference`` to their dtype's round-off, so this is a choice, not a fallback
    to different numbers.
    """
    return img.device.type == "cuda" and img.dtype != torch.float64


def resolve(name: str, img: torch.Tensor) -> ModuleType:
    """The backend module for ``name`` able to run on ``img``'s device, or a ValueError saying why.

    Never falls back silently to a different backend: ``"triton"`` that cannot run is an error;
    only ``"auto"`` chooses, and it chooses Triton only for CUDA tensors that are not float64.

    Examples:
        >>> resolve("auto", torch.zeros(1)).__name__
        'splatloss.backends.torch_fused'
        >>> resolve("numba", torch.zeros(1))
        Traceback (most recent call last):
        ...
        ValueError: backend must be one of ('auto', 'torch', 'reference', 'triton'), got 'numba'
    """
    if not isinstance(name, str) or name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    if name == "reference":
        return _load_reference()
    if name == "torch":
        return _load_torch()
    on_cuda = img.device.type == "cuda"
    if name == "auto":
        if _auto_wants_triton(img):
            mod = _load_triton()
            if mod is not None:
                return mod
        return _load_torch()
    # name == "triton"
    if not on_cuda and not _triton_interpreted():
        raise ValueError(
            f"backend='triton' needs CUDA tensors, got a tensor on {img.device.type}; "
            "use backend='torch' (or 'auto'), or set TRITON_INTERPRET=1 before importing triton "
            "to run the kernels in the Triton interpreter on the CPU"
        )
    mod = _load_triton()
    if mod is None:
        raise ValueError(f"backend='triton' is not available: {_triton_error}; use backend='torch' or 'auto'")
    return mod
