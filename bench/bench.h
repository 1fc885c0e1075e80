/*
 * bench.h -- `mxfp8 bench`: how fast libmxfp8 is, measured against the limits of the machine it runs on.
 *
 * Contract
 * --------
 * Every speed figure printed is a ratio of two things measured IN THE SAME RUN, each the median of up to N timed
 * runs after one untimed warm-up (harness.c):
 *   peaks.c          register-resident loops (inline asm, no memory traffic): AMX TDPBF16PS, AVX512-BF16 VDPBF16PS,
 *                    AVX-512 FP32 FMA, each run only when mxfp8_get_info() says the CPU and the OS allow it. The
 *                    reference for "% of peak" is the first available of them, on the thread count of the call.
 *   onednn.c         oneDNN's bf16 matmul, the baseline doing the same GEMMs with no quantization (optional:
 *                    without libdnnl-dev every baseline reports "absent").
 *   bench_quantize.c mxfp8_quantize along rows and columns beside memcpy of the same bytes.
 *   bench_matmul.c   mxfp8_matmul_backward and mxfp8_matmul end to end beside oneDNN.
 *   bench_moe.c      mxfp8_moe_backward and mxfp8_moe_forward beside oneDNN's per-block GEMMs (moe_problem.c
 *                    builds the problems).
 * The bench uses the public header (plus oneDNN) and the CLI's option parsing and error format (tools/cli.h).
 */
#ifndef MXFP8_BENCH_H
#define MXFP8_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "cli.h"

/* ---- options and the run's shared state ---- */
enum { SEC_PEAK = 1, SEC_QUANT = 2, SEC_MATMUL = 4, SEC_MOE = 8, SEC_ALL = 15 };

typedef struct bench_opts {
    int sections;
    int threads;   /**< N: threads of the matmul/moe rows (thread_scaling compares them with 1 thread) */
    int json;      /**< print one JSON document instead of the tables */
    int quick;     /**< skip the largest problems, 2 timed runs */
    int reps;      /**< timed runs per item (after one warm-up); the figure is their median */
    double budget; /**< seconds of timed runs per item: fewer runs when one run is slow (never fewer than min_reps) */
    double cold;   /**< a warm-up longer than this is the only run (its time is reported, marked "*") */
    double skip;   /**< an item whose time, estimated from a smaller one in this run, exceeds this is skipped */
    int full;      /**< --full: never skip */
    const char *plot; /**< --plot PATH: draw the results (Python package, matplotlib) */
} bench_opts;

/** Peak FLOP/s of each loop: v[k][0] on 1 thread, v[k][1] on N threads; < 0 = not available. */
typedef enum { PEAK_AMX = 0, PEAK_BF16 = 1, PEAK_FMA = 2, PEAK_KINDS = 3 } peak_kind;
typedef struct bench_peaks {
    double v[PEAK_KINDS][2];
    int ref; /**< the kind "% of peak" refers to; -1 when none can run */
} bench_peaks;

typedef struct bench_ctx {
    bench_opts o;
    mxfp8_info info;
    bench_peaks peaks;
    cJSON *root; /**< the JSON document (always built; printed with --json, read by --plot) */
} bench_ctx;

