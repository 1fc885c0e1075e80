/*
 * test_workspace.c -- the heap workspace of each entry point stays within the bound documented in include/mxfp8.h,
 * section "Workspace and memory".
 *
 * The executable is linked with --wrap=malloc, calloc, realloc, free, aligned_alloc, posix_memalign and memalign
 * (CMakeLists.txt): every allocation call of its own objects -- this file and the statically linked library --
 * goes to the __wrap_* functions below, which forward to the real allocator (glibc's, or the sanitizer's in a
 * sanitizer build: the test runs there too, with the sanitizer checking every error path) and keep the live and
 * peak byte counts. The OpenMP runtime's own bookkeeping is not counted (the bounds allow for it). Each entry point
 * is called once to warm up, then measured: peak live bytes during the call minus the live bytes before it, and the
 * live bytes after it must equal those before (no leak).
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* ---- a counting allocator over the real one ---- */
void *__real_malloc(size_t);
void *__real_calloc(size_t, size_t);
void *__real_realloc(void *, size_t);
void __real_free(void *);
void *__real_aligned_alloc(size_t, size_t);
int __real_posix_memalign(void **, size_t, size_t);
void *__real_memalign(size_t, size_t);
void *__wrap_malloc(size_t);
void *__wrap_calloc(size_t, size_t);
void *__wrap_realloc(void *, size_t);
void __wrap_free(void *);
void *__wrap_aligned_alloc(size_t, size_t);
int __wrap_posix_memalign(void **, size_t, size_t);
void *__wrap_memalign(size_t, size_t);

#define WS_SLOTS (1 << 16) /* open addressing table: pointer -> size */
static void *ws_ptr[WS_SLOTS];
static size_t ws_size[WS_SLOTS];
static atomic_flag ws_lock = ATOMIC_FLAG_INIT;
static int64_t ws_live, ws_peak;
static int ws_overflow;
static atomic_llong ws_calls; /* allocation calls seen (proves the wrapping is in effect) */

