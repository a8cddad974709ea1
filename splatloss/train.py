"""The training entry point: ``train(cfg)`` builds everything from a Hydra config, fits, evaluates.

``splatloss-train loss=dssim_l1`` (or ``python -m splatloss.train``, ``python scripts/train.py``)
calls :func:`main` (Hydra), which calls :func:`train`. A run writes into its folder (Hydra's
``outputs/<date>/<time>/``, or ``multirun/...`` for ``-m``):

- ``metrics.json``: held-out ``psnr`` / ``ssim`` / ``ms_ssim`` of the trained model and of the
  untrained one (``psnr_init``, ...), the whole run's steps and seconds, the step time and the
  loss's share of it, the Gaussians, the loss configuration (:func:`~splatloss.lightning.runs.run_metrics`);
- ``checkpoints/last.ckpt`` (every ``callbacks.checkpoint.every_n_train_steps`` steps, at the end,
  and on SIGINT/SIGTERM; ``resume=true`` or ``resume=latest`` continues from it, exactly);
- ``renders/{init,step_<n>,final}/<view>.png``: prediction | ground truth of held-out views;
- ``point_cloud.ply``: the trained Gaussians (3DGS layout).

Everything a config can get wrong stops with one ``ValueError`` before anything is trained or
written: an unknown or negative setting, a missing dataset, a loss that cannot run on the data's
views or device (one dry call), a GPU trainer without a GPU, a missing checkpoint.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Any, Dict, Optional

import torch

log = logging.getLogger(__name__)

__all__ = ["train", "main", "CONFIG_DIR"]


def _config_dir() -> str:
    """``splatloss/configs`` in an installed wheel (the repository's ``configs/`` mapped into the
    package), else ``configs/`` beside the package in a source checkout."""
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, "configs"), os.path.join(here, os.pardir, "configs")):
        if os.path.isfile(os.path.join(candidate, "train.yaml")):
            return os.path.abspath(candidate)
    raise FileNotFoundError(
        f"the training configs (train.yaml) are neither in {os.path.join(here, 'configs')} (installed wheel) nor in "
        f"{os.path.abspath(os.path.join(here, os.pardir, 'configs'))} (source checkout); reinstall splatloss[train]"
    )


CONFIG_DIR = _config_dir()


def _build(what: str, node, source: Optional[str] = None, **kwargs):
    from hydra.utils import instantiate

    from .lightning.runs import root_message

    try:
        return instantiate(node, **kwargs)
    except Exception as e:  # Hydra wraps the constructor's error: show the constructor's own message
        source = source or f"{what}={node.get('_target_')}"
        raise ValueError(f"could not build the {what} from {source}: {root_message(e)}") from None


def train(cfg) -> Dict[str, Any]:
    """Build data, loss, model, callbacks and trainer from ``cfg``; fit; evaluate; write metrics.

    Returns:
        The metrics dict also written to ``<cfg.output_dir>/metrics.json``.
    """
    import lightning as L

    from .lightning import HeldOutMetrics, SceneDataModule, StopOnSignal, check_scene, runs
    from .lightning.checkpoint_io import AtomicCheckpointIO

    runs.check_config(cfg)
    _quiet_lightning()
    out_dir = os.path.abspath(str(cfg.output_dir))
    ckpt_path = runs.resolve_checkpoint(cfg)
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)

    # Build every object and try the loss on the data first: a bad config fails here, not at step 0.
    loss = _build("loss", cfg.loss)
    scene = _build("scene", cfg.data.scene, "data")
    check_scene(scene)
    module = _build("model", cfg.model, loss=loss)
    module.bind_scene(scene)
    num_gaussians_init = module.gaussians.num
    callbacks = [_build("callbacks", c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    if not cfg.trainer.get("enable_progress_bar", True):  # Lightning refuses a progress bar beside this
        callbacks = [c for c in callbacks if not isinstance(c, L.pytorch.callbacks.ProgressBar)]
    evaluator = next((c for c in callbacks if isinstance(c, HeldOutMetrics)), None)
    if evaluator is not None and evaluator.dirpath is None:
        evaluator.dirpath = os.path.join(out_dir, "renders")
    stopper = StopOnSignal()
    logger = _build("logger", cfg.logger) if cfg.get("logger") else False
    every = cfg.get("eval_every_n_steps")  # one epoch is the whole run: evaluate within it
    evaluation = {} if every is None else {"check_val_every_n_epoch": 1, "val_check_interval": int(every)}
    # A run shorter than the logging interval logs its last step (Lightning warns otherwise).
    log_every = min(int(cfg.trainer.get("log_every_n_steps", 50)), int(cfg.trainer.max_steps))
    trainer = _build(
        "trainer", cfg.trainer, callbacks=[*callbacks, stopper], logger=logger, default_root_dir=out_dir,
        plugins=[AtomicCheckpointIO()], log_every_n_steps=log_every, **evaluation,
    )  # fmt: skip
    if trainer.world_size > 1 and module.strategy is not None:
        raise ValueError(
            f"densification (model.strategy) cannot run with {trainer.world_size} processes: it replaces the "
            "parameter tensors, which DDP's gradient buckets cannot follow; set model.strategy=null "
            "(trainer=ddp does) or train on one device"
        )
    view = scene.train[0]
    runs.check_loss_on_views(
        loss, view.height, view.width, trainer.strategy.root_device, masked=view.mask is not None, loss_cfg=cfg.loss
    )
    dm = SceneDataModule(scene, seed=int(cfg.seed))

    init = _evaluate(trainer, module, dm, evaluator, "init")
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    ckpt_cb = next((c for c in callbacks if isinstance(c, L.pytorch.callbacks.ModelCheckpoint)), None)
    ckpt_dir = ckpt_cb.dirpath if ckpt_cb is not None and ckpt_cb.dirpath else None
    if stopper.signal_name is not None and ckpt_dir is None:
        ckpt_dir = os.path.join(out_dir, "checkpoints")  # an interrupted run always leaves one to resume
    if ckpt_dir is not None:  # the end of the run, whatever every_n_train_steps is: a later run can extend it
        trainer.save_checkpoint(os.path.join(ckpt_dir, "last.ckpt"), weights_only=False)
    final = _evaluate(trainer, module, dm, evaluator, "final")

    metrics = runs.run_metrics(
        cfg, trainer, module, scene, init=init, final=final, interrupted=stopper.signal_name,
        resumed_from=ckpt_path, num_gaussians_init=int(num_gaussians_init),
        ms_ssim_scales=evaluator.last.get("ms_ssim_scales") if evaluator is not None else None,
    )  # fmt: skip
    if trainer.is_global_zero:
        runs.write_json_atomic(os.path.join(out_dir, "metrics.json"), metrics)
        if stopper.signal_name is not None:
            print(
                f"Stopped by {stopper.signal_name} at step {metrics['steps']}; checkpoint "
                f"{os.path.join(ckpt_dir, 'last.ckpt')}. Resume with:\n  {runs.resume_command(out_dir)}",
                flush=True,
            )
        if cfg.get("export_ply", True):
            module.gaussians.export_ply(os.path.join(out_dir, "point_cloud.ply"))
        if cfg.get("render_traj", False):  # a video along a path through the training views (splat/trajectory.py)
            from .splat.trajectory import render_trajectory

            log.info("trajectory video: %s", render_trajectory(module.render_view, scene.train, f"{out_dir}/traj"))
        _summary(metrics, out_dir)
    return metrics


def _evaluate(trainer, module, dm, evaluator, tag: str) -> Dict[str, float]:
    """Held-out metrics (``val/<name>`` logged by the module and callbacks), renders to ``renders/<tag>/``."""
    if evaluator is not None:
        evaluator.tag = tag
    try:
        res = trainer.validate(module, datamodule=dm, verbose=False)
    finally:
        if evaluator is not None:  # evaluations during training render to step_<n>/
            evaluator.tag = None
    row = res[0] if res else {}
    return {k.split("/", 1)[1]: float(v) for k, v in row.items() if k.startswith("val/")}


def _summary(metrics: Dict[str, Any], out_dir: str) -> None:
    """The run's last lines: what it reached and where everything it wrote is."""
    nan = float("nan")
    step_ms = 1000 * metrics["step_seconds"] if metrics.get("step_seconds") is not None else nan
    share = 100 * metrics["loss_share"] if metrics.get("loss_share") is not None else nan
    log.info(
        "held-out PSNR %.2f dB (untrained %.2f dB), SSIM %.4f (3DGS's %.4f), MS-SSIM %.4f; %d steps in %.1f s, "
        "%.1f ms/step, loss %.1f%% of the step",
        metrics.get("psnr", nan),
        metrics.get("psnr_init", nan),
        metrics.get("ssim", nan),
        metrics.get("ssim_3dgs", nan),
        metrics.get("ms_ssim", nan),
        metrics["steps"],
        metrics["train_seconds"],
        step_ms,
        share,
    )
    wrote = ["metrics.json", "point_cloud.ply", os.path.join("checkpoints", "last.ckpt"), "renders"]
    found = [w for w in wrote if os.path.exists(os.path.join(out_dir, w))]
    log.info("wrote %s: %s", out_dir, ", ".join(found))


