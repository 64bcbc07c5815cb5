/* Masked multi-head attention: shape rules, cost (counted over the allowed
 * (query, key) pairs) and the fp32 reference, plus T5's relative position
 * buckets.
 *
 * Q, K and V are read in place with strides: self-attention from the QKV
 * GEMM's output [B, S, Q | K | V] (H, KVH and KVH heads of D), cross-attention
 * from q [B, Sq, H, D] and kv [B, Sk, 2, KVH, D]. With KVH < H (grouped-query
 * attention) query head h reads K/V head h / (H / KVH). The output is [B, Sq, H*D], ready for the output
 * projection. A pair (i, j) is allowed when the mask allows it and, when
 * causal, j <= i + (Sk - Sq) (the last query sees every key). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "ops/mask.h"
#include "ops/kv_cache.h"
#include "ops/ops_impl.h"

/* ---- T5 relative position buckets ---------------------------------------- */

/* The bucket of a distance past the exactly bucketed ones, spaced
 * logarithmically up to max_distance. As in Hugging Face's
 * _relative_position_bucket: log(rp / max_exact) in float32 (torch.log on a
 * float tensor), log(max_distance / max_exact) in double (math.log), the rest
 * in float32, truncated. */
static int log_spaced_bucket(int64_t rp, int max_exact, int num_buckets, int max_distance) {
    float ratio = logf((float)rp / (float)max_exact);
    float span = (float)log((double)max_distance / (double)max_exact);
    float scaled = ratio / span * (float)(num_buckets - max_exact);
    int last = num_buckets - 1;
    /* Parameters ops_attention_infer rejects (max_distance <= max_exact) would
     * give NaN or negative values here; keep the conversion defined. */
    if (isnan(scaled) || scaled >= (float)last)
        return last;
    if (scaled < 0.0f)
        scaled = 0.0f;
    int bucket = max_exact + (int)scaled;
    return bucket < last ? bucket : last;
}

int op_relpos_bucket(int relative_position, int bidirectional, int num_buckets,
                     int max_distance) {
    int64_t rp = relative_position; /* 64 bits: negating INT_MIN stays defined */
    int bucket = 0;
    if (bidirectional) {
        num_buckets /= 2;
        if (rp > 0)
            bucket += num_buckets;
        rp = rp < 0 ? -rp : rp;
    } else {
        rp = rp < 0 ? -rp : 0; /* a decoder only looks back */
    }
    int max_exact = num_buckets / 2;
    if (rp < max_exact)
        return bucket + (int)rp;
    return bucket + log_spaced_bucket(rp, max_exact, num_buckets, max_distance);
}

/* ---- shapes -------------------------------------------------------------- */

typedef struct attn_geom {
    int64_t batch, sq, sk, heads, dim;
} attn_geom;

static int expected_inputs(const op_attention *a) {
    return (a->cross ? 2 : 1) + (a->padded ? 1 : 0) + (a->relpos ? 1 : 0) + (a->decode ? 3 : 0) +
           (a->store ? 2 : 0) + (a->global_keys ? 1 + (a->global_qkv ? 1 : 0) : 0);
}

/* Valid once ops_attention_infer has checked the input shapes. */
static attn_geom attn_geometry(const graph *g, const graph_op *op) {
    const op_attention *a = &op->attr.attn;
    const graph_tensor *q = ops_input(g, op, 0);
    attn_geom geo = {q->shape[0], q->shape[1], q->shape[1], a->heads, a->head_dim};
    if (a->cross)
        geo.sk = ops_input(g, op, 1)->shape[1];
    return geo;
}

