/* enums.c -- the one table of every enumeration's names: count, canonical name, accepted aliases (include/mxfp8.h,
 * "Enumeration names"). Everything that parses or prints an enumeration value (the validators' messages, the CLI,
 * the Python package, the diff profiles, the MPI layer) reads it from here. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "enums.h"

#define MXFP8I_MAX_ALIASES 4

typedef struct enum_value {
    const char *name;                      /* canonical */
    const char *alias[MXFP8I_MAX_ALIASES]; /* NULL-terminated */
    const char *doc;                       /* its definition in one line (help texts), or NULL */
} enum_value;

typedef struct enum_table {
    const char *what;          /* the enumeration in a message ("scale rule") */
    int exact_case;            /* names compare case-sensitively (float8_dtype: exactly the NKI page's strings) */
    mxfp8_enum other_spelling; /* an enumeration of the same values in another spelling (or -1): its names get a hint */
    int count;
    const enum_value *v;
} enum_table;

#define N_(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* mxfp8_format, quantize's spelling */
#define DOC_E4M3 "FP8 E4M3 (OCP MX v1.0 5.3): max normal 448, no infinities"
#define DOC_E5M2 "FP8 E5M2 (OCP MX v1.0 5.3): max normal 57344, IEEE infinities"
static const enum_value k_format[] = {{"e4m3", {0}, DOC_E4M3}, {"e5m2", {0}, DOC_E5M2}};
/* mxfp8_format, the NKI pages' float8_dtype ("float8_e4m3" would be ml_dtypes' IEEE-like e4m3, a different format) */
static const enum_value k_float8_dtype[] = {{"float8_e4m3fn", {0}, DOC_E4M3}, {"float8_e5m2", {0}, DOC_E5M2}};
static const enum_value k_scale_rule[] = {
    {"nki", {0}, "Trainium's quantize_mx: floor(log2 amax) - (emax - 1)"},
    {"ocp", {0}, "OCP MX v1.0 6.3: floor(log2 amax) - emax; scaled values past max normal saturate"},
    {"rceil", {0}, "ceil(log2(amax / max_normal)) (cuBLAS, TransformerEngine)"}};
static const enum_value k_group[] = {
    {"1x32", {0}, "32 contiguous values along the axis (OCP MX v1.0 6)"},
    {"wrapx", {0}, "Trainium's tiling of the axis in 512/256/128-tiles (axis length % 128 == 0)"}};
static const enum_value k_layout[] = {
    {"compact", {0}, "[F, ceil(K/32)] row-major"},
    {"nki_unpacked", {"nki-unpacked", 0}, "the NKI quadrant layout [ceil(K/4) in 32-row quadrants, F]"},
    {"nki_packed", {"nki-packed", 0}, "the NKI packed layout [ceil(K/2048) * 128, F]"},
    {"swizzle_128x4", {"swizzle128x4", "swizzle-128x4", 0}, "the cuBLAS / CUTLASS block-scaled swizzle"}};
static const enum_value k_rounding[] = {
    {"nearest", {0}, "round to nearest, ties to even (OCP MX v1.0 6.3)"},
    {"stochastic", {0}, "Philox-4x32-10 keyed by the seed, by each element's position (reproducible)"}};
static const enum_value k_activation[] = {
    {"silu", {0}, "g * sigmoid(g) (SiLU)"},
    {"swish", {0}, "g * sigmoid(1.702 g)"},
    {"squared_relu", {"squaredrelu", "relu2", 0}, "max(g, 0)^2"},
    {"gpt_oss_swiglu", {0}, "gpt-oss: g * sigmoid(alpha g), times u + 1; g <= limit, |u| <= limit"}};
static const enum_value k_affinity[] = {
    {"affinity_on_i", {"on_i", "i", 0}, "the affinity scales the intermediate (the I side)"},
    {"affinity_on_h", {"on_h", "h", 0}, "the affinity scales dY (the H side)"}};
static const enum_value k_loop[] = {{"mnk", {0}, NULL}, {"mkn", {0}, NULL}, {"nmk", {0}, NULL},
                                    {"nkm", {0}, NULL}, {"kmn", {0}, NULL}, {"knm", {0}, NULL}};
