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
views or device (one dry call), a GPU trainer without a GPU, a missing, unreadable or ill-fitting
checkpoint, a resume under another seed / data / model / loss (``resume_allow_changes=true``
allows it), a fresh run in a folder holding a trained run, an output folder that cannot be written.

One run holds its folder at a time (``.splatloss-run.lock``, an operating-system lock released when
the process ends): a second run there is refused naming the one that holds it. Gaussians that stop
being finite (a learning rate too large) stop the run with
:class:`~splatloss.lightning.TrainingDiverged`, naming the step and the parameters; :func:`main`
exits 1.

SIGINT / SIGTERM save ``checkpoints/last.ckpt``, print the command that resumes, and make
:func:`main` exit 130 / 143; a signal while the run starts or evaluates, or a second one, stops at
once and says which checkpoint holds which step. In a sweep the printed command resumes the sweep
(``-m ... hydra.sweep.dir=<sweep> resume=true``): its finished runs are kept, the interrupted one
continues, the others start. A resume continues the run's own folder, CSV and TensorBoard logs.
``--help`` lists the config groups' choices (:func:`help_text`).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from typing import Any, Dict, List, Optional

import torch

log = logging.getLogger(__name__)

__all__ = ["train", "main", "help_text", "CONFIG_DIR"]


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
        The metrics dict also written to ``<cfg.output_dir>/metrics.json``. An interrupted run
        (SIGINT / SIGTERM) saves its checkpoint and returns ``"interrupted"`` (the signal's name)
        and ``"exit_code"`` (130 / 143) without the final evaluation.

    Raises:
        ValueError: a config, checkpoint or output folder that cannot be used, before anything is
            trained or written.
        RunInterrupted: a signal outside training (an evaluation) or a second signal.
        TrainingDiverged: the Gaussians became non-finite (NaN or inf); no later state is saved.
        OutputNotWritten: files of the finished run that were written elsewhere (it says where).
    """
    import lightning as L
    from omegaconf import open_dict

    from .lightning import HeldOutMetrics, RunInterrupted, SceneDataModule, StopOnSignal, check_scene, runs
    from .lightning.checkpoint_io import AtomicCheckpointIO, check_state_shapes, read_checkpoint
    from .splat.trajectory import render_trajectory

    runs.check_config(cfg)
    _quiet_lightning()
    sweep = runs.sweep_folder()  # None outside a Hydra multirun
    # A resumed sweep (resume=true with -m) starts its runs that never started.
    ckpt_path = runs.resolve_checkpoint(cfg, missing_ok=sweep is not None)
    if ckpt_path is not None and cfg.get("resume") == "latest" and runs.run_folder_of(ckpt_path):
        # The newest run continues in its own folder: its checkpoints, logs and metrics.json.
        cfg = cfg.copy()
        with open_dict(cfg):
            cfg.output_dir = runs.run_folder_of(ckpt_path)
    out_dir = os.path.abspath(str(cfg.output_dir))
    checkpoint = None
    changes: List[str] = []
    if ckpt_path is not None:
        checkpoint = read_checkpoint(ckpt_path)
        changes = runs.check_resume_config(cfg, checkpoint, ckpt_path)
        if changes:
            log.warning("resuming %s under a changed configuration (resume_allow_changes=true): %s", ckpt_path,
                        "; ".join(changes))  # fmt: skip
        done = runs.finished_metrics(out_dir, checkpoint, int(cfg.trainer.max_steps)) if sweep else None
        if done is not None and runs.run_folder_of(ckpt_path) == out_dir:
            log.info("%s finished already (%d steps): kept as it is", out_dir, done["steps"])
            return done
    resume_step = None if checkpoint is None else int(checkpoint["global_step"])
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)

    # Build every object and try the loss on the data first: a bad config fails here, not at step 0.
    # Start-up takes seconds to tens of seconds before the first step: each stage says what it does.
    log.info("%s %s: building the loss, the scene and the model", "resuming" if checkpoint else "starting", out_dir)
    loss = _build("loss", cfg.loss)
    scene = _build("scene", cfg.data.scene, "data")
    check_scene(scene)
    module = _build("model", cfg.model, loss=loss)
    module.bind_scene(scene)
    if checkpoint is not None:
        check_state_shapes(checkpoint, module, ckpt_path)
        # An allowed change of loss trains with the loss configured now (what metrics.json records).
        module.loss_weights_from_checkpoint = not any(c.startswith(("loss", "the checkpoint")) for c in changes)
    num_gaussians_init = module.gaussians.num
    callbacks = [_build("callbacks", c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    if not cfg.trainer.get("enable_progress_bar", True):  # Lightning refuses a progress bar beside this
        callbacks = [c for c in callbacks if not isinstance(c, L.pytorch.callbacks.ProgressBar)]
    evaluator = next((c for c in callbacks if isinstance(c, HeldOutMetrics)), None)
    if evaluator is not None and evaluator.dirpath is None:
        evaluator.dirpath = os.path.join(out_dir, "renders")
    ckpt_cb = next((c for c in callbacks if isinstance(c, L.pytorch.callbacks.ModelCheckpoint)), None)
    saves = ckpt_cb is not None and bool(ckpt_cb.dirpath)  # else only an interrupted run saves one, here:
    ckpt_dir = ckpt_cb.dirpath if saves else os.path.join(out_dir, "checkpoints")
    if checkpoint is None:
        runs.check_fresh_run_folder(out_dir, ckpt_dir)
    stopper = StopOnSignal()
    init_saved = ((checkpoint or {}).get(runs.RunRecord.KEY) or {}).get("init")
    record = runs.RunRecord(runs.run_identity(cfg), init_saved)
    logger = False
    if cfg.get("logger"):
        logger = _build("logger", cfg.logger, **runs.logger_resume_kwargs(cfg.logger, resume_step))
    every = cfg.get("eval_every_n_steps")  # one epoch is the whole run: evaluate within it
    evaluation = {} if every is None else {"check_val_every_n_epoch": 1, "val_check_interval": int(every)}
    # A run shorter than the logging interval logs its last step (Lightning warns otherwise).
    log_every = min(int(cfg.trainer.get("log_every_n_steps", 50)), int(cfg.trainer.max_steps))
    rescue = runs.rescue_folders(cfg.get("rescue_dir"))  # one folder for everything a run rescues
    checkpoint_io = AtomicCheckpointIO(rescue_dirs=rescue)
    trainer = _build(
        "trainer", cfg.trainer, callbacks=[*callbacks, stopper, record], logger=logger, default_root_dir=out_dir,
        plugins=[checkpoint_io], log_every_n_steps=log_every, **evaluation,
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
    outputs = {"run folder (metrics.json, point_cloud.ply)": out_dir, "checkpoints": ckpt_dir}
    if evaluator is not None and evaluator.save_renders:
        outputs["renders"] = evaluator.dirpath
    for lg in trainer.loggers:
        if getattr(lg, "log_dir", None):
            outputs[f"{type(lg).__name__} log"] = lg.log_dir
    if trainer.is_global_zero:
        runs.check_writable(outputs, instead="another run folder (hydra.run.dir=<folder>)")
    # One run per folder at a time (a second would mix its files into this one's); rank 0 holds it.
    held = _ENTRY_LOCK is not None and _ENTRY_LOCK.folder == out_dir
    folder_lock = runs.RunFolderLock(out_dir).acquire() if trainer.is_global_zero and not held else None
    try:
        dm = SceneDataModule(scene, seed=int(cfg.seed))

        stopper.install()  # from here a signal stops the run with the shell's status (130, 143)
        last = os.path.join(ckpt_dir, "last.ckpt")  # the end of the run, whatever every_n_train_steps is
        stage = "init"
        try:
            if init_saved is not None:  # a resume: the untrained model was evaluated (and logged) by the run
                init = dict(init_saved)
            else:
                log.info("evaluating the untrained model on %d held-out views", len(scene.test))
                init = _evaluate(trainer, module, dm, evaluator, "init")
                record.init = init
            log.info(
                "training %d Gaussians from step %d to step %d",
                module.gaussians.num, resume_step or 0, int(cfg.trainer.max_steps),
            )  # fmt: skip
            stage = "train"
            trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
            interrupted = stopper.signal_name
            stage = "save"
            if saves or interrupted:
                trainer.save_checkpoint(last, weights_only=False)  # written elsewhere if it cannot be there
            rescued = list(checkpoint_io.rescued)
            last = next((got for wanted, got, _ in rescued if wanted == last), last)
            stage = "final"
            if not interrupted:
                log.info("evaluating the trained model on %d held-out views", len(scene.test))
            final = {} if interrupted else _evaluate(trainer, module, dm, evaluator, "final")
        except RunInterrupted as e:
            if trainer.is_global_zero:
                saved = next((got for wanted, got, _ in checkpoint_io.rescued if wanted == last), last)
                steps = int(cfg.trainer.max_steps)
                print(_stopped_message(e.signal_name, stage, saved, steps, out_dir, sweep), flush=True)
            raise
        finally:
            stopper.restore()

        metrics = runs.run_metrics(
            cfg, trainer, module, scene, init=init, final=final, interrupted=interrupted,
            resumed_from=ckpt_path, num_gaussians_init=int(num_gaussians_init),
            ms_ssim_scales=evaluator.last.get("ms_ssim_scales") if evaluator is not None and not interrupted else None,
        )  # fmt: skip
        if interrupted:
            metrics["exit_code"] = stopper.exit_code
        if trainer.is_global_zero:
            runs.write_or_rescue(
                os.path.join(out_dir, "metrics.json"), lambda p: runs.write_json_atomic(p, metrics), rescued, rescue
            )
            if interrupted:
                print(
                    f"Stopped by {interrupted} at step {metrics['steps']} of {int(cfg.trainer.max_steps)}; checkpoint "
                    f"{last}. {_go_on(out_dir, sweep)}",
                    flush=True,
                )
            else:
                if cfg.get("export_ply", True):
                    ply = os.path.join(out_dir, "point_cloud.ply")
                    runs.write_or_rescue(ply, module.gaussians.export_ply, rescued, rescue)
                if cfg.get("render_traj", False):  # a video along a path through the training views
                    video = render_trajectory(module.render_view, scene.train, os.path.join(out_dir, "traj"))
                    log.info("trajectory video: %s", video)
                _summary(metrics, out_dir)
        if rescued:
            raise runs.OutputNotWritten(rescued)
        return metrics
    finally:
        if folder_lock is not None:
            folder_lock.release()


_STOPPED_DURING = {
    "start": "while the run was starting, before training",
    "init": "while the untrained model was evaluated, before training",
    "train": "again during training",
    "save": "again while the checkpoint was saved",
    "final": "during the final evaluation, after training",
}


def _go_on(out_dir: str, sweep: Optional[str], resume: bool = True) -> str:
    """``Resume with:`` and the command that continues this run, or the whole sweep it is part of."""
    from .lightning import runs

    if sweep is not None:
        return f"Resume the sweep with:\n  {runs.sweep_resume_command(sweep)}"
    if not resume:
        return f"Start again with:\n  {runs.resume_command(out_dir, resume=False)}"
    return f"Resume with:\n  {runs.resume_command(out_dir)}"


def _stopped_message(
    signal_name: str, stage: str, last: str, max_steps: int, out_dir: str, sweep: Optional[str] = None
) -> str:
    """What a run stopped at once (a signal outside training, or a second one) saved, and the
    command that goes on from there."""
    try:  # mmap: the step without reading the tensors
        step = int(torch.load(last, map_location="cpu", weights_only=True, mmap=True)["global_step"])
    except Exception:  # absent, or not a checkpoint: nothing to resume from
        step = None
    head = f"Stopped by {signal_name} {_STOPPED_DURING[stage]}"
    if step is None:
        return f"{head}: no checkpoint was saved. {_go_on(out_dir, sweep, resume=False)}"
    unfinished = ""
    if stage == "final":
        unfinished = "; the held-out metrics, metrics.json and point_cloud.ply are not written yet"
    return f"{head}: checkpoint {last} holds step {step} of {max_steps}{unfinished}. {_go_on(out_dir, sweep)}"


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
        "%.1f ms/step%s, loss %.1f%% of the step",
        metrics.get("psnr", nan),
        metrics.get("psnr_init", nan),
        metrics.get("ssim", nan),
        metrics.get("ssim_3dgs", nan),
        metrics.get("ms_ssim", nan),
        metrics["steps"],
        metrics["train_seconds"],
        step_ms,
        " (warm-up steps included: too few steps to leave them out)" if metrics.get("timing_includes_warmup") else "",
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
    - "The dirpath has changed": a checkpoint continued in another run folder (``ckpt_path=``);
      the best-k bookkeeping it drops is unused (one ``last.ckpt``).
    """
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if _LIGHTNING_NOISE not in rank_zero.filters:
        rank_zero.addFilter(_LIGHTNING_NOISE)
    warnings.filterwarnings(
        "ignore", message=r".*isinstance\(treespec, LeafSpec\)", module=r"lightning\.pytorch\.utilities\._pytree"
    )
    warnings.filterwarnings("ignore", message=".*no pre-optimization state was saved.*")
    # A checkpoint continued in another folder (ckpt_path=): the best-k bookkeeping it says it drops
    # is unused here (save_top_k: 0, one last.ckpt).
    warnings.filterwarnings("ignore", message=r"The dirpath has changed from .* won't be reloaded")


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


# The groups --help lists, in this order, with what choosing one means.
_HELP_GROUPS = (
    ("loss", "the photometric loss"),
    ("data", "the scene"),
    ("model", "the Gaussians and their optimisation"),
    ("trainer", "where and how long it trains (lightning.pytorch.Trainer)"),
    ("logger", "where the curves go"),
    ("callbacks", "loss terms, held-out metrics and renders, checkpoints, progress"),
    ("experiment", "a preset sweep (-m)"),
    ("hparams_search", "a hyper-parameter search (-m)"),
    ("hydra/launcher", "how the runs of a sweep are launched"),
)

_HELP_KEYS = (
    ("seed=0", "seeds the scene, the initial Gaussians and the view order"),
    ("trainer.max_steps=1000", "training steps (raise it to extend a finished run with resume=true)"),
    ("data.path=<folder>", "the scene folder for data=blender|colmap|nerfstudio"),
    ("eval_every_n_steps=null", "held-out metrics and renders every this many steps too"),
    ("logger=tensorboard / ~logger", "TensorBoard events instead of the CSV file / no log"),
    ("hydra.run.dir=<folder>", "the run folder (default outputs/<date>/<time>)"),
    ("resume=true", "continue the run in hydra.run.dir from its checkpoints/last.ckpt"),
    ("-m ... resume=true", "resume the sweep in hydra.sweep.dir: keep its finished runs, run the rest"),
    ("resume=latest", "continue the newest run under outputs/ in its own folder"),
    ("ckpt_path=<file.ckpt>", "continue from that checkpoint"),
    ("resume_allow_changes=false", "true: continue a checkpoint under another loss/data/model/seed"),
    ("rescue_dir=null", "where a finished run's files go if its folder cannot take them"),
    ("export_ply=true", "write point_cloud.ply (3DGS layout)"),
    ("num_threads=null", "torch CPU threads (null: torch's default)"),
)


def _description(path: str) -> str:
    """The first comment line of a config file (after any ``# @package`` line)."""
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("#"):
                break
            text = line.lstrip("#").strip()
            if text and not text.startswith("@package"):
                return text
    return ""


def _defaults() -> Dict[str, str]:
    from omegaconf import OmegaConf

    out = {}
    for item in OmegaConf.to_container(OmegaConf.load(os.path.join(CONFIG_DIR, "train.yaml")))["defaults"]:
        if isinstance(item, dict):
            for k, v in item.items():
                out[k.replace("override ", "").strip()] = str(v)
    return out


def help_text(prog: str = "splatloss-train") -> str:
    """What ``--help`` prints: every config group's choices with their one-line description (the
    first comment line of each file; files named ``_*.yaml`` are bases other configs extend, not
    choices), the common keys and examples."""
    defaults = _defaults()
    lines = [
        f"{prog}: train 3D Gaussians with a splatloss photometric loss (gsplat + Lightning + Hydra).",
        "",
        f"Usage: {prog} [group=choice ...] [key=value ...]      one run, in outputs/<date>/<time>/",
        f"       {prog} -m group=a,b key=x,y ...               a sweep, in multirun/<date>/<time>/<n>/",
        "",
        "Choices (group=choice; * marks the default):",
    ]
    for group, what in _HELP_GROUPS:
        folder = os.path.join(CONFIG_DIR, group)
        names = sorted(f[:-5] for f in os.listdir(folder) if f.endswith(".yaml") and not f.startswith("_"))
        if not names:
            continue
        lines += ["", f"  {group}: {what}"]
        width = max(len(n) for n in names) + 2
        for name in names:
            mark = "*" if defaults.get(group) == name else " "
            lines.append(f"   {mark}{name:<{width}}{_description(os.path.join(folder, name + '.yaml'))}")
    lines += ["", "Common keys (key=value; shown with their defaults):", ""]
    width = max(len(k) for k, _ in _HELP_KEYS) + 2
    lines += [f"    {k:<{width}}{v}" for k, v in _HELP_KEYS]
    lines += [
        "",
        "Any key of a group can be set too, e.g. loss.lambda_dssim=0.4, loss.window_size=7, model.sh_degree=3;",
        "`--cfg job` prints the whole composed configuration.",
        "",
        "Examples:",
        f"    {prog} loss=dssim_l1 trainer.max_steps=1500",
        f"    {prog} loss=msssim_l1 data=colmap data.path=~/scenes/garden data.downscale=4 trainer=gpu",
        f"    {prog} -m loss=l1,dssim_l1,msssim_l1 seed=0,1,2",
        f"    {prog} resume=latest",
        "",
        "Ctrl+C (or SIGTERM) saves checkpoints/last.ckpt, prints the command that resumes, and exits 130 (143).",
        "Hydra's own options: --hydra-help.",
    ]
    return "\n".join(lines)


def _expand_home(argv: List[str]) -> List[str]:
    """``key=~/path`` as the shell expands ``~`` at the start of a word: the home folder (quoted
    for Hydra where its grammar needs it). Hydra's grammar reads a value's leading ``~`` as an error,
    and nothing else would expand it; ``~key`` (delete a key) is left alone."""
    from .lightning.runs import hydra_value

    out = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if eq and not arg.startswith("-") and re.match(r"~[\w.-]*(/|$)", value):
            expanded = os.path.expanduser(value)
            if expanded != value:
                arg = f"{key}={hydra_value(expanded)}"
        out.append(arg)
    return out


def _resume_latest_in_place(argv: List[str]) -> List[str]:
    """``resume=latest`` on the command line becomes ``hydra.run.dir=<newest run> resume=true``,
    before Hydra creates a new run folder: the newest run (beside where this one would go)
    continues in its own folder, with its own logs."""
    if "resume=latest" not in argv or any(a in ("-m", "--multirun") or a.startswith("ckpt_path=") for a in argv):
        return argv
    from hydra import compose, initialize_config_dir

    from .lightning.runs import hydra_value, latest_checkpoint, run_folder_of

    overrides = [a for a in argv if a != "resume=latest" and not a.startswith("-")]
    try:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
    except Exception:  # a bad override: Hydra reports it when it composes the run
        return argv
    ckpt = latest_checkpoint(os.path.abspath(str(cfg.hydra.run.dir)))
    folder = run_folder_of(ckpt)
    if folder is None:
        return argv
    kept = [a for a in argv if a != "resume=latest" and not a.startswith("hydra.run.dir=")]
    return kept + [f"hydra.run.dir={hydra_value(folder)}", "resume=true"]


# The run folder main() holds from before Hydra writes into it (.hydra/, train.log) to the process's end.
_ENTRY_LOCK = None


def _lock_named_run_folder(argv: List[str]):
    """A single run given its folder (``hydra.run.dir=``) holds it before Hydra writes its config and
    log there, so a second run in that folder is refused before it touches anything. Processes that
    are not the first of a multi-process run (DDP's, SLURM's other ranks) hold nothing."""
    if any(a in ("-m", "--multirun") for a in argv) or not any(a.startswith("hydra.run.dir=") for a in argv):
        return None
    if any(os.environ.get(k, "0") != "0" for k in ("LOCAL_RANK", "RANK", "NODE_RANK", "SLURM_PROCID")):
        return None
    from .lightning.runs import RunFolderLock

    given = [a.split("=", 1)[1] for a in argv if a.startswith("hydra.run.dir=")][-1]
    if re.fullmatch(r"[\w./+-]+", given):  # a plain path: no quotes or interpolations to resolve
        return RunFolderLock(os.path.abspath(given)).acquire()
    from hydra import compose, initialize_config_dir

    overrides = [a for a in argv if not a.startswith("-")]
    try:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
        folder = os.path.abspath(str(cfg.hydra.run.dir))
    except Exception:  # a bad override: Hydra reports it when it composes the run
        return None
    return RunFolderLock(folder).acquire()


def main() -> Optional[float]:
    """Hydra entry: ``splatloss-train [overrides]``; returns ``cfg.optimized_metric``'s value (for
    the Optuna sweeper) when set. A config error in a single run prints one message and exits 2; a
    run stopped by SIGINT / SIGTERM exits 130 / 143 after saving its checkpoint; a finished run
    whose files had to be written elsewhere exits 1, saying where, and so does a run whose Gaussians
    became non-finite, naming the step and the parameters. ``--help`` lists the choices."""
    argv = sys.argv[1:]
    if "--help" in argv or "-h" in argv:
        argv0 = sys.argv[0] if sys.argv else ""
        if argv0.endswith(os.path.join("splatloss", "train.py")):
            prog = "python -m splatloss.train"
        elif argv0.endswith(".py"):
            prog = "python scripts/train.py"
        else:
            prog = os.path.basename(argv0) or "splatloss-train"
        print(help_text(prog))
        return None
    global _ENTRY_LOCK
    try:
        sys.argv[1:] = _resume_latest_in_place(_expand_home(argv))
        _ENTRY_LOCK = _lock_named_run_folder(sys.argv[1:])
    except ValueError as e:
        print(f"splatloss-train: error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)

    import hydra

    @hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
    def _main(cfg) -> Optional[float]:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        log.info("loading Lightning and gsplat")  # seconds of imports: the first line says the run started
        from .lightning import RunInterrupted, TrainingDiverged
        from .lightning.runs import OutputNotWritten

        _one_log_stream()
        if cfg.get("num_threads"):
            torch.set_num_threads(int(cfg.num_threads))
        try:
            metrics = train(cfg)
        except KeyboardInterrupt:  # Ctrl+C while the run was built, before train() held the signals
            from .lightning.runs import sweep_folder

            out_dir = os.path.abspath(str(cfg.output_dir))
            last = os.path.join(out_dir, "checkpoints", "last.ckpt")
            steps = int(cfg.trainer.max_steps)
            print(_stopped_message("SIGINT", "start", last, steps, out_dir, sweep_folder()), flush=True)
            sys.exit(130)
        except RunInterrupted as e:
            print(f"splatloss-train: stopped by {e.signal_name}", file=sys.stderr, flush=True)
            sys.exit(e.exit_code)
        except OutputNotWritten as e:
            print(f"splatloss-train: error: {e}", file=sys.stderr, flush=True)
            sys.exit(1)
        except Exception as e:
            if HydraConfig.get().mode == RunMode.MULTIRUN:
                # Into the run's log (<run>/train.log), where splatloss-report reads why it failed;
                # the traceback only for what is not a config error or a diverged run.
                log.error("run failed: %s", e, exc_info=not isinstance(e, (ValueError, TrainingDiverged)))
                raise  # the sweep records the failed job
            if isinstance(e, TrainingDiverged):
                print(f"splatloss-train: error: {e}", file=sys.stderr, flush=True)
                sys.exit(1)
            if not isinstance(e, ValueError):
                raise
            print(f"splatloss-train: error: {e}", file=sys.stderr, flush=True)
            sys.exit(2)
        if metrics.get("exit_code"):
            sys.exit(int(metrics["exit_code"]))
        key = cfg.get("optimized_metric")
        return None if not key else float(metrics[key])

    try:
        return _main()
    except KeyboardInterrupt:  # Ctrl+C while starting up, before train() holds the signals
        print("splatloss-train: stopped by SIGINT", file=sys.stderr, flush=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
