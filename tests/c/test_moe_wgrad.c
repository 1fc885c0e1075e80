/*
 * test_moe_wgrad.c -- the MoE backward's two weight-gradient paths and the padding of partial blocks:
 *   1. the segmented weight gradients (an expert's blocks added per register tile of C; chosen by size, forced
 *      here on problems of every size) are bitwise
 *      equal to the per-block path (mxfp8i_moe_set_segmented_wgrad(0): one GEMM per block and phase, the path the
 *      contract is written in) for every gradient and every operand statistic, over activations, both affinity
 *      options, biases, stochastic rounding of every operand, statistics, experts with no tokens, single-block and
 *      many-block experts, 1 and 2 threads; and match the tests' independent FP64 oracle (tests/c/oracle/moe.c);
 *   2. NaN in the checkpoints' padding positions (inside a partial block and after its last real position)
 *      changes no bit of the backward;
 *   3. MXFP8_ISA=scalar gives the same bits as the default path (this test runs itself again under it);
 *   4. on a problem whose per-block elementwise work splits between threads: the forward's output and every
 *      checkpoint, and the backward from those checkpoints, are the same bits on 1 and 2 threads;
 *   5. runs of blocks (consecutive full blocks of one expert stacked; chosen by size, forced here) give the bits of
 *      block by block: the forward's output, checkpoints and statistics (and the output when no checkpoint is
 *      asked for), the backward's gradients and statistics from the checkpoints and recomputing them, on both
 *      weight-gradient paths, with the oracle's values; also where a partial block precedes a full one of its
 *      expert (a run must end there) and a full block holds padding;
 *   6. Phase 4 reading a BF16 scaled-intermediate checkpoint in place (blocks without padding inside) gives the
 *      bits of the transposed F32 copy of the same values, NaN in the padding positions changing nothing;
 *   7. the gate/up checkpoint in positions-major memory (mxfp8.torch's layout): the forward writes the same values,
 *      the backward from it (F32 or BF16) gives the same bits as from the contiguous checkpoint;
 *   8. the forward's and the backward's expert-parallel paths (forced, 1-3 threads) give the serial walks' bits.
 */
#include <unistd.h>

#include "moe_util.h"

int mxfp8i_moe_set_segmented_wgrad(int mode); /* src/ops/moe/bwd_state.h (test-only: -1 by size, 0, 1) */
int mxfp8i_moe_set_block_runs(int mode);       /* src/ops/moe/moe.h (test-only: -1 by size, 0, 1) */

#define NOPS MXFP8_MOE_NUM_OPERANDS

static int stats_equal(const mxfp8_quant_stats *a, const mxfp8_quant_stats *b) {
    if (a->elements != b->elements || a->groups != b->groups || a->saturated != b->saturated ||
        a->flushed_to_zero != b->flushed_to_zero || a->subnormal != b->subnormal ||
        a->nonfinite_groups != b->nonfinite_groups || a->zero_groups != b->zero_groups)
        return 0;
    for (int i = 0; i < 256; i++)
        if (a->scale_histogram[i] != b->scale_histogram[i]) return 0;
    return !memcmp(&a->sum_sq_error, &b->sum_sq_error, sizeof(double)) &&
           !memcmp(&a->sum_sq_signal, &b->sum_sq_signal, sizeof(double));
}

/* One backward on the chosen path and thread count, with statistics when st != NULL, into gradients of dtype dt. */
static void backward_dt(const prob *P, const mxfp8_moe_config *cfg, int segmented, int nt, grads *G,
                        mxfp8_quant_stats *st, mxfp8_dtype dt) {
    mxfp8_moe_bwd_args A;
    bwd_args(P, cfg, &A);
    A.stats = st;
    grads_make(G, P, dt, cfg->bias);
    mxfp8i_moe_set_segmented_wgrad(segmented);
    mxfp8_set_num_threads(nt);
    mxfp8_status s = mxfp8_moe_backward(&A, &G->g);
    mxfp8_set_num_threads(0);
    mxfp8i_moe_set_segmented_wgrad(-1);
    CHECK(s == MXFP8_OK, "backward: %s", mxfp8_last_error_message());
}
static void backward(const prob *P, const mxfp8_moe_config *cfg, int segmented, int nt, grads *G,
                     mxfp8_quant_stats *st) {
    backward_dt(P, cfg, segmented, nt, G, st, MXFP8_DTYPE_F32);
}

/* The problems: several partial blocks per expert; an expert with no tokens (K = 1, forced counts) next to a
 * one-block and a many-block expert; one large enough that the segmented GEMMs split between threads. */
static void make_problem(prob *P, int which) {
    static const int64_t counts[3] = {37, 0, 75};
    if (which == 0) prob_make(P, 70, 40, 48, 3, 2, 16, 1, NULL);      /* H, I not multiples of 32 */
    else if (which == 1) prob_make(P, 112, 64, 32, 3, 1, 16, 1, counts);
    else prob_make(P, 300, 128, 128, 4, 2, 32, 1, NULL);
}

/* The layer's config of the equality tests: activation, affinity option, biases, clamps on both projections, and
 * stochastic rounding of every operand with `seed` when sr. */
static mxfp8_moe_config layer_config(int act, int aff, int bias, int sr, unsigned seed) {
    mxfp8_moe_config cfg;
    mxfp8_moe_config_init(&cfg);
    cfg.activation = (mxfp8_activation)act;
    cfg.affinity_option = (mxfp8_affinity_option)aff;
    cfg.bias = bias;
    cfg.gate_clamp_upper = 0.5f;
    cfg.up_clamp_lower = -0.3f;
    if (sr) {
        cfg.stochastic_rounding = (1u << NOPS) - 1; /* every operand */
        cfg.rounding_seed = seed;
    }
    return cfg;
}

