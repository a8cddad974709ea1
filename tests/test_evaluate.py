"""Evaluation without training (``scripts/eval.py``, ``splatloss-eval``) on a tiny real run: the run's
saved configuration is recomposed, the PSNR equals the run's own metrics.json, and a bad checkpoint,
missing LPIPS weights or a checkpoint outside a run folder stop before anything is written."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from splatloss.evaluate import compose_config, evaluate, main

pytestmark = pytest.mark.slow  # a training run in a fresh process, then evaluations of it

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [
    "data.scene.image_size=32",
    "data.scene.n_train=4",
    "data.scene.n_test=3",
    "data.scene.n_points=300",
    "data.scene.supersample=1",
    "trainer.max_steps=15",
    "~logger",
    "export_ply=false",
]
KEYS = ("psnr", "ssim", "ssim_3dgs", "ssim_skimage", "ms_ssim")


def _env():
    return {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("eval") / "run"
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "train.py"), *TINY, f"hydra.run.dir={run}"]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (run / ".hydra" / "config.yaml").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    return run


def _copy(run_dir, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(run_dir, dst)
    return dst


def test_eval_script_gives_the_runs_own_metrics(run_dir, tmp_path):
    # From another folder, as a user would; the run's data (the generated scene) is rebuilt from its config.
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "eval.py"), f"ckpt_path={ckpt}", f"output_dir={tmp_path}/ev"]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "held-out PSNR" in proc.stdout and "Tip" not in proc.stdout + proc.stderr
    ours = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    theirs = json.loads((run_dir / "metrics.json").read_text())
    for key in KEYS:
        assert ours[key] == theirs[key], (key, ours[key], theirs[key])
    assert ours["num_views"] == 3 and ours["step"] == 15 and ours["checkpoint"] == str(ckpt)
    assert sorted(os.listdir(tmp_path / "ev" / "renders")) == ["test_000.png", "test_001.png", "test_002.png"]


def test_eval_of_a_moved_run_folder_writes_into_its_eval_folder(run_dir, tmp_path):
    run = _copy(run_dir, tmp_path)
    metrics = evaluate(compose_config([f"ckpt_path={run}/checkpoints/last.ckpt"]))
    assert metrics["psnr"] == json.loads((run_dir / "metrics.json").read_text())["psnr"]
    assert json.loads((run / "eval" / "metrics.json").read_text())["psnr"] == metrics["psnr"]
    assert metrics["run_dir"] == str(run)


def test_truncated_checkpoint_is_named_before_anything_is_written(run_dir, tmp_path):
    run = _copy(run_dir, tmp_path)
    bad = run / "checkpoints" / "cut.ckpt"
    raw = (run / "checkpoints" / "last.ckpt").read_bytes()
    bad.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match=rf"the checkpoint '{bad}' cannot be read \(.*\); it is truncated"):
        evaluate(compose_config([f"ckpt_path={bad}"]))
    assert not (run / "eval").exists()
    with pytest.raises(ValueError, match=rf"ckpt_path '{run}/checkpoints/none.ckpt' does not exist"):
        evaluate(compose_config([f"ckpt_path={run}/checkpoints/none.ckpt"]))
    # a run folder where its checkpoint was meant: named as a folder, with the file it holds
    with pytest.raises(
        ValueError, match=rf"ckpt_path '{run}' is a folder, not a checkpoint file; .*'{run}/checkpoints/last.ckpt'"
    ):
        evaluate(compose_config([f"ckpt_path={run}"]))
    assert not (run / "eval").exists()


def test_checkpoint_of_another_sh_degree_is_refused(run_dir, tmp_path):
    run = _copy(run_dir, tmp_path)
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    n = ckpt["state_dict"]["gaussians.means"].shape[0]
    ckpt["state_dict"]["gaussians.sh_rest"] = torch.zeros(n, 15, 3)
    other = run / "checkpoints" / "sh3.ckpt"
    torch.save(ckpt, other)
    with pytest.raises(
        ValueError,
        match=rf"the checkpoint '{other}' does not fit the run's configuration \(gaussians.sh_rest: checkpoint "
        rf"\({n}, 15, 3\), configuration absent\)",
    ):
        evaluate(compose_config([f"ckpt_path={other}"]))
    assert not (run / "eval").exists()


def test_checkpoint_outside_a_run_folder(run_dir, tmp_path):
    lone = tmp_path / "a" / "b" / "c" / "d" / "e" / "last.ckpt"
    lone.parent.mkdir(parents=True)
    shutil.copy(run_dir / "checkpoints" / "last.ckpt", lone)
    with pytest.raises(ValueError, match=rf"no run configuration \(.hydra/config.yaml\) .* checkpoint '{lone}'"):
        evaluate(compose_config([f"ckpt_path={lone}"]))


def test_lpips_needs_local_weights_and_says_which(run_dir, tmp_path):
    run = _copy(run_dir, tmp_path)
    ckpt = f"ckpt_path={run}/checkpoints/last.ckpt"
    with pytest.raises(
        ValueError, match=r"needs the backbone's ImageNet weights alexnet-owt-7be5be79.pth on this machine \(nothing"
    ):
        evaluate(compose_config([ckpt, "metrics.lpips=true"]))
    with pytest.raises(ValueError, match=rf"metrics.lpips_backbone: the LPIPS weights file '{tmp_path}/vgg.pth' does"):
        evaluate(
            compose_config(
                [ckpt, "metrics.lpips=true", "metrics.lpips_net=vgg", f"metrics.lpips_backbone={tmp_path}/vgg.pth"]
            )
        )  # noqa: E501
    assert not (run / "eval").exists()


def test_lpips_with_weights_on_disk(run_dir, tmp_path):
    from splatloss.splat.lpips import LPIPS

    pytest.importorskip("torchmetrics")  # ships LPIPS's linear layers, the default metrics.lpips_linear
    torch.manual_seed(0)
    net = LPIPS("alex")
    for p in net.features.parameters():
        p.data.normal_(0, 0.05)  # stand-in backbone weights: the file format is torchvision's
    torch.save({f"features.{k}": v for k, v in net.features.state_dict().items()}, tmp_path / "alex.pth")
    run = _copy(run_dir, tmp_path)
    m = evaluate(
        compose_config(
            [
                f"ckpt_path={run}/checkpoints/last.ckpt",
                "metrics.lpips=true",
                f"metrics.lpips_backbone={tmp_path}/alex.pth",
            ]
        )
    )  # noqa: E501
    assert m["lpips_net"] == "alex" and 0 < m["lpips"] < 1


def test_render_traj_writes_a_video(run_dir, tmp_path):
    from PIL import Image

    from splatloss.splat.trajectory import video_format

    run = _copy(run_dir, tmp_path)
    with pytest.raises(ValueError, match="camera_path: n_frames must be an integer >= 2, got 1"):
        evaluate(compose_config([f"ckpt_path={run}/checkpoints/last.ckpt", "render_traj=true", "traj.n_frames=1"]))
    with pytest.raises(ValueError, match="traj.fps must be a number > 0, got 0"):
        evaluate(compose_config([f"ckpt_path={run}/checkpoints/last.ckpt", "render_traj=true", "traj.fps=0"]))
    assert not (run / "eval").exists()
    m = evaluate(compose_config([f"ckpt_path={run}/checkpoints/last.ckpt", "render_traj=true", "traj.n_frames=6"]))
    assert m["trajectory"] == str(run / "eval" / f"traj.{video_format()}")
    if video_format() == "gif":
        with Image.open(m["trajectory"]) as im:
            assert im.n_frames == 6 and im.size == (32, 32)


def test_an_evaluation_folder_that_cannot_be_written_stops_before_anything_runs(run_dir, tmp_path):
    run = _copy(run_dir, tmp_path)
    (tmp_path / "taken").write_text("a file where the evaluation would make its folder")
    out = tmp_path / "taken" / "eval"
    message = (
        rf"cannot write the evaluation \(metrics.json, renders\) to '{out}': '{tmp_path / 'taken'}' is a file, not a "
        r"folder; move it away or choose another output_dir=<folder>"
    )
    with pytest.raises(ValueError, match=message):
        evaluate(compose_config([f"ckpt_path={run}/checkpoints/last.ckpt", f"output_dir={out}"]))
    assert not (run / "eval").exists()


def test_main_returns_none_for_the_console_script(run_dir, tmp_path, capsys):
    # The console script calls sys.exit(main()): anything but None (or an int) would be printed and exit 1.
    assert main([f"ckpt_path={run_dir}/checkpoints/last.ckpt", f"output_dir={tmp_path}"]) is None
    assert "held-out PSNR" in capsys.readouterr().out


def test_help_and_bad_override(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and "ckpt_path=RUN/checkpoints/last.ckpt" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["ckpt_path=x.ckpt", "nope=1"])
    assert e.value.code == 2 and "splatloss-eval: error:" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2 and "ckpt_path" in capsys.readouterr().err


def test_gpu_accelerator_without_a_gpu(run_dir, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    run = _copy(run_dir, tmp_path)
    with pytest.raises(ValueError, match=r"accelerator=gpu .* asks for a CUDA GPU, but torch sees none here; .*cpu"):
        evaluate(compose_config([f"ckpt_path={run}/checkpoints/last.ckpt", "accelerator=gpu"]))
    assert not (run / "eval").exists()


def test_run_on_a_dataset_given_by_a_relative_path_and_moved_later(tmp_path):
    """data.path relative to the folder training started in; after the dataset moves, data_path= finds it."""
    from _scene_files import scene_to_colmap

    from splatloss.splat.scenes import default_scene

    scene = default_scene(image_size=32, n_train=6, n_test=2, n_points=200, supersample=1)
    scene_to_colmap(scene, str(tmp_path / "data" / "box"))
    run = tmp_path / "run"
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "train.py"), "data=colmap", "data.path=data/box"]
    cmd += ["data.scene.test_every=4", "trainer.max_steps=10", "~logger", "export_ply=false", f"hydra.run.dir={run}"]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    psnr = json.loads((run / "metrics.json").read_text())["psnr"]
    assert evaluate(compose_config([f"ckpt_path={run}/checkpoints/last.ckpt"]))["psnr"] == psnr
    shutil.move(tmp_path / "data", tmp_path / "moved")
    with pytest.raises(
        ValueError, match=r"the run's dataset '.*data/box' \(data.path in .*config.yaml'\) does not exist"
    ):
        evaluate(compose_config([f"ckpt_path={run}/checkpoints/last.ckpt"]))
    m = evaluate(compose_config([f"ckpt_path={run}/checkpoints/last.ckpt", f"data_path={tmp_path}/moved/box"]))
    assert m["psnr"] == psnr and m["num_views"] == 2  # 8 images, every 4th held out


def test_metrics_json_says_it_is_an_evaluation(run_dir, tmp_path):
    # splatloss-report tells an evaluation from a run by this key, and joins it to the run it evaluated.
    m = evaluate(compose_config([f"ckpt_path={run_dir}/checkpoints/last.ckpt", f"output_dir={tmp_path}/ev"]))
    assert m["record"] == "evaluation" and "steps" not in m
    assert json.loads((tmp_path / "ev" / "metrics.json").read_text())["record"] == "evaluation"


def test_output_dir_that_is_the_run_folder_is_refused(run_dir, tmp_path):
    run = _copy(run_dir, tmp_path)
    before = (run / "metrics.json").read_text()
    with pytest.raises(ValueError, match=r"output_dir='.*run' is the run folder itself: its metrics.json is the run's"):
        evaluate(compose_config([f"ckpt_path={run}/checkpoints/last.ckpt", f"output_dir={run}"]))
    assert (run / "metrics.json").read_text() == before
