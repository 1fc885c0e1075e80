/*
 * bench_moe_ep.c -- `mpirun -np P mxfp8 bench moe --expert-parallel`: the speed of the expert-parallel MoE layer
 * (libmxfp8_mpi), per rank, beside the single-process layer of the same (gathered) problem in the same run.
 *
 * Contract
 * --------
 *  - Problems (H, T, E, B, TopK, I): the upstream one (1024, 1024, 4, 512, 4, 256) and the larger one of
 *    `mxfp8 bench moe` (2048, 8192, 8, 512, 2, 1024) (--quick: the upstream one only); BF16 tensors, E4M3,
 *    W ~ U(-0.1, 0.1), X ~ U(0, 1), dY ~ U(-1, 1), TopK distinct experts per token drawn uniformly, affinities
 *    U(0, 1). Values come from a counter-based generator (splitmix64 of the element's index), so every rank makes
 *    only its own slice and rank 0 the whole problem for the single-process run, and all agree.
 *  - Single process: rank 0 runs mxfp8_moe_forward (with the F32 checkpoints) and mxfp8_moe_backward (given them)
 *    on the whole problem with all the cores it may use while the other ranks sleep (and again with one rank's
 *    thread count when that differs); best of --reps after a warm-up. The ratios and the model use the faster.
 *  - Expert parallel: every rank runs mxfp8_mpi_moe_forward / mxfp8_mpi_moe_backward on its contiguous token range
 *    and its experts (threads per rank: the cores of the node shared by its ranks, or --threads); best of --reps
 *    after a warm-up, per rank: dispatch / compute / combine seconds and bytes sent to / received from other ranks.
 *  - The network model: P ranks, each holding T tokens of this problem (weak scaling) and max(E, P) / P experts,
 *    routed top-K uniformly (drawn with the same generator); per rank and layer the bytes of the forward and backward
 *    dispatch and combine that leave the rank (rows to distinct remote ranks, pairs routed to remote experts), over
 *    a link of the given bandwidth in each direction (bandwidth only: no latency, no congestion), beside the
 *    single-process compute time measured above (the per-rank compute under balanced weak scaling).
 * Under mpirun, pass --bind-to none so that a rank's threads (and rank 0's single-process run) may use every core.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

int cmd_bench_moe_ep(int argc, char **argv);

#ifndef MXFP8_HAVE_MPI
int cmd_bench_moe_ep(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "mxfp8 bench: --expert-parallel needs a build with MPI (Debian: apt-get install openmpi-bin "
                    "libopenmpi-dev, then rebuild)\n");
    return CLI_USAGE;
}
#else
#include "mxfp8_mpi.h"
#include "moe_ep.h"

static int g_rank, g_P;

typedef struct bprob {
    const char *name;
    int64_t H, T, E, B, K, I;
} bprob;

/* ---- counter-based values: element i of tensor `id`, independent of who makes it ---- */
static uint64_t mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double u01(uint64_t id, uint64_t i) { return (double)(mix(mix(id * 0x100000001B3ull) ^ i) >> 11) * 0x1p-53; }

static uint16_t *bf16_range(uint64_t id, int64_t i0, int64_t n, double lo, double hi) {
    uint16_t *q = malloc(sizeof *q * (size_t)(n > 0 ? n : 1));
    if (!q) return NULL;
    for (int64_t i = 0; i < n; i++) q[i] = mxfp8_fp32_to_bf16((float)(lo + (hi - lo) * u01(id, (uint64_t)(i0 + i))));
    return q;
}

/* Token t's K distinct experts out of E (partial Fisher-Yates on its own stream) and affinities. */
static void route_token(uint64_t id, int64_t t, int64_t E, int64_t K, int32_t *perm, int32_t *ids, float *w) {
    for (int64_t e = 0; e < E; e++) perm[e] = (int32_t)e;
    for (int64_t k = 0; k < K; k++) {
        int64_t j = k + (int64_t)(u01(id, (uint64_t)(t * 2 * K + 2 * k)) * (double)(E - k));
        if (j >= E) j = E - 1;
        const int32_t x = perm[k];
        perm[k] = perm[j];
        perm[j] = x;
        ids[k] = perm[k];
        if (w) w[k] = mxfp8_bf16_to_fp32(mxfp8_fp32_to_bf16((float)u01(id, (uint64_t)(t * 2 * K + 2 * k + 1))));
    }
}

