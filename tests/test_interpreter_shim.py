"""The quicker Triton interpreter of the test run (conftest.py at the repository root) computes what
the interpreter itself computes: every Triton kernel family launched both ways, results compared bit
for bit. Without a CUDA device the whole Triton part of the suite runs through it."""

import pytest
import torch

import splatloss

pytestmark = [pytest.mark.triton, pytest.mark.slow]


def _switch(config):
    for plugin in config.pluginmanager.get_plugins():
        switch = getattr(plugin, "quicker_triton_interpreter", None)
        if switch is not None:
            return switch
    raise AssertionError("the root conftest.py's quicker_triton_interpreter is not loaded")


def _every_kernel_family():
    """Values and gradients of the forward, backward (one launch and two), masked (one launch and two)
    and downsampling kernels."""
    g = torch.Generator().manual_seed(3)
    x = torch.rand(1, 2, 17, 19, generator=g)
    y = (0.7 * x + 0.3 * torch.rand(1, 2, 17, 19, generator=g)).requires_grad_(True)
    x = x.requires_grad_(True)
    mask = (torch.rand(1, 1, 17, 19, generator=g) > 0.3).float()
    out = [
        splatloss.ssim(x, y, backend="triton", padding="same", reduction="none"),
        splatloss.ms_ssim(x, y, backend="triton", window_size=3, weights=(0.5, 0.5), padding="valid"),
        splatloss.ssim(x, y, backend="triton", mask=mask, padding="reflect", window_size=5),
        # one gradient under zero padding: the backward's two lean launches (moments, adjoint)
        splatloss.dssim_l1(x, y.detach(), backend="triton", padding="valid", window_size=5),
        # and masked: the masked backward's two lean launches (masked moments, adjoint)
        splatloss.dssim_l1(x, y.detach(), backend="triton", mask=mask, padding="same", window_size=5),
    ]
    grads = torch.autograd.grad(sum(o.sum() for o in out), (x, y))
    return [o.detach() for o in out] + list(grads)


def test_kernels_give_the_plain_interpreters_bits(request):
    switch = _switch(request.config)
    if not switch(True):
        pytest.skip("the quicker interpreter applies to Triton 3.7.1 in the interpreter only")
    from triton.runtime import interpreter

    def in_place():
        return (
            interpreter._patch_lang.__name__,
            interpreter._get_np_dtype.__name__,
            interpreter.GridExecutor.__call__.__name__,
            interpreter.interpreter_builder.options.sanitize_overflow,
            "binary_op_type_checking_impl" in vars(interpreter.interpreter_semantic),
            interpreter.interpreter_builder.get_block_ty.__name__,
            interpreter.tl.block_type.with_element_ty.__name__,
            interpreter.tl.tensor.__init__.__name__,
        )

    try:
        assert in_place() == (
            "quick_patch_lang",
            "quick_np_dtype",
            "quick_grid_call",
            False,
            True,
            "quick_get_block_ty",
            "quick_with_element_ty",
            "quick_tensor_init",
        )
        quick = _every_kernel_family()
        assert not switch(False)
        # the plain interpreter, its int32 overflow sanitiser on, runs every kernel family
        assert in_place() == (
            "_patch_lang",
            "_get_np_dtype",
            "__call__",
            True,
            False,
            "get_block_ty",
            "with_element_ty",
            "__init__",
        )
        plain = _every_kernel_family()
    finally:
        switch(True)
    assert len(quick) == len(plain) == 7
    for q, p in zip(quick, plain):
        assert torch.equal(q, p)
