/*
 * fuzz_common.h -- shared by the libFuzzer targets of tests/fuzz.
 *
 * The .npy / .safetensors readers take a path, so the file-reader targets write each input to a private temporary
 * file (in /dev/shm when it exists, removed at exit) and call tf_load on it. Run by scripts/fuzz.sh with
 * -malloc_limit_mb, so an allocation far larger than any input (the readers must never allocate more than the
 * file holds) is reported as a crash.
 */
#ifndef MXFP8_FUZZ_COMMON_H
#define MXFP8_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/tensorfile.h"
#include "fuzz_assert.h"


static char fuzz_path[256];
static void fuzz_unlink(void) {
    if (fuzz_path[0]) unlink(fuzz_path);
}
static void fuzz_tmp_init(const char *ext) {
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(fuzz_path, sizeof fuzz_path, "%s/mxfp8_fuzz_%ld%s", dir, (long)getpid(), ext);
    atexit(fuzz_unlink);
}
static void fuzz_write(const uint8_t *data, size_t size) {
    FILE *f = fopen(fuzz_path, "wb");
    FUZZ_ASSERT(f != NULL, "cannot create %s", fuzz_path);
    FUZZ_ASSERT(fwrite(data, 1, size, f) == size, "cannot write %s", fuzz_path);
    fclose(f);
}

/* Load the input as a tensor file and check what the reader promises. */
static void fuzz_load_and_check(const uint8_t *data, size_t size) {
    fuzz_write(data, size);
    tf_set set;
    memset(&set, 0, sizeof set);
    char err[TF_ERR_LEN];
    err[0] = 0;
    int rc = tf_load(fuzz_path, &set, err, sizeof err);
    if (rc != 0) {
        FUZZ_ASSERT(rc == -1, "tf_load returned %d", rc);
        FUZZ_ASSERT(err[0] != 0 && strlen(err) < sizeof err, "an error without a message");
        FUZZ_ASSERT(set.n == 0, "a failed load left %d tensors", set.n);
    } else {
        size_t total = 0;
        for (int i = 0; i < set.n; i++) {
            const tf_tensor *t = set.t[i];
            FUZZ_ASSERT(t->name != NULL, "tensor %d has no name", i);
            FUZZ_ASSERT(t->ndim >= 0 && t->ndim <= MXFP8_MAX_DIMS, "ndim %d", t->ndim);
            FUZZ_ASSERT((unsigned)t->dtype < TF_NUM_DTYPES, "dtype %d", (int)t->dtype);
            int64_t n = tf_shape_numel(t->ndim, t->shape, tf_dtype_size(t->dtype));
            FUZZ_ASSERT(n == t->numel, "numel %lld vs shape %lld", (long long)t->numel, (long long)n);
            FUZZ_ASSERT(t->nbytes == (size_t)n * tf_dtype_size(t->dtype), "nbytes %zu", t->nbytes);
            FUZZ_ASSERT(t->nbytes <= size, "tensor of %zu bytes from a %zu-byte file", t->nbytes, size);
            total += t->nbytes;
            /* every byte is readable (ASan) */
            unsigned acc = 0;
            for (size_t b = 0; b < t->nbytes; b++) acc += ((const unsigned char *)t->data)[b];
            (void)acc;
            for (int j = 0; j < i; j++) FUZZ_ASSERT(strcmp(set.t[j]->name, t->name) != 0, "duplicate name %s", t->name);
        }
        FUZZ_ASSERT(total <= size, "%zu tensor bytes from a %zu-byte file", total, size);
    }
    tf_free(&set);
}

#endif