/* Tokens [t0, t0 + n) and experts [e0, e0 + ne) of a problem. */
typedef struct slice {
    int64_t t0, n, e0, ne;
    uint16_t *x, *dy, *w1, *w2;
    int32_t *ids;
    float *w;
} slice;

static void slice_free(slice *s) {
    free(s->x); free(s->dy); free(s->w1); free(s->w2); free(s->ids); free(s->w);
}

static int slice_make(const bprob *p, slice *s) {
    const int64_t H = p->H, I = p->I, K = p->K;
    s->x = bf16_range(1, s->t0 * H, s->n * H, 0, 1);
    s->dy = bf16_range(2, s->t0 * H, s->n * H, -1, 1);
    s->w1 = bf16_range(3, s->e0 * H * 2 * I, s->ne * H * 2 * I, -0.1, 0.1);
    s->w2 = bf16_range(4, s->e0 * I * H, s->ne * I * H, -0.1, 0.1);
    s->ids = malloc(sizeof(int32_t) * (size_t)(s->n * K + 1));
    s->w = malloc(sizeof(float) * (size_t)(s->n * K + 1));
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)p->E);
    if (!s->x || !s->dy || !s->w1 || !s->w2 || !s->ids || !s->w || !perm) {
        free(perm);
        return -1;
    }
    for (int64_t t = 0; t < s->n; t++) route_token(5, s->t0 + t, p->E, K, perm, s->ids + t * K, s->w + t * K);
    free(perm);
    return 0;
}

static mxfp8_tensor view(void *d, mxfp8_dtype dt, int n, int64_t a, int64_t b, int64_t c, int64_t e) {
    const int64_t s[4] = {a, b, c, e};
    return mxfp8_tensor_make(d, dt, n, s);
}

