"""The C kernel as differentiable torch custom ops (``torch.library.custom_op``).

Each op has a fake (meta) implementation and an autograd formula, so ``torch.compile`` traces a
call as one opaque node instead of breaking the graph at the ctypes call. Eagerly the same forward
and formulas run as an ``autograd.Function`` (a custom op call goes through torch's dispatcher and
compile machinery, which imports ``torch._dynamo``; eager code does not need that). The ops see tensors in
the accumulation dtype; "valid" runs as is, "same" is the kernel's implicit zero border (``pad``),
"reflect" is an ``F.pad`` copy in front of the op whose adjoint autograd takes care of.

Backward: eagerly, when an input needs a gradient, the forward runs the kernel's fused pass (the
value and the gradient in one sweep, for the upstream a mean loss hands the op: the statistics are
computed once), and the backward hands that gradient on untouched when that upstream comes, else
scales it per plane or image (:func:`_fused_function`, :func:`_rescaled`). Traced
custom ops keep the functional split: a forward, and a backward that recomputes the statistics row
by row as it writes the gradient (only the two inputs are saved). Where a backward must itself be
differentiable (``create_graph=True``) or runs batched (``autograd.grad(..., is_grads_batched=True)``)
it uses the torch-ops adjoint of :mod:`splatloss.backends.torch_fused` instead: the same numbers to
round-off, at torch-ops speed, instead of failing.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from ... import multiscale
from ...config import SSIMConfig, accumulation_dtype, to_accumulation_dtype
from .. import masked, torch_fused
from ..base import stepwise_quotient
from . import library
from .library import FIXED_TAPS

__all__ = [
    "padded",
    "unpad_grad",
    "ssim_stats",
    "dssim_l1",
    "ms_terms",
    "down2",
    "ssim_mean_and_grad",
    "masked_ssim_stats",
    "masked_dssim_l1",
    "masked_ms_terms",
]

Tensor = torch.Tensor


def padded(x: Tensor, y: Tensor, cfg: SSIMConfig):
    """Accumulation dtype and padding: ``(x, y, pad)`` for a kernel that computes a "valid" SSIM
    of ``x``, ``y`` seen with ``pad`` zero rows / columns around them.

    "same" (zeros) costs no copy: the kernel reads the zeros implicitly. "reflect" is an
    ``F.pad`` copy whose adjoint (the fold-back of the mirrored border) autograd takes care of."""
    acc = accumulation_dtype(x.dtype)
    x, y = x.to(acc), y.to(acc)
    r = cfg.window_size // 2
    if cfg.padding == "same":
        return x, y, r
    if cfg.padding == "reflect":
        x, y = F.pad(x, (r, r, r, r), mode="reflect"), F.pad(y, (r, r, r, r), mode="reflect")
    return x, y, 0


def unpad_grad(g: Tensor, cfg: SSIMConfig, size) -> Tensor:
    """Adjoint of :func:`padded`'s copy ("reflect"), for a gradient w.r.t. the padded image."""
    if cfg.padding == "reflect":
        r = cfg.window_size // 2
        shape = g.shape[:2] + tuple(size)
        return torch.ops.aten.reflection_pad2d_backward(g, g.new_empty(shape), [r, r, r, r])
    return g


def _batched(t: Optional[Tensor]) -> bool:
    """Whether ``t`` is a vmap-batched tensor (legacy or functorch): no plain memory to hand to C."""
    return t is not None and (
        torch._C._are_functorch_transforms_active() or "Batched" in str(torch._C._dispatch_keys(t))
    )


def _torch_ops(*grads) -> bool:
    """Whether a backward must run in differentiable torch ops (create_graph, batched upstreams)."""
    return torch.is_grad_enabled() or any(_batched(g) for g in grads)


def _torch_ops_grads(x, y, w, pad, c1, c2, g_s, g_c, need_x, need_y):
    """The same gradients through the torch-ops adjoint (differentiable, vmappable). ``g_s`` /
    ``g_c`` are ``[B, C]`` upstreams of the means, or None."""
    k = w.shape[0]
    n = (x.shape[-2] + 2 * pad - k + 1) * (x.shape[-1] + 2 * pad - k + 1)
    g_s = None if g_s is None else (g_s / n)[..., None, None]
    g_c = None if g_c is None else (g_c / n)[..., None, None]
    return torch_fused.ssim_backward(x, y, w, "same" if pad else "valid", c1, c2, g_s, g_c, need_x, need_y)


def _tracing(*tensors: Tensor) -> bool:
    """Whether this call is being traced (torch.compile, or its fake / functional tensors): then the
    kernel runs as a custom op, an opaque node in the graph; eagerly it is called directly."""
    return torch.compiler.is_compiling() or any(type(t) not in (torch.Tensor, torch.nn.Parameter) for t in tensors)


def _function(name: str, forward, setup_context, backward):
    """The eager twin of a custom op: an autograd.Function with the same forward and formulas
    (calling a custom op eagerly goes through torch's dispatcher and compile machinery)."""
    methods = {
        "forward": staticmethod(forward),
        "setup_context": staticmethod(setup_context),
        "backward": staticmethod(backward),
    }
    return type(name, (torch.autograd.Function,), methods)


def _fused_function(name: str, fused, setup_context, backward, saved: int = 3):
    """The eager twin of a custom op that computes its gradient *in the forward pass*, for the
    upstream ``ctx.expect`` (a mean loss's: :func:`_expected`), when an input needs one:
    ``fused(ctx, *inputs)`` returns the output and leaves on ``ctx.unit`` what ``backward`` hands
    on, or scales by one factor per plane or image (:func:`_rescaled`).
    ``setup_context`` (called with no output) saves the first ``saved`` inputs, the tensors.

    Why: the gradient needs the same filtered statistics as the value; a forward that only reduces
    them and a backward that recomputes them pay for the statistics twice. The unit gradient is the
    size of the gradient the backward would allocate anyway, and the backward scales it in place
    and hands it on, so the peak memory stays that of a backward that allocates its gradient. A
    second backward through the same graph (``retain_graph=True``) finds it consumed and runs the
    fused pass again, so every backward gives the same bits."""

    def forward(ctx, *inputs):
        setup_context(ctx, inputs, None)
        ctx.fused, ctx.fused_args = fused, inputs[saved:]  # inputs[:saved] are saved: x, y, (m,) w
        ctx.fused_saved = saved
        return fused(ctx, *inputs)

    methods = {"forward": staticmethod(forward), "backward": staticmethod(backward)}
    return type(name, (torch.autograd.Function,), methods)


def _take_unit(ctx, usable: bool):
    """The forward's unit gradients when this backward can use them (``usable``), once; computed
    again by the same pass for a second backward. None where the forward was not fused or the
    gradients are not usable (they are dropped either way: the memory goes back now)."""
    unit = getattr(ctx, "unit", None)
    ctx.unit = None
    if not usable:
        return None
    if unit is None and getattr(ctx, "fused", None) is not None:
        tensors = ctx.saved_tensors[: ctx.fused_saved]
        with torch.no_grad():
            ctx.fused(ctx, *tensors, *ctx.fused_args)
        unit, ctx.unit = ctx.unit, None
    return unit


