/* Block-wise (BSR) and row-wise (CSR) formats of a mask, and their cache.
 *
 * Everything works on the mask's uint64 words. A block row of block_m query
 * rows is first reduced to two word vectors, the OR and the AND of its rows;
 * a block is then empty, full or partial by looking at the block's columns in
 * those two vectors, 64 columns at a time. Only partial blocks look at single
 * rows again, to cut their bitmap out of the words by shifting. */
#include "ops/mask_format.h"

#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/base/util.h"

enum { BLOCK_EMPTY = 0, BLOCK_PARTIAL = 1, BLOCK_FULL = 2 };

/* ---- bit helpers ------------------------------------------------------------ */

/* The n lowest bits set, 1 <= n <= 64. */
static uint64_t low_bits(int n) {
    return n >= 64 ? ~0ULL : (1ULL << n) - 1;
}

/* The 64 bits of a word vector starting at bit c (bits past the vector's end
 * read as 0). Blocks start at multiples of 16, not 64, so a block's columns
 * may straddle two words. */
static uint64_t window64(const uint64_t *v, int words, int c) {
    int w = c >> 6, shift = c & 63;
    uint64_t x = v[w] >> shift;
    if (shift && w + 1 < words)
        x |= v[w + 1] << (64 - shift);
    return x;
}

static int min_int(int a, int b) {
    return a < b ? a : b;
}

/* ---- validation ------------------------------------------------------------- */

static int check_mask(const mask *m, stof_error *err) {
    if (!m || !m->bits)
        return err_set(err, STOF_ERR_INVALID, "mask format: no mask given");
    if (m->batch < 1 || m->q_len < 1 || m->k_len < 1)
        return err_set(err, STOF_ERR_INVALID,
                       "mask format: mask shape must be positive, got batch %d, q_len %d, k_len %d",
                       m->batch, m->q_len, m->k_len);
    if (m->words != (m->k_len + 63) / 64)
        return err_set(err, STOF_ERR_INVALID,
                       "mask format: mask has %d words per row, k_len %d needs %d", m->words,
                       m->k_len, (m->k_len + 63) / 64);
    return STOF_OK;
}

static int check_block_size(const char *name, int size, stof_error *err) {
    if (size <= 0 || size % MASK_FORMAT_BLOCK_QUANTUM || size > MASK_FORMAT_MAX_BLOCK)
        return err_set(err, STOF_ERR_INVALID,
                       "mask format: %s must be a positive multiple of %d up to %d, got %d", name,
                       MASK_FORMAT_BLOCK_QUANTUM, MASK_FORMAT_MAX_BLOCK, size);
    return STOF_OK;
}

/* ---- BSR: shape and allocation ---------------------------------------------- */

static int bsr_set_shape(mask_bsr *f, const mask *m, int block_m, int block_n,
                         stof_error *err) {
    f->batch = m->batch;
    f->q_len = m->q_len;
    f->k_len = m->k_len;
    f->block_m = block_m;
    f->block_n = block_n;
    f->n_block_rows = (m->q_len + block_m - 1) / block_m;
    f->n_block_cols = (m->k_len + block_n - 1) / block_n;
    f->bitmap_row_words = (block_n + 31) / 32;
    f->bitmap_words = block_m * f->bitmap_row_words;
    /* Block indices and counts are int32: every block of every batch must be
     * countable, and so must the row_ptr entries. */
    int64_t per_batch = (int64_t)f->n_block_rows * f->n_block_cols; /* < 2^54: no overflow */
    if (per_batch > INT32_MAX / m->batch || f->n_block_rows + 1 > INT32_MAX / m->batch)
        return err_set(err, STOF_ERR_INVALID,
                       "mask format: %d x %d x %d blocks of %dx%d do not fit int32 indices",
                       m->batch, f->n_block_rows, f->n_block_cols, block_m, block_n);
    return STOF_OK;
}

