/*
 * amx.h -- the AMX-BF16 GEMM microkernel and its emulation (src/kernels/amx/gemm_bf16_amx.c), on the BF16 chunk
 * panels of src/kernels/avx512/bf16chunk.h (internal).
 *
 * Microkernel contract: that of src/kernels/ukernel.h with MR = NR = 32 (a, b are panel BASES covering all of K; k0
 * a multiple of 32), bit for bit -- on a CPU where the kernel checker passed. The pair order of the BF16 slots must
 * be the plain one (swap byte 0): TDPBF16PS takes the even element of each pair first.
 */
#ifndef MXFP8_KERNELS_AMX_H
#define MXFP8_KERNELS_AMX_H

#include <stdint.h>

#include "../ukernel.h"

/** The real kernel: needs AMX-TILE + AMX-BF16 and the XTILEDATA permission. */
void mxfp8i_bf16_gemm_32x32__amx(int64_t k0, int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mr,
                                 int nr, int load_c);
extern const mxfp8i_ukernel mxfp8i_bf16_gemm_32x32__amx_ukernel;
/** Tests only (AVX-512F/BW; defined in the test build's mxfp8_test_kernels, not in libmxfp8): every tile
 *  instruction replaced by a C emulation of the SDM definition; and the same without the exact-path routing of full
 *  BF16 chunks (a negative control that must fail the checker). */
extern const mxfp8i_ukernel mxfp8i_bf16_gemm_32x32__amxemu_ukernel;
extern const mxfp8i_ukernel mxfp8i_bf16_gemm_32x32__amxemu_noroute_ukernel;

#endif /* MXFP8_KERNELS_AMX_H */
