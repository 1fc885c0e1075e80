/* cpu.c -- CPU feature detection and AMX permission (as BLIS's bli_cpuid.c: detection only, decided once). */
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

static mxfp8i_cpu g_cpu;
static once_flag g_once = ONCE_FLAG_INIT;

static void detect(void) {
    mxfp8i_cpu *c = &g_cpu;
    memset(c, 0, sizeof *c);
#if defined(__x86_64__)
    unsigned a, b, cc, d;
    if (!__get_cpuid(1, &a, &b, &cc, &d) || !(cc & (1u << 27))) return; /* no OSXSAVE: no AVX-512 state */
    int os_avx512 = (xgetbv0() & 0xE6) == 0xE6; /* XMM, YMM, opmask, ZMM_Hi256, Hi16_ZMM state enabled */
    if (!__get_cpuid_count(7, 0, &a, &b, &cc, &d)) return;
    c->avx512f = os_avx512 && (b >> 16 & 1);
    c->avx512bw = os_avx512 && (b >> 30 & 1);
    c->avx512vl = os_avx512 && (b >> 31 & 1);
    c->amx_bf16 = (d >> 22) & 1;
    c->amx_tile = (d >> 24) & 1;
    unsigned a1, b1, c1, d1;
    if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) c->avx512_bf16 = os_avx512 && (a1 >> 5 & 1);
    if (c->amx_tile && c->amx_bf16) {
        /* Linux: ask for permission to use the AMX tile data state (XFEATURE_XTILEDATA = 18). */
        long rc = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18);
        c->amx_permitted = rc == 0;
    }
#endif
}

const mxfp8i_cpu *mxfp8i_cpu_features(void) {
    call_once(&g_once, detect);
    return &g_cpu;
}