static void test_paths_equal(void) {
    int configs = 0;
    for (int which = 0; which < 3; which++) {
        prob P;
        make_problem(&P, which);
        for (int act = 0; act < 3; act++)
            for (int aff = 0; aff < 2; aff++)
                for (int bias = 0; bias < 2; bias++)
                    for (int sr = 0; sr < 2; sr++) {
                        if (which == 2 && act != 0) continue; /* the large problem: one activation */
                        mxfp8_moe_config cfg = layer_config(act, aff, bias, sr, 12345u + (unsigned)act);
                        /* every format and scale rule (each operand carries its recipe, on either path) */
                        cfg.quant_dtype = (act + aff) % 2 ? MXFP8_FMT_E5M2 : MXFP8_FMT_E4M3;
                        cfg.scale_rule = (mxfp8_scale_rule)((act + aff + bias) % 3);
                        const size_t ns = (size_t)(P.E * NOPS);
                        mxfp8_quant_stats *s1 = xc(ns * sizeof *s1), *s0 = xc(ns * sizeof *s0);
                        grads seg, blk;
                        backward(&P, &cfg, 1, 2, &seg, s1);
                        backward(&P, &cfg, 0, 1, &blk, s0);
                        char what[128];
                        snprintf(what, sizeof what, "problem %d act %d aff %d bias %d sr %d: segmented vs per block",
                                 which, act, aff, bias, sr);
                        grads_bitwise(&seg, &blk, bias, what);
                        int sbad = 0;
                        for (size_t i = 0; i < ns; i++) sbad += !stats_equal(&s1[i], &s0[i]);
                        CHECK(sbad == 0, "%s: %d operand statistics differ", what, sbad);
                        /* and the statistics were taken (the P3 / P4 operands of a routed expert) */
                        CHECK(s1[MXFP8_MOE_P3_X].elements > 0 && s1[MXFP8_MOE_P4_DY].elements > 0,
                              "%s: no Phase 3 / 4 statistics", what);
                        if (!sr) check_vs_oracle(&seg, &P, &cfg, what);
                        /* the segmented path on 1 thread, the per-block path on 2: the same bits */
                        grads seg1, blk2;
                        backward(&P, &cfg, 1, 1, &seg1, NULL);
                        backward(&P, &cfg, 0, 2, &blk2, NULL);
                        grads_bitwise(&seg1, &seg, bias, "segmented, 1 vs 2 threads");
                        grads_bitwise(&blk2, &blk, bias, "per block, 2 vs 1 threads");
                        /* BF16 gradients (the segmented GEMMs round experts 0..E-2 straight into the staging
                           copy); with skip_grad_initialization (given values added: the FP32 accumulator path) */
                        for (int skip = 0; skip < 2; skip++) {
                            mxfp8_moe_config c2 = cfg;
                            c2.skip_grad_initialization = skip;
                            grads s16, b16;
                            backward_dt(&P, &c2, 1, 2, &s16, NULL, MXFP8_DTYPE_BF16);
                            backward_dt(&P, &c2, 0, 1, &b16, NULL, MXFP8_DTYPE_BF16);
                            if (skip) { /* the same given values in both before the calls: redo with them */
                                grads_free(&s16); grads_free(&b16);
                                grads_make(&s16, &P, MXFP8_DTYPE_BF16, bias);
                                grads_make(&b16, &P, MXFP8_DTYPE_BF16, bias);
                                for (int k = 0; k < 6; k++)
                                    for (size_t i = 0; i < s16.n[k]; i++)
                                        ((uint16_t *)s16.p[k])[i] = ((uint16_t *)b16.p[k])[i] =
                                            (uint16_t)(0x3c00u + (i * 37u) % 512u); /* values near 2^-7 .. 1 */
                                mxfp8_moe_bwd_args A2;
                                bwd_args(&P, &c2, &A2);
                                mxfp8i_moe_set_segmented_wgrad(1);
                                CHECK(mxfp8_moe_backward(&A2, &s16.g) == MXFP8_OK, "%s", mxfp8_last_error_message());
                                mxfp8i_moe_set_segmented_wgrad(0);
                                CHECK(mxfp8_moe_backward(&A2, &b16.g) == MXFP8_OK, "%s", mxfp8_last_error_message());
                                mxfp8i_moe_set_segmented_wgrad(-1);
                            }
                            grads_bitwise(&s16, &b16, bias, skip ? "BF16 gradients, given values added: segmented vs per block"
                                                                 : "BF16 gradients: segmented vs per block");
                            grads_free(&s16); grads_free(&b16);
                        }
                        grads_free(&seg); grads_free(&blk); grads_free(&seg1); grads_free(&blk2);
                        free(s1); free(s0);
                        configs++;
                    }
        if (which == 1) { /* the expert with no tokens gets exactly zero weight gradients */
            mxfp8_moe_config cfg;
            mxfp8_moe_config_init(&cfg);
            grads g;
            backward(&P, &cfg, 1, 2, &g, NULL);
            const size_t n1 = (size_t)(P.H * 2 * P.I), n2 = (size_t)(P.I * P.H);
            int nz = 0;
            for (size_t i = 0; i < n1; i++) nz += ((float *)g.p[2])[n1 + i] != 0.0f;
            for (size_t i = 0; i < n2; i++) nz += ((float *)g.p[3])[n2 + i] != 0.0f;
            CHECK(nz == 0, "expert 1 (no tokens): %d nonzero weight-gradient elements", nz);
            grads_free(&g);
        }
        prob_free(&P);
    }
    printf("segmented vs per-block weight gradients: %d configurations bitwise equal\n", configs);
}

/* NaN in every padding position of every checkpoint changes nothing. */
static void test_nan_padding(void) {
    prob P;
    make_problem(&P, 1); /* partial blocks, and an expert with no tokens */
    for (int aff = 0; aff < 2; aff++) {
        mxfp8_moe_config cfg;
        mxfp8_moe_config_init(&cfg);
        cfg.affinity_option = (mxfp8_affinity_option)aff;
        cfg.bias = 1;
        const int64_t N = P.N, B = P.B, I = P.I, H = P.H;
        const size_t ngu = (size_t)(N * 2 * I * B), nib = (size_t)(N * I * B), nbh = (size_t)(N * B * H);
        float *ck[6] = {xc(sizeof(float) * ngu), xc(sizeof(float) * nib), xc(sizeof(float) * nib),
                        xc(sizeof(float) * nib), xc(sizeof(float) * nbh), xc(sizeof(float) * nbh)};
        float *out = xc(sizeof(float) * P.T * H);
        mxfp8_moe_fwd_args F;
        fwd_args(&P, &cfg, &F);
        mxfp8_moe_fwd_outputs O = {0};
        O.output = v2(out, MXFP8_DTYPE_F32, P.T, H);
        O.gate_up_proj_act_checkpoint_T = v4(ck[0], MXFP8_DTYPE_F32, N, 2, I, B);
        O.gate_act_checkpoint_T = v3(ck[1], MXFP8_DTYPE_F32, N, I, B);
        O.intermediate_checkpoint_T = v3(ck[2], MXFP8_DTYPE_F32, N, I, B);
        O.scaled_intermediate_checkpoint_T = v3(ck[3], MXFP8_DTYPE_F32, N, I, B);
        O.down_proj_output_checkpoint = v3(ck[4], MXFP8_DTYPE_F32, N, B, H);
        CHECK(mxfp8_moe_forward(&F, &O) == MXFP8_OK, "forward: %s", mxfp8_last_error_message());
        for (int64_t n = 0; n < N; n++) /* down_proj_act_checkpoint = a * dY (0 at padding, overwritten below) */
            for (int64_t q = 0; q < B; q++) {
                const int32_t t = P.tok[n * B + q];
                for (int64_t h = 0; h < H; h++)
                    ck[5][(n * B + q) * H + h] = t >= 0 ? P.a[t * P.E + P.b2e[n]] * P.dY[t * H + h] : 0.0f;
            }
        mxfp8_moe_bwd_args A;
        bwd_args(&P, &cfg, &A);
        A.gate_up_proj_act_checkpoint_T = O.gate_up_proj_act_checkpoint_T;
        A.gate_act_checkpoint_T = O.gate_act_checkpoint_T;
        A.intermediate_checkpoint_T = O.intermediate_checkpoint_T;
        A.scaled_intermediate_checkpoint_T = O.scaled_intermediate_checkpoint_T;
        A.down_proj_output_checkpoint = O.down_proj_output_checkpoint;
        A.down_proj_act_checkpoint = v3(ck[5], MXFP8_DTYPE_F32, N, B, H);
        for (int segmented = 0; segmented < 2; segmented++) {
            grads clean, dirty;
            grads_make(&clean, &P, MXFP8_DTYPE_F32, 1);
            grads_make(&dirty, &P, MXFP8_DTYPE_F32, 1);
            mxfp8i_moe_set_segmented_wgrad(segmented);
            CHECK(mxfp8_moe_backward(&A, &clean.g) == MXFP8_OK, "backward: %s", mxfp8_last_error_message());
            /* NaN into every padding position (a copy restores the clean checkpoints afterwards) */
            float *keep[6];
            const size_t len[6] = {ngu, nib, nib, nib, nbh, nbh};
            int64_t npad = 0;
            for (int c = 0; c < 6; c++) {
                keep[c] = xc(sizeof(float) * len[c]);
                memcpy(keep[c], ck[c], sizeof(float) * len[c]);
            }
            for (int64_t n = 0; n < N; n++)
                for (int64_t q = 0; q < B; q++) {
                    if (P.tok[n * B + q] >= 0) continue;
                    npad++;
                    for (int64_t i = 0; i < I; i++) {
                        ck[0][((n * 2 + 0) * I + i) * B + q] = NAN;
                        ck[0][((n * 2 + 1) * I + i) * B + q] = NAN;
                        for (int c = 1; c < 4; c++) ck[c][(n * I + i) * B + q] = NAN;
                    }
                    for (int64_t h = 0; h < H; h++) ck[4][(n * B + q) * H + h] = ck[5][(n * B + q) * H + h] = NAN;
                }
            CHECK(npad > 0, "the problem has no padding positions");
            CHECK(mxfp8_moe_backward(&A, &dirty.g) == MXFP8_OK, "backward: %s", mxfp8_last_error_message());
            mxfp8i_moe_set_segmented_wgrad(-1);
            char what[96];
            snprintf(what, sizeof what, "affinity %d, segmented %d: NaN in %lld padding positions", aff, segmented,
                     (long long)npad);
            grads_bitwise(&dirty, &clean, 1, what);
            CHECK(grads_finite(&dirty, 1), "%s: non-finite gradient", what);
            for (int c = 0; c < 6; c++) {
                memcpy(ck[c], keep[c], sizeof(float) * len[c]);
                free(keep[c]);
            }
            grads_free(&clean); grads_free(&dirty);
        }
        for (int c = 0; c < 6; c++) free(ck[c]);
        free(out);
    }
    prob_free(&P);
}

