/* Fused single-pass SSIM statistics and their analytic gradient on the CPU.
 *
 * Compiled at first use by splatloss/backends/_cpu_kernel.py (the system C compiler, -O3
 * -march=native) once per REAL type (float, double) and loaded with ctypes; image sizes, window
 * size and constants are run-time arguments, so nothing is ever recompiled for a new shape.
 *
 * One call processes a strip of rows of one (b, c) plane of a "valid" SSIM (the caller pads for
 * "same" / "reflect", so autograd takes care of the padding's adjoint). Everything streams through
 * ring buffers a few rows high: no map-sized temporary exists, and the only map-sized memory the
 * backward writes is the gradient itself.
 *
 * Notation (per map pixel p, window w = g (x) g, K taps, map H' x W' = (H-K+1) x (W-K+1)):
 *   mu_x = w*x, mu_y = w*y, e_ss = w*(x^2 + y^2), e_xy = w*(xy)            (4 separable filters:
 *   only the sum e_xx + e_yy enters SSIM, so x^2 and y^2 are filtered as one image)
 *   A1 = 2 mu_x mu_y + C1, B1 = mu_x^2 + mu_y^2 + C1
 *   A2 = 2 (e_xy - mu_x mu_y) + C2, B2 = e_ss - mu_x^2 - mu_y^2 + C2
 *   ssim = A1 A2 / (B1 B2), cs = A2 / B2.
 * Backward of L = gS * sum_p ssim + gC * sum_p cs (gS, gC already divided by the map size):
 *   beta  = dL/de_ss = -(gS ssim + gC cs) / B2
 *   gamma = dL/de_xy = 2 (gS A1 / B1 + gC) / B2
 *   alpha_x = dL/dmu_x = 2 gS (mu_y A2 - mu_x ssim B2) / (B1 B2) - 2 mu_x beta - mu_y gamma
 *   alpha_y = dL/dmu_y = 2 gS (mu_x A2 - mu_y ssim B2) / (B1 B2) - 2 mu_y beta - mu_x gamma
 *   dL/dx = w^T*alpha_x + 2 x (w^T*beta) + y (w^T*gamma)      (w^T: the adjoint, i.e. the
 *   dL/dy = w^T*alpha_y + 2 y (w^T*beta) + x (w^T*gamma)       "full" correlation with w flipped)
 * so the backward is four transposed separable filters (three when only one image needs a
 * gradient), after recomputing the forward statistics of the rows it needs.
 *
 * Numerics: the moments are those of the shifted images x - s, y - s, with s one number per plane
 * (the mean of (x + y) / 2 over the plane's middle row; "same" padding then holds -s). Variances
 * and the covariance do not change under a common shift, and E[x'^2] - E[x']^2 does not cancel
 * catastrophically in float32 where the local variance is small against the squared mean (flat
 * skies and walls): on a flat JPEG photograph the float32 gradient went from 7.3e-5 to 5.1e-7 of
 * the float64 one (tests/test_numerics.py). The luminance terms use the true means mu' + s.
 * With x' = x - s the formulas above hold with mu_x, e_ss, e_xy of the shifted images in A2, B2, beta, gamma, and
 *   alpha_x = 2 gS (mu_y cs - mu_x ssim) / B1 - 2 mu'_x beta - mu'_y gamma    (mu = mu' + s)
 *   dL/dx = w^T*alpha_x + 2 x' (w^T*beta) + y' (w^T*gamma).
 * 1/B1 and 1/B2 are two divisions, never 1/(B1 B2): that product overflows (B1 ~ B2 ~ 1e19 at
 * data_range = 1e10) or underflows (C1 = C2 = 1e-20 on a black image) in float32.
 *
 * Cost: the work is all in the filters (FMA-bound on one core): the statistics are 4 quantities x
 * 2 passes, the adjoint 3 quantities (4 when both images need a gradient) x 2 passes, K taps each.
 * splat_ssim_bwd can add the forward's row sums in the same sweep (`rows`): a caller that knows it
 * will need the gradient runs the statistics once (4 + 3 quantities) instead of a forward and a
 * recomputing backward (4 + 4 + 3).
 *
 * Vectorisation uses GCC/Clang vector extensions of the CPU's native width (64 bytes with
 * AVX-512, 32 with AVX, 16 otherwise). Row buffers are padded to whole vectors and the pad
 * lanes are kept at zero, so no inner loop needs a scalar tail.
 */
#include <stddef.h>
#include <string.h>

#ifndef REAL
#define REAL float
#endif
#ifndef REAL_BYTES  /* sizeof(REAL) for the preprocessor */
#define REAL_BYTES 4
#endif

/* The native vector width: a generic vector wider than the hardware's is split by the compiler
 * through the stack (64-byte vectors on an AVX2 CPU ran the filters about 5x slower). */
#ifndef VBYTES
#if defined(__AVX512F__)
#define VBYTES 64
#elif defined(__AVX__)
#define VBYTES 32
#else
#define VBYTES 16
#endif
#endif
#define V ((int)(VBYTES / sizeof(REAL)))
#define V_LANES (VBYTES / (REAL_BYTES))
_Static_assert(V_LANES == V, "REAL_BYTES must be sizeof(REAL) (the build passes it)");
/* Ring slots of the unmasked kernel: K input / map rows plus two (two map rows at a time, computed
 * one row ahead of the two gradient rows that read K + 1 of them). */
#define NSLOT(k) ((k) + 2)
typedef REAL vr __attribute__((vector_size(VBYTES)));
typedef __typeof__((vr){0} < (vr){0}) vmask;

/* Built once generic and once with -DFIXED_TAPS=11 (the default window): a compile-time tap
 * count lets the compiler unroll the tap loops and keep the taps in registers. */
#ifdef FIXED_TAPS
#define KTAPS(k) FIXED_TAPS
#else
#define KTAPS(k) (k)
#endif

static inline vr ld(const REAL *p) { vr v; memcpy(&v, p, sizeof v); return v; }
static inline void st(REAL *p, vr v) { memcpy(p, &v, sizeof v); }
static inline vr bc(REAL s) { return (vr){0} + s; }
static inline int rup(int n) { return (n + V - 1) / V * V; }

/* Row lengths of the workspace, all multiples of V. */
typedef struct {
    int W, K, Wp;      /* (tile) image width, taps, map width */
    int Wo, Wpp;       /* padded image width, padded map width */
    int Lin;           /* input-row buffers: Wo + K rounded (reads up to Wpp + K - 2) */
    int Lv;            /* zero-bordered rows for the transposed horizontal pass: Wo + K - 1 rounded */
} dims_t;

static dims_t make_dims(int W, int K) {
    dims_t d;
    d.W = W; d.K = K; d.Wp = W - K + 1;
    d.Wo = rup(W); d.Wpp = rup(d.Wp);
    d.Lin = rup(d.Wo + K);
    d.Lv = rup(d.Wo + K - 1);
    return d;
}

/* Workspace layout (REALs), all zero-initialised by the caller:
 *   in:    4 rows of Lin  (x, y, x^2 + y^2, xy of the current input row)
 *   hring: 4 * NSLOT(K) rows of Wpp (horizontal sums of the last input rows)
 *   aring: 4 * NSLOT(K) rows of Wpp (beta, gamma, alpha(s) of the last map rows)
 *   vrow:  8 rows of Lv   (vertical adjoint sums of two gradient rows, at offset K-1, zero borders)
 *   grow:  2 rows of Wo   (finished gradient rows before the copy to the output)
 */
static size_t ws_elems(dims_t d) {
    return (size_t)4 * d.Lin + (size_t)8 * NSLOT(d.K) * d.Wpp + (size_t)8 * d.Lv + (size_t)2 * d.Wo;
}

/* Workspace for column tiles of `tile` map columns (forward) / gradient columns (backward);
 * tile <= 0: whole rows. */
size_t splat_ssim_workspace(int W, int K, int tile) {
    int w = W;
    if (tile > 0 && tile + 2 * (K - 1) < W) w = tile + 2 * (K - 1);
    return ws_elems(make_dims(w, K));
}
int splat_ssim_vector_width(void) { return V; }

