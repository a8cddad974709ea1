"""Masked SSIM statistics as one composition of torch ops: the shared fallback of every backend
that does not compute them itself (:attr:`splatloss.backends.base.Backend.fused_masks`).

What is computed is the masked semantics of ``docs/conventions.md`` ("Masks"): the window statistics
normalised by the filtered mask, ``mu_x = F(M X) / F(M)`` and likewise for the second moments, the mask
padded with ones for "same" and mirrored for "reflect", the maps averaged with the mask at each map
position's centre, an empty channel counting as SSIM 1.

What runs: the six filtered quantities ``F(M), F(M x''), F(M y''), F(M x''^2), F(M y''^2), F(M x'' y'')``
of the images' differences against local shifts (``x'' = x - Sx``), in the accumulation dtype. As in
the torch backend (:mod:`splatloss.backends.torch_fused`, "Local shifts"; the geometry in
:mod:`splatloss.backends.tiles`), each input row and tile of 4 map columns has its own shifts, the
images' values at the tile's shift column, and each row's horizontal sums are re-based to the map
row's shifts with the row's filtered mask (:func:`_window_sums`), so that the differences are
exactly 0 in flat windows: float32 variances are then not round-off against ``C2`` there. The shifts
do not look at the mask: where a window's shift pixel has weight 0 and another level than its
weighted pixels, the cancellation is back (binary masks with a 3-tap window on flat images:
gradients 2e-4 to 8e-4 from float64; with 7 to 13 taps within 2.2e-5). Gradients
to both images by autograd through these ops for the maps, and for the per-channel means (what ssim,
ms_ssim and the losses use) by the analytic backward of :class:`_MaskedStats` (the unmasked moments'
adjoint around the same shifts, times the mask), which keeps only the inputs for backward and
recomputes the forward there. A map position with ``F(M) = 0`` has a zero centre weight, so its
statistics are computed with ``F(M)`` replaced by 1 and never reach the value or the gradient.
"""

from __future__ import annotations

from typing import Tuple

import torch

from ..config import SSIMConfig, accumulation_dtype, without_autocast
from ..filtering import pad
from .tiles import Tiles, pad_adjoint, tile_adjoint

__all__ = ["masked_ssim_map", "masked_ssim_stats", "masked_stats_backward", "weighted_channel_mean"]

Tensor = torch.Tensor


def masked_ssim_map(img1: Tensor, img2: Tensor, mask: Tensor, cfg: SSIMConfig) -> Tuple[Tensor, Tensor, Tensor]:
    """``(ssim_map, cs_map, centre_weights)``, each ``[B, C, H', W']`` in the accumulation dtype,
    gradients to both images by autograd through the torch ops.

    ``mask`` is a float tensor that broadcasts to the images as ``(B or 1, 1 or C, H, W)``.
    """
    acc = accumulation_dtype(img1.dtype)
    x, y = img1.to(acc), img2.to(acc)
    m = mask.to(acc).expand(x.shape)
    w = cfg.window_1d(acc, x.device)
    *_, lum, cs, centre = _stats(x, y, m, w, cfg.padding, cfg.C1, cfg.C2)
    return lum * cs, cs, centre


def weighted_channel_mean(values: Tensor, weights: Tensor) -> Tensor:
    """Per channel ``sum w v / sum w`` ``[B, C]``; 1 with zero gradient where the weights sum to 0."""
    den = weights.sum(dim=(-2, -1))
    num = (weights * values).sum(dim=(-2, -1))
    nonempty = den > 0
    return torch.where(nonempty, num / torch.where(nonempty, den, torch.ones_like(den)), torch.ones_like(num))


