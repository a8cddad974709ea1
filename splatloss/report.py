"""Turn a Hydra multirun folder into one Markdown table and one PNG plot.

    splatloss-report multirun/2026-01-01/12-00-00 [--out DIR]     (also ./dev report, python -m splatloss.report)

Reads every ``metrics.json`` below the folder (one per run, written by ``splatloss.train``) and
each run's ``.hydra/overrides.yaml`` (what differs between runs), then writes ``report.md`` and
``report.png`` (into ``--out``, default the multirun folder) and prints the table.

Runs that did not finish are listed below the table with their error, never dropped: a run folder
(one with ``.hydra/``) without ``metrics.json``, or whose ``metrics.json`` says it was interrupted.
The error is read from the run's log (Hydra's ``<run>/<job name>.log``): its first ERROR record (the
exception's last line when the record carries a traceback), else the last line of a traceback in it.
Float values in the run labels (e.g. Optuna's ``loss.lambda_dssim=0.5488135039273248``) are shown
with 4 significant digits, more where two runs would otherwise read the same. Exits 1 when no run
finished, 0 otherwise.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import sys
from typing import Dict, List, Optional

from splatloss._atomic import atomic_output

COLUMNS = [
    # (header, key, format)
    ("PSNR (dB)", "psnr", "{:.2f}"),
    ("SSIM", "ssim", "{:.4f}"),
    ("MS-SSIM", "ms_ssim", "{:.4f}"),
    ("PSNR untrained", "psnr_init", "{:.2f}"),
    ("SSIM (3DGS)", "ssim_3dgs", "{:.4f}"),
    ("SSIM (skimage)", "ssim_skimage", "{:.4f}"),
    ("steps", "steps", "{:d}"),
    ("train s", "train_seconds", "{:.1f}"),
    ("ms / step", "step_ms", "{:.1f}"),
    ("loss share", "loss_share_pct", "{:.1f}%"),
    ("Gaussians", "num_gaussians", "{:d}"),
]


def _overrides(run_dir: str) -> List[str]:
    path = os.path.join(run_dir, ".hydra", "overrides.yaml")
    if not os.path.isfile(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("- "):
                out.append(line[2:].strip().strip("'\""))
    return out


# A record of Hydra's job log file: "[2026-01-01 12:00:00,000][splatloss.train][ERROR] - message".
_RECORD = re.compile(r"^\[[^\]]*\]\[[^\]]*\]\[([A-Z]+)\] - (.*)$")
_TRACEBACK = "Traceback (most recent call last):"


def _exception_line(lines: List[str]) -> Optional[str]:
    """The ``Type: message`` line that ends the last traceback in ``lines`` (None: no traceback)."""
    starts = [i for i, line in enumerate(lines) if line.strip() == _TRACEBACK]
    if not starts:
        return None
    tail = [line for line in lines[starts[-1] + 1 :] if line.strip()]
    # Frames are indented; the exception is the first line after them that is not.
    unindented = [line for line in tail if not line.startswith((" ", "\t"))]
    return unindented[0].strip() if unindented else None


def log_error(run_dir: str) -> Optional[str]:
    """Why a run failed, as its log says (see the module docstring); None when no log says it."""
    for path in sorted(glob.glob(os.path.join(run_dir, "*.log"))):
        try:
            with open(path, errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        name = os.path.basename(path)
        for i, line in enumerate(lines):
            m = _RECORD.match(line)
            if not m or m.group(1) not in ("ERROR", "CRITICAL"):
                continue
            rest = []
            for cont in lines[i + 1 :]:
                if _RECORD.match(cont):
                    break
                rest.append(cont)
            return f"{_exception_line(rest) or m.group(2).strip()} ({name})"
        exc = _exception_line(lines)
        if exc:
            return f"{exc} ({name})"
    return None


def _failure(run_dir: str, what: str) -> str:
    """``what`` and the log's error, or what the log (or its absence) shows instead."""
    err = log_error(run_dir)
    if err:
        return f"{what}: {err}"
    logs = sorted(glob.glob(os.path.join(run_dir, "*.log")))
    if not logs:
        return f"{what}; no log file in the run folder"
    with open(logs[-1], errors="replace") as f:
        last = [line for line in f.read().splitlines() if line.strip()]
    name = os.path.basename(logs[-1])
    if not last:
        return f"{what}; {name} is empty (the job failed before logging, or is still running)"
    return f"{what}; no error in {name}, which ends: {last[-1].strip()}"


def _is_run(files, dirs) -> bool:
    return "metrics.json" in files or ".hydra" in dirs


