/* cpu.c -- CPU feature detection and AMX permission (as BLIS's bli_cpuid.c: detection only, decided once), kept as
 * a list of named features (cpu.h). */
#include <string.h>
#include <threads.h>

#include "cpu.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

static unsigned long long xgetbv0(void) {
    unsigned eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}
#endif

static const char *const g_names[MXFP8I_CPU_NUM_FEATURES] = {
    [MXFP8I_CPU_AVX512F] = "avx512f",         [MXFP8I_CPU_AVX512BW] = "avx512bw",
    [MXFP8I_CPU_AVX512VL] = "avx512vl",       [MXFP8I_CPU_AVX512_BF16] = "avx512_bf16",
    [MXFP8I_CPU_AMX_TILE] = "amx_tile",       [MXFP8I_CPU_AMX_BF16] = "amx_bf16",
    [MXFP8I_CPU_AMX_PERMITTED] = "amx_permitted",
};
static int g_has[MXFP8I_CPU_NUM_FEATURES];
static once_flag g_once = ONCE_FLAG_INIT;

static void detect(void) {
    int *c = g_has;
    memset(g_has, 0, sizeof g_has);
#if defined(__x86_64__)
    unsigned a, b, cc, d;
    if (!__get_cpuid(1, &a, &b, &cc, &d) || !(cc & (1u << 27))) return; /* no OSXSAVE: no AVX-512 state */
    int os_avx512 = (xgetbv0() & 0xE6) == 0xE6; /* XMM, YMM, opmask, ZMM_Hi256, Hi16_ZMM state enabled */
    if (!__get_cpuid_count(7, 0, &a, &b, &cc, &d)) return;
    c[MXFP8I_CPU_AVX512F] = os_avx512 && (b >> 16 & 1);
    c[MXFP8I_CPU_AVX512BW] = os_avx512 && (b >> 30 & 1);
    c[MXFP8I_CPU_AVX512VL] = os_avx512 && (b >> 31 & 1);
    c[MXFP8I_CPU_AMX_BF16] = (d >> 22) & 1;
    c[MXFP8I_CPU_AMX_TILE] = (d >> 24) & 1;
    unsigned a1, b1, c1, d1;
    if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) c[MXFP8I_CPU_AVX512_BF16] = os_avx512 && (a1 >> 5 & 1);
    if (c[MXFP8I_CPU_AMX_TILE] && c[MXFP8I_CPU_AMX_BF16]) {
        /* Linux: ask for permission to use the AMX tile data state (XFEATURE_XTILEDATA = 18). */
        long rc = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18);
        c[MXFP8I_CPU_AMX_PERMITTED] = rc == 0;
    }
#endif
}

const char *mxfp8i_cpu_feature_name(int f) { return f >= 0 && f < MXFP8I_CPU_NUM_FEATURES ? g_names[f] : NULL; }

int mxfp8i_cpu_feature_value(int f) {
    call_once(&g_once, detect);
    return f >= 0 && f < MXFP8I_CPU_NUM_FEATURES ? g_has[f] : 0;
}

unsigned mxfp8i_cpu_bits(void) {
    call_once(&g_once, detect);
    unsigned bits = 0;
    for (int f = 0; f < MXFP8I_CPU_NUM_FEATURES; f++)
        if (g_has[f]) bits |= MXFP8I_CPU_BIT(f);
    return bits;
}
