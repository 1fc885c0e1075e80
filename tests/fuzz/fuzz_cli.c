/*
 * fuzz_cli.c -- libFuzzer target: the CLI argument parser (tools/cli.c) on arbitrary argument vectors.
 *
 * The input is split at NUL bytes into at most 64 arguments (argv[0] = the first, as a command name). cli_parse runs
 * with an option table that has every kind the commands use (long/short, flags, values, names that prefix each
 * other), and each parsed value then goes through the value parsers (cli_int with several ranges, cli_choice,
 * cli_scale_rule, cli_group, cli_float8_dtype). Checked: the return codes are the documented ones, positional
 * arguments stay within maxpos, every value points inside the input, a flag's value is "1". The parsers' error
 * lines go to a /dev/null stream (stderr is swapped for it; sanitizer reports still reach fd 2).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define FUZZ_ASSERT(cond, ...)                                                                                    \
    do {                                                                                                          \
        if (!(cond)) {                                                                                            \
            fprintf(real_stderr, "fuzz assertion failed: %s: ", #cond);                                           \
            fprintf(real_stderr, __VA_ARGS__);                                                                    \
            fputc('\n', real_stderr);                                                                             \
            abort();                                                                                              \
        }                                                                                                         \
    } while (0)

static FILE *real_stderr;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    real_stderr = stderr;
    FILE *null = fopen("/dev/null", "w");
    if (null) stderr = null;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    enum { MAXARG = 64, MAXPOS = 3 };
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = 0;
    char *argv[MAXARG + 1];
    int argc = 0;
    for (size_t i = 0; i <= size && argc < MAXARG;) {
        argv[argc++] = buf + i;
        i += strlen(buf + i) + 1;
    }
    argv[argc] = NULL;
    cli_opt opts[] = {
        {"H", 0, 0, NULL},           {"T", 0, 0, NULL},       {"topk", 'k', 0, NULL},    {"threads", 0, 0, NULL},
        {"scale-rule", 0, 0, NULL},  {"group", 'g', 0, NULL}, {"float8-dtype", 0, 0, NULL},
        {"axis", 'a', 0, NULL},      {"output", 'o', 0, NULL}, {"out", 0, 0, NULL},      {"bias", 0, 1, NULL},
        {"b", 'b', 1, NULL},         {"activation", 0, 0, NULL}, {"gate-clamp", 0, 0, NULL},
    };
    const int nopts = (int)(sizeof opts / sizeof opts[0]);
    const char *pos[MAXPOS];
    int npos = -1;
    const char *cmd = argc > 0 && argv[0][0] ? argv[0] : "fuzz";
    int rc = cli_parse(cmd, argc, argv, opts, nopts, pos, MAXPOS, &npos);
    FUZZ_ASSERT(rc == CLI_OK || rc == CLI_USAGE || rc == -1, "cli_parse returned %d", rc);
    FUZZ_ASSERT(npos >= 0 && npos <= MAXPOS, "npos %d", npos);
    for (int i = 0; i < npos; i++)
        FUZZ_ASSERT(pos[i] >= buf && pos[i] <= buf + size, "positional %d points outside the input", i);
    for (int i = 0; i < nopts; i++) {
        const char *v = opts[i].value;
        if (!v) continue;
        if (opts[i].is_flag) FUZZ_ASSERT(!strcmp(v, "1"), "flag --%s has value '%s'", opts[i].name, v);
        else FUZZ_ASSERT(v >= buf && v <= buf + size, "--%s points outside the input", opts[i].name);
    }
    FUZZ_ASSERT(cli_get(opts, nopts, "no-such-option") == NULL, "cli_get of an unknown option");
    if (rc == CLI_OK) {
        int64_t x = 7;
        int r = cli_int(cmd, "H", cli_get(opts, nopts, "H"), 1, 1 << 20, &x);
        FUZZ_ASSERT(r == CLI_OK || r == CLI_USAGE, "cli_int %d", r);
        FUZZ_ASSERT(r != CLI_OK || (x >= 1 && x <= (1 << 20)), "cli_int gave %lld", (long long)x);
        x = 0;
        r = cli_int(cmd, "T", cli_get(opts, nopts, "T"), INT64_MIN, INT64_MAX, &x);
        FUZZ_ASSERT(r == CLI_OK || r == CLI_USAGE, "cli_int %d", r);
        x = -5;
        r = cli_int(cmd, "axis", cli_get(opts, nopts, "axis"), -6, 5, &x);
        FUZZ_ASSERT(r != CLI_OK || (x >= -6 && x <= 5), "cli_int axis gave %lld", (long long)x);
        static const char *const acts[] = {"silu", "swish", "squared_relu"};
        int a = -1;
        r = cli_choice(cmd, "activation", cli_get(opts, nopts, "activation"), acts, 3, &a);
        FUZZ_ASSERT(r == CLI_USAGE || a == -1 || (a >= 0 && a < 3), "cli_choice gave %d", a);
        mxfp8_scale_rule rule = MXFP8_SCALE_NKI;
        r = cli_scale_rule(cmd, cli_get(opts, nopts, "scale-rule"), &rule);
        FUZZ_ASSERT((unsigned)rule <= MXFP8_SCALE_RCEIL, "rule %d", (int)rule);
        mxfp8_group_scheme g = MXFP8_GROUP_1X32;
        r = cli_group(cmd, cli_get(opts, nopts, "group"), &g);
        FUZZ_ASSERT((unsigned)g <= MXFP8_GROUP_WRAPX, "group %d", (int)g);
        mxfp8_format f = MXFP8_FMT_E4M3;
        r = cli_float8_dtype(cmd, cli_get(opts, nopts, "float8-dtype"), &f);
        FUZZ_ASSERT((unsigned)f <= MXFP8_FMT_E5M2, "format %d", (int)f);
        r = cli_threads(cmd, cli_get(opts, nopts, "threads"));
        FUZZ_ASSERT(r == CLI_OK || r == CLI_USAGE, "cli_threads %d", r);
        mxfp8_set_num_threads(1);
    }
    free(buf);
    return 0;
}
