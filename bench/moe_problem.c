/* moe_problem.c -- the MoE problems of the bench (see moe_problem.h). */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_problem.h"

int moe_routing(moe_problem *m) {
    moe_prob p = m->p;
    int64_t TK = p.T * p.K;
    m->N = (TK - (p.E - 1) + p.B - 1) / p.B + p.E - 1;
    m->real_rows = TK;
    int32_t *ids = malloc((size_t)TK * sizeof *ids);
    int64_t *cnt = calloc((size_t)p.E, sizeof *cnt);
    m->tok = bench_alloc((size_t)(m->N * p.B) * 4);
    m->b2e = bench_alloc((size_t)m->N * 4);
    m->aff = bench_alloc((size_t)(p.T * p.E) * 2);
    int rc = -1;
    if (!ids || !cnt || !m->tok || !m->b2e || !m->aff) goto done;
    memset(m->aff, 0, (size_t)(p.T * p.E) * 2);
    for (int64_t t = 0; t < p.T; t++)
        for (int64_t k = 0; k < p.K; k++) {
            int32_t e;
            int dup;
            do { /* distinct experts per token */
                e = (int32_t)bench_urand(0, (double)p.E);
                if (e >= p.E) e = (int32_t)p.E - 1;
                dup = 0;
                for (int64_t j = 0; j < k; j++) dup |= ids[t * p.K + j] == e;
            } while (dup);
            ids[t * p.K + k] = e;
            cnt[e]++;
            m->aff[t * p.E + e] = bench_bf16((float)bench_urand(0.05, 1.0));
        }
    /* expert-major token lists: one pass over the ids, then each expert's tokens ascending */
    int64_t blk = 0;
    for (int64_t e = 0; e < p.E; e++) {
        int64_t nb = (cnt[e] + p.B - 1) / p.B;
        if (blk + nb > m->N) goto done;
        for (int64_t b = 0; b < nb; b++) m->b2e[blk + b] = (int32_t)e;
        for (int64_t i = 0; i < nb * p.B; i++) m->tok[blk * p.B + i] = -1;
        cnt[e] = blk * p.B; /* from here on: the next free position of expert e */
        blk += nb;
    }
    for (int64_t t = 0; t < p.T; t++)
        for (int64_t k = 0; k < p.K; k++) m->tok[cnt[ids[t * p.K + k]]++] = (int32_t)t;
    for (; blk < m->N; blk++) {
        m->b2e[blk] = (int32_t)(p.E - 1);
        for (int64_t i = 0; i < p.B; i++) m->tok[blk * p.B + i] = -1;
    }
    rc = 0;
done:
    free(ids);
    free(cnt);
    return rc;
}

size_t moe_io_bytes(const moe_problem *m) {
    moe_prob p = m->p;
    const size_t w = m->train ? 4 : 2; /* bytes of a weight, weight gradient, affinity, its gradient */
    size_t n = 0;
    n += 2 * (size_t)(p.T * p.H) * 2;                 /* X, dY */
    n += (size_t)(p.T * p.E) * 2 * w;                 /* affinities, their grad */
    n += 2 * (size_t)(p.E * p.H * 2 * p.I) * w;       /* W1, dW1 */
    n += 2 * (size_t)(p.E * p.I * p.H) * w;           /* W2, dW2 */
    n += (size_t)(m->N * 2 * p.I * p.B) * w;          /* gate/up checkpoint */
    if (!m->train) n += 3 * (size_t)(m->N * p.I * p.B) * 2; /* gate act, intermediate, scaled intermediate */
    n += (size_t)(m->N * p.B) * 4 + (size_t)m->N * 4; /* routing */
    n += (size_t)(p.T * p.H) * 2;                     /* dX */
    return n;
}

/* Checkpoints with the forward's relations (gate act = SiLU(g), inter = act * u, scaled = a * inter); speed does
 * not depend on them being the exact forward of X, so they come from random g, u. */
