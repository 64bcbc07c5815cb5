/* Padding-free runs on the GPU (core/exec/exec_pack.h): encoders given padded batches
 * through exec_model_run_io, against the fp32 CPU reference on the same inputs.
 *
 * Models (seeded weights, default scheme): bert-small dense and with BigBird's mask (fp16
 * and bf16), a tiny ModernBERT (rotary, GeGLU, local and global layers, mask_rows) and a tiny
 * Longformer (windows per layer, RoBERTa positions; global tokens at four positions of each
 * sequence, those past its length padding), at batch 4 x seq 256. For each: six
 * batches of fresh random lengths (an empty sequence in each, a whole one in most) packed into
 * 128 to 768 rows, more sizes than the model keeps (four), then the second again (rebuilt,
 * its size replaced meanwhile), and a full batch (no padding: the padded pass).
 *
 * Checked per batch: the pass is packed exactly when packing saves rows, with the tokens and
 * rows of the CPU's map; the output (poisoned first) has no NaN, its real rows are within
 * 1e-2 (fp16; 2e-2 bf16) of the reference and its padded rows exactly zero; a second run
 * gives the same bits; a model made with STOF_PACK=0 (the padded pass) agrees within the
 * same bound. Last, a bad id in a packed batch is an error naming its batch and position.
 *
 * Exit 77 with "SKIPPED: <reason>" when there is no GPU. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpu_open.h"
#include "core/base/error.h"
#include "core/base/util.h"
#include "core/exec/exec.h"
#include "core/exec/exec_pack.h"
#include "core/lua/lua_api.h"
#include "core/ref/ref.h"

#define SCRIPTS STOF_SOURCE_DIR "/scripts/"
#define SEED 3
#define BATCH 4
#define SEQ 256

typedef struct model_case {
    const char *label, *script, *config;
    const char *params[8];
    int n_params;
    double tol;
} model_case;

static const char *const modernbert_config =
    "{\"model_type\": \"modernbert\", \"hidden_size\": 128, \"num_hidden_layers\": 3,"
    " \"num_attention_heads\": 2, \"intermediate_size\": 192, \"vocab_size\": 300,"
    " \"max_position_embeddings\": 512, \"norm_eps\": 1e-5, \"norm_bias\": false,"
    " \"hidden_activation\": \"gelu\", \"global_attn_every_n_layers\": 3,"
    " \"local_attention\": 64, \"global_rope_theta\": 160000.0, \"local_rope_theta\": 10000.0}";

static const char *const longformer_config =
    "{\"model_type\": \"longformer\", \"hidden_size\": 128, \"num_hidden_layers\": 2,"
    " \"num_attention_heads\": 2, \"intermediate_size\": 256, \"vocab_size\": 300,"
    " \"type_vocab_size\": 1, \"max_position_embeddings\": 514, \"pad_token_id\": 1,"
    " \"layer_norm_eps\": 1e-5, \"hidden_act\": \"gelu\", \"attention_window\": [64, 32]}";

static const model_case cases[] = {
    {"bert-small dense fp16", SCRIPTS "bert.lua", NULL,
     {"preset=small", "layers=2", "batch=4", "seq=256", "padding=true", "mask=none",
      "dtype=fp16"}, 7, 1e-2},
    {"bert-small bigbird bf16", SCRIPTS "bert.lua", NULL,
     {"preset=small", "layers=2", "batch=4", "seq=256", "padding=true", "mask=bigbird",
      "dtype=bf16"}, 7, 2e-2},
    {"modernbert-tiny fp16", SCRIPTS "modernbert.lua", modernbert_config,
     {"batch=4", "seq=256", "dtype=fp16"}, 3, 1e-2},
    {"longformer-tiny fp16", SCRIPTS "bert.lua", longformer_config,
     {"batch=4", "seq=256", "dtype=fp16"}, 3, 1e-2},
};

typedef struct device_io {
    const cuda_driver *drv;
    CUstream stream;
    CUdeviceptr ids, pad, out;
    CUdeviceptr global;  /* the global_attention_mask of a model that takes one */
    size_t out_elems;
} device_io;

/* Longformer's global tokens: positions 0, 37, 130 and 255 of every sequence. */
static int32_t global_mask[BATCH * SEQ];

static void fill_global_mask(void) {
    static const int at[] = {0, 37, 130, 255};
    for (int b = 0; b < BATCH; b++)
        for (size_t i = 0; i < sizeof at / sizeof *at; i++)
            global_mask[b * SEQ + at[i]] = 1;
}

