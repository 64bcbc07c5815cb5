/* Masks, the parts that are not building or text: the spec tree (construct,
 * clone, free, validate), the mask object (allocate, from dense, free,
 * fingerprint), row bit helpers, statistics and the PNG heatmap.
 * Building lives in mask_build.c, the text form in mask_parse.c. */
#include "ops/mask.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/base/util.h"
#include "ops/canvas.h"
#include "ops/png.h"

/* ---- names ---------------------------------------------------------------- */

/* The names of the text form (mask_parse.c reads them through this table). */
const char *mask_kind_name(mask_kind k) {
    switch (k) {
    case MASK_DENSE_ALL: return "full";
    case MASK_CAUSAL: return "causal";
    case MASK_SLIDING: return "sliding_window";
    case MASK_DILATED: return "dilated";
    case MASK_GLOBAL: return "global";
    case MASK_RANDOM: return "random";
    case MASK_LONGFORMER: return "longformer";
    case MASK_BIGBIRD: return "bigbird";
    case MASK_UNION: return "union";
    case MASK_INTERSECT: return "intersect";
    case MASK_KEY_PADDING: return "key_padding";
    case MASK_PER_BATCH: return "per_batch";
    case MASK_PREDICATE: return "predicate";
    case MASK_KIND_COUNT: break;
    }
    return "unknown";
}

int mask_default_width(int k_len) {
    return (int)lround(sqrt((double)(k_len > 0 ? k_len : 0)));
}

/* ---- the spec tree -------------------------------------------------------- */

mask_spec *mask_spec_new(mask_kind kind) {
    mask_spec *s = calloc(1, sizeof *s);
    if (s)
        s->kind = kind;
    return s;
}

mask_spec *mask_spec_combine(mask_kind kind, mask_spec **children, int n) {
    mask_spec *s = mask_spec_new(kind);
    mask_spec **own = n > 0 ? malloc((size_t)n * sizeof *own) : NULL;
    if (!s || (n > 0 && !own)) {
        for (int c = 0; c < n; c++)
            mask_spec_free(children[c]);
        free(own);
        free(s);
        return NULL;
    }
    if (n > 0)
        memcpy(own, children, (size_t)n * sizeof *own);
    s->children = own;
    s->n_children = n > 0 ? n : 0;
    return s;
}

void mask_spec_free(mask_spec *s) {
    if (!s)
        return;
    for (int c = 0; c < s->n_children; c++)
        mask_spec_free(s->children[c]);
    free(s->children);
    free(s->lengths);
    free(s->pred_name);
    free(s);
}

static char *mask_strdup(const char *t) {
    size_t n = strlen(t) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, t, n);
    return d;
}

mask_spec *mask_spec_clone(const mask_spec *s) {
    if (!s)
        return NULL;
    mask_spec *c = malloc(sizeof *c);
    if (!c)
        return NULL;
    *c = *s;
    c->lengths = NULL;
    c->children = NULL;
    c->n_children = 0;
    c->pred_name = NULL;
    int ok = 1;
    if (s->n_lengths > 0 && s->lengths) {
        c->lengths = malloc((size_t)s->n_lengths * sizeof *c->lengths);
        ok = c->lengths != NULL;
        if (ok)
            memcpy(c->lengths, s->lengths, (size_t)s->n_lengths * sizeof *c->lengths);
    }
    if (ok && s->pred_name)
        ok = (c->pred_name = mask_strdup(s->pred_name)) != NULL;
    if (ok && s->n_children > 0) {
        c->children = calloc((size_t)s->n_children, sizeof *c->children);
        ok = c->children != NULL;
        /* n_children grows with each clone, so a failure frees exactly those. */
        for (int k = 0; ok && k < s->n_children; k++) {
            c->children[k] = mask_spec_clone(s->children[k]);
            ok = c->children[k] != NULL || s->children[k] == NULL;
            c->n_children = k + 1;
        }
    }
    if (!ok) {
        mask_spec_free(c);
        return NULL;
    }
    return c;
}

