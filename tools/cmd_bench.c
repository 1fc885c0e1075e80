/*
 * cmd_bench.c -- `mxfp8 bench`: how fast libmxfp8 is, measured against the limits of the machine it runs on.
 *
 * Contract
 * --------
 * Every speed figure printed is a ratio of two things measured IN THE SAME RUN, each the best of N timed runs after
 * one untimed warm-up:
 *   - peaks:    register-resident loops written here (inline asm, no memory traffic): AMX TDPBF16PS (only when CPUID
 *               reports AMX-TILE + AMX-BF16, XCR0 enables tile state and arch_prctl(ARCH_REQ_XCOMP_PERM,
 *               XFEATURE_XTILEDATA) succeeds -- otherwise it is never executed), AVX512-BF16 VDPBF16PS and AVX-512
 *               FP32 FMA (each only when CPUID + XCR0 allow it). The reference peak for "% of peak" is the first
 *               available of AMX, AVX512-BF16, FP32 FMA, on the same number of threads as the measured call.
 *   - quantize: mxfp8_quantize BF16 -> E4M3 codes + E8M0 scales of a 4096x4096 matrix along rows (axis 1) and along
 *               columns (axis 0), on 1 and T threads, GB/s = (bytes read + bytes written) / time, beside a memcpy of
 *               the input matrix on the same threads (GB/s = 2 * bytes / time), and their ratio.
 *   - matmul:   mxfp8_matmul_backward (dX = dY @ W, dW = dY^T @ X, both quantizations included: end to end) and
 *               mxfp8_matmul (forward) at M = N = K = 4096 and the upstream (M, K, N) shapes; FLOPs = 2*M*N*K per GEMM;
 *               and oneDNN's bf16 matmul doing the same GEMMs with no quantization (when built with oneDNN).
 *   - moe:      mxfp8_moe_backward at the upstream problem and a larger one, with all four forward checkpoints given
 *               (no recompute); FLOPs = GEMM FLOPs of phases 1-4 = 12 * rows * H * I, counted over real (routed)
 *               rows T*TopK and over all N*B block rows; oneDNN doing the same four GEMMs per block (pre-gathered
 *               operands, FP32 accumulation of the weight gradients, no activation backward); peak resident memory.
 * The bench uses only the public header (plus oneDNN when MXFP8_HAVE_DNNL).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "mxfp8.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#ifdef MXFP8_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

int cmd_bench(int argc, char **argv);

/* ============================================================================================================ */
/* Options, output, timing                                                                                      */
/* ============================================================================================================ */
enum { SEC_PEAK = 1, SEC_QUANT = 2, SEC_MATMUL = 4, SEC_MOE = 8, SEC_ALL = 15 };

typedef struct bench_opts {
    int sections;
    int threads;   /* T: threads of the matmul/moe sections and the second quantize column */
    int json;
    int quick;
    int reps;      /* best of `reps` timed runs (after one warm-up) */
    double budget; /* seconds of timed runs per item: fewer reps when one run is slow */
    double cold;   /* a warm-up longer than this is the only run (its time is reported, marked "1 cold run") */
    double skip;   /* an item whose time, estimated from a smaller one in this run, exceeds this is skipped */
    int full;      /* --full: never skip */
} bench_opts;

static cJSON *g_root;     /* JSON document (always built; printed with --json) */
static int g_text = 1;    /* print the human-readable tables */

#define say(...) do { if (g_text) { printf(__VA_ARGS__); fflush(stdout); } } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef int (*bench_fn)(void *ctx); /* returns 0 on success */

/* One warm-up, then up to o->reps timed runs (at least 1, fewer when the runs exceed o->budget). Best time in
 * seconds, or -1 when the function fails. *reps_done = timed runs; 0 when the warm-up took longer than o->cold and
 * its time is returned (a run that long is not helped by a warm-up; repeating it would blow the time budget). */
static double time_best(const bench_opts *o, bench_fn fn, void *ctx, int *reps_done) {
    double t0 = now_s();
    if (reps_done) *reps_done = 0;
    if (fn(ctx) != 0) return -1.0;
    double warm = now_s() - t0, best = 1e300, spent = 0;
    if (warm > o->cold) return warm;
    int n = 0;
    for (; n < o->reps; n++) {
        if (n >= 1 && spent + warm > o->budget) break;
        double t = now_s();
        if (fn(ctx) != 0) return -1.0;
        t = now_s() - t;
        spent += t;
        if (t < best) best = t;
    }
    if (reps_done) *reps_done = n;
    return best;
}

static int set_threads(int nt) {
    if (mxfp8_set_num_threads(nt) != MXFP8_OK) return -1;
#ifdef _OPENMP
    omp_set_num_threads(nt); /* oneDNN (OpenMP runtime) and the memcpy baseline */
#endif
    return 0;
}

static void *xalloc(size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = 64;
    if (posix_memalign(&p, 64, (bytes + 63) & ~(size_t)63) != 0) return NULL;
    return p;
}

/* Deterministic uniform values: xorshift64*, mapped to [lo, hi). */
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static double urand(double lo, double hi) {
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    uint64_t r = g_rng * 0x2545F4914F6CDD1Dull;
    return lo + (hi - lo) * (double)(r >> 11) * (1.0 / 9007199254740992.0);
}
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u); /* RNE; inputs here are finite */
    return (uint16_t)(u >> 16);
}
static void fill_bf16(uint16_t *p, size_t n, double lo, double hi) {
    for (size_t i = 0; i < n; i++) p[i] = to_bf16((float)urand(lo, hi));
}

static const char *lib_error(mxfp8_status st) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s: %s", mxfp8_status_string(st), mxfp8_last_error_message());
    return buf;
}

static void json_num(cJSON *obj, const char *k, double v) {
    if (v < 0 || !isfinite(v)) cJSON_AddNullToObject(obj, k);
    else cJSON_AddNumberToObject(obj, k, v);
}

/* ============================================================================================================ */
/* Peak loops (register-resident; no loads or stores inside the loop)                                           */
/* ============================================================================================================ */
typedef struct cpu_caps {
    int avx512f, avx512bf16, amx_tile, amx_bf16, os_avx512, os_amx, amx_permitted;
    const char *amx_why; /* why AMX is not used ("" when it is) */
} cpu_caps;

static cpu_caps detect_caps(void) {
    cpu_caps c;
    memset(&c, 0, sizeof c);
    c.amx_why = "not an x86-64 CPU";
#if defined(__x86_64__)
    unsigned a, b, cx, d;
    unsigned long long xcr0 = 0;
    if (__get_cpuid(1, &a, &b, &cx, &d) && (cx & (1u << 27))) {
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        xcr0 = ((unsigned long long)hi << 32) | lo;
    }
    c.os_avx512 = (xcr0 & 0xE6) == 0xE6;
    c.os_amx = (xcr0 & (3ull << 17)) == (3ull << 17);
    if (__get_cpuid_count(7, 0, &a, &b, &cx, &d)) {
        c.avx512f = c.os_avx512 && ((b >> 16) & 1);
        c.amx_bf16 = (d >> 22) & 1;
        c.amx_tile = (d >> 24) & 1;
        unsigned a1, b1, c1, d1;
        if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) c.avx512bf16 = c.avx512f && ((a1 >> 5) & 1);
    }
    if (!c.amx_tile || !c.amx_bf16) c.amx_why = "AMX: not available on this CPU (CPUID lacks AMX-TILE/AMX-BF16)";
    else if (!c.os_amx) c.amx_why = "AMX: the OS does not enable tile state (XCR0 bits 17/18)";
    else if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) != 0)
        c.amx_why = "AMX: arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) refused by the OS";
    else { c.amx_permitted = 1; c.amx_why = ""; }
#endif
    return c;
}

