"""Shared test data for the backend conformance suite (tests/backends/) and the core tests.

Image pairs: random correlated pairs (SSIM far from 0, so both of its terms matter), crops of real
photographs from scikit-image (``_truth.photo`` / ``_truth.distort``), and awkward sizes.

Tolerances (``TOL``) are normwise relative errors, ``max|got - truth| / max|truth|``, against the
float64 reference computed on the very same input values; SSIM maps and gradients cross zero, where
a pointwise relative error means nothing. Each entry carries the error measured when it was set.
"""

from __future__ import annotations

import copy
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # tests/_truth.py for tests/backends/*

# Backends the conformance suite runs: every one that computes SSIM its own way. "reference" is the
# truth they are measured against (in float64), so it is not in this list.
CONFORMING = ("torch", "cpu", "triton")
PADDINGS = ("valid", "same", "reflect")

# Normwise relative tolerance of fp32 inputs against the float64 reference, per backend:
# (values, gradients). Measured:
#   torch / cpu: ssim_stats values <= 1.3e-7, gradients <= 1.1e-6; window options values <= 1.2e-7,
#     gradients <= 2.3e-6 (max |grad| ~4e-3); MS-SSIM values <= 5e-6, gradients <= 3.5e-5 (the fp32
#     reference's own MS-SSIM gradient is 5.1e-5 off).
#     The conformance suite (random pairs, every entry point and padding): values <= 2.5e-7, gradients
#     <= 4.5e-7, maps <= 4.1e-7.
#   triton: every value and gradient within 1e-5 (the kernels' documented bar).
#   "map": SSIM / cs maps, whose pixels are O(1): the fp32 per-pixel bar of 1e-5 (measured <= 2.4e-6 on
#     the tiny images and borders of test_options_and_borders.py).
TOL = {
    "torch": {"values": 1e-6, "grads": 1e-5, "map": 1e-5, "ms_values": 2e-5, "ms_grads": 1e-4},
    "cpu": {"values": 1e-6, "grads": 1e-5, "map": 1e-5, "ms_values": 2e-5, "ms_grads": 1e-4},
    "triton": {"values": 1e-5, "grads": 1e-5, "map": 1e-5, "ms_values": 1e-5, "ms_grads": 1e-5},
}
# float64 inputs against float64 truth, normwise: every entry point, value and gradient, masked or not,
# measured <= 2.4e-14 (tests/backends/test_values_and_gradients.py); the compiled kernel and the torch
# ops agree with each other to the same round-off.
FP64_REL = 1e-12
# Masked fp32 inputs against the float64 oracle of the masked semantics, normwise: the bars of the masked
# statistics (values 2e-5, gradients 1e-4). Measured on random pairs: maps 2.1e-6, means <= 2.5e-7,
# gradients <= 9.1e-7; on the astronaut crops with a soft mask: maps 4.7e-5, means <= 4.9e-7, gradients
# <= 2.7e-5 (flat regions: cancellation in the fp32 variances).
MASKED_TOL = {"values": 2e-5, "grads": 1e-4, "map": 1e-4, "ms_values": 2e-5, "ms_grads": 1e-4}
# fp16 / bf16 gradients against float64 truth: the fp32 gradient rounded once to the dtype is within
# half an ulp of the dtype at each element (its exact spacing there, subnormals included) plus the
# fp32 gradient's own error, ROUNDED_ONCE of the gradient's max-abs scale. Measured on the conformance
# suite (every backend, entry point, padding and mask): <= 2.9e-7 beyond the half ulp; a gradient
# rounded more than once (fp16 / bf16 partial gradients summed in fp16 / bf16) is 1.4e-4 to 3.3e-3
# beyond it.
ROUNDED_ONCE = 1e-5

# dtypes each backend accepts (Triton computes in fp32 and refuses float64 with a TypeError).
DTYPES = {
    "torch": (torch.float32, torch.float64, torch.float16, torch.bfloat16),
    "cpu": (torch.float32, torch.float64, torch.float16, torch.bfloat16),
    "triton": (torch.float32, torch.float16, torch.bfloat16),
}
# largest window each backend supports
MAX_WINDOW = {"torch": None, "cpu": None, "triton": 31}
# backends whose results are promised bitwise equal from run to run
DETERMINISTIC = ("torch", "cpu", "triton")
# backends whose backward is differentiable again (double backward, gradgradcheck, torch.func)
SECOND_ORDER = ("torch", "cpu")


