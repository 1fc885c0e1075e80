/*
 * tensorfile.c -- tf_load / tf_save and the path checks: the format of a file by its content (.npy or
 * .safetensors) and the writer for its name. See tensorfile.h for the contract.
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
#include "formats.h"

/* ---------------------------------------------------------------------------------------------------------- */
/* Dispatch on the content                                                                                     */
/* ---------------------------------------------------------------------------------------------------------- */
static int has_ext(const char *path, const char *ext) {
    size_t n = strlen(path), m = strlen(ext);
    return n > m && !strcasecmp(path + n - m, ext);
}

/* The format of a file by its first bytes: 1 .npy, 2 safetensors, 0 neither (or unreadable: the reader says). */
static int sniff(const char *path) {
    unsigned char b[9];
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(b, 1, sizeof b, f);
    fclose(f);
    if (n >= 6 && !memcmp(b, "\x93NUMPY", 6)) return 1;
    if (n == 9 && b[8] == '{') return 2;
    return 0;
}

int tf_load(const char *path, tf_set *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    int kind = sniff(path);
    if (!kind) { /* neither magic: a known extension's reader names what is wrong (truncated, bad header, ...) */
        if (has_ext(path, ".npy")) kind = 1;
        else if (has_ext(path, ".safetensors")) kind = 2;
        else {
            struct stat st;
            if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) kind = 2; /* the reader reports missing / not a file */
            else
                return tf_err(err, errlen, "%s: not a tensor file: neither a .npy file (magic \\x93NUMPY) nor a "
                              ".safetensors file (an 8-byte header length, then a JSON header '{...')", path);
        }
    }
    int rc = kind == 1 ? tf_npy_load(path, out, err, errlen) : tf_st_load(path, out, err, errlen);
    if (rc) tf_free(out);
    return rc;
}

int tf_check_names(const tf_set *set, const char *path, const char *const *known, int n, char *err, size_t errlen) {
    char bad[256] = "", list[1024] = "";
    int nbad = 0;
    for (int i = 0; i < set->n; i++) {
        int ok = 0;
        for (int k = 0; k < n && !ok; k++) ok = !strcmp(set->t[i]->name, known[k]);
        if (!ok && nbad++ < 4)
            snprintf(bad + strlen(bad), sizeof bad - strlen(bad), "%s'%s'", nbad > 1 ? ", " : "", set->t[i]->name);
    }
    if (!nbad) return 0;
    for (int k = 0; k < n; k++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? ", " : "", known[k]);
    return tf_err(err, errlen, "%s: unknown tensor%s %s%s in the bundle; the names it may hold: %s", path,
                  nbad > 1 ? "s" : "", bad, nbad > 4 ? " and more" : "", list);
}

int tf_check_writable(const char *path, int n_tensors, char *err, size_t errlen) {
    int npy = has_ext(path, ".npy");
    if (!npy && !has_ext(path, ".safetensors"))
        return tf_err(err, errlen, "%s: output file name must end in .safetensors or .npy", path);
    if (npy && n_tensors != 1)
        return tf_err(err, errlen, "%s: a .npy file holds one tensor but this output has %d; use .safetensors",
                      path, n_tensors);
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return tf_err(err, errlen, "%s: is a directory", path);
    char *dir = tf_dir_of(path);
    if (!dir) return tf_err(err, errlen, "out of memory");
    int ok = stat(dir, &st) == 0 && S_ISDIR(st.st_mode);
    int w = ok && access(dir, W_OK) == 0;
    int rc = 0;
    if (!ok) rc = tf_err(err, errlen, "%s: directory '%s' does not exist", path, dir);
    else if (!w) rc = tf_err(err, errlen, "%s: directory '%s' is not writable", path, dir);
    free(dir);
    return rc;
}

int tf_save(const char *path, const tf_set *set, char *err, size_t errlen) {
    int npy = has_ext(path, ".npy");
    if (tf_check_writable(path, set->n, err, errlen)) return -1;
    if (npy && !tf_npy_dtype_ok(set->t[0]->dtype))
        return tf_err(err, errlen, "%s: dtype %s cannot be stored in .npy (use .safetensors or --dtype f32)", path,
                      tf_dtype_name(set->t[0]->dtype));
    tf_atomic a;
    if (tf_atomic_open(&a, path, err, errlen)) return -1;
    int rc = npy ? tf_npy_write(&a, set->t[0], err, errlen) : tf_st_write(&a, set, err, errlen);
    if (rc) {
        tf_atomic_abort(&a);
        return -1;
    }
    return tf_atomic_commit(&a, err, errlen);
}
