/*
 * cli_numerics.c -- the numerics options shared by quantize, matmul-bwd and moe-bwd: element rounding
 * (--rounding / --stochastic-rounding, --rounding-seed), the gpt-oss SwiGLU parameters, and the --stats table of the
 * library's quantization statistics (mxfp8_quant_stats).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"

int cli_rounding(const char *cmd, const char *opt, const char *s, mxfp8_rounding *out) {
    int v = (int)*out;
    if (cli_enum(cmd, opt, s, MXFP8_ENUM_ROUNDING, &v)) return CLI_USAGE;
    *out = (mxfp8_rounding)v;
    return CLI_OK;
}

int cli_seed64(const char *cmd, const char *opt, const char *s, uint64_t *out) {
    if (!s) return CLI_OK;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end || s[0] == '-')
        return cli_error(cmd, "--%s must be an integer in [0, 2^64) (decimal or 0x hex), got '%s'", opt, s);
    *out = (uint64_t)v;
    return CLI_OK;
}

int cli_float_opt(const char *cmd, const char *opt, const char *s, float *out) {
    if (!s) return CLI_OK;
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end) return cli_error(cmd, "--%s must be a number, got '%s'", opt, s);
    *out = (float)v;
    return CLI_OK;
}

/* A comma-separated list of names from `names` (or a name of `sets`, each a bitmask) into a bitmask. */
static int name_list(const char *cmd, const char *opt, const char *s, const char *const *names, int n,
                     const char *const *set_names, const uint32_t *sets, int nsets, uint32_t *mask) {
    if (!s) return CLI_OK;
    uint32_t m = 0;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int found = 0;
        for (int i = 0; i < n && !found; i++)
            if (!strcasecmp(tok, names[i])) m |= 1u << i, found = 1;
        for (int i = 0; i < nsets && !found; i++)
            if (!strcasecmp(tok, set_names[i])) m |= sets[i], found = 1;
        if (!found) {
            char list[512] = "";
            for (int i = 0; i < nsets + n; i++) {
                strncat(list, i < nsets ? set_names[i] : names[i - nsets], sizeof list - strlen(list) - 1);
                if (i + 1 < nsets + n) strncat(list, ", ", sizeof list - strlen(list) - 1);
            }
            return cli_error(cmd, "--%s: unknown name '%s' (expected a comma-separated list of: %s)", opt, tok, list);
        }
    }
    *mask = m;
    return CLI_OK;
}

int cli_matmul_rounding(const char *cmd, const char *s, mxfp8_matmul_bwd_args *a) {
    static const char *const names[] = {"dy", "w", "x"}, *const sets[] = {"none", "all"};
    static const uint32_t setv[] = {0, 7};
    uint32_t m = 0;
    if (name_list(cmd, "stochastic-rounding", s, names, 3, sets, setv, 2, &m)) return CLI_USAGE;
    a->output_grad_rounding = m & 1 ? MXFP8_ROUND_STOCHASTIC : MXFP8_ROUND_NEAREST;
    a->weights_rounding = m & 2 ? MXFP8_ROUND_STOCHASTIC : MXFP8_ROUND_NEAREST;
    a->input_rounding = m & 4 ? MXFP8_ROUND_STOCHASTIC : MXFP8_ROUND_NEAREST;
    return CLI_OK;
}

const char *cli_moe_operand_name(int op) {
    const char *name = mxfp8_enum_name(MXFP8_ENUM_MOE_OPERAND, op);
    return name ? name : "?";
}

int cli_moe_rounding(const char *cmd, const char *s, uint32_t *mask) {
    static const char *const sets[] = {"none", "all", "gradients"};
    const uint32_t setv[] = {0, (1u << MXFP8_MOE_NUM_OPERANDS) - 1,
                             1u << MXFP8_MOE_P1_DY | 1u << MXFP8_MOE_P2_DGU | 1u << MXFP8_MOE_P3_DGU |
                                 1u << MXFP8_MOE_P4_DY};
    const char *ops[MXFP8_MOE_NUM_OPERANDS];
    for (int op = 0; op < MXFP8_MOE_NUM_OPERANDS; op++) ops[op] = cli_moe_operand_name(op);
    return name_list(cmd, "stochastic-rounding", s, ops, MXFP8_MOE_NUM_OPERANDS, sets, setv, 3, mask);
}

