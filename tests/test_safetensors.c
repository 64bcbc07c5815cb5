/* safetensors files and weight sources: the writer and reader round trip in
 * every dtype; lookup under a checkpoint prefix; malformed files (and a few
 * hundred random mutations of a valid one) give a clear error, never a
 * crash; a small model whose fused QKV projection is assembled from three
 * checkpoint tensors gives, with its seeded weights exported to a file and
 * loaded back, exactly the seeded output; a file that does not fit the
 * model reports every problem by name in one error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "reference.h"
#include "core/base/error.h"
#include "core/base/file.h"
#include "core/lua/lua_api.h"
#include "core/ref/ref.h"
#include "core/io/safetensors.h"
#include "core/base/util.h"
#include "core/io/weights.h"

#define WORK STOF_BINARY_DIR "/tests/"

/* ---- files written byte by byte ---------------------------------------------------------- */

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK_MSG(f != NULL, "cannot write %s", path);
    if (!f)
        return;
    CHECK(fwrite(p, 1, n, f) == n);
    fclose(f);
}

static unsigned char *read_bytes(const char *path, size_t *n) {
    char *text = NULL;
    stof_error err = {0};
    CHECK_MSG(file_read(path, "test file", 0, &text, n, &err) == STOF_OK, "%s", err.msg);
    return (unsigned char *)text;
}

/* A file of the header text (its length as written: hdr_len) and data_len
 * bytes of data 0, 1, 2, ... */
static void write_file(const char *path, uint64_t hdr_len, const char *header, size_t data_len) {
    size_t h = strlen(header);
    size_t n = 8 + h + data_len;
    unsigned char *buf = malloc(n);
    for (int k = 0; k < 8; k++)
        buf[k] = (unsigned char)(hdr_len >> (8 * k));
    memcpy(buf + 8, header, h);
    for (size_t i = 0; i < data_len; i++)
        buf[8 + h + i] = (unsigned char)i;
    write_bytes(path, buf, n);
    free(buf);
}

static void write_header(const char *path, const char *header, size_t data_len) {
    write_file(path, strlen(header), header, data_len);
}

/* Opening path fails with code and a message that names the file and
 * contains what. */
static void expect_open_error(const char *path, int code, const char *what) {
    safetensors_file *f = NULL;
    stof_error err = {0};
    int rc = safetensors_open(path, &f, &err);
    CHECK_MSG(rc == code, "%s: rc %d, expected %d (%s)", path, rc, code, err.msg);
    CHECK(f == NULL);
    CHECK_CONTAINS(err.msg, path);
    CHECK_CONTAINS(err.msg, what);
    safetensors_close(f);
}

/* ---- round trip ------------------------------------------------------------------------------ */

static void test_round_trip(void) {
    float f32[6] = {1.5f, -2.25f, 3.0f, 0.0f, -0.0f, 65504.0f};
    uint16_t f16[6], bf16[6];
    for (int i = 0; i < 6; i++) {
        f16[i] = util_f32_to_f16(f32[i]);
        bf16[i] = util_f32_to_bf16(f32[i]);
    }
    int32_t i32[4] = {0, -7, 2147483647, 12};
    int64_t i64[3] = {5, -9, (int64_t)1 << 40};
    float scalar = 42.0f;
    safetensors_entry e[] = {
        {"f32", SAFETENSORS_F32, 2, {2, 3}, f32},
        {"layer.f16", SAFETENSORS_F16, 2, {3, 2}, f16},
        {"bf16 \"quoted\\name\"", SAFETENSORS_BF16, 1, {6}, bf16},
        {"i32", SAFETENSORS_I32, 3, {1, 2, 2}, i32},
        {"i64", SAFETENSORS_I64, 1, {3}, i64},
        {"scalar", SAFETENSORS_F32, 0, {0}, &scalar},
        {"empty", SAFETENSORS_F16, 2, {0, 4}, f16},
    };
    const char *path = WORK "st_round_trip.safetensors";
    stof_error err = {0};
    CHECK_MSG(safetensors_write(path, e, 7, &err) == STOF_OK, "%s", err.msg);
    size_t n = 0;
    unsigned char *raw = read_bytes(path, &n);
    if (raw)
        CHECK_EQ_INT((raw[0] | raw[1] << 8) % 8, 0); /* header padded to 8 bytes */
    free(raw);
    safetensors_file *f = NULL;
    CHECK_MSG(safetensors_open(path, &f, &err) == STOF_OK, "%s", err.msg);
    if (!f)
        return;
    CHECK_EQ_INT(f->n, 7);
    for (int k = 0; k < 7; k++) {
        int i = safetensors_find(f, e[k].name, &err);
        CHECK_MSG(i >= 0, "%s not found", e[k].name);
        if (i < 0)
            continue;
        const safetensors_tensor *t = &f->tensors[i];
        CHECK_EQ_INT(t->dtype, e[k].dtype);
        CHECK_EQ_INT(t->ndim, e[k].ndim);
        for (int d = 0; d < t->ndim; d++)
            CHECK_EQ_INT(t->shape[d], e[k].shape[d]);
        size_t bytes = (size_t)(t->end - t->begin);
        void *buf = malloc(bytes + 1);
        CHECK_EQ_INT(safetensors_read(f, i, buf, &err), STOF_OK);
        CHECK(memcmp(buf, e[k].data, bytes) == 0);
        free(buf);
        float *v = malloc(sizeof *v * (size_t)(t->numel + 1));
        CHECK_MSG(safetensors_read_f32(f, i, v, &err) == STOF_OK, "%s", err.msg);
        for (int64_t j = 0; j < t->numel; j++) {
            double want = e[k].dtype == SAFETENSORS_I32   ? i32[j]
                          : e[k].dtype == SAFETENSORS_I64 ? (double)i64[j]
                          : e[k].dtype == SAFETENSORS_F16 ? util_f16_to_f32(f16[j])
                          : e[k].dtype == SAFETENSORS_BF16 ? util_bf16_to_f32(bf16[j])
                          : k == 5                          ? scalar
                                                            : f32[j];
            CHECK_MSG(v[j] == (float)want, "%s[%lld] = %g, expected %g", e[k].name,
                      (long long)j, v[j], want);
        }
        free(v);
    }
    int64_t ids[3];
    CHECK_EQ_INT(safetensors_read_i64(f, safetensors_find(f, "i64", &err), ids, &err), STOF_OK);
    CHECK(ids[2] == (int64_t)1 << 40 && ids[1] == -9);
    CHECK_EQ_INT(safetensors_read_i64(f, safetensors_find(f, "f32", &err), ids, &err),
                 STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "'f32' has dtype F32");
    CHECK_EQ_INT(safetensors_find(f, "nothing", &err), -1);
    safetensors_close(f);

    /* the writer refuses what it cannot write */
    safetensors_entry twice[] = {{"a", SAFETENSORS_F32, 1, {1}, f32},
                                 {"a", SAFETENSORS_F32, 1, {1}, f32}};
    CHECK_EQ_INT(safetensors_write(WORK "st_twice.safetensors", twice, 2, &err),
                 STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "'a' is given twice");
    CHECK_EQ_INT(safetensors_write(WORK "no/such/dir/x.safetensors", e, 1, &err), STOF_ERR_IO);
    CHECK_CONTAINS(err.msg, "no/such/dir/x.safetensors");
}

