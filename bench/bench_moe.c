/*
 * bench_moe.c -- mxfp8_moe_backward at the upstream problem (H, T, E, B, TopK, I) = (1024, 1024, 4, 512, 4, 256)
 * and a larger one, all four forward checkpoints given (no recompute). FLOPs = the GEMM FLOPs of phases 1-4 =
 * 12 x rows x H x I, over the real routed rows (T x TopK, used for "% of peak") and over all N x B block rows.
 * Baseline: oneDNN doing the same four GEMMs per block on pre-gathered BF16 operands (weight gradients accumulated
 * in FP32 by a sum post-op; no activation backward, no gather/scatter). Memory: bytes of inputs + outputs, resident
 * set before the call and its peak during the calls.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "moe_problem.h"

/* ---- the oneDNN baseline of the backward ---- */
typedef struct dnnl_bwd {
    moe_prob p;
    int64_t N;
    const int32_t *b2e;
    uint16_t *xg, *dyg, *dgu, *inter, *w1, *w2, *di, *dxb;
    float *dw1, *dw2;
    bench_gemm g1, g2, g3, g4;
} dnnl_bwd;

/* Per block n of expert e: P1 dI[B,I] = dY_n[B,H] @ W2[e]^T; P2 dX_n[B,H] = dGU_n[B,2I] @ W1[e]^T;
 * P3 dW1[e][H,2I] += X_n^T @ dGU_n; P4 dW2[e][I,H] += inter_n[I,B] @ dY_n. */
static int run_dnnl_bwd(void *pv) {
    dnnl_bwd *c = pv;
    moe_prob p = c->p;
    for (int64_t n = 0; n < c->N; n++) {
        int64_t e = c->b2e[n];
        uint16_t *dyn = c->dyg + n * p.B * p.H, *xn = c->xg + n * p.B * p.H, *dgun = c->dgu + n * p.B * 2 * p.I;
        if (bench_gemm_run(&c->g1, dyn, c->w2 + e * p.I * p.H, c->di) ||
            bench_gemm_run(&c->g2, dgun, c->w1 + e * p.H * 2 * p.I, c->dxb) ||
            bench_gemm_run(&c->g3, xn, dgun, c->dw1 + e * p.H * 2 * p.I) ||
            bench_gemm_run(&c->g4, c->inter + n * p.I * p.B, dyn, c->dw2 + e * p.I * p.H))
            return -1;
    }
    return bench_gemm_wait();
}

