/*
 * test_mpi_moe.c -- expert parallelism over MPI (run under mpiexec with 1..4 ranks; ctest label "mpi"): the
 * determinism contract of include/mxfp8_mpi.h. For each case, every rank builds the same gathered problem, runs the
 * single-process libmxfp8 layer on all of it (the oracle: mxfp8_moe_route + mxfp8_moe_forward / mxfp8_moe_backward),
 * then the expert-parallel forward and backward on its own tokens and experts, and compares its slice of every
 * output BIT FOR BIT. Cases cover uneven tokens (a rank with none, all tokens on one rank, none at all), E = 6 experts
 * on any P (E % P != 0), an expert with no tokens, top-1 / top-2 / top-4, routing by affinities, the BF16 (native)
 * and MXFP8 wires, F32 / BF16 / F16 tensors, biases, AFFINITY_ON_H, clamps, every activation, both padding ids,
 * accumulate_hidden_states_grad / skip_grad_initialization, pre-quantized weights, with and without checkpoints,
 * different thread counts on different ranks (the oracle runs on 2 threads, the ranks on 1 or 2), and ranks that
 * call with flush-to-zero and denormals-are-zero set in MXCSR on a problem whose sums are subnormal.
 */
#include "mpi_problem.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#define F32 MXFP8_DTYPE_F32
#define BF16 MXFP8_DTYPE_BF16
#define F16 MXFP8_DTYPE_F16
#define NATIVE MXFP8_MPI_WIRE_NATIVE
#define MXWIRE MXFP8_MPI_WIRE_MXFP8
#define INF INFINITY

static const tcase k_cases[] = {
    /* name, H, I, E, K, B, by_aff, xdt, odt, gdt, wire, keep, bias, prequant, aff, act, quant, rule,
       glo, ghi, ulo, uhi, skip_token, acc, sgi, empty_expert, tokens, ftz */
    {"top2 bf16 native", 64, 32, 6, 2, 8, 0, BF16, F32, BF16, NATIVE, 1, 0, 0, MXFP8_AFFINITY_ON_I, MXFP8_ACT_SILU,
     MXFP8_FMT_E4M3, MXFP8_SCALE_NKI, -INF, INF, -INF, INF, 1, 0, 0, -1, 0, 0},
    {"top1 f32 mxfp8-wire, an expert without tokens, H % 32 != 0, recompute", 80, 48, 6, 1, 4, 0, F32, F32, F32,
     MXWIRE, 0, 0, 0, MXFP8_AFFINITY_ON_I, MXFP8_ACT_SILU, MXFP8_FMT_E4M3, MXFP8_SCALE_NKI, -INF, INF, -INF, INF, 1, 0,
     0, 3, 0, 0},
    {"top4 on_h bias clamps swish e5m2 ocp, padding id T, accumulate + skip_grad_init", 64, 32, 6, 4, 16, 0, BF16,
     F32, BF16, NATIVE, 1, 1, 0, MXFP8_AFFINITY_ON_H, MXFP8_ACT_SWISH, MXFP8_FMT_E5M2, MXFP8_SCALE_OCP, -2.0f, 0.5f,
     -0.4f, 0.4f, 0, 1, 1, -1, 0, 0},
    {"routed by affinities, f16, mxfp8-wire, squared_relu rceil", 96, 32, 6, 3, 8, 1, F16, F32, F16, MXWIRE, 1, 0, 0,
     MXFP8_AFFINITY_ON_I, MXFP8_ACT_SQUARED_RELU, MXFP8_FMT_E4M3, MXFP8_SCALE_RCEIL, -INF, INF, -INF, INF, 1, 0, 0, -1,
     0, 0},
    {"pre-quantized weights, bias", 64, 64, 6, 2, 8, 0, BF16, BF16, F32, NATIVE, 1, 1, 1, MXFP8_AFFINITY_ON_I,
     MXFP8_ACT_SILU, MXFP8_FMT_E4M3, MXFP8_SCALE_NKI, -INF, INF, -INF, INF, 1, 0, 0, -1, 0, 0},
    {"all tokens on the last rank, on_h mxfp8-wire recompute", 64, 32, 6, 2, 5, 0, BF16, BF16, BF16, MXWIRE, 0, 0, 0,
     MXFP8_AFFINITY_ON_H, MXFP8_ACT_SILU, MXFP8_FMT_E4M3, MXFP8_SCALE_NKI, -INF, INF, -INF, INF, 1, 0, 0, 5, 1, 0},
    {"larger (threads split the blocks' work), top2 bf16, bias", 256, 128, 6, 2, 128, 0, BF16, F32, BF16, NATIVE, 1,
     1, 0, MXFP8_AFFINITY_ON_I, MXFP8_ACT_SILU, MXFP8_FMT_E4M3, MXFP8_SCALE_NKI, -INF, INF, -INF, INF, 1, 0, 0, -1, 4,
     0},
    {"no tokens on any rank", 32, 32, 6, 2, 8, 0, BF16, BF16, BF16, NATIVE, 1, 1, 0, MXFP8_AFFINITY_ON_I,
     MXFP8_ACT_SILU, MXFP8_FMT_E4M3, MXFP8_SCALE_NKI, -INF, INF, -INF, INF, 1, 0, 1, -1, 2, 0},
    {"the caller's FTZ and DAZ set, subnormal sums, accumulate", 64, 32, 6, 2, 8, 0, F32, F32, F32, NATIVE, 1, 1, 0,
     MXFP8_AFFINITY_ON_I, MXFP8_ACT_SILU, MXFP8_FMT_E4M3, MXFP8_SCALE_NKI, -INF, INF, -INF, INF, 1, 1, 0, -1, 3, 1},
};

