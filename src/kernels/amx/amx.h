/*
 * amx.h -- the AMX-BF16 GEMM microkernel (src/kernels/amx/gemm_bf16_amx.c): panel format, contract, guard.
 *
 * Why it can be exact
 * -------------------
 * A dequantized MXFP8 value is fp8 * 2^e: at most 4 (E4M3) or 3 (E5M2) significant bits, so it is exact in BF16
 * whenever it is a BF16 normal. The product of two BF16 values has at most 16 significant bits, so it is exact in FP32
 * when it lies in FP32's normal range. The Intel SDM defines TDPBF16PS per output element as
 *     acc += FP32(a[2p]) * FP32(b[2p]);  acc += FP32(a[2p+1]) * FP32(b[2p+1])     for p ascending, RNE,
 * with BF16 subnormal inputs read as zero (DAZ) and subnormal results flushed to zero (FTZ). With exact products each
 * step is acc = RNE(acc + a*b) = fmaf(a, b, acc): the same sequence as the reference F32 microkernel (ukernel.h). So
 * the AMX kernel equals the reference BIT FOR BIT wherever neither DAZ nor FTZ can act and no product overflows:
 *   (1) every input value is zero or a BF16 normal (else DAZ would zero it, or BF16 could not hold it), and
 *   (2) every product and every partial sum is zero or >= 2^-126 in magnitude (else FTZ would zero it). If the lowest
 *       set bit of every nonzero a is >= 2^qa, of every b >= 2^qb and of the starting acc >= 2^qc, with
 *       qa + qb >= -126 and qc >= -126, every partial sum is a multiple of 2^-126 (exact sums of such multiples stay
 *       multiples; rounding to FP32 keeps a multiple of 2^-126 when the value is >= 2^-126), hence zero or normal.
 *   (3) |a| < 2^(ea+1), |b| < 2^(eb+1) with ea + eb <= 126: the product is below FP32's overflow.
 * The packer records, per 16-row tile and 32-step chunk of k ("tile-chunk"), qmin = min over nonzero values of the
 * exponent of the lowest set bit, emax = max exponent, and whether any value is not a BF16 normal/zero (then the
 * chunk is stored in FP32). The kernel runs a chunk on AMX only when (1)-(3) hold for all four tile pairs and the
 * accumulators satisfy qc >= -126 and are finite (checked after load and after every exact chunk); otherwise it
 * stores the accumulators and runs that chunk with AVX-512 FMAs in ascending k (the reference sequence), then
 * reloads. A trailing partial chunk (kc % 32) always takes the exact path (no zero padding enters a sum).
 * Whether the hardware really follows the SDM sequence (rather than, e.g., adding the two products of a pair with a
 * single rounding) is checked once at first use by mxfp8i_amx_self_test(), on adversarial data; if it does not, AMX
 * is not used.
 *
 * Panel format (the slot's own, MXFP8I_PANEL_OTHER); a panel holds 32 rows (A: rows of C; B: columns of C), all of K
 * ----------------------------------------------------------------------------------------------------------------
 *   chunks = ceil(K / 32); chunk c (steps k = 32c + kk) at byte c * MXFP8I_AMX_CHUNK_BYTES: a 64-byte header holding
 *   mxfp8i_amx_meta[2] (tiles 0, 1), the pair-order byte s at MXFP8I_AMX_SWAP_BYTE, zeros; then slot t in {0, 1}
 *   (rows 16t .. 16t+15) at byte 64 + t * SLOT. In BF16 slots the two steps of a pair trade places when s = 1
 *   (kk' = kk ^ s below): the order a VDPBF16PS unit that takes the odd element first needs (mxfp8i_amx_pack_swapped).
 *   The AMX kernel needs s = 0 (mxfp8i_amx_pack).
 *   A slot, BF16 (meta.f32 == 0): bf16 of row 16t+r, step kk at byte r*64 + kk'*2         (an AMX A tile, 16 x 64 B)
 *   A slot, FP32 (meta.f32 == 1): float of row 16t+r, step kk at byte r*128 + kk*4
 *   B slot, BF16: bf16 of row 16t+j, step kk at byte (kk/2)*64 + j*4 + (kk'%2)*2           (an AMX B tile, VNNI pairs)
 *   B slot, FP32: float of row 16t+j, step kk at byte kk*64 + j*4
 *   Rows >= the operand's row count and steps >= K are zero.
 * The slot is 2 KiB so either form fits; a BF16 slot uses only its first 1 KiB (the rest is never read).
 *
 * Microkernel contract (mxfp8i_bf16_gemm_32x32__amx, the `run` of a ukernel.h slot): a, b are panel BASES (all of
 * K); k0 is a multiple of 32; for i < mr, j < nr (1 <= mr, nr <= 32), kc >= 1, k0 + kc <= K:
 *   acc = load_c ? c[i*ldc + j] : +0.0f;  for k = k0 .. k0+kc-1: acc = fmaf(A[i][k], B[j][k], acc);  c[i*ldc+j] = acc
 * Only the mr x nr valid elements of c are read or written. That is the reference contract of ukernel.h (with
 * MR = NR = 32), bit for bit -- on a CPU where the self-test passed. A kc that is not a multiple of 32 is fine
 * anywhere (its last partial chunk takes the exact path).
 *
 * Guard: call anything here only when mxfp8i_isa() == MXFP8_ISA_AMX (this folder is compiled with AVX-512 and AMX
 * flags). The emulation entry (..._amxemu) needs AVX-512F/BW only; it exists for the tests.
 */
