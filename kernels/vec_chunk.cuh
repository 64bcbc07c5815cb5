// VEC consecutive 16-bit elements moved as one load or store (16 bytes at
// VEC = 8) and held as floats: the memory-bound kernels' unit of work
// (embedding.cu, glu.cu, rotary.cu). Pointers are aligned to VEC elements.
#pragma once

#include "common.cuh"
#include "attention_common.cuh"

namespace stof {

// VEC elements as VEC / 2 packed pairs (VEC = 1: one element in the low half).
template <int V> struct chunk {
    static constexpr int kWords = V >= 2 ? V / 2 : 1;
    unsigned w[kWords];
};

// f[i] += p[i] for i < V.
template <int V, typename T> __device__ __forceinline__ void add_chunk(float (&f)[V], const T *p) {
    if constexpr (V == 1) {
        f[0] += to_float(*p);
    } else {
        chunk<V> c;
        if constexpr (V == 8)
            *reinterpret_cast<uint4 *>(c.w) = *reinterpret_cast<const uint4 *>(p);
        else if constexpr (V == 4)
            *reinterpret_cast<uint2 *>(c.w) = *reinterpret_cast<const uint2 *>(p);
        else
            c.w[0] = *reinterpret_cast<const unsigned *>(p);
#pragma unroll
        for (int i = 0; i < V / 2; ++i) {
            const float2 t = attn::unpack2<T>(c.w[i]);
            f[2 * i] += t.x;
            f[2 * i + 1] += t.y;
        }
    }
}

// f[i] = p[i] for i < V.
template <int V, typename T> __device__ __forceinline__ void load_chunk(float (&f)[V], const T *p) {
#pragma unroll
    for (int i = 0; i < V; ++i)
        f[i] = 0.0f;
    add_chunk(f, p);
}

// p[i] = f[i] rounded to T, for i < V.
template <int V, typename T> __device__ __forceinline__ void store_chunk(T *p, const float (&f)[V]) {
    if constexpr (V == 1) {
        *p = from_float<T>(f[0]);
    } else {
        chunk<V> c;
#pragma unroll
        for (int i = 0; i < V / 2; ++i)
            c.w[i] = attn::pack2<T>(f[2 * i], f[2 * i + 1]);
        if constexpr (V == 8)
            *reinterpret_cast<uint4 *>(p) = *reinterpret_cast<const uint4 *>(c.w);
        else if constexpr (V == 4)
            *reinterpret_cast<uint2 *>(p) = *reinterpret_cast<const uint2 *>(c.w);
        else
            *reinterpret_cast<unsigned *>(p) = c.w[0];
    }
}

}  // namespace stof
