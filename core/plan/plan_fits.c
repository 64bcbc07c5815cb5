/* Whether a plan fits the device, script and graph at hand
 * (plan_check_fits). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/gpu/device.h"
#include "core/plan/plan.h"
#include "ops/mask.h"
#include "ops/ops.h"


static int fits_device(const plan *p, const stof_device_info *dev, stof_error *err) {
    char arch[16];
    device_arch_name(dev, arch, sizeof arch);
    const plan_device *d = &p->device;
    if (!d->measured) {
        if (strcmp(d->arch, arch) != 0)
            return err_set(err, STOF_ERR_MISMATCH,
                           "the plan was made offline for %s, but this GPU (%s) is %s", d->arch,
                           dev->name, arch);
        return STOF_OK;
    }
    if (strcmp(d->name, dev->name) != 0 || d->cc_major != dev->cc_major ||
        d->cc_minor != dev->cc_minor || d->sm_count != dev->sm_count)
        return err_set(err, STOF_ERR_MISMATCH,
                       "the plan was tuned on another GPU: '%s' (%s, %d SMs), this one is '%s' "
                       "(%s, %d SMs)", d->name, d->arch, d->sm_count, dev->name, arch,
                       dev->sm_count);
    return STOF_OK;
}

static const char *script_param(const graph_script *s, const char *key) {
    for (int i = 0; i < s->n_params; i++)
        if (strcmp(s->params[i].key, key) == 0)
            return s->params[i].value;
    return NULL;
}

static int fits_script(const plan *p, const graph_script *s, stof_error *err) {
    if (strcmp(p->script_name, s->name) != 0)
        return err_set(err, STOF_ERR_MISMATCH, "the plan is for script %s, not %s",
                       p->script_name, s->name);
    if (p->script_hash != s->content_hash)
        return err_set(err, STOF_ERR_MISMATCH,
                       "script %s changed since the plan was made (hash 0x%016" PRIx64
                       ", now 0x%016" PRIx64 ")", s->name, p->script_hash, s->content_hash);
    for (int i = 0; i < p->n_params; i++) {
        const char *now = script_param(s, p->params[i].key);
        if (!now || strcmp(now, p->params[i].value) != 0)
            return err_set(err, STOF_ERR_MISMATCH,
                           "the plan was made with %s=%s, the script now has %s%s%s",
                           p->params[i].key, p->params[i].value, now ? p->params[i].key : "no ",
                           now ? "=" : p->params[i].key, now ? now : "");
    }
    for (int i = 0; i < s->n_params; i++) {
        int found = 0;
        for (int k = 0; k < p->n_params && !found; k++)
            found = strcmp(p->params[k].key, s->params[i].key) == 0;
        if (!found)
            return err_set(err, STOF_ERR_MISMATCH, "the script has %s=%s, which the plan does "
                           "not know", s->params[i].key, s->params[i].value);
    }
    return STOF_OK;
}

static int fits_inputs(const plan *p, const graph *g, stof_error *err) {
    int k = 0;
    for (int t = 0; t < g->n_tensors; t++) {
        const graph_tensor *gt = &g->tensors[t];
        if (gt->role != GRAPH_INPUT)
            continue;
        if (k == p->n_inputs)
            return err_set(err, STOF_ERR_MISMATCH, "the graph has an input %s the plan lacks",
                           gt->name);
        const plan_input *in = &p->inputs[k++];
        int same = strcmp(in->name, gt->name) == 0 && in->ndim == gt->ndim;
        for (int d = 0; same && d < gt->ndim; d++)
            same = in->shape[d] == gt->shape[d];
        char now[96];
        if (!same)
            return err_set(err, STOF_ERR_MISMATCH, "input %s is %s, the plan has %s of other "
                           "shape", gt->name, graph_shape_str(gt, now, sizeof now), in->name);
    }
    if (k != p->n_inputs)
        return err_set(err, STOF_ERR_MISMATCH, "the plan has %d inputs, the graph %d",
                       p->n_inputs, k);
    return STOF_OK;
}

static int fits_masks(const plan *p, const graph *g, stof_error *err) {
    if (p->n_masks != g->n_masks)
        return err_set(err, STOF_ERR_MISMATCH, "the plan has %d masks, the graph %d", p->n_masks,
                       g->n_masks);
    for (int i = 0; i < g->n_masks; i++) {
        const mask *m = g->masks[i];
        const plan_mask *pm = &p->masks[i];
        if (!m || m->fingerprint != pm->fingerprint)
            return err_set(err, STOF_ERR_MISMATCH,
                           "mask %d (%s) is not the one the plan was tuned for", i,
                           pm->description);
        /* the stored batch: one for a mask shared by all batches */
        if (m->batch != pm->batch || m->q_len != pm->q_len || m->k_len != pm->k_len)
            return err_set(err, STOF_ERR_MISMATCH,
                           "mask %d (%s): the plan says batch %d, q_len %d, k_len %d; the "
                           "model's is %d, %d, %d", i, pm->description, pm->batch, pm->q_len,
                           pm->k_len, m->batch, m->q_len, m->k_len);
    }
    return STOF_OK;
}

