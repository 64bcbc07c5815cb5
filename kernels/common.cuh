// Shared device helpers for every stof kernel (compiled by NVRTC).
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace stof {

// Element types by the STOF_DTYPE code the host passes (-DSTOF_DTYPE=...):
// 1 = fp16, 2 = bf16, 0 = fp32 (the values of stof_dtype in stof.h).
template <int Code> struct dtype_of;
template <> struct dtype_of<0> { using type = float; };
template <> struct dtype_of<1> { using type = __half; };
template <> struct dtype_of<2> { using type = __nv_bfloat16; };

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// Programmatic dependent launch (sm_90+; the host launches every kernel of
// this folder so, see cuda_launch). First thing in every kernel: let the
// next kernel of the stream be scheduled now (its blocks will wait below,
// so they cannot overtake), then wait until the previous kernel has
// completed and its writes are visible, before anything is read. Both
// instructions do nothing when the launch was an ordinary one.
//
// The two halves are there for kernels with work that depends on nothing
// the previous kernel writes, to do in between: the GEMMs ask L2 for their
// weights there (prefetch_l2), overlapping the previous kernel's tail.
__device__ __forceinline__ void grid_dependency_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_dependency_begin() {
    grid_dependency_launch();
    grid_dependency_wait();
}

// Asks L2 for rows rows of row_bytes bytes (a multiple of 16, rows 16-byte
// aligned) stride_bytes apart, split over the block's threads, without
// waiting (sm_90's bulk prefetch; nothing elsewhere). It returns no data,
// so it may run before grid_dependency_wait() even on memory the previous
// kernel writes: L2 is where every write lands, and a line it fetched early
// is updated there like any other.
__device__ __forceinline__ void prefetch_l2(const void *base, long long stride_bytes, int rows,
                                            int row_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    for (int r = threadIdx.x; r < rows; r += blockDim.x)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(
                         static_cast<const char *>(base) + r * stride_bytes),
                     "r"(row_bytes)
                     : "memory");
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

}  // namespace stof
