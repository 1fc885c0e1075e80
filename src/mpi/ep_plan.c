/*
 * ep_plan.c -- the routing plan of one expert-parallel layer on this rank (see ep_internal.h for its parts):
 * which token rows go to which rank, how the (token, expert) results come back and fold, and the local problem the
 * rank's experts compute, with blocks laid out as mxfp8_moe_route lays them out (expert-major, tokens ascending,
 * ceil(count / B) blocks per expert) so that each block holds exactly the rows of the gathered problem's block.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "ep_internal.h"

static int64_t first_of(const ep_plan *p, int q) {
    const int64_t qq = p->E / p->P, r = p->E % p->P;
    return q * qq + (q < r ? q : r);
}

/* The pairs of token t in ascending expert order: experts e[], weights w[], topk slots k[] (-1 for affinities).
 * Returns the count, or -1 with the error set (st). */
static int64_t token_pairs(const char *fn, const ep_plan *p, int64_t t, const mxfp8_tensor *ids,
                           const mxfp8_tensor *wts, const mxfp8_tensor *aff, int32_t *e, float *w, int32_t *k,
                           mxfp8_status *st) {
    int64_t n = 0;
    if (ids) {
        for (int64_t j = 0; j < p->K; j++) {
            const int32_t id = ((const int32_t *)ids->data)[t * ids->strides[0] + j * ids->strides[1]];
            if (id < 0 || id >= p->E) {
                *st = ep_fail(MXFP8_ERR_INDEX_OUT_OF_RANGE, "%s: topk_ids[%lld, %lld] = %d is outside [0, %lld)", fn,
                              (long long)t, (long long)j, (int)id, (long long)p->E);
                return -1;
            }
            const float wv = ep_load(wts, t * wts->strides[0] + j * wts->strides[1]);
            int64_t i = n++;
            for (; i > 0 && e[i - 1] > id; i--) { /* insertion sort by expert */
                e[i] = e[i - 1]; w[i] = w[i - 1]; k[i] = k[i - 1];
            }
            if (i > 0 && e[i - 1] == id) {
                *st = ep_fail(MXFP8_ERR_INVALID_ARGUMENT, "%s: topk_ids row %lld names expert %d twice", fn,
                              (long long)t, (int)id);
                return -1;
            }
            e[i] = id; w[i] = wv; k[i] = (int32_t)j;
        }
    } else {
        for (int64_t x = 0; x < p->E; x++) {
            const float a = ep_load(aff, ep_vec_off(aff, t * p->E + x));
            if (a != 0.0f || a != a) {
                e[n] = (int32_t)x; w[n] = a; k[n] = -1;
                n++;
            }
        }
    }
    return n;
}

static void *xcalloc(int64_t n, size_t size, int *ok) {
    void *q = calloc((size_t)(n > 0 ? n : 1), size);
    if (!q) *ok = 0;
    return q;
}

