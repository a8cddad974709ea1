"""Reading a sweep folder: the runs, their seeds and configurations, their errors and their logs.

A run is a folder with ``.hydra/`` (Hydra writes it before the job starts) or ``metrics.json``
(``splatloss.train`` writes it at the end). Finished runs have a ``metrics.json`` that does not say
``"interrupted"``; every other run is failed or interrupted and carries the error its log gives.

A folder whose ``metrics.json`` is an evaluation (``splatloss-eval`` writes ``RUN/eval/`` or its
``output_dir``) is not a run: it belongs to the run it evaluated (the run folder above it, else the
one its ``run_dir`` names), and when it evaluated the run's last step the held-out metrics it has
and the run lacks join the run's, LPIPS as ``lpips_<net>``.
"""

from __future__ import annotations

import csv
import glob
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

__all__ = [
    "Run",
    "Evaluation",
    "collect",
    "is_evaluation",
    "Curve",
    "collect_all",
    "log_error",
    "override_key",
    "read_curves",
    "read_render",
    "render_views",
]


@dataclass
class Run:
    """One run folder of a sweep.

    Attributes:
        folder: the folder relative to the sweep folder (``"0"``, ``"3"``, ...).
        path: the folder's absolute path.
        overrides: the Hydra overrides the run was launched with (``.hydra/overrides.yaml``), in order.
        seed: the run's seed (``metrics.json``'s ``seed``, else the ``seed=`` override), ``None`` if neither.
        metrics: ``metrics.json`` of a finished run (plus ``step_ms`` and ``loss_share_pct``); ``None``
            for a failed or interrupted run.
        error: why the run did not finish (``None`` for a finished run).
        loss_config: the run's loss config (``metrics.json``'s ``loss``, else ``.hydra/config.yaml``'s).
    """

    folder: str
    path: str
    overrides: List[str]
    seed: Optional[int] = None
    metrics: Optional[Dict] = None
    error: Optional[str] = None
    loss_config: Dict = field(default_factory=dict)
    evaluations: List["Evaluation"] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.metrics is not None


@dataclass
class Evaluation:
    """One ``splatloss-eval`` output folder found in the sweep.

    Attributes:
        folder: the folder relative to the sweep folder (``"0/eval"``).
        path: its absolute path.
        metrics: its ``metrics.json``.
    """

    folder: str
    path: str
    metrics: Dict


def is_evaluation(metrics: Dict) -> bool:
    """Whether a ``metrics.json`` is ``splatloss-eval``'s (``"record": "evaluation"``, or a checkpoint
    and a run folder but no training steps) rather than a training run's."""
    if metrics.get("record") == "evaluation":
        return True
    return "checkpoint" in metrics and "run_dir" in metrics and "steps" not in metrics


# Held-out metrics an evaluation gives its run where the run's metrics.json has none.
_EVALUATED = ("psnr", "ssim", "ssim_3dgs", "ssim_skimage", "ms_ssim", "ms_ssim_scales")


def _evaluated(metrics: Dict) -> Dict[str, float]:
    """The numbers of an evaluation a run can take: the held-out metrics, LPIPS under ``lpips_<net>``."""
    out = {k: metrics[k] for k in _EVALUATED if isinstance(metrics.get(k), (int, float))}
    lpips = metrics.get("lpips")
    if isinstance(lpips, (int, float)) and not isinstance(lpips, bool):
        net = metrics.get("lpips_net")
        out[f"lpips_{net}" if isinstance(net, str) and net else "lpips"] = float(lpips)
    return out


