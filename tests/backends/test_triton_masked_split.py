"""The masked Triton backward in two lean launches (``masked_split``: the masked moments, then their
adjoint) against the one-launch masked kernel it replaces where it applies.

Both walk the same rows with the same device functions in the same order, so in the interpreter
their gradients are the same bits; on CUDA the compiler may contract the two kernels' arithmetic
differently, so there they agree to a few float32 ulps. The per-program sums follow each launch's
programs (rows and strips), so the channels' sums agree to float32 rounding, not bit for bit. Each
case runs the CUDA geometry (row chunks of 9 rows, column strips, several channels per program on
narrow images), so that the adjoint's three phases and the strips' edges are all crossed; the
masks hold zeros (a block, a row, scattered pixels: windows whose ``F(M)`` is 0) over a flat patch
of the images.
"""

import pytest
import torch

from conftest import device_for, make_pair
from splatloss.backends.triton import launch, masked_kernels, masked_split, split
from splatloss.backends.triton.glue import window_taps
from splatloss.config import SSIMConfig

pytestmark = pytest.mark.triton
DEV = device_for("triton")
EXACT = DEV.type == "cpu"  # the interpreter: bit for bit


@pytest.fixture(autouse=True)
def _two_launches(monkeypatch):
    # on by default; each test here turns it on for itself whatever SPLATLOSS_TRITON_SPLIT says
    monkeypatch.setattr(split, "ENABLED", True)


def _mask(B, C, H, W, seed):
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(B, C, H, W, generator=g)
    m[..., 2:14, 20:33] = 0.0  # a block of zeros wider than the window: F(M) = 0 inside
    m[..., 17, :] = 0.0  # a row of zeros
    m[torch.rand(B, C, H, W, generator=g) < 0.1] = 0.0  # scattered zeros
    m[..., 4:12, 3:15] = 1.0  # ones over the images' flat patch
    return m


def _count_adjoint_launches(monkeypatch) -> list:
    """A list that each launch of the masked adjoint appends its grid to (launched unchanged)."""
    launches = []
    real = masked_split.masked_adjoint_kernel

    class Counting:
        def __getitem__(self, grid):
            launches.append(grid)
            return real[grid]

    monkeypatch.setattr(masked_split, "masked_adjoint_kernel", Counting())
    return launches


def _run(x, y, m, cfg, g_s, g_cs, need1, need2, l1, one_launch, monkeypatch):
    with monkeypatch.context() as mp:
        if one_launch:
            mp.setattr(masked_kernels, "masked_split_eligible", lambda *a: False)
        return masked_kernels.launch_masked_bwd(
            x, y, m, window_taps(cfg, x.device), cfg.padding, float(cfg.C1), float(cfg.C2), g_s, g_cs, need1, need2,
            sums=True, grad_dtype=torch.float32, l1=l1,
        )  # fmt: skip


# (id, shape, padding, window, mask channels (1: broadcast over the channels), what): "loss" the
# SSIM loss's per-channel upstream, "l1" the fused 3DGS loss with its L1 term and sums, "cs" an
# upstream of SSIM and cs, "y" the second image's gradient, "hwc" an (H, W, C) render's layout
_CASES = [
    ("l1-same-7-perchannel", (1, 2, 20, 30), "same", 7, 2, "l1"),
    ("loss-same-11-broadcast", (1, 2, 30, 41), "same", 11, 1, "loss"),
    ("loss-valid-11-perchannel", (1, 2, 31, 36), "valid", 11, 2, "loss"),
    ("cs-valid-5-broadcast", (1, 3, 27, 40), "valid", 5, 1, "cs"),
    ("y-same-3-perchannel", (2, 1, 19, 35), "same", 3, 1, "y"),
    ("hwc-same-9-broadcast", (1, 3, 25, 38), "same", 9, 1, "hwc"),
]


