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
 *    (not bytes). Row-major contiguous views are made with mxfp8_tensor_make(). Every view is checked: extents >= 0
 *    (else SIZE_OVERFLOW, as for an overflowing element count), the byte span its strides address must fit in
 *    int64 (else BAD_STRIDES); an OUTPUT view must also address distinct elements (no zero stride over an extent
 *    > 1, no interleaved dimensions: sorted by |stride|, each stride exceeds the span of the smaller ones), else
 *    BAD_STRIDES. Inputs may repeat elements (e.g. zero strides for broadcasting).
 *  - An optional tensor argument is "absent" when its data pointer is NULL (use MXFP8_TENSOR_NONE).
 *  - All functions are thread-safe: any number of threads may call the library at once on separate buffers.
 *  - Results never depend on the thread count, the ISA path chosen for quantization, or any speed-only knob
 *    (tile sizes, loop orders, sharding, spill/reload): they are bitwise reproducible.
 *  - Nor on the caller's MXCSR (x86's floating-point control: flush-to-zero, denormals-are-zero, rounding mode, as
 *    torch.set_flush_denormal or fast-math start-up code set them, on the calling thread or on OpenMP's): the
 *    quantizers, the GEMMs of every layer, the router, the bias gradient and the MoE forward, backward and goldens
 *    run under IEEE defaults (round to nearest even, subnormals kept) on every thread, and restore the caller's
 *    control bits on return.
 *  - Threads: OpenMP. MXFP8_NUM_THREADS, else OMP_NUM_THREADS, else all cores; clamped to MXFP8_MAX_THREADS (4096).
 *    An MXFP8_NUM_THREADS that is not a whole positive decimal integer ("abc", "-2", "0") is ignored, as if unset
 *    (`mxfp8 info` says so). MXFP8_ISA=scalar|avx512|amx forces
 *    an ISA path (falling back, with mxfp8_info() saying so, when the CPU lacks it).
 *
 * Hardware-only knobs
 * -------------------
 * The NKI pages describe Trainium kernels; some of their parameters steer that hardware only (DMA engines, SBUF
 * tiling, the two NeuronCores of an LNC2 pair). Wherever the NKI names require it they are accepted with their
 * names and value ranges, validated (an out-of-range value is INVALID_ARGUMENT), and have no effect on any result:
 *   mxfp8_matmul_config: tiles_in_block_k, tiles_in_load_m, tiles_in_load_n (tile_*, tiles_in_block_m/n, the loop
 *     orders, run_with_lnc2, lnc_2_shard_rhs and spill_reload become CPU cache blocking and thread split: speed only);
 *   mxfp8_moe_config: shard_option, p3_transpose_mode, p4_transpose_mode, hidden_states_swizzle_mode,
 *     output_grad_swizzle_mode, weight_swizzle_mode, skip_weight, use_fast_dma (grouped at the end of the struct);
 *     the per-phase matmul configs phase1..phase4 set blocking only.
 *
 * Stability
 * ---------
 * Everything above the section "Reference and test entry points" at the end of this header is the stable API.
 * That last section (golden references, the NKI pass criteria) is compiled only when MXFP8_REFERENCE_API is defined
 * before including this header; its functions exist in every build but carry no ABI promise.
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
/* Enumeration names                                                                                              */
/* ------------------------------------------------------------------------------------------------------------ */
/** The enumerations whose values have names. Every value of each is 0 .. count - 1 (the header's values); its names
 *  are the ones the CLI, the Python package and the PyTorch layer accept, so parse and print them with the
 *  functions below rather than with a copy of the list.
 *
 *  | enumeration                 | C type                 | canonical names (aliases)                           |
 *  |-----------------------------|------------------------|-----------------------------------------------------|
 *  | MXFP8_ENUM_FORMAT           | mxfp8_format           | e4m3, e5m2 (quantize's spelling)                    |
 *  | MXFP8_ENUM_FLOAT8_DTYPE     | mxfp8_format           | float8_e4m3fn, float8_e5m2 (the NKI pages'          |
 *  |                             |                        | float8_dtype; matched case-sensitively)             |
 *  | MXFP8_ENUM_SCALE_RULE       | mxfp8_scale_rule       | nki, ocp, rceil                                     |
 *  | MXFP8_ENUM_GROUP_SCHEME     | mxfp8_group_scheme     | 1x32, wrapx                                         |
 *  | MXFP8_ENUM_SCALE_LAYOUT     | mxfp8_scale_layout     | compact, nki_unpacked (nki-unpacked), nki_packed    |
 *  |                             |                        | (nki-packed), swizzle_128x4 (swizzle128x4,          |
 *  |                             |                        | swizzle-128x4)                                      |
 *  | MXFP8_ENUM_ROUNDING         | mxfp8_rounding         | nearest, stochastic                                 |
 *  | MXFP8_ENUM_ACTIVATION       | mxfp8_activation       | silu, swish, squared_relu (squaredrelu, relu2),     |
 *  |                             |                        | gpt_oss_swiglu                                      |
 *  | MXFP8_ENUM_AFFINITY_OPTION  | mxfp8_affinity_option  | affinity_on_i (on_i, i), affinity_on_h (on_h, h)    |
 *  | MXFP8_ENUM_LOOP_ORDER       | mxfp8_loop_order       | mnk, mkn, nmk, nkm, kmn, knm                        |
 *  | MXFP8_ENUM_DTYPE            | mxfp8_dtype            | f32 (float32), bf16 (bfloat16), f16 (float16),      |
 *  |                             |                        | e4m3, e5m2, e8m0, u8 (uint8), i32 (int32),          |
 *  |                             |                        | f64 (float64), u32 (uint32)                         |
 *  | MXFP8_ENUM_MOE_OPERAND      | mxfp8_moe_operand      | gemm1_x, gemm1_w1, gemm2_inter, gemm2_w2, p1_dy,    |
 *  |                             |                        | p1_w2, p2_dgu, p2_w1, p3_x, p3_dgu, p4_s, p4_dy     |
 *
 *  Names compare case-insensitively (ASCII), except float8_dtype's, which are exactly the NKI pages' strings. The
 *  two format spellings do not mix: "e4m3" is not a float8 dtype name and "float8_e4m3fn" is not a format name; the
 *  error message then says how the parameter spells it. */
typedef enum mxfp8_enum {
    MXFP8_ENUM_FORMAT = 0,
    MXFP8_ENUM_FLOAT8_DTYPE = 1,
    MXFP8_ENUM_SCALE_RULE = 2,
    MXFP8_ENUM_GROUP_SCHEME = 3,
    MXFP8_ENUM_SCALE_LAYOUT = 4,
    MXFP8_ENUM_ROUNDING = 5,
    MXFP8_ENUM_ACTIVATION = 6,
    MXFP8_ENUM_AFFINITY_OPTION = 7,
    MXFP8_ENUM_LOOP_ORDER = 8,
    MXFP8_ENUM_DTYPE = 9,
    MXFP8_ENUM_MOE_OPERAND = 10,
    MXFP8_NUM_ENUMS = 11
} mxfp8_enum;

/** Number of values of enumeration `e` (values 0 .. count - 1); -1 if `e` is not a mxfp8_enum. */
MXFP8_API int32_t mxfp8_enum_count(mxfp8_enum e);
/** Canonical name of `value` in enumeration `e` (a static string, lower case); NULL if `e` is unknown or `value` is
 *  outside 0 .. count - 1. */
MXFP8_API const char *mxfp8_enum_name(mxfp8_enum e, int32_t value);
/** The i-th accepted alias (i = 0, 1, ...) of `value` in enumeration `e`, or NULL past the last one (or for an unknown
 *  `e`, `value` or a negative i). */
MXFP8_API const char *mxfp8_enum_alias(mxfp8_enum e, int32_t value, int32_t i);
/** The definition of `value` of enumeration `e` in one line, for help texts ("OCP MX v1.0 6.3: floor(log2 amax) -
 *  emax; ..."; a static string, "" where the table gives none: loop orders, dtypes, MoE operands); NULL if `e` is
 *  unknown or `value` is outside 0 .. count - 1. */
MXFP8_API const char *mxfp8_enum_doc(mxfp8_enum e, int32_t value);
/** What enumeration `e` is, in words for messages ("scale rule", "float8 dtype", ...); NULL if unknown. */
MXFP8_API const char *mxfp8_enum_what(mxfp8_enum e);
/** Parse `name` (a canonical name or an alias; see the table above for the case rule) into *value.
 *  Errors: NULL_POINTER (name or value NULL), INVALID_ARGUMENT (e unknown, or no such name; *value untouched). The
 *  message of an unknown name lists the canonical names: "unknown value 'floor' (expected nki, ocp or rceil)", and
 *  for a name of the other format spelling adds "; this parameter spells e4m3 as float8_e4m3fn". Callers prefix
 *  their parameter's name (the CLI "--scale-rule: ", Python "scale_rule: "). */
MXFP8_API mxfp8_status mxfp8_enum_from_name(mxfp8_enum e, const char *name, int32_t *value);

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
/** Name of a dtype (its canonical name of MXFP8_ENUM_DTYPE: "f32", "bf16", ...); "?" if unknown. */
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
/* Values near FLT_MAX. The MX value of an element is X = S * P [OCP §6.3], S = 2^e its group's scale and P its FP8
 * value, and every consumer of this library computes X in FP32, so X must stay finite. Under the nki rule (which
 * targets P in [2^(emax-1), 2^emax)) and the rceil rule, a group whose amax lies in the top FP32 binade gets the top
 * scale, e = 120 (E4M3, E8M0 code 247) or e = 113 (E5M2, code 240), and an element that rounds up to 2^emax (256
 * resp. 2^15: a valid FP8 value) would give X = 2^128 = +-inf. Such elements, and only those, are clamped to the
 * largest FP8 value whose product with that scale is finite: 240 (code 0x77, X = 1.875 * 2^127) for E4M3, 28672
 * (code 0x77, X = 1.75 * 2^127) for E5M2, under nearest and stochastic rounding alike, and they count as `saturated`
 * in the statistics. Equivalently: |x| is clamped to 240 * 2^120 resp. 1.75 * 2^127 before scaling, which leaves
 * every element of every other group (and every OCP result, whose top scale is 2^119 resp. 2^112) unchanged. No
 * finite input element quantizes to a non-finite dequantized value. */

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

/** Make a contiguous row-major view of `data` with the given dtype and shape (0 <= ndim <= MXFP8_MAX_DIMS). Never
 *  fails; validation happens at the call that uses the view: an ndim outside that range is kept as given (with no
 *  extent read), so that call returns MXFP8_ERR_INVALID_ARGUMENT naming the view. */
MXFP8_API mxfp8_tensor mxfp8_tensor_make(void *data, mxfp8_dtype dtype, int32_t ndim, const int64_t *shape);
/** Number of elements of a view (product of shape), or -1 if a dimension is negative or the product overflows. */
MXFP8_API int64_t mxfp8_tensor_numel(const mxfp8_tensor *t);

/* ------------------------------------------------------------------------------------------------------------ */
/* Scalar codecs (the executable specification; exact to the bit)                                                */
/* ------------------------------------------------------------------------------------------------------------ */
/** FP32 -> FP8 code. Round to nearest, ties to even; a finite value beyond max normal (including values that would
 *  round past it) saturates to +-max normal; NaN -> the format's canonical NaN (0x7F E4M3, 0x7E E5M2, sign kept);
 *  +-Inf -> NaN for E4M3 (which has no Inf; non-finite values are never hidden), +-Inf for E5M2. Subnormals are kept. [OCP §5.3, §6.3]
 *  These scalar codecs have no error channel: an unknown fmt (not E4M3 / E5M2) gives the code 0xFF, a NaN in both
 *  formats, and mxfp8_fp8_to_fp32 gives NaN. */
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
 *  E8M0 code e+127. amax == 0 gives code 0; a non-finite amax gives code 255. An unknown fmt or rule (no error
 *  channel) gives 255, the E8M0 NaN. [OCP §6.3], [NKI-Q] */
MXFP8_API uint8_t mxfp8_scale_code(float amax, mxfp8_format fmt, mxfp8_scale_rule rule);