static const enum_value k_dtype[] = {{"f32", {"float32", 0}, NULL}, {"bf16", {"bfloat16", 0}, NULL},
                                     {"f16", {"float16", 0}, NULL}, {"e4m3", {0}, NULL},
                                     {"e5m2", {0}, NULL},           {"e8m0", {0}, NULL},
                                     {"u8", {"uint8", 0}, NULL},    {"i32", {"int32", 0}, NULL},
                                     {"f64", {"float64", 0}, NULL}, {"u32", {"uint32", 0}, NULL}};
static const enum_value k_moe_operand[] = {{"gemm1_x", {0}, NULL},  {"gemm1_w1", {0}, NULL}, {"gemm2_inter", {0}, NULL},
                                           {"gemm2_w2", {0}, NULL}, {"p1_dy", {0}, NULL},    {"p1_w2", {0}, NULL},
                                           {"p2_dgu", {0}, NULL},   {"p2_w1", {0}, NULL},    {"p3_x", {0}, NULL},
                                           {"p3_dgu", {0}, NULL},   {"p4_s", {0}, NULL},     {"p4_dy", {0}, NULL}};

static const enum_table k_tables[MXFP8_NUM_ENUMS] = {
    [MXFP8_ENUM_FORMAT] = {"format", 0, MXFP8_ENUM_FLOAT8_DTYPE, N_(k_format), k_format},
    [MXFP8_ENUM_FLOAT8_DTYPE] = {"float8 dtype", 1, MXFP8_ENUM_FORMAT, N_(k_float8_dtype), k_float8_dtype},
    [MXFP8_ENUM_SCALE_RULE] = {"scale rule", 0, -1, N_(k_scale_rule), k_scale_rule},
    [MXFP8_ENUM_GROUP_SCHEME] = {"group scheme", 0, -1, N_(k_group), k_group},
    [MXFP8_ENUM_SCALE_LAYOUT] = {"scale layout", 0, -1, N_(k_layout), k_layout},
    [MXFP8_ENUM_ROUNDING] = {"rounding mode", 0, -1, N_(k_rounding), k_rounding},
    [MXFP8_ENUM_ACTIVATION] = {"activation", 0, -1, N_(k_activation), k_activation},
    [MXFP8_ENUM_AFFINITY_OPTION] = {"affinity option", 0, -1, N_(k_affinity), k_affinity},
    [MXFP8_ENUM_LOOP_ORDER] = {"loop order", 0, -1, N_(k_loop), k_loop},
    [MXFP8_ENUM_DTYPE] = {"dtype", 0, -1, N_(k_dtype), k_dtype},
    [MXFP8_ENUM_MOE_OPERAND] = {"MoE operand", 0, -1, N_(k_moe_operand), k_moe_operand},
};

/* The table sizes are the header's enumerations. */
_Static_assert(N_(k_format) == MXFP8_FMT_E5M2 + 1, "formats");
_Static_assert(N_(k_scale_rule) == MXFP8_SCALE_RCEIL + 1, "scale rules");
_Static_assert(N_(k_group) == MXFP8_GROUP_WRAPX + 1, "group schemes");
_Static_assert(N_(k_layout) == MXFP8_SCALES_SWIZZLE_128X4 + 1, "scale layouts");
_Static_assert(N_(k_rounding) == MXFP8_ROUND_STOCHASTIC + 1, "roundings");
_Static_assert(N_(k_activation) == MXFP8_ACT_GPT_OSS_SWIGLU + 1, "activations");
_Static_assert(N_(k_affinity) == MXFP8_AFFINITY_ON_H + 1, "affinity options");
_Static_assert(N_(k_loop) == MXFP8_LOOP_KNM + 1, "loop orders");
_Static_assert(N_(k_dtype) == MXFP8_DTYPE_U32 + 1, "dtypes");
_Static_assert(N_(k_moe_operand) == MXFP8_MOE_NUM_OPERANDS, "MoE operands");