static int check_attrs(const graph_op *op, stof_error *err) {
    const op_attention *a = &op->attr.attn;
    if (a->heads < 1 || a->head_dim < 1)
        return ops_fail(op, err, STOF_ERR_INVALID,
                        "heads and head_dim must be positive, got heads = %d, head_dim = %d",
                        a->heads, a->head_dim);
    /* T5 uses scale 1.0, so any positive finite scale is fine. */
    int kvh = op_attention_kv_heads(a);
    if (a->kv_heads < 0 || a->heads % kvh)
        return ops_fail(op, err, STOF_ERR_INVALID,
                        "kv_heads must divide heads (grouped-query attention), got heads = %d, "
                        "kv_heads = %d", a->heads, a->kv_heads);
    if (!isfinite(a->scale) || a->scale <= 0.0f)
        return ops_fail(op, err, STOF_ERR_INVALID, "scale must be positive and finite, got %g",
                        (double)a->scale);
    if (a->decode && (a->cross || a->relpos || a->padded || !a->causal))
        return ops_fail(op, err, STOF_ERR_UNSUPPORTED, "a decode step is causal self-attention "
                        "without relpos or padding");
    if (a->store && (a->cross || a->relpos || a->decode || !a->causal))
        return ops_fail(op, err, STOF_ERR_UNSUPPORTED, "a KV-cache store is a causal "
                        "self-attention's, without relpos");
    if ((a->global_keys || a->global_qkv) &&
        (a->cross || a->causal || a->relpos || a->decode || a->store || !a->global_keys))
        return ops_fail(op, err, STOF_ERR_UNSUPPORTED, "global tokens are an encoder's: "
                        "self-attention with a global_mask, not causal, without relpos or a "
                        "KV cache");
    if (op->n_inputs == expected_inputs(a))
        return STOF_OK;
    if (a->relpos && op->n_inputs == expected_inputs(a) - 1)
        return ops_fail(op, err, STOF_ERR_INVALID,
                        "relpos is set but the relative position table input is missing "
                        "(expected %d inputs, got %d)",
                        expected_inputs(a), op->n_inputs);
    return ops_fail(op, err, STOF_ERR_INVALID, "%s-attention%s takes %d input%s (%s%s%s%s%s), "
                    "got %d", a->cross ? "cross" : "self", a->relpos ? " with relpos" : "",
                    expected_inputs(a), expected_inputs(a) == 1 ? "" : "s",
                    a->cross ? "q, kv" : "qkv", a->padded ? ", attention_mask" : "",
                    a->global_keys ? ", global_mask" : "", a->global_qkv ? ", global_qkv" : "",
                    a->relpos ? ", relpos table" : "", op->n_inputs);
}

/* t is [B, S, (q_parts H + kv_parts KVH) D]. */
static int check_packed(const graph_op *op, const graph_tensor *t, const char *role, int q_parts,
                        int kv_parts, stof_error *err) {
    const op_attention *a = &op->attr.attn;
    int rc;
    if ((rc = ops_require_float(op, t, role, err)) ||
        (rc = ops_require_rank(op, t, role, 3, 3, err)))
        return rc;
    int kvh = op_attention_kv_heads(a);
    int64_t want = ((int64_t)q_parts * a->heads + (int64_t)kv_parts * kvh) * a->head_dim;
    if (ops_last_dim(t) == want)
        return STOF_OK;
    static const char *const mha_rule[] = {"", "H x D = ", "2 x H x D = ", "3 x H x D = "};
    char ts[OPS_TENSOR_STR_MAX], heads[64];
    const char *rule = mha_rule[q_parts + kv_parts];
    if (kvh == a->heads) {
        snprintf(heads, sizeof heads, "%d heads", a->heads);
    } else {
        snprintf(heads, sizeof heads, "%d query and %d K/V heads", a->heads, kvh);
        rule = q_parts ? (kv_parts ? "(H + 2 KVH) x D = " : "H x D = ") : "2 x KVH x D = ";
    }
    return ops_fail(op, err, STOF_ERR_SHAPE, "%s %s has %lld features but %s of dim %d need %s%lld",
                    role, ops_tensor_str(t, ts, sizeof ts), (long long)ops_last_dim(t), heads,
                    a->head_dim, q_parts + kv_parts == 1 ? "" : rule, (long long)want);
}

