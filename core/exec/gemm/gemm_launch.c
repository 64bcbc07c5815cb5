/* Launches of the GEMM-family templates: the argument blocks (checking the
 * tensors a plan reads and writes), the wgmma build's tensor maps, the
 * launches on a stream, and the embedding's bad-id flag. */
#include <stdio.h>
#include <string.h>

#include "core/base/error.h"
#include "core/exec/gemm/gemm_template.h"

/* ---- argument blocks -------------------------------------------------------------------- */

/* A tensor the kernel reads or writes: present, 16-byte aligned, with a row
 * stride (0 = row_len) that is a multiple of 8 and at least row_len. */
static int check_tensor(const char *what, const char *name, CUdeviceptr ptr, int64_t *stride,
                        int64_t row_len, stof_error *err) {
    if (*stride == 0)
        *stride = row_len;
    if (!ptr || ptr % 16 || *stride % 8 || *stride < row_len)
        return err_set(err, STOF_ERR_INVALID,
                       "%s: %s must be a 16-byte aligned device pointer with a row stride that "
                       "is a multiple of 8 elements and at least %lld (pointer 0x%llx, stride "
                       "%lld)",
                       what, name, (long long)row_len, (unsigned long long)ptr,
                       (long long)*stride);
    return STOF_OK;
}

/* A vector or table read whole-row at a time: present and 16-byte aligned. */
static int check_ptr(const char *what, const char *name, CUdeviceptr ptr, stof_error *err) {
    if (!ptr || ptr % 16)
        return err_set(err, STOF_ERR_INVALID,
                       "%s: %s must be a 16-byte aligned device pointer (got 0x%llx)", what, name,
                       (unsigned long long)ptr);
    return STOF_OK;
}

static int wrong_plan(const gemm_exec_plan *plan, fusion_template_id want, stof_error *err) {
    if (plan->problem.tmpl == want)
        return STOF_OK;
    return err_set(err, STOF_ERR_INVALID, "a %s plan launched as %s",
                   gemm_template_name(plan->problem.tmpl), gemm_template_name(want));
}

#define PTR(d) ((void *)(uintptr_t)(d))

int gemm_exec_gemm_args(const gemm_exec_plan *plan, const gemm_exec_gemm_tensors *t,
                        stof_gemm_args *a, stof_error *err) {
    const gemm_exec_problem *p = &plan->problem;
    const char *what = "gemm_epilogue";
    gemm_exec_gemm_tensors s = *t;
    const int norm = p->epi.norm != FUSION_NORM_NONE;
    const int layernorm = p->epi.norm == FUSION_NORM_LAYERNORM;
    int rc;
    memset(a, 0, sizeof *a);
    if ((rc = wrong_plan(plan, FUSION_T_GEMM_EPILOGUE, err)) ||
        (rc = check_tensor(what, "x", s.x, &s.x_row_stride, p->k, err)) ||
        (rc = check_tensor(what, "w", s.w, &s.w_row_stride, p->weight_kn ? p->n : p->k, err)) ||
        (rc = check_tensor(what, "y", s.y, &s.y_row_stride, p->n, err)) ||
        (p->epi.has_bias && (rc = check_ptr(what, "bias", s.bias, err))) ||
        (p->epi.has_residual &&
         (rc = check_tensor(what, "residual", s.residual, &s.r_row_stride, p->n, err))) ||
        (norm && (rc = check_ptr(what, "gamma", s.gamma, err))) ||
        (layernorm && (rc = check_ptr(what, "beta", s.beta, err))) ||
        (p->store_pre_norm &&
         (rc = check_tensor(what, "pre_norm", s.pre_norm, &s.p_row_stride, p->n, err))))
        return rc;
    a->x = PTR(s.x);
    a->w = PTR(s.w);
    a->bias = p->epi.has_bias ? PTR(s.bias) : NULL;
    a->residual = p->epi.has_residual ? PTR(s.residual) : NULL;
    a->gamma = norm ? PTR(s.gamma) : NULL;
    a->beta = layernorm ? PTR(s.beta) : NULL;
    a->y = PTR(s.y);
    a->pre_norm = p->store_pre_norm ? PTR(s.pre_norm) : NULL;
    a->x_row_stride = s.x_row_stride;
    a->w_row_stride = s.w_row_stride;
    a->r_row_stride = p->epi.has_residual ? s.r_row_stride : 0;
    a->y_row_stride = s.y_row_stride;
    a->p_row_stride = p->store_pre_norm ? s.p_row_stride : 0;
    a->m = (int32_t)p->m;
    a->n = (int32_t)p->n;
    a->k = (int32_t)p->k;
    a->eps = norm ? p->eps : 0.0f;
    return STOF_OK;
}

