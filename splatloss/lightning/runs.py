"""The pieces of a training run around ``trainer.fit``: config checks, checkpoint resolution and
the resume checks, the output checks, the dry call of the loss, the logs a resume continues, the
metrics record, the resume command.

:func:`splatloss.train.train` strings them together; each is usable alone (a custom entry point,
a notebook). Everything that can be wrong in a config is found here, before anything is trained
or written, and reported as one ``ValueError`` that names the key, the value given and the fix.
"""

from __future__ import annotations

import csv
import glob
import json
import math
import os
import re
import shlex
import shutil
import socket
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from ..atomic import atomic_output, check_writable
from .checkpoint_io import require_file

__all__ = [
    "RESUME_KEYS",
    "RESUME_FREE",
    "OutputNotWritten",
    "ResumableCSVLogger",
    "RunRecord",
    "RunFolderLock",
    "check_config",
    "check_fresh_run_folder",
    "check_resume_config",
    "check_writable",
    "hydra_value",
    "config_changes",
    "logger_resume_kwargs",
    "run_folder_of",
    "run_identity",
    "rescue_folders",
    "write_or_rescue",
    "check_device",
    "check_loss_on_views",
    "latest_checkpoint",
    "resolve_checkpoint",
    "resume_command",
    "sweep_folder",
    "sweep_resume_command",
    "finished_metrics",
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
    seed = cfg.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an integer from 0 to {2**32 - 1} (numpy's seed range), got {seed!r}")
    steps = cfg.trainer.get("max_steps", -1)
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"trainer.max_steps must be an integer >= 1, got {steps!r}")
    every = cfg.get("eval_every_n_steps")
    if every is not None and (not isinstance(every, int) or isinstance(every, bool) or every < 1):
        raise ValueError(f"eval_every_n_steps must be null or an integer >= 1, got {every!r}")
    if every is not None and every > steps:
        raise ValueError(
            f"eval_every_n_steps={every} is more than trainer.max_steps={steps}, so no evaluation would run during "
            "training; use a smaller value, or eval_every_n_steps=null (the run is evaluated before and after anyway)"
        )
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


def resolve_checkpoint(cfg, missing_ok: bool = False) -> Optional[str]:
    """The checkpoint a run continues from (``ckpt_path``, ``resume=true`` or ``resume=latest``),
    or ``None`` for a fresh run; a checkpoint asked for and absent is a ``ValueError``, except
    that with ``missing_ok`` (a resumed sweep's run that never started) ``resume=true`` without
    ``checkpoints/last.ckpt`` starts the run."""
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
            if not os.path.isfile(last) and missing_ok:
                return None
            if not os.path.isfile(last):
                raise ValueError(
                    f"resume=true but there is no checkpoint to resume from: expected {last!r}. "
                    "Resume in the interrupted run's folder (hydra.run.dir=<that folder>) or pass ckpt_path=<file>"
                )
            ckpt = last
    return None if ckpt is None else require_file(str(ckpt), "ckpt_path")


def hydra_value(value: str) -> str:
    """``value`` as a Hydra override value, quoted where Hydra's grammar would read it otherwise
    (spaces, commas, brackets, quotes in a path).

    Examples:
        >>> hydra_value("outputs/2026-01-02/11-00-00"), hydra_value("/data/my run")
        ('outputs/2026-01-02/11-00-00', "'/data/my run'")
    """
    if re.fullmatch(r"[\w./:~+-]+", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def resume_command(out_dir: str, resume: bool = True) -> str:
    """The command line that continues the run in ``out_dir``: the interpreter or console script
    that started this process (``sys.executable``, never a bare ``python`` that may lack the
    packages), its Hydra overrides, and ``hydra.run.dir=<out_dir> resume=true`` (without
    ``resume=true`` when ``resume`` is false: the run starts again in its folder)."""
    overrides: List[str] = []
    try:
        from hydra.core.hydra_config import HydraConfig

        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:  # not under @hydra.main (train(cfg) called directly)
        pass
    drop = ("resume", "ckpt_path", "hydra.run.dir")
    keep = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in drop]
    tail = [f"hydra.run.dir={hydra_value(os.path.abspath(out_dir))}"] + (["resume=true"] if resume else [])
    return shlex.join(_program() + keep + tail)


def _program() -> List[str]:
    """How this process was started: ``python <script>``, ``python -m splatloss.train`` or the
    console script (by name when the shell finds this very file by it)."""
    argv0 = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    module_file = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "train.py")
    python = sys.executable or "python"
    if argv0 == module_file:
        prog = [python, "-m", "splatloss.train"]
    elif argv0.endswith(".py"):
        prog = [python, argv0]
    elif argv0 and os.path.isfile(argv0):
        # A console script: its name when the shell finds this very file by it, else its path.
        name = os.path.basename(argv0)
        found = shutil.which(name)
        prog = [name if found and os.path.samefile(found, argv0) else argv0]
    else:
        prog = [python, "-m", "splatloss.train"]
    return prog


