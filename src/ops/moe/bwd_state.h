/*
 * bwd_state.h -- the state of one mxfp8_moe_backward call, shared by its driver (bwd.c) and its block phases
 * (bwd_block.c) (internal). The math of each phase: bwd.c's file comment and include/mxfp8.h, "Blockwise MoE".
 */
#ifndef MXFP8_OPS_MOE_BWD_STATE_H
#define MXFP8_OPS_MOE_BWD_STATE_H

#include "moe.h"

typedef struct mxfp8i_moe_bwd {
    const mxfp8i_moe *p;
    const mxfp8_moe_bwd_args *args;  /**< the checkpoints (absent ones are recomputed) */
    int onH;                         /**< AFFINITY_ON_H */
    mxfp8i_moe_wcopy wc;             /**< FP32 weight copies where a GEMM needs one */
    float *dx;                       /**< hidden_states_grad accumulator [T*H] */
    float *dw1, *dw2;                /**< the current expert's weight-gradient accumulators [H*2I], [I*H] */
    double *da, *db1, *db2;          /**< affinity [T*E] and bias [E*2I], [E*H] gradients */
    /* a run's buffers, rows [0, Rw) */
    float *xb, *dyb, *gu, *g, *u, *act, *inter, *dI, *dgu, *dxb, *S, *D, *down, *b1, *b2;
    float *sg;                       /**< sigmoid(c g) of the forward, for act'(g) (valid when have_sg) */
    int dy16;                        /**< dyb holds dY's BF16 rows as they are (row q at (uint16_t *)(dyb + q H), in
                                          the FP32 rows' places): dY BF16 with unit stride along H, AFFINITY_ON_I,
                                          no biases, so that only Phases 1 and 4 read it, as GEMM operands (the
                                          same values: the same codes); else FP32 rows */
    const float *gck;                /**< NULL, or the run's g rows read in place from an F32 gate/up checkpoint in
                                          positions-major memory (position q's g at gck + q gld, u at uck + q gld;
                                          set per run by mxfp8i_moe_bwd_run): then g and u are not copied */
    const float *uck;
    int64_t gld;
    int have_sg;
    double *dablk;
    /* The segmented weight gradients (seg = 1: experts with weight-gradient accumulators beyond 1 MiB, bwd.c
     * use_segmented): an expert's blocks keep their Phase 3 / 4 operands
     * (xb, dgu, and S, dyb for AFFINITY_ON_I or inter, D for ON_H) in expert-sized buffers, block s at row so[s]
     * (the *0 pointers; the per-block pointers above are moved to each block's rows), and one segmented GEMM per
     * weight gradient adds the blocks' sums at the end of the expert (mxfp8i_gemm_segments). seg = 0: Phases 3
     * and 4 run per block (mxfp8i_moe_bwd_run), the same bits. */
    int seg;
    float *xb0, *dgu0, *S0, *dyb0, *inter0, *D0;
    int64_t *sn, *sL, *so;           /**< [Se]: the current expert's blocks (block id, length, first row) */
    int nseg;                        /**< blocks of the current expert so far */
    int64_t rows;                    /**< their rows */
    mxfp8i_gop *sops;                /**< [2 * Se]: the A and B operands of one segmented GEMM */
    int direct[2];                   /**< segmented, contiguous BF16 or F32 dW1 / dW2 without
                                          skip_grad_initialization: each expert's segmented GEMM writes it straight
                                          into the output (the same to_bf16 of the same FP32 sums, or those sums; no
                                          FP32 pass) */
    const mxfp8_tensor *wgrad[2];    /**< the dW1, dW2 outputs (set by the driver before the first block) */
    /* The expert-parallel path (bwd.c backward_par): par = 1 in a worker's state. A worker runs whole blocks on its
     * own thread (every GEMM and elementwise pass on it): block n's dX rows go to rows [n B, n B + L) of V [N*B, H]
     * and its positions' affinity-gradient terms to dab[n B + q], instead of being added to dx and da (the driver
     * adds them afterwards, in the serial walk's order), its Phase 3 / 4 operands to its rows of its expert's part
     * of the call's wave buffers, and no bias sums (they come with the expert's weight gradients, from those
     * buffers: mxfp8i_moe_bias_segments); db1 and db2 are the call's. */
    int par;
    float *V;
    double *dab;
    int dx_stored; /**< the call's: backward_par's combine rounded dX straight into its output */
    /* the call's state on that path (bwd.c moe_bwd_reserve_par, par_plan): the dX combine's scratch; the blocks with
       rows in expert-major order (bord [N], then the sort's cursors [E + 1]); every expert's blocks (sn, sL, so from
       estart[e] to estart[e + 1]) and its first row in its wave (erow), the waves' first experts (wstart); the
       schedule's state (par_take), per expert: its blocks done, its weight gradients taken (bit 1: dW1, bit 2: dW2),
       its blocks not yet taken [elo, ehi), the thread on it (-1: none yet), its wave; per wave: its weight gradients
       done; two waves' buffers (wrows rows each) and the workers' arenas (par_bytes each) */
    int32_t *first, *list, *bord;
    int64_t *estart, *erow, *wstart, *bdone, *wtaken, *elo, *ehi, *owner, *ewave, *wdone;
    char *sets, *arenas;
    int64_t wrows, nw, taken; /* (nw: the waves; taken: the weight gradients taken so far, backward_par) */
    /* the dX combine as tasks of ctok tokens (ncomb of them, the next one cnext), once all nbdone blocks are done;
       cdirect: rounded straight into the output (mxfp8i_moe_combine_plan) */
    int64_t nbdone, ctok, ncomb, cnext;
    int cdirect;
    int64_t *onw; /* [threads]: thread t runs a weight gradient (par_take) */
    size_t par_bytes;
} mxfp8i_moe_bwd;