/* A tensor gemv reads or writes an element at a time (y, the residual): present, aligned to
 * its elements, a row stride (0 = row_len) of at least row_len. */
static int check_elementwise(const char *name, CUdeviceptr ptr, int64_t *stride, int64_t row_len,
                             stof_error *err) {
    if (*stride == 0)
        *stride = row_len;
    if (!ptr || ptr % 2 || *stride < row_len)
        return err_set(err, STOF_ERR_INVALID,
                       "gemv: %s must be a device pointer of 16-bit elements with a row stride "
                       "of at least %lld (pointer 0x%llx, stride %lld)",
                       name, (long long)row_len, (unsigned long long)ptr, (long long)*stride);
    return STOF_OK;
}

int gemm_exec_gemv_args(const gemm_exec_plan *plan, const gemm_exec_gemm_tensors *t,
                        stof_gemv_args *a, stof_error *err) {
    const gemm_exec_problem *p = &plan->problem;
    gemm_exec_gemm_tensors s = *t;
    int64_t bias_stride = 0;
    int rc;
    memset(a, 0, sizeof *a);
    if ((rc = wrong_plan(plan, FUSION_T_GEMV, err)) ||
        (rc = check_tensor("gemv", "x", s.x, &s.x_row_stride, p->k, err)) ||
        (rc = check_tensor("gemv", "w", s.w, &s.w_row_stride, p->weight_kn ? p->n : p->k,
                           err)) ||
        (rc = check_elementwise("y", s.y, &s.y_row_stride, p->glu_act ? p->n / 2 : p->n,
                                err)) ||
        (p->epi.has_bias && (rc = check_elementwise("bias", s.bias, &bias_stride, p->n, err))) ||
        (p->epi.has_residual &&
         (rc = check_elementwise("residual", s.residual, &s.r_row_stride, p->n, err))) ||
        (p->prologue != FUSION_NORM_NONE && (rc = check_ptr("gemv", "gamma", s.gamma, err))) ||
        (p->prologue == FUSION_NORM_LAYERNORM && (rc = check_ptr("gemv", "beta", s.beta, err))))
        return rc;
    a->x = PTR(s.x);
    a->w = PTR(s.w);
    a->bias = p->epi.has_bias ? PTR(s.bias) : NULL;
    a->residual = p->epi.has_residual ? PTR(s.residual) : NULL;
    a->gamma = p->prologue != FUSION_NORM_NONE ? PTR(s.gamma) : NULL;
    a->beta = p->prologue == FUSION_NORM_LAYERNORM ? PTR(s.beta) : NULL;
    a->eps = p->eps;
    a->y = PTR(s.y);
    a->x_row_stride = s.x_row_stride;
    a->w_row_stride = s.w_row_stride;
    a->r_row_stride = p->epi.has_residual ? s.r_row_stride : 0;
    a->y_row_stride = s.y_row_stride;
    a->m = (int32_t)p->m;
    a->n = (int32_t)p->n;
    a->k = (int32_t)p->k;
    return STOF_OK;
}

