/* Segment signatures and the measurement cache (memory hash table plus an
 * append-only text file). */
#include "search/measure.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/base/error.h"
#include "core/base/file.h"
#include "core/base/util.h"
#include "ops/mask.h"
#include "ops/ops.h"

/* ---- signatures ---------------------------------------------------------------- */

typedef struct sig_buf {
    char *buf;
    size_t cap, len;
} sig_buf;

static void sig_add(sig_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sig_add(sig_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = b->len < b->cap ? b->cap - b->len : 0;
    int n = vsnprintf(room ? b->buf + b->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        b->len += (size_t)n;
}

/* "/f32" and the roles of op's tensors that are fp32 in a model of f16 or bf16 (a residual
 * stream): bit k input k, bit 7 the output; nothing when none is. */
static void sig_f32(sig_buf *b, const graph *g, const graph_op *op) {
    unsigned bits = 0;
    for (int k = 0; k < op->n_inputs && k < 7; k++)
        bits |= (unsigned)graph_tensor_is_stream(g, op->inputs[k]) << k;
    bits |= (unsigned)graph_tensor_is_stream(g, op->output) << 7;
    if (bits)
        sig_add(b, "/f32:%x", bits);
}

/* The attributes of one op that change its kernel's time beyond the dims:
 * a GEMM's weight layout, a gated unit's activation, rotary's heads and
 * theta, the embedding's type ids, attention's flags and mask, fp32 tensors in a model of
 * f16 or bf16. (An entry without an attribute that was added later keeps its old meaning: the
 * attribute's default.) */
static void sig_op(sig_buf *b, const graph *g, const graph_op *op) {
    sig_add(b, "%s%s", op_describe(op->kind)->name,
            op->kind == OP_GELU && op->attr.gelu.tanh ? "_tanh" : "");
    sig_f32(b, g, op);
    if (op->kind == OP_GEMM && op->attr.gemm.weight_kn)
        sig_add(b, "/kn");
    if (op->kind == OP_GLU)
        sig_add(b, "/a%d", op->attr.glu.act);
    if (op->kind == OP_ROTARY)
        sig_add(b, "/h%d/%d/t%g", op->attr.rotary.heads, op->attr.rotary.kv_heads,
                (double)op->attr.rotary.theta);
    if (op->kind == OP_EMBEDDING && op->attr.embedding.has_type_ids)
        sig_add(b, "/tid");
    if ((op->kind == OP_EMBEDDING && op->attr.embedding.has_position_ids) ||
        (op->kind == OP_ROTARY && op->attr.rotary.has_positions))
        sig_add(b, "/pid");
    if (op->kind != OP_ATTENTION)
        return;
    const op_attention *a = &op->attr.attn;
    sig_add(b, "/c%d/x%d/r%d%s", a->causal, a->cross, a->relpos, a->padded ? "/pad" : "");
    if (op_attention_kv_heads(a) != a->heads)
        sig_add(b, "/kv%d", op_attention_kv_heads(a));
    if (a->mask >= 0 && a->mask < g->n_masks && g->masks[a->mask])
        sig_add(b, "/m%016llx", (unsigned long long)g->masks[a->mask]->fingerprint);
}

size_t search_segment_signature(const search_segment *seg, char *buf, size_t cap) {
    sig_buf b = {buf, cap, 0};
    if (cap)
        buf[0] = '\0';
    const fusion_template *t = fusion_template_get(seg->tmpl);
    sig_add(&b, "%s|", t ? t->name : "?");
    for (int i = seg->op_first; i <= seg->op_last; i++) {
        sig_add(&b, i > seg->op_first ? "," : "");
        sig_op(&b, seg->g, &seg->g->ops[i]);
    }
    const fusion_dims *d = &seg->dims;
    sig_add(&b, "|m%lld,n%lld,k%lld,n2%lld,e%d,rr%d", (long long)d->m, (long long)d->n,
            (long long)d->k, (long long)d->n2, d->elem_bytes, d->row_reduce);
    if (d->heads)
        sig_add(&b, ",b%d,h%d,d%d,q%d,kl%d", d->batch, d->heads, d->head_dim, d->q_len, d->k_len);
    if (seg->match && seg->match->store_pre_norm)
        sig_add(&b, "|pre");
    return b.len;
}

/* ---- the hash table ----------------------------------------------------------------- */

typedef struct cache_entry {
    char *key; /* "signature\tv1,v2,..."; NULL: an empty slot */
    double ms;
} cache_entry;

struct search_cache {
    char device[256];
    cache_entry *slots;
    size_t cap, count; /* cap: a power of two */
    FILE *file;        /* open for appending; NULL: memory only */
    int cut_short;     /* the file's last line has no newline (an append cut short) */
    size_t whole_bytes; /* the file's bytes up to that line */
    search_cache_stats stats;
};

static size_t key_slot(const search_cache *c, const char *key) {
    size_t i = (size_t)util_hash_str(UTIL_HASH_SEED, key) & (c->cap - 1);
    while (c->slots[i].key && strcmp(c->slots[i].key, key) != 0)
        i = (i + 1) & (c->cap - 1);
    return i;
}

/* Keeps the load under one half so that probes stay short. */
static int cache_grow(search_cache *c, stof_error *err) {
    if (2 * (c->count + 1) <= c->cap)
        return STOF_OK;
    size_t old_cap = c->cap;
    cache_entry *old = c->slots;
    c->cap = old_cap ? 2 * old_cap : 256;
    c->slots = err_calloc(c->cap, sizeof *c->slots, err);
    if (!c->slots) {
        c->slots = old;
        c->cap = old_cap;
        return STOF_ERR_NOMEM;
    }
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].key)
            c->slots[key_slot(c, old[i].key)] = old[i];
    free(old);
    return STOF_OK;
}

