/*
 * mxfp8_mpi.h -- expert parallelism for the blockwise MXFP8 MoE layer over MPI: the public API of libmxfp8_mpi.
 *
 * What this library is
 * --------------------
 * libmxfp8_mpi runs the blockwise Mixture-of-Experts layer of libmxfp8 (mxfp8.h, "Blockwise MoE") split over the P
 * ranks of an MPI communicator, as Megatron-LM, DeepSpeed-MoE and torchtitan do on GPUs (expert parallelism):
 * every rank holds its own tokens and the weights of its own experts; token rows travel to the ranks that own their
 * experts (dispatch), each rank runs libmxfp8's blockwise forward / backward on the rows it received, and the expert
 * outputs travel back to the tokens' ranks (combine), where each token's contributions are summed. The same code runs
 * on one machine (MPI over shared memory) and across a cluster (any MPI network). It is built on the public API of
 * libmxfp8 only and links it; it is built when CMake finds MPI.
 *
 * Sources of the rules: [NKI-E] (mxfp8.h) for the layer each rank computes; the MPI Standard 3.1, sections 5.8
 * (MPI_Alltoall, MPI_Alltoallv), 5.9.5 (user-defined reduction operations, MPI_Op_create) and 8.3 (error handlers),
 * for the exchanges and the agreement; the dispatch / combine pattern is that of GShard and DeepSpeed-MoE.
 *
 * Expert placement
 * ----------------
 * E experts over P ranks (1 <= P <= E; E % P != 0 allowed) in contiguous ranges, as even as possible: with
 * q = E / P and r = E % P, rank p owns E_p = q + (p < r) experts starting at expert p*q + min(p, r)
 * (mxfp8_mpi_moe_expert_range). Rank p passes the weights of exactly those experts, in that order.
 *
 * Determinism contract
 * --------------------
 * Let rank r hold T_r tokens (T_r >= 0, any split, ranks without tokens included) and let the GATHERED problem be
 * the single-process layer of all P ranks' inputs concatenated in rank order: hidden_states X = [X_0; X_1; ...]
 * [T, H] with T = sum T_r (rank r's rows start at o_r = T_0 + ... + T_{r-1}), topk_ids and topk_weights likewise
 * [T, K], the weights and biases (and pre-quantization scales) concatenated along the expert axis [E, ...], routed by
 * mxfp8_moe_route(topk_ids, topk_weights, E, block_size, padding id of config->skip_token) into
 * token_position_to_id, block_to_expert and expert_affinities_masked (of any float dtype that holds the weights
 * exactly, e.g. the weights' own dtype or F32). Then, for any P and any thread count on any rank:
 *   - the forward's output on rank r is bitwise equal to rows [o_r, o_r + T_r) of mxfp8_moe_forward's output of the
 *     gathered problem (same config, same output dtype);
 *   - the backward's hidden_states_grad on rank r equals rows [o_r, o_r + T_r) of mxfp8_moe_backward's
 *     hidden_states_grad of the gathered problem with output_hidden_states_grad concatenated the same way;
 *     expert_affinities_masked_grad equals its entries [o_r E, (o_r + T_r) E); topk_weights_grad[t, k] equals
 *     expert_affinities_masked_grad[(o_r + t) E + topk_ids[t, k]]; gate_up_proj_weight_grad, down_proj_weight_grad
 *     and the bias gradients equal the gathered gradients of the rank's experts. With
 *     config->accumulate_hidden_states_grad / skip_grad_initialization the given buffers are concatenated likewise.
 *     The gathered backward is given the gathered forward's F32 checkpoints (gate_up_proj_act_checkpoint_T, and
 *     down_proj_output_checkpoint with AFFINITY_ON_H) when keep_checkpoints = 1, and none when 0; mxfp8.h makes the
 *     two equal except with pre-quantized weights, whose forward and backward codes are quantized along different
 *     axes (the backward then recomputes g and u from its own codes).
 * This holds because (1) the rows a rank receives are ordered by global token index (source rank, then the source's
 * token index), (2) its blocks are formed exactly as mxfp8_moe_route forms them (expert-major, each expert's tokens
 * ascending, ceil(count / B) blocks per expert), so every block holds the same rows as the gathered problem's block
 * of that expert and the blockwise kernels compute it bit for bit alike (weight gradients then accumulate over the
 * same blocks in the same order), and (3) every (token, expert) contribution travels back unrounded (FP32) and is
 * summed on the token's home rank in ascending expert order starting from zero, the order in which the
 * single-process kernel adds a token's blocks, then rounded once to the output dtype -- under IEEE defaults, as every
 * libmxfp8 kernel runs, whatever the caller's MXCSR (flush-to-zero or denormals-are-zero set by the caller change
 * no bit).
 * The gathered problem's trailing padding-only blocks (mxfp8_moe_num_blocks) contribute nothing and do not matter.
 * With expert_affinities_masked given instead of topk ids (see the args), the routed pairs of a token are its
 * nonzero entries; the contract holds with the gathered problem routed from those pairs (each token's experts in
 * any order), which equals the problem routed from topk ids whenever no routed pair has a zero weight.
 * With the MXFP8 wire (MXFP8_MPI_WIRE_MXFP8), the same holds with X (and, in the backward, dY) replaced by its
 * MX round trip mxfp8_dequantize(mxfp8_quantize(X, axis 1, {config->quant_dtype, config->scale_rule, 1x32})) as F32.
 *
 * Collective semantics
 * --------------------
 * mxfp8_mpi_moe_forward and mxfp8_mpi_moe_backward are collective over the communicator: every rank calls them in
 * the same order, from the thread that may make MPI calls (any MPI thread level works; the library's OpenMP threads
 * never call MPI). Every rank must pass the same num_experts, block_size, wire, keep_checkpoints, hidden size H,
 * intermediate size I, top-k K (or affinities on every rank), dtype of hidden_states (of dY in the backward) and the
 * same values of the config fields that define the layer (compute_dtype, quant_dtype, scale_rule, activation,
 * affinity_option, the four clamp limits, skip_token, accumulate_hidden_states_grad, skip_grad_initialization, bias);
 * the phase blocking configs may differ (speed only). Tokens (T_r), output dtypes and buffers are per rank.
 * Calls on one communicator must not overlap in time (MPI orders collectives per communicator); calls on different
 * communicators may run concurrently from different threads when MPI was initialized with MPI_THREAD_MULTIPLE.
 * The library uses the caller's communicator as given (no duplicate, no error handler change) and only collectives
 * (MPI_Allreduce, MPI_Alltoall, MPI_Alltoallv), so it never matches the caller's point-to-point messages.
 *
 * Errors without hangs
 * --------------------
 * Each rank first validates its own arguments (its views, shapes, dtypes, ids, and the libmxfp8 rules of the local
 * layer, checked by libmxfp8's own validate-and-size entries, which write nothing: mxfp8_moe_forward_validate on the
 * rank's config, hidden_states, weights, biases, scales and output with a routing of no blocks, since the rank's
 * blocks exist only after the dispatch; mxfp8_moe_backward_validate on the rank's local problem itself, the
 * forward's blocks and checkpoints, with the caller's weight and bias gradients), then ALL ranks agree with one MPI_Allreduce, before any
 * data moves, on the outcome: the lowest failing rank's status and message, or a disagreement between ranks on a
 * value every rank must share. On failure every rank returns the same status, its message (mxfp8_mpi_last_error_message)
 * is the same on every rank and names the rank ("rank 2 of 4: ..." or "... differs across ranks: rank 0 has 64, rank 3
 * has 96"), no output is written and no rank is left waiting in a collective. Failures after that point (a workspace
 * allocation or a local kernel call failing on some rank) are agreed on the same way (one MPI_Allreduce after the
 * forward's count exchange, the backward allocating everything before its first agreement, and one after the
 * combine); outputs are written only after the last agreement succeeded. Zero tokens on a rank and experts without
 * tokens are normal cases. The only calls that return without communicating are those given no usable communicator
 * (args NULL, comm MPI_COMM_NULL, the backward's context NULL, MPI not initialized or finalized, an
 * intercommunicator): nothing can be agreed on without one, so such a call must fail on every rank or the others
 * wait in the agreement.
 * MPI's own failures follow the communicator's error handler: with MPI's default (MPI_ERRORS_ARE_FATAL) the MPI
 * library aborts the job; with MPI_ERRORS_RETURN a failing MPI call returns MXFP8_MPI_ERR_COMMUNICATION (the ranks
 * may then disagree: MPI promises nothing after a failure).
 *
 * Data movement (per rank and call; bytes to and from other ranks are counted in mxfp8_mpi_moe_stats, a rank's rows
 * for its own experts are copied in memory)
 *   forward dispatch: MPI_Alltoall of 2 + ceil(E/P) counts per rank pair (rows, pairs, pairs per expert),
 *     MPI_Alltoallv of token rows (one per (token,
 *     destination rank), however many of the token's experts that rank owns) and of 12 bytes of metadata per
 *     (token, expert) pair (row, expert, affinity). Rows are H elements of hidden_states' dtype (WIRE_NATIVE) or
 *     H FP8 codes + ceil(H/32) E8M0 scales (WIRE_MXFP8: 1 + 1/32 bytes per element, about half of BF16).
 *   forward combine: MPI_Alltoallv of 4 H bytes (FP32) per (token, expert) pair.
 *   backward dispatch: MPI_Alltoallv of dY rows with the forward's counts (no count exchange).
 *   backward combine: MPI_Alltoallv of 4 (H + 1) bytes per pair (the FP32 dX row and the affinity gradient).
 *
 * Memory (per rank, bytes; R_s / R_r = rows sent / received, Q_s / Q_r = pairs sent / received = the rank's pairs and
 * its experts' pairs, N_r = blocks of its local problem, e = element bytes of the rows' dtype, r_w = bytes of a wire row):
 *   forward: r_w (R_s + R_r) for the rows (the received ones stay in the context), one local pair-row per received
 *   pair e H Q_r (e = 4 with the MXFP8 wire), the local FP32 results 4 H Q_r, the combine 4 H (Q_r + Q_s), the
 *   local mxfp8_moe_forward's workspace (mxfp8.h) and, with keep_checkpoints, 4 N_r B (2 I [+ H]) kept in the context;
 *   backward: the same for dY plus the local pair-rows of X again, 4 (H + 1) (Q_r + Q_s) for the combine, the local
 *   mxfp8_moe_backward's workspace, and a scratch copy of the rank's weight and bias gradients in their dtype (so that
 *   no gradient is written before every rank is known to have succeeded).
 *
 * Conventions are those of mxfp8.h: tensor views (mxfp8_tensor) with strides in elements, absent optional tensors
 * with data NULL (topk_ids / topk_weights / expert_affinities_masked, whose presence selects the routing, are absent
 * only as MXFP8_TENSOR_NONE: data NULL and ndim 0), views of zero elements may have data NULL (a rank without
 * tokens), no pointer to caller memory is kept after a call
 * (the context keeps copies and the communicator handle), nothing is printed, nothing aborts.
 */
