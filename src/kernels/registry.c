/*
 * registry.c -- the kernel table (registry.h): reference defaults, then overrides for this CPU after each
 * kernel's self-test; MXFP8_ISA; mxfp8_get_info().
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>

#include "../runtime/cpu.h"
#include "../runtime/error.h"
#include "../runtime/threads.h"
#include "amx/amx.h"
#include "avx512/avx512.h"
#include "check.h"
#include "ref/ref.h"
#include "registry.h"

static const mxfp8i_ukernel *const g_ukernels[] = {
    &mxfp8i_bf16_gemm_32x32__amx_ukernel,
    &mxfp8i_bf16_gemm_32x32__avx512bf16_oddfirst_ukernel,
    &mxfp8i_bf16_gemm_32x32__avx512bf16_evenfirst_ukernel,
    &mxfp8i_f32_gemm_8x32__avx512f_ukernel,
    &mxfp8i_f32_gemm_8x32__ref_ukernel,
    NULL, /* the test-only kernels (emulations, negative controls) live in the test build: tests/c/kernel_list.h */
};
static const mxfp8i_qkernel *const g_qkernels[] = {&mxfp8i_mx_quant__avx512, &mxfp8i_mx_quant__ref, NULL};

const mxfp8i_ukernel *const *mxfp8i_ukernel_list(void) { return g_ukernels; }
const mxfp8i_qkernel *const *mxfp8i_qkernel_list(void) { return g_qkernels; }

int mxfp8i_cpu_has(unsigned needs) { return (mxfp8i_cpu_bits() & needs) == needs; }

/* "a/b/c": the names of the features of `needs` that this CPU lacks. */
static void missing_features(unsigned needs, char *buf, size_t len) {
    size_t n = 0;
    buf[0] = 0;
    unsigned lack = needs & ~mxfp8i_cpu_bits();
    for (int f = 0; f < MXFP8I_CPU_NUM_FEATURES && n < len; f++)
        if (lack & MXFP8I_CPU_BIT(f)) n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? "/" : "", mxfp8i_cpu_feature_name(f));
}

static mxfp8i_kernels g_k;
static char g_gemm_note[320], g_isa_reason[200], g_quant_note[160];
static once_flag g_once = ONCE_FLAG_INIT;

/* Append a sentence to the GEMM slot's note ("; "-separated). */
static void note(const char *fmt, const char *a, const char *b) {
    size_t n = strlen(g_gemm_note);
    if (n) n += (size_t)snprintf(g_gemm_note + n, sizeof g_gemm_note - n, "; ");
    if (n < sizeof g_gemm_note) snprintf(g_gemm_note + n, sizeof g_gemm_note - n, fmt, a, b);
}

/* The level MXFP8_ISA asks for (-1: unset, -2: not recognized). */
static int env_isa(void) {
    const char *env = getenv("MXFP8_ISA");
    if (!env || !*env) return -1;
    if (!strcmp(env, "scalar")) return 0;
    if (!strcmp(env, "avx512")) return 1;
    if (!strcmp(env, "amx")) return 2;
    return -2;
}

/* The lock of the self-test results kept in the descriptors (a test may ask for a kernel the table did not test). */
static mtx_t g_test_mtx;
static once_flag g_test_once = ONCE_FLAG_INIT;
static void init_test_mtx(void) { mtx_init(&g_test_mtx, mtx_plain); }

/* The start-up self-test of a candidate, run at most once per descriptor (its result is kept in uk->selftest):
 * 0 passed, else the failing case in why. */
static int self_test(const mxfp8i_ukernel *uk, char *why, size_t whylen) {
    mxfp8i_selftest *t = uk->selftest;
    if (!t) { /* a descriptor without storage is tested every time */
        int n = 0, fails = mxfp8i_check_ukernel(uk, 1, &n, why, whylen);
        if (fails < 0) snprintf(why, whylen, "the self-test could not allocate its workspace");
        return fails;
    }
    call_once(&g_test_once, init_test_mtx);
    mtx_lock(&g_test_mtx);
    if (!t->done) {
        int n = 0;
        t->fails = mxfp8i_check_ukernel(uk, 1, &n, t->why, sizeof t->why);
        if (t->fails < 0) snprintf(t->why, sizeof t->why, "the self-test could not allocate its workspace");
        t->done = 1;
    }
    int fails = t->fails;
    snprintf(why, whylen, "%s", t->why);
    mtx_unlock(&g_test_mtx);
    return fails;
}

int mxfp8i_ukernel_usable(const mxfp8i_ukernel *uk) {
    mxfp8i_kernels_get(); /* the table first: its self-tests run under its once-flag, this reads their results */
    if (uk->test_only || !mxfp8i_cpu_has(uk->needs)) return 0;
    if (uk->reference) return 1;
    char why[256];
    return self_test(uk, why, sizeof why) == 0;
}

