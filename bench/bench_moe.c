/*
 * bench_moe.c -- the blockwise MoE layer at the upstream problem (H, T, E, B, TopK, I) = (1024, 1024, 4, 512, 4,
 * 256), a fine-grained one (1024, 2048, 64, 128, 8, 256: 256 tokens per expert), the MoE layers of a training
 * step (D, 2048, 8, 128, 2, I) at D = 1024 (I = 1024) and D = 256 (I = 512), and a larger one (2048, 8192, 8, 512,
 * 2, 1024), BF16 tensors, E4M3, and the two training-step layers again in mxfp8.torch's training configuration
 * (FP32 weights, affinities and their gradients, the FP32 gate/up checkpoint written by the forward and given to the
 * backward, which recomputes the other three; JSON "configuration": "training", else "bf16"):
 *   - mxfp8_moe_backward with all four forward checkpoints given (no recompute); FLOPs = the GEMM FLOPs of phases
 *     1-4 = 12 x rows x H x I;
 *   - mxfp8_moe_forward writing the output only; FLOPs = 6 x rows x H x I (gate/up projection 4, down 2).
 * rows = the real routed rows T x TopK (used for "% of peak") or all N x B block rows (padding included).
 * Baselines: oneDNN doing the same GEMMs per block on pre-gathered BF16 operands, with no quantization, no
 * activation (forward or backward), no gather/scatter: backward dI = dY W2^T, dX = dGU W1^T, dW1 += X^T dGU,
 * dW2 += inter^T dY (weight gradients accumulated in FP32 by a sum post-op); forward GU = X W1, Y = inter W2.
 * Memory (backward): bytes of inputs + outputs, resident set before the call and its peak during the calls.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "moe_problem.h"

/* ---- the oneDNN baselines ---- */
typedef struct dnnl_moe {
    moe_prob p;
    int64_t N;
    const int32_t *b2e;
    uint16_t *xg, *dyg, *dgu, *inter, *w1, *w2, *di, *dxb, *gu, *yb; /* gathered rows, weights, per-block outputs */
    float *dw1, *dw2;
    bench_gemm g[4];
} dnnl_moe;

/* Per block n of expert e: P1 dI[B,I] = dY_n[B,H] @ W2[e]^T; P2 dX_n[B,H] = dGU_n[B,2I] @ W1[e]^T;
 * P3 dW1[e][H,2I] += X_n^T @ dGU_n; P4 dW2[e][I,H] += inter_n[I,B] @ dY_n. */
static int run_dnnl_bwd(void *pv) {
    dnnl_moe *c = pv;
    moe_prob p = c->p;
    for (int64_t n = 0; n < c->N; n++) {
        int64_t e = c->b2e[n];
        uint16_t *dyn = c->dyg + n * p.B * p.H, *xn = c->xg + n * p.B * p.H, *dgun = c->dgu + n * p.B * 2 * p.I;
        if (bench_gemm_run(&c->g[0], dyn, c->w2 + e * p.I * p.H, c->di) ||
            bench_gemm_run(&c->g[1], dgun, c->w1 + e * p.H * 2 * p.I, c->dxb) ||
            bench_gemm_run(&c->g[2], xn, dgun, c->dw1 + e * p.H * 2 * p.I) ||
            bench_gemm_run(&c->g[3], c->inter + n * p.I * p.B, dyn, c->dw2 + e * p.I * p.H))
            return -1;
    }
    return bench_gemm_wait();
}

/* Per block n of expert e: GU_n[B,2I] = X_n[B,H] @ W1[e][H,2I]; Y_n[B,H] = inter_n[B,I] @ W2[e][I,H]. */
static int run_dnnl_fwd(void *pv) {
    dnnl_moe *c = pv;
    moe_prob p = c->p;
    for (int64_t n = 0; n < c->N; n++) {
        int64_t e = c->b2e[n];
        if (bench_gemm_run(&c->g[0], c->xg + n * p.B * p.H, c->w1 + e * p.H * 2 * p.I, c->gu) ||
            bench_gemm_run(&c->g[1], c->inter + n * p.I * p.B, c->w2 + e * p.I * p.H, c->yb))
            return -1;
    }
    return bench_gemm_wait();
}

