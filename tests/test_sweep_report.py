"""splatloss.report (``splatloss-report``) on sweep folders written here the way real runs write them
(``.hydra/overrides.yaml`` and ``config.yaml``, ``metrics.json``, Lightning's ``csv/version_0/metrics.csv``,
``renders/final/<view>.png``, Hydra's ``train.log``): runs grouped by configuration over seeds, statistics
checked against the textbook formulas, paired differences, every output file, failed runs."""

import csv
import json
import math
import os
import re

import matplotlib.image as mpimg
import numpy as np
import pytest
import yaml
from scipy import stats

from splatloss import report as sweep_report
from splatloss.report import figures, page, runs
from splatloss.report.labels import loss_label, tex
from splatloss.report.stats import describe, group_runs, paired, quantities

LOSSES = {
    "l1": {"_target_": "splatloss.losses.PhotometricLoss", "l1": 1.0, "padding": "valid", "window_size": 11},
    "dssim_l1": {"_target_": "splatloss.losses.PhotometricLoss.dssim_l1", "lambda_dssim": 0.2, "padding": "same"},
    "msssim_l1": {"_target_": "splatloss.losses.PhotometricLoss.msssim_l1", "alpha": 0.84, "padding": "same"},
}
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
CSV_HEADER = (
    "epoch,loss/l1,loss_share,num_gaussians,step,step_ms,train/loss,val/ms_ssim,val/psnr,val/ssim,"
    "val/ssim_3dgs,val/ssim_skimage,weight/l1"
)


def _metrics(loss, seed, psnr, steps=300, **extra):
    """A metrics.json as splatloss.train writes it (every key of a real run)."""
    m = {
        "image_size": [16, 16], "interrupted": None, "loss": LOSSES[loss], "loss_name": loss,
        "loss_seconds": 0.002, "loss_share": 0.05, "ms_ssim": 0.9 + psnr / 1000, "ms_ssim_init": 0.6,
        "ms_ssim_scales": 2, "num_gaussians": 3000, "num_gaussians_init": 3000, "num_test_views": 2,
        "num_train_views": 4, "optim_seconds": 0.003, "psnr": psnr, "psnr_init": 14.38,
        "render_backward_seconds": 0.015, "render_seconds": 0.02, "resumed_from": None, "seed": seed,
        "ssim": 0.8 + psnr / 1000, "ssim_3dgs": 0.81 + psnr / 1000, "ssim_3dgs_init": 0.3, "ssim_init": 0.3,
        "ssim_skimage": 0.82 + psnr / 1000, "ssim_skimage_init": 0.3, "step_seconds": 0.04, "steps": steps,
        "steps_this_run": steps, "timed_steps": steps - 3, "train_seconds": 12.0 + seed,
        "train_seconds_this_run": 12.0 + seed, "world_size": 1, "lr": {"means": 0.00016},
    }  # fmt: skip
    m.update(extra)
    return m


def _csv(psnr_curve, every, steps):
    """Lightning's CSVLogger rows: held-out rows before training, after every ``every`` steps (at the
    step's 0-based index), after training (next epoch, at the step count); training rows every 10."""
    rows = [CSV_HEADER, f"0,,,,0,,,0.6,{psnr_curve[0]},0.3,0.3,0.3,"]
    k = 1
    for s in range(1, steps + 1):
        if s % 10 == 0:
            rows.append(f"0,0.1,0.05,3000.0,{s - 1},{40.0 + s / 100},{1.0 / s},,,,,,1.0")
        if every and s % every == 0:
            rows.append(f"0,,,,{s - 1},,,0.9,{psnr_curve[k]},0.8,0.8,0.8,")
            k += 1
    rows.append(f"1,,,,{steps},,,0.9,{psnr_curve[-1]},0.8,0.8,0.8,")
    return "\n".join(rows) + "\n"


