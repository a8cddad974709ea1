"""Rendering Gaussians: gsplat's CUDA rasterizer, or gsplat's torch pieces plus our compositor on CPU.

``render(gaussians, view)`` returns the same things on both paths (one camera, the camera
dimension squeezed):

- ``image [H, W, 3]``, ``alpha [H, W, 1]``;
- ``means2d [N, 2]`` (pixel coordinates; its ``.grad`` is kept after backward, for densification),
  ``radii [N, 2]`` int32 (0 = not drawn), ``depths [N]``, ``conics [N, 3]``;
- ``width``, ``height``, ``n_cameras`` (= 1), ``backend``.

The CPU path ("cpu"):

1. covariances, projection and SH colour by ``gsplat.cuda._torch_impl``
   (``_quat_scale_to_covar_preci``, ``_fully_fused_projection``, ``_spherical_harmonics``), with
   gsplat's defaults (eps2d = 0.3, near plane 0.01, radius 3.33 sigma per axis); the colour is
   the SH of the Gaussians' ``active_sh_degree`` evaluated at the direction from the camera centre
   to the mean, ``+ 0.5``, clamped at 0 (gsplat's ``rasterization`` does the same on CUDA);
2. tile intersection: :func:`isect_tiles`, a vectorised twin of gsplat's ``_isect_tiles`` (which
   loops in Python over every Gaussian and tile), tested to produce the same (tile, depth) order;
3. compositing: :class:`_Composite`, an ``autograd.Function`` with a hand-written backward over
   padded ``[tiles, pixels, K]`` blocks, where K is the longest depth-sorted list in a group of
   tiles (tiles are grouped by list length to keep padding small). It follows gsplat's CUDA
   rasterizer exactly: pixel centres at +0.5, ``alpha = min(0.999, opacity * exp(-sigma))``,
   Gaussians with ``sigma < 0`` or ``alpha < 1/255`` skipped, a pixel stops at the Gaussian that
   would bring its transmittance to <= 1e-4 (that one excluded), background added as
   ``bg * T_final``; in backward, clamped alphas pass no gradient to opacity or shape (as gsplat).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["render", "isect_tiles", "composite_tiles"]

ALPHA_MIN = 1.0 / 255.0
ALPHA_MAX = 0.999
T_MIN = 1e-4


# ------------------------------------------------------------------------------------------------
# Tile intersection (vectorised)
# ------------------------------------------------------------------------------------------------


@torch.no_grad()
def isect_tiles(means2d: Tensor, radii: Tensor, depths: Tensor, tile_size: int, tile_width: int, tile_height: int):
    """Every (tile, Gaussian) overlap for one camera, sorted by tile then depth.

    Same tile ranges as gsplat's ``_isect_tiles`` (``floor((m - r) / ts)`` to ``ceil((m + r) / ts)``
    clamped to the grid, Gaussians with a zero radius dropped).

    Args:
        means2d ``[N, 2]``, radii ``[N, 2]`` (int), depths ``[N]``.

    Returns:
        ``(tile_ids [M], gauss_ids [M], tiles_per_gauss [N])``, int64, sorted by (tile, depth).
    """
    n = means2d.shape[0]
    tm = means2d.detach() / tile_size
    tr = radii.to(tm.dtype) / tile_size
    lo = torch.floor(tm - tr).long()
    hi = torch.ceil(tm + tr).long()
    lo[:, 0].clamp_(0, tile_width)
    lo[:, 1].clamp_(0, tile_height)
    hi[:, 0].clamp_(0, tile_width)
    hi[:, 1].clamp_(0, tile_height)
    span = hi - lo  # [N, 2]
    per = span[:, 0] * span[:, 1] * (radii > 0).all(dim=-1)
    total = int(per.sum())
    gid = torch.repeat_interleave(torch.arange(n), per)  # [M]
    start = torch.cumsum(per, 0) - per
    local = torch.arange(total) - start[gid]
    w = span[gid, 0]
    tx = lo[gid, 0] + local % w.clamp_min(1)
    ty = lo[gid, 1] + local // w.clamp_min(1)
    tile = ty * tile_width + tx
    # Sort by (tile, depth): depth rank breaks ties inside a tile.
    rank = torch.empty(n, dtype=torch.long)
    rank[torch.argsort(depths.detach(), stable=True)] = torch.arange(n)
    key = tile * n + rank[gid]
    order = torch.argsort(key)
    return tile[order], gid[order], per


# ------------------------------------------------------------------------------------------------
# Compositing: autograd.Function with an analytic backward
# ------------------------------------------------------------------------------------------------


def _forward_block(pix, m2d, con, opa, col, bg):
    """Shared forward pieces. pix [P, 2] or [T, P, 2]; m2d [T, K, 2]; con [T, K, 3]; opa [T, K]."""
    if pix.dim() == 2:
        pix = pix[None]
    dx = pix[:, :, None, 0] - m2d[:, None, :, 0]  # [T, P, K]
    dy = pix[:, :, None, 1] - m2d[:, None, :, 1]
    a = con[:, None, :, 0]
    b = con[:, None, :, 1]
    c = con[:, None, :, 2]
    sigma = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy
    vis = torch.exp(-sigma)
    raw = opa[:, None, :] * vis  # [T, P, K]
    keep = (sigma >= 0) & (raw >= ALPHA_MIN)
    al = torch.where(keep, raw.clamp_max(ALPHA_MAX), torch.zeros_like(raw))
    log1m = torch.log1p(-al)
    incl = torch.cumsum(log1m, dim=2)  # log T after each Gaussian
    live = incl > math.log(T_MIN)  # stops at the one that would bring T to <= 1e-4 (excluded)
    al = torch.where(live, al, torch.zeros_like(al))
    log1m = torch.where(live, log1m, torch.zeros_like(log1m))
    incl = torch.cumsum(log1m, dim=2)
    t_excl = torch.exp(incl - log1m)  # T before each Gaussian  [T, P, K]
    w = al * t_excl
    t_final = torch.exp(incl[:, :, -1])  # [T, P]
    img = torch.einsum("tpk,tkc->tpc", w, col) + t_final[..., None] * bg
    return dx, dy, vis, raw, keep & live, al, t_excl, w, t_final, img


class _Composite(torch.autograd.Function):
    """Front-to-back alpha compositing of depth-sorted Gaussians over blocks of tile pixels."""

    @staticmethod
    def forward(ctx, pix, m2d, con, opa, col, bg):
        dx, dy, vis, raw, active, al, t_excl, w, t_final, img = _forward_block(pix, m2d, con, opa, col, bg)
        ctx.save_for_backward(pix, m2d, con, opa, col, bg)
        return img, 1.0 - t_final

    @staticmethod
    def backward(ctx, g_img, g_alpha):
        pix, m2d, con, opa, col, bg = ctx.saved_tensors
        # Recompute the forward pieces instead of saving ten [T, P, K] tensors.
        dx, dy, vis, raw, active, al, t_excl, w, t_final, _ = _forward_block(pix, m2d, con, opa, col, bg)
        g_img = g_img.contiguous()
        g_col = torch.einsum("tpk,tpc->tkc", w, g_img)
        cg = torch.einsum("tkc,tpc->tpk", col, g_img)  # c_k . dL/dC  [T, P, K]
        wcg = w * cg
        # S_k = sum_{j > k} w_j (c_j . dL/dC): suffix sum, exclusive.
        suffix = wcg.sum(dim=2, keepdim=True) - torch.cumsum(wcg, dim=2)
        bg_g = (g_img * bg).sum(-1)  # [T, P]
        tail = (t_final * (bg_g - g_alpha))[..., None]  # dC/dT_final terms (alpha = 1 - T_final)
        g_al = t_excl * cg - (suffix + tail) / (1.0 - al)
        # Only active, unclamped alphas pass gradient to opacity and shape (gsplat's backward).
        g_al = torch.where(active & (raw <= ALPHA_MAX), g_al, torch.zeros_like(g_al))
        g_raw = g_al  # d alpha / d raw = 1 where it passes
        g_opa = (g_raw * vis).sum(dim=1)
        g_sigma = -g_raw * raw  # [T, P, K]
        g_a = 0.5 * (g_sigma * dx * dx).sum(dim=1)
        g_b = (g_sigma * dx * dy).sum(dim=1)
        g_c = 0.5 * (g_sigma * dy * dy).sum(dim=1)
        g_con = torch.stack([g_a, g_b, g_c], dim=-1)
        a = con[:, None, :, 0]
        b = con[:, None, :, 1]
        c = con[:, None, :, 2]
        g_mx = -(g_sigma * (a * dx + b * dy)).sum(dim=1)
        g_my = -(g_sigma * (b * dx + c * dy)).sum(dim=1)
        g_m2d = torch.stack([g_mx, g_my], dim=-1)
        g_bg = None
        if ctx.needs_input_grad[5]:
            g_bg = (g_img * t_final[..., None]).sum(dim=(0, 1))
        return None, g_m2d, g_con, g_opa, g_col, g_bg


def composite_tiles(pix, m2d, con, opa, col, bg):
    """Differentiable compositing of one block: pixels ``pix [P, 2]`` (or ``[T, P, 2]``) against
    per-tile depth-sorted Gaussians ``m2d [T, K, 2]``, ``con [T, K, 3]``, ``opa [T, K]``,
    ``col [T, K, C]`` on background ``bg [C]``. Returns ``(image [T, P, C], alpha [T, P])``."""
    return _Composite.apply(pix, m2d, con, opa, col, bg)


# ------------------------------------------------------------------------------------------------
# render()
# ------------------------------------------------------------------------------------------------


def _check_view(view):
    for attr in ("viewmat", "K", "width", "height"):
        if not hasattr(view, attr):
            raise TypeError(
                f"render: view must have viewmat, K, width and height, got {type(view).__name__} without {attr!r}"
            )
    if tuple(view.viewmat.shape) != (4, 4) or tuple(view.K.shape) != (3, 3):
        raise ValueError(
            f"render: expected viewmat [4, 4] and K [3, 3], got {tuple(view.viewmat.shape)} and {tuple(view.K.shape)}"
        )


def render(
    gaussians,
    view,
    *,
    backend: str = "auto",
    background=None,
    tile_size: int = 8,
    groups: int = 4,
    max_per_tile: int | None = None,
    compositor: str = "auto",
) -> dict:
    """Render ``gaussians`` (a :class:`~splatloss.splat.gaussians.Gaussians`) from one camera.

    Args:
        view: anything with ``viewmat [4, 4]`` (world->camera), ``K [3, 3]``, ``width``, ``height``
            (a :class:`~splatloss.splat.scenes.View`).
        backend: "auto" (CUDA when the Gaussians are on a CUDA device, else CPU), "cuda" or "cpu".
        background: RGB ``[3]`` (tensor or sequence) added where transmittance remains; black if None.
        tile_size: CPU tile side in pixels (on 64x64 views with 3000 Gaussians, 4 and 8 measured
            the same, 16 about 20 % slower).
        groups: CPU: tiles are sorted by list length and split into this many groups, each padded to
            its own longest list.
        max_per_tile: CPU: keep at most this many (nearest) Gaussians per tile; None keeps all
            (exactly gsplat's result).
        compositor: CPU: "numba" (per-pixel loops compiled by numba, with early termination: the
            fast one), "torch" (padded tensor blocks, :class:`_Composite`) or "auto" (numba when
            importable). Both compute the same numbers (tested against each other).

    Returns:
        dict, see the module docstring.
    """
    _check_view(view)
    if backend not in ("auto", "cuda", "cpu"):
        raise ValueError(f"render: backend must be 'auto', 'cuda' or 'cpu', got {backend!r}")
    dev = gaussians.means.device
    if backend == "auto":
        backend = "cuda" if dev.type == "cuda" else "cpu"
    if compositor not in ("auto", "numba", "torch"):
        raise ValueError(f"render: compositor must be 'auto', 'numba' or 'torch', got {compositor!r}")
    from splatloss.splat import composite_numba

    if compositor == "auto":
        compositor = "numba" if composite_numba.available() else "torch"
    if compositor == "numba" and not composite_numba.available():
        raise ValueError("render: compositor='numba' needs the numba package, which is not importable")
    if backend == "cuda" and dev.type != "cuda":
        raise ValueError(f"render: backend='cuda' needs the Gaussians on a CUDA device, they are on {dev}")
    W, H = int(view.width), int(view.height)
    viewmat = view.viewmat.to(device=dev, dtype=gaussians.means.dtype)
    K = view.K.to(device=dev, dtype=gaussians.means.dtype)
    if background is None:
        bg = torch.zeros(3, device=dev, dtype=gaussians.means.dtype)
    else:
        bg = torch.as_tensor(background, device=dev, dtype=gaussians.means.dtype)
        if tuple(bg.shape) != (3,):
            raise ValueError(f"render: background must have 3 values (RGB), got shape {tuple(bg.shape)}")
    if backend == "cuda":
        return _render_cuda(gaussians, viewmat, K, W, H, bg)
    return _render_cpu(gaussians, viewmat, K, W, H, bg, tile_size, groups, max_per_tile, compositor)


def _render_cuda(g, viewmat, K, W, H, bg):
    from gsplat import rasterization

    degree = int(g.active_sh_degree)
    colors, alphas, meta = rasterization(
        means=g.means,
        quats=g.quats,
        scales=torch.exp(g.log_scales),
        opacities=torch.sigmoid(g.opacity_logits),
        colors=g.sh_coeffs(degree),  # [N, (degree + 1)^2, 3], DC first ([N, 1, 3] at degree 0)
        viewmats=viewmat[None],
        Ks=K[None],
        width=W,
        height=H,
        sh_degree=degree,
        backgrounds=bg[None],
        packed=False,
        rasterize_mode="classic",
    )
    means2d = meta["means2d"]
    if means2d.requires_grad:
        means2d.retain_grad()
    return {
        "image": colors[0],
        "alpha": alphas[0],
        "means2d": means2d,  # [1, N, 2]: its .grad is what densification reads
        "radii": meta["radii"][0],
        "depths": meta["depths"][0],
        "conics": meta["conics"][0],
        "width": W,
        "height": H,
        "n_cameras": 1,
        "backend": "cuda",
    }


def _render_cpu(g, viewmat, K, W, H, bg, tile_size, groups, max_per_tile, compositor):
    from gsplat.cuda._torch_impl import (
        _fully_fused_projection,
        _quat_scale_to_covar_preci,
        _spherical_harmonics,
    )

    means = g.means
    covars, _ = _quat_scale_to_covar_preci(g.quats, torch.exp(g.log_scales), compute_preci=False)
    radii, means2d, depths, conics, _ = _fully_fused_projection(means, covars, viewmat[None], K[None], W, H)
    radii, means2d, depths, conics = radii[0], means2d[0], depths[0], conics[0]
    if means2d.requires_grad:
        means2d.retain_grad()
    opac = torch.sigmoid(g.opacity_logits)
    campos = torch.linalg.inv(viewmat)[:3, 3]
    # View direction: camera centre -> Gaussian mean (normalised inside), as gsplat's rasterization;
    # at degree > 0 the colour's gradient reaches the means through it, as on the CUDA path.
    degree = int(g.active_sh_degree)
    rgb = _spherical_harmonics(degree, means - campos, g.sh_coeffs(degree))
    rgb = torch.clamp_min(rgb + 0.5, 0.0)  # gsplat's SH convention

    tw = (W + tile_size - 1) // tile_size
    th = (H + tile_size - 1) // tile_size
    n_tiles = tw * th
    tile_ids, gauss_ids, _ = isect_tiles(means2d, radii, depths, tile_size, tw, th)
    counts = torch.bincount(tile_ids, minlength=n_tiles)
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(tile_ids.shape[0]) - starts[tile_ids]  # rank inside its tile (depth order)
    if max_per_tile is not None:
        keep = pos < max_per_tile
        tile_ids, gauss_ids, pos = tile_ids[keep], gauss_ids[keep], pos[keep]
        counts = counts.clamp_max(max_per_tile)

    meta = {
        "means2d": means2d,
        "radii": radii,
        "depths": depths,
        "conics": conics,
        "width": W,
        "height": H,
        "n_cameras": 1,
        "backend": "cpu",
        "n_isects": int(tile_ids.shape[0]),
    }
    if compositor == "numba":
        from splatloss.splat.composite_numba import CompositeNumba

        offs = torch.zeros(n_tiles + 1, dtype=torch.long)
        offs[1:] = torch.cumsum(counts, 0)
        image, alpha = CompositeNumba.apply(
            means2d, conics, opac, rgb, bg, offs, gauss_ids.contiguous(), W, H, tile_size, tw
        )
        return {"image": image, "alpha": alpha, **meta}

    n = means.shape[0]
    dt = means.dtype
    # A dummy Gaussian (index n, opacity 0) pads every list: it is always skipped (alpha < 1/255).
    m2d_p = torch.cat([means2d, means2d.new_zeros(1, 2)])
    con_p = torch.cat([conics, conics.new_ones(1, 3)])
    opa_p = torch.cat([opac, opac.new_zeros(1)])
    col_p = torch.cat([rgb, rgb.new_zeros(1, 3)])

    # Pixel centres of one tile, relative to its corner.
    r = torch.arange(tile_size, dtype=dt) + 0.5
    py, px = torch.meshgrid(r, r, indexing="ij")
    local = torch.stack([px.reshape(-1), py.reshape(-1)], -1)  # [P, 2]
    origin = torch.stack(
        [(torch.arange(n_tiles) % tw).to(dt) * tile_size, (torch.arange(n_tiles) // tw).to(dt) * tile_size], -1
    )  # [T, 2]

    # Group tiles by list length (longest first) so each group pads to a similar K.
    order = torch.argsort(counts, descending=True)
    nonempty = int((counts > 0).sum())
    P = tile_size * tile_size
    img_t = torch.zeros(n_tiles, P, 3, dtype=dt) + bg  # empty tiles: background, alpha 0
    alp_t = torch.zeros(n_tiles, P, dtype=dt)
    img_parts, alp_parts, tile_parts = [], [], []
    if nonempty > 0:
        bounds = torch.linspace(0, nonempty, min(groups, nonempty) + 1).round().long().tolist()
        cnt_sorted = counts[order].tolist()
        for s, e in zip(bounds[:-1], bounds[1:]):
            if e <= s:
                continue
            tiles = order[s:e]
            k = cnt_sorted[s]
            # idx[t, j] = the j-th nearest Gaussian of tile t, or n (the dummy).
            slot = torch.full((n_tiles,), -1, dtype=torch.long)
            slot[tiles] = torch.arange(e - s)
            sel = slot[tile_ids] >= 0
            idx = torch.full((e - s, k), n, dtype=torch.long)
            idx[slot[tile_ids[sel]], pos[sel]] = gauss_ids[sel]
            flat = idx.reshape(-1)
            pix = origin[tiles][:, None, :] + local[None]  # [T, P, 2]
            im, al = composite_tiles(
                pix,
                m2d_p[flat].reshape(e - s, k, 2),
                con_p[flat].reshape(e - s, k, 3),
                opa_p[flat].reshape(e - s, k),
                col_p[flat].reshape(e - s, k, 3),
                bg,
            )
            img_parts.append(im)
            alp_parts.append(al)
            tile_parts.append(tiles)
        tiles_all = torch.cat(tile_parts)
        img_t = img_t.index_put((tiles_all,), torch.cat(img_parts))
        alp_t = alp_t.index_put((tiles_all,), torch.cat(alp_parts))
    elif torch.is_grad_enabled():
        # Nothing drawn: keep the output in the graph (zero gradients), as the numba path and gsplat do.
        img_t = img_t + 0.0 * (m2d_p.sum() + con_p.sum() + opa_p.sum() + col_p.sum())
    # [th*tw, ts*ts, C] -> [H, W, C]
    image = (
        img_t.reshape(th, tw, tile_size, tile_size, 3).permute(0, 2, 1, 3, 4).reshape(th * tile_size, tw * tile_size, 3)
    )
    alpha = alp_t.reshape(th, tw, tile_size, tile_size).permute(0, 2, 1, 3).reshape(th * tile_size, tw * tile_size, 1)
    return {"image": image[:H, :W], "alpha": alpha[:H, :W], **meta}