mxfp8_status ep_plan_home(const char *fn, ep_plan *p, const mxfp8_tensor *ids, const mxfp8_tensor *wts,
                          const mxfp8_tensor *aff) {
    const int P = p->P;
    const int64_t T = p->T, maxp = ids ? p->K : p->E;
    int ok = 1;
    mxfp8_status st = MXFP8_OK;
    p->srow_cnt = xcalloc(P, sizeof(int), &ok);
    p->srow_dsp = xcalloc(P, sizeof(int), &ok);
    p->spair_cnt = xcalloc(P, sizeof(int), &ok);
    p->spair_dsp = xcalloc(P, sizeof(int), &ok);
    p->tok_off = xcalloc(T + 1, sizeof(int64_t), &ok);
    p->rrow_cnt = xcalloc(P, sizeof(int), &ok);
    p->rrow_dsp = xcalloc(P, sizeof(int), &ok);
    p->rpair_cnt = xcalloc(P, sizeof(int), &ok);
    p->rpair_dsp = xcalloc(P, sizeof(int), &ok);
    p->cstride = 2 + (int)((p->E + P - 1) / P); /* rows, pairs, pairs per expert of the destination */
    p->cnt_send = xcalloc((int64_t)P * p->cstride, sizeof(int), &ok);
    p->cnt_recv = xcalloc((int64_t)P * p->cstride, sizeof(int), &ok);
    p->lcnt = xcalloc(p->E_r, sizeof(int64_t), &ok);
    int32_t *e = xcalloc(maxp, sizeof(int32_t), &ok), *k = xcalloc(maxp, sizeof(int32_t), &ok);
    float *w = xcalloc(maxp, sizeof(float), &ok);
    int64_t *rows = xcalloc(P, sizeof(int64_t), &ok), *pairs = xcalloc(P, sizeof(int64_t), &ok);
    int64_t *rcur = xcalloc(P, sizeof(int64_t), &ok), *pcur = xcalloc(P, sizeof(int64_t), &ok);
    if (!ok) {
        st = ep_fail(MXFP8_ERR_OUT_OF_MEMORY, "%s: cannot allocate the routing plan", fn);
        goto done;
    }
    /* pass 1: counts per destination and the token-major offsets */
    for (int64_t t = 0; t < T; t++) {
        const int64_t n = token_pairs(fn, p, t, ids, wts, aff, e, w, k, &st);
        if (n < 0) goto done;
        int prev = -1;
        for (int64_t i = 0; i < n; i++) {
            const int q = ep_owner(p->E, P, e[i]);
            if (q != prev) rows[q]++;
            pairs[q]++;
            prev = q;
            if (pairs[q] <= INT_MAX) p->cnt_send[(int64_t)q * p->cstride + 2 + (e[i] - first_of(p, q))]++;
        }
        p->tok_off[t + 1] = p->tok_off[t] + n;
    }
    int64_t nr = 0, np = 0;
    for (int q = 0; q < P; q++) {
        if (rows[q] > INT_MAX || pairs[q] > INT_MAX || nr > INT_MAX - rows[q] || np > INT_MAX - pairs[q]) {
            st = ep_fail(MXFP8_ERR_SIZE_OVERFLOW, "%s: more than %d rows or pairs to send in one exchange", fn,
                         INT_MAX);
            goto done;
        }
        p->srow_cnt[q] = (int)rows[q];
        p->spair_cnt[q] = (int)pairs[q];
        p->srow_dsp[q] = (int)nr;
        p->spair_dsp[q] = (int)np;
        nr += rows[q];
        np += pairs[q];
    }
    p->nsrow = nr;
    p->nspair = np;
    p->srow_tok = xcalloc(nr, sizeof(int32_t), &ok);
    p->spair = xcalloc(np, sizeof(ep_pair), &ok);
    p->tok_pair = xcalloc(np, sizeof(int32_t), &ok);
    p->tok_slot = xcalloc(np, sizeof(int32_t), &ok);
    p->tok_exp = xcalloc(np, sizeof(int32_t), &ok);
    if (!ok) {
        st = ep_fail(MXFP8_ERR_OUT_OF_MEMORY, "%s: cannot allocate the routing plan", fn);
        goto done;
    }
    /* pass 2: rows grouped by destination (tokens ascending), pairs likewise, and the fold order */
    for (int64_t t = 0; t < T; t++) {
        const int64_t n = token_pairs(fn, p, t, ids, wts, aff, e, w, k, &st);
        int prev = -1;
        int64_t row = 0;
        for (int64_t i = 0; i < n; i++) {
            const int q = ep_owner(p->E, P, e[i]);
            if (q != prev) {
                row = rcur[q]++;
                p->srow_tok[p->srow_dsp[q] + row] = (int32_t)t;
            }
            prev = q;
            const int64_t pos = p->spair_dsp[q] + pcur[q]++;
            p->spair[pos].row = (int32_t)row;
            p->spair[pos].expert = (int32_t)(e[i] - first_of(p, q));
            p->spair[pos].weight = w[i];
            const int64_t j = p->tok_off[t] + i;
            p->tok_pair[j] = (int32_t)pos;
            p->tok_slot[j] = k[i];
            p->tok_exp[j] = e[i];
        }
    }
done:
    free(e); free(k); free(w); free(rows); free(pairs); free(rcur); free(pcur);
    return st;
}