static double dnnl_bwd_time(const bench_ctx *b, const moe_problem *m) {
    if (!bench_dnnl_linked()) return -1;
    dnnl_bwd c;
    memset(&c, 0, sizeof c);
    moe_prob p = m->p;
    c.p = p;
    c.N = m->N;
    c.b2e = m->b2e;
    size_t rows = (size_t)(m->N * p.B), w1 = (size_t)(p.E * p.H * 2 * p.I), w2 = (size_t)(p.E * p.I * p.H);
    c.xg = bench_alloc(rows * (size_t)p.H * 2);
    c.dyg = bench_alloc(rows * (size_t)p.H * 2);
    c.dgu = bench_alloc(rows * (size_t)(2 * p.I) * 2);
    c.inter = bench_alloc(rows * (size_t)p.I * 2);
    c.w1 = bench_alloc(w1 * 2);
    c.w2 = bench_alloc(w2 * 2);
    c.di = bench_alloc((size_t)(p.B * p.I) * 2);
    c.dxb = bench_alloc((size_t)(p.B * p.H) * 2);
    c.dw1 = bench_alloc(w1 * 4);
    c.dw2 = bench_alloc(w2 * 4);
    bench_time t = {-1, -1, 0};
    if (c.xg && c.dyg && c.dgu && c.inter && c.w1 && c.w2 && c.di && c.dxb && c.dw1 && c.dw2) {
        bench_fill_bf16(c.xg, rows * (size_t)p.H, 0, 1);
        bench_fill_bf16(c.dyg, rows * (size_t)p.H, -1, 1);
        bench_fill_bf16(c.dgu, rows * (size_t)(2 * p.I), -1, 1);
        bench_fill_bf16(c.inter, rows * (size_t)p.I, -1, 1);
        bench_fill_bf16(c.w1, w1, -0.1, 0.1);
        bench_fill_bf16(c.w2, w2, -0.1, 0.1);
        memset(c.dw1, 0, w1 * 4);
        memset(c.dw2, 0, w2 * 4);
        if (!bench_gemm_init(&c.g1, p.B, p.I, p.H, 0, 1, 0) && !bench_gemm_init(&c.g2, p.B, p.H, 2 * p.I, 0, 1, 0) &&
            !bench_gemm_init(&c.g3, p.H, 2 * p.I, p.B, 1, 0, 1) && !bench_gemm_init(&c.g4, p.I, p.H, p.B, 0, 0, 1))
            bench_measure(b, run_dnnl_bwd, &c, 1, &t);
    }
    bench_gemm_free(&c.g1);
    bench_gemm_free(&c.g2);
    bench_gemm_free(&c.g3);
    bench_gemm_free(&c.g4);
    void *bufs[] = {c.xg, c.dyg, c.dgu, c.inter, c.w1, c.w2, c.di, c.dxb, c.dw1, c.dw2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    return t.best;
}

/* ---- rows ---- */
typedef struct moe_mem {
    double io, rss0, peak, maxrss;
    int isolated; /* peak measured from a reset high-water mark (else ru_maxrss of the whole process) */
} moe_mem;

static void say_row(const bench_ctx *b, const char *name, const moe_problem *m, const bench_time *t, double td,
                    double fl_real, double fl_all, const char *err) {
    double peak = bench_ref_peak(b, b->o.threads), tm = t->best;
    char blocks[32];
    snprintf(blocks, sizeof blocks, "%lld", (long long)m->N);
    if (tm > 0)
        bench_say(b, "  %-28s %7s %8.1f%s %8.3f %8.3f %6.1f%% |", name, blocks, tm * 1e3, t->runs ? " " : "*",
                  fl_real / tm / 1e12, fl_all / tm / 1e12, peak > 0 ? 100.0 * fl_real / tm / peak : 0.0);
    else bench_say(b, "  %-28s %7s %9s %8s %8s %7s |", name, blocks, "-", "-", "-", "-");
    if (td > 0) bench_say(b, " %10.1f %8.3f", td * 1e3, fl_all / td / 1e12);
    else bench_say(b, " %10s %8s", "absent", "-");
    if (tm > 0 && td > 0) bench_say(b, " %7.2fx\n", td / tm);
    else bench_say(b, " %8s\n", "-");
    if (err) bench_say(b, "       mxfp8: %s\n", err);
}

static cJSON *json_row(const bench_ctx *b, const moe_problem *m, const bench_time *t, double td, double fl_real,
                       double fl_all, const char *err) {
    moe_prob p = m->p;
    double peak = bench_ref_peak(b, b->o.threads), tm = t->best;
    double tr = tm > 0 ? fl_real / tm : -1, ta = tm > 0 ? fl_all / tm : -1, tda = td > 0 ? fl_all / td : -1;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "H", (double)p.H);
    cJSON_AddNumberToObject(j, "T", (double)p.T);
    cJSON_AddNumberToObject(j, "E", (double)p.E);
    cJSON_AddNumberToObject(j, "B", (double)p.B);
    cJSON_AddNumberToObject(j, "TopK", (double)p.K);
    cJSON_AddNumberToObject(j, "I", (double)p.I);
    cJSON_AddNumberToObject(j, "blocks", (double)m->N);
    cJSON_AddNumberToObject(j, "threads", b->o.threads);
    cJSON_AddNumberToObject(j, "gflop_real_rows", fl_real / 1e9);
    cJSON_AddNumberToObject(j, "gflop_all_blocks", fl_all / 1e9);
    bench_json_num(j, "ms", tm > 0 ? tm * 1e3 : -1);
    cJSON_AddNumberToObject(j, "timed_runs", t->runs);
    bench_json_num(j, "tflops_real_rows", tr > 0 ? tr / 1e12 : -1);
    bench_json_num(j, "tflops_all_blocks", ta > 0 ? ta / 1e12 : -1);
    bench_json_num(j, "fraction_of_peak_real_rows", tr > 0 && peak > 0 ? tr / peak : -1);
    bench_json_num(j, "onednn_ms", td > 0 ? td * 1e3 : -1);
    bench_json_num(j, "onednn_tflops_all_blocks", tda > 0 ? tda / 1e12 : -1);
    bench_json_num(j, "speedup_vs_onednn", tm > 0 && td > 0 ? td / tm : -1);
    if (err) cJSON_AddStringToObject(j, "error", err);
    return j;
}

