/*
 * test_mpi_faults.c -- errors without hangs (run under mpiexec with 2..4 ranks, under a time limit; ctest label
 * "mpi"): a bad argument on ONE rank (or a value that differs between ranks) must make EVERY rank return the same
 * status with the same message naming the rank, write no output, return no context, and leave no rank waiting: each
 * faulty call must come back within a few seconds, and a good call afterwards must still give the results of a good
 * call before the faults (no state left behind).
 */
#include "mpi_problem.h"

#define LIMIT_SECONDS 20.0

static const tcase k_case = {"faults", 64, 32, 6, 2, 8, 0, MXFP8_DTYPE_BF16, MXFP8_DTYPE_BF16, MXFP8_DTYPE_BF16,
                             MXFP8_MPI_WIRE_NATIVE, 1, 0, 0, MXFP8_AFFINITY_ON_I, MXFP8_ACT_SILU, MXFP8_FMT_E4M3,
                             MXFP8_SCALE_NKI, -INFINITY, INFINITY, -INFINITY, INFINITY, 1, 0, 0, -1, 3, 0};

typedef struct rig {
    mp m;
    mxfp8_moe_config cfg, cfg_bad;
    int64_t e0, Er, o, Tr;
    mxfp8_mpi_moe_fwd_args a;
    uint16_t *out, *dx, *dW1, *dW2;
    float *W1big, *W2big, *Xbig, *outbig, *dyf;
    int32_t *ids;
} rig;

static void rig_make(rig *R) {
    memset(R, 0, sizeof *R);
    mp *m = &R->m;
    mp_make(m, &k_case, g_size, 77);
    mp_config(&k_case, &R->cfg);
    mxfp8_mpi_moe_expert_range(m->E, g_size, g_rank, &R->e0, &R->Er);
    R->o = m->off[g_rank];
    R->Tr = m->off[g_rank + 1] - R->o;
    const int64_t H = m->H, I = m->I, K = m->K, Er = R->Er, Tr = R->Tr;
    R->ids = tu_alloc(sizeof(int32_t) * (size_t)(Tr * K));
    memcpy(R->ids, m->ids + R->o * K, sizeof(int32_t) * (size_t)(Tr * K));
    mxfp8_mpi_moe_fwd_args *a = &R->a;
    mxfp8_mpi_moe_fwd_args_init(a);
    a->comm = MPI_COMM_WORLD;
    a->num_experts = m->E;
    a->hidden_states = mpv((uint16_t *)m->X + R->o * H, MXFP8_DTYPE_BF16, 2, Tr, H, 0, 0);
    a->topk_ids = mpv(R->ids, MXFP8_DTYPE_I32, 2, Tr, K, 0, 0);
    a->topk_weights = mpv(m->wts + R->o * K, MXFP8_DTYPE_F32, 2, Tr, K, 0, 0);
    a->gate_up_proj_weight = mpv(m->W1 + R->e0 * H * 2 * I, MXFP8_DTYPE_F32, 4, Er, H, 2, I);
    a->down_proj_weight = mpv(m->W2 + R->e0 * I * H, MXFP8_DTYPE_F32, 3, Er, I, H, 0);
    a->block_size = m->B;
    a->config = &R->cfg;
    R->out = tu_alloc(2 * (size_t)(Tr * H));
    R->dx = tu_alloc(2 * (size_t)(Tr * H));
    R->dW1 = tu_alloc(2 * (size_t)(Er * H * 2 * I));
    R->dW2 = tu_alloc(2 * (size_t)(Er * I * H));
    /* locally consistent weights and rows of another hidden size (for the cross-rank disagreement) */
    R->W1big = calloc((size_t)(Er * (H + 32) * 2 * I), sizeof(float));
    R->W2big = calloc((size_t)(Er * I * (H + 32)), sizeof(float));
    R->Xbig = calloc((size_t)(Tr * (H + 32) + 1), sizeof(float));
    R->outbig = calloc((size_t)(Tr * (H + 32) + 1), sizeof(float));
    R->dyf = calloc((size_t)(Tr * H + 1), sizeof(float));
}

static void rig_free(rig *R) {
    free(R->ids); free(R->out); free(R->dx); free(R->dW1); free(R->dW2); free(R->W1big); free(R->W2big);
    free(R->Xbig); free(R->outbig); free(R->dyf);
    mp_free(&R->m);
}

