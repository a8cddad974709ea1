"""MS-SSIM's scalar combine on Triton: ``[B, C, M]`` per-scale terms -> ``[B]``, one launch forward
and one backward.

The same function as :func:`splatloss.multiscale.combine` (relu for the metric, ``tau=None``;
:func:`~splatloss.multiscale.smooth_positive` for the loss; ``f = t ** w``, the product over the
scales, the mean over the channels). Written in torch it is about a dozen tiny launches forward and
forty backward, each a few microseconds of host time, which bound a 1080p MS-SSIM call on a GPU;
here a program holds a block of images with all their channels and scales (``C`` and ``M`` padded to
powers of two, a few dozen values per image), so either direction is one launch.

Conventions, all torch's (so that the two combines give the same values and gradients, special
values included):

* ``x ** 0 = 1`` for every ``x`` (``0 ** 0``, ``nan ** 0`` too), ``0 ** w = 0`` for ``w > 0``; and
  ``d(t ** w) / dt = 0`` where ``w == 0``, ``w * t ** (w - 1)`` elsewhere (so ``inf`` at ``t == 0``
  for ``0 < w < 1``).
* relu's backward is a select, ``where(x <= 0, 0, g)``: the ``inf`` (or ``0 * inf = nan``) that the
  power's derivative gives at a term ``<= 0`` never gets through.
* smooth_positive's backward: ``g`` for ``x >= tau``; ``g * tau^2 / (2 tau - x)^2`` for ``x < tau``;
  0 for a NaN term (torch's ``where`` and ``clamp`` backwards both select it away).
* The product's derivative per factor is the product of the other factors, multiplied out, never
  the product divided by the factor (which may be 0).
* Non-finite terms: a NaN term makes its image's value NaN (relu and the clamp keep NaN, as
  torch's do); ``+inf`` gives ``inf`` (or NaN against a zero factor); under the loss ``-inf`` gives
  a 0 factor. Gradients follow the same algebra as torch autograd's, so NaN / inf land where
  torch's do.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

from ...multiscale import weights_tensor
from . import launch
from .glue import eager, functorch_guard, refuse_double_backward, with_autograd
from .launch import cdiv, device_guard, launch_kernel, launch_options, next_power_of_2

__all__ = ["combine"]

Tensor = torch.Tensor

#: Sizes compiled as plain integers (no variant per batch size; see launch.SIZES).
_SIZES = ("B", "C", "M")


@triton.jit
def _mul(a, b):
    return a * b


@triton.jit
def _positive(x, tau, USE_TAU: tl.constexpr):
    """relu (the metric) or smooth_positive (the loss); both keep a NaN term NaN, as torch's do."""
    if USE_TAU:
        below = (tau * tau) / (2.0 * tau - tl.where(x > tau, tau, x))  # clamp(x, max=tau): NaN stays
        return tl.where(x >= tau, x, below)
    else:
        return tl.where(x <= 0.0, 0.0, x)


@triton.jit
def _pow(t, w):
    # t >= 0 (or NaN): t ** w as exp2(w log2 t) where t > 0 (inf ** w = inf), torch's 0 ** w where
    # t is 0 (0 for w > 0, inf for w < 0: log2 never sees the 0, so the interpreter's numpy does not
    # warn), NaN ** w = NaN, and x ** 0 = 1 for every x, 0 ** 0 and NaN ** 0 included. (Triton's
    # interpreter has no libdevice pow.) On CUDA exp2 is ex2.approx (2 ulp); the rounding of
    # w log2 t dominates: about |w log2 t| * 4e-8 relative, under 6e-7 for terms >= 1e-4.
    pos = t > 0.0
    p = tl.exp2(w * tl.log2(tl.where(pos, t, 1.0)))
    p = tl.where(pos, p, tl.where(t == 0.0, tl.where(w > 0.0, 0.0, float("inf")), t))
    return tl.where(w == 0.0, 1.0, p)


