"""The "torch" backend: SSIM with an analytic forward and backward in torch ops, on any device.

The forward filters the five moment images ``x, y, x^2, y^2, x*y`` with the separable window in
one pass (a horizontal then a vertical depthwise convolution). The backward is the adjoint of that
forward: the partial derivatives of the loss w.r.t. the five filtered moments are computed per
output pixel, and then *filtered with the flipped window* (the transpose of the forward filter,
padding included) before being combined with ``x`` and ``y``. Multiplying a pixel's own partials
by the window's sum instead (gradient of ``x.sum()``, not the Jacobian) is the classic mistake.

Derivation (per output pixel; ``mx, my`` local means, ``exx, eyy, exy`` local second moments)::

    A1 = 2 mx my + C1        B1 = mx^2 + my^2 + C1
    A2 = 2 (exy - mx my) + C2    B2 = (exx - mx^2) + (eyy - my^2) + C2
    l = A1 / B1,  cs = A2 / B2,  S = l cs

    with upstream gS (for S) and gC (for cs):
    dA1 = gS cs / B1         dB1 = -gS S / B1
    dA2 = (gS l + gC) / B2   dB2 = -(gS S + gC cs) / B2
    d/dmx = 2 my (dA1 - dA2) + 2 mx (dB1 - dB2)
    d/dmy = 2 mx (dA1 - dA2) + 2 my (dB1 - dB2)
    d/dexx = d/deyy = dB2,   d/dexy = 2 dA2

    grad_x = F^T(d/dmx) + 2 x F^T(d/dexx) + y F^T(d/dexy)
    grad_y = F^T(d/dmy) + 2 y F^T(d/deyy) + x F^T(d/dexy)

where ``F`` is "pad, then filter" and ``F^T`` its adjoint. Forward-mode (``jvp``) uses the same
partials: ``dS = sum_m (dS/dm) F(dm)`` with ``dmx = tx``, ``dexx = 2 x tx``, ``dexy = tx y + x ty``.

What is saved for backward: only the two input images (the moments are recomputed; memory is
the constraint on the GPU-less training path, and the recompute is one filter pass). Under
``torch.no_grad()`` or when no input requires grad, autograd saves nothing.

Values come back in the accumulation dtype (float32 for fp16 / bf16 / fp32, float64 for fp64);
gradients in each input's dtype.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from ..config import SSIMConfig, accumulation_dtype
from ..filtering import pad, separable_valid, window_filter
from .base import Backend
from .masked import plane_shift

__all__ = ["TorchBackend", "BACKEND", "ssim_map", "ssim_stats", "ssim_mean_and_grad", "ssim_backward"]


# ----------------------------------------------------------------------------------------------
# Filtering and its adjoint (pure functions of tensors: compile-friendly)
# ----------------------------------------------------------------------------------------------


def _filter_adjoint(g: torch.Tensor, w: torch.Tensor, padding: str, size: Tuple[int, int]) -> torch.Tensor:
    """F^T: the adjoint of :func:`~splatloss.filtering.window_filter`, mapping a map-sized ``g`` back to image ``size``.

    The adjoint of a valid correlation is a full correlation with the flipped window (zero-pad by
    ``k - 1``). For "same" the adjoint of zero padding crops, which together amounts to padding by
    ``r`` only; for "reflect" the mirrored border's gradient is folded back onto the pixels it
    copied (``reflection_pad2d_backward``).
    """
    k = w.shape[0]
    r = k // 2
    wf = w.flip(0)
    if padding == "same":
        return separable_valid(F.pad(g, (r, r, r, r)), wf)
    full = separable_valid(F.pad(g, (k - 1, k - 1, k - 1, k - 1)), wf)  # padded-image sized
    if padding == "valid":
        return full
    h, wd = size
    shape = full.shape[:2] + (h, wd)
    return torch.ops.aten.reflection_pad2d_backward(full, full.new_empty(shape), [r, r, r, r])


# ----------------------------------------------------------------------------------------------
# SSIM algebra
# ----------------------------------------------------------------------------------------------


def _shift(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One number per plane, ``[B, C, 1, 1]``: the mean of ``(x + y) / 2``, subtracted before the
    moments are formed.

    Why: ``var = E[x^2] - E[x]^2`` cancels catastrophically in float32 where the local variance is
    small against the squared mean (flat skies and walls); the moments of ``x - s`` keep the same
    variances and covariance (they do not change under a common shift) without the cancellation.
    On a flat JPEG photograph this took the float32 gradient from 7.3e-5 to 5e-7 of float64.
    It is a constant of the computation (no gradient flows through it: SSIM does not depend on it),
    and 0 for a black image, where tiny ``C1`` / ``C2`` would turn any rounding into huge partials.
    Pixels where ``x + y`` is not finite are left out of the mean (0 if none is left): a NaN or Inf
    pixel then reaches only its own window footprint, not every pixel of its plane.
    """
    return plane_shift(x, y)


