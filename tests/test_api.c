/* The public C API (include/stof.h) as a user calls it: models, masks,
 * errors, and the GPU entry points failing cleanly where no GPU answers. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "stof.h"

static void test_model(void) {
    const char *params[] = {"preset=small", "batch=1", "seq=32", "layers=1"};
    stof_model *m = NULL;
    int rc = stof_model_load(STOF_SOURCE_DIR "/scripts/bert.lua", params, 4, &m);
    CHECK_MSG(rc == STOF_OK, "%s", stof_last_error());
    if (rc)
        return;
    CHECK(stof_model_num_ops(m) > 10);
    double s1, q1, s2, q2;
    int64_t n;
    CHECK_EQ_INT(stof_model_run_reference(m, 5, &s1, &q1, &n), STOF_OK);
    CHECK_EQ_INT(n, 32 * 512);
    CHECK_EQ_INT(stof_model_run_reference(m, 5, &s2, &q2, &n), STOF_OK);
    CHECK(s1 == s2 && q1 == q2 && q1 > 0);
    stof_model_free(m);

    CHECK_EQ_INT(stof_model_load("/nonexistent/model.lua", NULL, 0, &m), STOF_ERR_IO);
    CHECK(m == NULL);
    CHECK_CONTAINS(stof_last_error(), "model.lua");
}

static void test_masks(void) {
    stof_mask *m = NULL;
    CHECK_EQ_INT(stof_mask_from_pattern("sliding_window{band=2}", 1, 10, 10, &m), STOF_OK);
    uint8_t dense[100];
    CHECK_EQ_INT(stof_mask_to_dense(m, 0, dense), STOF_OK);
    int ok = 1, count = 0;
    for (int i = 0; i < 10; i++)
        for (int j = 0; j < 10; j++) {
            ok &= dense[i * 10 + j] == (abs(i - j) <= 2);
            count += dense[i * 10 + j];
        }
    CHECK(ok);
    CHECK_NEAR(stof_mask_density(m), count / 100.0, 1e-12);
    CHECK_EQ_INT(stof_mask_to_dense(m, 1, dense), STOF_ERR_INVALID);
    stof_mask *copy = NULL;
    CHECK_EQ_INT(stof_mask_from_dense(dense, 1, 10, 10, &copy), STOF_OK);
    CHECK_NEAR(stof_mask_density(copy), stof_mask_density(m), 1e-12);
    int b, q, k;
    stof_mask_shape(copy, &b, &q, &k);
    CHECK(b == 1 && q == 10 && k == 10);
    stof_mask_free(copy);
    stof_mask_free(m);
    CHECK(stof_mask_from_pattern("nosuch{}", 1, 8, 8, &m) != STOF_OK);
    CHECK_CONTAINS(stof_last_error(), "nosuch");
}

static void test_gpu_entry_points(void) {
    stof_device_info info;
    stof_ctx *ctx = NULL;
    int rc = stof_device_query(0, &info);
    int rc_ctx = stof_ctx_create(0, &ctx);
    if (rc == STOF_OK) {
        CHECK_EQ_INT(rc_ctx, STOF_OK);
        stof_ctx_free(ctx);
    } else {
        CHECK_EQ_INT(rc, STOF_ERR_NO_DEVICE);
        CHECK_EQ_INT(rc_ctx, STOF_ERR_NO_DEVICE);
        CHECK(ctx == NULL);
        CHECK(strlen(stof_last_error()) > 10);
    }
}

int main(void) {
    CHECK(strcmp(stof_version(), STOF_VERSION_STRING) == 0);
    test_model();
    test_masks();
    test_gpu_entry_points();
    return check_summary("test_api");
}
