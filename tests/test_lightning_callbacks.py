"""The callbacks on another project's LightningModule: one that fits an image with a PhotometricLoss.

Real Lightning Trainer, real CSV logger, real PhotometricLoss and metrics; nothing of SplatModule.
"""

import csv
import glob
import math

import lightning as L
import matplotlib.image as mpimg
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import splatloss
from splatloss.lightning import HeldOutMetrics, LossTerms
from splatloss.lightning.callbacks import interpolate_schedule, ms_ssim_weights_for
from splatloss.losses import PhotometricLoss


def _photo(size=48):
    from skimage import data
    from skimage.transform import resize

    img = resize(data.astronaut(), (size, size), anti_aliasing=True)
    return torch.tensor(img, dtype=torch.float32).permute(2, 0, 1)[None]  # [1, 3, H, W]


class FitImage(L.LightningModule):
    """Someone else's module: its own names, automatic optimization, a PhotometricLoss attribute."""

    def __init__(self, target, return_dict=True):
        super().__init__()
        self.canvas = nn.Parameter(torch.full_like(target, 0.5))
        self.register_buffer("target", target)
        self.criterion = PhotometricLoss.dssim_l1()
        self.return_dict = return_dict

    def training_step(self, batch, batch_idx):
        return self.criterion(self.canvas, self.target)

    def validation_step(self, batch, batch_idx):
        pred = self.canvas.detach().clamp(0, 1)
        return {"pred": pred, "target": self.target, "name": f"img{batch_idx}"} if self.return_dict else pred

    def configure_optimizers(self):
        return torch.optim.Adam([self.canvas], lr=0.05)

    def train_dataloader(self):
        return DataLoader(list(range(12)), batch_size=1)

    def val_dataloader(self):
        return DataLoader([0], batch_size=1)


class WeightProbe(L.Callback):
    def __init__(self):
        self.seen = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append((trainer.global_step, dict(pl_module.criterion.weights)))


def _trainer(tmp_path, callbacks, steps=12):
    return L.Trainer(
        accelerator="cpu",
        max_steps=steps,
        callbacks=callbacks,
        default_root_dir=str(tmp_path),
        logger=L.pytorch.loggers.CSVLogger(str(tmp_path), name="csv"),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        check_val_every_n_epoch=1000,
    )


def test_loss_terms_schedules_and_logs_on_a_foreign_module(tmp_path):
    module = FitImage(_photo())
    schedule = {"dssim": [[0, 0.0], [10, 0.5]]}
    probe = WeightProbe()
    trainer = _trainer(tmp_path, [LossTerms(schedules=schedule, loss_attr="criterion"), probe])
    trainer.fit(module)
    assert [s for s, _ in probe.seen] == list(range(12))
    for step, weights in probe.seen:
        assert weights["dssim"] == pytest.approx(interpolate_schedule(schedule["dssim"], step), abs=1e-12)
        assert weights["l1"] == 0.8  # unscheduled terms keep their weight
    rows = list(csv.DictReader(open(glob.glob(str(tmp_path / "csv" / "*" / "metrics.csv"))[0])))
    logged = [r for r in rows if r.get("loss/l1")]
    assert len(logged) == 12
    assert {"loss/l1", "loss/dssim", "weight/l1", "weight/dssim"} <= set(rows[0].keys())
    assert [float(r["weight/dssim"]) for r in logged][-1] == pytest.approx(0.5)
    # The logged terms are the loss's own values: L1 of the first step is |0.5 - target| averaged.
    first_l1 = float(logged[0]["loss/l1"])
    assert first_l1 == pytest.approx(float((0.5 - _photo()).abs().mean()), rel=1e-5)


def test_loss_terms_reject_unknown_terms_and_modules_without_a_loss(tmp_path):
    trainer = _trainer(tmp_path, [LossTerms(schedules={"lpips": [[0, 0.1]]}, loss_attr="criterion")], steps=1)
    with pytest.raises(ValueError, match=r"schedules name terms the loss does not have: \['lpips'\]"):
        trainer.fit(FitImage(_photo()))

    class NoLoss(FitImage):
        def __init__(self, target):
            super().__init__(target)
            del self.criterion

        def training_step(self, batch, batch_idx):
            return (self.canvas - self.target).abs().mean()

    trainer = _trainer(tmp_path, [LossTerms()], steps=1)
    with pytest.raises(ValueError, match="expected the LightningModule to hold exactly one PhotometricLoss .* found 0"):
        trainer.fit(NoLoss(_photo()))


