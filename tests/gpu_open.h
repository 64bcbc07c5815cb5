/* How every GPU test starts: its context made by `create(0, &ctx, &err)` (gemm_exec_ctx_create,
 * mha_exec_ctx_create, exec_ctx_create, ...). Without a GPU the test is skipped, visibly:
 * "SKIPPED: <the reason>" and exit 77, which ctest reports as skipped. Any other failure to
 * make it fails the test with its summary (name). */
#ifndef STOF_TESTS_GPU_OPEN_H
#define STOF_TESTS_GPU_OPEN_H

#include <stdio.h>

#include "check.h"
#include "stof.h"

#define GPU_TEST_OPEN(create, ctx, name)                                                     \
    do {                                                                                     \
        stof_error open_err_ = {0};                                                          \
        int open_rc_ = create(0, &(ctx), &open_err_);                                        \
        if (open_rc_ == STOF_ERR_NO_DEVICE) {                                                \
            printf("SKIPPED: %s\n", open_err_.msg);                                          \
            return 77;                                                                       \
        }                                                                                    \
        CHECK_MSG(open_rc_ == STOF_OK, "context: %s", open_err_.msg);                        \
        if (open_rc_)                                                                        \
            return check_summary(name);                                                      \
    } while (0)

#endif
