/* GEMM segments through cuBLASLt (see cublaslt_exec.h for the mapping of
 * row-major tensors onto cuBLASLt's column-major convention).
 *
 * The driver is opened at run time (core/gpu/cuda_driver.h) while cuBLASLt is
 * linked; cuBLASLt itself only needs a driver when a handle is made, so the
 * context checks for a GPU through core/gpu/device.h first and everything before
 * that (validation, mapping, tensor checks, status names) runs anywhere. */
#include "core/exec/cublaslt/cublaslt_exec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/gpu/device.h"
#include "core/base/error.h"
#include "core/gpu/gpu_ctx.h"

/* ---- problems -> cuBLASLt ------------------------------------------------------- */

int cublaslt_exec_validate(const gemm_exec_problem *p, stof_error *err) {
    if (p->tmpl != FUSION_T_CUBLASLT) {
        const fusion_template *t = fusion_template_get(p->tmpl);
        return err_set(err, STOF_ERR_INVALID, "cublaslt_exec runs the cublaslt template, not "
                       "template %d (%s)", (int)p->tmpl, t ? t->name : "?");
    }
    if (p->dtype != STOF_F16 && p->dtype != STOF_BF16)
        return err_set(err, STOF_ERR_UNSUPPORTED, "cublaslt: dtype %s (f16 or bf16 only)",
                       stof_dtype_name(p->dtype));
    if ((int)p->epi.act < FUSION_ACT_NONE || p->epi.act > FUSION_ACT_RELU ||
        (int)p->epi.norm < FUSION_NORM_NONE || p->epi.norm > FUSION_NORM_RMSNORM)
        return err_set(err, STOF_ERR_INVALID, "cublaslt: unknown activation %d or norm %d",
                       (int)p->epi.act, (int)p->epi.norm);
    /* N may be any width (a language model's head over a vocabulary of 50257): cuBLASLt
     * picks kernels for the rows' alignment from the layouts. K stays a multiple of 8 so
     * that x and w rows are 16-byte aligned. */
    if (p->m < 1 || p->m > INT32_MAX || p->n < 1 || p->n > INT32_MAX || p->k < 8 ||
        p->k > INT32_MAX || p->k % 8 || (p->weight_kn && p->n % 8))
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "cublaslt: M = %lld, N = %lld, K = %lld: M and N must be in 1..2^31-1, "
                       "K a positive multiple of 8 (16-byte aligned rows), and N too when the "
                       "weight is stored [K, N]",
                       (long long)p->m, (long long)p->n, (long long)p->k);
    if (p->epi.norm != FUSION_NORM_NONE || p->store_pre_norm)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "cublaslt: cuBLASLt has no norm epilogue (gemm_ln fuses one)");
    if (p->epi.act == FUSION_ACT_GELU)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "cublaslt: erf GELU is not available: cuBLASLt's GELU epilogue is the "
                       "tanh approximation (gelu_tanh); the erf form runs on gemm_epilogue");
    if (p->epi.has_residual && p->epi.act != FUSION_ACT_NONE)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "cublaslt: a residual with an activation: cuBLASLt adds the residual (C, "
                       "beta = 1) before its epilogue, giving act(x w^T + b + r) instead of "
                       "act(x w^T + b) + r");
    return STOF_OK;
}

static cublasLtEpilogue_t epilogue_of(const fusion_epilogue *e) {
    switch (e->act) {
    case FUSION_ACT_GELU_TANH:
        return e->has_bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    case FUSION_ACT_RELU:
        return e->has_bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    default:
        return e->has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    }
}

const char *cublaslt_exec_epilogue_name(cublasLtEpilogue_t e) {
    switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT:
        return "DEFAULT";
    case CUBLASLT_EPILOGUE_BIAS:
        return "BIAS";
    case CUBLASLT_EPILOGUE_GELU:
        return "GELU";
    case CUBLASLT_EPILOGUE_GELU_BIAS:
        return "GELU_BIAS";
    case CUBLASLT_EPILOGUE_RELU:
        return "RELU";
    case CUBLASLT_EPILOGUE_RELU_BIAS:
        return "RELU_BIAS";
    default:
        return "?";
    }
}

