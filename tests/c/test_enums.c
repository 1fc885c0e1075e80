/*
 * test_enums.c -- the enumeration names of include/mxfp8.h ("Enumeration names"): for each enumeration the count is
 * the header's, every canonical name and alias (written here from the header's table) parses to its value and the
 * value names back to the canonical name; the case rule (case-insensitive, float8_dtype exact); an unknown name is
 * INVALID_ARGUMENT with a message listing the valid names, *value untouched; the two format spellings do not mix and
 * the message says the parameter's spelling; the validators' range checks reject the value just past each table.
 */
#include <string.h>

#include "testutil.h"

typedef struct spec {
    mxfp8_enum e;
    int count;
    const char *names[12];   /* canonical, by value */
    const char *aliases[12]; /* "value:alias" pairs as "N=alias" strings */
} spec;

static const spec k_spec[] = {
    {MXFP8_ENUM_FORMAT, 2, {"e4m3", "e5m2"}, {0}},
    {MXFP8_ENUM_FLOAT8_DTYPE, 2, {"float8_e4m3fn", "float8_e5m2"}, {0}},
    {MXFP8_ENUM_SCALE_RULE, 3, {"nki", "ocp", "rceil"}, {0}},
    {MXFP8_ENUM_GROUP_SCHEME, 2, {"1x32", "wrapx"}, {0}},
    {MXFP8_ENUM_SCALE_LAYOUT, 4, {"compact", "nki_unpacked", "nki_packed", "swizzle_128x4"},
     {"1=nki-unpacked", "2=nki-packed", "3=swizzle128x4", "3=swizzle-128x4"}},
    {MXFP8_ENUM_ROUNDING, 2, {"nearest", "stochastic"}, {0}},
    {MXFP8_ENUM_ACTIVATION, 4, {"silu", "swish", "squared_relu", "gpt_oss_swiglu"}, {"2=squaredrelu", "2=relu2"}},
    {MXFP8_ENUM_AFFINITY_OPTION, 2, {"affinity_on_i", "affinity_on_h"}, {"0=on_i", "0=i", "1=on_h", "1=h"}},
    {MXFP8_ENUM_LOOP_ORDER, 6, {"mnk", "mkn", "nmk", "nkm", "kmn", "knm"}, {0}},
    {MXFP8_ENUM_DTYPE, 10, {"f32", "bf16", "f16", "e4m3", "e5m2", "e8m0", "u8", "i32", "f64", "u32"},
     {"0=float32", "1=bfloat16", "2=float16", "6=uint8", "7=int32", "8=float64", "9=uint32"}},
    {MXFP8_ENUM_MOE_OPERAND, 12, {"gemm1_x", "gemm1_w1", "gemm2_inter", "gemm2_w2", "p1_dy", "p1_w2", "p2_dgu",
                                  "p2_w1", "p3_x", "p3_dgu", "p4_s", "p4_dy"}, {0}},
};
#define NSPEC ((int)(sizeof k_spec / sizeof k_spec[0]))

static void upper(const char *s, char *out) {
    int i = 0;
    for (; s[i]; i++) out[i] = (s[i] >= 'a' && s[i] <= 'z') ? (char)(s[i] - 32) : s[i];
    out[i] = 0;
}

