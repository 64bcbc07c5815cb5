/* The public C API (include/stof.h): thin wrappers over the modules that keep
 * the last error per thread for stof_last_error(). */
#include <stdlib.h>
#include <string.h>

#include "core/api/api_internal.h"
#include "core/gpu/device.h"
#include "core/base/error.h"
#include "ops/mask.h"

#ifndef STOF_COMMIT
#define STOF_COMMIT "unknown"
#endif

static _Thread_local stof_error t_last;

int api_remember(int rc, const stof_error *err) {
    if (rc == STOF_OK) {
        err_clear(&t_last);
    } else {
        t_last = *err;
        t_last.code = rc;
    }
    return rc;
}

const char *stof_last_error(void) {
    return t_last.msg;
}

static int wrap_mask(int rc, mask *built, stof_mask **out, stof_error *err) {
    if (rc)
        return api_remember(rc, err);
    *out = err_calloc(1, sizeof **out, err);
    if (!*out) {
        mask_free(built);
        return api_remember(STOF_ERR_NOMEM, err);
    }
    (*out)->m = built;
    return api_remember(STOF_OK, err);
}

int stof_mask_from_pattern(const char *pattern, int batch, int q_len, int k_len,
                           stof_mask **out) {
    stof_error err = {0};
    mask *built = NULL;
    *out = NULL;
    int rc = mask_build_text(pattern, batch, q_len, k_len, &built, &err);
    return wrap_mask(rc, built, out, &err);
}

int stof_mask_from_dense(const uint8_t *dense, int batch, int q_len, int k_len,
                         stof_mask **out) {
    stof_error err = {0};
    mask *built = NULL;
    *out = NULL;
    int rc = mask_from_dense(dense, batch, q_len, k_len, "dense", &built, &err);
    return wrap_mask(rc, built, out, &err);
}

void stof_mask_free(stof_mask *m) {
    if (!m)
        return;
    mask_free(m->m);
    free(m);
}

double stof_mask_density(const stof_mask *m) {
    mask_stats st;
    mask_compute_stats(m->m, 0, 0, &st);
    return st.density;
}

int stof_device_query(int ordinal, stof_device_info *info) {
    stof_error err = {0};
    return api_remember(device_query(ordinal, info, &err), &err);
}

int stof_mask_to_dense(const stof_mask *m, int b, uint8_t *dense) {
    stof_error err = {0};
    const mask *mk = m->m;
    if (b < 0 || b >= mk->batch)
        return api_remember(err_set(&err, STOF_ERR_INVALID,
                                "batch %d: the mask stores %d batch(es)", b, mk->batch),
                        &err);
    for (int i = 0; i < mk->q_len; i++)
        for (int j = 0; j < mk->k_len; j++)
            dense[(size_t)i * mk->k_len + j] = (uint8_t)mask_get(mk, b, i, j);
    return api_remember(STOF_OK, &err);
}

void stof_mask_shape(const stof_mask *m, int *batch, int *q_len, int *k_len) {
    *batch = m->m->batch;
    *q_len = m->m->q_len;
    *k_len = m->m->k_len;
}
