/* A plan (core/plan/plan.h) made an executor plan: each sequence class's
 * scheme and each segment's template and parameters, as the plan has them
 * (exec.h, exec_plan_from_plan). CPU only. */
#include <stdlib.h>

#include "core/base/error.h"
#include "core/exec/exec.h"
#include "core/plan/plan.h"

static int exec_seq_at(const exec_seq *seqs, int n, int first) {
    for (int i = 0; i < n; i++)
        if (seqs[i].first == first)
            return i;
    return -1;
}

/* schemes[cls] for every class the plan's sequences cover. */
static int plan_schemes(const plan *p, const exec_seq *seqs, int n, fusion_scheme *schemes,
                        stof_error *err) {
    for (int q = 0; q < p->n_sequences; q++) {
        const plan_sequence *ps = &p->sequences[q];
        for (int k = 0; k < ps->n_instances; k++) {
            int i = exec_seq_at(seqs, n, ps->instances[k]);
            if (i < 0 || seqs[i].n != ps->n_ops)
                return err_set(err, STOF_ERR_MISMATCH,
                               "sequence %d of the plan (%d ops at #%d) is not a sequence of "
                               "the graph", q, ps->n_ops, ps->instances[k]);
            fusion_scheme *s = &schemes[seqs[i].cls];
            if (s->n == 0)
                *s = ps->scheme;
            else if (!fusion_scheme_same_segments(s, &ps->scheme))
                return err_set(err, STOF_ERR_MISMATCH,
                               "the plan gives identical layers two schemes (sequence %d)", q);
        }
    }
    return STOF_OK;
}

/* Each segment of plan sequence ps, which xp's sequence i is: its template and parameters. */
static int sequence_choices(const plan_sequence *ps, exec_plan *xp, int i, stof_error *err) {
    for (int k = 0; k < ps->n_segments; k++) {
        int seg = -1;
        for (int j = 0; j < xp->n_segs && seg < 0; j++)
            if (xp->segs[j].seq == i && xp->segs[j].index == k)
                seg = j;
        const plan_kernel *pk = &ps->segments[k].kernel;
        int rc = seg < 0 ? err_set(err, STOF_ERR_INTERNAL, "segment %d is not planned", k)
                         : exec_plan_set_choice(xp, seg, pk->tmpl, pk->values, err);
        if (rc)
            return err_prefix(err, "segment %d: ", k);
    }
    return STOF_OK;
}

/* Each segment of the plan's sequences: its template and parameters. */
static int plan_choices(const plan *p, exec_plan *xp, stof_error *err) {
    for (int q = 0; q < p->n_sequences; q++) {
        const plan_sequence *ps = &p->sequences[q];
        int rc = sequence_choices(ps, xp, exec_seq_at(xp->seqs, xp->n_seqs, ps->instances[0]),
                                  err);
        if (rc)
            return err_prefix(err, "the plan's sequence %d, ", q);
    }
    return STOF_OK;
}

int exec_plan_from_plan(const plan *p, const graph *g, exec_plan **out, stof_error *err) {
    *out = NULL;
    exec_seq *seqs = NULL;
    int n = 0;
    int rc = fusion_sequences(g, &seqs, &n, err);
    fusion_scheme *schemes = rc ? NULL : err_calloc((size_t)n, sizeof *schemes, err);
    if (!rc && !schemes)
        rc = STOF_ERR_NOMEM;
    if (!rc)
        rc = plan_schemes(p, seqs, n, schemes, err);
    if (!rc)
        rc = exec_plan_create(g, schemes, out, err);
    if (!rc && (rc = plan_choices(p, *out, err)) != STOF_OK) {
        exec_plan_free(*out);
        *out = NULL;
    }
    free(seqs);
    free(schemes);
    return rc;
}

/* ---- a prefix of the plan's graph ------------------------------------------------------ */

/* The plan's sequence that starts at g's sequence q (same first op and op count), or NULL. */
static const plan_sequence *plan_sequence_at(const plan *p, const exec_seq *q) {
    for (int k = 0; k < p->n_sequences; k++) {
        const plan_sequence *ps = &p->sequences[k];
        for (int i = 0; ps->n_ops == q->n && i < ps->n_instances; i++)
            if (ps->instances[i] == q->first)
                return ps;
    }
    return NULL;
}

/* schemes[cls]: the plan's where its sequence of that class is g's (the first one found), as a
 * default plan elsewhere (exec_default_schemes). *taken: the classes that took the plan's. */
static int prefix_schemes(const plan *p, const graph *g, const exec_seq *seqs, int n,
                          fusion_scheme *schemes, int *taken, stof_error *err) {
    for (int i = 0; i < n; i++) {
        const plan_sequence *ps = plan_sequence_at(p, &seqs[i]);
        if (ps && !taken[seqs[i].cls]) {
            schemes[seqs[i].cls] = ps->scheme;
            taken[seqs[i].cls] = 1;
        }
    }
    return exec_default_schemes(g, seqs, n, schemes, err);
}

/* Each segment of g's sequences that took the plan's scheme: the plan's template and
 * parameters. */
static int prefix_choices(const plan *p, exec_plan *xp, stof_error *err) {
    for (int i = 0; i < xp->n_seqs; i++) {
        const plan_sequence *ps = plan_sequence_at(p, &xp->seqs[i]);
        if (!ps || !fusion_scheme_same_segments(&xp->schemes[i], &ps->scheme))
            continue;
        int rc = sequence_choices(ps, xp, i, err);
        if (rc)
            return err_prefix(err, "the plan's sequence at op #%d, ", xp->seqs[i].first);
    }
    return STOF_OK;
}

int exec_plan_from_plan_prefix(const plan *p, const graph *g, int kernels, exec_plan **out,
                               int *n_taken, stof_error *err) {
    *out = NULL;
    *n_taken = 0;
    exec_seq *seqs = NULL;
    int n = 0;
    int rc = fusion_sequences(g, &seqs, &n, err);
    fusion_scheme *schemes = rc ? NULL : err_calloc((size_t)n, sizeof *schemes, err);
    int *taken = rc ? NULL : err_calloc((size_t)n, sizeof *taken, err);
    if (!rc && (!schemes || !taken))
        rc = STOF_ERR_NOMEM;
    if (!rc)
        rc = prefix_schemes(p, g, seqs, n, schemes, taken, err);
    if (!rc)
        rc = exec_plan_create(g, schemes, out, err);
    if (!rc && kernels && (rc = prefix_choices(p, *out, err)) != STOF_OK) {
        exec_plan_free(*out);
        *out = NULL;
    }
    for (int c = 0; !rc && c < n; c++)
        *n_taken += taken[c];
    free(seqs);
    free(schemes);
    free(taken);
    return rc;
}
