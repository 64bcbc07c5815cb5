/* The argument block of the attention kernels (attention_block.cu,
 * attention_row.cu), shared by the host (C11: core/exec/attention/mha_exec_*.c include it as
 * "kernels/attention_abi.cuh") and the kernels (CUDA C++ under NVRTC).
 *
 * One struct, passed BY VALUE as the single kernel parameter, so host and
 * device must agree on its layout byte for byte: fixed-width types only,
 * 8-byte fields first, then 4-byte ones, an even count of those so that no
 * compiler adds tail padding differently; STOF_ATTN_ARGS_BYTES is checked on
 * both sides.
 *
 * Tensors. Strides are in elements. Row i of batch b, head h of Q starts at
 *   q + b * q_batch_stride + (first_b + i) * q_row_stride + h * HEAD_DIM
 * (first_b = seq_start[b] in the ragged layout below, else 0) and likewise for O, and for
 * K, V (key row j) at head h / kv_group. The host offsets the base
 * pointers for the packed layouts: self-attention reads qkv [B, S, 3, H, D]
 * (k = qkv + H*D, v = qkv + 2*H*D, row stride 3*H*D), cross-attention q
 * [B, Sq, H*D] and kv [B, Sk, 2, H, D]. O is [B, Sq, H*D]. Base pointers are
 * 16-byte aligned and every stride a multiple of 8 elements (16-byte vector
 * loads and cp.async); the host checks.
 *
 * Masks. The host folds causal into the mask, so the kernels know no causal
 * rule: they see the allowed pairs only.
 *  - block-wise: the BSR "load" list of ops/mask_format.h at (BLOCK_M,
 *    BLOCK_N): load_row_ptr / load_col_idx / load_mask_idx (-1 = full block,
 *    else the index of its bitmap in part_masks, bitmaps of BLOCK_M rows x
 *    ceil(BLOCK_N / 32) uint32 words);
 *  - row-wise: the CSR of ops/mask_format.h: row_ptr (int64) / col_idx.
 * fmt_batch is the format's stored batch count: 1 = one mask shared by every
 * batch, else one per batch, arrays concatenated with absolute row pointers:
 * batch b's pointers start at b * (n_block_rows + 1) (BSR, n_block_rows =
 * ceil(q_len / BLOCK_M)) or b * (q_len + 1) (CSR), as
 * mask_format_bsr_row_base / mask_format_csr_row_base compute them.
 *
 * T5 relative position bias (compiled in with -DHAS_RELPOS=1): the score of
 * (i, j) in head h gets relpos_table[bucket(j - i) * heads + h] added
 * (table [buckets][heads] in the model dtype). The bucket of every relative
 * position is computed once on the host by op_relpos_bucket (the one copy of
 * T5's formula) into relpos_bucket[j - i + q_len - 1] (n = q_len + k_len - 1
 * entries): the kernel reads a table instead of evaluating a float32 logf
 * per pair, and no device copy of the formula can round differently from
 * the reference at a bucket boundary. Two entries follow: relpos_bucket[n]
 * is the last position of the first run of equal buckets and
 * relpos_bucket[n + 1] the first of the last run (the far distances, which
 * T5 puts in one bucket a side), so a kernel can tell without a load that a
 * whole tile takes one bias. The bucket parameters are kept here
 * for describing and checking.
 *
 * Split block rows (block-wise kernel built with -DSPLIT=1, flash-decoding
 * style). A block row with many loaded blocks (Longformer's and BigBird's
 * global rows) would keep one CTA busy long after the others finished, so
 * the host cuts its load list into work items of at most `chunk` blocks.
 * The grid is (items, heads, batch): CTA x runs work[work_ptr[fb] + x]
 * (fb = b for per-batch formats, else 0; CTAs past the batch's count exit).
 * An item with slot -1 is a whole block row and writes O as the plain
 * kernel does; an item with slot s >= 0 writes its unnormalized fp32
 * partial O and its rows' (m, l) -- running maximum (base 2, -inf when it
 * saw no allowed key) and sum -- to workspace unit
 *   u = (b * (fmt_batch == 1 ? n_slots : 0) + s) * heads + h
 * at partial_o + u * BLOCK_M * HEAD_DIM and partial_ml + u * BLOCK_M * 2.
 * Then stof_attention_combine, grid (split rows, heads, batch), merges the
 * slots first_slot .. first_slot + n_slots - 1 of splits[split_ptr[fb] + x]
 * (log-sum-exp) into the final O. Slots are numbered across the stored
 * batches, so a per-batch format's workspace needs no batch term.
 *
 * Tensor maps (block-wise kernel built with -DTMA=1, sm_90+, head sizes that
 * are multiples of 64). The host encodes K and V as 3-D tensors of 16-bit
 * elements: dims (heads * HEAD_DIM, k_len, batches), strides (row, batch)
 * in bytes, boxes of 64 x BLOCK_N x 1 in the 128-byte swizzle. Key block c
 * of head h, batch b is the box at (h HEAD_DIM + 64 p, c BLOCK_N,
 * b k_tma_batch) for p < HEAD_DIM / 64; rows past k_len come back as zeros. A ragged
 * launch's maps are one batch of all its rows: the box at (.., first_b + c BLOCK_N, 0).
 * A tensor whose batch stride is 0 (one K for every batch) is encoded with
 * one batch and k_tma_batch 0. The maps sit in the argument block, which
 * the kernel takes as a __grid_constant__ parameter so that their address
 * is the parameter's own. Other builds leave these fields zero. */
