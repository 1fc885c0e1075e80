/*
 * ep_backward.c -- mxfp8_mpi_moe_backward and the context: validate (locally, then one agreement; every buffer is
 * sized by the forward's plan, so all allocation happens before it), dispatch dY rows with the forward's counts,
 * run mxfp8_moe_backward on the local pair-rows (weight gradients into scratch copies), combine each pair's FP32 dX
 * row and affinity gradient, agree, then sum dX per token in ascending expert order and write every gradient.
 */
#include <stdlib.h>
#include <string.h>

#include "ep_internal.h"

void mxfp8_mpi_moe_bwd_args_init(mxfp8_mpi_moe_bwd_args *args) {
    if (args) memset(args, 0, sizeof *args);
}

void mxfp8_mpi_moe_context_free(mxfp8_mpi_moe_context *c) {
    if (!c) return;
    ep_plan_free(&c->plan);
    free(c->rows);
    free(c->ck_gu);
    free(c->ck_down);
    free(c);
}

int64_t mxfp8_mpi_moe_context_bytes(const mxfp8_mpi_moe_context *c) {
    if (!c) return 0;
    const ep_plan *p = &c->plan;
    int64_t n = (int64_t)sizeof *c + ep_plan_bytes(p) + p->nrrow * c->rowbytes;
    if (c->ck_gu) n += 4 * p->Nloc * p->B * 2 * c->I;
    if (c->ck_down) n += 4 * p->Nloc * p->B * p->H;
    return n;
}

typedef struct bwd {
    mxfp8_moe_config cfg;
    mxfp8_dtype ydt, ldx, ldy;
    int64_t rby;
    void *sbuf, *tmpq, *rbuf, *xloc, *tmpx, *yloc, *tmpy;
    float *aloc, *dx, *dea, *csend, *crecv;
    void *dw1, *dw2, *db1, *db2; /* scratch weight / bias gradients in the grads' dtypes */
} bwd;

static void bwd_free(bwd *s) {
    free(s->sbuf); free(s->tmpq); free(s->rbuf); free(s->xloc); free(s->tmpx); free(s->yloc); free(s->tmpy);
    free(s->aloc); free(s->dx); free(s->dea); free(s->csend); free(s->crecv);
    free(s->dw1); free(s->dw2); free(s->db1); free(s->db2);
}

static void *nz(void *q) { return q ? q : ep_dummy(); }

