/* moe_problem.h -- the MoE problems of the bench: random routing, BF16 tensors, forward checkpoints, memory use. */
#ifndef MXFP8_BENCH_MOE_PROBLEM_H
#define MXFP8_BENCH_MOE_PROBLEM_H

#include "bench.h"

typedef struct moe_prob {
    int64_t H, T, E, B, K, I; /**< hidden, tokens, experts, block size, top-k (K), intermediate */
} moe_prob;

typedef struct moe_problem {
    moe_prob p;
    int64_t N;         /**< blocks */
    int64_t real_rows; /**< T * TopK routed (token, expert) pairs */
    /* routing (moe_routing) */
    int32_t *tok, *b2e; /**< token_position_to_id [N*B], block_to_expert [N] */
    uint16_t *aff;      /**< expert_affinities_masked [T*E] BF16 */
    /* tensors (moe_tensors): inputs, checkpoints, gradients, forward output; BF16 */
    uint16_t *x, *w1, *w2, *dy, *ckp_gu, *ckp_ga, *ckp_in, *ckp_si;
    uint16_t *dx, *daff, *dw1, *dw2, *y;
    /* train = 1 (set before moe_tensors): mxfp8.torch's training configuration instead -- FP32 weights (master
     * weights), affinities and their gradients, BF16 X, dY, dX and output; the forward also writes the FP32 gate/up
     * checkpoint, the backward is given it and recomputes the other three; these F32 buffers replace the BF16 ones */
    int train;
    float *w1f, *w2f, *dw1f, *dw2f, *ckp_guf, *afff, *dafff;
    mxfp8_workspace *ws; /**< reused by every call of the problem (mxfp8_workspace_create); NULL = per call */
    mxfp8_status st; /**< of the last library call */
} moe_problem;

/** Route T tokens to K distinct random experts each, by the documented rule of mxfp8_moe_route (re-done here):
 *  each expert gets ceil(count/B) blocks in expert order, its tokens ascending, padded with -1; leftover blocks
 *  are padding assigned to E-1. 0 on success, -1 when out of memory. */
int moe_routing(moe_problem *m);
/** Allocate and fill the tensors (after moe_routing). 0 on success, -1 when out of memory. */
int moe_tensors(moe_problem *m);
/** Free the tensors (not the routing). */
void moe_free_tensors(moe_problem *m);
/** Free everything. */
void moe_free(moe_problem *m);
/** Bytes of the backward's inputs and outputs. */
size_t moe_io_bytes(const moe_problem *m);
/** "(H,T,E,B,TopK,I)" into buf. */
const char *moe_name(const moe_prob *p, char *buf, size_t len);

/** One mxfp8_moe_backward with all four forward checkpoints given (no recompute; train: the gate/up checkpoint
 *  only); 0 on success. */
int moe_run_backward(void *m);
/** One mxfp8_moe_forward writing only the output (no checkpoints; train: also the FP32 gate/up checkpoint); 0 on
 *  success. */
int moe_run_forward(void *m);

/** Resident set now and its high-water mark (bytes, /proc/self/status); -1 when unreadable. */
void moe_rss(double *cur, double *hwm);
/** Reset the high-water mark to the current resident set (Linux /proc/self/clear_refs); 0 on success. */
int moe_reset_hwm(void);

#endif