/* Median time of the baseline of the backward (fwd = 0) or forward (fwd = 1) on N threads; -1 when absent. */
static double dnnl_time(const bench_ctx *b, const moe_problem *m, int fwd) {
    if (!bench_dnnl_linked()) return -1;
    dnnl_moe c;
    memset(&c, 0, sizeof c);
    moe_prob p = m->p;
    c.p = p;
    c.N = m->N;
    c.b2e = m->b2e;
    size_t rows = (size_t)(m->N * p.B), w1 = (size_t)(p.E * p.H * 2 * p.I), w2 = (size_t)(p.E * p.I * p.H);
    c.xg = bench_alloc(rows * (size_t)p.H * 2);
    c.inter = bench_alloc(rows * (size_t)p.I * 2);
    c.w1 = bench_alloc(w1 * 2);
    c.w2 = bench_alloc(w2 * 2);
    int ok = c.xg && c.inter && c.w1 && c.w2;
    if (fwd) {
        c.gu = bench_alloc((size_t)(p.B * 2 * p.I) * 2);
        c.yb = bench_alloc((size_t)(p.B * p.H) * 2);
        ok = ok && c.gu && c.yb;
    } else {
        c.dyg = bench_alloc(rows * (size_t)p.H * 2);
        c.dgu = bench_alloc(rows * (size_t)(2 * p.I) * 2);
        c.di = bench_alloc((size_t)(p.B * p.I) * 2);
        c.dxb = bench_alloc((size_t)(p.B * p.H) * 2);
        c.dw1 = bench_alloc(w1 * 4);
        c.dw2 = bench_alloc(w2 * 4);
        ok = ok && c.dyg && c.dgu && c.di && c.dxb && c.dw1 && c.dw2;
    }
    bench_time t = {-1, -1, 0};
    if (ok) {
        bench_fill_bf16(c.xg, rows * (size_t)p.H, 0, 1);
        bench_fill_bf16(c.inter, rows * (size_t)p.I, -1, 1);
        bench_fill_bf16(c.w1, w1, -0.1, 0.1);
        bench_fill_bf16(c.w2, w2, -0.1, 0.1);
        if (fwd) {
            ok = !bench_gemm_init(&c.g[0], p.B, 2 * p.I, p.H, 0, 0, 0) &&
                 !bench_gemm_init(&c.g[1], p.B, p.H, p.I, 0, 0, 0);
        } else {
            bench_fill_bf16(c.dyg, rows * (size_t)p.H, -1, 1);
            bench_fill_bf16(c.dgu, rows * (size_t)(2 * p.I), -1, 1);
            memset(c.dw1, 0, w1 * 4);
            memset(c.dw2, 0, w2 * 4);
            ok = !bench_gemm_init(&c.g[0], p.B, p.I, p.H, 0, 1, 0) &&
                 !bench_gemm_init(&c.g[1], p.B, p.H, 2 * p.I, 0, 1, 0) &&
                 !bench_gemm_init(&c.g[2], p.H, 2 * p.I, p.B, 1, 0, 1) &&
                 !bench_gemm_init(&c.g[3], p.I, p.H, p.B, 0, 0, 1);
        }
        if (ok) bench_measure(b, fwd ? run_dnnl_fwd : run_dnnl_bwd, &c, 1, &t);
    }
    for (int i = 0; i < 4; i++) bench_gemm_free(&c.g[i]);
    void *bufs[] = {c.xg, c.dyg, c.dgu, c.inter, c.w1, c.w2, c.di, c.dxb, c.gu, c.yb, c.dw1, c.dw2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    return t.median;
}

/* ---- rows ---- */
typedef struct moe_op {
    const char *op;        /* "bwd" / "fwd" */
    double fl_real, fl_all;
    bench_item it;
    double td;             /* oneDNN baseline, N threads */
} moe_op;

typedef struct moe_mem {
    double io, rss0, peak, maxrss, ws; /* ws: bytes the problem's workspace holds after the calls */
    int isolated; /* peak measured from a reset high-water mark (else ru_maxrss of the whole process) */
} moe_mem;

static const char *moe_error(void *m) { return bench_lib_error(((moe_problem *)m)->st); }

static void say_row(const bench_ctx *b, const char *name, const moe_problem *m, const moe_op *r) {
    int nt = b->o.threads;
    double peak = bench_ref_peak(b, nt), tm = r->it.t.median, td = r->td;
    double sc = bench_scaling(r->it.t1.median, tm, nt);
    char blocks[32];
    snprintf(blocks, sizeof blocks, "%lld", (long long)m->N);
    bench_say(b, "  %-3s %-26s %6s", r->op, name, blocks);
    const double tb = r->it.t.best; /* the fastest timed run */
    if (tm > 0)
        bench_say(b, " %8.1f%s %8.3f %8.3f %6.1f%% %6.1f%%", tm * 1e3, r->it.t.runs ? " " : "*",
                  r->fl_real / tm / 1e12, r->fl_all / tm / 1e12, peak > 0 ? 100.0 * r->fl_real / tm / peak : 0.0,
                  peak > 0 && tb > 0 ? 100.0 * r->fl_real / tb / peak : 0.0);
    else bench_say(b, " %9s %8s %8s %7s %7s", "-", "-", "-", "-", "-");
    if (sc > 0) bench_say(b, " %6.2fx |", sc);
    else bench_say(b, " %7s |", "-");
    if (td > 0) bench_say(b, " %10.1f %8.3f", td * 1e3, r->fl_all / td / 1e12);
    else bench_say(b, " %10s %8s", "absent", "-");
    if (tm > 0 && td > 0) bench_say(b, " %7.2fx\n", td / tm);
    else bench_say(b, " %8s\n", "-");
    if (r->it.err) bench_say(b, "       mxfp8: %s\n", r->it.err);
}

static cJSON *json_row(const bench_ctx *b, const moe_problem *m, const moe_op *r) {
    moe_prob p = m->p;
    int nt = b->o.threads;
    double peak = bench_ref_peak(b, nt), tm = r->it.t.median, td = r->td;
    double tr = tm > 0 ? r->fl_real / tm : -1, ta = tm > 0 ? r->fl_all / tm : -1, tda = td > 0 ? r->fl_all / td : -1;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "H", (double)p.H);
    cJSON_AddNumberToObject(j, "T", (double)p.T);
    cJSON_AddNumberToObject(j, "E", (double)p.E);
    cJSON_AddNumberToObject(j, "B", (double)p.B);
    cJSON_AddNumberToObject(j, "TopK", (double)p.K);
    cJSON_AddNumberToObject(j, "I", (double)p.I);
    cJSON_AddNumberToObject(j, "blocks", (double)m->N);
    cJSON_AddNumberToObject(j, "threads", nt);
    cJSON_AddNumberToObject(j, "gflop_real_rows", r->fl_real / 1e9);
    cJSON_AddNumberToObject(j, "gflop_all_blocks", r->fl_all / 1e9);
    bench_item_json(j, &r->it, nt);
    bench_json_num(j, "tflops_real_rows", tr > 0 ? tr / 1e12 : -1);
    bench_json_num(j, "tflops_all_blocks", ta > 0 ? ta / 1e12 : -1);
    bench_json_num(j, "fraction_of_peak_real_rows", tr > 0 && peak > 0 ? tr / peak : -1);
    bench_json_num(j, "fraction_of_peak_all_blocks", ta > 0 && peak > 0 ? ta / peak : -1);
    bench_json_num(j, "fraction_of_peak_real_rows_best",
                   r->it.t.best > 0 && peak > 0 ? r->fl_real / r->it.t.best / peak : -1);
    bench_json_num(j, "onednn_ms", td > 0 ? td * 1e3 : -1);
    bench_json_num(j, "onednn_tflops_all_blocks", tda > 0 ? tda / 1e12 : -1);
    bench_json_num(j, "onednn_fraction_of_peak_all_blocks", tda > 0 && peak > 0 ? tda / peak : -1);
    bench_json_num(j, "speedup_vs_onednn", tm > 0 && td > 0 ? td / tm : -1);
    return j;
}