def sweep_folder() -> Optional[str]:
    """The sweep folder (``hydra.sweep.dir``) of the run this process is in, or ``None`` outside a
    Hydra multirun (a single run, ``train(cfg)`` called directly)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
    except (ImportError, ValueError):
        return None
    return os.path.abspath(str(hc.sweep.dir)) if hc.mode == RunMode.MULTIRUN else None


def sweep_resume_command(sweep_dir: str) -> str:
    """The command that resumes the sweep in ``sweep_dir``: the sweep's own arguments as Hydra
    recorded them at its start (``multirun.yaml``, whatever launcher ran the runs), ``-m``, and
    ``hydra.sweep.dir=<sweep_dir> resume=true``. Each run of the sweep then keeps its folder (the
    same job number): a finished one is kept, an interrupted one continues from its checkpoint,
    one that never started starts."""
    from omegaconf import OmegaConf

    recorded = OmegaConf.load(os.path.join(sweep_dir, "multirun.yaml")).hydra.overrides
    drop = ("resume", "ckpt_path", "hydra.sweep.dir", "hydra.mode")
    keep = [str(o) for o in [*recorded.hydra, *recorded.task] if str(o).split("=", 1)[0].lstrip("+~") not in drop]
    return shlex.join([*_program(), "-m", *keep, f"hydra.sweep.dir={hydra_value(sweep_dir)}", "resume=true"])


def finished_metrics(out_dir: str, checkpoint: Dict[str, Any], max_steps: int) -> Optional[Dict[str, Any]]:
    """The ``metrics.json`` of the finished run in ``out_dir`` whose last checkpoint is ``checkpoint``,
    or ``None`` when the run is not finished there (interrupted, shorter than ``max_steps``, no
    record of that checkpoint's step)."""
    path = os.path.join(out_dir, "metrics.json")
    try:
        with open(path) as f:
            metrics = json.load(f)
    except (OSError, ValueError):
        return None
    step = int(checkpoint.get("global_step", -1))
    if not isinstance(metrics, dict) or metrics.get("interrupted") or metrics.get("steps") != step:
        return None
    return metrics if step >= max_steps else None


def run_metrics(
    cfg, trainer, module, scene, *, init: Dict[str, float], final: Dict[str, float], **extra
) -> Dict[str, Any]:
    """The record of a run written to ``metrics.json``: the held-out metrics of the trained model
    (``psnr``, ``ssim``, ...) and of the untrained one (``psnr_init``, ...), the whole run's steps
    and seconds (resumes included) beside this process's, the step time and the loss's share of
    it (``step_seconds``: the median step), the Gaussians, the data and the loss configuration;
    ``extra`` is added as given."""
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
            "step_mean_seconds": timing["step_mean_seconds"],
            "loss_seconds": timing["loss_seconds"],
            "loss_share": timing["loss_share"],
            "render_seconds": timing["render_seconds"],
            "render_backward_seconds": timing["backward_seconds"],
            "optim_seconds": timing["optim_seconds"],
            "timed_steps": timing["timed_steps"],
            # true: the run was too short to leave out its first steps, whose one-off costs its step time includes
            "timing_includes_warmup": timing["includes_warmup"],
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


# -- resuming: the same run, or a refusal -------------------------------------------------------------

# What makes a run the same run: a checkpoint continues only under these (as written, before
# interpolation: lr_decay_steps follows trainer.max_steps, which a resume may raise).
RESUME_KEYS = ("seed", "data", "model", "loss")
# ... except what only changes what is measured or shown, not what is trained.
RESUME_FREE = ("model.time_steps", "model.step_ms_window")


def run_folder_of(ckpt_path: str) -> Optional[str]:
    """The run folder of ``<run>/checkpoints/<file>.ckpt``, or ``None`` for a checkpoint elsewhere."""
    folder = os.path.dirname(os.path.abspath(ckpt_path))
    return os.path.dirname(folder) if os.path.basename(folder) == "checkpoints" else None


def run_identity(cfg) -> Dict[str, Any]:
    """What :func:`check_resume_config` compares: the :data:`RESUME_KEYS` of ``cfg``, uninterpolated."""
    from omegaconf import OmegaConf

    out = {}
    for k in RESUME_KEYS:
        node = cfg.get(k)
        out[k] = OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else node
    return out


def _flatten(node, prefix: str = "") -> Dict[str, Any]:
    if isinstance(node, dict):
        out: Dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out if out or not prefix else {prefix: {}}
    return {prefix: node}


def config_changes(saved: Dict[str, Any], current: Dict[str, Any]) -> List[str]:
    """``"<key>: <saved> -> <current>"`` for every dotted key whose value differs (``<absent>`` where
    one side lacks it), in key order."""
    a, b = _flatten(saved), _flatten(current)
    absent = "<absent>"
    keys = sorted(k for k in set(a) | set(b) if a.get(k, absent) != b.get(k, absent))
    return [f"{k}: {a.get(k, absent)} -> {b.get(k, absent)}" for k in keys]


class RunRecord(L.Callback):
    """Writes what identifies the run into every checkpoint (``checkpoint["splatloss_run"]``): the
    configuration of :data:`RESUME_KEYS` as written (``config``) and the untrained model's held-out
    metrics (``init``), so that a resume can check it continues the same run and need not evaluate
    (and log) the untrained model again."""

    KEY = "splatloss_run"

    def __init__(self, config: Dict[str, Any], init: Optional[Dict[str, float]] = None):
        self.config = config
        self.init = init

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: Dict[str, Any]) -> None:
        checkpoint[self.KEY] = {"config": self.config, "init": self.init}


