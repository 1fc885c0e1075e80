/* harness.c -- fixtures, the generic cases and the case runner of test_validation (see harness.h). */
#include "harness.h"

long tu_failures = 0, tu_checks = 0;

/* ---- fixture construction ---------------------------------------------------------------------------- */
void fill_input(unsigned char *b, mxfp8_dtype dt) {
    int n = BUFSZ / (int)mxfp8_dtype_size(dt);
    for (int i = 0; i < n; i++) {
        float v = (float)((i * 7) % 13 - 6) * 0.375f;
        switch (dt) {
        case MXFP8_DTYPE_F32: ((float *)b)[i] = v; break;
        case MXFP8_DTYPE_F64: ((double *)b)[i] = v; break;
        case MXFP8_DTYPE_BF16: ((uint16_t *)b)[i] = mxfp8_fp32_to_bf16(v); break;
        case MXFP8_DTYPE_F16: ((uint16_t *)b)[i] = mxfp8_fp32_to_fp16(v); break;
        case MXFP8_DTYPE_E4M3: case MXFP8_DTYPE_E5M2: case MXFP8_DTYPE_U8: b[i] = (unsigned char)((i * 37) & 0x5F); break;
        case MXFP8_DTYPE_E8M0: b[i] = (unsigned char)(120 + i % 9); break;
        case MXFP8_DTYPE_U32: ((uint32_t *)b)[i] = 0x1F2F3F4Fu + (uint32_t)i; break;
        default: ((int32_t *)b)[i] = 0; break;
        }
    }
}

int add(fx *f, const char *name, mxfp8_dtype dt, int nd, int64_t s0, int64_t s1, int64_t s2, int64_t s3,
        unsigned flags) {
    int i = f->nt++;
    int64_t shape[4] = {s0, s1, s2, s3};
    if (i >= MAXT) {
        fprintf(stderr, "test_validation: too many tensors\n");
        exit(2);
    }
    f->buf[i] = tu_alloc(BUFSZ);
    f->image[i] = tu_alloc(BUFSZ);
    f->orig[i] = tu_alloc(BUFSZ);
    if (flags & F_OUT) memset(f->buf[i], SENTINEL, BUFSZ);
    else fill_input(f->buf[i], dt);
    f->t[i] = mxfp8_tensor_make(f->buf[i], dt, nd, shape);
    f->tp[i] = &f->t[i];
    f->name[i] = name;
    f->flags[i] = flags;
    return i;
}

static void fx_free(fx *f) {
    for (int i = 0; i < f->nt; i++) {
        free(f->buf[i]);
        free(f->image[i]);
        free(f->orig[i]);
    }
}

/* ---- checks ------------------------------------------------------------------------------------------- */
static int is_ident(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }
int has_word(const char *s, const char *word) {
    size_t n = strlen(word);
    for (const char *p = strstr(s, word); p; p = strstr(p + 1, word))
        if ((p == s || !is_ident(p[-1])) && !is_ident(p[n])) return 1;
    return 0;
}

long n_cases;
static mxfp8_status g_alt; /* a second accepted status, for the case being run (0: none) */

/* Run one case on the fixture (already mutated by the caller from a fresh state). */
/* The fixture's validate-and-size entry on the case: status and message, and that it wrote nothing. */
static mxfp8_status run_validate(fx *f, const char *what, char *msg, size_t n) {
    size_t bytes = 12345;
    mxfp8_status st = f->validate(f, &bytes);
    snprintf(msg, n, "%s", mxfp8_last_error_message());
    TU_CHECK(st == MXFP8_OK || bytes == 0, "%s [%s]: the _validate entry failed but sized %zu bytes", f->fn, what,
             bytes);
    for (int i = 0; i < f->nt; i++)
        TU_CHECK(memcmp(f->buf[i], f->image[i], BUFSZ) == 0, "%s [%s]: the _validate entry wrote %s", f->fn, what,
                 f->name[i]);
    return st;
}

