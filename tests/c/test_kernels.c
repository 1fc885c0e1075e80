/*
 * test_kernels.c -- every GEMM microkernel of the kernel registry against a test-side reference, whatever MXFP8_ISA
 * says; the registry's selection against the CPU's features; the BF16 chunk panel layout.
 *
 *  1. The BF16 chunk packer: byte layout of BF16 A / VNNI B / FP32 slots and the per-chunk facts (qmin, emax, f32) on
 *     values whose answers are worked out by hand here (needs AVX-512F/BW: the packer is AVX-512 code).
 *  2. Every kernel of mxfp8t_all_ukernels() whose CPU features are present, on problems generated HERE (random MX
 *     values in normal, BF16-subnormal, tiny-product and near-overflow groups, pair-rounding traps, partial tiles,
 *     K tails, load_c, K split in two calls at each kalign boundary, loaded accumulators at the FTZ guard, signed
 *     zeros that must stay -0 through a K tail), against an fmaf chain written here: runtime kernels must equal it
 *     bit for bit; the negative controls (no DAZ/FTZ routing) must differ somewhere, which shows that these problems
 *     reach the hardware's DAZ/FTZ. A kernel whose CPU features are absent is a counted skip with the reason
 *     printed.
 *  3. The same under a caller's FTZ/DAZ/round-toward-zero MXCSR, which every kernel restores.
 *  4. Selection: on a CPU with AVX512-BF16 (and MXFP8_ISA not below avx512) the GEMM slot must hold an AVX512-BF16
 *     (or, with AMX, the AMX) kernel that passed its self-test; AVX-512F alone gives the AVX-512F kernel; MXFP8_ISA
 *     =scalar gives the reference everywhere. A failed self-test is a failure of this test, with the failing case
 *     printed (mxfp8_get_info's note). The quantization slots likewise.
 *  5. The library's own checker (the start-up self-test, full set) agrees with 2 on every kernel.
 */
#include <math.h>

#include "kernels/avx512/avx512.h"
#include "kernels/avx512/bf16chunk.h"
#include "kernels/check.h"
#include "kernels/registry.h"
#include "kernel_list.h"
#include "testutil.h"

