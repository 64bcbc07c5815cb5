/* Writing a plan as JSON (cJSON): the layout is in plan.h; times are
 * written so that they read back as the same doubles. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/plan/plan.h"
#include "ops/ops.h"


/* cJSON's add functions return NULL when out of memory; the writers below
 * count failures in *bad rather than test each one. */
typedef struct wr {
    int bad;
} wr;

static cJSON *wr_check(wr *w, cJSON *item) {
    w->bad |= item == NULL;
    return item;
}

static void wr_str(wr *w, cJSON *obj, const char *key, const char *value) {
    wr_check(w, cJSON_AddStringToObject(obj, key, value));
}

static void wr_num(wr *w, cJSON *obj, const char *key, double value) {
    wr_check(w, cJSON_AddNumberToObject(obj, key, value));
}

/* A time, in the fewest digits that read back as the same double: cJSON's
 * own printing accepts a near miss, and a plan must round-trip exactly. */
static void wr_time(wr *w, cJSON *obj, const char *key, double value) {
    char buf[40];
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, value);
        if (strtod(buf, NULL) == value)
            break;
    }
    wr_check(w, cJSON_AddRawToObject(obj, key, buf));
}

/* 64-bit hashes as "0x" + 16 hex digits: a JSON number (a double) would
 * lose their low bits. */
static void wr_hex64(wr *w, cJSON *obj, const char *key, uint64_t value) {
    char buf[24];
    snprintf(buf, sizeof buf, "0x%016" PRIx64, value);
    wr_str(w, obj, key, buf);
}

static cJSON *wr_obj(wr *w, cJSON *parent, const char *key) {
    return wr_check(w, cJSON_AddObjectToObject(parent, key));
}

static cJSON *wr_arr(wr *w, cJSON *parent, const char *key) {
    return wr_check(w, cJSON_AddArrayToObject(parent, key));
}

/* A new object appended to an array. */
static cJSON *wr_item(wr *w, cJSON *arr) {
    cJSON *o = cJSON_CreateObject();
    if (!o || !arr || !cJSON_AddItemToArray(arr, o)) {
        cJSON_Delete(o);
        w->bad = 1;
        return NULL;
    }
    return o;
}

static void wr_int_item(wr *w, cJSON *arr, double v) {
    cJSON *n = cJSON_CreateNumber(v);
    if (!n || !arr || !cJSON_AddItemToArray(arr, n)) {
        cJSON_Delete(n);
        w->bad = 1;
    }
}

static void wr_str_item(wr *w, cJSON *arr, const char *s) {
    cJSON *n = cJSON_CreateString(s);
    if (!n || !arr || !cJSON_AddItemToArray(arr, n)) {
        cJSON_Delete(n);
        w->bad = 1;
    }
}

static void wr_kernel(wr *w, cJSON *obj, const char *key, const plan_kernel *k) {
    const fusion_template *t = fusion_template_get(k->tmpl);
    wr_str(w, obj, key, t->name);
    cJSON *params = wr_obj(w, obj, "params");
    for (int i = 0; params && i < t->n_params && i < k->n_values; i++)
        wr_num(w, params, t->params[i].name, k->values[i]);
}

static void wr_device(wr *w, cJSON *root, const plan_device *d) {
    cJSON *o = wr_obj(w, root, "device");
    if (!o)
        return;
    wr_str(w, o, "name", d->measured ? d->name : PLAN_UNMEASURED);
    if (d->measured) {
        char cc[32];
        snprintf(cc, sizeof cc, "%d.%d", d->cc_major, d->cc_minor);
        wr_str(w, o, "compute_capability", cc);
        wr_num(w, o, "sms", d->sm_count);
    }
    wr_str(w, o, "arch", d->arch);
}

static void wr_script(wr *w, cJSON *root, const plan *p) {
    cJSON *o = wr_obj(w, root, "script");
    if (!o)
        return;
    wr_str(w, o, "name", p->script_name);
    wr_hex64(w, o, "hash", p->script_hash);
    cJSON *params = wr_obj(w, o, "params");
    for (int i = 0; params && i < p->n_params; i++)
        wr_str(w, params, p->params[i].key, p->params[i].value);
    if (p->script_path[0])
        wr_str(w, o, "path", p->script_path);
    if (p->model_dir[0])
        wr_str(w, o, "model_dir", p->model_dir);
}