def collect_all(multirun_dir: str):
    """``(rows, failed)``: one dict per finished run (its metrics plus ``run``, ``overrides``,
    ``label``) and one per failed or interrupted run (``run``, ``overrides``, ``label``,
    ``error``), each sorted by run folder."""
    if not os.path.isdir(multirun_dir):
        raise SystemExit(f"splatloss-report: {multirun_dir!r} is not a directory")
    rows, failed = [], []
    for root, dirs, files in os.walk(multirun_dir):
        is_run = _is_run(files, dirs)
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        if not is_run:
            continue
        rel = os.path.relpath(root, multirun_dir)
        entry = {"run": rel, "overrides": _overrides(root)}
        if "metrics.json" not in files:
            failed.append({**entry, "error": _failure(root, "no metrics.json")})
            continue
        try:
            with open(os.path.join(root, "metrics.json")) as f:
                m = json.load(f)
        except (OSError, ValueError) as e:
            failed.append({**entry, "error": _failure(root, f"metrics.json unreadable ({e})")})
            continue
        if m.get("interrupted"):
            what = f"interrupted by {m['interrupted']} at step {m.get('steps', '?')}"
            failed.append({**entry, "error": _failure(root, what), "steps": m.get("steps")})
            continue
        m.update(entry)
        m["step_ms"] = 1000.0 * m["step_seconds"] if m.get("step_seconds") is not None else None
        m["loss_share_pct"] = 100.0 * m["loss_share"] if m.get("loss_share") is not None else None
        rows.append(m)
    if not rows and not failed:
        raise SystemExit(
            f"splatloss-report: no metrics.json under {multirun_dir!r} and no run folder (.hydra/) either "
            "(is this the multirun folder, e.g. multirun/2026-01-01/12-00-00?)"
        )

    def key(r):
        head = r["run"].split(os.sep)[0]
        return (int(head) if head.isdigit() else math.inf, r["run"])

    rows, failed = sorted(rows, key=key), sorted(failed, key=key)
    everyone = rows + failed
    # Label each run by what differs between the runs (the swept values), not what they share.
    common = set.intersection(*(set(r["overrides"]) for r in everyone)) if len(everyone) > 1 else set()
    shown = readable_overrides([o for r in everyone for o in r["overrides"]])
    for r in everyone:
        diff = [shown[o] for o in r["overrides"] if o not in common]
        r["label"] = " ".join(diff) if diff else (r.get("loss_name") or r["run"])
    return rows, failed


def collect(multirun_dir: str) -> List[Dict]:
    """The finished runs of :func:`collect_all` (their metrics plus ``run``, ``label``), sorted by
    run folder; exits when there is none."""
    rows, _ = collect_all(multirun_dir)
    if not rows:
        raise SystemExit(f"splatloss-report: no metrics.json under {multirun_dir!r} (did the runs finish?)")
    return rows


_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][+-]?\d+)$")


def _significant(text: str) -> int:
    """Significant digits of a decimal literal (``"0.250"`` -> 2, ``"3.0"`` -> 1)."""
    mantissa = re.split(r"[eE]", text.lstrip("+-"))[0].replace(".", "")
    return max(1, len(mantissa.strip("0")))


def round_float(text: str, digits: int = 4) -> str:
    """A float literal with at most ``digits`` significant digits; other text unchanged.

    Examples:
        >>> round_float("0.5488135039273248"), round_float("0.20000000000000001"), round_float("3.0")
        ('0.5488', '0.2', '3.0')
        >>> round_float("1e-05"), round_float("adam"), round_float("12")
        ('1e-05', 'adam', '12')
    """
    if not _FLOAT.match(text):
        return text
    value = float(text)
    shortest = repr(value)  # the shortest text that reads back as this float
    return shortest if _significant(shortest) <= digits else f"{value:.{digits}g}"


def readable_overrides(overrides: List[str], digits: int = 4) -> Dict[str, str]:
    """``{override: shown}``: float values rounded by :func:`round_float` to ``digits`` significant
    digits, or to more where two different values of one key would otherwise look the same.

    Examples:
        >>> readable_overrides(["a=0.123456", "a=0.123457", "b=0.5488135039273248"])["a=0.123456"]
        'a=0.123456'
        >>> readable_overrides(["a=0.123456", "b=0.5488135039273248"])["b=0.5488135039273248"]
        'b=0.5488'
    """
    by_key: Dict[str, set] = {}
    for o in overrides:
        k, sep, v = o.partition("=")
        if sep and _FLOAT.match(v):
            by_key.setdefault(k, set()).add(v)
    shown = {o: o for o in overrides}
    for k, values in by_key.items():
        d = digits
        while d < 17 and len({float(round_float(v, d)) for v in values}) < len({float(v) for v in values}):
            d += 1
        for v in values:
            shown[f"{k}={v}"] = f"{k}={round_float(v, d)}"
    return shown


def common_overrides(rows: List[Dict]) -> List[str]:
    if not rows:
        return []
    common = set.intersection(*(set(r["overrides"]) for r in rows))
    shown = readable_overrides(rows[0]["overrides"])
    return [shown[o] for o in rows[0]["overrides"] if o in common]