#ifndef MXFP8_KERNELS_AMX_H
#define MXFP8_KERNELS_AMX_H

#include <stdint.h>

#define MXFP8I_AMX_MR 32     /**< rows of C per call (2 tiles of 16) */
#define MXFP8I_AMX_NR 32     /**< columns of C per call (2 tiles of 16) */
#define MXFP8I_AMX_KCHUNK 32 /**< k steps per chunk: one MX group when the chunk starts at a multiple of 32 */
#define MXFP8I_AMX_SLOT 2048 /**< bytes of one (chunk, tile) slot */
#define MXFP8I_AMX_CHUNK_BYTES (64 + 2 * MXFP8I_AMX_SLOT) /**< header + two slots */
#define MXFP8I_AMX_SWAP_BYTE 16 /**< header byte: 1 = the steps of each BF16 pair are stored swapped */

/** Per (chunk, tile) facts written by the packer and read by the kernel. */
typedef struct mxfp8i_amx_meta {
    int16_t qmin;  /**< min over nonzero values of the exponent of the lowest set bit (+1000 if all zero) */
    int16_t emax;  /**< max over nonzero values of the unbiased exponent (-1000 if all zero) */
    uint8_t f32;   /**< 1: some value is not zero or a BF16 normal (subnormal, > 8 significant bits, Inf, NaN);
                        the slot holds FP32 and the chunk always takes the exact path */
    uint8_t pad[3];
} mxfp8i_amx_meta;

/** Number of chunks of a panel covering K steps. */
static inline int64_t mxfp8i_amx_chunks(int64_t K) { return (K + MXFP8I_AMX_KCHUNK - 1) / MXFP8I_AMX_KCHUNK; }

/** Bytes of one panel of w <= 32 rows covering K steps (the slot's panel_bytes). */
int64_t mxfp8i_amx_panel_bytes(int64_t K, int w);

/** Pack rows [0, rows) (rows <= 32) of an FP32 matrix src[r*rs + k], k < K, as an A panel (is_b = 0: rows of C) or a
 *  B panel (is_b = 1: columns of C); rows past `rows` and steps past K become zeros (the slot's pack). panel: 64-byte
 *  aligned, mxfp8i_amx_panel_bytes(K, 32) bytes. The values should be exact dequantized MX values; any FP32 is
 *  accepted (what BF16 cannot hold exactly is stored in FP32 and computed on the exact path). Needs AVX-512F/BW. */