def check_resume_config(cfg, checkpoint: Dict[str, Any], path: str) -> List[str]:
    """Refuse to continue ``checkpoint`` under another loss, scene, model or seed.

    Returns the differences (empty: the same run). With ``cfg.resume_allow_changes`` true they are
    returned for the caller to report instead of refused.

    Raises:
        ValueError: naming the checkpoint and every key that differs (checkpoint -> now), or saying
            that the checkpoint records no configuration to compare with.
    """
    allow = bool(cfg.get("resume_allow_changes", False))
    record = checkpoint.get(RunRecord.KEY) or {}
    saved = record.get("config")
    if saved is None:
        if allow:
            return ["the checkpoint records no configuration"]
        raise ValueError(
            f"checkpoint {path!r} records no run configuration (written by another program): splatloss cannot "
            f"check that it was trained with this {', '.join(RESUME_KEYS)}; pass resume_allow_changes=true to "
            "continue it anyway"
        )
    changes = [c for c in config_changes(saved, run_identity(cfg)) if c.split(":", 1)[0] not in RESUME_FREE]
    if changes and not allow:
        raise ValueError(
            f"checkpoint {path!r} was trained with another configuration; these keys differ (checkpoint -> now): "
            f"{'; '.join(changes)}. Resume with the run's own settings, start a fresh run, or pass "
            "resume_allow_changes=true to continue it under the new ones"
        )
    return changes


