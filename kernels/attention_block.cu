// Block-wise masked multi-head attention (paper §4.2, the BSR kernel).
//
// One thread block computes BLOCK_M query rows of one (batch, head); grid
// (ceil(q_len / BLOCK_M), heads, batch). Its NUM_WARPS warps each own
// BLOCK_M / NUM_WARPS rows (whole 16-row mma tiles) and never talk to each
// other except through the shared K/V tiles. The block walks the key blocks
// its block row must load (the BSR load list: any columns, in any order,
// full and partial mixed) with K and V in a ring of STAGES shared-memory
// stages filled by cp.async, STAGES - 1 blocks ahead of the math:
//
//   for each loaded key block:
//       prefetch K, V of the block STAGES - 1 ahead (cp.async, the stage freed last)
//       S = Q K^T                                  (mma.sync, fp32)
//       S = mask(S): partial blocks by bitmap, columns past k_len (full blocks:
//           nothing), and with a T5 bias scale and bias
//       online softmax: m, l per row; O *= exp2(c (m_old - m_new)); P = exp2(c (S - m))
//       O += P V                                   (mma.sync, P in the dtype)
//   O /= l, rows with no allowed key write zeros
//
// With -DPADDING=1 an attention_mask (right padding) gives each sequence
// its length at run time: keys past it are masked like keys past k_len, key
// blocks wholly past it are not walked, its padded rows write zeros (or, in
// the ragged layout of attention_abi.cuh, nothing), and tiles of padded rows
// do no work.
//
// Shared memory: Q [BLOCK_M][HEAD_DIM + 8], K and V [STAGES][BLOCK_N][HEAD_DIM + 8]
// (rows padded by 16 bytes so ldmatrix's eight row addresses fall in
// different banks); the Q tile is reused to stage O for 16-byte stores.
// The host sizes it (mha_exec_config_smem):
//   (BLOCK_M + 2 STAGES BLOCK_N) (HEAD_DIM + 8) element bytes,
// and 4 RELPOS_MID bytes more for the T5 bias table (relpos_far).
//
// The pipeline. Block i of the row (i = 0, 1, ...) lives in stage
// i % STAGES and travels in cp.async group i: the prologue commits groups
// 0 .. STAGES-2 (Q rides with block 0), and iteration i commits exactly one
// group (block i + STAGES - 1, empty past the end), so before iteration i's
// wait STAGES - 1 + i groups are committed and cp.async.wait_group
// STAGES - 2 leaves only groups i+1 .. in flight: block i has landed (this
// thread's copies; the __syncthreads that follows publishes everyone's).
// The stage refilled in iteration i is (i + STAGES - 1) % STAGES =
// (i - 1) % STAGES, the one block i - 1 was read from: every warp finished
// iteration i - 1 before it reached iteration i's barrier, and the refill is
// issued after that barrier, so no warp can still be reading it. Stages
// i .. i + STAGES - 2 are never written in iteration i. That is why one
// barrier per block suffices at any depth; STAGES = 2 is plain double
// buffering (wait_group 0).
//
// Split block rows (-DSPLIT=1; see attention_abi.cuh). The grid's x walks
// the host's work list instead of the block rows: an item is a block row's
// whole load list (stored as above) or a slice of it, whose unnormalized O
// and per-row (m, l) go to the workspace (store_partial); the second kernel
// of this file, stof_attention_combine, merges the slices of each split row
// (log-sum-exp) and writes O. A SPLIT=0 build has neither: it is the plain
// kernel, launched over block rows.
//
// The Hopper build (-DWGMMA=1, compiled for sm_90a; see wgmma.cuh): each
// warpgroup of four warps computes Q K^T and P V for its 64 rows with
// warpgroup MMAs, Q, K and V in unpadded tiles (tile_off: 128-byte swizzled
// for head sizes that are multiples of 64, core matrices otherwise), P
// from registers. Masking, the softmax, the pipeline and the split rows are
// the code above, since the accumulators share mma.sync's fragment layout.
// One block's P V runs while the next block's softmax does (see the loop);
// the two warpgroups of a 128-row tile do not take turns (no ping-pong).
// On an H200, dense 16x12x2048 at 128x64 with 8 warps: 368 TFLOP/s (250
// with core-matrix tiles, whose half-row copies doubled the L2 requests),
// against 267 for mma.sync at 128x64 with 4 warps; so the host picks this
// build by default on sm_90 where the sizes allow it.
//
// K and V by the tensor memory accelerator (-DTMA=1, sm_90+, head sizes
// that are multiples of 64; in the wgmma build 64, whose swizzled tiles
// are the copies' layout; see tma.cuh). Thread 0 issues each stage's K and
// V as tensor copies (the host's maps, in the argument block) that
// complete on the stage's mbarrier; Q still comes by cp.async (and in the
// wgmma build crosses a proxy fence once). The stages hold [HEAD_DIM / 64][rows][64] in the 128-byte
// swizzle and start 1024-byte aligned, K and V first, then Q, the relpos
// table and the barriers. The barrier at the top of an iteration then only
// frees the stage to refill; the block's own data is waited for on its
// stage's mbarrier. With the copies off the warps' instruction streams
// (an iteration of a 32x32 tile with 2 warps issued eight cp.async a thread
// and their address arithmetic) and the ldmatrix addresses reduced to one
// XOR a k step (kv_lanes), on an H200 BigBird 16x12x4096 at 32x32 with 2
// warps went from 0.80 ms (158 useful TFLOP/s) to 0.62 (206), and dense
// 32x32 tiles from 186 to 254-261 TFLOP/s.
//
// One key block an iteration. Computing several entries of the load list
// as one wider tile (-DGATHER, removed) was meant for masks finer than a
// good tile (BigBird's 32-wide random blocks), but on an H200 it did not
// pay (BigBird 16x12x4096 at 32x32: 0.83 ms by 2, 1.25 ms by 4, 0.81
// plain; dense 32-row tiles ran at 184 TFLOP/s with 32 or 64 keys an
// iteration): per-block work is not what bounds a 32-row tile.
//
// The parts, in the order the loop body uses them: attention_block_config
// (switches, constants), _loads (tiles, load list, K/V copies), _scores
// (S = Q K^T), _mask (mask_and_scale, the warp's view), _softmax
// (online_softmax), _pv (O += P V), _store (O, split partials), _pipeline
// (the top of an iteration), _combine (the split rows' second kernel).
#include "attention_block_config.cuh"
#include "attention_block_loads.cuh"
#include "attention_block_scores.cuh"
#include "attention_block_mask.cuh"
#include "attention_block_softmax.cuh"
#include "attention_block_pv.cuh"
#include "attention_block_store.cuh"
#include "attention_block_pipeline.cuh"

