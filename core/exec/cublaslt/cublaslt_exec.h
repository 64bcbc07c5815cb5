/* GEMM segments through NVIDIA's cuBLASLt: the "cublaslt" template of
 * fusion/templates.h, a vendor-library alternative to gemm_epilogue.
 *
 *   Y[M,N] = epilogue(X[M,K] W^T)     W stored [N,K], or [K,N] (weight_kn)
 *
 * fp16 or bf16 in and out, fp32 accumulation (CUBLAS_COMPUTE_32F), and the
 * epilogues cuBLASLt fuses:
 *
 *   epi.has_bias  epi.act      epi.has_residual   cuBLASLt
 *   0             none         0 / 1              DEFAULT      (+ C, beta = 1)
 *   1             none         0 / 1              BIAS         (+ C, beta = 1)
 *   0 / 1         gelu_tanh    0                  GELU / GELU_BIAS
 *   0 / 1         relu         0                  RELU / RELU_BIAS
 *
 * Rejected, with the reason: erf GELU (cuBLASLt's GELU is the tanh
 * approximation; BERT's erf GELU runs on gemm_epilogue), a residual together
 * with an activation (cuBLASLt adds C before its epilogue: act(XW^T + b + R)
 * is not act(XW^T + b) + R), norms.
 *
 * The problem and tensor descriptions are gemm_exec's own (gemm_exec_problem
 * with tmpl = FUSION_T_CUBLASLT, gemm_exec_gemm_tensors), so the executor can
 * hand one segment to either implementation:
 *
 *   cublaslt_exec_map     problem -> cuBLASLt's view (epilogue, transposes,
 *                         column-major layouts): pure, no GPU, tested on CPU;
 *   cublaslt_exec_ctx     the driver, the device's primary context and one
 *                         cuBLASLt handle;
 *   cublaslt_exec_plan    descriptors and layouts made once, the heuristic's
 *                         top-k algorithms (the template's ALGO parameter
 *                         picks one), the workspace they need;
 *   cublaslt_exec_gemm    one cublasLtMatmul on a CUstream.
 *
 * Row-major onto column-major. cuBLASLt reads matrices column-major, and a
 * row-major [R, C] matrix with row stride ld is, read column-major, its
 * transpose [C, R] with leading dimension ld. So instead of Y = X W^T we ask
 * cuBLASLt for Y^T = W X^T, whose operands are all in memory already:
 *
 *   cuBLASLt   shape      what the memory holds               op
 *   A          [N, K]     W [N,K] row-major = [K, N] col-major   T  (rows K, cols N, ld w)
 *                         W [K,N] row-major = [N, K] col-major   N  (rows N, cols K, ld w)
 *   B          [K, M]     X [M,K] row-major = X^T col-major      N  (rows K, cols M, ld x)
 *   C, D       [N, M]     R, Y [M,N] row-major                   -  (rows N, cols M, ld r / y)
 *   m, n, k               N, M, K
 *
 * The bias has one value per row of D, i.e. per output feature: cuBLASLt's
 * broadcast along D's columns is our broadcast along tokens. Nothing is
 * transposed or copied. */
#ifndef STOF_CORE_CUBLASLT_EXEC_H
#define STOF_CORE_CUBLASLT_EXEC_H

#include <cublasLt.h>
#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

#include "core/gpu/cuda_driver.h"
#include "core/exec/gemm/gemm_exec.h"
#include "stof.h"

#define CUBLASLT_EXEC_MAX_ALGOS 16
#define CUBLASLT_EXEC_DEFAULT_ALGOS 4 /* the template's ALGO values 0..3 */
#define CUBLASLT_EXEC_DEFAULT_WORKSPACE ((size_t)32 << 20)
#define CUBLASLT_EXEC_DEFAULT_ALIGN 16 /* bytes: gemm_exec's pointer contract */

/* ---- problems -> cuBLASLt (CPU only) ------------------------------------------- */

/* Row strides in elements; 0 means packed (the row length). Multiples of 8
 * (16-byte rows), at least the row length. */
