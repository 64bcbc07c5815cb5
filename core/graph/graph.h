/* The operator graph: tensors, operators in execution order, masks.
 *
 * A graph is built once (by the Lua API or by tests), validated as it grows
 * (operators come in through op_add, ops/ops.h, which infers and checks
 * their shapes by the op table and then appends them here), and then only read: by the CPU reference, the fusion module and the GPU
 * executor. Tensors and ops are referred to by index. */
#ifndef STOF_CORE_GRAPH_H
#define STOF_CORE_GRAPH_H

#include <stdint.h>

#include "stof.h"

#define GRAPH_MAX_DIMS 4
#define GRAPH_MAX_INPUTS 6
#define GRAPH_NAME_MAX 96
#define GRAPH_MAX_SOURCE_PARTS 16

/* Upper bounds that catch absurd sizes before anything is allocated. */
#define GRAPH_MAX_DIM_SIZE (1LL << 24)
#define GRAPH_MAX_TENSOR_ELEMS (1LL << 34)

struct mask;

typedef enum graph_role {
    GRAPH_INPUT = 0,
    GRAPH_WEIGHT,
    GRAPH_ACTIVATION,
    GRAPH_OUTPUT
} graph_role;

/* How a weight or input is filled when no file provides it. The same
 * (seed, tensor name) gives the same values on every backend. */
typedef enum graph_init_kind {
    GRAPH_INIT_UNIFORM = 0, /* uniform in [-scale, scale] */
    GRAPH_INIT_ONES,        /* 1 + uniform in [-scale, scale] (norm gains) */
    GRAPH_INIT_ZEROS,
    GRAPH_INIT_TOKENS,      /* integers in [0, high) (token ids) */
    GRAPH_INIT_PADDING      /* an attention_mask [B, S] (1 = token, 0 = padding): ones when
                               no file gives it (the input is optional); from a file each
                               row is ones, then zeros (right padding) */
} graph_init_kind;

typedef struct graph_tensor {
    char name[GRAPH_NAME_MAX];
    graph_role role;
    stof_dtype dtype;
    int ndim;
    int64_t shape[GRAPH_MAX_DIMS];
    int producer;      /* op index; -1 for inputs and weights */
    graph_init_kind init;
    float init_scale;
    int64_t init_high; /* GRAPH_INIT_TOKENS: exclusive upper bound */
    int line;          /* script line that made it, 0 when unknown */
    int source;        /* weights: 1 + index into graph.sources when a weight file
                          assembles it from other tensors; 0: read under its own name */
    int constant;      /* weights: its init's exact value (0, or 1) whatever the weight
                          file: the bias of a norm a model has without one */
    int optional;      /* inputs: a run may leave it out; then its init (zeros) */
} graph_tensor;

/* An input a run may leave out: an attention_mask (then all ones) or one
 * marked optional (then zeros). */
static inline int graph_input_optional(const graph_tensor *t) {
    return t->role == GRAPH_INPUT && (t->optional || t->init == GRAPH_INIT_PADDING);
}

/* A weight a checkpoint stores as several tensors (a fused QKV projection
 * from query, key and value): the parts, concatenated along dim 0. */
typedef struct graph_source {
    int tensor;       /* the weight */
    int first, n;     /* its parts' names: graph.source_names[first .. first + n - 1] */
    int64_t row_offset; /* > 0: the weight is rows row_offset.. of its one part (RoBERTa's
                           position table starts at padding_idx + 1) */
    int64_t part_rows[GRAPH_MAX_SOURCE_PARTS]; /* rows (dim 0) of each part, in order
                                                  (transposed: the weight's rows) */
    int transposed;   /* 1: the weight [N, K] is the transpose of its one part, [K, N] in
                         the checkpoint (GPT-2's Conv1D stores [in, out]) */
} graph_source;

typedef enum op_kind {
    OP_GEMM = 0,  /* y[..., N] = x[..., K] . W ; W is [N, K] (nn.Linear) or [K, N] */
    OP_BIAS,      /* y = x + b[N] */
    OP_ADD,       /* y = a + b, same shapes (residual) */
    OP_LAYERNORM, /* over the last dim, gain and shift [N] */
    OP_RMSNORM,   /* over the last dim, gain [N] */
    OP_GELU,
    OP_RELU,
    OP_SOFTMAX,   /* over the last dim */
    OP_EMBEDDING, /* ids[B, S] -> word[V, H] rows (+ position[P, H] rows, + type[T, H] row 0) */
    OP_ATTENTION, /* masked multi-head attention, see op_attention */
    OP_GLU,       /* gated unit: x [..., 2F] -> act(x[..., :F]) * x[..., F:] (GeGLU, SwiGLU) */
    OP_ROTARY,    /* rotary position embedding of the Q and K parts of a fused QKV tensor */
    OP_MASK_ROWS, /* x [B, S, ...], mask [B, S] int32 -> x where mask != 0, zeros elsewhere */
    OP_KIND_COUNT
} op_kind;