class _DropLines(logging.Filter):
    """Drops the records whose message starts with one of ``prefixes``."""

    def __init__(self, prefixes):
        super().__init__()
        self.prefixes = tuple(prefixes)

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


_LIGHTNING_NOISE = _DropLines(("💡 Tip", "GPU available", "TPU available", "HPU available", "`Trainer.fit` stopped"))


def _quiet_lightning() -> None:
    """What Lightning prints that says nothing about this run, silenced where it comes from.

    - Its advertisement for a cloud logger, the accelerator lines of every Trainer and "fit
      stopped: max_steps reached" (the summary says it): a filter on Lightning's rank-zero logger.
    - torch 2.13 deprecates ``isinstance(x, LeafSpec)``, which Lightning's batch-moving helper
      still does (lightning 2.6.6, the newest): a filter on that one message of that module.
    - "no pre-optimization state was saved": checkpoints hold the state after each step's
      optimizer update, which is exactly what resuming needs.
    """
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if _LIGHTNING_NOISE not in rank_zero.filters:
        rank_zero.addFilter(_LIGHTNING_NOISE)
    warnings.filterwarnings(
        "ignore", message=r".*isinstance\(treespec, LeafSpec\)", module=r"lightning\.pytorch\.utilities\._pytree"
    )
    warnings.filterwarnings("ignore", message=".*no pre-optimization state was saved.*")


