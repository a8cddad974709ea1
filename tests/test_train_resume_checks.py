"""What a run refuses before it trains or writes anything: a checkpoint trained under another
configuration, a checkpoint that cannot be read or does not fit the model, a fresh run in a folder
that holds a trained run. Real runs through ``train(cfg)``, real checkpoint files."""

import csv
import os
import shutil

import pytest
import torch
from omegaconf import open_dict
from test_train import make_cfg

from splatloss.train import train

pytestmark = pytest.mark.usefixtures("scenes_built_once")

COMMON = ["loss=l1", "trainer.max_steps=4"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 4-step run folder (checkpoints/last.ckpt, point_cloud.ply, metrics.json, renders)."""
    run = tmp_path_factory.mktemp("finished") / "run"
    train(make_cfg(run, COMMON))
    return run


def _copy(run, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    return dst


def _state(folder):
    """Every file under ``folder`` with its size and modification time."""
    out = {}
    for root, _, files in os.walk(folder):
        for f in files:
            st = os.stat(os.path.join(root, f))
            out[os.path.relpath(os.path.join(root, f), folder)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.parametrize(
    "changed,differs",
    [
        (
            ["loss=dssim_l1"],
            r"loss\._target_: splatloss\.losses\.PhotometricLoss -> splatloss\.losses\.PhotometricLoss\.dssim_l1; "
            r".*loss\.lambda_dssim: <absent> -> 0\.2",
        ),
        (["data.scene.n_points=300"], r"data\.scene\.n_points: 400 -> 300"),
        (["model.lr.colors=0.05"], r"model\.lr\.colors: 0\.02 -> 0\.05"),
        (["seed=1"], r"seed: 0 -> 1"),
    ],
)
def test_resuming_under_another_configuration_is_refused_naming_the_keys(finished, tmp_path, changed, differs):
    run = _copy(finished, tmp_path)
    before = _state(run)
    ckpt = run / "checkpoints" / "last.ckpt"
    with pytest.raises(ValueError, match=rf"checkpoint '{ckpt}' was trained with another configuration; these keys "
                       rf"differ \(checkpoint -> now\): .*{differs}.*resume_allow_changes=true") as info:  # fmt: skip
        train(make_cfg(run, COMMON + changed + ["trainer.max_steps=6", "resume=true"]))
    assert "trainer.max_steps" not in str(info.value)  # extending a run is the same run
    assert _state(run) == before  # nothing trained, nothing written


def test_a_changed_configuration_resumes_when_allowed(finished, tmp_path):
    run = _copy(finished, tmp_path)
    over = ["loss=dssim_l1", "trainer.max_steps=6", "resume=true", "resume_allow_changes=true"]
    metrics = train(make_cfg(run, [o for o in COMMON if not o.startswith("loss=")] + over))
    assert metrics["steps"] == 6 and metrics["steps_this_run"] == 2
    assert metrics["loss"]["_target_"].endswith("dssim_l1")


@pytest.mark.parametrize(
    "changed,weights",
    [
        (["loss=dssim_l1"], {"l1": 0.8, "dssim": 0.2}),
        (["loss=dssim_l1", "loss.lambda_dssim=0.5"], {"l1": 0.5, "dssim": 0.5}),
    ],
)
def test_an_allowed_change_of_loss_trains_with_the_new_weights(finished, tmp_path, changed, weights):
    # The checkpoint was trained with pure L1; the resumed steps must use the weights configured now,
    # the ones metrics.json records.
    run = _copy(finished, tmp_path)
    over = changed + ["trainer.max_steps=6", "trainer.log_every_n_steps=1", "resume=true", "resume_allow_changes=true"]
    cfg = make_cfg(run, [o for o in COMMON if not o.startswith("loss=")] + over)
    with open_dict(cfg):
        cfg.logger = {"_target_": "lightning.pytorch.loggers.CSVLogger", "save_dir": str(run), "name": "csv"}
    metrics = train(cfg)
    (log,) = list(run.glob("csv/version_*/metrics.csv"))
    with open(log) as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/loss")]
    assert len(rows) == 2, rows  # steps 5 and 6, the resumed ones
    for row in rows:
        trained = {k: float(row[f"weight/{k}"]) for k in weights}
        assert trained == pytest.approx(weights, abs=1e-7), row
        total = sum(float(row[f"weight/{t}"]) * float(row[f"loss/{t}"]) for t in weights)
        assert float(row["train/loss"]) == pytest.approx(total, rel=1e-5), row
    assert metrics["loss"]["lambda_dssim"] == weights["dssim"]


def test_a_checkpoint_from_another_run_folder_is_checked_too(finished, tmp_path):
    ckpt = finished / "checkpoints" / "last.ckpt"
    with pytest.raises(ValueError, match=r"these keys differ \(checkpoint -> now\): model\.sh_degree: 0 -> 1"):
        train(make_cfg(tmp_path / "new", COMMON + ["model.sh_degree=1", f"ckpt_path={ckpt}"]))
    assert not (tmp_path / "new").exists()


def test_a_checkpoint_of_another_sh_degree_is_named_before_anything_is_written(finished, tmp_path):
    # Allowed to change the configuration, the checkpoint still has to fit the model.
    ckpt = finished / "checkpoints" / "last.ckpt"
    over = ["model.sh_degree=1", f"ckpt_path={ckpt}", "resume_allow_changes=true"]
    with pytest.raises(
        ValueError,
        match=rf"checkpoint '{ckpt}' does not fit the model: gaussians\.sh_rest \(400, 3, 3\) is missing from the "
        r"checkpoint; the checkpoint has spherical harmonics of degree 0, the model 1: set model\.sh_degree=0",
    ):
        train(make_cfg(tmp_path / "new", COMMON + over))
    assert not (tmp_path / "new").exists()


def test_check_checkpoint_is_public_for_other_entry_points(finished):
    from splatloss.lightning import SplatModule
    from splatloss.lightning.checkpoint_io import check_checkpoint
    from splatloss.splat.gaussians import Gaussians

    ckpt = str(finished / "checkpoints" / "last.ckpt")
    g = Gaussians.from_points(torch.zeros(7, 3), torch.zeros(7, 3), sh_degree=2)
    lr = dict(means=1e-3, quats=1e-3, log_scales=1e-3, opacity_logits=1e-3, colors=1e-3, sh_rest=1e-3)
    module = SplatModule(g, loss=torch.nn.L1Loss(), lr=lr)
    with pytest.raises(ValueError, match=r"degree 0, the model 2: set model\.sh_degree=0"):
        check_checkpoint(ckpt, module)
    assert check_checkpoint(ckpt)["global_step"] == 4  # readable; no model given, no shape check


@pytest.mark.parametrize("keep", [0.5, 0.0])
def test_a_truncated_checkpoint_is_named_before_anything_is_written(finished, tmp_path, keep):
    data = (finished / "checkpoints" / "last.ckpt").read_bytes()
    bad = tmp_path / "cut.ckpt"
    bad.write_bytes(data[: int(len(data) * keep)])
    size = int(len(data) * keep)
    message = rf"checkpoint '{bad}' \({size} bytes\) cannot be read \(.*\): the file is truncated or not a checkpoint"
    with pytest.raises(ValueError, match=message):
        train(make_cfg(tmp_path / "new", COMMON + [f"ckpt_path={bad}"]))
    assert not (tmp_path / "new").exists()


def test_a_fresh_run_refuses_a_folder_holding_a_trained_run(finished, tmp_path):
    run = _copy(finished, tmp_path)
    before = _state(run)
    with pytest.raises(
        ValueError,
        match=rf"the run folder '{run}' already holds a trained run \({run / 'checkpoints' / 'last.ckpt'}, "
        rf"{run / 'point_cloud.ply'}\); a fresh run there would overwrite it\. Continue that run with resume=true",
    ):
        train(make_cfg(run, COMMON))
    assert _state(run) == before


def test_a_checkpoint_without_the_losss_state_resumes_with_the_weights_it_recorded(finished, tmp_path):
    # Checkpoints of splatloss versions whose PhotometricLoss kept no state: the weights are in
    # checkpoint["splatloss"]["loss_weights"] only.
    run = _copy(finished, tmp_path)
    ckpt = run / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, weights_only=True)
    removed = [k for k in list(state["state_dict"]) if k.startswith("loss.")]
    for k in removed:
        del state["state_dict"][k]
    assert removed
    state["splatloss"]["loss_weights"]["l1"] = 0.5  # as a schedule or callback had set it
    torch.save(state, ckpt)
    cfg = make_cfg(run, COMMON + ["trainer.max_steps=5", "trainer.log_every_n_steps=1", "resume=true"])
    with open_dict(cfg):
        cfg.logger = {"_target_": "lightning.pytorch.loggers.CSVLogger", "save_dir": str(run), "name": "csv"}
    metrics = train(cfg)
    assert metrics["steps"] == 5 and metrics["steps_this_run"] == 1
    (log,) = list(run.glob("csv/version_*/metrics.csv"))
    with open(log) as f:
        (row,) = [r for r in csv.DictReader(f) if r.get("train/loss")]
    assert float(row["weight/l1"]) == 0.5, row
