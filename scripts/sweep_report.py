#!/usr/bin/env python
"""Turn a Hydra multirun folder into one Markdown table and one PNG plot.

    python scripts/sweep_report.py multirun/2026-01-01/12-00-00 [--out DIR]

Reads every ``metrics.json`` below the folder (one per run, written by ``splatloss.train``) and
each run's ``.hydra/overrides.yaml`` (what differs between runs), then writes ``report.md`` and
``report.png`` (into ``--out``, default the multirun folder) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Dict, List

from splatloss._atomic import atomic_output

COLUMNS = [
    # (header, key, format)
    ("PSNR (dB)", "psnr", "{:.2f}"),
    ("SSIM", "ssim", "{:.4f}"),
    ("MS-SSIM", "ms_ssim", "{:.4f}"),
    ("PSNR untrained", "psnr_init", "{:.2f}"),
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


def collect(multirun_dir: str) -> List[Dict]:
    """One dict per run (its metrics plus ``run``, ``label``), sorted by run folder."""
    if not os.path.isdir(multirun_dir):
        raise SystemExit(f"sweep_report: {multirun_dir!r} is not a directory")
    rows = []
    for root, dirs, files in os.walk(multirun_dir):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        if "metrics.json" not in files:
            continue
        with open(os.path.join(root, "metrics.json")) as f:
            m = json.load(f)
        rel = os.path.relpath(root, multirun_dir)
        ov = _overrides(root)
        m["run"] = rel
        m["overrides"] = ov
        m["step_ms"] = 1000.0 * m["step_seconds"] if m.get("step_seconds") is not None else None
        m["loss_share_pct"] = 100.0 * m["loss_share"] if m.get("loss_share") is not None else None
        rows.append(m)
    if not rows:
        raise SystemExit(f"sweep_report: no metrics.json under {multirun_dir!r} (did the runs finish?)")

    def key(r):
        head = r["run"].split(os.sep)[0]
        return (int(head) if head.isdigit() else math.inf, r["run"])

    rows = sorted(rows, key=key)
    # Label each run by what differs between the runs (the swept values), not what they share.
    common = set.intersection(*(set(r["overrides"]) for r in rows)) if len(rows) > 1 else set()
    for r in rows:
        diff = [o for o in r["overrides"] if o not in common]
        r["label"] = " ".join(diff) if diff else (r.get("loss_name") or r["run"])
    return rows


def common_overrides(rows: List[Dict]) -> List[str]:
    if not rows:
        return []
    common = set.intersection(*(set(r["overrides"]) for r in rows))
    return [o for o in rows[0]["overrides"] if o in common]


def _fmt(fmt: str, v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if "{:d}" in fmt:
        v = int(v)
    return fmt.format(v)


def markdown(rows: List[Dict]) -> str:
    head = "| run | " + " | ".join(h for h, _, _ in COLUMNS) + " |"
    sep = "|---|" + "|".join("---:" for _ in COLUMNS) + "|"
    lines = [head, sep]
    for r in rows:
        lines.append(f"| {r['label']} | " + " | ".join(_fmt(fmt, r.get(k)) for _, k, fmt in COLUMNS) + " |")
    shared = common_overrides(rows)
    if shared and len(rows) > 1:
        lines += ["", "Common to all runs: " + " ".join(f"`{o}`" for o in shared)]
    return "\n".join(lines) + "\n"


def _atomic_write(path: str, write) -> None:
    with atomic_output(path) as tmp:
        write(tmp)


def plot(rows: List[Dict], path: str) -> None:
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
    for off, key, name, color in ((-0.2, "ssim", "SSIM", "C1"), (0.2, "ms_ssim", "MS-SSIM", "C2")):
        vals = [r.get(key) or 0.0 for r in rows]
        a2.bar(x + off, vals, 0.4, label=name, color=color)
        for xi, v in zip(x, vals):
            a2.text(xi + off, v, f"{v:.3f}", ha="center", va="bottom", fontsize=7)
    lo = min([r.get(k) or 1.0 for r in rows for k in ("ssim", "ms_ssim")])
    bottom = max(0.0, lo - 0.05)
    a2.set_ylim(bottom, 1.0 + 0.25 * (1.0 - bottom))
    a2.set_ylabel("held-out SSIM / MS-SSIM")
    a2.set_xticks(x, labels, rotation=20, ha="right", fontsize=8)
    a2.legend(fontsize=8, loc="upper left", ncol=2)
    fig.tight_layout()
    _atomic_write(path, lambda p: fig.savefig(p, dpi=120, format="png"))
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("multirun_dir", help="a Hydra multirun folder, e.g. multirun/2026-01-01/12-00-00")
    ap.add_argument("--out", default=None, help="where to write report.md and report.png (default: multirun_dir)")
    args = ap.parse_args(argv)
    rows = collect(args.multirun_dir)
    out = args.out or args.multirun_dir
    os.makedirs(out, exist_ok=True)
    table = markdown(rows)

    def write_md(p):
        with open(p, "w") as f:
            f.write(table)

    _atomic_write(os.path.join(out, "report.md"), write_md)
    plot(rows, os.path.join(out, "report.png"))
    sys.stdout.write(table)
    print(f"\nwrote {os.path.join(out, 'report.md')} and {os.path.join(out, 'report.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