#if defined(__x86_64__)
/* 16 independent VDPBF16PS chains: 16 x (16 lanes x 2 pairs x 2 FLOP) = 1024 FLOP per iteration. */
#define PEAK_BF16_FLOP_PER_ITER 1024.0
__attribute__((target("avx512f,avx512bf16"), noinline)) static void loop_vdpbf16ps(int64_t n) {
    __asm__ volatile(
        "vpxord %%zmm0, %%zmm0, %%zmm0\n\t"
        "vmovaps %%zmm0, %%zmm1\n\t vmovaps %%zmm0, %%zmm2\n\t vmovaps %%zmm0, %%zmm3\n\t"
        "vmovaps %%zmm0, %%zmm4\n\t vmovaps %%zmm0, %%zmm5\n\t vmovaps %%zmm0, %%zmm6\n\t vmovaps %%zmm0, %%zmm7\n\t"
        "vmovaps %%zmm0, %%zmm8\n\t vmovaps %%zmm0, %%zmm9\n\t vmovaps %%zmm0, %%zmm10\n\t vmovaps %%zmm0, %%zmm11\n\t"
        "vmovaps %%zmm0, %%zmm12\n\t vmovaps %%zmm0, %%zmm13\n\t vmovaps %%zmm0, %%zmm14\n\t vmovaps %%zmm0, %%zmm15\n\t"
        "vmovaps %%zmm0, %%zmm30\n\t vmovaps %%zmm0, %%zmm31\n\t"
        ".p2align 5\n"
        "1:\n\t"
        "vdpbf16ps %%zmm31, %%zmm30, %%zmm0\n\t vdpbf16ps %%zmm31, %%zmm30, %%zmm1\n\t"
        "vdpbf16ps %%zmm31, %%zmm30, %%zmm2\n\t vdpbf16ps %%zmm31, %%zmm30, %%zmm3\n\t"
        "vdpbf16ps %%zmm31, %%zmm30, %%zmm4\n\t vdpbf16ps %%zmm31, %%zmm30, %%zmm5\n\t"
        "vdpbf16ps %%zmm31, %%zmm30, %%zmm6\n\t vdpbf16ps %%zmm31, %%zmm30, %%zmm7\n\t"
        "vdpbf16ps %%zmm31, %%zmm30, %%zmm8\n\t vdpbf16ps %%zmm31, %%zmm30, %%zmm9\n\t"
        "vdpbf16ps %%zmm31, %%zmm30, %%zmm10\n\t vdpbf16ps %%zmm31, %%zmm30, %%zmm11\n\t"
        "vdpbf16ps %%zmm31, %%zmm30, %%zmm12\n\t vdpbf16ps %%zmm31, %%zmm30, %%zmm13\n\t"
        "vdpbf16ps %%zmm31, %%zmm30, %%zmm14\n\t vdpbf16ps %%zmm31, %%zmm30, %%zmm15\n\t"
        "dec %0\n\t"
        "jnz 1b\n\t"
        "vzeroupper\n\t"
        : "+r"(n)
        :
        : "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
          "xmm12", "xmm13", "xmm14", "xmm15", "xmm30", "xmm31");
}

/* 16 independent FP32 FMA chains on zmm: 16 x 16 lanes x 2 FLOP = 512 FLOP per iteration. */
#define PEAK_FMA_FLOP_PER_ITER 512.0
__attribute__((target("avx512f"), noinline)) static void loop_fma(int64_t n) {
    __asm__ volatile(
        "vpxord %%zmm0, %%zmm0, %%zmm0\n\t"
        "vmovaps %%zmm0, %%zmm1\n\t vmovaps %%zmm0, %%zmm2\n\t vmovaps %%zmm0, %%zmm3\n\t"
        "vmovaps %%zmm0, %%zmm4\n\t vmovaps %%zmm0, %%zmm5\n\t vmovaps %%zmm0, %%zmm6\n\t vmovaps %%zmm0, %%zmm7\n\t"
        "vmovaps %%zmm0, %%zmm8\n\t vmovaps %%zmm0, %%zmm9\n\t vmovaps %%zmm0, %%zmm10\n\t vmovaps %%zmm0, %%zmm11\n\t"
        "vmovaps %%zmm0, %%zmm12\n\t vmovaps %%zmm0, %%zmm13\n\t vmovaps %%zmm0, %%zmm14\n\t vmovaps %%zmm0, %%zmm15\n\t"
        "vmovaps %%zmm0, %%zmm30\n\t vmovaps %%zmm0, %%zmm31\n\t"
        ".p2align 5\n"
        "1:\n\t"
        "vfmadd231ps %%zmm31, %%zmm30, %%zmm0\n\t vfmadd231ps %%zmm31, %%zmm30, %%zmm1\n\t"
        "vfmadd231ps %%zmm31, %%zmm30, %%zmm2\n\t vfmadd231ps %%zmm31, %%zmm30, %%zmm3\n\t"
        "vfmadd231ps %%zmm31, %%zmm30, %%zmm4\n\t vfmadd231ps %%zmm31, %%zmm30, %%zmm5\n\t"
        "vfmadd231ps %%zmm31, %%zmm30, %%zmm6\n\t vfmadd231ps %%zmm31, %%zmm30, %%zmm7\n\t"
        "vfmadd231ps %%zmm31, %%zmm30, %%zmm8\n\t vfmadd231ps %%zmm31, %%zmm30, %%zmm9\n\t"
        "vfmadd231ps %%zmm31, %%zmm30, %%zmm10\n\t vfmadd231ps %%zmm31, %%zmm30, %%zmm11\n\t"
        "vfmadd231ps %%zmm31, %%zmm30, %%zmm12\n\t vfmadd231ps %%zmm31, %%zmm30, %%zmm13\n\t"
        "vfmadd231ps %%zmm31, %%zmm30, %%zmm14\n\t vfmadd231ps %%zmm31, %%zmm30, %%zmm15\n\t"
        "dec %0\n\t"
        "jnz 1b\n\t"
        "vzeroupper\n\t"
        : "+r"(n)
        :
        : "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
          "xmm12", "xmm13", "xmm14", "xmm15", "xmm30", "xmm31");
}

/* AMX: 4 accumulator tiles (tmm0-3) fed by 2 A tiles (tmm4-5) and 2 B tiles (tmm6-7), all 16 rows x 64 bytes.
 * One TDPBF16PS = 16 x 16 x 32 multiply-adds = 16384 FLOP; 4 per iteration. Called only after detect_caps() said
 * amx_permitted (CPUID + XCR0 + arch_prctl), so it can never raise SIGILL. */
#define PEAK_AMX_FLOP_PER_ITER 65536.0
typedef struct __attribute__((packed, aligned(64))) amx_tilecfg {
    uint8_t palette_id, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tilecfg;
_Static_assert(sizeof(amx_tilecfg) == 64, "LDTILECFG reads 64 bytes");

__attribute__((noinline)) static void loop_tdpbf16ps(int64_t n) {
    amx_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int t = 0; t < 8; t++) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
    __asm__ volatile(
        "ldtilecfg (%1)\n\t"
        "tilezero %%tmm0\n\t tilezero %%tmm1\n\t tilezero %%tmm2\n\t tilezero %%tmm3\n\t"
        "tilezero %%tmm4\n\t tilezero %%tmm5\n\t tilezero %%tmm6\n\t tilezero %%tmm7\n\t"
        ".p2align 5\n"
        "1:\n\t"
        "tdpbf16ps %%tmm6, %%tmm4, %%tmm0\n\t"
        "tdpbf16ps %%tmm7, %%tmm4, %%tmm1\n\t"
        "tdpbf16ps %%tmm6, %%tmm5, %%tmm2\n\t"
        "tdpbf16ps %%tmm7, %%tmm5, %%tmm3\n\t"
        "dec %0\n\t"
        "jnz 1b\n\t"
        "tilerelease\n\t"
        : "+r"(n)
        : "r"(&cfg)
        : "cc", "memory");
}
#endif /* __x86_64__ */

typedef enum { PEAK_AMX = 0, PEAK_BF16 = 1, PEAK_FMA = 2, PEAK_KINDS = 3 } peak_kind;
static const char *const k_peak_name[PEAK_KINDS] = {"AMX TDPBF16PS", "AVX512-BF16 VDPBF16PS", "AVX-512 FP32 FMA"};
static const char *const k_peak_key[PEAK_KINDS] = {"amx_bf16", "avx512_bf16", "avx512_fp32_fma"};

static void run_peak_loop(peak_kind k, int64_t n) {
#if defined(__x86_64__)
    if (k == PEAK_AMX) loop_tdpbf16ps(n);
    else if (k == PEAK_BF16) loop_vdpbf16ps(n);
    else loop_fma(n);
#else
    (void)k; (void)n;
#endif
}
static double peak_flop_per_iter(peak_kind k) {
    return k == PEAK_AMX ? PEAK_AMX_FLOP_PER_ITER : k == PEAK_BF16 ? PEAK_BF16_FLOP_PER_ITER : PEAK_FMA_FLOP_PER_ITER;
}

/* FLOP/s of `nt` threads each running the loop; best of 5 runs of ~0.1 s. */
static double measure_peak(peak_kind k, int nt) {
    int64_t n = 1 << 14;
    for (;;) { /* calibrate on one thread to ~0.1 s */
        double t = now_s();
        run_peak_loop(k, n);
        t = now_s() - t;
        if (t > 0.02 || n > ((int64_t)1 << 40)) { n = (int64_t)((double)n * 0.1 / (t > 1e-9 ? t : 1e-9)) + 1; break; }
        n *= 4;
    }
    double best = 1e300;
    for (int r = 0; r < 5; r++) {
        double t0 = now_s();
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
#endif
        run_peak_loop(k, n);
        double t = now_s() - t0;
        if (t < best) best = t;
    }
    return (double)nt * (double)n * peak_flop_per_iter(k) / best;
}