/* ------------------------------------------------------------------------------------------------------------ */
/* MX quantization                                                                                                */
/* ------------------------------------------------------------------------------------------------------------ */
/*
 * Stochastic rounding
 * -------------------
 * An alternative to round-to-nearest-even for the ELEMENTS (the scale rules are unchanged), for gradients: the
 * quantized value is unbiased, E[q] = x up to 2^-32 of an ulp. For an element x of a finite group with shared
 * exponent e, let y = x * 2^-e (the FP32 product, as for nearest), |y| saturated to max normal, ulp the FP8 spacing at
 * max(floor(log2 |y|), emin) (emin = -6 for E4M3, -14 for E5M2: subnormals have the spacing of the lowest binade),
 * lo = floor(|y| / ulp) * ulp and F = floor(2^32 * (|y| - lo) / ulp), an integer in [0, 2^32). The element becomes
 * sign(x) * (lo + ulp) if r < F, else sign(x) * lo, where r is the element's 32-bit random word; so it rounds up with
 * probability F / 2^32 and a value on the FP8 grid never moves. All-zero and NaN/Inf groups are as for nearest.
 * The word comes from the counter-based generator Philox-4x32-10 (Salmon et al., SC 2011; the Random123 algorithm,
 * key bumped by (0x9E3779B9, 0xBB67AE85) before rounds 2..10), keyed by the seed and the stream id and indexed by the
 * element's logical index i (defined by each entry point: for mxfp8_quantize the row-major index of the element in
 * src's shape):
 *     counter = (lo32(i >> 2), hi32(i >> 2), lo32(stream), hi32(stream)),  key = (lo32(seed), hi32(seed)),
 *     r = Philox-4x32-10(counter, key)[i & 3]          (word 0 is the first output word).
 * Results depend only on (seed, stream, index, value): the same bits for any thread count, tiling and ISA path. Use a
 * fresh seed (or stream) per training step and per tensor. Cost: one Philox call (10 rounds of two 32x32-bit
 * multiplies) per four elements. Measured on one Zen 4 core (4096 x 4096, AVX-512): about 0.8 ns per element along
 * rows and 0.95 along columns, 2.5-3.8x nearest rounding of FP32 input and 7-8x the dedicated BF16 -> E4M3 nearest
 * path (0.1 ns per element); in a matmul_backward of 1024^3 BF16 operands, dY's two stochastic quantizations add 11%.
 */
/** Element rounding of a quantization. */
typedef enum mxfp8_rounding {
    MXFP8_ROUND_NEAREST = 0,    /**< round to nearest, ties to even [OCP §6.3] (the default) */
    MXFP8_ROUND_STOCHASTIC = 1  /**< stochastic rounding (see above) */
} mxfp8_rounding;

/*
 * Quantization statistics (telemetry)
 * -----------------------------------
 * Optional outputs of the quantizations a call performs (mxfp8_quant_params.stats, mxfp8_operand.stats, the matmul
 * backward's and MoE entry points' stats arrays). NULL costs nothing; collecting them never changes an output bit, and
 * every count and sum is the same for any thread count, tiling and ISA path. Per group: the scale code enters the
 * histogram; a group with a NaN or Inf counts as nonfinite (its elements are counted in `elements` only); an all-zero
 * group counts as zero. Per element of the other groups, with y = x * 2^-e before saturation: saturated when
 * |y| > max normal (under the OCP rule), or when |x| exceeds the top-scale limit of "Values near FLT_MAX" (240 * 2^120
 * for E4M3, 1.75 * 2^127 for E5M2: under nki and rceil only there), flushed_to_zero when x != 0 gets a zero code,
 * subnormal when the code is an FP8 subnormal; sum_sq_error = sum (x - q)^2 and sum_sq_signal = sum x^2 (q the
 * dequantized element), each group's in FP32 in its scaled domain in a fixed order (relative error ~1e-7), then
 * scaled by 2^(2e) exactly, summed over groups exactly and rounded once to FP64.
 * SQNR in dB = 10 log10(sum_sq_signal / sum_sq_error) (mxfp8_quant_stats_sqnr_db). The MoE entries count each
 * block operand as its GEMM uses it: positions that hold a token, never padding.
 * Cost, measured on one Zen 4 core (4096 x 4096, AVX-512): mxfp8_quantize with statistics takes about 0.6 ns per
 * element along rows and 1.1 along columns (1.8x / 4.3x nearest rounding of FP32 input, 5.6x / 7.5x the BF16 path);
 * GEMM operands get a separate statistics pass: +23% for the four quantizations of a 1024^3 BF16 matmul_backward.
 * mxfp8_quantize allocates one 2.5 KiB accumulator per thread for them; the GEMM and MoE entries use their workspace.
 */
typedef struct mxfp8_quant_stats {
    int64_t elements;              /**< elements quantized */
    int64_t groups;                /**< groups quantized (= sum of scale_histogram) */
    int64_t saturated;             /**< |x / 2^e| above max normal, or |x| above the top-scale limit, before clamping */
    int64_t flushed_to_zero;       /**< x != 0 whose code is +-0 */
    int64_t subnormal;             /**< codes with exponent field 0 and a nonzero fraction */
    int64_t nonfinite_groups;      /**< groups holding a NaN or Inf (scale code 255) */
    int64_t zero_groups;           /**< groups whose amax is 0 */
    int64_t scale_histogram[256];  /**< groups per E8M0 scale code */
    double sum_sq_error;           /**< sum of (x - dequantized)^2 over finite groups, FP64 */
    double sum_sq_signal;          /**< sum of x^2 over finite groups, FP64 */
} mxfp8_quant_stats;

/** 10 log10(sum_sq_signal / sum_sq_error) in dB: +INFINITY when the error is 0 and the signal is not, NaN when both
 *  are 0 (nothing finite was quantized) or stats is NULL. */
MXFP8_API double mxfp8_quant_stats_sqnr_db(const mxfp8_quant_stats *stats);

/** Options of one quantization. Zero-initialized fields beyond `group` give nearest rounding and no statistics. */
typedef struct mxfp8_quant_params {
    mxfp8_format fmt;          /**< element format; default E4M3 */
    mxfp8_scale_rule rule;     /**< default MXFP8_SCALE_NKI */
    mxfp8_group_scheme group;  /**< default MXFP8_GROUP_1X32 */
    mxfp8_rounding rounding;   /**< element rounding; default MXFP8_ROUND_NEAREST */
    uint64_t seed;             /**< stochastic rounding: the generator's key */
    uint64_t stream;           /**< stochastic rounding: the stream id */
    mxfp8_quant_stats *stats;  /**< NULL, or filled with the statistics of the call (overwritten on success) */
} mxfp8_quant_params;

/** Defaults: E4M3, NKI rule, 1x32 groups, nearest rounding, seed 0, stream 0, no statistics. */
MXFP8_API mxfp8_quant_params mxfp8_quant_params_default(void);

/** MX-quantize `src` along `axis` [OCP §6.3, NKI-Q]. params NULL = mxfp8_quant_params_default().
 *  src:    any rank >= 1, dtype F32, BF16 or F16, any strides.
 *  axis:   the quantization axis (the contraction axis of the consuming GEMM); negative counts from the end.
 *  data:   same shape as src, dtype E4M3 or E5M2 matching params->fmt (codes), any strides.
 *  scales: src's shape with shape[axis] replaced by G = ceil(shape[axis]/32), dtype E8M0 or U8 (codes), compact
 *          group order (for wrapX, group k0/32 + j of the tile at k0).
 *  Per group: amax over the group's values (the zero padding of a short last group never enters amax); all-zero
 *  group -> scale code 0 and zero elements; any NaN or +-Inf in the group -> scale code 255 and every element code
 *  NaN (E4M3 0x7F/0xFF, E5M2 0x7E/0xFE, keeping each sign); else e from `rule`, elements RNE(x * 2^-e), saturating
 *  (at the top scale to the largest value whose dequantized value is finite: see "Values near FLT_MAX"; or stochastically rounded with params->rounding = STOCHASTIC: see "Stochastic rounding"; the logical index of an
 *  element is its row-major index in src's shape, whatever the strides). params->stats, when not NULL, receives the
 *  statistics of the call (see "Quantization statistics").
 *  Errors: NULL_POINTER, INVALID_ARGUMENT (axis, enum values), DTYPE, SHAPE_MISMATCH, SIZE_OVERFLOW, ALIASING,
 *  UNSUPPORTED (wrapX with shape[axis] % 128 != 0), BAD_STRIDES. Uses AVX-512 when available (bit-identical to the
 *  reference) where the axis, or another dimension, has unit stride in every tensor; any other strides take the
 *  scalar reference. Threads: lines are split between threads; results do not depend on the thread count, nor on
 *  the caller's floating-point environment (FTZ/DAZ/rounding mode: IEEE defaults are used inside). */
MXFP8_API mxfp8_status mxfp8_quantize(const mxfp8_tensor *src, int axis, const mxfp8_quant_params *params,
                                      mxfp8_tensor *data, mxfp8_tensor *scales);

/** Dequantize codes back to high precision: out[i] = fp8(data[i]) * 2^(scale-127), exact in FP32 (then rounded RNE
 *  to BF16/F16 when out is BF16/F16; FP8 * 2^e is always exact in BF16 unless it falls below BF16's normal range,
 *  2^-126, where low bits are rounded away). The FP32 product can overflow to +-Inf only for scale codes the
 *  quantizer gives to amax within one FP8 step of FLT_MAX. A NaN code decodes to a quiet NaN with its sign.
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
 *  Errors: NULL_POINTER, INVALID_ARGUMENT, DTYPE, SHAPE_MISMATCH, SIZE_OVERFLOW (K < 0), ALIASING. [NKI-Q], cuBLAS
 *  docs. */
MXFP8_API mxfp8_status mxfp8_scales_to_layout(const mxfp8_tensor *compact, int64_t K, mxfp8_scale_layout layout,
                                              mxfp8_tensor *out);
/** Inverse of mxfp8_scales_to_layout: read scales in `layout` for an operand of F = compact->shape[0] rows and K
 *  contraction indices into compact [F, ceil(K/32)]. The SWIZZLE_128X4 layout may be given as the 2-D [R', C'] view
 *  or as the flat 1-D [R'*C'] view (both directions). Errors as mxfp8_scales_to_layout. */
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

/** One kernel slot of the library's kernel table (mxfp8_info.kernels). Every slot starts with the portable
 *  reference kernel; a faster kernel replaces it only when the CPU has its instructions, MXFP8_ISA allows them, and
 *  (for the GEMM kernels) its start-up self-test reproduced the reference bit for bit on this CPU. */
typedef struct mxfp8_kernel_info {
    const char *slot;             /**< "gemm", "quantize", "dequantize" */
    const char *kernel;           /**< the kernel in use, e.g. "bf16_gemm_32x32__avx512bf16_oddfirst" */
    const char *isa;              /**< its instructions: "scalar", "avx512", "avx512_bf16", "amx" */
    int self_test;                /**< 1: passed its start-up self-test; 0: none run (reference kernel, or a
                                       quantization kernel, exact by construction and checked by the tests) */
    const char *note;             /**< "" or why a faster kernel this CPU has is not in use (MXFP8_ISA, a failed
                                       self-test with its failing case) */
} mxfp8_kernel_info;

#define MXFP8_NUM_KERNEL_SLOTS 3

typedef struct mxfp8_info {
    int has_avx512f, has_avx512bw, has_avx512vl, has_avx512_bf16, has_amx_tile, has_amx_bf16;
    int amx_permitted;            /**< arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) succeeded */
    mxfp8_isa isa;                /**< the ISA level in use (after MXFP8_ISA and CPU checks) */
    const char *isa_name;         /**< "scalar", "avx512", "amx" */
    const char *isa_reason;       /**< why this level was chosen, e.g. "forced by MXFP8_ISA" or "cpu or OS lacks
                                       amx_tile/amx_bf16" (the features, named as mxfp8_cpu_feature names them) */
    int num_threads;              /**< threads a call will use */
    mxfp8_kernel_info kernels[MXFP8_NUM_KERNEL_SLOTS]; /**< gemm, quantize, dequantize */
} mxfp8_info;

/** Upper limit of the thread count (environment and mxfp8_set_num_threads are clamped to it). */
#define MXFP8_MAX_THREADS 4096
/** Set the number of threads every later call uses, process-wide (0 = back to MXFP8_NUM_THREADS / OMP_NUM_THREADS /
 *  all cores; values above MXFP8_MAX_THREADS are clamped to it). Results never depend on it. Errors:
 *  INVALID_ARGUMENT (negative). */
MXFP8_API mxfp8_status mxfp8_set_num_threads(int num_threads);

/** Fill *info with CPU features, the chosen ISA level and the kernel of each slot (all strings static). The kernel
 *  table is decided once per process, at the first call that needs it. Errors: NULL_POINTER. */
MXFP8_API mxfp8_status mxfp8_get_info(mxfp8_info *info);

/** The number of CPU features the library detects and chooses its kernels by (the list grows with the library;
 *  mxfp8_info's has_* fields are a fixed subset of it). Detected once per process. */
