"""Scale-out through the real entry point: a 2-process DDP run (gloo, CPU) and a Hydra multirun
turned into the sweep report. Each runs ``scripts/train.py`` in a fresh process, as a user would."""

import json
import os
import subprocess
import sys

import pytest
from test_train import ROOT, TINY

TRAIN = os.path.join(ROOT, "scripts", "train.py")


def _run(args, cwd, timeout=600):
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.mark.slow
def test_ddp_two_cpu_processes(tmp_path):
    run_dir = tmp_path / "ddp"
    _run(
        [
            TRAIN,
            "trainer=ddp",
            "trainer.max_steps=6",
            "loss=dssim_l1",
            "export_ply=false",
            f"hydra.run.dir={run_dir}",
            *TINY,
        ],
        cwd=tmp_path,
    )
    m = json.loads((run_dir / "metrics.json").read_text())
    assert m["world_size"] == 2
    assert m["steps"] == 6
    assert m["num_gaussians"] == 400  # no densification under DDP
    assert m["psnr"] > m["psnr_init"]
    # Both ranks trained the same replicated model: the checkpoint rank 0 wrote is the final state.
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_multirun_and_sweep_report(tmp_path):
    sweep = tmp_path / "sweep"
    _run(
        [
            TRAIN,
            "-m",
            "loss=l1,dssim_l1,msssim_l1",
            "trainer.max_steps=8",
            "export_ply=false",
            f"hydra.sweep.dir={sweep}",
            *TINY,
        ],
        cwd=tmp_path,
    )
    runs = sorted(p for p in os.listdir(sweep) if p.isdigit())
    assert runs == ["0", "1", "2"]
    losses = [json.loads((sweep / r / "metrics.json").read_text())["loss_name"] for r in runs]
    assert losses == ["l1", "dssim_l1", "msssim_l1"]
    proc = _run(["-m", "splatloss.report", str(sweep)], cwd=ROOT)
    table = (sweep / "report.md").read_text()
    assert proc.stdout.startswith(table)
    held = table.split("### Held-out metrics", 1)[1].split("\n\n")[1].splitlines()
    assert held[0].startswith("| # | configuration | seeds | PSNR (dB) ↑ | SSIM ↑ |")
    labels = ["L1", "D-SSIM + L1 (λ = 0.2)", "MS-SSIM + L1 (α = 0.84)"]
    assert [line.split("|")[2].strip() for line in held[2:]] == labels
    assert "Common to all runs: `trainer.max_steps=8`" in table
    for r, line in zip(runs, held[2:]):
        psnr = json.loads((sweep / r / "metrics.json").read_text())["psnr"]
        assert line.split("|")[4].strip() == f"{psnr:.2f}"  # one seed each: the value, no interval
    png = (sweep / "figures" / "metrics.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


@pytest.mark.slow
def test_sweep_report_errors(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "splatloss.report", str(tmp_path / "nope")], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode != 0 and "is not a directory" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "splatloss.report", str(tmp_path)], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode != 0 and "no metrics.json under" in proc.stderr


@pytest.mark.slow
def test_joblib_launcher_runs_a_sweep(tmp_path):
    sweep = tmp_path / "sweep"
    _run(
        [
            TRAIN,
            "-m",
            "hydra/launcher=local",
            "hydra.launcher.n_jobs=2",
            "loss=l1,ssim",
            "trainer.max_steps=4",
            "export_ply=false",
            f"hydra.sweep.dir={sweep}",
            *TINY,
        ],
        cwd=tmp_path,
    )
    names = sorted(json.loads((sweep / r / "metrics.json").read_text())["loss_name"] for r in ("0", "1"))
    assert names == ["l1", "ssim"]


@pytest.mark.slow
def test_optuna_search_over_lambda(tmp_path):
    sweep = tmp_path / "optuna"
    _run(
        [
            TRAIN,
            "-m",
            "hparams_search=optuna_lambda",
            "hydra.sweeper.n_trials=2",
            "trainer.max_steps=4",
            "export_ply=false",
            f"hydra.sweep.dir={sweep}",
            *TINY,
        ],
        cwd=tmp_path,
    )
    trials = [json.loads((sweep / r / "metrics.json").read_text()) for r in ("0", "1")]
    lambdas = [t["loss"]["lambda_dssim"] for t in trials]
    assert all(0.0 <= lam <= 1.0 for lam in lambdas) and lambdas[0] != lambdas[1]
    results = (sweep / "optimization_results.yaml").read_text()
    best = max(trials, key=lambda t: t["psnr"])
    assert f"best_value: {best['psnr']}" in results