/* Forward (all checkpoints) and backward from them, 1 vs 2 threads, blocks large enough that their elementwise
 * work, scatters and checkpoint writes split between threads. */
static void test_threads_split(void) {
    prob P;
    prob_make(&P, 200, 256, 256, 2, 1, 128, 1, NULL);
    for (int aff = 0; aff < 2; aff++) {
        mxfp8_moe_config cfg;
        mxfp8_moe_config_init(&cfg);
        cfg.affinity_option = (mxfp8_affinity_option)aff;
        cfg.bias = 1;
        const int64_t N = P.N, B = P.B, I = P.I, H = P.H;
        const size_t len[6] = {(size_t)(P.T * H), (size_t)(N * 2 * I * B), (size_t)(N * I * B), (size_t)(N * I * B),
                               (size_t)(N * I * B), (size_t)(N * B * H)};
        float *o[2][6];
        grads g[2];
        for (int r = 0; r < 2; r++) {
            for (int c = 0; c < 6; c++) o[r][c] = xc(sizeof(float) * len[c]);
            mxfp8_moe_fwd_args F;
            fwd_args(&P, &cfg, &F);
            mxfp8_moe_fwd_outputs O = {0};
            O.output = v2(o[r][0], MXFP8_DTYPE_F32, P.T, H);
            O.gate_up_proj_act_checkpoint_T = v4(o[r][1], MXFP8_DTYPE_F32, N, 2, I, B);
            O.gate_act_checkpoint_T = v3(o[r][2], MXFP8_DTYPE_F32, N, I, B);
            O.intermediate_checkpoint_T = v3(o[r][3], MXFP8_DTYPE_F32, N, I, B);
            O.scaled_intermediate_checkpoint_T = v3(o[r][4], MXFP8_DTYPE_F32, N, I, B);
            O.down_proj_output_checkpoint = v3(o[r][5], MXFP8_DTYPE_F32, N, B, H);
            mxfp8_set_num_threads(r + 1);
            CHECK(mxfp8_moe_forward(&F, &O) == MXFP8_OK, "forward: %s", mxfp8_last_error_message());
            mxfp8_moe_bwd_args A;
            bwd_args(&P, &cfg, &A);
            A.gate_up_proj_act_checkpoint_T = O.gate_up_proj_act_checkpoint_T;
            A.gate_act_checkpoint_T = O.gate_act_checkpoint_T;
            A.intermediate_checkpoint_T = O.intermediate_checkpoint_T;
            A.scaled_intermediate_checkpoint_T = O.scaled_intermediate_checkpoint_T;
            A.down_proj_output_checkpoint = O.down_proj_output_checkpoint;
            grads_make(&g[r], &P, MXFP8_DTYPE_F32, 1);
            CHECK(mxfp8_moe_backward(&A, &g[r].g) == MXFP8_OK, "backward: %s", mxfp8_last_error_message());
            mxfp8_set_num_threads(0);
        }
        static const char *nm[6] = {"output", "gate_up_proj_act_checkpoint_T", "gate_act_checkpoint_T",
                                    "intermediate_checkpoint_T", "scaled_intermediate_checkpoint_T",
                                    "down_proj_output_checkpoint"};
        for (int c = 0; c < 6; c++)
            CHECK(!memcmp(o[0][c], o[1][c], sizeof(float) * len[c]), "affinity %d: forward %s, 1 vs 2 threads", aff,
                  nm[c]);
        grads_bitwise(&g[0], &g[1], 1, "backward from the forward's checkpoints, 1 vs 2 threads");
        check_vs_oracle(&g[1], &P, &cfg, "backward from the forward's checkpoints");
        for (int r = 0; r < 2; r++) {
            for (int c = 0; c < 6; c++) free(o[r][c]);
            grads_free(&g[r]);
        }
    }
    prob_free(&P);
}

/* The gate/up, gate activation, intermediate and scaled intermediate checkpoints of O as F32 views of o[1..4]
 * ([N, 2, I, B], [N, I, B] x 3: positions innermost). */
static void ck_views(const prob *P, mxfp8_moe_fwd_outputs *O, float *const *o) {
    const int64_t N = P->N, B = P->B, I = P->I;
    O->gate_up_proj_act_checkpoint_T = v4(o[1], MXFP8_DTYPE_F32, N, 2, I, B);
    O->gate_act_checkpoint_T = v3(o[2], MXFP8_DTYPE_F32, N, I, B);
    O->intermediate_checkpoint_T = v3(o[3], MXFP8_DTYPE_F32, N, I, B);
    O->scaled_intermediate_checkpoint_T = v3(o[4], MXFP8_DTYPE_F32, N, I, B);
}