/* ---- lookup under a prefix ---------------------------------------------------------------------- */

static void test_prefix(void) {
    float v[4] = {1, 2, 3, 4};
    safetensors_entry e[] = {
        {"bert.embeddings.weight", SAFETENSORS_F32, 1, {1}, v},
        {"bert.encoder.dense.weight", SAFETENSORS_F32, 1, {1}, v + 1},
        {"cls.predictions.dense.weight", SAFETENSORS_F32, 1, {1}, v + 2},
        {"pooler.weight", SAFETENSORS_F32, 1, {1}, v + 3},
        {"bert.pooler.weight", SAFETENSORS_F32, 1, {1}, v + 3},
    };
    const char *path = WORK "st_prefix.safetensors";
    stof_error err = {0};
    CHECK_EQ_INT(safetensors_write(path, e, 5, &err), STOF_OK);
    safetensors_file *f = NULL;
    CHECK_MSG(safetensors_open(path, &f, &err) == STOF_OK, "%s", err.msg);
    if (!f)
        return;
    int i = safetensors_find(f, "embeddings.weight", &err);
    CHECK(i >= 0 && strcmp(f->tensors[i].name, "bert.embeddings.weight") == 0);
    i = safetensors_find(f, "encoder.dense.weight", &err);
    CHECK(i >= 0 && strcmp(f->tensors[i].name, "bert.encoder.dense.weight") == 0);
    i = safetensors_find(f, "pooler.weight", &err); /* the exact name wins */
    CHECK(i >= 0 && strcmp(f->tensors[i].name, "pooler.weight") == 0);
    CHECK_EQ_INT(safetensors_find(f, "dense.weight", &err), -2);
    CHECK_CONTAINS(err.msg, "'dense.weight' is ambiguous");
    CHECK_CONTAINS(err.msg, "'bert.encoder.dense.weight'");
    CHECK_CONTAINS(err.msg, "'cls.predictions.dense.weight'");
    CHECK_CONTAINS(err.msg, path);
    CHECK_EQ_INT(safetensors_find(f, "ncoder.dense.weight", &err), -1); /* whole components */
    safetensors_close(f);
}

/* ---- malformed files ---------------------------------------------------------------------------- */