void mxfp8i_amx_pack(int is_b, const float *src, int64_t rs, int rows, int64_t K, void *panel);
/** The same with every BF16 pair stored swapped (for an odd-first VDPBF16PS unit; never for the AMX kernel). */
void mxfp8i_amx_pack_swapped(int is_b, const float *src, int64_t rs, int rows, int64_t K, void *panel);
/** The two packers from a column-major source: element (r, k) at src[k*ld + r] (r < rows); the same panel bytes as
 *  packing the transposed matrix row-major (the slots' pack_cm). */
void mxfp8i_amx_pack_cm(int is_b, const float *src, int64_t ld, int rows, int64_t K, void *panel);
void mxfp8i_amx_pack_swapped_cm(int is_b, const float *src, int64_t ld, int rows, int64_t K, void *panel);
typedef void (*mxfp8i_amx_pack_fn)(int is_b, const float *src, int64_t ld, int rows, int64_t K, void *panel);
struct mxfp8i_ukernel;
/** The column-major packer matching a slot's pack (mxfp8i_amx_pack -> mxfp8i_amx_pack_cm, the swapped one ->
 *  mxfp8i_amx_pack_swapped_cm), or NULL for any other slot. */
mxfp8i_amx_pack_fn mxfp8i_amx_pack_cm_for(const struct mxfp8i_ukernel *uk);

/** The AMX microkernel (contract above; the slot's run). Needs AMX-TILE + AMX-BF16 and XTILEDATA permission. */
void mxfp8i_bf16_gemm_32x32__amx(int64_t k0, int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mr,
                                 int nr, int load_c);

/** The same kernel with every tile instruction replaced by a C emulation of the SDM definition (DAZ, FTZ, RNE, the
 *  sequential pair order). route = 0 disables the exact-path routing of full chunks whose slots are BF16 (they all
 *  go to the "tiles"): a negative control for the tests. Needs AVX-512F/BW. */
void mxfp8i_bf16_gemm_32x32__amxemu(int64_t k0, int64_t kc, const void *a, const void *b, float *c, int64_t ldc,
                                    int mr, int nr, int load_c, int route);

/* ---- helpers shared by the kernels on these panels ---- */
/** The exact path's FMAs must be IEEE (round to nearest, no FTZ/DAZ) whatever the caller set in MXCSR (a fast-math
 *  program, a Python extension): each kernel entry runs under the default control bits and restores the caller's.
 *  The tile and VDPBF16PS instructions ignore MXCSR. */
static inline unsigned mxfp8i_amx_mxcsr_enter(void) {
    unsigned csr;
    __asm__ volatile("stmxcsr %0" : "=m"(csr));
    if ((csr & 0xFFC0u) != 0x1F80u) {
        unsigned ieee = 0x1F80u | (csr & 0x3Fu); /* keep the sticky exception flags */
        __asm__ volatile("ldmxcsr %0" ::"m"(ieee));
    }
    return csr;
}
static inline void mxfp8i_amx_mxcsr_leave(unsigned csr) {
    if ((csr & 0xFFC0u) != 0x1F80u) __asm__ volatile("ldmxcsr %0" ::"m"(csr));
}
/** The facts of a chunk (its 64-byte header: tile 0, tile 1). */
static inline const mxfp8i_amx_meta *mxfp8i_amx_chunk_meta(const void *chunk) {
    return (const mxfp8i_amx_meta *)chunk;
}
/** 1 when an A tile-chunk and a B tile-chunk may run on BF16 dot-product hardware (conditions 1 and 3 above; the
 *  part of condition 2 that concerns the products). */
static inline int mxfp8i_amx_pair_ok(const mxfp8i_amx_meta *x, const mxfp8i_amx_meta *y) {
    return !x->f32 && !y->f32 && x->qmin + y->qmin >= -126 && x->emax + y->emax <= 126;
}
/** cb[32][32] (row-major accumulators) += the chunk's steps kk < kn, acc = fmaf(a, b, acc) in ascending kk. */
void mxfp8i_amx_exact_chunk(float *cb, const void *a_chunk, const void *b_chunk, int kn);
/** 1 when every accumulator of cb[32][32] is zero or a finite normal whose lowest set bit is >= 2^-126. */
int mxfp8i_amx_acc_ok(const float *cb);
/** cb[32][32] (64-byte aligned) = the valid mr x nr block of c when load_c, zeros elsewhere; and the way back. */
void mxfp8i_amx_load_acc(float *cb, const float *c, int64_t ldc, int mr, int nr, int load_c);
void mxfp8i_amx_store_acc(const float *cb, float *c, int64_t ldc, int mr, int nr);

