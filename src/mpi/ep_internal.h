/*
 * ep_internal.h -- internals of libmxfp8_mpi (expert parallelism over MPI). Built on the public headers
 * include/mxfp8.h and include/mxfp8_mpi.h, and on libmxfp8's header-only MXCSR guard (src/runtime/fenv.h: the home
 * folds add in FP32 under IEEE defaults whatever the caller's MXCSR, as libmxfp8 does).
 *
 * Vocabulary: the HOME rank of a token holds it (its row of hidden_states); the rank that owns an expert computes
 * the (token, expert) PAIRS routed to it. The PLAN of a call (ep_plan) says, for this rank, which rows go where and
 * how the results come back; it is built once by the forward and kept in the context for the backward.
 *   send side   rows are grouped by destination rank, tokens ascending inside a group (one row per (token,
 *               destination)); pairs likewise, (token, expert) ascending; a pair names its row inside the group.
 *   home fold   per token, its pairs in ascending expert order (token-major CSR), as positions in the combine's
 *               receive buffer, which has the layout of the send side's pairs.
 *   receive     rows and pairs arrive grouped by source rank (ascending), so in global token order.
 *   local       the local problem: one row per received pair (a pair-row), ordered (local expert, global token),
 *               blocks of B consecutive pair-rows per expert (mxfp8_moe_route's layout).
 */
#ifndef MXFP8_MPI_EP_INTERNAL_H
#define MXFP8_MPI_EP_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "../runtime/fenv.h"
#include "mxfp8.h"
#include "mxfp8_mpi.h"

#define EP_MSG 480 /* bytes of an error message */

