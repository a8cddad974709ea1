"""Masked SSIM on Triton: the mask read inside the kernels, the masked statistics and their analytic
adjoint, and the ops ``ssim_stats`` / ``ssim_term`` under a mask.

The semantics are docs/conventions.md's ("Masks"), the CPU kernel's and the shared fallback's
(:mod:`splatloss.backends.masked`): the window statistics are normalised by the filtered mask,
``mu_x = F(M X) / F(M)`` and likewise for the second moments (``F`` the window, the mask padded with
ones for "same" and mirrored for "reflect"), and the maps are averaged with the mask at each map
position's centre as weight; a channel whose centre weights sum to 0 counts as 1. Where
``F(M) = 0`` the centre weight is 0 too, so those positions take ``F(M) = 1`` and never reach the
value or the gradient.

The 3DGS loss under a mask, ``(1 - lam) * sum M |x - y| / sum M + lam * (1 - SSIM)`` (the base
backend's composition, :func:`splatloss.backends.base.masked_l1`), is fused as the unmasked one
is (:mod:`.dssim_l1`): with a gradient to compute, one pass of the masked backward kernel sums the
centre-weighted SSIM and the masked ``|x - y|`` and adds ``w M sign(x - y)`` to the gradients in
registers, ``w = (1 - lam) / sum M`` per image ("same" and "valid" padding: :func:`fits_fused_loss`).
Without a gradient the forward kernel runs instead; under "same", where every pixel is one map
position's centre, it sums the masked ``|x - y|`` at the centres on the way (under "valid" the L1
term is torch ops).

The kernels and their launchers are :mod:`.masked_kernels`'s.
"""

from __future__ import annotations

from typing import Tuple

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ..base import masked_l1
from . import partials
from .glue import (
    backward_from_unit_grads,
    batch_mean_factor,
    batch_mean_upstream,
    check_inputs,
    dssim_mean_upstream,
    fake_grads,
    fake_unit_grads,
    functorch_guard,
    refuse_double_backward,
    save_unit_grads,
    wants_grad,
    window_taps,
    with_autograd,
    zeros_if_none,
)
from .launch import COLUMN_TAPS
from .masked_kernels import launch_masked_bwd, launch_masked_fwd

__all__ = [
    "centre_weights",
    "fits",
    "fits_fused_loss",
    "masked_dssim_l1",
    "masked_dssim_l1_terms",
    "masked_ssim_stats",
    "masked_ssim_term",
]

Tensor = torch.Tensor


#: Widest window the masked kernels take under "reflect": at 11 taps their backward (mirrored taps
#: beside the fifth pending sum) spills 8 to 16 B of registers at sm_90 even at 255, with one
#: gradient per launch (tools/check_kernels.py); wider "reflect" windows take the shared fallback.
REFLECT_TAPS = 9


def fits(cfg) -> bool:
    """Whether the masked kernels take this window (the column bodies' sizes; "reflect": up to
    :data:`REFLECT_TAPS`)."""
    if cfg.padding == "reflect":
        return cfg.window_size <= REFLECT_TAPS
    return cfg.window_size <= COLUMN_TAPS.value


def fits_fused_loss(cfg) -> bool:
    """Whether the masked 3DGS loss runs fused (:func:`masked_dssim_l1`): windows the masked kernels
    take, padding "same" or "valid" (under "reflect" the mirrored taps and the L1 term together
    spill registers at sm_90 even at 255, tools/check_kernels.py; the loss is then the base
    backend's composition of the masked SSIM term and the masked L1)."""
    return fits(cfg) and cfg.padding != "reflect"


def _float_mask(mask: Tensor, img: Tensor) -> Tensor:
    """The mask as float32, broadcast to the images' shape (stride 0 along broadcast dimensions:
    a mask shared by the channels is read once per pixel, from cache)."""
    return mask.to(device=img.device, dtype=torch.float32).expand(img.shape)