/* One forward (runs forced on or off) on nt threads: output, and every checkpoint when ck (F32 views, allocated
 * here into o[0..5]), with statistics into st when not NULL. */
enum { NOUT = 6 };
static void forward_runs(const prob *P, const mxfp8_moe_config *cfg, int runs, int nt, int ck, float *o[NOUT],
                         mxfp8_quant_stats *st, size_t len[NOUT]) {
    const int64_t N = P->N, B = P->B, I = P->I, H = P->H;
    const size_t l[NOUT] = {(size_t)(P->T * H), (size_t)(N * 2 * I * B), (size_t)(N * I * B), (size_t)(N * I * B),
                            (size_t)(N * I * B), (size_t)(N * B * H)};
    for (int c = 0; c < NOUT; c++) len[c] = l[c], o[c] = xc(sizeof(float) * l[c]);
    mxfp8_moe_fwd_args F;
    fwd_args(P, cfg, &F);
    F.stats = st;
    mxfp8_moe_fwd_outputs O = {0};
    O.output = v2(o[0], MXFP8_DTYPE_F32, P->T, H);
    if (ck) {
        ck_views(P, &O, o);
        O.down_proj_output_checkpoint = v3(o[5], MXFP8_DTYPE_F32, N, B, H);
    }
    mxfp8i_moe_set_block_runs(runs);
    mxfp8_set_num_threads(nt);
    CHECK(mxfp8_moe_forward(&F, &O) == MXFP8_OK, "forward: %s", mxfp8_last_error_message());
    mxfp8_set_num_threads(0);
    mxfp8i_moe_set_block_runs(-1);
}

/* Runs of blocks (consecutive full blocks of one expert stacked, chosen by size, forced here) against block by
 * block: the forward's output, checkpoints and statistics, and the backward's gradients and statistics (from the
 * checkpoints, and recomputing them; both weight-gradient paths) are the same bits, over activations, both
 * affinity options, biases, stochastic rounding of every operand, an expert with no tokens; and the oracle's values. */
/* Padding inside an expert's blocks: the last position of its first full block that a full block of the same
 * expert follows (so that block is partial and a run must end with it) and one position in the middle of the next. */
static void punch_padding(prob *P) {
    for (int64_t n = 0; n + 1 < P->N; n++)
        if (P->b2e[n] == P->b2e[n + 1] && P->tok[n * P->B + P->B - 1] != P->pad &&
            P->tok[(n + 1) * P->B + P->B - 1] != P->pad) {
            P->tok[n * P->B + P->B - 1] = P->pad;
            P->tok[(n + 1) * P->B + P->B / 2] = P->pad;
            return;
        }
    CHECK(0, "no expert with two full blocks to punch");
}

static void test_runs_equal(void) {
    int configs = 0;
    for (int which = 0; which < 5; which++) {
        prob P;
        if (which == 4) { /* B = 24: the backward's 16-position spans of deferred checkpoint reads cross blocks */
            const uint64_t keep = g_rng; /* (the later tests' problems stay the ones their tolerances were set on) */
            prob_make(&P, 70, 40, 48, 3, 2, 24, 1, NULL);
            g_rng = keep;
        } else {
            make_problem(&P, which == 3 ? 0 : which);
        }
        if (which == 3) punch_padding(&P); /* a partial block before a full one of its expert */
        for (int act = 0; act < 4; act++)
            for (int aff = 0; aff < 2; aff++)
                for (int bias = 0; bias < 2; bias++)
                    for (int sr = 0; sr < 2; sr++) {
                        if (which >= 2 && (act != 0 || bias != sr)) continue; /* fewer for these two */
                        const mxfp8_moe_config cfg = layer_config(act, aff, bias, sr, 777u + (unsigned)act);
                        char what[160];
                        snprintf(what, sizeof what, "problem %d act %d aff %d bias %d sr %d: runs vs blocks", which,
                                 act, aff, bias, sr);
                        const size_t ns = (size_t)(P.E * NOPS);
                        float *on[NOUT], *off[NOUT], *lean[NOUT];
                        size_t len[NOUT];
                        mxfp8_quant_stats *fs1 = xc(ns * sizeof *fs1), *fs0 = xc(ns * sizeof *fs0);
                        forward_runs(&P, &cfg, 1, 2, 1, on, fs1, len);
                        forward_runs(&P, &cfg, 0, 1, 1, off, fs0, len);
                        forward_runs(&P, &cfg, 1, 2, 0, lean, NULL, len); /* output only: g, u, act not kept */
                        int bad = 0;
                        for (int c = 0; c < NOUT; c++) bad += memcmp(on[c], off[c], sizeof(float) * len[c]) != 0;
                        bad += memcmp(lean[0], off[0], sizeof(float) * len[0]) != 0;
                        for (size_t i = 0; i < ns; i++) bad += !stats_equal(&fs1[i], &fs0[i]);
                        CHECK(bad == 0, "%s: %d forward outputs / checkpoints / statistics differ", what, bad);
                        for (int ck = 0; ck < 2; ck++)
                            for (int seg = 0; seg < 2; seg++) {
                                mxfp8_moe_bwd_args A[2];
                                grads g[2];
                                mxfp8_quant_stats *bs[2] = {xc(ns * sizeof *bs[0]), xc(ns * sizeof *bs[1])};
                                for (int r = 0; r < 2; r++) {
                                    bwd_args(&P, &cfg, &A[r]);
                                    A[r].stats = bs[r];
                                    if (ck) {
                                        const int64_t N = P.N, B = P.B, I = P.I, H = P.H;
                                        A[r].gate_up_proj_act_checkpoint_T = v4(off[1], MXFP8_DTYPE_F32, N, 2, I, B);
                                        A[r].gate_act_checkpoint_T = v3(off[2], MXFP8_DTYPE_F32, N, I, B);
                                        A[r].intermediate_checkpoint_T = v3(off[3], MXFP8_DTYPE_F32, N, I, B);
                                        A[r].scaled_intermediate_checkpoint_T = v3(off[4], MXFP8_DTYPE_F32, N, I, B);
                                        A[r].down_proj_output_checkpoint = v3(off[5], MXFP8_DTYPE_F32, N, B, H);
                                    }
                                    grads_make(&g[r], &P, MXFP8_DTYPE_F32, bias);
                                    mxfp8i_moe_set_block_runs(r == 0);
                                    mxfp8i_moe_set_segmented_wgrad(seg);
                                    mxfp8_set_num_threads(r == 0 ? 2 : 1);
                                    CHECK(mxfp8_moe_backward(&A[r], &g[r].g) == MXFP8_OK, "backward: %s",
                                          mxfp8_last_error_message());
                                    mxfp8_set_num_threads(0);
                                    mxfp8i_moe_set_segmented_wgrad(-1);
                                    mxfp8i_moe_set_block_runs(-1);
                                }
                                char w2[256];
                                snprintf(w2, sizeof w2, "%s, backward %s checkpoints, %s", what,
                                         ck ? "from" : "without", seg ? "segmented" : "per block");
                                grads_bitwise(&g[0], &g[1], bias, w2);
                                int sb = 0;
                                for (size_t i = 0; i < ns; i++) sb += !stats_equal(&bs[0][i], &bs[1][i]);
                                CHECK(sb == 0, "%s: %d operand statistics differ", w2, sb);
                                if (!sr && !ck && seg && act < 3) /* the oracle's activations: SiLU, Swish, ReLU^2 */
                                    check_vs_oracle(&g[0], &P, &cfg, w2);
                                for (int r = 0; r < 2; r++) grads_free(&g[r]), free(bs[r]);
                            }
                        for (int c = 0; c < NOUT; c++) free(on[c]), free(off[c]), free(lean[c]);
                        free(fs1), free(fs0);
                        configs++;
                    }
        prob_free(&P);
    }
    printf("runs of blocks vs block by block: %d configurations bitwise equal\n", configs);
}