def _scaled(unit, k: Tensor):
    """``unit`` gradients scaled in place by ``k`` (broadcasting per plane or per image), or handed
    on untouched where every factor is 1 in their dtype (``g * 1`` is ``g`` bit for bit): the
    upstream of a mean loss over one image, 3DGS's case."""
    dtype = next(g.dtype for g in unit if g is not None)
    k = k.to(dtype)
    if bool((k == 1).all()):
        return tuple(unit)
    return tuple(None if g is None else g.mul_(k) for g in unit)


def _expected(x: Tensor, numerator: float, *divisors: int) -> float:
    """The upstream a mean loss hands an op's per-image (or per-plane) outputs, in ``x``'s dtype
    (:func:`~splatloss.backends.base.stepwise_quotient`). A fused pass computes its gradient for
    it, and the backward hands that gradient on untouched when it comes (:func:`_rescaled`)."""
    return stepwise_quotient(x.dtype, numerator, *divisors)


def _rescaled(unit, u: Tensor, expect: float):
    """The fused pass's gradients, computed for the upstream ``expect``, for the upstream ``u`` (per
    plane or per image, broadcasting): scaled in place by ``u / expect`` (handed on where that is 1); where
    ``u / expect`` overflows and ``u`` does not, by ``1 / expect`` and then by ``u``."""
    dtype = next(g.dtype for g in unit if g is not None)
    u = u.to(dtype)
    k = u / expect
    if bool((torch.isinf(k) & torch.isfinite(u)).any()):
        return _scaled(_scaled(unit, torch.full_like(u, 1 / expect)), u)
    return _scaled(unit, k)


def _wants_fused(x: Tensor, y: Tensor) -> bool:
    """Whether an eager call will need gradients (then the forward computes them)."""
    return torch.is_grad_enabled() and (x.requires_grad or y.requires_grad)


def _none_if_empty(t: Tensor) -> Optional[Tensor]:
    return None if t.numel() == 0 and t.dim() == 1 else t


def _grad_or_empty(g: Optional[Tensor], like: Tensor) -> Tensor:
    return g if g is not None else like.new_empty(0)


def _zeros_bc(g: Optional[Tensor], x: Tensor) -> Tensor:
    return torch.zeros(x.shape[:2], dtype=x.dtype) if g is None else g.to(x.dtype).contiguous()


# ----------------------------------------------------------------------------------------------
# The kernel's backward: gradient of sum(g_s * mean ssim + g_c * mean cs + g_l1 * mean|x - y|)
# ----------------------------------------------------------------------------------------------


def _backward_impl(g_s, g_c, g_l1, x, y, w, c1, c2, pad, need_x, need_y):
    lib = library.require(x.dtype, w.numel())
    gx, gy = library.backward(lib, x, y, w, c1, c2, g_s, g_c, need_x, need_y, pad, g_l1)
    return _grad_or_empty(gx, x), _grad_or_empty(gy, y)


@torch.library.custom_op("splatloss::cpu_ssim_backward", mutates_args=())
def _backward_op(
    g_s: Tensor,
    g_c: Tensor,
    g_l1: Tensor,
    x: Tensor,
    y: Tensor,
    w: Tensor,
    c1: float,
    c2: float,
    pad: int,
    need_x: bool,
    need_y: bool,
) -> Tuple[Tensor, Tensor]:
    return _backward_impl(g_s, g_c, g_l1, x, y, w, c1, c2, pad, need_x, need_y)


@_backward_op.register_fake
def _(g_s, g_c, g_l1, x, y, w, c1, c2, pad, need_x, need_y):
    return (x.new_empty(x.shape) if need_x else x.new_empty(0)), (y.new_empty(y.shape) if need_y else y.new_empty(0))


def _kernel_grads(x, y, w, c1, c2, pad, g_s, g_c, g_l1, need_x, need_y):
    zeros = torch.zeros(x.shape[:2], dtype=x.dtype)
    gx, gy = (_backward_op if _tracing(x) else _backward_impl)(
        _zeros_bc(g_s, x),
        _zeros_bc(g_c, x),
        zeros if g_l1 is None else g_l1.to(x.dtype).contiguous(),
        x,
        y,
        w,
        c1,
        c2,
        pad,
        need_x,
        need_y,
    )
    return _none_if_empty(gx), _none_if_empty(gy)


# ----------------------------------------------------------------------------------------------
# SSIM and cs means
# ----------------------------------------------------------------------------------------------


def _stats_impl(x, y, w, c1, c2, pad):
    x, y = x.contiguous(), y.contiguous()
    s, c = library.forward(library.require(x.dtype, w.numel()), x, y, w, c1, c2, pad)
    return s.clone(), c.clone()  # [B, C] each; may be views of one buffer, a custom op's outputs must not


@torch.library.custom_op("splatloss::cpu_ssim_stats", mutates_args=())
def _stats_op(x: Tensor, y: Tensor, w: Tensor, c1: float, c2: float, pad: int) -> Tuple[Tensor, Tensor]:
    return _stats_impl(x, y, w, c1, c2, pad)


@_stats_op.register_fake
def _(x, y, w, c1, c2, pad):
    return x.new_empty(x.shape[:2]), x.new_empty(x.shape[:2])


def _stats_setup(ctx, inputs, output):
    x, y, w, c1, c2, pad = inputs
    ctx.c1, ctx.c2, ctx.pad = c1, c2, pad
    ctx.save_for_backward(x, y, w)


def _stats_backward(ctx, g_s, g_c):
    need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    # the forward's unit gradient is that of the SSIM mean: usable when cs has no upstream
    # (a traced backward takes the recomputing path: no data-dependent branch on g_c in a graph)
    usable = (need_x or need_y) and g_s is not None and not _torch_ops(g_s) and not _tracing(g_s)
    usable = usable and (g_c is None or not bool(g_c.any()))
    unit = _take_unit(ctx, usable)
    x, y, w = ctx.saved_tensors
    none = (None,) * 4
    if (g_s is None and g_c is None) or not (need_x or need_y):
        return (None, None) + none
    if unit is not None:
        return _rescaled(unit, g_s[..., None, None], ctx.expect) + none  # the forward's, rescaled
    if _torch_ops(g_s, g_c):
        return _torch_ops_grads(x, y, w, ctx.pad, ctx.c1, ctx.c2, g_s, g_c, need_x, need_y) + none
    x, y = x.contiguous(), y.contiguous()
    return _kernel_grads(x, y, w, ctx.c1, ctx.c2, ctx.pad, g_s, g_c, None, need_x, need_y) + none


_stats_op.register_autograd(_stats_backward, setup_context=_stats_setup)
_StatsFn = _function("_StatsFn", _stats_impl, _stats_setup, _stats_backward)


