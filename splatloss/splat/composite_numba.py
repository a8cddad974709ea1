"""Per-pixel front-to-back compositing compiled with numba: the fast CPU compositor.

Same rules as gsplat's CUDA rasterizer (and as the torch compositor in ``renderer.py``, which the
tests compare it with): pixel centres at +0.5, ``alpha = min(0.999, opacity * exp(-sigma))``,
``sigma < 0`` or ``alpha < 1/255`` skipped, a pixel stops before the Gaussian that would bring its
transmittance to <= 1e-4. Unlike the padded torch blocks, each pixel walks only its own tile's
list and stops early, so the work is the number of (pixel, Gaussian) pairs actually composited.

Each tile first copies its Gaussians (depth order) into one contiguous ``[K, 10]`` block that its
pixels then read (about 1.5x faster than gathering through the index for every pixel). Backward
walks each pixel's list back to front from the last Gaussian that contributed, recovering the
transmittance before each one by division (``T / (1 - alpha)``, alpha <= 0.999, as gsplat does),
sums gradients per tile in float64 and adds them to the per-Gaussian arrays once per tile (one
thread, so no races). Forward saves only the final transmittance and the end of each pixel's list.

Kernels are compiled on first use and cached on disk by numba (``cache=True``).
"""

from __future__ import annotations

import math

import numpy as np
import torch

try:  # numba is an optional dependency (the "train" extra); without it the torch compositor runs.
    import numba

    _HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised only where numba is missing
    numba = None
    _HAVE_NUMBA = False

ALPHA_MIN = 1.0 / 255.0
ALPHA_MAX = 0.999
T_MIN = 1e-4


def available() -> bool:
    return _HAVE_NUMBA


if _HAVE_NUMBA:

    @numba.njit(cache=True, nogil=True)
    def _thresholds(opa):
        # sigma above log(255 * opacity) means alpha < 1/255: skipped without evaluating exp. The
        # margin keeps the exact test (on alpha itself) deciding every borderline case.
        thr = np.empty(opa.shape[0], dtype=np.float64)
        for i in range(opa.shape[0]):
            o = opa[i]
            thr[i] = math.log(255.0 * o) + 1e-3 if o > 0 else -1.0
        return thr

    @numba.njit(cache=True, nogil=True)
    def _gather(s, e, ids, m2d, con, opa, col, thr, buf):
        # The tile's Gaussians, depth order, into one contiguous [K, 10] block the pixel loops reuse.
        for j in range(e - s):
            gi = ids[s + j]
            buf[j, 0] = m2d[gi, 0]
            buf[j, 1] = m2d[gi, 1]
            buf[j, 2] = con[gi, 0]
            buf[j, 3] = con[gi, 1]
            buf[j, 4] = con[gi, 2]
            buf[j, 5] = opa[gi]
            buf[j, 6] = thr[gi]
            buf[j, 7] = col[gi, 0]
            buf[j, 8] = col[gi, 1]
            buf[j, 9] = col[gi, 2]

    @numba.njit(cache=True, nogil=True)
    def _fwd(W, H, ts, tw, offs, ids, m2d, con, opa, col, bg, img, alp, t_fin, last):
        thr = _thresholds(opa)
        th = (H + ts - 1) // ts
        kmax = 0
        for t in range(th * tw):
            kmax = max(kmax, offs[t + 1] - offs[t])
        buf = np.empty((max(kmax, 1), 10), dtype=np.float64)
        for ty in range(th):
            for tx in range(tw):
                t = ty * tw + tx
                s = offs[t]
                n = offs[t + 1] - s
                _gather(s, s + n, ids, m2d, con, opa, col, thr, buf)
                for py in range(ty * ts, min(H, (ty + 1) * ts)):
                    fy = py + 0.5
                    for px in range(tx * ts, min(W, (tx + 1) * ts)):
                        fx = px + 0.5
                        T = 1.0
                        r = 0.0
                        g = 0.0
                        b = 0.0
                        end = 0
                        for j in range(n):
                            dx = fx - buf[j, 0]
                            dy = fy - buf[j, 1]
                            sigma = 0.5 * (buf[j, 2] * dx * dx + buf[j, 4] * dy * dy) + buf[j, 3] * dx * dy
                            if sigma < 0.0 or sigma > buf[j, 6]:
                                continue
                            a = buf[j, 5] * math.exp(-sigma)
                            if a < ALPHA_MIN:
                                continue
                            if a > ALPHA_MAX:
                                a = ALPHA_MAX
                            nT = T * (1.0 - a)
                            if nT <= T_MIN:
                                break
                            w = a * T
                            r += w * buf[j, 7]
                            g += w * buf[j, 8]
                            b += w * buf[j, 9]
                            T = nT
                            end = j + 1
                        img[py, px, 0] = r + T * bg[0]
                        img[py, px, 1] = g + T * bg[1]
                        img[py, px, 2] = b + T * bg[2]
                        alp[py, px] = 1.0 - T
                        t_fin[py, px] = T
                        last[py, px] = s + end

    @numba.njit(cache=True, nogil=True)
    def _bwd(
        W, H, ts, tw, offs, ids, m2d, con, opa, col, bg, t_fin, last, g_img, g_alp, v_m2d, v_con, v_opa, v_col, v_bg
    ):
        thr = _thresholds(opa)
        th = (H + ts - 1) // ts
        kmax = 0
        for t in range(th * tw):
            kmax = max(kmax, offs[t + 1] - offs[t])
        kmax = max(kmax, 1)
        buf = np.empty((kmax, 10), dtype=np.float64)
        gbuf = np.empty((kmax, 9), dtype=np.float64)  # per tile: d m2d (2), d conic (3), d opacity, d colour (3)
        for ty in range(th):
            for tx in range(tw):
                t = ty * tw + tx
                s = offs[t]
                n = offs[t + 1] - s
                _gather(s, s + n, ids, m2d, con, opa, col, thr, buf)
                gbuf[:n] = 0.0
                for py in range(ty * ts, min(H, (ty + 1) * ts)):
                    fy = py + 0.5
                    for px in range(tx * ts, min(W, (tx + 1) * ts)):
                        fx = px + 0.5
                        gr = g_img[py, px, 0]
                        gg = g_img[py, px, 1]
                        gb = g_img[py, px, 2]
                        T = t_fin[py, px]
                        v_bg[0] += T * gr
                        v_bg[1] += T * gg
                        v_bg[2] += T * gb
                        # d(out)/d(T_final) terms: colour through the background, alpha = 1 - T_final.
                        tail = T * (bg[0] * gr + bg[1] * gg + bg[2] * gb - g_alp[py, px])
                        behind = 0.0  # sum over later Gaussians of w_k (c_k . dL/dC)
                        for j in range(last[py, px] - s - 1, -1, -1):
                            dx = fx - buf[j, 0]
                            dy = fy - buf[j, 1]
                            ca = buf[j, 2]
                            cb = buf[j, 3]
                            cc = buf[j, 4]
                            sigma = 0.5 * (ca * dx * dx + cc * dy * dy) + cb * dx * dy
                            if sigma < 0.0 or sigma > buf[j, 6]:
                                continue
                            vis = math.exp(-sigma)
                            raw = buf[j, 5] * vis
                            if raw < ALPHA_MIN:
                                continue
                            a = raw if raw <= ALPHA_MAX else ALPHA_MAX
                            ra = 1.0 / (1.0 - a)
                            T = T * ra  # transmittance before this Gaussian
                            w = a * T
                            gbuf[j, 6] += w * gr
                            gbuf[j, 7] += w * gg
                            gbuf[j, 8] += w * gb
                            cg = buf[j, 7] * gr + buf[j, 8] * gg + buf[j, 9] * gb
                            g_a = T * cg - (behind + tail) * ra
                            behind += w * cg
                            if raw <= ALPHA_MAX:  # clamped alphas pass no gradient (as gsplat)
                                gbuf[j, 5] += g_a * vis
                                g_s = -g_a * raw
                                gbuf[j, 2] += 0.5 * g_s * dx * dx
                                gbuf[j, 3] += g_s * dx * dy
                                gbuf[j, 4] += 0.5 * g_s * dy * dy
                                gbuf[j, 0] -= g_s * (ca * dx + cb * dy)
                                gbuf[j, 1] -= g_s * (cb * dx + cc * dy)
                for j in range(n):
                    gi = ids[s + j]
                    v_m2d[gi, 0] += gbuf[j, 0]
                    v_m2d[gi, 1] += gbuf[j, 1]
                    v_con[gi, 0] += gbuf[j, 2]
                    v_con[gi, 1] += gbuf[j, 3]
                    v_con[gi, 2] += gbuf[j, 4]
                    v_opa[gi] += gbuf[j, 5]
                    v_col[gi, 0] += gbuf[j, 6]
                    v_col[gi, 1] += gbuf[j, 7]
                    v_col[gi, 2] += gbuf[j, 8]