static int skips = 0;
static int twin_fails[2] = {-1, -1}; /* the two pair-order descriptors of the AVX512-BF16 kernel */

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ---- 1. the BF16 chunk packer ---- */
static void test_bf16c_packer(void) {
    enum { K = 40 }; /* two chunks: 32 + a tail of 8 */
    static float src[32 * K];
    static uint8_t pa[2 * MXFP8I_BF16C_CHUNK_BYTES] __attribute__((aligned(64)));
    static uint8_t pb[2 * MXFP8I_BF16C_CHUNK_BYTES] __attribute__((aligned(64)));
    mxfp8i_bf16c_meta ma[4], mb[4];
    TU_CHECK(mxfp8i_bf16c_panel_bytes(K, 32) == (int64_t)sizeof pa, "panel_bytes(40) = %lld",
             (long long)mxfp8i_bf16c_panel_bytes(K, 32));
    memset(src, 0, sizeof src);
    /* rows 0..15, chunk 0: 0.1875 = 1.5 * 2^-3 (lowest set bit 2^-4) and 32 (2^5): qmin -4, emax 5, BF16 */
    src[3 * K + 5] = 0.1875f;
    src[7 * K + 30] = -32.0f;
    /* rows 16..31, chunk 0: 1 + 2^-8 needs 9 significant bits: FP32 slot */
    src[20 * K + 1] = 1.0f + 0x1p-8f;
    /* rows 0..15, chunk 1 (k 32..39): a BF16 subnormal 2^-130: FP32 slot */
    src[2 * K + 33] = 0x1p-130f;
    /* rows 16..31, chunk 1: all zero */
    memset(pa, 0xAB, sizeof pa); /* stale bytes: whatever the kernel reads must have been written by the packer */
    memset(pb, 0xAB, sizeof pb);
    mxfp8i_bf16c_pack(0, src, K, 30, K, pa);
    mxfp8i_bf16c_pack(1, src, K, 30, K, pb);
    for (int c = 0; c < 2; c++) {
        memcpy(&ma[2 * c], pa + c * MXFP8I_BF16C_CHUNK_BYTES, 2 * sizeof(mxfp8i_bf16c_meta));
        memcpy(&mb[2 * c], pb + c * MXFP8I_BF16C_CHUNK_BYTES, 2 * sizeof(mxfp8i_bf16c_meta));
    }
    for (int p = 0; p < 2; p++) {
        const mxfp8i_bf16c_meta *m = p ? mb : ma;
        const char *w = p ? "B" : "A";
        TU_CHECK(m[0].f32 == 0 && m[0].qmin == -4 && m[0].emax == 5, "%s chunk0 tile0: f32 %d qmin %d emax %d", w,
                 m[0].f32, m[0].qmin, m[0].emax);
        TU_CHECK(m[1].f32 == 1, "%s chunk0 tile1 (9 significant bits) must be FP32, f32 = %d", w, m[1].f32);
        TU_CHECK(m[2].f32 == 1, "%s chunk1 tile0 (subnormal) must be FP32, f32 = %d", w, m[2].f32);
        TU_CHECK(m[3].f32 == 0 && m[3].qmin == 1000 && m[3].emax == -1000, "%s all-zero tile: f32 %d qmin %d emax %d",
                 w, m[3].f32, m[3].qmin, m[3].emax);
    }
    uint16_t h; /* A, BF16 slot (chunk 0, tile 0): row r, step kk at r*64 + kk*2 */
    memcpy(&h, pa + 64 + 3 * 64 + 5 * 2, 2);
    TU_CHECK(h == (bits(0.1875f) >> 16), "A bf16 slot: got 0x%04x", h);
    memcpy(&h, pa + 64 + 7 * 64 + 30 * 2, 2);
    TU_CHECK(h == (bits(-32.0f) >> 16), "A bf16 slot: got 0x%04x", h);
    /* B, VNNI slot: row j, step kk at (kk/2)*64 + j*4 + (kk%2)*2 */
    memcpy(&h, pb + 64 + (5 / 2) * 64 + 3 * 4 + (5 % 2) * 2, 2);
    TU_CHECK(h == (bits(0.1875f) >> 16), "B vnni slot: got 0x%04x", h);
    memcpy(&h, pb + 64 + (30 / 2) * 64 + 7 * 4 + 0, 2);
    TU_CHECK(h == (bits(-32.0f) >> 16), "B vnni slot: got 0x%04x", h);
    /* the swapped packer trades the two steps of each pair */
    static uint8_t ps[2 * MXFP8I_BF16C_CHUNK_BYTES] __attribute__((aligned(64)));
    mxfp8i_bf16c_pack_swapped(0, src, K, 30, K, ps);
    memcpy(&h, ps + 64 + 3 * 64 + (5 ^ 1) * 2, 2);
    TU_CHECK(h == (bits(0.1875f) >> 16) && ps[MXFP8I_BF16C_SWAP_BYTE] == 1, "swapped A slot: got 0x%04x", h);
    /* FP32 slots: A [r][kk] at r*128 + kk*4; B [kk][j] at kk*64 + j*4 */
    float f;
    memcpy(&f, pa + 64 + 1 * MXFP8I_BF16C_SLOT + (20 - 16) * 128 + 1 * 4, 4);
    TU_CHECK(f == 1.0f + 0x1p-8f, "A f32 slot: got %a", f);
    memcpy(&f, pb + 64 + 1 * MXFP8I_BF16C_SLOT + 1 * 64 + (20 - 16) * 4, 4);
    TU_CHECK(f == 1.0f + 0x1p-8f, "B f32 slot: got %a", f);
    memcpy(&f, pa + MXFP8I_BF16C_CHUNK_BYTES + 64 + 2 * 128 + 1 * 4, 4);
    TU_CHECK(f == 0x1p-130f, "A f32 slot (tail chunk): got %a", f);
    int nonzero = 0; /* the tail steps (k >= 40) of chunk 1 are zero */
    for (int r = 0; r < 16; r++)
        for (int kk = 8; kk < 32; kk++) {
            memcpy(&f, pa + MXFP8I_BF16C_CHUNK_BYTES + 64 + r * 128 + kk * 4, 4);
            nonzero += f != 0.0f;
        }
    TU_CHECK(nonzero == 0, "A tail padding: %d nonzero", nonzero);
    /* the column-major packer gives the same bytes as packing the transposed matrix row-major */
    static float t[K * 32];
    static uint8_t pc[2 * MXFP8I_BF16C_CHUNK_BYTES] __attribute__((aligned(64)));
    for (int r = 0; r < 32; r++)
        for (int k = 0; k < K; k++) t[k * 32 + r] = src[r * K + k];
    memset(pc, 0xAB, sizeof pc); /* the same stale bytes where a BF16 slot leaves its second KiB unwritten */
    mxfp8i_bf16c_pack_cm(1, t, 32, 30, K, pc);
    TU_CHECK(memcmp(pc, pb, sizeof pb) == 0, "column-major B pack differs from the row-major pack");
}