#ifndef MXFP8_MPI_H
#define MXFP8_MPI_H

#include <mpi.h>
#include <stdint.h>

#include "mxfp8.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define MXFP8_MPI_API __declspec(dllexport)
#else
#define MXFP8_MPI_API __attribute__((visibility("default")))
#endif

/** Status of a failed MPI call (only with the MPI_ERRORS_RETURN error handler; see "Errors without hangs"). The
 *  other statuses are mxfp8_status values with their mxfp8.h meaning. */
#define MXFP8_MPI_ERR_COMMUNICATION ((mxfp8_status)64)

/** mxfp8_status_string, plus "MPI communication failed" for MXFP8_MPI_ERR_COMMUNICATION. Static storage. */
MXFP8_MPI_API const char *mxfp8_mpi_status_string(mxfp8_status status);

/** The message of the last error of an mxfp8_mpi_* call on the calling thread ("" when none): one sentence naming
 *  the function, the rank and the bad value, identical on every rank of a failed collective call. */
MXFP8_MPI_API const char *mxfp8_mpi_last_error_message(void);

/** The experts rank `rank` of `nranks` owns (see "Expert placement"): *first_expert = rank*q + min(rank, r),
 *  *num_local_experts = q + (rank < r) with q = num_experts / nranks, r = num_experts % nranks. Not collective.
 *  Errors: NULL_POINTER (an output pointer), INVALID_ARGUMENT (num_experts < 1, nranks < 1, nranks > num_experts,
 *  rank outside [0, nranks)). */
