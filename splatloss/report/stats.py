"""Groups of runs (one configuration over several seeds), their statistics, and paired differences.

A group is every run with the same overrides but the seed. Per group and quantity: n, mean,
standard deviation (n - 1 in the denominator) and the 95 % confidence interval of the mean
(Student t, ``scipy.stats.ttest_1samp(...).confidence_interval``), cut to the values the quantity
can take (:data:`RANGES`: a time is >= 0, an SSIM <= 1). The mean lies in that range, so the cut
interval covers it whenever the uncut one does: the same 95 %, without the impossible part a
2-seed interval (``t(0.975, 1) = 12.7``) often has. Against a baseline group, the
runs are paired by seed (the seed draws the initial points and Gaussians and the order of the
training views, so two runs of one seed differ only by the configuration): the mean of the differences,
its 95 % confidence interval and the paired t-test's two-sided p-value (``scipy.stats.ttest_rel``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .labels import LABEL_KEYS, loss_label, readable_overrides
from .runs import Run, override_key

__all__ = [
    "ALPHA",
    "CONFIDENCE",
    "Quantity",
    "HELD_OUT",
    "COST",
    "Group",
    "Stat",
    "Paired",
    "group_runs",
    "quantities",
    "describe",
    "paired",
    "choose_baseline",
    "RANGES",
    "value_range",
    "compare",
    "ms_ssim_scales",
]

CONFIDENCE = 0.95
ALPHA = 1.0 - CONFIDENCE  # a difference is "established" when the paired test's p is below it


@dataclass(frozen=True)
class Quantity:
    """A number every finished run records (a ``metrics.json`` key) and how the report shows it."""

    key: str
    name: str
    decimals: int
    higher_is_better: Optional[bool] = None
    unit: str = ""


# Held-out metrics of the trained model (docs/splat.md names the SSIM conventions).
HELD_OUT = [
    Quantity("psnr", "PSNR", 2, True, "dB"),
    Quantity("ssim", "SSIM", 4, True),
    Quantity("ssim_3dgs", "SSIM (3DGS)", 4, True),
    Quantity("ssim_skimage", "SSIM (skimage)", 4, True),
    Quantity("ms_ssim", "MS-SSIM", 4, True),
]
# What a run costs; ms / step and the loss share are medians over the run's timed steps.
COST = [
    Quantity("train_seconds", "train time", 1, False, "s"),
    Quantity("step_ms", "step time", 1, False, "ms"),
    Quantity("loss_share_pct", "loss share", 1, False, "%"),
    Quantity("num_gaussians", "Gaussians", 0),
]


#: The values each quantity can take (None: unbounded on that side); LPIPS (``lpips*``) is >= 0.
RANGES: Dict[str, Tuple[Optional[float], Optional[float]]] = {
    "psnr": (0.0, None),  # predictions and images in [0, 1]: MSE <= 1
    "ssim": (-1.0, 1.0),
    "ssim_3dgs": (-1.0, 1.0),
    "ssim_skimage": (-1.0, 1.0),
    "ms_ssim": (0.0, 1.0),  # the metric's relu keeps every scale's term >= 0
    "train_seconds": (0.0, None),
    "step_ms": (0.0, None),
    "loss_share_pct": (0.0, 100.0),
    "num_gaussians": (0.0, None),
}


def value_range(key: str) -> Tuple[Optional[float], Optional[float]]:
    """The values the quantity ``key`` can take (:data:`RANGES`; ``lpips*`` >= 0; else unbounded)."""
    if key in RANGES:
        return RANGES[key]
    if key.startswith("lpips"):
        return (0.0, None)
    return (None, None)


def ms_ssim_scales(runs: Sequence[Run]) -> List[int]:
    """The numbers of MS-SSIM scales the finished runs record (``ms_ssim_scales``), sorted."""
    found = set()
    for r in runs:
        n = r.metrics.get("ms_ssim_scales") if r.finished else None
        if isinstance(n, int) and not isinstance(n, bool) and r.metrics.get("ms_ssim") is not None:
            found.add(n)
    return sorted(found)


def quantities(runs: Sequence[Run]) -> Tuple[List[Quantity], List[Quantity]]:
    """``(held_out, cost)``: the quantities some finished run records, LPIPS included when present
    (``lpips`` or ``lpips_<net>``, lower is better). MS-SSIM is named with its number of scales
    (which the views' size sets: ``MS-SSIM (3 scales)``), or says that the runs' differ."""
    keys = {k for r in runs if r.finished for k, v in r.metrics.items() if isinstance(v, (int, float))}
    scales = ms_ssim_scales(runs)
    named = {}
    if len(scales) == 1:
        named["ms_ssim"] = f"MS-SSIM ({scales[0]} scale{'s' if scales[0] != 1 else ''})"
    elif scales:
        named["ms_ssim"] = "MS-SSIM (scales differ: see the note)"
    held = [Quantity(q.key, named.get(q.key, q.name), q.decimals, q.higher_is_better, q.unit)
            for q in HELD_OUT if q.key in keys]  # fmt: skip
    held += [Quantity(k, "LPIPS" + (f" ({k[6:]})" if k != "lpips" else ""), 4, False) for k in sorted(keys)
             if k == "lpips" or (k.startswith("lpips_") and not k.endswith("_init"))]  # fmt: skip
    return held, [q for q in COST if q.key in keys]


@dataclass
class Stat:
    """n, mean, standard deviation and the 95 % confidence interval of the mean (NaN where n < 2);
    ``cut``: the interval was cut to the quantity's range (it is then not symmetric about the mean)."""

    n: int
    mean: float
    std: float
    low: float
    high: float
    cut: bool = False

    @property
    def half(self) -> float:
        return (self.high - self.low) / 2.0


@dataclass
class Paired:
    """Differences ``group - baseline`` paired by seed: their mean, standard deviation, 95 % CI, the
    paired t-test's two-sided p-value, and the seeds they pair."""

    n: int
    mean: float
    std: float
    low: float
    high: float
    p: float
    seeds: List[int]
    not_comparable: str = ""  # why the two groups' values of the quantity cannot be compared

    @property
    def established(self) -> bool:
        return not self.not_comparable and self.n >= 2 and math.isfinite(self.p) and self.p < ALPHA


@dataclass
class Group:
    """The runs of one configuration (the same overrides but the seed).

    Attributes:
        overrides: the configuration's overrides, in the order of its first run.
        runs: the finished runs, ordered by seed.
        failed: the failed or interrupted runs.
        label: a readable name (set by :func:`group_runs`).
    """

    overrides: List[str]
    runs: List[Run] = field(default_factory=list)
    failed: List[Run] = field(default_factory=list)
    label: str = ""

    @property
    def seeds(self) -> List[Optional[int]]:
        return [r.seed for r in self.runs]

    def values(self, key: str) -> Dict[Optional[int], float]:
        """``{seed: value}`` of a quantity over the finished runs that record it (as a finite number)."""
        out = {}
        for r in self.runs:
            v = r.metrics.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                out[r.seed] = float(v)
        return out

    def scales(self) -> List[int]:
        """The numbers of MS-SSIM scales of the group's finished runs."""
        return ms_ssim_scales(self.runs)

    def stat(self, key: str) -> Stat:
        return describe(list(self.values(key).values()), value_range(key))


def _no_spread(std: float, scale: float) -> bool:
    """A standard deviation that is rounding noise (values equal up to float64 precision)."""
    return std <= 1e-12 * max(1.0, abs(scale))


def describe(values: Sequence[float], bounds: Tuple[Optional[float], Optional[float]] = (None, None)) -> Stat:
    """:class:`Stat` of a sample (Student t interval; NaN std and interval for fewer than 2 values),
    the interval cut to ``bounds`` (the values the quantity can take; None: no bound on that side).

    Examples:
        >>> s = describe([28.0, 28.5, 29.0])
        >>> s.n, s.mean, round(s.std, 4), round(s.low, 4), round(s.high, 4)
        (3, 28.5, 0.5, 27.2579, 29.7421)
        >>> s = describe([4.0, 49.0], bounds=(0.0, None))  # seconds: Student t alone gives [-259.4, 312.4]
        >>> s.low, round(s.high, 1), s.cut
        (0.0, 312.4, True)
    """
    from scipy import stats

    x = np.asarray(values, dtype=np.float64)
    n = int(x.size)
    if n == 0:
        return Stat(0, math.nan, math.nan, math.nan, math.nan)
    mean = float(x.mean())
    if n < 2:
        return Stat(n, mean, math.nan, math.nan, math.nan)
    std = float(x.std(ddof=1))
    if _no_spread(std, mean):  # every value equal: the interval is the point (scipy's t would divide 0 by 0)
        return Stat(n, mean, 0.0, mean, mean)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ci = stats.ttest_1samp(x, 0.0).confidence_interval(CONFIDENCE)
    low, high = float(ci.low), float(ci.high)
    lo, hi = bounds
    cut = (lo is not None and low < lo) or (hi is not None and high > hi)
    if lo is not None:
        low = max(low, lo)
    if hi is not None:
        high = min(high, hi)
    return Stat(n, mean, std, low, high, bool(cut))


def paired(base: Dict[Optional[int], float], other: Dict[Optional[int], float]) -> Paired:
    """``other - base`` over the seeds both have (a seed of ``None`` pairs with nothing).

    Examples:
        >>> d = paired({0: 28.0, 1: 27.0, 2: 29.0}, {0: 28.5, 1: 27.4, 2: 29.6, 3: 30.0})
        >>> d.n, round(d.mean, 4), d.seeds, round(d.p, 4), d.established
        (3, 0.5, [0, 1, 2], 0.0131, True)
    """
    from scipy import stats

    seeds = sorted(s for s in base if s is not None and s in other)
    n = len(seeds)
    a = np.array([other[s] for s in seeds], dtype=np.float64)
    b = np.array([base[s] for s in seeds], dtype=np.float64)
    d = a - b
    if n == 0:
        return Paired(0, math.nan, math.nan, math.nan, math.nan, math.nan, seeds)
    mean = float(d.mean())
    if n < 2:
        return Paired(n, mean, math.nan, math.nan, math.nan, math.nan, seeds)
    std = float(d.std(ddof=1))
    if _no_spread(std, float(np.abs(a).max() + np.abs(b).max())):  # the same difference on every seed
        exact = np.abs(d).max() <= 1e-12 * max(1.0, float(np.abs(b).max()))
        return Paired(n, 0.0 if exact else mean, 0.0, mean, mean, math.nan if exact else 0.0, seeds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = stats.ttest_rel(a, b)
        ci = res.confidence_interval(CONFIDENCE)
    return Paired(n, mean, std, float(ci.low), float(ci.high), float(res.pvalue), seeds)


def compare(base: Group, group: Group, key: str) -> Paired:
    """:func:`paired` differences of ``key`` between two groups, none where the values cannot be
    compared: MS-SSIM over different numbers of scales (views of other sizes) measures something else."""
    if key == "ms_ssim":
        a, b = base.scales(), group.scales()
        if a and b and a != b:
            show = lambda s: "/".join(map(str, s))  # noqa: E731
            nan = math.nan
            why = f"not comparable: {show(b)} scales against {show(a)}"
            return Paired(0, nan, nan, nan, nan, nan, [], not_comparable=why)
    return paired(base.values(key), group.values(key))


def _is_loss(key: str) -> bool:
    return key == "loss" or key.startswith("loss.")


#: Overrides that steer a run (where it writes, whether it resumes) without changing what it trains:
#: a resumed sweep run records ``resume=true`` and ``hydra.run.dir=...`` and stays in its group.
RUN_CONTROL_KEYS = ("resume", "resume_allow_changes", "ckpt_path", "hydra.run.dir", "hydra.sweep.dir", "rescue_dir")


def group_runs(runs: Sequence[Run], seed_key: str = "seed") -> List[Group]:
    """Runs grouped by configuration (their overrides but ``seed_key`` and :data:`RUN_CONTROL_KEYS`),
    in the order of each group's first run, each labelled by what sets it apart from the other groups.

    Raises:
        SystemExit: two finished runs of one configuration have the same seed (two sweeps in one
            folder?): pairing by seed would be ambiguous.
    """
    groups: Dict[Tuple[str, ...], Group] = {}
    for r in runs:
        config = [o for o in r.overrides if override_key(o) != seed_key and override_key(o) not in RUN_CONTROL_KEYS]
        g = groups.setdefault(tuple(sorted(config)), Group(overrides=config))
        (g.runs if r.finished else g.failed).append(r)
    for g in groups.values():
        seen: Dict[Optional[int], Run] = {}
        for r in g.runs:
            if r.seed is not None and r.seed in seen:
                raise SystemExit(
                    f"splatloss-report: runs {seen[r.seed].folder!r} and {r.folder!r} have the same configuration "
                    f"and {seed_key} {r.seed}, so pairing by seed is ambiguous; point the report at one sweep folder "
                    "(multirun/<date>/<time>) or give the runs different seeds"
                )
            seen[r.seed] = r
        g.runs.sort(key=lambda r: (r.seed is None, r.seed if r.seed is not None else 0, r.folder))
    ordered = list(groups.values())
    _label(ordered)
    return ordered


def common_overrides(groups: Sequence[Group]) -> List[str]:
    """The overrides every group shares (shown once, not in each label), as the report shows them."""
    if not groups:
        return []
    common = set.intersection(*(set(g.overrides) for g in groups))
    shown = readable_overrides(o for g in groups for o in g.overrides)
    return [shown[o] for o in groups[0].overrides if o in common]


def _label(groups: List[Group]) -> None:
    shown = readable_overrides(o for g in groups for o in g.overrides)
    common = set.intersection(*(set(g.overrides) for g in groups)) if groups else set()
    for g in groups:
        first = (g.runs or g.failed)[0]
        loss_name = (first.metrics or {}).get("loss_name")
        params = {
            override_key(o)[5:]: shown[o].partition("=")[2] for o in g.overrides if override_key(o)[:5] == "loss."
        }
        loss = loss_label(first.loss_config, loss_name, params) if first.loss_config else (loss_name or "")
        varying = [o for o in g.overrides if o not in common]
        parts = []
        if any(_is_loss(override_key(o)) for o in varying) or len(groups) == 1:
            parts.append(loss)
        for o in varying:
            key = override_key(o)
            if key == "loss" or (key.startswith("loss.") and key[5:] in LABEL_KEYS and loss):
                continue  # already in the loss's name
            k, _, v = shown[o].partition("=")
            parts.append(f"{k[5:] if k.startswith('loss.') else k} = {v}")
        g.label = ", ".join(p for p in parts if p) or loss or (first.folder)
    # Two groups must never read the same: fall back to their overrides.
    labels = [g.label for g in groups]
    for g in groups:
        if labels.count(g.label) > 1:
            g.label = " ".join(shown[o] for o in g.overrides if o not in common) or g.label


def choose_baseline(groups: Sequence[Group], wanted: Optional[str]) -> int:
    """The index of the baseline group: the first finished one, or the one ``wanted`` names (its
    number in the report counted from 1, its label, or overrides it has, e.g. ``loss=l1``).

    Raises:
        SystemExit: ``wanted`` names no group or several, or the group has no finished run.
    """
    finished = [i for i, g in enumerate(groups) if g.runs]
    if wanted is None:
        return finished[0]
    listing = "; ".join(f"{i + 1}: {g.label} ({' '.join(g.overrides) or 'no overrides'})" for i, g in enumerate(groups))
    if wanted.isdigit():
        matches = [int(wanted) - 1] if 1 <= int(wanted) <= len(groups) else []
    else:
        matches = [i for i, g in enumerate(groups) if g.label == wanted]
        if not matches:
            asked = set(wanted.split())
            matches = [i for i, g in enumerate(groups) if asked <= set(g.overrides)]
    if len(matches) != 1:
        what = "no group" if not matches else f"{len(matches)} groups"
        raise SystemExit(
            f"splatloss-report: --baseline {wanted!r} matches {what}; give a group's number, label or overrides "
            f"that only it has. The groups: {listing}"
        )
    if not groups[matches[0]].runs:
        raise SystemExit(
            f"splatloss-report: --baseline {wanted!r} names a group with no finished run. The groups: {listing}"
        )
    return matches[0]