def _moments(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, padding: str, s: torch.Tensor):
    """Filtered ``x', y', x'^2, y'^2, x' y'`` (``x' = x - s``, the padding shifted with the image: a
    zero-padded sample is ``-s``) in one separable pass: five [B, C, H', W'] maps."""
    r = w.shape[0] // 2
    xs, ys = pad(x, padding, r) - s, pad(y, padding, r) - s
    stacked = torch.cat([xs, ys, xs * xs, ys * ys, xs * ys], dim=1)  # [B, 5C, H + 2r, W + 2r]
    return separable_valid(stacked, w).chunk(5, dim=1)


def _ssim_terms(mx, my, exx, eyy, exy, c1: float, c2: float, s):
    """A1, B1, A2, B2 and the SSIM / cs maps from the moments of the shifted images (``mx + s`` is
    the true mean).

    The denominators are formed as numerator + a non-negative difference,
    ``B1 = A1 + (mx - my)^2`` and ``B2 = A2 + max(0, (exx + eyy - 2 exy) - (mx - my)^2)`` (the local
    variance of ``x - y``), so luminance and cs never exceed 1 through rounding and are exactly 1 for
    identical images; both are kept >= -1 too.
    """
    ux, uy = mx + s, my + s
    dm = mx - my
    dm2 = dm * dm
    a1 = 2 * ux * uy + c1
    b1 = a1 + dm2
    a2 = 2 * (exy - mx * my) + c2
    b2 = a2 + ((exx + eyy - 2 * exy) - dm2).clamp_min(0)
    lum = (a1 / b1).clamp_min(-1)
    cs = (a2 / b2).clamp_min(-1)
    return a1, b1, a2, b2, lum, cs, lum * cs


def _moment_partials(mx, my, s, b1, b2, lum, cs, ssim, g_s: Optional[torch.Tensor], g_c: Optional[torch.Tensor]):
    """Upstream-weighted partials of S (weight ``g_s``) and cs (weight ``g_c``) w.r.t. the moments
    of the shifted images (``mx``, ``my``; true means ``mx + s``, ``my + s``).

    Returns ``(d_mx, d_my, d_e2, d_exy)`` where ``d_e2`` is the partial w.r.t. ``exx`` and ``eyy``
    (they are equal). ``g_s`` / ``g_c`` broadcast against the maps; ``None`` means zero. A1 and B1
    see the true means, A2 and B2 the shifted ones, so
    ``d/dmx = 2 (my + s) dA1 + 2 (mx + s) dB1 - 2 my dA2 - 2 mx dB2`` with
    ``2 (my + s) dA1 + 2 (mx + s) dB1 = 2 g_s ((my + s) cs - (mx + s) S) / B1``.
    """
    if g_s is None:
        d_a1 = None
        d_a2 = g_c / b2
        d_b2 = -(g_c * cs) / b2
    else:
        d_a1 = g_s * cs / b1
        if g_c is None:
            d_a2 = g_s * lum / b2
            d_b2 = -(g_s * ssim) / b2
        else:
            d_a2 = (g_s * lum + g_c) / b2
            d_b2 = -(g_s * ssim + g_c * cs) / b2
    d_mx = -2 * (my * d_a2 + mx * d_b2)
    d_my = -2 * (mx * d_a2 + my * d_b2)
    if d_a1 is not None:
        ux, uy = mx + s, my + s
        t = 2 * g_s / b1
        d_mx = d_mx + t * (uy * cs - ux * ssim)
        d_my = d_my + t * (ux * cs - uy * ssim)
    return d_mx, d_my, d_b2, 2 * d_a2