int gemm_exec_ln_args(const gemm_exec_plan *plan, const gemm_exec_ln_tensors *t,
                      stof_gemm_ln_args *a, stof_error *err) {
    const gemm_exec_problem *p = &plan->problem;
    const char *what = "gemm_ln";
    gemm_exec_ln_tensors s = *t;
    const int layernorm = p->epi.norm == FUSION_NORM_LAYERNORM;
    int rc;
    memset(a, 0, sizeof *a);
    if ((rc = wrong_plan(plan, FUSION_T_GEMM_LN, err)) ||
        (rc = check_tensor(what, "x", s.x, &s.x_row_stride, p->k, err)) ||
        (rc = check_tensor(what, "w", s.w, &s.w_row_stride, p->weight_kn ? p->n : p->k, err)) ||
        (rc = check_tensor(what, "y", s.y, &s.y_row_stride, p->n, err)) ||
        (p->epi.has_bias && (rc = check_ptr(what, "bias", s.bias, err))) ||
        (p->epi.has_residual &&
         (rc = check_tensor(what, "residual", s.residual, &s.r_row_stride, p->n, err))) ||
        (rc = check_ptr(what, "gamma", s.gamma, err)) ||
        (layernorm && (rc = check_ptr(what, "beta", s.beta, err))) ||
        (p->store_pre_norm &&
         (rc = check_tensor(what, "pre_norm", s.pre_norm, &s.p_row_stride, p->n, err))))
        return rc;
    a->x = PTR(s.x);
    a->w = PTR(s.w);
    a->bias = p->epi.has_bias ? PTR(s.bias) : NULL;
    a->residual = p->epi.has_residual ? PTR(s.residual) : NULL;
    a->gamma = PTR(s.gamma);
    a->beta = layernorm ? PTR(s.beta) : NULL;
    a->y = PTR(s.y);
    a->pre_norm = p->store_pre_norm ? PTR(s.pre_norm) : NULL;
    a->x_row_stride = s.x_row_stride;
    a->w_row_stride = s.w_row_stride;
    a->r_row_stride = p->epi.has_residual ? s.r_row_stride : 0;
    a->y_row_stride = s.y_row_stride;
    a->p_row_stride = p->store_pre_norm ? s.p_row_stride : 0;
    a->eps = p->eps;
    a->m = (int32_t)p->m;
    a->n = (int32_t)p->n;
    a->k = (int32_t)p->k;
    return STOF_OK;
}

int gemm_exec_chain_args(const gemm_exec_plan *plan, const gemm_exec_chain_tensors *t,
                         stof_gemm_chain_args *a, stof_error *err) {
    const gemm_exec_problem *p = &plan->problem;
    const char *what = "gemm_chain";
    gemm_exec_chain_tensors s = *t;
    const int kn = p->weight_kn != 0;
    int rc;
    memset(a, 0, sizeof *a);
    if ((rc = wrong_plan(plan, FUSION_T_GEMM_CHAIN, err)) ||
        (rc = check_tensor(what, "x", s.x, &s.x_row_stride, p->k, err)) ||
        (rc = check_tensor(what, "w1", s.w1, &s.w1_row_stride, kn ? p->n : p->k, err)) ||
        (rc = check_tensor(what, "w2", s.w2, &s.w2_row_stride, kn ? p->n2 : p->n, err)) ||
        (rc = check_tensor(what, "y", s.y, &s.y_row_stride, p->n2, err)) ||
        (p->epi.has_bias && (rc = check_ptr(what, "b1", s.b1, err))) ||
        (p->epi2.has_bias && (rc = check_ptr(what, "b2", s.b2, err))) ||
        (p->epi2.has_residual &&
         (rc = check_tensor(what, "residual", s.residual, &s.r_row_stride, p->n2, err))))
        return rc;
    a->x = PTR(s.x);
    a->w1 = PTR(s.w1);
    a->b1 = p->epi.has_bias ? PTR(s.b1) : NULL;
    a->w2 = PTR(s.w2);
    a->b2 = p->epi2.has_bias ? PTR(s.b2) : NULL;
    a->residual = p->epi2.has_residual ? PTR(s.residual) : NULL;
    a->y = PTR(s.y);
    a->x_row_stride = s.x_row_stride;
    a->w1_row_stride = s.w1_row_stride;
    a->w2_row_stride = s.w2_row_stride;
    a->r_row_stride = p->epi2.has_residual ? s.r_row_stride : 0;
    a->y_row_stride = s.y_row_stride;
    a->m = (int32_t)p->m;
    a->k = (int32_t)p->k;
    a->f = (int32_t)p->n;
    a->n = (int32_t)p->n2;
    return STOF_OK;
}