// ---- the kernel ------------------------------------------------------------------------

// No minimum of resident CTAs in the launch bounds: with one, ptxas gave
// the wgmma build at 128x64 153 registers instead of 127 (one CTA an SM
// fewer) and the TMA build at 32x32 124 instead of 96; on an H200 BigBird
// 16x12x4096 ran 0.627 ms at 124, 0.617 at 96, 0.653 when forced to 9 or
// 10 CTAs an SM.
extern "C" __global__ void __launch_bounds__(kThreads)
stof_attention_block(const __grid_constant__ stof_attn_args a) {
    stof::grid_dependency_begin();  // before any read (common.cuh)
    extern __shared__ __align__(16) unsigned char smem_raw[];
#if TMA
    // K and V stages first, on a 1024-byte boundary (the swizzle's atoms),
    // then Q, the relpos table and the stages' barriers. The host's size
    // has the 1008 bytes this can skip.
    elem_t *sK = reinterpret_cast<elem_t *>(
        smem_raw + ((1024 - (unsigned)__cvta_generic_to_shared(smem_raw)) & 1023));
    elem_t *sV = sK + STAGES * kStageElems;
    elem_t *sQ = sV + STAGES * kStageElems;    // [BLOCK_M][kPitch]
    float *s_relpos = reinterpret_cast<float *>(sQ + BLOCK_M * kPitch);
    // Shared addresses, computed once (asm: not rebuilt from the window's
    // base in every iteration): K, V and the [STAGES] 8-byte barriers.
    unsigned sk = smem_addr(sK), sv = smem_addr(sV), bar0 = smem_addr(s_relpos + RELPOS_MID);
    asm volatile("mov.b32 %0, %0;" : "+r"(sk));
    asm volatile("mov.b32 %0, %0;" : "+r"(sv));
    asm volatile("mov.b32 %0, %0;" : "+r"(bar0));
#if !WGMMA  // (wgmma reads the stages through descriptors)
    const kv_lanes lanes = make_kv_lanes(threadIdx.x % 32);
    const unsigned sk_lane = sk + lanes.k, sv_lane = sv + lanes.v;
#endif
    unsigned phases = 0;
#else
    // Swizzled tiles start on a 1024-byte boundary: the host's size keeps
    // 8 padding elements a row that the wgmma build does not use, which is
    // more than the 1008 bytes this can skip.
    elem_t *sQ = reinterpret_cast<elem_t *>(
        kSwizzle ? smem_raw + ((1024 - (unsigned)__cvta_generic_to_shared(smem_raw)) & 1023)
                 : smem_raw);
    elem_t *sK = sQ + BLOCK_M * kPitch;        // [STAGES][BLOCK_N][kPitch]
    elem_t *sV = sK + STAGES * kStageElems;    // [STAGES][BLOCK_N][kPitch]
    float *s_relpos = reinterpret_cast<float *>(sV + STAGES * kStageElems);  // (relpos_far)
#endif

    const int h = blockIdx.y, b = blockIdx.z;
#if SPLIT
    // This CTA's work item (past the batch's count: nothing to do).
    const int wb = a.fmt_batch == 1 ? 0 : b;
    const int first_item = __ldg(a.work_ptr + wb);
    if ((int)blockIdx.x >= __ldg(a.work_ptr + wb + 1) - first_item) return;
    const int4 item = __ldg(reinterpret_cast<const int4 *>(a.work) + first_item + blockIdx.x);
    const int bm = item.x, start = item.y, end_listed = item.z, slot = item.w;
#else
    const int bm = blockIdx.x;
#endif
    const int row_base = bm * BLOCK_M;
    warp_pos w;
    w.warp = threadIdx.x / 32;
    w.lane = threadIdx.x % 32;
    w.row0 = w.warp * kWarpRows;
    w.g = w.lane / 4;
    w.t = w.lane % 4;

#if !SPLIT
    // This block row's key blocks, in this batch's part of the format.
    const int n_block_rows = (a.q_len + BLOCK_M - 1) / BLOCK_M;
    const long long ptr = (a.fmt_batch == 1 ? 0LL : (long long)b * (n_block_rows + 1)) + bm;
    const int start = __ldg(a.load_row_ptr + ptr);
    const int end_listed = __ldg(a.load_row_ptr + ptr + 1);
#endif
#if PADDING
    // The sequence: keys past its length are masked and not loaded (kv_len), a
    // tile of padded rows does no work at all, and its padded rows write
    // zeros (the padded layout) or nothing (the ragged one, where the next
    // sequence's rows follow; `first` is its first row there).
    const sequence_rows sq_rows = sequence_of(a.seq_start, a.pad_mask, b, a.q_len);
    const int kv_len = sq_rows.len, first = sq_rows.first;
    const int end = row_base < kv_len ? entries_below(a, start, end_listed, kv_len) : start;
    const int live_rows = kv_len - row_base;
    const int q_rows = min(a.q_len, kv_len) - row_base;  // Q rows loaded
    const int out_rows = a.seq_start ? live_rows : a.q_len - row_base;
#else
    const int kv_len = a.k_len, end = end_listed, first = 0;
    constexpr int live_rows = BLOCK_M;
    const int q_rows = a.q_len - row_base, out_rows = q_rows;
#endif

    const elem_t *q = static_cast<const elem_t *>(a.q) + b * a.q_batch_stride +
                      (first + row_base) * a.q_row_stride + h * HEAD_DIM;
#if !TMA  // (the TMA build addresses K and V through its tensor maps)
    const elem_t *k = static_cast<const elem_t *>(a.k) + b * a.k_batch_stride +
                      first * a.k_row_stride + (h / a.kv_group) * HEAD_DIM;
    const elem_t *v = static_cast<const elem_t *>(a.v) + b * a.v_batch_stride +
                      first * a.v_row_stride + (h / a.kv_group) * HEAD_DIM;
#endif
    elem_t *out = static_cast<elem_t *>(a.o) + b * a.o_batch_stride +
                  (first + row_base) * a.o_row_stride + h * HEAD_DIM;
#if TMA
    // Prologue: the barriers, Q by cp.async, blocks 0 .. kAhead-1 by copies.
    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) stof::tma::barrier_init(bar0 + 8 * s);
        stof::tma::fence_barrier_init();
    }
    __syncthreads();
    if (start < end) load_tile_async<BLOCK_M>(sQ, q, (int)a.q_row_stride, q_rows);
    cp_async_commit();
    if (threadIdx.x == 0) {
#pragma unroll
        for (int j = 0; j < kAhead; ++j)
            if (start + j < end)
                load_kv_tma(sk, sv, j, a, load_cols(a, start + j, end), h, b, first, bar0 + 8 * j);
    }
