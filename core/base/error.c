#include "core/base/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int err_setv(stof_error *err, int code, const char *fmt, va_list ap) {
    if (err) {
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    }
    return code;
}

int err_set(stof_error *err, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    err_setv(err, code, fmt, ap);
    va_end(ap);
    return code;
}

int err_prefix(stof_error *err, const char *fmt, ...) {
    if (!err)
        return STOF_ERR_INTERNAL;
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char old[sizeof err->msg];
    memcpy(old, err->msg, sizeof old);
    size_t n = strlen(prefix);
    memcpy(err->msg, prefix, n);
    /* the message keeps its tail cut, never the prefix */
    snprintf(err->msg + n, sizeof err->msg - n, "%s", old);
    return err->code;
}

void err_clear(stof_error *err) {
    if (err) {
        err->code = STOF_OK;
        err->msg[0] = '\0';
    }
}

void *err_malloc(size_t n, stof_error *err) {
    void *p = malloc(n ? n : 1);
    if (!p)
        err_set(err, STOF_ERR_NOMEM, "out of host memory (%zu bytes)", n);
    return p;
}

void *err_calloc(size_t count, size_t size, stof_error *err) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p)
        err_set(err, STOF_ERR_NOMEM, "out of host memory (%zu x %zu bytes)", count, size);
    return p;
}

void *err_realloc(void *p, size_t n, stof_error *err) {
    void *q = realloc(p, n ? n : 1);
    if (!q)
        err_set(err, STOF_ERR_NOMEM, "out of host memory (%zu bytes)", n);
    return q;
}

const char *stof_status_name(int status) {
    switch (status) {
    case STOF_OK: return "ok";
    case STOF_ERR_INVALID: return "invalid argument";
    case STOF_ERR_NOMEM: return "out of memory";
    case STOF_ERR_IO: return "i/o error";
    case STOF_ERR_SCRIPT: return "script error";
    case STOF_ERR_SHAPE: return "shape error";
    case STOF_ERR_UNSUPPORTED: return "unsupported";
    case STOF_ERR_NO_DEVICE: return "no device";
    case STOF_ERR_CUDA: return "cuda error";
    case STOF_ERR_COMPILE: return "compile error";
    case STOF_ERR_DEVICE_OOM: return "out of device memory";
    case STOF_ERR_FORMAT: return "malformed file";
    case STOF_ERR_MISMATCH: return "mismatch";
    case STOF_ERR_INTERNAL: return "internal error";
    default: return "unknown status";
    }
}
