#!/usr/bin/env python
"""Check the Triton backend on a GPU in one command: correctness against float64, determinism, timings.

Every check runs the public API (``ssim``, ``ssim_map``, ``ms_ssim``, ``dssim_l1``,
``dssim_with_gradient``, ``PhotometricLoss``, ``mask=``) with ``backend="triton"`` and compares the
values and the gradients of both images with ``backend="torch"`` run on float64 copies of the same
input values, on the same device, at the test suite's tolerances (``tests/conftest.py``). It covers
shapes (1x3x1080x1920, batches, one and four channels, odd sizes), the three paddings, every window
size from 3 to 31, fp32 / fp16 / bf16 inputs, layouts (contiguous, channels-last, a strided slice and
the HWC view a 3DGS renderer returns, ``render.permute(2, 0, 1)[None]``), masks, dark and bright
images; it repeats the 1080p backward (``--repeats``, 30 by default) and requires identical bits,
runs on ``cuda:1`` while ``cuda:0`` is current when a second GPU exists (the device guard) and on a
side stream (the current stream). It then times forward and forward+backward at 1x3x1080x1920 with
``triton.testing.do_bench`` beside ``backend="torch"``, pytorch-msssim and fused-ssim (each peer
that is not installed is skipped, with the reason in the JSON).

One JSON file (written atomically) holds the device, the versions, every check's errors, tolerances
and pass / fail, and the timings; a summary is printed. The exit status is 1 when any check failed.
See docs/gpu_check.md for the JSON fields and the compute-sanitizer / Nsight Compute commands.

Examples::

    python scripts/gpu_check.py                        # on a CUDA machine, well under 10 minutes
    python scripts/gpu_check.py --json out/gpu_check.json --only 'layouts|dssim_l1'
    python scripts/gpu_check.py --self-test            # small shapes; Triton's interpreter without CUDA
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the checkout's splatloss, also when run from elsewhere

import torch  # noqa: E402  (torch does not import Triton: TRITON_INTERPRET can still be set after this)

import splatloss  # noqa: E402
from splatloss._atomic import atomic_output  # noqa: E402

SCHEMA = 1

# The test suite's bars for the Triton backend, fp32 inputs against float64 on the same values:
# tests/conftest.py TOL["triton"] (normwise relative errors, max|got - truth| / max|truth|) and
# MAP_ATOL_FP32["grads"] (per pixel, absolute, under a standard-normal upstream gradient);
# tests/backends/test_masks.py for the masked statistics (absolute on the value, normwise on the
# gradients). tests/test_gpu_check.py fails when these drift from the suite's.
TOL = {"values": 1e-5, "grads": 1e-5, "map": 1e-5, "ms_values": 1e-5, "ms_grads": 1e-5}
MAP_GRAD_ATOL = 4e-5
MASK_TOL = {"values": 2e-5, "grads": 1e-4}
# fp16 / bf16 gradients (tests/conftest.py LOWP_GRAD_ULPS["triton"], ULP): within 1.5 ulp of the
# dtype of the float64 gradient on the rounded inputs, plus TOL["grads"] of the gradient's scale and
# fp16's subnormal step.
LOWP_GRAD_ULPS = 1.5
ULP = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
PADDINGS = ("valid", "same", "reflect")
FRAME = (1, 3, 1080, 1920)  # a 1080p RGB render
LAM = 0.2  # 3DGS: (1 - lam) * L1 + lam * (1 - SSIM)


# ------------------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------------------

_pairs: Dict[tuple, Tuple[torch.Tensor, torch.Tensor]] = {}


def make_pair(shape, seed: int = 0, lo: float = 0.0, hi: float = 1.0):
    """A rendered-looking float64 pair on the CPU: a smooth random image with noise, and a dimmed,
    shifted, noisy copy (SSIM well inside (0, 1), so every term of it matters), in ``[lo, hi]``."""
    key = (tuple(shape), seed, lo, hi)
    if key not in _pairs:
        b, c, h, w = shape
        g = torch.Generator().manual_seed(seed)
        base = torch.rand(b, c, (h + 7) // 8, (w + 7) // 8, generator=g, dtype=torch.float64)
        base = torch.nn.functional.interpolate(base, size=(h, w), mode="bilinear", align_corners=False)
        x = (base + 0.05 * torch.randn(b, c, h, w, generator=g, dtype=torch.float64)).clamp(0, 1)
        y = (0.9 * base + 0.05 + 0.05 * torch.randn(b, c, h, w, generator=g, dtype=torch.float64)).clamp(0, 1)
        _pairs[key] = (lo + (hi - lo) * x, lo + (hi - lo) * y)
    return _pairs[key]


def make_mask(kind: str, shape, device) -> Optional[torch.Tensor]:
    """``soft``: a (1, 1, H, W) alpha, 1 on an object in the middle, 0 outside, a soft edge;
    ``bool``: a random (B, 1, H, W) bool mask (70 % set)."""
    b, _, h, w = shape
    if kind == "soft":
        yy = torch.linspace(-1, 1, h, dtype=torch.float64)[:, None]
        xx = torch.linspace(-1, 1, w, dtype=torch.float64)[None, :]
        m = torch.sigmoid(20 * (0.6 - (xx * xx + 1.5 * yy * yy).sqrt()))[None, None]
    elif kind == "bool":
        m = torch.rand(b, 1, h, w, generator=torch.Generator().manual_seed(7)) > 0.3
    else:
        raise ValueError(f"mask kind must be 'soft' or 'bool', got {kind!r}")
    return m.to(device)


def to_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """``t`` (B, C, H, W) in another memory layout, same values."""
    if layout == "contiguous":
        return t.contiguous()
    if layout == "channels_last":
        return t.contiguous(memory_format=torch.channels_last)
    if layout == "hwc_view":  # a renderer's (H, W, C) output seen as (1, C, H, W)
        if t.shape[0] != 1:
            raise ValueError(f"the hwc_view layout is for one image, got a batch of {t.shape[0]}")
        return t[0].permute(1, 2, 0).contiguous().permute(2, 0, 1)[None]
    if layout == "strided":  # every other column of a wider buffer
        b, c, h, w = t.shape
        big = torch.zeros(b, c, h, 2 * w, dtype=t.dtype, device=t.device)
        big[..., ::2] = t
        return big[..., ::2]
    raise ValueError(f"unknown layout {layout!r}")


# ------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------


def rel(got: torch.Tensor, truth: torch.Tensor) -> float:
    """Normwise relative error ``max|got - truth| / max|truth|`` (NaN when ``got`` has a NaN)."""
    got, truth = got.detach().double(), truth.detach().double().to(got.device)
    return float((got - truth).abs().max() / truth.abs().max().clamp_min(1e-30))


def max_abs(got: torch.Tensor, truth: torch.Tensor) -> float:
    got, truth = got.detach().double(), truth.detach().double().to(got.device)
    return float((got - truth).abs().max())


def lowp_excess(got: torch.Tensor, truth: torch.Tensor, dtype) -> float:
    """How far a fp16 / bf16 gradient lies beyond its bound around the float64 gradient (<= 0 passes)."""
    a, b = got.detach().double(), truth.detach().double().to(got.device)
    sub = 2.0**-24 if dtype == torch.float16 else 0.0
    bound = LOWP_GRAD_ULPS * ULP[dtype] * b.abs() + sub + TOL["grads"] * b.abs().max()
    return float(((a - b).abs() - bound).max())


def measure(what: str, metric: str, error: float, tol: float, **info) -> dict:
    passed = bool(error <= tol)  # NaN never passes
    out = {"what": what, "metric": metric, "error": error, "tol": tol, "passed": passed}
    out.update(info)
    return out


def _bits_differ(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements whose bits differ (NaN payloads included)."""
    a, b = a.detach().contiguous(), b.detach().contiguous()
    if a.dtype in (torch.float16, torch.bfloat16):
        a, b = a.view(torch.int16), b.view(torch.int16)
    elif a.dtype == torch.float32:
        a, b = a.view(torch.int32), b.view(torch.int32)
    elif a.dtype == torch.float64:
        a, b = a.view(torch.int64), b.view(torch.int64)
    return int((a != b).sum())


