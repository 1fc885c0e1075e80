/*
 * cmd_moe_ep.c -- `mpirun -np P mxfp8 moe-bwd --expert-parallel`: the main job (blockwise_mm_bwd_mxfp8 on the upstream
 * test problem, or a bundle) split over P MPI ranks with libmxfp8_mpi: the tokens in P contiguous, as even as
 * possible, ranges; the experts in contiguous ranges (mxfp8_mpi_moe_expert_range). Every rank builds the whole
 * problem (generated exactly as `mxfp8 moe-bwd` generates it, or read from the same bundle) and takes its slice;
 * the expert-parallel forward makes the checkpoints, the backward is timed (best of --repeat after a warm-up), and
 * rank 0 gathers every gradient, checks it bit for bit against the single-process mxfp8_moe_backward of the whole
 * problem (unless --no-check), prints per-rank dispatch / compute / combine times and bytes, and with --output writes
 * the gradients under the single-process command's names. Only rank 0 prints.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#ifndef MXFP8_HAVE_MPI
int cmd_moe_bwd_ep(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_error("moe-bwd", "--expert-parallel needs a build with MPI (Debian: apt-get install openmpi-bin "
                                "libopenmpi-dev, then rebuild; CMake then builds libmxfp8_mpi)");
}
#else
#include "moe_ep.h"

static const char *const k_cmd = "moe-bwd";
static int g_rank, g_P;

static void help(void) {
    printf("usage: mpirun -np P mxfp8 moe-bwd --expert-parallel [problem and layer options of mxfp8 moe-bwd]\n"
           "                    [--wire native|mxfp8] [--inputs BUNDLE] [--output GRADS] [--no-check]\n\n"
           "The MXFP8 blockwise MoE backward split over P MPI ranks (expert parallelism, libmxfp8_mpi): rank r holds\n"
           "a contiguous range of the tokens and of the experts; token rows travel to the ranks owning their\n"
           "experts and the results travel back. The gradients are bitwise equal to the single-process run, which\n"
           "rank 0 checks (unless --no-check). Prints per-rank dispatch / compute / combine times and bytes.\n\n"
           "options as mxfp8 moe-bwd: --H --T --E --B --topk --I --seed --bias --activation --swiglu-alpha\n"
           "  --swiglu-limit --rounding-seed --affinity --gate-clamp --up-clamp --float8-dtype --scale-rule\n"
           "  --grad-dtype --threads --repeat --inputs --block-size --output --no-check --quiet (not\n"
           "  --stochastic-rounding: its random words follow each element's position, which differs here;\n"
           "  P <= E; every rank reads the bundle, so it must be readable on every machine;\n"
           "  its checkpoints are not used: the expert-parallel forward makes its own)\n"
           "  --wire W      how token rows travel: native (their dtype, default) or mxfp8 (FP8 codes + E8M0 scales\n"
           "                along H, about half the bytes; the check then uses the rows' MX round trip)\n"
           "  --threads N   threads per rank (default: the cores the library sees, shared by the ranks of a node)\n\n"
           "exit status: 0 ok, 1 a gradient differs from the single-process run, 2 bad usage, bad input or error\n");
}

typedef struct run {
    moe_ep_problem p;
    mxfp8_moe_config cfg;
    mxfp8_mpi_wire wire;
    int64_t o, Tr, e0, Er, repeat;
    tf_dtype gdt;
    int check;
    const char *in_path, *out_path;
} run;

static int parse(int argc, char **argv, run *R) {
    cli_opt opts[] = {{"H", 0, 0, NULL}, {"T", 0, 0, NULL}, {"E", 0, 0, NULL}, {"B", 0, 0, NULL},
                      {"topk", 0, 0, NULL}, {"I", 0, 0, NULL}, {"seed", 0, 0, NULL}, CLI_MOE_LAYER_OPTS,
                      {"grad-dtype", 0, 0, NULL}, {"threads", 0, 0, NULL}, {"repeat", 0, 0, NULL},
                      {"inputs", 'i', 0, NULL}, {"block-size", 0, 0, NULL}, {"output", 'o', 0, NULL},
                      {"no-check", 0, 1, NULL}, {"quiet", 'q', 1, NULL}, {"expert-parallel", 0, 1, NULL},
                      {"wire", 0, 0, NULL}};
    const int nopts = (int)(sizeof opts / sizeof opts[0]);
    int npos, rc = cli_parse(k_cmd, argc, argv, opts, nopts, NULL, 0, &npos);
    if (rc < 0) {
        if (g_rank == 0) help();
        return -1;
    }
    if (rc) return rc;
#define OPT(n) cli_get(opts, nopts, n)
    int64_t H = 1024, T = 1024, E = 4, B = 512, K = 4, I = 256, seed = 42, bs = 0;
    const int64_t DMAX = (int64_t)1 << 24;
    static const char *const gdts[] = {"bf16", "f32", "f16"}, *const wires[] = {"native", "mxfp8"};
    static const tf_dtype gdtv[] = {TF_BF16, TF_F32, TF_F16};
    int gdt = 0, wire = 0;
    mxfp8_moe_config_init(&R->cfg);
    R->repeat = 1;
    if (cli_int(k_cmd, "H", OPT("H"), 1, DMAX, &H) || cli_int(k_cmd, "T", OPT("T"), 0, DMAX, &T) ||
        cli_int(k_cmd, "E", OPT("E"), 1, 1 << 16, &E) || cli_int(k_cmd, "B", OPT("B"), 1, DMAX, &B) ||
        cli_int(k_cmd, "topk", OPT("topk"), 1, 1 << 16, &K) || cli_int(k_cmd, "I", OPT("I"), 1, DMAX, &I) ||
        cli_int(k_cmd, "seed", OPT("seed"), 0, INT64_MAX, &seed) ||
        cli_int(k_cmd, "repeat", OPT("repeat"), 1, 1000, &R->repeat) ||
        cli_int(k_cmd, "block-size", OPT("block-size"), 1, DMAX, &bs) ||
        cli_moe_layer(k_cmd, opts, nopts, &R->cfg) ||
        cli_choice(k_cmd, "grad-dtype", OPT("grad-dtype"), gdts, 3, &gdt) ||
        cli_choice(k_cmd, "wire", OPT("wire"), wires, 2, &wire) ||
        cli_threads(k_cmd, OPT("threads")))
        return CLI_USAGE;
    if (R->cfg.stochastic_rounding)
        return cli_error(k_cmd, "--stochastic-rounding does not work with --expert-parallel: the random word of an "
                         "element comes from its logical index (its position in the dispatched blocks, or its "
                         "expert's index in the weights), which a rank's own blocks and experts do not share with the "
                         "single-process layer; run it without --expert-parallel");
    if (!OPT("threads")) moe_ep_default_threads(MPI_COMM_WORLD);
    R->gdt = gdtv[gdt];
    R->wire = (mxfp8_mpi_wire)wire;
    R->in_path = OPT("inputs");
    R->out_path = OPT("output");
    R->check = OPT("no-check") == NULL;
    char err[TF_ERR_LEN];
    static const char *const shape_opts[] = {"H", "T", "E", "B", "topk", "I", "seed"};
    if (R->in_path) {
        for (int i = 0; i < 7; i++)
            if (OPT(shape_opts[i]))
                return cli_error(k_cmd, "--%s sets the random problem; with --inputs the bundle decides", shape_opts[i]);
        if (moe_ep_load(&R->p, R->in_path, bs, err, sizeof err)) return cli_error(k_cmd, "%s", err);
        if (R->p.b1 || R->p.b2) R->cfg.bias = 1;
        R->cfg.skip_token = R->p.skip_token;
        const tf_tensor *codes = R->p.w1c ? R->p.w1c : R->p.w2c;
        if (codes && !OPT("float8-dtype")) R->cfg.quant_dtype = codes->dtype == TF_F8_E5M2 ? MXFP8_FMT_E5M2 : MXFP8_FMT_E4M3;
    } else {
        if (bs) return cli_error(k_cmd, "--block-size is for --inputs bundles; the random problem's is --B");
        if (K > E) return cli_error(k_cmd, "--topk %lld is above --E %lld", (long long)K, (long long)E);
        if (moe_ep_generate(&R->p, H, T, E, B, K, I, (uint64_t)seed, R->cfg.bias, err, sizeof err))
            return cli_error(k_cmd, "%s", err);
    }
    if (g_P > R->p.E) return cli_error(k_cmd, "%d ranks for %lld experts: expert parallelism needs ranks <= experts",
                                       g_P, (long long)R->p.E);
    if (R->out_path && tf_check_writable(R->out_path, 6, err, sizeof err)) return cli_error(k_cmd, "%s", err);
#undef OPT
    /* this rank's slice: tokens as even as possible, experts by mxfp8_mpi_moe_expert_range */
    const int64_t q = R->p.T / g_P, r = R->p.T % g_P;
    R->o = g_rank * q + (g_rank < r ? g_rank : r);
    R->Tr = q + (g_rank < r);
    mxfp8_mpi_moe_expert_range(R->p.E, g_P, g_rank, &R->e0, &R->Er);
    return CLI_OK;
}