static void expect(fx *f, const char *what, mxfp8_status want, const char *word1, const char *word2) {
    n_cases++;
    char vmsg[1024];
    mxfp8_status vst = f->validate ? run_validate(f, what, vmsg, sizeof vmsg) : MXFP8_OK;
    mxfp8_status st = f->call(f);
    const char *msg = mxfp8_last_error_message();
    if (f->validate) {
        TU_CHECK(vst == st, "%s [%s]: the _validate entry returned %d (%s), the call %d (%s)", f->fn, what, (int)vst,
                 mxfp8_status_string(vst), (int)st, mxfp8_status_string(st));
        TU_CHECK(st == MXFP8_OK || strcmp(vmsg, msg) == 0, "%s [%s]: the _validate entry said \"%s\", the call \"%s\"",
                 f->fn, what, vmsg, msg);
    }
    if (g_alt && st == g_alt) want = g_alt;
    TU_CHECK(st == want, "%s [%s]: status %d (%s), want %d (%s); message: %s", f->fn, what, (int)st,
             mxfp8_status_string(st), (int)want, mxfp8_status_string(want), msg);
    if (st == MXFP8_OK) return;
    TU_CHECK(strncmp(msg, f->fn, strlen(f->fn)) == 0 && msg[strlen(f->fn)] == ':',
             "%s [%s]: message does not start with the function name: \"%s\"", f->fn, what, msg);
    if (word1 && !strcmp(word1, "*")) { /* any parameter of the call */
        int named = 0;
        for (int i = 0; i < f->nt; i++) named |= has_word(msg, f->name[i]);
        TU_CHECK(named, "%s [%s]: message names no parameter: \"%s\"", f->fn, what, msg);
    } else if (word1) TU_CHECK(has_word(msg, word1), "%s [%s]: message does not name '%s': \"%s\"", f->fn, what, word1, msg);
    if (word2) TU_CHECK(strstr(msg, word2) != NULL, "%s [%s]: message does not show '%s': \"%s\"", f->fn, what, word2, msg);
    for (int i = 0; i < f->nt; i++) {
        if (memcmp(f->buf[i], f->image[i], BUFSZ) != 0) {
            long first = 0;
            while (f->buf[i][first] == f->image[i][first]) first++;
            TU_CHECK(0, "%s [%s]: %s %s was written on error (first changed byte %ld)", f->fn, what,
                     (f->flags[i] & F_OUT) ? "output" : "input", f->name[i], first);
        }
    }
}

/* Restore every buffer and view from the fixture's saved state. */
typedef struct saved {
    fx f;
} saved;
static void restore(fx *f, const saved *s) {
    unsigned char *bufs[MAXT], *imgs[MAXT], *origs[MAXT];
    for (int i = s->f.nt; i < f->nt; i++) { /* tensors a case added */
        free(f->buf[i]);
        free(f->image[i]);
        free(f->orig[i]);
    }
    for (int i = 0; i < s->f.nt; i++) {
        bufs[i] = f->buf[i];
        imgs[i] = f->image[i];
        origs[i] = f->orig[i];
    }
    *f = s->f;
    for (int i = 0; i < f->nt; i++) {
        f->buf[i] = bufs[i];
        f->image[i] = imgs[i];
        f->orig[i] = origs[i];
        memcpy(f->buf[i], f->orig[i], BUFSZ);
        memcpy(f->image[i], f->orig[i], BUFSZ);
        f->tp[i] = &f->t[i];
    }
    /* pointers into the fixture itself */
    if (s->f.qpp) f->qpp = &f->qp;
    if (s->f.cfgp) f->cfgp = &f->cfg;
    if (s->f.cfgp2) f->cfgp2 = &f->cfg2;
    if (s->f.argp) f->argp = &f->mb;
    if (s->f.nblocks_outp) f->nblocks_outp = &f->nblocks_out;
    if (s->f.cmpp) f->cmpp = &f->cmp;
    if (s->f.mcp) f->mcp = &f->mc;
}

