/* The KV cache and a decode step's attention on the CPU: see kv_cache.h. */
#include "ops/kv_cache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"

/* First allowed key of row i among 0..i, or -1. */
static int64_t first_allowed(const mask *m, int b, int64_t i) {
    const uint64_t *row = mask_row(m, b, (int)i);
    for (int64_t w = 0; w * 64 <= i; w++) {
        uint64_t bits = row[w];
        if (w * 64 + 63 > i) /* keys past i do not count (causal) */
            bits &= (i % 64 == 63) ? ~0ULL : ((1ULL << (i % 64 + 1)) - 1);
        if (bits)
            return w * 64 + __builtin_ctzll(bits);
    }
    return -1;
}

int64_t ops_kv_cache_span(const mask *m, int64_t context) {
    if (!m)
        return context > 0 ? context : 1;
    int64_t span = 1, rows = m->q_len < context ? m->q_len : context;
    for (int b = 0; b < m->batch; b++)
        for (int64_t i = 0; i < rows; i++) {
            int64_t j = first_allowed(m, b, i);
            if (j >= 0 && i - j + 1 > span)
                span = i - j + 1;
        }
    return span;
}

int ops_kv_cache_alloc(ops_kv_cache *c, int64_t batch, int64_t cap, int kv_heads, int head_dim,
                       stof_error *err) {
    memset(c, 0, sizeof *c);
    size_t n = (size_t)batch * (size_t)cap * (size_t)kv_heads * (size_t)head_dim;
    c->k = err_calloc(n ? n : 1, sizeof *c->k, err);
    c->v = err_calloc(n ? n : 1, sizeof *c->v, err);
    if (!c->k || !c->v) {
        ops_kv_cache_free(c);
        return STOF_ERR_NOMEM;
    }
    c->batch = batch;
    c->cap = cap;
    c->kv_heads = kv_heads;
    c->head_dim = head_dim;
    return STOF_OK;
}

void ops_kv_cache_free(ops_kv_cache *c) {
    free(c->k);
    free(c->v);
    memset(c, 0, sizeof *c);
}

static int64_t slot_offset(const ops_kv_cache *c, int64_t b, int64_t pos) {
    return (b * c->cap + pos % c->cap) * c->kv_heads * c->head_dim;
}

/* K and V of one token (its packed qkv row) into the slot of position pos. */
static void store_token(ops_kv_cache *c, int64_t b, int64_t pos, const float *row, int heads) {
    int64_t kvd = (int64_t)c->kv_heads * c->head_dim, at = slot_offset(c, b, pos);
    const float *k = row + (int64_t)heads * c->head_dim;
    memcpy(c->k + at, k, sizeof *k * (size_t)kvd);
    memcpy(c->v + at, k + kvd, sizeof *k * (size_t)kvd);
}

void ops_kv_cache_store_prefix(ops_kv_cache *c, const float *qkv, int64_t seq, int heads,
                               const int64_t *len) {
    int64_t width = ((int64_t)heads + 2 * c->kv_heads) * c->head_dim;
    for (int64_t b = 0; b < c->batch; b++)
        for (int64_t s = len[b] > c->cap ? len[b] - c->cap : 0; s < len[b] && s < seq; s++)
            store_token(c, b, s, qkv + (b * seq + s) * width, heads);
}

/* Softmax over the n scores (keys[t] their positions) and the weighted sum of the values of
 * K/V head kh, into y. */
static void weigh_values(const ops_kv_cache *c, int64_t b, int kh, const int64_t *keys,
                         double *scores, int64_t n, float *y) {
    double max = -INFINITY, sum = 0.0;
    for (int64_t t = 0; t < n; t++)
        max = scores[t] > max ? scores[t] : max;
    for (int d = 0; d < c->head_dim; d++)
        y[d] = 0.0f;
    if (n == 0)
        return;
    double *acc = scores + n; /* head_dim doubles past the scores */
    for (int d = 0; d < c->head_dim; d++)
        acc[d] = 0.0;
    for (int64_t t = 0; t < n; t++) {
        double p = exp(scores[t] - max);
        const float *v = c->v + slot_offset(c, b, keys[t]) + (int64_t)kh * c->head_dim;
        for (int d = 0; d < c->head_dim; d++)
            acc[d] += p * v[d];
        sum += p;
    }
    for (int d = 0; d < c->head_dim; d++)
        y[d] = (float)(acc[d] / sum);
}

