/*
 * driver.c -- the block-scaled GEMM driver: config resolution, packing, cache blocking, loop orders, thread split,
 * epilogue. Contract in gemm.h; microkernel contract in ukernel.h.
 *
 * Plan of one call (M, N, K >= 1):
 *   1. B (the operand every output row needs) is quantized/dequantized once into NR-column panels covering all of K
 *      (threads split the panels).
 *   2. spill_reload = 1: A is likewise packed once into MR-row panels in a shared workspace. spill_reload = 0: each
 *      thread packs the MR-row panels of the block rows it is about to use into its own buffer (re-quantizing what
 *      another thread may also quantize: NKI's "quantize again" instead of "spill and reload").
 *   3. The output is cut into blocks (tile_m * TILES_IN_BLOCK_M rows by tile_n * TILES_IN_BLOCK_N columns). Threads
 *      split the blocks along N (lnc_2_shard_rhs) or M; each block has exactly one owner. Within a block, tiles
 *      (tile_m x tile_n x tile_k) run in tile_loop_order; each tile runs the microkernel over its MR x NR register
 *      tiles, accumulating in the owner's FP32 block buffer. k is ascending in every loop order, so the FP32 sum of
 *      every element is the same sequence of fused multiply-adds whatever the order, blocking or thread count.
 *   4. Epilogue: the owner rounds its block once to C's dtype (RNE), or adds it to C (accumulate, F32).
 */
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "gemm.h"
#include "ukernel.h"
#include "../kernels/amx/amx.h" /* [perf hook] */

/* ---------------------------------------------------------------------------------------------------------- */
/* microkernel selection                                                                                       */
/* ---------------------------------------------------------------------------------------------------------- */
static int64_t f32_panel_bytes(int64_t K, int w) { return K * w * (int64_t)sizeof(float); }
/* FP32 panel: panel[k*w + i] = src[i*rs + k]; rows past `rows` zero. */
static void f32_pack(int is_b, const float *src, int64_t rs, int rows, int64_t K, void *panel) {
    int w = is_b ? MXFP8I_NR : MXFP8I_MR;
    float *p = (float *)panel;
    for (int64_t k0 = 0; k0 < K; k0 += 64) {
        int64_t k1 = k0 + 64 < K ? k0 + 64 : K;
        for (int i = 0; i < rows; i++)
            for (int64_t k = k0; k < k1; k++) p[k * w + i] = src[i * rs + k];
    }
    if (rows < w)
        for (int64_t k = 0; k < K; k++)
            for (int i = rows; i < w; i++) p[k * w + i] = 0.0f;
}
static void run_ref(int64_t k0, int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mr, int nr,
                    int load_c) {
    mxfp8i_f32_gemm_8x32__ref(kc, (const float *)a + k0 * MXFP8I_MR, (const float *)b + k0 * MXFP8I_NR, c, ldc, mr,
                              nr, load_c);
}
static void run_avx512f(int64_t k0, int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int mr, int nr,
                        int load_c) {
    mxfp8i_f32_gemm_8x32__avx512f(kc, (const float *)a + k0 * MXFP8I_MR, (const float *)b + k0 * MXFP8I_NR, c, ldc,
                                  mr, nr, load_c);
}
static const mxfp8i_ukernel k_ref = {"f32_gemm_8x32__ref", MXFP8I_PANEL_F32, MXFP8I_MR, MXFP8I_NR, 1, 1,
                                     mxfp8i_f32_gemm_8x32__ref, f32_panel_bytes, f32_pack, run_ref};
static const mxfp8i_ukernel k_avx512f = {"f32_gemm_8x32__avx512f", MXFP8I_PANEL_F32, MXFP8I_MR, MXFP8I_NR, 1, 1,
                                         mxfp8i_f32_gemm_8x32__avx512f, f32_panel_bytes, f32_pack, run_avx512f};