static void test_malformed(void) {
    const char *p = WORK "st_bad.safetensors";
    write_bytes(p, "\x10\0\0", 3);
    expect_open_error(p, STOF_ERR_FORMAT, "too short");
    write_file(p, 4096, "{}", 0);
    expect_open_error(p, STOF_ERR_FORMAT, "header length 4096 runs past the end of the file");
    write_file(p, (uint64_t)1 << 62, "{}", 0);
    expect_open_error(p, STOF_ERR_FORMAT, "header length");
    write_header(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]", 4);
    expect_open_error(p, STOF_ERR_FORMAT, "not valid JSON");
    write_header(p, "[1, 2]", 0);
    expect_open_error(p, STOF_ERR_FORMAT, "JSON object");
    write_header(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 4);
    expect_open_error(p, STOF_ERR_FORMAT, "tensor 'a': data_offsets [0, 8] are outside");
    write_header(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}", 8);
    expect_open_error(p, STOF_ERR_FORMAT, "outside the data section");
    write_header(p, "{\"a\": {\"dtype\": \"F16\", \"shape\": [2, 3], \"data_offsets\": [0, 8]}}",
                 8);
    expect_open_error(p, STOF_ERR_FORMAT, "F16 [2, 3] is 6 elements of 2 bytes");
    write_header(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                    " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8);
    expect_open_error(p, STOF_ERR_FORMAT, "tensor 'a': appears twice");
    write_header(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                    " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8);
    expect_open_error(p, STOF_ERR_FORMAT, "overlap");
    write_header(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 4);
    expect_open_error(p, STOF_ERR_FORMAT, "shape[0] must be a non-negative integer");
    write_header(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", 4);
    expect_open_error(p, STOF_ERR_FORMAT, "shape[0]");
    write_header(p, "{\"a\": {\"dtype\": 7, \"shape\": [1], \"data_offsets\": [0, 4]}}", 4);
    expect_open_error(p, STOF_ERR_FORMAT, "\"dtype\" must be a string");
    write_header(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", 4);
    expect_open_error(p, STOF_ERR_FORMAT, "two non-negative integers");
    write_header(p, "{\"a\": [1, 2]}", 4);
    expect_open_error(p, STOF_ERR_FORMAT, "tensor 'a': expected an object");
    write_header(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}} x", 4);
    expect_open_error(p, STOF_ERR_FORMAT, "text after");
    write_header(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 4294967296],"
                    " \"data_offsets\": [0, 4]}}", 4);
    expect_open_error(p, STOF_ERR_FORMAT, "overflows");
    expect_open_error(WORK "st_does_not_exist.safetensors", STOF_ERR_IO, "cannot read");

    /* metadata ignored; dtypes stof does not read are refused when read, by name */
    write_header(p, "{\"__metadata__\": {\"format\": \"pt\"},"
                    " \"a\": {\"dtype\": \"Q7\", \"shape\": [2], \"data_offsets\": [0, 3]},"
                    " \"b\": {\"dtype\": \"F64\", \"shape\": [1], \"data_offsets\": [3, 11]}}  ",
                 11);
    safetensors_file *f = NULL;
    stof_error err = {0};
    CHECK_MSG(safetensors_open(p, &f, &err) == STOF_OK, "%s", err.msg);
    if (f) {
        CHECK_EQ_INT(f->n, 2);
        float v[2];
        CHECK_EQ_INT(safetensors_read_f32(f, safetensors_find(f, "a", &err), v, &err),
                     STOF_ERR_UNSUPPORTED);
        CHECK_CONTAINS(err.msg, "tensor 'a' has dtype Q7");
        CHECK_EQ_INT(safetensors_read_f32(f, safetensors_find(f, "b", &err), v, &err),
                     STOF_ERR_UNSUPPORTED);
        CHECK_CONTAINS(err.msg, "tensor 'b' has dtype F64");
        safetensors_close(f);
    }
    /* F64 of the wrong byte count: known sizes are checked for every dtype */
    write_header(p, "{\"b\": {\"dtype\": \"F64\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4);
    expect_open_error(p, STOF_ERR_FORMAT, "F64 [1] is 1 elements of 8 bytes");
}

/* Random byte mutations and truncations of a valid file: open either
 * fails with a message naming the file, or succeeds and every tensor reads
 * (or is refused) cleanly. */
static void test_mutations(void) {
    float a[12];
    int64_t b[3] = {1, 2, 3};
    uint16_t c[5] = {0x3c00, 0x4000, 0, 0x8000, 0x7bff};
    for (int i = 0; i < 12; i++)
        a[i] = (float)i * 0.5f;
    safetensors_entry e[] = {{"model.a", SAFETENSORS_F32, 2, {3, 4}, a},
                             {"model.b", SAFETENSORS_I64, 1, {3}, b},
                             {"c", SAFETENSORS_BF16, 1, {5}, c}};
    const char *good = WORK "st_fuzz_base.safetensors", *p = WORK "st_fuzz.safetensors";
    stof_error err = {0};
    CHECK_EQ_INT(safetensors_write(good, e, 3, &err), STOF_OK);
    size_t n = 0;
    unsigned char *base = read_bytes(good, &n);
    if (!base)
        return;
    unsigned char *buf = malloc(n);
    util_rng rng = {12345};
    int opened = 0, failed = 0, unexpected = 0;
    for (int iter = 0; iter < 400; iter++) {
        memcpy(buf, base, n);
        size_t len = n;
        if (iter % 4 == 3) {
            len = (size_t)(util_rng_next(&rng) % n);
        } else {
            int flips = 1 + (int)(util_rng_next(&rng) % 4);
            for (int k = 0; k < flips; k++) {
                /* mostly the header and its length, where the parsing is */
                size_t at = (size_t)(util_rng_next(&rng) % (iter % 2 ? n : 8 + 120));
                buf[at < n ? at : n - 1] = (unsigned char)util_rng_next(&rng);
            }
        }
        write_bytes(p, buf, len);
        safetensors_file *f = NULL;
        int rc = safetensors_open(p, &f, &err);
        if (rc) {
            failed++;
            unexpected += rc != STOF_ERR_FORMAT || !strstr(err.msg, p);
            continue;
        }
        opened++;
        for (int i = 0; i < f->n; i++) {
            const safetensors_tensor *t = &f->tensors[i];
            if (t->numel > 1 << 20)
                continue;
            float *v = malloc(sizeof *v * (size_t)(t->numel + 1));
            rc = safetensors_read_f32(f, i, v, &err);
            unexpected += rc != STOF_OK && rc != STOF_ERR_UNSUPPORTED;
            free(v);
        }
        safetensors_close(f);
    }
    printf("mutations: %d opened, %d refused, %d unexpected\n", opened, failed, unexpected);
    CHECK_EQ_INT(unexpected, 0);
    CHECK(failed > 100);
    free(buf);
    free(base);
}

/* ---- a model's weights from a file ------------------------------------------------------------ */

static const char *tiny_model =
    "local m = stof.model{name = 'tiny', dtype = 'fp16'}\n"
    "local H = 16\n"
    "local ids = m:input('input_ids', {2, 8}, {dtype = 'int32', high = 50})\n"
    "local x = m:embedding(ids, m:weight('emb.word.weight', {50, H}),\n"
    "                      {position = m:weight('emb.pos.weight', {8, H})})\n"
    "x = m:layernorm(x, m:weight('ln.weight', {H}, {init = 'ones'}), m:weight('ln.bias', {H}))\n"
    "local qkv = m:linear(x,\n"
    "  m:weight('attn.qkv.weight', {3 * H, H},\n"
    "           {from = {'attn.q.weight', 'attn.k.weight', 'attn.v.weight'}}),\n"
    "  m:weight('attn.qkv.bias', {3 * H}, {from = {'attn.q.bias', 'attn.k.bias', 'attn.v.bias'}}))\n"
    "local a = m:attention(qkv, {heads = 2, head_dim = 8})\n"
    "local y = m:add(x, m:linear(a, m:weight('attn.o.weight', {H, H}), m:weight('attn.o.bias', {H})))\n"
    "m:output(m:gelu(y))\n"
    "return m\n";

static int build(const char *src, graph *g) {
    stof_error err = {0};
    graph_init(g);
    int rc = lua_api_build_string(src, "tiny.lua", NULL, NULL, 0, g, NULL, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    return rc;
}

/* What export_values changes on the way. */
typedef struct export_opts {
    graph_role role;           /* the tensors written: weights or inputs */
    const char *prefix;        /* before every name ("" for none) */
    safetensors_dtype dtype;   /* of float tensors */
    const char *skip;          /* a name left out */
    const char *transpose;     /* a 2-D tensor written with its dims swapped */
    const char *as_i64;        /* a float tensor written as I64 */
} export_opts;

#define MAX_OUT 64

typedef struct export_buf {
    safetensors_entry e[MAX_OUT];
    char names[MAX_OUT][GRAPH_NAME_MAX * 2];
    void *data[MAX_OUT];
    int n;
} export_buf;

/* One entry: rows r0 .. r0 + rows - 1 of values v (of tensor t) as dtype. */
static void export_add(export_buf *b, const export_opts *o, const graph_tensor *t,
                       const char *name, const float *v, int64_t r0, int64_t rows) {
    if ((o->skip && strcmp(name, o->skip) == 0) || b->n == MAX_OUT)
        return;
    int64_t row = graph_tensor_numel(t) / t->shape[0], n = rows * row;
    int ids = t->dtype == STOF_I32 || (o->as_i64 && strcmp(name, o->as_i64) == 0);
    safetensors_dtype dt = ids ? SAFETENSORS_I64 : o->dtype;
    void *data = malloc((size_t)n * safetensors_dtype_size(dt));
    for (int64_t i = 0; i < n; i++) {
        float x = v[r0 * row + i];
        if (dt == SAFETENSORS_I64)
            ((int64_t *)data)[i] = (int64_t)x;
        else if (dt == SAFETENSORS_F16)
            ((uint16_t *)data)[i] = util_f32_to_f16(x);
        else if (dt == SAFETENSORS_BF16)
            ((uint16_t *)data)[i] = util_f32_to_bf16(x);
        else
            ((float *)data)[i] = x;
    }
    safetensors_entry *e = &b->e[b->n];
    snprintf(b->names[b->n], sizeof b->names[0], "%s%s", o->prefix, name);
    *e = (safetensors_entry){.name = b->names[b->n], .dtype = dt, .ndim = t->ndim, .data = data};
    for (int d = 0; d < t->ndim; d++)
        e->shape[d] = t->shape[d];
    e->shape[0] = rows;
    if (o->transpose && strcmp(name, o->transpose) == 0) {
        e->shape[0] = e->shape[1];
        e->shape[1] = rows;
    }
    b->data[b->n++] = data;
}

/* Weight t's values v [N, K] as a checkpoint that stores them [K, N] does. */
static void export_transposed(export_buf *b, const export_opts *o, const graph_tensor *t,
                              const char *name, const float *v) {
    graph_tensor kn = *t;
    kn.shape[0] = t->shape[1];
    kn.shape[1] = t->shape[0];
    float *w = malloc(sizeof *w * (size_t)graph_tensor_numel(t));
    for (int64_t r = 0; r < t->shape[0]; r++)
        for (int64_t c = 0; c < t->shape[1]; c++)
            w[c * t->shape[0] + r] = v[r * t->shape[1] + c];
    export_add(b, o, &kn, name, w, 0, kn.shape[0]);
    free(w);
}

/* Writes the seeded values of g's tensors of o->role to path; an
 * assembled weight as its parts (equal rows each), a weight read
 * transposed as its transpose. */
static void export_values(const graph *g, uint64_t seed, const char *path, const export_opts *o) {
    export_buf *b = calloc(1, sizeof *b);
    for (int t = 0; t < g->n_tensors; t++) {
        const graph_tensor *x = &g->tensors[t];
        if (x->role != o->role)
            continue;
        float *v = malloc(sizeof *v * (size_t)graph_tensor_numel(x));
        weights_fill(x, seed, v);
        const graph_source *s = graph_source_of(g, t);
        int parts = s ? s->n : 1;
        for (int k = 0, first = 0; k < parts && !(s && s->transposed); k++) {
            int64_t rows = s ? s->part_rows[k] : x->shape[0];
            export_add(b, o, x, s ? graph_source_part(g, s, k) : x->name, v, first, rows);
            first += (int)rows;
        }
        if (s && s->transposed)
            export_transposed(b, o, x, graph_source_part(g, s, 0), v);
        free(v);
    }
    stof_error err = {0};
    CHECK_MSG(safetensors_write(path, b->e, b->n, &err) == STOF_OK, "%s", err.msg);
    for (int i = 0; i < b->n; i++)
        free(b->data[i]);
    free(b);
}

/* The CPU reference's output with src; NULL (err set) on failure. */
static safetensors_file *open_ok(const char *path) {
    safetensors_file *f = NULL;
    stof_error err = {0};
    CHECK_MSG(safetensors_open(path, &f, &err) == STOF_OK, "%s", err.msg);
    return f;
}

/* The output with weights (and inputs) from a file of the seeded values is
 * the seeded output, bit for bit. */
static void expect_same_output(const graph *g, const float *want, const export_opts *wo,
                               int with_inputs, const char *label) {
    const char *wpath = WORK "st_model_w.safetensors", *ipath = WORK "st_model_in.safetensors";
    export_values(g, 7, wpath, wo);
    export_opts io = {.role = GRAPH_INPUT, .prefix = "", .dtype = SAFETENSORS_F32};
    if (with_inputs)
        export_values(g, 7, ipath, &io);
    safetensors_file *wf = open_ok(wpath), *inf = with_inputs ? open_ok(ipath) : NULL;
    /* another seed: every value must come from the files (the inputs too
     * when given) */
    weights_source src = {.seed = with_inputs ? 99 : 7, .weights = wf, .inputs = inf};
    stof_error err = {0};
    CHECK_MSG(weights_source_check(&src, g, &err) == STOF_OK, "%s: %s", label, err.msg);
    float *got = test_reference(g, &src, &err);
    CHECK_MSG(got != NULL, "%s: %s", label, err.msg);
    int64_t n = graph_tensor_numel(&g->tensors[g->output]);
    if (got)
        CHECK_MSG(memcmp(got, want, sizeof *got * (size_t)n) == 0, "%s: output differs", label);
    char line[1024];
    weights_source_describe(&src, g, line, sizeof line);
    printf("%s:\n  %s\n", label, line);
    CHECK_CONTAINS(line, "weights: 12 tensors from");
    CHECK_CONTAINS(line, "2 assembled");
    free(got);
    safetensors_close(wf);
    safetensors_close(inf);
}

static void test_model_from_file(void) {
    graph g;
    if (build(tiny_model, &g))
        return;
    int qkv = graph_find_tensor(&g, "attn.qkv.weight");
    const graph_source *s = qkv >= 0 ? graph_source_of(&g, qkv) : NULL;
    CHECK(s && s->n == 3 && strcmp(graph_source_part(&g, s, 1), "attn.k.weight") == 0);
    CHECK(graph_source_of(&g, graph_find_tensor(&g, "attn.o.weight")) == NULL);

    /* the seeded source is weights_fill, bit for bit */
    weights_source seeded = weights_source_seeded(7);
    for (int t = 0; t < g.n_tensors; t++) {
        const graph_tensor *x = &g.tensors[t];
        if (x->role != GRAPH_WEIGHT && x->role != GRAPH_INPUT)
            continue;
        int64_t n = graph_tensor_numel(x);
        float *a = malloc(sizeof *a * (size_t)n), *b = malloc(sizeof *b * (size_t)n);
        stof_error err = {0};
        weights_fill(x, 7, a);
        CHECK_EQ_INT(weights_source_values(&seeded, &g, t, b, &err), STOF_OK);
        CHECK(memcmp(a, b, sizeof *a * (size_t)n) == 0);
        free(a);
        free(b);
    }
    stof_error err = {0};
    float *want = test_reference(&g, &seeded, &err);
    CHECK_MSG(want != NULL, "%s", err.msg);
    if (want) {
        expect_same_output(&g, want, &(export_opts){GRAPH_WEIGHT, "", SAFETENSORS_F32, 0, 0, 0},
                           0, "fp32 weights");
        expect_same_output(&g, want, &(export_opts){GRAPH_WEIGHT, "", SAFETENSORS_F16, 0, 0, 0},
                           1, "fp16 weights and int64 inputs");
        expect_same_output(&g, want,
                           &(export_opts){GRAPH_WEIGHT, "model.", SAFETENSORS_F32, 0, 0, 0}, 1,
                           "fp32 weights under prefix 'model.'");
    }
    free(want);
    graph_free(&g);
}

/* A file that does not fit: every problem in one error, by name. */
static void test_problems(void) {
    graph g;
    if (build(tiny_model, &g))
        return;
    const char *path = WORK "st_problems.safetensors";
    export_values(&g, 7, path,
                  &(export_opts){GRAPH_WEIGHT, "", SAFETENSORS_F32, "attn.k.weight",
                                 "emb.word.weight", "ln.bias"});
    safetensors_file *f = open_ok(path);
    weights_source src = {.seed = 7, .weights = f};
    stof_error err = {0};
    CHECK_EQ_INT(weights_source_check(&src, &g, &err), STOF_ERR_MISMATCH);
    printf("problems: %s\n", err.msg);
    CHECK_CONTAINS(err.msg, path);
    CHECK_CONTAINS(err.msg, "3 problems");
    CHECK_CONTAINS(err.msg, "(5 of 8 weights found as the model needs them)");
    CHECK_CONTAINS(err.msg, "tensor 'emb.word.weight' is [16, 50], expected [50, 16]");
    CHECK_CONTAINS(err.msg, "tensor 'ln.bias' is I64, expected a float dtype");
    CHECK_CONTAINS(err.msg, "tensor 'attn.k.weight' missing (part 2 of 3 of weight "
                            "'attn.qkv.weight')");
    /* the CPU reference refuses before allocating anything */
    ref_values rv;
    CHECK_EQ_INT(ref_values_init(&g, &src, &rv, &err), STOF_ERR_MISMATCH);
    CHECK(rv.data == NULL);
    safetensors_close(f);

    /* one problem: "FILE: tensor 'x' missing" */
    export_values(&g, 7, path, &(export_opts){GRAPH_WEIGHT, "", SAFETENSORS_F32, "ln.weight", 0, 0});
    f = open_ok(path);
    src.weights = f;
    CHECK_EQ_INT(weights_source_check(&src, &g, &err), STOF_ERR_MISMATCH);
    char want[512];
    snprintf(want, sizeof want, "%s: tensor 'ln.weight' missing", path);
    CHECK_MSG(strcmp(err.msg, want) == 0, "%s", err.msg);
    safetensors_close(f);
    graph_free(&g);
}

/* Parts that do not add up; ids out of range; tensors under two prefixes;
 * a LayerNorm's gamma and beta; the Lua side of `from`. */
static void test_sources(void) {
    static const char *src_text =
        "local m = stof.model{name = 'x', dtype = 'fp32'}\n"
        "local ids = m:input('ids', {1, 3}, {dtype = 'int32', high = 4})\n"
        "local e = m:embedding(ids, m:weight('w', {4, 2}, {from = {'w0', 'w1'}}))\n"
        "local n = m:layernorm(e, m:weight('a.LayerNorm.weight', {2}),\n"
        "                      m:weight('a.LayerNorm.bias', {2}))\n"
        "m:output(m:relu(n))\n"
        "return m\n";
    graph g;
    if (build(src_text, &g))
        return;
    float v[12] = {0};
    int64_t ids_ok[3] = {0, 3, 1}, ids_bad[3] = {0, 4, -1};
    const char *path = WORK "st_sources.safetensors";
    safetensors_entry e[] = {{"w0", SAFETENSORS_F32, 2, {1, 2}, v},
                             {"w1", SAFETENSORS_F32, 2, {2, 2}, v},
                             {"p.a.LayerNorm.gamma", SAFETENSORS_F32, 1, {2}, v},
                             {"q.a.LayerNorm.beta", SAFETENSORS_BF16, 1, {2}, v},
                             {"ids", SAFETENSORS_I64, 2, {1, 3}, ids_bad}};
    stof_error err = {0};
    CHECK_EQ_INT(safetensors_write(path, e, 5, &err), STOF_OK);
    safetensors_file *f = open_ok(path);
    weights_source src = {.seed = 1, .weights = f, .inputs = f};
    CHECK(weights_source_check(&src, &g, &err) != STOF_OK);
    printf("sources: %s\n", err.msg);
    CHECK_CONTAINS(err.msg, "weight 'w' [4, 2] is assembled from 'w0' [1, 2] + 'w1' [2, 2]");
    CHECK_CONTAINS(err.msg, "tensors under two prefixes: 'p.' (for 'a.LayerNorm.weight') and "
                            "'q.' (for 'a.LayerNorm.bias')");
    CHECK_CONTAINS(err.msg, "tensor 'ids': value 4 at index 1 (row 0, position 1) is outside "
                            "[0, 4)");
    safetensors_close(f);

    e[3].name = "p.a.LayerNorm.beta";
    e[4].data = ids_ok;
    /* Parts whose rows add up but are not equal (or one of them empty) would
     * put one part's rows in another's place: refused. */
    static const int64_t unequal[2][2] = {{1, 3}, {0, 4}};
    for (int k = 0; k < 2; k++) {
        e[0].shape[0] = unequal[k][0];
        e[1].shape[0] = unequal[k][1];
        CHECK_EQ_INT(safetensors_write(path, e, 5, &err), STOF_OK);
        f = open_ok(path);
        src.weights = src.inputs = f;
        CHECK(weights_source_check(&src, &g, &err) == STOF_ERR_MISMATCH);
        CHECK_CONTAINS(err.msg, "in parts of 2 + 2 rows");
        safetensors_close(f);
    }
    e[0].shape[0] = e[1].shape[0] = 2;
    CHECK_EQ_INT(safetensors_write(path, e, 5, &err), STOF_OK);
    f = open_ok(path);
    src.weights = src.inputs = f;
    CHECK_MSG(weights_source_check(&src, &g, &err) == STOF_OK, "%s", err.msg);
    float ids[3];
    int t = graph_find_tensor(&g, "ids");
    CHECK_EQ_INT(weights_source_values(&src, &g, t, ids, &err), STOF_OK);
    CHECK(ids[0] == 0 && ids[1] == 3 && ids[2] == 1);
    char line[1024];
    weights_source_describe(&src, &g, line, sizeof line);
    printf("sources:\n  %s\n", line);
    CHECK_CONTAINS(line, "(fp32, bf16 -> fp32)");
    CHECK_CONTAINS(line, "under prefix 'p.'");
    CHECK_CONTAINS(line, "inputs: 1 from");
    safetensors_close(f);

    /* a checkpoint that stores the fused weight itself: read under its own name */
    e[0] = (safetensors_entry){"p.w", SAFETENSORS_F32, 2, {4, 2}, v};
    CHECK_EQ_INT(safetensors_write(path, e, 5, &err), STOF_OK);
    f = open_ok(path);
    src.weights = src.inputs = f;
    CHECK_MSG(weights_source_check(&src, &g, &err) == STOF_OK, "%s", err.msg);
    weights_source_describe(&src, &g, line, sizeof line);
    CHECK_CONTAINS(line, "weights: 3 tensors from");
    CHECK(strstr(line, "assembled") == NULL);
    safetensors_close(f);
    graph_free(&g);

    /* `from` mistakes are script errors at their line */
    static const char *const bad[] = {
        "local m = stof.model{}\nm:weight('w', {2}, {from = {}})\n",
        "local m = stof.model{}\nm:weight('w', {2}, {from = {'a', 3}})\n",
        "local m = stof.model{}\nm:weight('w', {2}, {from = 'a'})\n",
        "local m = stof.model{}\nm:weight('w', {2}, {from = {'a', 'a'}})\n",
    };
    static const char *const why[] = {"from' must be a list", "from[2] must be a tensor name",
                                      "from' must be a list", "part 'a' is given twice"};
    for (int i = 0; i < 4; i++) {
        graph_init(&g);
        int rc = lua_api_build_string(bad[i], "from.lua", NULL, NULL, 0, &g, NULL, &err);
        CHECK_EQ_INT(rc, STOF_ERR_SCRIPT);
        CHECK_CONTAINS(err.msg, "from.lua:2:");
        CHECK_CONTAINS(err.msg, why[i]);
        graph_free(&g);
    }
}

/* Weights read transposed (GPT-2's Conv1D [in, out] into [out, in]): the
 * values, the shape the file must have, a part named by `from`, the element
 * a bad value is at, and the output of a kn = true GEMM on the file's
 * tensors as they are. */
static void test_transposed(void) {
    static const char *nk =
        "local m = stof.model{name = 't', dtype = 'fp32'}\n"
        "local x = m:input('x', {1, 2, 3})\n"
        "local c = m:weight('c.weight', {4, 3}, {transposed = true})\n"
        "local d = m:weight('d.weight', {4, 3}, {transposed = true, from = {'d.conv'}})\n"
        "m:output(m:add(m:linear(x, c), m:gelu(m:linear(x, d))))\n"
        "return m\n";
    static const char *kn =
        "local m = stof.model{name = 't', dtype = 'fp32'}\n"
        "local x = m:input('x', {1, 2, 3})\n"
        "local c = m:weight('c.weight', {3, 4})\n"
        "local d = m:weight('d.conv', {3, 4})\n"
        "m:output(m:add(m:linear(x, c, nil, {kn = true}),\n"
        "               m:gelu(m:linear(x, d, nil, {kn = true}))))\n"
        "return m\n";
    graph g, gkn;
    if (build(nk, &g))
        return;
    if (build(kn, &gkn)) {
        graph_free(&g);
        return;
    }
    int c = graph_find_tensor(&g, "c.weight"), d = graph_find_tensor(&g, "d.weight");
    const graph_source *cs = graph_source_of(&g, c), *ds = graph_source_of(&g, d);
    CHECK(cs && cs->transposed && strcmp(graph_source_part(&g, cs, 0), "c.weight") == 0);
    CHECK(ds && ds->transposed && strcmp(graph_source_part(&g, ds, 0), "d.conv") == 0);
    /* the file: [K, N] = [3, 4]; 'd.weight' [4, 3] too, which must not be read */
    float cv[12], dv[12], decoy[12];
    for (int i = 0; i < 12; i++) {
        cv[i] = (float)i;
        dv[i] = 100.0f + (float)i;
        decoy[i] = -1.0f;
    }
    const char *path = WORK "st_transposed.safetensors";
    safetensors_entry e[] = {{"c.weight", SAFETENSORS_F32, 2, {3, 4}, cv},
                             {"d.conv", SAFETENSORS_F32, 2, {3, 4}, dv},
                             {"d.weight", SAFETENSORS_F32, 2, {4, 3}, decoy}};
    stof_error err = {0};
    CHECK_EQ_INT(safetensors_write(path, e, 3, &err), STOF_OK);
    safetensors_file *f = open_ok(path);
    weights_source src = {.seed = 1, .weights = f};
    CHECK_MSG(weights_source_check(&src, &g, &err) == STOF_OK, "%s", err.msg);
    float got[2][12];
    CHECK_EQ_INT(weights_source_values(&src, &g, c, got[0], &err), STOF_OK);
    CHECK_EQ_INT(weights_source_values(&src, &g, d, got[1], &err), STOF_OK);
    int ok = 1;
    for (int n = 0; n < 4; n++)
        for (int k = 0; k < 3; k++)
            ok &= got[0][n * 3 + k] == cv[k * 4 + n] && got[1][n * 3 + k] == dv[k * 4 + n];
    CHECK_MSG(ok, "the weights are not the file's tensors transposed");
    /* many at once, on the caller's thread, as one by one */
    float many[2][12];
    int list[2] = {c, d};
    void *out[2] = {many[0], many[1]};
    CHECK_EQ_INT(weights_source_values_many(&src, &g, list, 2, WEIGHTS_FLOAT, out, NULL, &err),
                 STOF_OK);
    CHECK(memcmp(many, got, sizeof got) == 0);
    char line[1024];
    weights_source_describe(&src, &g, line, sizeof line);
    printf("transposed:\n  %s\n", line);
    CHECK_CONTAINS(line, "weights: 2 tensors from");
    CHECK_CONTAINS(line, ", 2 transposed");
    /* the same math as a kn = true GEMM on the file's tensors as they are */
    weights_source kn_src = {.seed = 1, .weights = f};
    float *want = test_reference(&gkn, &kn_src, &err);
    float *y = test_reference(&g, &src, &err);
    CHECK_MSG(want && y, "%s", err.msg);
    CHECK(want && y && memcmp(want, y, sizeof *y * 8) == 0);
    free(want);
    free(y);
    safetensors_close(f);

    /* without a file the weight is seeded in its declared shape */
    weights_source seeded = weights_source_seeded(3);
    float a[12];
    weights_fill(&g.tensors[c], 3, a);
    CHECK_EQ_INT(weights_source_values(&seeded, &g, c, got[0], &err), STOF_OK);
    CHECK(memcmp(a, got[0], sizeof a) == 0);

    /* the file's tensor in the weight's own shape, or of 3 dims: refused by
     * name, with the shape expected and the one found */
    e[0].shape[0] = 4;
    e[0].shape[1] = 3;
    e[1].ndim = 3;
    e[1].shape[0] = 1;
    e[1].shape[1] = 3;
    e[1].shape[2] = 4;
    CHECK_EQ_INT(safetensors_write(path, e, 3, &err), STOF_OK);
    f = open_ok(path);
    src.weights = f;
    CHECK_EQ_INT(weights_source_check(&src, &g, &err), STOF_ERR_MISMATCH);
    printf("transposed: %s\n", err.msg);
    CHECK_CONTAINS(err.msg, path);
    CHECK_CONTAINS(err.msg, "2 problems");
    CHECK_CONTAINS(err.msg, "tensor 'c.weight' is [4, 3], expected [3, 4] (weight 'c.weight' "
                            "[4, 3] is its transpose)");
    CHECK_CONTAINS(err.msg, "tensor 'd.conv' is [1, 3, 4], expected [3, 4] (weight 'd.weight' "
                            "[4, 3] is its transpose)");
    char want_msg[512];
    snprintf(want_msg, sizeof want_msg, "%s: tensor 'c.weight' is [4, 3], expected [3, 4] "
             "(weight 'c.weight' [4, 3] is its transpose)", path);
    CHECK_EQ_INT(weights_source_values(&src, &g, c, got[0], &err), STOF_ERR_MISMATCH);
    CHECK_MSG(strcmp(err.msg, want_msg) == 0, "%s", err.msg);
    CHECK_EQ_INT(weights_source_values_many(&src, &g, list, 2, WEIGHTS_STORED, out, NULL, &err),
                 STOF_ERR_MISMATCH);
    CHECK_MSG(strcmp(err.msg, want_msg) == 0, "%s", err.msg);
    safetensors_close(f);

    /* a bad value is named at its element in the file's layout: [1][2] of the
     * file is (2, 1) of the weight */
    e[0].shape[0] = 3;
    e[0].shape[1] = 4;
    e[1] = (safetensors_entry){"d.conv", SAFETENSORS_F32, 2, {3, 4}, dv};
    cv[6] = NAN;
    CHECK_EQ_INT(safetensors_write(path, e, 3, &err), STOF_OK);
    f = open_ok(path);
    src.weights = f;
    CHECK_EQ_INT(weights_source_values(&src, &g, c, got[0], &err), STOF_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, "tensor 'c.weight' holds NaN at element 6");
    safetensors_close(f);
    graph_free(&gkn);
    graph_free(&g);
}

/* What once loaded silently wrong: bytes no tensor owns (a header length one
 * short shifts every tensor by a byte), values that are not finite or do
 * not fit the model's dtype; and a FIFO given as the file. */
static void test_silently_wrong(void) {
    const char *p = WORK "st_wrong.safetensors";
    const char *one = "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}  ";
    write_header(p, one, 4);
    safetensors_file *f = NULL;
    stof_error err = {0};
    CHECK_MSG(safetensors_open(p, &f, &err) == STOF_OK, "%s", err.msg);
    safetensors_close(f);
    write_file(p, strlen(one) - 1, one, 4);
    expect_open_error(p, STOF_ERR_FORMAT, "1 bytes after the last tensor's end");
    write_header(p, one, 6);
    expect_open_error(p, STOF_ERR_FORMAT, "is the header length right?");
    write_header(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                    " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}", 12);
    expect_open_error(p, STOF_ERR_FORMAT, "tensor 'b': bytes 4-8 of the data section");
    /* Empty tensors own no bytes and may stand anywhere. */
    write_header(p, "{\"e\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [4, 4]},"
                    " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4);
    CHECK_MSG(safetensors_open(p, &f, &err) == STOF_OK, "%s", err.msg);
    safetensors_close(f);

    const char *fifo = WORK "st_fifo.safetensors";
    remove(fifo);
    CHECK(mkfifo(fifo, 0600) == 0);
    expect_open_error(fifo, STOF_ERR_IO, "a FIFO, not a safetensors file");
    remove(fifo);

    graph g;
    if (build("local m = stof.model{name = 'v', dtype = 'fp16'}\n"
              "local x = m:input('x', {1, 4})\n"
              "m:output(m:add(x, m:weight('w', {1, 4})))\n"
              "return m\n", &g))
        return;
    int w = graph_find_tensor(&g, "w");
    float bad[3][4] = {{0, 1, 2, NAN}, {0, INFINITY, 2, 3}, {0, 1, 1e6f, 3}};
    const char *want[3] = {"tensor 'w' holds NaN at element 3", "holds infinity at element 1",
                           "tensor 'w' holds 1e+06 at element 2, beyond what fp16 can hold"};
    for (int k = 0; k < 3; k++) {
        safetensors_entry e = {"w", SAFETENSORS_F32, 2, {1, 4}, bad[k]};
        CHECK_EQ_INT(safetensors_write(p, &e, 1, &err), STOF_OK);
        f = open_ok(p);
        weights_source src = {.seed = 1, .weights = f};
        float out[4];
        CHECK_EQ_INT(weights_source_values(&src, &g, w, out, &err), STOF_ERR_FORMAT);
        CHECK_CONTAINS(err.msg, want[k]);
        CHECK_CONTAINS(err.msg, p);
        safetensors_close(f);
    }
    /* A file of inputs gives every input and nothing else: an attention_mask
     * the model does not take is not dropped without a word. */
    graph tiny;
    if (build(tiny_model, &tiny) == STOF_OK) {
        int64_t ids[16] = {0}, mask_ones[16] = {1};
        safetensors_entry in[2] = {{"input_ids", SAFETENSORS_I64, 2, {2, 8}, ids},
                                   {"attention_mask", SAFETENSORS_I64, 2, {2, 8}, mask_ones}};
        const char *ip = WORK "st_inputs.safetensors";
        for (int k = 0; k < 2; k++) {
            CHECK_EQ_INT(safetensors_write(ip, in + k, 2 - k, &err), STOF_OK);
            f = open_ok(ip);
            weights_source src = {.seed = 1, .inputs = f};
            CHECK_EQ_INT(weights_source_check(&src, &tiny, &err), STOF_ERR_MISMATCH);
            CHECK_CONTAINS(err.msg, k == 0 ? "tensor 'attention_mask' is not an input of the "
                                             "model (its inputs: input_ids)"
                                           : "input 'input_ids' missing");
            safetensors_close(f);
        }
        graph_free(&tiny);
    }
    /* 65504 is fp16's largest: it loads. */
    float edge[4] = {65504.0f, -65504.0f, 0, 1};
    safetensors_entry e = {"w", SAFETENSORS_F32, 2, {1, 4}, edge};
    CHECK_EQ_INT(safetensors_write(p, &e, 1, &err), STOF_OK);
    f = open_ok(p);
    weights_source src = {.seed = 1, .weights = f};
    float out[4];
    CHECK_MSG(weights_source_values(&src, &g, w, out, &err) == STOF_OK, "%s", err.msg);
    CHECK(out[0] == 65504.0f && out[1] == -65504.0f);
    safetensors_close(f);
    graph_free(&g);
}

/* An attention_mask input: optional (ones when no file gives it), and from
 * a file 0/1 and right-padded, else an error naming the row. */
static void test_attention_mask_input(void) {
    graph g;
    if (build("local m = stof.model{name = 'p', dtype = 'fp16'}\n"
              "local ids = m:input('input_ids', {2, 4}, {dtype = 'int32', high = 10})\n"
              "local am = m:input('attention_mask', {2, 4}, {dtype = 'int32', "
              "attention_mask = true})\n"
              "local x = m:embedding(ids, m:weight('w', {10, 8}))\n"
              "m:output(m:mask_rows(x, am))\n"
              "return m\n", &g))
        return;
    int am = graph_find_tensor(&g, "attention_mask");
    stof_error err = {0};
    float v[8];
    weights_source none = {.seed = 3};
    CHECK_EQ_INT(weights_source_values(&none, &g, am, v, &err), STOF_OK);
    for (int k = 0; k < 8; k++)
        CHECK(v[k] == 1.0f); /* no file: no padding */
    const char *ip = WORK "st_padding.safetensors";
    int64_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t masks[4][8] = {{1, 1, 1, 0, 1, 1, 0, 0},   /* right padding: fine */
                           {1, 1, 1, 1, 0, 0, 0, 0},   /* a row of padding alone: fine */
                           {1, 1, 0, 0, 0, 1, 1, 1},   /* left padding */
                           {1, 1, 2, 0, 1, 1, 1, 1}};  /* not 0/1 */
    const char *want[4] = {NULL, NULL, "row 1 has a token at position 1 after padding at 0",
                           "row 0 holds 2 at position 2"};
    for (int k = 0; k < 4; k++) {
        safetensors_entry in[2] = {{"input_ids", SAFETENSORS_I64, 2, {2, 4}, ids},
                                   {"attention_mask", SAFETENSORS_I64, 2, {2, 4}, masks[k]}};
        CHECK_EQ_INT(safetensors_write(ip, in, 2, &err), STOF_OK);
        safetensors_file *f = open_ok(ip);
        weights_source src = {.seed = 1, .inputs = f};
        int rc = weights_source_check(&src, &g, &err);
        if (!want[k]) {
            CHECK_MSG(rc == STOF_OK, "mask %d: %s", k, err.msg);
            CHECK_EQ_INT(weights_source_values(&src, &g, am, v, &err), STOF_OK);
            for (int i = 0; i < 8; i++)
                CHECK(v[i] == (float)masks[k][i]);
        } else {
            CHECK_MSG(rc != STOF_OK, "mask %d passed", k);
            CHECK_CONTAINS(err.msg, want[k]);
            CHECK_CONTAINS(err.msg, "attention_mask");
        }
        safetensors_close(f);
    }
    /* an inputs file without it: the model runs unpadded */
    safetensors_entry only_ids = {"input_ids", SAFETENSORS_I64, 2, {2, 4}, ids};
    CHECK_EQ_INT(safetensors_write(ip, &only_ids, 1, &err), STOF_OK);
    safetensors_file *f = open_ok(ip);
    weights_source src = {.seed = 1, .inputs = f};
    CHECK_MSG(weights_source_check(&src, &g, &err) == STOF_OK, "%s", err.msg);
    CHECK_EQ_INT(weights_source_values(&src, &g, am, v, &err), STOF_OK);
    CHECK(v[0] == 1.0f && v[7] == 1.0f);
    safetensors_close(f);
    graph_free(&g);
}

int main(void) {
    test_round_trip();
    test_prefix();
    test_malformed();
    test_mutations();
    test_model_from_file();
    test_problems();
    test_sources();
    test_transposed();
    test_silently_wrong();
    test_attention_mask_input();
    return check_summary("test_safetensors");
}
