/* mask_build: a spec tree into a bit matrix, one row at a time.
 *
 * The spec is first prepared into a tree of mask_node (defaults resolved for
 * this k_len, size-dependent checks done, per-node buffers allocated once),
 * then every row is filled by OR-ing word ranges into it: a structured
 * pattern costs O(words) per row, never O(k_len). Union and intersection fill
 * each child into the node's scratch row and OR / AND it in. */
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "ops/mask.h"

typedef struct mask_shape {
    int batch; /* the model's batch: what key padding and per_batch must match */
    int q_len, k_len, words;
} mask_shape;

typedef struct mask_node {
    const mask_spec *spec;
    /* parameters with the defaults resolved */
    int band, global, block;
    int64_t stride; /* dilated: dilation + 1 */
    double rate;
    uint64_t seed;
    int batch_aware;   /* predicate under per_batch: called with the real batch */
    uint64_t *combs;   /* dilated, stride <= 64: row r holds the bits j with j % stride == r */
    uint64_t *scratch; /* union, intersect: one row for the child being combined */
    struct mask_node *children;
    int n_children;
} mask_node;

static void mask_node_release(mask_node *n) {
    for (int c = 0; c < n->n_children; c++)
        mask_node_release(&n->children[c]);
    free(n->children);
    free(n->combs);
    free(n->scratch);
}

/* ---- preparing ------------------------------------------------------------ */

static void mask_node_resolve(mask_node *n, const mask_spec *s, const mask_shape *sh) {
    int width = mask_default_width(sh->k_len);
    n->spec = s;
    n->band = s->band > 0 ? s->band : width;
    n->global = s->global > 0 ? s->global : width;
    n->block = s->block > 0 ? s->block : MASK_DEFAULT_BLOCK;
    n->stride = (int64_t)(s->dilation > 0 ? s->dilation : MASK_DEFAULT_DILATION) + 1;
    n->rate = s->rate > 0 ? s->rate : MASK_DEFAULT_RATE;
    n->seed = s->seed;
}

/* One comb row per residue, so a dilated row is a comb AND a range. Strides
 * over 64 leave at most one allowed key per word: those are set one by one,
 * which is still one operation per word touched. */
static int mask_node_make_combs(mask_node *n, const mask_shape *sh, stof_error *err) {
    if (n->stride > 64)
        return STOF_OK;
    int s = (int)n->stride;
    n->combs = err_calloc((size_t)s * (size_t)sh->words, sizeof *n->combs, err);
    if (!n->combs)
        return STOF_ERR_NOMEM;
    for (int r = 0; r < s; r++) {
        uint64_t *comb = n->combs + (size_t)r * sh->words;
        for (int j = r; j < sh->k_len; j += s)
            comb[j >> 6] |= 1ULL << (j & 63);
    }
    return STOF_OK;
}

static int mask_check_lengths(const mask_spec *s, const mask_shape *sh, stof_error *err) {
    if (s->n_lengths != 1 && s->n_lengths != sh->batch)
        return err_set(err, STOF_ERR_INVALID,
                       "key_padding: %d lengths given for batch %d (need %d, or 1 for all)",
                       s->n_lengths, sh->batch, sh->batch);
    for (int b = 0; b < s->n_lengths; b++)
        if (s->lengths[b] > sh->k_len)
            return err_set(err, STOF_ERR_INVALID,
                           "key_padding: lengths[%d] = %d is outside [0, %d] (k_len)", b,
                           s->lengths[b], sh->k_len);
    return STOF_OK;
}

static int mask_node_prepare(mask_node *n, const mask_spec *s, const mask_shape *sh,
                             int under_per_batch, stof_error *err);

static int mask_node_prepare_children(mask_node *n, const mask_spec *s, const mask_shape *sh,
                                      int under_per_batch, stof_error *err) {
    if (s->kind == MASK_PER_BATCH && s->n_children != sh->batch)
        return err_set(err, STOF_ERR_INVALID,
                       "per_batch: %d child patterns given for batch %d (need one per batch)",
                       s->n_children, sh->batch);
    if (s->kind != MASK_PER_BATCH) {
        n->scratch = err_malloc((size_t)sh->words * sizeof *n->scratch, err);
        if (!n->scratch)
            return STOF_ERR_NOMEM;
    }
    n->children = err_calloc((size_t)s->n_children, sizeof *n->children, err);
    if (!n->children)
        return STOF_ERR_NOMEM;
    int child_per_batch = under_per_batch || s->kind == MASK_PER_BATCH;
    for (int c = 0; c < s->n_children; c++) {
        n->n_children = c + 1; /* so a failure releases what was prepared */
        int rc = mask_node_prepare(&n->children[c], s->children[c], sh, child_per_batch, err);
        if (rc != STOF_OK)
            return rc;
    }
    return STOF_OK;
}

