/* What the public API's handles hold (shared by the core/api*.c files). */
#ifndef STOF_CORE_API_INTERNAL_H
#define STOF_CORE_API_INTERNAL_H

#include "ops/mask.h"
#include "stof.h"

struct stof_mask {
    mask *m;
};

/* Records err as the calling thread's last error (for stof_last_error) and
 * returns rc. */
int api_remember(int rc, const stof_error *err);

#endif