/* The gradient views: shapes, dtypes, distinct elements, no overlap with an input or another gradient. */
static mxfp8_status check_grads(const char *fn, const mxfp8_mpi_moe_context *c, const mxfp8_mpi_moe_bwd_args *A,
                                const mxfp8_mpi_moe_bwd_grads *g) {
    const ep_plan *p = &c->plan;
    const int64_t T = p->T, H = p->H, I = c->I, Er = p->E_r, K = p->K;
    const int64_t sx[2] = {T, H}, sk[2] = {T, K}, s1[4] = {Er, H, 2, I}, s2[3] = {Er, I, H}, sb1[3] = {Er, 2, I},
                  sb2[2] = {Er, H};
    mxfp8_status st;
    if ((st = ep_check_view(fn, "hidden_states_grad", &g->hidden_states_grad, 2, sx, EP_FLOATS, 1))) return st;
    if (ep_given(&g->topk_weights_grad)) {
        if (K < 1)
            return ep_fail(MXFP8_ERR_INVALID_ARGUMENT, "%s: topk_weights_grad is given but the forward was routed by "
                           "expert_affinities_masked", fn);
        if ((st = ep_check_view(fn, "topk_weights_grad", &g->topk_weights_grad, 2, sk, EP_FLOATS, 1))) return st;
    }
    if (ep_given(&g->expert_affinities_masked_grad) &&
        (st = ep_check_vec(fn, "expert_affinities_masked_grad", &g->expert_affinities_masked_grad, T * p->E, 1)))
        return st;
    if ((st = ep_check_view(fn, "gate_up_proj_weight_grad", &g->gate_up_proj_weight_grad, 4, s1, EP_FLOATS, 1)))
        return st;
    if ((st = ep_check_view(fn, "down_proj_weight_grad", &g->down_proj_weight_grad, 3, s2, EP_FLOATS, 1))) return st;
    if (c->cfg.bias) {
        if ((st = ep_check_view(fn, "gate_and_up_proj_bias_grad", &g->gate_and_up_proj_bias_grad, 3, sb1, EP_FLOATS,
                                1)))
            return st;
        if ((st = ep_check_view(fn, "down_proj_bias_grad", &g->down_proj_bias_grad, 2, sb2, EP_FLOATS, 1))) return st;
    } else if (ep_given(&g->gate_and_up_proj_bias_grad) || ep_given(&g->down_proj_bias_grad)) {
        return ep_fail(MXFP8_ERR_INVALID_ARGUMENT, "%s: a bias gradient is given but config.bias is 0", fn);
    }
    /* Distinct elements and overlaps of the views the local layer does not see: dY, hidden_states_grad and the
       affinity gradients (the local backward writes scratch buffers there). The weight and bias gradients, which it
       is given, are checked by libmxfp8 against the weights, biases, scales, checkpoints and each other
       (check_local). */
    const mxfp8_tensor *own[3] = {&g->hidden_states_grad, &g->topk_weights_grad, &g->expert_affinities_masked_grad};
    static const char *own_nm[3] = {"hidden_states_grad", "topk_weights_grad", "expert_affinities_masked_grad"};
    const mxfp8_tensor *all[11] = {&A->output_hidden_states_grad, &A->gate_up_proj_weight, &A->down_proj_weight,
                                   &A->gate_and_up_proj_bias, &A->down_proj_bias, &A->gate_up_weight_scales,
                                   &A->down_weight_scales, &g->gate_up_proj_weight_grad, &g->down_proj_weight_grad,
                                   &g->gate_and_up_proj_bias_grad, &g->down_proj_bias_grad};
    static const char *all_nm[11] = {"output_hidden_states_grad", "gate_up_proj_weight", "down_proj_weight",
                                     "gate_and_up_proj_bias", "down_proj_bias", "gate_up_weight_scales",
                                     "down_weight_scales", "gate_up_proj_weight_grad", "down_proj_weight_grad",
                                     "gate_and_up_proj_bias_grad", "down_proj_bias_grad"};
    for (int i = 0; i < 3; i++) {
        if (!ep_present(own[i])) continue;
        if ((st = ep_check_distinct(fn, own_nm[i], own[i]))) return st;
        for (int j = 0; j < 11; j++)
            if ((st = ep_check_overlap(fn, own_nm[i], own[i], all_nm[j], all[j]))) return st;
        for (int j = 0; j < i; j++)
            if ((st = ep_check_overlap(fn, own_nm[i], own[i], own_nm[j], own[j]))) return st;
    }
    const mxfp8_tensor *wg[4] = {&g->gate_up_proj_weight_grad, &g->down_proj_weight_grad,
                                 &g->gate_and_up_proj_bias_grad, &g->down_proj_bias_grad};
    for (int i = 0; i < 4; i++) /* the weight and bias gradients against dY */
        if ((st = ep_check_overlap(fn, all_nm[7 + i], wg[i], all_nm[0], all[0]))) return st;
    return MXFP8_OK;
}

