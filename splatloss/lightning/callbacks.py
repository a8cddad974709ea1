"""Callbacks for any LightningModule that trains with a :class:`splatloss.PhotometricLoss`.

* :class:`LossTerms` logs every term of the loss and its weight, and can schedule the weights
  over steps (piecewise linear in the global step, so a resumed run gets the same weights).
* :class:`HeldOutMetrics` evaluates PSNR, SSIM (in the conventions papers quote) and MS-SSIM on
  the validation views, saves side-by-side renders (prediction | ground truth) and shows them in
  TensorBoard when a TensorBoard logger is attached.

Neither needs :class:`~splatloss.lightning.SplatModule`: ``LossTerms`` finds the loss as the
module's ``loss`` attribute (or its only ``PhotometricLoss`` submodule); ``HeldOutMetrics`` reads
the dict a ``validation_step`` returns: ``{"pred": (B, 3, H, W), "target": (B, 3, H, W)}`` in
``[0, 1]``, optionally ``"name"``.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

import lightning as L
import numpy as np
import torch
from lightning.fabric.loggers import TensorBoardLogger

from ..atomic import atomic_output
from ..conventions import ms_ssim_weights_for, ssim_3dgs, ssim_skimage
from ..functional import ms_ssim, ssim

__all__ = [
    "LossTerms",
    "HeldOutMetrics",
    "StepProgressBar",
    "StopOnSignal",
    "RunInterrupted",
    "find_loss",
    "interpolate_schedule",
    "ms_ssim_weights_for",
    "ssim_3dgs",
    "ssim_skimage",
]


def find_loss(pl_module: torch.nn.Module, attr: str = "loss"):
    """The module's photometric loss: ``pl_module.<attr>`` if it has ``terms``, else the only
    submodule exposing ``terms`` and ``set_weight``.

    Raises:
        ValueError: none or several candidates.
    """
    cand = getattr(pl_module, attr, None)
    if cand is not None and hasattr(cand, "terms") and hasattr(cand, "weights"):
        return cand
    found = [m for m in pl_module.modules() if hasattr(m, "terms") and hasattr(m, "set_weight")]
    if len(found) != 1:
        raise ValueError(
            f"expected the LightningModule to hold exactly one PhotometricLoss (as .{attr} or a submodule), "
            f"found {len(found)}"
        )
    return found[0]


def interpolate_schedule(points: Sequence[Sequence[float]], step: int) -> float:
    """Piecewise-linear value at ``step`` through ``[(step_0, value_0), (step_1, value_1), ...]``.

    Constant before the first and after the last point.

    Examples:
        >>> interpolate_schedule([(0, 0.0), (100, 0.2)], 50)
        0.1
        >>> interpolate_schedule([(0, 0.0), (100, 0.2)], 500)
        0.2
    """
    pts = [(float(s), float(v)) for s, v in points]
    if step <= pts[0][0]:
        return pts[0][1]
    for (s0, v0), (s1, v1) in zip(pts, pts[1:]):
        if step <= s1:
            return v0 + (v1 - v0) * (step - s0) / (s1 - s0)
    return pts[-1][1]


def _check_schedules(schedules: Mapping[str, Any]) -> Dict[str, List[tuple]]:
    out = {}
    for name, points in dict(schedules).items():
        try:
            pts = [(int(p[0]), float(p[1])) for p in points]
        except (TypeError, ValueError, IndexError):
            raise ValueError(f"schedule for {name!r} must be a list of [step, weight] pairs, got {points!r}") from None
        if not pts:
            raise ValueError(f"schedule for {name!r} must have at least one [step, weight] pair, got []")
        steps = [s for s, _ in pts]
        if any(b <= a for a, b in zip(steps, steps[1:])) or steps[0] < 0:
            raise ValueError(f"schedule for {name!r}: steps must be >= 0 and strictly increasing, got {steps}")
        bad = [w for _, w in pts if not (w >= 0 and math.isfinite(w))]
        if bad:
            raise ValueError(f"schedule for {name!r}: weights must be finite and >= 0, got {bad[0]}")
        out[name] = pts
    return out


class LossTerms(L.Callback):
    """Log each loss term (``loss/<term>``) and weight (``weight/<term>``); schedule weights.

    The terms and weights are logged at every step from ``on_train_batch_end``, so the logger's row
    for a step holds that step's terms beside that step's ``train/loss`` (the Trainer's
    ``log_every_n_steps`` decides which steps reach the logger).

    Args:
        schedules: ``{term: [[step, weight], ...]}``, piecewise linear in the global step; the
            weight is set through ``loss.set_weight`` before every training batch. Terms not listed
            keep their configured weight. ``lambda_dssim`` schedules the 3DGS mix
            ``(1 - lambda) L1 + lambda D-SSIM``: it sets both the ``l1`` and the ``dssim`` weight,
            where a schedule on ``dssim`` alone moves only that term.
        loss_attr: name of the loss attribute on the LightningModule.
    """

    def __init__(self, schedules: Optional[Mapping[str, Any]] = None, loss_attr: str = "loss"):
        self.schedules = _check_schedules(schedules or {})
        self.loss_attr = loss_attr

    def setup(self, trainer, pl_module, stage: str) -> None:
        loss = find_loss(pl_module, self.loss_attr)
        if "lambda_dssim" in self.schedules:
            if "l1" in self.schedules or "dssim" in self.schedules:
                raise ValueError(
                    "LossTerms: a lambda_dssim schedule sets the l1 and dssim weights itself; remove the "
                    f"schedules of {sorted({'l1', 'dssim'} & set(self.schedules))} or the one of lambda_dssim"
                )
            if not {"l1", "dssim"} <= set(loss.weights):
                raise ValueError(
                    "LossTerms: a lambda_dssim schedule needs a loss with l1 and dssim terms, "
                    f"got {sorted(loss.weights)}"
                )
            if any(w > 1 for _, w in self.schedules["lambda_dssim"]):
                raise ValueError(
                    f"LossTerms: lambda_dssim must stay in [0, 1], got the schedule {self.schedules['lambda_dssim']}"
                )
        unknown = sorted(set(self.schedules) - set(loss.weights) - {"lambda_dssim"})
        if unknown:
            raise ValueError(
                f"LossTerms: schedules name terms the loss does not have: {unknown}; "
                f"its terms are {sorted(loss.weights)}"
            )
        self._apply(loss, trainer.global_step)

    def _apply(self, loss, step: int) -> None:
        for name, pts in self.schedules.items():
            value = interpolate_schedule(pts, step)
            if name == "lambda_dssim":
                loss.set_weight("l1", 1.0 - value)
                loss.set_weight("dssim", value)
            else:
                loss.set_weight(name, value)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._apply(find_loss(pl_module, self.loss_attr), trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = find_loss(pl_module, self.loss_attr)
        for name, value in (loss.terms or {}).items():
            pl_module.log(f"loss/{name}", value, batch_size=1)
        for name, w in (loss.weights or {}).items():
            pl_module.log(f"weight/{name}", float(w), batch_size=1)


def _write_png_atomic(path: str, rgb: np.ndarray) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.image as mpimg

    with atomic_output(path) as tmp:
        mpimg.imsave(tmp, np.clip(rgb, 0, 1), format="png")


_IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".exr", ".tif", ".tiff", ".webp", ".bmp")


def render_file_name(name: str) -> str:
    """``<stem>.png`` for a view name: no folder part, and an image extension dropped
    (``"./test/r_0.png"`` -> ``"r_0.png"``, never ``r_0.png.png``)."""
    base = os.path.basename(str(name).replace("\\", "/"))
    stem, ext = os.path.splitext(base)
    return f"{stem if ext.lower() in _IMAGE_EXTENSIONS else base}.png"


class HeldOutMetrics(L.Callback):
    """PSNR, SSIM and MS-SSIM on the validation views, plus side-by-side renders.

    Logged (mean over the held-out views, synchronised across processes), all with data range 1 on
    the prediction clamped to [0, 1]:

    - ``val/psnr``;
    - ``val/ssim``: splatloss's default SSIM (11x11 Gaussian window, sigma 1.5, "valid": no padding),
      which is skimage's ``structural_similarity(gaussian_weights=True, sigma=1.5,
      use_sample_covariance=False)``;
    - ``val/ssim_3dgs``: the SSIM 3D Gaussian Splatting papers report (:func:`ssim_3dgs`: the same
      window with zero "same" padding);
    - ``val/ssim_skimage``: skimage's default ``structural_similarity`` (:func:`ssim_skimage`: 7x7
      uniform window, sample covariance, "valid"), what its defaults give;
    - ``val/ms_ssim``: the standard weights truncated to the scales the image size allows
      (:func:`ms_ssim_weights_for`), the number of scales recorded in :attr:`last`.

    LPIPS is not computed: it needs pretrained network weights (see docs/splat.md, "Evaluation").
    :attr:`last` holds the latest values.

    Args:
        save_renders: write ``<dirpath>/<tag>/<name>.png`` (prediction | ground truth) for the first
            ``max_renders`` views, on global rank 0 only.
        dirpath: folder for renders; default ``<trainer.default_root_dir>/renders``.
        max_renders: how many views to save (and show in TensorBoard) per evaluation.
        log_images: when the trainer has a TensorBoard logger, add the same side-by-side images to
            it as ``held_out/<view>`` at the current global step (global rank 0 only).
    """

    METRICS = ("psnr", "ssim", "ssim_3dgs", "ssim_skimage", "ms_ssim")

    def __init__(
        self, save_renders: bool = True, dirpath: Optional[str] = None, max_renders: int = 4, log_images: bool = True
    ):
        self.save_renders = save_renders
        self.dirpath = dirpath
        self.max_renders = max_renders
        self.log_images = log_images
        self.tag: Optional[str] = None
        self.last: Dict[str, Any] = {}
        self._rows: List[Dict[str, float]] = []

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._rows = []

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if not isinstance(outputs, Mapping) or "pred" not in outputs or "target" not in outputs:
            raise ValueError(
                "HeldOutMetrics: validation_step must return a dict with 'pred' and 'target' "
                f"images (B, 3, H, W), got {type(outputs).__name__}"
            )
        pred = outputs["pred"].detach().float().clamp(0, 1)
        target = outputs["target"].detach().float()
        if pred.shape != target.shape or pred.ndim != 4:
            raise ValueError(
                f"HeldOutMetrics: pred and target must both be (B, C, H, W) of one shape, got "
                f"{tuple(pred.shape)} and {tuple(target.shape)}"
            )
        mse = ((pred - target) ** 2).flatten(1).mean(1)  # [B]
        psnr = -10.0 * torch.log10(mse.clamp_min(1e-12))
        weights = ms_ssim_weights_for(min(pred.shape[-2:]))
        values = {
            "psnr": psnr,
            "ssim": ssim(pred, target, data_range=1.0, reduction="none"),
            "ssim_3dgs": ssim_3dgs(pred, target),
            "ssim_skimage": ssim_skimage(pred, target),
            "ms_ssim": ms_ssim(pred, target, data_range=1.0, weights=weights, reduction="none"),
        }
        for b in range(pred.shape[0]):
            self._rows.append({k: float(v[b]) for k, v in values.items()})
        self.last["ms_ssim_scales"] = len(weights)
        if batch_idx >= self.max_renders or not trainer.is_global_zero:
            return
        name = str(outputs.get("name") or f"view_{batch_idx:03d}")
        side = torch.cat([pred[0], target[0]], dim=-1).permute(1, 2, 0).cpu().numpy()  # [H, 2W, 3]
        if self.save_renders:
            root = self.dirpath or os.path.join(trainer.default_root_dir, "renders")
            tag = self.tag or f"step_{trainer.global_step:06d}"
            _write_png_atomic(os.path.join(root, tag, render_file_name(name)), side)
        if self.log_images:
            for logger in _tensorboard_loggers(trainer):
                stem = os.path.splitext(render_file_name(name))[0]
                logger.experiment.add_image(
                    f"held_out/{stem}", np.clip(side, 0, 1), global_step=trainer.global_step, dataformats="HWC"
                )

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if not self._rows:
            return
        for key in self.METRICS:
            value = sum(r[key] for r in self._rows) / len(self._rows)
            pl_module.log(f"val/{key}", value, sync_dist=True, batch_size=len(self._rows))
            self.last[key] = value
        self.last["num_views"] = len(self._rows)


def _tensorboard_loggers(trainer) -> List[Any]:
    """The trainer's TensorBoard loggers (Lightning's, or Fabric's it derives from)."""
    return [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]


