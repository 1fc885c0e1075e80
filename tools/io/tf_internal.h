/* tf_internal.h -- helpers shared by the .npy and .safetensors readers/writers (not used outside tools/io). */
#ifndef MXFP8_TOOLS_TF_INTERNAL_H
#define MXFP8_TOOLS_TF_INTERNAL_H

#include <stdio.h>
#include <sys/types.h>

#include "tensorfile.h"

/* printf-style message into err (always NUL-terminated); returns -1 so callers can `return tf_err(...)`. */
int tf_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* An opened input file: a regular file and its size. */
typedef struct tf_infile {
    FILE *f;
    uint64_t size;
} tf_infile;
int tf_open_read(const char *path, tf_infile *in, char *err, size_t errlen);
/* Read exactly n bytes at offset off (already checked to lie inside the file); -1 + "truncated" message if not. */
int tf_read_at(tf_infile *in, uint64_t off, void *buf, size_t n, const char *path, char *err, size_t errlen);
void tf_close_read(tf_infile *in);

/* 1 if s[0..n) is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF). */
int tf_utf8_valid(const unsigned char *s, size_t n);

/* Atomic output: a temporary file next to `path`, renamed over it on commit, removed on abort or on a signal. */
typedef struct tf_atomic {
    FILE *f;
    char *tmp;
    char *final_path;
} tf_atomic;
int tf_atomic_open(tf_atomic *a, const char *path, char *err, size_t errlen);
int tf_atomic_write(tf_atomic *a, const void *buf, size_t n, char *err, size_t errlen);
int tf_atomic_commit(tf_atomic *a, char *err, size_t errlen);
void tf_atomic_abort(tf_atomic *a);

/* Format readers / writers (path checks and atomicity handled by the callers above). */
int tf_npy_load(const char *path, tf_set *out, char *err, size_t errlen);
int tf_npy_write(tf_atomic *a, const tf_tensor *t, char *err, size_t errlen);
int tf_npy_dtype_ok(tf_dtype d);
int tf_st_load(const char *path, tf_set *out, char *err, size_t errlen);
int tf_st_write(tf_atomic *a, const tf_set *set, char *err, size_t errlen);

#endif
