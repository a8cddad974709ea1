"""Pieces shared by the Triton ops: tile geometry, the banded window matrices, SSIM partials.

How a tile is filtered
----------------------
A program owns a square tile of ``T x T`` (T a power of two). It loads the input tile once and
filters it separably: the horizontal pass is ``X @ Hm`` and the vertical pass ``V @ (.)``, where
``Hm[c, j] = w[c - j]`` and ``V[i, r] = w[r - i]`` are banded (Toeplitz) matrices holding the 1-D
window. ``tl.dot`` with ``input_precision="ieee"`` keeps both passes in exact fp32 (no TF32), and
the tile never leaves registers / shared memory between the passes: no intermediate image is
written to global memory. Each pass loses ``K - 1`` rows / columns at the far edge of the tile, so
one filtering level yields ``T - K + 1`` valid outputs per side, and the backward (forward moments,
then the adjoint filter of the partial derivatives) yields ``T - 2 (K - 1)``. Tiles overlap by the
lost halo; the halo re-reads hit L2, not DRAM.

The adjoint
-----------
The gradient at input pixel ``q`` gathers, through the window, the partial derivatives of every
map value that used ``q`` (DESIGN.md): ``g[q] = sum_p P[p] w[q - p + pad]`` over map positions
``p`` (``P`` is zero outside the map). With "reflect" padding a padded sample is a copy of an input
pixel, so the gradient of ``q`` also gathers through its mirror images ``-q`` and ``2 (n - 1) - q``;
the adjoint band matrices below fold those in, which makes them depend on the tile position (they
are rebuilt per program, three small gathers each).
"""

from __future__ import annotations

import os
from typing import Dict, Tuple

import torch
import triton
import triton.language as tl

#: Largest window the kernels accept: the backward of a 128-tile keeps 128 - 2 (K - 1) >= 4 rows.
MAX_WINDOW = 63

_PADDING_CODE = {"valid": 0, "same": 1, "reflect": 2}


def fwd_tile(window_size: int) -> Tuple[int, int]:
    """(T, num_warps) of the forward kernels for a window of ``window_size`` taps."""
    return (64, 8) if window_size <= 33 else (128, 8)


def bwd_tile(window_size: int) -> Tuple[int, int]:
    """(T, num_warps) of the backward kernels: a 64-tile keeps 64 - 2 (K - 1) outputs per side."""
    return (64, 8) if window_size <= 17 else (128, 8)


def check_inputs(img1: torch.Tensor, img2: torch.Tensor, cfg) -> None:
    """What only the Triton backend cannot do (functional has already validated the rest)."""
    if img1.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(
            "the triton backend computes in float32 and takes float32, float16 or bfloat16 images, "
            f"got {img1.dtype}; use backend='torch' or 'reference' for float64"
        )
    if img2.dtype != img1.dtype:
        raise TypeError(f"img1 and img2 must have the same dtype, got {img1.dtype} and {img2.dtype}")
    if img1.dim() != 4 or img2.shape != img1.shape:
        raise ValueError(
            f"the triton backend expects two (B, C, H, W) images of one shape, got "
            f"{tuple(img1.shape)} and {tuple(img2.shape)}"
        )
    if img1.device != img2.device:
        raise ValueError(f"img1 and img2 must be on one device, got {img1.device} and {img2.device}")
    if img1.device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(
            f"the triton backend needs CUDA tensors, got a tensor on {img1.device.type}; "
            "set TRITON_INTERPRET=1 (before importing triton) to run the kernels in the interpreter"
        )
    if cfg.window_size > MAX_WINDOW:
        raise ValueError(f"the triton backend supports window_size <= {MAX_WINDOW}, got {cfg.window_size}")
    h, w = img1.shape[-2:]
    need = cfg.min_size()
    if h < need or w < need:
        raise ValueError(
            f"images must be at least {need}x{need} for window_size={cfg.window_size} and "
            f"padding={cfg.padding!r}, got {h}x{w}"
        )