@triton.jit
def _load_factors(
    x_ptr, w_ptr, B, C, M, s_b, s_c, s_m, tau,
    USE_TAU: tl.constexpr, BB: tl.constexpr, CP: tl.constexpr, MP: tl.constexpr,
):  # fmt: skip
    """A block of ``BB`` images: the terms ``x``, weights ``w``, ``t = f(x)`` and ``t ** w`` as
    ``[BB, CP, MP]`` tiles, with factor 1 (neutral in the product) outside the problem."""
    b = tl.program_id(0) * BB + tl.arange(0, BB)[:, None, None]
    c = tl.arange(0, CP)[None, :, None]
    m = tl.arange(0, MP)[None, None, :]
    ok = (b < B) & (c < C) & (m < M)
    x = tl.load(x_ptr + b.to(tl.int64) * s_b + c * s_c + m * s_m, mask=ok, other=1.0).to(tl.float32)
    w = tl.load(w_ptr + m, mask=m < M, other=0.0).to(tl.float32)
    t = _positive(x, tau, USE_TAU)
    f = tl.where(ok, _pow(t, w), 1.0)
    return b, c, m, ok, x, w, t, f


@triton.jit(do_not_specialize=_SIZES)
def _combine_fwd_kernel(
    x_ptr, w_ptr, out_ptr, B, C, M, s_b, s_c, s_m, tau,
    USE_TAU: tl.constexpr, BB: tl.constexpr, CP: tl.constexpr, MP: tl.constexpr,
):  # fmt: skip
    b, c, m, ok, x, w, t, f = _load_factors(x_ptr, w_ptr, B, C, M, s_b, s_c, s_m, tau, USE_TAU, BB, CP, MP)
    prod = tl.reduce(f, 2, _mul)  # [BB, CP]
    prod = tl.where(tl.arange(0, CP)[None, :] < C, prod, 0.0)
    bb = tl.program_id(0) * BB + tl.arange(0, BB)
    tl.store(out_ptr + bb, tl.sum(prod, axis=1) / C, mask=bb < B)


@triton.jit(do_not_specialize=_SIZES)
def _combine_bwd_kernel(
    g_ptr, x_ptr, w_ptr, out_ptr, B, C, M, s_g, s_b, s_c, s_m, tau,
    USE_TAU: tl.constexpr, BB: tl.constexpr, CP: tl.constexpr, MP: tl.constexpr,
):  # fmt: skip
    # recomputes t and f from the terms (a few dozen values per image: cheaper than saving them)
    b, c, m, ok, x, w, t, f = _load_factors(x_ptr, w_ptr, B, C, M, s_b, s_c, s_m, tau, USE_TAU, BB, CP, MP)
    g = tl.load(g_ptr + b.to(tl.int64) * s_g, mask=b < B, other=0.0).to(tl.float32) / C  # the mean's
    # each factor's derivative: the product of the others, multiplied out (f_j may be 0)
    others = tl.zeros((BB, CP, MP), dtype=tl.float32)
    for j in tl.static_range(MP):
        pj = tl.reduce(tl.where(m == j, 1.0, f), 2, _mul)
        others = tl.where(m == j, pj[:, :, None], others)
    # pow: 0 where w == 0, else w t^(w - 1) (t^0 = 1 at w == 1, t == 0 included)
    g_t = tl.where(w == 0.0, 0.0, (g * others) * (w * _pow(t, w - 1.0)))
    if USE_TAU:
        d = 2.0 * tau - tl.where(x > tau, tau, x)
        g_x = tl.where(x >= tau, g_t, tl.where(x <= tau, g_t * (tau * tau) / (d * d), 0.0))
    else:
        g_x = tl.where(x <= 0.0, 0.0, g_t)  # relu's select: the inf at t == 0 does not get through
    out = out_ptr + (b * C + c).to(tl.int64) * M + m  # contiguous
    tl.store(out, g_x.to(out_ptr.dtype.element_ty), mask=ok)