MXFP8_API int mxfp8_cpu_feature_count(void);
/** The i-th CPU feature of that list, 0 <= i < mxfp8_cpu_feature_count(): *name its lower-case name ("avx512f",
 *  "avx512bw", "avx512vl", "avx512_bf16", "amx_tile", "amx_bf16", "amx_permitted", ...; a static string), *value 1
 *  when this CPU and the OS offer it (for amx_permitted: the OS granted this process the AMX tile state), else 0.
 *  Errors: NULL_POINTER (name or value NULL), INVALID_ARGUMENT (i out of range); nothing is written then. */
MXFP8_API mxfp8_status mxfp8_cpu_feature(int i, const char **name, int *value);

/* ------------------------------------------------------------------------------------------------------------ */
/* Block-scaled GEMM and matmul_mxfp8 [NKI-M]                                                                     */
/* ------------------------------------------------------------------------------------------------------------ */
/** A reusable scratch-memory workspace (opaque; see "Workspace and memory" at the end of the stable API). */
typedef struct mxfp8_workspace mxfp8_workspace;

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
    /* ours, for an operand quantized on the fly (ignored for pre-quantized ones; zero = nearest, no statistics): */
    mxfp8_rounding rounding;         /**< element rounding; STOCHASTIC uses the logical index r*K + k of element
                                          (r, k) of the logical [R, K] operand (see "Stochastic rounding") */
    uint64_t seed, stream;           /**< stochastic rounding's key and stream id */
    mxfp8_quant_stats *stats;        /**< NULL, or filled with the statistics of this operand's quantization
                                          (all zero for a pre-quantized operand) */
} mxfp8_operand;

/** MatmulMxfp8KernelConfig [NKI-M]. On a CPU, tiles and blocks are cache blocking: tile_m / tile_n are rounded up
 *  to the microkernel's register tile (8 x 32 for the F32 kernels), tile_k is the k depth of one microkernel pass,
 *  tile_* x TILES_IN_BLOCK_M/N is the output block one thread owns; TILES_IN_BLOCK_K and TILES_IN_LOAD_M/N are
 *  accepted and have no effect (blocks always span all of K). block_loop_order orders a thread's blocks (m before n
 *  or n before m), tile_loop_order the tiles inside a block. run_with_lnc2 = 0 runs on one thread; otherwise
 *  threads split the blocks along N (lnc_2_shard_rhs = 1) or M (0). spill_reload = 1 quantizes A once into a shared
 *  workspace; 0 lets each thread quantize the rows it needs (again). Every field is speed-only except
 *  float8_dtype, quant_scheme and scale_rule. NKI's output_dtype field is not here: the output view's dtype decides
 *  (the Python MatmulMxfp8KernelConfig keeps the field to allocate outputs). 0 (or -1 where noted) means
 *  "auto-resolve". Negative sizes or unknown enum values are INVALID_ARGUMENT. */
typedef struct mxfp8_matmul_config {
    int64_t M, K, N;                 /**< 0 = from the tensors; if set, must match them */
    int64_t tile_m, tile_k, tile_n;  /**< 0 = auto */
    int64_t tiles_in_block_m, tiles_in_block_n, tiles_in_block_k; /**< TILES_IN_BLOCK_*; 0 = auto */
    int64_t tiles_in_load_m, tiles_in_load_n;                     /**< TILES_IN_LOAD_*; 0 = auto */
    mxfp8_loop_order block_loop_order, tile_loop_order;           /**< default MNK */
    mxfp8_format float8_dtype;       /**< element format */
    int enable_scale_packing;        /**< asserts that pre-quantized operands' scales are in NKI packed layout
                                          (mxfp8_gemm / mxfp8_matmul: INVALID_ARGUMENT otherwise) */
    int run_with_lnc2;               /**< split the work between threads (default 1) */
    int lnc_2_shard_rhs;             /**< 1: split along N; 0: along M; -1: auto (N if N >= M) */
    int spill_reload;                /**< keep quantized operand blocks in a workspace */
    mxfp8_group_scheme quant_scheme; /**< default 1X32 (NKI's default wrapX needs K % 128 == 0) */
    mxfp8_scale_rule scale_rule;     /**< ours: default NKI */
    mxfp8_workspace *workspace;      /**< ours: scratch reused across calls (mxfp8_gemm, mxfp8_matmul); NULL = allocate
                                          per call. Ignored in the phase configs of the MoE and matmul backward. */
} mxfp8_matmul_config;

