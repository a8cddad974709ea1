"""The pieces of a training run around ``trainer.fit``: config checks, checkpoint resolution,
the dry call of the loss, the metrics record, the resume command.

:func:`splatloss.train.train` strings them together; each is usable alone (a custom entry point,
a notebook). Everything that can be wrong in a config is found here, before anything is trained
or written, and reported as one ``ValueError`` that names the key, the value given and the fix.
"""

from __future__ import annotations

import glob
import json
import math
import os
import shlex
import sys
from typing import Any, Dict, List, Optional

import torch

from .._atomic import atomic_output

__all__ = [
    "check_config",
    "check_device",
    "check_loss_on_views",
    "latest_checkpoint",
    "resolve_checkpoint",
    "resume_command",
    "root_message",
    "run_metrics",
    "write_json_atomic",
]

# Loss config keys that are weights (PhotometricLoss terms and its presets' mixing factors).
_WEIGHT_KEYS = ("l1", "l2", "dssim", "msssim", "l1_gaussian", "s3im", "alpha", "lambda_dssim")


def write_json_atomic(path: str, obj: Any) -> None:
    """Write ``obj`` as strict JSON to ``path`` through a temporary file and ``os.replace``: a
    reader sees the old file or the whole new one, never a partial write; a non-finite float
    (no timed step, an undefined ratio) is written as ``null``."""
    with atomic_output(path) as tmp, open(tmp, "w") as f:
        json.dump(_finite(obj), f, indent=2, sort_keys=True, allow_nan=False)


def _finite(node):
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


def root_message(e: BaseException) -> str:
    """The innermost cause's type and message (Hydra wraps a constructor's error in its own)."""
    while e.__cause__ is not None:
        e = e.__cause__
    return f"{type(e).__name__}: {e}"


def check_config(cfg) -> None:
    """Checks that need no heavy object: raise ``ValueError`` naming the key, what was expected
    and what came. (Objects validate their own arguments when they are built, still before
    training.)"""
    from omegaconf import DictConfig, OmegaConf

    for group in ("loss", "data", "model", "trainer"):
        if group not in cfg or not isinstance(cfg[group], DictConfig):
            raise ValueError(f"config group {group!r} is missing: expected e.g. {group}=<choice> in the defaults list")
    for group in ("loss", "model"):
        if "_target_" not in cfg[group]:
            raise ValueError(f"{group} config must name a class with _target_, got keys {sorted(cfg[group].keys())}")
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
    every = cfg.get("eval_every_n_steps")
    if every is not None and (not isinstance(every, int) or isinstance(every, bool) or every < 1):
        raise ValueError(f"eval_every_n_steps must be null or an integer >= 1, got {every!r}")
    check_device(cfg.trainer)


def check_device(trainer_cfg) -> None:
    """A trainer that asks for a GPU on a machine without one stops here, naming the configs that
    train on this machine (Lightning's own message comes later and names neither)."""
    accelerator = str(trainer_cfg.get("accelerator", "auto")).lower()
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ValueError(
            f"trainer.accelerator={accelerator} asks for a CUDA GPU, but torch sees none "
            f"(torch {torch.__version__}, torch.cuda.is_available() is False); train on this machine with "
            "trainer=default (a GPU when present, else the CPU) or trainer=cpu"
        )
    if accelerator == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"trainer.accelerator={accelerator} but MPS is not available; use trainer=default")