def padding_code(padding: str) -> int:
    if padding not in _PADDING_CODE:
        raise ValueError(f"padding must be one of {tuple(_PADDING_CODE)}, got {padding!r}")
    return _PADDING_CODE[padding]


def out_size(n: int, window_size: int, padding: str) -> int:
    """Side of the SSIM map: shrinks by ``window_size - 1`` with "valid", unchanged otherwise."""
    return n - window_size + 1 if padding == "valid" else n


_WINDOWS: Dict[tuple, torch.Tensor] = {}


def window_taps(cfg, device: torch.device) -> torch.Tensor:
    """The 1-D window as a float32 tensor on ``device``, built once per (window, device)."""
    key = (cfg.window, cfg.window_size, cfg.sigma, str(device))
    w = _WINDOWS.get(key)
    if w is None:
        w = cfg.window_1d(torch.float32, device).contiguous()
        _WINDOWS[key] = w
    return w


# ------------------------------------------------------------------------------------------------
# Device functions
# ------------------------------------------------------------------------------------------------


@triton.jit
def _mirror(i, n, REFLECT: tl.constexpr):
    """Index of the input sample that padded position ``i`` holds ("reflect": no edge repeat)."""
    if REFLECT:
        i = tl.where(i < 0, -i, i)
        i = tl.where(i >= n, 2 * (n - 1) - i, i)
    return i


@triton.jit
def _load_tile(ptr, base, rows, cols, H, W, s_h, s_w, REFLECT: tl.constexpr):
    """``[T, T]`` float32 tile at padded positions ``rows x cols``: zeros outside the image
    ("valid" / "same"), or mirrored samples ("reflect")."""
    r = _mirror(rows, H, REFLECT)
    c = _mirror(cols, W, REFLECT)
    m = ((r >= 0) & (r < H))[:, None] & ((c >= 0) & (c < W))[None, :]
    offs = r.to(tl.int64)[:, None] * s_h + c.to(tl.int64)[None, :] * s_w
    return tl.load(ptr + base + offs, mask=m, other=0.0).to(tl.float32)


@triton.jit
def _band(w_ptr, T: tl.constexpr, K: tl.constexpr, ROW_MINUS_COL: tl.constexpr):
    """Toeplitz window matrix: ``M[a, b] = w[a - b]`` (horizontal pass, ``X @ M``) or
    ``M[a, b] = w[b - a]`` (vertical pass, ``M @ X``), zero off the band."""
    a = tl.arange(0, T)
    if ROW_MINUS_COL:
        d = a[:, None] - a[None, :]
    else:
        d = a[None, :] - a[:, None]
    return tl.load(w_ptr + d, mask=(d >= 0) & (d < K), other=0.0)


@triton.jit
def _adjoint_band(w_ptr, q0, n, T: tl.constexpr, K: tl.constexpr, PAD: tl.constexpr,
                  REFLECT: tl.constexpr, GRAD_ON_ROWS: tl.constexpr):
    """Adjoint window matrix between map positions ``p = q0 - (K - 1) + PAD + r`` and input
    positions ``q = q0 + t``: ``sum over the preimages j of q of w[j - p + PAD]``.

    ``GRAD_ON_ROWS``: ``M[t, r]`` (vertical adjoint, ``M @ P``); else ``M[r, t]`` (``P @ M``).
    Without "reflect" the only preimage is ``q`` itself and ``M[t, r] = w[t - r + K - 1]``.
    """
    a = tl.arange(0, T)
    if GRAD_ON_ROWS:
        t = a[:, None]
        r = a[None, :]
    else:
        t = a[None, :]
        r = a[:, None]
    d = t - r + (K - 1)
    m = tl.load(w_ptr + d, mask=(d >= 0) & (d < K), other=0.0)
    if REFLECT:
        q = q0 + t
        # padded position -q (top / left border) holds input q for 1 <= q <= PAD
        d2 = -2 * q + d
        ok2 = (q >= 1) & (q <= PAD) & (d2 >= 0) & (d2 < K)
        m += tl.load(w_ptr + d2, mask=ok2, other=0.0)
        # padded position 2 (n - 1) - q (bottom / right border) holds q for n-1-PAD <= q <= n-2
        d3 = 2 * (n - 1) - 2 * q + d
        ok3 = (q >= n - 1 - PAD) & (q <= n - 2) & (d3 >= 0) & (d3 < K)
        m += tl.load(w_ptr + d3, mask=ok3, other=0.0)
    return m


