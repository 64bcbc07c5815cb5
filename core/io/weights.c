#include "core/io/weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/io/safetensors.h"
#include "core/base/util.h"

float weights_round(stof_dtype dtype, float x) {
    switch (dtype) {
    case STOF_F16: return util_round_f16(x);
    case STOF_BF16: return util_bf16_to_f32(util_f32_to_bf16(x));
    default: return x;
    }
}

/* The stream of t's values for seed. */
static uint64_t weights_key(const graph_tensor *t, uint64_t seed) {
    return util_hash_str(util_mix64(seed), t->name);
}

/* Element i of t's values before rounding to its dtype. */
static inline float weights_raw(const graph_tensor *t, uint64_t key, int64_t i) {
    float u = util_uniform(key, (uint64_t)i); /* [0, 1) */
    switch (t->init) {
    case GRAPH_INIT_ZEROS: return 0.0f;
    case GRAPH_INIT_ONES: return 1.0f + t->init_scale * (2.0f * u - 1.0f);
    case GRAPH_INIT_PADDING: return 1.0f;
    case GRAPH_INIT_TOKENS: {
        int64_t id = (int64_t)(u * (float)t->init_high);
        return (float)(id < t->init_high ? id : t->init_high - 1);
    }
    case GRAPH_INIT_UNIFORM:
    default: return t->init_scale * (2.0f * u - 1.0f);
    }
}

void weights_fill_range(const graph_tensor *t, uint64_t seed, int64_t first, int64_t n,
                        float *out) {
    uint64_t key = weights_key(t, seed);
    for (int64_t k = 0; k < n; k++)
        out[k] = weights_round(t->dtype, weights_raw(t, key, first + k));
}

void weights_fill(const graph_tensor *t, uint64_t seed, float *out) {
    weights_fill_range(t, seed, 0, graph_tensor_numel(t), out);
}

void weights_store(stof_dtype dtype, const float *v, int64_t n, void *out) {
    switch (dtype) {
    case STOF_I32:
        for (int64_t i = 0; i < n; i++)
            ((int32_t *)out)[i] = (int32_t)v[i];
        break;
    case STOF_BF16:
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)out)[i] = util_f32_to_bf16(v[i]);
        break;
    case STOF_F16:
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)out)[i] = util_f32_to_f16(v[i]);
        break;
    default:
        memcpy(out, v, sizeof *v * (size_t)n);
        break;
    }
}

/* ==== values from files ========================================================================= */

weights_source weights_source_seeded(uint64_t seed) {
    return (weights_source){.seed = seed};
}

/* Where one tensor's values are: parts of a file, concatenated along dim 0. */
typedef struct weights_origin {
    const safetensors_file *file; /* NULL: seeded */
    int n;
    int index[GRAPH_MAX_SOURCE_PARTS];         /* in file */
    const char *asked[GRAPH_MAX_SOURCE_PARTS]; /* the names looked up */
    size_t prefix_len[GRAPH_MAX_SOURCE_PARTS]; /* of the checkpoint prefix they were under */
    int64_t row_offset; /* > 0: the tensor is rows row_offset.. of its one part */
    int transposed;     /* the tensor [N, K] is the transpose of its one part [K, N] */
} weights_origin;

static const safetensors_file *weights_file_of(const weights_source *src, const graph_tensor *t) {
    if (t->role == GRAPH_WEIGHT)
        return t->constant ? NULL : src->weights;
    return t->role == GRAPH_INPUT ? src->inputs : NULL;
}

static int weights_float_dtype(safetensors_dtype d) {
    return d == SAFETENSORS_F32 || d == SAFETENSORS_F16 || d == SAFETENSORS_BF16;
}

/* The file tensor `part` of x has a dtype x can take. */
static int weights_check_dtype(const safetensors_file *f, const safetensors_tensor *part,
                               const graph_tensor *x, stof_error *err) {
    int ids = x->dtype == STOF_I32;
    int ok = ids ? part->dtype == SAFETENSORS_I32 || part->dtype == SAFETENSORS_I64
                 : weights_float_dtype(part->dtype);
    if (ok)
        return STOF_OK;
    return err_set(err, STOF_ERR_MISMATCH, "%s: tensor '%s' is %s, expected %s", f->path,
                   part->name, part->dtype_name,
                   ids ? "token ids as I32 or I64" : "a float dtype (F32, F16, BF16)");
}

static int weights_same_shape(const safetensors_tensor *p, const graph_tensor *x) {
    if (p->ndim != x->ndim)
        return 0;
    for (int d = 0; d < x->ndim; d++)
        if (p->shape[d] != x->shape[d])
            return 0;
    return 1;
}

/* The parts concatenate along dim 0 to x's shape, each with the rows the
 * graph gives it: parts whose rows merely add up (Q of 1000 rows, K of 536
 * where the model splits 768 each) would put K's rows in V's place. */