/* ---- generic mutations -------------------------------------------------------------------------------- */
typedef enum {
    GEN_NULLPTR, GEN_DATA_NULL, GEN_NEG_SHAPE, GEN_OVERFLOW, GEN_STRIDE_MAX, GEN_STRIDE_SPAN, GEN_DTYPE_BAD,
    GEN_DTYPE_UNKNOWN, GEN_NDIM_BIG, GEN_RANK, GEN_EXTENT, GEN_ALIAS, GEN_ZERO_STRIDE, GEN_OVERLAP, GEN_COUNT
} gen_kind;
static const char *gen_name[] = {"NULL pointer", "NULL data", "negative extent", "shape product overflows",
                                 "stride INT64_MAX", "stride span overflows", "unaccepted dtype", "unknown dtype",
                                 "ndim > MAX_DIMS", "rank + 1", "extent + 1", "alias", "zero stride",
                                 "overlapping dimensions"};

static int big_dim(const mxfp8_tensor *t) {
    int d = -1;
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] >= 2 && (d < 0 || t->shape[i] > t->shape[d])) d = i;
    return d;
}

static void run_generic(fx *f, const saved *s) {
    char what[160];
    for (int i = 0; i < s->f.nt; i++) {
        if (s->f.flags[i] & F_NOGEN) continue;
        for (int g = 0; g < GEN_COUNT; g++) {
            restore(f, s);
            mxfp8_tensor *t = &f->t[i];
            int d = big_dim(t);
            snprintf(what, sizeof what, "%s: %s", f->name[i], gen_name[g]);
            switch ((gen_kind)g) {
            case GEN_NULLPTR:
                if (!(f->flags[i] & F_BYPTR)) break;
                f->tp[i] = NULL;
                expect(f, what, MXFP8_ERR_NULL_POINTER, f->name[i], NULL);
                break;
            case GEN_DATA_NULL:
                if (f->flags[i] & F_OPT) break;
                t->data = NULL;
                expect(f, what, MXFP8_ERR_NULL_POINTER, f->name[i], NULL);
                break;
            case GEN_NEG_SHAPE:
                if (t->ndim < 1) break;
                t->shape[0] = -3;
                expect(f, what, MXFP8_ERR_SIZE_OVERFLOW, f->name[i], "-3");
                break;
            case GEN_OVERFLOW:
                if (t->ndim < 2) break;
                t->shape[0] = (int64_t)1 << 32;
                t->shape[1] = (int64_t)1 << 32;
                expect(f, what, MXFP8_ERR_SIZE_OVERFLOW, f->name[i], NULL);
                break;
            case GEN_STRIDE_MAX:
                if (d < 0) break;
                t->strides[d] = INT64_MAX;
                expect(f, what, MXFP8_ERR_BAD_STRIDES, f->name[i], NULL);
                break;
            case GEN_STRIDE_SPAN: /* the extent in elements fits int64, in bytes it does not (or, 1-byte: just not) */
                if (d < 0) break;
                t->strides[d] = (INT64_MAX / (int64_t)mxfp8_dtype_size(t->dtype)) / (t->shape[d] - 1) + 1;
                expect(f, what, MXFP8_ERR_BAD_STRIDES, f->name[i], NULL);
                break;
            case GEN_DTYPE_BAD:
                t->dtype = t->dtype == MXFP8_DTYPE_I32 ? MXFP8_DTYPE_F32 : MXFP8_DTYPE_I32;
                expect(f, what, MXFP8_ERR_DTYPE, f->name[i], NULL);
                break;
            case GEN_DTYPE_UNKNOWN:
                t->dtype = (mxfp8_dtype)99;
                expect(f, what, MXFP8_ERR_DTYPE, f->name[i], "99");
                break;
            case GEN_NDIM_BIG:
                t->ndim = MXFP8_MAX_DIMS + 1;
                expect(f, what, MXFP8_ERR_INVALID_ARGUMENT, f->name[i], "7");
                break;
            case GEN_RANK:
                if ((f->flags[i] & F_FLEXRANK) || t->ndim >= MXFP8_MAX_DIMS) break;
                t->shape[t->ndim] = 1;
                t->strides[t->ndim] = 1;
                t->ndim++;
                expect(f, what, MXFP8_ERR_SHAPE_MISMATCH, f->name[i], NULL);
                break;
            case GEN_EXTENT:
                if (f->flags[i] & F_NOEXTENT) break;
                for (int k = 0; k < t->ndim; k++) {
                    restore(f, s);
                    f->t[i].shape[k] += 1;
                    /* keep the view contiguous row-major so only the extent changes */
                    f->t[i] = mxfp8_tensor_make(f->t[i].data, f->t[i].dtype, f->t[i].ndim, f->t[i].shape);
                    char w2[200];
                    snprintf(w2, sizeof w2, "%s (dim %d)", what, k);
                    /* a mismatch between two tensors may be reported on either */
                    g_alt = f->extent_alt;
                    expect(f, w2, MXFP8_ERR_SHAPE_MISMATCH, "*", NULL);
                    g_alt = 0;
                }
                break;
            case GEN_ALIAS:
                if (!(f->flags[i] & F_OUT)) break;
                for (int j = 0; j < s->f.nt; j++) {
                    if (j == i || (s->f.flags[j] & F_NOGEN) || !s->f.t[j].data) continue;
                    restore(f, s);
                    f->t[i].data = f->buf[j];
                    char w2[200];
                    snprintf(w2, sizeof w2, "%s: %s overlaps %s", f->name[i], gen_name[g], f->name[j]);
                    expect(f, w2, MXFP8_ERR_ALIASING, f->name[i], NULL);
                }
                break;
            case GEN_ZERO_STRIDE:
                if (!(f->flags[i] & F_OUT) || d < 0) break;
                t->strides[d] = 0;
                expect(f, what, MXFP8_ERR_BAD_STRIDES, f->name[i], NULL);
                break;
            case GEN_OVERLAP: /* two dimensions of extent > 1 with stride 1: elements repeat */
                if (!(f->flags[i] & F_OUT) || d < 0) break;
                for (int k = 0; k < t->ndim; k++)
                    if (k != d && t->shape[k] >= 2) {
                        t->strides[k] = 1;
                        t->strides[d] = 1;
                        expect(f, what, MXFP8_ERR_BAD_STRIDES, f->name[i], NULL);
                        break;
                    }
                break;
            case GEN_COUNT: break;
            }
        }
    }
}

