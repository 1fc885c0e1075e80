/*
 * moe.h -- what the blockwise MoE files (src/ops/moe/) share: the validated problem description with its resolved
 * routing, the experts' weights as GEMM operands, the GEMM entry, and the FP32 / FP64 activation functions.
 *
 * The layer, its backward and every deviation from the NKI page are documented in include/mxfp8.h (section
 * "Blockwise MoE"). The files:
 *   config.c     config and argument defaults
 *   validate.c   every check (config, inputs, routing, outputs, aliasing), shared by the kernels, their _validate
 *                entries and the goldens; the flat routing table (filled after the call's reservation)
 *   weights.c    the experts' weights as GEMM operands (no copy unless an axis needs one), the GEMM entry
 *   route.c      mxfp8_moe_num_blocks, mxfp8_moe_route, mxfp8_moe_route_validate
 *   fwd.c        mxfp8_moe_forward, mxfp8_moe_forward_validate (moe_fwd_reserve_job: every buffer)
 *   bwd.c        mxfp8_moe_backward, mxfp8_moe_backward_validate: workspace (moe_bwd_reserve_job: every buffer)
 *                and the expert-major driver over the phases of bwd_block.c
 *   bwd_block.c  one block of the backward: recompute, Phase 1, activation backward, Phase 2 + scatter, Phases 3, 4
 *                (per block, or an expert's blocks at once: mxfp8i_moe_wgrad_segments)
 *   store.c      rounding the FP32 / FP64 accumulators once into the output views
 *   numerics.c   gpt-oss SwiGLU's limits, stochastic rounding and statistics of the GEMM operands
 *   golden.c     FP64 references (unquantized and quantized)
 */
#ifndef MXFP8_OPS_MOE_H
#define MXFP8_OPS_MOE_H

#include <math.h>

#include "../../gemm/gemm.h"
#include "../../quant/panel.h"
#include "../../runtime/fenv.h"
#include "../../runtime/threads.h"
#include "../../runtime/workspace.h"
#include "../../runtime/tensor.h"

/** Inputs common to the forward and the backward (pointers into the caller's args). */
typedef struct mxfp8i_moe_in {
    const mxfp8_tensor *X, *a, *W1, *W2, *tok, *b2e, *b1, *b2, *W1s, *W2s, *nvt;
    const mxfp8_tensor *dY; /**< backward only (NULL for the forward) */
    int64_t B;
    const mxfp8_moe_config *cfg;
} mxfp8i_moe_in;

/** A validated problem. Tensor copies have data NULL when absent. */
typedef struct mxfp8i_moe {
    const char *fn;
    int bwd;                          /**< 1: pre-quantized weights use the backward's axes */
    int64_t T, H, I, E, N, B, V;      /**< V: tokens [0, V) are real (num_valid_tokens, else T) */
    int64_t Bw;                       /**< rows of per-block workspaces: max over blocks of (last real position
                                           + 1), at least 1 (<= B) */
    int64_t Re, Se;                   /**< the most positions of one expert (each block counted up to its last
                                           real position) and the most such blocks of one expert: the segmented
                                           weight gradients' buffers (bwd.c), found by the checks' routing walk */
    int64_t Rw;                       /**< the most rows of one run of blocks (mxfp8i_moe_run_joins): the rows of
                                           the forward's and the backward's per-run buffers, found by the same
                                           walk; Bw when no run has two blocks */
    mxfp8_moe_config cfg;
    mxfp8i_recipe rc;                 /**< every GEMM operand's recipe: config.quant_dtype, config.scale_rule, 1x32
                                           (resolved once by mxfp8i_moe_check; the phase configs' are not read) */
    mxfp8_tensor X, a, W1, W2, b1, b2, W1s, W2s, dY;
    int w1_prequant, w2_prequant;
    int32_t *tok;                     /**< [N*B]: token in [0, V), or -1 for padding (a workspace slot) */
    int32_t *expert;                  /**< [N] */
    mxfp8i_qstats *qst;               /**< NULL, or [E * MXFP8_MOE_NUM_OPERANDS] operand statistics (numerics.c;
                                           a workspace slot) */
    uint8_t *wdone;                   /**< [E * MXFP8_MOE_NUM_OPERANDS]: a weight operand's statistics are in */
} mxfp8i_moe;

/** Every check of the inputs and the config (the routing ids included: INDEX_OUT_OF_RANGE for bad ids), filling *p
 *  (dims, copies, the block rows Bw) with p->tok = p->expert = NULL: nothing is stored and no workspace is used, so
 *  the _validate entries run it with no scope. */
mxfp8_status mxfp8i_moe_check(const char *fn, const mxfp8i_moe_in *in, int bwd, mxfp8i_moe *p);
/** The routing table's two slots of the current arena (a reservation function's share; OUT_OF_MEMORY with a
 *  message). mxfp8i_moe_table: those slots as p->tok and p->expert, filled from the checked routing. */
