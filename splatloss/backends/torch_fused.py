"""The "torch" backend: SSIM with an analytic forward and backward in torch ops, on any device.

The image pair is padded first (``filtering.pad``), and everything below runs "valid" on the padded
images; the gradient goes back through the adjoint of the padding (a crop for "same", the mirrored
border folded back for "reflect").

**Local shifts.** Float32 moments cancel where a window is flat: ``var = E[x^2] - E[x]^2`` is a small
difference of numbers of magnitude ``level^2``, and the partials w.r.t. the second moments are of
order ``1 / C2``, so moments formed around a shift far from the window's level leave gradients
~1e-3 from float64 on flat images. The moments are therefore formed around the image's own values
near each window. Output columns are grouped in tiles of ``TILE_WIDTH = 4`` (``tile_width``: 3 for
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

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from ..config import SSIMConfig, accumulation_dtype
from ..filtering import pad
from .base import Backend

__all__ = ["TorchBackend", "BACKEND", "ssim_map", "ssim_stats", "ssim_mean_and_grad", "ssim_backward"]


# ----------------------------------------------------------------------------------------------
# The local-shift geometry (pure functions of tensors: compile-friendly)
# ----------------------------------------------------------------------------------------------

#: Output columns per column tile; each (input row, tile) has its own shift.
TILE_WIDTH = 4


def tile_width(k: int) -> int:
    """Column-tile width for a ``k``-tap window: :data:`TILE_WIDTH`, narrowed for ``k = 3`` so that
    every output column of a tile lies within ``k // 2`` of the tile's shift column (the shift pixel
    is then inside every window that uses it, and a non-finite one stays within its footprint)."""
    return min(TILE_WIDTH, k // 2 * 2 + 1)


def _split(t: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Last dim ``n m`` -> ``(n, m)`` (a reshape: vmap has no batching rule for ``unflatten``)."""
    return t.reshape(*t.shape[:-1], n, m)


def _pad_last(t: torch.Tensor, n: int) -> torch.Tensor:
    """``n`` zeros appended along the last dim (none: ``t`` itself; a no-op pad or slice is an alias,
    which the batched backward of ``autograd.grad(is_grads_batched=True)`` cannot take)."""
    return F.pad(t, (0, n)) if n else t


