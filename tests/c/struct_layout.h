/*
 * struct_layout.h -- the JSON printer of tests/c/struct_layout.c and tests/mpi/struct_layout_mpi.c: BEGIN(S), then
 * F(S, f) for each field, then END(S) print {"S": {"size": .., "align": .., "fields": [["f", offset, size], ..]}, ..}
 * (the caller prints the closing brace). tests/python/test_struct_layout.py reads the output and the tables.
 */
#ifndef MXFP8_TESTS_STRUCT_LAYOUT_H
#define MXFP8_TESTS_STRUCT_LAYOUT_H

#include <stdalign.h>
#include <stddef.h>
#include <stdio.h>

static int first_struct = 1, first_field;

#define BEGIN(S)                                                                                                       \
    do {                                                                                                               \
        printf("%s\n  \"%s\": {\"size\": %zu, \"align\": %zu, \"fields\": [", first_struct ? "{" : ",", #S,         \
               sizeof(S), alignof(S));                                                                                  \
        first_struct = 0;                                                                                              \
        first_field = 1;                                                                                               \
    } while (0)
#define F(S, f)                                                                                                        \
    do {                                                                                                               \
        printf("%s[\"%s\", %zu, %zu]", first_field ? "" : ", ", #f, offsetof(S, f), sizeof(((S *)0)->f));            \
        first_field = 0;                                                                                               \
    } while (0)
#define END(S) printf("]}")

#endif /* MXFP8_TESTS_STRUCT_LAYOUT_H */