static int weights_concat_fits(const safetensors_file *f, const weights_origin *o,
                               const graph_source *s, const graph_tensor *x) {
    for (int k = 0; k < o->n; k++) {
        const safetensors_tensor *p = &f->tensors[o->index[k]];
        if (p->ndim != x->ndim || p->shape[0] != s->part_rows[k])
            return 0;
        for (int d = 1; d < x->ndim; d++)
            if (p->shape[d] != x->shape[d])
                return 0;
    }
    return 1;
}

/* The rows row_offset .. row_offset + x's rows of the part hold x: its
 * other dims are x's, and it has that many rows. */
static int weights_check_rows(const safetensors_file *f, const weights_origin *o,
                              const graph_tensor *x, stof_error *err) {
    const safetensors_tensor *p = &f->tensors[o->index[0]];
    int fits = p->ndim == x->ndim && p->shape[0] >= o->row_offset + x->shape[0];
    for (int d = 1; fits && d < x->ndim; d++)
        fits = p->shape[d] == x->shape[d];
    if (fits)
        return STOF_OK;
    char want[160], got[160];
    return err_set(err, STOF_ERR_MISMATCH, "%s: tensor '%s' is %s; weight '%s' %s is its rows "
                   "from %lld on, which it does not have", f->path, p->name,
                   safetensors_shape_str(p, got, sizeof got), x->name,
                   graph_shape_str(x, want, sizeof want), (long long)o->row_offset);
}

/* The one part is x [N, K] transposed: [K, N]. */
static int weights_check_transposed(const safetensors_file *f, const weights_origin *o,
                                    const graph_tensor *x, stof_error *err) {
    const safetensors_tensor *p = &f->tensors[o->index[0]];
    if (p->ndim == 2 && p->shape[0] == x->shape[1] && p->shape[1] == x->shape[0])
        return STOF_OK;
    char want[160], got[160];
    return err_set(err, STOF_ERR_MISMATCH, "%s: tensor '%s' is %s, expected [%lld, %lld] (weight "
                   "'%s' %s is its transpose)", f->path, p->name,
                   safetensors_shape_str(p, got, sizeof got), (long long)x->shape[1],
                   (long long)x->shape[0], x->name, graph_shape_str(x, want, sizeof want));
}

/* s: the source x is assembled from, or NULL when it is read whole. */
static int weights_check_shape(const safetensors_file *f, const weights_origin *o,
                               const graph_tensor *x, const graph_source *s, stof_error *err) {
    char want[160], got[160];
    graph_shape_str(x, want, sizeof want);
    if (!s) {
        const safetensors_tensor *p = &f->tensors[o->index[0]];
        if (weights_same_shape(p, x))
            return STOF_OK;
        return err_set(err, STOF_ERR_MISMATCH, "%s: tensor '%s' is %s, expected %s", f->path,
                       p->name, safetensors_shape_str(p, got, sizeof got), want);
    }
    if (weights_concat_fits(f, o, s, x))
        return STOF_OK;
    char parts[640] = "";
    size_t used = 0;
    for (int k = 0; k < o->n && used < sizeof parts; k++) {
        const safetensors_tensor *p = &f->tensors[o->index[k]];
        used += (size_t)snprintf(parts + used, sizeof parts - used, "%s'%s' %s", k ? " + " : "",
                                 p->name, safetensors_shape_str(p, got, sizeof got));
    }
    char rows[160] = "";
    used = 0;
    for (int k = 0; k < o->n && used < sizeof rows; k++)
        used += (size_t)snprintf(rows + used, sizeof rows - used, "%s%lld", k ? " + " : "",
                                 (long long)s->part_rows[k]);
    return err_set(err, STOF_ERR_MISMATCH, "%s: weight '%s' %s is assembled from %s: they must "
                   "concatenate along dim 0 to its shape, in parts of %s rows", f->path,
                   x->name, want, parts, rows);
}

/* The file tensor of name (safetensors_find), or for a LayerNorm's weight
 * and bias the "gamma" and "beta" of checkpoints from BERT's original
 * release, as transformers reads them; *prefix_len: the length of the
 * checkpoint prefix it was found under. -1: none, -2: ambiguous (err set). */
static int weights_find(const safetensors_file *f, const char *name, size_t *prefix_len,
                        stof_error *err) {
    static const char *const legacy[][2] = {{"LayerNorm.weight", "LayerNorm.gamma"},
                                            {"LayerNorm.bias", "LayerNorm.beta"}};
    char other[GRAPH_NAME_MAX + 8];
    const char *found_as = name;
    int i = safetensors_find(f, name, err);
    size_t len = strlen(name);
    for (int k = 0; k < 2 && i == -1; k++) {
        size_t sl = strlen(legacy[k][0]);
        if (len >= sl && strcmp(name + len - sl, legacy[k][0]) == 0) {
            snprintf(other, sizeof other, "%.*s%s", (int)(len - sl), name, legacy[k][1]);
            found_as = other;
            i = safetensors_find(f, other, err);
        }
    }
    *prefix_len = i >= 0 ? strlen(f->tensors[i].name) - strlen(found_as) : 0;
    return i;
}

