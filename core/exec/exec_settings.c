/* Settings and kernels without the GPU, for the tuner and offline plans: a
 * segment's candidate settings (the template's space, the attention
 * selector's picks), the builds a setting compiles to, and compiling them
 * into a cache ahead of a run. */
#include <string.h>

#include "core/base/error.h"
#include "core/exec/exec_impl.h"

/* The attention problem of segment s with its mask folded (the caller frees
 * *folded with mask_free). */
static int attn_folded(const graph *g, const exec_segment *s, mha_exec_problem *p, mask **folded,
                       stof_error *err) {
    exec_launch_attention_problem(g, s, p, NULL);
    return mha_exec_fold_mask(p, folded, err);
}

static void attn_choice(const mha_exec_config *c, exec_choice *out) {
    memset(out, 0, sizeof *out);
    if (c->kernel == MHA_KERNEL_BLOCK_WISE) {
        *out = (exec_choice){FUSION_T_ATTENTION_BLOCK, {c->block_m, c->block_n, c->num_warps}};
    } else {
        *out = (exec_choice){FUSION_T_ATTENTION_ROW, {c->rows_per_warp, c->warps_per_block}};
    }
}

static int in_space(const exec_choice *c) {
    const fusion_template *t = fusion_template_get(c->tmpl);
    for (int k = 0; k < t->n_params; k++) {
        int ok = 0;
        for (int v = 0; v < t->params[k].n_values && !ok; v++)
            ok = t->params[k].values[v] == c->values[k];
        if (!ok)
            return 0;
    }
    return 1;
}

int exec_segment_candidates(const graph *g, const exec_segment *s,
                            const struct mha_device_limits *lim, int measure, exec_choice *out,
                            int cap, int *n, stof_error *err) {
    *n = 0;
    if (cap < 1)
        return err_set(err, STOF_ERR_INVALID, "no room for a candidate");
    if (exec_launch_is_gemm_family(s->tmpl)) {
        gemm_exec_problem p;
        int rc = exec_launch_gemm_problem(g, s, &p, err);
        if (rc)
            return rc;
        out[0] = (exec_choice){s->tmpl, {0}};
        gemm_exec_default_values(&p, lim ? lim->arch : NULL, out[0].values);
        *n = 1;
        return STOF_OK;
    }
    if (s->tmpl == FUSION_T_CUBLASLT) { /* the heuristic's favourite */
        out[0] = (exec_choice){s->tmpl, {0}};
        *n = 1;
        return STOF_OK;
    }
    if (s->tmpl == FUSION_T_ATTENTION_DECODE) { /* the planner's split of the keys */
        mha_decode_problem p;
        exec_launch_decode_problem(g, s, &p);
        int splits = mha_decode_default_splits(&p, lim ? lim->sm_count : 0);
        splits = splits < 64 ? splits : 64;
        out[0] = (exec_choice){s->tmpl,
                               {splits, mha_decode_default_warps(&p, splits,
                                                                 lim ? lim->sm_count : 0)}};
        *n = in_space(&out[0]);
        return *n ? STOF_OK
                  : err_set(err, STOF_ERR_UNSUPPORTED, "attention_decode: a split of %d with "
                            "%d warps is outside the template's parameters", out[0].values[0],
                            out[0].values[1]);
    }
    if (!exec_launch_is_attention(s->tmpl))
        return err_set(err, STOF_ERR_UNSUPPORTED, "template %s has no default setting",
                       fusion_template_get(s->tmpl)->name);
    mha_exec_problem p;
    mask *folded = NULL;
    int rc = attn_folded(g, s, &p, &folded, err);
    mha_exec_config cfgs[MHA_EXEC_MAX_MEASURED];
    int n_cfg = 0;
    char reason[256];
    mha_exec_force force = {.kernel = -1, .measure = measure};
    if (!rc && measure > 0)
        rc = mha_exec_candidates(&p, folded, lim, &force, cfgs, MHA_EXEC_MAX_MEASURED, &n_cfg,
                                 reason, sizeof reason, err);
    else if (!rc && (rc = mha_exec_choose(&p, folded, lim, NULL, cfgs, reason, sizeof reason,
                                          err)) == STOF_OK)
        n_cfg = 1;
    mask_free(folded);
    for (int k = 0; !rc && k < n_cfg && *n < cap; k++) {
        attn_choice(&cfgs[k], &out[*n]);
        *n += in_space(&out[*n]);
    }
    if (!rc && *n == 0)
        rc = err_set(err, STOF_ERR_UNSUPPORTED,
                     "the attention selector's choice is outside the templates' parameters");
    return rc;
}

