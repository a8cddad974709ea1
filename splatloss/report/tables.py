"""The report's tables, built once and written as Markdown, LaTeX (booktabs), HTML and CSV."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

from .labels import html_text, md_cell, tex
from .stats import ALPHA, CONFIDENCE, Group, Paired, Quantity, Stat, compare

__all__ = [
    "Table",
    "fmt",
    "held_out_table",
    "cost_table",
    "differences_table",
    "statistics_table",
    "runs_table",
    "failed_table",
    "seeds_note",
    "findings",
    "summary_csv",
]

DASH = "–"


@dataclass
class Table:
    """A titled table: header, rows of cell text, the columns that hold numbers, notes under it."""

    title: str
    header: List[str]
    rows: List[List[str]]
    numeric: List[bool]
    notes: List[str] = field(default_factory=list)
    label: str = ""

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", "| " + " | ".join(md_cell(h) for h in self.header) + " |"]
        lines.append("|" + "|".join("---:" if n else "---" for n in self.numeric) + "|")
        lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in self.rows]
        lines += [""] + [f"{n}" for n in self.notes] if self.notes else []
        return "\n".join(lines) + "\n"

    def latex(self) -> str:
        spec = "".join("r" if n else "l" for n in self.numeric)
        lines = [
            r"\begin{table}[t]",
            r"\centering",
            r"\small",
            rf"\caption{{{tex(self.title)}{'. ' + tex(' '.join(self.notes)) if self.notes else ''}}}",
        ]
        if self.label:
            lines.append(rf"\label{{tab:{self.label}}}")
        lines += [rf"\begin{{tabular}}{{{spec}}}", r"\toprule", " & ".join(tex(h) for h in self.header) + r" \\"]
        lines += [r"\midrule"] + [" & ".join(tex(c) for c in row) + r" \\" for row in self.rows]
        lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
        return "\n".join(lines) + "\n"

    def html(self) -> str:
        head = "".join(f"<th>{html_text(h)}</th>" for h in self.header)
        body = "".join(
            "<tr>" + "".join(f'<td class="{"num" if n else ""}">{html_text(c)}</td>' for c, n in zip(row, self.numeric))
            + "</tr>"
            for row in self.rows
        )  # fmt: skip
        notes = "".join(f"<p class='note'>{html_text(n)}</p>" for n in self.notes)
        return (
            f"<h3>{html_text(self.title)}</h3><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{notes}"
        )


def fmt(value: float, decimals: int) -> str:
    if value is None or not math.isfinite(value):
        return DASH
    return f"{value:,.{decimals}f}".replace(",", " ") if abs(value) >= 1e4 else f"{value:.{decimals}f}"


def _mean_ci(s: Stat, q: Quantity, runs: int) -> str:
    """``mean ± half-width`` (``mean [low, high]`` where the range of the quantity cut the interval),
    and ``(n of N runs)`` when only ``n`` of the group's ``runs`` finished runs have the quantity."""
    if s.n == 0:
        return DASH
    part = f" ({s.n} of {runs} runs)" if s.n < runs else ""
    if s.n < 2:
        return fmt(s.mean, q.decimals) + part
    return f"{fmt(s.mean, q.decimals)} {_interval(s, q)}{part}"


def _interval(s: Stat, q: Quantity) -> str:
    if s.cut:
        return f"[{fmt(s.low, q.decimals)}, {fmt(s.high, q.decimals)}]"
    return f"± {fmt(s.half, q.decimals)}"


def _header(q: Quantity) -> str:
    arrow = "" if q.higher_is_better is None else (" ↑" if q.higher_is_better else " ↓")
    return f"{q.name}{f' ({q.unit})' if q.unit else ''}{arrow}"


def _seeds_cell(g: Group, expected: int) -> str:
    n = len(g.runs)
    return f"{n} of {expected}" if n < expected else str(n)


def seeds_note(groups: Sequence[Group], expected: int) -> List[str]:
    """One line per group with fewer finished seeds than the sweep's seeds, naming the missing ones."""
    all_seeds = sorted({r.seed for g in groups for r in g.runs + g.failed if r.seed is not None})
    out = []
    for i, g in enumerate(groups):
        if len(g.runs) >= expected:
            continue
        missing = [s for s in all_seeds if s not in {r.seed for r in g.runs}]
        failed = {r.seed: r.folder for r in g.failed}
        why = ", ".join(
            f"{s} ({'failed or interrupted: run ' + failed[s] if s in failed else 'no run'})" for s in missing
        )
        out.append(
            f"Group {i + 1} ({g.label}) has {len(g.runs)} finished seed{'s' if len(g.runs) != 1 else ''} of {expected}"
            + (f"; missing seed {why}" if why else "")
            + "."
        )
    return out


