/* Block-wise (BSR) and row-wise (CSR) mask formats against brute force: every
 * format is turned back into a dense mask and compared element by element,
 * every block's class is recomputed bit by bit, and the bitmap table is
 * checked to hold each distinct bitmap exactly once. Test masks fill the
 * mask struct's words directly, so this test needs nothing of ops/mask.c. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/base/error.h"
#include "core/base/util.h"
#include "ops/mask_format.h"

/* ---- test masks ------------------------------------------------------------- */

static mask *tmask_new(int batch, int q_len, int k_len) {
    mask *m = calloc(1, sizeof *m);
    m->batch = batch;
    m->q_len = q_len;
    m->k_len = k_len;
    m->words = (k_len + 63) / 64;
    m->bits = calloc((size_t)batch * q_len * m->words, sizeof(uint64_t));
    return m;
}

static void tmask_free(mask *m) {
    if (m) {
        free(m->bits);
        free(m);
    }
}

static uint64_t *tmask_row(mask *m, int b, int i) {
    return m->bits + ((size_t)b * m->q_len + i) * m->words;
}

static void tmask_set(mask *m, int b, int i, int j) {
    tmask_row(m, b, i)[j >> 6] |= 1ULL << (j & 63);
}

/* Allows columns [j0, j1) of row i, clipped to the mask. */
static void tmask_set_range(mask *m, int b, int i, int j0, int j1) {
    if (j0 < 0)
        j0 = 0;
    if (j1 > m->k_len)
        j1 = m->k_len;
    for (int j = j0; j < j1; j++)
        tmask_set(m, b, i, j);
}

/* ---- generators ------------------------------------------------------------- */

typedef enum gen_kind {
    GEN_RANDOM,    /* independent bits at a random density, 0 and 1 included */
    GEN_BLOCKS,    /* blocks of a random grid: empty, full, random or triangular */
    GEN_SCATTERED, /* a few small rectangles anywhere: scattered, unaligned blocks */
    GEN_BAND,      /* sliding window of a random width */
    GEN_CAUSAL,
    GEN_COUNT
} gen_kind;

static const char *gen_name(gen_kind g) {
    static const char *names[] = {"random", "blocks", "scattered", "band", "causal"};
    return names[g];
}

static void gen_random(mask *m, int b, util_rng *rng) {
    double p = util_rng_double(rng);
    int pick = (int)(util_rng_next(rng) % 8);
    if (pick == 0)
        p = 0.0;
    else if (pick == 1)
        p = 1.0;
    for (int i = 0; i < m->q_len; i++)
        for (int j = 0; j < m->k_len; j++)
            if (util_rng_double(rng) < p)
                tmask_set(m, b, i, j);
}

/* Grids of 8..64 (aligned and not aligned with the format's blocks), so a
 * format block row holds several partial blocks with repeated contents. */
static void gen_blocks(mask *m, int b, util_rng *rng) {
    static const int grids[] = {8, 16, 24, 32, 48, 64};
    int g = grids[util_rng_next(rng) % 6];
    for (int bi = 0; bi * g < m->q_len; bi++) {
        for (int bj = 0; bj * g < m->k_len; bj++) {
            int kind = (int)(util_rng_next(rng) % 4);
            for (int i = bi * g; i < bi * g + g && i < m->q_len; i++) {
                for (int j = bj * g; j < bj * g + g && j < m->k_len; j++) {
                    int on = kind == 1 || (kind == 2 && util_rng_double(rng) < 0.5) ||
                             (kind == 3 && j - bj * g <= i - bi * g);
                    if (on)
                        tmask_set(m, b, i, j);
                }
            }
        }
    }
}

static void gen_scattered(mask *m, int b, util_rng *rng) {
    int n = 1 + (int)(util_rng_next(rng) % 12);
    for (int r = 0; r < n; r++) {
        int i0 = (int)(util_rng_next(rng) % m->q_len), j0 = (int)(util_rng_next(rng) % m->k_len);
        int h = 1 + (int)(util_rng_next(rng) % 40), w = 1 + (int)(util_rng_next(rng) % 90);
        for (int i = i0; i < i0 + h && i < m->q_len; i++)
            tmask_set_range(m, b, i, j0, j0 + w);
    }
}