mxfp8_status mxfp8i_moe_table_reserve(const mxfp8i_moe *p);
mxfp8_status mxfp8i_moe_table(const mxfp8i_moe_in *in, mxfp8i_moe *p);
/** mxfp8i_moe_check, then mxfp8i_moe_table (the goldens; the caller must have opened a workspace scope). */
mxfp8_status mxfp8i_moe_setup(const char *fn, const mxfp8i_moe_in *in, int bwd, mxfp8i_moe *p);

/** Optional tensor check: absent is fine; else rank `ndim`, dtype in {F32, BF16, F16} (plus F64 when allow_f64) and
 *  the given extents. */
mxfp8_status mxfp8i_moe_check_tensor(const char *fn, const char *name, const mxfp8_tensor *t, int required,
                                     int allow_f64, int ndim, const int64_t *shape);
/** A [n, 1] or [n] float tensor (affinities and their gradient). */
mxfp8_status mxfp8i_moe_check_vec(const char *fn, const char *name, const mxfp8_tensor *t, int allow_f64, int64_t n);
/** Error ALIASING if output `o` overlaps any of the `n` views in `v` (absent views are skipped). */
mxfp8_status mxfp8i_moe_check_alias(const char *fn, const char *oname, const mxfp8_tensor *o, int n,
                                    const mxfp8_tensor *const *v, const char *const *names);

/** Element (i) of a [n, 1] / [n] view. */
static inline int64_t mxfp8i_moe_vec_off(const mxfp8_tensor *t, int64_t i) { return i * t->strides[0]; }
/** Element (r, c) of a 2-D view, as float. */
static inline float mxfp8i_moe_ld2(const mxfp8_tensor *t, int64_t r, int64_t c) {
    return mxfp8i_load_f32(t->data, t->dtype, r * t->strides[0] + c * t->strides[1]);
}
/** Row r of a 2-D F32/BF16/F16 view as FP32 into out[0..n) (exact; vectorizable for unit-stride rows). */
static inline void mxfp8i_moe_row_f32(const mxfp8_tensor *t, int64_t r, int64_t n, float *out) {
    const int64_t s1 = t->strides[1], base = r * t->strides[0];
    if (s1 == 1 && t->dtype == MXFP8_DTYPE_BF16) {
        const uint16_t *p = (const uint16_t *)t->data + base;
        uint32_t *o = (uint32_t *)out;
        for (int64_t h = 0; h < n; h++) o[h] = (uint32_t)p[h] << 16;
    } else if (s1 == 1 && t->dtype == MXFP8_DTYPE_F32) {
        memcpy(out, (const float *)t->data + base, (size_t)n * sizeof(float));
    } else {
        for (int64_t h = 0; h < n; h++) out[h] = mxfp8i_load_f32(t->data, t->dtype, base + h * s1);
    }
}
/** The dtype of a block's X buffer: BF16 for a BF16 input with unit-stride rows (the same values, so the same
 *  quantization; half the bytes, and the packer's BF16 lanes), else F32. X_blk enters GEMMs only. The backward
 *  gathers dY's rows by the same rule where only GEMMs read them (bwd_state.h, dy16). */
static inline mxfp8_dtype mxfp8i_moe_xb_dtype(const mxfp8_tensor *X) {
    return X->dtype == MXFP8_DTYPE_BF16 && X->strides[1] == 1 ? MXFP8_DTYPE_BF16 : MXFP8_DTYPE_F32;
}
/** Row q of a block's X buffer (rows of H elements of mxfp8i_moe_xb_dtype(X)): token row t of X, or zeros for
 *  t < 0 (padding). */
static inline void mxfp8i_moe_x_row(const mxfp8_tensor *X, int64_t t, int64_t H, void *buf, int64_t q) {
    const int b16 = mxfp8i_moe_xb_dtype(X) == MXFP8_DTYPE_BF16;
    const size_t es = b16 ? sizeof(uint16_t) : sizeof(float);
    char *row = (char *)buf + (size_t)(q * H) * es;
    if (t < 0) memset(row, 0, (size_t)H * es);
    else if (b16) memcpy(row, (const uint16_t *)X->data + t * X->strides[0], (size_t)H * es);
    else mxfp8i_moe_row_f32(X, t, H, (float *)row);
}
/** Ask for the bytes [p, p + bytes) ahead of their use (the rows that gathers and scatters reach at random token
 *  ids: a whole row from memory would otherwise stall; speed only). */