/* The image pair as the kernel sees it: "logical" coordinates include `pad` zero rows / columns
 * around the H x W planes ("same" padding without a padded copy); col0 is the logical column of
 * the current tile's first column. */
typedef struct {
    const REAL *x, *y;
    int H, W, ld, pad, col0;
    REAL shift;        /* subtracted from every sample, padding included (see the top) */
} img_t;

/* The plane's shift: the mean of (x + y) / 2 over the finite pixels of its middle row, in double
 * (0 if none is finite: a NaN or Inf pixel then reaches only its window footprint). It depends on
 * the plane only, so every strip of a plane (and every thread count) uses the same one. */
static REAL plane_shift(const REAL *x, const REAL *y, int H, int W) {
    const REAL *a = x + (size_t)(H / 2) * W, *b = y + (size_t)(H / 2) * W;
    double s = 0;
    int n = 0;
    for (int j = 0; j < W; j++) {
        const double v = (double)a[j] + (double)b[j];
        if (v - v == 0) { s += v; n++; }  /* finite: inf - inf and nan - nan are nan */
    }
    return n ? (REAL)(s / (2.0 * n)) : (REAL)0;
}

typedef struct {
    dims_t d;
    img_t im;
    const REAL *g;     /* K taps */
    REAL *in;          /* 4 * Lin */
    REAL *hring;       /* 4 * K * Wpp, index [q][slot][j] */
    REAL *aring;       /* 4 * K * Wpp, index [q][slot][j] */
    REAL *vrow;        /* 4 * Lv */
    REAL *grow;        /* 2 * Wo */
} ws_t;

static ws_t make_ws(dims_t d, img_t im, const REAL *g, REAL *base) {
    ws_t w;
    w.d = d; w.im = im; w.g = g;
    w.in = base;
    w.hring = w.in + (size_t)4 * d.Lin;
    w.aring = w.hring + (size_t)4 * NSLOT(d.K) * d.Wpp;
    w.vrow = w.aring + (size_t)4 * NSLOT(d.K) * d.Wpp;
    w.grow = w.vrow + (size_t)8 * d.Lv;
    return w;
}

/* dst[0..n) = logical columns c0 .. c0+n-1 of a physical row of width W (NULL: a padding row),
 * minus the shift (a zero padding sample becomes -shift). */
static void copy_seg(REAL *restrict dst, const REAL *restrict row, int c0, int n, int W, REAL shift) {
    int lo = c0 < 0 ? -c0 : 0;
    int hi = W - c0 < n ? W - c0 : n;
    if (row == NULL || hi <= lo) { for (int j = 0; j < n; j++) dst[j] = -shift; return; }
    for (int j = 0; j < lo; j++) dst[j] = -shift;
    const REAL *src = row + c0;
    const vr sh = bc(shift);
    int j = lo;
    for (; j + V <= hi; j += V) st(dst + j, ld(src + j) - sh);
    for (; j < hi; j++) dst[j] = src[j] - shift;
    for (j = hi; j < n; j++) dst[j] = -shift;
}

/* x and y of logical row r of the current tile into the first two (zero-tailed) row buffers. */
static void load_xy(ws_t *w, int r) {
    const img_t im = w->im;
    const int rr = r - im.pad;
    const int inside = rr >= 0 && rr < im.H;
    copy_seg(w->in, inside ? im.x + (size_t)rr * im.ld : NULL, im.col0 - im.pad, w->d.W, im.W, im.shift);
    copy_seg(w->in + w->d.Lin, inside ? im.y + (size_t)rr * im.ld : NULL, im.col0 - im.pad, w->d.W, im.W,
             im.shift);
}

/* Load logical row r into the zero-tailed row buffers and form the products. */
static void load_row(ws_t *w, int r) {
    const dims_t d = w->d;
    REAL *bx = w->in, *by = bx + d.Lin, *bss = by + d.Lin, *bxy = bss + d.Lin;
    load_xy(w, r);
    for (int j = 0; j < d.Lin; j += V) {
        vr a = ld(bx + j), b = ld(by + j);
        st(bss + j, a * a + b * b); st(bxy + j, a * b);
    }
}

/* Horizontal "valid" filter of the four quantities of the loaded row into ring slot `slot`. */
static void hfilter(ws_t *w, int slot) {
    const dims_t d = w->d;
    const int K = KTAPS(d.K);
    const REAL *src = w->in;
    const size_t qs = (size_t)NSLOT(K) * d.Wpp;
    REAL *dst = w->hring + (size_t)slot * d.Wpp;
    for (int j = 0; j < d.Wpp; j += V) {
        vr s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
        for (int k = 0; k < K; k++) {
            vr gk = bc(w->g[k]);
            s0 += gk * ld(src + j + k);
            s1 += gk * ld(src + d.Lin + j + k);
            s2 += gk * ld(src + 2 * d.Lin + j + k);
            s3 += gk * ld(src + 3 * d.Lin + j + k);
        }
        st(dst + j, s0); st(dst + qs + j, s1); st(dst + 2 * qs + j, s2); st(dst + 3 * qs + j, s3);
    }
}

/* Make sure ring slots hold the horizontal sums of input rows m .. last; *next is the next input
 * row not yet filtered. */
static void fill_rows(ws_t *w, int m, int last, int *next) {
    const int K = KTAPS(w->d.K);
    if (*next < m) *next = m;
    while (*next <= last) {
        load_row(w, *next);
        hfilter(w, *next % NSLOT(K));
        (*next)++;
    }
}

/* The SSIM algebra of one vector of map positions, from the moments of the shifted images (mx,
 * my, ess = e[x'^2 + y'^2], exy = e[x' y']) and the true means ux, uy. The denominators are formed
 * as numerator + a non-negative difference,
 *   B1 = A1 + (mu_x - mu_y)^2,   B2 = A2 + max(0, (e_ss - 2 e_xy) - (mu_x - mu_y)^2)
 * (the second difference is the local variance of x - y), so lum = A1 / B1 and cs = A2 / B2 never
 * exceed 1 through rounding, and both are exactly 1 for identical images: then x' = y' bit for bit,
 * e_ss = 2 e_xy exactly (a^2 + a^2 = 2 a^2 with or without an FMA) and mu_x = mu_y. Written as
 * e_ss - mu_x^2 - mu_y^2 + C2, B2 rounds independently of A2 and SSIM(x, x) reached 1 + 2.4e-5
 * on flat images. Both are also kept >= -1 (a rounding below it on anticorrelated windows). */
static inline __attribute__((always_inline)) void ssim_terms(vr mx, vr my, vr ess, vr exy, vr ux, vr uy, vr c1,
                                                             vr c2, vr *iB1, vr *iB2, vr *lum, vr *cs) {
    const vr zero = {0}, mone = bc(-1);
    vr dm = mx - my;
    vr A1 = bc(2) * ux * uy + c1;
    vr B1 = A1 + dm * dm;
    vr A2 = bc(2) * (exy - mx * my) + c2;
    vr D = (ess - bc(2) * exy) - dm * dm;
    vr B2 = A2 + (vr)((vmask)D & ~(D < zero));  /* D < 0 only by rounding; a NaN stays */
    *iB1 = 1 / B1;  /* never 1 / (B1 B2): it overflows or underflows */
    *iB2 = 1 / B2;
    vr l = A1 * *iB1, c = A2 * *iB2;
    vmask lo = l < mone, co = c < mone;
    *lum = (vr)(((vmask)l & ~lo) | ((vmask)mone & lo));
    *cs = (vr)(((vmask)c & ~co) | ((vmask)mone & co));
}

/* Per map row: where its adjoint quantities go, and its row sums (NULL: none). */
typedef struct {
    REAL *a0;
    double *sums;
    vr acc_s, acc_c;
} rowout_t;

/* The SSIM algebra of one vector j of a map row from its vertical sums, the row sums, and in mode 1
 * beta, gamma and the alpha(s) into the row's aring slot. */