#: The masks' sums computed so far, by mask (weakly: an entry lives as long as the mask), for each
#: (images' B and C, window size, padding): the mask's version and the sums. A training loop passes
#: the same mask tensor step after step (the validated, scaled mask of :func:`splatloss.checks.check_mask`
#: is itself kept per version of the user's mask), so its sums are taken once, not once a call.
_SUMS = WeakIdKeyDictionary()


def _cached_sums(mask: Tensor, key: tuple, compute):
    """``compute()`` once per ``mask`` version and ``key`` (every call where ``mask`` is not a plain
    tensor with a version counter: a traced fake tensor, an inference tensor, one that needs a
    gradient)."""
    if type(mask) is not torch.Tensor or mask.is_inference() or mask.requires_grad:
        return compute()
    seen = _SUMS.get(mask)
    version = mask._version
    hit = None if seen is None else seen.get(key)
    if hit is not None and hit[0] == version:
        return hit[1]
    out = compute()
    if seen is None:
        seen = _SUMS.setdefault(mask, {})
    seen[key] = (version, out)
    return out


def centre_weights(mask: Tensor, img: Tensor, window: Tensor, padding: str) -> Tensor:
    """``[B, C]`` sums of the mask at the map positions' centres (the means' denominators), summed
    over the mask as given (a mask shared by the channels: once per image) and broadcast; taken
    once per mask version (:func:`_cached_sums`)."""
    key = ("centre", tuple(img.shape[:2]), window.shape[0], padding)
    return _cached_sums(mask, key, lambda: _centre_weights(mask, img, window, padding))


def _centre_weights(mask: Tensor, img: Tensor, window: Tensor, padding: str) -> Tensor:
    K = window.shape[0]
    mask = mask.to(torch.float32)
    if padding == "valid":
        r = K // 2
        H, W = mask.shape[-2:]
        mask = mask[..., r : H - (K - 1 - r), r : W - (K - 1 - r)]
    return mask.sum(dim=(-2, -1)).expand(img.shape[:2])


def plane_sums(mask: Tensor, img: Tensor, window: Tensor, padding: str) -> Tuple[Tensor, Tensor]:
    """``(z, planes)``: :func:`centre_weights` and the mask's whole planes' sums (the masked L1
    term's), each ``[B, C]`` (broadcast views: a mask shared by the channels is summed once per
    image); one sum, two under "valid" (whose map centres do not cover the image)."""
    z = centre_weights(mask, img, window, padding)
    if padding != "valid":
        return z, z
    key = ("planes", tuple(img.shape[:2]))
    return z, _cached_sums(mask, key, lambda: mask.to(torch.float32).sum(dim=(-2, -1)).expand(img.shape[:2]))


# ------------------------------------------------------------------------------------------------
# Registered ops
# ------------------------------------------------------------------------------------------------


@torch.library.custom_op("splatloss::triton_masked_ssim_stats", mutates_args=())
def _stats_op(
    img1: Tensor, img2: Tensor, mask: Tensor, window: Tensor, padding: str, c1: float, c2: float
) -> Tuple[Tensor, Tensor]:
    m = _float_mask(mask, img1)
    s, cs = launch_masked_fwd(img1, img2, m, window, padding, c1, c2)
    z = centre_weights(mask, img1, window, padding)
    return partials.masked_means(s, z), partials.masked_means(cs, z)


@_stats_op.register_fake
def _(img1, img2, mask, window, padding, c1, c2):
    shape = img1.shape[:2]
    return img1.new_empty(shape, dtype=torch.float32), img1.new_empty(shape, dtype=torch.float32)


@torch.library.custom_op("splatloss::triton_masked_ssim_stats_bwd", mutates_args=())
def _stats_bwd_op(
    g_s: Tensor,
    g_cs: Tensor,
    img1: Tensor,
    img2: Tensor,
    mask: Tensor,
    window: Tensor,
    padding: str,
    c1: float,
    c2: float,
    need1: bool,
    need2: bool,
) -> Tuple[Tensor, Tensor]:
    m = _float_mask(mask, img1)
    inv = partials.masked_weights(centre_weights(mask, img1, window, padding), 1.0)[0]
    gx, gy = launch_masked_bwd(img1, img2, m, window, padding, c1, c2, g_s * inv, g_cs * inv, need1, need2)
    return (gx if need1 else img1.new_empty(0)), (gy if need2 else img2.new_empty(0))


