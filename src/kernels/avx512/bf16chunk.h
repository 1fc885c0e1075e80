/*
 * bf16chunk.h -- the BF16 chunk panel format (MXFP8I_PANEL_BF16C) shared by the AVX512-BF16 (VDPBF16PS) and the
 * AMX-BF16 (TDPBF16PS) microkernels: layout, the facts that make BF16 dot-product hardware exact on it, and the
 * exact-path helpers both kernels use (src/kernels/avx512/bf16chunk.c; AVX-512F/BW code).
 *
 * Why BF16 hardware can be exact
 * ------------------------------
 * A dequantized MXFP8 value is fp8 * 2^e: at most 4 (E4M3) or 3 (E5M2) significant bits, so it is exact in BF16
 * whenever it is a BF16 normal. The product of two BF16 values has at most 16 significant bits, so it is exact in FP32
 * when it lies in FP32's normal range. The Intel SDM defines TDPBF16PS (and VDPBF16PS) per output element as two
 * sequential FP32 FMAs per BF16 pair (RNE), with BF16 subnormal inputs read as zero (DAZ) and subnormal results
 * flushed to zero (FTZ). With exact products each step is acc = RNE(acc + a*b) = fmaf(a, b, acc): the reference
 * sequence of ukernel.h. So BF16 hardware equals the reference BIT FOR BIT wherever neither DAZ nor FTZ can act, no
 * product overflows, and the pair order is the reference's:
 *   (1) every input value is zero or a BF16 normal (else DAZ would zero it, or BF16 could not hold it), and
 *   (2) every product and every partial sum is zero or >= 2^-126 in magnitude (else FTZ would zero it). If the lowest
 *       set bit of every nonzero a is >= 2^qa, of every b >= 2^qb and of the starting acc >= 2^qc, with
 *       qa + qb >= -126 and qc >= -126, every partial sum is a multiple of 2^-126 (exact sums of such multiples stay
 *       multiples; rounding to FP32 keeps a multiple of 2^-126 when the value is >= 2^-126), hence zero or normal.
 *   (3) |a| < 2^(ea+1), |b| < 2^(eb+1) with ea + eb <= 126: the product is below FP32's overflow.
 * The packer records, per 16-row tile and 32-step chunk of k ("tile-chunk"), qmin = min over nonzero values of the
 * exponent of the lowest set bit, emax = max exponent, and whether any value is not a BF16 normal/zero (then the
 * chunk is stored in FP32). A kernel runs a chunk on the BF16 unit only when (1)-(3) hold for all four tile pairs and
 * the accumulators are finite with qc >= -126 (checked after load and after every exact chunk); otherwise it runs
 * that chunk with AVX-512 FMAs in ascending k (the reference sequence). A trailing partial chunk (kc % 32) always
 * takes the exact path. Whether the hardware follows the sequential pair definition (rather than, e.g., adding the
 * two products of a pair with a single rounding) is checked at start-up by the kernel checker (src/kernels/check.h)
 * on adversarial data: the registry uses a kernel only when it passed.
 *
 * Layout: a panel holds 32 rows (A: rows of C; B: columns of C), all of K
 * ------------------------------------------------------------------------
 *   chunks = ceil(K / 32); chunk c (steps k = 32c + kk) at byte c * MXFP8I_BF16C_CHUNK_BYTES: a 64-byte header holding
 *   mxfp8i_bf16c_meta[2] (tiles 0, 1), the pair-order byte s at MXFP8I_BF16C_SWAP_BYTE, zeros; then slot t in {0, 1}
 *   (rows 16t .. 16t+15) at byte 64 + t * SLOT. In BF16 slots the two steps of a pair trade places when s = 1
 *   (kk' = kk ^ s below): the order a VDPBF16PS unit that takes the odd element first needs (pack with swap = 1).
 *   The AMX kernel needs s = 0.
 *   A slot, BF16 (meta.f32 == 0): bf16 of row 16t+r, step kk at byte r*64 + kk'*2         (an AMX A tile, 16 x 64 B)
 *   A slot, FP32 (meta.f32 == 1): float of row 16t+r, step kk at byte r*128 + kk*4
 *   B slot, BF16: bf16 of row 16t+j, step kk at byte (kk/2)*64 + j*4 + (kk'%2)*2           (an AMX B tile, VNNI pairs)
 *   B slot, FP32: float of row 16t+j, step kk at byte kk*64 + j*4
 *   Rows >= the operand's row count and steps >= K are zero. The slot is 2 KiB so either form fits; a BF16 slot
 *   uses only its first 1 KiB (the rest is never read).
 */