/* peaks[k][0]: 1 thread, [k][1]: T threads; < 0 = not available. */
typedef struct peaks {
    double v[PEAK_KINDS][2];
    int ref;  /* kind used for "% of peak" */
    int threads;
} peaks;

/* The reference peak on nt threads: the measured nt-thread figure, or nt x the 1-thread figure when that is larger
 * (a shared CPU depresses the multi-thread measurement; fractions must not exceed 100% because of it). */
static double ref_peak(const peaks *p, int nt) {
    if (p->ref < 0) return -1;
    if (nt == 1) return p->v[p->ref][0];
    double ideal = (double)nt * p->v[p->ref][0];
    return p->v[p->ref][1] > ideal ? p->v[p->ref][1] : ideal;
}

static void bench_peaks(const bench_opts *o, const cpu_caps *cc, peaks *p) {
    int avail[PEAK_KINDS] = {cc->amx_permitted, cc->avx512bf16, cc->avx512f};
    p->threads = o->threads;
    p->ref = -1;
    say("\npeaks (register-resident loops, best of 5, this run)\n");
    if (!cc->amx_permitted) say("  %s\n", cc->amx_why);
    cJSON *jp = cJSON_AddObjectToObject(g_root, "peaks");
    cJSON_AddStringToObject(jp, "amx", cc->amx_permitted ? "available" : cc->amx_why);
    for (int k = 0; k < PEAK_KINDS; k++) {
        p->v[k][0] = p->v[k][1] = -1;
        cJSON *jk = cJSON_AddObjectToObject(jp, k_peak_key[k]);
        if (!avail[k]) {
            say("  %-24s not available on this CPU\n", k_peak_name[k]);
            cJSON_AddNullToObject(jk, "tflops_1thread");
            cJSON_AddNullToObject(jk, "tflops_threads");
            continue;
        }
        p->v[k][0] = measure_peak((peak_kind)k, 1);
        p->v[k][1] = o->threads > 1 ? measure_peak((peak_kind)k, o->threads) : p->v[k][0];
        if (p->ref < 0) p->ref = k;
        say("  %-24s %8.3f TFLOP/s on 1 thread   %8.3f TFLOP/s on %d threads\n", k_peak_name[k], p->v[k][0] / 1e12,
            p->v[k][1] / 1e12, o->threads);
        cJSON_AddNumberToObject(jk, "tflops_1thread", p->v[k][0] / 1e12);
        cJSON_AddNumberToObject(jk, "tflops_threads", p->v[k][1] / 1e12);
    }
    double load[3] = {-1, -1, -1};
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fscanf(la, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
        fclose(la);
    }
    json_num(jp, "loadavg_1min", load[0]);
    if (p->ref >= 0 && o->threads > 1) {
        double scale = p->v[p->ref][1] / p->v[p->ref][0];
        cJSON_AddNumberToObject(jp, "thread_scaling", scale);
        if (scale < 0.8 * o->threads) {
            say("  WARNING: the %d-thread peak is only %.2fx the 1-thread peak (load average %.2f): the CPU is shared "
                "with other work right now, so every figure below is noisy\n", o->threads, scale, load[0]);
            cJSON_AddBoolToObject(jp, "cpu_contended", 1);
        }
    }
    if (p->ref >= 0) {
        say("  \"%% of peak\" below = fraction of the %s peak on the same thread count (%.3f TFLOP/s on %d; the "
            "larger of the measured figure and %d x the 1-thread one)\n", k_peak_name[p->ref],
            ref_peak(p, o->threads) / 1e12, o->threads, o->threads);
        json_num(jp, "reference_tflops_threads", ref_peak(p, o->threads) / 1e12);
        cJSON_AddStringToObject(jp, "reference", k_peak_key[p->ref]);
    } else {
        say("  no SIMD peak loop can run on this CPU: no \"%% of peak\" below\n");
        cJSON_AddNullToObject(jp, "reference");
    }
}

/* ============================================================================================================ */
/* oneDNN baseline: bf16 matmul C[M,N] = A[M,K] @ B[K,N], no quantization                                       */
/* ============================================================================================================ */
#ifdef MXFP8_HAVE_DNNL
static dnnl_engine_t g_eng;
static dnnl_stream_t g_strm;
static int g_dnnl_ok = -1; /* -1 unknown, 0 failed, 1 ready */

static int dnnl_ready(void) {
    if (g_dnnl_ok < 0) {
        g_dnnl_ok = dnnl_engine_create(&g_eng, dnnl_cpu, 0) == dnnl_success &&
                    dnnl_stream_create(&g_strm, g_eng, dnnl_stream_default_flags) == dnnl_success;
    }
    return g_dnnl_ok;
}

typedef struct dgemm {
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
    char impl[96];
} dgemm;

/* a_t: A is stored as [K, M] row-major (A^T); b_t: B is stored as [N, K] row-major (B^T). C is [M, N] row-major,
 * bf16, or f32 with accumulation (sum post-op) when c_f32_acc. Returns 0 on success. */
static int dgemm_init(dgemm *g, int64_t M, int64_t N, int64_t K, int a_t, int b_t, int c_f32_acc) {
    memset(g, 0, sizeof *g);
    if (!dnnl_ready()) return -1;
    dnnl_memory_desc_t amd, bmd, cmd;
    dnnl_dims_t ad = {M, K}, bd = {K, N}, cd = {M, N};
    dnnl_dims_t as = {a_t ? 1 : K, a_t ? M : 1}, bs = {b_t ? 1 : N, b_t ? K : 1}, cs = {N, 1};
    if (dnnl_memory_desc_init_by_strides(&amd, 2, ad, dnnl_bf16, as) != dnnl_success) return -1;
    if (dnnl_memory_desc_init_by_strides(&bmd, 2, bd, dnnl_bf16, bs) != dnnl_success) return -1;
    if (dnnl_memory_desc_init_by_strides(&cmd, 2, cd, c_f32_acc ? dnnl_f32 : dnnl_bf16, cs) != dnnl_success) return -1;
    dnnl_matmul_desc_t md;
    if (dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &cmd) != dnnl_success) return -1;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    if (c_f32_acc) {
        if (dnnl_primitive_attr_create(&attr) != dnnl_success) return -1;
        dnnl_post_ops_create(&po);
        dnnl_post_ops_append_sum(po, 1.0f);
        dnnl_primitive_attr_set_post_ops(attr, po);
    }
    dnnl_primitive_desc_t pd;
    dnnl_status_t st = dnnl_primitive_desc_create(&pd, &md, attr, g_eng, NULL);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) return -1;
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
        snprintf(g->impl, sizeof g->impl, "%s", impl);
    st = dnnl_primitive_create(&g->prim, pd);
    dnnl_primitive_desc_destroy(pd);
    if (st != dnnl_success) return -1;
    if (dnnl_memory_create(&g->a, &amd, g_eng, DNNL_MEMORY_NONE) != dnnl_success ||
        dnnl_memory_create(&g->b, &bmd, g_eng, DNNL_MEMORY_NONE) != dnnl_success ||
        dnnl_memory_create(&g->c, &cmd, g_eng, DNNL_MEMORY_NONE) != dnnl_success)
        return -1;
    return 0;
}

static int dgemm_run(dgemm *g, void *a, void *b, void *c) {
    dnnl_memory_set_data_handle(g->a, a);
    dnnl_memory_set_data_handle(g->b, b);
    dnnl_memory_set_data_handle(g->c, c);
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, g->a}, {DNNL_ARG_WEIGHTS, g->b}, {DNNL_ARG_DST, g->c}};
    if (dnnl_primitive_execute(g->prim, g_strm, 3, args) != dnnl_success) return -1;
    return 0;
}

static void dgemm_free(dgemm *g) {
    if (g->prim) dnnl_primitive_destroy(g->prim);
    if (g->a) dnnl_memory_destroy(g->a);
    if (g->b) dnnl_memory_destroy(g->b);
    if (g->c) dnnl_memory_destroy(g->c);
    memset(g, 0, sizeof *g);
}
#endif /* MXFP8_HAVE_DNNL */

static void describe_onednn(void) {
    cJSON *j = cJSON_AddObjectToObject(g_root, "onednn");
#ifdef MXFP8_HAVE_DNNL
    const dnnl_version_t *v = dnnl_version();
    char ver[64];
    snprintf(ver, sizeof ver, "%d.%d.%d", v->major, v->minor, v->patch);
    cJSON_AddStringToObject(j, "version", ver);
    cJSON_AddBoolToObject(j, "linked", 1);
    say("oneDNN %s linked: baseline = its bf16 matmul on the same GEMMs, no quantization\n", ver);
#else
    cJSON_AddBoolToObject(j, "linked", 0);
    say("oneDNN: ABSENT (built without libdnnl-dev): no oneDNN baseline in this run\n");
#endif
}