static void gen_band(mask *m, int b, util_rng *rng) {
    int band = (int)(util_rng_next(rng) % 70);
    for (int i = 0; i < m->q_len; i++)
        tmask_set_range(m, b, i, i - band, i + band + 1);
}

static void gen_causal(mask *m, int b, util_rng *rng) {
    int shift = m->k_len - m->q_len; /* bottom-right aligned, as in ops/mask.h */
    for (int i = 0; i < m->q_len; i++)
        tmask_set_range(m, b, i, 0, i + shift + 1);
}

static void gen_fill(mask *m, int b, gen_kind g, util_rng *rng) {
    switch (g) {
    case GEN_RANDOM: gen_random(m, b, rng); break;
    case GEN_BLOCKS: gen_blocks(m, b, rng); break;
    case GEN_SCATTERED: gen_scattered(m, b, rng); break;
    case GEN_BAND: gen_band(m, b, rng); break;
    case GEN_CAUSAL: gen_causal(m, b, rng); break;
    default: break;
    }
}

/* ---- brute-force checks of a BSR ---------------------------------------------- */

static int bitmap_get(const mask_bsr *f, const uint32_t *bm, int r, int c) {
    return (int)((bm[r * f->bitmap_row_words + c / 32] >> (c % 32)) & 1u);
}

/* 2 full, 1 partial, 0 empty, by looking at every in-range element. */
static int brute_block_class(const mask *m, int b, int br, int bc, int bm_, int bn) {
    int any = 0, all = 1;
    for (int i = br * bm_; i < (br + 1) * bm_ && i < m->q_len; i++) {
        for (int j = bc * bn; j < (bc + 1) * bn && j < m->k_len; j++) {
            int v = mask_get(m, b, i, j);
            any |= v;
            all &= v;
        }
    }
    return !any ? 0 : all ? 2 : 1;
}

/* Row pointers in range and non-decreasing, columns increasing per row. */
static int bsr_list_ok(const mask_bsr *f, const int32_t *ptr, const int32_t *col, int total) {
    for (int b = 0; b < f->batch; b++) {
        const int32_t *p = ptr + mask_format_bsr_row_base(f, b);
        if (b == 0 && p[0] != 0)
            return 0;
        for (int br = 0; br < f->n_block_rows; br++) {
            if (p[br] > p[br + 1])
                return 0;
            for (int k = p[br]; k < p[br + 1]; k++) {
                if (col[k] < 0 || col[k] >= f->n_block_cols || (k > p[br] && col[k] <= col[k - 1]))
                    return 0;
            }
        }
        if (b == f->batch - 1 && p[f->n_block_rows] != total)
            return 0;
        if (b > 0 && p[0] != ptr[mask_format_bsr_row_base(f, b - 1) + f->n_block_rows])
            return 0;
    }
    return 1;
}

/* Every (batch, block) appears in the list of its class and no other. */
static int bsr_classes_ok(const mask_bsr *f, const mask *m) {
    for (int b = 0; b < f->batch; b++) {
        int64_t base = mask_format_bsr_row_base(f, b);
        for (int br = 0; br < f->n_block_rows; br++) {
            char *cls = calloc((size_t)f->n_block_cols, 1);
            for (int k = f->full_row_ptr[base + br]; k < f->full_row_ptr[base + br + 1]; k++)
                cls[f->full_col_idx[k]] += 2;
            for (int k = f->part_row_ptr[base + br]; k < f->part_row_ptr[base + br + 1]; k++)
                cls[f->part_col_idx[k]] += 1;
            int ok = 1;
            for (int bc = 0; bc < f->n_block_cols; bc++)
                ok &= cls[bc] == brute_block_class(m, b, br, bc, f->block_m, f->block_n);
            free(cls);
            if (!ok)
                return 0;
        }
    }
    return 1;
}

/* The load list is full and partial merged by column, with the bitmap of
 * each partial block and -1 for each full one. */