def _forward(x, y, w, padding, c1, c2):
    """SSIM and cs maps plus everything the partials need."""
    s = _shift(x, y)
    mx, my, exx, eyy, exy = _moments(x, y, w, padding, s)
    _, b1, _, b2, lum, cs, ssim = _ssim_terms(mx, my, exx, eyy, exy, c1, c2, s)
    return ssim, cs, (mx, my, s, b1, b2, lum, cs, ssim)


def ssim_backward(x, y, w, padding, c1, c2, g_s, g_c, need_x: bool, need_y: bool):
    """Gradients w.r.t. ``x`` and ``y`` (accumulation dtype, differentiable torch ops) of
    ``sum(g_s * ssim_map + g_c * cs_map)`` for upstreams ``g_s``, ``g_c`` that broadcast against the
    maps (``None``: zero); ``w`` the 1-D window, ``padding`` "valid" | "same" | "reflect"."""
    if g_s is None and g_c is None:  # neither output was used: nothing flows back
        return None, None
    _, _, parts = _forward(x, y, w, padding, c1, c2)
    d_mx, d_my, d_e2, d_exy = _moment_partials(*parts, g_s, g_c)
    size = (x.shape[-2], x.shape[-1])
    adj = _filter_adjoint(torch.cat([d_mx, d_my, d_e2, d_exy], dim=1), w, padding, size)
    a_mx, a_my, a_e2, a_exy = adj.chunk(4, dim=1)
    s = parts[2]
    xs, ys = x - s, y - s  # d E[x'^2] / dx = 2 x' (x' = x - s)
    gx = a_mx + 2 * xs * a_e2 + ys * a_exy if need_x else None
    gy = a_my + 2 * ys * a_e2 + xs * a_exy if need_y else None
    return gx, gy


def _tangent(x, y, tx, ty, w, padding, c1, c2):
    """Forward-mode derivative of the (SSIM, cs) maps along tangents ``tx``, ``ty`` (None = 0)."""
    _, _, parts = _forward(x, y, w, padding, c1, c2)
    zeros = torch.zeros_like(x)
    tx = zeros if tx is None else tx.to(x.dtype)
    ty = zeros if ty is None else ty.to(y.dtype)
    s = parts[2]
    xs, ys = x - s, y - s
    dmx, dmy, dexx, deyy, dexy = window_filter(
        torch.cat([tx, ty, 2 * xs * tx, 2 * ys * ty, tx * ys + xs * ty], dim=1), w, padding
    ).chunk(5, dim=1)
    one = torch.ones((), dtype=x.dtype, device=x.device)
    ps = _moment_partials(*parts, one, None)
    pc = _moment_partials(*parts, None, one)
    t_s = ps[0] * dmx + ps[1] * dmy + ps[2] * (dexx + deyy) + ps[3] * dexy
    t_c = pc[0] * dmx + pc[1] * dmy + pc[2] * (dexx + deyy) + pc[3] * dexy
    return t_s, t_c


def _to_acc(t: torch.Tensor) -> torch.Tensor:
    return t.to(accumulation_dtype(t.dtype))