/* ============================================================================================================ */
/* quantize                                                                                                     */
/* ============================================================================================================ */
typedef struct quant_ctx {
    mxfp8_tensor src, data, scales;
    mxfp8_quant_params params;
    int axis;
    mxfp8_status st;
} quant_ctx;

static int run_quant(void *p) {
    quant_ctx *q = p;
    q->st = mxfp8_quantize(&q->src, q->axis, &q->params, &q->data, &q->scales);
    return q->st == MXFP8_OK ? 0 : -1;
}

typedef struct copy_ctx {
    const char *src;
    char *dst;
    size_t bytes;
    int nt;
} copy_ctx;

static int run_copy(void *p) {
    copy_ctx *c = p;
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

static void bench_quantize(const bench_opts *o) {
    const int64_t R = 4096, C = 4096;
    cJSON *ja = cJSON_AddArrayToObject(g_root, "quantize");
    say("\nquantize: BF16 %lldx%lld -> E4M3 codes + E8M0 scales (nki rule, 1x32), mxfp8_quantize; "
        "GB/s = (bytes read + written) / time; memcpy of the BF16 input, same threads, GB/s = 2 x bytes / time\n",
        (long long)R, (long long)C);
    size_t in_bytes = (size_t)(R * C * 2);
    uint16_t *src = xalloc(in_bytes);
    uint8_t *codes = xalloc((size_t)(R * C));
    uint8_t *scales = xalloc((size_t)(R * C / 32));
    char *copy_dst = xalloc(in_bytes);
    if (!src || !codes || !scales || !copy_dst) {
        say("  out of memory\n");
        goto done;
    }
    /* Values over many magnitudes: uniform mantissa times 2^[-20, 20). */
    for (size_t i = 0; i < (size_t)(R * C); i++)
        src[i] = to_bf16((float)(urand(-1, 1) * ldexp(1.0, (int)urand(-20, 20))));
    memset(codes, 0, (size_t)(R * C));
    memset(scales, 0, (size_t)(R * C / 32));
    memset(copy_dst, 0, in_bytes);

    say("  %-8s %7s %10s %9s %12s %8s\n", "axis", "threads", "time ms", "GB/s", "memcpy GB/s", "ratio");
    int tlist[2] = {1, o->threads};
    int ntl = o->threads > 1 ? 2 : 1;
    double t_axis_1thr[2] = {-1, -1};
    for (int ax = 0; ax < 2; ax++) {
        for (int ti = 0; ti < ntl; ti++) {
            int nt = tlist[ti];
            set_threads(nt);
            quant_ctx q;
            int64_t shp[2] = {R, C}, sshp[2] = {ax == 0 ? R : R / 32, ax == 0 ? C / 32 : C};
            q.src = mxfp8_tensor_make(src, MXFP8_DTYPE_BF16, 2, shp);
            q.data = mxfp8_tensor_make(codes, MXFP8_DTYPE_E4M3, 2, shp);
            q.scales = mxfp8_tensor_make(scales, MXFP8_DTYPE_E8M0, 2, sshp);
            q.params = mxfp8_quant_params_default();
            q.axis = ax == 0 ? 1 : 0;
            q.st = MXFP8_OK;
            copy_ctx cp = {(const char *)src, copy_dst, in_bytes, nt};
            double tq = time_best(o, run_quant, &q, NULL);
            double tc = time_best(o, run_copy, &cp, NULL);
            double bytes = (double)in_bytes + (double)(R * C) + (double)(R * C / 32);
            double gbq = tq > 0 ? bytes / tq / 1e9 : -1, gbc = 2.0 * (double)in_bytes / tc / 1e9;
            const char *axname = ax == 0 ? "rows" : "columns";
            if (tq < 0) {
                say("  %-8s %7d  failed: %s\n", axname, nt, lib_error(q.st));
            } else {
                say("  %-8s %7d %10.2f %9.2f %12.2f %7.0f%%\n", axname, nt, tq * 1e3, gbq, gbc, 100.0 * gbq / gbc);
            }
            if (nt == 1) t_axis_1thr[ax] = tq;
            cJSON *j = cJSON_CreateObject();
            cJSON_AddStringToObject(j, "axis", ax == 0 ? "rows" : "columns");
            cJSON_AddNumberToObject(j, "threads", nt);
            json_num(j, "ms", tq > 0 ? tq * 1e3 : -1);
            json_num(j, "gbps", gbq);
            json_num(j, "memcpy_gbps", gbc);
            json_num(j, "ratio_to_memcpy", tq > 0 ? gbq / gbc : -1);
            if (nt > 1 && tq > 0 && t_axis_1thr[ax] > 0) json_num(j, "speedup_vs_1thread", t_axis_1thr[ax] / tq);
            cJSON_AddItemToArray(ja, j);
            if (nt > 1 && tq > 0 && t_axis_1thr[ax] > 0)
                say("  %-8s %7s speed-up %.2fx over 1 thread (%s)\n", "", "", t_axis_1thr[ax] / tq,
                    t_axis_1thr[ax] / tq > 1.3 ? "multi-threaded" : "not multi-threaded, or memory-bound");
        }
    }
    say("  target: ratio >= 80%%\n");
done:
    free(src);
    free(codes);
    free(scales);
    free(copy_dst);
    set_threads(o->threads);
}

/* ============================================================================================================ */
/* matmul                                                                                                       */
/* ============================================================================================================ */
typedef struct mm_ctx {
    int64_t M, K, N;
    uint16_t *dy, *w, *x, *dx, *dw, *y;
    mxfp8_status st;
    int fwd;
#ifdef MXFP8_HAVE_DNNL
    dgemm g1, g2;
#endif
} mm_ctx;

static int run_mm_bwd(void *p) {
    mm_ctx *c = p;
    mxfp8_matmul_bwd_args a;
    mxfp8_matmul_bwd_args_init(&a);
    int64_t sdy[2] = {c->M, c->N}, sw[2] = {c->N, c->K}, sx[2] = {c->M, c->K};
    a.output_grad = mxfp8_tensor_make(c->dy, MXFP8_DTYPE_BF16, 2, sdy);
    a.weights = mxfp8_tensor_make(c->w, MXFP8_DTYPE_BF16, 2, sw);
    a.input_activation = mxfp8_tensor_make(c->x, MXFP8_DTYPE_BF16, 2, sx);
    mxfp8_tensor dx = mxfp8_tensor_make(c->dx, MXFP8_DTYPE_BF16, 2, sx);
    mxfp8_tensor dw = mxfp8_tensor_make(c->dw, MXFP8_DTYPE_BF16, 2, sw);
    c->st = mxfp8_matmul_backward(&a, &dx, &dw);
    return c->st == MXFP8_OK ? 0 : -1;
}

static int run_mm_fwd(void *p) {
    mm_ctx *c = p;
    mxfp8_operand xo, wo;
    memset(&xo, 0, sizeof xo);
    memset(&wo, 0, sizeof wo);
    int64_t sx[2] = {c->M, c->K}, sw[2] = {c->N, c->K}, sy[2] = {c->M, c->N};
    xo.values = mxfp8_tensor_make(c->x, MXFP8_DTYPE_BF16, 2, sx);
    wo.values = mxfp8_tensor_make(c->w, MXFP8_DTYPE_BF16, 2, sw);
    mxfp8_tensor y = mxfp8_tensor_make(c->y, MXFP8_DTYPE_BF16, 2, sy);
    c->st = mxfp8_matmul(&xo, &wo, NULL, &y);
    return c->st == MXFP8_OK ? 0 : -1;
}

#ifdef MXFP8_HAVE_DNNL
static int run_dnnl_mm_bwd(void *p) {
    mm_ctx *c = p;
    if (dgemm_run(&c->g1, c->dy, c->w, c->dx) || dgemm_run(&c->g2, c->dy, c->x, c->dw)) return -1;
    return dnnl_stream_wait(g_strm) == dnnl_success ? 0 : -1;
}
static int run_dnnl_mm_fwd(void *p) {
    mm_ctx *c = p;
    if (dgemm_run(&c->g1, c->x, c->w, c->y)) return -1;
    return dnnl_stream_wait(g_strm) == dnnl_success ? 0 : -1;
}
#endif

static void bench_matmul(const bench_opts *o, const peaks *pk) {
    /* (M, K, N): the upstream set first, so the 4096^3 time can be estimated before it is run */
    static const int64_t shapes_full[][3] = {{512, 512, 512}, {1024, 1024, 1024}, {2048, 1024, 512},
                                             {512, 1024, 2048}, {4096, 4096, 4096}};
    int nshapes = o->quick ? 4 : 5, first = 0;
    double rate[2] = {-1, -1}; /* FLOP/s of the largest mxfp8 run so far (bwd, fwd): estimates the next one */
    cJSON *ja = cJSON_AddArrayToObject(g_root, "matmul");
    int nt = o->threads;
    set_threads(nt);
    double peak = ref_peak(pk, nt);
    say("\nmatmul: BF16 inputs, E5M2 (seed default) quantized on the fly, BF16 outputs, %d thread(s); "
        "FLOPs = 2*M*N*K per GEMM (backward: 2 GEMMs); speed-up = oneDNN time / mxfp8 time\n", nt);
    say("  %-4s %5s %5s %5s %10s %8s %7s | %10s %8s %7s %8s\n", "op", "M", "K", "N", "time ms", "TFLOP/s", "% peak",
        "oneDNN ms", "TFLOP/s", "% peak", "speed-up");
    for (int si = first; si < first + nshapes && si < 5; si++) {
        mm_ctx c;
        memset(&c, 0, sizeof c);
        c.M = shapes_full[si][0];
        c.K = shapes_full[si][1];
        c.N = shapes_full[si][2];
        size_t mn = (size_t)(c.M * c.N), nk = (size_t)(c.N * c.K), mk = (size_t)(c.M * c.K);
        c.dy = xalloc(mn * 2); c.w = xalloc(nk * 2); c.x = xalloc(mk * 2);
        c.dx = xalloc(mk * 2); c.dw = xalloc(nk * 2); c.y = xalloc(mn * 2);
        if (!c.dy || !c.w || !c.x || !c.dx || !c.dw || !c.y) { say("  out of memory\n"); goto next; }
        fill_bf16(c.dy, mn, -1, 1);
        fill_bf16(c.w, nk, -0.1, 0.1);
        fill_bf16(c.x, mk, 0, 1);
        memset(c.dx, 0, mk * 2); memset(c.dw, 0, nk * 2); memset(c.y, 0, mn * 2);
        for (int fwd = 0; fwd < 2; fwd++) {
            const char *op = fwd ? "fwd" : "bwd";
            double flops = (fwd ? 2.0 : 4.0) * (double)c.M * (double)c.N * (double)c.K;
            double t = -1, td = -1;
            const char *err = NULL;
            int runs = 0;
            char skipmsg[160];
            double est = rate[fwd] > 0 ? flops / rate[fwd] : -1;
            if (est > o->skip && !o->full) {
                snprintf(skipmsg, sizeof skipmsg, "skipped: about %.0f s per run at the rate measured on the smaller "
                         "shape (--full runs it)", est);
                err = skipmsg;
            } else {
                t = time_best(o, fwd ? run_mm_fwd : run_mm_bwd, &c, &runs);
                if (t < 0) err = lib_error(c.st);
                else rate[fwd] = flops / t;
            }
#ifdef MXFP8_HAVE_DNNL
            int ok = fwd ? !dgemm_init(&c.g1, c.M, c.N, c.K, 0, 1, 0)               /* Y = X @ W^T */
                         : (!dgemm_init(&c.g1, c.M, c.K, c.N, 0, 0, 0) &&           /* dX = dY @ W */
                            !dgemm_init(&c.g2, c.N, c.K, c.M, 1, 0, 0));            /* dW = dY^T @ X */
            if (ok) td = time_best(o, fwd ? run_dnnl_mm_fwd : run_dnnl_mm_bwd, &c, NULL);
            char impl[200];
            snprintf(impl, sizeof impl, "%s%s%s", c.g1.impl, fwd ? "" : " + ", fwd ? "" : c.g2.impl);
            dgemm_free(&c.g1);
            dgemm_free(&c.g2);
#else
            const char *impl = "absent";
#endif
            double tf = t > 0 ? flops / t : -1, tfd = td > 0 ? flops / td : -1;
            char mine[64], theirs[64];
            if (t > 0) snprintf(mine, sizeof mine, "%9.2f%s %8.3f %6.1f%%", t * 1e3, runs ? " " : "*", tf / 1e12,
                                peak > 0 ? 100.0 * tf / peak : 0.0);
            else snprintf(mine, sizeof mine, "%10s %8s %7s", "-", "-", "-");
            if (td > 0) snprintf(theirs, sizeof theirs, "%10.2f %8.3f %6.1f%%", td * 1e3, tfd / 1e12, peak > 0 ? 100.0 * tfd / peak : 0.0);
            else snprintf(theirs, sizeof theirs, "%10s %8s %7s", "absent", "-", "-");
            say("  %-4s %5lld %5lld %5lld %s | %s ", op, (long long)c.M, (long long)c.K, (long long)c.N, mine, theirs);
            if (t > 0 && td > 0) say("%7.2fx\n", td / t);
            else say("%8s\n", "-");
            if (err) say("       mxfp8: %s\n", err);
            cJSON *j = cJSON_CreateObject();
            cJSON_AddStringToObject(j, "op", fwd ? "forward" : "backward");
            cJSON_AddNumberToObject(j, "M", (double)c.M);
            cJSON_AddNumberToObject(j, "K", (double)c.K);
            cJSON_AddNumberToObject(j, "N", (double)c.N);
            cJSON_AddNumberToObject(j, "threads", nt);
            cJSON_AddNumberToObject(j, "gflop", flops / 1e9);
            json_num(j, "ms", t > 0 ? t * 1e3 : -1);
            cJSON_AddNumberToObject(j, "timed_runs", runs);
            json_num(j, "tflops", tf > 0 ? tf / 1e12 : -1);
            json_num(j, "fraction_of_peak", tf > 0 && peak > 0 ? tf / peak : -1);
            json_num(j, "onednn_ms", td > 0 ? td * 1e3 : -1);
            json_num(j, "onednn_tflops", tfd > 0 ? tfd / 1e12 : -1);
            json_num(j, "onednn_fraction_of_peak", tfd > 0 && peak > 0 ? tfd / peak : -1);
            json_num(j, "speedup_vs_onednn", t > 0 && td > 0 ? td / t : -1);
            cJSON_AddStringToObject(j, "onednn_impl", impl);
            if (err) cJSON_AddStringToObject(j, "error", err);
            cJSON_AddItemToArray(ja, j);
        }
    next:
        free(c.dy); free(c.w); free(c.x); free(c.dx); free(c.dw); free(c.y);
    }
    say("  * = one cold run (longer than %.0f s: no warm-up, no repeat)\n", o->cold);
    say("  targets (issue 5): backward 4096^3 >= 60%% of the AMX peak and >= 2.5x oneDNN\n");
}

/* ============================================================================================================ */
/* MoE backward                                                                                                 */
/* ============================================================================================================ */
typedef struct moe_prob {
    int64_t H, T, E, B, K, I; /* K = TopK */
} moe_prob;

typedef struct moe_ctx {
    moe_prob p;
    int64_t N;                    /* blocks */
    int64_t real_rows;            /* T * TopK */
    uint16_t *x, *aff, *w1, *w2, *dy, *ckp_gu, *ckp_ga, *ckp_in, *ckp_si;
    int32_t *tok, *b2e;
    uint16_t *dx, *daff, *dw1, *dw2;
    mxfp8_status st;
} moe_ctx;

/* The routing rule of mxfp8_moe_route (re-done here, from its documentation): each expert gets ceil(count/B)
 * blocks in expert order, its tokens ascending, padded with -1; leftover blocks are padding assigned to E-1. */
static int moe_build(moe_ctx *c) {
    moe_prob p = c->p;
    int64_t TK = p.T * p.K;
    c->N = (TK - (p.E - 1) + p.B - 1) / p.B + p.E - 1;
    c->real_rows = TK;
    int32_t *ids = malloc((size_t)TK * sizeof *ids);
    int64_t *cnt = calloc((size_t)p.E, sizeof *cnt);
    c->tok = xalloc((size_t)(c->N * p.B) * 4);
    c->b2e = xalloc((size_t)c->N * 4);
    c->aff = xalloc((size_t)(p.T * p.E) * 2);
    if (!ids || !cnt || !c->tok || !c->b2e || !c->aff) { free(ids); free(cnt); return -1; }
    memset(c->aff, 0, (size_t)(p.T * p.E) * 2);
    for (int64_t t = 0; t < p.T; t++) {
        for (int64_t k = 0; k < p.K; k++) {
            int32_t e;
            int dup;
            do { /* distinct experts per token */
                e = (int32_t)urand(0, (double)p.E);
                if (e >= p.E) e = (int32_t)p.E - 1;
                dup = 0;
                for (int64_t j = 0; j < k; j++) dup |= ids[t * p.K + j] == e;
            } while (dup);
            ids[t * p.K + k] = e;
            cnt[e]++;
            c->aff[t * p.E + e] = to_bf16((float)urand(0.05, 1.0));
        }
    }
    int64_t blk = 0;
    for (int64_t e = 0; e < p.E; e++) {
        int64_t nb = (cnt[e] + p.B - 1) / p.B, pos = 0;
        if (blk + nb > c->N) { free(ids); free(cnt); return -1; }
        for (int64_t b = 0; b < nb; b++) c->b2e[blk + b] = (int32_t)e;
        for (int64_t i = 0; i < nb * p.B; i++) c->tok[blk * p.B + i] = -1;
        for (int64_t t = 0; t < p.T; t++)
            for (int64_t k = 0; k < p.K; k++)
                if (ids[t * p.K + k] == e) c->tok[blk * p.B + pos++] = (int32_t)t;
        blk += nb;
    }
    for (; blk < c->N; blk++) {
        c->b2e[blk] = (int32_t)(p.E - 1);
        for (int64_t i = 0; i < p.B; i++) c->tok[blk * p.B + i] = -1;
    }
    free(ids);
    free(cnt);
    return 0;
}

static size_t moe_io_bytes(const moe_ctx *c) {
    moe_prob p = c->p;
    size_t n = 0;
    n += 2 * (size_t)(p.T * p.H) * 2;                 /* X, dY */
    n += (size_t)(p.T * p.E) * 2 * 2;                 /* affinities, their grad */
    n += 2 * (size_t)(p.E * p.H * 2 * p.I) * 2;       /* W1, dW1 */
    n += 2 * (size_t)(p.E * p.I * p.H) * 2;           /* W2, dW2 */
    n += (size_t)(c->N * 2 * p.I * p.B) * 2;          /* gate/up checkpoint */
    n += 3 * (size_t)(c->N * p.I * p.B) * 2;          /* gate act, intermediate, scaled intermediate */
    n += (size_t)(c->N * p.B) * 4 + (size_t)c->N * 4; /* routing */
    n += (size_t)(p.T * p.H) * 2;                     /* dX */
    return n;
}

static int moe_alloc(moe_ctx *c) {
    moe_prob p = c->p;
    size_t th = (size_t)(p.T * p.H), w1 = (size_t)(p.E * p.H * 2 * p.I), w2 = (size_t)(p.E * p.I * p.H);
    size_t gu = (size_t)(c->N * 2 * p.I * p.B), ib = (size_t)(c->N * p.I * p.B);
    c->x = xalloc(th * 2); c->dy = xalloc(th * 2); c->dx = xalloc(th * 2);
    c->w1 = xalloc(w1 * 2); c->dw1 = xalloc(w1 * 2); c->w2 = xalloc(w2 * 2); c->dw2 = xalloc(w2 * 2);
    c->ckp_gu = xalloc(gu * 2); c->ckp_ga = xalloc(ib * 2); c->ckp_in = xalloc(ib * 2); c->ckp_si = xalloc(ib * 2);
    c->daff = xalloc((size_t)(p.T * p.E) * 2);
    if (!c->x || !c->dy || !c->dx || !c->w1 || !c->dw1 || !c->w2 || !c->dw2 || !c->ckp_gu || !c->ckp_ga ||
        !c->ckp_in || !c->ckp_si || !c->daff)
        return -1;
    fill_bf16(c->x, th, 0, 1);
    fill_bf16(c->dy, th, -1, 1);
    fill_bf16(c->w1, w1, -0.1, 0.1);
    fill_bf16(c->w2, w2, -0.1, 0.1);
    /* Checkpoints with the forward's relations (gate act = SiLU(g), inter = act * u, scaled = a * inter); speed
     * does not depend on them being the exact forward of X, so they come from random g, u. */
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t i = 0; i < p.I; i++)
            for (int64_t b = 0; b < p.B; b++) {
                float g = (float)urand(-3, 3), u = (float)urand(-3, 3);
                float act = g / (1.0f + expf(-g));
                int32_t t = c->tok[n * p.B + b];
                float a = t >= 0 ? 0.5f : 0.0f;
                c->ckp_gu[((n * 2 + 0) * p.I + i) * p.B + b] = to_bf16(g);
                c->ckp_gu[((n * 2 + 1) * p.I + i) * p.B + b] = to_bf16(u);
                c->ckp_ga[(n * p.I + i) * p.B + b] = to_bf16(act);
                c->ckp_in[(n * p.I + i) * p.B + b] = to_bf16(act * u);
                c->ckp_si[(n * p.I + i) * p.B + b] = to_bf16(a * act * u);
            }
    memset(c->dx, 0, th * 2); memset(c->dw1, 0, w1 * 2); memset(c->dw2, 0, w2 * 2);
    memset(c->daff, 0, (size_t)(p.T * p.E) * 2);
    return 0;
}