/* A view of rows [r0, r0 + n) (along the first axis) of a tensor (absent for NULL). */
static mxfp8_tensor rows(const tf_tensor *t, int64_t r0, int64_t n) {
    if (!t) return MXFP8_TENSOR_NONE;
    mxfp8_tensor v = tf_view(t);
    v.data = (char *)v.data + (size_t)(r0 * v.strides[0]) * mxfp8_dtype_size(v.dtype);
    v.shape[0] = n;
    return v;
}

/* This rank's results. */
typedef struct local {
    tf_set t;
    tf_tensor *y, *g[6];
    mxfp8_mpi_moe_stats fs, bs;
} local;

static const char *const k_grad[6] = {"hidden_states_grad", "expert_affinities_masked_grad",
                                      "gate_up_proj_weight_grad", "down_proj_weight_grad",
                                      "gate_and_up_proj_bias_grad", "down_proj_bias_grad"};

static void grad_shapes(const run *R, int64_t T, int64_t E, int64_t sh[6][4], int nd[6]) {
    const moe_ep_problem *p = &R->p;
    const int64_t s[6][4] = {{T, p->H}, {T * p->E, 1}, {E, p->H, 2, p->I}, {E, p->I, p->H}, {E, 2, p->I}, {E, p->H}};
    const int n[6] = {2, (p->ea && p->ea->ndim == 1) ? 1 : 2, 4, 3, 3, 2};
    memcpy(sh, s, sizeof s);
    memcpy(nd, n, sizeof n);
}

