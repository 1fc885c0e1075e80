/*
 * error.h -- the one error model of libmxfp8 (internal).
 *
 * A public entry calls mxfp8i_clear_error(), validates everything (each check sets the thread-local message and
 * returns the status), and only then computes. Internal code called after validation returns MXFP8_OK or
 * MXFP8_ERR_OUT_OF_MEMORY only. The two checking shapes (as zstd's RETURN_ERROR_IF / FORWARD_IF_ERROR):
 *   MXFP8I_RETURN_ERROR_IF(cond, status, "fmt", ...)   fail with a message when cond holds
 *   MXFP8I_FORWARD_IF_ERROR(expr)                      return the status of a check that failed (message already set)
 */
#ifndef MXFP8_RUNTIME_ERROR_H
#define MXFP8_RUNTIME_ERROR_H

#define MXFP8_REFERENCE_API /* the library implements the no-ABI-promise section of mxfp8.h too */
#include "mxfp8.h"

#if defined(__GNUC__)
#define MXFP8_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MXFP8_PRINTF(a, b)
#endif

/** Set the calling thread's last error message (printf-style) and return `status`. */
mxfp8_status mxfp8i_error(mxfp8_status status, const char *fmt, ...) MXFP8_PRINTF(2, 3);
/** Clear the calling thread's last error message (called at the start of every public entry). */
void mxfp8i_clear_error(void);

#define MXFP8I_RETURN_ERROR_IF(cond, status, ...)                                                                   \
    do {                                                                                                            \
        if (cond) return mxfp8i_error((status), __VA_ARGS__);                                                       \
    } while (0)
#define MXFP8I_FORWARD_IF_ERROR(expr)                                                                               \
    do {                                                                                                            \
        mxfp8_status mxfp8i_st_ = (expr);                                                                           \
        if (mxfp8i_st_ != MXFP8_OK) return mxfp8i_st_;                                                              \
    } while (0)

#endif /* MXFP8_RUNTIME_ERROR_H */
