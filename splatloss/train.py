"""The training entry point: ``train(cfg)`` builds everything from a Hydra config, fits, evaluates.

``python scripts/train.py loss=dssim_l1`` calls :func:`main` (Hydra) which calls :func:`train`.
A run writes into its folder (Hydra's ``outputs/<date>/<time>/``, or ``multirun/...`` for
``-m``):

- ``metrics.json``: held-out ``psnr`` / ``ssim`` / ``ms_ssim`` of the trained model and the same
  of the untrained one (``psnr_init``, ...), ``steps``, ``train_seconds``, the step time and the
  loss's share of it, the final number of Gaussians, and the loss configuration;
- ``checkpoints/last.ckpt`` (every ``callbacks.checkpoint.every_n_train_steps`` steps and at the end;
  ``resume=true`` continues from it, exactly);
- ``renders/{init,final}/<view>.png``: prediction | ground truth for the held-out views;
- ``point_cloud.ply``: the trained Gaussians (3DGS layout).

Everything a config can get wrong (an unknown loss, negative weights, a missing dataset, images
of different sizes, a missing checkpoint) stops with a ``ValueError`` before training starts.
"""

from __future__ import annotations

import glob
import json
import logging
import math
import os
import warnings
from typing import Any, Dict, List, Optional

import torch

from ._atomic import atomic_output

log = logging.getLogger(__name__)

__all__ = ["train", "main", "write_json_atomic", "check_config"]

# Loss config keys that are weights (PhotometricLoss terms and its presets' mixing factors).
_WEIGHT_KEYS = ("l1", "l2", "dssim", "msssim", "l1_gaussian", "alpha", "lambda_dssim")


def _config_dir() -> str:
    """The Hydra configs: ``splatloss/configs`` in an installed wheel (the repository's ``configs/``
    mapped into the package), else ``configs/`` beside the package in a source checkout."""
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, "configs"), os.path.join(here, os.pardir, "configs")):
        if os.path.isfile(os.path.join(candidate, "train.yaml")):
            return os.path.abspath(candidate)
    raise FileNotFoundError(
        f"the training configs (train.yaml) are neither in {os.path.join(here, 'configs')} (installed wheel) nor in "
        f"{os.path.abspath(os.path.join(here, os.pardir, 'configs'))} (source checkout); reinstall splatloss[train]"
    )


CONFIG_DIR = _config_dir()