static int bsr_load_ok(const mask_bsr *f) {
    if (f->n_load != f->n_full + f->n_part)
        return 0;
    for (int b = 0; b < f->batch; b++) {
        int64_t base = mask_format_bsr_row_base(f, b);
        for (int br = 0; br < f->n_block_rows; br++) {
            int fi = f->full_row_ptr[base + br], fe = f->full_row_ptr[base + br + 1];
            int pi = f->part_row_ptr[base + br], pe = f->part_row_ptr[base + br + 1];
            for (int k = f->load_row_ptr[base + br]; k < f->load_row_ptr[base + br + 1]; k++) {
                int take_full = fi < fe && (pi >= pe || f->full_col_idx[fi] < f->part_col_idx[pi]);
                int col = take_full ? f->full_col_idx[fi] : f->part_col_idx[pi];
                int idx = take_full ? -1 : f->part_mask_idx[pi];
                if (f->load_col_idx[k] != col || f->load_mask_idx[k] != idx)
                    return 0;
                if (take_full)
                    fi++;
                else
                    pi++;
            }
            if (fi != fe || pi != pe)
                return 0;
        }
    }
    return 1;
}

/* Dense reconstruction of batch b from the BSR (full blocks: every in-range
 * element; partial: the bitmap), compared with the mask. Also checks that
 * bitmaps have no bits outside the mask's range. */
static int bsr_reconstructs(const mask_bsr *f, const mask *m, int b) {
    uint8_t *dense = calloc((size_t)m->q_len * m->k_len, 1);
    int64_t base = mask_format_bsr_row_base(f, b);
    int ok = 1;
    for (int br = 0; br < f->n_block_rows; br++) {
        for (int k = f->load_row_ptr[base + br]; k < f->load_row_ptr[base + br + 1]; k++) {
            int bc = f->load_col_idx[k], idx = f->load_mask_idx[k];
            const uint32_t *bm = idx >= 0 ? f->part_masks + (size_t)idx * f->bitmap_words : NULL;
            for (int r = 0; r < f->block_m; r++) {
                for (int c = 0; c < f->block_n; c++) {
                    int i = br * f->block_m + r, j = bc * f->block_n + c;
                    int in_range = i < m->q_len && j < m->k_len;
                    int v = bm ? bitmap_get(f, bm, r, c) : in_range;
                    if (v && !in_range)
                        ok = 0;
                    else if (v)
                        dense[(size_t)i * m->k_len + j] = 1;
                }
            }
        }
    }
    for (int i = 0; i < m->q_len && ok; i++)
        for (int j = 0; j < m->k_len && ok; j++)
            ok = dense[(size_t)i * m->k_len + j] == mask_get(m, b, i, j);
    free(dense);
    return ok;
}

static int bitmap_words_cmp_n;
static int bitmap_cmp(const void *a, const void *b) {
    return memcmp(a, b, (size_t)bitmap_words_cmp_n * sizeof(uint32_t));
}

/* The bitmap of block (br, bc) of batch b, bit by bit, in the documented
 * layout: padding columns and out-of-range elements 0. */
static void brute_bitmap(const mask_bsr *f, const mask *m, int b, int br, int bc, uint32_t *out) {
    memset(out, 0, (size_t)f->bitmap_words * sizeof(uint32_t));
    for (int r = 0; r < f->block_m; r++) {
        for (int c = 0; c < f->block_n; c++) {
            int i = br * f->block_m + r, j = bc * f->block_n + c;
            if (i < m->q_len && j < m->k_len && mask_get(m, b, i, j))
                out[r * f->bitmap_row_words + c / 32] |= 1u << (c % 32);
        }
    }
}

/* Each partial block's stored bitmap equals its brute-force bitmap word for
 * word, and the table holds as many bitmaps as there are distinct ones
 * (counted by sorting the brute-force bitmaps). */