static void wr_end_to_end(wr *w, cJSON *root, const plan *p) {
    if (!p->has_end_to_end)
        return;
    cJSON *o = wr_obj(w, root, "end_to_end");
    if (!o)
        return;
    wr_time(w, o, "graph_ms", p->end_to_end.graph_ms);
    wr_time(w, o, "eager_ms", p->end_to_end.eager_ms);
    wr_time(w, o, "unfused_ms", p->end_to_end.unfused_ms);
}

static void wr_shapes(wr *w, cJSON *root, const plan *p) {
    cJSON *o = wr_obj(w, root, "shapes");
    if (!o)
        return;
    wr_num(w, o, "batch", (double)p->batch);
    wr_num(w, o, "seq", (double)p->seq);
    cJSON *arr = wr_arr(w, o, "inputs");
    for (int i = 0; i < p->n_inputs; i++) {
        cJSON *in = wr_item(w, arr);
        if (!in)
            continue;
        wr_str(w, in, "name", p->inputs[i].name);
        cJSON *shape = wr_arr(w, in, "shape");
        for (int d = 0; d < p->inputs[i].ndim; d++)
            wr_int_item(w, shape, (double)p->inputs[i].shape[d]);
    }
}

static void wr_masks(wr *w, cJSON *root, const plan *p) {
    cJSON *arr = wr_arr(w, root, "masks");
    for (int i = 0; i < p->n_masks; i++) {
        const plan_mask *m = &p->masks[i];
        cJSON *o = wr_item(w, arr);
        if (!o)
            continue;
        wr_str(w, o, "description", m->description ? m->description : "");
        wr_hex64(w, o, "fingerprint", m->fingerprint);
        wr_num(w, o, "batch", m->batch);
        wr_num(w, o, "q_len", m->q_len);
        wr_num(w, o, "k_len", m->k_len);
    }
}

static void wr_segment(wr *w, cJSON *arr, const plan_segment *s) {
    cJSON *o = wr_item(w, arr);
    if (!o)
        return;
    wr_num(w, o, "first", s->first);
    wr_num(w, o, "last", s->last);
    cJSON *ops = wr_arr(w, o, "ops");
    for (int k = 0; k <= s->last - s->first; k++)
        wr_str_item(w, ops, op_describe(s->kinds[k])->name);
    wr_kernel(w, o, "template", &s->kernel);
    wr_str(w, o, "kernel", fusion_template_get(s->kernel.tmpl)->kernel);
    wr_time(w, o, "ms", s->ms);
}

static void wr_sequence(wr *w, cJSON *arr, const plan_sequence *q) {
    cJSON *o = wr_item(w, arr);
    if (!o)
        return;
    wr_num(w, o, "layer", q->layer);
    wr_num(w, o, "ops", q->n_ops);
    cJSON *inst = wr_arr(w, o, "instances");
    for (int i = 0; i < q->n_instances; i++)
        wr_int_item(w, inst, q->instances[i]);
    cJSON *scheme = wr_obj(w, o, "scheme");
    char bin[FUSION_SCHEME_BINARY_MAX], hex[FUSION_SCHEME_HEX_MAX];
    fusion_scheme_format_binary(&q->scheme, bin, sizeof bin);
    fusion_scheme_format_hex(&q->scheme, hex, sizeof hex);
    if (scheme) {
        wr_str(w, scheme, "binary", bin);
        wr_str(w, scheme, "hex", hex);
    }
    wr_time(w, o, "ms", q->ms);
    cJSON *segs = wr_arr(w, o, "segments");
    for (int k = 0; k < q->n_segments; k++)
        wr_segment(w, segs, &q->segments[k]);
}