/* Everything the call needs, sized from the forward's plan (before the agreement). */
static mxfp8_status bwd_alloc(const char *fn, const mxfp8_mpi_moe_context *c, const mxfp8_mpi_moe_bwd_grads *g,
                              bwd *s) {
    const ep_plan *p = &c->plan;
    const int64_t H = p->H, G = (H + 31) / 32, mx = c->wire == MXFP8_MPI_WIRE_MXFP8;
    int ok = 1;
    s->rby = ep_row_bytes(c->wire, s->ydt, H);
    s->ldx = ep_local_dtype(c->wire, c->xdt);
    s->ldy = ep_local_dtype(c->wire, s->ydt);
    s->sbuf = ep_alloc(p->nsrow, s->rby, &ok);
    s->tmpq = mx ? ep_alloc(p->T, H + G, &ok) : NULL;
    s->rbuf = ep_alloc(p->nrrow, s->rby, &ok);
    s->xloc = ep_alloc(p->nloc * H, (int64_t)mxfp8_dtype_size(s->ldx), &ok);
    s->yloc = ep_alloc(p->nloc * H, (int64_t)mxfp8_dtype_size(s->ldy), &ok);
    s->tmpx = mx ? ep_alloc(p->nloc, H + G, &ok) : NULL;
    s->tmpy = mx ? ep_alloc(p->nloc, H + G, &ok) : NULL;
    s->aloc = ep_alloc(p->nloc * p->E_r, sizeof(float), &ok);
    s->dx = ep_alloc(p->nloc * H, sizeof(float), &ok);
    s->dea = ep_alloc(p->nloc * p->E_r, sizeof(float), &ok);
    s->csend = ep_alloc(p->nrpair * (H + 1), sizeof(float), &ok);
    s->crecv = ep_alloc(p->nspair * (H + 1), sizeof(float), &ok);
    const mxfp8_tensor *w[4] = {&g->gate_up_proj_weight_grad, &g->down_proj_weight_grad,
                                &g->gate_and_up_proj_bias_grad, &g->down_proj_bias_grad};
    void **dst[4] = {&s->dw1, &s->dw2, &s->db1, &s->db2};
    for (int i = 0; i < 4; i++)
        if (ep_present(w[i]) || i < 2)
            *dst[i] = ep_alloc(mxfp8_tensor_numel(w[i]), (int64_t)mxfp8_dtype_size(w[i]->dtype), &ok);
    return ok ? MXFP8_OK : ep_fail(MXFP8_ERR_OUT_OF_MEMORY, "%s: cannot allocate the exchange, local and gradient "
                                   "buffers", fn);
}

/* Scratch views of the weight / bias gradients (the grads' shapes and dtypes, contiguous). */
static void scratch_grads(const mxfp8_mpi_moe_bwd_grads *g, const bwd *s, mxfp8_moe_bwd_grads *d) {
    memset(d, 0, sizeof *d);
    d->gate_up_proj_weight_grad = ep_like(&g->gate_up_proj_weight_grad, s->dw1);
    d->down_proj_weight_grad = ep_like(&g->down_proj_weight_grad, s->dw2);
    if (s->db1) d->gate_and_up_proj_bias_grad = ep_like(&g->gate_and_up_proj_bias_grad, s->db1);
    if (s->db2) d->down_proj_bias_grad = ep_like(&g->down_proj_bias_grad, s->db2);
}

static mxfp8_status check_local(const char *fn, const mxfp8_mpi_moe_bwd_args *A, const mxfp8_mpi_moe_bwd_grads *g,
                                const bwd *s);

static mxfp8_status bwd_validate(const char *fn, const mxfp8_mpi_moe_bwd_args *A, const mxfp8_mpi_moe_bwd_grads *g,
                                 bwd *s, int P, int64_t *values) {
    const mxfp8_mpi_moe_context *c = A->context;
    const ep_plan *p = &c->plan;
    mxfp8_status st;
    if (!g) return ep_fail(MXFP8_ERR_NULL_POINTER, "%s: grads is NULL", fn);
    if ((st = ep_refuse_rounding(fn, &c->cfg))) return st; /* the forward refuses it already */
    if (p->P != P)
        return ep_fail(MXFP8_ERR_INVALID_ARGUMENT, "%s: the context comes from a forward on %d ranks, not %d", fn,
                       p->P, P);
    const int64_t sy[2] = {p->T, p->H};
    if ((st = ep_check_view(fn, "output_hidden_states_grad", &A->output_hidden_states_grad, 2, sy, EP_FLOATS, 1)))
        return st;
    s->ydt = A->output_hidden_states_grad.dtype;
    /* the forward's weights: the rank's experts, the context's H and I (libmxfp8 checks the rest) */
    const unsigned wdt = EP_FLOATS | (1u << MXFP8_DTYPE_E4M3) | (1u << MXFP8_DTYPE_E5M2) | (1u << MXFP8_DTYPE_U8);
    const int64_t s1[4] = {p->E_r, p->H, 2, c->I}, s2[3] = {p->E_r, c->I, p->H};
    if ((st = ep_check_expert_count(fn, p, "gate_up_proj_weight", &A->gate_up_proj_weight)) ||
        (st = ep_check_expert_count(fn, p, "down_proj_weight", &A->down_proj_weight)))
        return st;
    if ((st = ep_check_view(fn, "gate_up_proj_weight", &A->gate_up_proj_weight, 4, s1, wdt, 1))) return st;
    if ((st = ep_check_view(fn, "down_proj_weight", &A->down_proj_weight, 3, s2, wdt, 1))) return st;
    if ((st = check_grads(fn, c, A, g))) return st;
    if ((st = bwd_alloc(fn, c, g, s))) return st;
    if ((st = check_local(fn, A, g, s))) return st;
    values[EP_V_H] = p->H; values[EP_V_I] = c->I; values[EP_V_E] = p->E; values[EP_V_K] = p->K;
    values[EP_V_DYDTYPE] = s->ydt;
    return MXFP8_OK;
}

