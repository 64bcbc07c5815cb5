/* A new attention plan (mha_exec_plan_create): the problem validated and its mask folded,
 * then the configuration measured (mha_exec_measure.c), remembered from an earlier
 * measurement (mha_exec_wisdom.c) or chosen analytically (mha_exec_choose.c), and the plan
 * built on it (mha_exec_plan.c). See mha_exec.h. */
#include "core/exec/attention/mha_exec.h"

#include <stdio.h>
#include <string.h>

#include "core/exec/attention/mha_exec_internal.h"
#include "core/base/error.h"

/* The (query, key) pairs m allows over the problem's batch (a mask of batch 1 serves all). */
static int64_t count_allowed(const mask *m, int batch) {
    mask_stats st;
    mask_compute_stats(m, 0, 0, &st);
    return m->batch == 1 ? st.nnz * batch : st.nnz;
}

/* The analytical plan: mha_exec_choose's configuration. */
static int plan_analytic(mha_exec_ctx *c, const mha_exec_plan *base, const mask *folded,
                         const mha_device_limits *lim, const mha_exec_force *force,
                         mha_exec_plan **out, stof_error *err) {
    mha_exec_plan *plan = mha_plan_clone(base, err);
    if (!plan)
        return STOF_ERR_NOMEM;
    int rc = mha_exec_choose(&plan->problem, folded, lim, force, &plan->config, plan->reason,
                             sizeof plan->reason, err);
    if (!rc)
        rc = mha_plan_finish(c, plan, folded, force, err);
    if (rc) {
        mha_exec_plan_free(c, plan);
        return rc;
    }
    *out = plan;
    return STOF_OK;
}

/* Whether force leaves the kernel and its settings to the planner (what a
 * remembered measurement may then decide). */
static int nothing_forced(const mha_exec_force *f) {
    return !f || (f->kernel < 0 && !f->block_m && !f->block_n && !f->num_warps &&
                  !f->rows_per_warp && !f->warps_per_block && !f->stages && !f->wgmma &&
                  !f->tma && !f->split_chunk);
}

int mha_exec_plan_create(mha_exec_ctx *c, const mha_exec_problem *p, const mha_exec_force *force,
                         mha_exec_plan **out, stof_error *err) {
    *out = NULL;
    int rc = mha_exec_validate(p, err);
    if (rc)
        return rc;
    if ((rc = cuda_check(c->drv, c->drv->CtxSetCurrent(c->cu), "cuCtxSetCurrent", err)))
        return rc;
    mask *folded = NULL;
    if ((rc = mha_exec_fold_mask(p, &folded, err)))
        return rc;
    /* what every candidate plan shares: the problem and the mask's statistics */
    mha_exec_plan base;
    memset(&base, 0, sizeof base);
    base.problem = *p;
    base.problem.mask = NULL; /* not owned: do not keep a pointer that may dangle */
    snprintf(base.mask_desc, sizeof base.mask_desc, "%s", folded->desc ? folded->desc : "?");
    base.allowed_pairs = count_allowed(folded, p->batch);
    mha_device_limits lim;
    mha_plan_device_limits(c, &base, &lim);
    mha_exec_force remembered;
    if (force && force->measure > 0) {
        rc = mha_plan_measured(c, &base, folded, &lim, force, out, err);
        if (!rc && nothing_forced(force))
            mha_wisdom_record(c, p, folded, &(*out)->config, (*out)->measured_ms);
    } else if (nothing_forced(force) && !(force && force->measure < 0) &&
               mha_wisdom_lookup(c, p, folded, &remembered) &&
               plan_analytic(c, &base, folded, &lim, &remembered, out, err) == STOF_OK) {
        snprintf((*out)->reason, sizeof (*out)->reason, "remembered: the measured choice for "
                 "this problem on this device (%s)", "attention-wisdom.txt");
    } else {
        rc = plan_analytic(c, &base, folded, &lim, force, out, err);
    }
    mask_free(folded);
    return rc;
}