# ------------------------------------------------------------------------------------------------
# One case: an op on the Triton backend against the float64 torch backend
# ------------------------------------------------------------------------------------------------


class Spec:
    """One correctness check of ``op`` at one shape / padding / window / dtype / layout / mask."""

    def __init__(
        self,
        group: str,
        op: str,
        shape,
        padding: str = "same",
        window_size: int = 11,
        dtype: str = "fp32",
        layout: str = "contiguous",
        mask: Optional[str] = None,
        seed: int = 0,
        value_range: Tuple[float, float] = (0.0, 1.0),
        **kw,
    ):
        self.group, self.op, self.shape, self.padding = group, op, tuple(shape), padding
        self.window_size = window_size
        self.dtype, self.layout, self.mask, self.seed, self.value_range, self.kw = (
            dtype,
            layout,
            mask,
            seed,
            value_range,
            kw,
        )
        parts = [group, op, "x".join(map(str, self.shape)), padding, f"w{window_size}", dtype, layout]
        if mask:
            parts.append(f"mask-{mask}")
        if value_range != (0.0, 1.0):
            parts.append(f"range{value_range[0]:g}-{value_range[1]:g}")
        parts += [f"scales{len(v)}" if k == "weights" else f"{k}={v}" for k, v in sorted(kw.items())]
        self.name = "/".join(parts)

    def params(self) -> dict:
        out = {
            "op": self.op,
            "shape": list(self.shape),
            "padding": self.padding,
            "window_size": self.window_size,
            "dtype": self.dtype,
            "layout": self.layout,
            "mask": self.mask,
            "value_range": list(self.value_range),
        }
        out.update({k: (list(v) if isinstance(v, tuple) else v) for k, v in self.kw.items()})
        return out