/* The caller's MXCSR with flush-to-zero and denormals-are-zero set (ftz) or as it was; returns the previous one. */
static unsigned caller_csr(int ftz, unsigned prev) {
#if defined(__x86_64__) || defined(__i386__)
    const unsigned was = _mm_getcsr();
    _mm_setcsr(ftz ? was | 0x8040u : prev);
    return was;
#else
    (void)ftz, (void)prev;
    return 0;
#endif
}

/* The oracle's outputs: the single-process layer on the gathered problem. */
typedef struct ref {
    void *out, *dx, *da, *dW1, *dW2, *db1, *db2;
} ref;

static void bwd_weights(const mp *m, const tcase *c, int64_t e0, int64_t Er, mxfp8_tensor *W1, mxfp8_tensor *W2,
                        mxfp8_tensor *W1s, mxfp8_tensor *W2s, int bwd) {
    const int64_t H = m->H, I = m->I, G2I = (2 * I + 31) / 32, GH = (H + 31) / 32, GI = (I + 31) / 32;
    const mxfp8_dtype cd = c->quant ? MXFP8_DTYPE_E5M2 : MXFP8_DTYPE_E4M3;
    *W1s = *W2s = MXFP8_TENSOR_NONE;
    if (!c->prequant) {
        *W1 = mpv(m->W1 + e0 * H * 2 * I, F32, 4, Er, H, 2, I);
        *W2 = mpv(m->W2 + e0 * I * H, F32, 3, Er, I, H, 0);
        return;
    }
    *W1 = mpv((bwd ? m->W1b : m->W1f) + e0 * H * 2 * I, cd, 4, Er, H, 2, I);
    *W2 = mpv((bwd ? m->W2b : m->W2f) + e0 * I * H, cd, 3, Er, I, H, 0);
    if (bwd) {
        *W1s = mpv(m->W1bs + e0 * H * G2I, MXFP8_DTYPE_E8M0, 3, Er, H, G2I, 0);
        *W2s = mpv(m->W2bs + e0 * I * GH, MXFP8_DTYPE_E8M0, 3, Er, I, GH, 0);
    } else {
        const int64_t s1[4] = {Er, GH, 2, I};
        *W1s = mxfp8_tensor_make(m->W1fs + e0 * GH * 2 * I, MXFP8_DTYPE_E8M0, 4, s1);
        *W2s = mpv(m->W2fs + e0 * GI * H, MXFP8_DTYPE_E8M0, 3, Er, GI, H, 0);
    }
}

