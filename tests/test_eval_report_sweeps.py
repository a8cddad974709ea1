"""splatloss-report on sweeps that splatloss-eval has evaluated, and what its tables and figures say:
evaluation folders are part of their run (LPIPS reaches the report, a partial one is marked), the
MS-SSIM column names its scales, intervals stay inside a quantity's range, the PDFs embed no Type 3
font, every seed's dot is visible."""

import csv
import io
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml
from matplotlib.collections import PathCollection
from scipy import stats

from splatloss import report as sweep_report
from splatloss.report import figures
from splatloss.report.stats import group_runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOSSES = {
    "l1": {"_target_": "splatloss.losses.PhotometricLoss", "l1": 1.0, "padding": "valid", "window_size": 11},
    "dssim_l1": {"_target_": "splatloss.losses.PhotometricLoss.dssim_l1", "lambda_dssim": 0.2, "padding": "same"},
}


def write_run(root, name, loss, seed, psnr, steps=300, scales=3, **extra):
    """A finished run folder as splatloss.train writes it: .hydra/ and metrics.json (its keys)."""
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"loss={loss}", f"seed={seed}"]))
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "loss": LOSSES[loss]}))
    (run / "train.log").write_text("")
    m = {
        "image_size": [64, 64], "interrupted": None, "loss": LOSSES[loss], "loss_name": loss,
        "loss_seconds": 0.002, "loss_share": 0.05, "ms_ssim": 0.9 + psnr / 1000, "ms_ssim_init": 0.6,
        "ms_ssim_scales": scales, "num_gaussians": 3000, "num_gaussians_init": 3000, "num_test_views": 2,
        "num_train_views": 4, "optim_seconds": 0.003, "psnr": psnr, "psnr_init": 14.38,
        "render_backward_seconds": 0.015, "render_seconds": 0.02, "resumed_from": None, "seed": seed,
        "ssim": 0.8 + psnr / 1000, "ssim_3dgs": 0.81 + psnr / 1000, "ssim_3dgs_init": 0.3, "ssim_init": 0.3,
        "ssim_skimage": 0.82 + psnr / 1000, "ssim_skimage_init": 0.3, "step_seconds": 0.04, "steps": steps,
        "steps_this_run": steps, "timed_steps": steps - 3, "train_seconds": 12.0 + seed,
        "train_seconds_this_run": 12.0 + seed, "world_size": 1, "lr": {"means": 0.00016},
    }  # fmt: skip
    m.update(extra)
    (run / "metrics.json").write_text(json.dumps(m))
    return run


def write_eval(run, lpips, net="alex", step=300, folder="eval", record=True):
    """RUN/<folder>/metrics.json with the keys splatloss-eval writes (``record=False``: without the
    ``record`` key, as files written before it carried one)."""
    out = run / folder
    out.mkdir(parents=True)
    m = json.loads((run / "metrics.json").read_text())
    ev = {k: m[k] for k in ("psnr", "ssim", "ssim_3dgs", "ssim_skimage", "ms_ssim", "ms_ssim_scales")}
    ev.update(
        num_views=2, num_gaussians=3000, checkpoint=str(run / "checkpoints" / "last.ckpt"), step=step,
        run_dir=str(run), output_dir=str(out), lpips=lpips, lpips_net=net,
    )  # fmt: skip
    if record:
        ev["record"] = "evaluation"
    (out / "metrics.json").write_text(json.dumps(ev))
    (out / "renders").mkdir()
    return out


def _table(md, title_start):
    block = md.split(f"### {title_start}", 1)[1].split("\n\n", 2)[1]
    lines = block.splitlines()
    return [c.strip() for c in lines[0].strip("|").split("|")], [
        [c.strip() for c in line.strip("|").split("|")] for line in lines[2:]
    ]


def _sweep(tmp_path, psnr=((27.0, 28.0, 26.5), (27.5, 28.45, 27.05)), **kw):
    root = tmp_path / "multirun"
    job = 0
    for loss, values in zip(LOSSES, psnr):
        for seed, p in enumerate(values):
            write_run(root, str(job), loss, seed, p, **kw)
            job += 1
    return root


