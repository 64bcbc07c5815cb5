/* A search result as a plan (plan_from_search): what was tuned, for what. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/plan/plan.h"
#include "ops/mask.h"

static void fill_device(const stof_device_info *dev, const char *arch, plan_device *d) {
    d->measured = dev != NULL;
    snprintf(d->name, sizeof d->name, "%s", dev ? dev->name : PLAN_UNMEASURED);
    if (dev) {
        d->cc_major = dev->cc_major;
        d->cc_minor = dev->cc_minor;
        d->sm_count = dev->sm_count;
        snprintf(d->arch, sizeof d->arch, "sm_%d%d", dev->cc_major, dev->cc_minor);
    } else {
        snprintf(d->arch, sizeof d->arch, "%s", arch ? arch : "");
    }
}

static void fill_script(const graph_script *s, plan *p) {
    if (!s)
        return;
    snprintf(p->script_name, sizeof p->script_name, "%s", s->name);
    /* where it is, for finding it again (absolute when it can be) */
    char *abs = s->path[0] ? realpath(s->path, NULL) : NULL;
    snprintf(p->script_path, sizeof p->script_path, "%s", abs ? abs : s->path);
    free(abs);
    abs = s->model_dir[0] ? realpath(s->model_dir, NULL) : NULL;
    snprintf(p->model_dir, sizeof p->model_dir, "%s", abs ? abs : s->model_dir);
    free(abs);
    p->script_hash = s->content_hash;
    p->n_params = s->n_params;
    memcpy(p->params, s->params, sizeof p->params[0] * (size_t)s->n_params);
}

/* The inputs, and batch x seq from the first input of two or more dims (the
 * token ids). */
static int fill_shapes(const graph *g, plan *p, stof_error *err) {
    p->inputs = err_calloc((size_t)g->n_tensors, sizeof *p->inputs, err);
    if (!p->inputs)
        return STOF_ERR_NOMEM;
    p->batch = p->seq = 1;
    for (int t = 0; t < g->n_tensors; t++) {
        const graph_tensor *gt = &g->tensors[t];
        if (gt->role != GRAPH_INPUT)
            continue;
        plan_input *in = &p->inputs[p->n_inputs++];
        snprintf(in->name, sizeof in->name, "%s", gt->name);
        in->ndim = gt->ndim;
        memcpy(in->shape, gt->shape, sizeof in->shape);
        if (p->n_inputs == 1 && gt->ndim >= 2) {
            p->batch = gt->shape[0];
            p->seq = gt->shape[1];
        }
    }
    return STOF_OK;
}

static int fill_masks(const graph *g, plan *p, stof_error *err) {
    p->masks = err_calloc((size_t)g->n_masks + 1, sizeof *p->masks, err);
    if (!p->masks)
        return STOF_ERR_NOMEM;
    for (int i = 0; i < g->n_masks; i++) {
        const mask *m = g->masks[i];
        plan_mask *pm = &p->masks[p->n_masks++];
        pm->description = strdup(m->desc ? m->desc : "");
        if (!pm->description)
            return err_set(err, STOF_ERR_NOMEM, "out of memory filling a plan");
        pm->fingerprint = m->fingerprint;
        pm->batch = m->batch;
        pm->q_len = m->q_len;
        pm->k_len = m->k_len;
    }
    return STOF_OK;
}

static plan_kernel seg_kernel(const search_seg_result *s) {
    plan_kernel k = {s->tmpl, s->n_values, {0}};
    memcpy(k.values, s->values, sizeof k.values);
    return k;
}

static int fill_sequence(const graph *g, const search_sequence *sq, const search_seq_result *r,
                         plan_sequence *q, stof_error *err) {
    *q = (plan_sequence){.layer = sq->layer, .n_ops = sq->n, .scheme = r->scheme, .ms = r->ms};
    q->instances = err_malloc(sizeof *q->instances * (size_t)sq->count, err);
    q->segments = err_calloc((size_t)r->n_segs, sizeof *q->segments, err);
    if (!q->instances || !q->segments)
        return STOF_ERR_NOMEM;
    q->n_instances = sq->count;
    memcpy(q->instances, sq->firsts, sizeof *q->instances * (size_t)sq->count);
    q->n_segments = r->n_segs;
    for (int k = 0; k < r->n_segs; k++) {
        const search_seg_result *s = &r->segs[k];
        plan_segment *ps = &q->segments[k];
        ps->first = s->first;
        ps->last = s->last;
        ps->kernel = seg_kernel(s);
        ps->ms = s->ms;
        for (int i = s->first; i <= s->last; i++)
            ps->kinds[i - s->first] = g->ops[sq->firsts[0] + i].kind;
    }
    return STOF_OK;
}

static int fill_sequences(const search_result *r, const graph *g, const search_sequence *seqs,
                          plan *p, stof_error *err) {
    p->sequences = err_calloc((size_t)r->n_seqs, sizeof *p->sequences, err);
    if (!p->sequences)
        return STOF_ERR_NOMEM;
    for (int q = 0; q < r->n_seqs; q++) {
        /* counted first: plan_free frees a half-filled one */
        int rc = fill_sequence(g, &seqs[q], &r->seqs[q], &p->sequences[p->n_sequences++], err);
        if (rc)
            return rc;
    }
    return STOF_OK;
}

int plan_from_search(const search_result *r, const graph *g, const search_sequence *seqs,
                     const graph_script *script, const stof_device_info *dev,
                     const char *arch, plan *p, stof_error *err) {
    memset(p, 0, sizeof *p);
    p->version = PLAN_FORMAT_VERSION;
    snprintf(p->stof_version, sizeof p->stof_version, "%s", stof_version());
    snprintf(p->stof_commit, sizeof p->stof_commit, "%s", stof_build_commit());
    fill_device(dev, arch, &p->device);
    fill_script(script, p);
    int rc = fill_shapes(g, p, err);
    if (!rc)
        rc = fill_masks(g, p, err);
    if (!rc)
        rc = fill_sequences(r, g, seqs, p, err);
    p->latency_ms = r->total_ms;
    p->tuning_s = r->stats.seconds;
    p->stats = (plan_stats){r->stats.measured, r->stats.cache_hits, r->stats.schemes_tried,
                            r->stats.schemes_kept, r->stats.rounds,
                            r->stats.measured_past_limit};
    if (rc)
        plan_free(p);
    return rc;
}
