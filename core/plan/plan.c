/* Plans: what a plan owns. Writing is in plan_write.c, strict reading in
 * plan_read.c, the fit checks in plan_fits.c, a search result as a plan in
 * plan_from_search.c. */
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/plan/plan.h"

void plan_free(plan *p) {
    if (!p)
        return;
    for (int i = 0; p->masks && i < p->n_masks; i++)
        free(p->masks[i].description);
    for (int i = 0; p->sequences && i < p->n_sequences; i++) {
        free(p->sequences[i].instances);
        free(p->sequences[i].segments);
    }
    for (int i = 0; p->decode && i < p->n_decode; i++) {
        plan_free(p->decode[i].step);
        free(p->decode[i].step);
    }
    free(p->inputs);
    free(p->masks);
    free(p->sequences);
    free(p->decode);
    memset(p, 0, sizeof *p);
}

const plan_decode *plan_decode_find(const plan *p, int batch) {
    for (int i = 0; i < p->n_decode; i++)
        if (p->decode[i].batch == batch)
            return &p->decode[i];
    return NULL;
}

int plan_add_decode(plan *p, int batch, int64_t context, plan *step, stof_error *err) {
    if (batch < 1 || context < 1 || step->n_decode)
        return err_set(err, STOF_ERR_INVALID, "a decode step for batch %d and context %lld%s",
                       batch, (long long)context,
                       step->n_decode ? " holding decode steps itself" : "");
    if (plan_decode_find(p, batch))
        return err_set(err, STOF_ERR_INVALID, "the plan already holds a decode step for batch %d",
                       batch);
    plan_decode *d = err_realloc(p->decode, sizeof *d * (size_t)(p->n_decode + 1), err);
    plan *own = d ? err_malloc(sizeof *own, err) : NULL;
    if (d)
        p->decode = d;
    if (!own)
        return STOF_ERR_NOMEM;
    *own = *step;
    memset(step, 0, sizeof *step);
    p->decode[p->n_decode++] = (plan_decode){batch, context, own};
    return STOF_OK;
}