static int bsr_alloc_arrays(mask_bsr *f, stof_error *err) {
    size_t ptrs = (size_t)f->batch * (f->n_block_rows + 1);
    size_t n_part = (size_t)f->n_part, n_full = (size_t)f->n_full, n_load = (size_t)f->n_load;
    if (n_part > SIZE_MAX / sizeof(uint32_t) / (size_t)f->bitmap_words)
        return err_set(err, STOF_ERR_NOMEM, "mask format: %zu partial bitmaps are too many",
                       n_part);
    if (!(f->full_row_ptr = err_calloc(ptrs, sizeof(int32_t), err)) ||
        !(f->part_row_ptr = err_calloc(ptrs, sizeof(int32_t), err)) ||
        !(f->load_row_ptr = err_calloc(ptrs, sizeof(int32_t), err)) ||
        !(f->full_col_idx = err_malloc(n_full * sizeof(int32_t), err)) ||
        !(f->part_col_idx = err_malloc(n_part * sizeof(int32_t), err)) ||
        !(f->part_mask_idx = err_malloc(n_part * sizeof(int32_t), err)) ||
        !(f->load_col_idx = err_malloc(n_load * sizeof(int32_t), err)) ||
        !(f->load_mask_idx = err_malloc(n_load * sizeof(int32_t), err)) ||
        /* Room for every partial bitmap; deduplication only shrinks it. */
        !(f->part_masks = err_malloc(n_part * (size_t)f->bitmap_words * sizeof(uint32_t), err)))
        return STOF_ERR_NOMEM;
    return STOF_OK;
}

void mask_format_bsr_free(mask_bsr *f) {
    if (!f)
        return;
    free(f->full_row_ptr);
    free(f->part_row_ptr);
    free(f->load_row_ptr);
    free(f->full_col_idx);
    free(f->part_col_idx);
    free(f->part_mask_idx);
    free(f->load_col_idx);
    free(f->load_mask_idx);
    free(f->part_masks);
    free(f);
}

/* ---- BSR: classification ---------------------------------------------------- */

/* any = OR, all = AND of the in-range rows [r0, r1) of stored batch b. */
static void block_row_reduce(const mask *m, int b, int r0, int r1, uint64_t *any,
                             uint64_t *all) {
    size_t bytes = (size_t)m->words * sizeof(uint64_t);
    memcpy(any, mask_row(m, b, r0), bytes);
    memcpy(all, mask_row(m, b, r0), bytes);
    for (int r = r0 + 1; r < r1; r++) {
        const uint64_t *row = mask_row(m, b, r);
        for (int w = 0; w < m->words; w++) {
            any[w] |= row[w];
            all[w] &= row[w];
        }
    }
}

/* Status of the block over columns [c0, c1) (c1 already clipped to k_len),
 * from its block row's OR and AND vectors. */
static int classify_block(const uint64_t *any, const uint64_t *all, int words, int c0,
                          int c1) {
    uint64_t seen = 0;
    int full = 1;
    for (int c = c0; c < c1; c += 64) {
        uint64_t keep = low_bits(min_int(64, c1 - c));
        seen |= window64(any, words, c) & keep;
        full &= (window64(all, words, c) & keep) == keep;
    }
    if (!seen)
        return BLOCK_EMPTY;
    return full ? BLOCK_FULL : BLOCK_PARTIAL;
}

