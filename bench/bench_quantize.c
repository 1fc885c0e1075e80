/*
 * bench_quantize.c -- mxfp8_quantize of a BF16 4096x4096 matrix to E4M3 codes + E8M0 scales along rows (axis 1)
 * and along columns (axis 0), and of the same values as 65536 rows of 256 (the short rows of an MoE layer's tokens
 * at width 256), on 1 and N threads, beside a memcpy of the same input on the same threads.
 * GB/s = (bytes read + bytes written) / time for both (memcpy: 2 x bytes / time); the ratio is quantize / memcpy,
 * each the median of at least 5 runs; scaling = the time on 1 thread / on N.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

typedef struct quant_arg {
    mxfp8_tensor src, data, scales;
    mxfp8_quant_params params;
    int axis;
    mxfp8_status st;
} quant_arg;

static int run_quant(void *p) {
    quant_arg *q = p;
    q->st = mxfp8_quantize(&q->src, q->axis, &q->params, &q->data, &q->scales);
    return q->st == MXFP8_OK ? 0 : -1;
}

typedef struct copy_arg {
    const char *src;
    char *dst;
    size_t bytes;
    int nt;
} copy_arg;

static int run_copy(void *p) {
    copy_arg *c = p;
    int nt = c->nt;
    size_t chunk = ((c->bytes + (size_t)nt - 1) / (size_t)nt + 63) & ~(size_t)63;
#ifdef _OPENMP
#pragma omp parallel for num_threads(nt) schedule(static)
#endif
    for (int i = 0; i < nt; i++) {
        size_t lo = (size_t)i * chunk;
        if (lo < c->bytes) {
            size_t n = c->bytes - lo < chunk ? c->bytes - lo : chunk;
            memcpy(c->dst + lo, c->src + lo, n);
        }
    }
    return 0;
}

typedef struct quant_bufs {
    int64_t R, C;
    uint16_t *src;   /* [R, C] BF16 */
    uint8_t *codes;  /* [R, C] E4M3 */
    uint8_t *scales; /* R * C / 32 E8M0 */
    char *copy_dst;  /* the memcpy's destination, 2 R C bytes */
} quant_bufs;

/* One row, named `label` in the table: quantize along `ax` (0 = rows, 1 = columns) on nt threads, and memcpy beside
 * it. */
static void row(bench_ctx *b, cJSON *ja, const quant_bufs *qb, const char *label, int ax, int nt, double *t_1thread) {
    int64_t R = qb->R, C = qb->C;
    uint16_t *src = qb->src;
    bench_set_threads(nt);
    quant_arg q;
    int64_t shp[2] = {R, C}, sshp[2] = {ax == 0 ? R : R / 32, ax == 0 ? C / 32 : C};
    q.src = mxfp8_tensor_make(src, MXFP8_DTYPE_BF16, 2, shp);
    q.data = mxfp8_tensor_make(qb->codes, MXFP8_DTYPE_E4M3, 2, shp);
    q.scales = mxfp8_tensor_make(qb->scales, MXFP8_DTYPE_E8M0, 2, sshp);
    q.params = mxfp8_quant_params_default();
    q.axis = ax == 0 ? 1 : 0;
    q.st = MXFP8_OK;
    size_t in_bytes = (size_t)(R * C) * 2;
    copy_arg cp = {(const char *)src, qb->copy_dst, in_bytes, nt};
    bench_time tq, tc; /* medians of >= 5 runs each: memcpy alone varies by tens of percent between runs */
    bench_measure(b, run_quant, &q, 5, &tq);
    bench_measure(b, run_copy, &cp, 5, &tc);
    double bytes = (double)in_bytes + (double)(R * C) + (double)(R * C / 32);
    double gbq = tq.median > 0 ? bytes / tq.median / 1e9 : -1;
    double gbc = tc.median > 0 ? 2.0 * (double)in_bytes / tc.median / 1e9 : -1;
    const char *axname = ax == 0 ? "rows" : "columns";
    if (nt == 1) *t_1thread = tq.median;
    double sc = bench_scaling(*t_1thread, tq.median, nt);
    if (tq.median < 0) {
        bench_say(b, "  %-12s %7d  failed: %s\n", label, nt, bench_lib_error(q.st));
    } else {
        bench_say(b, "  %-12s %7d %10.2f %9.2f %12.2f %7.0f%%", label, nt, tq.median * 1e3, gbq, gbc,
                  100.0 * gbq / gbc);
        if (sc > 0) bench_say(b, " %7.2fx (%s)", sc, sc > 1.3 ? "multi-threaded" : "not multi-threaded, or memory-bound");
        bench_say(b, "\n");
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "axis", axname);
    cJSON_AddNumberToObject(j, "rows", (double)R);
    cJSON_AddNumberToObject(j, "cols", (double)C);
    cJSON_AddNumberToObject(j, "threads", nt);
    bench_json_num(j, "ms", tq.median > 0 ? tq.median * 1e3 : -1);
    bench_json_num(j, "best_ms", tq.best > 0 ? tq.best * 1e3 : -1);
    cJSON_AddNumberToObject(j, "timed_runs", tq.runs);
    bench_json_num(j, "gbps", gbq);
    bench_json_num(j, "memcpy_gbps", gbc);
    cJSON_AddNumberToObject(j, "memcpy_timed_runs", tc.runs);
    bench_json_num(j, "ratio_to_memcpy", gbq > 0 && gbc > 0 ? gbq / gbc : -1);
    bench_json_num(j, "thread_scaling", sc);
    if (sc > 0) bench_json_num(j, "speedup_vs_1thread", sc);
    cJSON_AddItemToArray(ja, j);
}

