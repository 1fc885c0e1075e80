/*
 * check.c -- the microkernel checker (check.h): adversarial problems through any GEMM slot, compared bit for bit
 * with the reference FMA sequence computed here. Portable C (compiled without ISA flags): it calls kernels only
 * through their descriptors.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../format/codec.h"
#include "../runtime/fenv.h"
#include "check.h"

static uint64_t rng(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A dequantized E4M3 value: a finite code with a random sign times 2^scale_exp, exact in FP32. */
static float mx_value(uint64_t *s, int scale_exp) {
    uint8_t code = (uint8_t)(rng(s) % 127u); /* 0..126: finite E4M3 magnitudes (0x7F is NaN) */
    if (rng(s) & 1) code |= 0x80;
    return ldexpf(mxfp8i_fp8_to_fp32(code, MXFP8_FMT_E4M3), scale_exp);
}

enum { REG_NORMAL = 0, REG_SUBNORMAL = 1, REG_TINY_PRODUCT = 2, REG_HUGE = 3 };
enum { KMAX = 256, TMAX = 32 };
static const char *regime_name[] = {"normal", "BF16-subnormal", "tiny-product", "near-overflow"};

typedef struct check_ws {
    float A[TMAX * KMAX], B[TMAX * KMAX];
    float c_init[TMAX * TMAX], c_ref[TMAX * TMAX], c_k[TMAX * TMAX];
    void *pa, *pb;
} check_ws;

typedef struct check_case {
    uint64_t seed;
    int64_t K;
    int mr, nr, load_c, trap, split; /* split: run K as two kernel calls at a kalign boundary */
    int negzero;                     /* C = -0 and rows of A that are -0: the reference keeps -0 to the end */
    const int *regime;               /* per group of 32 k */
} check_case;

static void fill(check_ws *w, const check_case *cs) {
    uint64_t s = cs->seed * 0x9E3779B97F4A7C15ull + 1;
    const int64_t K = cs->K;
    for (int r = 0; r < TMAX; r++)
        for (int64_t k = 0; k < K; k++) {
            int reg = cs->regime[k / 32];
            int base = reg == REG_SUBNORMAL ? -127 : reg == REG_TINY_PRODUCT ? -66 : reg == REG_HUGE ? 58 : -8;
            int spread = reg == REG_NORMAL ? 16 : 4;
            int ea = base + (int)(rng(&s) % (uint64_t)spread), eb = base + (int)(rng(&s) % (uint64_t)spread);
            if (reg == REG_SUBNORMAL) eb = -4; /* only A's values reach below 2^-126 */
            w->A[r * K + k] = r < cs->mr ? mx_value(&s, ea) : 0.0f;
            w->B[r * K + k] = r < cs->nr ? mx_value(&s, eb) : 0.0f;
        }
    if (cs->trap && K >= 8) {
        /* Pair-rounding traps. k 0: acc = 1; pair (2, 3): products 2^-24, 2^-24 -- sequential RNE keeps 1, a fused
         * pair gives 1 + 2^-23. k 4: acc = 2^24; pair (6, 7): products 1 then 2 -- even-first sequential gives
         * 2^24 + 2, odd-first or fused gives 2^24 + 4. */
        static const float ta[8] = {1.0f, 0.0f, 0x1p-12f, 0x1p-12f, 0x1p12f, 0.0f, 1.0f, 1.0f};
        static const float tb[8] = {1.0f, 0.0f, 0x1p-12f, 0x1p-12f, 0x1p12f, 0.0f, 1.0f, 2.0f};
        for (int r = 0; r < TMAX; r++)
            for (int k = 0; k < 8; k++) {
                w->A[r * K + k] = r < cs->mr ? ta[k] : 0.0f;
                w->B[r * K + k] = r < cs->nr ? tb[k] : 0.0f;
            }
    }
    for (int i = 0; i < TMAX * TMAX; i++) w->c_init[i] = (cs->load_c && !cs->trap) ? mx_value(&s, -2) : 0.0f;
    if (cs->negzero) /* even rows of A are -0, B is positive: those rows' products are -0, their sums stay -0 */
        for (int r = 0; r < TMAX; r++) {
            for (int64_t k = 0; k < K; k++) {
                if (r % 2 == 0) w->A[r * K + k] = -0.0f;
                w->B[r * K + k] = fabsf(w->B[r * K + k]);
            }
            for (int j = 0; j < TMAX; j++) w->c_init[r * TMAX + j] = -0.0f;
        }
}

/* The reference: acc = fmaf(a, b, acc) over k ascending from c_init (load_c) or +0, under IEEE defaults. */
static void reference(check_ws *w, const check_case *cs) {
    unsigned csr = mxfp8i_fenv_enter();
    for (int i = 0; i < cs->mr; i++)
        for (int j = 0; j < cs->nr; j++) {
            float acc = cs->load_c ? w->c_init[i * TMAX + j] : 0.0f;
            for (int64_t k = 0; k < cs->K; k++) acc = fmaf(w->A[i * cs->K + k], w->B[j * cs->K + k], acc);
            w->c_ref[i * TMAX + j] = acc;
        }
    mxfp8i_fenv_leave(csr);
}