def _call(spec: Spec, x, y, backend: str, mask, need_grads: bool):
    """The op's outputs and the gradients of (outputs . upstream) w.r.t. x and y (x only for
    dssim_with_gradient, which has no autograd graph)."""
    kw = dict(padding=spec.padding, window_size=spec.window_size, backend=backend)
    kw.update({k: v for k, v in spec.kw.items() if k not in ("lam",)})
    if spec.op == "dssim_with_gradient":
        value, g = splatloss.dssim_with_gradient(x, y, mask=mask, **kw)
        return value, (g,)
    xs, ys = x.detach().requires_grad_(need_grads), y.detach().requires_grad_(need_grads)
    if spec.op == "ssim":
        out = splatloss.ssim(xs, ys, reduction="none", mask=mask, **kw)
    elif spec.op == "ssim_map":
        out = splatloss.ssim_map(xs, ys, mask=mask, **kw)
    elif spec.op == "ms_ssim":
        out = splatloss.ms_ssim(xs, ys, reduction="none", mask=mask, **kw)
    elif spec.op == "dssim_l1":
        out = splatloss.dssim_l1(xs, ys, spec.kw.get("lam", LAM), reduction="none", mask=mask, **kw)
    elif spec.op == "photometric":
        loss = splatloss.PhotometricLoss(reduction="none", **kw)
        out = loss(xs, ys, mask=mask)
    else:
        raise ValueError(f"unknown op {spec.op!r}")
    if not need_grads:
        return out.detach(), ()
    g = torch.Generator().manual_seed(spec.seed + 1)
    up = torch.randn(out.shape, generator=g, dtype=torch.float64).to(device=out.device, dtype=out.dtype)
    gx, gy = torch.autograd.grad((out * up).sum(), [xs, ys])
    return out.detach(), (gx, gy)


