/*
 * test_gemm.c -- GEMM microkernels against the scalar reference, and mxfp8_gemm against a naive loop.
 *
 *  1. Every SIMD microkernel equals mxfp8i_f32_gemm_8x32__ref bit for bit on generated edge cases: kc equal to /
 *     below / above the tile depth, partial M and N tiles, odd leading dimensions, load_c on/off, dequantized values
 *     in FP32's subnormal range, signed zeros, Inf. Skipped (77) when the CPU lacks AVX-512 and nothing else runs.
 *  2. mxfp8_gemm equals a naive triple loop (reference group quantizer, fmaf over k ascending) bit for bit, for
 *     several shapes, tile sizes, loop orders, spill_reload, shard axis and thread counts, F32/BF16 outputs and
 *     accumulate.
 *  3. Errors: status codes, and the output untouched.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm/gemm.h"
#include "kernels/qpanel.h"
#include "kernels/ref/ref.h"
#include "kernels/registry.h"

/* The kernels mxfp8_gemm is run with: the registry's choice (NULL), then every runtime kernel this CPU supports,
 * whatever MXFP8_ISA says, that passed its self-test here (test_kernels checks those that fail). Returns the count. */
static int gemm_kernels(const mxfp8i_ukernel *out[16]) {
    int n = 0;
    out[n++] = NULL;
    for (const mxfp8i_ukernel *const *it = mxfp8i_ukernel_list(); *it && n < 16; it++)
        if (mxfp8i_ukernel_usable(*it)) out[n++] = *it;
    return n;
}

static int failures;
#define FAIL(...)                                                                                                      \
    do {                                                                                                               \
        failures++;                                                                                                    \
        if (failures < 30) { printf("FAIL: " __VA_ARGS__); printf("\n"); }                                             \
    } while (0)

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static float urand(void) { return (float)(rnd() % 2000001) / 1000000.0f - 1.0f; }
static float nrand(void) {
    float s = 0;
    for (int i = 0; i < 6; i++) s += urand();
    return s;
}

/* A value an MXFP8 panel can hold: FP8 code x 2^e, including FP32 subnormals. */
static float deq_value(int kind) {
    uint8_t code = (uint8_t)rnd();
    mxfp8_format f = (rnd() & 1) ? MXFP8_FMT_E4M3 : MXFP8_FMT_E5M2;
    float v = mxfp8_fp8_to_fp32(code, f);
    if (isnan(v) || isinf(v)) v = 1.0f;
    int e = kind == 0 ? (int)(rnd() % 16) - 8 : kind == 1 ? -127 - (int)(rnd() % 4) : (int)(rnd() % 254) - 127;
    return ldexpf(v, e);
}

static int bits_eq(float a, float b) { return memcmp(&a, &b, 4) == 0; }

static void test_ukernels(void) {
    /* every F32-panel kernel this CPU supports (whatever MXFP8_ISA says) against the reference microkernel */
    const mxfp8i_ukernel *ref = &mxfp8i_f32_gemm_8x32__ref_ukernel, *uks[16];
    int nuk = 0;
    for (const mxfp8i_ukernel *const *it = mxfp8i_ukernel_list(); *it && nuk < 16; it++)
        if ((*it)->fn && *it != ref && mxfp8i_cpu_has((*it)->needs)) uks[nuk++] = *it;
    if (!nuk) printf("test_gemm: SKIP the F32 SIMD microkernels: this CPU lacks AVX-512F/BW\n");
    int64_t kcs[] = {1, 2, 7, 31, 32, 33, 255, 256, 257, 600};
    int nrs[] = {1, 2, 15, 16, 17, 31, 32};
    int64_t ldcs[] = {32, 33, 47, 101};
    for (int u = 0; u < nuk; u++) {
        const mxfp8i_ukernel *uk = uks[u];
        for (unsigned ik = 0; ik < sizeof kcs / sizeof *kcs; ik++)
            for (int mr = 1; mr <= MXFP8I_MR; mr++)
                for (unsigned in = 0; in < sizeof nrs / sizeof *nrs; in++)
                    for (int kind = 0; kind < 3; kind++) {
                        int64_t kc = kcs[ik], ldc = ldcs[(mr + in) % 4];
                        int nr = nrs[in], load = (int)((mr + in + ik) & 1);
                        float *a = malloc(sizeof(float) * kc * MXFP8I_MR), *b = malloc(sizeof(float) * kc * MXFP8I_NR);
                        float *c1 = malloc(sizeof(float) * MXFP8I_MR * ldc), *c2 = malloc(sizeof(float) * MXFP8I_MR * ldc);
                        for (int64_t i = 0; i < kc * MXFP8I_MR; i++) a[i] = deq_value(kind);
                        for (int64_t i = 0; i < kc * MXFP8I_NR; i++) b[i] = deq_value(kind == 1 ? 0 : kind);
                        if (kind == 2) { a[0] = -0.0f; b[1] = INFINITY; }
                        for (int64_t i = 0; i < MXFP8I_MR * ldc; i++) c1[i] = c2[i] = (i % 3) ? deq_value(0) : -0.0f;
                        ref->fn(kc, a, b, c1, ldc, mr, nr, load);
                        uk->fn(kc, a, b, c2, ldc, mr, nr, load);
                        for (int64_t i = 0; i < MXFP8I_MR * ldc; i++)
                            if (!bits_eq(c1[i], c2[i]) && !(isnan(c1[i]) && isnan(c2[i]))) {
                                FAIL("%s: kc %lld mr %d nr %d ldc %lld load %d kind %d: c[%lld] = %a, ref %a", uk->name,
                                     (long long)kc, mr, nr, (long long)ldc, load, kind, (long long)i, c2[i], c1[i]);
                                break;
                            }
                        free(a); free(b); free(c1); free(c2);
                    }
    }
}

