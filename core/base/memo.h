/* Values computed once and shared between threads: compiled kernels, the
 * CPU references of segments, the values of scratch tensors.
 *
 * A memo maps 64-bit keys to values that a compute function makes. The
 * first caller that asks for a key computes it on its own thread; callers
 * asking meanwhile wait for that result instead of computing it again;
 * later ones find it. memo_fill is the same for a thread that works ahead:
 * it never waits, and skips keys that are there or under way.
 *
 * A value is pinned while a caller uses it (memo_get to memo_unpin). Past a
 * byte budget the least recently used unpinned values are freed. A failed
 * computation is kept (its code and message) and answered again, unless it
 * was STOF_ERR_NOMEM: a deterministic failure, such as a kernel that does
 * not compile, is not computed twice. */
#ifndef STOF_CORE_MEMO_H
#define STOF_CORE_MEMO_H

#include <stddef.h>
#include <stdint.h>

#include "stof.h"

typedef struct memo memo;

/* Makes the value of a key: *value and its size in *bytes (what counts
 * against the budget). */
typedef int (*memo_compute)(void *arg, void **value, size_t *bytes, stof_error *err);

typedef struct memo_stats {
    long computed;     /* values made */
    long failed;       /* computations that failed */
    long hits;         /* memo_get answered by a value already there */
    long waited;       /* memo_get calls that waited for another thread */
    long evicted;
    double compute_s;  /* wall time of the computations, summed over threads */
    double wait_s;     /* memo_get callers blocked on another thread's computation */
    size_t bytes;      /* held now */
} memo_stats;

/* budget 0: no limit (nothing is ever freed before memo_free). free_value
 * (may be NULL) frees a value. */
int memo_create(size_t budget, void (*free_value)(void *value), memo **out, stof_error *err);
/* Frees every value. No computation may be under way. NULL is fine. */
void memo_free(memo *m);

/* The value of key (pinned: memo_unpin it), computed by compute(arg) on
 * this thread when nobody has; a kept failure is returned as it was. */
int memo_get(memo *m, uint64_t key, memo_compute compute, void *arg, void **value,
             stof_error *err);
void memo_unpin(memo *m, uint64_t key);

/* Computes key's value (unpinned) unless it is there, failed before, or
 * under way; never waits. The computation's error, if any. */
int memo_fill(memo *m, uint64_t key, memo_compute compute, void *arg, stof_error *err);

/* 1 when key's value (or failure) is there or under way. */
int memo_known(memo *m, uint64_t key);

memo_stats memo_get_stats(memo *m);

#endif