static int mask_check_nonnegative(const mask_spec *s, const char *key, int v,
                                  stof_error *err) {
    if (v < 0)
        return err_set(err, STOF_ERR_INVALID, "%s: %s must be >= 0, got %d (0 means the default)",
                       mask_kind_name(s->kind), key, v);
    return STOF_OK;
}

static int mask_validate_random(const mask_spec *s, stof_error *err) {
    int rc = mask_check_nonnegative(s, "block", s->block, err);
    if (rc != STOF_OK)
        return rc;
    if (!(s->rate >= 0.0 && s->rate <= 1.0)) /* NaN fails too */
        return err_set(err, STOF_ERR_INVALID, "%s: rate must be in [0, 1], got %g",
                       mask_kind_name(s->kind), s->rate);
    return STOF_OK;
}

static int mask_validate_numbers(const mask_spec *s, stof_error *err) {
    mask_kind k = s->kind;
    int has_band = k == MASK_SLIDING || k == MASK_DILATED || k == MASK_LONGFORMER ||
                   k == MASK_BIGBIRD;
    int has_global = k == MASK_GLOBAL || k == MASK_LONGFORMER || k == MASK_BIGBIRD;
    int rc = STOF_OK;
    if (has_band && (rc = mask_check_nonnegative(s, "band", s->band, err)) != STOF_OK)
        return rc;
    if (k == MASK_DILATED &&
        (rc = mask_check_nonnegative(s, "dilation", s->dilation, err)) != STOF_OK)
        return rc;
    /* The global pattern calls its width "width"; the combined ones "global". */
    if (has_global && (rc = mask_check_nonnegative(s, k == MASK_GLOBAL ? "width" : "global",
                                                   s->global, err)) != STOF_OK)
        return rc;
    if (k == MASK_RANDOM || k == MASK_BIGBIRD)
        return mask_validate_random(s, err);
    return STOF_OK;
}

static int mask_validate_node(const mask_spec *s, int depth, stof_error *err);

static int mask_validate_children(const mask_spec *s, int depth, stof_error *err) {
    if (s->n_children < 1 || !s->children)
        return err_set(err, STOF_ERR_INVALID, "%s needs at least one child pattern",
                       mask_kind_name(s->kind));
    for (int c = 0; c < s->n_children; c++) {
        if (!s->children[c])
            return err_set(err, STOF_ERR_INVALID, "%s: child %d is NULL",
                           mask_kind_name(s->kind), c);
        int rc = mask_validate_node(s->children[c], depth + 1, err);
        if (rc != STOF_OK)
            return rc;
    }
    return STOF_OK;
}

static int mask_validate_lengths(const mask_spec *s, stof_error *err) {
    if (s->n_lengths < 1 || !s->lengths)
        return err_set(err, STOF_ERR_INVALID, "key_padding needs lengths (one per batch, or one)");
    if (s->n_lengths > MASK_MAX_LEN)
        return err_set(err, STOF_ERR_INVALID, "key_padding: %d lengths is more than the %d allowed",
                       s->n_lengths, MASK_MAX_LEN);
    for (int b = 0; b < s->n_lengths; b++)
        if (s->lengths[b] < 0)
            return err_set(err, STOF_ERR_INVALID, "key_padding: lengths[%d] must be >= 0, got %d",
                           b, s->lengths[b]);
    return STOF_OK;
}

static int mask_validate_node(const mask_spec *s, int depth, stof_error *err) {
    if (depth > MASK_MAX_DEPTH)
        return err_set(err, STOF_ERR_INVALID, "mask pattern nested deeper than %d levels",
                       MASK_MAX_DEPTH);
    if ((int)s->kind < 0 || s->kind >= MASK_KIND_COUNT)
        return err_set(err, STOF_ERR_INVALID, "unknown mask kind %d", (int)s->kind);
    switch (s->kind) {
    case MASK_UNION:
    case MASK_INTERSECT:
    case MASK_PER_BATCH:
        return mask_validate_children(s, depth, err);
    case MASK_KEY_PADDING:
        return mask_validate_lengths(s, err);
    case MASK_PREDICATE:
        if (!s->pred)
            return err_set(err, STOF_ERR_INVALID, "predicate mask has no function");
        return STOF_OK;
    default:
        return mask_validate_numbers(s, err);
    }
}