/* qdq of one row of K values with the reference group quantizer, 1x32 or wrapX groups (written from the header's
 * definition: in the (sub)tile at k0 of size P, S = P/4, group j = {k0 + s*S + 8j + q}). */
static void qdq_row(const float *x, int64_t K, mxfp8_format f, mxfp8_scale_rule r, mxfp8_group_scheme grp, float *out) {
    if (grp == MXFP8_GROUP_1X32) {
        for (int64_t g = 0; g < K; g += 32) mxfp8i_qdq_group_ref(x + g, (int)(K - g < 32 ? K - g : 32), f, r, out + g);
        return;
    }
    int64_t k0 = 0;
    while (k0 < K) {
        int64_t P = K - k0 >= 512 ? 512 : K - k0 >= 256 ? 256 : 128, S = P / 4;
        for (int64_t j = 0; j < P / 32; j++) {
            float xg[32], yg[32];
            for (int s = 0; s < 4; s++)
                for (int q = 0; q < 8; q++) xg[s * 8 + q] = x[k0 + s * S + 8 * j + q];
            mxfp8i_qdq_group_ref(xg, 32, f, r, yg);
            for (int s = 0; s < 4; s++)
                for (int q = 0; q < 8; q++) out[k0 + s * S + 8 * j + q] = yg[s * 8 + q];
        }
        k0 += P;
    }
}

/* Naive: C[m][n] = sum over k ascending of fmaf(qA[m][k], qB[n][k]), from +0, the quantization by the reference. */
static void naive_g(const float *A, const float *B, int64_t M, int64_t N, int64_t K, mxfp8_format f,
                    mxfp8_scale_rule r, mxfp8_group_scheme grp, float *C) {
    float *qa = calloc((size_t)(M * K + 1), 4), *qb = calloc((size_t)(N * K + 1), 4);
    for (int64_t m = 0; m < M; m++) qdq_row(A + m * K, K, f, r, grp, qa + m * K);
    for (int64_t n = 0; n < N; n++) qdq_row(B + n * K, K, f, r, grp, qb + n * K);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) acc = fmaf(qa[m * K + k], qb[n * K + k], acc);
            C[m * N + n] = acc;
        }
    free(qa);
    free(qb);
}
static void naive(const float *A, const float *B, int64_t M, int64_t N, int64_t K, mxfp8_format f, mxfp8_scale_rule r,
                  float *C) {
    naive_g(A, B, M, N, K, f, r, MXFP8_GROUP_1X32, C);
}

