#!/usr/bin/env python
"""Compile the Triton kernels of splatloss ahead of time for sm_80 and sm_90 -- no GPU needed.

The kernels compiled are exactly those the public API launches: a table of calls (every window
size with the heaviest kernels; at the default window every path -- map and cs, paddings, dtypes,
layouts, one gradient of either image, the gradient without autograd, MS-SSIM, frames narrower
than a program; the cost model's 1080p calls, see :func:`aot_calls`) runs on CPU tensors with each
Triton launch intercepted and specialised by Triton's own binder for the target architecture
(integer arguments equal to 1 or divisible by 16, pointer alignment, constexprs, ``num_warps``,
``maxnreg``), the package planning CUDA launches; nothing executes. Each variant is compiled with
``triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", arch, 32))``
and the cubin's resource usage read with the cuobjdump bundled with Triton
(``--dump-resource-usage``): registers per thread, stack / local bytes (register spills land
there) and static shared memory, plus the shared memory Triton itself allocates
(``metadata.shared``). It prints one row per call, kernel variant and architecture and exits
non-zero when any kernel fails to compile, spills (stack or local bytes > 0), or needs more shared
memory per block than the architecture allows.

``--cost [--json FILE]`` counts what the loss calls' kernels issue instead (docs/triton.md, "The
static cost model"; the SASS and IR analysis is ``tools/kernel_analysis.py``, the launch model
``tools/sass_cost.py``).

The interpreter (``TRITON_INTERPRET=1``, the correctness tests) accepts things the compiler
rejects; this script is the other half of the proof. Run: ``python tools/check_kernels.py``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, NamedTuple, Optional

os.environ.pop("TRITON_INTERPRET", None)  # compile for real, never interpret

import numpy  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

if not __package__:
    # run as ``python tools/check_kernels.py``: Python puts tools/, not the repository root, on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import importlib  # noqa: E402

from tools import kernel_analysis  # noqa: E402

# the package re-exports functions named like its modules: import the module by name. The module
# that plans launch geometry (``FORCE_CUDA_GEOMETRY``, ``CUDA_ROWS``...): the one place to re-point
# when the kernels' modules move.
GEOMETRY_MODULE = "splatloss.backends.triton.launch"
tri_launch = importlib.import_module(GEOMETRY_MODULE)

#: Max shared memory per block (bytes, opt-in): A100 (sm_80) 163 KB, H100 (sm_90) 227 KB.
SHARED_LIMIT = {80: 166912, 90: 232448}

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def resource_usage(cubin: bytes) -> Dict[str, int]:
    """REG / STACK / SHARED / LOCAL of the single function in ``cubin`` (cuobjdump)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as fh:
        fh.write(cubin)
        path = fh.name
    try:
        text = subprocess.run(
            [CUOBJDUMP, "--dump-resource-usage", path], capture_output=True, text=True, check=True
        ).stdout
    finally:
        os.unlink(path)
    line = next(ln for ln in text.splitlines() if "REG:" in ln)
    return {k: int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", line)}


# ------------------------------------------------------------------------------------------------
# --cost: the kernels the loss calls launch, recorded at run time, compiled and counted
# ------------------------------------------------------------------------------------------------

#: Machines of the estimate (vendor figures): SMs, warp schedulers per SM, boost clock (Hz), DRAM
#: bandwidth (B/s). sm_90: H100 SXM5; sm_80: A100 SXM4 80 GB.
MACHINES = {
    90: dict(name="H100 SXM", sms=132, schedulers=4, clock=1.755e9, dram=3.35e12),
    80: dict(name="A100 SXM 80GB", sms=108, schedulers=4, clock=1.41e9, dram=2.039e12),
}

#: The modelled cost of a torch glue kernel (an elementwise op or reduction a call issues outside
#: the Triton kernels): one warp-instruction per 8 elements read or written (a load or store, the
#: op and address arithmetic per 32-element warp access), and its inputs and outputs moved
#: through DRAM once.
GLUE_WARP_INSTR_PER_ELEMENT = 1 / 8

#: The shape of the cost model's calls (one 1080p RGB frame, fp32).
COST_SHAPE = (1, 3, 1080, 1920)


class Launch(NamedTuple):
    fn: object  # the JITFunction
    grid: tuple
    args: Dict[str, object]  # bound arguments by name
    compile: Dict[int, tuple]  # arch -> (signature, constexprs, attrs, options)


class _TensorInfo(NamedTuple):
    nbytes: int  # bytes of the tensor's elements (at most its storage)

    @staticmethod
    def of(t) -> "_TensorInfo":
        return _TensorInfo(min(t.numel() * t.element_size(), t.untyped_storage().nbytes()))


class Glue(NamedTuple):
    op: str
    elements: int  # elements read + written
    nbytes: int  # bytes read + written


class Call(NamedTuple):
    """A call of the public API to record: ``run(x, y)`` returns what to backpropagate from (None,
    or a result without a gradient: nothing), on a pair of ``shape`` and ``dtype`` in ``layout``
    ("contiguous", "channels_last", or "hwc": an ``(H, W, C)`` render seen as ``(1, C, H, W)``),
    with gradients of x / y."""

    run: object
    shape: tuple
    dtype: str = "float32"
    grads: tuple = (True, False)
    layout: str = "contiguous"


def two_launches(fn):
    """``fn`` run with the backward's two lean launches (``splatloss.backends.triton.split.ENABLED``):
    the variant the GPU check times against the one-launch kernels, compiled and counted beside them."""

    def run(x, y):
        split = importlib.import_module("splatloss.backends.triton.split")
        split.ENABLED = True
        try:
            return fn(x, y)
        finally:
            split.ENABLED = False

    return run


def cost_calls() -> Dict[str, Call]:
    """The calls of the cost model (see docs/triton.md)."""
    import torch

    import splatloss

    def loss_ssim(x, y):
        return 1 - splatloss.ssim(x, y, padding="same", backend="triton")

    def loss_dssim_l1(x, y):
        return splatloss.dssim_l1(x, y, 0.2, padding="same", backend="triton")

    def loss_ms_ssim(x, y):
        return 1 - splatloss.ms_ssim(x, y, tau=0.01, backend="triton")

    masks = {}

    def loss_dssim_l1_masked(x, y):
        # a soft (1, 1, H, W) alpha, made once per shape as the benchmark's masked rows make it: an
        # input of the call (the recorder records the second call), not a launch of the loss
        key = (tuple(x.shape[-2:]), x.device)
        if key not in masks:
            masks[key] = torch.rand(1, 1, *key[0], generator=torch.Generator().manual_seed(0)).to(x.device)
        return splatloss.dssim_l1(x, y, 0.2, padding="same", mask=masks[key], backend="triton")

    return {
        "ssim_loss_fwd_bwd": Call(loss_ssim, COST_SHAPE),
        "ssim_loss_fwd_bwd_both_grads": Call(loss_ssim, COST_SHAPE, grads=(True, True)),
        "dssim_l1_fwd_bwd": Call(loss_dssim_l1, COST_SHAPE),
        "ms_ssim_loss_fwd_bwd": Call(loss_ms_ssim, COST_SHAPE),
        "dssim_l1_masked_fwd_bwd": Call(loss_dssim_l1_masked, COST_SHAPE),
        # the two-launch variant of the one-gradient losses (off by default until a GPU times it)
        "ssim_loss_fwd_bwd_two_launches": Call(two_launches(loss_ssim), COST_SHAPE),
        "ms_ssim_loss_fwd_bwd_two_launches": Call(two_launches(loss_ms_ssim), COST_SHAPE),
        "dssim_l1_masked_fwd_bwd_two_launches": Call(two_launches(loss_dssim_l1_masked), COST_SHAPE),
    }


def aot_calls(quick: bool = False) -> Dict[str, Call]:
    """The calls whose launched kernels the default check compiles: every window size with the
    heaviest kernels (the fused loss with "reflect", both gradients), and at the default window
    every path of the public API -- map and cs, paddings, dtypes, layouts, one gradient of either
    image, the gradient without autograd, MS-SSIM, frames narrower than a program (several
    channels per program) -- plus the cost model's 1080p calls."""
    import torch

    import splatloss

    T = "triton"
    small = (2, 3, 48, 160)
    out: Dict[str, Call] = {}
    windows = (11,) if quick else range(3, tri_launch.MAX_WINDOW + 1, 2)
    for K in windows:
        # with a gradient the loss runs the backward kernel only (its gradient is computed in the
        # forward); without one (evaluation), the forward kernel
        for grads, what in (((True, True), "both grads"), ((False, False), "no grad")):
            out[f"dssim_l1 reflect K={K} {what}"] = Call(
                lambda x, y, K=K: splatloss.dssim_l1(x, y, padding="reflect", window_size=K, backend=T),
                small,
                grads=grads,
            )
    if quick:
        return out

    def map_cs(padding, K=11):
        def run(x, y):
            s, cs = splatloss.ssim_map(x, y, padding=padding, window_size=K, return_cs=True, backend=T)
            return (s * cs).mean()

        return run

    def loss(padding="same", K=11, **kw):
        return lambda x, y: 1 - splatloss.ssim(x, y, padding=padding, window_size=K, backend=T, **kw)

    for K in (3, 11, 31):
        out[f"ssim_map +cs reflect K={K} both grads"] = Call(map_cs("reflect", K), small, grads=(True, True))
    out["ssim_map valid no-cs"] = Call(
        lambda x, y: splatloss.ssim_map(x, y, padding="valid", backend=T).mean(), small, grads=(True, True)
    )
    out["ssim_map same +cs bf16"] = Call(map_cs("same"), small, "bfloat16", grads=(True, True))
    out["ssim valid fp16"] = Call(loss("valid"), small, "float16", grads=(True, True))
    out["ssim same channels-last"] = Call(loss(), small, layout="channels_last")
    out["ssim same hwc render"] = Call(loss(), (1, 3, 48, 160), layout="hwc")
    out["ssim same img2 only"] = Call(loss(), small, grads=(False, True))
    out["ssim same no grad"] = Call(loss(), small, grads=(False, False))
    out["ms_ssim no grad"] = Call(
        lambda x, y: splatloss.ms_ssim(x, y, backend=T), (1, 3, 176, 200), grads=(False, False)
    )

    # the forward's 64-register launches (launch.fwd_maxnreg): the statistics and the fused loss's
    # SSIM and L1 sums under "same" padding at every column window and in half precision, MS-SSIM's
    # scales under either padding
    def fused(K=11, padding="same"):
        return lambda x, y: splatloss.dssim_l1(x, y, padding=padding, window_size=K, backend=T)

    for K in (3, 5, 7, 9):
        out[f"ssim same no grad K={K}"] = Call(loss(K=K), small, grads=(False, False))
    for K in (3, 5, 7, 9, 11):
        out[f"dssim_l1 same no grad K={K}"] = Call(fused(K), small, grads=(False, False))
    for K in (3, 7, 11):  # "valid" padding reads no row outside the image (columns.hmoments, INSIDE)
        out[f"ssim valid no grad K={K}"] = Call(loss("valid", K), small, grads=(False, False))
        out[f"dssim_l1 valid no grad K={K}"] = Call(fused(K, "valid"), small, grads=(False, False))
    for dtype in ("float16", "bfloat16"):
        out[f"ssim same no grad {dtype}"] = Call(loss(), small, dtype, grads=(False, False))
        out[f"dssim_l1 same no grad {dtype}"] = Call(fused(), small, dtype, grads=(False, False))
        out[f"ssim valid no grad {dtype}"] = Call(loss("valid"), small, dtype, grads=(False, False))
    # one gradient, zero padding (the one-launch kernel; with the two lean launches,
    # split.ssim_moments_kernel and split.ssim_adjoint_kernel, as a variant below): the smallest
    # windows, half precision, the fused L1 term, a map-sized upstream with cs (ssim_map), the second
    # image's gradient (the default window: the calls above)
    out["ssim same grad x K=3"] = Call(loss(K=3), small)
    out["ssim valid grad x K=5"] = Call(loss("valid", 5), small)
    out["dssim_l1 same grad x K=7"] = Call(
        lambda x, y: splatloss.dssim_l1(x, y, padding="same", window_size=7, backend=T), small
    )
    out["ssim same grad x bfloat16"] = Call(loss(), small, "bfloat16")
    out["dssim_l1 valid grad y float16"] = Call(
        lambda x, y: splatloss.dssim_l1(x, y, padding="valid", backend=T), small, "float16", grads=(False, True)
    )
    out["ssim_map same +cs grad x"] = Call(map_cs("same"), small)
    out["ms_ssim same no grad"] = Call(
        lambda x, y: splatloss.ms_ssim(x, y, padding="same", backend=T), (1, 3, 176, 200), grads=(False, False)
    )
    out["mean_and_grad same"] = Call(
        lambda x, y: splatloss.dssim_with_gradient(x, y, padding="same", backend=T) and None,
        small,
        grads=(False, False),
    )
    for W in (8, 16, 24, 64):  # 8, 16, 32 and 64 columns per channel in a program of 128 lanes
        out[f"ssim same width {W}"] = Call(loss(), (2, 3, 24, W))
    out["ssim same K=31 width 32"] = Call(loss(K=31), (2, 3, 40, 32))
    for dtype in ("float32", "float16", "bfloat16"):
        out[f"ms_ssim loss {dtype}"] = Call(
            lambda x, y: 1 - splatloss.ms_ssim(x, y, tau=0.01, backend=T), (1, 3, 176, 200), dtype
        )
    out["ms_ssim odd sides, both grads"] = Call(
        lambda x, y: 1 - splatloss.ms_ssim(x, y, tau=0.01, padding="same", backend=T).mean(),
        (2, 3, 171, 163),
        layout="channels_last",
        grads=(True, True),
    )
    # the pyramid step called on its own (MS-SSIM's backward fuses its adjoint into the up kernel)
    down = importlib.import_module("splatloss.backends.triton.ms_ssim").downsample2x
    out["pyramid step alone"] = Call(lambda x, y: down(x).sum(), (1, 3, 41, 57))
    out["dssim_l1 same fp16"] = Call(
        lambda x, y: splatloss.dssim_l1(x, y, padding="same", backend=T), small, "float16", grads=(True, True)
    )

    def masked(fn, padding="same", K=11, per_channel=False):
        # a soft mask per image (and per channel): the masked kernels read it with its own strides
        def run(x, y):
            b, c, h, w = x.shape
            m = torch.rand(b, c if per_channel else 1, h, w, generator=torch.Generator().manual_seed(0))
            return fn(x, y, m.to(x.device), padding, K)

        return run

    def masked_loss(x, y, m, padding, K):
        return splatloss.dssim_l1(x, y, 0.2, mask=m, padding=padding, window_size=K, backend=T)

    def masked_ms(x, y, m, padding, K):
        return 1 - splatloss.ms_ssim(x, y, mask=m, padding=padding, window_size=K, tau=0.01, backend=T)

    # the fused loss ("same", "valid"; K = 11 has the most pending sums), its evaluation (the forward
    # kernel), "reflect" (the composition, one launch per gradient; the masked kernels take up to 9
    # taps under "reflect") and MS-SSIM's masked statistics
    out["masked dssim_l1 same K=11 both grads"] = Call(masked(masked_loss), small, grads=(True, True))
    out["masked dssim_l1 valid K=3 both grads"] = Call(masked(masked_loss, "valid", 3), small, grads=(True, True))
    out["masked dssim_l1 reflect K=9 both grads"] = Call(masked(masked_loss, "reflect", 9), small, grads=(True, True))
    out["masked dssim_l1 same no grad, per channel"] = Call(
        masked(masked_loss, per_channel=True), small, grads=(False, False)
    )
    out["masked ms_ssim reflect K=9"] = Call(masked(masked_ms, "reflect", 9), (1, 3, 176, 200), grads=(True, True))
    # the masked forward of an image narrower than a program (several channels each: 128 registers;
    # the wide ones' 64-register launch is the per-channel call above)
    out["masked dssim_l1 same no grad, narrow"] = Call(masked(masked_loss), (2, 3, 48, 40), grads=(False, False))
    # one gradient ("same" / "valid"): the one-launch kernel's light launch at 168
    # (masked_kernels.BWD_LAUNCH), and as a variant (below) the two lean launches
    # (masked_split.masked_moments_kernel, masked_split.masked_adjoint_kernel at 64 registers, 72 on
    # sm_80) where the images' columns are contiguous or share their stride
    for padding, K in (("valid", 11), ("valid", 3)):
        out[f"masked dssim_l1 {padding} K={K} grad x"] = Call(masked(masked_loss, padding, K), small)
    out["masked dssim_l1 same K=11 grad y, per channel bf16"] = Call(
        masked(masked_loss, per_channel=True), small, "bfloat16", grads=(False, True)
    )
    out["masked ms_ssim same K=11 grad x"] = Call(masked(masked_ms), (1, 3, 176, 200))

    def apart(x, y, m, padding, K):  # the first image channels-last, the second contiguous
        return masked_loss(x.contiguous(memory_format=torch.channels_last), y, m, padding, K)

    out["masked dssim_l1 same K=11 grad x, strides apart"] = Call(masked(apart), small)
    out["masked dssim_l1 same K=11 grad x, channels-last"] = Call(masked(masked_loss), small, layout="channels_last")

    def coarse_narrow(x, y):
        # MS-SSIM's coarser scales of a 1080p image in 128-lane, 4-warp programs: a launch the list
        # measured on a GPU may keep (the public calls plan 256-lane ones)
        from splatloss.backends.triton import backward, glue
        from splatloss.backends.triton.ms_ssim import _coarse_dims
        from splatloss.config import SSIMConfig

        b, c, h, w = x.shape
        dims = [(h, w)] + _coarse_dims(h, w, 4)
        rest = sum(b * c * hs * ws for hs, ws in dims[1:])
        fx, fy = (torch.cat([t.detach().reshape(-1), t.new_zeros(rest)]) for t in (x, y))
        cfg = SSIMConfig()
        consts = (float(cfg.C1), float(cfg.C2))
        taps = glue.window_taps(cfg, x.device)
        backward.launch_bwd_scales(fx, fy, b, c, dims, taps, "valid", *consts, True, False, wide=False)

    out["ms_ssim coarse scales, 128 lanes"] = Call(coarse_narrow, (1, 3, 540, 960), grads=(False, False))

    lean = [k for k in out if " grad x" in k or " grad y" in k or k.startswith("ms_ssim loss ")]
    lean += ["ssim same channels-last", "ssim same hwc render"]  # columns a constant stride apart
    out.update({f"1080p {k}": v for k, v in cost_calls().items()})
    for k in lean:
        c = out[k]
        out[f"{k} (two launches)"] = c._replace(run=two_launches(c.run))
    return out


#: The kept gradient's in-place scaling (splatloss/backends/triton/rescale.py): every program first
#: reads its image's upstream and returns where it is the one the forward assumed. The recorder
#: evaluates that on the call's real upstreams and marks the launch (``RESCALE_SKIP``): skipped,
#: only the upstreams are read (its instructions are still counted whole, both paths: a slight
#: over-count); otherwise the gradient is read and written once (not the cached scratch that
#: other read-and-written arguments are assumed to be).
RESCALE_KERNEL = "_rescale_kernel"
RESCALE_SKIP = "__rescale_skip__"


def record_calls(archs, calls: Dict[str, Call], geometry: Optional[Dict[str, object]] = None):
    """Run ``calls`` on CPU tensors with every Triton launch intercepted:
    the launch is bound and specialised by Triton's own binder for each architecture (which
    integers are 1 or multiples of 16, pointer alignment, constexprs, num_warps, maxnreg) and
    recorded, nothing runs. The package is told to plan CUDA launches (its CUDA geometry) and
    its input check to accept CPU tensors; torch ops outside the kernels (glue) are recorded by
    a dispatch mode. Outputs of the skipped kernels are uninitialised: only shapes matter.

    ``geometry``: attributes of the package's geometry module (:data:`GEOMETRY_MODULE`) to set
    while recording, e.g. ``{"CUDA_ROWS": 64}`` (the cost model's geometry search); each must
    exist there."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from triton import knobs
    from triton.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    if not hasattr(tri_launch, "FORCE_CUDA_GEOMETRY"):
        raise RuntimeError(
            "splatloss.backends.triton.launch.FORCE_CUDA_GEOMETRY is gone: the cost model needs a "
            "switch that makes the launchers plan CUDA launches for CPU tensors"
        )
    backends = {a: make_backend(GPUTarget("cuda", a, 32)) for a in archs}
    current: List = []

    def run(self, *args, grid, warmup, **kwargs):
        kwargs = dict(kwargs)
        kwargs.setdefault("debug", False)
        per_arch = {}
        bound = None
        for a, be in backends.items():
            kw = kwargs
            # the launchers plan for the model GPU (sm_90); a ceiling that depends on the
            # architecture (the lean forward's: launch.lean_fwd_maxnreg) is the one that arch gets
            if kwargs.get("maxnreg") == tri_launch.lean_fwd_maxnreg(tri_launch.MODEL_ARCH):
                kw = dict(kwargs, maxnreg=tri_launch.lean_fwd_maxnreg(a))
            binder = create_function_from_signature(self.signature, self.params, be)
            bound, spec, opts = binder(*args, **kw)
            options, signature, constexprs, attrs = self._pack_args(be, kw, bound, spec, opts)
            per_arch[a] = (signature, constexprs, attrs, options)
        if callable(grid):
            grid = grid(bound)
        # tensors as their sizes only: a reference held here would make autograd copy the gradient
        args_info = {n: _TensorInfo.of(v) if isinstance(v, torch.Tensor) else v for n, v in bound.items()}
        if self.fn.__name__ == RESCALE_KERNEL:  # its upstreams are real (autograd's): which programs return at once
            u = bound["u_ptr"].detach().numpy()  # (numpy: no torch op for the glue recorder to count)
            args_info[RESCALE_SKIP] = bool((u == numpy.float32(bound["expect"])).all())
        current.append(Launch(self, tuple(int(g) for g in grid), args_info, per_arch))
        return None

    view_like = ("empty", "view", "expand", "as_strided", "alias", "detach", "unsqueeze", "squeeze", "permute")

    class GlueMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
            ns = getattr(func, "namespace", "aten")
            if ns == "aten" and not any(v in name for v in view_like):
                ins = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
                outs = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
                in_ptrs = {t.untyped_storage().data_ptr() for t in ins}
                new = [t for t in outs if t.untyped_storage().data_ptr() not in in_ptrs]
                # writes one of its arguments: in place (mul_) or into an out= tensor (mul.out)
                inplace = bool(getattr(getattr(func, "_schema", None), "is_mutable", False))
                if new or inplace:  # a kernel (not a view or an allocation)
                    uniq = {t.untyped_storage().data_ptr(): t for t in ins + outs}.values()  # in-place: once
                    el = sum(t.numel() for t in uniq)
                    nb = sum(min(t.numel() * t.element_size(), t.untyped_storage().nbytes()) for t in uniq)
                    current.append(Glue(name, el, nb))
            return out

    overrides = dict(geometry or {})
    for name in overrides:
        if not hasattr(tri_launch, name):
            raise ValueError(f"record_calls: {tri_launch.__name__} has no attribute {name!r} to override")
    recorded = {}
    saved = (JITFunction.run, tri_launch.FORCE_CUDA_GEOMETRY, os.environ.get("TRITON_INTERPRET"))
    saved_geometry = {name: getattr(tri_launch, name) for name in overrides}
    # While a launch hook is set the package launches every kernel through ``kernel[grid]``
    # (JITFunction.run, replaced here), as it does for profilers; its cached path would first ask
    # the CUDA driver for the current device, and there is no GPU here. The hook itself never runs.
    hooks = knobs.runtime.launch_enter_hook
    saved_hook = None if hasattr(hooks, "add") else hooks  # a chain of calls (Triton 3.7) or a callable

    def recording_hook(*args, **kwargs):
        return None

    if hasattr(hooks, "add"):
        hooks.add(recording_hook)
    else:
        knobs.runtime.launch_enter_hook = recording_hook
    JITFunction.run = run
    tri_launch.FORCE_CUDA_GEOMETRY = True
    for name, value in overrides.items():
        setattr(tri_launch, name, value)
    os.environ["TRITON_INTERPRET"] = "1"  # only so that the input check accepts CPU tensors
    try:
        gen = torch.Generator().manual_seed(0)
        for name, call in calls.items():
            (x, xa), (y, ya) = (_image(call, gen, g) for g in call.grads)
            for _ in range(2):  # the second call: caches (window taps) warm, as in a training loop
                x.grad = y.grad = None
                current.clear()
                with GlueMode():
                    out = call.run(xa, ya)
                    if out is not None and out.requires_grad:
                        out.backward()
            recorded[name] = list(current)
    finally:
        JITFunction.run = saved[0]
        if hasattr(hooks, "remove"):
            hooks.remove(recording_hook)
        else:
            knobs.runtime.launch_enter_hook = saved_hook
        tri_launch.FORCE_CUDA_GEOMETRY = saved[1]
        for name, value in saved_geometry.items():
            setattr(tri_launch, name, value)
        if saved[2] is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved[2]
    return recorded


def _image(call: Call, gen, grad: bool):
    import torch

    B, C, H, W = call.shape
    dtype = getattr(torch, call.dtype)
    if call.layout == "hwc":  # (leaf, what the call gets)
        leaf = torch.rand((H, W, C), generator=gen).to(dtype).requires_grad_(grad)
        return leaf, leaf.permute(2, 0, 1)[None]
    t = torch.rand(call.shape, generator=gen).to(dtype)
    if call.layout == "channels_last":
        t = t.contiguous(memory_format=torch.channels_last)
    t.requires_grad_(grad)
    return t, t


def disasm(cubin: bytes) -> str:
    nvdisasm = os.path.join(os.path.dirname(CUOBJDUMP), "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as fh:
        fh.write(cubin)
        path = fh.name
    try:
        return subprocess.run([nvdisasm, "-c", "-gi", path], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)


def compile_key(launch: Launch, arch: int) -> str:
    sig, const, attrs, opts = launch.compile[arch]
    return repr(
        (launch.fn.fn.__module__, launch.fn.fn.__qualname__, arch, sig, const, attrs, sorted(opts.__dict__.items()))
    )


def compile_variant(launch: Launch, arch: int, cache: Optional[Dict[str, dict]] = None, maxnreg: Optional[int] = None):
    """Compile a recorded launch for ``arch`` as the launch would (``maxnreg``: another register
    ceiling, the cost model's geometry search) and analyse it: ``k`` (the compiled kernel),
    ``use`` (registers, stack, local, shared bytes), ``func`` (its SASS, :mod:`tools.kernel_analysis`),
    ``ir`` (its TTGIR loops), ``access`` (which pointer arguments it reads / writes), ``seconds``.
    ``cache``: a dict of earlier results by :func:`compile_key`."""
    import dataclasses

    sig, const, attrs, opts = launch.compile[arch]
    if maxnreg is not None:
        opts = dataclasses.replace(opts, maxnreg=maxnreg)
    key = compile_key(launch, arch) + ("" if maxnreg is None else f" maxnreg={maxnreg}")
    if cache is not None and key in cache:
        return cache[key]
    t0 = time.perf_counter()
    k = triton.compile(
        ASTSource(launch.fn, sig, const, attrs), target=GPUTarget("cuda", arch, 32), options=opts.__dict__
    )
    out = dict(
        k=k,
        use=resource_usage(k.asm["cubin"]),
        func=kernel_analysis.parse_sass(disasm(k.asm["cubin"]))[0],
        ir=kernel_analysis.ttgir_loops(k.asm["ttgir"]),
        access=kernel_analysis.pointer_access(k.asm["ttgir"]),
        seconds=time.perf_counter() - t0,
    )
    if cache is not None:
        cache[key] = out
    return out


def count_launch(launch: Launch, arch: int, variant: dict) -> dict:
    """What one recorded launch of a compiled ``variant`` issues and moves: ``programs``,
    ``warps``, ``regs``, ``smem`` and ``spill`` bytes, ``warp_instructions`` and ``bar_sync`` over
    the grid (SASS counts at the IR's trip counts), DRAM ``read`` / ``written`` bytes and
    ``scratch`` bytes (arguments both written and read, assumed cached), ``trips`` and how the
    loops were ``matched``."""
    k, use, func, ir = variant["k"], variant["use"], variant["func"], variant["ir"]
    warps = k.metadata.num_warps
    programs = 1
    for g in launch.grid:
        programs *= g
    ints = {n: int(v) for n, v in launch.args.items() if isinstance(v, (int, bool)) and not isinstance(v, float)}
    iters, entries = kernel_analysis.loop_iterations(ir, {n: ints.get(n) for n in ir[0]}, launch.grid)
    trips, matched = kernel_analysis.loop_trips(func, ir[2], iters, entries)
    counts = kernel_analysis.warp_counts(func, trips, programs)
    read = written = scratch = 0
    rescale = RESCALE_SKIP in launch.args
    for n, mode in variant["access"].items():
        t = launch.args.get(n)
        if not isinstance(t, _TensorInfo):
            continue
        if rescale and mode == "rw":
            if not launch.args[RESCALE_SKIP]:  # the gradient streamed through once, in place
                read += t.nbytes
                written += t.nbytes
        elif mode == "rw":
            scratch += t.nbytes  # written and read back by the same program: assumed cached
        elif mode == "r":
            read += t.nbytes
        else:
            written += t.nbytes
    return dict(
        variant=variant,
        programs=programs,
        warps=warps,
        regs=use["REG"],
        spill=use.get("STACK", 0) + use.get("LOCAL", 0),
        smem=max(int(k.metadata.shared), use.get("SHARED", 0)),
        warp_instructions=counts.instructions * warps,
        bar_sync=counts.bar_sync,
        counts=counts,
        trips=trips,
        matched=matched,
        read=read,
        written=written,
        scratch=scratch,
    )


def cost_main(archs, json_path=None) -> int:
    import json

    recorded = record_calls(archs, cost_calls())
    compiled: Dict[str, dict] = {}
    failures: List[str] = []
    report = {"shape": list(COST_SHAPE), "dtype": "float32", "machines": {}, "arch": {}, "spills": 0}
    total_spill = 0
    pixels = 1
    for d in COST_SHAPE:
        pixels *= d
    for arch in archs:
        mach = MACHINES[arch]
        report["machines"][f"sm_{arch}"] = mach
        issue_rate = mach["sms"] * mach["schedulers"] * mach["clock"]
        calls_out = {}
        for call, items in recorded.items():
            tot = dict(warp_instructions=0.0, bar=0.0, dram=0.0, scratch=0.0, issue_s=0.0, bound_s=0.0)
            kernels = []
            min_warps = None
            for it in items:
                if isinstance(it, Glue):
                    wi = it.elements * GLUE_WARP_INSTR_PER_ELEMENT
                    t_issue, t_dram = wi / issue_rate, it.nbytes / mach["dram"]
                    tot["warp_instructions"] += wi
                    tot["dram"] += it.nbytes
                    tot["issue_s"] += t_issue
                    tot["bound_s"] += max(t_issue, t_dram)
                    kernels.append(dict(kernel=f"torch {it.op}", glue=True, warp_instructions=wi, dram_bytes=it.nbytes))
                    continue
                c = count_launch(it, arch, compile_variant(it, arch, compiled))
                use, func = c["variant"]["use"], c["variant"]["func"]
                warps, spill, smem, programs = c["warps"], c["spill"], c["smem"], c["programs"]
                wi, trips, matched, counts = c["warp_instructions"], c["trips"], c["matched"], c["counts"]
                read, written, scratch = c["read"], c["written"], c["scratch"]
                ctas, res_warps = kernel_analysis.resident_warps(arch, use["REG"], warps, smem)
                min_warps = res_warps if min_warps is None else min(min_warps, res_warps)
                t_issue, t_dram = wi / issue_rate, (read + written) / mach["dram"]
                tot["warp_instructions"] += wi
                tot["bar"] += counts.bar_sync
                tot["dram"] += read + written
                tot["scratch"] += scratch
                tot["issue_s"] += t_issue
                tot["bound_s"] += max(t_issue, t_dram)
                if spill:
                    failures.append(f"{it.fn.fn.__name__} sm_{arch}: {spill} B of stack/local (register spills)")
                if smem > SHARED_LIMIT[arch]:
                    failures.append(f"{it.fn.fn.__name__} sm_{arch}: {smem} B shared > {SHARED_LIMIT[arch]}")
                total_spill += spill
                kernels.append(
                    dict(
                        kernel=it.fn.fn.__name__,
                        grid=list(it.grid),
                        warps=warps,
                        registers=use["REG"],
                        spill_bytes=spill,
                        shared_bytes=smem,
                        resident_ctas=ctas,
                        resident_warps=res_warps,
                        sass_instructions=len(func.instrs),
                        loops=len(func.loops),
                        loop_iterations_per_program=[t / programs for t in trips],
                        loops_matched_by=matched,
                        warp_instructions=wi,
                        bar_sync=counts.bar_sync,
                        dram_read_bytes=read,
                        dram_write_bytes=written,
                        scratch_bytes=scratch,
                        estimate_us=max(t_issue, t_dram) * 1e6,
                    )
                )
            calls_out[call] = dict(
                warp_instructions_per_pixel=tot["warp_instructions"] / pixels,
                bar_per_pixel=tot["bar"] / pixels,
                dram_bytes_per_pixel=tot["dram"] / pixels,
                scratch_bytes_per_pixel=tot["scratch"] / pixels,
                min_warps_per_sm=min_warps,
                estimate_issue_us=tot["issue_s"] * 1e6,
                estimate_us=tot["bound_s"] * 1e6,
                launches=len(items),
                kernels=kernels,
            )
        report["arch"][f"sm_{arch}"] = {"calls": calls_out}
    report["spills"] = total_spill
    main_arch = f"sm_{90 if 90 in archs else archs[0]}"
    report["calls"] = {
        name: {k: v for k, v in c.items() if k != "kernels"} for name, c in report["arch"][main_arch]["calls"].items()
    }
    report["calls_arch"] = main_arch

    hdr = (
        f"{'call':<30} {'sm':>3} {'warp-instr/px':>13} {'bar/px':>8} {'DRAM B/px':>9} {'warps/SM':>8} "
        f"{'issue us':>8} {'est us':>8} {'launches':>8}"
    )
    print(hdr)
    print("-" * len(hdr))
    for arch in archs:
        for name, c in report["arch"][f"sm_{arch}"]["calls"].items():
            print(
                f"{name:<30} {arch:>3} {c['warp_instructions_per_pixel']:>13.1f} {c['bar_per_pixel']:>8.3f} "
                f"{c['dram_bytes_per_pixel']:>9.1f} {c['min_warps_per_sm']!s:>8} {c['estimate_issue_us']:>8.0f} "
                f"{c['estimate_us']:>8.0f} {c['launches']:>8}"
            )
    print(
        f"\nmodelled, not measured: {COST_SHAPE} fp32; estimate on "
        + ", ".join(f"sm_{a}: {MACHINES[a]['name']}" for a in archs)
        + f"; total spills {total_spill} B"
    )
    if json_path:
        from splatloss.atomic import atomic_output

        with atomic_output(json_path) as tmp, open(tmp, "w") as fh:
            json.dump(report, fh, indent=1)
    if failures:
        print(f"\n{len(failures)} problem(s):")
        for f in failures:
            print("  " + f)
        return 1
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--arch", type=int, nargs="+", default=[80, 90], choices=[80, 90], help="SM versions (default 80 90)"
    )
    ap.add_argument("--quick", action="store_true", help="default window only")
    ap.add_argument("--only", metavar="REGEX", help="only the calls whose label matches REGEX")
    ap.add_argument(
        "--cost", action="store_true", help="static cost of the kernels the loss calls launch (see docs/triton.md)"
    )
    ap.add_argument("--json", metavar="FILE", help="with --cost: write the figures to FILE")
    args = ap.parse_args(argv)
    if args.only is not None:
        try:
            re.compile(args.only)
        except re.error as e:
            ap.error(f"--only {args.only!r} is not a regular expression ({e})")
    if args.json and not args.cost:
        ap.error("--json needs --cost")
    if args.json:  # checked before the minutes of compiling, not after
        from splatloss.atomic import check_output_file

        try:
            check_output_file("--json", args.json)
        except ValueError as e:
            ap.error(str(e))
    if args.cost:
        return cost_main(args.arch, args.json)

    failures = []
    header = (
        f"{'call':<40} {'kernel':<22} {'sm':>3} {'warps':>5} {'regs':>5} {'spill B':>7} {'smem B':>7} "
        f"{'limit':>7} {'s':>5}"
    )
    print(header)
    print("-" * len(header))
    compiled: Dict[str, tuple] = {}
    calls = aot_calls(args.quick)
    if args.only:
        calls = {k: v for k, v in calls.items() if re.search(args.only, k)}
        if not calls:
            ap.error(f"--only {args.only!r} matches none of the calls: {', '.join(aot_calls(args.quick))}")
    for label, items in record_calls(args.arch, calls).items():
        seen = set()
        for it in items:
            if isinstance(it, Glue):
                continue
            for arch in args.arch:
                key = compile_key(it, arch)
                if key in seen:
                    continue
                seen.add(key)
                name = it.fn.fn.__name__.strip("_")[:22]
                t0 = time.perf_counter()
                if key not in compiled:
                    sig, const, attrs, opts = it.compile[arch]
                    try:
                        k = triton.compile(
                            ASTSource(it.fn, sig, const, attrs),
                            target=GPUTarget("cuda", arch, 32),
                            options=opts.__dict__,
                        )
                        compiled[key] = (k, resource_usage(k.asm["cubin"]))
                    except Exception as exc:  # a compile error is a failure of this check, reported per case
                        compiled[key] = (None, f"{type(exc).__name__}: {exc}")
                k, use = compiled[key]
                if k is None:
                    failures.append(f"{label} {name} sm_{arch}: compile failed: {use}")
                    print(f"{label:<40} {name:<22} {arch:>3}  COMPILE FAILED")
                    continue
                warps = k.metadata.num_warps
                spill = use.get("STACK", 0) + use.get("LOCAL", 0)
                smem = max(int(k.metadata.shared), use.get("SHARED", 0))
                dt = time.perf_counter() - t0
                flag = ""
                if spill > 0:
                    failures.append(f"{label} {name} sm_{arch}: {spill} B of stack/local (register spills)")
                    flag = "  SPILL"
                if smem > SHARED_LIMIT[arch]:
                    failures.append(f"{label} {name} sm_{arch}: {smem} B shared > {SHARED_LIMIT[arch]}")
                    flag += "  SMEM"
                print(
                    f"{label:<40} {name:<22} {arch:>3} {warps:>5} {use['REG']:>5} {spill:>7} {smem:>7} "
                    f"{SHARED_LIMIT[arch]:>7} {dt:>5.1f}{flag}",
                    flush=True,
                )
    if failures:
        print(f"\n{len(failures)} problem(s):")
        for f in failures:
            print("  " + f)
        return 1
    print(
        "\nall kernels compiled for "
        + ", ".join(f"sm_{a}" for a in args.arch)
        + ": no spills, shared memory within limits"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