#ifndef MXFP8_KERNELS_AVX512_BF16CHUNK_H
#define MXFP8_KERNELS_AVX512_BF16CHUNK_H

#include <stdint.h>

#define MXFP8I_BF16C_ROWS 32       /**< rows of a panel (2 tiles of 16) */
#define MXFP8I_BF16C_KCHUNK 32     /**< k steps per chunk: one MX group when the chunk starts at a multiple of 32 */
#define MXFP8I_BF16C_SLOT 2048     /**< bytes of one (chunk, tile) slot */
#define MXFP8I_BF16C_CHUNK_BYTES (64 + 2 * MXFP8I_BF16C_SLOT) /**< header + two slots */
#define MXFP8I_BF16C_SWAP_BYTE 16  /**< header byte: 1 = the steps of each BF16 pair are stored swapped */

/** Per (chunk, tile) facts written by the packer and read by the kernels. */
typedef struct mxfp8i_bf16c_meta {
    int16_t qmin;  /**< min over nonzero values of the exponent of the lowest set bit (+1000 if all zero) */
    int16_t emax;  /**< max over nonzero values of the unbiased exponent (-1000 if all zero) */
    uint8_t f32;   /**< 1: some value is not zero or a BF16 normal (subnormal, > 8 significant bits, Inf, NaN);
                        the slot holds FP32 and the chunk always takes the exact path */
    uint8_t pad[3];
} mxfp8i_bf16c_meta;

/** Number of chunks of a panel covering K steps. */
static inline int64_t mxfp8i_bf16c_chunks(int64_t K) { return (K + MXFP8I_BF16C_KCHUNK - 1) / MXFP8I_BF16C_KCHUNK; }
/** Bytes of one panel of w <= 32 rows covering K steps (a slot's panel_bytes). */
int64_t mxfp8i_bf16c_panel_bytes(int64_t K, int w);

/** Pack rows [0, rows) (rows <= 32) of an FP32 matrix (row-major: element (r, k) at src[r*ld + k]; the _cm variants
 *  column-major: at src[k*ld + r]) as an A panel (is_b = 0: rows of C) or a B panel (is_b = 1: columns of C); rows
 *  past `rows` and steps past K become zeros. panel: 64-byte aligned, mxfp8i_bf16c_panel_bytes(K, 32) bytes. Any
 *  FP32 is accepted (what BF16 cannot hold exactly is stored in FP32 and computed on the exact path). The _swapped
 *  variants store every BF16 pair swapped (for an odd-first VDPBF16PS unit; never for the AMX kernel). */
void mxfp8i_bf16c_pack(int is_b, const float *src, int64_t ld, int rows, int64_t K, void *panel);
void mxfp8i_bf16c_pack_swapped(int is_b, const float *src, int64_t ld, int rows, int64_t K, void *panel);
void mxfp8i_bf16c_pack_cm(int is_b, const float *src, int64_t ld, int rows, int64_t K, void *panel);
void mxfp8i_bf16c_pack_swapped_cm(int is_b, const float *src, int64_t ld, int rows, int64_t K, void *panel);

/** Pack from BF16 values that are exact dequantized MX values in 1x32 groups along K, with their E8M0 scales:
 *  element (r, k) at src[r*ld + k] (cm = 0) or src[k*ld + r] (cm = 1); the scale of row r's group g at
 *  scales[r*s_r + g*s_g]; fmt the element format (0 E4M3, 1 E5M2); swap as the _swapped packers. The chunk facts
 *  come from the scales (bounds that are never tighter than the values' own) except where a scale code leaves them
 *  open (0, 255, or a group whose values may be BF16 subnormals): there from the values. Panels of this packer and
 *  of mxfp8i_bf16c_pack on the FP32 values hold the same slot data and give the same results; their facts may
 *  differ (these are conservative). */