static void moe_free(moe_ctx *c) {
    free(c->x); free(c->aff); free(c->w1); free(c->w2); free(c->dy); free(c->ckp_gu); free(c->ckp_ga);
    free(c->ckp_in); free(c->ckp_si); free(c->tok); free(c->b2e); free(c->dx); free(c->daff); free(c->dw1);
    free(c->dw2);
}

static int run_moe(void *pv) {
    moe_ctx *c = pv;
    moe_prob p = c->p;
    mxfp8_moe_bwd_args a;
    memset(&a, 0, sizeof a);
    int64_t s_th[2] = {p.T, p.H}, s_aff[2] = {p.T * p.E, 1}, s_w1[4] = {p.E, p.H, 2, p.I}, s_w2[3] = {p.E, p.I, p.H};
    int64_t s_tok[1] = {c->N * p.B}, s_b2e[2] = {c->N, 1}, s_gu[4] = {c->N, 2, p.I, p.B}, s_ib[3] = {c->N, p.I, p.B};
    a.hidden_states = mxfp8_tensor_make(c->x, MXFP8_DTYPE_BF16, 2, s_th);
    a.expert_affinities_masked = mxfp8_tensor_make(c->aff, MXFP8_DTYPE_BF16, 2, s_aff);
    a.gate_up_proj_weight = mxfp8_tensor_make(c->w1, MXFP8_DTYPE_BF16, 4, s_w1);
    a.down_proj_weight = mxfp8_tensor_make(c->w2, MXFP8_DTYPE_BF16, 3, s_w2);
    a.token_position_to_id = mxfp8_tensor_make(c->tok, MXFP8_DTYPE_I32, 1, s_tok);
    a.block_to_expert = mxfp8_tensor_make(c->b2e, MXFP8_DTYPE_I32, 2, s_b2e);
    a.output_hidden_states_grad = mxfp8_tensor_make(c->dy, MXFP8_DTYPE_BF16, 2, s_th);
    a.block_size = p.B;
    a.gate_up_proj_act_checkpoint_T = mxfp8_tensor_make(c->ckp_gu, MXFP8_DTYPE_BF16, 4, s_gu);
    a.gate_act_checkpoint_T = mxfp8_tensor_make(c->ckp_ga, MXFP8_DTYPE_BF16, 3, s_ib);
    a.intermediate_checkpoint_T = mxfp8_tensor_make(c->ckp_in, MXFP8_DTYPE_BF16, 3, s_ib);
    a.scaled_intermediate_checkpoint_T = mxfp8_tensor_make(c->ckp_si, MXFP8_DTYPE_BF16, 3, s_ib);
    a.config = NULL;
    mxfp8_moe_bwd_grads g;
    memset(&g, 0, sizeof g);
    g.hidden_states_grad = mxfp8_tensor_make(c->dx, MXFP8_DTYPE_BF16, 2, s_th);
    g.expert_affinities_masked_grad = mxfp8_tensor_make(c->daff, MXFP8_DTYPE_BF16, 2, s_aff);
    g.gate_up_proj_weight_grad = mxfp8_tensor_make(c->dw1, MXFP8_DTYPE_BF16, 4, s_w1);
    g.down_proj_weight_grad = mxfp8_tensor_make(c->dw2, MXFP8_DTYPE_BF16, 3, s_w2);
    c->st = mxfp8_moe_backward(&a, &g);
    return c->st == MXFP8_OK ? 0 : -1;
}

