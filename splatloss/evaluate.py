"""Evaluate a trained run without training: ``splatloss-eval ckpt_path=RUN/checkpoints/last.ckpt``.

(``python scripts/eval.py ...`` and ``python -m splatloss.evaluate ...`` are the same command.) The
run's own configuration, kept by Hydra in ``RUN/.hydra/``, is recomposed: the same scene, model and
renderer are built, the checkpoint's Gaussians are loaded, and the held-out views are rendered and
measured by the same callback that measured them during training, so ``psnr`` equals the run's
``metrics.json``. Written to ``RUN/eval/`` (or ``output_dir=``):

- ``metrics.json``: ``psnr``, ``ssim``, ``ssim_3dgs``, ``ssim_skimage``, ``ms_ssim`` (and ``lpips``
  with ``metrics.lpips=true``), the number of views, the checkpoint and its step, and
  ``"record": "evaluation"``, by which ``splatloss-report`` counts it as part of the run it
  evaluated (its LPIPS in the run's row) rather than as a run;
- ``renders/<view>.png``: prediction | ground truth of every held-out view;
- ``traj.mp4`` or ``traj.gif`` with ``render_traj=true``: the scene along a smooth path through the
  training views (:mod:`splatloss.splat.trajectory`).

Everything is checked before anything is written: the checkpoint is readable and holds Gaussians
of the shapes the run's configuration builds, the run's configuration and dataset are there, the
LPIPS weights (when asked for) exist, and the output folder is writable. The options are in
``configs/eval.yaml``.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import Any, Dict, List, Optional

from .atomic import check_writable

log = logging.getLogger(__name__)

__all__ = ["evaluate", "find_run_dir", "load_run_config", "read_checkpoint", "check_checkpoint", "main"]

_USAGE = """usage: splatloss-eval ckpt_path=RUN/checkpoints/last.ckpt [key=value ...]

Renders the held-out views of a trained run with its checkpoint and writes metrics.json and renders
into RUN/eval/ (the run folder is the one holding .hydra/, found above the checkpoint).

