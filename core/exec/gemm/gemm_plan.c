/* Plans of the GEMM-family templates on the GPU: the context, checking a
 * setting against the device, compiling and loading its kernel, the launch
 * shape (the template's row, then what only the loaded kernel tells: the
 * persistent build's resident blocks, whether a cluster fits), and plan
 * descriptions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/exec/gemm/gemm_template.h"

/* ---- the GPU context ----------------------------------------------------------------- */

int gemm_exec_ctx_create(int ordinal, gemm_exec_ctx **out, stof_error *err) {
    return gpu_ctx_create(ordinal, out, err);
}

void gemm_exec_ctx_free(gemm_exec_ctx *c) {
    gpu_ctx_free(c);
}

/* The loaded kernel of a request (gpu_ctx_function). */
static int get_function(gemm_exec_ctx *c, const gemm_exec_request *r, const char *name,
                        size_t smem, CUfunction *out, stof_error *err) {
    gpu_module *m;
    int rc = gpu_ctx_function(c, &r->req, name, smem, &m, err);
    if (!rc)
        *out = m->func;
    return rc;
}

/* ---- plans ---------------------------------------------------------------------------- */

/* Block y and z and grid y and z are 1 unless the template's row says
 * otherwise. */
static void set_launch_shape(const gemm_exec_ctx *c, gemm_exec_plan *plan) {
    plan->grid[1] = plan->grid[2] = plan->block[1] = plan->block[2] = 1;
    gemm_template_get(plan->problem.tmpl)->launch_shape(c, plan);
}

/* A block (cluster 1) or a cluster of the plan's blocks that the GPU cannot
 * hold: the error saying so. */
static int does_not_fit(const gemm_exec_plan *plan, int cluster, stof_error *err) {
    char what[48] = "a block";
    if (cluster > 1)
        snprintf(what, sizeof what, "a cluster of %d blocks", cluster);
    return err_set(err, STOF_ERR_UNSUPPORTED,
                   "%s: %s of %u threads with %zu bytes of shared memory each does not fit on "
                   "this GPU",
                   gemm_template_name(plan->problem.tmpl), what, plan->block[0], plan->smem);
}

/* The persistent build's grid: as many blocks as the GPU holds at once (the
 * driver's occupancy for this kernel, block size and shared memory), at
 * most one a tile; each block loops over its tiles. */
static int persistent_grid(gemm_exec_ctx *c, gemm_exec_plan *plan, stof_error *err) {
    int per_sm = 0, rc;
    if ((rc = cuda_check(c->drv,
                         c->drv->OccupancyMaxActiveBlocksPerMultiprocessor(
                             &per_sm, plan->func, (int)plan->block[0], plan->smem),
                         "cuOccupancyMaxActiveBlocksPerMultiprocessor", err)))
        return rc;
    if (per_sm < 1)
        return does_not_fit(plan, 1, err);
    const int64_t tiles = (int64_t)plan->grid[0] * plan->grid[1];
    const int64_t resident = (int64_t)per_sm * (c->info.sm_count > 0 ? c->info.sm_count : 1);
    plan->grid[0] = (unsigned)(tiles < resident ? tiles : resident);
    plan->grid[1] = 1;
    return STOF_OK;
}

/* A cluster of more than 8 blocks needs sm_90's non-portable sizes, and
 * one of any size must fit on the GPU (the blocks of a cluster share one GPC):
 * asked of the driver, so that a setting that cannot launch fails here. */