static int bitmaps_ok(const mask_bsr *f, const mask *m) {
    size_t w = (size_t)f->bitmap_words;
    uint32_t *all = malloc(((size_t)f->n_part + 1) * w * sizeof(uint32_t));
    int ok = 1, k = 0;
    for (int b = 0; b < f->batch; b++) {
        int64_t base = mask_format_bsr_row_base(f, b);
        for (int br = 0; br < f->n_block_rows; br++) {
            for (; k < f->part_row_ptr[base + br + 1]; k++) {
                brute_bitmap(f, m, b, br, f->part_col_idx[k], all + k * w);
                ok &= !memcmp(all + k * w, f->part_masks + (size_t)f->part_mask_idx[k] * w,
                              w * sizeof(uint32_t));
            }
        }
    }
    bitmap_words_cmp_n = f->bitmap_words;
    qsort(all, (size_t)f->n_part, w * sizeof(uint32_t), bitmap_cmp);
    int distinct = f->n_part > 0;
    for (k = 1; k < f->n_part; k++)
        distinct += memcmp(all + (k - 1) * w, all + k * w, w * sizeof(uint32_t)) != 0;
    free(all);
    return ok && distinct == f->n_part_masks;
}

/* The table itself holds no duplicates, and every entry is used. */
static int bitmap_table_is_set(const mask_bsr *f) {
    size_t w = (size_t)f->bitmap_words;
    char *used = calloc((size_t)f->n_part_masks + 1, 1);
    for (int k = 0; k < f->n_part; k++)
        used[f->part_mask_idx[k]] = 1;
    int ok = 1;
    for (int a = 0; a < f->n_part_masks; a++)
        ok &= used[a];
    free(used);
    uint32_t *copy = malloc((size_t)f->n_part_masks * w * sizeof(uint32_t) + 1);
    memcpy(copy, f->part_masks, (size_t)f->n_part_masks * w * sizeof(uint32_t));
    bitmap_words_cmp_n = f->bitmap_words;
    qsort(copy, (size_t)f->n_part_masks, w * sizeof(uint32_t), bitmap_cmp);
    for (int a = 1; a < f->n_part_masks; a++)
        ok &= memcmp(copy + (a - 1) * w, copy + a * w, w * sizeof(uint32_t)) != 0;
    free(copy);
    return ok;
}

static int bsr_matches(const mask_bsr *f, const mask *m) {
    int ok = f->batch == m->batch && f->n_block_rows == (m->q_len + f->block_m - 1) / f->block_m &&
             f->n_block_cols == (m->k_len + f->block_n - 1) / f->block_n;
    ok = ok && bsr_list_ok(f, f->full_row_ptr, f->full_col_idx, f->n_full);
    ok = ok && bsr_list_ok(f, f->part_row_ptr, f->part_col_idx, f->n_part);
    ok = ok && bsr_list_ok(f, f->load_row_ptr, f->load_col_idx, f->n_load);
    ok = ok && bsr_classes_ok(f, m) && bsr_load_ok(f);
    for (int b = 0; b < m->batch && ok; b++)
        ok = bsr_reconstructs(f, m, b);
    ok = ok && bitmaps_ok(f, m) && bitmap_table_is_set(f);
    return ok;
}

/* ---- brute-force check of a CSR ------------------------------------------------ */

static int csr_matches(const mask_csr *f, const mask *m) {
    if (f->batch != m->batch || f->row_ptr[0] != 0)
        return 0;
    int64_t count = 0;
    for (int b = 0; b < m->batch; b++) {
        const int64_t *p = f->row_ptr + mask_format_csr_row_base(f, b);
        for (int i = 0; i < m->q_len; i++) {
            if (p[i] != count)
                return 0;
            for (int j = 0; j < m->k_len; j++) {
                if (!mask_get(m, b, i, j))
                    continue;
                if (count >= f->nnz || f->col_idx[count] != j)
                    return 0;
                count++;
            }
        }
        if (p[m->q_len] != count)
            return 0;
    }
    return count == f->nnz;
}

/* ---- tests ---------------------------------------------------------------------- */

static const int sizes[] = {1, 15, 16, 17, 63, 64, 100, 129, 257, 1000};
#define N_SIZES ((int)(sizeof sizes / sizeof sizes[0]))
static const int blocks[][2] = {{16, 16}, {32, 64}, {64, 32}, {64, 64}, {128, 64}};
#define N_BLOCKS ((int)(sizeof blocks / sizeof blocks[0]))