int mask_spec_validate(const mask_spec *s, stof_error *err) {
    if (!s)
        return err_set(err, STOF_ERR_INVALID, "mask pattern is NULL");
    return mask_validate_node(s, 0, err);
}

int mask_spec_is_per_batch(const mask_spec *s) {
    if (!s)
        return 0;
    if (s->kind == MASK_PER_BATCH || (s->kind == MASK_KEY_PADDING && s->n_lengths > 1))
        return 1;
    for (int c = 0; c < s->n_children; c++)
        if (mask_spec_is_per_batch(s->children[c]))
            return 1;
    return 0;
}

int mask_random_block_kept(uint64_t seed, double rate, int block_row, int block_col) {
    uint64_t index = ((uint64_t)(uint32_t)block_row << 32) | (uint32_t)block_col;
    return (double)util_uniform(seed, index) < rate;
}

/* ---- row helpers ---------------------------------------------------------- */

/* Bits lo..63 of a word, and bits 0..last of a word. */
static uint64_t mask_bits_from(int lo) {
    return ~0ULL << (lo & 63);
}
static uint64_t mask_bits_upto(int last) {
    return ~0ULL >> (63 - (last & 63));
}

void mask_row_set_range(uint64_t *row, int lo, int hi) {
    if (lo >= hi)
        return;
    int w0 = lo >> 6, w1 = (hi - 1) >> 6;
    if (w0 == w1) {
        row[w0] |= mask_bits_from(lo) & mask_bits_upto(hi - 1);
        return;
    }
    row[w0] |= mask_bits_from(lo);
    for (int w = w0 + 1; w < w1; w++)
        row[w] = ~0ULL;
    row[w1] |= mask_bits_upto(hi - 1);
}

int mask_row_count_range(const uint64_t *row, int lo, int hi) {
    if (lo >= hi)
        return 0;
    int w0 = lo >> 6, w1 = (hi - 1) >> 6;
    if (w0 == w1)
        return __builtin_popcountll(row[w0] & mask_bits_from(lo) & mask_bits_upto(hi - 1));
    int n = __builtin_popcountll(row[w0] & mask_bits_from(lo));
    for (int w = w0 + 1; w < w1; w++)
        n += __builtin_popcountll(row[w]);
    return n + __builtin_popcountll(row[w1] & mask_bits_upto(hi - 1));
}

/* ---- the mask object ------------------------------------------------------ */

static int mask_check_dim(const char *what, int v, stof_error *err) {
    if (v <= 0 || v > MASK_MAX_LEN)
        return err_set(err, STOF_ERR_INVALID, "mask: %s must be in 1..%d, got %d", what,
                       MASK_MAX_LEN, v);
    return STOF_OK;
}

int mask_alloc(int batch, int q_len, int k_len, mask **out, stof_error *err) {
    int rc;
    if (!out)
        return err_set(err, STOF_ERR_INVALID, "mask: output pointer is NULL");
    *out = NULL;
    if ((rc = mask_check_dim("batch", batch, err)) != STOF_OK ||
        (rc = mask_check_dim("q_len", q_len, err)) != STOF_OK ||
        (rc = mask_check_dim("k_len", k_len, err)) != STOF_OK)
        return rc;
    int words = (k_len + 63) / 64;
    /* Each factor is <= 2^20, so the product fits easily in 64 bits. */
    uint64_t bytes = (uint64_t)batch * (uint64_t)q_len * (uint64_t)words * 8u;
    if (bytes > MASK_MAX_BYTES)
        return err_set(err, STOF_ERR_INVALID,
                       "mask: %d x %d x %d needs %.1f GiB of bits, over the %.0f GiB limit",
                       batch, q_len, k_len, (double)bytes / (1 << 30),
                       (double)MASK_MAX_BYTES / (1 << 30));
    mask *m = err_calloc(1, sizeof *m, err);
    if (!m)
        return STOF_ERR_NOMEM;
    m->bits = err_calloc((size_t)bytes / 8, sizeof *m->bits, err);
    m->desc = err_calloc(1, 1, err);
    if (!m->bits || !m->desc) {
        mask_free(m);
        return STOF_ERR_NOMEM;
    }
    m->batch = batch;
    m->q_len = q_len;
    m->k_len = k_len;
    m->words = words;
    *out = m;
    return STOF_OK;
}

