"""splatloss.report (``splatloss-report``) on run folders written here: finished runs in the table and plot, failed
and interrupted ones listed with the error their log gives, float labels rounded, SSIM axes in [0, 1]."""

import json
import os
import re
import subprocess
import sys

import pytest

from splatloss import report as sweep_report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


COMMON = ["hparams_search=optuna_lambda", "trainer.max_steps=300"]
# Hydra's job log format: "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s".
CRASH_LOG = """\
[2026-11-23 10:11:10,015][lightning.pytorch.utilities.rank_zero][INFO] - `Trainer.fit` stopped early
[2026-11-23 10:11:16,629][splatloss.train][ERROR] - run failed
Traceback (most recent call last):
  File "/x/splatloss/train.py", line 237, in _main
    metrics = train(cfg)
              ^^^^^^^^^^
RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB
[2026-11-23 10:11:16,700][splatloss.train][INFO] - a later line
"""
CONFIG_LOG = (
    "[2026-11-23 10:11:16,629][splatloss.train][ERROR] - could not build the loss from loss=dssim_l1: "
    "ValueError: window_size must be an odd integer >= 3, got 4\n"
)


def _run(root, name, overrides, metrics=None, log=None):
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if metrics is not None:
        (run / "metrics.json").write_text(json.dumps(metrics))
    if log is not None:
        (run / "train.log").write_text(log)
    return run


def _metrics(psnr, ssim, ms_ssim, **extra):
    return {
        "psnr": psnr,
        "ssim": ssim,
        "ms_ssim": ms_ssim,
        "ssim_3dgs": ssim - 0.01,
        "ssim_skimage": ssim - 0.02,
        "psnr_init": 10.0,
        "steps": 300,
        "train_seconds": 12.0,
        "step_seconds": 0.04,
        "loss_share": 0.2,
        "num_gaussians": 1000,
        "interrupted": None,
        **extra,
    }


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "multirun"
    # Two finished Optuna trials (SSIM near 1, where a label above the bar once pushed the axis past 1).
    _run(root, "0", ["loss.lambda_dssim=0.5488135039273248", *COMMON], _metrics(30.1, 0.9991, 0.9996), "")
    _run(root, "1", ["loss.lambda_dssim=0.20000000000000001", *COMMON], _metrics(29.5, 0.9987, 0.9993), "")
    # A crash inside training: the log's ERROR record carries the traceback.
    _run(root, "2", ["loss.lambda_dssim=0.7151893663724195", *COMMON], log=CRASH_LOG)
    # A config error: one ERROR record, no traceback.
    _run(root, "3", ["loss.lambda_dssim=0.6027633760716439", *COMMON], log=CONFIG_LOG)
    # Stopped by SIGTERM: metrics.json exists and says so.
    _run(
        root, "4", ["loss.lambda_dssim=0.5448831829968969", *COMMON],
        _metrics(20.0, 0.8, 0.9, interrupted="SIGTERM", steps=120), "[2026-11-23 10:11:16,700][x][INFO] - step\n",
    )  # fmt: skip
    # Killed before it logged anything (out of memory on the host, a scheduler's time limit).
    _run(root, "5", ["loss.lambda_dssim=0.4236547993389047", *COMMON], log="")
    return root