# ----------------------------------------------------------------------------------------------
# autograd.Functions
# ----------------------------------------------------------------------------------------------


def _save_inputs(ctx, inputs) -> None:
    """What both SSIM Functions keep for backward / jvp: the two images and the window, nothing
    map-sized (the backward recomputes the moments)."""
    img1, img2, w, padding, c1, c2 = inputs
    ctx.padding, ctx.c1, ctx.c2 = padding, c1, c2
    ctx.dtypes = (img1.dtype, img2.dtype)
    ctx.set_materialize_grads(False)  # an unused output (e.g. cs) passes None, skipping its terms
    ctx.save_for_backward(img1, img2, w)
    ctx.save_for_forward(img1, img2, w)


class _SSIMMapCore(torch.autograd.Function):
    """(img1, img2) -> (SSIM map, cs map), analytic backward (what torch.compile traces: dynamo
    does not trace a custom jvp)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(img1, img2, w, padding, c1, c2):
        ssim, cs, _ = _forward(_to_acc(img1), _to_acc(img2), w, padding, c1, c2)
        return ssim, cs

    @staticmethod
    def setup_context(ctx, inputs, output):
        _save_inputs(ctx, inputs)

    @staticmethod
    def backward(ctx, g_s, g_c):
        img1, img2, w = ctx.saved_tensors
        need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        gx, gy = ssim_backward(_to_acc(img1), _to_acc(img2), w, ctx.padding, ctx.c1, ctx.c2, g_s, g_c, need_x, need_y)
        gx = None if gx is None else gx.to(ctx.dtypes[0])
        gy = None if gy is None else gy.to(ctx.dtypes[1])
        return gx, gy, None, None, None, None


class _SSIMMapFn(_SSIMMapCore):
    """:class:`_SSIMMapCore` with forward-mode AD (jvp), run eagerly."""

    @staticmethod
    def jvp(ctx, t1, t2, *_):
        img1, img2, w = ctx.saved_tensors
        return _tangent(_to_acc(img1), _to_acc(img2), t1, t2, w, ctx.padding, ctx.c1, ctx.c2)


class _SSIMStatsCore(torch.autograd.Function):
    """(img1, img2) -> per-(B, C) means of the SSIM and cs maps; upstream is one scalar per (B, C)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(img1, img2, w, padding, c1, c2):
        ssim, cs, _ = _forward(_to_acc(img1), _to_acc(img2), w, padding, c1, c2)
        return ssim.mean(dim=(-2, -1)), cs.mean(dim=(-2, -1))

    @staticmethod
    def setup_context(ctx, inputs, output):
        _save_inputs(ctx, inputs)

    @staticmethod
    def _map_numel(img, w, padding):
        k = w.shape[0]
        h, wd = img.shape[-2], img.shape[-1]
        if padding == "valid":
            h, wd = h - k + 1, wd - k + 1
        return h * wd

    @staticmethod
    def backward(ctx, g_s, g_c):
        img1, img2, w = ctx.saved_tensors
        n = _SSIMStatsCore._map_numel(img1, w, ctx.padding)
        # The mean's upstream is the same for every pixel of a (B, C) plane: [B, C, 1, 1].
        g_s = None if g_s is None else (g_s / n)[..., None, None]
        g_c = None if g_c is None else (g_c / n)[..., None, None]
        need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        gx, gy = ssim_backward(_to_acc(img1), _to_acc(img2), w, ctx.padding, ctx.c1, ctx.c2, g_s, g_c, need_x, need_y)
        gx = None if gx is None else gx.to(ctx.dtypes[0])
        gy = None if gy is None else gy.to(ctx.dtypes[1])
        return gx, gy, None, None, None, None


