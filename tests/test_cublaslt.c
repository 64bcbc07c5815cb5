/* The cuBLASLt executor's CPU side, without touching the GPU: validation,
 * the mapping of every epilogue the template can be asked for (bias x
 * {none, gelu, gelu_tanh, relu} x residual, both weight layouts, both
 * dtypes) onto cuBLASLt's epilogue, transposes and column-major layouts,
 * strides, the launch-time tensor checks and the status messages. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "core/exec/cublaslt/cublaslt_exec.h"

static gemm_exec_problem problem(stof_dtype dt, int64_t m, int64_t n, int64_t k, int kn,
                                 int bias, fusion_act act, int res) {
    gemm_exec_problem p = {.tmpl = FUSION_T_CUBLASLT, .dtype = dt, .m = m, .n = n, .k = k,
                           .weight_kn = kn};
    p.epi.has_bias = bias;
    p.epi.act = act;
    p.epi.has_residual = res;
    return p;
}

static int same_matrix(const cublaslt_exec_matrix *a, uint64_t rows, uint64_t cols, int64_t ld) {
    return a->rows == rows && a->cols == cols && a->ld == ld;
}

/* The expected epilogue, or 0 where cublaslt must refuse. */
static cublasLtEpilogue_t expected_epilogue(int bias, fusion_act act, int res) {
    if (act == FUSION_ACT_GELU || (res && act != FUSION_ACT_NONE))
        return (cublasLtEpilogue_t)0;
    switch (act) {
    case FUSION_ACT_GELU_TANH:
        return bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    case FUSION_ACT_RELU:
        return bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    default:
        return bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    }
}

static void test_every_epilogue(void) {
    static const stof_dtype dts[] = {STOF_F16, STOF_BF16};
    const int64_t M = 1000, N = 2304, K = 768;
    int mapped = 0, refused = 0;
    for (int d = 0; d < 2; d++)
        for (int kn = 0; kn < 2; kn++)
            for (int bias = 0; bias < 2; bias++)
                for (int a = FUSION_ACT_NONE; a <= FUSION_ACT_RELU; a++)
                    for (int res = 0; res < 2; res++) {
                        gemm_exec_problem p = problem(dts[d], M, N, K, kn, bias, (fusion_act)a,
                                                      res);
                        cublaslt_exec_mapping m;
                        stof_error err = {0};
                        int rc = cublaslt_exec_map(&p, NULL, &m, &err);
                        cublasLtEpilogue_t want = expected_epilogue(bias, (fusion_act)a, res);
                        if (!want) {
                            refused++;
                            CHECK_EQ_INT(rc, STOF_ERR_UNSUPPORTED);
                            CHECK_EQ_INT(cublaslt_exec_validate(&p, NULL), STOF_ERR_UNSUPPORTED);
                            if (a == FUSION_ACT_GELU) {
                                CHECK_CONTAINS(err.msg, "erf GELU");
                                CHECK_CONTAINS(err.msg, "tanh");
                            } else {
                                CHECK_CONTAINS(err.msg, "residual with an activation");
                            }
                            continue;
                        }
                        mapped++;
                        CHECK_MSG(rc == STOF_OK, "dt %d kn %d bias %d act %d res %d: %s", d, kn,
                                  bias, a, res, err.msg);
                        if (rc)
                            continue;
                        CHECK_EQ_INT(m.epilogue, want);
                        CHECK_EQ_INT(m.has_bias, bias);
                        /* Y^T[N,M] = W X^T: cuBLASLt's m, n, k are N, M, K */
                        CHECK(m.m == (uint64_t)N && m.n == (uint64_t)M && m.k == (uint64_t)K);
                        if (kn) {
                            CHECK_EQ_INT(m.trans_a, CUBLAS_OP_N);
                            CHECK(same_matrix(&m.a, N, K, N));
                        } else {
                            CHECK_EQ_INT(m.trans_a, CUBLAS_OP_T);
                            CHECK(same_matrix(&m.a, K, N, K));
                        }
                        CHECK_EQ_INT(m.trans_b, CUBLAS_OP_N);
                        CHECK(same_matrix(&m.b, K, M, K));
                        CHECK(same_matrix(&m.c, N, M, N));
                        CHECK(same_matrix(&m.d, N, M, N));
                        CHECK_EQ_INT(m.type, dts[d] == STOF_BF16 ? CUDA_R_16BF : CUDA_R_16F);
                        CHECK_EQ_INT(m.compute, CUBLAS_COMPUTE_32F);
                        CHECK_EQ_INT(m.scale_type, CUDA_R_32F);
                        CHECK(m.alpha == 1.0f);
                        CHECK(m.beta == (res ? 1.0f : 0.0f));
                        CHECK_EQ_INT(m.strides.x, K);
                        CHECK_EQ_INT(m.strides.w, kn ? N : K);
                        CHECK_EQ_INT(m.strides.y, N);
                        CHECK_EQ_INT(m.strides.r, res ? N : 0);
                    }
    /* per dtype and layout: 6 activations/bias without a residual, 2 with */
    CHECK_EQ_INT(mapped, 2 * 2 * 8);
    CHECK_EQ_INT(refused, 2 * 2 * 8);
}

