// The K/V pipeline step of the block-wise attention kernel: the wait and
// barrier at the top of an iteration, the refill of the freed stage, the
// load list's next entries. (After the loads and scores parts.)
// Part of attention_block.cu, which includes it after the parts it names;
// it uses that kernel's build constants (attention_block_config.cuh).
#ifndef STOF_KERNELS_ATTENTION_BLOCK_PIPELINE_CUH
#define STOF_KERNELS_ATTENTION_BLOCK_PIPELINE_CUH

// ---- the pipeline ------------------------------------------------------------------

// The warp's Q fragments for every k step, kept in registers (kKeepQ).
__device__ __forceinline__ void load_q_frags(unsigned (&qf)[kMT][kKD][4], const elem_t *sQ,
                                             const warp_pos &w) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int kd = 0; kd < kKD; ++kd) load_q_frag(qf[mt][kd], sQ, w, mt, kd);
}

// The top of every iteration: this block's K, V (and Q) have landed and are
// published, and every warp is done with the stage refilled here (see the
// top of the file); the columns of the block after the refilled one are
// read one iteration early, so that no dependent global load sits between
// the barrier and the cp.async issue. Returns this block's load-list group.
// The first iteration also loads the warp's Q fragments (kKeepQ).
__device__ __forceinline__ key_group pipeline_step(const stof_attn_args &a, elem_t *sK,
                                                   elem_t *sV, const elem_t *k, const elem_t *v,
                                                   int it, int start, int end, int stage,
                                                   key_cols &next, const elem_t *sQ,
                                                   const warp_pos &w, unsigned (&qf)[kMT][kKD][4],
                                                   const kv_thread &kt) {
    cp_async_wait<kAhead - 1>();
#if WGMMA
    stof::wg::fence_proxy_async();  // cp.async wrote them; wgmma reads them
#endif
    __syncthreads();
    if (kKeepQ && it == start) load_q_frags(qf, sQ, w);
    const int refill = (stage + kAhead) % STAGES;
    if (it + kAhead < end) load_kv_async(sK, sV, refill, k, v, a, next, kt);
    cp_async_commit();
    next = load_cols(a, it + kAhead + 1, end);
    return load_group(a, it, end);
}

#if TMA
// The same with the copy engine: the barrier at the top now only says that
// every warp is done with the stage refilled here (and, the first time,
// publishes Q); the block's own K and V are waited for on its stage's
// barrier after the refill is issued. phases holds each stage's parity.
__device__ __forceinline__ key_group pipeline_step_tma(const stof_attn_args &a, unsigned sk,
                                                       unsigned sv, int it, int start, int end,
                                                       int stage, key_cols &next,
                                                       const elem_t *sQ, const warp_pos &w,
                                                       unsigned (&qf)[kMT][kKD][4], unsigned bar0,
                                                       unsigned &phases, int h, int b,
                                                       int first) {
    if (it == start) {
        cp_async_wait<0>();  // Q, this thread's copies
#if WGMMA
        stof::wg::fence_proxy_async();  // cp.async wrote Q; wgmma reads it
#endif
    }
    __syncthreads();
    if (kKeepQ && it == start) load_q_frags(qf, sQ, w);
    const int refill = (stage + kAhead) % STAGES;
    if (threadIdx.x == 0 && it + kAhead < end)
        load_kv_tma(sk, sv, refill, a, next, h, b, first, bar0 + 8 * refill);
    next = load_cols(a, it + kAhead + 1, end);
    const key_group cur = load_group(a, it, end);
    stof::tma::wait(bar0 + 8 * stage, (phases >> stage) & 1u);
    phases ^= 1u << stage;
    return cur;
}
#endif

#if WGMMA
// S into registers of its own (a real copy, not one the compiler may fold
// away): the softmax then never writes a wgmma accumulator.
__device__ __forceinline__ void to_scores(const float (&s)[kMT][kNT][4], float (&p)[kMT][kNT][4]) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) asm volatile("mov.b32 %0, %1;" : "=f"(p[mt][nt][e]) : "f"(s[mt][nt][e]));
}
#endif

#endif  // STOF_KERNELS_ATTENTION_BLOCK_PIPELINE_CUH
