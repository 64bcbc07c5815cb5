/* Core helpers: fp16/bf16 conversion, deterministic weights, graph building
 * and its error paths, errors, the driver loader without a GPU. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/device.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/util.h"
#include "core/weights.h"

static void test_half(void) {
    CHECK_EQ_INT(util_f32_to_f16(1.0f), 0x3c00);
    CHECK_EQ_INT(util_f32_to_f16(-2.0f), 0xc000);
    CHECK_EQ_INT(util_f32_to_f16(65504.0f), 0x7bff);
    CHECK_EQ_INT(util_f32_to_f16(1e6f), 0x7c00);          /* overflow -> inf */
    CHECK_EQ_INT(util_f32_to_f16(5.9604645e-8f), 0x0001); /* smallest subnormal */
    CHECK_EQ_INT(util_f32_to_f16(1.0f + 1.0f / 4096), 0x3c00); /* ties to even */
    CHECK(isnan(util_f16_to_f32(util_f32_to_f16(NAN))));
    /* every finite half round-trips */
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00)
            continue;
        if (util_f32_to_f16(util_f16_to_f32((uint16_t)h)) != h)
            bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(util_f32_to_bf16(1.0f), 0x3f80);
    CHECK_NEAR(util_bf16_to_f32(util_f32_to_bf16(3.14159f)), 3.140625, 1e-6);
}

static graph_tensor tensor(const char *name, graph_role role, int ndim, const int64_t *shape) {
    graph_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%s", name);
    t.role = role;
    t.dtype = STOF_F16;
    t.ndim = ndim;
    memcpy(t.shape, shape, sizeof(int64_t) * (size_t)ndim);
    t.init_scale = 0.5f;
    return t;
}

static void test_weights(void) {
    int64_t shape[2] = {3, 5};
    graph_tensor w = tensor("layer.0.w", GRAPH_WEIGHT, 2, shape);
    float a[15], b[15], c[15];
    weights_fill(&w, 7, a);
    weights_fill(&w, 7, b);
    CHECK(memcmp(a, b, sizeof a) == 0);
    weights_fill(&w, 8, c);
    CHECK(memcmp(a, c, sizeof a) != 0);
    int in_range = 1;
    for (int i = 0; i < 15; i++) {
        in_range &= fabsf(a[i]) <= 0.5f;
        in_range &= a[i] == util_f16_to_f32(util_f32_to_f16(a[i])); /* fp16 exact */
    }
    CHECK(in_range);
    graph_tensor ids = tensor("ids", GRAPH_INPUT, 2, shape);
    ids.dtype = STOF_I32;
    ids.init = GRAPH_INIT_TOKENS;
    ids.init_high = 11;
    weights_fill(&ids, 1, a);
    int ok = 1;
    for (int i = 0; i < 15; i++)
        ok &= a[i] >= 0 && a[i] < 11 && a[i] == floorf(a[i]);
    CHECK(ok);
}

static void test_graph_errors(void) {
    graph g;
    graph_init(&g);
    stof_error err = {0};
    int id;
    int64_t ok_shape[2] = {4, 8}, zero[2] = {4, 0}, huge[3] = {1 << 20, 1 << 20, 1 << 20};
    graph_tensor t = tensor("x", GRAPH_INPUT, 2, ok_shape);
    CHECK_EQ_INT(graph_add_tensor(&g, &t, &id, &err), STOF_OK);
    CHECK_EQ_INT(graph_add_tensor(&g, &t, &id, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "already defined");
    t = tensor("z", GRAPH_WEIGHT, 2, zero);
    CHECK_EQ_INT(graph_add_tensor(&g, &t, &id, &err), STOF_ERR_SHAPE);
    CHECK_CONTAINS(err.msg, "dimension 1");
    t = tensor("h", GRAPH_WEIGHT, 3, huge);
    CHECK_EQ_INT(graph_add_tensor(&g, &t, &id, &err), STOF_ERR_SHAPE);
    CHECK_CONTAINS(err.msg, "elements");
    CHECK_EQ_INT(graph_validate(&g, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "no operators");
    CHECK_EQ_INT(graph_set_output(&g, 0, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "computed by an operator");
    graph_op op;
    memset(&op, 0, sizeof op);
    op.kind = OP_RELU;
    op.n_inputs = 1;
    op.inputs[0] = 0;
    int out;
    CHECK_EQ_INT(graph_add_op(&g, &op, &out, &err), STOF_OK);
    CHECK_EQ_INT(g.tensors[out].shape[1], 8);
    CHECK_EQ_INT(g.tensors[out].producer, 0);
    CHECK_EQ_INT(graph_set_output(&g, out, &err), STOF_OK);
    CHECK_EQ_INT(graph_validate(&g, &err), STOF_OK);
    op.inputs[0] = 99;
    CHECK_EQ_INT(graph_add_op(&g, &op, &out, &err), STOF_ERR_INVALID);
    op.inputs[0] = 0;
    op.n_inputs = 3;
    CHECK_EQ_INT(graph_add_op(&g, &op, &out, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "inputs");
    graph_free(&g);
}

static void test_errors(void) {
    stof_error err = {0};
    CHECK_EQ_INT(err_set(&err, STOF_ERR_SHAPE, "x %d", 3), STOF_ERR_SHAPE);
    CHECK(strcmp(err.msg, "x 3") == 0);
    err_prefix(&err, "while %s: ", "testing");
    CHECK(strcmp(err.msg, "while testing: x 3") == 0);
    CHECK_EQ_INT(err_set(NULL, STOF_ERR_IO, "ignored"), STOF_ERR_IO);
    CHECK(strcmp(stof_status_name(STOF_ERR_DEVICE_OOM), "out of device memory") == 0);
}

/* With or without a GPU, the query answers cleanly: a count, or NO_DEVICE
 * with a reason a person can read. */
static void test_device(void) {
    stof_error err = {0};
    int n = -1;
    int rc = device_count(&n, &err);
    if (rc == STOF_OK) {
        CHECK(n > 0);
        stof_device_info info;
        CHECK_EQ_INT(device_query(0, &info, &err), STOF_OK);
        CHECK(info.sm_count > 0 && info.max_warps_per_sm > 0);
        printf("GPU: %s\n", info.name);
    } else {
        CHECK_EQ_INT(rc, STOF_ERR_NO_DEVICE);
        CHECK(strlen(err.msg) > 10);
        printf("no GPU: %s\n", err.msg);
    }
}

int main(void) {
    test_half();
    test_weights();
    test_graph_errors();
    test_errors();
    test_device();
    return check_summary("test_core");
}