/* The problems of the checkpoint-layout tests: 0 has padding inside blocks, 1 GEMMs that split between threads. */
static void layout_problem(prob *P, int which) {
    make_problem(P, which == 0 ? 0 : 2);
    if (which == 0) punch_padding(P);
}

/* One backward with bias gradients into F32 gradients G (made here), statistics into st, on the chosen weight-gradient
 * path, runs mode and thread count; A is the call's arguments (checkpoints included). */
static void backward_args(const prob *P, mxfp8_moe_bwd_args *A, int seg, int runs, int nt, grads *G,
                          mxfp8_quant_stats *st) {
    A->stats = st;
    grads_make(G, P, MXFP8_DTYPE_F32, 1);
    mxfp8i_moe_set_segmented_wgrad(seg);
    mxfp8i_moe_set_block_runs(runs);
    mxfp8_set_num_threads(nt);
    CHECK(mxfp8_moe_backward(A, &G->g) == MXFP8_OK, "backward: %s", mxfp8_last_error_message());
    mxfp8_set_num_threads(0);
    mxfp8i_moe_set_block_runs(-1);
    mxfp8i_moe_set_segmented_wgrad(-1);
}
/* Two backwards' gradients (with bias) bitwise equal and finite, and their ns operand statistics equal; frees both. */
static void check_pair(grads g[2], mxfp8_quant_stats *st[2], size_t ns, const char *what) {
    grads_bitwise(&g[0], &g[1], 1, what);
    CHECK(grads_finite(&g[0], 1), "%s: non-finite gradient", what);
    int sb = 0;
    for (size_t i = 0; i < ns; i++) sb += !stats_equal(&st[0][i], &st[1][i]);
    CHECK(sb == 0, "%s: %d operand statistics differ", what, sb);
    for (int r = 0; r < 2; r++) grads_free(&g[r]), free(st[r]);
}

/* Phase 4 reads a BF16 scaled-intermediate checkpoint in place (its rows along the positions) where a block has no
 * padding inside, and through the transposed FP32 buffer otherwise (an F32 checkpoint always): the same values
 * either way, so the same bits. The checkpoint in BF16 (NaN at every padding position, inside a block and after
 * its last real position) against an F32 copy of the same values (zeros there), the other checkpoints given alike:
 * every gradient and operand statistic, rounding to nearest and stochastically, both weight-gradient paths, runs
 * forced on and off, 1 and 2 threads; a problem with padding inside blocks and one whose GEMMs split. */
static void test_s_in_place(void) {
    int configs = 0;
    for (int which = 0; which < 2; which++) {
        prob P;
        layout_problem(&P, which);
        const int64_t N = P.N, B = P.B, I = P.I;
        const size_t ns = (size_t)(P.E * NOPS), nib = (size_t)(N * I * B);
        for (int sr = 0; sr < 2; sr++) {
            const mxfp8_moe_config cfg = layer_config(0, 0, 1, sr, 4242u); /* AFFINITY_ON_I: Phase 4 reads S */
            float *o[NOUT];
            size_t len[NOUT];
            forward_runs(&P, &cfg, -1, 2, 1, o, NULL, len);
            uint16_t *s16 = xc(sizeof(uint16_t) * nib);
            float *s32 = xc(sizeof(float) * nib);
            int64_t inside = 0; /* padding positions before a block's last real position */
            for (int64_t n = 0; n < N; n++) {
                int64_t last = -1;
                for (int64_t q = 0; q < B; q++)
                    if (P.tok[n * B + q] != P.pad) last = q;
                for (int64_t q = 0; q < B; q++) {
                    const int pad = P.tok[n * B + q] == P.pad;
                    inside += pad && q < last;
                    for (int64_t i = 0; i < I; i++) {
                        const size_t k = (size_t)((n * I + i) * B + q);
                        s16[k] = pad ? 0x7FC1 : mxfp8_fp32_to_bf16(o[4][k]);
                        s32[k] = pad ? 0.0f : mxfp8_bf16_to_fp32(s16[k]);
                    }
                }
            }
            CHECK(which != 0 || inside > 0, "problem %d: no padding inside a block", which);
            for (int seg = 0; seg < 2; seg++)
                for (int runs = 0; runs < 2; runs++)
                    for (int nt = 1; nt <= 2; nt++) {
                        grads g[2];
                        mxfp8_quant_stats *st[2] = {xc(ns * sizeof *st[0]), xc(ns * sizeof *st[1])};
                        for (int r = 0; r < 2; r++) {
                            mxfp8_moe_bwd_args A;
                            bwd_args(&P, &cfg, &A);
                            A.gate_up_proj_act_checkpoint_T = v4(o[1], MXFP8_DTYPE_F32, N, 2, I, B);
                            A.gate_act_checkpoint_T = v3(o[2], MXFP8_DTYPE_F32, N, I, B);
                            A.intermediate_checkpoint_T = v3(o[3], MXFP8_DTYPE_F32, N, I, B);
                            A.scaled_intermediate_checkpoint_T =
                                r == 0 ? v3(s16, MXFP8_DTYPE_BF16, N, I, B) : v3(s32, MXFP8_DTYPE_F32, N, I, B);
                            backward_args(&P, &A, seg, runs, nt, &g[r], st[r]);
                        }
                        char what[160];
                        snprintf(what, sizeof what,
                                 "problem %d sr %d seg %d runs %d threads %d: BF16 S in place vs F32", which, sr, seg,
                                 runs, nt);
                        check_pair(g, st, ns, what);
                        configs++;
                    }
            for (int c = 0; c < NOUT; c++) free(o[c]);
            free(s16), free(s32);
        }
        prob_free(&P);
    }
    printf("Phase 4 from the BF16 checkpoint in place vs its F32 copy: %d configurations bitwise equal\n", configs);
}

/* The gate/up checkpoint in positions-major memory ([N, B, 2, I], passed as the [N, 2, I, B] view with strides
 * (2IB, I, 1, 2I): mxfp8.torch's layout). The forward (runs of blocks forced off and on, 2 and 1 threads) writes the
 * same values as into the contiguous layout (zeros at padding positions, nothing outside the view's elements); the
 * backward from it, in F32 and in BF16 with NaN at every padding position, gives the bits of the backward from the
 * contiguous F32 / BF16 checkpoint: every gradient and operand statistic, both affinity options, stochastic
 * rounding, both weight-gradient paths, 1 and 2 threads. */