typedef struct cublaslt_exec_strides {
    int64_t x, w, r, y;
} cublaslt_exec_strides;

/* One matrix as cuBLASLt sees it: column-major rows x cols, leading
 * dimension ld (elements). */
typedef struct cublaslt_exec_matrix {
    uint64_t rows, cols;
    int64_t ld;
} cublaslt_exec_matrix;

typedef struct cublaslt_exec_mapping {
    cublasLtEpilogue_t epilogue;
    cublasOperation_t trans_a, trans_b;
    uint64_t m, n, k;            /* cuBLASLt's: N, M, K */
    cublaslt_exec_matrix a, b, c, d; /* W, X^T, R^T (D's own when no residual), Y^T */
    cudaDataType_t type;         /* of A, B, C, D and the bias */
    cublasComputeType_t compute; /* CUBLAS_COMPUTE_32F */
    cudaDataType_t scale_type;   /* CUDA_R_32F: alpha, beta are floats */
    float alpha, beta;           /* 1, and 1 with a residual (else 0) */
    int has_bias;
    cublaslt_exec_strides strides; /* the row strides, packed ones filled in */
} cublaslt_exec_mapping;

/* The problem is one cuBLASLt can run: tmpl FUSION_T_CUBLASLT, f16/bf16,
 * M in 1..2^31-1, N and K positive multiples of 8 within int32, no norm, no
 * erf GELU, no residual with an activation, no store_pre_norm. The fields
 * gemm_exec keeps for other templates (n2, epi2, eps, the embedding's) are
 * ignored. STOF_ERR_INVALID for a malformed problem, STOF_ERR_UNSUPPORTED
 * for one cuBLASLt cannot fuse. */
int cublaslt_exec_validate(const gemm_exec_problem *p, stof_error *err);

/* Validates p and its strides (s may be NULL: every tensor packed) and fills
 * *out with cuBLASLt's view of it (see the table at the top). */
int cublaslt_exec_map(const gemm_exec_problem *p, const cublaslt_exec_strides *s,
                      cublaslt_exec_mapping *out, stof_error *err);

/* "DEFAULT", "BIAS", "GELU_BIAS"... ("?" for others). */
const char *cublaslt_exec_epilogue_name(cublasLtEpilogue_t e);

/* The tensors of one launch against a mapping: present, align_bytes-aligned
 * pointers (bias too, when used), row strides equal to the mapping's (0 =
 * packed), and for an in-place residual (residual == y) equal residual and
 * y strides (cuBLASLt runs C == D only with one layout).
 * STOF_ERR_INVALID naming the tensor otherwise. */
int cublaslt_exec_check_tensors(const gemm_exec_problem *p, const cublaslt_exec_mapping *m,
                                int align_bytes, const gemm_exec_gemm_tensors *t,
                                stof_error *err);

/* Turns a cuBLASLt status into a stof status and a message naming the call
 * and the status (cublasLtGetStatusName / String): NOT_SUPPORTED and
 * ARCH_MISMATCH -> STOF_ERR_UNSUPPORTED, ALLOC_FAILED -> STOF_ERR_DEVICE_OOM,
 * INVALID_VALUE -> STOF_ERR_INVALID, the rest -> STOF_ERR_CUDA. */
int cublaslt_exec_status(cublasStatus_t st, const char *what, stof_error *err);

/* ---- the GPU context ------------------------------------------------------------- */

typedef struct cublaslt_exec_ctx {
    const cuda_driver *drv;
    CUdevice dev;
    CUcontext cu; /* the device's primary context (retained), shared with gemm_exec */
    stof_device_info info;
    char arch[16];
    cublasLtHandle_t handle;
} cublaslt_exec_ctx;

/* Checks the device first (core/gpu/device.h): STOF_ERR_NO_DEVICE with the
 * driver's reason when there is no GPU, before cuBLASLt is called. Leaves
 * the primary context current on the calling thread. */