/** Fill a config with defaults: everything auto, MNK orders, E5M2, run_with_lnc2 = 1, lnc_2_shard_rhs = -1,
 *  spill_reload = 0, 1x32, NKI rule. NULL is ignored. */
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
 *  c: [M, N] F32/BF16/F16, any strides that address distinct elements; its dtype decides the output type.
 *  Every element of c is written (M, N, K >= 0; K = 0 gives zeros).
 *  config: NULL = mxfp8_matmul_config_init defaults; M/K/N when nonzero must match the operands.
 *  Per operand (mxfp8_operand.rounding, seed, stream, stats): stochastic rounding of its elements, and its
 *  quantization statistics, computed in a separate pass over the operand (the GEMM runs as without them; the stats
 *  are written only when the call succeeds).
 *  Errors: NULL_POINTER (a, b, c, a view, codes without scales), DTYPE (bad dtype, codes of the other FP8 format,
 *  accumulate into non-F32), SHAPE_MISMATCH (K, scales shape, c shape, config M/K/N), INVALID_ARGUMENT (config enums,
 *  an operand's rounding, negative config sizes, scales given with a high-precision operand), UNSUPPORTED (wrapX or
 *  swizzled with
 *  K % 128 != 0), BAD_STRIDES (c's elements overlap), SIZE_OVERFLOW, ALIASING (c overlaps an input), OUT_OF_MEMORY.
 *  Thread-safe; uses mxfp8_set_num_threads threads. */
MXFP8_API mxfp8_status mxfp8_gemm(const mxfp8_operand *a, const mxfp8_operand *b, const mxfp8_matmul_config *config,
                                  int accumulate, mxfp8_tensor *c);

/** Forward Y[M, N] = X[M, K] @ W[N, K]^T [NKI-M]: mxfp8_gemm with a = input_activation, b = weights, accumulate 0.
 *  Pre-quantized X / W: codes [M, K] / [N, K] (or x4 [., ceil(K/4)]) with scales for F = M / N rows; swizzled: NKI's
 *  [K/4, 4F] arrangement of the [K, F] tensor. config may be NULL (defaults). Errors as mxfp8_gemm. */
MXFP8_API mxfp8_status mxfp8_matmul(const mxfp8_operand *input_activation, const mxfp8_operand *weights,
                                    const mxfp8_matmul_config *config, mxfp8_tensor *output);

/** Forward of a linear layer with a bias (ours: the matmul_mxfp8 page has none), Y[M, N] = X[M, K] @ W[N, K]^T + b:
 *  each element is mxfp8_matmul's sum (the FP32 fmaf chain over k ascending from +0), plus bias[n] in one FP32
 *  addition, rounded once (RNE) to output's dtype -- the bits of mxfp8_matmul into an F32 output, then an FP32
 *  addition of the bias, then one rounding (torch's `(y32 + b.float()).to(dtype)`), without the F32 output's
 *  round trip through memory.
 *  bias: NULL or an absent view (data NULL) for none (then exactly mxfp8_matmul), else [N] F32, BF16 or F16, any
 *  stride. Other arguments as mxfp8_matmul; K = 0 gives bias[n] (+0 + bias[n]).
 *  Errors: those of mxfp8_matmul; DTYPE (bias not F32/BF16/F16), SHAPE_MISMATCH (bias not rank 1 of length N),
 *  ALIASING (output overlaps bias); nothing is written then. */
MXFP8_API mxfp8_status mxfp8_linear(const mxfp8_operand *input_activation, const mxfp8_operand *weights,
                                    const mxfp8_tensor *bias, const mxfp8_matmul_config *config,
                                    mxfp8_tensor *output);

/** All parameters of matmul_mxfp8_backward [NKI-M], with the NKI page's names (fields marked "ours" are additions). */
typedef struct mxfp8_matmul_bwd_args {
    mxfp8_tensor output_grad;        /**< dY [M, N]: F32/BF16/F16, or codes (E4M3/E5M2/U8 [M, N], U32 x4 packed
                                          along N [M, ceil(N/4)]) quantized along N with output_grad_scales (F = M);
                                          swizzled: [N/4, 4M] (x4 [N/4, M]) */
    mxfp8_tensor weights;            /**< W [N, K] (contraction axis of dX = N): high precision, or codes quantized
                                          along N (x4 [ceil(N/4), K]) with weight_scales (F = K); swizzled [N/4, 4K] */
    mxfp8_tensor input_activation;   /**< X [M, K] (contraction axis of dW = M): high precision, or codes quantized
                                          along M (x4 [ceil(M/4), K]) with input_scales (F = K); swizzled [M/4, 4K] */
    const mxfp8_matmul_config *input_grad_config;  /**< dX phase config; NULL = auto-resolved */
    const mxfp8_matmul_config *weight_grad_config; /**< dW phase config; NULL = auto-resolved */
    mxfp8_loop_order tile_loop_order;  /**< default MNK */
    mxfp8_format float8_dtype;         /**< default E5M2 (NKI's "float8_e5m2") */
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
    mxfp8_workspace *workspace;        /**< ours: scratch reused across calls; NULL = allocate per call */
    /* ours: element rounding and statistics of the four quantizations of the call, numbered
     *   0: dY along N (dX operand), 1: W along N (dX operand), 2: dY along M (dW operand), 3: X along M (dW operand).
     * Stochastic rounding of quantization q uses stream id q and the element's row-major index in its tensor (dY
     * [M, N]: m*N + n, W [N, K]: n*K + k, X [M, K]: m*K + k); pre-quantized operands are used as given. */
    mxfp8_rounding output_grad_rounding; /**< dY's elements in both of its quantizations; default NEAREST */
    mxfp8_rounding weights_rounding;     /**< W's; default NEAREST */
    mxfp8_rounding input_rounding;       /**< X's; default NEAREST */
    uint64_t rounding_seed;              /**< the key of stochastic rounding */
    mxfp8_quant_stats *stats;            /**< NULL, or an array of 4 filled in the order above (zero for an operand
                                              the call does not quantize) */
} mxfp8_matmul_bwd_args;

/** Defaults of the NKI page: all tensors absent, MNK, E5M2, BF16, lnc2 on, shard_rhs on, no pre-quantization; ours:
 *  nearest rounding, seed 0, no statistics. */
MXFP8_API void mxfp8_matmul_bwd_args_init(mxfp8_matmul_bwd_args *args);

/** matmul_mxfp8_backward [NKI-M]: input_grad dX[M, K] = dY[M, N] @ W[N, K] (dY and W quantized along N);
 *  weight_grad dW[N, K] = dY^T @ X[M, K] (dY and X quantized along M). dY is quantized twice, each time from high
 *  precision. When dY is given pre-quantized (codes quantized along N + output_grad_scales), the dW phase
 *  re-quantizes along M from its exact dequantized values, the highest precision available.
 *  Both GEMMs follow mxfp8_gemm's arithmetic (FP32 fmaf chain over the contraction index ascending, one rounding to
 *  the output), so every knob (tile_loop_order, run_with_lnc2, lnc_2_shard_rhs, spill_reload, the phase configs'
 *  tiles and blocks) and the thread count leave every bit unchanged.
 *  M, N, K are read from the outputs: input_grad [M, K], weight_grad [N, K] (F32, BF16 or F16 views: input_grad of
 *  dtype output_dtype, weight_grad of output_dtype or (ours) F32, as mixed-precision training keeps FP32 master
 *  weights and their gradients; else DTYPE); each output is rounded once (RNE) from its GEMM's FP32 result to its
 *  own dtype. Every input must agree (SHAPE_MISMATCH). Any M, N, K >= 0: a zero contraction length
 *  gives zeros, a zero output extent an empty output. The phase configs (NULL = from the args) set speed only:
 *  their float8_dtype, scale_rule and quant_scheme are replaced by the args' values, and their M/K/N,
 *  when nonzero, must be (M, N, K) for dX and (N, M, K) for dW (logical M, contraction, logical N).
 *  Scales of pre-quantized operands are in NKI packed layout when use_scale_packing, else in scale_layout.
 *  wrapX groups need N % 128 == 0 and M % 128 == 0 (UNSUPPORTED otherwise), swizzled operands their contraction
 *  length % 128 == 0.
 *  Errors: as mxfp8_gemm; INVALID_ARGUMENT for an unknown float8_dtype / loop order / layout / rule / scheme /
 *  output_dtype; ALIASING when an output overlaps an input or the other output; BAD_STRIDES for an output whose
 *  elements overlap. Every buffer of both GEMMs is obtained before the first store: OUT_OF_MEMORY leaves both
 *  outputs untouched. */
MXFP8_API mxfp8_status mxfp8_matmul_backward(const mxfp8_matmul_bwd_args *args, mxfp8_tensor *input_grad,
                                             mxfp8_tensor *weight_grad);

/** Bias gradient of a linear layer Y = X @ W^T + b: bias_grad[n] = sum over m of output_grad[m, n] (torch's
 *  `grad_output.sum(0)`), accumulated in FP32 in one fixed order and rounded once (RNE) to bias_grad's dtype.
 *  The matmul_mxfp8_backward page has no bias; this is the gradient a layer with a bias adds to it. No quantization:
 *  the bias gradient is not a GEMM.
 *  output_grad: dY [M, N], F32, BF16 or F16, any strides (flatten the leading axes of [..., N] into M).
 *  bias_grad:   [N], F32, BF16 or F16, elements distinct, not overlapping output_grad.
 *  Order, per column n: the rows in chunks of 32 (rows 32c .. 32c + 31, the last chunk shorter), each chunk summed
 *  row after row from +0 in FP32; then the chunk sums combined pairwise, S(c0, k) = S(c0, h) + S(c0 + h, k - h)
 *  with h the largest power of two below k (S of one chunk is that chunk's sum). So the error is at most about
 *  (31 + log2(M / 32)) FP32 roundings of the sum of |dY| (in practice far less), and the bits depend only on
 *  output_grad's values: the same for any thread count and strides. M = 0 gives zeros. IEEE defaults inside
 *  (no FTZ/DAZ whatever the caller's MXCSR).
 *  Errors: NULL_POINTER, DTYPE, SHAPE_MISMATCH (rank != 2 / 1, bias_grad's length != N), SIZE_OVERFLOW,
 *  BAD_STRIDES (bias_grad's elements overlap), ALIASING (bias_grad overlaps output_grad); nothing is written then.
 *  Threads: blocks of 128 columns are split between mxfp8_set_num_threads threads. */
MXFP8_API mxfp8_status mxfp8_bias_grad(const mxfp8_tensor *output_grad, mxfp8_tensor *bias_grad);

/* ------------------------------------------------------------------------------------------------------------ */
/* Router linear: batch-invariant FP32 logits of an MoE router                                                    */
/* ------------------------------------------------------------------------------------------------------------ */
/*
 * The router of an MoE layer is a small linear layer, logits = X @ W^T + b with W [E, H] (E experts, H the hidden
 * size). A BLAS GEMM computes a row's dot products in an order that depends on how many rows it is given and on the
 * thread count (torch's CPU GEMM gives a row alone, or among a few, other bits than inside a larger batch), so the
 * logits of a token, and the experts it is routed to, depend on which other tokens share its batch: a batch split
 * over the ranks of expert parallelism, or a request batched with others at inference, would route differently from
 * one process on the whole batch. These functions compute every output element as one FP32 fused multiply-add
 * chain over its contraction index in ascending order, starting from +0 (the GEMM contract of mxfp8_gemm, without
 * quantization): an element's bits depend on its own operands only -- not on the other rows, the thread count, the
 * strides or MXFP8_ISA. No quantization: BF16 / FP16 operands are widened exactly to FP32.
 *   forward        logits[t, e] = fl(c + bias[e]) with c = fmaf chain over h = 0 .. H-1 of x[t, h] * w[e, h]
 *                  (one FP32 addition of the bias after the chain; without a bias logits[t, e] = c)
 *   input grad     dx[t, h] = fmaf chain over e = 0 .. E-1 of dlogits[t, e] * w[e, h]
 *   weight grad    dw[e, h] = fmaf chain over t = 0 .. T-1 of dlogits[t, e] * x[t, h]
 * where "fmaf chain over k of a_k * b_k" is acc = +0; for k ascending: acc = fmaf(a_k, b_k, acc) (one rounding per
 * step, RNE); the bias gradient is mxfp8_bias_grad(dlogits). The input gradient of a row depends on that row of
 * dlogits only, so it is batch-invariant too; the weight gradient is a sum over the tokens, whose bits depend on
 * the tokens and their order (not on the threads). A chain of length 0 is +0. IEEE defaults inside (no FTZ/DAZ
 * whatever the caller's MXCSR). Threads (mxfp8_set_num_threads) split the outputs in tiles, never a chain.
 * Every argument is checked before anything is written; on an error nothing is written.
 */

/** Router logits: logits[t, e] = (fmaf chain over h ascending from +0 of input[t, h] * weight[e, h]) + bias[e]
 *  (section above), in FP32.
 *  input:  X [T, H], F32, BF16 or F16, any strides (flatten the leading axes of [..., H] into T).
 *  weight: W [E, H] (torch's nn.Linear(H, E).weight), F32, BF16 or F16, any strides.
 *  bias:   NULL or an absent view (data NULL) for none, else [E], F32, BF16 or F16, any stride; added once, in FP32,
 *          after the chain.
 *  logits: [T, E], F32, any strides that address distinct elements, not overlapping an input. Every element is
 *          written (T, E, H >= 0; H = 0 gives the bias, or +0).
 *  workspace: NULL (the packed operand and the threads' scratch are allocated and freed by the call) or a workspace
 *             kept across calls, so that a call no larger than an earlier one allocates nothing ("Workspace and
 *             memory"); results never depend on it.
 *  Errors: NULL_POINTER (input, weight, logits or a view's data), DTYPE, SHAPE_MISMATCH (ranks 2 / 2 / 1 / 2,
 *  weight's H differs from input's, bias length != E, logits not [T, E]), SIZE_OVERFLOW, BAD_STRIDES (logits'
 *  elements overlap), ALIASING (logits overlaps input, weight or bias), OUT_OF_MEMORY (the packed operands, obtained
 *  before the first store). Thread-safe. */
MXFP8_API mxfp8_status mxfp8_router_linear(const mxfp8_tensor *input, const mxfp8_tensor *weight,
                                           const mxfp8_tensor *bias, mxfp8_tensor *logits,
                                           mxfp8_workspace *workspace);

/** Input gradient of mxfp8_router_linear: dx[t, h] = fmaf chain over e ascending from +0 of
 *  logits_grad[t, e] * weight[e, h], in FP32, then input_grad[t, h] = RNE(dx) (accumulate == 0) or
 *  RNE(old + dx) with old the element's value before the call widened to FP32 and one FP32 addition
 *  (accumulate != 0), rounded once to input_grad's dtype.
 *  logits_grad: dlogits [T, E], F32, BF16 or F16, any strides.
 *  weight:      W [E, H], F32, BF16 or F16, any strides.
 *  input_grad:  [T, H], F32, BF16 or F16, any strides that address distinct elements, not overlapping an input;
 *               every element written (E = 0 gives +0, or the old value).
 *  workspace: NULL (the packed operand and the threads' scratch are allocated and freed by the call) or a workspace
 *             kept across calls, so that a call no larger than an earlier one allocates nothing ("Workspace and
 *             memory"); results never depend on it.
 *  Errors: NULL_POINTER, DTYPE, SHAPE_MISMATCH (ranks 2, weight's E differs from logits_grad's, input_grad not
 *  [T, H]), SIZE_OVERFLOW, BAD_STRIDES, ALIASING (input_grad overlaps logits_grad or weight), OUT_OF_MEMORY; nothing
 *  is written then. Thread-safe. */
MXFP8_API mxfp8_status mxfp8_router_linear_input_grad(const mxfp8_tensor *logits_grad, const mxfp8_tensor *weight,
                                                      int accumulate, mxfp8_tensor *input_grad,
                                                      mxfp8_workspace *workspace);

/** Weight gradient of mxfp8_router_linear: dw[e, h] = fmaf chain over t ascending from +0 of
 *  logits_grad[t, e] * input[t, h], in FP32, then weight_grad[e, h] = RNE(dw) (accumulate == 0) or RNE(old + dw)
 *  (accumulate != 0: old widened to FP32, one FP32 addition), rounded once to weight_grad's dtype. The order over t
 *  is fixed, so the bits are the same for any thread count and ISA path; they depend on the rows given (a sum of
 *  per-shard weight gradients over ranks is not this chain over the whole batch).
 *  logits_grad: dlogits [T, E], F32, BF16 or F16, any strides.
 *  input:       X [T, H], F32, BF16 or F16, any strides.
 *  weight_grad: [E, H], F32, BF16 or F16, any strides that address distinct elements, not overlapping an input;
 *               every element written (T = 0 gives +0, or the old value).
 *  workspace: NULL (the packed operand and the threads' scratch are allocated and freed by the call) or a workspace
 *             kept across calls, so that a call no larger than an earlier one allocates nothing ("Workspace and
 *             memory"); results never depend on it.
 *  Errors: NULL_POINTER, DTYPE, SHAPE_MISMATCH (ranks 2, input's T differs from logits_grad's, weight_grad not
 *  [E, H]), SIZE_OVERFLOW, BAD_STRIDES, ALIASING (weight_grad overlaps logits_grad or input), OUT_OF_MEMORY; nothing
 *  is written then. Thread-safe. */
MXFP8_API mxfp8_status mxfp8_router_linear_weight_grad(const mxfp8_tensor *logits_grad, const mxfp8_tensor *input,
                                                       int accumulate, mxfp8_tensor *weight_grad,
                                                       mxfp8_workspace *workspace);


/* ------------------------------------------------------------------------------------------------------------ */
/* Blockwise MoE [NKI-E]                                                                                          */
/* ------------------------------------------------------------------------------------------------------------ */
/*
 * The layer. X = hidden_states [T, H]; W1 = gate_up_proj_weight [E, H, 2, I]; W2 = down_proj_weight
 * [E, I, H]; a = expert_affinities_masked [T*E, 1] (a[t*E + e]); optional biases b1 [E, 2, I], b2 [E, H].
 * Tokens are processed in N blocks of B = block_size positions; block n belongs to expert e = block_to_expert[n];
 * position p of block n holds token t = token_position_to_id[n*B + p], or padding. Padding positions are zero rows:
 * they are never read from the inputs and contribute nothing.
 *   forward, per (block, position) with token t, expert e:
 *     g = clamp(X[t] @ W1[e][:, 0, :] + b1[e, 0], gate limits)
 *     u = clamp(X[t] @ W1[e][:, 1, :] + b1[e, 1], up limits)
 *     inter = act(g) * u;  down = inter @ W2[e] + b2[e];  output[t] += a[t*E+e] * down
 *   backward (the exact derivative, with MXFP8 GEMMs), per block (dY_blk = gathered dY rows, zero for padding):
 *     Phase 1  dI_raw = dY_blk @ W2[e]^T            (both operands quantized along H)
 *              AFFINITY_ON_I: da = sum_i dI_raw*inter + sum_h dY*b2;  dI = a * dI_raw
 *              AFFINITY_ON_H: D = a*dY_blk (down_proj_act_checkpoint), dI = D @ W2[e]^T;  da = sum_h dY * down
 *              d_gate = pass_g(g) ? dI * u * act'(g) : 0;  d_up = pass_u(u) ? dI * act(g) : 0
 *              pass(x) = [lo absent or !(x <= lo)] and [hi absent or !(x >= hi)]  (see mxfp8_moe_config)
 *              dGU = [d_gate | d_up]
 *     Phase 2  dX_blk = dGU @ W1[e]^T  (W1[e] viewed [H, 2I]; quantized along 2I); hidden_states_grad[t] += dX_blk[p]
 *     Phase 3  dW1[e] += X_blk^T @ dGU              (quantized along the block's B positions)
 *     Phase 4  dW2[e] += (a*inter)^T @ dY_blk       (ON_I; ON_H: inter^T @ D; quantized along B)
 *              db1[e] += sum_p dGU;  db2[e] += sum_p a*dY
 * Quantization: every GEMM quantizes both operands from FP32 values along its own contraction axis in 1x32 groups
 * with config->quant_dtype and config->scale_rule (never transposes a quantized tensor). Along the block's positions
 * the groups start at position 0 of the block (padding positions are zeros inside the groups). GEMMs accumulate in
 * FP32; weight gradients accumulate over an expert's blocks in block order in FP32 and are rounded once to the output
 * dtype; hidden_states_grad rows accumulate over blocks in block order in FP32 and are rounded once. Activation and
 * affinity math is FP32; the sums of the affinity gradient and of the bias gradients are FP64, then FP32, then the
 * output dtype. accumulate_hidden_states_grad / skip_grad_initialization add the given buffer once at the end:
 * out = given + gradient (one FP32 addition, then rounded to the dtype).
 * Results are bitwise identical for any thread count (threads split GEMM output tiles, rows of elementwise work
 * and column ranges of scatters and reductions, never a sum; small work runs on one thread).
 *
 * Padding and token ids. With config->skip_token = 1 (default) the padding id is -1 and valid ids are [0, T); with
 * skip_token = 0 the padding id is T (NKI's implicit zero row) and -1 is rejected. Anything else is
 * MXFP8_ERR_INDEX_OUT_OF_RANGE, as is an expert id outside [0, E) (checked for every block, padding-only blocks
 * included). A token may appear in several blocks (of different experts, or even of one expert): its
 * contributions add up.
 *
 * Deviations from the NKI page (and why):
 *  - Any B >= 1, H >= 1, I >= 1, T >= 0 (no hardware multiple-of-128 limits); groups along an axis whose length is
 *    not a multiple of 32 end with a short group (OCP).
 *  - Biases: NKI's backward has no bias inputs; here b1/b2 are optional inputs of both passes (absent = zero):
 *    b2 enters the affinity gradient, b1 the recomputation of g and u.
 *  - compute_dtype (BF16 or F32) is validated but intermediates are always FP32 on a CPU (at least BF16's
 *    precision); shard_option, transpose modes, swizzle modes, skip_weight and use_fast_dma are hardware knobs:
 *    accepted, no effect on results. The per-phase matmul configs are accepted (quant_scheme must be 1x32: wrapX is
 *    UNSUPPORTED, anything else INVALID_ARGUMENT) but the phases use the GEMM's automatic blocking; element format,
 *    scale rule and output dtype always come from this config (quant_dtype, scale_rule, FP32 accumulators).
 *  - single_expert_dense defaults to 0 (the NKI default 1 would make every multi-expert call an error). When set:
 *    E must be 1, routing is the identity (position p of block n holds token n*B + p, positions >= T are padding),
 *    N = ceil(T/B) (NKI needs T % B == 0), token_position_to_id / block_to_expert are ignored and may be absent.
 *  - num_valid_tokens (requires single_expert_dense, else INVALID_ARGUMENT; negative is INVALID_ARGUMENT; values
 *    above T clamp to T): tokens >= the count act as padding. Rows of hidden_states_grad / output and entries of
 *    expert_affinities_masked_grad past the count are set to zero (NKI: undefined); with
 *    accumulate_hidden_states_grad those rows are left as given. Together with a scaled-intermediate checkpoint or
 *    with bias it is UNSUPPORTED (as on the NKI page).
 *  - down_proj_act_checkpoint (a*dY, a backward quantity) cannot come from the forward; the forward instead offers
 *    down_proj_output_checkpoint (ours: inter @ W2 + b2 before the affinity) which the AFFINITY_ON_H backward reads
 *    for the affinity gradient; when absent, the backward recomputes it per block with the forward's MXFP8 GEMM
 *    (inter and W2 quantized along I) plus b2, bitwise equal to the forward's F32 checkpoint.
 *  - Checkpoints (F32/BF16/F16): when gate_up_proj_act_checkpoint_T is absent, g and u are recomputed per block
 *    with the forward's MXFP8 GEMM (X and W1 quantized along H), bias and clamp (NKI requires the act/inter
 *    checkpoints instead; here every combination works). Given F32 checkpoints written by mxfp8_moe_forward, the
 *    backward is bitwise equal to recomputing. Checkpoint entries at padding positions are written as 0 by the
 *    forward and never read by the backward. Any strides are accepted; two layouts are fast (speed only, the same
 *    bits): positions contiguous (the NKI layout, contiguous [N, (2,) I, B]), and positions-major memory, i.e. a
 *    [N, (2,) I, B] view of [N, B, (2,) I] memory with unit stride along I (mxfp8.torch keeps its FP32
 *    gate/up checkpoint so: each position's values are written and read as one row, with no transposition).
 *  - Pre-quantized weights (codes of dtype matching quant_dtype + compact E8M0/U8 scales, both as produced by
 *    mxfp8_quantize along the stated axis with 1x32 groups) are used as they are by the GEMM that contracts along
 *    that axis, which is bitwise equal to quantizing the high-precision weights on the fly; a GEMM contracting along
 *    another axis dequantizes them exactly and re-quantizes (the highest precision available) -- in the backward
 *    that is only the recomputation of g, u (no gate_up_proj_act_checkpoint_T) and of the AFFINITY_ON_H down
 *    projection (no down_proj_output_checkpoint), so with those checkpoints the whole backward is bitwise equal to
 *    on-the-fly quantization. High-precision weights are quantized once per expert, not once per block. Layouts:
 *      backward: W1 along 2I: gate_up_weight_scales [E, H, ceil(2I/32)] (W1 viewed [E, H, 2I], axis 2);
 *                W2 along H:  down_weight_scales   [E, I, ceil(H/32)]  (axis 2).
 *      forward:  W1 along H:  gate_up_weight_scales [E, ceil(H/32), 2, I] (axis 1);
 *                W2 along I:  down_weight_scales   [E, ceil(I/32), H]  (axis 1).
 *  - expert_affinities_masked_grad is always overwritten; entries of (t, e) pairs that no block routes are 0.
 *
 * Errors (all validated before any output is written; on error every output is untouched): NULL_POINTER, DTYPE,
 * SHAPE_MISMATCH (ranks/extents disagree; the token_position_to_id length is not a multiple of B), INVALID_ARGUMENT
 * (enum values, block_size < 1, H or I < 1, clamp limit NaN or lower > upper (also after gpt-oss SwiGLU's limit
 * tightens them), swiglu_alpha not finite or swiglu_limit not > 0 with that activation, stochastic_rounding bits
 * beyond the operands, num_valid_tokens misuse, bias tensors given with config->bias = 0), INDEX_OUT_OF_RANGE
 * (token or expert ids), UNSUPPORTED (see above), ALIASING (an output overlaps an input or another output),
 * SIZE_OVERFLOW, BAD_STRIDES, OUT_OF_MEMORY (workspaces are allocated
 * before the first store; only an allocation failing inside a forward GEMM can leave earlier checkpoints written).
 */
typedef enum mxfp8_activation {
    MXFP8_ACT_SILU = 0,         /**< act(x) = x * sigmoid(x) (default; the only one of the NKI MXFP8 kernel) */
    MXFP8_ACT_SWISH = 1,        /**< act(x) = x * sigmoid(1.702 x) (NKI golden) */
    MXFP8_ACT_SQUARED_RELU = 2, /**< act(x) = max(x, 0)^2 (NKI golden) */
    MXFP8_ACT_GPT_OSS_SWIGLU = 3 /**< ours: the clamped SwiGLU of gpt-oss: inter = act(g) * (u + 1) with
                                      act(g) = g * sigmoid(alpha g), g clamped above at limit and u to [-limit, limit]
                                      (config.swiglu_alpha, swiglu_limit; 1.702 and 7 by default). The limits act
                                      as clamp limits: they tighten gate_clamp_upper, up_clamp_lower, up_clamp_upper,
                                      with the same strict gradient masks (a value at or beyond a limit gets zero
                                      gradient). Backward: d_gate = dI (u + 1) act'(g) pass(g), d_up = dI act(g)
                                      pass(u), act'(g) = s (1 + alpha g (1 - s)), s = sigmoid(alpha g). */
} mxfp8_activation;

/** The GEMM operands of the MoE layer, for per-operand stochastic rounding (config.stochastic_rounding, bit 1u << op)
 *  and statistics (args.stats[e * MXFP8_MOE_NUM_OPERANDS + op] for expert e). Each is quantized along its GEMM's
 *  contraction axis; stochastic rounding uses stream id op and, as logical index, the element's position in its
 *  tensor: block operands by position p of block n in the dispatched layout, row n*B + p of [N*B, H] (X, dY, D),
 *  [N*B, I] (inter, a*inter) or [N*B, 2I] (dGU), whatever the GEMM's orientation; weights by their row-major index
 *  in W1 [E, H, 2I] (2I = the flattened (2, I)) or W2 [E, I, H]. The forward's GEMMs and the backward's
 *  recomputations of them share their operands (bits 0-3), so both passes round alike. */
typedef enum mxfp8_moe_operand {
    MXFP8_MOE_GEMM1_X = 0,     /**< forward GEMM 1 (and its recomputation): X_blk along H */
    MXFP8_MOE_GEMM1_W1 = 1,    /**< forward GEMM 1: W1[e] along H */
    MXFP8_MOE_GEMM2_INTER = 2, /**< forward GEMM 2 (and the AFFINITY_ON_H recomputation): inter along I */
    MXFP8_MOE_GEMM2_W2 = 3,    /**< forward GEMM 2: W2[e] along I */
    MXFP8_MOE_P1_DY = 4,       /**< Phase 1: dY_blk (AFFINITY_ON_H: D = a*dY) along H */
    MXFP8_MOE_P1_W2 = 5,       /**< Phase 1: W2[e] along H */
    MXFP8_MOE_P2_DGU = 6,      /**< Phase 2: dGU along 2I */
    MXFP8_MOE_P2_W1 = 7,       /**< Phase 2: W1[e] along 2I */
    MXFP8_MOE_P3_X = 8,        /**< Phase 3: X_blk^T along the block's positions */
    MXFP8_MOE_P3_DGU = 9,      /**< Phase 3: dGU^T along the positions */
    MXFP8_MOE_P4_S = 10,       /**< Phase 4: (a*inter)^T (AFFINITY_ON_H: inter^T) along the positions */
    MXFP8_MOE_P4_DY = 11,      /**< Phase 4: dY_blk^T (AFFINITY_ON_H: D^T) along the positions */
    MXFP8_MOE_NUM_OPERANDS = 12
} mxfp8_moe_operand;

typedef enum mxfp8_affinity_option {
    MXFP8_AFFINITY_ON_I = 0,    /**< the affinity scales the intermediate in the backward's Phase 1/4 (default) */
    MXFP8_AFFINITY_ON_H = 1     /**< the affinity scales dY (down_proj_act_checkpoint = a * dY) */
} mxfp8_affinity_option;

/** Number of blocks N = ceil((T*K - (E-1)) / B) + E - 1 (the upstream convention: enough for any routing of T
 *  tokens to K distinct experts each, one partial block per expert; ceil of a negative value rounds toward zero)
 *  for T tokens, top-K, E experts and block size B (e.g. T = 0 with B >= E gives E - 1 padding-only blocks).
 *  Errors: NULL_POINTER (num_blocks), INVALID_ARGUMENT (T < 0, K < 1, K > E, E < 1, B < 1), SIZE_OVERFLOW. */
MXFP8_API mxfp8_status mxfp8_moe_num_blocks(int64_t T, int64_t top_k, int64_t num_experts, int64_t block_size,
                                            int64_t *num_blocks);

/** Router helper (upstream test convention): from topk_ids [T, K] (I32, each in [0, E), distinct within a row) and
 *  topk_weights [T, K] (F32/BF16/F16) build
 *    token_position_to_id [N*B] I32: expert 0's blocks first, then expert 1's, ...; expert e gets ceil(count_e/B)
 *        blocks holding its tokens in ascending order, the last one padded with padding_id; the remaining blocks up
 *        to N (mxfp8_moe_num_blocks) are all padding;
 *    block_to_expert [N] or [N, 1] I32: the expert of each block; padding-only leftover blocks get expert E-1;
 *    expert_affinities_masked [T*E, 1] or [T*E] (F32/BF16/F16/F64): a[t*E+e] = the weight of e in row t, 0 where
 *        row t does not route to e (weights are copied, not normalized).
 *  padding_id: -1 (config skip_token = 1) or T (skip_token = 0).
 *  Errors: NULL_POINTER, DTYPE, SHAPE_MISMATCH, INDEX_OUT_OF_RANGE (an id outside [0, E)), INVALID_ARGUMENT
 *  (duplicate id in a row, padding_id not -1 or T, E or B < 1, K > E), ALIASING, SIZE_OVERFLOW. */
MXFP8_API mxfp8_status mxfp8_moe_route(const mxfp8_tensor *topk_ids, const mxfp8_tensor *topk_weights,
                                       int64_t num_experts, int64_t block_size, int32_t padding_id,
                                       mxfp8_tensor *token_position_to_id, mxfp8_tensor *block_to_expert,
                                       mxfp8_tensor *expert_affinities_masked);

/** MXFP8MOEBwdConfig [NKI-E] (also used by the forward and the golden references). Clamp limits: -INFINITY /
 *  +INFINITY mean "None" (an absent limit is unbounded); a clamp clips g (u) to [lower, upper] in the
 *  forward and the backward's masks are strict (lower < g < upper), so a value exactly at a limit gets zero gradient.
 *  Non-finite values propagate, never hidden: clamp(NaN) = NaN; an absent limit applies no mask at all
 *  (+-Inf and NaN pass); a present limit masks g <= lower / g >= upper and NaN counts as inside (its gradient is
 *  NaN); act(NaN) = act'(NaN) = NaN for SiLU, Swish, gpt-oss SwiGLU and SquaredReLU (whose max(g, 0) keeps NaN). */
typedef struct mxfp8_moe_config {
    mxfp8_dtype compute_dtype;           /**< BF16 (default) or F32; intermediates are FP32 regardless (see above) */
    mxfp8_format quant_dtype;            /**< E4M3 (default) or E5M2: element format of every GEMM operand */
    mxfp8_scale_rule scale_rule;         /**< ours; default MXFP8_SCALE_NKI */
    mxfp8_activation activation;         /**< default SiLU */
    mxfp8_affinity_option affinity_option; /**< default AFFINITY_ON_I */
    mxfp8_matmul_config phase1, phase2, phase3, phase4; /**< per-phase blocking (speed only; see above) */
    float gate_clamp_lower, gate_clamp_upper, up_clamp_lower, up_clamp_upper; /**< +-INFINITY = no limit */
    int skip_token;                      /**< SkipMode.skip_token: 1 = padding id is -1 (default); 0 = padding id T */
    int accumulate_hidden_states_grad;   /**< hidden_states_grad = given + gradient instead of overwriting it */
    int skip_grad_initialization;        /**< weight/bias grads are NOT zeroed: result = given + gradient */
    int single_expert_dense;             /**< E = 1 identity routing (see above); default 0 */
    int bias;                            /**< the layer has biases b1, b2; bias grads are returned */
    /* ours: */
    float swiglu_alpha;                  /**< gpt_oss_swiglu: alpha (default 1.702; finite) */
    float swiglu_limit;                  /**< gpt_oss_swiglu: limit (default 7; > 0, +INFINITY = none) */
    uint32_t stochastic_rounding;        /**< bitmask (1u << mxfp8_moe_operand): operands whose elements are rounded
                                              stochastically (see "Stochastic rounding"); default 0 = nearest */
    uint64_t rounding_seed;              /**< the key of stochastic rounding */
    /* Hardware-only knobs of the NKI page (see "Hardware-only knobs" at the top): validated, no effect. */
    int shard_option;                    /**< SHARD_ON_FREE = 0 (default), SHARD_ON_BLOCK = 1, SHARD_ON_INTERMEDIATE = 2 */
    int p3_transpose_mode, p4_transpose_mode;   /**< TransposeMode: 0 NC, 1 PE, 2 DMA (else INVALID_ARGUMENT) */
    int hidden_states_swizzle_mode, output_grad_swizzle_mode,
        weight_swizzle_mode;                    /**< SwizzleMode: 0 PE, 1 DGT, 2 DMA (else INVALID_ARGUMENT) */
    int skip_weight;                     /**< SkipMode.skip_weight, 0 or 1 (else INVALID_ARGUMENT) */
    int use_fast_dma;                    /**< 0 or 1 (else INVALID_ARGUMENT) */
} mxfp8_moe_config;

/** Defaults of MXFP8MOEBwdConfig(): BF16 compute, E4M3, NKI rule, SiLU, SHARD_ON_FREE, AFFINITY_ON_I, phase configs
 *  from mxfp8_matmul_config_init (float8_dtype E4M3, output F32), no clamp limits, skip_token = 1, every other flag 0
 *  (single_expert_dense 0: see above); ours: swiglu_alpha 1.702, swiglu_limit 7, nearest rounding, seed 0. NULL is
 *  ignored. */
MXFP8_API void mxfp8_moe_config_init(mxfp8_moe_config *config);

/** Inputs of the forward of the blockwise MoE layer (the pass that produces the backward's checkpoints). */
typedef struct mxfp8_moe_fwd_args {
    mxfp8_tensor hidden_states;            /**< X [T, H], F32/BF16/F16 */
    mxfp8_tensor expert_affinities_masked; /**< a [T*E, 1] (or [T*E]), F32/BF16/F16 */
    mxfp8_tensor gate_up_proj_weight;      /**< W1 [E, H, 2, I]: F32/BF16/F16, or codes with gate_up_weight_scales */
    mxfp8_tensor down_proj_weight;         /**< W2 [E, I, H]: F32/BF16/F16, or codes with down_weight_scales */
    mxfp8_tensor token_position_to_id;     /**< [N*B] I32; padding -1 (skip_token) or T */
    mxfp8_tensor block_to_expert;          /**< [N] or [N, 1] I32 */
    int64_t block_size;                    /**< B >= 1 */
    mxfp8_tensor gate_and_up_proj_bias;    /**< ours: b1 [E, 2, I] F32/BF16/F16, only with config->bias; absent = 0 */
    mxfp8_tensor down_proj_bias;           /**< ours: b2 [E, H] F32/BF16/F16, only with config->bias; absent = 0 */
    const mxfp8_moe_config *config;        /**< NULL = defaults */
    mxfp8_tensor gate_up_weight_scales;    /**< W1 pre-quantized along H: [E, ceil(H/32), 2, I] E8M0/U8 */
    mxfp8_tensor down_weight_scales;       /**< W2 pre-quantized along I: [E, ceil(I/32), H] E8M0/U8 */
    mxfp8_tensor num_valid_tokens;         /**< [1] (or 0-D) I32; requires single_expert_dense */
    mxfp8_workspace *workspace;            /**< ours: scratch reused across calls; NULL = allocate per call */
    mxfp8_quant_stats *stats;              /**< ours: NULL, or E * MXFP8_MOE_NUM_OPERANDS structs filled with the
                                                statistics of each expert's GEMM operands (zero where none) */
} mxfp8_moe_fwd_args;

/** Outputs of the forward. Checkpoints are optional (absent = not written), F32/BF16/F16; entries at padding
 *  positions are written as 0. */
typedef struct mxfp8_moe_fwd_outputs {
    mxfp8_tensor output;                           /**< [T, H] F32/BF16/F16, required; overwritten (rows no block
                                                        routes are 0); accumulated over blocks in FP32, rounded once */
    mxfp8_tensor gate_up_proj_act_checkpoint_T;    /**< [N, 2, I, B]: clamped g at [n, 0, i, p], u at [n, 1, i, p] */
    mxfp8_tensor gate_act_checkpoint_T;            /**< [N, I, B]: act(g) */
    mxfp8_tensor intermediate_checkpoint_T;        /**< [N, I, B]: act(g) * u */
    mxfp8_tensor scaled_intermediate_checkpoint_T; /**< [N, I, B]: a * act(g) * u */
    mxfp8_tensor down_proj_output_checkpoint;      /**< ours, [N, B, H]: inter @ W2 + b2 before the affinity */
} mxfp8_moe_fwd_outputs;

/** Forward of the blockwise MoE layer (see the section comment). GEMM 1: X_blk [B, H] @ W1[e] [H, 2I], both
 *  quantized along H; GEMM 2: inter [B, I] @ W2[e] [I, H], both quantized along I; the affinity is applied in FP32
 *  to the GEMM 2 result (for both affinity options; NKI's AFFINITY_ON_I forward scales inter before quantizing:
 *  equal in exact arithmetic, and the backward's checkpoints stay independent of the option). output accumulates
 *  over blocks in block order in FP32. Errors: see the section comment; an OUT_OF_MEMORY inside a GEMM (after
 *  validation) may leave checkpoints of earlier blocks written. Thread-safe. */
MXFP8_API mxfp8_status mxfp8_moe_forward(const mxfp8_moe_fwd_args *args, mxfp8_moe_fwd_outputs *outputs);

/** All parameters of blockwise_mm_bwd_mxfp8 [NKI-E] with the NKI page's names (+ ours, marked). */
typedef struct mxfp8_moe_bwd_args {
    mxfp8_tensor hidden_states;                    /**< X [T, H] F32/BF16/F16 */
    mxfp8_tensor expert_affinities_masked;         /**< a [T*E, 1] (or [T*E]) F32/BF16/F16 */
    mxfp8_tensor gate_up_proj_weight;              /**< W1 [E, H, 2, I]: F32/BF16/F16, or codes (see above) */
    mxfp8_tensor down_proj_weight;                 /**< W2 [E, I, H]: F32/BF16/F16, or codes (see above) */
    mxfp8_tensor token_position_to_id;             /**< [N*B] I32 (ignored with single_expert_dense) */
    mxfp8_tensor block_to_expert;                  /**< [N] or [N, 1] I32 (ignored with single_expert_dense) */
    mxfp8_tensor output_hidden_states_grad;        /**< dY [T, H] F32/BF16/F16 */
    int64_t block_size;                            /**< B >= 1 (upstream 128..4096; any here) */
    mxfp8_tensor gate_up_proj_act_checkpoint_T;    /**< [N, 2, I, B] optional: recomputed from X, W1 when absent */
    mxfp8_tensor gate_act_checkpoint_T;            /**< [N, I, B] optional: act(g); recomputed when absent */
    mxfp8_tensor intermediate_checkpoint_T;        /**< [N, I, B] optional: act(g)*u; recomputed when absent */
    mxfp8_tensor scaled_intermediate_checkpoint_T; /**< [N, I, B] optional: a*act(g)*u (ON_I Phase 4 operand) */
    mxfp8_tensor down_proj_act_checkpoint;         /**< [N, B, H] optional: a*dY[t] (ON_H Phase 1/4 operand) */
    mxfp8_tensor down_proj_output_checkpoint;      /**< ours, [N, B, H] optional: inter @ W2 + b2 (ON_H da) */
    mxfp8_tensor gate_and_up_proj_bias;            /**< ours, b1 [E, 2, I], only with config->bias; absent = 0 */
    mxfp8_tensor down_proj_bias;                   /**< ours, b2 [E, H], only with config->bias; absent = 0 */
    const mxfp8_moe_config *config;                /**< NULL = defaults */
    mxfp8_tensor gate_up_weight_scales;            /**< W1 pre-quantized along 2I: [E, H, ceil(2I/32)] E8M0/U8 */
    mxfp8_tensor down_weight_scales;               /**< W2 pre-quantized along H: [E, I, ceil(H/32)] E8M0/U8 */
    mxfp8_tensor num_valid_tokens;                 /**< [1] (or 0-D) I32; requires single_expert_dense */
    mxfp8_workspace *workspace;                    /**< ours: scratch reused across calls; NULL = per call */
    mxfp8_quant_stats *stats;                      /**< ours: NULL, or E * MXFP8_MOE_NUM_OPERANDS structs: the
                                                        statistics of each expert's GEMM operands over all of its
                                                        blocks (weights counted once; the recomputations' operands
                                                        under their forward ids; zero where none) */
} mxfp8_moe_bwd_args;

/** Gradients returned by the backward (NKI's return tuple). F32/BF16/F16 each (F64/F32 for the goldens). */
typedef struct mxfp8_moe_bwd_grads {
    mxfp8_tensor hidden_states_grad;            /**< [T, H]; given + grad with accumulate_hidden_states_grad */
    mxfp8_tensor expert_affinities_masked_grad; /**< [T*E, 1] (or [T*E]); overwritten, unrouted pairs 0 */
    mxfp8_tensor gate_up_proj_weight_grad;      /**< [E, H, 2, I]; given + grad with skip_grad_initialization */
    mxfp8_tensor down_proj_weight_grad;         /**< [E, I, H]; given + grad with skip_grad_initialization */
    mxfp8_tensor gate_and_up_proj_bias_grad;    /**< [E, 2, I], required iff config->bias (else must be absent) */
    mxfp8_tensor down_proj_bias_grad;           /**< [E, H], required iff config->bias (else must be absent) */
} mxfp8_moe_bwd_grads;

/** NKI defaults for the args: every tensor absent, block_size 4096, config NULL. NULL is ignored. */
MXFP8_API void mxfp8_moe_bwd_args_init(mxfp8_moe_bwd_args *args);
/** Forward args defaults: every tensor absent, block_size 4096, config NULL. NULL is ignored. */
MXFP8_API void mxfp8_moe_fwd_args_init(mxfp8_moe_fwd_args *args);

/** blockwise_mm_bwd_mxfp8 [NKI-E]: the MXFP8 backward of the layer (see the section comment for the math,
 *  quantization axes, precision, checkpoints, deviations and errors). Phase 1: dY_blk (or D) [L, H] x W2[e] as
 *  [I, H], along H; Phase 2: dGU [L, 2I] x W1[e] as [H, 2I], along 2I; Phase 3: X_blk^T [H, L] x dGU^T [2I, L] and
 *  Phase 4: (a*inter)^T or inter^T [I, L] x dY_blk^T or D^T [H, L], along the block's L positions (L = last real
 *  position + 1; trailing padding only adds zeros). All outputs are written only after every block is done, so an
 *  OUT_OF_MEMORY inside a GEMM also leaves them untouched. Thread-safe; keeps no pointer after returning. */
MXFP8_API mxfp8_status mxfp8_moe_backward(const mxfp8_moe_bwd_args *args, mxfp8_moe_bwd_grads *grads);


/* ------------------------------------------------------------------------------------------------------------ */
/* Workspace and memory                                                                                           */
/* ------------------------------------------------------------------------------------------------------------ */
/*
 * Scratch memory. The GEMM, matmul, router and MoE entry points take a workspace (config->workspace for mxfp8_gemm
 * and mxfp8_matmul, args->workspace for mxfp8_matmul_backward, mxfp8_moe_forward and mxfp8_moe_backward, the last
 * argument of mxfp8_router_linear and its gradients). With NULL, a
 * call allocates its scratch on the heap (aligned_alloc) after validation and before the first store and frees all
 * of it before returning. With a workspace, its memory is kept for the next call: a call whose problem is no larger
 * in any buffer than an earlier one on the same workspace allocates nothing. Either way a call that cannot get its
 * memory returns MXFP8_ERR_OUT_OF_MEMORY with no output written (every buffer, including those of its inner GEMMs,
 * is obtained before the first store). What OUT_OF_MEMORY can promise depends on the system: it is returned when an
 * allocation itself fails (address space, a ulimit, a strict overcommit policy). On a system that overcommits memory
 * (Linux by default) an allocation larger than the free memory usually succeeds, and the shortage shows only when
 * its pages are first written: the process then swaps or is killed by the kernel's OOM killer, which no status can
 * report. A caller that must not get there compares the bounds below (plus its own inputs and outputs) with the
 * memory available before the call, as the `mxfp8` command does. A workspace serves one call at a time: it may be shared between threads,
 * and a call that finds it in use by another thread's call takes private memory for that call (as with NULL), so
 * sharing is safe but only one per thread is fast. Results never depend on the workspace. The library keeps no
 * pointer to it after a call returns. mxfp8_quantize, mxfp8_dequantize, the layout functions and mxfp8_moe_route
 * need no workspace (route allocates 16 E bytes of counters per call).
 *
 * The exact scratch of a call is what its _validate entry below returns; mxfp8_workspace_reserve makes a workspace
 * hold that much so that the call allocates nothing. For planning, upper bounds of one call's scratch in bytes,
 * with P = threads the call uses (mxfp8_set_num_threads) and OMP = 4096 + 1024 P for the OpenMP runtime's
 * bookkeeping (tests/c/test_workspace.c checks the peak heap use of each call against them):
 *   mxfp8_quantize, mxfp8_dequantize, layouts, x4 packing, swizzle, compare: OMP (no workspace of their own);
 *     mxfp8_quantize with params->stats: + 2464 P (one statistics accumulator per thread).
 *   mxfp8_gemm / mxfp8_matmul, C[M, N] with contraction K: the dequantized B operand in FP32 panels, 4 K (N + 32);
 *     with spill_reload also A's, 4 K (M + 32); per thread a block's A panels, packing scratch and FP32
 *     accumulators, 4 K (bm + 80) + 4 bm (bn + 16) with bm = min(M, MCb) rounded up to 32, bn = min(N, NCb), MCb =
 *     tile_m * tiles_in_block_m and NCb = tile_n * tiles_in_block_n (512 each by default); + 64 KiB + OMP.
 *     Independent of the data type of C.
 *   mxfp8_matmul_backward: the larger of the two GEMMs (dX: [M, K] contracting N; dW: [N, K] contracting M), plus
 *     4 M N when dY is pre-quantized or swizzled (its FP32 values for the dW phase).
 *   mxfp8_moe_route: 16 E + OMP (per-expert counters).
 *   mxfp8_router_linear, with E' = E rounded up to 8: the weight in FP32 panels, 4 E' (H + 1), and per thread
 *     4 (32 min(H, 512) + 32 E' + 16); the input gradient: 4 (H + 31) max(E, 1) and per thread 4 (8 E + 16 + 8 H);
 *     the weight gradient: 4 E' (T + 1) and per thread 4 (32 min(T, 512) + 32 E' + 48); each + 2048 + OMP.
 *   mxfp8_moe_forward / mxfp8_moe_backward, with B' = min(B, T): an FP32 accumulator of the token output, 4 T H
 *     (forward: output; backward: dX); the backward runs expert-major and keeps dW1, dW2 of the current expert in
 *     FP32 in the expert's weight scratch below (no extra bytes), rounding each finished expert straight into the
 *     outputs (every buffer is obtained before the first GEMM, so an OUT_OF_MEMORY still leaves every output
 *     untouched; with the segmented weight gradients below and contiguous BF16 or F32 weight gradients without
 *     skip_grad_initialization each expert's GEMM writes into the output itself); FP64 sums 8 (T E + 2 E I + E H), at most one
 *     expert's weights in FP32 (<= 12 H I; only for pre-quantized weights contracted along an axis other than the
 *     one they were quantized along, or W1 views whose (2, I) axes are not one 2I axis: high-precision weights
 *     are read in place), per-block buffers 4 R (8 H + 13 I) with R = B', or up to max(B', 512) where consecutive
 *     full blocks of one expert run together (only when one block's B (H + 2 I) FP32 values pass 1 MiB: the same
 *     bits, fewer parallel regions), the routing table 4 (N B + N), plus one block GEMM's workspace (above, with
 *     M = R, N and K <= max(H, 2 I)) and OMP;
 *     the backward also keeps the current expert's packed weights for Phases 1 and 2 (the B operands above:
 *     4 H (I + 32) + 8 I (H + 32)), reused by all of the expert's blocks. When an expert's weight gradients
 *     pass 1 MiB of FP32 (3 H I > 262144) the backward adds all of an expert's blocks to them at once instead of
 *     block by block (the same bits), which takes 4 (Re' - R) (2 H + 3 I) + 4 S' B' (H + 2 I + 64) + 8192 P +
 *     320 S' more, with Re' = max(Re, min(T, N B)) and S' = max(Se, min(N, ceil(T / B))), Re the most positions
 *     of one expert's blocks (each block counted up to its last real position) and Se the most blocks of one
 *     expert. The primed sizes (and R) have room for any routing of mxfp8_moe_route's layout with the call's
 *     shapes, so the later calls of a training loop, whose routing changes, need no larger workspace; the room an
 *     evenly routed call does not use is never touched (at width 1024, 8 experts, top-2, 2048 tokens: 116.4 MiB
 *     reserved after a backward, 81.7 when sized by the call's routing, the same resident size).
 *     On more than P = 1 thread, where blocks are not run together (one block's B (H + 2 I) FP32 values within
 *     1 MiB) and no operand statistics are asked for (nor, in the forward, a down projection checkpoint), the forward
 *     and the backward take an expert-parallel path (the same bits): each thread runs whole blocks by itself. The
 *     forward then holds per thread one block's buffers (R = B) and one block GEMM's workspace on 1 thread, and
 *     once 4 N B H + 8 N B + 4 E H + 8 T + 4 N + 12 (each position's down projection row and affinity, every
 *     expert's b2, the combine's lists). The backward then holds per thread 24 H I + 4 B' (8 H + 13 I) + 8 H (I + 32) + 16 I (H + 32) +
 *     4 S' B' (H + 2 I + 64) + 320 S' + 12288 with S' = max(Se, min(N, ceil(T / B))) (room for any routing of
 *     mxfp8_moe_route's layout) plus one block GEMM's workspace on 1 thread (above, M = B'), and once,
 *     beside dX, the FP64 sums and the routing table: 4 N B H + 16 N B (each position's dX row and affinity term),
 *     2 W (8 H + 12 I) with W = max(min(T, N B), min(4 B, N B), Re) (two waves of experts' Phase 3 and 4 operands:
 *     for mxfp8_moe_route's layout independent of the routing, so later calls of a training loop need no more),
 *     80 (E + 1) + 36 N + 8 T + 64 and OMP. At H = 256, I = 512, 8 experts, top-2, 2048 tokens, B = 128
 *     on 2 threads that is 59.5 MiB measured (16.0 MiB without the expert-parallel path), most of it room that an
 *     evenly routed call never touches: the process's resident size grew by 9.7 MB.
 *     Without the expert-parallel path the workspace stays below the bytes of the inputs and outputs themselves when
 *     those are F32 (and below twice them for BF16 gradients), independent of N beyond the routing table.
 *   Golden references (mxfp8_gemm_golden_*, mxfp8_moe_*_golden): FP32/FP64 copies of every operand (slow paths for
 *     tests; no bound promised beyond O(inputs + outputs)).
 */

/** Create an empty workspace (it grows to what the calls it serves need). Errors: NULL_POINTER, OUT_OF_MEMORY. */
MXFP8_API mxfp8_status mxfp8_workspace_create(mxfp8_workspace **workspace);
/** Free a workspace and all its memory; NULL is ignored. Not while a call uses it. */
MXFP8_API void mxfp8_workspace_destroy(mxfp8_workspace *workspace);
/** Bytes of scratch a workspace holds now (0 for NULL), including the unused part of a reservation. */
MXFP8_API size_t mxfp8_workspace_bytes(const mxfp8_workspace *workspace);

/* ------------------------------------------------------------------------------------------------------------ */
/* Validate-and-size entries                                                                                      */
/* ------------------------------------------------------------------------------------------------------------ */
/*
 * Each mxfp8_X_validate takes the arguments of mxfp8_X (outputs as const views: nothing is ever written to them) and
 * runs exactly the checks of mxfp8_X, through the same code: it returns the status mxfp8_X would return for those
 * arguments before doing any work, with the same message (which names mxfp8_X, not the _validate entry), and
 * MXFP8_OK when mxfp8_X would run. On MXFP8_OK, *workspace_bytes (when workspace_bytes is not NULL) is the number of
 * bytes of scratch the call takes from its workspace (config->workspace or args->workspace) at the current thread
 * count (mxfp8_set_num_threads): every buffer of the call and of its inner GEMMs and statistics passes, each rounded
 * up to 64 bytes. On an error it is 0. The size does not depend on the values of the tensors, only on the shapes,
 * dtypes, strides, layouts and config -- except the MoE layer's routing ids, which set the rows of its per-block
 * buffers (the longest block prefix that ends with a real position). These entries allocate nothing and touch no
 * workspace. Besides the call's own
 * errors they return none; OUT_OF_MEMORY of the call itself (its memory is obtained only when it runs) is not
 * predicted, except a size that does not fit in size_t.
 */

/** Reserve `bytes` of scratch in a workspace as one block (typically the sum of the _validate sizes of the calls
 *  it will serve, or their maximum for calls that run one after another on a fresh reservation): every buffer it
 *  held before is freed, and the buffers of later calls are taken from the block while it has room (the heap
 *  after that). A call whose _validate size is at most `bytes`, given a freshly reserved workspace, allocates
 *  nothing; later calls of no larger problems on the same workspace allocate nothing either. bytes = 0 releases
 *  everything. Not while a call uses the workspace. Errors: NULL_POINTER, INVALID_ARGUMENT (the workspace is in use
 *  by a call), OUT_OF_MEMORY (the workspace is then empty). */
MXFP8_API mxfp8_status mxfp8_workspace_reserve(mxfp8_workspace *workspace, size_t bytes);

/** The checks of mxfp8_quantize. *workspace_bytes = 0: quantization takes no workspace (with params->stats it
 *  allocates one 2464-byte statistics accumulator per thread itself). Errors: those of mxfp8_quantize. */
MXFP8_API mxfp8_status mxfp8_quantize_validate(const mxfp8_tensor *src, int axis, const mxfp8_quant_params *params,
                                               const mxfp8_tensor *data, const mxfp8_tensor *scales,
                                               size_t *workspace_bytes);
/** The checks of mxfp8_dequantize. *workspace_bytes = 0 (no scratch). Errors: those of mxfp8_dequantize. */
MXFP8_API mxfp8_status mxfp8_dequantize_validate(const mxfp8_tensor *data, const mxfp8_tensor *scales, int axis,
                                                 mxfp8_group_scheme group, const mxfp8_tensor *out,
                                                 size_t *workspace_bytes);
/** The checks of mxfp8_gemm; *workspace_bytes: the GEMM's packed operand panels and per-thread blocks, plus the
 *  statistics pass's scratch when an operand asks for statistics. Errors: those of mxfp8_gemm. */
MXFP8_API mxfp8_status mxfp8_gemm_validate(const mxfp8_operand *a, const mxfp8_operand *b,
                                           const mxfp8_matmul_config *config, int accumulate, const mxfp8_tensor *c,
                                           size_t *workspace_bytes);
/** The checks of mxfp8_matmul; *workspace_bytes as for mxfp8_gemm_validate. Errors: those of mxfp8_matmul. */
MXFP8_API mxfp8_status mxfp8_matmul_validate(const mxfp8_operand *input_activation, const mxfp8_operand *weights,
                                             const mxfp8_matmul_config *config, const mxfp8_tensor *output,
                                             size_t *workspace_bytes);
/** The checks of mxfp8_linear; *workspace_bytes as for mxfp8_gemm_validate (with the bias's FP32 copy). Errors: those
 *  of mxfp8_linear. */
MXFP8_API mxfp8_status mxfp8_linear_validate(const mxfp8_operand *input_activation, const mxfp8_operand *weights,
                                             const mxfp8_tensor *bias, const mxfp8_matmul_config *config,
                                             const mxfp8_tensor *output, size_t *workspace_bytes);
/** The checks of mxfp8_matmul_backward; *workspace_bytes: both GEMMs' buffers (dgrad and wgrad share them), dY's
 *  FP32 copy [M, N] when dY is pre-quantized or swizzled, and the statistics pass's scratch when args->stats is
 *  set. Errors: those of mxfp8_matmul_backward. */
MXFP8_API mxfp8_status mxfp8_matmul_backward_validate(const mxfp8_matmul_bwd_args *args,
                                                      const mxfp8_tensor *input_grad,
                                                      const mxfp8_tensor *weight_grad, size_t *workspace_bytes);
/** The checks of mxfp8_moe_route, the ids of topk_ids included (each in [0, num_experts), distinct within its
 *  row: the first bad one is reported as the call reports it). *workspace_bytes = 0: the router takes no workspace
 *  (the call allocates its 16 E bytes of expert counters itself). Errors: those of mxfp8_moe_route. */
MXFP8_API mxfp8_status mxfp8_moe_route_validate(const mxfp8_tensor *topk_ids, const mxfp8_tensor *topk_weights,
                                                int64_t num_experts, int64_t block_size, int32_t padding_id,
                                                const mxfp8_tensor *token_position_to_id,
                                                const mxfp8_tensor *block_to_expert,
                                                const mxfp8_tensor *expert_affinities_masked,
                                                size_t *workspace_bytes);
/** The checks of mxfp8_moe_forward: the config, every input (weights plain or pre-quantized, affinities, biases,
 *  num_valid_tokens), the routing ids of token_position_to_id and block_to_expert (each read once, nothing stored), the
 *  outputs and their aliasing, in the call's order. *workspace_bytes: everything the call takes from args->workspace --
 *  the routing table 4 (N B + N), the FP32 output accumulator 4 T H, the per-block buffers (their rows: the longest
 *  block prefix that ends with a real position, or the longest run of full blocks of one expert taken together, so it
 *  depends on the routing ids, not only on the shapes), FP32 weight copies where a GEMM needs one, both block GEMMs'
 *  buffers with the current expert's packed weights, and the statistics' slots when args->stats is set. On more than
 *  one thread, where blocks are not taken together (B (H + 2 I) FP32 values of one block within 1 MiB), without
 *  args->stats and without the down projection checkpoint, the threads take whole experts instead when the 4 N B H
 *  bytes of one weighted row per position stay within 256 MiB: then the per-block buffers, weight copies and GEMM
 *  buffers once per thread (the number of threads set now), those rows, and the tokens' position lists 4 (2 (T + 1) + N
 *  B + N + 1); the same bits either way. Errors: those of mxfp8_moe_forward. */
MXFP8_API mxfp8_status mxfp8_moe_forward_validate(const mxfp8_moe_fwd_args *args,
                                                  const mxfp8_moe_fwd_outputs *outputs, size_t *workspace_bytes);
/** The checks of mxfp8_moe_backward (the inputs and routing as for mxfp8_moe_forward_validate, dY, the
 *  checkpoints, the gradients and their aliasing), in the call's order. *workspace_bytes: everything the call takes
 *  from args->workspace -- the routing table, the FP32 dX accumulator, the current expert's FP32 dW1, dW2, the
 *  FP64 sums, the per-block buffers (rows
 *  as for the forward), FP32 weight copies where a GEMM needs one, the GEMMs of the four phases and of the
 *  recomputations that absent checkpoints need, and the statistics' slots when args->stats is set. Errors: those of
 *  mxfp8_moe_backward. */
MXFP8_API mxfp8_status mxfp8_moe_backward_validate(const mxfp8_moe_bwd_args *args, const mxfp8_moe_bwd_grads *grads,
                                                   size_t *workspace_bytes);


#ifdef __cplusplus
}
#endif
#endif /* MXFP8_H */

