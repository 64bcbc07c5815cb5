/* Small shared helpers: hashing, the counter-based random generator that
 * makes weights identical on every backend, fp16/bf16 conversion. */
#ifndef STOF_CORE_UTIL_H
#define STOF_CORE_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* 64-bit FNV-1a, continued from h (start with UTIL_HASH_SEED). */
#define UTIL_HASH_SEED 0xcbf29ce484222325ULL
uint64_t util_hash(uint64_t h, const void *data, size_t n);
uint64_t util_hash_str(uint64_t h, const char *s);

/* splitmix64 finalizer: a good 64-bit mix of x. */
static inline uint64_t util_mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Uniform float in [0, 1) from stream `key` at position `index`: a pure
 * function, so any backend can draw the same values in any order. */
static inline float util_uniform(uint64_t key, uint64_t index) {
    return (float)(util_mix64(key ^ util_mix64(index)) >> 40) * (1.0f / 16777216.0f);
}

/* Sequential generator for places that draw one value after another. */
typedef struct util_rng { uint64_t state; } util_rng;
static inline uint64_t util_rng_next(util_rng *r) {
    r->state += 0x9e3779b97f4a7c15ULL;
    return util_mix64(r->state);
}
static inline double util_rng_double(util_rng *r) {
    return (double)(util_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

uint16_t util_f32_to_f16(float f);
float util_f16_to_f32(uint16_t h);
/* f rounded to the nearest fp16 value (ties to even), as a float: util_f16_to_f32 of
 * util_f32_to_f16, computed on the bits where the result is a normal fp16 number. */
float util_round_f16(float f);
uint16_t util_f32_to_bf16(float f);
float util_bf16_to_f32(uint16_t h);


/* dst [cols, rows] = src [rows, cols] transposed (no overlap), a tile of 64 x 64 at a time so
 * that both sides are walked in runs that stay in cache, 4 x 4 blocks in SSE registers where the
 * CPU has them (GPT-2 XL's 1600 x 6400 weights: about 10 against 36 ms element by element, gcc
 * -O2 on a 2-core x86-64 machine). */
void util_transpose_f32(const float *src, float *dst, int64_t rows, int64_t cols);

/* bytes rounded up to a multiple of align (> 0). */
static inline size_t util_align_up(size_t bytes, size_t align) {
    return (bytes + align - 1) / align * align;
}

/* The median of v[0..n-1] (n >= 1; the mean of the middle two when n is
 * even); sorts v. */
double util_median(double *v, int n);

/* Monotonic wall clock in seconds. */
double util_now(void);
/* CPU time of this process in seconds: for timing single-threaded work in
 * tests without counting time lost to other processes on a busy machine. */
double util_cpu_now(void);

#endif