/* A row stride: 0 becomes row_len (packed rows, whatever their length); else a multiple of
 * 8 of at least row_len. */
static int fix_stride(const char *name, int64_t *stride, int64_t row_len, stof_error *err) {
    if (*stride == 0)
        *stride = row_len;
    if (*stride < row_len || (*stride % 8 && *stride != row_len))
        return err_set(err, STOF_ERR_INVALID,
                       "cublaslt: the row stride of %s is %lld: it must be the row's length or "
                       "a multiple of 8 elements of at least %lld", name, (long long)*stride,
                       (long long)row_len);
    return STOF_OK;
}

static cublaslt_exec_matrix matrix(int64_t rows, int64_t cols, int64_t ld) {
    return (cublaslt_exec_matrix){(uint64_t)rows, (uint64_t)cols, ld};
}

int cublaslt_exec_map(const gemm_exec_problem *p, const cublaslt_exec_strides *s,
                      cublaslt_exec_mapping *out, stof_error *err) {
    memset(out, 0, sizeof *out);
    int rc = cublaslt_exec_validate(p, err);
    if (rc)
        return rc;
    const int64_t M = p->m, N = p->n, K = p->k;
    cublaslt_exec_strides st = s ? *s : (cublaslt_exec_strides){0};
    if ((rc = fix_stride("x", &st.x, K, err)) ||
        (rc = fix_stride("w", &st.w, p->weight_kn ? N : K, err)) ||
        (rc = fix_stride("y", &st.y, N, err)) ||
        (p->epi.has_residual && (rc = fix_stride("residual", &st.r, N, err))))
        return rc;
    if (!p->epi.has_residual)
        st.r = 0; /* no residual tensor */
    out->strides = st;
    /* Y^T[N,M] = W[N,K] X^T[K,M], all column-major: see the header. */
    out->m = (uint64_t)N;
    out->n = (uint64_t)M;
    out->k = (uint64_t)K;
    if (p->weight_kn) {
        out->trans_a = CUBLAS_OP_N; /* W [K,N] row-major is W^T^T = [N,K] column-major */
        out->a = matrix(N, K, st.w);
    } else {
        out->trans_a = CUBLAS_OP_T; /* W [N,K] row-major is W^T [K,N] column-major */
        out->a = matrix(K, N, st.w);
    }
    out->trans_b = CUBLAS_OP_N; /* X [M,K] row-major is X^T [K,M] column-major */
    out->b = matrix(K, M, st.x);
    out->d = matrix(N, M, st.y);
    out->c = p->epi.has_residual ? matrix(N, M, st.r) : out->d;
    out->epilogue = epilogue_of(&p->epi);
    out->has_bias = p->epi.has_bias != 0;
    out->type = p->dtype == STOF_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    out->compute = CUBLAS_COMPUTE_32F;
    out->scale_type = CUDA_R_32F;
    out->alpha = 1.0f;
    out->beta = p->epi.has_residual ? 1.0f : 0.0f;
    return STOF_OK;
}

static int check_ptr(const char *name, CUdeviceptr ptr, int align, stof_error *err) {
    if (!ptr || ptr % (CUdeviceptr)align)
        return err_set(err, STOF_ERR_INVALID,
                       "cublaslt: %s must be a %d-byte aligned device pointer (got 0x%llx)",
                       name, align, (unsigned long long)ptr);
    return STOF_OK;
}

/* The launch's stride (0 = packed) against the plan's (packed ones filled in). */
static int check_stride(const char *name, int64_t given, int64_t planned, int64_t row_len,
                        stof_error *err) {
    int64_t s = given ? given : row_len;
    if (s != planned)
        return err_set(err, STOF_ERR_INVALID,
                       "cublaslt: %s has row stride %lld, the plan's layouts were made for %lld",
                       name, (long long)s, (long long)planned);
    return STOF_OK;
}

