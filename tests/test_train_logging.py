"""What a run logs: every metrics.csv row's loss terms and weights belong to the same step as its loss."""

import csv
import math

from omegaconf import open_dict
from test_train import make_cfg

from splatloss.train import train


def _rows(out_dir):
    (path,) = list(out_dir.glob("csv/version_*/metrics.csv"))
    with open(path) as f:
        return list(csv.DictReader(f))


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
