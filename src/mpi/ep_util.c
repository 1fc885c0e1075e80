/*
 * ep_util.c -- errors, view checks and element access of libmxfp8_mpi (public API of libmxfp8 only), the expert
 * placement and the small helpers for language bindings.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ep_internal.h"

/* ---- errors ---- */
static _Thread_local char g_msg[EP_MSG];

mxfp8_status ep_fail(mxfp8_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    return st;
}
const char *ep_message(void) { return g_msg; }
void ep_clear(void) { g_msg[0] = 0; }

mxfp8_status ep_mpi_fail(const char *fn, const char *what, int rc) {
    char s[MPI_MAX_ERROR_STRING + 1];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) len = snprintf(s, sizeof s, "MPI error %d", rc);
    s[len < 0 ? 0 : len > MPI_MAX_ERROR_STRING ? MPI_MAX_ERROR_STRING : len] = 0;
    return ep_fail(MXFP8_MPI_ERR_COMMUNICATION, "%s: %s failed: %s", fn, what, s);
}

mxfp8_status ep_lib_fail(const char *fn, const char *what, mxfp8_status st) {
    return ep_fail(st, "%s: %s: %s", fn, what, mxfp8_last_error_message());
}

const char *mxfp8_mpi_last_error_message(void) { return g_msg; }

const char *mxfp8_mpi_status_string(mxfp8_status status) {
    if (status == MXFP8_MPI_ERR_COMMUNICATION) return "MPI communication failed";
    return mxfp8_status_string(status);
}

/* ---- expert placement ---- */
mxfp8_status mxfp8_mpi_moe_expert_range(int64_t num_experts, int nranks, int rank, int64_t *first_expert,
                                        int64_t *num_local_experts) {
    static const char *fn = "mxfp8_mpi_moe_expert_range";
    ep_clear();
    if (!first_expert || !num_local_experts)
        return ep_fail(MXFP8_ERR_NULL_POINTER, "%s: an output pointer is NULL", fn);
    if (num_experts < 1) return ep_fail(MXFP8_ERR_INVALID_ARGUMENT, "%s: num_experts %lld < 1", fn, (long long)num_experts);
    if (nranks < 1 || nranks > num_experts)
        return ep_fail(MXFP8_ERR_INVALID_ARGUMENT, "%s: %d ranks for %lld experts (need 1 <= ranks <= experts)", fn,
                       nranks, (long long)num_experts);
    if (rank < 0 || rank >= nranks)
        return ep_fail(MXFP8_ERR_INVALID_ARGUMENT, "%s: rank %d is outside [0, %d)", fn, rank, nranks);
    const int64_t q = num_experts / nranks, r = num_experts % nranks;
    *first_expert = rank * q + (rank < r ? rank : r);
    *num_local_experts = q + (rank < r);
    return MXFP8_OK;
}

int ep_owner(int64_t E, int P, int64_t e) {
    const int64_t q = E / P, r = E % P, big = r * (q + 1);
    return (int)(e < big ? e / (q + 1) : r + (e - big) / q);
}

/* ---- views ---- */
static const char *dtype_list(unsigned mask, char *buf, size_t n) {
    buf[0] = 0;
    for (int d = 0; d < 16; d++)
        if (mask & (1u << d)) {
            size_t l = strlen(buf);
            snprintf(buf + l, n - l, "%s%s", l ? ", " : "", mxfp8_dtype_name((mxfp8_dtype)d));
        }
    return buf;
}

mxfp8_status ep_check_view(const char *fn, const char *name, const mxfp8_tensor *t, int ndim, const int64_t *shape,
                           unsigned dtypes, int required) {
    if (!t) return ep_fail(MXFP8_ERR_NULL_POINTER, "%s: %s is NULL", fn, name);
    if (!t->data && !required) return MXFP8_OK; /* absent optional tensor */
    if (t->ndim < 0 || t->ndim > MXFP8_MAX_DIMS)
        return ep_fail(MXFP8_ERR_INVALID_ARGUMENT, "%s: %s has ndim %d (must be 0..%d)", fn, name, (int)t->ndim,
                       MXFP8_MAX_DIMS);
    if (ndim >= 0 && t->ndim != ndim)
        return ep_fail(MXFP8_ERR_SHAPE_MISMATCH, "%s: %s must be %d-D, got %d-D", fn, name, ndim, (int)t->ndim);
    if ((unsigned)t->dtype >= 16 || !(dtypes & (1u << t->dtype))) {
        char buf[96];
        return ep_fail(MXFP8_ERR_DTYPE, "%s: %s has dtype %s (expected %s)", fn, name, mxfp8_dtype_name(t->dtype),
                       dtype_list(dtypes, buf, sizeof buf));
    }
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] < 0)
            return ep_fail(MXFP8_ERR_SIZE_OVERFLOW, "%s: %s has negative shape[%d] = %lld", fn, name, i,
                           (long long)t->shape[i]);
    const int64_t n = mxfp8_tensor_numel(t);
    if (n < 0) return ep_fail(MXFP8_ERR_SIZE_OVERFLOW, "%s: %s: the product of its shape overflows", fn, name);
    if (shape)
        for (int i = 0; i < t->ndim; i++)
            if (shape[i] >= 0 && t->shape[i] != shape[i])
                return ep_fail(MXFP8_ERR_SHAPE_MISMATCH, "%s: %s has shape[%d] = %lld, expected %lld", fn, name, i,
                               (long long)t->shape[i], (long long)shape[i]);
    if (n > 0) {
        int64_t span = 0;
        for (int i = 0; i < t->ndim; i++) {
            const int64_t s = t->strides[i] < 0 ? -t->strides[i] : t->strides[i];
            if (t->strides[i] == INT64_MIN || (s > 0 && t->shape[i] - 1 > (INT64_MAX - span) / s))
                return ep_fail(MXFP8_ERR_BAD_STRIDES, "%s: %s: strides address beyond any buffer", fn, name);
            span += s * (t->shape[i] - 1);
        }
        if (span >= INT64_MAX / 16)
            return ep_fail(MXFP8_ERR_BAD_STRIDES, "%s: %s: strides address beyond any buffer", fn, name);
        if (!t->data) return ep_fail(MXFP8_ERR_NULL_POINTER, "%s: %s.data is NULL", fn, name);
    }
    return MXFP8_OK;
}

