"""The SSIM formula inside the kernels: the moment shift, SSIM / cs from the filtered moments, and
their partial derivatives (jitted device functions, inlined into every kernel body)."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["ratios", "ssim_cs", "partials"]


@triton.jit
def ratios(mu1, mu2, e11, e22, e12, c1, c2, shift, dmu, dvar):
    """``(inv_b1, inv_b2, lum, cs)``: the SSIM algebra from the moments of the shifted images,
    ``x' = x - shift`` (``e22`` None: ``e11`` holds ``E[x'^2] + E[y'^2]``). ``dmu`` and ``dvar``:
    ``mu1 - mu2`` and ``E[x'^2] + E[y'^2] - 2 E[x'y']`` where the caller forms them itself (None:
    from the moments). The masked kernels do, from their sums before the division by the filtered
    mask: compiled, ``mu1 - mu2`` with ``mu = F(M x') / F(M)`` may take one product unrounded into
    the subtraction (a fused multiply-add), which leaves a rounding error where the images agree.

    Each denominator is its numerator plus a non-negative difference, ``B1 = A1 + (mu1 - mu2)^2``
    and ``B2 = A2 + max(0, Var[x - y])`` with ``Var[x - y] = E[x'^2] + E[y'^2] - 2 E[x'y'] -
    (mu1 - mu2)^2``, so that round-off cannot put a ratio above 1, and a window where both images
    agree (difference exactly 0) gives exactly 1 whatever the division's rounding. Both ratios are
    clamped to [-1, 1] (NaN kept: a non-finite pixel still reaches its footprint)."""
    m1 = mu1 + shift
    m2 = mu2 + shift
    if dmu is None:
        dmu = mu1 - mu2  # = m1 - m2, without the shift's rounding
    a1 = 2.0 * m1 * m2 + c1
    d1 = dmu * dmu
    b1 = a1 + d1
    a2 = 2.0 * (e12 - mu1 * mu2) + c2
    if dvar is not None:
        d2 = dvar - d1
    elif e22 is None:
        d2 = (e11 - 2.0 * e12) - d1
    else:
        d2 = ((e11 + e22) - 2.0 * e12) - d1
    b2 = a2 + tl.maximum(d2, 0.0, propagate_nan=tl.PropagateNan.ALL)
    # Divide by B1 and B2 one at a time, never by their product: with data_range = 1e10 both are
    # ~1e20 (the product overflows fp32), with C1 = C2 = 1e-20 on black both are 1e-20 (1 / (B1 B2)
    # overflows, A1 A2 underflows). Every factor stays within a few orders of 1 / data_range.
    inv_b1 = 1.0 / b1
    inv_b2 = 1.0 / b2
    lum = tl.where(d1 == 0.0, 1.0, a1 * inv_b1)
    cs = tl.where(d2 == 0.0, 1.0, a2 * inv_b2)
    lum = tl.clamp(lum, -1.0, 1.0, propagate_nan=tl.PropagateNan.ALL)
    cs = tl.clamp(cs, -1.0, 1.0, propagate_nan=tl.PropagateNan.ALL)
    return inv_b1, inv_b2, lum, cs


@triton.jit
def ssim_cs(mu1, mu2, e11, e22, e12, c1, c2, shift, dmu, dvar):
    """SSIM and contrast-structure from the moments of the *shifted* images ``x - shift``,
    ``y - shift`` (same formula as reference.ssim_map: population (co)variances).

    Why shifted: ``var = E[x^2] - mu^2`` cancels catastrophically in fp32 where the local variance
    is small against ``mu^2`` (flat regions, MS-SSIM's coarse scales); moments of ``x - shift``
    with ``shift`` near the window's pixels (the centre row's own pixel, :func:`.columns.vmoments`
    and, under a mask, :func:`.columns.vmoments_masked`) remove it. Variances and covariance
    are shift-invariant; the luminance term uses the true means ``mu + shift`` (:func:`ratios`)."""
    _inv_b1, _inv_b2, lum, cs = ratios(mu1, mu2, e11, e22, e12, c1, c2, shift, dmu, dvar)
    return lum * cs, cs


@triton.jit
def partials(mu1, mu2, e11, e22, e12, gs, gc, c1, c2, shift, dmu, dvar, HAS_CS: tl.constexpr):
    """Partial derivatives of ``gs * SSIM + gc * cs`` (``gc`` only with ``HAS_CS``; ``HAS_CS == 2``:
    of ``gc * cs`` alone, ``gs`` ignored, cs returned in the SSIM's place) w.r.t. the shifted
    moments (mu1, mu2, E[x'^2] = E[y'^2] (shared), E[x'y']), ``x' = x - shift``; ``m = mu +
    shift`` the true means. Returns them and (SSIM, cs).

    With ``S = l cs``, ``l = A1 / B1``, ``cs = A2 / B2``, ``A1 = 2 m1 m2 + C1``,
    ``B1 = m1^2 + m2^2 + C1``, ``A2 = 2 (E[x'y'] - mu1 mu2) + C2``,
    ``B2 = E[x'^2] - mu1^2 + E[y'^2] - mu2^2 + C2``:

    * d/dE[x'^2] = -(gs S + gc cs) / B2 (``p_sq``), d/dE[x'y'] = 2 (gs l + gc) / B2 (``p_xy``);
    * d/dmu1 = gs (2 cs / B1) (m2 - l m1) - 2 p_sq mu1 - p_xy mu2 (the luminance term, through
      m1, then the variance and covariance terms, through mu1: ``A2`` and ``B2`` depend on mu1 as
      on E[x'^2] and E[x'y'] times ``-2 mu1`` and ``-mu2``); d/dmu2 likewise.

    ``m2 - l m1`` is one fused multiply-add, rounded once: it is where the two luminance terms
    cancel."""
    inv_b1, inv_b2, lum, cs = ratios(mu1, mu2, e11, e22, e12, c1, c2, shift, dmu, dvar)
    if HAS_CS == 2:  # cs alone (MS-SSIM's finer scales): no luminance term
        ssim = cs  # (the SSIM is not computed: the sums take cs)
        p_sq = -(gc * cs) * inv_b2
        p_xy = 2.0 * inv_b2 * gc
        p_mu1 = -2.0 * p_sq * mu1 - p_xy * mu2
        p_mu2 = -2.0 * p_sq * mu2 - p_xy * mu1
    else:
        m1 = mu1 + shift
        m2 = mu2 + shift
        ssim = lum * cs
        if HAS_CS:
            p_sq = -(gs * ssim + gc * cs) * inv_b2
            p_xy = 2.0 * inv_b2 * (gs * lum + gc)
        else:
            p_sq = -(gs * ssim) * inv_b2
            p_xy = 2.0 * inv_b2 * (gs * lum)
        k_l = 2.0 * gs * cs * inv_b1
        p_mu1 = k_l * (m2 - lum * m1) - 2.0 * p_sq * mu1 - p_xy * mu2
        p_mu2 = k_l * (m1 - lum * m2) - 2.0 * p_sq * mu2 - p_xy * mu1
    return p_mu1, p_mu2, p_sq, p_xy, ssim, cs
