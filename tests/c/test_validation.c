/*
 * test_validation.c -- table-driven test of input validation at every public entry.
 *
 * Each entry point has a fixture: a small, VALID call (its tensors live in private 64 KiB buffers, inputs filled
 * with valid values, outputs with the sentinel byte 0xA5). The fixture's baseline call must succeed and write
 * something (so the "untouched" check below can fail). Then every case starts again from the same bytes, breaks
 * exactly one thing and calls the entry, asserting
 *   - the exact mxfp8_status,
 *   - that mxfp8_last_error_message() starts with the function's name and names the parameter (as a word),
 *   - that EVERY buffer (outputs and inputs) still holds its bytes: no output is written on error.
 *
 * Cases:
 *   generic, applied to every tensor of every fixture (the GEN_* table below): NULL pointer argument, NULL data,
 *   negative extent, overflowing shape product, strides whose span overflows, unaccepted and unknown dtypes,
 *   ndim > MXFP8_MAX_DIMS, wrong rank, each extent +1 (shape mismatch with a related tensor), and for outputs:
 *   aliasing every input and every other output, zero stride (elements overlap);
 *   specific (the per-fixture SPECIAL tables): axis out of range, unknown enum values, block_size <= 0, token and
 *   expert ids out of range, num_valid_tokens < 0, config sizes < 0 or disagreeing, dtype disagreements between
 *   related tensors, ...
 * Buffers are far larger than any view, so a check that is missing shows up as a failed assertion, not a crash
 * (and the ASan build catches any stray access).
 *
 * Layout: validation/harness.{h,c} (fixtures, generic cases, the runner) and one file per API area in
 * tests/c/validation (runtime, quant, gemm, reference, layouts, moe), linked into this one test.
 */
#include "validation/harness.h"

int main(void) {
    printf("test_validation: table-driven validation cases per public entry\n");
    validation_runtime();
    validation_quant();
    validation_gemm();
    validation_reference();
    validation_layouts();
    validation_moe();
    printf("test_validation: %ld cases\n", n_cases);
    return tu_finish("test_validation");
}