static inline __attribute__((always_inline)) void row_epilogue(rowout_t *o, int j, vr mx, vr my, vr ess, vr exy,
                                                               const ws_t *w, size_t qs, vr c1, vr c2, vr vgs,
                                                               vr vgc, int mode, int need_x, int need_y, int olo,
                                                               int ohi) {
    vmask lane;
    for (int i = 0; i < V; i++) lane[i] = i;
    const vr two = bc(2), sh = bc(w->im.shift);
    vr ux = mx + sh, uy = my + sh;  /* true means (mx, my: means of the shifted images) */
    vr iB1, iB2, lum, cs;
    ssim_terms(mx, my, ess, exy, ux, uy, c1, c2, &iB1, &iB2, &lum, &cs);
    vr ssim = lum * cs;
    vmask vm = (lane + j) < w->d.Wp;   /* all-ones bits in the map's lanes, 0 in the pad */
    if (o->sums) {  /* the map columns this tile owns */
        vmask own = ((lane + j) >= olo) & ((lane + j) < ohi);
        o->acc_s += (vr)((vmask)ssim & own);
        o->acc_c += (vr)((vmask)cs & own);
    }
    if (mode == 1) {
        REAL *a0 = o->a0;
        vr beta = -(vgs * ssim + vgc * cs) * iB2;
        vr gamma = two * (vgs * lum + vgc) * iB2;
        vr t = two * vgs * iB1;  /* 2 gS / B1 */
        st(a0 + j, (vr)((vmask)beta & vm));
        st(a0 + qs + j, (vr)((vmask)gamma & vm));
        int q = 2;
        if (need_x) {
            vr ax = t * (uy * cs - ux * ssim) - two * mx * beta - my * gamma;
            st(a0 + q * qs + j, (vr)((vmask)ax & vm));
            q++;
        }
        if (need_y) {
            vr ay = t * (ux * cs - uy * ssim) - two * my * beta - mx * gamma;
            st(a0 + q * qs + j, (vr)((vmask)ay & vm));
        }
    }
}

static void rowout_flush(rowout_t *o) {
    if (o->sums) {
        double s = 0, c = 0;
        for (int i = 0; i < V; i++) { s += o->acc_s[i]; c += o->acc_c[i]; }
        o->sums[0] += s;
        o->sums[1] += c;
    }
}

/* Vertical filter and SSIM algebra for map rows m .. m + nr - 1 (nr = 1 or 2; their K + nr - 1
 * input rows are in the ring). Two rows at once read each input row's sums once for both: the
 * vertical filter is bound by those reads (the ring lives in L2), not by its multiply-adds.
 * sums[r] != NULL: add row m + r's sums of ssim and cs over the tile's own map columns [olo, ohi)
 * to sums[r][0], sums[r][1]. mode 1: also write beta, gamma and the alpha(s) of each row to its
 * aring slot (pad lanes 0). The arithmetic of each row is the same whether it is done alone or
 * beside the next, so the numbers do not depend on the pairing. */
static void map_rows(ws_t *w, int m, int nr, REAL C1, REAL C2, int mode, double *const *sums,
                     REAL gS, REAL gC, int need_x, int need_y, int olo, int ohi) {
    const dims_t d = w->d;
    const int K = KTAPS(d.K);
    const size_t qs = (size_t)NSLOT(K) * d.Wpp;
    const REAL *hp[K + 1];   /* input row m + k's horizontal sums (quantity 0; the others qs apart) */
    for (int k = 0; k < K + nr - 1; k++) hp[k] = w->hring + (size_t)((m + k) % NSLOT(K)) * d.Wpp;
    rowout_t o[2];
    for (int r = 0; r < nr; r++) {
        o[r].a0 = w->aring + (size_t)((m + r) % NSLOT(K)) * d.Wpp;
        o[r].sums = sums[r];
        o[r].acc_s = o[r].acc_c = (vr){0};
    }
    const vr c1 = bc(C1), c2 = bc(C2), vgs = bc(gS), vgc = bc(gC);
    const REAL *g = w->g;

    if (nr == 2) {
        for (int j = 0; j < d.Wpp; j += V) {
            vr mx0 = {0}, my0 = {0}, es0 = {0}, ex0 = {0};
            vr mx1 = {0}, my1 = {0}, es1 = {0}, ex1 = {0};
            {   /* input row m: row m only */
                const REAL *h = hp[0] + j;
                vr gk = bc(g[0]);
                mx0 += gk * ld(h); my0 += gk * ld(h + qs); es0 += gk * ld(h + 2 * qs); ex0 += gk * ld(h + 3 * qs);
            }
            for (int k = 1; k < K; k++) {  /* input row m + k: tap k of row m, tap k - 1 of row m + 1 */
                const REAL *h = hp[k] + j;
                vr a = ld(h), b = ld(h + qs), c = ld(h + 2 * qs), e = ld(h + 3 * qs);
                vr g0 = bc(g[k]), g1 = bc(g[k - 1]);
                mx0 += g0 * a; my0 += g0 * b; es0 += g0 * c; ex0 += g0 * e;
                mx1 += g1 * a; my1 += g1 * b; es1 += g1 * c; ex1 += g1 * e;
            }
            {   /* input row m + K: row m + 1 only */
                const REAL *h = hp[K] + j;
                vr gk = bc(g[K - 1]);
                mx1 += gk * ld(h); my1 += gk * ld(h + qs); es1 += gk * ld(h + 2 * qs); ex1 += gk * ld(h + 3 * qs);
            }
            row_epilogue(&o[0], j, mx0, my0, es0, ex0, w, qs, c1, c2, vgs, vgc, mode, need_x, need_y, olo, ohi);
            row_epilogue(&o[1], j, mx1, my1, es1, ex1, w, qs, c1, c2, vgs, vgc, mode, need_x, need_y, olo, ohi);
        }
    } else {
        for (int j = 0; j < d.Wpp; j += V) {
            vr mx = {0}, my = {0}, ess = {0}, exy = {0};
            for (int k = 0; k < K; k++) {
                vr gk = bc(g[k]);
                const REAL *h = hp[k] + j;
                mx += gk * ld(h);
                my += gk * ld(h + qs);
                ess += gk * ld(h + 2 * qs);
                exy += gk * ld(h + 3 * qs);
            }
            row_epilogue(&o[0], j, mx, my, ess, exy, w, qs, c1, c2, vgs, vgc, mode, need_x, need_y, olo, ohi);
        }
    }
    for (int r = 0; r < nr; r++) rowout_flush(&o[r]);
}

/* v[q][j] = sum_t gw[t] * ap[t][q * qs + j] for the nq adjoint quantities (rows of Lv in vb). */
static inline __attribute__((always_inline)) void vadjoint(const REAL *const *ap, const REAL *gw, int n, int nq,
                                                           size_t qs, int Wpp, int Lv, REAL *vb) {
    for (int j = 0; j < Wpp; j += V) {
        vr s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
        for (int t = 0; t < n; t++) {
            vr gk = bc(gw[t]);
            const REAL *a = ap[t] + j;
            s0 += gk * ld(a);
            s1 += gk * ld(a + qs);
            s2 += gk * ld(a + 2 * qs);
            if (nq == 4) s3 += gk * ld(a + 3 * qs);
        }
        st(vb + j, s0);
        st(vb + Lv + j, s1);
        st(vb + 2 * Lv + j, s2);
        if (nq == 4) st(vb + 3 * Lv + j, s3);
    }
}

/* Map rows [m0, m1) of the tile: adds each row's sums over the own columns to out[2 m], out[2 m + 1]. */
static void fwd_tile(ws_t *w, REAL C1, REAL C2, int m0, int m1, double *out, int olo, int ohi) {
    const int K = KTAPS(w->d.K);
    int next = m0;
    for (int m = m0; m < m1;) {
        int nr = m + 1 < m1 ? 2 : 1;
        double *sums[2] = {out + 2 * m, out + 2 * m + 2};
        fill_rows(w, m, m + K + nr - 2, &next);
        map_rows(w, m, nr, C1, C2, 0, sums, 0, 0, 0, 0, olo, ohi);
        m += nr;
    }
}