int gemm_exec_mi_args(const gemm_exec_plan *plan, const gemm_exec_mi_tensors *t, stof_mi_args *a,
                      stof_error *err) {
    const gemm_exec_problem *p = &plan->problem;
    const char *what = "mi_chain";
    gemm_exec_mi_tensors s = *t;
    const int norm = p->epi.norm != FUSION_NORM_NONE;
    int rc;
    memset(a, 0, sizeof *a);
    if ((rc = wrong_plan(plan, FUSION_T_MI_CHAIN, err)) ||
        (rc = check_tensor(what, "x", s.x, &s.x_row_stride, p->n, err)) ||
        (rc = check_tensor(what, "y", s.y, &s.y_row_stride, p->n, err)) ||
        (p->epi.has_bias && (rc = check_ptr(what, "bias", s.bias, err))) ||
        (p->epi.has_residual &&
         (rc = check_tensor(what, "residual", s.residual, &s.r_row_stride, p->n, err))) ||
        (norm && (rc = check_ptr(what, "gamma", s.gamma, err))) ||
        (p->epi.norm == FUSION_NORM_LAYERNORM && (rc = check_ptr(what, "beta", s.beta, err))) ||
        (p->store_pre_norm &&
         (rc = check_tensor(what, "pre_norm", s.pre_norm, &s.p_row_stride, p->n, err))))
        return rc;
    a->x = PTR(s.x);
    a->bias = p->epi.has_bias ? PTR(s.bias) : NULL;
    a->residual = p->epi.has_residual ? PTR(s.residual) : NULL;
    a->gamma = norm ? PTR(s.gamma) : NULL;
    a->beta = p->epi.norm == FUSION_NORM_LAYERNORM ? PTR(s.beta) : NULL;
    a->y = PTR(s.y);
    a->pre_norm = p->store_pre_norm ? PTR(s.pre_norm) : NULL;
    a->rows = p->m;
    a->x_row_stride = s.x_row_stride;
    a->r_row_stride = p->epi.has_residual ? s.r_row_stride : 0;
    a->y_row_stride = s.y_row_stride;
    a->p_row_stride = p->store_pre_norm ? s.p_row_stride : 0;
    a->eps = p->eps;
    return STOF_OK;
}

int gemm_exec_embed_args(const gemm_exec_plan *plan, const gemm_exec_embed_tensors *t,
                         stof_embed_args *a, stof_error *err) {
    const gemm_exec_problem *p = &plan->problem;
    const char *what = "embedding";
    int rc;
    memset(a, 0, sizeof *a);
    if ((rc = wrong_plan(plan, FUSION_T_EMBEDDING, err)) ||
        (rc = check_ptr(what, "ids", t->ids, err)) ||
        (rc = check_ptr(what, "word", t->word, err)) ||
        (rc = check_ptr(what, "out", t->out, err)) ||
        (p->has_position && (rc = check_ptr(what, "pos", t->pos, err))) ||
        (p->has_type && (rc = check_ptr(what, "type", t->type, err))) ||
        (p->has_type_ids && (rc = check_ptr(what, "type_ids", t->type_ids, err))) ||
        (p->has_position_ids && (rc = check_ptr(what, "pos_ids", t->pos_ids, err))))
        return rc;
    if (!plan->d_error)
        return err_set(err, STOF_ERR_INVALID, "embedding: the plan has no error flag");
    a->ids = (const int32_t *)PTR(t->ids);
    a->word = PTR(t->word);
    a->pos = p->has_position ? PTR(t->pos) : NULL;
    a->type = p->has_type ? PTR(t->type) : NULL;
    a->type_ids = p->has_type_ids ? (const int32_t *)PTR(t->type_ids) : NULL;
    a->type_vocab = p->type_vocab;
    a->pos_ids = p->has_position_ids ? (const int32_t *)PTR(t->pos_ids) : NULL;
    a->pos_rows = p->pos_rows;
    a->out = PTR(t->out);
    a->error = (int32_t *)PTR(plan->d_error);
    a->tokens = p->m;
    a->seq_len = p->seq_len;
    a->hidden = (int32_t)p->n;
    a->vocab = p->vocab;
    return STOF_OK;
}

