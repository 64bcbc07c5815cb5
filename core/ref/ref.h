/* The CPU reference executor: runs a whole graph in fp32, op by op, through
 * the op table's reference functions. It is the ground truth every GPU result
 * is compared with. Activations are freed after their last use, so peak
 * memory is the live set, not the sum of all tensors. */
#ifndef STOF_CORE_REF_H
#define STOF_CORE_REF_H

#include <stdint.h>

#include "core/graph/graph.h"
#include "core/io/weights.h"

typedef struct ref_values {
    int n;          /* = graph.n_tensors */
    float **data;   /* per tensor; NULL when not live */
    size_t peak_bytes;
} ref_values;

/* Checks src against g (weights_source_check), then allocates the table
 * and fills inputs and weights from src. */
int ref_values_init(const graph *g, const weights_source *src, ref_values *rv, stof_error *err);
void ref_values_free(ref_values *rv);

/* Runs every op; on return rv->data[g->output] holds the output. */
int ref_execute(const graph *g, ref_values *rv, stof_error *err);

/* What a caller adds to a run: ops it computes itself (a decode step's
 * attention, with its KV cache) and a look at each op's inputs and output
 * while they are still live (a prefill filling the cache). */
typedef struct ref_hooks {
    void *ctx;
    /* Computes op i into out and sets *handled, or leaves *handled 0 for the
     * op's own reference. */
    int (*run)(void *ctx, const graph *g, int i, const float *const *in, float *out,
               int *handled, stof_error *err);
    /* After op i ran. */
    int (*after)(void *ctx, const graph *g, int i, const float *const *in, const float *out,
                 stof_error *err);
} ref_hooks;

/* ref_execute with hooks (NULL: none). */
int ref_execute_hooked(const graph *g, ref_values *rv, const ref_hooks *h, stof_error *err);

/* Checksum of a buffer: sum and sum of squares in double. */
void ref_checksum(const float *x, int64_t n, double *sum, double *sum_sq);

#endif
