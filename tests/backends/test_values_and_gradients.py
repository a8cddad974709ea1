"""Every backend against float64 truth, in one suite: each entry point of the backend contract, its
values and the gradients to both images under random upstreams, over paddings, dtypes and masks.

The truth is ``tests/_mask_truth.py``: plain float64 torch ops, no splatloss code, full 2-D filters
instead of the library's separable ones. Without a mask it is the unmasked SSIM (an all-ones mask;
``tests/test_mask_truth.py`` checks it against scikit-image and TF), so masked and unmasked calls are
held to one definition. It runs on the very values a backend saw (fp32 / fp16 / bf16 inputs are exact
in float64), so each check measures the backend's own error.

Entry points (``splatloss.backends.base.Backend``): ``map`` (SSIM and cs maps), ``stats`` (SSIM and cs
means per channel), ``mean`` (the SSIM mean alone, which Triton computes with its own kernels),
``dssim_l1`` (the fused L1 + D-SSIM), ``ms_ssim`` (three scales, 3-tap window: small images reach the
coarsest scale) and ``mean_and_grad`` (value and image-1 gradient without a graph).
"""

from __future__ import annotations

import pytest
import torch
from _mask_truth import masked_lp, masked_maps, masked_ms_ssim, masked_ssim_stats, soft_mask

import splatloss
from conftest import (
    CONFORMING,
    DTYPES,
    FP64_REL,
    MASKED_TOL,
    PADDINGS,
    TOL,
    assert_rel,
    assert_rounded_once,
    backend_params,
    device_for,
    has_cuda,
    make_pair,
    side,
)
from splatloss.config import SSIMConfig