/* Finds the file tensors of t (nothing when its values are seeded) and
 * checks their dtypes and shapes; errors start with the file's path. A
 * weight with a source is read under its own name when the file has it
 * (a checkpoint stored fused), else assembled from the source's parts; one
 * read rows_from or transposed always from its one part. */
static int weights_resolve(const weights_source *src, const graph *g, int t, weights_origin *o,
                           stof_error *err) {
    const graph_tensor *x = &g->tensors[t];
    memset(o, 0, sizeof *o);
    const safetensors_file *f = weights_file_of(src, x);
    if (!f)
        return STOF_OK;
    const graph_source *s = x->role == GRAPH_WEIGHT ? graph_source_of(g, t) : NULL;
    size_t unused;
    if (s && !s->row_offset && !s->transposed && weights_find(f, x->name, &unused, NULL) >= 0)
        s = NULL; /* the checkpoint stores the fused weight itself */
    o->row_offset = s ? s->row_offset : 0;
    o->transposed = s ? s->transposed : 0;
    int n = s ? s->n : 1;
    for (int k = 0; k < n; k++) {
        const char *name = s ? graph_source_part(g, s, k) : x->name;
        size_t prefix_len;
        int i = weights_find(f, name, &prefix_len, err);
        if (i == -2)
            return STOF_ERR_FORMAT;
        if (i < 0 && graph_input_optional(x))
            return STOF_OK; /* left out: its init (no padding, type 0) */
        if (i < 0 && x->role == GRAPH_INPUT)
            return err_set(err, STOF_ERR_MISMATCH, "%s: input '%s' missing (a file of inputs "
                           "gives every input of the model; nothing is drawn at random beside "
                           "it)", f->path, name);
        if (i < 0 && s)
            return err_set(err, STOF_ERR_MISMATCH, "%s: tensor '%s' missing (part %d of %d of "
                           "weight '%s')", f->path, name, k + 1, n, x->name);
        if (i < 0)
            return err_set(err, STOF_ERR_MISMATCH, "%s: tensor '%s' missing", f->path, name);
        o->index[k] = i;
        o->n = k + 1; /* found, whatever its dtype: not also reported unused */
        int rc = weights_check_dtype(f, &f->tensors[i], x, err);
        if (rc)
            return rc;
        o->asked[k] = name;
        o->prefix_len[k] = prefix_len;
    }
    o->n = n;
    int rc = o->row_offset   ? weights_check_rows(f, o, x, err)
             : o->transposed ? weights_check_transposed(f, o, x, err)
                             : weights_check_shape(f, o, x, s, err);
    if (!rc)
        o->file = f;
    return rc;
}

int weights_check_attention_mask(const char *what, const int64_t *v, int64_t rows,
                                 int64_t seq, stof_error *err) {
    for (int64_t r = 0; r < rows; r++) {
        int64_t zero_at = -1;
        for (int64_t s = 0; s < seq; s++) {
            int64_t m = v[r * seq + s];
            if (m != 0 && m != 1)
                return err_set(err, STOF_ERR_INVALID, "%s: row %lld holds %lld at position %lld "
                               "(an attention_mask holds 1 for a token, 0 for padding)", what,
                               (long long)r, (long long)m, (long long)s);
            if (m == 0 && zero_at < 0)
                zero_at = s;
            if (m == 1 && zero_at >= 0)
                return err_set(err, STOF_ERR_UNSUPPORTED, "%s: row %lld has a token at position "
                               "%lld after padding at %lld: stof takes right padding (each row "
                               "1s, then 0s; tokenizer padding_side \"right\")", what,
                               (long long)r, (long long)s, (long long)zero_at);
        }
    }
    return STOF_OK;
}

int weights_check_input_mask(const graph_tensor *x, const int32_t *v, stof_error *err) {
    int64_t n = graph_tensor_numel(x), seq = x->shape[x->ndim - 1];
    int64_t *wide = err_malloc(sizeof *wide * (size_t)n, err);
    if (!wide)
        return STOF_ERR_NOMEM;
    for (int64_t i = 0; i < n; i++)
        wide[i] = v[i];
    char what[160];
    snprintf(what, sizeof what, "input '%s'", x->name);
    int rc = weights_check_attention_mask(what, wide, n / seq, seq, err);
    free(wide);
    return rc;
}

