/* The registry of compilation templates: for each, the kernel source it
 * compiles (kernels/NAME, or "cublaslt" for the vendor library), the op
 * sequences it implements, its tunable parameters and the check that throws
 * out settings that cannot run (shared memory, registers).
 *
 *   template         kernel               accepts (one segment)
 *   gemm_epilogue    gemm_epilogue.cu     gemm [bias] [gelu|relu] [add]
 *   cublaslt         cublaslt             gemm [bias] [relu|gelu(tanh)]; gemm [bias] add
 *   gemm_ln          gemm_ln.cu           gemm [bias] [add] layernorm|rmsnorm
 *   gemm_chain       gemm_chain.cu        gemm [bias] [gelu|relu] gemm [bias] [add]
 *   mi_chain         mi_chain.cu          (bias|add|gelu|relu|softmax)* [layernorm|rmsnorm]
 *   attention_row    attention_row.cu     attention
 *   attention_block  attention_block.cu   attention
 *   embedding        embedding.cu         embedding
 *   glu              glu.cu               glu
 *   rotary           rotary.cu            rotary
 *   mask_rows        mask_rows.cu         mask_rows
 *   attention_decode attention_decode.cu  [rotary] attention (one query row, a KV cache)
 *   gemv             gemv.cu              [layernorm|rmsnorm] gemm [bias] [gelu|relu] [add];
 *                                         [layernorm|rmsnorm] gemm [bias] glu; up to 16 rows
 *
 * Every single op matches at least one template, so the all-unfused scheme
 * is always valid. The norm kind is an epilogue flag (fusion_epilogue.norm),
 * not a separate template: LayerNorm and RMSNorm share the row-owning
 * structure and differ only in the reduction.
 *
 * cuBLASLt's GELU epilogue is the tanh approximation, so cublaslt takes GELU
 * only where the graph asks for it (GPT-2); an erf GELU (BERT) goes to the
 * own kernels. Its C operand (beta = 1) adds the residual before the
 * epilogue, which is why add combines with bias but not with an activation. */
#ifndef STOF_FUSION_TEMPLATES_H
#define STOF_FUSION_TEMPLATES_H

#include <stdint.h>

#include "core/graph/graph.h"

typedef enum fusion_template_id {
    FUSION_T_GEMM_EPILOGUE = 0,
    FUSION_T_CUBLASLT,
    FUSION_T_GEMM_LN,
    FUSION_T_GEMM_CHAIN,
    FUSION_T_MI_CHAIN,
    FUSION_T_ATTENTION_ROW,
    FUSION_T_ATTENTION_BLOCK,
    FUSION_T_EMBEDDING,
    FUSION_T_GLU,
    FUSION_T_ROTARY,
    FUSION_T_MASK_ROWS,
    FUSION_T_ATTENTION_DECODE, /* a decode step's attention against its KV cache */
    FUSION_T_GEMV,             /* a GEMM of a few rows: a decode step's */
    FUSION_T_COUNT
} fusion_template_id;

/* What a pattern slot accepts: one bit per op kind, and GELU's tanh form as
 * a token of its own (FUSION_TOK(OP_GELU) is the erf form). */
#define FUSION_TOK(kind) (1u << (kind))
#define FUSION_TOK_GELU_TANH (1u << OP_KIND_COUNT)

typedef enum fusion_repeat {
    FUSION_ONE = 0, /* exactly one op */
    FUSION_OPT,     /* zero or one */
    FUSION_ANY      /* zero or more */
} fusion_repeat;

typedef struct fusion_slot {
    unsigned tokens;
    fusion_repeat repeat;
} fusion_slot;

#define FUSION_MAX_SLOTS 8
#define FUSION_MAX_ALTS 2
#define FUSION_MAX_PARAMS 6
#define FUSION_MAX_VALUES 8

/* A sequence of slots the ops of a segment must fill in order. */
typedef struct fusion_pattern {
    int n_slots;
    fusion_slot slots[FUSION_MAX_SLOTS];
} fusion_pattern;

/* A tunable parameter; the kernel sees it as -DNAME=value. */
typedef struct fusion_param {
    const char *name;
    int n_values;
    int values[FUSION_MAX_VALUES];
} fusion_param;

/* The sizes of a matched segment that its settings' feasibility depends on
 * (filled by fusion_match_segment). */
typedef struct fusion_dims {
    int64_t m;      /* rows (tokens) */
    int64_t n;      /* output features of the first GEMM; row length of an MI chain */
    int64_t k;      /* reduction of the first GEMM */
    int64_t n2;     /* output features of the second GEMM (gemm_chain) */
    int elem_bytes; /* of the activations */
    int row_reduce; /* the segment holds a norm or softmax: whole rows at once */
    int weight_kn;  /* the first GEMM's weights are [K, N] */
    int batch, heads, head_dim, q_len, k_len; /* attention; rotary: heads and head_dim */
    int kv_heads;                             /* attention's K/V heads */
    int gated;      /* a GLU after the GEMM: each output takes two of its features */
    int prologue;   /* a norm ahead of the GEMM (gemv normalizes x's rows as it reads them) */
} fusion_dims;

/* Template flag: besides the segment's result it can write the input of its
 * closing norm (the residual stream of a pre-norm model, read again later). */
#define FUSION_TF_STORES_PRE_NORM 1u

typedef struct fusion_template {
    fusion_template_id id;
    const char *name;
    const char *kernel; /* file under kernels/, or "cublaslt" */
    unsigned flags;
    int n_alts;
    fusion_pattern alts[FUSION_MAX_ALTS];
    int n_params;
    fusion_param params[FUSION_MAX_PARAMS];
    /* STOF_OK, or STOF_ERR_UNSUPPORTED saying why the setting (one value per
     * parameter, in order) cannot run with smem_limit bytes of shared memory
     * per block. */
    int (*check)(const fusion_dims *d, const int *values, int smem_limit, stof_error *err);
    /* Parameters from this index on came after plans were first written: a
     * plan without one means its first value (0: every parameter required). */
    int plan_optional_from;
} fusion_template;

const fusion_template *fusion_template_get(fusion_template_id id);
/* NULL when no template has that name. */
const fusion_template *fusion_template_find(const char *name);

/* 1 when the op kinds (GELU split by approximation, as tokens) fill one of
 * the template's patterns. */
int fusion_template_accepts(const fusion_template *t, const unsigned *tokens, int n);
/* The token of an op. */
unsigned fusion_op_token(const graph_op *op);
/* The patterns as text, "gemm [bias] [gelu|relu] [add]", alternatives
 * separated by "; ". Returns the length needed, like snprintf. */
size_t fusion_template_pattern_str(const fusion_template *t, char *buf, size_t cap);

/* Settings: the product of the parameters' value lists, numbered
 * mixed-radix with the first parameter varying slowest. */
long fusion_template_settings(const fusion_template *t);
void fusion_template_setting(const fusion_template *t, long index, int *values);
/* Checks that every value is one of its parameter's, then the template's own
 * constraints. STOF_ERR_INVALID for a value not in the space,
 * STOF_ERR_UNSUPPORTED for a setting that cannot run. */
int fusion_template_check(const fusion_template *t, const fusion_dims *d, const int *values,
                          int smem_limit, stof_error *err);

#endif