static void mem_say_json(const bench_ctx *b, cJSON *j, const moe_mem *mm, int measured) {
    cJSON_AddNumberToObject(j, "io_bytes", mm->io);
    bench_json_num(j, "rss_before_bytes", mm->rss0);
    bench_json_num(j, "peak_rss_bytes", mm->peak);
    cJSON_AddBoolToObject(j, "peak_rss_isolated", mm->isolated);
    cJSON_AddNumberToObject(j, "ru_maxrss_bytes", mm->maxrss);
    cJSON_AddNumberToObject(j, "workspace_bytes", mm->ws);
    if (measured)
        bench_say(b, "      memory: inputs+outputs %.1f MiB; resident before the first call %.1f MiB, peak during the "
                  "calls %.1f MiB (%s); the reused workspace holds %.1f MiB; process ru_maxrss %.1f MiB\n",
                  mm->io / 1048576.0, mm->rss0 / 1048576.0, mm->peak / 1048576.0,
                  mm->isolated ? "VmHWM reset before the call" : "ru_maxrss, includes earlier sections",
                  mm->ws / 1048576.0, mm->maxrss / 1048576.0);
}

/* The backward on N and 1 threads, with the resident memory of its calls. */
static void measure_backward(const bench_ctx *b, moe_problem *m, moe_op *r, double *rate, moe_mem *mm) {
    double hwm0, rss1, hwm1;
    moe_rss(&mm->rss0, &hwm0);
    mm->isolated = moe_reset_hwm() == 0;
    bench_item_measure(b, moe_run_backward, m, r->fl_all, rate, moe_error, &r->it);
    moe_rss(&rss1, &hwm1);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    mm->maxrss = (double)ru.ru_maxrss * 1024.0;
    mm->peak = mm->isolated && hwm1 > 0 ? hwm1 : mm->maxrss;
    mm->ws = (double)mxfp8_workspace_bytes(m->ws);
}

