"""Stopping and continuing a run as a user does: Ctrl+C / SIGTERM through the real entry point
(exit status, checkpoint, the printed command run as printed), ``resume=latest`` in the run's own
folder, and what a resumed run shows and logs (progress in the run's steps, one continuous CSV /
TensorBoard log with every step once)."""

import csv
import glob
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import warnings

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf, open_dict
from test_train import ROOT, TINY, make_cfg

from splatloss.train import CONFIG_DIR, train

pytestmark = pytest.mark.usefixtures("scenes_built_once")

SCRIPT = os.path.join(ROOT, "scripts", "train.py")
DATA = [o for o in TINY if o.startswith("data.")]


def _with_logger(cfg, name):
    with open_dict(cfg):  # the tiny test config drops the logger: put back the shipped one
        cfg.logger = OmegaConf.load(os.path.join(CONFIG_DIR, "logger", f"{name}.yaml"))
    return cfg


def _csv_rows(run):
    (path,) = glob.glob(os.path.join(run, "csv", "version_*", "metrics.csv"))  # one log, no new version
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _csv_steps(rows, key):
    return [int(r["step"]) for r in rows if r.get(key)]


def _tb_steps(run, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (version,) = glob.glob(os.path.join(run, "tensorboard", "version_*"))  # one log, no new version
    acc = EventAccumulator(version, size_guidance={"scalars": 0})  # purge_orphaned_data: as TensorBoard shows it
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


@pytest.mark.slow
def test_progress_after_a_resume_counts_the_runs_steps(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    common = ["loss=l1", "export_ply=false"]
    train(make_cfg(tmp_path, common + ["trainer.max_steps=4"]))
    capsys.readouterr()
    train(make_cfg(tmp_path, common + ["trainer.max_steps=8", "resume=true"]))
    bars = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Training")]
    assert bars and re.search(r" 8/8 ", bars[-1]), bars
    assert not [b for b in bars if re.search(r" \d+/4 ", b)], bars


def test_ms_per_step_is_a_recent_window_and_the_run_reports_the_median(tmp_path):
    over = ["loss=l1", "trainer.max_steps=12", "trainer.log_every_n_steps=1", "model.step_ms_window=2"]
    metrics = train(_with_logger(make_cfg(tmp_path, over + ["export_ply=false"]), "csv"))
    times = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["splatloss"]["step_times"].tolist()
    assert len(times) == 12 - 3  # the first 3 steps are not timed
    assert metrics["step_seconds"] == statistics.median(times)
    for row in _csv_rows(tmp_path):
        if row.get("step_ms"):
            timed = int(row["step"]) - 2  # steps 3.. are timed: after step s, s - 2 durations
            window = times[max(timed - 2, 0) : timed]
            assert float(row["step_ms"]) == pytest.approx(1000 * sum(window) / len(window), rel=1e-6), row


@pytest.mark.slow
@pytest.mark.parametrize("logger", ["csv", "tensorboard"])
def test_a_resumed_run_logs_every_step_once_in_one_log(tmp_path, logger):
    # A crash at step 10 after the checkpoint of step 8: steps 8 and 9 were logged, and are logged
    # again by the resumed run; the log keeps one of each.
    common = ["loss=l1", "trainer.max_steps=12", "trainer.log_every_n_steps=1", "export_ply=false"]
    common += ["callbacks.checkpoint.every_n_train_steps=4"]
    cut = common + ["+callbacks.stop._target_=test_train.StopAt", "+callbacks.stop.step=10"]
    with pytest.raises(RuntimeError, match="simulated crash at step 10"):
        train(_with_logger(make_cfg(tmp_path, cut), logger))
    train(_with_logger(make_cfg(tmp_path, common + ["resume=true"]), logger))
    if logger == "csv":
        rows = _csv_rows(tmp_path)
        train_steps, val_steps = _csv_steps(rows, "train/loss"), _csv_steps(rows, "val/psnr")
    else:
        train_steps, val_steps = _tb_steps(tmp_path, "train/loss"), _tb_steps(tmp_path, "val/psnr")
    assert train_steps == list(range(12))
    assert val_steps == [0, 12]  # the untrained model (not evaluated again on resume) and the end


@pytest.mark.slow
def test_resume_latest_continues_the_newest_run_in_its_own_folder_and_log(tmp_path):
    common = ["loss=l1", "export_ply=false", "trainer.log_every_n_steps=1"]
    outputs = tmp_path / "outputs"
    older, newer = outputs / "2026-01-01" / "10-00-00", outputs / "2026-01-02" / "09-00-00"
    train(_with_logger(make_cfg(older, common + ["trainer.max_steps=4"]), "csv"))
    train(_with_logger(make_cfg(newer, common + ["trainer.max_steps=6"]), "csv"))
    here = outputs / "2026-01-02" / "11-00-00"  # where this run's own folder would be
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = train(_with_logger(make_cfg(here, common + ["trainer.max_steps=9", "resume=latest"]), "csv"))
    assert metrics["resumed_from"] == str(newer / "checkpoints" / "last.ckpt")
    assert not here.exists()
    assert metrics["steps"] == 9 and metrics["steps_this_run"] == 3
    assert (newer / "metrics.json").read_text().count('"steps": 9') == 1
    assert _csv_steps(_csv_rows(newer), "train/loss") == list(range(9))
    about_dirs = [str(w.message) for w in caught if "dirpath" in str(w.message) or "not empty" in str(w.message)]
    assert not about_dirs, about_dirs


def _cli(args, cwd, timeout=300):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "tests"), ROOT, env.get("PYTHONPATH", "")])
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def _signal_at(step, signum):
    return [
        "+callbacks.send._target_=test_train_resume.SendSignal",
        f"+callbacks.send.step={step}",
        f"+callbacks.send.signum={int(signum)}",
    ]


