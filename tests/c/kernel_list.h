/*
 * kernel_list.h -- every GEMM microkernel the tests run: the library's runtime candidates (mxfp8i_ukernel_list)
 * followed by the test-only ones (the AMX emulation and the negative controls), which live in the test build's
 * static library mxfp8_test_kernels (CMakeLists.txt), not in libmxfp8.
 */
#ifndef MXFP8_TESTS_KERNEL_LIST_H
#define MXFP8_TESTS_KERNEL_LIST_H

#include "kernels/amx/amx.h"
#include "kernels/avx512/avx512.h"
#include "kernels/registry.h"

/** NULL-terminated; the library's kernels first, in their order of preference. */
static inline const mxfp8i_ukernel *const *mxfp8t_all_ukernels(void) {
    static const mxfp8i_ukernel *all[64];
    if (!all[0]) {
        int n = 0;
        for (const mxfp8i_ukernel *const *p = mxfp8i_ukernel_list(); *p && n < 60; p++) all[n++] = *p;
        all[n++] = &mxfp8i_bf16_gemm_32x32__avx512bf16_noroute_ukernel;
        all[n++] = &mxfp8i_bf16_gemm_32x32__amxemu_ukernel;
        all[n++] = &mxfp8i_bf16_gemm_32x32__amxemu_noroute_ukernel;
        all[n] = NULL;
    }
    return all;
}

#endif /* MXFP8_TESTS_KERNEL_LIST_H */
