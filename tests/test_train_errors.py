"""Bad configs stop with a clear message before training starts (nothing is trained or written);
the same dataset path with a good scene trains."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from test_train import ROOT, TINY, make_cfg

from splatloss.train import train

pytestmark = pytest.mark.usefixtures("scenes_built_once")


def _nothing_trained(out_dir):
    return not os.path.exists(os.path.join(out_dir, "metrics.json")) and not os.path.exists(
        os.path.join(out_dir, "checkpoints")
    )


@pytest.mark.slow
def test_unknown_loss_is_rejected_by_the_entry_point(tmp_path):
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "train.py"), "loss=nope", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode != 0
    assert "Could not find 'loss/nope'" in proc.stderr
    assert "Available options in 'loss'" in proc.stderr and "dssim_l1" in proc.stderr
    assert not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["loss=dssim_l1", "loss.lambda_dssim=-0.1"], r"loss.lambda_dssim must be a finite number >= 0, got -0.1"),
        # the fast tier: the 3DGS loss's weight and a weight the loss's own config does not carry
        pytest.param(
            ["loss=l1", "loss.l1=-1.0"], r"loss.l1 must be a finite number >= 0, got -1.0", marks=pytest.mark.slow
        ),
        pytest.param(
            ["loss=msssim_l1", "loss.alpha=-0.5"],
            r"loss.alpha must be a finite number >= 0, got -0.5",
            marks=pytest.mark.slow,
        ),
        (["loss=l1", "+loss.weights={dssim: -0.2}"], r"loss.weights.dssim must be a finite number >= 0, got -0.2"),
    ],
)
def test_negative_weights_are_rejected(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        train(make_cfg(tmp_path, overrides))
    assert _nothing_trained(tmp_path)


def test_bad_loss_arguments_surface_the_loss_message(tmp_path):
    # Not a weight: the loss's own check (window_size must be odd) names the problem.
    with pytest.raises(ValueError, match=r"could not build the loss .*window_size must be an odd integer >= 3, got 10"):
        train(make_cfg(tmp_path, ["loss=ssim", "loss.window_size=10"]))
    assert _nothing_trained(tmp_path)


@pytest.mark.parametrize(
    "override,message",
    [
        ("model.lr=-1", r"lr must map each parameter group to its learning rate \(keys \[.*\]\), got -1"),
        pytest.param(
            "model.lr.means=nan", r"lr\['means'\] must be a finite number >= 0, got nan", marks=pytest.mark.slow
        ),
        ("model.means_lr_final_factor=abc", r"means_lr_final_factor must be in \(0, 1\], got 'abc'"),
        pytest.param(
            "model.means_lr_final_factor=true",
            r"means_lr_final_factor must be in \(0, 1\], got True",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_bad_learning_rates_name_the_setting(tmp_path, override, message):
    with pytest.raises((TypeError, ValueError), match=r"could not build the model .*" + message):
        train(make_cfg(tmp_path, [override]))
    assert _nothing_trained(tmp_path)


def test_a_folder_given_as_the_checkpoint_is_named_as_one(tmp_path):
    run = tmp_path / "old_run"
    run.mkdir()
    with pytest.raises(ValueError, match=rf"ckpt_path '{run}' is a folder, not a checkpoint file; name the file"):
        train(make_cfg(tmp_path / "run", [f"ckpt_path={run}"]))
    assert _nothing_trained(tmp_path / "run")


def test_missing_dataset_path(tmp_path):
    with pytest.raises(ValueError, match=r"data.path must be set for data=blender, got '\?\?\?'"):
        train(make_cfg(tmp_path, ["data=blender"]))
    missing = tmp_path / "no_such_scene"
    with pytest.raises(ValueError, match=f"data.path '{missing}' does not exist or is not a directory"):
        train(make_cfg(tmp_path, ["data=colmap", f"data.path={missing}"]))
    assert _nothing_trained(tmp_path)


def _write_blender(root, sizes):
    """A tiny NeRF-synthetic scene: one RGBA image per (h, w), the last one held out."""
    import matplotlib.image as mpimg

    rng = np.random.default_rng(0)
    frames = {"train": [], "test": []}
    for k, (h, w) in enumerate(sizes):
        split = "test" if k == len(sizes) - 1 else "train"
        os.makedirs(root / split, exist_ok=True)
        mpimg.imsave(root / split / f"r_{k}.png", rng.uniform(size=(h, w, 4)).astype(np.float32))
        angle = 2 * np.pi * k / len(sizes)
        c2w = np.eye(4)
        c2w[:3, 3] = [4 * np.cos(angle), 4 * np.sin(angle), 0.0]
        frames[split].append({"file_path": f"./{split}/r_{k}", "transform_matrix": c2w.tolist()})
    for split, fr in frames.items():
        (root / f"transforms_{split}.json").write_text(json.dumps({"camera_angle_x": 0.8, "frames": fr}))


def test_mismatched_image_sizes(tmp_path):
    scene = tmp_path / "scene"
    _write_blender(scene, [(16, 16), (16, 16), (16, 20)])
    with pytest.raises(
        ValueError,
        match=r"could not build the scene from data: .*all images must have the same size, "
        r"got 16x16 .* and 16x20",
    ):
        train(make_cfg(tmp_path / "run", ["data=blender", f"data.path={scene}"]))
    assert _nothing_trained(tmp_path / "run")


def test_non_positive_max_steps(tmp_path):
    with pytest.raises(ValueError, match="trainer.max_steps must be an integer >= 1, got -1"):
        train(make_cfg(tmp_path, ["trainer.max_steps=-1"]))


@pytest.mark.parametrize(
    "seed", ["-5", "abc"] + [pytest.param(s, marks=pytest.mark.slow) for s in ("1.5", "true", "null", "4294967296")]
)
def test_a_seed_numpy_cannot_take_is_refused_by_name(tmp_path, seed):
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=r"seed must be an integer from 0 to 4294967295 \(numpy's seed range\), got "):
        train(make_cfg(out, [f"seed={seed}"]))
    assert _nothing_trained(str(out))


def test_evaluation_interval_longer_than_the_run(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=r"eval_every_n_steps=50 is more than trainer.max_steps=20"):
        train(make_cfg(out, ["trainer.max_steps=20", "eval_every_n_steps=50"]))
    assert _nothing_trained(str(out))


@pytest.mark.slow
def test_blender_scene_trains_through_the_pipeline(tmp_path):
    # The same path as the error tests, with a consistent scene: white background, 3 views.
    scene = tmp_path / "scene"
    _write_blender(scene, [(16, 16)] * 3)
    m = train(
        make_cfg(
            tmp_path / "run",
            [
                "data=blender",
                f"data.path={scene}",
                "data.scene.n_points=200",
                "trainer.max_steps=4",
                "export_ply=false",
            ],
        )
    )
    assert m["steps"] == 4 and m["image_size"] == [16, 16]
    assert m["num_train_views"] == 2 and m["num_test_views"] == 1


def test_densification_under_ddp_is_rejected(tmp_path):
    over = ["trainer=ddp", "model.strategy={_target_: splatloss.splat.strategy.DensifyStrategy, _partial_: true}"]
    with pytest.raises(ValueError, match=r"densification \(model.strategy\) cannot run with 2 processes"):
        train(make_cfg(tmp_path, over))
    assert _nothing_trained(tmp_path)


@pytest.mark.parametrize(
    "overrides,message",
    [
        # The loss is tried once on a pair of the views' shape: MS-SSIM's five scales need 161 px with "valid".
        (
            ["loss=msssim", "loss.padding=valid"],
            r"^the loss \(from .*loss\.padding=valid.*\) cannot run on this data's 32x32 views on cpu: "
            r"ValueError: ms_ssim with 5 scales, window_size=11 and padding='valid' needs images of at least 161x161",
        ),
        # The user's value, not the rate derived from it (lr.means is per unit of scene extent).
        (["model.lr.means=-1"], r"lr\['means'\] must be a finite number >= 0, got -1$"),
    ],
)
def test_loss_and_model_errors_arrive_before_anything_is_written(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message) as info:
        train(make_cfg(tmp_path, overrides))
    assert info.value.__cause__ is None and info.value.__suppress_context__  # one message, no chained traceback
    assert _nothing_trained(tmp_path) and not os.path.exists(os.path.join(tmp_path, "renders"))


def test_a_bad_loss_argument_is_one_message(tmp_path):
    with pytest.raises(ValueError, match=r"window_size must be an odd integer >= 3, got 4") as info:
        train(make_cfg(tmp_path, ["loss.window_size=4"]))
    assert info.value.__cause__ is None and info.value.__suppress_context__


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_gpu_trainer_without_a_gpu_names_the_trainers_that_run(tmp_path):
    with pytest.raises(ValueError, match=r"trainer.accelerator=gpu asks for a CUDA GPU.*trainer=default .*trainer=cpu"):
        train(make_cfg(tmp_path, ["trainer=gpu"]))
    assert _nothing_trained(tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the Triton backend runs where CUDA is present")
def test_triton_loss_on_a_cpu_machine_stops_with_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "train.py"), "loss.backend=triton", f"hydra.run.dir={run}"]
        + [o for o in TINY if o.startswith("data.")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    errors = [line for line in proc.stderr.splitlines() if line.startswith("splatloss-train: error:")]
    assert len(errors) == 1 and "loss.backend=triton" in errors[0], proc.stderr
    assert "backend='triton' needs CUDA tensors, got a tensor on cpu" in errors[0]
    assert _nothing_trained(run) and not (run / "renders").exists()