static inline void mxfp8i_moe_prefetch(const void *p, size_t bytes, int for_write) {
    const char *c = (const char *)p;
    for (size_t o = 0; o < bytes; o += 64) {
        if (for_write) __builtin_prefetch(c + o, 1, 3);
        else __builtin_prefetch(c + o, 0, 3);
    }
}
/** mxfp8i_moe_prefetch of row r of a 2-D view (unit-stride rows only; others are left to the hardware). */
static inline void mxfp8i_moe_prefetch_row(const mxfp8_tensor *t, int64_t r, int64_t n) {
    if (t->strides[1] == 1)
        mxfp8i_moe_prefetch((const char *)t->data + (size_t)(r * t->strides[0]) * mxfp8_dtype_size(t->dtype),
                            (size_t)n * mxfp8_dtype_size(t->dtype), 0);
}
/** Affinity a[t*E + e] as float. */
static inline float mxfp8i_moe_aff(const mxfp8i_moe *p, int64_t t, int64_t e) {
    return mxfp8i_load_f32(p->a.data, p->a.dtype, mxfp8i_moe_vec_off(&p->a, t * p->E + e));
}
/** Exact FP32 values of W1[e] as [H][2I] (column j*I + i) and W2[e] as [I][H] (pre-quantized weights dequantized
 *  with the pass's scale layout). */
void mxfp8i_moe_load_w1(const mxfp8i_moe *p, int64_t e, float *w1f);
void mxfp8i_moe_load_w2(const mxfp8i_moe *p, int64_t e, float *w2f);
/** Bias values b1[e] [2I] and b2[e] [H] as float (zeros when absent or config.bias == 0). */
void mxfp8i_moe_load_b1(const mxfp8i_moe *p, int64_t e, float *b1);
void mxfp8i_moe_load_b2(const mxfp8i_moe *p, int64_t e, float *b2);

/** Which weight a GEMM reads, viewed [R, K] with K its contraction axis. */
typedef enum mxfp8i_moe_wuse {
    MXFP8I_W1_H = 0,  /**< W1[e] as [2I, H] (row c = j*I + i), along H: forward GEMM 1 and its recomputation */
    MXFP8I_W1_2I = 1, /**< W1[e] as [H, 2I], along 2I: backward Phase 2 */
    MXFP8I_W2_I = 2,  /**< W2[e] as [H, I], along I: forward GEMM 2 and the AFFINITY_ON_H recomputation */
    MXFP8I_W2_H = 3   /**< W2[e] as [I, H], along H: backward Phase 1 */
} mxfp8i_moe_wuse;

/** The exact FP32 copies of one expert's weights, for the uses that need one (weights.c). */
typedef struct mxfp8i_moe_wcopy {
    float *w1f, *w2f; /**< W1[e] [H][2I] (column j*I + i), W2[e] [I][H]; NULL when no use needs them */
    int64_t e1, e2;   /**< the expert each holds, -1 = none */
} mxfp8i_moe_wcopy;
/** 1 when `use` reads an FP32 copy instead of the caller's tensor: pre-quantized weights along another axis, or W1
 *  whose (2, I) dimensions are not one axis of stride. */
int mxfp8i_moe_weight_needs_copy(const mxfp8i_moe *p, mxfp8i_moe_wuse use);
/** The copies the uses in the bitmask `uses` (1 << use) need, as workspace slots. OUT_OF_MEMORY or OK. */
mxfp8_status mxfp8i_moe_wcopy_alloc(const mxfp8i_moe *p, unsigned uses, mxfp8i_moe_wcopy *w);
/** Expert e's weight as the GEMM operand of `use`: a view of the caller's tensor (high precision, or codes and
 *  scales pre-quantized along this axis), else the FP32 copy (filled here when it holds another expert). Equal
 *  values give equal packed panels, so the operand's data pointer keys the GEMM workspace's weight cache. */
mxfp8i_gop mxfp8i_moe_weight(const mxfp8i_moe *p, mxfp8i_moe_wcopy *w, int64_t e, mxfp8i_moe_wuse use);

/** Reserve (mxfp8i_gemm_reserve) what every later mxfp8i_moe_gemm of at most M rows, N columns and contraction K
 *  takes, for either of its thread counts (1 only under mxfp8i_moe_gemm_one_thread); keyed_slot >= 0 for weights
 *  kept in that keyed slot. */
mxfp8_status mxfp8i_moe_gemm_reserve(const mxfp8i_moe *p, int64_t M, int64_t N, int64_t K, int keyed_slot);
/** While on (per thread), this thread's mxfp8i_moe_gemm calls and reservations, and its mxfp8i_moe_nt passes, use 1
 *  thread: a worker of a parallel region that runs whole blocks by itself (the expert-parallel paths). Returns the
 *  previous setting. */