def scales_note(groups: Sequence[Group]) -> List[str]:
    """A sentence naming each group's number of MS-SSIM scales, when the groups' differ."""
    per = [(i, g, g.scales()) for i, g in enumerate(groups) if g.scales()]
    if len({tuple(s) for _, _, s in per}) < 2:
        return []
    parts = [f"{'/'.join(map(str, s))}{' scales' if k == 0 else ''} in group {i + 1} ({g.label})"
             for k, (i, g, s) in enumerate(per)]  # fmt: skip
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return [f"MS-SSIM has {listed}: as many as the views' size allows; values of different scales are not comparable."]


def held_out_table(groups: Sequence[Group], held: Sequence[Quantity], expected: int) -> Table:
    rows = [[str(i + 1), g.label, _seeds_cell(g, expected)] + [_mean_ci(g.stat(q.key), q, len(g.runs)) for q in held]
            for i, g in enumerate(groups)]  # fmt: skip
    cut = any(g.stat(q.key).cut for g in groups for q in held)
    return Table(
        f"Held-out metrics: mean ± half-width of the {CONFIDENCE:.0%} confidence interval (Student t) over seeds",
        ["#", "configuration", "seeds"] + [_header(q) for q in held],
        rows,
        [True, False, True] + [True] * len(held),
        notes=scales_note(groups) + ([_CUT_NOTE] if cut else []),
        label="held-out",
    )


_CUT_NOTE = (
    "[low, high]: Student t's interval cut to the values the quantity can take (no time below 0, no SSIM above 1); "
    "it holds the true mean as often as the uncut interval."
)


def cost_table(groups: Sequence[Group], cost: Sequence[Quantity], expected: int) -> Table:
    rows = [[str(i + 1), g.label, _seeds_cell(g, expected)] + [_mean_ci(g.stat(q.key), q, len(g.runs)) for q in cost]
            for i, g in enumerate(groups)]  # fmt: skip
    return Table(
        f"Training cost: mean ± half-width of the {CONFIDENCE:.0%} confidence interval over seeds",
        ["#", "configuration", "seeds"] + [_header(q) for q in cost],
        rows,
        [True, False, True] + [True] * len(cost),
        notes=[
            "Step time and loss share are each run's median over its timed steps; the loss share is measured "
            "within each run, so it compares across machines better than the step time does."
        ]
        + ([_CUT_NOTE] if any(g.stat(q.key).cut for g in groups for q in cost) else []),
        label="cost",
    )


def _p(p: float) -> str:
    if not math.isfinite(p):
        return DASH
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def differences(groups: Sequence[Group], base: int, qs: Sequence[Quantity]):
    """``[(group index, quantity, Paired)]`` for every group but the baseline."""
    return [(i, q, compare(groups[base], g, q.key)) for i, g in enumerate(groups) if i != base and g.runs for q in qs]


def _verdict(d: Paired, q: Quantity) -> str:
    if d.not_comparable:
        return d.not_comparable
    if d.n < 2:
        return "too few pairs"
    if d.std == 0.0 and d.mean == 0.0:
        return "identical on every seed"
    if not d.established:
        return "no"
    if q.higher_is_better is None:
        return "yes"
    better = (d.mean > 0) == q.higher_is_better
    return "yes, better" if better else "yes, worse"


def differences_table(groups: Sequence[Group], base: int, qs: Sequence[Quantity]) -> Table:
    rows = []
    for i, q, d in differences(groups, base, qs):
        ci = DASH if not math.isfinite(d.low) else f"[{fmt(d.low, q.decimals)}, {fmt(d.high, q.decimals)}]"
        sign = "+" if d.mean > 0 else ""
        delta = fmt(d.mean, q.decimals) if not math.isfinite(d.mean) else f"{sign}{fmt(d.mean, q.decimals)}"
        rows.append([str(i + 1), groups[i].label, _header(q), delta, ci, _p(d.p), str(d.n), _verdict(d, q)])
    return Table(
        f"Paired differences against group {base + 1} ({groups[base].label}), paired by seed",
        ["#", "configuration", "quantity", "Δ mean", f"{CONFIDENCE:.0%} CI", "p (paired t)", "pairs", "established"],
        rows,
        [True, False, False, True, True, True, True, False],
        notes=[
            "Δ = configuration − baseline on the same seed. Established: the paired t-test's two-sided "
            f"p < {ALPHA:.2f} (the {CONFIDENCE:.0%} CI excludes 0); p is not corrected for the number of comparisons."
        ],
        label="differences",
    )