/* Wait for the other ranks without spinning (so that rank 0's single-process run has the cores). */
static void sleepy_barrier(void) {
    MPI_Request rq;
    int done = 0;
    MPI_Ibarrier(MPI_COMM_WORLD, &rq);
    while (!done) {
        MPI_Test(&rq, &done, MPI_STATUS_IGNORE);
        if (!done) nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
}

/* The single-process layer on rank 0: best forward and backward seconds (-1 on failure). */
static int single(const bprob *p, int reps, double *tf, double *tb) {
    const int64_t T = p->T, H = p->H, I = p->I, E = p->E, B = p->B;
    slice s = {.t0 = 0, .n = T, .e0 = 0, .ne = E};
    int64_t N;
    *tf = *tb = -1;
    if (slice_make(p, &s) || mxfp8_moe_num_blocks(T, p->K, E, B, &N)) {
        slice_free(&s);
        return -1;
    }
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(N * B)), *be = malloc(sizeof(int32_t) * (size_t)N);
    float *a = malloc(sizeof(float) * (size_t)(T * E)), *ck = malloc(sizeof(float) * (size_t)(N * 2 * I * B));
    uint16_t *y = malloc(2 * (size_t)(T * H)), *dx = malloc(2 * (size_t)(T * H)), *da = malloc(2 * (size_t)(T * E));
    uint16_t *dw1 = malloc(2 * (size_t)(E * H * 2 * I)), *dw2 = malloc(2 * (size_t)(E * I * H));
    int rc = -1;
    if (!tok || !be || !a || !ck || !y || !dx || !da || !dw1 || !dw2) goto out;
    mxfp8_tensor ti = view(s.ids, MXFP8_DTYPE_I32, 2, T, p->K, 0, 0), tw = view(s.w, MXFP8_DTYPE_F32, 2, T, p->K, 0, 0);
    mxfp8_tensor tt = view(tok, MXFP8_DTYPE_I32, 1, N * B, 0, 0, 0), tb2 = view(be, MXFP8_DTYPE_I32, 1, N, 0, 0, 0);
    mxfp8_tensor ta = view(a, MXFP8_DTYPE_F32, 2, T * E, 1, 0, 0);
    if (mxfp8_moe_route(&ti, &tw, E, B, -1, &tt, &tb2, &ta)) goto out;
    mxfp8_moe_fwd_args f;
    mxfp8_moe_fwd_args_init(&f);
    f.hidden_states = view(s.x, MXFP8_DTYPE_BF16, 2, T, H, 0, 0);
    f.expert_affinities_masked = ta;
    f.gate_up_proj_weight = view(s.w1, MXFP8_DTYPE_BF16, 4, E, H, 2, I);
    f.down_proj_weight = view(s.w2, MXFP8_DTYPE_BF16, 3, E, I, H, 0);
    f.token_position_to_id = tt;
    f.block_to_expert = tb2;
    f.block_size = B;
    mxfp8_moe_fwd_outputs fo;
    memset(&fo, 0, sizeof fo);
    fo.output = view(y, MXFP8_DTYPE_BF16, 2, T, H, 0, 0);
    fo.gate_up_proj_act_checkpoint_T = view(ck, MXFP8_DTYPE_F32, 4, N, 2, I, B);
    mxfp8_moe_bwd_args b;
    mxfp8_moe_bwd_args_init(&b);
    b.hidden_states = f.hidden_states; b.expert_affinities_masked = ta; b.gate_up_proj_weight = f.gate_up_proj_weight;
    b.down_proj_weight = f.down_proj_weight; b.token_position_to_id = tt; b.block_to_expert = tb2; b.block_size = B;
    b.output_hidden_states_grad = view(s.dy, MXFP8_DTYPE_BF16, 2, T, H, 0, 0);
    b.gate_up_proj_act_checkpoint_T = fo.gate_up_proj_act_checkpoint_T;
    mxfp8_moe_bwd_grads g;
    memset(&g, 0, sizeof g);
    g.hidden_states_grad = view(dx, MXFP8_DTYPE_BF16, 2, T, H, 0, 0);
    g.expert_affinities_masked_grad = view(da, MXFP8_DTYPE_BF16, 2, T * E, 1, 0, 0);
    g.gate_up_proj_weight_grad = view(dw1, MXFP8_DTYPE_BF16, 4, E, H, 2, I);
    g.down_proj_weight_grad = view(dw2, MXFP8_DTYPE_BF16, 3, E, I, H, 0);
    double bf = INFINITY, bb = INFINITY;
    for (int r = 0; r <= reps; r++) { /* r == 0: the warm-up */
        double t0 = MPI_Wtime();
        if (mxfp8_moe_forward(&f, &fo)) goto out;
        double t1 = MPI_Wtime();
        if (mxfp8_moe_backward(&b, &g)) goto out;
        double t2 = MPI_Wtime();
        if (r && t1 - t0 < bf) bf = t1 - t0;
        if (r && t2 - t1 < bb) bb = t2 - t1;
    }
    *tf = bf;
    *tb = bb;
    rc = 0;
out:
    free(tok); free(be); free(a); free(ck); free(y); free(dx); free(da); free(dw1); free(dw2);
    slice_free(&s);
    return rc;
}

