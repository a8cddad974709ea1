"""Every config file composes through Hydra, and what it builds is what it says."""

import copy
import glob
import os

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import get_class, get_method, instantiate
from omegaconf import OmegaConf, open_dict

import splatloss
from splatloss.losses import PhotometricLoss
from splatloss.train import CONFIG_DIR

GROUPS = ["data", "model", "loss", "trainer", "callbacks", "logger", "experiment", "hparams_search"]
SSIM_KEYS = {"window_size", "sigma", "window", "k1", "k2", "c1", "c2", "data_range", "padding", "backend"}


def _choices(group):
    # Files named _*.yaml are blocks other configs include through their defaults list, not choices.
    names = (os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(CONFIG_DIR, group, "*.yaml")))
    return sorted(n for n in names if not n.startswith("_"))


_COMPOSED = {}


def _compose(overrides, hydra=False):
    """The config ``overrides`` compose to: each command composed once per session, a copy returned
    (callers change theirs)."""
    key = (tuple(overrides), hydra)
    if key not in _COMPOSED:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            _COMPOSED[key] = compose(config_name="train", overrides=list(overrides), return_hydra_config=hydra)
    return copy.deepcopy(_COMPOSED[key])


def test_every_config_file_is_covered():
    on_disk = sorted(
        os.path.relpath(p, CONFIG_DIR) for p in glob.glob(os.path.join(CONFIG_DIR, "**", "*.yaml"), recursive=True)
    )
    covered = ["train.yaml", "eval.yaml"] + [f"{g}/{c}.yaml" for g in GROUPS for c in _choices(g)]
    covered += [f"hydra/launcher/{c}.yaml" for c in _choices("hydra/launcher")]
    covered += ["loss/_ssim.yaml", "data/_files.yaml"]  # bases the choices extend
    assert sorted(covered) == on_disk
    assert _choices("loss") == ["dssim_l1", "l1", "l2", "msssim", "msssim_l1", "ssim", "zhao_mix"]
    assert _choices("trainer") == ["cpu", "ddp", "default", "gpu"]


# the fast tier: the groups a loss ablation changes; the others in the whole suite
@pytest.mark.parametrize(
    "group", [g if g in ("model", "loss", "callbacks") else pytest.param(g, marks=pytest.mark.slow) for g in GROUPS]
)
def test_group_choices_compose_and_resolve(group, tmp_path):
    for choice in _choices(group):
        overrides = [f"{group}={choice}"]
        if group == "data" and choice != "default":
            overrides.append(f"data.path={tmp_path}")
        cfg = _compose(overrides)
        with open_dict(cfg):
            cfg.output_dir = str(tmp_path)  # ${hydra:...} values exist only inside a Hydra run
            cfg.loss_name = "x"
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # no dangling interpolation
        for key in ("loss", "data", "model", "trainer"):
            assert key in cfg, (group, choice, key)


@pytest.mark.parametrize("name", ["l1", "l2", "ssim", "dssim_l1", "msssim", "msssim_l1", "zhao_mix"])
def test_loss_configs_build_the_loss_they_name(name):
    cfg = _compose([f"loss={name}"])
    assert SSIM_KEYS <= set(cfg.loss.keys()), sorted(SSIM_KEYS - set(cfg.loss.keys()))
    loss = instantiate(cfg.loss)
    assert isinstance(loss, PhotometricLoss)
    direct = {
        "l1": PhotometricLoss(l1=1.0),
        "l2": PhotometricLoss(l2=1.0),
        "ssim": PhotometricLoss(dssim=1.0),
        "dssim_l1": PhotometricLoss.dssim_l1(lambda_dssim=0.2, padding="same"),
        "msssim": PhotometricLoss(msssim=1.0, padding="same"),
        "msssim_l1": PhotometricLoss.msssim_l1(alpha=0.84, padding="same"),
        "zhao_mix": PhotometricLoss.zhao_mix(alpha=0.84, padding="same"),
    }[name]
    assert loss.weights == direct.weights
    g = torch.Generator().manual_seed(0)
    pred, target = torch.rand(1, 3, 64, 64, generator=g), torch.rand(1, 3, 64, 64, generator=g)
    assert float(loss(pred, target)) == float(direct(pred, target))
    assert set(loss.terms) == {k for k, v in loss.weights.items() if v > 0}


