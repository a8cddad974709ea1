"""Turn a Hydra multirun folder into the report of an ablation: tables, figures and one HTML page.

    splatloss-report multirun/2026-01-01/12-00-00 [--out DIR] [--baseline GROUP]
    (also ./dev report ..., python -m splatloss.report ...)

Runs are grouped by configuration: all their overrides (``.hydra/overrides.yaml``) but the seed.
A ``splatloss-eval`` output folder in the sweep (``RUN/eval/``) is part of the run it evaluated,
not a run: its LPIPS (``LPIPS (<net>)``) joins the run's metrics when it evaluated the run's last
step. Per group, every held-out metric of ``metrics.json`` (PSNR, SSIM under its named conventions,
MS-SSIM with its number of scales, LPIPS when the runs or their evaluations computed it), the
training time, ms per step and the loss's share of the step get n, mean, standard deviation and a
95 % confidence interval (Student t, cut to the quantity's range: no time below 0, no SSIM above
1); a quantity that only some of a group's runs have says so (``2 of 3 runs``); each group is
compared with a baseline group (the first, or ``--baseline``) on the seeds both finished: the mean
paired difference, its 95 % confidence interval and the paired t-test's p-value say which
differences are established. Written into ``--out`` (default: the multirun folder):

- ``report.md``: the tables, the findings in words, links to the figures;
- ``report.tex``: the held-out, cost and difference tables (booktabs);
- ``summary.csv``: one row per group and quantity, every statistic and the paired difference;
- ``figures/{metrics,differences,convergence,step_time}.{pdf,png}``: the held-out metrics per group
  (seeds and interval), the paired differences, held-out PSNR against the step (mean and band over
  seeds; the training loss when the runs did not evaluate during training) beside the step time,
  and where a step's time goes;
- ``report.html``: one self-contained page with the tables, the figures and the held-out renders of
  every group beside the ground truth, with an enlarged crop where they differ most.

Runs that did not finish are listed with their error, read from the run's log: a run folder without
``metrics.json``, or whose ``metrics.json`` says it was interrupted; a group with fewer finished
seeds than the sweep says which are missing. Exits 1 when no run finished, 0 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List, Optional, Sequence

from ..atomic import atomic_output
from .labels import readable_overrides, round_float
from .runs import Run, collect, collect_all, log_error
from .stats import ALPHA, CONFIDENCE, Group, choose_baseline, common_overrides, group_runs, quantities
from .tables import (
    Table,
    cost_table,
    differences_table,
    failed_table,
    findings,
    held_out_table,
    runs_table,
    seeds_note,
    statistics_table,
    summary_csv,
)

__all__ = ["main", "build", "Report", "collect_all", "group_runs", "log_error", "readable_overrides", "round_float"]

_FIGURE_TITLES = {
    "metrics": "Held-out metrics per configuration",
    "differences": "Paired differences against the baseline",
    "convergence": "Convergence and step time",
    "step_time": "Where a training step's time goes",
}


class Report:
    """Everything the report says about one sweep folder, before it is written anywhere.

    Attributes:
        runs: every run folder (:func:`~splatloss.report.runs.collect_all`), with the results of
            ``splatloss-eval`` run on it.
        notes: a sentence for each evaluation folder that does not count, and why.
        groups: the runs grouped by configuration (:func:`~splatloss.report.stats.group_runs`).
        baseline: the index of the baseline group in ``groups`` (``None`` when no run finished).
        expected_seeds: how many different seeds the sweep's runs have (finished or not).
    """

    def __init__(self, sweep_dir: str, baseline: Optional[str] = None, seed_key: str = "seed"):
        self.sweep_dir = sweep_dir
        self.text = ""  # report.md, once build() has written it
        self.runs: List[Run]
        self.runs, self.notes = collect(sweep_dir, seed_key)
        self.groups: List[Group] = group_runs(self.runs, seed_key)
        self.held, self.cost = quantities(self.runs)
        self.finished = any(g.runs for g in self.groups)
        self.baseline = choose_baseline(self.groups, baseline) if self.finished else None
        self.expected_seeds = max(
            len({r.seed for r in self.runs}), max((len(g.runs) + len(g.failed) for g in self.groups), default=0)
        )

    def tables(self) -> Dict[str, Optional[Table]]:
        g, b = self.groups, self.baseline
        if not self.finished:
            return {"failed": failed_table(g)}
        return {
            "held_out": held_out_table(g, self.held, self.expected_seeds) if self.held else None,
            "cost": cost_table(g, self.cost, self.expected_seeds) if self.cost else None,
            "differences": differences_table(g, b, self.held + self.cost) if len(g) > 1 else None,
            "failed": failed_table(g),
            "statistics": statistics_table(g, self.held + self.cost),
            "runs": runs_table(g, self.held[:3] + [q for q in self.cost if q.key == "step_ms"]),
        }

    def intro(self) -> List[str]:
        n_runs = len(self.runs)
        seeds = sorted({r.seed for r in self.runs if r.seed is not None})
        lines = [
            f"{n_runs} run{'s' if n_runs != 1 else ''} in {len(self.groups)} configuration"
            f"{'s' if len(self.groups) != 1 else ''}"
            + (f", seeds {', '.join(map(str, seeds))}" if seeds else "")
            + (f"; baseline: group {self.baseline + 1} ({self.groups[self.baseline].label})." if self.finished else ".")
        ]
        shared = common_overrides(self.groups)
        if shared and len(self.runs) > 1:
            lines.append("Common to all runs: " + " ".join(f"`{o}`" for o in shared))
        lines += seeds_note(self.groups, self.expected_seeds)
        return lines + self.notes

    def findings(self) -> List[str]:
        if not self.finished or len(self.groups) < 2:
            return []
        return findings(self.groups, self.baseline, self.held)

    def markdown(self, figures: Dict[str, List[str]], out_dir: str) -> str:
        lines = [f"# Sweep report: {self.sweep_dir}", ""] + [f"{p}\n" for p in self.intro()]
        if not self.finished:
            lines = ["No run finished.", ""] + lines
        found = self.findings()
        if found:
            lines += ["## Findings", ""] + [f"- {f}" for f in found] + [""]
            lines += [
                f"Established: the paired t-test over seeds gives p < {ALPHA:.2f}, i.e. the {CONFIDENCE:.0%} "
                "confidence interval of the mean difference excludes 0.",
                "",
            ]
        tables = self.tables()
        order = ["held_out", "differences", "cost", "failed"]
        if any(tables.get(k) for k in order):
            lines += ["## Tables", ""] + [tables[k].markdown() for k in order if tables.get(k)]
        if figures:
            lines += ["## Figures", ""]
            for name, paths in figures.items():
                png = os.path.relpath(next(p for p in paths if p.endswith(".png")), out_dir)
                pdf = os.path.relpath(next(p for p in paths if p.endswith(".pdf")), out_dir)
                lines += [f"![{_FIGURE_TITLES.get(name, name)}]({png}) ([PDF]({pdf}))", ""]
        rest = [tables[k] for k in ("statistics", "runs") if tables.get(k)]
        if rest:
            lines += ["## Details", ""] + [t.markdown() for t in rest]
        return "\n".join(lines).rstrip() + "\n"

    def latex(self) -> str:
        tables = self.tables()
        body = [tables[k].latex() for k in ("held_out", "differences", "cost") if tables.get(k)]
        head = [
            f"% Sweep report of {self.sweep_dir} (splatloss-report). Needs \\usepackage{{booktabs}};",
            "% \\input{report.tex} where the tables go.",
        ]
        return "\n".join(head) + "\n\n" + "\n".join(body)

    def csv(self) -> str:
        return summary_csv(self.groups, self.baseline, self.held + self.cost, self.expected_seeds)


def _write_text(path: str, text: str) -> None:
    with atomic_output(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def build(sweep_dir: str, out_dir: Optional[str] = None, baseline: Optional[str] = None,
          seed_key: str = "seed", views: int = 3) -> Report:  # fmt: skip
    """Read ``sweep_dir``, write every output into ``out_dir`` (default ``sweep_dir``), return the :class:`Report`."""
    from .figures import write_all
    from .page import html_page, render_grid

    report = Report(sweep_dir, baseline, seed_key)
    out = out_dir or sweep_dir
    os.makedirs(out, exist_ok=True)
    figures = write_all(report.groups, report.baseline, report.held, out) if report.finished else {}
    md = report.markdown(figures, out)
    _write_text(os.path.join(out, "report.md"), md)
    report.text = md
    if not report.finished:
        return report
    _write_text(os.path.join(out, "report.tex"), report.latex())
    _write_text(os.path.join(out, "summary.csv"), report.csv())
    renders, notes = render_grid(report.groups, views)
    tables = report.tables()
    page = html_page(
        f"Sweep report: {sweep_dir}",
        report.intro() + report.findings(),
        [tables.get(k) for k in ("held_out", "differences", "cost", "failed", "statistics", "runs")],
        figures,
        renders,
        notes,
    )
    _write_text(os.path.join(out, "report.html"), page)
    return report


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="splatloss-report", description=__doc__.splitlines()[0])
    ap.add_argument("multirun_dir", help="a Hydra multirun folder, e.g. multirun/2026-01-01/12-00-00")
    ap.add_argument("--out", default=None, help="where to write the report (default: multirun_dir)")
    ap.add_argument(
        "--baseline",
        default=None,
        help="the group the others are compared with: its number in the report (from 1), its label, or "
        "overrides only it has, e.g. 'loss=l1' (default: the first group)",
    )
    ap.add_argument("--seed-key", default="seed", help="the override that varies the seed (default: seed)")
    ap.add_argument("--views", type=int, default=3, help="held-out views shown in report.html (default: 3)")
    args = ap.parse_args(argv)
    if args.views < 1:
        ap.error(f"--views must be >= 1, got {args.views}")
    out = args.out or args.multirun_dir
    report = build(args.multirun_dir, out, args.baseline, args.seed_key, args.views)
    sys.stdout.write(report.text)
    if not report.finished:
        print(f"\nwrote {os.path.join(out, 'report.md')} (no figure: no run finished)")
        return 1
    names = ["report.md", "report.tex", "summary.csv", "report.html", "figures/"]
    print(f"\nwrote {', '.join(names)} into {out}")
    return 0