MXFP8_MPI_API mxfp8_status mxfp8_mpi_moe_expert_range(int64_t num_experts, int nranks, int rank,
                                                      int64_t *first_expert, int64_t *num_local_experts);

/** How token rows travel in the dispatch (forward: hidden_states; backward: output_hidden_states_grad). */
typedef enum mxfp8_mpi_wire {
    MXFP8_MPI_WIRE_NATIVE = 0, /**< in the tensor's own dtype (F32, BF16 or F16): the default; exact */
    MXFP8_MPI_WIRE_MXFP8 = 1   /**< MX-quantized along H by the sending rank (mxfp8_quantize: config->quant_dtype,
                                    config->scale_rule, 1x32 groups; a row's groups lie inside the row), sent as FP8
                                    codes + E8M0 scales and dequantized exactly to F32 by the receiver; the layer then
                                    computes on the round-tripped rows (see "Determinism contract") */
} mxfp8_mpi_wire;

/** Per-rank timing and traffic of one call (wall-clock seconds, MPI_Wtime). Bytes count the payload this rank sends
 *  to / receives from OTHER ranks (rows, pair metadata, counts); rows and pairs count all, its own included. */
typedef struct mxfp8_mpi_moe_stats {
    double setup_seconds;     /**< validation, the agreement, the routing plan */
    double dispatch_seconds;  /**< quantize/pack the rows, exchange counts and rows, unpack into the local problem */
    double compute_seconds;   /**< the local mxfp8_moe_forward / mxfp8_moe_backward */
    double combine_seconds;   /**< exchange the results back, agree on the status, sum per token, store */
    int64_t dispatch_bytes_sent, dispatch_bytes_received;
    int64_t combine_bytes_sent, combine_bytes_received;
    int64_t rows_sent;        /**< token rows this rank dispatched (one per (token, destination rank)) */
    int64_t rows_received;    /**< token rows it received */
    int64_t local_pairs;      /**< (token, expert) pairs its experts computed */
    int64_t local_blocks;     /**< blocks of its local problem */
} mxfp8_mpi_moe_stats;