#ifndef STOF_KERNELS_ATTENTION_ABI_CUH
#define STOF_KERNELS_ATTENTION_ABI_CUH

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
typedef int stof_i32;
typedef unsigned int stof_u32;
typedef long long stof_i64;
#define STOF_ABI_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#define STOF_ABI_ALIGN64 alignas(64)
typedef unsigned long long stof_u64;
#else
#include <stdint.h>
typedef int32_t stof_i32;
typedef uint32_t stof_u32;
typedef int64_t stof_i64;
#define STOF_ABI_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#define STOF_ABI_ALIGN64 _Alignas(64)
typedef uint64_t stof_u64;
#endif

/* A tensor map (the driver's CUtensorMap: 128 opaque bytes, 64-byte
 * aligned), as the host's cuTensorMapEncodeTiled writes it. */
typedef struct stof_attn_tmap {
    STOF_ABI_ALIGN64 stof_u64 opaque[16];
} stof_attn_tmap;

/* One work item of a split launch (16 bytes, read as one int4). */
typedef struct stof_attn_work {
    stof_i32 block_row;
    stof_i32 start, end;  /* load list entries [start, end): absolute indices */
    stof_i32 slot;        /* -1: the whole block row; else its partial's workspace slot */
} stof_attn_work;

/* One split block row, for the combine kernel (16 bytes). */
typedef struct stof_attn_split {
    stof_i32 block_row;
    stof_i32 first_slot, n_slots;  /* its pieces' slots, consecutive */
    stof_i32 reserved;
} stof_attn_split;

/* The largest row stride (elements) of q, k, v, o: the kernels form a
 * row's offset within a tile (at most 256 rows) in 32-bit arithmetic. */
#define STOF_ATTN_MAX_ROW_STRIDE (1LL << 22)

