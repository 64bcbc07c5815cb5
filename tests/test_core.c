/* Core helpers: fp16/bf16 conversion, deterministic weights (filled in
 * pieces on threads exactly as on one), graph building and its error paths,
 * errors, the driver loader without a GPU. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/gpu/device.h"
#include "core/base/error.h"
#include "core/graph/graph.h"
#include "core/io/safetensors.h"
#include "core/base/task_pool.h"
#include "core/base/util.h"
#include "core/io/weights.h"
#include "ops/ops.h"

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

/* util_round_f16 is the round trip through util_f32_to_f16, bit for bit: every fp32 exponent
 * with mantissas around each rounding boundary (ties, carries into the exponent, the edges of
 * the normal range, overflow) and a million random bit patterns. */
static int round_f16_differs(uint32_t bits) {
    float f, want, got;
    memcpy(&f, &bits, sizeof f);
    want = util_f16_to_f32(util_f32_to_f16(f));
    got = util_round_f16(f);
    if (isnan(want))
        return !isnan(got);
    return memcmp(&want, &got, sizeof got) != 0;
}

static void test_round_f16(void) {
    static const uint32_t mantissas[] = {0, 1, 0xfff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x3000,
                                         0x7fefff, 0x7ff000, 0x7fffff, 0x400000, 0x401000};
    int bad = 0;
    for (uint32_t e = 0; e < 256; e++)
        for (size_t m = 0; m < sizeof mantissas / sizeof mantissas[0]; m++)
            for (uint32_t sign = 0; sign < 2; sign++)
                bad += round_f16_differs(sign << 31 | e << 23 | mantissas[m]);
    for (uint32_t d = 0; d < 0x4000; d++) /* below and above the range's two ends */
        bad += round_f16_differs(0x38800000u - d) + round_f16_differs(0x38800000u + d) +
               round_f16_differs(0x477ff000u - d) + round_f16_differs(0x477ff000u + d);
    util_rng rng = {2026};
    for (int i = 0; i < 1000000; i++)
        bad += round_f16_differs((uint32_t)(util_rng_next(&rng) >> 32));
    CHECK_MSG(bad == 0, "util_round_f16: %d values differ from the round trip", bad);
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

/* util_transpose_f32 against the element-by-element transpose: shapes around its tile of 64
 * (one row, one column, partial tiles both ways), every element placed once. */
/* Sizes rounded up to an alignment: already aligned ones (0 among them) stay. */
static void test_align_up(void) {
    CHECK(util_align_up(0, 16) == 0);
    CHECK(util_align_up(1, 16) == 16);
    CHECK(util_align_up(16, 16) == 16);
    CHECK(util_align_up(17, 16) == 32);
    CHECK(util_align_up(257, 256) == 512);
    CHECK(util_align_up(5, 1) == 5);
}

static void test_transpose(void) {
    static const int64_t shapes[][2] = {{1, 1}, {1, 77}, {77, 1}, {63, 65}, {64, 64},
                                        {129, 193}, {256, 40}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
        float *src = malloc(sizeof *src * (size_t)n), *dst = malloc(sizeof *dst * (size_t)n);
        if (!src || !dst) {
            CHECK_MSG(0, "out of memory");
            free(src);
            free(dst);
            return;
        }
        for (int64_t i = 0; i < n; i++) {
            src[i] = (float)i;
            dst[i] = -1.0f;
        }
        util_transpose_f32(src, dst, rows, cols);
        int64_t wrong = 0;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                wrong += dst[c * rows + r] != src[r * cols + c];
        CHECK_MSG(wrong == 0, "transpose %lld x %lld: %lld elements wrong", (long long)rows,
                  (long long)cols, (long long)wrong);
        free(src);
        free(dst);
    }
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

/* ---- weights filled on threads ---------------------------------------------------------- */

/* A graph of weights and inputs of every dtype, sizes around WEIGHTS_CHUNK;
 * the first is bigger than a few chunks and not a multiple of one. The
 * last is read transposed from a file (graph_set_source_transposed). */
static void parallel_graph(graph *g) {
    static const struct {
        const char *name;
        graph_role role;
        stof_dtype dtype;
        int64_t rows, cols;
    } spec[] = {
        {"emb.word", GRAPH_WEIGHT, STOF_F16, 97, 3 * WEIGHTS_CHUNK / 97 + 61},
        {"ids", GRAPH_INPUT, STOF_I32, 3, 77},
        {"l0.w", GRAPH_WEIGHT, STOF_BF16, 1, WEIGHTS_CHUNK},
        {"l0.b", GRAPH_WEIGHT, STOF_F16, 1, WEIGHTS_CHUNK + 1},
        {"l0.ln", GRAPH_WEIGHT, STOF_F32, 1, WEIGHTS_CHUNK - 1},
        {"l1.w", GRAPH_WEIGHT, STOF_F16, 5, 7},
        {"l1.conv", GRAPH_WEIGHT, STOF_BF16, 3, 5},
    };
    graph_init(g);
    stof_error err = {0};
    for (size_t i = 0; i < sizeof spec / sizeof spec[0]; i++) {
        int64_t shape[2] = {spec[i].rows, spec[i].cols};
        graph_tensor t = tensor(spec[i].name, spec[i].role, 2, shape);
        t.dtype = spec[i].dtype;
        t.init = i == 4 ? GRAPH_INIT_ONES : GRAPH_INIT_UNIFORM;
        if (t.dtype == STOF_I32) {
            t.init = GRAPH_INIT_TOKENS;
            t.init_high = 1000;
        }
        int id;
        CHECK_MSG(graph_add_tensor(g, &t, &id, &err) == STOF_OK, "%s", err.msg);
        if (strcmp(t.name, "l1.conv") == 0)
            CHECK_MSG(graph_set_source_transposed(g, id, NULL, &err) == STOF_OK, "%s", err.msg);
    }
}

/* Every tensor of g, in the order of `order` (0: forward, 1: backward),
 * filled with src by weights_source_values_many on pool in form: equal,
 * byte for byte, to weights_source_values (and weights_store) one by one. */
static void check_many(const graph *g, const weights_source *src, task_pool *pool,
                       weights_form form, int order) {
    int n = g->n_tensors, list[16] = {0};
    void *out[16] = {0};
    CHECK(n <= 16);
    n = n < 16 ? n : 16;
    for (int k = 0; k < n; k++) {
        list[k] = order ? n - 1 - k : k;
        out[k] = malloc(4 * (size_t)graph_tensor_numel(&g->tensors[list[k]]));
    }
    stof_error err = {0};
    int rc = weights_source_values_many(src, g, list, n, form, out, pool, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    for (int k = 0; rc == STOF_OK && k < n; k++) {
        const graph_tensor *x = &g->tensors[list[k]];
        int64_t e = graph_tensor_numel(x);
        float *want = malloc(sizeof *want * (size_t)e);
        void *stored = malloc(4 * (size_t)e);
        CHECK_EQ_INT(weights_source_values(src, g, list[k], want, &err), STOF_OK);
        weights_store(x->dtype, want, e, stored);
        size_t bytes = form == WEIGHTS_FLOAT ? sizeof(float) * (size_t)e : graph_tensor_bytes(x);
        CHECK_MSG(memcmp(out[k], form == WEIGHTS_FLOAT ? (void *)want : stored, bytes) == 0,
                  "%s: %d threads, form %d, order %d", x->name, task_pool_threads(pool), form,
                  order);
        free(want);
        free(stored);
    }
    for (int k = 0; k < n; k++)
        free(out[k]);
}

static void test_weights_parallel(void) {
    graph g;
    parallel_graph(&g);
    const graph_tensor *big = &g.tensors[0];
    int64_t n = graph_tensor_numel(big);
    float *serial = malloc(sizeof *serial * (size_t)n), *pieces = malloc(sizeof *pieces * (size_t)n);
    weights_fill(big, 11, serial);

    /* any cut into ranges: fixed steps and uneven ones */
    static const int64_t steps[] = {1, 7, 1000, WEIGHTS_CHUNK - 1, WEIGHTS_CHUNK, 100003};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        memset(pieces, 0xff, sizeof *pieces * (size_t)n);
        for (int64_t at = 0; at < n; at += steps[i])
            weights_fill_range(big, 11, at, n - at < steps[i] ? n - at : steps[i], pieces + at);
        CHECK_MSG(memcmp(serial, pieces, sizeof *serial * (size_t)n) == 0, "step %lld",
                  (long long)steps[i]);
    }
    util_rng r = {42};
    memset(pieces, 0xff, sizeof *pieces * (size_t)n);
    for (int64_t at = 0, m; at < n; at += m) {
        m = 1 + (int64_t)(util_rng_next(&r) % 70000);
        m = n - at < m ? n - at : m;
        weights_fill_range(big, 11, at, m, pieces + at);
    }
    CHECK(memcmp(serial, pieces, sizeof *serial * (size_t)n) == 0);
    free(serial);
    free(pieces);

    /* the stored form leaves weights_round out: storing a rounded value
     * gives the bits of storing it unrounded, for any float (NaN, infinity,
     * subnormals, overflow) */
    int same = 1;
    for (int i = 0; i < 1 << 20; i++) {
        uint32_t bits = (uint32_t)util_rng_next(&r);
        if (i < 1 << 16) /* every half and bf16 neighbourhood too */
            bits = (uint32_t)i << 16 | (uint32_t)(i * 2654435761u >> 16);
        float v;
        memcpy(&v, &bits, sizeof v);
        for (stof_dtype d = STOF_F16; d <= STOF_BF16; d++) {
            uint16_t plain, rounded;
            float w = weights_round(d, v);
            weights_store(d, &v, 1, &plain);
            weights_store(d, &w, 1, &rounded);
            same &= plain == rounded;
        }
    }
    CHECK(same);

    /* seeded, on no pool and pools of 1, 2, 3 and 8 workers, in both orders */
    weights_source src = weights_source_seeded(11);
    int threads[] = {0, 1, 2, 3, 8};
    for (size_t i = 0; i < sizeof threads / sizeof threads[0]; i++) {
        task_pool *pool = NULL;
        stof_error err = {0};
        if (threads[i])
            CHECK_EQ_INT(task_pool_create(threads[i], &pool, &err), STOF_OK);
        for (int order = 0; order < 2; order++) {
            check_many(&g, &src, pool, WEIGHTS_FLOAT, order);
            check_many(&g, &src, pool, WEIGHTS_STORED, order);
        }
        task_pool_free(pool);
    }
    /* a small graph is filled on the caller's thread */
    CHECK(weights_pool(&g) == NULL);
    graph_free(&g);
}

/* Weights from a file (every one of them) and inputs from another (some
 * of them) on threads, as one by one; a missing tensor fails before
 * anything is read, with the first problem in the order given. */
static void test_weights_parallel_files(void) {
    graph g;
    parallel_graph(&g);
    char wpath[] = "/tmp/stof_test_core_w_XXXXXX", ipath[] = "/tmp/stof_test_core_i_XXXXXX";
    int wfd = mkstemp(wpath), ifd = mkstemp(ipath);
    CHECK(wfd >= 0 && ifd >= 0);
    if (wfd >= 0)
        close(wfd);
    if (ifd >= 0)
        close(ifd);
    safetensors_entry w[16], in[1];
    void *data[16];
    int nw = 0, ni = 0;
    for (int t = 0; t < g.n_tensors; t++) {
        const graph_tensor *x = &g.tensors[t];
        int64_t e = graph_tensor_numel(x);
        float *v = malloc(sizeof *v * (size_t)e);
        weights_fill(x, 5, v);
        for (int64_t i = 0; i < e; i++) /* other values than the seeded ones */
            v[i] = x->dtype == STOF_I32 ? (float)((int64_t)v[i] * 7 % 1000) : v[i] * -0.5f;
        safetensors_entry en = {.name = x->name, .ndim = x->ndim};
        memcpy(en.shape, x->shape, sizeof *x->shape * (size_t)x->ndim);
        const graph_source *s = graph_source_of(&g, t);
        if (s && s->transposed) { /* the file holds it [K, N] */
            float *kn = malloc(sizeof *kn * (size_t)e);
            for (int64_t r = 0; r < x->shape[0]; r++)
                for (int64_t c = 0; c < x->shape[1]; c++)
                    kn[c * x->shape[0] + r] = v[r * x->shape[1] + c];
            free(v);
            v = kn;
            en.shape[0] = x->shape[1];
            en.shape[1] = x->shape[0];
        }
        if (x->dtype == STOF_I32) {
            int64_t *ids = malloc(sizeof *ids * (size_t)e);
            for (int64_t i = 0; i < e; i++)
                ids[i] = (int64_t)v[i];
            en.dtype = SAFETENSORS_I64;
            en.data = data[t] = ids;
            free(v);
            in[ni++] = en;
        } else {
            en.dtype = SAFETENSORS_F32;
            en.data = data[t] = v;
            w[nw++] = en;
        }
    }
    stof_error err = {0};
    CHECK_MSG(safetensors_write(wpath, w, nw, &err) == STOF_OK, "%s", err.msg);
    CHECK_MSG(safetensors_write(ipath, in, ni, &err) == STOF_OK, "%s", err.msg);
    for (int t = 0; t < g.n_tensors; t++)
        free(data[t]);
    safetensors_file *wf = NULL, *inf = NULL;
    CHECK_MSG(safetensors_open(wpath, &wf, &err) == STOF_OK, "%s", err.msg);
    CHECK_MSG(safetensors_open(ipath, &inf, &err) == STOF_OK, "%s", err.msg);
    if (wf && inf) {
        weights_source src = {.seed = 3, .weights = wf, .inputs = inf};
        task_pool *pool = NULL;
        CHECK_EQ_INT(task_pool_create(3, &pool, &err), STOF_OK);
        for (int order = 0; order < 2; order++) {
            check_many(&g, &src, NULL, WEIGHTS_STORED, order);
            check_many(&g, &src, pool, WEIGHTS_FLOAT, order);
            check_many(&g, &src, pool, WEIGHTS_STORED, order);
        }
        /* with the inputs file only, the weights are seeded */
        weights_source inputs_only = {.seed = 3, .inputs = inf};
        check_many(&g, &inputs_only, pool, WEIGHTS_STORED, 0);

        /* the transposed weight: element (r, c) is the file's (c, r), rounded to bf16 */
        int conv = graph_find_tensor(&g, "l1.conv");
        float file[15], got[15];
        CHECK_EQ_INT(safetensors_read_f32(wf, safetensors_find(wf, "l1.conv", &err), file, &err),
                     STOF_OK);
        CHECK_EQ_INT(weights_source_values(&src, &g, conv, got, &err), STOF_OK);
        int transposed = 1;
        for (int r = 0; r < 3; r++)
            for (int c = 0; c < 5; c++)
                transposed &= got[r * 5 + c] == weights_round(STOF_BF16, file[c * 3 + r]);
        CHECK(transposed);

        /* a weight the file lacks: the first such in the order given */
        graph_tensor extra = g.tensors[5];
        snprintf(extra.name, sizeof extra.name, "l2.w");
        int id, list[2];
        CHECK_EQ_INT(graph_add_tensor(&g, &extra, &id, &err), STOF_OK);
        snprintf(extra.name, sizeof extra.name, "l3.w");
        CHECK_EQ_INT(graph_add_tensor(&g, &extra, &list[0], &err), STOF_OK);
        list[1] = id;
        float a[35], b[35];
        void *out[2] = {a, b};
        CHECK_EQ_INT(weights_source_values_many(&src, &g, list, 2, WEIGHTS_FLOAT, out, pool, &err),
                     STOF_ERR_MISMATCH);
        CHECK_CONTAINS(err.msg, "'l3.w' missing");
        task_pool_free(pool);
    }
    safetensors_close(wf);
    safetensors_close(inf);
    unlink(wpath);
    unlink(ipath);
    graph_free(&g);
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
    CHECK_EQ_INT(op_add(&g, &op, &out, &err), STOF_OK);
    CHECK_EQ_INT(g.tensors[out].shape[1], 8);
    CHECK_EQ_INT(g.tensors[out].producer, 0);
    CHECK_EQ_INT(graph_set_output(&g, out, &err), STOF_OK);
    CHECK_EQ_INT(graph_validate(&g, &err), STOF_OK);
    op.inputs[0] = 99;
    CHECK_EQ_INT(op_add(&g, &op, &out, &err), STOF_ERR_INVALID);
    op.inputs[0] = 0;
    op.n_inputs = 3;
    CHECK_EQ_INT(op_add(&g, &op, &out, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "inputs");

    /* a weight read transposed: 2-D, a weight, one source */
    int64_t three[3] = {2, 4, 8};
    int w2, w3;
    t = tensor("w2", GRAPH_WEIGHT, 2, ok_shape);
    CHECK_EQ_INT(graph_add_tensor(&g, &t, &w2, &err), STOF_OK);
    t = tensor("w3", GRAPH_WEIGHT, 3, three);
    CHECK_EQ_INT(graph_add_tensor(&g, &t, &w3, &err), STOF_OK);
    CHECK_EQ_INT(graph_set_source_transposed(&g, w3, NULL, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "weight 'w3' is [2, 4, 8]: only a 2-D weight is read transposed");
    CHECK_EQ_INT(graph_set_source_transposed(&g, 0, NULL, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "only weights");
    CHECK_EQ_INT(graph_set_source_transposed(&g, w2, "conv.w", &err), STOF_OK);
    const graph_source *src = graph_source_of(&g, w2);
    CHECK(src && src->transposed && src->n == 1 && !src->row_offset &&
          strcmp(graph_source_part(&g, src, 0), "conv.w") == 0);
    CHECK_EQ_INT(graph_set_source_transposed(&g, w2, NULL, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "weight 'w2' already has its parts");
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
    test_align_up();
    test_transpose();
    test_half();
    test_round_f16();
    test_weights();
    test_weights_parallel();
    test_weights_parallel_files();
    test_graph_errors();
    test_errors();
    test_device();
    return check_summary("test_core");
}
