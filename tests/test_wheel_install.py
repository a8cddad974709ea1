"""The wheel ships the Hydra configs and trains from any directory once installed.

Builds the wheel from a copy of the source tree (no build isolation, nothing downloaded), installs it
without dependencies into a temporary folder, and trains 20 steps from another working directory with
that folder first on PYTHONPATH, through the console script and through ``python -m splatloss.train``.
"""

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.egg-info")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(os.path.join(ROOT, name), src / name)
    for name in ("splatloss", "configs"):
        shutil.copytree(os.path.join(ROOT, name), src / name, ignore=IGNORE)
    dist = base / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    subprocess.run(
        pip + ["wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(dist), str(src)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    (wheel,) = list(dist.glob("splatloss-*.whl"))
    target = base / "site"
    subprocess.run(
        pip + ["install", "--no-deps", "--no-index", "-q", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return wheel, target


def _env(target):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(target)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@pytest.mark.slow
def test_wheel_contains_the_configs(installed):
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    repo_configs = {
        os.path.relpath(os.path.join(d, f), ROOT).replace(os.sep, "/")
        for d, _, files in os.walk(os.path.join(ROOT, "configs"))
        for f in files
        if f.endswith(".yaml")
    }
    assert repo_configs and {"splatloss/" + n for n in repo_configs} <= names
    entry_points = (
        zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    )
    assert "splatloss-train = splatloss.train:main" in entry_points
    assert "splatloss-eval = splatloss.evaluate:main" in entry_points
    assert "splatloss-report = splatloss.report:main" in entry_points


def _check_run(cwd, proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = [os.path.join(d, "metrics.json") for d, _, files in os.walk(cwd / "outputs") if "metrics.json" in files]
    assert len(found) == 1, found
    metrics = json.load(open(found[0]))
    assert metrics["steps"] == 20 and metrics["loss_name"] == "dssim_l1"
    assert os.path.isdir(os.path.join(os.path.dirname(found[0]), "renders", "final"))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["console_script", "module"])
def test_installed_wheel_trains_from_another_directory(installed, tmp_path, how):
    _, target = installed
    env = _env(target)
    where = subprocess.run(
        [sys.executable, "-c", "import splatloss.train as t; print(t.__file__); print(t.CONFIG_DIR)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout.split()
    # The installed copy is imported, with the configs shipped inside it (not the repository's).
    assert where[0].startswith(str(target)) and where[1] == os.path.join(str(target), "splatloss", "configs")
    cmd = (
        [str(target / "bin" / "splatloss-train")]
        if how == "console_script"
        else [sys.executable, "-m", "splatloss.train"]
    )
    args = ["loss=dssim_l1", "trainer.max_steps=20", "export_ply=false", "num_threads=1"]
    proc = subprocess.run(cmd + args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    _check_run(tmp_path, proc)
