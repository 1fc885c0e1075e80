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
    /* tests only */
    &mxfp8i_bf16_gemm_32x32__avx512bf16_noroute_ukernel,
    &mxfp8i_bf16_gemm_32x32__amxemu_ukernel,
    &mxfp8i_bf16_gemm_32x32__amxemu_noroute_ukernel,
    NULL,
};
static const mxfp8i_qkernel *const g_qkernels[] = {&mxfp8i_mx_quant__avx512, &mxfp8i_mx_quant__ref, NULL};

const mxfp8i_ukernel *const *mxfp8i_ukernel_list(void) { return g_ukernels; }
const mxfp8i_qkernel *const *mxfp8i_qkernel_list(void) { return g_qkernels; }

int mxfp8i_cpu_has(unsigned needs) {
    const mxfp8i_cpu *c = mxfp8i_cpu_features();
    if ((needs & MXFP8I_NEEDS_AVX512) && !(c->avx512f && c->avx512bw && c->avx512vl)) return 0;
    if ((needs & MXFP8I_NEEDS_AVX512_BF16) && !c->avx512_bf16) return 0;
    if ((needs & MXFP8I_NEEDS_AMX) && !(c->amx_tile && c->amx_bf16 && c->amx_permitted)) return 0;
    return 1;
}

static mxfp8i_kernels g_k;
static char g_gemm_note[320];
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

/* The start-up self-test of a candidate, run at most once per descriptor: 0 passed, else the failing case in why. */
static int self_test(const mxfp8i_ukernel *uk, char *why, size_t whylen) {
    static const mxfp8i_ukernel *done[8];
    static int result[8];
    static char msg[8][256];
    int i = 0;
    while (i < 8 && done[i] && done[i] != uk) i++;
    if (i < 8 && done[i] == uk) {
        snprintf(why, whylen, "%s", msg[i]);
        return result[i];
    }
    int n = 0, fails = mxfp8i_check_ukernel(uk, 1, &n, why, whylen);
    if (fails < 0) snprintf(why, whylen, "the self-test could not allocate its workspace");
    if (i < 8) {
        done[i] = uk;
        result[i] = fails;
        snprintf(msg[i], sizeof msg[i], "%s", why);
    }
    return fails;
}

int mxfp8i_ukernel_usable(const mxfp8i_ukernel *uk) {
    mxfp8i_kernels_get(); /* the table first: its self-tests run under its once-flag, this reads their cache */
    if (uk->test_only || !mxfp8i_cpu_has(uk->needs)) return 0;
    if (uk == &mxfp8i_f32_gemm_8x32__ref_ukernel) return 1;
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
        if (uk == &mxfp8i_f32_gemm_8x32__ref_ukernel) {
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

static void fill(void) {
    const mxfp8i_cpu *c = mxfp8i_cpu_features();
    /* The best level this CPU reaches: AMX needs the AMX kernel to pass its self-test too. */
    int best = 0;
    const char *reason = "cpu lacks AVX-512F/BW";
    if (mxfp8i_cpu_has(MXFP8I_NEEDS_AVX512)) {
        best = 1;
        reason = c->amx_tile && c->amx_bf16 ? "AMX not permitted by the OS" : "cpu lacks AMX-BF16";
        if (mxfp8i_cpu_has(MXFP8I_NEEDS_AMX)) {
            char why[256];
            if (self_test(&mxfp8i_bf16_gemm_32x32__amx_ukernel, why, sizeof why) == 0) {
                best = 2;
                reason = "best available";
            } else {
                reason = "AMX self-test failed; using AVX-512 (see the gemm kernel's note)";
            }
        }
    }
    int isa = best, want = env_isa();
    if (want == -2) reason = "MXFP8_ISA not recognized (use scalar|avx512|amx); using the best available";
    else if (want >= 0 && want <= best) { isa = want; reason = "forced by MXFP8_ISA"; }
    else if (want > best) reason = "MXFP8_ISA asks for an ISA this cpu lacks; using the best available";
    g_k.isa = isa;
    g_k.isa_reason = reason;

    fill_gemm(isa);
    g_k.gemm_note = g_gemm_note;
    /* The quantization kernels have no start-up self-test: they are exact by construction (integer arithmetic and
       the reference's own IEEE multiplies) and the tests compare them with the reference on every CPU that has
       them. */
    g_k.quant = &mxfp8i_mx_quant__ref;
    g_k.quant_note = isa < 1 && mxfp8i_cpu_has(MXFP8I_NEEDS_AVX512) ? "mx_quant_panel__avx512 not used: MXFP8_ISA caps the level" : "";
    for (const mxfp8i_qkernel *const *p = g_qkernels; *p; p++)
        if ((*p)->isa_level <= isa && mxfp8i_cpu_has((*p)->needs)) {
            g_k.quant = *p;
            break;
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

mxfp8_status mxfp8_get_info(mxfp8_info *info) {
    mxfp8i_clear_error();
    MXFP8I_RETURN_ERROR_IF(!info, MXFP8_ERR_NULL_POINTER, "mxfp8_get_info: info is NULL");
    const mxfp8i_cpu *c = mxfp8i_cpu_features();
    const mxfp8i_kernels *k = mxfp8i_kernels_get();
    static const char *names[] = {"scalar", "avx512", "amx"};
    memset(info, 0, sizeof *info);
    info->has_avx512f = c->avx512f;
    info->has_avx512bw = c->avx512bw;
    info->has_avx512vl = c->avx512vl;
    info->has_avx512_bf16 = c->avx512_bf16;
    info->has_amx_tile = c->amx_tile;
    info->has_amx_bf16 = c->amx_bf16;
    info->amx_permitted = c->amx_permitted;
    info->isa = (mxfp8_isa)k->isa;
    info->isa_name = names[k->isa];
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
