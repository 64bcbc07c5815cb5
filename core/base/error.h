/* One error mechanism for the whole library: a function that can fail takes a
 * `stof_error *` last, fills it through err_set() and returns the status code.
 * Nothing in the library prints; callers decide what to do with the text. */
#ifndef STOF_CORE_ERROR_H
#define STOF_CORE_ERROR_H

#include <stdarg.h>
#include <stddef.h>

#include "stof.h"

/* Sets err (when not NULL) and returns code, so callers can write
 *   return err_set(err, STOF_ERR_INVALID, "band must be positive, got %d", band); */
int err_set(stof_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int err_setv(stof_error *err, int code, const char *fmt, va_list ap);

/* Prefixes the existing message ("while loading weights: " + old text). */
int err_prefix(stof_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void err_clear(stof_error *err);

/* Allocation helpers that report STOF_ERR_NOMEM through err. */
void *err_malloc(size_t n, stof_error *err);
void *err_calloc(size_t count, size_t size, stof_error *err);
void *err_realloc(void *p, size_t n, stof_error *err);

#endif
