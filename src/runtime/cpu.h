/*
 * cpu.h -- what the CPU and the OS offer, as a list of named features (detected once per process, thread-safely)
 * (internal). Detection only: which kernels run is decided by the kernel registry (src/kernels/registry.c), which
 * reads a kernel's needs as a set of these features; mxfp8_cpu_feature() and `mxfp8 info` print the list.
 *
 * Adding a feature: one enumerator below, its name and its detection in cpu.c.
 */
#ifndef MXFP8_RUNTIME_CPU_H
#define MXFP8_RUNTIME_CPU_H

/** The features, in the order of the list. */
typedef enum mxfp8i_cpu_feature {
    MXFP8I_CPU_AVX512F = 0,      /**< CPUID and OS (XCR0) support */
    MXFP8I_CPU_AVX512BW,         /**< CPUID and OS (XCR0) support */
    MXFP8I_CPU_AVX512VL,         /**< CPUID and OS (XCR0) support */
    MXFP8I_CPU_AVX512_BF16,      /**< CPUID and OS (XCR0) support */
    MXFP8I_CPU_AMX_TILE,         /**< CPUID */
    MXFP8I_CPU_AMX_BF16,         /**< CPUID */
    MXFP8I_CPU_AMX_PERMITTED,    /**< arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) granted */
    MXFP8I_CPU_NUM_FEATURES
} mxfp8i_cpu_feature;

/** The bit of feature f in a set of features (a kernel's needs, mxfp8i_cpu_bits()). */
#define MXFP8I_CPU_BIT(f) (1u << (f))

/** The name of feature f ("avx512f", ...; NULL when f is out of range). */
const char *mxfp8i_cpu_feature_name(int f);
/** 1 when this CPU (and OS) has feature f, else 0 (also when f is out of range). */
int mxfp8i_cpu_feature_value(int f);
/** The set of features this CPU has (MXFP8I_CPU_BIT of each). */
unsigned mxfp8i_cpu_bits(void);

#endif /* MXFP8_RUNTIME_CPU_H */
