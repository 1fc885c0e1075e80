/*
 * mxfp8.h -- MXFP8 training kernels for CPUs: the public API of libmxfp8.
 *
 * What this library is
 * --------------------
 * libmxfp8 implements, in C11, the MXFP8 kernels of two AWS Neuron NKI API references
 * (nkilib.experimental):
 *   - matmul_mxfp8_backward   (dX = dY @ W, dW = dY^T @ X of a linear layer Y = X @ W^T), and
 *   - blockwise_mm_bwd_mxfp8  (backward of a blockwise Mixture-of-Experts layer with SwiGLU experts),
 * together with what they stand on: MX quantization (OCP Microscaling Formats v1.0: 32-element groups that
 * share one E8M0 scale, FP8 E4M3 / E5M2 elements), the forward passes, token routing and golden references.
 *
 * Conventions
 * -----------
 *  - Every fallible call returns an mxfp8_status. MXFP8_OK is 0. On any error, no output is written (outputs are
 *    validated before the first store), and mxfp8_last_error_message() returns one sentence naming the parameter
 *    and the bad value (thread-local: each thread sees its own last error).
 *  - The library never aborts, never prints, and keeps no pointer to caller memory after a call returns.
 *  - Tensors are plain, non-owning views (mxfp8_tensor): data pointer, dtype, ndim, shape, strides in ELEMENTS
 *    (not bytes). Row-major contiguous views are made with mxfp8_tensor_make().
 *  - An optional tensor argument is "absent" when its data pointer is NULL (use MXFP8_TENSOR_NONE).
 *  - All functions are thread-safe: any number of threads may call the library at once on separate buffers.
 *  - Results never depend on the thread count, the ISA path chosen for quantization, or any speed-only knob
 *    (tile sizes, loop orders, sharding, spill/reload): they are bitwise reproducible.
 *  - Threads: OpenMP. MXFP8_NUM_THREADS, else OMP_NUM_THREADS, else all cores. MXFP8_ISA=scalar|avx512|amx forces
 *    an ISA path (falling back, with mxfp8_info() saying so, when the CPU lacks it).
 *
 * Sources of the rules, cited in each doc comment:
 *   [OCP]   OCP Microscaling Formats (MX) Specification v1.0, sections 5 (E8M0, FP8) and 6.3 (conversion).
 *   [NKI-Q] AWS Neuron NKI ISA docs, nki.isa.quantize_mx / nc_matmul_mx, and the MXFP8 matmul deep-dive.
 *   [NKI-M] NKI API reference: nkilib.experimental.matmul_mxfp8.matmul_mxfp8_backward.
 *   [NKI-E] NKI API reference: nkilib.experimental.moe_mxfp8.bwd.blockwise_mm_bwd_mxfp8.
 */
#ifndef MXFP8_H
#define MXFP8_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define MXFP8_API __declspec(dllexport)
#else
#define MXFP8_API __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------------------------------------------------ */
/* Version                                                                                                        */
/* ------------------------------------------------------------------------------------------------------------ */
#define MXFP8_VERSION_MAJOR 0
#define MXFP8_VERSION_MINOR 1
#define MXFP8_VERSION_PATCH 0
#define MXFP8_VERSION_NUMBER (MXFP8_VERSION_MAJOR * 10000 + MXFP8_VERSION_MINOR * 100 + MXFP8_VERSION_PATCH)

/** Runtime version number (MXFP8_VERSION_NUMBER of the built library). */
MXFP8_API unsigned mxfp8_version_number(void);
/** Runtime version string, e.g. "0.1.0". Static storage. */
MXFP8_API const char *mxfp8_version_string(void);

/* ------------------------------------------------------------------------------------------------------------ */
/* Status and errors                                                                                              */
/* ------------------------------------------------------------------------------------------------------------ */
/** Status codes. The numeric values are fixed and will not change. */
typedef enum mxfp8_status {
    MXFP8_OK = 0,
    MXFP8_ERR_NULL_POINTER = 1,      /**< a required pointer (argument, view data) is NULL */
    MXFP8_ERR_INVALID_ARGUMENT = 2,  /**< a scalar argument or enum/string value is out of its domain */
    MXFP8_ERR_SHAPE_MISMATCH = 3,    /**< shapes of related tensors disagree, or a rank is wrong */
    MXFP8_ERR_DTYPE = 4,             /**< a tensor's dtype is not accepted for that parameter */
    MXFP8_ERR_OUT_OF_MEMORY = 5,     /**< a workspace allocation failed */
    MXFP8_ERR_SIZE_OVERFLOW = 6,     /**< a size or size product overflows, or a size is negative */
    MXFP8_ERR_ALIASING = 7,          /**< an output overlaps an input or another output */
    MXFP8_ERR_INDEX_OUT_OF_RANGE = 8,/**< a token id or expert id is out of range */
    MXFP8_ERR_UNSUPPORTED = 9,       /**< a valid but unsupported combination of options */
    MXFP8_ERR_BAD_STRIDES = 10,      /**< strides reach outside the view or are not accepted */
    MXFP8_ERR_INTERNAL = 11          /**< a bug in libmxfp8; please report it */
} mxfp8_status;

/** A short, static description of a status ("success", "null pointer", ...). Unknown values give "unknown status". */
MXFP8_API const char *mxfp8_status_string(mxfp8_status status);

/** The message of the last error raised on the calling thread ("" when none). Valid until the next library call on
 *  the same thread. Names the parameter and the bad value, e.g. "mxfp8_quantize: axis 3 is out of range for a
 *  2-D tensor". */