int cublaslt_exec_ctx_create(int ordinal, cublaslt_exec_ctx **out, stof_error *err);
/* Destroys the handle, releases the primary context. NULL is fine. Free the
 * plans first. */
void cublaslt_exec_ctx_free(cublaslt_exec_ctx *c);

/* ---- plans ---------------------------------------------------------------------------- */

/* Plan options; cublaslt_exec_plan_create takes NULL for all defaults, and
 * 0 in a field for its default. */
typedef struct cublaslt_exec_options {
    int n_algos;            /* heuristic results to keep, 1..CUBLASLT_EXEC_MAX_ALGOS
                               (default CUBLASLT_EXEC_DEFAULT_ALGOS) */
    int algo;               /* the one launched, 0 = the heuristic's favourite */
    size_t max_workspace;   /* bytes the algorithms may use (default 32 MiB) */
    int align_bytes;        /* pointer alignment the launches promise: 16 (default)
                               .. 256, a power of two; stricter lets cuBLASLt pick
                               from more kernels */
    cublaslt_exec_strides strides;
} cublaslt_exec_options;

typedef struct cublaslt_exec_algo {
    cublasLtMatmulAlgo_t algo;
    size_t workspace; /* bytes it needs */
    float waves;      /* the heuristic's device-utilisation estimate */
} cublaslt_exec_algo;

typedef struct cublaslt_exec_plan {
    gemm_exec_problem problem;
    cublaslt_exec_mapping map;
    int align_bytes;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c, d;
    int n_algos;   /* what the heuristic returned (<= requested) */
    int algo;      /* the one launched */
    cublaslt_exec_algo algos[CUBLASLT_EXEC_MAX_ALGOS];
    CUdeviceptr workspace; /* the largest any kept algorithm needs (0 when none does) */
    size_t workspace_bytes;
    CUdeviceptr bias;      /* the bias pointer the descriptor holds now */
} cublaslt_exec_plan;

/* Validates and maps p, creates the matmul descriptor (compute type, scale
 * type, transposes, epilogue, bias type) and the four layouts, asks
 * cublasLtMatmulAlgoGetHeuristic for the top n_algos algorithms within
 * max_workspace bytes for align_bytes-aligned operands, and allocates the
 * workspace the largest of them needs. STOF_ERR_UNSUPPORTED when cuBLASLt
 * offers none, or fewer than opt->algo + 1. On failure nothing is left
 * allocated. */
int cublaslt_exec_plan_create(cublaslt_exec_ctx *c, const gemm_exec_problem *p,
                              const cublaslt_exec_options *opt, cublaslt_exec_plan **out,
                              stof_error *err);
void cublaslt_exec_plan_free(cublaslt_exec_ctx *c, cublaslt_exec_plan *plan);

/* Chooses the algorithm launched: the template's ALGO parameter. STOF_OK
 * for 0 <= algo < plan->n_algos, else STOF_ERR_UNSUPPORTED (the heuristic
 * offered fewer: the search should treat that setting as infeasible). */
int cublaslt_exec_plan_select(cublaslt_exec_plan *plan, int algo, stof_error *err);

/* One line: problem, epilogue, transposes, algorithm (id, tile, stages,
 * split-K, workspace, waves). snprintf's return. */
size_t cublaslt_exec_plan_describe(const cublaslt_exec_plan *plan, char *buf, size_t n);

/* ---- launching -------------------------------------------------------------------------- */

/* Checks the tensors (cublaslt_exec_check_tensors), points the descriptor at
 * the bias when it changed and runs cublasLtMatmul with the selected
 * algorithm on stream s (asynchronous). The plan's context must be current
 * on the calling thread (plan creation makes it so). A plan's descriptor
 * holds the bias pointer, so one plan must not be launched from two threads
 * at once. The residual may be y itself (in place). */
int cublaslt_exec_gemm(cublaslt_exec_ctx *c, cublaslt_exec_plan *plan,
                       const gemm_exec_gemm_tensors *t, CUstream s, stof_error *err);

#endif
