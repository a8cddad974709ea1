"""Checkpoints written atomically on the local file system: a temporary file in the same folder,
then ``os.replace``. A crash mid-write leaves the previous checkpoint intact and no partial file.

(Lightning's own save goes through an fsspec transaction whose temporary file lives in the system
temp folder; moving it across file systems is a copy, not an atomic rename.)
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, Optional

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

__all__ = ["AtomicCheckpointIO"]


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` with an atomic ``save_checkpoint`` (pass it as ``Trainer(plugins=[...])``).

    Examples:
        >>> import tempfile, os, torch
        >>> with tempfile.TemporaryDirectory() as d:
        ...     AtomicCheckpointIO().save_checkpoint({"w": torch.ones(2)}, os.path.join(d, "last.ckpt"))
        ...     sorted(os.listdir(d))
        ['last.ckpt']
    """

    def save_checkpoint(self, checkpoint: Dict[str, Any], path, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None:
            raise TypeError(
                f"AtomicCheckpointIO.save_checkpoint does not take storage_options, got {storage_options!r}"
            )
        path = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".ckpt")
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            mask = os.umask(0)
            os.umask(mask)
            os.chmod(tmp, 0o666 & ~mask)  # mkstemp makes 0600; give the file the usual mode
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