/* Gradient of logical rows [q0, q1), tile columns [c_lo, c_hi) (all inside the physical image)
 * of L = gS * sum(ssim) + gC * sum(cs) over the tile's own "valid" map, plus l1c * sum|x - y|.
 * H is the logical height. The caller chooses tiles whose map covers every map pixel that
 * reaches columns [c_lo, c_hi). gx / gy point at the physical planes. */
/* Two gradient rows' vertical adjoints at once, v0 for row q and v1 for row q + 1, from the K + 1
 * map rows ap[0..K] = q - K + 1 .. q + 1 (all inside the map): each map row is read once for both.
 * Each sum runs over its rows in the order vadjoint uses, so the numbers are the same. */
static inline __attribute__((always_inline)) void vadjoint2(const REAL *const *ap, const REAL *g, int K, int nq,
                                                            size_t qs, int Wpp, int Lv, REAL *v0, REAL *v1) {
    for (int j = 0; j < Wpp; j += V) {
        vr a0, a1, a2, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
        {
            const REAL *a = ap[0] + j;
            vr gk = bc(g[K - 1]);
            a0 = gk * ld(a); a1 = gk * ld(a + qs); a2 = gk * ld(a + 2 * qs);
            if (nq == 4) a3 = gk * ld(a + 3 * qs);
            a0 = (vr){0} + a0; a1 = (vr){0} + a1; a2 = (vr){0} + a2; a3 = (vr){0} + a3;
        }
        for (int t = 1; t < K; t++) {
            const REAL *a = ap[t] + j;
            vr p0 = ld(a), p1 = ld(a + qs), p2 = ld(a + 2 * qs), p3 = nq == 4 ? ld(a + 3 * qs) : (vr){0};
            vr ga = bc(g[K - 1 - t]), gb = bc(g[K - t]);
            a0 += ga * p0; a1 += ga * p1; a2 += ga * p2;
            b0 += gb * p0; b1 += gb * p1; b2 += gb * p2;
            if (nq == 4) { a3 += ga * p3; b3 += gb * p3; }
        }
        {
            const REAL *a = ap[K] + j;
            vr gk = bc(g[0]);
            b0 += gk * ld(a); b1 += gk * ld(a + qs); b2 += gk * ld(a + 2 * qs);
            if (nq == 4) b3 += gk * ld(a + 3 * qs);
        }
        st(v0 + j, a0); st(v0 + Lv + j, a1); st(v0 + 2 * Lv + j, a2);
        st(v1 + j, b0); st(v1 + Lv + j, b1); st(v1 + 2 * Lv + j, b2);
        if (nq == 4) { st(v0 + 3 * Lv + j, a3); st(v1 + 3 * Lv + j, b3); }
    }
}

/* Horizontal adjoint of gradient row q from its vertical sums (vrow set `vr0`, K-1 zeros before
 * them) and the gradient row written out. */
static void hadjoint_row(ws_t *w, int q, const REAL *vr0, REAL gS, REAL l1c, int c_lo, int c_hi, int nq,
                         int need_x, int need_y, REAL *gx, REAL *gy) {
    (void)gS;
    const dims_t d = w->d;
    const int K = KTAPS(d.K);
    const REAL *g = w->g;
    /* horizontal adjoint: h(j) = sum_k g[k] v(j-k) = sum_t g[K-1-t] vrow[j+t] */
    const REAL *bx = w->in, *by = w->in + d.Lin;
    load_xy(w, q);                                      /* x, y of row q (tails 0) */
    REAL *ox = w->grow, *oy = w->grow + d.Wo;
    const vr l1 = bc(l1c), one = bc(1);
    for (int j = c_lo / V * V; j < c_hi; j += V) {
        vr hb = {0}, hg = {0}, h2 = {0}, h3 = {0};
        for (int t = 0; t < K; t++) {
            vr gk = bc(g[K - 1 - t]);
            const REAL *v = vr0 + j + t;
            hb += gk * ld(v);
            hg += gk * ld(v + d.Lv);
            h2 += gk * ld(v + 2 * d.Lv);
            if (nq == 4) h3 += gk * ld(v + 3 * d.Lv);
        }
        vr xv = ld(bx + j), yv = ld(by + j);
        vr two_hb = hb + hb;
        vr gxv = h2 + two_hb * xv + hg * yv;
        vr gyv = (need_x ? h3 : h2) + two_hb * yv + hg * xv;
        if (l1c != 0) {  /* + l1c * d|x - y|: sign(x - y), 0 where equal (torch's abs'); */
                         /* x - s, y - s keep the order of x, y (ties only below an ulp of s) */
            vr sg = (vr)((vmask)one & (xv > yv)) - (vr)((vmask)one & (xv < yv));
            gxv += l1 * sg;
            gyv -= l1 * sg;
        }
        if (need_x) st(ox + j, gxv);
        if (need_y) st(oy + j, gyv);
    }
    const img_t im = w->im;
    const size_t o = (size_t)(q - im.pad) * im.ld + (im.col0 + c_lo - im.pad);
    if (need_x) memcpy(gx + o, ox + c_lo, sizeof(REAL) * (c_hi - c_lo));
    if (need_y) memcpy(gy + o, oy + c_lo, sizeof(REAL) * (c_hi - c_lo));
}

static void bwd_tile(ws_t *w, int H, REAL C1, REAL C2, REAL gS, REAL gC, REAL l1c,
                     int q0, int q1, int c_lo, int c_hi, REAL *gx, REAL *gy,
                     double *rows, int own0, int own1, int olo, int ohi) {
    const dims_t d = w->d;
    const int K = KTAPS(d.K);
    const REAL *g = w->g;
    const int Hp = H - K + 1;
    const int need_x = gx != NULL, need_y = gy != NULL;
    const int nq = 2 + need_x + need_y;
    const size_t qs = (size_t)NSLOT(K) * d.Wpp;
    REAL *vrow1 = w->vrow + 4 * (size_t)d.Lv;  /* the second row's vertical sums */
    REAL *vb = w->vrow + (K - 1), *vb1 = vrow1 + (K - 1);  /* vertical sums start after K-1 zeros */
    int next_in = q0 - K + 1 < 0 ? 0 : q0 - K + 1;
    int next_m = next_in;

    for (int q = q0; q < q1;) {
        /* two gradient rows at once where both see K map rows */
        const int pair = q + 1 < q1 && q - K + 1 >= 0 && q + 1 <= Hp - 1;
        const int qe = pair ? q + 1 : q;
        int mhi = qe < Hp - 1 ? qe : Hp - 1;  /* map rows touching input rows q..qe: [q-K+1, qe] */
        while (next_m <= mhi) {  /* two map rows at a time where the map has them (one ahead) */
            int nr = next_m + 1 <= Hp - 1 ? 2 : 1;
            double *sums[2];
            for (int r = 0; r < nr; r++) {
                int mm = next_m + r;
                sums[r] = rows && mm >= own0 && mm < own1 ? rows + 2 * mm : NULL;
            }
            fill_rows(w, next_m, next_m + K + nr - 2, &next_in);
            map_rows(w, next_m, nr, C1, C2, 1, sums, gS, gC, need_x, need_y, olo, ohi);
            next_m += nr;
        }
        if (pair) {
            const REAL *ap[K + 1];
            for (int t = 0; t <= K; t++) ap[t] = w->aring + (size_t)((q - K + 1 + t) % NSLOT(K)) * d.Wpp;
            if (nq == 4) vadjoint2(ap, g, K, 4, qs, d.Wpp, d.Lv, vb, vb1);
            else vadjoint2(ap, g, K, 3, qs, d.Wpp, d.Lv, vb, vb1);
            hadjoint_row(w, q, w->vrow, gS, l1c, c_lo, c_hi, nq, need_x, need_y, gx, gy);
            hadjoint_row(w, q + 1, vrow1, gS, l1c, c_lo, c_hi, nq, need_x, need_y, gx, gy);
            q += 2;
            continue;
        }
        /* vertical adjoint: v(q) = sum_m g[q-m] a(m), over the map rows that exist */
        int mlo = q - K + 1 < 0 ? 0 : q - K + 1;
        int mh1 = q < Hp - 1 ? q : Hp - 1;
        const REAL *ap[K];
        REAL gw[K];
        int n = 0;
        for (int m = mlo; m <= mh1; m++, n++) {
            ap[n] = w->aring + (size_t)(m % NSLOT(K)) * d.Wpp;
            gw[n] = g[q - m];
        }
        if (n == K) {  /* interior rows: a compile-time trip count when K is fixed */
            if (nq == 4) vadjoint(ap, gw, K, 4, qs, d.Wpp, d.Lv, vb);
            else vadjoint(ap, gw, K, 3, qs, d.Wpp, d.Lv, vb);
        } else {
            vadjoint(ap, gw, n, nq, qs, d.Wpp, d.Lv, vb);
        }
        hadjoint_row(w, q, w->vrow, gS, l1c, c_lo, c_hi, nq, need_x, need_y, gx, gy);
        q++;
    }
}