int mxfp8i_moe_gemm_one_thread(int on);
extern _Thread_local int mxfp8i_moe_alone; /**< the setting (numerics.c) */
/** A worker of an expert-parallel path's parallel region (numerics.c): begin opens its thread's share of `arenas`
 *  (`bytes` each) as its scope, enters the IEEE defaults and runs its GEMMs on its own thread; end undoes them and
 *  raises *failed (atomically) unless ok. */
typedef struct mxfp8i_moe_worker {
    mxfp8i_scope sc;
    unsigned csr;
    int one; /**< the thread's mxfp8i_moe_gemm_one_thread setting before */
    int t;   /**< the thread's number in the region */
} mxfp8i_moe_worker;
void mxfp8i_moe_worker_begin(mxfp8i_moe_worker *k, char *arenas, size_t bytes);
void mxfp8i_moe_worker_end(mxfp8i_moe_worker *k, int ok, int *failed);
/** C[M, N] (=|+=) sum_k deq(A)[m, k] * deq(B)[n, k] with M = A->R, N = B->R, K = A->K; C F32 row-major with leading
 *  dimension ldc. Both operands quantized along K with their own recipe (gop.rc: the layer's p->rc) and rounding
 *  (gop.sr). ida / idb: the operands' mxfp8_moe_operand ids for expert e's statistics (numerics.c; a weight's are
 *  taken once per expert). Deterministic for any thread count. Returns MXFP8_OK or MXFP8_ERR_OUT_OF_MEMORY. */
mxfp8_status mxfp8i_moe_gemm(const mxfp8i_moe *p, int64_t e, const mxfp8i_gop *A, int ida, const mxfp8i_gop *B,
                             int idb, int accumulate, float *C, int64_t ldc);

/** Segmented weight gradients: C [M, N] += the GEMM of A[s], B[s] for each of the nseg segments in order (the
 *  blocks of one expert along their positions), bitwise what nseg mxfp8i_moe_gemm calls with accumulate give, the
 *  operands' statistics taken segment by segment likewise (mxfp8i_gemm_segments; c_zero: C is known to hold +0
 *  and is not read; cdt F32, or BF16 with c_zero: the FP32 sums rounded once; stream: C is the caller's output,
 *  written once, its F32 stores past the caches). OK or OUT_OF_MEMORY. */
mxfp8_status mxfp8i_moe_gemm_segments(const mxfp8i_moe *p, int64_t e, int nseg, const mxfp8i_gop *A, int ida,
                                      const mxfp8i_gop *B, int idb, int c_zero, int stream, void *C, mxfp8_dtype cdt,
                                      int64_t ldc);
/** Reserve what every later mxfp8i_moe_gemm_segments of C [M, N] with at most nseg segments of at most Kmax
 *  positions takes, for either of its thread counts. */
mxfp8_status mxfp8i_moe_gemm_segments_reserve(const mxfp8i_moe *p, int64_t M, int64_t N, int64_t Kmax, int nseg);

/* ---- numerics.c: gpt-oss SwiGLU's limits, stochastic rounding and statistics of the operands ---- */
/** Validate the gpt-oss SwiGLU parameters and the rounding bitmask; fold swiglu_limit into the clamp limits of
 *  `cfg` (gate upper, up lower and upper) so that every pass clamps and masks with them. */
mxfp8_status mxfp8i_moe_numerics_config(const char *fn, mxfp8_moe_config *cfg);
/** The quantization of block operand `id` of block n: the layer's recipe (p->rc), and stochastic rounding when the
 *  config asks for it, with logical index n*B*width + r*i0 + k*i1 (the dispatched [N*B, width] tensor; i0, i1 its
 *  steps along the GEMM's rows and K). Every activation operand of a phase GEMM goes through it. */
void mxfp8i_moe_round_block(const mxfp8i_moe *p, mxfp8i_gop *op, int id, int64_t n, int64_t width, int64_t i0,
                            int64_t i1);
/** mxfp8i_moe_stats_reserve: the statistics slot and the statistics passes' scratch when `stats` is not NULL (a
 *  reservation function's share: nothing written). mxfp8i_moe_stats_alloc: the same, then p->qst (zeroed) and
 *  p->wdone from the slot (so that no later GEMM of the call can fail for them). OUT_OF_MEMORY or OK. */
mxfp8_status mxfp8i_moe_stats_reserve(const mxfp8i_moe *p, const mxfp8_quant_stats *stats);
mxfp8_status mxfp8i_moe_stats_alloc(mxfp8i_moe *p, const mxfp8_quant_stats *stats);
/** Write the statistics into the caller's array (nothing when p->qst is NULL). */
void mxfp8i_moe_stats_export(const mxfp8i_moe *p, mxfp8_quant_stats *stats);

