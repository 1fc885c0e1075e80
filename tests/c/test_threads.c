/*
 * test_threads.c -- the library called from 4 threads at once on separate buffers.
 *
 * Each worker runs the same sequence of calls on its own inputs (seeded by the worker's index): quantize (2-D, along
 * both axes), dequantize, block-scaled GEMM, matmul backward, and the MoE backward when RELV_HAVE_MOE is set. The
 * results must equal, bit for bit, the same calls made sequentially from the main thread beforehand. Each worker
 * also provokes an error of its own and checks that mxfp8_last_error_message() shows its own message (the message is
 * thread-local), before and after the other workers' calls.
 *
 * Run under ThreadSanitizer by scripts/sanitize.sh (clang, libomp). The library's own OpenMP threads stay on: libomp
 * is TSan-aware through its Archer tool, which scripts/sanitize.sh loads (OMP_TOOL_LIBRARIES=libarcher.so); with a
 * TSan-unaware runtime (libgomp) run it with MXFP8_NUM_THREADS=1 instead.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#ifndef RELV_HAVE_MOE
#define RELV_HAVE_MOE 1
#endif

#define NWORKERS 4
#define ROUNDS 3

enum { QM = 48, QK = 96, GM = 24, GN = 40, GK = 72, MT = 40 /* MoE tokens */ };

typedef struct work {
    int id;
    /* inputs */
    float x[QM * QK];
    uint16_t w_bf16[GN * GK];
    float dy[GM * GN], act[GM * GK];
    /* outputs */
    uint8_t codes_r[QM * QK], scales_r[QM * ((QK + 31) / 32)];
    uint8_t codes_c[QM * QK], scales_c[((QM + 31) / 32) * QK];
    uint16_t deq[QM * QK];
    float c[GM * GN];
    uint16_t dx[GM * GK], dw[GN * GK];
#if RELV_HAVE_MOE
    float moe_dx[MT * 32], moe_da[MT * 2], moe_dw1[2 * 32 * 2 * 32], moe_dw2[2 * 32 * 32];
    float moe_x[MT * 32], moe_a[MT * 2], moe_w1[2 * 32 * 2 * 32], moe_w2[2 * 32 * 32], moe_dy[MT * 32];
#endif
    int failures;
    char msg[256];
} work;

static void fill(work *w) {
    tu_rng r = {0x1234u + 7919u * (uint64_t)w->id};
    for (int i = 0; i < QM * QK; i++) w->x[i] = (float)(tu_uniform(&r) * 8 - 4) * (i % 17 == 0 ? 1e3f : 1.0f);
    for (int i = 0; i < GN * GK; i++) w->w_bf16[i] = mxfp8_fp32_to_bf16((float)(tu_uniform(&r) * 2 - 1));
    for (int i = 0; i < GM * GN; i++) w->dy[i] = (float)(tu_uniform(&r) * 2 - 1);
    for (int i = 0; i < GM * GK; i++) w->act[i] = (float)(tu_uniform(&r) * 2 - 1);
#if RELV_HAVE_MOE
    for (int i = 0; i < MT * 32; i++)
        w->moe_x[i] = (float)(tu_uniform(&r) * 2 - 1), w->moe_dy[i] = (float)(tu_uniform(&r) - 0.5);
    for (int i = 0; i < 2 * 32 * 2 * 32; i++) w->moe_w1[i] = (float)(tu_uniform(&r) * 0.2 - 0.1);
    for (int i = 0; i < 2 * 32 * 32; i++) w->moe_w2[i] = (float)(tu_uniform(&r) * 0.2 - 0.1);
    for (int t = 0; t < MT; t++)
        for (int e = 0; e < 2; e++) w->moe_a[t * 2 + e] = (t % 2 == e) ? 0.5f + 0.01f * (float)t : 0.0f;
#endif
}

#define WCHECK(w, cond, ...)                                                                                      \
    do {                                                                                                          \
        if (!(cond)) {                                                                                            \
            (w)->failures++;                                                                                      \
            snprintf((w)->msg, sizeof (w)->msg, __VA_ARGS__);                                                     \
        }                                                                                                         \
    } while (0)