/* wrapX groups (K % 128 == 0) on every kernel, with B plain and transposed. */
static void test_gemm_wrapx(void) {
    int64_t shapes[][3] = {{20, 40, 384}, {9, 70, 640}, {33, 5, 128}};
    const mxfp8i_ukernel *kernels[16];
    const int nk = gemm_kernels(kernels);
    for (unsigned s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * N * K), *Bt = malloc(sizeof(float) * N * K);
        float *C0 = malloc(sizeof(float) * M * N), *C = malloc(sizeof(float) * M * N);
        for (int64_t i = 0; i < M * K; i++) A[i] = nrand() * (float)(1 + (i % 7) * (i % 7));
        for (int64_t i = 0; i < N * K; i++) B[i] = nrand() * (float)(1 + (i % 5));
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) Bt[k * N + n] = B[n * K + k];
        for (int f = 0; f < 2; f++) {
            naive_g(A, B, M, N, K, (mxfp8_format)f, MXFP8_SCALE_RCEIL, MXFP8_GROUP_WRAPX, C0);
            for (int kk = 0; kk < nk; kk++)
                for (int bt = 0; bt < 2; bt++) {
                    int64_t sa[2] = {M, K}, sb[2] = {N, K}, sbt[2] = {K, N}, sc[2] = {M, N};
                    mxfp8_operand oa = {0}, ob = {0};
                    oa.values = mxfp8_tensor_make(A, MXFP8_DTYPE_F32, 2, sa);
                    if (bt) {
                        ob.values = mxfp8_tensor_make(Bt, MXFP8_DTYPE_F32, 2, sbt);
                        ob.values.shape[0] = N; ob.values.shape[1] = K; ob.values.strides[0] = 1; ob.values.strides[1] = N;
                    } else ob.values = mxfp8_tensor_make(B, MXFP8_DTYPE_F32, 2, sb);
                    mxfp8_matmul_config cfg;
                    mxfp8_matmul_config_init(&cfg);
                    cfg.float8_dtype = (mxfp8_format)f;
                    cfg.scale_rule = MXFP8_SCALE_RCEIL;
                    cfg.quant_scheme = MXFP8_GROUP_WRAPX;
                    cfg.spill_reload = bt;
                    mxfp8_tensor c = mxfp8_tensor_make(C, MXFP8_DTYPE_F32, 2, sc);
                    if (kk) mxfp8i_force_ukernel(kernels[kk]);
                    const char *kname = mxfp8i_gemm_ukernel()->name;
                    mxfp8_status st = mxfp8_gemm(&oa, &ob, &cfg, 0, &c);
                    mxfp8i_force_ukernel(NULL);
                    if (st) { FAIL("wrapX gemm (%s): status %d %s", kname, st, mxfp8_last_error_message()); continue; }
                    for (int64_t i = 0; i < M * N; i++)
                        if (!bits_eq(C[i], C0[i])) {
                            FAIL("wrapX gemm %lldx%lldx%lld fmt %d %s B transposed %d: C[%lld] = %a, naive %a",
                                 (long long)M, (long long)N, (long long)K, f, kname, bt, (long long)i, C[i], C0[i]);
                            break;
                        }
                }
        }
        free(A); free(B); free(Bt); free(C0); free(C);
    }
}

/* B operand arrangements: 0 plain F32, 1 transposed view of a [K, N] buffer, 2 U8 codes + compact scales,
 * 3 transposed codes + NKI unpacked scales, 4 x4-packed codes + 128x4-swizzled scales (flat). */
typedef struct bops {
    float *bt;
    uint8_t *codes, *codes_t, *sc_compact, *sc_unpacked, *sc_swz;
    uint32_t *x4;
} bops;