def _stats_fused(ctx, x, y, w, c1, c2, pad):
    need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    x, y = x.contiguous(), y.contiguous()
    ctx.expect = _expected(x, -1.0, *x.shape[:2])  # the D-SSIM loss's, 1 - ssim(x, y)
    gs = torch.full(x.shape[:2], ctx.expect, dtype=x.dtype)
    lib = library.require(x.dtype, w.numel())
    gx, gy, s, c = library.backward(lib, x, y, w, c1, c2, gs, gs * 0, need_x, need_y, pad, with_forward=True)
    ctx.unit = (gx, gy)  # expect * d mean-SSIM / d x and / d y, plane by plane
    return s, c


_StatsFusedFn = _fused_function("_StatsFusedFn", _stats_fused, _stats_setup, _stats_backward)


def ssim_stats(img1: Tensor, img2: Tensor, cfg: SSIMConfig) -> Tuple[Tensor, Tensor]:
    """``(ssim_mean, cs_mean)`` [B, C] through the kernel."""
    x, y, pad = padded(img1, img2, cfg)
    w = cfg.window_1d(x.dtype, "cpu")
    args = (x, y, w, cfg.C1, cfg.C2, pad)
    if _tracing(x, y):
        return _stats_op(*args)
    return (_StatsFusedFn if _wants_fused(x, y) else _StatsFn).apply(*args)


# ----------------------------------------------------------------------------------------------
# L1 + D-SSIM in one pass
# ----------------------------------------------------------------------------------------------


def _combined(lam: float, l1: Tensor, d: Tensor) -> Tuple[Tensor, Tensor]:
    """The loss ``(1 - lam) L1 + lam D`` per image ``[B]`` and its two terms ``[B, 2]`` (L1, D-SSIM),
    which a loss logs as they are (a term recovered from the total loses the digits its small
    weight scaled away)."""
    return (1 - lam) * l1 + lam * d, torch.stack((l1, d), dim=1)


def _dssim_l1_impl(x, y, w, c1, c2, pad, lam):
    x, y = x.contiguous(), y.contiguous()
    s, _, l1 = library.forward(library.require(x.dtype, w.numel()), x, y, w, c1, c2, pad, l1=True)  # [B, C] each
    return _combined(lam, l1.mean(dim=1), 1 - s.mean(dim=1))


@torch.library.custom_op("splatloss::cpu_dssim_l1", mutates_args=())
def _dssim_l1_op(x: Tensor, y: Tensor, w: Tensor, c1: float, c2: float, pad: int, lam: float) -> Tuple[Tensor, Tensor]:
    return _dssim_l1_impl(x, y, w, c1, c2, pad, lam)


@_dssim_l1_op.register_fake
def _(x, y, w, c1, c2, pad, lam):
    return x.new_empty(x.shape[:1]), x.new_empty((x.shape[0], 2))


def _dssim_l1_setup(ctx, inputs, output):
    x, y, w, c1, c2, pad, lam = inputs
    ctx.c1, ctx.c2, ctx.pad, ctx.lam = c1, c2, pad, lam
    ctx.save_for_backward(x, y, w)


def _dssim_l1_backward(ctx, g, _g_terms=None):
    need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    unit = _take_unit(ctx, g is not None and (need_x or need_y) and not _torch_ops(g))
    x, y, w = ctx.saved_tensors
    none = (None,) * 5
    if g is None or not (need_x or need_y):
        return (None, None) + none
    if unit is not None:
        return _rescaled(unit, g[:, None, None, None], ctx.expect) + none  # the forward's, rescaled per image
    C = x.shape[1]
    g_s = (-ctx.lam / C) * g[:, None].expand(-1, C)  # d loss / d mean-SSIM of each plane
    g_l1 = ((1 - ctx.lam) / C) * g[:, None].expand(-1, C)  # d loss / d mean|x - y| of each plane
    if _torch_ops(g):
        gx, gy = _torch_ops_grads(x, y, w, ctx.pad, ctx.c1, ctx.c2, g_s, None, need_x, need_y)
        sg = torch.sign(x - y) * (g_l1 / (x.shape[-2] * x.shape[-1]))[..., None, None]
        return (None if gx is None else gx + sg, None if gy is None else gy - sg) + none
    x, y = x.contiguous(), y.contiguous()
    return _kernel_grads(x, y, w, ctx.c1, ctx.c2, ctx.pad, g_s, None, g_l1, need_x, need_y) + none


_dssim_l1_op.register_autograd(_dssim_l1_backward, setup_context=_dssim_l1_setup)
_DSSIML1Fn = _function("_DSSIML1Fn", _dssim_l1_impl, _dssim_l1_setup, _dssim_l1_backward)


def _dssim_l1_fused(ctx, x, y, w, c1, c2, pad, lam):
    need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    x, y = x.contiguous(), y.contiguous()
    C = x.shape[1]
    lib = library.require(x.dtype, w.numel())
    ctx.expect = _expected(x, 1.0, x.shape[0])  # loss.mean()'s
    g = torch.full(x.shape[:1], ctx.expect, dtype=x.dtype)
    g_s = ((-lam / C) * g[:, None].expand(-1, C)).contiguous()  # d loss / d mean-SSIM of each plane
    g_l1 = (((1 - lam) / C) * g[:, None].expand(-1, C)).contiguous()  # d loss / d mean|x - y| of each plane
    gx, gy, s, _, l1 = library.backward(
        lib, x, y, w, c1, c2, g_s, g_s * 0, need_x, need_y, pad, g_l1, with_forward=True, l1=True
    )  # the L1 sums too, as the gradient rows pass
    ctx.unit = (gx, gy)
    return _combined(lam, l1.mean(dim=1), 1 - s.mean(dim=1))


_DSSIML1FusedFn = _fused_function("_DSSIML1FusedFn", _dssim_l1_fused, _dssim_l1_setup, _dssim_l1_backward)


def dssim_l1(img1: Tensor, img2: Tensor, cfg: SSIMConfig, lam: float) -> Tuple[Tensor, Tensor]:
    """Per image ``(1 - lam) * mean|x - y| + lam * (1 - mean SSIM)`` ``[B]``, and its two terms
    ``[B, 2]`` (L1, D-SSIM; no gradient flows through them). "valid" and "same" run fused; "reflect"
    adds a torch L1 to the kernel's SSIM (its padded copy must not enter the L1)."""
    if cfg.padding == "reflect":  # one cast first: the two terms' gradients add up in float32
        img1, img2 = to_accumulation_dtype(img1), to_accumulation_dtype(img2)
        l1 = (img1 - img2).abs().mean(dim=(1, 2, 3))
        s, _ = ssim_stats(img1, img2, cfg)
        loss, terms = _combined(lam, l1, 1 - s.mean(dim=1))
        return loss, terms.detach()
    x, y, pad = padded(img1, img2, cfg)
    w = cfg.window_1d(x.dtype, "cpu")
    args = (x, y, w, cfg.C1, cfg.C2, pad, float(lam))
    if _tracing(x, y):
        loss, terms = _dssim_l1_op(*args)
    else:
        loss, terms = (_DSSIML1FusedFn if _wants_fused(x, y) else _DSSIML1Fn).apply(*args)
    return loss, terms.detach()


