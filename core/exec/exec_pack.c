/* Padding-free runs of an encoder: the idea and the CPU half's contract in exec_pack.h.
 *
 * The packed pass reuses the padded pass's memory: each token-wise tensor's packed rows are
 * the first rows of its arena slot, so lifetimes and offsets stay the plan's. What it adds:
 * the packed int32 inputs, the maps (packed <-> padded rows, each sequence's first row) and
 * one buffer in the padded layout for the unpacked output. The attentions keep their kernel
 * plans and read and write the packed rows in place (the ragged layout of
 * kernels/attention_abi.cuh); every other segment gets one for the packed rows
 * (exec_launch_plan_rows).
 *
 * Rows past the tokens (up to the bucket) are computed like the others from an id of 0 and
 * hold finite values, which a TMA attention may load (never weigh) past the last sequence:
 * so before each attention its output's last bucket of rows is zeroed, the rows past the
 * tokens that the attention does not write. */
#include "core/exec/exec_pack.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/exec/exec_impl.h"
#include "ops/ops.h"

/* ---- the CPU half ------------------------------------------------------------------------- */

#define PACK_ROW_QUANTUM 128
#define PACK_BUCKETS 32

int64_t exec_pack_bucket(int64_t padded_rows) {
    int64_t b = (padded_rows + PACK_BUCKETS - 1) / PACK_BUCKETS;
    b = (b + PACK_ROW_QUANTUM - 1) / PACK_ROW_QUANTUM * PACK_ROW_QUANTUM;
    return b < PACK_ROW_QUANTUM ? PACK_ROW_QUANTUM : b;
}

void exec_pack_lengths(const int32_t *att_mask, int batch, int seq, int32_t *lengths) {
    for (int b = 0; b < batch; b++) {
        int32_t n = 0;
        for (int j = 0; j < seq; j++)
            n += att_mask[(int64_t)b * seq + j] != 0;
        lengths[b] = n;
    }
}

void exec_pack_map_free(exec_pack_map *m) {
    free(m->src);
    free(m->dst);
    free(m->pos);
    free(m->valid);
    free(m->start);
    memset(m, 0, sizeof *m);
}

int exec_pack_map_build(const int32_t *lengths, int batch, int seq, exec_pack_map *out,
                        stof_error *err) {
    memset(out, 0, sizeof *out);
    const int64_t padded = (int64_t)batch * seq;
    if (batch < 1 || seq < 1 || padded > INT32_MAX)
        return err_set(err, STOF_ERR_INVALID, "packing %d sequences of %d: the rows must "
                       "number 1 to 2^31 - 1", batch, seq);
    int64_t tokens = 0;
    for (int b = 0; b < batch; b++) {
        if (lengths[b] < 0 || lengths[b] > seq)
            return err_set(err, STOF_ERR_INVALID, "packing: row %d has length %d, outside 0..%d",
                           b, (int)lengths[b], seq);
        tokens += lengths[b];
    }
    const int64_t bucket = exec_pack_bucket(padded);
    int64_t rows = (tokens + bucket - 1) / bucket * bucket;
    rows = rows < bucket ? bucket : rows;
    rows = rows > padded ? padded : rows;
    out->batch = batch;
    out->seq = seq;
    out->tokens = tokens;
    out->rows = rows;
    out->src = err_malloc(sizeof *out->src * (size_t)rows, err);
    out->dst = err_malloc(sizeof *out->dst * (size_t)padded, err);
    out->pos = err_calloc((size_t)rows, sizeof *out->pos, err);
    out->valid = err_calloc((size_t)rows, sizeof *out->valid, err);
    out->start = err_malloc(sizeof *out->start * ((size_t)batch + 1), err);
    if (!out->src || !out->dst || !out->pos || !out->valid || !out->start) {
        exec_pack_map_free(out);
        return STOF_ERR_NOMEM;
    }
    int64_t r = 0;
    for (int b = 0; b < batch; b++) {
        out->start[b] = (int32_t)r;
        for (int j = 0; j < seq; j++) {
            const int64_t at = (int64_t)b * seq + j;
            if (j >= lengths[b]) {
                out->dst[at] = -1;
                continue;
            }
            out->dst[at] = (int32_t)r;
            out->src[r] = (int32_t)at;
            out->pos[r] = j;
            out->valid[r++] = 1;
        }
    }
    out->start[batch] = (int32_t)r;
    for (; r < rows; r++)
        out->src[r] = -1;
    return STOF_OK;
}