/* ---- AVX512-BF16 kernel on the same panels (src/kernels/amx/gemm_bf16_avx512bf16.c) ----
 * VDPBF16PS is, per lane, two FP32 FMAs with DAZ/FTZ and RNE (the SDM: the odd element of each pair first; measured
 * on AMD Zen 4: odd first, bit for bit on 3.2 M random pairs). A dword of the A slot is the pair (k = 2p, 2p+1) of one
 * row, a 64-byte row p of the VNNI B slot is that pair for 16 columns: the AMX panel is exactly what VDPBF16PS reads.
 * The kernel computes in the stored order; panels packed swapped (mxfp8i_amx_pack_swapped) make an odd-first unit
 * see k = 2p first, plain panels suit an even-first unit; the routing of chunks is the AMX kernel's. Whichever
 * packing reproduces the reference in the self-test is used; if neither does, the kernel is not used. Register
 * tile: 8 rows x 32 columns (16 zmm). */
void mxfp8i_bf16_gemm_32x32__avx512bf16(int64_t k0, int64_t kc, const void *a, const void *b, float *c, int64_t ldc,
                                        int mr, int nr, int load_c);
/** The same without the DAZ/FTZ routing (only FP32 slots and the K tail take the exact path): a negative control on
 *  real hardware for the tests. */
void mxfp8i_bf16_gemm_32x32__avx512bf16_noroute(int64_t k0, int64_t kc, const void *a, const void *b, float *c,
                                                int64_t ldc, int mr, int nr, int load_c);

/** One-time self-test of the real AMX kernel against the reference F32 microkernel on small deterministic problems
 *  (random MX-like groups, a group with BF16-subnormal dequantized values, tiny-product groups, near-overflow groups,
 *  a pair-rounding trap, partial tiles, a K tail, load_c). Returns NULL when every result is bitwise equal, else a
 *  static sentence saying what differed. Thread-safe; the result is computed once and cached. Call only when the CPU
 *  has AMX-TILE + AMX-BF16 and arch_prctl granted XTILEDATA. */
const char *mxfp8i_amx_self_test(void);

/** The self-test's problem generator and checker, run against any kernel with the contract above; quick = 1 is the
 *  subset the run-time self-tests use (41 cases instead of 201). kind: 0 = real AMX, 1 = emulation, 2 = emulation
 *  without routing, 3 = AVX512-BF16 on swapped panels, 4 = AVX512-BF16 on plain panels, 5 = AVX512-BF16 on swapped
 *  panels without routing (2 and 5 are negative controls). Returns the number of cases that differ from the reference
 *  (0 = all bitwise equal; -1 = no memory); *ncases gets the number of cases run. */
int mxfp8i_amx_check_kernel(int kind, int quick, int *ncases);

/** The AVX512-BF16 kernel's one-time self-test: returns the packing that reproduces the reference (1 = swapped
 *  pairs, 0 = plain), or -1 when neither does (then *why, if given, says so). Call only when the CPU has
 *  AVX512-BF16. */
int mxfp8i_avx512bf16_self_test(const char **why);

/* ---- GEMM slots (src/gemm/ukernel.h): descriptors with panel_bytes / pack / run, kalign 32, exact_order 1 ---- */
struct mxfp8i_ukernel;
/** The AMX kernel's slot, or NULL when its self-test failed. Call only when mxfp8i_isa() == MXFP8_ISA_AMX. */
const struct mxfp8i_ukernel *mxfp8i_amx_ukernel(void);
/** The AVX512-BF16 kernel's slot (with the packing its self-test chose), or NULL when the self-test failed. Call only
 *  when the CPU has AVX512-BF16 (mxfp8i_use_avx512_bf16()). */
const struct mxfp8i_ukernel *mxfp8i_avx512bf16_ukernel(void);

#endif /* MXFP8_KERNELS_AMX_H */