def has_cuda() -> bool:
    return torch.cuda.is_available()


# Tests that run for minutes, first: the ahead-of-time compiles (minutes each with an empty Triton
# cache) and the longest single tests. pytest-xdist's worksteal hands each worker a contiguous half
# of the collection and an idle worker steals from the end of the other's queue, so a long test
# collected late runs alone at the end of the suite; started first, the rest is spread around it.
LONG_FIRST = (
    "tests/test_triton_aot.py::",
    "tests/test_sass_cost.py::test_cost_json_structure_no_spills",
    "tests/test_sass_cost.py::test_launch_tables_propose_full_waves",
    "tests/test_compile.py::test_triton_backend_compiles_fullgraph_on_the_first_call_and_equals_eager",
    "tests/test_bench.py::test_bench_smoke_writes_json_and_plot",
)


def _long_first(item) -> int:
    return next((i for i, p in enumerate(LONG_FIRST) if item.nodeid.startswith(p)), len(LONG_FIRST))


def pytest_collection_modifyitems(config, items):
    """The tests of ``LONG_FIRST`` run first, in its order (the order is otherwise kept). Without a
    CUDA device the Triton modules' docstring examples are ``slow``. With a CUDA device every Triton
    test runs the compiled kernels: mark it ``gpu`` too, so that ``./dev test -m gpu`` is the whole
    GPU check (the conformance cases and the Triton-only tests)."""
    items.sort(key=_long_first)
    if not has_cuda():
        # The examples run the kernels in the interpreter, seconds each (the fast tier's slowest Triton
        # tests); the fast tier runs the same functions and kernels in its conformance cases
        # (tests/backends/), the whole suite the examples too.
        for item in items:
            if isinstance(item, pytest.DoctestItem) and item.nodeid.startswith("splatloss/backends/triton/"):
                item.add_marker(pytest.mark.slow)
    if has_cuda():
        for item in items:
            if item.get_closest_marker("triton") is not None:
                item.add_marker(pytest.mark.gpu)


def device_for(name: str) -> torch.device:
    """Triton runs on CUDA where a GPU exists (else in the interpreter on the CPU); "cpu" is the CPU."""
    if name == "triton" and has_cuda():
        return torch.device("cuda")
    return torch.device("cpu")


def backend_params(names=CONFORMING, slow_triton=False):
    """pytest params for ``names``: Triton marked ``triton`` (and ``gpu`` where CUDA exists; ``slow``
    too when ``slow_triton`` and it runs in the interpreter)."""
    out = []
    for name in names:
        marks = []
        if name == "triton" and slow_triton and not has_cuda():
            marks.append(pytest.mark.slow)
        if name == "triton":
            marks.append(pytest.mark.triton)
            if has_cuda():
                marks.append(pytest.mark.gpu)
        out.append(pytest.param(name, marks=marks, id=name))
    return out


def backend_cases(cases, fast_triton=None, names=CONFORMING):
    """pytest params for ``(backend, *case)`` over ``names`` x ``cases``. Triton in the interpreter is
    marked ``slow`` for every case but ``fast_triton``: the one the fast tier keeps for that test."""
    out = []
    for name in names:
        for case in cases:
            case = case if isinstance(case, tuple) else (case,)
            (p,) = backend_params([name], slow_triton=case != fast_triton)
            out.append(pytest.param(name, *case, marks=p.marks, id="-".join(map(str, (name, *case)))))
    return out


def side(name: str, big: int, small: int) -> int:
    """Image side for a backend: ``small`` for Triton in the interpreter (slow), else ``big``."""
    return small if name == "triton" and not has_cuda() else big


