/* Attention masks: patterns (unsized descriptions) and materialized masks
 * (bit matrices for a given batch, query and key length).
 *
 * A mask_spec is a small tree: atomic patterns, union / intersection of
 * children, per-batch lists, key padding, or a predicate callback. Numeric
 * parameters left at 0 mean "the default for this sequence length" (paper
 * Table 2: band and global width = round(sqrt(k_len))), resolved when the spec
 * is built into a mask; negative ones are errors (details at the end). mask_build fills whole rows at a time, so building is
 * O(rows x words), not O(rows x cols), for every pattern but predicates. */
#ifndef STOF_OPS_MASK_H
#define STOF_OPS_MASK_H

#include <stdint.h>

#include "stof.h"

typedef enum mask_kind {
    MASK_DENSE_ALL = 0, /* every pair allowed */
    MASK_CAUSAL,        /* j <= i + (k_len - q_len) (bottom-right aligned) */
    MASK_SLIDING,       /* |i - j| <= band */
    MASK_DILATED,       /* |i - j| <= band * (dilation + 1) and (i - j) % (dilation + 1) == 0 */
    MASK_GLOBAL,        /* i < global or j < global */
    MASK_RANDOM,        /* blocks of block x block chosen with probability rate (seeded) */
    MASK_LONGFORMER,    /* global | sliding */
    MASK_BIGBIRD,       /* global | sliding | random */
    MASK_UNION,
    MASK_INTERSECT,
    MASK_KEY_PADDING,   /* j < lengths[b] */
    MASK_PER_BATCH,     /* children[b] for batch b */
    MASK_PREDICATE,     /* pred(ud, b, i, j) */
    MASK_KIND_COUNT
} mask_kind;

/* Returns 1 (allowed) or 0 (masked), or a negative stof_status on error
 * (the callback fills err). */
typedef int (*mask_predicate_fn)(void *ud, int b, int i, int j, stof_error *err);

typedef struct mask_spec {
    mask_kind kind;
    int band;          /* sliding, dilated, longformer, bigbird */
    int dilation;      /* dilated: gap between attended keys (Table 2: 1) */
    int global;        /* global, longformer, bigbird */
    int block;         /* random, bigbird */
    double rate;       /* random, bigbird: probability that a block is kept */
    uint64_t seed;     /* random, bigbird */
    int *lengths;      /* key padding: valid key count per batch (owned) */
    int n_lengths;
    struct mask_spec **children; /* union, intersect, per_batch (owned) */
    int n_children;
    mask_predicate_fn pred;      /* predicate: not owned */
    void *pred_ud;
    char *pred_name;             /* predicate: text for descriptions (owned) */
} mask_spec;

/* Constructors; NULL only when out of memory. */
mask_spec *mask_spec_new(mask_kind kind);
/* Takes ownership of the children (also on failure). */
mask_spec *mask_spec_combine(mask_kind kind, mask_spec **children, int n);
mask_spec *mask_spec_clone(const mask_spec *s);
void mask_spec_free(mask_spec *s);

/* Parses the text form "name{key=value, ...}" with names sliding_window,
 * dilated, global, random, longformer, bigbird, causal, full; and the
 * combinators "union(a, b, ...)", "intersect(a, b, ...)", "per_batch(a, b, ...)",
 * and "key_padding{lengths=[5, 7, 3]}". */
int mask_spec_parse(const char *text, mask_spec **out, stof_error *err);
/* Writes the text form that mask_spec_parse reads back (predicates appear as
 * "predicate{name=...}" and do not parse). Returns malloc'd text. */
char *mask_spec_describe(const mask_spec *s);
const char *mask_kind_name(mask_kind k);

/* A materialized mask. Row r of batch b is bits + (b * q_len + r) * words;
 * bit j of a row is word j / 64, bit j % 64. batch == 1 means shared by all
 * batches (the common case, stored once). */
typedef struct mask {
    int batch;
    int q_len, k_len;
    int words; /* uint64 words per row = ceil(k_len / 64) */
    uint64_t *bits;
    char *desc;           /* text form of the spec it came from */
    uint64_t fingerprint; /* hash of shape and bits */
} mask;

/* batch is the model's batch; the mask is shared (batch 1) unless the spec
 * needs per-batch rows (key padding, per_batch). */
int mask_build(const mask_spec *spec, int batch, int q_len, int k_len, mask **out,
               stof_error *err);
/* mask_spec_parse, then mask_build: a mask from its text form. */
int mask_build_text(const char *text, int batch, int q_len, int k_len, mask **out,
                    stof_error *err);
/* From a dense uint8 array [batch][q_len][k_len]. */
int mask_from_dense(const uint8_t *dense, int batch, int q_len, int k_len, const char *desc,
                    mask **out, stof_error *err);
void mask_free(mask *m);
/* A copy of m, bits, text form and fingerprint. */
int mask_copy(const mask *m, mask **out, stof_error *err);

