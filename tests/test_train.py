"""The training entry point end to end: real Hydra composition, real Lightning Trainer, real renderer.

Tiny scenes (32x32 views, a few hundred Gaussians) keep each run to seconds on one CPU thread.
"""

import json
import os

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from splatloss.train import CONFIG_DIR, train

pytestmark = pytest.mark.usefixtures("scenes_built_once")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY = [
    "data.scene.image_size=32",
    "data.scene.n_train=4",
    "data.scene.n_test=2",
    "data.scene.n_points=400",
    "data.scene.supersample=2",
    "~logger",
]


def make_cfg(out_dir, overrides=()):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        tiny = [o for o in TINY if not o.startswith("data.") or not any(x.startswith("data=") for x in overrides)]
        cfg = compose(config_name="train", overrides=tiny + list(overrides))
    with open_dict(cfg):
        cfg.output_dir = str(out_dir)
        cfg.loss_name = next((o.split("=", 1)[1] for o in overrides if o.startswith("loss=")), "dssim_l1")
    return cfg


class StopAt(L.Callback):
    """Crashes the run once ``step`` steps are done (an exception inside fit, as a failing node).

    Not KeyboardInterrupt: Lightning answers that with ``sys.exit(1)`` and ignores SIGINT from then
    on, which would take the test session with it."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step >= self.step:
            raise RuntimeError(f"simulated crash at step {trainer.global_step}")


def test_tiny_run_trains_and_writes_everything(tmp_path):
    cfg = make_cfg(tmp_path, ["loss=dssim_l1", "trainer.max_steps=40"])
    metrics = train(cfg)
    on_disk = json.loads((tmp_path / "metrics.json").read_text())
    assert on_disk == json.loads(json.dumps(metrics))
    for key in ("psnr", "ssim", "ms_ssim", "psnr_init", "steps", "train_seconds", "loss", "step_seconds", "loss_share"):
        assert key in on_disk, key
    assert on_disk["steps"] == 40
    assert on_disk["loss"]["_target_"] == cfg.loss._target_
    assert on_disk["psnr"] > on_disk["psnr_init"] + 1.0, on_disk
    assert 0.0 < on_disk["loss_share"] < 1.0
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    assert (tmp_path / "point_cloud.ply").is_file()
    assert sorted(os.listdir(tmp_path / "renders")) == ["final", "init"]
    assert len(os.listdir(tmp_path / "renders" / "final")) == 2
    # No temporary file left behind by the atomic writes.
    assert not [f for f in os.listdir(tmp_path) + os.listdir(tmp_path / "checkpoints") if f.startswith(".tmp")]


@pytest.mark.slow
def test_interrupted_run_resumes_exactly(tmp_path):
    # Densify every 3 steps so the number of Gaussians changes before and after the checkpoint the
    # resumed run starts from; checkpoints every 4 steps, the crash at step 10 leaves step 8's.
    common = [
        "loss=dssim_l1",
        "trainer.max_steps=12",
        "export_ply=false",
        "callbacks.checkpoint.every_n_train_steps=4",
        "model.strategy.refine_start=1",
        "model.strategy.refine_every=3",
        "model.strategy.grow_grad2d=0.0",
        "model.strategy.max_gaussians=5000",
    ]
    m_ref = train(make_cfg(tmp_path / "ref", common))
    ref_state = torch.load(tmp_path / "ref" / "checkpoints" / "last.ckpt", weights_only=False)

    run = tmp_path / "run"
    cut = make_cfg(run, common + ["+callbacks.stop._target_=test_train.StopAt", "+callbacks.stop.step=10"])
    with pytest.raises(RuntimeError, match="simulated crash at step 10"):
        train(cut)
    assert not (run / "metrics.json").exists()
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == 8  # the last checkpoint before the crash
    n_at_8 = ckpt["splatloss"]["num_gaussians"]
    n_final = ref_state["splatloss"]["num_gaussians"]
    assert len({400, n_at_8, n_final}) == 3, (n_at_8, n_final)  # the count changed before and after step 8

    m_res = train(make_cfg(run, common + ["resume=true"]))
    assert m_res["steps"] == 12
    assert m_res["resumed_from"].endswith(os.path.join("checkpoints", "last.ckpt"))
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    for k, v in ref_state["state_dict"].items():
        assert torch.equal(state["state_dict"][k], v), k
    ref_adam, adam = ref_state["optimizer_states"][0]["state"], state["optimizer_states"][0]["state"]
    for i in ref_adam:
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(adam[i][name], ref_adam[i][name]), (i, name)
    assert m_res["psnr"] == m_ref["psnr"] and m_res["num_gaussians"] == n_final


def test_resume_without_checkpoint_stops_before_training(tmp_path):
    cfg = make_cfg(tmp_path, ["resume=true"])
    with pytest.raises(ValueError, match="resume=true but there is no checkpoint to resume from: expected"):
        train(cfg)
    assert not (tmp_path / "metrics.json").exists()
