/*
 * fenv.h -- the one floating-point environment guard of libmxfp8 (internal).
 *
 * Every result is defined under IEEE defaults: round to nearest-even, subnormals neither flushed (FTZ) nor read as
 * zero (DAZ), all exceptions masked. A caller may have changed MXCSR (fast-math start-up code, a framework's "flush
 * denormals" switch, unmasked exceptions); each kernel entry and each GEMM thread runs under the defaults and
 * restores the caller's control bits on the way out. The sticky exception flags (bits 0-5) are kept. MXCSR is per
 * thread, so the guard is taken on whichever thread runs the work. The tile and VDPBF16PS instructions ignore MXCSR.
 */
#ifndef MXFP8_RUNTIME_FENV_H
#define MXFP8_RUNTIME_FENV_H

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
/** Enter IEEE defaults; returns the caller's MXCSR for mxfp8i_fenv_leave. Costs one stmxcsr when already default. */
static inline unsigned mxfp8i_fenv_enter(void) {
    unsigned csr = _mm_getcsr();
    if ((csr & 0xFFC0u) != 0x1F80u) _mm_setcsr(0x1F80u | (csr & 0x3Fu));
    return csr;
}
/** Restore the caller's control bits (the sticky flags raised inside are kept). */
static inline void mxfp8i_fenv_leave(unsigned csr) {
    if ((csr & 0xFFC0u) != 0x1F80u) _mm_setcsr(csr | (_mm_getcsr() & 0x3Fu));
}
#else
static inline unsigned mxfp8i_fenv_enter(void) { return 0; }
static inline void mxfp8i_fenv_leave(unsigned csr) { (void)csr; }
#endif

#endif /* MXFP8_RUNTIME_FENV_H */
