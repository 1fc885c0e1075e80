/* fileaccess.h -- hardened file access shared by the tensor-file readers and writers (fileaccess.c; not used outside
 * tools/io): error messages, input files, UTF-8 validation, atomic output. */
#ifndef MXFP8_TOOLS_IO_FILEACCESS_H
#define MXFP8_TOOLS_IO_FILEACCESS_H

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
/* The directory part of `path` (".", "/" or the prefix before the last slash), malloc'd; NULL when out of memory. */
char *tf_dir_of(const char *path);

#endif /* MXFP8_TOOLS_IO_FILEACCESS_H */