/* ---- the packer from BF16 values + scales against the packer from FP32 values ---- */
static void test_bf16c_pack_q(void) {
    enum { K = 100, R = 32, G = (K + 31) / 32 };
    static float f[R * K], ft[K * R];
    static uint16_t h[R * K], ht[K * R];
    static uint8_t sc[R * G], sct[G * R];
    static uint8_t p1[4 * MXFP8I_BF16C_CHUNK_BYTES] __attribute__((aligned(64)));
    static uint8_t p2[4 * MXFP8I_BF16C_CHUNK_BYTES] __attribute__((aligned(64)));
    tu_rng r = {99};
    int fails = 0, cases = 0;
    for (int trial = 0; trial < 24; trial++) {
        const int fmt = trial & 1, rows = trial % 3 == 0 ? R : 1 + (int)(tu_next(&r) % R);
        for (int i = 0; i < R; i++)
            for (int g = 0; g < G; g++) {
                /* ordinary scales, and (trial-dependent) a zero group, a NaN group, a tiny scale */
                int kind = (int)(tu_next(&r) % 16), code = 100 + (int)(tu_next(&r) % 40);
                if (kind == 0 && trial > 4) code = 0;
                if (kind == 1 && trial > 8) code = 255;
                if (kind == 2 && trial > 12) code = 10 + (int)(tu_next(&r) % 6); /* values still exact in BF16 */
                sc[i * G + g] = sct[g * R + i] = (uint8_t)code;
                for (int k = g * 32; k < K && k < g * 32 + 32; k++) {
                    float v;
                    if (code == 255) v = NAN;
                    else if (code == 0 && kind == 0) v = 0.0f;
                    else {
                        uint8_t c8 = (uint8_t)(tu_next(&r) % (fmt ? 124u : 127u));
                        if (tu_next(&r) & 1) c8 |= 0x80;
                        v = ldexpf(mxfp8_fp8_to_fp32(c8, (mxfp8_format)fmt), code - 127);
                    }
                    f[i * K + k] = ft[k * R + i] = v;
                    h[i * K + k] = ht[k * R + i] = (uint16_t)(tu_f32_bits(v) >> 16);
                }
            }
        for (int cm = 0; cm < 2; cm++)
            for (int is_b = 0; is_b < 2; is_b++)
                for (int swap = 0; swap < 2; swap++) {
                    memset(p1, 0xAB, sizeof p1);
                    memset(p2, 0xAB, sizeof p2);
                    (swap ? mxfp8i_bf16c_pack_swapped : mxfp8i_bf16c_pack)(is_b, f, K, rows, K, p1);
                    mxfp8i_bf16c_pack_q(is_b, cm ? ht : h, cm ? R : K, cm, rows, K, cm ? sct : sc, cm ? 1 : G,
                                        cm ? R : 1, fmt, swap, p2);
                    for (int ch = 0; ch < G; ch++) {
                        const uint8_t *c1 = p1 + ch * MXFP8I_BF16C_CHUNK_BYTES, *c2 = p2 + ch * MXFP8I_BF16C_CHUNK_BYTES;
                        const mxfp8i_bf16c_meta *m1 = mxfp8i_bf16c_chunk_meta(c1), *m2 = mxfp8i_bf16c_chunk_meta(c2);
                        for (int t = 0; t < 2; t++) {
                            cases++;
                            int ok = m2[t].f32 == m1[t].f32 && m2[t].qmin <= m1[t].qmin && m2[t].emax >= m1[t].emax;
                            size_t n = m1[t].f32 ? MXFP8I_BF16C_SLOT : MXFP8I_BF16C_SLOT / 2;
                            ok = ok && !memcmp(c1 + 64 + t * MXFP8I_BF16C_SLOT, c2 + 64 + t * MXFP8I_BF16C_SLOT, n);
                            ok = ok && c1[MXFP8I_BF16C_SWAP_BYTE] == c2[MXFP8I_BF16C_SWAP_BYTE];
                            if (!ok && fails++ < 5)
                                TU_CHECK(0, "pack_q trial %d cm %d is_b %d swap %d chunk %d tile %d: f32 %d/%d qmin %d/%d "
                                         "emax %d/%d or slot bytes differ", trial, cm, is_b, swap, ch, t, m2[t].f32,
                                         m1[t].f32, m2[t].qmin, m1[t].qmin, m2[t].emax, m1[t].emax);
                        }
                    }
                }
    }
    TU_CHECK(fails == 0, "pack_q: %d of %d tile-chunks differ from pack", fails, cases);
    printf("test_kernels: BF16 chunk pack from BF16 + scales: %d tile-chunks, same slots, facts never tighter\n",
           cases);
}

/* ---- 2. kernels against the test-side reference ---- */
enum { KMAX = 288, T = 32 };
typedef struct problem {
    float A[T * KMAX], B[T * KMAX], c0[T * T], ref[T * T], out[T * T];
} problem;

/* A random dequantized MX value: a finite E4M3 or E5M2 code times 2^e (exact in FP32). */
static float mx_val(tu_rng *r, int e) {
    int e5 = tu_next(r) & 1;
    uint8_t code = (uint8_t)(tu_next(r) % (e5 ? 124u : 127u)); /* finite magnitudes only */
    if (tu_next(r) & 1) code |= 0x80;
    return ldexpf(mxfp8_fp8_to_fp32(code, e5 ? MXFP8_FMT_E5M2 : MXFP8_FMT_E4M3), e);
}

