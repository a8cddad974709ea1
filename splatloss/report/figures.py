"""The report's figures (matplotlib's object API with the Agg canvas: no pyplot, no global backend).

Every figure is written as vector PDF and as PNG. No axis is cut under a bar: held-out metrics are
points with interval whiskers (each seed a small dot on a row just below its group's mean, the
mean with its 95 % confidence interval cut to the quantity's range), whose axis spans the values;
the step-time bars start at 0. A mean of fewer runs than its group has says "2 of 3 runs". PDFs
embed TrueType fonts (no Type 3).
"""

from __future__ import annotations

import math
import os
import textwrap
from typing import Dict, List, Optional, Sequence

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..atomic import atomic_output
from .runs import Curve, read_curves
from .stats import CONFIDENCE, Group, Quantity, compare, describe

__all__ = ["metrics_figure", "differences_figure", "convergence_figure", "step_time_figure", "save"]

_FONT = 8
_SEED_ROW = 0.25  # how far below its mean (in rows) a group's per-seed dots sit
# TrueType (Type 42) fonts in the PDFs: journals and arXiv refuse the Type 3 fonts matplotlib embeds by default.
_PDF_FONTS = {"pdf.fonttype": 42, "ps.fonttype": 42}


def _wrap(label: str, width: int = 28) -> str:
    return "\n".join(textwrap.wrap(label, width)) or label


def _colors(n: int) -> List[str]:
    return [f"C{i % 10}" for i in range(n)]


