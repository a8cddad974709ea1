"""SSIM on Triton: forward (map or per-image/channel means) and the analytic adjoint backward.

Kernels
-------
``_ssim_fwd_kernel``: one program per ``T x T`` tile of one (image, channel). Loads both input tiles
once, computes the five window moments with separable banded matmuls (see ``_common``), then
either writes the SSIM (and cs) map, or reduces the tile to two partial sums (SSIM, cs) written to
a ``[B*C, n_tiles]`` buffer that torch sums in a fixed order: no atomics, bitwise reproducible.

``_ssim_bwd_kernel``: one program per gradient tile. Recomputes the moments over the tile plus a
``2 (K - 1)`` halo, forms the partial derivatives of ``gs * SSIM + gc * cs`` (``gs`` / ``gc`` one
scalar per (image, channel) for the means, or map-sized upstream gradients for ``ssim_map``), and
applies the adjoint window (banded matmuls again) to get both image gradients in one pass;
optionally adds an L1 term ``l1 * sign(x - y)`` (the fused photometric loss).

Save or recompute
-----------------
The forward saves only its two inputs (no partial-derivative maps): the backward recomputes the
moments. With fp32 I/O, saving the four partial maps would cost the forward 16 B of writes per
pixel-channel and the backward 16 B of reads, against the 8 B the backward re-reads to recompute;
recomputing also keeps ``torch.no_grad()`` / inference at its 8 B read.

Bytes per pixel-channel (fp32 I/O, DRAM traffic, halo re-reads served by L2 not counted):

* ``ssim_stats`` forward: reads x, y = 8 B; writes 2 floats per tile (negligible).
* ``ssim_stats`` backward: reads x, y = 8 B; writes grad_x (and grad_y) = 4 B (8 B). 12 B for one
  gradient, so forward + backward = 20 B (fused-ssim ~80 B, FastCUDASSIM.jl ~44 B).
* ``ssim_map`` forward: 8 B + 4 B map (+ 4 B cs map); backward adds the upstream map reads: 4 B
  (+ 4 B) on top of the 12 B above.
"""

from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl

from ._common import (
    _adjoint_band,
    _band,
    _load_tile,
    _moments,
    _partials,
    _ssim_cs,
    bwd_tile,
    check_inputs,
    fwd_tile,
    out_size,
    padding_code,
    window_taps,
)

__all__ = ["ssim_map", "ssim_stats", "launch_fwd", "launch_bwd"]