/* The expert-parallel layer on this rank's slice: best forward and backward (by total seconds). */
static int parallel(const bprob *p, int reps, mxfp8_mpi_wire wire, mxfp8_mpi_moe_stats *fs, mxfp8_mpi_moe_stats *bs,
                    slice *s) {
    const int64_t H = p->H, I = p->I, q = p->T / g_P, r = p->T % g_P;
    s->t0 = g_rank * q + (g_rank < r ? g_rank : r);
    s->n = q + (g_rank < r);
    mxfp8_mpi_moe_expert_range(p->E, g_P, g_rank, &s->e0, &s->ne);
    int bad = slice_make(p, s) != 0, any;
    uint16_t *y = malloc(2 * (size_t)(s->n * H + 1)), *dx = malloc(2 * (size_t)(s->n * H + 1));
    uint16_t *dw1 = malloc(2 * (size_t)(s->ne * H * 2 * I)), *dw2 = malloc(2 * (size_t)(s->ne * I * H));
    bad |= !y || !dx || !dw1 || !dw2;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any) goto out;
    mxfp8_mpi_moe_fwd_args a;
    mxfp8_mpi_moe_fwd_args_init(&a);
    a.comm = MPI_COMM_WORLD;
    a.num_experts = p->E;
    a.hidden_states = view(s->x, MXFP8_DTYPE_BF16, 2, s->n, H, 0, 0);
    a.topk_ids = view(s->ids, MXFP8_DTYPE_I32, 2, s->n, p->K, 0, 0);
    a.topk_weights = view(s->w, MXFP8_DTYPE_F32, 2, s->n, p->K, 0, 0);
    a.gate_up_proj_weight = view(s->w1, MXFP8_DTYPE_BF16, 4, s->ne, H, 2, I);
    a.down_proj_weight = view(s->w2, MXFP8_DTYPE_BF16, 3, s->ne, I, H, 0);
    a.block_size = p->B;
    a.wire = wire;
    mxfp8_tensor yv = view(y, MXFP8_DTYPE_BF16, 2, s->n, H, 0, 0);
    mxfp8_mpi_moe_bwd_args b;
    mxfp8_mpi_moe_bwd_args_init(&b);
    b.output_hidden_states_grad = view(s->dy, MXFP8_DTYPE_BF16, 2, s->n, H, 0, 0);
    b.gate_up_proj_weight = a.gate_up_proj_weight;
    b.down_proj_weight = a.down_proj_weight;
    mxfp8_mpi_moe_bwd_grads g;
    memset(&g, 0, sizeof g);
    g.hidden_states_grad = view(dx, MXFP8_DTYPE_BF16, 2, s->n, H, 0, 0);
    g.gate_up_proj_weight_grad = view(dw1, MXFP8_DTYPE_BF16, 4, s->ne, H, 2, I);
    g.down_proj_weight_grad = view(dw2, MXFP8_DTYPE_BF16, 3, s->ne, I, H, 0);
    double bf = INFINITY, bb = INFINITY;
    for (int it = 0; it <= reps && !any; it++) { /* it == 0: the warm-up */
        mxfp8_mpi_moe_context *ctx = NULL;
        mxfp8_mpi_moe_stats f, bw;
        if (mxfp8_mpi_moe_forward(&a, &yv, &ctx, &f)) { any = 1; break; }
        b.context = ctx;
        any = mxfp8_mpi_moe_backward(&b, &g, &bw) != MXFP8_OK;
        mxfp8_mpi_moe_context_free(ctx);
        const double tf = f.dispatch_seconds + f.compute_seconds + f.combine_seconds;
        const double tb = bw.dispatch_seconds + bw.compute_seconds + bw.combine_seconds;
        if (it && tf < bf) { bf = tf; *fs = f; }
        if (it && tb < bb) { bb = tb; *bs = bw; }
    }
    if (any && g_rank == 0) fprintf(stderr, "mxfp8 bench: %s\n", mxfp8_mpi_last_error_message());
out:
    free(y); free(dx); free(dw1); free(dw2);
    return any ? -1 : 0;
}

