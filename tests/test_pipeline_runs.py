"""What a training run measures and refuses, through ``train(cfg)``: real Hydra composition, the real
Lightning Trainer, real files."""

import errno
import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys

import lightning as L
import pytest
import torch
from omegaconf import open_dict
from test_train import ROOT, TINY, make_cfg

from splatloss.train import train

pytestmark = pytest.mark.usefixtures("scenes_built_once")

SCRIPT = os.path.join(ROOT, "scripts", "train.py")
DATA = [o for o in TINY if o.startswith("data.")]


def _cli(args, cwd, timeout=300, **environ):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **environ}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "tests"), ROOT, env.get("PYTHONPATH", "")])
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


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


QUIET = ["trainer.enable_progress_bar=false"]  # one live progress display per process (rich)


class StartAnotherRun(L.Callback):
    """At the first step, starts a second run in the same folder and keeps what it raised."""

    refused = []

    def __init__(self, folder: str):
        self.folder = folder

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 1:
            try:
                train(make_cfg(self.folder, ["loss=l1", "trainer.max_steps=1", "export_ply=false", *QUIET]))
            except ValueError as e:
                StartAnotherRun.refused.append(str(e))
            else:
                StartAnotherRun.refused.append(None)


def test_a_second_run_in_a_folder_in_use_is_refused_and_the_first_finishes(tmp_path):
    cfg = make_cfg(tmp_path, ["loss=l1", "trainer.max_steps=2", *QUIET])
    with open_dict(cfg):
        cfg.callbacks.another = {"_target_": f"{__name__}.StartAnotherRun", "folder": str(tmp_path)}
    StartAnotherRun.refused.clear()
    metrics = train(cfg)
    (message,) = StartAnotherRun.refused
    assert message is not None, "the second run trained in the folder the first one was writing"
    assert re.search(
        rf"the run folder '{re.escape(str(tmp_path))}' is in use by another run \(process \d+ .*\); two runs in one "
        r"folder would mix their checkpoints, logs and metrics\. Wait for it to finish, or start in another folder "
        r"\(hydra\.run\.dir=<new folder>\)",
        message,
    ), message
    assert metrics["steps"] == 2
    assert json.loads((tmp_path / "metrics.json").read_text())["steps"] == 2
    # The folder is free again once the run ends: its resume is not refused as in use.
    again = train(make_cfg(tmp_path, ["loss=l1", "trainer.max_steps=3", "resume=true", "export_ply=false"]))
    assert again["steps"] == 3


@pytest.mark.slow
@pytest.mark.parametrize("name", ["run", "my run"])  # a plain path, and one Hydra's grammar needs quoted
def test_the_entry_point_refuses_a_folder_in_use_before_hydra_writes_there(tmp_path, name):
    from splatloss.lightning.runs import RunFolderLock, hydra_value

    run = tmp_path / name
    held = RunFolderLock(str(run)).acquire()  # another process's run, holding the folder
    try:
        args = [*DATA, "loss=l1", "trainer.max_steps=1", f"hydra.run.dir={hydra_value(str(run))}"]
        proc = _cli([sys.executable, SCRIPT, *args], tmp_path)
    finally:
        held.release()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"splatloss-train: error: the run folder '{run}' is in use by another run (process {os.getpid()} " in (
        proc.stderr
    ), proc.stderr[-3000:]
    assert sorted(os.listdir(run)) == [RunFolderLock.NAME]  # no .hydra/, no train.log written there


def test_a_learning_rate_that_makes_the_gaussians_non_finite_stops_the_run_naming_the_step_and_parameter(tmp_path):
    with pytest.raises(Exception) as info:
        train(make_cfg(tmp_path, ["loss=l1", "trainer.max_steps=5", "model.lr.log_scales=1e6"]))
    assert type(info.value).__name__ == "TrainingDiverged", info.value
    message = str(info.value)
    assert re.fullmatch(
        r"training diverged at step (\d) of 5: the Gaussians' (\w+, )*log_scales(, \w+)* (is|are) not finite "
        r"\(NaN or inf\) after the optimizer step; their learning rates: (model\.lr\.\w+=[\d.e+-]+, )*"
        r"model\.lr\.log_scales=1e\+06.*\. Lower them \(model\.lr\.<name>=\.\.\.\); nothing of this run after the "
        r"last finite state was saved",
        message,
    ), message
    assert 1 <= int(re.match(r"training diverged at step (\d)", message).group(1)) <= 5
    assert not (tmp_path / "point_cloud.ply").exists() and not (tmp_path / "metrics.json").exists()
    assert not (tmp_path / "checkpoints" / "last.ckpt").exists()  # no checkpoint of non-finite Gaussians


