/*
 * harness.h -- the table-driven validation harness of test_validation (tests/c/test_validation.c and one file per
 * API area in this folder).
 *
 * A fixture (fx) is a small, VALID call of one public entry point: its tensors live in private 64 KiB buffers,
 * inputs filled with valid values, outputs with the sentinel byte 0xA5. run_fixture() checks the valid call, then
 * runs every generic case (the GEN_* mutations of each tensor) and the fixture's specific cases (a `special` table),
 * each from the same starting bytes, asserting the exact status, a message that starts with the function's name and
 * names the parameter, and that no buffer changed.
 */
#ifndef MXFP8_TEST_VALIDATION_HARNESS_H
#define MXFP8_TEST_VALIDATION_HARNESS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TU_SHARED_COUNTERS /* one check count over all files of this test (defined in harness.c) */
#include "testutil.h"

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
    /* the call's validate-and-size entry on the same arguments (NULL: none); every case checks that it returns the
     * call's status and message and writes nothing */
    mxfp8_status (*validate)(fx *, size_t *workspace_bytes);
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
    mxfp8_moe_config mc;
    const mxfp8_moe_config *mcp;
};


/** Add a tensor to the fixture: a view of a fresh BUFSZ buffer (inputs filled with valid values, outputs with
 *  SENTINEL), named `name` in messages. Returns its index. */
int add(fx *f, const char *name, mxfp8_dtype dt, int nd, int64_t s0, int64_t s1, int64_t s2, int64_t s3,
        unsigned flags);
/** Fill a buffer with valid values of dtype dt. */
void fill_input(unsigned char *b, mxfp8_dtype dt);
static inline int32_t *ids(fx *f, int i) { return (int32_t *)f->buf[i]; }
/** `word` occurs in s with no identifier character right before or after it. */
int has_word(const char *s, const char *word);

/** Cases run so far (all files). */
extern long n_cases;

/* ---- specific cases ---- */
typedef struct special {
    const char *what;
    void (*mutate)(fx *);
    mxfp8_status want;
    const char *word;   /* parameter named (as a word) */
    const char *value;  /* bad value shown (substring) */
} special;

/** The valid call, every generic case, then the specific cases sp[0..nsp). */
void run_fixture(const char *label, void (*setup)(fx *), const special *sp, int nsp);
#define RUN(label, setup, table) run_fixture(label, setup, table, (int)(sizeof table / sizeof table[0]))

/* ---- the API areas (one file each), run in this order by test_validation.c ---- */
void validation_runtime(void);   /* runtime.c: threads, info, status strings, numel, scale_layout_shape */
void validation_quant(void);     /* quant.c: mxfp8_quantize, mxfp8_dequantize */
void validation_gemm(void);      /* gemm.c: mxfp8_gemm, mxfp8_matmul, mxfp8_matmul_backward */
void validation_reference(void); /* reference.c: GEMM goldens, mxfp8_compare */
void validation_layouts(void);   /* layouts.c: scale layouts, x4 packing, swizzle */
void validation_moe(void);       /* moe.c: num_blocks, route, forward, backward, goldens, dense mode */

#endif