@pytest.mark.parametrize(
    "shape,padding,window,mc,what",
    [pytest.param(*c[1:], id=c[0], marks=() if c[0].startswith("l1-") else (pytest.mark.slow,)) for c in _CASES],
)
def test_two_launches_equal_the_one_launch_masked_kernel(monkeypatch, shape, padding, window, mc, what):
    monkeypatch.setattr(launch, "FORCE_CUDA_GEOMETRY", True)
    monkeypatch.setattr(launch, "CUDA_ROWS", 9)
    B, C, H, W = shape
    x, y = make_pair(shape, seed=window, device=DEV)
    x[..., 4:12, 3:15] = 0.25  # a flat patch: the moved shifts' exact zeros
    y[..., 4:12, 3:15] = 0.25
    if what == "hwc":
        x, y = (t[0].permute(1, 2, 0).contiguous().permute(2, 0, 1)[None] for t in (x, y))
    m = _mask(B, mc, H, W, seed=window).to(DEV).expand(shape)  # stride 0 over channels when mc == 1
    cfg = SSIMConfig(window_size=window, padding=padding)
    g = torch.Generator().manual_seed(1)
    g_s = torch.rand(B, C, generator=g).to(DEV) + 0.5
    g_cs = -0.5 * g_s if what == "cs" else None
    l1 = torch.rand(B, C, generator=g).to(DEV) if what == "l1" else None
    need1, need2 = what != "y", what == "y"
    assert masked_split.masked_split_eligible(x, y, window, False, need1, need2)
    launches = _count_adjoint_launches(monkeypatch)
    two = _run(x, y, m, cfg, g_s, g_cs, need1, need2, l1, False, monkeypatch)
    assert len(launches) == 1  # the two launches ran
    one = _run(x, y, m, cfg, g_s, g_cs, need1, need2, l1, True, monkeypatch)
    assert len(launches) == 1  # the one-launch kernel ran
    for a, b in zip(two[:2], one[:2]):
        if b is None:
            assert a is None
            continue
        assert torch.isfinite(b).all() and b.abs().max() > 0
        if EXACT:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6 * float(b.abs().max()))
    # the channels' sums (SSIM deficit, masked |x - y|): the same to float32 rounding of their order
    s2, s1 = two[2].sum(dim=1), one[2].sum(dim=1)
    cols = 2 if l1 is not None else 1
    torch.testing.assert_close(s2[:, :cols], s1[:, :cols], rtol=1e-6, atol=1e-6 * float(s1[:, :cols].abs().max()))


def test_the_masked_two_launches_take_the_unmasked_pairs_cases(monkeypatch):
    # where the unmasked backward runs its two launches, with the same switch
    x, y = make_pair((1, 3, 16, 20))
    assert masked_split.masked_split_eligible(x, y, 11, False, True, False)
    assert not masked_split.masked_split_eligible(x, y, 11, True, True, False)  # "reflect"
    assert not masked_split.masked_split_eligible(x, y, 11, False, True, True)  # both gradients
    assert not masked_split.masked_split_eligible(x, y, 13, False, True, False)  # the ring body
    monkeypatch.setattr(split, "ENABLED", False)
    assert not masked_split.masked_split_eligible(x, y, 11, False, True, False)


def test_a_masked_batch_runs_in_the_unmasked_groups(monkeypatch):
    # the bound counts map pixels: five 1080p RGB images' masked moments (622 MB at 20 B a pixel)
    # run in one pair of launches, as the unmasked ones (498 MB) do; 4K images one at a time
    monkeypatch.setattr(launch, "FORCE_CUDA_GEOMETRY", True)
    window = window_taps(SSIMConfig(padding="same"), torch.device("cpu"))
    for shape, group in (((5, 3, 1080, 1920), 5), ((2, 3, 2160, 3840), 1)):
        assert split.split_group(torch.empty(shape), window, "same") == group, shape


@pytest.mark.slow
def test_a_masked_batch_over_the_memory_bound_runs_in_even_groups(monkeypatch):
    # three images whose moments fit two at a time: two groups (2 + 1), the gradients the same bits
    # as all three in one pair of launches, the rows planned for a group
    monkeypatch.setattr(launch, "FORCE_CUDA_GEOMETRY", True)
    monkeypatch.setattr(launch, "CUDA_ROWS", 9)
    shape = (3, 2, 20, 30)
    x, y = make_pair(shape, seed=6, device=DEV)
    m = _mask(3, 2, 20, 30, seed=6).to(DEV)
    cfg = SSIMConfig(window_size=7, padding="same")
    g_s = torch.rand(3, 2, generator=torch.Generator().manual_seed(2)).to(DEV) + 0.5
    launches = _count_adjoint_launches(monkeypatch)
    whole = _run(x, y, m, cfg, g_s, None, True, False, None, False, monkeypatch)
    assert len(launches) == 1
    # the bound counts map pixels at the unmasked moments' 16 B: two channels, 20 map rows of 32 (a strip)
    per_image = 16 * 2 * 20 * 32
    monkeypatch.setattr(split, "MAX_MOMENTS_BYTES", 2 * per_image)
    assert split.split_group(x, window_taps(cfg, DEV), "same") == 2
    grouped = _run(x, y, m, cfg, g_s, None, True, False, None, False, monkeypatch)
    assert len(launches) == 3
    if EXACT:
        assert torch.equal(grouped[0], whole[0])
    else:
        torch.testing.assert_close(grouped[0], whole[0], rtol=1e-6, atol=1e-6 * float(whole[0].abs().max()))