MXFP8_API const char *mxfp8_last_error_message(void);

/* ------------------------------------------------------------------------------------------------------------ */
/* Data types, formats, tensor views                                                                              */
/* ------------------------------------------------------------------------------------------------------------ */
/** Element types of tensor views. Values are fixed. FP8 and E8M0 tensors hold raw 8-bit codes. */
typedef enum mxfp8_dtype {
    MXFP8_DTYPE_F32 = 0,   /**< IEEE binary32 */
    MXFP8_DTYPE_BF16 = 1,  /**< bfloat16, stored as uint16_t bits */
    MXFP8_DTYPE_F16 = 2,   /**< IEEE binary16, stored as uint16_t bits */
    MXFP8_DTYPE_E4M3 = 3,  /**< OCP FP8 E4M3 ("E4M3FN"), uint8_t codes */
    MXFP8_DTYPE_E5M2 = 4,  /**< OCP FP8 E5M2, uint8_t codes */
    MXFP8_DTYPE_E8M0 = 5,  /**< OCP E8M0 scale codes, uint8_t */
    MXFP8_DTYPE_U8 = 6,    /**< uint8_t */
    MXFP8_DTYPE_I32 = 7,   /**< int32_t */
    MXFP8_DTYPE_F64 = 8,   /**< IEEE binary64 (golden references) */
    MXFP8_DTYPE_U32 = 9    /**< uint32_t (x4-packed FP8 codes: byte c, least significant first, = element 4p+c) */
} mxfp8_dtype;

/** Size in bytes of one element of dtype (0 for an unknown dtype). */
MXFP8_API size_t mxfp8_dtype_size(mxfp8_dtype dtype);
/** Name of a dtype ("f32", "bf16", "f16", "e4m3", "e5m2", "e8m0", "u8", "i32", "f64", "u32"); "?" if unknown. */
MXFP8_API const char *mxfp8_dtype_name(mxfp8_dtype dtype);

/** FP8 element formats [OCP §5.3.2]. */
typedef enum mxfp8_format {
    MXFP8_FMT_E4M3 = 0, /**< bias 7, max normal 448, no Inf, NaN = S.1111.111, min subnormal 2^-9 */
    MXFP8_FMT_E5M2 = 1  /**< bias 15, max normal 57344, +-Inf, NaNs, min subnormal 2^-16 */
} mxfp8_format;

/** Rule that turns a group's amax into its shared E8M0 exponent e (element = RNE(x * 2^-e)). emax = 8 (E4M3),
 *  15 (E5M2); max_normal = 448 (E4M3), 57344 (E5M2). The exponent of amax is read from its FP32 bits exactly;
 *  e is clamped to [-127, 127]. */
typedef enum mxfp8_scale_rule {
    MXFP8_SCALE_NKI = 0,   /**< e = floor(log2 amax) - (emax - 1): Trainium quantize_mx [NKI-Q]; finite inputs never
                                saturate. The default. */
    MXFP8_SCALE_OCP = 1,   /**< e = floor(log2 amax) - emax [OCP §6.3]; scaled values past max normal saturate. */
    MXFP8_SCALE_RCEIL = 2  /**< e = ceil(log2(amax / max_normal)) (cuBLAS, TransformerEngine). */
} mxfp8_scale_rule;

/** Which 32 indices along the quantization axis form one group. */
typedef enum mxfp8_group_scheme {
    MXFP8_GROUP_1X32 = 0,  /**< 32 contiguous indices [32g, 32g+32) [OCP §6]. The default. */
    MXFP8_GROUP_WRAPX = 1  /**< Trainium's: the axis is cut in 512-tiles, the remainder in 256/128 subtiles; in a
                                (sub)tile at k0 of size P, S = P/4, group j holds {k0 + s*S + 8j + q : s<4, q<8};
                                compact group index = k0/32 + j. Needs axis length % 128 == 0 [NKI-Q]. */
} mxfp8_group_scheme;

/** Layouts of the E8M0 scales of an operand with F non-contracted rows and K contraction indices
 *  (G = ceil(K/32) groups). */
typedef enum mxfp8_scale_layout {
    MXFP8_SCALES_COMPACT = 0,      /**< [F, G] row-major: scale of row f, group g at f*G + g. */
    MXFP8_SCALES_NKI_UNPACKED = 1, /**< NKI "quadrant" layout [ceil(K/4) rounded to 32-row quadrants, F]: group g of
                                        column f at row (g/4)*32 + g%4. Shape [ceil(G/4)*32, F]; unused rows zero. */
    MXFP8_SCALES_NKI_PACKED = 2,   /**< NKI packed layout [ceil(K/2048)*128, F]: group g at row
                                        (g/64)*128 + ((g%64)/16)*4 + ((g%16)/4)*32 + g%4; unused rows zero. */
    MXFP8_SCALES_SWIZZLE_128X4 = 3 /**< cuBLAS/CUTLASS block-scaled swizzle, flat [R'*C'] with R' = F rounded up to
                                        128, C' = G rounded up to 4: off(r,c) = ((r/128)*(C'/4) + c/4)*512 +
                                        (r%32)*16 + ((r%128)/32)*4 + c%4; padding zero. Viewed as [R', C']. */
} mxfp8_scale_layout;

#define MXFP8_MAX_DIMS 6

/** A non-owning tensor view. shape[i] >= 0; strides in elements (may be any sign, but every addressed element
 *  must lie inside the caller's buffer). Elements beyond ndim are ignored. */
