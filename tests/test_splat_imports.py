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


def _private_imports(root, package="splatloss.splat"):
    """(file, line, name) of every import of an underscore module or name of ``package`` in the files under ``root``."""
    import ast
    from pathlib import Path

    found = []
    for path in sorted(Path(root).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package):
                parts = node.module.split(".") + [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                parts = [p for a in node.names if a.name.startswith(package) for p in a.name.split(".")]
            else:
                continue
            found += [(path.name, node.lineno, p) for p in parts if p.startswith("_") and not p.startswith("__")]
    return found


def test_splat_modules_import_only_public_names():
    """The readers and the renderer use the helpers other splat modules publish, never their private names."""
    import os

    import splatloss.splat

    assert _private_imports(os.path.dirname(splatloss.splat.__file__)) == []


def test_private_import_checker_sees_underscore_modules_and_names(tmp_path):
    (tmp_path / "a.py").write_text("from splatloss.splat.views import View, _read_image\n")
    (tmp_path / "b.py").write_text("def f():\n    from splatloss.splat import _composite_numba\n")
    assert sorted(_private_imports(tmp_path)) == [("a.py", 1, "_read_image"), ("b.py", 2, "_composite_numba")]