static void fill_checkpoints(moe_problem *m) {
    moe_prob p = m->p;
    for (int64_t n = 0; n < m->N; n++)
        for (int64_t i = 0; i < p.I; i++)
            for (int64_t b = 0; b < p.B; b++) {
                float g = (float)bench_urand(-3, 3), u = (float)bench_urand(-3, 3);
                float act = g / (1.0f + expf(-g));
                float a = m->tok[n * p.B + b] >= 0 ? 0.5f : 0.0f;
                m->ckp_gu[((n * 2 + 0) * p.I + i) * p.B + b] = bench_bf16(g);
                m->ckp_gu[((n * 2 + 1) * p.I + i) * p.B + b] = bench_bf16(u);
                m->ckp_ga[(n * p.I + i) * p.B + b] = bench_bf16(act);
                m->ckp_in[(n * p.I + i) * p.B + b] = bench_bf16(act * u);
                m->ckp_si[(n * p.I + i) * p.B + b] = bench_bf16(a * act * u);
            }
}

/* uniform FP32 values in [lo, hi) */
static void fill_f32(float *q, size_t n, double lo, double hi) {
    for (size_t i = 0; i < n; i++) q[i] = (float)bench_urand(lo, hi);
}

/* The training configuration's FP32 tensors (the gate/up checkpoint is written by the forward before the first
 * backward: moe_tensors runs one). */
static int train_tensors(moe_problem *m) {
    moe_prob p = m->p;
    size_t w1 = (size_t)(p.E * p.H * 2 * p.I), w2 = (size_t)(p.E * p.I * p.H), te = (size_t)(p.T * p.E);
    m->w1f = bench_alloc(w1 * 4);
    m->dw1f = bench_alloc(w1 * 4);
    m->w2f = bench_alloc(w2 * 4);
    m->dw2f = bench_alloc(w2 * 4);
    m->ckp_guf = bench_alloc((size_t)(m->N * 2 * p.I * p.B) * 4);
    m->afff = bench_alloc(te * 4);
    m->dafff = bench_alloc(te * 4);
    if (!m->w1f || !m->dw1f || !m->w2f || !m->dw2f || !m->ckp_guf || !m->afff || !m->dafff) return -1;
    fill_f32(m->w1f, w1, -0.1, 0.1);
    fill_f32(m->w2f, w2, -0.1, 0.1);
    for (size_t i = 0; i < te; i++) m->afff[i] = mxfp8_bf16_to_fp32(m->aff[i]);
    memset(m->dw1f, 0, w1 * 4);
    memset(m->dw2f, 0, w2 * 4);
    memset(m->dafff, 0, te * 4);
    return moe_run_forward(m); /* the FP32 gate/up checkpoint of these inputs */
}

int moe_tensors(moe_problem *m) {
    moe_prob p = m->p;
    size_t th = (size_t)(p.T * p.H), w1 = (size_t)(p.E * p.H * 2 * p.I), w2 = (size_t)(p.E * p.I * p.H);
    size_t gu = (size_t)(m->N * 2 * p.I * p.B), ib = (size_t)(m->N * p.I * p.B);
    m->x = bench_alloc(th * 2);
    m->dy = bench_alloc(th * 2);
    m->dx = bench_alloc(th * 2);
    m->y = bench_alloc(th * 2);
    if (!m->x || !m->dy || !m->dx || !m->y) return -1;
    bench_fill_bf16(m->x, th, 0, 1);
    bench_fill_bf16(m->dy, th, -1, 1);
    memset(m->dx, 0, th * 2);
    memset(m->y, 0, th * 2);
    if (m->train) return train_tensors(m);
    m->w1 = bench_alloc(w1 * 2);
    m->dw1 = bench_alloc(w1 * 2);
    m->w2 = bench_alloc(w2 * 2);
    m->dw2 = bench_alloc(w2 * 2);
    m->ckp_gu = bench_alloc(gu * 2);
    m->ckp_ga = bench_alloc(ib * 2);
    m->ckp_in = bench_alloc(ib * 2);
    m->ckp_si = bench_alloc(ib * 2);
    m->daff = bench_alloc((size_t)(p.T * p.E) * 2);
    if (!m->w1 || !m->dw1 || !m->w2 || !m->dw2 || !m->ckp_gu || !m->ckp_ga || !m->ckp_in || !m->ckp_si || !m->daff)
        return -1;
    bench_fill_bf16(m->w1, w1, -0.1, 0.1);
    bench_fill_bf16(m->w2, w2, -0.1, 0.1);
    fill_checkpoints(m);
    memset(m->dw1, 0, w1 * 2);
    memset(m->dw2, 0, w2 * 2);
    memset(m->daff, 0, (size_t)(p.T * p.E) * 2);
    return 0;
}

