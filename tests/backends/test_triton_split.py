"""The Triton backward in two lean launches (``split``: the moments, then their adjoint) against the
one-launch backward kernel it replaces where that one needed 128 registers.

Both walk the same rows with the same device functions in the same order, so in the interpreter
their gradients and per-program sums are the same bits; on CUDA the compiler may contract the two
kernels' arithmetic differently, so there they agree to a few float32 ulps. Each case runs the
CUDA geometry (row chunks of 8 or 9 rows, column strips of 128 map columns or 256 gradient columns,
several channels per program on narrow images), so that the adjoint's three phases (the first rows'
shifts, the rows above the chunk, the chunk's gradient rows) and the strips' edges are all crossed.
"""

import pytest
import torch

from conftest import device_for, make_pair
from splatloss.backends.triton import backward, launch, split
from splatloss.backends.triton.glue import window_taps
from splatloss.config import SSIMConfig

pytestmark = pytest.mark.triton
DEV = device_for("triton")
EXACT = DEV.type == "cpu"  # the interpreter: bit for bit


@pytest.fixture(autouse=True)
def _two_launches(monkeypatch):
    # a variant, off by default (the one-launch kernels): each test here turns it on for itself
    monkeypatch.setattr(split, "ENABLED", True)


def _run(x, y, cfg, g_s, g_cs, need1, need2, l1, sums, cs_only, one_launch, monkeypatch):
    with monkeypatch.context() as m:
        if one_launch:
            m.setattr(backward, "split_eligible", lambda *a: False)
        return backward.launch_bwd(
            x, y, window_taps(cfg, x.device), cfg.padding, float(cfg.C1), float(cfg.C2), g_s, g_cs, need1, need2,
            l1=l1, sums=sums, cs_only=cs_only,
        )  # fmt: skip


# (id, shape, padding, window, what): "loss" a per-channel upstream (the SSIM loss), "l1" the fused
# 3DGS loss with its sums, "map" a map-sized upstream of SSIM and cs (ssim_map), "cs" the cs sum
# alone (MS-SSIM's finer scales), "y" the second image's gradient, "hwc" an (H, W, C) render's layout
_CASES = [
    ("loss-same-11", (1, 2, 30, 41), "same", 11, "loss"),
    ("l1-same-7", (2, 2, 21, 30), "same", 7, "l1"),
    ("map-valid-11", (1, 2, 31, 36), "valid", 11, "map"),
    ("cs-valid-5", (1, 3, 27, 22), "valid", 5, "cs"),
    ("y-same-3", (2, 1, 19, 29), "same", 3, "y"),
    ("hwc-same-9", (1, 3, 25, 33), "same", 9, "hwc"),
]


@pytest.mark.parametrize(
    "shape,padding,window,what",
    [pytest.param(*c[1:], id=c[0], marks=() if c[0] == "l1-same-7" else (pytest.mark.slow,)) for c in _CASES],
)
def test_two_launches_equal_the_one_launch_kernel(monkeypatch, shape, padding, window, what):
    monkeypatch.setattr(launch, "FORCE_CUDA_GEOMETRY", True)
    monkeypatch.setattr(launch, "CUDA_ROWS", 9)
    x, y = make_pair(shape, seed=window, device=DEV)
    x[..., 4:12, 3:15] = 0.25  # a flat patch: the moved shifts' exact zeros
    y[..., 4:12, 3:15] = 0.25
    if what == "hwc":
        x, y = (t[0].permute(1, 2, 0).contiguous().permute(2, 0, 1)[None] for t in (x, y))
    cfg = SSIMConfig(window_size=window, padding=padding)
    B, C, H, W = shape
    g = torch.Generator().manual_seed(1)
    Ho = H if padding == "same" else H - window + 1
    Wo = W if padding == "same" else W - window + 1
    if what == "map":
        g_s, g_cs = (torch.randn(B, C, Ho, Wo, generator=g).to(DEV) for _ in range(2))
    else:
        g_s = torch.randn(B, C, generator=g).to(DEV)
        g_cs = g_s * 0.5 if what == "cs" else None
    l1 = torch.randn(B, C, generator=g).to(DEV) if what == "l1" else None
    need1, need2 = what != "y", what == "y"
    sums = what in ("l1", "cs", "loss")
    args = (x, y, cfg, g_s, g_cs, need1, need2, l1, sums, what == "cs")
    assert split.split_eligible(x, y, window, False, need1, need2)
    two = _run(*args, False, monkeypatch)
    one = _run(*args, True, monkeypatch)
    assert len(two) == len(one)
    for a, b in zip(two, one):
        if b is None:
            assert a is None
            continue
        assert torch.isfinite(b).all()
        if EXACT:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6 * float(b.abs().max()))