/** What the forward keeps for the backward (opaque): the received rows (in their wire form), the routing of the
 *  local problem, the per-rank plan of the exchange, a copy of the config, and, with keep_checkpoints, the local
 *  forward's F32 checkpoints. Owned by the caller; one context serves any number of backward calls. */
typedef struct mxfp8_mpi_moe_context mxfp8_mpi_moe_context;

/** Free a context (NULL is ignored). Not collective. */
MXFP8_MPI_API void mxfp8_mpi_moe_context_free(mxfp8_mpi_moe_context *context);
/** Bytes of memory a context holds (0 for NULL). */
MXFP8_MPI_API int64_t mxfp8_mpi_moe_context_bytes(const mxfp8_mpi_moe_context *context);

/** Inputs of the expert-parallel forward on one rank. T_r = this rank's tokens, E = num_experts (all ranks),
 *  E_r = the rank's expert count (mxfp8_mpi_moe_expert_range). Tensor fields use the names of mxfp8_moe_fwd_args. */
typedef struct mxfp8_mpi_moe_fwd_args {
    MPI_Comm comm;                       /**< intracommunicator of the P ranks (P <= E); kept in the context */
    int64_t num_experts;                 /**< E >= P, the same on every rank */
    mxfp8_tensor hidden_states;          /**< X_r [T_r, H] F32/BF16/F16 (T_r may be 0) */
    mxfp8_tensor topk_ids;               /**< [T_r, K] I32, each in [0, E), distinct within a row (K <= E); or absent
                                              with expert_affinities_masked given */
    mxfp8_tensor topk_weights;           /**< [T_r, K] F32/BF16/F16, with topk_ids (copied, not normalized) */
    mxfp8_tensor expert_affinities_masked; /**< instead of topk: a_r [T_r*E, 1] or [T_r*E] F32/BF16/F16; the routed
                                              pairs are the nonzero entries (NaN counts as nonzero) */
    mxfp8_tensor gate_up_proj_weight;    /**< W1 of the rank's experts [E_r, H, 2, I]: F32/BF16/F16 or codes */
    mxfp8_tensor down_proj_weight;       /**< W2 [E_r, I, H]: F32/BF16/F16 or codes */
    mxfp8_tensor gate_and_up_proj_bias;  /**< b1 [E_r, 2, I], only with config->bias */
    mxfp8_tensor down_proj_bias;         /**< b2 [E_r, H], only with config->bias */
    mxfp8_tensor gate_up_weight_scales;  /**< W1 pre-quantized along H: [E_r, ceil(H/32), 2, I] (forward layout) */
    mxfp8_tensor down_weight_scales;     /**< W2 pre-quantized along I: [E_r, ceil(I/32), H] */
    int64_t block_size;                  /**< B >= 1 */
    const mxfp8_moe_config *config;      /**< NULL = mxfp8_moe_config_init defaults; copied into the context.
                                              single_expert_dense must be 0 (routing comes from the ids) */
    mxfp8_mpi_wire wire;                 /**< the dispatch's row format (forward and backward); default NATIVE */
    int keep_checkpoints;                /**< 1 (default): the context keeps the local forward's F32 checkpoints
                                              (gate_up_proj_act_checkpoint_T, and down_proj_output_checkpoint with
                                              AFFINITY_ON_H), 4 N_r B (2 I [+ H]) bytes; 0: the backward recomputes
                                              them (bitwise the same result) */
} mxfp8_mpi_moe_fwd_args;