static int check_cross_pair(const graph_op *op, const graph_tensor *q, const graph_tensor *kv,
                            stof_error *err) {
    int rc;
    if ((rc = check_packed(op, kv, "kv", 0, 2, err)) ||
        (rc = ops_require_same_dtype(op, q, "q", kv, "kv", err)))
        return rc;
    if (q->shape[0] == kv->shape[0])
        return STOF_OK;
    char qs[OPS_TENSOR_STR_MAX], ks[OPS_TENSOR_STR_MAX];
    return ops_fail(op, err, STOF_ERR_SHAPE, "q %s has batch %lld but kv %s has batch %lld",
                    ops_tensor_str(q, qs, sizeof qs), (long long)q->shape[0],
                    ops_tensor_str(kv, ks, sizeof ks), (long long)kv->shape[0]);
}

/* T5 needs max_exact = (buckets, halved when bidirectional) / 2 >= 1 exact
 * buckets, and max_distance beyond them for the log spacing. */
static int check_relpos_attrs(const graph_op *op, stof_error *err) {
    const op_attention *a = &op->attr.attn;
    int per_side = a->relpos_bidirectional ? a->relpos_buckets / 2 : a->relpos_buckets;
    int max_exact = per_side / 2;
    if (max_exact < 1)
        return ops_fail(op, err, STOF_ERR_INVALID,
                        "relpos_buckets must be at least %d for %s buckets, got %d",
                        a->relpos_bidirectional ? 4 : 2,
                        a->relpos_bidirectional ? "bidirectional" : "unidirectional",
                        a->relpos_buckets);
    if (a->relpos_max_distance <= max_exact)
        return ops_fail(op, err, STOF_ERR_INVALID,
                        "relpos_max_distance must exceed the %d exactly bucketed distances, "
                        "got %d",
                        max_exact, a->relpos_max_distance);
    return STOF_OK;
}

static int check_relpos_table(const graph_op *op, const graph_tensor *q,
                              const graph_tensor *table, stof_error *err) {
    const op_attention *a = &op->attr.attn;
    int rc;
    if ((rc = check_relpos_attrs(op, err)) ||
        (rc = ops_require_float(op, table, "relpos table", err)) ||
        (rc = ops_require_same_dtype(op, q, a->cross ? "q" : "qkv", table, "relpos table",
                                     err)) ||
        (rc = ops_require_rank(op, table, "relpos table", 2, 2, err)))
        return rc;
    if (table->shape[0] == a->relpos_buckets && table->shape[1] == a->heads)
        return STOF_OK;
    char ts[OPS_TENSOR_STR_MAX];
    return ops_fail(op, err, STOF_ERR_SHAPE,
                    "relpos table %s must be [%d, %d] (relpos_buckets x heads)",
                    ops_tensor_str(table, ts, sizeof ts), a->relpos_buckets, a->heads);
}

/* The attention_mask of a padded self-attention: int32 [B, S]. */
static int check_padding(const graph_op *op, const graph_tensor *m, const attn_geom *geo,
                         stof_error *err) {
    if (op->attr.attn.cross)
        return ops_fail(op, err, STOF_ERR_INVALID, "padding applies to self-attention only");
    if (m->dtype == STOF_I32 && m->ndim == 2 && m->shape[0] == geo->batch &&
        m->shape[1] == geo->sq)
        return STOF_OK;
    char ms[OPS_TENSOR_STR_MAX];
    return ops_fail(op, err, STOF_ERR_SHAPE, "attention_mask %s must be int32 [%lld, %lld] "
                    "(batch, seq)", ops_tensor_str(m, ms, sizeof ms), (long long)geo->batch,
                    (long long)geo->sq);
}