static mxfp8_tensor strided4(void *d, mxfp8_dtype dt, int nd, const int64_t *shape, const int64_t *strides) {
    mxfp8_tensor t = mxfp8_tensor_make(d, dt, nd, shape);
    for (int i = 0; i < nd; i++) t.strides[i] = strides[i];
    return t;
}
static void test_positions_major(void) {
    int configs = 0;
    for (int which = 0; which < 2; which++) {
        prob P;
        layout_problem(&P, which);
        const int64_t N = P.N, B = P.B, I = P.I;
        const size_t ns = (size_t)(P.E * NOPS), ngu = (size_t)(N * 2 * I * B);
        for (int aff = 0; aff < 2; aff++)
            for (int sr = 0; sr < 2; sr++) {
                const mxfp8_moe_config cfg = layer_config(0, aff, 1, sr, 99u);
                float *o[NOUT];
                size_t len[NOUT];
                forward_runs(&P, &cfg, -1, 2, 1, o, NULL, len); /* o[1]: the contiguous gate/up checkpoint */
                float *pm = xc(sizeof(float) * (ngu + 16)), *out = xc(sizeof(float) * (size_t)(P.T * P.H));
                const int64_t st[4] = {2 * I * B, I, 1, 2 * I}, sh[4] = {N, 2, I, B};
                int64_t bad = 0;
                for (int runs = 0; runs < 2; runs++) { /* runs forced on last: its checkpoint is compared below */
                    for (size_t k = 0; k < ngu + 16; k++) pm[k] = -9.5f; /* the forward must overwrite all of it */
                    mxfp8_moe_fwd_args F;
                    fwd_args(&P, &cfg, &F);
                    mxfp8_moe_fwd_outputs O = {0};
                    O.output = v2(out, MXFP8_DTYPE_F32, P.T, P.H);
                    O.gate_up_proj_act_checkpoint_T = strided4(pm, MXFP8_DTYPE_F32, 4, sh, st);
                    mxfp8i_moe_set_block_runs(runs);
                    mxfp8_set_num_threads(2 - runs);
                    CHECK(mxfp8_moe_forward(&F, &O) == MXFP8_OK, "forward: %s", mxfp8_last_error_message());
                    mxfp8_set_num_threads(0);
                    mxfp8i_moe_set_block_runs(-1);
                    bad += memcmp(out, o[0], sizeof(float) * (size_t)(P.T * P.H)) != 0;
                    for (int64_t k = 0; runs == 0 && k < (int64_t)ngu; k++) { /* runs off: the same values */
                        const int64_t n = k / (2 * I * B), q = k / (2 * I) % B, j = k / I % 2, i = k % I;
                        bad += memcmp(&pm[k], &o[1][((n * 2 + j) * I + i) * B + q], sizeof(float)) != 0;
                    }
                }
                uint16_t *pm16 = xc(sizeof(uint16_t) * ngu), *c16 = xc(sizeof(uint16_t) * ngu);
                for (int64_t n = 0; n < N; n++)
                    for (int64_t j = 0; j < 2; j++)
                        for (int64_t i = 0; i < I; i++)
                            for (int64_t q = 0; q < B; q++) {
                                const size_t kc = (size_t)(((n * 2 + j) * I + i) * B + q),
                                             kp = (size_t)(((n * B + q) * 2 + j) * I + i);
                                bad += memcmp(&pm[kp], &o[1][kc], sizeof(float)) != 0;
                                c16[kc] = mxfp8_fp32_to_bf16(o[1][kc]);
                                pm16[kp] = P.tok[n * B + q] == P.pad ? 0x7FC1 : c16[kc];
                            }
                for (int k = 0; k < 16; k++) bad += pm[ngu + k] != -9.5f;
                CHECK(bad == 0, "problem %d aff %d sr %d: the positions-major forward differs in %lld places",
                      which, aff, sr, (long long)bad);
                for (int64_t n = 0; n < N; n++) /* NaN at padding positions of the F32 one too */
                    for (int64_t q = 0; q < B; q++)
                        if (P.tok[n * B + q] == P.pad)
                            for (int64_t k = 0; k < 2 * I; k++) pm[(n * B + q) * 2 * I + k] = NAN;
                for (int bf16 = 0; bf16 < 2; bf16++)
                    for (int seg = 0; seg < 2; seg++)
                        for (int nt = 1; nt <= 2; nt++) {
                            const mxfp8_dtype dt = bf16 ? MXFP8_DTYPE_BF16 : MXFP8_DTYPE_F32;
                            grads g[2];
                            mxfp8_quant_stats *qs[2] = {xc(ns * sizeof *qs[0]), xc(ns * sizeof *qs[1])};
                            for (int r = 0; r < 2; r++) {
                                mxfp8_moe_bwd_args A;
                                bwd_args(&P, &cfg, &A);
                                A.gate_up_proj_act_checkpoint_T =
                                    r == 0 ? strided4(bf16 ? (void *)pm16 : (void *)pm, dt, 4, sh, st)
                                           : v4(bf16 ? (void *)c16 : (void *)o[1], dt, N, 2, I, B);
                                backward_args(&P, &A, seg, -1, nt, &g[r], qs[r]);
                            }
                            char what[160];
                            snprintf(what, sizeof what,
                                     "problem %d aff %d sr %d %s seg %d threads %d: positions-major checkpoint", which,
                                     aff, sr, bf16 ? "bf16" : "f32", seg, nt);
                            check_pair(g, qs, ns, what);
                            configs++;
                        }
                for (int c = 0; c < NOUT; c++) free(o[c]);
                free(pm), free(out), free(pm16), free(c16);
            }
        prob_free(&P);
    }
    printf("the gate/up checkpoint positions-major vs contiguous: %d configurations bitwise equal\n", configs);
}

/* The forward's expert-parallel path (threads take whole groups of one expert's blocks, each position's weighted
 * row combined per token in block order afterwards) against the serial path (1 thread, block by block): the output
 * and every checkpoint it writes are the same bits, on 1, 2 and 3 threads, over activations, both affinity options,
 * biases, stochastic rounding of every operand, the checkpoint layouts the path takes (none; the positions-major F32
 * gate/up one; the gate/up, activation and both intermediates along the positions) and problems with H, I not
 * multiples of 32, an expert with no tokens, padding inside blocks, B = 24, and top-3 routing (three contributions
 * per token, whose order of addition shows). */
int mxfp8i_moe_set_expert_parallel(int mode); /* src/ops/moe/moe.h (test-only: -1 auto, 0 never, 1 always) */
/* The blocks in reverse order (each block's positions and expert moved with it): blocks no longer ascend by expert,
 * so the serial walk's expert-major order differs from the order of the positions. */
