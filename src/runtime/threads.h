/* threads.h -- the thread count of a call (threads.c) (internal). */
#ifndef MXFP8_RUNTIME_THREADS_H
#define MXFP8_RUNTIME_THREADS_H

/** MXFP8_NUM_THREADS as the library reads it: 0 if unset/empty, -1 if not a whole positive decimal integer (then
 *  ignored), else the value clamped to MXFP8_MAX_THREADS. */
int mxfp8i_parse_num_threads(const char *s);
/** Threads a call may use: mxfp8_set_num_threads, else MXFP8_NUM_THREADS, else OMP_NUM_THREADS, else
 *  omp_get_max_threads(); clamped to MXFP8_MAX_THREADS. >= 1. */
int mxfp8i_num_threads(void);

#endif /* MXFP8_RUNTIME_THREADS_H */