def check_fresh_run_folder(out_dir: str, ckpt_dir: Optional[str]) -> None:
    """A fresh run (no resume) refuses a folder that already holds a trained model: it would
    overwrite its checkpoint and ``point_cloud.ply``.

    Raises:
        ValueError: naming the files found and the ways on.
    """
    found = []
    if ckpt_dir is not None and os.path.isdir(ckpt_dir):
        found += sorted(glob.glob(os.path.join(glob.escape(ckpt_dir), "*.ckpt")))
    ply = os.path.join(out_dir, "point_cloud.ply")
    if os.path.isfile(ply):
        found.append(ply)
    if found:
        raise ValueError(
            f"the run folder {out_dir!r} already holds a trained run ({', '.join(found)}); a fresh run there would "
            "overwrite it. Continue that run with resume=true, start in another folder (hydra.run.dir=<new folder>), "
            "or move those files away first"
        )


class RunFolderLock:
    """Holds a run folder for one run at a time: an operating-system lock on ``<folder>/.splatloss-run.lock``
    (the ``filelock`` package: ``fcntl.flock`` / ``msvcrt.locking``), released by :meth:`release` or
    when the process ends however it ends, so a crashed run leaves no stale lock. The file records
    who holds it, for the refusal's message.

    Raises:
        ValueError: from :meth:`acquire` when another run holds the folder, naming it and its holder.
    """

    NAME = ".splatloss-run.lock"

    def __init__(self, folder: str):
        from filelock import FileLock

        self.folder = os.path.abspath(folder)
        self.path = os.path.join(self.folder, self.NAME)
        self._lock = FileLock(self.path, timeout=0, thread_local=False)

    def acquire(self) -> "RunFolderLock":
        from filelock import Timeout

        os.makedirs(self.folder, exist_ok=True)
        try:
            self._lock.acquire()
        except Timeout:
            try:
                with open(self.path) as f:
                    holder = f.read().strip() or "its process did not say who it is"
            except OSError:
                holder = "unknown process"
            raise ValueError(
                f"the run folder {self.folder!r} is in use by another run ({holder}); two runs in one folder would "
                "mix their checkpoints, logs and metrics. Wait for it to finish, or start in another folder "
                "(hydra.run.dir=<new folder>)"
            ) from None
        with open(self.path, "w") as f:  # the lock is on the file, not its content
            command = " ".join([os.path.basename(sys.argv[0] or "python"), *sys.argv[1:]])
            f.write(f"process {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}: ")
            f.write(command)
        return self

    def release(self) -> None:
        if self._lock.is_locked:
            with open(self.path, "w"):  # the next holder writes its own line
                pass
            self._lock.release()


class OutputNotWritten(OSError):
    """Files of a finished run that could not be written where asked; each was written elsewhere
    (:attr:`rescued`: ``[(wanted, written, reason)]``)."""

    def __init__(self, rescued: List[tuple]):
        self.rescued = rescued
        lines = [f"{wanted} could not be written ({why}); it is in {got}" for wanted, got, why in rescued]
        super().__init__("; ".join(lines))


def rescue_folders(preferred: Optional[str] = None) -> List[str]:
    """Where :func:`write_or_rescue` puts what it could not write: ``preferred`` (the ``rescue_dir``
    setting), else ``~/splatloss-rescue`` then the system's temporary folder, each in a subfolder
    named after the time and the process."""
    stamp = f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_{os.getpid()}"
    roots = [preferred] if preferred else [os.path.expanduser("~/splatloss-rescue"), tempfile.gettempdir()]
    tmp = tempfile.gettempdir()
    return [os.path.join(r, f"splatloss-rescue-{stamp}" if r == tmp else stamp) for r in roots]


def write_or_rescue(path: str, write: Callable[[str], None], rescued: List[tuple], folders: List[str]):
    """``write(path)``; where that fails with an ``OSError``, ``write`` into the first of ``folders``
    that takes it (:func:`rescue_folders`) and append ``(path, written, reason)`` to ``rescued``."""
    try:
        write(path)
        return path
    except OSError as e:
        reason = f"{type(e).__name__}: {e}"
    for folder in folders:
        alt = os.path.join(folder, os.path.basename(path))
        try:
            os.makedirs(folder, exist_ok=True)
            write(alt)
        except OSError:
            continue
        rescued.append((path, alt, reason))
        return alt
    rescued.append((path, "nowhere (every rescue folder failed too)", reason))
    return None