class Runner:
    """Runs the checks on one device and collects their records."""

    def __init__(self, device: str, repeats: int):
        self.device = torch.device(device)
        self.repeats = repeats
        self._contiguous: Dict[tuple, tuple] = {}

    def case(self, spec: Spec) -> List[dict]:
        dtype = DTYPES[spec.dtype]
        x64, y64 = make_pair(spec.shape, spec.seed, *spec.value_range)
        x = to_layout(x64.to(self.device, dtype), spec.layout)
        y = to_layout(y64.to(self.device, dtype), spec.layout)
        mask = make_mask(spec.mask, spec.shape, self.device) if spec.mask else None
        # truth: the float64 torch backend on the very values the Triton backend sees (rounded to dtype)
        mask64 = mask.double() if mask is not None and mask.is_floating_point() else mask
        tv, tg = _call(spec, x.double(), y.double(), "torch", mask64, True)
        v, gs = _call(spec, x, y, "triton", mask, True)
        out: List[dict] = []
        masked = spec.mask is not None
        vtol = MASK_TOL["values"] if masked else TOL["ms_values" if spec.op == "ms_ssim" else "values"]
        gtol = MASK_TOL["grads"] if masked else TOL["ms_grads" if spec.op == "ms_ssim" else "grads"]
        if spec.op == "ssim_map":
            out.append(measure("value", "normwise_rel", rel(v, tv), TOL["map"]))
        elif masked:
            out.append(measure("value", "max_abs", max_abs(v, tv), vtol))
        else:
            out.append(measure("value", "normwise_rel", rel(v, tv), vtol))
        out.append(measure("value dtype", "flag", float(v.dtype != torch.float32), 0.0, got=str(v.dtype)))
        names = ("grad img1", "grad img2")
        for what, g, t in zip(names, gs, tg):
            out.append(measure(f"{what} dtype", "flag", float(g.dtype != dtype), 0.0, got=str(g.dtype)))
            if dtype != torch.float32:
                out.append(measure(what, "ulp_excess", lowp_excess(g, t, dtype), 0.0, normwise_rel=rel(g, t)))
            elif spec.op == "ssim_map":
                out.append(measure(what, "max_abs", max_abs(g, t), MAP_GRAD_ATOL, normwise_rel=rel(g, t)))
            else:
                out.append(measure(what, "normwise_rel", rel(g, t), gtol))
        if spec.layout != "contiguous":
            # the layout changes where the bytes are, not the result: bitwise the contiguous one
            key = (
                spec.op,
                spec.shape,
                spec.padding,
                spec.window_size,
                spec.dtype,
                spec.mask,
                spec.seed,
                spec.value_range,
            )
            key += tuple(sorted((k, str(v)) for k, v in spec.kw.items()))
            if key not in self._contiguous:
                self._contiguous[key] = _call(spec, x.contiguous(), y.contiguous(), "triton", mask, True)
            cv, cg = self._contiguous[key]
            diff = _bits_differ(v, cv) + sum(_bits_differ(a, b) for a, b in zip(gs, cg))
            out.append(measure("bits vs contiguous input", "elements_differing", float(diff), 0.0))
            if spec.layout == "channels_last":
                kept = all(g.is_contiguous(memory_format=torch.channels_last) for g in gs)
                out.append(measure("gradient keeps channels-last", "flag", float(not kept), 0.0))
        return out

    def determinism(self, shape) -> List[dict]:
        """``repeats`` runs of SSIM forward+backward (both gradients) and of dssim_l1's backward: the
        same bits every time (the kernels use no atomics)."""
        x64, y64 = make_pair(shape, seed=3)
        x, y = x64.to(self.device, torch.float32), y64.to(self.device, torch.float32)
        first = None
        differing = [0, 0, 0, 0]
        for _ in range(self.repeats):
            xs, ys = x.detach().requires_grad_(), y.detach().requires_grad_()
            v = splatloss.ssim(xs, ys, padding="same", backend="triton")
            gx, gy = torch.autograd.grad(1 - v, [xs, ys])
            xs = x.detach().requires_grad_()
            (gl,) = torch.autograd.grad(splatloss.dssim_l1(xs, y, LAM, padding="same", backend="triton"), [xs])
            got = (v.detach(), gx, gy, gl)
            if first is None:
                first = got
                continue
            for i, (a, b) in enumerate(zip(got, first)):
                differing[i] += int(_bits_differ(a, b) > 0)
        names = ("ssim value", "ssim grad img1", "ssim grad img2", "dssim_l1 grad img1")
        return [measure(n, "runs_differing", float(d), 0.0, runs=self.repeats) for n, d in zip(names, differing)]

    def device_guard(self, shape) -> List[dict]:
        """Tensors on cuda:1 while cuda:0 is current: results on cuda:1, equal to float64 there, and
        bitwise the cuda:0 results when both GPUs are the same model."""
        x64, y64 = make_pair(shape, seed=5)
        spec = Spec("device", "ssim", shape, padding="same")
        out = []
        with torch.cuda.device(0):
            d1 = torch.device("cuda", 1)
            x1, y1 = x64.to(d1, torch.float32), y64.to(d1, torch.float32)
            v1, g1 = _call(spec, x1, y1, "triton", None, True)
            tv, tg = _call(spec, x1.double(), y1.double(), "torch", None, True)
            on1 = v1.device == d1 and all(g.device == d1 for g in g1)
            out.append(measure("results on cuda:1", "flag", float(not on1), 0.0, current=torch.cuda.current_device()))
            out.append(measure("value", "normwise_rel", rel(v1, tv), TOL["values"]))
            for what, g, t in zip(("grad img1", "grad img2"), g1, tg):
                out.append(measure(what, "normwise_rel", rel(g, t), TOL["grads"]))
            if torch.cuda.get_device_name(0) == torch.cuda.get_device_name(1):
                x0, y0 = x64.to("cuda:0", torch.float32), y64.to("cuda:0", torch.float32)
                v0, g0 = _call(spec, x0, y0, "triton", None, True)
                diff = _bits_differ(v0, v1.to("cuda:0")) + sum(_bits_differ(a, b.to("cuda:0")) for a, b in zip(g0, g1))
                out.append(measure("bits vs cuda:0", "elements_differing", float(diff), 0.0))
        return out

    def current_stream(self, shape) -> List[dict]:
        """The kernels run on the current stream: inputs written on a busy side stream and read there
        give the default stream's result (a launch on another stream would read them unfinished)."""
        x64, y64 = make_pair(shape, seed=6)
        x, y = x64.to(self.device, torch.float32), y64.to(self.device, torch.float32)
        spec = Spec("stream", "ssim", shape, padding="same")
        ref_v, ref_g = _call(spec, x, y, "triton", None, True)
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        busy = torch.randn(4096, 4096, device=self.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(8):  # keep the side stream busy for a while
                busy = busy @ busy / 64
            xs, ys = x * 1.0, y * 1.0  # written on the side stream, after the busy work
            v, g = _call(spec, xs, ys, "triton", None, True)
        side.synchronize()
        diff = _bits_differ(v, ref_v) + sum(_bits_differ(a, b) for a, b in zip(g, ref_g))
        return [measure("bits vs default stream", "elements_differing", float(diff), 0.0)]


# ------------------------------------------------------------------------------------------------
# The plan: which checks run (full on a GPU, small for the self-test)
# ------------------------------------------------------------------------------------------------


def plan(small: bool) -> List[Spec]:
    S = Spec
    specs: List[Spec] = []
    if small:
        base, odd = (1, 3, 24, 40), (2, 3, 17, 21)
        specs += [
            S("windows", "ssim", base, "valid", 3),
            S("windows", "ssim", base, "reflect", 7),
            S("windows", "ssim", base, "same", 11),
            S("windows", "ssim", base, "valid", 11),
            S("windows", "ssim_map", base, "same", 7),
            S("shapes", "ssim", odd, "same", 7),
            S("dtypes", "ssim", base, "same", 11, "fp16"),
            S("dtypes", "ssim", base, "valid", 11, "bf16"),
            S("layouts", "ssim", base, "same", 11, layout="channels_last"),
            S("layouts", "ssim", base, "same", 11, layout="hwc_view"),
            S("layouts", "ssim", base, "same", 11, layout="strided"),
            S("ms_ssim", "ms_ssim", base, "same", 3, weights=(0.2, 0.3, 0.5), tau=0.01),
            S("dssim_l1", "dssim_l1", base, "same", 11),
            S("dssim_with_gradient", "dssim_with_gradient", base, "valid", 7),
            S("masks", "ssim", base, "same", 11, mask="soft"),
            S("masks", "dssim_l1", odd, "reflect", 7, mask="bool"),
            S("photometric", "photometric", base, "same", 11, l1=0.8, dssim=0.2),
            S("range", "ssim", base, "same", 11, value_range=(0.0, 0.01)),
        ]
        return specs
    mid, odd, batch = (2, 3, 67, 93), (1, 3, 37, 53), (4, 3, 256, 256)
    ms = (2, 3, 161, 171)
    for w in range(3, 32, 2):
        for p in PADDINGS:
            specs.append(S("windows", "ssim", mid, p, w))
    for w in (3, 11, 31):
        for p in PADDINGS:
            specs.append(S("windows", "ssim_map", mid, p, w))
    specs.append(S("windows", "ssim", mid, "same", 7, window="uniform"))
    for shape in (FRAME, batch, (2, 1, 129, 131), odd, (3, 4, 31, 300)):
        for p in PADDINGS:
            specs.append(S("shapes", "ssim", shape, p))
    for dt in ("fp16", "bf16"):
        for shape in (FRAME, odd):
            for p in PADDINGS:
                specs.append(S("dtypes", "ssim", shape, p, dtype=dt))
        specs.append(S("dtypes", "dssim_l1", FRAME, "same", dtype=dt))
    for layout in ("channels_last", "hwc_view", "strided"):
        specs.append(S("layouts", "ssim", FRAME, "same", layout=layout))
        specs.append(S("layouts", "ssim", odd, "valid", layout=layout))
    specs.append(S("layouts", "dssim_l1", FRAME, "same", layout="hwc_view"))
    specs.append(S("layouts", "dssim_l1", FRAME, "same", dtype="bf16", layout="hwc_view"))
    specs += [
        S("ms_ssim", "ms_ssim", FRAME, "valid"),
        S("ms_ssim", "ms_ssim", FRAME, "same", tau=0.01),
        S("ms_ssim", "ms_ssim", ms, "valid", tau=0.01),
        S("ms_ssim", "ms_ssim", ms, "reflect", tau=0.01),
        S("ms_ssim", "ms_ssim", FRAME, "same", layout="hwc_view", tau=0.01),
        S("dssim_l1", "dssim_l1", FRAME, "same"),
        S("dssim_l1", "dssim_l1", batch, "same"),
        S("dssim_l1", "dssim_l1", FRAME, "valid"),
        S("dssim_l1", "dssim_l1", odd, "reflect"),
        S("dssim_with_gradient", "dssim_with_gradient", FRAME, "same"),
        S("dssim_with_gradient", "dssim_with_gradient", odd, "valid"),
        S("dssim_with_gradient", "dssim_with_gradient", FRAME, "same", layout="hwc_view"),
        S("masks", "ssim", FRAME, "same", mask="soft"),
        S("masks", "dssim_l1", FRAME, "same", mask="soft"),
        S("masks", "ssim", mid, "reflect", mask="bool"),
        S("masks", "ms_ssim", ms, "valid", mask="soft", tau=0.01),
        S("masks", "dssim_with_gradient", FRAME, "same", mask="soft"),
        S("photometric", "photometric", FRAME, "same", l1=0.8, dssim=0.2),
        S("photometric", "photometric", ms, "valid", l1=0.8, msssim=0.2),
        S("range", "ssim", FRAME, "same", value_range=(0.0, 0.01)),
        S("range", "ssim", FRAME, "same", value_range=(0.99, 1.0)),
    ]
    return specs


# ------------------------------------------------------------------------------------------------
# Timings
# ------------------------------------------------------------------------------------------------

TIMED_OPS = ("ssim", "dssim_l1", "ms_ssim")
TIMED_LIBS = ("splatloss-triton", "splatloss-torch", "pytorch_msssim", "fused_ssim")
MODES = ("fwd", "fwdbwd")


def _bench_module():
    """scripts/bench.py, for the one definition of each library's loss (and its reasons to skip)."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        return importlib.import_module("bench")
    finally:
        sys.path.pop(0)


def _timer(device: str) -> Tuple[str, Callable]:
    if device == "cuda":
        from triton.testing import do_bench

        def cuda_ms(call):
            q = do_bench(call, warmup=25, rep=200, quantiles=[0.5, 0.2, 0.8])
            return [float(v) for v in q]

        return "triton.testing.do_bench (median, 20th and 80th percentiles; L2 flushed between runs)", cuda_ms

    def cpu_ms(call):
        call()
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            call()
            runs.append((time.perf_counter() - t0) * 1e3)
        runs.sort()
        return [runs[2], runs[1], runs[3]]

    return "time.perf_counter on the CPU (median of 5 after a warm-up)", cpu_ms


def timing_rows(shape) -> List[Tuple[str, str, str]]:
    return [(op, lib, mode) for op in TIMED_OPS for mode in MODES for lib in TIMED_LIBS]


# ------------------------------------------------------------------------------------------------
# Environment
# ------------------------------------------------------------------------------------------------


def _version(dist: str) -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def environment(device: str) -> Tuple[dict, dict]:
    try:
        import triton
    except ImportError as exc:
        raise SystemExit(
            f"gpu_check: Triton is not importable ({exc}); install it with pip install 'splatloss[triton]'"
        ) from exc

    dev = {"type": device, "interpreter": os.environ.get("TRITON_INTERPRET") == "1"}
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        dev.update(
            name=torch.cuda.get_device_name(0),
            capability=list(torch.cuda.get_device_capability(0)),
            multiprocessors=p.multi_processor_count,
            memory_gib=round(p.total_memory / 2**30, 1),
            count=torch.cuda.device_count(),
            names=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        )
    else:
        dev.update(name=platform.processor() or platform.machine(), count=0)
    commit = None
    with contextlib.suppress(Exception):
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
        if head.returncode == 0:
            commit = head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "triton": triton.__version__,
        "splatloss": _version("splatloss"),
        "splatloss_commit": commit,
        "numpy": _version("numpy"),
        "pytorch_msssim": _version("pytorch-msssim"),
        "fused_ssim": _version("fused-ssim") or _version("fused_ssim"),
    }
    return dev, versions


# ------------------------------------------------------------------------------------------------
# Fault injection (hidden flag): proves the checks can fail
# ------------------------------------------------------------------------------------------------


def inject_error(scale: float) -> None:
    """Multiply every result of the Triton backend's kernels by ``1 + scale`` (values and, through
    autograd, gradients): a wrong backend the checks must catch."""
    b = splatloss.backends.get("triton")

    def perturb(out):
        if isinstance(out, torch.Tensor):
            return out * (1 + scale)
        if isinstance(out, tuple):
            return tuple(perturb(o) for o in out)
        return out

    for name in ("ssim_map", "ssim_stats", "ssim_mean", "ms_ssim", "dssim_l1", "ssim_mean_and_grad"):
        real = getattr(b, name)
        setattr(b, name, lambda *a, _real=real, **k: perturb(_real(*a, **k)))


# ------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------


def _json_safe(v):
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    return v


class Progress:
    """tqdm when installed, else one line per step on stderr."""

    def __init__(self, total: int):
        self.total, self.i = total, 0
        try:
            from tqdm import tqdm
        except ImportError:
            self.bar = None
        else:
            self.bar = tqdm(total=total, desc="gpu_check", unit="check", file=sys.stderr, dynamic_ncols=True)

    def step(self, name: str) -> None:
        self.i += 1
        if self.bar is not None:
            self.bar.set_postfix_str(name[-60:], refresh=False)
            self.bar.update(1)
        else:
            print(f"[{self.i}/{self.total}] {name}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--json", default="gpu_check.json", help="output file (default gpu_check.json)")
    ap.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        help="cuda (compiled kernels), cpu (Triton's interpreter), auto: cuda when present (default)",
    )
    ap.add_argument("--small", action="store_true", help="small shapes only (no 1080p frames)")
    ap.add_argument(
        "--self-test",
        action="store_true",
        help="--small on whatever is here: the interpreter on the CPU without CUDA (a minute or two)",
    )
    ap.add_argument("--repeats", type=int, default=None, help="runs of the determinism check (30; 3 with --small)")
    ap.add_argument("--no-timing", action="store_true", help="correctness only")
    ap.add_argument("--only", default=None, help="run the checks (and timing rows) whose name matches this regex")
    ap.add_argument("--list", action="store_true", help="print the check names and exit")
    # Multiplies every Triton result by (1 + REL): tests/test_gpu_check.py proves the checks fail.
    ap.add_argument("--inject-error", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.self_test:
        args.small = True
    if args.repeats is None:
        args.repeats = 3 if args.small else 30
    if args.repeats < 2:
        ap.error(f"--repeats must be at least 2 (the determinism check compares runs), got {args.repeats}")
    return args


def _select_device(requested: str) -> str:
    cuda = torch.cuda.is_available()
    if requested == "cuda" and not cuda:
        raise SystemExit("gpu_check: --device cuda asked for, but torch sees no CUDA device; use --self-test")
    device = requested if requested != "auto" else ("cuda" if cuda else "cpu")
    if device == "cpu":
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("gpu_check: Triton was imported before TRITON_INTERPRET=1 could be set")
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is first imported: the kernels run interpreted
    return device


def main(argv=None) -> int:
    args = parse_args(argv)
    device = _select_device(args.device)
    small = args.small
    if device == "cpu" and not small and not args.list:
        raise SystemExit(
            "gpu_check: no CUDA device here (or --device cpu): the full check needs a GPU; run --self-test "
            "(or --device cpu --small) for the small shapes in Triton's interpreter"
        )
    only = re.compile(args.only) if args.only else None
    specs = [s for s in plan(small) if only is None or only.search(s.name)]
    extra = [("determinism", "determinism/ssim+dssim_l1/" + "x".join(map(str, (1, 3, 24, 40) if small else FRAME)))]
    if device == "cuda":
        extra += [("device_guard", "device/cuda:1/ssim/1x3x67x93"), ("stream", "stream/side-stream/ssim/1x3x67x93")]
    extra = [e for e in extra if only is None or only.search(e[1])]
    tshape = (1, 3, 176, 176) if small else FRAME  # MS-SSIM's 5 scales need 161x161
    rows = []
    if not args.no_timing:
        rows = [r for r in timing_rows(tshape) if only is None or only.search("timing/" + "/".join(r))]
    if args.list:
        print("\n".join([s.name for s in specs] + [e[1] for e in extra] + ["timing/" + "/".join(r) for r in rows]))
        return 0

    t_start = time.time()
    dev, versions = environment(device)
    if args.inject_error is not None:
        inject_error(args.inject_error)
    runner = Runner(device, args.repeats)
    checks: Dict[str, dict] = {}
    progress = Progress(len(specs) + len(extra) + len(rows))

    def record(name, group, params, fn):
        t0 = time.time()
        rec = {"group": group, "params": params}
        try:
            ms = fn()
        except Exception as exc:  # a crash is a failed check, and the run goes on
            rec.update(passed=False, measures=[], error=f"{type(exc).__name__}: {exc}"[:2000])
        else:
            if ms is None:
                rec.update(passed=None, measures=[])
            else:
                rec.update(passed=all(m["passed"] for m in ms), measures=ms)
        rec["seconds"] = round(time.time() - t0, 3)
        checks[name] = rec
        if device == "cuda":
            torch.cuda.empty_cache()
        progress.step(name)

    for spec in specs:
        record(spec.name, spec.group, spec.params(), lambda spec=spec: runner.case(spec))
    for kind, name in extra:
        if kind == "determinism":
            shape = (1, 3, 24, 40) if small else FRAME
            record(
                name, "determinism", {"shape": list(shape), "repeats": args.repeats}, lambda: runner.determinism(shape)
            )
        elif kind == "device_guard":
            if torch.cuda.device_count() < 2:
                checks[name] = {
                    "group": "device",
                    "params": {},
                    "passed": None,
                    "measures": [],
                    "skipped": "one CUDA device: the cuda:1 check needs two",
                }
                progress.step(name)
            else:
                record(name, "device", {"shape": [1, 3, 67, 93]}, lambda: runner.device_guard((1, 3, 67, 93)))
        elif kind == "stream":
            record(name, "stream", {"shape": [1, 3, 67, 93]}, lambda: runner.current_stream((1, 3, 67, 93)))

    timings = {"shape": list(tshape), "dtype": "float32", "rows": [], "skipped": {}}
    if rows:
        bench = _bench_module()
        timer_name, timer = _timer(device)
        timings["timer"] = timer_name
        inputs = bench.make_inputs(*tshape, torch.float32, device)
        base: Dict[Tuple[str, str], float] = {}
        for op, lib, mode in rows:
            name = f"timing/{op}/{lib}/{mode}"
            try:
                loss = bench.make_loss(lib, op, device)
            except bench.Unavailable as exc:
                timings["skipped"].setdefault(lib, {})[op] = str(exc)
                progress.step(name)
                continue
            row = {"op": op, "lib": lib, "mode": mode}
            try:
                ms = timer(bench.make_call(loss, *inputs, mode))
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"[:500]
                if lib.startswith("splatloss"):  # our own backends must run; a peer's failure is a note
                    checks[name] = {
                        "group": "timing",
                        "params": row,
                        "passed": False,
                        "measures": [],
                        "error": row["error"],
                    }
            else:
                row.update(ms=ms[0], ms_p20=ms[1], ms_p80=ms[2])
                if lib == "splatloss-torch":
                    base[(op, mode)] = ms[0]
            timings["rows"].append(row)
            progress.step(name)
        for row in timings["rows"]:
            b = base.get((row["op"], row["mode"]))
            if b and "ms" in row:
                row["speedup_vs_torch"] = round(b / row["ms"], 3)
    progress.close()

    failed = [n for n, c in checks.items() if c["passed"] is False]
    skipped = [n for n, c in checks.items() if c["passed"] is None]
    report = {
        "schema": SCHEMA,
        "ok": not failed,
        "mode": "small" if small else "full",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": None,
        "device": dev,
        "versions": versions,
        "tolerances": {
            "tol": TOL,
            "map_grad_atol": MAP_GRAD_ATOL,
            "mask": MASK_TOL,
            "lowp_grad_ulps": LOWP_GRAD_ULPS,
        },
        "repeats": args.repeats,
        "injected_error": args.inject_error,
        "summary": {"checks": len(checks), "passed": len(checks) - len(failed) - len(skipped)},
        "failed": failed,
        "skipped": skipped,
        "checks": checks,
        "timings": timings,
    }
    report["summary"].update(failed=len(failed), skipped=len(skipped))
    report["wall_s"] = round(time.time() - t_start, 1)
    with atomic_output(args.json) as tmp:
        with open(tmp, "w") as f:
            json.dump(_json_safe(report), f, indent=1, allow_nan=False)
            f.write("\n")
    print_summary(report, args.json)
    return 0 if not failed else 1


def _worst(rec: dict) -> str:
    if rec.get("error"):
        return rec["error"].splitlines()[0][:100]
    bad = [m for m in rec["measures"] if not m["passed"]] or rec["measures"]
    if not bad:
        return ""
    m = max(bad, key=lambda m: (m["error"] - m["tol"]) if math.isfinite(m["error"]) else math.inf)
    return f"{m['what']}: {m['metric']} {m['error']:.3g} (tol {m['tol']:.3g})"


def print_summary(report: dict, path: str) -> None:
    dev, v = report["device"], report["versions"]
    print(
        f"\ngpu_check ({report['mode']}) on {dev['name']} ({dev['type']}"
        f"{', Triton interpreter' if dev['interpreter'] else ''}): torch {v['torch']}, triton {v['triton']}, "
        f"CUDA {v['cuda']}, commit {v['splatloss_commit']}"
    )
    groups: Dict[str, List[dict]] = {}
    for rec in report["checks"].values():
        groups.setdefault(rec["group"], []).append(rec)
    print(f"{'group':<22}{'passed':>8}{'failed':>8}{'skipped':>9}   worst error / tolerance")
    for g, recs in groups.items():
        p = sum(r["passed"] is True for r in recs)
        f = sum(r["passed"] is False for r in recs)
        s = sum(r["passed"] is None for r in recs)
        ratios = [
            m["error"] / m["tol"]
            for r in recs
            for m in r["measures"]
            if m["tol"] > 0 and math.isfinite(m["error"]) and m["metric"] != "ulp_excess"
        ]
        worst = f"{max(ratios):.2f}" if ratios else "-"
        print(f"{g:<22}{p:>8}{f:>8}{s:>9}   {worst}")
    for name in report["failed"]:
        print(f"FAILED {name}: {_worst(report['checks'][name])}")
    for name in report["skipped"]:
        print(f"skipped {name}: {report['checks'][name].get('skipped', '')}")
    t = report["timings"]
    if t["rows"]:
        print(f"\ntimings, {'x'.join(map(str, t['shape']))} {t['dtype']}, {t.get('timer', '')}")
        print(f"{'op':<10}{'mode':<8}{'library':<20}{'ms':>10}{'vs torch':>10}")
        for r in t["rows"]:
            ms = f"{r['ms']:.3f}" if "ms" in r else "error"
            sp = f"{r['speedup_vs_torch']:.2f}x" if "speedup_vs_torch" in r else ""
            print(f"{r['op']:<10}{r['mode']:<8}{r['lib']:<20}{ms:>10}{sp:>10}")
    for lib, why in t["skipped"].items():
        reasons = sorted(set(why.values()))
        print(f"not timed: {lib} ({'; '.join(reasons)})")
    s = report["summary"]
    print(
        f"\n{s['passed']} checks passed, {s['failed']} failed, {s['skipped']} skipped in {report['wall_s']} s -> {path}"
    )


if __name__ == "__main__":
    sys.exit(main())