void bench_quantize(bench_ctx *b) {
    const int64_t R = 4096, C = 4096;
    cJSON *ja = cJSON_AddArrayToObject(b->root, "quantize");
    const mxfp8_quant_params qd = mxfp8_quant_params_default();
    bench_say(b, "\nquantize: BF16 %lldx%lld -> E4M3 codes + E8M0 scales (%s rule, %s), mxfp8_quantize; "
              "GB/s = (bytes read + written) / time; memcpy of the BF16 input, same threads, GB/s = 2 x bytes / "
              "time\n", (long long)R, (long long)C, mxfp8_enum_name(MXFP8_ENUM_SCALE_RULE, qd.rule),
              mxfp8_enum_name(MXFP8_ENUM_GROUP_SCHEME, qd.group));
    size_t in_bytes = (size_t)(R * C * 2);
    quant_bufs qb = {R, C, bench_alloc(in_bytes), bench_alloc((size_t)(R * C)), bench_alloc((size_t)(R * C / 32)),
                     bench_alloc(in_bytes)};
    uint16_t *src = qb.src;
    if (!qb.src || !qb.codes || !qb.scales || !qb.copy_dst) {
        bench_say(b, "  out of memory\n");
        goto done;
    }
    /* Values over many magnitudes: uniform mantissa times 2^[-20, 20). */
    for (size_t i = 0; i < (size_t)(R * C); i++)
        src[i] = bench_bf16((float)(bench_urand(-1, 1) * ldexp(1.0, (int)bench_urand(-20, 20))));
    memset(qb.codes, 0, (size_t)(R * C));
    memset(qb.scales, 0, (size_t)(R * C / 32));
    memset(qb.copy_dst, 0, in_bytes);
    bench_say(b, "  %-12s %7s %10s %9s %12s %8s %8s\n", "axis", "threads", "time ms", "GB/s", "memcpy GB/s", "ratio",
              "scaling");
    int tlist[2] = {1, b->o.threads}, ntl = b->o.threads > 1 ? 2 : 1;
    static const char *const label[3] = {"rows", "columns", "rows of 256"};
    for (int it = 0; it < 3; it++) { /* rows, columns, then the same buffers as short rows */
        quant_bufs q = qb;
        if (it == 2) q.R = R * C / 256, q.C = 256;
        double t1 = -1;
        for (int ti = 0; ti < ntl; ti++) row(b, ja, &q, label[it], it == 1, tlist[ti], &t1);
    }
done:
    free(qb.src);
    free(qb.codes);
    free(qb.scales);
    free(qb.copy_dst);
    bench_set_threads(b->o.threads);
}