mxfp8_status ep_plan_counts(const char *fn, MPI_Comm comm, ep_plan *p, int64_t *bytes_sent, int64_t *bytes_recv) {
    const int P = p->P, cs = p->cstride;
    int *sc = p->cnt_send, *rc = p->cnt_recv; /* allocated by ep_plan_home, before the agreement */
    for (int q = 0; q < P; q++) {
        sc[(int64_t)q * cs] = p->srow_cnt[q];
        sc[(int64_t)q * cs + 1] = p->spair_cnt[q];
    }
    const int mrc = MPI_Alltoall(sc, cs, MPI_INT, rc, cs, MPI_INT, comm);
    if (mrc != MPI_SUCCESS) return ep_mpi_fail(fn, "MPI_Alltoall (counts)", mrc);
    *bytes_sent += (int64_t)(P - 1) * cs * (int64_t)sizeof(int);
    *bytes_recv += (int64_t)(P - 1) * cs * (int64_t)sizeof(int);
    int64_t nr = 0, np = 0;
    for (int64_t e = 0; e < p->E_r; e++) p->lcnt[e] = 0;
    for (int q = 0; q < P; q++) {
        const int *c = rc + (int64_t)q * cs;
        p->rrow_cnt[q] = c[0];
        p->rpair_cnt[q] = c[1];
        p->rrow_dsp[q] = (int)(nr <= INT_MAX ? nr : 0);
        p->rpair_dsp[q] = (int)(np <= INT_MAX ? np : 0);
        nr += c[0];
        np += c[1];
        for (int64_t e = 0; e < p->E_r; e++) p->lcnt[e] += c[2 + e];
    }
    p->nrrow = nr;
    p->nrpair = np;
    p->nloc = np;
    p->Nloc = 0;
    for (int64_t e = 0; e < p->E_r; e++) p->Nloc += (p->lcnt[e] + p->B - 1) / p->B;
    if (nr > INT_MAX || np > INT_MAX)
        return ep_fail(MXFP8_ERR_SIZE_OVERFLOW, "%s: more than %d rows or pairs to receive in one exchange", fn,
                       INT_MAX);
    int64_t nb;
    if (__builtin_mul_overflow(p->Nloc, p->B, &nb) || nb > INT64_MAX / 64)
        return ep_fail(MXFP8_ERR_SIZE_OVERFLOW, "%s: the local problem's %lld blocks of %lld positions overflow", fn,
                       (long long)p->Nloc, (long long)p->B);
    return MXFP8_OK;
}

mxfp8_status ep_plan_alloc_recv(const char *fn, ep_plan *p) {
    int ok = 1;
    p->rpair = xcalloc(p->nrpair, sizeof(ep_pair), &ok);
    p->perm = xcalloc(p->nrpair, sizeof(int32_t), &ok);
    p->lrow = xcalloc(p->nloc, sizeof(int32_t), &ok);
    p->lexp = xcalloc(p->nloc, sizeof(int32_t), &ok);
    p->la = xcalloc(p->nloc, sizeof(float), &ok);
    p->tok_pos = xcalloc(p->Nloc * p->B, sizeof(int32_t), &ok);
    p->blk_exp = xcalloc(p->Nloc, sizeof(int32_t), &ok);
    return ok ? MXFP8_OK : ep_fail(MXFP8_ERR_OUT_OF_MEMORY, "%s: cannot allocate the receive side of the plan", fn);
}