def _crop_last(t: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` entries of the last dim."""
    return t[..., :n] if n < t.shape[-1] else t


def _merge(t: torch.Tensor) -> torch.Tensor:
    """Last two dims ``(n, m)`` -> ``n m``."""
    return t.reshape(*t.shape[:-2], t.shape[-2] * t.shape[-1])


def _rows_valid(h: torch.Tensor, w: torch.Tensor, n: int) -> torch.Tensor:
    """Valid correlation along dim -3 with the taps ``w``: ``n`` output rows, as ``k`` multiply-adds of
    row slices into one fresh buffer (several times faster on the CPU than a ``(k, 1)`` depthwise
    convolution, and any device runs it)."""
    acc = h[..., 0:n, :, :] * w[0]
    for k in range(1, w.shape[0]):
        acc.addcmul_(h[..., k : k + n, :, :], w[k])
    return acc


class _Tiles:
    """A padded image pair cut into column tiles, with the per-(row, tile) shifts.

    For padded images ``[B, C, Hp, Wp]`` and a ``k``-tap window (``r = k // 2``) the map is
    ``[Ho, Wo] = [Hp - k + 1, Wp - k + 1]``. Output columns are grouped in ``nt`` tiles of ``tw``
    columns; tile ``J`` reads the ``tw + k - 1`` input columns from ``J tw`` on, and its shift column
    ``c_J`` is the centre input column of output column ``min(J tw + tw // 2, Wo - 1)`` (a real pixel
    for every padding). Per input row ``i``: ``sx[i, J] = x[i, c_J]``, ``sy[i, J] = y[i, c_J]``
    (separate shifts, so that both images' differences vanish exactly in their flat windows), and the
    per-tap differences ``dx[i, J, m] = x[i, J tw + m] - sx[i, J]``, ``[B, C, Hp, nt, tw + k - 1]``.
    Columns past ``Wp`` (the last tile's tail) read zeros and reach only map columns that are cropped.
    The differences are formed where they are used (:meth:`diffs`), not kept.
    """

    def __init__(self, xp: torch.Tensor, yp: torch.Tensor, w: torch.Tensor):
        k = w.shape[0]
        self.k, self.r, self.w = k, k // 2, w
        self.hp, self.wp = xp.shape[-2], xp.shape[-1]
        self.ho, self.wo = self.hp - k + 1, self.wp - k + 1
        tw = self.tw = tile_width(k)
        self.nt = -(-self.wo // tw)
        self.span = tw + k - 1
        cols = (torch.arange(self.nt, device=xp.device) * tw + tw // 2).clamp_max(self.wo - 1) + self.r
        # The shift is a constant of the computation: SSIM does not depend on it, no gradient flows.
        self.sx = xp.detach().index_select(-1, cols)  # [B, C, Hp, nt]
        self.sy = yp.detach().index_select(-1, cols)
        self.xp, self.yp = xp, yp
        # The adjoint's middle input columns, which every output of the tile reaches: a dense [tw, k - tw + 1]
        # matrix of taps (no structural zeros, which would carry a NaN to outputs outside its footprint).
        t, m = torch.arange(tw, device=w.device)[:, None], torch.arange(tw - 1, k, device=w.device)[None, :]
        self.mid = w[m - t]

    def diffs(self):
        """The per-tap differences ``(dx, dy)``, ``[B, C, Hp, nt, tw + k - 1]`` each (formed where they
        are used rather than kept: each is (tw + k - 1) / tw images in size)."""
        return self.patches(self.xp) - self.sx[..., None], self.patches(self.yp) - self.sy[..., None]

    def patches(self, t: torch.Tensor) -> torch.Tensor:
        """``[B, C, Hp, Wp]`` -> each tile's input columns, ``[B, C, Hp, nt, tw + k - 1]``."""
        ext = self.nt * self.tw + self.k - 1
        return _pad_last(t, ext - self.wp).unfold(-1, self.span, self.tw)

    def overlap_add(self, p: torch.Tensor) -> torch.Tensor:
        """Adjoint of :meth:`patches`: ``[B, C, Hp, nt, tw + k - 1]`` -> ``[B, C, Hp, Wp]``."""
        q, tw = -(-self.span // self.tw), self.tw  # q: tiles that one tile's input columns overlap, itself included
        out = None
        for j in range(q):  # the tile's j-th group of tw input columns lands in tile J + j
            piece = p[..., j * tw : min((j + 1) * tw, self.span)]
            piece = F.pad(piece, (0, tw - piece.shape[-1], j, q - 1 - j))
            out = piece if out is None else out + piece
        return _crop_last(_merge(out), self.wp)

    def hfilter(self, p: torch.Tensor) -> torch.Tensor:
        """The window along W within each tile: ``[..., nt, tw + k - 1]`` -> ``[..., nt, tw]`` (a
        matrix-vector product: no TF32 path, unlike a matrix product)."""
        return p.unfold(-1, self.k, 1) @ self.w

    def hadjoint(self, g: torch.Tensor) -> torch.Tensor:
        """Adjoint of :meth:`hfilter`: ``[..., nt, tw]`` -> ``[..., nt, tw + k - 1]``. Input column ``m``
        collects ``w[m - t] g[t]`` over the outputs ``t`` whose window holds it: all of them for the
        middle columns (one product), fewer at the tile's two ends (a few explicit terms)."""
        tw, k, w = self.tw, self.k, self.w
        col = [g[..., t : t + 1] for t in range(tw)]
        left = [sum(w[m - t] * col[t] for t in range(m + 1)) for m in range(tw - 1)]
        right = [sum(w[m - t] * col[t] for t in range(m - k + 1, tw)) for m in range(k, self.span)]
        # the middle columns as tw broadcast multiply-adds, not ``g @ self.mid``: a matrix product may run
        # in TF32 on CUDA (torch.set_float32_matmul_precision("high")), an elementwise one never does
        mid = col[0] * self.mid[0]
        for t in range(1, tw):
            mid = mid + col[t] * self.mid[t]
        return torch.cat(left + [mid] + right, dim=-1)

    def vfilter(self, h: torch.Tensor) -> torch.Tensor:
        """The window along H ("valid"): ``[B, N, Hp, nt, tw]`` -> ``[B, N, Ho, nt, tw]``."""
        return _rows_valid(h, self.w, self.ho)

    def vadjoint(self, d: torch.Tensor) -> torch.Tensor:
        """Adjoint of :meth:`vfilter`: ``[B, N, Ho, nt, tw]`` -> ``[B, N, Hp, nt, tw]``."""
        k = self.k
        return _rows_valid(F.pad(d, (0, 0, 0, 0, k - 1, k - 1)), self.w.flip(0), self.hp)

    def taus(self, k: int):
        """Input row ``i0 + k``'s shifts minus output row ``i0``'s common shifts (those of its centre
        row ``i0 + r``): ``(tau_x, tau_y)``, ``[B, C, Ho, nt, 1]``, exactly 0 where both rows of the
        tile have one level at the shift column."""
        rows, centre = slice(k, k + self.ho), slice(self.r, self.r + self.ho)
        tx = self.sx[..., rows, :] - self.sx[..., centre, :]
        ty = self.sy[..., rows, :] - self.sy[..., centre, :]
        return tx[..., None], ty[..., None]

    def centre_shifts(self):
        """Each output row's common shifts ``(Sx, Sy)``, ``[B, C, Ho, nt, 1]``."""
        centre = slice(self.r, self.r + self.ho)
        return self.sx[..., centre, :, None], self.sy[..., centre, :, None]

    def rebase(self, h1x: torch.Tensor, h1y: torch.Tensor):
        """Sums over the window's rows that move each input row's moments from its own shift to the
        output row's common one (``x - Sx = (x - sx(i)) + tau_x``): ``(m_x, m_y, q_xx, q_yy, q_xy,
        c_xx, c_yy, c_xy)`` with ``m_x = sum_k w tau_x``, ``q_xx = sum_k w tau_x^2``, ``q_xy = sum_k w
        tau_x tau_y`` (``[B, C, Ho, nt, 1]``) and ``c_xx = sum_k w tau_x h1x``, ``c_yy = sum_k w tau_y
        h1y``, ``c_xy = sum_k w (tau_x h1y + tau_y h1x)`` (``[B, C, Ho, nt, tw]``) for row-wise
        horizontal sums ``h1x``, ``h1y`` ``[B, C, Hp, nt, tw]``. Each tau is formed per row pair, so
        it is exactly 0 in flat windows (a difference of sums would not be)."""
        acc = None
        for k in range(self.k):
            tx, ty = self.taus(k)
            wtx, wty = self.w[k] * tx, self.w[k] * ty
            a, b = h1x[..., k : k + self.ho, :, :], h1y[..., k : k + self.ho, :, :]
            if acc is None:
                acc = [wtx, wty, wtx * tx, wty * ty, wtx * ty, wtx * a, wty * b, torch.addcmul(wtx * b, wty, a)]
                continue
            m_x, m_y, q_xx, q_yy, q_xy, c_xx, c_yy, c_xy = acc
            # the map-sized sums in place (fresh products that no backward saves), the small ones not
            acc = [
                m_x + wtx,
                m_y + wty,
                torch.addcmul(q_xx, wtx, tx),
                torch.addcmul(q_yy, wty, ty),
                torch.addcmul(q_xy, wtx, ty),
                c_xx.addcmul_(wtx, a),
                c_yy.addcmul_(wty, b),
                c_xy.addcmul_(wtx, b).addcmul_(wty, a),
            ]
        return acc

    def to_map(self, t: torch.Tensor) -> torch.Tensor:
        """Tile layout ``[..., Ho, nt, tw]`` (or ``[..., Ho, nt, 1]``, broadcast) -> map ``[..., Ho, Wo]``."""
        t = t.expand(*t.shape[:-1], self.tw)
        return _crop_last(_merge(t), self.wo)

    def to_tiles(self, m: torch.Tensor) -> torch.Tensor:
        """Map ``[..., Ho, Wo]`` -> tile layout ``[..., Ho, nt, tw]``, zeros past ``Wo``."""
        return _split(_pad_last(m, self.nt * self.tw - self.wo), self.nt, self.tw)


def _pad_adjoint(g: torch.Tensor, padding: str, r: int, size: Tuple[int, int]) -> torch.Tensor:
    """Adjoint of :func:`~splatloss.filtering.pad`: the padded image's gradient back onto the image
    (cropped for "same"; for "reflect" the mirrored border's gradient folded back onto the pixels it
    copied)."""
    if padding == "valid":
        return g
    if padding == "same":
        return g[..., r : r + size[0], r : r + size[1]]
    shape = g.shape[:2] + tuple(size)
    return torch.ops.aten.reflection_pad2d_backward(g, g.new_empty(shape), [r, r, r, r])


# ----------------------------------------------------------------------------------------------
# SSIM algebra
# ----------------------------------------------------------------------------------------------


def _moments(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, padding: str):
    """The tiles and the moments of ``x'' = x - Sx``, ``y'' = y - Sy`` around each map pixel's
    common shifts: ``(tiles, (mx, my, exx, eyy, exy, Sx, Sy))``, each map ``[B, C, H', W']``."""
    r = w.shape[0] // 2
    tiles = _Tiles(pad(x, padding, r), pad(y, padding, r), w)
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
    ``B2 = A2 + max(0, (exx + eyy - 2 exy) - (mx - my)^2)`` (the local variance of ``x - y``), so
    luminance and cs never exceed 1 through rounding and are exactly 1 for identical images; both are
    kept >= -1 too.
    """
    ux, uy = sx + mx, sy + my
    dm = mx - my
    du = (sx - sy) + dm
    a1 = 2 * ux * uy + c1
    b1 = a1 + du * du
    a2 = 2 * (exy - mx * my) + c2
    b2 = a2 + ((exx + eyy - 2 * exy) - dm * dm).clamp_min(0)
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
    d_mx, d_my, d_e2, d_exy = d.chunk(4, dim=1)
    a_e2, a_exy = tiles.vadjoint(d_e2), tiles.vadjoint(d_exy)
    a_mx = tiles.vadjoint(d_mx) if need_x else None
    a_my = tiles.vadjoint(d_my) if need_y else None
    del d, d_mx, d_my
    # V: the vertical adjoint of the shift corrections, sum_i0 w [2 d_e2 tau_x + d_exy tau_y] per input row.
    vx = vy = None
    k = w.shape[0]
    for i in range(k):
        tx, ty = tiles.taus(i)
        rows = (0, 0, 0, 0, i, k - 1 - i)  # output row i0 -> input row i0 + i
        ex, ey = F.pad(w[i] * (2 * d_e2 * tx + d_exy * ty), rows), F.pad(w[i] * (2 * d_e2 * ty + d_exy * tx), rows)
        vx, vy = (ex, ey) if vx is None else (vx + ex, vy + ey)
    del d_e2, d_exy, ex, ey
    # Along W within each tile, the per-tap differences dx = x - sx(i, J) factor out of the sum over
    # the tile's outputs: g = H^T(Dm + V) + 2 dx H^T(De2) + dy H^T(Dxy), then the tiles overlap-add.
    b_e2, b_xy = tiles.hadjoint(a_e2), tiles.hadjoint(a_exy)
    del a_e2, a_exy
    r = k // 2
    gx = gy = None
    dx, dy = tiles.diffs()
    # in place on fresh tensors that no backward saves: one patch-sized buffer per gradient
    if need_x:
        gx = tiles.hadjoint(a_mx.add_(vx)).addcmul_(dx, b_e2, value=2).addcmul_(dy, b_xy)
        gx = _pad_adjoint(tiles.overlap_add(gx), padding, r, size)
    if need_y:
        gy = tiles.hadjoint(a_my.add_(vy)).addcmul_(dy, b_e2, value=2).addcmul_(dx, b_xy)
        gy = _pad_adjoint(tiles.overlap_add(gy), padding, r, size)
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