/* ============================================================================================================ */
/* Reference and test entry points: NO ABI PROMISE                                                              */
/* ============================================================================================================ */
/*
 * Golden references (slow, scalar FP32/FP64 paths for tests, for the verdicts of the `mxfp8` command and for anyone
 * who wants a second opinion) and the NKI pass criteria. They follow the stable API's conventions (status, message,
 * nothing written on error) but their signatures may change between minor versions. Define MXFP8_REFERENCE_API
 * before including this header to declare them (as zstd's ZSTD_STATIC_LINKING_ONLY does).
 */
#if defined(MXFP8_REFERENCE_API) && !defined(MXFP8_REFERENCE_API_DECLARED)
#define MXFP8_REFERENCE_API_DECLARED
#ifdef __cplusplus
extern "C" {
#endif

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

/** Golden references (FP64, scalar, slow: for tests and the NKI criteria of `mxfp8 moe-bwd`).
 *  Same args as mxfp8_moe_forward / mxfp8_moe_backward (same validation and errors); outputs/grads are F64 or F32
 *  views (rounded once from FP64). Everything is computed in FP64 from the inputs (exactly widened). The backward
 *  golden takes the checkpoints in args exactly as mxfp8_moe_backward does (any accepted dtype, widened exactly):
 *  g and u from gate_up_proj_act_checkpoint_T, act(g) from gate_act_checkpoint_T, act(g)*u from
 *  intermediate_checkpoint_T, the Phase 4 operand from scaled_intermediate_checkpoint_T, D from
 *  down_proj_act_checkpoint and the down projection from down_proj_output_checkpoint; what is absent it recomputes
 *  in FP64 from the inputs, so it judges the backward on the values the backward was given. Flags (accumulate_hidden_states_grad, skip_grad_initialization,
 *  num_valid_tokens, clamps, biases, activation, affinity option) have the same meaning as in the kernels.
 *  quantized = 0: the unquantized layer (pre-quantized weights enter as their exact dequantized values).
 *  quantized = 1: every GEMM operand is MX-quantized along that GEMM's contraction axis (1x32 groups,
 *  config->quant_dtype and scale_rule, values rounded to FP32 first: the quantizer's input type) and dequantized
 *  exactly, the GEMM then runs in FP64 -- the kernel without its FP32 rounding. Pre-quantized weights are used as
 *  given where their axis matches, re-quantized from their exact values otherwise (as the kernels do). */
MXFP8_API mxfp8_status mxfp8_moe_forward_golden(const mxfp8_moe_fwd_args *args, mxfp8_moe_fwd_outputs *outputs,
                                                int quantized);
MXFP8_API mxfp8_status mxfp8_moe_backward_golden(const mxfp8_moe_bwd_args *args, mxfp8_moe_bwd_grads *grads,
                                                 int quantized);

/*
 * Cross-stack diff: which quantization policy explains another stack's MXFP8 bits (`mxfp8 diff`, mxfp8.diff).
 * A profile is one of our quantizers: scale rule x element rounding x NaN/Inf policy x saturation x sign of zero.
 * mxfp8_quantize_profile quantizes under any profile (scalar, slow; the all-default profile equals mxfp8_quantize
 * with nearest rounding). mxfp8_diff re-quantizes `src` under every profile (mxfp8_diff_num_profiles of them, in the
 * order of mxfp8_diff_profile), counts the groups each reproduces bit for bit (scale code and every element code),
 * picks the best (most groups; the first on ties), and classifies the groups the best profile does not reproduce,
 * first matching class first:
 *   nonfinite   the input group holds a NaN or Inf
 *   tiny        amax < 2^(emax - 126): the shared exponent sits within two steps of E8M0's floor (2^-127)
 *   zero-sign   the scales agree and every differing element is a zero of the other sign
 *   saturation  an element's |x / 2^e| exceeds max normal under the best profile, or the other result has a NaN /
 *               Inf code for a finite input
 *   pow2        the scales differ by one step and amax is within 2^-16 (relative) of 2^k or of max_normal * 2^k
 *               (where a log2 taken in floating point instead of from the exponent bits goes wrong)
 *   subnormal   the scales agree and every differing element is an FP8 subnormal (or zero) on one side
 *   rounding    the scales agree and every differing element is the other FP8 neighbour of x / 2^e, of the same
 *               sign (another element rounding: stochastic, ties away from zero, ...)
 *   other       anything else
 * Group indices are row-major indices into the scales tensor (src's shape with the axis replaced by its groups).
 */
typedef struct mxfp8_quant_profile {
    mxfp8_scale_rule rule;
    int round_toward_zero;      /**< 0: round to nearest even; 1: truncate toward zero */
    int nonfinite_per_element;  /**< 0: a NaN / Inf makes the whole group NaN (scale 255; ours); 1: amax skips NaN
                                     and Inf, which get their own codes (NaN; Inf in E5M2, NaN in E4M3) */
    int no_saturation;          /**< 0: saturate to max normal (ours); 1: a value rounding past max normal becomes
                                     NaN (E4M3) / Inf (E5M2) */
    int unsigned_zero;          /**< 0: zeros keep their sign (ours); 1: every zero code is +0 */
} mxfp8_quant_profile;

enum { MXFP8_DIFF_NONFINITE = 0, MXFP8_DIFF_TINY, MXFP8_DIFF_ZERO_SIGN, MXFP8_DIFF_SATURATION, MXFP8_DIFF_POW2,
       MXFP8_DIFF_SUBNORMAL, MXFP8_DIFF_ROUNDING, MXFP8_DIFF_OTHER, MXFP8_DIFF_NUM_CLASSES };
#define MXFP8_DIFF_MAX_PROFILES 48
#define MXFP8_DIFF_EXAMPLES 4

typedef struct mxfp8_diff_result {
    int64_t groups;                                  /**< groups compared */
    int num_profiles;                                /**< mxfp8_diff_num_profiles() */
    int64_t matched[MXFP8_DIFF_MAX_PROFILES];        /**< groups each profile reproduces bit for bit */
    int best;                                        /**< index of the best profile */
    int64_t unexplained[MXFP8_DIFF_NUM_CLASSES];     /**< groups the best profile does not reproduce, per class */
    int64_t example[MXFP8_DIFF_NUM_CLASSES * MXFP8_DIFF_EXAMPLES]; /**< class c's first group indices at
                                                                        c * MXFP8_DIFF_EXAMPLES + i (-1: none) */
    int64_t unmatched_by_all;                        /**< groups no profile reproduces */
} mxfp8_diff_result;

/** The number of profiles mxfp8_diff tries, and profile i (0 <= i < that; NULL / out of range: INVALID_ARGUMENT). */
MXFP8_API int mxfp8_diff_num_profiles(void);
MXFP8_API mxfp8_status mxfp8_diff_profile(int i, mxfp8_quant_profile *out);
/** "nonfinite", "tiny", "zero-sign", "saturation", "pow2", "subnormal", "rounding", "other" ("?" out of range). */
MXFP8_API const char *mxfp8_diff_class_name(int c);
/** Quantize `src` along `axis` under a profile (views and errors as mxfp8_quantize; fmt and group as its params). */
MXFP8_API mxfp8_status mxfp8_quantize_profile(const mxfp8_tensor *src, int axis, mxfp8_format fmt,
                                              mxfp8_group_scheme group, const mxfp8_quant_profile *profile,
                                              mxfp8_tensor *data, mxfp8_tensor *scales);
/** Compare another stack's codes `data` (E4M3 / E5M2 / U8, src's shape) and scales (E8M0 / U8, compact, as
 *  mxfp8_quantize writes them) of `src` (F32 / BF16 / F16) quantized along `axis` with `fmt`, `group` against every
 *  profile (see above). Errors as mxfp8_quantize, OUT_OF_MEMORY. */
MXFP8_API mxfp8_status mxfp8_diff(const mxfp8_tensor *src, int axis, mxfp8_format fmt, mxfp8_group_scheme group,
                                  const mxfp8_tensor *data, const mxfp8_tensor *scales, mxfp8_diff_result *result);

#ifdef __cplusplus
}
#endif
#endif /* MXFP8_REFERENCE_API */