/* The keys position pos of sequence b attends, into keys; their count, or -1 when the mask
 * allows one the ring no longer holds. */
static int64_t step_keys(const ops_kv_cache *c, const mask *m, int64_t b, int64_t pos,
                         int64_t *keys) {
    int64_t n = 0, oldest = pos - c->cap + 1;
    for (int64_t j = 0; j <= pos; j++) {
        if (m && !mask_get(m, m->batch == 1 ? 0 : (int)b, (int)pos, (int)j))
            continue;
        if (j < oldest)
            return -1;
        keys[n++] = j;
    }
    return n;
}

static int decode_one(const op_attention *a, const mask *m, const float *row, int64_t b,
                      int64_t pos, ops_kv_cache *c, int64_t *keys, double *scores, float *out,
                      stof_error *err) {
    store_token(c, b, pos, row, a->heads);
    int64_t n = step_keys(c, m, b, pos, keys);
    if (n < 0)
        return err_set(err, STOF_ERR_INTERNAL, "decode step: position %lld attends a key "
                       "older than its cache of %lld slots holds", (long long)pos,
                       (long long)c->cap);
    int group = a->heads / c->kv_heads;
    for (int h = 0; h < a->heads; h++) {
        const float *q = row + (int64_t)h * c->head_dim;
        for (int64_t t = 0; t < n; t++) {
            const float *k =
                c->k + slot_offset(c, b, keys[t]) + (int64_t)(h / group) * c->head_dim;
            double dot = 0.0;
            for (int d = 0; d < c->head_dim; d++)
                dot += (double)q[d] * k[d];
            scores[t] = a->scale * dot;
        }
        weigh_values(c, b, h / group, keys, scores, n, out + (int64_t)h * c->head_dim);
    }
    return STOF_OK;
}

int ops_attention_decode_ref(const op_attention *a, const mask *m, const float *qkv,
                             const float *positions, ops_kv_cache *c, float *out,
                             stof_error *err) {
    int64_t width = ((int64_t)a->heads + 2 * c->kv_heads) * c->head_dim;
    int64_t context = m ? m->q_len : INT32_MAX;
    for (int64_t b = 0; b < c->batch; b++) {
        float p = positions[b];
        if (p != -1.0f && !(p >= 0.0f && p < (float)context && p == floorf(p)))
            return err_set(err, STOF_ERR_INVALID, "decode step: position %g of sequence %lld "
                           "is outside the context of %lld positions (or -1: ended)", (double)p,
                           (long long)b, (long long)context);
    }
    int64_t most = m ? m->k_len : 0;
    for (int64_t b = 0; b < c->batch; b++)
        most = (int64_t)positions[b] + 1 > most ? (int64_t)positions[b] + 1 : most;
    int64_t *keys = err_malloc(sizeof *keys * (size_t)most, err);
    double *scores = err_malloc(sizeof *scores * (size_t)(most + c->head_dim), err);
    int rc = keys && scores ? STOF_OK : STOF_ERR_NOMEM;
    for (int64_t b = 0; b < c->batch && !rc; b++) {
        float *o = out + b * (int64_t)a->heads * c->head_dim;
        if (positions[b] < 0) /* an ended sequence: no attention, its cache as it is */
            memset(o, 0, sizeof *o * (size_t)a->heads * (size_t)c->head_dim);
        else
            rc = decode_one(a, m, qkv + b * width, b, (int64_t)positions[b], c, keys, scores,
                            o, err);
    }
    free(scores);
    free(keys);
    return rc;
}
