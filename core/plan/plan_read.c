/* Reading a plan from JSON (cJSON), strictly: every key there with the
 * right type, no unknown key, schemes, templates, parameters and times
 * consistent. Each error names the field (plan.h). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/base/file.h"
#include "core/base/util.h"
#include "core/plan/plan.h"
#include "ops/ops.h"


/* Every reader takes the path of the object it reads from ("" for the
 * top), so that a message names the field: "sequences[0].segments[2].ms". */
typedef struct rd {
    const char *source;
    stof_error *err;
} rd;

static void path_join(char *buf, size_t cap, const char *where, const char *key) {
    snprintf(buf, cap, "%s%s%s", where, where[0] ? "." : "", key);
}

static void path_index(char *buf, size_t cap, const char *where, const char *key, int i) {
    snprintf(buf, cap, "%s%s%s[%d]", where, where[0] ? "." : "", key, i);
}

static int rd_fail(rd *r, const char *where, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int rd_fail(rd *r, const char *where, const char *key, const char *fmt, ...) {
    char path[256], what[512];
    path_join(path, sizeof path, where, key);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return err_set(r->err, STOF_ERR_FORMAT, "%s: %s: %s", r->source,
                   path[0] ? path : "the plan", what);
}

static const char *json_type(const cJSON *it) {
    if (cJSON_IsString(it))
        return "a string";
    if (cJSON_IsNumber(it))
        return "a number";
    if (cJSON_IsBool(it))
        return "a boolean";
    if (cJSON_IsNull(it))
        return "null";
    if (cJSON_IsArray(it))
        return "an array";
    if (cJSON_IsObject(it))
        return "an object";
    return "something else";
}

static int key_listed(const char *const *keys, const char *k) {
    for (int i = 0; keys[i]; i++)
        if (strcmp(keys[i], k) == 0)
            return 1;
    return 0;
}

/* `it` (at where.key) is an object holding the listed keys (NULL-terminated),
 * once each: a missing key among the first n_required (n_required < 0: all
 * of them), an unknown one (a typo in a hand edit) or a duplicate is an
 * error. */
static int rd_shape_opt(rd *r, const cJSON *it, const char *where, const char *key,
                        const char *const *keys, int n_required) {
    char path[256];
    path_join(path, sizeof path, where, key);
    if (!cJSON_IsObject(it))
        return rd_fail(r, where, key, "expected an object, got %s", json_type(it));
    for (const cJSON *c = it->child; c; c = c->next) {
        if (!c->string || !key_listed(keys, c->string))
            return rd_fail(r, path, c->string ? c->string : "?",
                           "unknown key (a plan of another stof version or edited by hand: "
                           "tune again to make a new one)");
        for (const cJSON *d = c->next; d; d = d->next)
            if (d->string && strcmp(d->string, c->string) == 0)
                return rd_fail(r, path, c->string, "the key appears twice");
    }
    for (int i = 0; keys[i] && (n_required < 0 || i < n_required); i++)
        if (!cJSON_GetObjectItemCaseSensitive(it, keys[i]))
            return rd_fail(r, path, keys[i], "missing");
    return STOF_OK;
}

static int rd_shape_of(rd *r, const cJSON *it, const char *where, const char *key,
                       const char *const *keys) {
    return rd_shape_opt(r, it, where, key, keys, -1);
}

static const cJSON *get(const cJSON *obj, const char *key) {
    return cJSON_GetObjectItemCaseSensitive(obj, key);
}

static int rd_int(rd *r, const cJSON *obj, const char *where, const char *key, int64_t lo,
                  int64_t hi, int64_t *out) {
    const cJSON *it = get(obj, key);
    if (!cJSON_IsNumber(it))
        return rd_fail(r, where, key, "expected an integer, got %s", json_type(it));
    double v = it->valuedouble;
    if (!isfinite(v) || floor(v) != v || v < (double)lo || v > (double)hi)
        return rd_fail(r, where, key, "expected an integer from %lld to %lld, got %.17g",
                       (long long)lo, (long long)hi, v);
    *out = (int64_t)v;
    return STOF_OK;
}

static int rd_int32(rd *r, const cJSON *obj, const char *where, const char *key, int lo, int hi,
                    int *out) {
    int64_t v;
    int rc = rd_int(r, obj, where, key, lo, hi, &v);
    if (!rc)
        *out = (int)v;
    return rc;
}

static int rd_long(rd *r, const cJSON *obj, const char *where, const char *key, long *out) {
    int64_t v;
    int rc = rd_int(r, obj, where, key, 0, (int64_t)1 << 52, &v);
    if (!rc)
        *out = (long)v;
    return rc;
}

/* A time: a finite number >= 0. */
static int rd_time(rd *r, const cJSON *obj, const char *where, const char *key, double *out) {
    const cJSON *it = get(obj, key);
    if (!cJSON_IsNumber(it))
        return rd_fail(r, where, key, "expected a number, got %s", json_type(it));
    if (!isfinite(it->valuedouble) || it->valuedouble < 0)
        return rd_fail(r, where, key, "expected a time of 0 or more, got %.17g", it->valuedouble);
    *out = it->valuedouble;
    return STOF_OK;
}

static int rd_str(rd *r, const cJSON *obj, const char *where, const char *key, char *buf,
                  size_t cap) {
    const cJSON *it = get(obj, key);
    if (!cJSON_IsString(it) || !it->valuestring)
        return rd_fail(r, where, key, "expected a string, got %s", json_type(it));
    if (strlen(it->valuestring) >= cap)
        return rd_fail(r, where, key, "a string of %zu characters (at most %zu)",
                       strlen(it->valuestring), cap - 1);
    memcpy(buf, it->valuestring, strlen(it->valuestring) + 1);
    return STOF_OK;
}

/* "0x" and exactly 16 hex digits. */
static int rd_hex64(rd *r, const cJSON *obj, const char *where, const char *key,
                    uint64_t *out) {
    char buf[32];
    int rc = rd_str(r, obj, where, key, buf, sizeof buf);
    if (rc)
        return rc;
    int ok = strlen(buf) == 18 && buf[0] == '0' && buf[1] == 'x';
    for (int i = 2; ok && i < 18; i++)
        ok = strchr("0123456789abcdefABCDEF", buf[i]) != NULL;
    if (!ok)
        return rd_fail(r, where, key, "expected \"0x\" and 16 hex digits, got \"%s\"", buf);
    *out = strtoull(buf + 2, NULL, 16);
    return STOF_OK;
}

/* where.key is an array of min..max elements. */
static int rd_array(rd *r, const cJSON *obj, const char *where, const char *key, int min,
                    int max, const cJSON **out, int *n) {
    const cJSON *it = get(obj, key);
    if (!cJSON_IsArray(it))
        return rd_fail(r, where, key, "expected an array, got %s", json_type(it));
    int count = cJSON_GetArraySize(it);
    if (count < min || count > max)
        return rd_fail(r, where, key, "expected %d to %d elements, got %d", min, max, count);
    *out = it;
    *n = count;
    return STOF_OK;
}

/* ---- sections ---------------------------------------------------------------------------- */

static int rd_stof(rd *r, const cJSON *root, plan *p) {
    static const char *const keys[] = {"version", "commit", NULL};
    const cJSON *o = get(root, "stof");
    int rc = rd_shape_of(r, o, "", "stof", keys);
    if (!rc)
        rc = rd_str(r, o, "stof", "version", p->stof_version, sizeof p->stof_version);
    if (!rc)
        rc = rd_str(r, o, "stof", "commit", p->stof_commit, sizeof p->stof_commit);
    return rc;
}

/* "sm_" and two or three digits. */
static int arch_ok(const char *a) {
    size_t n = strlen(a);
    if (n < 5 || n > 6 || strncmp(a, "sm_", 3) != 0)
        return 0;
    for (size_t i = 3; i < n; i++)
        if (a[i] < '0' || a[i] > '9')
            return 0;
    return 1;
}

static int rd_cc(rd *r, const cJSON *o, plan_device *d) {
    char cc[16], tail;
    int rc = rd_str(r, o, "device", "compute_capability", cc, sizeof cc);
    if (rc)
        return rc;
    if (sscanf(cc, "%d.%d%c", &d->cc_major, &d->cc_minor, &tail) != 2 || d->cc_major < 1 ||
        d->cc_major > 99 || d->cc_minor < 0 || d->cc_minor > 9)
        return rd_fail(r, "device", "compute_capability",
                       "expected \"MAJOR.MINOR\" such as \"9.0\", got \"%s\"", cc);
    return STOF_OK;
}

static int rd_device(rd *r, const cJSON *root, plan_device *d) {
    static const char *const measured[] = {"name", "compute_capability", "sms", "arch", NULL};
    static const char *const offline[] = {"name", "arch", NULL};
    const cJSON *o = get(root, "device");
    const cJSON *name = cJSON_IsObject(o) ? get(o, "name") : NULL;
    d->measured = !(cJSON_IsString(name) && name->valuestring &&
                    strcmp(name->valuestring, PLAN_UNMEASURED) == 0);
    int rc = rd_shape_of(r, o, "", "device", d->measured ? measured : offline);
    if (!rc)
        rc = rd_str(r, o, "device", "name", d->name, sizeof d->name);
    if (!rc)
        rc = rd_str(r, o, "device", "arch", d->arch, sizeof d->arch);
    if (!rc && !arch_ok(d->arch))
        rc = rd_fail(r, "device", "arch", "expected \"sm_\" and digits, got \"%s\"", d->arch);
    if (rc || !d->measured)
        return rc;
    rc = rd_cc(r, o, d);
    if (!rc)
        rc = rd_int32(r, o, "device", "sms", 1, 100000, &d->sm_count);
    char want[16];
    snprintf(want, sizeof want, "sm_%d%d", d->cc_major, d->cc_minor);
    if (!rc && strcmp(want, d->arch) != 0)
        rc = rd_fail(r, "device", "arch", "\"%s\" does not go with compute capability %d.%d",
                     d->arch, d->cc_major, d->cc_minor);
    return rc;
}

static int rd_script_params(rd *r, const cJSON *o, plan *p) {
    const cJSON *params = get(o, "params");
    if (!cJSON_IsObject(params))
        return rd_fail(r, "script", "params", "expected an object, got %s", json_type(params));
    for (const cJSON *c = params->child; c; c = c->next) {
        if (p->n_params == GRAPH_SCRIPT_MAX_PARAMS)
            return rd_fail(r, "script", "params", "more than %d parameters", GRAPH_SCRIPT_MAX_PARAMS);
        graph_script_param *kv = &p->params[p->n_params];
        if (!c->string || strlen(c->string) >= sizeof kv->key)
            return rd_fail(r, "script", "params", "a parameter name longer than %zu characters",
                           sizeof kv->key - 1);
        memcpy(kv->key, c->string, strlen(c->string) + 1);
        int rc = rd_str(r, params, "script.params", c->string, kv->value, sizeof kv->value);
        if (rc)
            return rc;
        for (int i = 0; i < p->n_params; i++)
            if (strcmp(p->params[i].key, kv->key) == 0)
                return rd_fail(r, "script.params", kv->key, "the key appears twice");
        p->n_params++;
    }
    return STOF_OK;
}

static int rd_script(rd *r, const cJSON *root, plan *p) {
    /* name, hash and params always; path and model_dir when recorded */
    static const char *const keys[4][6] = {
        {"name", "hash", "params", NULL},
        {"name", "hash", "params", "path", NULL},
        {"name", "hash", "params", "model_dir", NULL},
        {"name", "hash", "params", "path", "model_dir", NULL}};
    const cJSON *o = get(root, "script");
    int has_path = cJSON_IsObject(o) && get(o, "path") != NULL;
    int has_dir = cJSON_IsObject(o) && get(o, "model_dir") != NULL;
    int rc = rd_shape_of(r, o, "", "script", keys[has_path + 2 * has_dir]);
    if (!rc && has_path)
        rc = rd_str(r, o, "script", "path", p->script_path, sizeof p->script_path);
    if (!rc && has_dir)
        rc = rd_str(r, o, "script", "model_dir", p->model_dir, sizeof p->model_dir);
    if (!rc)
        rc = rd_str(r, o, "script", "name", p->script_name, sizeof p->script_name);
    if (!rc && !p->script_name[0])
        rc = rd_fail(r, "script", "name", "empty");
    if (!rc)
        rc = rd_hex64(r, o, "script", "hash", &p->script_hash);
    return rc ? rc : rd_script_params(r, o, p);
}

static int rd_input(rd *r, const cJSON *o, const char *where, plan_input *in) {
    static const char *const keys[] = {"name", "shape", NULL};
    int rc = rd_shape_of(r, o, "", where, keys);
    if (!rc)
        rc = rd_str(r, o, where, "name", in->name, sizeof in->name);
    const cJSON *shape = NULL;
    if (!rc)
        rc = rd_array(r, o, where, "shape", 1, GRAPH_MAX_DIMS, &shape, &in->ndim);
    char path[256];
    path_join(path, sizeof path, where, "shape");
    int d = 0;
    for (const cJSON *c = rc ? NULL : shape->child; c && !rc; c = c->next, d++) {
        char idx[16];
        snprintf(idx, sizeof idx, "%d", d);
        cJSON_bool ok = cJSON_IsNumber(c) && isfinite(c->valuedouble) &&
                        floor(c->valuedouble) == c->valuedouble && c->valuedouble >= 1 &&
                        c->valuedouble <= (double)GRAPH_MAX_DIM_SIZE;
        if (!ok)
            rc = rd_fail(r, path, idx, "expected a size from 1 to %lld, got %s",
                         (long long)GRAPH_MAX_DIM_SIZE, json_type(c));
        else
            in->shape[d] = (int64_t)c->valuedouble;
    }
    return rc;
}

static int rd_shapes(rd *r, const cJSON *root, plan *p) {
    static const char *const keys[] = {"batch", "seq", "inputs", NULL};
    const cJSON *o = get(root, "shapes"), *arr;
    int rc = rd_shape_of(r, o, "", "shapes", keys);
    if (!rc)
        rc = rd_int(r, o, "shapes", "batch", 1, GRAPH_MAX_DIM_SIZE, &p->batch);
    if (!rc)
        rc = rd_int(r, o, "shapes", "seq", 1, GRAPH_MAX_DIM_SIZE, &p->seq);
    int n = 0;
    if (!rc)
        rc = rd_array(r, o, "shapes", "inputs", 0, 1 << 16, &arr, &n);
    if (!rc && n > 0 && !(p->inputs = err_calloc((size_t)n, sizeof *p->inputs, r->err)))
        rc = STOF_ERR_NOMEM;
    for (const cJSON *c = rc ? NULL : arr->child; c && !rc; c = c->next) {
        char where[64];
        path_index(where, sizeof where, "shapes", "inputs", p->n_inputs);
        rc = rd_input(r, c, where, &p->inputs[p->n_inputs]);
        p->n_inputs += !rc;
    }
    return rc;
}

static int rd_mask(rd *r, const cJSON *o, const char *where, plan_mask *m) {
    static const char *const keys[] = {"description", "fingerprint", "batch", "q_len", "k_len",
                                       NULL};
    int rc = rd_shape_of(r, o, "", where, keys);
    const cJSON *desc = rc ? NULL : get(o, "description");
    if (!rc && !cJSON_IsString(desc))
        rc = rd_fail(r, where, "description", "expected a string, got %s", json_type(desc));
    if (!rc && !(m->description = strdup(desc->valuestring)))
        rc = err_set(r->err, STOF_ERR_NOMEM, "out of memory reading a plan");
    if (!rc)
        rc = rd_hex64(r, o, where, "fingerprint", &m->fingerprint);
    if (!rc)
        rc = rd_int32(r, o, where, "batch", 1, GRAPH_MAX_DIM_SIZE, &m->batch);
    if (!rc)
        rc = rd_int32(r, o, where, "q_len", 1, GRAPH_MAX_DIM_SIZE, &m->q_len);
    if (!rc)
        rc = rd_int32(r, o, where, "k_len", 1, GRAPH_MAX_DIM_SIZE, &m->k_len);
    return rc;
}

static int rd_masks(rd *r, const cJSON *root, plan *p) {
    const cJSON *arr = NULL;
    int n = 0, rc = rd_array(r, root, "", "masks", 0, 1 << 16, &arr, &n);
    if (!rc && n > 0 && !(p->masks = err_calloc((size_t)n, sizeof *p->masks, r->err)))
        rc = STOF_ERR_NOMEM;
    for (const cJSON *c = rc ? NULL : arr->child; c && !rc; c = c->next) {
        char where[64];
        path_index(where, sizeof where, "", "masks", p->n_masks);
        /* counted before reading: a half-read mask's description is freed too */
        rc = rd_mask(r, c, where, &p->masks[p->n_masks++]);
    }
    return rc;
}

/* where.key names a template (one of `allowed`, a bit per id) and
 * where.params gives each of its parameters a value from its space. */
static int rd_kernel(rd *r, const cJSON *o, const char *where, const char *key, unsigned allowed,
                     plan_kernel *k) {
    char name[64];
    int rc = rd_str(r, o, where, key, name, sizeof name);
    if (rc)
        return rc;
    const fusion_template *t = fusion_template_find(name);
    if (!t || !((allowed >> t->id) & 1u))
        return rd_fail(r, where, key, "\"%s\" is not a template here", name);
    k->tmpl = t->id;
    k->n_values = t->n_params;
    const char *keys[FUSION_MAX_PARAMS + 1] = {NULL};
    for (int i = 0; i < t->n_params; i++)
        keys[i] = t->params[i].name;
    char path[256];
    path_join(path, sizeof path, where, "params");
    const cJSON *params = get(o, "params");
    rc = rd_shape_opt(r, params, where, "params", keys,
                      t->plan_optional_from > 0 ? t->plan_optional_from : -1);
    for (int i = 0; !rc && i < t->n_params; i++) {
        const fusion_param *fp = &t->params[i];
        if (t->plan_optional_from > 0 && i >= t->plan_optional_from && !get(params, fp->name)) {
            k->values[i] = fp->values[0];
            continue;
        }
        rc = rd_int32(r, params, path, fp->name, INT32_MIN, INT32_MAX, &k->values[i]);
        int found = 0;
        for (int v = 0; !rc && v < fp->n_values; v++)
            found |= fp->values[v] == k->values[i];
        if (!rc && !found)
            rc = rd_fail(r, path, fp->name, "%d is not in the space of %s", k->values[i],
                         t->name);
    }
    return rc;
}

/* ---- sequences ---------------------------------------------------------------------------- */

/* Two sums of the same numbers in the same order agree to the last bit; the
 * slack only forgives a writer that summed in another order. */
static int sum_matches(double want, double got) {
    return fabs(want - got) <= 1e-9 * fmax(1.0, fmax(fabs(want), fabs(got)));
}

static int rd_seg_ops(rd *r, const cJSON *o, const char *where, plan_segment *s) {
    const cJSON *arr = NULL;
    int n = 0, len = s->last - s->first + 1;
    int rc = rd_array(r, o, where, "ops", len, len, &arr, &n);
    char path[256];
    path_join(path, sizeof path, where, "ops");
    int k = 0;
    for (const cJSON *c = rc ? NULL : arr->child; c && !rc; c = c->next, k++) {
        int kind = cJSON_IsString(c) ? op_kind_from_name(c->valuestring) : -1;
        char idx[16];
        snprintf(idx, sizeof idx, "%d", k);
        if (kind < 0)
            rc = rd_fail(r, path, idx, "expected an op kind such as \"gemm\", got %s%s%s",
                         json_type(c), cJSON_IsString(c) ? " " : "",
                         cJSON_IsString(c) ? c->valuestring : "");
        else
            s->kinds[k] = (op_kind)kind;
    }
    return rc;
}

/* A segment must be the scheme's segment `span`. */
static int rd_segment(rd *r, const cJSON *o, const char *where, fusion_segment span,
                      plan_segment *s) {
    static const char *const keys[] = {"first", "last", "ops", "template", "kernel", "params",
                                       "ms", NULL};
    int rc = rd_shape_of(r, o, "", where, keys);
    if (!rc)
        rc = rd_int32(r, o, where, "first", span.first, span.first, &s->first);
    if (!rc)
        rc = rd_int32(r, o, where, "last", span.last, span.last, &s->last);
    if (!rc)
        rc = rd_seg_ops(r, o, where, s);
    if (!rc)
        rc = rd_kernel(r, o, where, "template", ~0u, &s->kernel);
    char file[64];
    if (!rc)
        rc = rd_str(r, o, where, "kernel", file, sizeof file);
    const char *want = rc ? "" : fusion_template_get(s->kernel.tmpl)->kernel;
    if (!rc && strcmp(file, want) != 0)
        rc = rd_fail(r, where, "kernel", "template %s runs \"%s\", not \"%s\"",
                     fusion_template_get(s->kernel.tmpl)->name, want, file);
    return rc ? rc : rd_time(r, o, where, "ms", &s->ms);
}

/* The binary and hex forms must parse, agree, and have `n` ops. */
static int rd_scheme(rd *r, const cJSON *o, const char *where, int n, fusion_scheme *s) {
    static const char *const keys[] = {"binary", "hex", NULL};
    char path[256], bin[FUSION_SCHEME_BINARY_MAX], hex[FUSION_SCHEME_HEX_MAX];
    path_join(path, sizeof path, where, "scheme");
    const cJSON *sc = get(o, "scheme");
    int rc = rd_shape_of(r, sc, where, "scheme", keys);
    if (!rc)
        rc = rd_str(r, sc, path, "binary", bin, sizeof bin);
    if (!rc)
        rc = rd_str(r, sc, path, "hex", hex, sizeof hex);
    if (rc)
        return rc;
    stof_error e = {0};
    fusion_scheme h;
    if (fusion_scheme_parse(bin, n, s, &e) != STOF_OK)
        return rd_fail(r, path, "binary", "%s", e.msg);
    if (fusion_scheme_parse(hex, n, &h, &e) != STOF_OK)
        return rd_fail(r, path, "hex", "%s", e.msg);
    if (!fusion_scheme_equal(s, &h))
        return rd_fail(r, path, "hex", "\"%s\" is not the scheme \"%s\"", hex, bin);
    return STOF_OK;
}

static int rd_instances(rd *r, const cJSON *o, const char *where, plan_sequence *q) {
    const cJSON *arr = NULL;
    int n = 0, rc = rd_array(r, o, where, "instances", 1, 1 << 20, &arr, &n);
    if (!rc && !(q->instances = err_malloc(sizeof *q->instances * (size_t)n, r->err)))
        rc = STOF_ERR_NOMEM;
    char path[256];
    path_join(path, sizeof path, where, "instances");
    for (const cJSON *c = rc ? NULL : arr->child; c && !rc; c = c->next) {
        char idx[16];
        snprintf(idx, sizeof idx, "%d", q->n_instances);
        int prev = q->n_instances ? q->instances[q->n_instances - 1] : -1;
        int ok = cJSON_IsNumber(c) && isfinite(c->valuedouble) &&
                 floor(c->valuedouble) == c->valuedouble && c->valuedouble > prev &&
                 c->valuedouble < (double)INT32_MAX;
        if (!ok)
            return rd_fail(r, path, idx, "expected an op index above %d, got %s", prev,
                           json_type(c));
        q->instances[q->n_instances++] = (int)c->valuedouble;
    }
    return rc;
}

static int rd_segments(rd *r, const cJSON *o, const char *where, plan_sequence *q) {
    fusion_segment spans[FUSION_MAX_OPS];
    int want = fusion_scheme_segments(&q->scheme, spans, FUSION_MAX_OPS);
    const cJSON *arr = NULL;
    int n = 0, rc = rd_array(r, o, where, "segments", want, want, &arr, &n);
    if (!rc && !(q->segments = err_calloc((size_t)n, sizeof *q->segments, r->err)))
        rc = STOF_ERR_NOMEM;
    double sum = 0;
    for (const cJSON *c = rc ? NULL : arr->child; c && !rc; c = c->next) {
        char sub[96];
        path_index(sub, sizeof sub, where, "segments", q->n_segments);
        rc = rd_segment(r, c, sub, spans[q->n_segments], &q->segments[q->n_segments]);
        if (!rc)
            sum += q->segments[q->n_segments++].ms;
    }
    if (!rc && !sum_matches(q->ms, sum))
        rc = rd_fail(r, where, "ms", "%.17g is not the sum of its segments' times (%.17g)", q->ms,
                     sum);
    return rc;
}

static int rd_sequence(rd *r, const cJSON *o, const char *where, plan_sequence *q) {
    static const char *const keys[] = {"layer", "ops", "instances", "scheme", "ms", "segments",
                                       NULL};
    int rc = rd_shape_of(r, o, "", where, keys);
    if (!rc)
        rc = rd_int32(r, o, where, "layer", -1, INT32_MAX, &q->layer);
    if (!rc)
        rc = rd_int32(r, o, where, "ops", 1, FUSION_MAX_OPS, &q->n_ops);
    if (!rc)
        rc = rd_instances(r, o, where, q);
    if (!rc)
        rc = rd_scheme(r, o, where, q->n_ops, &q->scheme);
    if (!rc)
        rc = rd_time(r, o, where, "ms", &q->ms);
    return rc ? rc : rd_segments(r, o, where, q);
}

static int rd_sequences(rd *r, const cJSON *root, plan *p) {
    const cJSON *arr = NULL;
    int n = 0, rc = rd_array(r, root, "", "sequences", 1, 1 << 16, &arr, &n);
    if (!rc && !(p->sequences = err_calloc((size_t)n, sizeof *p->sequences, r->err)))
        rc = STOF_ERR_NOMEM;
    for (const cJSON *c = rc ? NULL : arr->child; c && !rc; c = c->next) {
        char where[64];
        path_index(where, sizeof where, "", "sequences", p->n_sequences);
        /* counted first: what a half-read sequence allocated is freed too */
        rc = rd_sequence(r, c, where, &p->sequences[p->n_sequences++]);
    }
    return rc;
}

static int rd_stats(rd *r, const cJSON *root, plan_stats *s) {
    static const char *const keys[] = {"settings_measured", "cache_hits", "schemes_tried",
                                       "schemes_kept", "rounds", NULL};
    static const char *const with_past[] = {"settings_measured", "cache_hits", "schemes_tried",
                                            "schemes_kept", "rounds", "measured_past_limit",
                                            NULL};
    const cJSON *o = get(root, "search");
    int past = cJSON_IsObject(o) && get(o, "measured_past_limit") != NULL;
    int rc = rd_shape_of(r, o, "", "search", past ? with_past : keys);
    if (!rc)
        rc = rd_long(r, o, "search", "settings_measured", &s->settings_measured);
    if (!rc)
        rc = rd_long(r, o, "search", "cache_hits", &s->cache_hits);
    if (!rc)
        rc = rd_long(r, o, "search", "schemes_tried", &s->schemes_tried);
    if (!rc)
        rc = rd_long(r, o, "search", "schemes_kept", &s->schemes_kept);
    if (!rc)
        rc = rd_int32(r, o, "search", "rounds", 0, INT32_MAX, &s->rounds);
    s->measured_past_limit = 0;
    if (!rc && past)
        rc = rd_long(r, o, "search", "measured_past_limit", &s->measured_past_limit);
    return rc;
}

/* The keys a plan holds: end_to_end and decode are optional (and a decode step's plan holds no
 * decode of its own). */
static int rd_header(rd *r, const cJSON *root, plan *p, int is_step) {
    const char *keys[16] = {"format",     "version",  "stof",   "device", "script",
                            "shapes",     "masks",    "sequences", "latency_ms", "tuning_s",
                            "search",     NULL};
    int n = 11;
    char format[32];
    p->has_end_to_end = cJSON_IsObject(root) && get(root, "end_to_end") != NULL;
    if (p->has_end_to_end)
        keys[n++] = "end_to_end";
    if (!is_step && cJSON_IsObject(root) && get(root, "decode"))
        keys[n++] = "decode";
    keys[n] = NULL;
    int rc = rd_shape_of(r, root, "", "", keys);
    if (!rc)
        rc = rd_str(r, root, "", "format", format, sizeof format);
    if (!rc && strcmp(format, PLAN_FORMAT_NAME) != 0)
        rc = rd_fail(r, "", "format", "expected \"%s\", got \"%s\"", PLAN_FORMAT_NAME, format);
    if (!rc)
        rc = rd_int32(r, root, "", "version", PLAN_FORMAT_VERSION, PLAN_FORMAT_VERSION,
                      &p->version);
    return rc;
}

static int rd_latency(rd *r, const cJSON *root, plan *p) {
    int rc = rd_time(r, root, "", "latency_ms", &p->latency_ms);
    if (!rc)
        rc = rd_time(r, root, "", "tuning_s", &p->tuning_s);
    double sum = 0;
    for (int i = 0; i < p->n_sequences; i++)
        sum += p->sequences[i].ms * p->sequences[i].n_instances;
    if (!rc && !sum_matches(p->latency_ms, sum))
        rc = rd_fail(r, "", "latency_ms",
                     "%.17g is not the sum of the sequences' times over their instances (%.17g)",
                     p->latency_ms, sum);
    return rc;
}

static int rd_end_to_end(rd *r, const cJSON *root, plan *p) {
    static const char *const keys[] = {"graph_ms", "eager_ms", "unfused_ms", NULL};
    if (!p->has_end_to_end)
        return STOF_OK;
    const cJSON *o = get(root, "end_to_end");
    int rc = rd_shape_of(r, o, "", "end_to_end", keys);
    if (!rc)
        rc = rd_time(r, o, "end_to_end", "graph_ms", &p->end_to_end.graph_ms);
    if (!rc)
        rc = rd_time(r, o, "end_to_end", "eager_ms", &p->end_to_end.eager_ms);
    if (!rc)
        rc = rd_time(r, o, "end_to_end", "unfused_ms", &p->end_to_end.unfused_ms);
    return rc;
}

static int rd_plan(rd *r, const cJSON *root, plan *p, int is_step);

/* One decode step: its batch (one not seen before), context and own plan, read with its path
 * in front of its messages. */
static int rd_decode_step(rd *r, const cJSON *o, const char *where, plan *p) {
    static const char *const keys[] = {"batch", "context", "plan", NULL};
    int batch = 0;
    int64_t context = 0;
    int rc = rd_shape_of(r, o, "", where, keys);
    if (!rc)
        rc = rd_int32(r, o, where, "batch", 1, 1 << 20, &batch);
    if (!rc)
        rc = rd_int(r, o, where, "context", 1, INT32_MAX, &context);
    if (!rc && plan_decode_find(p, batch))
        rc = rd_fail(r, where, "batch", "a second decode step for batch %d", batch);
    if (rc)
        return rc;
    char source[1200];
    snprintf(source, sizeof source, "%s: %s.plan", r->source, where);
    rd nested = {source, r->err};
    plan step;
    memset(&step, 0, sizeof step);
    rc = rd_plan(&nested, get(o, "plan"), &step, 1);
    if (!rc)
        rc = plan_add_decode(p, batch, context, &step, r->err);
    plan_free(&step);
    return rc;
}

static int rd_decode(rd *r, const cJSON *root, plan *p) {
    if (!get(root, "decode"))
        return STOF_OK;
    const cJSON *arr = NULL;
    int n = 0, rc = rd_array(r, root, "", "decode", 1, 64, &arr, &n);
    for (const cJSON *c = rc ? NULL : arr->child; c && !rc; c = c->next) {
        char where[64];
        path_index(where, sizeof where, "", "decode", p->n_decode);
        rc = rd_decode_step(r, c, where, p);
    }
    return rc;
}

static int rd_plan(rd *r, const cJSON *root, plan *p, int is_step) {
    int rc = rd_header(r, root, p, is_step);
    if (!rc)
        rc = rd_stof(r, root, p);
    if (!rc)
        rc = rd_device(r, root, &p->device);
    if (!rc)
        rc = rd_script(r, root, p);
    if (!rc)
        rc = rd_shapes(r, root, p);
    if (!rc)
        rc = rd_masks(r, root, p);
    if (!rc)
        rc = rd_sequences(r, root, p);
    if (!rc)
        rc = rd_latency(r, root, p);
    if (!rc)
        rc = rd_end_to_end(r, root, p);
    if (!rc)
        rc = rd_stats(r, root, &p->stats);
    return rc || is_step ? rc : rd_decode(r, root, p);
}

/* Line and column of position `at` in text, for a parse error. */
static void text_position(const char *text, const char *at, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (const char *c = text; c < at; c++) {
        *col = *c == '\n' ? 1 : *col + 1;
        *line += *c == '\n';
    }
}

static int only_space(const char *s, const char *end) {
    for (; s < end; s++)
        if (*s != ' ' && *s != '\t' && *s != '\n' && *s != '\r')
            return 0;
    return 1;
}

int plan_from_json(const char *text, size_t len, const char *source, plan *p, stof_error *err) {
    memset(p, 0, sizeof *p);
    rd r = {source ? source : "plan", err};
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    int line, col;
    if (!root) {
        const char *at = end && end >= text && end <= text + len ? end : text + len;
        text_position(text, at, &line, &col);
        return err_set(err, STOF_ERR_FORMAT, "%s: not valid JSON (line %d, column %d)", r.source,
                       line, col);
    }
    if (end && !only_space(end, text + len)) {
        text_position(text, end, &line, &col);
        cJSON_Delete(root);
        return err_set(err, STOF_ERR_FORMAT, "%s: text after the plan (line %d, column %d)",
                       r.source, line, col);
    }
    int rc = rd_plan(&r, root, p, 0);
    cJSON_Delete(root);
    if (rc)
        plan_free(p);
    return rc;
}

int plan_read(const char *path, plan *p, stof_error *err) {
    memset(p, 0, sizeof *p);
    size_t len;
    char *text = NULL;
    int rc = file_read(path, "plan", FILE_LIMIT_PLAN, &text, &len, err);
    if (rc)
        return rc;
    rc = plan_from_json(text, len, path, p, err);
    free(text);
    return rc;
}
