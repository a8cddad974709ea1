"""Checkpoints: written atomically, and checked before a run or an evaluation uses one.

:class:`AtomicCheckpointIO` writes through a temporary file in the same folder, then
``os.replace``: a crash mid-write leaves the previous checkpoint intact and no partial file.

:func:`read_checkpoint` and :func:`check_checkpoint` open a checkpoint and compare it with the model
it is about to be loaded into, before anything is trained, rendered or written: a truncated or
foreign file, or one whose tensors do not fit the model (another spherical-harmonics degree),
stops with one ``ValueError`` that names the file and what differs.

(Lightning's own save goes through an fsspec transaction whose temporary file lives in the system
temp folder; moving it across file systems is a copy, not an atomic rename.)
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import zipfile
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from ..atomic import atomic_output

log = logging.getLogger(__name__)

__all__ = [
    "AtomicCheckpointIO",
    "save_atomic",
    "read_checkpoint",
    "check_checkpoint",
    "check_state_shapes",
    "require_file",
]


class _RecordingWriter(io.RawIOBase):
    """A file ``torch.save`` writes to that keeps the ``OSError`` a write raised: torch's archive
    writer reports a failed write (a full disk, a file-size limit) as a ``RuntimeError`` about
    positions, which says neither the file nor the reason."""

    def __init__(self, f):
        super().__init__()
        self._f = f
        self.error: Optional[OSError] = None

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        try:
            return self._f.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def tell(self) -> int:
        return self._f.tell()

    def flush(self) -> None:
        self._f.flush()


def save_atomic(obj: Any, path) -> None:
    """``torch.save(obj, path)`` through :func:`~splatloss.atomic.atomic_output`: a failed write
    leaves the previous file and no partial one, and raises the write's ``OSError`` (errno, and
    ``filename`` set to ``path``), never torch's ``RuntimeError`` for it."""
    path = os.fspath(path)
    try:
        with atomic_output(path) as tmp, open(tmp, "wb") as f:
            writer = _RecordingWriter(f)
            try:
                torch.save(obj, writer)
            except RuntimeError:
                if writer.error is None:
                    raise
                raise writer.error from None
            f.flush()
    except OSError as e:
        if e.errno is None or e.filename == path:
            raise
        raise OSError(e.errno, e.strerror, path) from None


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` with an atomic ``save_checkpoint`` (pass it as ``Trainer(plugins=[...])``).

    Args:
        rescue_dirs: folders, in order of preference, where a checkpoint goes when its own folder
            does not take it (a full disk, a folder made read-only or removed mid-run); the save
            then succeeds there, is logged as a warning and recorded in :attr:`rescued` as
            ``(wanted, written, reason)``. Empty: the error is raised.

    Examples:
        >>> import tempfile, os, torch
        >>> with tempfile.TemporaryDirectory() as d:
        ...     AtomicCheckpointIO().save_checkpoint({"w": torch.ones(2)}, os.path.join(d, "last.ckpt"))
        ...     sorted(os.listdir(d))
        ['last.ckpt']
    """

    def __init__(self, rescue_dirs: Sequence[str] = ()):
        super().__init__()
        self.rescue_dirs = list(rescue_dirs)
        self.rescued: List[Tuple[str, str, str]] = []

    def save_checkpoint(self, checkpoint: Dict[str, Any], path, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None:
            raise TypeError(
                f"AtomicCheckpointIO.save_checkpoint does not take storage_options, got {storage_options!r}"
            )
        try:
            save_atomic(checkpoint, path)
            return
        except OSError as e:
            if not self.rescue_dirs:
                raise
            error = e
        for folder in self.rescue_dirs:
            alt = os.path.join(folder, os.path.basename(os.fspath(path)))
            try:
                save_atomic(checkpoint, alt)
            except OSError:
                continue
            self.rescued = [r for r in self.rescued if r[0] != os.fspath(path)]
            self.rescued.append((os.fspath(path), alt, f"{type(error).__name__}: {error}"))
            log.warning("could not write the checkpoint %s (%s): wrote it to %s instead", path, error, alt)
            return
        raise error


# Parameters whose first dimension is the number of Gaussians, which densification changes: a
# checkpoint may hold any count (SplatModule.on_load_checkpoint resizes before loading).
_RESIZABLE_PREFIX = "gaussians."
_LOSS_PREFIX = "loss."


def require_file(path: Union[str, os.PathLike], what: str = "checkpoint") -> str:
    """``path`` as a string when it is a file; else a ``ValueError`` naming ``what``, the path and,
    for a folder, the file a run keeps there."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ValueError(
            f"{what} {path!r} is a folder, not a checkpoint file; name the file (in a run folder: "
            f"{os.path.join(path, 'checkpoints', 'last.ckpt')!r})"
        )
    if not os.path.isfile(path):
        raise ValueError(f"{what} {path!r} does not exist")
    return path


def read_checkpoint(path: Union[str, os.PathLike]) -> Dict[str, Any]:
    """Load a Lightning checkpoint on the CPU (tensors and plain containers only:
    ``torch.load(weights_only=True)``) and check that it is one.

    Raises:
        ValueError: the file is missing, unreadable or truncated, or is not a Lightning checkpoint
            (no ``state_dict`` / ``global_step``); the message names the file.
    """
    path = require_file(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as e:
        size = os.path.getsize(path)
        reason = " ".join([f"{type(e).__name__}:"] + str(e).splitlines()[:1]).rstrip(":")
        raise ValueError(
            f"checkpoint {path!r} ({size} bytes) cannot be read ({reason}): the file is truncated or not a "
            "checkpoint (an interrupted copy?); use another checkpoint"
        ) from None
    missing = [k for k in ("state_dict", "global_step") if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        got = sorted(ckpt)[:8] if isinstance(ckpt, dict) else type(ckpt).__name__
        raise ValueError(f"{path!r} is not a Lightning checkpoint: it has no {missing}, got {got}")
    return ckpt


def check_state_shapes(checkpoint: Dict[str, Any], module: torch.nn.Module, path: str = "the checkpoint") -> None:
    """Every tensor of ``module.state_dict()`` is in the checkpoint with the same shape (the
    Gaussians' count, their first dimension, may differ), and the checkpoint has no other.

    Raises:
        ValueError: naming ``path``, each key that is missing, unexpected or of another shape, and
            for the spherical-harmonics coefficients the degree each side has.
    """
    ours = module.state_dict()
    theirs = checkpoint["state_dict"]
    problems = []
    # The loss's own state (PhotometricLoss's weights) may be absent: checkpoints of versions whose
    # loss kept none record the weights beside it (SplatModule.on_load_checkpoint takes them from there).
    for key in sorted(set(ours) - set(theirs) - {k for k in ours if k.startswith(_LOSS_PREFIX)}):
        problems.append(f"{key} {tuple(ours[key].shape)} is missing from the checkpoint")
    for key in sorted(set(theirs) - set(ours)):
        problems.append(f"{key} {tuple(theirs[key].shape)} is in the checkpoint but not in the model")
    for key in sorted(set(ours) & set(theirs)):
        a, b = tuple(theirs[key].shape), tuple(ours[key].shape)
        same = a[1:] == b[1:] and len(a) == len(b) if key.startswith(_RESIZABLE_PREFIX) else a == b
        if not same:
            problems.append(f"{key} is {a} in the checkpoint, {b} in the model")
    if problems:
        hint = ""
        degree = _sh_degree(theirs)
        gaussians = getattr(module, "gaussians", None)
        if gaussians is not None and degree != getattr(gaussians, "sh_degree", degree):
            hint = f"; the checkpoint has spherical harmonics of degree {degree}, the model {gaussians.sh_degree}: "
            hint += f"set model.sh_degree={degree}"
        raise ValueError(f"checkpoint {path!r} does not fit the model: {'; '.join(problems)}{hint}")


def _sh_degree(state_dict: Dict[str, Any]) -> int:
    rest = state_dict.get(_RESIZABLE_PREFIX + "sh_rest")
    if rest is None:
        return 0
    return int(round((rest.shape[1] + 1) ** 0.5)) - 1  # (degree + 1)^2 - 1 coefficients


def check_checkpoint(path: Union[str, os.PathLike], module: Optional[torch.nn.Module] = None) -> Dict[str, Any]:
    """:func:`read_checkpoint`, then :func:`check_state_shapes` against ``module`` when given (a
    :class:`~splatloss.lightning.SplatModule` bound to its scene). Returns the checkpoint.

    Use it before anything is written: training (``train.py`` does) or evaluating a checkpoint.
    """
    ckpt = read_checkpoint(path)
    if module is not None:
        check_state_shapes(ckpt, module, os.fspath(path))
    return ckpt