/* One plane (H x W, contiguous, seen with `pad` zero rows / columns around it), swept in column
 * tiles of `tile` gradient columns (tile <= 0: whole rows). A tile covers the logical image columns
 * [a, b) its gradient columns [c0, c1) need and owns the map columns [c0 - K/2, c1 - K/2) (clipped
 * to the map): those are the ones it adds to the row sums, so every map column is summed once, in
 * the same lanes and the same order whatever the rows or threads, with or without a gradient. */
static void plane_tiles(const REAL *x, const REAL *y, int H, int W, const REAL *g, int K, REAL C1, REAL C2,
                        REAL gS, REAL gC, REAL l1c, int r0, int r1, REAL *work, REAL *gx, REAL *gy, int tile,
                        int pad, double *rows, int grad) {
    const int Wl = W + 2 * pad, Hl = H + 2 * pad;
    const int Wp = Wl - K + 1, Hp = Hl - K + 1, r = K / 2;
    const int T = tile > 0 ? tile : W;
    const REAL shift = plane_shift(x, y, H, W);
    for (int c0 = pad; c0 < pad + W; c0 += T) {
        int c1 = pad + W - c0 < T ? pad + W : c0 + T;
        int a = c0 - K + 1 < 0 ? 0 : c0 - K + 1;     /* tile image: logical columns [a, b) */
        int b = c1 + K - 1 > Wl ? Wl : c1 + K - 1;
        int olo = c0 - r < 0 ? 0 : c0 - r, ohi = c1 - r > Wp ? Wp : c1 - r;
        dims_t d = make_dims(b - a, K);
        img_t im = {x, y, H, W, W, pad, a, shift};
        memset(work, 0, ws_elems(d) * sizeof(REAL));
        ws_t w = make_ws(d, im, g, work);
        if (!grad) {
            fwd_tile(&w, C1, C2, r0, r1, rows, olo - a, ohi - a);
        } else {
            int own0 = r0 + pad - r < 0 ? 0 : r0 + pad - r;
            int own1 = r1 + pad - r > Hp ? Hp : r1 + pad - r;
            bwd_tile(&w, Hl, C1, C2, gS, gC, l1c, r0 + pad, r1 + pad, c0 - a, c1 - a, gx, gy, rows, own0, own1,
                     olo - a, ohi - a);
        }
    }
}

/* Sums of the SSIM and cs maps over map rows [m0, m1) of one plane (H x W, seen with `pad` zero
 * rows / columns around it): out[2 m] += sum_j ssim(m, j), out[2 m + 1] += sum_j cs(m, j) (out
 * zeroed by the caller; `tile` as in splat_ssim_bwd, which gives the same sums). */
void splat_ssim_fwd(const REAL *x, const REAL *y, int H, int W, const REAL *g, int K,
                    REAL C1, REAL C2, int m0, int m1, REAL *work, double *out, int tile, int pad) {
    plane_tiles(x, y, H, W, g, K, C1, C2, 0, 0, 0, m0, m1, work, NULL, NULL, tile, pad, out, 0);
}

/* Gradient rows [q0, q1) of one plane (H x W, seen with `pad` zero rows / columns around it) of
 * L = gS * sum(ssim map) + gC * sum(cs map) + l1c * sum|x - y|. gx / gy point at the plane's
 * gradient (NULL when that image needs none); rows outside [q0, q1) are not touched, so strips
 * can run in parallel. Column tiles of `tile` gradient columns (tile <= 0: whole rows) each
 * recompute the K-1 map columns they share with the next. rows != NULL (zeroed by the caller):
 * the forward's row sums in the same pass, out[2 m], out[2 m + 1] for the map rows m this strip
 * owns, [q0 + pad - K/2, q1 + pad - K/2) clipped to the map, exactly as splat_ssim_fwd adds them. */
void splat_ssim_bwd(const REAL *x, const REAL *y, int H, int W, const REAL *g, int K,
                    REAL C1, REAL C2, REAL gS, REAL gC, int q0, int q1, REAL *work,
                    REAL *gx, REAL *gy, int tile, int pad, REAL l1c, double *rows) {
    plane_tiles(x, y, H, W, g, K, C1, C2, gS, gC, l1c, q0, q1, work, gx, gy, tile, pad, rows, 1);
}

/* Per-row sums of |x - y| of one plane: out[r] = sum_j |x(r, j) - y(r, j)| (the L1 term). */
void splat_l1_rows(const REAL *x, const REAL *y, int H, int W, double *out) {
    for (int r = 0; r < H; r++) {
        const REAL *a = x + (size_t)r * W, *b = y + (size_t)r * W;
        vr acc = {0};
        int j = 0;
        for (; j + V <= W; j += V) {
            vr dlt = ld(a + j) - ld(b + j);
            vmask neg = dlt < 0;
            acc += (vr)(((vmask)dlt & ~neg) | ((vmask)(-dlt) & neg));  /* |d| */
        }
        double s = 0;
        for (int i = 0; i < V; i++) s += acc[i];
        for (; j < W; j++) s += a[j] > b[j] ? a[j] - b[j] : b[j] - a[j];
        out[r] = s;
    }
}

/* Even and odd lanes of the 2V-lane concatenation of a and b. */
#if V_LANES == 16
#define EVENS(a, b) __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
#define ODDS(a, b) __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31)
#elif V_LANES == 8
#define EVENS(a, b) __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14)
#define ODDS(a, b) __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15)
#elif V_LANES == 4
#define EVENS(a, b) __builtin_shufflevector(a, b, 0, 2, 4, 6)
#define ODDS(a, b) __builtin_shufflevector(a, b, 1, 3, 5, 7)
#else
#define EVENS(a, b) __builtin_shufflevector(a, b, 0, 2)
#define ODDS(a, b) __builtin_shufflevector(a, b, 1, 3)
#endif
/* Each lane of the low / high half of v twice: (v0, v0, v1, v1, ...). */
#if V_LANES == 16
#define DUP_LO(v) __builtin_shufflevector(v, v, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7)
#define DUP_HI(v) __builtin_shufflevector(v, v, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)
#elif V_LANES == 8
#define DUP_LO(v) __builtin_shufflevector(v, v, 0, 0, 1, 1, 2, 2, 3, 3)
#define DUP_HI(v) __builtin_shufflevector(v, v, 4, 4, 5, 5, 6, 6, 7, 7)
#elif V_LANES == 4
#define DUP_LO(v) __builtin_shufflevector(v, v, 0, 0, 1, 1)
#define DUP_HI(v) __builtin_shufflevector(v, v, 2, 2, 3, 3)
#else
#define DUP_LO(v) __builtin_shufflevector(v, v, 0, 0)
#define DUP_HI(v) __builtin_shufflevector(v, v, 1, 1)
#endif

/* MS-SSIM pyramid step on `planes` planes of H x W: an odd side is padded by repeating its last
 * row / column (bottom / right), then 2x2 blocks are averaged (TF ssim_multiscale's SYMMETRIC pad
 * + 2x2 VALID average pool). out is planes x ceil(H/2) x ceil(W/2). */