int mask_copy(const mask *m, mask **out, stof_error *err) {
    int rc = mask_alloc(m->batch, m->q_len, m->k_len, out, err);
    if (rc)
        return rc;
    mask *c = *out;
    memcpy(c->bits, m->bits, sizeof *m->bits * (size_t)m->batch * (size_t)m->q_len *
                                 (size_t)m->words);
    free(c->desc);
    c->desc = err_malloc(strlen(m->desc ? m->desc : "") + 1, err);
    if (!c->desc) {
        mask_free(c);
        *out = NULL;
        return STOF_ERR_NOMEM;
    }
    strcpy(c->desc, m->desc ? m->desc : "");
    c->fingerprint = m->fingerprint;
    return STOF_OK;
}

void mask_free(mask *m) {
    if (!m)
        return;
    free(m->bits);
    free(m->desc);
    free(m);
}

uint64_t mask_compute_fingerprint(const mask *m) {
    int32_t shape[3] = {m->batch, m->q_len, m->k_len};
    uint64_t h = util_hash(UTIL_HASH_SEED, shape, sizeof shape);
    size_t n = (size_t)m->batch * (size_t)m->q_len * (size_t)m->words;
    return util_hash(h, m->bits, n * sizeof *m->bits);
}

int mask_from_dense(const uint8_t *dense, int batch, int q_len, int k_len, const char *desc,
                    mask **out, stof_error *err) {
    if (!dense)
        return err_set(err, STOF_ERR_INVALID, "mask_from_dense: dense array is NULL");
    mask *m = NULL;
    int rc = mask_alloc(batch, q_len, k_len, &m, err);
    if (rc != STOF_OK)
        return rc;
    char *d = mask_strdup(desc ? desc : "dense");
    if (!d) {
        mask_free(m);
        return err_set(err, STOF_ERR_NOMEM, "out of host memory (mask description)");
    }
    free(m->desc);
    m->desc = d;
    for (int64_t r = 0; r < (int64_t)batch * q_len; r++) {
        const uint8_t *src = dense + r * k_len;
        uint64_t *row = m->bits + r * m->words;
        for (int j = 0; j < k_len; j++)
            if (src[j])
                row[j >> 6] |= 1ULL << (j & 63);
    }
    m->fingerprint = mask_compute_fingerprint(m);
    *out = m;
    return STOF_OK;
}

/* ---- statistics ----------------------------------------------------------- */

static int64_t mask_block_count(const mask *m, int b, int r0, int r1, int c0, int c1) {
    int64_t n = 0;
    for (int i = r0; i < r1; i++)
        n += mask_row_count_range(mask_row(m, b, i), c0, c1);
    return n;
}

static void mask_count_blocks(const mask *m, mask_stats *st) {
    int bm = st->block_m, bn = st->block_n;
    for (int b = 0; b < m->batch; b++) {
        for (int r0 = 0; r0 < m->q_len; r0 += bm) {
            int r1 = r0 + bm < m->q_len ? r0 + bm : m->q_len;
            for (int c0 = 0; c0 < m->k_len; c0 += bn) {
                int c1 = c0 + bn < m->k_len ? c0 + bn : m->k_len;
                int64_t n = mask_block_count(m, b, r0, r1, c0, c1);
                if (n == 0)
                    st->empty_blocks++;
                else if (n == (int64_t)(r1 - r0) * (c1 - c0))
                    st->full_blocks++;
                else
                    st->partial_blocks++;
            }
        }
    }
}