/* Fills status[batch][n_block_rows][n_block_cols] and the block counts. */
static int bsr_classify(mask_bsr *f, const mask *m, uint8_t *status, stof_error *err) {
    uint64_t *any = err_malloc((size_t)m->words * 2 * sizeof(uint64_t), err);
    if (!any)
        return STOF_ERR_NOMEM;
    uint64_t *all = any + m->words;
    int64_t n_full = 0, n_part = 0;
    for (int b = 0; b < f->batch; b++) {
        for (int br = 0; br < f->n_block_rows; br++) {
            int r0 = br * f->block_m, r1 = min_int(r0 + f->block_m, f->q_len);
            block_row_reduce(m, b, r0, r1, any, all);
            for (int bc = 0; bc < f->n_block_cols; bc++) {
                int c0 = bc * f->block_n, c1 = min_int(c0 + f->block_n, f->k_len);
                int s = classify_block(any, all, m->words, c0, c1);
                *status++ = (uint8_t)s;
                n_full += s == BLOCK_FULL;
                n_part += s == BLOCK_PARTIAL;
            }
        }
    }
    free(any);
    f->n_full = (int)n_full;
    f->n_part = (int)n_part;
    f->n_load = (int)(n_full + n_part);
    return STOF_OK;
}

/* ---- BSR: partial bitmaps, deduplicated ------------------------------------- */

/* Cuts the block [r0, r1) x [c0, c1) of stored batch b out of the mask's
 * words into out (bitmap layout of mask_bsr; rows past r1 stay 0). */
static void extract_bitmap(const mask_bsr *f, const mask *m, int b, int r0, int r1, int c0,
                           int c1, uint32_t *out) {
    memset(out, 0, (size_t)f->bitmap_words * sizeof(uint32_t));
    for (int r = r0; r < r1; r++) {
        const uint64_t *row = mask_row(m, b, r);
        uint32_t *dst = out + (size_t)(r - r0) * f->bitmap_row_words;
        for (int k = 0, c = c0; c < c1; k++, c += 32)
            dst[k] = (uint32_t)(window64(row, m->words, c) & low_bits(min_int(32, c1 - c)));
    }
}

static uint64_t bitmap_hash(const uint32_t *w, int n) {
    uint64_t h = UTIL_HASH_SEED;
    for (int i = 0; i < n; i++)
        h = util_mix64(h ^ w[i]);
    return h;
}

/* Open addressing over bitmap indices; sized once for the worst case (every
 * partial block distinct) at load <= 1/2, so it never grows. */
typedef struct bitmap_set {
    int32_t *slot; /* index into the bitmap store, -1 when free */
    uint64_t *hash;
    size_t cap;    /* a power of two */
} bitmap_set;

static int bitmap_set_init(bitmap_set *s, int64_t max_entries, stof_error *err) {
    s->cap = 16;
    while ((int64_t)s->cap < 2 * max_entries)
        s->cap *= 2;
    s->hash = err_malloc(s->cap * sizeof(uint64_t), err);
    s->slot = s->hash ? err_malloc(s->cap * sizeof(int32_t), err) : NULL;
    if (!s->slot)
        return STOF_ERR_NOMEM;
    memset(s->slot, 0xff, s->cap * sizeof(int32_t));
    return STOF_OK;
}

static void bitmap_set_free(bitmap_set *s) {
    free(s->slot);
    free(s->hash);
}

/* The index of a stored bitmap equal to store[candidate]; candidate itself
 * (now recorded) when there is none. */
static int32_t bitmap_set_intern(bitmap_set *s, const uint32_t *store, int words,
                                 int32_t candidate) {
    const uint32_t *bits = store + (size_t)candidate * words;
    uint64_t h = bitmap_hash(bits, words);
    for (size_t i = h & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
        if (s->slot[i] < 0) {
            s->slot[i] = candidate;
            s->hash[i] = h;
            return candidate;
        }
        if (s->hash[i] == h &&
            !memcmp(store + (size_t)s->slot[i] * words, bits, (size_t)words * sizeof(uint32_t)))
            return s->slot[i];
    }
}

/* ---- BSR: filling ----------------------------------------------------------- */

typedef struct bsr_cursor {
    int32_t full, part, load; /* next free entry of each list */
} bsr_cursor;

