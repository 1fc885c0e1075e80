/*
 * npy.c -- hardened reader and writer of NumPy .npy files (format versions 1.0, 2.0, 3.0).
 *
 * Layout: "\x93NUMPY", major, minor, header length (uint16 LE for v1, uint32 LE for v2/v3), then a Python dict
 * literal {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), } padded with spaces and a '\n', then the
 * raw little-endian data in C order. The reader parses the dict with a small strict tokenizer (exactly the three
 * keys, each once), accepts descr '<f4' '<f2' '<f8' '|u1' '<i4' '<i8' (and '<u4'), rejects Fortran order and
 * big-endian data, and requires the data to fill the rest of the file exactly.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "fileaccess.h"
#include "formats.h"

static const struct {
    const char *descr;
    tf_dtype dtype;
} k_npy_types[] = {
    {"<f4", TF_F32}, {"<f2", TF_F16}, {"<f8", TF_F64}, {"|u1", TF_U8}, {"<u1", TF_U8}, {"=u1", TF_U8},
    {"<i4", TF_I32}, {"<i8", TF_I64}, {"<u4", TF_U32},
};

int tf_npy_dtype_ok(tf_dtype d) {
    for (size_t i = 0; i < sizeof k_npy_types / sizeof k_npy_types[0]; i++)
        if (k_npy_types[i].dtype == d) return 1;
    return 0;
}

/* ---- a tiny strict parser for the header dict ---- */
typedef struct {
    const char *s, *end;
} cur;

static void skip_ws(cur *c) {
    while (c->s < c->end && (*c->s == ' ' || *c->s == '\t' || *c->s == '\n' || *c->s == '\r')) c->s++;
}

static int take(cur *c, char ch) {
    skip_ws(c);
    if (c->s < c->end && *c->s == ch) {
        c->s++;
        return 1;
    }
    return 0;
}

/* A quoted Python string without escapes into out (max outlen-1 chars). */
static int parse_str(cur *c, char *out, size_t outlen) {
    skip_ws(c);
    if (c->s >= c->end || (*c->s != '\'' && *c->s != '"')) return -1;
    char q = *c->s++;
    size_t n = 0;
    while (c->s < c->end && *c->s != q) {
        if (*c->s == '\\' || n + 1 >= outlen) return -1;
        out[n++] = *c->s++;
    }
    if (c->s >= c->end) return -1;
    c->s++;
    out[n] = 0;
    return 0;
}

static int parse_word(cur *c, const char *w) {
    skip_ws(c);
    size_t n = strlen(w);
    if ((size_t)(c->end - c->s) >= n && !memcmp(c->s, w, n)) {
        c->s += n;
        return 1;
    }
    return 0;
}

static int parse_shape(cur *c, int *ndim, int64_t *shape, const char *path, char *err, size_t errlen) {
    if (!take(c, '(')) return tf_err(err, errlen, "%s: bad .npy header: 'shape' is not a tuple", path);
    int n = 0;
    for (;;) {
        skip_ws(c);
        if (take(c, ')')) break;
        if (c->s >= c->end || !isdigit((unsigned char)*c->s))
            return tf_err(err, errlen, "%s: bad .npy header: 'shape' holds a non-integer or negative dimension",
                          path);
        int64_t v = 0;
        while (c->s < c->end && isdigit((unsigned char)*c->s)) {
            if (v > (INT64_MAX - 9) / 10)
                return tf_err(err, errlen, "%s: bad .npy header: a dimension overflows int64", path);
            v = v * 10 + (*c->s++ - '0');
        }
        parse_word(c, "L"); /* Python 2 long suffix */
        if (n >= MXFP8_MAX_DIMS)
            return tf_err(err, errlen, "%s: rank above the %d dimensions mxfp8 supports", path, MXFP8_MAX_DIMS);
        shape[n++] = v;
        if (take(c, ',')) continue;
        if (take(c, ')')) break;
        return tf_err(err, errlen, "%s: bad .npy header: malformed 'shape' tuple", path);
    }
    *ndim = n;
    return 0;
}

/* The magic, the version and the header text: *hdr (NUL-terminated, *hlen bytes) starting at file offset *hoff.
 * On failure *hdr may be set; the caller frees it. */