/* Resident set now and its high-water mark, from /proc/self/status (kB -> bytes); -1 when unreadable. */
static void rss_now(double *cur, double *hwm) {
    *cur = *hwm = -1;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        long kb;
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) *cur = (double)kb * 1024.0;
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) *hwm = (double)kb * 1024.0;
    }
    fclose(f);
}
/* Reset VmHWM to the current RSS (Linux: write "5" to /proc/self/clear_refs). 0 on success. */
static int reset_hwm(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return -1;
    int ok = fputs("5", f) >= 0;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

#ifdef MXFP8_HAVE_DNNL
typedef struct moe_dnnl_ctx {
    moe_prob p;
    int64_t N;
    const int32_t *b2e;
    uint16_t *xg, *dyg, *dgu, *inter, *w1, *w2, *di, *dxb;
    float *dw1, *dw2;
    dgemm g1, g2, g3, g4;
} moe_dnnl_ctx;

/* Per block n of expert e: P1 dI[B,I] = dY_n[B,H] @ W2[e]^T; P2 dX_n[B,H] = dGU_n[B,2I] @ W1[e]^T;
 * P3 dW1[e][H,2I] += X_n^T @ dGU_n; P4 dW2[e][I,H] += inter_n[I,B] @ dY_n. */
static int run_moe_dnnl(void *pv) {
    moe_dnnl_ctx *c = pv;
    moe_prob p = c->p;
    for (int64_t n = 0; n < c->N; n++) {
        int64_t e = c->b2e[n];
        uint16_t *dyn = c->dyg + n * p.B * p.H, *xn = c->xg + n * p.B * p.H, *dgun = c->dgu + n * p.B * 2 * p.I;
        if (dgemm_run(&c->g1, dyn, c->w2 + e * p.I * p.H, c->di) ||
            dgemm_run(&c->g2, dgun, c->w1 + e * p.H * 2 * p.I, c->dxb) ||
            dgemm_run(&c->g3, xn, dgun, c->dw1 + e * p.H * 2 * p.I) ||
            dgemm_run(&c->g4, c->inter + n * p.I * p.B, dyn, c->dw2 + e * p.I * p.H))
            return -1;
    }
    return dnnl_stream_wait(g_strm) == dnnl_success ? 0 : -1;
}

static double moe_dnnl_time(const bench_opts *o, const moe_ctx *m) {
    moe_dnnl_ctx c;
    memset(&c, 0, sizeof c);
    c.p = m->p;
    c.N = m->N;
    c.b2e = m->b2e;
    moe_prob p = m->p;
    size_t rows = (size_t)(m->N * p.B);
    c.xg = xalloc(rows * (size_t)p.H * 2);
    c.dyg = xalloc(rows * (size_t)p.H * 2);
    c.dgu = xalloc(rows * (size_t)(2 * p.I) * 2);
    c.inter = xalloc(rows * (size_t)p.I * 2);
    c.w1 = xalloc((size_t)(p.E * p.H * 2 * p.I) * 2);
    c.w2 = xalloc((size_t)(p.E * p.I * p.H) * 2);
    c.di = xalloc((size_t)(p.B * p.I) * 2);
    c.dxb = xalloc((size_t)(p.B * p.H) * 2);
    c.dw1 = xalloc((size_t)(p.E * p.H * 2 * p.I) * 4);
    c.dw2 = xalloc((size_t)(p.E * p.I * p.H) * 4);
    double t = -1;
    if (c.xg && c.dyg && c.dgu && c.inter && c.w1 && c.w2 && c.di && c.dxb && c.dw1 && c.dw2) {
        fill_bf16(c.xg, rows * (size_t)p.H, 0, 1);
        fill_bf16(c.dyg, rows * (size_t)p.H, -1, 1);
        fill_bf16(c.dgu, rows * (size_t)(2 * p.I), -1, 1);
        fill_bf16(c.inter, rows * (size_t)p.I, -1, 1);
        fill_bf16(c.w1, (size_t)(p.E * p.H * 2 * p.I), -0.1, 0.1);
        fill_bf16(c.w2, (size_t)(p.E * p.I * p.H), -0.1, 0.1);
        memset(c.dw1, 0, (size_t)(p.E * p.H * 2 * p.I) * 4);
        memset(c.dw2, 0, (size_t)(p.E * p.I * p.H) * 4);
        if (!dgemm_init(&c.g1, p.B, p.I, p.H, 0, 1, 0) && !dgemm_init(&c.g2, p.B, p.H, 2 * p.I, 0, 1, 0) &&
            !dgemm_init(&c.g3, p.H, 2 * p.I, p.B, 1, 0, 1) && !dgemm_init(&c.g4, p.I, p.H, p.B, 0, 0, 1))
            t = time_best(o, run_moe_dnnl, &c, NULL);
    }
    dgemm_free(&c.g1); dgemm_free(&c.g2); dgemm_free(&c.g3); dgemm_free(&c.g4);
    free(c.xg); free(c.dyg); free(c.dgu); free(c.inter); free(c.w1); free(c.w2); free(c.di); free(c.dxb);
    free(c.dw1); free(c.dw2);
    return t;
}
#endif

static void bench_moe(const bench_opts *o, const peaks *pk) {
    static const moe_prob probs[2] = {{1024, 1024, 4, 512, 4, 256}, {2048, 8192, 8, 512, 2, 1024}};
    int nprob = o->quick ? 1 : 2;
    int nt = o->threads;
    set_threads(nt);
    double peak = ref_peak(pk, nt);
    cJSON *ja = cJSON_AddArrayToObject(g_root, "moe");
    double moe_rate = -1; /* FLOP/s (all blocks) of the last run: estimates the next problem */
    say("\nmoe: mxfp8_moe_backward, BF16 tensors, E4M3 (config default), all four checkpoints given, %d thread(s);\n"
        "  FLOPs = GEMM FLOPs of phases 1-4 = 12*rows*H*I; 'real' counts the T*TopK routed rows, 'all' counts N*B "
        "block rows (padding included); %% peak uses 'real'\n", nt);
    say("  %-28s %7s %9s %8s %8s %7s | %10s %8s %8s\n", "(H,T,E,B,TopK,I)", "blocks", "time ms", "TF real",
        "TF all", "% peak", "oneDNN ms", "TF all", "speed-up");
    for (int pi = 0; pi < nprob; pi++) {
        moe_ctx c;
        memset(&c, 0, sizeof c);
        c.p = probs[pi];
        moe_prob p = c.p;
        char name[64];
        snprintf(name, sizeof name, "(%lld,%lld,%lld,%lld,%lld,%lld)", (long long)p.H, (long long)p.T,
                 (long long)p.E, (long long)p.B, (long long)p.K, (long long)p.I);
        if (moe_build(&c) || moe_alloc(&c)) {
            say("  %-28s out of memory\n", name);
            moe_free(&c);
            continue;
        }
        double fl_real = 12.0 * (double)c.real_rows * (double)p.H * (double)p.I;
        double fl_all = 12.0 * (double)(c.N * p.B) * (double)p.H * (double)p.I;
        double io = (double)moe_io_bytes(&c), rss0, hwm0, rss1 = -1, hwm1 = -1;
        rss_now(&rss0, &hwm0);
        int hwm_reset = reset_hwm() == 0;
        double t = -1, td = -1;
        const char *err = NULL;
        int runs = 0;
        char skipmsg[160];
        double est = moe_rate > 0 ? fl_all / moe_rate : -1;
        if (est > o->skip && !o->full) {
            snprintf(skipmsg, sizeof skipmsg, "skipped: about %.0f s per run at the rate measured on the smaller "
                     "problem (--full runs it)", est);
            err = skipmsg;
        } else {
            t = time_best(o, run_moe, &c, &runs);
            if (t < 0) err = lib_error(c.st);
            else moe_rate = fl_all / t;
        }
        rss_now(&rss1, &hwm1);
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        double maxrss = (double)ru.ru_maxrss * 1024.0;
        moe_ctx keep = c; /* routing is reused by the oneDNN baseline */
        free(c.x); free(c.aff); free(c.w1); free(c.w2); free(c.dy); free(c.ckp_gu); free(c.ckp_ga);
        free(c.ckp_in); free(c.ckp_si); free(c.dx); free(c.daff); free(c.dw1); free(c.dw2);
#ifdef MXFP8_HAVE_DNNL
        td = moe_dnnl_time(o, &keep);
#endif
        free(keep.tok);
        free(keep.b2e);
        double tr = t > 0 ? fl_real / t : -1, ta = t > 0 ? fl_all / t : -1, tda = td > 0 ? fl_all / td : -1;
        char blocks[32];
        snprintf(blocks, sizeof blocks, "%lld", (long long)c.N);
        if (t > 0)
            say("  %-28s %7s %8.1f%s %8.3f %8.3f %6.1f%% |", name, blocks, t * 1e3, runs ? " " : "*", tr / 1e12, ta / 1e12,
                peak > 0 ? 100.0 * tr / peak : 0.0);
        else
            say("  %-28s %7s %9s %8s %8s %7s |", name, blocks, "-", "-", "-", "-");
        if (td > 0) say(" %10.1f %8.3f", td * 1e3, tda / 1e12);
        else say(" %10s %8s", "absent", "-");
        if (t > 0 && td > 0) say(" %7.2fx\n", td / t);
        else say(" %8s\n", "-");
        if (err) say("       mxfp8: %s\n", err);
        double peak_mem = hwm_reset && hwm1 > 0 ? hwm1 : maxrss;
        if (t > 0) say("       memory: inputs+outputs %.1f MiB; resident before the call %.1f MiB, peak during the calls %.1f MiB "
            "(%s) = %.1f MiB of workspace; process ru_maxrss %.1f MiB\n",
            io / 1048576.0, rss0 / 1048576.0, peak_mem / 1048576.0,
            hwm_reset ? "VmHWM reset before the call" : "ru_maxrss, includes earlier sections",
            (peak_mem - rss0) / 1048576.0, maxrss / 1048576.0);
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "H", (double)p.H);
        cJSON_AddNumberToObject(j, "T", (double)p.T);
        cJSON_AddNumberToObject(j, "E", (double)p.E);
        cJSON_AddNumberToObject(j, "B", (double)p.B);
        cJSON_AddNumberToObject(j, "TopK", (double)p.K);
        cJSON_AddNumberToObject(j, "I", (double)p.I);
        cJSON_AddNumberToObject(j, "blocks", (double)c.N);
        cJSON_AddNumberToObject(j, "threads", nt);
        cJSON_AddNumberToObject(j, "gflop_real_rows", fl_real / 1e9);
        cJSON_AddNumberToObject(j, "gflop_all_blocks", fl_all / 1e9);
        json_num(j, "ms", t > 0 ? t * 1e3 : -1);
        cJSON_AddNumberToObject(j, "timed_runs", runs);
        json_num(j, "tflops_real_rows", tr > 0 ? tr / 1e12 : -1);
        json_num(j, "tflops_all_blocks", ta > 0 ? ta / 1e12 : -1);
        json_num(j, "fraction_of_peak_real_rows", tr > 0 && peak > 0 ? tr / peak : -1);
        json_num(j, "onednn_ms", td > 0 ? td * 1e3 : -1);
        json_num(j, "onednn_tflops_all_blocks", tda > 0 ? tda / 1e12 : -1);
        json_num(j, "speedup_vs_onednn", t > 0 && td > 0 ? td / t : -1);
        cJSON_AddNumberToObject(j, "io_bytes", io);
        json_num(j, "rss_before_bytes", rss0);
        json_num(j, "peak_rss_bytes", peak_mem);
        cJSON_AddBoolToObject(j, "peak_rss_isolated", hwm_reset);
        cJSON_AddNumberToObject(j, "ru_maxrss_bytes", maxrss);
        if (err) cJSON_AddStringToObject(j, "error", err);
        cJSON_AddItemToArray(ja, j);
    }
    say("  * = one cold run (longer than %.0f s: no warm-up, no repeat)\n", o->cold);
    say("  target (issue 5): larger problem >= 45%% of the AMX peak (GEMM FLOPs)\n");
}

