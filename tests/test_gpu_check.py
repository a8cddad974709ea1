"""The GPU check is the test suite on CUDA (``pytest -m gpu``, docs/gpu_check.md): ``-m gpu`` selects
every Triton conformance case when a CUDA device is present."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_marker_selects_every_triton_conformance_case(tmp_path):
    """With CUDA present (faked here: collection only), ``-m gpu`` collects each conformance case
    parametrised with the Triton backend."""
    probe = tmp_path / "collect.py"
    probe.write_text(
        "import sys, torch\n"
        "torch.cuda.is_available = lambda: True\n"
        "import pytest\n"
        "sys.exit(pytest.main(sys.argv[1:]))\n"
    )

    def collect(marker):
        proc = subprocess.run(
            [
                sys.executable,
                str(probe),
                "--collect-only",
                "-q",
                "-m",
                marker,
                "-p",
                "no:cacheprovider",
                "tests/backends",
            ],
            cwd=ROOT,
            env=dict(os.environ, OMP_NUM_THREADS="1"),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return {ln for ln in proc.stdout.splitlines() if "::" in ln}

    gpu = collect("gpu")
    conformance = {n for n in collect("triton") if re.search(r"\[(.*-)?triton(-.*)?\]", n)}
    assert len(conformance) >= 90
    assert conformance <= gpu, sorted(conformance - gpu)[:10]
