/* The argument block of the decode-step attention kernels (attention_decode.cu), shared by
 * the host (core/exec/attention/mha_decode.c) and the kernels, passed by value: fixed-width
 * types, 8-byte fields first, then an even count of 4-byte ones; STOF_DECODE_ARGS_BYTES is
 * checked on both sides.
 *
 * A decode step attends one new token a sequence against its layer's KV cache: sequence b's
 * token sits at position p = positions[b]; the keys it may see are j in
 * [max(0, p - cap + 1), p] that row p of the mask allows (mask NULL: all of them), key j in
 * cache slot j % cap: k_cache + ((b * cap + j % cap) * kv_heads + kvh) * HEAD_DIM, kvh = h /
 * (heads / kv_heads), likewise v_cache. The new token's Q, K and V are its row of qkv
 * (Q | K | V: heads, kv_heads and kv_heads heads of HEAD_DIM): its K and V are read from
 * there and written to slot p % cap, whose old key (p - cap) no query of this step can see.
 * O is [batch, heads * HEAD_DIM]. A build with ROTARY (a rotary op fused in front) first
 * rotates the new token's Q and K heads as that op does, by r = rotary_positions[b] (pairs (j,
 * j + HEAD_DIM / 2) by r theta^(-2j / HEAD_DIM), rounded to the dtype): the cache holds the
 * rotated key.
 *
 * The decode kernel reads positions, rotary_positions and the cache's older keys before it
 * waits for the kernel ahead of it (a programmatic dependent launch): no kernel of the same
 * chain may write them, as holds for a decode step, whose positions are copied in before its
 * graph or moved on by the step before (its token kernel, a graph earlier) and whose cache
 * only this kernel writes, one launch (graph) a step.
 *
 * A CTA serves GROUP query heads (the build's) of one K/V head: grid x is heads / GROUP, CTA x
 * the heads GROUP x .. GROUP x + GROUP - 1, and GROUP divides heads / kv_heads. With all of a
 * K/V head's query heads each key is read once for all of them; with fewer, each of the K/V
 * head's CTAs reads its keys (for grids with fewer CTAs than SMs, where a CTA's chain of work
 * is the step's time). Split keys (flash-decoding): the grid's z splits a sequence's keys into `splits` chunks of
 * `chunk` keys; with splits > 1 each writes its unnormalized fp32 partial O and (m, l) --
 * running maximum in base 2 (-inf for none) and sum -- to
 *   partial_o + ((b * heads + h) * splits + z) * HEAD_DIM, partial_ml + (...) * 2,
 * and stof_attention_decode_combine (grid (heads, batch)) merges them into O.
 *
 * The prefill's store (stof_kv_cache_store, grid (seq, batch)): the K and V of positions
 * [max(0, len - cap), len) of each sequence of a prefill's qkv [batch, seq, width] into their
 * slots, len the sequence's length (its attention_mask row's ones, right padded; pad_mask NULL:
 * seq). */
#ifndef STOF_KERNELS_ATTENTION_DECODE_ABI_CUH
#define STOF_KERNELS_ATTENTION_DECODE_ABI_CUH

#include "attention_abi.cuh" /* stof_i32, stof_i64, stof_u64, STOF_ABI_STATIC_ASSERT */

typedef struct stof_decode_args {
    const void *qkv;
    const stof_i32 *positions;  /* [batch] */
    void *k_cache, *v_cache;
    void *o;
    const stof_u64 *mask;       /* [mask_batch][context][words] bits, or NULL */
    float *partial_o, *partial_ml;
    const stof_i32 *pad_mask;   /* the store's attention_mask [batch, seq], or NULL */
    const stof_i32 *rotary_positions; /* ROTARY builds: the rotary op's positions [batch] */
    double theta;               /* ROTARY builds: the rotary op's base */
    stof_i64 qkv_row_stride;    /* elements from one row of qkv to the next */
    stof_i32 heads, kv_heads, cap, context;
    stof_i32 words, mask_batch, splits, chunk;
    stof_i32 seq;               /* the store's prefill length */
    float scale_log2;           /* scale * log2(e) */
} stof_decode_args;

#define STOF_DECODE_ARGS_BYTES (12 * 8 + 10 * 4)
STOF_ABI_STATIC_ASSERT(sizeof(stof_decode_args) == STOF_DECODE_ARGS_BYTES,
                       "stof_decode_args layout changed: host and kernels must agree");

#define STOF_DECODE_KERNEL "stof_attention_decode"
#define STOF_DECODE_COMBINE_KERNEL "stof_attention_decode_combine"
#define STOF_KV_STORE_KERNEL "stof_kv_cache_store"
#define STOF_DECODE_WARPS 4 /* warps a CTA by default (DECODE_WARPS: a build's own) */
#define STOF_DECODE_SMEM_LIMIT 49152 /* static shared memory a CTA may hold */
/* A CTA's static shared memory (attention_decode.cu's decode_smem, floats): the group's
 * queries and the new key, then each warp's (m, l) and O of every head of the group. */
#define STOF_DECODE_SMEM_BYTES(warps, group, head_dim)                                         \
    (4 * ((group) * (head_dim) + (head_dim) + 2 * (warps) * (group) +                          \
          (warps) * (group) * (head_dim)))
#define STOF_DECODE_MAX_GROUP 16 /* query heads a CTA (a build for each) */
/* Whether a build of `group` query heads a CTA with heads of head_dim can read V 16 bytes a
 * lane (attention_decode.cu's WIDE_V). */
#define STOF_DECODE_WIDE_V_BUILDS(head_dim, group)                                             \
    (((head_dim) == 32 || (head_dim) == 64 || (head_dim) == 128) && (group) <= 4)

#endif