/* ---- errors (ep_util.c) ---- */
/** Set this thread's message (printf format) and return st. */
mxfp8_status ep_fail(mxfp8_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** This thread's message buffer (the last ep_fail). */
const char *ep_message(void);
/** Clear the message. */
void ep_clear(void);
/** MXFP8_MPI_ERR_COMMUNICATION with "fn: what failed: <MPI_Error_string>". */
mxfp8_status ep_mpi_fail(const char *fn, const char *what, int rc);
/** A libmxfp8 call failed with st: copy its message (prefixed by fn and what) and return st. */
mxfp8_status ep_lib_fail(const char *fn, const char *what, mxfp8_status st);

/* ---- views (ep_util.c) ---- */
/** Check a view: known dtype, 0..MXFP8_MAX_DIMS dims, extents >= 0, an element count and byte span that fit int64,
 *  data non-NULL when it has elements. ndim >= 0: must have that rank; shape (when not NULL): extents, -1 = any.
 *  dtypes: bit mask (1u << dtype) of the accepted dtypes. Absent (data NULL, no elements expected) passes only
 *  when !required; *present tells which (may be NULL). */
mxfp8_status ep_check_view(const char *fn, const char *name, const mxfp8_tensor *t, int ndim, const int64_t *shape,
                           unsigned dtypes, int required);
/** BAD_STRIDES unless an output view addresses distinct elements (nested strides). */
mxfp8_status ep_check_distinct(const char *fn, const char *name, const mxfp8_tensor *t);
/** ALIASING if the byte spans of two views overlap (absent or empty views never do). */
mxfp8_status ep_check_overlap(const char *fn, const char *na, const mxfp8_tensor *a, const char *nb,
                              const mxfp8_tensor *b);
#define EP_FLOATS ((1u << MXFP8_DTYPE_F32) | (1u << MXFP8_DTYPE_BF16) | (1u << MXFP8_DTYPE_F16))
static inline int ep_present(const mxfp8_tensor *t) { return t && t->data; }
/** A flat 1-D view [n] (or [n, 1]) check for the affinity vectors. */
mxfp8_status ep_check_vec(const char *fn, const char *name, const mxfp8_tensor *t, int64_t n, int required);
/** Element offset of flat index i of a [n] or [n, 1] view. */
static inline int64_t ep_vec_off(const mxfp8_tensor *t, int64_t i) { return i * t->strides[0]; }
/** Load / store one F32/BF16/F16 element at element offset off. */
float ep_load(const mxfp8_tensor *t, int64_t off);
void ep_store(const mxfp8_tensor *t, int64_t off, float v);
/** Copy between a view and a contiguous buffer of the view's dtype (row-major over its shape). */
void ep_gather(const mxfp8_tensor *t, void *dst);
void ep_scatter(const mxfp8_tensor *t, const void *src);
/** A contiguous view of buf with t's dtype and shape. */
mxfp8_tensor ep_like(const mxfp8_tensor *t, void *buf);
/** A non-NULL pointer for views of zero elements (never dereferenced). */
void *ep_dummy(void);
/** A tensor argument is given unless it is MXFP8_TENSOR_NONE-like (data NULL and ndim 0): a view of zero
 *  elements may have data NULL. */
int ep_given(const mxfp8_tensor *t);
/** The checks that need no communication (MPI initialized, comm not NULL, an intracommunicator); rank and size. */
mxfp8_status ep_comm_usable(const char *fn, MPI_Comm comm, int *rank, int *nranks);
/** malloc of n * size bytes (at least 1); on failure or overflow clears *ok and returns NULL. */
void *ep_alloc(int64_t n, int64_t size, int *ok);
/** Threads for the library's own loops (mxfp8_get_info's count). */
int ep_threads(void);

/* ---- the agreement (ep_agree.c) ---- */
/** The values every rank must share, checked by the agreement. */
enum {
    EP_V_H, EP_V_I, EP_V_E, EP_V_K, EP_V_B, EP_V_XDTYPE, EP_V_WIRE, EP_V_KEEP,
    EP_V_COMPUTE, EP_V_QUANT, EP_V_RULE, EP_V_ACT, EP_V_AFF, EP_V_GLO, EP_V_GHI, EP_V_ULO, EP_V_UHI,
    EP_V_SKIP, EP_V_ACC, EP_V_SGI, EP_V_BIAS, EP_V_DYDTYPE, EP_NV
};
/** Agree on the outcome (collective: one MPI_Allreduce with a user-defined operation). local: this rank's status
 *  (its message is ep_message()); values: EP_NV shared values (EP_UNSET entries are not compared), or NULL.
 *  Returns the lowest failing rank's status, or INVALID_ARGUMENT when a shared value differs between ranks, with
 *  the same message on every rank; MXFP8_OK when every rank is fine. */
#define EP_UNSET INT64_MIN
mxfp8_status ep_agree(MPI_Comm comm, const char *fn, mxfp8_status local, const int64_t *values);
/** The shared values of a config (EP_V_COMPUTE .. EP_V_BIAS). */
void ep_config_values(const mxfp8_moe_config *c, int64_t *values);

/* ---- the plan (ep_plan.c) ---- */
typedef struct ep_pair {
    int32_t row;    /* send side: row index inside its destination group; receive side: index in the received rows */
    int32_t expert; /* expert index on the destination rank (0 .. E_dest - 1) */
    float weight;   /* the affinity */
} ep_pair;

typedef struct ep_plan {
    int P, rank;
    int64_t T, H, E, K, E_r, e0; /* K: top-k, or -1 when routed by expert_affinities_masked */
    int64_t B;
    /* send side (home) */
    int *srow_cnt, *srow_dsp, *spair_cnt, *spair_dsp; /* [P] in rows / pairs */
    int64_t nsrow, nspair;
    int32_t *srow_tok; /* [nsrow] token of each row sent */
    ep_pair *spair;    /* [nspair] */
    /* home fold: token t's pairs are tok_pair[tok_off[t] .. tok_off[t+1]) in ascending expert order */
    int64_t *tok_off;   /* [T + 1] */
    int32_t *tok_pair;  /* [nspair] position in the pair order of the send side (= the combine's receive buffer) */
    int32_t *tok_slot;  /* [nspair] k of the pair in its topk row (K >= 1), else -1 */
    int32_t *tok_exp;   /* [nspair] global expert */
    /* receive side */
    int *rrow_cnt, *rrow_dsp, *rpair_cnt, *rpair_dsp;
    int cstride;              /* ints per rank in the count exchange: rows, pairs, pairs per expert (ceil(E/P)) */
    int *cnt_send, *cnt_recv; /* [P * cstride] the count exchange's buffers */
    int64_t *lcnt;            /* [E_r] pairs per local expert (from the count exchange) */
    int64_t nrrow, nrpair;
    ep_pair *rpair;     /* [nrpair] as received, row made an index into the received rows */
    int32_t *perm;      /* [nrpair] local pair-row of received pair i */
    /* local problem */
    int64_t nloc, Nloc;
    int32_t *lrow;      /* [nloc] received row of each pair-row */
    int32_t *lexp;      /* [nloc] local expert of each pair-row */
    float *la;          /* [nloc] affinity */
    int32_t *tok_pos;   /* [Nloc * B] token_position_to_id of the local problem */
    int32_t *blk_exp;   /* [Nloc] block_to_expert */
} ep_plan;

/** Owner rank of global expert e (contiguous ranges; see mxfp8_moe_expert_range). */
int ep_owner(int64_t E, int P, int64_t e);
/** Build the send side and the home fold from topk ids/weights ([T, K], K >= 1) or affinities (ids NULL: [T*E]).
 *  Local: checks ids (range, duplicates) and count limits. */
mxfp8_status ep_plan_home(const char *fn, ep_plan *p, const mxfp8_tensor *ids, const mxfp8_tensor *weights,
                          const mxfp8_tensor *aff);
/** Exchange the counts (collective: MPI_Alltoall) and size the receive side and the local problem (nloc, Nloc).
 *  Local failures (count limits) are returned, not yet agreed. */
mxfp8_status ep_plan_counts(const char *fn, MPI_Comm comm, ep_plan *p, int64_t *bytes_sent, int64_t *bytes_recv);
/** Allocate the receive side's arrays (after ep_plan_counts). */
mxfp8_status ep_plan_alloc_recv(const char *fn, ep_plan *p);
/** After the pairs arrived in p->rpair: make their rows indices into all received rows, check them against the
 *  counts, and form the local problem (pair-rows, blocks; padding id -1 with skip_token, else nloc). */
mxfp8_status ep_plan_local(const char *fn, ep_plan *p, int skip_token);
void ep_plan_free(ep_plan *p);
int64_t ep_plan_bytes(const ep_plan *p);

/* ---- exchanges and rows (ep_wire.c) ---- */
/** MPI_Alltoallv of fixed-size rows (counts and displacements in rows); adds the bytes to/from other ranks. */
mxfp8_status ep_alltoallv(const char *fn, MPI_Comm comm, const void *sbuf, const int *scnt, const int *sdsp,
                          void *rbuf, const int *rcnt, const int *rdsp, int64_t rowbytes, int64_t *bytes_sent,
                          int64_t *bytes_recv);
/** Bytes of one wire row of H elements of dtype dt. */
int64_t ep_row_bytes(mxfp8_mpi_wire wire, mxfp8_dtype dt, int64_t H);
/** Pack the rows p->srow_tok of x [T, H] into sbuf (wire format). MXFP8: quantized along H with fmt and rule
 *  through tmp [T, H + ceil(H/32)] bytes (NULL for NATIVE). */
mxfp8_status ep_pack_rows(const char *fn, const ep_plan *p, const mxfp8_tensor *x, mxfp8_mpi_wire wire,
                          mxfp8_format fmt, mxfp8_scale_rule rule, void *sbuf, void *tmp);
/** The dtype of the local problem's rows for a wire and the source dtype (MXFP8 -> F32). */
mxfp8_dtype ep_local_dtype(mxfp8_mpi_wire wire, mxfp8_dtype dt);
/** Decode received rows into the local pair-rows [nloc, H] (row lrow[j] -> j), dtype ep_local_dtype; MXFP8
 *  through tmp [nloc, H + ceil(H/32)] bytes (NULL for NATIVE). */
mxfp8_status ep_unpack_pairs(const char *fn, const ep_plan *p, const void *rbuf, mxfp8_mpi_wire wire,
                             mxfp8_dtype dt, mxfp8_format fmt, void *out, void *tmp);
/** The affinity vector of the local problem [nloc * E_r] (zero except each pair-row's own expert). */
void ep_local_affinities(const ep_plan *p, float *a);
/** The home fold: out[t] = the sum over token t's pairs in ascending expert order of their FP32 rows (recv + pair *
 *  ld, H floats each), from +0, with add the view's given value + that sum (one FP32 addition), rounded once into
 *  out [T, H]; under IEEE defaults on every thread whatever the caller's MXCSR, as in libmxfp8. */
void ep_fold(const ep_plan *p, const float *recv, int64_t ld, const mxfp8_tensor *out, int add);

/* ---- checks shared by the forward and the backward (ep_forward.c) ---- */
/** UNSUPPORTED, saying why, when the config asks for stochastic rounding: an element's random word follows its
 *  position in the dispatched blocks and its expert's index in the weights, which differ from one process. */
mxfp8_status ep_refuse_rounding(const char *fn, const mxfp8_moe_config *cfg);
/** SHAPE_MISMATCH naming the rank and its experts when a weight view (of rank >= 1) does not hold E_r experts. */
mxfp8_status ep_check_expert_count(const char *fn, const ep_plan *p, const char *name, const mxfp8_tensor *w);
/** A libmxfp8 check or call of the rank's local layer failed with st: its message, prefixed by fn and the rank's
 *  experts. */
mxfp8_status ep_local_fail(const char *fn, const ep_plan *p, mxfp8_status st);
/** Seconds (MPI_Wtime). */
double ep_now(void);

/* ---- the context ---- */
struct mxfp8_mpi_moe_context {
    MPI_Comm comm;
    ep_plan plan;
    mxfp8_moe_config cfg;
    mxfp8_mpi_wire wire;
    int keep;
    int64_t I;
    mxfp8_dtype xdt;     /* dtype of hidden_states (the wire rows' source dtype) */
    int64_t rowbytes;    /* bytes of a received row */
    void *rows;          /* [nrrow * rowbytes] the received rows */
    float *ck_gu;        /* [Nloc, 2, I, B] or NULL */
    float *ck_down;      /* [Nloc, B, H] or NULL */
};

#endif /* MXFP8_MPI_EP_INTERNAL_H */
