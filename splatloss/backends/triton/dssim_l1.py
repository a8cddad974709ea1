"""The 3DGS photometric loss ``(1 - lam) * L1 + lam * (1 - SSIM)`` fused on Triton.

When an input requires a gradient (training), the forward is one pass of the SSIM backward kernel
for a unit upstream gradient per image: it recomputes nothing later, sums the SSIM values and
``|x - y|`` on its way, and adds the L1 term ``l1 * sign(x - y)`` in registers before the single
store of each gradient (8 B read + 4 B written per gradient, kept in float32 for the backward).
The gradient is computed for the upstream of the default mean over the batch (``1 / B`` per
image), and the backward hands it on untouched when that is the upstream it gets (float32
images), or scales it in place by the ratio (one elementwise pass, 8 B): :mod:`.rescale`.

Without a gradient (evaluation): the SSIM forward kernel in its "stats_l1" mode -- while the taps
of each input row are in registers for the horizontal pass, each lane also sums ``|x - y|`` over
the pixels it owns, so the loss costs one read of both images (8 B per pixel-channel, fp32). It
sums no cs (the loss does not need it), and under "same" padding it keeps its last rows' sums in
scratch: then it fits the lean forward's 64 registers (32 warps per SM on sm_90).

Either way the loss per image comes from the kernel's partial sums in one more launch
(:func:`.partials.dssim_l1_loss`: the channels' sums of both quantities and the loss's scalar
arithmetic; in torch nine launches).
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch

from .backward import launch_bwd
from .forward import launch_fwd
from .glue import (
    backward_from_unit_grads,
    batch_mean_factor,
    batch_mean_upstream,
    check_inputs,
    fake_grads,
    fake_unit_grads,
    functorch_guard,
    save_unit_grads,
    wants_grad,
    window_taps,
    with_autograd,
)
from .launch import out_size
from .partials import dssim_l1_loss

__all__ = ["dssim_l1", "dssim_l1_terms"]

Tensor = torch.Tensor


def _sizes(img: Tensor, window: Tensor, padding: str) -> Tuple[int, int]:
    B, C, H, W = img.shape
    K = window.shape[0]
    return C * out_size(H, K, padding) * out_size(W, K, padding), C * H * W


def _losses(
    img1: Tensor, img2: Tensor, window: Tensor, padding: str, c1: float, c2: float, lam: float, need1: bool,
    need2: bool, expect: float, mean: bool, terms: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    n_map, n_img = _sizes(img1, window, padding)
    B, C = img1.shape[:2]
    empty = img1.new_empty(0, dtype=torch.float32)
    if not (need1 or need2):
        s, _, l1 = launch_fwd(img1, img2, window, padding, c1, c2, "stats_l1", raw=True)
        return dssim_l1_loss(s, l1, B, C, lam, n_map, n_img, mean=mean, terms=terms), empty, empty.clone()
    g_s, w_l1 = _weights(B, C, lam, expect, n_map, n_img, img1.device)
    gx, gy, parts, _ = launch_bwd(
        img1, img2, window, padding, c1, c2, g_s, None, need1, need2, l1=w_l1, sums=True, grad_dtype=torch.float32,
        raw_sums=True,
    )  # fmt: skip
    loss = dssim_l1_loss(parts, parts[:, :, 1], B, C, lam, n_map, n_img, width=2, mean=mean, terms=terms)
    return loss, (gx if need1 else empty), (gy if need2 else empty.clone())


def _dssim_l1_impl(
    img1: Tensor,
    img2: Tensor,
    window: Tensor,
    padding: str,
    c1: float,
    c2: float,
    lam: float,
    need1: bool,
    need2: bool,
    expect: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    """The loss per image ``[B]``, and for each image that needs one its gradient for an upstream
    gradient of ``expect`` per image (float32; empty where not asked)."""
    return _losses(img1, img2, window, padding, c1, c2, lam, need1, need2, expect, False)


def _dssim_l1_mean_impl(
    img1: Tensor,
    img2: Tensor,
    window: Tensor,
    padding: str,
    c1: float,
    c2: float,
    lam: float,
    need1: bool,
    need2: bool,
    expect: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`_dssim_l1_impl` with the loss's mean over the batch (a 0-dim tensor) taken in the launch
    that forms the loss: no reduction launched after it, one autograd node."""
    return _losses(img1, img2, window, padding, c1, c2, lam, need1, need2, expect, True)