/* The graph's sequences (fusion_sequences; none for a graph without ops)
 * and, per op, the sequence that starts there or -1. */
typedef struct graph_runs {
    fusion_seq *runs;
    int n_runs;
    int *run_at;             /* g->n_ops entries */
    unsigned char *covered;  /* per run: an instance of the plan claimed it */
} graph_runs;

static void graph_runs_free(graph_runs *gr) {
    free(gr->runs);
    free(gr->run_at);
    free(gr->covered);
}

static int graph_runs_build(const graph *g, graph_runs *gr, stof_error *err) {
    *gr = (graph_runs){0};
    int rc = g->n_ops > 0 ? fusion_sequences(g, &gr->runs, &gr->n_runs, err) : STOF_OK;
    if (rc)
        return rc;
    gr->run_at = err_malloc(sizeof *gr->run_at * (size_t)(g->n_ops + 1), err);
    gr->covered = err_calloc((size_t)gr->n_runs + 1, 1, err);
    if (!gr->run_at || !gr->covered)
        return STOF_ERR_NOMEM;
    for (int i = 0; i < g->n_ops; i++)
        gr->run_at[i] = -1;
    for (int r = 0; r < gr->n_runs; r++)
        gr->run_at[gr->runs[r].first] = r;
    return STOF_OK;
}

/* Instance `first` of sequence qi is a whole run of the graph, not claimed
 * by another, with the plan's op kinds. */
static int fits_instance(const plan_sequence *q, int qi, int first, graph_runs *gr,
                         const graph *g, stof_error *err) {
    int r = first >= 0 && first < g->n_ops ? gr->run_at[first] : -1;
    if (r < 0)
        return err_set(err, STOF_ERR_MISMATCH,
                       "sequence %d of the plan starts at op #%d, where no sequence of the graph "
                       "starts", qi, first);
    const fusion_seq *run = &gr->runs[r];
    if (run->n != q->n_ops)
        return err_set(err, STOF_ERR_MISMATCH,
                       "sequence %d of the plan has a scheme of %d ops, but the graph's sequence "
                       "at #%d has %d", qi, q->n_ops, first, run->n);
    if ((run->layer < 0) != (q->layer < 0) || gr->covered[r])
        return err_set(err, STOF_ERR_MISMATCH,
                       "sequence %d of the plan does not match the graph's sequence at #%d", qi,
                       first);
    gr->covered[r] = 1;
    for (int k = 0; k < q->n_segments; k++) {
        const plan_segment *s = &q->segments[k];
        for (int i = s->first; i <= s->last; i++)
            if (g->ops[first + i].kind != s->kinds[i - s->first])
                return err_set(err, STOF_ERR_MISMATCH,
                               "op #%d is %s in the graph but %s in the plan", first + i,
                               op_describe(g->ops[first + i].kind)->name,
                               op_describe(s->kinds[i - s->first])->name);
    }
    return STOF_OK;
}

static int fits_sequences(const plan *p, const graph *g, stof_error *err) {
    graph_runs gr;
    int rc = graph_runs_build(g, &gr, err);
    for (int qi = 0; !rc && qi < p->n_sequences; qi++)
        for (int i = 0; !rc && i < p->sequences[qi].n_instances; i++)
            rc = fits_instance(&p->sequences[qi], qi, p->sequences[qi].instances[i], &gr, g, err);
    for (int r = 0; !rc && r < gr.n_runs; r++)
        if (!gr.covered[r])
            rc = err_set(err, STOF_ERR_MISMATCH,
                         "the graph's ops #%d-#%d (%d) have no scheme in the plan",
                         gr.runs[r].first, gr.runs[r].first + gr.runs[r].n - 1, gr.runs[r].n);
    graph_runs_free(&gr);
    return rc;
}

int plan_check_fits(const plan *p, const stof_device_info *dev, const graph_script *script,
                    const graph *g, stof_error *err) {
    int rc = dev ? fits_device(p, dev, err) : STOF_OK;
    if (!rc && script)
        rc = fits_script(p, script, err);
    if (!rc && g)
        rc = fits_inputs(p, g, err);
    if (!rc && g)
        rc = fits_masks(p, g, err);
    if (!rc && g)
        rc = fits_sequences(p, g, err);
    return rc;
}
