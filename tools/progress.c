/* progress.c -- the progress line of the long commands (see progress.h). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "progress.h"

#define MAX_PHASES 32

typedef struct phase {
    const char *label;
    cli_work kind;
    double units;
    double seconds; /* when finished */
} phase;

static struct {
    pthread_mutex_t mu;
    pthread_t ticker;
    int ticking, stop;
    int show, drawn;
    const char *cmd;
    phase ph[MAX_PHASES];
    int n, cur; /* cur: index of the running phase, -1 before the first */
    double t0, t_phase;
    double shown_pct; /* the percentage only grows, whatever the estimates do */
    double done_units[CLI_WORK_KINDS], done_seconds[CLI_WORK_KINDS];
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cur = -1};

/* Rate of a kind (units per second): learned from finished phases, else a deliberately rough prior. */
static double rate(cli_work k) {
    static const double prior[CLI_WORK_KINDS] = {5e8, 2e10, 2e9};
    if (g.done_seconds[k] > 0.05 && g.done_units[k] > 0) return g.done_units[k] / g.done_seconds[k];
    return prior[k];
}

static void fmt_time(double s, char *buf, size_t len) {
    if (s < 60) snprintf(buf, len, "%.0f s", s);
    else if (s < 3600) snprintf(buf, len, "%d min %02d s", (int)(s / 60), (int)s % 60);
    else snprintf(buf, len, "%d h %02d min", (int)(s / 3600), (int)(s / 60) % 60);
}

/* Draw the line (mutex held). */
static void draw(void) {
    if (!g.show || g.cur < 0 || g.cur >= g.n) return;
    double now = cli_now(), elapsed = now - g.t0, in_phase = now - g.t_phase;
    double left = 0;
    for (int i = g.cur; i < g.n; i++) {
        double e = g.ph[i].units / rate(g.ph[i].kind);
        if (i == g.cur) e = e > in_phase ? e - in_phase : 0.1 * in_phase; /* overdue: the estimate was short */
        left += e;
    }
    double pct = 100.0 * elapsed / (elapsed + left);
    if (pct < g.shown_pct) pct = g.shown_pct;
    if (pct > 99) pct = 99;
    g.shown_pct = pct;
    char el[32], lf[32];
    fmt_time(elapsed, el, sizeof el);
    fmt_time(left, lf, sizeof lf);
    fprintf(stderr, "\r\033[Kmxfp8 %s: [%3.0f%%] %s (step %d of %d), %s elapsed, about %s left", g.cmd, pct,
            g.ph[g.cur].label, g.cur + 1, g.n, el, lf);
    fflush(stderr);
    g.drawn = 1;
}

static void erase(void) {
    if (g.drawn) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        g.drawn = 0;
    }
}

static void *tick(void *arg) {
    (void)arg;
    for (;;) {
        struct timespec ts = {0, 250 * 1000 * 1000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&g.mu);
        int stop = g.stop;
        if (!stop) draw();
        pthread_mutex_unlock(&g.mu);
        if (stop) return NULL;
    }
}

static void hook(void) { cli_progress_clear(); }

void cli_progress_init(const char *cmd, int show) {
    pthread_mutex_lock(&g.mu);
    g.cmd = cmd;
    g.show = show && isatty(2);
    g.n = 0;
    g.cur = -1;
    g.shown_pct = 0;
    g.t0 = cli_now();
    memset(g.done_units, 0, sizeof g.done_units);
    memset(g.done_seconds, 0, sizeof g.done_seconds);
    pthread_mutex_unlock(&g.mu);
    cli_message_hook = hook;
}

void cli_progress_add(const char *label, cli_work kind, double units) {
    pthread_mutex_lock(&g.mu);
    if (g.n < MAX_PHASES) g.ph[g.n++] = (phase){label, kind, units > 0 ? units : 0, 0};
    pthread_mutex_unlock(&g.mu);
}

/* Close the running phase (mutex held). */
static void finish_current(void) {
    if (g.cur < 0 || g.cur >= g.n) return;
    phase *p = &g.ph[g.cur];
    p->seconds = cli_now() - g.t_phase;
    g.done_units[p->kind] += p->units;
    g.done_seconds[p->kind] += p->seconds;
}

void cli_progress_next(void) {
    pthread_mutex_lock(&g.mu);
    finish_current();
    if (g.cur < g.n) g.cur++;
    g.t_phase = cli_now();
    draw();
    if (g.show && !g.ticking && g.cur < g.n) {
        g.stop = 0;
        g.ticking = pthread_create(&g.ticker, NULL, tick, NULL) == 0;
    }
    pthread_mutex_unlock(&g.mu);
}

void cli_progress_done(void) {
    pthread_mutex_lock(&g.mu);
    finish_current();
    g.cur = g.n;
    g.stop = 1;
    int join = g.ticking;
    g.ticking = 0;
    pthread_mutex_unlock(&g.mu);
    if (join) pthread_join(g.ticker, NULL);
    pthread_mutex_lock(&g.mu);
    erase();
    pthread_mutex_unlock(&g.mu);
}

double cli_progress_seconds(cli_work kind) {
    pthread_mutex_lock(&g.mu);
    double s = g.done_seconds[kind];
    pthread_mutex_unlock(&g.mu);
    return s;
}

double cli_progress_elapsed(void) { return cli_now() - g.t0; }

void cli_progress_clear(void) {
    pthread_mutex_lock(&g.mu);
    erase();
    g.show = 0; /* a message follows (an error): the line stays away */
    pthread_mutex_unlock(&g.mu);
}