class CompositeNumba(torch.autograd.Function):
    """``(means2d [N,2], conics [N,3], opacities [N], colors [N,3], bg [3]) -> (image [H,W,3],
    alpha [H,W,1])`` given per-tile depth-sorted lists ``offsets [tiles+1]``, ``ids [M]``."""

    @staticmethod
    def forward(ctx, m2d, con, opa, col, bg, offs, ids, W, H, ts, tw):
        dt = m2d.dtype
        arrs = [x.detach().contiguous() for x in (m2d, con, opa, col, bg)]
        np_arrs = [x.numpy() for x in arrs]
        img = np.empty((H, W, 3), dtype=np_arrs[0].dtype)
        alp = np.empty((H, W), dtype=np_arrs[0].dtype)
        t_fin = np.empty((H, W), dtype=np_arrs[0].dtype)
        last = np.empty((H, W), dtype=np.int64)
        offs_np = offs.numpy()
        ids_np = ids.numpy()
        _fwd(W, H, ts, tw, offs_np, ids_np, *np_arrs, img, alp, t_fin, last)
        ctx.save_for_backward(*arrs, offs, ids, torch.from_numpy(t_fin), torch.from_numpy(last))
        ctx.dims = (W, H, ts, tw)
        return torch.from_numpy(img).to(dt), torch.from_numpy(alp)[..., None].to(dt)

    @staticmethod
    def backward(ctx, g_img, g_alp):
        m2d, con, opa, col, bg, offs, ids, t_fin, last = ctx.saved_tensors
        W, H, ts, tw = ctx.dims
        dt = m2d.dtype
        g_img = (torch.zeros(H, W, 3, dtype=dt) if g_img is None else g_img.to(dt)).contiguous()
        g_alp = (torch.zeros(H, W, dtype=dt) if g_alp is None else g_alp.to(dt).reshape(H, W)).contiguous()
        v = [torch.zeros_like(x) for x in (m2d, con, opa, col, bg)]
        _bwd(
            W,
            H,
            ts,
            tw,
            offs.numpy(),
            ids.numpy(),
            m2d.numpy(),
            con.numpy(),
            opa.numpy(),
            col.numpy(),
            bg.numpy(),
            t_fin.numpy(),
            last.numpy(),
            g_img.numpy(),
            g_alp.numpy(),
            *[x.numpy() for x in v],
        )
        return (*v, None, None, None, None, None, None)
