"""What a backend refuses, and how it says so: the message names what came, what was expected, the fix."""

import os

import pytest
import torch

import splatloss
from conftest import has_cuda, make_pair
from splatloss.config import SSIMConfig

pytestmark = pytest.mark.triton


def _tri():
    return splatloss.backends.get("triton")


def _dev():
    return "cuda" if has_cuda() else "cpu"


@pytest.mark.parametrize("entry", ["ssim", "ssim_map", "ms_ssim", "dssim_l1"])
def test_triton_refuses_float64_through_the_public_api(entry):
    x, y = make_pair((1, 1, 24, 24), torch.float64, device=_dev())
    kw = dict(window_size=3, weights=(0.5, 0.5)) if entry == "ms_ssim" else {}
    with pytest.raises(TypeError, match=r"takes float32, float16 or bfloat16 images, got torch.float64; use backend="):
        getattr(splatloss, entry)(x, y, backend="triton", **kw)


@pytest.mark.slow  # runs the kernels, forward and backward, in the interpreter where no GPU is present
def test_triton_backend_object_errors_name_what_was_expected():
    x, y = make_pair((1, 1, 20, 20), device=_dev())
    tri = _tri()
    with pytest.raises(TypeError, match=r"takes float32, float16 or bfloat16 images, got torch.float64"):
        tri.ssim_stats(x.double(), y.double(), SSIMConfig())
    with pytest.raises(ValueError, match=r"supports window_size <= 31 .*got 33; use backend='torch'"):
        tri.ssim_stats(x, y, SSIMConfig(window_size=33, padding="same"))
    with pytest.raises(ValueError, match=r"must be at least 11x11 .*got 20x9"):
        tri.ssim_stats(x[..., :9], y[..., :9], SSIMConfig())
    # second derivatives are not implemented: a gradient asked for with create_graph=True is refused,
    # never returned without its graph (which would differentiate as a silent zero)
    xr = x.clone().requires_grad_(True)
    with pytest.raises(ValueError, match=r"triton backend's .+ has no second derivative"):
        torch.autograd.grad(tri.ssim_stats(xr, y, SSIMConfig())[0].sum(), [xr], create_graph=True)
    with pytest.raises(ValueError, match=r"does not support torch.func transforms .*use backend='torch'"):
        torch.func.grad(lambda a: tri.ssim_stats(a, y, SSIMConfig())[0].sum())(x)


@pytest.mark.skipif(has_cuda(), reason="on a CUDA machine CPU tensors are the other error's case")
def test_triton_on_cpu_tensors_needs_the_interpreter(monkeypatch):
    x, y = make_pair((1, 1, 20, 20))
    monkeypatch.setitem(os.environ, "TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match=r"needs CUDA tensors, got a tensor on cpu; set TRITON_INTERPRET=1"):
        _tri().ssim_map(x, y, SSIMConfig())


def test_unknown_backend_name_lists_the_choices():
    x, y = make_pair((1, 1, 20, 20))
    with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'reference', 'torch', 'cpu', 'triton'\)"):
        splatloss.ssim(x, y, backend="numba")
    with pytest.raises(ValueError, match=r"numba"):
        splatloss.backends.get("numba")
