"""The partial sums' means in one launch (``partials.means``): the kernels' per-program sums per
(image, channel), several buffers' worth at once, written where the caller wants them."""

import pytest
import torch

from conftest import assert_rel, device_for
from splatloss.backends.triton import partials as P

pytestmark = pytest.mark.triton


def test_each_segments_mean_lands_in_its_column_and_the_last_may_come_from_a_second_buffer():
    # six segments (two launches of at most four), two values per partial sum (the second one not
    # summed), one segment longer than a block, written into columns 1.. of a [B, C, M] tensor
    dev = device_for("triton")
    BC, slots, sizes, width = 6, [5, 1100, 3, 1, 7, 2], [100, 20, 7, 3, 9, 11], 2
    gen = torch.Generator().manual_seed(0)
    buf = torch.randn((BC * width * sum(slots),), generator=gen).to(dev)
    other = torch.randn(buf.shape, generator=gen).to(dev)
    terms = torch.full((2, 3, 7), float("nan"), device=dev)
    P.means(buf, BC, slots, sizes, terms.view(BC, 7)[:, 1:], width=width, last=other)
    assert torch.isnan(terms[:, :, 0]).all(), "column 0 is not the means'"
    at = 0
    for k, (s, n) in enumerate(zip(slots, sizes)):
        src = other if k == len(slots) - 1 else buf
        want = src[at : at + BC * s * width].view(BC, s, width)[:, :, 0].double().sum(dim=1) / n
        assert_rel(terms.view(BC, 7)[:, 1 + k].double(), want, 1e-6, f"segment {k}")
        at += BC * s * width
    again = torch.empty_like(terms)
    P.means(buf, BC, slots, sizes, again.view(BC, 7)[:, 1:], width=width, last=other)
    assert torch.equal(again[:, :, 1:], terms[:, :, 1:]), "not the same bits twice"


def test_a_mismatched_output_is_refused():
    buf = torch.zeros(12, device=device_for("triton"))
    with pytest.raises(ValueError, match=r"means: 2 segments, 2 sizes, out of shape \(3, 1\) for 3 rows"):
        P.means(buf, 3, [2, 2], [4, 4], torch.empty((3, 1), device=buf.device))


def test_the_3dgs_loss_from_interleaved_partial_sums():
    # two images of three channels, 1100 partial sums per channel (more than a block), the SSIM and |x - y| sums
    # interleaved as the backward kernel writes them: (1 - lam) L1 + lam (1 - SSIM) per image
    dev = device_for("triton")
    B, C, n, lam, n_map, n_img = 2, 3, 1100, 0.2, 3 * 90, 3 * 100
    parts = torch.rand((B * C, n, 2), generator=torch.Generator().manual_seed(2)).to(dev)
    got = P.dssim_l1_loss(parts, parts[:, :, 1], B, C, lam, n_map, n_img, width=2)
    s = parts[:, :, 0].double().view(B, C * n).sum(dim=1)
    l1 = parts[:, :, 1].double().view(B, C * n).sum(dim=1)
    assert_rel(got.double(), (1 - lam) * l1 / n_img + lam * (1 - s / n_map), 1e-6, "loss")
    # the same sums as two buffers (the forward kernel's)
    again = P.dssim_l1_loss(parts[:, :, 0].contiguous(), parts[:, :, 1].contiguous(), B, C, lam, n_map, n_img)
    assert torch.equal(again, got)
