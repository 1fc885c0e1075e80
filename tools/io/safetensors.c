/*
 * safetensors.c -- hardened reader and writer of .safetensors files (header parsed with Debian's libcjson).
 *
 * Layout: uint64 LE header length n; n bytes of UTF-8 JSON {name: {"dtype", "shape", "data_offsets": [b, e]}, ...,
 * "__metadata__": {str: str}} (optionally padded with spaces); then the data buffer, with offsets relative to its
 * start. As in the reference implementation (huggingface/safetensors `Metadata::validate`): the header is at most
 * 100 MB, the ranges sorted by offset must tile the buffer exactly (first begins at 0, each begins where the
 * previous ended, no gaps, no overlaps, the last ends at the end of the file), and e - b == numel x dtype size.
 * JSON key order is free. Every size is checked against the file's length before anything is allocated.
 */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "fileaccess.h"
#include "formats.h"

static int dtype_from_name(const char *s) {
    for (int i = 0; i < TF_NUM_DTYPES; i++)
        if (!strcmp(s, tf_dtype_name((tf_dtype)i))) return i;
    return -1;
}

typedef struct {
    const char *name; /* points into the cJSON tree */
    int dtype, ndim;
    int64_t shape[MXFP8_MAX_DIMS];
    uint64_t begin, end;
} st_entry;

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}
static int cmp_offset(const void *a, const void *b) {
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* A JSON number that is a non-negative integer below 2^53 (exact in a double). */
static int json_uint(const cJSON *j, uint64_t *v) {
    if (!cJSON_IsNumber(j)) return -1;
    double d = j->valuedouble;
    if (!(d >= 0) || d > 9007199254740992.0 || d != (double)(uint64_t)d) return -1;
    *v = (uint64_t)d;
    return 0;
}

/* The 8-byte length prefix and the JSON header: *hdr (NUL-terminated, n bytes) and *root, an object followed by
 * nothing but whitespace. On failure both may be set; the caller frees them. */
static int st_read_header(tf_infile *in, const char *path, char **hdr, uint64_t *n_out, cJSON **root, char *err,
                          size_t errlen) {
    unsigned char pre[8];
    if (in->size < 8)
        return tf_err(err, errlen, "%s: truncated file: %llu bytes is too short for a safetensors header", path,
                      (unsigned long long)in->size);
    if (tf_read_at(in, 0, pre, 8, path, err, errlen)) return -1;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | pre[i];
    if (n > TF_MAX_HEADER)
        return tf_err(err, errlen, "%s: safetensors header length %llu is above the 100 MB limit", path,
                      (unsigned long long)n);
    if (n > in->size - 8)
        return tf_err(err, errlen, "%s: safetensors header length %llu runs past the end of the file (%llu bytes)",
                      path, (unsigned long long)n, (unsigned long long)in->size);
    if (n < 2) return tf_err(err, errlen, "%s: safetensors header is empty (length %llu)", path, (unsigned long long)n);
    char *h = *hdr = malloc(n + 1);
    if (!h) return tf_err(err, errlen, "out of memory");
    if (tf_read_at(in, 8, h, n, path, err, errlen)) return -1;
    h[n] = 0;
    *n_out = n;
    if (!tf_utf8_valid((unsigned char *)h, n))
        return tf_err(err, errlen, "%s: safetensors header is not valid UTF-8", path);
    if (memchr(h, 0, n) || strstr(h, "\\u0000"))
        return tf_err(err, errlen, "%s: safetensors header contains a NUL character", path);
    if (h[0] != '{')
        return tf_err(err, errlen, "%s: safetensors header does not start with '{' (not a safetensors file?)", path);
    const char *endp = NULL;
    *root = cJSON_ParseWithLengthOpts(h, n, &endp, 0);
    if (!*root || !cJSON_IsObject(*root))
        return tf_err(err, errlen, "%s: safetensors header is not a valid JSON object", path);
    for (const char *p = endp; p && p < h + n; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            return tf_err(err, errlen, "%s: safetensors header has trailing bytes after its JSON object", path);
    return 0;
}

/* The "__metadata__" entry: an object of strings (the first TF_MAX_META pairs kept in *out). */
static int st_check_metadata(const cJSON *it, tf_set *out, const char *path, char *err, size_t errlen) {
    if (!cJSON_IsObject(it)) return tf_err(err, errlen, "%s: '__metadata__' is not an object", path);
    for (const cJSON *m = it->child; m; m = m->next) {
        if (!cJSON_IsString(m))
            return tf_err(err, errlen, "%s: '__metadata__' value for '%s' is not a string", path,
                          m->string ? m->string : "");
        if (out->nmeta < TF_MAX_META && m->string && tf_meta_set(out, m->string, m->valuestring, err, errlen))
            return -1;
    }
    return 0;
}

/* One tensor entry {"dtype", "shape", "data_offsets"} into *e: a known dtype, at most MXFP8_MAX_DIMS exact
 * non-negative dimensions, offsets that span exactly numel x dtype size bytes. */
static int st_parse_entry(const cJSON *it, const char *name, st_entry *e, const char *path, char *err,
                          size_t errlen) {
    memset(e, 0, sizeof *e);
    e->name = name;
    if (!cJSON_IsObject(it)) return tf_err(err, errlen, "%s: tensor '%s': entry is not an object", path, name);
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(it, "dtype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(it, "shape");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
    if (!cJSON_IsString(jd) || !cJSON_IsArray(js) || !cJSON_IsArray(jo))
        return tf_err(err, errlen, "%s: tensor '%s': needs string 'dtype', array 'shape' and array 'data_offsets'",
                      path, name);
    e->dtype = dtype_from_name(jd->valuestring);
    if (e->dtype < 0)
        return tf_err(err, errlen,
                      "%s: tensor '%s': unknown or unsupported dtype '%.32s' (supported: F32 F16 BF16 F64 U8 I32 I64 "
                      "U32 F8_E4M3 F8_E5M2 F8_E8M0)",
                      path, name, jd->valuestring);
    int nd = cJSON_GetArraySize(js);
    if (nd > MXFP8_MAX_DIMS)
        return tf_err(err, errlen, "%s: tensor '%s': rank %d is above the %d dimensions mxfp8 supports", path, name,
                      nd, MXFP8_MAX_DIMS);
    for (const cJSON *d = js->child; d; d = d->next) {
        uint64_t v;
        if (json_uint(d, &v) || v > (uint64_t)INT64_MAX)
            return tf_err(err, errlen, "%s: tensor '%s': shape holds a negative, non-integer or too large dimension",
                          path, name);
        e->shape[e->ndim++] = (int64_t)v;
    }
    if (cJSON_GetArraySize(jo) != 2 || json_uint(jo->child, &e->begin) || json_uint(jo->child->next, &e->end))
        return tf_err(err, errlen, "%s: tensor '%s': data_offsets must be two non-negative integers", path, name);
    size_t esz = tf_dtype_size((tf_dtype)e->dtype);
    int64_t numel = tf_shape_numel(e->ndim, e->shape, esz);
    char sb[160];
    if (numel < 0)
        return tf_err(err, errlen, "%s: tensor '%s': shape %s overflows", path, name,
                      tf_shape_str(e->ndim, e->shape, sb, sizeof sb));
    if (e->end < e->begin)
        return tf_err(err, errlen, "%s: tensor '%s': data_offsets [%llu, %llu] are reversed", path, name,
                      (unsigned long long)e->begin, (unsigned long long)e->end);
    if ((uint64_t)numel * esz != e->end - e->begin)
        return tf_err(err, errlen, "%s: tensor '%s': data_offsets span %llu bytes but shape %s x %s needs %llu", path,
                      name, (unsigned long long)(e->end - e->begin), tf_shape_str(e->ndim, e->shape, sb, sizeof sb),
                      tf_dtype_name((tf_dtype)e->dtype), (unsigned long long)((uint64_t)numel * esz));
    return 0;
}

/* Every entry of the header, in ents[0..*ne) (grown as they validate: never sized from a count in the file). */
static int st_parse_entries(const cJSON *root, st_entry **ents, int *ne, tf_set *out, const char *path,
                            char *err, size_t errlen) {
    int cap = 0, nmeta = 0;
    for (const cJSON *it = root->child; it; it = it->next) {
        const char *name = it->string ? it->string : "";
        if (!tf_utf8_valid((const unsigned char *)name, strlen(name)))
            return tf_err(err, errlen, "%s: a tensor name is not valid UTF-8", path);
        if (!strcmp(name, "__metadata__")) {
            if (nmeta++) return tf_err(err, errlen, "%s: duplicate '__metadata__' entry", path);
            if (st_check_metadata(it, out, path, err, errlen)) return -1;
            continue;
        }
        if (*ne == cap) {
            int ncap = cap ? 2 * cap : 16;
            st_entry *grown = realloc(*ents, (size_t)ncap * sizeof **ents);
            if (!grown) return tf_err(err, errlen, "out of memory");
            *ents = grown;
            cap = ncap;
        }
        if (st_parse_entry(it, name, &(*ents)[(*ne)++], path, err, errlen)) return -1;
    }
    return 0;
}

/* No duplicate names; the ranges, sorted by offset (ents is left in that order), tile [0, buf_len) exactly. */
static int st_check_tiling(st_entry *ents, int ne, uint64_t buf_len, const char *path, char *err, size_t errlen) {
    if (ne > 1) qsort(ents, (size_t)ne, sizeof *ents, cmp_name);
    for (int i = 1; i < ne; i++)
        if (!strcmp(ents[i].name, ents[i - 1].name))
            return tf_err(err, errlen, "%s: duplicate tensor name '%s'", path, ents[i].name);
    if (ne > 1) qsort(ents, (size_t)ne, sizeof *ents, cmp_offset);
    uint64_t pos = 0;
    for (int i = 0; i < ne; i++) {
        const st_entry *e = &ents[i];
        if (e->end > buf_len)
            return tf_err(err, errlen, "%s: tensor '%s': data_offsets [%llu, %llu] run past the end of the data "
                          "(%llu bytes; truncated file?)", path, e->name, (unsigned long long)e->begin,
                          (unsigned long long)e->end, (unsigned long long)buf_len);
        if (e->begin < pos)
            return tf_err(err, errlen, "%s: tensor '%s': data_offsets [%llu, %llu] overlap the previous tensor '%s'",
                          path, e->name, (unsigned long long)e->begin, (unsigned long long)e->end, ents[i - 1].name);
        if (e->begin > pos)
            return tf_err(err, errlen, "%s: tensor '%s': data_offsets begin at %llu, leaving a gap after byte %llu",
                          path, e->name, (unsigned long long)e->begin, (unsigned long long)pos);
        pos = e->end;
    }
    if (pos != buf_len)
        return tf_err(err, errlen, "%s: %llu bytes of data follow the last tensor (the data buffer must end at the "
                      "last tensor)", path, (unsigned long long)(buf_len - pos));
    return 0;
}

int tf_st_load(const char *path, tf_set *out, char *err, size_t errlen) {
    tf_infile in;
    if (tf_open_read(path, &in, err, errlen)) return -1;
    int rc = -1, ne = 0;
    char *hdr = NULL;
    cJSON *root = NULL;
    st_entry *ents = NULL;
    uint64_t n = 0;
    if (st_read_header(&in, path, &hdr, &n, &root, err, errlen) ||
        st_parse_entries(root, &ents, &ne, out, path, err, errlen) ||
        st_check_tiling(ents, ne, in.size - 8 - n, path, err, errlen))
        goto done;
    /* Load, in offset order (sequential reads); the set keeps offset order. Total allocation <= file size. */
    for (int i = 0; i < ne; i++) {
        const st_entry *e = &ents[i];
        size_t nb = (size_t)(e->end - e->begin);
        void *data = malloc(nb ? nb : 1);
        if (!data) {
            tf_err(err, errlen, "%s: out of memory reading tensor '%s' (%zu bytes)", path, e->name, nb);
            goto done;
        }
        if (tf_read_at(&in, 8 + n + e->begin, data, nb, path, err, errlen) ||
            tf_add(out, e->name, (tf_dtype)e->dtype, e->ndim, e->shape, data, err, errlen)) {
            free(data);
            goto done;
        }
    }
    rc = 0;
done:
    free(ents);
    cJSON_Delete(root);
    free(hdr);
    tf_close_read(&in);
    return rc;
}

int tf_st_write(tf_atomic *a, const tf_set *set, char *err, size_t errlen) {
    cJSON *root = cJSON_CreateObject();
    char *json = NULL;
    int rc = -1;
    if (!root) return tf_err(err, errlen, "out of memory");
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    if (!meta || !cJSON_AddStringToObject(meta, "producer", "mxfp8")) goto oom;
    for (int i = 0; i < set->nmeta; i++)
        if (strcmp(set->meta_key[i], "producer") && !cJSON_AddStringToObject(meta, set->meta_key[i], set->meta_val[i]))
            goto oom;
    uint64_t off = 0;
    for (int i = 0; i < set->n; i++) {
        const tf_tensor *t = set->t[i];
        if (!strcmp(t->name, "__metadata__")) {
            tf_err(err, errlen, "a tensor may not be named '__metadata__'");
            goto out;
        }
        cJSON *e = cJSON_AddObjectToObject(root, t->name);
        if (!e || !cJSON_AddStringToObject(e, "dtype", tf_dtype_name(t->dtype))) goto oom;
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        cJSON *of = cJSON_AddArrayToObject(e, "data_offsets");
        if (!sh || !of) goto oom;
        for (int d = 0; d < t->ndim; d++)
            if (!cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]))) goto oom;
        if (!cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off)) ||
            !cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(off + t->nbytes))))
            goto oom;
        off += t->nbytes;
    }
    json = cJSON_PrintUnformatted(root);
    if (!json) goto oom;
    size_t jl = strlen(json);
    size_t padded = (jl + 7) / 8 * 8; /* keep the data buffer 8-byte aligned */
    unsigned char pre[8];
    for (int i = 0; i < 8; i++) pre[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    char spaces[8] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
    if (tf_atomic_write(a, pre, 8, err, errlen) || tf_atomic_write(a, json, jl, err, errlen) ||
        tf_atomic_write(a, spaces, padded - jl, err, errlen))
        goto out;
    for (int i = 0; i < set->n; i++)
        if (tf_atomic_write(a, set->t[i]->data, set->t[i]->nbytes, err, errlen)) goto out;
    rc = 0;
    goto out;
oom:
    tf_err(err, errlen, "out of memory");
out:
    free(json);
    cJSON_Delete(root);
    return rc;
}