@_stats_bwd_op.register_fake
def _(g_s, g_cs, img1, img2, mask, window, padding, c1, c2, need1, need2):
    return fake_grads(img1, img2, need1, need2)


def _stats_save(ctx, inputs, output):
    img1, img2, mask, window, padding, c1, c2 = inputs
    ctx.save_for_backward(img1, img2, mask, window)  # references: the backward recomputes the moments
    ctx.cfg = (padding, c1, c2)


def _stats_backward(ctx, g_s, g_cs):
    refuse_double_backward("masked ssim_stats")
    img1, img2, mask, window = ctx.saved_tensors
    need1, need2 = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
    if not (need1 or need2):
        return (None,) * 7
    shape = img1.shape[:2]
    g_s = zeros_if_none(g_s, shape, img1.device)
    g_cs = zeros_if_none(g_cs, shape, img1.device)
    gx, gy = _stats_bwd_op(g_s, g_cs, img1, img2, mask, window, *ctx.cfg, need1, need2)
    return (gx if need1 else None), (gy if need2 else None), None, None, None, None, None


_stats_op.register_autograd(_stats_backward, setup_context=_stats_save)


@torch.library.custom_op("splatloss::triton_masked_ssim_term", mutates_args=())
def _term_op(
    img1: Tensor,
    img2: Tensor,
    mask: Tensor,
    window: Tensor,
    padding: str,
    c1: float,
    c2: float,
    need1: bool,
    need2: bool,
    expect: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    """The ``[B, C]`` masked SSIM mean and, for each image that needs one, its gradient for an
    upstream of ``expect`` per (image, channel) (float32), from one pass of the masked backward
    kernel (as ``ssim.ssim_term``)."""
    m = _float_mask(mask, img1)
    z = centre_weights(mask, img1, window, padding)
    empty = img1.new_empty(0, dtype=torch.float32)
    if not (need1 or need2):
        s, _ = launch_masked_fwd(img1, img2, m, window, padding, c1, c2)
        return partials.masked_means(s, z), empty, empty.clone()
    inv_z = partials.masked_weights(z, expect)[0]
    gx, gy, parts = launch_masked_bwd(
        img1, img2, m, window, padding, c1, c2, inv_z, None, need1, need2, True, torch.float32
    )
    return partials.masked_means(parts, z, width=2), (gx if need1 else empty), (gy if need2 else empty.clone())


@_term_op.register_fake
def _(img1, img2, mask, window, padding, c1, c2, need1, need2, expect):
    gx, gy = fake_unit_grads(img1, img2, need1, need2)
    return img1.new_empty(img1.shape[:2], dtype=torch.float32), gx, gy


def _term_save(ctx, inputs, output):
    img1, img2, mask, window, padding, c1, c2, need1, need2, expect = inputs
    save_unit_grads(ctx, img1, img2, window, *output[1:], mask)
    ctx.cfg = (padding, c1, c2)
    ctx.expect = expect


def _term_backward(ctx, g_t, _gx, _gy):
    def recompute(img1, img2, window, need1, need2, mask):
        return _stats_bwd_op(g_t, torch.zeros_like(g_t), img1, img2, mask, window, *ctx.cfg, need1, need2)

    return backward_from_unit_grads(ctx, g_t, 2, recompute, "masked ssim_term", n_inputs=10, expect=ctx.expect)


_term_op.register_autograd(_term_backward, setup_context=_term_save)


def _loss_weights(z: Tensor, planes: Tensor, lam: float, expect: float = 1.0) -> Tuple[Tensor, Tensor]:
    """``[B, C]`` weights of the fused masked loss for an upstream of ``expect`` per image: the SSIM
    sums' ``-lam / C / z`` (``z`` the centre weights; 0 where ``z`` is) and the L1 term's
    ``(1 - lam) / sum M`` over the image's channels and pixels (``planes``: the mask's plane sums;
    0 for an empty mask), each times ``expect``. One launch (:func:`.partials.masked_weights`)."""
    w = partials.masked_weights(z, -lam * expect / z.shape[1], planes, (1.0 - lam) * expect)
    return w[0], w[1]


def _masked_dssim_l1_impl(
    img1: Tensor,
    img2: Tensor,
    mask: Tensor,
    window: Tensor,
    padding: str,
    c1: float,
    c2: float,
    lam: float,
    need1: bool,
    need2: bool,
    expect: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    """The masked loss per image ``[B]`` and, for each image that needs one, its gradient for an
    upstream gradient of ``expect`` per image (float32; empty where not asked)."""
    return _masked_losses(img1, img2, mask, window, padding, c1, c2, lam, need1, need2, expect, False)


def _masked_dssim_l1_mean_impl(
    img1: Tensor,
    img2: Tensor,
    mask: Tensor,
    window: Tensor,
    padding: str,
    c1: float,
    c2: float,
    lam: float,
    need1: bool,
    need2: bool,
    expect: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`_masked_dssim_l1_impl` with the loss's mean over the batch (a 0-dim tensor) taken in the
    launch that forms the loss."""
    return _masked_losses(img1, img2, mask, window, padding, c1, c2, lam, need1, need2, expect, True)


def _masked_dssim_l1_terms_impl(
    img1: Tensor,
    img2: Tensor,
    mask: Tensor,
    window: Tensor,
    padding: str,
    c1: float,
    c2: float,
    lam: float,
    need1: bool,
    need2: bool,
    expect: float,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`_masked_dssim_l1_impl` with the loss's two terms per image as they enter it, ``[2, B]``
    (the masked L1 term, the D-SSIM term; no gradient), written by the launch that forms the loss."""
    terms = torch.empty((2, img1.shape[0]), dtype=torch.float32, device=img1.device)
    loss, gx, gy = _masked_losses(img1, img2, mask, window, padding, c1, c2, lam, need1, need2, expect, False, terms)
    return loss, terms, gx, gy


def _masked_losses(img1, img2, mask, window, padding, c1, c2, lam, need1, need2, expect, mean, terms=None):
    m = _float_mask(mask, img1)
    z, planes = plane_sums(mask, img1, window, padding)
    empty = img1.new_empty(0, dtype=torch.float32)
    if not (need1 or need2):
        if padding != "same":  # "valid": the map's centres do not cover the image; the L1 term in torch ops
            s, _ = launch_masked_fwd(img1, img2, m, window, padding, c1, c2)
            ssim_part = partials.masked_dssim_l1_loss(s, None, z, None, lam, terms=terms)
            l1_term = masked_l1(img1, img2, mask)
            loss = (1.0 - lam) * l1_term + ssim_part
            if terms is not None:
                terms[0].copy_(l1_term)
            return (loss.mean() if mean else loss), empty, empty.clone()
        # every pixel is one map position's centre: the forward kernel sums the masked |x - y| too
        s, _, l1 = launch_masked_fwd(img1, img2, m, window, padding, c1, c2, l1=True)
        return partials.masked_dssim_l1_loss(s, l1, z, planes, lam, mean=mean, terms=terms), empty, empty.clone()
    g_s, w_l1 = _loss_weights(z, planes, lam, expect)
    gx, gy, parts = launch_masked_bwd(
        img1, img2, m, window, padding, c1, c2, g_s, None, need1, need2, True, torch.float32, l1=w_l1
    )
    loss = partials.masked_dssim_l1_loss(parts, parts[:, :, 1], z, planes, lam, width=2, mean=mean, terms=terms)
    return loss, (gx if need1 else empty), (gy if need2 else empty.clone())


_dssim_l1_op = torch.library.custom_op("splatloss::triton_masked_dssim_l1", _masked_dssim_l1_impl, mutates_args=())


@_dssim_l1_op.register_fake
def _(img1, img2, mask, window, padding, c1, c2, lam, need1, need2, expect):
    gx, gy = fake_unit_grads(img1, img2, need1, need2)
    return img1.new_empty(img1.shape[:1], dtype=torch.float32), gx, gy


@torch.library.custom_op("splatloss::triton_masked_dssim_l1_bwd", mutates_args=())
def _dssim_l1_bwd_op(
    g: Tensor,
    img1: Tensor,
    img2: Tensor,
    mask: Tensor,
    window: Tensor,
    padding: str,
    c1: float,
    c2: float,
    lam: float,
    need1: bool,
    need2: bool,
) -> Tuple[Tensor, Tensor]:
    m = _float_mask(mask, img1)
    g_s, w_l1 = _loss_weights(*plane_sums(mask, img1, window, padding), lam)
    g = g.to(torch.float32)[:, None]  # one upstream scalar per image
    gx, gy = launch_masked_bwd(img1, img2, m, window, padding, c1, c2, g * g_s, None, need1, need2, l1=g * w_l1)
    return (gx if need1 else img1.new_empty(0)), (gy if need2 else img2.new_empty(0))


@_dssim_l1_bwd_op.register_fake
def _(g, img1, img2, mask, window, padding, c1, c2, lam, need1, need2):
    return fake_grads(img1, img2, need1, need2)


def _dssim_l1_save(ctx, inputs, output):
    img1, img2, mask, window, padding, c1, c2, lam, need1, need2, expect = inputs
    save_unit_grads(ctx, img1, img2, window, *output[1:], mask)
    ctx.cfg = (padding, c1, c2, lam)
    ctx.expect = expect


def _dssim_l1_backward(ctx, g, _gx, _gy):
    def recompute(img1, img2, window, need1, need2, mask):
        return _dssim_l1_bwd_op(g, img1, img2, mask, window, *ctx.cfg, need1, need2)

    return backward_from_unit_grads(ctx, g, 1, recompute, "masked dssim_l1", n_inputs=11, expect=ctx.expect)


_dssim_l1_call = with_autograd(_dssim_l1_op, _masked_dssim_l1_impl, _dssim_l1_save, _dssim_l1_backward)

_dssim_l1_mean_op = torch.library.custom_op(
    "splatloss::triton_masked_dssim_l1_mean", _masked_dssim_l1_mean_impl, mutates_args=()
)


@_dssim_l1_mean_op.register_fake
def _(img1, img2, mask, window, padding, c1, c2, lam, need1, need2, expect):
    gx, gy = fake_unit_grads(img1, img2, need1, need2)
    return img1.new_empty((), dtype=torch.float32), gx, gy


def _dssim_l1_mean_save(ctx, inputs, output):
    _dssim_l1_save(ctx, inputs, output)
    ctx.batch = inputs[0].shape[0]


def _dssim_l1_mean_backward(ctx, g, _gx, _gy):
    B = ctx.batch

    def recompute(img1, img2, window, need1, need2, mask):
        # each image's upstream as autograd's mean backward forms it: ``g / B``
        return _dssim_l1_bwd_op(g.expand(B) / B, img1, img2, mask, window, *ctx.cfg, need1, need2)

    u = batch_mean_factor(g, B, ctx.expect)
    return backward_from_unit_grads(ctx, u, 1, recompute, "masked dssim_l1", n_inputs=11, expect=1.0)


_dssim_l1_mean_call = with_autograd(
    _dssim_l1_mean_op, _masked_dssim_l1_mean_impl, _dssim_l1_mean_save, _dssim_l1_mean_backward
)


_dssim_l1_terms_op = torch.library.custom_op(
    "splatloss::triton_masked_dssim_l1_terms", _masked_dssim_l1_terms_impl, mutates_args=()
)


@_dssim_l1_terms_op.register_fake
def _(img1, img2, mask, window, padding, c1, c2, lam, need1, need2, expect):
    gx, gy = fake_unit_grads(img1, img2, need1, need2)
    B = img1.shape[0]
    return img1.new_empty((B,), dtype=torch.float32), img1.new_empty((2, B), dtype=torch.float32), gx, gy


def _dssim_l1_terms_save(ctx, inputs, output):
    loss, terms, gx, gy = output
    _dssim_l1_save(ctx, inputs, (loss, gx, gy))
    ctx.mark_non_differentiable(terms, gx, gy)


def _dssim_l1_terms_backward(ctx, g, _terms, _gx, _gy):
    return _dssim_l1_backward(ctx, g, _gx, _gy)


_dssim_l1_terms_call = with_autograd(
    _dssim_l1_terms_op, _masked_dssim_l1_terms_impl, _dssim_l1_terms_save, _dssim_l1_terms_backward
)


# ------------------------------------------------------------------------------------------------
# Backend entry points
# ------------------------------------------------------------------------------------------------


def _args(img1: Tensor, img2: Tensor, mask: Tensor, cfg):
    check_inputs(img1, img2, cfg)
    # the mask itself where it needs no gradient (its sums are then kept per version: _cached_sums)
    m = mask.detach() if mask.requires_grad else mask
    return m, window_taps(cfg, img1.device), cfg.padding, float(cfg.C1), float(cfg.C2)


def masked_ssim_stats(img1: Tensor, img2: Tensor, mask: Tensor, cfg) -> Tuple[Tensor, Tensor]:
    """Masked ``(ssim_mean, cs_mean)``, each ``[B, C]`` float32 (the mask gets no gradient)."""
    with functorch_guard():
        return _stats_op(img1, img2, *_args(img1, img2, mask, cfg))


def masked_ssim_term(img1: Tensor, img2: Tensor, mask: Tensor, cfg) -> Tensor:
    """The masked ``[B, C]`` SSIM mean for a loss: with a gradient to compute, the masked backward
    kernel's single pass computes it in the forward (as :func:`.ssim.ssim_term`)."""
    with functorch_guard():
        s, _, _ = _term_op(
            img1, img2, *_args(img1, img2, mask, cfg), wants_grad(img1), wants_grad(img2), dssim_mean_upstream(img1)
        )
    return s


def masked_dssim_l1(img1: Tensor, img2: Tensor, mask: Tensor, cfg, lam: float, mean: bool = False) -> Tensor:
    """Per image ``(1 - lam) * sum M |x - y| / sum M + lam * (1 - masked SSIM)``, ``[B]`` float32
    (``mean``: their mean over the batch, a 0-dim tensor, in the same launches)."""
    with functorch_guard():
        loss, _, _ = (_dssim_l1_mean_call if mean else _dssim_l1_call)(
            img1,
            img2,
            *_args(img1, img2, mask, cfg),
            float(lam),
            wants_grad(img1),
            wants_grad(img2),
            # each image's loss's gradient for the upstream of the mean over the batch, ``1 / B``
            # (:func:`.glue.batch_mean_upstream`: eager, float32 images; elsewhere 1)
            batch_mean_upstream(img1),
        )
    return loss


def masked_dssim_l1_terms(img1: Tensor, img2: Tensor, mask: Tensor, cfg, lam: float) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`masked_dssim_l1` and its masked L1 and D-SSIM terms per image as they enter it (no
    graph), ``[B]`` each, from the partial sums the loss is formed of, in the same launch."""
    with functorch_guard():
        loss, terms, _, _ = _dssim_l1_terms_call(
            img1, img2, *_args(img1, img2, mask, cfg), float(lam), wants_grad(img1), wants_grad(img2),
            batch_mean_upstream(img1),
        )  # fmt: skip
    return loss, terms[0], terms[1]