static void make_bops(const float *B, int64_t N, int64_t K, mxfp8_format f, bops *o) {
    int64_t G = mxfp8i_ceil_div(K, 32), Kw = mxfp8i_ceil_div(K, 4);
    int64_t Ru = mxfp8i_ceil_div(G, 4) * 32, Rp = mxfp8i_ceil_div(N, 128) * 128, Cp = mxfp8i_ceil_div(G, 4) * 4;
    o->bt = malloc(sizeof(float) * N * K);
    o->codes = calloc((size_t)(N * K + 1), 1);
    o->codes_t = calloc((size_t)(N * K + 1), 1);
    o->sc_compact = calloc((size_t)(N * G + 1), 1);
    o->sc_unpacked = calloc((size_t)(Ru * N + 1), 1);
    o->sc_swz = calloc((size_t)(Rp * Cp + 1), 1);
    o->x4 = calloc((size_t)(N * Kw + 1), 4);
    for (int64_t n = 0; n < N; n++) {
        for (int64_t k = 0; k < K; k++) o->bt[k * N + n] = B[n * K + k];
        for (int64_t g = 0; g < G; g++) {
            int cnt = (int)(K - 32 * g < 32 ? K - 32 * g : 32);
            uint8_t s = mxfp8i_quantize_group_ref(B + n * K + 32 * g, cnt, f, MXFP8_SCALE_NKI, o->codes + n * K + 32 * g);
            o->sc_compact[n * G + g] = s;
            o->sc_unpacked[((g / 4) * 32 + g % 4) * N + n] = s;
            o->sc_swz[((n / 128) * (Cp / 4) + g / 4) * 512 + (n % 32) * 16 + ((n % 128) / 32) * 4 + g % 4] = s;
        }
        for (int64_t k = 0; k < K; k++) {
            o->codes_t[k * N + n] = o->codes[n * K + k];
            o->x4[n * Kw + k / 4] |= (uint32_t)o->codes[n * K + k] << (8 * (k % 4));
        }
    }
}
static void free_bops(bops *o) {
    free(o->bt); free(o->codes); free(o->codes_t); free(o->sc_compact); free(o->sc_unpacked); free(o->sc_swz);
    free(o->x4);
}
static mxfp8_operand b_operand(const bops *o, float *B, int64_t N, int64_t K, mxfp8_format f, int kind) {
    mxfp8_operand ob = {0};
    int64_t sb[2] = {N, K}, G = mxfp8i_ceil_div(K, 32);
    mxfp8_dtype cdt = mxfp8i_fmt_dtype(f);
    switch (kind) {
    case 0: ob.values = mxfp8_tensor_make(B, MXFP8_DTYPE_F32, 2, sb); break;
    case 1: {
        int64_t st[2] = {K, N};
        ob.values = mxfp8_tensor_make(o->bt, MXFP8_DTYPE_F32, 2, st);
        ob.values.shape[0] = N; ob.values.shape[1] = K; ob.values.strides[0] = 1; ob.values.strides[1] = N;
        break;
    }
    case 2: {
        int64_t ss[2] = {N, G};
        ob.values = mxfp8_tensor_make(o->codes, cdt, 2, sb);
        ob.scales = mxfp8_tensor_make(o->sc_compact, MXFP8_DTYPE_E8M0, 2, ss);
        ob.scale_layout = MXFP8_SCALES_COMPACT;
        break;
    }
    case 3: {
        int64_t st[2] = {K, N}, ss[2] = {mxfp8i_ceil_div(G, 4) * 32, N};
        ob.values = mxfp8_tensor_make(o->codes_t, MXFP8_DTYPE_U8, 2, st);
        ob.values.shape[0] = N; ob.values.shape[1] = K; ob.values.strides[0] = 1; ob.values.strides[1] = N;
        ob.scales = mxfp8_tensor_make(o->sc_unpacked, MXFP8_DTYPE_U8, 2, ss);
        ob.scale_layout = MXFP8_SCALES_NKI_UNPACKED;
        break;
    }
    default: {
        int64_t sw[2] = {N, mxfp8i_ceil_div(K, 4)};
        int64_t ss[1] = {mxfp8i_ceil_div(N, 128) * 128 * mxfp8i_ceil_div(G, 4) * 4};
        ob.values = mxfp8_tensor_make(o->x4, MXFP8_DTYPE_U32, 2, sw);
        ob.scales = mxfp8_tensor_make(o->sc_swz, MXFP8_DTYPE_U8, 1, ss);
        ob.scale_layout = MXFP8_SCALES_SWIZZLE_128X4;
        break;
    }
    }
    return ob;
}

