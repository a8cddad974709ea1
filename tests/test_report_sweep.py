"""The loss ablation as a user runs it: ``experiment=loss_ablation`` sweeps every loss over seeds (a
composed config, then a real tiny multirun through ``scripts/train.py``), and ``splatloss-report``
turns the sweep folder into its tables, figures and page."""

import csv
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from scipy import stats

from splatloss.report import runs
from splatloss.train import CONFIG_DIR

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "scripts", "train.py")
SMALL = [
    "trainer=cpu",
    "trainer.max_steps=4",
    "eval_every_n_steps=2",
    "data.scene.image_size=32",
    "data.scene.n_train=4",
    "data.scene.n_test=2",
    "data.scene.n_points=300",
    "data.scene.supersample=2",
    "export_ply=false",
    "trainer.enable_progress_bar=false",
]


def _sweeper_params(overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
    return dict(cfg.hydra.sweeper.params)


def test_loss_ablation_runs_every_loss_over_three_seeds():
    assert _sweeper_params(["experiment=loss_ablation"]) == {"loss": "l1,dssim_l1,msssim_l1", "seed": "range(0,3)"}
    assert _sweeper_params(["experiment=loss_ablation", "seeds=5"])["seed"] == "range(0,5)"


@pytest.mark.slow
def test_loss_ablation_sweep_and_its_report(tmp_path):
    sweep = tmp_path / "sweep"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, TRAIN, "experiment=loss_ablation", "seeds=2", *SMALL, f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    folders = sorted((p for p in os.listdir(sweep) if p.isdigit()), key=int)
    metrics = [json.loads((sweep / f / "metrics.json").read_text()) for f in folders]
    # The losses of one seed run one after another (a drift in the machine's load hits them alike).
    assert [(m["loss_name"], m["seed"]) for m in metrics] == [
        (loss, seed) for seed in (0, 1) for loss in ("l1", "dssim_l1", "msssim_l1")
    ]
    by_loss = {loss: [m for m in metrics if m["loss_name"] == loss] for loss in ("l1", "dssim_l1", "msssim_l1")}
    # Held-out PSNR before training, after steps 2 and 4 (during training), and at the end.
    curve = runs.read_curves(str(sweep / "0"))["psnr"]
    assert curve.steps.tolist() == [0, 2, 4]
    assert curve.values[0] == pytest.approx(metrics[0]["psnr_init"]) and curve.values[-1] == pytest.approx(
        metrics[0]["psnr"]
    )

    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "splatloss.report", str(sweep), "--out", str(out), "--baseline", "loss=l1"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    md = (out / "report.md").read_text()
    assert proc.stdout.startswith(md)
    assert "6 runs in 3 configurations, seeds 0, 1; baseline: group 1 (L1)." in md
    rows = {r["label"]: r for r in csv.DictReader(open(out / "summary.csv")) if r["quantity"] == "psnr"}
    assert list(rows) == ["L1", "D-SSIM + L1 (λ = 0.2)", "MS-SSIM + L1 (α = 0.84)"]
    for i, label in enumerate(rows):
        x = np.array([m["psnr"] for m in list(by_loss.values())[i]])
        half = stats.t.ppf(0.975, 1) * x.std(ddof=1) / math.sqrt(2)
        assert float(rows[label]["mean"]) == pytest.approx(x.mean(), abs=1e-9)
        assert float(rows[label]["ci95_high"]) == pytest.approx(x.mean() + half, abs=1e-9)
        assert f"| {i + 1} | {label} | 2 | {x.mean():.2f} ± {half:.2f} |" in md
        if i:
            d = x - np.array([m["psnr"] for m in by_loss["l1"]])
            assert float(rows[label]["diff_mean"]) == pytest.approx(d.mean(), abs=1e-9)
            assert rows[label]["diff_pairs"] == "2"
    for name in ("metrics", "differences", "convergence", "step_time"):
        assert (out / "figures" / f"{name}.pdf").stat().st_size > 1000, name
        assert (out / "figures" / f"{name}.png").stat().st_size > 1000, name
    tex = (out / "report.tex").read_text()
    assert r"\toprule" in tex and r"D-SSIM + L1 ($\lambda$ = 0.2)" in tex
    html = (out / "report.html").read_text()
    # The two held-out views, each the ground truth and the three losses, in full and cropped.
    assert html.count("<h4>test_00") == 2 and html.count("<img class='full'") == 2 * 4
    assert html.count("<img class='crop'") == 2 * 4
