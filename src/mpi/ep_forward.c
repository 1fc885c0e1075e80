/*
 * ep_forward.c -- mxfp8_mpi_moe_forward: validate (locally, then one agreement), plan, exchange counts, allocate
 * (agreement), dispatch rows and pairs, run mxfp8_moe_forward on the local pair-rows, combine the FP32 results and
 * sum each token's pairs in ascending expert order (the single-process kernel's block order), rounded once.
 * Contract and collective semantics: include/mxfp8_mpi.h.
 */
#include <stdlib.h>
#include <string.h>

#include "ep_internal.h"

void mxfp8_mpi_moe_fwd_args_init(mxfp8_mpi_moe_fwd_args *args) {
    if (!args) return;
    memset(args, 0, sizeof *args);
    args->comm = MPI_COMM_NULL;
    args->block_size = 4096;
    args->wire = MXFP8_MPI_WIRE_NATIVE;
    args->keep_checkpoints = 1;
}

mxfp8_status ep_refuse_rounding(const char *fn, const mxfp8_moe_config *cfg) {
    if (!cfg->stochastic_rounding) return MXFP8_OK;
    return ep_fail(MXFP8_ERR_UNSUPPORTED, "%s: config.stochastic_rounding 0x%x is not supported with expert "
                   "parallelism: the random word of an element comes from its logical index (its position in the "
                   "dispatched blocks, or its expert's index in the weights), which a rank's own blocks and experts "
                   "do not share with the single-process layer, so the results could not be the same; use nearest "
                   "rounding (0) or the single-process mxfp8_moe_forward / mxfp8_moe_backward", fn,
                   (unsigned)cfg->stochastic_rounding);
}

mxfp8_status ep_check_expert_count(const char *fn, const ep_plan *p, const char *name, const mxfp8_tensor *w) {
    if (!ep_given(w) || w->ndim < 1 || w->ndim > MXFP8_MAX_DIMS || w->shape[0] == p->E_r) return MXFP8_OK;
    return ep_fail(MXFP8_ERR_SHAPE_MISMATCH, "%s: %s holds %lld experts but rank %d owns %lld (experts %lld..%lld "
                   "of %lld)", fn, name, (long long)w->shape[0], p->rank, (long long)p->E_r, (long long)p->e0,
                   (long long)(p->e0 + p->E_r - 1), (long long)p->E);
}

mxfp8_status ep_local_fail(const char *fn, const ep_plan *p, mxfp8_status st) {
    return ep_fail(st, "%s: the local layer of experts %lld..%lld: %s", fn, (long long)p->e0,
                   (long long)(p->e0 + p->E_r - 1), mxfp8_last_error_message());
}

/* Everything one forward call allocates (freed at the end unless moved into the context). */
typedef struct fwd {
    ep_plan p;
    mxfp8_moe_config cfg;
    int64_t I, rb;
    mxfp8_dtype xdt, ldt;
    void *sbuf, *tmpq, *rbuf, *xloc, *tmpd;
    float *aloc, *yloc, *ck_gu, *ck_down, *csend, *crecv;
    mxfp8_mpi_moe_context *ctx;
} fwd;

static void fwd_free(fwd *s) {
    ep_plan_free(&s->p);
    free(s->sbuf); free(s->tmpq); free(s->rbuf); free(s->xloc); free(s->tmpd); free(s->aloc); free(s->yloc);
    free(s->ck_gu); free(s->ck_down); free(s->csend); free(s->crecv); free(s->ctx);
}

/* The args of the rank's local mxfp8_moe_forward that come from the caller: weights, biases, scales, block size,
 * config (the rows, affinities and blocks are the dispatch's). */
static void local_args(const mxfp8_mpi_moe_fwd_args *A, const fwd *s, mxfp8_moe_fwd_args *a) {
    mxfp8_moe_fwd_args_init(a);
    a->gate_up_proj_weight = A->gate_up_proj_weight;
    a->down_proj_weight = A->down_proj_weight;
    a->block_size = s->p.B;
    a->gate_and_up_proj_bias = A->gate_and_up_proj_bias;
    a->down_proj_bias = A->down_proj_bias;
    a->gate_up_weight_scales = A->gate_up_weight_scales;
    a->down_weight_scales = A->down_weight_scales;
    a->config = &s->cfg;
}