# ------------------------------------------------------------------------------------------------
# Evaluations are part of their run
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("record", [True, False], ids=["record", "without-record-key"])
def test_an_evaluation_folder_is_not_a_run(tmp_path, record):
    root = _sweep(tmp_path)
    write_eval(root / "0", 0.12, record=record)
    rep = sweep_report.Report(str(root))
    assert len(rep.runs) == 6 and sorted(r.folder for r in rep.runs) == [str(i) for i in range(6)]
    assert [len(g.runs) for g in rep.groups] == [3, 3] and rep.expected_seeds == 3
    md = rep.markdown({}, str(root))
    assert "0/eval" not in md and "finished seeds of" not in md


def test_lpips_from_evaluations_reaches_the_tables(tmp_path):
    root = _sweep(tmp_path)
    values = [0.12, 0.10, 0.14, 0.11, 0.09, 0.125]
    for job, v in enumerate(values):
        write_eval(root / str(job), v)
    rep = sweep_report.Report(str(root))
    assert rep.runs[0].metrics["lpips_alex"] == 0.12
    md = rep.markdown({}, str(root))
    header, rows = _table(md, "Held-out metrics")
    assert header[-1] == "LPIPS (alex) ↓"
    s = stats.ttest_1samp(values[:3], 0.0).confidence_interval(0.95)
    assert rows[0][-1] == f"{np.mean(values[:3]):.4f} ± {(s.high - s.low) / 2:.4f}"
    _, diffs = _table(md, "Paired differences")
    lp = [r for r in diffs if r[2] == "LPIPS (alex) ↓"]
    assert len(lp) == 1 and lp[0][3] == f"{np.mean(values[3:]) - np.mean(values[:3]):+.4f}"


def test_a_partial_lpips_is_not_shown_as_the_groups_mean(tmp_path):
    root = _sweep(tmp_path)
    write_eval(root / "0", 0.12)
    write_eval(root / "1", 0.10)
    rep = sweep_report.Report(str(root))
    header, rows = _table(rep.markdown({}, str(root)), "Held-out metrics")
    assert rows[0][-1].endswith("(2 of 3 runs)"), rows[0]
    assert rows[1][-1] == "–"


def test_an_evaluation_of_another_step_is_not_the_runs_result(tmp_path):
    root = _sweep(tmp_path)
    write_eval(root / "0", 0.12, step=100, folder="eval_step100")
    rep = sweep_report.Report(str(root))
    assert "lpips_alex" not in rep.runs[0].metrics
    md = rep.markdown({}, str(root))
    assert "0/eval_step100" in md and "step 100, not the run's last step 300" in md


def test_an_evaluation_written_elsewhere_in_the_sweep_joins_its_run(tmp_path):
    root = _sweep(tmp_path)
    out = write_eval(root / "2", 0.2)
    os.rename(out, root / "evaluations")  # output_dir=<sweep>/evaluations
    rep = sweep_report.Report(str(root))
    assert len(rep.runs) == 6 and rep.runs[2].metrics["lpips_alex"] == 0.2


def test_two_evaluations_of_one_run_that_disagree_are_refused(tmp_path):
    root = _sweep(tmp_path)
    write_eval(root / "0", 0.12)
    write_eval(root / "0", 0.13, folder="eval2")
    with pytest.raises(SystemExit, match=r"'0/eval'.* and '0/eval2'.* give run '0' different lpips_alex"):
        sweep_report.Report(str(root))


# ------------------------------------------------------------------------------------------------
# What the tables and figures say
# ------------------------------------------------------------------------------------------------


