"""Flat, piecewise-constant images against float64 truth: the hard case for float32 moments.

Two levels (0.2 and 0.8 rectangles) against a copy at 0.98x or 0.99x: most windows are flat, where
the local variances are differences of moments of magnitude 1 while ``C2 = 9e-4``, and the partials
w.r.t. the second moments are of order ``1 / C2``. Moments formed around one shift per plane leave
the gradients 5e-4 to 2e-3 from float64 here; the local shift (one per input row and column tile,
see :mod:`splatloss.backends.torch_fused`; per input row and map column in the Triton kernels,
:func:`splatloss.backends.triton.columns.vmoments`) makes the differences exactly 0 in flat
windows.

Each case is a batch of three seeds, one channel, checked against the float64 reference backend on
the very same input values: the SSIM and cs means per image and the gradients to both images of
``sum(u_s * ssim_mean + u_c * cs_mean)`` under fixed random upstreams, normwise
(``max |got - truth| / max |truth|``).

Masked, the same holds against the outside float64 oracle of ``tests/_mask_truth.py``: the masked
statistics are formed around the same local shifts, re-based row to row with each row's filtered
mask (:mod:`splatloss.backends.masked`).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _mask_truth import masked_ssim_stats as truth_masked_ssim_stats

from conftest import PADDINGS, backend_params, device_for, has_cuda, rel
from splatloss import backends
from splatloss.config import SSIMConfig

# Normwise bars against float64. Measured on these cases: torch values <= 1.8e-7, gradients <= 1.5e-5;
# cpu gradients <= 7.2e-6; triton (interpreter) values <= 3e-7, gradients <= 1.4e-5 (moments around
# one shift per plane: values up to 1.2e-5, gradients 5e-4 to 1.2e-3).
VALUE_TOL = 1e-6
GRAD_TOL = 3e-5
SEEDS = (0, 1, 2)


def _two_level(seed: int, h: int, w: int, lo: float = 0.2, hi: float = 0.8) -> torch.Tensor:
    """Six rectangles at ``hi`` on a ``lo`` background, ``[1, h, w]`` float32: at 96x128 the images of
    tests/test_ssim_bounds.py, at other sizes the same drawing scaled."""
    sh, sw = lambda n: round(n * h / 96), lambda n: round(n * w / 128)
    rng = np.random.default_rng(seed)
    img = np.full((1, h, w), lo, dtype=np.float32)
    for _ in range(6):
        r0, c0 = rng.integers(0, h - sh(20)), rng.integers(0, w - sw(20))
        img[:, r0 : r0 + rng.integers(sh(10), sh(40)), c0 : c0 + rng.integers(sw(10), sw(50))] = hi
    return torch.from_numpy(img)


def _pair(factor: float, h: int, w: int):
    x = torch.stack([_two_level(s, h, w) for s in SEEDS])  # [3, 1, h, w]
    return x, (x * factor).to(torch.float32)


def _outputs(name: str, x, y, padding: str, dtype, window_size: int = 11):
    """SSIM and cs means ``[B, 1]`` and the gradients to (x, y), on ``name``'s device, in float64."""
    dev = device_for(name) if name != "reference" else torch.device("cpu")
    x = x.to(dev, dtype).requires_grad_(True)
    y = y.to(dev, dtype).requires_grad_(True)
    s, c = backends.get(name).ssim_stats(x, y, SSIMConfig(padding=padding, window_size=window_size))
    g = torch.Generator().manual_seed(7)
    u_s, u_c = torch.rand(s.shape, generator=g, dtype=torch.float64) + 0.5, torch.rand(c.shape, generator=g) - 0.5
    total = (s * u_s.to(dev, s.dtype)).sum() + (c * u_c.to(dev, c.dtype)).sum()
    gx, gy = torch.autograd.grad(total, (x, y))
    return tuple(t.detach().double().cpu() for t in (s, c, gx, gy))


_TRUTH: dict = {}


def _pairs(factors, h: int, w: int):
    """``_pair`` of each factor, as one batch (factor-major: images ``3 i .. 3 i + 2`` are factor ``i``'s)."""
    x, y = zip(*(_pair(f, h, w) for f in factors))
    return torch.cat(x), torch.cat(y)


def _truth(factors, h: int, w: int, padding: str, window_size: int):
    """The float64 reference's ``_outputs`` on ``_pairs(factors, h, w)``, computed once per session (every
    backend's case of it compares with the same numbers)."""
    key = (factors, h, w, padding, window_size)
    if key not in _TRUTH:
        _TRUTH[key] = _outputs("reference", *_pairs(factors, h, w), padding, torch.float64, window_size)
    return _TRUTH[key]