/* Token ids from the file, each in [0, high), as exact floats. */
static int weights_read_ids(const weights_origin *o, const graph_tensor *x, float *out,
                            stof_error *err) {
    int64_t n = graph_tensor_numel(x);
    int64_t *ids = err_malloc(sizeof *ids * (size_t)n, err);
    if (!ids)
        return STOF_ERR_NOMEM;
    int rc = safetensors_read_i64(o->file, o->index[0], ids, err);
    const int64_t seq = x->shape[x->ndim - 1];
    if (!rc && x->init == GRAPH_INIT_PADDING) {
        char what[600];
        snprintf(what, sizeof what, "%s: tensor '%s'", o->file->path,
                 o->file->tensors[o->index[0]].name);
        rc = weights_check_attention_mask(what, ids, n / seq, seq, err);
    }
    for (int64_t i = 0; i < n && !rc; i++) {
        /* "value", not "id": a global_attention_mask's entries are flags */
        if (ids[i] < 0 || ids[i] >= x->init_high)
            rc = err_set(err, STOF_ERR_INVALID, "%s: tensor '%s': value %lld at index %lld (row "
                         "%lld, position %lld) is outside [0, %lld)", o->file->path,
                         o->file->tensors[o->index[0]].name, (long long)ids[i], (long long)i,
                         (long long)(i / seq), (long long)(i % seq), (long long)x->init_high);
        out[i] = (float)ids[i];
    }
    free(ids);
    return rc;
}

/* Element i of x read as raw: NaN or infinity in the file, or a finite value
 * beyond what x's dtype holds (rounded, it would be infinity). Running on
 * would give a NaN output with nothing to say why, so it stops here, naming
 * the file's tensor and the element. */
static int weights_not_finite(const weights_origin *o, const graph_tensor *x, int64_t i,
                              float raw, stof_error *err) {
    int64_t at = i;
    int k = 0;
    while (k + 1 < o->n && at >= o->file->tensors[o->index[k]].numel)
        at -= o->file->tensors[o->index[k++]].numel;
    if (o->row_offset) { /* rows row_offset.. of the file's tensor */
        const safetensors_tensor *p = &o->file->tensors[o->index[0]];
        at += o->row_offset * (p->numel / p->shape[0]);
    }
    if (o->transposed) /* x's element (r, c) is the file's (c, r) */
        at = i % x->shape[1] * x->shape[0] + i / x->shape[1];
    const char *name = o->file->tensors[o->index[k]].name;
    if (!isfinite(raw))
        return err_set(err, STOF_ERR_FORMAT, "%s: tensor '%s' holds %s at element %lld",
                       o->file->path, name, isnan(raw) ? "NaN" : "infinity", (long long)at);
    return err_set(err, STOF_ERR_FORMAT, "%s: tensor '%s' holds %g at element %lld, beyond what "
                   "%s can hold (the weight '%s' runs in %s)", o->file->path, name, (double)raw,
                   (long long)at, stof_dtype_name(x->dtype), x->name, stof_dtype_name(x->dtype));
}

/* o's one part read whole into *all (freed by the caller, also on failure). */
static int weights_read_part(const weights_origin *o, float **all, stof_error *err) {
    const safetensors_tensor *p = &o->file->tensors[o->index[0]];
    *all = err_malloc(sizeof **all * (size_t)p->numel, err);
    return *all ? safetensors_read_f32(o->file, o->index[0], *all, err) : STOF_ERR_NOMEM;
}

/* Rows row_offset.. of o's one part into out (x's elements). */
static int weights_read_rows(const weights_origin *o, const graph_tensor *x, float *out,
                             stof_error *err) {
    float *all = NULL;
    int rc = weights_read_part(o, &all, err);
    const safetensors_tensor *p = &o->file->tensors[o->index[0]];
    if (!rc)
        memcpy(out, all + o->row_offset * (p->numel / p->shape[0]),
               sizeof *out * (size_t)graph_tensor_numel(x));
    free(all);
    return rc;
}

/* x [N, K] from o's one part [K, N], transposed. */
static int weights_read_transposed(const weights_origin *o, const graph_tensor *x, float *out,
                                   stof_error *err) {
    const int64_t n = x->shape[0], k = x->shape[1];
    float *all = NULL;
    int rc = weights_read_part(o, &all, err);
    if (!rc)
        util_transpose_f32(all, out, k, n);
    free(all);
    return rc;
}

static int weights_read_floats(const weights_origin *o, const graph_tensor *x, float *out,
                               stof_error *err) {
    int64_t at = 0;
    int rc = STOF_OK;
    if (o->row_offset || o->transposed) { /* one part, reshaped into x */
        rc = o->row_offset ? weights_read_rows(o, x, out, err)
                           : weights_read_transposed(o, x, out, err);
        at = graph_tensor_numel(x);
    } else {
        for (int k = 0; k < o->n && !rc; k++) {
            rc = safetensors_read_f32(o->file, o->index[k], out + at, err);
            at += o->file->tensors[o->index[k]].numel;
        }
    }
    if (rc)
        return rc;
    for (int64_t i = 0; i < at; i++) {
        float v = weights_round(x->dtype, out[i]);
        if (!isfinite(v))
            return weights_not_finite(o, x, i, out[i], err);
        out[i] = v;
    }
    return STOF_OK;
}

