/*
 * bench_matmul.c -- mxfp8_matmul_backward (dX = dY @ W, dW = dY^T @ X, every quantization included: end to end)
 * and mxfp8_matmul (forward Y = X @ W^T) at the upstream (M, K, N) shapes and 4096^3, BF16 in and out, E5M2 (the
 * NKI default); FLOPs = 2*M*N*K per GEMM. Beside each: oneDNN's bf16 matmul doing the same GEMMs with no
 * quantization (dW = dY^T @ X reads dY through a transposed view), and the speed-up = oneDNN time / mxfp8 time.
 */
#include <stdlib.h>
#include <string.h>

#include "bench.h"

typedef struct mm_arg {
    int64_t M, K, N;
    uint16_t *dy, *w, *x, *dx, *dw, *y;
    mxfp8_workspace *ws; /* reused by every call of the shape */
    mxfp8_status st;
    bench_gemm g1, g2;
} mm_arg;

static int run_bwd(void *p) {
    mm_arg *c = p;
    mxfp8_matmul_bwd_args a;
    mxfp8_matmul_bwd_args_init(&a);
    int64_t sdy[2] = {c->M, c->N}, sw[2] = {c->N, c->K}, sx[2] = {c->M, c->K};
    a.output_grad = mxfp8_tensor_make(c->dy, MXFP8_DTYPE_BF16, 2, sdy);
    a.weights = mxfp8_tensor_make(c->w, MXFP8_DTYPE_BF16, 2, sw);
    a.input_activation = mxfp8_tensor_make(c->x, MXFP8_DTYPE_BF16, 2, sx);
    a.workspace = c->ws;
    mxfp8_tensor dx = mxfp8_tensor_make(c->dx, MXFP8_DTYPE_BF16, 2, sx);
    mxfp8_tensor dw = mxfp8_tensor_make(c->dw, MXFP8_DTYPE_BF16, 2, sw);
    c->st = mxfp8_matmul_backward(&a, &dx, &dw);
    return c->st == MXFP8_OK ? 0 : -1;
}

static int run_fwd(void *p) {
    mm_arg *c = p;
    mxfp8_operand xo, wo;
    memset(&xo, 0, sizeof xo);
    memset(&wo, 0, sizeof wo);
    int64_t sx[2] = {c->M, c->K}, sw[2] = {c->N, c->K}, sy[2] = {c->M, c->N};
    xo.values = mxfp8_tensor_make(c->x, MXFP8_DTYPE_BF16, 2, sx);
    wo.values = mxfp8_tensor_make(c->w, MXFP8_DTYPE_BF16, 2, sw);
    mxfp8_tensor y = mxfp8_tensor_make(c->y, MXFP8_DTYPE_BF16, 2, sy);
    mxfp8_matmul_config cfg;
    mxfp8_matmul_config_init(&cfg);
    cfg.workspace = c->ws;
    c->st = mxfp8_matmul(&xo, &wo, &cfg, &y);
    return c->st == MXFP8_OK ? 0 : -1;
}

static int run_dnnl_bwd(void *p) {
    mm_arg *c = p;
    if (bench_gemm_run(&c->g1, c->dy, c->w, c->dx) || bench_gemm_run(&c->g2, c->dy, c->x, c->dw)) return -1;
    return bench_gemm_wait();
}

static int run_dnnl_fwd(void *p) {
    mm_arg *c = p;
    if (bench_gemm_run(&c->g1, c->x, c->w, c->y)) return -1;
    return bench_gemm_wait();
}

static const char *mm_error(void *p) { return bench_lib_error(((mm_arg *)p)->st); }

/* The oneDNN time of the same GEMMs on N threads (-1 when absent); impl gets oneDNN's implementation names. */
static double dnnl_time(bench_ctx *b, mm_arg *c, int fwd, char *impl, size_t impl_len) {
    int ok = fwd ? !bench_gemm_init(&c->g1, c->M, c->N, c->K, 0, 1, 0)          /* Y = X @ W^T */
                 : (!bench_gemm_init(&c->g1, c->M, c->K, c->N, 0, 0, 0) &&      /* dX = dY @ W */
                    !bench_gemm_init(&c->g2, c->N, c->K, c->M, 1, 0, 0));       /* dW = dY^T @ X */
    bench_time t = {-1, -1, 0};
    if (ok) bench_measure(b, fwd ? run_dnnl_fwd : run_dnnl_bwd, c, 1, &t);
    if (!bench_dnnl_linked()) snprintf(impl, impl_len, "absent");
    else snprintf(impl, impl_len, "%s%s%s", c->g1.impl, fwd ? "" : " + ", fwd ? "" : c->g2.impl);
    bench_gemm_free(&c->g1);
    bench_gemm_free(&c->g2);
    return t.median;
}

/* One row (op fwd or bwd of one shape). rate: FLOP/s of the largest run so far, to estimate (and maybe skip) the
 * next one. */