typedef struct mxfp8_tensor {
    void *data;                      /**< first element; NULL marks an absent optional tensor */
    mxfp8_dtype dtype;
    int32_t ndim;                    /**< 0..MXFP8_MAX_DIMS (0 = scalar) */
    int64_t shape[MXFP8_MAX_DIMS];
    int64_t strides[MXFP8_MAX_DIMS]; /**< in elements */
} mxfp8_tensor;

/** An absent optional tensor. */
#define MXFP8_TENSOR_NONE ((mxfp8_tensor){0})

/** Make a contiguous row-major view of `data` with the given dtype and shape (ndim <= MXFP8_MAX_DIMS; extra
 *  dimensions are ignored). Never fails; validation happens at the call that uses the view. */
MXFP8_API mxfp8_tensor mxfp8_tensor_make(void *data, mxfp8_dtype dtype, int32_t ndim, const int64_t *shape);
/** Number of elements of a view (product of shape), or -1 if a dimension is negative or the product overflows. */
MXFP8_API int64_t mxfp8_tensor_numel(const mxfp8_tensor *t);

/* ------------------------------------------------------------------------------------------------------------ */
/* Scalar codecs (the executable specification; exact to the bit)                                                */
/* ------------------------------------------------------------------------------------------------------------ */
/** FP32 -> FP8 code. Round to nearest, ties to even; a finite value beyond max normal (including values that would
 *  round past it) saturates to +-max normal; NaN -> the format's canonical NaN (0x7F E4M3, 0x7E E5M2, sign kept);
 *  +-Inf -> NaN for E4M3 (which has no Inf; non-finite values are never hidden), +-Inf for E5M2. Subnormals are kept. [OCP §5.3, §6.3] */
MXFP8_API uint8_t mxfp8_fp32_to_fp8(float x, mxfp8_format fmt);
/** FP8 code -> FP32, exact. [OCP §5.3.2] */
MXFP8_API float mxfp8_fp8_to_fp32(uint8_t code, mxfp8_format fmt);
/** E8M0 code -> FP32 value 2^(code-127) (2^-127 is an FP32 subnormal, exact); 255 -> NaN. [OCP §5.4.1] */
MXFP8_API float mxfp8_e8m0_to_fp32(uint8_t code);
/** FP32 -> BF16 bits, round to nearest even (NaN stays NaN, quiet). */
MXFP8_API uint16_t mxfp8_fp32_to_bf16(float x);
/** BF16 bits -> FP32, exact. */
MXFP8_API float mxfp8_bf16_to_fp32(uint16_t bits);
/** FP32 -> IEEE FP16 bits, round to nearest even, overflow -> Inf (IEEE semantics). */
MXFP8_API uint16_t mxfp8_fp32_to_fp16(float x);
/** FP16 bits -> FP32, exact. */
MXFP8_API float mxfp8_fp16_to_fp32(uint16_t bits);

/** The shared exponent e (unbiased, in [-127, 127]) that `rule` gives a group of amax `amax` (>0, finite), and its
 *  E8M0 code e+127. amax == 0 gives code 0; a non-finite amax gives code 255. [OCP §6.3], [NKI-Q] */
MXFP8_API uint8_t mxfp8_scale_code(float amax, mxfp8_format fmt, mxfp8_scale_rule rule);

/* ------------------------------------------------------------------------------------------------------------ */
/* MX quantization                                                                                                */
/* ------------------------------------------------------------------------------------------------------------ */
/** Options of one quantization. */
typedef struct mxfp8_quant_params {
    mxfp8_format fmt;          /**< element format; default E4M3 */
    mxfp8_scale_rule rule;     /**< default MXFP8_SCALE_NKI */
    mxfp8_group_scheme group;  /**< default MXFP8_GROUP_1X32 */
} mxfp8_quant_params;

/** Defaults: E4M3, NKI rule, 1x32 groups. */
MXFP8_API mxfp8_quant_params mxfp8_quant_params_default(void);

/** MX-quantize `src` along `axis` [OCP §6.3, NKI-Q].
 *  src:    any rank >= 1, dtype F32, BF16 or F16, any strides.
 *  axis:   the quantization axis (the contraction axis of the consuming GEMM); negative counts from the end.
 *  data:   same shape as src, dtype E4M3 or E5M2 matching params->fmt (codes), any strides.
 *  scales: src's shape with shape[axis] replaced by G = ceil(shape[axis]/32), dtype E8M0 or U8 (codes), compact
 *          group order (for wrapX, group k0/32 + j of the tile at k0).
 *  Per group: amax over the group's values (the zero padding of a short last group never enters amax); all-zero
 *  group -> scale code 0 and zero elements; any NaN or +-Inf in the group -> scale code 255 and every element code
 *  NaN (E4M3 0x7F/0xFF, E5M2 0x7E/0xFE, keeping each sign); else e from `rule`, elements RNE(x * 2^-e), saturating.
 *  Errors: NULL_POINTER, INVALID_ARGUMENT (axis, enum values), DTYPE, SHAPE_MISMATCH, SIZE_OVERFLOW, ALIASING,
 *  UNSUPPORTED (wrapX with shape[axis] % 128 != 0). Uses AVX-512 when available (bit-identical to the reference). */
MXFP8_API mxfp8_status mxfp8_quantize(const mxfp8_tensor *src, int axis, const mxfp8_quant_params *params,
                                      mxfp8_tensor *data, mxfp8_tensor *scales);