/* Inserts a key not yet present (takes ownership of key). */
static int cache_insert(search_cache *c, char *key, double ms, stof_error *err) {
    int rc = cache_grow(c, err);
    if (rc) {
        free(key);
        return rc;
    }
    c->slots[key_slot(c, key)] = (cache_entry){key, ms};
    c->count++;
    c->stats.entries++;
    return STOF_OK;
}

/* "signature\tv1,v2,..." in buf; 0 when it does not fit. */
static int make_key(const char *signature, const int *values, int n_values, char *buf,
                    size_t cap) {
    sig_buf b = {buf, cap, 0};
    sig_add(&b, "%s\t", signature);
    for (int p = 0; p < n_values; p++)
        sig_add(&b, "%s%d", p ? "," : "", values[p]);
    return b.len < cap;
}

/* ---- the file -------------------------------------------------------------------- */

/* Tabs and newlines would break the line format; a device name never needs
 * them. */
static void clean_device_name(const char *in, char *out, size_t cap) {
    snprintf(out, cap, "%s", in ? in : "");
    for (char *p = out; *p; p++)
        if (*p == '\t' || *p == '\n' || *p == '\r')
            *p = ' ';
}

/* One line "DEVICE\tSIG\tVALUES\tMS" (without its newline). Lines of other
 * devices are accepted and dropped. */
static int load_line(search_cache *c, char *line, const char *path, int lineno,
                     stof_error *err) {
    if (line[0] == '#' || line[0] == '\0')
        return STOF_OK;
    char *f[4] = {line, NULL, NULL, NULL};
    int nf = 1;
    for (char *p = line; (p = strchr(p, '\t')) != NULL; nf++) {
        *p++ = '\0';
        if (nf < 4)
            f[nf] = p;
    }
    if (nf != 4)
        return err_set(err, STOF_ERR_FORMAT,
                       "%s:%d: expected 4 tab-separated fields (device, segment, values, ms)",
                       path, lineno);
    char *end;
    errno = 0;
    double ms = strtod(f[3], &end);
    if (end == f[3] || *end || errno || isnan(ms) || ms < 0)
        return err_set(err, STOF_ERR_FORMAT, "%s:%d: '%s' is not a time in milliseconds", path,
                       lineno, f[3]);
    if (strcmp(f[0], c->device) != 0)
        return STOF_OK;
    size_t n = strlen(f[1]) + 1 + strlen(f[2]) + 1;
    char *key = err_malloc(n, err);
    if (!key)
        return STOF_ERR_NOMEM;
    snprintf(key, n, "%s\t%s", f[1], f[2]);
    if (c->cap && c->slots[key_slot(c, key)].key) {
        /* Two runs may have raced on one file: the first answer stands. */
        free(key);
        return STOF_OK;
    }
    int rc = cache_insert(c, key, ms, err);
    if (!rc)
        c->stats.loaded++;
    return rc;
}

/* Counts a line that was not read, keeping the first one's reason. */
static void cache_skip(search_cache *c, const char *why) {
    if (c->stats.skipped++ == 0)
        snprintf(c->stats.skipped_first, sizeof c->stats.skipped_first, "%s", why);
}

