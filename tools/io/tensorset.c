/*
 * tensorset.c -- tensor sets (add, find, free, views, conversions), shapes and the dtype table of the mxfp8 CLI's
 * tensor files. See tensorfile.h for the contract.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fileaccess.h"

static const struct {
    const char *name;
    size_t size;
    int lib; /* mxfp8_dtype or -1 */
} k_dtypes[TF_NUM_DTYPES] = {
    [TF_F32] = {"F32", 4, MXFP8_DTYPE_F32},        [TF_F16] = {"F16", 2, MXFP8_DTYPE_F16},
    [TF_BF16] = {"BF16", 2, MXFP8_DTYPE_BF16},     [TF_F64] = {"F64", 8, MXFP8_DTYPE_F64},
    [TF_U8] = {"U8", 1, MXFP8_DTYPE_U8},           [TF_I32] = {"I32", 4, MXFP8_DTYPE_I32},
    [TF_I64] = {"I64", 8, -1},                     [TF_U32] = {"U32", 4, MXFP8_DTYPE_U32},
    [TF_F8_E4M3] = {"F8_E4M3", 1, MXFP8_DTYPE_E4M3}, [TF_F8_E5M2] = {"F8_E5M2", 1, MXFP8_DTYPE_E5M2},
    [TF_F8_E8M0] = {"F8_E8M0", 1, MXFP8_DTYPE_E8M0},
};

size_t tf_dtype_size(tf_dtype d) { return (unsigned)d < TF_NUM_DTYPES ? k_dtypes[d].size : 0; }
const char *tf_dtype_name(tf_dtype d) { return (unsigned)d < TF_NUM_DTYPES ? k_dtypes[d].name : "?"; }
int tf_to_mxfp8_dtype(tf_dtype d) { return (unsigned)d < TF_NUM_DTYPES ? k_dtypes[d].lib : -1; }
int tf_from_mxfp8_dtype(mxfp8_dtype d) {
    for (int i = 0; i < TF_NUM_DTYPES; i++)
        if (k_dtypes[i].lib == (int)d) return i;
    return -1;
}


int64_t tf_shape_numel(int ndim, const int64_t *shape, size_t esz) {
    /* Bound: numel * esz must fit comfortably in int64 and size_t. */
    const uint64_t limit = (uint64_t)INT64_MAX / (esz ? esz : 1);
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        uint64_t d = (uint64_t)shape[i];
        if (d != 0 && n > limit / d) return -1;
        n *= d;
    }
    for (int i = 0; i < ndim; i++)
        if (shape[i] == 0) return 0;
    return n > limit ? -1 : (int64_t)n;
}

const char *tf_shape_str(int ndim, const int64_t *shape, char *buf, size_t len) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
    return buf;
}

tf_tensor *tf_find(const tf_set *set, const char *name) {
    for (int i = 0; i < set->n; i++)
        if (!strcmp(set->t[i]->name, name)) return set->t[i];
    return NULL;
}

static int set_reserve(tf_set *set, char *err, size_t errlen) {
    if (set->n < set->cap) return 0;
    int cap = set->cap ? set->cap * 2 : 8;
    tf_tensor **t = realloc(set->t, (size_t)cap * sizeof *t);
    if (!t) return tf_err(err, errlen, "out of memory");
    set->t = t;
    set->cap = cap;
    return 0;
}

int tf_add(tf_set *set, const char *name, tf_dtype dtype, int ndim, const int64_t *shape, void *data, char *err,
           size_t errlen) {
    if ((unsigned)dtype >= TF_NUM_DTYPES) return tf_err(err, errlen, "tensor '%s': unknown dtype", name);
    if (ndim < 0 || ndim > MXFP8_MAX_DIMS)
        return tf_err(err, errlen, "tensor '%s': rank %d is above the %d dimensions mxfp8 supports", name, ndim,
                      MXFP8_MAX_DIMS);
    if (tf_find(set, name)) return tf_err(err, errlen, "duplicate tensor name '%s'", name);
    int64_t numel = tf_shape_numel(ndim, shape, tf_dtype_size(dtype));
    if (numel < 0) return tf_err(err, errlen, "tensor '%s': shape is negative or its size overflows", name);
    if (set_reserve(set, err, errlen)) return -1;
    char *nm = strdup(name);
    tf_tensor *t = calloc(1, sizeof *t);
    if (!nm || !t) {
        free(nm);
        free(t);
        return tf_err(err, errlen, "out of memory");
    }
    set->t[set->n++] = t;
    t->name = nm;
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->numel = numel;
    t->nbytes = (size_t)numel * tf_dtype_size(dtype);
    t->data = data;
    return 0;
}