def write_json_atomic(path: str, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` through a temporary file and ``os.replace``: a reader
    sees the old file or the whole new one, never a partial write."""
    with atomic_output(path) as tmp, open(tmp, "w") as f:
        json.dump(_finite(obj), f, indent=2, sort_keys=True, allow_nan=False)


def _finite(node):
    """Strict JSON: a non-finite float (no timed step, an undefined ratio) becomes null."""
    if isinstance(node, dict):
        return {k: _finite(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_finite(v) for v in node]
    if isinstance(node, float) and not math.isfinite(node):
        return None
    return node


def _numbers(node, prefix: str) -> List[tuple]:
    """(dotted path, value) of every number in a plain nested dict / list."""
    if isinstance(node, dict):
        return [x for k, v in node.items() for x in _numbers(v, f"{prefix}.{k}")]
    if isinstance(node, (list, tuple)):
        return [x for i, v in enumerate(node) for x in _numbers(v, f"{prefix}[{i}]")]
    if isinstance(node, (int, float)) and not isinstance(node, bool):
        return [(prefix, node)]
    return []


def check_config(cfg) -> None:
    """Checks that need no heavy object: raise ``ValueError`` naming the key, what was expected
    and what came. (Objects validate their own arguments too when they are built, still before
    training: :func:`train` builds everything first.)"""
    from omegaconf import DictConfig, OmegaConf

    for group in ("loss", "data", "model", "trainer"):
        if group not in cfg or not isinstance(cfg[group], DictConfig):
            raise ValueError(f"config group {group!r} is missing: expected e.g. {group}=<choice> in the defaults list")
    if "_target_" not in cfg.loss:
        raise ValueError(f"loss config must name a class with _target_, got keys {sorted(cfg.loss.keys())}")
    # Loss weights (a term's weight, a preset's mixing factor, anything under loss.weights) must be >= 0.
    for path, value in _numbers(OmegaConf.to_container(cfg.loss, resolve=True), "loss"):
        leaf = path.rsplit(".", 1)[-1]
        if (".weights." in path or leaf.endswith("weight") or leaf in _WEIGHT_KEYS) and not (
            value >= 0 and math.isfinite(value)
        ):
            raise ValueError(f"{path} must be a finite number >= 0, got {value}")
    data = cfg.data
    if "path" in list(data.keys()):  # ("in" is False for a "???" value)
        path = "???" if OmegaConf.is_missing(data, "path") else data.path
        if path is None or str(path).strip() == "" or str(path) == "???":
            raise ValueError(f"data.path must be set for data={data.get('kind', 'this dataset')}, got {path!r}")
        if not os.path.isdir(str(path)):
            raise ValueError(f"data.path {str(path)!r} does not exist or is not a directory")
    steps = cfg.trainer.get("max_steps", -1)
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"trainer.max_steps must be an integer >= 1, got {steps!r}")


def latest_checkpoint(output_dir: str) -> str:
    """``checkpoints/last.ckpt`` of the newest run folder (by the checkpoint's time) among the
    Hydra run folders beside ``output_dir`` (``outputs/<date>/<time>``), this one included."""
    run = os.path.abspath(output_dir)
    roots = {os.path.dirname(run), os.path.dirname(os.path.dirname(run))}
    found = set()
    for root in roots:
        for pattern in ("*/checkpoints/last.ckpt", "*/*/checkpoints/last.ckpt"):
            found.update(glob.glob(os.path.join(glob.escape(root), pattern)))
    if not found:
        raise ValueError(
            f"resume=latest found no run folder with checkpoints/last.ckpt under {sorted(roots)}; "
            "pass ckpt_path=<file.ckpt>, or run without resume"
        )
    return max(found, key=os.path.getmtime)


def _resolve_ckpt(cfg) -> Optional[str]:
    ckpt = cfg.get("ckpt_path")
    resume = cfg.get("resume", False)
    if isinstance(resume, str) and resume != "latest":
        raise ValueError(f"resume must be true, false or latest, got {resume!r}")
    if resume == "latest":
        if ckpt is not None:
            raise ValueError(f"resume=latest and ckpt_path={ckpt!r} both name a checkpoint; keep one of them")
        return latest_checkpoint(str(cfg.output_dir))
    if resume:
        last = os.path.join(cfg.output_dir, "checkpoints", "last.ckpt")
        if ckpt is None:
            if not os.path.isfile(last):
                raise ValueError(
                    f"resume=true but there is no checkpoint to resume from: expected {last!r}. "
                    "Resume in the interrupted run's folder (hydra.run.dir=<that folder>) or pass ckpt_path=<file>"
                )
            ckpt = last
    if ckpt is not None and not os.path.isfile(str(ckpt)):
        raise ValueError(f"ckpt_path {str(ckpt)!r} does not exist")
    return None if ckpt is None else str(ckpt)


def _validate(trainer, module, dm, evaluator, tag: str) -> Dict[str, float]:
    if evaluator is not None:
        evaluator.tag = tag
    try:
        res = trainer.validate(module, datamodule=dm, verbose=False)
    finally:
        if evaluator is not None:  # evaluations during training render to step_<n>/
            evaluator.tag = None
    row = res[0] if res else {}
    return {k.split("/", 1)[1]: float(v) for k, v in row.items() if k.startswith("val/")}


def train(cfg) -> Dict[str, Any]:
    """Build data, model, loss, callbacks and trainer from ``cfg``; fit; evaluate; write metrics.

    Returns:
        The metrics dict also written to ``<cfg.output_dir>/metrics.json``.
    """
    import lightning as L
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from .lightning import HeldOutMetrics, SceneDataModule, SplatModule, StopOnSignal, check_scene
    from .lightning.checkpoint_io import AtomicCheckpointIO

    check_config(cfg)
    # Checkpoints hold the state after each step's optimizer update, which is what resuming needs.
    warnings.filterwarnings("ignore", message=".*no pre-optimization state was saved.*")
    out_dir = os.path.abspath(str(cfg.output_dir))
    ckpt_path = _resolve_ckpt(cfg)
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)

    # Build every object first, so a bad config fails here and not after minutes of training.
    try:
        loss = instantiate(cfg.loss)
    except Exception as e:  # hydra wraps the constructor's error; keep its message visible
        raise ValueError(f"could not build the loss from loss={cfg.loss.get('_target_')}: {_root_message(e)}") from e
    try:
        scene = instantiate(cfg.data.scene)
    except Exception as e:
        raise ValueError(f"could not build the scene from data: {_root_message(e)}") from e
    check_scene(scene)
    gaussians = instantiate(cfg.model.gaussians, points=scene.points, colors=scene.colors)
    gaussians_init = gaussians.num
    strategy = None
    if cfg.model.get("strategy") is not None:
        strategy = instantiate(cfg.model.strategy, extent=float(scene.extent))
    background = cfg.model.get("background")
    if background is None:  # the colour the scene's images were composited on (Blender: white)
        background = [float(c) for c in getattr(scene, "background", (0.0, 0.0, 0.0))]
    lr = _plain(cfg.model.lr)
    if cfg.model.get("means_lr_times_extent", False):
        lr["means"] = float(lr["means"]) * float(scene.extent)
    module = SplatModule(
        gaussians=gaussians,
        loss=loss,
        lr=lr,
        means_lr_final_factor=float(cfg.model.means_lr_final_factor),
        lr_decay_steps=int(cfg.trainer.max_steps),
        strategy=strategy,
        render_backend=cfg.model.render_backend,
        render_options=_plain(cfg.model.get("render_options")),
        background=background,
        time_steps=bool(cfg.model.get("time_steps", True)),
    )
    dm = SceneDataModule(scene, seed=int(cfg.seed))
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    if not cfg.trainer.get("enable_progress_bar", True):
        # Lightning refuses a progress-bar callback beside enable_progress_bar=false.
        callbacks = [c for c in callbacks if not isinstance(c, L.pytorch.callbacks.ProgressBar)]
    evaluator = next((c for c in callbacks if isinstance(c, HeldOutMetrics)), None)
    if evaluator is not None and evaluator.dirpath is None:
        evaluator.dirpath = os.path.join(out_dir, "renders")
    stopper = StopOnSignal()
    callbacks.append(stopper)
    logger = instantiate(cfg.logger) if cfg.get("logger") else False
    trainer = instantiate(
        cfg.trainer, callbacks=callbacks, logger=logger, default_root_dir=out_dir, plugins=[AtomicCheckpointIO()]
    )

    if trainer.world_size > 1 and strategy is not None:
        raise ValueError(
            f"densification (model.strategy) cannot run with {trainer.world_size} processes: it replaces the "
            "parameter tensors, which DDP's gradient buckets cannot follow; set model.strategy=null "
            "(trainer=ddp does) or train on one device"
        )
    init = _validate(trainer, module, dm, evaluator, "init")
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    seconds = module.train_seconds()  # whole run (resumes included) and this process's fit
    train_seconds = seconds["total"]
    ckpt_cb = next((c for c in callbacks if isinstance(c, L.pytorch.callbacks.ModelCheckpoint)), None)
    ckpt_dir = ckpt_cb.dirpath if ckpt_cb is not None and ckpt_cb.dirpath else None
    if stopper.signal_name is not None and ckpt_dir is None:
        ckpt_dir = os.path.join(out_dir, "checkpoints")  # an interrupted run always leaves one to resume
    if ckpt_dir is not None:
        # The end of the run, whatever every_n_train_steps is: a later run can extend it.
        trainer.save_checkpoint(os.path.join(ckpt_dir, "last.ckpt"))
    final = _validate(trainer, module, dm, evaluator, "final")

    timing = module.timing()
    metrics: Dict[str, Any] = dict(final)
    metrics.update({f"{k}_init": v for k, v in init.items()})
    metrics.update(
        {
            "steps": int(trainer.global_step),
            "steps_this_run": int(trainer.global_step) - int(module.start_step),
            "interrupted": stopper.signal_name,
            "resumed_from": ckpt_path,
            "train_seconds": train_seconds,
            "train_seconds_this_run": seconds["this_run"],
            "step_seconds": timing["step_seconds"],
            "loss_seconds": timing["loss_seconds"],
            "loss_share": timing["loss_share"],
            "render_seconds": timing["render_seconds"],
            "render_backward_seconds": timing["backward_seconds"],
            "optim_seconds": timing["optim_seconds"],
            "timed_steps": timing["timed_steps"],
            "num_gaussians": int(module.gaussians.means.shape[0]),
            "num_gaussians_init": int(gaussians_init),
            "lr": module.lr,
            "ms_ssim_scales": (evaluator.last.get("ms_ssim_scales") if evaluator is not None else None),
            "image_size": list(scene.train[0].image.shape[:2]),
            "num_train_views": len(scene.train),
            "num_test_views": len(scene.test),
            "world_size": int(trainer.world_size),
            "seed": int(cfg.seed),
            "loss": OmegaConf.to_container(cfg.loss, resolve=True),
            "loss_name": cfg.get("loss_name"),
        }
    )
    if trainer.is_global_zero:
        write_json_atomic(os.path.join(out_dir, "metrics.json"), metrics)
        if stopper.signal_name is not None:
            print(
                f"Stopped by {stopper.signal_name} at step {metrics['steps']}; checkpoint "
                f"{os.path.join(ckpt_dir, 'last.ckpt')}. Resume with:\n  {resume_command(out_dir)}",
                flush=True,
            )
        if cfg.get("export_ply", True):
            module.gaussians.export_ply(os.path.join(out_dir, "point_cloud.ply"))
        log.info(
            "held-out PSNR %.2f dB (untrained %.2f dB), SSIM %.4f, MS-SSIM %.4f; %d steps in %.1f s, "
            "%.1f ms/step, loss %.1f%% of the step; wrote %s",
            metrics.get("psnr", float("nan")),
            metrics.get("psnr_init", float("nan")),
            metrics.get("ssim", float("nan")),
            metrics.get("ms_ssim", float("nan")),
            metrics["steps"],
            train_seconds,
            1000 * metrics["step_seconds"],
            100 * metrics["loss_share"],
            os.path.join(out_dir, "metrics.json"),
        )
    return metrics


def resume_command(out_dir: str) -> str:
    """The command line that continues the run in ``out_dir``: this process's program and Hydra
    overrides, with ``hydra.run.dir=<out_dir> resume=true``."""
    import shlex
    import sys

    overrides: List[str] = []
    try:
        from hydra.core.hydra_config import HydraConfig

        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:  # not under @hydra.main (train(cfg) called directly)
        pass
    keep = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in ("resume", "ckpt_path", "hydra.run.dir")]
    argv0 = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if argv0 == os.path.abspath(__file__):
        prog = ["python", "-m", "splatloss.train"]
    elif argv0.endswith(".py"):
        prog = ["python", sys.argv[0]]
    else:
        prog = [os.path.basename(argv0) or "splatloss-train"]
    return shlex.join(prog + keep + [f"hydra.run.dir={out_dir}", "resume=true"])


def _plain(node) -> dict:
    from omegaconf import OmegaConf

    return {} if node is None else OmegaConf.to_container(node, resolve=True)


def _root_message(e: BaseException) -> str:
    while e.__cause__ is not None:
        e = e.__cause__
    return f"{type(e).__name__}: {e}"


def _one_log_stream() -> None:
    """Route Lightning's messages through Hydra's logging only.

    Lightning attaches its own stderr handler to its loggers at import; Hydra's root handler prints
    the same records again (and writes the run's log file), so every Lightning line came out twice.
    """
    import lightning  # noqa: F401  (its import adds the handlers removed here)

    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        lg = logging.getLogger(name)
        for h in list(lg.handlers):
            if type(h) is logging.StreamHandler:
                lg.removeHandler(h)
        lg.propagate = True


def main() -> Optional[float]:
    """Hydra entry: ``splatloss-train [overrides]`` (or ``python -m splatloss.train``, ``python
    scripts/train.py``); returns ``cfg.optimized_metric``'s
    value (for the Optuna sweeper) when set."""
    import hydra

    @hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
    def _main(cfg) -> Optional[float]:
        _one_log_stream()
        if cfg.get("num_threads"):
            torch.set_num_threads(int(cfg.num_threads))
        metrics = train(cfg)
        key = cfg.get("optimized_metric")
        return None if not key else float(metrics[key])

    return _main()


if __name__ == "__main__":
    main()