static int cache_load(search_cache *c, const char *path, stof_error *err) {
    if (!file_exists(path))
        return STOF_OK;
    size_t len;
    char *text = NULL;
    int rc = file_read(path, "measurement cache", FILE_LIMIT_CACHE, &text, &len, err);
    if (rc)
        return rc;
    int lineno = 0;
    for (size_t at = 0; rc == STOF_OK && at < len;) {
        char *line = text + at, *nl = memchr(line, '\n', len - at);
        lineno++;
        if (!nl) { /* an append cut short: what it paid for is lost, nothing else */
            c->cut_short = 1;
            c->whole_bytes = at;
            break;
        }
        *nl = '\0';
        at = (size_t)(nl - text) + 1;
        size_t n = (size_t)(nl - line);
        if (n && line[n - 1] == '\r') /* written on another system */
            line[--n] = '\0';
        stof_error bad = {0};
        if (strlen(line) != n)
            err_set(&bad, STOF_ERR_FORMAT, "%s:%d: the line holds a NUL byte", path, lineno);
        else
            rc = load_line(c, line, path, lineno, &bad);
        if (rc == STOF_ERR_FORMAT || (rc == STOF_OK && bad.code)) {
            cache_skip(c, bad.msg);
            rc = STOF_OK;
        } else if (rc) {
            *err = bad;
        }
    }
    free(text);
    return rc;
}

int search_cache_open(const char *device, const char *path, search_cache **out,
                      stof_error *err) {
    *out = NULL;
    search_cache *c = err_calloc(1, sizeof *c, err);
    if (!c)
        return STOF_ERR_NOMEM;
    clean_device_name(device, c->device, sizeof c->device);
    int rc = cache_grow(c, err);
    if (!rc && path)
        rc = cache_load(c, path, err);
    /* the cut line goes, or the next entry would join it (and "0.5" cut to
     * "0." would read as a time) */
    if (!rc && path && c->cut_short && truncate(path, (off_t)c->whole_bytes) != 0)
        rc = err_set(err, STOF_ERR_IO, "cannot cut the unfinished last line of the measurement "
                     "cache %s: %s", path, strerror(errno));
    if (!rc && path) {
        c->file = fopen(path, "a");
        if (!c->file)
            rc = err_set(err, STOF_ERR_IO, "cannot open the measurement cache %s for appending: %s",
                         path, strerror(errno));

    }
    if (rc) {
        search_cache_free(c);
        return rc;
    }
    *out = c;
    return STOF_OK;
}

void search_cache_free(search_cache *c) {
    if (!c)
        return;
    for (size_t i = 0; i < c->cap; i++)
        free(c->slots[i].key);
    free(c->slots);
    if (c->file)
        fclose(c->file);
    free(c);
}

int search_cache_lookup(search_cache *c, const char *signature, const int *values, int n_values,
                        double *ms) {
    char key[SEARCH_KEY_MAX];
    if (!make_key(signature, values, n_values, key, sizeof key)) {
        c->stats.misses++;
        return 0;
    }
    const cache_entry *e = &c->slots[key_slot(c, key)];
    if (!e->key) {
        c->stats.misses++;
        return 0;
    }
    c->stats.hits++;
    *ms = e->ms;
    return 1;
}

int search_cache_contains(const search_cache *c, const char *signature, const int *values,
                          int n_values) {
    char key[SEARCH_KEY_MAX];
    return make_key(signature, values, n_values, key, sizeof key) &&
           c->slots[key_slot(c, key)].key != NULL;
}

static int append_line(search_cache *c, const char *key, double ms, stof_error *err) {
    if (!c->file)
        return STOF_OK;
    /* key is "SIG\tVALUES": the line is DEVICE, key, MS. %.17g reads back
     * exactly; strtod reads "inf" for settings that cannot run. */
    if (fprintf(c->file, "%s\t%s\t%.17g\n", c->device, key, ms) < 0 || fflush(c->file) != 0)
        return err_set(err, STOF_ERR_IO, "cannot append to the measurement cache: %s",
                       strerror(errno));
    return STOF_OK;
}

int search_cache_store(search_cache *c, const char *signature, const int *values, int n_values,
                       double ms, stof_error *err) {
    char key[SEARCH_KEY_MAX];
    if (!make_key(signature, values, n_values, key, sizeof key))
        return err_set(err, STOF_ERR_INTERNAL, "a segment signature of %zu bytes is too long",
                       strlen(signature));
    if (strchr(signature, '\t') || strchr(signature, '\n'))
        return err_set(err, STOF_ERR_INTERNAL, "a segment signature holds a tab or newline");
    if (c->slots[key_slot(c, key)].key)
        return err_set(err, STOF_ERR_INTERNAL, "%s was measured twice", key);
    char *owned = err_malloc(strlen(key) + 1, err);
    if (!owned)
        return STOF_ERR_NOMEM;
    memcpy(owned, key, strlen(key) + 1);
    int rc = cache_insert(c, owned, ms, err);
    return rc ? rc : append_line(c, key, ms, err);
}

search_cache_stats search_cache_get_stats(const search_cache *c) {
    return c->stats;
}