/* The expert-parallel forward (an untimed one, then the timed one that keeps the checkpoints), one untimed
 * backward, then --repeat timed ones (the best kept). */
static int run_ep(const run *R, local *L, char *err) {
    const moe_ep_problem *p = &R->p;
    const int ng = R->cfg.bias ? 6 : 4;
    int64_t sh[6][4], sy[2] = {R->Tr, p->H};
    int nd[6];
    grad_shapes(R, R->Tr, R->Er, sh, nd);
    if (!(L->y = tf_add_new(&L->t, "output", TF_BF16, 2, sy, err, TF_ERR_LEN))) return -1;
    for (int i = 0; i < ng; i++)
        if (!(L->g[i] = tf_add_new(&L->t, k_grad[i], R->gdt, nd[i], sh[i], err, TF_ERR_LEN))) return -1;
    mxfp8_mpi_moe_fwd_args a;
    mxfp8_mpi_moe_fwd_args_init(&a);
    a.comm = MPI_COMM_WORLD;
    a.num_experts = p->E;
    a.hidden_states = rows(p->x, R->o, R->Tr);
    if (p->ids) {
        a.topk_ids = rows(p->ids, R->o, R->Tr);
        a.topk_weights = rows(p->wts, R->o, R->Tr);
    } else {
        a.expert_affinities_masked = rows(p->ea, R->o * p->E, R->Tr * p->E);
    }
    a.gate_up_proj_weight = rows(p->w1, R->e0, R->Er);
    a.down_proj_weight = rows(p->w2, R->e0, R->Er);
    if (R->cfg.bias) {
        a.gate_and_up_proj_bias = rows(p->b1, R->e0, R->Er);
        a.down_proj_bias = rows(p->b2, R->e0, R->Er);
    }
    a.block_size = p->B;
    a.config = &R->cfg;
    a.wire = R->wire;
    mxfp8_tensor y = tf_view(L->y);
    mxfp8_mpi_moe_context *ctx = NULL;
    /* an untimed inference forward first: MPI sets up its connections on the first exchanges */
    mxfp8_status st = mxfp8_mpi_moe_forward(&a, &y, NULL, NULL);
    if (!st) st = mxfp8_mpi_moe_forward(&a, &y, &ctx, &L->fs);
    if (st) return snprintf(err, TF_ERR_LEN, "%s", mxfp8_mpi_last_error_message()), -1;
    mxfp8_mpi_moe_bwd_args b;
    mxfp8_mpi_moe_bwd_args_init(&b);
    b.context = ctx;
    b.output_hidden_states_grad = rows(p->dy, R->o, R->Tr);
    b.gate_up_proj_weight = p->w1c ? rows(p->w1c, R->e0, R->Er) : a.gate_up_proj_weight;
    b.down_proj_weight = p->w2c ? rows(p->w2c, R->e0, R->Er) : a.down_proj_weight;
    if (p->w1s) b.gate_up_weight_scales = rows(p->w1s, R->e0, R->Er);
    if (p->w2s) b.down_weight_scales = rows(p->w2s, R->e0, R->Er);
    b.gate_and_up_proj_bias = a.gate_and_up_proj_bias;
    b.down_proj_bias = a.down_proj_bias;
    mxfp8_mpi_moe_bwd_grads g;
    memset(&g, 0, sizeof g);
    mxfp8_tensor *slot[6] = {&g.hidden_states_grad, &g.expert_affinities_masked_grad, &g.gate_up_proj_weight_grad,
                             &g.down_proj_weight_grad, &g.gate_and_up_proj_bias_grad, &g.down_proj_bias_grad};
    for (int i = 0; i < ng; i++) *slot[i] = tf_view(L->g[i]);
    double best = INFINITY;
    for (int64_t it = 0; it <= R->repeat && !st; it++) { /* it == 0: the warm-up */
        mxfp8_mpi_moe_stats s;
        st = mxfp8_mpi_moe_backward(&b, &g, &s);
        const double t = s.dispatch_seconds + s.compute_seconds + s.combine_seconds;
        if (!st && it > 0 && t < best) {
            best = t;
            L->bs = s;
        }
    }
    if (st) snprintf(err, TF_ERR_LEN, "%s", mxfp8_mpi_last_error_message());
    mxfp8_mpi_moe_context_free(ctx);
    return st ? -1 : 0;
}