void mxfp8i_bf16c_pack_q(int is_b, const uint16_t *src, int64_t ld, int cm, int rows, int64_t K,
                         const uint8_t *scales, int64_t s_r, int64_t s_g, int fmt, int swap, void *panel);
/** mxfp8i_bf16c_pack_q with swap 0 / 1 (the kernels' pack_q). */
void mxfp8i_bf16c_pack_q_plain(int is_b, const uint16_t *src, int64_t ld, int cm, int rows, int64_t K,
                               const uint8_t *scales, int64_t s_r, int64_t s_g, int fmt, void *panel);
void mxfp8i_bf16c_pack_q_swapped(int is_b, const uint16_t *src, int64_t ld, int cm, int rows, int64_t K,
                                 const uint8_t *scales, int64_t s_r, int64_t s_g, int fmt, void *panel);

/** The facts of a chunk (its 64-byte header: tile 0, tile 1). */
static inline const mxfp8i_bf16c_meta *mxfp8i_bf16c_chunk_meta(const void *chunk) {
    return (const mxfp8i_bf16c_meta *)chunk;
}
/** 1 when an A tile-chunk and a B tile-chunk may run on BF16 dot-product hardware (conditions 1 and 3 above; the
 *  part of condition 2 that concerns the products). */
static inline int mxfp8i_bf16c_pair_ok(const mxfp8i_bf16c_meta *x, const mxfp8i_bf16c_meta *y) {
    return !x->f32 && !y->f32 && x->qmin + y->qmin >= -126 && x->emax + y->emax <= 126;
}
/** 1 when all four tile pairs of an A chunk and a B chunk may run on the unit (route = 0, for negative controls:
 *  whenever all four slots are BF16, whatever DAZ/FTZ may do). */
static inline int mxfp8i_bf16c_chunk_ok(const void *a_chunk, const void *b_chunk, int route) {
    const mxfp8i_bf16c_meta *ma = mxfp8i_bf16c_chunk_meta(a_chunk), *mb = mxfp8i_bf16c_chunk_meta(b_chunk);
    if (!route) return !ma[0].f32 && !ma[1].f32 && !mb[0].f32 && !mb[1].f32;
    return mxfp8i_bf16c_pair_ok(ma, mb) && mxfp8i_bf16c_pair_ok(ma, mb + 1) && mxfp8i_bf16c_pair_ok(ma + 1, mb) &&
           mxfp8i_bf16c_pair_ok(ma + 1, mb + 1);
}
/** cb[32][32] (row-major accumulators) += the chunk's steps kk < kn, acc = fmaf(a, b, acc) in ascending kk. */
void mxfp8i_bf16c_exact_chunk(float *cb, const void *a_chunk, const void *b_chunk, int kn);
/** The same for rows [r0, r0 + 8) of a full 32-column tile held directly in c (row stride ldc, in floats): c[i*ldc +
 *  j] for i < 8, j < 32 are the accumulators of rows r0 + i. */
void mxfp8i_bf16c_exact_rows8(float *c, int64_t ldc, int r0, const void *a_chunk, const void *b_chunk, int kn);
/** 1 when every accumulator of cb[32][32] is zero or a finite normal whose lowest set bit is >= 2^-126. */
int mxfp8i_bf16c_acc_ok(const float *cb);
/** cb[32][32] (64-byte aligned) = the valid mr x nr block of c when load_c, zeros elsewhere; and the way back. */
void mxfp8i_bf16c_load_acc(float *cb, const float *c, int64_t ldc, int mr, int nr, int load_c);
void mxfp8i_bf16c_store_acc(const float *cb, float *c, int64_t ldc, int mr, int nr);

#endif /* MXFP8_KERNELS_AVX512_BF16CHUNK_H */
