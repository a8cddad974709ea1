"""SSIM on Triton, the ops: per-(image, channel) means (``ssim_stats``), the map (``ssim_map``) and
the loss term (``ssim_term``), each a ``torch.library.custom_op`` with its ``register_fake`` and
``register_autograd`` (opaque to ``torch.compile``: no graph break), over the kernels of
:mod:`.forward` and :mod:`.backward`.

A loss (``ssim_term``: the mean SSIM or cs per image and channel, under ``splatloss.ssim``,
``dssim_l1`` and every MS-SSIM scale) whose input requires a gradient runs the backward kernel in
its forward, for a unit upstream gradient per (image, channel), summing the SSIM values on the way:
one pass over the moments, which keeps the finished float32 gradient (4 B per pixel-channel and
input) for the backward, which only multiplies it by the upstream scalars. Saving the partial
derivative maps instead (fused-ssim keeps three) would keep 12 B and still need a second pass;
recomputing in the backward (what ``ssim_map`` does, its upstream being a map) computes the
moments twice. Without a gradient to compute (``torch.no_grad()``, evaluation) the forward kernel
runs alone, 8 B read.

Bytes per pixel-channel (fp32 I/O, DRAM traffic; halo re-reads served by L2 and the L1/L2-resident
scratch not counted, see docs/triton.md for both and for what the static cost model says of saving
the partial maps instead):

* ``ssim_stats`` forward: reads x, y = 8 B; writes 2 floats per program (negligible).
* ``ssim_stats`` backward: reads x, y = 8 B; writes grad_x (and grad_y) = 4 B (8 B). 12 B for one
  gradient, so forward + backward = 20 B.
* ``ssim_term`` with a gradient: the backward kernel's 12 B in the forward, then the scaling in the
  backward reads and writes 4 B each: 20 B (fused-ssim ~52 B, FastCUDASSIM.jl ~44 B).
* ``ssim_map`` forward: 8 B + 4 B map (+ 4 B cs map); backward adds the upstream map reads: 4 B
  (+ 4 B) on top of the 12 B above.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .backward import launch_bwd
from .forward import launch_fwd
from .glue import (
    backward_from_unit_grads,
    check_inputs,
    dssim_mean_upstream,
    fake_grads,
    fake_unit_grads,
    functorch_guard,
    map_numel,
    refuse_double_backward,
    save_unit_grads,
    unit_upstreams,
    wants_grad,
    window_taps,
    with_autograd,
    zeros_if_none,
)
from .launch import out_size
from .partials import dssim_l1_loss
from .partials import means as partial_means

__all__ = ["ssim_loss", "ssim_map", "ssim_stats", "ssim_term", "ssim_mean_and_grad", "stats_bwd_op"]

Tensor = torch.Tensor


@torch.library.custom_op("splatloss::triton_ssim_stats", mutates_args=())
def _stats_op(img1: Tensor, img2: Tensor, window: Tensor, padding: str, c1: float, c2: float) -> Tuple[Tensor, Tensor]:
    s, cs = launch_fwd(img1, img2, window, padding, c1, c2, "stats")
    n = map_numel(img1, window, padding)
    return s / n, cs / n


@_stats_op.register_fake
def _(img1, img2, window, padding, c1, c2):
    shape = img1.shape[:2]
    return img1.new_empty(shape, dtype=torch.float32), img1.new_empty(shape, dtype=torch.float32)


@torch.library.custom_op("splatloss::triton_ssim_stats_bwd", mutates_args=())
def stats_bwd_op(
    g_s: Tensor,
    g_cs: Tensor,
    img1: Tensor,
    img2: Tensor,
    window: Tensor,
    padding: str,
    c1: float,
    c2: float,
    need1: bool,
    need2: bool,
) -> Tuple[Tensor, Tensor]:
    n = map_numel(img1, window, padding)
    gx, gy = launch_bwd(img1, img2, window, padding, c1, c2, g_s / n, g_cs / n, need1, need2)
    return (gx if need1 else img1.new_empty(0)), (gy if need2 else img2.new_empty(0))


@stats_bwd_op.register_fake
def _(g_s, g_cs, img1, img2, window, padding, c1, c2, need1, need2):
    return fake_grads(img1, img2, need1, need2)


def _save(ctx, inputs, output):
    img1, img2, window, padding, c1, c2 = inputs[:6]
    # Only the inputs are kept (references, no copies): the backward recomputes the moments.
    ctx.save_for_backward(img1, img2, window)
    ctx.cfg = (padding, c1, c2)
    ctx.extra = inputs[6:]


def _stats_backward(ctx, g_s, g_cs):
    refuse_double_backward("ssim_stats")
    img1, img2, window = ctx.saved_tensors
    need1, need2 = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
    if not (need1 or need2):
        return None, None, None, None, None, None
    shape = img1.shape[:2]
    g_s = zeros_if_none(g_s, shape, img1.device)
    g_cs = zeros_if_none(g_cs, shape, img1.device)
    gx, gy = stats_bwd_op(g_s, g_cs, img1, img2, window, *ctx.cfg, need1, need2)
    return (gx if need1 else None), (gy if need2 else None), None, None, None, None


_stats_op.register_autograd(_stats_backward, setup_context=_save)


@torch.library.custom_op("splatloss::triton_ssim_map", mutates_args=())
def _map_op(
    img1: Tensor,
    img2: Tensor,
    window: Tensor,
    padding: str,
    c1: float,
    c2: float,
    return_cs: bool,
) -> Tuple[Tensor, Tensor]:
    s, cs = launch_fwd(img1, img2, window, padding, c1, c2, "map_cs" if return_cs else "map")
    return s, cs if return_cs else img1.new_empty(0, dtype=torch.float32)


@_map_op.register_fake
def _(img1, img2, window, padding, c1, c2, return_cs):
    B, C, H, W = img1.shape
    K = window.shape[0]
    shape = (B, C, out_size(H, K, padding), out_size(W, K, padding))
    s = img1.new_empty(shape, dtype=torch.float32)
    return s, (img1.new_empty(shape, dtype=torch.float32) if return_cs else img1.new_empty(0, dtype=torch.float32))


@torch.library.custom_op("splatloss::triton_ssim_map_bwd", mutates_args=())
def _map_bwd_op(
    g_s: Tensor,
    g_cs: Tensor,
    img1: Tensor,
    img2: Tensor,
    window: Tensor,
    padding: str,
    c1: float,
    c2: float,
    has_cs: bool,
    need1: bool,
    need2: bool,
) -> Tuple[Tensor, Tensor]:
    gx, gy = launch_bwd(img1, img2, window, padding, c1, c2, g_s, g_cs if has_cs else None, need1, need2)
    return (gx if need1 else img1.new_empty(0)), (gy if need2 else img2.new_empty(0))


@_map_bwd_op.register_fake
def _(g_s, g_cs, img1, img2, window, padding, c1, c2, has_cs, need1, need2):
    return fake_grads(img1, img2, need1, need2)


def _map_backward(ctx, g_s, g_cs):
    refuse_double_backward("ssim_map")
    img1, img2, window = ctx.saved_tensors
    (return_cs,) = ctx.extra
    need1, need2 = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
    if not (need1 or need2):
        return None, None, None, None, None, None, None
    B, C, H, W = img1.shape
    K = window.shape[0]
    shape = (B, C, out_size(H, K, ctx.cfg[0]), out_size(W, K, ctx.cfg[0]))
    g_s = zeros_if_none(g_s, shape, img1.device)
    has_cs = bool(return_cs) and g_cs is not None
    g_cs = g_cs if has_cs else g_s
    gx, gy = _map_bwd_op(g_s, g_cs, img1, img2, window, *ctx.cfg, has_cs, need1, need2)
    return (
        (gx if need1 else None),
        (gy if need2 else None),
        None,
        None,
        None,
        None,
        None,
    )


_map_op.register_autograd(_map_backward, setup_context=_save)


def term_into(
    out: Tensor,
    img1: Tensor,
    img2: Tensor,
    window: Tensor,
    padding: str,
    c1: float,
    c2: float,
    cs: bool,
    need1: bool,
    need2: bool,
    grad1: Optional[Tensor] = None,
    grad2: Optional[Tensor] = None,
    expect: float = 1.0,
) -> Tuple[Tensor, Tensor]:
    """:func:`_term_impl` with the mean written into ``out`` (float32, any view of ``B * C``
    elements that can be seen as ``(B * C, 1)``, e.g. MS-SSIM's terms at the finest scale): the
    partial sums' means in one launch (:func:`.partials.means`). ``grad1``, ``grad2``: float32
    tensors of the images' shape to write the unit gradients into (e.g. views of MS-SSIM's flat
    buffer of the coarser scales'), else new ones. The gradients are those for an upstream of
    ``expect`` per (image, channel). Returns them (empty where not computed)."""
    n = map_numel(img1, window, padding)
    BC = img1.shape[0] * img1.shape[1]
    empty = img1.new_empty(0, dtype=torch.float32)
    if not (need1 or need2):
        s, c = launch_fwd(img1, img2, window, padding, c1, c2, "stats", raw=True)
        partial_means(c if cs else s, BC, [s.shape[1]], [n], out.view(BC, 1))
        return empty, empty.clone()
    unit = unit_upstreams([n], BC, img1.device, expect)[0].view(img1.shape[:2])  # shared, read only
    gx, gy, parts, _ = launch_bwd(
        img1,
        img2,
        window,
        padding,
        c1,
        c2,
        unit,
        unit if cs else None,
        need1,
        need2,
        grad1=grad1,
        grad2=grad2,
        sums=True,
        grad_dtype=torch.float32,
        cs_only=cs,
        raw_sums=True,
    )
    partial_means(parts, BC, [parts.shape[1]], [n], out.view(BC, 1), width=2)
    return (gx if need1 else empty), (gy if need2 else empty.clone())


def _term_impl(
    img1: Tensor,
    img2: Tensor,
    window: Tensor,
    padding: str,
    c1: float,
    c2: float,
    cs: bool,
    need1: bool,
    need2: bool,
    expect: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    """The ``[B, C]`` mean of the SSIM map (or of the cs map when ``cs``), and, for each image
    that needs one (``need1`` / ``need2``), the gradient of that mean with respect to it, times
    ``expect`` (the upstream it assumes): the backward kernel's pass, which computes every SSIM
    value on its way to the gradient, run in the forward (8 B read + 4 B written per gradient);
    the backward then only scales it, or hands it on (:mod:`.rescale`)."""
    out = torch.empty(img1.shape[:2], dtype=torch.float32, device=img1.device)
    gx, gy = term_into(out, img1, img2, window, padding, c1, c2, cs, need1, need2, expect=expect)
    return out, gx, gy


_term_op = torch.library.custom_op("splatloss::triton_ssim_term", _term_impl, mutates_args=())


@_term_op.register_fake
def _(img1, img2, window, padding, c1, c2, cs, need1, need2, expect):
    gx, gy = fake_unit_grads(img1, img2, need1, need2)
    return img1.new_empty(img1.shape[:2], dtype=torch.float32), gx, gy


def _term_save(ctx, inputs, output):
    img1, img2, window, padding, c1, c2, cs, need1, need2, expect = inputs
    save_unit_grads(ctx, img1, img2, window, *output[1:])
    ctx.cfg = (padding, c1, c2, cs)
    ctx.expect = expect


def _term_backward(ctx, g_t, _gx, _gy):
    padding, c1, c2, cs = ctx.cfg

    def recompute(img1, img2, window, need1, need2):
        zero = torch.zeros_like(g_t)
        g_s, g_cs = (zero, g_t) if cs else (g_t, zero)
        return stats_bwd_op(g_s, g_cs, img1, img2, window, padding, c1, c2, need1, need2)

    return backward_from_unit_grads(ctx, g_t, 2, recompute, "ssim_term", n_inputs=10, expect=ctx.expect)


_term_call = with_autograd(_term_op, _term_impl, _term_save, _term_backward)


def _loss_impl(
    img1: Tensor,
    img2: Tensor,
    window: Tensor,
    padding: str,
    c1: float,
    c2: float,
    dssim: bool,
    need1: bool,
    need2: bool,
    expect: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    """The batch's mean SSIM (``dssim``: mean D-SSIM, ``1 - SSIM`` per image) as a 0-dim tensor,
    and for each image that needs one its gradient for the upstream ``expect`` per (image, channel)
    mean (:func:`_term_impl`'s): the mean over channels and images taken in the launch that forms
    the loss from the kernel's partial sums, so a loss call launches no reductions of its own and
    autograd runs one node for it."""
    n = map_numel(img1, window, padding)
    B, C = img1.shape[:2]
    kind = "dssim" if dssim else "ssim"
    empty = img1.new_empty(0, dtype=torch.float32)
    if not (need1 or need2):
        s, _ = launch_fwd(img1, img2, window, padding, c1, c2, "stats", raw=True)
        return dssim_l1_loss(s, None, B, C, 0.0, C * n, 1, mean=True, kind=kind), empty, empty.clone()
    unit = unit_upstreams([n], B * C, img1.device, expect)[0].view(B, C)  # shared, read only
    gx, gy, parts, _ = launch_bwd(
        img1, img2, window, padding, c1, c2, unit, None, need1, need2, sums=True, grad_dtype=torch.float32,
        raw_sums=True,
    )  # fmt: skip
    loss = dssim_l1_loss(parts, None, B, C, 0.0, C * n, 1, width=2, mean=True, kind=kind)
    return loss, (gx if need1 else empty), (gy if need2 else empty.clone())


_loss_op = torch.library.custom_op("splatloss::triton_ssim_loss", _loss_impl, mutates_args=())


@_loss_op.register_fake
def _(img1, img2, window, padding, c1, c2, dssim, need1, need2, expect):
    gx, gy = fake_unit_grads(img1, img2, need1, need2)
    return img1.new_empty((), dtype=torch.float32), gx, gy


def _loss_save(ctx, inputs, output):
    img1, img2, window, padding, c1, c2, dssim, need1, need2, expect = inputs
    save_unit_grads(ctx, img1, img2, window, *output[1:])
    ctx.cfg = (padding, c1, c2, dssim)
    ctx.batch = tuple(img1.shape[:2])
    ctx.expect = expect


def _loss_backward(ctx, g, _gx, _gy):
    padding, c1, c2, dssim = ctx.cfg
    B, C = ctx.batch

    def per_mean(g):
        # each (image, channel) mean's upstream as autograd's mean backwards form it: the batch
        # mean's ``g / B`` (negated for D-SSIM), then the channels' ``/ C``
        return g.expand(B, C) / (-B if dssim else B) / C

    def recompute(img1, img2, window, need1, need2):
        g_t = per_mean(g)
        return stats_bwd_op(g_t, torch.zeros_like(g_t), img1, img2, window, padding, c1, c2, need1, need2)

    if g is None or ctx.expect == 1.0:  # kept for an upstream of 1 per mean (see ssim_loss): scaled by each
        u = None if g is None else per_mean(g)
        return backward_from_unit_grads(ctx, u, 2, recompute, "ssim loss", n_inputs=10, expect=1.0)
    # kept for the loss's upstream in ``1 - ssim`` (-1), which is the D-SSIM mean's upstream 1 too:
    # scaled by the loss's upstream over that, once per image (none where it is that)
    u = g.reshape(1).expand(B)
    return backward_from_unit_grads(ctx, u, 1, recompute, "ssim loss", n_inputs=10, expect=1.0 if dssim else -1.0)


_loss_call = with_autograd(_loss_op, _loss_impl, _loss_save, _loss_backward)


# ------------------------------------------------------------------------------------------------
# Backend entry points (splatloss/backends/base.py)
# ------------------------------------------------------------------------------------------------


def _args(img1: Tensor, img2: Tensor, cfg):
    check_inputs(img1, img2, cfg)
    # (the kernels take the moments of x - s, s each row's own pixel moved to the window's centre
    # row: columns.vmoments)
    return window_taps(cfg, img1.device), cfg.padding, float(cfg.C1), float(cfg.C2)


def ssim_stats(img1: Tensor, img2: Tensor, cfg) -> Tuple[Tensor, Tensor]:
    """Per-image, per-channel means of the SSIM and cs maps, ``([B, C], [B, C])`` float32.

    Forward: one streaming pass over both images (8 B per pixel-channel with fp32 input). Backward
    (upstream one scalar per (B, C)): one pass recomputing the moments, 8 B read + 4 B written
    per gradient asked for.

    Examples:
        >>> from splatloss.config import SSIMConfig
        >>> x = torch.rand(1, 3, 16, 16)  # on CPU this runs in the Triton interpreter
        >>> s, cs = ssim_stats(x, x, SSIMConfig())
        >>> s.shape, bool(torch.allclose(s, torch.ones(1, 3)))
        (torch.Size([1, 3]), True)
    """
    with functorch_guard():
        return _stats_op(img1, img2, *_args(img1, img2, cfg))


def ssim_term(img1: Tensor, img2: Tensor, cfg, cs: bool = False, expect: Optional[float] = None) -> Tensor:
    """The ``[B, C]`` mean of the SSIM map (of the cs map when ``cs``) float32, for a loss.

    When an input requires a gradient, the forward computes the mean's gradient too, in the
    backward kernel's single pass (its SSIM values summed on the way), and keeps it (float32, 4 B
    per pixel-channel and input) for the backward, which only scales it by the upstream
    gradient: one pass over the moments instead of two. It is computed for the upstream
    ``expect`` per (image, channel), by default the D-SSIM loss's (:func:`.glue.dssim_mean_upstream`),
    which the backward then hands on untouched. Without a gradient to compute it is the forward
    kernel's pass (8 B read).

    Examples:
        >>> from splatloss.config import SSIMConfig
        >>> x = torch.rand(1, 1, 16, 16, requires_grad=True)  # on CPU: the Triton interpreter
        >>> s = ssim_term(x, x.detach(), SSIMConfig())
        >>> (1 - s.mean()).backward()
        >>> bool(torch.allclose(s, torch.ones(1, 1))), x.grad.shape
        (True, torch.Size([1, 1, 16, 16]))
    """
    with functorch_guard():
        s, _, _ = _term_call(
            img1,
            img2,
            *_args(img1, img2, cfg),
            bool(cs),
            wants_grad(img1),
            wants_grad(img2),
            dssim_mean_upstream(img1) if expect is None else float(expect),
        )
    return s


def ssim_loss(img1: Tensor, img2: Tensor, cfg, dssim: bool = False) -> Tensor:
    """The batch's mean SSIM (``dssim``: mean ``1 - SSIM``), a 0-dim float32 tensor: what
    ``splatloss.ssim`` / ``dssim`` return with ``reduction="mean"``, in one op (:func:`_loss_impl`).
    Its gradient, when an input requires one, is computed in the forward for the upstream of the
    D-SSIM loss (``1 - ssim(x, y)``, ``dssim(x, y)``) and handed on untouched in that case (eager,
    float32 images; elsewhere for an upstream of 1 per (image, channel) mean, scaled in the backward,
    as :func:`.glue.dssim_mean_upstream` says).

    Examples:
        >>> from splatloss.config import SSIMConfig
        >>> x = torch.rand(2, 1, 16, 16, requires_grad=True)  # on CPU: the Triton interpreter
        >>> loss = ssim_loss(x, x.detach(), SSIMConfig(), dssim=True)
        >>> loss.backward()
        >>> loss.shape, abs(loss.item()) < 1e-6, x.grad.shape
        (torch.Size([]), True, torch.Size([2, 1, 16, 16]))
    """
    with functorch_guard():
        s, _, _ = _loss_call(
            img1, img2, *_args(img1, img2, cfg), bool(dssim), wants_grad(img1), wants_grad(img2),
            dssim_mean_upstream(img1),
        )  # fmt: skip
    return s


def ssim_map(img1: Tensor, img2: Tensor, cfg, return_cs: bool = False):
    """SSIM map ``[B, C, H', W']`` float32 (and the cs map when ``return_cs``)."""
    with functorch_guard():
        s, cs = _map_op(img1, img2, *_args(img1, img2, cfg), bool(return_cs))
    return (s, cs) if return_cs else s


def ssim_mean_and_grad(img1: Tensor, img2: Tensor, cfg, upstream: Tensor) -> Tuple[Tensor, Tensor]:
    """``(ssim_mean [B, C], d(sum(upstream * ssim_mean)) / d img1)`` in ONE pass, no autograd.

    The backward kernel already computes every SSIM value of the map on its way to the
    gradient, so it also sums them: read x, y once, write the gradient once -- 12 B per
    pixel-channel with fp32 I/O, the floor for a loss value plus its gradient."""
    window, padding, c1, c2 = _args(img1, img2, cfg)
    n = map_numel(img1, window, padding)
    g = (upstream.to(device=img1.device, dtype=torch.float32) / n).expand(img1.shape[:2])
    gx, _, s_sum, _ = launch_bwd(
        img1.detach(),
        img2.detach(),
        window,
        padding,
        c1,
        c2,
        g,
        None,
        True,
        False,
        sums=True,
    )
    return s_sum / n, gx
