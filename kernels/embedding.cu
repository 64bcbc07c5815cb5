// The embedding gather: out[t, :] = word[ids[t]] (+ type[0]) (+ pos[t % seq_len]).
//
// The output is tokens x (hidden / VEC) chunks of VEC elements, one chunk a
// thread in a grid-stride loop over that flat index space, so that every
// thread has work whatever the hidden size (a block per token would leave
// threads idle at hidden / VEC < THREADS). Consecutive threads take
// consecutive chunks of one row: coalesced 16-byte loads at VEC = 8.
//
// Ids are on the device, so the host cannot validate them before the
// launch, and clamping a bad id would silently embed the wrong token. An id
// outside [0, vocab) makes its row zeros and records t + 1 in *error (the
// first bad token to claim the flag); the host reads the flag back and
// fails with the token and its id (gemm_exec_embedding_status).
#include "common.cuh"
#include "attention_common.cuh"
#include "gemm_abi.cuh"

#ifndef STOF_DTYPE
#define STOF_DTYPE 1
#endif
#ifndef THREADS
#define THREADS 256
#endif
#ifndef VEC
#define VEC 8
#endif
#ifndef HAS_POS
#define HAS_POS 1
#endif
#ifndef HAS_TYPE
#define HAS_TYPE 1
#endif

using elem_t = typename stof::dtype_of<STOF_DTYPE>::type;

static_assert(VEC == 1 || VEC == 2 || VEC == 4 || VEC == 8, "VEC is 1, 2, 4 or 8");
static_assert(THREADS % 32 == 0 && THREADS <= 1024, "THREADS: whole warps, at most 1024");

// VEC elements as VEC / 2 packed pairs (VEC = 1: one element in the low half).
template <int V> struct chunk {
    static constexpr int kWords = V >= 2 ? V / 2 : 1;
    unsigned w[kWords];
};

template <int V> __device__ __forceinline__ void add_chunk(float (&f)[V], const elem_t *p) {
    if constexpr (V == 1) {
        f[0] += stof::to_float(*p);
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
            const float2 t = stof::attn::unpack2<elem_t>(c.w[i]);
            f[2 * i] += t.x;
            f[2 * i + 1] += t.y;
        }
    }
}

template <int V> __device__ __forceinline__ void store_chunk(elem_t *p, const float (&f)[V]) {
    if constexpr (V == 1) {
        *p = stof::from_float<elem_t>(f[0]);
    } else {
        chunk<V> c;
#pragma unroll
        for (int i = 0; i < V / 2; ++i)
            c.w[i] = stof::attn::pack2<elem_t>(f[2 * i], f[2 * i + 1]);
        if constexpr (V == 8)
            *reinterpret_cast<uint4 *>(p) = *reinterpret_cast<const uint4 *>(c.w);
        else if constexpr (V == 4)
            *reinterpret_cast<uint2 *>(p) = *reinterpret_cast<const uint2 *>(c.w);
        else
            *reinterpret_cast<unsigned *>(p) = c.w[0];
    }
}

extern "C" __global__ void __launch_bounds__(THREADS) stof_embedding(const stof_embed_args a) {
    stof::grid_dependency_begin();  // before any read (common.cuh)
    static_assert(sizeof(stof_embed_args) == STOF_EMBED_ARGS_BYTES, "ABI mismatch");
    const int chunks = a.hidden / VEC;
    const long long total = a.tokens * chunks;
    const elem_t *word = static_cast<const elem_t *>(a.word);
    elem_t *out = static_cast<elem_t *>(a.out);
    for (long long idx = (long long)blockIdx.x * THREADS + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * THREADS) {
        const long long t = idx / chunks;
        const int col = (int)(idx - t * chunks) * VEC;
        const int id = __ldg(a.ids + t);
        float f[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e)
            f[e] = 0.0f;
        if (id < 0 || id >= a.vocab) {
            if (col == 0)
                atomicCAS(a.error, 0, (int)(t + 1));
            store_chunk(out + t * a.hidden + col, f);
            continue;
        }
        add_chunk(f, word + (long long)id * a.hidden + col);
        // Hugging Face BERT's order, as the CPU reference: word + type, then + position
#if HAS_TYPE
        add_chunk(f, static_cast<const elem_t *>(a.type) + col);
#endif
#if HAS_POS
        add_chunk(f, static_cast<const elem_t *>(a.pos) + (t % a.seq_len) * a.hidden + col);
#endif
        store_chunk(out + t * a.hidden + col, f);
    }
}