def _fmt(fmt: str, v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if "{:d}" in fmt:
        v = int(v)
    return fmt.format(v)


def _cell(text: str) -> str:
    """Text safe in one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def markdown(rows: List[Dict], failed: Optional[List[Dict]] = None) -> str:
    """The report: a table of the finished runs, the overrides common to all runs, and a table of
    the runs that failed or were interrupted, with their error."""
    failed = failed or []
    lines = []
    if rows:
        lines += [
            "| run | " + " | ".join(h for h, _, _ in COLUMNS) + " |",
            "|---|" + "|".join("---:" for _ in COLUMNS) + "|",
        ]
        for r in rows:
            lines.append(f"| {r['label']} | " + " | ".join(_fmt(fmt, r.get(k)) for _, k, fmt in COLUMNS) + " |")
    else:
        lines.append("No run finished.")
    shared = common_overrides(rows + failed)
    if shared and len(rows + failed) > 1:
        lines += ["", "Common to all runs: " + " ".join(f"`{o}`" for o in shared)]
    if failed:
        lines += [
            "",
            f"Failed or interrupted: {len(failed)} of {len(rows) + len(failed)} runs (not in the table or the plot).",
            "",
            "| run | folder | error |",
            "|---|---|---|",
        ]
        lines += [f"| {_cell(r['label'])} | {_cell(r['run'])} | {_cell(r['error'])} |" for r in failed]
    return "\n".join(lines) + "\n"


def _atomic_write(path: str, write) -> None:
    with atomic_output(path) as tmp:
        write(tmp)


def plot(rows: List[Dict], path: str, num_failed: int = 0):
    """Held-out PSNR (trained beside untrained) and SSIM / MS-SSIM per run, written to ``path``.

    The SSIM axis stays within [0, 1] (the values' own range): the legend sits above the axes and
    each value is written inside its bar. Returns the closed matplotlib Figure (its axes keep their
    limits and labels).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    labels = [r["label"] for r in rows]
    x = np.arange(len(rows))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(max(8, 2.2 * len(rows) + 4), 4.2))
    psnr = [r.get("psnr") or 0.0 for r in rows]
    psnr0 = [r.get("psnr_init") or 0.0 for r in rows]
    a1.bar(x - 0.2, psnr0, 0.4, label="untrained", color="0.7")
    a1.bar(x + 0.2, psnr, 0.4, label="trained", color="C0")
    for xi, v in zip(x, psnr):
        a1.text(xi + 0.2, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    a1.set_ylabel("held-out PSNR (dB)")
    a1.set_ylim(0, 1.2 * max(psnr + psnr0 + [1.0]))  # head room for the labels and the legend
    a1.set_xticks(x, labels, rotation=20, ha="right", fontsize=8)
    a1.legend(fontsize=8, loc="upper left", ncol=2)
    lo = min([r.get(k) or 1.0 for r in rows for k in ("ssim", "ms_ssim")])
    # SSIM <= 1: the axis ends at 1, never above; it starts below the lowest bar (at 0.95 at most).
    bottom = min(max(0.0, min(lo - 0.25 * (1.0 - lo), lo - 0.02)), 0.95)
    a2.set_ylim(bottom, 1.0)
    for off, key, name, color in ((-0.2, "ssim", "SSIM", "C1"), (0.2, "ms_ssim", "MS-SSIM", "C2")):
        vals = [r.get(key) or 0.0 for r in rows]
        a2.bar(x + off, vals, 0.4, label=name, color=color)
        for xi, v in zip(x, vals):
            # A tall bar carries its value inside, below its top, so no label needs room above 1.
            inside = v - bottom > 0.5 * (1.0 - bottom)
            a2.text(xi + off, v, f"{v:.3f}", ha="center", va="top" if inside else "bottom", fontsize=7)
    a2.set_ylabel("held-out SSIM / MS-SSIM")
    a2.set_xticks(x, labels, rotation=20, ha="right", fontsize=8)
    a2.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, frameon=False)
    if num_failed:
        fig.suptitle(f"{num_failed} failed or interrupted run(s) not shown: see report.md", fontsize=9)
    fig.tight_layout()
    _atomic_write(path, lambda p: fig.savefig(p, dpi=120, format="png"))
    plt.close(fig)
    return fig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="splatloss-report", description=__doc__.splitlines()[0])
    ap.add_argument("multirun_dir", help="a Hydra multirun folder, e.g. multirun/2026-01-01/12-00-00")
    ap.add_argument("--out", default=None, help="where to write report.md and report.png (default: multirun_dir)")
    args = ap.parse_args(argv)
    rows, failed = collect_all(args.multirun_dir)
    out = args.out or args.multirun_dir
    os.makedirs(out, exist_ok=True)
    table = markdown(rows, failed)

    def write_md(p):
        with open(p, "w") as f:
            f.write(table)

    _atomic_write(os.path.join(out, "report.md"), write_md)
    sys.stdout.write(table)
    if not rows:
        print(f"\nwrote {os.path.join(out, 'report.md')} (no plot: no run finished)")
        return 1
    plot(rows, os.path.join(out, "report.png"), num_failed=len(failed))
    print(f"\nwrote {os.path.join(out, 'report.md')} and {os.path.join(out, 'report.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
