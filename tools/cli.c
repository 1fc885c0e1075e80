/* cli.c -- option parsing, error reporting, timing and the seeded RNG shared by the mxfp8 commands. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"

void (*cli_message_hook)(void);

int cli_error(const char *cmd, const char *fmt, ...) {
    if (cli_message_hook) cli_message_hook();
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "mxfp8 %s: error: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return CLI_USAGE;
}

int cli_lib_error(const char *cmd, const char *what, mxfp8_status st) {
    const char *msg = mxfp8_last_error_message();
    size_t n = strlen(what); /* the library's message starts with the function's name: don't print it twice */
    if (msg && !strncmp(msg, what, n) && msg[n] == ':' && msg[n + 1] == ' ') msg += n + 2;
    return cli_error(cmd, "%s failed: %s%s%s", what, mxfp8_status_string(st), msg && *msg ? ": " : "",
                     msg ? msg : "");
}

static cli_opt *find_long(cli_opt *opts, int nopts, const char *name, size_t len) {
    for (int i = 0; i < nopts; i++)
        if (strlen(opts[i].name) == len && !strncmp(opts[i].name, name, len)) return &opts[i];
    return NULL;
}

int cli_parse(const char *cmd, int argc, char **argv, cli_opt *opts, int nopts, const char **pos, int maxpos,
              int *npos) {
    *npos = 0;
    int only_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_pos || a[0] != '-' || a[1] == 0) {
            if (*npos >= maxpos)
                return cli_error(cmd, "unexpected argument '%s' (see mxfp8 %s --help)", a, cmd);
            pos[(*npos)++] = a;
            continue;
        }
        if (!strcmp(a, "--")) {
            only_pos = 1;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return -1;
        cli_opt *o = NULL;
        const char *val = NULL;
        if (a[1] == '-') {
            const char *name = a + 2, *eq = strchr(name, '=');
            o = find_long(opts, nopts, name, eq ? (size_t)(eq - name) : strlen(name));
            if (eq) val = eq + 1;
        } else if (a[2] == 0) {
            for (int k = 0; k < nopts; k++)
                if (opts[k].short_name && opts[k].short_name == a[1]) o = &opts[k];
        }
        if (!o) return cli_error(cmd, "unknown option '%s' (see mxfp8 %s --help)", a, cmd);
        if (o->is_flag) {
            if (val) return cli_error(cmd, "option --%s takes no value", o->name);
            o->value = "1";
            continue;
        }
        if (!val) {
            if (i + 1 >= argc) return cli_error(cmd, "option --%s needs a value", o->name);
            val = argv[++i];
        }
        o->value = val;
    }
    return CLI_OK;
}

const char *cli_get(const cli_opt *opts, int nopts, const char *name) {
    for (int i = 0; i < nopts; i++)
        if (!strcmp(opts[i].name, name)) return opts[i].value;
    return NULL;
}

int cli_begin(cli_cmdline *cl, const char *cmd, int argc, char **argv, cli_opt *opts, int nopts, int maxpos,
              void (*help)(void)) {
    memset(cl, 0, sizeof *cl);
    cl->cmd = cmd;
    cl->opts = opts;
    cl->nopts = nopts;
    if (maxpos > CLI_MAX_POS) maxpos = CLI_MAX_POS;
    int rc = cli_parse(cmd, argc, argv, opts, nopts, cl->pos, maxpos, &cl->npos);
    if (rc < 0) {
        help();
        return CLI_OK;
    }
    if (rc) return rc;
    if (cli_threads(cmd, cli_get(opts, nopts, "threads"))) return CLI_USAGE;
    return CLI_CONTINUE;
}

const char *cli_val(const cli_cmdline *cl, const char *name) { return cli_get(cl->opts, cl->nopts, name); }

int cli_int(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s) return CLI_OK;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return cli_error(cmd, "--%s must be an integer in [%lld, %lld], got '%s'", opt, (long long)lo, (long long)hi,
                         s);
    *out = v;
    return CLI_OK;
}

int cli_choice(const char *cmd, const char *opt, const char *s, const char *const *choices, int n, int *out) {
    if (!s) return CLI_OK;
    for (int i = 0; i < n; i++)
        if (!strcasecmp(s, choices[i])) {
            *out = i;
            return CLI_OK;
        }
    char list[256] = "";
    for (int i = 0; i < n; i++) {
        strncat(list, choices[i], sizeof list - strlen(list) - 1);
        if (i + 1 < n) strncat(list, "|", sizeof list - strlen(list) - 1);
    }
    return cli_error(cmd, "--%s must be one of %s, got '%s'", opt, list, s);
}

int cli_enum(const char *cmd, const char *opt, const char *s, mxfp8_enum e, int *out) {
    if (!s) return CLI_OK;
    int32_t v;
    if (mxfp8_enum_from_name(e, s, &v) != MXFP8_OK) return cli_error(cmd, "--%s: %s", opt, mxfp8_last_error_message());
    *out = (int)v;
    return CLI_OK;
}

