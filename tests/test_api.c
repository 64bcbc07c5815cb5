/* The public C API (include/stof.h) as a user calls it: models, masks,
 * errors, and the GPU entry points failing cleanly where no GPU answers. */
#include <stdint.h>
#include <stdio.h>
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

/* A padded encoder through the model API on the CPU: what it takes and
 * gives, a padded batch against the same sequences alone, every error. */
static void test_model_io(void) {
    enum { B = 2, S = 16, H = 512 };
    const char *params[] = {"preset=small", "batch=2", "seq=16", "layers=1", "padding=true",
                            "mask=none", "dtype=fp32"};
    stof_model *m = NULL;
    int rc = stof_model_open(STOF_SOURCE_DIR "/scripts/bert.lua", params, 7, &m);
    CHECK_MSG(rc == STOF_OK, "%s", stof_last_error());
    if (rc)
        return;
    CHECK_EQ_INT(stof_model_num_inputs(m), 2);
    stof_tensor_info in0, in1, out;
    CHECK_EQ_INT(stof_model_input_info(m, 0, &in0), STOF_OK);
    CHECK_EQ_INT(stof_model_input_info(m, 1, &in1), STOF_OK);
    CHECK(strcmp(in0.name, "input_ids") == 0 && in0.dtype == STOF_I32 && !in0.optional &&
          in0.ndim == 2 && in0.shape[0] == B && in0.shape[1] == S);
    CHECK(strcmp(in1.name, "attention_mask") == 0 && in1.optional);
    CHECK_EQ_INT(stof_model_input_info(m, 2, &in0), STOF_ERR_INVALID);
    CHECK_EQ_INT(stof_model_output_info(m, &out), STOF_OK);
    CHECK(out.ndim == 3 && out.shape[2] == H && out.dtype == STOF_F32);
    CHECK(strstr(stof_model_script(m), "bert.lua") != NULL);

    int32_t ids[B * S], mask[B * S];
    for (int i = 0; i < B * S; i++) {
        ids[i] = (i * 37 + 11) % 1000;
        mask[i] = i < S || i % S < 5; /* row 0 whole, row 1 five tokens */
    }
    float *full = malloc(sizeof(float) * B * S * H), *padded = malloc(sizeof(float) * B * S * H);
    stof_tensor_ref only_ids[] = {{"input_ids", ids}};
    stof_tensor_ref both[] = {{"input_ids", ids}, {"attention_mask", mask}};
    CHECK_MSG(stof_model_run_cpu(m, only_ids, 1, full) == STOF_OK, "%s", stof_last_error());
    CHECK_MSG(stof_model_run_cpu(m, both, 2, padded) == STOF_OK, "%s", stof_last_error());
    /* row 0 is whole in both; row 1's five tokens see only each other: not
     * what they saw unpadded; its padded positions are zeros */
    CHECK(memcmp(full, padded, sizeof(float) * S * H) == 0);
    int zeros = 1, differs = 0;
    for (int s = 0; s < S; s++)
        for (int h = 0; h < H; h++) {
            float v = padded[(S + s) * H + h];
            if (s >= 5)
                zeros &= v == 0.0f;
            else
                differs |= v != full[(S + s) * H + h];
        }
    CHECK(zeros && differs);

    stof_tensor_ref wrong[] = {{"ids", ids}};
    CHECK_EQ_INT(stof_model_run_cpu(m, wrong, 1, full), STOF_ERR_INVALID);
    CHECK_CONTAINS(stof_last_error(), "'ids' is not an input of the model (its inputs: "
                                      "input_ids, attention_mask)");
    stof_tensor_ref just_mask[] = {{"attention_mask", mask}};
    CHECK_EQ_INT(stof_model_run_cpu(m, just_mask, 1, full), STOF_ERR_INVALID);
    CHECK_CONTAINS(stof_last_error(), "input 'input_ids' is missing");
    stof_tensor_ref twice[] = {{"input_ids", ids}, {"input_ids", ids}};
    CHECK_EQ_INT(stof_model_run_cpu(m, twice, 2, full), STOF_ERR_INVALID);
    CHECK_CONTAINS(stof_last_error(), "given twice");
    ids[S + 3] = 30522;
    CHECK_EQ_INT(stof_model_run_cpu(m, both, 2, full), STOF_ERR_INVALID);
    CHECK_CONTAINS(stof_last_error(), "30522 at index 19 (row 1, position 3) is outside");
    ids[S + 3] = 3;
    mask[S + 9] = 1; /* a token after padding */
    CHECK_EQ_INT(stof_model_run_cpu(m, both, 2, full), STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(stof_last_error(), "row 1 has a token at position 9 after padding");
    CHECK_EQ_INT(stof_model_save_plan(m, "never.json"), STOF_ERR_INVALID);
    CHECK_CONTAINS(stof_last_error(), "no plan to save");
    CHECK_EQ_INT(stof_model_set_weights(m, "/nonexistent.safetensors"), STOF_ERR_IO);
    CHECK_EQ_INT(stof_model_load_plan(m, "/nonexistent.json"), STOF_ERR_IO);

    /* weights on the device: every one by the model's names, aligned; then
     * the CPU reference says it cannot read them */
    int nw = stof_model_num_weights(m);
    CHECK(nw > 10);
    stof_tensor_ref *dw = calloc((size_t)nw, sizeof *dw);
    stof_tensor_info *wi = calloc((size_t)nw, sizeof *wi);
    for (int i = 0; i < nw; i++) {
        CHECK_EQ_INT(stof_model_weight_info(m, i, &wi[i]), STOF_OK);
        dw[i] = (stof_tensor_ref){wi[i].name, (void *)(uintptr_t)(0x10000 * (i + 1))};
    }
    CHECK(strcmp(wi[0].name, "embeddings.word_embeddings.weight") == 0 && wi[0].ndim == 2);
    CHECK_EQ_INT(stof_model_weight_info(m, nw, &wi[0]), STOF_ERR_INVALID);
    stof_tensor_ref bogus = {"encoder.layer.0.nothing", (void *)0x10000};
    CHECK_EQ_INT(stof_model_set_weights_device(m, &bogus, 1), STOF_ERR_INVALID);
    CHECK_CONTAINS(stof_last_error(), "'encoder.layer.0.nothing' is not a weight of the model");
    dw[1].data = (void *)0x10008;
    CHECK_EQ_INT(stof_model_set_weights_device(m, dw, nw), STOF_ERR_INVALID);
    CHECK_CONTAINS(stof_last_error(), "16-byte aligned");
    dw[1].data = (void *)0x20000;
    CHECK_EQ_INT(stof_model_set_weights_device(m, dw, nw - 1), STOF_ERR_MISMATCH);
    CHECK_EQ_INT(stof_model_set_weights_device(m, dw, nw), STOF_OK);
    CHECK_EQ_INT(stof_model_run_cpu(m, both, 2, full), STOF_ERR_INVALID);
    CHECK_CONTAINS(stof_last_error(), "weights are on the GPU");
    free(dw);
    free(wi);

    /* the GPU half: runs where a GPU answers, says why where none does */
    stof_device_info info;
    if (stof_device_query(0, &info) != STOF_OK) {
        CHECK_EQ_INT(stof_model_to_device(m, 0), STOF_ERR_NO_DEVICE);
        stof_tune_options topt = {.time_limit_s = 1.0};
        CHECK_EQ_INT(stof_model_tune(m, 0, &topt, NULL, NULL), STOF_ERR_NO_DEVICE);
        printf("test_api: no GPU (%s): stof_model_run and stof_model_tune checked on the "
               "device only\n", stof_last_error());
    }
    free(full);
    free(padded);
    stof_model_free(m);
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
    test_model_io();
    test_masks();
    test_gpu_entry_points();
    return check_summary("test_api");
}