static void test_gemm_vs_naive(void) {
    int64_t shapes[][3] = {{1, 1, 1}, {9, 33, 65}, {33, 97, 40}, {64, 128, 64}, {130, 70, 300}};
    const mxfp8i_ukernel *kernels[16];
    const int nk = gemm_kernels(kernels);
    for (unsigned s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * N * K);
        float *C0 = malloc(sizeof(float) * M * N), *C = malloc(sizeof(float) * M * N);
        uint16_t *Cb = malloc(2 * M * N);
        for (int64_t i = 0; i < M * K; i++) A[i] = nrand();
        for (int64_t i = 0; i < N * K; i++) B[i] = nrand() * 0.01f;
        for (int f = 0; f < 2; f++) {
            naive(A, B, M, N, K, (mxfp8_format)f, MXFP8_SCALE_NKI, C0);
            bops bo;
            make_bops(B, N, K, (mxfp8_format)f, &bo);
            int64_t sa[2] = {M, K}, sc[2] = {M, N};
            mxfp8_operand oa = {0};
            oa.values = mxfp8_tensor_make(A, MXFP8_DTYPE_F32, 2, sa);
            for (int kk = 0; kk < nk; kk++) {
                for (int v = 0; v < 10; v++) {
                    int bkind = v % 5;
                    mxfp8_operand ob = b_operand(&bo, B, N, K, (mxfp8_format)f, bkind);
                    mxfp8_matmul_config cfg;
                    mxfp8_matmul_config_init(&cfg);
                    cfg.float8_dtype = (mxfp8_format)f;
                    cfg.tile_loop_order = (mxfp8_loop_order)(v % 6);
                    cfg.block_loop_order = (mxfp8_loop_order)((v + 3) % 6);
                    cfg.spill_reload = (v / 5) & 1;
                    cfg.lnc_2_shard_rhs = (v >> 1) & 1;
                    if (bkind == 4) cfg.K = K;
                    if (v >= 5) { cfg.tile_m = 8; cfg.tile_n = 32; cfg.tile_k = 1 + v * 7; cfg.tiles_in_block_m = 2; }
                    mxfp8_set_num_threads(1 + (v & 1));
                    mxfp8_tensor c = mxfp8_tensor_make(C, MXFP8_DTYPE_F32, 2, sc);
                    for (int64_t i = 0; i < M * N; i++) C[i] = NAN;
                    if (kk) mxfp8i_force_ukernel(kernels[kk]);
                    const char *kname = mxfp8i_gemm_ukernel()->name;
                    mxfp8_status st = mxfp8_gemm(&oa, &ob, &cfg, 0, &c);
                    if (st) {
                        FAIL("mxfp8_gemm (%s, B kind %d) status %d: %s", kname, bkind, st, mxfp8_last_error_message());
                        mxfp8i_force_ukernel(NULL);
                        continue;
                    }
                    for (int64_t i = 0; i < M * N; i++)
                        if (!bits_eq(C[i], C0[i])) {
                            FAIL("gemm %lldx%lldx%lld fmt %d %s B kind %d variant %d: C[%lld] = %a, naive %a",
                                 (long long)M, (long long)N, (long long)K, f, kname, bkind, v, (long long)i, C[i],
                                 C0[i]);
                            break;
                        }
                    /* accumulate: C + sum, one rounding */
                    for (int64_t i = 0; i < M * N; i++) C[i] = (float)i;
                    st = mxfp8_gemm(&oa, &ob, &cfg, 1, &c);
                    for (int64_t i = 0; i < M * N && !st; i++)
                        if (!bits_eq(C[i], (float)i + C0[i])) {
                            FAIL("accumulate %s variant %d: C[%lld] = %a, want %a", kname, v, (long long)i, C[i],
                                 (float)i + C0[i]);
                            break;
                        }
                    /* BF16 output: RNE of the FP32 sum */
                    mxfp8_tensor cb = mxfp8_tensor_make(Cb, MXFP8_DTYPE_BF16, 2, sc);
                    st = mxfp8_gemm(&oa, &ob, &cfg, 0, &cb);
                    for (int64_t i = 0; i < M * N && !st; i++)
                        if (Cb[i] != mxfp8_fp32_to_bf16(C0[i])) {
                            FAIL("bf16 output %s variant %d: C[%lld] = %04x, want %04x", kname, v, (long long)i, Cb[i],
                                 mxfp8_fp32_to_bf16(C0[i]));
                            break;
                        }
                    mxfp8i_force_ukernel(NULL);
                }
            }
            free_bops(&bo);
        }
        mxfp8_set_num_threads(0);
        free(A); free(B); free(C0); free(C); free(Cb);
    }
}

/* A slot with its own panel format (row-major [w][K] panels, 16 x 24 tile, kalign 32), run by a plain fmaf loop:
 * exercises the driver's generic pack()/run() path that an AMX kernel uses. */
static int64_t g_rmK;
static int g_rm_bad;
static int64_t rm_bytes(int64_t K, int w) { return (int64_t)w * K * 4; }
static void rm_pack(int is_b, const float *src, int64_t rs, int rows, int64_t K, void *panel) {
    int w = is_b ? 24 : 16;
    float *p = (float *)panel;
    for (int i = 0; i < w; i++)
        for (int64_t k = 0; k < K; k++) p[i * K + k] = i < rows ? src[i * rs + k] : 0.0f;
}
static void rm_run(int64_t k0, int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mr, int nr,
                   int load_c) {
    if (k0 % 32 || (kc % 32 && k0 + kc != g_rmK) || mr > 16 || nr > 24) g_rm_bad = 1;
    const float *A = (const float *)a, *B = (const float *)b;
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float acc = load_c ? c[i * ldc + j] : 0.0f;
            for (int64_t k = k0; k < k0 + kc; k++) acc = fmaf(A[i * g_rmK + k], B[j * g_rmK + k], acc);
            c[i * ldc + j] = acc;
        }
}
static const mxfp8i_ukernel k_rowmajor = {
    .name = "f32_gemm_16x24__test_rowmajor", .isa_name = "scalar", .panel = MXFP8I_PANEL_BF16C /* not F32 panels */,
    .mr = 16, .nr = 24, .kalign = 32, .tile_m = 128, .tile_n = 256, .tile_k = 128, .panel_bytes = rm_bytes,
    .pack = rm_pack, .run = rm_run};