/* Gather `l` (this rank's part, split along the first axis) into `g` on rank 0 (sizes checked by the caller). */
static void gather(const tf_tensor *l, tf_tensor *g) {
    int cnt = (int)l->nbytes, cnts[4096], dsp[4096];
    MPI_Gather(&cnt, 1, MPI_INT, cnts, 1, MPI_INT, 0, MPI_COMM_WORLD);
    for (int r = 0, o = 0; g_rank == 0 && r < g_P; r++) {
        dsp[r] = o;
        o += cnts[r];
    }
    MPI_Gatherv(l->data ? l->data : (void *)cnts, cnt, MPI_BYTE, g ? g->data : NULL, cnts, dsp, MPI_BYTE, 0,
                MPI_COMM_WORLD);
}

/* The single-process layer of the whole problem on rank 0: mxfp8_moe_forward (checkpoints), mxfp8_moe_backward. */
static int reference(const run *R, tf_set *ref, tf_tensor **y, tf_tensor *g[6], char *err) {
    const moe_ep_problem *p = &R->p;
    tf_set w = {0};
    const int ng = R->cfg.bias ? 6 : 4;
    int64_t sh[6][4], N = 0;
    int nd[6];
    grad_shapes(R, p->T, p->E, sh, nd);
    tf_tensor *tpi = tf_find(&p->in, "token_position_to_id"), *b2e = tf_find(&p->in, "block_to_expert"), *ea = p->ea;
    int rc = -1;
    if (p->ids) { /* routed as the single-process command routes it */
        if (mxfp8_moe_num_blocks(p->T, p->K, p->E, p->B, &N)) goto lib;
        const int64_t s_t[1] = {N * p->B}, s_b[2] = {N, 1}, s_a[2] = {p->T * p->E, 1};
        if (!(tpi = tf_add_new(&w, "tpi", TF_I32, 1, s_t, err, TF_ERR_LEN)) ||
            !(b2e = tf_add_new(&w, "b2e", TF_I32, 2, s_b, err, TF_ERR_LEN)) ||
            !(ea = tf_add_new(&w, "ea", p->x->dtype, 2, s_a, err, TF_ERR_LEN)))
            goto out;
        mxfp8_tensor vi = tf_view(p->ids), vw = tf_view(p->wts), vt = tf_view(tpi), vb = tf_view(b2e), va = tf_view(ea);
        if (mxfp8_moe_route(&vi, &vw, p->E, p->B, -1, &vt, &vb, &va)) goto lib;
    }
    N = b2e->shape[0];
    mxfp8_moe_fwd_args f;
    mxfp8_moe_fwd_args_init(&f);
    f.hidden_states = tf_view(p->x);
    f.expert_affinities_masked = tf_view(ea);
    f.gate_up_proj_weight = tf_view(p->w1);
    f.down_proj_weight = tf_view(p->w2);
    f.token_position_to_id = tf_view(tpi);
    f.block_to_expert = tf_view(b2e);
    f.block_size = p->B;
    f.config = &R->cfg;
    if (R->cfg.bias) {
        f.gate_and_up_proj_bias = tf_view(p->b1);
        f.down_proj_bias = tf_view(p->b2);
    }
    const int64_t s_y[2] = {p->T, p->H}, s_ck[4] = {N, 2, p->I, p->B}, s_dp[3] = {N, p->B, p->H};
    tf_tensor *ck, *dp;
    if (!(*y = tf_add_new(ref, "output", TF_BF16, 2, s_y, err, TF_ERR_LEN)) ||
        !(ck = tf_add_new(&w, "ck", TF_F32, 4, s_ck, err, TF_ERR_LEN)) ||
        !(dp = tf_add_new(&w, "dp", TF_F32, 3, s_dp, err, TF_ERR_LEN)))
        goto out;
    mxfp8_moe_fwd_outputs fo;
    memset(&fo, 0, sizeof fo);
    fo.output = tf_view(*y);
    fo.gate_up_proj_act_checkpoint_T = tf_view(ck);
    fo.down_proj_output_checkpoint = tf_view(dp);
    if (mxfp8_moe_forward(&f, &fo)) goto lib;
    mxfp8_moe_bwd_args b;
    mxfp8_moe_bwd_args_init(&b);
    b.hidden_states = f.hidden_states; b.expert_affinities_masked = f.expert_affinities_masked;
    b.gate_up_proj_weight = p->w1c ? tf_view(p->w1c) : f.gate_up_proj_weight;
    b.down_proj_weight = p->w2c ? tf_view(p->w2c) : f.down_proj_weight;
    if (p->w1s) b.gate_up_weight_scales = tf_view(p->w1s);
    if (p->w2s) b.down_weight_scales = tf_view(p->w2s);
    b.token_position_to_id = f.token_position_to_id; b.block_to_expert = f.block_to_expert;
    b.output_hidden_states_grad = tf_view(p->dy); b.block_size = p->B; b.config = &R->cfg;
    b.gate_and_up_proj_bias = f.gate_and_up_proj_bias; b.down_proj_bias = f.down_proj_bias;
    if (!p->w1c && !p->w2c) { /* as the single-process command: with the forward's checkpoints */
        b.gate_up_proj_act_checkpoint_T = fo.gate_up_proj_act_checkpoint_T;
        if (R->cfg.affinity_option == MXFP8_AFFINITY_ON_H) b.down_proj_output_checkpoint = fo.down_proj_output_checkpoint;
    }
    mxfp8_moe_bwd_grads gr;
    memset(&gr, 0, sizeof gr);
    mxfp8_tensor *slot[6] = {&gr.hidden_states_grad, &gr.expert_affinities_masked_grad, &gr.gate_up_proj_weight_grad,
                             &gr.down_proj_weight_grad, &gr.gate_and_up_proj_bias_grad, &gr.down_proj_bias_grad};
    for (int i = 0; i < ng; i++) {
        if (!(g[i] = tf_add_new(ref, k_grad[i], R->gdt, nd[i], sh[i], err, TF_ERR_LEN))) goto out;
        *slot[i] = tf_view(g[i]);
    }
    if (mxfp8_moe_backward(&b, &gr)) goto lib;
    rc = 0;
    goto out;
lib:
    snprintf(err, TF_ERR_LEN, "single-process reference: %s", mxfp8_last_error_message());
out:
    tf_free(&w);
    return rc;
}

