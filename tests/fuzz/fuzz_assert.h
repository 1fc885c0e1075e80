/* fuzz_assert.h -- the one assertion every fuzz target uses: crash (so libFuzzer records the input) with a message. */
#ifndef MXFP8_FUZZ_ASSERT_H
#define MXFP8_FUZZ_ASSERT_H
#include <stdio.h>
#include <stdlib.h>

#define FUZZ_ASSERT(cond, ...)                                                                                    \
    do {                                                                                                          \
        if (!(cond)) {                                                                                            \
            fprintf(stderr, "fuzz assertion failed: %s: ", #cond);                                                \
            fprintf(stderr, __VA_ARGS__);                                                                         \
            fputc('\n', stderr);                                                                                  \
            abort();                                                                                              \
        }                                                                                                         \
    } while (0)

#endif