class StepProgressBar(L.pytorch.callbacks.RichProgressBar):
    """Lightning's rich progress bar, labelled for step-budgeted runs, with the step time and loss.

    Training here is one long pass of ``max_steps`` steps over a step-indexed view order, so
    Lightning's ``Epoch 0/{max_epochs - 1}`` label read ``Epoch 0/-2`` (``max_epochs=-1``).
    The label becomes ``Training`` and the bar counts the run's steps: ``global_step`` out of
    ``max_steps``, so a run resumed at step 120 of 200 starts at ``120/200`` and ends at
    ``200/200`` (Lightning counts the batches of this process: ``200/80``).

    Beside it: ``loss`` (``train/loss``, 4 decimals), ``ms/step`` (``step_ms``: SplatModule logs the
    mean of the last 20 steps), ``Gaussians``
    (``num_gaussians``, a count) and ``loss share`` (``loss_share``, in percent) when the module logs
    them with ``prog_bar=True``, then any other progress-bar metric as Lightning shows it. The
    logger's version (``v_num``, always 0 in a run folder of its own) and the it/s column are left
    out, and the bar is shorter than Lightning's, so the line fits a 120-column terminal; output
    that is not a terminal (and sets no ``COLUMNS``) is written 160 columns wide.

    Output that is not a terminal (nohup, SLURM, a redirected log) shows rich's bar only when it
    ends; there the bar's state is also printed as one line at the first step, then every
    ``line_interval_s`` seconds (0: every step) and at the last step: ``Training step 120/1000
    (12%): loss 0.1234, ms/step 21.0, ...; 0:00:05 elapsed, ~0:00:36 left``.
    """

    BAR_WIDTH = 20
    # (logged name, shown name, format)
    SHOWN = (
        ("train/loss", "loss", "{:.4f}"),
        ("step_ms", "ms/step", "{:.1f}"),
        ("num_gaussians", "Gaussians", "{:.0f}"),
        ("loss_share", "loss share", "{:.0%}"),
    )

    # Output that is not a terminal (a log file, a scheduler's output) gets one line this wide
    # instead of rich's 80 columns, which wrapped the metrics over four lines.
    FILE_WIDTH = 160

    def __init__(self, *args, line_interval_s: float = 30.0, console_kwargs: Optional[Dict[str, Any]] = None, **kwargs):
        if (
            not isinstance(line_interval_s, (int, float))
            or isinstance(line_interval_s, bool)
            or not (0 <= line_interval_s < math.inf)
        ):
            raise ValueError(f"line_interval_s must be a finite number of seconds >= 0, got {line_interval_s!r}")
        if console_kwargs is None and not sys.stdout.isatty() and "COLUMNS" not in os.environ:
            console_kwargs = {"width": self.FILE_WIDTH}
        super().__init__(*args, console_kwargs=console_kwargs, **kwargs)
        self.line_interval_s = float(line_interval_s)
        self._lines = False
        self._line_t0 = 0.0
        self._line_start = 0
        self._last_line: Optional[float] = None

    def _prints_lines(self) -> bool:
        """Output that is not a terminal (a log file, nohup, a scheduler) shows no live bar until the
        end: there the bar's state is printed as a line instead, every ``line_interval_s``."""
        console = self._console
        return not self.is_disabled and console is not None and not console.is_interactive and not console.is_jupyter

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        self._lines = self._prints_lines()
        self._line_t0, self._line_start, self._last_line = time.monotonic(), int(trainer.global_step), None
        if self._lines:
            every = "every step" if self.line_interval_s == 0 else f"every {self.line_interval_s:g} s"
            self._console.print(
                f"Training to step {trainer.max_steps} from step {trainer.global_step}; the output is not a "
                f"terminal, so progress is printed as a line {every}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )

    def _progress_line(self, trainer, pl_module) -> str:
        step, total = int(trainer.global_step), int(trainer.max_steps)
        elapsed = time.monotonic() - self._line_t0
        done = step - self._line_start
        left = elapsed / done * (total - step) if done > 0 else float("nan")
        metrics = ", ".join(f"{k} {v}" for k, v in self.get_metrics(trainer, pl_module).items())
        when = f"{_clock(elapsed)} elapsed" + (f", ~{_clock(left)} left" if math.isfinite(left) else "")
        return f"Training step {step}/{total} ({step / max(total, 1):.0%}): {metrics}; {when}"

    def _get_train_description(self, current_epoch: int) -> str:
        return f"{'Training':{len(self.validation_description)}}"

    def _counts_steps(self) -> bool:
        trainer = self.trainer
        return trainer.max_epochs == -1 and trainer.max_steps is not None and trainer.max_steps > 0

    @property
    def total_train_batches(self):
        return self.trainer.max_steps if self._counts_steps() else super().total_train_batches

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        if self._counts_steps() and self.progress is not None and self.train_progress_bar_id is not None:
            # Start where the run is (a resumed run), with no speed sample for the steps before.
            self.progress.reset(self.train_progress_bar_id, total=trainer.max_steps, completed=trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        position = trainer.global_step - 1 if self._counts_steps() else batch_idx
        super().on_train_batch_end(trainer, pl_module, outputs, batch, position)
        if self._lines:
            now = time.monotonic()
            last = self._counts_steps() and trainer.global_step >= trainer.max_steps
            if self._last_line is None or now - self._last_line >= self.line_interval_s or last:
                self._last_line = now
                self._console.print(
                    self._progress_line(trainer, pl_module), markup=False, highlight=False, soft_wrap=True
                )

    def configure_columns(self, trainer) -> list:
        # rich only when the bar is used: Lightning defines these columns only where rich is installed.
        from lightning.pytorch.callbacks.progress.rich_progress import ProcessingSpeedColumn
        from rich.progress import BarColumn

        # it/s is left out: ms/step says the same for training, measured on the step alone.
        columns = [c for c in super().configure_columns(trainer) if not isinstance(c, ProcessingSpeedColumn)]
        for column in columns:
            if isinstance(column, BarColumn):
                column.bar_width = self.BAR_WIDTH
        return columns

    def get_metrics(self, trainer, pl_module) -> Dict[str, Any]:
        items = dict(super().get_metrics(trainer, pl_module))
        items.pop("v_num", None)
        shown = {}
        for key, name, fmt in self.SHOWN:
            if key in items:
                value = items.pop(key)
                try:
                    shown[name] = fmt.format(float(value))
                except (TypeError, ValueError):
                    shown[name] = str(value)
        shown.update(items)
        return shown


def _clock(seconds: float) -> str:
    """``H:MM:SS``."""
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class RunInterrupted(BaseException):
    """Raised by :class:`StopOnSignal` where training cannot stop cleanly after a step: a signal
    outside ``fit`` (during an evaluation), or a second signal. A ``BaseException`` like
    ``KeyboardInterrupt``, so no ``except Exception`` swallows it; unlike ``KeyboardInterrupt``,
    Lightning lets it through instead of exiting with status 1.

    Attributes:
        signal_name: ``"SIGINT"`` or ``"SIGTERM"``.
        exit_code: the shell's convention for a process ended by that signal, ``128 + signum``
            (130 for SIGINT, 143 for SIGTERM).
    """

    def __init__(self, signum: int):
        self.signal_name = signal.Signals(signum).name
        self.exit_code = 128 + int(signum)
        super().__init__(f"stopped by {self.signal_name}")


class StopOnSignal(L.Callback):
    """SIGINT (Ctrl+C) and SIGTERM (a scheduler's stop) end training cleanly after the current step.

    During ``fit`` the first signal lets the current step finish and stops training there;
    :attr:`signal_name` says which signal came (``None``: none) and :attr:`exit_code` the status the
    process should end with (130 for SIGINT, 143 for SIGTERM). The caller then saves a checkpoint.
    A second signal, or a signal outside ``fit`` while :meth:`install` holds the handlers (an
    evaluation before or after training), raises :class:`RunInterrupted` at once.

    The handlers are installed for the duration of ``fit`` (on the main thread), replacing
    Lightning's, or for longer between :meth:`install` and :meth:`restore`.
    """

    def __init__(self):
        self.signal_name: Optional[str] = None
        self.exit_code: Optional[int] = None
        self._previous: Dict[int, Any] = {}
        self._fitting = False
        self._held = False

    def _handler(self, signum, frame) -> None:
        if self.signal_name is not None or not self._fitting:
            if not self._held:  # held: restore() runs once Lightning has put back what it replaced
                self.restore()
            raise RunInterrupted(signum)
        self.signal_name = signal.Signals(signum).name
        self.exit_code = 128 + int(signum)

    def _install(self) -> None:
        # Also at the start of fit, after Lightning has put its own SIGTERM handler over ours;
        # what restore() puts back is what was there before the first install.
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            current = signal.getsignal(signum)
            if current != self._handler:
                self._previous.setdefault(signum, current)
                signal.signal(signum, self._handler)

    def install(self) -> None:
        """Hold the handlers from now until :meth:`restore` (``fit`` included)."""
        self._held = True
        self._install()

    def restore(self) -> None:
        """Put back the handlers that were there before."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
        self._held = False

    def on_train_start(self, trainer, pl_module) -> None:
        self.signal_name = None
        self.exit_code = None
        self._fitting = True
        self._install()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.signal_name is not None:
            trainer.should_stop = True

    def on_train_end(self, trainer, pl_module) -> None:
        self._fitting = False
        if not self._held:
            self.restore()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._fitting = False
        if not self._held:
            self.restore()