/* One round of calls; every output written. */
static void compute(work *w) {
    int64_t s2[2];
    mxfp8_quant_params qp = mxfp8_quant_params_default();
    s2[0] = QM, s2[1] = QK;
    mxfp8_tensor x = mxfp8_tensor_make(w->x, MXFP8_DTYPE_F32, 2, s2);
    mxfp8_tensor cr = mxfp8_tensor_make(w->codes_r, MXFP8_DTYPE_E4M3, 2, s2);
    mxfp8_tensor cc = mxfp8_tensor_make(w->codes_c, MXFP8_DTYPE_E4M3, 2, s2);
    mxfp8_tensor dq = mxfp8_tensor_make(w->deq, MXFP8_DTYPE_BF16, 2, s2);
    s2[1] = (QK + 31) / 32;
    mxfp8_tensor sr = mxfp8_tensor_make(w->scales_r, MXFP8_DTYPE_E8M0, 2, s2);
    s2[0] = (QM + 31) / 32, s2[1] = QK;
    mxfp8_tensor sc = mxfp8_tensor_make(w->scales_c, MXFP8_DTYPE_E8M0, 2, s2);
    mxfp8_status st;
    st = mxfp8_quantize(&x, 1, &qp, &cr, &sr);
    WCHECK(w, st == MXFP8_OK, "quantize rows: %s", mxfp8_last_error_message());
    st = mxfp8_quantize(&x, 0, &qp, &cc, &sc);
    WCHECK(w, st == MXFP8_OK, "quantize cols: %s", mxfp8_last_error_message());
    st = mxfp8_dequantize(&cc, &sc, 0, MXFP8_GROUP_1X32, &dq);
    WCHECK(w, st == MXFP8_OK, "dequantize: %s", mxfp8_last_error_message());

    /* GEMM: C[GM, GN] = act[GM, GK] @ W[GN, GK]^T */
    mxfp8_operand a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    s2[0] = GM, s2[1] = GK;
    a.values = mxfp8_tensor_make(w->act, MXFP8_DTYPE_F32, 2, s2);
    s2[0] = GN;
    b.values = mxfp8_tensor_make(w->w_bf16, MXFP8_DTYPE_BF16, 2, s2);
    s2[0] = GM, s2[1] = GN;
    mxfp8_tensor c = mxfp8_tensor_make(w->c, MXFP8_DTYPE_F32, 2, s2);
    st = mxfp8_gemm(&a, &b, NULL, 0, &c);
    WCHECK(w, st == MXFP8_OK, "gemm: %s", mxfp8_last_error_message());

    /* matmul backward: dY [GM, GN], W [GN, GK], X [GM, GK] */
    mxfp8_matmul_bwd_args args;
    mxfp8_matmul_bwd_args_init(&args);
    args.output_grad = c; /* reuse the shape; data from dy */
    args.output_grad.data = w->dy;
    args.weights = b.values;
    args.input_activation = a.values;
    s2[0] = GM, s2[1] = GK;
    mxfp8_tensor dx = mxfp8_tensor_make(w->dx, MXFP8_DTYPE_BF16, 2, s2);
    s2[0] = GN;
    mxfp8_tensor dw = mxfp8_tensor_make(w->dw, MXFP8_DTYPE_BF16, 2, s2);
    st = mxfp8_matmul_backward(&args, &dx, &dw);
    WCHECK(w, st == MXFP8_OK, "matmul_backward: %s", mxfp8_last_error_message());

#if RELV_HAVE_MOE
    /* MoE backward: T = MT, H 32, I 32, E 2, B 4; expert 0 gets the even tokens (blocks 0-4), expert 1 the odd ones
       (blocks 5-9); with 4 OpenMP threads it takes the expert-parallel path, whose dX combine runs as tasks of 16
       tokens: three of them side by side */
    int32_t tok[MT], b2e[MT / 4];
    for (int q = 0; q < MT; q++) tok[q] = q < MT / 2 ? 2 * q : 2 * (q - MT / 2) + 1;
    for (int n = 0; n < MT / 4; n++) b2e[n] = n >= MT / 8;
    mxfp8_moe_bwd_args m;
    mxfp8_moe_bwd_args_init(&m);
    m.hidden_states = mxfp8_tensor_make(w->moe_x, MXFP8_DTYPE_F32, 2, (const int64_t[]){MT, 32});
    m.expert_affinities_masked = mxfp8_tensor_make(w->moe_a, MXFP8_DTYPE_F32, 2, (const int64_t[]){2 * MT, 1});
    m.gate_up_proj_weight = mxfp8_tensor_make(w->moe_w1, MXFP8_DTYPE_F32, 4, (const int64_t[]){2, 32, 2, 32});
    m.down_proj_weight = mxfp8_tensor_make(w->moe_w2, MXFP8_DTYPE_F32, 3, (const int64_t[]){2, 32, 32});
    m.token_position_to_id = mxfp8_tensor_make(tok, MXFP8_DTYPE_I32, 1, (const int64_t[]){MT});
    m.block_to_expert = mxfp8_tensor_make(b2e, MXFP8_DTYPE_I32, 1, (const int64_t[]){MT / 4});
    m.output_hidden_states_grad = mxfp8_tensor_make(w->moe_dy, MXFP8_DTYPE_F32, 2, (const int64_t[]){MT, 32});
    m.block_size = 4;
    mxfp8_moe_bwd_grads g;
    memset(&g, 0, sizeof g);
    g.hidden_states_grad = mxfp8_tensor_make(w->moe_dx, MXFP8_DTYPE_F32, 2, (const int64_t[]){MT, 32});
    g.expert_affinities_masked_grad = mxfp8_tensor_make(w->moe_da, MXFP8_DTYPE_F32, 2, (const int64_t[]){2 * MT, 1});
    g.gate_up_proj_weight_grad = mxfp8_tensor_make(w->moe_dw1, MXFP8_DTYPE_F32, 4, (const int64_t[]){2, 32, 2, 32});
    g.down_proj_weight_grad = mxfp8_tensor_make(w->moe_dw2, MXFP8_DTYPE_F32, 3, (const int64_t[]){2, 32, 32});
    st = mxfp8_moe_backward(&m, &g);
    WCHECK(w, st == MXFP8_OK, "moe_backward: %s", mxfp8_last_error_message());
#endif
}