def _hfilter(tiles: Tiles, p: Tensor) -> Tensor:
    """:meth:`Tiles.hfilter <splatloss.backends.tiles.Tiles.hfilter>` as ``k`` multiply-adds of column
    slices into one fresh buffer: no ``k``-fold copy of the patches, which a matrix-vector product over
    their unfolded windows makes."""
    tw, w = tiles.tw, tiles.w
    acc = p[..., 0:tw] * w[0]
    for j in range(1, w.shape[0]):
        acc.addcmul_(p[..., j : j + tw], w[j])
    return acc


def _window_sums(x: Tensor, y: Tensor, m: Tensor, w: Tensor, padding: str):
    """The tiles, the padded mask, and at each map position the filtered mask ``F(M)`` and the filtered
    weighted moments around the position's common shifts ``(Sx, Sy)``: ``F(M x'')``, ``F(M y'')``,
    ``F(M x''^2)``, ``F(M y''^2)``, ``F(M x'' y'')`` with ``x'' = x - Sx``, ``y'' = y - Sy``; then ``Sx``,
    ``Sy``; each a map ``[B, C, H', W']``.

    The horizontal pass sums ``M dx``, ``M dx^2``, ``M dx dy`` (and ``y``'s) with ``dx = x - sx(i, J)``,
    the differences against the shift of input row ``i`` and column tile ``J``
    (:class:`~splatloss.backends.tiles.Tiles`). The vertical pass moves each row's sums to the output
    row's shifts with ``tau_x = sx(i, J) - Sx`` and the row's filtered mask ``h_m = F_h(M)`` (where the
    unmasked moments have the taps' sum)::

        F_h(M x'')     = h_1x + tau_x h_m
        F_h(M x''^2)   = h_2x + tau_x (h_1x + F_h(M x''))
        F_h(M x'' y'') = h_xy + (tau_x (h_1y + F_h(M y'')) + tau_y (h_1x + F_h(M x''))) / 2

    (the symmetric last form makes ``F(M x'' y'')`` bitwise equal to ``F(M x''^2)`` for identical
    images). Each difference and tau is formed per pixel or per row pair, so all of them are exactly 0
    in flat windows."""
    k = w.shape[0]
    r = k // 2
    tiles = Tiles(pad(x, padding, r), pad(y, padding, r), w)
    M = pad(m, padding, r, r, 1.0)
    pm = tiles.patches(M)
    dx, dy = tiles.diffs()
    # one weighted difference at a time (a patch-sized buffer is (tw + k - 1) / tw images)
    t = pm * dx
    h_1x, h_2x, h_xy = _hfilter(tiles, t), _hfilter(tiles, t * dx), _hfilter(tiles, t * dy)
    t = pm * dy
    h_1y, h_2y = _hfilter(tiles, t), _hfilter(tiles, t * dy)
    h_m = _hfilter(tiles, pm)
    del t, pm, dx, dy
    sums = None
    for i in range(k):
        tx, ty = tiles.taus(i)
        rows = slice(i, i + tiles.ho)
        a, b, hm = h_1x[..., rows, :, :], h_1y[..., rows, :, :], h_m[..., rows, :, :]
        ax, ay = torch.addcmul(a, tx, hm), torch.addcmul(b, ty, hm)  # F_h(M x''), F_h(M y'')
        # products and sums as separate roundings (no fused multiply-add): for identical images the
        # cross term is then bitwise the square term
        px, py = tx * (a + ax), ty * (b + ay)
        pxy = tx * (b + ay) + ty * (a + ax)
        terms = (hm, ax, ay, h_2x[..., rows, :, :] + px, h_2y[..., rows, :, :] + py, h_xy[..., rows, :, :] + 0.5 * pxy)
        if sums is None:
            sums = [t * w[i] for t in terms]
        else:  # in place on the fresh sums (no backward saves them), the window's rows in order
            for acc, t in zip(sums, terms):
                acc.addcmul_(t, w[i])
    return tiles, M, tuple(tiles.to_map(t) for t in (*sums, *tiles.centre_shifts()))