/** Clamp keeping NaN (absent limits are +-INFINITY); the FP32 one is src/kernels/act_rows.h's. */
static inline double mxfp8i_moe_clamp_d(double x, double lo, double hi) { return x < lo ? lo : (x > hi ? hi : x); }
/** Gradient mask of a clamp (1 = the clamp passed the value through). An absent limit (-INFINITY lower,
 *  +INFINITY upper) masks nothing, so +-Inf and NaN pass; a present limit masks with strict comparisons where NaN
 *  counts as inside (non-finite values propagate, never hidden). */
static inline int mxfp8i_moe_clamp_pass(double x, double lo, double hi) {
    return (lo == -INFINITY || !(x <= lo)) && (hi == INFINITY || !(x >= hi));
}

/** An activation as data: act(g) = g * sigmoid(beta g) for the sigmoid-gated kinds, max(g, 0)^2 for squared ReLU;
 *  inter = act(g) * (u + 1) when up_plus_one (else act(g) * u, exactly: no + 0 that would turn -0 into +0); the
 *  config's swiglu_limit tightens the clamp limits when uses_limit (numerics.c). A new sigmoid-gated activation is
 *  one row of mxfp8i_moe_acts (act.c). */
typedef enum mxfp8i_act_kind { MXFP8I_ACT_SIGMOID_GATED = 0, MXFP8I_ACT_SQUARED_RELU = 1 } mxfp8i_act_kind;
typedef struct mxfp8i_act_desc {
    mxfp8i_act_kind kind;
    int beta_from_config; /* beta = config.swiglu_alpha (else beta / beta_d below) */
    float beta;           /* the sigmoid's beta in the FP32 expressions */
    double beta_d;        /* and in the FP64 ones of the goldens (1.702, not (double)1.702f) */
    int up_plus_one;      /* inter = act(g) * (u + 1) */
    int uses_limit;       /* config.swiglu_limit tightens gate_clamp_upper and the up limits */
} mxfp8i_act_desc;
/** The descriptors by mxfp8_activation (validated values only). */
extern const mxfp8i_act_desc mxfp8i_moe_acts[];
static inline const mxfp8i_act_desc *mxfp8i_moe_act_desc(const mxfp8_moe_config *c) {
    return &mxfp8i_moe_acts[c->activation];
}
static inline float mxfp8i_moe_beta(const mxfp8_moe_config *c) {
    const mxfp8i_act_desc *a = mxfp8i_moe_act_desc(c);
    return a->beta_from_config ? c->swiglu_alpha : a->beta;
}
static inline double mxfp8i_moe_beta_d(const mxfp8_moe_config *c) {
    const mxfp8i_act_desc *a = mxfp8i_moe_act_desc(c);
    return a->beta_from_config ? (double)c->swiglu_alpha : a->beta_d;
}

/** 1 for the activations g * sigmoid(beta g), whose sigmoid act.c keeps for act'(g). */
static inline int mxfp8i_moe_sigmoid_act(const mxfp8_moe_config *c) {
    return mxfp8i_moe_act_desc(c)->kind == MXFP8I_ACT_SIGMOID_GATED;
}
/** The up factor of inter = act(g) * up(u): u + 1 when the descriptor says so, else u itself. */
static inline float mxfp8i_moe_up(const mxfp8_moe_config *c, float u) {
    return mxfp8i_moe_act_desc(c)->up_plus_one ? u + 1.0f : u;
}
static inline double mxfp8i_moe_act_d(const mxfp8_moe_config *c, double g) {
    if (mxfp8i_moe_act_desc(c)->kind == MXFP8I_ACT_SQUARED_RELU) {
        double r = !(g <= 0.0) ? g : 0.0;
        return r * r;
    }
    return g / (1.0 + exp(-mxfp8i_moe_beta_d(c) * g));
}
static inline double mxfp8i_moe_dact_d(const mxfp8_moe_config *c, double g) {
    if (mxfp8i_moe_act_desc(c)->kind == MXFP8I_ACT_SQUARED_RELU) return !(g <= 0.0) ? 2.0 * g : 0.0;
    const double b = mxfp8i_moe_beta_d(c), s = 1.0 / (1.0 + exp(-b * g));
    return s * (1.0 + b * g * (1.0 - s));
}
static inline double mxfp8i_moe_up_d(const mxfp8_moe_config *c, double u) {
    return mxfp8i_moe_act_desc(c)->up_plus_one ? u + 1.0 : u;
}

/** The elementwise work of one real position (act.c, through the registry's rows: src/kernels/act_rows.h), the FP32
 *  counterparts of mxfp8i_moe_act_d, _dact_d and _clamp_pass element by element.
 *  Forward row: with gu (GEMM 1's row [2I]) g = clamp(gu[:I] + b1[:I]), u = clamp(gu[I:] + b1[I:]) (else g, u are
 *  given); act = act(g) unless act_given; inter = act * up(u) unless inter_given; S = aq * inter when S is not
 *  NULL; sg, when not NULL, receives sigmoid(c g) of the SiLU / Swish / gpt-oss activations (untouched otherwise).
 *  Backward row: dgu [2I] = [dIv * up(u) * act'(g) * pass(g) | dIv * act * pass(u)] with dIv = aq * dI (scale) or
 *  dI; act'(g) from sg (the forward row's sigmoid) when not NULL. */