def findings(groups: Sequence[Group], base: int, qs: Sequence[Quantity]) -> List[str]:
    """One sentence per group on the first held-out metric (PSNR): the difference and whether it is established."""
    if not qs:
        return []
    q = qs[0]
    out = []
    for i, _, d in differences(groups, base, [q]):
        name, unit = q.name, f" {q.unit}" if q.unit else ""
        if d.n < 2:
            out.append(
                f"{groups[i].label}: {d.n} seed paired with the baseline, too few to test a difference in {name}."
            )
            continue
        verb = "raises" if d.mean > 0 else "lowers"
        stated = "established" if d.established else "not established"
        out.append(
            f"{groups[i].label} {verb} held-out {name} by {fmt(abs(d.mean), q.decimals)}{unit} against "
            f"{groups[base].label} ({CONFIDENCE:.0%} CI {fmt(d.low, q.decimals)} to {fmt(d.high, q.decimals)}{unit}, "
            f"paired t-test p {_p(d.p) if _p(d.p).startswith('<') else '= ' + _p(d.p)}, {d.n} seeds): {stated}."
        )
    return out


def statistics_table(groups: Sequence[Group], qs: Sequence[Quantity]) -> Table:
    rows = []
    for i, g in enumerate(groups):
        for q in qs:
            s = g.stat(q.key)
            if s.n:
                ci = f"[{fmt(s.low, q.decimals)}, {fmt(s.high, q.decimals)}]" if s.n > 1 else DASH
                rows.append(
                    [str(i + 1), g.label, _header(q), str(s.n), fmt(s.mean, q.decimals), fmt(s.std, q.decimals), ci]
                )
    return Table(
        f"Every statistic: n, mean, standard deviation (n − 1) and {CONFIDENCE:.0%} confidence interval of the mean",
        ["#", "configuration", "quantity", "n", "mean", "std", f"{CONFIDENCE:.0%} CI"],
        rows,
        [True, False, False, True, True, True, True],
        label="statistics",
    )


def runs_table(groups: Sequence[Group], qs: Sequence[Quantity]) -> Table:
    rows = []
    for i, g in enumerate(groups):
        for r in g.runs:
            m = r.metrics
            vals = [fmt(m.get(q.key) if isinstance(m.get(q.key), (int, float)) else math.nan, q.decimals) for q in qs]
            rows.append(
                [r.folder, str(i + 1), "–" if r.seed is None else str(r.seed), *vals, str(m.get("steps", DASH))]
            )
    return Table(
        "Every finished run",
        ["run", "group", "seed"] + [_header(q) for q in qs] + ["steps"],
        rows,
        [False, True, True] + [True] * len(qs) + [True],
    )


def failed_table(groups: Sequence[Group]) -> Optional[Table]:
    rows = [[r.folder, str(i + 1), g.label, "–" if r.seed is None else str(r.seed), r.error or ""]
            for i, g in enumerate(groups) for r in g.failed]  # fmt: skip
    if not rows:
        return None
    total = sum(len(g.runs) + len(g.failed) for g in groups)
    rows.sort(key=lambda row: (not row[0].isdigit(), int(row[0]) if row[0].isdigit() else 0, row[0]))
    return Table(
        f"Failed or interrupted: {len(rows)} of {total} runs (in no statistic, figure or render)",
        ["run", "group", "configuration", "seed", "error"],
        rows,
        [False, True, False, True, False],
    )


def summary_csv(groups: Sequence[Group], base: int, qs: Sequence[Quantity], expected: int) -> str:
    """One row per group and quantity: the group's statistics and its paired difference to the baseline."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(
        ["group", "label", "overrides", "seeds_finished", "seeds_expected", "runs_failed", "quantity", "n", "mean",
         "std", "ci95_low", "ci95_high", "baseline", "diff_mean", "diff_std", "diff_ci95_low", "diff_ci95_high",
         "diff_p_paired_t", "diff_pairs", "diff_established"]
    )  # fmt: skip

    def num(v):
        return "" if v is None or not math.isfinite(v) else repr(float(v))

    for i, g in enumerate(groups):
        for q in qs:
            s = g.stat(q.key)
            row = [i + 1, g.label, " ".join(g.overrides), len(g.runs), expected, len(g.failed), q.key, s.n,
                   num(s.mean), num(s.std), num(s.low), num(s.high), base + 1]  # fmt: skip
            if i == base or not g.runs:
                row += ["", "", "", "", "", "", ""]
            else:
                d = compare(groups[base], g, q.key)
                row += [num(d.mean), num(d.std), num(d.low), num(d.high), num(d.p), d.n, str(d.established).lower()]
            w.writerow(row)
    return out.getvalue()
