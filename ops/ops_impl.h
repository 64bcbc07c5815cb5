/* Private to ops/: the functions each family file gives the operator table in
 * ops.c, and the small checks they share (defined in ops.c).
 *
 * Every infer function validates its op completely (ranks, dtypes, sizes,
 * attributes) so that cost and ref can trust the shapes they read. cost and
 * ref take an op of g (op->output is set). */
#ifndef STOF_OPS_IMPL_H
#define STOF_OPS_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "ops/ops.h"

/* The three signatures of op_desc, spelled once. */
#define OPS_INFER_ARGS const graph *g, const graph_op *op, graph_tensor *out, stof_error *err
#define OPS_COST_ARGS const graph *g, const graph_op *op, double *flops, double *bytes
#define OPS_REF_ARGS \
    const graph *g, const graph_op *op, const float *const *in, float *out, stof_error *err

/* linear.c */
int ops_gemm_infer(OPS_INFER_ARGS);
void ops_gemm_cost(OPS_COST_ARGS);
int ops_gemm_ref(OPS_REF_ARGS);
int ops_bias_infer(OPS_INFER_ARGS);
void ops_bias_cost(OPS_COST_ARGS);
int ops_bias_ref(OPS_REF_ARGS);

/* elementwise.c */
int ops_add_infer(OPS_INFER_ARGS);
void ops_add_cost(OPS_COST_ARGS);
int ops_add_ref(OPS_REF_ARGS);
int ops_unary_infer(OPS_INFER_ARGS); /* gelu, relu, softmax: y has x's shape */
void ops_gelu_cost(OPS_COST_ARGS);
int ops_gelu_ref(OPS_REF_ARGS);
void ops_relu_cost(OPS_COST_ARGS);
int ops_relu_ref(OPS_REF_ARGS);
void ops_softmax_cost(OPS_COST_ARGS);
int ops_softmax_ref(OPS_REF_ARGS);

/* norm.c */
int ops_layernorm_infer(OPS_INFER_ARGS);
void ops_layernorm_cost(OPS_COST_ARGS);
int ops_layernorm_ref(OPS_REF_ARGS);
int ops_rmsnorm_infer(OPS_INFER_ARGS);
void ops_rmsnorm_cost(OPS_COST_ARGS);
int ops_rmsnorm_ref(OPS_REF_ARGS);

/* embedding.c */
int ops_embedding_infer(OPS_INFER_ARGS);
void ops_embedding_cost(OPS_COST_ARGS);
int ops_embedding_ref(OPS_REF_ARGS);

/* attention.c */
int ops_glu_infer(OPS_INFER_ARGS);
void ops_glu_cost(OPS_COST_ARGS);
int ops_glu_ref(OPS_REF_ARGS);
int ops_rotary_infer(OPS_INFER_ARGS);
void ops_rotary_cost(OPS_COST_ARGS);
int ops_rotary_ref(OPS_REF_ARGS);
/* The length of an attention_mask row (its ones before the first zero). */
int64_t ops_padding_length(const float *row, int64_t seq);
int ops_mask_rows_infer(OPS_INFER_ARGS);
void ops_mask_rows_cost(OPS_COST_ARGS);
int ops_mask_rows_ref(OPS_REF_ARGS);
int ops_attention_infer(OPS_INFER_ARGS);
void ops_attention_cost(OPS_COST_ARGS);
int ops_attention_ref(OPS_REF_ARGS);

/* ---- shared by the families (ops.c) -------------------------------------- */

/* Room for "'name' [a, b, c, d]" as ops_tensor_str writes it. */
#define OPS_TENSOR_STR_MAX (GRAPH_NAME_MAX + 96)

/* Input k of op. */
const graph_tensor *ops_input(const graph *g, const graph_op *op, int k);
/* The output tensor of an op of g. */
const graph_tensor *ops_output(const graph *g, const graph_op *op);

/* err_set with the op named first: "gemm 'l0.qkv': <message>". */
int ops_fail(const graph_op *op, stof_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* "'hidden' [8, 512, 768]" */
const char *ops_tensor_str(const graph_tensor *t, char *buf, size_t n);

/* role is how the message calls the tensor ("x", "W", "gamma"). */
/* fp32, fp16 or bf16. */
int ops_dtype_is_float(stof_dtype t);
int ops_require_float(const graph_op *op, const graph_tensor *t, const char *role,
                      stof_error *err);
int ops_require_rank(const graph_op *op, const graph_tensor *t, const char *role, int min_rank,
                     int max_rank, stof_error *err);
/* t must be [n], the per-feature parameter vector of x's last dim. */
int ops_require_vector(const graph_op *op, const graph_tensor *t, const char *role, int64_t n,
                       stof_error *err);
/* b has a's dtype (one dtype per op: kernels are built for one). */
int ops_require_same_dtype(const graph_op *op, const graph_tensor *a, const char *a_role,
                           const graph_tensor *b, const char *b_role, stof_error *err);

/* out gets t's dtype, rank and shape. */
void ops_copy_shape(graph_tensor *out, const graph_tensor *t);
int64_t ops_last_dim(const graph_tensor *t);
/* Product of every dim but the last: the rows a row-wise op works on. */
int64_t ops_rows(const graph_tensor *t);

/* Every input read once plus the output written once, in their dtypes. */
double ops_io_bytes(const graph *g, const graph_op *op);
/* The cost of a memory-intensive op: flops_per_element on every output
 * element, bytes from ops_io_bytes. */
void ops_mi_cost(const graph *g, const graph_op *op, double flops_per_element, double *flops,
                 double *bytes);

#endif