def test_loss_options_reach_the_loss():
    cfg = _compose(
        [
            "loss=ssim",
            "loss.window_size=7",
            "loss.sigma=1.0",
            "loss.window=uniform",
            "loss.k1=0.02",
            "loss.c2=0.001",
            "loss.data_range=2.0",
            "loss.padding=reflect",
            "loss.backend=reference",
        ]
    )
    loss = instantiate(cfg.loss)
    c = loss.cfg
    assert (c.window_size, c.sigma, c.window, c.k1, c.c2, c.data_range, c.padding) == (
        7,
        1.0,
        "uniform",
        0.02,
        0.001,
        2.0,
        "reflect",
    )
    x, y = torch.rand(1, 3, 20, 20) * 2, torch.rand(1, 3, 20, 20) * 2
    expect = 1 - splatloss.ssim(
        x,
        y,
        window_size=7,
        sigma=1.0,
        window="uniform",
        k1=0.02,
        c2=0.001,
        data_range=2.0,
        padding="reflect",
        backend="reference",
    )
    assert float(loss(x, y)) == pytest.approx(float(expect), rel=1e-6, abs=0)


@pytest.mark.slow
def test_targets_exist_and_trainer_configs_build(tmp_path):
    cfg = _compose([])
    get_method(cfg.data.scene._target_)
    get_method(cfg.model.gaussians._target_)
    get_class(cfg.model.strategy._target_)
    for choice in ("default", "cpu", "ddp"):
        c = _compose([f"trainer={choice}", "trainer.max_steps=5"])
        trainer = instantiate(c.trainer, default_root_dir=str(tmp_path), logger=False)
        assert trainer.max_steps == 5
        assert trainer.num_devices == (2 if choice == "ddp" else 1)
        if not torch.cuda.is_available():
            assert type(trainer.accelerator).__name__ == "CPUAccelerator"
    assert _compose([]).trainer.accelerator == "auto"  # the same command picks a GPU where one exists
    ddp = _compose(["trainer=ddp"])
    assert ddp.model.strategy is None  # DDP trains a fixed set of Gaussians
    assert ddp.trainer.strategy.process_group_backend == "gloo"
    gpu = _compose(["trainer=gpu"])
    assert gpu.trainer.accelerator == "gpu" and gpu.trainer._target_ == "lightning.pytorch.Trainer"


def test_callbacks_build(tmp_path):
    cfg = _compose([])
    with open_dict(cfg):
        cfg.output_dir = str(tmp_path)
    cbs = {k: instantiate(v) for k, v in cfg.callbacks.items()}
    from lightning.pytorch.callbacks import ModelCheckpoint

    from splatloss.lightning import HeldOutMetrics, LossTerms

    assert isinstance(cbs["loss_terms"], LossTerms) and isinstance(cbs["held_out"], HeldOutMetrics)
    assert isinstance(cbs["checkpoint"], ModelCheckpoint)
    assert cbs["checkpoint"].dirpath == os.path.join(str(tmp_path), "checkpoints")


def test_experiment_sweeps_three_losses():
    cfg = _compose(["experiment=loss_ablation"], hydra=True)
    assert cfg.hydra.mode.name == "MULTIRUN"
    assert cfg.hydra.sweeper.params.loss == "l1,dssim_l1,msssim_l1"


def test_optuna_search_targets_an_existing_key():
    cfg = _compose(["hparams_search=optuna_lambda"], hydra=True)
    sweeper = cfg.hydra.sweeper
    assert get_class(sweeper._target_).__name__ == "OptunaSweeper"
    assert cfg.optimized_metric == "psnr" and sweeper.direction == "maximize"
    for key in sweeper.params:
        assert OmegaConf.select(cfg, key) is not None, key  # the swept key exists in the composed config
    assert list(sweeper.params) == ["loss.lambda_dssim"]


@pytest.mark.parametrize("choice,target", [("local", "JoblibLauncher"), ("slurm", "SlurmLauncher")])
def test_launcher_configs(choice, target):
    cfg = _compose([f"hydra/launcher={choice}"], hydra=True)
    assert get_class(cfg.hydra.launcher._target_).__name__ == target


