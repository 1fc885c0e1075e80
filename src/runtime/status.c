/* status.c -- status strings and the thread-local last-error message. */
#include <stdarg.h>
#include <stdio.h>

#include "error.h"

static _Thread_local char g_last_error[512];

const char *mxfp8_status_string(mxfp8_status status) {
    switch (status) {
    case MXFP8_OK: return "success";
    case MXFP8_ERR_NULL_POINTER: return "null pointer";
    case MXFP8_ERR_INVALID_ARGUMENT: return "invalid argument";
    case MXFP8_ERR_SHAPE_MISMATCH: return "shape mismatch";
    case MXFP8_ERR_DTYPE: return "unsupported dtype";
    case MXFP8_ERR_OUT_OF_MEMORY: return "out of memory";
    case MXFP8_ERR_SIZE_OVERFLOW: return "size overflow";
    case MXFP8_ERR_ALIASING: return "output aliases another tensor";
    case MXFP8_ERR_INDEX_OUT_OF_RANGE: return "index out of range";
    case MXFP8_ERR_UNSUPPORTED: return "unsupported combination";
    case MXFP8_ERR_BAD_STRIDES: return "bad strides";
    case MXFP8_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

const char *mxfp8_last_error_message(void) { return g_last_error; }

void mxfp8i_clear_error(void) { g_last_error[0] = '\0'; }

mxfp8_status mxfp8i_error(mxfp8_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
    va_end(ap);
    return status;
}

unsigned mxfp8_version_number(void) { return MXFP8_VERSION_NUMBER; }

#define MXFP8_STR2(x) #x
#define MXFP8_STR(x) MXFP8_STR2(x)
const char *mxfp8_version_string(void) {
    return MXFP8_STR(MXFP8_VERSION_MAJOR) "." MXFP8_STR(MXFP8_VERSION_MINOR) "." MXFP8_STR(MXFP8_VERSION_PATCH);
}