/* The args of the rank's local mxfp8_moe_backward: the forward's pair-rows, blocks and checkpoints, the dispatched
 * dY, the caller's weights, biases and scales, and the scratch gradients (weight and bias gradients in the grads'
 * shapes and dtypes). */
static void local_args(const mxfp8_mpi_moe_bwd_args *A, const mxfp8_mpi_moe_bwd_grads *g, const bwd *s,
                       mxfp8_moe_config *cfg, mxfp8_moe_bwd_args *a, mxfp8_moe_bwd_grads *d) {
    const mxfp8_mpi_moe_context *c = A->context;
    const ep_plan *p = &c->plan;
    *cfg = c->cfg;
    cfg->accumulate_hidden_states_grad = 0; /* the home rank adds the given buffer once, after the sum */
    mxfp8_moe_bwd_args_init(a);
    const int64_t sx[2] = {p->nloc, p->H}, sa[2] = {p->nloc * p->E_r, 1}, NB = p->Nloc * p->B, N = p->Nloc;
    a->hidden_states = mxfp8_tensor_make(nz(s->xloc), s->ldx, 2, sx);
    a->output_hidden_states_grad = mxfp8_tensor_make(nz(s->yloc), s->ldy, 2, sx);
    a->expert_affinities_masked = mxfp8_tensor_make(nz(s->aloc), MXFP8_DTYPE_F32, 2, sa);
    a->gate_up_proj_weight = A->gate_up_proj_weight;
    a->down_proj_weight = A->down_proj_weight;
    a->token_position_to_id = mxfp8_tensor_make(nz(p->tok_pos), MXFP8_DTYPE_I32, 1, &NB);
    a->block_to_expert = mxfp8_tensor_make(nz(p->blk_exp), MXFP8_DTYPE_I32, 1, &N);
    a->block_size = p->B;
    a->gate_and_up_proj_bias = A->gate_and_up_proj_bias;
    a->down_proj_bias = A->down_proj_bias;
    a->gate_up_weight_scales = A->gate_up_weight_scales;
    a->down_weight_scales = A->down_weight_scales;
    a->config = cfg;
    if (c->ck_gu) {
        const int64_t sg[4] = {N, 2, c->I, p->B};
        a->gate_up_proj_act_checkpoint_T = mxfp8_tensor_make(c->ck_gu, MXFP8_DTYPE_F32, 4, sg);
    }
    if (c->ck_down) {
        const int64_t sd[3] = {N, p->B, p->H};
        a->down_proj_output_checkpoint = mxfp8_tensor_make(c->ck_down, MXFP8_DTYPE_F32, 3, sd);
    }
    scratch_grads(g, s, d);
    d->hidden_states_grad = mxfp8_tensor_make(nz(s->dx), MXFP8_DTYPE_F32, 2, sx);
    d->expert_affinities_masked_grad = mxfp8_tensor_make(nz(s->dea), MXFP8_DTYPE_F32, 2, sa);
}