static void check_mask_formats(const mask *m, const char *what) {
    stof_error err = {0};
    for (int k = 0; k < N_BLOCKS; k++) {
        mask_bsr *f = NULL;
        int rc = mask_format_bsr_build(m, blocks[k][0], blocks[k][1], &f, &err);
        CHECK_MSG(rc == STOF_OK, "%s: %s", what, err.msg);
        if (rc)
            continue;
        CHECK_MSG(bsr_matches(f, m), "%s batch %d %dx%d at (%d, %d)", what, m->batch, m->q_len,
                  m->k_len, blocks[k][0], blocks[k][1]);
        mask_format_bsr_free(f);
    }
    mask_csr *c = NULL;
    int rc = mask_format_csr_build(m, &c, &err);
    CHECK_MSG(rc == STOF_OK, "%s: %s", what, err.msg);
    if (!rc)
        CHECK_MSG(csr_matches(c, m), "%s csr %dx%d", what, m->q_len, m->k_len);
    mask_format_csr_free(c);
}

static void test_shared_masks(void) {
    util_rng rng = {42};
    for (int g = 0; g < GEN_COUNT; g++) {
        for (int qi = 0; qi < N_SIZES; qi++) {
            for (int ki = 0; ki < N_SIZES; ki++) {
                mask *m = tmask_new(1, sizes[qi], sizes[ki]);
                gen_fill(m, 0, (gen_kind)g, &rng);
                check_mask_formats(m, gen_name((gen_kind)g));
                tmask_free(m);
            }
        }
    }
}

/* Three batches with different patterns: each batch's rows must come back,
 * not batch 0's pattern everywhere. */
static void test_per_batch_masks(void) {
    util_rng rng = {7};
    static const int shapes[][2] = {{100, 129}, {257, 64}, {1000, 1000}, {17, 1}};
    for (int s = 0; s < 4; s++) {
        mask *m = tmask_new(3, shapes[s][0], shapes[s][1]);
        gen_fill(m, 0, GEN_BAND, &rng);
        gen_fill(m, 1, GEN_BLOCKS, &rng);
        gen_fill(m, 2, GEN_SCATTERED, &rng);
        check_mask_formats(m, "per-batch");
        tmask_free(m);
    }
    /* Batch 1 empty, batch 2 full: their row pointers must differ. */
    mask *m = tmask_new(3, 64, 64);
    gen_fill(m, 0, GEN_CAUSAL, &rng);
    for (int i = 0; i < 64; i++)
        tmask_set_range(m, 2, i, 0, 64);
    stof_error err = {0};
    mask_bsr *f = NULL;
    CHECK(mask_format_bsr_build(m, 16, 16, &f, &err) == STOF_OK);
    if (f) {
        int R = f->n_block_rows;
        const int32_t *p0 = f->load_row_ptr + mask_format_bsr_row_base(f, 0);
        const int32_t *p1 = f->load_row_ptr + mask_format_bsr_row_base(f, 1);
        const int32_t *p2 = f->load_row_ptr + mask_format_bsr_row_base(f, 2);
        CHECK_EQ_INT(p0[R] - p0[0], 10); /* causal 4x4 blocks: 4 + 3 + 2 + 1 */
        CHECK_EQ_INT(p1[R] - p1[0], 0);
        CHECK_EQ_INT(p2[R] - p2[0], 16);
        CHECK_EQ_INT(f->n_part_masks, 1); /* the causal diagonal block, stored once */
        CHECK_EQ_INT(f->n_part, 4);
    }
    mask_format_bsr_free(f);
    tmask_free(m);
}

/* A hand-checked case: Figure 6 scaled by 16 (8x8 elements in blocks of 2
 * become 128x128 in blocks of 32), a causal mask of 128 at 32x32. */