static void test_generic_slot(void) {
    int64_t shapes[][3] = {{17, 50, 100}, {40, 24, 33}, {3, 5, 64}};
    for (unsigned s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * N * K);
        float *C0 = malloc(sizeof(float) * M * N), *C = malloc(sizeof(float) * M * N);
        for (int64_t i = 0; i < M * K; i++) A[i] = nrand();
        for (int64_t i = 0; i < N * K; i++) B[i] = nrand();
        naive(A, B, M, N, K, MXFP8_FMT_E4M3, MXFP8_SCALE_OCP, C0);
        /* B given transposed ([K, N] buffer viewed as [N, K]) to take the column path too */
        float *Bt = malloc(sizeof(float) * N * K);
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) Bt[k * N + n] = B[n * K + k];
        int64_t sa[2] = {M, K}, sbt[2] = {K, N}, sc[2] = {M, N};
        mxfp8_operand oa = {0}, ob = {0};
        oa.values = mxfp8_tensor_make(A, MXFP8_DTYPE_F32, 2, sa);
        ob.values = mxfp8_tensor_make(Bt, MXFP8_DTYPE_F32, 2, sbt);
        ob.values.shape[0] = N;
        ob.values.shape[1] = K;
        ob.values.strides[0] = 1;
        ob.values.strides[1] = N;
        mxfp8_tensor c = mxfp8_tensor_make(C, MXFP8_DTYPE_F32, 2, sc);
        for (int v = 0; v < 4; v++) {
            mxfp8_matmul_config cfg;
            mxfp8_matmul_config_init(&cfg);
            cfg.float8_dtype = MXFP8_FMT_E4M3;
            cfg.scale_rule = MXFP8_SCALE_OCP;
            cfg.tile_k = v == 0 ? 0 : 7 + 20 * v; /* rounded up to kalign */
            cfg.tile_loop_order = (mxfp8_loop_order)(v + 1);
            cfg.spill_reload = v & 1;
            mxfp8_set_num_threads(1 + (v & 1));
            g_rmK = K;
            mxfp8i_force_ukernel(&k_rowmajor);
            mxfp8_status st = mxfp8_gemm(&oa, &ob, &cfg, 0, &c);
            mxfp8i_force_ukernel(NULL);
            if (st) {
                FAIL("generic slot: status %d %s", st, mxfp8_last_error_message());
                continue;
            }
            for (int64_t i = 0; i < M * N; i++)
                if (!bits_eq(C[i], C0[i])) {
                    FAIL("generic slot %lldx%lldx%lld variant %d: C[%lld] = %a, naive %a", (long long)M, (long long)N,
                         (long long)K, v, (long long)i, C[i], C0[i]);
                    break;
                }
        }
        if (g_rm_bad) FAIL("generic slot: the driver broke the kalign / tile contract");
        mxfp8_set_num_threads(0);
        free(A); free(B); free(Bt); free(C0); free(C);
    }
}