def test_failed_and_interrupted_runs_are_listed_with_their_error(sweep, tmp_path, capsys):
    out = tmp_path / "report"
    assert sweep_report.main([str(sweep), "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert capsys.readouterr().out.startswith(text)
    table, _, failures = text.partition("Failed or interrupted: 4 of 6 runs")
    assert failures, text
    assert [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| loss")] == [
        "loss.lambda_dssim=0.5488",
        "loss.lambda_dssim=0.2",
    ]
    rows = {line.split("|")[2].strip(): line.split("|")[3].strip() for line in failures.splitlines()[4:]}
    assert sorted(rows) == ["2", "3", "4", "5"], failures
    assert rows["2"] == "no metrics.json: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (train.log)"
    assert rows["3"] == (
        "no metrics.json: could not build the loss from loss=dssim_l1: ValueError: window_size must be an odd "
        "integer >= 3, got 4 (train.log)"
    )
    assert rows["4"] == (
        "interrupted by SIGTERM at step 120; no error in train.log, which ends: "
        "[2026-11-23 10:11:16,700][x][INFO] - step"
    )
    assert rows["5"] == "no metrics.json; train.log is empty (the job failed before logging, or is still running)"
    # The failed runs carry their labels too (rounded), and the shared overrides are stated once.
    assert "| loss.lambda_dssim=0.7152 | 2 |" in failures
    assert "Common to all runs: `hparams_search=optuna_lambda` `trainer.max_steps=300`" in text
    # No float printed with more than 4 significant digits after a '=' anywhere in the report.
    assert not re.search(r"=\d\.\d{5,}", text), text
    png = (out / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_traceback_without_a_log_record_still_names_the_exception(tmp_path):
    run = _run(tmp_path, "0", ["loss=l1"], log="step 3\nTraceback (most recent call last):\n  File \"x\", line 1\n"
               "    f()\nKeyError: 'means'\n")  # fmt: skip
    assert sweep_report.log_error(str(run)) == "KeyError: 'means' (train.log)"
    assert sweep_report.log_error(str(_run(tmp_path, "1", ["loss=l1"], log="[t][n][INFO] - fine\n"))) is None


@pytest.mark.slow
def test_no_finished_run_writes_the_failures_and_exits_1(tmp_path):
    root = tmp_path / "multirun"
    _run(root, "0", ["loss=l1"], log=CONFIG_LOG)
    proc = subprocess.run(
        [sys.executable, "-m", "splatloss.report", str(root)], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 1, proc.stderr
    text = (root / "report.md").read_text()
    assert text.startswith("No run finished.")
    assert "window_size must be an odd integer >= 3, got 4" in text
    assert not (root / "report.png").exists()


@pytest.mark.parametrize(
    "values, digits",
    [
        (["0.5488135039273248", "0.7151893663724195"], ["0.5488", "0.7152"]),
        (["0.20000000000000001", "1e-05", "3.0"], ["0.2", "1e-05", "3.0"]),
        # Two values that 4 digits would merge keep as many digits as tell them apart.
        (["0.123456", "0.123457", "0.5"], ["0.123456", "0.123457", "0.5"]),
        (["0.12341", "0.12349"], ["0.1234", "0.1235"]),
    ],
)
def test_float_labels_are_rounded_but_stay_distinct(values, digits):
    shown = sweep_report.readable_overrides([f"loss.lambda_dssim={v}" for v in values] + ["loss=l1", "seed=12"])
    assert [shown[f"loss.lambda_dssim={v}"] for v in values] == [f"loss.lambda_dssim={d}" for d in digits]
    assert shown["loss=l1"] == "loss=l1" and shown["seed=12"] == "seed=12"


@pytest.mark.parametrize("ssim", [0.9991, 0.55, 0.02])
def test_ssim_axis_stays_within_0_and_1(sweep, tmp_path, ssim):
    rows, _ = sweep_report.collect_all(str(sweep))
    rows[0]["ssim"] = ssim
    fig = sweep_report.plot(rows, str(tmp_path / "p.png"))
    (ax,) = [a for a in fig.axes if "SSIM" in a.get_ylabel()]
    lo, hi = ax.get_ylim()
    assert 0.0 <= lo < min(ssim, 0.9993) and hi == 1.0, (lo, hi)
    # Every value label is drawn inside the axes (none needs room above 1).
    fig.canvas.draw()
    box = ax.get_window_extent()
    assert len(ax.texts) == 2 * len(rows)
    for t in ax.texts:
        ext = t.get_window_extent()
        assert box.y0 <= ext.y0 and ext.y1 <= box.y1, (t.get_text(), ext, box)
