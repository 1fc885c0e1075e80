/*
 * cli.h -- shared pieces of the `mxfp8` command-line tool: the command table's function type, exit codes,
 * option parsing and error reporting. The CLI is built on the public header include/mxfp8.h only.
 *
 * Exit codes (every command): 0 ok; 1 a verdict failed (a kernel result is wrong); 2 bad usage, bad input, or an IO
 * error, with one line "mxfp8 <command>: error: <what>" on stderr.
 */
#ifndef MXFP8_TOOLS_CLI_H
#define MXFP8_TOOLS_CLI_H

#include <stdint.h>
#include <stdio.h>

#define MXFP8_REFERENCE_API /* goldens and compare (the no-ABI-promise section of mxfp8.h) */
#include "mxfp8.h"

enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

/** A command: gets argv with argv[0] = the command's name ("quantize"), returns an exit code. */
typedef int (*cli_command_fn)(int argc, char **argv);

int cmd_quantize(int argc, char **argv);
int cmd_dequantize(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_matmul_bwd(int argc, char **argv);
int cmd_moe_bwd(int argc, char **argv);
/** `mxfp8 moe-bwd --expert-parallel` (tools/cmd_moe_ep.c): the main job over MPI ranks (an error without MPI). */
int cmd_moe_bwd_ep(int argc, char **argv);
/** `mxfp8 bench`: the benchmark, in bench/ at the repository root. */
int cmd_bench(int argc, char **argv);

/* ---- option parsing ---- */
/** One option of a command: --name VALUE, --name=VALUE, or -s VALUE (short_name); flags take no value. */
typedef struct cli_opt {
    const char *name;   /**< long name without dashes, e.g. "scale-rule" */
    char short_name;    /**< 0 when none */
    int is_flag;        /**< 1: takes no value */
    const char *value;  /**< set by cli_parse (flags: "1"); NULL when not given */
} cli_opt;

/** Parse argv[1..] of command `cmd`. Positional arguments go to pos[0..*npos) (at most maxpos). Returns CLI_OK,
 *  CLI_USAGE after printing the error, or -1 when --help / -h was given (the caller prints its help, exits 0). */
int cli_parse(const char *cmd, int argc, char **argv, cli_opt *opts, int nopts, const char **pos, int maxpos,
              int *npos);
/** The value of option `name` (NULL when absent). */
const char *cli_get(const cli_opt *opts, int nopts, const char *name);

/* ---- the prologue every command shares ---- */
#define CLI_MAX_POS 8
#define CLI_CONTINUE (-1)
#define CLI_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/** A command's parsed command line. */
typedef struct cli_cmdline {
    const char *cmd;            /**< the command's name, for messages */
    cli_opt *opts;              /**< its option table (values filled in) */
    int nopts;
    const char *pos[CLI_MAX_POS]; /**< positional arguments */
    int npos;
} cli_cmdline;

/** Parse argv (at most maxpos <= CLI_MAX_POS positional arguments), print `help` on --help, and apply --threads
 *  when the table has that option. Returns CLI_CONTINUE when the command goes on, else its exit code: CLI_OK after
 *  the help, CLI_USAGE after an error (already printed). */
int cli_begin(cli_cmdline *cl, const char *cmd, int argc, char **argv, cli_opt *opts, int nopts, int maxpos,
              void (*help)(void));
/** The value of option `name` of a parsed command line (NULL when absent). */
const char *cli_val(const cli_cmdline *cl, const char *name);

/** Called, when set, before cli_error prints (the progress line erases itself: progress.c). */
extern void (*cli_message_hook)(void);
/** Print "mxfp8 <cmd>: error: <msg>" on stderr and return CLI_USAGE. */
int cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** The same for a failed library call: "<what>: <status string>: <last error message>". */
int cli_lib_error(const char *cmd, const char *what, mxfp8_status st);

/** Parse an integer option in [lo, hi]; on error prints and returns CLI_USAGE. Absent (s == NULL) keeps *out. */
int cli_int(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out);
/** Match s against choices[0..n); absent keeps *out. */
int cli_choice(const char *cmd, const char *opt, const char *s, const char *const *choices, int n, int *out);

/** Parsers of the shared option values (absent keeps *out). */
/** --OPT NAME of the library's enumeration e (a canonical name or an alias; mxfp8_enum_from_name), into *out; no
 *  change when s is NULL. An unknown name is a usage error with the library's message (it lists the names). */
int cli_enum(const char *cmd, const char *opt, const char *s, mxfp8_enum e, int *out);
/** The canonical names of enumeration e for help texts, from the library's table: joined by sep ("e4m3|e5m2"), or
 *  with sep NULL as a phrase, the value def marked ("nki (default), ocp or rceil"; def < 0: none marked). The string
 *  stays valid for the next 7 calls (a ring of buffers, so one printf can take several). */
const char *cli_names(mxfp8_enum e, const char *sep, int def);
/** Help lines of an option whose value is a name of enumeration e: "<indent>name: its definition" per value
 *  (mxfp8_enum_doc), "(default)" after the value def. */
void cli_help_values(const char *indent, mxfp8_enum e, int def);
/** Refuse an output path (--opt) that names the input file itself (the same file, through any path): writing it
 *  would replace the input. CLI_OK when either is NULL or absent, else CLI_USAGE after the message. */
int cli_not_input(const char *cmd, const char *opt, const char *out, const char *in);
int cli_scale_rule(const char *cmd, const char *s, mxfp8_scale_rule *out);  /* the library's scale rule names */
int cli_group(const char *cmd, const char *s, mxfp8_group_scheme *out);     /* the library's group scheme names */
/** --float8-dtype: the library's float8_dtype names (MXFP8_ENUM_FLOAT8_DTYPE, exact). */
int cli_float8_dtype(const char *cmd, const char *s, mxfp8_format *out);
/** --gate-clamp / --up-clamp "LO,HI": either side empty or "none" means no limit (keeps *lo / *hi). */
int cli_clamp(const char *cmd, const char *opt, const char *s, float *lo, float *hi);
/** --threads N (N >= 1): mxfp8_set_num_threads. */
int cli_threads(const char *cmd, const char *s);

/* ---- numerics options and the --stats table (tools/cli_numerics.c) ---- */
/** --rounding nearest|stochastic; absent keeps *out. */
int cli_rounding(const char *cmd, const char *opt, const char *s, mxfp8_rounding *out);
/** A 64-bit seed (decimal or 0x hex); absent keeps *out. */
int cli_seed64(const char *cmd, const char *opt, const char *s, uint64_t *out);
/** A float option; absent keeps *out. */
int cli_float_opt(const char *cmd, const char *opt, const char *s, float *out);
/** matmul-bwd --stochastic-rounding LIST: dy, w, x (comma-separated), all or none. */
int cli_matmul_rounding(const char *cmd, const char *s, mxfp8_matmul_bwd_args *a);
/** The MoE layer options of both moe-bwd paths (the single-process command and --expert-parallel), so that they
 *  accept the same ones: put CLI_MOE_LAYER_OPTS in the command's option table and parse them with cli_moe_layer. */
#define CLI_MOE_LAYER_OPTS                                                                                          \
    {"activation", 0, 0, NULL}, {"swiglu-alpha", 0, 0, NULL}, {"swiglu-limit", 0, 0, NULL},                       \
        {"stochastic-rounding", 0, 0, NULL}, {"rounding-seed", 0, 0, NULL}, {"affinity", 0, 0, NULL},             \
        {"gate-clamp", 0, 0, NULL}, {"up-clamp", 0, 0, NULL}, {"float8-dtype", 0, 0, NULL},                       \
        {"scale-rule", 0, 0, NULL}, {"bias", 0, 1, NULL}
/** --activation (the library's names), --swiglu-alpha, --swiglu-limit, --stochastic-rounding, --rounding-seed,
 *  --affinity, --gate-clamp, --up-clamp, --float8-dtype, --scale-rule, --bias into cfg (options not given keep cfg's
 *  values). Returns CLI_OK or CLI_USAGE (message printed). */
int cli_moe_layer(const char *cmd, const cli_opt *opts, int nopts, mxfp8_moe_config *cfg);
/** moe-bwd --stochastic-rounding LIST: operand names (cli_moe_operand_name), gradients, all or none. */
int cli_moe_rounding(const char *cmd, const char *s, uint32_t *mask);
/** The name of an mxfp8_moe_operand ("p1_dy", ...), as the Python package names it. */
const char *cli_moe_operand_name(int op);
/** The --stats table: a two-line header (first column titled `first`), one row per quantization, a note. */
void cli_stats_header(FILE *f, const char *first);
void cli_stats_row(FILE *f, const char *name, const mxfp8_quant_stats *s);
void cli_stats_note(FILE *f);
/** matmul-bwd --stats: the table of mxfp8_matmul_bwd_args.stats (output_grad / weights along N, output_grad / input
 *  along M). */
void cli_matmul_stats_table(FILE *f, const mxfp8_quant_stats st[4]);
/** moe-bwd --stats: one row per (expert, operand) of st[experts * MXFP8_MOE_NUM_OPERANDS] with elements > 0. */
void cli_moe_stats_table(FILE *f, const mxfp8_quant_stats *st, int64_t experts);

/** `mxfp8 diff` (tools/cmd_diff.c). */
int cmd_diff(int argc, char **argv);

/** Wall-clock seconds (monotonic). */
double cli_now(void);

/* ---- a small seeded random generator (xoshiro256**, Box-Muller normals) for the default problems ---- */
typedef struct cli_rng {
    uint64_t s[4];
    int has_spare;
    double spare;
} cli_rng;
void cli_rng_seed(cli_rng *r, uint64_t seed);
uint64_t cli_rng_u64(cli_rng *r);
/** Uniform in [0, 1) with 53 random bits. */
double cli_rng_uniform(cli_rng *r);
/** Standard normal (Box-Muller). */
double cli_rng_normal(cli_rng *r);

#endif /* MXFP8_TOOLS_CLI_H */
