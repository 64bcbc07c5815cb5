/* The operator table: for every op kind, its name, class, shape rule, cost
 * and CPU reference. One row per kind (ops.c); one file per family holds the
 * functions (linear.c, elementwise.c, norm.c, embedding.c, attention.c). */
#ifndef STOF_OPS_H
#define STOF_OPS_H

#include "core/graph/graph.h"

typedef enum op_class {
    OP_CLASS_CI = 0, /* compute-intensive: GEMM, attention */
    OP_CLASS_MI      /* memory-intensive: element-wise, norms, gathers */
} op_class;

typedef struct op_desc {
    op_kind kind;
    const char *name;
    op_class cls;
    int min_inputs, max_inputs;
    /* Checks the inputs of op and fills out->dtype, ndim and shape. The error
     * message says what was expected ("gemm: x has 768 features but W has
     * 1024 inputs"). */
    int (*infer)(const graph *g, const graph_op *op, graph_tensor *out, stof_error *err);
    /* Floating-point operations, and the fewest bytes moved (each input read
     * once, the output written once, in the tensors' dtypes). */
    void (*cost)(const graph *g, const graph_op *op, double *flops, double *bytes);
    /* fp32 CPU reference. in[k] holds input k (row-major, int ids stored as
     * exact floats); out has the output's element count. */
    int (*ref)(const graph *g, const graph_op *op, const float *const *in, float *out,
               stof_error *err);
} op_desc;

const op_desc *op_describe(op_kind kind);

/* Adds an operator to g: kind, name, inputs, attr and line are read from
 * *op; its input count and inputs are checked and its output tensor made
 * with the shape the op table infers (graph_append_op). */
int op_add(graph *g, const graph_op *op, int *out_tensor, stof_error *err);
/* -1 when unknown. */
int op_kind_from_name(const char *name);
const char *op_class_name(op_class c);

/* Rows first .. first + n - 1 of an attention op's reference output, a row
 * being one query position of one batch over every head ([B * Sq] rows of
 * H * D floats), into out (n rows): what the op's ref computes for them, so
 * callers can split the work. */
int ops_attention_ref_rows(const graph *g, const graph_op *op, const float *const *in,
                           int64_t first, int64_t n, float *out, stof_error *err);

/* Cost of one op (convenience over op_describe(kind)->cost). */
void op_cost(const graph *g, const graph_op *op, double *flops, double *bytes);

/* Reference helpers shared with tests and other modules. */
float op_gelu_erf(float x);
float op_gelu_tanh(float x);
/* One head's d values at position s rotated into y as the rotary op does: pairs (j, j + d/2)
 * by s * theta^(-2j/d). */
void op_rotary_head(const float *x, float *y, int d, int64_t s, double theta);
/* T5's bucket for relative position (key - query). */
int op_relpos_bucket(int relative_position, int bidirectional, int num_buckets,
                     int max_distance);

#endif
