// A row-wise chain of memory-intensive ops, one pass over memory:
//
//   s = x (+ bias) (+ residual), then the activation (ACT)
//   pre_norm = s                            (STORE_PRE_NORM: pre-LN models)
//   y = LayerNorm(s) | RMSNorm(s) | s       (NORM 1 | 2 | 0)
//
// A block of THREADS threads owns ROWS rows of ROW_N elements (ROW_N is a
// compile-time constant: one kernel per hidden size), kTPR = THREADS / ROWS
// threads a row: a sub-warp, one warp or several warps per row. Each thread
// loads its chunks of VEC elements (16-byte loads at VEC = 8), chunk c of
// the row going to thread c % kTPR, and keeps the sum in fp32 registers.
// The statistics are two-pass from those registers (mean, then the sum of
// squared deviations: no cancellation as with E[x^2] - mean^2), reduced by
// shuffles within the row's threads and, past one warp, through a few
// floats of shared memory. Nothing is read twice from memory.
//
// X_F32, RESIDUAL_F32, PRE_NORM_F32 and Y_F32 keep x, the residual, the stored pre-norm
// value and y in fp32 (a residual stream beside a model in f16 or bf16); bias, gamma and beta
// stay in the model's dtype.
//
// Registers, not shared memory, hold the rows: templates.c's model
// (ROWS x ROW_N fp32) is an upper bound this kernel stays far below. A
// thread holds at most STOF_MI_MAX_PER_THREAD elements (static_assert; the
// host rejects such settings first).
#include "common.cuh"
#include "attention_common.cuh"
#include "gemm_abi.cuh"

#ifndef STOF_DTYPE
#define STOF_DTYPE 1
#endif
#ifndef ROWS
#define ROWS 4
#endif
#ifndef THREADS
#define THREADS 128
#endif
#ifndef VEC
#define VEC 8
#endif
#ifndef ROW_N
#define ROW_N 768
#endif
#ifndef HAS_BIAS
#define HAS_BIAS 0
#endif
#ifndef HAS_RESIDUAL
#define HAS_RESIDUAL 0
#endif
#ifndef ACT
#define ACT 0
#endif
#ifndef NORM
#define NORM 0
#endif
#ifndef STORE_PRE_NORM
#define STORE_PRE_NORM 0
#endif
#ifndef X_F32
#define X_F32 0
#endif
#ifndef RESIDUAL_F32
#define RESIDUAL_F32 0
#endif
#ifndef PRE_NORM_F32
#define PRE_NORM_F32 0
#endif
#ifndef Y_F32
#define Y_F32 0
#endif

using elem_t = typename stof::dtype_of<STOF_DTYPE>::type;
// each tensor's element: fp32 where the build says so, else the model's dtype
template <int F32> struct stored { using type = elem_t; };
template <> struct stored<1> { using type = float; };
using x_t = typename stored<X_F32>::type;
using res_t = typename stored<RESIDUAL_F32>::type;
using pre_t = typename stored<PRE_NORM_F32>::type;
using y_t = typename stored<Y_F32>::type;

constexpr int kTPR = THREADS / ROWS;                    // threads per row
constexpr int kRowChunks = ROW_N / VEC;                 // VEC-element chunks per row
constexpr int kPer = (kRowChunks + kTPR - 1) / kTPR;    // chunks per thread
constexpr int kWarpsPerRow = kTPR > 32 ? kTPR / 32 : 1;

static_assert(THREADS % 32 == 0 && THREADS <= 1024, "THREADS: whole warps, at most 1024");
static_assert(ROWS >= 1 && THREADS % ROWS == 0 && (kTPR & (kTPR - 1)) == 0,
              "THREADS / ROWS must be a power of two");
static_assert(VEC == 1 || VEC == 2 || VEC == 4 || VEC == 8, "VEC is 1, 2, 4 or 8");
static_assert(ROW_N % VEC == 0, "VEC must divide ROW_N");
static_assert(kPer * VEC <= STOF_MI_MAX_PER_THREAD, "too many elements a thread: more THREADS");
static_assert(!STORE_PRE_NORM || NORM != 0, "STORE_PRE_NORM needs a norm");

// VEC elements as one load or store of VEC * 2 bytes.
template <int V> struct raw_vec;
template <> struct raw_vec<2> { using type = unsigned; };
template <> struct raw_vec<4> { using type = uint2; };
template <> struct raw_vec<8> { using type = uint4; };

// (Templates, so that the branch not taken is never instantiated.)
template <int V> __device__ __forceinline__ void load_vec(const elem_t *p, float (&f)[V]) {
    if constexpr (V == 1) {
        f[0] = stof::to_float(*p);
    } else {
        using R = typename raw_vec<V>::type;
        R r = *reinterpret_cast<const R *>(p);
        const unsigned *w = reinterpret_cast<const unsigned *>(&r);
#pragma unroll
        for (int i = 0; i < V / 2; ++i) {
            const float2 t = stof::attn::unpack2<elem_t>(w[i]);
            f[2 * i] = t.x;
            f[2 * i + 1] = t.y;
        }
    }
}

// fp32: 16-byte loads of four where VEC allows.
template <int V> __device__ __forceinline__ void load_vec(const float *p, float (&f)[V]) {
    if constexpr (V % 4 == 0) {
#pragma unroll
        for (int i = 0; i < V / 4; ++i) {
            const float4 t = reinterpret_cast<const float4 *>(p)[i];
            f[4 * i] = t.x;
            f[4 * i + 1] = t.y;
            f[4 * i + 2] = t.z;
            f[4 * i + 3] = t.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < V; ++i)
            f[i] = p[i];
    }
}

