"""``python scripts/train.py --help`` lists what a newcomer can choose: every group's choices with one
line each, the losses with their formula and source, the common keys, examples; bases that exist
only to be extended are not choices; Hydra's own help stays reachable."""

import contextlib
import glob
import io
import os
import subprocess
import sys

import pytest
from test_train import ROOT

from splatloss.train import CONFIG_DIR, help_text, main

SCRIPT = os.path.join(ROOT, "scripts", "train.py")


def _run(*args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture(scope="module")
def shown():
    """What ``scripts/train.py --help`` prints, from ``main()`` in this process under the script's
    argv (a subprocess would import torch and Lightning again; the script itself runs in
    ``test_the_script_prints_the_help_and_keeps_hydras_help``)."""
    argv, out = sys.argv, io.StringIO()
    sys.argv = [SCRIPT, "--help"]
    try:
        with contextlib.redirect_stdout(out):
            assert main() is None
    finally:
        sys.argv = argv
    return out.getvalue()


def _choice_lines(text, group):
    block = text.split(f"\n  {group}: ", 1)[1].split("\n\n", 1)[0]
    return {line.split()[0].lstrip("*"): line for line in block.splitlines()[1:]}


@pytest.mark.parametrize("group", ["loss", "data", "model", "trainer", "logger", "experiment", "hydra/launcher"])
def test_every_choice_of_every_group_has_one_line(shown, group):
    on_disk = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(CONFIG_DIR, group, "*.yaml")))
    choices = [n for n in on_disk if not n.startswith("_")]
    lines = _choice_lines(shown, group)
    assert sorted(lines) == choices  # loss/_ssim and data/_files are bases, not choices
    for name, line in lines.items():
        assert len(line.split(None, 1)[1]) > 20, line  # a description, not just the name


def test_losses_show_their_formula_and_source(shown):
    lines = _choice_lines(shown, "loss")
    expect = {
        "dssim_l1": ["(1 - lambda_dssim) L1 + lambda_dssim (1 - SSIM)", "Kerbl et al. 2023"],
        "l1": ["mean |pred - target|"],
        "l2": ["mean (pred - target)^2"],
        "ssim": ["1 - SSIM", "Wang et al. 2004"],
        "msssim": ["1 - MS-SSIM", "Wang et al. 2003"],
        "msssim_l1": ["alpha (1 - MS-SSIM) + (1 - alpha) L1", "Zhao et al. 2017"],
        "zhao_mix": ["alpha (1 - MS-SSIM) + (1 - alpha) G_sigma * L1", "Zhao et al. 2017"],
    }
    for name, parts in expect.items():
        for part in parts:
            assert part in lines[name], (name, part, lines[name])
    assert lines["dssim_l1"].lstrip().startswith("*")  # the default is marked


@pytest.mark.slow
def test_the_script_prints_the_help_and_keeps_hydras_help(shown):
    proc = _run("--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == shown
    hydra = _run("--hydra-help")
    assert hydra.returncode == 0 and "Hydra (" in hydra.stdout and "--multirun" in hydra.stdout, hydra.stdout[:500]


def test_help_names_the_common_keys_and_an_example(shown):
    for key in ("seed=", "trainer.max_steps=", "data.path=", "resume=true", "resume=latest", "ckpt_path=",
                "resume_allow_changes=", "hydra.run.dir=", "--hydra-help", "Examples:"):  # fmt: skip
        assert key in shown, key
    assert "python scripts/train.py -m loss=l1,dssim_l1,msssim_l1 seed=0,1,2" in shown
    assert help_text("splatloss-train").startswith("splatloss-train: train 3D Gaussians")