class _SSIMStatsFn(_SSIMStatsCore):
    """:class:`_SSIMStatsCore` with forward-mode AD (jvp), run eagerly."""

    @staticmethod
    def jvp(ctx, t1, t2, *_):
        img1, img2, w = ctx.saved_tensors
        t_s, t_c = _tangent(_to_acc(img1), _to_acc(img2), t1, t2, w, ctx.padding, ctx.c1, ctx.c2)
        return t_s.mean(dim=(-2, -1)), t_c.mean(dim=(-2, -1))


# ----------------------------------------------------------------------------------------------
# Entry points and the backend object
# ----------------------------------------------------------------------------------------------


def _window(img: torch.Tensor, cfg: SSIMConfig) -> torch.Tensor:
    return cfg.window_1d(accumulation_dtype(img.dtype), img.device)


def ssim_map(img1: torch.Tensor, img2: torch.Tensor, cfg: SSIMConfig, return_cs: bool = False):
    """SSIM map ``[B, C, H', W']`` (and the cs map when ``return_cs``), analytic gradients.

    Examples:
        >>> from splatloss.config import SSIMConfig
        >>> x = torch.rand(1, 1, 12, 12, requires_grad=True)
        >>> m = ssim_map(x, torch.rand(1, 1, 12, 12), SSIMConfig(padding="same"))
        >>> m.shape, m.grad_fn is not None
        (torch.Size([1, 1, 12, 12]), True)
    """
    fn = _SSIMMapCore if torch.compiler.is_compiling() else _SSIMMapFn
    ssim, cs = fn.apply(img1, img2, _window(img1, cfg), cfg.padding, cfg.C1, cfg.C2)
    return (ssim, cs) if return_cs else ssim


def ssim_stats(img1: torch.Tensor, img2: torch.Tensor, cfg: SSIMConfig):
    """``(ssim_mean, cs_mean)``, each ``[B, C]``: means of the SSIM and cs maps per image and channel."""
    fn = _SSIMStatsCore if torch.compiler.is_compiling() else _SSIMStatsFn
    return fn.apply(img1, img2, _window(img1, cfg), cfg.padding, cfg.C1, cfg.C2)


def ssim_mean_and_grad(img1: torch.Tensor, img2: torch.Tensor, cfg: SSIMConfig, upstream: torch.Tensor):
    """``(ssim_mean [B, C], grad_img1)`` without autograd: ``grad = d sum(upstream * ssim_mean) / d img1``.

    Used by :func:`splatloss.dssim_with_gradient` (no graph is built). ``upstream`` is ``[B, C]``
    in the accumulation dtype; the gradient comes back in ``img1``'s dtype.
    """
    x, y = _to_acc(img1), _to_acc(img2)
    w = _window(img1, cfg)
    ssim, _, _ = _forward(x, y, w, cfg.padding, cfg.C1, cfg.C2)
    n = ssim.shape[-2] * ssim.shape[-1]
    gx, _ = ssim_backward(x, y, w, cfg.padding, cfg.C1, cfg.C2, (upstream / n)[..., None, None], None, True, False)
    return ssim.mean(dim=(-2, -1)), gx.to(img1.dtype)


class TorchBackend(Backend):
    """Torch ops with the analytic backward above, on any device (CPU, CUDA, MPS, XPU); never the
    compiled C kernel. MS-SSIM and L1 + D-SSIM are the shared compositions of :class:`Backend`."""

    name = "torch"

    def ssim_map(self, img1, img2, cfg, return_cs=False):
        return ssim_map(img1, img2, cfg, return_cs=return_cs)

    def ssim_stats(self, img1, img2, cfg):
        return ssim_stats(img1, img2, cfg)

    def ssim_mean_and_grad(self, img1, img2, cfg, upstream, mask=None):
        if mask is not None:
            return super().ssim_mean_and_grad(img1, img2, cfg, upstream, mask)
        with torch.no_grad():
            return ssim_mean_and_grad(img1, img2, cfg, upstream)


#: The backend object ``splatloss.backends.get("torch")`` returns.
BACKEND = TorchBackend()
