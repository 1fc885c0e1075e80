/* fuzz_safetensors.c -- libFuzzer target: the .safetensors reader (tools/io/safetensors.c) on arbitrary bytes.
 * See fuzz_common.h. */
#include "fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_tmp_init(".safetensors");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_load_and_check(data, size);
    return 0;
}
