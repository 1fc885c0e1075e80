/* threads.c -- the thread count every call uses (mxfp8_set_num_threads, MXFP8_NUM_THREADS, OMP_NUM_THREADS). */
#include <stdatomic.h>
#include <stdlib.h>
#include <threads.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "threads.h"
#include "error.h"

int mxfp8i_parse_num_threads(const char *s) {
    if (!s || !*s) return 0;
    long long v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        if (v <= MXFP8_MAX_THREADS) v = v * 10 + (*p - '0');
    }
    if (v < 1) return -1;
    return v > MXFP8_MAX_THREADS ? MXFP8_MAX_THREADS : (int)v;
}

static int g_env_threads;
static once_flag g_once = ONCE_FLAG_INIT;

/* MXFP8_NUM_THREADS must be a whole positive decimal integer; anything else (abc, -2, 0, 4x) is ignored, as if unset
 * (mxfp8 info says so). OMP_NUM_THREADS is read as OpenMP does (its first number). Both are clamped to
 * MXFP8_MAX_THREADS. Read once per process. */
static void read_env(void) {
    int nt = mxfp8i_parse_num_threads(getenv("MXFP8_NUM_THREADS"));
    if (nt <= 0) {
        const char *e = getenv("OMP_NUM_THREADS");
        if (e && *e) nt = atoi(e);
    }
#ifdef _OPENMP
    if (nt <= 0) nt = omp_get_max_threads();
#endif
    if (nt <= 0) nt = 1;
    if (nt > MXFP8_MAX_THREADS) nt = MXFP8_MAX_THREADS;
    g_env_threads = nt;
}

static atomic_int g_threads_override;

mxfp8_status mxfp8_set_num_threads(int num_threads) {
    mxfp8i_clear_error();
    MXFP8I_RETURN_ERROR_IF(num_threads < 0, MXFP8_ERR_INVALID_ARGUMENT,
                           "mxfp8_set_num_threads: num_threads %d is negative", num_threads);
    atomic_store(&g_threads_override, num_threads > MXFP8_MAX_THREADS ? MXFP8_MAX_THREADS : num_threads);
    return MXFP8_OK;
}

int mxfp8i_num_threads(void) {
    int o = atomic_load(&g_threads_override);
    if (o > 0) return o;
    call_once(&g_once, read_env);
    return g_env_threads;
}