def make_pair(shape, dtype=torch.float32, seed=0, device="cpu", *, mix=0.6, scale=1.0, requires_grad=False):
    """The suite's random image pair: ``x`` uniform in [0, scale), ``y = mix x + (1 - mix) noise``
    (correlated, so SSIM is far from 0 and both of its terms matter; ``mix=0`` gives an independent
    pair). Drawn in float64 then cast, so every dtype sees the same values."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=g, dtype=torch.float64)
    y = (mix * x + (1 - mix) * torch.rand(shape, generator=g, dtype=torch.float64)).clamp(0, 1)
    x, y = (x * scale).to(device=device, dtype=dtype), (y * scale).to(device=device, dtype=dtype)
    return x.requires_grad_(requires_grad), y.requires_grad_(requires_grad)


def photo_arrays(h: int, w: int, seed: int = 0, *, name: str = "astronaut", top: int = 100, left: int = 150):
    """A crop of a scikit-image photograph and a shifted, brightened, noisy copy: float64 ``(h, w, 3)``
    numpy arrays, the inputs of the outside truths in ``_truth``."""
    from _truth import distort, photo

    a = photo(name, top, left, h, w)
    return a, distort(a, seed)


def photo_pair(h: int, w: int, seed: int = 0, dtype=torch.float64, device="cpu", *, batch: int = 1, channels: int = 3):
    """The suite's real-image pair ``(batch, channels, h, w)``: image ``i`` of the batch is the
    astronaut crop ``photo_arrays`` makes 20 rows further down, and its distorted copy."""
    from _truth import to_torch

    xs, ys = [], []
    for i in range(batch):
        a, b = photo_arrays(h, w, seed + i, top=100 + 20 * i, left=140)
        xs.append(to_torch(a, dtype)[:, :channels])
        ys.append(to_torch(b, dtype)[:, :channels])
    return torch.cat(xs).to(device), torch.cat(ys).to(device)


def rel(got, truth) -> float:
    got, truth = got.detach().double().cpu(), truth.detach().double().cpu()
    return float((got - truth).abs().max() / truth.abs().max().clamp_min(1e-30))


def assert_rel(got, truth, tol, what=""):
    err = rel(got, truth)
    assert err <= tol, f"{what}: normwise relative error {err:.3g} > {tol:.1g}"


def half_ulp(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Half the spacing of ``dtype`` (float16 / bfloat16) at each element of the float64 ``t``."""
    info = torch.finfo(dtype)
    exponent = torch.frexp(t.abs().clamp_min(info.tiny))[1] - 1  # floor(log2 |t|), at least the normal range's
    mantissa_bits = {torch.float16: 10, torch.bfloat16: 7}[dtype]
    return torch.ldexp(torch.ones_like(t), exponent - mantissa_bits - 1)


def assert_rounded_once(got, truth, dtype, what="", truncated=False):
    """fp16 / bf16 gradient equal to the float64 ``truth`` rounded once to ``dtype``: within half an ulp
    of ``dtype`` at each element plus ``ROUNDED_ONCE`` of the max-abs scale (the fp32 computation).
    ``truncated``: a whole ulp, for a conversion that truncates instead of rounding to nearest (the
    Triton interpreter's fp32 -> bf16: a kernel that stores a bf16 gradient is one ulp off there)."""
    assert got.dtype == dtype, f"{what}: gradient dtype {got.dtype}, expected {dtype}"
    a, t = got.detach().double().cpu(), truth.detach().double().cpu()
    scale = float(t.abs().max())
    ulps = 2 if truncated else 1
    beyond = float(((a - t).abs() - ulps * half_ulp(t, dtype)).max()) / max(scale, 1e-30)
    assert beyond <= ROUNDED_ONCE, (
        f"{what}: {dtype} gradient {beyond:.3g} of its scale beyond {'one' if truncated else 'half an'} ulp of "
        f"float64 truth (> {ROUNDED_ONCE:g}): it was rounded more than once"
    )


@pytest.fixture(params=backend_params(slow_triton=True))
def backend(request):
    """Every conforming backend that can run here; Triton in the interpreter is marked ``slow``. A
    test that is the fast tier's Triton case of its entry point parametrizes ``backend`` itself, with
    ``backend_params()`` or ``backend_cases(..., fast_triton=...)``."""
    return request.param


_SCENES: dict = {}


@pytest.fixture
def scenes_built_once(monkeypatch):
    """Training runs get the embedded scene (``splatloss.splat.synthetic.default_scene``, which their
    config names) built once per set of arguments in a session, a fresh copy each run: runs that differ
    only in what they train skip rendering the same views again. The scene is deterministic for its
    arguments (tests/test_splat_scenes.py), which every direct call of it still builds."""
    from splatloss.splat import synthetic

    build = synthetic.default_scene

    def built_once(*args, **kwargs):
        key = (args, tuple(sorted(kwargs.items())))
        if key not in _SCENES:
            _SCENES[key] = build(*args, **kwargs)
        return copy.deepcopy(_SCENES[key])

    monkeypatch.setattr(synthetic, "default_scene", built_once)