void splat_down2_fwd(const REAL *x, int planes, int H, int W, REAL *out) {
    const int Ho = (H + 1) / 2, Wo = (W + 1) / 2;
    for (int p = 0; p < planes; p++) {
        const REAL *xp = x + (size_t)p * H * W;
        REAL *op = out + (size_t)p * Ho * Wo;
        for (int i = 0; i < Ho; i++) {
            const REAL *r0 = xp + (size_t)(2 * i) * W;
            const REAL *r1 = xp + (size_t)(2 * i + 1 < H ? 2 * i + 1 : H - 1) * W;
            REAL *o = op + (size_t)i * Wo;
            int j = 0;
            const vr q = bc((REAL)0.25);
            for (; j + V <= W / 2; j += V) {  /* even / odd columns of two vectors, the same sum order */
                vr a0 = ld(r0 + 2 * j), a1 = ld(r0 + 2 * j + V), b0 = ld(r1 + 2 * j), b1 = ld(r1 + 2 * j + V);
                vr ae = EVENS(a0, a1), ao = ODDS(a0, a1), be = EVENS(b0, b1), bo = ODDS(b0, b1);
                st(o + j, (((ae + ao) + be) + bo) * q);
            }
            for (; j < W / 2; j++)
                o[j] = (((r0[2 * j] + r0[2 * j + 1]) + r1[2 * j]) + r1[2 * j + 1]) * (REAL)0.25;
            if (W & 1)
                o[Wo - 1] = (((r0[W - 1] + r0[W - 1]) + r1[W - 1]) + r1[W - 1]) * (REAL)0.25;
        }
    }
}

/* Adjoint of splat_down2_fwd: gx (planes x H x W) = (add ? gx : 0) + each input pixel's share of
 * the output gradients it fed (a repeated last row / column feeds its block twice). */
/* splat_down2_bwd with gx first scaled per plane: gx = scale[p] * gx + adjoint (add != 0;
 * scale == NULL: no scaling). MS-SSIM's backward scales each scale's unit gradient by its upstream
 * and adds the coarser scale's share in this one pass over the gradient. */
void splat_down2_bwd_scaled(const REAL *g, int planes, int H, int W, REAL *gx, int add, const REAL *scale) {
    const int Ho = (H + 1) / 2, Wo = (W + 1) / 2;
    for (int p = 0; p < planes; p++) {
        const REAL *gp = g + (size_t)p * Ho * Wo;
        REAL *xp = gx + (size_t)p * H * W;
        const REAL sc = scale ? scale[p] : (REAL)1;
        const vr vs = bc(sc);
        for (int i = 0; i < Ho; i++) {
            const REAL *gr = gp + (size_t)i * Wo;
            REAL rowf = (2 * i + 1 < H) ? (REAL)0.25 : (REAL)0.5;  /* repeated last row: twice */
            const vr vf = bc(rowf);
            REAL *r0 = xp + (size_t)(2 * i) * W;
            REAL *r1 = (2 * i + 1 < H) ? xp + (size_t)(2 * i + 1) * W : NULL;
            int j = 0;
            for (; j + V <= W / 2; j += V) {  /* each coarse value to its 2 x 2 block */
                vr v = ld(gr + j) * vf;
                vr lo = DUP_LO(v), hi = DUP_HI(v);
                REAL *rows[2] = {r0, r1};
                for (int r = 0; r < 2; r++) {
                    REAL *o = rows[r];
                    if (!o) continue;
                    if (add) {
                        st(o + 2 * j, ld(o + 2 * j) * vs + lo);
                        st(o + 2 * j + V, ld(o + 2 * j + V) * vs + hi);
                    } else {
                        st(o + 2 * j, lo);
                        st(o + 2 * j + V, hi);
                    }
                }
            }
            for (; j < W / 2; j++) {
                REAL v = gr[j] * rowf;
                if (add) {
                    r0[2 * j] = r0[2 * j] * sc + v; r0[2 * j + 1] = r0[2 * j + 1] * sc + v;
                    if (r1) { r1[2 * j] = r1[2 * j] * sc + v; r1[2 * j + 1] = r1[2 * j + 1] * sc + v; }
                } else {
                    r0[2 * j] = v; r0[2 * j + 1] = v;
                    if (r1) { r1[2 * j] = v; r1[2 * j + 1] = v; }
                }
            }
            if (W & 1) {
                REAL v = gr[Wo - 1] * rowf * 2;
                if (add) {
                    r0[W - 1] = r0[W - 1] * sc + v;
                    if (r1) r1[W - 1] = r1[W - 1] * sc + v;
                } else {
                    r0[W - 1] = v;
                    if (r1) r1[W - 1] = v;
                }
            }
        }
    }
}

void splat_down2_bwd(const REAL *g, int planes, int H, int W, REAL *gx, int add) {
    splat_down2_bwd_scaled(g, planes, H, W, gx, add, NULL);
}

/* ============================================================================================
 * Masked SSIM (semantics in splatloss/backends/masked.py). With M the padded mask and W = w*M:
 *   mu_x = w*(M x') / W, e_ss = w*(M (x'^2 + y'^2)) / W, e_xy = w*(M x' y') / W
 * (x' = x - s as above; a position with W = 0 uses W = 1: its centre weight is 0), and the value
 * per plane is sum_p c(p) S(p) / sum_p c(p), c the mask at each map position's centre pixel.
 * Forward: five filtered quantities (W, M x', M y', M (x'^2 + y'^2), M x' y') instead of four.
 * Backward of L = sum_p c(p) (gS ssim(p) + gC cs(p)) (gS, gC already divided by sum c): the
 * unmasked formulas with gS, gC replaced by c(p) gS, c(p) gC, the four adjoint quantities divided
 * by W before the transposed filters, and the pixel gradient multiplied by M:
 *   dL/dx = M (w^T*(alpha_x / W) + 2 x' (w^T*(beta / W)) + y' (w^T*(gamma / W))).
 * The masked L1 term l1c * sum m |x - y| adds l1c * m * sign(x - y) inside that product.
 * "same": the images read zeros (-s after the shift) and the mask ones outside the plane.
 * ============================================================================================ */

/* Workspace (REALs): in 8 rows of Lin (M, Mx', My', M(x'^2+y'^2), Mx'y', x', y', centre / mask
 * row), hring 5 * K rows of Wpp, aring 4 * K rows of Wpp, vrow 4 rows of Lv, grow 2 rows of Wo,
 * vsum 5 rows of Wpp (the vertical sums of the current map row). */
static size_t mws_elems(dims_t d) {
    return (size_t)8 * d.Lin + (size_t)9 * d.K * d.Wpp + (size_t)4 * d.Lv + (size_t)2 * d.Wo + (size_t)5 * d.Wpp;
}

size_t splat_mssim_workspace(int W, int K, int tile) {
    int w = W;
    if (tile > 0 && tile + 2 * (K - 1) < W) w = tile + 2 * (K - 1);
    return mws_elems(make_dims(w, K));
}

typedef struct {
    dims_t d;
    img_t im;
    const REAL *m;     /* mask plane, same layout as x */
    const REAL *g;
    REAL *in, *hring, *aring, *vrow, *grow, *vsum;
} mws_t;

static mws_t make_mws(dims_t d, img_t im, const REAL *m, const REAL *g, REAL *base) {
    mws_t w;
    w.d = d; w.im = im; w.m = m; w.g = g;
    w.in = base;
    w.hring = w.in + (size_t)8 * d.Lin;
    w.aring = w.hring + (size_t)5 * d.K * d.Wpp;
    w.vrow = w.aring + (size_t)4 * d.K * d.Wpp;
    w.grow = w.vrow + (size_t)4 * d.Lv;
    w.vsum = w.grow + (size_t)2 * d.Wo;
    return w;
}

