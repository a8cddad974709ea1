"""Checkpoints written atomically on the local file system: a temporary file in the same folder,
then ``os.replace``. A crash mid-write leaves the previous checkpoint intact and no partial file.

(Lightning's own save goes through an fsspec transaction whose temporary file lives in the system
temp folder; moving it across file systems is a copy, not an atomic rename.)
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from .._atomic import atomic_output

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
        with atomic_output(path) as tmp:
            torch.save(checkpoint, tmp)