def _attach(runs: List[Run], evaluations: List[Evaluation], sweep_dir: str) -> List[str]:
    """Give each evaluation to its run; returns a note for each one that does not count, and why.

    Raises:
        SystemExit: two evaluations give one run different values of one quantity.
    """
    by_path = {os.path.realpath(r.path): r for r in runs}
    top = os.path.realpath(sweep_dir)
    notes: List[str] = []
    given: Dict[Tuple[str, str], Tuple[str, float]] = {}
    for ev in sorted(evaluations, key=lambda e: e.folder):
        run = None
        up = os.path.dirname(os.path.realpath(ev.path))
        while run is None and up.startswith(top) and len(up) >= len(top):
            run = by_path.get(up)
            up = os.path.dirname(up)
        if run is None and isinstance(ev.metrics.get("run_dir"), str):
            run = by_path.get(os.path.realpath(ev.metrics["run_dir"]))
        if run is None:
            notes.append(
                f"{ev.folder} evaluates {ev.metrics.get('run_dir')!r}, which is no run of this sweep: not used."
            )
            continue
        run.evaluations.append(ev)
        if not run.finished:
            notes.append(f"{ev.folder} evaluates run {run.folder}, which did not finish: not used.")
            continue
        step, last = ev.metrics.get("step"), run.metrics.get("steps")
        if step != last:
            notes.append(
                f"{ev.folder} evaluates run {run.folder} at step {step}, not the run's last step {last}: not used."
            )
            continue
        for key, value in _evaluated(ev.metrics).items():
            seen = given.get((run.folder, key))
            if seen is not None and seen[1] != value:
                raise SystemExit(
                    f"splatloss-report: the evaluations {seen[0]!r} and {ev.folder!r} give run {run.folder!r} "
                    f"different {key} ({seen[1]!r} and {value!r}); remove the one that does not belong"
                )
            given[(run.folder, key)] = (ev.folder, value)
            if run.metrics.get(key) is None:
                run.metrics[key] = value
    return notes


def override_key(override: str) -> str:
    """The key of a Hydra override: ``"loss.alpha=0.5"`` -> ``"loss.alpha"``, ``"+x=1"`` -> ``"x"``."""
    return override.partition("=")[0].lstrip("+~")


def _overrides(run_dir: str) -> List[str]:
    path = os.path.join(run_dir, ".hydra", "overrides.yaml")
    if not os.path.isfile(path):
        return []
    import yaml  # PyYAML comes with Hydra (omegaconf)

    with open(path) as f:
        items = yaml.safe_load(f) or []
    if not isinstance(items, list):
        raise SystemExit(f"splatloss-report: {path} should hold a list of overrides, got {type(items).__name__}")
    return [str(o) for o in items]


def _config_loss(run_dir: str) -> Dict:
    """The ``loss`` node of ``.hydra/config.yaml`` (what a run that wrote no metrics.json was given)."""
    path = os.path.join(run_dir, ".hydra", "config.yaml")
    if not os.path.isfile(path):
        return {}
    import yaml

    try:
        with open(path) as f:
            cfg = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError):
        return {}
    loss = cfg.get("loss") if isinstance(cfg, dict) else None
    return loss if isinstance(loss, dict) else {}


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
    """Why a run failed, as its log (Hydra's ``<run>/<job name>.log``) says: its first ERROR record
    (the exception's last line when the record carries a traceback), else the last line of a
    traceback in it; ``None`` when no log says it."""
    for path in sorted(glob.glob(os.path.join(glob.escape(run_dir), "*.log"))):
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
    logs = sorted(glob.glob(os.path.join(glob.escape(run_dir), "*.log")))
    if not logs:
        return f"{what}; no log file in the run folder"
    with open(logs[-1], errors="replace") as f:
        last = [line for line in f.read().splitlines() if line.strip()]
    name = os.path.basename(logs[-1])
    if not last:
        return f"{what}; {name} is empty (the job failed before logging, or is still running)"
    return f"{what}; no error in {name}, which ends: {last[-1].strip()}"


def _seed(overrides: List[str], metrics: Optional[Dict], seed_key: str) -> Optional[int]:
    if metrics is not None and metrics.get("seed") is not None and seed_key == "seed":
        return int(metrics["seed"])
    for o in overrides:
        if override_key(o) == seed_key:
            value = o.partition("=")[2]
            try:
                return int(value)
            except ValueError:
                raise SystemExit(f"splatloss-report: the override {o!r} should give an integer seed") from None
    return None