static void report(const run *R, const local *L) {
    int64_t mine[4] = {R->Tr, R->Er, R->e0, L->fs.local_pairs}, *all = malloc(sizeof(int64_t) * 4 * (size_t)g_P);
    mxfp8_mpi_moe_stats *fs = malloc(sizeof *fs * (size_t)g_P), *bs = malloc(sizeof *bs * (size_t)g_P);
    if (!all || !fs || !bs) abort();
    MPI_Gather(mine, 4, MPI_INT64_T, all, 4, MPI_INT64_T, 0, MPI_COMM_WORLD);
    MPI_Gather(&L->fs, (int)sizeof L->fs, MPI_BYTE, fs, (int)sizeof L->fs, MPI_BYTE, 0, MPI_COMM_WORLD);
    MPI_Gather(&L->bs, (int)sizeof L->bs, MPI_BYTE, bs, (int)sizeof L->bs, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (g_rank == 0) {
        printf("\nper rank (ms; MB to / from other ranks; each after a warm-up call, backward: best of %lld):\n",
               (long long)R->repeat);
        printf("%4s %6s %7s %6s | %-28s %-13s | %-28s %s\n", "rank", "tokens", "experts", "pairs",
               "forward dispatch/compute/comb", "MB sent/recv", "backward dispatch/compute/comb", "MB sent/recv");
        for (int r = 0; r < g_P; r++) {
            const mxfp8_mpi_moe_stats *f = &fs[r], *b = &bs[r];
            char ex[24];
            snprintf(ex, sizeof ex, "%lld-%lld", (long long)all[4 * r + 2], (long long)(all[4 * r + 2] + all[4 * r + 1] - 1));
            printf("%4d %6lld %7s %6lld | %8.2f %9.2f %8.2f  %6.2f/%-6.2f | %8.2f %9.2f %8.2f  %6.2f/%-6.2f\n", r,
                   (long long)all[4 * r], ex, (long long)all[4 * r + 3], f->dispatch_seconds * 1e3,
                   f->compute_seconds * 1e3, f->combine_seconds * 1e3,
                   (double)(f->dispatch_bytes_sent + f->combine_bytes_sent) / 1e6,
                   (double)(f->dispatch_bytes_received + f->combine_bytes_received) / 1e6, b->dispatch_seconds * 1e3,
                   b->compute_seconds * 1e3, b->combine_seconds * 1e3,
                   (double)(b->dispatch_bytes_sent + b->combine_bytes_sent) / 1e6,
                   (double)(b->dispatch_bytes_received + b->combine_bytes_received) / 1e6);
        }
    }
    free(all);
    free(fs);
    free(bs);
}

/* Gather, check (rank 0), write. Returns the exit code on rank 0 (CLI_OK / CLI_FAIL / CLI_USAGE). */
static int finish(const run *R, local *L, char *err) {
    const moe_ep_problem *p = &R->p;
    const int ng = R->cfg.bias ? 6 : 4;
    int64_t sh[6][4], sy[2] = {p->T, p->H};
    int nd[6], rc = CLI_OK;
    grad_shapes(R, p->T, p->E, sh, nd);
    tf_set all = {0}, ref = {0};
    tf_tensor *gy = NULL, *gg[6] = {0}, *ry = NULL, *rg[6] = {0};
    /* the same decision on every rank (global sizes): MPI-3 counts are ints */
    if (g_P > 4096 || 2 * (double)p->T * (double)p->H * 4 > INT32_MAX ||
        (double)p->E * (double)p->H * 2 * (double)p->I * 4 > INT32_MAX) {
        snprintf(err, TF_ERR_LEN, "the problem is too large to gather on rank 0 for the check (use --no-check "
                 "without --output, or fewer tokens / experts)");
        if (R->check || R->out_path) return CLI_USAGE;
        report(R, L);
        return CLI_OK;
    }
    if (g_rank == 0 && !(gy = tf_add_new(&all, "output", TF_BF16, 2, sy, err, TF_ERR_LEN))) rc = CLI_USAGE;
    for (int i = 0; i < ng && !rc; i++)
        if (g_rank == 0 && !(gg[i] = tf_add_new(&all, k_grad[i], R->gdt, nd[i], sh[i], err, TF_ERR_LEN))) rc = CLI_USAGE;
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (rc) goto out;
    gather(L->y, gy);
    for (int i = 0; i < ng; i++) gather(L->g[i], gg[i]);
    report(R, L);
    if (g_rank != 0 || rc) goto out;
    if (R->check) {
        if (R->wire == MXFP8_MPI_WIRE_MXFP8) {
            printf("\ncheck: skipped for --wire mxfp8 (the layer then computes on the rows' MX round trip; the\n"
                   "tests compare that with the single-process layer given the round-tripped rows)\n");
        } else if (reference(R, &ref, &ry, rg, err)) {
            rc = CLI_USAGE;
            goto out;
        } else {
            int bad = memcmp(gy->data, ry->data, gy->nbytes) != 0;
            printf("\nbitwise equal to the single-process mxfp8_moe_forward / mxfp8_moe_backward of the whole problem:\n");
            printf("  %-30s %s\n", "output (forward)", bad ? "DIFFERS" : "equal");
            for (int i = 0; i < ng; i++) {
                const int d = memcmp(gg[i]->data, rg[i]->data, gg[i]->nbytes) != 0;
                printf("  %-30s %s\n", k_grad[i], d ? "DIFFERS" : "equal");
                bad |= d;
            }
            printf("verdict: %s\n", bad ? "FAIL -- the expert-parallel result differs from the single-process one"
                                        : "PASS -- every result is bitwise equal to the single-process run");
            rc = bad ? CLI_FAIL : CLI_OK;
        }
    }
    if (R->out_path) {
        tf_set out = {0};
        for (int i = 0; i < ng; i++) { /* move the gradients (not the output) into the written set */
            tf_tensor *t = gg[i];
            if (tf_add(&out, t->name, t->dtype, t->ndim, t->shape, t->data, err, TF_ERR_LEN)) break;
            t->data = NULL;
        }
        if (out.n != ng || tf_save(R->out_path, &out, err, TF_ERR_LEN)) rc = CLI_USAGE;
        else printf("wrote %d gradients to %s\n", ng, R->out_path);
        tf_free(&out);
    }
out:
    tf_free(&all);
    tf_free(&ref);
    return rc;
}

int cmd_moe_bwd_ep(int argc, char **argv) {
    const int own = moe_ep_mpi_begin(&argc, &argv, &g_rank, &g_P);
    run R;
    memset(&R, 0, sizeof R);
    local L;
    memset(&L, 0, sizeof L);
    char err[TF_ERR_LEN] = "";
    /* Every rank parses the same options, so their errors are rank 0's: the other ranks keep theirs in memory and
       print them only when rank 0 had none (e.g. a bundle that one machine cannot read). glibc lets a program set
       stderr like any variable. */
    char *ebuf = NULL;
    size_t elen = 0;
    FILE *saved = stderr, *mem = g_rank ? open_memstream(&ebuf, &elen) : NULL;
    if (mem) stderr = mem;
    int rc = parse(argc, argv, &R), rc0 = rc, worst;
    if (mem) {
        stderr = saved;
        fclose(mem);
    }
    MPI_Bcast(&rc0, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rc && rc != -1 && rc0 == CLI_OK && ebuf) fprintf(stderr, "rank %d: %s", g_rank, ebuf);
    free(ebuf);
    if (rc0 == -1 || worst) { /* -1: --help */
        if (rc0 == CLI_OK && g_rank == 0) cli_error(k_cmd, "another rank could not set up the problem (its error "
                                                           "is above)");
        rc = rc0 == -1 ? CLI_OK : CLI_USAGE;
        goto done;
    }
    if (g_rank == 0) {
        mxfp8_info info;
        mxfp8_get_info(&info);
        printf("mxfp8 moe-bwd --expert-parallel  %d rank%s, H=%lld T=%lld E=%lld B=%lld", g_P, g_P > 1 ? "s" : "",
               (long long)R.p.H, (long long)R.p.T, (long long)R.p.E, (long long)R.p.B);
        if (R.p.K > 0) printf(" TopK=%lld", (long long)R.p.K);
        printf(" I=%lld, wire %s, %d thread%s per rank (%s)\n", (long long)R.p.I,
               R.wire ? "mxfp8" : "native", info.num_threads, info.num_threads > 1 ? "s" : "", info.isa_name);
        printf("inputs: %s\n", R.in_path ? R.in_path : "random, as mxfp8 moe-bwd (same seed, same problem)");
        if (R.p.ignored_checkpoints) printf("note: the bundle's checkpoints are not used (the forward makes its own)\n");
        fflush(stdout);
    }
    rc = run_ep(&R, &L, err) ? CLI_USAGE : CLI_OK; /* the library's errors are the same on every rank */
    if (rc) {
        if (g_rank == 0) cli_error(k_cmd, "%s", err);
        goto done;
    }
    rc = finish(&R, &L, err);
    if (rc == CLI_USAGE && g_rank == 0) cli_error(k_cmd, "%s", err);
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
done:
    tf_free(&L.t);
    moe_ep_free(&R.p);
    if (own) MPI_Finalize();
    return rc;
}
#endif /* MXFP8_HAVE_MPI */