def ssim_mean_and_grad(img1: Tensor, img2: Tensor, cfg: SSIMConfig, upstream: Tensor):
    """``(ssim_mean [B, C], d sum(upstream * ssim_mean) / d img1)`` without a graph (accumulation
    dtype), one kernel pass."""
    with torch.no_grad():
        x, y, pad = padded(img1.detach(), img2.detach(), cfg)
        x, y = x.contiguous(), y.contiguous()
        lib = library.require(x.dtype, cfg.window_size)
        w = cfg.window_1d(x.dtype, "cpu")
        up = upstream.to(x.dtype)
        gx, _, s, _ = library.backward(
            lib, x, y, w, cfg.C1, cfg.C2, up, torch.zeros_like(up), True, False, pad, with_forward=True
        )
    return s, unpad_grad(gx, cfg, img1.shape[-2:])


# ----------------------------------------------------------------------------------------------
# MS-SSIM: the pyramid step in the kernel library too (torch's CPU avg_pool2d forward+backward
# cost about as much as the SSIM of the finer scale it feeds)
# ----------------------------------------------------------------------------------------------


def _down2_adjoint_torch(g: Tensor, size) -> Tensor:
    """Adjoint of the pyramid step in torch ops (differentiable in ``g``, vmap-friendly)."""
    h, w = size
    up = g.repeat_interleave(2, dim=-2).repeat_interleave(2, dim=-1) * 0.25  # [.., 2*ceil(h/2), 2*ceil(w/2)]
    if h % 2:
        up = torch.cat([up[..., : h - 1, :], up[..., h - 1 : h, :] + up[..., h:, :]], dim=-2)
    if w % 2:
        up = torch.cat([up[..., : w - 1], up[..., w - 1 : w] + up[..., w:]], dim=-1)
    return up


def _down2_impl(x):
    return library.down2(library.require(x.dtype, FIXED_TAPS), x.contiguous())


def _down2_bwd_impl(g, x):
    return library.down2_backward(library.require(g.dtype, FIXED_TAPS), g, x.shape[-2:])


@torch.library.custom_op("splatloss::cpu_downsample2x", mutates_args=())
def _down2_op(x: Tensor) -> Tensor:
    return _down2_impl(x)


