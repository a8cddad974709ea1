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
 * Numerics (unmasked kernel): the moments are formed around local shifts, so that in a flat
 * window every difference is exactly 0 and E[x'^2] - E[x']^2 and the backward's terms do not
 * cancel at the magnitude of the pixel values (flat skies, walls, piecewise-constant renders):
 *   - map columns fall into groups of G = 4 (3 for K = 3) counted from the plane's map column 0;
 *     group J's shift column is its middle one, c_J = min(J G + G/2, W' - 1) + K/2, inside the
 *     window of every column of the group. Input row i's shifts are sx(i, J) = x(i, c_J),
 *     sy(i, J) = y(i, c_J) (one per image: both differences vanish where both images are flat;
 *     a "same" padding row holds 0).
 *   - horizontal pass of row i, map column j of group J: with dx = x - sx(i, J), dy = y - sy(i, J),
 *     h1x = g*dx, h1y = g*dy, h2 = g*(dx^2 + dy^2), hxy = g*(dx dy).
 *   - vertical pass: map rows 2b and 2b + 1 take the shifts Sx, Sy of input row 2b + K/2 (in both
 *     windows); each input row is re-based once per pair with tau = s(i, J) - S (0 in flat rows):
 *     h1' = h1 + tau, h2' = h2 + tau_x (h1x + h1x') + tau_y (h1y + h1y'),
 *     hxy' = hxy + (tau_x (h1y + h1y') + tau_y (h1x + h1x')) / 2, then filtered: the moments
 *     mu'_x, mu'_y, e_ss, e_xy of x' = x - Sx, y' = y - Sy.
 *   - SSIM: mu_x = Sx + mu'_x, mu_y = Sy + mu'_y; A1 = 2 mu_x mu_y + C1, B1 = A1 + (mu_x - mu_y)^2
 *     with mu_x - mu_y = (Sx - Sy) + (mu'_x - mu'_y); A2 = 2 (e_xy - mu'_x mu'_y) + C2,
 *     B2 = A2 + max(0, (e_ss - 2 e_xy) - (mu'_x - mu'_y)^2); beta, gamma as above and
 *     alpha_x = 2 gS (mu_y cs - mu_x ssim) / B1 - 2 mu'_x beta - mu'_y gamma (alpha_y likewise).
 *   - backward of gradient row i (the shifts are constants: no gradient flows through them):
 *     the vertical adjoint carries each map row's tau, Ax = w^T*(alpha_x + 2 beta tau_x + gamma tau_y),
 *     B = w^T*(2 beta), G = w^T*gamma (Ay with x and y swapped), and the horizontal adjoint takes
 *     each map column's own differences: dL/dx(j) = sum_j0 g (Ax + B (x(j) - sx) + G (y(j) - sy))(j0).
 * On two-level images (rectangles at 0.2 / 0.8 against a copy at 0.98x) the float32 gradient is
 * within 1e-5 of the float64 one normwise (one shift per plane: 3e-3). The masked kernel
 * (splat_mssim_*) uses the same shift columns, re-basing with each row's filtered mask (see there).
 * 1/B1 and 1/B2 are two divisions, never 1/(B1 B2): that product overflows (B1 ~ B2 ~ 1e19 at
 * data_range = 1e10) or underflows (C1 = C2 = 1e-20 on a black image) in float32.
 *
 * Cost: the work is all in the filters. The statistics are 4 quantities x
 * 2 passes, K taps each; the local shifts make a horizontal tap 9 operations instead of 4 (the
 * differences depend on the output lane's group), add the re-basing (about 12 operations per input
 * row per row pair) to the vertical pass, and 4 to 6 operations per tap to each adjoint pass (the
 * differences again). The passes wait on loads more than on arithmetic: on one Zen 4 core the SSIM
 * forward+backward at 1x3x720x1280 takes 1.35-1.4x the time of a kernel with one shift per plane.
 * splat_ssim_bwd can add the forward's row sums in the same sweep (`rows`): a caller that knows it
 * will need the gradient runs the statistics once instead of a forward and a recomputing backward.
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
typedef __typeof__((*(vmask *)0)[0]) mint;  /* vmask's lane: an integer of REAL's size */

/* Built once generic and once with -DFIXED_TAPS=11 (the default window): a compile-time tap
 * count lets the compiler unroll the tap loops and keep the taps in registers. */
#ifdef FIXED_TAPS
#define KTAPS(k) FIXED_TAPS
#else
#define KTAPS(k) (k)
#endif

/* A function compiled once, not cloned per constant argument (see mmap_row). */
#if defined(__clang__)
#define ONE_BODY __attribute__((noinline))
#else
#define ONE_BODY __attribute__((noinline, noclone))
#endif

static inline vr ld(const REAL *p) { vr v; memcpy(&v, p, sizeof v); return v; }
static inline void st(REAL *p, vr v) { memcpy(p, &v, sizeof v); }
static inline vr bc(REAL s) { return (vr){0} + s; }
/* A filter tap in every lane, broadcast straight from memory: bc's (vr){0} + s is a scalar add and a
 * register broadcast (0 + s is not s for s = -0), three instructions per tap in the filter loops. */
static inline vr tap(const REAL *p) { return *p - (vr){0}; }  /* s - 0 is s, -0 included */
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

/* Ring quantities of the unmasked kernel: the horizontal sums h1x, h1y, h2, hxy and the row's
 * shifts sx, sy (hring); beta2 = 2 beta, gamma, the alpha(s) and the map row's shifts Sx, Sy (aring).
 * A ring row (slot) holds its NQ quantities interleaved by vector, [j / V][q][V]: the vector of
 * columns j .. j + V - 1 (j a multiple of V) of quantity q is at row + NQ j + q V. The vertical
 * passes read NQ quantities of K + 1 rows at each j: stored as separate rows that was 78 concurrent
 * streams over as many 4 KiB pages, more than an L1 TLB holds (64 entries on Zen 3); interleaved it
 * is one stream per ring row. */
#define NQ 6

/* Workspace layout (REALs), all zero-initialised by the caller:
 *   in:    4 rows of Lin  (x, y of the current input row; two spare rows)
 *   hring: NSLOT(K) rows of NQ * Wpp (horizontal sums and shifts of the last input rows)
 *   aring: NSLOT(K) rows of NQ * Wpp (adjoint quantities and shifts of the last map rows)
 *   vrow:  12 rows of Lv  (vertical adjoint sums of two gradient rows, then the shifts sx, sy of
 *          those two rows, each at offset K-1 with zero borders)
 *   grow:  2 rows of Wo   (finished gradient rows before the copy to the output)
 *   ci:    Wpp integers of REAL's size (each map column's shift column, see gather_shifts)
 */
static size_t ws_elems(dims_t d) {
    return (size_t)4 * d.Lin + (size_t)2 * NQ * NSLOT(d.K) * d.Wpp + (size_t)12 * d.Lv + (size_t)2 * d.Wo + d.Wpp;
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
    REAL shift;        /* subtracted from every sample, padding included (0: the kernels shift locally) */
} img_t;

/* Width of the column groups that share a shift column: the shift column lies within K/2 of every
 * map column of its group (so inside all their windows) for K >= 5 with 4, for K = 3 with 3. */
static int shift_group(int K) { return K / 2 >= 2 ? 4 : 3; }

typedef struct {
    dims_t d;
    img_t im;
    const REAL *g;     /* K taps */
    REAL *in;          /* 4 * Lin */
    REAL *hring;       /* NSLOT(K) * NQ * Wpp, index [slot][j / V][q][j % V] */
    REAL *aring;       /* NSLOT(K) * NQ * Wpp, index [slot][j / V][q][j % V] */
    REAL *vrow;        /* 12 * Lv */
    REAL *grow;        /* 2 * Wo */
    mint *ci;          /* Wpp: map column j's shift column as a lane index (gather_shifts), j < Wp */
    REAL *dx, *dy;     /* MS-SSIM's next scale of x and y (planes of ceil(H/2) x ceil(W/2)), or NULL */
    int own_r0, own_r1, own_c0, own_c1;  /* the image rows and columns whose 2x2 blocks this tile writes */
} ws_t;

static ws_t make_ws(dims_t d, img_t im, const REAL *g, REAL *base) {
    ws_t w;
    w.d = d; w.im = im; w.g = g;
    w.in = base;
    w.hring = w.in + (size_t)4 * d.Lin;
    w.aring = w.hring + (size_t)NQ * NSLOT(d.K) * d.Wpp;
    w.vrow = w.aring + (size_t)NQ * NSLOT(d.K) * d.Wpp;
    w.grow = w.vrow + (size_t)12 * d.Lv;
    w.ci = (mint *)(void *)(w.grow + (size_t)2 * d.Wo);
    w.dx = w.dy = NULL;
    w.own_r0 = w.own_r1 = w.own_c0 = w.own_c1 = 0;
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

/* The shifts of the loaded row: sx[j] = x(row, c(j)), sy[j] = y(row, c(j)) for the map columns
 * j < Wp, 0 in the lanes beyond, each vector of V lanes NQ V after the last (a ring row). c(j) = j0 + K/2 - 1 + ci[j] with j0 = j rounded down to a whole
 * vector: ci[j] in [0, V + 3] picks a lane of the two vectors from column j0 + K/2 - 1 on (the
 * second may run past the row into the next buffer rows: those lanes are not picked, or cleared). */
static void gather_shifts(const ws_t *w, REAL *restrict sx, REAL *restrict sy) {
    const REAL *bx = w->in, *by = w->in + w->d.Lin;
    const mint *ci = w->ci;
    const int o = w->d.K / 2 - 1;
#if defined(__clang__) || V_LANES < 4
    for (int j = 0; j < w->d.Wp; j++) {
        const int c = j / V * V + o + (int)ci[j];
        sx[j / V * NQ * V + j % V] = bx[c];
        sy[j / V * NQ * V + j % V] = by[c];
    }
#else
    vmask lane;
    for (int i = 0; i < V; i++) lane[i] = i;
    for (int j = 0; j < w->d.Wp; j += V) {
        vmask idx, in = (lane + j) < w->d.Wp;
        memcpy(&idx, ci + j, sizeof idx);
        vr a = __builtin_shuffle(ld(bx + j + o), ld(bx + j + o + V), idx);
        vr b = __builtin_shuffle(ld(by + j + o), ld(by + j + o + V), idx);
        st(sx + NQ * j, (vr)((vmask)a & in));
        st(sy + NQ * j, (vr)((vmask)b & in));
    }
#endif
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

/* Columns [j0, j1) of one row of the MS-SSIM pyramid step (splat_down2_fwd) from image rows r0 and
 * r1 (the same row where a repeated last row stands in) of width W: each output the mean of its 2 x 2
 * block, summed in one order whatever the columns' split, so every split gives the same bits. */
static void down2_cols(const REAL *restrict r0, const REAL *restrict r1, int W, int j0, int j1, REAL *restrict o) {
    const int jp = j1 < W / 2 ? j1 : W / 2;  /* whole pairs of columns */
    const vr q = bc((REAL)0.25);
    int j = j0;
    for (; j + V <= jp; j += V) {  /* even / odd columns of two vectors, the same sum order */
        vr a0 = ld(r0 + 2 * j), a1 = ld(r0 + 2 * j + V), b0 = ld(r1 + 2 * j), b1 = ld(r1 + 2 * j + V);
        vr ae = EVENS(a0, a1), ao = ODDS(a0, a1), be = EVENS(b0, b1), bo = ODDS(b0, b1);
        st(o + j, (((ae + ao) + be) + bo) * q);
    }
    for (; j < jp; j++) o[j] = (((r0[2 * j] + r0[2 * j + 1]) + r1[2 * j]) + r1[2 * j + 1]) * (REAL)0.25;
    if ((W & 1) && j1 > W / 2)  /* an odd width's last column, repeated */
        o[W / 2] = (((r0[W - 1] + r0[W - 1]) + r1[W - 1]) + r1[W - 1]) * (REAL)0.25;
}

/* MS-SSIM's next scale written as the kernel reads the images: when the tile has read image row rr
 * (logical row r), the second of a pair (or an odd height's last, repeated), the pair's 2 x 2 means
 * over the column pairs it owns (those whose second column, or an odd width's last, it owns), from
 * rows still in the cache; every image row and column is owned by one strip and tile, so each
 * output is written once, as splat_down2_fwd writes it. */
static void emit_down2(const ws_t *w, int r) {
    const img_t im = w->im;
    const int rr = r - im.pad;
    if (!w->dx || rr < w->own_r0 || rr >= w->own_r1 || (!(rr & 1) && rr != im.H - 1)) return;
    const int i = rr / 2, Wo = (im.W + 1) / 2;
    const int j0 = w->own_c0 / 2, j1 = w->own_c1 >= im.W ? Wo : w->own_c1 / 2;
    const size_t a = (size_t)(2 * i) * im.ld, b = (size_t)(2 * i + 1 < im.H ? 2 * i + 1 : im.H - 1) * im.ld;
    down2_cols(im.x + a, im.x + b, im.W, j0, j1, w->dx + (size_t)i * Wo);
    down2_cols(im.y + a, im.y + b, im.W, j0, j1, w->dy + (size_t)i * Wo);
}

/* Rows of x and y (and the mask) are read from the images PF_ROWS rows ahead of the one being
 * filtered: a software prefetch per cache line, spread over the filter's column loop, so the lines
 * arrive while the filter computes (a single core streaming rows of two 3.7 MB planes otherwise
 * waits on each load: the row copy took a sixth of the SSIM forward + backward at 1x3x720x1280 on
 * one core). */
#define PF_ROWS 2
typedef struct {
    const char *x, *y, *m;  /* the columns' first bytes (x NULL: a padding row; m NULL: no mask) */
    int bytes;              /* how many */
} pf_t;

/* The columns of the tile's logical row r + PF_ROWS in the planes x, y (and m, laid out as x). */
static pf_t pf_row(const img_t *im, int W, const REAL *m, int r) {
    const int rr = r + PF_ROWS - im->pad;
    pf_t p = {NULL, NULL, NULL, 0};
    int c0 = im->col0 - im->pad, c1 = c0 + W;
    if (c0 < 0) c0 = 0;
    if (c1 > im->W) c1 = im->W;
    if (rr < 0 || rr >= im->H || c1 <= c0) return p;
    const size_t o = (size_t)rr * im->ld + c0;
    p.x = (const char *)(im->x + o);
    p.y = (const char *)(im->y + o);
    p.m = m ? (const char *)(m + o) : NULL;
    p.bytes = (int)sizeof(REAL) * (c1 - c0);
    return p;
}

/* The lines at byte offset o of the prefetched row (64-byte lines; o advances by VBYTES). */
static inline void pf_lines(pf_t p, int o) {
    if (o < p.bytes && (VBYTES >= 64 || (o & 63) == 0)) {
        __builtin_prefetch(p.x + o, 0, 2);
        __builtin_prefetch(p.y + o, 0, 2);
        if (p.m) __builtin_prefetch(p.m + o, 0, 2);
    }
}

/* Horizontal "valid" filter of logical row r into ring slot `slot`: the row's shifts, then the sums
 * of dx = x - sx, dy = y - sy (the shift of each output lane's column group):
 * h1x = g * dx, h1y = g * dy, h2 = g * (dx^2 + dy^2), and 2 hxy = 2 (g * (dx dy)) (doubled, exactly,
 * so that the re-basing and the SSIM algebra need no factor 1/2 or 2 on it). */
static void hfilter(ws_t *w, int r, int slot) {
    const dims_t d = w->d;
    const int K = KTAPS(d.K);
    const REAL *bx = w->in, *by = w->in + d.Lin, *g = w->g;  /* local: the stores may alias w */
    REAL *row = w->hring + (size_t)slot * NQ * d.Wpp;
    load_xy(w, r);
    emit_down2(w, r);
    gather_shifts(w, row + 4 * V, row + 5 * V);
    const pf_t pf = pf_row(&w->im, d.W, NULL, r);
    for (int j = 0; j < d.Wpp; j += V) {
        pf_lines(pf, (int)sizeof(REAL) * j);
        REAL *dst = row + NQ * j;
        const vr sx = ld(dst + 4 * V), sy = ld(dst + 5 * V);
        vr s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
        for (int k = 0; k < K; k++) {
            vr gk = tap(g + k);
            vr a = ld(bx + j + k) - sx, b = ld(by + j + k) - sy;
            vr p = a * a + b * b, q = a * b;  /* p = 2 q exactly when a = b, fused or not */
            s0 += gk * a;
            s1 += gk * b;
            s2 += gk * p;
            s3 += gk * q;
        }
        st(dst, s0); st(dst + V, s1); st(dst + 2 * V, s2); st(dst + 3 * V, s3 + s3);
    }
    for (int o = (int)sizeof(REAL) * d.Wpp; o < pf.bytes; o += VBYTES) pf_lines(pf, o);  /* the last K - 1 */
}

/* Make sure ring slots hold the horizontal sums of input rows m .. last; *next is the next input
 * row not yet filtered. */
static void fill_rows(ws_t *w, int m, int last, int *next) {
    const int K = KTAPS(w->d.K);
    if (*next < m) *next = m;
    while (*next <= last) {
        hfilter(w, *next, *next % NSLOT(K));
        (*next)++;
    }
}

/* One input row's horizontal sums (h: quantity 0 of its slot, the others qs apart; the fourth is
 * 2 hxy) re-based from its own shifts sx, sy to the map row's Sx, Sy: with tau = s - S,
 *   h1' = h1 + tau,  h2' = h2 + tau_x (h1x + h1x') + tau_y (h1y + h1y'),
 *   2 hxy' = 2 hxy + tau_x (h1y + h1y') + tau_y (h1x + h1x'),
 * the same expression as h2' with the operands crossed, so that h2' = 2 hxy' stays exact for
 * identical images. tau is exactly 0 in flat rows. */
static inline __attribute__((always_inline)) void rebase(const REAL *h, size_t qs, vr Sx, vr Sy, vr *m1x,
                                                         vr *m1y, vr *m2, vr *mxy) {
    vr h1x = ld(h), h1y = ld(h + qs);
    vr tx = ld(h + 4 * qs) - Sx, ty = ld(h + 5 * qs) - Sy;
    vr ax = h1x + tx, ay = h1y + ty;
    vr px = h1x + ax, py = h1y + ay;
    *m1x = ax;
    *m1y = ay;
    *m2 = ld(h + 2 * qs) + (tx * px + ty * py);
    *mxy = ld(h + 3 * qs) + (tx * py + ty * px);
}

/* The SSIM algebra of one vector of map positions, from the moments of the shifted images (mx,
 * my, ess = e[x'^2 + y'^2], exy = e[x' y']), the true means ux, uy and their difference du. The
 * denominators are formed as numerator + a non-negative difference,
 *   B1 = A1 + (mu_x - mu_y)^2,   B2 = A2 + max(0, (e_ss - 2 e_xy) - (mu'_x - mu'_y)^2)
 * (the second difference is the local variance of x - y), so lum = A1 / B1 and cs = A2 / B2 never
 * exceed 1 through rounding, and both are exactly 1 for identical images: then x' = y' bit for bit,
 * e_ss = 2 e_xy exactly (a^2 + a^2 = 2 a^2 with or without an FMA) and du = 0 (`exact`: the
 * ratios of B = A are then set to 1, since A (1 / A) may round below it). Written as
 * e_ss - mu_x^2 - mu_y^2 + C2, B2 rounds independently of A2 and SSIM(x, x) reached 1 + 2.4e-5
 * on flat images. Both are also kept >= -1 (a rounding below it on anticorrelated windows). */
static inline __attribute__((always_inline)) void ssim_terms_dd(vr A2, vr ux, vr uy, vr du, vr dm, vr dss, vr c1,
                                                                int exact, vr *iB1, vr *iB2, vr *lum, vr *cs) {
    const vr zero = {0}, mone = bc(-1);
    vr A1 = bc(2) * ux * uy + c1;
    vr B1 = A1 + du * du;
    vr D = dss - dm * dm;
    vr B2 = A2 + (vr)((vmask)D & ~(D < zero));  /* D < 0 only by rounding; a NaN stays */
    *iB1 = 1 / B1;  /* never 1 / (B1 B2): it overflows or underflows */
    *iB2 = 1 / B2;
    vr l = A1 * *iB1, c = A2 * *iB2;
    if (exact) {  /* A (1 / A) can round to 1 - 2^-24: where B = A the ratio is 1 */
        const vr one = bc(1);
        vmask e1 = B1 == A1, e2 = B2 == A2;
        l = (vr)(((vmask)l & ~e1) | ((vmask)one & e1));
        c = (vr)(((vmask)c & ~e2) | ((vmask)one & e2));
    }
    vmask lo = l < mone, co = c < mone;
    *lum = (vr)(((vmask)l & ~lo) | ((vmask)mone & lo));
    *cs = (vr)(((vmask)c & ~co) | ((vmask)mone & co));
}

/* A2 = 2 (e_xy - mu'_x mu'_y) + C2, and the differences dm = mu'_x - mu'_y and dss = e_ss - 2 e_xy,
 * given by the caller (the masked kernel forms them from its sums before the division by the
 * filtered mask). ssim_terms_du takes exy2 = 2 e_xy: 2 (e_xy - mu'_x mu'_y) = exy2 - (2 mu'_x) mu'_y
 * exactly, fused or not. */

static inline __attribute__((always_inline)) void ssim_terms_du(vr mx, vr my, vr ess, vr exy2, vr ux, vr uy,
                                                                vr du, vr c1, vr c2, int exact, vr *iB1, vr *iB2,
                                                                vr *lum, vr *cs) {
    ssim_terms_dd((exy2 - (bc(2) * mx) * my) + c2, ux, uy, du, mx - my, ess - exy2, c1, exact, iB1, iB2, lum, cs);
}

/* Per map row: where its adjoint quantities go, and its row sums (NULL: none). */
typedef struct {
    REAL *a0;
    double *sums;
    vr acc_s, acc_c;
} rowout_t;

/* The SSIM algebra of one vector j of a map row from its vertical sums (moments of x - Sx,
 * y - Sy), the row sums, and in mode 1 beta2 = 2 beta, gamma, the alpha(s) and Sx, Sy into the
 * row's aring slot (pad lanes 0). */
static inline __attribute__((always_inline)) void row_epilogue(rowout_t *o, int j, vr mx, vr my, vr ess, vr exy2,
                                                               vr Sx, vr Sy, const ws_t *w, size_t qs, vr c1,
                                                               vr c2, vr vgs, vr vgc, int mode, int need_x,
                                                               int need_y, int olo, int ohi) {
    vmask lane;
    for (int i = 0; i < V; i++) lane[i] = i;
    const vr two = bc(2);
    vr ux = Sx + mx, uy = Sy + my;  /* true means */
    vr du = (Sx - Sy) + (mx - my);
    vr iB1, iB2, lum, cs;
    ssim_terms_du(mx, my, ess, exy2, ux, uy, du, c1, c2, 1, &iB1, &iB2, &lum, &cs);
    vr ssim = lum * cs;
    vmask vm = (lane + j) < w->d.Wp;   /* all-ones bits in the map's lanes, 0 in the pad */
    if (o->sums) {  /* the map columns this tile owns */
        vmask own = ((lane + j) >= olo) & ((lane + j) < ohi);
        o->acc_s += (vr)((vmask)ssim & own);
        o->acc_c += (vr)((vmask)cs & own);
    }
    if (mode == 1) {
        REAL *a0 = o->a0 + NQ * j;
        vr beta2 = two * (-(vgs * ssim + vgc * cs) * iB2);
        vr gamma = two * (vgs * lum + vgc) * iB2;
        vr t = two * vgs * iB1;  /* 2 gS / B1 */
        st(a0, (vr)((vmask)beta2 & vm));
        st(a0 + qs, (vr)((vmask)gamma & vm));
        int q = 2;
        if (need_x) {
            vr ax = t * (uy * cs - ux * ssim) - mx * beta2 - my * gamma;
            st(a0 + q * qs, (vr)((vmask)ax & vm));
            q++;
        }
        if (need_y) {
            vr ay = t * (ux * cs - uy * ssim) - my * beta2 - mx * gamma;
            st(a0 + q * qs, (vr)((vmask)ay & vm));
        }
        st(a0 + 4 * qs, (vr)((vmask)Sx & vm));
        st(a0 + 5 * qs, (vr)((vmask)Sy & vm));
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
 * input rows are in the ring). Map rows 2b and 2b + 1 share the shifts of input row 2b + K/2 (in
 * both windows): each input row is re-based to them once for both rows, and read once.
 * sums[r] != NULL: add row m + r's sums of ssim and cs over the tile's own map columns [olo, ohi)
 * to sums[r][0], sums[r][1]. mode 1: also write the adjoint quantities of each row to its aring
 * slot. The arithmetic of each row is the same whether it is done alone or beside the next, so the
 * numbers do not depend on the pairing. */
static void map_rows(ws_t *w, int m, int nr, REAL C1, REAL C2, int mode, double *const *sums,
                     REAL gS, REAL gC, int need_x, int need_y, int olo, int ohi) {
    const dims_t d = w->d;
    const int K = KTAPS(d.K);
    const size_t qs = V, rs = (size_t)NQ * d.Wpp;  /* quantities qs apart; ring rows rs */
    if (nr == 2 && (m & 1)) {  /* two blocks: one row each */
        map_rows(w, m, 1, C1, C2, mode, sums, gS, gC, need_x, need_y, olo, ohi);
        map_rows(w, m + 1, 1, C1, C2, mode, sums + 1, gS, gC, need_x, need_y, olo, ohi);
        return;
    }
    const REAL *hp[K + 1];   /* input row m + k's ring row */
    for (int k = 0; k < K + nr - 1; k++) hp[k] = w->hring + (size_t)((m + k) % NSLOT(K)) * rs;
    const REAL *sp = w->hring + (size_t)(((m & ~1) + K / 2) % NSLOT(K)) * rs + 4 * qs;  /* Sx; Sy qs on */
    rowout_t o[2];
    for (int r = 0; r < nr; r++) {
        o[r].a0 = w->aring + (size_t)((m + r) % NSLOT(K)) * rs;
        o[r].sums = sums[r];
        o[r].acc_s = o[r].acc_c = (vr){0};
    }
    const vr c1 = bc(C1), c2 = bc(C2), vgs = bc(gS), vgc = bc(gC);
    const REAL *g = w->g;

    if (nr == 2) {
        for (int j = 0; j < d.Wpp; j += V) {
            const vr Sx = ld(sp + NQ * j), Sy = ld(sp + qs + NQ * j);
            vr mx0 = {0}, my0 = {0}, es0 = {0}, ex0 = {0};
            vr mx1 = {0}, my1 = {0}, es1 = {0}, ex1 = {0};
            vr a, b, c, e;
            rebase(hp[0] + NQ * j, qs, Sx, Sy, &a, &b, &c, &e);  /* input row m: row m only */
            {
                vr gk = tap(g);
                mx0 += gk * a; my0 += gk * b; es0 += gk * c; ex0 += gk * e;
            }
            for (int k = 1; k < K; k++) {  /* input row m + k: tap k of row m, tap k - 1 of row m + 1 */
                rebase(hp[k] + NQ * j, qs, Sx, Sy, &a, &b, &c, &e);
                vr g0 = tap(g + k), g1 = tap(g + k - 1);
                mx0 += g0 * a; my0 += g0 * b; es0 += g0 * c; ex0 += g0 * e;
                mx1 += g1 * a; my1 += g1 * b; es1 += g1 * c; ex1 += g1 * e;
            }
            rebase(hp[K] + NQ * j, qs, Sx, Sy, &a, &b, &c, &e);  /* input row m + K: row m + 1 only */
            {
                vr gk = tap(g + K - 1);
                mx1 += gk * a; my1 += gk * b; es1 += gk * c; ex1 += gk * e;
            }
            row_epilogue(&o[0], j, mx0, my0, es0, ex0, Sx, Sy, w, qs, c1, c2, vgs, vgc, mode, need_x, need_y, olo,
                         ohi);
            row_epilogue(&o[1], j, mx1, my1, es1, ex1, Sx, Sy, w, qs, c1, c2, vgs, vgc, mode, need_x, need_y, olo,
                         ohi);
        }
    } else {
        for (int j = 0; j < d.Wpp; j += V) {
            const vr Sx = ld(sp + NQ * j), Sy = ld(sp + qs + NQ * j);
            vr mx = {0}, my = {0}, ess = {0}, exy = {0};
            for (int k = 0; k < K; k++) {
                vr a, b, c, e;
                rebase(hp[k] + NQ * j, qs, Sx, Sy, &a, &b, &c, &e);
                vr gk = tap(g + k);
                mx += gk * a;
                my += gk * b;
                ess += gk * c;
                exy += gk * e;
            }
            row_epilogue(&o[0], j, mx, my, ess, exy, Sx, Sy, w, qs, c1, c2, vgs, vgc, mode, need_x, need_y, olo,
                         ohi);
        }
    }
    for (int r = 0; r < nr; r++) rowout_flush(&o[r]);
}

/* One map row's term of a gradient row's vertical adjoint (a: the map row's aring quantity 0, the
 * others qs apart; sx, sy: the gradient row's shifts): with tau = s - S of the map row,
 *   b += g beta2,  gm += g gamma,  ax += g (alpha_x + beta2 tau_x + gamma tau_y),  ay likewise. */
static inline __attribute__((always_inline)) void vtap(const REAL *a, size_t qs, vr gk, vr sx, vr sy, int need_x,
                                                       int need_y, vr *b, vr *gm, vr *ax, vr *ay) {
    vr B = ld(a), G = ld(a + qs);
    vr tx = sx - ld(a + 4 * qs), ty = sy - ld(a + 5 * qs);
    *b += gk * B;
    *gm += gk * G;
    if (need_x) *ax += gk * (ld(a + 2 * qs) + B * tx + G * ty);
    if (need_y) *ay += gk * (ld(a + (2 + need_x) * qs) + B * ty + G * tx);
}

/* v[q][j] = sum_t gw[t] * (the vtap terms of map row ap[t]) for gradient row shifts s (sx; sy Lv
 * on), into rows of Lv in vb: beta2, gamma, then alpha_x and / or alpha_y. The ring rows (of the
 * unmasked and the masked kernel alike) hold their NQ quantities interleaved by vector. */
static inline __attribute__((always_inline)) void vadjoint(const REAL *const *ap, const REAL *gw, int n,
                                                           int need_x, int need_y, size_t qs, int Wpp, int Lv,
                                                           const REAL *s, REAL *vb) {
    for (int j = 0; j < Wpp; j += V) {
        const vr sx = ld(s + j), sy = ld(s + Lv + j);
        vr b = {0}, gm = {0}, ax = {0}, ay = {0};
        for (int t = 0; t < n; t++) vtap(ap[t] + NQ * j, qs, tap(gw + t), sx, sy, need_x, need_y, &b, &gm, &ax, &ay);
        st(vb + j, b);
        st(vb + Lv + j, gm);
        if (need_x) st(vb + 2 * Lv + j, ax);
        if (need_y) st(vb + (2 + need_x) * Lv + j, ay);
    }
}

/* Two gradient rows' vertical adjoints at once, v0 for row q and v1 for row q + 1, from the K + 1
 * map rows ap[0..K] = q - K + 1 .. q + 1 (all inside the map): each map row is read once for both.
 * Each sum runs over its rows in the order vadjoint uses, so the numbers are the same. */
static inline __attribute__((always_inline)) void vadjoint2(const REAL *const *ap, const REAL *g, int K, int need_x,
                                                            int need_y, size_t qs, int Wpp, int Lv, const REAL *s0,
                                                            const REAL *s1, REAL *v0, REAL *v1) {
    for (int j = 0; j < Wpp; j += V) {
        const vr sx0 = ld(s0 + j), sy0 = ld(s0 + Lv + j), sx1 = ld(s1 + j), sy1 = ld(s1 + Lv + j);
        vr b0 = {0}, g0 = {0}, x0 = {0}, y0 = {0}, b1 = {0}, g1 = {0}, x1 = {0}, y1 = {0};
        vtap(ap[0] + NQ * j, qs, tap(g + K - 1), sx0, sy0, need_x, need_y, &b0, &g0, &x0, &y0);
        for (int t = 1; t < K; t++) {
            vtap(ap[t] + NQ * j, qs, tap(g + K - 1 - t), sx0, sy0, need_x, need_y, &b0, &g0, &x0, &y0);
            vtap(ap[t] + NQ * j, qs, tap(g + K - t), sx1, sy1, need_x, need_y, &b1, &g1, &x1, &y1);
        }
        vtap(ap[K] + NQ * j, qs, tap(g), sx1, sy1, need_x, need_y, &b1, &g1, &x1, &y1);
        st(v0 + j, b0); st(v0 + Lv + j, g0);
        st(v1 + j, b1); st(v1 + Lv + j, g1);
        if (need_x) { st(v0 + 2 * Lv + j, x0); st(v1 + 2 * Lv + j, x1); }
        if (need_y) { st(v0 + (2 + need_x) * Lv + j, y0); st(v1 + (2 + need_x) * Lv + j, y1); }
    }
}

/* |d| in the lanes whose column (col) lies in [lo, hi), +0 in the others (a NaN there too). */
static inline vr abs_own(vr d, vmask col, int lo, int hi) {
    vmask neg = d < (vr){0}, own = (col >= lo) & (col < hi);
    return (vr)((((vmask)d & ~neg) | ((vmask)(-d) & neg)) & own);
}

static inline double lane_sum(vr v) {
    double s = 0;
    for (int i = 0; i < V; i++) s += v[i];
    return s;
}

/* The masked L1 term's sums over the lanes whose column (col) lies in [lo, hi): *acc += m |x - y|,
 * *accm += m. The product feeds a mask, never an add, so no multiply-add contracts it: the same
 * bits wherever this is inlined. */
static inline void masked_abs_own(vr xv, vr yv, vr mv, vmask col, int lo, int hi, vr *acc, vr *accm) {
    const vmask own = (col >= lo) & (col < hi);
    *acc += (vr)((vmask)(mv * abs_own(xv - yv, col, lo, hi)) & own);
    *accm += (vr)((vmask)mv & own);
}

/* Horizontal adjoint of gradient row q from its vertical sums (vrow set `vr0`, K-1 zeros before
 * them) and its shifts (sr0, likewise placed), and the gradient row written out:
 *   gx(j) = sum_j0 g (Ax(j0) + beta2(j0) (x(j) - sx(j0)) + gamma(j0) (y(j) - sy(j0))),  gy likewise. */
static inline __attribute__((always_inline)) void hadjoint_row_(ws_t *w, int q, const REAL *vr0, const REAL *sr0,
                                                                 REAL l1c, int c_lo, int c_hi, int need_x,
                                                                 int need_y, REAL *gx, REAL *gy, double *l1sum) {
    const dims_t d = w->d;
    const int K = KTAPS(d.K);
    const REAL *g = w->g;
    /* horizontal adjoint: h(j) = sum_k g[k] v(j-k) = sum_t g[K-1-t] vrow[j+t] */
    const REAL *bx = w->in, *by = w->in + d.Lin;
    load_xy(w, q);                                      /* x, y of row q (tails 0) */
    REAL *ox = w->grow, *oy = w->grow + d.Wo;
    const vr l1 = bc(l1c), one = bc(1);
    const int qy = 2 + need_x;
    vmask lane;
    for (int i = 0; i < V; i++) lane[i] = i;
    vr l1acc = {0};
    for (int j = c_lo / V * V; j < c_hi; j += V) {
        const vr xv = ld(bx + j), yv = ld(by + j);
        vr gxv = {0}, gyv = {0};
        if (l1sum) l1acc += abs_own(xv - yv, lane + j, c_lo, c_hi);
        for (int t = 0; t < K; t++) {
            vr gk = tap(g + K - 1 - t);
            const REAL *v = vr0 + j + t, *s = sr0 + j + t;
            vr B = ld(v), G = ld(v + d.Lv);
            vr dx = xv - ld(s), dy = yv - ld(s + d.Lv);
            if (need_x) gxv += gk * (ld(v + 2 * d.Lv) + B * dx + G * dy);
            if (need_y) gyv += gk * (ld(v + qy * d.Lv) + B * dy + G * dx);
        }
        if (l1c != 0) {  /* + l1c * d|x - y|: sign(x - y), 0 where equal (torch's abs') */
            vr sg = (vr)((vmask)one & (xv > yv)) - (vr)((vmask)one & (xv < yv));
            gxv += l1 * sg;
            gyv -= l1 * sg;
        }
        if (need_x) st(ox + j, gxv);
        if (need_y) st(oy + j, gyv);
    }
    if (l1sum) *l1sum += lane_sum(l1acc);
    const img_t im = w->im;
    const size_t o = (size_t)(q - im.pad) * im.ld + (im.col0 + c_lo - im.pad);
    if (need_x) memcpy(gx + o, ox + c_lo, sizeof(REAL) * (c_hi - c_lo));
    if (need_y) memcpy(gy + o, oy + c_lo, sizeof(REAL) * (c_hi - c_lo));
}

/* hadjoint_row_ with the image flags as constants (no test in its tap loop). l1sum != NULL: add the
 * row's sum of |x - y| over the columns [c_lo, c_hi) to *l1sum (splat_l1_rows_tiled's lanes). */
static void hadjoint_row(ws_t *w, int q, const REAL *vr0, const REAL *sr0, REAL l1c, int c_lo, int c_hi,
                         int need_x, int need_y, REAL *gx, REAL *gy, double *l1sum) {
    if (need_x && need_y) hadjoint_row_(w, q, vr0, sr0, l1c, c_lo, c_hi, 1, 1, gx, gy, l1sum);
    else if (need_x) hadjoint_row_(w, q, vr0, sr0, l1c, c_lo, c_hi, 1, 0, gx, gy, l1sum);
    else hadjoint_row_(w, q, vr0, sr0, l1c, c_lo, c_hi, 0, 1, gx, gy, l1sum);
}

/* Map rows [m0, m1) of the tile: adds each row's sums over the own columns to out[2 m], out[2 m + 1]. */
static void fwd_tile(ws_t *w, REAL C1, REAL C2, int m0, int m1, double *out, int olo, int ohi) {
    const int K = KTAPS(w->d.K);
    int next = m0;
    for (int m = m0; m < m1;) {
        int nr = m + 1 < m1 && !(m & 1) ? 2 : 1;  /* pairs share their shifts: start them at even rows */
        double *sums[2] = {out + 2 * m, out + 2 * m + 2};
        fill_rows(w, m, m + K + nr - 2, &next);
        map_rows(w, m, nr, C1, C2, 0, sums, 0, 0, 0, 0, olo, ohi);
        m += nr;
    }
}

/* Input row q's shifts from its hring slot to s (sx) and s + Lv (sy). */
static void copy_shifts(const ws_t *w, int q, REAL *s) {
    const REAL *h = w->hring + (size_t)(q % NSLOT(w->d.K)) * NQ * w->d.Wpp + 4 * V;
    for (int j = 0; j < w->d.Wpp; j += V) {
        st(s + j, ld(h + NQ * j));
        st(s + w->d.Lv + j, ld(h + V + NQ * j));
    }
}

/* Gradient of logical rows [q0, q1), tile columns [c_lo, c_hi) (all inside the physical image)
 * of L = gS * sum(ssim) + gC * sum(cs) over the tile's own "valid" map, plus l1c * sum|x - y|.
 * H is the logical height. The caller chooses tiles whose map covers every map pixel that
 * reaches columns [c_lo, c_hi). gx / gy point at the physical planes. */
static void bwd_tile(ws_t *w, int H, REAL C1, REAL C2, REAL gS, REAL gC, REAL l1c,
                     int q0, int q1, int c_lo, int c_hi, REAL *gx, REAL *gy,
                     double *rows, int own0, int own1, int olo, int ohi, double *l1rows) {
    const dims_t d = w->d;
    const int K = KTAPS(d.K);
    const REAL *g = w->g;
    const int Hp = H - K + 1;
    const int need_x = gx != NULL, need_y = gy != NULL;
    const size_t qs = V, rs = (size_t)NQ * d.Wpp;  /* ring layout as in map_rows */
    REAL *vrow1 = w->vrow + 4 * (size_t)d.Lv;  /* the second row's vertical sums */
    REAL *srow0 = w->vrow + 8 * (size_t)d.Lv, *srow1 = w->vrow + 10 * (size_t)d.Lv;  /* their shifts */
    REAL *vb = w->vrow + (K - 1), *vb1 = vrow1 + (K - 1);  /* vertical sums start after K-1 zeros */
    REAL *sb = srow0 + (K - 1), *sb1 = srow1 + (K - 1);
    int next_in = q0 - K + 1 < 0 ? 0 : q0 - K + 1;
    int next_m = next_in;
#define L1ROW(q) (l1rows ? l1rows + ((q) - w->im.pad) : NULL)  /* logical row q's image row */

    for (int q = q0; q < q1;) {
        /* two gradient rows at once where both see K map rows */
        const int pair = q + 1 < q1 && q - K + 1 >= 0 && q + 1 <= Hp - 1;
        const int qe = pair ? q + 1 : q;
        int mhi = qe < Hp - 1 ? qe : Hp - 1;  /* map rows touching input rows q..qe: [q-K+1, qe] */
        while (next_m <= mhi) {  /* pairs 2b, 2b + 1 where the map has them (one ahead) */
            int nr = next_m + 1 <= Hp - 1 && !(next_m & 1) ? 2 : 1;
            double *sums[2];
            for (int r = 0; r < nr; r++) {
                int mm = next_m + r;
                sums[r] = rows && mm >= own0 && mm < own1 ? rows + 2 * mm : NULL;
            }
            fill_rows(w, next_m, next_m + K + nr - 2, &next_in);
            map_rows(w, next_m, nr, C1, C2, 1, sums, gS, gC, need_x, need_y, olo, ohi);
            next_m += nr;
        }
        /* the shifts of rows q (and q + 1) from the ring: it holds input rows up to q + K + 1 */
        copy_shifts(w, q, sb);
        if (pair) {
            copy_shifts(w, q + 1, sb1);
            const REAL *ap[K + 1];
            for (int t = 0; t <= K; t++) ap[t] = w->aring + (size_t)((q - K + 1 + t) % NSLOT(K)) * rs;
            if (need_x && need_y) vadjoint2(ap, g, K, 1, 1, qs, d.Wpp, d.Lv, sb, sb1, vb, vb1);
            else if (need_x) vadjoint2(ap, g, K, 1, 0, qs, d.Wpp, d.Lv, sb, sb1, vb, vb1);
            else vadjoint2(ap, g, K, 0, 1, qs, d.Wpp, d.Lv, sb, sb1, vb, vb1);
            hadjoint_row(w, q, w->vrow, srow0, l1c, c_lo, c_hi, need_x, need_y, gx, gy, L1ROW(q));
            hadjoint_row(w, q + 1, vrow1, srow1, l1c, c_lo, c_hi, need_x, need_y, gx, gy, L1ROW(q + 1));
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
            ap[n] = w->aring + (size_t)(m % NSLOT(K)) * rs;
            gw[n] = g[q - m];
        }
        if (n == K) {  /* interior rows: a compile-time trip count when K is fixed */
            if (need_x && need_y) vadjoint(ap, gw, K, 1, 1, qs, d.Wpp, d.Lv, sb, vb);
            else if (need_x) vadjoint(ap, gw, K, 1, 0, qs, d.Wpp, d.Lv, sb, vb);
            else vadjoint(ap, gw, K, 0, 1, qs, d.Wpp, d.Lv, sb, vb);
        } else {
            vadjoint(ap, gw, n, need_x, need_y, qs, d.Wpp, d.Lv, sb, vb);
        }
        hadjoint_row(w, q, w->vrow, srow0, l1c, c_lo, c_hi, need_x, need_y, gx, gy, L1ROW(q));
        q++;
    }
}

#undef L1ROW

/* One plane (H x W, contiguous, seen with `pad` zero rows / columns around it), swept in column
 * tiles of `tile` gradient columns (tile <= 0: whole rows). A tile covers the logical image columns
 * [a, b) its gradient columns [c0, c1) need and owns the map columns [c0 - K/2, c1 - K/2) (clipped
 * to the map): those are the ones it adds to the row sums, so every map column is summed once, in
 * the same lanes and the same order whatever the rows or threads, with or without a gradient. The
 * shift columns are those of the whole plane's map (groups of shift_group(K) map columns from
 * column 0), so every tile forms the same moments. */
static void plane_tiles(const REAL *x, const REAL *y, int H, int W, const REAL *g, int K, REAL C1, REAL C2,
                        REAL gS, REAL gC, REAL l1c, int r0, int r1, REAL *work, REAL *gx, REAL *gy, int tile,
                        int pad, double *rows, int grad, double *l1rows, REAL *dx, REAL *dy) {
    const int Wl = W + 2 * pad, Hl = H + 2 * pad;
    const int Wp = Wl - K + 1, Hp = Hl - K + 1, r = K / 2;
    const int T = tile > 0 ? tile : W;
    const int G = shift_group(K);
    for (int c0 = pad; c0 < pad + W; c0 += T) {
        int c1 = pad + W - c0 < T ? pad + W : c0 + T;
        int a = c0 - K + 1 < 0 ? 0 : c0 - K + 1;     /* tile image: logical columns [a, b) */
        int b = c1 + K - 1 > Wl ? Wl : c1 + K - 1;
        int olo = c0 - r < 0 ? 0 : c0 - r, ohi = c1 - r > Wp ? Wp : c1 - r;
        dims_t d = make_dims(b - a, K);
        img_t im = {x, y, H, W, W, pad, a, 0};
        memset(work, 0, ws_elems(d) * sizeof(REAL));
        ws_t w = make_ws(d, im, g, work);
        if (dx) {  /* the image rows and columns this strip and tile own */
            w.dx = dx; w.dy = dy;
            w.own_c0 = c0 - pad; w.own_c1 = c1 - pad;
            if (grad) {  /* its gradient rows */
                w.own_r0 = r0; w.own_r1 = r1;
            } else {  /* map rows [r0, r1): their windows' centre rows, the first and last strips to the edges */
                w.own_r0 = r0 == 0 ? 0 : r0 + r - pad;
                w.own_r1 = r1 >= Hp ? H : r1 + r - pad;
            }
        }
        for (int j = 0; j < d.Wp; j++) {  /* map column a + j: its group's middle column (clipped) */
            int mc = (a + j) / G * G + G / 2;
            w.ci[j] = (mint)((mc < Wp - 1 ? mc : Wp - 1) + r - a - (j / V * V + r - 1));
        }
        if (!grad) {
            fwd_tile(&w, C1, C2, r0, r1, rows, olo - a, ohi - a);
        } else {
            int own0 = r0 + pad - r < 0 ? 0 : r0 + pad - r;
            int own1 = r1 + pad - r > Hp ? Hp : r1 + pad - r;
            bwd_tile(&w, Hl, C1, C2, gS, gC, l1c, r0 + pad, r1 + pad, c0 - a, c1 - a, gx, gy, rows, own0, own1,
                     olo - a, ohi - a, l1rows);
        }
    }
}

/* Sums of the SSIM and cs maps over map rows [m0, m1) of one plane (H x W, seen with `pad` zero
 * rows / columns around it): out[2 m] += sum_j ssim(m, j), out[2 m + 1] += sum_j cs(m, j) (out
 * zeroed by the caller; `tile` as in splat_ssim_bwd, which gives the same sums). dx, dy != NULL:
 * MS-SSIM's next scale of x and y in the same pass (splat_down2_fwd's planes, bit for bit), the rows
 * whose windows centre in this strip's map rows (the first and last strips to the edges). */
void splat_ssim_fwd(const REAL *x, const REAL *y, int H, int W, const REAL *g, int K,
                    REAL C1, REAL C2, int m0, int m1, REAL *work, double *out, int tile, int pad, REAL *dx,
                    REAL *dy) {
    plane_tiles(x, y, H, W, g, K, C1, C2, 0, 0, 0, m0, m1, work, NULL, NULL, tile, pad, out, 0, NULL, dx, dy);
}

/* Gradient rows [q0, q1) of one plane (H x W, seen with `pad` zero rows / columns around it) of
 * L = gS * sum(ssim map) + gC * sum(cs map) + l1c * sum|x - y|. gx / gy point at the plane's
 * gradient (NULL when that image needs none); rows outside [q0, q1) are not touched, so strips
 * can run in parallel. Column tiles of `tile` gradient columns (tile <= 0: whole rows) each
 * recompute the K-1 map columns they share with the next. rows != NULL (zeroed by the caller):
 * the forward's row sums in the same pass, out[2 m], out[2 m + 1] for the map rows m this strip
 * owns, [q0 + pad - K/2, q1 + pad - K/2) clipped to the map, exactly as splat_ssim_fwd adds them.
 * dx, dy != NULL: MS-SSIM's next scale of x and y, as splat_down2_fwd writes it: the row pairs whose
 * second row (an odd height's last, repeated) is one of [q0, q1). */
void splat_ssim_bwd(const REAL *x, const REAL *y, int H, int W, const REAL *g, int K,
                    REAL C1, REAL C2, REAL gS, REAL gC, int q0, int q1, REAL *work,
                    REAL *gx, REAL *gy, int tile, int pad, REAL l1c, double *rows, double *l1rows, REAL *dx,
                    REAL *dy) {
    plane_tiles(x, y, H, W, g, K, C1, C2, gS, gC, l1c, q0, q1, work, gx, gy, tile, pad, rows, 1, l1rows, dx, dy);
}

/* Per-row sums of |x - y| of one plane, out[i] += the sum over row i, in the lanes and the order of
 * splat_ssim_bwd's l1rows (the same column tiles; each tile's vectors counted from its first
 * logical column, the lanes outside its own columns dropped), so a forward alone and the fused pass
 * give the same numbers. out zeroed by the caller. */
void splat_l1_rows_tiled(const REAL *x, const REAL *y, int H, int W, int K, int tile, int pad, double *out) {
    const int T = tile > 0 ? tile : W;
    vmask lane;
    for (int i = 0; i < V; i++) lane[i] = i;
    REAL bx[V_LANES], by[V_LANES];
    for (int c0 = pad; c0 < pad + W; c0 += T) {
        const int c1 = pad + W - c0 < T ? pad + W : c0 + T;
        const int a = c0 - K + 1 < 0 ? 0 : c0 - K + 1;
        const int c_lo = c0 - a, c_hi = c1 - a;
        for (int i = 0; i < H; i++) {
            const REAL *xr = x + (size_t)i * W, *yr = y + (size_t)i * W;
            vr acc = {0};
            for (int j = c_lo / V * V; j < c_hi; j += V) {
                const int p0 = a + j - pad;  /* the image column of lane 0 */
                vr xv, yv;
                if (p0 >= 0 && p0 + V <= W) {
                    xv = ld(xr + p0);
                    yv = ld(yr + p0);
                } else {  /* lanes past the image: not its own, dropped below */
                    for (int l = 0; l < V; l++) {
                        const int pc = p0 + l;
                        bx[l] = pc >= 0 && pc < W ? xr[pc] : 0;
                        by[l] = pc >= 0 && pc < W ? yr[pc] : 0;
                    }
                    xv = ld(bx);
                    yv = ld(by);
                }
                acc += abs_own(xv - yv, lane + j, c_lo, c_hi);
            }
            out[i] += lane_sum(acc);
        }
    }
}

/* MS-SSIM pyramid step on `planes` planes of H x W: an odd side is padded by repeating its last
 * row / column (bottom / right), then 2x2 blocks are averaged (TF ssim_multiscale's SYMMETRIC pad
 * + 2x2 VALID average pool). out is planes x ceil(H/2) x ceil(W/2). */
void splat_down2_fwd(const REAL *x, int planes, int H, int W, REAL *out) {
    const int Ho = (H + 1) / 2, Wo = (W + 1) / 2;
    for (int p = 0; p < planes; p++) {
        const REAL *xp = x + (size_t)p * H * W;
        REAL *op = out + (size_t)p * Ho * Wo;
        for (int i = 0; i < Ho; i++)
            down2_cols(xp + (size_t)(2 * i) * W, xp + (size_t)(2 * i + 1 < H ? 2 * i + 1 : H - 1) * W, W, 0, Wo,
                       op + (size_t)i * Wo);
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
 *   mu_x = w*(M x'') / W, e_ss = w*(M (x''^2 + y''^2)) / W, e_xy = w*(M x'' y'') / W
 * (x'' = x - Sx, y'' = y - Sy, the map position's local shifts below; a position with W = 0 uses
 * W = 1: its centre weight is 0), and the value per plane is sum_p c(p) S(p) / sum_p c(p), c the
 * mask at each map position's centre pixel.
 * Local shifts, as the unmasked kernel: per input row and group of shift_group(K) map columns, the
 * images' own values at the group's shift column (the whole plane's map columns from 0, so every
 * tile and thread count forms the same moments). The horizontal pass sums, per map column, the
 * weighted differences against its row's shifts (M, M dx, M dy, M (dx^2 + dy^2), M dx dy); the
 * vertical pass moves each row's sums to the map row's shifts (those of its centre row) with
 * tau = s - S and the row's filtered mask h_m (where the unmasked kernel has the taps' sum, 1):
 *   h1' = h1 + tau h_m,  h2' = h2 + tau_x (h1x + h1x') + tau_y (h1y + h1y'),
 *   hxy' = hxy + (tau_x (h1y + h1y') + tau_y (h1x + h1x')) / 2,
 * so that h2' = 2 hxy' stays exact for identical images; every difference and tau is exactly 0 in
 * flat windows (one shift per plane left float32 gradients ~1e-3 from float64 on flat images).
 * Backward of L = sum_p c(p) (gS ssim(p) + gC cs(p)) (gS, gC already divided by sum c): the
 * unmasked formulas with gS, gC replaced by c(p) gS, c(p) gC, the adjoint quantities divided by W
 * before the transposed filters, and the pixel gradient multiplied by M:
 *   dL/dx(j) = M(j) sum_j0 w (A_x(j0) + beta2(j0) (x(j) - sx(j0)) + gamma(j0) (y(j) - sy(j0))),
 * A_x, beta2, gamma the vertical adjoints of alpha_x / W, 2 beta / W, gamma / W with the shift
 * corrections of the unmasked kernel (vtap). The masked L1 term l1c * sum m |x - y| adds
 * l1c * m * sign(x - y) inside that product. "same": the images read zeros and the mask ones
 * outside the plane.
 * ============================================================================================ */

/* Workspace (REALs): in 8 rows of Lin (rows 5, 6, 7: x, y and the mask or centre weights of one
 * row), hring K slots of MQ * Wpp (h_m, h1x, h1y, h2, hxy, sx, sy per input row), aring K slots of
 * NQ * Wpp (beta2, gamma, alpha(s), Sx, Sy per map row), vrow 6 rows of Lv (the vertical adjoint sums
 * of a gradient row, then its shifts sx, sy, each at offset K-1 with zero borders), grow 2 rows of
 * Wo, mci Wpp integers (each map column's shift column in the row buffers). A ring slot holds its
 * quantities interleaved by vector, as the unmasked kernel's (quantity q of columns j .. j + V - 1
 * at slot + MQ j + q V, or NQ j + q V): the vertical passes then read one stream per slot. */
#define MQ 7
static size_t mws_elems(dims_t d) {
    return (size_t)8 * d.Lin + (size_t)13 * d.K * d.Wpp + (size_t)6 * d.Lv + (size_t)2 * d.Wo + d.Wpp;
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
    REAL *in, *hring, *aring, *vrow, *grow;
    int *mci;          /* Wpp: map column j's shift column in the row buffers, j < Wp */
} mws_t;

/* Wmap: the whole plane's map width (the shift columns are those of its groups). */
static mws_t make_mws(dims_t d, img_t im, const REAL *m, const REAL *g, REAL *base, int Wmap) {
    mws_t w;
    w.d = d; w.im = im; w.m = m; w.g = g;
    w.in = base;
    w.hring = w.in + (size_t)8 * d.Lin;
    w.aring = w.hring + (size_t)7 * d.K * d.Wpp;
    w.vrow = w.aring + (size_t)6 * d.K * d.Wpp;
    w.grow = w.vrow + (size_t)6 * d.Lv;
    w.mci = (int *)(void *)(w.grow + (size_t)2 * d.Wo);
    const int G = shift_group(d.K), col0 = im.col0;
    for (int j = 0; j < d.Wp; j++) {  /* map column col0 + j: its group's middle column (clipped) */
        int mc = (col0 + j) / G * G + G / 2;
        w.mci[j] = (mc < Wmap - 1 ? mc : Wmap - 1) + d.K / 2 - col0;
    }
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

/* x, y of logical row r into rows 5, 6 and the mask into row 7 (zero tails). */
static void mload_xym(mws_t *w, int r) {
    const img_t im = w->im;
    const int rr = r - im.pad;
    const int inside = rr >= 0 && rr < im.H;
    const int L = w->d.Lin;
    copy_seg(w->in + 5 * L, inside ? im.x + (size_t)rr * im.ld : NULL, im.col0 - im.pad, w->d.W, im.W, im.shift);
    copy_seg(w->in + 6 * L, inside ? im.y + (size_t)rr * im.ld : NULL, im.col0 - im.pad, w->d.W, im.W, im.shift);
    copy_mask(w, w->in + 7 * L, r, im.col0 - im.pad, w->d.W);
}

/* The loaded row's shifts: sx[j] = x(row, mci[j]), sy[j] = y(row, mci[j]) for the map columns
 * j < Wp, 0 in the lanes beyond (up to Wpp); each vector of V columns js V after the last (js = 1:
 * a plain row; MQ: a ring slot). */
static void mgather_shifts(const mws_t *w, REAL *restrict sx, REAL *restrict sy, size_t js) {
    const REAL *bx = w->in + 5 * w->d.Lin, *by = w->in + 6 * w->d.Lin;
    int j = 0;
    for (; j < w->d.Wp; j++) {
        const size_t o = (size_t)(j / V) * js * V + j % V;
        sx[o] = bx[w->mci[j]];
        sy[o] = by[w->mci[j]];
    }
    for (; j < w->d.Wpp; j++) {
        const size_t o = (size_t)(j / V) * js * V + j % V;
        sx[o] = sy[o] = 0;
    }
}

/* Horizontal filter of the loaded row r into ring slot `slot`: its shifts, then per map column the
 * sums of M, M dx, M dy, M (dx^2 + dy^2), M dx dy with dx = x - sx, dy = y - sy. */
static void mhfilter(mws_t *w, int r, int slot) {
    const dims_t d = w->d;
    const int K = KTAPS(d.K);
    const int L = d.Lin;
    const REAL *bx = w->in + 5 * L, *by = w->in + 6 * L, *bm = w->in + 7 * L;
    const size_t qs = V;  /* quantities of a column vector qs apart (interleaved slot) */
    REAL *row = w->hring + (size_t)slot * MQ * d.Wpp;
    mgather_shifts(w, row + 5 * qs, row + 6 * qs, MQ);
    const pf_t pf = pf_row(&w->im, d.W, w->m, r);
    for (int j = 0; j < d.Wpp; j += V) {
        pf_lines(pf, (int)sizeof(REAL) * j);
        REAL *dst = row + MQ * j;
        const vr sx = ld(dst + 5 * qs), sy = ld(dst + 6 * qs);
        vr s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, s4 = {0};
        for (int k = 0; k < K; k++) {
            vr gk = tap(w->g + k);
            vr mk = ld(bm + j + k);
            vr a = ld(bx + j + k) - sx, b = ld(by + j + k) - sy;
            vr ma = mk * a, mb = mk * b;
            vr p = ma * a + mb * b, q = ma * b;  /* p = 2 q exactly when a = b, fused or not */
            s0 += gk * mk;
            s1 += gk * ma;
            s2 += gk * mb;
            s3 += gk * p;
            s4 += gk * q;
        }
        st(dst, s0); st(dst + qs, s1); st(dst + 2 * qs, s2); st(dst + 3 * qs, s3);
        st(dst + 4 * qs, s4);
    }
    for (int o = (int)sizeof(REAL) * d.Wpp; o < pf.bytes; o += VBYTES) pf_lines(pf, o);  /* the last K - 1 */
}

static void mfill_rows(mws_t *w, int m, int *next) {
    const int K = KTAPS(w->d.K);
    if (*next < m) *next = m;
    while (*next <= m + K - 1) {
        mload_xym(w, *next);
        mhfilter(w, *next, *next % K);
        (*next)++;
    }
}

/* Vertical filter for map row m (each input row's sums re-based to the map row's shifts), the
 * masked statistics and the SSIM algebra.
 * sums != NULL: add the row's sums of c ssim, c cs and c to sums[0..2] (the forward, mode 0, and
 * the fused pass, mode 1, alike).
 * mode 1: write 2 beta / W, gamma / W, the alpha(s) / W and the shifts Sx, Sy of map row m to
 * aring slot m % K (pad lanes 0).
 * noinline, noclone: both modes run this one body, so the compiler contracts its multiply-adds
 * alike for both and their sums are the same bits (a clone per mode contracted them differently:
 * the sums differed in their last bits). */
ONE_BODY static void mmap_row(mws_t *w, int m, REAL C1, REAL C2, int mode,
                       double *sums, REAL gS, REAL gC, int need_x, int need_y) {
    const dims_t d = w->d;
    const int K = KTAPS(d.K);
    const size_t qs = V;  /* interleaved slots: quantities qs apart */
    const REAL *hp[K];
    for (int k = 0; k < K; k++) hp[k] = w->hring + (size_t)((m + k) % K) * MQ * d.Wpp;
    const REAL *hc = hp[d.K / 2];  /* the centre row: its shifts are the map row's */
    /* centre weights: logical row m + K/2, columns col0 + K/2 + j (row 7 of `in`, zero tail) */
    REAL *cw = w->in + 7 * d.Lin;
    copy_mask(w, cw, m + d.K / 2, w->im.col0 - w->im.pad + d.K / 2, d.Wp);
    memset(cw + d.Wp, 0, sizeof(REAL) * (d.Lin - d.Wp));

    vr acc_s = {0}, acc_c = {0}, acc_z = {0};
    vmask lane;
    for (int i = 0; i < V; i++) lane[i] = i;
    REAL *a0 = w->aring + (size_t)(m % K) * NQ * d.Wpp;
    const vr c1 = bc(C1), c2 = bc(C2), two = bc(2), one = bc(1), half = bc((REAL)0.5), zero = {0};
    const vr vgs = bc(gS), vgc = bc(gC);

    for (int j = 0; j < d.Wpp; j += V) {
        const vr Sx = ld(hc + MQ * j + 5 * qs), Sy = ld(hc + MQ * j + 6 * qs);
        vr fw = {0}, fx = {0}, fy = {0}, fss = {0}, fxy = {0};
        for (int k = 0; k < K; k++) {
            const REAL *h = hp[k] + MQ * j;
            vr gk = tap(w->g + k);
            vr hm = ld(h), h1x = ld(h + qs), h1y = ld(h + 2 * qs);
            vr tx = ld(h + 5 * qs) - Sx, ty = ld(h + 6 * qs) - Sy;
            vr ax = h1x + tx * hm, ay = h1y + ty * hm;
            vr px = h1x + ax, py = h1y + ay;
            fw += gk * hm;
            fx += gk * ax;
            fy += gk * ay;
            fss += gk * (ld(h + 3 * qs) + (tx * px + ty * py));
            fxy += gk * (ld(h + 4 * qs) + half * (tx * py + ty * px));
        }
        vmask pos = fw > zero;
        vr iW = one / (vr)(((vmask)fw & pos) | ((vmask)one & ~pos));  /* W = 0: use 1 */
        vr mx = fx * iW, my = fy * iW, exy = fxy * iW;
        vr ux = mx + Sx, uy = my + Sy;  /* true means */
        /* the differences from the sums, then divided: (fx - fy) / W is exactly 0 for identical images,
         * while mx - my may be contracted into one fused multiply-add that keeps fx (1 / W) unrounded
         * (SSIM(x, x) came out 1 - 1e-6 under -ffp-contract=fast) */
        vr dm = (fx - fy) * iW;
        vr du = (Sx - Sy) + dm;
        vr iB1, iB2, lum, cs;
        ssim_terms_dd(two * (exy - mx * my) + c2, ux, uy, du, dm, (fss - two * fxy) * iW, c1, 1, &iB1, &iB2, &lum,
                      &cs);
        vr ssim = lum * cs;
        vr c = ld(cw + j);
        vmask vm = (lane + j) < d.Wp;
        if (sums) {
            acc_s += (vr)((vmask)(c * ssim) & vm);
            acc_c += (vr)((vmask)(c * cs) & vm);
            acc_z += c;
        }
        if (mode == 1) {
            vr hs = vgs * c, hc2 = vgc * c;
            vr beta2 = two * (-(hs * ssim + hc2 * cs) * iB2);
            vr gamma = two * (hs * lum + hc2) * iB2;
            vr t = two * hs * iB1;
            REAL *ao = a0 + NQ * j;
            st(ao, (vr)((vmask)(beta2 * iW) & vm));
            st(ao + qs, (vr)((vmask)(gamma * iW) & vm));
            int q = 2;
            if (need_x) {
                vr ax = t * (uy * cs - ux * ssim) - mx * beta2 - my * gamma;
                st(ao + q * qs, (vr)((vmask)(ax * iW) & vm));
                q++;
            }
            if (need_y) {
                vr ay = t * (ux * cs - uy * ssim) - my * beta2 - mx * gamma;
                st(ao + q * qs, (vr)((vmask)(ay * iW) & vm));
            }
            st(ao + 4 * qs, (vr)((vmask)Sx & vm));
            st(ao + 5 * qs, (vr)((vmask)Sy & vm));
        }
    }
    if (sums) {
        double s = 0, cc = 0, z = 0;
        for (int i = 0; i < V; i++) { s += acc_s[i]; cc += acc_c[i]; z += acc_z[i]; }
        sums[0] += s;
        sums[1] += cc;
        sums[2] += z;
    }
}

static void mbwd_tile(mws_t *w, int H, REAL C1, REAL C2, REAL gS, REAL gC, REAL l1c, int q0, int q1, int c_lo,
                      int c_hi, REAL *gx, REAL *gy, double *rows, int own0, int own1, double *l1rows) {
    const dims_t d = w->d;
    const int K = KTAPS(d.K);
    const REAL *g = w->g;
    const int Hp = H - K + 1;
    const int need_x = gx != NULL, need_y = gy != NULL;
    const int qy = 2 + need_x;
    const size_t qs = V;  /* the aring's interleaved slots (as the unmasked kernel's) */
    REAL *vb = w->vrow + (K - 1);                          /* vertical sums after K-1 zeros */
    REAL *srow = w->vrow + 4 * (size_t)d.Lv, *sb = srow + (K - 1);  /* the row's shifts, likewise */
    int next_in = q0 - K + 1 < 0 ? 0 : q0 - K + 1;
    int next_m = next_in;

    for (int q = q0; q < q1; q++) {
        int mhi = q < Hp - 1 ? q : Hp - 1;
        int mlo = q - K + 1 < 0 ? 0 : q - K + 1;
        while (next_m <= mhi) {
            mfill_rows(w, next_m, &next_in);
            double *sums = rows && next_m >= own0 && next_m < own1 ? rows + 3 * (size_t)next_m : NULL;
            mmap_row(w, next_m, C1, C2, 1, sums, gS, gC, need_x, need_y);
            next_m++;
        }
        const int L = d.Lin;
        mload_xym(w, q);
        mgather_shifts(w, sb, sb + d.Lv, 1);
        /* vertical adjoint: v(q) = sum_m g[q-m] (a(m) + shift corrections), over the map rows that exist */
        const REAL *ap[K];
        REAL gw[K];
        int n = 0;
        for (int m = mlo; m <= mhi; m++, n++) {
            ap[n] = w->aring + (size_t)(m % K) * NQ * d.Wpp;
            gw[n] = g[q - m];
        }
        if (n == K) {
            if (need_x && need_y) vadjoint(ap, gw, K, 1, 1, qs, d.Wpp, d.Lv, sb, vb);
            else if (need_x) vadjoint(ap, gw, K, 1, 0, qs, d.Wpp, d.Lv, sb, vb);
            else vadjoint(ap, gw, K, 0, 1, qs, d.Wpp, d.Lv, sb, vb);
        } else {
            vadjoint(ap, gw, n, need_x, need_y, qs, d.Wpp, d.Lv, sb, vb);
        }
        /* horizontal adjoint: gx(j) = M(j) sum_t g[K-1-t] (A_x + beta2 (x(j) - sx) + gamma (y(j) - sy))
         * at vrow column j + t */
        const REAL *bx = w->in + 5 * L, *by = w->in + 6 * L, *bm = w->in + 7 * L;
        REAL *ox = w->grow, *oy = w->grow + d.Wo;
        const vr l1 = bc(l1c), one = bc(1);
        vmask lane;
        for (int i = 0; i < V; i++) lane[i] = i;
        vr l1acc = {0}, l1m = {0};
        for (int j = c_lo / V * V; j < c_hi; j += V) {
            const vr xv = ld(bx + j), yv = ld(by + j), mv = ld(bm + j);
            vr gxv = {0}, gyv = {0};
            if (l1rows) masked_abs_own(xv, yv, mv, lane + j, c_lo, c_hi, &l1acc, &l1m);
            for (int t = 0; t < K; t++) {
                vr gk = tap(g + K - 1 - t);
                const REAL *v = w->vrow + j + t, *s = srow + j + t;
                vr B = ld(v), G = ld(v + d.Lv);
                vr dx = xv - ld(s), dy = yv - ld(s + d.Lv);
                if (need_x) gxv += gk * (ld(v + 2 * d.Lv) + B * dx + G * dy);
                if (need_y) gyv += gk * (ld(v + qy * d.Lv) + B * dy + G * dx);
            }
            if (l1c != 0) {
                vr sg = (vr)((vmask)one & (xv > yv)) - (vr)((vmask)one & (xv < yv));
                gxv += l1 * sg;
                gyv -= l1 * sg;
            }
            if (need_x) st(ox + j, mv * gxv);
            if (need_y) st(oy + j, mv * gyv);
        }
        if (l1rows) {  /* the image row's masked L1 sums, as splat_masked_l1_rows_tiled adds them */
            l1rows[2 * (size_t)(q - w->im.pad)] += lane_sum(l1acc);
            l1rows[2 * (size_t)(q - w->im.pad) + 1] += lane_sum(l1m);
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
    for (int m = m0; m < m1; m++) out[3 * (m - m0)] = out[3 * (m - m0) + 1] = out[3 * (m - m0) + 2] = 0;
    for (int j0 = 0; j0 < Wp; j0 += T) {
        int tw = Wp - j0 < T ? Wp - j0 : T;
        dims_t d = make_dims(tw + K - 1, K);
        img_t im = {x, y, H, W, W, pad, j0, 0};
        memset(work, 0, mws_elems(d) * sizeof(REAL));
        mws_t w = make_mws(d, im, mask, g, work, Wp);
        int next = m0;
        for (int m = m0; m < m1; m++) {
            mfill_rows(&w, m, &next);
            mmap_row(&w, m, C1, C2, 0, out + 3 * (m - m0), 0, 0, 0, 0);
        }
    }
}

/* Masked backward: gradient rows [q0, q1) of one plane of
 * L = gS * sum(c ssim) + gC * sum(c cs) + l1c * sum m |x - y| (see splat_ssim_bwd for the rest).
 * rows != NULL (zeroed by the caller): the forward's sums in the same pass, rows[3 m .. 3 m + 2] +=
 * splat_mssim_fwd's sums of map row m for the map rows this strip owns, [q0 + pad - K/2,
 * q1 + pad - K/2) clipped to the map; the plane is then swept in whole rows (as splat_mssim_fwd
 * sweeps it), so the sums are its numbers bit for bit. l1rows != NULL (zeroed, with rows): the
 * masked L1 term's sums of image rows [q0, q1), l1rows[2 i] += sum m |x - y|, l1rows[2 i + 1] +=
 * sum m, as splat_masked_l1_rows_tiled adds them. */
void splat_mssim_bwd(const REAL *x, const REAL *y, const REAL *mask, int H, int W, const REAL *g, int K,
                     REAL C1, REAL C2, REAL gS, REAL gC, int q0, int q1, REAL *work,
                     REAL *gx, REAL *gy, int tile, int pad, REAL l1c, double *rows, double *l1rows) {
    const int Wl = W + 2 * pad;
    const int T = tile > 0 && rows == NULL && l1rows == NULL ? tile : W;
    const int Hp = H + 2 * pad - K + 1, r = K / 2;
    const int own0 = q0 + pad - r < 0 ? 0 : q0 + pad - r;
    const int own1 = q1 + pad - r > Hp ? Hp : q1 + pad - r;
    for (int c0 = pad; c0 < pad + W; c0 += T) {
        int c1 = pad + W - c0 < T ? pad + W : c0 + T;
        int a = c0 - K + 1 < 0 ? 0 : c0 - K + 1;
        int b = c1 + K - 1 > Wl ? Wl : c1 + K - 1;
        dims_t d = make_dims(b - a, K);
        img_t im = {x, y, H, W, W, pad, a, 0};
        memset(work, 0, mws_elems(d) * sizeof(REAL));
        mws_t w = make_mws(d, im, mask, g, work, Wl - K + 1);
        mbwd_tile(&w, H + 2 * pad, C1, C2, gS, gC, l1c, q0 + pad, q1 + pad, c0 - a, c1 - a, gx, gy, rows, own0, own1,
                  l1rows);
    }
}

/* The centre weights' sums of map rows [m0, m1) of one plane, out[m - m0] = splat_mssim_fwd's
 * sum of c over the row, bit for bit (the same lanes in the same order): the masked means'
 * denominators, known from the mask alone before a fused pass needs them. work: a row of
 * rup(W + 2 pad) + V REALs. */
void splat_mssim_centre_rows(const REAL *mask, int H, int W, int K, int m0, int m1, REAL *work, double *out,
                             int pad) {
    const int Wp = W + 2 * pad - K + 1;
    const dims_t d = make_dims(W + 2 * pad, K);
    img_t im = {NULL, NULL, H, W, W, pad, 0, 0};
    mws_t w;
    memset(&w, 0, sizeof w);
    w.d = d;
    w.im = im;
    w.m = mask;
    for (int m = m0; m < m1; m++) {
        copy_mask(&w, work, m + K / 2, -pad + K / 2, Wp);
        memset(work + Wp, 0, sizeof(REAL) * (d.Wpp - Wp));
        vr acc = {0};
        for (int j = 0; j < d.Wpp; j += V) acc += ld(work + j);
        double z = 0;
        for (int i = 0; i < V; i++) z += acc[i];
        out[m - m0] = z;
    }
}

/* Per-row sums of the masked L1 term of one plane (mask: its plane, laid out as x), out[2 i] +=
 * sum m |x - y| over row i, out[2 i + 1] += sum m, in the lanes of splat_mssim_bwd's l1rows (whole
 * rows; vectors counted from the first of the `pad` logical columns before the image, lanes outside
 * the image dropped): a forward alone and the fused pass give the same numbers. With mask_only,
 * the sums of m alone (x and y are not read). out zeroed by the caller. */
void splat_masked_l1_rows_tiled(const REAL *x, const REAL *y, const REAL *mask, int H, int W, int pad,
                                int mask_only, double *out) {
    vmask lane;
    for (int i = 0; i < V; i++) lane[i] = i;
    REAL bx[V_LANES], by[V_LANES], bm[V_LANES];
    for (int i = 0; i < H; i++) {
        const size_t r = (size_t)i * W;
        vr acc = {0}, accm = {0};
        for (int j = pad / V * V; j < pad + W; j += V) {
            const int p0 = j - pad;  /* the image column of lane 0 */
            vr xv = {0}, yv = {0}, mv;
            if (p0 >= 0 && p0 + V <= W) {
                mv = ld(mask + r + p0);
                if (!mask_only) {
                    xv = ld(x + r + p0);
                    yv = ld(y + r + p0);
                }
            } else {  /* lanes past the image: dropped below */
                for (int l = 0; l < V; l++) {
                    const int pc = p0 + l, in = pc >= 0 && pc < W;
                    bm[l] = in ? mask[r + pc] : 0;
                    bx[l] = in && !mask_only ? x[r + pc] : 0;
                    by[l] = in && !mask_only ? y[r + pc] : 0;
                }
                mv = ld(bm);
                xv = ld(bx);
                yv = ld(by);
            }
            masked_abs_own(xv, yv, mv, lane + j, pad, pad + W, &acc, &accm);
        }
        out[2 * i] += lane_sum(acc);
        out[2 * i + 1] += lane_sum(accm);
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