static void reverse_blocks(prob *P) {
    for (int64_t n = 0, m = P->N - 1; n < m; n++, m--) {
        for (int64_t q = 0; q < P->B; q++) {
            const int32_t x = P->tok[n * P->B + q];
            P->tok[n * P->B + q] = P->tok[m * P->B + q], P->tok[m * P->B + q] = x;
        }
        const int32_t e = P->b2e[n];
        P->b2e[n] = P->b2e[m], P->b2e[m] = e;
    }
}
/* The problems of the expert-parallel tests: 0-2 make_problem's (in 1, token 0's affinities are -0: its rows of the
 * forward's sum are signed zeros, and only additions to a +0 accumulator give the serial path's +0), 3 padding
 * inside blocks, 4 B = 24, 5 top-3 routing (three contributions per token: their order of addition shows), 6 the
 * same with the blocks reversed (the backward's expert order is no longer the positions' order). */
static void par_problem(prob *P, int which) {
    if (which == 4) prob_make(P, 70, 40, 48, 3, 2, 24, 1, NULL);
    else if (which >= 5) prob_make(P, 90, 64, 40, 5, 3, 16, 1, NULL);
    else make_problem(P, which == 3 ? 0 : which);
    if (which == 1)
        for (int64_t e = 0; e < P->E; e++) P->a[e] = -0.0f;
    if (which == 3) punch_padding(P);
    if (which == 6) reverse_blocks(P);
}
/* The configurations the expert-parallel tests leave out: fewer for the large problem, and for the problems other
 * than 0 and the top-3 ones only SiLU and Swish. */
static int par_skip(int which, int act, int bias, int sr) {
    return (which == 2 && (act != 0 || bias != sr)) || (which < 5 && which != 0 && act > 1);
}
/* layout: 0 the output alone, 1 with the positions-major gate/up checkpoint, 2 with every checkpoint (the output
 * F32), 3 the output alone in BF16 (rounded by the expert-parallel path's combine itself). */
static void forward_par_once(const prob *P, const mxfp8_moe_config *cfg, int par, int nt, int layout, float *o[5]) {
    const int64_t N = P->N, B = P->B, I = P->I;
    mxfp8_moe_fwd_args F;
    fwd_args(P, cfg, &F);
    mxfp8_moe_fwd_outputs O = {0};
    O.output = v2(o[0], layout == 3 ? MXFP8_DTYPE_BF16 : MXFP8_DTYPE_F32, P->T, P->H);
    const int64_t st[4] = {2 * I * B, I, 1, 2 * I}, sh[4] = {N, 2, I, B};
    if (layout == 1) O.gate_up_proj_act_checkpoint_T = strided4(o[1], MXFP8_DTYPE_F32, 4, sh, st);
    if (layout == 2) ck_views(P, &O, o);
    mxfp8i_moe_set_expert_parallel(par);
    mxfp8_set_num_threads(nt);
    CHECK(mxfp8_moe_forward(&F, &O) == MXFP8_OK, "forward: %s", mxfp8_last_error_message());
    mxfp8_set_num_threads(0);
    mxfp8i_moe_set_expert_parallel(-1);
}
static void test_expert_parallel(void) {
    int configs = 0;
    const uint64_t keep = g_rng; /* (the later tests' problems stay the ones their tolerances were set on) */
    for (int which = 0; which < 7; which++) {
        prob P;
        par_problem(&P, which);
        const int64_t N = P.N, B = P.B, I = P.I;
        const size_t len[5] = {(size_t)(P.T * P.H), (size_t)(N * 2 * I * B), (size_t)(N * I * B),
                               (size_t)(N * I * B), (size_t)(N * I * B)};
        for (int act = 0; act < 4; act++)
            for (int aff = 0; aff < 2; aff++)
                for (int bias = 0; bias < 2; bias++)
                    for (int sr = 0; sr < 2; sr++) {
                        if (par_skip(which, act, bias, sr)) continue;
                        const mxfp8_moe_config cfg = layer_config(act, aff, bias, sr, 4242u + (unsigned)act);
                        for (int layout = 0; layout < 4; layout++) {
                            float *ref[5], *o[5];
                            for (int c = 0; c < 5; c++) {
                                ref[c] = xc(sizeof(float) * len[c]);
                                o[c] = xc(sizeof(float) * len[c]);
                            }
                            forward_par_once(&P, &cfg, 0, 1, layout, ref);
                            for (int nt = 1; nt <= 3; nt++) {
                                for (int c = 0; c < 5; c++) /* every element must be written again */
                                    for (size_t k = 0; k < len[c]; k++) o[c][k] = -7.25f;
                                if (layout == 3) /* (the reference's untouched half, as in ref) */
                                    memset((uint16_t *)o[0] + len[0], 0, sizeof(uint16_t) * len[0]);
                                forward_par_once(&P, &cfg, 1, nt, layout, o);
                                int bad = 0;
                                for (int c = 0; c < (layout == 1 ? 2 : layout == 2 ? 5 : 1); c++)
                                    bad += memcmp(o[c], ref[c], sizeof(float) * len[c]) != 0;
                                CHECK(bad == 0,
                                      "problem %d act %d aff %d bias %d sr %d layout %d threads %d: %d of the "
                                      "expert-parallel forward's outputs differ from the serial path's",
                                      which, act, aff, bias, sr, layout, nt, bad);
                                configs++;
                            }
                            for (int c = 0; c < 5; c++) free(ref[c]), free(o[c]);
                        }
                    }
        prob_free(&P);
    }
    g_rng = keep;
    printf("forward, expert-parallel vs serial: %d configurations bitwise equal\n", configs);
}

/* The backward's expert-parallel path (threads take whole experts; each position's dX row and affinity-gradient term
 * added afterwards in the serial walk's order) against the serial walk (1 thread): every gradient the same bits, on
 * 1, 2 and 3 threads, over activations, both affinity options, biases, stochastic rounding of every operand, no
 * checkpoints (recomputed) / all of the forward's / the positions-major F32 gate/up one alone, both weight-gradient
 * paths, F32 and BF16 gradients (written straight by the segmented GEMMs), given values added
 * (skip_grad_initialization, accumulate_hidden_states_grad), and the problems of the forward's test (an expert with
 * no tokens, padding inside blocks, B = 24, top-3 routing). */