/* Per-rank table, the slowest rank beside the single-process times. */
static void report(const bprob *p, const slice *s, const mxfp8_mpi_moe_stats *fs, const mxfp8_mpi_moe_stats *bs,
                   double tf1, double tb1, const char *wire) {
    const int64_t mine[3] = {s->n, s->e0, s->ne};
    int64_t *all = malloc(sizeof(int64_t) * 3 * (size_t)g_P);
    mxfp8_mpi_moe_stats *f = malloc(sizeof *f * (size_t)g_P), *b = malloc(sizeof *b * (size_t)g_P);
    if (!all || !f || !b) abort();
    MPI_Gather(mine, 3, MPI_INT64_T, all, 3, MPI_INT64_T, 0, MPI_COMM_WORLD);
    MPI_Gather(fs, (int)sizeof *fs, MPI_BYTE, f, (int)sizeof *fs, MPI_BYTE, 0, MPI_COMM_WORLD);
    MPI_Gather(bs, (int)sizeof *bs, MPI_BYTE, b, (int)sizeof *bs, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (g_rank == 0) {
        printf("  expert parallel, wire %s: ms, and MB (1e6 bytes) sent / received to / from other ranks:\n", wire);
        printf("  %4s %6s %7s %6s | %-42s | %s\n", "rank", "tokens", "experts", "pairs",
               "forward: dispatch compute combine  MB disp   MB comb", "backward: dispatch compute combine  MB disp   MB comb");
        double wf = 0, wb = 0;
        for (int r = 0; r < g_P; r++) {
            const mxfp8_mpi_moe_stats *st[2] = {&f[r], &b[r]};
            char ex[24];
            snprintf(ex, sizeof ex, "%lld-%lld", (long long)all[3 * r + 1], (long long)(all[3 * r + 1] + all[3 * r + 2] - 1));
            printf("  %4d %6lld %7s %6lld", r, (long long)all[3 * r], ex, (long long)f[r].local_pairs);
            for (int k = 0; k < 2; k++) {
                const mxfp8_mpi_moe_stats *x = st[k];
                char md[32], mc[32];
                snprintf(md, sizeof md, "%.2f/%.2f", (double)x->dispatch_bytes_sent / 1e6,
                         (double)x->dispatch_bytes_received / 1e6);
                snprintf(mc, sizeof mc, "%.2f/%.2f", (double)x->combine_bytes_sent / 1e6,
                         (double)x->combine_bytes_received / 1e6);
                printf(" | %8.1f %8.1f %7.1f %11s %11s", x->dispatch_seconds * 1e3, x->compute_seconds * 1e3,
                       x->combine_seconds * 1e3, md, mc);
            }
            printf("\n");
            const double tf = f[r].dispatch_seconds + f[r].compute_seconds + f[r].combine_seconds;
            const double tb = b[r].dispatch_seconds + b[r].compute_seconds + b[r].combine_seconds;
            wf = tf > wf ? tf : wf;
            wb = tb > wb ? tb : wb;
        }
        printf("  slowest rank: forward %.1f ms, backward %.1f ms; single process / expert parallel: forward %.2fx, "
               "backward %.2fx\n", wf * 1e3, wb * 1e3, tf1 > 0 ? tf1 / wf : 0.0, tb1 > 0 ? tb1 / wb : 0.0);
    }
    free(all);
    free(f);
    free(b);
}

/* Bytes that leave one rank per layer: rows to distinct remote ranks and pairs routed to remote experts. */
typedef struct traffic {
    double rows, pairs;
} traffic;

static traffic remote(const bprob *p, uint64_t id, int64_t t0, int64_t n, int64_t E, int P, int rank) {
    traffic x = {0, 0};
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)E), *ids = malloc(sizeof(int32_t) * (size_t)p->K);
    char *seen = calloc((size_t)P, 1);
    if (!perm || !ids || !seen) abort();
    const int64_t q = E / P, r = E % P, big = r * (q + 1);
    for (int64_t t = t0; t < t0 + n; t++) {
        route_token(id, t, E, p->K, perm, ids, NULL);
        memset(seen, 0, (size_t)P);
        for (int64_t k = 0; k < p->K; k++) {
            const int o = (int)(ids[k] < big ? ids[k] / (q + 1) : r + (ids[k] - big) / q);
            if (o == rank) continue;
            x.pairs += 1;
            if (!seen[o]) x.rows += 1;
            seen[o] = 1;
        }
    }
    free(perm);
    free(ids);
    free(seen);
    return x;
}

static double fwd_bytes(const bprob *p, traffic x, int64_t rb) { return x.rows * (double)rb + x.pairs * (12.0 + 4.0 * (double)p->H); }
static double bwd_bytes(const bprob *p, traffic x, int64_t rb) { return x.rows * (double)rb + x.pairs * 4.0 * (double)(p->H + 1); }

