/* The argument block of the global-token kernels (attention_global.cu), shared by the host
 * (C11: core/exec/attention/mha_exec_global.c) and the kernels (CUDA C++ under NVRTC), passed
 * by value: fixed-width types, 8-byte fields first, then an even count of 4-byte ones;
 * STOF_ATTN_GLOBAL_ARGS_BYTES is checked on both sides.
 *
 * A self-attention with global tokens (Longformer's) runs as:
 *   1. the window attention (attention_block.cu / attention_row.cu, -DLSE=1 when the mask
 *      leaves keys out): O and each row's log-sum-exp;
 *   2. stof_attention_global_index, grid (batch): each sequence's global tokens (global_mask
 *      set, position within the attention_mask's length), in order, to
 *      index[b * (q_len + 1)]: their count, then their positions;
 *   3. stof_attention_global_keys, grid (ceil(q_len / STOF_ATTN_GLOBAL_ROWS), heads, batch),
 *      only after a -DLSE=1 window: every other query row also attends the global keys its
 *      mask left out (mask_bits says which it allowed), merged into O through its
 *      log-sum-exp;
 *   4. stof_attention_global_rows, grid (STOF_ATTN_GLOBAL_ROW_BLOCKS, heads, batch),
 *      STOF_ATTN_GLOBAL_ROW_WARPS warps a block: each global query attends every key of its
 *      sequence with gq, gk, gv; a block takes STOF_ATTN_GLOBAL_ROW_GROUP rows at a time, its
 *      warps splitting the keys.
 * q, k, v and gq, gk, gv point at head 0 of row 0 of batch 0 of a [B, S, (H + 2 KVH) D]
 * tensor each (the same strides); o at O [B, S, H D]. In the ragged layout (seq_start set)
 * batch b's rows start at row seq_start[b] of each and the batch strides are 0; index, lse,
 * global_mask and pad_mask keep the padded [batch][q_len] positions. */
#ifndef STOF_KERNELS_ATTENTION_GLOBAL_ABI_CUH
#define STOF_KERNELS_ATTENTION_GLOBAL_ABI_CUH

#include "attention_abi.cuh"

typedef struct stof_attn_global_args {
    const void *q, *k, *v;
    const void *gq, *gk, *gv;
    void *o;
    const float *lse;               /* [batch][heads][q_len], base 2 (attention_abi.cuh) */
    const stof_i32 *pad_mask;       /* the attention_mask [batch][q_len], or NULL */
    const stof_i32 *global_mask;    /* [batch][q_len], nonzero: a global token */
    stof_i32 *index;                /* [batch][q_len + 1], written by step 1 */
    const stof_u64 *mask_bits;      /* the window's mask, [fmt_batch][q_len][words] bits */
    const stof_i32 *seq_start;      /* the ragged layout (attention_abi.cuh), or NULL */
    stof_i64 row_stride, batch_stride;     /* of q, k, v, gq, gk, gv (elements) */
    stof_i64 o_row_stride, o_batch_stride;
    stof_i32 q_len, heads, kv_group, words, fmt_batch;
    float scale_log2;               /* scale * log2(e) */
} stof_attn_global_args;

#define STOF_ATTN_GLOBAL_ARGS_BYTES (17 * 8 + 6 * 4)
STOF_ABI_STATIC_ASSERT(sizeof(stof_attn_global_args) == STOF_ATTN_GLOBAL_ARGS_BYTES,
                       "stof_attn_global_args layout changed: host and kernels must agree");

#define STOF_ATTN_GLOBAL_INDEX_KERNEL "stof_attention_global_index"
#define STOF_ATTN_GLOBAL_KEYS_KERNEL "stof_attention_global_keys"
#define STOF_ATTN_GLOBAL_ROWS_KERNEL "stof_attention_global_rows"
#define STOF_ATTN_GLOBAL_INDEX_THREADS 1024
#define STOF_ATTN_GLOBAL_WARPS 4          /* warps a block of step 3 */
#define STOF_ATTN_GLOBAL_ROWS 16          /* query rows a block of step 3 */
#define STOF_ATTN_GLOBAL_ROW_BLOCKS 16    /* blocks a (head, batch) of step 4 */
#define STOF_ATTN_GLOBAL_ROW_WARPS 8      /* warps a block of step 4 */
#define STOF_ATTN_GLOBAL_ROW_GROUP 8      /* global rows a block of step 4 takes at once */

#endif