void mask_compute_stats(const mask *m, int block_m, int block_n, mask_stats *st) {
    if (!st)
        return;
    memset(st, 0, sizeof *st);
    st->block_m = block_m;
    st->block_n = block_n;
    if (!m)
        return;
    for (int b = 0; b < m->batch; b++) {
        for (int i = 0; i < m->q_len; i++) {
            int n = mask_row_count_range(mask_row(m, b, i), 0, m->k_len);
            st->nnz += n;
            st->empty_rows += n == 0;
        }
    }
    st->density = (double)st->nnz / ((double)m->batch * m->q_len * m->k_len);
    if (block_m > 0 && block_n > 0)
        mask_count_blocks(m, st);
}

/* ---- the PNG heatmap ------------------------------------------------------ */

#define MASK_PNG_MAX_PX 16384
#define MASK_PNG_GRID_GRAY 176 /* lines are blended 3/4 toward this gray */
#define MASK_PNG_MIN_GRID_PX 3 /* grid lines closer than this would hide the mask */

/* The element range [*lo, *hi) that pixel p of n covers along a side of len
 * elements: a partition when downscaling (n <= len), one element repeated
 * when upscaling (n = len x factor). */
static void mask_png_span(int p, int n, int len, int *lo, int *hi) {
    *lo = (int)((int64_t)p * len / n);
    int h = (int)((int64_t)(p + 1) * len / n);
    *hi = h > *lo ? h : *lo + 1;
}

/* Whether a grid boundary (a multiple of grid) falls at pixel p's first element. */
static int mask_png_on_grid(int p, int n, int len, int grid) {
    if (p == 0)
        return 0;
    int lo, hi, plo, phi;
    mask_png_span(p, n, len, &lo, &hi);
    mask_png_span(p - 1, n, len, &plo, &phi);
    return lo / grid > plo / grid;
}

static uint8_t mask_png_shade(const mask *m, int b, int r0, int r1, int c0, int c1) {
    int64_t allowed = 0;
    for (int i = r0; i < r1; i++)
        allowed += mask_row_count_range(mask_row(m, b, i), c0, c1);
    double share = (double)allowed / ((double)(r1 - r0) * (c1 - c0));
    return (uint8_t)lround(255.0 * (1.0 - share)); /* dark = allowed */
}

static void mask_png_render(const mask *m, int b, int w, int h, int grid, uint8_t *px) {
    int grid_x = grid > 0 && (int64_t)grid * w >= (int64_t)MASK_PNG_MIN_GRID_PX * m->k_len;
    int grid_y = grid > 0 && (int64_t)grid * h >= (int64_t)MASK_PNG_MIN_GRID_PX * m->q_len;
    for (int y = 0; y < h; y++) {
        int r0, r1;
        mask_png_span(y, h, m->q_len, &r0, &r1);
        int line_y = grid_y && mask_png_on_grid(y, h, m->q_len, grid);
        for (int x = 0; x < w; x++) {
            int c0, c1;
            mask_png_span(x, w, m->k_len, &c0, &c1);
            int v = mask_png_shade(m, b, r0, r1, c0, c1);
            if (line_y || (grid_x && mask_png_on_grid(x, w, m->k_len, grid)))
                v = (v + 3 * MASK_PNG_GRID_GRAY) / 4;
            px[(size_t)y * w + x] = (uint8_t)v;
        }
    }
}

/* Heatmap size: the longer side at most max_px (0: one pixel an element up
 * to MASK_PNG_AUTO_MAX, at least about MASK_PNG_AUTO_MIN); small masks are
 * enlarged by a whole factor so that every element stays a square of
 * pixels. */