static void *copy_of(const void *src, int64_t n, mxfp8_dtype dt) {
    void *d = tu_alloc((size_t)(n > 0 ? n : 1) * mxfp8_dtype_size(dt));
    if (n > 0) memcpy(d, src, (size_t)n * mxfp8_dtype_size(dt));
    return d;
}

static void run_ref(const mp *m, const tcase *c, const mxfp8_moe_config *cfg, ref *R) {
    const int64_t T = m->T, H = m->H, I = m->I, E = m->E, N = m->N, B = m->B;
    const mxfp8_tensor X = c->wire == MXWIRE ? mpv(m->Xw, F32, 2, T, H, 0, 0) : mpv(m->X, c->xdt, 2, T, H, 0, 0);
    const mxfp8_tensor dY = c->wire == MXWIRE ? mpv(m->dYw, F32, 2, T, H, 0, 0) : mpv(m->dY, c->xdt, 2, T, H, 0, 0);
    float *ckg = tu_alloc(sizeof(float) * (size_t)(N * 2 * I * B + 1)), *ckd = tu_alloc(sizeof(float) * (size_t)(N * B * H + 1));
    mxfp8_moe_fwd_args f;
    mxfp8_moe_fwd_args_init(&f);
    f.hidden_states = X;
    f.expert_affinities_masked = mpv(m->a, F32, 2, T * E, 1, 0, 0);
    bwd_weights(m, c, 0, E, &f.gate_up_proj_weight, &f.down_proj_weight, &f.gate_up_weight_scales,
                &f.down_weight_scales, 0);
    f.token_position_to_id = mpv(m->tok, MXFP8_DTYPE_I32, 1, N * B, 0, 0, 0);
    f.block_to_expert = mpv(m->b2e, MXFP8_DTYPE_I32, 2, N, 1, 0, 0);
    f.block_size = B;
    f.config = cfg;
    if (c->bias) {
        f.gate_and_up_proj_bias = mpv(m->b1, F32, 3, E, 2, I, 0);
        f.down_proj_bias = mpv(m->b2, F32, 2, E, H, 0, 0);
    }
    mxfp8_moe_fwd_outputs o;
    memset(&o, 0, sizeof o);
    R->out = tu_alloc((size_t)(T * H + 1) * mxfp8_dtype_size(c->odt));
    o.output = mpv(R->out, c->odt, 2, T, H, 0, 0);
    o.gate_up_proj_act_checkpoint_T = mpv(ckg, F32, 4, N, 2, I, B);
    o.down_proj_output_checkpoint = mpv(ckd, F32, 3, N, B, H, 0);
    mxfp8_status st = mxfp8_moe_forward(&f, &o);
    CHECK(st == MXFP8_OK, "oracle forward: %s", mxfp8_last_error_message());
    mxfp8_moe_bwd_args b;
    mxfp8_moe_bwd_args_init(&b);
    b.hidden_states = X;
    b.expert_affinities_masked = f.expert_affinities_masked;
    bwd_weights(m, c, 0, E, &b.gate_up_proj_weight, &b.down_proj_weight, &b.gate_up_weight_scales,
                &b.down_weight_scales, 1);
    b.token_position_to_id = f.token_position_to_id;
    b.block_to_expert = f.block_to_expert;
    b.output_hidden_states_grad = dY;
    b.block_size = B;
    b.config = cfg;
    b.gate_and_up_proj_bias = f.gate_and_up_proj_bias;
    b.down_proj_bias = f.down_proj_bias;
    if (c->keep) {
        b.gate_up_proj_act_checkpoint_T = o.gate_up_proj_act_checkpoint_T;
        if (c->aff == MXFP8_AFFINITY_ON_H) b.down_proj_output_checkpoint = o.down_proj_output_checkpoint;
    }
    R->dx = copy_of(m->gdx, T * H, c->gdt);
    R->da = tu_alloc((size_t)(T * E + 1) * mxfp8_dtype_size(c->gdt));
    R->dW1 = copy_of(m->gW1, E * H * 2 * I, c->gdt);
    R->dW2 = copy_of(m->gW2, E * I * H, c->gdt);
    R->db1 = copy_of(m->gb1, E * 2 * I, c->gdt);
    R->db2 = copy_of(m->gb2, E * H, c->gdt);
    mxfp8_moe_bwd_grads g;
    memset(&g, 0, sizeof g);
    g.hidden_states_grad = mpv(R->dx, c->gdt, 2, T, H, 0, 0);
    g.expert_affinities_masked_grad = mpv(R->da, c->gdt, 2, T * E, 1, 0, 0);
    g.gate_up_proj_weight_grad = mpv(R->dW1, c->gdt, 4, E, H, 2, I);
    g.down_proj_weight_grad = mpv(R->dW2, c->gdt, 3, E, I, H, 0);
    if (c->bias) {
        g.gate_and_up_proj_bias_grad = mpv(R->db1, c->gdt, 3, E, 2, I, 0);
        g.down_proj_bias_grad = mpv(R->db2, c->gdt, 2, E, H, 0, 0);
    }
    st = mxfp8_moe_backward(&b, &g);
    CHECK(st == MXFP8_OK, "oracle backward: %s", mxfp8_last_error_message());
    free(ckg);
    free(ckd);
}