/* Which input x is: 1 the ids, 2 the attention_mask, 3 the global mask, 0 another (its
 * init). */
static int input_kind(const graph_tensor *x) {
    return x->role != GRAPH_INPUT ? 0
           : x->init == GRAPH_INIT_PADDING ? 2
           : strcmp(x->name, "input_ids") == 0 ? 1
           : strcmp(x->name, "global_attention_mask") == 0 ? 3 : 0;
}

static int build(const model_case *c, graph *g) {
    stof_error err = {0};
    graph_init(g);
    cJSON *config = c->config ? cJSON_Parse(c->config) : NULL;
    int rc = lua_api_build_config(c->script, c->params, c->n_params, config, g, NULL, &err);
    cJSON_Delete(config);
    CHECK_MSG(rc == STOF_OK, "%s: %s", c->label, err.msg);
    return rc;
}

static exec_plan *default_plan(const graph *g, stof_error *err) {
    exec_seq *seqs;
    int n;
    if (fusion_sequences(g, &seqs, &n, err))
        return NULL;
    fusion_scheme *s = calloc((size_t)n, sizeof *s);
    int rc = STOF_OK;
    for (int i = 0; !rc && i < n; i++)
        if (seqs[i].layer >= 0 && seqs[i].cls == i)
            rc = exec_default_scheme(g, &seqs[i], &s[i], err);
    exec_plan *p = NULL;
    if (!rc)
        exec_plan_create(g, s, &p, err);
    free(s);
    free(seqs);
    return p;
}

/* The CPU reference on these ids and mask (other inputs: their init). */
static int reference(const graph *g, const int32_t *ids, const int32_t *am, float *out) {
    stof_error err = {0};
    ref_values rv;
    weights_source src = weights_source_seeded(SEED);
    int rc = ref_values_init(g, &src, &rv, &err);
    for (int t = 0; !rc && t < g->n_tensors; t++) {
        const graph_tensor *x = &g->tensors[t];
        const int32_t *const values[] = {NULL, ids, am, global_mask};
        const int32_t *v = values[input_kind(x)];
        for (int64_t i = 0; v && i < graph_tensor_numel(x); i++)
            rv.data[t][i] = (float)v[i];
    }
    if (!rc)
        rc = ref_execute(g, &rv, &err);
    if (!rc)
        memcpy(out, rv.data[g->output], sizeof *out * (size_t)graph_tensor_numel(
                                                          &g->tensors[g->output]));
    CHECK_MSG(rc == STOF_OK, "reference: %s", err.msg);
    ref_values_free(&rv);
    return rc;
}

static float half_to_float(stof_dtype dt, uint16_t h) {
    return dt == STOF_BF16 ? util_bf16_to_f32(h) : util_f16_to_f32(h);
}

/* One run on the device: the output's bits into host (poisoned before). */
static int run(exec_model *m, const graph *g, const device_io *d, const int32_t *ids,
               const int32_t *am, uint16_t *host, stof_error *err) {
    const cuda_driver *drv = d->drv;
    exec_io in[8];
    int n = 0;
    for (int t = 0; t < g->n_tensors && n < 8; t++) {
        const graph_tensor *x = &g->tensors[t];
        if (x->role == GRAPH_INPUT)
            in[n++] = (exec_io){.tensor = t,
                                .data = (CUdeviceptr[]){0, d->ids, d->pad, d->global}[
                                    input_kind(x)]};
    }
    const size_t words = sizeof(int32_t) * BATCH * SEQ;
    if (drv->MemcpyHtoD(d->ids, ids, words) || drv->MemcpyHtoD(d->pad, am, words) ||
        drv->MemsetD16Async(d->out, 0x7fff, d->out_elems, d->stream))
        return err_set(err, STOF_ERR_CUDA, "uploads");
    int rc = exec_model_run_io(m, in, n, d->out, d->stream, err);
    if (!rc && (drv->StreamSynchronize(d->stream) ||
                drv->MemcpyDtoH(host, d->out, d->out_elems * 2)))
        rc = err_set(err, STOF_ERR_CUDA, "output");
    return rc;
}