/** Dequantize codes back to high precision: out[i] = fp8(data[i]) * 2^(scale-127), exact in FP32 (then rounded RNE
 *  to BF16/F16 when out is BF16/F16; FP8 * 2^e is always exact in BF16 unless it falls below BF16's range).
 *  data: codes, dtype E4M3 or E5M2; scales: as produced by mxfp8_quantize for (axis, group); out: data's shape,
 *  dtype F32, BF16 or F16. Scale code 255 gives NaN. Errors as mxfp8_quantize. [OCP §6.2] */
MXFP8_API mxfp8_status mxfp8_dequantize(const mxfp8_tensor *data, const mxfp8_tensor *scales, int axis,
                                        mxfp8_group_scheme group, mxfp8_tensor *out);

/* ------------------------------------------------------------------------------------------------------------ */
/* Scale layouts, x4 packing, NKI swizzle                                                                         */
/* ------------------------------------------------------------------------------------------------------------ */
/** The 2-D shape [rows, cols] of scales in `layout` for an operand of F non-contracted rows and K contraction
 *  indices (see mxfp8_scale_layout). Errors: INVALID_ARGUMENT (layout), SIZE_OVERFLOW (negative or overflowing). */
MXFP8_API mxfp8_status mxfp8_scale_layout_shape(mxfp8_scale_layout layout, int64_t F, int64_t K, int64_t shape[2]);

/** Convert compact scales [F, G] (dtype E8M0 or U8) into `layout`; `out` must have the shape given by
 *  mxfp8_scale_layout_shape(layout, F, K) with G = ceil(K/32) and dtype E8M0 or U8. Unused positions get 0.
 *  Errors: NULL_POINTER, INVALID_ARGUMENT, DTYPE, SHAPE_MISMATCH, ALIASING. [NKI-Q], cuBLAS docs. */
MXFP8_API mxfp8_status mxfp8_scales_to_layout(const mxfp8_tensor *compact, int64_t K, mxfp8_scale_layout layout,
                                              mxfp8_tensor *out);
/** Inverse of mxfp8_scales_to_layout: read scales in `layout` for an operand of F = compact->shape[0] rows and K
 *  contraction indices into compact [F, ceil(K/32)]. */
MXFP8_API mxfp8_status mxfp8_scales_from_layout(const mxfp8_tensor *in, int64_t K, mxfp8_scale_layout layout,
                                                mxfp8_tensor *compact);

/** Pack FP8 codes x4 along `axis`: in [..., L, ...] (E4M3/E5M2/U8) -> out [..., ceil(L/4), ...] U32 words, byte c of
 *  word p (least significant first) = element 4p+c, missing tail elements zero. Errors as mxfp8_quantize. [NKI-Q] */
MXFP8_API mxfp8_status mxfp8_pack_x4(const mxfp8_tensor *in, int axis, mxfp8_tensor *out);
/** Inverse of mxfp8_pack_x4; out's shape[axis] (L) says how many elements to keep. */
MXFP8_API mxfp8_status mxfp8_unpack_x4(const mxfp8_tensor *in, int axis, mxfp8_tensor *out);

/** NKI swizzle of an operand [K, F] (contraction axis K first, any dtype) into [K/4, 4F]: for each (sub)tile of the
 *  wrapX tiling at k0 with size P, S = P/4: out[k0/4 + p, 4f + s] = in[k0 + s*S + p, f]. Needs K % 128 == 0
 *  (UNSUPPORTED otherwise). [NKI-Q] */
MXFP8_API mxfp8_status mxfp8_swizzle_nki(const mxfp8_tensor *in, mxfp8_tensor *out);
/** Inverse of mxfp8_swizzle_nki: [K/4, 4F] -> [K, F]. */
MXFP8_API mxfp8_status mxfp8_unswizzle_nki(const mxfp8_tensor *in, mxfp8_tensor *out);

/* ------------------------------------------------------------------------------------------------------------ */
/* Runtime information                                                                                            */
/* ------------------------------------------------------------------------------------------------------------ */
typedef enum mxfp8_isa {
    MXFP8_ISA_SCALAR = 0,  /**< portable C reference kernels */
    MXFP8_ISA_AVX512 = 1,  /**< AVX-512F/BW (+ AVX512-BF16 for GEMM when present) */
    MXFP8_ISA_AMX = 2      /**< AMX-BF16 tiles for GEMM, AVX-512 for quantization */
} mxfp8_isa;

typedef struct mxfp8_info {
    int has_avx512f, has_avx512bw, has_avx512vl, has_avx512_bf16, has_amx_tile, has_amx_bf16;
    int amx_permitted;            /**< arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) succeeded */
    mxfp8_isa isa;                /**< the ISA path in use (after MXFP8_ISA and CPU checks) */
    const char *isa_name;         /**< "scalar", "avx512", "amx" */
    const char *isa_reason;       /**< why this path was chosen, e.g. "MXFP8_ISA=scalar" or "cpu lacks AMX" */
    int num_threads;              /**< threads a call will use */
} mxfp8_info;

/** Set the number of threads every later call uses, process-wide (0 = back to MXFP8_NUM_THREADS / OMP_NUM_THREADS /
 *  all cores). Results never depend on it. Errors: INVALID_ARGUMENT (negative). */
MXFP8_API mxfp8_status mxfp8_set_num_threads(int num_threads);

/** Fill *info with CPU features and the chosen ISA path. Errors: NULL_POINTER. */
MXFP8_API mxfp8_status mxfp8_get_info(mxfp8_info *info);