static int npy_read_header(tf_infile *in, const char *path, char **hdr, uint64_t *hlen, uint64_t *hoff, char *err,
                           size_t errlen) {
    unsigned char pre[12];
    const size_t nm = in->size < 6 ? (size_t)in->size : 6; /* the magic first: a short text file is no .npy */
    if (tf_read_at(in, 0, pre, nm, path, err, errlen)) return -1;
    if (memcmp(pre, "\x93NUMPY", nm) != 0) return tf_err(err, errlen, "%s: not a .npy file (bad magic)", path);
    if (in->size < 10)
        return tf_err(err, errlen, "%s: truncated file: %llu bytes is too short for a .npy header", path,
                      (unsigned long long)in->size);
    if (tf_read_at(in, 0, pre, 10, path, err, errlen)) return -1;
    int major = pre[6];
    if (major == 1) {
        *hlen = (uint64_t)pre[8] | (uint64_t)pre[9] << 8;
        *hoff = 10;
    } else if (major == 2 || major == 3) {
        if (tf_read_at(in, 0, pre, 12, path, err, errlen)) return -1;
        *hlen = (uint64_t)pre[8] | (uint64_t)pre[9] << 8 | (uint64_t)pre[10] << 16 | (uint64_t)pre[11] << 24;
        *hoff = 12;
    } else {
        return tf_err(err, errlen, "%s: unsupported .npy format version %d.%d", path, major, pre[7]);
    }
    if (*hlen > TF_MAX_HEADER)
        return tf_err(err, errlen, "%s: .npy header length %llu is above the 100 MB limit", path,
                      (unsigned long long)*hlen);
    if (*hoff + *hlen > in->size)
        return tf_err(err, errlen, "%s: .npy header length %llu runs past the end of the file (%llu bytes)", path,
                      (unsigned long long)*hlen, (unsigned long long)in->size);
    char *h = *hdr = malloc(*hlen + 1);
    if (!h) return tf_err(err, errlen, "out of memory");
    if (tf_read_at(in, *hoff, h, *hlen, path, err, errlen)) return -1;
    h[*hlen] = 0;
    if (!tf_utf8_valid((unsigned char *)h, *hlen) || memchr(h, 0, *hlen))
        return tf_err(err, errlen, "%s: .npy header is not valid text", path);
    return 0;
}

/* The header dict {'descr': ..., 'fortran_order': ..., 'shape': (...), }: exactly these three keys, each once. */
static int npy_parse_dict(const char *hdr, uint64_t hlen, char descr[32], int *fortran, int *ndim, int64_t *shape,
                          const char *path, char *err, size_t errlen) {
    cur c = {hdr, hdr + hlen};
    char key[32];
    int have_descr = 0, have_fo = 0, have_shape = 0;
    if (!take(&c, '{')) return tf_err(err, errlen, "%s: bad .npy header: not a dict", path);
    for (;;) {
        if (take(&c, '}')) break;
        if (parse_str(&c, key, sizeof key) || !take(&c, ':'))
            return tf_err(err, errlen, "%s: bad .npy header: expected 'key': value", path);
        int *have = !strcmp(key, "descr") ? &have_descr : !strcmp(key, "fortran_order") ? &have_fo
                  : !strcmp(key, "shape") ? &have_shape : NULL;
        if (!have) return tf_err(err, errlen, "%s: bad .npy header: unexpected key '%s'", path, key);
        if ((*have)++) return tf_err(err, errlen, "%s: bad .npy header: duplicate key '%s'", path, key);
        if (have == &have_descr) {
            skip_ws(&c);
            if (c.s < c.end && (*c.s == '[' || *c.s == '{'))
                return tf_err(err, errlen, "%s: structured .npy dtypes are not supported", path);
            if (parse_str(&c, descr, 32))
                return tf_err(err, errlen, "%s: bad .npy header: 'descr' is not a string", path);
        } else if (have == &have_fo) {
            if (parse_word(&c, "True")) *fortran = 1;
            else if (parse_word(&c, "False")) *fortran = 0;
            else return tf_err(err, errlen, "%s: bad .npy header: 'fortran_order' is not True/False", path);
        } else if (parse_shape(&c, ndim, shape, path, err, errlen)) {
            return -1;
        }
        if (take(&c, ',')) continue;
        if (take(&c, '}')) break;
        return tf_err(err, errlen, "%s: bad .npy header: expected ',' or '}'", path);
    }
    skip_ws(&c);
    if (c.s != c.end) return tf_err(err, errlen, "%s: bad .npy header: trailing characters after the dict", path);
    if (!have_descr || !have_fo || !have_shape)
        return tf_err(err, errlen, "%s: bad .npy header: missing %s", path,
                      !have_descr ? "'descr'" : !have_fo ? "'fortran_order'" : "'shape'");
    return 0;
}