/* The values of x from its file (o->file set), as floats. */
static int weights_read(const weights_origin *o, const graph_tensor *x, float *out,
                        stof_error *err) {
    return x->dtype == STOF_I32 ? weights_read_ids(o, x, out, err)
                                : weights_read_floats(o, x, out, err);
}

int weights_source_values(const weights_source *src, const graph *g, int tensor, float *out,
                          stof_error *err) {
    const graph_tensor *x = &g->tensors[tensor];
    weights_origin o;
    int rc = weights_resolve(src, g, tensor, &o, err);
    if (rc)
        return rc;
    if (!o.file) {
        weights_fill(x, src->seed, out);
        return STOF_OK;
    }
    return weights_read(&o, x, out, err);
}

/* ---- many tensors at once ------------------------------------------------------------------ */

/* Floats a seeded piece of the stored form is made in before it is stored:
 * on the worker's stack, so that no tensor is ever held as floats too. */
#define WEIGHTS_BLOCK 1024

/* One piece of work: a chunk of a seeded tensor, or a file tensor whole
 * (n < 0). k: the tensor's index in the caller's list. */
typedef struct weights_piece {
    int k;
    int64_t first, n;
} weights_piece;

typedef struct weights_job {
    const weights_source *src;
    const graph *g;
    const int *tensors;
    weights_form form;
    void *const *out;
    weights_origin *origin; /* per tensor */
    weights_piece *pieces;
    int n_pieces;
    int *rc;                /* per tensor: what its file piece returned */
    stof_error *errs;       /* per tensor */
} weights_job;

/* Bytes of one element of the stored form of dtype. */
static size_t weights_stored_size(stof_dtype dtype) {
    return dtype == STOF_F16 || dtype == STOF_BF16 ? 2 : 4;
}

/* A file tensor: read by this thread alone (reads are positioned, so many
 * files' tensors are read at once safely), then stored. */
static int weights_file_piece(const weights_job *j, int k, stof_error *err) {
    const graph_tensor *x = &j->g->tensors[j->tensors[k]];
    if (j->form == WEIGHTS_FLOAT)
        return weights_read(&j->origin[k], x, j->out[k], err);
    int64_t n = graph_tensor_numel(x);
    float *f = err_malloc(sizeof *f * (size_t)(n ? n : 1), err);
    if (!f)
        return STOF_ERR_NOMEM;
    int rc = weights_read(&j->origin[k], x, f, err);
    if (!rc)
        weights_store(x->dtype, f, n, j->out[k]);
    free(f);
    return rc;
}

static void weights_piece_run(void *arg, int i) {
    const weights_job *j = arg;
    const weights_piece *p = &j->pieces[i];
    const graph_tensor *x = &j->g->tensors[j->tensors[p->k]];
    if (p->n < 0) {
        j->rc[p->k] = weights_file_piece(j, p->k, &j->errs[p->k]);
        return;
    }
    if (j->form == WEIGHTS_FLOAT) {
        weights_fill_range(x, j->src->seed, p->first, p->n, (float *)j->out[p->k] + p->first);
        return;
    }
    /* stored straight from the unrounded values: converting to fp16 or
     * bf16 rounds as weights_round does, and a value already rounded
     * converts to the same bits (NaN and infinity too), so the round trip
     * of weights_fill is left out */
    float block[WEIGHTS_BLOCK];
    size_t elem = weights_stored_size(x->dtype);
    uint64_t key = weights_key(x, j->src->seed);
    for (int64_t at = p->first; at < p->first + p->n; at += WEIGHTS_BLOCK) {
        int64_t m = p->first + p->n - at < WEIGHTS_BLOCK ? p->first + p->n - at : WEIGHTS_BLOCK;
        for (int64_t k = 0; k < m; k++)
            block[k] = weights_raw(x, key, at + k);
        weights_store(x->dtype, block, m, (char *)j->out[p->k] + (size_t)at * elem);
    }
}

/* Every tensor resolved (the first problem, in the caller's order, is
 * returned before anything is read) and cut into pieces: the file tensors
 * first, the longest pieces, then the seeded ones' chunks. */