const mxfp8i_ukernel *mxfp8i_ref_ukernel(void) { return &k_ref; }
const mxfp8i_ukernel *mxfp8i_f32_avx512_ukernel(void) {
#if defined(__x86_64__)
    if (mxfp8i_use_avx512()) return &k_avx512f;
#endif
    return NULL;
}
static const mxfp8i_ukernel *_Atomic g_forced;
void mxfp8i_force_ukernel(const mxfp8i_ukernel *uk) { g_forced = uk; }
const mxfp8i_ukernel *mxfp8i_select_ukernel(void) {
    const mxfp8i_ukernel *f = g_forced;
    if (f) return f;
#if defined(__x86_64__)
    /* [perf hook] BF16 chunk-panel kernels (src/kernels/amx/amx.h), each only after its one-time self-test passed. */
    if (mxfp8i_isa() == MXFP8_ISA_AMX && (f = mxfp8i_amx_ukernel())) return f;
    if (mxfp8i_use_avx512_bf16() && (f = mxfp8i_avx512bf16_ukernel())) return f;
    if (mxfp8i_use_avx512()) return &k_avx512f;
#endif
    return &k_ref;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* config                                                                                                      */
/* ---------------------------------------------------------------------------------------------------------- */
void mxfp8_matmul_config_init(mxfp8_matmul_config *config) {
    if (!config) return;
    memset(config, 0, sizeof *config);
    config->block_loop_order = MXFP8_LOOP_MNK;
    config->tile_loop_order = MXFP8_LOOP_MNK;
    config->float8_dtype = MXFP8_FMT_E5M2;
    config->run_with_lnc2 = 1;
    config->lnc_2_shard_rhs = -1;
    config->spill_reload = 0;
    config->quant_scheme = MXFP8_GROUP_1X32;
    config->scale_rule = MXFP8_SCALE_NKI;
}

mxfp8_status mxfp8i_check_config(const char *fn, const char *name, const mxfp8_matmul_config *c) {
    const int64_t *sz[] = {&c->M, &c->K, &c->N, &c->tile_m, &c->tile_k, &c->tile_n, &c->tiles_in_block_m,
                           &c->tiles_in_block_n, &c->tiles_in_block_k, &c->tiles_in_load_m, &c->tiles_in_load_n};
    static const char *nm[] = {"M", "K", "N", "tile_m", "tile_k", "tile_n", "tiles_in_block_m", "tiles_in_block_n",
                               "tiles_in_block_k", "tiles_in_load_m", "tiles_in_load_n"};
    for (int i = 0; i < 11; i++)
        if (*sz[i] < 0)
            return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: %s.%s = %lld is negative", fn, name, nm[i],
                                (long long)*sz[i]);
    if ((unsigned)c->block_loop_order > MXFP8_LOOP_KNM)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: %s.block_loop_order %d is not a loop order", fn, name,
                            (int)c->block_loop_order);
    if ((unsigned)c->tile_loop_order > MXFP8_LOOP_KNM)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: %s.tile_loop_order %d is not a loop order", fn, name,
                            (int)c->tile_loop_order);
    if ((unsigned)c->float8_dtype > MXFP8_FMT_E5M2)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: %s.float8_dtype %d is not E4M3 (0) or E5M2 (1)", fn,
                            name, (int)c->float8_dtype);
    if ((unsigned)c->quant_scheme > MXFP8_GROUP_WRAPX)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: %s.quant_scheme %d is not 1x32 (0) or wrapX (1)", fn,
                            name, (int)c->quant_scheme);
    if ((unsigned)c->scale_rule > MXFP8_SCALE_RCEIL)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: %s.scale_rule %d is not a mxfp8_scale_rule", fn, name,
                            (int)c->scale_rule);
    if (c->lnc_2_shard_rhs < -1 || c->lnc_2_shard_rhs > 1)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: %s.lnc_2_shard_rhs %d is not -1, 0 or 1", fn, name,
                            c->lnc_2_shard_rhs);
    const int flag[3] = {c->enable_scale_packing, c->run_with_lnc2, c->spill_reload};
    static const char *flag_nm[3] = {"enable_scale_packing", "run_with_lnc2", "spill_reload"};
    for (int i = 0; i < 3; i++) /* issue 6: booleans are 0 or 1, not "any nonzero" */
        if (flag[i] != 0 && flag[i] != 1)
            return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: %s.%s %d is not 0 or 1", fn, name, flag_nm[i],
                                flag[i]);
    return MXFP8_OK;
}

static int64_t round_up(int64_t x, int64_t m) { return mxfp8i_ceil_div(x, m) * m; }