static void test_errors(void) {
    float A[4 * 40], B[3 * 40], C[12];
    for (int i = 0; i < 160; i++) A[i] = 1;
    for (int i = 0; i < 120; i++) B[i] = 1;
    int64_t sa[2] = {4, 40}, sb[2] = {3, 40}, sc[2] = {4, 3}, sbad[2] = {3, 41};
    mxfp8_operand oa = {0}, ob = {0};
    oa.values = mxfp8_tensor_make(A, MXFP8_DTYPE_F32, 2, sa);
    ob.values = mxfp8_tensor_make(B, MXFP8_DTYPE_F32, 2, sb);
    mxfp8_tensor c = mxfp8_tensor_make(C, MXFP8_DTYPE_F32, 2, sc);
    for (int i = 0; i < 12; i++) C[i] = -7;
    struct { const char *what; mxfp8_status want; mxfp8_status got; } cases[8];
    int n = 0;
    cases[n].what = "NULL a"; cases[n].want = MXFP8_ERR_NULL_POINTER; cases[n++].got = mxfp8_gemm(NULL, &ob, NULL, 0, &c);
    mxfp8_operand obad = ob;
    obad.values = mxfp8_tensor_make(B, MXFP8_DTYPE_F32, 2, sbad);
    cases[n].what = "K mismatch"; cases[n].want = MXFP8_ERR_SHAPE_MISMATCH; cases[n++].got = mxfp8_gemm(&oa, &obad, NULL, 0, &c);
    mxfp8_tensor cbf = c;
    cbf.dtype = MXFP8_DTYPE_BF16;
    cases[n].what = "accumulate into bf16"; cases[n].want = MXFP8_ERR_DTYPE; cases[n++].got = mxfp8_gemm(&oa, &ob, NULL, 1, &cbf);
    mxfp8_tensor calias = mxfp8_tensor_make(A, MXFP8_DTYPE_F32, 2, sc);
    cases[n].what = "c aliases a"; cases[n].want = MXFP8_ERR_ALIASING; cases[n++].got = mxfp8_gemm(&oa, &ob, NULL, 0, &calias);
    mxfp8_matmul_config cfg;
    mxfp8_matmul_config_init(&cfg);
    cfg.tile_loop_order = (mxfp8_loop_order)9;
    cases[n].what = "bad loop order"; cases[n].want = MXFP8_ERR_INVALID_ARGUMENT; cases[n++].got = mxfp8_gemm(&oa, &ob, &cfg, 0, &c);
    mxfp8_matmul_config_init(&cfg);
    cfg.quant_scheme = MXFP8_GROUP_WRAPX;
    cases[n].what = "wrapX with K=40"; cases[n].want = MXFP8_ERR_UNSUPPORTED; cases[n++].got = mxfp8_gemm(&oa, &ob, &cfg, 0, &c);
    mxfp8_tensor cs = c;
    cs.strides[0] = 1;
    cases[n].what = "overlapping output strides"; cases[n].want = MXFP8_ERR_BAD_STRIDES; cases[n++].got = mxfp8_gemm(&oa, &ob, NULL, 0, &cs);
    mxfp8_operand oc = ob;
    oc.values.dtype = MXFP8_DTYPE_E5M2;
    cases[n].what = "codes without scales"; cases[n].want = MXFP8_ERR_NULL_POINTER; cases[n++].got = mxfp8_gemm(&oa, &oc, NULL, 0, &c);
    for (int i = 0; i < n; i++) {
        if (cases[i].got != cases[i].want) FAIL("%s: status %d, want %d", cases[i].what, cases[i].got, cases[i].want);
        else if (!*mxfp8_last_error_message()) FAIL("%s: no error message", cases[i].what);
    }
    for (int i = 0; i < 12; i++)
        if (C[i] != -7) { FAIL("an error call wrote the output"); break; }
}