static inline int mask_get(const mask *m, int b, int i, int j) {
    const uint64_t *row = m->bits + ((int64_t)(m->batch == 1 ? 0 : b) * m->q_len + i) * m->words;
    return (int)((row[j >> 6] >> (j & 63)) & 1u);
}
static inline const uint64_t *mask_row(const mask *m, int b, int i) {
    return m->bits + ((int64_t)(m->batch == 1 ? 0 : b) * m->q_len + i) * m->words;
}

typedef struct mask_stats {
    int64_t nnz;    /* allowed pairs, summed over the stored batches */
    double density; /* nnz / (stored batches x q_len x k_len) */
    int block_m, block_n;
    int64_t full_blocks, partial_blocks, empty_blocks; /* at (block_m, block_n) */
    int64_t empty_rows; /* query rows with no allowed key */
} mask_stats;

/* block_m or block_n <= 0 skips the block counts. Edge blocks (past q_len or
 * k_len) count as full when every in-range element is allowed. */
void mask_compute_stats(const mask *m, int block_m, int block_n, mask_stats *st);

/* A figure of batch b a person can read: the heatmap (allowed pairs dark on
 * white, block grid lines every grid elements, 0: none) inside axes, query
 * i down and key j across with ticks and numbers, the mask's description
 * as its title and a legend. The heatmap is at most max_px pixels a side
 * (0: automatic, one pixel an element up to 4096 and small masks enlarged
 * to about 512, so that a dilated mask's stripes show); downscaled, each
 * pixel shows the share of allowed pairs it covers. */
int mask_write_png(const mask *m, int b, const char *path, int max_px, int grid,
                   stof_error *err);

/* Where mask_write_png puts the heatmap of m in its figure (tests read it
 * back): its top-left corner and size, and the figure's size. */
typedef struct mask_png_place {
    int x, y, w, h;
    int width, height;
} mask_png_place;
void mask_png_placement(const mask *m, int max_px, mask_png_place *pl);


/* ---- helpers shared by the mask files and by format builders (CSR/BSR) ---
 *
 * Parameter rules, precisely: a parameter left at 0 takes its default when
 * the mask is built (band = global = mask_default_width(k_len), dilation 1,
 * block 32, rate 0.1, seed 0); a negative one is an error (so is a rate
 * outside [0, 1]). A rate of 0 therefore means "the default 0.1": use
 * longformer for no random blocks. mask_spec_describe omits parameters left
 * at 0, so the text form keeps "follows seq_len" defaults as defaults.
 *
 * Random blocks: block (r, c) of the ceil(q_len / block) x ceil(k_len / block)
 * grid is kept when util_uniform(seed, (uint64_t)r << 32 | c) < rate, a pure
 * function of (seed, r, c): reproducible and independent of evaluation order.
 *
 * Batches: a mask is stored per batch (m->batch == model batch) only when the
 * spec contains per_batch or a key_padding with more than one length (and the
 * model batch is > 1); otherwise it is stored once. A predicate cannot say
 * whether it depends on the batch, so it is taken as batch-independent and
 * called with b = 0, unless it sits under a per_batch node: there it is called
 * with the real batch index. */
#define MASK_DEFAULT_DILATION 1
#define MASK_DEFAULT_BLOCK 32
#define MASK_DEFAULT_RATE 0.1
#define MASK_MAX_LEN (1 << 20)               /* q_len, k_len, batch, lengths count */
#define MASK_MAX_BYTES (8ULL << 30)          /* bit storage of one mask */
#define MASK_MAX_DEPTH 64                    /* nesting of union / intersect / per_batch */

/* round(sqrt(k_len)): Table 2's band and global width (32 at 1024). */
int mask_default_width(int k_len);
/* Checks the parameters that do not depend on sizes (signs, rate, child
 * counts, predicate present); mask_build checks the rest. */
int mask_spec_validate(const mask_spec *s, stof_error *err);
/* 1 when the spec needs rows per batch (per_batch, key_padding with more
 * than one length). */
int mask_spec_is_per_batch(const mask_spec *s);
/* Whether block (block_row, block_col) of a random / bigbird pattern is kept. */
int mask_random_block_kept(uint64_t seed, double rate, int block_row, int block_col);

/* A zeroed mask of the given stored batch and shape (desc "", fingerprint 0),
 * with the size limits above checked. */
int mask_alloc(int batch, int q_len, int k_len, mask **out, stof_error *err);
/* util_hash over (batch, q_len, k_len, bits): what m->fingerprint holds. */
uint64_t mask_compute_fingerprint(const mask *m);

/* Row helpers: set bits [lo, hi) of a row, count the set bits in [lo, hi).
 * The caller clips lo and hi to [0, k_len]; lo >= hi does nothing / gives 0. */
void mask_row_set_range(uint64_t *row, int lo, int hi);
int mask_row_count_range(const uint64_t *row, int lo, int hi);

#endif
