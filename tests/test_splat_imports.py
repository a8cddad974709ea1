"""splatloss.splat without the train extra: one ImportError naming the install command; the split
modules keep every old import path working."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("missing", ["gsplat", "skimage", "numba"])
@pytest.mark.slow
def test_import_without_train_extra_names_the_install_command(missing):
    # A None entry in sys.modules makes `import <missing>` fail exactly like an absent package.
    code = f"import sys; sys.modules[{missing!r}] = None\nimport splatloss.splat"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr
    assert "pip install 'splatloss[train]'" in proc.stderr
    assert missing in proc.stderr.splitlines()[-1]


def test_split_modules_reexported_from_scenes():
    from splatloss.splat import blender, colmap, scenes, synthetic, views

    assert scenes.View is views.View and scenes.SceneData is views.SceneData
    assert scenes.ViewDataset is views.ViewDataset and scenes.look_at is views.look_at
    assert scenes.default_scene is synthetic.default_scene
    assert scenes.load_blender is blender.load_blender and scenes.load_colmap is colmap.load_colmap