static void backward_par_once(const prob *P, const mxfp8_moe_config *cfg, const mxfp8_moe_bwd_args *A0, int par,
                              int nt, int seg, mxfp8_dtype dt, grads *G) {
    mxfp8_moe_bwd_args A = *A0;
    A.config = cfg;
    grads_make(G, P, dt, cfg->bias);
    if (cfg->skip_grad_initialization) /* given values, the same in every run */
        for (int k = 0; k < 6; k++)
            for (size_t i = 0; i < G->n[k]; i++) ((float *)G->p[k])[i] = (float)(i % 7) * 0.25f - 0.5f;
    mxfp8i_moe_set_expert_parallel(par);
    mxfp8i_moe_set_segmented_wgrad(seg);
    mxfp8_set_num_threads(nt);
    CHECK(mxfp8_moe_backward(&A, &G->g) == MXFP8_OK, "backward: %s", mxfp8_last_error_message());
    mxfp8_set_num_threads(0);
    mxfp8i_moe_set_segmented_wgrad(-1);
    mxfp8i_moe_set_expert_parallel(-1);
}
static void test_backward_parallel(void) {
    int configs = 0;
    const uint64_t keep = g_rng; /* (the later tests' problems stay the ones their tolerances were set on) */
    for (int which = 0; which < 7; which++) {
        prob P;
        par_problem(&P, which);
        const int64_t N = P.N, B = P.B, I = P.I, H = P.H;
        for (int act = 0; act < 4; act++)
            for (int aff = 0; aff < 2; aff++)
                for (int bias = 0; bias < 2; bias++)
                    for (int sr = 0; sr < 2; sr++) {
                        if (par_skip(which, act, bias, sr)) continue;
                        mxfp8_moe_config cfg = layer_config(act, aff, bias, sr, 5151u + (unsigned)act);
                        float *o[NOUT], *pm[5];
                        size_t len[NOUT];
                        forward_runs(&P, &cfg, -1, 1, 1, o, NULL, len); /* every checkpoint */
                        for (int c = 0; c < 5; c++) pm[c] = xc(sizeof(float) * len[c]);
                        forward_par_once(&P, &cfg, 0, 1, 1, pm); /* the positions-major gate/up checkpoint */
                        const int64_t st[4] = {2 * I * B, I, 1, 2 * I}, sh[4] = {N, 2, I, B};
                        for (int ck = 0; ck < 3; ck++) {
                            mxfp8_moe_bwd_args A;
                            bwd_args(&P, &cfg, &A);
                            if (ck == 1) {
                                A.gate_up_proj_act_checkpoint_T = v4(o[1], MXFP8_DTYPE_F32, N, 2, I, B);
                                A.gate_act_checkpoint_T = v3(o[2], MXFP8_DTYPE_F32, N, I, B);
                                A.intermediate_checkpoint_T = v3(o[3], MXFP8_DTYPE_F32, N, I, B);
                                A.scaled_intermediate_checkpoint_T = v3(o[4], MXFP8_DTYPE_F32, N, I, B);
                                A.down_proj_output_checkpoint = v3(o[5], MXFP8_DTYPE_F32, N, B, H);
                            } else if (ck == 2) {
                                A.gate_up_proj_act_checkpoint_T = strided4(pm[1], MXFP8_DTYPE_F32, 4, sh, st);
                            }
                            for (int v = 0; v < 4; v++) { /* per block F32; segmented F32, BF16, given values */
                                mxfp8_moe_config c2 = cfg;
                                c2.skip_grad_initialization = c2.accumulate_hidden_states_grad = v == 3;
                                const mxfp8_dtype dt = v == 2 ? MXFP8_DTYPE_BF16 : MXFP8_DTYPE_F32;
                                grads ref, g;
                                backward_par_once(&P, &c2, &A, 0, 1, v > 0, dt, &ref);
                                for (int nt = 1; nt <= 3; nt++) {
                                    backward_par_once(&P, &c2, &A, 1, nt, v > 0, dt, &g);
                                    char what[200];
                                    snprintf(what, sizeof what,
                                             "problem %d act %d aff %d bias %d sr %d checkpoints %d variant %d "
                                             "threads %d: expert-parallel backward vs serial",
                                             which, act, aff, bias, sr, ck, v, nt);
                                    grads_bitwise(&g, &ref, bias, what);
                                    grads_free(&g);
                                    configs++;
                                }
                                grads_free(&ref);
                            }
                        }
                        for (int c = 0; c < NOUT; c++) free(o[c]);
                        for (int c = 0; c < 5; c++) free(pm[c]);
                    }
        prob_free(&P);
    }
    g_rng = keep;
    printf("backward, expert-parallel vs serial: %d configurations bitwise equal\n", configs);
}

/* The gradients of a fixed set of configurations (the segmented path, 2 threads), one after the other. */
static size_t isa_grads(unsigned char **out) {
    size_t len = 0, cap = 0;
    *out = NULL;
    g_rng = 0x243F6A8885A308D3ull; /* the same problems in this process and in its --dump child */
    for (int which = 0; which < 2; which++) {
        prob P;
        make_problem(&P, which);
        for (int sr = 0; sr < 2; sr++) {
            mxfp8_moe_config cfg;
            mxfp8_moe_config_init(&cfg);
            cfg.bias = 1;
            cfg.affinity_option = (mxfp8_affinity_option)sr;
            cfg.stochastic_rounding = sr ? (1u << NOPS) - 1 : 0;
            grads g;
            backward(&P, &cfg, 1, 2, &g, NULL);
            for (int k = 0; k < 6; k++) {
                const size_t b = g.n[k] * sizeof(float);
                if (len + b > cap) {
                    cap = 2 * (len + b);
                    *out = realloc(*out, cap);
                }
                memcpy(*out + len, g.p[k], b);
                len += b;
            }
            grads_free(&g);
        }
        prob_free(&P);
    }
    return len;
}

/* Run this test again under MXFP8_ISA=scalar (its --dump mode) and compare the bits. */
static void test_isa(void) {
    const char *isa = getenv("MXFP8_ISA");
    if (isa && !strcmp(isa, "scalar")) {
        printf("MXFP8_ISA=scalar already: the scalar-vs-default comparison runs without it\n");
        return;
    }
    unsigned char *mine;
    const size_t n = isa_grads(&mine);
    char path[64], cmd[512], exe[256];
    snprintf(path, sizeof path, "/tmp/mxfp8_moe_wgrad_%d.bin", (int)getpid());
    ssize_t el = readlink("/proc/self/exe", exe, sizeof exe - 1);
    CHECK(el > 0, "cannot find this executable");
    if (el <= 0) {
        free(mine);
        return;
    }
    exe[el] = 0;
    snprintf(cmd, sizeof cmd, "MXFP8_ISA=scalar '%s' --dump '%s'", exe, path);
    CHECK(system(cmd) == 0, "the MXFP8_ISA=scalar run failed: %s", cmd);
    FILE *f = fopen(path, "rb");
    unsigned char *theirs = malloc(n + 1);
    size_t got = f ? fread(theirs, 1, n + 1, f) : 0;
    if (f) fclose(f);
    remove(path);
    CHECK(got == n && !memcmp(mine, theirs, n), "MXFP8_ISA=scalar vs default: %zu of %zu bytes, contents %s", got, n,
          got == n ? "differ" : "-");
    printf("MXFP8_ISA=scalar vs default: %zu gradient bytes compared\n", n);
    free(mine);
    free(theirs);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--dump")) { /* the child of test_isa */
        unsigned char *g;
        const size_t n = isa_grads(&g);
        FILE *f = fopen(argv[2], "wb");
        const int ok = f && fwrite(g, 1, n, f) == n;
        if (f) fclose(f);
        free(g);
        return ok && !g_fail ? 0 : 1;
    }
    test_paths_equal();
    test_runs_equal();
    test_nan_padding();
    test_s_in_place();
    test_positions_major();
    test_expert_parallel();
    test_backward_parallel();
    test_threads_split();
    test_isa();
    if (g_fail) {
        printf("test_moe_wgrad: %d failure(s)\n", g_fail);
        return 1;
    }
    printf("test_moe_wgrad: all tests passed\n");
    return 0;
}