mxfp8_status ep_plan_local(const char *fn, ep_plan *p, int skip_token) {
    /* rows of received pairs become indices into all received rows; check what arrived against the counts */
    int64_t *cur = calloc((size_t)(p->E_r > 0 ? p->E_r : 1), sizeof(int64_t));
    if (!cur) return ep_fail(MXFP8_ERR_OUT_OF_MEMORY, "%s: cannot allocate the local routing", fn);
    for (int q = 0; q < p->P; q++)
        for (int64_t i = p->rpair_dsp[q]; i < (int64_t)p->rpair_dsp[q] + p->rpair_cnt[q]; i++) {
            ep_pair *x = &p->rpair[i];
            if (x->row < 0 || x->row >= p->rrow_cnt[q] || x->expert < 0 || x->expert >= p->E_r) {
                free(cur);
                return ep_fail(MXFP8_ERR_INTERNAL, "%s: rank %d sent a pair naming row %d, expert %d (of %d rows, "
                               "%lld experts)", fn, q, (int)x->row, (int)x->expert, p->rrow_cnt[q], (long long)p->E_r);
            }
            x->row += p->rrow_dsp[q];
            cur[x->expert]++;
        }
    for (int64_t e = 0; e < p->E_r; e++)
        if (cur[e] != p->lcnt[e]) {
            const long long got = (long long)cur[e];
            free(cur);
            return ep_fail(MXFP8_ERR_INTERNAL, "%s: expert %lld received %lld pairs, %lld announced", fn,
                           (long long)(p->e0 + e), got, (long long)p->lcnt[e]);
        }
    /* stable placement by local expert: pair-rows ordered (expert, source rank, source token) */
    for (int64_t e = 0, off = 0; e < p->E_r; e++) {
        cur[e] = off;
        off += p->lcnt[e];
    }
    for (int64_t i = 0; i < p->nrpair; i++) {
        const ep_pair *x = &p->rpair[i];
        const int64_t j = cur[x->expert]++;
        p->perm[i] = (int32_t)j;
        p->lrow[j] = x->row;
        p->lexp[j] = x->expert;
        p->la[j] = x->weight;
    }
    /* blocks: expert e's pair-rows in ceil(count / B) blocks, the last one padded */
    const int32_t pad = skip_token ? -1 : (int32_t)p->nloc;
    int64_t n = 0, j = 0;
    for (int64_t e = 0; e < p->E_r; e++) {
        const int64_t end = j + p->lcnt[e];
        for (; j < end; n++) {
            p->blk_exp[n] = (int32_t)e;
            for (int64_t q = 0; q < p->B; q++) p->tok_pos[n * p->B + q] = j < end ? (int32_t)j++ : pad;
        }
    }
    free(cur);
    return MXFP8_OK;
}

void ep_plan_free(ep_plan *p) {
    if (!p) return;
    free(p->srow_cnt); free(p->srow_dsp); free(p->spair_cnt); free(p->spair_dsp); free(p->srow_tok);
    free(p->spair); free(p->tok_off); free(p->tok_pair); free(p->tok_slot); free(p->tok_exp);
    free(p->rrow_cnt); free(p->rrow_dsp); free(p->rpair_cnt); free(p->rpair_dsp); free(p->cnt_send);
    free(p->cnt_recv); free(p->lcnt); free(p->rpair); free(p->perm); free(p->lrow); free(p->lexp); free(p->la);
    free(p->tok_pos); free(p->blk_exp);
    memset(p, 0, sizeof *p);
}

int64_t ep_plan_bytes(const ep_plan *p) {
    return (int64_t)sizeof *p + 4 * 8 * (int64_t)p->P + 8 * (int64_t)p->P * p->cstride + 8 * (p->T + 1) +
           4 * p->nsrow + (12 + 12) * p->nspair + 8 * p->E_r + (12 + 4) * p->nrpair + 12 * p->nloc +
           4 * p->Nloc * (p->B + 1);
}
