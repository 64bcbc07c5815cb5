/* A minimal test harness: CHECK macros that count, a summary line ctest and
 * people can read ("N passed, N failed"), exit code 1 on any failure. */
#ifndef STOF_TESTS_CHECK_H
#define STOF_TESTS_CHECK_H

#include <math.h>
#include <stdio.h>
#include <string.h>

static int check_passed, check_failed;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (cond) {                                                                   \
            check_passed++;                                                           \
        } else {                                                                      \
            check_failed++;                                                           \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                             \
    } while (0)

#define CHECK_MSG(cond, ...)                                                 \
    do {                                                                     \
        if (cond) {                                                          \
            check_passed++;                                                  \
        } else {                                                             \
            check_failed++;                                                  \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                    \
            fputc('\n', stderr);                                             \
        }                                                                    \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                          \
    do {                                                                            \
        long long check_a_ = (long long)(a), check_b_ = (long long)(b);             \
        CHECK_MSG(check_a_ == check_b_, "%s = %lld, %s = %lld", #a, check_a_, #b, check_b_); \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                        \
    do {                                                                             \
        double check_a_ = (double)(a), check_b_ = (double)(b);                       \
        CHECK_MSG(fabs(check_a_ - check_b_) <= (tol), "%s = %.9g, %s = %.9g (tol %g)", \
                  #a, check_a_, #b, check_b_, (double)(tol));                        \
    } while (0)

/* The text of a stof_error contains needle. */
#define CHECK_CONTAINS(hay, needle)                                                  \
    CHECK_MSG(strstr((hay), (needle)) != NULL, "\"%s\" does not contain \"%s\"", (hay), (needle))

static inline int check_summary(const char *name) {
    printf("%s: %d passed, %d failed\n", name, check_passed, check_failed);
    return check_failed ? 1 : 0;
}

#endif
