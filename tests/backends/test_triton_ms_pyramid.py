"""Triton MS-SSIM's scales as one op (``ms_ssim.ms_terms``) against the scale-by-scale composition.

The op runs every scale's term in its forward and, in its backward, one launch per scale that joins
the scale's kept gradient to the 2x2 step's adjoint of the coarser scale's. The composition it
replaces is autograd over ``ssim_term`` per scale and the standalone 2x2 step (its own backward
kernel), with autograd's sums in between: the same products, scalings and sums per pixel, so in
the interpreter both give the same terms and gradients bit for bit (on CUDA a fused multiply-add
may round once where the composition rounds twice).
"""

import pytest
import torch

from conftest import assert_rel, device_for, has_cuda, make_pair
from splatloss import multiscale
from splatloss.backends.triton import ms_ssim as M
from splatloss.backends.triton.glue import window_taps
from splatloss.backends.triton.ssim import ssim_term
from splatloss.config import SSIMConfig

pytestmark = pytest.mark.triton

# CUDA: the fused kernel's multiply-add may round once where the composition rounds twice
SAME_GRADIENT = 1e-6


def _same(got, want, what):
    if has_cuda():
        assert_rel(got, want, SAME_GRADIENT, what)
    else:
        assert torch.equal(got, want), f"{what}: max |diff| {(got - want).abs().max().item():.3g}"


def _terms_both_ways(x, y, cfg, scales, need1, need2, upstream):
    """(terms, grads) through the one op and through the scale-by-scale composition, for the same
    upstream gradient of the terms."""
    out = []
    for fused in (True, False):
        xa = x.clone().requires_grad_(need1)
        ya = y.clone().requires_grad_(need2)
        if fused:
            terms = M.ms_terms(xa, ya, cfg, scales)
        else:
            # each scale's gradient for a unit upstream, as the one op keeps them (not the D-SSIM
            # loss's upstream, which ssim_term assumes by default: another rounding)
            term = lambda last, a, b: ssim_term(a, b, cfg, cs=not last, expect=1.0)  # noqa: E731
            terms = multiscale.scale_terms(term, (xa, ya), scales, down=M.downsample2x, cast=False)
        wrt = [t for t, need in ((xa, need1), (ya, need2)) if need]
        grads = torch.autograd.grad((terms * upstream).sum(), wrt)
        out.append((terms.detach(), grads))
    return out


@pytest.mark.parametrize(
    "shape, layout, padding, need, window_size",
    [
        ((2, 2, 21, 27), "contiguous", "same", (True, False), 3),  # odd sides: 21x27, 11x14, 6x7
        pytest.param((1, 3, 36, 41), "channels_last", "valid", (True, True), 3, marks=pytest.mark.slow),
        pytest.param((1, 2, 40, 33), "contiguous", "reflect", (False, True), 3, marks=pytest.mark.slow),
        # 13 taps: the ring kernels, one launch per coarser scale writing into the flat gradients
        pytest.param((1, 2, 30, 35), "contiguous", "same", (True, True), 13, marks=pytest.mark.slow),
    ],
)
def test_one_op_equals_the_scale_by_scale_composition(shape, layout, padding, need, window_size):
    dev = device_for("triton")
    cfg = SSIMConfig(window_size=window_size, padding=padding)
    scales = 3
    x, y = make_pair(shape, seed=23, device=dev)
    if layout == "channels_last":
        x, y = (t.contiguous(memory_format=torch.channels_last) for t in (x, y))
    g = torch.Generator().manual_seed(5)
    upstream = torch.randn((shape[0], shape[1], scales), generator=g).to(dev)  # not uniform
    (t_fused, g_fused), (t_comp, g_comp) = _terms_both_ways(x, y, cfg, scales, *need, upstream)
    _same(t_fused, t_comp, "terms")
    for i, (a, b) in enumerate(zip(g_fused, g_comp)):
        _same(a, b, f"gradient {i}")
        # in the input's layout (the composition's sum came out contiguous for a channels-last input)
        assert a.stride() == x.stride(), (a.stride(), x.stride())


@pytest.mark.slow
def test_a_gradient_the_forward_did_not_compute_is_computed_again():
    # the op told that img1 needs no gradient (as when autograd's request was not foreseen): its
    # backward runs the forward again with that gradient, and gets the same numbers
    dev = device_for("triton")
    cfg = SSIMConfig(window_size=3)
    x, y = make_pair((1, 2, 30, 34), seed=4, device=dev)
    w = window_taps(cfg, dev)
    up = torch.randn((1, 2, 2), generator=torch.Generator().manual_seed(1)).to(dev)
    grads = []
    for told in (True, False):
        xa = x.clone().requires_grad_()
        terms = M._terms_call(xa, y, w, cfg.padding, float(cfg.C1), float(cfg.C2), 2, told, False)[0]
        grads.append(torch.autograd.grad((terms * up).sum(), xa)[0])
    _same(grads[1], grads[0], "recomputed gradient")