static void test_names(void) {
    CHECK(!strcmp(cublaslt_exec_epilogue_name(CUBLASLT_EPILOGUE_DEFAULT), "DEFAULT"));
    CHECK(!strcmp(cublaslt_exec_epilogue_name(CUBLASLT_EPILOGUE_BIAS), "BIAS"));
    CHECK(!strcmp(cublaslt_exec_epilogue_name(CUBLASLT_EPILOGUE_GELU), "GELU"));
    CHECK(!strcmp(cublaslt_exec_epilogue_name(CUBLASLT_EPILOGUE_GELU_BIAS), "GELU_BIAS"));
    CHECK(!strcmp(cublaslt_exec_epilogue_name(CUBLASLT_EPILOGUE_RELU), "RELU"));
    CHECK(!strcmp(cublaslt_exec_epilogue_name(CUBLASLT_EPILOGUE_RELU_BIAS), "RELU_BIAS"));
    CHECK(!strcmp(cublaslt_exec_epilogue_name(CUBLASLT_EPILOGUE_GELU_AUX), "?"));
}

static void test_strides(void) {
    stof_error err = {0};
    cublaslt_exec_mapping m;
    /* x a slice of wider rows, y inside [M, 3N] (a fused QKV output), weights padded */
    gemm_exec_problem p = problem(STOF_F16, 7, 768, 1024, 0, 1, FUSION_ACT_NONE, 1);
    cublaslt_exec_strides s = {.x = 2048, .w = 1032, .r = 1536, .y = 2304};
    CHECK_EQ_INT(cublaslt_exec_map(&p, &s, &m, &err), STOF_OK);
    CHECK(same_matrix(&m.a, 1024, 768, 1032));
    CHECK(same_matrix(&m.b, 1024, 7, 2048));
    CHECK(same_matrix(&m.c, 768, 7, 1536));
    CHECK(same_matrix(&m.d, 768, 7, 2304));
    p.weight_kn = 1;
    s.w = 776;
    CHECK_EQ_INT(cublaslt_exec_map(&p, &s, &m, &err), STOF_OK);
    CHECK(same_matrix(&m.a, 768, 1024, 776));
    /* the residual's stride is ignored without a residual */
    p.epi.has_residual = 0;
    s.r = 3;
    CHECK_EQ_INT(cublaslt_exec_map(&p, &s, &m, &err), STOF_OK);
    CHECK_EQ_INT(m.strides.r, 0);
    CHECK(same_matrix(&m.c, 768, 7, 2304));
    /* bad strides: short, not a multiple of 8 */
    s = (cublaslt_exec_strides){.x = 1016};
    CHECK_EQ_INT(cublaslt_exec_map(&p, &s, &m, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "row stride of x");
    s = (cublaslt_exec_strides){.y = 772};
    CHECK_EQ_INT(cublaslt_exec_map(&p, &s, &m, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "row stride of y");
    s = (cublaslt_exec_strides){.w = 1024}; /* W [K,N] rows are N = 768 long: fine */
    CHECK_EQ_INT(cublaslt_exec_map(&p, &s, &m, &err), STOF_OK);
    p.weight_kn = 0; /* W [N,K] rows are K = 1024 long */
    s.w = 768;
    CHECK_EQ_INT(cublaslt_exec_map(&p, &s, &m, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "row stride of w");
    p.epi.has_residual = 1;
    s = (cublaslt_exec_strides){.r = 100};
    CHECK_EQ_INT(cublaslt_exec_map(&p, &s, &m, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "row stride of residual");
}

static void test_validation(void) {
    stof_error err = {0};
    cublaslt_exec_mapping m;
    gemm_exec_problem p = problem(STOF_F16, 1, 768, 768, 0, 0, FUSION_ACT_NONE, 0);
    CHECK_EQ_INT(cublaslt_exec_validate(&p, &err), STOF_OK);
    p.tmpl = FUSION_T_GEMM_EPILOGUE;
    CHECK_EQ_INT(cublaslt_exec_map(&p, NULL, &m, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "gemm_epilogue");
    p.tmpl = FUSION_T_CUBLASLT;
    static const stof_dtype bad_types[] = {STOF_F32, STOF_I32};
    for (int i = 0; i < 2; i++) {
        p.dtype = bad_types[i];
        CHECK_EQ_INT(cublaslt_exec_validate(&p, &err), STOF_ERR_UNSUPPORTED);
        CHECK_CONTAINS(err.msg, "f16 or bf16");
    }
    p.dtype = STOF_BF16;
    const int64_t sizes[][3] = {{0, 768, 768},  {1, 768, 764},   {1, 768, 4},
                                {1, 0, 768},    {1, 768, 0},     {-5, 768, 768},
                                {(int64_t)INT32_MAX + 1, 768, 768}, {1, 768, (int64_t)1 << 32}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        p.m = sizes[i][0];
        p.n = sizes[i][1];
        p.k = sizes[i][2];
        CHECK_EQ_INT(cublaslt_exec_validate(&p, &err), STOF_ERR_UNSUPPORTED);
        CHECK_CONTAINS(err.msg, "multiple of 8");
    }
    /* a vocabulary-wide head: any N with the weight [N, K]; [K, N] rows need N % 8 == 0 */
    p.m = 3;
    p.n = 50257;
    p.k = 768;
    p.weight_kn = 0;
    CHECK_EQ_INT(cublaslt_exec_validate(&p, &err), STOF_OK);
    p.weight_kn = 1;
    CHECK_EQ_INT(cublaslt_exec_validate(&p, &err), STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "stored [K, N]");
    p.weight_kn = 0;
    p.m = 7;
    p.n = 8;
    p.k = 8;
    CHECK_EQ_INT(cublaslt_exec_validate(&p, &err), STOF_OK);
    p.epi.norm = FUSION_NORM_LAYERNORM;
    CHECK_EQ_INT(cublaslt_exec_validate(&p, &err), STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "norm");
    p.epi.norm = FUSION_NORM_NONE;
    p.store_pre_norm = 1;
    CHECK_EQ_INT(cublaslt_exec_validate(&p, &err), STOF_ERR_UNSUPPORTED);
    p.store_pre_norm = 0;
    p.epi.act = (fusion_act)9;
    CHECK_EQ_INT(cublaslt_exec_validate(&p, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "unknown activation");
    p.epi.act = FUSION_ACT_GELU;
    CHECK_EQ_INT(cublaslt_exec_validate(&p, &err), STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "erf GELU");
    /* the template as registered: one parameter, ALGO, its values within the
     * default count of heuristic results kept */
    const fusion_template *t = fusion_template_get(FUSION_T_CUBLASLT);
    CHECK(t && t->n_params == 1 && !strcmp(t->params[0].name, "ALGO"));
    if (t && t->n_params == 1)
        for (int i = 0; i < t->params[0].n_values; i++)
            CHECK(t->params[0].values[i] >= 0 &&
                  t->params[0].values[i] < CUBLASLT_EXEC_DEFAULT_ALGOS);
}

static void test_tensors(void) {
    stof_error err = {0};
    cublaslt_exec_mapping m;
    gemm_exec_problem p = problem(STOF_F16, 64, 768, 1024, 0, 1, FUSION_ACT_NONE, 1);
    CHECK_EQ_INT(cublaslt_exec_map(&p, NULL, &m, &err), STOF_OK);
    const CUdeviceptr base = (CUdeviceptr)1 << 32;
    gemm_exec_gemm_tensors t = {.x = base, .w = base + 0x100000, .bias = base + 0x200000,
                                .residual = base + 0x300000, .y = base + 0x400000};
    CHECK_EQ_INT(cublaslt_exec_check_tensors(&p, &m, 16, &t, &err), STOF_OK);
    CHECK_EQ_INT(cublaslt_exec_check_tensors(&p, &m, 256, &t, &err), STOF_OK);
    /* explicit strides equal to the packed ones are the same layouts */
    gemm_exec_gemm_tensors u = t;
    u.x_row_stride = 1024;
    u.w_row_stride = 1024;
    u.r_row_stride = 768;
    u.y_row_stride = 768;
    CHECK_EQ_INT(cublaslt_exec_check_tensors(&p, &m, 16, &u, &err), STOF_OK);
    /* in place: the residual is y */
    u = t;
    u.residual = u.y;
    CHECK_EQ_INT(cublaslt_exec_check_tensors(&p, &m, 16, &u, &err), STOF_OK);
    /* missing and misaligned tensors */
    struct { const char *name; CUdeviceptr *field; } ptrs[] = {
        {"x", &u.x}, {"w", &u.w}, {"bias", &u.bias}, {"residual", &u.residual}, {"y", &u.y}};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) {
        u = t;
        ptrs[i].field[0] = 0; /* the field of u: the table points into u */
        CHECK_EQ_INT(cublaslt_exec_check_tensors(&p, &m, 16, &u, &err), STOF_ERR_INVALID);
        CHECK_CONTAINS(err.msg, ptrs[i].name);
        u = t;
        ptrs[i].field[0] += 8;
        CHECK_EQ_INT(cublaslt_exec_check_tensors(&p, &m, 16, &u, &err), STOF_ERR_INVALID);
        CHECK_CONTAINS(err.msg, "16-byte aligned");
        u = t;
        ptrs[i].field[0] += 64;
        CHECK_EQ_INT(cublaslt_exec_check_tensors(&p, &m, 16, &u, &err), STOF_OK);
        CHECK_EQ_INT(cublaslt_exec_check_tensors(&p, &m, 256, &u, &err), STOF_ERR_INVALID);
        CHECK_CONTAINS(err.msg, "256-byte aligned");
    }
    /* bias and residual are not looked at when the problem has none */
    gemm_exec_problem q = problem(STOF_F16, 64, 768, 1024, 1, 0, FUSION_ACT_RELU, 0);
    cublaslt_exec_mapping mq;
    CHECK_EQ_INT(cublaslt_exec_map(&q, NULL, &mq, &err), STOF_OK);
    u = t;
    u.bias = 3;
    u.residual = 0;
    u.r_row_stride = 5;
    CHECK_EQ_INT(cublaslt_exec_check_tensors(&q, &mq, 16, &u, &err), STOF_OK);
    /* W [K,N]: its rows are N long */
    u.w_row_stride = 1024;
    CHECK_EQ_INT(cublaslt_exec_check_tensors(&q, &mq, 16, &u, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "w has row stride 1024");
    u.w_row_stride = 768;
    CHECK_EQ_INT(cublaslt_exec_check_tensors(&q, &mq, 16, &u, &err), STOF_OK);
    /* strides other than the plan's */
    u = t;
    u.y_row_stride = 1536;
    CHECK_EQ_INT(cublaslt_exec_check_tensors(&p, &m, 16, &u, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "plan's layouts were made for 768");
    /* a plan for strided tensors: in place needs equal residual and y strides */
    cublaslt_exec_strides s = {.r = 1536, .y = 2304};
    CHECK_EQ_INT(cublaslt_exec_map(&p, &s, &m, &err), STOF_OK);
    u = t;
    u.r_row_stride = 1536;
    u.y_row_stride = 2304;
    CHECK_EQ_INT(cublaslt_exec_check_tensors(&p, &m, 16, &u, &err), STOF_OK);
    u.residual = u.y;
    CHECK_EQ_INT(cublaslt_exec_check_tensors(&p, &m, 16, &u, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "in place");
}

static void test_status(void) {
    stof_error err = {0};
    CHECK_EQ_INT(cublaslt_exec_status(CUBLAS_STATUS_SUCCESS, "x", &err), STOF_OK);
    struct { cublasStatus_t st; int code; const char *name; } cases[] = {
        {CUBLAS_STATUS_NOT_SUPPORTED, STOF_ERR_UNSUPPORTED, "CUBLAS_STATUS_NOT_SUPPORTED"},
        {CUBLAS_STATUS_ARCH_MISMATCH, STOF_ERR_UNSUPPORTED, "CUBLAS_STATUS_ARCH_MISMATCH"},
        {CUBLAS_STATUS_ALLOC_FAILED, STOF_ERR_DEVICE_OOM, "CUBLAS_STATUS_ALLOC_FAILED"},
        {CUBLAS_STATUS_INVALID_VALUE, STOF_ERR_INVALID, "CUBLAS_STATUS_INVALID_VALUE"},
        {CUBLAS_STATUS_NOT_INITIALIZED, STOF_ERR_CUDA, "CUBLAS_STATUS_NOT_INITIALIZED"},
        {CUBLAS_STATUS_EXECUTION_FAILED, STOF_ERR_CUDA, "CUBLAS_STATUS_EXECUTION_FAILED"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_EQ_INT(cublaslt_exec_status(cases[i].st, "cublasLtMatmul", &err), cases[i].code);
        CHECK_EQ_INT(err.code, cases[i].code);
        CHECK_CONTAINS(err.msg, "cublasLtMatmul failed: ");
        CHECK_CONTAINS(err.msg, cases[i].name);
    }
}

int main(void) {
    test_every_epilogue();
    test_names();
    test_strides();
    test_validation();
    test_tensors();
    test_status();
    return check_summary("test_cublaslt");
}