static void test_causal_by_hand(void) {
    mask *m = tmask_new(1, 128, 128);
    gen_causal(m, 0, NULL);
    stof_error err = {0};
    mask_bsr *f = NULL;
    CHECK(mask_format_bsr_build(m, 32, 32, &f, &err) == STOF_OK);
    if (f) {
        static const int32_t full_ptr[] = {0, 0, 1, 3, 6}, part_ptr[] = {0, 1, 2, 3, 4};
        static const int32_t load_ptr[] = {0, 1, 3, 6, 10};
        static const int32_t load_col[] = {0, 0, 1, 0, 1, 2, 0, 1, 2, 3};
        CHECK(!memcmp(f->full_row_ptr, full_ptr, sizeof full_ptr));
        CHECK(!memcmp(f->part_row_ptr, part_ptr, sizeof part_ptr));
        CHECK(!memcmp(f->load_row_ptr, load_ptr, sizeof load_ptr));
        CHECK(!memcmp(f->load_col_idx, load_col, sizeof load_col));
        CHECK_EQ_INT(f->n_part_masks, 1);
        CHECK_EQ_INT(f->part_masks[0], 1);           /* row 0: column 0 only */
        CHECK_EQ_INT(f->part_masks[31], 0xffffffffu); /* row 31: all 32 columns */
        mask_bsr_stats st;
        mask_format_bsr_stats(f, &st);
        CHECK_EQ_INT(st.blocks, 16);
        CHECK_EQ_INT(st.full, 6);
        CHECK_EQ_INT(st.partial, 4);
        CHECK_EQ_INT(st.loaded, 10);
        CHECK_EQ_INT(st.empty, 6);
        CHECK_EQ_INT(st.distinct_bitmaps, 1);
        CHECK_NEAR(st.load_ratio, 10.0 / 16.0, 1e-12);
        CHECK_EQ_INT(st.bitmap_bytes, 32 * 4);
    }
    mask_format_bsr_free(f);
    tmask_free(m);
}

/* Bits past k_len in the last word (a sloppy producer) must not leak into
 * any format. */
static void test_stray_tail_bits(void) {
    mask *m = tmask_new(1, 20, 70);
    for (int i = 0; i < 20; i++)
        tmask_row(m, 0, i)[1] = ~0ULL; /* columns 64..69 allowed, 70..127 stray */
    stof_error err = {0};
    mask_bsr *f = NULL;
    mask_csr *c = NULL;
    CHECK(mask_format_bsr_build(m, 16, 16, &f, &err) == STOF_OK);
    CHECK(mask_format_csr_build(m, &c, &err) == STOF_OK);
    if (f) {
        CHECK(bsr_matches(f, m)); /* the brute force reads in-range bits only */
        /* Block column 4 (columns 64..79, in range 64..69) in both block rows,
         * full on its in-range elements; stray bits would make it partial. */
        CHECK_EQ_INT(f->n_load, 2);
        CHECK_EQ_INT(f->n_full, 2);
        CHECK_EQ_INT(f->n_part, 0);
    }
    if (c) {
        CHECK_EQ_INT(c->nnz, 20 * 6);
        CHECK(csr_matches(c, m));
    }
    mask_format_bsr_free(f);
    mask_format_csr_free(c);
    /* Now partial blocks: a checkerboard with stray bits everywhere past k_len. */
    for (int i = 0; i < 20; i++)
        for (int w = 0; w < 2; w++)
            tmask_row(m, 0, i)[w] = i % 2 ? 0x5555555555555555ULL : 0xaaaaaaaaaaaaaaaaULL;
    for (int k = 0; k < N_BLOCKS; k++) {
        CHECK(mask_format_bsr_build(m, blocks[k][0], blocks[k][1], &f, &err) == STOF_OK);
        if (f)
            CHECK(bsr_matches(f, m));
        mask_format_bsr_free(f);
    }
    CHECK(mask_format_csr_build(m, &c, &err) == STOF_OK);
    if (c)
        CHECK(csr_matches(c, m));
    mask_format_csr_free(c);
    tmask_free(m);
}

