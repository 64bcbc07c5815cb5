/* Deterministic values for weights and inputs: a pure function of (seed,
 * tensor name, element index), rounded to the tensor's dtype, so the CPU
 * reference and the GPU executor start from identical numbers. */
#ifndef STOF_CORE_WEIGHTS_H
#define STOF_CORE_WEIGHTS_H

#include <stdint.h>

#include "core/graph.h"

/* out holds graph_tensor_numel(t) floats (int ids as exact floats). */
void weights_fill(const graph_tensor *t, uint64_t seed, float *out);

/* Rounds x to what dtype can hold (fp16, bf16; fp32 and int32 unchanged). */
float weights_round(stof_dtype dtype, float x);

#endif
