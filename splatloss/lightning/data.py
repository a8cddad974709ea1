"""The scene as a LightningDataModule: one training view per step, held-out views for evaluation.

The training order is a function of the step alone (:class:`StepViewSampler`: a fresh seeded
permutation of the views every ``len(views)`` steps), and the training loader saves its position in
checkpoints (:class:`ResumableLoader`), so a run resumed from any checkpoint sees exactly the views
the uninterrupted run would have seen. One Lightning epoch is the whole run (``max_steps`` items).
"""

from __future__ import annotations

from typing import Callable, Iterator, Optional

import lightning as L
import torch
from torch.utils.data import DataLoader, Sampler

from ..splat.scenes import SceneData, ViewDataset

__all__ = ["StepViewSampler", "ResumableLoader", "SceneDataModule", "check_scene"]


def _one_view(item):
    return item  # batch_size=None: each item is one view (a dict of tensors)


class StepViewSampler(Sampler[int]):
    """Item ``i`` is the view trained on at step ``i``: a pure function of ``(seed, i)``.

    Steps are cut into blocks of ``n`` (one block = one pass over the views in a fresh seeded
    permutation, i.e. an epoch of views). With ``world_size`` processes, process ``rank`` takes
    position ``i * world_size + rank`` of that sequence, so the processes see different views at
    every step and together cover each block. Iteration starts at :attr:`start` (set when a run
    resumes), so the order never depends on where a run was interrupted.

    Examples:
        >>> s = StepViewSampler(4, total_steps=8, seed=0)
        >>> order = list(s)
        >>> sorted(order[:4]) == sorted(order[4:]) == [0, 1, 2, 3]
        True
        >>> s.start = 5
        >>> list(s) == order[5:]
        True
    """

    def __init__(self, n: int, total_steps: int, seed: int = 0, rank: int = 0, world_size: int = 1):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"StepViewSampler: n must be an integer >= 1, got {n!r}")
        if not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(f"StepViewSampler: total_steps must be an integer >= 1, got {total_steps!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"StepViewSampler: rank must be in [0, world_size={world_size}), got {rank}")
        self.n, self.total, self.seed, self.rank, self.world_size = n, total_steps, int(seed), rank, world_size
        self.start = 0
        self._perms: dict = {}

    def view_at(self, step: int) -> int:
        block, j = divmod(step * self.world_size + self.rank, self.n)
        if block not in self._perms:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + block)
            self._perms = {block: torch.randperm(self.n, generator=g).tolist()}
        return self._perms[block][j]

    def __iter__(self) -> Iterator[int]:
        start, self.start = self.start, 0  # a resumed position applies to one pass only
        return iter([self.view_at(i) for i in range(start, self.total)])

    def __len__(self) -> int:
        return self.total


class ResumableLoader(DataLoader):
    """A DataLoader Lightning can resume mid-run: its state is the position in the step sequence.

    The position saved is the trainer's ``global_step`` (steps completed), not a count of items
    fetched, which Lightning's one-batch prefetch would put one ahead.
    """

    def __init__(self, dataset, sampler: StepViewSampler, position_fn: Callable[[], int], num_workers: int = 0):
        # Its own generator: creating the iterator then draws no number from torch's global one
        # (which densification uses), so a resumed run's random stream is not shifted.
        super().__init__(
            dataset,
            batch_size=None,
            sampler=sampler,
            num_workers=num_workers,
            collate_fn=_one_view,
            generator=torch.Generator().manual_seed(sampler.seed),
        )
        self._position_fn = position_fn

    def state_dict(self) -> dict:
        return {"position": int(self._position_fn()), "seed": self.sampler.seed, "world_size": self.sampler.world_size}

    def load_state_dict(self, state: dict) -> None:
        if state.get("world_size", 1) != self.sampler.world_size:
            raise ValueError(
                f"the checkpoint was written by {state.get('world_size')} processes, this run has "
                f"{self.sampler.world_size}: the view order would not continue exactly"
            )
        self.sampler.start = int(state["position"])


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
                f"view {v.name!r} ({split}): image is {shape[0]}x{shape[1]} but the camera says {v.height}x{v.width}"
            )
        if shape != tuple(first.image.shape):
            raise ValueError(
                "all images must have the same size, got "
                f"{first.image.shape[0]}x{first.image.shape[1]} ({first_split} view {first.name!r}) and "
                f"{shape[0]}x{shape[1]} ({split} view {v.name!r})"
            )


class SceneDataModule(L.LightningDataModule):
    """Wraps a :class:`SceneData`: training views in the step-indexed order, held-out views in order.

    Args:
        scene: the scene, or a zero-argument callable building it (built and checked once, in
            :meth:`setup`).
        seed: seed of the view order.
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
        trainer = self.trainer
        if trainer is None or not isinstance(trainer.max_steps, int) or trainer.max_steps < 1:
            raise ValueError("SceneDataModule needs a Trainer with max_steps >= 1 (one item per training step)")
        sampler = StepViewSampler(len(ds), trainer.max_steps, self.seed, trainer.global_rank, trainer.world_size)
        return ResumableLoader(ds, sampler, lambda: self.trainer.global_step, self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(
            ViewDataset(self.scene.test),
            batch_size=None,
            shuffle=False,
            num_workers=self.num_workers,
            collate_fn=_one_view,
            generator=torch.Generator().manual_seed(self.seed),
        )