static void bsr_add_partial(mask_bsr *f, const mask *m, bitmap_set *set, bsr_cursor *at, int b,
                            int br, int bc) {
    int r0 = br * f->block_m, r1 = min_int(r0 + f->block_m, f->q_len);
    int c0 = bc * f->block_n, c1 = min_int(c0 + f->block_n, f->k_len);
    /* Cut into the next free slot of the table: it stays there only if new. */
    int32_t next = f->n_part_masks;
    extract_bitmap(f, m, b, r0, r1, c0, c1, f->part_masks + (size_t)next * f->bitmap_words);
    int32_t idx = bitmap_set_intern(set, f->part_masks, f->bitmap_words, next);
    if (idx == next)
        f->n_part_masks++;
    f->part_col_idx[at->part] = bc;
    f->part_mask_idx[at->part++] = idx;
    f->load_col_idx[at->load] = bc;
    f->load_mask_idx[at->load++] = idx;
}

static void bsr_fill_block_row(mask_bsr *f, const mask *m, const uint8_t *status,
                               bitmap_set *set, bsr_cursor *at, int b, int br) {
    for (int bc = 0; bc < f->n_block_cols; bc++) {
        if (status[bc] == BLOCK_FULL) {
            f->full_col_idx[at->full++] = bc;
            f->load_col_idx[at->load] = bc;
            f->load_mask_idx[at->load++] = -1;
        } else if (status[bc] == BLOCK_PARTIAL) {
            bsr_add_partial(f, m, set, at, b, br, bc);
        }
    }
}

static void bsr_fill(mask_bsr *f, const mask *m, const uint8_t *status, bitmap_set *set) {
    bsr_cursor at = {0, 0, 0};
    for (int b = 0; b < f->batch; b++) {
        int64_t base = mask_format_bsr_row_base(f, b);
        for (int br = 0; br < f->n_block_rows; br++) {
            f->full_row_ptr[base + br] = at.full;
            f->part_row_ptr[base + br] = at.part;
            f->load_row_ptr[base + br] = at.load;
            bsr_fill_block_row(f, m, status, set, &at, b, br);
            status += f->n_block_cols;
        }
        f->full_row_ptr[base + f->n_block_rows] = at.full;
        f->part_row_ptr[base + f->n_block_rows] = at.part;
        f->load_row_ptr[base + f->n_block_rows] = at.load;
    }
}

/* Gives back the room reserved for bitmaps that turned out to be duplicates. */
static void bsr_shrink_bitmaps(mask_bsr *f) {
    size_t bytes = (size_t)f->n_part_masks * f->bitmap_words * sizeof(uint32_t);
    uint32_t *p = realloc(f->part_masks, bytes ? bytes : 1);
    if (p) /* keeping the larger block is harmless */
        f->part_masks = p;
}

static int bsr_build_into(mask_bsr *f, const mask *m, int block_m, int block_n,
                          stof_error *err) {
    int rc = bsr_set_shape(f, m, block_m, block_n, err);
    if (rc)
        return rc;
    size_t n_blocks = (size_t)f->batch * f->n_block_rows * f->n_block_cols;
    uint8_t *status = err_malloc(n_blocks, err);
    if (!status)
        return STOF_ERR_NOMEM;
    bitmap_set set = {0};
    rc = bsr_classify(f, m, status, err);
    if (!rc)
        rc = bsr_alloc_arrays(f, err);
    if (!rc)
        rc = bitmap_set_init(&set, f->n_part, err);
    if (!rc) {
        bsr_fill(f, m, status, &set);
        bsr_shrink_bitmaps(f);
    }
    bitmap_set_free(&set);
    free(status);
    return rc;
}

int mask_format_bsr_build(const mask *m, int block_m, int block_n, mask_bsr **out,
                          stof_error *err) {
    *out = NULL;
    int rc = check_mask(m, err);
    if (!rc)
        rc = check_block_size("block_m", block_m, err);
    if (!rc)
        rc = check_block_size("block_n", block_n, err);
    if (rc)
        return rc;
    mask_bsr *f = err_calloc(1, sizeof *f, err);
    if (!f)
        return STOF_ERR_NOMEM;
    rc = bsr_build_into(f, m, block_m, block_n, err);
    if (rc) {
        mask_format_bsr_free(f);
        return rc;
    }
    *out = f;
    return STOF_OK;
}