void mxfp8i_moe_fwd_row(const mxfp8_moe_config *c, int64_t I, const float *gu, const float *b1, float *g, float *u,
                        float *act, int act_given, float *inter, int inter_given, float *S, float aq, float *sg);
void mxfp8i_moe_bwd_row(const mxfp8_moe_config *c, int64_t I, const float *dI, float aq, int scale, const float *g,
                        const float *u, const float *act, const float *sg, float *dgu);

/** store.c: a row-major flat FP32 / FP64 buffer rounded once into a view of any dtype and strides; add != 0: the
 *  view's given value + src (one FP32 addition), then rounded. */
void mxfp8i_moe_store_flat_f(const mxfp8_tensor *t, const float *src, int add);
/** Whether FP32 sums enter view t by the registry's to_bf16 alone (a contiguous BF16 view, no given value to add):
 *  mxfp8i_moe_store_flat_f's vectorized rounding, which the combine then does row by row from L1 instead. */
static inline int mxfp8i_moe_to_bf16_direct(const mxfp8_tensor *t, int add) {
    return t && !add && t->dtype == MXFP8_DTYPE_BF16 && mxfp8i_is_contiguous(t);
}
/** acc[0, n) = +0, threads splitting the range (the layer's FP32 output accumulators, zeroed at the start of a
 *  call: a serial memset of T x H floats left the other threads waiting). */
void mxfp8i_moe_zero_f(float *acc, int64_t n);
void mxfp8i_moe_store_flat_d(const mxfp8_tensor *t, const double *src, int add);
/** store.c: the combine's buffers in the call's arena, slots *k, *k + 1, ... (*k advanced past them): its
 *  accumulator acc [T*H] (the call's output accumulator), V [N*B, H] and its scratch first [2 (T + 1)] and list
 *  [N*B], as mxfp8i_moe_combine_rows takes them. 1, or 0 when one could not be allocated. */
int mxfp8i_moe_combine_reserve(const mxfp8i_moe *p, int *k, float **acc, float **V, int32_t **first, int32_t **list);
/** store.c: the combine of the expert-parallel paths: acc[t] = +0 + v[q] + ... with v[q] = V[q] (rows of H floats,
 *  acc [T, H], V [N*B, H]), or with aq given v[q] = aq[q] * (V[q] + b2[expert of q]) (aq [N*B], b2 [E, H]: the
 *  forward's weighting, one FP32 addition and one multiplication per element); the additions of a zeroed
 *  accumulator, acc written whole: +0 for a token without rows; over each token
 *  t's real positions q, taken block by block in the order the nb blocks of bord are listed (every block with a real
 *  position among them; bord NULL: all N blocks ascending), positions ascending within a block; first [2 (T + 1)]
 *  and list [N*B] are scratch. Threads split the tokens: the same bits for any thread count. When out is a
 *  contiguous BF16 [T, H] view and add is 0, each sum is rounded into out instead (as mxfp8i_moe_store_flat_f would
 *  round it; acc is then scratch) and 1 is returned; else 0, acc holding the sums for mxfp8i_moe_store_flat_f.
 *  It is mxfp8i_moe_combine_plan, then mxfp8i_moe_combine_tokens on each thread's range of tokens: a caller that
 *  schedules the ranges itself calls the two. */
int mxfp8i_moe_combine_rows(const mxfp8i_moe *p, const int32_t *bord, int64_t nb, const float *V, const float *aq,
                            const float *b2, float *acc, int32_t *first, int32_t *list, const mxfp8_tensor *out,
                            int add);
/** The combine's order into first and list (a counting sort of the positions by token, serial); returns whether
 *  the sums are rounded straight into out (direct). */
int mxfp8i_moe_combine_plan(const mxfp8i_moe *p, const int32_t *bord, int64_t nb, int32_t *first, int32_t *list,
                            const mxfp8_tensor *out, int add);
/** The sums of tokens [t0, t1) on the calling thread (under IEEE defaults), from the plan's first and list;
 *  direct: rounded into out, row t0 of acc their scratch (so ranges run side by side never share one). */
void mxfp8i_moe_combine_tokens(const mxfp8i_moe *p, const float *V, const float *aq, const float *b2, float *acc,
                               const int32_t *first, const int32_t *list, const mxfp8_tensor *out, int direct,
                               int64_t t0, int64_t t1);