/* Every rank must hold the same status and message; the message must contain `needle` (e.g. "rank 1 of"). */
static void agreed(const char *name, mxfp8_status st, mxfp8_status want, const char *needle, double secs) {
    char msg[512], *all = tu_alloc(512 * (size_t)g_size);
    int sts[64];
    snprintf(msg, sizeof msg, "%s", mxfp8_mpi_last_error_message());
    int s = (int)st;
    MPI_Allgather(msg, 512, MPI_CHAR, all, 512, MPI_CHAR, MPI_COMM_WORLD);
    MPI_Allgather(&s, 1, MPI_INT, sts, 1, MPI_INT, MPI_COMM_WORLD);
    CHECK(st == want, "[%s] status %d (%s), expected %d: %s", name, (int)st, mxfp8_mpi_status_string(st), (int)want,
          msg);
    for (int r = 0; r < g_size; r++) {
        CHECK(sts[r] == s, "[%s] rank %d returned %d, this rank %d", name, r, sts[r], s);
        CHECK(!strcmp(all + 512 * r, msg), "[%s] rank %d's message differs: '%s' vs '%s'", name, r, all + 512 * r,
              msg);
    }
    CHECK(strstr(msg, needle) != NULL, "[%s] message '%s' does not contain '%s'", name, msg, needle);
    CHECK(secs < LIMIT_SECONDS, "[%s] took %.1f s", name, secs);
    if (g_rank == 0) printf("ok   P=%d  %-52s -> %s\n", g_size, name, msg);
    free(all);
}

enum { F_SHAPE, F_H_DIFFERS, F_ID_RANGE, F_ID_DUP, F_E_DIFFERS, F_CFG_DIFFERS, F_OUT_NULL, F_OUT_DTYPE, F_W1_EXPERTS,
       F_BAD_CONFIG_ALL, F_WIRE, F_ALIAS, F_SROUND, F_BIAS_SHAPE, F_BLOCK0, F_NFWD };

static void fwd_fault(rig *R, int f, int bad) {
    mxfp8_mpi_moe_fwd_args a = R->a;
    const int64_t H = R->m.H, I = R->m.I, Er = R->Er, Tr = R->Tr;
    mxfp8_tensor out = mpv(R->out, MXFP8_DTYPE_BF16, 2, Tr, H, 0, 0), *outp = &out;
    const int me = g_rank == bad;
    char needle[64];
    snprintf(needle, sizeof needle, "rank %d of %d", bad, g_size);
    mxfp8_status want = MXFP8_ERR_INVALID_ARGUMENT;
    const char *name = "?";
    R->cfg_bad = R->cfg;
    switch (f) {
    case F_SHAPE: name = "hidden_states [T, H + 32] on one rank"; want = MXFP8_ERR_SHAPE_MISMATCH;
        if (me) a.hidden_states = mpv(R->Xbig, MXFP8_DTYPE_F32, 2, Tr, H + 32, 0, 0);
        break;
    case F_H_DIFFERS: name = "H + 32 everywhere on one rank";
        snprintf(needle, sizeof needle, "has %lld", (long long)(H + 32));
        if (me) { /* consistent on the rank itself: only the agreement can see it */
            a.hidden_states = mpv(R->Xbig, MXFP8_DTYPE_BF16, 2, Tr, H + 32, 0, 0);
            a.gate_up_proj_weight = mpv(R->W1big, MXFP8_DTYPE_F32, 4, Er, H + 32, 2, I);
            a.down_proj_weight = mpv(R->W2big, MXFP8_DTYPE_F32, 3, Er, I, H + 32, 0);
            out = mpv(R->outbig, MXFP8_DTYPE_BF16, 2, Tr, H + 32, 0, 0);
        }
        break;
    case F_ID_RANGE: name = "a topk id out of range on one rank"; want = MXFP8_ERR_INDEX_OUT_OF_RANGE;
        if (me) R->ids[1] = (int32_t)R->m.E;
        break;
    case F_ID_DUP: name = "a topk row naming one expert twice";
        if (me) R->ids[1] = R->ids[0];
        break;
    case F_E_DIFFERS: name = "num_experts differs on the last rank"; snprintf(needle, sizeof needle, "num_experts differs");
        if (me) a.num_experts = R->m.E + 1;
        break;
    case F_CFG_DIFFERS: name = "config.activation differs on one rank"; snprintf(needle, sizeof needle, "config.activation");
        R->cfg_bad.activation = MXFP8_ACT_SWISH;
        if (me) a.config = &R->cfg_bad;
        break;
    case F_OUT_NULL: name = "output NULL on one rank"; want = MXFP8_ERR_NULL_POINTER;
        if (me) outp = NULL;
        break;
    case F_OUT_DTYPE: name = "output of dtype i32 on one rank"; want = MXFP8_ERR_DTYPE;
        if (me) out.dtype = MXFP8_DTYPE_I32;
        break;
    case F_W1_EXPERTS: name = "gate_up_proj_weight of E_r + 1 experts"; want = MXFP8_ERR_SHAPE_MISMATCH;
        if (me) a.gate_up_proj_weight.shape[0] = Er + 1;
        break;
    case F_BAD_CONFIG_ALL: name = "config.quant_dtype 7 on every rank"; snprintf(needle, sizeof needle, "rank 0 of");
        R->cfg_bad.quant_dtype = (mxfp8_format)7;
        a.config = &R->cfg_bad;
        break;
    case F_WIRE: name = "wire 5 on one rank";
        if (me) a.wire = (mxfp8_mpi_wire)5;
        break;
    case F_ALIAS: name = "output overlapping hidden_states"; want = MXFP8_ERR_ALIASING;
        if (me) out.data = a.hidden_states.data;
        break;
    case F_SROUND: name = "config.stochastic_rounding on every rank"; want = MXFP8_ERR_UNSUPPORTED;
        snprintf(needle, sizeof needle, "not supported with expert parallelism");
        R->cfg_bad.stochastic_rounding = 1u << MXFP8_MOE_GEMM1_X;
        a.config = &R->cfg_bad;
        break;
    case F_BLOCK0: name = "block_size 0 on one rank"; /* libmxfp8's rule, before the agreement on the value */
        snprintf(needle, sizeof needle, "block_size 0 must be >= 1");
        if (me) a.block_size = 0;
        break;
    case F_BIAS_SHAPE: name = "down_proj_bias given with config.bias 0 on one rank"; /* libmxfp8's own rule */
        if (me) a.down_proj_bias = mpv(R->W2big, MXFP8_DTYPE_F32, 2, Er, H, 0, 0);
        break;
    }
    memset(R->out, 0x5A, 2 * (size_t)(Tr * H));
    mxfp8_mpi_moe_context *ctx = (mxfp8_mpi_moe_context *)&a; /* must become NULL */
    const double t0 = MPI_Wtime();
    mxfp8_status st = mxfp8_mpi_moe_forward(&a, outp, &ctx, NULL);
    agreed(name, st, want, needle, MPI_Wtime() - t0);
    CHECK(ctx == NULL, "[%s] a context was returned", name);
    int untouched = 1;
    for (int64_t i = 0; i < Tr * H; i++) untouched &= R->out[i] == 0x5A5A;
    CHECK(untouched, "[%s] output written", name);
    memcpy(R->ids, R->m.ids + R->o * R->m.K, sizeof(int32_t) * (size_t)(Tr * R->m.K));
}