/* ------------------------------------------------------------------------------------------------------------ */
/* Block-scaled GEMM and matmul_mxfp8 (seed page [NKI-M])                                                         */
/* ------------------------------------------------------------------------------------------------------------ */
/** Loop orders (tile_loop_order / block_loop_order). Speed only. */
typedef enum mxfp8_loop_order {
    MXFP8_LOOP_MNK = 0, MXFP8_LOOP_MKN = 1, MXFP8_LOOP_NMK = 2,
    MXFP8_LOOP_NKM = 3, MXFP8_LOOP_KMN = 4, MXFP8_LOOP_KNM = 5
} mxfp8_loop_order;

/** One operand of a block-scaled GEMM, logically [R, K] with the contraction axis K LAST (use strides for a
 *  transposed operand). Either high precision (values dtype F32/BF16/F16; scales absent), quantized on the fly along
 *  K, or pre-quantized (values dtype E4M3/E5M2 codes, or U32 x4-packed codes [R, ceil(K/4)]; scales present). */
typedef struct mxfp8_operand {
    mxfp8_tensor values;
    mxfp8_tensor scales;             /**< E8M0/U8 scales of a pre-quantized operand, in scale_layout; else absent */
    mxfp8_scale_layout scale_layout; /**< layout of `scales` (F = R rows, K contraction indices) */
    int swizzled;                    /**< 1: values are given in NKI's swizzled [K/4, 4R] arrangement (see
                                          mxfp8_swizzle_nki; K % 128 == 0); the view is then [K/4, 4R] */
} mxfp8_operand;

/** MatmulMxfp8KernelConfig [NKI-M]. On a CPU, tiles and blocks are cache blocking; run_with_lnc2/lnc_2_shard_rhs
 *  choose whether threads split the output along N (shard_rhs) or M; spill_reload keeps quantized operand blocks in
 *  a workspace for reuse instead of quantizing again. Every field is speed-only except float8_dtype, quant_scheme,
 *  scale_rule and output_dtype. 0 (or -1 where noted) means "auto-resolve". */
typedef struct mxfp8_matmul_config {
    int64_t M, K, N;                 /**< 0 = from the tensors; if set, must match them */
    int64_t tile_m, tile_k, tile_n;  /**< 0 = auto */
    int64_t tiles_in_block_m, tiles_in_block_n, tiles_in_block_k; /**< TILES_IN_BLOCK_*; 0 = auto */
    int64_t tiles_in_load_m, tiles_in_load_n;                     /**< TILES_IN_LOAD_*; 0 = auto */
    mxfp8_loop_order block_loop_order, tile_loop_order;           /**< default MNK */
    mxfp8_format float8_dtype;       /**< element format */
    int enable_scale_packing;        /**< pre-quantized scales are in NKI packed layout */
    int run_with_lnc2;               /**< split the work between threads (default 1) */
    int lnc_2_shard_rhs;             /**< 1: split along N; 0: along M; -1: auto (N if N >= M) */
    int spill_reload;                /**< keep quantized operand blocks in a workspace */
    mxfp8_group_scheme quant_scheme; /**< default 1X32 (NKI's default wrapX needs K % 128 == 0) */
    mxfp8_scale_rule scale_rule;     /**< ours: default NKI */
    mxfp8_dtype output_dtype;        /**< BF16 (default), F16 or F32 */
} mxfp8_matmul_config;

/** Fill a config with defaults: everything auto, MNK orders, E5M2, run_with_lnc2 = 1, lnc_2_shard_rhs = -1,
 *  spill_reload = 0, 1x32, NKI rule, BF16 output. */
MXFP8_API void mxfp8_matmul_config_init(mxfp8_matmul_config *config);

/** Block-scaled GEMM: C[M, N] (=|+=) sum_k deq(A)[m, k] * deq(B)[n, k] [OCP §6], [NKI-Q nc_matmul_mx].
 *  a: A [M, K], b: B [N, K], both with the contraction axis K LAST (any strides: pass a transposed view for a [K, R]
 *  tensor). Each operand is high precision (F32/BF16/F16: MX-quantized on the fly along K with config->float8_dtype,
 *  scale_rule, quant_scheme, then dequantized exactly) or pre-quantized (E4M3/E5M2/U8 codes [R, K], or U32 x4-packed
 *  codes [R, ceil(K/4)], with scales in scale_layout for F = R rows). swizzled: values are NKI's [K/4, 4R] (x4:
 *  [K/4, R]) arrangement. For x4-packed plain operands K is config->K when set, else the other operand's K, else
 *  4 * words.
 *  Arithmetic: every dequantized value is exact in FP32; each C element is acc = fmaf(a_k, b_k, acc) over k ascending
 *  from +0 (one rounding per step), then rounded once (RNE) to c's dtype, or, with accumulate != 0, C = C + acc (C F32).
 *  The result is bitwise independent of tiles, loop orders, shard axis, spill_reload, thread count and ISA path.
 *  c: [M, N] F32/BF16/F16, any strides that address distinct elements; its dtype decides the output type
 *  (config->output_dtype is not consulted here). Every element of c is written (M, N, K >= 0; K = 0 gives zeros).
 *  config: NULL = mxfp8_matmul_config_init defaults; M/K/N when nonzero must match the operands.
 *  Errors: NULL_POINTER (a, b, c, a view, codes without scales), DTYPE (bad dtype, codes of the other FP8 format,
 *  accumulate into non-F32), SHAPE_MISMATCH (K, scales shape, c shape, config M/K/N), INVALID_ARGUMENT (config enums,
 *  negative config sizes, scales given with a high-precision operand), UNSUPPORTED (wrapX or swizzled with
 *  K % 128 != 0), BAD_STRIDES (c's elements overlap), SIZE_OVERFLOW, ALIASING (c overlaps an input), OUT_OF_MEMORY.
 *  Thread-safe; uses mxfp8_set_num_threads threads. */
