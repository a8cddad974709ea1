"""``report.html``: one self-contained page (images embedded as base64) with the tables, the figures
and the held-out renders of every group side by side with the ground truth, plus a crop where the
groups' renders differ most, enlarged."""

from __future__ import annotations

import base64
import io
import math
import re
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .labels import html_text
from .runs import read_render, render_views
from .stats import Group
from .tables import Table

__all__ = ["render_grid", "crop_box", "html_page"]


def _png(rgb: np.ndarray) -> str:
    import matplotlib.image as mpimg

    buf = io.BytesIO()
    mpimg.imsave(buf, np.clip(rgb, 0.0, 1.0), format="png")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _file_uri(path: str) -> str:
    with open(path, "rb") as f:
        return "data:image/png;base64," + base64.b64encode(f.read()).decode("ascii")


def crop_box(preds: Sequence[np.ndarray], size: int) -> Tuple[int, int, int]:
    """``(top, left, size)`` of a square centred where the predictions differ most from one another:
    the peak of the per-pixel spread across predictions, smoothed by a Gaussian of a quarter of the
    square's side, the square kept inside the image.

    Examples:
        >>> a = np.zeros((32, 32, 3)); b = a.copy(); b[20:24, 4:8] = 1.0
        >>> crop_box([a, b], 8)
        (17, 1, 8)
    """
    from scipy.ndimage import gaussian_filter

    stack = np.stack([np.asarray(p, dtype=np.float64) for p in preds])
    h, w = stack.shape[1:3]
    size = max(1, min(size, h, w))
    spread = gaussian_filter(stack.std(axis=0).sum(axis=-1), sigma=size / 4.0, mode="constant")
    cy, cx = np.unravel_index(int(np.argmax(spread)), spread.shape)
    top = min(max(int(cy) - size // 2, 0), h - size)
    left = min(max(int(cx) - size // 2, 0), w - size)
    return top, left, size


def _psnr(pred: np.ndarray, gt: np.ndarray) -> float:
    mse = float(np.mean((pred - gt) ** 2))
    return math.inf if mse == 0 else -10.0 * math.log10(mse)


def render_grid(groups: Sequence[Group], max_views: int = 3) -> Tuple[str, List[str]]:
    """The renders section: for one seed every group has finished, up to ``max_views`` held-out views,
    each a row of the ground truth and every group's render (with its PSNR on that view), and below
    it the crop where the renders differ most. Returns ``(html, notes)``."""
    done = [(i, g) for i, g in enumerate(groups) if g.runs]
    notes: List[str] = []
    if not done:
        return "", notes
    common = set.intersection(*({r.seed for r in g.runs} for _, g in done))
    common.discard(None)
    seed = min(common) if common else None
    pick = {i: next((r for r in g.runs if r.seed == seed), g.runs[0]) for i, g in done}
    if seed is None:
        notes.append("No seed finished in every group: each group shows its first finished run.")
    views = sorted(set.intersection(*(set(render_views(r.path)) for r in pick.values())))
    if not views:
        notes.append("No held-out renders (renders/final/*.png) common to the runs: none shown.")
        return "", notes
    rows = []
    for view in views[:max_views]:
        pairs = {i: read_render(r.path, view) for i, r in pick.items()}
        base_gt = next(iter(pairs.values()))[1]
        differs = [
            groups[i].label
            for i, (_, gt) in pairs.items()
            if gt.shape != base_gt.shape or np.abs(gt - base_gt).max() > 1.5 / 255
        ]
        preds = [p for p, _ in pairs.values()]
        h, w = base_gt.shape[:2]
        top, left, size = crop_box(preds, max(8, min(h, w) // 3))
        cells = [("ground truth", base_gt, "")]
        cells += [(groups[i].label, p, f"PSNR {_psnr(p, gt):.2f} dB") for i, (p, gt) in pairs.items()]
        full = "".join(
            f"<figure><img class='full' src='{_png(img)}'>"
            f"<figcaption>{html_text(name)}<br>{html_text(sub)}</figcaption></figure>"
            for name, img, sub in cells
        )
        crops = "".join(
            f"<figure><img class='crop' src='{_png(img[top : top + size, left : left + size])}'>"
            f"<figcaption>{html_text(name)}</figcaption></figure>"
            for name, img, _ in cells
        )
        warn = f"<p class='note'>Ground truth differs in: {html_text(', '.join(differs))}.</p>" if differs else ""
        rows.append(
            f"<h4>{html_text(view)}</h4><div class='row'>{full}</div>"
            f"<p class='note'>Crop {size}×{size} px at ({left}, {top}), where the renders differ most, enlarged:</p>"
            f"<div class='row'>{crops}</div>{warn}"
        )
    what = f"seed {seed}" if seed is not None else "each group's first run"
    head = f"<h2>Held-out renders ({html_text(what)}, after training)</h2>"
    return head + "".join(rows), notes


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { padding: 0.25em 0.6em; border-bottom: 1px solid #ddd; text-align: left; }
thead th { border-bottom: 2px solid #444; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.note { color: #555; font-size: 0.9em; }
.row { display: flex; flex-wrap: wrap; gap: 0.8em; }
figure { margin: 0; text-align: center; font-size: 0.8em; max-width: 200px; }
img.full, img.crop { width: 192px; height: 192px; image-rendering: pixelated; border: 1px solid #ccc; }
img.fig { max-width: 100%; }
code { background: #f4f4f4; padding: 0 0.2em; }
"""


def _code(text: str) -> str:
    """Markdown's `code` spans (the overrides in the intro) as <code>."""
    return re.sub(r"`([^`]*)`", r"<code>\1</code>", text)


def html_page(
    title: str,
    intro: List[str],
    tables: Sequence[Optional[Table]],
    figures: Dict[str, List[str]],
    renders: str,
    notes: Sequence[str],
) -> str:
    """The whole page as one string (no external file is referenced)."""
    parts = [f"<h1>{html_text(title)}</h1>"] + [f"<p>{_code(html_text(p))}</p>" for p in intro]
    parts += [f"<p class='note'>{html_text(n)}</p>" for n in notes]
    parts += ["<h2>Tables</h2>"] + [t.html() for t in tables if t is not None]
    if figures:
        parts.append("<h2>Figures</h2>")
        for name, paths in figures.items():
            png = next(p for p in paths if p.endswith(".png"))
            parts.append(f"<p><img class='fig' alt='{html_text(name)}' src='{_file_uri(png)}'></p>")
    parts.append(renders)
    body = "\n".join(parts)
    return (
        f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{html_text(title)}</title>"
        f"<style>{_CSS}</style></head><body>\n{body}\n</body></html>\n"
    )