/* The caller releases n also on failure. */
static int mask_node_prepare(mask_node *n, const mask_spec *s, const mask_shape *sh,
                             int under_per_batch, stof_error *err) {
    memset(n, 0, sizeof *n);
    mask_node_resolve(n, s, sh);
    n->batch_aware = under_per_batch;
    switch (s->kind) {
    case MASK_DILATED:
        return mask_node_make_combs(n, sh, err);
    case MASK_KEY_PADDING:
        return mask_check_lengths(s, sh, err);
    case MASK_UNION:
    case MASK_INTERSECT:
    case MASK_PER_BATCH:
        return mask_node_prepare_children(n, s, sh, under_per_batch, err);
    default:
        return STOF_OK;
    }
}

/* ---- filling one row: each or_ function adds its allowed keys to row ------ */

static int mask_clip(int64_t v, int k_len) {
    return v < 0 ? 0 : v > k_len ? k_len : (int)v;
}

static void mask_or_causal(uint64_t *row, int i, const mask_shape *sh) {
    mask_row_set_range(row, 0, mask_clip((int64_t)i + sh->k_len - sh->q_len + 1, sh->k_len));
}

static void mask_or_band(uint64_t *row, int i, int band, int k_len) {
    mask_row_set_range(row, mask_clip((int64_t)i - band, k_len),
                       mask_clip((int64_t)i + band + 1, k_len));
}

static void mask_or_global(uint64_t *row, int i, int global, int k_len) {
    mask_row_set_range(row, 0, i < global ? k_len : mask_clip(global, k_len));
}

/* Adjacent kept blocks are set as one range. */
static void mask_or_random(const mask_node *n, uint64_t *row, int i, int k_len) {
    int block_row = i / n->block, n_cols = (k_len - 1) / n->block + 1;
    int run = -1; /* first block column of the current run of kept blocks */
    for (int bc = 0; bc <= n_cols; bc++) {
        int kept = bc < n_cols && mask_random_block_kept(n->seed, n->rate, block_row, bc);
        if (kept && run < 0) {
            run = bc;
        } else if (!kept && run >= 0) {
            mask_row_set_range(row, mask_clip((int64_t)run * n->block, k_len),
                               mask_clip((int64_t)bc * n->block, k_len));
            run = -1;
        }
    }
}

static void mask_or_dilated(const mask_node *n, uint64_t *row, int i, const mask_shape *sh) {
    int64_t reach = (int64_t)n->band * n->stride;
    int lo = mask_clip(i - reach, sh->k_len), hi = mask_clip(i + reach + 1, sh->k_len);
    if (lo >= hi)
        return;
    if (!n->combs) {
        for (int64_t j = i - ((i - lo) / n->stride) * n->stride; j < hi; j += n->stride)
            row[j >> 6] |= 1ULL << (j & 63);
        return;
    }
    const uint64_t *comb = n->combs + (size_t)(i % n->stride) * sh->words;
    int w0 = lo >> 6, w1 = (hi - 1) >> 6;
    for (int w = w0; w <= w1; w++) {
        uint64_t keep = comb[w];
        if (w == w0)
            keep &= ~0ULL << (lo & 63);
        if (w == w1)
            keep &= ~0ULL >> (63 - ((hi - 1) & 63));
        row[w] |= keep;
    }
}

static int mask_or_predicate(const mask_node *n, uint64_t *row, int b, int i,
                             const mask_shape *sh, stof_error *err) {
    const mask_spec *s = n->spec;
    int pb = n->batch_aware ? b : 0;
    stof_error perr = {STOF_OK, ""};
    for (int j = 0; j < sh->k_len; j++) {
        int r = s->pred(s->pred_ud, pb, i, j, &perr);
        if (r < 0)
            return err_set(err, r, "predicate '%s' failed at (b=%d, i=%d, j=%d): %s",
                           s->pred_name ? s->pred_name : "?", pb, i, j,
                           perr.msg[0] ? perr.msg : "no message");
        if (r > 0)
            row[j >> 6] |= 1ULL << (j & 63);
    }
    return STOF_OK;
}

static int mask_node_fill(const mask_node *n, const mask_shape *sh, int b, int i,
                          uint64_t *row, stof_error *err);