/* libmxfp8's own checks of the rank's local backward (mxfp8_moe_backward_validate) on the local problem itself (the
 * forward's blocks and checkpoints; the buffers allocated, not yet filled: the checks read only the routing), with
 * the caller's weight and bias gradients in place of their scratch copies, so that their shapes, dtypes, distinct
 * elements and overlaps with the weights, biases, scales and checkpoints are checked as the single-process call
 * checks them. Nothing is written. */
static mxfp8_status check_local(const char *fn, const mxfp8_mpi_moe_bwd_args *A, const mxfp8_mpi_moe_bwd_grads *g,
                                const bwd *s) {
    mxfp8_moe_config cfg;
    mxfp8_moe_bwd_args a;
    mxfp8_moe_bwd_grads d;
    local_args(A, g, s, &cfg, &a, &d);
    d.gate_up_proj_weight_grad = g->gate_up_proj_weight_grad;
    d.down_proj_weight_grad = g->down_proj_weight_grad;
    if (s->db1) d.gate_and_up_proj_bias_grad = g->gate_and_up_proj_bias_grad;
    if (s->db2) d.down_proj_bias_grad = g->down_proj_bias_grad;
    mxfp8_status st = mxfp8_moe_backward_validate(&a, &d, NULL);
    return st ? ep_local_fail(fn, &A->context->plan, st) : MXFP8_OK;
}

/* The local backward on the pair-rows (after the dispatch). */
static mxfp8_status bwd_local(const char *fn, const mxfp8_mpi_moe_bwd_args *A, const mxfp8_mpi_moe_bwd_grads *g,
                              bwd *s) {
    const mxfp8_mpi_moe_context *c = A->context;
    const ep_plan *p = &c->plan;
    mxfp8_status st = ep_unpack_pairs(fn, p, c->rows, c->wire, c->xdt, c->cfg.quant_dtype, s->xloc, s->tmpx);
    if (!st) st = ep_unpack_pairs(fn, p, s->rbuf, c->wire, s->ydt, c->cfg.quant_dtype, s->yloc, s->tmpy);
    if (st) return st;
    ep_local_affinities(p, s->aloc);
    mxfp8_moe_config cfg;
    mxfp8_moe_bwd_args a;
    mxfp8_moe_bwd_grads d;
    local_args(A, g, s, &cfg, &a, &d);
    if (cfg.skip_grad_initialization) { /* the kernel adds into the given values: start the scratch from them */
        ep_gather(&g->gate_up_proj_weight_grad, s->dw1);
        ep_gather(&g->down_proj_weight_grad, s->dw2);
        if (s->db1) ep_gather(&g->gate_and_up_proj_bias_grad, s->db1);
        if (s->db2) ep_gather(&g->down_proj_bias_grad, s->db2);
    }
    st = mxfp8_moe_backward(&a, &d);
    return st ? ep_local_fail(fn, p, st) : MXFP8_OK;
}

/* The home rank's stores: dX = sum over the token's pairs in ascending expert order of the FP32 rows, from +0
 * (+ the given value once with accumulate_hidden_states_grad), rounded once; the affinity gradients. */
static void bwd_store(const mxfp8_mpi_moe_context *c, const float *recv, const mxfp8_mpi_moe_bwd_grads *g) {
    const ep_plan *p = &c->plan;
    const int64_t T = p->T, H = p->H, W = H + 1;
    const mxfp8_tensor *o = &g->hidden_states_grad;
    const int acc_given = c->cfg.accumulate_hidden_states_grad;
    ep_fold(p, recv, W, o, acc_given);
    const mxfp8_tensor *ea = &g->expert_affinities_masked_grad, *tk = &g->topk_weights_grad;
    if (ep_present(ea))
        for (int64_t i = 0; i < T * p->E; i++) ep_store(ea, ep_vec_off(ea, i), 0.0f);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = p->tok_off[t]; j < p->tok_off[t + 1]; j++) {
            const float v = recv[(int64_t)p->tok_pair[j] * W + H];
            if (ep_present(ea)) ep_store(ea, ep_vec_off(ea, t * p->E + p->tok_exp[j]), v);
            if (ep_present(tk)) ep_store(tk, t * tk->strides[0] + p->tok_slot[j] * tk->strides[1], v);
        }
}

