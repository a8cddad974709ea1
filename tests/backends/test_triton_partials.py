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


def test_the_masked_weights_read_broadcast_sums_and_give_empty_channels_and_images_no_weight():
    # z of a (B, 1, H, W) mask: one sum per image, stride 0 over the channels; image 1 empty
    dev = device_for("triton")
    B, C, lam = 3, 3, 0.2
    z = torch.tensor([[37.5], [0.0], [3.0]], device=dev).expand(B, C)
    w = P.masked_weights(z, -lam / C, z, 1 - lam)
    assert w.shape == (2, B, C)
    z64 = z.double().cpu()
    want_s = torch.where(z64 > 0, -lam / C / z64.clamp_min(1e-300), 0.0)
    want_l1 = torch.where(z64 > 0, (1 - lam) / (C * z64).clamp_min(1e-300), 0.0)
    assert_rel(w[0].double().cpu(), want_s, 1e-6, "SSIM weights")
    assert_rel(w[1].double().cpu(), want_l1, 1e-6, "L1 weights")
    assert bool((w[:, 1] == 0).all()), "an empty image has weight"
    # one channel of one image empty, per-channel sums; the SSIM weights alone
    zc = torch.tensor([[2.0, 0.0], [5.0, 4.0]], device=dev)
    (only,) = P.masked_weights(zc, 1.0)
    assert only[0, 1].item() == 0.0 and only[1, 1].item() == 0.25 and only[0, 0].item() == 0.5


def test_the_masked_means_and_loss_from_partial_sums():
    dev = device_for("triton")
    B, C, n, lam = 2, 3, 700, 0.3
    gen = torch.Generator().manual_seed(4)
    parts = (torch.rand((B * C, n, 2), generator=gen) * 0.01).to(dev)  # deficits and masked |x - y|
    parts[1, :, 0] = 0.0  # image 0, channel 1: every value exactly 1
    parts[2, 9, 0] = float("nan")  # image 0, channel 2 is empty: its mean is 1 whatever its sums
    parts[5, :, 0] = 2.5 * 710.0 / n  # image 1, channel 2: a deficit past 2 (rounding): the mean clamps to -1
    z = torch.tensor([[900.0, 650.0, 0.0], [700.0, 720.0, 710.0]], device=dev)  # image 0, channel 2 empty
    planes = z + 10.0
    means = P.masked_means(parts, z, width=2)
    d = parts[:, :, 0].double().sum(dim=1).view(B, C).cpu()
    z64 = z.double().cpu()
    want = torch.where(z64 > 0, (1 - d / z64.clamp_min(1)).clamp(-1, 1), 1.0)
    assert_rel(means.double().cpu(), want, 1e-6, "means")
    assert means[0, 1].item() == 1.0 and means[0, 2].item() == 1.0 and means[1, 2].item() == -1.0
    loss = P.masked_dssim_l1_loss(parts, parts[:, :, 1], z, planes, lam, width=2)
    l1 = parts[:, :, 1].double().sum(dim=1).view(B, C).cpu().sum(dim=1)
    want_loss = (1 - lam) * l1 / planes.double().cpu().sum(dim=1) + lam * (1 - want.mean(dim=1))
    # a difference of numbers near 1 (the means) in float32: held to a few of their ulps, absolute
    assert float((loss.double().cpu() - want_loss).abs().max()) <= 5e-7
    # the SSIM part alone, from separate buffers (the forward kernel's), the same bits twice
    part = P.masked_dssim_l1_loss(parts[:, :, 0].contiguous(), None, z, None, lam)
    assert float((part.double().cpu() - lam * (1 - want.mean(dim=1))).abs().max()) <= 5e-7
    assert torch.equal(part, P.masked_dssim_l1_loss(parts[:, :, 0].contiguous(), None, z, None, lam))
    # a NaN partial sum makes its channel's mean and its image's loss NaN, not a clamped number
    parts[4, 3, 0] = float("nan")
    means = P.masked_means(parts, z, width=2)
    assert torch.isnan(means[1, 1]) and not torch.isnan(means[0]).any()
    loss = P.masked_dssim_l1_loss(parts, parts[:, :, 1], z, planes, lam, width=2)
    assert torch.isnan(loss[1]) and not torch.isnan(loss[0])
    with pytest.raises(ValueError, match="give l1 and zl together"):
        P.masked_dssim_l1_loss(parts, parts[:, :, 1], z, None, lam, width=2)