def _new(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save(fig: Figure, stem: str) -> List[str]:
    """Write ``<stem>.pdf`` (vector, TrueType fonts embedded) and ``<stem>.png`` (150 dpi); return their paths."""
    paths = []
    for ext, kw in (("pdf", {}), ("png", {"dpi": 150})):
        path = f"{stem}.{ext}"
        with atomic_output(path) as tmp, matplotlib.rc_context(_PDF_FONTS):
            fig.savefig(tmp, format=ext, **kw)
        paths.append(path)
    return paths


def _axis_name(q: Quantity) -> str:
    arrow = (
        "" if q.higher_is_better is None else (" (higher is better)" if q.higher_is_better else " (lower is better)")
    )
    return f"{q.name}{f' ({q.unit})' if q.unit else ''}{arrow}"


def metrics_figure(groups: Sequence[Group], held: Sequence[Quantity]) -> Optional[Figure]:
    """One panel per held-out metric (PSNR, SSIM, MS-SSIM, LPIPS): a row per group, each seed a dot,
    the mean with its confidence interval; the untrained model's PSNR is stated, not drawn."""
    shown = [q for q in held if q.key in ("psnr", "ssim", "ms_ssim") or q.key.startswith("lpips")]
    done = [g for g in groups if g.runs]
    if not shown or not done:
        return None
    fig = _new(2.3 * len(shown) + 2.0, 0.45 * len(done) + 1.3)
    axes = fig.subplots(1, len(shown), sharey=True, squeeze=False)[0]
    y = np.arange(len(done))[::-1]
    for ax, q in zip(axes, shown):
        for yi, g, color in zip(y, done, _colors(len(done))):
            vals = list(g.values(q.key).values())
            s = g.stat(q.key)
            # The seeds on a row of their own just below their mean: never hidden under its marker.
            ax.scatter(vals, [yi - _SEED_ROW] * len(vals), s=10, color="0.45", zorder=2, linewidths=0)
            if s.n > 1:
                ax.errorbar(s.mean, yi, xerr=[[s.mean - s.low], [s.high - s.mean]], fmt="none", ecolor=color,
                            capsize=3, lw=1.2, zorder=3)  # fmt: skip
            ax.plot([s.mean], [yi], "o", color=color, ms=5, zorder=4)
            if 0 < s.n < len(g.runs):  # a mean of the runs that have the quantity, not of the group
                ax.annotate(f"{s.n} of {len(g.runs)} runs", (s.mean, yi), xytext=(0, 5), textcoords="offset points",
                            ha="center", va="bottom", fontsize=_FONT - 1, color="0.35")  # fmt: skip
        ax.set_xlabel(_axis_name(q), fontsize=_FONT)
        ax.tick_params(labelsize=_FONT)
        ax.grid(axis="x", color="0.9", lw=0.6)
        ax.margins(x=0.15, y=0.25)
        if q.key == "psnr":
            init = describe([v for g in done for v in g.values("psnr_init").values()])
            if init.n:
                ax.set_title(f"untrained: {init.mean:.2f} dB", fontsize=_FONT, color="0.4")
    axes[0].set_yticks(y, [_wrap(g.label) for g in done], fontsize=_FONT)
    fig.suptitle(
        f"Held-out metrics: dots are seeds (under their mean), markers the mean with its {CONFIDENCE:.0%} "
        "confidence interval",
        fontsize=_FONT + 1,
    )
    return fig


def differences_figure(groups: Sequence[Group], base: int, held: Sequence[Quantity]) -> Optional[Figure]:
    """Paired differences against the baseline (mean and confidence interval; filled: p < 0.05)."""
    shown = [q for q in held if q.key in ("psnr", "ssim", "ms_ssim") or q.key.startswith("lpips")]
    others = [(i, g) for i, g in enumerate(groups) if i != base and g.runs]
    if not shown or not others:
        return None
    fig = _new(2.3 * len(shown) + 2.0, 0.45 * len(others) + 1.4)
    axes = fig.subplots(1, len(shown), sharey=True, squeeze=False)[0]
    y = np.arange(len(others))[::-1]
    for ax, q in zip(axes, shown):
        ax.axvline(0.0, color="0.3", lw=0.8)
        for yi, (i, g) in zip(y, others):
            d = compare(groups[base], g, q.key)
            color = f"C{i % 10}"
            if math.isfinite(d.low):
                ax.errorbar(d.mean, yi, xerr=[[d.mean - d.low], [d.high - d.mean]], fmt="none", ecolor=color,
                            capsize=3, lw=1.2)  # fmt: skip
            if math.isfinite(d.mean):
                ax.plot([d.mean], [yi], "o", ms=6, color=color, mfc=color if d.established else "white", mew=1.4)
        ax.set_xlabel(f"Δ {_axis_name(q)}", fontsize=_FONT)
        ax.tick_params(labelsize=_FONT)
        ax.grid(axis="x", color="0.9", lw=0.6)
        ax.margins(x=0.2, y=0.3)
    axes[0].set_yticks(y, [_wrap(g.label) for _, g in others], fontsize=_FONT)
    fig.suptitle(
        f"Against {groups[base].label}, paired by seed: mean difference and {CONFIDENCE:.0%} CI "
        "(filled: paired t-test p < 0.05)",
        fontsize=_FONT + 1,
    )
    return fig


def _band(curves: List[Curve]):
    """Steps every curve has, and the mean and confidence interval over the curves at each."""
    common = sorted(set.intersection(*(set(c.steps.tolist()) for c in curves)))
    if not common:
        return None
    values = np.array([[c.values[np.searchsorted(c.steps, s)] for s in common] for c in curves])
    # PSNR, losses and step times are >= 0: the band is cut there (it covers the mean as often).
    stats = [describe(values[:, j], (0.0, None)) for j in range(len(common))]
    return (
        np.array(common),
        np.array([s.mean for s in stats]),
        np.array([s.low for s in stats]),
        np.array([s.high for s in stats]),
    )


def convergence_figure(groups: Sequence[Group], curves: Dict[str, Dict[str, Curve]]) -> Optional[Figure]:
    """Held-out PSNR against the step per group (mean over seeds, the confidence band), from the runs'
    CSV logs; the training loss where the runs did not evaluate during training; and the step time
    (the logged recent-window ms / step) against the step."""
    done = [(i, g) for i, g in enumerate(groups) if g.runs]
    logged = [curves.get(r.folder, {}) for _, g in done for r in g.runs]
    # Held-out PSNR needs an evaluation between the one before training and the one after it.
    if all("psnr" in c and len(c["psnr"].steps) > 2 for c in logged):
        panels = [("psnr", "held-out PSNR (dB)")]
    elif any("train_loss" in c for c in logged):
        panels = [("train_loss", "training loss (each its own loss)")]
    else:
        return None
    if any("step_ms" in c for c in logged):
        panels.append(("step_ms", "step time (ms, recent window)"))
    fig = _new(8.0 if len(panels) > 1 else 4.6, 3.2)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (name, label) in zip(axes, panels):
        for i, g in done:
            cs = [curves[r.folder][name] for r in g.runs if name in curves.get(r.folder, {})]
            band = _band(cs) if cs else None
            if band is None:
                continue
            steps, mean, low, high = band
            ax.plot(steps, mean, color=f"C{i % 10}", lw=1.4, label=f"{g.label} (n = {len(cs)})")
            if len(cs) > 1:
                ax.fill_between(steps, low, high, color=f"C{i % 10}", alpha=0.2, lw=0)
        ax.set_xlabel("training step", fontsize=_FONT)
        ax.set_ylabel(label, fontsize=_FONT)
        ax.tick_params(labelsize=_FONT)
        ax.grid(color="0.9", lw=0.6)
        if name == "step_ms":
            ax.set_ylim(bottom=0)
    axes[0].legend(fontsize=_FONT - 1, frameon=False)
    fig.suptitle(f"Mean over seeds, band: {CONFIDENCE:.0%} confidence interval", fontsize=_FONT + 1)
    return fig


# The parts of a step metrics.json times (seconds per step, medians), in the order of a step.
_PARTS = [
    ("render_seconds", "render"),
    ("render_backward_seconds", "render backward"),
    ("loss_seconds", "loss forward + backward"),
    ("optim_seconds", "optimizer + densification"),
]


def step_time_figure(groups: Sequence[Group]) -> Optional[Figure]:
    """Where a step's time goes, per group (mean over seeds, ms), bars from 0; the whole step's mean
    and confidence interval as a whisker."""
    done = [g for g in groups if g.runs and g.values("step_ms")]
    if not done:
        return None
    fig = _new(7.0, 0.45 * len(done) + 1.5)
    ax = fig.subplots()
    y = np.arange(len(done))[::-1]
    left = np.zeros(len(done))
    for j, (key, name) in enumerate(_PARTS):
        ms = np.array([1000.0 * describe(list(g.values(key).values())).mean for g in done])
        ms = np.nan_to_num(ms)
        ax.barh(y, ms, left=left, color=f"C{j}", height=0.6, label=name)
        left += ms
    for yi, end, g in zip(y, left, done):
        s = g.stat("step_ms")
        right = end
        if s.n > 1:
            ax.errorbar(s.mean, yi, xerr=[[s.mean - s.low], [s.high - s.mean]], fmt="none", ecolor="k", capsize=3)
            right = max(right, s.high)
        share = g.stat("loss_share_pct")
        text = f"{s.mean:.1f} ms" + (f" (loss {share.mean:.1f}%)" if share.n else "")
        ax.text(right + 0.02 * left.max(), yi, text, va="center", fontsize=_FONT)
    highest = max([left.max()] + [g.stat("step_ms").high for g in done if g.stat("step_ms").n > 1])
    ax.set_xlim(0, 1.45 * highest)
    ax.set_yticks(y, [_wrap(g.label, 32) for g in done], fontsize=_FONT)
    ax.set_xlabel("time per training step (ms): medians of the parts, mean over seeds", fontsize=_FONT)
    ax.tick_params(labelsize=_FONT)
    ax.legend(fontsize=_FONT - 1, ncol=4, frameon=False, loc="lower left", bbox_to_anchor=(0.0, 1.0))
    return fig


def all_curves(groups: Sequence[Group]) -> Dict[str, Dict[str, Curve]]:
    """``{run folder: read_curves(run)}`` for every finished run."""
    return {r.folder: read_curves(r.path) for g in groups for r in g.runs}


def write_all(groups: Sequence[Group], base: int, held: Sequence[Quantity], out_dir: str) -> Dict[str, List[str]]:
    """Every figure under ``out_dir/figures/``: ``{name: [pdf, png]}`` (a figure with nothing to show is left out)."""
    folder = os.path.join(out_dir, "figures")
    os.makedirs(folder, exist_ok=True)
    made = {
        "metrics": metrics_figure(groups, held),
        "differences": differences_figure(groups, base, held),
        "convergence": convergence_figure(groups, all_curves(groups)),
        "step_time": step_time_figure(groups),
    }
    return {name: save(fig, os.path.join(folder, name)) for name, fig in made.items() if fig is not None}