/* The dtype of a descr string, or -1 with the error (big-endian, unknown, Fortran order). */
static int npy_dtype(const char *descr, int fortran, const char *path, char *err, size_t errlen) {
    if (fortran)
        return tf_err(err, errlen,
                      "%s: Fortran-order arrays are not supported; save np.ascontiguousarray(x) instead", path);
    for (size_t i = 0; i < sizeof k_npy_types / sizeof k_npy_types[0]; i++)
        if (!strcmp(descr, k_npy_types[i].descr)) return (int)k_npy_types[i].dtype;
    if (descr[0] == '>')
        return tf_err(err, errlen, "%s: big-endian dtype '%s' is not supported; use little-endian ('<')", path,
                      descr);
    return tf_err(err, errlen,
                  "%s: unsupported .npy dtype '%s' (supported: float32, float16, float64, uint8, int32, int64)", path,
                  descr);
}

int tf_npy_load(const char *path, tf_set *out, char *err, size_t errlen) {
    tf_infile in;
    if (tf_open_read(path, &in, err, errlen)) return -1;
    int rc = -1, fortran = 0, ndim = 0, dt;
    char *hdr = NULL, descr[32] = "";
    void *data = NULL;
    uint64_t hlen = 0, hoff = 0;
    int64_t shape[MXFP8_MAX_DIMS] = {0};
    if (npy_read_header(&in, path, &hdr, &hlen, &hoff, err, errlen) ||
        npy_parse_dict(hdr, hlen, descr, &fortran, &ndim, shape, path, err, errlen) ||
        (dt = npy_dtype(descr, fortran, path, err, errlen)) < 0)
        goto done;
    size_t esz = tf_dtype_size((tf_dtype)dt);
    int64_t numel = tf_shape_numel(ndim, shape, esz);
    if (numel < 0) {
        tf_err(err, errlen, "%s: shape's element count overflows", path);
        goto done;
    }
    uint64_t nbytes = (uint64_t)numel * esz, have = in.size - hoff - hlen;
    if (have != nbytes) {
        if (have < nbytes)
            tf_err(err, errlen, "%s: truncated file: shape x dtype needs %llu data bytes, the file holds %llu", path,
                   (unsigned long long)nbytes, (unsigned long long)have);
        else
            tf_err(err, errlen, "%s: %llu bytes past the end of the array data (shape x dtype = %llu bytes)", path,
                   (unsigned long long)(have - nbytes), (unsigned long long)nbytes);
        goto done;
    }
    data = malloc(nbytes ? nbytes : 1);
    if (!data) {
        tf_err(err, errlen, "out of memory");
        goto done;
    }
    if (tf_read_at(&in, hoff + hlen, data, nbytes, path, err, errlen)) goto done;
    /* Name: the file's stem. */
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char name[256];
    snprintf(name, sizeof name, "%.*s", (int)(strlen(base) > 4 ? strlen(base) - 4 : strlen(base)), base);
    if (tf_add(out, name, (tf_dtype)dt, ndim, shape, data, err, errlen)) goto done;
    data = NULL;
    rc = 0;
done:
    free(data);
    free(hdr);
    tf_close_read(&in);
    return rc;
}

int tf_npy_write(tf_atomic *a, const tf_tensor *t, char *err, size_t errlen) {
    const char *descr = NULL;
    for (size_t i = 0; i < sizeof k_npy_types / sizeof k_npy_types[0]; i++)
        if (k_npy_types[i].dtype == t->dtype) {
            descr = k_npy_types[i].descr;
            break;
        }
    if (!descr) return tf_err(err, errlen, "dtype %s cannot be stored in .npy", tf_dtype_name(t->dtype));
    char dict[512];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int i = 0; i < t->ndim; i++) n += snprintf(dict + n, sizeof dict - (size_t)n, "%lld, ", (long long)t->shape[i]);
    if (t->ndim > 1) n -= 2; /* "(3, 4)" ; a 1-D shape keeps its comma: "(5,)" */
    else if (t->ndim == 1) n -= 1;
    n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
    /* Pad with spaces so that magic + length + header is a multiple of 64, ending in '\n'. */
    size_t total = 10 + (size_t)n + 1;
    size_t pad = (64 - total % 64) % 64;
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0, 0};
    size_t hlen = (size_t)n + pad + 1;
    pre[8] = (unsigned char)(hlen & 0xFF);
    pre[9] = (unsigned char)(hlen >> 8);
    char spaces[64];
    memset(spaces, ' ', sizeof spaces);
    if (tf_atomic_write(a, pre, 10, err, errlen) || tf_atomic_write(a, dict, (size_t)n, err, errlen) ||
        tf_atomic_write(a, spaces, pad, err, errlen) || tf_atomic_write(a, "\n", 1, err, errlen) ||
        tf_atomic_write(a, t->data, t->nbytes, err, errlen))
        return -1;
    return 0;
}