void moe_free_tensors(moe_problem *m) {
    uint16_t **bufs[] = {&m->x,  &m->w1, &m->w2,   &m->dy,  &m->ckp_gu, &m->ckp_ga, &m->ckp_in,
                         &m->ckp_si, &m->dx, &m->daff, &m->dw1, &m->dw2,    &m->y};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        free(*bufs[i]);
        *bufs[i] = NULL;
    }
    float **fbufs[] = {&m->w1f, &m->w2f, &m->dw1f, &m->dw2f, &m->ckp_guf, &m->afff, &m->dafff};
    for (size_t i = 0; i < sizeof fbufs / sizeof fbufs[0]; i++) {
        free(*fbufs[i]);
        *fbufs[i] = NULL;
    }
}

void moe_free(moe_problem *m) {
    moe_free_tensors(m);
    free(m->tok);
    free(m->b2e);
    free(m->aff);
    m->tok = m->b2e = NULL;
    m->aff = NULL;
    mxfp8_workspace_destroy(m->ws);
    m->ws = NULL;
}

const char *moe_name(const moe_prob *p, char *buf, size_t len) {
    snprintf(buf, len, "(%lld,%lld,%lld,%lld,%lld,%lld)", (long long)p->H, (long long)p->T, (long long)p->E,
             (long long)p->B, (long long)p->K, (long long)p->I);
    return buf;
}

/* The tensors whose dtype the configuration chooses (BF16, or F32 with train): affinities, weights and their
 * gradients, and the gate/up checkpoint. */
typedef struct moe_views {
    mxfp8_tensor aff, w1, w2, daff, dw1, dw2, gu;
} moe_views;
static moe_views views(const moe_problem *m) {
    moe_prob p = m->p;
    const mxfp8_dtype dt = m->train ? MXFP8_DTYPE_F32 : MXFP8_DTYPE_BF16;
    const int64_t s_aff[2] = {p.T * p.E, 1}, s_w1[4] = {p.E, p.H, 2, p.I}, s_w2[3] = {p.E, p.I, p.H};
    const int64_t s_gu[4] = {m->N, 2, p.I, p.B};
    const int f = m->train;
    moe_views v;
    v.aff = mxfp8_tensor_make(f ? (void *)m->afff : (void *)m->aff, dt, 2, s_aff);
    v.w1 = mxfp8_tensor_make(f ? (void *)m->w1f : (void *)m->w1, dt, 4, s_w1);
    v.w2 = mxfp8_tensor_make(f ? (void *)m->w2f : (void *)m->w2, dt, 3, s_w2);
    v.daff = mxfp8_tensor_make(f ? (void *)m->dafff : (void *)m->daff, dt, 2, s_aff);
    v.dw1 = mxfp8_tensor_make(f ? (void *)m->dw1f : (void *)m->dw1, dt, 4, s_w1);
    v.dw2 = mxfp8_tensor_make(f ? (void *)m->dw2f : (void *)m->dw2, dt, 3, s_w2);
    v.gu = mxfp8_tensor_make(f ? (void *)m->ckp_guf : (void *)m->ckp_gu, dt, 4, s_gu);
    if (f) { /* mxfp8.torch keeps its FP32 checkpoint positions-major ([N, B, 2, I] memory, the [N, 2, I, B] view) */
        const int64_t st[4] = {p.B * 2 * p.I, p.I, 1, 2 * p.I};
        for (int i = 0; i < 4; i++) v.gu.strides[i] = st[i];
    }
    return v;
}

