/* formats.h -- the .npy (npy.c) and .safetensors (safetensors.c) readers and writers that tensorfile.c dispatches to
 * (not used outside tools/io). */
#ifndef MXFP8_TOOLS_IO_FORMATS_H
#define MXFP8_TOOLS_IO_FORMATS_H

#include "fileaccess.h"

/* Format readers / writers (path checks and atomicity handled by the callers above). */
int tf_npy_load(const char *path, tf_set *out, char *err, size_t errlen);
int tf_npy_write(tf_atomic *a, const tf_tensor *t, char *err, size_t errlen);
int tf_npy_dtype_ok(tf_dtype d);
int tf_st_load(const char *path, tf_set *out, char *err, size_t errlen);
int tf_st_write(tf_atomic *a, const tf_set *set, char *err, size_t errlen);

#endif /* MXFP8_TOOLS_IO_FORMATS_H */