/* Relative error of the real rows, non-finite values, non-zero values at padded rows. */
static void compare(const graph *g, const uint16_t *got, const float *want, const int32_t *am,
                    double *rel, long *nonfinite, long *pad_nonzero) {
    const graph_tensor *out = &g->tensors[g->output];
    const size_t per_row = (size_t)graph_tensor_numel(out) / (BATCH * SEQ);
    double num = 0, den = 0;
    *nonfinite = *pad_nonzero = 0;
    for (size_t r = 0; r < (size_t)BATCH * SEQ; r++)
        for (size_t k = 0; k < per_row; k++) {
            const size_t i = r * per_row + k;
            const float v = half_to_float(out->dtype, got[i]);
            *nonfinite += !isfinite(v);
            if (!am[r]) {
                *pad_nonzero += got[i] != 0;
                continue;
            }
            num += ((double)v - want[i]) * ((double)v - want[i]);
            den += (double)want[i] * want[i];
        }
    *rel = den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Lengths for draw k: 0, the full batch; k >= 1, a random count of tokens that packs into
 * 128 k rows (one bucket more each draw), sequence 1 empty, sequence 0 as long as it can be
 * (whole from k = 3), the rest split at random between sequences 2 and 3. */
static void draw_lengths(int k, int32_t *len) {
    for (int b = 0; b < BATCH; b++)
        len[b] = SEQ;
    if (k == 0)
        return;
    int tokens = 128 * k - 1 - rand() % 100;
    len[0] = tokens < SEQ ? tokens : SEQ;
    len[1] = 0;
    int rest = tokens - len[0], low = rest > SEQ ? rest - SEQ : 0, high = rest < SEQ ? rest : SEQ;
    len[2] = low + rand() % (high - low + 1);
    len[3] = rest - len[2];
}

static void check_batch(const model_case *c, const graph *g, exec_model *m, exec_model *padded,
                        const device_io *d, int k, uint16_t *got, uint16_t *again,
                        uint16_t *plain, float *want) {
    int32_t len[BATCH], ids[BATCH * SEQ], am[BATCH * SEQ];
    draw_lengths(k, len);
    for (int b = 0; b < BATCH; b++)
        for (int j = 0; j < SEQ; j++) {
            am[b * SEQ + j] = j < len[b];
            ids[b * SEQ + j] = j < len[b] ? 2 + rand() % 250 : 1;
        }
    stof_error err = {0};
    int rc = run(m, g, d, ids, am, got, &err);
    CHECK_MSG(rc == STOF_OK, "%s batch %d: %s", c->label, k, err.msg);
    if (rc)
        return;
    exec_pack_map map;
    CHECK(exec_pack_map_build(len, BATCH, SEQ, &map, &err) == STOF_OK);
    int64_t tokens = 0, rows = 0;
    const int packed = exec_model_packing(m, &tokens, &rows);
    const int want_packed = map.rows < BATCH * SEQ;
    CHECK_MSG(packed == want_packed && (!packed || (tokens == map.tokens && rows == map.rows)),
              "%s batch %d: packing %d (%lld tokens in %lld rows), want %d (%lld in %lld)",
              c->label, k, packed, (long long)tokens, (long long)rows, want_packed,
              (long long)map.tokens, (long long)map.rows);
    exec_pack_map_free(&map);
    if (reference(g, ids, am, want))
        return;
    double rel;
    long nonfinite, pad;
    compare(g, got, want, am, &rel, &nonfinite, &pad);
    rc = run(m, g, d, ids, am, again, &err) || run(padded, g, d, ids, am, plain, &err);
    CHECK_MSG(rc == STOF_OK, "%s batch %d again: %s", c->label, k, err.msg);
    int64_t padded_tokens, padded_rows;
    CHECK_MSG(!exec_model_packing(padded, &padded_tokens, &padded_rows), "%s: STOF_PACK=0 "
              "packed", c->label);
    const size_t bytes = d->out_elems * 2;
    const int same = rc == STOF_OK && memcmp(got, again, bytes) == 0;
    double rel_plain = 0;
    long nf_plain = 0, pad_plain = 0;
    if (!rc) {
        /* the padded pass against the packed pass's output as the reference */
        float *as_ref = want;
        for (size_t i = 0; i < d->out_elems; i++)
            as_ref[i] = half_to_float(g->tensors[g->output].dtype, got[i]);
        compare(g, plain, as_ref, am, &rel_plain, &nf_plain, &pad_plain);
    }
    printf("%-26s lengths %3d %3d %3d %3d  %s %5lld tokens in %5lld rows  rel %.2e  padded "
           "pass %.2e  %s\n", c->label, len[0], len[1], len[2], len[3],
           packed ? "packed" : "padded", (long long)tokens, (long long)rows, rel, rel_plain,
           same ? "replay same" : "REPLAY DIFFERS");
    CHECK_MSG(rel < c->tol && nonfinite == 0 && pad == 0 && same && rel_plain < c->tol &&
                  nf_plain == 0 && pad_plain == 0,
              "%s batch %d: rel %g, %ld non-finite, %ld padded non-zero, replay %d, padded "
              "pass rel %g", c->label, k, rel, nonfinite, pad, same, rel_plain);
}

/* A bad id at a real token of a packed batch: the error names its batch and position. */
static void check_bad_id(const model_case *c, const graph *g, exec_model *m,
                         const device_io *d, uint16_t *got) {
    int32_t ids[BATCH * SEQ], am[BATCH * SEQ];
    for (int i = 0; i < BATCH * SEQ; i++) {
        am[i] = i / SEQ != 1 && (i / SEQ != 2 || i % SEQ < 100);
        ids[i] = 5;
    }
    ids[2 * SEQ + 77] = 100000;
    stof_error err = {0};
    int rc = run(m, g, d, ids, am, got, &err);
    int64_t tokens, rows;
    CHECK(exec_model_packing(m, &tokens, &rows) == 1);
    CHECK_MSG(rc == STOF_ERR_INVALID && strstr(err.msg, "batch 2, position 77") &&
                  strstr(err.msg, "100000"),
              "%s: a bad id: %d %s", c->label, rc, err.msg);
    printf("%-26s a bad id in a packed batch: %s\n", c->label, err.msg);
}

static void check_model(exec_ctx *ctx, const model_case *c, const device_io *io) {
    graph g;
    if (build(c, &g))
        return;
    stof_error err = {0};
    exec_plan *p = default_plan(&g, &err);
    CHECK_MSG(p != NULL, "%s: %s", c->label, err.msg);
    exec_model *m = NULL, *padded = NULL;
    weights_source src = weights_source_seeded(SEED);
    int rc = p ? exec_model_create(ctx, p, &src, &m, &err) : STOF_ERR_INVALID;
    CHECK_MSG(rc == STOF_OK, "%s: %s", c->label, err.msg);
    setenv("STOF_PACK", "0", 1);
    if (!rc)
        rc = exec_model_create(ctx, p, &src, &padded, &err);
    unsetenv("STOF_PACK");
    CHECK_MSG(rc == STOF_OK, "%s (padded): %s", c->label, err.msg);
    device_io d = *io;
    d.out_elems = (size_t)graph_tensor_numel(&g.tensors[g.output]);
    uint16_t *got = malloc(d.out_elems * 2), *again = malloc(d.out_elems * 2),
             *plain = malloc(d.out_elems * 2);
    float *want = malloc(sizeof *want * d.out_elems);
    int drv_ok = d.drv->MemAlloc(&d.out, d.out_elems * 2) == CUDA_SUCCESS;
    CHECK(drv_ok);
    /* six sizes (the model keeps four), the second seen again, then the full batch */
    static const int draws[] = {1, 2, 3, 4, 5, 6, 2, 0};
    for (size_t k = 0; !rc && drv_ok && k < sizeof draws / sizeof *draws; k++)
        check_batch(c, &g, m, padded, &d, draws[k], got, again, plain, want);
    if (!rc && drv_ok)
        check_bad_id(c, &g, m, &d, got);
    if (drv_ok)
        d.drv->MemFree(d.out);
    free(got);
    free(again);
    free(plain);
    free(want);
    exec_model_free(m);
    exec_model_free(padded);
    exec_plan_free(p);
    graph_free(&g);
}

int main(void) {
    exec_ctx *ctx = NULL;
    GPU_TEST_OPEN(exec_ctx_create, ctx, "gpu_pack");
    srand(2026u);
    device_io d = {.drv = exec_ctx_driver(ctx)};
    const size_t words = sizeof(int32_t) * BATCH * SEQ;
    CHECK(d.drv->StreamCreate(&d.stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CHECK(d.drv->MemAlloc(&d.ids, words) == CUDA_SUCCESS);
    CHECK(d.drv->MemAlloc(&d.pad, words) == CUDA_SUCCESS);
    fill_global_mask();
    CHECK(d.drv->MemAlloc(&d.global, words) == CUDA_SUCCESS);
    CHECK(d.drv->MemcpyHtoD(d.global, global_mask, words) == CUDA_SUCCESS);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        check_model(ctx, &cases[i], &d);
    d.drv->MemFree(d.ids);
    d.drv->MemFree(d.pad);
    d.drv->MemFree(d.global);
    d.drv->StreamDestroy(d.stream);
    exec_ctx_free(ctx);
    return check_summary("gpu_pack");
}
