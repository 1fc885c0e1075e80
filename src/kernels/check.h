/*
 * check.h -- the microkernel checker: adversarial problems run through any GEMM microkernel slot (ukernel.h) and
 * compared bit for bit with the reference FMA sequence computed here with fmaf (internal).
 *
 * The registry runs it (quick subset) on every candidate kernel before selecting it; tests/c/test_kernels.c runs the
 * full set on every kernel the CPU supports. Cases (A [mr', K], B [nr', K] of dequantized E4M3 values, exact in FP32
 * and in BF16 where the regime allows): every group normal; one group whose A values reach below 2^-126 (BF16
 * subnormal); one group of tiny products (2^-132 .. 2^-126); one group near FP32 overflow; the pair-rounding traps
 * (a fused or odd-first pair gives a different sum); all groups tiny; partial tiles, a K tail, load_c, and K split
 * in two kernel calls at a kalign boundary (as the driver's k tiles do).
 */
#ifndef MXFP8_KERNELS_CHECK_H
#define MXFP8_KERNELS_CHECK_H

#include <stddef.h>

#include "ukernel.h"

/** Run the checker on `uk` (quick = 1: the subset the start-up self-tests use). Returns the number of cases that
 *  differ from the reference (0 = all bitwise equal; -1 = no memory); *ncases gets the number of cases run; when
 *  `why` is given, it receives a description of the first failing case ("" when none). Call only when the CPU has
 *  the features uk->needs. */
int mxfp8i_check_ukernel(const mxfp8i_ukernel *uk, int quick, int *ncases, char *why, size_t whylen);

#endif /* MXFP8_KERNELS_CHECK_H */