/* One problem: a backward row (into jb) and a forward row (into jf), in the BF16 or (train) the training
 * configuration. rate[0/1]: FLOP/s (all blocks) of the last backward / forward run, to estimate the next problem;
 * td[0/1]: the oneDNN baselines, measured by the BF16 row (-1 until then, or when absent). */
static void problem(bench_ctx *b, cJSON *jb, cJSON *jf, moe_prob pr, int train, double rate[2], double td[2]) {
    moe_problem m;
    memset(&m, 0, sizeof m);
    m.p = pr;
    m.train = train;
    char name[64];
    moe_name(&pr, name, sizeof name);
    if (moe_routing(&m) || moe_tensors(&m) || mxfp8_workspace_create(&m.ws) != MXFP8_OK) {
        bench_say(b, "  %-30s out of memory\n", name);
        moe_free(&m);
        return;
    }
    double hi = (double)pr.H * (double)pr.I, real = (double)m.real_rows, all = (double)(m.N * pr.B);
    moe_op bwd = {.op = "bwd", .fl_real = 12.0 * real * hi, .fl_all = 12.0 * all * hi, .td = -1};
    moe_op fwd = {.op = "fwd", .fl_real = 6.0 * real * hi, .fl_all = 6.0 * all * hi, .td = -1};
    moe_mem mm = {(double)moe_io_bytes(&m), -1, -1, -1, 0, 0};
    measure_backward(b, &m, &bwd, &rate[0], &mm);
    bench_item_measure(b, moe_run_forward, &m, fwd.fl_all, &rate[1], moe_error, &fwd.it);
    moe_free_tensors(&m); /* the baselines need only the routing */
    mxfp8_workspace_destroy(m.ws);
    m.ws = NULL;
    if (!train) { /* the same GEMMs in either configuration: measured with the BF16 row, kept for the training one */
        td[0] = dnnl_time(b, &m, 0);
        td[1] = dnnl_time(b, &m, 1);
    }
    bwd.td = td[0];
    fwd.td = td[1];
    const char *cfg = train ? "training" : "bf16";
    say_row(b, name, &m, &bwd);
    cJSON *j = json_row(b, &m, &bwd);
    cJSON_AddStringToObject(j, "configuration", cfg);
    mem_say_json(b, j, &mm, bwd.it.t.median > 0);
    cJSON_AddItemToArray(jb, j);
    say_row(b, name, &m, &fwd);
    j = json_row(b, &m, &fwd);
    cJSON_AddStringToObject(j, "configuration", cfg);
    cJSON_AddItemToArray(jf, j);
    moe_free(&m);
}

