/*
 * ep_agree.c -- the agreement: every rank learns, from ONE MPI_Allreduce, whether any rank failed (and the lowest
 * failing rank's status and message) and whether the values every rank must share agree (the smallest and largest
 * value of each, with the lowest rank holding it). The reduction is a user-defined, commutative operation on one
 * fixed-size record, so every rank ends with the same record and so returns the same status and message.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ep_internal.h"

typedef struct vote {
    int32_t err_rank; /* lowest failing rank, INT32_MAX when none */
    int32_t err_status;
    int32_t rmin[EP_NV], rmax[EP_NV]; /* lowest rank holding the min / max */
    int64_t vmin[EP_NV], vmax[EP_NV];
    char msg[EP_MSG];
} vote;

static void combine(void *in_, void *inout_, int *len, MPI_Datatype *dt) {
    (void)dt;
    const vote *in = (const vote *)in_;
    vote *io = (vote *)inout_;
    for (int n = 0; n < *len; n++, in++, io++) {
        if (in->err_rank < io->err_rank) {
            io->err_rank = in->err_rank;
            io->err_status = in->err_status;
            memcpy(io->msg, in->msg, sizeof io->msg);
        }
        for (int i = 0; i < EP_NV; i++) {
            if (in->vmin[i] < io->vmin[i] || (in->vmin[i] == io->vmin[i] && in->rmin[i] < io->rmin[i])) {
                io->vmin[i] = in->vmin[i];
                io->rmin[i] = in->rmin[i];
            }
            if (in->vmax[i] > io->vmax[i] || (in->vmax[i] == io->vmax[i] && in->rmax[i] < io->rmax[i])) {
                io->vmax[i] = in->vmax[i];
                io->rmax[i] = in->rmax[i];
            }
        }
    }
}

static const struct {
    const char *name;
    char kind; /* 'i' integer, 'f' float bits, 'd' dtype, 'b' flag */
} k_values[EP_NV] = {
    [EP_V_H] = {"the hidden size H", 'i'},
    [EP_V_I] = {"the intermediate size I", 'i'},
    [EP_V_E] = {"num_experts", 'i'},
    [EP_V_K] = {"top-k K (-1: routed by expert_affinities_masked)", 'i'},
    [EP_V_B] = {"block_size", 'i'},
    [EP_V_XDTYPE] = {"the dtype of hidden_states", 'd'},
    [EP_V_WIRE] = {"wire", 'i'},
    [EP_V_KEEP] = {"keep_checkpoints", 'i'},
    [EP_V_COMPUTE] = {"config.compute_dtype", 'd'},
    [EP_V_QUANT] = {"config.quant_dtype", 'i'},
    [EP_V_RULE] = {"config.scale_rule", 'i'},
    [EP_V_ACT] = {"config.activation", 'i'},
    [EP_V_AFF] = {"config.affinity_option", 'i'},
    [EP_V_GLO] = {"config.gate_clamp_lower", 'f'},
    [EP_V_GHI] = {"config.gate_clamp_upper", 'f'},
    [EP_V_ULO] = {"config.up_clamp_lower", 'f'},
    [EP_V_UHI] = {"config.up_clamp_upper", 'f'},
    [EP_V_SKIP] = {"config.skip_token", 'i'},
    [EP_V_ACC] = {"config.accumulate_hidden_states_grad", 'i'},
    [EP_V_SGI] = {"config.skip_grad_initialization", 'i'},
    [EP_V_BIAS] = {"config.bias", 'i'},
    [EP_V_DYDTYPE] = {"the dtype of output_hidden_states_grad", 'd'},
};

static int64_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (int64_t)u;
}

