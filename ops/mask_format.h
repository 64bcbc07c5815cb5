/* Sparse storage formats of a materialized mask, the input of the attention
 * kernels (paper §4.2, Figure 6):
 *
 *  - block-wise (BSR) at (block_m, block_n): per block row, the "full" blocks
 *    (every in-range element allowed: dense computation), the "partial"
 *    blocks (a bitmap says which elements are allowed; identical bitmaps are
 *    stored once) and the "load" list (full and partial merged, by column:
 *    the key/value blocks a query block must read);
 *  - row-wise (CSR): per query row, its allowed key columns.
 *
 * Both are built on the CPU from the mask's uint64 words; the caller keeps
 * what it builds (the attention planner, for each kernel plan it makes).
 *
 * Per-batch layout. A format has the mask's stored batch count (1 for a mask
 * shared by all batches, else the model's batch). Every array is the
 * concatenation of the per-batch arrays, and every *_row_ptr value is an
 * absolute index into the concatenated *_col_idx, so batch b's row i of
 * blocks starts at full_row_ptr[base + i] with base = b * (n_block_rows + 1)
 * (mask_format_bsr_row_base) and nothing else is needed to index batch b:
 * row_ptr[base] is batch b's offset, row_ptr[base + n_block_rows] its end.
 * The bitmap table part_masks is shared by all batches (deduplicated across
 * them); part_mask_idx indexes it directly. */
#ifndef STOF_OPS_MASK_FORMAT_H
#define STOF_OPS_MASK_FORMAT_H

#include <stdint.h>

#include "ops/mask.h"
#include "stof.h"

/* BSR block sizes: multiples of 16 (the mma tile) up to 256. */
#define MASK_FORMAT_BLOCK_QUANTUM 16
#define MASK_FORMAT_MAX_BLOCK 256

typedef struct mask_bsr {
    int batch;                       /* stored batches: 1 (shared) or the model's batch */
    int q_len, k_len;
    int block_m, block_n;
    int n_block_rows, n_block_cols;  /* ceil(q_len / block_m), ceil(k_len / block_n) */
    int bitmap_row_words;            /* uint32 words per bitmap row: ceil(block_n / 32) */
    int bitmap_words;                /* uint32 words per bitmap: block_m * bitmap_row_words */

    /* batch * (n_block_rows + 1) entries each; values absolute (see above). */
    int32_t *full_row_ptr, *part_row_ptr, *load_row_ptr;
    /* Block columns, increasing within a block row. */
    int32_t *full_col_idx;           /* n_full */
    int32_t *part_col_idx;           /* n_part */
    int32_t *part_mask_idx;          /* n_part: index of the block's bitmap in part_masks */
    int32_t *load_col_idx;           /* n_load = n_full + n_part: full and partial merged */
    /* n_load: -1 for a full block, else the bitmap index, so a kernel can walk
     * the load list alone and still apply every partial block's bitmap. */
    int32_t *load_mask_idx;

    /* n_part_masks distinct bitmaps of bitmap_words uint32 each: block_m rows
     * of bitmap_row_words words; bit c % 32 of word c / 32 of row r is element
     * (r, c) of the block, 1 = allowed; elements past q_len / k_len are 0. */
    uint32_t *part_masks;

    int n_full, n_part, n_load, n_part_masks; /* totals over the stored batches */
} mask_bsr;

/* Row-wise format. row_ptr is int64 so that no mask size can overflow it
 * (batch x q_len x k_len allowed pairs may pass 2^31); column indices fit
 * int32 as k_len does. */
typedef struct mask_csr {
    int batch, q_len, k_len;
    int64_t *row_ptr;  /* batch * (q_len + 1) entries, absolute into col_idx */
    int32_t *col_idx;  /* nnz, increasing within a row */
    int64_t nnz;
} mask_csr;

/* Builds the BSR of m at (block_m, block_n). STOF_ERR_INVALID for bad block
 * sizes or a malformed mask, STOF_ERR_NOMEM. */
int mask_format_bsr_build(const mask *m, int block_m, int block_n, mask_bsr **out,
                          stof_error *err);
void mask_format_bsr_free(mask_bsr *f);

int mask_format_csr_build(const mask *m, mask_csr **out, stof_error *err);
void mask_format_csr_free(mask_csr *f);

/* Index of batch b's first row_ptr entry (a shared format serves every b). */
static inline int64_t mask_format_bsr_row_base(const mask_bsr *f, int b) {
    return (int64_t)(f->batch == 1 ? 0 : b) * (f->n_block_rows + 1);
}
static inline int64_t mask_format_csr_row_base(const mask_csr *f, int b) {
    return (int64_t)(f->batch == 1 ? 0 : b) * (f->q_len + 1);
}

typedef struct mask_bsr_stats {
    int64_t blocks;            /* stored batches x n_block_rows x n_block_cols */
    int64_t full, partial, loaded, empty;
    int64_t distinct_bitmaps;
    double load_ratio;         /* loaded / blocks: the first term of Eq. 1 */
    int64_t bitmap_bytes;      /* the deduplicated bitmap table */
} mask_bsr_stats;

void mask_format_bsr_stats(const mask_bsr *f, mask_bsr_stats *st);

#endif