static void lock(void) {
    while (atomic_flag_test_and_set_explicit(&ws_lock, memory_order_acquire)) {
    }
}
static void unlock(void) { atomic_flag_clear_explicit(&ws_lock, memory_order_release); }
static size_t slot_of(void *p) { return (size_t)(((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull >> 48) & (WS_SLOTS - 1); }

static void track(void *p, size_t n) {
    if (!p) return;
    atomic_fetch_add(&ws_calls, 1);
    lock();
    size_t s = slot_of(p);
    for (size_t k = 0; k < WS_SLOTS; k++, s = (s + 1) & (WS_SLOTS - 1))
        if (!ws_ptr[s] || ws_ptr[s] == (void *)1) {
            ws_ptr[s] = p;
            ws_size[s] = n;
            ws_live += (int64_t)n;
            if (ws_live > ws_peak) ws_peak = ws_live;
            unlock();
            return;
        }
    ws_overflow = 1;
    unlock();
}
static void untrack(void *p) {
    if (!p) return;
    lock();
    size_t s = slot_of(p);
    for (size_t k = 0; k < WS_SLOTS && ws_ptr[s]; k++, s = (s + 1) & (WS_SLOTS - 1))
        if (ws_ptr[s] == p) {
            ws_ptr[s] = (void *)1; /* tombstone */
            ws_live -= (int64_t)ws_size[s];
            break;
        }
    unlock();
}

/* Allocation failure injection: with ws_fail_at = k > 0, the k-th allocation call (of this executable's objects:
 * the library; not the OpenMP runtime, which aborts on failure and is not wrapped) returns NULL. */
static atomic_llong ws_fail_at;
static int inject(void) {
    if (atomic_load(&ws_fail_at) <= 0) return 0;
    return atomic_fetch_sub(&ws_fail_at, 1) == 1;
}

void *__wrap_malloc(size_t n) {
    if (inject()) return NULL;
    void *p = __real_malloc(n);
    track(p, n);
    return p;
}
void *__wrap_calloc(size_t a, size_t b) {
    if (inject()) return NULL;
    void *p = __real_calloc(a, b);
    track(p, a * b);
    return p;
}
void *__wrap_realloc(void *q, size_t n) {
    untrack(q);
    void *p = __real_realloc(q, n);
    if (p) track(p, n);
    else if (q && n) track(q, 0); /* failed: q is still allocated (size lost; never happens in these tests) */
    return p;
}
void __wrap_free(void *p) {
    untrack(p);
    __real_free(p);
}
void *__wrap_memalign(size_t a, size_t n) {
    if (inject()) return NULL;
    void *p = __real_memalign(a, n);
    track(p, n);
    return p;
}
void *__wrap_aligned_alloc(size_t a, size_t n) {
    if (inject()) return NULL;
    void *p = __real_aligned_alloc(a, n);
    track(p, n);
    return p;
}
int __wrap_posix_memalign(void **out, size_t a, size_t n) {
    if (inject()) return 12; /* ENOMEM */
    int rc = __real_posix_memalign(out, a, n);
    if (rc == 0) track(*out, n);
    return rc;
}

typedef struct ws_mark {
    int64_t before;
} ws_mark;
static ws_mark ws_begin(void) {
    lock();
    ws_mark m = {ws_live};
    ws_peak = ws_live;
    unlock();
    return m;
}
/* peak workspace of the call; checks that nothing stayed allocated */
static int64_t ws_end(ws_mark m, const char *what) {
    lock();
    int64_t peak = ws_peak - m.before, after = ws_live;
    unlock();
    TU_CHECK(after == m.before, "%s: %lld bytes still allocated after the call", what, (long long)(after - m.before));
    return peak;
}

/* ---- the documented bounds (include/mxfp8.h, "Workspace and memory") ---- */
static int64_t omp_overhead(int nt) { return 4096 + 1024 * (int64_t)nt; }
static int64_t rup(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
/* auto config: blocks of MCb = NCb = 512 */
static int64_t bound_gemm(int64_t M, int64_t N, int64_t K, int spill, int nt) {
    int64_t bm = rup(M < 512 ? M : 512, 32), bn = N < 512 ? N : 512;
    return 4 * K * (N + 32) + (spill ? 4 * K * (M + 32) : 0) + (int64_t)nt * (4 * K * (bm + 80) + 4 * bm * (bn + 16)) +
           65536 + omp_overhead(nt);
}
/* backward: 4 (E - 1) 3 H I of F32 staging + 4 T H; forward: 4 T H (the backward subtracts one expert) */
static int64_t bound_moe(int64_t T, int64_t H, int64_t I, int64_t E, int64_t B, int64_t N, int nt, int64_t ws_gemm) {
    int64_t Bw = B < T ? B : T;
    if (Bw < 1) Bw = 1;
    return 4 * (T * H + 3 * E * H * I) + 8 * (T * E + 2 * E * I + E * H) + 4 * Bw * (8 * H + 13 * I) + 12 * H * I +
           4 * (N * B + N) + ws_gemm + omp_overhead(nt);
}

/* The segmented weight gradients' bytes beyond the per-block path (include/mxfp8.h): Re = the most positions of one
 * expert (<= T for mxfp8_moe_route's layout), Se = the most blocks of one expert (<= N). */
static int64_t bound_moe_segmented_extra(int64_t T, int64_t H, int64_t I, int64_t B, int64_t Re, int64_t Se, int nt) {
    int64_t Bw = B < T ? B : T;
    if (Bw < 1) Bw = 1;
    return 4 * (Re - Bw) * (2 * H + 3 * I) + 4 * Se * Bw * (H + 2 * I + 64) + 8192 * (int64_t)nt + 320 * Se;
}

/* The expert-parallel backward (include/mxfp8.h): per thread the serial walk's block buffers and block GEMM (1
 * thread) with the segmented terms, an expert's weight-gradient pair and FP32 weight copies, its packed weights (also
 * the recomputations'); once: dX, the FP64 sums, the routing table, each position's dX row and affinity term, two
 * waves of W rows of Phase 3 / 4 operands, the schedule's tables. gb1: the block GEMM's bound on 1 thread. */
static int64_t bound_moe_par(int64_t T, int64_t H, int64_t I, int64_t E, int64_t B, int64_t N, int64_t Re,
                             int64_t Se, int nt, int64_t gb1) {
    int64_t Bp = B < T ? B : T, W = T < N * B ? T : N * B;
    if (Bp < 1) Bp = 1;
    if (W < 4 * B && 4 * B <= N * B) W = 4 * B;
    if (W < Re) W = Re;
    const int64_t once = 4 * T * H + 8 * (T * E + 2 * E * I + E * H) + 4 * (N * B + N) + 4 * N * B * H + 16 * N * B +
                         2 * W * (8 * H + 12 * I) + 80 * (E + 1) + 36 * N + 8 * T + 64 + omp_overhead(nt);
    const int64_t per = 24 * H * I + 4 * Bp * (8 * H + 13 * I) + 8 * H * (I + 32) + 16 * I * (H + 32) + gb1 +
                        4 * Se * Bp * (H + 2 * I + 64) + 8192 + 320 * Se + 4096;
    return once + (int64_t)nt * per;
}

int mxfp8i_moe_set_segmented_wgrad(int mode); /* src/ops/moe/bwd_state.h (test-only: -1 by size, 0, 1) */
int mxfp8i_moe_set_block_runs(int mode);       /* src/ops/moe/moe.h (test-only: -1 by size, 0, 1) */
int mxfp8i_moe_set_expert_parallel(int mode);  /* src/ops/moe/moe.h (test-only: -1 auto, 0 never, 1 always) */

static float *frand(int64_t n, uint64_t seed) {
    tu_rng r = {seed};
    float *p = tu_alloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = (float)(tu_uniform(&r) * 2 - 1);
    return p;
}

static void report(const char *what, int64_t used, int64_t bound) {
    printf("  %-44s workspace %10lld bytes, bound %10lld\n", what, (long long)used, (long long)bound);
    TU_CHECK(used <= bound, "%s: workspace %lld bytes exceeds the documented bound %lld", what, (long long)used,
             (long long)bound);
}

static void test_quantize(void) {
    const int64_t R = 96, K = 160;
    float *x = frand(R * K, 1);
    uint8_t *codes = tu_alloc((size_t)(R * K)), *sc = tu_alloc((size_t)(R * K));
    int64_t s2[2] = {R, K}, g2[2] = {R, (K + 31) / 32}, gc[2] = {(R + 31) / 32, K};
    mxfp8_tensor xt = mxfp8_tensor_make(x, MXFP8_DTYPE_F32, 2, s2), ct = mxfp8_tensor_make(codes, MXFP8_DTYPE_E4M3, 2, s2);
    mxfp8_tensor st = mxfp8_tensor_make(sc, MXFP8_DTYPE_E8M0, 2, g2), st0 = mxfp8_tensor_make(sc, MXFP8_DTYPE_E8M0, 2, gc);
    float *out = tu_alloc((size_t)(R * K) * sizeof(float));
    mxfp8_tensor ot = mxfp8_tensor_make(out, MXFP8_DTYPE_F32, 2, s2);
    for (int axis = 0; axis < 2; axis++) {
        mxfp8_tensor *s = axis ? &st : &st0;
        TU_CHECK(mxfp8_quantize(&xt, axis, NULL, &ct, s) == MXFP8_OK, "quantize: %s", mxfp8_last_error_message());
        ws_mark m = ws_begin();
        mxfp8_quantize(&xt, axis, NULL, &ct, s);
        mxfp8_info info;
        mxfp8_get_info(&info);
        report(axis ? "mxfp8_quantize [96, 160] axis 1" : "mxfp8_quantize [96, 160] axis 0", ws_end(m, "quantize"),
               omp_overhead(info.num_threads));
        m = ws_begin();
        TU_CHECK(mxfp8_dequantize(&ct, s, axis, MXFP8_GROUP_1X32, &ot) == MXFP8_OK, "dequantize: %s",
                 mxfp8_last_error_message());
        report("mxfp8_dequantize", ws_end(m, "dequantize"), omp_overhead(info.num_threads));
    }
    free(x), free(codes), free(sc), free(out);
}

static void test_gemm(void) {
    static const int64_t shapes[][3] = {{64, 96, 128}, {200, 40, 300}, {8, 700, 64}};
    mxfp8_info info;
    mxfp8_get_info(&info);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int spill = 0; spill < 2; spill++) {
            int64_t M = shapes[i][0], N = shapes[i][1], K = shapes[i][2];
            float *a = frand(M * K, 2), *b = frand(N * K, 3), *c = tu_alloc((size_t)(M * N) * sizeof(float));
            mxfp8_operand A, B;
            memset(&A, 0, sizeof A);
            memset(&B, 0, sizeof B);
            A.values = mxfp8_tensor_make(a, MXFP8_DTYPE_F32, 2, (const int64_t[]){M, K});
            B.values = mxfp8_tensor_make(b, MXFP8_DTYPE_F32, 2, (const int64_t[]){N, K});
            mxfp8_tensor C = mxfp8_tensor_make(c, MXFP8_DTYPE_F32, 2, (const int64_t[]){M, N});
            mxfp8_matmul_config cfg;
            mxfp8_matmul_config_init(&cfg);
            cfg.spill_reload = spill;
            TU_CHECK(mxfp8_gemm(&A, &B, &cfg, 0, &C) == MXFP8_OK, "gemm: %s", mxfp8_last_error_message());
            ws_mark m = ws_begin();
            mxfp8_gemm(&A, &B, &cfg, 0, &C);
            char what[96];
            snprintf(what, sizeof what, "mxfp8_gemm M %lld N %lld K %lld spill %d", (long long)M, (long long)N,
                     (long long)K, spill);
            report(what, ws_end(m, what), bound_gemm(M, N, K, spill, info.num_threads));
            free(a), free(b), free(c);
        }
}

static void test_matmul_backward(void) {
    const int64_t M = 96, N = 160, K = 64;
    mxfp8_info info;
    mxfp8_get_info(&info);
    float *dy = frand(M * N, 4), *w = frand(N * K, 5), *x = frand(M * K, 6);
    uint16_t *dx = tu_alloc((size_t)(M * K) * 2), *dw = tu_alloc((size_t)(N * K) * 2);
    mxfp8_matmul_bwd_args args;
    mxfp8_matmul_bwd_args_init(&args);
    args.output_grad = mxfp8_tensor_make(dy, MXFP8_DTYPE_F32, 2, (const int64_t[]){M, N});
    args.weights = mxfp8_tensor_make(w, MXFP8_DTYPE_F32, 2, (const int64_t[]){N, K});
    args.input_activation = mxfp8_tensor_make(x, MXFP8_DTYPE_F32, 2, (const int64_t[]){M, K});
    mxfp8_tensor DX = mxfp8_tensor_make(dx, MXFP8_DTYPE_BF16, 2, (const int64_t[]){M, K});
    mxfp8_tensor DW = mxfp8_tensor_make(dw, MXFP8_DTYPE_BF16, 2, (const int64_t[]){N, K});
    TU_CHECK(mxfp8_matmul_backward(&args, &DX, &DW) == MXFP8_OK, "matmul_backward: %s", mxfp8_last_error_message());
    ws_mark m = ws_begin();
    mxfp8_matmul_backward(&args, &DX, &DW);
    /* dX = dY @ W: GEMM [M, K] contracting N; dW = dY^T @ X: GEMM [N, K] contracting M; + dY [M, N] FP32 */
    int64_t b1 = bound_gemm(M, K, N, 0, info.num_threads), b2 = bound_gemm(N, K, M, 0, info.num_threads);
    report("mxfp8_matmul_backward M 96 N 160 K 64", ws_end(m, "matmul_backward"), (b1 > b2 ? b1 : b2) + 4 * M * N);
    /* pre-quantized dY: its FP32 values go to a [M, N] workspace for the dW phase */
    free(dy), free(w), free(x), free(dx), free(dw);
}

static void test_moe_backward(void) {
    /* T 40, H 64, I 32, E 3, B 8: expert e gets tokens t with t % 3 == e (one per block row), N = ceil(.)... */
    enum { T = 40, H = 64, I = 32, E = 3, B = 8 };
    mxfp8_info info;
    mxfp8_get_info(&info);
    int32_t ids[T * 2];
    float wts[T * 2];
    for (int t = 0; t < T; t++) ids[2 * t] = t % E, ids[2 * t + 1] = (t + 1) % E, wts[2 * t] = 0.6f, wts[2 * t + 1] = 0.4f;
    int64_t N = 0;
    TU_CHECK(mxfp8_moe_num_blocks(T, 2, E, B, &N) == MXFP8_OK, "num_blocks");
    int32_t *tok = tu_alloc((size_t)(N * B) * 4), *b2e = tu_alloc((size_t)N * 4);
    float *a = tu_alloc(T * E * sizeof(float));
    mxfp8_tensor ti = mxfp8_tensor_make(ids, MXFP8_DTYPE_I32, 2, (const int64_t[]){T, 2});
    mxfp8_tensor tw = mxfp8_tensor_make(wts, MXFP8_DTYPE_F32, 2, (const int64_t[]){T, 2});
    mxfp8_tensor tp = mxfp8_tensor_make(tok, MXFP8_DTYPE_I32, 1, (const int64_t[]){N * B});
    mxfp8_tensor be = mxfp8_tensor_make(b2e, MXFP8_DTYPE_I32, 1, (const int64_t[]){N});
    mxfp8_tensor af = mxfp8_tensor_make(a, MXFP8_DTYPE_F32, 2, (const int64_t[]){T * E, 1});
    TU_CHECK(mxfp8_moe_route(&ti, &tw, E, B, -1, &tp, &be, &af) == MXFP8_OK, "route: %s", mxfp8_last_error_message());
    ws_mark m0 = ws_begin();
    mxfp8_moe_route(&ti, &tw, E, B, -1, &tp, &be, &af);
    report("mxfp8_moe_route T 40 K 2 E 3 B 8", ws_end(m0, "route"), 2 * 8 * E + omp_overhead(info.num_threads));

    float *x = frand(T * H, 7), *w1 = frand(E * H * 2 * I, 8), *w2 = frand(E * I * H, 9), *dy = frand(T * H, 10);
    float *dx = tu_alloc(T * H * 4), *da = tu_alloc(T * E * 4), *dw1 = tu_alloc(E * H * 2 * I * 4),
          *dw2 = tu_alloc(E * I * H * 4);
    mxfp8_moe_bwd_args args;
    mxfp8_moe_bwd_args_init(&args);
    args.hidden_states = mxfp8_tensor_make(x, MXFP8_DTYPE_F32, 2, (const int64_t[]){T, H});
    args.expert_affinities_masked = af;
    args.gate_up_proj_weight = mxfp8_tensor_make(w1, MXFP8_DTYPE_F32, 4, (const int64_t[]){E, H, 2, I});
    args.down_proj_weight = mxfp8_tensor_make(w2, MXFP8_DTYPE_F32, 3, (const int64_t[]){E, I, H});
    args.token_position_to_id = tp;
    args.block_to_expert = be;
    args.output_hidden_states_grad = mxfp8_tensor_make(dy, MXFP8_DTYPE_F32, 2, (const int64_t[]){T, H});
    args.block_size = B;
    mxfp8_moe_bwd_grads g;
    memset(&g, 0, sizeof g);
    g.hidden_states_grad = mxfp8_tensor_make(dx, MXFP8_DTYPE_F32, 2, (const int64_t[]){T, H});
    g.expert_affinities_masked_grad = mxfp8_tensor_make(da, MXFP8_DTYPE_F32, 2, (const int64_t[]){T * E, 1});
    g.gate_up_proj_weight_grad = mxfp8_tensor_make(dw1, MXFP8_DTYPE_F32, 4, (const int64_t[]){E, H, 2, I});
    g.down_proj_weight_grad = mxfp8_tensor_make(dw2, MXFP8_DTYPE_F32, 3, (const int64_t[]){E, I, H});
    int64_t KM = H > 2 * I ? H : 2 * I, gb = bound_gemm(B, KM, KM, 0, info.num_threads);

    /* forward: FP32 output accumulator, no FP64 sums, no gradient accumulators */
    float *y = tu_alloc(T * H * 4);
    mxfp8_moe_fwd_args fa;
    mxfp8_moe_fwd_args_init(&fa);
    fa.hidden_states = args.hidden_states;
    fa.expert_affinities_masked = af;
    fa.gate_up_proj_weight = args.gate_up_proj_weight;
    fa.down_proj_weight = args.down_proj_weight;
    fa.token_position_to_id = tp;
    fa.block_to_expert = be;
    fa.block_size = B;
    mxfp8_moe_fwd_outputs fo;
    memset(&fo, 0, sizeof fo);
    fo.output = mxfp8_tensor_make(y, MXFP8_DTYPE_F32, 2, (const int64_t[]){T, H});
    TU_CHECK(mxfp8_moe_forward(&fa, &fo) == MXFP8_OK, "moe_forward: %s", mxfp8_last_error_message());
    ws_mark mf = ws_begin();
    mxfp8_moe_forward(&fa, &fo);
    int64_t bfwd = bound_moe(T, H, I, E, B, N, info.num_threads, gb) - 4 * 3 * E * H * I - 8 * (T * E + 2 * E * I + E * H);
    report("mxfp8_moe_forward T 40 H 64 I 32 E 3 B 8", ws_end(mf, "moe_forward"), bfwd);
    free(y);

    mxfp8i_moe_set_expert_parallel(0); /* the serial walk (the expert-parallel path below) */
    TU_CHECK(mxfp8_moe_backward(&args, &g) == MXFP8_OK, "moe_backward: %s", mxfp8_last_error_message());
    ws_mark m = ws_begin();
    mxfp8_moe_backward(&args, &g);
    report("mxfp8_moe_backward T 40 H 64 I 32 E 3 B 8", ws_end(m, "moe_backward"),
           bound_moe(T, H, I, E, B, N, info.num_threads, gb) - 4 * 3 * H * I + 4 * H * (I + 32) + 8 * I * (H + 32));
    /* the segmented weight gradients (chosen by size for larger experts; forced here) */
    mxfp8i_moe_set_segmented_wgrad(1);
    TU_CHECK(mxfp8_moe_backward(&args, &g) == MXFP8_OK, "moe_backward: %s", mxfp8_last_error_message());
    m = ws_begin();
    mxfp8_moe_backward(&args, &g);
    report("mxfp8_moe_backward, segmented weight grads", ws_end(m, "moe_backward"),
           bound_moe(T, H, I, E, B, N, info.num_threads, gb) - 4 * 3 * H * I + 4 * H * (I + 32) + 8 * I * (H + 32) +
               bound_moe_segmented_extra(T, H, I, B, T, N, info.num_threads));
    mxfp8i_moe_set_segmented_wgrad(-1);
    /* runs of full blocks of one expert (chosen by size for larger blocks; forced here): the per-block buffers and
       the block GEMMs take R rows, R <= max(B', 512) and <= the rows of one expert (<= T here) */
    {
        const int64_t R = T < 512 ? T : 512, gr = bound_gemm(R, KM, KM, 0, info.num_threads);
        const int64_t more = 4 * (R - (B < T ? B : T)) * (8 * H + 13 * I) + gr - gb;
        mxfp8i_moe_set_block_runs(1);
        float *y2 = tu_alloc(T * H * 4);
        fo.output = mxfp8_tensor_make(y2, MXFP8_DTYPE_F32, 2, (const int64_t[]){T, H});
        TU_CHECK(mxfp8_moe_forward(&fa, &fo) == MXFP8_OK, "moe_forward: %s", mxfp8_last_error_message());
        mf = ws_begin();
        mxfp8_moe_forward(&fa, &fo);
        report("mxfp8_moe_forward, runs of blocks", ws_end(mf, "moe_forward"), bfwd + more);
        TU_CHECK(mxfp8_moe_backward(&args, &g) == MXFP8_OK, "moe_backward: %s", mxfp8_last_error_message());
        m = ws_begin();
        mxfp8_moe_backward(&args, &g);
        report("mxfp8_moe_backward, runs of blocks", ws_end(m, "moe_backward"),
               bound_moe(T, H, I, E, B, N, info.num_threads, gb) - 4 * 3 * H * I + 4 * H * (I + 32) +
                   8 * I * (H + 32) + more);
        mxfp8i_moe_set_block_runs(-1);
        free(y2);
    }
    /* the expert-parallel path (more than one thread where runs do not pay; forced here, also on 1 thread) */
    mxfp8i_moe_set_expert_parallel(1);
    TU_CHECK(mxfp8_moe_backward(&args, &g) == MXFP8_OK, "moe_backward: %s", mxfp8_last_error_message());
    m = ws_begin();
    mxfp8_moe_backward(&args, &g);
    report("mxfp8_moe_backward, expert-parallel", ws_end(m, "moe_backward"),
           bound_moe_par(T, H, I, E, B, N, T, N, info.num_threads, bound_gemm(B, KM, KM, 0, 1)));
    mxfp8i_moe_set_expert_parallel(0);

    /* Every allocation of the call, failed in turn (its workspace scope, the routing table, every layer buffer and
       every block GEMM's, all obtained by its reservation before the first block runs): OUT_OF_MEMORY, no output
       written, nothing leaked. Run with skip_grad_initialization and accumulate_hidden_states_grad too (the outputs
       are read then). */
    mxfp8_moe_config mc;
    mxfp8_moe_config_init(&mc);
    args.config = &mc;
    const mxfp8_moe_bwd_grads g32 = g;
    /* modes 2-5: the segmented weight gradients; 4, 5: BF16 weight grads; 6, 7: the expert-parallel path */
    for (int mode = 0; mode < 8; mode++) {
        mxfp8i_moe_set_expert_parallel(mode >= 6);
        mc.skip_grad_initialization = mode & 1;
        mc.accumulate_hidden_states_grad = mode & 1;
        mxfp8i_moe_set_segmented_wgrad(mode >= 2 ? 1 : -1);
        g = g32;
        if (mode >= 4) { /* BF16 views over the first half of the same buffers (mode 4: written straight by the
                            segmented GEMMs, no staging copy) */
            g.gate_up_proj_weight_grad = mxfp8_tensor_make(dw1, MXFP8_DTYPE_BF16, 4, (const int64_t[]){E, H, 2, I});
            g.down_proj_weight_grad = mxfp8_tensor_make(dw2, MXFP8_DTYPE_BF16, 3, (const int64_t[]){E, I, H});
        }
        float *outs[4] = {dx, da, dw1, dw2};
        const int64_t cnt[4] = {T * H, T * E, E * H * 2 * I, E * I * H};
        float *keep[4];
        for (int o = 0; o < 4; o++) {
            keep[o] = tu_alloc((size_t)cnt[o] * 4);
            for (int64_t i = 0; i < cnt[o]; i++) outs[o][i] = keep[o][i] = (float)(i % 7) - 3.0f;
        }
        int64_t failed = 0, k;
        for (k = 1; k < 100000; k++) {
            ws_mark mk = ws_begin();
            atomic_store(&ws_fail_at, k);
            mxfp8_status st = mxfp8_moe_backward(&args, &g);
            const int hit = atomic_load(&ws_fail_at) <= 0;
            atomic_store(&ws_fail_at, 0);
            ws_end(mk, "moe_backward with a failed allocation");
            if (!hit) { /* fewer than k allocations: the call ran to the end */
                TU_CHECK(st == MXFP8_OK, "moe_backward without failures: %s", mxfp8_last_error_message());
                break;
            }
            failed++;
            TU_CHECK(st == MXFP8_ERR_OUT_OF_MEMORY, "moe_backward, allocation %lld failed: status %d", (long long)k,
                     (int)st);
            for (int o = 0; o < 4; o++)
                TU_CHECK(memcmp(outs[o], keep[o], (size_t)cnt[o] * 4) == 0,
                         "moe_backward, allocation %lld failed (mode %d): output %d was written", (long long)k, mode,
                         o);
        }
        printf("  mxfp8_moe_backward mode %d: each of %lld allocations failed in turn, outputs untouched\n", mode,
               (long long)failed);
        /* (the expert-parallel path takes its threads' arenas, GEMM workspaces included, as one allocation) */
        TU_CHECK(failed > (mode >= 6 ? 12 : 30),
                 "moe_backward: only %lld allocations seen (expected the block GEMMs' workspaces too)", (long long)failed);
        for (int o = 0; o < 4; o++) free(keep[o]);
    }
    mxfp8i_moe_set_segmented_wgrad(-1);
    mxfp8i_moe_set_expert_parallel(-1);
    g = g32;
    free(tok), free(b2e), free(a), free(x), free(w1), free(w2), free(dy), free(dx), free(da), free(dw1), free(dw2);
}

/* ---- a reusable workspace: repeated calls allocate nothing, results are the same bits ---- */
static int64_t calls_now(void) { return (int64_t)atomic_load(&ws_calls); }

static void test_reuse(void) {
    enum { M = 96, N = 160, K = 70, T = 40, H = 64, I = 32, E = 3, B = 8 };
    mxfp8_workspace *ws = NULL;
    TU_CHECK(mxfp8_workspace_create(&ws) == MXFP8_OK && ws, "workspace_create");
    TU_CHECK(mxfp8_workspace_bytes(ws) == 0 && mxfp8_workspace_bytes(NULL) == 0, "a new workspace holds nothing");
    /* matmul backward */
    float *dy = frand(M * N, 21), *w = frand(N * K, 22), *x = frand(M * K, 23);
    uint16_t *dx0 = tu_alloc(M * K * 2), *dw0 = tu_alloc(N * K * 2), *dx = tu_alloc(M * K * 2), *dw = tu_alloc(N * K * 2);
    mxfp8_matmul_bwd_args a;
    mxfp8_matmul_bwd_args_init(&a);
    a.output_grad = mxfp8_tensor_make(dy, MXFP8_DTYPE_F32, 2, (const int64_t[]){M, N});
    a.weights = mxfp8_tensor_make(w, MXFP8_DTYPE_F32, 2, (const int64_t[]){N, K});
    a.input_activation = mxfp8_tensor_make(x, MXFP8_DTYPE_F32, 2, (const int64_t[]){M, K});
    mxfp8_tensor tdx0 = mxfp8_tensor_make(dx0, MXFP8_DTYPE_BF16, 2, (const int64_t[]){M, K});
    mxfp8_tensor tdw0 = mxfp8_tensor_make(dw0, MXFP8_DTYPE_BF16, 2, (const int64_t[]){N, K});
    mxfp8_tensor tdx = mxfp8_tensor_make(dx, MXFP8_DTYPE_BF16, 2, (const int64_t[]){M, K});
    mxfp8_tensor tdw = mxfp8_tensor_make(dw, MXFP8_DTYPE_BF16, 2, (const int64_t[]){N, K});
    /* MoE forward and backward (routing as test_moe_backward builds it) */
    int32_t ids[T * 2];
    float wts[T * 2];
    for (int t = 0; t < T; t++) ids[2 * t] = t % E, ids[2 * t + 1] = (t + 1) % E, wts[2 * t] = 0.6f, wts[2 * t + 1] = 0.4f;
    int64_t Nb = 0;
    mxfp8_moe_num_blocks(T, 2, E, B, &Nb);
    int32_t *tok = tu_alloc((size_t)(Nb * B) * 4), *b2e = tu_alloc((size_t)Nb * 4);
    float *af = tu_alloc(T * E * 4);
    mxfp8_tensor ti = mxfp8_tensor_make(ids, MXFP8_DTYPE_I32, 2, (const int64_t[]){T, 2});
    mxfp8_tensor tw = mxfp8_tensor_make(wts, MXFP8_DTYPE_F32, 2, (const int64_t[]){T, 2});
    mxfp8_tensor tp = mxfp8_tensor_make(tok, MXFP8_DTYPE_I32, 1, (const int64_t[]){Nb * B});
    mxfp8_tensor be = mxfp8_tensor_make(b2e, MXFP8_DTYPE_I32, 1, (const int64_t[]){Nb});
    mxfp8_tensor ta = mxfp8_tensor_make(af, MXFP8_DTYPE_F32, 2, (const int64_t[]){T * E, 1});
    TU_CHECK(mxfp8_moe_route(&ti, &tw, E, B, -1, &tp, &be, &ta) == MXFP8_OK, "route");
    float *mx = frand(T * H, 24), *w1 = frand(E * H * 2 * I, 25), *w2 = frand(E * I * H, 26), *mdy = frand(T * H, 27);
    mxfp8_moe_bwd_args ba;
    mxfp8_moe_bwd_args_init(&ba);
    ba.hidden_states = mxfp8_tensor_make(mx, MXFP8_DTYPE_F32, 2, (const int64_t[]){T, H});
    ba.expert_affinities_masked = ta;
    ba.gate_up_proj_weight = mxfp8_tensor_make(w1, MXFP8_DTYPE_F32, 4, (const int64_t[]){E, H, 2, I});
    ba.down_proj_weight = mxfp8_tensor_make(w2, MXFP8_DTYPE_F32, 3, (const int64_t[]){E, I, H});
    ba.token_position_to_id = tp;
    ba.block_to_expert = be;
    ba.output_hidden_states_grad = mxfp8_tensor_make(mdy, MXFP8_DTYPE_F32, 2, (const int64_t[]){T, H});
    ba.block_size = B;
    enum { NG = T * H + T * E + E * H * 2 * I + E * I * H };
    float *g0 = tu_alloc(NG * 4), *g1 = tu_alloc(NG * 4);
    mxfp8_moe_bwd_grads bg[2];
    float *gb[2] = {g0, g1};
    for (int v = 0; v < 2; v++) {
        memset(&bg[v], 0, sizeof bg[v]);
        bg[v].hidden_states_grad = mxfp8_tensor_make(gb[v], MXFP8_DTYPE_F32, 2, (const int64_t[]){T, H});
        bg[v].expert_affinities_masked_grad =
            mxfp8_tensor_make(gb[v] + T * H, MXFP8_DTYPE_F32, 2, (const int64_t[]){T * E, 1});
        bg[v].gate_up_proj_weight_grad =
            mxfp8_tensor_make(gb[v] + T * H + T * E, MXFP8_DTYPE_F32, 4, (const int64_t[]){E, H, 2, I});
        bg[v].down_proj_weight_grad =
            mxfp8_tensor_make(gb[v] + T * H + T * E + E * H * 2 * I, MXFP8_DTYPE_F32, 3, (const int64_t[]){E, I, H});
    }
    float *y0 = tu_alloc(T * H * 4), *y1 = tu_alloc(T * H * 4);
    mxfp8_moe_fwd_args fa;
    mxfp8_moe_fwd_args_init(&fa);
    fa.hidden_states = ba.hidden_states;
    fa.expert_affinities_masked = ta;
    fa.gate_up_proj_weight = ba.gate_up_proj_weight;
    fa.down_proj_weight = ba.down_proj_weight;
    fa.token_position_to_id = tp;
    fa.block_to_expert = be;
    fa.block_size = B;
    mxfp8_moe_fwd_outputs fo0, fo1;
    memset(&fo0, 0, sizeof fo0);
    memset(&fo1, 0, sizeof fo1);
    fo0.output = mxfp8_tensor_make(y0, MXFP8_DTYPE_F32, 2, (const int64_t[]){T, H});
    fo1.output = mxfp8_tensor_make(y1, MXFP8_DTYPE_F32, 2, (const int64_t[]){T, H});
    for (int nt = 1; nt <= 2; nt++) {
        mxfp8_set_num_threads(nt);
        /* without a workspace: the reference bits */
        a.workspace = NULL, ba.workspace = NULL, fa.workspace = NULL;
        TU_CHECK(mxfp8_matmul_backward(&a, &tdx0, &tdw0) == MXFP8_OK, "matmul_backward");
        TU_CHECK(mxfp8_moe_backward(&ba, &bg[0]) == MXFP8_OK, "moe_backward: %s", mxfp8_last_error_message());
        TU_CHECK(mxfp8_moe_forward(&fa, &fo0) == MXFP8_OK, "moe_forward");
        /* with one: a first call of each grows it, the repeated calls allocate nothing */
        a.workspace = ws, ba.workspace = ws, fa.workspace = ws;
        mxfp8_matmul_backward(&a, &tdx, &tdw);
        mxfp8_moe_backward(&ba, &bg[1]);
        mxfp8_moe_forward(&fa, &fo1);
        size_t held = mxfp8_workspace_bytes(ws);
        for (int rep = 0; rep < 3; rep++) {
            int64_t c0 = calls_now();
            TU_CHECK(mxfp8_matmul_backward(&a, &tdx, &tdw) == MXFP8_OK, "matmul_backward with a workspace");
            TU_CHECK(mxfp8_moe_backward(&ba, &bg[1]) == MXFP8_OK, "moe_backward with a workspace");
            TU_CHECK(mxfp8_moe_forward(&fa, &fo1) == MXFP8_OK, "moe_forward with a workspace");
            int64_t c1 = calls_now();
            TU_CHECK(c1 == c0, "%d thread(s), repeat %d: %lld allocations with a warm workspace", nt, rep,
                     (long long)(c1 - c0));
        }
        TU_CHECK(mxfp8_workspace_bytes(ws) == held && held > 0, "the workspace grew on repeated calls");
        TU_CHECK(!memcmp(dx, dx0, M * K * 2) && !memcmp(dw, dw0, N * K * 2), "%d thread(s): matmul backward differs "
                 "with a workspace", nt);
        TU_CHECK(!memcmp(g0, g1, NG * 4), "%d thread(s): moe backward differs with a workspace", nt);
        TU_CHECK(!memcmp(y0, y1, T * H * 4), "%d thread(s): moe forward differs with a workspace", nt);
        printf("  workspace reuse, %d thread(s): %zu bytes held, repeated calls allocate nothing, same bits\n", nt,
               held);
    }
    /* a training loop's routing changes from call to call (the same shapes): every path of the MoE sizes what it
       keeps for any routing of mxfp8_moe_route's layout, so a skewed routing after an even one allocates nothing
       either. Paths: 0 expert-parallel (2 threads), 1 serial, blocks one by one, 2 serial with runs of blocks and
       the segmented weight gradients, each on a workspace of its own */
    static const char *const path_name[3] = {"expert-parallel", "serial", "serial, runs and segmented"};
    for (int path = 0; path < 3; path++) {
        mxfp8_set_num_threads(path == 0 ? 2 : 1);
        mxfp8i_moe_set_expert_parallel(path == 0);
        mxfp8i_moe_set_block_runs(path == 2 ? 1 : 0);
        mxfp8i_moe_set_segmented_wgrad(path == 2 ? 1 : 0);
        mxfp8_workspace *wr = NULL;
        TU_CHECK(mxfp8_workspace_create(&wr) == MXFP8_OK, "workspace_create");
        ba.workspace = wr, fa.workspace = wr;
        for (int skew = 0; skew < 2; skew++) {
            for (int t = 0; t < T; t++) /* skew: all but every fifth token on experts 0 and 1 */
                ids[2 * t] = skew && t % 5 ? 0 : t % E, ids[2 * t + 1] = skew && t % 5 ? 1 : (t + 1) % E;
            TU_CHECK(mxfp8_moe_route(&ti, &tw, E, B, -1, &tp, &be, &ta) == MXFP8_OK, "route");
            const int64_t c0 = calls_now();
            TU_CHECK(mxfp8_moe_forward(&fa, &fo1) == MXFP8_OK, "moe_forward: %s", mxfp8_last_error_message());
            TU_CHECK(mxfp8_moe_backward(&ba, &bg[1]) == MXFP8_OK, "moe_backward: %s", mxfp8_last_error_message());
            const int64_t c1 = calls_now();
            TU_CHECK(skew == 0 || c1 == c0, "MoE, %s path: %lld allocations after the routing changed",
                     path_name[path], (long long)(c1 - c0));
        }
        mxfp8_workspace_destroy(wr);
        printf("  workspace reuse, MoE %s: another routing of the same shapes allocates nothing\n", path_name[path]);
    }
    mxfp8i_moe_set_expert_parallel(-1);
    mxfp8i_moe_set_block_runs(-1);
    mxfp8i_moe_set_segmented_wgrad(-1);
    mxfp8_set_num_threads(0);
    mxfp8_workspace_destroy(ws);
    mxfp8_workspace_destroy(NULL);
    free(dy), free(w), free(x), free(dx0), free(dw0), free(dx), free(dw), free(tok), free(b2e), free(af);
    free(mx), free(w1), free(w2), free(mdy), free(g0), free(g1), free(y0), free(y1);
}

/* The router's linear layer and its gradients: the peak heap use without a workspace against the documented bound,
 * and with one: repeated calls allocate nothing and give the same bits. H > 512 and T > 512 take several
 * contraction chunks; E = 17 is not a multiple of the 8-row panels. */
static void test_router(void) {
    enum { T = 600, H = 530, E = 17 };
    float *x = frand(T * H, 41), *w = frand(E * H, 42), *b = frand(E, 43), *dl = frand(T * E, 44);
    float *lg[2] = {tu_alloc(T * E * 4), tu_alloc(T * E * 4)}, *dx[2] = {tu_alloc(T * H * 4), tu_alloc(T * H * 4)};
    float *dw[2] = {tu_alloc(E * H * 4), tu_alloc(E * H * 4)};
    mxfp8_tensor tx = mxfp8_tensor_make(x, MXFP8_DTYPE_F32, 2, (const int64_t[]){T, H});
    mxfp8_tensor tw = mxfp8_tensor_make(w, MXFP8_DTYPE_F32, 2, (const int64_t[]){E, H});
    mxfp8_tensor tb = mxfp8_tensor_make(b, MXFP8_DTYPE_F32, 1, (const int64_t[]){E});
    mxfp8_tensor td = mxfp8_tensor_make(dl, MXFP8_DTYPE_F32, 2, (const int64_t[]){T, E});
    mxfp8_tensor tl[2], tdx[2], tdw[2];
    for (int v = 0; v < 2; v++) {
        tl[v] = mxfp8_tensor_make(lg[v], MXFP8_DTYPE_F32, 2, (const int64_t[]){T, E});
        tdx[v] = mxfp8_tensor_make(dx[v], MXFP8_DTYPE_F32, 2, (const int64_t[]){T, H});
        tdw[v] = mxfp8_tensor_make(dw[v], MXFP8_DTYPE_F32, 2, (const int64_t[]){E, H});
    }
    const int64_t Ep = rup(E, 8);
    mxfp8_workspace *ws = NULL;
    TU_CHECK(mxfp8_workspace_create(&ws) == MXFP8_OK && ws, "workspace_create");
    for (int nt = 1; nt <= 2; nt++) {
        mxfp8_set_num_threads(nt);
        mxfp8_info info;
        mxfp8_get_info(&info);
        const int64_t P = info.num_threads, extra = 2048 + omp_overhead(info.num_threads);
        const int64_t bf = 4 * Ep * (H + 1) + P * 4 * (32 * (H < 512 ? H : 512) + 32 * Ep + 16) + extra;
        const int64_t bi = 4 * (H + 31) * E + P * 4 * (8 * E + 16 + 8 * H) + extra;
        const int64_t bw = 4 * Ep * (T + 1) + P * 4 * (32 * (T < 512 ? T : 512) + 32 * Ep + 48) + extra;
        TU_CHECK(mxfp8_router_linear(&tx, &tw, &tb, &tl[0], NULL) == MXFP8_OK, "router_linear: %s",
                 mxfp8_last_error_message());
        ws_mark m = ws_begin();
        mxfp8_router_linear(&tx, &tw, &tb, &tl[0], NULL);
        report("mxfp8_router_linear [600, 530] x [17, 530]", ws_end(m, "router_linear"), bf);
        m = ws_begin();
        TU_CHECK(mxfp8_router_linear_input_grad(&td, &tw, 0, &tdx[0], NULL) == MXFP8_OK, "router input grad: %s",
                 mxfp8_last_error_message());
        report("mxfp8_router_linear_input_grad", ws_end(m, "router_linear_input_grad"), bi);
        m = ws_begin();
        TU_CHECK(mxfp8_router_linear_weight_grad(&td, &tx, 0, &tdw[0], NULL) == MXFP8_OK, "router weight grad: %s",
                 mxfp8_last_error_message());
        report("mxfp8_router_linear_weight_grad", ws_end(m, "router_linear_weight_grad"), bw);
        /* with a workspace: the first calls grow it, the repeated ones allocate nothing */
        mxfp8_router_linear(&tx, &tw, &tb, &tl[1], ws);
        mxfp8_router_linear_input_grad(&td, &tw, 0, &tdx[1], ws);
        mxfp8_router_linear_weight_grad(&td, &tx, 0, &tdw[1], ws);
        const size_t held = mxfp8_workspace_bytes(ws);
        for (int rep = 0; rep < 2; rep++) {
            memset(lg[1], 0, T * E * 4), memset(dx[1], 0, T * H * 4), memset(dw[1], 0, E * H * 4);
            const int64_t c0 = calls_now();
            TU_CHECK(mxfp8_router_linear(&tx, &tw, &tb, &tl[1], ws) == MXFP8_OK, "router_linear with a workspace");
            TU_CHECK(mxfp8_router_linear_input_grad(&td, &tw, 0, &tdx[1], ws) == MXFP8_OK, "input grad, workspace");
            TU_CHECK(mxfp8_router_linear_weight_grad(&td, &tx, 0, &tdw[1], ws) == MXFP8_OK, "weight grad, workspace");
            const int64_t c1 = calls_now();
            TU_CHECK(c1 == c0, "router, %d thread(s), repeat %d: %lld allocations with a warm workspace", nt, rep,
                     (long long)(c1 - c0));
            TU_CHECK(!memcmp(lg[0], lg[1], T * E * 4) && !memcmp(dx[0], dx[1], T * H * 4) &&
                         !memcmp(dw[0], dw[1], E * H * 4),
                     "router, %d thread(s): the bits differ with a workspace", nt);
        }
        TU_CHECK(mxfp8_workspace_bytes(ws) == held && held > 0, "router: the workspace grew on repeated calls");
        /* each allocation of each call (without a workspace) failed in turn: OUT_OF_MEMORY, output untouched */
        for (int c = 0; c < 3; c++) {
            float *out = c == 0 ? lg[1] : c == 1 ? dx[1] : dw[1];
            const int64_t n = c == 0 ? T * E : c == 1 ? T * H : E * H;
            for (int64_t i = 0; i < n; i++) out[i] = (float)(i % 5) - 2.0f;
            int64_t failed = 0;
            for (int64_t k = 1; k < 1000; k++) {
                ws_mark mk = ws_begin();
                atomic_store(&ws_fail_at, k);
                mxfp8_status st = c == 0   ? mxfp8_router_linear(&tx, &tw, &tb, &tl[1], NULL)
                                  : c == 1 ? mxfp8_router_linear_input_grad(&td, &tw, 0, &tdx[1], NULL)
                                           : mxfp8_router_linear_weight_grad(&td, &tx, 0, &tdw[1], NULL);
                const int hit = atomic_load(&ws_fail_at) <= 0;
                atomic_store(&ws_fail_at, 0);
                ws_end(mk, "router call with a failed allocation");
                if (!hit) {
                    TU_CHECK(st == MXFP8_OK, "router call %d without failures: %s", c, mxfp8_last_error_message());
                    break;
                }
                failed++;
                TU_CHECK(st == MXFP8_ERR_OUT_OF_MEMORY, "router call %d, allocation %lld failed: status %d", c,
                         (long long)k, (int)st);
                int same = 1;
                for (int64_t i = 0; i < n && same; i++) same = out[i] == (float)(i % 5) - 2.0f;
                TU_CHECK(same, "router call %d, allocation %lld failed: the output was written", c, (long long)k);
            }
            TU_CHECK(failed >= 3, "router call %d: only %lld allocations seen", c, (long long)failed);
        }
    }
    printf("  router linear and its gradients: within the bounds; with a workspace repeated calls allocate nothing, "
           "same bits; each allocation failed in turn leaves the output untouched\n");
    mxfp8_set_num_threads(0);
    mxfp8_workspace_destroy(ws);
    free(x), free(w), free(b), free(dl);
    for (int v = 0; v < 2; v++) free(lg[v]), free(dx[v]), free(dw[v]);
}

/* The _validate entries' workspace size: a call given a workspace reserved to exactly that size allocates nothing
 * and computes the same bits as with a private arena, and the size is at most 1.25x the call's peak heap use. */
typedef struct sized_call {
    const char *what;
    mxfp8_status (*validate)(void *ctx, size_t *bytes);
    mxfp8_status (*call)(void *ctx, mxfp8_workspace *ws); /* ws NULL: a private arena */
    void *ctx;
    void *out; /* the call's output bytes (compared between the two runs) */
    size_t out_bytes;
} sized_call;
static void check_sized(const sized_call *c) {
    size_t bytes = 1;
    TU_CHECK(c->validate(c->ctx, &bytes) == MXFP8_OK, "%s: _validate: %s", c->what, mxfp8_last_error_message());
    TU_CHECK(c->validate(c->ctx, NULL) == MXFP8_OK, "%s: _validate without a size", c->what);
    TU_CHECK(c->call(c->ctx, NULL) == MXFP8_OK, "%s: %s", c->what, mxfp8_last_error_message()); /* warm-up */
    ws_mark m = ws_begin();
    TU_CHECK(c->call(c->ctx, NULL) == MXFP8_OK, "%s: %s", c->what, mxfp8_last_error_message());
    int64_t peak = ws_end(m, c->what);
    unsigned char *ref = tu_alloc(c->out_bytes);
    memcpy(ref, c->out, c->out_bytes);
    memset(c->out, 0x5A, c->out_bytes);
    mxfp8_workspace *ws = NULL;
    TU_CHECK(mxfp8_workspace_create(&ws) == MXFP8_OK, "workspace_create");
    TU_CHECK(mxfp8_workspace_reserve(ws, bytes) == MXFP8_OK, "%s: reserve %zu: %s", c->what, bytes,
             mxfp8_last_error_message());
    TU_CHECK(mxfp8_workspace_bytes(ws) == ((bytes + 63) & ~(size_t)63), "%s: a reserved workspace holds %zu bytes",
             c->what, mxfp8_workspace_bytes(ws));
    int64_t n0 = calls_now();
    TU_CHECK(c->call(c->ctx, ws) == MXFP8_OK, "%s (reserved): %s", c->what, mxfp8_last_error_message());
    int64_t n1 = calls_now();
    TU_CHECK(n1 == n0, "%s: the call allocated %lld times with a workspace reserved to its size %zu", c->what,
             (long long)(n1 - n0), bytes);
    TU_CHECK(memcmp(ref, c->out, c->out_bytes) == 0, "%s: the output differs with a reserved workspace", c->what);
    TU_CHECK(c->call(c->ctx, ws) == MXFP8_OK && calls_now() == n1, "%s: a second call allocated", c->what);
    /* one byte short: the call still succeeds (the heap makes up the rest) */
    TU_CHECK(bytes < 64 || mxfp8_workspace_reserve(ws, bytes - 64) == MXFP8_OK, "reserve smaller");
    TU_CHECK(bytes < 64 || c->call(c->ctx, ws) == MXFP8_OK, "%s: a short reservation", c->what);
    TU_CHECK(bytes < 64 || calls_now() > n1, "%s: a reservation 64 bytes short allocated nothing: the size is not "
             "tight", c->what);
    TU_CHECK(memcmp(ref, c->out, c->out_bytes) == 0, "%s: the output differs with a short reservation", c->what);
    mxfp8_workspace_destroy(ws);
    printf("  %-44s size %10zu bytes, peak %10lld\n", c->what, bytes, (long long)peak);
    TU_CHECK(bytes > 0 && (double)bytes <= 1.25 * (double)peak, "%s: size %zu vs the call's peak %lld bytes", c->what,
             bytes, (long long)peak);
    free(ref);
}

typedef struct gemm_ctx {
    mxfp8_operand A, B;
    mxfp8_tensor C;
    mxfp8_matmul_config cfg;
} gemm_ctx;
static mxfp8_status gemm_validate_c(void *p, size_t *bytes) {
    gemm_ctx *g = p;
    return mxfp8_gemm_validate(&g->A, &g->B, &g->cfg, 0, &g->C, bytes);
}
static mxfp8_status gemm_call_c(void *p, mxfp8_workspace *ws) {
    gemm_ctx *g = p;
    g->cfg.workspace = ws;
    mxfp8_status st = mxfp8_gemm(&g->A, &g->B, &g->cfg, 0, &g->C);
    g->cfg.workspace = NULL;
    return st;
}
static mxfp8_status matmul_validate_c(void *p, size_t *bytes) {
    gemm_ctx *g = p;
    return mxfp8_matmul_validate(&g->A, &g->B, &g->cfg, &g->C, bytes);
}
static mxfp8_status matmul_call_c(void *p, mxfp8_workspace *ws) {
    gemm_ctx *g = p;
    g->cfg.workspace = ws;
    mxfp8_status st = mxfp8_matmul(&g->A, &g->B, &g->cfg, &g->C);
    g->cfg.workspace = NULL;
    return st;
}
typedef struct bwd_ctx {
    mxfp8_matmul_bwd_args args;
    mxfp8_tensor DX, DW;
} bwd_ctx;
static mxfp8_status bwd_validate_c(void *p, size_t *bytes) {
    bwd_ctx *b = p;
    return mxfp8_matmul_backward_validate(&b->args, &b->DX, &b->DW, bytes);
}
static mxfp8_status bwd_call_c(void *p, mxfp8_workspace *ws) {
    bwd_ctx *b = p;
    b->args.workspace = ws;
    mxfp8_status st = mxfp8_matmul_backward(&b->args, &b->DX, &b->DW);
    b->args.workspace = NULL;
    return st;
}

static void test_reserve(void) {
    static const int64_t shapes[][3] = {{64, 96, 128}, {200, 40, 300}, {8, 700, 64}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int variant = 0; variant < 3; variant++) { /* 0 plain, 1 spill_reload, 2 statistics of both operands */
            int64_t M = shapes[i][0], N = shapes[i][1], K = shapes[i][2];
            float *a = frand(M * K, 31), *b = frand(N * K, 32), *c = tu_alloc((size_t)(M * N) * sizeof(float));
            gemm_ctx g;
            memset(&g, 0, sizeof g);
            mxfp8_quant_stats sa, sb;
            g.A.values = mxfp8_tensor_make(a, MXFP8_DTYPE_F32, 2, (const int64_t[]){M, K});
            g.B.values = mxfp8_tensor_make(b, MXFP8_DTYPE_F32, 2, (const int64_t[]){N, K});
            if (variant == 2) g.A.stats = &sa, g.B.stats = &sb;
            mxfp8_matmul_config_init(&g.cfg);
            g.cfg.spill_reload = variant == 1;
            char what[96];
            snprintf(what, sizeof what, "gemm %lld x %lld x %lld %s", (long long)M, (long long)N, (long long)K,
                     variant == 0 ? "plain" : variant == 1 ? "spill" : "stats");
            if (i == 1 && variant == 0) { /* mxfp8_matmul: BF16 output */
                g.C = mxfp8_tensor_make(c, MXFP8_DTYPE_BF16, 2, (const int64_t[]){M, N});
                sized_call mc = {"matmul 200 x 40 x 300 bf16", matmul_validate_c, matmul_call_c, &g, c,
                                 (size_t)(M * N) * 2};
                check_sized(&mc);
            }
            g.C = mxfp8_tensor_make(c, MXFP8_DTYPE_F32, 2, (const int64_t[]){M, N});
            sized_call sc = {what, gemm_validate_c, gemm_call_c, &g, c, (size_t)(M * N) * sizeof(float)};
            check_sized(&sc);
            free(a), free(b), free(c);
        }
    const int64_t M = 96, N = 160, K = 64;
    float *dy = frand(M * N, 34), *w = frand(N * K, 35), *x = frand(M * K, 36);
    uint8_t *dyq = tu_alloc((size_t)(M * N)), *dys = tu_alloc((size_t)(M * N));
    uint16_t *g = tu_alloc((size_t)(M * K + N * K) * 2);
    for (int variant = 0; variant < 3; variant++) { /* 0 plain, 1 statistics, 2 pre-quantized dY */
        bwd_ctx b;
        memset(&b, 0, sizeof b);
        mxfp8_quant_stats st[4];
        mxfp8_matmul_bwd_args_init(&b.args);
        b.args.output_grad = mxfp8_tensor_make(dy, MXFP8_DTYPE_F32, 2, (const int64_t[]){M, N});
        b.args.weights = mxfp8_tensor_make(w, MXFP8_DTYPE_F32, 2, (const int64_t[]){N, K});
        b.args.input_activation = mxfp8_tensor_make(x, MXFP8_DTYPE_F32, 2, (const int64_t[]){M, K});
        if (variant == 1) b.args.stats = st;
        if (variant == 2) { /* dY as E5M2 codes quantized along N, with their scales */
            mxfp8_tensor q = mxfp8_tensor_make(dyq, MXFP8_DTYPE_E5M2, 2, (const int64_t[]){M, N});
            mxfp8_tensor s = mxfp8_tensor_make(dys, MXFP8_DTYPE_E8M0, 2, (const int64_t[]){M, (N + 31) / 32});
            mxfp8_quant_params qp = mxfp8_quant_params_default();
            qp.fmt = MXFP8_FMT_E5M2;
            TU_CHECK(mxfp8_quantize(&b.args.output_grad, 1, &qp, &q, &s) == MXFP8_OK, "quantize dY: %s",
                     mxfp8_last_error_message());
            b.args.output_grad = q;
            b.args.output_grad_scales = s;
        }
        b.DX = mxfp8_tensor_make(g, MXFP8_DTYPE_BF16, 2, (const int64_t[]){M, K});
        b.DW = mxfp8_tensor_make(g + M * K, MXFP8_DTYPE_BF16, 2, (const int64_t[]){N, K});
        sized_call c = {variant == 0 ? "matmul_backward plain" : variant == 1 ? "matmul_backward stats"
                                                                                : "matmul_backward pre-quantized dY",
                        bwd_validate_c, bwd_call_c, &b, g, (size_t)(M * K + N * K) * 2};
        check_sized(&c);
    }
    free(dy), free(w), free(x), free(dyq), free(dys), free(g);
}

/* The MoE layer: forward and backward through their _validate entries, in configurations that change what the call
 * reserves (dtypes, biases, checkpoints given or recomputed, pre-quantized weights and their FP32 copies, the
 * affinity options, statistics). Every output of a call lies in one buffer, compared between the runs. */
typedef struct moe_ctx {
    mxfp8_moe_fwd_args fa;
    mxfp8_moe_fwd_outputs fo;
    mxfp8_moe_bwd_args ba;
    mxfp8_moe_bwd_grads bg;
} moe_ctx;
static mxfp8_status moe_fwd_validate_c(void *p, size_t *bytes) {
    moe_ctx *m = p;
    return mxfp8_moe_forward_validate(&m->fa, &m->fo, bytes);
}
static mxfp8_status moe_fwd_call_c(void *p, mxfp8_workspace *ws) {
    moe_ctx *m = p;
    m->fa.workspace = ws;
    mxfp8_status st = mxfp8_moe_forward(&m->fa, &m->fo);
    m->fa.workspace = NULL;
    return st;
}
static mxfp8_status moe_bwd_validate_c(void *p, size_t *bytes) {
    moe_ctx *m = p;
    return mxfp8_moe_backward_validate(&m->ba, &m->bg, bytes);
}
static mxfp8_status moe_bwd_call_c(void *p, mxfp8_workspace *ws) {
    moe_ctx *m = p;
    m->ba.workspace = ws;
    mxfp8_status st = mxfp8_moe_backward(&m->ba, &m->bg);
    m->ba.workspace = NULL;
    return st;
}
/* n values of f as dtype dt into a fresh buffer */
static void *as_dtype(const float *f, int64_t n, mxfp8_dtype dt) {
    if (dt == MXFP8_DTYPE_F32) {
        float *o = tu_alloc((size_t)n * 4);
        memcpy(o, f, (size_t)n * 4);
        return o;
    }
    uint16_t *o = tu_alloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) o[i] = mxfp8_fp32_to_bf16(f[i]);
    return o;
}
static void test_reserve_moe(void) {
    enum { T = 40, H = 64, I = 32, E = 3, B = 8, K = 2 };
    int32_t ids[T * K];
    float wts[T * K];
    for (int t = 0; t < T; t++) ids[2 * t] = t % E, ids[2 * t + 1] = (t + 1) % E, wts[2 * t] = 0.6f, wts[2 * t + 1] = 0.4f;
    int64_t N = 0;
    TU_CHECK(mxfp8_moe_num_blocks(T, K, E, B, &N) == MXFP8_OK, "num_blocks");
    int32_t *tok = tu_alloc((size_t)(N * B) * 4), *b2e = tu_alloc((size_t)N * 4);
    float *a = tu_alloc(T * E * sizeof(float));
    mxfp8_tensor ti = mxfp8_tensor_make(ids, MXFP8_DTYPE_I32, 2, (const int64_t[]){T, K});
    mxfp8_tensor tw = mxfp8_tensor_make(wts, MXFP8_DTYPE_F32, 2, (const int64_t[]){T, K});
    mxfp8_tensor tp = mxfp8_tensor_make(tok, MXFP8_DTYPE_I32, 1, (const int64_t[]){N * B});
    mxfp8_tensor be = mxfp8_tensor_make(b2e, MXFP8_DTYPE_I32, 1, (const int64_t[]){N});
    mxfp8_tensor af = mxfp8_tensor_make(a, MXFP8_DTYPE_F32, 2, (const int64_t[]){T * E, 1});
    size_t rb = 1;
    TU_CHECK(mxfp8_moe_route_validate(&ti, &tw, E, B, -1, &tp, &be, &af, &rb) == MXFP8_OK && rb == 0,
             "route_validate: %s (%zu bytes)", mxfp8_last_error_message(), rb);
    TU_CHECK(mxfp8_moe_route(&ti, &tw, E, B, -1, &tp, &be, &af) == MXFP8_OK, "route: %s", mxfp8_last_error_message());
    const int64_t nX = T * H, nW1 = E * H * 2 * I, nW2 = E * I * H, nB1 = E * 2 * I, nB2 = E * H;
    float *x = frand(nX, 41), *w1 = frand(nW1, 42), *w2 = frand(nW2, 43), *dy = frand(nX, 44), *b1 = frand(nB1, 45),
          *b2 = frand(nB2, 46);
    /* pre-quantized weights: forward axes (W1 along H, W2 along I) and backward axes (W1 along 2I, W2 along H) */
    const int64_t GH = (H + 31) / 32, GI = (I + 31) / 32, G2I = (2 * I + 31) / 32;
    uint8_t *qf1 = tu_alloc((size_t)nW1), *sf1 = tu_alloc((size_t)(E * GH * 2 * I)), *qf2 = tu_alloc((size_t)nW2),
            *sf2 = tu_alloc((size_t)(E * GI * H)), *qb1 = tu_alloc((size_t)nW1), *sb1 = tu_alloc((size_t)(E * H * G2I)),
            *qb2 = tu_alloc((size_t)nW2), *sb2 = tu_alloc((size_t)(E * I * GH));
    mxfp8_tensor W1 = mxfp8_tensor_make(w1, MXFP8_DTYPE_F32, 4, (const int64_t[]){E, H, 2, I});
    mxfp8_tensor W2 = mxfp8_tensor_make(w2, MXFP8_DTYPE_F32, 3, (const int64_t[]){E, I, H});
    mxfp8_tensor W1f = mxfp8_tensor_make(w1, MXFP8_DTYPE_F32, 3, (const int64_t[]){E, H, 2 * I});
    mxfp8_tensor QF1 = mxfp8_tensor_make(qf1, MXFP8_DTYPE_E4M3, 4, (const int64_t[]){E, H, 2, I});
    mxfp8_tensor SF1 = mxfp8_tensor_make(sf1, MXFP8_DTYPE_E8M0, 4, (const int64_t[]){E, GH, 2, I});
    mxfp8_tensor QF2 = mxfp8_tensor_make(qf2, MXFP8_DTYPE_E4M3, 3, (const int64_t[]){E, I, H});
    mxfp8_tensor SF2 = mxfp8_tensor_make(sf2, MXFP8_DTYPE_E8M0, 3, (const int64_t[]){E, GI, H});
    mxfp8_tensor QB1 = mxfp8_tensor_make(qb1, MXFP8_DTYPE_E4M3, 3, (const int64_t[]){E, H, 2 * I});
    mxfp8_tensor SB1 = mxfp8_tensor_make(sb1, MXFP8_DTYPE_E8M0, 3, (const int64_t[]){E, H, G2I});
    mxfp8_tensor QB2 = mxfp8_tensor_make(qb2, MXFP8_DTYPE_E4M3, 3, (const int64_t[]){E, I, H});
    mxfp8_tensor SB2 = mxfp8_tensor_make(sb2, MXFP8_DTYPE_E8M0, 3, (const int64_t[]){E, I, GH});
    mxfp8_quant_params qp = mxfp8_quant_params_default();
    TU_CHECK(mxfp8_quantize(&W1, 1, &qp, &QF1, &SF1) == MXFP8_OK && mxfp8_quantize(&W2, 1, &qp, &QF2, &SF2) == MXFP8_OK &&
                 mxfp8_quantize(&W1f, 2, &qp, &QB1, &SB1) == MXFP8_OK &&
                 mxfp8_quantize(&W2, 2, &qp, &QB2, &SB2) == MXFP8_OK,
             "quantize the weights: %s", mxfp8_last_error_message());
    QB1 = mxfp8_tensor_make(qb1, MXFP8_DTYPE_E4M3, 4, (const int64_t[]){E, H, 2, I});
    mxfp8_quant_stats *stats = tu_alloc(E * MXFP8_MOE_NUM_OPERANDS * sizeof(mxfp8_quant_stats));
    /* the forward's checkpoints (F32), the backward's inputs in variant 1 */
    float *ck = tu_alloc((size_t)(N * B * (2 * I + 3 * I + H)) * 4);
    float *ck_gu = ck, *ck_act = ck_gu + N * 2 * I * B, *ck_int = ck_act + N * I * B, *ck_sint = ck_int + N * I * B,
          *ck_down = ck_sint + N * I * B;
    for (int variant = 0; variant < 3; variant++) { /* the forward */
        static const char *what[3] = {"moe_forward f32", "moe_forward bf16, biases, checkpoints, stats",
                                      "moe_forward pre-quantized weights, gpt-oss SwiGLU"};
        const mxfp8_dtype dt = variant == 1 ? MXFP8_DTYPE_BF16 : MXFP8_DTYPE_F32;
        const size_t es = mxfp8_dtype_size(dt);
        moe_ctx m;
        memset(&m, 0, sizeof m);
        mxfp8_moe_config cfg;
        mxfp8_moe_config_init(&cfg);
        void *xd = as_dtype(x, nX, dt), *w1d = as_dtype(w1, nW1, dt), *w2d = as_dtype(w2, nW2, dt),
             *b1d = as_dtype(b1, nB1, dt), *b2d = as_dtype(b2, nB2, dt);
        mxfp8_moe_fwd_args_init(&m.fa);
        m.fa.hidden_states = mxfp8_tensor_make(xd, dt, 2, (const int64_t[]){T, H});
        m.fa.expert_affinities_masked = af;
        m.fa.gate_up_proj_weight = mxfp8_tensor_make(w1d, dt, 4, (const int64_t[]){E, H, 2, I});
        m.fa.down_proj_weight = mxfp8_tensor_make(w2d, dt, 3, (const int64_t[]){E, I, H});
        m.fa.token_position_to_id = tp;
        m.fa.block_to_expert = be;
        m.fa.block_size = B;
        m.fa.config = &cfg;
        const int64_t nck = variant == 1 ? N * B * (2 * I + 3 * I + H) : 0;
        unsigned char *out = tu_alloc((size_t)(nX + nck) * es);
        m.fo.output = mxfp8_tensor_make(out, dt, 2, (const int64_t[]){T, H});
        if (variant == 1) {
            cfg.bias = 1;
            m.fa.gate_and_up_proj_bias = mxfp8_tensor_make(b1d, dt, 3, (const int64_t[]){E, 2, I});
            m.fa.down_proj_bias = mxfp8_tensor_make(b2d, dt, 2, (const int64_t[]){E, H});
            m.fa.stats = stats;
            unsigned char *c = out + (size_t)nX * es;
            m.fo.gate_up_proj_act_checkpoint_T = mxfp8_tensor_make(c, dt, 4, (const int64_t[]){N, 2, I, B});
            c += (size_t)(N * 2 * I * B) * es;
            m.fo.gate_act_checkpoint_T = mxfp8_tensor_make(c, dt, 3, (const int64_t[]){N, I, B});
            c += (size_t)(N * I * B) * es;
            m.fo.intermediate_checkpoint_T = mxfp8_tensor_make(c, dt, 3, (const int64_t[]){N, I, B});
            c += (size_t)(N * I * B) * es;
            m.fo.scaled_intermediate_checkpoint_T = mxfp8_tensor_make(c, dt, 3, (const int64_t[]){N, I, B});
            c += (size_t)(N * I * B) * es;
            m.fo.down_proj_output_checkpoint = mxfp8_tensor_make(c, dt, 3, (const int64_t[]){N, B, H});
        }
        if (variant == 2) {
            cfg.activation = MXFP8_ACT_GPT_OSS_SWIGLU;
            m.fa.gate_up_proj_weight = QF1, m.fa.gate_up_weight_scales = SF1;
            m.fa.down_proj_weight = QF2, m.fa.down_weight_scales = SF2;
        }
        sized_call c = {what[variant], moe_fwd_validate_c, moe_fwd_call_c, &m, out, (size_t)(nX + nck) * es};
        check_sized(&c);
        if (variant == 0) { /* F32 checkpoints of this configuration, for the backward */
            m.fo.gate_up_proj_act_checkpoint_T = mxfp8_tensor_make(ck_gu, MXFP8_DTYPE_F32, 4, (const int64_t[]){N, 2, I, B});
            m.fo.gate_act_checkpoint_T = mxfp8_tensor_make(ck_act, MXFP8_DTYPE_F32, 3, (const int64_t[]){N, I, B});
            m.fo.intermediate_checkpoint_T = mxfp8_tensor_make(ck_int, MXFP8_DTYPE_F32, 3, (const int64_t[]){N, I, B});
            m.fo.scaled_intermediate_checkpoint_T =
                mxfp8_tensor_make(ck_sint, MXFP8_DTYPE_F32, 3, (const int64_t[]){N, I, B});
            m.fo.down_proj_output_checkpoint = mxfp8_tensor_make(ck_down, MXFP8_DTYPE_F32, 3, (const int64_t[]){N, B, H});
            TU_CHECK(mxfp8_moe_forward(&m.fa, &m.fo) == MXFP8_OK, "forward with checkpoints: %s",
                     mxfp8_last_error_message());
        }
        free(xd), free(w1d), free(w2d), free(b1d), free(b2d), free(out);
    }
    /* the backward, on each weight-gradient path (by size: per block here; and the segmented one forced) */
    for (int v8 = 0; v8 < 8; v8++) {
        const int variant = v8 % 4;
        mxfp8i_moe_set_segmented_wgrad(v8 < 4 ? -1 : 1);
        static const char *what[8] = {"moe_backward f32, recomputed", "moe_backward bf16, biases, checkpoints",
                                      "moe_backward affinity on H, recomputed, stats",
                                      "moe_backward pre-quantized weights, on H",
                                      "moe_backward f32, recomputed, segmented",
                                      "moe_backward bf16, biases, checkpoints, segmented",
                                      "moe_backward affinity on H, recomputed, stats, segmented",
                                      "moe_backward pre-quantized weights, on H, segmented"};
        const mxfp8_dtype dt = variant == 1 ? MXFP8_DTYPE_BF16 : MXFP8_DTYPE_F32;
        const size_t es = mxfp8_dtype_size(dt);
        moe_ctx m;
        memset(&m, 0, sizeof m);
        mxfp8_moe_config cfg;
        mxfp8_moe_config_init(&cfg);
        void *xd = as_dtype(x, nX, dt), *w1d = as_dtype(w1, nW1, dt), *w2d = as_dtype(w2, nW2, dt),
             *dyd = as_dtype(dy, nX, dt), *b1d = as_dtype(b1, nB1, dt), *b2d = as_dtype(b2, nB2, dt);
        mxfp8_moe_bwd_args_init(&m.ba);
        m.ba.hidden_states = mxfp8_tensor_make(xd, dt, 2, (const int64_t[]){T, H});
        m.ba.expert_affinities_masked = af;
        m.ba.gate_up_proj_weight = mxfp8_tensor_make(w1d, dt, 4, (const int64_t[]){E, H, 2, I});
        m.ba.down_proj_weight = mxfp8_tensor_make(w2d, dt, 3, (const int64_t[]){E, I, H});
        m.ba.token_position_to_id = tp;
        m.ba.block_to_expert = be;
        m.ba.output_hidden_states_grad = mxfp8_tensor_make(dyd, dt, 2, (const int64_t[]){T, H});
        m.ba.block_size = B;
        m.ba.config = &cfg;
        const int bias = variant == 1;
        const int64_t nout = nX + T * E + nW1 + nW2 + (bias ? nB1 + nB2 : 0);
        unsigned char *out = tu_alloc((size_t)nout * es), *o = out;
        m.bg.hidden_states_grad = mxfp8_tensor_make(o, dt, 2, (const int64_t[]){T, H}), o += (size_t)nX * es;
        m.bg.expert_affinities_masked_grad = mxfp8_tensor_make(o, dt, 1, (const int64_t[]){T * E}), o += (size_t)(T * E) * es;
        m.bg.gate_up_proj_weight_grad = mxfp8_tensor_make(o, dt, 4, (const int64_t[]){E, H, 2, I}), o += (size_t)nW1 * es;
        m.bg.down_proj_weight_grad = mxfp8_tensor_make(o, dt, 3, (const int64_t[]){E, I, H}), o += (size_t)nW2 * es;
        if (bias) {
            cfg.bias = 1;
            m.ba.gate_and_up_proj_bias = mxfp8_tensor_make(b1d, dt, 3, (const int64_t[]){E, 2, I});
            m.ba.down_proj_bias = mxfp8_tensor_make(b2d, dt, 2, (const int64_t[]){E, H});
            m.bg.gate_and_up_proj_bias_grad = mxfp8_tensor_make(o, dt, 3, (const int64_t[]){E, 2, I}), o += (size_t)nB1 * es;
            m.bg.down_proj_bias_grad = mxfp8_tensor_make(o, dt, 2, (const int64_t[]){E, H});
            /* checkpoints of the forward without biases: any values of the right shape serve the sizing */
            m.ba.gate_up_proj_act_checkpoint_T =
                mxfp8_tensor_make(ck_gu, MXFP8_DTYPE_F32, 4, (const int64_t[]){N, 2, I, B});
            m.ba.gate_act_checkpoint_T = mxfp8_tensor_make(ck_act, MXFP8_DTYPE_F32, 3, (const int64_t[]){N, I, B});
            m.ba.intermediate_checkpoint_T = mxfp8_tensor_make(ck_int, MXFP8_DTYPE_F32, 3, (const int64_t[]){N, I, B});
            m.ba.scaled_intermediate_checkpoint_T =
                mxfp8_tensor_make(ck_sint, MXFP8_DTYPE_F32, 3, (const int64_t[]){N, I, B});
        }
        if (variant >= 2) cfg.affinity_option = MXFP8_AFFINITY_ON_H;
        if (variant == 2) m.ba.stats = stats;
        if (variant == 3) { /* W1's recomputation along H reads an FP32 copy of the codes quantized along 2I */
            m.ba.gate_up_proj_weight = QB1, m.ba.gate_up_weight_scales = SB1;
            m.ba.down_proj_weight = QB2, m.ba.down_weight_scales = SB2;
        }
        sized_call c = {what[v8], moe_bwd_validate_c, moe_bwd_call_c, &m, out, (size_t)nout * es};
        check_sized(&c);
        free(xd), free(w1d), free(w2d), free(dyd), free(b1d), free(b2d), free(out);
    }
    mxfp8i_moe_set_segmented_wgrad(-1);
    free(tok), free(b2e), free(a), free(x), free(w1), free(w2), free(dy), free(b1), free(b2), free(stats), free(ck);
    free(qf1), free(sf1), free(qf2), free(sf2), free(qb1), free(sb1), free(qb2), free(sb2);
}

int main(void) {
    printf("test_workspace: peak heap workspace of each entry point vs the documented bound\n");
    test_quantize();
    test_gemm();
    test_matmul_backward();
    test_moe_backward();
    test_reuse();
    test_router();
    test_reserve();
    test_reserve_moe();
    TU_CHECK(!ws_overflow, "the allocation table overflowed");
    TU_CHECK(atomic_load(&ws_calls) > 0, "no allocation was counted: link with --wrap=malloc etc. (CMakeLists.txt)");
    return tu_finish("test_workspace");
}