int cublaslt_exec_check_tensors(const gemm_exec_problem *p, const cublaslt_exec_mapping *m,
                                int align, const gemm_exec_gemm_tensors *t, stof_error *err) {
    const int64_t w_row = p->weight_kn ? p->n : p->k;
    int rc;
    if ((rc = check_ptr("x", t->x, align, err)) || (rc = check_ptr("w", t->w, align, err)) ||
        (rc = check_ptr("y", t->y, align, err)) ||
        (p->epi.has_bias && (rc = check_ptr("bias", t->bias, align, err))) ||
        (p->epi.has_residual && (rc = check_ptr("residual", t->residual, align, err))) ||
        (rc = check_stride("x", t->x_row_stride, m->strides.x, p->k, err)) ||
        (rc = check_stride("w", t->w_row_stride, m->strides.w, w_row, err)) ||
        (rc = check_stride("y", t->y_row_stride, m->strides.y, p->n, err)) ||
        (p->epi.has_residual &&
         (rc = check_stride("residual", t->r_row_stride, m->strides.r, p->n, err))))
        return rc;
    if (p->epi.has_residual && t->residual == t->y && m->strides.r != m->strides.y)
        return err_set(err, STOF_ERR_INVALID,
                       "cublaslt: the residual is y itself (in place) but their row strides "
                       "differ (%lld, %lld): cuBLASLt runs C == D only with one layout",
                       (long long)m->strides.r, (long long)m->strides.y);
    return STOF_OK;
}

int cublaslt_exec_status(cublasStatus_t st, const char *what, stof_error *err) {
    if (st == CUBLAS_STATUS_SUCCESS)
        return STOF_OK;
    int code;
    switch (st) {
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
        code = STOF_ERR_UNSUPPORTED;
        break;
    case CUBLAS_STATUS_ALLOC_FAILED:
        code = STOF_ERR_DEVICE_OOM;
        break;
    case CUBLAS_STATUS_INVALID_VALUE:
        code = STOF_ERR_INVALID;
        break;
    default:
        code = STOF_ERR_CUDA;
        break;
    }
    const char *name = cublasLtGetStatusName(st), *text = cublasLtGetStatusString(st);
    return err_set(err, code, "%s failed: %s (%s)", what, name ? name : "?", text ? text : "?");
}

/* ---- the GPU context ------------------------------------------------------------- */

int cublaslt_exec_ctx_create(int ordinal, cublaslt_exec_ctx **out, stof_error *err) {
    *out = NULL;
    cublaslt_exec_ctx *c = err_calloc(1, sizeof *c, err);
    if (!c)
        return STOF_ERR_NOMEM;
    /* the device first: without a driver cuBLASLt fails with less helpful words;
     * cuBLASLt then uses whatever context is current, which is ours */
    int rc = gpu_device_retain(ordinal, &c->drv, &c->dev, &c->cu, &c->info, c->arch,
                               sizeof c->arch, err);
    if (!rc && (rc = cublaslt_exec_status(cublasLtCreate(&c->handle), "cublasLtCreate", err)))
        c->drv->DevicePrimaryCtxRelease(c->dev);
    if (rc) {
        free(c);
        return rc;
    }
    *out = c;
    return STOF_OK;
}

void cublaslt_exec_ctx_free(cublaslt_exec_ctx *c) {
    if (!c)
        return;
    c->drv->CtxSetCurrent(c->cu);
    cublasLtDestroy(c->handle);
    c->drv->DevicePrimaryCtxRelease(c->dev);
    free(c);
}

/* ---- plans ---------------------------------------------------------------------------- */

#define LT(call, what)                                                   \
    do {                                                                 \
        if ((rc = cublaslt_exec_status((call), (what), err)) != STOF_OK) \
            goto fail;                                                   \
    } while (0)