/** Defaults: comm MPI_COMM_NULL, num_experts 0 (must be set), every tensor absent, block_size 4096, config NULL,
 *  wire NATIVE, keep_checkpoints 1. NULL is ignored. */
MXFP8_MPI_API void mxfp8_mpi_moe_fwd_args_init(mxfp8_mpi_moe_fwd_args *args);

/** Expert-parallel forward of the blockwise MoE layer [NKI-E] (collective; see the sections above).
 *  Per rank: dispatch each token row to the ranks owning its experts, run mxfp8_moe_forward on the received rows
 *  (the rank's experts only, blocks formed as mxfp8_moe_route forms them), return each (token, expert) result
 *  a * (inter @ W2 + b2) in FP32 to the token's rank and sum a token's results in ascending expert order in FP32,
 *  rounded once into output.
 *  output:  [T_r, H] F32/BF16/F16, required, distinct elements, not overlapping any input; overwritten (rows of
 *           tokens without experts are 0). Written only when every rank succeeded.
 *  context: NULL = inference (nothing kept); else *context receives a new context for mxfp8_mpi_moe_backward (NULL
 *           on error). stats: NULL, or filled with this rank's figures on success.
 *  Errors (the same on every rank): NULL_POINTER, INVALID_ARGUMENT (num_experts < 1, P > E, wire, keep_checkpoints
 *  not 0/1, single_expert_dense, duplicate id in a topk row, neither or both of topk and affinities, anything
 *  mxfp8_moe_forward rejects), UNSUPPORTED (config->stochastic_rounding not 0: an element's random word follows its
 *  logical index -- its position in the dispatched blocks, its expert's index in the weights --, which a rank's own
 *  blocks and experts do not share with the single-process layer, so the results could not equal it), SHAPE_MISMATCH (shapes among a rank's tensors, weights not [E_r, ...]), DTYPE,
 *  INDEX_OUT_OF_RANGE (a topk id outside [0, E)), SIZE_OVERFLOW (also: more than INT_MAX rows or pairs in one
 *  exchange, the limit of MPI-3 counts), ALIASING, BAD_STRIDES, OUT_OF_MEMORY, MXFP8_MPI_ERR_COMMUNICATION; and
 *  INVALID_ARGUMENT when a value every rank must share differs between ranks. */
MXFP8_MPI_API mxfp8_status mxfp8_mpi_moe_forward(const mxfp8_mpi_moe_fwd_args *args, mxfp8_tensor *output,
                                                 mxfp8_mpi_moe_context **context, mxfp8_mpi_moe_stats *stats);

/** Inputs of the expert-parallel backward on one rank. */
typedef struct mxfp8_mpi_moe_bwd_args {
    const mxfp8_mpi_moe_context *context;  /**< from mxfp8_mpi_moe_forward on this rank (every rank passes its own
                                                context of the same forward call); not modified */
    mxfp8_tensor output_hidden_states_grad; /**< dY_r [T_r, H] F32/BF16/F16 */
    mxfp8_tensor gate_up_proj_weight;      /**< the forward's W1 of the rank's experts [E_r, H, 2, I] (or codes) */
    mxfp8_tensor down_proj_weight;         /**< the forward's W2 [E_r, I, H] (or codes) */
    mxfp8_tensor gate_and_up_proj_bias;    /**< the forward's b1 [E_r, 2, I] (config->bias) */
    mxfp8_tensor down_proj_bias;           /**< the forward's b2 [E_r, H] (config->bias) */
    mxfp8_tensor gate_up_weight_scales;    /**< W1 pre-quantized along 2I: [E_r, H, ceil(2I/32)] (backward layout) */
    mxfp8_tensor down_weight_scales;       /**< W2 pre-quantized along H: [E_r, I, ceil(H/32)] */
} mxfp8_mpi_moe_bwd_args;