@pytest.mark.slow
def test_a_batch_over_the_memory_bound_runs_in_groups_of_images(monkeypatch):
    # three images, the moments of one at a time: the same bits as all three in one pair of launches
    monkeypatch.setattr(launch, "FORCE_CUDA_GEOMETRY", True)
    monkeypatch.setattr(launch, "CUDA_ROWS", 9)
    x, y = make_pair((3, 2, 21, 27), seed=3, device=DEV)
    cfg = SSIMConfig(window_size=7, padding="same")
    g_s = torch.randn(3, 2, generator=torch.Generator().manual_seed(2)).to(DEV)
    l1 = -0.5 * g_s
    calls = []
    real = split.ssim_adjoint_kernel
    out = {}
    room = split.MAX_MOMENTS_BYTES
    for cap in (room, 1):  # room for all; for none (one image per group)
        monkeypatch.setattr(split, "MAX_MOMENTS_BYTES", cap)
        calls.clear()

        class Counting:  # counts the adjoint's launches, launches it unchanged
            def __getitem__(self, grid):
                calls.append(grid)
                return real[grid]

        monkeypatch.setattr(split, "ssim_adjoint_kernel", Counting())
        out[cap] = _run(x, y, cfg, g_s, None, True, False, l1, True, False, False, monkeypatch)
        out[cap, "launches"] = len(calls)
    monkeypatch.setattr(split, "ssim_adjoint_kernel", real)
    assert out[room, "launches"] == 1 and out[1, "launches"] == 3
    for a, b in zip(out[1], out[room]):
        if b is None:
            assert a is None
            continue
        if EXACT:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_two_launches_take_the_one_launch_kernels_128_register_cases():
    # the column body without "reflect", one gradient, columns contiguous or a constant stride apart
    x, y = make_pair((1, 3, 16, 20))
    assert split.split_eligible(x, y, 11, False, True, False)
    assert split.split_eligible(x, y, 11, False, False, True)
    cl = x.contiguous(memory_format=torch.channels_last)
    assert split.split_eligible(cl, cl, 11, False, True, False)  # a stride of 3, shared
    assert not split.split_eligible(x, y, 11, True, True, False)  # "reflect"
    assert not split.split_eligible(x, y, 11, False, True, True)  # both gradients
    assert not split.split_eligible(x, y, 13, False, True, False)  # the ring body
    assert not split.split_eligible(cl, y, 11, False, True, False)  # columns 3 and 1 apart
    assert launch.bwd_maxnreg(11, False) == launch.COLUMN_MAXNREG  # what the two launches replace