static int make_layout(cublasLtMatrixLayout_t *l, cudaDataType_t type,
                       const cublaslt_exec_matrix *m, const char *what, stof_error *err) {
    return cublaslt_exec_status(cublasLtMatrixLayoutCreate(l, type, m->rows, m->cols, m->ld),
                                what, err);
}

static int resolve_options(const cublaslt_exec_options *opt, cublaslt_exec_options *o,
                           stof_error *err) {
    *o = opt ? *opt : (cublaslt_exec_options){0};
    if (o->n_algos == 0)
        o->n_algos = CUBLASLT_EXEC_DEFAULT_ALGOS;
    if (o->max_workspace == 0)
        o->max_workspace = CUBLASLT_EXEC_DEFAULT_WORKSPACE;
    if (o->align_bytes == 0)
        o->align_bytes = CUBLASLT_EXEC_DEFAULT_ALIGN;
    if (o->n_algos < 1 || o->n_algos > CUBLASLT_EXEC_MAX_ALGOS)
        return err_set(err, STOF_ERR_INVALID, "cublaslt: %d algorithms asked for (1..%d)",
                       o->n_algos, CUBLASLT_EXEC_MAX_ALGOS);
    if (o->algo < 0 || o->algo >= o->n_algos)
        return err_set(err, STOF_ERR_INVALID,
                       "cublaslt: algorithm %d selected out of the %d asked for", o->algo,
                       o->n_algos);
    if (o->align_bytes < 16 || o->align_bytes > 256 || (o->align_bytes & (o->align_bytes - 1)))
        return err_set(err, STOF_ERR_INVALID,
                       "cublaslt: alignment %d bytes (a power of two from 16 to 256)",
                       o->align_bytes);
    return STOF_OK;
}