def _render(path, seed, shift):
    """prediction | ground truth, 16x16 each; the ground truth depends on the seed only."""
    rng = np.random.default_rng(seed)
    gt = rng.random((16, 16, 3))
    pred = gt.copy()
    pred[4:8, 8:12] = np.clip(pred[4:8, 8:12] + shift, 0, 1)  # where the losses differ
    os.makedirs(os.path.dirname(path), exist_ok=True)
    mpimg.imsave(path, np.concatenate([pred, gt], axis=1))


def write_run(root, name, loss, seed, psnr=None, log="", every=100, steps=300, extra_overrides=(), **extra):
    """A run folder as a real one: ``psnr=None`` leaves no metrics.json (a failed run)."""
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    overrides = [f"loss={loss}", f"seed={seed}", "experiment=loss_ablation", *extra_overrides]
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "loss": LOSSES[loss]}))
    (run / "train.log").write_text(log)
    if psnr is not None:
        (run / "metrics.json").write_text(json.dumps(_metrics(loss, seed, psnr, steps, **extra)))
        curve = np.linspace(14.38, psnr, 2 + (steps // every if every else 0) - (1 if every else 0))
        (run / "csv" / "version_0").mkdir(parents=True)
        (run / "csv" / "version_0" / "metrics.csv").write_text(_csv(curve, every, steps))
        for v in range(2):
            _render(
                str(run / "renders" / "final" / f"test_00{v}.png"), seed, {"l1": 0.0, "dssim_l1": 0.3}.get(loss, 0.6)
            )
    return run


# PSNR per loss and seed: D-SSIM + L1 is 0.5 dB (+- 0.05) above L1 on every seed (an established
# difference); MS-SSIM + L1 is above on one seed and below on the other (not established).
PSNR = {
    "l1": [27.0, 28.0, 26.5],
    "dssim_l1": [27.5, 28.45, 27.05],
    "msssim_l1": [27.8, 27.6, None],
}


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "multirun"
    job = 0
    for loss, values in PSNR.items():
        for seed, psnr in enumerate(values):
            write_run(root, str(job), loss, seed, psnr, log="" if psnr is not None else CRASH_LOG)
            job += 1
    return root


def _table(md, title_start):
    """The rows (lists of cells) of the Markdown table under the heading that starts with ``title_start``."""
    block = md.split(f"### {title_start}", 1)[1].split("\n\n", 2)[1]
    return [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()[2:]]


def test_runs_are_grouped_by_configuration_over_seeds(sweep):
    groups = group_runs(runs.collect_all(str(sweep)))
    assert [g.label for g in groups] == ["L1", "D-SSIM + L1 (λ = 0.2)", "MS-SSIM + L1 (α = 0.84)"]
    assert [g.seeds for g in groups] == [[0, 1, 2], [0, 1, 2], [0, 1]]
    assert [[r.folder for r in g.failed] for g in groups] == [[], [], ["8"]]
    assert groups[2].values("psnr") == {0: 27.8, 1: 27.6}


def test_a_resumed_run_stays_in_its_group(tmp_path):
    root = tmp_path / "multirun"
    for seed in range(2):
        write_run(root, str(seed), "l1", seed, 27.0 + seed)
    write_run(root, "2", "l1", 2, 27.5, extra_overrides=("hydra.run.dir=multirun/x/2", "resume=true"))
    groups = group_runs(runs.collect_all(str(root)))
    assert [g.seeds for g in groups] == [[0, 1, 2]]


@pytest.mark.slow
def test_statistics_are_the_student_t_formulas(sweep, tmp_path):
    out = tmp_path / "out"
    assert sweep_report.main([str(sweep), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    held = _table(md, "Held-out metrics")
    # Textbook: mean +- t_{0.975, n-1} s / sqrt(n).
    for row, loss in zip(held, PSNR):
        x = np.array([v for v in PSNR[loss] if v is not None])
        half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
        assert row[3] == f"{x.mean():.2f} ± {half:.2f}", (row, loss)
    assert [row[2] for row in held] == ["3", "3", "2 of 3"]
    # summary.csv carries the unrounded numbers: one row per group and quantity.
    rows = list(csv.DictReader(open(out / "summary.csv")))
    got = {(r["group"], r["quantity"]): r for r in rows}
    x = np.array(PSNR["dssim_l1"])
    r = got[("2", "psnr")]
    assert float(r["mean"]) == pytest.approx(x.mean(), abs=1e-12)
    assert float(r["std"]) == pytest.approx(x.std(ddof=1), abs=1e-12)
    half = stats.t.ppf(0.975, 2) * x.std(ddof=1) / math.sqrt(3)
    assert float(r["ci95_low"]) == pytest.approx(x.mean() - half, abs=1e-9)
    assert float(r["ci95_high"]) == pytest.approx(x.mean() + half, abs=1e-9)
    assert r["n"] == "3" and r["seeds_finished"] == "3" and got[("3", "psnr")]["seeds_finished"] == "2"
    assert {q for _, q in got} >= {"psnr", "ssim", "ssim_3dgs", "ssim_skimage", "ms_ssim", "step_ms", "train_seconds"}


@pytest.mark.slow
def test_paired_differences_by_seed_say_what_is_established(sweep, tmp_path):
    out = tmp_path / "out"
    sweep_report.main([str(sweep), "--out", str(out)])
    md = (out / "report.md").read_text()
    diffs = {(row[0], row[2]): row for row in _table(md, "Paired differences against group 1 (L1)")}
    # Textbook paired t: d = group - baseline per seed, t = mean(d) / (s_d / sqrt(n)), two-sided p.
    for group, loss in (("2", "dssim_l1"), ("3", "msssim_l1")):
        pairs = [(a, b) for a, b in zip(PSNR[loss], PSNR["l1"]) if a is not None]
        d = np.array([a - b for a, b in pairs])
        n = len(d)
        t = d.mean() / (d.std(ddof=1) / math.sqrt(n))
        p = 2 * stats.t.sf(abs(t), n - 1)
        half = stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n)
        row = diffs[(group, "PSNR (dB) ↑")]
        assert row[3] == f"{d.mean():+.2f}" and row[4] == f"[{d.mean() - half:.2f}, {d.mean() + half:.2f}]"
        assert row[5] == ("< 0.001" if p < 0.001 else f"{p:.3f}") and row[6] == str(n)
    assert diffs[("2", "PSNR (dB) ↑")][7] == "yes, better"
    assert diffs[("3", "PSNR (dB) ↑")][7] == "no"
    # Said in words too.
    assert re.search(r"- D-SSIM \+ L1 \(λ = 0\.2\) raises held-out PSNR by 0\.50 dB against L1 .*: established\.", md)
    assert re.search(r"- MS-SSIM \+ L1 \(α = 0\.84\) .* 2 seeds\): not established\.", md)


@pytest.mark.slow
def test_baseline_is_chosen_by_number_label_or_override(sweep, tmp_path):
    for wanted in ("2", "D-SSIM + L1 (λ = 0.2)", "loss=dssim_l1"):
        rep = sweep_report.Report(str(sweep), baseline=wanted)
        assert rep.baseline == 1, wanted
    out = tmp_path / "out"
    sweep_report.main([str(sweep), "--out", str(out), "--baseline", "loss=dssim_l1"])
    md = (out / "report.md").read_text()
    assert "Paired differences against group 2 (D-SSIM + L1 (λ = 0.2))" in md
    for wanted, msg in (("9", "matches no group"), ("experiment=loss_ablation", "matches 3 groups")):
        with pytest.raises(SystemExit, match=re.escape(msg) + r".*The groups: 1: L1 \(loss=l1 experiment="):
            sweep_report.Report(str(sweep), baseline=wanted)


@pytest.mark.slow
def test_a_group_with_fewer_seeds_and_the_failed_runs_are_listed(sweep, tmp_path):
    out = tmp_path / "out"
    sweep_report.main([str(sweep), "--out", str(out)])
    md = (out / "report.md").read_text()
    assert (
        "Group 3 (MS-SSIM + L1 (α = 0.84)) has 2 finished seeds of 3; missing seed 2 (failed or interrupted: run 8)."
        in md
    )
    failed = _table(md, "Failed or interrupted: 1 of 9 runs")
    assert failed == [
        ["8", "3", "MS-SSIM + L1 (α = 0.84)", "2",
         "no metrics.json: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (train.log)"]
    ]  # fmt: skip


def test_a_seed_that_never_ran_is_named(sweep, tmp_path):
    import shutil

    shutil.rmtree(sweep / "8")  # the sweep was stopped before its last job started
    rep = sweep_report.Report(str(sweep))
    assert rep.intro()[-1] == "Group 3 (MS-SSIM + L1 (α = 0.84)) has 2 finished seeds of 3; missing seed 2 (no run)."


@pytest.mark.slow
def test_every_output_is_written(sweep, tmp_path):
    out = tmp_path / "out"
    sweep_report.main([str(sweep), "--out", str(out)])
    for name in ("metrics", "differences", "convergence", "step_time"):
        assert (out / "figures" / f"{name}.pdf").read_bytes()[:5] == b"%PDF-", name
        assert (out / "figures" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    md = (out / "report.md").read_text()
    assert "![Held-out metrics per configuration](figures/metrics.png) ([PDF](figures/metrics.pdf))" in md
    tex_text = (out / "report.tex").read_text()
    assert tex_text.count(r"\toprule") == tex_text.count(r"\bottomrule") == 3
    assert r"D-SSIM + L1 ($\lambda$ = 0.2)" in tex_text and "loss=" not in tex_text
    body = "\n".join(line for line in tex_text.splitlines() if not line.startswith("%"))
    assert "_" not in body.replace(r"\_", "") and "%" not in body.replace(r"\%", "")  # escaped
    html = (out / "report.html").read_text()
    # Self-contained: every image is embedded, nothing else is referenced.
    srcs = re.findall(r"src='([^']*)'", html)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert not re.search(r"(href|src)=['\"](?!data:)", html)
    # Figures (4), then per view (2) the ground truth and 3 groups, full and cropped.
    assert len(srcs) == 4 + 2 * 4 * 2
    assert html.count("<table>") == 6 and "MS-SSIM + L1 (α = 0.84)" in html
    assert "Common to all runs: <code>experiment=loss_ablation</code>" in html


def test_renders_side_by_side_with_a_crop_where_they_differ(sweep):
    groups = group_runs(runs.collect_all(str(sweep)))
    section, notes = page.render_grid(groups, max_views=1)
    assert notes == [] and "seed 0" in section
    # The renders differ only in rows 4..7, columns 8..11: the 8x8 crop (16 // 3 -> 8) covers that block.
    m = re.search(r"Crop (\d+)×\d+ px at \((\d+), (\d+)\)", section)
    size, left, top = map(int, m.groups())
    assert size == 8 and left <= 8 and left + size >= 12 and top <= 4 and top + size >= 8
    # Each group's own PSNR on the view, from the pixels (L1's render equals the truth).
    assert "PSNR inf dB" in section and section.count("PSNR ") == 3


def test_convergence_reads_held_out_psnr_by_step(sweep, tmp_path):
    curves = runs.read_curves(str(sweep / "1"))
    assert curves["psnr"].steps.tolist() == [0, 100, 200, 300]
    assert curves["psnr"].values[0] == 14.38 and curves["psnr"].values[-1] == pytest.approx(28.0)
    assert curves["train_loss"].steps.tolist() == list(range(10, 301, 10))
    groups = group_runs(runs.collect_all(str(sweep)))
    fig = figures.convergence_figure(groups, figures.all_curves(groups))
    psnr_ax, time_ax = fig.axes
    assert psnr_ax.get_ylabel() == "held-out PSNR (dB)" and "step time" in time_ax.get_ylabel()
    lines = psnr_ax.get_lines()
    assert [ln.get_label() for ln in lines] == [
        "L1 (n = 3)", "D-SSIM + L1 (λ = 0.2) (n = 3)", "MS-SSIM + L1 (α = 0.84) (n = 2)"
    ]  # fmt: skip
    assert lines[0].get_xdata().tolist() == [0, 100, 200, 300]
    assert lines[0].get_ydata()[-1] == pytest.approx(np.mean(PSNR["l1"]))
    assert time_ax.get_ylim()[0] == 0.0


def test_convergence_falls_back_to_the_training_loss(tmp_path):
    root = tmp_path / "multirun"
    for seed in range(2):
        write_run(root, str(seed), "l1", seed, 27.0 + seed, every=None)
    groups = group_runs(runs.collect_all(str(root)))
    fig = figures.convergence_figure(groups, figures.all_curves(groups))
    assert fig.axes[0].get_ylabel().startswith("training loss")
    assert fig.axes[0].get_lines()[0].get_xdata().tolist() == list(range(10, 301, 10))


def test_figures_have_readable_labels_and_no_cut_bars(sweep):
    groups = group_runs(runs.collect_all(str(sweep)))
    held, _ = quantities([r for g in groups for r in g.runs])
    fig = figures.metrics_figure(groups, held)
    psnr_ax = fig.axes[0]
    ticks = [t.get_text() for t in psnr_ax.get_yticklabels()]
    assert ticks == ["L1", "D-SSIM + L1 (λ = 0.2)", "MS-SSIM + L1 (α = 0.84)"]
    assert not psnr_ax.patches  # points and intervals, no bar whose length an axis could cut
    lo, hi = psnr_ax.get_xlim()
    assert lo < 26.5 and hi > 28.45 and lo > 14.38  # spans every seed; the untrained PSNR is stated
    assert psnr_ax.get_title() == "untrained: 14.38 dB"
    bars = figures.step_time_figure(groups).axes[0]
    assert bars.patches and bars.get_xlim()[0] == 0.0  # bars start at 0
    assert [t.get_text() for t in bars.get_yticklabels()] == ticks


def test_duplicate_seeds_in_one_configuration_are_refused(tmp_path):
    root = tmp_path / "two_sweeps"
    write_run(root / "a", "0", "l1", 0, 27.0)
    write_run(root / "b", "0", "l1", 0, 27.5)
    with pytest.raises(SystemExit, match=r"runs 'a/0' and 'b/0' have the same configuration and seed 0"):
        group_runs(runs.collect_all(str(root)))


def test_lpips_is_reported_when_runs_computed_it(tmp_path):
    root = tmp_path / "multirun"
    for seed in range(2):
        write_run(root, str(seed), "l1", seed, 27.0, lpips=0.1 + seed / 100)
        write_run(root, str(seed + 2), "dssim_l1", seed, 27.5, lpips=0.09 + seed / 100)
    rep = sweep_report.Report(str(root))
    assert [q.name for q in rep.held][-1] == "LPIPS" and rep.held[-1].higher_is_better is False
    held = _table(rep.markdown({}, str(root)), "Held-out metrics")
    assert held[0][-1] == "0.1050 ± 0.0635"


def test_interrupted_and_silent_runs_are_listed_with_what_their_log_shows(tmp_path):
    root = tmp_path / "multirun"
    write_run(root, "0", "l1", 0, 27.0)
    write_run(root, "1", "l1", 1, 20.0, log="[2026-11-23 10:11:16,700][x][INFO] - step\n", interrupted="SIGTERM")
    write_run(root, "2", "l1", 2, None, log=CONFIG_LOG)
    write_run(root, "3", "l1", 3, None, log="")
    rep = sweep_report.Report(str(root))
    errors = {r.folder: r.error for g in rep.groups for r in g.failed}
    assert errors == {
        "1": "interrupted by SIGTERM at step 300; no error in train.log, which ends: "
        "[2026-11-23 10:11:16,700][x][INFO] - step",
        "2": "no metrics.json: could not build the loss from loss=dssim_l1: ValueError: window_size must be an odd "
        "integer >= 3, got 4 (train.log)",
        "3": "no metrics.json; train.log is empty (the job failed before logging, or is still running)",
    }  # fmt: skip
    assert "Group 1 (L1) has 1 finished seed of 4; missing seed 1 (failed or interrupted: run 1)" in rep.intro()[-1]


def test_no_finished_run_writes_the_failures_and_exits_1(tmp_path, capsys):
    root = tmp_path / "multirun"
    write_run(root, "0", "l1", 0, None, log=CONFIG_LOG)
    assert sweep_report.main([str(root)]) == 1
    text = (root / "report.md").read_text()
    assert text.startswith("No run finished.") and capsys.readouterr().out.startswith(text)
    assert "window_size must be an odd integer >= 3, got 4" in text
    assert not (root / "figures").exists() and not (root / "report.html").exists()


def test_not_a_sweep_folder(tmp_path):
    with pytest.raises(SystemExit, match="is not a directory"):
        sweep_report.main([str(tmp_path / "nope")])
    with pytest.raises(SystemExit, match="no metrics.json under .* and no run folder"):
        sweep_report.main([str(tmp_path)])


def test_a_traceback_without_a_log_record_still_names_the_exception(tmp_path):
    run = write_run(tmp_path, "0", "l1", 0, log="step 3\nTraceback (most recent call last):\n  File \"x\", line 1\n"
                    "    f()\nKeyError: 'means'\n")  # fmt: skip
    assert runs.log_error(str(run)) == "KeyError: 'means' (train.log)"
    assert runs.log_error(str(write_run(tmp_path, "1", "l1", 1, log="[t][n][INFO] - fine\n"))) is None


def test_optuna_trials_are_labelled_by_their_rounded_parameter(tmp_path):
    root = tmp_path / "multirun"
    for i, lam in enumerate(["0.5488135039273248", "0.20000000000000001"]):
        write_run(root, str(i), "dssim_l1", 0, 27.0 + i, extra_overrides=[f"loss.lambda_dssim={lam}"])
    groups = group_runs(runs.collect_all(str(root)))
    # The label shows the swept value (rounded), not the loss config's default.
    assert [g.label for g in groups] == ["D-SSIM + L1 (λ = 0.5488)", "D-SSIM + L1 (λ = 0.2)"]


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


@pytest.mark.parametrize(
    "config, label",
    [
        (LOSSES["l1"], "L1"),
        (LOSSES["dssim_l1"], "D-SSIM + L1 (λ = 0.2)"),
        (LOSSES["msssim_l1"], "MS-SSIM + L1 (α = 0.84)"),
        ({"_target_": "splatloss.losses.PhotometricLoss.zhao_mix", "alpha": 0.84}, "MS-SSIM + G·L1 (Zhao) (α = 0.84)"),
        ({"_target_": "splatloss.losses.PhotometricLoss", "msssim": 1.0}, "MS-SSIM"),
        ({"_target_": "splatloss.losses.PhotometricLoss", "dssim": 1.0, "l1": 0.0}, "D-SSIM"),
        ({"_target_": "splatloss.losses.PhotometricLoss", "l1": 0.8, "dssim": 0.2}, "0.8 L1 + 0.2 D-SSIM"),
        ({"_target_": "mypkg.MyLoss"}, "my_loss"),
    ],
)
def test_loss_labels(config, label):
    assert loss_label(config, "my_loss") == label


def test_describe_and_paired_edge_cases():
    one = describe([28.0])
    assert one.n == 1 and one.mean == 28.0 and math.isnan(one.std) and math.isnan(one.low)
    same = describe([1.0, 1.0, 1.0])
    assert (same.std, same.low, same.high) == (0.0, 1.0, 1.0)
    d = paired({0: 1.0, 1: 2.0}, {1: 2.5, 2: 9.0})  # one common seed: a difference, no test
    assert d.n == 1 and d.mean == 0.5 and math.isnan(d.p) and not d.established
    assert tex("p < 0.05, Δ = -0.1") == r"p $<$ 0.05, $\Delta$ = $-$0.1"
