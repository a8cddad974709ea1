"""The backend contract: names, objects, every entry point on every backend, the public API routing."""

import pytest
import torch

import splatloss
from conftest import CONFORMING, TOL, assert_rel, backend_cases, device_for, make_pair
from splatloss.config import SSIMConfig


def test_the_conformance_suite_runs_every_backend():
    """A backend added to splatloss.backends without joining the conformance suite fails here."""
    assert set(CONFORMING) == set(splatloss.backends.NAMES) - {"reference"}
    assert [splatloss.backends.get(n).name for n in splatloss.backends.NAMES] == list(splatloss.backends.NAMES)


def test_auto_picks_the_cpu_kernel_for_cpu_tensors_and_explains_why():
    x = torch.rand(1, 3, 16, 16)
    flags = splatloss.backends.available()
    assert flags["torch"] and flags["reference"] and isinstance(flags["triton"], bool)
    assert splatloss.backends.resolve("auto", x).name == ("cpu" if flags["cpu"] else "torch")
    for name in splatloss.backends.NAMES[:3]:
        assert splatloss.backends.resolve(name, x).name == name
    assert "cpu" in splatloss.backends.explain(x)


# Triton in the interpreter: every entry slow. The routing is one path for every backend (the fast
# tier's torch and cpu cases), and the fast tier runs Triton's map kernel in the conformance suite.
@pytest.mark.parametrize("backend,entry", backend_cases(["ssim_map", "ssim", "ms_ssim", "dssim_l1"]))
def test_public_api_runs_the_named_backend(backend, entry):
    """splatloss.<entry>(backend=name) gives what the backend object computes (bitwise: one path)."""
    dev = device_for(backend)
    x, y = make_pair((2, 3, 23, 24), seed=3, device=dev)
    b = splatloss.backends.get(backend)
    small = dict(window_size=3, sigma=0.8)
    cfg = SSIMConfig(**small)
    if entry == "ssim_map":
        got, direct = splatloss.ssim_map(x, y, backend=backend, **small), b.ssim_map(x, y, cfg)
    elif entry == "ssim":
        got = splatloss.ssim(x, y, backend=backend, reduction="none", **small)
        direct = b.ssim_mean(x, y, cfg).mean(dim=1)
        assert torch.equal(b.ssim_mean(x, y, cfg), b.ssim_stats(x, y, cfg)[0])  # its first output
    elif entry == "ms_ssim":
        w = (0.2, 0.3, 0.5)
        got = splatloss.ms_ssim(x, y, backend=backend, weights=w, reduction="none", **small)
        direct = b.ms_ssim(x, y, cfg, w)
    else:
        got = splatloss.dssim_l1(x, y, 0.2, backend=backend, reduction="none", **small)
        direct = b.dssim_l1(x, y, cfg, 0.2)
    assert torch.equal(got, direct)
    ref = getattr(splatloss, entry)
    kw = dict(reduction="none") if entry != "ssim_map" else {}
    if entry == "ms_ssim":
        kw["weights"] = (0.2, 0.3, 0.5)
    args = (0.2,) if entry == "dssim_l1" else ()
    truth = ref(x.double().cpu(), y.double().cpu(), *args, backend="reference", **small, **kw)
    assert_rel(got, truth, TOL[backend]["ms_values" if entry == "ms_ssim" else "map"], entry)