void mxfp8i_gemm_resolve(const mxfp8_matmul_config *in, int64_t M, int64_t N, int64_t K, int nthreads,
                         mxfp8_matmul_config *out) {
    *out = *in;
    out->M = M;
    out->N = N;
    out->K = K;
    const mxfp8i_ukernel *uk = mxfp8i_select_ukernel();
    out->tile_m = round_up(in->tile_m > 0 ? in->tile_m : 128, uk->mr);
    out->tile_n = round_up(in->tile_n > 0 ? in->tile_n : 256, uk->nr);
    /* [perf hook] the BF16 chunk-panel kernels reload and check their 32x32 accumulators per call: a deeper k tile
     * (512) measured ~16% faster than 128 at 1024x2048x1024 on this AMD Zen 4, and 2048 another 3-6% over 512 on
     * the kernel alone (4 x 8 panels, K = 2048: 220 -> 227 GFLOP/s; K = 4096: 206 -> 214) (speed only). */
    out->tile_k = round_up(in->tile_k > 0 ? in->tile_k : (uk->kalign > 1 ? 2048 : 128), uk->kalign);
    out->tiles_in_block_m = in->tiles_in_block_m > 0 ? in->tiles_in_block_m : 4;
    out->tiles_in_block_n = in->tiles_in_block_n > 0 ? in->tiles_in_block_n : 2;
    out->tiles_in_block_k = in->tiles_in_block_k > 0 ? in->tiles_in_block_k : 1;
    out->tiles_in_load_m = in->tiles_in_load_m > 0 ? in->tiles_in_load_m : 1;
    out->tiles_in_load_n = in->tiles_in_load_n > 0 ? in->tiles_in_load_n : 1;
    if (out->lnc_2_shard_rhs < 0) out->lnc_2_shard_rhs = N >= M;
    /* Give every thread at least one block along the shard axis when the problem allows (speed only). */
    if (nthreads > 1 && out->run_with_lnc2) {
        int64_t dim = out->lnc_2_shard_rhs ? N : M, tile = out->lnc_2_shard_rhs ? out->tile_n : out->tile_m;
        int64_t *tib = out->lnc_2_shard_rhs ? &out->tiles_in_block_n : &out->tiles_in_block_m;
        int64_t want = mxfp8i_ceil_div(mxfp8i_ceil_div(dim, nthreads), tile);
        if (want < 1) want = 1;
        if (*tib > want) *tib = want;
    }
}

/* ---------------------------------------------------------------------------------------------------------- */
/* packing                                                                                                     */
/* ---------------------------------------------------------------------------------------------------------- */
static void *alloc_bytes(int64_t n) {
    if (n < 0) return NULL;
    n = round_up(n > 0 ? n : 1, 64);
    return aligned_alloc(64, (size_t)n);
}

/* Workspace reuse (gemm.h, mxfp8i_gemm_ws_begin): slot s of the calling thread's cache keeps its buffer (grow-only)
 * between GEMMs while a scope is open. Slots: 0 = B panels, 1 = A panels (spill_reload), 2, 3 = the shared A block
 * rows, 4 + 4 t + j = thread t's accumulators, scratch, tmp, A block row. */
#define WS_KSLOTS 2
typedef struct ws_cache {
    int depth;
    int cap;
    void **p;
    int64_t *n;
    /* keyed B panels (mxfp8i_gemm_ws_bkey): buffer, bytes, the key and kernel they hold (key 0 = none) */
    void *kp[WS_KSLOTS];
    int64_t kn[WS_KSLOTS];
    uint64_t key[WS_KSLOTS];
    const void *kuk[WS_KSLOTS];
    /* the pending key for the next GEMM */
    int next_slot;
    uint64_t next_key;
    const void *next_bdata;
} ws_cache;
static _Thread_local ws_cache g_wsc;

void mxfp8i_gemm_ws_begin(void) { g_wsc.depth++; }
void mxfp8i_gemm_ws_end(void) {
    if (g_wsc.depth <= 0 || --g_wsc.depth > 0) return;
    for (int i = 0; i < g_wsc.cap; i++) free(g_wsc.p[i]);
    for (int i = 0; i < WS_KSLOTS; i++) free(g_wsc.kp[i]);
    free(g_wsc.p);
    free(g_wsc.n);
    memset(&g_wsc, 0, sizeof g_wsc);
}
void mxfp8i_gemm_ws_bkey(int slot, uint64_t key, const void *b_data) {
    if (g_wsc.depth <= 0 || slot < 0 || slot >= WS_KSLOTS) return;
    g_wsc.next_slot = slot;
    g_wsc.next_key = key;
    g_wsc.next_bdata = b_data;
}
/* A buffer of n bytes for slot s: from the cache inside a scope, else freshly allocated (release with ws_put). */
static void *ws_get(int s, int64_t n) {
    ws_cache *w = &g_wsc;
    if (w->depth <= 0) return alloc_bytes(n);
    if (s >= w->cap) {
        int cap = s + 16;
        void **p = realloc(w->p, (size_t)cap * sizeof *p);
        if (!p) return NULL;
        w->p = p;
        int64_t *nn = realloc(w->n, (size_t)cap * sizeof *nn);
        if (!nn) return NULL;
        w->n = nn;
        for (int i = w->cap; i < cap; i++) w->p[i] = NULL, w->n[i] = 0;
        w->cap = cap;
    }
    if (w->p[s] && w->n[s] >= n) return w->p[s];
    free(w->p[s]);
    w->p[s] = alloc_bytes(n);
    w->n[s] = w->p[s] ? n : 0;
    return w->p[s];
}
static void ws_put(void *p) {
    if (g_wsc.depth <= 0) free(p);
}