def check_loss_on_views(loss, height: int, width: int, device, *, masked: bool = False, loss_cfg=None) -> None:
    """One dry forward and backward of ``loss`` on a ``(1, 3, height, width)`` pair on ``device``,
    the shape and device of the training views: a loss that cannot run on this data (an image too
    small for its window or scales, a backend that cannot run on the device) fails here, before
    anything is trained or written, with one message naming the loss config."""
    g = torch.Generator().manual_seed(0)
    pred = torch.rand(1, 3, height, width, generator=g).to(device).requires_grad_(True)
    target = torch.rand(1, 3, height, width, generator=g).to(device)
    kwargs = {"mask": torch.ones(1, 1, height, width, device=device)} if masked else {}
    try:
        # Its own random stream: a loss that draws numbers (S3IM's permutations) leaves the run's as seeded.
        with torch.random.fork_rng(devices=[device] if torch.device(device).type == "cuda" else []):
            value = loss(pred, target, **kwargs)
            value.backward()
    except (ValueError, TypeError, RuntimeError, ImportError, NotImplementedError) as e:
        given = ""
        if loss_cfg is not None:
            from omegaconf import OmegaConf

            items = OmegaConf.to_container(loss_cfg, resolve=True)
            given = " " + ", ".join(f"loss.{k}={v}" for k, v in items.items() if not str(k).startswith("_"))
            given = f" (from{given})" if given.strip() else ""
        raise ValueError(
            f"the loss{given} cannot run on this data's {height}x{width} views on {device}: {root_message(e)}"
        ) from None
    if not torch.isfinite(value.detach()).all():
        raise ValueError(f"the loss gives {float(value)} on random {height}x{width} images on {device}")


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


def resolve_checkpoint(cfg) -> Optional[str]:
    """The checkpoint a run continues from (``ckpt_path``, ``resume=true`` or ``resume=latest``),
    or ``None`` for a fresh run; a checkpoint asked for and absent is a ``ValueError``."""
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


def resume_command(out_dir: str) -> str:
    """The command line that continues the run in ``out_dir``: this process's program and Hydra
    overrides, with ``hydra.run.dir=<out_dir> resume=true``."""
    overrides: List[str] = []
    try:
        from hydra.core.hydra_config import HydraConfig

        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:  # not under @hydra.main (train(cfg) called directly)
        pass
    keep = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in ("resume", "ckpt_path", "hydra.run.dir")]
    argv0 = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    module_file = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "train.py")
    if argv0 == module_file:
        prog = ["python", "-m", "splatloss.train"]
    elif argv0.endswith(".py"):
        prog = ["python", sys.argv[0]]
    else:
        prog = [os.path.basename(argv0) or "splatloss-train"]
    return shlex.join(prog + keep + [f"hydra.run.dir={out_dir}", "resume=true"])


def run_metrics(
    cfg, trainer, module, scene, *, init: Dict[str, float], final: Dict[str, float], **extra
) -> Dict[str, Any]:
    """The record of a run written to ``metrics.json``: the held-out metrics of the trained model
    (``psnr``, ``ssim``, ...) and of the untrained one (``psnr_init``, ...), the whole run's steps
    and seconds (resumes included) beside this process's, the step time and the loss's share of
    it, the Gaussians, the data and the loss configuration; ``extra`` is added as given."""
    from omegaconf import OmegaConf

    seconds = module.train_seconds()
    timing = module.timing()
    metrics: Dict[str, Any] = dict(final)
    metrics.update({f"{k}_init": v for k, v in init.items()})
    metrics.update(
        {
            "steps": int(trainer.global_step),
            "steps_this_run": int(trainer.global_step) - int(module.start_step),
            "train_seconds": seconds["total"],
            "train_seconds_this_run": seconds["this_run"],
            "step_seconds": timing["step_seconds"],
            "loss_seconds": timing["loss_seconds"],
            "loss_share": timing["loss_share"],
            "render_seconds": timing["render_seconds"],
            "render_backward_seconds": timing["backward_seconds"],
            "optim_seconds": timing["optim_seconds"],
            "timed_steps": timing["timed_steps"],
            "num_gaussians": int(module.gaussians.means.shape[0]),
            "lr": module.lr,
            "image_size": list(scene.train[0].image.shape[:2]),
            "num_train_views": len(scene.train),
            "num_test_views": len(scene.test),
            "world_size": int(trainer.world_size),
            "seed": int(cfg.seed),
            "loss": OmegaConf.to_container(cfg.loss, resolve=True),
            "loss_name": cfg.get("loss_name"),
        }
    )
    metrics.update(extra)
    return metrics
