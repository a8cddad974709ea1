"""What a run logs: every metrics.csv row's loss terms and weights belong to the same step as its loss."""

import csv
import json
import math
import re

import pytest
import torch
from omegaconf import open_dict
from test_train import make_cfg

from splatloss.train import train

pytestmark = pytest.mark.usefixtures("scenes_built_once")


def _rows(out_dir):
    (path,) = list(out_dir.glob("csv/version_*/metrics.csv"))
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_every_logged_loss_is_the_weighted_sum_of_the_terms_logged_beside_it(tmp_path):
    # A schedule makes the weights change every step, so a term or weight from another step shows.
    cfg = make_cfg(
        tmp_path,
        [
            "loss=dssim_l1",
            "trainer.max_steps=40",
            "trainer.log_every_n_steps=5",
            "+callbacks.loss_terms.schedules.dssim=[[0,0.0],[40,0.8]]",
            "export_ply=false",
        ],
    )
    with open_dict(cfg):  # the tiny test config drops the logger; put the default CSV logger back
        cfg.logger = {"_target_": "lightning.pytorch.loggers.CSVLogger", "save_dir": str(tmp_path), "name": "csv"}
    train(cfg)
    rows = [r for r in _rows(tmp_path) if r.get("train/loss")]
    assert len(rows) >= 7, rows
    terms = sorted(k.split("/", 1)[1] for k in rows[0] if k.startswith("loss/"))
    assert terms == ["dssim", "l1"], rows[0].keys()
    for row in rows:
        assert all(row[f"loss/{t}"] and row[f"weight/{t}"] for t in terms), row
        total = sum(float(row[f"weight/{t}"]) * float(row[f"loss/{t}"]) for t in terms)
        # float32 loss vs. the sum of float32 terms printed to CSV: agree to ~1e-7 relative.
        assert math.isclose(float(row["train/loss"]), total, rel_tol=1e-5, abs_tol=1e-7), row


def _ssim_3dgs_truth(img1, img2):
    """3D Gaussian Splatting's ``utils/loss_utils.py`` ``ssim`` (what its ``metrics.py`` reports),
    transcribed in float64: 11x11 Gaussian window (sigma 1.5) applied with ``conv2d(padding=5)``
    (zero "same" padding), population variances, the mean of the map per image."""
    import torch.nn.functional as F

    x, y = img1.double(), img2.double()
    c = x.shape[1]
    g = torch.exp(-((torch.arange(11, dtype=torch.float64) - 5) ** 2) / (2 * 1.5**2))
    g = g / g.sum()
    w = (g[:, None] @ g[None, :]).expand(c, 1, 11, 11).contiguous()

    def f(t):
        return F.conv2d(t, w, padding=5, groups=c)

    mu1, mu2 = f(x), f(y)
    s11, s22, s12 = f(x * x) - mu1**2, f(y * y) - mu2**2, f(x * y) - mu1 * mu2
    c1, c2 = 0.01**2, 0.03**2
    m = ((2 * mu1 * mu2 + c1) * (2 * s12 + c2)) / ((mu1**2 + mu2**2 + c1) * (s11 + s22 + c2))
    return m.flatten(1).mean(1)


def _skimage_default(img1, img2):
    """``skimage.metrics.structural_similarity`` with its defaults (7x7 uniform window, sample
    covariance), per image of a ``(B, C, H, W)`` batch."""
    from skimage.metrics import structural_similarity

    return torch.tensor(
        [
            structural_similarity(
                a.permute(1, 2, 0).double().numpy(), b.permute(1, 2, 0).double().numpy(), data_range=1.0, channel_axis=2
            )
            for a, b in zip(img1, img2)
        ],
        dtype=torch.float64,
    )