static int cluster_fits(gemm_exec_ctx *c, const gemm_exec_plan *plan, int cluster,
                        stof_error *err) {
    int rc;
    if (cluster > 8 &&
        (rc = cuda_check(c->drv,
                         c->drv->FuncSetAttribute(
                             plan->func, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
                         "cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)", err)))
        return rc;
    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = (unsigned)cluster;
    attr.value.clusterDim.y = attr.value.clusterDim.z = 1;
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = plan->grid[0];
    cfg.gridDimY = plan->grid[1];
    cfg.gridDimZ = plan->grid[2];
    cfg.blockDimX = plan->block[0];
    cfg.blockDimY = plan->block[1];
    cfg.blockDimZ = plan->block[2];
    cfg.sharedMemBytes = (unsigned)plan->smem;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if ((rc = cuda_check(c->drv, c->drv->OccupancyMaxActiveClusters(&clusters, plan->func, &cfg),
                         "cuOccupancyMaxActiveClusters", err)))
        return rc;
    return clusters < 1 ? does_not_fit(plan, cluster, err) : STOF_OK;
}

int gemm_exec_plan_create(gemm_exec_ctx *c, const gemm_exec_problem *p, const int *values,
                          gemm_exec_plan **out, stof_error *err) {
    *out = NULL;
    int rc = gemm_exec_validate(p, err);
    if (rc)
        return rc;
    gemm_exec_plan *plan = err_calloc(1, sizeof *plan, err);
    if (!plan)
        return STOF_ERR_NOMEM;
    plan->problem = *p;
    if (values)
        memcpy(plan->values, values, (size_t)fusion_template_get(p->tmpl)->n_params *
                                         sizeof *values);
    else
        gemm_exec_default_values(p, c->arch, plan->values);
    snprintf(plan->arch, sizeof plan->arch, "%s", c->arch);
    if ((rc = gemm_exec_check_arch(p, plan->values, c->arch, err)) ||
        (rc = gemm_exec_check(p, plan->values, c->info.smem_per_block_optin, err)) ||
        (rc = cuda_check(c->drv, c->drv->CtxSetCurrent(c->cu), "cuCtxSetCurrent", err))) {
        free(plan);
        return rc;
    }
    plan->smem = gemm_exec_smem(p, plan->values);
    set_launch_shape(c, plan);
    gemm_exec_request r;
    gemm_exec_request_init(&r, p, plan->values, c->arch);
    rc = get_function(c, &r, gemm_exec_kernel_name(p->tmpl), plan->smem, &plan->func, err);
    const int cluster = gemm_exec_cluster(p, plan->values);
    if (!rc && cluster > 1)
        rc = cluster_fits(c, plan, cluster, err);
    if (!rc && gemm_exec_persistent(p, plan->values, c->arch))
        rc = persistent_grid(c, plan, err);
    if (!rc && gemm_template_get(p->tmpl)->error_flag) {
        rc = cuda_check(c->drv, c->drv->MemAlloc(&plan->d_error, sizeof(int32_t)),
                        "cuMemAlloc(embedding error flag)", err);
        const int32_t zero = 0;
        if (!rc)
            rc = cuda_check(c->drv, c->drv->MemcpyHtoD(plan->d_error, &zero, sizeof zero),
                            "cuMemcpyHtoD(embedding error flag)", err);
    }
    if (rc) {
        gemm_exec_plan_free(c, plan);
        return rc;
    }
    *out = plan;
    return STOF_OK;
}

void gemm_exec_plan_free(gemm_exec_ctx *c, gemm_exec_plan *plan) {
    if (!plan)
        return;
    if (plan->d_error) {
        c->drv->CtxSetCurrent(c->cu);
        c->drv->MemFree(plan->d_error);
    }
    free(plan);
}

static const char *act_name(fusion_act a) {
    static const char *const names[] = {"", " gelu", " gelu_tanh", " relu"};
    return (int)a >= 0 && a <= FUSION_ACT_RELU ? names[a] : " ?";
}

/* The epilogue's ops in the order the kernel applies them, then what the
 * template's row adds (gemm_chain's second GEMM, embedding's tables). */
static void describe_ops(const gemm_exec_problem *p, char *buf, size_t n) {
    static const char *const norms[] = {"", " layernorm", " rmsnorm"};
    const gemm_template *row = gemm_template_get(p->tmpl);
    const int add = p->epi.has_residual;
    char extra[64] = "";
    if (row->describe_extra)
        row->describe_extra(p, extra, sizeof extra);
    snprintf(buf, n, "%s%s%s%s%s%s%s%s%s%s", p->prologue ? norms[p->prologue] : "",
             p->prologue ? " ahead," : "", p->weight_kn ? " w[K,N]" : "",
             p->epi.has_bias ? " bias" : "",
             add && row->residual_at == GEMM_RESIDUAL_BEFORE_ACT ? " add" : "",
             act_name(p->epi.act),
             add && row->residual_at == GEMM_RESIDUAL_AFTER_ACT ? " add" : "",
             norms[p->epi.norm], p->store_pre_norm ? " +pre_norm" : "", extra);
}

size_t gemm_exec_plan_describe(const gemm_exec_plan *plan, char *buf, size_t n) {
    const gemm_exec_problem *p = &plan->problem;
    const fusion_template *t = fusion_template_get(p->tmpl);
    char setting[160];
    int len = 0;
    setting[0] = '\0';
    for (int i = 0; i < t->n_params && len >= 0 && (size_t)len < sizeof setting; i++)
        len += snprintf(setting + len, sizeof setting - (size_t)len, "%s%s=%d", i ? " " : "",
                        t->params[i].name, plan->values[i]);
    char ops[256];
    describe_ops(p, ops, sizeof ops);
    int k = snprintf(buf, n,
                     "%s %s M=%lld %s=%lld K=%lld%s [%s] smem=%zuB grid=%ux%ux%u block=%u %s%s",
                     t->name, stof_dtype_name(p->dtype), (long long)p->m,
                     gemm_template_get(p->tmpl)->n_name, (long long)p->n, (long long)p->k, ops,
                     setting, plan->smem, plan->grid[0], plan->grid[1], plan->grid[2],
                     plan->block[0], plan->arch,
                     gemm_exec_wgmma(p, plan->values, plan->arch) ? " wgmma" : "");
    return k < 0 ? 0 : (size_t)k;
}