/* The global tokens' inputs: global_mask int32 [B, S], global_qkv shaped as qkv. */
static int check_global(const graph *g, const graph_op *op, const attn_geom *geo,
                        stof_error *err) {
    const op_attention *a = &op->attr.attn;
    const int at = op_attention_global_input(a);
    const graph_tensor *m = ops_input(g, op, at), *qkv = ops_input(g, op, 0);
    char ts[OPS_TENSOR_STR_MAX], qs[OPS_TENSOR_STR_MAX];
    if (m->dtype != STOF_I32 || m->ndim != 2 || m->shape[0] != geo->batch ||
        m->shape[1] != geo->sq)
        return ops_fail(op, err, STOF_ERR_SHAPE, "global_mask %s must be int32 [%lld, %lld] "
                        "(batch, seq)", ops_tensor_str(m, ts, sizeof ts), (long long)geo->batch,
                        (long long)geo->sq);
    if (!a->global_qkv)
        return STOF_OK;
    const graph_tensor *gq = ops_input(g, op, at + 1);
    if (gq->dtype == qkv->dtype && gq->ndim == 3 && gq->shape[0] == qkv->shape[0] &&
        gq->shape[1] == qkv->shape[1] && gq->shape[2] == qkv->shape[2])
        return STOF_OK;
    return ops_fail(op, err, STOF_ERR_SHAPE, "global_qkv %s must be shaped as qkv %s",
                    ops_tensor_str(gq, ts, sizeof ts), ops_tensor_str(qkv, qs, sizeof qs));
}

/* The K or V cache of a decode step: [B, cap, KVH, D] in the model's dtype. */
static int check_cache(const graph_op *op, const graph_tensor *qkv, const graph_tensor *c,
                       const char *role, const attn_geom *geo, stof_error *err) {
    const op_attention *a = &op->attr.attn;
    char cs[OPS_TENSOR_STR_MAX];
    if (c->dtype == qkv->dtype && c->ndim == 4 && c->shape[0] == geo->batch &&
        c->shape[1] >= 1 && c->shape[2] == op_attention_kv_heads(a) &&
        c->shape[3] == a->head_dim)
        return STOF_OK;
    return ops_fail(op, err, STOF_ERR_SHAPE, "%s %s must be %s [%lld, slots, %d, %d]", role,
                    ops_tensor_str(c, cs, sizeof cs), stof_dtype_name(qkv->dtype),
                    (long long)geo->batch, op_attention_kv_heads(a), a->head_dim);
}

/* A K and a V cache of as many slots. */
static int check_caches(const graph_op *op, const graph_tensor *qkv, const graph_tensor *k,
                        const graph_tensor *v, const attn_geom *geo, stof_error *err) {
    int rc;
    if ((rc = check_cache(op, qkv, k, "k_cache", geo, err)) ||
        (rc = check_cache(op, qkv, v, "v_cache", geo, err)))
        return rc;
    if (k->shape[1] != v->shape[1])
        return ops_fail(op, err, STOF_ERR_SHAPE, "k_cache has %lld slots, v_cache %lld",
                        (long long)k->shape[1], (long long)v->shape[1]);
    return STOF_OK;
}

/* A decode step: one query a sequence, its position, int32 [B, 1], its K and V caches. */
static int check_decode(const graph *g, const graph_op *op, const attn_geom *geo,
                        stof_error *err) {
    const graph_tensor *qkv = ops_input(g, op, 0), *pos = ops_input(g, op, 1);
    const graph_tensor *k = ops_input(g, op, 2), *v = ops_input(g, op, 3);
    char ps[OPS_TENSOR_STR_MAX];
    if (geo->sq != 1)
        return ops_fail(op, err, STOF_ERR_SHAPE, "a decode step has one query a sequence, "
                        "not %lld", (long long)geo->sq);
    if (pos->dtype != STOF_I32 || pos->ndim != 2 || pos->shape[0] != geo->batch ||
        pos->shape[1] != 1)
        return ops_fail(op, err, STOF_ERR_SHAPE, "positions %s must be int32 [%lld, 1]",
                        ops_tensor_str(pos, ps, sizeof ps), (long long)geo->batch);
    return check_caches(op, qkv, k, v, geo, err);
}