/** Defaults: context NULL, every tensor absent. NULL is ignored. */
MXFP8_MPI_API void mxfp8_mpi_moe_bwd_args_init(mxfp8_mpi_moe_bwd_args *args);

/** Gradients of the expert-parallel backward on one rank, F32/BF16/F16 each, distinct elements, no overlap with an
 *  input or another gradient. */
typedef struct mxfp8_mpi_moe_bwd_grads {
    mxfp8_tensor hidden_states_grad;            /**< [T_r, H], required; given + grad with
                                                     config->accumulate_hidden_states_grad */
    mxfp8_tensor topk_weights_grad;             /**< [T_r, K], optional, only when the forward had topk ids:
                                                     the affinity gradient of each (token, k) */
    mxfp8_tensor expert_affinities_masked_grad; /**< [T_r*E, 1] or [T_r*E], optional: overwritten, unrouted pairs 0 */
    mxfp8_tensor gate_up_proj_weight_grad;      /**< [E_r, H, 2, I], required; given + grad with
                                                     skip_grad_initialization */
    mxfp8_tensor down_proj_weight_grad;         /**< [E_r, I, H], required (likewise) */
    mxfp8_tensor gate_and_up_proj_bias_grad;    /**< [E_r, 2, I], required iff config->bias */
    mxfp8_tensor down_proj_bias_grad;           /**< [E_r, H], required iff config->bias */
} mxfp8_mpi_moe_bwd_grads;

/** Expert-parallel backward, blockwise_mm_bwd_mxfp8 [NKI-E] over the ranks (collective; the forward's config, wire
 *  and communicator, from the context).
 *  Per rank: dispatch dY rows with the forward's counts, run mxfp8_moe_backward (blockwise_mm_bwd_mxfp8) on the
 *  rank's local problem (the forward's received rows and blocks, its checkpoints or recomputed), return each
 *  (token, expert) dX row (FP32) and affinity gradient to the token's rank, sum dX in ascending expert order in FP32
 *  and round once; the rank's weight (and bias) gradients come straight from its local backward.
 *  Every gradient is written only when every rank succeeded. stats: NULL or this rank's figures.
 *  Errors (the same on every rank): NULL_POINTER (args, grads, context, a required view), INVALID_ARGUMENT (a context
 *  of another communicator size, topk_weights_grad without topk ids, anything mxfp8_moe_backward rejects),
 *  UNSUPPORTED (stochastic rounding, as for the forward, which refuses it first),
 *  SHAPE_MISMATCH, DTYPE, ALIASING, BAD_STRIDES, SIZE_OVERFLOW, OUT_OF_MEMORY, MXFP8_MPI_ERR_COMMUNICATION, and
 *  INVALID_ARGUMENT when the dtype of dY differs between ranks. */
MXFP8_MPI_API mxfp8_status mxfp8_mpi_moe_backward(const mxfp8_mpi_moe_bwd_args *args, mxfp8_mpi_moe_bwd_grads *grads,
                                                  mxfp8_mpi_moe_stats *stats);

/* ---- helpers for language bindings (the Python module mxfp8.mpi over mpi4py) ---- */
/** sizeof(MPI_Comm) of the MPI this library was built with (4 for MPICH-like ints, 8 for Open MPI's pointers). */
MXFP8_MPI_API int mxfp8_mpi_comm_size_bytes(void);
/** *comm = MPI_Comm_f2c(fortran_handle) (mpi4py: comm.py2f()). Errors: NULL_POINTER, INVALID_ARGUMENT (MPI not
 *  initialized). */
MXFP8_MPI_API mxfp8_status mxfp8_mpi_comm_from_fortran(int fortran_handle, MPI_Comm *comm);
/** sizeof of the argument structs, so that a binding can check its mirrors: which = 0 fwd_args, 1 bwd_args,
 *  2 bwd_grads, 3 stats; -1 otherwise. */
MXFP8_MPI_API int64_t mxfp8_mpi_struct_size(int which);

#ifdef __cplusplus
}
#endif
#endif /* MXFP8_MPI_H */
