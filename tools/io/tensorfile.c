/*
 * tensorfile.c -- tensor sets, dtype tables, hardened file access and atomic output for the mxfp8 CLI.
 * See tensorfile.h for the contract.
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

#include "tf_internal.h"

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

int tf_err(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
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

/* ---------------------------------------------------------------------------------------------------------- */
/* Input files                                                                                                  */
/* ---------------------------------------------------------------------------------------------------------- */
int tf_open_read(const char *path, tf_infile *in, char *err, size_t errlen) {
    memset(in, 0, sizeof *in);
    in->f = fopen(path, "rb");
    if (!in->f) return tf_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(in->f), &st) != 0) {
        int e = errno;
        tf_close_read(in);
        return tf_err(err, errlen, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        tf_close_read(in);
        return tf_err(err, errlen, "%s: not a regular file", path);
    }
    in->size = (uint64_t)st.st_size;
    return 0;
}

int tf_read_at(tf_infile *in, uint64_t off, void *buf, size_t n, const char *path, char *err, size_t errlen) {
    if (off > in->size || n > in->size - off)
        return tf_err(err, errlen, "%s: truncated file: needs bytes [%llu, %llu) but holds %llu", path,
                      (unsigned long long)off, (unsigned long long)(off + n), (unsigned long long)in->size);
    if (n == 0) return 0;
    if (fseeko(in->f, (off_t)off, SEEK_SET) != 0 || fread(buf, 1, n, in->f) != n)
        return tf_err(err, errlen, "%s: read error or truncated file at offset %llu", path, (unsigned long long)off);
    return 0;
}

void tf_close_read(tf_infile *in) {
    if (in->f) fclose(in->f);
    in->f = NULL;
}

int tf_utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        int len;
        unsigned cp;
        if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
        else return 0;
        if (n - i < (size_t)len) return 0;
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += (size_t)len;
    }
    return 1;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Atomic output                                                                                                */
/* ---------------------------------------------------------------------------------------------------------- */
/* The temporary file being written, removed by the signal handler if the process is interrupted. */
static char g_tmp_path[PATH_MAX + 64];
static volatile sig_atomic_t g_tmp_live;
static struct sigaction g_old_int, g_old_term, g_old_hup;

static void on_signal(int sig) {
    if (g_tmp_live) unlink(g_tmp_path);
    g_tmp_live = 0;
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &g_old_int);
    sigaction(SIGTERM, &sa, &g_old_term);
    sigaction(SIGHUP, &sa, &g_old_hup);
}

static void restore_handlers(void) {
    sigaction(SIGINT, &g_old_int, NULL);
    sigaction(SIGTERM, &g_old_term, NULL);
    sigaction(SIGHUP, &g_old_hup, NULL);
}

static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

int tf_atomic_open(tf_atomic *a, const char *path, char *err, size_t errlen) {
    memset(a, 0, sizeof *a);
    size_t len = strlen(path);
    if (len == 0 || len > PATH_MAX) return tf_err(err, errlen, "bad output path");
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!*base) return tf_err(err, errlen, "%s: output path names a directory", path);
    char *tmp = malloc(len + 32);
    if (!tmp) return tf_err(err, errlen, "out of memory");
    snprintf(tmp, len + 32, "%.*s.%s.tmp-XXXXXX", (int)(base - path), path, base);
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old); /* no signal between creating the file and recording its name */
    int fd = mkstemp(tmp);
    int e = errno;
    if (fd >= 0) {
        snprintf(g_tmp_path, sizeof g_tmp_path, "%s", tmp);
        g_tmp_live = 1;
        install_handlers();
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (fd < 0) {
        free(tmp);
        return tf_err(err, errlen, "%s: cannot create a file in its directory: %s", path, strerror(e));
    }
    mode_t um = umask(0);
    umask(um);
    fchmod(fd, 0666 & ~um);
    a->f = fdopen(fd, "wb");
    if (!a->f) {
        e = errno;
        close(fd);
        unlink(tmp);
        g_tmp_live = 0;
        restore_handlers();
        free(tmp);
        return tf_err(err, errlen, "%s: %s", path, strerror(e));
    }
    a->tmp = tmp;
    a->final_path = strdup(path);
    if (!a->final_path) {
        tf_atomic_abort(a);
        return tf_err(err, errlen, "out of memory");
    }
    return 0;
}

int tf_atomic_write(tf_atomic *a, const void *buf, size_t n, char *err, size_t errlen) {
    if (n && fwrite(buf, 1, n, a->f) != n)
        return tf_err(err, errlen, "%s: write failed: %s", a->final_path, strerror(errno));
    return 0;
}

void tf_atomic_abort(tf_atomic *a) {
    if (a->f) fclose(a->f);
    if (a->tmp) unlink(a->tmp);
    if (a->tmp) {
        g_tmp_live = 0;
        restore_handlers();
    }
    free(a->tmp);
    free(a->final_path);
    memset(a, 0, sizeof *a);
}

int tf_atomic_commit(tf_atomic *a, char *err, size_t errlen) {
    int rc = 0;
    if (fflush(a->f) != 0 || fsync(fileno(a->f)) != 0) {
        rc = tf_err(err, errlen, "%s: write failed: %s", a->final_path, strerror(errno));
    }
    int cr = fclose(a->f);
    a->f = NULL;
    if (!rc && cr != 0) rc = tf_err(err, errlen, "%s: write failed: %s", a->final_path, strerror(errno));
    if (!rc && rename(a->tmp, a->final_path) != 0)
        rc = tf_err(err, errlen, "%s: cannot rename the finished file into place: %s", a->final_path,
                    strerror(errno));
    if (rc) {
        tf_atomic_abort(a);
        return rc;
    }
    g_tmp_live = 0;
    restore_handlers();
    /* Make the rename itself durable. */
    char *dir = dir_of(a->final_path);
    if (dir) {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
        free(dir);
    }
    free(a->tmp);
    free(a->final_path);
    memset(a, 0, sizeof *a);
    return 0;
}

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
    char *dir = dir_of(path);
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