@pytest.mark.slow
def test_the_one_launch_kernels_are_the_default_whatever_the_environment():
    import os
    import subprocess
    import sys

    # a fresh interpreter (the test run's has imported the module and this file's fixture turns the
    # variant on): off, and no environment variable turns it on
    code = "from splatloss.backends.triton import split; print(split.ENABLED)"
    env = {**os.environ, "SPLATLOSS_TRITON_SPLIT": "1", "SPLATLOSS_TRITON_TUNE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "False", (out.stdout, out.stderr)


@pytest.mark.slow
def test_the_coarser_scales_two_launches_equal_their_one_launch(monkeypatch):
    # MS-SSIM's coarser scales in one pair of launches (each program finding its scale) against the
    # one-launch kernel over the same scales (launch_bwd_scales with the width given); "same" padding,
    # the second image's gradient, three scales of 2 x 3 channels in the CUDA geometry
    from splatloss.backends.triton.ms_ssim import _coarse_dims

    monkeypatch.setattr(launch, "FORCE_CUDA_GEOMETRY", True)
    monkeypatch.setattr(launch, "CUDA_ROWS", 9)
    B, C = 2, 3
    dims = _coarse_dims(70, 64, 4)
    n = sum(B * C * h * w for h, w in dims)
    g = torch.Generator().manual_seed(4)
    fx = torch.rand(n, generator=g)
    fy = (0.6 * fx + 0.4 * torch.rand(n, generator=g)).to(DEV)
    fx = fx.to(DEV)
    cfg = SSIMConfig(window_size=7, padding="same")
    args = (fx, fy, B, C, dims, window_taps(cfg, DEV), "same", float(cfg.C1), float(cfg.C2), False, True)
    two = backward.launch_bwd_scales(*args)
    one = backward.launch_bwd_scales(*args, wide=True)
    assert two[0] is None and one[0] is None
    pairs = [(two[1], one[1])] + list(zip(two[2], one[2]))
    for a, b in pairs:
        assert torch.isfinite(b).all()
        if EXACT:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6 * float(b.abs().max()))


@pytest.mark.slow
@pytest.mark.parametrize(
    "size, padding, window, need2",
    [
        ((40, 52), "same", 7, False),  # several channels a program, the first image's gradient
        ((36, 300), "valid", 5, True),  # the finest scale in three column strips, the second image's
    ],
)
def test_every_scale_in_one_pair_equals_the_finest_scale_on_its_own(monkeypatch, size, padding, window, need2):
    # MS-SSIM's finest scale in the coarser scales' two launches (the images read in place beside the
    # flat pyramid) against it in its own two launches: the same terms and unit gradients
    from splatloss.backends.triton import ms_ssim

    monkeypatch.setattr(launch, "FORCE_CUDA_GEOMETRY", True)
    monkeypatch.setattr(launch, "CUDA_ROWS", 9)
    g = torch.Generator().manual_seed(5)
    x = torch.rand((2, 3) + size, generator=g)
    y = (0.6 * x + 0.4 * torch.rand((2, 3) + size, generator=g)).to(DEV)
    x = x.to(DEV)
    cfg = SSIMConfig(window_size=window, padding=padding)
    args = (x, y, window_taps(cfg, DEV), padding, float(cfg.C1), float(cfg.C2), 4, not need2, need2)
    dims = [size] + ms_ssim._coarse_dims(*size, 4)
    assert split.all_scales_eligible(x, y, dims, window, padding, not need2, need2)
    every = ms_ssim._terms_impl(*args)
    monkeypatch.setattr(ms_ssim, "all_scales_eligible", lambda *a: False)
    alone = ms_ssim._terms_impl(*args)
    for a, b in zip(every, alone):
        assert a.shape == b.shape
        if EXACT:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6 * float(b.abs().max()))


#: MS-SSIM's window and weights in the half-precision tests (a 40 x 52 pair: four scales)
_HALF_CFG = SSIMConfig(window_size=7, padding="same")
_HALF_WEIGHTS = (0.1, 0.2, 0.3, 0.4)