def _stats(x: Tensor, y: Tensor, m: Tensor, w: Tensor, padding: str, c1: float, c2: float):
    """Forward quantities in the accumulation dtype: the tiles and the padded mask, ``W = F(M)`` (1
    where it is 0), the means of ``x - Sx`` and ``y - Sy``, the true means, the SSIM algebra's
    denominators, luminance, cs and the centre weights."""
    tiles, M, (W, fx, fy, fxx, fyy, fxy, sx, sy) = _window_sums(x, y, m, w, padding)
    # a window without mask weight: W = 1 and no shift, so its means are 0 and its SSIM and cs 1 (as
    # the statistics F(M P) / F(M) with 0 / 0 read as 0); its centre weight is 0
    nonempty = W > 0
    W = torch.where(nonempty, W, torch.ones_like(W))
    sx, sy = torch.where(nonempty, sx, torch.zeros_like(sx)), torch.where(nonempty, sy, torch.zeros_like(sy))
    mu_x, mu_y = fx / W, fy / W
    dmu = mu_x - mu_y
    mx, my = mu_x + sx, mu_y + sy
    # each denominator is its numerator plus a non-negative difference (the variance of x - y, and
    # the means' squared difference): round-off cannot put a ratio above 1, identical windows give
    # exactly 1
    du = (sx - sy) + dmu
    a1 = 2 * mx * my + c1
    a2 = 2 * (fxy / W - mu_x * mu_y) + c2
    b1 = a1 + du * du
    b2 = a2 + ((fxx + fyy - 2 * fxy) / W - dmu * dmu).clamp(min=0)
    lum = a1 / b1
    cs = a2 / b2
    r = w.shape[0] // 2
    centre = m[..., r : r + cs.shape[-2], r : r + cs.shape[-1]] if padding == "valid" else m
    return tiles, M, W, mu_x, mu_y, mx, my, b1, b2, lum, cs, centre


def masked_stats_backward(
    x: Tensor,
    y: Tensor,
    m: Tensor,
    w: Tensor,
    padding: str,
    c1: float,
    c2: float,
    g_s,
    g_c,
    need_x: bool = True,
    need_y: bool = True,
):
    """Gradients ``(d v / d x, d v / d y)`` (None where not needed) of ``v = sum(g_s * ssim_mean +
    g_c * cs_mean)`` under the masked semantics, in torch ops (differentiable in the upstreams and
    inputs, so it also serves a backward that must itself be differentiable).

    ``x``, ``y`` are ``[B, C, H, W]`` and ``m`` the mask expanded to them, all in the accumulation
    dtype; ``w`` the 1-D window in that dtype; ``g_s`` / ``g_c`` ``[B, C]`` upstreams or None. The
    adjoint of the normalised statistics (each ``N / W`` with ``N = F(M P)``), recomputing the
    forward from ``x, y, m``."""
    tiles, M, W, mu_x, mu_y, mx, my, b1, b2, lum, cs, centre = _stats(x, y, m, w, padding, c1, c2)
    z = centre.sum(dim=(-2, -1), keepdim=True)
    scale = torch.where(z > 0, 1 / torch.where(z > 0, z, torch.ones_like(z)), torch.zeros_like(z)) * centre
    g_s = torch.zeros_like(z[..., 0, 0]) if g_s is None else g_s
    g_c = torch.zeros_like(z[..., 0, 0]) if g_c is None else g_c
    h_s = g_s.to(x.dtype)[..., None, None] * scale  # dv / d ssim_map
    h_c = g_c.to(x.dtype)[..., None, None] * scale  # dv / d cs_map
    # partials of the maps' value w.r.t. the true means, the variances and the covariance
    d_lum = h_s * cs  # dv / d lum
    d_mx = d_lum * 2 * (my - lum * mx) / b1
    d_my = d_lum * 2 * (mx - lum * my) / b1
    d_cs = h_s * lum + h_c
    d_cov = d_cs * 2 / b2
    d_var = -d_cs * cs / b2
    # to the normalised moments of x - Sx and y - Sy (mu, E[x''^2], E[x'' y'']), then to their window
    # sums N = F(M P) through 1 / W
    a_x = (d_mx - 2 * d_var * mu_x - d_cov * mu_y) / W
    a_y = (d_my - 2 * d_var * mu_y - d_cov * mu_x) / W
    # the adjoint of the window sums around the tiles' shifts (the unmasked moments' adjoint), times
    # each pixel's weight, then the padding's adjoint
    d = tiles.to_tiles(torch.cat([a_x, a_y, d_var / W, d_cov / W], dim=1))
    del W, mu_x, mu_y, mx, my, b1, b2, lum, cs, centre, scale, h_s, h_c, d_lum, d_mx, d_my, d_cs, d_cov, d_var, a_x, a_y
    gX, gY = tile_adjoint(tiles, d, w, need_x, need_y)
    r = w.shape[0] // 2
    gX = None if gX is None else pad_adjoint(M * gX, padding, r, x.shape[-2:])
    gY = None if gY is None else pad_adjoint(M * gY, padding, r, y.shape[-2:])
    return gX, gY


