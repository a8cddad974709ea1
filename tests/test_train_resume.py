"""Whole-run totals across resumes, and a strict-JSON metrics.json that a resume never degrades."""

import json
import os
import signal

import lightning as L
import pytest
import torch
from omegaconf import open_dict
from test_train import StopAt, make_cfg  # noqa: F401  (StopAt is instantiated by Hydra from here)

from splatloss.train import train

pytestmark = pytest.mark.usefixtures("scenes_built_once")


def _strict(path):
    def refuse(token):
        raise ValueError(f"non-standard JSON constant {token} in {path}")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.slow
def test_resumed_run_reports_whole_run_steps_and_seconds(tmp_path):
    common = ["loss=l1", "trainer.max_steps=12", "export_ply=false", "callbacks.checkpoint.every_n_train_steps=4"]
    cut = make_cfg(tmp_path, common + ["+callbacks.stop._target_=test_train.StopAt", "+callbacks.stop.step=10"])
    try:
        train(cut)
    except RuntimeError as e:
        assert "simulated crash at step 10" in str(e)
    metrics = train(make_cfg(tmp_path, common + ["resume=true"]))
    on_disk = _strict(tmp_path / "metrics.json")
    assert on_disk["steps"] == 12 and on_disk["steps_this_run"] == 4
    # The 8 steps before the checkpoint count: the whole run took longer than its last part.
    assert on_disk["train_seconds"] > on_disk["train_seconds_this_run"] > 0
    assert metrics["train_seconds"] == on_disk["train_seconds"]


@pytest.mark.slow
def test_resuming_a_finished_run_keeps_its_metrics(tmp_path):
    common = ["loss=l1", "trainer.max_steps=10", "export_ply=false"]
    train(make_cfg(tmp_path, common))
    first = _strict(tmp_path / "metrics.json")
    train(make_cfg(tmp_path, common + ["resume=true"]))
    again = _strict(tmp_path / "metrics.json")
    assert again["steps"] == first["steps"] == 10 and again["steps_this_run"] == 0
    assert again["train_seconds"] >= first["train_seconds"] > 0
    for key in ("psnr", "ssim", "step_seconds", "loss_share", "num_gaussians"):
        assert again[key] == first[key], key


@pytest.mark.slow
def test_one_checkpoint_file_per_save(tmp_path):
    train(
        make_cfg(
            tmp_path,
            ["loss=l1", "trainer.max_steps=8", "export_ply=false", "callbacks.checkpoint.every_n_train_steps=4"],
        )
    )
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["last.ckpt"]


@pytest.mark.slow
def test_resume_latest_continues_the_newest_run_folder(tmp_path):
    common = ["loss=l1", "export_ply=false"]
    older, newer = tmp_path / "outputs" / "2026-01-01" / "10-00-00", tmp_path / "outputs" / "2026-01-02" / "09-00-00"
    train(make_cfg(older, common + ["trainer.max_steps=4"]))
    train(make_cfg(newer, common + ["trainer.max_steps=8"]))
    run = tmp_path / "outputs" / "2026-01-02" / "11-00-00"
    metrics = train(make_cfg(run, common + ["trainer.max_steps=12", "resume=latest"]))
    assert metrics["resumed_from"] == str(newer / "checkpoints" / "last.ckpt")
    assert metrics["steps"] == 12 and metrics["steps_this_run"] == 4


def test_resume_latest_without_any_checkpoint_says_so(tmp_path):
    cfg = make_cfg(tmp_path / "outputs" / "d" / "t", ["resume=latest"])
    with pytest.raises(ValueError, match="resume=latest found no run folder with checkpoints/last.ckpt"):
        train(cfg)


class SendSignal(L.Callback):
    """Sends a real signal to this process once ``step`` steps are done."""

    def __init__(self, step: int, signum: int):
        self.step, self.signum = step, signum

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.slow
def test_signal_saves_a_checkpoint_marks_the_run_and_prints_the_resume_command(tmp_path, capsys, signum):
    common = ["loss=l1", "trainer.max_steps=12", "export_ply=false"]
    cfg = make_cfg(tmp_path, common)
    with open_dict(cfg):
        cfg.callbacks.send = {"_target_": "test_train_resume.SendSignal", "step": 5, "signum": int(signum)}
    previous = signal.getsignal(signum)
    metrics = train(cfg)
    assert signal.getsignal(signum) is previous  # handlers restored after fit
    on_disk = _strict(tmp_path / "metrics.json")
    assert on_disk["interrupted"] == signal.Signals(signum).name and on_disk["steps"] == metrics["steps"] == 5
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == 5
    out = capsys.readouterr().out
    assert f"Stopped by {signal.Signals(signum).name} at step 5" in out
    assert f"hydra.run.dir={tmp_path} resume=true" in out
    # The printed resume continues the run to its end.
    done = train(make_cfg(tmp_path, common + ["resume=true"]))
    assert done["steps"] == 12 and done["interrupted"] is None
