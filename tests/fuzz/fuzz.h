/* A fuzz target: one function that takes any bytes and checks what must
 * hold for them (no crash, no sanitizer report, and the target's own
 * properties), and the seeds its inputs grow from.
 *
 * Built two ways. With the driver (fuzz_main.c, any compiler): a short,
 * reproducible run of mutated seeds, as a ctest on every build. With
 * libFuzzer (clang, -DSTOF_LIBFUZZER=ON): coverage-guided runs as long as
 * wanted (docs/fuzzing.md). */
#ifndef STOF_TESTS_FUZZ_H
#define STOF_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

/* 0 when every property held for data; else it says what broke on stderr
 * and returns 1. */
int fuzz_one(const uint8_t *data, size_t size);

/* Seeds: a NULL-terminated list of texts (binary seeds are made by
 * fuzz_seed_bytes). */
extern const char *const fuzz_seeds[];
/* Binary seed k into buf (at most cap bytes); its size, or 0 when there is
 * no seed k. */
size_t fuzz_seed_bytes(int k, uint8_t *buf, size_t cap);
/* Words the mutator splices in (NULL-terminated). */
extern const char *const fuzz_words[];

#endif
