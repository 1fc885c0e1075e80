/*
 * workspace.h -- scratch memory (internal): the public mxfp8_workspace (a reusable arena of grow-only slots), and the
 * per-thread scope through which every layer takes its buffers.
 *
 * A public entry that needs scratch opens a scope with the caller's workspace (or NULL); inside it, every buffer is
 * a slot of that arena: mxfp8i_ws_get(slot, bytes) returns the slot's buffer, grown (never shrunk) to at least
 * `bytes`. Closing the scope keeps the caller's arena for the next call (so repeated calls allocate nothing) or frees
 * a private one. Scopes nest (a GEMM inside a MoE call uses the MoE call's arena); a workspace found busy with
 * another thread's call is not shared: that call gets a private arena. Each slot has one user at a time: the slot
 * numbers below partition the arena between the layers that run nested.
 * Keyed slots hold packed weight panels across the GEMMs of one call (mxfp8i_ws_bkey).
 */
#ifndef MXFP8_RUNTIME_WORKSPACE_H
#define MXFP8_RUNTIME_WORKSPACE_H

#include <stddef.h>
#include <stdint.h>

#include "mxfp8.h"

enum {
    /* the GEMM driver (src/gemm/driver.c) */
    MXFP8I_WS_GEMM_B = 0,   /**< B's packed panels (when not keyed) */
    MXFP8I_WS_GEMM_A,       /**< A's packed panels (spill_reload) */
    MXFP8I_WS_GEMM_ASH0,    /**< the two shared A block rows (threads split along N) */
    MXFP8I_WS_GEMM_ASH1,
    MXFP8I_WS_GEMM_THREADS, /**< every thread's accumulators, scratch and A block row, one after the other */
    MXFP8I_WS_GEMM_SEGS,    /**< the per-segment plans of a segmented GEMM (mxfp8i_gemm_segments) */
    /* mxfp8_matmul_backward */
    MXFP8I_WS_MATMUL_DY,    /**< dY's exact FP32 values when it is pre-quantized or swizzled */
    /* the MoE layer (src/ops/moe/): the routing table, weight copies, and up to 24 layer buffers */
    MXFP8I_WS_MOE_TOK,
    MXFP8I_WS_MOE_EXPERT,
    MXFP8I_WS_MOE_W1F,
    MXFP8I_WS_MOE_W2F,
    MXFP8I_WS_MOE_STATS,    /**< per-expert operand statistics (src/ops/moe/numerics.c) */
    /* the statistics pass over a GEMM operand (src/ops/opstats.c): per-thread accumulators, codes, FP32 rows */
    MXFP8I_WS_STATS_ACC,
    MXFP8I_WS_STATS_CODES,
    MXFP8I_WS_STATS_F32,
    /* the router's linear layer and its gradients (src/ops/router.c): packed operand, per-thread scratch, bias */
    MXFP8I_WS_ROUTER_PANELS,
    MXFP8I_WS_ROUTER_SCRATCH,
    MXFP8I_WS_ROUTER_BIAS,
    /* mxfp8_linear: its bias in FP32 */
    MXFP8I_WS_LINEAR_BIAS,
    MXFP8I_WS_MOE_BUF0,
    MXFP8I_WS_NSLOTS = MXFP8I_WS_MOE_BUF0 + 32
};
#define MXFP8I_WS_KEYED 4 /**< keyed weight-panel slots */

/** A scope (one per public entry that uses scratch; on the caller's stack). */
typedef struct mxfp8i_scope {
    mxfp8_workspace *ws;   /**< the arena in use */
    mxfp8_workspace *prev; /**< the thread's arena before this scope */
    int owned;             /**< 1: a private arena, freed at the end */
    int user;              /**< 1: the caller's workspace, marked busy by this scope */
    int sub;               /**< 1: an arena in the caller's memory (mxfp8i_scope_begin_sub) */
} mxfp8i_scope;

/** Open a scope with the caller's workspace (NULL, or busy with another call: a private arena; a scope already
 *  open on this thread: its arena). OUT_OF_MEMORY only when a private arena cannot be made. */
mxfp8_status mxfp8i_scope_begin(mxfp8i_scope *s, mxfp8_workspace *user);
void mxfp8i_scope_end(mxfp8i_scope *s);

/** A scope whose arena lives in memory the caller provides: `mem` (64-byte aligned, `bytes` long; e.g. one thread's
 *  share of a slot of the open scope's arena, handed to each worker of a parallel region, whose threads have no
 *  scope of their own) holds the arena's state at its start and the slots after it, carved in the order they are
 *  requested; a fresh arena every time (no slot or keyed panel carries over). Scopes opened inside it use it. A
 *  request the memory cannot hold comes from the heap and is freed by mxfp8i_scope_end. mxfp8i_ws_sub_bytes(inner):
 *  the bytes to provide so that slots of `inner` bytes in all (an mxfp8i_ws_plan size) fit. */
size_t mxfp8i_ws_sub_bytes(size_t inner);
void mxfp8i_scope_begin_sub(mxfp8i_scope *s, void *mem, size_t bytes);

/** The buffer of `slot` in the current scope's arena, at least `bytes` long (64-byte aligned; contents undefined;
 *  grown by freeing and reallocating). NULL on allocation failure, or when no scope is open. */
void *mxfp8i_ws_get(int slot, size_t bytes);

/** Keyed weight panels. mxfp8i_ws_bkey: the next GEMM on this thread whose B operand's data pointer is b_data keeps
 *  its packed B panels in keyed slot `slot` under `key` (nonzero; equal keys must mean equal B values and
 *  quantization settings). mxfp8i_ws_take_bkey (the GEMM): the pending slot for b_data, or -1 (cleared either way).
 *  mxfp8i_ws_keyed: the slot's buffer for `bytes` of panels packed by kernel `uk`; *ready = 1 when it already holds
 *  the panels of `key`. mxfp8i_ws_keyed_done: record that it now does. */
void mxfp8i_ws_bkey(int slot, uint64_t key, const void *b_data);
int mxfp8i_ws_take_bkey(const void *b_data, uint64_t *key);
void *mxfp8i_ws_keyed(int slot, uint64_t key, const void *uk, size_t bytes, int *ready);
void mxfp8i_ws_keyed_done(int slot, uint64_t key, const void *uk);

/** Plan a call's scratch from its reservation function (the one function that obtains, before the first store,
 *  every buffer the call will use: mxfp8i_ws_get / mxfp8i_gemm_reserve / keyed slots). reserve(ctx) first runs on a
 *  sizing arena that records each slot's largest request and allocates nothing (its buffers must not be touched).
 *  With bytes != NULL: *bytes = the sum of those sizes (what the call takes from its workspace), nothing else.
 *  Else each slot of the open scope's arena is grown once to its size, so no later request of the call allocates.
 *  reserve's status (with its message) is returned as is; OUT_OF_MEMORY ("fn: out of memory ...") when a slot
 *  cannot be grown. */
mxfp8_status mxfp8i_ws_plan(const char *fn, mxfp8_status (*reserve)(const void *ctx), const void *ctx,
                            size_t *bytes);

#endif /* MXFP8_RUNTIME_WORKSPACE_H */