#define MASK_PNG_AUTO_MAX 4096
#define MASK_PNG_AUTO_MIN 512
static void mask_png_size(const mask *m, int max_px, int *w, int *h) {
    int longer = m->q_len > m->k_len ? m->q_len : m->k_len;
    if (max_px == 0)
        max_px = longer > MASK_PNG_AUTO_MAX   ? MASK_PNG_AUTO_MAX
                 : longer < MASK_PNG_AUTO_MIN ? MASK_PNG_AUTO_MIN
                                              : longer;
    if (longer <= max_px) {
        int f = max_px / longer;
        *w = m->k_len * f;
        *h = m->q_len * f;
        return;
    }
    *w = (int)((int64_t)m->k_len * max_px / longer);
    *h = (int)((int64_t)m->q_len * max_px / longer);
    *w = *w > 0 ? *w : 1;
    *h = *h > 0 ? *h : 1;
}

/* ---- the figure around the heatmap ---------------------------------------- */

typedef struct mask_fig {
    int s;                 /* text scale */
    int left, top, right, bottom; /* margins */
    int w, h;              /* the heatmap */
} mask_fig;

#define MASK_FIG_TICKS 5
#define MASK_FIG_TICK_PX 6

/* Element t/(TICKS-1) of the way along a side of len. */
static int mask_fig_tick(int t, int len) {
    int v = (int)((int64_t)t * len / (MASK_FIG_TICKS - 1));
    return v < len ? v : len;
}

static void mask_fig_layout(const mask *m, int w, int h, mask_fig *f) {
    f->w = w;
    f->h = h;
    int longer = w > h ? w : h;
    f->s = longer >= 1024 ? 3 : longer >= 384 ? 2 : 1;
    char num[24];
    snprintf(num, sizeof num, "%d", m->q_len);
    int line = CANVAS_TEXT_HEIGHT * f->s, gap = 4 * f->s;
    f->left = gap + line + gap + canvas_text_width(num, f->s) + gap + MASK_FIG_TICK_PX;
    f->bottom = MASK_FIG_TICK_PX + gap + line + gap + line + gap;
    f->top = gap + line + gap + line + gap;
    f->right = gap + 2 * line + gap + canvas_text_width("part allowed", f->s) + gap;
}

static void mask_fig_axes(canvas *c, const mask *m, const mask_fig *f) {
    int s = f->s, line = CANVAS_TEXT_HEIGHT * s, gap = 4 * s;
    int x0 = f->left, y0 = f->top;
    canvas_frame(c, x0, y0, f->w, f->h, s, 0);
    char num[24];
    for (int t = 0; t < MASK_FIG_TICKS; t++) {
        int j = mask_fig_tick(t, m->k_len), i = mask_fig_tick(t, m->q_len);
        int x = x0 + (int)((int64_t)j * f->w / m->k_len), y = y0 + (int)((int64_t)i * f->h / m->q_len);
        canvas_rect(c, x - s / 2, y0 + f->h + s, s, MASK_FIG_TICK_PX, 0);
        snprintf(num, sizeof num, "%d", j);
        int tw = canvas_text_width(num, s);
        int tx = t == 0 ? x : t == MASK_FIG_TICKS - 1 ? x - tw : x - tw / 2;
        canvas_text(c, tx, y0 + f->h + s + MASK_FIG_TICK_PX + gap, num, s, 0, 0);
        canvas_rect(c, x0 - s - MASK_FIG_TICK_PX, y - s / 2, MASK_FIG_TICK_PX, s, 0);
        snprintf(num, sizeof num, "%d", i);
        int ty = t == 0 ? y : t == MASK_FIG_TICKS - 1 ? y - line : y - line / 2;
        canvas_text(c, x0 - s - MASK_FIG_TICK_PX - gap - canvas_text_width(num, s), ty, num, s,
                    0, 0);
    }
    const char *xl = "key j";
    canvas_text(c, x0 + (f->w - canvas_text_width(xl, s)) / 2,
                y0 + f->h + s + MASK_FIG_TICK_PX + gap + line + gap, xl, s, 0, 0);
    const char *yl = "query i";
    canvas_text(c, gap, y0 + (f->h + canvas_text_width(yl, s)) / 2, yl, s, 1, 0);
}