@pytest.mark.slow
def test_the_backward_is_one_launch(monkeypatch):
    # the fused chain only, every scale in one launch: no standalone 2x2 adjoint, no elementwise
    # torch op on the image grid
    dev = device_for("triton")
    cfg = SSIMConfig(window_size=3)
    x, y = make_pair((1, 1, 30, 34), seed=8, device=dev)
    calls = []
    for name in ("_chain_kernel", "_down_bwd_kernel"):
        kernel = getattr(M, name)
        monkeypatch.setattr(kernel, "run", lambda *a, _n=name, _run=kernel.run, **k: calls.append(_n) or _run(*a, **k))
    xa = x.clone().requires_grad_()
    terms = M.ms_terms(xa, y, cfg, 3)
    terms.sum().backward()
    assert calls == ["_chain_kernel"]


@pytest.mark.slow
def test_the_coarser_scales_in_one_launch_equal_their_own_launches(monkeypatch):
    # The CUDA geometry in 8-row chunks: the second scale in two column strips and three row
    # chunks, the third in one strip of two chunks, the fourth in 256-lane frames where its own
    # launch packs two channels per program. The one launch gives every gradient bit for bit as
    # the scale's own launch (the terms' sums group their lanes by the frame: to rounding), in
    # its wide programs and its narrow ones; so does the forward's one launch its terms' sums.
    from splatloss.backends.triton import backward as BW
    from splatloss.backends.triton import launch as L

    monkeypatch.setattr(L, "FORCE_CUDA_GEOMETRY", True)
    monkeypatch.setattr(L, "CUDA_ROWS", 8)
    monkeypatch.setattr(L, "ROW_STEPS", ())
    dev = device_for("triton")
    padding, need = "reflect", (True, True)
    cfg = SSIMConfig(padding=padding, window_size=3)  # 3 taps: short halos, a quicker interpreter
    w = window_taps(cfg, dev)
    B, C, dims = 1, 2, [(24, 300), (12, 150), (6, 75)]
    xs = [make_pair((B, C, h, wd), seed=30 + j, device=dev) for j, (h, wd) in enumerate(dims)]
    flat = [torch.cat([p[i].reshape(-1) for p in xs]) for i in (0, 1)]
    calls = []
    for kernel in (BW.ssim_bwd_kernel, BW.ssim_bwd_scales_kernel):
        name = kernel.fn.__name__
        monkeypatch.setattr(kernel, "run", lambda *a, _n=name, _run=kernel.run, **k: calls.append(_n) or _run(*a, **k))
    gx, gy, terms = BW.launch_bwd_scales(*flat, B, C, dims, w, padding, float(cfg.C1), float(cfg.C2), *need)
    assert calls == ["ssim_bwd_scales_kernel"]
    at = 0
    for j, ((x, y), (h, wd)) in enumerate(zip(xs, dims)):
        last = j == len(dims) - 1
        n = h * wd
        unit = torch.full((B, C), 1.0 / n, dtype=torch.float32, device=dev)
        ox, oy, t, _ = BW.launch_bwd(
            x, y, w, padding, float(cfg.C1), float(cfg.C2), unit, None if last else unit, *need,
            sums=True, grad_dtype=torch.float32, cs_only=not last,
        )  # fmt: skip
        assert_rel(terms[j], t / n, 1e-6, f"scale {j} term")
        for got, want, wanted in ((gx, ox, need[0]), (gy, oy, need[1])):
            if wanted:
                _same(got[at : at + x.numel()].view_as(x), want, f"scale {j} gradient")
            else:
                assert got is None
        at += x.numel()
    assert calls.count("ssim_bwd_kernel") == len(dims)
    # the narrow programs (128 lanes of 4 warps, which the GPU measures beside the wide ones): three,
    # two and one column strips where the wide ones take two, one and one; the same gradients
    assert L.geometry(dims[0][1] + 2, dims[0][0], 3, B * C, dev, halo=True, wide_halo=False).bw == 128
    consts = (float(cfg.C1), float(cfg.C2))
    nx, ny, n_terms = BW.launch_bwd_scales(*flat, B, C, dims, w, padding, *consts, *need, wide=False)
    _same(nx, gx, "narrow programs' gradient of x")
    _same(ny, gy, "narrow programs' gradient of y")
    for j, (t, t_wide) in enumerate(zip(n_terms, terms)):
        assert_rel(t, t_wide, 1e-6, f"narrow programs' scale {j} term")
    # without a gradient: the forward's stats pass, the cs sums and the last scale's SSIM sum
    from splatloss.backends.triton import forward as FW

    fwd_calls = []
    kernel = FW.ssim_fwd_scales_kernel
    monkeypatch.setattr(kernel, "run", lambda *a, _run=kernel.run, **k: fwd_calls.append(1) or _run(*a, **k))
    sums = FW.launch_fwd_scales(*flat, B, C, dims, w, padding, float(cfg.C1), float(cfg.C2))
    assert len(fwd_calls) == 1 and len(sums) == len(dims)
    for j, ((x, y), t, (h, wd)) in enumerate(zip(xs, sums, dims)):
        s_own, c_own = FW.launch_fwd(x, y, w, padding, float(cfg.C1), float(cfg.C2), "stats")
        assert_rel(t, (s_own if j == len(dims) - 1 else c_own) / (h * wd), 1e-6, f"scale {j} mean")


