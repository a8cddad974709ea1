"""The data side of the pipeline: per-epoch view order, scene checks, schedules, MS-SSIM scales."""

import pytest
import torch

from splatloss.lightning.callbacks import LossTerms, interpolate_schedule, ms_ssim_weights_for
from splatloss.lightning.data import ResumableLoader, SceneDataModule, StepViewSampler, check_scene
from splatloss.splat.scenes import SceneData, View


def _view(h, w, name):
    return View(image=torch.rand(h, w, 3), viewmat=torch.eye(4), K=torch.eye(3), width=w, height=h, name=name)


def _scene(train_sizes, test_sizes):
    return SceneData(
        train=[_view(h, w, f"train_{i}") for i, (h, w) in enumerate(train_sizes)],
        test=[_view(h, w, f"test_{i}") for i, (h, w) in enumerate(test_sizes)],
        points=torch.rand(10, 3),
        colors=torch.rand(10, 3),
        extent=1.0,
    )


def test_view_order_is_a_function_of_the_step():
    s = StepViewSampler(5, total_steps=23, seed=3)
    order = list(s)
    assert len(order) == 23
    for block in range(4):  # every block of 5 steps is one pass over the views
        assert sorted(order[5 * block : 5 * block + 5]) == [0, 1, 2, 3, 4]
    assert order[:5] != order[5:10]
    assert [s.view_at(i) for i in range(23)] == order
    # A resumed run starts mid-sequence and continues the same order; the next pass starts over.
    r = StepViewSampler(5, total_steps=23, seed=3)
    r.start = 13
    assert list(r) == order[13:]
    assert list(r) == order
    assert list(StepViewSampler(5, total_steps=23, seed=4)) != order
    with pytest.raises(ValueError, match="n must be an integer >= 1, got 0"):
        StepViewSampler(0, 10)
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size=2\), got 2"):
        StepViewSampler(4, 10, rank=2, world_size=2)


def test_ranks_split_each_step_between_processes():
    n, steps = 6, 9
    single = list(StepViewSampler(n, total_steps=2 * steps, seed=1))
    r0 = list(StepViewSampler(n, steps, seed=1, rank=0, world_size=2))
    r1 = list(StepViewSampler(n, steps, seed=1, rank=1, world_size=2))
    # Step i of rank r is position 2 i + r of the single-process sequence: different views per step.
    assert [v for pair in zip(r0, r1) for v in pair] == single
    assert all(a != b for a, b in zip(r0, r1))


def test_resumable_loader_state_is_the_step_position():
    scene = _scene([(8, 8)] * 4, [(8, 8)])
    from splatloss.splat.scenes import ViewDataset

    position = {"step": 0}
    sampler = StepViewSampler(4, total_steps=10, seed=0)
    loader = ResumableLoader(ViewDataset(scene.train), sampler, lambda: position["step"])
    full = [int(item["index"]) for item in loader]
    position["step"] = 6  # Lightning saves the loader state after step 6 completed
    state = loader.state_dict()
    assert state["position"] == 6
    fresh = ResumableLoader(ViewDataset(scene.train), StepViewSampler(4, total_steps=10, seed=0), lambda: 0)
    fresh.load_state_dict(state)
    assert [int(item["index"]) for item in fresh] == full[6:]
    other = ResumableLoader(ViewDataset(scene.train), StepViewSampler(4, 10, 0, rank=0, world_size=2), lambda: 0)
    with pytest.raises(ValueError, match="written by 1 processes, this run has 2"):
        other.load_state_dict(state)


def test_check_scene_rejects_mismatched_sizes_between_splits():
    with pytest.raises(
        ValueError,
        match=r"all images must have the same size, got 16x16 \(train view 'train_0'\) "
        r"and 16x20 \(test view 'test_1'\)",
    ):
        check_scene(_scene([(16, 16)] * 2, [(16, 16), (16, 20)]))


def test_check_scene_rejects_missing_views_and_bad_cameras():
    with pytest.raises(ValueError, match="no held-out \\(test\\) views: expected at least 1, got 0"):
        check_scene(_scene([(8, 8)], []))
    with pytest.raises(ValueError, match="no training views"):
        check_scene(_scene([], [(8, 8)]))
    scene = _scene([(8, 8)], [(8, 8)])
    scene.train[0].width = 9
    with pytest.raises(ValueError, match="image is 8x8 but the camera says 8x9"):
        check_scene(scene)
    with pytest.raises(TypeError, match="must build a splatloss.splat.scenes.SceneData, got dict"):
        check_scene({})


def test_datamodule_loaders():
    scene = _scene([(8, 8)] * 5, [(8, 8)] * 2)
    dm = SceneDataModule(scene, seed=1)
    dm.setup("fit")
    with pytest.raises(ValueError, match="needs a Trainer with max_steps >= 1"):
        dm.train_dataloader()
    val = list(dm.val_dataloader())
    assert [int(it["index"]) for it in val] == [0, 1]
    assert val[0]["image"].shape == (8, 8, 3)  # one view per item, no batch dimension


def test_schedule_interpolation_and_validation():
    pts = [(0, 0.0), (100, 0.2), (200, 0.1)]
    assert interpolate_schedule(pts, -5) == 0.0
    assert interpolate_schedule(pts, 150) == pytest.approx(0.15)
    assert interpolate_schedule(pts, 10_000) == 0.1
    with pytest.raises(ValueError, match="schedule for 'dssim': weights must be finite and >= 0, got -0.5"):
        LossTerms(schedules={"dssim": [[0, 0.2], [10, -0.5]]})
    with pytest.raises(ValueError, match="steps must be >= 0 and strictly increasing, got \\[10, 10\\]"):
        LossTerms(schedules={"dssim": [[10, 0.2], [10, 0.3]]})
    with pytest.raises(ValueError, match="must be a list of \\[step, weight\\] pairs"):
        LossTerms(schedules={"dssim": 0.3})


def test_ms_ssim_weights_fit_the_image():
    from splatloss.config import MS_SSIM_WEIGHTS

    assert ms_ssim_weights_for(161) == tuple(MS_SSIM_WEIGHTS)
    assert len(ms_ssim_weights_for(160)) == 4
    w = ms_ssim_weights_for(64)
    assert len(w) == 3 and sum(w) == pytest.approx(1.0)
    assert w[1] / w[0] == pytest.approx(MS_SSIM_WEIGHTS[1] / MS_SSIM_WEIGHTS[0])
    with pytest.raises(ValueError, match="too small for SSIM with a 11-px window"):
        ms_ssim_weights_for(10)


class _Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def test_checkpoint_write_is_atomic(tmp_path):
    from splatloss.lightning.checkpoint_io import AtomicCheckpointIO

    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"w": torch.arange(3.0)}, path)
    before = path.read_bytes()
    # A write that fails half-way (the tensor is written, then pickling fails) leaves the old file.
    with pytest.raises(RuntimeError, match="cannot pickle this"):
        io.save_checkpoint({"w": torch.zeros(100_000), "x": _Unpicklable()}, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    assert torch.equal(io.load_checkpoint(path)["w"], torch.arange(3.0))