void run_fixture(const char *label, void (*setup)(fx *), const special *sp, int nsp) {
    fx f;
    memset(&f, 0, sizeof f);
    setup(&f);
    for (int i = 0; i < f.nt; i++) {
        memcpy(f.orig[i], f.buf[i], BUFSZ);
        memcpy(f.image[i], f.buf[i], BUFSZ);
    }
    saved *s = tu_alloc(sizeof *s);
    s->f = f;
    /* baseline: valid, succeeds, writes an output */
    if (f.validate) {
        size_t bytes = 0;
        mxfp8_status vst = f.validate(&f, &bytes);
        TU_CHECK(vst == MXFP8_OK, "%s: the _validate entry refused the valid call: %s", label,
                 mxfp8_last_error_message());
    }
    mxfp8_status st = f.call(&f);
    TU_CHECK(st == MXFP8_OK, "%s: the fixture's valid call failed: %s: %s", label, mxfp8_status_string(st),
             mxfp8_last_error_message());
    int wrote = 0;
    for (int i = 0; i < f.nt; i++)
        if ((f.flags[i] & F_OUT) && memcmp(f.buf[i], f.image[i], BUFSZ) != 0) wrote = 1;
    TU_CHECK(wrote || f.nt == 0, "%s: the fixture's valid call wrote no output", label);
    long before = n_cases;
    run_generic(&f, s);
    for (int k = 0; k < nsp; k++) {
        restore(&f, s);
        sp[k].mutate(&f);
        for (int i = 0; i < f.nt; i++) memcpy(f.image[i], f.buf[i], BUFSZ); /* the mutated inputs are the baseline */
        expect(&f, sp[k].what, sp[k].want, sp[k].word, sp[k].value);
    }
    printf("  %-28s %4ld cases\n", label, n_cases - before);
    restore(&f, s);
    fx_free(&f);
    free(s);
}