int cublaslt_exec_plan_create(cublaslt_exec_ctx *c, const gemm_exec_problem *p,
                              const cublaslt_exec_options *opt, cublaslt_exec_plan **out,
                              stof_error *err) {
    *out = NULL;
    cublaslt_exec_options o;
    cublaslt_exec_mapping map;
    int rc = resolve_options(opt, &o, err);
    if (rc || (rc = cublaslt_exec_map(p, &o.strides, &map, err)))
        return rc;
    if ((rc = cuda_check(c->drv, c->drv->CtxSetCurrent(c->cu), "cuCtxSetCurrent", err)))
        return rc;
    cublaslt_exec_plan *plan = err_calloc(1, sizeof *plan, err);
    if (!plan)
        return STOF_ERR_NOMEM;
    plan->problem = *p;
    plan->map = map;
    plan->align_bytes = o.align_bytes;
    cublasLtMatmulPreference_t pref = NULL;

    const int32_t ta = map.trans_a, tb = map.trans_b, type = map.type;
    const uint32_t epi = map.epilogue;
    LT(cublasLtMatmulDescCreate(&plan->desc, map.compute, map.scale_type),
       "cublasLtMatmulDescCreate");
    LT(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
       "cublasLtMatmulDescSetAttribute(TRANSA)");
    LT(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
       "cublasLtMatmulDescSetAttribute(TRANSB)");
    LT(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                      sizeof epi),
       "cublasLtMatmulDescSetAttribute(EPILOGUE)");
    if (map.has_bias) {
        /* The heuristic judges the bias's alignment by the pointer the
         * descriptor holds (it does not read through it): a stand-in
         * aligned to exactly what the launches promise keeps it from
         * picking a kernel that needs more. The launch sets the real one. */
        plan->bias = (CUdeviceptr)o.align_bytes;
        const void *stand_in = (const void *)(uintptr_t)plan->bias;
        LT(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type,
                                          sizeof type),
           "cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)");
        LT(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                          &stand_in, sizeof stand_in),
           "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
    }
    if ((rc = make_layout(&plan->a, map.type, &map.a, "cublasLtMatrixLayoutCreate(A = w)", err)) ||
        (rc = make_layout(&plan->b, map.type, &map.b, "cublasLtMatrixLayoutCreate(B = x)", err)) ||
        (rc = make_layout(&plan->c, map.type, &map.c, "cublasLtMatrixLayoutCreate(C)", err)) ||
        (rc = make_layout(&plan->d, map.type, &map.d, "cublasLtMatrixLayoutCreate(D = y)", err)))
        goto fail;

    const uint64_t ws = o.max_workspace;
    const uint32_t align = (uint32_t)o.align_bytes;
    LT(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                            sizeof ws),
       "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
    static const cublasLtMatmulPreferenceAttributes_t aligns[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        LT(cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &align, sizeof align),
           "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)");

    cublasLtMatmulHeuristicResult_t res[CUBLASLT_EXEC_MAX_ALGOS];
    int returned = 0;
    memset(res, 0, sizeof res);
    LT(cublasLtMatmulAlgoGetHeuristic(c->handle, plan->desc, plan->a, plan->b, plan->c, plan->d,
                                      pref, o.n_algos, res, &returned),
       "cublasLtMatmulAlgoGetHeuristic");
    for (int i = 0; i < returned && i < o.n_algos; i++) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS)
            continue;
        cublaslt_exec_algo *a = &plan->algos[plan->n_algos++];
        a->algo = res[i].algo;
        a->workspace = res[i].workspaceSize;
        a->waves = res[i].wavesCount;
        if (a->workspace > plan->workspace_bytes)
            plan->workspace_bytes = a->workspace;
    }
    if (plan->n_algos == 0) {
        rc = err_set(err, STOF_ERR_UNSUPPORTED,
                     "cublaslt: cuBLASLt has no algorithm for %s M=%lld N=%lld K=%lld "
                     "epilogue %s within %llu bytes of workspace and %d-byte alignment",
                     stof_dtype_name(p->dtype), (long long)p->m, (long long)p->n,
                     (long long)p->k, cublaslt_exec_epilogue_name(map.epilogue),
                     (unsigned long long)ws, o.align_bytes);
        goto fail;
    }
    if ((rc = cublaslt_exec_plan_select(plan, o.algo, err)))
        goto fail;
    if (plan->workspace_bytes &&
        (rc = cuda_check(c->drv, c->drv->MemAlloc(&plan->workspace, plan->workspace_bytes),
                         "cuMemAlloc(cuBLASLt workspace)", err)))
        goto fail;
    cublasLtMatmulPreferenceDestroy(pref);
    *out = plan;
    return STOF_OK;

fail:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    cublaslt_exec_plan_free(c, plan);
    return rc;
}

#undef LT

void cublaslt_exec_plan_free(cublaslt_exec_ctx *c, cublaslt_exec_plan *plan) {
    if (!plan)
        return;
    if (plan->workspace) {
        c->drv->CtxSetCurrent(c->cu);
        c->drv->MemFree(plan->workspace);
    }
    cublasLtMatrixLayout_t layouts[] = {plan->a, plan->b, plan->c, plan->d};
    for (int i = 0; i < 4; i++)
        if (layouts[i])
            cublasLtMatrixLayoutDestroy(layouts[i]);
    if (plan->desc)
        cublasLtMatmulDescDestroy(plan->desc);
    free(plan);
}

int cublaslt_exec_plan_select(cublaslt_exec_plan *plan, int algo, stof_error *err) {
    if (algo < 0 || algo >= plan->n_algos)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "cublaslt: ALGO %d: cuBLASLt's heuristic offered %d algorithm%s for this "
                       "problem", algo, plan->n_algos, plan->n_algos == 1 ? "" : "s");
    plan->algo = algo;
    return STOF_OK;
}

