"""Importing splatloss.lightning without the train extra names the install command."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("missing", ["lightning", "hydra"])
@pytest.mark.slow
def test_lightning_without_train_extra_names_the_install_command(missing):
    # sys.modules[name] = None makes `import name` raise ImportError, as if the package were absent.
    code = f"import sys; sys.modules[{missing!r}] = None\nimport splatloss.lightning"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: splatloss.lightning needs the training dependencies")
    assert missing in last and "pip install 'splatloss[train]'" in last


@pytest.mark.slow
def test_core_import_stays_light():
    code = "import sys, splatloss; print(sorted(m for m in ('lightning', 'hydra', 'gsplat') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