/* libmxfp8's own checks of the rank's local layer (mxfp8_moe_forward_validate), before any rank communicates: the
 * config, hidden_states, the weights, biases and scales, and output (shape, dtype, distinct elements, no overlap with
 * those inputs), on a stand-in routing of no blocks (the rank's blocks exist only after the dispatch; affinities of
 * the rank's experts as a view of zero stride, never read). The same rules as the local call; nothing written. */
static mxfp8_status check_local(const char *fn, const mxfp8_mpi_moe_fwd_args *A, const mxfp8_tensor *out,
                                const fwd *s) {
    const ep_plan *p = &s->p;
    const mxfp8_tensor *x = &A->hidden_states;
    /* T of a view the library accepts (any other is refused before the affinities are looked at); T*E_r overflows:
       the library says so */
    const int64_t T = x->ndim >= 1 && x->ndim <= MXFP8_MAX_DIMS ? x->shape[0] : 0;
    int64_t TE, zero = 0;
    if (T < 0 || __builtin_mul_overflow(T, p->E_r, &TE)) TE = 0;
    mxfp8_moe_fwd_args a;
    local_args(A, s, &a);
    a.hidden_states = A->hidden_states;
    a.expert_affinities_masked = mxfp8_tensor_make(ep_dummy(), MXFP8_DTYPE_F32, 1, &TE);
    a.expert_affinities_masked.strides[0] = 0;
    a.token_position_to_id = mxfp8_tensor_make(ep_dummy(), MXFP8_DTYPE_I32, 1, &zero);
    a.block_to_expert = a.token_position_to_id;
    mxfp8_moe_fwd_outputs o;
    memset(&o, 0, sizeof o);
    o.output = *out;
    mxfp8_status st = mxfp8_moe_forward_validate(&a, &o, NULL);
    return st ? ep_local_fail(fn, p, st) : MXFP8_OK;
}