/** printf to stdout unless --json. */
void bench_say(const bench_ctx *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- harness.c: timing, threads, data, JSON ---- */
typedef int (*bench_fn)(void *arg); /**< one run of the measured thing; 0 on success */

/** Times of one item: the median of `runs` timed runs after one warm-up (runs == 0: the warm-up was longer than
 *  opts.cold and is the only, "cold", run); best = the fastest run. */
typedef struct bench_time {
    double median, best; /**< seconds; -1 when the function failed */
    int runs;
} bench_time;

/** One warm-up, then timed runs: at most opts.reps, at least min_reps (even past the time budget), fewer than
 *  opts.reps only when they would exceed opts.budget seconds. Returns median seconds, or -1 on failure. */
double bench_measure(const bench_ctx *b, bench_fn fn, void *arg, int min_reps, bench_time *t);
/** Threads of the library, of oneDNN (OpenMP) and of the memcpy baseline. 0 on success. */
int bench_set_threads(int nt);
/** 64-byte aligned, never for 0 bytes; NULL on failure. Free with free(). */
void *bench_alloc(size_t bytes);
/** Deterministic uniform value in [lo, hi). */
double bench_urand(double lo, double hi);
/** BF16 bits of a finite float (round to nearest even). */
uint16_t bench_bf16(float f);
void bench_fill_bf16(uint16_t *p, size_t n, double lo, double hi);
/** "status: message" of the last failed library call (static buffer). */
const char *bench_lib_error(mxfp8_status st);
/** Add a number, or null when v < 0 or not finite. */
void bench_json_num(cJSON *obj, const char *key, double v);
/** Time on 1 thread / time on N threads, or -1 when either is missing or N == 1. */
double bench_scaling(double t1, double tn, int nt);

/** An item measured on opts.threads (N) and, for thread_scaling, on 1 thread. */
typedef struct bench_item {
    bench_time t;     /**< on N threads */
    bench_time t1;    /**< on 1 thread (median -1: not measured) */
    const char *err;  /**< why there is no time (NULL when there is one) */
    char errbuf[200];
} bench_item;
/** Measure fn on N threads unless its time, estimated as flops / *rate, exceeds opts.skip (and not --full); then on
 *  1 thread unless N == 1 or that is estimated to exceed opts.skip. *rate (FLOP/s, -1 = unknown) is updated from
 *  the N-thread run, for the next, larger item. err_of(arg) gives the library's message when fn fails. Leaves
 *  the thread count at N. */
void bench_item_measure(const bench_ctx *b, bench_fn fn, void *arg, double flops, double *rate,
                        const char *(*err_of)(void *arg), bench_item *it);
/** Add "ms" (median, N threads), "best_ms", "timed_runs", "ms_1thread", "thread_scaling" and "error" to a row. */
void bench_item_json(cJSON *row, const bench_item *it, int nt);

/* ---- peaks.c ---- */
/** Measure the peaks (prints them, adds "peaks" to the JSON document). */
void bench_peaks_run(bench_ctx *b);
/** The reference peak on nt threads (FLOP/s): the measured nt-thread figure, or nt x the 1-thread one when that is
 *  larger (a shared CPU depresses the multi-thread measurement); -1 when no peak loop can run. */
double bench_ref_peak(const bench_ctx *b, int nt);

/* ---- onednn.c: C[M, N] = A[M, K] @ B[K, N] in bf16, no quantization ---- */
typedef struct bench_gemm {
    void *prim, *a, *b, *c; /**< oneDNN handles (opaque here) */
    char impl[96];          /**< oneDNN's name of the implementation it chose */
} bench_gemm;
/** 1 when this build links oneDNN. */
int bench_dnnl_linked(void);
/** Print and record (JSON "onednn") which oneDNN the baselines use, or that there is none. */
void bench_dnnl_describe(bench_ctx *b);
/** a_t: A stored [K, M] row-major (A^T); b_t: B stored [N, K] row-major (B^T); C [M, N] row-major, bf16, or f32
 *  with accumulation (C += A @ B) when c_f32_acc. 0 on success; -1 (also when oneDNN is absent). */
int bench_gemm_init(bench_gemm *g, int64_t M, int64_t N, int64_t K, int a_t, int b_t, int c_f32_acc);
int bench_gemm_run(bench_gemm *g, void *a, void *b, void *c);
/** Wait for the queued GEMMs. 0 on success. */
int bench_gemm_wait(void);
void bench_gemm_free(bench_gemm *g);
void bench_dnnl_shutdown(void);

/* ---- the benchmarks ---- */
void bench_quantize(bench_ctx *b);
void bench_matmul(bench_ctx *b);
void bench_moe(bench_ctx *b);

#endif /* MXFP8_BENCH_H */