@_down2_op.register_fake
def _(x):
    B, C, H, W = x.shape
    return x.new_empty((B, C, (H + 1) // 2, (W + 1) // 2))


@torch.library.custom_op("splatloss::cpu_downsample2x_backward", mutates_args=())
def _down2_bwd_op(g: Tensor, x: Tensor) -> Tensor:
    return _down2_bwd_impl(g, x)


@_down2_bwd_op.register_fake
def _(g, x):
    return g.new_empty(x.shape)


def _down2_setup(ctx, inputs, output):
    (x,) = inputs
    ctx.size = tuple(x.shape[-2:])
    ctx.save_for_backward(x)  # its shape only; it is alive anyway (the finer scale's input)


def _down2_backward(ctx, g):
    if _torch_ops(g):
        return _down2_adjoint_torch(g, ctx.size)
    (x,) = ctx.saved_tensors
    return _down2_bwd_op(g, x) if _tracing(g, x) else _down2_bwd_impl(g, x)


_down2_op.register_autograd(_down2_backward, setup_context=_down2_setup)
_Down2Fn = _function("_Down2Fn", _down2_impl, _down2_setup, _down2_backward)


def down2(x: Tensor) -> Tensor:
    """The pyramid step (:func:`splatloss.multiscale.downsample2x`) through the kernel, differentiable."""
    return _down2_op(x) if _tracing(x) else _Down2Fn.apply(x)


def _pyramid(lib, x: Tensor, scales: int):
    out = [x]
    for _ in range(scales - 1):
        out.append(library.down2(lib, out[-1]))
    return out


def _scale_walk(term, x: Tensor, y: Tensor, scales: int) -> Tensor:
    """:func:`splatloss.multiscale.scale_terms` where each scale's kernel pass also writes the next
    scale (its images read once): ``term(last, a, b)`` returns the scale's term and, but at the
    coarsest scale, the next scale's ``(a, b)``."""
    terms = []
    for j in range(scales):
        t, nxt = term(j == scales - 1, x, y)
        terms.append(t)
        if nxt is not None:
            x, y = nxt
    return torch.stack(terms, dim=-1)


def _ms_terms_impl(x, y, w, c1, c2, pad, scales):
    x, y = x.contiguous(), y.contiguous()
    lib = library.require(x.dtype, w.numel())

    def term(last: bool, a: Tensor, b: Tensor):
        out = library.forward(lib, a, b, w, c1, c2, pad, down=not last)
        return (out[0], None) if last else (out[1], out[2:])

    return _scale_walk(term, x, y, scales)


@torch.library.custom_op("splatloss::cpu_ms_terms", mutates_args=())
def _ms_terms_op(x: Tensor, y: Tensor, w: Tensor, c1: float, c2: float, pad: int, scales: int) -> Tensor:
    return _ms_terms_impl(x, y, w, c1, c2, pad, scales)


@_ms_terms_op.register_fake
def _(x, y, w, c1, c2, pad, scales):
    return x.new_empty(tuple(x.shape[:2]) + (scales,))


def _ms_terms_bwd_impl(
    g: Tensor,
    x: Tensor,
    y: Tensor,
    w: Tensor,
    c1: float,
    c2: float,
    pad: int,
    scales: int,
    need_x: bool,
    need_y: bool,
) -> Tuple[Tensor, Tensor]:
    """Walks the scales coarse to fine, adding each scale's kernel gradient to the adjoint of the
    pyramid step from the coarser one in place (the pyramids are recomputed: a third of an image)."""
    x, y = x.contiguous(), y.contiguous()
    lib = library.require(x.dtype, w.numel())
    xs, ys = _pyramid(lib, x, scales), _pyramid(lib, y, scales)
    zeros = torch.zeros(x.shape[:2], dtype=x.dtype)
    g = g.to(x.dtype)
    gx = gy = None
    for j in range(scales - 1, -1, -1):
        g_s = g[..., j].contiguous() if j == scales - 1 else zeros
        g_c = g[..., j].contiguous() if j < scales - 1 else zeros
        gxj, gyj = library.backward(lib, xs[j], ys[j], w, c1, c2, g_s, g_c, need_x, need_y, pad)
        size = xs[j].shape[-2:]
        if gxj is not None and gx is not None:
            library.down2_backward(lib, gx, size, acc=gxj)
        if gyj is not None and gy is not None:
            library.down2_backward(lib, gy, size, acc=gyj)
        gx, gy = gxj, gyj
    return _grad_or_empty(gx, x), _grad_or_empty(gy, y)


@torch.library.custom_op("splatloss::cpu_ms_terms_backward", mutates_args=())
def _ms_terms_bwd_op(
    g: Tensor,
    x: Tensor,
    y: Tensor,
    w: Tensor,
    c1: float,
    c2: float,
    pad: int,
    scales: int,
    need_x: bool,
    need_y: bool,
) -> Tuple[Tensor, Tensor]:
    return _ms_terms_bwd_impl(g, x, y, w, c1, c2, pad, scales, need_x, need_y)


@_ms_terms_bwd_op.register_fake
def _(g, x, y, w, c1, c2, pad, scales, need_x, need_y):
    return (x.new_empty(x.shape) if need_x else x.new_empty(0)), (y.new_empty(y.shape) if need_y else y.new_empty(0))


def _ms_terms_setup(ctx, inputs, output):
    x, y, w, c1, c2, pad, scales = inputs
    ctx.c1, ctx.c2, ctx.pad, ctx.scales = c1, c2, pad, scales
    ctx.save_for_backward(x, y, w)


def _torch_ops_scale_walk(images, scales: int, g: Tensor, grads):
    """MS-SSIM's gradients in differentiable torch ops (create_graph, batched upstreams): the pyramid
    of ``images`` (the two images, and a mask that follows them), then coarse to fine each scale's
    ``grads(level, g_s, g_c)`` for its term's upstream ``g[..., j]`` (the SSIM mean's at the coarsest
    scale, the cs mean's elsewhere) plus the pyramid step's adjoint of the coarser scale's."""
    levels = [tuple(images)]
    for _ in range(scales - 1):
        levels.append(tuple(multiscale.downsample2x(t) for t in levels[-1]))
    gx = gy = None
    for j in range(scales - 1, -1, -1):
        g_s = g[..., j] if j == scales - 1 else None
        g_c = g[..., j] if j < scales - 1 else None
        gxj, gyj = grads(levels[j], g_s, g_c)
        size = levels[j][0].shape[-2:]
        if gx is not None:
            gxj = gxj + _down2_adjoint_torch(gx, size)
        if gy is not None:
            gyj = gyj + _down2_adjoint_torch(gy, size)
        gx, gy = gxj, gyj
    return gx, gy


def _ms_terms_backward(ctx, g):
    need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    unit = _take_unit(ctx, g is not None and (need_x or need_y) and not _torch_ops(g))
    x, y, w = ctx.saved_tensors
    none = (None,) * 5
    if g is None or not (need_x or need_y):
        return (None, None) + none
    M = ctx.scales
    if unit is not None:
        return _ms_unit_walk(unit, g, x.dtype) + none
    if not _torch_ops(g):
        bwd = _ms_terms_bwd_op if _tracing(g, x) else _ms_terms_bwd_impl
        gx, gy = bwd(g, x, y, w, ctx.c1, ctx.c2, ctx.pad, M, need_x, need_y)
        return (_none_if_empty(gx), _none_if_empty(gy)) + none

    # create_graph / batched upstreams: the same walk in differentiable torch ops
    def grads(level, g_s, g_c):
        return _torch_ops_grads(*level, w, ctx.pad, ctx.c1, ctx.c2, g_s, g_c, need_x, need_y)

    return _torch_ops_scale_walk((x, y), M, g, grads) + none


_ms_terms_op.register_autograd(_ms_terms_backward, setup_context=_ms_terms_setup)
_MSTermsFn = _function("_MSTermsFn", _ms_terms_impl, _ms_terms_setup, _ms_terms_backward)


def _ms_terms_fused(ctx, x, y, w, c1, c2, pad, scales):
    """The terms, and per scale the unit gradient of its term (cs mean, or the SSIM mean at the
    coarsest scale) w.r.t. that scale's images, from one kernel pass per scale."""
    need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    x, y = x.contiguous(), y.contiguous()
    lib = library.require(x.dtype, w.numel())
    ones = torch.ones(x.shape[:2], dtype=x.dtype)
    unit = []

    def term(last: bool, a: Tensor, b: Tensor):
        gs, gc = (ones, ones * 0) if last else (ones * 0, ones)
        out = library.backward(lib, a, b, w, c1, c2, gs, gc, need_x, need_y, pad, with_forward=True, down=not last)
        unit.append(out[:2])
        return (out[2], None) if last else (out[3], out[4:])

    terms = _scale_walk(term, x, y, scales)
    ctx.unit = (lib, unit)
    return terms


def _ms_unit_walk(unit, g: Tensor, dtype: torch.dtype):
    """Gradients from the forward's per-scale unit gradients: coarse to fine, scale j's scaled in
    place by its upstream ``g[..., j]``, plus the pyramid step's adjoint of the coarser sum."""
    lib, per_scale = unit
    g = g.to(dtype)
    gx = gy = None
    for j in range(len(per_scale) - 1, -1, -1):
        gj = g[..., j]
        if gx is None and gy is None:  # the coarsest scale: nothing to add
            gxj, gyj = _scaled(per_scale[j], gj[..., None, None])
        else:  # scale and add the coarser scale's share in one pass
            gxj, gyj = per_scale[j]
            size = (gxj if gxj is not None else gyj).shape[-2:]
            for acc, coarse in ((gxj, gx), (gyj, gy)):
                if acc is not None:
                    library.down2_backward(lib, coarse, size, acc=acc, scale=gj)
        gx, gy = gxj, gyj
        per_scale[j] = None  # the finer scales' sums are done with it
    return gx, gy


_MSTermsFusedFn = _fused_function("_MSTermsFusedFn", _ms_terms_fused, _ms_terms_setup, _ms_terms_backward)


def ms_terms(img1: Tensor, img2: Tensor, cfg: SSIMConfig, scales: int) -> Tensor:
    """MS-SSIM terms ``[B, C, M]`` (:func:`splatloss.multiscale.ms_terms`) through the kernel, the
    pyramid included: one op for every scale with "valid" and "same" padding; "reflect" (an
    ``F.pad`` copy per scale) chains the pyramid-step and statistics ops."""
    if cfg.padding != "reflect":  # zeros or none: the kernel pads implicitly, one node for all
        x, y, pad = padded(img1, img2, cfg)
        w = cfg.window_1d(x.dtype, "cpu")
        args = (x, y, w, cfg.C1, cfg.C2, pad, scales)
        if _tracing(x, y):
            return _ms_terms_op(*args)
        return (_MSTermsFusedFn if _wants_fused(x, y) else _MSTermsFn).apply(*args)
    return multiscale.ms_terms(lambda a, b: ssim_stats(a, b, cfg), (img1, img2), scales, down=down2)


# ----------------------------------------------------------------------------------------------
# Masked SSIM and cs means, and the masked L1 + D-SSIM (semantics in splatloss.backends.masked).
# The kernel returns per-plane sums (sum c ssim, sum c cs, sum c with c the centre weights; sum
# m |x - y| and sum m for the L1); the normalisation, the empty-channel rule and the upstreams'
# division by those sums happen here, in float64 sums cast to the accumulation dtype.
# ----------------------------------------------------------------------------------------------


def masked_padded(x: Tensor, y: Tensor, m: Tensor, cfg: SSIMConfig):
    """:func:`padded` for a masked call: ``(x, y, m, pad)`` with the mask in the images' dtype,
    ``(B|1, C|1, H, W)``, contiguous. "same" costs no copy (the kernel reads zeros around the images
    and ones around the mask); "reflect" mirrors the mask too (a copy of a mask-sized array)."""
    x, y, pad = padded(x, y, cfg)
    m = m.detach().to(x.dtype)
    if m.dim() == 2:
        m = m[None, None]
    if cfg.padding == "reflect":
        r = cfg.window_size // 2
        m = F.pad(m, (r, r, r, r), mode="reflect")
    return x, y, m.contiguous(), pad


def _safe_inv(z: Tensor) -> Tensor:
    """``1 / z`` where ``z > 0``, else 0 (an empty channel or image gets no gradient)."""
    return torch.where(z > 0, 1 / torch.where(z > 0, z, torch.ones_like(z)), torch.zeros_like(z))


def _masked_means(ss: Tensor, cc: Tensor, z: Tensor, dtype: torch.dtype):
    """Weighted means ``[B, C]`` from the kernel's float64 sums; 1 for an empty channel."""
    nonempty = z > 0
    zz = torch.where(nonempty, z, torch.ones_like(z))
    s = torch.where(nonempty, ss / zz, torch.ones_like(ss)).to(dtype)
    c = torch.where(nonempty, cc / zz, torch.ones_like(cc)).to(dtype)
    return s, c


def _masked_torch_ops_grads(x, y, m, w, pad, c1, c2, g_s, g_c, need_x, need_y):
    """The masked gradients through the torch-ops adjoint of :mod:`..masked` (differentiable,
    vmappable): the kernel's inputs are a "same" problem when ``pad`` else a "valid" one ("reflect"
    arrives mirrored already)."""
    return masked.masked_stats_backward(
        x, y, m.expand(x.shape), w, "same" if pad else "valid", c1, c2, g_s, g_c, need_x, need_y
    )


def _masked_backward_impl(g_s, g_c, g_l1, x, y, m, w, c1, c2, pad, need_x, need_y):
    lib = library.require(x.dtype, w.numel())
    gx, gy = library.masked_backward(lib, x, y, m, w, c1, c2, g_s, g_c, need_x, need_y, pad, g_l1)
    return _grad_or_empty(gx, x), _grad_or_empty(gy, y)


@torch.library.custom_op("splatloss::cpu_masked_ssim_backward", mutates_args=())
def _masked_backward_op(
    g_s: Tensor,
    g_c: Tensor,
    g_l1: Tensor,
    x: Tensor,
    y: Tensor,
    m: Tensor,
    w: Tensor,
    c1: float,
    c2: float,
    pad: int,
    need_x: bool,
    need_y: bool,
) -> Tuple[Tensor, Tensor]:
    return _masked_backward_impl(g_s, g_c, g_l1, x, y, m, w, c1, c2, pad, need_x, need_y)


@_masked_backward_op.register_fake
def _(g_s, g_c, g_l1, x, y, m, w, c1, c2, pad, need_x, need_y):
    return (x.new_empty(x.shape) if need_x else x.new_empty(0)), (y.new_empty(y.shape) if need_y else y.new_empty(0))


def _masked_kernel_grads(x, y, m, w, c1, c2, pad, g_s, g_c, g_l1, need_x, need_y):
    """Kernel gradients for per-plane coefficients of the *sums* (``g_s`` of sum c ssim, ...)."""
    zeros = torch.zeros(x.shape[:2], dtype=x.dtype)
    gx, gy = (_masked_backward_op if _tracing(x) else _masked_backward_impl)(
        zeros if g_s is None else g_s.to(x.dtype).contiguous(),
        zeros if g_c is None else g_c.to(x.dtype).contiguous(),
        zeros if g_l1 is None else g_l1.to(x.dtype).contiguous(),
        x,
        y,
        m,
        w,
        c1,
        c2,
        pad,
        need_x,
        need_y,
    )
    return _none_if_empty(gx), _none_if_empty(gy)


def _mstats_impl(x, y, m, w, c1, c2, pad):
    x, y, m = x.contiguous(), y.contiguous(), m.contiguous()
    ss, cc, z = library.masked_forward(library.require(x.dtype, w.numel()), x, y, m, w, c1, c2, pad)
    s, c = _masked_means(ss, cc, z, x.dtype)
    return s, c, z.to(x.dtype)  # z: the centre weights' sums, for the backward


@torch.library.custom_op("splatloss::cpu_masked_ssim_stats", mutates_args=())
def _mstats_op(
    x: Tensor, y: Tensor, m: Tensor, w: Tensor, c1: float, c2: float, pad: int
) -> Tuple[Tensor, Tensor, Tensor]:
    return _mstats_impl(x, y, m, w, c1, c2, pad)


@_mstats_op.register_fake
def _(x, y, m, w, c1, c2, pad):
    return x.new_empty(x.shape[:2]), x.new_empty(x.shape[:2]), x.new_empty(x.shape[:2])


def _mstats_setup(ctx, inputs, output):
    x, y, m, w, c1, c2, pad = inputs
    ctx.c1, ctx.c2, ctx.pad = c1, c2, pad
    if output is None:  # the fused pass: it leaves z on ctx.weights
        ctx.save_for_backward(x, y, m, w)
    else:
        ctx.save_for_backward(x, y, m, w, output[2])


def _mstats_backward(ctx, g_s, g_c, _g_z):
    need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    # the fused forward's unit gradient is that of the SSIM mean: usable when cs has no upstream
    usable = (need_x or need_y) and g_s is not None and not _torch_ops(g_s) and not _tracing(g_s)
    usable = usable and (g_c is None or not bool(g_c.any()))
    unit = _take_unit(ctx, usable)
    saved = ctx.saved_tensors
    x, y, m, w = saved[:4]
    z = saved[4] if len(saved) > 4 else ctx.weights
    none = (None,) * 5
    if (g_s is None and g_c is None) or not (need_x or need_y):
        return (None, None) + none
    if unit is not None:
        return _rescaled(unit, g_s[..., None, None], ctx.expect) + none  # the forward's, rescaled
    if _torch_ops(g_s, g_c):
        return _masked_torch_ops_grads(x, y, m, w, ctx.pad, ctx.c1, ctx.c2, g_s, g_c, need_x, need_y) + none
    inv = _safe_inv(z)
    g_s = None if g_s is None else g_s * inv
    g_c = None if g_c is None else g_c * inv
    x, y = x.contiguous(), y.contiguous()
    return _masked_kernel_grads(x, y, m, w, ctx.c1, ctx.c2, ctx.pad, g_s, g_c, None, need_x, need_y) + none


_mstats_op.register_autograd(_mstats_backward, setup_context=_mstats_setup)
_MStatsFn = _function("_MStatsFn", _mstats_impl, _mstats_setup, _mstats_backward)


def _mstats_fused(ctx, x, y, m, w, c1, c2, pad):
    """The masked means and the SSIM mean's gradient per plane in one sweep: its coefficient divides
    by the centre weights' sum, which the mask alone gives (read before the sweep, the forward's
    numbers), so it is the backward's for the D-SSIM loss's upstream on the SSIM mean."""
    need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    x, y, m = x.contiguous(), y.contiguous(), m.contiguous()
    B, C = x.shape[:2]
    lib = library.require(x.dtype, w.numel())
    zt = library.masked_weights(lib, m, B, C, w.numel(), pad)[0].to(x.dtype)
    ctx.expect = _expected(x, -1.0, B, C)  # the D-SSIM loss's, 1 - ssim(x, y, mask=m)
    g_s = torch.full((B, C), ctx.expect, dtype=x.dtype) * _safe_inv(zt)  # as _mstats_backward's
    gx, gy, ss, cc, z = library.masked_backward(
        lib, x, y, m, w, c1, c2, g_s, torch.zeros_like(g_s), need_x, need_y, pad, with_forward=True
    )
    ctx.unit = (gx, gy)  # expect * d mean-SSIM / d x and / d y, plane by plane
    ctx.weights = z.to(x.dtype)
    s, c = _masked_means(ss, cc, z, x.dtype)
    return s, c, z.to(x.dtype)


_MStatsFusedFn = _fused_function("_MStatsFusedFn", _mstats_fused, _mstats_setup, _mstats_backward, saved=4)


def masked_ssim_stats(
    img1: Tensor, img2: Tensor, mask: Tensor, cfg: SSIMConfig, fused: bool = False
) -> Tuple[Tensor, Tensor]:
    """Masked ``(ssim_mean, cs_mean)`` [B, C] through the kernel (the mask gets no gradient).
    ``fused``: the caller differentiates the SSIM mean alone (``ssim``, not MS-SSIM's cs terms), so
    an eager call whose input needs a gradient computes it in the forward's sweep."""
    x, y, m, pad = masked_padded(img1, img2, mask, cfg)
    w = cfg.window_1d(x.dtype, "cpu")
    args = (x, y, m, w, cfg.C1, cfg.C2, pad)
    if _tracing(x, y):
        s, c, _ = _mstats_op(*args)
    else:
        s, c, _ = (_MStatsFusedFn if fused and _wants_fused(x, y) else _MStatsFn).apply(*args)
    return s, c


def _mdssim_l1_impl(x, y, m, w, c1, c2, pad, lam):
    x, y, m = x.contiguous(), y.contiguous(), m.contiguous()
    lib = library.require(x.dtype, w.numel())
    ss, _, z, num, den = library.masked_forward(lib, x, y, m, w, c1, c2, pad, l1=True)  # [B, C] float64 each
    s, _ = _masked_means(ss, ss, z, x.dtype)
    num, den = num.sum(dim=1), den.sum(dim=1)  # per image, over channels and pixels
    l1 = (num * _safe_inv(den)).to(x.dtype)
    return (*_combined(lam, l1, 1 - s.mean(dim=1)), z.to(x.dtype), den.to(x.dtype))


@torch.library.custom_op("splatloss::cpu_masked_dssim_l1", mutates_args=())
def _mdssim_l1_op(
    x: Tensor, y: Tensor, m: Tensor, w: Tensor, c1: float, c2: float, pad: int, lam: float
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    return _mdssim_l1_impl(x, y, m, w, c1, c2, pad, lam)


@_mdssim_l1_op.register_fake
def _(x, y, m, w, c1, c2, pad, lam):
    b = x.shape[0]
    return x.new_empty((b,)), x.new_empty((b, 2)), x.new_empty(x.shape[:2]), x.new_empty((b,))


def _mdssim_l1_setup(ctx, inputs, output):
    x, y, m, w, c1, c2, pad, lam = inputs
    ctx.c1, ctx.c2, ctx.pad, ctx.lam = c1, c2, pad, lam
    if output is None:  # the fused pass: it leaves z and den on ctx.weights
        ctx.save_for_backward(x, y, m, w)
    else:
        ctx.save_for_backward(x, y, m, w, output[2], output[3])


def _mdssim_l1_backward(ctx, g, _g_terms, _g_z, _g_den):
    need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    unit = _take_unit(ctx, g is not None and (need_x or need_y) and not _torch_ops(g))
    saved = ctx.saved_tensors
    x, y, m, w = saved[:4]
    z, den = saved[4:] if len(saved) > 4 else ctx.weights
    none = (None,) * 6
    if g is None or not (need_x or need_y):
        return (None, None) + none
    if unit is not None:
        return _rescaled(unit, g[:, None, None, None], ctx.expect) + none  # the forward's, rescaled per image
    C = x.shape[1]
    g_s = (-ctx.lam / C) * g[:, None].expand(-1, C)  # d loss / d masked mean SSIM of each plane
    g_l1 = ((1 - ctx.lam) * g * _safe_inv(den))[:, None].expand(-1, C)  # d loss / d sum m |x - y| of each plane
    if _torch_ops(g):
        gx, gy = _masked_torch_ops_grads(x, y, m, w, ctx.pad, ctx.c1, ctx.c2, g_s, None, need_x, need_y)
        sg = m * torch.sign(x - y) * g_l1[..., None, None]
        return (None if gx is None else gx + sg, None if gy is None else gy - sg) + none
    x, y = x.contiguous(), y.contiguous()
    return (
        _masked_kernel_grads(x, y, m, w, ctx.c1, ctx.c2, ctx.pad, g_s * _safe_inv(z), None, g_l1, need_x, need_y) + none
    )


_mdssim_l1_op.register_autograd(_mdssim_l1_backward, setup_context=_mdssim_l1_setup)
_MDSSIML1Fn = _function("_MDSSIML1Fn", _mdssim_l1_impl, _mdssim_l1_setup, _mdssim_l1_backward)


def _mdssim_l1_fused(ctx, x, y, m, w, c1, c2, pad, lam):
    """The masked loss and its gradient for ``loss.mean()``'s upstream in one sweep. The
    coefficients of the SSIM and L1 sums divide by the centre weights' and the mask's sums, which
    the mask alone gives (read before the sweep, the same numbers the forward computes), so they
    are the backward's for that upstream, computed the same way."""
    need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    x, y, m = x.contiguous(), y.contiguous(), m.contiguous()
    B, C = x.shape[:2]
    lib = library.require(x.dtype, w.numel())
    z, den = library.masked_weights(lib, m, B, C, w.numel(), pad)  # from the mask alone
    zt, den = z.to(x.dtype), den.sum(dim=1)  # den per image, over channels and pixels
    dent = den.to(x.dtype)
    ctx.expect = _expected(x, 1.0, B)  # loss.mean()'s
    g = torch.full((B,), ctx.expect, dtype=x.dtype)
    g_s = ((-lam / C) * g[:, None].expand(-1, C)) * _safe_inv(zt)  # as _mdssim_l1_backward's
    g_l1 = ((1 - lam) * g * _safe_inv(dent))[:, None].expand(-1, C)
    gx, gy, ss, _, z, num, _ = library.masked_backward(
        lib,
        x,
        y,
        m,
        w,
        c1,
        c2,
        g_s.contiguous(),
        torch.zeros_like(g_s),
        need_x,
        need_y,
        pad,
        g_l1.contiguous(),
        with_forward=True,
        l1=True,
    )  # fmt: skip  (the L1 sums too, as the gradient rows pass)
    ctx.unit = (gx, gy)
    ctx.weights = (z.to(x.dtype), dent)
    s, _ = _masked_means(ss, ss, z, x.dtype)
    l1 = (num.sum(dim=1) * _safe_inv(den)).to(x.dtype)
    return (*_combined(lam, l1, 1 - s.mean(dim=1)), z.to(x.dtype), dent)


_MDSSIML1FusedFn = _fused_function("_MDSSIML1FusedFn", _mdssim_l1_fused, _mdssim_l1_setup, _mdssim_l1_backward, saved=4)


def masked_dssim_l1(img1: Tensor, img2: Tensor, mask: Tensor, cfg: SSIMConfig, lam: float) -> Tuple[Tensor, Tensor]:
    """Per image ``(1 - lam) * L1 + lam * (1 - SSIM)`` ``[B]`` under the masked semantics, ``L1 =
    sum m |x - y| / sum m`` over channels and pixels (0 for an empty mask), and its two terms ``[B, 2]``
    (L1, D-SSIM; no gradient flows through them). "valid" and "same" run
    fused: eagerly with an input that needs a gradient, the value and the unit gradient in one sweep
    (:func:`_mdssim_l1_fused`), else one kernel pass each way; "reflect" adds a torch masked L1 to
    the kernel's SSIM (its mirrored copy must not enter the L1)."""
    if cfg.padding == "reflect":  # one cast first: the two terms' gradients add up in float32
        img1, img2 = to_accumulation_dtype(img1), to_accumulation_dtype(img2)
        mf = mask.to(img1.dtype).expand(img1.shape)
        num = (mf * (img1 - img2).abs()).sum(dim=(1, 2, 3))
        l1 = num * _safe_inv(mf.sum(dim=(1, 2, 3)))
        s, _ = masked_ssim_stats(img1, img2, mask, cfg, fused=True)
        loss, terms = _combined(lam, l1, 1 - s.mean(dim=1))
        return loss, terms.detach()
    x, y, m, pad = masked_padded(img1, img2, mask, cfg)
    w = cfg.window_1d(x.dtype, "cpu")
    args = (x, y, m, w, cfg.C1, cfg.C2, pad, float(lam))
    if _tracing(x, y):
        out, terms, _, _ = _mdssim_l1_op(*args)
    else:
        out, terms, _, _ = (_MDSSIML1FusedFn if _wants_fused(x, y) else _MDSSIML1Fn).apply(*args)
    return out, terms.detach()


# ----------------------------------------------------------------------------------------------
# Masked MS-SSIM: the terms of every scale in one autograd node. The mask goes down the pyramid
# with the images; each scale's term is its masked cs mean (its SSIM mean at the coarsest scale).
# With an input that needs a gradient, each scale's masked pass computes the term and its unit
# gradient in one sweep (the coefficient 1 / sum c comes from the mask alone, first), and the
# backward chains them as the unmasked terms' backward does (a second backward runs the sweeps
# again; create_graph and batched upstreams walk the scales in torch ops).
# ----------------------------------------------------------------------------------------------


def _masked_pyramid(lib, x: Tensor, y: Tensor, m: Tensor, scales: int):
    """The images' and the mask's pyramid, each step the kernel's (:func:`library.down2`)."""
    return multiscale.levels((x, y, m), scales, down=lambda t: library.down2(lib, t), cast=False)


def _mms_terms_impl(x, y, m, w, c1, c2, pad, scales):
    x, y, m = x.contiguous(), y.contiguous(), m.contiguous()
    lib = library.require(x.dtype, w.numel())
    terms = []
    for j, (a, b, mm) in enumerate(_masked_pyramid(lib, x, y, m, scales)):
        ss, cc, z = library.masked_forward(lib, a, b, mm, w, c1, c2, pad)
        s, c = _masked_means(ss, cc, z, x.dtype)
        terms.append(s if j == scales - 1 else c)
    return torch.stack(terms, dim=-1)


def _mms_terms_setup(ctx, inputs, output):
    x, y, m, w, c1, c2, pad, scales = inputs
    ctx.c1, ctx.c2, ctx.pad, ctx.scales = c1, c2, pad, scales
    ctx.save_for_backward(x, y, m, w)


def _mms_terms_backward(ctx, g):
    need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    unit = _take_unit(ctx, g is not None and (need_x or need_y) and not _torch_ops(g))
    x, y, m, w = ctx.saved_tensors
    none = (None,) * 6
    if g is None or not (need_x or need_y):
        return (None, None) + none
    if unit is not None:
        return _ms_unit_walk(unit, g, x.dtype) + none

    # create_graph / batched upstreams (the forward was fused: nothing else reaches here): the same
    # walk in differentiable torch ops
    def grads(level, g_s, g_c):
        return _masked_torch_ops_grads(*level, w, ctx.pad, ctx.c1, ctx.c2, g_s, g_c, need_x, need_y)

    return _torch_ops_scale_walk((x, y, m), ctx.scales, g, grads) + none


def _mms_terms_fused(ctx, x, y, m, w, c1, c2, pad, scales):
    """The masked terms, and per scale the unit gradient of its term (the masked cs mean, or the
    SSIM mean at the coarsest scale) w.r.t. that scale's images, from one masked pass per scale."""
    need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    x, y, m = x.contiguous(), y.contiguous(), m.contiguous()
    B, C = x.shape[:2]
    lib = library.require(x.dtype, w.numel())
    zeros = torch.zeros(B, C, dtype=x.dtype)
    unit, terms = [], []
    for j, (a, b, mm) in enumerate(_masked_pyramid(lib, x, y, m, scales)):
        last = j == scales - 1
        inv = _safe_inv(library.masked_weights(lib, mm, B, C, w.numel(), pad)[0].to(x.dtype))  # the mask's
        g_s, g_c = (inv, zeros) if last else (zeros, inv)
        gx, gy, ss, cc, z = library.masked_backward(
            lib, a, b, mm, w, c1, c2, g_s.contiguous(), g_c, need_x, need_y, pad, with_forward=True
        )
        unit.append((gx, gy))
        s, c = _masked_means(ss, cc, z, x.dtype)
        terms.append(s if last else c)
    ctx.unit = (lib, unit)
    return torch.stack(terms, dim=-1)


_MMSTermsFusedFn = _fused_function("_MMSTermsFusedFn", _mms_terms_fused, _mms_terms_setup, _mms_terms_backward, saved=4)


def masked_ms_terms(img1: Tensor, img2: Tensor, mask: Tensor, cfg: SSIMConfig, scales: int) -> Tensor:
    """Masked MS-SSIM terms ``[B, C, M]`` through the kernel, for "valid" and "same" padding, eagerly
    (the mask gets no gradient): one autograd node for every scale, each scale's term and unit
    gradient from one sweep when an input needs a gradient. "reflect" (a mirrored copy per scale)
    and traced calls take the shared pyramid over :func:`masked_ssim_stats`."""
    x, y, m, pad = masked_padded(img1, img2, mask, cfg)
    w = cfg.window_1d(x.dtype, "cpu")
    args = (x, y, m, w, cfg.C1, cfg.C2, pad, scales)
    if _wants_fused(x, y):
        return _MMSTermsFusedFn.apply(*args)
    return _mms_terms_impl(*args)  # no gradient: no graph