@pytest.mark.slow
@pytest.mark.parametrize("levels", [4, 1])
def test_the_pyramid_and_its_adjoint_in_one_launch_equal_the_step_by_step_kernels(monkeypatch, levels):
    # In the CUDA tiles (8 x 128 of the first coarser scale, 16 x 256 of the image for four
    # levels), so that a plane spans several programs each way and every program walks its own
    # tiles down the pyramid (and back up) through its barriers: odd sides at every scale, two
    # images of two channels, one image channels-last and in bfloat16. The one launch writes every
    # scale bit for bit as the 2x2 step launched scale by scale, and the adjoint chain gives the
    # gradient of the step-by-step composition, G_j d_j + (2x2 step's adjoint of the coarser one).
    from splatloss.backends.triton import launch as L

    monkeypatch.setattr(L, "FORCE_CUDA_GEOMETRY", True)
    assert M._pyramid_tile(4, 19, 150, torch.device("cpu")) == (8, 64)
    B, C, H, W = 2, 2, 37, 299
    x, y = make_pair((B, C, H, W), seed=50, device=device_for("triton"))
    x = x.to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    dims = M._coarse_dims(H, W, levels + 1)
    total = sum(B * C * h * w for h, w in dims)
    xf = torch.full((total,), float("nan"), device=x.device)
    yf = torch.full((total,), float("nan"), device=x.device)
    M._pyramid_into(x, y, xf, yf, levels)
    xs, ys = M._split(xf, B, C, dims), M._split(yf, B, C, dims)
    for j in range(levels):
        assert torch.equal(xs[j], M._down_impl(x if j == 0 else xs[j - 1])), f"x, scale {j + 1}"
        assert torch.equal(ys[j], M._down_impl(y if j == 0 else ys[j - 1])), f"y, scale {j + 1}"
    # the adjoint chain: kept unit gradients (the finest one channels-last) and a [B, C, M] upstream
    gen = torch.Generator().manual_seed(3)
    g0 = torch.randn((B, C, H, W), generator=gen).to(x.device).contiguous(memory_format=torch.channels_last)
    gc = torch.randn((total,), generator=gen).to(x.device)
    d = torch.randn((B, C, levels + 1), generator=gen).to(x.device)
    got = M._chain_impl(d, g0, gc, torch.float32)
    gs = [g0, *M._split(gc, B, C, dims)]
    want = gs[-1] * d[:, :, levels, None, None]
    for j in reversed(range(levels)):
        want = gs[j] * d[:, :, j, None, None] + M._down_bwd_impl(want, gs[j])
    assert got.stride() == g0.stride()
    _same(got, want, "gradient")


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # the interpreter's fp16 cast of 3.4e38
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_adjoint_chain_rounds_its_sum_once_to_the_input_dtype(dtype):
    # the chain's store rounds the float32 sum to the images' half type as torch's cast does: to
    # nearest, ties to even (the interpreter's own bfloat16 cast truncates), overflow to inf, NaN
    # kept; one scale (the kept gradient times the upstream 1)
    dev = device_for("triton")
    one = 1.0 + 2.0**-8 if dtype == torch.bfloat16 else 1.0 + 2.0**-11  # half an ulp above 1
    special = [one, 1.0 + 3 * (one - 1.0), -one, 2.0**-130, -(2.0**-140), 3.4e38, -3.4e38, 65519.0, -0.0]
    special += [float("inf"), float("-inf"), float("nan"), 1.0 / 3.0, -2.0 / 3.0, 1e-5]
    g = torch.Generator().manual_seed(11)
    g0 = torch.cat([torch.tensor(special), torch.randn(2 * 3 * 5 * 13 - len(special), generator=g)])
    g0 = g0.view(2, 3, 5, 13).to(dev)
    d = torch.ones((2, 3, 1), device=dev)
    got = M._chain_impl(d, g0, g0, dtype)
    want = g0.to(dtype)
    assert got.dtype == dtype
    assert torch.equal(got.isnan(), want.isnan())
    ok = ~want.isnan()
    assert torch.equal(got[ok], want[ok]) and torch.equal(got[ok].signbit(), want[ok].signbit())