/* The outputs of a work item, as one byte range (from codes_r to the end of the outputs). */
#if RELV_HAVE_MOE
#define OUT_END(w) ((const char *)&(w)->moe_x)
#else
#define OUT_END(w) ((const char *)&(w)->failures)
#endif
#define OUT_BEGIN(w) ((const char *)(w)->codes_r)

static work ref[NWORKERS], par[NWORKERS];

/* A thread-local error of this worker's own: axis = 10 + id on a 2-D tensor. */
static int own_error(work *w) {
    int64_t s2[2] = {QM, QK};
    mxfp8_tensor x = mxfp8_tensor_make(w->x, MXFP8_DTYPE_F32, 2, s2);
    mxfp8_tensor cr = mxfp8_tensor_make(w->codes_r, MXFP8_DTYPE_E4M3, 2, s2);
    s2[1] = (QK + 31) / 32;
    mxfp8_tensor sr = mxfp8_tensor_make(w->scales_r, MXFP8_DTYPE_E8M0, 2, s2);
    return mxfp8_quantize(&x, 10 + w->id, NULL, &cr, &sr) == MXFP8_ERR_INVALID_ARGUMENT;
}

static pthread_barrier_t barrier;

static void *worker(void *p) {
    work *w = p;
    char want[64];
    snprintf(want, sizeof want, "axis %d ", 10 + w->id);
    WCHECK(w, own_error(w), "worker %d: own error not raised", w->id);
    pthread_barrier_wait(&barrier); /* every worker holds an error now */
    WCHECK(w, strstr(mxfp8_last_error_message(), want) != NULL, "worker %d sees another thread's error: %s", w->id,
           mxfp8_last_error_message());
    for (int r = 0; r < ROUNDS; r++) {
        memset((char *)OUT_BEGIN(w), 0x5A, (size_t)(OUT_END(w) - OUT_BEGIN(w)));
        compute(w);
        WCHECK(w, memcmp(OUT_BEGIN(w), OUT_BEGIN(&ref[w->id]), (size_t)(OUT_END(w) - OUT_BEGIN(w))) == 0,
               "worker %d round %d: results differ from the sequential calls", w->id, r);
    }
    return NULL;
}

int main(void) {
    for (int i = 0; i < NWORKERS; i++) {
        ref[i].id = par[i].id = i;
        fill(&ref[i]);
        fill(&par[i]);
        compute(&ref[i]); /* sequential */
        TU_CHECK(ref[i].failures == 0, "sequential worker %d: %s", i, ref[i].msg);
    }
    /* workers' inputs differ (so a mix-up between buffers would show) */
    TU_CHECK(memcmp(OUT_BEGIN(&ref[0]), OUT_BEGIN(&ref[1]), (size_t)(OUT_END(&ref[0]) - OUT_BEGIN(&ref[0]))) != 0,
             "workers 0 and 1 computed the same results from different inputs");
    pthread_t th[NWORKERS];
    pthread_barrier_init(&barrier, NULL, NWORKERS);
    for (int i = 0; i < NWORKERS; i++) TU_CHECK(pthread_create(&th[i], NULL, worker, &par[i]) == 0, "pthread_create");
    for (int i = 0; i < NWORKERS; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&barrier);
    for (int i = 0; i < NWORKERS; i++) TU_CHECK(par[i].failures == 0, "worker %d: %s", i, par[i].msg);
    /* the main thread's last error is its own (none raised here since compute() succeeded) */
    TU_CHECK(mxfp8_last_error_message()[0] == 0, "main thread sees an error: %s", mxfp8_last_error_message());
    return tu_finish("test_threads");
}