def _half_pair(dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand((1, 3, 40, 52), generator=g)
    y = 0.6 * x + 0.4 * torch.rand((1, 3, 40, 52), generator=g)
    return x.to(dtype).to(DEV), y.to(dtype).to(DEV)


def _spy_pyramid(monkeypatch, seen: list) -> None:
    """Record each pyramid launch's input dtype."""
    from splatloss.backends.triton import ms_ssim

    real = ms_ssim._pyramid_into

    def spy(x, *a):
        seen.append(("pyramid", x.dtype))
        return real(x, *a)

    monkeypatch.setattr(ms_ssim, "_pyramid_into", spy)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_scale_in_one_pair_reads_half_images_as_they_are(monkeypatch, dtype):
    # fp16 / bf16 images in the two launches (read in their own dtype by the pyramid's launch, which
    # writes no copy, and by the finest scale's programs; the gradient rounded once by the chain's
    # store) against their float32 copy made by autograd's cast, through the same launches: the
    # same value and gradient
    from splatloss.backends.triton import ms_ssim

    monkeypatch.setattr(launch, "FORCE_CUDA_GEOMETRY", True)
    monkeypatch.setattr(launch, "CUDA_ROWS", 9)
    seen = []
    real = split.launch_bwd_scales_split

    def spy(*a, first=None, **k):
        seen.append(None if first is None else first[0].dtype)
        return real(*a, first=first, **k)

    monkeypatch.setattr(backward, "launch_bwd_scales_split", spy)
    _spy_pyramid(monkeypatch, seen)
    x, y = _half_pair(dtype, 9)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    va = ms_ssim.ms_ssim(xa, y, _HALF_CFG, _HALF_WEIGHTS, tau=0.01)
    (ga,) = torch.autograd.grad(va.sum(), xa)
    vb = ms_ssim.ms_ssim(xb.float(), y.float(), _HALF_CFG, _HALF_WEIGHTS, tau=0.01)
    (gb,) = torch.autograd.grad(vb.sum(), xb)
    # both through the two launches, the half pair read as it is
    assert seen == [("pyramid", dtype), dtype, ("pyramid", torch.float32), torch.float32]
    assert ga.dtype == dtype and torch.isfinite(ga).all() and ga.abs().max() > 0
    if EXACT:
        assert torch.equal(va, vb) and torch.equal(ga, gb)
    else:
        torch.testing.assert_close(va, vb, rtol=1e-6, atol=0)
        torch.testing.assert_close(ga, gb)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_images_on_the_finest_scales_own_launches_are_read_as_they_are(monkeypatch, dtype):
    # where the scales do not run in one pair of launches (both images need a gradient; no
    # gradient at all), contiguous fp16 / bf16 images are read as they are too, by the pyramid's
    # launch and by the finest scale's own launches (no float32 copy): the same values and
    # gradients as the float32 copies made by autograd's cast
    from splatloss.backends.triton import ms_ssim

    seen = []
    _spy_pyramid(monkeypatch, seen)
    real_term = ms_ssim.term_into

    def spy_term(out, img1, *a, **k):
        seen.append(("finest", img1.dtype))
        return real_term(out, img1, *a, **k)

    monkeypatch.setattr(ms_ssim, "term_into", spy_term)
    x, y = _half_pair(dtype, 17)
    xa, ya = x.clone().requires_grad_(), y.clone().requires_grad_()
    va = ms_ssim.ms_ssim(xa, ya, _HALF_CFG, _HALF_WEIGHTS, tau=0.01)
    ga = torch.autograd.grad(va.sum(), (xa, ya))
    assert seen == [("finest", dtype), ("pyramid", dtype)]
    xb, yb = x.clone().requires_grad_(), y.clone().requires_grad_()
    vb = ms_ssim.ms_ssim(xb.float(), yb.float(), _HALF_CFG, _HALF_WEIGHTS, tau=0.01)
    gb = torch.autograd.grad(vb.sum(), (xb, yb))
    seen.clear()
    with torch.no_grad():
        vc = ms_ssim.ms_ssim(x, y, _HALF_CFG, _HALF_WEIGHTS)
        vd = ms_ssim.ms_ssim(x.float(), y.float(), _HALF_CFG, _HALF_WEIGHTS)
    assert seen == [("finest", dtype), ("pyramid", dtype), ("finest", torch.float32), ("pyramid", torch.float32)]
    assert all(t.dtype == dtype and torch.isfinite(t).all() and t.abs().max() > 0 for t in ga)
    if EXACT:
        assert torch.equal(va, vb) and torch.equal(vc, vd)
        assert torch.equal(ga[0], gb[0]) and torch.equal(ga[1], gb[1])
    else:
        torch.testing.assert_close(va, vb, rtol=1e-6, atol=0)
        torch.testing.assert_close(vc, vd, rtol=1e-6, atol=0)
        torch.testing.assert_close(ga, gb)


def test_every_scale_in_one_pair_only_where_it_applies(monkeypatch):
    monkeypatch.setattr(launch, "FORCE_CUDA_GEOMETRY", True)
    x = torch.rand(1, 3, 64, 96)
    dims = [(64, 96), (32, 48), (16, 24)]
    assert split.all_scales_eligible(x, x, dims, 11, "valid", True, False)
    assert not split.all_scales_eligible(x, x, dims, 11, "valid", False, False)  # no gradient: the forward
    assert not split.all_scales_eligible(x, x, dims, 11, "valid", True, True)  # both gradients
    assert not split.all_scales_eligible(x, x, dims, 11, "reflect", True, False)
    assert not split.all_scales_eligible(x, x, dims, 17, "valid", True, False)  # the ring body
    assert not split.all_scales_eligible(x, x, dims[:1], 11, "valid", True, False)  # one scale
    strided = x.transpose(2, 3).contiguous().transpose(2, 3)
    assert not split.all_scales_eligible(strided, x, dims, 11, "valid", True, False)
    assert not split.all_scales_eligible(x.double(), x.double(), dims, 11, "valid", True, False)
    assert split.all_scales_eligible(x.bfloat16(), x.bfloat16(), dims, 11, "valid", True, False)  # read as they are
    assert not split.all_scales_eligible(x.bfloat16(), x.half(), dims, 11, "valid", True, False)
    monkeypatch.setattr(split, "MAX_MOMENTS_BYTES", 1000)
    assert not split.all_scales_eligible(x, x, dims, 11, "valid", True, False)  # over the moments' bound
    monkeypatch.setattr(split, "ENABLED", False)
    monkeypatch.setattr(split, "MAX_MOMENTS_BYTES", 2**30)
    assert not split.all_scales_eligible(x, x, dims, 11, "valid", True, False)


def test_every_scale_in_one_pair_up_to_the_moments_bound(monkeypatch):
    # every scale's moments, 16 B per map pixel-channel: 126.8 MiB per 1080p RGB image at five
    # scales, so four images (507 MiB) fit MAX_MOMENTS_BYTES and five (634 MiB) do not
    from splatloss.backends.triton.ms_ssim import _coarse_dims

    monkeypatch.setattr(launch, "FORCE_CUDA_GEOMETRY", True)
    dims = [(1080, 1920)] + _coarse_dims(1080, 1920, 5)
    for b, fits in ((1, True), (4, True), (5, False)):
        x = torch.empty(b, 3, 1080, 1920)
        assert split.all_scales_eligible(x, x, dims, 11, "valid", True, False) == fits, b


def test_a_batch_over_the_memory_bound_splits_into_even_groups(monkeypatch):
    monkeypatch.setattr(split, "MAX_MOMENTS_BYTES", 400)
    assert split.image_group(5, 100) == 3  # four fit: 3 + 2, not 4 + 1
    assert split.image_group(4, 100) == 4
    assert split.image_group(9, 100) == 3  # 3 + 3 + 3
    assert split.image_group(7, 100) == 4  # 4 + 3
    assert split.image_group(3, 1000) == 1  # not even one fits: one image a group
    assert split.image_group(1, 100) == 1
