#include "core/base/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__SSE__)
#include <xmmintrin.h> /* util_transpose_f32's 4 x 4 blocks */
#endif

uint64_t util_hash(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

uint64_t util_hash_str(uint64_t h, const char *s) {
    return util_hash(h, s, strlen(s));
}

static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even, with overflow to inf, subnormals and NaN kept. */
uint16_t util_f32_to_f16(float f) {
    uint32_t x = float_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t mag = x & 0x7fffffffu;
    if (mag >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0));
    if (mag >= 0x477ff000u) /* rounds to >= 65520: overflow */
        return (uint16_t)(sign | 0x7c00u);
    if (mag < 0x38800000u) { /* subnormal half (or zero) */
        float a = bits_float(mag);
        /* scale so that the half subnormal unit (2^-24) becomes 1, round */
        uint32_t v = (uint32_t)lrintf(a * 16777216.0f);
        return (uint16_t)(sign | v);
    }
    uint32_t e = (mag >> 23) - 112;
    uint32_t m = mag & 0x7fffffu;
    uint32_t h = (e << 10) | (m >> 13);
    uint32_t rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

float util_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0) {
        float v = (float)m * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (e == 31)
        return bits_float(sign | 0x7f800000u | (m << 13));
    return bits_float(sign | ((e + 112) << 23) | (m << 13));
}

float util_round_f16(float f) {
    uint32_t x = float_bits(f);
    uint32_t mag = x & 0x7fffffffu;
    /* a normal fp16 result (from 2^-14 up to below the overflow at 65520): keep the top 10 of
     * the 23 mantissa bits, rounded to nearest even; a carry moves into the exponent */
    if (mag >= 0x38800000u && mag < 0x477ff000u)
        return bits_float((x + 0xfffu + ((x >> 13) & 1u)) & ~0x1fffu);
    return util_f16_to_f32(util_f32_to_f16(f)); /* subnormal, zero, overflow, inf, nan */
}

uint16_t util_f32_to_bf16(float f) {
    uint32_t x = float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)((x + rounding) >> 16);
}

float util_bf16_to_f32(uint16_t h) {
    return bits_float((uint32_t)h << 16);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define TRANSPOSE_TILE 64

/* Elements [r0, r1) x [c0, c1) of a transpose (util_transpose_f32), one at a time. */
static void transpose_scalar(const float *src, float *dst, int64_t rows, int64_t cols, int64_t r0,
                             int64_t r1, int64_t c0, int64_t c1) {
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++)
            dst[c * rows + r] = src[r * cols + c];
}

/* One tile of a transpose: 4 x 4 blocks in SSE registers where the CPU has them (2-3x faster
 * than element by element), the edges one element at a time. */
static void transpose_tile(const float *src, float *dst, int64_t rows, int64_t cols, int64_t r0,
                           int64_t r1, int64_t c0, int64_t c1) {
#if defined(__SSE__)
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        int64_t c = c0;
        for (; c + 4 <= c1; c += 4) {
            const float *s = src + r * cols + c;
            __m128 a = _mm_loadu_ps(s), b = _mm_loadu_ps(s + cols);
            __m128 e = _mm_loadu_ps(s + 2 * cols), d = _mm_loadu_ps(s + 3 * cols);
            _MM_TRANSPOSE4_PS(a, b, e, d);
            float *t = dst + c * rows + r;
            _mm_storeu_ps(t, a);
            _mm_storeu_ps(t + rows, b);
            _mm_storeu_ps(t + 2 * rows, e);
            _mm_storeu_ps(t + 3 * rows, d);
        }
        transpose_scalar(src, dst, rows, cols, r, r + 4, c, c1);
    }
    transpose_scalar(src, dst, rows, cols, r, r1, c0, c1);
#else
    transpose_scalar(src, dst, rows, cols, r0, r1, c0, c1);
#endif
}

void util_transpose_f32(const float *src, float *dst, int64_t rows, int64_t cols) {
    for (int64_t r0 = 0; r0 < rows; r0 += TRANSPOSE_TILE) {
        const int64_t r1 = r0 + TRANSPOSE_TILE < rows ? r0 + TRANSPOSE_TILE : rows;
        for (int64_t c0 = 0; c0 < cols; c0 += TRANSPOSE_TILE)
            transpose_tile(src, dst, rows, cols, r0, r1, c0,
                           c0 + TRANSPOSE_TILE < cols ? c0 + TRANSPOSE_TILE : cols);
    }
}

double util_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double util_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double util_cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
