/*
 * peaks.c -- the compute ceilings of this machine, measured by register-resident loops (no loads or stores inside
 * the loop): AMX TDPBF16PS (2x2 tiles), AVX512-BF16 VDPBF16PS and AVX-512 FP32 FMA, each on 1 and N threads.
 *
 * A loop runs only when mxfp8_get_info() reports its features (CPUID, and for AVX-512 XCR0 enabling the ZMM state);
 * the AMX loop also needs amx_permitted: the library's arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) succeeded
 * for this process, which the kernel grants only when the OS enables the tile state. So no loop can raise SIGILL.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "bench.h"

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
 * One TDPBF16PS = 16 x 16 x 32 multiply-adds = 16384 FLOP; 4 per iteration. */
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
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
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

static const char *const k_peak_name[PEAK_KINDS] = {"AMX TDPBF16PS", "AVX512-BF16 VDPBF16PS", "AVX-512 FP32 FMA"};
static const char *const k_peak_key[PEAK_KINDS] = {"amx_bf16", "avx512_bf16", "avx512_fp32_fma"};

static void run_loop(peak_kind k, int64_t n) {
#if defined(__x86_64__)
    if (k == PEAK_AMX) loop_tdpbf16ps(n);
    else if (k == PEAK_BF16) loop_vdpbf16ps(n);
    else loop_fma(n);
#else
    (void)k;
    (void)n;
#endif
}

static double flop_per_iter(peak_kind k) {
#if defined(__x86_64__)
    return k == PEAK_AMX ? PEAK_AMX_FLOP_PER_ITER : k == PEAK_BF16 ? PEAK_BF16_FLOP_PER_ITER : PEAK_FMA_FLOP_PER_ITER;
#else
    (void)k;
    return 0;
#endif
}

/* FLOP/s of `nt` threads each running the loop; best of 5 runs of ~0.1 s (a ceiling: the fastest run is the one
 * least disturbed). */
static double measure(peak_kind k, int nt) {
    int64_t n = 1 << 14;
    for (;;) { /* calibrate on one thread to ~0.1 s */
        double t = cli_now();
        run_loop(k, n);
        t = cli_now() - t;
        if (t > 0.02 || n > ((int64_t)1 << 40)) {
            n = (int64_t)((double)n * 0.1 / (t > 1e-9 ? t : 1e-9)) + 1;
            break;
        }
        n *= 4;
    }
    double best = 1e300;
    for (int r = 0; r < 5; r++) {
        double t0 = cli_now();
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
#endif
        run_loop(k, n);
        double t = cli_now() - t0;
        if (t < best) best = t;
    }
    return (double)nt * (double)n * flop_per_iter(k) / best;
}

double bench_ref_peak(const bench_ctx *b, int nt) {
    const bench_peaks *p = &b->peaks;
    if (p->ref < 0) return -1;
    if (nt == 1) return p->v[p->ref][0];
    double ideal = (double)nt * p->v[p->ref][0];
    return p->v[p->ref][1] > ideal ? p->v[p->ref][1] : ideal;
}

/* Why the AMX loop does not run ("" when it does). */
static const char *amx_absent(const mxfp8_info *in) {
    if (!in->has_amx_tile || !in->has_amx_bf16) return "not available on this CPU (no AMX-TILE/AMX-BF16)";
    if (!in->amx_permitted) return "not permitted by the OS (tile state not enabled for this process)";
    return "";
}

/* The 1-minute load average, -1 when unknown. */
static double load_average(void) {
    double load[3] = {-1, -1, -1};
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fscanf(la, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
        fclose(la);
    }
    return load[0];
}

void bench_peaks_run(bench_ctx *b) {
    const mxfp8_info *in = &b->info;
    bench_peaks *p = &b->peaks;
    int nt = b->o.threads;
    int avail[PEAK_KINDS] = {!*amx_absent(in), in->has_avx512_bf16, in->has_avx512f};
    const char *why[PEAK_KINDS] = {amx_absent(in), "not available on this CPU (no AVX512-BF16)",
                                   "not available on this CPU (no AVX-512F)"};
    p->ref = -1;
    bench_say(b, "\npeaks (register-resident loops, best of 5, this run)\n");
    cJSON *jp = cJSON_AddObjectToObject(b->root, "peaks");
    cJSON_AddStringToObject(jp, "amx", avail[PEAK_AMX] ? "available" : why[PEAK_AMX]);
    for (int k = 0; k < PEAK_KINDS; k++) {
        p->v[k][0] = p->v[k][1] = -1;
        cJSON *jk = cJSON_AddObjectToObject(jp, k_peak_key[k]);
        if (!avail[k]) {
            bench_say(b, "  %-24s %s\n", k_peak_name[k], why[k]);
            cJSON_AddNullToObject(jk, "tflops_1thread");
            cJSON_AddNullToObject(jk, "tflops_threads");
            continue;
        }
        p->v[k][0] = measure((peak_kind)k, 1);
        p->v[k][1] = nt > 1 ? measure((peak_kind)k, nt) : p->v[k][0];
        if (p->ref < 0) p->ref = k;
        if (nt > 1)
            bench_say(b, "  %-24s %8.3f TFLOP/s on 1 thread   %8.3f TFLOP/s on %d threads\n", k_peak_name[k],
                      p->v[k][0] / 1e12, p->v[k][1] / 1e12, nt);
        else
            bench_say(b, "  %-24s %8.3f TFLOP/s on 1 thread\n", k_peak_name[k], p->v[k][0] / 1e12);
        cJSON_AddNumberToObject(jk, "tflops_1thread", p->v[k][0] / 1e12);
        cJSON_AddNumberToObject(jk, "tflops_threads", p->v[k][1] / 1e12);
    }
    double load1 = load_average();
    bench_json_num(jp, "loadavg_1min", load1);
    if (p->ref >= 0 && nt > 1) {
        double scale = p->v[p->ref][1] / p->v[p->ref][0];
        cJSON_AddNumberToObject(jp, "thread_scaling", scale);
        if (scale < 0.8 * nt) {
            bench_say(b, "  WARNING: the %d-thread peak is only %.2fx the 1-thread peak (load average %.2f): the CPU "
                      "is shared with other work right now, so every figure below is noisy\n", nt, scale, load1);
            cJSON_AddBoolToObject(jp, "cpu_contended", 1);
        }
    }
    if (p->ref >= 0) {
        bench_say(b, "  \"%% of peak\" below = fraction of the %s peak on the same thread count (%.3f TFLOP/s on %d; "
                  "the larger of the measured figure and %d x the 1-thread one)\n", k_peak_name[p->ref],
                  bench_ref_peak(b, nt) / 1e12, nt, nt);
        bench_json_num(jp, "reference_tflops_threads", bench_ref_peak(b, nt) / 1e12);
        cJSON_AddStringToObject(jp, "reference", k_peak_key[p->ref]);
    } else {
        bench_say(b, "  no SIMD peak loop can run on this CPU: no \"%% of peak\" below\n");
        cJSON_AddNullToObject(jp, "reference");
    }
}