/* Group g's exponent range: 0 normal, 1 A below 2^-126 (BF16 subnormal), 2 tiny products, 3 near FP32 overflow. */
static void gen(problem *p, tu_rng *r, int64_t K, int mr, int nr, int load_c, int regime, int trap) {
    for (int i = 0; i < T; i++)
        for (int64_t k = 0; k < K; k++) {
            int g = (int)(k / 32), special = regime && g == (K > 32 ? 1 : 0);
            int ea = -6 + (int)(tu_next(r) % 12), eb = -6 + (int)(tu_next(r) % 12);
            if (special && regime == 1) ea = -130 + (int)(tu_next(r) % 3), eb = -2;
            if (special && regime == 2) ea = -70 + (int)(tu_next(r) % 4), eb = -64 + (int)(tu_next(r) % 3);
            if (special && regime == 3) ea = 60 + (int)(tu_next(r) % 3), eb = 58 + (int)(tu_next(r) % 3);
            p->A[i * K + k] = i < mr ? mx_val(r, ea) : 0.0f;
            p->B[i * K + k] = i < nr ? mx_val(r, eb) : 0.0f;
        }
    if (trap) { /* 1 + 2^-24 + 2^-24 (one rounding per step keeps 1); 2^24 + 1 + 2 (the order of a pair shows) */
        const float ta[8] = {1, 0, 0x1p-12f, 0x1p-12f, 0x1p12f, 0, 1, 1}, tb[8] = {1, 0, 0x1p-12f, 0x1p-12f, 0x1p12f,
                                                                                   0, 1, 2};
        for (int i = 0; i < T; i++)
            for (int k = 0; k < 8; k++) {
                p->A[i * K + k] = i < mr ? ta[k] : 0.0f;
                p->B[i * K + k] = i < nr ? tb[k] : 0.0f;
            }
    }
    for (int i = 0; i < T * T; i++) p->c0[i] = load_c && !trap ? mx_val(r, -1) : 0.0f;
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float acc = load_c ? p->c0[i * T + j] : 0.0f;
            for (int64_t k = 0; k < K; k++) acc = fmaf(p->A[i * K + k], p->B[j * K + k], acc);
            p->ref[i * T + j] = acc;
        }
}

/* The FTZ guard on loaded accumulators: C = 2^-104 (1 + 2^-23) (normal, lowest set bit 2^-127) and a first product
 * -2^-104 that cancels all but 2^-127; the rest of K is zero. The fmaf chain keeps the FP32 subnormal 2^-127; a BF16
 * unit would flush that partial sum (FTZ), so a kernel must see that this accumulator is not a multiple of 2^-126
 * and take the exact path. */
static void gen_acc_guard(problem *p, int64_t K, int mr, int nr) {
    memset(p->A, 0, sizeof p->A);
    memset(p->B, 0, sizeof p->B);
    for (int i = 0; i < mr; i++) p->A[i * K] = (i & 1) ? 0x1p-52f : -0x1p-52f;
    for (int j = 0; j < nr; j++) p->B[j * K] = 0x1p-52f;
    for (int i = 0; i < T * T; i++) p->c0[i] = ((i / T) & 1 ? -1.0f : 1.0f) * (0x1p-104f + 0x1p-127f);
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float acc = p->c0[i * T + j];
            for (int64_t k = 0; k < K; k++) acc = fmaf(p->A[i * K + k], p->B[j * K + k], acc);
            p->ref[i * T + j] = acc;
        }
}

/* Signed zeros: C = -0 (loaded), even rows of A all -0, B positive: those rows' products are -0 and the fmaf chain
 * keeps -0 to the end, while the zero steps a kernel adds past K (a partial last chunk on the BF16 unit) would turn
 * -0 + (+0)(+0) into +0. Odd rows are ordinary. */
static void gen_neg_zero(problem *p, tu_rng *r, int64_t K, int mr, int nr) {
    for (int i = 0; i < T; i++)
        for (int64_t k = 0; k < K; k++) {
            p->A[i * K + k] = i < mr ? (i % 2 == 0 ? -0.0f : mx_val(r, -3)) : 0.0f;
            p->B[i * K + k] = i < nr ? fabsf(mx_val(r, -3)) : 0.0f;
        }
    for (int i = 0; i < T * T; i++) p->c0[i] = -0.0f;
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float acc = p->c0[i * T + j];
            for (int64_t k = 0; k < K; k++) acc = fmaf(p->A[i * K + k], p->B[j * K + k], acc);
            p->ref[i * T + j] = acc;
        }
}

/* Run the kernel on the problem (k split at `split`, a kalign multiple, when 0 < split < K); 1 when it differs from
 * the reference (or writes outside its tile). */
static int run_kernel(const mxfp8i_ukernel *uk, problem *p, void *pa, void *pb, int64_t K, int mr, int nr,
                      int load_c, int64_t split) {
    uk->pack(0, p->A, K, mr, K, pa);
    uk->pack(1, p->B, K, nr, K, pb);
    memcpy(p->out, p->c0, sizeof p->out);
    if (split > 0 && split < K) {
        uk->run(0, split, pa, pb, p->out, T, mr, nr, load_c);
        uk->run(split, K - split, pa, pb, p->out, T, mr, nr, 1);
    } else {
        uk->run(0, K, pa, pb, p->out, T, mr, nr, load_c);
    }
    for (int i = 0; i < T; i++)
        for (int j = 0; j < T; j++) {
            const float *want = i < mr && j < nr ? &p->ref[i * T + j] : &p->c0[i * T + j];
            if (memcmp(&p->out[i * T + j], want, 4)) return 1;
        }
    return 0;
}