keys (configs/eval.yaml):
  ckpt_path=FILE            the checkpoint (required)
  output_dir=DIR            where to write (default: RUN/eval)
  data_path=DIR             the dataset's folder, when it moved since training
  accelerator=cpu|gpu|auto  where to render (default: the run's trainer.accelerator)
  metrics.lpips=true        also LPIPS, from local weights: metrics.lpips_net=alex|vgg,
                            metrics.lpips_backbone=FILE metrics.lpips_linear=FILE (docs/splat.md)
  render_traj=true          also a video along a path through the training views (traj.mp4 or .gif)
  traj.n_frames=120 traj.fps=30 traj.n_keyframes=12

example: splatloss-eval ckpt_path=outputs/2026-01-01/12-00-00/checkpoints/last.ckpt render_traj=true
"""


def find_run_dir(ckpt_path: str) -> str:
    """The run folder of a checkpoint: the nearest folder above it that holds ``.hydra/config.yaml``."""
    folder = os.path.dirname(os.path.abspath(ckpt_path))
    for _ in range(4):
        if os.path.isfile(os.path.join(folder, ".hydra", "config.yaml")):
            return folder
        folder = os.path.dirname(folder)
    raise ValueError(
        f"no run configuration (.hydra/config.yaml) in the folders above the checkpoint {ckpt_path!r}; "
        "evaluate a checkpoint inside the run folder that wrote it (RUN/checkpoints/last.ckpt)"
    )


def load_run_config(run_dir: str, data_path: Optional[str] = None):
    """The configuration a run trained with, from ``run_dir/.hydra/``, resolved.

    ``${hydra:...}`` values are read from the run's own ``hydra.yaml`` (its choices, its folder),
    ``output_dir`` becomes ``run_dir`` (where the folder is now), and a relative ``data.path`` is
    taken from the folder training started in; ``data_path`` replaces it.
    """
    from omegaconf import OmegaConf, open_dict

    cfg_file = os.path.join(run_dir, ".hydra", "config.yaml")
    hydra_file = os.path.join(run_dir, ".hydra", "hydra.yaml")
    try:
        with open(cfg_file) as f:
            text = re.sub(r"\$\{hydra:([^}]*)\}", r"${hydra_runtime_.\1}", f.read())
        cfg = OmegaConf.create(text)
        runtime = OmegaConf.load(hydra_file).hydra.runtime if os.path.isfile(hydra_file) else {}
    except Exception as e:
        raise ValueError(f"the run configuration {cfg_file!r} cannot be read: {type(e).__name__}: {e}") from None
    with open_dict(cfg):
        cfg.hydra_runtime_ = {"runtime": OmegaConf.to_container(OmegaConf.create(runtime), resolve=False)}
        cfg.hydra_runtime_.runtime.output_dir = run_dir
        cfg.output_dir = run_dir
        try:
            # data.path first: the scene's own path is an interpolation of it (${..path}), resolved after.
            if "path" in cfg.data:
                cwd = cfg.hydra_runtime_.runtime.get("cwd") or os.getcwd()
                if data_path is not None:
                    cfg.data.path = os.path.abspath(str(data_path))
                elif cfg.data.path is not None and not os.path.isabs(str(cfg.data.path)):
                    cfg.data.path = os.path.join(cwd, str(cfg.data.path))
            OmegaConf.resolve(cfg)
        except Exception as e:
            raise ValueError(f"the run configuration {cfg_file!r} cannot be resolved: {e}") from None
        del cfg["hydra_runtime_"]
    if "path" in cfg.data:
        if not os.path.isdir(str(cfg.data.path)):
            raise ValueError(
                f"the run's dataset {str(cfg.data.path)!r} (data.path in {cfg_file!r}) does not exist; "
                "pass data_path=<its folder now>"
            )
    elif data_path is not None:
        raise ValueError(f"data_path={data_path!r} given, but the run trained on data={cfg.data.get('kind')!r}")
    return cfg


def read_checkpoint(ckpt_path: str) -> Dict[str, Any]:
    """The checkpoint as a dict, or a ``ValueError`` naming the file when it is missing, truncated
    or not a splatloss checkpoint."""
    import torch

    from .lightning.checkpoint_io import require_file

    require_file(ckpt_path, "ckpt_path")
    try:
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    except Exception as e:
        raise ValueError(
            f"the checkpoint {ckpt_path!r} cannot be read ({type(e).__name__}: {e}); it is truncated or not a "
            "checkpoint file"
        ) from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        raise ValueError(f"the checkpoint {ckpt_path!r} holds no state_dict: not a Lightning checkpoint")
    if "gaussians.means" not in ckpt["state_dict"]:
        raise ValueError(
            f"the checkpoint {ckpt_path!r} holds no Gaussians (no gaussians.means in its state_dict): not a "
            "splatloss training checkpoint"
        )
    return ckpt


def check_checkpoint(module, ckpt: Dict[str, Any], ckpt_path: str) -> None:
    """The checkpoint's Gaussians fit the module the run's configuration builds: the same parameter
    names (an SH degree other than the configuration's shows here) and per-Gaussian shapes."""
    sd = ckpt["state_dict"]
    have = {k: tuple(v.shape) for k, v in sd.items() if k.startswith("gaussians.")}
    want = {f"gaussians.{k}": tuple(getattr(module.gaussians, k).shape) for k in module.gaussians.param_names}
    differ = sorted(k for k in set(have) | set(want) if k not in have or k not in want or have[k][1:] != want[k][1:])
    if differ:
        show = "; ".join(
            f"{k}: checkpoint {have.get(k, 'absent')}, configuration {want.get(k, 'absent')}" for k in differ
        )
        raise ValueError(
            f"the checkpoint {ckpt_path!r} does not fit the run's configuration ({show}); was it written by "
            f"another run (e.g. another model.sh_degree)?"
        )


def evaluate(cfg) -> Dict[str, Any]:
    """Evaluate ``cfg.ckpt_path`` (an ``eval.yaml`` configuration); returns the metrics written to
    ``<output_dir>/metrics.json``."""
    import lightning as L
    import torch
    from hydra.utils import instantiate

    from .lightning import HeldOutMetrics, SceneDataModule, check_scene, runs

    if cfg.get("ckpt_path") in (None, "", "???"):
        raise ValueError("ckpt_path must name a checkpoint, e.g. ckpt_path=outputs/<date>/<time>/checkpoints/last.ckpt")
    _quiet_lightning()
    ckpt_path = os.path.abspath(str(cfg.ckpt_path))
    ckpt = read_checkpoint(ckpt_path)
    run_dir = find_run_dir(ckpt_path)
    run_cfg = load_run_config(run_dir, cfg.get("data_path"))
    out_dir = os.path.abspath(str(cfg.output_dir)) if cfg.get("output_dir") else os.path.join(run_dir, "eval")
    if os.path.realpath(out_dir) == os.path.realpath(run_dir):
        raise ValueError(
            f"output_dir={cfg.output_dir!r} is the run folder itself: its metrics.json is the run's, which the "
            "evaluation would replace; leave output_dir unset (RUN/eval) or give another folder"
        )
    metric_cfg = cfg.get("metrics") or {}
    lpips_net = None
    if metric_cfg.get("lpips", False):
        from .splat.lpips import LPIPS

        lpips_net = LPIPS.from_files(
            metric_cfg.get("lpips_net", "alex"), metric_cfg.get("lpips_backbone"), metric_cfg.get("lpips_linear")
        )

    def build(what, node, **kwargs):
        try:
            return instantiate(node, **kwargs)
        except Exception as e:
            raise ValueError(f"could not build the {what} of the run {run_dir!r}: {runs.root_message(e)}") from None

    accelerator = str(cfg.get("accelerator") or run_cfg.trainer.get("accelerator", "auto"))
    if accelerator.lower() in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ValueError(
            f"accelerator={accelerator} (the run's trainer.accelerator unless given) asks for a CUDA GPU, but torch "
            "sees none here; evaluate on the CPU with accelerator=cpu"
        )
    loss = build("loss", run_cfg.loss)
    scene = build("scene", run_cfg.data.scene)
    check_scene(scene)
    module = build("model", run_cfg.model, loss=loss)
    module.bind_scene(scene)
    check_checkpoint(module, ckpt, ckpt_path)
    traj = dict(cfg.get("traj") or {}) if cfg.get("render_traj", False) else None
    if traj is not None:  # its options checked now, not after the renders are written
        from .splat.trajectory import camera_path

        traj = {
            "n_frames": traj.get("n_frames", 120),
            "fps": traj.get("fps", 30),
            "n_keyframes": traj.get("n_keyframes", 12),
        }
        fps = traj["fps"]
        if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps < float("inf"):
            raise ValueError(f"traj.fps must be a number > 0, got {fps!r}")
        camera_path(scene.train, n_frames=traj["n_frames"], n_keyframes=traj["n_keyframes"])
    check_writable({"evaluation (metrics.json, renders)": out_dir}, instead="another output_dir=<folder>")

    module.on_load_checkpoint(ckpt)
    module.load_state_dict(ckpt["state_dict"])
    evaluator = HeldOutMetrics(save_renders=True, dirpath=out_dir, max_renders=len(scene.test), log_images=False)
    evaluator.tag = "renders"
    trainer = L.Trainer(
        accelerator=accelerator, devices=1, logger=False,
        callbacks=[evaluator], enable_progress_bar=False, enable_model_summary=False, default_root_dir=out_dir,
    )  # fmt: skip
    res = trainer.validate(module, datamodule=SceneDataModule(scene, seed=int(run_cfg.seed)), verbose=False)
    metrics: Dict[str, Any] = {k.split("/", 1)[1]: float(v) for k, v in (res[0] if res else {}).items()}
    metrics.update(
        {
            "record": "evaluation",
            "ms_ssim_scales": evaluator.last.get("ms_ssim_scales"),
            "num_views": len(scene.test),
            "num_gaussians": int(module.gaussians.means.shape[0]),
            "checkpoint": ckpt_path,
            "step": int(ckpt.get("global_step", 0)),
            "run_dir": run_dir,
            "output_dir": out_dir,
        }
    )
    if lpips_net is not None:
        metrics["lpips"] = _lpips(module, scene, lpips_net)
        metrics["lpips_net"] = lpips_net.net
    if traj is not None:
        from .splat.trajectory import render_trajectory

        metrics["trajectory"] = render_trajectory(
            module.render_view, scene.train, os.path.join(out_dir, "traj"), **traj
        )
    runs.write_json_atomic(os.path.join(out_dir, "metrics.json"), metrics)
    return metrics


def _lpips(module, scene, net) -> float:
    """Mean LPIPS over the held-out views: the prediction clamped to [0, 1], as the other metrics."""
    import torch

    device = module.gaussians.means.device
    net = net.to(device)
    scores = []
    with torch.no_grad():
        for v in scene.test:
            pred = module.render_view(v)["image"].clamp(0, 1).permute(2, 0, 1)[None]
            target = v.image.to(device).permute(2, 0, 1)[None]
            scores.append(float(net(pred, target)))
    return sum(scores) / len(scores)


def _drop_noise(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(("💡 Tip", "GPU available", "TPU available", "HPU available"))


def _quiet_lightning() -> None:
    """Lightning's start-up lines (accelerator, cloud-logger tips) say nothing about an evaluation;
    torch 2.13 deprecates a check Lightning's batch mover still makes (lightning 2.6.6)."""
    import warnings

    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if _drop_noise not in rank_zero.filters:
        rank_zero.addFilter(_drop_noise)
    warnings.filterwarnings(
        "ignore", message=r".*isinstance\(treespec, LeafSpec\)", module=r"lightning\.pytorch\.utilities\._pytree"
    )


def compose_config(overrides: List[str]):
    """``configs/eval.yaml`` with command-line ``key=value`` overrides (Hydra's grammar)."""
    from hydra import compose, initialize_config_dir

    from .train import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name="eval", overrides=list(overrides))


def main(argv: Optional[List[str]] = None) -> None:
    """``splatloss-eval [key=value ...]``: one line per error and exit code 2 for a bad command.

    Returns None (a console script passes the return value to ``sys.exit``); :func:`evaluate`
    returns the metrics."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(_USAGE)
        sys.exit(0)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        cfg = compose_config(argv)
        metrics = evaluate(cfg)
    except Exception as e:
        from hydra.errors import HydraException

        if not isinstance(e, (ValueError, HydraException)):
            raise
        print(f"splatloss-eval: error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    nan = float("nan")
    print(
        f"held-out PSNR {metrics.get('psnr', nan):.2f} dB, SSIM {metrics.get('ssim', nan):.4f} "
        f"(3DGS's {metrics.get('ssim_3dgs', nan):.4f}), MS-SSIM {metrics.get('ms_ssim', nan):.4f}"
        + (f" ({metrics['ms_ssim_scales']} scales)" if metrics.get("ms_ssim_scales") else "")
        + (f", LPIPS ({metrics['lpips_net']}) {metrics['lpips']:.4f}" if "lpips" in metrics else "")
        + f" over {metrics['num_views']} views at step {metrics['step']}; wrote {metrics['output_dir']}",
        flush=True,
    )
    if "trajectory" in metrics:
        print(f"trajectory video: {metrics['trajectory']}", flush=True)


if __name__ == "__main__":
    main()