/* Bitwise comparison of n elements; reports the first difference. */
static void same(const char *what, const void *got, const void *want, int64_t n, mxfp8_dtype dt, const char *cname) {
    const size_t es = mxfp8_dtype_size(dt);
    for (int64_t i = 0; i < n; i++)
        if (memcmp((const char *)got + i * es, (const char *)want + i * es, es)) {
            CHECK(0, "[%s] %s: element %lld of %lld differs from the single-process result", cname, what,
                  (long long)i, (long long)n);
            return;
        }
    g_checks++;
}

static mxfp8_status ep_forward(const mp *m, const tcase *c, const mxfp8_moe_config *cfg, void *out, int64_t ostride,
                               mxfp8_mpi_moe_context **ctx, mxfp8_mpi_moe_stats *st) {
    int64_t e0, Er;
    mxfp8_mpi_moe_expert_range(m->E, g_size, g_rank, &e0, &Er);
    const int64_t o = m->off[g_rank], Tr = m->off[g_rank + 1] - o, H = m->H, I = m->I, K = m->K, E = m->E;
    mxfp8_mpi_moe_fwd_args a;
    mxfp8_mpi_moe_fwd_args_init(&a);
    a.comm = MPI_COMM_WORLD;
    a.num_experts = E;
    a.hidden_states = mpv(mp_at(m->X, c->xdt, o * H), c->xdt, 2, Tr, H, 0, 0);
    if (c->by_affinities) {
        a.expert_affinities_masked = mpv(m->a + o * E, F32, 2, Tr * E, 1, 0, 0);
    } else {
        a.topk_ids = mpv(m->ids + o * K, MXFP8_DTYPE_I32, 2, Tr, K, 0, 0);
        a.topk_weights = mpv(m->wts + o * K, F32, 2, Tr, K, 0, 0);
    }
    bwd_weights(m, c, e0, Er, &a.gate_up_proj_weight, &a.down_proj_weight, &a.gate_up_weight_scales,
                &a.down_weight_scales, 0);
    if (c->bias) {
        a.gate_and_up_proj_bias = mpv(m->b1 + e0 * 2 * I, F32, 3, Er, 2, I, 0);
        a.down_proj_bias = mpv(m->b2 + e0 * H, F32, 2, Er, H, 0, 0);
    }
    a.block_size = m->B;
    a.config = cfg;
    a.wire = c->wire;
    a.keep_checkpoints = c->keep;
    mxfp8_tensor ov = mpv(out, c->odt, 2, Tr, H, 0, 0);
    ov.strides[0] = ostride; /* a padded output row: the library writes through the strides */
    return mxfp8_mpi_moe_forward(&a, &ov, ctx, st);
}

