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
__device__ __forceinline__ void grid_dependency_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
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