int gemm_exec_glu_args(const gemm_exec_plan *plan, const gemm_exec_xy_tensors *t,
                       stof_glu_args *a, stof_error *err) {
    const gemm_exec_problem *p = &plan->problem;
    int rc;
    memset(a, 0, sizeof *a);
    if ((rc = wrong_plan(plan, FUSION_T_GLU, err)) || (rc = check_ptr("glu", "x", t->x, err)) ||
        (rc = check_ptr("glu", "y", t->y, err)))
        return rc;
    a->x = PTR(t->x);
    a->y = PTR(t->y);
    a->rows = p->m;
    a->f = (int32_t)p->n;
    return STOF_OK;
}

int gemm_exec_rotary_args(const gemm_exec_plan *plan, const gemm_exec_xy_tensors *t,
                          stof_rotary_args *a, stof_error *err) {
    const gemm_exec_problem *p = &plan->problem;
    int rc;
    memset(a, 0, sizeof *a);
    if ((rc = wrong_plan(plan, FUSION_T_ROTARY, err)) ||
        (rc = check_ptr("rotary", "x", t->x, err)) || (rc = check_ptr("rotary", "y", t->y, err)))
        return rc;
    a->x = PTR(t->x);
    a->y = PTR(t->y);
    a->rows = p->m;
    a->seq_len = p->seq_len;
    a->width = (int32_t)p->n;
    a->rotated = p->heads + p->kv_heads;
    a->theta = p->theta;
    if (p->has_position_ids) {
        if ((rc = check_ptr("rotary", "positions", t->mask, err)))
            return rc;
        a->positions = (const int32_t *)PTR(t->mask);
    }
    return STOF_OK;
}

int gemm_exec_mask_rows_args(const gemm_exec_plan *plan, const gemm_exec_xy_tensors *t,
                             stof_mask_rows_args *a, stof_error *err) {
    const gemm_exec_problem *p = &plan->problem;
    const char *what = "mask_rows";
    int rc;
    memset(a, 0, sizeof *a);
    if ((rc = wrong_plan(plan, FUSION_T_MASK_ROWS, err)) ||
        (rc = check_ptr(what, "x", t->x, err)) || (rc = check_ptr(what, "y", t->y, err)) ||
        (rc = check_ptr(what, "mask", t->mask, err)))
        return rc;
    a->x = PTR(t->x);
    a->mask = (const int32_t *)PTR(t->mask);
    a->y = PTR(t->y);
    a->rows = p->m;
    a->n = (int32_t)p->n;
    return STOF_OK;
}

/* ---- launching ------------------------------------------------------------------------- */

static int launch(gemm_exec_ctx *c, const gemm_exec_plan *plan, void *args, CUstream s,
                  stof_error *err) {
    void *params[] = {args};
    char what[64];
    snprintf(what, sizeof what, "cuLaunchKernel(%s)", gemm_template_name(plan->problem.tmpl));
    return cuda_launch_cluster(c->drv, plan->func, plan->grid, plan->block,
                               (unsigned)plan->smem, s, params, c->pdl,
                               (unsigned)gemm_exec_cluster(&plan->problem, plan->values), what,
                               err);
}

/* A tensor map of the wgmma build (gemm_abi.cuh): rows of `cols` 16-bit
 * elements row_stride apart, boxes of box_cols x box_rows in the swizzle of
 * box_cols' 128 or 64 bytes; loads past the tensor read zeros, stores past
 * it are dropped. */
