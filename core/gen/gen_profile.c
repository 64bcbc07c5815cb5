/* The decode step timed after a GPU generation (gen_options.profile_reps): the step's
 * CUDA graph replayed alone, and its segments in place, grouped by kind (gen_result). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/gen/gen_state.h"
#include "fusion/templates.h"
#include "ops/ops.h"

/* "matmul bias gelu" for segment s. */
static void segment_ops(const exec_plan *p, const exec_segment *s, char *out, size_t n) {
    size_t len = 0;
    out[0] = '\0';
    for (int o = 0; o < s->n && len < n; o++)
        len += (size_t)snprintf(out + len, n - len, "%s%s", o ? " " : "",
                                op_describe(p->g->ops[s->first + o].kind)->name);
}

/* The row of r for (ops, tmpl), added when new. */
static gen_profile_row *row_of(gen_result *r, const char *ops, const char *tmpl) {
    for (int k = 0; k < r->n_profile; k++)
        if (r->profile[k].tmpl == tmpl && strcmp(r->profile[k].ops, ops) == 0)
            return &r->profile[k];
    gen_profile_row *w = &r->profile[r->n_profile++];
    snprintf(w->ops, sizeof w->ops, "%s", ops);
    w->tmpl = tmpl;
    return w;
}

static int slower_first(const void *a, const void *b) {
    double x = ((const gen_profile_row *)a)->ms, y = ((const gen_profile_row *)b)->ms;
    return (x < y) - (x > y);
}

int gen_profile_step(exec_model *xm, const exec_plan *p, int reps, gen_result *r,
                     stof_error *err) {
    int n = p->n_segs;
    double *seg_ms = err_calloc((size_t)(n ? n : 1), sizeof *seg_ms, err);
    r->profile = err_calloc((size_t)(n ? n : 1), sizeof *r->profile, err);
    int rc = seg_ms && r->profile ? STOF_OK : STOF_ERR_NOMEM;
    if (!rc)
        rc = exec_model_time(xm, 1, reps, &r->step_graph_ms, err);
    if (!rc)
        rc = exec_model_profile(xm, reps, seg_ms, err);
    for (int s = 0; !rc && s < n; s++) {
        char ops[96];
        segment_ops(p, &p->segs[s], ops, sizeof ops);
        const fusion_template *t = fusion_template_get(exec_model_template(xm, s));
        gen_profile_row *w = row_of(r, ops, t ? t->name : "?");
        w->count++;
        w->ms += seg_ms[s];
    }
    if (!rc)
        qsort(r->profile, (size_t)r->n_profile, sizeof *r->profile, slower_first);
    free(seg_ms);
    return rc;
}
