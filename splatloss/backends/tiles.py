"""The local-shift tile geometry of the torch-ops SSIM: column tiles of the padded images, one shift
per input row and tile, and the filters and adjoints in that layout.

Used by the "torch" backend (:mod:`splatloss.backends.torch_fused`, where the algorithm and its
adjoint are derived: "Local shifts") and by the masked composition (:mod:`splatloss.backends.masked`).
Pure functions of tensors and one class of views over them: compile-friendly, differentiable torch
ops (double backward works).
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F

__all__ = ["TILE_WIDTH", "Tiles", "pad_adjoint", "tile_adjoint", "tile_width"]


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


class Tiles:
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
                acc = [wtx, wty, wtx * tx, wty * ty, wtx * ty, wtx * a, wty * b, wtx * b + wty * a]
                continue
            m_x, m_y, q_xx, q_yy, q_xy, c_xx, c_yy, c_xy = acc
            # the map-sized sums in place (fresh products that no backward saves), the small ones not
            acc = [
                m_x + wtx,
                m_y + wty,
                torch.addcmul(q_xx, wtx, tx),
                torch.addcmul(q_yy, wty, ty),
                torch.addcmul(q_xy, wtx, ty),
                # each product rounded apart (no fused multiply-add) and the cross sum gaining both at
                # once: for identical images that is 2 (w tau_x a) exactly, so c_xy stays bitwise
                # 2 c_xx, E[x'y'] bitwise E[x'^2], and the SSIM map exactly 1
                c_xx.add_(wtx * a),
                c_yy.add_(wty * b),
                c_xy.add_(wtx * b + wty * a),
            ]
        return acc

    def to_map(self, t: torch.Tensor) -> torch.Tensor:
        """Tile layout ``[..., Ho, nt, tw]`` (or ``[..., Ho, nt, 1]``, broadcast) -> map ``[..., Ho, Wo]``."""
        t = t.expand(*t.shape[:-1], self.tw)
        return _crop_last(_merge(t), self.wo)

    def to_tiles(self, m: torch.Tensor) -> torch.Tensor:
        """Map ``[..., Ho, Wo]`` -> tile layout ``[..., Ho, nt, tw]``, zeros past ``Wo``."""
        return _split(_pad_last(m, self.nt * self.tw - self.wo), self.nt, self.tw)


def pad_adjoint(g: torch.Tensor, padding: str, r: int, size: Tuple[int, int]) -> torch.Tensor:
    """Adjoint of :func:`~splatloss.filtering.pad`: the padded image's gradient back onto the image
    (cropped for "same"; for "reflect" the mirrored border's gradient folded back onto the pixels it
    copied)."""
    if padding == "valid":
        return g
    if padding == "same":
        return g[..., r : r + size[0], r : r + size[1]]
    shape = g.shape[:2] + tuple(size)
    return torch.ops.aten.reflection_pad2d_backward(g, g.new_empty(shape), [r, r, r, r])


def tile_adjoint(tiles, d, w, need_x: bool, need_y: bool):
    """The gradients on the padded grid (``[B, C, Hp, Wp]``, None where not needed) of the moments
    around the tiles' shifts, for their partials ``d = (d_mx, d_my, d_e2, d_exy)`` stacked in tile
    layout ``[B, 4C, Ho, nt, tw]`` (zeros past the map): ``d_mx`` w.r.t. the window sum of ``x - Sx``,
    ``d_e2`` w.r.t. those of ``(x - Sx)^2`` and ``(y - Sy)^2``, ``d_exy`` w.r.t. that of
    ``(x - Sx)(y - Sy)``."""
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
    gx = gy = None
    dx, dy = tiles.diffs()
    # in place on fresh tensors that no backward saves: one patch-sized buffer per gradient
    if need_x:
        gx = tiles.hadjoint(a_mx.add_(vx)).addcmul_(dx, b_e2, value=2).addcmul_(dy, b_xy)
        gx = tiles.overlap_add(gx)
    if need_y:
        gy = tiles.hadjoint(a_my.add_(vy)).addcmul_(dy, b_e2, value=2).addcmul_(dx, b_xy)
        gy = tiles.overlap_add(gy)
    return gx, gy