mxfp8_status ep_check_vec(const char *fn, const char *name, const mxfp8_tensor *t, int64_t n, int required) {
    if (!t) return ep_fail(MXFP8_ERR_NULL_POINTER, "%s: %s is NULL", fn, name);
    if (!t->data && !required) return MXFP8_OK;
    mxfp8_status st = ep_check_view(fn, name, t, -1, NULL, EP_FLOATS, 1);
    if (st) return st;
    if (!((t->ndim == 1 && t->shape[0] == n) || (t->ndim == 2 && t->shape[0] == n && t->shape[1] == 1)))
        return ep_fail(MXFP8_ERR_SHAPE_MISMATCH, "%s: %s must be [%lld, 1] or [%lld]", fn, name, (long long)n,
                       (long long)n);
    return MXFP8_OK;
}

mxfp8_status ep_check_distinct(const char *fn, const char *name, const mxfp8_tensor *t) {
    int64_t st[MXFP8_MAX_DIMS], sh[MXFP8_MAX_DIMS];
    int n = 0;
    if (mxfp8_tensor_numel(t) <= 1) return MXFP8_OK;
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] > 1) {
            st[n] = t->strides[i] < 0 ? -t->strides[i] : t->strides[i];
            sh[n++] = t->shape[i];
        }
    for (int i = 1; i < n; i++) /* insertion sort by |stride| */
        for (int j = i; j > 0 && st[j] < st[j - 1]; j--) {
            int64_t a = st[j]; st[j] = st[j - 1]; st[j - 1] = a;
            a = sh[j]; sh[j] = sh[j - 1]; sh[j - 1] = a;
        }
    int64_t reach = 0;
    for (int j = 0; j < n; j++) {
        if (st[j] <= reach)
            return ep_fail(MXFP8_ERR_BAD_STRIDES, "%s: %s: its strides address some elements twice (an output must "
                           "address distinct elements)", fn, name);
        reach += st[j] * (sh[j] - 1);
    }
    return MXFP8_OK;
}

static int view_span(const mxfp8_tensor *t, uintptr_t *lo, uintptr_t *hi) {
    if (!t || !t->data || mxfp8_tensor_numel(t) <= 0) return 0;
    int64_t mn = 0, mx = 0;
    for (int i = 0; i < t->ndim; i++) {
        const int64_t ext = t->strides[i] * (t->shape[i] - 1);
        if (ext < 0) mn += ext;
        else mx += ext;
    }
    const int64_t es = (int64_t)mxfp8_dtype_size(t->dtype);
    *lo = (uintptr_t)t->data + (uintptr_t)(mn * es);
    *hi = (uintptr_t)t->data + (uintptr_t)((mx + 1) * es);
    return 1;
}

mxfp8_status ep_check_overlap(const char *fn, const char *na, const mxfp8_tensor *a, const char *nb,
                              const mxfp8_tensor *b) {
    uintptr_t alo, ahi, blo, bhi;
    if (!view_span(a, &alo, &ahi) || !view_span(b, &blo, &bhi)) return MXFP8_OK;
    if (alo < bhi && blo < ahi) return ep_fail(MXFP8_ERR_ALIASING, "%s: %s overlaps %s in memory", fn, na, nb);
    return MXFP8_OK;
}

/* ---- elements ---- */
float ep_load(const mxfp8_tensor *t, int64_t off) {
    switch (t->dtype) {
    case MXFP8_DTYPE_F32: return ((const float *)t->data)[off];
    case MXFP8_DTYPE_BF16: return mxfp8_bf16_to_fp32(((const uint16_t *)t->data)[off]);
    case MXFP8_DTYPE_F16: return mxfp8_fp16_to_fp32(((const uint16_t *)t->data)[off]);
    default: return 0.0f;
    }
}