tf_tensor *tf_add_new(tf_set *set, const char *name, tf_dtype dtype, int ndim, const int64_t *shape, char *err,
                      size_t errlen) {
    int64_t numel = tf_shape_numel(ndim, shape, tf_dtype_size(dtype));
    if (numel < 0) {
        tf_err(err, errlen, "tensor '%s': shape is negative or its size overflows", name);
        return NULL;
    }
    size_t nb = (size_t)numel * tf_dtype_size(dtype);
    void *data = calloc(nb ? nb : 1, 1);
    if (!data) {
        tf_err(err, errlen, "tensor '%s': out of memory (%zu bytes)", name, nb);
        return NULL;
    }
    if (tf_add(set, name, dtype, ndim, shape, data, err, errlen)) {
        free(data);
        return NULL;
    }
    return set->t[set->n - 1];
}

void tf_free(tf_set *set) {
    if (!set) return;
    for (int i = 0; i < set->n; i++) {
        free(set->t[i]->name);
        free(set->t[i]->data);
        free(set->t[i]);
    }
    free(set->t);
    for (int i = 0; i < set->nmeta; i++) {
        free(set->meta_key[i]);
        free(set->meta_val[i]);
    }
    memset(set, 0, sizeof *set);
}

int tf_meta_set(tf_set *set, const char *key, const char *value, char *err, size_t errlen) {
    int i = 0;
    while (i < set->nmeta && strcmp(set->meta_key[i], key)) i++;
    if (i == TF_MAX_META) return tf_err(err, errlen, "more than %d metadata entries", TF_MAX_META);
    char *k = i < set->nmeta ? NULL : strdup(key), *v = strdup(value);
    if ((i == set->nmeta && !k) || !v) {
        free(k);
        free(v);
        return tf_err(err, errlen, "out of memory");
    }
    if (i == set->nmeta) set->meta_key[set->nmeta++] = k;
    else free(set->meta_val[i]);
    set->meta_val[i] = v;
    return 0;
}

const char *tf_meta_get(const tf_set *set, const char *key) {
    for (int i = 0; i < set->nmeta; i++)
        if (!strcmp(set->meta_key[i], key)) return set->meta_val[i];
    return NULL;
}

mxfp8_tensor tf_view(const tf_tensor *t) {
    int lib = tf_to_mxfp8_dtype(t->dtype);
    if (lib < 0) return MXFP8_TENSOR_NONE;
    /* A zero-element tensor still needs a non-NULL pointer for the library's NULL checks. */
    static unsigned char dummy[8];
    return mxfp8_tensor_make(t->data ? t->data : dummy, (mxfp8_dtype)lib, t->ndim, t->shape);
}

int tf_to_i32(tf_tensor *t, char *err, size_t errlen) {
    if (t->dtype == TF_I32) return 0;
    if (t->dtype != TF_I64)
        return tf_err(err, errlen, "tensor '%s' has dtype %s; an integer tensor (I32 or I64) is needed", t->name,
                      tf_dtype_name(t->dtype));
    const int64_t *src = t->data;
    int32_t *dst = t->data; /* in place: dst[i] is written after src[i] and src[j>i] are not yet read-over */
    for (int64_t i = 0; i < t->numel; i++) {
        int64_t v = src[i];
        if (v < INT32_MIN || v > INT32_MAX)
            return tf_err(err, errlen, "tensor '%s': value %lld at index %lld does not fit in int32", t->name,
                          (long long)v, (long long)i);
    }
    for (int64_t i = 0; i < t->numel; i++) dst[i] = (int32_t)src[i];
    t->dtype = TF_I32;
    t->nbytes = (size_t)t->numel * 4;
    return 0;
}

int tf_to_f32(tf_tensor *t, char *err, size_t errlen) {
    if (t->dtype == TF_F32) return 0;
    if (t->dtype != TF_F16 && t->dtype != TF_BF16 && t->dtype != TF_F64)
        return tf_err(err, errlen, "tensor '%s' has dtype %s; a floating-point tensor (F32, BF16, F16, F64) is needed",
                      t->name, tf_dtype_name(t->dtype));
    float *out = malloc(t->numel ? (size_t)t->numel * 4 : 1);
    if (!out) return tf_err(err, errlen, "out of memory");
    for (int64_t i = 0; i < t->numel; i++) {
        if (t->dtype == TF_F16) out[i] = mxfp8_fp16_to_fp32(((const uint16_t *)t->data)[i]);
        else if (t->dtype == TF_BF16) out[i] = mxfp8_bf16_to_fp32(((const uint16_t *)t->data)[i]);
        else out[i] = (float)((const double *)t->data)[i];
    }
    free(t->data);
    t->data = out;
    t->dtype = TF_F32;
    t->nbytes = (size_t)t->numel * 4;
    return 0;
}