/** Output checks shared by the kernels and the goldens (allow_f64: golden outputs may be F64). */
mxfp8_status mxfp8i_moe_check_fwd_outputs(const mxfp8i_moe *p, const mxfp8i_moe_in *in, const mxfp8_moe_fwd_outputs *o,
                                          int allow_f64);
mxfp8_status mxfp8i_moe_check_bwd_grads(const mxfp8i_moe *p, const mxfp8i_moe_in *in, const mxfp8_moe_bwd_args *args,
                                        const mxfp8_moe_bwd_grads *g, int allow_f64);
/** ALIASING if outputs[i] overlaps any input of `in`, any of `extra`, or another output. */
mxfp8_status mxfp8i_moe_check_outputs_alias(const char *fn, const mxfp8i_moe_in *in, int n,
                                            const mxfp8_tensor *const *outs, const char *const *onames,
                                            const mxfp8_tensor *const *extra, const char *const *enames, int nextra);
/** The common inputs of forward / backward args. */
/** Point `in` at the tensors the forward and backward argument structs share (same field names in both). */
#define MXFP8I_MOE_IN_COMMON(in, a)                                                                              \
    do {                                                                                                        \
        (in)->X = &(a)->hidden_states;                                                                          \
        (in)->a = &(a)->expert_affinities_masked;                                                               \
        (in)->W1 = &(a)->gate_up_proj_weight;                                                                   \
        (in)->W2 = &(a)->down_proj_weight;                                                                      \
        (in)->tok = &(a)->token_position_to_id;                                                                 \
        (in)->b2e = &(a)->block_to_expert;                                                                      \
        (in)->b1 = &(a)->gate_and_up_proj_bias;                                                                 \
        (in)->b2 = &(a)->down_proj_bias;                                                                        \
        (in)->W1s = &(a)->gate_up_weight_scales;                                                                \
        (in)->W2s = &(a)->down_weight_scales;                                                                   \
        (in)->nvt = &(a)->num_valid_tokens;                                                                     \
        (in)->B = (a)->block_size;                                                                              \
        (in)->cfg = (a)->config;                                                                                \
    } while (0)

void mxfp8i_moe_in_fwd(const mxfp8_moe_fwd_args *a, mxfp8i_moe_in *in);
void mxfp8i_moe_in_bwd(const mxfp8_moe_bwd_args *a, mxfp8i_moe_in *in);
/** Index of the last real position of block n plus one (0 for a padding-only block). */
static inline int64_t mxfp8i_moe_block_len(const mxfp8i_moe *p, int64_t n) {
    for (int64_t q = p->B; q > 0; q--)
        if (p->tok[n * p->B + q - 1] >= 0) return q;
    return 0;
}
/** Store v into element `off` of a F32/BF16/F16/F64 view. */
static inline void mxfp8i_moe_st(const mxfp8_tensor *t, int64_t off, double v) {
    if (t->dtype == MXFP8_DTYPE_F64) ((double *)t->data)[off] = v;
    else mxfp8i_store_f32(t->data, t->dtype, off, (float)v);
}
static inline double mxfp8i_moe_ld(const mxfp8_tensor *t, int64_t off) {
    if (t->dtype == MXFP8_DTYPE_F64) return ((const double *)t->data)[off];
    return (double)mxfp8i_load_f32(t->data, t->dtype, off);
}

/** Runs of blocks: consecutive blocks of one expert, each full but the last (lengths B, ..., B, L), stacked into one
 *  block of up to MXFP8I_MOE_RUN_ROWS rows, so that the forward's GEMMs, elementwise rows and scatter, and the
 *  backward's Phases 1 and 2 with their elementwise work and scatter, take a few parallel regions per run instead
 *  of per block (Phases 3 and 4 stay per block). The stacked rows are the blocks' rows in order, so every row's
 *  values, stochastic-rounding indices (linear in the position) and statistics are the per-block ones and every
 *  scatter and sum adds in the same order: the same bits. Speed only, so only where one block's FP32 rows
 *  (B (H + 2I) floats) already pass a core's L2 (1 MiB): measured on AMD Zen 4 with 1 thread, H = I = 1024,
 *  B = 128: forward 3-10% and backward 2-13% faster; at H = 256, I = 512 (640 KiB per block) 5-7% slower.
 *  Whether block n + 1 (expert e_next, length L_next) joins the run of `blocks` blocks of expert e whose last
 *  block has length L. */