/* Returns 1 (and describes the case in why) when the kernel differs from the reference. */
static int run_case(const mxfp8i_ukernel *uk, check_ws *w, const check_case *cs, char *why, size_t whylen) {
    fill(w, cs);
    reference(w, cs);
    uk->pack(0, w->A, cs->K, cs->mr, cs->K, w->pa);
    uk->pack(1, w->B, cs->K, cs->nr, cs->K, w->pb);
    memcpy(w->c_k, w->c_init, sizeof w->c_k);
    int64_t k1 = cs->split ? (cs->K / 2 / uk->kalign) * uk->kalign : 0;
    if (k1 > 0 && k1 < cs->K) {
        uk->run(0, k1, w->pa, w->pb, w->c_k, TMAX, cs->mr, cs->nr, cs->load_c);
        uk->run(k1, cs->K - k1, w->pa, w->pb, w->c_k, TMAX, cs->mr, cs->nr, 1);
    } else {
        uk->run(0, cs->K, w->pa, w->pb, w->c_k, TMAX, cs->mr, cs->nr, cs->load_c);
    }
    for (int i = 0; i < TMAX; i++)
        for (int j = 0; j < TMAX; j++) {
            int valid = i < cs->mr && j < cs->nr;
            const float *want = valid ? &w->c_ref[i * TMAX + j] : &w->c_init[i * TMAX + j];
            if (memcmp(&w->c_k[i * TMAX + j], want, 4) == 0) continue;
            if (why && whylen && !why[0]) {
                int reg = REG_NORMAL;
                for (int64_t g = 0; g < (cs->K + 31) / 32; g++)
                    if (cs->regime[g] != REG_NORMAL) reg = cs->regime[g];
                snprintf(why, whylen,
                         "%s: K %lld, tile %dx%d, load_c %d, %s%s%s: C[%d][%d] = %a, reference %a", uk->name,
                         (long long)cs->K, cs->mr, cs->nr, cs->load_c, cs->trap ? "pair-rounding trap" : cs->negzero ? "signed zeros" : regime_name[reg],
                         cs->split ? ", K split in two calls" : "", valid ? "" : " (outside the tile)", i, j,
                         (double)w->c_k[i * TMAX + j], (double)*want);
            }
            return 1;
        }
    return 0;
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

int mxfp8i_check_ukernel(const mxfp8i_ukernel *uk, int quick, int *ncases, char *why, size_t whylen) {
    /* full: every K and tile shape; quick (start-up self-tests): the K tail and partial tiles, every regime and the
     * traps (which need K >= 8) */
    static const int64_t Ks_full[] = {32, 71, 160, 7, 256}, Ks_quick[] = {71, 160};
    const int64_t *Ks = quick ? Ks_quick : Ks_full;
    unsigned nK = quick ? 2u : 5u, nM = quick ? 2u : 4u;
    const int mr = uk->mr < TMAX ? uk->mr : TMAX, nr = uk->nr < TMAX ? uk->nr : TMAX;
    const int tiles[4][2] = {{mr, nr}, {clampi(mr * 19 / 32, 1, mr), clampi(nr * 27 / 32, 1, nr)}, {1, 1},
                             {clampi(mr / 2, 1, mr), clampi(nr / 2 + 1, 1, nr)}};
    if (why && whylen) why[0] = 0;
    check_ws *w = malloc(sizeof *w);
    size_t pbytes = (size_t)(((uk->panel_bytes(KMAX, uk->mr > uk->nr ? uk->mr : uk->nr)) + 63) & ~(int64_t)63);
    if (w) {
        w->pa = aligned_alloc(64, pbytes);
        w->pb = aligned_alloc(64, pbytes);
    }
    if (!w || !w->pa || !w->pb) {
        if (w) free(w->pa), free(w->pb);
        free(w);
        if (ncases) *ncases = 0;
        return -1;
    }
    int regime[KMAX / 32], fails = 0, n = 0;
    for (int reg = 0; reg < 5; reg++)
        for (unsigned ki = 0; ki < nK; ki++)
            for (unsigned mi = 0; mi < nM; mi++)
                for (int load_c = 0; load_c < 2; load_c++) {
                    check_case cs = {(uint64_t)(reg * 1000 + ki * 100 + mi * 10 + load_c + 1), Ks[ki], tiles[mi][0],
                                     tiles[mi][1], load_c, reg == 4, 0, 0, regime};
                    /* all groups normal, or one special group (the second when there is one, so the accumulators
                     * are nonzero when it arrives), or (reg 4) the pair-rounding trap in the first chunk */
                    for (int g = 0; g < KMAX / 32; g++) regime[g] = REG_NORMAL;
                    int special = cs.K > 32 ? 1 : 0;
                    if (reg >= 1 && reg <= 3) regime[special] = reg;
                    cs.split = load_c && cs.K >= 64; /* k tiles as the driver runs them */
                    fails += run_case(uk, w, &cs, why, whylen);
                    n++;
                }
    /* every group tiny-product: the accumulators themselves stay below 2^-100 */
    for (int g = 0; g < KMAX / 32; g++) regime[g] = REG_TINY_PRODUCT;
    check_case cs = {.seed = 77, .K = KMAX, .mr = mr, .nr = nr, .regime = regime};
    fails += run_case(uk, w, &cs, why, whylen);
    n++;
    /* signed zeros through a K tail (a partial last chunk), full and partial tiles */
    for (int g = 0; g < KMAX / 32; g++) regime[g] = REG_NORMAL;
    for (unsigned mi = 0; mi < 2; mi++) {
        check_case cz = {.seed = 78 + mi, .K = 71, .mr = tiles[mi][0], .nr = tiles[mi][1], .load_c = 1, .negzero = 1,
                         .regime = regime};
        fails += run_case(uk, w, &cz, why, whylen);
        n++;
    }
    free(w->pa);
    free(w->pb);
    free(w);
    if (ncases) *ncases = n;
    return fails;
}