def _cases():
    out = []
    for p in backend_params():
        name = p.values[0]
        marks = list(p.marks)
        factor_sets = ((0.98,), (0.99,))
        if name == "triton" and not has_cuda():
            marks.append(pytest.mark.slow)  # the interpreter: seconds per call, so both factors in one
            factor_sets = ((0.98, 0.99),)  # batch (a program holds every plane of a small batch)
        for padding in PADDINGS:
            for factors in factor_sets:
                case_id = f"{name}-{padding}-{'-'.join(map(str, factors))}"
                out.append(pytest.param(name, padding, factors, 11, marks=marks, id=case_id))
        # a 13-tap window: Triton's ring kernels (the column kernels end at 11 taps); "reflect" has
        # every border path (mirrored rows and columns) of the other paddings' plus its own
        for padding in PADDINGS if name != "triton" else ("reflect",):
            out.append(pytest.param(name, padding, (0.98,), 13, marks=marks, id=f"{name}-{padding}-0.98-K13"))
    return out


@pytest.mark.parametrize("backend, padding, factors, window_size", _cases())
def test_flat_two_level_images_match_float64(backend, padding, factors, window_size):
    # Triton in the interpreter gets small images (slow); the others the 96x128 of the bounds tests.
    h, w = (40, 48) if backend == "triton" and not has_cuda() else (96, 128)
    got = _outputs(backend, *_pairs(factors, h, w), padding, torch.float32, window_size)
    truth = _truth(factors, h, w, padding, window_size)
    n = len(SEEDS)
    for i, factor in enumerate(factors):  # each factor's images on their own
        part = slice(i * n, (i + 1) * n)
        errors = {what: rel(a[part], b[part]) for what, a, b in zip(("ssim", "cs", "grad_x", "grad_y"), got, truth)}
        bars = {"ssim": VALUE_TOL, "cs": VALUE_TOL, "grad_x": GRAD_TOL, "grad_y": GRAD_TOL}
        over = {what: f"{err:.3g} > {bars[what]:.1g}" for what, err in errors.items() if err > bars[what]}
        assert not over, f"{backend}, {padding}, {factor}x, {window_size} taps: normwise errors against float64: {over}"


@pytest.mark.parametrize("padding", PADDINGS)
def test_the_reference_computes_masked_statistics_in_float64(padding):
    # The oracle's masked SSIM of float32 images equals its float64 SSIM of the same values.
    x, y = _pair(0.98, 96, 128)
    mask = torch.rand(1, 1, 96, 128, generator=torch.Generator().manual_seed(0)) * 0.5 + 0.5

    def run(dtype):
        xr, yr = x.to(dtype).requires_grad_(True), y.to(dtype).requires_grad_(True)
        s, _ = backends.get("reference").masked_ssim_stats(xr, yr, mask.to(dtype), SSIMConfig(padding=padding))
        gx, gy = torch.autograd.grad(s.sum(), (xr, yr))
        assert s.dtype == dtype and gx.dtype == dtype
        return tuple(t.detach().double() for t in (s, gx, gy))

    got, truth = run(torch.float32), run(torch.float64)
    assert rel(got[0], truth[0]) <= 1e-7
    assert rel(got[1], truth[1]) <= 1e-6 and rel(got[2], truth[2]) <= 1e-6


# Masked: every backend forms the masked statistics around local shifts. Measured on these cases
# against the float64 oracle: torch values <= 2.3e-7, gradients <= 2.1e-5; cpu values <= 6.8e-8,
# gradients <= 1.3e-5 (one shift per plane: values up to 4.2e-6 / 8.3e-6, gradients 6e-4 to 9.7e-4 /
# 3.7e-4 to 8e-4); triton (interpreter) values <= 7.5e-8, gradients <= 1.9e-5 (one shift per program:
# values up to 1.3e-5, gradients 3.4e-4 to 1.1e-3).


def _masked_cases():
    out = []
    for p in backend_params(("torch", "cpu", "triton")):
        name = p.values[0]
        marks = list(p.marks)
        factor_sets, kind_sets = ((0.98,), (0.99,)), (("soft",), ("binary",))
        if name == "triton" and not has_cuda():
            marks.append(pytest.mark.slow)
            # one batch in the interpreter (a program holds every plane of a small batch, as above)
            factor_sets, kind_sets = ((0.98, 0.99),), (("soft", "binary"),)
        for padding in PADDINGS:
            # Triton's masked kernels take "reflect" up to 9 taps (wider: the shared composition)
            k = 9 if name == "triton" and padding == "reflect" else 11
            for factors in factor_sets:
                for kinds in kind_sets:
                    case_id = f"{name}-{padding}-{'-'.join(map(str, factors))}-{'-'.join(kinds)}-K{k}"
                    out.append(pytest.param(name, padding, factors, kinds, k, marks=marks, id=case_id))
    return out