/* Local validation and the plan (no communication). values: the shared values for the agreement. */
static mxfp8_status fwd_validate(const char *fn, const mxfp8_mpi_moe_fwd_args *A, const mxfp8_tensor *out, fwd *s,
                                 int P, int rank, int64_t *values) {
    ep_plan *p = &s->p;
    mxfp8_status st;
    if (A->config) s->cfg = *A->config;
    else mxfp8_moe_config_init(&s->cfg);
    if (!out) return ep_fail(MXFP8_ERR_NULL_POINTER, "%s: output is NULL", fn);
    if (A->num_experts < 1 || A->num_experts < P)
        return ep_fail(MXFP8_ERR_INVALID_ARGUMENT, "%s: num_experts = %lld for %d ranks (need 1 <= ranks <= "
                       "experts)", fn, (long long)A->num_experts, P);
    if ((unsigned)A->wire > MXFP8_MPI_WIRE_MXFP8)
        return ep_fail(MXFP8_ERR_INVALID_ARGUMENT, "%s: wire %d is not NATIVE (0) or MXFP8 (1)", fn, (int)A->wire);
    if (A->keep_checkpoints != 0 && A->keep_checkpoints != 1)
        return ep_fail(MXFP8_ERR_INVALID_ARGUMENT, "%s: keep_checkpoints %d is not 0 or 1", fn, A->keep_checkpoints);
    if (s->cfg.single_expert_dense)
        return ep_fail(MXFP8_ERR_INVALID_ARGUMENT, "%s: config.single_expert_dense must be 0 (expert parallelism "
                       "routes by the topk ids)", fn);
    if ((st = ep_refuse_rounding(fn, &s->cfg))) return st;
    p->P = P; p->rank = rank; p->E = A->num_experts; p->B = A->block_size;
    mxfp8_mpi_moe_expert_range(p->E, P, rank, &p->e0, &p->E_r);
    if ((st = ep_check_expert_count(fn, p, "gate_up_proj_weight", &A->gate_up_proj_weight)) ||
        (st = ep_check_expert_count(fn, p, "down_proj_weight", &A->down_proj_weight)))
        return st;
    /* the local layer's rules (block_size, hidden_states, weights, biases, scales, output) are libmxfp8's */
    if ((st = check_local(fn, A, out, s))) return st;
    p->T = A->hidden_states.shape[0]; p->H = A->hidden_states.shape[1];
    s->xdt = A->hidden_states.dtype;
    s->I = A->gate_up_proj_weight.shape[3];
    const int topk = ep_given(&A->topk_ids) || ep_given(&A->topk_weights), aff = ep_given(&A->expert_affinities_masked);
    if (topk == aff)
        return ep_fail(MXFP8_ERR_INVALID_ARGUMENT, "%s: give either topk_ids + topk_weights or "
                       "expert_affinities_masked (%s)", fn, topk ? "both are given" : "neither is given");
    if (topk) {
        const int64_t sk[2] = {p->T, -1};
        if ((st = ep_check_view(fn, "topk_ids", &A->topk_ids, 2, sk, 1u << MXFP8_DTYPE_I32, 1))) return st;
        p->K = A->topk_ids.shape[1];
        if (p->K < 1 || p->K > p->E)
            return ep_fail(MXFP8_ERR_INVALID_ARGUMENT, "%s: top-k K = %lld must be in [1, E = %lld]", fn,
                           (long long)p->K, (long long)p->E);
        const int64_t sw[2] = {p->T, p->K};
        if ((st = ep_check_view(fn, "topk_weights", &A->topk_weights, 2, sw, EP_FLOATS, 1))) return st;
    } else {
        p->K = -1;
        int64_t TE;
        if (__builtin_mul_overflow(p->T, p->E, &TE)) return ep_fail(MXFP8_ERR_SIZE_OVERFLOW, "%s: T*E overflows", fn);
        if ((st = ep_check_vec(fn, "expert_affinities_masked", &A->expert_affinities_masked, TE, 1))) return st;
    }
    const mxfp8_tensor *in[3] = {&A->topk_ids, &A->topk_weights, &A->expert_affinities_masked};
    static const char *in_nm[3] = {"topk_ids", "topk_weights", "expert_affinities_masked"};
    for (int i = 0; i < 3; i++) /* the routing inputs, which the local layer does not see */
        if ((st = ep_check_overlap(fn, "output", out, in_nm[i], in[i]))) return st;
    if ((st = ep_plan_home(fn, p, topk ? &A->topk_ids : NULL, topk ? &A->topk_weights : NULL,
                           topk ? NULL : &A->expert_affinities_masked)))
        return st;
    values[EP_V_H] = p->H; values[EP_V_I] = s->I; values[EP_V_E] = p->E; values[EP_V_K] = p->K;
    values[EP_V_B] = p->B; values[EP_V_XDTYPE] = s->xdt; values[EP_V_WIRE] = A->wire;
    values[EP_V_KEEP] = A->keep_checkpoints;
    ep_config_values(&s->cfg, values);
    return MXFP8_OK;
}

/* Buffers sized by the count exchange (all allocated before the second agreement). */
static mxfp8_status fwd_alloc(const char *fn, const mxfp8_mpi_moe_fwd_args *A, fwd *s, int want_ctx) {
    const ep_plan *p = &s->p;
    const int64_t H = p->H, G = (H + 31) / 32, mx = A->wire == MXFP8_MPI_WIRE_MXFP8;
    int ok = 1;
    mxfp8_status st = ep_plan_alloc_recv(fn, &s->p);
    if (st) return st;
    s->rb = ep_row_bytes(A->wire, s->xdt, H);
    s->ldt = ep_local_dtype(A->wire, s->xdt);
    s->sbuf = ep_alloc(p->nsrow, s->rb, &ok);
    s->tmpq = mx ? ep_alloc(p->T, H + G, &ok) : NULL;
    s->rbuf = ep_alloc(p->nrrow, s->rb, &ok);
    s->xloc = ep_alloc(p->nloc * H, (int64_t)mxfp8_dtype_size(s->ldt), &ok);
    s->tmpd = mx ? ep_alloc(p->nloc, H + G, &ok) : NULL;
    s->aloc = ep_alloc(p->nloc * p->E_r, sizeof(float), &ok);
    s->yloc = ep_alloc(p->nloc * H, sizeof(float), &ok);
    if (want_ctx && A->keep_checkpoints) {
        s->ck_gu = ep_alloc(p->Nloc * p->B * 2 * s->I, sizeof(float), &ok);
        if (s->cfg.affinity_option == MXFP8_AFFINITY_ON_H) s->ck_down = ep_alloc(p->Nloc * p->B * H, sizeof(float), &ok);
    }
    s->csend = ep_alloc(p->nrpair * H, sizeof(float), &ok);
    s->crecv = ep_alloc(p->nspair * H, sizeof(float), &ok);
    if (want_ctx && !(s->ctx = calloc(1, sizeof *s->ctx))) ok = 0;
    return ok ? MXFP8_OK : ep_fail(MXFP8_ERR_OUT_OF_MEMORY, "%s: cannot allocate the exchange and local buffers "
                                   "(%lld rows received, %lld pairs)", fn, (long long)p->nrrow, (long long)p->nrpair);
}

