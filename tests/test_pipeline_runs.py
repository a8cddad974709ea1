"""What a training run measures and refuses, through ``train(cfg)``: real Hydra composition, the real
Lightning Trainer, real files."""

import json

import pytest
from test_train import make_cfg

from splatloss.train import train

pytestmark = pytest.mark.usefixtures("scenes_built_once")


def test_a_run_shorter_than_the_warm_up_records_the_time_of_its_steps(tmp_path):
    metrics = train(make_cfg(tmp_path, ["loss=l1", "trainer.max_steps=1", "export_ply=false"]))
    on_disk = json.loads((tmp_path / "metrics.json").read_text())
    assert 0 < on_disk["step_seconds"] <= metrics["train_seconds"]
    assert on_disk["timed_steps"] == 1 and on_disk["timing_includes_warmup"] is True
    assert 0 < on_disk["loss_share"] < 1
    assert on_disk["step_seconds"] >= on_disk["loss_seconds"] > 0


def test_a_run_that_times_no_step_records_no_step_time(tmp_path):
    train(make_cfg(tmp_path, ["loss=l1", "trainer.max_steps=1", "model.time_steps=false", "export_ply=false"]))
    on_disk = json.loads((tmp_path / "metrics.json").read_text())
    assert on_disk["step_seconds"] is None and on_disk["loss_share"] is None
    assert on_disk["timed_steps"] == 0 and on_disk["timing_includes_warmup"] is False