static int encode_map(const cuda_driver *drv, const char *name, const void *ptr, int64_t rows,
                      int64_t cols, int64_t row_stride, int box_cols, int box_rows,
                      stof_attn_tmap *map, stof_error *err) {
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)row_stride * 2};
    const cuuint32_t box[2] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows}, unit[2] = {1, 1};
    _Static_assert(sizeof(CUtensorMap) == sizeof(stof_attn_tmap), "tensor map size");
    CUresult r = drv->TensorMapEncodeTiled(
        (CUtensorMap *)map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, (void *)ptr, dims, strides, box,
        unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
        box_cols * 2 == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r == CUDA_SUCCESS)
        return STOF_OK;
    char what[128];
    snprintf(what, sizeof what,
             "cuTensorMapEncodeTiled(gemm_epilogue %s, %lld x %lld, stride %lld)", name,
             (long long)rows, (long long)cols, (long long)row_stride);
    return cuda_check(drv, r, what, err);
}

/* The wgmma build's tensor maps: x and w, and y for the persistent build. */
static int encode_maps(const gemm_exec_ctx *c, const gemm_exec_plan *plan, stof_gemm_args *a,
                       stof_error *err) {
    const gemm_exec_problem *p = &plan->problem;
    const int *v = plan->values;
    int rc = encode_map(c->drv, "x", a->x, p->m, p->k, a->x_row_stride, 64, v[0], &a->tmap_x,
                        err);
    if (!rc)
        rc = encode_map(c->drv, "w", a->w, p->n, p->k, a->w_row_stride, 64, v[1], &a->tmap_w,
                        err);
    if (!rc && gemm_exec_persistent(p, v, plan->arch))
        rc = encode_map(c->drv, "y", a->y, p->m, p->n, a->y_row_stride,
                        stof_gemm_store_cols(v[0], v[1], v[3]), 16, &a->tmap_y, err);
    return rc;
}

int gemm_exec_gemm(gemm_exec_ctx *c, const gemm_exec_plan *plan, const gemm_exec_gemm_tensors *t,
                   CUstream s, stof_error *err) {
    if (plan->problem.tmpl == FUSION_T_GEMV) {
        stof_gemv_args g;
        int rc = gemm_exec_gemv_args(plan, t, &g, err);
        return rc ? rc : launch(c, plan, &g, s, err);
    }
    stof_gemm_args a;
    int rc = gemm_exec_gemm_args(plan, t, &a, err);
    if (!rc && gemm_exec_wgmma(&plan->problem, plan->values, plan->arch))
        rc = encode_maps(c, plan, &a, err);
    return rc ? rc : launch(c, plan, &a, s, err);
}

int gemm_exec_gemm_ln(gemm_exec_ctx *c, const gemm_exec_plan *plan,
                      const gemm_exec_ln_tensors *t, CUstream s, stof_error *err) {
    stof_gemm_ln_args a;
    int rc = gemm_exec_ln_args(plan, t, &a, err);
    return rc ? rc : launch(c, plan, &a, s, err);
}

int gemm_exec_gemm_chain(gemm_exec_ctx *c, const gemm_exec_plan *plan,
                         const gemm_exec_chain_tensors *t, CUstream s, stof_error *err) {
    stof_gemm_chain_args a;
    int rc = gemm_exec_chain_args(plan, t, &a, err);
    return rc ? rc : launch(c, plan, &a, s, err);
}

int gemm_exec_mi_chain(gemm_exec_ctx *c, const gemm_exec_plan *plan,
                       const gemm_exec_mi_tensors *t, CUstream s, stof_error *err) {
    stof_mi_args a;
    int rc = gemm_exec_mi_args(plan, t, &a, err);
    return rc ? rc : launch(c, plan, &a, s, err);
}

int gemm_exec_embedding(gemm_exec_ctx *c, const gemm_exec_plan *plan,
                        const gemm_exec_embed_tensors *t, CUstream s, stof_error *err) {
    stof_embed_args a;
    int rc = gemm_exec_embed_args(plan, t, &a, err);
    return rc ? rc : launch(c, plan, &a, s, err);
}