/* An algorithm's configuration attribute, -1 when it cannot be read. */
static long long algo_attr(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t at,
                           size_t size) {
    uint64_t v = 0; /* little-endian: the low bytes take a narrower value */
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(a, at, &v, size, &written) != CUBLAS_STATUS_SUCCESS ||
        written != size)
        return -1;
    if (size == 4)
        return (long long)(int32_t)(uint32_t)v;
    if (size == 2)
        return (long long)(uint16_t)v;
    return (long long)v;
}

size_t cublaslt_exec_plan_describe(const cublaslt_exec_plan *plan, char *buf, size_t n) {
    const gemm_exec_problem *p = &plan->problem;
    const cublaslt_exec_mapping *m = &plan->map;
    const cublaslt_exec_algo *a = &plan->algos[plan->algo];
    static const char *const acts[] = {"", " gelu", " gelu_tanh", " relu"};
    int k = snprintf(
        buf, n,
        "cublaslt %s M=%lld N=%lld K=%lld%s%s%s%s epilogue=%s op(A)=%c ALGO=%d/%d (id %lld "
        "tile %lld stages %lld splitK %lld cluster %lld) workspace=%zuB waves=%.2f",
        stof_dtype_name(p->dtype), (long long)p->m, (long long)p->n, (long long)p->k,
        p->weight_kn ? " w[K,N]" : "", p->epi.has_bias ? " bias" : "",
        (int)p->epi.act >= 0 && p->epi.act <= FUSION_ACT_RELU ? acts[p->epi.act] : " ?",
        p->epi.has_residual ? " add" : "", cublaslt_exec_epilogue_name(m->epilogue),
        m->trans_a == CUBLAS_OP_T ? 'T' : 'N', plan->algo, plan->n_algos,
        algo_attr(&a->algo, CUBLASLT_ALGO_CONFIG_ID, 4),
        algo_attr(&a->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, 4),
        algo_attr(&a->algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, 4),
        algo_attr(&a->algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 4),
        algo_attr(&a->algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, 2), a->workspace,
        (double)a->waves);
    return k < 0 ? 0 : (size_t)k;
}

/* ---- launching -------------------------------------------------------------------------- */

#define PTR(d) ((const void *)(uintptr_t)(d))

int cublaslt_exec_gemm(cublaslt_exec_ctx *c, cublaslt_exec_plan *plan,
                       const gemm_exec_gemm_tensors *t, CUstream s, stof_error *err) {
    const gemm_exec_problem *p = &plan->problem;
    const cublaslt_exec_mapping *m = &plan->map;
    int rc = cublaslt_exec_check_tensors(p, m, plan->align_bytes, t, err);
    if (rc)
        return rc;
    if (m->has_bias && t->bias != plan->bias) {
        const void *bias = PTR(t->bias);
        if ((rc = cublaslt_exec_status(
                 cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                &bias, sizeof bias),
                 "cublasLtMatmulDescSetAttribute(BIAS_POINTER)", err)))
            return rc;
        plan->bias = t->bias;
    }
    /* Without a residual C is D with beta = 0 (not read). In place (C == D)
     * cuBLASLt wants D's layout for C: the strides were checked equal. */
    CUdeviceptr cptr = m->beta != 0.0f ? t->residual : t->y;
    cublasLtMatrixLayout_t cdesc = cptr == t->y ? plan->d : plan->c;
    const cublaslt_exec_algo *a = &plan->algos[plan->algo];
    /* cuBLASLt takes the runtime's cudaStream_t, the same handle as the
     * driver's CUstream (both are struct CUstream_st *). */
    return cublaslt_exec_status(
        cublasLtMatmul(c->handle, plan->desc, &m->alpha, PTR(t->w), plan->a, PTR(t->x), plan->b,
                       &m->beta, PTR(cptr), cdesc, (void *)(uintptr_t)t->y, plan->d, &a->algo,
                       (void *)(uintptr_t)plan->workspace, plan->workspace_bytes,
                       (cudaStream_t)s),
        "cublasLtMatmul", err);
}