void ep_store(const mxfp8_tensor *t, int64_t off, float v) {
    switch (t->dtype) {
    case MXFP8_DTYPE_F32: ((float *)t->data)[off] = v; break;
    case MXFP8_DTYPE_BF16: ((uint16_t *)t->data)[off] = mxfp8_fp32_to_bf16(v); break;
    case MXFP8_DTYPE_F16: ((uint16_t *)t->data)[off] = mxfp8_fp32_to_fp16(v); break;
    default: break;
    }
}

static int contiguous(const mxfp8_tensor *t) {
    int64_t want = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != want) return 0;
        want *= t->shape[i];
    }
    return 1;
}

/* Walk every element of t in row-major order; copy between it and the contiguous buffer buf. */
static void walk(const mxfp8_tensor *t, void *buf, int to_view) {
    const int64_t n = mxfp8_tensor_numel(t), es = (int64_t)mxfp8_dtype_size(t->dtype);
    if (n <= 0) return;
    if (contiguous(t)) {
        if (to_view) memcpy(t->data, buf, (size_t)(n * es));
        else memcpy(buf, t->data, (size_t)(n * es));
        return;
    }
    int64_t idx[MXFP8_MAX_DIMS] = {0};
    for (int64_t k = 0; k < n; k++) {
        int64_t off = 0;
        for (int d = 0; d < t->ndim; d++) off += idx[d] * t->strides[d];
        char *v = (char *)t->data + off * es, *b = (char *)buf + k * es;
        if (to_view) memcpy(v, b, (size_t)es);
        else memcpy(b, v, (size_t)es);
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
}
void ep_gather(const mxfp8_tensor *t, void *dst) { walk(t, dst, 0); }
void ep_scatter(const mxfp8_tensor *t, const void *src) { walk(t, (void *)src, 1); }

mxfp8_tensor ep_like(const mxfp8_tensor *t, void *buf) {
    return mxfp8_tensor_make(buf ? buf : ep_dummy(), t->dtype, t->ndim, t->shape);
}

void *ep_dummy(void) {
    static int64_t dummy[8];
    return dummy;
}

int ep_threads(void) {
    mxfp8_info info;
    if (mxfp8_get_info(&info) != MXFP8_OK || info.num_threads < 1) return 1;
    return info.num_threads;
}

double ep_now(void) { return MPI_Wtime(); }

/* ---- helpers for bindings ---- */
int mxfp8_mpi_comm_size_bytes(void) { return (int)sizeof(MPI_Comm); }

mxfp8_status mxfp8_mpi_comm_from_fortran(int fortran_handle, MPI_Comm *comm) {
    ep_clear();
    if (!comm) return ep_fail(MXFP8_ERR_NULL_POINTER, "mxfp8_mpi_comm_from_fortran: comm is NULL");
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin)
        return ep_fail(MXFP8_ERR_INVALID_ARGUMENT, "mxfp8_mpi_comm_from_fortran: MPI is not initialized");
    *comm = MPI_Comm_f2c((MPI_Fint)fortran_handle);
    return MXFP8_OK;
}

int64_t mxfp8_mpi_struct_size(int which) {
    switch (which) {
    case 0: return (int64_t)sizeof(mxfp8_mpi_moe_fwd_args);
    case 1: return (int64_t)sizeof(mxfp8_mpi_moe_bwd_args);
    case 2: return (int64_t)sizeof(mxfp8_mpi_moe_bwd_grads);
    case 3: return (int64_t)sizeof(mxfp8_mpi_moe_stats);
    default: return -1;
    }
}

int ep_given(const mxfp8_tensor *t) { return t && (t->data || t->ndim > 0); }

mxfp8_status ep_comm_usable(const char *fn, MPI_Comm comm, int *rank, int *nranks) {
    int init = 0, fin = 0, inter = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin)
        return ep_fail(MXFP8_ERR_INVALID_ARGUMENT, "%s: MPI is %s", fn, fin ? "already finalized" : "not initialized");
    if (comm == MPI_COMM_NULL) return ep_fail(MXFP8_ERR_NULL_POINTER, "%s: comm is MPI_COMM_NULL", fn);
    int rc = MPI_Comm_test_inter(comm, &inter);
    if (rc != MPI_SUCCESS) return ep_mpi_fail(fn, "MPI_Comm_test_inter", rc);
    if (inter) return ep_fail(MXFP8_ERR_INVALID_ARGUMENT, "%s: comm is an intercommunicator", fn);
    MPI_Comm_rank(comm, rank);
    MPI_Comm_size(comm, nranks);
    return MXFP8_OK;
}

void *ep_alloc(int64_t n, int64_t size, int *ok) {
    int64_t bytes;
    if (n < 0 || __builtin_mul_overflow(n, size, &bytes) || (uint64_t)bytes > SIZE_MAX / 2) {
        *ok = 0;
        return NULL;
    }
    void *q = malloc((size_t)(bytes > 0 ? bytes : 1));
    if (!q) *ok = 0;
    return q;
}