def _sort_key(run: Run):
    head = run.folder.split(os.sep)[0]
    return (int(head) if head.isdigit() else math.inf, run.folder)


def collect_all(sweep_dir: str, seed_key: str = "seed") -> List[Run]:
    """Every run folder under ``sweep_dir``, finished or not, sorted by folder (Hydra's job number),
    with the evaluations of each joined to it (:func:`collect`).

    Raises:
        SystemExit: ``sweep_dir`` is not a folder, or holds no run folder at all.
    """
    return collect(sweep_dir, seed_key)[0]


def _read_metrics(root: str):
    """``(metrics, error)`` of ``root/metrics.json``."""
    try:
        with open(os.path.join(root, "metrics.json")) as f:
            metrics = json.load(f)
        if not isinstance(metrics, dict):
            raise ValueError(f"expected a JSON object, got {type(metrics).__name__}")
    except (OSError, ValueError) as e:
        return None, _failure(root, f"metrics.json unreadable ({e})")
    return metrics, None


def collect(sweep_dir: str, seed_key: str = "seed") -> Tuple[List[Run], List[str]]:
    """``(runs, notes)``: as :func:`collect_all`, and a sentence for each evaluation folder that does
    not count (of a run outside the sweep, of a run that did not finish, of another step).

    Raises:
        SystemExit: ``sweep_dir`` is not a folder, or holds no run folder at all; two evaluations
            give one run different values.
    """
    if not os.path.isdir(sweep_dir):
        raise SystemExit(f"splatloss-report: {sweep_dir!r} is not a directory")
    found: List[Run] = []
    evaluations: List[Evaluation] = []
    for root, dirs, files in os.walk(sweep_dir):
        is_run = "metrics.json" in files or ".hydra" in dirs
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        if not is_run:
            continue
        metrics, error = _read_metrics(root) if "metrics.json" in files else (None, _failure(root, "no metrics.json"))
        if metrics is not None and ".hydra" not in dirs and is_evaluation(metrics):
            evaluations.append(Evaluation(os.path.relpath(root, sweep_dir), os.path.abspath(root), metrics))
            continue
        overrides = _overrides(root)
        run = Run(folder=os.path.relpath(root, sweep_dir), path=os.path.abspath(root), overrides=overrides)
        run.error = error
        if metrics is not None and metrics.get("interrupted"):
            run.error = _failure(root, f"interrupted by {metrics['interrupted']} at step {metrics.get('steps', '?')}")
            run.seed = _seed(overrides, metrics, seed_key)
            metrics = None
        if metrics is not None:
            # A run too short to time a step records no step time (a 0 there is not a measurement).
            timed = metrics.get("timed_steps") != 0
            step = metrics.get("step_seconds")
            metrics["step_ms"] = 1000.0 * step if step is not None and timed else None
            share = metrics.get("loss_share")
            metrics["loss_share_pct"] = 100.0 * share if share is not None and timed else None
            run.metrics = metrics
        if run.seed is None:
            run.seed = _seed(overrides, metrics, seed_key)
        loss = (metrics or {}).get("loss")
        run.loss_config = loss if isinstance(loss, dict) else _config_loss(root)
        found.append(run)
    if not found:
        raise SystemExit(
            f"splatloss-report: no metrics.json under {sweep_dir!r} and no run folder (.hydra/) either "
            "(is this the multirun folder, e.g. multirun/2026-01-01/12-00-00?)"
        )
    found.sort(key=_sort_key)
    return found, _attach(found, evaluations, sweep_dir)


@dataclass
class Curve:
    """One logged quantity of one run against the training step (the number of steps done)."""

    steps: np.ndarray
    values: np.ndarray


