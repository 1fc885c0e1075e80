/*
 * test_validation.c -- table-driven test of input validation at every public entry (issue 6, item 1).
 *
 * Each entry point has a fixture: a small, VALID call (its tensors live in private 64 KiB buffers, inputs filled
 * with valid values, outputs with the sentinel byte 0xA5). The fixture's baseline call must succeed and write
 * something (so the "untouched" check below can fail). Then every case starts again from the same bytes, breaks
 * exactly one thing and calls the entry, asserting
 *   - the exact mxfp8_status,
 *   - that mxfp8_last_error_message() starts with the function's name and names the parameter (as a word),
 *   - that EVERY buffer (outputs and inputs) still holds its bytes: no output is written on error.
 *
 * Cases:
 *   generic, applied to every tensor of every fixture (the GEN_* table below): NULL pointer argument, NULL data,
 *   negative extent, overflowing shape product, strides whose span overflows, unaccepted and unknown dtypes,
 *   ndim > MXFP8_MAX_DIMS, wrong rank, each extent +1 (shape mismatch with a related tensor), and for outputs:
 *   aliasing every input and every other output, zero stride (elements overlap);
 *   specific (the per-fixture SPECIAL tables): axis out of range, unknown enum values, block_size <= 0, token and
 *   expert ids out of range, num_valid_tokens < 0, config sizes < 0 or disagreeing, dtype disagreements between
 *   related tensors, ...
 * Buffers are far larger than any view, so a check that is missing shows up as a failed assertion, not a crash
 * (and the ASan build catches any stray access).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* mxfp8_scales_to_layout & co. are declared but not implemented yet; set to 1 once they are. */
#ifndef RELV_HAVE_LAYOUTS
#define RELV_HAVE_LAYOUTS 1
#endif
/* The MoE entries (route, forward, backward, goldens). */
#ifndef RELV_HAVE_MOE
#define RELV_HAVE_MOE 1
#endif

#define MAXT 24
#define BUFSZ (64 * 1024)
#define SENTINEL 0xA5

enum { F_OUT = 1, F_OPT = 2, F_BYPTR = 4, F_FLEXRANK = 8, F_NOGEN = 16, F_NOEXTENT = 32 };

typedef struct fx fx;
struct fx {
    const char *fn;                 /* function name the messages must start with */
    mxfp8_status extent_alt;        /* also accepted for "extent + 1" (0: none) */
    int nt;
    mxfp8_tensor t[MAXT];           /* the views handed to the call */
    mxfp8_tensor *tp[MAXT];         /* pointer arguments (NULL-able); &t[i] by default */
    const char *name[MAXT];         /* parameter name the message must contain */
    unsigned flags[MAXT];
    unsigned char *buf[MAXT];       /* BUFSZ bytes each */
    unsigned char *orig[MAXT];      /* the bytes every case starts from */
    unsigned char *image[MAXT];     /* the bytes a case must leave (orig, or as a specific case set them) */
    mxfp8_status (*call)(fx *);
    /* scalar arguments (each fixture uses what it needs) */
    int axis, group, accumulate, quantized, swz_a;
    int64_t K, i64[4];
    int32_t pad_id;
    double d0, d1;
    mxfp8_quant_params qp;
    const mxfp8_quant_params *qpp;
    mxfp8_matmul_config cfg, cfg2;
    const mxfp8_matmul_config *cfgp, *cfgp2;
    mxfp8_scale_layout layout;
    mxfp8_matmul_bwd_args mb;
    void *argp;                     /* NULL-able struct argument (args) */
    int64_t nblocks_out;
    int64_t *nblocks_outp;
    mxfp8_compare_result cmp;
    mxfp8_compare_result *cmpp;
#if RELV_HAVE_MOE
    mxfp8_moe_config mc;
    const mxfp8_moe_config *mcp;
#endif
};