template <int V> __device__ __forceinline__ void store_vec(float *p, const float (&f)[V]) {
    if constexpr (V % 4 == 0) {
#pragma unroll
        for (int i = 0; i < V / 4; ++i)
            reinterpret_cast<float4 *>(p)[i] =
                make_float4(f[4 * i], f[4 * i + 1], f[4 * i + 2], f[4 * i + 3]);
    } else {
#pragma unroll
        for (int i = 0; i < V; ++i)
            p[i] = f[i];
    }
}

template <int V> __device__ __forceinline__ void store_vec(elem_t *p, const float (&f)[V]) {
    if constexpr (V == 1) {
        *p = stof::from_float<elem_t>(f[0]);
    } else {
        using R = typename raw_vec<V>::type;
        R r;
        unsigned *w = reinterpret_cast<unsigned *>(&r);
#pragma unroll
        for (int i = 0; i < V / 2; ++i)
            w[i] = stof::attn::pack2<elem_t>(f[2 * i], f[2 * i + 1]);
        *reinterpret_cast<R *>(p) = r;
    }
}

// The sum of v over the kTPR threads of this thread's row, in every one of
// them. Every thread of the block calls it (rows past the end with zeros):
// the shuffles are full-warp and the barriers block-wide. pass selects a
// shared buffer so that consecutive reductions need no barrier between them.
__device__ __forceinline__ float row_sum(float v, float (*red)[ROWS][kWarpsPerRow], int pass) {
#pragma unroll
    for (int o = (kTPR < 32 ? kTPR : 32) / 2; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if constexpr (kTPR > 32) {
        const int r = threadIdx.x / kTPR, w = (threadIdx.x % kTPR) / 32;
        if ((threadIdx.x & 31) == 0)
            red[pass][r][w] = v;
        __syncthreads();
        v = 0.0f;
#pragma unroll
        for (int i = 0; i < kWarpsPerRow; ++i)
            v += red[pass][r][i];
    }
    return v;
}

extern "C" __global__ void __launch_bounds__(THREADS) stof_mi_chain(const stof_mi_args a) {
    stof::grid_dependency_begin();  // before any read (common.cuh)
    static_assert(sizeof(stof_mi_args) == STOF_MI_ARGS_BYTES, "ABI mismatch");
#if NORM != STOF_NORM_NONE
    __shared__ float red[2][ROWS][kWarpsPerRow];
#endif

    const long long row = (long long)blockIdx.x * ROWS + threadIdx.x / kTPR;
    const int part = threadIdx.x % kTPR;
    const bool active = row < a.rows;

    // s = act(x + bias + residual), in registers
    float v[kPer][VEC];
    const x_t *x = static_cast<const x_t *>(a.x) + row * a.x_row_stride;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        const int col = (part + i * kTPR) * VEC;
        const bool ok = active && (kRowChunks % kTPR == 0 || col < ROW_N);
#pragma unroll
        for (int e = 0; e < VEC; ++e)
            v[i][e] = 0.0f;
        if (!ok)
            continue;
        load_vec(x + col, v[i]);
#if HAS_BIAS
        float b[VEC];
        load_vec(static_cast<const elem_t *>(a.bias) + col, b);
#pragma unroll
        for (int e = 0; e < VEC; ++e)
            v[i][e] += b[e];
#endif
#if HAS_RESIDUAL
        float r[VEC];
        load_vec(static_cast<const res_t *>(a.residual) + row * a.r_row_stride + col, r);
#pragma unroll
        for (int e = 0; e < VEC; ++e)
            v[i][e] += r[e];
#endif
#pragma unroll
        for (int e = 0; e < VEC; ++e)
            v[i][e] = stof_activate<ACT>(v[i][e]);
#if STORE_PRE_NORM
        store_vec(static_cast<pre_t *>(a.pre_norm) + row * a.p_row_stride + col, v[i]);
#endif
    }

    // statistics: elements outside the row hold 0 and stay out of the sums
#if NORM == STOF_NORM_LAYERNORM
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i)
#pragma unroll
        for (int e = 0; e < VEC; ++e)
            sum += v[i][e];
    const float mean = row_sum(sum, red, 0) * (1.0f / ROW_N);
    float sq = 0.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        const int col = (part + i * kTPR) * VEC;
        if (kRowChunks % kTPR == 0 || col < ROW_N)
#pragma unroll
            for (int e = 0; e < VEC; ++e)
                sq += (v[i][e] - mean) * (v[i][e] - mean);
    }
    const float rstd = rsqrtf(row_sum(sq, red, 1) * (1.0f / ROW_N) + a.eps);
#elif NORM == STOF_NORM_RMSNORM
    float sq = 0.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i)
#pragma unroll
        for (int e = 0; e < VEC; ++e)
            sq += v[i][e] * v[i][e];
    const float rstd = rsqrtf(row_sum(sq, red, 0) * (1.0f / ROW_N) + a.eps);
#endif

    if (!active)
        return;
    y_t *y = static_cast<y_t *>(a.y) + row * a.y_row_stride;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        const int col = (part + i * kTPR) * VEC;
        if (kRowChunks % kTPR != 0 && col >= ROW_N)
            continue;
#if NORM != STOF_NORM_NONE
        float gm[VEC];
        load_vec(static_cast<const elem_t *>(a.gamma) + col, gm);
#if NORM == STOF_NORM_LAYERNORM
        float bt[VEC];
        load_vec(static_cast<const elem_t *>(a.beta) + col, bt);
#pragma unroll
        for (int e = 0; e < VEC; ++e)
            v[i][e] = (v[i][e] - mean) * rstd * gm[e] + bt[e];
#else
#pragma unroll
        for (int e = 0; e < VEC; ++e)
            v[i][e] = v[i][e] * rstd * gm[e];
#endif
#endif
        store_vec(y + col, v[i]);
    }
}
