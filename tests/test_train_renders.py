"""Where a run's held-out renders go: init/, final/ and step_<n>/ for evaluations during training."""

import csv
import os

import lightning as L
import pytest
import torch
from omegaconf import open_dict
from test_train import make_cfg

from splatloss.lightning import HeldOutMetrics
from splatloss.train import train

pytestmark = pytest.mark.usefixtures("scenes_built_once")


@pytest.mark.slow
def test_validation_during_training_renders_to_its_own_step_folder(tmp_path):
    cfg = make_cfg(
        tmp_path,
        [
            "loss=l1",
            "trainer.max_steps=20",
            "trainer.check_val_every_n_epoch=1",
            "+trainer.val_check_interval=10",
            "export_ply=false",
        ],
    )
    train(cfg)
    folders = sorted(os.listdir(tmp_path / "renders"))
    assert folders == ["final", "init", "step_000010", "step_000020"], folders
    for folder in folders:
        assert len(os.listdir(tmp_path / "renders" / folder)) == 2, folder


class _Named(L.LightningModule):
    def __init__(self, name):
        super().__init__()
        self.name = name
        self.p = torch.nn.Parameter(torch.zeros(()))

    def validation_step(self, batch, batch_idx):
        img = torch.full((1, 3, 16, 16), 0.5)
        return {"pred": img + self.p, "target": img, "name": self.name}

    def val_dataloader(self):
        return torch.utils.data.DataLoader([0], batch_size=1)


def test_render_file_names_have_one_extension(tmp_path):
    for name in ("r_0.png", "./test/r_1.PNG", "frame_00002.jpg", "view.v2"):
        cb = HeldOutMetrics(dirpath=str(tmp_path / "renders"))
        cb.tag = "final"
        trainer = L.Trainer(
            accelerator="cpu",
            callbacks=[cb],
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=str(tmp_path),
        )
        trainer.validate(_Named(name), verbose=False)
    assert sorted(os.listdir(tmp_path / "renders" / "final")) == [
        "frame_00002.png",
        "r_0.png",
        "r_1.png",
        "view.v2.png",
    ]


@pytest.mark.slow
def test_eval_every_n_steps_evaluates_during_training(tmp_path):
    cfg = make_cfg(tmp_path, ["loss=l1", "trainer.max_steps=12", "eval_every_n_steps=4", "export_ply=false"])
    with open_dict(cfg):  # the tiny test config drops the logger; put the default CSV logger back
        cfg.logger = {"_target_": "lightning.pytorch.loggers.CSVLogger", "save_dir": str(tmp_path), "name": "csv"}
    train(cfg)
    folders = sorted(os.listdir(tmp_path / "renders"))
    assert folders == ["final", "init", "step_000004", "step_000008", "step_000012"], folders
    # The held-out metrics of each evaluation reach the logger, at the step they were taken.
    (path,) = list(tmp_path.glob("csv/version_*/metrics.csv"))
    with open(path) as f:
        rows = [r for r in csv.DictReader(f) if r.get("val/psnr")]
    # init, three evaluations during training, final
    assert len(rows) == 5, [r["step"] for r in rows]
    assert all(0 < float(r["val/psnr"]) < 100 for r in rows)


def test_eval_every_n_steps_must_be_a_positive_integer(tmp_path):
    with pytest.raises(ValueError, match=r"eval_every_n_steps must be null or an integer >= 1, got 0"):
        train(make_cfg(tmp_path, ["eval_every_n_steps=0"]))