/* The GEMM slot: the first runtime candidate within `level` that the CPU supports and that passes its self-test;
 * the note says which better kernels this CPU has that are not in use, and why. */
static void fill_gemm(int level) {
    int capped = 0;
    for (const mxfp8i_ukernel *const *p = g_ukernels; *p; p++) {
        const mxfp8i_ukernel *uk = *p;
        if (uk->test_only || !mxfp8i_cpu_has(uk->needs)) continue;
        if (uk->reference) {
            g_k.gemm = uk; /* the default; it is the specification, so it has no self-test */
            return;
        }
        if (uk->isa_level > level) {
            if (!capped) note("%s%s not used: MXFP8_ISA caps the level", uk->name, " (and the other kernels above it)");
            capped = 1;
            continue;
        }
        char why[256];
        if (self_test(uk, why, sizeof why) == 0) {
            g_k.gemm = uk;
            g_k.gemm_self_test = 1;
            return;
        }
        note("%s failed its self-test: %s", uk->name, why);
    }
}

static const char *const g_level_names[] = {"scalar", "avx512", "amx"};

/* The level MXFP8_ISA would pick by default: the highest level of a runtime kernel this CPU supports, where a GEMM
 * kernel above every quantization kernel's level counts only once it passed its self-test (so a level is never
 * chosen for a GEMM kernel that cannot run). `why` says what keeps the next level out of reach. */
static int best_level(char *why, size_t len) {
    int best = 0, top = 0;
    for (const mxfp8i_qkernel *const *p = g_qkernels; *p; p++) {
        if ((*p)->isa_level > top) top = (*p)->isa_level;
        if (mxfp8i_cpu_has((*p)->needs) && (*p)->isa_level > best) best = (*p)->isa_level;
    }
    for (const mxfp8i_ukernel *const *p = g_ukernels; *p; p++) {
        const mxfp8i_ukernel *uk = *p;
        if (uk->test_only) continue;
        if (uk->isa_level > top) top = uk->isa_level;
        if (uk->reference || uk->isa_level <= best || !mxfp8i_cpu_has(uk->needs)) continue;
        char tmp[256];
        if (self_test(uk, tmp, sizeof tmp) == 0) best = uk->isa_level;
    }
    why[0] = 0;
    if (best == top) {
        snprintf(why, len, "best available");
        return best;
    }
    /* What keeps the next level up out of reach: a kernel of that level that this CPU has failed its self-test;
       else the features lacking, for that level's kernel that lacks the fewest. */
    int next = top;
    for (const mxfp8i_ukernel *const *p = g_ukernels; *p; p++)
        if (!(*p)->test_only && (*p)->isa_level > best && (*p)->isa_level < next) next = (*p)->isa_level;
    for (const mxfp8i_qkernel *const *p = g_qkernels; *p; p++)
        if ((*p)->isa_level > best && (*p)->isa_level < next) next = (*p)->isa_level;
    int fewest = MXFP8I_CPU_NUM_FEATURES + 1;
    for (const mxfp8i_ukernel *const *p = g_ukernels; *p; p++) {
        const mxfp8i_ukernel *uk = *p;
        if (uk->test_only || uk->isa_level != next) continue;
        if (mxfp8i_cpu_has(uk->needs)) {
            snprintf(why, len, "%s failed its self-test; using %s (see the gemm kernel's note)", uk->name,
                     g_level_names[best]);
            return best;
        }
        int k = __builtin_popcount(uk->needs & ~mxfp8i_cpu_bits());
        if (k < fewest) {
            char miss[160];
            missing_features(uk->needs, miss, sizeof miss);
            snprintf(why, len, "cpu or OS lacks %s", miss);
            fewest = k;
        }
    }
    for (const mxfp8i_qkernel *const *p = g_qkernels; *p; p++) {
        int k = __builtin_popcount((*p)->needs & ~mxfp8i_cpu_bits());
        if ((*p)->isa_level == next && k < fewest) {
            char miss[160];
            missing_features((*p)->needs, miss, sizeof miss);
            snprintf(why, len, "cpu or OS lacks %s", miss);
            fewest = k;
        }
    }
    return best;
}