void mask_format_bsr_stats(const mask_bsr *f, mask_bsr_stats *st) {
    memset(st, 0, sizeof *st);
    st->blocks = (int64_t)f->batch * f->n_block_rows * f->n_block_cols;
    st->full = f->n_full;
    st->partial = f->n_part;
    st->loaded = f->n_load;
    st->empty = st->blocks - st->loaded;
    st->distinct_bitmaps = f->n_part_masks;
    st->load_ratio = st->blocks ? (double)st->loaded / (double)st->blocks : 0.0;
    st->bitmap_bytes = (int64_t)f->n_part_masks * f->bitmap_words * (int64_t)sizeof(uint32_t);
}

/* ---- CSR -------------------------------------------------------------------- */

/* Word w of a row with the columns past k_len cleared, so a mask with stray
 * tail bits still gives in-range columns only. */
static uint64_t row_word(const mask *m, const uint64_t *row, int w) {
    if (w == m->words - 1)
        return row[w] & low_bits(m->k_len - 64 * w);
    return row[w];
}

static int64_t row_count(const mask *m, const uint64_t *row) {
    int64_t n = 0;
    for (int w = 0; w < m->words; w++)
        n += __builtin_popcountll(row_word(m, row, w));
    return n;
}

static void row_columns(const mask *m, const uint64_t *row, int32_t *out) {
    for (int w = 0; w < m->words; w++) {
        for (uint64_t x = row_word(m, row, w); x; x &= x - 1)
            *out++ = 64 * w + __builtin_ctzll(x);
    }
}

void mask_format_csr_free(mask_csr *f) {
    if (!f)
        return;
    free(f->row_ptr);
    free(f->col_idx);
    free(f);
}

static int csr_build_into(mask_csr *f, const mask *m, stof_error *err) {
    f->batch = m->batch;
    f->q_len = m->q_len;
    f->k_len = m->k_len;
    f->row_ptr = err_malloc((size_t)m->batch * (m->q_len + 1) * sizeof(int64_t), err);
    if (!f->row_ptr)
        return STOF_ERR_NOMEM;
    int64_t nnz = 0;
    for (int b = 0; b < m->batch; b++) {
        int64_t *ptr = f->row_ptr + mask_format_csr_row_base(f, b);
        for (int i = 0; i < m->q_len; i++) {
            ptr[i] = nnz;
            nnz += row_count(m, mask_row(m, b, i));
        }
        ptr[m->q_len] = nnz;
    }
    if ((uint64_t)nnz > SIZE_MAX / sizeof(int32_t))
        return err_set(err, STOF_ERR_NOMEM, "mask format: %lld allowed pairs are too many",
                       (long long)nnz);
    f->nnz = nnz;
    f->col_idx = err_malloc((size_t)nnz * sizeof(int32_t), err);
    if (!f->col_idx)
        return STOF_ERR_NOMEM;
    for (int b = 0; b < m->batch; b++) {
        const int64_t *ptr = f->row_ptr + mask_format_csr_row_base(f, b);
        for (int i = 0; i < m->q_len; i++)
            row_columns(m, mask_row(m, b, i), f->col_idx + ptr[i]);
    }
    return STOF_OK;
}

int mask_format_csr_build(const mask *m, mask_csr **out, stof_error *err) {
    *out = NULL;
    int rc = check_mask(m, err);
    if (rc)
        return rc;
    mask_csr *f = err_calloc(1, sizeof *f, err);
    if (!f)
        return STOF_ERR_NOMEM;
    rc = csr_build_into(f, m, err);
    if (rc) {
        mask_format_csr_free(f);
        return rc;
    }
    *out = f;
    return STOF_OK;
}