/* dst[0..n) = mask at logical row r, logical columns c0 .. c0+n-1 (ones outside the plane). */
static void copy_mask(const mws_t *w, REAL *dst, int r, int c0, int n) {
    const img_t im = w->im;
    const int rr = r - im.pad;
    const REAL *row = rr >= 0 && rr < im.H ? w->m + (size_t)rr * im.ld : NULL;
    int lo = c0 < 0 ? -c0 : 0;
    int hi = im.W - c0 < n ? im.W - c0 : n;
    if (row == NULL || hi <= lo) { for (int j = 0; j < n; j++) dst[j] = 1; return; }
    for (int j = 0; j < lo; j++) dst[j] = 1;
    for (int j = lo; j < hi; j++) dst[j] = row[c0 + j];
    for (int j = hi; j < n; j++) dst[j] = 1;
}

/* x', y' of logical row r into rows 5, 6 and the mask into row 7 (zero tails). */
static void mload_xym(mws_t *w, int r) {
    const img_t im = w->im;
    const int rr = r - im.pad;
    const int inside = rr >= 0 && rr < im.H;
    const int L = w->d.Lin;
    copy_seg(w->in + 5 * L, inside ? im.x + (size_t)rr * im.ld : NULL, im.col0 - im.pad, w->d.W, im.W, im.shift);
    copy_seg(w->in + 6 * L, inside ? im.y + (size_t)rr * im.ld : NULL, im.col0 - im.pad, w->d.W, im.W, im.shift);
    copy_mask(w, w->in + 7 * L, r, im.col0 - im.pad, w->d.W);
}

static void mload_row(mws_t *w, int r) {
    const int L = w->d.Lin;
    REAL *b = w->in;
    mload_xym(w, r);
    for (int j = 0; j < L; j += V) {
        vr a = ld(b + 5 * L + j), c = ld(b + 6 * L + j), m = ld(b + 7 * L + j);
        vr ma = m * a, mc = m * c;
        st(b + j, m);
        st(b + L + j, ma);
        st(b + 2 * L + j, mc);
        st(b + 3 * L + j, ma * a + mc * c);
        st(b + 4 * L + j, ma * c);
    }
}

static void mhfilter(mws_t *w, int slot) {
    const dims_t d = w->d;
    const int K = KTAPS(d.K);
    const REAL *src = w->in;
    const size_t qs = (size_t)K * d.Wpp;
    REAL *dst = w->hring + (size_t)slot * d.Wpp;
    for (int j = 0; j < d.Wpp; j += V) {
        vr s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, s4 = {0};
        for (int k = 0; k < K; k++) {
            vr gk = bc(w->g[k]);
            s0 += gk * ld(src + j + k);
            s1 += gk * ld(src + d.Lin + j + k);
            s2 += gk * ld(src + 2 * d.Lin + j + k);
            s3 += gk * ld(src + 3 * d.Lin + j + k);
            s4 += gk * ld(src + 4 * d.Lin + j + k);
        }
        st(dst + j, s0); st(dst + qs + j, s1); st(dst + 2 * qs + j, s2); st(dst + 3 * qs + j, s3);
        st(dst + 4 * qs + j, s4);
    }
}

static void mfill_rows(mws_t *w, int m, int *next) {
    const int K = KTAPS(w->d.K);
    if (*next < m) *next = m;
    while (*next <= m + K - 1) {
        mload_row(w, *next);
        mhfilter(w, *next % K);
        (*next)++;
    }
}

/* Vertical filter for map row m, the masked statistics and the SSIM algebra.
 * mode 0: add the row's sums of c ssim, c cs and c to sums[0..2].
 * mode 1: write beta / W, gamma / W and the alpha(s) / W of map row m to aring slot m % K. */
static void mmap_row(mws_t *w, int m, REAL C1, REAL C2, int mode, double *sums,
                     REAL gS, REAL gC, int need_x, int need_y) {
    const dims_t d = w->d;
    const int K = KTAPS(d.K);
    const size_t qs = (size_t)K * d.Wpp;
    int sl[K];
    for (int k = 0; k < K; k++) sl[k] = (m + k) % K;
    /* centre weights: logical row m + K/2, columns col0 + K/2 + j (row 7 of `in`, zero tail) */
    REAL *cw = w->in + 7 * d.Lin;
    copy_mask(w, cw, m + d.K / 2, w->im.col0 - w->im.pad + d.K / 2, d.Wp);
    memset(cw + d.Wp, 0, sizeof(REAL) * (d.Lin - d.Wp));

    vr acc_s = {0}, acc_c = {0}, acc_z = {0};
    vmask lane;
    for (int i = 0; i < V; i++) lane[i] = i;
    REAL *a0 = w->aring + (size_t)(m % K) * d.Wpp;
    const size_t aqs = (size_t)K * d.Wpp;
    const vr c1 = bc(C1), c2 = bc(C2), two = bc(2), one = bc(1), zero = {0};
    const vr vgs = bc(gS), vgc = bc(gC), sh = bc(w->im.shift);

    /* vertical filter one quantity at a time: K row pointers stay in registers (five quantities at
     * once need 5 K addresses, which the compiler spills) */
    for (int q = 0; q < 5; q++) {
        const REAL *hp[K];
        for (int k = 0; k < K; k++) hp[k] = w->hring + q * qs + (size_t)sl[k] * d.Wpp;
        REAL *o = w->vsum + (size_t)q * d.Wpp;
        for (int j = 0; j < d.Wpp; j += V) {
            vr acc = {0};
            for (int k = 0; k < K; k++) acc += bc(w->g[k]) * ld(hp[k] + j);
            st(o + j, acc);
        }
    }
    const REAL *vs = w->vsum;
    for (int j = 0; j < d.Wpp; j += V) {
        vr fw = ld(vs + j), fx = ld(vs + d.Wpp + j), fy = ld(vs + 2 * d.Wpp + j);
        vr fss = ld(vs + 3 * d.Wpp + j), fxy = ld(vs + 4 * d.Wpp + j);
        vmask pos = fw > zero;
        vr iW = one / (vr)(((vmask)fw & pos) | ((vmask)one & ~pos));  /* W = 0: use 1 */
        vr mx = fx * iW, my = fy * iW, ess = fss * iW, exy = fxy * iW;
        vr ux = mx + sh, uy = my + sh;
        vr iB1, iB2, lum, cs;
        ssim_terms(mx, my, ess, exy, ux, uy, c1, c2, &iB1, &iB2, &lum, &cs);
        vr ssim = lum * cs;
        vr c = ld(cw + j);
        vmask vm = (lane + j) < d.Wp;
        if (mode == 0) {
            acc_s += (vr)((vmask)(c * ssim) & vm);
            acc_c += (vr)((vmask)(c * cs) & vm);
            acc_z += c;
        } else {
            vr hs = vgs * c, hc = vgc * c;
            vr beta = -(hs * ssim + hc * cs) * iB2;
            vr gamma = two * (hs * lum + hc) * iB2;
            vr t = two * hs * iB1;
            st(a0 + j, (vr)((vmask)(beta * iW) & vm));
            st(a0 + aqs + j, (vr)((vmask)(gamma * iW) & vm));
            int q = 2;
            if (need_x) {
                vr ax = t * (uy * cs - ux * ssim) - two * mx * beta - my * gamma;
                st(a0 + q * aqs + j, (vr)((vmask)(ax * iW) & vm));
                q++;
            }
            if (need_y) {
                vr ay = t * (ux * cs - uy * ssim) - two * my * beta - mx * gamma;
                st(a0 + q * aqs + j, (vr)((vmask)(ay * iW) & vm));
            }
        }
    }
    if (mode == 0) {
        double s = 0, cc = 0, z = 0;
        for (int i = 0; i < V; i++) { s += acc_s[i]; cc += acc_c[i]; z += acc_z[i]; }
        sums[0] += s;
        sums[1] += cc;
        sums[2] += z;
    }
}