def _float(text: Optional[str]) -> Optional[float]:
    if text is None or text.strip() == "":
        return None
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _csv_files(run_dir: str) -> List[str]:
    """Lightning CSVLogger files of a run (``csv/version_<n>/metrics.csv``), oldest version first."""
    paths = glob.glob(os.path.join(glob.escape(run_dir), "*", "version_*", "metrics.csv"))

    def version(p):
        tail = os.path.basename(os.path.dirname(p)).rpartition("_")[2]
        return (os.path.dirname(os.path.dirname(p)), int(tail) if tail.isdigit() else math.inf)

    return sorted(paths, key=version)


def read_curves(run_dir: str) -> Dict[str, Curve]:
    """``{"psnr": ..., "train_loss": ..., "step_ms": ...}`` from the run's CSV log (those present).

    Steps count the training steps done. Lightning logs a training step's metrics, and a held-out
    evaluation that follows it, at that step's index counted from 0 (the evaluation after step 100
    at 99); the evaluation before training (the first held-out row of a log) and the one after it
    (the last held-out row, logged in the next epoch) are at the step count itself. A step seen twice
    keeps its last value (a resumed run evaluates again where it resumes).
    """
    series: Dict[str, Dict[int, float]] = {"psnr": {}, "train_loss": {}, "step_ms": {}}
    for path in _csv_files(run_dir):
        try:
            with open(path, newline="") as f:
                rows = list(csv.DictReader(f))
        except (OSError, csv.Error):
            continue
        val = [r for r in rows if _float(r.get("val/psnr")) is not None and _float(r.get("step")) is not None]
        train = [r for r in rows if _float(r.get("train/loss")) is not None and _float(r.get("step")) is not None]
        last_train_epoch = max((_float(r.get("epoch")) or 0.0 for r in train), default=-1.0)
        for i, r in enumerate(val):
            step = int(_float(r["step"]))
            before_fit = i == 0 and (not train or step <= int(_float(train[0]["step"])))
            after_fit = i == len(val) - 1 and (_float(r.get("epoch")) or 0.0) > last_train_epoch
            series["psnr"][step if before_fit or after_fit else step + 1] = _float(r["val/psnr"])
        for r in train:
            step = int(_float(r["step"])) + 1
            series["train_loss"][step] = _float(r["train/loss"])
            ms = _float(r.get("step_ms"))
            if ms is not None:
                series["step_ms"][step] = ms
    out = {}
    for name, points in series.items():
        if points:
            steps = np.array(sorted(points), dtype=np.int64)
            out[name] = Curve(steps, np.array([points[s] for s in steps], dtype=np.float64))
    return out


def render_views(run_dir: str, tag: str = "final") -> List[str]:
    """File names of the held-out renders a run saved under ``renders/<tag>/``, sorted."""
    folder = os.path.join(run_dir, "renders", tag)
    if not os.path.isdir(folder):
        return []
    return sorted(f for f in os.listdir(folder) if f.lower().endswith(".png"))


def read_render(run_dir: str, view: str, tag: str = "final") -> Tuple[np.ndarray, np.ndarray]:
    """``(prediction, ground truth)`` of one saved render, each ``(H, W, 3)`` float in [0, 1].

    A render is the prediction and the ground truth side by side (``splatloss.lightning.HeldOutMetrics``).
    """
    import matplotlib.image as mpimg

    path = os.path.join(run_dir, "renders", tag, view)
    img = np.asarray(mpimg.imread(path), dtype=np.float64)
    if img.ndim != 3 or img.shape[1] % 2:
        raise SystemExit(
            f"splatloss-report: {path} should be a prediction | ground truth pair (an RGB image of even width), "
            f"got an array of shape {img.shape}"
        )
    if img.dtype.kind in "ui" or img.max() > 1.0:
        img = img / 255.0
    w = img.shape[1] // 2
    return img[:, :w, :3], img[:, w:, :3]
