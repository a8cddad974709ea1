"""The data side of the pipeline: per-epoch view order, scene checks, schedules, MS-SSIM scales."""

import pytest
import torch

from splatloss.lightning.callbacks import LossTerms, interpolate_schedule, ms_ssim_weights_for
from splatloss.lightning.data import EpochPermutationSampler, SceneDataModule, check_scene
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


def test_sampler_order_depends_only_on_seed_and_epoch():
    a, b = EpochPermutationSampler(10, seed=3), EpochPermutationSampler(10, seed=3)
    orders = []
    for epoch in range(3):
        a.set_epoch(epoch)
        orders.append(list(a))
        assert sorted(orders[-1]) == list(range(10))
    # A fresh sampler (a resumed run) put at epoch 2 gives epoch 2's order without replaying 0 and 1.
    b.set_epoch(2)
    assert list(b) == orders[2]
    assert orders[0] != orders[1] != orders[2]
    c = EpochPermutationSampler(10, seed=4)
    c.set_epoch(0)
    assert list(c) != orders[0]
    with pytest.raises(ValueError, match="n must be an integer >= 1, got 0"):
        EpochPermutationSampler(0)


def test_check_scene_rejects_mismatched_sizes_between_splits():
    with pytest.raises(ValueError, match=r"all images must have the same size, got 16x16 \(train view 'train_0'\) "
                                         r"and 16x20 \(test view 'test_1'\)"):
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


def test_datamodule_yields_single_views_in_epoch_order():
    scene = _scene([(8, 8)] * 5, [(8, 8)] * 2)
    dm = SceneDataModule(scene, seed=1)
    dm.setup("fit")
    dl = dm.train_dataloader()
    dl.sampler.set_epoch(1)
    items = list(dl)
    assert [int(it["index"]) for it in items] == list(dl.sampler)
    assert items[0]["image"].shape == (8, 8, 3)  # one view per step, no batch dimension
    assert [int(it["index"]) for it in dm.val_dataloader()] == [0, 1]


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