static int weights_job_plan(weights_job *j, int n, stof_error *err) {
    int64_t total = 0;
    for (int k = 0; k < n; k++) {
        int rc = weights_resolve(j->src, j->g, j->tensors[k], &j->origin[k], err);
        if (rc)
            return rc;
        int64_t e = graph_tensor_numel(&j->g->tensors[j->tensors[k]]);
        total += j->origin[k].file ? 1 : (e + WEIGHTS_CHUNK - 1) / WEIGHTS_CHUNK;
    }
    if (total > INT32_MAX)
        return err_set(err, STOF_ERR_UNSUPPORTED, "%lld pieces of weights to fill at once",
                       (long long)total);
    j->pieces = err_malloc(sizeof *j->pieces * (size_t)(total ? total : 1), err);
    if (!j->pieces)
        return STOF_ERR_NOMEM;
    for (int k = 0; k < n; k++)
        if (j->origin[k].file)
            j->pieces[j->n_pieces++] = (weights_piece){k, 0, -1};
    for (int k = 0; k < n; k++) {
        int64_t e = graph_tensor_numel(&j->g->tensors[j->tensors[k]]);
        for (int64_t at = 0; !j->origin[k].file && at < e; at += WEIGHTS_CHUNK)
            j->pieces[j->n_pieces++] =
                (weights_piece){k, at, e - at < WEIGHTS_CHUNK ? e - at : WEIGHTS_CHUNK};
    }
    return STOF_OK;
}

int weights_source_values_many(const weights_source *src, const graph *g, const int *tensors,
                               int n, weights_form form, void *const *out, task_pool *pool,
                               stof_error *err) {
    if (n <= 0)
        return STOF_OK;
    weights_job j = {src, g, tensors, form, out, NULL, NULL, 0, NULL, NULL};
    j.origin = err_malloc(sizeof *j.origin * (size_t)n, err);
    j.rc = err_calloc((size_t)n, sizeof *j.rc, err);
    j.errs = err_calloc((size_t)n, sizeof *j.errs, err);
    int rc = j.origin && j.rc && j.errs ? STOF_OK : STOF_ERR_NOMEM;
    if (!rc)
        rc = weights_job_plan(&j, n, err);
    if (!rc)
        task_pool_parallel_for(pool, j.n_pieces, weights_piece_run, &j);
    for (int k = 0; !rc && k < n; k++)
        if (j.rc[k]) {
            rc = j.rc[k];
            if (err)
                *err = j.errs[k];
        }
    free(j.pieces);
    free(j.errs);
    free(j.rc);
    free(j.origin);
    return rc;
}

task_pool *weights_pool(const graph *g) {
    int64_t total = 0;
    for (int t = 0; t < g->n_tensors; t++)
        if (g->tensors[t].role == GRAPH_WEIGHT || g->tensors[t].role == GRAPH_INPUT)
            total += graph_tensor_numel(&g->tensors[t]);
    int threads = task_pool_default_threads() - 1; /* the caller fills too */
    task_pool *pool = NULL;
    stof_error ignored = {0};
    if (total < WEIGHTS_PARALLEL_MIN || threads < 1 ||
        task_pool_create(threads, &pool, &ignored) != STOF_OK)
        return NULL;
    return pool;
}

/* ---- every problem at once ---------------------------------------------------------------- */

/* The problems found in one file, as "clause; clause", without the path. */
typedef struct weights_problems {
    const safetensors_file *file;
    char text[sizeof ((stof_error *)0)->msg];
    size_t len;
    int n, dropped, code;
    char prefix[GRAPH_NAME_MAX * 2];  /* the first checkpoint prefix seen, and for whom */
    char prefix_of[GRAPH_NAME_MAX];
    int prefix_reported;
    int asked, found;  /* tensors looked up in the file, and found as the model needs them */
    const char *what;  /* "weights" or "inputs" */
} weights_problems;

static void weights_problem_add(weights_problems *p, int code, const char *msg) {
    size_t path_len = strlen(p->file->path);
    if (strncmp(msg, p->file->path, path_len) == 0 && strncmp(msg + path_len, ": ", 2) == 0)
        msg += path_len + 2;
    if (!p->n++)
        p->code = code;
    size_t need = strlen(msg) + 2;
    if (p->dropped || p->len + need + 48 > sizeof p->text) {
        p->dropped++;
        return;
    }
    p->len += (size_t)snprintf(p->text + p->len, sizeof p->text - p->len, "%s%s",
                               p->len ? "; " : "", msg);
}

/* Every part of o read under one checkpoint prefix (the first one seen). */
static void weights_check_prefix(weights_problems *p, const weights_origin *o) {
    for (int k = 0; k < o->n; k++) {
        char pre[GRAPH_NAME_MAX * 2], msg[sizeof p->text];
        if (!o->prefix_len[k])
            continue;
        snprintf(pre, sizeof pre, "%.*s", (int)o->prefix_len[k],
                 o->file->tensors[o->index[k]].name);
        if (!p->prefix[0]) {
            snprintf(p->prefix, sizeof p->prefix, "%s", pre);
            snprintf(p->prefix_of, sizeof p->prefix_of, "%s", o->asked[k]);
        } else if (strcmp(pre, p->prefix) != 0 && !p->prefix_reported) {
            p->prefix_reported = 1;
            snprintf(msg, sizeof msg, "tensors under two prefixes: '%s' (for '%s') and '%s' "
                     "(for '%s')", p->prefix, p->prefix_of, pre, o->asked[k]);
            weights_problem_add(p, STOF_ERR_FORMAT, msg);
        }
    }
}