static void mem_json(cJSON *j, const moe_mem *mm) {
    cJSON_AddNumberToObject(j, "io_bytes", mm->io);
    bench_json_num(j, "rss_before_bytes", mm->rss0);
    bench_json_num(j, "peak_rss_bytes", mm->peak);
    cJSON_AddBoolToObject(j, "peak_rss_isolated", mm->isolated);
    cJSON_AddNumberToObject(j, "ru_maxrss_bytes", mm->maxrss);
}

/* One problem: the backward row. rate: FLOP/s (all blocks) of the last run, to estimate the next problem. */
static void problem(bench_ctx *b, cJSON *jb, moe_prob pr, double *rate) {
    moe_problem m;
    memset(&m, 0, sizeof m);
    m.p = pr;
    char name[64];
    moe_name(&pr, name, sizeof name);
    if (moe_routing(&m) || moe_tensors(&m)) {
        bench_say(b, "  %-28s out of memory\n", name);
        moe_free(&m);
        return;
    }
    double fl_real = 12.0 * (double)m.real_rows * (double)pr.H * (double)pr.I;
    double fl_all = 12.0 * (double)(m.N * pr.B) * (double)pr.H * (double)pr.I;
    moe_mem mm = {(double)moe_io_bytes(&m), -1, -1, -1, 0};
    double hwm0, rss1, hwm1;
    moe_rss(&mm.rss0, &hwm0);
    mm.isolated = moe_reset_hwm() == 0;
    bench_time t = {-1, -1, 0};
    const char *err = NULL;
    char skipmsg[160];
    double est = *rate > 0 ? fl_all / *rate : -1;
    if (est > b->o.skip && !b->o.full) {
        snprintf(skipmsg, sizeof skipmsg, "skipped: about %.0f s per run at the rate measured on the smaller problem "
                 "(--full runs it)", est);
        err = skipmsg;
    } else if (bench_measure(b, moe_run_backward, &m, 1, &t) < 0) {
        err = bench_lib_error(m.st);
    } else {
        *rate = fl_all / t.best;
    }
    moe_rss(&rss1, &hwm1);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    mm.maxrss = (double)ru.ru_maxrss * 1024.0;
    mm.peak = mm.isolated && hwm1 > 0 ? hwm1 : mm.maxrss;
    moe_free_tensors(&m); /* the baseline needs only the routing */
    double td = dnnl_bwd_time(b, &m);
    say_row(b, name, &m, &t, td, fl_real, fl_all, err);
    if (t.best > 0)
        bench_say(b, "       memory: inputs+outputs %.1f MiB; resident before the call %.1f MiB, peak during the calls "
                  "%.1f MiB (%s) = %.1f MiB of workspace; process ru_maxrss %.1f MiB\n", mm.io / 1048576.0,
                  mm.rss0 / 1048576.0, mm.peak / 1048576.0,
                  mm.isolated ? "VmHWM reset before the call" : "ru_maxrss, includes earlier sections",
                  (mm.peak - mm.rss0) / 1048576.0, mm.maxrss / 1048576.0);
    cJSON *j = json_row(b, &m, &t, td, fl_real, fl_all, err);
    mem_json(j, &mm);
    cJSON_AddItemToArray(jb, j);
    moe_free(&m);
}

void bench_moe(bench_ctx *b) {
    static const moe_prob probs[] = {{1024, 1024, 4, 512, 4, 256}, {2048, 8192, 8, 512, 2, 1024}};
    int nprob = b->o.quick ? 1 : 2, nt = b->o.threads;
    bench_set_threads(nt);
    cJSON *jb = cJSON_AddArrayToObject(b->root, "moe");
    double rate = -1;
    bench_say(b, "\nmoe: mxfp8_moe_backward, BF16 tensors, E4M3 (config default), all four checkpoints given, %d "
              "thread(s);\n  FLOPs = GEMM FLOPs of phases 1-4 = 12*rows*H*I; 'real' counts the T*TopK routed rows, "
              "'all' counts N*B block rows (padding included); %% peak uses 'real'\n", nt);
    bench_say(b, "  %-28s %7s %9s %8s %8s %7s | %10s %8s %8s\n", "(H,T,E,B,TopK,I)", "blocks", "time ms", "TF real",
              "TF all", "% peak", "oneDNN ms", "TF all", "speed-up");
    for (int pi = 0; pi < nprob; pi++) problem(b, jb, probs[pi], &rate);
    bench_say(b, "  * = one cold run (longer than %.0f s: no warm-up, no repeat)\n", b->o.cold);
}