/** Test-only switch between the two weight-gradient paths (-1: by size, the default; 0: per block; 1: segmented).
 *  Not thread-safe: set it while no MoE backward runs. Returns the previous value. */
int mxfp8i_moe_set_segmented_wgrad(int mode);

/** Phase 3 (which & 1) and Phase 4 (which & 2) of expert e over its blocks recorded in w (the segmented path).
 *  OUT_OF_MEMORY or OK. */
mxfp8_status mxfp8i_moe_wgrad_segments(mxfp8i_moe_bwd *w, int64_t e, int which);
/** The bias sums of expert e (db1 with which & 1, db2 with which & 2) over its blocks recorded in w, from their rows
 *  of the expert-sized buffers (the expert-parallel path; the serial walk adds them per block in Phase 2): FP64,
 *  per column in block order, then position order, as there. */
void mxfp8i_moe_bias_segments(mxfp8i_moe_bwd *w, int64_t e, int which);

/** The run of `blocks` blocks n, n + 1, ... of expert e (mxfp8i_moe_run_joins; L = its stacked length > 0): every
 *  phase, accumulating into dx, dw1/dw2, da and the bias sums exactly as block by block (Phases 3 and 4 per
 *  block). MXFP8_OK or MXFP8_ERR_OUT_OF_MEMORY (a GEMM's workspace). */
mxfp8_status mxfp8i_moe_bwd_run(mxfp8i_moe_bwd *w, int64_t n, int64_t blocks, int64_t e, int64_t L);

/* store.c */
/** Round expert e's FP32 accumulator (per = elements of one expert, row-major) into expert e of a weight-gradient
 *  view ([E, ...], any dtype and strides); add != 0: the view's given value + acc (one FP32 addition), as
 *  mxfp8i_moe_store_flat_f rounds; clear != 0 leaves the accumulator zeroed for the next expert. */
void mxfp8i_moe_store_expert(const mxfp8_tensor *t, int64_t e, int64_t per, float *acc, int add, int clear);

#endif /* MXFP8_OPS_MOE_BWD_STATE_H */