const char *cli_names(mxfp8_enum e, const char *sep, int def) {
    static char ring[8][256];
    static int next;
    char *buf = ring[next++ & 7];
    size_t n = 0;
    const int count = mxfp8_enum_count(e);
    buf[0] = 0;
    for (int v = 0; v < count && n < sizeof ring[0]; v++) {
        const char *between = v == 0 ? "" : sep ? sep : v + 1 == count ? " or " : ", ";
        int w = snprintf(buf + n, sizeof ring[0] - n, "%s%s%s", between, mxfp8_enum_name(e, v),
                         !sep && v == def ? " (default)" : "");
        if (w < 0) break;
        n += (size_t)w;
    }
    return buf;
}

void cli_help_values(const char *indent, mxfp8_enum e, int def) {
    for (int v = 0; v < mxfp8_enum_count(e); v++)
        printf("%s%s%s: %s\n", indent, mxfp8_enum_name(e, v), v == def ? " (default)" : "", mxfp8_enum_doc(e, v));
}

int cli_not_input(const char *cmd, const char *opt, const char *out, const char *in) {
    struct stat so, si;
    if (out && in && stat(out, &so) == 0 && stat(in, &si) == 0 && so.st_dev == si.st_dev && so.st_ino == si.st_ino)
        return cli_error(cmd, "--%s %s is the input file %s: writing it would replace the input; give another path",
                         opt, out, in);
    return CLI_OK;
}

int cli_scale_rule(const char *cmd, const char *s, mxfp8_scale_rule *out) {
    int v = (int)*out;
    int rc = cli_enum(cmd, "scale-rule", s, MXFP8_ENUM_SCALE_RULE, &v);
    *out = (mxfp8_scale_rule)v;
    return rc;
}

int cli_group(const char *cmd, const char *s, mxfp8_group_scheme *out) {
    int v = (int)*out;
    int rc = cli_enum(cmd, "group", s, MXFP8_ENUM_GROUP_SCHEME, &v);
    *out = (mxfp8_group_scheme)v;
    return rc;
}

int cli_float8_dtype(const char *cmd, const char *s, mxfp8_format *out) {
    /* exactly the NKI page's strings (the library's float8_dtype names) */
    int v = (int)*out;
    int rc = cli_enum(cmd, "float8-dtype", s, MXFP8_ENUM_FLOAT8_DTYPE, &v);
    *out = (mxfp8_format)v;
    return rc;
}

int cli_threads(const char *cmd, const char *s) {
    int64_t n = 0;
    if (!s) return CLI_OK;
    if (cli_int(cmd, "threads", s, 1, 4096, &n)) return CLI_USAGE;
    mxfp8_status st = mxfp8_set_num_threads((int)n);
    if (st != MXFP8_OK) return cli_lib_error(cmd, "mxfp8_set_num_threads", st);
    return CLI_OK;
}

/* "LO,HI" with either side empty or "none" meaning no limit. */
int cli_clamp(const char *cmd, const char *opt, const char *s, float *lo, float *hi) {
    if (!s) return CLI_OK;
    const char *comma = strchr(s, ',');
    if (!comma) return cli_error(cmd, "--%s wants LO,HI (either may be empty), got '%s'", opt, s);
    char a[64], b[64];
    snprintf(a, sizeof a, "%.*s", (int)(comma - s), s);
    snprintf(b, sizeof b, "%s", comma + 1);
    const char *parts[2] = {a, b};
    float *dst[2] = {lo, hi};
    for (int i = 0; i < 2; i++) {
        if (!*parts[i] || !strcmp(parts[i], "none")) continue;
        char *end;
        double v = strtod(parts[i], &end);
        if (*end || v != v) return cli_error(cmd, "--%s: '%s' is not a number", opt, parts[i]);
        *dst[i] = (float)v;
    }
    if (*lo > *hi) return cli_error(cmd, "--%s: lower limit %g is above the upper limit %g", opt, *lo, *hi);
    return CLI_OK;
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* xoshiro256** (Blackman & Vigna), seeded through splitmix64. */
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void cli_rng_seed(cli_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
    r->has_spare = 0;
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t cli_rng_u64(cli_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double cli_rng_uniform(cli_rng *r) { return (double)(cli_rng_u64(r) >> 11) * 0x1.0p-53; }

double cli_rng_normal(cli_rng *r) {
    if (r->has_spare) {
        r->has_spare = 0;
        return r->spare;
    }
    double u1, u2;
    do u1 = cli_rng_uniform(r);
    while (u1 <= 0.0);
    u2 = cli_rng_uniform(r);
    double rad = sqrt(-2.0 * log(u1)), th = 2.0 * M_PI * u2;
    r->spare = rad * sin(th);
    r->has_spare = 1;
    return rad * cos(th);
}
