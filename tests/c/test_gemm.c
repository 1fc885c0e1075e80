/*
 * test_gemm.c -- GEMM microkernels against the contract, and mxfp8_gemm against the tests' independent oracle.
 *
 *  1. Every F32-panel microkernel the CPU supports (the reference included, whatever MXFP8_ISA says) equals the
 *     microkernel contract written here (an fmaf chain) bit for bit on generated edge cases: kc equal to / below /
 *     above the tile depth, partial M and N tiles, odd leading dimensions, load_c on/off, dequantized values in
 *     FP32's subnormal range, signed zeros, Inf. The BF16 chunk kernels: test_kernels.c.
 *  2. mxfp8_gemm, with the registry's kernel and with every usable kernel forced, equals the oracle's block-scaled
 *     GEMM (tests/c/oracle/: its own quantizer, fmaf over k ascending) bit for bit, for several shapes, tile sizes,
 *     loop orders, spill_reload, shard axis and thread counts, pre-quantized B in every scale layout, x4 packing,
 *     wrapX, F32/BF16 outputs and accumulate.
 *  3. A slot with its own panel format (the driver's generic pack/run path) against the oracle.
 *  4. The driver on descriptors: each operand's own recipe decides its quantization, not the config's fields.
 * mxfp8_matmul_backward and the errors: test_matmul_bwd.c.
 */
#include "gemm_util.h"

/* The F32-panel microkernel contract (src/kernels/ukernel.h), written here: for i < mr, j < nr, acc = load_c ?
 * c[i*ldc + j] : +0, then acc = fmaf(a[k*MR + i], b[k*NR + j], acc) for k ascending; nothing else is written. */
static void contract_f32(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int mr, int nr, int load) {
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float acc = load ? c[i * ldc + j] : 0.0f;
            for (int64_t k = 0; k < kc; k++) acc = fmaf(a[k * MXFP8I_MR + i], b[k * MXFP8I_NR + j], acc);
            c[i * ldc + j] = acc;
        }
}

static void test_ukernels(void) {
    /* every F32-panel kernel this CPU supports, the reference included (whatever MXFP8_ISA says), against the
       contract written above */
    const mxfp8i_ukernel *uks[16];
    int nuk = 0;
    for (const mxfp8i_ukernel *const *it = mxfp8t_all_ukernels(); *it && nuk < 16; it++) {
        if (!(*it)->fn) continue;
        if (mxfp8i_cpu_has((*it)->needs)) uks[nuk++] = *it;
        else printf("test_gemm: SKIP %s: this CPU lacks its instructions (%s)\n", (*it)->name, (*it)->isa_name);
    }
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
                        contract_f32(kc, a, b, c1, ldc, mr, nr, load);
                        uk->fn(kc, a, b, c2, ldc, mr, nr, load);
                        for (int64_t i = 0; i < MXFP8I_MR * ldc; i++)
                            if (!bits_eq(c1[i], c2[i]) && !(isnan(c1[i]) && isnan(c2[i]))) {
                                FAIL("%s: kc %lld mr %d nr %d ldc %lld load %d kind %d: c[%lld] = %a, contract %a",
                                     uk->name, (long long)kc, mr, nr, (long long)ldc, load, kind, (long long)i, c2[i],
                                     c1[i]);
                                break;
                            }
                        free(a); free(b); free(c1); free(c2);
                    }
    }
}

/* Naive: C = the oracle's block-scaled GEMM (tests/c/oracle/: its own quantizer, 1x32 or wrapX groups, and the fmaf
 * chain over k ascending from +0). */
