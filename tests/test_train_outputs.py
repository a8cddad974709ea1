"""Every output path is checked writable before step 0, and a finished run whose folder stops
taking files writes its model elsewhere and says where. Real runs, real files; an output folder is
made unwritable by a file in its place (root ignores permission bits) or by chmod (other users)."""

import json
import os
import shutil

import lightning as L
import pytest
import torch
from omegaconf import open_dict
from test_train import make_cfg

from splatloss.train import train

pytestmark = pytest.mark.usefixtures("scenes_built_once")

COMMON = ["loss=l1", "trainer.max_steps=4"]


def _csv(cfg, out_dir):
    with open_dict(cfg):  # the tiny test config drops the logger; put the default CSV logger back
        cfg.logger = {
            "_target_": "splatloss.lightning.runs.ResumableCSVLogger",
            "save_dir": str(out_dir),
            "name": "csv",
        }
    return cfg


@pytest.mark.parametrize(
    "blocked,what",
    [("checkpoints", "checkpoints"), ("renders", "renders"), ("csv", "ResumableCSVLogger log")],
)
def test_an_output_folder_that_cannot_be_written_stops_the_run_before_step_0(tmp_path, blocked, what):
    run = tmp_path / "run"
    run.mkdir()
    (run / blocked).write_text("a file where the run writes a folder")
    folder = run / blocked / ("version_0" if blocked == "csv" else "")
    message = rf"cannot write the {what} to '{str(folder).rstrip('/')}': '{run / blocked}' is a file, not a folder"
    with pytest.raises(ValueError, match=message):
        train(_csv(make_cfg(run, COMMON), run))
    assert sorted(os.listdir(run)) == [blocked]  # nothing trained, nothing written


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_run_folder_stops_the_run_before_step_0(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o555)
    try:
        with pytest.raises(ValueError, match=rf"cannot write the run folder .* to '{run}': Permission denied"):
            train(make_cfg(run, COMMON))
    finally:
        run.chmod(0o755)


class BlockCheckpoints(L.Callback):
    """At the end of training, puts a file where the checkpoints folder was: the run's last
    checkpoint stops being writable there (as a disk or a mount that fails late would)."""

    def __init__(self, folder: str):
        self.folder = folder

    def on_train_end(self, trainer, pl_module):
        shutil.rmtree(self.folder, ignore_errors=True)
        with open(self.folder, "w") as f:
            f.write("not a folder any more")


def test_a_model_that_cannot_be_written_at_the_end_is_written_elsewhere(tmp_path):
    run, rescue = tmp_path / "run", tmp_path / "rescue"
    cfg = make_cfg(run, COMMON + [f"rescue_dir={rescue}"])
    with open_dict(cfg):
        cfg.callbacks.block = {"_target_": "test_train_outputs.BlockCheckpoints", "folder": str(run / "checkpoints")}
    with pytest.raises(OSError, match=rf"{run / 'checkpoints' / 'last.ckpt'} could not be written \(.*\); it is in "
                       rf"{rescue}/[^/]+/last\.ckpt") as info:  # fmt: skip
        train(cfg)
    ((wanted, written, _),) = info.value.rescued
    assert torch.load(written, weights_only=True)["global_step"] == 4  # the trained model, whole
    # The rest of the run still went where it belongs.
    assert json.loads((run / "metrics.json").read_text())["steps"] == 4
    assert (run / "point_cloud.ply").is_file()