ENTRIES = ("map", "stats", "mean", "dssim_l1", "ms_ssim", "mean_and_grad")
DTYPE_IDS = {torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16", torch.bfloat16: "bf16"}
LAM = 0.2
MS_WEIGHTS = (0.2, 0.3, 0.5)
MS_CFG = dict(window_size=3, sigma=0.8)


def _dtypes(backend):
    """The dtypes ``backend`` takes (Triton refuses float64: tests/backends/test_refusals.py)."""
    return DTYPES.get(backend, DTYPES["torch"])


def _fast(backend, entry, dtype, padding, masked):
    """The fast tier's share: every padding and mask in fp32 on torch and cpu, fp64 with "reflect",
    half precision "same" and unmasked; Triton in the interpreter the training mean's kernels (fp32,
    "same", unmasked: forward and backward); the reference (a cross-check of the two truths) in the
    slow tier."""
    if backend == "reference":
        return False
    if backend == "triton" and not has_cuda():
        return dtype == torch.float32 and padding == "same" and not masked and entry == "mean"
    if dtype == torch.float32:
        return True
    if dtype == torch.float64:
        return padding == "reflect"
    return padding == "same" and not masked


def _redundant(backend, entry, dtype, padding, masked):
    """Triton in the interpreter (seconds a case, up to 30 s with "reflect"): half precision with
    "same" only, masked or not, as the kernels (the masked ones too) convert a loaded fp16 / bf16
    value to fp32 before any padding-dependent code; and one half dtype per entry and mask,
    alternating (fp16 and bf16 each reach the unmasked and the masked kernels of some entry), as
    both take the same kernel code: a load converted to fp32, a store converted to the gradient's
    dtype. Unmasked MS-SSIM and the no-graph gradient with "same" only, as they run the statistics
    kernels whose every padding the ``stats`` and ``mean`` cases hold."""
    if backend != "triton" or has_cuda():
        return False
    if dtype in (torch.float16, torch.bfloat16):
        other = torch.bfloat16 if (ENTRIES.index(entry) + masked) % 2 == 0 else torch.float16
        return padding != "same" or dtype == other
    return padding != "same" and not masked and entry in ("ms_ssim", "mean_and_grad")


def _cases():
    """backend x entry x dtype x padding x mask, ``slow`` where ``_fast`` says so."""
    out = []
    for backend in ("reference",) + CONFORMING:
        (p,) = backend_params([backend]) if backend != "reference" else [pytest.param("reference")]
        for entry in ENTRIES:
            for dtype in _dtypes(backend):
                for padding in PADDINGS:
                    for masked in (False, True):
                        if _redundant(backend, entry, dtype, padding, masked):
                            continue
                        fast = _fast(backend, entry, dtype, padding, masked)
                        marks = list(p.marks) + ([] if fast else [pytest.mark.slow])
                        case_id = "-".join((backend, entry, DTYPE_IDS[dtype], padding, "masked" if masked else "plain"))
                        out.append(pytest.param(backend, entry, dtype, padding, masked, marks=marks, id=case_id))
    return out


def _run(b, entry, x, y, cfg, mask, up):
    """The outputs of ``entry`` on backend ``b`` and their gradients to (x, y) under the upstreams ``up``."""
    if entry == "mean_and_grad":
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        mean, g = b.ssim_mean_and_grad(x, y, cfg, up[0].to(x.device, acc), mask)
        assert mean.grad_fn is None and g.grad_fn is None
        return (mean,), (g,)
    x, y = x.detach().requires_grad_(True), y.detach().requires_grad_(True)
    if entry == "map":
        outs = b.ssim_map(x, y, cfg, return_cs=True) if mask is None else b.masked_ssim_map(x, y, mask, cfg)[:2]
    elif entry == "stats":
        outs = b.ssim_stats(x, y, cfg) if mask is None else b.masked_ssim_stats(x, y, mask, cfg)
    elif entry == "mean":
        outs = (b.ssim_mean(x, y, cfg, mask),)
    elif entry == "dssim_l1":
        outs = (b.dssim_l1(x, y, cfg, LAM, mask),)
    else:
        outs = (b.ms_ssim(x, y, SSIMConfig(padding=cfg.padding, **MS_CFG), MS_WEIGHTS, None, mask),)
    total = sum((o * u.to(o.device, o.dtype)).sum() for o, u in zip(outs, up))
    return tuple(o.detach() for o in outs), torch.autograd.grad(total, (x, y))


def _truth(entry, x, y, padding, mask):
    """The float64 oracle's outputs of ``entry``, the random upstreams ``up`` on them, and the outputs'
    gradients to (x, y) under ``up``."""
    x, y = x.detach().double().cpu().requires_grad_(True), y.detach().double().cpu().requires_grad_(True)
    m = None if mask is None else mask.double().cpu()
    if entry == "map":
        outs = masked_maps(x, y, m, padding=padding)[:2]
    elif entry == "stats":
        outs = masked_ssim_stats(x, y, m, padding=padding)
    elif entry in ("mean", "mean_and_grad"):
        outs = masked_ssim_stats(x, y, m, padding=padding)[:1]
    elif entry == "dssim_l1":
        s = masked_ssim_stats(x, y, m, padding=padding)[0].mean(dim=1)
        outs = ((1 - LAM) * masked_lp(x, y, m) + LAM * (1 - s),)
    else:
        outs = (masked_ms_ssim(x, y, m, MS_WEIGHTS, padding=padding, **MS_CFG),)
    g = torch.Generator().manual_seed(7)
    up = tuple(torch.randn(o.shape, generator=g, dtype=torch.float64) for o in outs)
    total = sum((o * u).sum() for o, u in zip(outs, up))
    gx, gy = torch.autograd.grad(total, (x, y))
    return tuple(o.detach() for o in outs), up, ((gx,) if entry == "mean_and_grad" else (gx, gy))


@pytest.mark.parametrize("backend,entry,dtype,padding,masked", _cases())
def test_values_and_both_gradients_equal_float64_truth(backend, entry, dtype, padding, masked):
    dev = device_for(backend)
    h, w = side(backend, 23, 16), side(backend, 29, 17)
    c = side(backend, 3, 1)  # Triton in the interpreter: one channel (each plane is a program)
    x, y = make_pair((2, c, h, w), dtype, seed=3, device=dev)
    y[0, 0, 3, 4] = x[0, 0, 3, 4]  # |x - y|' at equality is 0, as torch's abs backward
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    mask = None
    if masked:
        mask = torch.stack([soft_mask(h, w, seed=1), soft_mask(h, w, seed=5)])[:, None].to(dev, acc)
    b = splatloss.backends.get(backend)
    cfg = SSIMConfig(padding=padding)
    truth, up, truth_g = _truth(entry, x, y, padding, mask)
    got, got_g = _run(b, entry, x, y, cfg, mask, up)
    for a, t in zip(got, truth):
        assert a.shape == t.shape and a.dtype == acc and a.device == x.device
    for a in got_g:
        assert a.dtype == dtype and a.shape == x.shape
    if dtype == torch.float64:
        for i, (a, t) in enumerate(zip(got + got_g, truth + truth_g)):
            assert_rel(a, t, FP64_REL, f"{entry} output / gradient {i}")
        return
    tol = MASKED_TOL if masked else TOL[backend if backend != "reference" else "torch"]
    vkey, gkey = ("ms_values", "ms_grads") if entry == "ms_ssim" else ("map" if entry == "map" else "values", "grads")
    for i, (a, t) in enumerate(zip(got, truth)):
        assert_rel(a, t, tol[vkey], f"{entry} output {i}")
    if dtype == torch.float32:
        for i, (a, t) in enumerate(zip(got_g, truth_g)):
            assert_rel(a, t, tol[gkey], f"{entry} gradient {i}")
    else:
        # fp16 / bf16: the float64 gradient rounded once to the dtype, as the compositions promise
        # (MS-SSIM's scales, the L1 and SSIM terms: one float32 copy of the images, the partial
        # gradients summed in float32, one rounding on the way back to the input's dtype). The Triton
        # interpreter truncates fp32 to bf16 where a kernel stores a bf16 gradient (map, stats and
        # mean_and_grad: measured within one ulp, 1.2e-3 to 3.2e-3 of the scale beyond half of one).
        truncated = backend == "triton" and not has_cuda() and dtype == torch.bfloat16
        for i, (a, t) in enumerate(zip(got_g, truth_g)):
            assert_rounded_once(a, t, dtype, f"{entry} gradient {i}", truncated)
