/*
 * ep_wire.c -- token rows on the wire: packing rows for the dispatch (in their own dtype, or MX-quantized along H:
 * H FP8 codes followed by the row's ceil(H/32) E8M0 scales), the MPI_Alltoallv of fixed-size rows, and decoding the
 * received rows into the local problem's pair-rows.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "ep_internal.h"

mxfp8_status ep_alltoallv(const char *fn, MPI_Comm comm, const void *sbuf, const int *scnt, const int *sdsp,
                          void *rbuf, const int *rcnt, const int *rdsp, int64_t rowbytes, int64_t *bytes_sent,
                          int64_t *bytes_recv) {
    int rank = 0, P = 1, rc;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &P);
    if (rowbytes < 1 || rowbytes > INT_MAX)
        return ep_fail(MXFP8_ERR_SIZE_OVERFLOW, "%s: a row of %lld bytes is too large for one MPI datatype", fn,
                       (long long)rowbytes);
    MPI_Datatype row;
    if ((rc = MPI_Type_contiguous((int)rowbytes, MPI_BYTE, &row)) != MPI_SUCCESS)
        return ep_mpi_fail(fn, "MPI_Type_contiguous", rc);
    MPI_Type_commit(&row);
    rc = MPI_Alltoallv(sbuf ? sbuf : ep_dummy(), scnt, sdsp, row, rbuf ? rbuf : ep_dummy(), rcnt, rdsp, row, comm);
    MPI_Type_free(&row);
    if (rc != MPI_SUCCESS) return ep_mpi_fail(fn, "MPI_Alltoallv", rc);
    for (int q = 0; q < P; q++)
        if (q != rank) {
            *bytes_sent += (int64_t)scnt[q] * rowbytes;
            *bytes_recv += (int64_t)rcnt[q] * rowbytes;
        }
    return MXFP8_OK;
}

int64_t ep_row_bytes(mxfp8_mpi_wire wire, mxfp8_dtype dt, int64_t H) {
    if (wire == MXFP8_MPI_WIRE_MXFP8) return H + (H + 31) / 32;
    return H * (int64_t)mxfp8_dtype_size(dt);
}

mxfp8_dtype ep_local_dtype(mxfp8_mpi_wire wire, mxfp8_dtype dt) {
    return wire == MXFP8_MPI_WIRE_MXFP8 ? MXFP8_DTYPE_F32 : dt;
}

/* Views of n MX rows in a buffer of n (H + G) bytes: codes [n, H] first, then scales [n, G] (separate regions:
 * libmxfp8 rejects an output whose byte span overlaps another's). A wire row is a code row followed by its scales. */
static void mx_views(void *buf, int64_t n, int64_t H, mxfp8_format fmt, mxfp8_tensor *codes, mxfp8_tensor *scales) {
    const int64_t G = (H + 31) / 32;
    const int64_t sc[2] = {n, H}, ss[2] = {n, G};
    *codes = mxfp8_tensor_make(buf ? buf : ep_dummy(), fmt == MXFP8_FMT_E5M2 ? MXFP8_DTYPE_E5M2 : MXFP8_DTYPE_E4M3,
                               2, sc);
    *scales = mxfp8_tensor_make(buf ? (char *)buf + n * H : ep_dummy(), MXFP8_DTYPE_E8M0, 2, ss);
}