static void *nz(void *q) { return q ? q : ep_dummy(); }

/* The local forward on the pair-rows (after the dispatch). */
static mxfp8_status fwd_local(const char *fn, const mxfp8_mpi_moe_fwd_args *A, fwd *s) {
    const ep_plan *p = &s->p;
    mxfp8_moe_fwd_args a;
    local_args(A, s, &a);
    const int64_t sx[2] = {p->nloc, p->H}, sa[2] = {p->nloc * p->E_r, 1}, NB = p->Nloc * p->B, N = p->Nloc;
    a.hidden_states = mxfp8_tensor_make(nz(s->xloc), s->ldt, 2, sx);
    a.expert_affinities_masked = mxfp8_tensor_make(nz(s->aloc), MXFP8_DTYPE_F32, 2, sa);
    a.token_position_to_id = mxfp8_tensor_make(nz(p->tok_pos), MXFP8_DTYPE_I32, 1, &NB);
    a.block_to_expert = mxfp8_tensor_make(nz(p->blk_exp), MXFP8_DTYPE_I32, 1, &N);
    mxfp8_moe_fwd_outputs o;
    memset(&o, 0, sizeof o);
    o.output = mxfp8_tensor_make(nz(s->yloc), MXFP8_DTYPE_F32, 2, sx);
    if (s->ck_gu) {
        const int64_t sg[4] = {N, 2, s->I, p->B};
        o.gate_up_proj_act_checkpoint_T = mxfp8_tensor_make(s->ck_gu, MXFP8_DTYPE_F32, 4, sg);
    }
    if (s->ck_down) {
        const int64_t sd[3] = {N, p->B, p->H};
        o.down_proj_output_checkpoint = mxfp8_tensor_make(s->ck_down, MXFP8_DTYPE_F32, 3, sd);
    }
    mxfp8_status st = mxfp8_moe_forward(&a, &o);
    return st ? ep_local_fail(fn, p, st) : MXFP8_OK;
}

/* Dispatch after the second agreement: rows and pairs out, the local problem in. Returns a local status (to be
 * agreed after the combine) or MXFP8_MPI_ERR_COMMUNICATION. */
static mxfp8_status fwd_dispatch(const char *fn, MPI_Comm comm, const mxfp8_mpi_moe_fwd_args *A, fwd *s,
                                 mxfp8_mpi_moe_stats *o) {
    ep_plan *p = &s->p;
    mxfp8_status local = ep_pack_rows(fn, p, &A->hidden_states, A->wire, s->cfg.quant_dtype, s->cfg.scale_rule,
                                      s->sbuf, s->tmpq);
    if (local) memset(s->sbuf, 0, (size_t)(p->nsrow * s->rb));
    mxfp8_status st = ep_alltoallv(fn, comm, s->sbuf, p->srow_cnt, p->srow_dsp, s->rbuf, p->rrow_cnt, p->rrow_dsp,
                                   s->rb, &o->dispatch_bytes_sent, &o->dispatch_bytes_received);
    if (st) return st;
    st = ep_alltoallv(fn, comm, p->spair, p->spair_cnt, p->spair_dsp, p->rpair, p->rpair_cnt, p->rpair_dsp,
                      (int64_t)sizeof(ep_pair), &o->dispatch_bytes_sent, &o->dispatch_bytes_received);
    if (st) return st;
    if (!local) local = ep_plan_local(fn, p, s->cfg.skip_token);
    if (!local) local = ep_unpack_pairs(fn, p, s->rbuf, A->wire, s->xdt, s->cfg.quant_dtype, s->xloc, s->tmpd);
    if (!local) ep_local_affinities(p, s->aloc);
    return local;
}

