/*
 * cpu.h -- what the CPU and the OS offer (detected once per process, thread-safely) and the thread count (internal).
 * Detection only: which kernels run is decided by the kernel registry (src/kernels/registry.c).
 */
#ifndef MXFP8_RUNTIME_CPU_H
#define MXFP8_RUNTIME_CPU_H

typedef struct mxfp8i_cpu {
    int avx512f, avx512bw, avx512vl, avx512_bf16; /**< CPUID and OS (XCR0) support */
    int amx_tile, amx_bf16;                       /**< CPUID */
    int amx_permitted;                            /**< arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) granted */
} mxfp8i_cpu;

/** The features of this CPU (static storage, never NULL). */
const mxfp8i_cpu *mxfp8i_cpu_features(void);

/** MXFP8_NUM_THREADS as the library reads it: 0 if unset/empty, -1 if not a whole positive decimal integer (then
 *  ignored), else the value clamped to MXFP8_MAX_THREADS. */
int mxfp8i_parse_num_threads(const char *s);
/** Threads a call may use: mxfp8_set_num_threads, else MXFP8_NUM_THREADS, else OMP_NUM_THREADS, else
 *  omp_get_max_threads(); clamped to MXFP8_MAX_THREADS. >= 1. */
int mxfp8i_num_threads(void);

#endif /* MXFP8_RUNTIME_CPU_H */