/* Every GEMM runs under IEEE MXCSR defaults (round to nearest, no FTZ/DAZ) on each of its threads and restores the
 * caller's: the FP32 kernels' FMAs, the epilogue's additions and conversions would otherwise follow a fast-math or
 * flush-denormals caller (the quantizers and the BF16 chunk kernels guard themselves likewise). */
#if defined(__x86_64__)
static inline unsigned csr_enter(void) { return mxfp8i_amx_mxcsr_enter(); }
static inline void csr_leave(unsigned c) { mxfp8i_amx_mxcsr_leave(c); }
#else
static inline unsigned csr_enter(void) { return 0; }
static inline void csr_leave(unsigned c) { (void)c; }
#endif

/* ---------------------------------------------------------------------------------------------------------- */
/* the driver                                                                                                  */
/* ---------------------------------------------------------------------------------------------------------- */
typedef struct gemm_ctx {
    const mxfp8i_gop *a, *b;
    const mxfp8_matmul_config *cfg;
    const mxfp8i_ukernel *uk;
    int accumulate;
    const mxfp8_tensor *c;
    int64_t M, N, K, MCb, NCb, MB, NB, ldcb;
    int64_t pa_stride, pb_stride; /* bytes between consecutive A / B panels */
    char *Bp, *Ap;
    char **abuf;                  /* per thread: A panels of one block row (spill_reload = 0) */
    char *ash[2];                 /* coop: the A panels of block rows mb (ash[mb & 1]), packed by all threads */
    int b_ready;                  /* Bp already holds B's panels (a keyed slot of the workspace scope) */
    mxfp8i_amx_pack_fn pack_cm;   /* the slot's packer from a column-major source, or NULL */
    int coop;                     /* threads share the packing of each block row's A panels (shard along N) */
    float **cblk;                 /* per thread: FP32 accumulators of one block [MCb, ldcb] */
    float **scratch, **tmp;       /* per thread: packing scratch (max(mr, nr) * K floats), K floats + scale bytes */
    int nt;
} gemm_ctx;

/* A high-precision column-geometry operand (a transposed view: [K, R]-contiguous, s0 == 1): rows [r0, r0 + rows)
 * quantized down the columns straight into out[k*ld + i] -- the values mxfp8i_gop_rows_f32 gives, without its
 * transpose (the packer's pack_cm reads them column-major). Returns 0, writing nothing, for any other operand. */
static int cols_f32(const mxfp8i_gop *op, const mxfp8_matmul_config *cfg, int64_t r0, int rows, float *out,
                    int64_t ld) {
    if (rows <= 0 || op->prequant || op->swizzled || op->s0 != 1 || op->s1 <= 0) return 0;
    const char *base = op->data + r0 * (int64_t)mxfp8_dtype_size(op->dtype);
    mxfp8i_qpanel p = {base, op->dtype, rows, op->K, 1, op->s1, cfg->float8_dtype, cfg->scale_rule,
                       cfg->quant_scheme, out, MXFP8_DTYPE_F32, 1, ld, NULL, 0, 0};
    mxfp8i_quantize_panel(&p);
    return 1;
}

/* Pack rows [r0, r0 + w) of op over all of K into one panel of the kernel's format. */
static void pack_panel(const gemm_ctx *x, int tid, const mxfp8i_gop *op, int is_b, int64_t r0, void *panel) {
    const mxfp8_matmul_config *cfg = x->cfg;
    const mxfp8i_ukernel *uk = x->uk;
    int w = is_b ? uk->nr : uk->mr;
    int64_t K = op->K;
    float *tmp = x->tmp[tid];
    if (uk->panel == MXFP8I_PANEL_F32) {
        mxfp8i_gop_pack_panel(op, cfg->float8_dtype, cfg->scale_rule, cfg->quant_scheme, r0, w, (float *)panel,
                              x->scratch[tid], (uint8_t *)(tmp + K), tmp);
        return;
    }
    int rows = (int)(op->R - r0 < w ? op->R - r0 : w);
    if (x->pack_cm && cols_f32(op, cfg, r0, rows, x->scratch[tid], w)) {
        x->pack_cm(is_b, x->scratch[tid], w, rows, K, panel);
        return;
    }
    mxfp8i_gop_rows_f32(op, cfg->float8_dtype, cfg->scale_rule, cfg->quant_scheme, r0, rows, x->scratch[tid],
                        (uint8_t *)(tmp + K), tmp, x->scratch[tid] + (int64_t)w * K);
    uk->pack(is_b, x->scratch[tid], K, rows, K, panel);
}