MXFP8_API mxfp8_status mxfp8_gemm(const mxfp8_operand *a, const mxfp8_operand *b, const mxfp8_matmul_config *config,
                                  int accumulate, mxfp8_tensor *c);

/** Forward Y[M, N] = X[M, K] @ W[N, K]^T, both quantized along K. config may be NULL (defaults).
 *  Errors as mxfp8_gemm. */
MXFP8_API mxfp8_status mxfp8_matmul(const mxfp8_operand *input_activation, const mxfp8_operand *weights,
                                    const mxfp8_matmul_config *config, mxfp8_tensor *output);

/** All parameters of matmul_mxfp8_backward [NKI-M], with the seed page's names. */
typedef struct mxfp8_matmul_bwd_args {
    mxfp8_tensor output_grad;        /**< dY [M, N]: F32/BF16/F16, or E4M3/E5M2 codes when output_grad_scales given */
    mxfp8_tensor weights;            /**< W [N, K] (contraction axis of dX = N): high precision or codes */
    mxfp8_tensor input_activation;   /**< X [M, K] (contraction axis of dW = M): high precision or codes */
    const mxfp8_matmul_config *input_grad_config;  /**< dX phase config; NULL = auto-resolved */
    const mxfp8_matmul_config *weight_grad_config; /**< dW phase config; NULL = auto-resolved */
    mxfp8_loop_order tile_loop_order;  /**< default MNK */
    mxfp8_format float8_dtype;         /**< default E5M2 (the seed's "float8_e5m2") */
    mxfp8_dtype output_dtype;          /**< default BF16 */
    int run_with_lnc2;                 /**< default 1 */
    int lnc_2_shard_rhs;               /**< default 1 */
    mxfp8_tensor output_grad_scales;   /**< dY pre-quantized along N (see below); absent = quantize on the fly */
    mxfp8_tensor weight_scales;        /**< W pre-quantized along N: scales for F = K rows, contraction N */
    mxfp8_tensor input_scales;         /**< X pre-quantized along M: scales for F = K rows, contraction M */
    int use_scale_packing;             /**< pre-quantized scales are in NKI packed layout (else scale_layout) */
    mxfp8_scale_layout scale_layout;   /**< ours: layout of pre-quantized scales when !use_scale_packing */
    int spill_reload;                  /**< default 0 */
    int output_grad_is_swizzled, weights_is_swizzled, input_is_swizzled; /**< NKI swizzled operands */
    mxfp8_scale_rule scale_rule;       /**< ours: default NKI */
    mxfp8_group_scheme quant_scheme;   /**< ours: default 1X32 */
} mxfp8_matmul_bwd_args;

/** Defaults of the seed page: all tensors absent, MNK, E5M2, BF16, lnc2 on, shard_rhs on, no pre-quantization. */
MXFP8_API void mxfp8_matmul_bwd_args_init(mxfp8_matmul_bwd_args *args);

/** matmul_mxfp8_backward [NKI-M]: input_grad dX[M, K] = dY[M, N] @ W[N, K] (dY and W quantized along N);
 *  weight_grad dW[N, K] = dY^T @ X[M, K] (dY and X quantized along M). dY is quantized twice, each time from high
 *  precision. When dY is given pre-quantized (codes quantized along N + output_grad_scales), the dW phase
 *  re-quantizes along M from its exact dequantized values, the highest precision available.
 *  input_grad / weight_grad: F32, BF16 or F16 views (dtype decides; output_dtype must agree). Any M, N, K >= 0.
 *  Errors: as mxfp8_gemm; INVALID_ARGUMENT for an unknown float8_dtype/loop order. */
MXFP8_API mxfp8_status mxfp8_matmul_backward(const mxfp8_matmul_bwd_args *args, mxfp8_tensor *input_grad,
                                             mxfp8_tensor *weight_grad);

/** Golden references for matmul (GEMM with contraction axis last on both operands).
 *  mxfp8_gemm_golden_unquantized: C = A @ B^T from the high-precision operands (each rounded to BF16 first when
 *  round_to_bf16 != 0), FP32 accumulation, C F32. mxfp8_gemm_golden_quantized: both operands quantized with
 *  `params` along K, dequantized exactly, accumulated in FP64; C F64 or F32. */
MXFP8_API mxfp8_status mxfp8_gemm_golden_unquantized(const mxfp8_tensor *a, const mxfp8_tensor *b, int round_to_bf16,
                                                     mxfp8_tensor *c);
MXFP8_API mxfp8_status mxfp8_gemm_golden_quantized(const mxfp8_tensor *a, const mxfp8_tensor *b,
                                                   const mxfp8_quant_params *params, mxfp8_tensor *c);

/** NKI pass criteria of a kernel output k against a golden g (same numel, F32/F64/BF16/F16). */
typedef struct mxfp8_compare_result {
    double max_abs_golden;       /**< max |g| */
    double max_abs_err;          /**< max |k - g| */
    double max_rel_err;          /**< max |k - g| / max(|g|) */
    double cosine;               /**< <k,g> / (|k| |g|) (1 if both are zero) */
    double norm_euclid;          /**< |k - g| / (|k| + |g|) (0 if both are zero) */
    int allclose;                /**< all |k - g| <= atol + rtol*|g| with atol = atol_frac*max|g| */
    int64_t num_nan;             /**< NaNs in k */
} mxfp8_compare_result;
MXFP8_API mxfp8_status mxfp8_compare(const mxfp8_tensor *kernel, const mxfp8_tensor *golden, double atol_frac,
                                     double rtol, mxfp8_compare_result *result);

