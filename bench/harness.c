/* harness.c -- the bench's timing (warm-up, repeated runs, median), threads, deterministic data and JSON helpers. */
#define _GNU_SOURCE
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#ifdef _OPENMP
#include <omp.h>
#endif

void bench_say(const bench_ctx *b, const char *fmt, ...) {
    if (b->o.json) return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, c = *(const double *)y;
    return (a > c) - (a < c);
}

#define BENCH_MAX_REPS 4096

double bench_measure(const bench_ctx *b, bench_fn fn, void *arg, int min_reps, bench_time *t) {
    const bench_opts *o = &b->o;
    bench_time r = {-1, -1, 0};
    double t0 = cli_now();
    if (fn(arg) != 0) goto out;
    double warm = cli_now() - t0;
    if (warm > o->cold) { /* a run that long is not helped by a warm-up; repeating it would blow the budget */
        r.median = r.best = warm;
        goto out;
    }
    int max = o->reps > min_reps ? o->reps : min_reps;
    if (max > BENCH_MAX_REPS) max = BENCH_MAX_REPS;
    double *ts = malloc((size_t)max * sizeof *ts), spent = 0;
    if (!ts) goto out;
    int n = 0;
    for (; n < max; n++) {
        if (n >= min_reps && n >= 1 && spent + warm > o->budget) break;
        double s = cli_now();
        if (fn(arg) != 0) {
            free(ts);
            goto out;
        }
        ts[n] = cli_now() - s;
        spent += ts[n];
    }
    qsort(ts, (size_t)n, sizeof *ts, cmp_double);
    r.runs = n;
    r.best = ts[0];
    r.median = n % 2 ? ts[n / 2] : 0.5 * (ts[n / 2 - 1] + ts[n / 2]);
    free(ts);
out:
    if (t) *t = r;
    return r.median;
}

int bench_set_threads(int nt) {
    if (mxfp8_set_num_threads(nt) != MXFP8_OK) return -1;
#ifdef _OPENMP
    omp_set_num_threads(nt); /* oneDNN (OpenMP runtime) and the memcpy baseline */
#endif
    return 0;
}

void *bench_alloc(size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = 64;
    if (bytes > SIZE_MAX - 63 || posix_memalign(&p, 64, (bytes + 63) & ~(size_t)63) != 0) return NULL;
    return p;
}

/* xorshift64*, mapped to [lo, hi). */
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
double bench_urand(double lo, double hi) {
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    uint64_t r = g_rng * 0x2545F4914F6CDD1Dull;
    return lo + (hi - lo) * (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

uint16_t bench_bf16(float f) { return mxfp8_fp32_to_bf16(f); }

void bench_fill_bf16(uint16_t *p, size_t n, double lo, double hi) {
    for (size_t i = 0; i < n; i++) p[i] = bench_bf16((float)bench_urand(lo, hi));
}

const char *bench_lib_error(mxfp8_status st) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s: %s", mxfp8_status_string(st), mxfp8_last_error_message());
    return buf;
}

void bench_json_num(cJSON *obj, const char *key, double v) {
    if (v < 0 || !isfinite(v)) cJSON_AddNullToObject(obj, key);
    else cJSON_AddNumberToObject(obj, key, v);
}

double bench_scaling(double t1, double tn, int nt) { return nt > 1 && t1 > 0 && tn > 0 ? t1 / tn : -1; }

void bench_item_measure(const bench_ctx *b, bench_fn fn, void *arg, double flops, double *rate,
                        const char *(*err_of)(void *arg), bench_item *it) {
    int nt = b->o.threads;
    bench_time none = {-1, -1, 0};
    it->t = it->t1 = none;
    it->err = NULL;
    double est = *rate > 0 ? flops / *rate : -1;
    if (est > b->o.skip && !b->o.full) {
        snprintf(it->errbuf, sizeof it->errbuf, "skipped: about %.0f s per run at the rate measured on the smaller "
                 "one (--full runs it)", est);
        it->err = it->errbuf;
        return;
    }
    bench_set_threads(nt);
    if (bench_measure(b, fn, arg, 1, &it->t) < 0) {
        snprintf(it->errbuf, sizeof it->errbuf, "%s", err_of(arg));
        it->err = it->errbuf;
        return;
    }
    *rate = flops / it->t.median;
    if (nt == 1) return;
    if (it->t.median * nt > b->o.skip && !b->o.full) return; /* 1 thread would take about N times as long */
    bench_set_threads(1);
    bench_measure(b, fn, arg, 1, &it->t1);
    bench_set_threads(nt);
}

void bench_item_json(cJSON *row, const bench_item *it, int nt) {
    bench_json_num(row, "ms", it->t.median > 0 ? it->t.median * 1e3 : -1);
    bench_json_num(row, "best_ms", it->t.best > 0 ? it->t.best * 1e3 : -1);
    cJSON_AddNumberToObject(row, "timed_runs", it->t.runs);
    bench_json_num(row, "ms_1thread", it->t1.median > 0 ? it->t1.median * 1e3 : -1);
    bench_json_num(row, "thread_scaling", bench_scaling(it->t1.median, it->t.median, nt));
    if (it->err) cJSON_AddStringToObject(row, "error", it->err);
}
