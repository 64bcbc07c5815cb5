/* The recap the GPU tests print at the end: every failing run once more
 * (the first RECAP_MAX of them), after the long per-case output. */
#ifndef STOF_TESTS_GPU_RECAP_H
#define STOF_TESTS_GPU_RECAP_H

#include <stdarg.h>
#include <stdio.h>

#define RECAP_MAX 40
static char recap[RECAP_MAX][320];
static int n_recap, n_failed_runs, n_runs;

static inline void recap_add(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void recap_add(const char *fmt, ...) {
    n_failed_runs++;
    if (n_recap == RECAP_MAX)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(recap[n_recap++], sizeof recap[0], fmt, ap);
    va_end(ap);
}

static inline void recap_print(void) {
    if (n_runs)
        printf("\n%d runs, %d failing%s\n", n_runs, n_failed_runs, n_failed_runs ? ":" : "");
    else
        printf("\n%d failing runs%s\n", n_failed_runs, n_failed_runs ? ":" : "");
    for (int i = 0; i < n_recap; i++)
        printf("  %s\n", recap[i]);
    if (n_failed_runs > n_recap)
        printf("  ... and %d more (see above)\n", n_failed_runs - n_recap);
}

#endif