/* ============================================================================================================ */
/* entry                                                                                                        */
/* ============================================================================================================ */
static void usage(FILE *f) {
    fprintf(f,
            "usage: mxfp8 bench [quantize|matmul|moe|peak|all] [--threads N] [--json] [--quick] [--reps N] [--full]\n"
            "  Measures libmxfp8 against this machine's limits, in one run: register-resident peak loops (AMX\n"
            "  TDPBF16PS when the CPU and OS allow it, else AVX512-BF16 / FP32 FMA), memcpy bandwidth, and oneDNN's\n"
            "  bf16 matmul on the same GEMMs (when built with oneDNN). Every figure is the best of N runs after a\n"
            "  warm-up. Sections (default all): quantize (BF16 4096x4096 -> MXFP8 along rows and columns, 1 and N\n"
            "  threads, vs memcpy), matmul (backward and forward, 4096^3 and the upstream shapes), moe (backward at\n"
            "  the upstream and a larger problem, with peak resident memory). The peaks are always measured.\n"
            "  --threads N  threads for matmul/moe and the second quantize column (default: the library's count)\n"
            "  --json       print one JSON document instead of tables\n"
            "  --quick      skip the largest problems (4096^3, the larger MoE), 2 repetitions\n"
            "  --reps N     best of N timed runs (default 5; fewer when a run is slow; a run over 8 s is timed once)\n"
            "  --full       also run items estimated (from a smaller one in this run) to take over 40 s per run\n"
            "  mpirun -np P mxfp8 bench moe --expert-parallel: the MoE layer split over MPI ranks (see its --help)\n");
}

