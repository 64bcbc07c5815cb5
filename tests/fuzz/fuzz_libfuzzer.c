/* libFuzzer's entry point over a fuzz target: a broken property aborts, so
 * libFuzzer keeps the input. */
#include <stdlib.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (fuzz_one(data, size))
        abort();
    return 0;
}