/* mxfp8_matmul_backward == the two GEMMs it stands for (bitwise), and its errors leave the outputs untouched. */
static void test_backward(void) {
    int64_t M = 45, N = 70, K = 33;
    float *dy = malloc(sizeof(float) * M * N), *w = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * M * K);
    float *dx = malloc(sizeof(float) * M * K), *dw = malloc(sizeof(float) * N * K);
    float *gx = malloc(sizeof(float) * M * K), *gw = malloc(sizeof(float) * N * K);
    for (int64_t i = 0; i < M * N; i++) dy[i] = nrand();
    for (int64_t i = 0; i < N * K; i++) w[i] = nrand();
    for (int64_t i = 0; i < M * K; i++) x[i] = nrand();
    int64_t s_dy[2] = {M, N}, s_w[2] = {N, K}, s_x[2] = {M, K};
    mxfp8_matmul_bwd_args args;
    mxfp8_matmul_bwd_args_init(&args);
    args.output_grad = mxfp8_tensor_make(dy, MXFP8_DTYPE_F32, 2, s_dy);
    args.weights = mxfp8_tensor_make(w, MXFP8_DTYPE_F32, 2, s_w);
    args.input_activation = mxfp8_tensor_make(x, MXFP8_DTYPE_F32, 2, s_x);
    args.output_dtype = MXFP8_DTYPE_F32;
    args.float8_dtype = MXFP8_FMT_E4M3;
    args.scale_rule = MXFP8_SCALE_RCEIL;
    mxfp8_tensor tdx = mxfp8_tensor_make(dx, MXFP8_DTYPE_F32, 2, s_x), tdw = mxfp8_tensor_make(dw, MXFP8_DTYPE_F32, 2, s_w);
    mxfp8_status st = mxfp8_matmul_backward(&args, &tdx, &tdw);
    if (st) FAIL("backward: status %d %s", st, mxfp8_last_error_message());
    /* the same as two GEMMs: dX = dY [M, N] . (W viewed [K, N]); dW = (dY viewed [N, M]) . (X viewed [K, M]) */
    mxfp8_matmul_config cfg;
    mxfp8_matmul_config_init(&cfg);
    cfg.float8_dtype = MXFP8_FMT_E4M3;
    cfg.scale_rule = MXFP8_SCALE_RCEIL;
    mxfp8_operand a = {0}, b = {0};
    a.values = args.output_grad;
    b.values = args.weights;
    b.values.shape[0] = K; b.values.shape[1] = N; b.values.strides[0] = 1; b.values.strides[1] = K;
    mxfp8_tensor tgx = mxfp8_tensor_make(gx, MXFP8_DTYPE_F32, 2, s_x), tgw = mxfp8_tensor_make(gw, MXFP8_DTYPE_F32, 2, s_w);
    if ((st = mxfp8_gemm(&a, &b, &cfg, 0, &tgx))) FAIL("gemm dX: %d", st);
    a.values.shape[0] = N; a.values.shape[1] = M; a.values.strides[0] = 1; a.values.strides[1] = N;
    b.values = args.input_activation;
    b.values.shape[0] = K; b.values.shape[1] = M; b.values.strides[0] = 1; b.values.strides[1] = K;
    if ((st = mxfp8_gemm(&a, &b, &cfg, 0, &tgw))) FAIL("gemm dW: %d", st);
    if (memcmp(dx, gx, sizeof(float) * M * K)) FAIL("backward dX differs from mxfp8_gemm");
    if (memcmp(dw, gw, sizeof(float) * N * K)) FAIL("backward dW differs from mxfp8_gemm");
    /* errors: status, message, outputs untouched */
    for (int64_t i = 0; i < M * K; i++) dx[i] = -3;
    for (int64_t i = 0; i < N * K; i++) dw[i] = -3;
    struct { const char *what; mxfp8_status want; } cs[8] = {
        {"input_grad aliases output_grad", MXFP8_ERR_ALIASING}, {"outputs overlap", MXFP8_ERR_ALIASING},
        {"output dtype != output_dtype", MXFP8_ERR_DTYPE}, {"float8_dtype 7", MXFP8_ERR_INVALID_ARGUMENT},
        {"bad phase loop order", MXFP8_ERR_INVALID_ARGUMENT}, {"phase config M mismatch", MXFP8_ERR_SHAPE_MISMATCH},
        {"weights K mismatch", MXFP8_ERR_SHAPE_MISMATCH}, {"scales with f32 operand", MXFP8_ERR_INVALID_ARGUMENT}};
    for (int c = 0; c < 8; c++) {
        mxfp8_matmul_bwd_args e = args;
        mxfp8_tensor ex = tdx, ew = tdw;
        mxfp8_matmul_config pc;
        mxfp8_matmul_config_init(&pc);
        uint8_t sc[64 * 8] = {0};
        int64_t s_sc[2] = {M, 3};
        switch (c) {
        case 0: ex = mxfp8_tensor_make(dy, MXFP8_DTYPE_F32, 2, s_x); break;
        case 1: ew = mxfp8_tensor_make(dx + 1, MXFP8_DTYPE_F32, 2, s_w); ew.shape[0] = 1; break;
        case 2: e.output_dtype = MXFP8_DTYPE_BF16; break;
        case 3: e.float8_dtype = (mxfp8_format)7; break;
        case 4: pc.tile_loop_order = (mxfp8_loop_order)6; e.input_grad_config = &pc; break;
        case 5: pc.M = M + 1; e.weight_grad_config = &pc; break;
        case 6: e.weights.shape[1] = K - 1; break;
        case 7: e.output_grad_scales = mxfp8_tensor_make(sc, MXFP8_DTYPE_U8, 2, s_sc); break;
        }
        if (c == 1) { /* weight_grad [1, K] overlapping input_grad: shapes must still agree, so N = 1 here */
            e.weights.shape[0] = 1;
            e.output_grad.shape[1] = 1;
        }
        st = mxfp8_matmul_backward(&e, &ex, &ew);
        if (st != cs[c].want) FAIL("backward error case '%s': status %d, want %d (%s)", cs[c].what, st, cs[c].want,
                                   mxfp8_last_error_message());
        else if (!*mxfp8_last_error_message()) FAIL("backward error case '%s': no message", cs[c].what);
    }
    for (int64_t i = 0; i < M * K; i++)
        if (dx[i] != -3) { FAIL("a failed backward call wrote input_grad"); break; }
    for (int64_t i = 0; i < N * K; i++)
        if (dw[i] != -3) { FAIL("a failed backward call wrote weight_grad"); break; }
    free(dy); free(w); free(x); free(dx); free(dw); free(gx); free(gw);
}

int main(void) {
    test_ukernels();
    test_gemm_vs_naive();
    test_gemm_wrapx();
    test_generic_slot();
    test_errors();
    test_backward();
    if (failures) {
        printf("test_gemm: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_gemm: ok (ukernel %s)\n", mxfp8i_gemm_ukernel()->name);
    return 0;
}