typedef struct stof_attn_args {
    /* tensors (device pointers) */
    const void *q, *k, *v;
    void *o;
    /* strides in elements */
    stof_i64 q_batch_stride, q_row_stride;
    stof_i64 k_batch_stride, k_row_stride;
    stof_i64 v_batch_stride, v_row_stride;
    stof_i64 o_batch_stride, o_row_stride;
    /* block-wise format (BSR load list) */
    const stof_i32 *load_row_ptr, *load_col_idx, *load_mask_idx;
    const stof_u32 *part_masks;
    /* row-wise format (CSR) */
    const stof_i64 *row_ptr;
    const stof_i32 *col_idx;
    /* T5 relative position bias */
    const void *relpos_table;       /* [relpos_buckets][heads], model dtype */
    const stof_i32 *relpos_bucket;  /* [q_len + k_len + 1]: bucket of j - i; far runs */
    /* split block rows (SPLIT=1 only; see above) */
    const stof_i32 *work_ptr;       /* [fmt_batch + 1] */
    const stof_attn_work *work;
    const stof_i32 *split_ptr;      /* [fmt_batch + 1] */
    const stof_attn_split *splits;
    float *partial_o;               /* [units][BLOCK_M][HEAD_DIM] */
    float *partial_ml;              /* [units][BLOCK_M][2]: m, l */
    /* run-time padding (-DPADDING=1 builds): the attention_mask [batch, q_len], 1 = token,
     * each row ones then zeros; keys past a row's length are masked, its padded query rows
     * write zeros (self-attention) */
    const stof_i32 *pad_mask;
    /* -DLSE=1 builds: each row's log-sum-exp, base 2, of its scaled scores (scale * log2(e)
     * q.k), -inf for a row with no allowed key, at lse[(b * heads + h) * q_len + i] (padded
     * rows: any value); what attention_global.cu merges the global keys into O with */
    float *lse;
    /* the ragged layout (-DPADDING=1 builds; NULL: the padded one): int32 [batch + 1], batch
     * b's rows are rows seq_start[b] .. seq_start[b + 1] - 1 of q, k, v and o (the batch
     * strides are 0), its length their count; rows past it are neither weighed nor written.
     * Rows outside every sequence must hold finite values: a TMA build may load them as keys
     * that the mask then gives no weight. pad_mask may be NULL; when given, its lengths must
     * be these */
    const stof_i32 *seq_start;
    stof_i64 align_[5];             /* keeps the tensor maps on a 64-byte boundary */
    /* 4-byte fields: keep their count even */
    stof_i32 q_len, k_len, heads, fmt_batch;
    float scale_log2;               /* scale * log2(e): scores are exponentiated with exp2 */
    stof_i32 relpos_buckets, relpos_max_distance, relpos_bidirectional;
    stof_i32 n_slots;               /* split pieces in the work list (all stored batches) */
    stof_i32 kv_group;              /* query heads per K/V head (grouped-query attention;
                                       1: one K/V head per query head) */
    /* K/V by tensor maps (block-wise -DTMA=1 builds only; see below) */
    stof_i32 k_tma_batch, v_tma_batch; /* batch b reads the map's batch b times this (0:
                                          one K, V for every batch) */
    stof_attn_tmap tmap_k, tmap_v;
} stof_attn_args;

#define STOF_ATTN_ARGS_BYTES (34 * 8 + 12 * 4 + 2 * 128)
STOF_ABI_STATIC_ASSERT(sizeof(stof_attn_args) == STOF_ATTN_ARGS_BYTES,
                       "stof_attn_args layout changed: host and kernels must agree");
STOF_ABI_STATIC_ASSERT(sizeof(void *) == 8, "stof needs 64-bit pointers");
STOF_ABI_STATIC_ASSERT(sizeof(stof_attn_tmap) == 128, "a tensor map is 128 bytes");
STOF_ABI_STATIC_ASSERT(sizeof(stof_attn_work) == 16 && sizeof(stof_attn_split) == 16,
                       "work items are read as int4");

/* Kernel names, for cuModuleGetFunction. */
#define STOF_ATTN_BLOCK_KERNEL "stof_attention_block"
#define STOF_ATTN_ROW_KERNEL "stof_attention_row"
#define STOF_ATTN_COMBINE_KERNEL "stof_attention_combine" /* SPLIT=1 builds only */
#define STOF_ATTN_COMBINE_THREADS 128

#endif