static void test_errors(void) {
    stof_error err = {0};
    mask_bsr *f = (mask_bsr *)1;
    mask *m = tmask_new(1, 64, 64);
    static const int bad[] = {0, -16, 8, 24, 40, 272, 1 << 30};
    for (int k = 0; k < (int)(sizeof bad / sizeof bad[0]); k++) {
        CHECK_EQ_INT(mask_format_bsr_build(m, bad[k], 64, &f, &err), STOF_ERR_INVALID);
        CHECK(f == NULL);
        CHECK_CONTAINS(err.msg, "block_m must be a positive multiple of 16 up to 256");
        CHECK_EQ_INT(mask_format_bsr_build(m, 64, bad[k], &f, &err), STOF_ERR_INVALID);
        CHECK_CONTAINS(err.msg, "block_n");
    }
    CHECK_EQ_INT(mask_format_bsr_build(m, 256, 256, &f, &err), STOF_OK);
    mask_format_bsr_free(f);
    CHECK_EQ_INT(mask_format_bsr_build(NULL, 16, 16, &f, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "no mask");
    m->words = 2;
    CHECK_EQ_INT(mask_format_bsr_build(m, 16, 16, &f, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "words per row");
    m->words = 1;
    m->q_len = 0;
    mask_csr *c = (mask_csr *)1;
    CHECK_EQ_INT(mask_format_csr_build(m, &c, &err), STOF_ERR_INVALID);
    CHECK(c == NULL);
    CHECK_CONTAINS(err.msg, "shape must be positive");
    m->q_len = 64;
    /* Absurd sizes are refused before anything is allocated (the words are
     * never read): 2^31 rows of 2^31 columns at 16x16. */
    mask huge = *m;
    huge.batch = 1 << 20;
    huge.q_len = 1 << 30;
    huge.k_len = 1 << 30;
    huge.words = (1 << 30) / 64;
    CHECK_EQ_INT(mask_format_bsr_build(&huge, 16, 16, &f, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "do not fit int32");
    tmask_free(m);
}

/* BigBird at 4096 (Table 2 defaults: global = band = sqrt(4096) = 64,
 * random 64x64 blocks kept with probability 0.1), filled row by row. */
static mask *bigbird_4096(void) {
    const int n = 4096, g = 64, band = 64, blk = 64;
    mask *m = tmask_new(1, n, n);
    for (int i = 0; i < n; i++) {
        uint64_t *row = tmask_row(m, 0, i);
        if (i < g) {
            memset(row, 0xff, (size_t)m->words * sizeof(uint64_t));
            continue;
        }
        row[0] = ~0ULL; /* global columns 0..63 */
        tmask_set_range(m, 0, i, i - band, i + band + 1);
        for (int bj = 0; bj < n / blk; bj++) {
            if (util_uniform(0xb16b1dULL, (uint64_t)(i / blk) * 1024 + bj) < 0.1f)
                memset(row + bj, 0xff, sizeof(uint64_t)); /* blk == 64: one word */
        }
    }
    return m;
}

static void test_bigbird_timing(void) {
    mask *m = bigbird_4096();
    stof_error err = {0};
    mask_bsr *f = NULL;
    double t0 = util_cpu_now();
    int rc = mask_format_bsr_build(m, 64, 64, &f, &err);
    double t_bsr = util_cpu_now() - t0;
    CHECK(rc == STOF_OK);
    mask_bsr *f16 = NULL;
    t0 = util_cpu_now();
    rc = mask_format_bsr_build(m, 16, 16, &f16, &err);
    double t_bsr16 = util_cpu_now() - t0;
    CHECK(rc == STOF_OK);
    mask_csr *c = NULL;
    t0 = util_cpu_now();
    rc = mask_format_csr_build(m, &c, &err);
    double t_csr = util_cpu_now() - t0;
    CHECK(rc == STOF_OK);
    if (f && f16 && c) {
        mask_bsr_stats st;
        mask_format_bsr_stats(f, &st);
        printf("bigbird 4096: BSR (64, 64) %.2f ms (%lld full, %lld partial, %lld distinct "
               "bitmaps), BSR (16, 16) %.2f ms (%d loaded), CSR %.2f ms (%lld nnz)\n",
               t_bsr * 1e3, (long long)st.full, (long long)st.partial,
               (long long)st.distinct_bitmaps, t_bsr16 * 1e3, f16->n_load, t_csr * 1e3,
               (long long)c->nnz);
        CHECK_MSG(t_bsr < 0.3, "BSR (64, 64) took %.1f ms", t_bsr * 1e3);
        CHECK(bsr_reconstructs(f, m, 0));
        CHECK(bsr_reconstructs(f16, m, 0));
    }
    mask_format_bsr_free(f);
    mask_format_bsr_free(f16);
    mask_format_csr_free(c);
    tmask_free(m);
}

int main(void) {
    test_causal_by_hand();
    test_stray_tail_bits();
    test_shared_masks();
    test_per_batch_masks();
    test_errors();
    test_bigbird_timing();
    return check_summary("test_mask_format");
}