#define MXFP8I_MOE_RUN_ROWS 512
extern int mxfp8i_moe_runs_mode; /**< -1: by size (the default); 0: never; 1: always (mxfp8i_moe_set_block_runs) */
/** Whether runs of blocks pay at this layer's width (mxfp8i_moe_runs_mode forces the answer). */
static inline int mxfp8i_moe_runs_pay(const mxfp8i_moe *p) {
    return mxfp8i_moe_runs_mode < 0 ? 4.0 * (double)p->B * (double)(p->H + 2 * p->I) > 1048576.0
                                    : mxfp8i_moe_runs_mode;
}
static inline int mxfp8i_moe_run_joins(const mxfp8i_moe *p, int64_t blocks, int64_t e, int64_t L, int64_t e_next,
                                       int64_t L_next) {
    const int64_t B = p->B;
    return mxfp8i_moe_runs_pay(p) && (blocks + 1) * B <= MXFP8I_MOE_RUN_ROWS && e_next == e && L == B && L_next > 0;
}
/** The rows and block counts the reservations size for (speed only): the call's own (p->Bw, p->Rw, p->Re, p->Se)
 *  or, where larger, the most that any routing of mxfp8_moe_route's layout with the call's shapes can need -- an
 *  expert's blocks hold at most T tokens, from each block's first position on, so a block has at most min(B, T)
 *  rows, a run of blocks at most min(its stack of full blocks, T), an expert at most min(T, N B) positions in at
 *  most min(N, ceil(T / B)) blocks. The calls of a training loop, whose routing changes from step to step, then
 *  never need a larger workspace than the first one. */
static inline int64_t mxfp8i_moe_max64(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t mxfp8i_moe_min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t mxfp8i_moe_size_Bw(const mxfp8i_moe *p) {
    return mxfp8i_moe_max64(p->Bw, mxfp8i_moe_min64(p->B, p->T));
}
static inline int64_t mxfp8i_moe_size_Rw(const mxfp8i_moe *p) {
    const int64_t stack = mxfp8i_moe_runs_pay(p) ? mxfp8i_moe_max64(1, MXFP8I_MOE_RUN_ROWS / p->B) * p->B : p->B;
    return mxfp8i_moe_max64(p->Rw, mxfp8i_moe_min64(stack, mxfp8i_moe_min64(p->T, p->N * p->B)));
}
static inline int64_t mxfp8i_moe_size_Re(const mxfp8i_moe *p) {
    return mxfp8i_moe_max64(p->Re, mxfp8i_moe_min64(p->T, p->N * p->B));
}
static inline int64_t mxfp8i_moe_size_Se(const mxfp8i_moe *p) {
    return mxfp8i_moe_max64(p->Se, mxfp8i_moe_min64(p->N, p->B > 0 ? (p->T + p->B - 1) / p->B : 0));
}
/** Test-only switch of the runs (-1: by size, 0: never, 1: whenever blocks qualify). Not thread-safe: set it while
 *  no MoE call runs. Returns the previous value. */
int mxfp8i_moe_set_block_runs(int mode);
/** The expert-parallel paths of the forward (fwd.c forward_par: threads take groups of one expert's blocks) and the
 *  backward (bwd.c backward_par: threads take whole blocks and whole weight gradients from one schedule):
 *  where runs of blocks do not pay (small widths), each block runs on one thread, and the additions across experts
 *  are made afterwards in the serial walk's order: the same bits. Whether a call takes one: runs do not pay, more
 *  than one thread runs (mxfp8i_moe_par_mode forces it), no operand statistics (accumulated per expert in the serial
 *  walk's order), and each position's row of H floats within 256 MiB in all; each path adds its own conditions. */
extern int mxfp8i_moe_par_mode; /**< -1: by size (the default); 0: never; 1: always (mxfp8i_moe_set_expert_parallel) */
static inline int mxfp8i_moe_par_pays(const mxfp8i_moe *p, const mxfp8_quant_stats *stats) {
    if (mxfp8i_moe_par_mode == 0 || stats || mxfp8i_moe_runs_pay(p)) return 0;
    if ((double)p->N * (double)p->B * (double)p->H * sizeof(float) > 268435456.0) return 0;
    return mxfp8i_moe_par_mode == 1 || mxfp8i_num_threads() > 1;
}
/** Test-only switch of both expert-parallel paths (-1: where mxfp8i_moe_par_pays, 0: never, 1: wherever it applies,
 *  also on 1 thread). Not thread-safe, as above. Returns the previous value. */
int mxfp8i_moe_set_expert_parallel(int mode);

/** Threads for `work` elementwise operations (or multiply-adds): 1 below a threshold, so that small problems do not
 *  pay OpenMP fork/barrier costs (results never depend on the thread count). */
static inline int mxfp8i_moe_nt(double work) {
    return work < 65536.0 || mxfp8i_moe_alone ? 1 : mxfp8i_num_threads();
}

/** Number of groups of 32 along an axis of length K. */
static inline int64_t mxfp8i_moe_groups(int64_t K) { return (K + 31) / 32; }

#endif /* MXFP8_OPS_MOE_H */