/* ---- fixture construction ---------------------------------------------------------------------------- */
static void fill_input(unsigned char *b, mxfp8_dtype dt) {
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

static int add(fx *f, const char *name, mxfp8_dtype dt, int nd, int64_t s0, int64_t s1, int64_t s2, int64_t s3,
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
static inline int32_t *ids(fx *f, int i) { return (int32_t *)f->buf[i]; }

static void fx_free(fx *f) {
    for (int i = 0; i < f->nt; i++) {
        free(f->buf[i]);
        free(f->image[i]);
        free(f->orig[i]);
    }
}

/* ---- checks ------------------------------------------------------------------------------------------- */
static int is_ident(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }
/* `word` occurs in s with no identifier character right before or after it. */
static int has_word(const char *s, const char *word) {
    size_t n = strlen(word);
    for (const char *p = strstr(s, word); p; p = strstr(p + 1, word))
        if ((p == s || !is_ident(p[-1])) && !is_ident(p[n])) return 1;
    return 0;
}

static long n_cases;
static mxfp8_status g_alt; /* a second accepted status, for the case being run (0: none) */

/* Run one case on the fixture (already mutated by the caller from a fresh state). */
static void expect(fx *f, const char *what, mxfp8_status want, const char *word1, const char *word2) {
    n_cases++;
    mxfp8_status st = f->call(f);
    const char *msg = mxfp8_last_error_message();
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
#if RELV_HAVE_MOE
    if (s->f.mcp) f->mcp = &f->mc;
#endif
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

/* ---- specific cases ------------------------------------------------------------------------------------ */
typedef struct special {
    const char *what;
    void (*mutate)(fx *);
    mxfp8_status want;
    const char *word;   /* parameter named (as a word) */
    const char *value;  /* bad value shown (substring) */
} special;

static void run_fixture(const char *label, void (*setup)(fx *), const special *sp, int nsp) {
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
#define RUN(label, setup, table) run_fixture(label, setup, table, (int)(sizeof table / sizeof table[0]))

/* ======================================================================================================== */
/* mxfp8_quantize / mxfp8_dequantize                                                                          */
/* ======================================================================================================== */
static mxfp8_status call_quantize(fx *f) { return mxfp8_quantize(f->tp[0], f->axis, f->qpp, f->tp[1], f->tp[2]); }
static void setup_quantize(fx *f) {
    f->fn = "mxfp8_quantize";
    f->call = call_quantize;
    add(f, "src", MXFP8_DTYPE_F32, 2, 4, 64, 0, 0, F_BYPTR);
    add(f, "data", MXFP8_DTYPE_E4M3, 2, 4, 64, 0, 0, F_BYPTR | F_OUT);
    add(f, "scales", MXFP8_DTYPE_E8M0, 2, 4, 2, 0, 0, F_BYPTR | F_OUT);
    f->axis = 1;
    f->qp = mxfp8_quant_params_default();
    f->qpp = &f->qp;
}
static void q_axis_hi(fx *f) { f->axis = 2; }
static void q_axis_lo(fx *f) { f->axis = -3; }
static void q_fmt(fx *f) { f->qp.fmt = (mxfp8_format)7; }
static void q_fmt_neg(fx *f) { f->qp.fmt = (mxfp8_format)-1; }
static void q_rule(fx *f) { f->qp.rule = (mxfp8_scale_rule)9; }
static void q_group(fx *f) { f->qp.group = (mxfp8_group_scheme)5; }
static void q_wrapx(fx *f) { f->qp.group = MXFP8_GROUP_WRAPX; }
static void q_data_fmt(fx *f) { f->t[1].dtype = MXFP8_DTYPE_E5M2; }
static void q_src_rank0(fx *f) { f->t[0].ndim = 0; }
static const special sp_quantize[] = {
    {"axis 2 of a 2-D tensor", q_axis_hi, MXFP8_ERR_INVALID_ARGUMENT, "axis", "2"},
    {"axis -3 of a 2-D tensor", q_axis_lo, MXFP8_ERR_INVALID_ARGUMENT, "axis", "-3"},
    {"unknown params->fmt", q_fmt, MXFP8_ERR_INVALID_ARGUMENT, "fmt", "7"},
    {"negative params->fmt", q_fmt_neg, MXFP8_ERR_INVALID_ARGUMENT, "fmt", "-1"},
    {"unknown params->rule", q_rule, MXFP8_ERR_INVALID_ARGUMENT, "rule", "9"},
    {"unknown params->group", q_group, MXFP8_ERR_INVALID_ARGUMENT, "group", "5"},
    {"wrapX with axis length 64", q_wrapx, MXFP8_ERR_UNSUPPORTED, "WRAPX", "64"},
    {"data E5M2 but fmt E4M3", q_data_fmt, MXFP8_ERR_DTYPE, "data", "e5m2"},
    {"src 0-D", q_src_rank0, MXFP8_ERR_SHAPE_MISMATCH, "src", NULL},
};

static mxfp8_status call_dequantize(fx *f) {
    return mxfp8_dequantize(f->tp[0], f->tp[1], f->axis, (mxfp8_group_scheme)f->group, f->tp[2]);
}
static void setup_dequantize(fx *f) {
    f->fn = "mxfp8_dequantize";
    f->call = call_dequantize;
    add(f, "data", MXFP8_DTYPE_E4M3, 2, 64, 6, 0, 0, F_BYPTR);
    add(f, "scales", MXFP8_DTYPE_E8M0, 2, 2, 6, 0, 0, F_BYPTR);
    add(f, "out", MXFP8_DTYPE_BF16, 2, 64, 6, 0, 0, F_BYPTR | F_OUT);
    f->axis = 0;
}
static void dq_axis(fx *f) { f->axis = 5; }
static void dq_group(fx *f) { f->group = 2; }
static void dq_wrapx(fx *f) { f->group = MXFP8_GROUP_WRAPX; }
static const special sp_dequantize[] = {
    {"axis 5", dq_axis, MXFP8_ERR_INVALID_ARGUMENT, "axis", "5"},
    {"unknown group", dq_group, MXFP8_ERR_INVALID_ARGUMENT, "group", "2"},
    {"wrapX with axis length 64", dq_wrapx, MXFP8_ERR_UNSUPPORTED, "WRAPX", "64"},
};

/* ======================================================================================================== */
/* mxfp8_gemm / mxfp8_matmul                                                                                */
/* ======================================================================================================== */
static mxfp8_operand operand(fx *f, int v, int s) {
    mxfp8_operand o;
    memset(&o, 0, sizeof o);
    o.values = f->t[v];
    if (s >= 0) o.scales = f->t[s];
    o.scale_layout = f->layout;
    return o;
}
/* gemm fixture: t0 = a values, t1 = b values, t2 = c, [t3 = a scales] */
static mxfp8_status call_gemm(fx *f) {
    mxfp8_operand a = operand(f, 0, f->nt > 3 ? 3 : -1), b = operand(f, 1, -1);
    a.swizzled = f->swz_a;
    return mxfp8_gemm(f->tp[0] ? &a : NULL, f->tp[1] ? &b : NULL, f->cfgp, f->accumulate, f->tp[2]);
}
static void setup_gemm(fx *f) {
    f->fn = "mxfp8_gemm";
    f->call = call_gemm;
    add(f, "a", MXFP8_DTYPE_F32, 2, 8, 64, 0, 0, F_BYPTR);
    add(f, "b", MXFP8_DTYPE_BF16, 2, 16, 64, 0, 0, F_BYPTR);
    add(f, "c", MXFP8_DTYPE_F32, 2, 8, 16, 0, 0, F_BYPTR | F_OUT);
    mxfp8_matmul_config_init(&f->cfg);
    f->cfgp = &f->cfg;
}
static void setup_gemm_prequant(fx *f) {
    setup_gemm(f);
    f->t[0].dtype = MXFP8_DTYPE_E5M2; /* codes (config float8_dtype E5M2) */
    fill_input(f->buf[0], MXFP8_DTYPE_E5M2);
    add(f, "scales", MXFP8_DTYPE_E8M0, 2, 8, 2, 0, 0, 0);
}
static void g_tile_neg(fx *f) { f->cfg.tile_m = -4; }
static void g_bloop(fx *f) { f->cfg.block_loop_order = (mxfp8_loop_order)6; }
static void g_tloop(fx *f) { f->cfg.tile_loop_order = (mxfp8_loop_order)-1; }
static void g_f8(fx *f) { f->cfg.float8_dtype = (mxfp8_format)2; }
static void g_scheme(fx *f) { f->cfg.quant_scheme = (mxfp8_group_scheme)3; }
static void g_rule(fx *f) { f->cfg.scale_rule = (mxfp8_scale_rule)3; }
static void g_shard(fx *f) { f->cfg.lnc_2_shard_rhs = 2; }
static void g_M(fx *f) { f->cfg.M = 9; }
static void g_K(fx *f) { f->cfg.K = 65; }
static void g_N(fx *f) { f->cfg.N = 3; }
static void g_acc_bf16(fx *f) {
    f->accumulate = 1;
    f->t[2].dtype = MXFP8_DTYPE_BF16;
}
static void g_wrapx(fx *f) { f->cfg.quant_scheme = MXFP8_GROUP_WRAPX; }
static void g_lnc2(fx *f) { f->cfg.run_with_lnc2 = 5; }
static void g_spill(fx *f) { f->cfg.spill_reload = -1; }
static void g_packing(fx *f) { f->cfg.enable_scale_packing = 2; }
static void g_acc(fx *f) { f->accumulate = 3; }
static void g_swz(fx *f) { f->swz_a = 1; }
static const special sp_gemm[] = {
    {"config tile_m < 0", g_tile_neg, MXFP8_ERR_INVALID_ARGUMENT, "tile_m", "-4"},
    {"config block_loop_order 6", g_bloop, MXFP8_ERR_INVALID_ARGUMENT, "block_loop_order", "6"},
    {"config tile_loop_order -1", g_tloop, MXFP8_ERR_INVALID_ARGUMENT, "tile_loop_order", "-1"},
    {"config float8_dtype 2", g_f8, MXFP8_ERR_INVALID_ARGUMENT, "float8_dtype", "2"},
    {"config quant_scheme 3", g_scheme, MXFP8_ERR_INVALID_ARGUMENT, "quant_scheme", "3"},
    {"config scale_rule 3", g_rule, MXFP8_ERR_INVALID_ARGUMENT, "scale_rule", "3"},
    {"config lnc_2_shard_rhs 2", g_shard, MXFP8_ERR_INVALID_ARGUMENT, "lnc_2_shard_rhs", "2"},
    {"config M disagrees", g_M, MXFP8_ERR_SHAPE_MISMATCH, "M", "9"},
    {"config K disagrees", g_K, MXFP8_ERR_SHAPE_MISMATCH, "K", "65"},
    {"config N disagrees", g_N, MXFP8_ERR_SHAPE_MISMATCH, "N", "3"},
    {"accumulate into bf16", g_acc_bf16, MXFP8_ERR_DTYPE, "c", NULL},
    {"wrapX with K = 64", g_wrapx, MXFP8_ERR_UNSUPPORTED, NULL, "64"},
    {"swizzled a with K/4 = 8 rows", g_swz, MXFP8_ERR_UNSUPPORTED, "a", NULL},
    {"config run_with_lnc2 5", g_lnc2, MXFP8_ERR_INVALID_ARGUMENT, "run_with_lnc2", "5"},
    {"config spill_reload -1", g_spill, MXFP8_ERR_INVALID_ARGUMENT, "spill_reload", "-1"},
    {"config enable_scale_packing 2", g_packing, MXFP8_ERR_INVALID_ARGUMENT, "enable_scale_packing", "2"},
    {"accumulate 3", g_acc, MXFP8_ERR_INVALID_ARGUMENT, "accumulate", "3"},
};
static void gp_no_scales(fx *f) { f->t[3].data = NULL; }
static void gp_codes_fmt(fx *f) { f->t[0].dtype = MXFP8_DTYPE_E4M3; }
static void gp_layout(fx *f) { f->layout = (mxfp8_scale_layout)9; }
static void gp_scales_hp(fx *f) { f->t[0].dtype = MXFP8_DTYPE_F32; }
static const special sp_gemm_prequant[] = {
    {"codes without scales", gp_no_scales, MXFP8_ERR_NULL_POINTER, "a", "scales"},
    {"E4M3 codes, float8_dtype E5M2", gp_codes_fmt, MXFP8_ERR_DTYPE, "a", "e4m3"},
    {"scale_layout 9", gp_layout, MXFP8_ERR_INVALID_ARGUMENT, "scale_layout", "9"},
    {"scales with a high-precision operand", gp_scales_hp, MXFP8_ERR_INVALID_ARGUMENT, "a", "scales"},
};

static mxfp8_status call_matmul(fx *f) {
    mxfp8_operand a = operand(f, 0, -1), b = operand(f, 1, -1);
    return mxfp8_matmul(f->tp[0] ? &a : NULL, f->tp[1] ? &b : NULL, f->cfgp, f->tp[2]);
}
static void setup_matmul(fx *f) {
    f->fn = "mxfp8_matmul";
    f->call = call_matmul;
    add(f, "input_activation", MXFP8_DTYPE_BF16, 2, 8, 40, 0, 0, F_BYPTR);
    add(f, "weights", MXFP8_DTYPE_F16, 2, 12, 40, 0, 0, F_BYPTR);
    add(f, "output", MXFP8_DTYPE_BF16, 2, 8, 12, 0, 0, F_BYPTR | F_OUT);
    mxfp8_matmul_config_init(&f->cfg);
    f->cfgp = &f->cfg;
}
static const special sp_matmul[] = {
    {"config tile_n < 0", g_tile_neg, MXFP8_ERR_INVALID_ARGUMENT, "tile_m", "-4"},
    {"config float8_dtype 2", g_f8, MXFP8_ERR_INVALID_ARGUMENT, "float8_dtype", "2"},
    {"config M disagrees", g_M, MXFP8_ERR_SHAPE_MISMATCH, "M", "9"},
};

/* ======================================================================================================== */
/* mxfp8_matmul_backward                                                                                    */
/* ======================================================================================================== */
/* t0 dY [M, N], t1 W [N, K], t2 X [M, K], t3 input_grad [M, K], t4 weight_grad [N, K] */
static mxfp8_status call_mbwd(fx *f) {
    f->mb.output_grad = f->t[0];
    f->mb.weights = f->t[1];
    f->mb.input_activation = f->t[2];
    f->mb.input_grad_config = f->cfgp;
    f->mb.weight_grad_config = f->cfgp2;
    if (f->nt > 5) f->mb.output_grad_scales = f->t[5];
    return mxfp8_matmul_backward(f->argp ? &f->mb : NULL, f->tp[3], f->tp[4]);
}
static void setup_mbwd(fx *f) {
    f->fn = "mxfp8_matmul_backward";
    f->call = call_mbwd;
    add(f, "output_grad", MXFP8_DTYPE_F32, 2, 8, 48, 0, 0, 0);
    add(f, "weights", MXFP8_DTYPE_BF16, 2, 48, 20, 0, 0, 0);
    add(f, "input_activation", MXFP8_DTYPE_F32, 2, 8, 20, 0, 0, 0);
    add(f, "input_grad", MXFP8_DTYPE_BF16, 2, 8, 20, 0, 0, F_BYPTR | F_OUT);
    add(f, "weight_grad", MXFP8_DTYPE_BF16, 2, 48, 20, 0, 0, F_BYPTR | F_OUT);
    mxfp8_matmul_bwd_args_init(&f->mb);
    f->argp = &f->mb;
}
static void setup_mbwd_prequant(fx *f) {
    setup_mbwd(f);
    f->t[0].dtype = MXFP8_DTYPE_E5M2; /* dY codes quantized along N: scales [M, ceil(N/32)] */
    fill_input(f->buf[0], MXFP8_DTYPE_E5M2);
    add(f, "scales", MXFP8_DTYPE_E8M0, 2, 8, 2, 0, 0, 0); /* output_grad_scales: messages say "output_grad scales" */
}
static void mb_args(fx *f) { f->argp = NULL; }
static void mb_loop(fx *f) { f->mb.tile_loop_order = (mxfp8_loop_order)6; }
static void mb_f8(fx *f) { f->mb.float8_dtype = (mxfp8_format)5; }
static void mb_outdt(fx *f) { f->mb.output_dtype = MXFP8_DTYPE_F32; }
static void mb_outdt_bad(fx *f) { f->mb.output_dtype = MXFP8_DTYPE_E4M3; }
static void mb_grads_differ(fx *f) { f->t[4].dtype = MXFP8_DTYPE_F16; }
static void mb_layout(fx *f) { f->mb.scale_layout = (mxfp8_scale_layout)7; }
static void mb_rule(fx *f) { f->mb.scale_rule = (mxfp8_scale_rule)5; }
static void mb_scheme(fx *f) { f->mb.quant_scheme = (mxfp8_group_scheme)2; }
static void mb_cfg_neg(fx *f) {
    mxfp8_matmul_config_init(&f->cfg);
    f->cfg.tiles_in_block_k = -1;
    f->cfgp = &f->cfg;
}
static void mb_cfg2_dims(fx *f) {
    mxfp8_matmul_config_init(&f->cfg2);
    f->cfg2.M = 7;
    f->cfgp2 = &f->cfg2;
}
static void mb_wrapx(fx *f) { f->mb.quant_scheme = MXFP8_GROUP_WRAPX; }
static void mb_lnc2(fx *f) { f->mb.run_with_lnc2 = 5; }
static void mb_shard(fx *f) { f->mb.lnc_2_shard_rhs = -7; }
static void mb_shard2(fx *f) { f->mb.lnc_2_shard_rhs = 2; }
static void mb_packing(fx *f) { f->mb.use_scale_packing = 3; }
static void mb_spill(fx *f) { f->mb.spill_reload = 9; }
static void mb_swz_dy(fx *f) { f->mb.output_grad_is_swizzled = -1; }
static void mb_swz_w(fx *f) { f->mb.weights_is_swizzled = 2; }
static void mb_swz_x(fx *f) { f->mb.input_is_swizzled = 4; }
static void mb_cfg_lnc2(fx *f) {
    mxfp8_matmul_config_init(&f->cfg2);
    f->cfg2.run_with_lnc2 = 7;
    f->cfgp2 = &f->cfg2;
}
static const special sp_mbwd[] = {
    {"args NULL", mb_args, MXFP8_ERR_NULL_POINTER, "args", NULL},
    {"tile_loop_order 6", mb_loop, MXFP8_ERR_INVALID_ARGUMENT, "tile_loop_order", "6"},
    {"float8_dtype 5", mb_f8, MXFP8_ERR_INVALID_ARGUMENT, "float8_dtype", "5"},
    {"output_dtype f32 vs bf16 grads", mb_outdt, MXFP8_ERR_DTYPE, "output_dtype", NULL},
    {"output_dtype e4m3", mb_outdt_bad, MXFP8_ERR_INVALID_ARGUMENT, "output_dtype", NULL},
    {"grads of different dtypes", mb_grads_differ, MXFP8_ERR_DTYPE, "weight_grad", NULL},
    {"scale_layout 7", mb_layout, MXFP8_ERR_INVALID_ARGUMENT, "scale_layout", "7"},
    {"scale_rule 5", mb_rule, MXFP8_ERR_INVALID_ARGUMENT, "scale_rule", "5"},
    {"quant_scheme 2", mb_scheme, MXFP8_ERR_INVALID_ARGUMENT, "quant_scheme", "2"},
    {"input_grad_config tiles_in_block_k -1", mb_cfg_neg, MXFP8_ERR_INVALID_ARGUMENT, "input_grad_config", "-1"},
    {"weight_grad_config M disagrees", mb_cfg2_dims, MXFP8_ERR_SHAPE_MISMATCH, "weight_grad_config", "7"},
    {"wrapX with M = 8, N = 48", mb_wrapx, MXFP8_ERR_UNSUPPORTED, NULL, NULL},
    {"run_with_lnc2 5", mb_lnc2, MXFP8_ERR_INVALID_ARGUMENT, "run_with_lnc2", "5"},
    {"lnc_2_shard_rhs -7", mb_shard, MXFP8_ERR_INVALID_ARGUMENT, "lnc_2_shard_rhs", "-7"},
    {"lnc_2_shard_rhs 2", mb_shard2, MXFP8_ERR_INVALID_ARGUMENT, "lnc_2_shard_rhs", "2"},
    {"use_scale_packing 3", mb_packing, MXFP8_ERR_INVALID_ARGUMENT, "use_scale_packing", "3"},
    {"spill_reload 9", mb_spill, MXFP8_ERR_INVALID_ARGUMENT, "spill_reload", "9"},
    {"output_grad_is_swizzled -1", mb_swz_dy, MXFP8_ERR_INVALID_ARGUMENT, "output_grad_is_swizzled", "-1"},
    {"weights_is_swizzled 2", mb_swz_w, MXFP8_ERR_INVALID_ARGUMENT, "weights_is_swizzled", "2"},
    {"input_is_swizzled 4", mb_swz_x, MXFP8_ERR_INVALID_ARGUMENT, "input_is_swizzled", "4"},
    {"weight_grad_config run_with_lnc2 7", mb_cfg_lnc2, MXFP8_ERR_INVALID_ARGUMENT, "run_with_lnc2", "7"},
};
static void mbp_f8(fx *f) { f->mb.float8_dtype = MXFP8_FMT_E4M3; }
static const special sp_mbwd_prequant[] = {
    {"E5M2 codes with float8_dtype E4M3", mbp_f8, MXFP8_ERR_DTYPE, "output_grad", NULL},
};

/* ======================================================================================================== */
/* goldens, compare, runtime                                                                                 */
/* ======================================================================================================== */
static mxfp8_status call_gold_u(fx *f) {
    return mxfp8_gemm_golden_unquantized(f->tp[0], f->tp[1], f->quantized, f->tp[2]); /* quantized: round_to_bf16 */
}
static mxfp8_status call_gold_q(fx *f) { return mxfp8_gemm_golden_quantized(f->tp[0], f->tp[1], f->qpp, f->tp[2]); }
static void setup_gold_u(fx *f) {
    f->fn = "mxfp8_gemm_golden_unquantized";
    f->call = call_gold_u;
    f->quantized = 1;
    add(f, "a", MXFP8_DTYPE_F32, 2, 5, 40, 0, 0, F_BYPTR);
    add(f, "b", MXFP8_DTYPE_BF16, 2, 7, 40, 0, 0, F_BYPTR);
    add(f, "c", MXFP8_DTYPE_F32, 2, 5, 7, 0, 0, F_BYPTR | F_OUT);
}
static void setup_gold_q(fx *f) {
    setup_gold_u(f);
    f->fn = "mxfp8_gemm_golden_quantized";
    f->call = call_gold_q;
    f->t[2].dtype = MXFP8_DTYPE_F64;
    f->qp = mxfp8_quant_params_default();
    f->qpp = &f->qp;
}
static void gu_round(fx *f) { f->quantized = 2; }
static const special sp_gold_u[] = {
    {"c f16", q_src_rank0, MXFP8_ERR_SHAPE_MISMATCH, "a", NULL},
    {"round_to_bf16 2", gu_round, MXFP8_ERR_INVALID_ARGUMENT, "round_to_bf16", "2"},
};
static void gq_fmt(fx *f) { f->qp.fmt = (mxfp8_format)4; }
static void gq_rule(fx *f) { f->qp.rule = (mxfp8_scale_rule)-2; }
static void gq_group(fx *f) { f->qp.group = (mxfp8_group_scheme)9; }
static const special sp_gold_q[] = {
    {"params->fmt 4", gq_fmt, MXFP8_ERR_INVALID_ARGUMENT, "fmt", "4"},
    {"params->rule -2", gq_rule, MXFP8_ERR_INVALID_ARGUMENT, "rule", "-2"},
    {"params->group 9", gq_group, MXFP8_ERR_INVALID_ARGUMENT, "group", "9"},
};

/* t0 kernel, t1 golden, t2 = the result struct's bytes (checked untouched, not mutated) */
static mxfp8_status call_compare(fx *f) {
    return mxfp8_compare(f->tp[0], f->tp[1], f->d0, f->d1, f->cmpp ? (mxfp8_compare_result *)f->buf[2] : NULL);
}
static void setup_compare(fx *f) {
    f->fn = "mxfp8_compare";
    f->call = call_compare;
    add(f, "kernel", MXFP8_DTYPE_BF16, 2, 6, 10, 0, 0, F_BYPTR | F_FLEXRANK); /* only numel must agree */
    add(f, "golden", MXFP8_DTYPE_F64, 2, 6, 10, 0, 0, F_BYPTR | F_FLEXRANK);
    add(f, "result", MXFP8_DTYPE_U8, 1, (int64_t)sizeof(mxfp8_compare_result), 0, 0, 0, F_OUT | F_NOGEN);
    f->d0 = 1e-2;
    f->d1 = 1e-2;
    f->cmpp = &f->cmp;
}
static void c_result(fx *f) { f->cmpp = NULL; }
static void c_atol_nan(fx *f) { f->d0 = NAN; }
static void c_rtol_neg(fx *f) { f->d1 = -1.0; }
static void c_numel(fx *f) { f->t[1].shape[0] = 5; }
static void c_stride_edge(fx *f) { /* one extent of exactly INT64_MAX elements: the span + 1 must not overflow */
    f->t[0].ndim = 1;
    f->t[0].shape[0] = 2;
    f->t[0].strides[0] = INT64_MAX;
}
static const special sp_compare[] = {
    {"stride INT64_MAX on an extent of 2", c_stride_edge, MXFP8_ERR_BAD_STRIDES, "kernel", NULL},
    {"result NULL", c_result, MXFP8_ERR_NULL_POINTER, "result", NULL},
    {"atol_frac NaN", c_atol_nan, MXFP8_ERR_INVALID_ARGUMENT, "atol_frac", "nan"},
    {"rtol negative", c_rtol_neg, MXFP8_ERR_INVALID_ARGUMENT, "rtol", "-1"},
    {"numel differs", c_numel, MXFP8_ERR_SHAPE_MISMATCH, "golden", NULL},
};

static void test_runtime(void) {
    n_cases += 4;
    TU_CHECK(mxfp8_set_num_threads(-2) == MXFP8_ERR_INVALID_ARGUMENT && has_word(mxfp8_last_error_message(), "num_threads"),
             "mxfp8_set_num_threads(-2): %s", mxfp8_last_error_message());
    TU_CHECK(strstr(mxfp8_last_error_message(), "-2") != NULL, "set_num_threads: bad value not shown");
    TU_CHECK(mxfp8_get_info(NULL) == MXFP8_ERR_NULL_POINTER && has_word(mxfp8_last_error_message(), "info"),
             "mxfp8_get_info(NULL): %s", mxfp8_last_error_message());
    /* the message is cleared by the next successful call */
    mxfp8_info in;
    TU_CHECK(mxfp8_get_info(&in) == MXFP8_OK && mxfp8_last_error_message()[0] == 0,
             "a successful call must clear the last error (got \"%s\")", mxfp8_last_error_message());
    TU_CHECK(strcmp(mxfp8_status_string((mxfp8_status)12345), "unknown status") == 0, "status_string(12345)");
    TU_CHECK(mxfp8_dtype_size((mxfp8_dtype)99) == 0 && strcmp(mxfp8_dtype_name((mxfp8_dtype)-1), "?") == 0,
             "unknown dtypes");
    /* numel of hostile views */
    mxfp8_tensor t = mxfp8_tensor_make(NULL, MXFP8_DTYPE_F32, 2, (const int64_t[]){INT64_MAX, 2});
    TU_CHECK(mxfp8_tensor_numel(&t) == -1, "numel overflow");
    t.shape[0] = -1;
    TU_CHECK(mxfp8_tensor_numel(&t) == -1, "numel negative");
    TU_CHECK(mxfp8_tensor_numel(NULL) == -1, "numel NULL");
    t.ndim = 99;
    TU_CHECK(mxfp8_tensor_numel(&t) == -1, "numel ndim 99");
    t = mxfp8_tensor_make(NULL, MXFP8_DTYPE_F32, 99, NULL); /* clamps, never fails */
    TU_CHECK(t.ndim == MXFP8_MAX_DIMS, "tensor_make clamps ndim");
#if RELV_HAVE_LAYOUTS
    /* mxfp8_scale_layout_shape: scalar arguments only; the output is untouched on error */
    static const struct {
        int layout;
        int64_t F, K;
        mxfp8_status want;
        const char *word;
    } ls[] = {
        {99, 4, 64, MXFP8_ERR_INVALID_ARGUMENT, "layout"},
        {-1, 4, 64, MXFP8_ERR_INVALID_ARGUMENT, "layout"},
        {MXFP8_SCALES_COMPACT, -1, 64, MXFP8_ERR_SIZE_OVERFLOW, "F"},
        {MXFP8_SCALES_NKI_UNPACKED, 4, -64, MXFP8_ERR_SIZE_OVERFLOW, "K"},
        {MXFP8_SCALES_SWIZZLE_128X4, INT64_MAX, INT64_MAX, MXFP8_ERR_SIZE_OVERFLOW, NULL},
        {MXFP8_SCALES_NKI_PACKED, INT64_MAX / 2, INT64_MAX, MXFP8_ERR_SIZE_OVERFLOW, NULL},
    };
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) {
        int64_t shp[2] = {-7, -7};
        n_cases++;
        mxfp8_status st = mxfp8_scale_layout_shape((mxfp8_scale_layout)ls[i].layout, ls[i].F, ls[i].K, shp);
        const char *msg = mxfp8_last_error_message();
        TU_CHECK(st == ls[i].want, "mxfp8_scale_layout_shape case %zu: status %d, want %d (%s)", i, (int)st,
                 (int)ls[i].want, msg);
        TU_CHECK(!ls[i].word || has_word(msg, ls[i].word), "mxfp8_scale_layout_shape case %zu: '%s' not named: %s",
                 i, ls[i].word, msg);
        TU_CHECK(shp[0] == -7 && shp[1] == -7, "mxfp8_scale_layout_shape case %zu wrote its output on error", i);
    }
    n_cases++;
    TU_CHECK(mxfp8_scale_layout_shape(MXFP8_SCALES_COMPACT, 4, 64, NULL) == MXFP8_ERR_NULL_POINTER &&
                 has_word(mxfp8_last_error_message(), "shape"),
             "mxfp8_scale_layout_shape(NULL): %s", mxfp8_last_error_message());
#endif
}

/* ======================================================================================================== */
/* layouts, x4 packing, swizzle (once implemented)                                                           */
/* ======================================================================================================== */
#if RELV_HAVE_LAYOUTS
static mxfp8_status call_to_layout(fx *f) {
    return mxfp8_scales_to_layout(f->tp[0], f->K, f->layout, f->tp[1]);
}
static void setup_to_layout(fx *f) {
    f->fn = "mxfp8_scales_to_layout";
    f->call = call_to_layout;
    f->K = 96;
    f->layout = MXFP8_SCALES_NKI_UNPACKED;
    int64_t shp[2];
    mxfp8_scale_layout_shape(f->layout, 5, f->K, shp);
    add(f, "compact", MXFP8_DTYPE_E8M0, 2, 5, 3, 0, 0, F_BYPTR);
    add(f, "out", MXFP8_DTYPE_E8M0, 2, shp[0], shp[1], 0, 0, F_BYPTR | F_OUT);
}
static void l_layout(fx *f) { f->layout = (mxfp8_scale_layout)17; }
static void l_K(fx *f) { f->K = -32; }
static const special sp_to_layout[] = {
    {"layout 17", l_layout, MXFP8_ERR_INVALID_ARGUMENT, "layout", "17"},
    {"K negative", l_K, MXFP8_ERR_SIZE_OVERFLOW, "K", "-32"},
};
static mxfp8_status call_from_layout(fx *f) {
    return mxfp8_scales_from_layout(f->tp[0], f->K, f->layout, f->tp[1]);
}
static void setup_from_layout(fx *f) {
    f->fn = "mxfp8_scales_from_layout";
    f->call = call_from_layout;
    f->K = 96;
    f->layout = MXFP8_SCALES_NKI_UNPACKED;
    int64_t shp[2];
    mxfp8_scale_layout_shape(f->layout, 5, f->K, shp);
    add(f, "in", MXFP8_DTYPE_E8M0, 2, shp[0], shp[1], 0, 0, F_BYPTR);
    add(f, "compact", MXFP8_DTYPE_U8, 2, 5, 3, 0, 0, F_BYPTR | F_OUT);
}
static mxfp8_status call_pack(fx *f) { return mxfp8_pack_x4(f->tp[0], f->axis, f->tp[1]); }
static void setup_pack(fx *f) {
    f->fn = "mxfp8_pack_x4";
    f->call = call_pack;
    add(f, "in", MXFP8_DTYPE_E4M3, 2, 3, 12, 0, 0, F_BYPTR);
    add(f, "out", MXFP8_DTYPE_U32, 2, 3, 3, 0, 0, F_BYPTR | F_OUT);
    f->axis = 1;
}
static const special sp_pack[] = {{"axis 2", dq_axis, MXFP8_ERR_INVALID_ARGUMENT, "axis", "5"}};
static mxfp8_status call_unpack(fx *f) { return mxfp8_unpack_x4(f->tp[0], f->axis, f->tp[1]); }
static void setup_unpack(fx *f) {
    f->fn = "mxfp8_unpack_x4";
    f->call = call_unpack;
    add(f, "in", MXFP8_DTYPE_U32, 2, 3, 3, 0, 0, F_BYPTR);
    add(f, "out", MXFP8_DTYPE_E4M3, 2, 3, 12, 0, 0, F_BYPTR | F_OUT);
    f->axis = 1;
}
static mxfp8_status call_swz(fx *f) { return mxfp8_swizzle_nki(f->tp[0], f->tp[1]); }
static void setup_swz(fx *f) {
    f->fn = "mxfp8_swizzle_nki";
    f->call = call_swz;
    f->extent_alt = MXFP8_ERR_UNSUPPORTED; /* K + 1 is not a multiple of 128 */
    add(f, "in", MXFP8_DTYPE_E4M3, 2, 128, 3, 0, 0, F_BYPTR);
    add(f, "out", MXFP8_DTYPE_E4M3, 2, 32, 12, 0, 0, F_BYPTR | F_OUT);
}
static mxfp8_status call_unswz(fx *f) { return mxfp8_unswizzle_nki(f->tp[0], f->tp[1]); }
static void setup_unswz(fx *f) {
    f->fn = "mxfp8_unswizzle_nki";
    f->call = call_unswz;
    f->extent_alt = MXFP8_ERR_UNSUPPORTED;
    add(f, "in", MXFP8_DTYPE_E4M3, 2, 32, 12, 0, 0, F_BYPTR);
    add(f, "out", MXFP8_DTYPE_E4M3, 2, 128, 3, 0, 0, F_BYPTR | F_OUT);
}
static const special sp_none[] = {{"axis 5", dq_axis, MXFP8_OK, NULL, NULL}};
#endif

/* ======================================================================================================== */
/* MoE                                                                                                       */
/* ======================================================================================================== */
#if RELV_HAVE_MOE
static mxfp8_status call_nblocks(fx *f) {
    return mxfp8_moe_num_blocks(f->i64[0], f->i64[1], f->i64[2], f->i64[3], f->nblocks_outp ? (int64_t *)f->buf[0] : NULL);
}
static void setup_nblocks(fx *f) {
    f->fn = "mxfp8_moe_num_blocks";
    f->call = call_nblocks;
    add(f, "num_blocks", MXFP8_DTYPE_U8, 1, 8, 0, 0, 0, F_OUT | F_NOGEN);
    f->i64[0] = 6, f->i64[1] = 2, f->i64[2] = 4, f->i64[3] = 4;
    f->nblocks_outp = &f->nblocks_out;
}
static void nb_null(fx *f) { f->nblocks_outp = NULL; }
static void nb_T(fx *f) { f->i64[0] = -1; }
static void nb_K0(fx *f) { f->i64[1] = 0; }
static void nb_KE(fx *f) { f->i64[1] = 5; }
static void nb_E(fx *f) { f->i64[2] = 0; }
static void nb_B(fx *f) { f->i64[3] = 0; }
static void nb_Bneg(fx *f) { f->i64[3] = -8; }
static void nb_ovf(fx *f) { f->i64[0] = INT64_MAX / 2, f->i64[1] = 4, f->i64[2] = 4; }
static const special sp_nblocks[] = {
    {"num_blocks NULL", nb_null, MXFP8_ERR_NULL_POINTER, "num_blocks", NULL},
    {"T -1", nb_T, MXFP8_ERR_INVALID_ARGUMENT, "T", "-1"},
    {"top_k 0", nb_K0, MXFP8_ERR_INVALID_ARGUMENT, NULL, "0"},
    {"top_k > E", nb_KE, MXFP8_ERR_INVALID_ARGUMENT, NULL, "5"},
    {"E 0", nb_E, MXFP8_ERR_INVALID_ARGUMENT, NULL, "0"},
    {"block_size 0", nb_B, MXFP8_ERR_INVALID_ARGUMENT, NULL, "0"},
    {"block_size -8", nb_Bneg, MXFP8_ERR_INVALID_ARGUMENT, NULL, "-8"},
    {"T*K overflows", nb_ovf, MXFP8_ERR_SIZE_OVERFLOW, NULL, NULL},
};

/* route: T = 6, K = 2, E = 4, B = 4 -> N = 6 */
static mxfp8_status call_route(fx *f) {
    return mxfp8_moe_route(f->tp[0], f->tp[1], f->i64[2], f->i64[3], f->pad_id, f->tp[2], f->tp[3], f->tp[4]);
}
static void setup_route(fx *f) {
    f->fn = "mxfp8_moe_route";
    f->call = call_route;
    int a = add(f, "topk_ids", MXFP8_DTYPE_I32, 2, 6, 2, 0, 0, F_BYPTR);
    add(f, "topk_weights", MXFP8_DTYPE_F32, 2, 6, 2, 0, 0, F_BYPTR);
    add(f, "token_position_to_id", MXFP8_DTYPE_I32, 1, 24, 0, 0, 0, F_BYPTR | F_OUT);
    add(f, "block_to_expert", MXFP8_DTYPE_I32, 1, 6, 0, 0, 0, F_BYPTR | F_OUT | F_FLEXRANK);
    add(f, "expert_affinities_masked", MXFP8_DTYPE_F32, 2, 24, 1, 0, 0, F_BYPTR | F_OUT | F_FLEXRANK);
    static const int32_t idv[12] = {0, 1, 2, 3, 1, 0, 3, 2, 0, 2, 1, 3};
    memcpy(ids(f, a), idv, sizeof idv);
    f->i64[2] = 4, f->i64[3] = 4, f->pad_id = -1;
}
static void r_id_hi(fx *f) { ids(f, 0)[5] = 4; }
static void r_id_neg(fx *f) { ids(f, 0)[3] = -1; }
static void r_dup(fx *f) { ids(f, 0)[1] = 0; }
static void r_pad(fx *f) { f->pad_id = 5; }
static void r_E(fx *f) { f->i64[2] = 0; }
static void r_B(fx *f) { f->i64[3] = 0; }
static void r_KE(fx *f) { f->i64[2] = 1; }
static const special sp_route[] = {
    {"expert id = E", r_id_hi, MXFP8_ERR_INDEX_OUT_OF_RANGE, "topk_ids", "4"},
    {"expert id -1", r_id_neg, MXFP8_ERR_INDEX_OUT_OF_RANGE, "topk_ids", "-1"},
    {"duplicate id in a row", r_dup, MXFP8_ERR_INVALID_ARGUMENT, "topk_ids", NULL},
    {"padding_id 5", r_pad, MXFP8_ERR_INVALID_ARGUMENT, "padding_id", "5"},
    {"num_experts 0", r_E, MXFP8_ERR_INVALID_ARGUMENT, "num_experts", "0"},
    {"block_size 0", r_B, MXFP8_ERR_INVALID_ARGUMENT, "block_size", "0"},
    {"top_k > num_experts", r_KE, MXFP8_ERR_INVALID_ARGUMENT, NULL, NULL},
};

/* forward/backward: T = 5, H = 32, I = 32, E = 2, B = 4, N = 2.
 * Expert 0: tokens 0, 2, 4 (block 0); expert 1: tokens 1, 3 (block 1). */
enum { MT = 5, MH = 32, MI = 32, ME = 2, MB = 4, MN = 2 };
static void moe_inputs(fx *f) {
    add(f, "hidden_states", MXFP8_DTYPE_F32, 2, MT, MH, 0, 0, 0);
    int a = add(f, "expert_affinities_masked", MXFP8_DTYPE_F32, 2, MT * ME, 1, 0, 0, F_FLEXRANK);
    add(f, "gate_up_proj_weight", MXFP8_DTYPE_BF16, 4, ME, MH, 2, MI, 0);
    add(f, "down_proj_weight", MXFP8_DTYPE_F32, 3, ME, MI, MH, 0, 0);
    int tok = add(f, "token_position_to_id", MXFP8_DTYPE_I32, 1, MN * MB, 0, 0, 0, 0);
    int b2e = add(f, "block_to_expert", MXFP8_DTYPE_I32, 1, MN, 0, 0, 0, F_FLEXRANK);
    static const int32_t tv[8] = {0, 2, 4, -1, 1, 3, -1, -1}, bv[2] = {0, 1};
    memcpy(ids(f, tok), tv, sizeof tv);
    memcpy(ids(f, b2e), bv, sizeof bv);
    float *av = (float *)f->buf[a];
    for (int t = 0; t < MT; t++)
        for (int e = 0; e < ME; e++) av[t * ME + e] = (t % 2 == e) ? 0.75f : 0.0f;
    f->i64[3] = MB;
    mxfp8_moe_config_init(&f->mc);
    f->mcp = &f->mc;
}
/* indices: 0 X, 1 a, 2 W1, 3 W2, 4 tok, 5 b2e */
static void moe_fill_fwd_args(fx *f, mxfp8_moe_fwd_args *a) {
    mxfp8_moe_fwd_args_init(a);
    a->hidden_states = f->t[0];
    a->expert_affinities_masked = f->t[1];
    a->gate_up_proj_weight = f->t[2];
    a->down_proj_weight = f->t[3];
    a->token_position_to_id = f->t[4];
    a->block_to_expert = f->t[5];
    a->block_size = f->i64[3];
    a->config = f->mcp;
}
/* forward: 6 output, 7 gate_up checkpoint, 8 down_proj_output checkpoint, [9 num_valid_tokens, 10 bias b2] */
static int fwd_golden;
static mxfp8_status call_moe_fwd(fx *f) {
    mxfp8_moe_fwd_args a;
    moe_fill_fwd_args(f, &a);
    mxfp8_moe_fwd_outputs o;
    memset(&o, 0, sizeof o);
    o.output = f->t[6];
    o.gate_up_proj_act_checkpoint_T = f->t[7];
    o.down_proj_output_checkpoint = f->t[8];
    for (int i = 9; i < f->nt; i++) {
        if (!strcmp(f->name[i], "num_valid_tokens")) a.num_valid_tokens = f->t[i];
        if (!strcmp(f->name[i], "down_proj_bias")) a.down_proj_bias = f->t[i];
    }
    if (fwd_golden) return mxfp8_moe_forward_golden(f->argp ? &a : NULL, f->tp[6] ? &o : NULL, f->quantized);
    return mxfp8_moe_forward(f->argp ? &a : NULL, f->tp[6] ? &o : NULL);
}
static void setup_moe_fwd(fx *f) {
    f->fn = fwd_golden ? "mxfp8_moe_forward_golden" : "mxfp8_moe_forward";
    f->call = call_moe_fwd;
    moe_inputs(f);
    add(f, "output", MXFP8_DTYPE_BF16, 2, MT, MH, 0, 0, F_OUT);
    add(f, "gate_up_proj_act_checkpoint_T", MXFP8_DTYPE_F32, 4, MN, 2, MI, MB, F_OUT | F_OPT);
    add(f, "down_proj_output_checkpoint", MXFP8_DTYPE_F32, 3, MN, MB, MH, 0, F_OUT | F_OPT);
    f->argp = &f->mb; /* only its non-NULLness matters */
    f->quantized = 1;
}
static void mo_args(fx *f) { f->argp = NULL; }
static void mo_B0(fx *f) { f->i64[3] = 0; }
static void mo_Bneg(fx *f) { f->i64[3] = -4; }
static void mo_tok_T(fx *f) { ids(f, 4)[2] = MT; }
static void mo_tok_neg(fx *f) { ids(f, 4)[7] = -2; }
static void mo_tok_skip0(fx *f) { f->mc.skip_token = 0; } /* -1 padding is then out of range */
static void mo_exp_hi(fx *f) { ids(f, 5)[1] = ME; }
static void mo_exp_neg(fx *f) { ids(f, 5)[0] = -1; }
static void mo_nvt(fx *f) { /* num_valid_tokens without single_expert_dense */
    int i = add(f, "num_valid_tokens", MXFP8_DTYPE_I32, 1, 1, 0, 0, 0, 0);
    ids(f, i)[0] = 3;
}
static void mo_bias_no_cfg(fx *f) {
    add(f, "down_proj_bias", MXFP8_DTYPE_F32, 2, ME, MH, 0, 0, 0);
}
static void mo_cdt(fx *f) { f->mc.compute_dtype = MXFP8_DTYPE_E4M3; }
static void mo_qdt(fx *f) { f->mc.quant_dtype = (mxfp8_format)3; }
static void mo_rule(fx *f) { f->mc.scale_rule = (mxfp8_scale_rule)6; }
static void mo_act(fx *f) { f->mc.activation = (mxfp8_activation)8; }
static void mo_aff(fx *f) { f->mc.affinity_option = (mxfp8_affinity_option)4; }
static void mo_shard(fx *f) { f->mc.shard_option = 9; }
static void mo_skip(fx *f) { f->mc.skip_token = 7; }
static void mo_clamp_nan(fx *f) { f->mc.gate_clamp_upper = NAN; }
static void mo_clamp_order(fx *f) { f->mc.up_clamp_lower = 2.0f, f->mc.up_clamp_upper = 1.0f; }
static void mo_phase_scheme(fx *f) { f->mc.phase2.quant_scheme = (mxfp8_group_scheme)4; }
static void mo_phase_neg(fx *f) { f->mc.phase3.tile_k = -1; }
static void mo_outputs(fx *f) { f->tp[6] = NULL; }
static void mo_quantized(fx *f) { f->quantized = 2; }
static void mo_tok_len(fx *f) { f->t[4].shape[0] = 7; }
static void mo_skip_weight(fx *f) { f->mc.skip_weight = 2; }
static void mo_acc(fx *f) { f->mc.accumulate_hidden_states_grad = -1; }
static void mo_skip_init(fx *f) { f->mc.skip_grad_initialization = 5; }
static void mo_dense(fx *f) { f->mc.single_expert_dense = 3; }
static void mo_bias(fx *f) { f->mc.bias = 8; }
static void mo_fast_dma(fx *f) { f->mc.use_fast_dma = 2; }
static void mo_p3(fx *f) { f->mc.p3_transpose_mode = 3; }
static void mo_p4(fx *f) { f->mc.p4_transpose_mode = -1; }
static void mo_swz_hs(fx *f) { f->mc.hidden_states_swizzle_mode = 6; }
static void mo_swz_dy(fx *f) { f->mc.output_grad_swizzle_mode = -2; }
static void mo_swz_w(fx *f) { f->mc.weight_swizzle_mode = 3; }
static void mo_phase_lnc2(fx *f) { f->mc.phase1.run_with_lnc2 = 4; }
#define MOE_COMMON_SPECIALS                                                                                     \
    {"args NULL", mo_args, MXFP8_ERR_NULL_POINTER, "args", NULL},                                               \
    {"block_size 0", mo_B0, MXFP8_ERR_INVALID_ARGUMENT, "block_size", "0"},                                     \
    {"block_size -4", mo_Bneg, MXFP8_ERR_INVALID_ARGUMENT, "block_size", "-4"},                                 \
    {"token id = T", mo_tok_T, MXFP8_ERR_INDEX_OUT_OF_RANGE, "token_position_to_id", "5"},                      \
    {"token id -2", mo_tok_neg, MXFP8_ERR_INDEX_OUT_OF_RANGE, "token_position_to_id", "-2"},                    \
    {"padding -1 with skip_token 0", mo_tok_skip0, MXFP8_ERR_INDEX_OUT_OF_RANGE, "token_position_to_id", "-1"}, \
    {"expert id = E", mo_exp_hi, MXFP8_ERR_INDEX_OUT_OF_RANGE, "block_to_expert", "2"},                        \
    {"expert id -1", mo_exp_neg, MXFP8_ERR_INDEX_OUT_OF_RANGE, "block_to_expert", "-1"},                       \
    {"token_position_to_id length not a multiple of B", mo_tok_len, MXFP8_ERR_SHAPE_MISMATCH,                  \
     "token_position_to_id", "7"},                                                                              \
    {"num_valid_tokens without single_expert_dense", mo_nvt, MXFP8_ERR_INVALID_ARGUMENT, "num_valid_tokens", NULL}, \
    {"bias given with config.bias 0", mo_bias_no_cfg, MXFP8_ERR_INVALID_ARGUMENT, "down_proj_bias", NULL},      \
    {"compute_dtype e4m3", mo_cdt, MXFP8_ERR_INVALID_ARGUMENT, "compute_dtype", NULL},                          \
    {"quant_dtype 3", mo_qdt, MXFP8_ERR_INVALID_ARGUMENT, "quant_dtype", "3"},                                  \
    {"scale_rule 6", mo_rule, MXFP8_ERR_INVALID_ARGUMENT, "scale_rule", "6"},                                   \
    {"activation 8", mo_act, MXFP8_ERR_INVALID_ARGUMENT, "activation", "8"},                                    \
    {"affinity_option 4", mo_aff, MXFP8_ERR_INVALID_ARGUMENT, "affinity_option", "4"},                          \
    {"shard_option 9", mo_shard, MXFP8_ERR_INVALID_ARGUMENT, "shard_option", "9"},                              \
    {"skip_token 7", mo_skip, MXFP8_ERR_INVALID_ARGUMENT, "skip_token", "7"},                                   \
    {"gate clamp NaN", mo_clamp_nan, MXFP8_ERR_INVALID_ARGUMENT, "gate_clamp_upper", NULL},                     \
    {"up clamp lower > upper", mo_clamp_order, MXFP8_ERR_INVALID_ARGUMENT, "up_clamp_lower", "2"},              \
    {"phase2 quant_scheme 4", mo_phase_scheme, MXFP8_ERR_INVALID_ARGUMENT, "quant_scheme", "4"},                \
    {"phase3 tile_k -1", mo_phase_neg, MXFP8_ERR_INVALID_ARGUMENT, "tile_k", "-1"},                            \
    {"skip_weight 2", mo_skip_weight, MXFP8_ERR_INVALID_ARGUMENT, "skip_weight", "2"},                          \
    {"accumulate_hidden_states_grad -1", mo_acc, MXFP8_ERR_INVALID_ARGUMENT, "accumulate_hidden_states_grad", "-1"}, \
    {"skip_grad_initialization 5", mo_skip_init, MXFP8_ERR_INVALID_ARGUMENT, "skip_grad_initialization", "5"},  \
    {"single_expert_dense 3", mo_dense, MXFP8_ERR_INVALID_ARGUMENT, "single_expert_dense", "3"},                \
    {"bias 8", mo_bias, MXFP8_ERR_INVALID_ARGUMENT, "bias", "8"},                                               \
    {"use_fast_dma 2", mo_fast_dma, MXFP8_ERR_INVALID_ARGUMENT, "use_fast_dma", "2"},                           \
    {"p3_transpose_mode 3", mo_p3, MXFP8_ERR_INVALID_ARGUMENT, "p3_transpose_mode", "3"},                       \
    {"p4_transpose_mode -1", mo_p4, MXFP8_ERR_INVALID_ARGUMENT, "p4_transpose_mode", "-1"},                     \
    {"hidden_states_swizzle_mode 6", mo_swz_hs, MXFP8_ERR_INVALID_ARGUMENT, "hidden_states_swizzle_mode", "6"}, \
    {"output_grad_swizzle_mode -2", mo_swz_dy, MXFP8_ERR_INVALID_ARGUMENT, "output_grad_swizzle_mode", "-2"},   \
    {"weight_swizzle_mode 3", mo_swz_w, MXFP8_ERR_INVALID_ARGUMENT, "weight_swizzle_mode", "3"},                \
    {"phase1 run_with_lnc2 4", mo_phase_lnc2, MXFP8_ERR_INVALID_ARGUMENT, "run_with_lnc2", "4"}
static const special sp_moe_fwd[] = {
    MOE_COMMON_SPECIALS,
    {"outputs NULL", mo_outputs, MXFP8_ERR_NULL_POINTER, "outputs", NULL},
};
static const special sp_moe_fwd_golden[] = {
    MOE_COMMON_SPECIALS,
    {"outputs NULL", mo_outputs, MXFP8_ERR_NULL_POINTER, "outputs", NULL},
    {"quantized 2", mo_quantized, MXFP8_ERR_INVALID_ARGUMENT, "quantized", "2"},
};
static void setup_moe_fwd_kernel(fx *f) {
    fwd_golden = 0;
    setup_moe_fwd(f);
}
static void setup_moe_fwd_golden(fx *f) {
    fwd_golden = 1;
    setup_moe_fwd(f);
    f->t[6].dtype = MXFP8_DTYPE_F64;
}

/* backward: 6 dY, 7 gate_up checkpoint (optional input), 8 dX, 9 da, 10 dW1, 11 dW2, [12 num_valid_tokens] */
static int bwd_golden;
static mxfp8_status call_moe_bwd(fx *f) {
    mxfp8_moe_fwd_args fa;
    moe_fill_fwd_args(f, &fa);
    mxfp8_moe_bwd_args a;
    mxfp8_moe_bwd_args_init(&a);
    a.hidden_states = fa.hidden_states;
    a.expert_affinities_masked = fa.expert_affinities_masked;
    a.gate_up_proj_weight = fa.gate_up_proj_weight;
    a.down_proj_weight = fa.down_proj_weight;
    a.token_position_to_id = fa.token_position_to_id;
    a.block_to_expert = fa.block_to_expert;
    a.block_size = fa.block_size;
    a.config = fa.config;
    a.output_hidden_states_grad = f->t[6];
    a.gate_up_proj_act_checkpoint_T = f->t[7];
    mxfp8_moe_bwd_grads g;
    memset(&g, 0, sizeof g);
    g.hidden_states_grad = f->t[8];
    g.expert_affinities_masked_grad = f->t[9];
    g.gate_up_proj_weight_grad = f->t[10];
    g.down_proj_weight_grad = f->t[11];
    for (int i = 12; i < f->nt; i++) {
        if (!strcmp(f->name[i], "num_valid_tokens")) a.num_valid_tokens = f->t[i];
        if (!strcmp(f->name[i], "down_proj_bias")) a.down_proj_bias = f->t[i];
    }
    if (bwd_golden) return mxfp8_moe_backward_golden(f->argp ? &a : NULL, f->tp[8] ? &g : NULL, f->quantized);
    return mxfp8_moe_backward(f->argp ? &a : NULL, f->tp[8] ? &g : NULL);
}
static void setup_moe_bwd(fx *f) {
    f->fn = bwd_golden ? "mxfp8_moe_backward_golden" : "mxfp8_moe_backward";
    f->call = call_moe_bwd;
    moe_inputs(f);
    add(f, "output_hidden_states_grad", MXFP8_DTYPE_BF16, 2, MT, MH, 0, 0, 0);
    add(f, "gate_up_proj_act_checkpoint_T", MXFP8_DTYPE_F32, 4, MN, 2, MI, MB, F_OPT);
    add(f, "hidden_states_grad", MXFP8_DTYPE_F32, 2, MT, MH, 0, 0, F_OUT);
    add(f, "expert_affinities_masked_grad", MXFP8_DTYPE_F32, 1, MT * ME, 0, 0, 0, F_OUT | F_FLEXRANK);
    add(f, "gate_up_proj_weight_grad", MXFP8_DTYPE_BF16, 4, ME, MH, 2, MI, F_OUT);
    add(f, "down_proj_weight_grad", MXFP8_DTYPE_F32, 3, ME, MI, MH, 0, F_OUT);
    f->argp = &f->mb;
    f->quantized = 1;
}
static void mb_outputs(fx *f) { f->tp[8] = NULL; }
static void mb_nvt_reindex(fx *f) { /* as mo_nvt; the backward reads extra tensors from index 12 */
    mo_nvt(f);
}
static const special sp_moe_bwd[] = {
    MOE_COMMON_SPECIALS,
    {"grads NULL", mb_outputs, MXFP8_ERR_NULL_POINTER, "grads", NULL},
    {"num_valid_tokens (bwd)", mb_nvt_reindex, MXFP8_ERR_INVALID_ARGUMENT, "num_valid_tokens", NULL},
};
static const special sp_moe_bwd_golden[] = {
    MOE_COMMON_SPECIALS,
    {"grads NULL", mb_outputs, MXFP8_ERR_NULL_POINTER, "grads", NULL},
    {"quantized 2", mo_quantized, MXFP8_ERR_INVALID_ARGUMENT, "quantized", "2"},
};
static void setup_moe_bwd_kernel(fx *f) {
    bwd_golden = 0;
    setup_moe_bwd(f);
}
static void setup_moe_bwd_golden(fx *f) {
    bwd_golden = 1;
    setup_moe_bwd(f);
}

/* single_expert_dense backward: E = 1, T = 8, B = 4, num_valid_tokens = 6 */
static void setup_moe_dense(fx *f) {
    f->fn = "mxfp8_moe_backward";
    f->call = call_moe_bwd;
    bwd_golden = 0;
    add(f, "hidden_states", MXFP8_DTYPE_F32, 2, 8, MH, 0, 0, 0);
    add(f, "expert_affinities_masked", MXFP8_DTYPE_F32, 2, 8, 1, 0, 0, F_FLEXRANK);
    add(f, "gate_up_proj_weight", MXFP8_DTYPE_F32, 4, 1, MH, 2, MI, 0);
    add(f, "down_proj_weight", MXFP8_DTYPE_F32, 3, 1, MI, MH, 0, 0);
    add(f, "token_position_to_id", MXFP8_DTYPE_I32, 1, 0, 0, 0, 0, F_OPT | F_NOGEN);
    add(f, "block_to_expert", MXFP8_DTYPE_I32, 1, 0, 0, 0, 0, F_OPT | F_NOGEN);
    f->t[4].data = f->t[5].data = NULL;
    add(f, "output_hidden_states_grad", MXFP8_DTYPE_F32, 2, 8, MH, 0, 0, 0);
    add(f, "gate_up_proj_act_checkpoint_T", MXFP8_DTYPE_F32, 4, 2, 2, MI, 4, F_OPT | F_NOGEN);
    f->t[7].data = NULL;
    add(f, "hidden_states_grad", MXFP8_DTYPE_F32, 2, 8, MH, 0, 0, F_OUT);
    add(f, "expert_affinities_masked_grad", MXFP8_DTYPE_F32, 2, 8, 1, 0, 0, F_OUT | F_FLEXRANK);
    add(f, "gate_up_proj_weight_grad", MXFP8_DTYPE_F32, 4, 1, MH, 2, MI, F_OUT);
    add(f, "down_proj_weight_grad", MXFP8_DTYPE_F32, 3, 1, MI, MH, 0, F_OUT);
    int n = add(f, "num_valid_tokens", MXFP8_DTYPE_I32, 1, 1, 0, 0, 0, F_FLEXRANK | F_OPT);
    ids(f, n)[0] = 6;
    f->i64[3] = 4;
    mxfp8_moe_config_init(&f->mc);
    f->mc.single_expert_dense = 1;
    f->mcp = &f->mc;
    f->argp = &f->mb;
}
static void md_nvt_neg(fx *f) { ids(f, 12)[0] = -1; }
static void md_nvt_two(fx *f) { f->t[12].shape[0] = 2; }
static void md_nvt_dtype(fx *f) { f->t[12].dtype = MXFP8_DTYPE_F32; }
static void md_E2(fx *f) {
    f->t[2].shape[0] = 2;
    f->t[3].shape[0] = 2;
    f->t[2] = mxfp8_tensor_make(f->t[2].data, f->t[2].dtype, 4, f->t[2].shape);
    f->t[3] = mxfp8_tensor_make(f->t[3].data, f->t[3].dtype, 3, f->t[3].shape);
    f->t[1].shape[0] = f->t[9].shape[0] = 16; /* a and its grad [T*E, 1] */
}
static const special sp_moe_dense[] = {
    {"num_valid_tokens -1", md_nvt_neg, MXFP8_ERR_INVALID_ARGUMENT, "num_valid_tokens", "-1"},
    {"num_valid_tokens with 2 values", md_nvt_two, MXFP8_ERR_SHAPE_MISMATCH, "num_valid_tokens", "2"},
    {"num_valid_tokens f32", md_nvt_dtype, MXFP8_ERR_DTYPE, "num_valid_tokens", NULL},
    {"single_expert_dense with E = 2", md_E2, MXFP8_ERR_INVALID_ARGUMENT, "single_expert_dense", NULL},
};
#endif

int main(void) {
    printf("test_validation: table-driven validation cases per public entry\n");
    test_runtime();
    RUN("mxfp8_quantize", setup_quantize, sp_quantize);
    RUN("mxfp8_dequantize", setup_dequantize, sp_dequantize);
    RUN("mxfp8_gemm", setup_gemm, sp_gemm);
    RUN("mxfp8_gemm (pre-quantized)", setup_gemm_prequant, sp_gemm_prequant);
    RUN("mxfp8_matmul", setup_matmul, sp_matmul);
    RUN("mxfp8_matmul_backward", setup_mbwd, sp_mbwd);
    RUN("mxfp8_matmul_backward (pq)", setup_mbwd_prequant, sp_mbwd_prequant);
    RUN("gemm_golden_unquantized", setup_gold_u, sp_gold_u);
    RUN("gemm_golden_quantized", setup_gold_q, sp_gold_q);
    RUN("mxfp8_compare", setup_compare, sp_compare);
#if RELV_HAVE_LAYOUTS
    RUN("mxfp8_scales_to_layout", setup_to_layout, sp_to_layout);
    RUN("mxfp8_scales_from_layout", setup_from_layout, sp_to_layout);
    RUN("mxfp8_pack_x4", setup_pack, sp_pack);
    RUN("mxfp8_unpack_x4", setup_unpack, sp_pack);
    run_fixture("mxfp8_swizzle_nki", setup_swz, sp_none, 0);
    run_fixture("mxfp8_unswizzle_nki", setup_unswz, sp_none, 0);
#endif
#if RELV_HAVE_MOE
    RUN("mxfp8_moe_num_blocks", setup_nblocks, sp_nblocks);
    RUN("mxfp8_moe_route", setup_route, sp_route);
    RUN("mxfp8_moe_forward", setup_moe_fwd_kernel, sp_moe_fwd);
    RUN("mxfp8_moe_forward_golden", setup_moe_fwd_golden, sp_moe_fwd_golden);
    RUN("mxfp8_moe_backward", setup_moe_bwd_kernel, sp_moe_bwd);
    RUN("mxfp8_moe_backward_golden", setup_moe_bwd_golden, sp_moe_bwd_golden);
    RUN("mxfp8_moe_backward (dense)", setup_moe_dense, sp_moe_dense);
#endif
    printf("test_validation: %ld cases\n", n_cases);
    return tu_finish("test_validation");
}