const nvrtc_request *exec_build_request(const exec_build *b) {
    return b->attention ? &b->r.mha.req : &b->r.gemm.req;
}

static int gx_builds(const graph *g, const exec_segment *s, const mha_device_limits *lim,
                     exec_builds_mode mode, exec_build *out, int *n, stof_error *err) {
    gemm_exec_problem p;
    int values[FUSION_MAX_PARAMS];
    int rc = exec_launch_gemm_problem(g, s, &p, err);
    if (!rc && mode == EXEC_BUILDS_PLANNED)
        rc = gemm_exec_validate(&p, err);
    if (rc)
        return rc;
    if (s->has_values)
        memcpy(values, s->values, sizeof values);
    else
        gemm_exec_default_values(&p, lim->arch, values);
    if (mode == EXEC_BUILDS_PLANNED && (rc = gemm_exec_check(&p, values, lim->smem_per_block,
                                                             err)) != STOF_OK)
        return rc;
    /* no kernel to build in either mode */
    if ((rc = gemm_exec_check_arch(&p, values, lim->arch, err)) != STOF_OK)
        return rc;
    out[0].attention = 0;
    gemm_exec_request_init(&out[0].r.gemm, &p, values, lim->arch);
    *n = 1;
    return STOF_OK;
}

/* The configuration the attention plan of s takes for lim, and whether it
 * splits rows (PLANNED; ALL builds both). */
static int attn_builds(const graph *g, const exec_segment *s, const mha_device_limits *lim,
                       exec_builds_mode mode, exec_build *out, int *n, stof_error *err) {
    mha_exec_problem p;
    mask *folded = NULL;
    mha_exec_force f;
    exec_launch_attention_problem(g, s, &p, &f);
    mha_exec_config cfg;
    char reason[256];
    int split = 0, rc = attn_folded(g, s, &p, &folded, err);
    if (!rc && mode == EXEC_BUILDS_PLANNED)
        rc = mha_exec_validate(&p, err);
    if (!rc)
        rc = mha_exec_choose(&p, folded, lim, s->auto_attention ? NULL : &f, &cfg, reason,
                             sizeof reason, err);
    if (!rc && mode == EXEC_BUILDS_PLANNED)
        rc = mha_exec_config_check(&cfg, lim->smem_per_block, err);
    if (!rc && mode == EXEC_BUILDS_PLANNED)
        rc = mha_exec_plan_splits(&p, folded, &cfg, lim, f.split_chunk, &split, err);
    cfg.lse = mha_exec_wants_lse(&p, folded);
    mask_free(folded);
    if (rc)
        return rc;
    int both = mode == EXEC_BUILDS_ALL && cfg.kernel == MHA_KERNEL_BLOCK_WISE;
    for (int k = 0; k <= both; k++) {
        cfg.split = both ? k : split;
        out[k].attention = 1;
        mha_exec_request_init(&out[k].r.mha, &cfg, lim->arch);
    }
    *n = both + 1;
    if (p.global_keys) { /* and the global tokens' kernels */
        out[*n].attention = 1;
        mha_exec_global_request_init(&out[*n].r.mha, &p, lim->arch);
        ++*n;
    }
    return STOF_OK;
}

int exec_segment_builds(const graph *g, const exec_segment *s, const mha_device_limits *lim,
                        exec_builds_mode mode, exec_build *out, int *n, stof_error *err) {
    *n = 0;
    if (exec_launch_is_gemm_family(s->tmpl))
        return gx_builds(g, s, lim, mode, out, n, err);
    if (exec_launch_is_attention(s->tmpl))
        return attn_builds(g, s, lim, mode, out, n, err);
    return STOF_OK; /* nothing compiled at run time (a vendor library) */
}

int exec_segment_compile(const graph *g, const exec_segment *s,
                         const struct mha_device_limits *lim, struct nvrtc_cache *cache,
                         stof_error *err) {
    exec_build b[EXEC_MAX_BUILDS];
    int n = 0;
    int rc = exec_segment_builds(g, s, lim, EXEC_BUILDS_ALL, b, &n, err);
    for (int k = 0; !rc && k < n; k++) {
        const void *cubin;
        size_t size;
        rc = nvrtc_get(cache, exec_build_request(&b[k]), &cubin, &size, err);
    }
    return rc;
}
