"""Launcher defects of the Triton backend that show on real hardware, each checked where it can fail
without a GPU: the device guard, the ROCm launch options, the fake (meta) gradient strides under
torch.compile, and empty batches."""

import contextlib
import os

import pytest
import torch

import splatloss
from splatloss.backends.triton import _common

pytestmark = pytest.mark.triton


def test_launch_options_pass_maxnreg_only_on_nvidia():
    # Triton's HIP backend rejects maxnreg: every launch on ROCm would fail with it
    assert _common.launch_options(8, hip=True) == {"num_warps": 8}
    assert _common.launch_options(8, hip=False) == {"num_warps": 8, "maxnreg": _common.MAXNREG}
    # this torch is not a ROCm build: the default is the NVIDIA set
    assert _common.launch_options(4) == {"num_warps": 4, "maxnreg": _common.MAXNREG}


def test_device_guard_selects_the_tensors_cuda_device():
    # Triton launches on the current device: the guard must switch to the tensor's own index
    cpu = torch.zeros(1)
    assert isinstance(_common.device_guard(cpu), contextlib.nullcontext)
    # the guard object for a cuda:1 tensor is built without touching CUDA (entering it would)
    guard = torch.cuda.device(torch.device("cuda", 1))
    assert guard.idx == 1
    with _common.device_guard(cpu):  # the interpreter path runs through the same helper
        pass


def test_launchers_enter_the_device_guard(monkeypatch):
    # every launcher goes through device_guard with the tensor it launches on (real kernels run)
    from splatloss.backends.triton import ms_ssim, ssim

    seen = []
    real = _common.device_guard

    def recording(t):
        seen.append(t.device)
        return real(t)

    monkeypatch.setattr(ssim, "device_guard", recording)
    monkeypatch.setattr(ms_ssim, "device_guard", recording)
    x = torch.rand(1, 1, 12, 12, requires_grad=True)
    y = torch.rand(1, 1, 12, 12)
    splatloss.ssim(x, y, window_size=3, backend="triton").backward()
    assert len(seen) == 2 and all(d == x.device for d in seen)  # forward and backward launches


@pytest.mark.parametrize("shape", [(0, 3, 12, 12), (2, 0, 12, 12)])
def test_empty_batch_or_channels_is_a_clear_error(shape):
    # The Triton backend's own check (the public functions refuse zero channels before dispatch,
    # tests/test_numerics.py; an empty batch reaches the backend).
    from splatloss.backends import get
    from splatloss.config import SSIMConfig

    triton_backend, cfg = get("triton"), SSIMConfig(window_size=3)
    x = torch.rand(shape)
    with pytest.raises(ValueError, match="at least one image and one channel, got shape"):
        triton_backend.ssim_stats(x, x.clone(), cfg)
    with pytest.raises(ValueError, match="at least one image and one channel, got shape"):
        triton_backend.dssim_l1(x, x.clone(), cfg, 0.2)
    if shape[0] == 0:
        with pytest.raises(ValueError, match="at least one image and one channel, got shape"):
            splatloss.ssim(x, x.clone(), window_size=3, backend="triton")


@pytest.mark.parametrize("op", ["triton_ssim_stats_bwd", "triton_dssim_l1_bwd"])
def test_fake_gradient_strides_match_the_real_ones(op):
    # contiguous img1, channels-last img2, both gradients: the real op gives img2's gradient
    # img1's strides; the fake one must say the same or torch.compile's stride check fails
    from torch._subclasses.fake_tensor import FakeTensorMode

    from splatloss.backends.triton import dssim_l1 as _dl1_mod  # noqa: F401
    from splatloss.backends.triton import ssim as _ssim_mod  # noqa: F401  (registers the ops)

    x = torch.rand(1, 3, 12, 12)
    y = torch.rand(1, 3, 12, 12).to(memory_format=torch.channels_last)
    w = torch.tensor([0.25, 0.5, 0.25])
    g = torch.ones(1, 3) if op == "triton_ssim_stats_bwd" else torch.ones(1)
    args = (
        (g, g, x, y, w, "same", 1e-4, 9e-4, 0.0, True, True)
        if op == "triton_ssim_stats_bwd"
        else (g, x, y, w, "same", 1e-4, 9e-4, 0.0, 0.2, True, True)
    )
    fn = getattr(torch.ops.splatloss, op)
    real = fn(*args)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = fn(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
    assert [t.stride() for t in fake] == [t.stride() for t in real]
    assert real[1].stride() == x.stride()


def test_size_arguments_are_not_specialised():
    # compiled (not interpreted) kernels: sizes equal to 1 or multiples of 16 must not select new
    # variants; checked in a fresh interpreter-free process, where triton.jit keeps the flags
    import subprocess
    import sys

    code = (
        "from splatloss.backends.triton import ssim\n"
        "for k in (ssim._ssim_fwd_kernel, ssim._ssim_bwd_kernel):\n"
        "    print(','.join(p.name for p in k.params if p.do_not_specialize))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    sizes = "BC,C,H,W,Ho,Wo,n_chunks,n_strips,ROWS"
    assert out.split() == [sizes, sizes]