static int refuse(char *why, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int refuse(char *why, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (n)
        vsnprintf(why, n, fmt, ap);
    va_end(ap);
    return 0;
}

static int64_t rows_of(const graph_tensor *t) {
    const int64_t last = t->shape[t->ndim - 1];
    return last ? graph_tensor_numel(t) / last : 0;
}

static int64_t row_bytes(const graph_tensor *t) {
    return t->shape[t->ndim - 1] * (int64_t)stof_dtype_size(t->dtype);
}

/* The attention_mask input, or -1 (none, or more than one: *why says which). */
static int find_mask(const graph *g, char *why, size_t n) {
    int pad_in = -1;
    for (int t = 0; t < g->n_tensors; t++) {
        const graph_tensor *x = &g->tensors[t];
        if (x->role != GRAPH_INPUT || x->init != GRAPH_INIT_PADDING)
            continue;
        if (pad_in >= 0 || x->ndim != 2) {
            refuse(why, n, "the attention_mask inputs are not one [B, S]");
            return -1;
        }
        pad_in = t;
    }
    if (pad_in < 0)
        refuse(why, n, "no attention_mask input");
    return pad_in;
}


static int attention_packs(const graph *g, const exec_segment *s, int pad_in, int64_t batch,
                           int64_t seq, char *why, size_t n) {
    const graph_op *op = &g->ops[s->first];
    const op_attention *a = &op->attr.attn;
    if (a->cross || a->decode || a->store)
        return refuse(why, n, "op #%d is a cross-attention or keeps a KV cache", s->first);
    if (!a->padded || op->inputs[1] != pad_in)
        return refuse(why, n, "op #%d's attention does not take the attention_mask", s->first);
    mha_exec_problem p;
    exec_launch_attention_problem(g, s, &p, NULL);
    if (p.batch != batch || p.q_len != seq || p.k_len != seq)
        return refuse(why, n, "op #%d attends (%d, %d x %d), not the mask's (%lld, %lld)",
                      s->first, p.batch, p.q_len, p.k_len, (long long)batch, (long long)seq);
    if (row_bytes(&g->tensors[op->output]) % 4)
        return refuse(why, n, "op #%d's output rows are not whole 4-byte words", s->first);
    return 1;
}

/* A token-wise segment reads the attention_mask only as mask_rows' mask (the packed pass gives
 * it the packed rows' validity), and mask_rows reads no other mask (that one is not packed). */
static int mask_reads_pack(const graph *g, const exec_segment *s, int pad_in, char *why,
                           size_t n) {
    for (int k = s->first; k < s->first + s->n; k++) {
        const graph_op *op = &g->ops[k];
        if (op->kind == OP_MASK_ROWS && op->inputs[1] != pad_in)
            return refuse(why, n, "op #%d zeros rows by another mask than the attention_mask",
                          k);
        for (int i = 0; i < op->n_inputs; i++)
            if (op->inputs[i] == pad_in && !(op->kind == OP_MASK_ROWS && i == 1))
                return refuse(why, n, "op #%d reads the attention_mask as data", k);
    }
    return 1;
}

static int segment_packs(const graph *g, const exec_segment *s, int pad_in, int64_t batch,
                         int64_t seq, char *why, size_t n) {
    if (exec_launch_is_attention(s->tmpl))
        return attention_packs(g, s, pad_in, batch, seq, why, n);
    if (!mask_reads_pack(g, s, pad_in, why, n))
        return 0;
    if ((!exec_launch_is_gemm_family(s->tmpl) && s->tmpl != FUSION_T_CUBLASLT) ||
        s->tmpl == FUSION_T_GEMV)
        return refuse(why, n, "segment #%d runs on %s", s->first,
                      fusion_template_get(s->tmpl)->name);
    gemm_exec_problem p;
    stof_error e;
    if (exec_launch_gemm_problem(g, s, &p, &e))
        return refuse(why, n, "segment #%d: %s", s->first, e.msg);
    if (p.m != batch * seq)
        return refuse(why, n, "segment #%d runs %lld rows, not one a token", s->first,
                      (long long)p.m);
    return 1;
}

int exec_pack_eligible(const exec_plan *p, int *mask_tensor, char *why, size_t n) {
    const graph *g = p->g;
    if (n)
        why[0] = '\0';
    *mask_tensor = -1;
    const int pad_in = find_mask(g, why, n);
    if (pad_in < 0)
        return 0;
    const int64_t batch = g->tensors[pad_in].shape[0], seq = g->tensors[pad_in].shape[1];
    for (int t = 0; t < g->n_tensors; t++) {
        const graph_tensor *x = &g->tensors[t];
        if (t != pad_in && x->role == GRAPH_INPUT &&
            (x->dtype != STOF_I32 || graph_tensor_numel(x) != batch * seq))
            return refuse(why, n, "input '%s' is not int32 [B, S]", x->name);
    }
    const graph_tensor *out = &g->tensors[g->output];
    if (rows_of(out) != batch * seq || row_bytes(out) % 4)
        return refuse(why, n, "the output '%s' is not [B, S, ...] of whole 4-byte words",
                      out->name);
    for (int s = 0; s < p->n_segs; s++)
        if (!segment_packs(g, &p->segs[s], pad_in, batch, seq, why, n))
            return 0;
    *mask_tensor = pad_in;
    return 1;
}

/* ---- the GPU half ------------------------------------------------------------------------ */

#define PACK_VARIANTS 4 /* packed sizes a model keeps, the least recently used replaced */
#define PACK_MAX_INTS 8 /* int32 inputs packed (ids, type ids, position ids) */
#define PACK_THREADS 256 /* kernels/grid_stride.cuh's THREADS, which pack_rows.cu keeps */

/* The packed pass for one number of rows: a kernel plan and binding per segment, a graph. */
typedef struct pack_variant {
    int64_t rows; /* 0: unused */
    exec_seg_rt *rt;
    CUgraph graph;
    CUgraphExec graph_exec;
    uint64_t used;
} pack_variant;

struct exec_pack {
    int mask, batch, seq;
    int n_ints;
    int ints[PACK_MAX_INTS];            /* the int32 inputs [B, S] */
    CUdeviceptr ints_at[PACK_MAX_INTS]; /* each packed */
    CUdeviceptr idx;                    /* one allocation: src, pos, valid, dst, ints, start */
    CUdeviceptr src, pos, valid, dst, start;
    CUdeviceptr unpacked;               /* the output, unpacked to [B, S, ...] */
    CUfunction gather16, gather4;
    int32_t *host_mask, *lengths;
    exec_pack_map map;                  /* the batch last selected */
    pack_variant v[PACK_VARIANTS];
    pack_variant *active;               /* NULL: the padded pass */
    uint64_t clock;
};

static int is_attention(const exec_model *m, int s) {
    return exec_launch_is_attention(m->plan->segs[s].tmpl);
}

/* STOF_PACK=0 turns packing off (the padded pass for every batch). */
static int pack_wanted(void) {
    const char *v = getenv("STOF_PACK");
    return !(v && strcmp(v, "0") == 0);
}

int exec_pack_create(exec_model *m, stof_error *err) {
    int pad_in;
    if (!pack_wanted()) {
        snprintf(m->pack_refused, sizeof m->pack_refused, "STOF_PACK=0");
        return STOF_OK;
    }
    if (!exec_pack_eligible(m->plan, &pad_in, m->pack_refused, sizeof m->pack_refused))
        return STOF_OK;
    const graph *g = m->plan->g;
    exec_pack *pk = err_calloc(1, sizeof *pk, err);
    if (!pk)
        return STOF_ERR_NOMEM;
    pk->mask = pad_in;
    pk->batch = (int)g->tensors[pad_in].shape[0];
    pk->seq = (int)g->tensors[pad_in].shape[1];
    for (int t = 0; t < g->n_tensors; t++)
        if (t != pad_in && g->tensors[t].role == GRAPH_INPUT) {
            if (pk->n_ints == PACK_MAX_INTS) {
                free(pk);
                snprintf(m->pack_refused, sizeof m->pack_refused, "more than %d int32 inputs",
                         PACK_MAX_INTS);
                return STOF_OK;
            }
            pk->ints[pk->n_ints++] = t;
        }
    const size_t padded = (size_t)pk->batch * (size_t)pk->seq;
    pk->host_mask = err_malloc(sizeof *pk->host_mask * padded, err);
    pk->lengths = err_malloc(sizeof *pk->lengths * (size_t)pk->batch, err);
    m->pack = pk;
    return pk->host_mask && pk->lengths ? STOF_OK : STOF_ERR_NOMEM;
}

static void variant_release(exec_model *m, pack_variant *v) {
    const cuda_driver *drv = m->ctx->drv;
    if (v->graph_exec)
        drv->GraphExecDestroy(v->graph_exec);
    if (v->graph)
        drv->GraphDestroy(v->graph);
    for (int s = 0; v->rt && s < m->plan->n_segs; s++)
        if (v->rt[s].owns_kplan)
            v->rt[s].launcher->free_plan(m, v->rt[s].kplan);
    free(v->rt);
    memset(v, 0, sizeof *v);
}

static void pack_device_free(exec_model *m, exec_pack *pk) {
    CUdeviceptr *bufs[2] = {&pk->idx, &pk->unpacked};
    for (int i = 0; i < 2; i++) {
        if (*bufs[i])
            m->ctx->drv->MemFree(*bufs[i]);
        *bufs[i] = 0;
    }
    pk->src = 0; /* not ready */
}

void exec_pack_free(exec_model *m) {
    exec_pack *pk = m->pack;
    if (!pk)
        return;
    for (int i = 0; i < PACK_VARIANTS; i++)
        variant_release(m, &pk->v[i]);
    pack_device_free(m, pk);
    exec_pack_map_free(&pk->map);
    free(pk->host_mask);
    free(pk->lengths);
    free(pk);
    m->pack = NULL;
}

/* A zeroed buffer of the packed pass. */
static int pack_alloc(exec_model *m, CUdeviceptr *d, size_t bytes, const char *what,
                      stof_error *err) {
    const cuda_driver *drv = m->ctx->drv;
    int rc = exec_device_alloc(m->ctx, d, bytes, what, err);
    return rc || !*d ? rc : cuda_check(drv, drv->MemsetD8Async(*d, 0, bytes, m->stream),
                                       "cuMemsetD8Async(padding-free buffers)", err);
}

static int load_kernels(exec_model *m, exec_pack *pk, stof_error *err) {
    static const char *const names[2] = {"stof_rows_gather16", "stof_rows_gather4"};
    CUfunction *fn[2] = {&pk->gather16, &pk->gather4};
    nvrtc_request req = {.source = "pack_rows.cu", .arch = m->ctx->gemm->arch};
    gpu_module *mod;
    /* one module, kept by its request with the first kernel named: the others from it */
    int rc = gpu_ctx_function(m->ctx->gemm, &req, names[0], 0, &mod, err);
    for (int i = 0; !rc && i < 2; i++)
        rc = cuda_check(m->ctx->drv, m->ctx->drv->ModuleGetFunction(fn[i], mod->module,
                                                                   names[i]),
                        "cuModuleGetFunction(pack_rows.cu)", err);
    return rc;
}

/* The maps, packed inputs and the unpacked output: made by the first padded batch. */
static int pack_device(exec_model *m, exec_pack *pk, stof_error *err) {
    if (pk->src)
        return STOF_OK;
    const size_t padded = (size_t)pk->batch * (size_t)pk->seq;
    const graph *g = m->plan->g;
    int rc = pack_alloc(m, &pk->idx,
                        sizeof(int32_t) * (padded * (4 + (size_t)pk->n_ints) + pk->batch + 1),
                        "padding-free runs: the row maps", err);
    if (!rc)
        rc = pack_alloc(m, &pk->unpacked, padded * (size_t)row_bytes(&g->tensors[g->output]),
                        "padding-free runs: the unpacked output", err);
    if (!rc)
        rc = load_kernels(m, pk, err);
    if (rc) {
        pack_device_free(m, pk);
        return rc;
    }
    const size_t words = sizeof(int32_t) * padded;
    pk->src = pk->idx;
    pk->pos = pk->src + words;
    pk->valid = pk->pos + words;
    pk->dst = pk->valid + words;
    for (int i = 0; i < pk->n_ints; i++)
        pk->ints_at[i] = pk->dst + words * (size_t)(1 + i);
    pk->start = pk->dst + words * (size_t)(1 + pk->n_ints);
    return STOF_OK;
}

/* The packed copy of int input at device address at, or at when it is none of them. */
static CUdeviceptr packed_int(const exec_model *m, const exec_pack *pk, CUdeviceptr at) {
    for (int i = 0; at && i < pk->n_ints; i++)
        if (m->ptr[pk->ints[i]] == at)
            return pk->ints_at[i];
    return at;
}

/* Segment s's binding for packed rows: inputs packed, positions from the map. */
static void rebind(const exec_model *m, const exec_pack *pk, const exec_segment *sg,
                   exec_seg_rt *r) {
    switch (sg->tmpl) {
    case FUSION_T_EMBEDDING:
        r->t.embed.ids = packed_int(m, pk, r->t.embed.ids);
        r->t.embed.type_ids = packed_int(m, pk, r->t.embed.type_ids);
        r->t.embed.pos_ids = r->t.embed.pos_ids ? packed_int(m, pk, r->t.embed.pos_ids)
                                                : pk->pos;
        break;
    case FUSION_T_ROTARY:
        r->t.xy.mask = r->t.xy.mask ? packed_int(m, pk, r->t.xy.mask) : pk->pos;
        break;
    case FUSION_T_MASK_ROWS:
        r->t.xy.mask = pk->valid;
        break;
    default:
        break;
    }
}

/* An attention of the packed pass: the padded pass's kernel plan and tensors (the packed
 * rows are the first rows of each), in the ragged layout. The attention_mask and the global
 * tokens' mask stay padded. */
static void attention_variant(exec_model *m, const exec_pack *pk, int s, int64_t rows,
                              exec_seg_rt *r) {
    *r = m->rt[s];
    r->owns_kplan = 0;
    r->store = NULL;
    mha_exec_tensors_ragged(&r->t.attn, pk->start, rows);
}

static int variant_build(exec_model *m, exec_pack *pk, pack_variant *v, int64_t rows,
                         stof_error *err) {
    const exec_plan *p = m->plan;
    v->rows = rows;
    v->rt = err_calloc((size_t)p->n_segs, sizeof *v->rt, err);
    if (!v->rt)
        return STOF_ERR_NOMEM;
    char name[256];
    for (int s = 0; s < p->n_segs; s++) {
        const exec_segment *sg = &p->segs[s];
        exec_seg_rt *r = &v->rt[s];
        if (is_attention(m, s)) {
            attention_variant(m, pk, s, rows, r);
            continue;
        }
        r->launcher = m->rt[s].launcher;
        int twin = exec_segment_twin(p, s), rc;
        if (twin >= 0) {
            r->kplan = v->rt[twin].kplan;
            rc = STOF_OK;
        } else {
            rc = exec_launch_plan_rows(m, sg, rows, &r->kplan, err);
            r->owns_kplan = r->kplan != NULL;
        }
        if (!rc)
            rc = r->launcher->bind(m, sg, r, err);
        if (rc)
            return err_prefix(err, "the packed pass of %lld rows, %s: ", (long long)rows,
                              exec_segment_name(p->g, sg->first, sg->n, name, sizeof name));
        rebind(m, pk, sg, r);
    }
    return STOF_OK;
}

/* The variant for rows: kept, or made in place of the least recently used. */
static int variant_for(exec_model *m, exec_pack *pk, int64_t rows, pack_variant **out,
                       stof_error *err) {
    pack_variant *pick = &pk->v[0];
    for (int i = 0; i < PACK_VARIANTS; i++) {
        if (pk->v[i].rows == rows) {
            *out = &pk->v[i];
            return STOF_OK;
        }
        if (pk->v[i].used < pick->used)
            pick = &pk->v[i];
    }
    variant_release(m, pick);
    int rc = variant_build(m, pk, pick, rows, err);
    /* the plans' uploads from pageable memory (an embedding's zeroed error flag) may still be
     * in flight, and the model's stream does not wait for the legacy stream */
    if (!rc)
        rc = cuda_check(m->ctx->drv, m->ctx->drv->CtxSynchronize(NULL), "cuCtxSynchronize",
                        err);
    if (rc) {
        variant_release(m, pick);
        return rc;
    }
    *out = pick;
    return STOF_OK;
}

static int upload_maps(exec_model *m, exec_pack *pk, stof_error *err) {
    const cuda_driver *drv = m->ctx->drv;
    const exec_pack_map *map = &pk->map;
    const size_t rows = sizeof(int32_t) * (size_t)map->rows;
    struct {
        CUdeviceptr to;
        const void *from;
        size_t bytes;
    } parts[5] = {{pk->src, map->src, rows}, {pk->pos, map->pos, rows},
                  {pk->valid, map->valid, rows},
                  {pk->dst, map->dst, sizeof(int32_t) * (size_t)pk->batch * (size_t)pk->seq},
                  {pk->start, map->start, sizeof(int32_t) * ((size_t)pk->batch + 1)}};
    int rc = STOF_OK;
    for (int i = 0; !rc && i < 5; i++)
        rc = cuda_check(drv, drv->MemcpyHtoDAsync(parts[i].to, parts[i].from, parts[i].bytes,
                                                  m->stream),
                        "cuMemcpyHtoDAsync(padding-free row maps)", err);
    return rc;
}

int exec_pack_select(exec_model *m, stof_error *err) {
    exec_pack *pk = m->pack;
    if (!pk)
        return STOF_OK;
    pk->active = NULL;
    const cuda_driver *drv = m->ctx->drv;
    /* the host arrays of the last batch may still be read by its uploads */
    int rc = cuda_check(drv, drv->StreamSynchronize(m->stream), "cuStreamSynchronize", err);
    if (!rc)
        rc = exec_read_input_mask(m, pk->mask, pk->host_mask, err);
    if (rc)
        return rc;
    exec_pack_lengths(pk->host_mask, pk->batch, pk->seq, pk->lengths);
    exec_pack_map_free(&pk->map);
    rc = exec_pack_map_build(pk->lengths, pk->batch, pk->seq, &pk->map, err);
    if (rc || pk->map.rows >= (int64_t)pk->batch * pk->seq)
        return rc; /* nothing to save: the padded pass */
    pack_variant *v = NULL;
    stof_error why = {0};
    rc = pack_device(m, pk, &why);
    if (!rc)
        rc = variant_for(m, pk, pk->map.rows, &v, &why);
    if (!rc)
        rc = upload_maps(m, pk, &why);
    if (rc) {
        /* the padded pass runs this batch; stof run says why (exec_model_pack_refused) */
        snprintf(m->pack_refused, sizeof m->pack_refused, "the packed pass of %lld rows could "
                 "not be made: %s", (long long)pk->map.rows, why.msg);
        return cuda_check(drv, drv->StreamSynchronize(m->stream), "cuStreamSynchronize", err);
    }
    v->used = ++pk->clock;
    pk->active = v;
    m->pack_refused[0] = '\0';
    return STOF_OK;
}

void exec_pack_off(exec_model *m) {
    if (m->pack)
        m->pack->active = NULL;
}

int exec_pack_active(const exec_model *m) {
    return m->pack && m->pack->active;
}

/* Rows gathered by an index (kernels/pack_rows.cu): out[r] = in[idx[r]] (zeros where idx[r]
 * < 0), r < rows, rows of row_bytes. */
static int gather_rows(exec_model *m, CUdeviceptr out, CUdeviceptr in, CUdeviceptr idx,
                       int64_t rows, int64_t row_bytes, CUstream st, stof_error *err) {
    const exec_pack *pk = m->pack;
    const int wide = row_bytes % 16 == 0 && out % 16 == 0 && in % 16 == 0;
    CUfunction f = wide ? pk->gather16 : pk->gather4;
    long long n = rows;
    int units = (int)(row_bytes / (wide ? 16 : 4));
    void *params[] = {&out, &in, &idx, &n, &units};
    const unsigned grid[3] = {gemm_grid_stride_blocks(m->ctx->gemm, rows * units, PACK_THREADS),
                              1, 1},
                   block[3] = {PACK_THREADS, 1, 1};
    return cuda_launch(m->ctx->drv, f, grid, block, 0, st, params, m->ctx->gemm->pdl,
                       "cuLaunchKernel(rows gather)", err);
}

/* The attention in place, after zeroing its output's last bucket of rows: the ones past the
 * tokens, which it does not write (see the top of the file), lie in it. */
static int launch_attention(exec_model *m, int s, const exec_seg_rt *r, CUstream st,
                            stof_error *err) {
    const exec_pack *pk = m->pack;
    const graph *g = m->plan->g;
    const graph_op *op = &g->ops[m->plan->segs[s].first];
    const int64_t rows = pk->active->rows;
    const int64_t bucket = exec_pack_bucket((int64_t)pk->batch * pk->seq);
    const int64_t tail = rows < bucket ? rows : bucket;
    const int64_t bytes = row_bytes(&g->tensors[op->output]);
    const cuda_driver *drv = m->ctx->drv;
    int rc = cuda_check(drv, drv->MemsetD32Async(m->ptr[op->output] +
                                                     (CUdeviceptr)((rows - tail) * bytes),
                                                 0, (size_t)(tail * bytes / 4), st),
                        "cuMemsetD32Async(attention rows past the tokens)", err);
    return rc ? rc : r->launcher->launch(m, r, st, err);
}

int exec_pack_launch(exec_model *m, int s, CUstream st, stof_error *err) {
    exec_pack *pk = m->pack;
    const pack_variant *v = pk->active;
    const graph *g = m->plan->g;
    int rc = STOF_OK;
    for (int i = 0; !rc && s == 0 && i < pk->n_ints; i++)
        rc = gather_rows(m, pk->ints_at[i], m->ptr[pk->ints[i]], pk->src, v->rows, 4, st, err);
    if (!rc)
        rc = is_attention(m, s) ? launch_attention(m, s, &v->rt[s], st, err)
                                : v->rt[s].launcher->launch(m, &v->rt[s], st, err);
    if (!rc && s == m->plan->n_segs - 1)
        rc = gather_rows(m, pk->unpacked, m->ptr[g->output], pk->dst,
                         (int64_t)pk->batch * pk->seq, row_bytes(&g->tensors[g->output]), st,
                         err);
    return rc;
}

int exec_pack_status(exec_model *m, stof_error *err) {
    const pack_variant *v = m->pack->active;
    for (int s = 0; s < m->plan->n_segs; s++) {
        const exec_seg_rt *r = &v->rt[s];
        if (!r->launcher->status || !r->launcher->status(m, r, err))
            continue;
        /* a bad id: the padded segment, run again, names it by batch and position */
        char packed[sizeof err->msg];
        snprintf(packed, sizeof packed, "%s", err ? err->msg : "");
        err_clear(err);
        int rc = m->rt[s].launcher->launch(m, &m->rt[s], m->stream, err);
        if (!rc)
            rc = m->rt[s].launcher->status(m, &m->rt[s], err);
        return rc ? rc : err_set(err, STOF_ERR_INVALID, "packed rows: %s", packed);
    }
    return STOF_OK;
}

void exec_pack_graph_slots(exec_model *m, CUgraph **graph_at, CUgraphExec **exec) {
    pack_variant *v = m->pack ? m->pack->active : NULL;
    *graph_at = v ? &v->graph : &m->graph;
    *exec = v ? &v->graph_exec : &m->graph_exec;
}

CUgraph exec_pack_captured(const exec_model *m) {
    return exec_pack_active(m) ? m->pack->active->graph : m->graph;
}

CUdeviceptr exec_pack_output(const exec_model *m) {
    return exec_pack_active(m) ? m->pack->unpacked : m->ptr[m->plan->g->output];
}

int exec_model_packing(const exec_model *m, int64_t *tokens, int64_t *rows) {
    const int on = exec_pack_active(m);
    *tokens = on ? m->pack->map.tokens : 0;
    *rows = on ? m->pack->active->rows : 0;
    return on;
}

const char *exec_model_pack_refused(const exec_model *m) {
    return m->pack_refused;
}
