/* Problems and settings of the GEMM-family templates, on the CPU: the table
 * of template rows (gemm_template.h), and validation, feasibility, shared
 * memory, default settings and compile requests, each asking the problem's
 * row. The settings' feasibility is the template registry's
 * (fusion/templates.c), one place; the rows add only what is particular to
 * the kernels as written. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/base/error.h"
#include "core/exec/gemm/gemm_template.h"

/* ---- the table -------------------------------------------------------------------- */

static const gemm_template *const gemm_templates[] = {
    &gemm_template_epilogue, &gemm_template_ln,        &gemm_template_chain,
    &gemm_template_mi_chain, &gemm_template_embedding, &gemm_template_glu,
    &gemm_template_rotary,    &gemm_template_mask_rows, &gemm_template_gemv,
};

const gemm_template *gemm_template_get(fusion_template_id t) {
    for (size_t i = 0; i < sizeof gemm_templates / sizeof gemm_templates[0]; i++)
        if (gemm_templates[i]->id == t)
            return gemm_templates[i];
    return NULL;
}

const char *gemm_template_name(fusion_template_id t) {
    const fusion_template *ft = fusion_template_get(t);
    return ft ? ft->name : "?";
}

/* ---- helpers the rows share -------------------------------------------------------- */

int gemm_validate_sizes(const char *what, int64_t m, int64_t n, int64_t k, stof_error *err) {
    if (m < 1 || m > INT32_MAX || n < 8 || n > INT32_MAX || k < 8 || k > INT32_MAX || n % 8 ||
        k % 8)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "%s: M = %lld, N = %lld, K = %lld: M must be in 1..2^31-1 and "
                       "N, K positive multiples of 8 (16-byte loads)",
                       what, (long long)m, (long long)n, (long long)k);
    return STOF_OK;
}

int gemm_validate_eps(const char *what, float eps, stof_error *err) {
    if (!(isfinite(eps) && eps > 0.0f))
        return err_set(err, STOF_ERR_INVALID, "%s: eps must be positive, got %g", what,
                       (double)eps);
    return STOF_OK;
}

int gemm_widest_vec(int64_t n) {
    int v = 8;
    while (n % v)
        v /= 2;
    return v;
}

void gemm_first_feasible(const gemm_exec_problem *p, const int (*candidates)[5], int n, int from,
                         int *v) {
    for (int i = from; i < n; i++) {
        memcpy(v, candidates[i], sizeof candidates[i]);
        stof_error err = {0};
        if (gemm_exec_check(p, v, GEMM_EXEC_DEFAULT_SMEM, &err) == STOF_OK)
            return;
    }
}

const char *gemm_glu_act_name(int act) {
    return act == STOF_ACT_GELU        ? "gelu"
           : act == STOF_ACT_GELU_TANH ? "gelu_tanh"
           : act == STOF_ACT_SILU      ? "silu"
                                       : NULL;
}

void gemm_grid_stride_defaults(int64_t row, int *v) {
    v[0] = 256;
    v[1] = gemm_widest_vec(row);
}

unsigned gemm_grid_stride_blocks(const gemm_exec_ctx *c, int64_t units, int threads) {
    int64_t blocks = gemm_ceil_div(units, threads);
    int64_t cap = (int64_t)(c->info.sm_count > 0 ? c->info.sm_count : 132) * 16;
    return (unsigned)(blocks < 1 ? 1 : blocks < cap ? blocks : cap);
}

void gemm_grid_stride_shape(const gemm_exec_ctx *c, gemm_exec_plan *plan, int64_t units) {
    plan->grid[0] = gemm_grid_stride_blocks(c, units, plan->values[0]);
    plan->block[0] = (unsigned)plan->values[0];
}

void gemm_request_define(gemm_exec_request *r, const char *name, long long value) {
    if (r->req.n_options < GEMM_EXEC_MAX_OPTS) {
        snprintf(r->opts[r->req.n_options], sizeof r->opts[0], "-D%s=%lld", name, value);
        r->req.options[r->req.n_options] = r->opts[r->req.n_options];
        r->req.n_options++;
    }
}

/* ---- problems ---------------------------------------------------------------------- */

