"""Where a run's held-out renders go: init/, final/ and step_<n>/ for evaluations during training."""

import os

import lightning as L
import torch
from test_train import make_cfg

from splatloss.lightning import HeldOutMetrics
from splatloss.train import train


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