@functools.lru_cache(maxsize=64)
def _weights(B: int, C: int, lam: float, expect: float, n_map: int, n_img: int, device) -> Tuple[Tensor, Tensor]:
    """The ``[B, C]`` upstreams of the SSIM sums and of the L1 term for an upstream of ``expect`` per
    image, built once per (shape, weights, device) and shared: the kernel only reads them, and a
    training loop then launches no fills for them."""
    g_s = torch.full((B, C), -lam * expect / n_map, dtype=torch.float32, device=device)
    w_l1 = torch.full((B, C), (1.0 - lam) * expect / n_img, dtype=torch.float32, device=device)
    return g_s, w_l1


def _dssim_l1_terms_impl(
    img1: Tensor,
    img2: Tensor,
    window: Tensor,
    padding: str,
    c1: float,
    c2: float,
    lam: float,
    need1: bool,
    need2: bool,
    expect: float,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`_dssim_l1_impl` with the loss's two terms per image as they enter it, ``[2, B]`` (the
    L1 term, the D-SSIM term; no gradient), written by the launch that forms the loss."""
    terms = torch.empty((2, img1.shape[0]), dtype=torch.float32, device=img1.device)
    loss, gx, gy = _losses(img1, img2, window, padding, c1, c2, lam, need1, need2, expect, False, terms)
    return loss, terms, gx, gy


_dssim_l1_op = torch.library.custom_op("splatloss::triton_dssim_l1", _dssim_l1_impl, mutates_args=())


@_dssim_l1_op.register_fake
def _(img1, img2, window, padding, c1, c2, lam, need1, need2, expect):
    gx, gy = fake_unit_grads(img1, img2, need1, need2)
    return img1.new_empty(img1.shape[:1], dtype=torch.float32), gx, gy


@torch.library.custom_op("splatloss::triton_dssim_l1_bwd", mutates_args=())
def _dssim_l1_bwd_op(
    g: Tensor,
    img1: Tensor,
    img2: Tensor,
    window: Tensor,
    padding: str,
    c1: float,
    c2: float,
    lam: float,
    need1: bool,
    need2: bool,
) -> Tuple[Tensor, Tensor]:
    n_map, n_img = _sizes(img1, window, padding)
    C = img1.shape[1]
    g = g.to(torch.float32)[:, None].expand(-1, C)  # [B, C]: one upstream scalar per image
    gx, gy = launch_bwd(
        img1, img2, window, padding, c1, c2, g * (-lam / n_map), None, need1, need2, l1=g * ((1.0 - lam) / n_img)
    )
    return (gx if need1 else img1.new_empty(0)), (gy if need2 else img2.new_empty(0))


@_dssim_l1_bwd_op.register_fake
def _(g, img1, img2, window, padding, c1, c2, lam, need1, need2):
    return fake_grads(img1, img2, need1, need2)


def _save(ctx, inputs, output):
    img1, img2, window, padding, c1, c2, lam, need1, need2, expect = inputs
    save_unit_grads(ctx, img1, img2, window, *output[1:])
    ctx.cfg = (padding, c1, c2, lam)
    ctx.expect = expect


def _backward(ctx, g, _gx, _gy):
    def recompute(img1, img2, window, need1, need2):
        return _dssim_l1_bwd_op(g, img1, img2, window, *ctx.cfg, need1, need2)

    return backward_from_unit_grads(ctx, g, 1, recompute, "dssim_l1", n_inputs=10, expect=ctx.expect)


_dssim_l1_call = with_autograd(_dssim_l1_op, _dssim_l1_impl, _save, _backward)

_dssim_l1_mean_op = torch.library.custom_op("splatloss::triton_dssim_l1_mean", _dssim_l1_mean_impl, mutates_args=())


@_dssim_l1_mean_op.register_fake
def _(img1, img2, window, padding, c1, c2, lam, need1, need2, expect):
    gx, gy = fake_unit_grads(img1, img2, need1, need2)
    return img1.new_empty((), dtype=torch.float32), gx, gy


def _mean_save(ctx, inputs, output):
    _save(ctx, inputs, output)
    ctx.batch = inputs[0].shape[0]


def _mean_backward(ctx, g, _gx, _gy):
    B = ctx.batch

    def recompute(img1, img2, window, need1, need2):
        # each image's upstream as autograd's mean backward forms it: ``g / B``
        return _dssim_l1_bwd_op(g.expand(B) / B, img1, img2, window, *ctx.cfg, need1, need2)

    u = batch_mean_factor(g, B, ctx.expect)
    return backward_from_unit_grads(ctx, u, 1, recompute, "dssim_l1", n_inputs=10, expect=1.0)


_dssim_l1_mean_call = with_autograd(_dssim_l1_mean_op, _dssim_l1_mean_impl, _mean_save, _mean_backward)


_dssim_l1_terms_op = torch.library.custom_op("splatloss::triton_dssim_l1_terms", _dssim_l1_terms_impl, mutates_args=())


@_dssim_l1_terms_op.register_fake
def _(img1, img2, window, padding, c1, c2, lam, need1, need2, expect):
    gx, gy = fake_unit_grads(img1, img2, need1, need2)
    B = img1.shape[0]
    return img1.new_empty((B,), dtype=torch.float32), img1.new_empty((2, B), dtype=torch.float32), gx, gy


def _terms_save(ctx, inputs, output):
    loss, terms, gx, gy = output
    _save(ctx, inputs, (loss, gx, gy))
    ctx.mark_non_differentiable(terms, gx, gy)


def _terms_backward(ctx, g, _terms, _gx, _gy):
    return _backward(ctx, g, _gx, _gy)


_dssim_l1_terms_call = with_autograd(_dssim_l1_terms_op, _dssim_l1_terms_impl, _terms_save, _terms_backward)


def dssim_l1_terms(img1: Tensor, img2: Tensor, cfg, lam: float) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`dssim_l1` and its L1 and D-SSIM terms per image as they enter it (no graph), ``[B]``
    each: the terms from the partial sums the loss is formed of, in the same launch."""
    check_inputs(img1, img2, cfg)
    with functorch_guard():
        loss, terms, _, _ = _dssim_l1_terms_call(
            img1, img2, window_taps(cfg, img1.device), cfg.padding, float(cfg.C1), float(cfg.C2), float(lam),
            wants_grad(img1), wants_grad(img2), batch_mean_upstream(img1),
        )  # fmt: skip
    return loss, terms[0], terms[1]


def dssim_l1(img1: Tensor, img2: Tensor, cfg, lam: float, mean: bool = False) -> Tensor:
    """Per image ``(1 - lam) * mean|x - y| + lam * (1 - mean SSIM)``, shape ``[B]`` float32 (``mean``:
    their mean over the batch, a 0-dim tensor, in the same launches). Its gradient is computed for
    the upstream of the mean over the batch, so a ``loss.backward()`` hands it on untouched
    (:mod:`.rescale`)."""
    check_inputs(img1, img2, cfg)
    with functorch_guard():
        loss, _, _ = (_dssim_l1_mean_call if mean else _dssim_l1_call)(
            img1,
            img2,
            window_taps(cfg, img1.device),
            cfg.padding,
            float(cfg.C1),
            float(cfg.C2),
            float(lam),
            wants_grad(img1),
            wants_grad(img2),
            # each image's loss's gradient for the upstream of the mean over the batch, ``1 / B``
            # (:func:`.glue.batch_mean_upstream`: eager, float32 images; elsewhere 1)
            batch_mean_upstream(img1),
        )
    return loss
