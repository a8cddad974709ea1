"""The "torch" backend: SSIM with an analytic forward and backward in torch ops, on any device.

The image pair is padded first (``filtering.pad``), and everything below runs "valid" on the padded
images; the gradient goes back through the adjoint of the padding (a crop for "same", the mirrored
border folded back for "reflect").

**Local shifts.** Float32 moments cancel where a window is flat: ``var = E[x^2] - E[x]^2`` is a small
difference of numbers of magnitude ``level^2``, and the partials w.r.t. the second moments are of
order ``1 / C2``, so moments formed around a shift far from the window's level leave gradients
~1e-3 from float64 on flat images. The moments are therefore formed around the image's own values
near each window (the tile geometry: :mod:`splatloss.backends.tiles`, shared with the masked
composition). Output columns are grouped in tiles of ``TILE_WIDTH = 4`` (``tile_width``: 3 for
a 3-tap window); tile ``J``'s shift column ``c_J`` is the centre input column of its middle output
column. Each input row ``i`` has its own shifts ``sx(i, J) = x(i, c_J)``, ``sy(i, J) = y(i, c_J)``
(separate for the two images), and the horizontal pass sums the per-tap differences
``dx = x - sx(i, J)``, ``dy = y - sy(i, J)``: exactly 0 in windows flat along the row. The vertical
pass moves each row to the output row's common shift ``Sx = sx(i0 + r, J)`` (its centre row) with
``tau_x(i) = sx(i, J) - Sx``, exactly 0 where the rows share their level::

    mx  = sum_i w (h1x(i) + tau_x)                           (= E[x - Sx])
    exx = sum_i w (h2x(i) + tau_x (2 h1x(i) + tau_x))
    exy = sum_i w (hxy(i) + tau_x h1y(i) + tau_y h1x(i) + tau_x tau_y)

with ``h1x = sum_k w dx``, ``h2x = sum_k w dx^2``, ``hxy = sum_k w dx dy`` along the row. The tile
width trades precision for work: the shift column must lie within ``r`` of every output column of
its tile (so a non-finite pixel stays within its footprint), and the wider the tile, the further
the shift from the outer windows' levels (on two-level images: W = 1..4 give 4e-6..7e-6 of float64
in the gradient, 8 gives 1e-5..3e-5, 16 gives 1.5e-4..3e-4). The shifts are constants of the
computation: SSIM does not depend on them and no gradient flows through them.

**SSIM algebra** (per map pixel; ``mx, my`` the shifted means, ``ux = Sx + mx``, ``uy = Sy + my`` the
true ones; ``exx, eyy, exy`` the shifted second moments)::

    A1 = 2 ux uy + C1        B1 = A1 + (ux - uy)^2,  ux - uy = (Sx - Sy) + (mx - my)
    A2 = 2 (exy - mx my) + C2    B2 = A2 + max(0, (exx + eyy - 2 exy) - (mx - my)^2)
    l = A1 / B1,  cs = A2 / B2,  S = l cs

so luminance and cs never exceed 1 through rounding and are exactly 1 for identical images.
With upstream gS (for S) and gC (for cs)::

    dA1 = gS cs / B1         dB1 = -gS S / B1
    dA2 = (gS l + gC) / B2   dB2 = -(gS S + gC cs) / B2
    d/dmx = 2 uy dA1 + 2 ux dB1 - 2 my dA2 - 2 mx dB2     (d/dmy likewise)
    d/dexx = d/deyy = dB2,   d/dexy = 2 dA2

**Backward**: the adjoint of that forward (the partials filtered with the flipped window, never a
pixel's own partials times the window's sum, the classic mistake). Along H, per input row ``i``
and output column::

    Dm = sum_i0 w d/dmx,  De2 = sum_i0 w d/dexx,  Dxy = sum_i0 w d/dexy
    Vx = sum_i0 w [2 d/dexx tau_x + d/dexy tau_y]      (tau of row i against output row i0)

then along W, the per-tap differences against the shift of the tile of each output column ``j0``::

    grad_x(i, j) = sum_j0 w [Dm + Vx + 2 De2 (x(i, j) - sx(i, J(j0))) + Dxy (y(i, j) - sy(i, J(j0)))]

and ``grad_y`` with the roles of x and y swapped. Within a tile the differences do not depend on
``j0``, so they factor out of the sum over the tile's outputs; the tiles' input columns overlap and
their contributions add. Forward-mode (``jvp``) uses the same partials and shifts:
``d mx = F(tx)``, ``d exx = 2 F((x - Sx) tx)``, ``d exy = F(tx (y - Sy) + (x - Sx) ty)``.

The backward is made of differentiable torch ops (double backward works), and the filters multiply
only the taps of each window (no structural zeros: a NaN or Inf pixel reaches only its window
footprint, and the gradients of that footprint's windows).

What is saved for backward: only the two input images (the moments are recomputed; memory is
the constraint on the GPU-less training path, and the recompute is one forward). Under
``torch.no_grad()`` or when no input requires grad, autograd saves nothing.

Values come back in the accumulation dtype (float32 for fp16 / bf16 / fp32, float64 for fp64);
gradients in each input's dtype.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..config import SSIMConfig, accumulation_dtype, without_autocast
from ..filtering import pad
from .base import Backend
from .tiles import Tiles, pad_adjoint, tile_adjoint

__all__ = ["TorchBackend", "BACKEND", "ssim_map", "ssim_stats", "ssim_mean_and_grad", "ssim_backward"]


# ----------------------------------------------------------------------------------------------
# SSIM algebra
# ----------------------------------------------------------------------------------------------


def _moments(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, padding: str):
    """The tiles and the moments of ``x'' = x - Sx``, ``y'' = y - Sy`` around each map pixel's
    common shifts: ``(tiles, (mx, my, exx, eyy, exy, Sx, Sy))``, each map ``[B, C, H', W']``."""
    r = w.shape[0] // 2
    tiles = Tiles(pad(x, padding, r), pad(y, padding, r), w)
    dx, dy = tiles.diffs()
    h1x, h1y = tiles.hfilter(dx), tiles.hfilter(dy)
    # one product at a time through both passes (a product is (tw + k - 1) / tw images in size)
    f2x, f2y = tiles.vfilter(tiles.hfilter(dx * dx)), tiles.vfilter(tiles.hfilter(dy * dy))
    fxy = tiles.vfilter(tiles.hfilter(dx * dy))
    del dx, dy
    m_x, m_y, q_xx, q_yy, q_xy, c_xx, c_yy, c_xy = tiles.rebase(h1x, h1y)
    # The corrections are added in place to the fresh filter outputs (which no backward saves).
    mx, my = tiles.vfilter(h1x).add_(m_x), tiles.vfilter(h1y).add_(m_y)
    del h1x, h1y
    exx, eyy = f2x.add_(c_xx, alpha=2).add_(q_xx), f2y.add_(c_yy, alpha=2).add_(q_yy)
    exy = fxy.add_(c_xy).add_(q_xy)
    del c_xx, c_yy, c_xy
    moments = (mx, my, exx, eyy, exy) + tiles.centre_shifts()
    return tiles, tuple(tiles.to_map(t) for t in moments)


def _ssim_terms(mx, my, exx, eyy, exy, sx, sy, c1: float, c2: float):
    """A1, B1, A2, B2 and the SSIM / cs maps from the moments around the shifts ``sx``, ``sy`` (the
    true means are ``ux = sx + mx``, ``uy = sy + my``).

    The denominators are formed as numerator + a non-negative difference,
    ``B1 = A1 + (ux - uy)^2`` with ``ux - uy = (sx - sy) + (mx - my)``, and
    ``B2 = A2 + max(0, var_x + var_y - 2 cov)`` (the local variance of ``x - y``), so luminance and cs
    never exceed 1 through rounding and are exactly 1 for identical images; both are kept >= -1 too.
    The variance of ``x - y`` is formed from the three (co)variances, each its moment less its means'
    product: where one tap carries the window (a sigma of 0.1) those cancel exactly, while
    ``(exx + eyy - 2 exy) - (mx - my)^2`` cancels O(1) terms (the shifts are a tile's, not the
    pixel's) and put cs 7e-5 below 1.
    """
    ux, uy = sx + mx, sy + my
    dm = mx - my
    du = (sx - sy) + dm
    a1 = 2 * ux * uy + c1
    b1 = a1 + du * du
    a2 = 2 * (exy - mx * my) + c2
    vx, vy, cov = exx - mx * mx, eyy - my * my, exy - mx * my
    b2 = a2 + ((vx + vy) - 2 * cov).clamp_min(0)
    lum = (a1 / b1).clamp_min(-1)
    cs = (a2 / b2).clamp_min(-1)
    return ux, uy, b1, b2, lum, cs, lum * cs


def _moment_partials(mx, my, ux, uy, b1, b2, lum, cs, ssim, g_s: Optional[torch.Tensor], g_c: Optional[torch.Tensor]):
    """Upstream-weighted partials of S (weight ``g_s``) and cs (weight ``g_c``) w.r.t. the shifted
    moments (``mx``, ``my``; true means ``ux``, ``uy``).

    Returns ``(d_mx, d_my, d_e2, d_exy)`` where ``d_e2`` is the partial w.r.t. ``exx`` and ``eyy``
    (they are equal). ``g_s`` / ``g_c`` broadcast against the maps; ``None`` means zero. A1 and B1
    see the true means, A2 and B2 the shifted ones, so
    ``d/dmx = 2 uy dA1 + 2 ux dB1 - 2 my dA2 - 2 mx dB2`` with
    ``2 uy dA1 + 2 ux dB1 = 2 g_s (uy cs - ux S) / B1``.
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
        t = 2 * g_s / b1
        d_mx = d_mx + t * (uy * cs - ux * ssim)
        d_my = d_my + t * (ux * cs - uy * ssim)
    return d_mx, d_my, d_b2, 2 * d_a2


def _forward(x, y, w, padding, c1, c2):
    """SSIM and cs maps, everything the partials need, and the tiles."""
    tiles, (mx, my, exx, eyy, exy, sx, sy) = _moments(x, y, w, padding)
    ux, uy, b1, b2, lum, cs, ssim = _ssim_terms(mx, my, exx, eyy, exy, sx, sy, c1, c2)
    return ssim, cs, (mx, my, ux, uy, b1, b2, lum, cs, ssim), tiles


def ssim_backward(x, y, w, padding, c1, c2, g_s, g_c, need_x: bool, need_y: bool):
    """Gradients w.r.t. ``x`` and ``y`` (accumulation dtype, differentiable torch ops) of
    ``sum(g_s * ssim_map + g_c * cs_map)`` for upstreams ``g_s``, ``g_c`` that broadcast against the
    maps (``None``: zero); ``w`` the 1-D window, ``padding`` "valid" | "same" | "reflect"."""
    if g_s is None and g_c is None:  # neither output was used: nothing flows back
        return None, None
    return _adjoint(*_partials(x, y, w, padding, c1, c2, g_s, g_c), w, padding, x.shape[-2:], need_x, need_y)


def _partials(x, y, w, padding, c1, c2, g_s, g_c):
    """The tiles and the partials of the moments (:func:`_moment_partials`) in tile layout,
    ``[B, 4C, Ho, nt, tw]`` (zeros past the map); the forward's maps are freed on return."""
    _, _, parts, tiles = _forward(x, y, w, padding, c1, c2)
    return tiles, tiles.to_tiles(torch.cat(_moment_partials(*parts, g_s, g_c), dim=1))


def _adjoint(tiles, d, w, padding, size, need_x: bool, need_y: bool):
    """:func:`ssim_backward` from the tiles and the partials of :func:`_partials`."""
    gx, gy = tile_adjoint(tiles, d, w, need_x, need_y)
    r = w.shape[0] // 2
    gx = None if gx is None else pad_adjoint(gx, padding, r, size)
    gy = None if gy is None else pad_adjoint(gy, padding, r, size)
    return gx, gy


def _tangent(x, y, tx, ty, w, padding, c1, c2):
    """Forward-mode derivative of the (SSIM, cs) maps along tangents ``tx``, ``ty`` (None = 0): the
    moments' tangents ``d mx = F(tx)``, ``d exx = 2 F(x'' tx)``, ``d exy = F(tx y'' + x'' ty)``, with
    ``x''`` formed around the same shifts as the forward."""
    _, _, parts, tiles = _forward(x, y, w, padding, c1, c2)
    zeros = torch.zeros_like(x)
    r = w.shape[0] // 2
    px = tiles.patches(pad(zeros if tx is None else tx.to(x.dtype), padding, r))
    py = tiles.patches(pad(zeros if ty is None else ty.to(y.dtype), padding, r))
    dx, dy = tiles.diffs()
    htx, hty = tiles.hfilter(px), tiles.hfilter(py)
    h = torch.cat([htx, hty, tiles.hfilter(dx * px), tiles.hfilter(dy * py), tiles.hfilter(px * dy + dx * py)], dim=1)
    f_x, f_y, f_xx, f_yy, f_xy = tiles.vfilter(h).chunk(5, dim=1)
    *_, c_xx, c_yy, c_xy = tiles.rebase(htx, hty)
    dmx, dmy, dexx, deyy, dexy = (
        tiles.to_map(t) for t in (f_x, f_y, 2 * (f_xx + c_xx), 2 * (f_yy + c_yy), f_xy + c_xy)
    )
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
        ssim, cs, *_ = _forward(_to_acc(img1), _to_acc(img2), w, padding, c1, c2)
        return ssim, cs

    @staticmethod
    def setup_context(ctx, inputs, output):
        _save_inputs(ctx, inputs)

    @staticmethod
    @without_autocast  # a backward run inside an autocast region computes in float32 too
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
    @without_autocast
    def jvp(ctx, t1, t2, *_):
        img1, img2, w = ctx.saved_tensors
        return _tangent(_to_acc(img1), _to_acc(img2), t1, t2, w, ctx.padding, ctx.c1, ctx.c2)


class _SSIMStatsCore(torch.autograd.Function):
    """(img1, img2) -> per-(B, C) means of the SSIM and cs maps; upstream is one scalar per (B, C)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(img1, img2, w, padding, c1, c2):
        ssim, cs, *_ = _forward(_to_acc(img1), _to_acc(img2), w, padding, c1, c2)
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
    @without_autocast  # a backward run inside an autocast region computes in float32 too
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
    @without_autocast
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
    ssim, _, parts, tiles = _forward(x, y, w, cfg.padding, cfg.C1, cfg.C2)
    n = ssim.shape[-2] * ssim.shape[-1]
    mean = ssim.mean(dim=(-2, -1))
    d = tiles.to_tiles(torch.cat(_moment_partials(*parts, (upstream / n)[..., None, None], None), dim=1))
    del ssim, parts  # the forward's maps are not needed past the partials
    gx, _ = _adjoint(tiles, d, w, cfg.padding, (x.shape[-2], x.shape[-1]), True, False)
    return mean, gx.to(img1.dtype)


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
