"""scripts/gpu_check.py: its tolerances are the suite's, its CPU self-test passes under Triton's
interpreter and writes the JSON it documents, a wrong Triton backend fails it, and ``-m gpu``
selects every Triton conformance case on a CUDA machine."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import LOWP_GRAD_ULPS, MAP_ATOL_FP32, TOL, ULP

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(tmp_path, *args, timeout=600):
    out = tmp_path / "gpu_check.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TRITON_INTERPRET", None)  # the script sets it itself when it runs on the CPU
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--json", str(out), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    report = json.loads(out.read_text()) if out.exists() else None
    return proc, report


def test_tolerances_are_the_test_suites():
    gc = _load("gpu_check", SCRIPT)
    masks = _load("_test_masks", ROOT / "tests" / "backends" / "test_masks.py")
    assert gc.TOL == TOL["triton"]
    assert gc.MAP_GRAD_ATOL == MAP_ATOL_FP32["grads"]
    assert gc.MASK_TOL == {"values": masks.VALUE_TOL, "grads": masks.GRAD_TOL}
    assert gc.LOWP_GRAD_ULPS == LOWP_GRAD_ULPS["triton"]
    assert gc.ULP == ULP


def test_full_plan_covers_what_it_promises():
    gc = _load("gpu_check", SCRIPT)
    specs = gc.plan(small=False)
    names = [s.name for s in specs]
    assert len(names) == len(set(names)), "check names must be unique (they key the JSON)"
    ssim = [s for s in specs if s.op == "ssim" and s.dtype == "fp32" and s.layout == "contiguous" and not s.mask]
    assert {(s.window_size, s.padding) for s in ssim} >= {(w, p) for w in range(3, 32, 2) for p in gc.PADDINGS}
    assert {s.shape for s in ssim} >= {gc.FRAME, (4, 3, 256, 256), (1, 3, 37, 53)}
    assert {s.dtype for s in specs} == {"fp32", "fp16", "bf16"}
    assert {s.layout for s in specs} == {"contiguous", "channels_last", "hwc_view", "strided"}
    assert {s.op for s in specs} == {"ssim", "ssim_map", "ms_ssim", "dssim_l1", "dssim_with_gradient", "photometric"}
    assert {s.mask for s in specs} == {None, "soft", "bool"}
    frame = [s for s in specs if s.shape == gc.FRAME]
    assert {s.op for s in frame} >= {"ssim", "ms_ssim", "dssim_l1", "dssim_with_gradient"}


@pytest.fixture(scope="module")
def self_test(tmp_path_factory):
    proc, report = _run(tmp_path_factory.mktemp("self_test"), "--self-test")
    assert report is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, report


@pytest.mark.slow
@pytest.mark.triton
def test_self_test_writes_the_documented_json(self_test):
    proc, r = self_test
    assert set(r) >= {
        "schema",
        "ok",
        "mode",
        "device",
        "versions",
        "tolerances",
        "summary",
        "failed",
        "checks",
        "timings",
    }
    assert r["mode"] == "small" and r["device"]["type"] in ("cpu", "cuda")
    assert r["device"]["interpreter"] == (r["device"]["type"] == "cpu")
    assert set(r["versions"]) >= {"python", "torch", "triton", "cuda", "splatloss", "pytorch_msssim", "fused_ssim"}
    groups = {c["group"] for c in r["checks"].values()}
    assert groups >= {"windows", "shapes", "dtypes", "layouts", "ms_ssim", "dssim_l1", "dssim_with_gradient"}
    assert groups >= {"masks", "photometric", "range", "determinism"}
    for name, c in r["checks"].items():
        assert isinstance(c["passed"], bool), name
        assert c["measures"] and "error" not in c, (name, c.get("error"))
        for m in c["measures"]:
            assert {"what", "metric", "error", "tol", "passed"} <= set(m), name
            assert m["passed"] == (m["error"] <= m["tol"]), (name, m)
        assert c["passed"] == all(m["passed"] for m in c["measures"]), name
    assert r["failed"] == [n for n, c in r["checks"].items() if not c["passed"]]
    assert r["ok"] == (not r["failed"]) and proc.returncode == (0 if r["ok"] else 1)
    assert f"{r['summary']['passed']} checks passed, {r['summary']['failed']} failed" in proc.stdout
    t = r["timings"]
    assert t["rows"] and all(row["ms"] > 0 for row in t["rows"])
    if r["device"]["type"] == "cpu":  # the interpreter is no benchmark: Triton's rows say why they are missing
        assert "splatloss-triton" in t["skipped"]


@pytest.mark.slow
@pytest.mark.triton
def test_self_test_checks_pass(self_test):
    proc, r = self_test
    assert proc.returncode == 0 and r["ok"], {n: r["checks"][n] for n in r["failed"]}


@pytest.mark.slow
@pytest.mark.triton
def test_a_wrong_triton_backend_fails_the_run(tmp_path):
    only = "^windows/ssim/1x3x24x40/same/w11/"
    proc, r = _run(tmp_path, "--self-test", "--no-timing", "--only", only)
    assert proc.returncode == 0 and r["ok"] and len(r["checks"]) == 1, proc.stdout[-2000:]
    # every Triton result 0.1 % off: values and gradients beyond 1e-5, the run fails and names the check
    proc, r = _run(tmp_path, "--self-test", "--no-timing", "--only", only, "--inject-error", "1e-3")
    assert proc.returncode == 1 and not r["ok"] and r["injected_error"] == 1e-3
    (name,) = r["failed"]
    assert name.startswith("windows/ssim/1x3x24x40/same/w11/") and f"FAILED {name}" in proc.stdout
    bad = {m["what"] for m in r["checks"][name]["measures"] if not m["passed"]}
    assert bad == {"value", "grad img1", "grad img2"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
@pytest.mark.parametrize(
    "args,message",
    [
        (("--device", "cuda"), "--device cuda asked for, but torch sees no CUDA device; use --self-test"),
        ((), "no CUDA device here (or --device cpu): the full check needs a GPU; run --self-test"),
    ],
)
@pytest.mark.slow
def test_full_check_without_cuda_is_a_clear_error(tmp_path, args, message):
    proc, r = _run(tmp_path, *args, timeout=120)
    assert proc.returncode != 0 and r is None
    assert message in proc.stderr


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
