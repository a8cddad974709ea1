"""SplatModule: 3D Gaussians trained through a renderer with a :class:`splatloss.PhotometricLoss`.

Manual optimization, because densification replaces the parameter tensors mid-run: the module
owns one Adam optimizer with one parameter group per Gaussian attribute (so Lightning counts one
``global_step`` per training step), and the densification strategy rewrites both the tensors and
their Adam moments. A checkpoint holds however many Gaussians there were when it was written;
:meth:`SplatModule.on_load_checkpoint` resizes the parameters before Lightning loads the weights
and then the optimizer state, so a resumed run continues exactly.

One step, timed part by part (the run reports the step time and the loss's share of it):

1. render the view (forward through the rasterizer);
2. the photometric loss forward and backward on a detached copy of the render, which gives
   ``dL/dimage`` (by the chain rule this equals backpropagating through everything at once);
3. backpropagate ``dL/dimage`` through the renderer to the Gaussians;
4. Adam step, learning-rate schedule, densification.

With spherical harmonics beyond degree 0 (``sh_degree``), the degree the renderer evaluates rises
by one every ``sh_degree_interval`` steps up to the maximum (3DGS's schedule), a function of the
step alone, so a resumed run evaluates the same degree as an uninterrupted one.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Union

import lightning as L
import torch
from torch import nn

from ..splat.gaussians import Gaussians
from ..splat.renderer import render
from ..splat.scenes import View

__all__ = ["SplatModule", "TrainingDiverged"]

_PARAM_NAMES = ("means", "quats", "log_scales", "opacity_logits", "colors")
_SH_LR_KEY = "sh_rest"  # the higher SH coefficients' group: only with Gaussians of SH degree > 0


class TrainingDiverged(RuntimeError):
    """The Gaussians' parameters stopped being finite (NaN or inf) during training: a learning rate
    too large for the scene, most often. The message names the step, the parameters and their rates."""


def _check_gaussians(gaussians) -> None:
    if not isinstance(gaussians, nn.Module) or not all(hasattr(gaussians, k) for k in _PARAM_NAMES):
        raise TypeError(f"gaussians must be a splatloss.splat.gaussians.Gaussians, got {type(gaussians).__name__}")


def _view_from_batch(batch: Mapping[str, Any], named: bool = True) -> View:
    """A ``ViewDataset`` item (dict of tensors) back to the renderer's :class:`View`.

    ``named=False`` skips the name: ``batch["index"]`` is a tensor that Lightning moves to the
    GPU with the batch, and ``int()`` of it would sync GPU -> CPU on every training step.
    """
    image = batch["image"]  # [H, W, 3]
    name = str(int(batch["index"])) if named and "index" in batch else ""
    return View(
        image=image,
        viewmat=batch["viewmat"],
        K=batch["K"],
        width=int(image.shape[1]),
        height=int(image.shape[0]),
        name=name,
    )


class SplatModule(L.LightningModule):
    """Gaussians + renderer + photometric loss, trained with Adam; optional densification.

    The Hydra config ``model/`` builds it with ``_target_``; what depends on the scene (the
    Gaussians initialised from its points, the densification thresholds in units of its extent,
    its background colour) is given as a factory and resolved by :meth:`bind_scene`, which
    :meth:`setup` calls with the data module's scene (or call it yourself, earlier, to fail fast).

    Args:
        gaussians: the :class:`~splatloss.splat.gaussians.Gaussians` to train (their count may
            change when ``strategy`` densifies), or a factory ``gaussians(points=, colors=)`` that
            builds them from the scene's points (Hydra: ``_partial_: true``).
        loss: the photometric loss, called as ``loss(pred, target)`` on ``(1, 3, H, W)`` images;
            a :class:`splatloss.PhotometricLoss` exposes ``terms`` / ``weights`` for the callbacks.
        lr: learning rate per attribute, keys among ``means, quats, log_scales, opacity_logits,
            colors`` (all five required) and ``sh_rest`` (required when the Gaussians' SH degree is
            above 0; 3DGS uses the colours' rate / 20).
        means_lr_final_factor: the means' learning rate decays exponentially from ``lr["means"]``
            to ``lr["means"] * means_lr_final_factor`` over ``lr_decay_steps`` (3DGS schedule).
        lr_decay_steps: steps of that decay (the run's ``max_steps``); after it the rate stays.
        strategy: densification / pruning, an object with ``pre_backward(out)``,
            ``post_step(gaussians, optimizer, out, step) -> bool`` and ``state_dict()`` /
            ``load_state_dict()``, or a factory ``strategy(extent=)`` given the scene's extent;
            ``None`` trains a fixed set of Gaussians.
        render_backend: passed to :func:`splatloss.splat.renderer.render` (``"auto"``, ``"cpu"``,
            ``"cuda"``).
        render_options: further keyword arguments of ``render`` (e.g. the CPU path's
            ``tile_size``, ``max_per_tile``).
        background: RGB the renders are composited on, or ``None``: the scene's own background
            once bound to a scene (black for the default scene, white for Blender), else the
            renderer's default.
        adam_eps: Adam's epsilon (3DGS uses 1e-15: the gradients of tiny Gaussians are tiny).
        time_steps: time the parts of each step (logged as ``step_ms`` / ``loss_share``). On CUDA
            this synchronises the device between the parts (kernels run asynchronously); set
            False to train without those syncs. On the CPU it costs nothing measurable.
        means_lr_times_extent: ``lr["means"]`` is per unit of scene extent (3DGS): the rate used
            is ``lr["means"] * scene.extent``, set by :meth:`bind_scene`.
        sh_degree: maximum spherical-harmonics degree of the colour (0..3), passed to the
            Gaussians factory as ``sh_degree=``; with Gaussians given directly it must equal
            theirs. ``None``: the Gaussians' own (the factory's default).
        sh_degree_interval: the evaluated SH degree is ``min(sh_degree, step // sh_degree_interval)``
            (3DGS: 1000).
        step_ms_window: ``step_ms`` (the progress bar's ms/step) is the mean of this many latest
            steps; the run's ``step_seconds`` is the median of all of them.
        check_finite_every: on a GPU, how often (in steps) the parameters' finiteness, tracked on
            the device at every step, is read back (a device sync); also at the end of training
            and before every checkpoint. On the CPU it is read every step (no sync to save).
            Non-finite Gaussians raise :class:`TrainingDiverged` naming the first step that made them.
    """

    def __init__(
        self,
        gaussians: Union[Gaussians, Callable[..., Gaussians]],
        loss: nn.Module,
        lr: Mapping[str, float],
        means_lr_final_factor: float = 0.01,
        lr_decay_steps: int = 1000,
        strategy: Optional[Any] = None,
        render_backend: str = "auto",
        render_options: Optional[Mapping[str, Any]] = None,
        background: Optional[Sequence[float]] = None,
        adam_eps: float = 1e-15,
        time_steps: bool = True,
        means_lr_times_extent: bool = False,
        sh_degree: Optional[int] = None,
        sh_degree_interval: int = 1000,
        step_ms_window: int = 20,
        check_finite_every: int = 100,
    ):
        super().__init__()
        if sh_degree is not None and (
            not isinstance(sh_degree, int) or isinstance(sh_degree, bool) or not 0 <= sh_degree <= 3
        ):
            raise ValueError(f"sh_degree must be an integer in 0..3 or None, got {sh_degree!r}")
        if not isinstance(sh_degree_interval, int) or isinstance(sh_degree_interval, bool) or sh_degree_interval < 1:
            raise ValueError(f"sh_degree_interval must be an integer >= 1, got {sh_degree_interval!r}")
        if not isinstance(step_ms_window, int) or isinstance(step_ms_window, bool) or step_ms_window < 1:
            raise ValueError(f"step_ms_window must be an integer >= 1, got {step_ms_window!r}")
        if not isinstance(check_finite_every, int) or isinstance(check_finite_every, bool) or check_finite_every < 1:
            raise ValueError(f"check_finite_every must be an integer >= 1, got {check_finite_every!r}")
        if isinstance(gaussians, nn.Module):
            _check_gaussians(gaussians)
            if sh_degree is not None and gaussians.sh_degree != sh_degree:
                raise ValueError(
                    f"sh_degree={sh_degree} but the Gaussians given have SH degree {gaussians.sh_degree}: "
                    "build them with Gaussians.from_points(..., sh_degree=) or leave sh_degree=None"
                )
        elif not callable(gaussians):
            raise TypeError(
                "gaussians must be a splatloss.splat.gaussians.Gaussians or a factory gaussians(points=, colors=), "
                f"got {type(gaussians).__name__}"
            )
        if not callable(loss):
            raise TypeError(f"loss must be a callable nn.Module, got {type(loss).__name__}")
        if not isinstance(lr, Mapping):
            raise TypeError(
                f"lr must map each parameter group to its learning rate (keys {sorted(_PARAM_NAMES)}), got {lr!r}"
            )
        lr = dict(lr)
        if not set(_PARAM_NAMES) <= set(lr) <= set(_PARAM_NAMES) | {_SH_LR_KEY}:
            raise ValueError(
                f"lr must give the keys {sorted(_PARAM_NAMES)} (and {_SH_LR_KEY!r} with SH degree > 0), "
                f"got {sorted(lr)}"
            )
        for k, v in lr.items():
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0 or not math.isfinite(v):
                raise ValueError(f"lr[{k!r}] must be a finite number >= 0, got {v!r}")
        if (
            not isinstance(means_lr_final_factor, (int, float))
            or isinstance(means_lr_final_factor, bool)
            or not (0 < means_lr_final_factor <= 1)
        ):
            raise ValueError(f"means_lr_final_factor must be in (0, 1], got {means_lr_final_factor!r}")
        if not isinstance(lr_decay_steps, int) or lr_decay_steps < 1:
            raise ValueError(f"lr_decay_steps must be an integer >= 1, got {lr_decay_steps!r}")
        self.automatic_optimization = False
        if isinstance(gaussians, nn.Module):
            self.gaussians = gaussians
            self._gaussians_factory = None
        else:
            self.gaussians = None
            self._gaussians_factory = gaussians
        self.loss = loss
        self.lr = {k: float(v) for k, v in lr.items()}
        self.means_lr_final_factor = float(means_lr_final_factor)
        self.lr_decay_steps = lr_decay_steps
        # A strategy object has post_step; anything else callable is a factory of the scene's extent.
        factory = strategy is not None and callable(strategy) and not hasattr(strategy, "post_step")
        self.strategy = None if factory else strategy
        self._strategy_factory = strategy if factory else None
        self.means_lr_times_extent = bool(means_lr_times_extent)
        self.scene_bound = False
        self._device_masks: Dict[tuple, torch.Tensor] = {}  # (view index, device) -> mask there
        self.render_backend = render_backend
        self.render_options = dict(render_options or {})
        self.background = None if background is None else tuple(float(c) for c in background)
        self.adam_eps = adam_eps
        self.time_steps = bool(time_steps)
        # Wall-clock sums per part of the step (seconds), skipping the first `_warmup` steps, and
        # every timed step's duration (its median is the run's step time; the progress bar shows
        # the mean of the last `step_ms_window`).
        self._warmup = 3
        self._timing = {"render": 0.0, "loss": 0.0, "backward": 0.0, "optim": 0.0, "step": 0.0, "n": 0}
        self._step_times: list = []
        # The first steps, timed apart: a run too short to skip them reports them (they include the
        # first calls' one-off costs, and the run says so) rather than a step time of 0.
        self._warmup_timing = dict(self._timing)
        self._warmup_times: list = []
        self.step_ms_window = step_ms_window
        # Whole-run totals across resumes: training seconds of the runs before this one (from the
        # checkpoint), this fit's start time and the step it started from.
        self._seconds_before = 0.0
        self._fit_t0: Optional[float] = None
        self._fit_seconds = 0.0
        self.start_step = 0
        self.sh_degree = sh_degree
        self.sh_degree_interval = sh_degree_interval
        # A checkpoint's loss weights (a schedule's, or set by a callback) continue the same run; a
        # resume allowed to change the loss (resume_allow_changes=true) sets this False, so the loss
        # trains with the weights it was configured with, the ones the run records.
        self.loss_weights_from_checkpoint = True
        self.check_finite_every = check_finite_every
        # Per parameter (in param_names order), the first step after which it was not finite, or -1;
        # kept on the parameters' device so that tracking it costs no sync.
        self._first_nonfinite: Optional[torch.Tensor] = None
        if self.gaussians is not None:
            self._check_sh_lr()

    def _check_sh_lr(self) -> None:
        if "sh_rest" in self.gaussians.param_names and _SH_LR_KEY not in self.lr:
            raise ValueError(
                f"the Gaussians have SH degree {self.gaussians.sh_degree}: lr needs a {_SH_LR_KEY!r} rate for their "
                "higher SH coefficients (model.lr.sh_rest; 3DGS uses lr.colors / 20)"
            )

    # -- the scene -----------------------------------------------------------------------------------
    def bind_scene(self, scene) -> None:
        """Resolve what depends on the scene (once; later calls do nothing): build the Gaussians
        and the strategy from their factories, scale ``lr["means"]`` by ``scene.extent`` when
        ``means_lr_times_extent``, and take the scene's background when none was given."""
        if self.scene_bound:
            return
        if self._gaussians_factory is not None:
            kwargs = {} if self.sh_degree is None else {"sh_degree": self.sh_degree}
            gaussians = self._gaussians_factory(points=scene.points, colors=scene.colors, **kwargs)
            _check_gaussians(gaussians)
            self.gaussians = gaussians
            self._gaussians_factory = None
            self._check_sh_lr()
        if self._strategy_factory is not None:
            self.strategy = self._strategy_factory(extent=float(scene.extent))
            self._strategy_factory = None
        if self.means_lr_times_extent:
            self.lr["means"] = self.lr["means"] * float(scene.extent)
        if self.background is None and getattr(scene, "background", None) is not None:
            self.background = tuple(float(c) for c in scene.background)
        self.scene_bound = True

    def setup(self, stage: str) -> None:
        if self.scene_bound:
            return
        dm = getattr(self.trainer, "datamodule", None)
        if dm is not None and getattr(dm, "scene", None) is not None:
            self.bind_scene(dm.scene)
        elif self.gaussians is None or self.means_lr_times_extent or self._strategy_factory is not None:
            raise ValueError(
                "SplatModule needs a scene (its Gaussians, strategy or means learning rate depend on it): "
                "fit with a datamodule that has .scene (SceneDataModule) or call module.bind_scene(scene) first"
            )
        else:
            self.scene_bound = True

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        """Lightning's transfer, except a view's mask: moved once per view and device, and the same
        device tensor handed to the loss step after step, so that the loss checks it once (a mask
        is checked per tensor and version; a tensor moved anew each step would be read back to the
        host on every step). The view is known from ``batch["index"]``, read before the transfer
        (a CPU tensor then: no device synchronisation)."""
        mask = batch.get("mask") if isinstance(batch, dict) else None
        index = batch.get("index") if mask is not None else None
        if index is None or not isinstance(mask, torch.Tensor) or index.device.type != "cpu":
            return super().transfer_batch_to_device(batch, device, dataloader_idx)
        rest = {k: v for k, v in batch.items() if k != "mask"}
        moved = super().transfer_batch_to_device(rest, device, dataloader_idx)
        key = (int(index), str(device))
        kept = self._device_masks.get(key)
        if kept is None or kept.shape != mask.shape or kept.dtype != mask.dtype:
            kept = self._device_masks[key] = mask.to(device)
        moved["mask"] = kept
        return moved

    # -- rendering ---------------------------------------------------------------------------------
    def _background(self, device) -> Optional[torch.Tensor]:
        return None if self.background is None else torch.tensor(self.background, device=device)

    def render_view(self, view: View) -> Dict[str, torch.Tensor]:
        """Render one view with the current Gaussians; ``out["image"]`` is ``[H, W, 3]``."""
        return render(
            self.gaussians,
            view,
            backend=self.render_backend,
            background=self._background(view.image.device),
            **self.render_options,
        )

    @staticmethod
    def _to_bchw(img: torch.Tensor) -> torch.Tensor:
        return img.permute(2, 0, 1).unsqueeze(0)  # [H, W, 3] -> [1, 3, H, W]

    # -- optimisation ------------------------------------------------------------------------------
    def configure_optimizers(self):
        names = self.gaussians.param_names  # the five, and sh_rest with SH degree > 0
        groups = [{"params": [getattr(self.gaussians, k)], "lr": self.lr[k], "name": k} for k in names]
        return torch.optim.Adam(groups, lr=0.0, eps=self.adam_eps)

    def means_lr(self, step: int) -> float:
        """The 3DGS exponential decay of the means' learning rate, a function of the step alone."""
        t = min(step, self.lr_decay_steps) / self.lr_decay_steps
        return self.lr["means"] * self.means_lr_final_factor**t

    def sh_degree_at(self, step: int) -> int:
        """The SH degree evaluated at training step ``step`` (3DGS: one more every 1000 steps)."""
        return min(int(self.gaussians.sh_degree), step // self.sh_degree_interval)

    def _sync_optimizer_params(self, optimizer: torch.optim.Optimizer) -> None:
        # After densification the Gaussians hold new tensors; each group must point at them.
        for group in optimizer.param_groups:
            current = getattr(self.gaussians, group["name"])
            if group["params"][0] is not current:
                raise RuntimeError(
                    f"optimizer group {group['name']!r} lost track of its parameter after densification: "
                    "the strategy must update the optimizer's params and state together"
                )

    def _now(self) -> float:
        if self.time_steps and self.gaussians.means.is_cuda:
            torch.cuda.synchronize(self.gaussians.means.device)
        return time.perf_counter()

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        optimizer = opt.optimizer if hasattr(opt, "optimizer") else opt
        view = _view_from_batch(batch, named=False)  # no name: no device sync on the hot path
        # Evaluations between steps keep the degree of the last step trained.
        self.gaussians.set_active_sh_degree(self.sh_degree_at(self.global_step))
        t0 = self._now()
        out = self.render_view(view)
        pred = self._to_bchw(out["image"])  # [1, 3, H, W]
        target = self._to_bchw(view.image)
        if self.strategy is not None:
            self.strategy.pre_backward(out)
        t1 = self._now()
        # The loss forward+backward on its own, so its cost is measured apart from the renderer's.
        pred_leaf = pred.detach().requires_grad_(True)
        mask = batch.get("mask")  # [H, W] alpha of RGBA views with data.alpha_as_mask=true
        if mask is None:
            loss = self.loss(pred_leaf, target)
        else:
            loss = self.loss(pred_leaf, target, mask=mask.reshape(1, 1, *mask.shape[-2:]).to(pred_leaf.dtype))
        (grad,) = torch.autograd.grad(loss, pred_leaf)
        t2 = self._now()
        self.manual_backward(pred, grad)
        t3 = self._now()
        step = self.global_step
        for group in optimizer.param_groups:
            if group["name"] == "means":
                group["lr"] = self.means_lr(step)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if self.strategy is not None:
            with torch.no_grad():
                changed = self.strategy.post_step(self.gaussians, optimizer, out, step)
            if changed:
                self._sync_optimizer_params(optimizer)
        self._track_finite(step)
        t4 = self._now()
        if self.time_steps:
            warm = step >= self._warmup
            tm = self._timing if warm else self._warmup_timing
            tm["render"] += t1 - t0
            tm["loss"] += t2 - t1
            tm["backward"] += t3 - t2
            tm["optim"] += t4 - t3
            tm["step"] += t4 - t0
            tm["n"] += 1
            (self._step_times if warm else self._warmup_times).append(t4 - t0)
        last = self._trainer is not None and step + 1 >= int(self.trainer.max_steps)
        if not self.gaussians.means.is_cuda or (step + 1) % self.check_finite_every == 0 or last:
            self.check_finite()
        self.log("train/loss", loss.detach(), prog_bar=True, batch_size=1)
        self.log("num_gaussians", float(self.gaussians.means.shape[0]), prog_bar=True, batch_size=1)
        if self.gaussians.sh_degree > 0:
            self.log("sh_degree", float(self.gaussians.active_sh_degree), batch_size=1)
        if self._timing["n"]:
            tm = self._timing
            recent = self._step_times[-self.step_ms_window :]
            self.log("step_ms", 1000.0 * sum(recent) / len(recent), prog_bar=True, batch_size=1)
            self.log("loss_share", tm["loss"] / tm["step"], prog_bar=True, batch_size=1)
        return loss.detach()

    def _track_finite(self, step: int) -> None:
        bad = torch.stack([~torch.isfinite(getattr(self.gaussians, k)).all() for k in self.gaussians.param_names])
        if self._first_nonfinite is None or self._first_nonfinite.device != bad.device:
            self._first_nonfinite = torch.full(bad.shape, -1, dtype=torch.long, device=bad.device)
        first = self._first_nonfinite
        self._first_nonfinite = torch.where(bad & (first < 0), torch.full_like(first, step), first)

    def check_finite(self) -> None:
        """Raise :class:`TrainingDiverged` if a training step has made any parameter non-finite,
        naming the first such step, the parameters it made non-finite and their learning rates."""
        if self._first_nonfinite is None:
            return
        first = self._first_nonfinite.tolist()
        steps = [s for s in first if s >= 0]
        if not steps:
            return
        step = min(steps)
        names = [k for k, s in zip(self.gaussians.param_names, first) if s == step]
        rates = ", ".join(f"model.lr.{k}={self.lr[k]:g}" for k in names if k in self.lr)
        total = f" of {int(self.trainer.max_steps)}" if self._trainer is not None else ""
        raise TrainingDiverged(
            f"training diverged at step {step + 1}{total}: the Gaussians' {', '.join(names)} "
            f"{'is' if len(names) == 1 else 'are'} not finite (NaN or inf) after the optimizer step; their "
            f"learning rates: {rates}. Lower them (model.lr.<name>=...); nothing of this run after the last finite "
            "state was saved"
        )

    def timing(self) -> Dict[str, float]:
        """Seconds per training step, after the first few steps and across resumes: ``step_seconds``
        is the median step (robust to a stall: an evaluation, another process), the parts
        (``render_seconds``, ``loss_seconds``, ...) and ``step_mean_seconds`` are means, and
        ``loss_share`` is the loss's share of the summed step time.

        A run of no more steps than the skipped ones reports those (``includes_warmup`` true); a
        run that timed no step (``time_steps=False``) reports NaN, never 0."""
        warmup = not self._timing["n"]
        tm, times = (self._warmup_timing, self._warmup_times) if warmup else (self._timing, self._step_times)
        n = tm["n"]
        nan = float("nan")
        res = {f"{k}_seconds": tm[k] / n if n else nan for k in ("render", "loss", "backward", "optim", "step")}
        res["step_mean_seconds"] = res["step_seconds"]
        if times:
            res["step_seconds"] = statistics.median(times)
        res["loss_share"] = tm["loss"] / tm["step"] if tm["step"] > 0 else nan
        res["timed_steps"] = n
        res["includes_warmup"] = bool(warmup and n)
        return res

    # -- evaluation ---------------------------------------------------------------------------------
    def validation_step(self, batch, batch_idx):
        view = _view_from_batch(batch)
        with torch.no_grad():
            out = self.render_view(view)
        name = f"test_{int(batch['index']):03d}" if "index" in batch else f"test_{batch_idx:03d}"
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is not None and hasattr(dm, "scene") and "index" in batch:
            name = dm.scene.test[int(batch["index"])].name or name
        return {"pred": self._to_bchw(out["image"]).clamp(0, 1), "target": self._to_bchw(view.image), "name": name}

    def train_seconds(self) -> Dict[str, float]:
        """Training wall-clock seconds: ``total`` over the whole run (every resume included) and
        ``this_run`` for this process's fit."""
        now = self._fit_seconds + (0.0 if self._fit_t0 is None else time.perf_counter() - self._fit_t0)
        return {"total": self._seconds_before + now, "this_run": now}

    def on_train_end(self) -> None:
        self.check_finite()
        if self._fit_t0 is not None:
            self._fit_seconds += time.perf_counter() - self._fit_t0
            self._fit_t0 = None

    def on_train_start(self) -> None:
        self._fit_t0 = time.perf_counter()
        self.start_step = int(self.global_step)
        rng = getattr(self, "_pending_rng", None)
        if rng is not None:
            torch.set_rng_state(rng)
            self._pending_rng = None

    # -- checkpoints --------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: Dict[str, Any]) -> None:
        self.check_finite()  # a checkpoint of non-finite Gaussians is never written
        checkpoint["splatloss"] = {
            "num_gaussians": int(self.gaussians.means.shape[0]),
            "strategy": None if self.strategy is None else self.strategy.state_dict(),
            # Densification draws random numbers: the resumed run must draw the same ones.
            "torch_rng": torch.get_rng_state(),
            "loss_weights": dict(getattr(self.loss, "weights", {}) or {}),
            "train_seconds": self.train_seconds()["total"],
            "timing": dict(self._timing),
            "step_times": torch.tensor(self._step_times, dtype=torch.float64),
            "warmup_timing": dict(self._warmup_timing),
            "warmup_times": torch.tensor(self._warmup_times, dtype=torch.float64),
        }

    def on_load_checkpoint(self, checkpoint: Dict[str, Any]) -> None:
        # Resize the parameters to the checkpoint's count before Lightning copies the weights in
        # (load_state_dict copies into existing tensors and rejects a shape change); the optimizer
        # is built afterwards from these tensors and then given the checkpoint's Adam moments.
        sd = checkpoint["state_dict"]
        for k in self.gaussians.param_names:
            key = f"gaussians.{k}"
            if key in sd and sd[key].shape != getattr(self.gaussians, k).shape:
                setattr(
                    self.gaussians, k, nn.Parameter(torch.empty_like(sd[key], device=getattr(self.gaussians, k).device))
                )
        extra = checkpoint.get("splatloss", {})
        if self.strategy is not None and extra.get("strategy") is not None:
            self.strategy.load_state_dict(extra["strategy"])
        # Restored in on_train_start, after Lightning has built the data iterators (anything that
        # draws from the global generator in between would shift the stream).
        self._pending_rng = extra.get("torch_rng")
        self._seconds_before = float(extra.get("train_seconds", 0.0))
        self._fit_seconds = 0.0
        self.start_step = int(checkpoint.get("global_step", 0))
        # The degree the last trained step used (evaluating a finished run without training more).
        self.gaussians.set_active_sh_degree(self.sh_degree_at(max(self.start_step - 1, 0)))
        if extra.get("timing"):
            self._timing = dict(extra["timing"])
        if extra.get("step_times") is not None:
            self._step_times = [float(t) for t in extra["step_times"]]
        if extra.get("warmup_timing"):
            self._warmup_timing = dict(extra["warmup_timing"])
        if extra.get("warmup_times") is not None:
            self._warmup_times = [float(t) for t in extra["warmup_times"]]
        weights = extra.get("loss_weights") or {}
        if self.loss_weights_from_checkpoint and weights and hasattr(self.loss, "set_weight"):
            for name, w in weights.items():
                self.loss.set_weight(name, w)
        # The loss's own state (PhotometricLoss keeps its weights there), which Lightning loads after
        # this hook: the configured one where the loss was allowed to change, and the one just set
        # from "loss_weights" where the checkpoint has none (a version whose loss kept no state).
        ours = self.loss.state_dict(prefix="loss.") if isinstance(self.loss, nn.Module) else {}
        for key, value in ours.items():
            if key not in sd or not self.loss_weights_from_checkpoint:
                sd[key] = value