static void naive_g(const float *A, const float *B, int64_t M, int64_t N, int64_t K, mxfp8_format f,
                    mxfp8_scale_rule r, mxfp8_group_scheme grp, float *C) {
    orc_mx_gemm(A, B, M, N, K, (int)f, (int)r, (int)grp, C);
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
        double *row = malloc(sizeof(double) * (size_t)K + 1);
        uint8_t *srow = malloc((size_t)G + 1);
        for (int64_t k = 0; k < K; k++) row[k] = B[n * K + k];
        orc_quant_line(row, 1, K, (int)f, MXFP8_SCALE_NKI, MXFP8_GROUP_1X32, o->codes + n * K, srow);
        for (int64_t g = 0; g < G; g++) {
            uint8_t s = srow[g];
            o->sc_compact[n * G + g] = s;
            o->sc_unpacked[((g / 4) * 32 + g % 4) * N + n] = s;
            o->sc_swz[((n / 128) * (Cp / 4) + g / 4) * 512 + (n % 32) * 16 + ((n % 128) / 32) * 4 + g % 4] = s;
        }
        free(row);
        free(srow);
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
                        if (Cb[i] != orc_bf16_encode((double)C0[i])) {
                            FAIL("bf16 output %s variant %d: C[%lld] = %04x, want %04x", kname, v, (long long)i, Cb[i],
                                 orc_bf16_encode((double)C0[i]));
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

/* BF16 outputs at exact ties of the BF16 grid (sums such as 1 + 2^-8, exact in FP32), on every usable kernel:
 * round to nearest even, both directions, both signs (the random data of test_gemm_vs_naive rarely ties). */
static void test_bf16_ties(void) {
    enum { M = 6, N = 3, K = 2 };
    const float A[M * K] = {1, 0x1p-8f, 1, 0x3p-8f, -1, -0x1p-8f, 3, 0x1p-7f, 1, 0x1p-9f, 0.5f, 0x1p-8f};
    const float B[N * K] = {1, 1, 2, 2, 1, 0};
    float C0[M * N];
    uint16_t Cb[M * N];
    orc_mx_gemm(A, B, M, N, K, MXFP8_FMT_E4M3, MXFP8_SCALE_NKI, MXFP8_GROUP_1X32, C0);
    int ties = 0;
    for (int i = 0; i < M * N; i++) ties += (f32_bits(C0[i]) & 0xFFFF) == 0x8000;
    if (ties < 6) FAIL("bf16 ties: only %d of the oracle's sums are BF16 ties", ties);
    const mxfp8i_ukernel *kernels[16];
    const int nk = gemm_kernels(kernels);
    int64_t sa[2] = {M, K}, sb[2] = {N, K}, sc[2] = {M, N};
    mxfp8_operand oa = {0}, ob = {0};
    oa.values = mxfp8_tensor_make((void *)A, MXFP8_DTYPE_F32, 2, sa);
    ob.values = mxfp8_tensor_make((void *)B, MXFP8_DTYPE_F32, 2, sb);
    mxfp8_matmul_config cfg;
    mxfp8_matmul_config_init(&cfg);
    cfg.float8_dtype = MXFP8_FMT_E4M3;
    for (int kk = 0; kk < nk; kk++) {
        mxfp8i_force_ukernel(kernels[kk]);
        mxfp8_tensor c = mxfp8_tensor_make(Cb, MXFP8_DTYPE_BF16, 2, sc);
        mxfp8_status st = mxfp8_gemm(&oa, &ob, &cfg, 0, &c);
        const char *kname = mxfp8i_gemm_ukernel()->name;
        mxfp8i_force_ukernel(NULL);
        if (st) { FAIL("bf16 ties (%s): status %d %s", kname, st, mxfp8_last_error_message()); continue; }
        for (int i = 0; i < M * N; i++)
            if (Cb[i] != orc_bf16_encode((double)C0[i])) {
                FAIL("bf16 ties %s: C[%d] = %04x, oracle %04x (sum %a)", kname, i, Cb[i],
                     orc_bf16_encode((double)C0[i]), C0[i]);
                break;
            }
    }
}

/* Groups at the FTZ boundary of the BF16 unit, through mxfp8_gemm (where the BF16 chunk kernels pack from BF16
 * values and take the chunk facts from the scales): in each row of A and B, 30 elements with the format's smallest
 * code (2^-9 resp. 2^-16 times the scale) and one element that sets the scale, placed so that it meets a zero;
 * scales chosen so that the tiny products are exactly 2^-127, an FP32 subnormal. The fmaf chain keeps their sum;
 * a BF16 unit would flush every partial sum (FTZ), so such a chunk must take the exact path. Rows (pack from
 * rows) and B transposed (columns, packed 4 panels at a time); full and partial tiles. */
static void test_ftz_bound_groups(void) {
    const mxfp8i_ukernel *kernels[16];
    const int nk = gemm_kernels(kernels);
    for (int fmt = 0; fmt < 2; fmt++) {
        const int lo = fmt ? 16 : 9, emax1 = fmt ? 14 : 7; /* smallest code 2^-lo; NKI: e = floor(log2 amax) - emax1 */
        const int sa = (-127 + 2 * lo) / 2, sb = -127 + 2 * lo - sa; /* (sa - lo) + (sb - lo) = -127 */
        for (int shape = 0; shape < 2; shape++) {
            const int64_t M = shape ? 20 : 32, N = shape ? 130 : 32, K = 64;
            float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * N * K);
            float *Bt = malloc(sizeof(float) * N * K), *C = malloc(sizeof(float) * M * N);
            float *C0 = malloc(sizeof(float) * M * N);
            for (int64_t m = 0; m < M; m++)
                for (int64_t k = 0; k < K; k++)
                    A[m * K + k] = k % 32 < 30 ? ((m + k) % 3 ? 1.0f : -1.0f) * ldexpf(1.0f, sa - lo)
                                               : k % 32 == 30 ? ldexpf(1.0f, sa + emax1) : 0.0f;
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < K; k++) {
                    B[n * K + k] = k % 32 < 30 ? ldexpf(1.0f, sb - lo) : k % 32 == 31 ? ldexpf(1.0f, sb + emax1) : 0.0f;
                    Bt[k * N + n] = B[n * K + k];
                }
            naive(A, B, M, N, K, (mxfp8_format)fmt, MXFP8_SCALE_NKI, C0);
            if (C0[0] == 0.0f || fabsf(C0[0]) > 0x1p-120f)
                FAIL("ftz bound groups: C0[0] = %a, not a sum of 2^-127s", C0[0]);
            for (int kk = 0; kk < nk; kk++)
                for (int bt = 0; bt < 2; bt++) {
                    int64_t sa2[2] = {M, K}, sb2[2] = {N, K}, sbt[2] = {K, N}, sc[2] = {M, N};
                    mxfp8_operand oa = {0}, ob = {0};
                    oa.values = mxfp8_tensor_make(A, MXFP8_DTYPE_F32, 2, sa2);
                    if (bt) {
                        ob.values = mxfp8_tensor_make(Bt, MXFP8_DTYPE_F32, 2, sbt);
                        ob.values.shape[0] = N, ob.values.shape[1] = K;
                        ob.values.strides[0] = 1, ob.values.strides[1] = N;
                    } else ob.values = mxfp8_tensor_make(B, MXFP8_DTYPE_F32, 2, sb2);
                    mxfp8_matmul_config cfg;
                    mxfp8_matmul_config_init(&cfg);
                    cfg.float8_dtype = (mxfp8_format)fmt;
                    mxfp8_tensor c = mxfp8_tensor_make(C, MXFP8_DTYPE_F32, 2, sc);
                    if (kk) mxfp8i_force_ukernel(kernels[kk]);
                    const char *kname = mxfp8i_gemm_ukernel()->name;
                    mxfp8_status st = mxfp8_gemm(&oa, &ob, &cfg, 0, &c);
                    mxfp8i_force_ukernel(NULL);
                    if (st) { FAIL("ftz bound groups (%s): status %d", kname, st); continue; }
                    for (int64_t i = 0; i < M * N; i++)
                        if (!bits_eq(C[i], C0[i])) {
                            FAIL("ftz bound groups %s fmt %d %lldx%lld B transposed %d: C[%lld] = %a, oracle %a", kname,
                                 fmt, (long long)M, (long long)N, bt, (long long)i, C[i], C0[i]);
                            break;
                        }
                }
            free(A); free(B); free(Bt); free(C0); free(C);
        }
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

/* The recipe travels with the operand: the driver quantizes each operand with its descriptor's recipe (gop.rc) and
 * reads only speed knobs from its config. Descriptors with recipe (f, rule, group) and a config that names the
 * other format, another rule and the other group scheme must give the oracle's GEMM of (f, rule, group), on every
 * kernel, with B in rows and in columns geometry (the BF16 and column packers). */
static void test_recipe_on_operand(void) {
    const int64_t M = 19, N = 70, K = 256;
    const mxfp8i_ukernel *kernels[16];
    const int nk = gemm_kernels(kernels);
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * N * K), *Bt = malloc(sizeof(float) * N * K);
    float *C0 = malloc(sizeof(float) * M * N), *C = malloc(sizeof(float) * M * N);
    for (int64_t i = 0; i < M * K; i++) A[i] = nrand() * (float)(1 + (i % 3));
    for (int64_t i = 0; i < N * K; i++) B[i] = nrand();
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) Bt[k * N + n] = B[n * K + k];
    const struct { mxfp8_format f; mxfp8_scale_rule r; mxfp8_group_scheme g; } rc[3] = {
        {MXFP8_FMT_E4M3, MXFP8_SCALE_OCP, MXFP8_GROUP_1X32},
        {MXFP8_FMT_E5M2, MXFP8_SCALE_RCEIL, MXFP8_GROUP_WRAPX},
        {MXFP8_FMT_E5M2, MXFP8_SCALE_NKI, MXFP8_GROUP_1X32}};
    for (int v = 0; v < 3; v++) {
        naive_g(A, B, M, N, K, rc[v].f, rc[v].r, rc[v].g, C0);
        mxfp8_matmul_config cfg; /* the other values: not read below the public entries */
        mxfp8_matmul_config_init(&cfg);
        cfg.float8_dtype = rc[v].f == MXFP8_FMT_E4M3 ? MXFP8_FMT_E5M2 : MXFP8_FMT_E4M3;
        cfg.scale_rule = rc[v].r == MXFP8_SCALE_NKI ? MXFP8_SCALE_RCEIL : MXFP8_SCALE_NKI;
        cfg.quant_scheme = rc[v].g == MXFP8_GROUP_1X32 ? MXFP8_GROUP_WRAPX : MXFP8_GROUP_1X32;
        for (int kk = 0; kk < nk; kk++)
            for (int bt = 0; bt < 2; bt++) {
                mxfp8i_gop ga = mxfp8i_gop_hp(A, MXFP8_DTYPE_F32, M, K, K, 1);
                mxfp8i_gop gb = bt ? mxfp8i_gop_hp(Bt, MXFP8_DTYPE_F32, N, K, 1, N)
                                   : mxfp8i_gop_hp(B, MXFP8_DTYPE_F32, N, K, K, 1);
                ga.rc = gb.rc = mxfp8i_recipe_make(rc[v].f, rc[v].r, rc[v].g);
                int64_t sc[2] = {M, N};
                mxfp8_tensor c = mxfp8_tensor_make(C, MXFP8_DTYPE_F32, 2, sc);
                if (kk) mxfp8i_force_ukernel(kernels[kk]);
                const char *kname = mxfp8i_gemm_ukernel()->name;
                mxfp8_status st = mxfp8i_gemm_gop(&ga, &gb, &cfg, 0, &c, 1 + bt);
                mxfp8i_force_ukernel(NULL);
                if (st) { FAIL("recipe on the operand (%s): status %d", kname, st); continue; }
                for (int64_t i = 0; i < M * N; i++)
                    if (!bits_eq(C[i], C0[i])) {
                        FAIL("recipe on the operand: variant %d %s B transposed %d: C[%lld] = %a, oracle %a", v,
                             kname, bt, (long long)i, C[i], C0[i]);
                        break;
                    }
            }
    }
    free(A); free(B); free(Bt); free(C0); free(C);
}

int main(void) {
    test_ukernels();
    test_gemm_vs_naive();
    test_gemm_wrapx();
    test_bf16_ties();
    test_ftz_bound_groups();
    test_generic_slot();
    test_recipe_on_operand();
    if (failures) {
        printf("test_gemm: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_gemm: ok (ukernel %s)\n", mxfp8i_gemm_ukernel()->name);
    return 0;
}