#else
    const kv_thread kt = make_kv_thread(a, k, v, sK, sV, kv_len);

    // Prologue: groups 0 .. kAhead-1 hold blocks 0 .. kAhead-1 (Q with block 0).
    if (start < end) load_tile_async<BLOCK_M>(sQ, q, (int)a.q_row_stride, q_rows);
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
        if (start + j < end)
            load_kv_async(sK, sV, j, k, v, a, load_cols(a, start + j, end), kt);
        cp_async_commit();
    }
#endif
    // The columns of the next block to prefetch (see pipeline_step). (A ring
    // of STAGES entries cost registers and spilled at 64x32 D=128; the
    // current block's entry is an L1 hit anyway.)
    key_cols next = load_cols(a, start + kAhead, end);

    float o[kMT][kDT][4], m[kMT][2], l[kMT][2], nmc[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.0f;
        m[mt][0] = m[mt][1] = STOF_NEG_INF;
        l[mt][0] = l[mt][1] = 0.0f;
        nmc[mt][0] = nmc[mt][1] = 0.0f;
    }
    unsigned qf[kMT][kKD][4];

    const bool prescale = prescaled(a);
    const relpos_far far =
        load_relpos_far(a, h, s_relpos);
    const float c = prescale ? 1.0f : a.scale_log2;  // the scale the softmax still applies
    int stage = 0;  // (it - start) % STAGES: where this block's K, V are