@pytest.mark.slow
def test_a_diverged_run_exits_1_with_one_line(tmp_path):
    run = tmp_path / "run"
    args = [*DATA, "loss=l1", "trainer.max_steps=5", "model.lr.log_scales=1e6", f"hydra.run.dir={run}"]
    proc = _cli([sys.executable, SCRIPT, *args], tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "splatloss-train: error: training diverged at step " in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not (run / "point_cloud.ply").exists()


@pytest.fixture
def full_disk(tmp_path):
    """A 16 KiB file system (tmpfs), too small for a checkpoint: a disk that fills mid-write."""
    folder = tmp_path / "full"
    folder.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("needs mount(8) to make a small file system")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(folder)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({made.stderr.decode().strip()})")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def test_a_checkpoint_that_fills_the_disk_goes_to_the_rescue_folder(tmp_path, full_disk):
    from splatloss.lightning.runs import OutputNotWritten

    rescue = tmp_path / "rescue"
    over = ["loss=l1", "trainer.max_steps=2", f"callbacks.checkpoint.dirpath={full_disk}", f"rescue_dir={rescue}"]
    with pytest.raises(OutputNotWritten) as info:
        train(make_cfg(tmp_path / "run", over))
    ((wanted, got, why),) = info.value.rescued
    assert wanted == str(full_disk / "last.ckpt") and why.startswith("OSError: [Errno 28] No space left on device")
    assert got.startswith(str(rescue)) and torch.load(got, weights_only=True)["global_step"] == 2
    assert os.listdir(full_disk) == []  # no partial file left behind
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["steps"] == 2


def test_a_checkpoint_write_that_fails_mid_file_raises_the_os_error_naming_the_file(tmp_path):
    from splatloss.lightning.checkpoint_io import AtomicCheckpointIO

    path = tmp_path / "last.ckpt"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        with pytest.raises(OSError) as info:
            AtomicCheckpointIO().save_checkpoint({"w": torch.zeros(10_000)}, path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert info.value.errno == errno.EFBIG and info.value.filename == str(path), info.value
    assert os.listdir(tmp_path) == []


def test_without_a_terminal_progress_is_printed_as_lines_while_it_trains(tmp_path, capsys, caplog):
    # pytest's captured stdout is not a terminal, as nohup's, SLURM's or a redirected log's
    caplog.set_level("INFO", logger="splatloss.train")
    train(make_cfg(tmp_path, ["loss=l1", "trainer.max_steps=3", "export_ply=false"]))
    out = capsys.readouterr().out.splitlines()
    lines = [line for line in out if line.startswith("Training step ")]
    # the first step, then every 30 s (the default), and the last
    assert [line.split(":")[0] for line in lines] == ["Training step 1/3 (33%)", "Training step 3/3 (100%)"], out
    assert re.fullmatch(
        r"Training step 3/3 \(100%\): loss \d\.\d{4}, Gaussians 400; 0:00:\d\d elapsed, ~0:00:00 left", lines[-1]
    ), lines[-1]
    announced = (
        "Training to step 3 from step 0; the output is not a terminal, so progress is printed as a line every 30 s"
    )
    assert out.index(announced) < out.index(lines[0]), out
    # Start-up says what it is doing before the first step.
    said = [r.getMessage() for r in caplog.records if r.name == "splatloss.train"]
    assert said[:3] == [
        f"starting {tmp_path}: building the loss, the scene and the model",
        "evaluating the untrained model on 2 held-out views",
        "training 400 Gaussians from step 0 to step 3",
    ], said


def test_progress_lines_every_step_when_asked(tmp_path, capsys):
    over = ["loss=l1", "trainer.max_steps=3", "callbacks.progress.line_interval_s=0", "export_ply=false"]
    train(make_cfg(tmp_path, over))
    lines = [line.split(":")[0] for line in capsys.readouterr().out.splitlines() if line.startswith("Training step ")]
    assert lines == [f"Training step {s}/3 ({s / 3:.0%})" for s in (1, 2, 3)], lines


@pytest.mark.slow
def test_the_help_examples_home_relative_path_reaches_the_dataset_reader(tmp_path):
    from splatloss.train import help_text

    (example,) = [line for line in help_text("splatloss-train").splitlines() if "data.path=~/" in line]
    args = [a for a in shlex.split(example)[1:] if not a.startswith("trainer=")]  # the GPU trainer: not here
    home = tmp_path / "home"
    folder = home / os.path.relpath(next(a for a in args if a.startswith("data.path=~/"))[len("data.path=~/") :])
    folder.mkdir(parents=True)  # the scene folder exists (empty: the reader then says what it lacks)
    run = tmp_path / "run"
    proc = _cli(
        [sys.executable, SCRIPT, *args, "trainer.max_steps=1", f"hydra.run.dir={run}"], tmp_path, HOME=str(home)
    )
    assert "LexerNoViableAltException" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 2 and "splatloss-train: error: " in proc.stderr, proc.stderr[-3000:]
    assert str(folder) in proc.stderr, proc.stderr[-3000:]  # the path as the shell would have expanded it


class SignalAt(L.Callback):
    """Sends SIGINT to this process during the final evaluation (``stage="final"``), or at the end of
    step ``step`` and again while the checkpoint after it is saved (``stage="save"``)."""

    def __init__(self, stage: str, step: int = 0):
        self.stage, self.step, self.first = stage, step, False

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if self.stage == "final" and trainer.global_step == trainer.max_steps and batch_idx == 0:
            os.kill(os.getpid(), signal.SIGINT)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.stage == "save" and trainer.global_step == self.step:
            self.first = True
            os.kill(os.getpid(), signal.SIGINT)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        if self.stage == "save" and self.first and not trainer.training:
            os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl+C, while the final checkpoint is written


def _stopped(tmp_path, over, stage, step=0):
    from splatloss.lightning import RunInterrupted

    cfg = make_cfg(tmp_path, ["loss=l1", *over])
    with open_dict(cfg):
        cfg.callbacks.send = {"_target_": f"{__name__}.SignalAt", "stage": stage, "step": step}
    with pytest.raises(RunInterrupted) as info:
        train(cfg)
    assert info.value.exit_code == 130
    return cfg


def test_a_stop_during_the_final_evaluation_prints_the_command_that_finishes_the_run(tmp_path, capsys):
    _stopped(tmp_path, ["trainer.max_steps=3"], "final")
    out = capsys.readouterr().out
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    said = re.search(
        r"Stopped by SIGINT during the final evaluation, after training: checkpoint (\S+) holds step 3 of 3; the "
        r"held-out metrics, metrics\.json and point_cloud\.ply are not written yet\. Resume with:\n  (.*)\n",
        out,
    )
    assert said and said.group(1) == str(ckpt), out
    assert said.group(2).endswith(f"hydra.run.dir={tmp_path} resume=true"), said.group(2)
    assert not (tmp_path / "metrics.json").exists()
    finished = train(make_cfg(tmp_path, ["loss=l1", "trainer.max_steps=3", "resume=true"]))
    assert finished["steps"] == 3 and finished["steps_this_run"] == 0 and (tmp_path / "point_cloud.ply").exists()


def test_a_second_ctrl_c_says_what_was_saved(tmp_path, capsys):
    # The first Ctrl+C at step 2 stops training; the second comes while the checkpoint of step 2 is written.
    over = ["trainer.max_steps=6", "callbacks.checkpoint.every_n_train_steps=1", "export_ply=false"]
    _stopped(tmp_path, over, "save", step=2)
    out = capsys.readouterr().out
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    assert torch.load(ckpt, weights_only=True)["global_step"] == 2  # saved at step 2 before the stop
    said = re.search(
        r"Stopped by SIGINT again while the checkpoint was saved: checkpoint (\S+) holds step 2 of 6\. Resume with:\n"
        r"  (.*)\n",
        out,
    )
    assert said and said.group(1) == str(ckpt), out
    assert said.group(2).endswith(f"hydra.run.dir={tmp_path} resume=true"), said.group(2)


def test_a_stop_before_any_checkpoint_says_nothing_was_saved(tmp_path, capsys):
    # No checkpoint callback: the only checkpoint would be the one the stop writes, which the second signal stops.
    _stopped(tmp_path, ["trainer.max_steps=6", "export_ply=false", "~callbacks.checkpoint"], "save", step=2)
    out = capsys.readouterr().out
    said = re.search(
        r"Stopped by SIGINT again while the checkpoint was saved: no checkpoint was saved\. Start again with:\n"
        r"  (.*)\n",
        out,
    )
    assert said and said.group(1).endswith(f"hydra.run.dir={tmp_path}"), out
    assert not (tmp_path / "checkpoints").exists()


class SignalInJob(L.Callback):
    """Sends SIGINT to this process at step ``step`` of the sweep's job ``job``, in its first attempt."""

    def __init__(self, job: int, step: int):
        self.job, self.step = job, step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.get().job.num == self.job and trainer.global_step == self.step and pl_module.start_step == 0:
            os.kill(os.getpid(), signal.SIGINT)


def _finished(folder):
    metrics = json.loads((folder / "metrics.json").read_text())
    return None if metrics.get("interrupted") else (metrics["steps"], metrics["steps_this_run"])


@pytest.mark.slow
def test_an_interrupted_sweep_resumes_as_printed_and_runs_only_what_is_missing(tmp_path):
    sweep = tmp_path / "sweep"
    send = [f"+callbacks.send._target_={__name__}.SignalInJob", "+callbacks.send.job=1", "+callbacks.send.step=3"]
    args = ["-m", "loss=l1,dssim_l1,ssim", *DATA, "trainer.max_steps=6", "export_ply=false", *send]
    proc = _cli([sys.executable, SCRIPT, *args, f"hydra.sweep.dir={sweep}"], tmp_path)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert _finished(sweep / "0") == (6, 6) and _finished(sweep / "1") is None and not (sweep / "2").exists()
    first = (sweep / "0" / "metrics.json").stat().st_mtime_ns
    said = re.search(
        r"Stopped by SIGINT at step 3 of 6; checkpoint (\S+)\. Resume the sweep with:\n  (.*)\n", proc.stdout
    )
    assert said and said.group(1) == str(sweep / "1" / "checkpoints" / "last.ckpt"), proc.stdout[-3000:]
    resumed = _cli(shlex.split(said.group(2)), tmp_path)  # exactly as printed
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (sweep / "0" / "metrics.json").stat().st_mtime_ns == first  # finished: kept, not run again
    assert _finished(sweep / "1") == (6, 3)  # continued from its checkpoint
    assert _finished(sweep / "2") == (6, 6)  # never started: run now
    assert sorted(os.listdir(tmp_path)) == ["sweep"]  # no other multirun folder


class SignalWhileBuilt(L.Callback):
    """Sends SIGINT to this process while the sweep's job ``job`` is being built (before training),
    once: ``flag`` records that it did."""

    def __init__(self, job: int, flag: str):
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.get().job.num == job and not os.path.exists(flag):
            open(flag, "w").close()
            os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.slow
def test_a_sweep_stopped_while_a_run_starts_prints_the_command_that_resumes_the_sweep(tmp_path):
    sweep = tmp_path / "sweep"
    flag = tmp_path / "signalled"
    send = [
        f"+callbacks.send._target_={__name__}.SignalWhileBuilt",
        "+callbacks.send.job=1",
        f"+callbacks.send.flag={flag}",
    ]
    args = ["-m", "loss=l1,ssim", *DATA, "trainer.max_steps=2", "export_ply=false", *send]
    proc = _cli([sys.executable, SCRIPT, *args, f"hydra.sweep.dir={sweep}"], tmp_path)
    assert proc.returncode == 130 and flag.exists(), proc.stderr[-3000:]
    said = re.search(
        r"Stopped by SIGINT while the run was starting, before training: no checkpoint was saved\. Resume the sweep "
        r"with:\n  (.*)\n",
        proc.stdout,
    )
    assert said, proc.stdout[-3000:]
    resumed = _cli(shlex.split(said.group(1)), tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _finished(sweep / "0") == (2, 2) and _finished(sweep / "1") == (2, 2)