def test_ssim_conventions_equal_3dgs_and_skimage():
    from test_lightning_callbacks import _photo

    from splatloss.lightning.callbacks import ssim_3dgs, ssim_skimage

    target = torch.cat([_photo(48), _photo(48).flip(-1)])
    pred = (target + 0.1 * torch.randn(target.shape, generator=torch.Generator().manual_seed(1))).clamp(0, 1)
    # float64 inputs: the same numbers as the references up to float64 round-off (measured <= 4.5e-16).
    assert torch.allclose(ssim_skimage(pred.double(), target.double()), _skimage_default(pred, target), atol=1e-12)
    assert torch.allclose(ssim_3dgs(pred.double(), target.double()), _ssim_3dgs_truth(pred, target), atol=1e-12)
    # float32 inputs, fp32 accumulation: measured <= 1.2e-7 from the float64 references.
    assert torch.allclose(ssim_skimage(pred, target).double(), _skimage_default(pred, target), atol=1e-6, rtol=0)
    assert torch.allclose(ssim_3dgs(pred, target).double(), _ssim_3dgs_truth(pred, target), atol=1e-6, rtol=0)


def test_held_out_metrics_log_both_ssims_papers_quote(tmp_path):
    from test_lightning_callbacks import FitImage, _photo, _trainer

    from splatloss import ssim
    from splatloss.lightning import HeldOutMetrics

    target = _photo()
    module = FitImage(target)
    with torch.no_grad():
        module.canvas.copy_(
            (target + 0.1 * torch.randn(target.shape, generator=torch.Generator().manual_seed(0))).clamp(0, 1)
        )
    res = _trainer(tmp_path, [HeldOutMetrics(save_renders=False)]).validate(module, verbose=False)[0]
    pred = module.canvas.detach().clamp(0, 1)
    ref_3dgs = float(_ssim_3dgs_truth(pred, target)[0])
    ref_skimage = float(_skimage_default(pred, target)[0])
    assert res["val/ssim_3dgs"] == pytest.approx(ref_3dgs, abs=1e-6)
    assert res["val/ssim_skimage"] == pytest.approx(ref_skimage, abs=1e-6)
    assert res["val/ssim"] == pytest.approx(float(ssim(pred, target)), abs=1e-7)  # splatloss's default, as before
    # Three conventions, three different numbers on a 48x48 image (not one value under three names).
    values = sorted([res["val/ssim"], res["val/ssim_3dgs"], res["val/ssim_skimage"]])
    assert values[1] - values[0] > 1e-3 and values[2] - values[1] > 1e-3, values


@pytest.mark.slow
def test_metrics_json_names_every_ssim_convention(tmp_path):
    cfg = make_cfg(tmp_path, ["loss=dssim_l1", "trainer.max_steps=10", "export_ply=false"])
    train(cfg)
    m = json.loads((tmp_path / "metrics.json").read_text())
    for key in ("ssim", "ssim_3dgs", "ssim_skimage"):
        for k in (key, f"{key}_init"):
            assert 0.0 < m[k] <= 1.0, (k, m.get(k))
    assert len({m["ssim"], m["ssim_3dgs"], m["ssim_skimage"]}) == 3, m


@pytest.mark.slow
def test_progress_bar_shows_loss_and_step_time_not_the_logger_version(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)  # output to a file (pytest's capture): one wide line
    cfg = make_cfg(tmp_path, ["loss=dssim_l1", "trainer.max_steps=10", "export_ply=false"])
    with open_dict(cfg):  # a logger gives Lightning's bar a v_num to show
        cfg.logger = {"_target_": "lightning.pytorch.loggers.CSVLogger", "save_dir": str(tmp_path), "name": "csv"}
    train(cfg)
    out = capsys.readouterr().out
    bars = [line for line in out.splitlines() if line.startswith("Training") and "10/10" in line]
    assert bars, out
    assert re.search(r" loss: \d\.\d{4} ms/step: \d+\.\d Gaussians: 400 loss share: \d+%", bars[-1]), bars[-1]
    assert "v_num" not in out and "it/s" not in bars[-1], bars[-1]