def test_ms_ssim_column_names_its_scales(tmp_path):
    rep = sweep_report.Report(str(_sweep(tmp_path, scales=3)))
    header, _ = _table(rep.markdown({}, rep.sweep_dir), "Held-out metrics")
    assert "MS-SSIM (3 scales) ↑" in header
    rep = sweep_report.Report(str(_sweep(tmp_path / "b", scales=2)))
    md = rep.markdown({}, rep.sweep_dir)
    assert "MS-SSIM (2 scales) ↑" in _table(md, "Held-out metrics")[0]
    assert "MS-SSIM (2 scales) ↑" in rep.latex().replace(r"$\uparrow$", "↑")


def test_ms_ssim_of_different_scales_is_not_compared(tmp_path):
    root = tmp_path / "multirun"
    for seed in range(2):
        write_run(root, str(seed), "l1", seed, 27.0 + seed, scales=3)
        write_run(root, str(seed + 2), "dssim_l1", seed, 27.5 + seed, scales=2)
    rep = sweep_report.Report(str(root))
    md = rep.markdown({}, str(root))
    header, _ = _table(md, "Held-out metrics")
    assert "MS-SSIM (scales differ: see the note) ↑" in header
    assert "MS-SSIM has 3 scales in group 1 (L1) and 2 in group 2" in md
    _, diffs = _table(md, "Paired differences")
    ms = [r for r in diffs if r[2].startswith("MS-SSIM")]
    assert ms[0][3] == "–" and ms[0][-1] == "not comparable: 2 scales against 3"


def _cells(md, title, column):
    header, rows = _table(md, title)
    return [r[header.index(column)] for r in rows]


def test_two_seed_intervals_stay_inside_the_quantitys_range(tmp_path):
    root = tmp_path / "multirun"
    times = [(4.0, 49.0), (26.0, 27.0)]  # 2 seeds: t(0.975, 1) = 12.7 makes the first interval cross 0
    for g, (loss, ts) in enumerate(zip(LOSSES, times)):
        for seed, t in enumerate(ts):
            write_run(root, str(2 * g + seed), loss, seed, 27.0 + seed, train_seconds=t, lpips=0.01 + 0.2 * seed)
    rep = sweep_report.Report(str(root))
    md = rep.markdown({}, str(root))
    cell = _cells(md, "Training cost", "train time (s) ↓")[0]
    ci = stats.ttest_1samp(times[0], 0.0).confidence_interval(0.95)
    assert ci.low < 0  # what Student t gives: a negative time
    assert cell == f"26.5 [0.0, {ci.high:.1f}]", cell
    assert _cells(md, "Training cost", "train time (s) ↓")[1] == "26.5 ± 6.4"  # inside the range: symmetric
    assert _cells(md, "Held-out metrics", "LPIPS ↓")[0].startswith("0.1100 [0.0000, ")
    rows = list(csv.DictReader(io.StringIO(rep.csv())))
    low = [float(r["ci95_low"]) for r in rows if r["quantity"] == "train_seconds"]
    assert low[0] == 0.0 and low[1] == pytest.approx(26.5 - 6.353, abs=1e-3)
    stat = [r for r in _table(md, "Every statistic")[1] if r[2] == "train time (s) ↓"][0]
    assert stat[-1] == f"[0.0, {ci.high:.1f}]"


def test_pdf_figures_embed_no_type3_font(tmp_path):
    root = _sweep(tmp_path)
    out = tmp_path / "out"
    sweep_report.build(str(root), str(out))
    pdfs = sorted((out / "figures").glob("*.pdf"))
    assert pdfs
    for pdf in pdfs:
        data = pdf.read_bytes()
        assert b"/Type3" not in data, pdf.name
        assert b"/FontFile2" in data, pdf.name  # TrueType, embedded