static void model(const bprob *p, mxfp8_mpi_wire wire, const mxfp8_mpi_moe_stats *fs, const mxfp8_mpi_moe_stats *bs,
                  double tf1, double tb1) {
    const int64_t rb = wire == MXFP8_MPI_WIRE_MXFP8 ? p->H + (p->H + 31) / 32 : 2 * p->H;
    /* the accounting, checked on this run's own routing: sum over ranks of the formula vs the measured bytes */
    const int64_t q = p->T / g_P, r = p->T % g_P, cs = 2 + (p->E + g_P - 1) / g_P;
    traffic mine = remote(p, 5, g_rank * q + (g_rank < r ? g_rank : r), q + (g_rank < r), p->E, g_P, g_rank);
    double v[4] = {fwd_bytes(p, mine, rb) + (double)(g_P - 1) * (double)cs * 4, bwd_bytes(p, mine, rb),
                   (double)(fs->dispatch_bytes_sent + fs->combine_bytes_sent),
                   (double)(bs->dispatch_bytes_sent + bs->combine_bytes_sent)}, sum[4];
    MPI_Reduce(v, sum, 4, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (g_rank != 0) return;
    printf("  bytes model on this run's routing (all ranks): forward %.3f MB (measured %.3f), backward %.3f MB "
           "(measured %.3f)\n", sum[0] / 1e6, sum[2] / 1e6, sum[1] / 1e6, sum[3] / 1e6);
    printf("  network model, wire %s: P ranks, each %lld tokens and max(E, P)/P experts, top-%lld uniform; bytes "
           "leaving a rank per layer,\n  time = bytes / link bandwidth (each direction; no latency), beside this "
           "run's single-process compute (forward %.1f ms, backward %.1f ms):\n",
           wire == MXFP8_MPI_WIRE_MXFP8 ? "mxfp8" : "native (bf16)", (long long)p->T, (long long)p->K, tf1 * 1e3,
           tb1 * 1e3);
    printf("  %5s %7s %12s %12s | %-36s | %s\n", "P", "experts", "fwd MB/rank", "bwd MB/rank",
           "100 Gb/s: fwd, bwd ms (% of compute)", "400 Gb/s: fwd, bwd ms (% of compute)");
    static const int Ps[2] = {8, 64};
    for (int i = 0; i < 2; i++) {
        const int P = Ps[i];
        const int64_t E = ((p->E > P ? p->E : P) + P - 1) / P * P;
        const traffic x = remote(p, 6, 0, p->T, E, P, 0);
        const double bf = fwd_bytes(p, x, rb), bb = bwd_bytes(p, x, rb);
        printf("  %5d %7lld %12.2f %12.2f |", P, (long long)E, bf / 1e6, bb / 1e6);
        for (int k = 0; k < 2; k++) {
            const double bw = (k ? 400e9 : 100e9) / 8, f = bf / bw, b = bb / bw;
            printf(" %7.2f, %7.2f (%5.1f%%, %5.1f%%)%s", f * 1e3, b * 1e3, tf1 > 0 ? 100 * f / tf1 : 0.0,
                   tb1 > 0 ? 100 * b / tb1 : 0.0, k ? "\n" : "        |");
        }
    }
}

static void usage(FILE *f) {
    fprintf(f, "usage: mpirun -np P [--bind-to none] mxfp8 bench moe --expert-parallel [--quick] [--reps N]\n"
               "                    [--threads N] [--wire native|mxfp8|both]\n"
               "  The expert-parallel MoE layer (libmxfp8_mpi) per rank -- dispatch / compute / combine times and\n"
               "  bytes -- beside the single-process layer of the same problem in the same run, at the upstream and\n"
               "  the larger problem of `mxfp8 bench moe`, and a model of the exchange at 8 and 64 ranks on 100 and\n"
               "  400 Gb/s links. --quick: the upstream problem only, 2 repetitions. --reps N: best of N after a\n"
               "  warm-up (default 3). --threads N: threads per rank (default: the node's cores shared by its ranks).\n"
               "  --wire: how token rows travel (default native, both = native then mxfp8).\n");
}

int cmd_bench_moe_ep(int argc, char **argv) {
    int reps = 3, quick = 0, wires = 1;
    int64_t threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return CLI_OK; }
        if (!strcmp(a, "moe") || !strcmp(a, "--expert-parallel")) continue;
        if (!strcmp(a, "--quick")) { quick = 1; continue; }
        int64_t v;
        if (!strcmp(a, "--reps") && i + 1 < argc && !cli_int("bench", "reps", argv[++i], 1, 100, &v)) { reps = (int)v; continue; }
        if (!strcmp(a, "--threads") && i + 1 < argc && !cli_int("bench", "threads", argv[++i], 1, 4096, &threads)) continue;
        if (!strcmp(a, "--wire") && i + 1 < argc) {
            const char *w = argv[++i];
            wires = !strcmp(w, "native") ? 1 : !strcmp(w, "mxfp8") ? 2 : !strcmp(w, "both") ? 3 : 0;
            if (wires) continue;
        }
        fprintf(stderr, "mxfp8 bench: --expert-parallel: unknown or bad argument '%s' (only the moe section has an "
                        "expert-parallel form)\n", a);
        usage(stderr);
        return CLI_USAGE;
    }
    if (quick && reps > 2) reps = 2;
    const int own = moe_ep_mpi_begin(&argc, &argv, &g_rank, &g_P);
    mxfp8_info info;
    mxfp8_get_info(&info);
    const int cores = info.num_threads; /* rank 0's single-process run uses them all */
    if (threads) mxfp8_set_num_threads((int)threads);
    else moe_ep_default_threads(MPI_COMM_WORLD);
    mxfp8_get_info(&info);
    const int per_rank = info.num_threads;
    static const bprob probs[2] = {{"upstream", 1024, 1024, 4, 512, 4, 256}, {"larger", 2048, 8192, 8, 512, 2, 1024}};
    int rc = CLI_OK;
    if (g_rank == 0)
        printf("mxfp8 bench moe --expert-parallel -- %d rank%s, %d thread%s per rank (single process: %d), ISA %s, "
               "best of %d after a warm-up\n", g_P, g_P > 1 ? "s" : "", per_rank, per_rank > 1 ? "s" : "", cores,
               info.isa_name, reps);
    for (int pi = 0; pi < (quick ? 1 : 2) && !rc; pi++) {
        const bprob *p = &probs[pi];
        if (g_P > p->E) {
            if (g_rank == 0) printf("\n%s problem: skipped (%d ranks > E = %lld experts)\n", p->name, g_P, (long long)p->E);
            continue;
        }
        double tf1 = -1, tb1 = -1;
        if (g_rank == 0) {
            printf("\n%s problem (H, T, E, B, TopK, I) = (%lld, %lld, %lld, %lld, %lld, %lld), BF16, E4M3\n", p->name,
                   (long long)p->H, (long long)p->T, (long long)p->E, (long long)p->B, (long long)p->K, (long long)p->I);
            fflush(stdout);
            for (int pass = 0; pass < (per_rank != cores ? 2 : 1); pass++) { /* all cores; one rank's threads */
                const int nt = pass ? per_rank : cores;
                double f, b;
                mxfp8_set_num_threads(nt);
                if (single(p, reps, &f, &b)) fprintf(stderr, "mxfp8 bench: single process: %s\n", mxfp8_last_error_message());
                printf("  single process (rank 0, %d thread%s): forward %.1f ms, backward %.1f ms\n", nt,
                       nt > 1 ? "s" : "", f * 1e3, b * 1e3);
                fflush(stdout);
                if (!pass || f < tf1) tf1 = f; /* the reference: the faster single-process run */
                if (!pass || b < tb1) tb1 = b;
            }
            mxfp8_set_num_threads(per_rank);
        }
        sleepy_barrier();
        MPI_Bcast(&tf1, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        MPI_Bcast(&tb1, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        for (int w = 0; w < 2 && !rc; w++) {
            if (!(wires & (1 << w))) continue;
            mxfp8_mpi_moe_stats fs, bs;
            memset(&fs, 0, sizeof fs);
            memset(&bs, 0, sizeof bs);
            slice s;
            memset(&s, 0, sizeof s);
            if (parallel(p, reps, (mxfp8_mpi_wire)w, &fs, &bs, &s)) rc = CLI_FAIL;
            else {
                report(p, &s, &fs, &bs, tf1, tb1, w ? "mxfp8" : "native (bf16)");
                model(p, (mxfp8_mpi_wire)w, &fs, &bs, tf1, tb1);
            }
            slice_free(&s);
            if (g_rank == 0) fflush(stdout);
        }
    }
    if (own) MPI_Finalize();
    return rc;
}
#endif /* MXFP8_HAVE_MPI */