int gemm_exec_validate(const gemm_exec_problem *p, stof_error *err) {
    const gemm_template *row = gemm_template_get(p->tmpl);
    if (!row)
        return err_set(err, STOF_ERR_INVALID, "gemm_exec runs gemm_epilogue, gemm_ln, "
                       "gemm_chain, mi_chain, embedding, glu, rotary, mask_rows and gemv, not "
                       "template %d (%s)", (int)p->tmpl, gemm_template_name(p->tmpl));
    if (p->dtype != STOF_F16 && p->dtype != STOF_BF16)
        return err_set(err, STOF_ERR_UNSUPPORTED, "%s: dtype %s (f16 or bf16 only)",
                       gemm_template_name(p->tmpl), stof_dtype_name(p->dtype));
    if ((int)p->epi.act < FUSION_ACT_NONE || p->epi.act > FUSION_ACT_RELU ||
        (int)p->epi.norm < FUSION_NORM_NONE || p->epi.norm > FUSION_NORM_RMSNORM)
        return err_set(err, STOF_ERR_INVALID, "%s: unknown activation %d or norm %d",
                       gemm_template_name(p->tmpl), (int)p->epi.act, (int)p->epi.norm);
    if (p->f32 && p->tmpl != FUSION_T_MI_CHAIN)
        return err_set(err, STOF_ERR_UNSUPPORTED, "%s: fp32 tensors beside %s (only mi_chain "
                       "takes them)", gemm_template_name(p->tmpl), stof_dtype_name(p->dtype));
    return row->validate(p, err);
}

void gemm_exec_dims(const gemm_exec_problem *p, fusion_dims *d) {
    const gemm_template *row = gemm_template_get(p->tmpl);
    memset(d, 0, sizeof *d);
    d->m = p->m;
    d->n = p->n;
    d->k = p->k;
    d->n2 = row && row->uses_n2 ? p->n2 : 0;
    d->elem_bytes = (int)stof_dtype_size(p->dtype);
    d->row_reduce = row ? row->row_reduce(p) : 0;
    d->weight_kn = p->weight_kn;
    d->heads = p->heads;
    d->head_dim = p->head_dim;
    d->gated = p->tmpl == FUSION_T_GEMV && p->glu_act > 0;
    d->prologue = p->tmpl == FUSION_T_GEMV && p->prologue != FUSION_NORM_NONE;
}

/* ---- settings ---------------------------------------------------------------------- */

int gemm_exec_check(const gemm_exec_problem *p, const int *values, int smem_limit,
                    stof_error *err) {
    const gemm_template *row = gemm_template_get(p->tmpl);
    if (!row)
        return gemm_exec_validate(p, err);
    fusion_dims d;
    gemm_exec_dims(p, &d);
    int rc = fusion_template_check(fusion_template_get(p->tmpl), &d, values, smem_limit, err);
    if (rc || !row->check)
        return rc;
    return row->check(p, values, err);
}

int gemm_exec_check_arch(const gemm_exec_problem *p, const int *v, const char *arch,
                         stof_error *err) {
    const gemm_template *row = gemm_template_get(p->tmpl);
    return row && row->check_arch ? row->check_arch(p, v, arch, err) : STOF_OK;
}

size_t gemm_exec_smem(const gemm_exec_problem *p, const int *v) {
    const gemm_template *row = gemm_template_get(p->tmpl);
    return row && row->smem ? row->smem(p, v) : 0;
}

int gemm_exec_cluster(const gemm_exec_problem *p, const int *v) {
    const gemm_template *row = gemm_template_get(p->tmpl);
    return row && row->cluster ? row->cluster(p, v) : 1;
}

int gemm_exec_wgmma(const gemm_exec_problem *p, const int *v, const char *arch) {
    const gemm_template *row = gemm_template_get(p->tmpl);
    return row && row->wgmma ? row->wgmma(p, v, arch) : 0;
}

int gemm_exec_persistent(const gemm_exec_problem *p, const int *v, const char *arch) {
    const gemm_template *row = gemm_template_get(p->tmpl);
    return row && row->persistent ? row->persistent(p, v, arch) : 0;
}

void gemm_exec_default_values(const gemm_exec_problem *p, const char *arch, int *v) {
    const gemm_template *row = gemm_template_get(p->tmpl);
    memset(v, 0, FUSION_MAX_PARAMS * sizeof *v);
    if (row)
        row->defaults(p, arch, v);
}

const char *gemm_exec_kernel_name(fusion_template_id t) {
    const gemm_template *row = gemm_template_get(t);
    return row ? row->kernel : NULL;
}

void gemm_exec_request_init(gemm_exec_request *r, const gemm_exec_problem *p, const int *values,
                            const char *arch) {
    memset(r, 0, sizeof *r);
    const int wgmma = gemm_exec_wgmma(p, values, arch);
    snprintf(r->arch, sizeof r->arch, "%s%s", arch, wgmma ? "a" : "");
    r->req.arch = r->arch;
    const fusion_template *t = fusion_template_get(p->tmpl);
    r->req.source = t ? t->kernel : "?";
    for (int i = 0; t && i < t->n_params; i++)
        gemm_request_define(r, t->params[i].name, values[i]);
    gemm_request_define(r, "STOF_DTYPE", (int)p->dtype);
    const gemm_template *row = gemm_template_get(p->tmpl);
    if (row)
        row->defines(r, p, values, arch);
}