static void wr_stats(wr *w, cJSON *root, const plan_stats *s) {
    cJSON *o = wr_obj(w, root, "search");
    if (!o)
        return;
    wr_num(w, o, "settings_measured", (double)s->settings_measured);
    wr_num(w, o, "cache_hits", (double)s->cache_hits);
    wr_num(w, o, "schemes_tried", (double)s->schemes_tried);
    wr_num(w, o, "schemes_kept", (double)s->schemes_kept);
    wr_num(w, o, "rounds", s->rounds);
    if (s->measured_past_limit > 0) /* written only then: older readers keep reading the rest */
        wr_num(w, o, "measured_past_limit", (double)s->measured_past_limit);
}

static void wr_plan(wr *w, cJSON *root, const plan *p);

/* "decode": each step's batch, context and own plan. */
static void wr_decode(wr *w, cJSON *root, const plan *p) {
    if (!p->n_decode)
        return;
    cJSON *arr = wr_arr(w, root, "decode");
    for (int i = 0; arr && i < p->n_decode; i++) {
        cJSON *o = wr_item(w, arr);
        if (!o)
            return;
        wr_num(w, o, "batch", p->decode[i].batch);
        wr_num(w, o, "context", (double)p->decode[i].context);
        cJSON *step = wr_obj(w, o, "plan");
        if (step)
            wr_plan(w, step, p->decode[i].step);
    }
}

static void wr_plan(wr *w, cJSON *root, const plan *p) {
    wr_str(w, root, "format", PLAN_FORMAT_NAME);
    wr_num(w, root, "version", PLAN_FORMAT_VERSION);
    cJSON *stof = wr_obj(w, root, "stof");
    if (stof) {
        wr_str(w, stof, "version", p->stof_version);
        wr_str(w, stof, "commit", p->stof_commit);
    }
    wr_device(w, root, &p->device);
    wr_script(w, root, p);
    wr_shapes(w, root, p);
    wr_masks(w, root, p);
    cJSON *seqs = wr_arr(w, root, "sequences");
    for (int i = 0; i < p->n_sequences; i++)
        wr_sequence(w, seqs, &p->sequences[i]);
    wr_time(w, root, "latency_ms", p->latency_ms);
    wr_time(w, root, "tuning_s", p->tuning_s);
    wr_end_to_end(w, root, p);
    wr_stats(w, root, &p->stats);
    wr_decode(w, root, p);
}

static int finite_times(const plan *p) {
    int ok = isfinite(p->latency_ms) && isfinite(p->tuning_s);
    if (p->has_end_to_end)
        ok &= isfinite(p->end_to_end.graph_ms) && isfinite(p->end_to_end.eager_ms) &&
              isfinite(p->end_to_end.unfused_ms);
    for (int i = 0; i < p->n_sequences; i++) {
        ok &= isfinite(p->sequences[i].ms);
        for (int k = 0; k < p->sequences[i].n_segments; k++)
            ok &= isfinite(p->sequences[i].segments[k].ms) &&
                  fusion_template_get(p->sequences[i].segments[k].kernel.tmpl) != NULL;
    }
    for (int i = 0; i < p->n_decode; i++)
        ok &= finite_times(p->decode[i].step);
    return ok;
}

int plan_to_json(const plan *p, char **text, stof_error *err) {
    *text = NULL;
    if (!finite_times(p))
        return err_set(err, STOF_ERR_INVALID,
                       "a plan with a time that is not finite or an unknown template cannot be "
                       "written");
    cJSON *root = cJSON_CreateObject();
    wr w = {root == NULL};
    if (root)
        wr_plan(&w, root, p);
    if (!w.bad)
        *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!*text)
        return err_set(err, STOF_ERR_NOMEM, "out of memory while writing a plan");
    return STOF_OK;
}

int plan_write(const plan *p, const char *path, stof_error *err) {
    char *text;
    int rc = plan_to_json(p, &text, err);
    if (rc)
        return rc;
    FILE *f = fopen(path, "w");
    if (!f) {
        free(text);
        return err_set(err, STOF_ERR_IO, "cannot write the plan %s: %s", path, strerror(errno));
    }
    size_t len = strlen(text);
    int ok = fwrite(text, 1, len, f) == len && fputc('\n', f) != EOF;
    ok &= fclose(f) == 0;
    free(text);
    if (!ok)
        return err_set(err, STOF_ERR_IO, "cannot write the plan %s: %s", path, strerror(errno));
    return STOF_OK;
}