void bench_moe(bench_ctx *b) {
    static const moe_prob probs[] = {
        {1024, 1024, 4, 512, 4, 256},  /* upstream */
        {1024, 2048, 64, 128, 8, 256}, /* fine-grained: many small experts, 256 tokens each */
        {1024, 2048, 8, 128, 2, 1024}, /* a training step's MoE layer at width D = 1024 */
        {256, 2048, 8, 128, 2, 512},   /* and at D = 256 */
        {2048, 8192, 8, 512, 2, 1024}, /* larger */
    };
    int nprob = b->o.quick ? 4 : 5, nt = b->o.threads;
    bench_set_threads(nt);
    cJSON *jb = cJSON_AddArrayToObject(b->root, "moe");
    cJSON *jf = cJSON_AddArrayToObject(b->root, "moe_forward");
    double rate[2] = {-1, -1};
    bench_say(b, "\nmoe: mxfp8_moe_backward (bwd: all four checkpoints given) and mxfp8_moe_forward (fwd: output only), "
              "BF16 tensors, E4M3, %d thread(s);\n  FLOPs: bwd 12*rows*H*I (phases 1-4), fwd 6*rows*H*I; 'real' "
              "counts the T*TopK routed rows, 'all' the N*B block rows (padding included); time, TF and %% peak "
              "('real'): the median run; best %%: the fastest timed run's %% of peak; scaling = time on 1 thread / on "
              "%d\n", nt, nt);
    bench_say(b, "  %-3s %-26s %6s %9s %8s %8s %7s %7s %7s | %10s %8s %8s\n", "op", "(H,T,E,B,TopK,I)", "blocks",
              "time ms", "TF real", "TF all", "% peak", "best %", "scaling", "oneDNN ms", "TF all", "speed-up");
    double td[5][2];
    for (int pi = 0; pi < nprob; pi++) {
        td[pi][0] = td[pi][1] = -1;
        problem(b, jb, jf, probs[pi], 0, rate, td[pi]);
    }
    bench_say(b, "  the training step's layers in mxfp8.torch's configuration (BlockwiseMoE under BF16 autocast): FP32 "
              "weights, affinities and their gradients, BF16 X, dY, dX; fwd also writes the FP32 gate/up checkpoint, "
              "bwd is given it and recomputes the other three (oneDNN column: the same GEMMs as above)\n");
    for (int pi = 2; pi < 4; pi++) problem(b, jb, jf, probs[pi], 1, rate, td[pi]);
    bench_say(b, "  * = one cold run (longer than %.0f s: no warm-up, no repeat)\n", b->o.cold);
}