int cli_moe_layer(const char *cmd, const cli_opt *opts, int nopts, mxfp8_moe_config *cfg) {
    int act = (int)cfg->activation, aff = (int)cfg->affinity_option;
#define GET(n) cli_get(opts, nopts, n)
    if (cli_enum(cmd, "activation", GET("activation"), MXFP8_ENUM_ACTIVATION, &act) ||
        cli_float_opt(cmd, "swiglu-alpha", GET("swiglu-alpha"), &cfg->swiglu_alpha) ||
        cli_float_opt(cmd, "swiglu-limit", GET("swiglu-limit"), &cfg->swiglu_limit) ||
        cli_moe_rounding(cmd, GET("stochastic-rounding"), &cfg->stochastic_rounding) ||
        cli_seed64(cmd, "rounding-seed", GET("rounding-seed"), &cfg->rounding_seed) ||
        cli_enum(cmd, "affinity", GET("affinity"), MXFP8_ENUM_AFFINITY_OPTION, &aff) ||
        cli_clamp(cmd, "gate-clamp", GET("gate-clamp"), &cfg->gate_clamp_lower, &cfg->gate_clamp_upper) ||
        cli_clamp(cmd, "up-clamp", GET("up-clamp"), &cfg->up_clamp_lower, &cfg->up_clamp_upper) ||
        cli_float8_dtype(cmd, GET("float8-dtype"), &cfg->quant_dtype) ||
        cli_scale_rule(cmd, GET("scale-rule"), &cfg->scale_rule))
        return CLI_USAGE;
    /* the SwiGLU parameters: checked here, before the problem is built, under the options' own names (the library
     * checks them too, but only once the job has started, and names its config fields) */
    if (act == MXFP8_ACT_GPT_OSS_SWIGLU) {
        if (!isfinite(cfg->swiglu_alpha))
            return cli_error(cmd, "--swiglu-alpha must be finite, got '%s'", GET("swiglu-alpha"));
        if (!(cfg->swiglu_limit > 0.0f))
            return cli_error(cmd, "--swiglu-limit must be > 0 (inf: no limit), got '%s'", GET("swiglu-limit"));
    } else if (GET("swiglu-alpha") || GET("swiglu-limit")) {
        return cli_error(cmd, "--%s applies only to --activation %s (the activation is %s)",
                         GET("swiglu-alpha") ? "swiglu-alpha" : "swiglu-limit",
                         mxfp8_enum_name(MXFP8_ENUM_ACTIVATION, MXFP8_ACT_GPT_OSS_SWIGLU),
                         mxfp8_enum_name(MXFP8_ENUM_ACTIVATION, act));
    }
    cfg->activation = (mxfp8_activation)act;
    cfg->affinity_option = (mxfp8_affinity_option)aff;
    if (GET("bias")) cfg->bias = 1;
#undef GET
    return CLI_OK;
}

/* ---- the --stats table ---- */
void cli_stats_header(FILE *f, const char *first) {
    fprintf(f, "%-20s %12s %10s %10s %10s %9s %8s %12s %10s\n", first, "elements", "saturated", "flushed", "subnormal",
            "nonfinite", "zero", "scale e", "SQNR dB");
    fprintf(f, "%-20s %12s %10s %10s %10s %9s %8s %12s %10s\n", "", "", "", "to zero", "codes", "groups", "groups",
            "min..max", "");
}

void cli_stats_row(FILE *f, const char *name, const mxfp8_quant_stats *s) {
    int lo = -1, hi = -1;
    for (int c = 0; c < 255; c++) /* finite scale codes; 255 (NaN) is counted in the nonfinite column */
        if (s->scale_histogram[c]) {
            if (lo < 0) lo = c;
            hi = c;
        }
    char range[32] = "-", sq[32];
    if (lo >= 0) snprintf(range, sizeof range, "%d..%d", lo - 127, hi - 127);
    double db = mxfp8_quant_stats_sqnr_db(s);
    if (isnan(db)) snprintf(sq, sizeof sq, "-");
    else if (isinf(db)) snprintf(sq, sizeof sq, "inf");
    else snprintf(sq, sizeof sq, "%.2f", db);
    fprintf(f, "%-20s %12lld %10lld %10lld %10lld %9lld %8lld %12s %10s\n", name, (long long)s->elements,
            (long long)s->saturated, (long long)s->flushed_to_zero, (long long)s->subnormal,
            (long long)s->nonfinite_groups, (long long)s->zero_groups, range, sq);
}

void cli_stats_note(FILE *f) {
    fprintf(f, "saturated: |x / 2^e| above max normal before clamping; flushed: x != 0 with a zero code; scale e:\n"
               "the shared exponents used (E8M0 code - 127); SQNR = 10 log10(sum x^2 / sum (x - q)^2).\n");
}

void cli_matmul_stats_table(FILE *f, const mxfp8_quant_stats st[4]) {
    static const char *const names[4] = {"output_grad along N", "weights along N", "output_grad along M",
                                         "input along M"};
    fprintf(f, "\nquantization statistics (the warm-up call):\n");
    cli_stats_header(f, "operand");
    for (int i = 0; i < 4; i++) cli_stats_row(f, names[i], &st[i]);
    cli_stats_note(f);
}

void cli_moe_stats_table(FILE *f, const mxfp8_quant_stats *st, int64_t experts) {
    fprintf(f, "\nquantization statistics of the backward's GEMM operands, per expert (the warm-up call; operands it\n"
               "did not quantize, e.g. of experts without tokens, are left out):\n");
    cli_stats_header(f, "expert operand");
    for (int64_t e = 0; e < experts; e++)
        for (int op = 0; op < MXFP8_MOE_NUM_OPERANDS; op++) {
            const mxfp8_quant_stats *s = &st[e * MXFP8_MOE_NUM_OPERANDS + op];
            if (!s->elements) continue;
            char name[32];
            snprintf(name, sizeof name, "%lld %s", (long long)e, cli_moe_operand_name(op));
            cli_stats_row(f, name, s);
        }
    cli_stats_note(f);
}