mxfp8_status ep_pack_rows(const char *fn, const ep_plan *p, const mxfp8_tensor *x, mxfp8_mpi_wire wire,
                          mxfp8_format fmt, mxfp8_scale_rule rule, void *sbuf, void *tmp) {
    const int64_t H = p->H, n = p->nsrow, rb = ep_row_bytes(wire, x->dtype, H);
    const int nt = n * rb > (1 << 20) ? ep_threads() : 1;
    if (wire == MXFP8_MPI_WIRE_MXFP8) {
        /* quantize every token row once into tmp [T, H + G], then copy the rows each destination gets */
        mxfp8_tensor codes, scales;
        mx_views(tmp, p->T, H, fmt, &codes, &scales);
        mxfp8_quant_params qp = mxfp8_quant_params_default();
        qp.fmt = fmt;
        qp.rule = rule;
        qp.group = MXFP8_GROUP_1X32;
        mxfp8_status st = mxfp8_quantize(x, 1, &qp, &codes, &scales);
        if (st) return ep_lib_fail(fn, "quantizing the rows for the wire", st);
        const int64_t G = rb - H;
        const char *cq = (const char *)tmp, *cs = cq + p->T * H;
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t i = 0; i < n; i++) {
            const int64_t t = p->srow_tok[i];
            memcpy((char *)sbuf + i * rb, cq + t * H, (size_t)H);
            memcpy((char *)sbuf + i * rb + H, cs + t * G, (size_t)G);
        }
        return MXFP8_OK;
    }
    const int64_t es = (int64_t)mxfp8_dtype_size(x->dtype);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t i = 0; i < n; i++) {
        const int64_t t = p->srow_tok[i];
        char *dst = (char *)sbuf + i * rb;
        if (x->strides[1] == 1) {
            memcpy(dst, (const char *)x->data + t * x->strides[0] * es, (size_t)rb);
        } else {
            for (int64_t h = 0; h < H; h++)
                memcpy(dst + h * es, (const char *)x->data + (t * x->strides[0] + h * x->strides[1]) * es, (size_t)es);
        }
    }
    return MXFP8_OK;
}

mxfp8_status ep_unpack_pairs(const char *fn, const ep_plan *p, const void *rbuf, mxfp8_mpi_wire wire,
                             mxfp8_dtype dt, mxfp8_format fmt, void *out, void *tmp) {
    const int64_t H = p->H, n = p->nloc, rb = ep_row_bytes(wire, dt, H);
    const int nt = n * H > (1 << 18) ? ep_threads() : 1;
    if (wire != MXFP8_MPI_WIRE_MXFP8) {
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t j = 0; j < n; j++)
            memcpy((char *)out + j * rb, (const char *)rbuf + (int64_t)p->lrow[j] * rb, (size_t)rb);
        return MXFP8_OK;
    }
    if (n == 0) return MXFP8_OK;
    const int64_t G = rb - H;
    char *cq = (char *)tmp, *cs = cq + n * H;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t j = 0; j < n; j++) {
        const char *src = (const char *)rbuf + (int64_t)p->lrow[j] * rb;
        memcpy(cq + j * H, src, (size_t)H);
        memcpy(cs + j * G, src + H, (size_t)G);
    }
    mxfp8_tensor codes, scales;
    mx_views(tmp, n, H, fmt, &codes, &scales);
    const int64_t so[2] = {n, H};
    mxfp8_tensor o = mxfp8_tensor_make(out, MXFP8_DTYPE_F32, 2, so);
    mxfp8_status st = mxfp8_dequantize(&codes, &scales, 1, MXFP8_GROUP_1X32, &o);
    return st ? ep_lib_fail(fn, "dequantizing the received rows", st) : MXFP8_OK;
}

void ep_local_affinities(const ep_plan *p, float *a) {
    if (p->nloc > 0) memset(a, 0, sizeof(float) * (size_t)(p->nloc * p->E_r));
    for (int64_t j = 0; j < p->nloc; j++) a[j * p->E_r + p->lexp[j]] = p->la[j];
}

void ep_fold(const ep_plan *p, const float *recv, int64_t ld, const mxfp8_tensor *out, int add) {
    const int64_t T = p->T, H = p->H;
    const int nt = T * H > 65536 ? ep_threads() : 1;
#pragma omp parallel num_threads(nt)
    {
        const unsigned csr = mxfp8i_fenv_enter();
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h0 = 0; h0 < H; h0 += 256) {
                const int64_t n = H - h0 < 256 ? H - h0 : 256;
                float acc[256];
                for (int64_t h = 0; h < n; h++) acc[h] = 0.0f;
                for (int64_t j = p->tok_off[t]; j < p->tok_off[t + 1]; j++) {
                    const float *r = recv + (int64_t)p->tok_pair[j] * ld + h0;
                    for (int64_t h = 0; h < n; h++) acc[h] += r[h];
                }
                for (int64_t h = 0; h < n; h++) {
                    const int64_t off = t * out->strides[0] + (h0 + h) * out->strides[1];
                    ep_store(out, off, add ? ep_load(out, off) + acc[h] : acc[h]);
                }
            }
        mxfp8i_fenv_leave(csr);
    }
}