/* Masked multi-head attention.
 * Self-attention: inputs {qkv [B, S, (H + 2 KVH) D] laid out [B, S, Q | K | V] with H, KVH
 * and KVH heads of D}.
 * Cross-attention: inputs {q [B, Sq, H*D], kv [B, Sk, 2*KVH*D] laid out [B, Sk, 2, KVH, D]}.
 * Grouped-query attention when KVH < H: query head h reads K/V head h / (H / KVH).
 * Optional (self-attention, when padded): an attention_mask [B, S] int32,
 * each row ones then zeros: keys j >= len_b are masked out and rows
 * i >= len_b are zeros, len_b the row's count of ones.
 * Optional last input: T5 relative position bias table [buckets, H]; the
 * score bias for (i, j) is table[bucket(j - i), h].
 * Global tokens (self-attention, not causal, no relpos, no KV cache; Longformer's): a
 * global_mask [B, S] int32 after the attention_mask (or after qkv), 1 = a global token (one
 * past a row's length is padding, as transformers merges the two masks), then optionally
 * global_qkv, laid out and shaped as qkv. Every query also attends every global key (besides
 * the keys its mask allows); a global query attends every key of its sequence, with
 * global_qkv's Q, K and V when given, else qkv's.
 * Output: [B, Sq, H*D]. */
typedef struct op_attention {
    int heads;
    int head_dim;
    int cross;
    int causal;         /* combined (AND) with the mask */
    int mask;           /* index into graph.masks, -1 for no mask (dense) */
    float scale;        /* applied to q.k; 1/sqrt(head_dim) by default */
    int relpos;         /* 1 when the bias table input is present */
    int relpos_buckets;
    int relpos_max_distance;
    int relpos_bidirectional;
    int padded;         /* 1 when the attention_mask input is present (input 1) */
    int kv_heads;       /* K/V heads (KVH), dividing heads; 0: heads (no grouping) */
    /* A decode step (self-attention, causal): inputs {qkv [B, 1, W], positions [B, 1] int32,
     * k_cache, v_cache [B, slots, KVH, D] (the layer's KV cache, a weight the step writes)};
     * the token of batch b sits at position p = positions[b], its K and V go to the KV cache,
     * and it attends the cached keys j <= p that row p of the mask (context x context)
     * allows. Run with its cache (ops_attention_decode_ref), not by the op table. */
    int decode;
    /* A prefill that fills a KV cache (causal self-attention, no relpos): inputs {qkv,
     * [attention_mask], k_cache, v_cache} with the caches [B, slots, KVH, D] as a decode step
     * has them. Besides its output, the K and V of each sequence's last `slots` real rows
     * (right padded by the attention_mask) go to the cache, row s at slot s % slots. The op
     * table's CPU reference computes the output only; the executor writes the cache. */
    int store;
    int global_keys;    /* 1 when the global_mask input is present (after the attention_mask) */
    int global_qkv;     /* 1 when the global rows' own projections follow the global_mask */
} op_attention;

/* Where the global_mask and global_qkv inputs of a global-token attention sit. */
static inline int op_attention_global_input(const op_attention *a) {
    return 1 + (a->padded ? 1 : 0);
}

/* The attention's K/V head count (kv_heads, or heads when 0). */
static inline int op_attention_kv_heads(const op_attention *a) {
    return a->kv_heads > 0 ? a->kv_heads : a->heads;
}

/* The activation of an OP_GLU. */
enum { OP_GLU_GELU = 0, OP_GLU_GELU_TANH, OP_GLU_SILU };

typedef struct graph_op {
    op_kind kind;
    char name[GRAPH_NAME_MAX];
    int inputs[GRAPH_MAX_INPUTS];
    int n_inputs;
    int output;
    int layer; /* index of the layer (block) it belongs to, -1 outside layers */
    int line;  /* script line that made it, 0 when unknown */
    union {
        struct { int weight_kn; } gemm; /* 1: W stored [K, N] (kn = true) */
        /* has_dtype: the sum is stored as dtype (a residual stream kept in fp32 while the
         * model runs in f16 or bf16), a and b any float dtypes; else all three alike */
        struct { int has_dtype; stof_dtype dtype; } add;
        struct { float eps; } norm;
        struct { int tanh; } gelu;      /* 1: tanh approximation (GPT-2) */
        /* inputs: ids, word, [pos], [type], [type ids: the row of type per token; without,
         * row 0], [position ids [B, S] int32: the row of pos per token; without, s] */
        struct { int has_position, has_type, has_type_ids, has_position_ids; } embedding;
        struct { int act; } glu;        /* OP_GLU_GELU, OP_GLU_GELU_TANH or OP_GLU_SILU */
        /* x [B, S, (heads + 2 kv_heads) head_dim] laid out [B, S, Q | K | V] with heads,
         * kv_heads and kv_heads heads: Q and K rotated by position s (the halves of each
         * head_dim as the pairs, as GPT-NeoX and Hugging Face do), V as it is; with
         * has_positions, by positions[b, s] (input 1, int32 [B, S]) instead */
        struct { int has_positions, heads, kv_heads, head_dim; float theta; } rotary;
        op_attention attn;
    } attr;
} graph_op;