/* The title (the mask's description, cut to the width) and batch. */
static void mask_fig_title(canvas *c, const mask *m, int b, const mask_fig *f) {
    int s = f->s, gap = 4 * s, line = CANVAS_TEXT_HEIGHT * s;
    char title[256];
    snprintf(title, sizeof title, "%s", m->desc ? m->desc : "mask");
    int room = (c->w - 2 * gap) / (6 * s);
    if (room > 3 && (int)strlen(title) > room)
        snprintf(title + room - 3, sizeof title - (size_t)(room - 3), "...");
    canvas_text(c, gap, gap, title, s, 0, 0);
    char sub[96];
    snprintf(sub, sizeof sub, "%d x %d, batch %d%s", m->q_len, m->k_len, b,
             m->batch > 1 ? " (one mask per batch)" : "");
    canvas_text(c, gap, gap + line + gap, sub, s, 0, 0);
}

/* Swatches: allowed (dark), masked (white), in between where a pixel
 * covers both (downscaled). */
static void mask_fig_legend(canvas *c, const mask_fig *f, int downscaled) {
    int s = f->s, line = CANVAS_TEXT_HEIGHT * s, gap = 4 * s;
    int x = f->left + f->w + s + gap, y = f->top;
    static const char *const names[] = {"allowed", "masked", "part allowed"};
    static const uint8_t shades[] = {0, 255, 128};
    for (int k = 0; k < (downscaled ? 3 : 2); k++) {
        int yy = y + k * (2 * line);
        canvas_rect(c, x, yy, line, line, shades[k]);
        canvas_frame(c, x, yy, line, line, 1, 0);
        canvas_text(c, x + line + gap, yy, names[k], s, 0, 0);
    }
}

void mask_png_placement(const mask *m, int max_px, mask_png_place *pl) {
    int w, h;
    mask_png_size(m, max_px, &w, &h);
    mask_fig f;
    mask_fig_layout(m, w, h, &f);
    *pl = (mask_png_place){f.left, f.top, w, h, f.left + w + f.right, f.top + h + f.bottom};
}

int mask_write_png(const mask *m, int b, const char *path, int max_px, int grid,
                   stof_error *err) {
    if (!m || !path)
        return err_set(err, STOF_ERR_INVALID, "mask_write_png: mask and path must not be NULL");
    if (b < 0 || (m->batch > 1 && b >= m->batch))
        return err_set(err, STOF_ERR_INVALID, "mask_write_png: batch %d is outside 0..%d", b,
                       m->batch - 1);
    if (max_px < 0 || max_px > MASK_PNG_MAX_PX)
        return err_set(err, STOF_ERR_INVALID, "mask_write_png: max_px must be in 0..%d (0: "
                       "automatic), got %d", MASK_PNG_MAX_PX, max_px);
    if (grid < 0)
        return err_set(err, STOF_ERR_INVALID, "mask_write_png: grid must be >= 0, got %d", grid);
    int w, h;
    mask_png_size(m, max_px, &w, &h);
    uint8_t *px = err_malloc((size_t)w * (size_t)h, err);
    if (!px)
        return STOF_ERR_NOMEM;
    mask_png_render(m, b, w, h, grid, px);
    mask_fig f;
    mask_fig_layout(m, w, h, &f);
    canvas c;
    int rc = canvas_init(&c, f.left + w + f.right, f.top + h + f.bottom, err);
    if (!rc) {
        for (int y = 0; y < h; y++)
            memcpy(c.px + (size_t)(f.top + y) * c.w + f.left, px + (size_t)y * w, (size_t)w);
        mask_fig_axes(&c, m, &f);
        mask_fig_title(&c, m, b, &f);
        mask_fig_legend(&c, &f, w < m->k_len || h < m->q_len);
        rc = png_write_gray(path, c.px, c.w, c.h, err);
    }
    canvas_free(&c);
    free(px);
    return rc;
}