mxfp8_status mxfp8_mpi_moe_backward(const mxfp8_mpi_moe_bwd_args *args, mxfp8_mpi_moe_bwd_grads *grads,
                                    mxfp8_mpi_moe_stats *stats) {
    static const char *fn = "mxfp8_mpi_moe_backward";
    ep_clear();
    if (!args) return ep_fail(MXFP8_ERR_NULL_POINTER, "%s: args is NULL", fn);
    if (!args->context) return ep_fail(MXFP8_ERR_NULL_POINTER, "%s: args->context is NULL", fn);
    const mxfp8_mpi_moe_context *c = args->context;
    int rank = 0, P = 1;
    mxfp8_status st = ep_comm_usable(fn, c->comm, &rank, &P);
    if (st) return st;
    const MPI_Comm comm = c->comm;
    const ep_plan *p = &c->plan;
    mxfp8_mpi_moe_stats o;
    memset(&o, 0, sizeof o);
    bwd s;
    memset(&s, 0, sizeof s);
    s.cfg = c->cfg;
    const double t0 = ep_now();
    int64_t values[EP_NV];
    for (int i = 0; i < EP_NV; i++) values[i] = EP_UNSET;
    st = bwd_validate(fn, args, grads, &s, P, values);
    if ((st = ep_agree(comm, fn, st, values))) goto out; /* the one agreement before any exchange */
    const double t1 = ep_now();
    o.setup_seconds = t1 - t0;
    /* dispatch dY with the forward's counts */
    mxfp8_status local = ep_pack_rows(fn, p, &args->output_hidden_states_grad, c->wire, c->cfg.quant_dtype,
                                      c->cfg.scale_rule, s.sbuf, s.tmpq);
    if (local) memset(s.sbuf, 0, (size_t)(p->nsrow * s.rby));
    if ((st = ep_alltoallv(fn, comm, s.sbuf, p->srow_cnt, p->srow_dsp, s.rbuf, p->rrow_cnt, p->rrow_dsp, s.rby,
                           &o.dispatch_bytes_sent, &o.dispatch_bytes_received)))
        goto out;
    const double t2 = ep_now();
    o.dispatch_seconds = t2 - t1;
    if (!local) local = bwd_local(fn, args, grads, &s);
    const double t3 = ep_now();
    o.compute_seconds = t3 - t2;
    /* combine: each received pair's FP32 dX row and affinity gradient back home, in the order the pairs arrived */
    const int64_t H = p->H, W = H + 1;
    for (int64_t i = 0; i < p->nrpair; i++) {
        float *dst = s.csend + i * W;
        const int64_t j = p->perm[i];
        if (local) {
            memset(dst, 0, sizeof(float) * (size_t)W);
            continue;
        }
        memcpy(dst, s.dx + j * H, sizeof(float) * (size_t)H);
        dst[H] = s.dea[j * p->E_r + p->lexp[j]];
    }
    if ((st = ep_alltoallv(fn, comm, s.csend, p->rpair_cnt, p->rpair_dsp, s.crecv, p->spair_cnt, p->spair_dsp, 4 * W,
                           &o.combine_bytes_sent, &o.combine_bytes_received)))
        goto out;
    if ((st = ep_agree(comm, fn, local, NULL))) goto out;
    bwd_store(c, s.crecv, grads);
    ep_scatter(&grads->gate_up_proj_weight_grad, s.dw1);
    ep_scatter(&grads->down_proj_weight_grad, s.dw2);
    if (s.db1) ep_scatter(&grads->gate_and_up_proj_bias_grad, s.db1);
    if (s.db2) ep_scatter(&grads->down_proj_bias_grad, s.db2);
    o.rows_sent = p->nsrow;
    o.rows_received = p->nrrow;
    o.local_pairs = p->nloc;
    o.local_blocks = p->Nloc;
    o.combine_seconds = ep_now() - t3;
    if (stats) *stats = o;
out:
    bwd_free(&s);
    return st;
}