#if WGMMA
    // Block j's S = Q K^T and block j-1's O += P V go out together; the
    // softmax of block j runs while the tensor cores do that P V, and O is
    // rescaled once it has landed. The first block (no P V before it) is
    // peeled off, so that every wait in the loop is unconditional: ptxas
    // serializes the products if a path could leave one in flight while O
    // is written, and it does the same if the softmax writes the registers
    // S was computed in (hence the copy, to_scores).
    if (start < end) {
        unsigned pf[kKN][4];  // the previous block's P, as A fragments of its P V
        int prev_stage = stage;
        {
#if TMA
            key_group cur = pipeline_step_tma(a, sk, sv, start, start, end, stage, next, sQ, w, qf,
                                              bar0, phases, h, b, first);
#else
            key_group cur = pipeline_step(a, sK, sV, k, v, start, start, end, stage, next, sQ, w, qf, kt);
#endif
            float s[kMT][kNT][4];
            stof::wg::fence();
            issue_scores(s, sQ, sK + stage * kStageElems, w);
            stof::wg::wait<0>();
            keep_s(s);
            mask_and_scale(s, a, w, row_base, cur, h, prescale, far, kv_len);
            float alpha[kMT][2];  // 0: O is still zero
            softmax_step(s, m, l, nmc, alpha, c);
            pack_p(s, pf);
            stage = 1;  // STAGES >= 3
        }
        for (int it = start + 1; it < end; ++it) {
#if TMA
            key_group cur = pipeline_step_tma(a, sk, sv, it, start, end, stage, next, sQ, w, qf,
                                              bar0, phases, h, b, first);
#else
            key_group cur = pipeline_step(a, sK, sV, k, v, it, start, end, stage, next, sQ, w, qf, kt);
#endif
            float s[kMT][kNT][4], p[kMT][kNT][4];
            stof::wg::fence();
            issue_scores(s, sQ, sK + stage * kStageElems, w);
            issue_pv(o, pf, sV + prev_stage * kStageElems);
            stof::wg::wait<1>();  // S has landed; P V may still run
            keep_s(s);
            to_scores(s, p);
            mask_and_scale(p, a, w, row_base, cur, h, prescale, far, kv_len);
            float alpha[kMT][2];
            const bool moved = softmax_step(p, m, l, nmc, alpha, c);
            stof::wg::wait<0>();
            keep_pv(o, pf);
            if (moved) rescale_o(o, alpha);
            pack_p(p, pf);
            prev_stage = stage;
            stage = stage == STAGES - 1 ? 0 : stage + 1;
        }
        stof::wg::fence();
        issue_pv(o, pf, sV + prev_stage * kStageElems);
        stof::wg::wait<0>();
        keep_pv(o, pf);
    }