int cmd_bench_moe_ep(int argc, char **argv); /* tools/bench_moe_ep.c: `mxfp8 bench moe --expert-parallel` */

int cmd_bench(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--expert-parallel")) return cmd_bench_moe_ep(argc, argv);
    bench_opts o = {0, 0, 0, 0, 5, 4.0, 8.0, 40.0, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "quantize")) o.sections |= SEC_QUANT;
        else if (!strcmp(a, "matmul")) o.sections |= SEC_MATMUL;
        else if (!strcmp(a, "moe")) o.sections |= SEC_MOE;
        else if (!strcmp(a, "peak")) o.sections |= SEC_PEAK;
        else if (!strcmp(a, "all")) o.sections |= SEC_ALL;
        else if (!strcmp(a, "--json")) o.json = 1;
        else if (!strcmp(a, "--quick")) o.quick = 1;
        else if (!strcmp(a, "--full")) o.full = 1;
        else if ((!strcmp(a, "--threads") || !strcmp(a, "--reps")) && i + 1 < argc) {
            char *end;
            errno = 0;
            long v = strtol(argv[++i], &end, 10);
            if (errno || *end || v < 1 || v > 4096) {
                fprintf(stderr, "mxfp8 bench: %s needs a positive integer, got '%s'\n", a, argv[i]);
                return 2;
            }
            if (!strcmp(a, "--threads")) o.threads = (int)v;
            else o.reps = (int)v;
        } else {
            fprintf(stderr, "mxfp8 bench: unknown argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!o.sections) o.sections = SEC_ALL;
    if (o.quick && o.reps > 2) o.reps = 2;
    g_text = !o.json;

    mxfp8_info info;
    if (mxfp8_get_info(&info) != MXFP8_OK) { fprintf(stderr, "mxfp8 bench: mxfp8_get_info failed\n"); return 1; }
    if (o.threads == 0) o.threads = info.num_threads;
    if (set_threads(o.threads) != 0) { fprintf(stderr, "mxfp8 bench: cannot set %d threads\n", o.threads); return 1; }
    cpu_caps cc = detect_caps();

    g_root = cJSON_CreateObject();
    cJSON_AddStringToObject(g_root, "library_version", mxfp8_version_string());
    cJSON_AddStringToObject(g_root, "isa", info.isa_name);
    cJSON_AddStringToObject(g_root, "isa_reason", info.isa_reason);
    cJSON_AddNumberToObject(g_root, "threads", o.threads);
    cJSON_AddNumberToObject(g_root, "reps", o.reps);
    cJSON_AddBoolToObject(g_root, "quick", o.quick);
    say("mxfp8 bench -- libmxfp8 %s, ISA path %s (%s), %d thread(s), best of up to %d runs after a warm-up\n",
        mxfp8_version_string(), info.isa_name, info.isa_reason, o.threads, o.reps);
    say("CPU: AVX-512F %s, AVX512-BF16 %s, AMX-TILE %s, AMX-BF16 %s, AMX permitted by the OS %s\n",
        cc.avx512f ? "yes" : "no", cc.avx512bf16 ? "yes" : "no", cc.amx_tile ? "yes" : "no",
        cc.amx_bf16 ? "yes" : "no", cc.amx_permitted ? "yes" : "no");
    describe_onednn();

    peaks pk;
    bench_peaks(&o, &cc, &pk);
    if (o.sections & SEC_QUANT) bench_quantize(&o);
    if (o.sections & SEC_MATMUL) bench_matmul(&o, &pk);
    if (o.sections & SEC_MOE) bench_moe(&o, &pk);

    if (o.json) {
        char *s = cJSON_Print(g_root);
        if (s) { puts(s); free(s); }
    }
    cJSON_Delete(g_root);
    g_root = NULL;
#ifdef MXFP8_HAVE_DNNL
    if (g_dnnl_ok == 1) { dnnl_stream_destroy(g_strm); dnnl_engine_destroy(g_eng); g_dnnl_ok = -1; }
#endif
    return 0;
}