void ep_config_values(const mxfp8_moe_config *c, int64_t *v) {
    v[EP_V_COMPUTE] = c->compute_dtype;
    v[EP_V_QUANT] = c->quant_dtype;
    v[EP_V_RULE] = c->scale_rule;
    v[EP_V_ACT] = c->activation;
    v[EP_V_AFF] = c->affinity_option;
    v[EP_V_GLO] = fbits(c->gate_clamp_lower);
    v[EP_V_GHI] = fbits(c->gate_clamp_upper);
    v[EP_V_ULO] = fbits(c->up_clamp_lower);
    v[EP_V_UHI] = fbits(c->up_clamp_upper);
    v[EP_V_SKIP] = c->skip_token;
    v[EP_V_ACC] = c->accumulate_hidden_states_grad;
    v[EP_V_SGI] = c->skip_grad_initialization;
    v[EP_V_BIAS] = c->bias;
}

static void value_str(int i, int64_t v, char *buf, size_t n) {
    if (k_values[i].kind == 'd') {
        snprintf(buf, n, "%s", mxfp8_dtype_name((mxfp8_dtype)v));
    } else if (k_values[i].kind == 'f') {
        uint32_t u = (uint32_t)v;
        float f;
        memcpy(&f, &u, 4);
        snprintf(buf, n, "%g", (double)f);
    } else {
        snprintf(buf, n, "%lld", (long long)v);
    }
}

mxfp8_status ep_agree(MPI_Comm comm, const char *fn, mxfp8_status local, const int64_t *values) {
    int rank = 0, P = 1, rc;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &P);
    vote v;
    memset(&v, 0, sizeof v);
    v.err_rank = local ? rank : INT32_MAX;
    v.err_status = (int32_t)local;
    if (local) snprintf(v.msg, sizeof v.msg, "%s", ep_message());
    for (int i = 0; i < EP_NV; i++) {
        const int set = !local && values && values[i] != EP_UNSET;
        v.vmin[i] = set ? values[i] : INT64_MAX;
        v.vmax[i] = set ? values[i] : INT64_MIN;
        v.rmin[i] = v.rmax[i] = set ? rank : INT32_MAX;
    }
    MPI_Datatype type;
    MPI_Op op;
    if ((rc = MPI_Type_contiguous((int)sizeof(vote), MPI_BYTE, &type)) != MPI_SUCCESS)
        return ep_mpi_fail(fn, "MPI_Type_contiguous", rc);
    MPI_Type_commit(&type);
    if ((rc = MPI_Op_create(combine, 1, &op)) != MPI_SUCCESS) {
        MPI_Type_free(&type);
        return ep_mpi_fail(fn, "MPI_Op_create", rc);
    }
    vote out;
    rc = MPI_Allreduce(&v, &out, 1, type, op, comm);
    MPI_Op_free(&op);
    MPI_Type_free(&type);
    if (rc != MPI_SUCCESS) return ep_mpi_fail(fn, "MPI_Allreduce (agreement)", rc);

    if (out.err_rank != INT32_MAX) {
        char msg[EP_MSG];
        memcpy(msg, out.msg, sizeof msg);
        msg[EP_MSG - 1] = 0;
        const size_t fl = strlen(fn);
        const char *m = (!strncmp(msg, fn, fl) && msg[fl] == ':' && msg[fl + 1] == ' ') ? msg + fl + 2 : msg;
        return ep_fail((mxfp8_status)out.err_status, "%s: rank %d of %d: %s", fn, (int)out.err_rank, P, m);
    }
    for (int i = 0; i < EP_NV; i++) {
        if (out.rmin[i] == INT32_MAX || out.vmin[i] == out.vmax[i]) continue;
        char a[48], b[48];
        const int lo_first = out.rmin[i] < out.rmax[i]; /* name the lower rank first */
        value_str(i, lo_first ? out.vmin[i] : out.vmax[i], a, sizeof a);
        value_str(i, lo_first ? out.vmax[i] : out.vmin[i], b, sizeof b);
        return ep_fail(MXFP8_ERR_INVALID_ARGUMENT,
                       "%s: %s differs across ranks (every rank must pass the same): rank %d has %s, rank %d has %s",
                       fn, k_values[i].name, (int)(lo_first ? out.rmin[i] : out.rmax[i]), a,
                       (int)(lo_first ? out.rmax[i] : out.rmin[i]), b);
    }
    ep_clear();
    return MXFP8_OK;
}