/* A prefill's store: its K and V caches, the last two inputs. */
static int check_store(const graph *g, const graph_op *op, const attn_geom *geo,
                       stof_error *err) {
    return check_caches(op, ops_input(g, op, 0), ops_input(g, op, op->n_inputs - 2),
                        ops_input(g, op, op->n_inputs - 1), geo, err);
}

static int check_mask(const graph *g, const graph_op *op, const attn_geom *geo,
                      stof_error *err) {
    int id = op->attr.attn.mask;
    if (id < 0)
        return STOF_OK;
    if (id >= g->n_masks)
        return ops_fail(op, err, STOF_ERR_INVALID, "mask %d does not exist (the graph has %d)",
                        id, g->n_masks);
    const mask *m = g->masks[id];
    const char *desc = m->desc ? m->desc : "?";
    if (op->attr.attn.decode && m->q_len != m->k_len)
        return ops_fail(op, err, STOF_ERR_SHAPE, "mask %d (%s) of a decode step is %d x %d: its "
                        "rows are the positions of a context, so square", id, desc, m->q_len,
                        m->k_len);
    if (!op->attr.attn.decode && (m->q_len != geo->sq || m->k_len != geo->sk))
        return ops_fail(op, err, STOF_ERR_SHAPE,
                        "mask %d (%s) is %d x %d (queries x keys) but the attention has %lld "
                        "queries and %lld keys",
                        id, desc, m->q_len, m->k_len, (long long)geo->sq, (long long)geo->sk);
    if (m->batch != 1 && m->batch != geo->batch)
        return ops_fail(op, err, STOF_ERR_SHAPE,
                        "mask %d (%s) has batch %d but the attention has batch %lld "
                        "(a mask has batch 1, shared, or one per batch)",
                        id, desc, m->batch, (long long)geo->batch);
    if (m->words != (m->k_len + 63) / 64)
        return ops_fail(op, err, STOF_ERR_INTERNAL,
                        "mask %d (%s) has %d words per row for %d keys", id, desc, m->words,
                        m->k_len);
    return STOF_OK;
}

int ops_attention_infer(OPS_INFER_ARGS) {
    const op_attention *a = &op->attr.attn;
    int rc = check_attrs(op, err);
    if (rc)
        return rc;
    const graph_tensor *q = ops_input(g, op, 0);
    if (a->cross) {
        if ((rc = check_packed(op, q, "q", 1, 0, err)) ||
            (rc = check_cross_pair(op, q, ops_input(g, op, 1), err)))
            return rc;
    } else if ((rc = check_packed(op, q, "qkv", 1, 2, err))) {
        return rc;
    }
    if (a->relpos && (rc = check_relpos_table(op, q, ops_input(g, op, op->n_inputs - 1), err)))
        return rc;
    attn_geom geo = attn_geometry(g, op);
    if (a->padded && (rc = check_padding(op, ops_input(g, op, 1), &geo, err)))
        return rc;
    if (a->global_keys && (rc = check_global(g, op, &geo, err)))
        return rc;
    if (a->decode && (rc = check_decode(g, op, &geo, err)))
        return rc;
    if (a->store && (rc = check_store(g, op, &geo, err)))
        return rc;
    if ((rc = check_mask(g, op, &geo, err)))
        return rc;
    out->dtype = q->dtype;
    out->ndim = 3;
    out->shape[0] = geo.batch;
    out->shape[1] = geo.sq;
    out->shape[2] = geo.heads * geo.dim;
    return STOF_OK;
}

/* ---- cost ---------------------------------------------------------------- */

/* Keys query row i may see under the causal rule: j < causal_end. */
static int64_t causal_end(const attn_geom *geo, int64_t i) {
    int64_t end = i + (geo->sk - geo->sq) + 1;
    return end < 0 ? 0 : end > geo->sk ? geo->sk : end;
}