/* A good forward + backward: output, hidden_states_grad and dW1 checksums (bits) for the before/after check. */
static uint64_t good_run(rig *R) {
    const int64_t H = R->m.H, I = R->m.I, Er = R->Er, Tr = R->Tr;
    mxfp8_tensor out = mpv(R->out, MXFP8_DTYPE_BF16, 2, Tr, H, 0, 0);
    mxfp8_mpi_moe_context *ctx = NULL;
    mxfp8_status st = mxfp8_mpi_moe_forward(&R->a, &out, &ctx, NULL);
    CHECK(st == MXFP8_OK, "good forward: %s", mxfp8_mpi_last_error_message());
    mxfp8_mpi_moe_bwd_args b;
    mxfp8_mpi_moe_bwd_args_init(&b);
    b.context = ctx;
    b.output_hidden_states_grad = mpv((uint16_t *)R->m.dY + R->o * H, MXFP8_DTYPE_BF16, 2, Tr, H, 0, 0);
    b.gate_up_proj_weight = R->a.gate_up_proj_weight;
    b.down_proj_weight = R->a.down_proj_weight;
    mxfp8_mpi_moe_bwd_grads g;
    memset(&g, 0, sizeof g);
    g.hidden_states_grad = mpv(R->dx, MXFP8_DTYPE_BF16, 2, Tr, H, 0, 0);
    g.gate_up_proj_weight_grad = mpv(R->dW1, MXFP8_DTYPE_BF16, 4, Er, H, 2, I);
    g.down_proj_weight_grad = mpv(R->dW2, MXFP8_DTYPE_BF16, 3, Er, I, H, 0);
    st = mxfp8_mpi_moe_backward(&b, &g, NULL);
    CHECK(st == MXFP8_OK, "good backward: %s", mxfp8_mpi_last_error_message());
    mxfp8_mpi_moe_context_free(ctx);
    uint64_t h = 1469598103934665603ull;
    const uint16_t *bufs[3] = {R->out, R->dx, R->dW1};
    const int64_t ns[3] = {Tr * H, Tr * H, Er * H * 2 * I};
    for (int k = 0; k < 3; k++)
        for (int64_t i = 0; i < ns[k]; i++) h = (h ^ bufs[k][i]) * 1099511628211ull;
    return h;
}