@triton.jit
def _filter(x, hm, vm):
    """Separable window filter of a ``[T, T]`` tile: horizontal then vertical, exact fp32."""
    h = tl.dot(x, hm, input_precision="ieee")
    return tl.dot(vm, h, input_precision="ieee")


@triton.jit
def _moments(x, y, hm, vm):
    """Local means and raw second moments under the window (population statistics)."""
    mu1 = _filter(x, hm, vm)
    mu2 = _filter(y, hm, vm)
    e11 = _filter(x * x, hm, vm)
    e22 = _filter(y * y, hm, vm)
    e12 = _filter(x * y, hm, vm)
    return mu1, mu2, e11, e22, e12


@triton.jit
def _ssim_cs(mu1, mu2, e11, e22, e12, c1, c2):
    """SSIM and contrast-structure maps from the moments (same formula as reference.ssim_map)."""
    a1 = 2.0 * mu1 * mu2 + c1
    a2 = 2.0 * (e12 - mu1 * mu2) + c2
    b1 = mu1 * mu1 + mu2 * mu2 + c1
    b2 = (e11 - mu1 * mu1) + (e22 - mu2 * mu2) + c2
    cs = a2 / b2
    ssim = (a1 / b1) * cs
    return ssim, cs


@triton.jit
def _partials(mu1, mu2, e11, e22, e12, gs, gc, c1, c2):
    """Partial derivatives of ``gs * SSIM + gc * cs`` w.r.t. (mu1, mu2, E[x^2] = E[y^2], E[xy]).

    With ``S = A1 A2 / (B1 B2)``: dS/dmu1 = 2 mu2 (A2 - A1) / (B1 B2) + 2 mu1 S (1/B2 - 1/B1),
    dS/dE[x^2] = dS/dE[y^2] = -S / B2, dS/dE[xy] = 2 A1 / (B1 B2); and for ``cs = A2 / B2``:
    dcs/dmu1 = 2 (mu1 cs - mu2) / B2, dcs/dE[x^2] = -cs / B2, dcs/dE[xy] = 2 / B2.
    """
    a1 = 2.0 * mu1 * mu2 + c1
    a2 = 2.0 * (e12 - mu1 * mu2) + c2
    b1 = mu1 * mu1 + mu2 * mu2 + c1
    b2 = (e11 - mu1 * mu1) + (e22 - mu2 * mu2) + c2
    inv_b2 = 1.0 / b2
    inv_b1b2 = inv_b2 / b1
    cs = a2 * inv_b2
    ssim = a1 * a2 * inv_b1b2
    diff = 2.0 * (a2 - a1) * inv_b1b2
    spread = 2.0 * ssim * (inv_b2 - 1.0 / b1)
    p_mu1 = gs * (mu2 * diff + mu1 * spread) + gc * (2.0 * (mu1 * cs - mu2) * inv_b2)
    p_mu2 = gs * (mu1 * diff + mu2 * spread) + gc * (2.0 * (mu2 * cs - mu1) * inv_b2)
    p_sq = -(gs * ssim + gc * cs) * inv_b2
    p_xy = gs * (2.0 * a1 * inv_b1b2) + gc * (2.0 * inv_b2)
    return p_mu1, p_mu2, p_sq, p_xy