/* ------------------------------------------------------------------------------------------------------------ */
/* Blockwise MoE (seed page [NKI-E])                                                                              */
/* ------------------------------------------------------------------------------------------------------------ */
typedef enum mxfp8_activation {
    MXFP8_ACT_SILU = 0,         /**< x * sigmoid(x) (default) */
    MXFP8_ACT_SWISH = 1,        /**< x * sigmoid(1.702 x) */
    MXFP8_ACT_SQUARED_RELU = 2  /**< max(x, 0)^2 */
} mxfp8_activation;

typedef enum mxfp8_affinity_option {
    MXFP8_AFFINITY_ON_I = 0,    /**< affinity scales the intermediate (default) */
    MXFP8_AFFINITY_ON_H = 1     /**< affinity scales the hidden-size output */
} mxfp8_affinity_option;

/** Number of blocks N = ceil((T*K - (E-1)) / B) + E - 1 (at least E... see mxfp8_moe_route) for T tokens, top-K,
 *  E experts and block size B. Errors: INVALID_ARGUMENT (E < 1, B < 1, K < 1), SIZE_OVERFLOW. */
MXFP8_API mxfp8_status mxfp8_moe_num_blocks(int64_t T, int64_t top_k, int64_t num_experts, int64_t block_size,
                                            int64_t *num_blocks);

/** Router helper: from topk_ids [T, K] (I32, each in [0, E), distinct per row) and topk_weights [T, K] (F32/BF16/F16)
 *  build token_position_to_id [N*B] I32, block_to_expert [N] or [N, 1] I32 and expert_affinities_masked [T*E, 1]
 *  (F32/BF16; a[t*E+e] = weight of e in row t, 0 if unrouted). Each expert gets ceil(count/B) blocks in expert order,
 *  its tokens ascending, padded with `padding_id` (-1, or T for the zero-row convention); leftover blocks are all
 *  padding and assigned to expert E-1 (the upstream test convention). N from mxfp8_moe_num_blocks.
 *  Errors: NULL_POINTER, DTYPE, SHAPE_MISMATCH, INDEX_OUT_OF_RANGE (expert id), INVALID_ARGUMENT (duplicate ids in a
 *  row, padding_id not -1 or T, E or B < 1). */
MXFP8_API mxfp8_status mxfp8_moe_route(const mxfp8_tensor *topk_ids, const mxfp8_tensor *topk_weights,
                                       int64_t num_experts, int64_t block_size, int32_t padding_id,
                                       mxfp8_tensor *token_position_to_id, mxfp8_tensor *block_to_expert,
                                       mxfp8_tensor *expert_affinities_masked);

/** MXFP8MOEBwdConfig [NKI-E] (also used by the forward). Clamp limits: -INFINITY / +INFINITY mean "None". */
typedef struct mxfp8_moe_config {
    mxfp8_dtype compute_dtype;           /**< BF16 (default) or F32: dtype of gathered operands before quantization */
    mxfp8_format quant_dtype;            /**< E4M3 (default) or E5M2 */
    mxfp8_scale_rule scale_rule;         /**< ours; default NKI */
    mxfp8_activation activation;         /**< default SiLU */
    int shard_option;                    /**< hardware-only (SHARD_ON_FREE=0 ...): accepted, no effect on results */
    mxfp8_affinity_option affinity_option;
    mxfp8_matmul_config phase1, phase2, phase3, phase4; /**< per-phase configs (blocking; speed only) */
    int p3_transpose_mode, p4_transpose_mode;           /**< hardware-only: accepted, no effect on results */
    int hidden_states_swizzle_mode, output_grad_swizzle_mode, weight_swizzle_mode; /**< hardware-only: no effect */
    float gate_clamp_lower, gate_clamp_upper, up_clamp_lower, up_clamp_upper; /**< +-INFINITY = no limit */
    int skip_token;                      /**< SkipMode.skip_token: 1 = padding id is -1 (default); 0 = padding id T */
    int skip_weight;                     /**< SkipMode.skip_weight: hardware-only, no effect on results */
    int accumulate_hidden_states_grad;   /**< add into hidden_states_grad instead of overwriting it */
    int skip_grad_initialization;        /**< weight/bias grads are NOT zeroed first: accumulate into them */
    int single_expert_dense;             /**< E = 1 dense layout: T % B == 0, N = T/B, identity routing */
    int bias;                            /**< biases present; bias grads returned */
    int use_fast_dma;                    /**< hardware-only: no effect on results */
} mxfp8_moe_config;

/** Defaults of MXFP8MOEBwdConfig(): BF16 compute, E4M3, NKI rule, SiLU, AFFINITY_ON_I, phase configs from
 *  mxfp8_matmul_config_init (with E4M3), no clamp limits, skip_token = 1, all flags 0. */
MXFP8_API void mxfp8_moe_config_init(mxfp8_moe_config *config);