static void fill(void) {
    char why[200];
    int best = best_level(why, sizeof why);
    const char *reason = why;
    int isa = best, want = env_isa();
    if (want == -2) reason = "MXFP8_ISA not recognized (use scalar|avx512|amx); using the best available";
    else if (want >= 0 && want <= best) { isa = want; reason = "forced by MXFP8_ISA"; }
    else if (want > best) reason = "MXFP8_ISA asks for an ISA this cpu lacks; using the best available";
    snprintf(g_isa_reason, sizeof g_isa_reason, "%s", reason);
    g_k.isa = isa;
    g_k.isa_reason = g_isa_reason;

    fill_gemm(isa);
    g_k.gemm_note = g_gemm_note;
    /* The quantization kernels have no start-up self-test: they are exact by construction (integer arithmetic and
       the reference's own IEEE multiplies) and the tests compare them with the reference on every CPU that has
       them. The last one of the list is the reference, which every CPU has. */
    g_k.quant = NULL;
    g_k.quant_note = g_quant_note;
    for (const mxfp8i_qkernel *const *p = g_qkernels; *p && !g_k.quant; p++) {
        if (!mxfp8i_cpu_has((*p)->needs)) continue;
        if ((*p)->isa_level <= isa) g_k.quant = *p;
        else if (!g_quant_note[0])
            snprintf(g_quant_note, sizeof g_quant_note, "%s not used: MXFP8_ISA caps the level", (*p)->name);
    }
}

const mxfp8i_kernels *mxfp8i_kernels_get(void) {
    call_once(&g_once, fill);
    return &g_k;
}

static const mxfp8i_ukernel *_Atomic g_forced;
void mxfp8i_force_ukernel(const mxfp8i_ukernel *uk) { g_forced = uk; }
const mxfp8i_ukernel *mxfp8i_gemm_ukernel(void) {
    const mxfp8i_ukernel *f = g_forced;
    return f ? f : mxfp8i_kernels_get()->gemm;
}

const mxfp8i_ukernel *mxfp8i_f32_ukernel(void) {
    const mxfp8i_ukernel *f = g_forced;
    if (f && f->panel == MXFP8I_PANEL_F32 && f->fn) return f;
    const int isa = mxfp8i_kernels_get()->isa;
    for (const mxfp8i_ukernel *const *p = g_ukernels; *p; p++) {
        const mxfp8i_ukernel *uk = *p;
        if (uk->panel != MXFP8I_PANEL_F32 || !uk->fn || uk->isa_level > isa) continue;
        if (uk->reference || mxfp8i_ukernel_usable(uk)) return uk;
    }
    return &mxfp8i_f32_gemm_8x32__ref_ukernel;
}

mxfp8_status mxfp8_get_info(mxfp8_info *info) {
    mxfp8i_clear_error();
    MXFP8I_RETURN_ERROR_IF(!info, MXFP8_ERR_NULL_POINTER, "mxfp8_get_info: info is NULL");
    const mxfp8i_kernels *k = mxfp8i_kernels_get();
    memset(info, 0, sizeof *info);
    info->has_avx512f = mxfp8i_cpu_feature_value(MXFP8I_CPU_AVX512F);
    info->has_avx512bw = mxfp8i_cpu_feature_value(MXFP8I_CPU_AVX512BW);
    info->has_avx512vl = mxfp8i_cpu_feature_value(MXFP8I_CPU_AVX512VL);
    info->has_avx512_bf16 = mxfp8i_cpu_feature_value(MXFP8I_CPU_AVX512_BF16);
    info->has_amx_tile = mxfp8i_cpu_feature_value(MXFP8I_CPU_AMX_TILE);
    info->has_amx_bf16 = mxfp8i_cpu_feature_value(MXFP8I_CPU_AMX_BF16);
    info->amx_permitted = mxfp8i_cpu_feature_value(MXFP8I_CPU_AMX_PERMITTED);
    info->isa = (mxfp8_isa)k->isa;
    info->isa_name = g_level_names[k->isa];
    info->isa_reason = k->isa_reason;
    info->num_threads = mxfp8i_num_threads();
    const mxfp8_kernel_info slots[MXFP8_NUM_KERNEL_SLOTS] = {
        {"gemm", k->gemm->name, k->gemm->isa_name, k->gemm_self_test, k->gemm_note},
        {"quantize", k->quant->name, k->quant->isa_name, k->quant_self_test, k->quant_note},
        {"dequantize", k->quant->name, k->quant->isa_name, k->quant_self_test, k->quant_note},
    };
    memcpy(info->kernels, slots, sizeof slots);
    return MXFP8_OK;
}

int mxfp8_cpu_feature_count(void) { return MXFP8I_CPU_NUM_FEATURES; }

mxfp8_status mxfp8_cpu_feature(int i, const char **name, int *value) {
    mxfp8i_clear_error();
    MXFP8I_RETURN_ERROR_IF(!name || !value, MXFP8_ERR_NULL_POINTER, "mxfp8_cpu_feature: name or value is NULL");
    MXFP8I_RETURN_ERROR_IF(i < 0 || i >= MXFP8I_CPU_NUM_FEATURES, MXFP8_ERR_INVALID_ARGUMENT,
                           "mxfp8_cpu_feature: index %d out of range [0, %d)", i, MXFP8I_CPU_NUM_FEATURES);
    *name = mxfp8i_cpu_feature_name(i);
    *value = mxfp8i_cpu_feature_value(i);
    return MXFP8_OK;
}