int gemm_exec_xy(gemm_exec_ctx *c, const gemm_exec_plan *plan, const gemm_exec_xy_tensors *t,
                 CUstream s, stof_error *err) {
    union {
        stof_glu_args glu;
        stof_rotary_args rotary;
        stof_mask_rows_args mask_rows;
    } a;
    int rc;
    switch (plan->problem.tmpl) {
    case FUSION_T_GLU: rc = gemm_exec_glu_args(plan, t, &a.glu, err); break;
    case FUSION_T_ROTARY: rc = gemm_exec_rotary_args(plan, t, &a.rotary, err); break;
    case FUSION_T_MASK_ROWS: rc = gemm_exec_mask_rows_args(plan, t, &a.mask_rows, err); break;
    default:
        return err_set(err, STOF_ERR_INVALID, "a %s plan launched as glu, rotary or mask_rows",
                       gemm_template_name(plan->problem.tmpl));
    }
    return rc ? rc : launch(c, plan, &a, s, err);
}

/* Element `token` of an int32 device array, or -1 when it cannot be read. */
static int read_i32(const gemm_exec_ctx *c, CUdeviceptr a, int64_t token, int32_t *v) {
    return a && a % 4 == 0 &&
                   c->drv->MemcpyDtoH(v, a + (CUdeviceptr)token * sizeof *v, sizeof *v) ==
                       CUDA_SUCCESS
               ? 0
               : -1;
}

int gemm_exec_embedding_status(gemm_exec_ctx *c, const gemm_exec_plan *plan, CUdeviceptr ids,
                               CUdeviceptr type_ids, CUstream s, int64_t *bad_token,
                               stof_error *err) {
    if (bad_token)
        *bad_token = -1;
    int rc = wrong_plan(plan, FUSION_T_EMBEDDING, err);
    if (rc)
        return rc;
    int32_t flag = 0;
    if ((rc = cuda_check(c->drv, c->drv->StreamSynchronize(s), "cuStreamSynchronize", err)) ||
        (rc = cuda_check(c->drv, c->drv->MemcpyDtoH(&flag, plan->d_error, sizeof flag),
                         "cuMemcpyDtoH(embedding error flag)", err)))
        return rc;
    if (flag == 0)
        return STOF_OK;
    int64_t token = (int64_t)flag - 1;
    if ((rc = cuda_check(c->drv, c->drv->MemsetD32Async(plan->d_error, 0, 1, s),
                         "cuMemsetD32Async(embedding error flag)", err)) ||
        (rc = cuda_check(c->drv, c->drv->StreamSynchronize(s), "cuStreamSynchronize", err)))
        return rc;
    if (bad_token)
        *bad_token = token;
    const gemm_exec_problem *p = &plan->problem;
    int32_t id = 0, type = 0;
    char what[96] = "an id";
    int id_known = read_i32(c, ids, token, &id) == 0;
    if (id_known)
        snprintf(what, sizeof what, "id %d", (int)id);
    /* the id was fine: its token type was not */
    if (p->has_type_ids && (!id_known || (id >= 0 && id < p->vocab)) &&
        read_i32(c, type_ids, token, &type) == 0 && (type < 0 || type >= p->type_vocab))
        return err_set(err, STOF_ERR_INVALID, "embedding: token %lld (batch %lld, position %lld) "
                       "has token type %d, outside the type table [0, %d); its row was written "
                       "as zeros", (long long)token, (long long)(token / p->seq_len),
                       (long long)(token % p->seq_len), (int)type, p->type_vocab);
    if (p->has_position_ids && id_known && id >= 0 && id < p->vocab)
        return err_set(err, STOF_ERR_INVALID, "embedding: token %lld (batch %lld) sits at a "
                       "position outside the position table's %d rows; its row was written as "
                       "zeros", (long long)token, (long long)(token / p->seq_len), p->pos_rows);
    return err_set(err, STOF_ERR_INVALID,
                   "embedding: token %lld (batch %lld, position %lld) has %s, outside the "
                   "vocabulary [0, %d); its row was written as zeros",
                   (long long)token, (long long)(token / p->seq_len),
                   (long long)(token % p->seq_len), what, p->vocab);
}
