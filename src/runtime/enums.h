/* enums.h -- the enumeration tables' internal helpers (the public functions are in include/mxfp8.h). */
#ifndef MXFP8_RUNTIME_ENUMS_H
#define MXFP8_RUNTIME_ENUMS_H

#include "error.h"

/** 1 when `value` is one of enumeration e's values, else 0. */
int mxfp8i_enum_valid(mxfp8_enum e, int value);
/** The one range check of an enumeration argument: MXFP8_OK, or MXFP8_ERR_INVALID_ARGUMENT with the message
 *  "fn: param V is not a valid <what> (expected name (0), ...)". */
mxfp8_status mxfp8i_check_enum(const char *fn, const char *param, mxfp8_enum e, int value);

#endif /* MXFP8_RUNTIME_ENUMS_H */