typedef struct graph {
    char name[GRAPH_NAME_MAX];
    graph_tensor *tensors;
    int n_tensors, cap_tensors;
    graph_op *ops;
    int n_ops, cap_ops;
    struct mask **masks; /* owned: freed by mask_release */
    int n_masks, cap_masks;
    void (*mask_release)(struct mask *); /* given with the masks: the graph does
                                            not know what a mask is */
    int output;          /* tensor index of the model output, -1 until set */
    int current_layer;   /* stamped on ops as they are added */
    int n_layers;
    graph_source *sources;          /* see graph_set_source */
    int n_sources, cap_sources;
    char (*source_names)[GRAPH_NAME_MAX];
    int n_source_names, cap_source_names;
    int *name_index;     /* tensor ids by name (graph.c), name_cap slots */
    int name_cap;
    char (*suffix_base)[GRAPH_NAME_MAX]; /* names given to several ops, and the next "#k" */
    int *suffix_next;    /* to try for each (graph.c), suffix_cap slots, n_suffixes used */
    int suffix_cap, n_suffixes;
} graph;

void graph_init(graph *g);
void graph_free(graph *g);

/* Adds an input or weight tensor described by *t (name, role, dtype, shape,
 * init). Names are unique. */
int graph_add_tensor(graph *g, const graph_tensor *t, int *id, stof_error *err);

/* STOF_ERR_INVALID naming kind_name and the input when an input of op is
 * not a tensor of g. */
int graph_check_inputs(const graph *g, const graph_op *op, const char *kind_name,
                       stof_error *err);

/* Appends an operator whose output the caller has inferred (op_add in
 * ops/ops.h does, and is how operators are added): kind, name, inputs, attr
 * and line are read from *op, the output's dtype and shape from *out. The
 * output is named after op->name, or kind_name and the op's index, made
 * unique. Inputs must be tensors of g. */
int graph_append_op(graph *g, const graph_op *op, const char *kind_name, const graph_tensor *out,
                    int *out_tensor, stof_error *err);

/* Takes ownership of m (also on failure): release frees it, with the graph
 * or right away on failure. Every mask of a graph has the same release. */
int graph_add_mask(graph *g, struct mask *m, void (*release)(struct mask *), int *id,
                   stof_error *err);

int graph_set_output(graph *g, int tensor, stof_error *err);

/* Weight `tensor` is read from a weight file as the concatenation along
 * dim 0 of the n tensors named parts (1 to GRAPH_MAX_SOURCE_PARTS names,
 * each shorter than GRAPH_NAME_MAX, no name twice); once per weight. rows:
 * each part's rows, adding up to the weight's (grouped-query attention stacks
 * a Q of more rows than K and V), or NULL for n equal parts. */
int graph_set_source(graph *g, int tensor, const char *const *parts, const int64_t *rows, int n,
                     stof_error *err);
/* Weight `tensor` is rows `rows`.. (dim 0) of the checkpoint tensor of its
 * own name, its shape[0] of them (rows >= 1; no other source). */
int graph_set_source_rows(graph *g, int tensor, int64_t rows, stof_error *err);
/* Weight `tensor`, 2-D [N, K], is the transpose of the checkpoint tensor
 * `part` ([K, N]; NULL: the one of its own name); no other source. A file
 * that stores a projection [in, out] (GPT-2's Conv1D) is transposed once
 * as it is read, so the model's GEMMs take [N, K] weights (nn.Linear) as
 * every other model's do. */
int graph_set_source_transposed(graph *g, int tensor, const char *part, stof_error *err);
/* The source of tensor t, or NULL when it is read under its own name. */
const graph_source *graph_source_of(const graph *g, int t);
/* Part k of source s. */
const char *graph_source_part(const graph *g, const graph_source *s, int k);

/* Layer bookkeeping: ops added between begin and end get the same layer id. */
void graph_begin_layer(graph *g);
void graph_end_layer(graph *g);

int graph_find_tensor(const graph *g, const char *name);
int64_t graph_tensor_numel(const graph_tensor *t);
size_t graph_tensor_bytes(const graph_tensor *t);
/* Whether the model's output is f16 or bf16, so that its fp32 tensors are residual streams. */
int graph_has_streams(const graph *g);
/* Whether tensor t is fp32 in a model whose output is f16 or bf16: a residual stream kept in
 * fp32 (m:add's dtype option), which only the memory-bound chains read and write. */
int graph_tensor_is_stream(const graph *g, int t);

/* Whole-graph checks after building: an output is set, every op input exists
 * and is produced before use. */
int graph_validate(const graph *g, stof_error *err);

/* Writes "[8, 512, 768]" into buf. */
const char *graph_shape_str(const graph_tensor *t, char *buf, size_t n);

#endif
