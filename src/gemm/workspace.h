/*
 * workspace.h -- the GEMM driver's buffers (internal to src/gemm/): fresh 64-byte aligned allocations outside a
 * workspace scope, a per-thread grow-only cache inside one (gemm.h, mxfp8i_gemm_ws_begin), and the keyed B panel
 * slots that let the blocks of one MoE expert share their packed weights.
 *
 * Cache slots: 0 = B panels, 1 = A panels (spill_reload), 2, 3 = the shared A block rows, 4 + 4 t + j = thread t's
 * accumulators, scratch, tmp, A block row.
 */
#ifndef MXFP8_GEMM_WORKSPACE_H
#define MXFP8_GEMM_WORKSPACE_H

#include <stdint.h>

/** n bytes (64-byte aligned) for cache slot `slot`: from the calling thread's cache inside a scope, else freshly
 *  allocated. NULL on failure. Release with mxfp8i_ws_put. */
void *mxfp8i_ws_get(int slot, int64_t n);
/** Free p unless it belongs to the open scope's cache. */
void mxfp8i_ws_put(void *p);
/** A fresh 64-byte aligned buffer of n bytes (at least 64); free() it. */
void *mxfp8i_ws_alloc(int64_t n);

/** The keyed B slot pending for a GEMM whose B operand's data pointer is b_data (set by mxfp8i_gemm_ws_bkey for the
 *  next GEMM only; cleared by this call). Returns the slot (>= 0) and its key, or -1 when none applies. */
int mxfp8i_ws_take_bkey(const void *b_data, uint64_t *key);
/** The buffer of keyed slot `slot` for nbytes of B panels packed by kernel `uk`; *ready = 1 when it already holds the
 *  panels of `key` (packed by an earlier GEMM of the scope). NULL on failure. */
void *mxfp8i_ws_keyed(int slot, uint64_t key, const void *uk, int64_t nbytes, int *ready);
/** Record that keyed slot `slot` now holds the panels of `key` packed by `uk` (after the GEMM succeeded). */
void mxfp8i_ws_keyed_done(int slot, uint64_t key, const void *uk);

#endif /* MXFP8_GEMM_WORKSPACE_H */