static void bwd_faults(rig *R, int bad) {
    const int64_t H = R->m.H, I = R->m.I, Er = R->Er, Tr = R->Tr, K = R->m.K;
    mxfp8_tensor out = mpv(R->out, MXFP8_DTYPE_BF16, 2, Tr, H, 0, 0);
    mxfp8_mpi_moe_context *ctx = NULL;
    mxfp8_status st = mxfp8_mpi_moe_forward(&R->a, &out, &ctx, NULL);
    CHECK(st == MXFP8_OK, "forward: %s", mxfp8_mpi_last_error_message());
    const int me = g_rank == bad;
    char needle[64];
    for (int f = 0; f < 5; f++) {
        mxfp8_mpi_moe_bwd_args b;
        mxfp8_mpi_moe_bwd_args_init(&b);
        b.context = ctx;
        b.output_hidden_states_grad = mpv((uint16_t *)R->m.dY + R->o * H, MXFP8_DTYPE_BF16, 2, Tr, H, 0, 0);
        b.gate_up_proj_weight = R->a.gate_up_proj_weight;
        b.down_proj_weight = R->a.down_proj_weight;
        mxfp8_mpi_moe_bwd_grads g, *gp = &g;
        memset(&g, 0, sizeof g);
        g.hidden_states_grad = mpv(R->dx, MXFP8_DTYPE_BF16, 2, Tr, H, 0, 0);
        g.gate_up_proj_weight_grad = mpv(R->dW1, MXFP8_DTYPE_BF16, 4, Er, H, 2, I);
        g.down_proj_weight_grad = mpv(R->dW2, MXFP8_DTYPE_BF16, 3, Er, I, H, 0);
        mxfp8_status want = MXFP8_ERR_SHAPE_MISMATCH;
        const char *name = "?";
        snprintf(needle, sizeof needle, "rank %d of %d", bad, g_size);
        if (f == 0) {
            name = "backward: dY [T, H - 1] on one rank";
            if (me) b.output_hidden_states_grad.shape[1] = H - 1;
        } else if (f == 1) {
            name = "backward: dY dtype f32 on one rank";
            want = MXFP8_ERR_INVALID_ARGUMENT;
            snprintf(needle, sizeof needle, "output_hidden_states_grad differs");
            if (me) b.output_hidden_states_grad = mpv(R->dyf, MXFP8_DTYPE_F32, 2, Tr, H, 0, 0);
        } else if (f == 2) {
            name = "backward: topk_weights_grad [T, K + 1]";
            if (me) g.topk_weights_grad = mpv(R->out, MXFP8_DTYPE_BF16, 2, Tr, K + 1, 0, 0);
        } else if (f == 3) {
            name = "backward: gate_up_proj_weight_grad overlapping gate_up_proj_weight"; /* libmxfp8's check */
            want = MXFP8_ERR_ALIASING;
            if (me) g.gate_up_proj_weight_grad.data = b.gate_up_proj_weight.data;
        } else {
            name = "backward: grads NULL on one rank";
            want = MXFP8_ERR_NULL_POINTER;
            if (me) gp = NULL;
        }
        memset(R->dx, 0x5A, 2 * (size_t)(Tr * H));
        memset(R->dW1, 0x5A, 2 * (size_t)(Er * H * 2 * I));
        const double t0 = MPI_Wtime();
        st = mxfp8_mpi_moe_backward(&b, gp, NULL);
        agreed(name, st, want, needle, MPI_Wtime() - t0);
        int untouched = 1;
        for (int64_t i = 0; i < Tr * H; i++) untouched &= R->dx[i] == 0x5A5A;
        for (int64_t i = 0; i < Er * H * 2 * I; i++) untouched &= R->dW1[i] == 0x5A5A;
        CHECK(untouched, "[%s] a gradient was written", name);
    }
    mxfp8_mpi_moe_context_free(ctx);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    mxfp8_set_num_threads(1);
    rig R;
    rig_make(&R);
    const uint64_t before = good_run(&R);
    for (int f = 0; f < F_NFWD; f++) {
        int bad = (f % 2) ? g_size - 1 : (g_size > 2 ? 1 : 0);
        if (f == F_E_DIFFERS) bad = g_size - 1;
        if (f == F_CFG_DIFFERS) bad = 0;
        fwd_fault(&R, f, bad);
    }
    bwd_faults(&R, g_size - 1);
    CHECK(good_run(&R) == before, "a good call after the faults differs from one before them");
    rig_free(&R);
    long all = 0, checks = 0;
    MPI_Allreduce(&g_fail, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&g_checks, &checks, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0) printf("test_mpi_faults (%d ranks): %ld checks, %ld failed\n", g_size, checks, all);
    MPI_Finalize();
    return all ? 1 : 0;
}