static void fill_context(fwd *s, MPI_Comm comm, const mxfp8_mpi_moe_fwd_args *A) {
    mxfp8_mpi_moe_context *c = s->ctx;
    c->comm = comm;
    c->plan = s->p;
    memset(&s->p, 0, sizeof s->p);
    c->cfg = s->cfg;
    c->wire = A->wire;
    c->keep = A->keep_checkpoints;
    c->I = s->I;
    c->xdt = s->xdt;
    c->rowbytes = s->rb;
    c->rows = s->rbuf;
    c->ck_gu = s->ck_gu;
    c->ck_down = s->ck_down;
    s->rbuf = NULL;
    s->ck_gu = s->ck_down = NULL;
    s->ctx = NULL;
}

mxfp8_status mxfp8_mpi_moe_forward(const mxfp8_mpi_moe_fwd_args *args, mxfp8_tensor *output,
                                   mxfp8_mpi_moe_context **context, mxfp8_mpi_moe_stats *stats) {
    static const char *fn = "mxfp8_mpi_moe_forward";
    ep_clear();
    if (context) *context = NULL;
    if (!args) return ep_fail(MXFP8_ERR_NULL_POINTER, "%s: args is NULL", fn);
    int rank = 0, P = 1;
    mxfp8_status st = ep_comm_usable(fn, args->comm, &rank, &P);
    if (st) return st;
    const MPI_Comm comm = args->comm;
    mxfp8_mpi_moe_stats o;
    memset(&o, 0, sizeof o);
    fwd s;
    memset(&s, 0, sizeof s);
    double t0 = ep_now(), t1, t2, t3;
    int64_t values[EP_NV];
    for (int i = 0; i < EP_NV; i++) values[i] = EP_UNSET;
    st = fwd_validate(fn, args, output, &s, P, rank, values);
    if ((st = ep_agree(comm, fn, st, values))) goto out; /* the one agreement before any exchange */
    t1 = ep_now();
    o.setup_seconds = t1 - t0;
    st = ep_plan_counts(fn, comm, &s.p, &o.dispatch_bytes_sent, &o.dispatch_bytes_received);
    if (st == MXFP8_MPI_ERR_COMMUNICATION) goto out;
    if (!st) st = fwd_alloc(fn, args, &s, context != NULL);
    if ((st = ep_agree(comm, fn, st, NULL))) goto out;
    mxfp8_status local = fwd_dispatch(fn, comm, args, &s, &o);
    if ((st = local) == MXFP8_MPI_ERR_COMMUNICATION) goto out;
    t2 = ep_now();
    o.dispatch_seconds = t2 - t1;
    if (!local) local = fwd_local(fn, args, &s);
    t3 = ep_now();
    o.compute_seconds = t3 - t2;
    /* combine: each received pair's FP32 result back to its home rank, in the order the pairs arrived */
    const ep_plan *p = &s.p;
    const int64_t H = p->H;
    for (int64_t i = 0; i < p->nrpair; i++) {
        float *dst = s.csend + i * H;
        if (local) memset(dst, 0, sizeof(float) * (size_t)H);
        else memcpy(dst, s.yloc + (int64_t)p->perm[i] * H, sizeof(float) * (size_t)H);
    }
    st = ep_alltoallv(fn, comm, s.csend, p->rpair_cnt, p->rpair_dsp, s.crecv, p->spair_cnt, p->spair_dsp,
                      4 * H, &o.combine_bytes_sent, &o.combine_bytes_received);
    if (st) goto out;
    if ((st = ep_agree(comm, fn, local, NULL))) goto out;
    ep_fold(p, s.crecv, p->H, output, 0); /* in ascending expert order, from +0, rounded once */
    o.rows_sent = p->nsrow;
    o.rows_received = p->nrrow;
    o.local_pairs = p->nloc;
    o.local_blocks = p->Nloc;
    if (context) {
        mxfp8_mpi_moe_context *c = s.ctx;
        fill_context(&s, comm, args); /* moves the plan, rows and checkpoints into c */
        *context = c;
    }
    o.combine_seconds = ep_now() - t3;
    if (stats) *stats = o;
out:
    fwd_free(&s);
    return st;
}