/** Forward of the blockwise MoE layer (the pass that produces the backward's checkpoints). */
typedef struct mxfp8_moe_fwd_args {
    mxfp8_tensor hidden_states;            /**< X [T, H], F32/BF16/F16 */
    mxfp8_tensor expert_affinities_masked; /**< a [T*E, 1] (or [T*E]), F32/BF16/F16 */
    mxfp8_tensor gate_up_proj_weight;      /**< W1 [E, H, 2, I]: high precision, or codes with scales */
    mxfp8_tensor down_proj_weight;         /**< W2 [E, I, H]: high precision, or codes with scales */
    mxfp8_tensor token_position_to_id;     /**< [N*B] I32; padding -1 (skip_token) or T */
    mxfp8_tensor block_to_expert;          /**< [N] or [N, 1] I32 */
    int64_t block_size;                    /**< B >= 1 */
    mxfp8_tensor gate_and_up_proj_bias;    /**< b1 [E, 2, I] (config->bias) */
    mxfp8_tensor down_proj_bias;           /**< b2 [E, H] (config->bias) */
    const mxfp8_moe_config *config;        /**< NULL = defaults */
    mxfp8_tensor gate_up_weight_scales;    /**< W1 pre-quantized along H: compact [E, 2, I, ceil(H/32)] */
    mxfp8_tensor down_weight_scales;       /**< W2 pre-quantized along I (fwd) -- see mxfp8_moe_backward */
    mxfp8_tensor num_valid_tokens;         /**< [1] I32; requires single_expert_dense */
} mxfp8_moe_fwd_args;

typedef struct mxfp8_moe_fwd_outputs {
    mxfp8_tensor output;                           /**< [T, H] F32/BF16/F16, required */
    mxfp8_tensor gate_up_proj_act_checkpoint_T;    /**< [N, 2, I, B]: clamped g at [n,0], u at [n,1]; optional */
    mxfp8_tensor gate_act_checkpoint_T;            /**< [N, I, B]: act(g); optional */
    mxfp8_tensor intermediate_checkpoint_T;        /**< [N, I, B]: act(g) * u; optional */
    mxfp8_tensor scaled_intermediate_checkpoint_T; /**< [N, I, B]: a * act(g) * u; optional */
    mxfp8_tensor down_proj_output_checkpoint;      /**< ours, [N, B, H]: inter @ W2 + b2 before the affinity;
                                                        read by the AFFINITY_ON_H backward for the affinity grad */
} mxfp8_moe_fwd_outputs;

MXFP8_API mxfp8_status mxfp8_moe_forward(const mxfp8_moe_fwd_args *args, mxfp8_moe_fwd_outputs *outputs);

/** All parameters of blockwise_mm_bwd_mxfp8 [NKI-E] with the seed page's names (+ optional biases, ours). */
typedef struct mxfp8_moe_bwd_args {
    mxfp8_tensor hidden_states;                    /**< X [T, H] */
    mxfp8_tensor expert_affinities_masked;         /**< a [T*E, 1] */
    mxfp8_tensor gate_up_proj_weight;              /**< W1 [E, H, 2, I] */
    mxfp8_tensor down_proj_weight;                 /**< W2 [E, I, H] */
    mxfp8_tensor token_position_to_id;             /**< [N*B] I32 */
    mxfp8_tensor block_to_expert;                  /**< [N] or [N, 1] I32 */
    mxfp8_tensor output_hidden_states_grad;        /**< dY [T, H] */
    int64_t block_size;                            /**< B >= 1 (upstream 128..4096; any here) */
    mxfp8_tensor gate_up_proj_act_checkpoint_T;    /**< [N, 2, I, B] optional: recomputed from X, W1 when absent */
    mxfp8_tensor gate_act_checkpoint_T;            /**< [N, I, B] optional */
    mxfp8_tensor intermediate_checkpoint_T;        /**< [N, I, B] optional */
    mxfp8_tensor scaled_intermediate_checkpoint_T; /**< [N, I, B] optional */
    mxfp8_tensor down_proj_act_checkpoint;         /**< [N, B, H] optional: a * dY[t] (AFFINITY_ON_H) */
    mxfp8_tensor down_proj_output_checkpoint;      /**< ours, [N, B, H] optional: inter @ W2 + b2 (AFFINITY_ON_H) */
    mxfp8_tensor gate_and_up_proj_bias;            /**< ours, b1 [E, 2, I] (config->bias) */
    mxfp8_tensor down_proj_bias;                   /**< ours, b2 [E, H] (config->bias) */
    const mxfp8_moe_config *config;                /**< NULL = defaults */
    mxfp8_tensor gate_up_weight_scales;            /**< W1 codes' scales (see the .c doc) */
    mxfp8_tensor down_weight_scales;               /**< W2 codes' scales */
    mxfp8_tensor num_valid_tokens;                 /**< [1] I32; requires single_expert_dense */
} mxfp8_moe_bwd_args;

typedef struct mxfp8_moe_bwd_grads {
    mxfp8_tensor hidden_states_grad;          /**< [T, H] */
    mxfp8_tensor expert_affinities_masked_grad; /**< [T*E, 1] */
    mxfp8_tensor gate_up_proj_weight_grad;    /**< [E, H, 2, I] */
    mxfp8_tensor down_proj_weight_grad;       /**< [E, I, H] */
    mxfp8_tensor gate_and_up_proj_bias_grad;  /**< [E, 2, I] when config->bias */
    mxfp8_tensor down_proj_bias_grad;         /**< [E, H] when config->bias */
} mxfp8_moe_bwd_grads;

MXFP8_API mxfp8_status mxfp8_moe_backward(const mxfp8_moe_bwd_args *args, mxfp8_moe_bwd_grads *grads);

#ifdef __cplusplus
}
#endif
#endif /* MXFP8_H */
