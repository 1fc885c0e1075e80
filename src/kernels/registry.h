/*
 * registry.h -- the one table of kernels (as XNNPACK's gemm-config.c and BLIS's bli_cntx_init_<arch>()): every slot
 * starts with the reference kernel, then each slot is overridden by the best kernel this CPU supports, allowed by
 * MXFP8_ISA, whose start-up self-test (the kernel checker, check.h) reproduced the reference. Decided once per
 * process, thread-safely; read by the GEMM driver, the quantize dispatcher and mxfp8_get_info() (internal).
 *
 * Slots and candidates, best first:
 *   gemm      bf16_gemm_32x32__amx, bf16_gemm_32x32__avx512bf16_{oddfirst,evenfirst}, f32_gemm_8x32__avx512f,
 *             f32_gemm_8x32__ref
 *   quantize, dequantize   mx_quant_panel__avx512, mx_quant_panel__ref
 * MXFP8_ISA = scalar | avx512 | amx caps the level (0, 1, 2) of the kernels considered.
 */
#ifndef MXFP8_KERNELS_REGISTRY_H
#define MXFP8_KERNELS_REGISTRY_H

#include "qpanel.h"
#include "ukernel.h"

typedef struct mxfp8i_kernels {
    int isa;                        /**< the level in force: 0 scalar, 1 avx512, 2 amx (mxfp8_isa values) */
    const char *isa_reason;         /**< why (mxfp8_info.isa_reason) */
    const mxfp8i_ukernel *gemm;     /**< never NULL */
    int gemm_self_test;             /**< 1: passed the checker; 0: the reference (checked by the tests only) */
    const char *gemm_note;          /**< "" or why a faster GEMM kernel is not in use */
    const mxfp8i_qkernel *quant;    /**< never NULL */
    int quant_self_test;
    const char *quant_note;
} mxfp8i_kernels;

/** The table (static storage). */
const mxfp8i_kernels *mxfp8i_kernels_get(void);

/** Every GEMM microkernel of the library, the runtime candidates in order of preference; NULL-terminated. The
 *  test-only kernels (negative controls, emulations) are not in libmxfp8: the tests add them
 *  (tests/c/kernel_list.h). */
const mxfp8i_ukernel *const *mxfp8i_ukernel_list(void);
/** Every quantization kernel, best first; NULL-terminated. */
const mxfp8i_qkernel *const *mxfp8i_qkernel_list(void);
/** 1 when this CPU (and OS) has every feature in `needs` (MXFP8I_NEEDS_*: a set of src/runtime/cpu.h features). */
int mxfp8i_cpu_has(unsigned needs);

/** 1 when `uk` can run here: not test-only, the CPU has its features and (for all but the reference) its start-up
 *  self-test passed on this CPU (run once per kernel, under the registry's lock, and kept in its descriptor).
 *  MXFP8_ISA is not consulted: the tests run every usable kernel. */
int mxfp8i_ukernel_usable(const mxfp8i_ukernel *uk);

/** The GEMM kernel in use: the registry's, or the one forced by mxfp8i_force_ukernel (tests). Never NULL. */
const mxfp8i_ukernel *mxfp8i_gemm_ukernel(void);
/** The F32-panel microkernel (ukernel.h's F32 panel format, `fn` set) for FP32 fmaf-chain products that are not
 *  MX GEMMs (the router's linear, src/ops/router.c): the forced kernel when mxfp8i_force_ukernel forced an
 *  F32-panel one, else the first runtime candidate within the MXFP8_ISA level in force that this CPU can run and
 *  that passed its self-test, else the reference. Every such kernel gives the reference's bits. Never NULL. */
const mxfp8i_ukernel *mxfp8i_f32_ukernel(void);
/** Tests only: make the GEMM driver use `uk` (NULL = back to the registry's choice). Not to be changed while GEMMs
 *  run on other threads. */
void mxfp8i_force_ukernel(const mxfp8i_ukernel *uk);

#endif /* MXFP8_KERNELS_REGISTRY_H */
