/* cpu.c -- CPU feature detection, AMX permission, ISA choice and thread count. Decided once per process. */
#include <stdlib.h>
#include <string.h>

#include "../internal.h"
#include "../kernels/amx/amx.h" /* [perf hook] mxfp8i_amx_self_test */

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

static struct {
    mxfp8_info info;
} g_rt;
static int g_rt_ready; /* guarded by pthread_once-like C11 call_once below */

#include <threads.h>
static once_flag g_once = ONCE_FLAG_INIT;

#if defined(__x86_64__)
static unsigned long long xgetbv0(void) {
    unsigned eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}
#endif

static void detect(void) {
    mxfp8_info *in = &g_rt.info;
    memset(in, 0, sizeof *in);
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 27))) { /* OSXSAVE */
        unsigned long long xcr0 = xgetbv0();
        int os_avx512 = (xcr0 & 0xE6) == 0xE6;
        if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
            in->has_avx512f = os_avx512 && (b >> 16 & 1);
            in->has_avx512bw = os_avx512 && (b >> 30 & 1);
            in->has_avx512vl = os_avx512 && (b >> 31 & 1);
            in->has_amx_bf16 = (d >> 22) & 1;
            in->has_amx_tile = (d >> 24) & 1;
            unsigned a1, b1, c1, d1;
            if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) in->has_avx512_bf16 = os_avx512 && (a1 >> 5 & 1);
        }
        if (in->has_amx_tile && in->has_amx_bf16) {
            /* Linux: ask for permission to use the AMX tile data state (XFEATURE_XTILEDATA = 18). */
            long rc = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18);
            in->amx_permitted = rc == 0;
        }
    }
#endif
    int best = MXFP8_ISA_SCALAR;
    const char *reason = "cpu lacks AVX-512F/BW";
    if (in->has_avx512f && in->has_avx512bw) {
        best = MXFP8_ISA_AVX512;
        reason = in->has_amx_tile ? "AMX not permitted by the OS" : "cpu lacks AMX-BF16";
        if (in->has_amx_tile && in->has_amx_bf16 && in->amx_permitted) {
            /* [perf hook] AMX only after the AMX GEMM kernel reproduced the reference on this CPU
             * (src/kernels/amx/amx.h: one-time self-test); otherwise AVX-512, and the reason says why. */
            const char *amx_fail = mxfp8i_amx_self_test();
            best = amx_fail ? MXFP8_ISA_AVX512 : MXFP8_ISA_AMX;
            reason = amx_fail ? amx_fail : "best available";
        }
    }
    int isa = best;
    const char *env = getenv("MXFP8_ISA");
    if (env && *env) {
        int want = -1;
        if (!strcmp(env, "scalar")) want = MXFP8_ISA_SCALAR;
        else if (!strcmp(env, "avx512")) want = MXFP8_ISA_AVX512;
        else if (!strcmp(env, "amx")) want = MXFP8_ISA_AMX;
        if (want < 0) reason = "MXFP8_ISA not recognized (use scalar|avx512|amx); using the best available";
        else if (want <= best) { isa = want; reason = "forced by MXFP8_ISA"; }
        else reason = "MXFP8_ISA asks for an ISA this cpu lacks; using the best available";
    }
    static const char *names[] = {"scalar", "avx512", "amx"};
    in->isa = (mxfp8_isa)isa;
    in->isa_name = names[isa];
    in->isa_reason = reason;

    /* MXFP8_NUM_THREADS must be a whole positive decimal integer; anything else (abc, -2, 0, 4x) is ignored, as
       if unset (mxfp8 info says so). OMP_NUM_THREADS is read as OpenMP does (its first number). Both are clamped
       to MXFP8_MAX_THREADS. */
    int nt = mxfp8i_parse_num_threads(getenv("MXFP8_NUM_THREADS"));
    if (nt <= 0) {
        const char *e = getenv("OMP_NUM_THREADS");
        if (e && *e) nt = atoi(e);
    }
#ifdef _OPENMP
    if (nt <= 0) nt = omp_get_max_threads();
#endif
    if (nt <= 0) nt = 1;
    if (nt > MXFP8_MAX_THREADS) nt = MXFP8_MAX_THREADS;
    in->num_threads = nt;
    g_rt_ready = 1;
}

int mxfp8i_parse_num_threads(const char *s) {
    if (!s || !*s) return 0;
    long long v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        if (v <= MXFP8_MAX_THREADS) v = v * 10 + (*p - '0');
    }
    if (v < 1) return -1;
    return v > MXFP8_MAX_THREADS ? MXFP8_MAX_THREADS : (int)v;
}

static const mxfp8_info *rt(void) {
    call_once(&g_once, detect);
    return &g_rt.info;
}

mxfp8_status mxfp8_get_info(mxfp8_info *info) {
    mxfp8i_clear_error();
    if (!info) return mxfp8i_error(MXFP8_ERR_NULL_POINTER, "mxfp8_get_info: info is NULL");
    *info = *rt();
    info->num_threads = mxfp8i_num_threads();
    return MXFP8_OK;
}

mxfp8_isa mxfp8i_isa(void) { return rt()->isa; }
bool mxfp8i_use_avx512(void) { return rt()->isa >= MXFP8_ISA_AVX512; }
bool mxfp8i_use_avx512_bf16(void) { return rt()->isa >= MXFP8_ISA_AVX512 && rt()->has_avx512_bf16; }
#include <stdatomic.h>
static atomic_int g_threads_override;

mxfp8_status mxfp8_set_num_threads(int num_threads) {
    mxfp8i_clear_error();
    if (num_threads < 0)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "mxfp8_set_num_threads: num_threads %d is negative",
                            num_threads);
    atomic_store(&g_threads_override, num_threads > MXFP8_MAX_THREADS ? MXFP8_MAX_THREADS : num_threads);
    return MXFP8_OK;
}

int mxfp8i_num_threads(void) {
    int o = atomic_load(&g_threads_override);
    return o > 0 ? o : rt()->num_threads;
}