static int mask_fill_combined(const mask_node *n, const mask_shape *sh, int b, int i,
                              uint64_t *row, stof_error *err) {
    int rc = mask_node_fill(&n->children[0], sh, b, i, row, err);
    for (int c = 1; c < n->n_children && rc == STOF_OK; c++) {
        rc = mask_node_fill(&n->children[c], sh, b, i, n->scratch, err);
        if (n->spec->kind == MASK_UNION)
            for (int w = 0; w < sh->words; w++)
                row[w] |= n->scratch[w];
        else
            for (int w = 0; w < sh->words; w++)
                row[w] &= n->scratch[w];
    }
    return rc;
}

/* Row i of batch b (b is 0 for a shared mask). */
static int mask_node_fill(const mask_node *n, const mask_shape *sh, int b, int i,
                          uint64_t *row, stof_error *err) {
    const mask_spec *s = n->spec;
    int k = sh->k_len;
    memset(row, 0, (size_t)sh->words * sizeof *row);
    switch (s->kind) {
    case MASK_DENSE_ALL: mask_row_set_range(row, 0, k); break;
    case MASK_CAUSAL: mask_or_causal(row, i, sh); break;
    case MASK_SLIDING: mask_or_band(row, i, n->band, k); break;
    case MASK_DILATED: mask_or_dilated(n, row, i, sh); break;
    case MASK_GLOBAL: mask_or_global(row, i, n->global, k); break;
    case MASK_RANDOM: mask_or_random(n, row, i, k); break;
    case MASK_LONGFORMER:
    case MASK_BIGBIRD:
        mask_or_global(row, i, n->global, k);
        mask_or_band(row, i, n->band, k);
        if (s->kind == MASK_BIGBIRD)
            mask_or_random(n, row, i, k);
        break;
    case MASK_KEY_PADDING:
        mask_row_set_range(row, 0, s->lengths[s->n_lengths == 1 ? 0 : b]);
        break;
    case MASK_UNION:
    case MASK_INTERSECT: return mask_fill_combined(n, sh, b, i, row, err);
    case MASK_PER_BATCH: return mask_node_fill(&n->children[b], sh, b, i, row, err);
    case MASK_PREDICATE: return mask_or_predicate(n, row, b, i, sh, err);
    case MASK_KIND_COUNT: return err_set(err, STOF_ERR_INTERNAL, "mask: bad kind");
    }
    return STOF_OK;
}

/* ---- the entry point ------------------------------------------------------ */

static int mask_fill_all(const mask_node *root, const mask_shape *sh, mask *m,
                         stof_error *err) {
    for (int b = 0; b < m->batch; b++) {
        for (int i = 0; i < m->q_len; i++) {
            uint64_t *row = m->bits + ((int64_t)b * m->q_len + i) * m->words;
            int rc = mask_node_fill(root, sh, b, i, row, err);
            if (rc != STOF_OK)
                return rc;
        }
    }
    return STOF_OK;
}

int mask_build(const mask_spec *spec, int batch, int q_len, int k_len, mask **out,
               stof_error *err) {
    if (!out)
        return err_set(err, STOF_ERR_INVALID, "mask_build: output pointer is NULL");
    *out = NULL;
    int rc = mask_spec_validate(spec, err);
    if (rc != STOF_OK)
        return rc;
    if (batch <= 0 || batch > MASK_MAX_LEN)
        return err_set(err, STOF_ERR_INVALID, "mask: batch must be in 1..%d, got %d",
                       MASK_MAX_LEN, batch);
    int stored = mask_spec_is_per_batch(spec) ? batch : 1;
    mask *m = NULL;
    if ((rc = mask_alloc(stored, q_len, k_len, &m, err)) != STOF_OK)
        return rc;
    mask_shape sh = {batch, q_len, k_len, m->words};
    mask_node root;
    rc = mask_node_prepare(&root, spec, &sh, 0, err);
    if (rc == STOF_OK)
        rc = mask_fill_all(&root, &sh, m, err);
    mask_node_release(&root);
    char *desc = rc == STOF_OK ? mask_spec_describe(spec) : NULL;
    if (rc == STOF_OK && !desc)
        rc = err_set(err, STOF_ERR_NOMEM, "out of host memory (mask description)");
    if (rc != STOF_OK) {
        mask_free(m);
        return rc;
    }
    free(m->desc);
    m->desc = desc;
    m->fingerprint = mask_compute_fingerprint(m);
    *out = m;
    return STOF_OK;
}

int mask_build_text(const char *text, int batch, int q_len, int k_len, mask **out,
                    stof_error *err) {
    mask_spec *spec = NULL;
    *out = NULL;
    int rc = mask_spec_parse(text, &spec, err);
    if (rc == STOF_OK)
        rc = mask_build(spec, batch, q_len, k_len, out, err);
    mask_spec_free(spec);
    return rc;
}