# -- logs a resume continues --------------------------------------------------------------------------


class _ContinuedWriter(ExperimentWriter):
    """Lightning's CSV writer, which deletes an existing metrics.csv, made to keep the rows a
    resumed run does not log again: those before ``resume_step`` (and evaluations at it)."""

    def __init__(self, log_dir: str, resume_step: Optional[int]):
        self._resume_step = resume_step
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:
        if self._resume_step is None or not os.path.isfile(self.metrics_file_path):
            return super()._check_log_dir_exists()

        with open(self.metrics_file_path, newline="") as f:
            reader = csv.DictReader(f)
            fields = list(reader.fieldnames or [])
            rows = [r for r in reader if _kept(r, self._resume_step)]
        with atomic_output(self.metrics_file_path) as tmp, open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)
        self.metrics_keys = sorted(fields)


def _kept(row: Dict[str, str], resume_step: int) -> bool:
    """A row the continued run keeps: logged before the step it resumes from, or an evaluation of
    the model at that step (a training row at step ``s`` is the loss of the step taken from the
    model after ``s`` steps, which the resumed run takes again)."""
    try:
        step = int(float(row.get("step") or -1))
    except ValueError:
        return True
    if step != resume_step:
        return step < resume_step
    return not any(
        v not in (None, "") for k, v in row.items() if k not in ("step", "epoch") and not k.startswith("val/")
    )


class ResumableCSVLogger(CSVLogger):
    """Lightning's ``CSVLogger`` that a resumed run continues: with ``resume_step`` it appends to
    the existing ``metrics.csv`` of ``version`` after dropping the rows from that step on (a crash
    after the checkpoint logged steps the resumed run logs again), one file, one curve.

    Args:
        resume_step: the global step of the checkpoint the run resumes from; ``None`` for a
            fresh run (the file is started anew, as Lightning does).
        save_dir, name, version, **kwargs: as ``CSVLogger``.
    """

    def __init__(
        self, save_dir: str, name: str = "lightning_logs", version=None, resume_step: Optional[int] = None, **kwargs
    ):
        super().__init__(save_dir, name=name, version=version, **kwargs)
        self.resume_step = resume_step

    @property
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            os.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ContinuedWriter(self.log_dir, self.resume_step)
        return self._experiment


def _last_version(root: str, marker: str) -> Optional[int]:
    """The highest ``version_<n>`` folder of ``root`` that holds a file matching ``marker``."""
    found = []
    for d in glob.glob(os.path.join(glob.escape(root), "version_*")):
        tail = os.path.basename(d)[len("version_") :]
        if tail.isdigit() and glob.glob(os.path.join(glob.escape(d), marker)):
            found.append(int(tail))
    return max(found) if found else None


def logger_resume_kwargs(logger_cfg, resume_step: Optional[int]) -> Dict[str, Any]:
    """What to pass a logger config's class so that a resumed run writes on in the run's own log:
    the latest version holding a log (no new ``version_<n>``), and the step from which the
    earlier log is replaced: ``ResumableCSVLogger(resume_step=)``, TensorBoard's
    ``purge_step`` (TensorBoard then hides the events from that step on that came before).
    Empty for a fresh run, a logger given its own ``version``, or another logger class."""
    if resume_step is None or logger_cfg is None or logger_cfg.get("version") is not None:
        return {}
    from hydra.utils import get_class

    try:
        cls = get_class(str(logger_cfg.get("_target_")))
    except Exception:  # the build that follows reports a bad target
        return {}
    root = os.path.join(str(logger_cfg.get("save_dir")), str(logger_cfg.get("name") or "lightning_logs"))
    if issubclass(cls, ResumableCSVLogger):
        version = _last_version(root, "metrics.csv")
        return {} if version is None else {"version": version, "resume_step": int(resume_step)}
    if issubclass(cls, TensorBoardLogger):
        version = _last_version(root, "events.out.tfevents.*")
        return {} if version is None else {"version": version, "purge_step": int(resume_step)}
    return {}