int moe_run_backward(void *pv) {
    moe_problem *m = pv;
    moe_prob p = m->p;
    const moe_views v = views(m);
    mxfp8_moe_bwd_args a;
    mxfp8_moe_bwd_args_init(&a);
    int64_t s_th[2] = {p.T, p.H}, s_tok[1] = {m->N * p.B}, s_b2e[2] = {m->N, 1}, s_ib[3] = {m->N, p.I, p.B};
    a.hidden_states = mxfp8_tensor_make(m->x, MXFP8_DTYPE_BF16, 2, s_th);
    a.expert_affinities_masked = v.aff;
    a.gate_up_proj_weight = v.w1;
    a.down_proj_weight = v.w2;
    a.token_position_to_id = mxfp8_tensor_make(m->tok, MXFP8_DTYPE_I32, 1, s_tok);
    a.block_to_expert = mxfp8_tensor_make(m->b2e, MXFP8_DTYPE_I32, 2, s_b2e);
    a.output_hidden_states_grad = mxfp8_tensor_make(m->dy, MXFP8_DTYPE_BF16, 2, s_th);
    a.block_size = p.B;
    a.gate_up_proj_act_checkpoint_T = v.gu;
    if (!m->train) { /* train: the other three are recomputed */
        a.gate_act_checkpoint_T = mxfp8_tensor_make(m->ckp_ga, MXFP8_DTYPE_BF16, 3, s_ib);
        a.intermediate_checkpoint_T = mxfp8_tensor_make(m->ckp_in, MXFP8_DTYPE_BF16, 3, s_ib);
        a.scaled_intermediate_checkpoint_T = mxfp8_tensor_make(m->ckp_si, MXFP8_DTYPE_BF16, 3, s_ib);
    }
    mxfp8_moe_bwd_grads g;
    memset(&g, 0, sizeof g);
    g.hidden_states_grad = mxfp8_tensor_make(m->dx, MXFP8_DTYPE_BF16, 2, s_th);
    g.expert_affinities_masked_grad = v.daff;
    g.gate_up_proj_weight_grad = v.dw1;
    g.down_proj_weight_grad = v.dw2;
    a.workspace = m->ws;
    m->st = mxfp8_moe_backward(&a, &g);
    return m->st == MXFP8_OK ? 0 : -1;
}

int moe_run_forward(void *pv) {
    moe_problem *m = pv;
    moe_prob p = m->p;
    const moe_views v = views(m);
    mxfp8_moe_fwd_args a;
    mxfp8_moe_fwd_args_init(&a);
    int64_t s_th[2] = {p.T, p.H}, s_tok[1] = {m->N * p.B}, s_b2e[2] = {m->N, 1};
    a.hidden_states = mxfp8_tensor_make(m->x, MXFP8_DTYPE_BF16, 2, s_th);
    a.expert_affinities_masked = v.aff;
    a.gate_up_proj_weight = v.w1;
    a.down_proj_weight = v.w2;
    a.token_position_to_id = mxfp8_tensor_make(m->tok, MXFP8_DTYPE_I32, 1, s_tok);
    a.block_to_expert = mxfp8_tensor_make(m->b2e, MXFP8_DTYPE_I32, 2, s_b2e);
    a.block_size = p.B;
    mxfp8_moe_fwd_outputs o;
    memset(&o, 0, sizeof o);
    o.output = mxfp8_tensor_make(m->y, MXFP8_DTYPE_BF16, 2, s_th);
    if (m->train) o.gate_up_proj_act_checkpoint_T = v.gu; /* the FP32 checkpoint the backward is given */
    a.workspace = m->ws;
    m->st = mxfp8_moe_forward(&a, &o);
    return m->st == MXFP8_OK ? 0 : -1;
}

void moe_rss(double *cur, double *hwm) {
    *cur = *hwm = -1;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        long kb;
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) *cur = (double)kb * 1024.0;
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) *hwm = (double)kb * 1024.0;
    }
    fclose(f);
}

int moe_reset_hwm(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return -1;
    int ok = fputs("5", f) >= 0;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}