def _one_log_stream() -> None:
    """Route Lightning's messages through Hydra's logging only (Lightning attaches its own stderr
    handler at import, so every Lightning line came out twice)."""
    import lightning  # noqa: F401  (its import adds the handlers removed here)

    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        lg = logging.getLogger(name)
        for h in list(lg.handlers):
            if type(h) is logging.StreamHandler:
                lg.removeHandler(h)
        lg.propagate = True


def main() -> Optional[float]:
    """Hydra entry: ``splatloss-train [overrides]``; returns ``cfg.optimized_metric``'s value (for
    the Optuna sweeper) when set. A config error in a single run prints one message and exits 2."""
    import hydra

    @hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
    def _main(cfg) -> Optional[float]:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        _one_log_stream()
        if cfg.get("num_threads"):
            torch.set_num_threads(int(cfg.num_threads))
        try:
            metrics = train(cfg)
        except Exception as e:
            if HydraConfig.get().mode == RunMode.MULTIRUN:
                # Into the run's log (<run>/train.log), where scripts/sweep_report.py reads why it failed;
                # the traceback only for what is not a config error.
                log.error("run failed: %s", e, exc_info=not isinstance(e, ValueError))
                raise  # the sweep records the failed job
            if not isinstance(e, ValueError):
                raise
            print(f"splatloss-train: error: {e}", file=sys.stderr, flush=True)
            sys.exit(2)
        key = cfg.get("optimized_metric")
        return None if not key else float(metrics[key])

    return _main()


if __name__ == "__main__":
    main()