static void mbwd_tile(mws_t *w, int H, REAL C1, REAL C2, REAL gS, REAL gC, REAL l1c,
                      int q0, int q1, int c_lo, int c_hi, REAL *gx, REAL *gy) {
    const dims_t d = w->d;
    const int K = KTAPS(d.K);
    const REAL *g = w->g;
    const int Hp = H - K + 1;
    const int need_x = gx != NULL, need_y = gy != NULL;
    const int nq = 2 + need_x + need_y;
    const size_t qs = (size_t)K * d.Wpp;
    REAL *vb = w->vrow + (K - 1);
    int next_in = q0 - K + 1 < 0 ? 0 : q0 - K + 1;
    int next_m = next_in;

    for (int q = q0; q < q1; q++) {
        int mhi = q < Hp - 1 ? q : Hp - 1;
        int mlo = q - K + 1 < 0 ? 0 : q - K + 1;
        while (next_m <= mhi) {
            mfill_rows(w, next_m, &next_in);
            mmap_row(w, next_m, C1, C2, 1, NULL, gS, gC, need_x, need_y);
            next_m++;
        }
        const REAL *ap[K];
        REAL gw[K];
        int n = 0;
        for (int m = mlo; m <= mhi; m++, n++) {
            ap[n] = w->aring + (size_t)(m % K) * d.Wpp;
            gw[n] = g[q - m];
        }
        if (n == K) {
            if (nq == 4) vadjoint(ap, gw, K, 4, qs, d.Wpp, d.Lv, vb);
            else vadjoint(ap, gw, K, 3, qs, d.Wpp, d.Lv, vb);
        } else {
            vadjoint(ap, gw, n, nq, qs, d.Wpp, d.Lv, vb);
        }
        const int L = d.Lin;
        mload_xym(w, q);
        const REAL *bx = w->in + 5 * L, *by = w->in + 6 * L, *bm = w->in + 7 * L;
        REAL *ox = w->grow, *oy = w->grow + d.Wo;
        const vr l1 = bc(l1c), one = bc(1);
        for (int j = c_lo / V * V; j < c_hi; j += V) {
            vr hb = {0}, hg = {0}, h2 = {0}, h3 = {0};
            for (int t = 0; t < K; t++) {
                vr gk = bc(g[K - 1 - t]);
                const REAL *v = w->vrow + j + t;
                hb += gk * ld(v);
                hg += gk * ld(v + d.Lv);
                h2 += gk * ld(v + 2 * d.Lv);
                if (nq == 4) h3 += gk * ld(v + 3 * d.Lv);
            }
            vr xv = ld(bx + j), yv = ld(by + j), mv = ld(bm + j);
            vr two_hb = hb + hb;
            vr gxv = h2 + two_hb * xv + hg * yv;
            vr gyv = (need_x ? h3 : h2) + two_hb * yv + hg * xv;
            if (l1c != 0) {
                vr sg = (vr)((vmask)one & (xv > yv)) - (vr)((vmask)one & (xv < yv));
                gxv += l1 * sg;
                gyv -= l1 * sg;
            }
            if (need_x) st(ox + j, mv * gxv);
            if (need_y) st(oy + j, mv * gyv);
        }
        const img_t im = w->im;
        const size_t o = (size_t)(q - im.pad) * im.ld + (im.col0 + c_lo - im.pad);
        if (need_x) memcpy(gx + o, ox + c_lo, sizeof(REAL) * (c_hi - c_lo));
        if (need_y) memcpy(gy + o, oy + c_lo, sizeof(REAL) * (c_hi - c_lo));
    }
}

/* Masked forward: per map row m in [m0, m1), out[3*(m-m0) + 0..2] = sums over the row of
 * c ssim, c cs and c (c: centre weights). mask: the plane's mask (H x W, like x). */
void splat_mssim_fwd(const REAL *x, const REAL *y, const REAL *mask, int H, int W, const REAL *g, int K,
                     REAL C1, REAL C2, int m0, int m1, REAL *work, double *out, int tile, int pad) {
    const int Wp = W + 2 * pad - K + 1;
    const int T = tile > 0 ? tile : Wp;
    const REAL shift = plane_shift(x, y, H, W);
    for (int m = m0; m < m1; m++) out[3 * (m - m0)] = out[3 * (m - m0) + 1] = out[3 * (m - m0) + 2] = 0;
    for (int j0 = 0; j0 < Wp; j0 += T) {
        int tw = Wp - j0 < T ? Wp - j0 : T;
        dims_t d = make_dims(tw + K - 1, K);
        img_t im = {x, y, H, W, W, pad, j0, shift};
        memset(work, 0, mws_elems(d) * sizeof(REAL));
        mws_t w = make_mws(d, im, mask, g, work);
        int next = m0;
        for (int m = m0; m < m1; m++) {
            mfill_rows(&w, m, &next);
            mmap_row(&w, m, C1, C2, 0, out + 3 * (m - m0), 0, 0, 0, 0);
        }
    }
}

/* Masked backward: gradient rows [q0, q1) of one plane of
 * L = gS * sum(c ssim) + gC * sum(c cs) + l1c * sum m |x - y| (see splat_ssim_bwd for the rest). */
void splat_mssim_bwd(const REAL *x, const REAL *y, const REAL *mask, int H, int W, const REAL *g, int K,
                     REAL C1, REAL C2, REAL gS, REAL gC, int q0, int q1, REAL *work,
                     REAL *gx, REAL *gy, int tile, int pad, REAL l1c) {
    const int Wl = W + 2 * pad;
    const int T = tile > 0 ? tile : W;
    const REAL shift = plane_shift(x, y, H, W);
    for (int c0 = pad; c0 < pad + W; c0 += T) {
        int c1 = pad + W - c0 < T ? pad + W : c0 + T;
        int a = c0 - K + 1 < 0 ? 0 : c0 - K + 1;
        int b = c1 + K - 1 > Wl ? Wl : c1 + K - 1;
        dims_t d = make_dims(b - a, K);
        img_t im = {x, y, H, W, W, pad, a, shift};
        memset(work, 0, mws_elems(d) * sizeof(REAL));
        mws_t w = make_mws(d, im, mask, g, work);
        mbwd_tile(&w, H + 2 * pad, C1, C2, gS, gC, l1c, q0 + pad, q1 + pad, c0 - a, c1 - a, gx, gy);
    }
}

/* Per-row sums of the masked L1 term of one plane: out[2r] = sum_j m |x - y|, out[2r+1] = sum_j m. */
void splat_masked_l1_rows(const REAL *x, const REAL *y, const REAL *mask, int H, int W, double *out) {
    for (int r = 0; r < H; r++) {
        const REAL *a = x + (size_t)r * W, *b = y + (size_t)r * W, *mm = mask + (size_t)r * W;
        vr acc = {0}, accm = {0};
        int j = 0;
        for (; j + V <= W; j += V) {
            vr dlt = ld(a + j) - ld(b + j), mv = ld(mm + j);
            vmask neg = dlt < 0;
            acc += mv * (vr)(((vmask)dlt & ~neg) | ((vmask)(-dlt) & neg));
            accm += mv;
        }
        double s = 0, z = 0;
        for (int i = 0; i < V; i++) { s += acc[i]; z += accm[i]; }
        for (; j < W; j++) { s += (double)mm[j] * (a[j] > b[j] ? a[j] - b[j] : b[j] - a[j]); z += mm[j]; }
        out[2 * r] = s;
        out[2 * r + 1] = z;
    }
}

/* The core's FMA peak, for the benchmark's arithmetic floor: `iters` rounds of 12 independent
 * multiply-add chains of the kernel's own vector type (compiled with the kernel's flags, so it
 * issues the instructions the filters issue). Returns the FMA lanes computed (12 V iters); the
 * caller times the call. The result is written to *sink so the chains are not optimised away. */
double splat_fma_peak(long iters, REAL *sink) {
    vr a[12];
    vr m = bc((REAL)0.999999), c = bc((REAL)1e-7);
    for (int i = 0; i < 12; i++) a[i] = bc((REAL)i);
    for (long k = 0; k < iters; k++) {
        for (int i = 0; i < 12; i++) a[i] = a[i] * m + c;
        __asm__ volatile("" : "+x"(m));  /* m is unknown to the compiler: no chain folds */
    }
    vr s = {0};
    for (int i = 0; i < 12; i++) s += a[i];
    st(sink, s);
    return 12.0 * V * (double)iters;
}