/* Resolves tensor t (and reads token ids, to check their range). */
static int weights_check_one(const weights_source *src, const graph *g, int t,
                             weights_problems *p, unsigned char *used, stof_error *err) {
    const graph_tensor *x = &g->tensors[t];
    weights_origin o;
    stof_error e = {0};
    int rc = weights_resolve(src, g, t, &o, &e);
    for (int k = 0; used && k < o.n; k++) /* found, even when misshapen: not unused */
        used[o.index[k]] = 1;
    if (!rc && o.file && x->dtype == STOF_I32) {
        float *ids = err_malloc(sizeof *ids * (size_t)graph_tensor_numel(x), &e);
        rc = ids ? weights_read_ids(&o, x, ids, &e) : STOF_ERR_NOMEM;
        free(ids);
    }
    if (rc == STOF_ERR_NOMEM || rc == STOF_ERR_IO) {
        *err = e;
        return rc;
    }
    p->asked++;
    if (rc)
        weights_problem_add(p, rc, e.msg);
    else if (o.file)
        weights_check_prefix(p, &o);
    p->found += !rc;
    return STOF_OK;
}

/* "PATH: 3 problems: a; b; c; and 2 more" for each file with problems. */
static int weights_report(weights_problems *p, int n, stof_error *err) {
    int code = STOF_OK;
    size_t used = 0;
    char msg[sizeof err->msg] = "";
    for (int k = 0; k < n; k++) {
        if (!p[k].n)
            continue;
        if (!code)
            code = p[k].code;
        char count[48] = "", more[160] = "";
        if (p[k].n > 1)
            snprintf(count, sizeof count, "%d problems: ", p[k].n);
        size_t m = 0;
        if (p[k].dropped)
            m += (size_t)snprintf(more, sizeof more, "; and %d more", p[k].dropped);
        if (p[k].n > 1)
            snprintf(more + m, sizeof more - m, " (%d of %d %s found as the model needs them)",
                     p[k].found, p[k].asked, p[k].what);
        if (used < sizeof msg)
            used += (size_t)snprintf(msg + used, sizeof msg - used, "%s%s: %s%s%s",
                                     used ? "; " : "", p[k].file->path, count, p[k].text, more);
    }
    return code ? err_set(err, code, "%s", msg) : STOF_OK;
}

/* Tensors of the inputs file that the model does not take: an
 * attention_mask the model has no input for would otherwise be dropped
 * without a word. */
static void weights_check_unused(weights_problems *p, const graph *g, const unsigned char *used) {
    char inputs[256] = "";
    size_t len = 0;
    for (int t = 0; t < g->n_tensors && len < sizeof inputs; t++)
        if (g->tensors[t].role == GRAPH_INPUT)
            len += (size_t)snprintf(inputs + len, sizeof inputs - len, "%s%s", len ? ", " : "",
                                    g->tensors[t].name);
    for (int i = 0; i < p->file->n; i++)
        if (!used[i]) {
            char msg[512];
            snprintf(msg, sizeof msg, "tensor '%s' is not an input of the model (its inputs: %s)",
                     p->file->tensors[i].name, inputs);
            weights_problem_add(p, STOF_ERR_MISMATCH, msg);
        }
}

int weights_source_check(const weights_source *src, const graph *g, stof_error *err) {
    weights_problems *p = err_calloc(2, sizeof *p, err);
    if (!p)
        return STOF_ERR_NOMEM;
    p[0].file = src->weights;
    p[1].file = src->inputs;
    p[0].what = "weights";
    p[1].what = "inputs";
    /* which tensors of the inputs file the model takes */
    unsigned char *used = src->inputs ? calloc((size_t)src->inputs->n + 1, 1) : NULL;
    int rc = src->inputs && !used ? err_set(err, STOF_ERR_NOMEM, "out of host memory") : STOF_OK;
    for (int t = 0; t < g->n_tensors && !rc; t++) {
        graph_role r = g->tensors[t].role;
        weights_problems *mine = r == GRAPH_WEIGHT ? &p[0] : r == GRAPH_INPUT ? &p[1] : NULL;
        if (mine && mine->file)
            rc = weights_check_one(src, g, t, mine, mine->file == src->inputs ? used : NULL,
                                   err);
    }
    /* a checkpoint holds more than a model takes (a pooler, a head): only a
     * file of inputs alone must be taken whole */
    if (!rc && src->inputs && src->inputs != src->weights)
        weights_check_unused(&p[1], g, used);
    if (!rc)
        rc = weights_report(p, 2, err);
    free(used);
    free(p);
    return rc;
}