static int64_t key_end(const op_attention *a, const attn_geom *geo, int64_t i) {
    return a->causal ? causal_end(geo, i) : geo->sk;
}

/* Set bits among the first n of row. */
static int64_t count_bits(const uint64_t *row, int64_t n) {
    int64_t count = 0, full = n / 64;
    for (int64_t w = 0; w < full; w++)
        count += __builtin_popcountll(row[w]);
    if (n % 64)
        count += __builtin_popcountll(row[full] & ((1ULL << (n % 64)) - 1));
    return count;
}

/* Allowed (query, key) pairs of one head, summed over the batch. A shared
 * mask is counted once and multiplied by the batch. */
static int64_t allowed_pairs(const graph *g, const graph_op *op, const attn_geom *geo) {
    const op_attention *a = &op->attr.attn;
    const mask *m = a->mask >= 0 ? g->masks[a->mask] : NULL;
    int64_t stored = m ? m->batch : 1, pairs = 0;
    for (int64_t b = 0; b < stored; b++)
        for (int64_t i = 0; i < geo->sq; i++)
            pairs += m ? count_bits(mask_row(m, (int)b, (int)i), key_end(a, geo, i))
                       : key_end(a, geo, i);
    return stored == 1 ? pairs * geo->batch : pairs;
}

void ops_attention_cost(OPS_COST_ARGS) {
    attn_geom geo = attn_geometry(g, op);
    if (op->attr.attn.decode) { /* at most the context's keys a step */
        const mask *m = op->attr.attn.mask >= 0 ? g->masks[op->attr.attn.mask] : NULL;
        *flops = 4.0 * (double)geo.heads * (double)geo.dim * (double)geo.batch *
                 (double)(m ? m->k_len : 1);
        *bytes = ops_io_bytes(g, op);
        return;
    }
    /* Per allowed pair and head: D multiply-adds for q.k and D for p.v. */
    *flops = 4.0 * (double)geo.heads * (double)geo.dim * (double)allowed_pairs(g, op, &geo);
    *bytes = ops_io_bytes(g, op);
}

/* ---- reference ----------------------------------------------------------- */

typedef struct attn_ctx {
    attn_geom geo;
    const op_attention *attr;
    const float *q, *k, *v;      /* head 0 of token 0 of batch 0 */
    int64_t q_stride, kv_stride; /* floats from one token to the next */
    int64_t group;               /* query heads per K/V head */
    const float *table;          /* relpos bias [buckets, H], or NULL */
    const int *bucket;           /* bucket of j - i at bucket[j - i + sq - 1] */
    const mask *m;               /* or NULL */
    const float *padding;        /* the attention_mask [B, S], or NULL */
    const float *global;         /* the global_mask [B, S], or NULL */
    const float *gq, *gk, *gv;   /* the global rows' Q, K, V (global_qkv's, else q, k, v) */
    double *scores;              /* [sk] scratch */
    double *acc;                 /* [dim] scratch */
    int64_t *keys;               /* [sk] scratch: the allowed keys of one query row */
} attn_ctx;

static void locate_inputs(attn_ctx *c, const float *const *in, int n_inputs) {
    int64_t kvh = op_attention_kv_heads(c->attr);
    int64_t hd = c->geo.heads * c->geo.dim, kvd = kvh * c->geo.dim;
    c->group = c->geo.heads / kvh;
    if (c->attr->cross) {
        c->q = in[0];
        c->q_stride = hd;
        c->k = in[1];
        c->v = in[1] + kvd;
        c->kv_stride = 2 * kvd;
    } else {
        c->q = in[0];
        c->k = in[0] + hd;
        c->v = in[0] + hd + kvd;
        c->q_stride = c->kv_stride = hd + 2 * kvd;
    }
    c->table = c->attr->relpos ? in[n_inputs - 1] : NULL;
    c->padding = c->attr->padded ? in[1] : NULL;
    c->global = c->attr->global_keys ? in[op_attention_global_input(c->attr)] : NULL;
    const float *gqkv = c->attr->global_qkv ? in[op_attention_global_input(c->attr) + 1] : NULL;
    c->gq = gqkv ? gqkv : c->q;
    c->gk = gqkv ? gqkv + hd : c->k;
    c->gv = gqkv ? gqkv + hd + kvd : c->v;
}