static void row(bench_ctx *b, cJSON *ja, mm_arg *c, int fwd, double *rate) {
    int nt = b->o.threads;
    double peak = bench_ref_peak(b, nt);
    double flops = (fwd ? 2.0 : 4.0) * (double)c->M * (double)c->N * (double)c->K;
    bench_item it;
    char impl[200];
    bench_item_measure(b, fwd ? run_fwd : run_bwd, c, flops, rate, mm_error, &it);
    double tm = it.t.median, td = dnnl_time(b, c, fwd, impl, sizeof impl);
    double tf = tm > 0 ? flops / tm : -1, tfd = td > 0 ? flops / td : -1;
    double sc = bench_scaling(it.t1.median, tm, nt);
    const double tfb = it.t.best > 0 ? flops / it.t.best : -1; /* the fastest timed run */
    char mine[80], theirs[64], scale[16];
    if (tm > 0) snprintf(mine, sizeof mine, "%9.2f%s %8.3f %6.1f%% %6.1f%%", tm * 1e3, it.t.runs ? " " : "*",
                         tf / 1e12, peak > 0 ? 100.0 * tf / peak : 0.0, peak > 0 ? 100.0 * tfb / peak : 0.0);
    else snprintf(mine, sizeof mine, "%10s %8s %7s %7s", "-", "-", "-", "-");
    if (td > 0) snprintf(theirs, sizeof theirs, "%10.2f %8.3f %6.1f%%", td * 1e3, tfd / 1e12,
                         peak > 0 ? 100.0 * tfd / peak : 0.0);
    else snprintf(theirs, sizeof theirs, "%10s %8s %7s", "absent", "-", "-");
    if (sc > 0) snprintf(scale, sizeof scale, "%6.2fx", sc);
    else snprintf(scale, sizeof scale, "%7s", "-");
    bench_say(b, "  %-4s %5lld %5lld %5lld %s %s | %s ", fwd ? "fwd" : "bwd", (long long)c->M, (long long)c->K,
              (long long)c->N, mine, scale, theirs);
    if (tm > 0 && td > 0) bench_say(b, "%7.2fx\n", td / tm);
    else bench_say(b, "%8s\n", "-");
    if (it.err) bench_say(b, "       mxfp8: %s\n", it.err);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "op", fwd ? "forward" : "backward");
    cJSON_AddNumberToObject(j, "M", (double)c->M);
    cJSON_AddNumberToObject(j, "K", (double)c->K);
    cJSON_AddNumberToObject(j, "N", (double)c->N);
    cJSON_AddNumberToObject(j, "threads", nt);
    cJSON_AddNumberToObject(j, "gflop", flops / 1e9);
    bench_item_json(j, &it, nt);
    bench_json_num(j, "tflops", tf > 0 ? tf / 1e12 : -1);
    bench_json_num(j, "fraction_of_peak", tf > 0 && peak > 0 ? tf / peak : -1);
    bench_json_num(j, "fraction_of_peak_best", tfb > 0 && peak > 0 ? tfb / peak : -1);
    bench_json_num(j, "onednn_ms", td > 0 ? td * 1e3 : -1);
    bench_json_num(j, "onednn_tflops", tfd > 0 ? tfd / 1e12 : -1);
    bench_json_num(j, "onednn_fraction_of_peak", tfd > 0 && peak > 0 ? tfd / peak : -1);
    bench_json_num(j, "speedup_vs_onednn", tm > 0 && td > 0 ? td / tm : -1);
    cJSON_AddStringToObject(j, "onednn_impl", impl);
    cJSON_AddItemToArray(ja, j);
}

void bench_matmul(bench_ctx *b) {
    /* (M, K, N): the upstream set first, so the 4096^3 time can be estimated before it is run */
    static const int64_t shapes[][3] = {{512, 512, 512}, {1024, 1024, 1024}, {2048, 1024, 512}, {512, 1024, 2048},
                                        {4096, 4096, 4096}};
    int nshapes = b->o.quick ? 4 : 5, nt = b->o.threads;
    double rate[2] = {-1, -1}; /* bwd, fwd */
    cJSON *ja = cJSON_AddArrayToObject(b->root, "matmul");
    bench_set_threads(nt);
    bench_say(b, "\nmatmul: BF16 inputs, E5M2 (the NKI default) quantized on the fly, BF16 outputs, %d thread(s); "
              "FLOPs = 2*M*N*K per GEMM (backward: 2 GEMMs); time, TFLOP/s and %% peak: the median run; best %%: "
              "the fastest timed run's %% of peak; speed-up = oneDNN time / mxfp8 time (medians); scaling = mxfp8 "
              "time on 1 thread / on %d\n", nt, nt);
    bench_say(b, "  %-4s %5s %5s %5s %10s %8s %7s %7s %7s | %10s %8s %7s %8s\n", "op", "M", "K", "N", "time ms",
              "TFLOP/s", "% peak", "best %", "scaling", "oneDNN ms", "TFLOP/s", "% peak", "speed-up");
    for (int si = 0; si < nshapes; si++) {
        mm_arg c;
        memset(&c, 0, sizeof c);
        c.M = shapes[si][0];
        c.K = shapes[si][1];
        c.N = shapes[si][2];
        size_t mn = (size_t)(c.M * c.N), nk = (size_t)(c.N * c.K), mk = (size_t)(c.M * c.K);
        c.dy = bench_alloc(mn * 2);
        c.w = bench_alloc(nk * 2);
        c.x = bench_alloc(mk * 2);
        c.dx = bench_alloc(mk * 2);
        c.dw = bench_alloc(nk * 2);
        c.y = bench_alloc(mn * 2);
        if (mxfp8_workspace_create(&c.ws) != MXFP8_OK || !c.dy || !c.w || !c.x || !c.dx || !c.dw || !c.y) {
            bench_say(b, "  out of memory\n");
        } else {
            bench_fill_bf16(c.dy, mn, -1, 1);
            bench_fill_bf16(c.w, nk, -0.1, 0.1);
            bench_fill_bf16(c.x, mk, 0, 1);
            memset(c.dx, 0, mk * 2);
            memset(c.dw, 0, nk * 2);
            memset(c.y, 0, mn * 2);
            for (int fwd = 0; fwd < 2; fwd++) row(b, ja, &c, fwd, &rate[fwd]);
        }
        free(c.dy);
        free(c.w);
        free(c.x);
        free(c.dx);
        free(c.dw);
        free(c.y);
        mxfp8_workspace_destroy(c.ws);
    }
    bench_say(b, "  * = one cold run (longer than %.0f s: no warm-up, no repeat)\n", b->o.cold);
}