@triton.jit
def _ssim_fwd_kernel(
    x_ptr, y_ptr, w_ptr, s_ptr, cs_ptr,
    C, H, W, Ho, Wo, n_tw, n_tiles,
    sx_b, sx_c, sx_h, sx_w,
    sy_b, sy_c, sy_h, sy_w,
    c1, c2,
    K: tl.constexpr, PAD: tl.constexpr, REFLECT: tl.constexpr, T: tl.constexpr,
    WRITE_MAP: tl.constexpr, WRITE_CS: tl.constexpr,
):
    pid = tl.program_id(0)
    bc = pid // n_tiles
    tile = pid - bc * n_tiles
    ti = tile // n_tw
    tj = tile - ti * n_tw
    b = (bc // C).to(tl.int64)
    ch = (bc % C).to(tl.int64)
    STEP: tl.constexpr = T - K + 1  # valid map rows / columns per tile
    ar = tl.arange(0, T)
    p_r = ti * STEP + ar  # map positions of the tile
    p_c = tj * STEP + ar

    x = _load_tile(x_ptr, b * sx_b + ch * sx_c, p_r - PAD, p_c - PAD, H, W, sx_h, sx_w, REFLECT)
    y = _load_tile(y_ptr, b * sy_b + ch * sy_c, p_r - PAD, p_c - PAD, H, W, sy_h, sy_w, REFLECT)
    hm = _band(w_ptr, T, K, True)
    vm = _band(w_ptr, T, K, False)
    mu1, mu2, e11, e22, e12 = _moments(x, y, hm, vm)
    ssim, cs = _ssim_cs(mu1, mu2, e11, e22, e12, c1, c2)

    valid = ((ar < STEP) & (p_r < Ho))[:, None] & ((ar < STEP) & (p_c < Wo))[None, :]
    if WRITE_MAP:
        # maps are contiguous [B*C, Ho, Wo]
        offs = bc.to(tl.int64) * Ho * Wo + p_r.to(tl.int64)[:, None] * Wo + p_c[None, :]
        tl.store(s_ptr + offs, ssim, mask=valid)
        if WRITE_CS:
            tl.store(cs_ptr + offs, cs, mask=valid)
    else:
        tl.store(s_ptr + pid, tl.sum(tl.sum(tl.where(valid, ssim, 0.0), axis=1), axis=0))
        tl.store(cs_ptr + pid, tl.sum(tl.sum(tl.where(valid, cs, 0.0), axis=1), axis=0))


@triton.jit
def _ssim_bwd_kernel(
    x_ptr, y_ptr, w_ptr, gs_ptr, gc_ptr, l1_ptr, gx_ptr, gy_ptr,
    C, H, W, Ho, Wo, n_tw, n_tiles,
    sx_b, sx_c, sx_h, sx_w,
    sy_b, sy_c, sy_h, sy_w,
    sg_b, sg_c, sg_h, sg_w,
    so_b, so_c, so_h, so_w,
    c1, c2,
    K: tl.constexpr, PAD: tl.constexpr, REFLECT: tl.constexpr, T: tl.constexpr,
    UPSTREAM_MAP: tl.constexpr, HAS_CS: tl.constexpr, HAS_L1: tl.constexpr,
    NEED1: tl.constexpr, NEED2: tl.constexpr,
):
    pid = tl.program_id(0)
    bc = pid // n_tiles
    tile = pid - bc * n_tiles
    ti = tile // n_tw
    tj = tile - ti * n_tw
    b = (bc // C).to(tl.int64)
    ch = (bc % C).to(tl.int64)
    STEP: tl.constexpr = T - 2 * (K - 1)  # gradient rows / columns per tile
    ar = tl.arange(0, T)
    q_r0 = ti * STEP  # first gradient row / column of the tile
    q_c0 = tj * STEP
    x_base = b * sx_b + ch * sx_c
    y_base = b * sy_b + ch * sy_c

    # 1. moments at map positions p = q0 - (K - 1) + PAD + i (the tile plus a K - 1 halo)
    rows = q_r0 - (K - 1) + ar  # padded input positions of the loaded tile
    cols = q_c0 - (K - 1) + ar
    x = _load_tile(x_ptr, x_base, rows, cols, H, W, sx_h, sx_w, REFLECT)
    y = _load_tile(y_ptr, y_base, rows, cols, H, W, sy_h, sy_w, REFLECT)
    hm = _band(w_ptr, T, K, True)
    vm = _band(w_ptr, T, K, False)
    mu1, mu2, e11, e22, e12 = _moments(x, y, hm, vm)

    # 2. partial derivatives at every map position of the frame; zero off the map
    p_r = rows + PAD
    p_c = cols + PAD
    valid = ((ar < T - K + 1) & (p_r >= 0) & (p_r < Ho))[:, None] & (
        (ar < T - K + 1) & (p_c >= 0) & (p_c < Wo)
    )[None, :]
    if UPSTREAM_MAP:
        g_offs = b * sg_b + ch * sg_c + p_r.to(tl.int64)[:, None] * sg_h + p_c.to(tl.int64)[None, :] * sg_w
        gs = tl.load(gs_ptr + g_offs, mask=valid, other=0.0).to(tl.float32)
        if HAS_CS:
            gc = tl.load(gc_ptr + g_offs, mask=valid, other=0.0).to(tl.float32)
        else:
            gc = 0.0
    else:
        gs = tl.load(gs_ptr + bc).to(tl.float32)
        if HAS_CS:
            gc = tl.load(gc_ptr + bc).to(tl.float32)
        else:
            gc = 0.0
    p_mu1, p_mu2, p_sq, p_xy = _partials(mu1, mu2, e11, e22, e12, gs, gc, c1, c2)
    p_sq = tl.where(valid, p_sq, 0.0)
    p_xy = tl.where(valid, p_xy, 0.0)

    # 3. adjoint filter: gather the partials through the window back onto the input pixels
    va = _adjoint_band(w_ptr, q_r0, H, T, K, PAD, REFLECT, True)
    ha = _adjoint_band(w_ptr, q_c0, W, T, K, PAD, REFLECT, False)
    g_sq = tl.dot(va, tl.dot(p_sq, ha, input_precision="ieee"), input_precision="ieee")
    g_xy = tl.dot(va, tl.dot(p_xy, ha, input_precision="ieee"), input_precision="ieee")

    q_r = q_r0 + ar
    q_c = q_c0 + ar
    out = ((ar < STEP) & (q_r < H))[:, None] & ((ar < STEP) & (q_c < W))[None, :]
    xq = _load_tile(x_ptr, x_base, q_r, q_c, H, W, sx_h, sx_w, False)
    yq = _load_tile(y_ptr, y_base, q_r, q_c, H, W, sy_h, sy_w, False)
    o_offs = b * so_b + ch * so_c + q_r.to(tl.int64)[:, None] * so_h + q_c.to(tl.int64)[None, :] * so_w
    if HAS_L1:
        l1 = tl.load(l1_ptr + bc).to(tl.float32)
        d = xq - yq
        l1_term = l1 * (tl.where(d > 0, 1.0, 0.0) - tl.where(d < 0, 1.0, 0.0))
    if NEED1:
        p1 = tl.where(valid, p_mu1, 0.0)
        gx = tl.dot(va, tl.dot(p1, ha, input_precision="ieee"), input_precision="ieee")
        gx += 2.0 * xq * g_sq + yq * g_xy
        if HAS_L1:
            gx += l1_term
        tl.store(gx_ptr + o_offs, gx.to(gx_ptr.dtype.element_ty), mask=out)
    if NEED2:
        p2 = tl.where(valid, p_mu2, 0.0)
        gy = tl.dot(va, tl.dot(p2, ha, input_precision="ieee"), input_precision="ieee")
        gy += 2.0 * yq * g_sq + xq * g_xy
        if HAS_L1:
            gy -= l1_term
        tl.store(gy_ptr + o_offs, gy.to(gy_ptr.dtype.element_ty), mask=out)


# ------------------------------------------------------------------------------------------------
# Launchers (plain functions on tensors; the custom ops below call them)
# ------------------------------------------------------------------------------------------------


def launch_fwd(img1, img2, window, padding: str, c1: float, c2: float, mode: str):
    """Run the forward kernel. ``mode``: "stats" -> (ssim_sum, cs_sum) per (B, C) as [B, C]
    fp32 sums over the map; "map" -> (ssim_map, empty); "map_cs" -> (ssim_map, cs_map)."""
    B, C, H, W = img1.shape
    K = window.shape[0]
    code = padding_code(padding)
    pad = 0 if code == 0 else K // 2
    Ho, Wo = out_size(H, K, padding), out_size(W, K, padding)
    T, warps = fwd_tile(K)
    step = T - K + 1
    n_th, n_tw = triton.cdiv(Ho, step), triton.cdiv(Wo, step)
    n_tiles = n_th * n_tw
    dev = img1.device
    if mode == "stats":
        s = torch.empty((B * C, n_tiles), dtype=torch.float32, device=dev)
        cs = torch.empty((B * C, n_tiles), dtype=torch.float32, device=dev)
    else:
        s = torch.empty((B, C, Ho, Wo), dtype=torch.float32, device=dev)
        cs = torch.empty((B, C, Ho, Wo) if mode == "map_cs" else (0,), dtype=torch.float32, device=dev)
    grid = (B * C * n_tiles,)
    _ssim_fwd_kernel[grid](
        img1, img2, window, s, cs if mode != "map" else s,
        C, H, W, Ho, Wo, n_tw, n_tiles,
        *img1.stride(), *img2.stride(),
        float(c1), float(c2),
        K=K, PAD=pad, REFLECT=code == 2, T=T,
        WRITE_MAP=mode != "stats", WRITE_CS=mode == "map_cs",
        num_warps=warps,
    )
    if mode == "stats":
        # fixed-order reduction of the per-tile partial sums: deterministic
        return s.sum(dim=1).view(B, C), cs.sum(dim=1).view(B, C)
    return s, cs


def launch_bwd(img1, img2, window, padding: str, c1: float, c2: float, g_s, g_cs, need1: bool,
               need2: bool, l1=None):
    """Run the backward kernel. ``g_s`` / ``g_cs``: ``[B, C]`` scalars (already divided by the
    map size) or ``[B, C, H', W']`` maps; ``g_cs`` may be None; ``l1``: optional ``[B, C]`` weight
    of ``sign(x - y)``. Returns (grad1 or None, grad2 or None) in the input dtype and layout."""
    B, C, H, W = img1.shape
    K = window.shape[0]
    code = padding_code(padding)
    pad = 0 if code == 0 else K // 2
    Ho, Wo = out_size(H, K, padding), out_size(W, K, padding)
    T, warps = bwd_tile(K)
    step = T - 2 * (K - 1)
    n_th, n_tw = triton.cdiv(H, step), triton.cdiv(W, step)
    n_tiles = n_th * n_tw
    upstream_map = g_s.dim() == 4
    if not upstream_map:
        g_s = g_s.to(torch.float32).contiguous()
        if g_cs is not None:
            g_cs = g_cs.to(torch.float32).contiguous()
    g_strides = g_s.stride() if upstream_map else (0, 0, 0, 0)
    if upstream_map and g_cs is not None and g_cs.stride() != g_s.stride():
        # one set of strides serves both upstream maps
        g_s, g_cs = g_s.contiguous(), g_cs.contiguous()
        g_strides = g_s.stride()
    gx = torch.empty_like(img1) if need1 else None
    gy = torch.empty_like(img2) if need2 else None
    out_strides = (gx if need1 else gy).stride() if (need1 or need2) else (0, 0, 0, 0)
    if need1 and need2 and gx.stride() != gy.stride():
        gy = torch.empty_strided(gx.shape, gx.stride(), dtype=gx.dtype, device=gx.device)
    if l1 is not None:
        l1 = l1.to(torch.float32).contiguous()
    grid = (B * C * n_tiles,)
    dummy = g_s
    _ssim_bwd_kernel[grid](
        img1, img2, window, g_s, g_cs if g_cs is not None else dummy, l1 if l1 is not None else dummy,
        gx if need1 else gy, gy if need2 else gx,
        C, H, W, Ho, Wo, n_tw, n_tiles,
        *img1.stride(), *img2.stride(), *g_strides, *out_strides,
        float(c1), float(c2),
        K=K, PAD=pad, REFLECT=code == 2, T=T,
        UPSTREAM_MAP=upstream_map, HAS_CS=g_cs is not None, HAS_L1=l1 is not None,
        NEED1=need1, NEED2=need2,
        num_warps=warps,
    )
    return gx, gy