@pytest.mark.slow
def test_loss_configs_share_one_ssim_block():
    shared = OmegaConf.load(os.path.join(CONFIG_DIR, "loss", "_ssim.yaml"))
    assert set(shared.keys()) == SSIM_KEYS - {"padding"}
    for name in _choices("loss"):
        own = OmegaConf.load(os.path.join(CONFIG_DIR, "loss", f"{name}.yaml"))
        assert list(own.defaults) == ["_ssim", "_self_"], name
        assert not set(own.keys()) & set(shared.keys()), name  # written once, in _ssim.yaml
        composed = _compose([f"loss={name}", "loss.window_size=7"]).loss
        assert composed.window_size == 7 and composed.sigma == shared.sigma, name


# What each trainer choice changes in trainer/default, and the keys it adds.
TRAINER_CHANGES = {
    "cpu": ({"accelerator": "cpu"}, set()),
    "gpu": ({"accelerator": "gpu", "max_steps": 30000}, set()),
    # "auto" -> "cpu" (gloo), 1 -> 2 processes
    "ddp": ({"accelerator": "cpu", "devices": 2}, {"strategy", "use_distributed_sampler"}),
}


@pytest.mark.parametrize(
    "choice", [c if c == "cpu" else pytest.param(c, marks=pytest.mark.slow) for c in sorted(TRAINER_CHANGES)]
)
def test_trainer_choices_extend_default(choice):
    default, trainer = _compose([]).trainer, _compose([f"trainer={choice}"]).trainer
    changes, added = TRAINER_CHANGES[choice]
    assert {k: trainer[k] for k in default if trainer[k] != default[k]} == changes
    assert set(trainer) - set(default) == added
    # The file names trainer/default as its base and writes only what it changes or adds.
    base = OmegaConf.load(os.path.join(CONFIG_DIR, "trainer", "default.yaml"))
    own = OmegaConf.load(os.path.join(CONFIG_DIR, "trainer", f"{choice}.yaml"))
    assert "defaults" not in base
    assert list(own.defaults)[0] == ("default@trainer" if choice == "ddp" else "default"), list(own.defaults)
    body = own.trainer if choice == "ddp" else own
    written = {k for k in body if k != "defaults"}
    assert written == set(changes) | added, sorted(written ^ (set(changes) | added))
    # A key changed on the command line reaches the choice.
    assert _compose([f"trainer={choice}", "trainer.log_every_n_steps=7"]).trainer.log_every_n_steps == 7


@pytest.mark.parametrize(
    "choice",
    [pytest.param("blender", marks=pytest.mark.slow), "colmap", pytest.param("nerfstudio", marks=pytest.mark.slow)],
)
def test_scene_file_choices_extend_one_base(choice, tmp_path):
    base = OmegaConf.load(os.path.join(CONFIG_DIR, "data", "_files.yaml"))
    own = OmegaConf.load(os.path.join(CONFIG_DIR, "data", f"{choice}.yaml"))
    assert list(own.defaults) == ["_files", "_self_"]
    assert set(base) == {"kind", "path", "downscale"}
    repeated = (set(own) & set(base)) - {"kind"}
    assert not repeated, sorted(repeated)  # written once, in _files.yaml
    data = _compose([f"data={choice}", f"data.path={tmp_path}", "data.downscale=2"]).data
    assert (data.kind, data.path, data.downscale) == (choice, str(tmp_path), 2)
    assert (data.scene.path, data.scene.downscale) == (str(tmp_path), 2)
    assert OmegaConf.is_missing(_compose([f"data={choice}"]).data, "path")


@pytest.mark.parametrize(
    "model", [m if m == "splat" else pytest.param(m, marks=pytest.mark.slow) for m in _choices("model")]
)
def test_model_config_instantiates_the_module_and_binds_the_scene(model):
    from splatloss.lightning import SplatModule
    from splatloss.splat.synthetic import default_scene

    cfg = _compose([f"model={model}", "trainer.max_steps=50"])
    module = instantiate(cfg.model, loss=PhotometricLoss(l1=1.0))
    assert isinstance(module, SplatModule) and module.gaussians is None  # built from the scene's points
    assert module.lr_decay_steps == 50  # the run's length, through the config
    scene = default_scene(image_size=16, n_train=2, n_test=1, n_points=200, supersample=1, seed=0)
    module.bind_scene(scene)
    assert module.gaussians.num == 200
    assert module.lr["means"] == pytest.approx(cfg.model.lr.means * scene.extent)
    assert type(module.strategy).__name__ == "DensifyStrategy" and module.strategy.extent == pytest.approx(scene.extent)
    module.bind_scene(scene)  # once only: the rate is not scaled twice
    assert module.lr["means"] == pytest.approx(cfg.model.lr.means * scene.extent)