static void test_round_trips(void) {
    TU_CHECK(NSPEC == MXFP8_NUM_ENUMS, "every enumeration has a spec row");
    for (int i = 0; i < NSPEC; i++) {
        const spec *s = &k_spec[i];
        TU_CHECK(mxfp8_enum_count(s->e) == s->count, "enum %d count %d", (int)s->e, (int)mxfp8_enum_count(s->e));
        TU_CHECK(mxfp8_enum_what(s->e) && *mxfp8_enum_what(s->e), "enum %d has a description", (int)s->e);
        for (int v = 0; v < s->count; v++) {
            const char *n = mxfp8_enum_name(s->e, v);
            TU_CHECK(n && !strcmp(n, s->names[v]), "enum %d value %d is '%s', got '%s'", (int)s->e, v, s->names[v],
                     n ? n : "(null)");
            int32_t got = -1;
            TU_CHECK(mxfp8_enum_from_name(s->e, s->names[v], &got) == MXFP8_OK && got == v, "parse '%s'",
                     s->names[v]);
            char up[64];
            upper(s->names[v], up);
            got = -1;
            mxfp8_status st = mxfp8_enum_from_name(s->e, up, &got);
            if (s->e == MXFP8_ENUM_FLOAT8_DTYPE)
                TU_CHECK(st == MXFP8_ERR_INVALID_ARGUMENT && got == -1, "float8 dtype names are exact: '%s'", up);
            else
                TU_CHECK(st == MXFP8_OK && got == v, "names are case-insensitive: '%s'", up);
        }
        TU_CHECK(mxfp8_enum_name(s->e, -1) == NULL && mxfp8_enum_name(s->e, s->count) == NULL, "outside the range");
        /* the aliases: each listed one parses to its value, and the library lists exactly these */
        int nal = 0;
        for (int a = 0; a < 12 && s->aliases[a]; a++, nal++) {
            int v = s->aliases[a][0] - '0';
            const char *al = s->aliases[a] + 2;
            int32_t got = -1;
            TU_CHECK(mxfp8_enum_from_name(s->e, al, &got) == MXFP8_OK && got == v, "alias '%s' -> %d", al, v);
        }
        int lib_nal = 0;
        for (int v = 0; v < s->count; v++)
            for (int a = 0; mxfp8_enum_alias(s->e, v, a); a++) {
                lib_nal++;
                int32_t got = -1;
                TU_CHECK(mxfp8_enum_from_name(s->e, mxfp8_enum_alias(s->e, v, a), &got) == MXFP8_OK && got == v,
                         "library alias round trip");
            }
        TU_CHECK(lib_nal == nal, "enum %d: %d aliases, the header lists %d", (int)s->e, lib_nal, nal);
        TU_CHECK(mxfp8_enum_alias(s->e, 0, -1) == NULL && mxfp8_enum_alias(s->e, s->count, 0) == NULL, "alias range");
    }
    TU_CHECK(mxfp8_enum_count((mxfp8_enum)MXFP8_NUM_ENUMS) == -1 && mxfp8_enum_count((mxfp8_enum)-1) == -1, "bad id");
    TU_CHECK(mxfp8_enum_name((mxfp8_enum)99, 0) == NULL && mxfp8_enum_what((mxfp8_enum)99) == NULL, "bad id names");
    /* every value of the enumerations the help texts describe has its one-line definition; the others "" */
    const mxfp8_enum documented[] = {MXFP8_ENUM_FORMAT,       MXFP8_ENUM_FLOAT8_DTYPE, MXFP8_ENUM_SCALE_RULE,
                                     MXFP8_ENUM_GROUP_SCHEME, MXFP8_ENUM_SCALE_LAYOUT, MXFP8_ENUM_ROUNDING,
                                     MXFP8_ENUM_ACTIVATION,   MXFP8_ENUM_AFFINITY_OPTION};
    for (int i = 0; i < (int)(sizeof documented / sizeof documented[0]); i++)
        for (int v = 0; v < mxfp8_enum_count(documented[i]); v++)
            TU_CHECK(mxfp8_enum_doc(documented[i], v) && strlen(mxfp8_enum_doc(documented[i], v)) > 10,
                     "enum %d value %d has a definition", (int)documented[i], v);
    TU_CHECK(mxfp8_enum_doc(MXFP8_ENUM_LOOP_ORDER, 0) && !*mxfp8_enum_doc(MXFP8_ENUM_LOOP_ORDER, 0), "no doc: empty");
    TU_CHECK(mxfp8_enum_doc(MXFP8_ENUM_SCALE_RULE, 3) == NULL && mxfp8_enum_doc(MXFP8_ENUM_SCALE_RULE, -1) == NULL &&
                 mxfp8_enum_doc((mxfp8_enum)99, 0) == NULL,
             "doc outside the range");
    for (int d = 0; d <= MXFP8_DTYPE_U32; d++)
        TU_CHECK(!strcmp(mxfp8_dtype_name((mxfp8_dtype)d), k_spec[9].names[d]), "mxfp8_dtype_name(%d)", d);
}

