/* The model API on the GPU, as a program that owns its device memory calls
 * it: stof_model_run on the caller's device tensors and stream against
 * stof_model_run_cpu on the same inputs (a padded batch, then no mask: the
 * mask is reset), output poisoned before each run; a bad token id is an
 * error naming it; a short tune, its plan saved, loaded into a second model
 * and run: the same output as the tuned model's; the same (seeded) weights
 * given on the device instead, used in place: the same output, bit for bit.
 *
 * Exit 77 with "SKIPPED: <reason>" when there is no GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/base/util.h"
#include "core/graph/graph.h"
#include "core/gpu/cuda_driver.h"
#include "core/io/weights.h"
#include "core/lua/lua_api.h"
#include "stof.h"

enum { B = 2, S = 64, H = 512 };

static const char *const params[] = {"preset=small", "batch=2", "seq=64", "layers=2",
                                     "padding=true", "mask=none", "dtype=fp16"};
#define N_PARAMS 7

static const cuda_driver *drv;

static int ok(CUresult r, const char *what) {
    if (r == CUDA_SUCCESS)
        return 1;
    const char *name = NULL;
    drv->GetErrorName(r, &name);
    CHECK_MSG(0, "%s: %s", what, name ? name : "?");
    return 0;
}

/* The GPU output (fp16 bits) against the CPU reference: relative error. */
static double rel_error(const uint16_t *got, const float *want, size_t n, long *nonfinite) {
    double num = 0, den = 0;
    *nonfinite = 0;
    for (size_t i = 0; i < n; i++) {
        float g = util_f16_to_f32(got[i]);
        if (!isfinite(g))
            ++*nonfinite;
        num += (g - (double)want[i]) * (g - (double)want[i]);
        den += (double)want[i] * want[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

typedef struct bufs {
    CUdeviceptr ids, mask, out;
    CUstream stream;
} bufs;

/* One GPU run of m on ids (and mask, or none) against the CPU's. */
static void compare(stof_model *m, const bufs *d, const int32_t *ids, const int32_t *mask,
                    const char *label, uint16_t *host, float *want) {
    size_t n = (size_t)B * S * H;
    stof_tensor_ref cpu_in[] = {{"input_ids", ids}, {"attention_mask", mask}};
    CHECK_MSG(stof_model_run_cpu(m, cpu_in, mask ? 2 : 1, want) == STOF_OK, "%s: %s", label,
              stof_last_error());
    if (!ok(drv->MemcpyHtoD(d->ids, ids, sizeof(int32_t) * B * S), "ids") ||
        (mask && !ok(drv->MemcpyHtoD(d->mask, mask, sizeof(int32_t) * B * S), "mask")) ||
        !ok(drv->MemsetD16Async(d->out, 0x7fff, n, d->stream), "poison"))
        return;
    stof_tensor_ref gpu_in[] = {{"input_ids", (void *)(uintptr_t)d->ids},
                                {"attention_mask", (void *)(uintptr_t)d->mask}};
    int rc = stof_model_run(m, gpu_in, mask ? 2 : 1, (void *)(uintptr_t)d->out, d->stream);
    CHECK_MSG(rc == STOF_OK, "%s: %s", label, stof_last_error());
    if (rc || !ok(drv->StreamSynchronize(d->stream), "sync") ||
        !ok(drv->MemcpyDtoH(host, d->out, n * 2), "output"))
        return;
    long nonfinite;
    double e = rel_error(host, want, n, &nonfinite);
    int zeros = 1;
    for (int b = 0; mask && b < B; b++)
        for (int s = 0; s < S; s++)
            for (int h = 0; !mask[b * S + s] && h < H; h++)
                zeros &= host[((size_t)b * S + s) * H + h] == 0;
    printf("%-40s rel %.2e, %ld non-finite, padded rows %s\n", label, e, nonfinite,
           mask ? (zeros ? "zeros" : "NOT ZERO") : "-");
    CHECK_MSG(e < 1e-2 && nonfinite == 0 && zeros, "%s: rel %g, %ld non-finite", label, e,
              nonfinite);
}

/* A second model whose weights are the first's seeded values, uploaded by
 * this program and bound in place: the output of m, exactly. */
static void device_weights(const bufs *d, const int32_t *ids, const int32_t *mask,
                           const uint16_t *want_bits) {
    graph g;
    graph_init(&g);
    stof_error err = {0};
    if (lua_api_build(STOF_SOURCE_DIR "/scripts/bert.lua", params, N_PARAMS, &g, NULL, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    stof_model *m = NULL;
    CHECK_EQ_INT(stof_model_open(STOF_SOURCE_DIR "/scripts/bert.lua", params, N_PARAMS, &m),
                 STOF_OK);
    int n = stof_model_num_weights(m);
    stof_tensor_ref *w = calloc((size_t)n, sizeof *w);
    CUdeviceptr *dev = calloc((size_t)n, sizeof *dev);
    stof_tensor_info *info = calloc((size_t)n, sizeof *info);
    for (int i = 0; i < n; i++) {
        CHECK_EQ_INT(stof_model_weight_info(m, i, &info[i]), STOF_OK);
        const graph_tensor *t = &g.tensors[graph_find_tensor(&g, info[i].name)];
        int64_t numel = graph_tensor_numel(t);
        float *v = malloc(sizeof *v * (size_t)numel);
        uint16_t *bits = malloc(2 * (size_t)numel);
        weights_fill(t, 1, v); /* the seed the first model ran with */
        for (int64_t k = 0; k < numel; k++)
            bits[k] = util_f32_to_f16(v[k]);
        ok(drv->MemAlloc(&dev[i], 2 * (size_t)numel), "weight");
        ok(drv->MemcpyHtoD(dev[i], bits, 2 * (size_t)numel), "weight upload");
        w[i] = (stof_tensor_ref){info[i].name, (void *)(uintptr_t)dev[i]};
        free(v);
        free(bits);
    }
    CHECK_EQ_INT(stof_model_set_weights_device(m, w, n - 1), STOF_ERR_MISMATCH);
    CHECK_CONTAINS(stof_last_error(), "was not given");
    CHECK_MSG(stof_model_set_weights_device(m, w, n) == STOF_OK, "%s", stof_last_error());
    size_t elems = (size_t)B * S * H;
    stof_tensor_ref in[] = {{"input_ids", (void *)(uintptr_t)d->ids},
                            {"attention_mask", (void *)(uintptr_t)d->mask}};
    drv->MemcpyHtoD(d->ids, ids, sizeof(int32_t) * B * S);
    drv->MemcpyHtoD(d->mask, mask, sizeof(int32_t) * B * S);
    drv->MemsetD16Async(d->out, 0x7fff, elems, d->stream);
    int rc = stof_model_run(m, in, 2, (void *)(uintptr_t)d->out, d->stream);
    CHECK_MSG(rc == STOF_OK, "device weights: %s", stof_last_error());
    uint16_t *got = malloc(elems * 2);
    if (!rc && ok(drv->StreamSynchronize(d->stream), "sync") &&
        ok(drv->MemcpyDtoH(got, d->out, elems * 2), "output")) {
        int same = memcmp(got, want_bits, elems * 2) == 0;
        printf("weights on the device, bound in place (%d tensors): %s\n", n,
               same ? "the same output, bit for bit" : "ANOTHER OUTPUT");
        CHECK(same);
    }
    float *y = malloc(elems * sizeof *y);
    stof_tensor_ref host_in[] = {{"input_ids", ids}};
    CHECK_EQ_INT(stof_model_run_cpu(m, host_in, 1, y), STOF_ERR_INVALID);
    CHECK_CONTAINS(stof_last_error(), "weights are on the GPU");
    free(y);
    free(got);
    stof_model_free(m);
    for (int i = 0; i < n; i++)
        drv->MemFree(dev[i]);
    free(dev);
    free(w);
    free(info);
    graph_free(&g);
}

static void on_progress(const char *stage, long measured, double best_ms, void *ud) {
    ++*(int *)ud;
    (void)stage;
    (void)measured;
    (void)best_ms;
}

int main(void) {
    stof_device_info info;
    if (stof_device_query(0, &info) != STOF_OK) {
        printf("SKIPPED: %s\n", stof_last_error());
        return 77;
    }
    stof_error err = {0};
    if (cuda_driver_get(&drv, &err) != STOF_OK) {
        printf("SKIPPED: %s\n", err.msg);
        return 77;
    }
    stof_model *m = NULL;
    int rc = stof_model_open(STOF_SOURCE_DIR "/scripts/bert.lua", params, N_PARAMS, &m);
    CHECK_MSG(rc == STOF_OK, "%s", stof_last_error());
    CHECK_MSG(rc || stof_model_to_device(m, 0) == STOF_OK, "%s", stof_last_error());
    if (rc)
        return check_summary("gpu_api");
    bufs d = {0};
    size_t n = (size_t)B * S * H;
    uint16_t *host = malloc(n * 2);
    float *want = malloc(n * sizeof *want);
    int32_t ids[B * S], mask[B * S];
    util_rng rng = {77};
    for (int i = 0; i < B * S; i++) {
        ids[i] = (int32_t)(util_rng_double(&rng) * 30000);
        mask[i] = i < S || i % S < 23; /* row 1: 23 tokens */
    }
    if (ok(drv->MemAlloc(&d.ids, sizeof ids), "ids") &&
        ok(drv->MemAlloc(&d.mask, sizeof mask), "mask") && ok(drv->MemAlloc(&d.out, n * 2), "out") &&
        ok(drv->StreamCreate(&d.stream, CU_STREAM_NON_BLOCKING), "stream")) {
        compare(m, &d, ids, mask, "default scheme, padded", host, want);
        device_weights(&d, ids, mask, host);
        compare(m, &d, ids, NULL, "default scheme, no mask (reset)", host, want);

        ids[S + 5] = 30522; /* outside bert's vocabulary */
        drv->MemcpyHtoD(d.ids, ids, sizeof ids);
        stof_tensor_ref in[] = {{"input_ids", (void *)(uintptr_t)d.ids}};
        CHECK_EQ_INT(stof_model_run(m, in, 1, (void *)(uintptr_t)d.out, d.stream),
                     STOF_ERR_INVALID);
        CHECK_CONTAINS(stof_last_error(), "token 69 (batch 1, position 5) has id 30522");
        ids[S + 5] = 5;

        /* a left-padded mask: the kernels take right padding; an error, no output */
        int32_t left[B * S];
        for (int i = 0; i < B * S; i++)
            left[i] = i < S || i % S >= 40;
        drv->MemcpyHtoD(d.ids, ids, sizeof ids);
        drv->MemcpyHtoD(d.mask, left, sizeof left);
        stof_tensor_ref both[] = {{"input_ids", (void *)(uintptr_t)d.ids},
                                  {"attention_mask", (void *)(uintptr_t)d.mask}};
        CHECK_EQ_INT(stof_model_run(m, both, 2, (void *)(uintptr_t)d.out, d.stream),
                     STOF_ERR_UNSUPPORTED);
        CHECK_CONTAINS(stof_last_error(), "row 1 has a token at position 40 after padding at 0");

        int calls = 0;
        stof_tune_options topt = {.time_limit_s = 10.0, .seed = 3};
        rc = stof_model_tune(m, 0, &topt, on_progress, &calls);
        CHECK_MSG(rc == STOF_OK, "tune: %s", stof_last_error());
        CHECK(calls > 0);
        const char *plan = STOF_BINARY_DIR "/gpu_api_plan.json";
        CHECK_MSG(rc || stof_model_save_plan(m, plan) == STOF_OK, "%s", stof_last_error());
        compare(m, &d, ids, mask, "tuned plan, padded", host, want);
        stof_model *again = NULL;
        CHECK_MSG(stof_model_open(STOF_SOURCE_DIR "/scripts/bert.lua", params, N_PARAMS,
                                  &again) == STOF_OK, "%s", stof_last_error());
        CHECK_MSG(again && stof_model_load_plan(again, plan) == STOF_OK, "%s",
                  stof_last_error());
        if (again)
            compare(again, &d, ids, mask, "the saved plan, loaded", host, want);
        stof_model_free(again);
        const char *other[] = {"preset=small", "batch=4", "seq=64", "layers=2", "padding=true",
                               "mask=none", "dtype=fp16"};
        stof_model *wrong = NULL;
        CHECK_EQ_INT(stof_model_open(STOF_SOURCE_DIR "/scripts/bert.lua", other, 7, &wrong),
                     STOF_OK);
        CHECK_EQ_INT(stof_model_load_plan(wrong, plan), STOF_ERR_MISMATCH);
        printf("a plan for batch 2 into a model of batch 4: %s\n", stof_last_error());
        stof_model_free(wrong);
    }
    if (d.stream)
        drv->StreamDestroy(d.stream);
    CUdeviceptr p[] = {d.ids, d.mask, d.out};
    for (int i = 0; i < 3; i++)
        if (p[i])
            drv->MemFree(p[i]);
    free(host);
    free(want);
    stof_model_free(m);
    return check_summary("gpu_api");
}