/* ---- for people ------------------------------------------------------------------------------ */

static const char *weights_file_dtype_name(safetensors_dtype d) {
    static const char *const names[] = {"fp32", "fp16", "bf16", "int32", "int64"};
    return d >= SAFETENSORS_F32 && d <= SAFETENSORS_I64 ? names[d] : "?";
}

/* "fp32 -> fp16", or "fp16" when nothing is converted. */
static void weights_conversion(unsigned from, unsigned to, char *buf, size_t n) {
    char a[64] = "", b[64] = "";
    size_t ua = 0, ub = 0;
    for (int d = SAFETENSORS_F32; d <= SAFETENSORS_I64; d++)
        if (from >> d & 1)
            ua += (size_t)snprintf(a + ua, sizeof a - ua, "%s%s", ua ? ", " : "",
                                   weights_file_dtype_name((safetensors_dtype)d));
    for (int d = STOF_F32; d <= STOF_I32; d++)
        if (to >> d & 1)
            ub += (size_t)snprintf(b + ub, sizeof b - ub, "%s%s", ub ? ", " : "",
                                   stof_dtype_name((stof_dtype)d));
    if (strcmp(a, b) == 0)
        snprintf(buf, n, "%s", a);
    else
        snprintf(buf, n, "%s -> %s", a, b);
}

/* The line on the tensors of role `role` and their file f. */
static void weights_describe_role(const weights_source *src, const graph *g, graph_role role,
                                  const safetensors_file *f, char *buf, size_t n) {
    int read = 0, assembled = 0, transposed = 0, from_file = 0, seeded = 0, constant = 0;
    unsigned file_dtypes = 0, graph_dtypes = 0;
    char prefix[GRAPH_NAME_MAX * 2] = "";
    for (int t = 0; t < g->n_tensors; t++) {
        if (g->tensors[t].role != role)
            continue;
        if (g->tensors[t].constant) {
            constant++;
            continue;
        }
        weights_origin o;
        if (weights_resolve(src, g, t, &o, NULL) || !o.file) {
            seeded++;
            continue;
        }
        from_file++;
        read += o.n;
        assembled += graph_source_of(g, t) && o.n > 1;
        transposed += o.transposed;
        graph_dtypes |= 1u << g->tensors[t].dtype;
        for (int k = 0; k < o.n; k++) {
            file_dtypes |= 1u << f->tensors[o.index[k]].dtype;
            if (!prefix[0] && o.prefix_len[k])
                snprintf(prefix, sizeof prefix, "%.*s", (int)o.prefix_len[k],
                         f->tensors[o.index[k]].name);
        }
    }
    char conv[160];
    weights_conversion(file_dtypes, graph_dtypes, conv, sizeof conv);
    size_t used = role == GRAPH_WEIGHT
                      ? (size_t)snprintf(buf, n, "weights: %d tensors from %s (%s)", read,
                                         f->path, conv)
                      : (size_t)snprintf(buf, n, "inputs: %d from %s (%s)", from_file, f->path,
                                         conv);
    if (assembled && used < n)
        used += (size_t)snprintf(buf + used, n - used, ", %d assembled", assembled);
    if (transposed && used < n)
        used += (size_t)snprintf(buf + used, n - used, ", %d transposed", transposed);
    if (prefix[0] && used < n)
        used += (size_t)snprintf(buf + used, n - used, ", under prefix '%s'", prefix);
    if (constant && used < n)
        used += (size_t)snprintf(buf + used, n - used, ", %d constant", constant);
    if (seeded && used < n)
        snprintf(buf + used, n - used, ", %d seeded (seed %llu)", seeded,
                 (unsigned long long)src->seed);
}

void weights_source_describe(const weights_source *src, const graph *g, char *buf, size_t n) {
    if (!src->weights && !src->inputs) {
        snprintf(buf, n, "weights and inputs: seeded (seed %llu)",
                 (unsigned long long)src->seed);
        return;
    }
    char w[512], in[512];
    if (src->weights)
        weights_describe_role(src, g, GRAPH_WEIGHT, src->weights, w, sizeof w);
    else
        snprintf(w, sizeof w, "weights: seeded (seed %llu)", (unsigned long long)src->seed);
    if (src->inputs)
        weights_describe_role(src, g, GRAPH_INPUT, src->inputs, in, sizeof in);
    else
        snprintf(in, sizeof in, "inputs: seeded (seed %llu)", (unsigned long long)src->seed);
    snprintf(buf, n, "%s\n%s", w, in);
}