static void run_case(int ci, const tcase *c) {
    mp m;
    mp_make(&m, c, g_size, 1000 + (uint64_t)ci);
    mxfp8_moe_config cfg;
    mp_config(c, &cfg);
    mxfp8_set_num_threads(2);
    ref R;
    run_ref(&m, c, &cfg, &R);
    mxfp8_set_num_threads(1 + (g_rank + ci) % 2);

    int64_t e0, Er;
    mxfp8_mpi_moe_expert_range(m.E, g_size, g_rank, &e0, &Er);
    const int64_t o = m.off[g_rank], Tr = m.off[g_rank + 1] - o, H = m.H, I = m.I, K = m.K, E = m.E;
    const size_t os = mxfp8_dtype_size(c->odt), gs = mxfp8_dtype_size(c->gdt);
    /* forward (output rows padded by 3 elements, filled with 0xA5 bytes) */
    char *out = tu_alloc((size_t)(Tr * (H + 3) + 1) * os);
    memset(out, 0xA5, (size_t)(Tr * (H + 3) + 1) * os);
    mxfp8_mpi_moe_context *ctx = NULL;
    mxfp8_mpi_moe_stats fs, bs;
    unsigned csr = c->ftz ? caller_csr(1, 0) : 0;
    mxfp8_status st = ep_forward(&m, c, &cfg, out, H + 3, &ctx, &fs);
    if (c->ftz) caller_csr(0, csr);
    CHECK(st == MXFP8_OK && ctx, "[%s] forward: %s", c->name, mxfp8_mpi_last_error_message());
    for (int64_t t = 0; t < Tr; t++) {
        same("output row", out + (size_t)(t * (H + 3)) * os, mp_at(R.out, c->odt, (o + t) * H), H, c->odt, c->name);
        for (int64_t h = H; h < H + 3; h++)
            CHECK((unsigned char)out[(size_t)(t * (H + 3) + h) * os] == 0xA5, "[%s] padding written", c->name);
    }
    /* the same forward again, for inference (no context), on the other thread count */
    mxfp8_set_num_threads(2 - (g_rank + ci) % 2);
    char *out2 = tu_alloc((size_t)(Tr * H + 1) * os);
    if (c->ftz) csr = caller_csr(1, 0);
    st = ep_forward(&m, c, &cfg, out2, H, NULL, NULL);
    if (c->ftz) caller_csr(0, csr);
    CHECK(st == MXFP8_OK, "[%s] inference forward: %s", c->name, mxfp8_mpi_last_error_message());
    same("inference output", out2, mp_at(R.out, c->odt, o * H), Tr * H, c->odt, c->name);
    CHECK(mxfp8_mpi_moe_context_bytes(ctx) > 0, "[%s] context bytes", c->name);

    /* backward */
    void *dx = copy_of(mp_at(m.gdx, c->gdt, o * H), Tr * H, c->gdt);
    void *da = tu_alloc((size_t)(Tr * E + 1) * gs), *dk = tu_alloc((size_t)(Tr * K + 1) * gs);
    void *dW1 = copy_of(mp_at(m.gW1, c->gdt, e0 * H * 2 * I), Er * H * 2 * I, c->gdt);
    void *dW2 = copy_of(mp_at(m.gW2, c->gdt, e0 * I * H), Er * I * H, c->gdt);
    void *db1 = copy_of(mp_at(m.gb1, c->gdt, e0 * 2 * I), Er * 2 * I, c->gdt);
    void *db2 = copy_of(mp_at(m.gb2, c->gdt, e0 * H), Er * H, c->gdt);
    mxfp8_mpi_moe_bwd_args b;
    mxfp8_mpi_moe_bwd_args_init(&b);
    b.context = ctx;
    b.output_hidden_states_grad = mpv(mp_at(m.dY, c->xdt, o * H), c->xdt, 2, Tr, H, 0, 0);
    bwd_weights(&m, c, e0, Er, &b.gate_up_proj_weight, &b.down_proj_weight, &b.gate_up_weight_scales,
                &b.down_weight_scales, 1);
    if (c->bias) {
        b.gate_and_up_proj_bias = mpv(m.b1 + e0 * 2 * I, F32, 3, Er, 2, I, 0);
        b.down_proj_bias = mpv(m.b2 + e0 * H, F32, 2, Er, H, 0, 0);
    }
    mxfp8_mpi_moe_bwd_grads g;
    memset(&g, 0, sizeof g);
    g.hidden_states_grad = mpv(dx, c->gdt, 2, Tr, H, 0, 0);
    g.expert_affinities_masked_grad = mpv(da, c->gdt, 1, Tr * E, 0, 0, 0);
    if (!c->by_affinities) g.topk_weights_grad = mpv(dk, c->gdt, 2, Tr, K, 0, 0);
    g.gate_up_proj_weight_grad = mpv(dW1, c->gdt, 4, Er, H, 2, I);
    g.down_proj_weight_grad = mpv(dW2, c->gdt, 3, Er, I, H, 0);
    if (c->bias) {
        g.gate_and_up_proj_bias_grad = mpv(db1, c->gdt, 3, Er, 2, I, 0);
        g.down_proj_bias_grad = mpv(db2, c->gdt, 2, Er, H, 0, 0);
    }
    if (c->ftz) csr = caller_csr(1, 0);
    st = mxfp8_mpi_moe_backward(&b, &g, &bs);
    if (c->ftz) caller_csr(0, csr);
    CHECK(st == MXFP8_OK, "[%s] backward: %s", c->name, mxfp8_mpi_last_error_message());
    same("hidden_states_grad", dx, mp_at(R.dx, c->gdt, o * H), Tr * H, c->gdt, c->name);
    same("expert_affinities_masked_grad", da, mp_at(R.da, c->gdt, o * E), Tr * E, c->gdt, c->name);
    if (!c->by_affinities)
        for (int64_t t = 0; t < Tr; t++)
            for (int64_t k = 0; k < K; k++)
                same("topk_weights_grad", mp_at(dk, c->gdt, t * K + k),
                     mp_at(R.da, c->gdt, (o + t) * E + m.ids[(o + t) * K + k]), 1, c->gdt, c->name);
    same("gate_up_proj_weight_grad", dW1, mp_at(R.dW1, c->gdt, e0 * H * 2 * I), Er * H * 2 * I, c->gdt, c->name);
    same("down_proj_weight_grad", dW2, mp_at(R.dW2, c->gdt, e0 * I * H), Er * I * H, c->gdt, c->name);
    if (c->bias) {
        same("gate_and_up_proj_bias_grad", db1, mp_at(R.db1, c->gdt, e0 * 2 * I), Er * 2 * I, c->gdt, c->name);
        same("down_proj_bias_grad", db2, mp_at(R.db2, c->gdt, e0 * H), Er * H, c->gdt, c->name);
    }
    /* traffic: what all ranks sent equals what all received */
    int64_t tr[4] = {fs.dispatch_bytes_sent - fs.dispatch_bytes_received, fs.combine_bytes_sent - fs.combine_bytes_received,
                     bs.dispatch_bytes_sent - bs.dispatch_bytes_received, bs.combine_bytes_sent - bs.combine_bytes_received};
    int64_t sum[4];
    MPI_Allreduce(tr, sum, 4, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    CHECK(!sum[0] && !sum[1] && !sum[2] && !sum[3], "[%s] bytes sent != bytes received over all ranks", c->name);
    CHECK(fs.local_pairs == bs.local_pairs && fs.rows_sent == bs.rows_sent, "[%s] stats", c->name);

    mxfp8_mpi_moe_context_free(ctx);
    free(out); free(out2); free(dx); free(da); free(dk); free(dW1); free(dW2); free(db1); free(db2);
    free(R.out); free(R.dx); free(R.da); free(R.dW1); free(R.dW2); free(R.db1); free(R.db2);
    mp_free(&m);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    const int nc = (int)(sizeof k_cases / sizeof k_cases[0]);
    for (int ci = 0; ci < nc; ci++) {
        const long before = g_fail;
        run_case(ci, &k_cases[ci]);
        long bad = g_fail - before, all = 0;
        MPI_Allreduce(&bad, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (g_rank == 0) printf("%-4s P=%d  %s\n", all ? "FAIL" : "ok", g_size, k_cases[ci].name);
    }
    long all = 0, checks = 0;
    MPI_Allreduce(&g_fail, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&g_checks, &checks, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0) printf("test_mpi_moe (%d ranks): %ld checks, %ld failed\n", g_size, checks, all);
    MPI_Finalize();
    return all ? 1 : 0;
}