def _grid(terms: Tensor) -> tuple:
    """(programs, BB, CP, MP, warps): on CUDA about 512 values per program (a handful of images;
    one warp for a tile of up to 128); in the interpreter (a cost per operation) up to 16k."""
    B, C, M = terms.shape
    cp, mp = next_power_of_2(max(C, 1)), next_power_of_2(max(M, 1))
    cap = 512 if terms.device.type == "cuda" or launch.FORCE_CUDA_GEOMETRY else 16384
    bb = min(next_power_of_2(max(B, 1)), max(1, cap // (cp * mp)))
    warps = max(1, min(4, (bb * cp * mp) // 128))
    return cdiv(B, bb), bb, cp, mp, warps


def _combine_impl(terms: Tensor, weights: Tensor, tau: float, use_tau: bool) -> Tensor:
    B, C, M = terms.shape
    out = torch.empty((B,), dtype=torch.float32, device=terms.device)
    if B == 0:
        return out
    n, bb, cp, mp, warps = _grid(terms)
    with device_guard(terms):
        launch_kernel(_combine_fwd_kernel, (n,),
            terms, weights, out, B, C, M, *terms.stride(), tau,
            USE_TAU=use_tau, BB=bb, CP=cp, MP=mp, **launch_options(warps),
        )  # fmt: skip
    return out


_combine_op = torch.library.custom_op("splatloss::triton_ms_combine", _combine_impl, mutates_args=())


@_combine_op.register_fake
def _(terms, weights, tau, use_tau):
    return terms.new_empty((terms.shape[0],), dtype=torch.float32)


def _combine_bwd_impl(grad: Tensor, terms: Tensor, weights: Tensor, tau: float, use_tau: bool) -> Tensor:
    B, C, M = terms.shape
    out = torch.empty((B, C, M), dtype=terms.dtype, device=terms.device)  # contiguous
    if B == 0:
        return out
    n, bb, cp, mp, warps = _grid(terms)
    with device_guard(terms):
        # the upstream gradient by its stride: a sum's backward hands an expanded one (stride 0)
        launch_kernel(_combine_bwd_kernel, (n,),
            grad, terms, weights, out, B, C, M, grad.stride(0), *terms.stride(), tau,
            USE_TAU=use_tau, BB=bb, CP=cp, MP=mp, **launch_options(warps),
        )  # fmt: skip
    return out


_combine_bwd_op = torch.library.custom_op("splatloss::triton_ms_combine_bwd", _combine_bwd_impl, mutates_args=())


@_combine_bwd_op.register_fake
def _(grad, terms, weights, tau, use_tau):
    return terms.new_empty(terms.shape)


def _combine_setup(ctx, inputs, output):
    terms, weights, tau, use_tau = inputs
    ctx.save_for_backward(terms, weights)  # the backward recomputes the factors from them
    ctx.tau, ctx.use_tau = tau, use_tau


def _combine_backward(ctx, grad):
    refuse_double_backward("ms_ssim combine")
    if not ctx.needs_input_grad[0] or grad is None:
        return None, None, None, None
    terms, weights = ctx.saved_tensors
    # eager: the kernel directly (no custom-op dispatch); a compiled backward's trace: the op
    bwd = _combine_bwd_impl if eager(grad, terms, weights) else _combine_bwd_op
    return bwd(grad, terms, weights, ctx.tau, ctx.use_tau), None, None, None


_combine_call = with_autograd(_combine_op, _combine_impl, _combine_setup, _combine_backward)


def combine(terms: Tensor, weights: Sequence[float], tau: Optional[float] = None) -> Tensor:
    """``(B, C, M)`` float32 terms -> ``(B,)`` float32: per channel ``prod_j f(term_j) ** w_j``, then
    the channel mean, in one launch (and one for the gradient).

    :func:`splatloss.multiscale.combine`'s function: ``f`` is relu for ``tau=None`` (the metric) and
    :func:`~splatloss.multiscale.smooth_positive` with threshold ``tau`` otherwise (the loss).
    """
    if terms.dim() != 3 or terms.shape[-1] != len(weights):
        raise ValueError(
            f"combine takes (B, C, M) terms with M = len(weights) = {len(weights)} scales, got shape "
            f"{tuple(terms.shape)}; stack one term per scale on the last dimension"
        )
    w = weights_tensor(weights, terms)
    with functorch_guard():
        return _combine_call(terms, w, 0.0 if tau is None else float(tau), tau is not None)
