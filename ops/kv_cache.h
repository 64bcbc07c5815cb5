/* The KV cache of a decode step's attention, and its fp32 reference.
 *
 * A layer's cache keeps, for each sequence, the keys and values its attention
 * can still see: `cap` slots, key position j in slot j % cap (a ring buffer).
 * cap is the layer's span: the farthest a query looks back under its mask
 * (ops_kv_cache_span), so a sliding window of W keeps W slots, and a dense
 * causal layer the whole context. The decode step writes the new token's K
 * and V into its slot, then attends the allowed keys among the last cap
 * positions. */
#ifndef STOF_OPS_KV_CACHE_H
#define STOF_OPS_KV_CACHE_H

#include <stdint.h>

#include "core/graph/graph.h"
#include "ops/mask.h"
#include "stof.h"

typedef struct ops_kv_cache {
    int64_t batch, cap;    /* sequences; slots per sequence */
    int kv_heads, head_dim;
    float *k, *v;          /* [batch][cap][kv_heads][head_dim] each */
} ops_kv_cache;

/* The slots a causal layer of `context` positions needs under mask m (NULL:
 * dense): 1 + the largest i - j over the allowed pairs (i, j), j <= i; at
 * least 1. */
int64_t ops_kv_cache_span(const mask *m, int64_t context);

/* Allocates a zeroed cache. */
int ops_kv_cache_alloc(ops_kv_cache *c, int64_t batch, int64_t cap, int kv_heads, int head_dim,
                       stof_error *err);
void ops_kv_cache_free(ops_kv_cache *c);

/* Stores the K and V of positions 0 .. len[b] - 1 of each sequence b from a self-attention's
 * packed input qkv [batch, seq, (heads + 2 kv_heads) head_dim] (a prefill's): the last cap of
 * them stay. */
void ops_kv_cache_store_prefix(ops_kv_cache *c, const float *qkv, int64_t seq, int heads,
                               const int64_t *len);

/* One decode step of attention op `op` (attr.decode) against its cache: qkv [batch, 1, W],
 * positions [batch] (as floats, the reference's values), m its mask (context x context, or
 * NULL), out [batch, heads * head_dim]. Position -1 is a sequence that has ended: its
 * output zeros, its cache untouched. Another position past the mask's rows, or a key the
 * mask allows that the ring no longer holds, is an error. */
int ops_attention_decode_ref(const op_attention *a, const mask *m, const float *qkv,
                             const float *positions, ops_kv_cache *c, float *out,
                             stof_error *err);

#endif