/* Whether key (or query) j of batch b is a global token: flagged and not padding. */
static int is_global(const attn_ctx *c, int64_t b, int64_t j, int64_t len) {
    return c->global && j < len && c->global[b * c->geo.sq + j] != 0.0f;
}

/* Every relative position j - i in [-(sq - 1), sk - 1] once, rather than a
 * logf per pair. */
static void fill_buckets(const attn_ctx *c, int *bucket) {
    const op_attention *a = c->attr;
    for (int64_t r = -(c->geo.sq - 1); r < c->geo.sk; r++)
        bucket[r + c->geo.sq - 1] = op_relpos_bucket((int)r, a->relpos_bidirectional,
                                                     a->relpos_buckets, a->relpos_max_distance);
}

/* The sequence's length: its attention_mask's ones, else every key. */
static int64_t row_length(const attn_ctx *c, int64_t b) {
    return c->padding ? ops_padding_length(c->padding + b * c->geo.sq, c->geo.sq) : c->geo.sk;
}

/* The keys query row i of batch b may see, in order, into c->keys: its mask's, and every
 * global key; a global query, every key of its sequence. */
static int64_t allowed_keys(const attn_ctx *c, int64_t b, int64_t i) {
    int64_t end = key_end(c->attr, &c->geo, i), len = row_length(c, b);
    if (c->padding) /* keys past the row's length; a padded row sees none (zeros) */
        end = i >= len ? 0 : end < len ? end : len;
    const int all = is_global(c, b, i, len);
    int64_t n = 0;
    for (int64_t j = 0; j < end; j++)
        if (all || !c->m || mask_get(c->m, (int)b, (int)i, (int)j) || is_global(c, b, j, len))
            c->keys[n++] = j;
    return n;
}

static double pair_score(const attn_ctx *c, const float *q, int64_t b, int64_t h, int64_t i,
                         int64_t j) {
    const float *k = c->k + (b * c->geo.sk + j) * c->kv_stride + h / c->group * c->geo.dim;
    double dot = 0.0;
    for (int64_t d = 0; d < c->geo.dim; d++)
        dot += (double)q[d] * k[d];
    double s = c->attr->scale * dot;
    if (c->table)
        s += c->table[(int64_t)c->bucket[j - i + c->geo.sq - 1] * c->geo.heads + h];
    return s;
}

/* One query row of one head over its n allowed keys: exact two-pass
 * softmax, then the weighted sum of their values. No allowed key: zeros. */
static void attend_row(const attn_ctx *c, int64_t b, int64_t h, int64_t i, int64_t n,
                       float *y) {
    const int64_t dim = c->geo.dim;
    const float *q = c->q + (b * c->geo.sq + i) * c->q_stride + h * dim;
    double max = -INFINITY;
    for (int64_t t = 0; t < n; t++) {
        int64_t j = c->keys[t];
        c->scores[j] = pair_score(c, q, b, h, i, j);
        max = c->scores[j] > max ? c->scores[j] : max;
    }
    for (int64_t d = 0; d < dim; d++)
        y[d] = 0.0f;
    if (max == -INFINITY)
        return;
    for (int64_t d = 0; d < dim; d++)
        c->acc[d] = 0.0;
    double sum = 0.0;
    for (int64_t t = 0; t < n; t++) {
        int64_t j = c->keys[t];
        double p = exp(c->scores[j] - max);
        const float *v = c->v + (b * c->geo.sk + j) * c->kv_stride + h / c->group * dim;
        for (int64_t d = 0; d < dim; d++)
            c->acc[d] += p * v[d];
        sum += p;
    }
    for (int64_t d = 0; d < dim; d++)
        y[d] = (float)(c->acc[d] / sum);
}