def test_every_seeds_dot_is_visible_beside_the_mean(tmp_path):
    root = tmp_path / "multirun"
    for seed, p in enumerate((27.0, 27.25, 27.5)):  # the middle seed is the mean
        write_run(root, str(seed), "l1", seed, p)
        write_run(root, str(seed + 3), "dssim_l1", seed, p + 0.3)
    groups = group_runs(sweep_report.Report(str(root)).runs)
    held = sweep_report.Report(str(root)).held
    fig = figures.metrics_figure(groups, held)
    fig.canvas.draw()
    for ax in fig.axes:
        dots = [c for c in ax.collections if isinstance(c, PathCollection) and len(c.get_offsets())]
        means = [ln for ln in ax.lines if ln.get_marker() == "o"]
        assert dots and means
        dot_px = ax.transData.transform(np.concatenate([np.asarray(c.get_offsets()) for c in dots]))
        dot_r = max(math.sqrt(float(c.get_sizes()[0])) / 2 for c in dots) * fig.dpi / 72
        for ln in means:
            centre = ax.transData.transform(np.column_stack([ln.get_xdata(), ln.get_ydata()]))[0]
            r = ln.get_markersize() / 2 * fig.dpi / 72
            gap = np.linalg.norm(dot_px - centre, axis=1)
            assert (gap > r + dot_r).all(), (ax.get_xlabel(), gap.min(), r + dot_r)


# ------------------------------------------------------------------------------------------------
# Through the real entry points
# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_train_eval_report(tmp_path):
    """A 2-seed sweep trained by scripts/train.py, one run evaluated with LPIPS by scripts/eval.py,
    reported by python -m splatloss.report: two runs, one LPIPS value marked as one of two runs."""
    import torch

    from splatloss.splat.lpips import LPIPS

    pytest.importorskip("torchmetrics")  # LPIPS's linear layers, the default metrics.lpips_linear
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    sweep = tmp_path / "sweep"
    tiny = ["data.scene.image_size=32", "data.scene.n_train=4", "data.scene.n_test=2", "data.scene.n_points=300",
            "data.scene.supersample=1", "trainer.max_steps=6", "export_ply=false", "~logger"]  # fmt: skip
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "train.py"), "-m", "seed=0,1", *tiny]
    proc = subprocess.run([*cmd, f"hydra.sweep.dir={sweep}"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    torch.manual_seed(0)
    net = LPIPS("alex")
    for p in net.features.parameters():
        p.data.normal_(0, 0.05)  # stand-in backbone weights in torchvision's file format
    torch.save({f"features.{k}": v for k, v in net.features.state_dict().items()}, tmp_path / "alex.pth")
    ev = [sys.executable, os.path.join(ROOT, "scripts", "eval.py"), f"ckpt_path={sweep}/0/checkpoints/last.ckpt",
          "metrics.lpips=true", f"metrics.lpips_backbone={tmp_path}/alex.pth"]  # fmt: skip
    proc = subprocess.run(ev, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lpips = json.loads((sweep / "0" / "eval" / "metrics.json").read_text())["lpips"]
    rep = [sys.executable, "-m", "splatloss.report", str(sweep), "--out", str(tmp_path / "report")]
    proc = subprocess.run(rep, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (tmp_path / "report" / "report.md").read_text()
    assert md.splitlines()[2].startswith("2 runs in 1 configuration, seeds 0, 1")
    header, rows = _table(md, "Held-out metrics")
    assert len(rows) == 1 and rows[0][2] == "2"
    assert header[-1] == "LPIPS (alex) ↓" and rows[0][-1] == f"{lpips:.4f} (1 of 2 runs)"
    assert "MS-SSIM (2 scales) ↑" in header  # 32 px views hold 2 scales of the 11-tap window


def test_a_partial_quantity_says_so_in_the_metrics_figure(tmp_path):
    root = _sweep(tmp_path)
    write_eval(root / "0", 0.12)
    write_eval(root / "1", 0.10)
    rep = sweep_report.Report(str(root))
    fig = figures.metrics_figure(rep.groups, rep.held)
    lpips_ax = [ax for ax in fig.axes if ax.get_xlabel().startswith("LPIPS")][0]
    assert [t.get_text() for t in lpips_ax.texts] == ["2 of 3 runs"]
    assert all(not ax.texts for ax in fig.axes if ax is not lpips_ax)