static void loop_dims(mxfp8_loop_order o, int d[3]) { /* 0 = m, 1 = n, 2 = k; d[0] outermost */
    static const int tab[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    d[0] = tab[o][0];
    d[1] = tab[o][1];
    d[2] = tab[o][2];
}

static inline uint16_t bf16_rne(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    uint16_t r = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    return ((u & 0x7FFFFFFFu) > 0x7F800000u) ? (uint16_t)((u >> 16) | 0x40u) : r; /* quiet NaN, sign kept */
}

/* Rows [m0, m1) x columns [n0, n1) of C from the block accumulators (row m at cb[(m - m0) * ldcb + (n - n0)]). */
static void epilogue(const gemm_ctx *x, const float *cb, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const mxfp8_tensor *c = x->c;
    int64_t cs0 = c->strides[0], cs1 = c->strides[1], nn = n1 - n0;
    for (int64_t m = m0; m < m1; m++) {
        const float *src = cb + (m - m0) * x->ldcb;
        if (x->accumulate) {
            float *dst = (float *)c->data + m * cs0 + n0 * cs1;
            if (cs1 == 1) /* unit stride: the compiler vectorizes it (the same one FP32 addition per element) */
                for (int64_t n = 0; n < nn; n++) dst[n] = dst[n] + src[n];
            else
                for (int64_t n = 0; n < nn; n++) dst[n * cs1] = dst[n * cs1] + src[n];
        } else if (c->dtype == MXFP8_DTYPE_F32) {
            float *dst = (float *)c->data + m * cs0 + n0 * cs1;
            if (cs1 == 1) memcpy(dst, src, (size_t)nn * sizeof(float));
            else
                for (int64_t n = 0; n < nn; n++) dst[n * cs1] = src[n];
        } else if (c->dtype == MXFP8_DTYPE_BF16) {
            uint16_t *dst = (uint16_t *)c->data + m * cs0 + n0 * cs1;
            if (cs1 == 1)
                for (int64_t n = 0; n < nn; n++) dst[n] = bf16_rne(src[n]);
            else
                for (int64_t n = 0; n < nn; n++) dst[n * cs1] = bf16_rne(src[n]);
        } else {
            for (int64_t n = 0; n < nn; n++) mxfp8i_store_f32(c->data, c->dtype, m * cs0 + (n0 + n) * cs1, src[n]);
        }
    }
}

/* One output block (mb, nb): all its tiles in tile_loop_order, then the epilogue. */
static void run_block(const gemm_ctx *x, int tid, int64_t mb, int64_t nb, int64_t *packed_mb, const char *Acoop) {
    const mxfp8_matmul_config *cfg = x->cfg;
    const mxfp8i_ukernel *uk = x->uk;
    int64_t m0 = mb * x->MCb, m1 = m0 + x->MCb < x->M ? m0 + x->MCb : x->M;
    int64_t n0 = nb * x->NCb, n1 = n0 + x->NCb < x->N ? n0 + x->NCb : x->N;
    int64_t K = x->K;
    const char *Ablk;
    if (Acoop) {
        Ablk = Acoop;
    } else if (x->Ap) {
        Ablk = x->Ap + (m0 / uk->mr) * x->pa_stride;
    } else {
        if (*packed_mb != mb) {
            for (int64_t r = m0; r < m1; r += uk->mr)
                pack_panel(x, tid, x->a, 0, r, x->abuf[tid] + ((r - m0) / uk->mr) * x->pa_stride);
            *packed_mb = mb;
        }
        Ablk = x->abuf[tid];
    }
    float *cb = x->cblk[tid];
    int64_t tm = cfg->tile_m, tn = cfg->tile_n, tk = cfg->tile_k;
    int64_t lo[3] = {m0, n0, 0}, hi[3] = {m1, n1, K}, step[3] = {tm, tn, tk};
    int d[3];
    loop_dims(cfg->tile_loop_order, d);
    int64_t i[3];
    for (i[d[0]] = lo[d[0]]; i[d[0]] < hi[d[0]]; i[d[0]] += step[d[0]])
        for (i[d[1]] = lo[d[1]]; i[d[1]] < hi[d[1]]; i[d[1]] += step[d[1]])
            for (i[d[2]] = lo[d[2]]; i[d[2]] < hi[d[2]]; i[d[2]] += step[d[2]]) {
                int64_t tm1 = i[0] + tm < m1 ? i[0] + tm : m1;
                int64_t tn1 = i[1] + tn < n1 ? i[1] + tn : n1;
                int64_t k0 = i[2], kc = (k0 + tk < K ? k0 + tk : K) - k0;
                for (int64_t n = i[1]; n < tn1; n += uk->nr) {
                    const char *bp = x->Bp + (n / uk->nr) * x->pb_stride;
                    int nr = (int)(tn1 - n < uk->nr ? tn1 - n : uk->nr);
                    for (int64_t m = i[0]; m < tm1; m += uk->mr) {
                        const char *ap = Ablk + ((m - m0) / uk->mr) * x->pa_stride;
                        int mr = (int)(tm1 - m < uk->mr ? tm1 - m : uk->mr);
                        uk->run(k0, kc, ap, bp, cb + (m - m0) * x->ldcb + (n - n0), x->ldcb, mr, nr, k0 > 0);
                    }
                }
            }
    epilogue(x, cb, m0, m1, n0, n1);
}

static void thread_body(const gemm_ctx *x, int tid, int nt) {
    const mxfp8i_ukernel *uk = x->uk;
    /* 1-2: packing of B (and A with spill_reload), panels split between threads. */
    int64_t npb = mxfp8i_ceil_div(x->N, uk->nr);
    if (!x->b_ready)
        for (int64_t p = tid; p < npb; p += nt) pack_panel(x, tid, x->b, 1, p * uk->nr, x->Bp + p * x->pb_stride);
    if (x->Ap) {
        int64_t npa = mxfp8i_ceil_div(x->M, uk->mr);
        for (int64_t p = tid; p < npa; p += nt) pack_panel(x, tid, x->a, 0, p * uk->mr, x->Ap + p * x->pa_stride);
    }
#ifdef _OPENMP
    if (nt > 1) {
#pragma omp barrier
    }
#endif
    /* 3: this thread's share of blocks along the shard axis. */
    int shard_n = x->cfg->lnc_2_shard_rhs != 0;
    int64_t nsh = shard_n ? x->NB : x->MB, nother = shard_n ? x->MB : x->NB;
    int64_t s0 = nsh * tid / nt, s1 = nsh * (tid + 1) / nt;
    int d[3];
    loop_dims(x->cfg->block_loop_order, d);
    int m_first = 1;
    for (int q = 0; q < 3; q++) {
        if (d[q] == 0) { m_first = 1; break; }
        if (d[q] == 1) { m_first = 0; break; }
    }
    int64_t packed_mb = -1;
    int64_t mlo = shard_n ? 0 : s0, mhi = shard_n ? nother : s1;
    int64_t nlo = shard_n ? s0 : 0, nhi = shard_n ? s1 : nother;
    if (x->coop) {
        /* Every thread needs every block row of A (its share is a range of block columns): the threads pack each
         * block row's panels together, once, into one of two shared buffers. One barrier per block row: a thread
         * packs row mb + 2 into the buffer of row mb only after every thread has packed row mb + 1, i.e. after
         * every thread has finished its blocks of row mb. */
        for (int64_t mb = 0; mb < x->MB; mb++) {
            int64_t m0 = mb * x->MCb, m1 = m0 + x->MCb < x->M ? m0 + x->MCb : x->M;
            int64_t np = mxfp8i_ceil_div(m1 - m0, uk->mr);
            char *buf = x->ash[mb & 1];
            for (int64_t p = tid; p < np; p += nt) pack_panel(x, tid, x->a, 0, m0 + p * uk->mr, buf + p * x->pa_stride);
#ifdef _OPENMP
            if (nt > 1) {
#pragma omp barrier
            }
#endif
            for (int64_t nb = nlo; nb < nhi; nb++) run_block(x, tid, mb, nb, &packed_mb, buf);
        }
    } else if (m_first) {
        for (int64_t mb = mlo; mb < mhi; mb++)
            for (int64_t nb = nlo; nb < nhi; nb++) run_block(x, tid, mb, nb, &packed_mb, NULL);
    } else {
        for (int64_t nb = nlo; nb < nhi; nb++)
            for (int64_t mb = mlo; mb < mhi; mb++) run_block(x, tid, mb, nb, &packed_mb, NULL);
    }
}

static void write_zero_sum(const mxfp8_tensor *c, int64_t M, int64_t N, int accumulate) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            int64_t off = m * c->strides[0] + n * c->strides[1];
            if (accumulate) ((float *)c->data)[off] = ((float *)c->data)[off] + 0.0f;
            else mxfp8i_store_f32(c->data, c->dtype, off, 0.0f);
        }
}