/* Rows [first, first + n) of the output, a row being one query of one
 * batch over every head. */
static void attend_rows(const attn_ctx *c, int64_t first, int64_t n, float *out) {
    const int64_t hd = c->geo.heads * c->geo.dim;
    for (int64_t r = first; r < first + n; r++) {
        const int64_t b = r / c->geo.sq, i = r % c->geo.sq;
        const int64_t n_keys = allowed_keys(c, b, i);
        attn_ctx gc = *c; /* a global query reads the global rows' projections */
        if (is_global(c, b, i, row_length(c, b))) {
            gc.q = c->gq;
            gc.k = c->gk;
            gc.v = c->gv;
        }
        for (int64_t h = 0; h < c->geo.heads; h++)
            attend_row(&gc, b, h, i, n_keys, out + (r - first) * hd + h * c->geo.dim);
    }
}

int ops_attention_ref_rows(const graph *g, const graph_op *op, const float *const *in,
                           int64_t first, int64_t n, float *out, stof_error *err) {
    attn_ctx c = {.geo = attn_geometry(g, op), .attr = &op->attr.attn};
    if (first < 0 || n < 0 || first + n > c.geo.batch * c.geo.sq)
        return err_set(err, STOF_ERR_INVALID, "attention rows %lld..%lld of %lld",
                       (long long)first, (long long)(first + n),
                       (long long)(c.geo.batch * c.geo.sq));
    locate_inputs(&c, in, op->n_inputs);
    c.m = c.attr->mask >= 0 ? g->masks[c.attr->mask] : NULL;
    double *scores = err_malloc((size_t)c.geo.sk * sizeof *scores, err);
    double *acc = err_malloc((size_t)c.geo.dim * sizeof *acc, err);
    int64_t *keys = err_malloc((size_t)c.geo.sk * sizeof *keys, err);
    int *bucket = c.table ? err_malloc((size_t)(c.geo.sq + c.geo.sk - 1) * sizeof *bucket, err)
                          : NULL;
    int rc = STOF_ERR_NOMEM;
    if (scores && acc && keys && (bucket || !c.table)) {
        if (bucket)
            fill_buckets(&c, bucket);
        c.scores = scores;
        c.acc = acc;
        c.keys = keys;
        c.bucket = bucket;
        attend_rows(&c, first, n, out);
        rc = STOF_OK;
    }
    free(bucket);
    free(keys);
    free(acc);
    free(scores);
    return rc;
}

/* A decode step on the caches its inputs hold: their copy takes the new K and V (the inputs
 * stay as they are), then the step attends (ops_attention_decode_ref). A generation keeps its
 * caches across steps through the executor's hooks instead. */
static int decode_ref(const graph *g, const graph_op *op, const float *const *in, float *out,
                      stof_error *err) {
    const graph_tensor *k = ops_input(g, op, 2);
    const op_attention *a = &op->attr.attn;
    ops_kv_cache c;
    int rc = ops_kv_cache_alloc(&c, k->shape[0], k->shape[1], (int)k->shape[2],
                                (int)k->shape[3], err);
    if (rc)
        return rc;
    size_t n = (size_t)graph_tensor_numel(k);
    memcpy(c.k, in[2], sizeof *c.k * n);
    memcpy(c.v, in[3], sizeof *c.v * n);
    rc = ops_attention_decode_ref(a, a->mask >= 0 ? g->masks[a->mask] : NULL, in[0], in[1], &c,
                                  out, err);
    ops_kv_cache_free(&c);
    if (rc && err)
        err_prefix(err, "attention '%s': ", op->name);
    return rc;
}

int ops_attention_ref(OPS_REF_ARGS) {
    attn_geom geo = attn_geometry(g, op);
    if (op->attr.attn.decode)
        return decode_ref(g, op, in, out, err);
    return ops_attention_ref_rows(g, op, in, 0, geo.batch * geo.sq, out, err);
}