class _MaskedStats(torch.autograd.Function):
    """Masked ``(ssim_mean, cs_mean)`` with the analytic backward: the adjoint of the normalised
    statistics (each ``N / W`` with ``N = F(M P)``), recomputing the forward from ``x, y, m``. The
    forward takes no ``ctx`` (``setup_context`` saves the inputs), so ``torch.func`` transforms run it;
    its backward is torch ops, differentiable again."""

    @staticmethod
    def forward(img1, img2, mask, cfg):
        acc = accumulation_dtype(img1.dtype)
        x, y = img1.to(acc), img2.to(acc)
        m = mask.to(acc).expand(x.shape)
        w = cfg.window_1d(acc, x.device)
        *_, lum, cs, centre = _stats(x, y, m, w, cfg.padding, cfg.C1, cfg.C2)
        return weighted_channel_mean(lum * cs, centre), weighted_channel_mean(cs, centre)

    @staticmethod
    def setup_context(ctx, inputs, output):
        img1, img2, mask, cfg = inputs
        ctx.save_for_backward(img1, img2, mask)
        ctx.cfg = cfg

    @staticmethod
    @without_autocast  # a backward run inside an autocast region computes in float32 too
    def backward(ctx, g_s, g_c):
        img1, img2, mask = ctx.saved_tensors
        cfg = ctx.cfg
        acc = accumulation_dtype(img1.dtype)
        x, y = img1.to(acc), img2.to(acc)
        m = mask.to(acc).expand(x.shape)
        w = cfg.window_1d(acc, x.device)
        need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        gX, gY = masked_stats_backward(x, y, m, w, cfg.padding, cfg.C1, cfg.C2, g_s, g_c, need_x, need_y)
        gx = gX.to(img1.dtype) if need_x else None
        gy = gY.to(img2.dtype) if need_y else None
        return gx, gy, None, None


def masked_ssim_stats(img1: Tensor, img2: Tensor, mask: Tensor, cfg: SSIMConfig) -> Tuple[Tensor, Tensor]:
    """``(ssim_mean, cs_mean)``, each ``[B, C]``, under the masked semantics.

    Gradients to the images by the analytic backward (the adjoint of the normalised statistics). A
    mask that requires grad (with grad mode on) takes the maps' autograd composition instead, which
    also gives the gradient to the mask: through the filtered mask of every window statistic and the
    centre weights of the means."""
    if mask.requires_grad and torch.is_grad_enabled():
        smap, cmap, centre = masked_ssim_map(img1, img2, mask, cfg)
        return weighted_channel_mean(smap, centre), weighted_channel_mean(cmap, centre)
    return _MaskedStats.apply(img1, img2, mask.detach(), cfg)
