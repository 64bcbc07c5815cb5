/* Values for weights and inputs.
 *
 * Seeded: a pure function of (seed, tensor name, element index), rounded to
 * the tensor's dtype, so the CPU reference and the GPU executor start from
 * identical numbers. From files: a weights_source names a safetensors file
 * of weights (then every weight of the graph comes from it, nothing is left
 * random) and one of inputs (the inputs it holds come from it, the others
 * stay seeded); values are converted to float and rounded to the tensor's
 * dtype the same way, for every backend. */
#ifndef STOF_CORE_WEIGHTS_H
#define STOF_CORE_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "core/graph/graph.h"
#include "core/base/task_pool.h"

struct safetensors_file;

/* out holds graph_tensor_numel(t) floats (int ids as exact floats). */
void weights_fill(const graph_tensor *t, uint64_t seed, float *out);

/* Elements first .. first + n - 1 of weights_fill(t, seed, ...) into
 * out[0..n): each element depends on (seed, name, index) alone, so any
 * split of a tensor into ranges gives its values bit for bit. */
void weights_fill_range(const graph_tensor *t, uint64_t seed, int64_t first, int64_t n,
                        float *out);

/* n values (already rounded to dtype) as a device holds them: int32 ids,
 * fp16 or bf16 bits, fp32 as it is. */
void weights_store(stof_dtype dtype, const float *v, int64_t n, void *out);

/* An attention_mask [rows, seq]: each row 1s, then 0s (transformers' right
 * padding). Anything else is an error naming `what`, the row and the
 * position: a left-padded or holed row would need a mask of any keys,
 * which the kernels do not take. */
int weights_check_attention_mask(const char *what, const int64_t *v, int64_t rows, int64_t seq,
                                 stof_error *err);
/* The same for input x's int32 values (from a caller's buffer), naming the input. */
int weights_check_input_mask(const graph_tensor *x, const int32_t *v, stof_error *err);

/* Rounds x to what dtype can hold (fp16, bf16; fp32 and int32 unchanged). */
float weights_round(stof_dtype dtype, float x);

/* Where a graph's weights and inputs get their values. The files are
 * borrowed (safetensors_open / safetensors_close by the caller). */
typedef struct weights_source {
    uint64_t seed;                           /* for whatever no file gives */
    const struct safetensors_file *weights;  /* NULL: every weight seeded */
    const struct safetensors_file *inputs;   /* NULL: every input seeded */
} weights_source;

/* Everything seeded: the values stof used before weight files. */
weights_source weights_source_seeded(uint64_t seed);

/* Checks, before anything is allocated, that the files fit g: with a
 * weights file every weight is in it (under its name, after a checkpoint
 * prefix such as "bert.", or assembled from its source's parts) with its
 * shape (a weight read transposed: the reversed shape) and a float dtype
 * (F32, F16, BF16), all under one prefix; every
 * input the inputs file holds has its shape and, for int32 inputs, I32 or
 * I64 ids in [0, high), for float inputs a float dtype. Reports every
 * problem at once, each by name (STOF_ERR_MISMATCH; a malformed file's
 * own error as it is). */
int weights_source_check(const weights_source *src, const graph *g, stof_error *err);

/* The values of weight or input `tensor` of g: from its file (converted to
 * float, then rounded to the tensor's dtype with weights_round; a weight
 * read transposed in the tensor's own layout), else weights_fill with the
 * seed, in the tensor's declared shape. out holds graph_tensor_numel floats. */
int weights_source_values(const weights_source *src, const graph *g, int tensor, float *out,
                          stof_error *err);

/* ---- many tensors at once, on threads ---- */

/* What weights_source_values_many writes for a tensor. */
typedef enum weights_form {
    WEIGHTS_FLOAT = 0, /* graph_tensor_numel floats, as weights_source_values */
    WEIGHTS_STORED     /* graph_tensor_bytes bytes: weights_store of those floats */
} weights_form;

/* Elements of a seeded tensor per piece of work; a tensor from a file is
 * one piece (read by one thread; many are read at once). */
#define WEIGHTS_CHUNK (1 << 16)
/* Fewer elements of weights and inputs than this are filled on the
 * caller's thread (weights_pool). */
#define WEIGHTS_PARALLEL_MIN (1 << 20)

/* weights_source_values of tensors[0..n) into out[k] in `form`, the pieces
 * on pool and the caller (NULL pool: the caller alone): the same values,
 * bit for bit, whatever the pool and however the pieces fall. Every tensor
 * is resolved before anything is read; the error returned is the one of
 * the first failing tensor in the order given. */
int weights_source_values_many(const weights_source *src, const graph *g, const int *tensors,
                               int n, weights_form form, void *const *out, task_pool *pool,
                               stof_error *err);

/* A pool of task_pool_default_threads() - 1 workers (the caller works too)
 * for filling g's weights and inputs, for the caller to free; NULL (the
 * caller's thread alone) when they are fewer than WEIGHTS_PARALLEL_MIN
 * elements, there is one CPU, or no thread starts. */
task_pool *weights_pool(const graph *g);

/* One line per file on where the values come from, for people:
 *   "weights: 199 tensors from w.safetensors (fp32 -> fp16), 12 assembled"
 *   (", 48 transposed" where weights are read transposed)
 *   "inputs: 1 from in.safetensors (int64 -> int32), 1 seeded"
 * or "weights and inputs: seeded (seed 1)". */
void weights_source_describe(const weights_source *src, const graph *g, char *buf, size_t n);

#endif