mxfp8_status mxfp8i_gemm_gop(const mxfp8i_gop *a, const mxfp8i_gop *b, const mxfp8_matmul_config *config,
                             int accumulate, const mxfp8_tensor *c, int num_threads) {
    int64_t M = a->R, N = b->R, K = a->K;
    /* A pending B key applies to this GEMM only, and only when its B operand is the one it was given for. */
    int kslot = -1;
    uint64_t bkey = 0;
    if (g_wsc.next_key && g_wsc.depth > 0 && g_wsc.next_bdata == (const void *)b->data) {
        kslot = g_wsc.next_slot;
        bkey = g_wsc.next_key;
    }
    g_wsc.next_key = 0;
    g_wsc.next_bdata = NULL;
    if (M == 0 || N == 0) return MXFP8_OK;
    if (K == 0) {
        unsigned csr = csr_enter();
        write_zero_sum(c, M, N, accumulate);
        csr_leave(csr);
        return MXFP8_OK;
    }
    mxfp8_matmul_config defaults, cfg;
    if (!config) {
        mxfp8_matmul_config_init(&defaults);
        config = &defaults;
    }
    int nt = num_threads < 1 ? 1 : num_threads;
    if (!config->run_with_lnc2) nt = 1;
    mxfp8i_gemm_resolve(config, M, N, K, nt, &cfg);
    gemm_ctx x;
    memset(&x, 0, sizeof x);
    const mxfp8i_ukernel *uk = mxfp8i_select_ukernel();
    x.a = a;
    x.b = b;
    x.cfg = &cfg;
    x.uk = uk;
#if defined(__x86_64__)
    x.pack_cm = mxfp8i_amx_pack_cm_for(uk);
#endif
    x.accumulate = accumulate;
    x.c = c;
    x.M = M;
    x.N = N;
    x.K = K;
    x.MCb = cfg.tile_m * cfg.tiles_in_block_m;
    x.NCb = cfg.tile_n * cfg.tiles_in_block_n;
    x.MB = mxfp8i_ceil_div(M, x.MCb);
    x.NB = mxfp8i_ceil_div(N, x.NCb);
    /* Never more threads than blocks along the shard axis. */
    int64_t nsh = cfg.lnc_2_shard_rhs ? x.NB : x.MB;
    if (nt > nsh) nt = (int)nsh;
    x.nt = nt;
    mxfp8_status st = MXFP8_ERR_OUT_OF_MEMORY;
    int64_t bm = x.MCb < M ? x.MCb : M, bn = x.NCb < N ? x.NCb : N;
    x.ldcb = round_up(bn, 16);
    x.pa_stride = round_up(uk->panel_bytes(K, uk->mr), 64);
    x.pb_stride = round_up(uk->panel_bytes(K, uk->nr), 64);
    int64_t npa = mxfp8i_ceil_div(M, uk->mr), npb = mxfp8i_ceil_div(N, uk->nr), wmax = uk->mr > uk->nr ? uk->mr : uk->nr;
    int64_t nbB, nbA, nbAblk, nC, nS, nT;
    if (!mxfp8i_mul_size(npb, x.pb_stride, &nbB) || !mxfp8i_mul_size(npa, x.pa_stride, &nbA) ||
        !mxfp8i_mul_size(mxfp8i_ceil_div(bm, uk->mr), x.pa_stride, &nbAblk) ||
        !mxfp8i_mul_size(bm, x.ldcb * 4, &nC) || !mxfp8i_mul_size(wmax * 8, K, &nS) ||
        !mxfp8i_mul_size(K + wmax * mxfp8i_ceil_div(K, 32) / 4 + 16, 4, &nT))
        return st;
    /* Shared A block rows: threads split along N walk the block rows in the same order (block_loop_order with m
     * before n) and need all of them; packing each once instead of once per thread (spill_reload = 0 only). */
    {
        int d[3], m_first = 1;
        loop_dims(cfg.block_loop_order, d);
        for (int q = 0; q < 3; q++) {
            if (d[q] == 0) { m_first = 1; break; }
            if (d[q] == 1) { m_first = 0; break; }
        }
        x.coop = nt > 1 && !cfg.spill_reload && cfg.lnc_2_shard_rhs && m_first;
    }
    if (kslot >= 0) {
        ws_cache *w = &g_wsc;
        if (w->key[kslot] == bkey && w->kuk[kslot] == (const void *)uk && w->kn[kslot] == nbB && w->kp[kslot]) {
            x.b_ready = 1; /* the same B operand, packed by an earlier GEMM of this scope */
        } else {
            w->key[kslot] = 0;
            if (!w->kp[kslot] || w->kn[kslot] != nbB) {
                free(w->kp[kslot]);
                w->kp[kslot] = alloc_bytes(nbB);
                w->kn[kslot] = w->kp[kslot] ? nbB : 0;
            }
        }
        x.Bp = w->kp[kslot];
    } else {
        x.Bp = ws_get(0, nbB);
    }
    if (cfg.spill_reload) x.Ap = ws_get(1, nbA);
    if (x.coop) {
        x.ash[0] = ws_get(2, nbAblk);
        x.ash[1] = ws_get(3, nbAblk);
    }
    x.abuf = calloc((size_t)nt, sizeof(char *));
    x.cblk = calloc((size_t)nt, sizeof(float *));
    x.scratch = calloc((size_t)nt, sizeof(float *));
    x.tmp = calloc((size_t)nt, sizeof(float *));
    int need_abuf = !cfg.spill_reload && !x.coop;
    int ok = x.Bp && (!cfg.spill_reload || x.Ap) && (!x.coop || (x.ash[0] && x.ash[1])) && x.abuf && x.cblk &&
             x.scratch && x.tmp;
    for (int t = 0; ok && t < nt; t++) {
        x.cblk[t] = ws_get(4 + 4 * t, nC);
        x.scratch[t] = ws_get(5 + 4 * t, nS);
        x.tmp[t] = ws_get(6 + 4 * t, nT);
        if (need_abuf) x.abuf[t] = ws_get(7 + 4 * t, nbAblk);
        ok = x.cblk[t] && x.scratch[t] && x.tmp[t] && (!need_abuf || x.abuf[t]);
    }
    if (ok) {
        unsigned csr = csr_enter();
        if (nt == 1) {
            thread_body(&x, 0, 1);
        } else {
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
            {
                /* If the runtime gives fewer threads, the shares follow the real count (buffers exist for nt). */
                unsigned wcsr = csr_enter();
                thread_body(&x, omp_get_thread_num(), omp_get_num_threads());
                csr_leave(wcsr);
            }
#else
            thread_body(&x, 0, 1);
#endif
        }
        csr_leave(csr);
        st = MXFP8_OK;
        if (kslot >= 0) {
            g_wsc.key[kslot] = bkey;
            g_wsc.kuk[kslot] = uk;
        }
    }
    for (int t = 0; t < nt; t++) {
        if (x.cblk) ws_put(x.cblk[t]);
        if (x.scratch) ws_put(x.scratch[t]);
        if (x.tmp) ws_put(x.tmp[t]);
        if (x.abuf) ws_put(x.abuf[t]);
    }
    free(x.cblk);
    free(x.scratch);
    free(x.tmp);
    free(x.abuf);
    ws_put(x.Bp);
    ws_put(x.Ap);
    ws_put(x.ash[0]);
    ws_put(x.ash[1]);
    return st;
}