def _masked_pair(factor: float, h: int, w: int):
    """Two channels per image (two drawings), three images: ``[3, 2, h, w]`` and its copy at ``factor``."""
    x = torch.stack([torch.cat([_two_level(s, h, w), _two_level(s + 10, h, w)]) for s in SEEDS])
    return x, (x * factor).to(torch.float32)


def _mask(kind: str, h: int, w: int) -> torch.Tensor:
    """``"soft"``: weights in [0.5, 1], one plane per image for both channels, ``[3, 1, h, w]``.
    ``"binary"``: 0 / 1 per channel ``[3, 2, h, w]``, with an empty band of 12 rows (wider than the
    window: map positions there have no mask weight at all) and one empty channel (SSIM 1)."""
    g = torch.Generator().manual_seed(11)
    if kind == "soft":
        return torch.rand(len(SEEDS), 1, h, w, generator=g) * 0.5 + 0.5
    m = (torch.rand(len(SEEDS), 2, h, w, generator=g) > 0.25).to(torch.float32)
    m[..., h // 3 : h // 3 + 12, :] = 0
    m[1, 1] = 0
    return m


def _masked_outputs(name: str, x, y, m, padding: str, dtype, window_size: int = 11):
    """Masked SSIM and cs means ``[B, C]`` and the gradients to (x, y) in float64; ``"truth"``: the
    float64 oracle of ``tests/_mask_truth.py``."""
    dev = device_for(name) if name != "truth" else torch.device("cpu")
    x, y = x.to(dev, dtype).requires_grad_(True), y.to(dev, dtype).requires_grad_(True)
    if name == "truth":
        s, c = truth_masked_ssim_stats(x, y, m.to(dtype), padding=padding, window_size=window_size)
    else:
        cfg = SSIMConfig(padding=padding, window_size=window_size)
        s, c = backends.get(name).masked_ssim_stats(x, y, m.to(dev, dtype), cfg)
    g = torch.Generator().manual_seed(7)
    u_s, u_c = torch.rand(s.shape, generator=g, dtype=torch.float64) + 0.5, torch.rand(c.shape, generator=g) - 0.5
    total = (s * u_s.to(dev, s.dtype)).sum() + (c * u_c.to(dev, c.dtype)).sum()
    gx, gy = torch.autograd.grad(total, (x, y))
    return tuple(t.detach().double().cpu() for t in (s, c, gx, gy))


_MASKED_TRUTH: dict = {}


@pytest.mark.parametrize("backend, padding, factors, kinds, window_size", _masked_cases())
def test_flat_two_level_images_under_a_mask_match_float64(backend, padding, factors, kinds, window_size):
    h, w = 40, 48
    parts = [(f, kind) for f in factors for kind in kinds]  # one batch, three images per part
    x, y = (torch.cat(t) for t in zip(*(_masked_pair(f, h, w) for f, _ in parts)))
    masks = [_mask(kind, h, w) for _, kind in parts]
    if len(kinds) > 1:  # the soft mask is one plane per image: as a batch with the binary one, two
        masks = [mk.expand(len(SEEDS), 2, h, w) for mk in masks]
    m = torch.cat(masks)
    key = (factors, kinds, padding, window_size)
    if key not in _MASKED_TRUTH:
        _MASKED_TRUTH[key] = _masked_outputs("truth", x, y, m, padding, torch.float64, window_size)
    got = _masked_outputs(backend, x, y, m, padding, torch.float32, window_size)
    n = len(SEEDS)
    for i, (factor, kind) in enumerate(parts):  # each part's images on their own
        part = slice(i * n, (i + 1) * n)
        pairs = zip(("ssim", "cs", "grad_x", "grad_y"), got, _MASKED_TRUTH[key])
        errors = {what: rel(a[part], b[part]) for what, a, b in pairs}
        bars = {"ssim": VALUE_TOL, "cs": VALUE_TOL, "grad_x": GRAD_TOL, "grad_y": GRAD_TOL}
        over = {what: f"{err:.3g} > {bars[what]:.1g}" for what, err in errors.items() if err > bars[what]}
        what = f"{backend}, {padding}, {factor}x, {kind} mask, {window_size} taps"
        assert not over, f"{what}: normwise errors against float64: {over}"
