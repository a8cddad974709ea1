"""Outside truth for the core tests: real photographs, scikit-image SSIM, and a numpy MS-SSIM
written independently from TF's ``tf.image.ssim_multiscale`` definition (float64 throughout).

Nothing here imports splatloss: these are the numbers splatloss must reproduce.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from skimage import data
from skimage.metrics import structural_similarity

TF_WEIGHTS = (0.0448, 0.2856, 0.3001, 0.2363, 0.1333)


@functools.lru_cache(maxsize=None)
def _photograph(name: str) -> np.ndarray:
    """A scikit-image sample photograph as float64 in [0, 1], decoded once (read-only)."""
    img = getattr(data, name)().astype(np.float64) / 255.0
    img.setflags(write=False)
    return img


def photo(name: str, top: int, left: int, h: int, w: int, gray: bool = False) -> np.ndarray:
    """A crop of a scikit-image sample photograph as float64 in [0, 1], ``(H, W, 3)`` or ``(H, W)``."""
    img = _photograph(name)[top : top + h, left : left + w].copy()
    if gray:
        img = img @ np.array([0.2125, 0.7154, 0.0721])
    assert img.shape[:2] == (h, w), f"crop {name} {img.shape}"
    return img


def distort(img: np.ndarray, seed: int, noise: float = 0.08, shift: int = 1) -> np.ndarray:
    """A plausible 'rendering' of ``img``: shifted by a pixel, brightened, noisy, clipped to [0, 1]."""
    rng = np.random.default_rng(seed)
    out = np.roll(img, shift, axis=1) * 0.9 + 0.05
    out = out + noise * rng.standard_normal(img.shape)
    return np.clip(out, 0.0, 1.0)


def to_torch(img: np.ndarray, dtype=torch.float64) -> torch.Tensor:
    """``(H, W, C)`` or ``(H, W)`` numpy -> ``(1, C, H, W)`` tensor."""
    t = torch.from_numpy(np.ascontiguousarray(img))
    t = t[None] if t.dim() == 2 else t.permute(2, 0, 1)
    return t[None].to(dtype)


def skimage_ssim(a: np.ndarray, b: np.ndarray) -> float:
    return float(
        structural_similarity(
            a,
            b,
            gaussian_weights=True,
            sigma=1.5,
            use_sample_covariance=False,
            data_range=1.0,
            channel_axis=-1 if a.ndim == 3 else None,
        )
    )


# ------------------------------------------------------------------------------------------------
# TF ssim_multiscale in numpy (float64), from its definition:
#   _fspecial_gauss: g(i) ~ exp(-((i - (size-1)/2)^2) / (2 sigma^2)), normalised, 2-D = outer product
#   _ssim_helper: luminance = (2 m0 m1 + c1)/(m0^2 + m1^2 + c1),
#                 cs = (2 E[xy] - 2 m0 m1 + c2) / (E[x^2 + y^2] - m0^2 - m1^2 + c2)  (compensation 1)
#   _ssim_per_channel: VALID depthwise filtering, means over the map per channel
#   ssim_multiscale: SYMMETRIC-pad the remainder (H % 2, W % 2) at the end, 2x2 VALID avg_pool,
#                    relu(cs) at scales 0..M-2, relu(ssim) at M-1, prod(x ** w), mean over channels
# ------------------------------------------------------------------------------------------------


def _tf_window(size: int = 11, sigma: float = 1.5) -> np.ndarray:
    coords = np.arange(size, dtype=np.float64) - (size - 1) / 2.0
    g = np.exp(-(coords**2) / (2.0 * sigma**2))
    g /= g.sum()
    return np.outer(g, g)


def _valid_filter(x: np.ndarray, win: np.ndarray) -> np.ndarray:
    """x: (H, W, C); VALID 2-D correlation per channel -> (H-k+1, W-k+1, C)."""
    k = win.shape[0]
    patches = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(0, 1))  # (H', W', C, k, k)
    return np.einsum("hwcij,ij->hwc", patches, win)


def tf_ssim_per_channel(x: np.ndarray, y: np.ndarray, max_val: float = 1.0, k1=0.01, k2=0.03):
    win = _tf_window()
    c1 = (k1 * max_val) ** 2
    c2 = (k2 * max_val) ** 2
    m0 = _valid_filter(x, win)
    m1 = _valid_filter(y, win)
    num0 = 2.0 * m0 * m1
    den0 = m0**2 + m1**2
    lum = (num0 + c1) / (den0 + c1)
    num1 = 2.0 * _valid_filter(x * y, win)
    den1 = _valid_filter(x * x + y * y, win)
    cs = (num1 - num0 + c2) / (den1 - den0 + c2)
    return (lum * cs).mean(axis=(0, 1)), cs.mean(axis=(0, 1))


def tf_ms_ssim(x: np.ndarray, y: np.ndarray, weights=TF_WEIGHTS, max_val: float = 1.0) -> float:
    """x, y: (H, W, C) float64 images. Returns the MS-SSIM of the pair (channel-averaged)."""
    mcs = []
    ssim_pc = None
    for k in range(len(weights)):
        if k > 0:
            rh, rw = x.shape[0] % 2, x.shape[1] % 2
            pad = ((0, rh), (0, rw), (0, 0))
            x = np.pad(x, pad, mode="symmetric")
            y = np.pad(y, pad, mode="symmetric")
            h2, w2 = x.shape[0] // 2, x.shape[1] // 2
            x = x.reshape(h2, 2, w2, 2, -1).mean(axis=(1, 3))
            y = y.reshape(h2, 2, w2, 2, -1).mean(axis=(1, 3))
        ssim_pc, cs = tf_ssim_per_channel(x, y, max_val)
        mcs.append(np.maximum(cs, 0.0))
    mcs.pop()
    stack = np.stack(mcs + [np.maximum(ssim_pc, 0.0)], axis=-1)  # (C, M)
    return float(np.prod(stack ** np.asarray(weights), axis=-1).mean())
