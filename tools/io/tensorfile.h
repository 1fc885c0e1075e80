/*
 * tensorfile.h -- named tensors in .npy and .safetensors files, for the mxfp8 CLI.
 *
 * Contract
 * --------
 *  - Readers are hardened: every size read from a file is checked against the file's length before it is used,
 *    so a malformed or hostile file gives a clear error message, never a crash, an out-of-bounds read, or an
 *    allocation larger than the file. Checked: truncated files, header length past the end of the file or above
 *    100 MB, data offsets out of range, reversed / overlapping / non-contiguous data ranges (as the safetensors
 *    reference implementation requires: the ranges, sorted by offset, tile the data buffer exactly), byte counts
 *    that differ from shape x dtype, unknown dtypes, duplicate names, non-UTF-8 headers, non-integer or negative
 *    dims, shape products that overflow, ranks above MXFP8_MAX_DIMS, Fortran-order or big-endian .npy arrays.
 *  - Writers are atomic: the bytes go to a temporary file in the destination's directory, which is fsync'd and
 *    renamed over the destination; on any failure (or SIGINT/SIGTERM while writing) the temporary file is removed,
 *    so a failed run leaves neither a partial file nor a stray one.
 *  - Formats: .safetensors (dtypes BF16, F16, F32, F64, U8, I32, I64, U32, F8_E4M3, F8_E5M2, F8_E8M0; little-endian,
 *    row-major) and .npy (v1/v2/v3; '<f4', '<f2', '<f8', '|u1', '<i4', '<i8', C order). A file is read by its
 *    content (the .npy magic "\x93NUMPY", or a safetensors header: 8-byte length, then '{'), whatever its name;
 *    a file is written in the format its name's extension says (.npy, else .safetensors).
 *  - All functions return 0 on success, -1 on error with a one-line message in err (no trailing newline).
 */
#ifndef MXFP8_TOOLS_TENSORFILE_H
#define MXFP8_TOOLS_TENSORFILE_H

#include <stddef.h>
#include <stdint.h>

#include "mxfp8.h"

/** Element types a tensor file may hold. */
typedef enum tf_dtype {
    TF_F32 = 0, TF_F16, TF_BF16, TF_F64, TF_U8, TF_I32, TF_I64, TF_U32, TF_F8_E4M3, TF_F8_E5M2, TF_F8_E8M0,
    TF_NUM_DTYPES
} tf_dtype;

#define TF_ERR_LEN 512
#define TF_MAX_HEADER (100u * 1000u * 1000u) /* 100 MB, as the safetensors reference implementation */

/** One tensor held in memory (row-major, contiguous, little-endian). */
typedef struct tf_tensor {
    char *name;                      /**< owned, NUL-terminated */
    tf_dtype dtype;
    int ndim;                        /**< 0..MXFP8_MAX_DIMS */
    int64_t shape[MXFP8_MAX_DIMS];
    int64_t numel;
    size_t nbytes;
    void *data;                      /**< owned (NULL allowed when nbytes == 0) */
} tf_tensor;

/** A list of tensors, in file (or insertion) order. Each tensor is its own allocation: pointers returned by
 *  tf_find / tf_add_new stay valid while more tensors are added, until tf_free. */
#define TF_MAX_META 32
typedef struct tf_set {
    tf_tensor **t;
    int n, cap;
    /** safetensors "__metadata__" string pairs (owned): read from a file (the first TF_MAX_META; "producer" is
     *  always written as "mxfp8" first), written after it by tf_save. .npy files have none. */
    int nmeta;
    char *meta_key[TF_MAX_META], *meta_val[TF_MAX_META];
} tf_set;

/** Size in bytes of one element. */
size_t tf_dtype_size(tf_dtype d);
/** safetensors name ("F32", "BF16", "F8_E4M3", ...). */
const char *tf_dtype_name(tf_dtype d);
/** The library dtype of a file dtype, or -1 when the library has none (I64). F8_E8M0 -> E8M0, U8 -> U8. */
int tf_to_mxfp8_dtype(tf_dtype d);
/** The file dtype of a library dtype (-1 if none). */
int tf_from_mxfp8_dtype(mxfp8_dtype d);

/** Read every tensor of a .npy or .safetensors file. A .npy array is named by the file's stem ("x" for x.npy). */
int tf_load(const char *path, tf_set *out, char *err, size_t errlen);
/** Write a set atomically. .npy needs exactly one tensor of an npy dtype (not BF16 / FP8); safetensors any number. */
int tf_save(const char *path, const tf_set *set, char *err, size_t errlen);
/** Check, before a long computation, that `path` can be written later: known extension, existing writable
 *  directory, and not a directory itself. */
int tf_check_writable(const char *path, int n_tensors, char *err, size_t errlen);

/** Every tensor of the set must be called one of known[0..n): else -1 and a message naming the unknown tensor(s)
 *  and listing the known names (path: the file, for the message). */
int tf_check_names(const tf_set *set, const char *path, const char *const *known, int n, char *err, size_t errlen);
/** The tensor called `name`, or NULL. */
tf_tensor *tf_find(const tf_set *set, const char *name);
/** Append a tensor (copies the name; takes ownership of data, which must come from malloc). Returns 0 or -1 (OOM,
 *  duplicate name, bad rank). On failure `data` is still owned by the caller. */
int tf_add(tf_set *set, const char *name, tf_dtype dtype, int ndim, const int64_t *shape, void *data,
           char *err, size_t errlen);
/** Allocate a zeroed tensor in the set and return it (NULL + err on OOM / overflow / duplicate). */
tf_tensor *tf_add_new(tf_set *set, const char *name, tf_dtype dtype, int ndim, const int64_t *shape,
                      char *err, size_t errlen);
void tf_free(tf_set *set);
/** Set metadata key to value (copies both; replaces an existing key). 0, or -1 + err on OOM / too many keys. */
int tf_meta_set(tf_set *set, const char *key, const char *value, char *err, size_t errlen);
/** The value of metadata key, or NULL. */
const char *tf_meta_get(const tf_set *set, const char *key);

/** numel of a shape with overflow checking (-1 when negative or past 2^62 bytes-ish for element size esz). */
int64_t tf_shape_numel(int ndim, const int64_t *shape, size_t esz);
/** "[3, 4]" into buf. */
const char *tf_shape_str(int ndim, const int64_t *shape, char *buf, size_t len);
/** A library view of a tensor (dtype must have a library equivalent; else the view has data NULL). */
mxfp8_tensor tf_view(const tf_tensor *t);
/** Convert an I64 tensor to I32 in place (values must fit); I32 left as is; other dtypes an error. */
int tf_to_i32(tf_tensor *t, char *err, size_t errlen);
/** Convert a floating tensor (F32/F16/BF16/F64) to F32 in place; F32 left as is. */
int tf_to_f32(tf_tensor *t, char *err, size_t errlen);

#endif /* MXFP8_TOOLS_TENSORFILE_H */