@pytest.mark.slow
def test_ctrl_c_exits_130_after_saving_and_the_printed_command_resumes_as_printed(tmp_path):
    run = tmp_path / "run"
    args = DATA + ["loss=l1", "trainer.max_steps=12", "trainer.log_every_n_steps=1", "export_ply=false"]
    proc = _cli([sys.executable, SCRIPT, *args, *_signal_at(5, signal.SIGINT), f"hydra.run.dir={run}"], tmp_path)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 5
    command = proc.stdout.split("Resume with:\n", 1)[1].splitlines()[0].strip()
    argv = shlex.split(command)
    assert argv[:2] == [sys.executable, SCRIPT], command  # this interpreter, not a bare `python`
    resumed = _cli(argv, tmp_path)  # exactly as printed
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert '"steps": 12' in (run / "metrics.json").read_text()
    rows = _csv_rows(run)
    assert _csv_steps(rows, "train/loss") == list(range(12))  # nothing rolled back, nothing twice
    assert _csv_steps(rows, "val/psnr") == [0, 12]


@pytest.mark.slow
def test_sigterm_exits_143_and_resume_latest_continues_the_same_run_and_log(tmp_path):
    args = DATA + ["loss=l1", "trainer.max_steps=12", "trainer.log_every_n_steps=1", "logger=tensorboard"]
    first = os.path.join("outputs", "2026-01-01", "10-00-00")
    proc = _cli([sys.executable, SCRIPT, *args, *_signal_at(5, signal.SIGTERM), f"hydra.run.dir={first}"], tmp_path)
    assert proc.returncode == 143, proc.stderr[-3000:]
    resumed = _cli([sys.executable, SCRIPT, *args, "resume=latest"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert glob.glob(str(tmp_path / "outputs" / "*" / "*")) == [str(tmp_path / first)]  # no new run folder
    assert _tb_steps(tmp_path / first, "train/loss") == list(range(12))
    assert "dirpath" not in resumed.stderr and "not empty" not in resumed.stderr, resumed.stderr
    assert "Training" in resumed.stdout and " 12/12 " in resumed.stdout


class SignalDuringEvaluation(L.Callback):
    """Sends SIGINT to this process while the untrained model is evaluated (before training)."""

    def __init__(self):
        self.sent = False

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)


def test_a_signal_outside_training_stops_at_once_with_the_shells_status(tmp_path):
    from splatloss.lightning import RunInterrupted

    cfg = make_cfg(tmp_path, ["loss=l1", "trainer.max_steps=4"])
    with open_dict(cfg):
        cfg.callbacks.send = {"_target_": "test_train_interrupt.SignalDuringEvaluation"}
    previous = signal.getsignal(signal.SIGINT)
    with pytest.raises(RunInterrupted) as info:  # not Lightning's sys.exit(1)
        train(cfg)
    assert info.value.exit_code == 130 and info.value.signal_name == "SIGINT"
    assert signal.getsignal(signal.SIGINT) is previous
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "metrics.json").exists()