static const enum_table *table(mxfp8_enum e) { return (unsigned)e < (unsigned)MXFP8_NUM_ENUMS ? &k_tables[e] : NULL; }

int32_t mxfp8_enum_count(mxfp8_enum e) {
    const enum_table *t = table(e);
    return t ? t->count : -1;
}

const char *mxfp8_enum_name(mxfp8_enum e, int32_t value) {
    const enum_table *t = table(e);
    return t && value >= 0 && value < t->count ? t->v[value].name : NULL;
}

const char *mxfp8_enum_alias(mxfp8_enum e, int32_t value, int32_t i) {
    const enum_table *t = table(e);
    if (!t || value < 0 || value >= t->count || i < 0 || i >= MXFP8I_MAX_ALIASES) return NULL;
    for (int j = 0; j <= i; j++)
        if (!t->v[value].alias[j]) return NULL;
    return t->v[value].alias[i];
}

const char *mxfp8_enum_doc(mxfp8_enum e, int32_t value) {
    const enum_table *t = table(e);
    if (!t || value < 0 || value >= t->count) return NULL;
    return t->v[value].doc ? t->v[value].doc : "";
}
const char *mxfp8_enum_what(mxfp8_enum e) {
    const enum_table *t = table(e);
    return t ? t->what : NULL;
}

int mxfp8i_enum_valid(mxfp8_enum e, int value) {
    const enum_table *t = table(e);
    return t && value >= 0 && value < t->count;
}

static int match(const enum_table *t, const char *name) {
    for (int v = 0; v < t->count; v++) {
        if (t->exact_case ? !strcmp(name, t->v[v].name) : !strcasecmp(name, t->v[v].name)) return v;
        for (int j = 0; j < MXFP8I_MAX_ALIASES && t->v[v].alias[j]; j++)
            if (t->exact_case ? !strcmp(name, t->v[v].alias[j]) : !strcasecmp(name, t->v[v].alias[j])) return v;
    }
    return -1;
}

/* "a, b or c" into buf (canonical names) */
static void list_names(const enum_table *t, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = 0;
    for (int v = 0; v < t->count && n < cap; v++) {
        const char *sep = v == 0 ? "" : v + 1 == t->count ? " or " : ", ";
        int w = snprintf(buf + n, cap - n, "%s%s", sep, t->v[v].name);
        if (w < 0) break;
        n += (size_t)w;
    }
}

mxfp8_status mxfp8_enum_from_name(mxfp8_enum e, const char *name, int32_t *value) {
    mxfp8i_clear_error();
    const enum_table *t = table(e);
    if (!t) return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "mxfp8_enum_from_name: enumeration %d is unknown", (int)e);
    if (!name || !value)
        return mxfp8i_error(MXFP8_ERR_NULL_POINTER, "mxfp8_enum_from_name: %s is NULL", name ? "value" : "name");
    int v = match(t, name);
    if (v >= 0) {
        *value = v;
        return MXFP8_OK;
    }
    char list[512];
    list_names(t, list, sizeof list);
    const enum_table *o = t->other_spelling >= 0 ? table(t->other_spelling) : NULL;
    int ov = o ? match(o, name) : -1;
    if (ov >= 0)
        return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT,
                            "unknown value '%s' (expected %s; this parameter spells %s as %s)", name, list,
                            o->v[ov].name, t->v[ov].name);
    return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "unknown value '%s' (expected %s)", name, list);
}

mxfp8_status mxfp8i_check_enum(const char *fn, const char *param, mxfp8_enum e, int value) {
    const enum_table *t = table(e);
    if (t && value >= 0 && value < t->count) return MXFP8_OK;
    char list[512];
    size_t n = 0;
    list[0] = 0;
    for (int v = 0; t && v < t->count && n < sizeof list; v++) {
        int w = snprintf(list + n, sizeof list - n, "%s%s (%d)", v ? ", " : "", t->v[v].name, v);
        if (w < 0) break;
        n += (size_t)w;
    }
    return mxfp8i_error(MXFP8_ERR_INVALID_ARGUMENT, "%s: %s %d is not a valid %s (expected %s)", fn, param, value,
                        t ? t->what : "value", list);
}