def test_held_out_metrics_match_the_definitions_and_save_renders(tmp_path):
    target = _photo()
    module = FitImage(target)
    with torch.no_grad():
        module.canvas.copy_(
            (target + 0.1 * torch.randn(target.shape, generator=torch.Generator().manual_seed(0))).clamp(0, 1)
        )
    metrics = HeldOutMetrics(dirpath=str(tmp_path / "renders"))
    metrics.tag = "check"
    res = _trainer(tmp_path, [metrics]).validate(module, verbose=False)[0]
    pred = module.canvas.detach().clamp(0, 1)
    mse = float(((pred - target) ** 2).mean())
    assert res["val/psnr"] == pytest.approx(-10 * math.log10(mse), rel=1e-5)
    assert res["val/ssim"] == pytest.approx(float(splatloss.ssim(pred, target)), rel=1e-6)
    w = ms_ssim_weights_for(48)
    assert len(w) == 3
    assert res["val/ms_ssim"] == pytest.approx(float(splatloss.ms_ssim(pred, target, weights=w)), rel=1e-6)
    assert metrics.last["ms_ssim_scales"] == 3 and metrics.last["num_views"] == 1
    side = mpimg.imread(tmp_path / "renders" / "check" / "img0.png")
    assert side.shape[:2] == (48, 96)  # prediction | ground truth
    gt = target[0].permute(1, 2, 0).numpy()
    assert abs(side[:, 48:, :3] - gt).max() < 1.5 / 255  # 8-bit PNG round-off
    # and the left half is the prediction (not a second copy of the target: they differ by ~0.1)
    assert abs(side[:, :48, :3] - pred[0].permute(1, 2, 0).numpy()).max() < 1.5 / 255
    assert abs(side[:, :48, :3] - gt).max() > 0.05


def test_held_out_metrics_need_pred_and_target(tmp_path):
    with pytest.raises(ValueError, match="validation_step must return a dict with 'pred' and 'target'"):
        _trainer(tmp_path, [HeldOutMetrics(save_renders=False)]).validate(
            FitImage(_photo(), return_dict=False), verbose=False
        )


def test_step_progress_bar_labels_training_not_epoch_minus_two():
    from splatloss.lightning import StepProgressBar

    bar = StepProgressBar()
    label = bar._get_train_description(current_epoch=0)
    assert label.strip() == "Training"
    assert "-2" not in label


def test_lambda_dssim_schedule_moves_both_terms_and_a_term_schedule_only_its_own(tmp_path):
    module = FitImage(_photo())
    schedule = {"lambda_dssim": [[0, 0.0], [10, 0.6]]}
    probe = WeightProbe()
    _trainer(tmp_path, [LossTerms(schedules=schedule, loss_attr="criterion"), probe]).fit(module)
    for step, weights in probe.seen:
        lam = interpolate_schedule(schedule["lambda_dssim"], step)
        assert weights["dssim"] == pytest.approx(lam, abs=1e-12)
        assert weights["l1"] == pytest.approx(1.0 - lam, abs=1e-12)
    # A schedule on one named term still moves only that term.
    module, probe = FitImage(_photo()), WeightProbe()
    _trainer(tmp_path, [LossTerms(schedules={"dssim": [[0, 0.0], [10, 0.6]]}, loss_attr="criterion"), probe]).fit(
        module
    )
    assert {w["l1"] for _, w in probe.seen} == {0.8}


@pytest.mark.parametrize(
    "schedules, message",
    [
        ({"lambda_dssim": [[0, 0.2]], "dssim": [[0, 0.1]]}, r"a lambda_dssim schedule sets the l1 and dssim weights"),
        ({"lambda_dssim": [[0, 0.2], [5, 1.5]]}, r"lambda_dssim must stay in \[0, 1\]"),
    ],
)
def test_lambda_dssim_schedule_errors(tmp_path, schedules, message):
    trainer = _trainer(tmp_path, [LossTerms(schedules=schedules, loss_attr="criterion")], steps=1)
    with pytest.raises(ValueError, match=message):
        trainer.fit(FitImage(_photo()))
