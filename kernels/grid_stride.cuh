// What the grid-stride memory kernels share (embedding.cu, glu.cu,
// rotary.cu, mask_rows.cu): their build constants STOF_DTYPE, THREADS and
// VEC with defaults and checks, the element type, and the loop: one chunk
// of VEC elements an index, consecutive threads on consecutive indices,
// the grid striding over the rest (the host caps the grid:
// gemm_grid_stride_shape).
#pragma once

#include "common.cuh"
#include "gemm_abi.cuh"
#include "vec_chunk.cuh"

#ifndef STOF_DTYPE
#define STOF_DTYPE 1
#endif
#ifndef THREADS
#define THREADS 256
#endif
#ifndef VEC
#define VEC 8
#endif

using elem_t = typename stof::dtype_of<STOF_DTYPE>::type;

static_assert(VEC == 1 || VEC == 2 || VEC == 4 || VEC == 8, "VEC is 1, 2, 4 or 8");
static_assert(THREADS % 32 == 0 && THREADS <= 1024, "THREADS: whole warps, at most 1024");

// for (idx over [0, total) of this thread) { ... }
#define STOF_GRID_STRIDE(idx, total)                                                      \
    for (long long idx = (long long)blockIdx.x * THREADS + threadIdx.x; idx < (total); \
         idx += (long long)gridDim.x * THREADS)