mxfp8_status mxfp8i_gemm(const mxfp8_operand *a, const mxfp8_operand *b, const mxfp8_matmul_config *config,
                         int accumulate, mxfp8_tensor *c, int num_threads) {
    mxfp8_matmul_config defaults;
    if (!config) {
        mxfp8_matmul_config_init(&defaults);
        config = &defaults;
    }
    mxfp8i_gop ga, gb;
    mxfp8_status st;
    int a_x4 = a->values.dtype == MXFP8_DTYPE_U32 && !a->swizzled;
    int64_t hint = config->K > 0 ? config->K : -1;
    if (a_x4 && hint < 0) {
        if ((st = mxfp8i_gop_from_operand("mxfp8_gemm", "b", b, -1, config->float8_dtype, config->quant_scheme,
                                          &gb)))
            return st;
        hint = gb.x4 && !gb.swizzled ? -1 : gb.K;
    }
    if ((st = mxfp8i_gop_from_operand("mxfp8_gemm", "a", a, hint, config->float8_dtype, config->quant_scheme, &ga)))
        return st;
    if ((st = mxfp8i_gop_from_operand("mxfp8_gemm", "b", b, ga.K, config->float8_dtype, config->quant_scheme, &gb)))
        return st;
    return mxfp8i_gemm_gop(&ga, &gb, config, accumulate, c, num_threads);
}