/* All cases on one kernel; returns the number that differ, *n the number run. */
static int kernel_cases(const mxfp8i_ukernel *uk, int *n) {
    static problem p;
    const int64_t Ks[] = {1, 7, 32, 33, 71, 160, 256, 288};
    const int mr = uk->mr < T ? uk->mr : T, nr = uk->nr < T ? uk->nr : T;
    const int tiles[4][2] = {{mr, nr}, {mr > 3 ? mr - 3 : 1, nr > 5 ? nr - 5 : 1}, {1, 1}, {(mr + 1) / 2, 1}};
    size_t pbytes = (size_t)((uk->panel_bytes(KMAX, uk->mr > uk->nr ? uk->mr : uk->nr) + 63) & ~(int64_t)63);
    void *pa = aligned_alloc(64, pbytes), *pb = aligned_alloc(64, pbytes);
    tu_rng r = {2024};
    int fails = 0;
    *n = 0;
    for (int regime = 0; regime < 5; regime++)
        for (unsigned ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
            for (int ti = 0; ti < 4; ti++)
                for (int load_c = 0; load_c < 2; load_c++) {
                    int64_t K = Ks[ki];
                    int trap = regime == 4 && K >= 8;
                    gen(&p, &r, K, tiles[ti][0], tiles[ti][1], load_c, regime < 4 ? regime : 0, trap);
                    int64_t split = (K / 2 / uk->kalign) * uk->kalign;
                    fails += run_kernel(uk, &p, pa, pb, K, tiles[ti][0], tiles[ti][1], load_c, 0);
                    fails += run_kernel(uk, &p, pa, pb, K, tiles[ti][0], tiles[ti][1], load_c, split);
                    *n += 2;
                }
    for (int64_t K = 32; K <= 64; K += 32) /* the accumulator guard, on the full tile and a partial one */
        for (int ti = 0; ti < 2; ti++) {
            gen_acc_guard(&p, K, tiles[ti][0], tiles[ti][1]);
            fails += run_kernel(uk, &p, pa, pb, K, tiles[ti][0], tiles[ti][1], 1, 0);
            *n += 1;
        }
    for (unsigned ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) /* signed zeros, K tails included */
        for (int ti = 0; ti < 2; ti++) {
            gen_neg_zero(&p, &r, Ks[ki], tiles[ti][0], tiles[ti][1]);
            fails += run_kernel(uk, &p, pa, pb, Ks[ki], tiles[ti][0], tiles[ti][1], 1, 0);
            *n += 1;
        }
    free(pa);
    free(pb);
    return fails;
}

static void test_every_kernel(void) {
    for (const mxfp8i_ukernel *const *it = mxfp8t_all_ukernels(); *it; it++) {
        const mxfp8i_ukernel *uk = *it;
        if (!mxfp8i_cpu_has(uk->needs)) {
            printf("test_kernels: SKIP %s: this CPU lacks its instructions (%s)\n", uk->name, uk->isa_name);
            skips++;
            continue;
        }
        int n = 0, fails = kernel_cases(uk, &n);
        int is_control = strstr(uk->name, "noroute") != NULL;
        if (is_control) {
            TU_CHECK(fails > 0, "%s (negative control) equals the reference in all %d cases: the cases do not reach "
                                "the hardware's DAZ/FTZ", uk->name, n);
        } else if (uk == &mxfp8i_bf16_gemm_32x32__avx512bf16_oddfirst_ukernel ||
                   uk == &mxfp8i_bf16_gemm_32x32__avx512bf16_evenfirst_ukernel) {
            /* exactly one pair order matches this CPU's unit: checked below */
            twin_fails[uk == &mxfp8i_bf16_gemm_32x32__avx512bf16_evenfirst_ukernel] = fails;
        } else {
            TU_CHECK(fails == 0, "%s differs from the reference in %d of %d cases", uk->name, fails, n);
        }
        char why[256];
        int nc = 0, cf = mxfp8i_check_ukernel(uk, 0, &nc, why, sizeof why);
        TU_CHECK((cf == 0) == (fails == 0), "%s: the library's checker (%d of %d fail: %s) disagrees with this test "
                 "(%d of %d)", uk->name, cf, nc, why, fails, n);
        printf("test_kernels: %-40s %4d/%4d cases bitwise equal%s\n", uk->name, n - fails, n,
               is_control ? " (negative control: must differ)" : "");
    }
    /* exactly one pair order of the AVX512-BF16 kernel matches this CPU's unit (the pair-rounding trap tells them
       apart), whatever MXFP8_ISA says; which one the registry uses is checked in test_selection */
    if (twin_fails[0] >= 0 || twin_fails[1] >= 0)
        TU_CHECK((twin_fails[0] == 0) != (twin_fails[1] == 0),
                 "AVX512-BF16: odd-first fails %d cases, even-first %d: exactly one pair order must pass",
                 twin_fails[0], twin_fails[1]);
}

/* ---- 3. a caller's MXCSR ----
 * The BF16 chunk kernels take the IEEE guard themselves (their exact path runs FMAs); the F32 kernels follow MXCSR
 * by design and rely on the GEMM driver's guard on each thread (tests/c/test_gemm_mxcsr.c). */
static void test_mxcsr(void) {
    unsigned saved, mode = 0x1F80u | 0x8000u | 0x0040u | 0x6000u; /* FTZ | DAZ | round toward zero */
    for (const mxfp8i_ukernel *const *it = mxfp8t_all_ukernels(); *it; it++) {
        const mxfp8i_ukernel *uk = *it;
        if (uk->panel != MXFP8I_PANEL_BF16C || !mxfp8i_ukernel_usable(uk)) continue;
        int n = 0;
        __asm__ volatile("stmxcsr %0" : "=m"(saved));
        __asm__ volatile("ldmxcsr %0" ::"m"(mode));
        int fails = mxfp8i_check_ukernel(uk, 0, &n, NULL, 0);
        unsigned after;
        __asm__ volatile("stmxcsr %0" : "=m"(after));
        __asm__ volatile("ldmxcsr %0" ::"m"(saved));
        TU_CHECK(fails == 0, "%s under FTZ/DAZ/round-toward-zero differs in %d of %d cases", uk->name, fails, n);
        TU_CHECK((after & 0xFFC0u) == (mode & 0xFFC0u), "%s did not restore the caller's MXCSR: 0x%x", uk->name,
                 after);
    }
}

/* ---- FP32 -> BF16 rounding of the epilogue: every quantization kernel against a test-side RNE ---- */
/* The BF16 nearest to x (finite), ties to the even code, from the two BF16 neighbours compared in double. NaN:
 * the quiet NaN with x's sign and payload top bits. */
static uint16_t bf16_oracle(uint32_t u) {
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    if ((u & 0xFFFFu) == 0) return lo;
    double x = (double)tu_bits_f32(u), a = (double)tu_bits_f32((uint32_t)lo << 16);
    double b = (lo & 0x7FFF) == 0x7F7F ? ldexp(1.0, 128) * (lo & 0x8000 ? -1 : 1) /* next is Inf */
                                        : (double)tu_bits_f32((uint32_t)hi << 16);
    double da = fabs(x - a), db = fabs(x - b);
    if (da < db) return lo;
    if (db < da) return hi;
    return (lo & 1) ? hi : lo;
}

static void test_to_bf16(void) {
    enum { NV = 65536 * 8 };
    static float src[NV];
    static uint16_t dst[NV];
    static const uint32_t low[8] = {0, 1, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF, 0x1234};
    for (uint32_t i = 0; i < NV; i++) src[i] = tu_bits_f32((i / 8) << 16 | low[i % 8]);
    for (const mxfp8i_qkernel *const *it = mxfp8i_qkernel_list(); *it; it++) {
        if (!mxfp8i_cpu_has((*it)->needs)) {
            printf("test_kernels: SKIP %s: this CPU lacks its instructions\n", (*it)->name);
            skips++;
            continue;
        }
        memset(dst, 0, sizeof dst);
        (*it)->to_bf16(src, 1000, dst, 1000, NV / 1000, 1000); /* rows of 1000: a masked tail in every row */
        (*it)->to_bf16(src + NV / 1000 * 1000, 0, dst + NV / 1000 * 1000, 0, 1, NV % 1000);
        int bad = 0;
        for (uint32_t i = 0; i < NV && bad < 5; i++)
            if (dst[i] != bf16_oracle(tu_f32_bits(src[i]))) {
                TU_CHECK(0, "%s: to_bf16(0x%08x) = 0x%04x, want 0x%04x", (*it)->name, tu_f32_bits(src[i]), dst[i],
                         bf16_oracle(tu_f32_bits(src[i])));
                bad++;
            }
        printf("test_kernels: %-40s FP32 -> BF16 on %d patterns: %s\n", (*it)->name, NV, bad ? "FAIL" : "ok");
    }
}

/* The transposing BF16 -> FP32 load of the MoE checkpoints: every (rows, cols) around the 16 x 16 tiles, odd leading
 * dimensions, every BF16 bit pattern class (NaN payloads, Inf, subnormals, signed zeros), against value = bits << 16
 * written here; nothing outside the destination's rows x cols region is touched. */
static void test_bf16_t(void) {
    static const int64_t dims[] = {1, 3, 15, 16, 17, 31, 32, 33, 48, 70};
    enum { ND = sizeof dims / sizeof dims[0], LDS = 75, LDD = 73, CAP = 80 };
    static uint16_t src[CAP * LDS];
    static float dst[CAP * LDD];
    tu_rng rng = {2027};
    for (int i = 0; i < CAP * LDS; i++) src[i] = (uint16_t)tu_next(&rng);
    for (int i = 0; i < 64; i++) src[i * 37 % (CAP * LDS)] = (uint16_t[]){0x7FC1, 0xFF80, 0x0001, 0x8000}[i % 4];
    for (const mxfp8i_qkernel *const *it = mxfp8i_qkernel_list(); *it; it++) {
        if (!mxfp8i_cpu_has((*it)->needs)) {
            printf("test_kernels: SKIP %s (transposing load): this CPU lacks its instructions\n", (*it)->name);
            skips++;
            continue;
        }
        long bad = 0;
        for (int a = 0; a < ND; a++)
            for (int b = 0; b < ND; b++) {
                const int64_t rows = dims[a], cols = dims[b];
                for (int i = 0; i < CAP * LDD; i++) dst[i] = tu_bits_f32(0x7FBADBADu);
                (*it)->bf16_t(src, LDS, dst, LDD, rows, cols);
                for (int64_t c = 0; c < CAP; c++)
                    for (int64_t r = 0; r < LDD; r++) {
                        uint32_t want = c < cols && r < rows ? (uint32_t)src[r * LDS + c] << 16 : 0x7FBADBADu;
                        bad += tu_f32_bits(dst[c * LDD + r]) != want;
                    }
                TU_CHECK(bad == 0, "%s: transposing load of [%lld, %lld]: %ld elements wrong or touched", (*it)->name,
                         (long long)rows, (long long)cols, bad);
                if (bad) break;
            }
        printf("test_kernels: %-40s BF16 -> FP32 transposing load on %d shapes: %s\n", (*it)->name, ND * ND,
               bad ? "FAIL" : "ok");
    }
}

/* ---- 4. selection ---- */
static void test_selection(void) {
    mxfp8_info in;
    TU_CHECK(mxfp8_get_info(&in) == MXFP8_OK, "mxfp8_get_info");
    const mxfp8i_kernels *k = mxfp8i_kernels_get();
    const char *env = getenv("MXFP8_ISA");
    int cap = !env || !*env ? 2 : !strcmp(env, "scalar") ? 0 : !strcmp(env, "avx512") ? 1 : 2;
    int avx512 = in.has_avx512f && in.has_avx512bw && in.has_avx512vl;
    int amx = in.has_amx_tile && in.has_amx_bf16 && in.amx_permitted;
    const char *gemm = in.kernels[0].kernel;
    printf("test_kernels: isa %s (%s); gemm %s (self-test %d)%s%s; quantize %s\n", in.isa_name, in.isa_reason, gemm,
           in.kernels[0].self_test, in.kernels[0].note[0] ? "; note: " : "", in.kernels[0].note,
           in.kernels[1].kernel);
    TU_CHECK(!strcmp(in.kernels[0].slot, "gemm") && !strcmp(in.kernels[1].slot, "quantize") &&
                 !strcmp(in.kernels[2].slot, "dequantize"), "slot names");
    TU_CHECK(!strcmp(gemm, k->gemm->name), "mxfp8_get_info reports %s, the registry holds %s", gemm, k->gemm->name);
    if (cap == 0 || !avx512) {
        TU_CHECK(!strcmp(gemm, "f32_gemm_8x32__ref"), "scalar level: gemm must be the reference, got %s", gemm);
        TU_CHECK(!strcmp(in.kernels[1].kernel, "mx_quant_panel__ref"), "scalar level: quantize must be the reference");
        TU_CHECK(in.isa == MXFP8_ISA_SCALAR, "isa %d", (int)in.isa);
        return;
    }
    TU_CHECK(!strcmp(in.kernels[1].kernel, "mx_quant_panel__avx512") &&
                 !strcmp(in.kernels[2].kernel, "mx_quant_panel__avx512"), "AVX-512 CPU: quantize slot holds %s",
             in.kernels[1].kernel);
    if (amx && cap >= 2) {
        TU_CHECK(!strcmp(gemm, "bf16_gemm_32x32__amx") && in.kernels[0].self_test == 1,
                 "AMX CPU: gemm must be the AMX kernel with a passed self-test, got %s (note: %s)", gemm,
                 in.kernels[0].note);
    } else if (in.has_avx512_bf16) {
        TU_CHECK(strstr(gemm, "bf16_gemm_32x32__avx512bf16_") == gemm && in.kernels[0].self_test == 1,
                 "AVX512-BF16 CPU: gemm must be an AVX512-BF16 kernel that passed its self-test, got %s (note: %s)",
                 gemm, in.kernels[0].note);
        /* the pair order that reproduces the reference on this CPU (test_every_kernel) is the one in use */
        const mxfp8i_ukernel *pass = twin_fails[0] == 0 ? &mxfp8i_bf16_gemm_32x32__avx512bf16_oddfirst_ukernel
                                                        : &mxfp8i_bf16_gemm_32x32__avx512bf16_evenfirst_ukernel;
        TU_CHECK(k->gemm == pass, "the registry uses %s but the pair order of this CPU is %s's", gemm, pass->name);
    } else {
        TU_CHECK(!strcmp(gemm, "f32_gemm_8x32__avx512f") && in.kernels[0].self_test == 1,
                 "AVX-512F CPU: gemm must be the AVX-512F kernel, got %s (note: %s)", gemm, in.kernels[0].note);
    }
}

/* ---- 5. the CPU feature list and the descriptors' self-test storage ---- */
static void test_cpu_features(void) {
    mxfp8_info in;
    TU_CHECK(mxfp8_get_info(&in) == MXFP8_OK, "mxfp8_get_info");
    const int n = mxfp8_cpu_feature_count();
    TU_CHECK(n >= 7, "mxfp8_cpu_feature_count() = %d, want at least the 7 of mxfp8_info", n);
    /* the fixed subset mirrored in mxfp8_info, and GCC's own CPUID + XCR0 reading (__builtin_cpu_supports) as the
       independent oracle of the AVX-512 features */
    struct { const char *name; int info; int gcc; } want[] = {
        {"avx512f", in.has_avx512f, __builtin_cpu_supports("avx512f")},
        {"avx512bw", in.has_avx512bw, __builtin_cpu_supports("avx512bw")},
        {"avx512vl", in.has_avx512vl, __builtin_cpu_supports("avx512vl")},
        {"avx512_bf16", in.has_avx512_bf16, -1},
        {"amx_tile", in.has_amx_tile, -1},
        {"amx_bf16", in.has_amx_bf16, -1},
        {"amx_permitted", in.amx_permitted, -1},
    };
    int found[7] = {0};
    for (int i = 0; i < n; i++) {
        const char *name = NULL;
        int value = -1;
        TU_CHECK(mxfp8_cpu_feature(i, &name, &value) == MXFP8_OK && name && *name && (value == 0 || value == 1),
                 "mxfp8_cpu_feature(%d)", i);
        if (!name) continue;
        for (int j = 0; j < i; j++) {
            const char *other = NULL;
            int v = 0;
            mxfp8_cpu_feature(j, &other, &v);
            TU_CHECK(other && strcmp(other, name), "feature %d and %d are both named %s", j, i, name);
        }
        for (int w = 0; w < 7; w++)
            if (!strcmp(name, want[w].name)) {
                found[w]++;
                TU_CHECK(value == want[w].info, "%s: the list says %d, mxfp8_info %d", name, value, want[w].info);
                if (want[w].gcc >= 0)
                    TU_CHECK(value == (want[w].gcc != 0), "%s: the list says %d, __builtin_cpu_supports %d", name,
                             value, want[w].gcc != 0);
            }
    }
    for (int w = 0; w < 7; w++) TU_CHECK(found[w] == 1, "feature %s listed %d times", want[w].name, found[w]);
    const char *name = "untouched";
    int value = 7;
    TU_CHECK(mxfp8_cpu_feature(n, &name, &value) == MXFP8_ERR_INVALID_ARGUMENT && value == 7 &&
                 !strcmp(name, "untouched") && strstr(mxfp8_last_error_message(), "out of range"),
             "mxfp8_cpu_feature(count): INVALID_ARGUMENT, nothing written");
    TU_CHECK(mxfp8_cpu_feature(-1, &name, &value) == MXFP8_ERR_INVALID_ARGUMENT, "mxfp8_cpu_feature(-1)");
    TU_CHECK(mxfp8_cpu_feature(0, NULL, &value) == MXFP8_ERR_NULL_POINTER &&
                 mxfp8_cpu_feature(0, &name, NULL) == MXFP8_ERR_NULL_POINTER, "mxfp8_cpu_feature: NULL outputs");
    /* every kernel but the reference keeps its self-test result in storage of its own (no shared cache to run out) */
    int nk = 0, bad = 0;
    for (const mxfp8i_ukernel *const *p = mxfp8t_all_ukernels(); *p; p++, nk++) {
        if ((*p)->reference) continue;
        bad += !(*p)->selftest;
        for (const mxfp8i_ukernel *const *q = mxfp8t_all_ukernels(); q != p; q++)
            bad += (*q)->selftest && (*q)->selftest == (*p)->selftest;
    }
    TU_CHECK(bad == 0, "%d kernels without self-test storage of their own", bad);
    printf("test_kernels: %d cpu features listed, %d kernels with their own self-test storage: %s\n", n, nk,
           bad ? "FAIL" : "ok");
}

int main(void) {
    if (mxfp8i_cpu_has(MXFP8I_NEEDS_AVX512)) test_bf16c_packer(), test_bf16c_pack_q();
    else {
        printf("test_kernels: SKIP the BF16 chunk packer: this CPU lacks AVX-512F/BW\n");
        skips++;
    }
    test_every_kernel();
    test_to_bf16();
    test_bf16_t();
    test_mxcsr();
    test_selection();
    test_cpu_features();
    if (skips) printf("test_kernels: %d sections skipped for absent CPU features\n", skips);
    return tu_finish("test_kernels");
}
