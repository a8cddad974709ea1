"""The scene as a LightningDataModule: one training view per step, held-out views for evaluation.

The training order is a fresh permutation of the training views every epoch, drawn from
``seed + epoch`` alone (:class:`EpochPermutationSampler`), so a run resumed from an end-of-epoch
checkpoint sees exactly the views the uninterrupted run would have seen.
"""

from __future__ import annotations

from typing import Callable, Iterator, Optional

import lightning as L
import torch
from torch.utils.data import DataLoader, Sampler

from ..splat.scenes import SceneData, ViewDataset

__all__ = ["EpochPermutationSampler", "SceneDataModule", "check_scene"]


class EpochPermutationSampler(Sampler[int]):
    """A permutation of ``range(n)`` that depends only on ``seed`` and the epoch.

    Lightning calls :meth:`set_epoch` before every training epoch (as it does for
    ``DistributedSampler``), so the order never depends on how many epochs this process ran.
    """

    def __init__(self, n: int, seed: int = 0):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"EpochPermutationSampler: n must be an integer >= 1, got {n!r}")
        self.n, self.seed, self.epoch = n, int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self) -> int:
        return self.n


def check_scene(scene: SceneData) -> None:
    """Stop before training on a scene the pipeline cannot use, saying what is wrong.

    Raises:
        ValueError: no training or no held-out views, or images of different sizes (the renderer
            and the batched metrics need one size), or an image that is not ``[H, W, 3]``.
    """
    if not isinstance(scene, SceneData):
        raise TypeError(f"data must build a splatloss.splat.scenes.SceneData, got {type(scene).__name__}")
    if not scene.train:
        raise ValueError("the scene has no training views: expected at least 1, got 0")
    if not scene.test:
        raise ValueError("the scene has no held-out (test) views: expected at least 1, got 0")
    views = [("train", v) for v in scene.train] + [("test", v) for v in scene.test]
    first_split, first = views[0]
    for split, v in views:
        shape = tuple(v.image.shape)
        if len(shape) != 3 or shape[2] != 3:
            raise ValueError(f"view {v.name!r} ({split}): image must be [H, W, 3], got {shape}")
        if shape[:2] != (v.height, v.width):
            raise ValueError(
                f"view {v.name!r} ({split}): image is {shape[0]}x{shape[1]} but the camera says "
                f"{v.height}x{v.width}"
            )
        if shape != tuple(first.image.shape):
            raise ValueError(
                "all images must have the same size, got "
                f"{first.image.shape[0]}x{first.image.shape[1]} ({first_split} view {first.name!r}) and "
                f"{shape[0]}x{shape[1]} ({split} view {v.name!r})"
            )


def _one_view(item):
    return item


class SceneDataModule(L.LightningDataModule):
    """Wraps a :class:`SceneData`: shuffled training views, held-out views in order.

    Args:
        scene: the scene, or a zero-argument callable building it (Hydra passes a partial so
            the scene is built once, in :meth:`setup`... or eagerly when already built).
        seed: seed of the per-epoch view order.
        num_workers: DataLoader workers (0: the views are tensors already in memory).
    """

    def __init__(self, scene: SceneData | Callable[[], SceneData], seed: int = 0, num_workers: int = 0):
        super().__init__()
        self._scene_or_builder = scene
        self._scene: Optional[SceneData] = scene if isinstance(scene, SceneData) else None
        self.seed = seed
        self.num_workers = num_workers

    @property
    def scene(self) -> SceneData:
        if self._scene is None:
            self._scene = self._scene_or_builder()
            check_scene(self._scene)
        return self._scene

    def setup(self, stage: str) -> None:
        self.scene  # noqa: B018 - build (and check) once

    def train_dataloader(self) -> DataLoader:
        ds = ViewDataset(self.scene.train)
        return DataLoader(
            ds,
            batch_size=None,  # one camera per step: items are single views
            sampler=EpochPermutationSampler(len(ds), self.seed),
            num_workers=self.num_workers,
            collate_fn=_one_view,
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(ViewDataset(self.scene.test), batch_size=None, shuffle=False,
                          num_workers=self.num_workers, collate_fn=_one_view)