static void test_errors(void) {
    int32_t v = 77;
    TU_CHECK(mxfp8_enum_from_name(MXFP8_ENUM_SCALE_RULE, "floor", &v) == MXFP8_ERR_INVALID_ARGUMENT && v == 77,
             "unknown name");
    TU_CHECK(!strcmp(mxfp8_last_error_message(), "unknown value 'floor' (expected nki, ocp or rceil)"), "message: %s",
             mxfp8_last_error_message());
    TU_CHECK(mxfp8_enum_from_name(MXFP8_ENUM_FLOAT8_DTYPE, "e4m3", &v) == MXFP8_ERR_INVALID_ARGUMENT && v == 77,
             "quantize's spelling is not a float8 dtype");
    TU_CHECK(strstr(mxfp8_last_error_message(), "expected float8_e4m3fn or float8_e5m2") &&
                 strstr(mxfp8_last_error_message(), "spells e4m3 as float8_e4m3fn"),
             "message: %s", mxfp8_last_error_message());
    TU_CHECK(mxfp8_enum_from_name(MXFP8_ENUM_FORMAT, "float8_e5m2", &v) == MXFP8_ERR_INVALID_ARGUMENT && v == 77,
             "the float8 dtype spelling is not a format");
    TU_CHECK(strstr(mxfp8_last_error_message(), "expected e4m3 or e5m2") &&
                 strstr(mxfp8_last_error_message(), "spells float8_e5m2 as e5m2"),
             "message: %s", mxfp8_last_error_message());
    TU_CHECK(mxfp8_enum_from_name(MXFP8_ENUM_FLOAT8_DTYPE, "float8_e4m3", &v) == MXFP8_ERR_INVALID_ARGUMENT,
             "ml_dtypes' float8_e4m3 is another format");
    TU_CHECK(mxfp8_enum_from_name(MXFP8_ENUM_ACTIVATION, "", &v) == MXFP8_ERR_INVALID_ARGUMENT, "empty name");
    TU_CHECK(mxfp8_enum_from_name(MXFP8_ENUM_ACTIVATION, NULL, &v) == MXFP8_ERR_NULL_POINTER, "NULL name");
    TU_CHECK(mxfp8_enum_from_name(MXFP8_ENUM_ACTIVATION, "silu", NULL) == MXFP8_ERR_NULL_POINTER, "NULL value");
    TU_CHECK(mxfp8_enum_from_name((mxfp8_enum)MXFP8_NUM_ENUMS, "silu", &v) == MXFP8_ERR_INVALID_ARGUMENT, "bad id");
    TU_CHECK(mxfp8_enum_from_name(MXFP8_ENUM_SCALE_RULE, "ocp", &v) == MXFP8_OK && !*mxfp8_last_error_message(),
             "success clears the message");
}

/* The validators' range checks come from the tables: the value just past each one is refused, naming the names. */
static void test_range_checks(void) {
    float x[64] = {1.0f};
    uint8_t d[64], s[2];
    int64_t xs[2] = {2, 32}, ss[2] = {2, 1};
    mxfp8_tensor src = mxfp8_tensor_make(x, MXFP8_DTYPE_F32, 2, xs);
    mxfp8_tensor dt = mxfp8_tensor_make(d, MXFP8_DTYPE_E4M3, 2, xs), st = mxfp8_tensor_make(s, MXFP8_DTYPE_E8M0, 2, ss);
    mxfp8_quant_params qp = mxfp8_quant_params_default();
    TU_CHECK(mxfp8_quantize(&src, -1, &qp, &dt, &st) == MXFP8_OK, "quantize works");
    qp.rule = (mxfp8_scale_rule)mxfp8_enum_count(MXFP8_ENUM_SCALE_RULE);
    TU_CHECK(mxfp8_quantize(&src, -1, &qp, &dt, &st) == MXFP8_ERR_INVALID_ARGUMENT, "rule past the table");
    TU_CHECK(strstr(mxfp8_last_error_message(), "params->rule 3 is not a valid scale rule (expected nki (0), ocp (1), rceil (2))"),
             "message: %s", mxfp8_last_error_message());
    qp = mxfp8_quant_params_default();
    qp.rounding = (mxfp8_rounding)-1;
    TU_CHECK(mxfp8_quantize(&src, -1, &qp, &dt, &st) == MXFP8_ERR_INVALID_ARGUMENT &&
                 strstr(mxfp8_last_error_message(), "nearest (0), stochastic (1)"),
             "rounding: %s", mxfp8_last_error_message());
    mxfp8_moe_config c;
    mxfp8_moe_config_init(&c);
    c.activation = (mxfp8_activation)mxfp8_enum_count(MXFP8_ENUM_ACTIVATION);
    mxfp8_moe_fwd_args fa;
    memset(&fa, 0, sizeof fa);
    fa.config = &c;
    mxfp8_moe_fwd_outputs fo;
    memset(&fo, 0, sizeof fo);
    mxfp8_status r = mxfp8_moe_forward(&fa, &fo);
    TU_CHECK(r == MXFP8_ERR_INVALID_ARGUMENT &&
                 strstr(mxfp8_last_error_message(),
                        "config.activation 4 is not a valid activation (expected silu (0), swish (1)"),
             "activation past the table: %d %s", (int)r, mxfp8_last_error_message());
}

int main(void) {
    test_round_trips();
    test_errors();
    test_range_checks();
    return tu_finish("test_enums");
}