#else
    for (int it = start; it < end; ++it) {
#if TMA
        key_group cur = pipeline_step_tma(a, sk, sv, it, start, end, stage, next, sQ, w, qf, bar0,
                                          phases, h, b, first);
#else
        key_group cur = pipeline_step(a, sK, sV, k, v, it, start, end, stage, next, sQ, w, qf, kt);
#endif
        // (with padding, a block of keys past the sequence is skipped too)
        if (warp_group_view(a, w, cur) && (!PADDING || cur.col * BLOCK_N < kv_len)) {
            float s[kMT][kNT][4];
#if TMA
            const unsigned stage_off = stage * (kStageElems * (unsigned)sizeof(elem_t));
            const kv_view kk = {sK, sk_lane + stage_off}, vv = {sV, sv_lane + stage_off};
#else
            const kv_view kk = {sK + stage * kStageElems, 0}, vv = {sV + stage * kStageElems, 0};
#endif
            compute_scores(s, qf, sQ, kk, w);
            mask_and_scale(s, a, w, row_base, cur, h, prescale, far, kv_len);
            online_softmax(s, m, l, nmc, o, c);
            compute_pv(o, s, vv, w);
        }
        stage = stage == STAGES - 1 ? 0 : stage + 1;
    }
#endif
    // Only empty groups can still be pending (every real block was waited
    // for); reading sQ (Q fragments) and writing it (O staging) touch the
    // warp's own rows only.
    cp_async_wait<0>();
#if SPLIT
    if (slot >= 0) {
        const long long u = partial_unit(a, slot, b, h);
        store_partial(o, m, l, a.partial_o + u * (BLOCK_M * HEAD_DIM),
                      a.partial_ml + u * (2 * BLOCK_M), w, c);
        return;
    }
#endif
#if LSE
    store_lse(m, l, a.lse + ((long long)b * a.heads + h) * a.q_len + row_base, a.q_len - row_base,
              w, c);
#endif
    __syncwarp();
    store_output(o, l, sQ, out, a.o_row_stride, out_rows, live_rows, w);
}
#include "attention_block_combine.cuh"
