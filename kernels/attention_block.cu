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
#include "attention_common.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef BLOCK_M
#define BLOCK_M 64
#endif
#ifndef BLOCK_N
#define BLOCK_N 64
#endif
#ifndef NUM_WARPS
#define NUM_WARPS 4
#endif
#ifndef STOF_DTYPE
#define STOF_DTYPE 1
#endif
#ifndef HAS_RELPOS
#define HAS_RELPOS 0
#endif
#ifndef STAGES
#define STAGES 2
#endif
#ifndef SPLIT
#define SPLIT 0
#endif
#ifndef WGMMA
#define WGMMA 0
#endif
#ifndef TMA
#define TMA 0
#endif
// Warps skip partial blocks their rows have no key in (warp_view). Off
// where it buys nothing (one warp: its rows are the block's) or cost more
// than it saved: at 32x32 with 2 warps the branch made ptxas spill and
// BigBird 16x12x4096 ran 6% slower (0.86 against 0.81 ms on an H200),
// while at 64x32 with 4 warps it ran 21% faster (0.96 against 1.21 ms).
#ifndef WARP_SKIP
#define WARP_SKIP (BLOCK_M >= 64 && NUM_WARPS > 1)
#endif
#if WGMMA
#include "wgmma.cuh"
#endif
#if TMA
#include "tma.cuh"
#endif

using elem_t = typename stof::dtype_of<STOF_DTYPE>::type;
using namespace stof::attn;

constexpr int kThreads = NUM_WARPS * 32;
constexpr int kWarpRows = BLOCK_M / NUM_WARPS;   // query rows per warp
constexpr int kMT = kWarpRows / 16;              // 16-row mma tiles per warp
constexpr int kNT = BLOCK_N / 8;                 // 8-column tiles of S
constexpr int kKD = HEAD_DIM / 16;               // k steps of Q K^T
constexpr int kDT = HEAD_DIM / 8;                // 8-column tiles of O (= 16-byte chunks of a row)
constexpr int kKN = BLOCK_N / 16;                // k steps of P V
// Shared tiles: rows padded by 8 elements for ldmatrix (mma.sync build),
// or unpadded core matrices for wgmma (see tile_off).
constexpr int kPitch = WGMMA ? HEAD_DIM : HEAD_DIM + 8;
constexpr int kMaskWords = (BLOCK_N + 31) / 32;  // uint32 words per bitmap row
// The wgmma build's tiles use the 128-byte swizzle where rows are whole
// 64-element (128-byte) pieces: a warp then copies whole rows of global
// memory (one L2 request per 128-byte line; the core-matrix layout below
// took two per line, half lines each, and the L2 ran at 77% of its
// request rate on dense 128x64 tiles) and the copies land without bank
// conflicts. Other head sizes (32, 80) keep the unswizzled core matrices.
constexpr bool kSwizzle = WGMMA && HEAD_DIM % 64 == 0;

// Q fragments stay in registers unless that would push the accumulators
// out of them (many rows per warp with a wide head): then they are read
// from shared memory again at every key block. Per thread, O takes
// kMT * HEAD_DIM / 2 registers, S kMT * BLOCK_N / 2 and Q kMT * HEAD_DIM / 4;
// ptxas (sm_90) keeps everything in registers up to about 128 of those.
#ifndef KEEP_Q_REGS
#define KEEP_Q_REGS (kMT * (HEAD_DIM / 2 + BLOCK_N / 2 + HEAD_DIM / 4) <= 128)
#endif
constexpr bool kKeepQ = KEEP_Q_REGS && !WGMMA;  // wgmma reads Q from shared memory

static_assert(STOF_DTYPE == 1 || STOF_DTYPE == 2, "attention runs in fp16 or bf16");
static_assert(HEAD_DIM % 16 == 0 && HEAD_DIM <= 256, "HEAD_DIM: a multiple of 16 up to 256");
static_assert(BLOCK_N % 16 == 0 && BLOCK_N <= 256, "BLOCK_N: a multiple of 16 up to 256");
static_assert(BLOCK_M % NUM_WARPS == 0 && kWarpRows % 16 == 0,
              "each warp owns whole 16-row tiles: BLOCK_M / NUM_WARPS must be a multiple of 16");
static_assert(STAGES >= 2 && STAGES <= 4, "STAGES: 2, 3 or 4 K/V stages");
static_assert(SPLIT == 0 || SPLIT == 1, "SPLIT: 0 (grid over block rows) or 1 (work list)");
static_assert(!WGMMA || (NUM_WARPS % 4 == 0 && kWarpRows == 16),
              "WGMMA: whole warpgroups, 16 rows a warp (BLOCK_M = 16 NUM_WARPS, a multiple of 64)");
static_assert(!TMA || (HEAD_DIM % 64 == 0 && sizeof(elem_t) == 2 && (!WGMMA || HEAD_DIM == 64)),
              "TMA: head sizes that are multiples of 64 (the wgmma build: 64, where its "
              "swizzled tiles are the copies' layout)");

// K and V stages: rows of kPitch elements, or with TMA the copy engine's
// layout, [HEAD_DIM / 64][BLOCK_N][64] in the 128-byte swizzle (kv_lanes).
constexpr int kKVPitch = TMA ? HEAD_DIM : kPitch;
constexpr int kStageElems = BLOCK_N * kKVPitch;  // one K (or V) stage
// Blocks loaded ahead of the one being computed: all stages but its own,
// and in the wgmma build but the previous block's too (its P V runs during
// this block's softmax, so its V stage is still being read).
constexpr int kAhead = WGMMA ? STAGES - 2 : STAGES - 1;
static_assert(kAhead >= 1, "the wgmma build pipelines at least 3 K/V stages");

// The per-warp view of the query tile.
struct warp_pos {
    int warp, lane;
    int row0;  // the warp's first row within the block tile
    int g, t;  // mma fragment coordinates: lane / 4, lane % 4
};

// ---- tile loads --------------------------------------------------------------------

// Element (r, c) of a [rows][HEAD_DIM] shared tile. The wgmma build keeps
// 8-row atoms (see wgmma.cuh): swizzled, atom (r / 8, c / 64) is 1024
// bytes of 8 rows x 64 elements in which the 16-byte chunk c / 8 % 8 of
// row r sits at chunk (c / 8 ^ r) % 8; unswizzled, core matrices (8 rows x
// 8 elements, 128 contiguous bytes). Tiles start 1024-byte aligned.
__device__ __forceinline__ int tile_off(int r, int c) {
    if (kSwizzle)
        return ((r >> 3) * (HEAD_DIM / 64) + (c >> 6)) * 512 + (r & 7) * 64 +
               ((((c >> 3) ^ r) & 7) << 3) + (c & 7);
    if (WGMMA)
        return ((r >> 3) * kDT + (c >> 3)) * 64 + (r & 7) * 8 + (c & 7);
    return r * kPitch + c;
}

// The ldmatrix addresses of the K and V loads in a TMA stage, at a cost of
// one XOR per k step. Piece c / 64 of a stage holds its BLOCK_N rows of 128
// bytes, whose 16-byte chunk c / 8 % 8 sits at chunk (c / 8 ^ key) % 8 (the
// 128-byte swizzle; stages start 1024-byte aligned), so ldmatrix's eight
// row addresses fall in different banks. A lane's chunk at k step 0 is its
// row's line plus chunk (b ^ row) % 8; step kd of a 64-column piece is chunk
// + 2 kd = chunk ^ 2 kd (the chunk's low bit is b), i.e. bits 5-6 of the
// address toggled, and with stages 1024-byte aligned the XOR commutes with
// adding the stage, whole 16-row groups (2048 bytes) and pieces. So each
// lane keeps one offset for K and one for V.
struct kv_lanes {
    unsigned k, v;  // bytes from a stage's start
};

__device__ __forceinline__ kv_lanes make_kv_lanes(int lane) {
    const int row = lane & 7;
    kv_lanes r;
    // K (B of Q K^T): keys row + 8 (lane / 16), columns 8 ((lane / 8) % 2) ..
    r.k = (row + (lane >> 4) * 8) * 128 + ((((lane >> 3) & 1) ^ row) << 4);
    // V (B of P V, transposed): keys row + 8 ((lane / 8) % 2), columns 8 (lane / 16) ..
    r.v = (row + ((lane >> 3) & 1) * 8) * 128 + (((lane >> 4) ^ row) << 4);
    return r;
}

// Shared address of k step kd (16 columns) in a stage at lane address base.
__device__ __forceinline__ unsigned kv_step(unsigned base, int kd) {
    return (base ^ ((kd & 3) << 5)) + (kd >> 2) * (BLOCK_N * 128);
}

// A K or V stage as the mma.sync loads see it: the tile (cp.async stages),
// or with TMA the stage's shared address plus this lane's offset (kv_lanes).
struct kv_view {
    const elem_t *tile;
    unsigned lane;
};

// The shared address of the B fragments (ldmatrix x4) of keys np*16 ..
// at k step kd of Q K^T: n tiles 2np and 2np+1, both k halves.
__device__ __forceinline__ unsigned k_frag(const kv_view &k, const warp_pos &w, int kd, int np) {
    if (TMA) return kv_step(k.lane, kd) + np * 2048;
    const int key = np * 16 + (w.lane & 7) + (w.lane >> 4) * 8;
    const int col = kd * 16 + ((w.lane >> 3) & 1) * 8;
    return smem_addr(k.tile + tile_off(key, col));
}

// The same for V rows (keys) kn*16 .. x columns dp*16 .. of P V, loaded
// transposed into the B fragments of O tiles 2dp and 2dp+1.
__device__ __forceinline__ unsigned v_frag(const kv_view &v, const warp_pos &w, int kn, int dp) {
    if (TMA) return kv_step(v.lane, dp) + kn * 2048;
    const int key = kn * 16 + (w.lane & 7) + ((w.lane >> 3) & 1) * 8;
    const int col = dp * 16 + (w.lane >> 4) * 8;
    return smem_addr(v.tile + tile_off(key, col));
}

// ROWS rows of HEAD_DIM elements from global (row pitch `stride`) into a
// shared tile, cooperatively by the whole block; rows >= valid_rows are
// zero-filled. Asynchronous: the caller commits and waits. A fixed,
// fully unrolled trip count: a generic strided loop cost more integer
// instructions per key block than the softmax does.
template <int ROWS>
__device__ __forceinline__ void load_tile_async(elem_t *smem, const elem_t *gmem, int stride,
                                                int valid_rows) {
    constexpr int kChunks = ROWS * kDT;  // 16-byte chunks
    constexpr int kIters = (kChunks + kThreads - 1) / kThreads;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
        const int idx = threadIdx.x + i * kThreads;
        if (kChunks % kThreads != 0 && idx >= kChunks) break;
        static_assert(!WGMMA || ROWS % 8 == 0, "wgmma tiles: whole 8-row groups");
        int r = idx / kDT, c = idx % kDT;  // consecutive threads along a row
        if (WGMMA && !kSwizzle) {
            // eight consecutive threads fill one core matrix (128 contiguous
            // bytes: no bank conflict), i.e. the chunk at idx * 8
            r = (idx / (8 * kDT)) * 8 + (idx & 7);
            c = (idx >> 3) % kDT;
        }
        const bool valid = r < valid_rows;
        // r * stride fits 32 bits (STOF_ATTN_MAX_ROW_STRIDE): one wide add a chunk
        const elem_t *src = valid ? gmem + (r * stride + c * 8) : gmem;
        cp_async_16(smem + tile_off(r, c * 8), src, valid);
    }
}

// ---- the load list ------------------------------------------------------------------

// Entry `it` of the BSR load list: its key block column and bitmap (-1: a
// full block). Past the end: column -1 (no keys), mask -1.
struct key_cols {
    int col;
};
struct key_group {
    int col, mask;
};

__device__ __forceinline__ key_cols load_cols(const stof_attn_args &a, int it, int end) {
    key_cols r;
    r.col = it < end ? __ldg(a.load_col_idx + it) : -1;
    return r;
}

__device__ __forceinline__ key_group load_group(const stof_attn_args &a, int it, int end) {
    key_group r;
    const bool in = it < end;
    r.col = in ? __ldg(a.load_col_idx + it) : -1;
    r.mask = in ? __ldg(a.load_mask_idx + it) : -1;
    return r;
}

// Keys of entry column `col` that exist (below k_len; none past the list's end).
__device__ __forceinline__ int keys_in(const stof_attn_args &a, int col) {
    return col >= 0 ? a.k_len - col * BLOCK_N : 0;
}

// A thread's share of the K and V copies where every pass of the block
// covers whole rows of a key block (kThreads a multiple of a row's chunks;
// a linear layout, or one swizzled by 8-row atoms the passes do not cut):
// it keeps its column and steps kRowStep rows a pass, so its shared
// addresses are fixed offsets from its first one and its global ones fixed
// offsets from the key block's first row. Both are computed once and kept
// in registers (make_kv_thread hides them from the compiler, which would
// otherwise rebuild them from the kernel's arguments in every iteration,
// 64-bit arithmetic included). In the sm_90 SASS of 32x32 tiles with 2
// warps (fast math, as NVRTC builds them) the copies of an iteration went
// from 102 instructions to 64.
constexpr int kRowStep = kThreads / kDT;
constexpr bool kRegularKV = kThreads % kDT == 0 && (BLOCK_N * kDT) % kThreads == 0 &&
                            !(WGMMA && !kSwizzle) && (!kSwizzle || kRowStep % 8 == 0);
constexpr int kKVPasses = kRegularKV ? BLOCK_N / kRowStep : 1;
struct kv_thread {
    const char *kb, *vb;  // this (batch, head)'s key 0 in K and V
    int k_blk, v_blk;     // bytes from one key block to the next
    int k_off[kKVPasses], v_off[kKVPasses];  // bytes from a key block's first row
    unsigned sk, sv;  // shared addresses of the first chunk in stage 0, entry 0
    int row0;         // the first chunk's row within a key block
};

// BLOCK_N * stride < 2^30 elements (STOF_ATTN_MAX_ROW_STRIDE): byte offsets fit an int.
__device__ __forceinline__ kv_thread make_kv_thread(const stof_attn_args &a, const elem_t *k,
                                                    const elem_t *v, const elem_t *sK,
                                                    const elem_t *sV) {
    kv_thread t;
    t.kb = reinterpret_cast<const char *>(k);
    t.vb = reinterpret_cast<const char *>(v);
    t.k_blk = BLOCK_N * (int)a.k_row_stride * (int)sizeof(elem_t);
    t.v_blk = BLOCK_N * (int)a.v_row_stride * (int)sizeof(elem_t);
    asm volatile("mov.b64 %0, %0;" : "+l"(t.kb));
    asm volatile("mov.b64 %0, %0;" : "+l"(t.vb));
    asm volatile("mov.b32 %0, %0;" : "+r"(t.k_blk));
    asm volatile("mov.b32 %0, %0;" : "+r"(t.v_blk));
    t.row0 = threadIdx.x / kDT;
    const int c = threadIdx.x % kDT;
#pragma unroll
    for (int i = 0; i < kKVPasses; ++i) {
        const int r = t.row0 + i * kRowStep;  // r * stride fits 32 bits (STOF_ATTN_MAX_ROW_STRIDE)
        t.k_off[i] = (r * (int)a.k_row_stride + c * 8) * (int)sizeof(elem_t);
        t.v_off[i] = (r * (int)a.v_row_stride + c * 8) * (int)sizeof(elem_t);
        asm volatile("mov.b32 %0, %0;" : "+r"(t.k_off[i]));
        asm volatile("mov.b32 %0, %0;" : "+r"(t.v_off[i]));
    }
    t.sk = smem_addr(sK + tile_off(t.row0, c * 8));
    t.sv = smem_addr(sV + tile_off(t.row0, c * 8));
    asm volatile("mov.b32 %0, %0;" : "+r"(t.sk));
    asm volatile("mov.b32 %0, %0;" : "+r"(t.sv));
    return t;
}

// Shared byte offset of pass i from pass 0 (regular K/V tiles).
__device__ __forceinline__ constexpr unsigned pass_off(int i) {
    return (kSwizzle ? (i * kRowStep / 8) * (HEAD_DIM / 64) * 512 : i * kRowStep * kPitch) *
           (unsigned)sizeof(elem_t);
}

// K and V of key block column g.col into stage `stage` of the ring;
// missing keys are zero rows.
__device__ __forceinline__ void load_kv_async(elem_t *sK, elem_t *sV, int stage, const elem_t *k,
                                              const elem_t *v, const stof_attn_args &a,
                                              const key_cols &g, const kv_thread &t) {
    const int off = stage * kStageElems;
    if constexpr (kRegularKV) {
        // the key block's first row (a legal address for the zero fill
        // of rows past the keys, which reads nothing)
        const int col = g.col >= 0 ? g.col : 0;
        const char *kb = t.kb + (long long)col * t.k_blk;
        const char *vb = t.vb + (long long)col * t.v_blk;
        asm volatile("mov.b64 %0, %0;" : "+l"(kb));  // once, not folded into every chunk
        asm volatile("mov.b64 %0, %0;" : "+l"(vb));
        const unsigned soff = off * (unsigned)sizeof(elem_t);
        const int rows = keys_in(a, g.col) - t.row0;  // of this thread's chunks
#pragma unroll
        for (int i = 0; i < kKVPasses; ++i) {
            const bool valid = i * kRowStep < rows;
            cp_async_16_s(t.sk + soff + pass_off(i), kb + (valid ? t.k_off[i] : 0), valid);
            cp_async_16_s(t.sv + soff + pass_off(i), vb + (valid ? t.v_off[i] : 0), valid);
        }
    } else {
        const int col0 = g.col >= 0 ? g.col * BLOCK_N : 0;
        load_tile_async<BLOCK_N>(sK + off, k + col0 * a.k_row_stride, (int)a.k_row_stride,
                                 keys_in(a, g.col));
        load_tile_async<BLOCK_N>(sV + off, v + col0 * a.v_row_stride, (int)a.v_row_stride,
                                 keys_in(a, g.col));
    }
}

#if TMA
// Bytes a stage's copies bring: K and V, every box whole (rows past k_len
// and entries past the list's end arrive as zeros and count too).
constexpr unsigned kStageBytes = 2u * kStageElems * sizeof(elem_t);

// K and V of key block column g.col into stage `stage`, by one thread: a
// tensor copy per 64-column piece, all counted on the stage's barrier. An
// entry past the list's end reads rows at k_len, out of the tensor: zeros.
__device__ __forceinline__ void load_kv_tma(unsigned sk, unsigned sv, int stage,
                                            const stof_attn_args &a, const key_cols &g, int h,
                                            int b, unsigned bar) {
    stof::tma::arrive_expect(bar, kStageBytes);
    const int row = g.col >= 0 ? g.col * BLOCK_N : a.k_len;
#pragma unroll
    for (int p = 0; p < HEAD_DIM / 64; ++p) {
        const unsigned off = (stage * kStageElems + p * (BLOCK_N * 64)) * sizeof(elem_t);
        const int x = h * HEAD_DIM + p * 64;
        stof::tma::copy_3d(sk + off, &a.tmap_k, x, row, b * a.k_tma_batch, bar);
        stof::tma::copy_3d(sv + off, &a.tmap_v, x, row, b * a.v_tma_batch, bar);
    }
}

#endif

// The A fragments of the warp's Q rows for k step kd.
__device__ __forceinline__ void load_q_frag(unsigned (&qf)[4], const elem_t *sQ,
                                            const warp_pos &w, int mt, int kd) {
    const int row = w.row0 + mt * 16 + (w.lane & 15);
    const int col = kd * 16 + (w.lane >> 4) * 8;
    ldmatrix_x4(qf, sQ + row * kPitch + col);
}

// ---- S = Q K^T -------------------------------------------------------------------

#if WGMMA
// The warpgroup's 64 rows of Q times the stage's BLOCK_N keys: HEAD_DIM / 16
// products into S, both operands K-major in shared memory. Issued and
// committed as one group, not waited for (the loop does: wg_wait, then
// keep_s before S is read).
__device__ __forceinline__ void issue_scores(float (&s)[kMT][kNT][4], const elem_t *sQ,
                                             const elem_t *sK, const warp_pos &w) {
    float(&d)[BLOCK_N / 2] = reinterpret_cast<float(&)[BLOCK_N / 2]>(s[0]);
    const elem_t *qa = sQ + (w.warp / 4) * 64 * HEAD_DIM;  // the warpgroup's row groups
#pragma unroll
    for (int kd = 0; kd < kKD; ++kd) {
        if (kSwizzle) {
            // 16 head-dim columns: 32 bytes into the rows of atom column kd / 4
            constexpr unsigned kSbo = 1024 * (HEAD_DIM / 64);  // 8-row step
            const int off = (kd >> 2) * 512 + (kd & 3) * 16;
            stof::wg::wg_mma<BLOCK_N>::ss(d, stof::wg::desc_sw128(qa + off, 16, kSbo),
                                          stof::wg::desc_sw128(sK + off, 16, kSbo), kd > 0);
        } else {
            // 16 head-dim columns = 2 core matrices = 128 elements
            constexpr unsigned kLbo = 128, kSbo = 16 * HEAD_DIM;
            stof::wg::wg_mma<BLOCK_N>::ss(d, stof::wg::desc(qa + kd * 128, kLbo, kSbo),
                                          stof::wg::desc(sK + kd * 128, kLbo, kSbo), kd > 0);
        }
    }
    stof::wg::commit();
}

__device__ __forceinline__ void keep_s(float (&s)[kMT][kNT][4]) {
    stof::wg::wg_mma<BLOCK_N>::keep(reinterpret_cast<float(&)[BLOCK_N / 2]>(s[0]));
}
#else
__device__ __forceinline__ void compute_scores(float (&s)[kMT][kNT][4],
                                               const unsigned (&qf)[kMT][kKD][4],
                                               const elem_t *sQ, const kv_view &k,
                                               const warp_pos &w) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
#pragma unroll
    for (int kd = 0; kd < kKD; ++kd) {
        unsigned a[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
            if (kKeepQ) {
#pragma unroll
                for (int e = 0; e < 4; ++e) a[mt][e] = qf[mt][kd][e];
            } else {
                load_q_frag(a[mt], sQ, w, mt, kd);
            }
        }
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
            unsigned b[4];
            ldmatrix_x4_s(b, k_frag(k, w, kd, np));
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
                mma_16816<elem_t>(s[mt][2 * np], a[mt], b[0], b[1]);
                mma_16816<elem_t>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
            }
        }
    }
}
#endif

// ---- mask, scale and bias ------------------------------------------------------------
//
// Scores reach the softmax in one of two units. Without a bias and with a
// positive scale they stay raw dot products: the softmax folds the scale
// into its exponent (exp2(s c - m c), one FFMA) and takes maxima of raw
// scores, which order like scaled ones. A full block away from the k_len
// edge then needs no work at all here, which is most blocks: per score the
// loop body is the max, one FFMA, one exp2 and one add. With the T5 bias (or
// a scale <= 0) scores are scaled here, the bias added, and the softmax
// uses c = 1. Either way m is kept in the softmax's units and turned into
// base-2 units (m c) where it leaves the kernel (split rows' partials).

// Whether this launch pre-scales scores (uniform over the grid).
__device__ __forceinline__ bool prescaled(const stof_attn_args &a) {
    return HAS_RELPOS || !(a.scale_log2 > 0.0f);
}

// The T5 bias by distance. T5's buckets are logarithmic: every distance
// past max_distance shares one bucket (a side), so most blocks of a long
// sparse row (BigBird's random and global blocks) take one bias for all
// their scores. The host appends to the bucket table the last position of
// its first run of equal buckets and the first of its last run
// (attention_abi.cuh); each CTA reads the two runs' biases once, and with
// -DRELPOS_MID=C (the host's capacity, a power of two) the biases of the
// positions between them into a shared table. A block inside a far run
// then adds one number, the blocks near the diagonal one shared load a
// score. (Reading bucket and table from global memory, two dependent loads
// a score, made the T5 kernel 1.7x slower than without the bias on BigBird
// 16x12x2048 with 32x32 tiles: the L1 there is mostly shared memory.)
#ifndef RELPOS_MID
#define RELPOS_MID 0
#endif
static_assert(RELPOS_MID == 0 || (HAS_RELPOS && RELPOS_MID % 4 == 0),
              "RELPOS_MID: the relpos build's table capacity, a multiple of 4");

struct relpos_far {
#if HAS_RELPOS
    int first_end, last_start;  // positions j - i + q_len - 1
    float first, last;          // their biases, times log2(e)
    int mid_len;                // positions first_end + 1 .. in `mid` (0: none)
    bool complete;              // every position between the runs is in `mid`
    const float *mid;
#endif
};

// Called by every thread of the block before the first barrier of the loop
// (which publishes the shared table).
__device__ __forceinline__ relpos_far load_relpos_far(const stof_attn_args &a, int h,
                                                      float *shared_mid) {
    relpos_far f;
#if HAS_RELPOS
    const int n = a.q_len + a.k_len - 1;
    f.first_end = __ldg(a.relpos_bucket + n);
    f.last_start = __ldg(a.relpos_bucket + n + 1);
    f.first = relpos_bias_log2_at<elem_t>(a, 0, h);
    f.last = relpos_bias_log2_at<elem_t>(a, n - 1, h);
    const int mid = f.last_start - f.first_end - 1;
    f.mid_len = RELPOS_MID && mid > 0 && mid <= RELPOS_MID ? mid : 0;
    f.complete = RELPOS_MID && mid <= RELPOS_MID;
    f.mid = shared_mid;
#if RELPOS_MID
    // All buckets first, then all biases: two round trips to L2, not two an
    // entry (at (1, 128), where a call is a few microseconds, the serial
    // loop cost 2 us a CTA).
    constexpr int kFill = (RELPOS_MID + kThreads - 1) / kThreads;
    int bucket[kFill];
#pragma unroll
    for (int k = 0; k < kFill; ++k) {
        const int i = threadIdx.x + k * kThreads;
        bucket[k] = i < f.mid_len ? __ldg(a.relpos_bucket + f.first_end + 1 + i) : 0;
    }
    const elem_t *table = static_cast<const elem_t *>(a.relpos_table);
#pragma unroll
    for (int k = 0; k < kFill; ++k) {
        const int i = threadIdx.x + k * kThreads;
        if (i < f.mid_len) shared_mid[i] = stof::to_float(table[bucket[k] * a.heads + h]) * kLog2e;
    }
#endif
#else
    (void)a;
    (void)h;
    (void)shared_mid;
#endif
    return f;
}

#if HAS_RELPOS
// The bias of query row i, key j.
__device__ __forceinline__ float relpos_near_log2(const stof_attn_args &a, const relpos_far &far,
                                                  int i, int j, int h) {
    const int pos = j - i + a.q_len - 1;
    if (pos <= far.first_end) return far.first;
    if (pos >= far.last_start) return far.last;
    const int k = pos - far.first_end - 1;
    return k < far.mid_len ? far.mid[k] : relpos_bias_log2_at<elem_t>(a, pos, h);
}

// The bias at position pos when far.complete, without a branch: the runs'
// ends are selected, every other position read from the shared table (the
// clamped read stays inside it, and is discarded at the ends).
__device__ __forceinline__ float relpos_table_log2(const relpos_far &far, int pos) {
    const int k = pos - far.first_end - 1;
    float v = far.mid[min(max(k, 0), max(far.mid_len - 1, 0))];
    v = k >= far.mid_len ? far.last : v;
    return k < 0 ? far.first : v;
}

// Whether key block `col` (keys [0, lim) of it) lies inside one of the far
// runs for all the warp's rows, and then its bias.
__device__ __forceinline__ bool uniform_relpos_log2(const stof_attn_args &a, const warp_pos &w,
                                                    int row_base, int col, int lim,
                                                    const relpos_far &far, float &bias) {
    bias = 0.0f;
    if (col < 0 || lim <= 0) return false;
    const int i0 = row_base + w.row0, i1 = min(i0 + kWarpRows, a.q_len) - 1;
    if (i1 < i0) return false;  // rows past q_len only: never stored
    const int j0 = col * BLOCK_N, j1 = j0 + min(lim, BLOCK_N) - 1;
    const int lo = j0 - i1 + a.q_len - 1, hi = j1 - i0 + a.q_len - 1;
    bias = hi <= far.first_end ? far.first : far.last;
    return hi <= far.first_end || lo >= far.last_start;
}
#endif

// Disallowed pairs become -inf: a partial block's bitmap (mask >= 0; a
// full block skips the test) and keys past k_len (zero-filled rows that
// must not count). Pre-scaled launches also scale and add the bias here.
// Rows past q_len are computed on zero queries and never stored.
__device__ __forceinline__ void mask_and_scale(float (&s)[kMT][kNT][4], const stof_attn_args &a,
                                               const warp_pos &w, int row_base,
                                               const key_group &g, int h, bool prescale,
                                               const relpos_far &far) {
    const int lim = keys_in(a, g.col);  // keys of the block that exist
    const bool work = prescale || g.mask >= 0 || lim < BLOCK_N;
    if (!work) return;  // full blocks away from the edge: nothing to mask
    const float mul = prescale ? a.scale_log2 : 1.0f;
#if HAS_RELPOS
    float bias;  // the block's bias where it is one number for the warp's rows
    const bool uniform = uniform_relpos_log2(a, w, row_base, g.col, lim, far, bias);
#endif
    // A full block (mask < 0) points at bitmap 0 and ignores it. Never
    // a null pointer: the compiler may issue the bitmap load before the
    // test that discards it (seen at 128x16 with one warp: a read of
    // address 0x20), and the host always uploads at least one bitmap.
    const bool partial = g.mask >= 0;
    const bool edge = lim < BLOCK_N;
#if HAS_RELPOS
    if (!partial && !edge && (uniform || far.complete)) {
        // A full block: scale and bias, none of the per-score tests
        // below. Inside a far run (most blocks of a long row) that is one
        // FFMA a score; near the diagonal one table read more. (With the
        // tests on every block, t5-base's BigBird encoder attention at
        // 16 x 12 x 2048 took 0.50 ms a layer, now 0.39; its causal
        // decoder self-attention 0.76, now 0.44.)
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int pos0 = g.col * BLOCK_N - (row_base + w.row0 + mt * 16 + w.g +
                                                    half * 8) + a.q_len - 1;
                if (uniform) {
#pragma unroll
                    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            float &x = s[mt][nt][half * 2 + e];
                            x = fmaf(x, mul, bias);
                        }
                } else {
#pragma unroll
                    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            float &x = s[mt][nt][half * 2 + e];
                            x = fmaf(x, mul, relpos_table_log2(far, pos0 + nt * 8 + 2 * w.t + e));
                        }
                }
            }
        return;
    }
#endif
    const stof_u32 *bitmap =
        a.part_masks + (long long)(partial ? g.mask : 0) * (BLOCK_M * kMaskWords);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int r = w.row0 + mt * 16 + w.g + half * 8;  // row within the block tile
            stof_u32 bits[kMaskWords];
#pragma unroll
            for (int k = 0; k < kMaskWords; ++k)
                bits[k] = partial ? __ldg(bitmap + r * kMaskWords + k) : 0xffffffffu;
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int c = nt * 8 + 2 * w.t + e;  // column within the key block
                    bool ok = (bits[c >> 5] >> (c & 31)) & 1u;
                    if (edge) ok = ok && c < lim;
                    float x = s[mt][nt][half * 2 + e] * mul;
#if HAS_RELPOS
                    if (uniform)
                        x += bias;
                    else if (far.complete)
                        x += relpos_table_log2(far, g.col * BLOCK_N + c - (row_base + r) +
                                                        a.q_len - 1);
                    else if (ok && row_base + r < a.q_len)
                        x += relpos_near_log2(a, far, row_base + r, g.col * BLOCK_N + c, h);
#endif
                    s[mt][nt][half * 2 + e] = ok ? x : STOF_NEG_INF;
                }
            }
        }
    }
}

// ---- the warp's view of a partial block ------------------------------------------------

// How the warp's own rows see partial block `mask` (>= 0): 0 no allowed
// key (the warp skips the block: its scores would all be -inf, which the
// online softmax leaves unchanged), 1 every key allowed (no mask pass), 2
// mixed. With BLOCK_M above the mask's structure (BigBird's 32-row random
// blocks in a 64-row tile) many blocks are partial only because of the
// other warps' rows: the block's K and V are loaded once for the rows that
// need them, and the warps that do not skip the math. Bitmap words are
// read again in the mask pass (L1 hits).
__device__ __forceinline__ int warp_view(const stof_attn_args &a, const warp_pos &w, int mask) {
    const stof_u32 *bitmap = a.part_masks + (long long)mask * (BLOCK_M * kMaskWords);
    stof_u32 any = 0, all = ~0u;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int r = w.row0 + mt * 16 + w.g + half * 8;
#pragma unroll
            for (int k = 0; k < kMaskWords; ++k) {
                const stof_u32 word = __ldg(bitmap + r * kMaskWords + k);
                // the bits of real columns: all 32 but in a last, short word
                const stof_u32 real = (k == kMaskWords - 1 && BLOCK_N % 32)
                                          ? (1u << (BLOCK_N % 32)) - 1u
                                          : ~0u;
                any |= word;
                all &= word | ~real;
            }
        }
    if (!__any_sync(0xffffffffu, any != 0)) return 0;
    return __all_sync(0xffffffffu, all == ~0u) ? 1 : 2;
}

// The block as this warp sees it: with no allowed key for its rows it
// becomes missing (col -1, all masked), all-allowed it becomes full. False
// when nothing is left: the warp skips the iteration's math. (The wgmma build,
// which computes a warpgroup's rows together, does not call it.)
__device__ __forceinline__ bool warp_group_view(const stof_attn_args &a, const warp_pos &w,
                                                key_group &g) {
#if !WARP_SKIP
    return true;
#else
    if (g.mask >= 0) {
        const int v = warp_view(a, w, g.mask);
        if (v == 0) g.col = -1;
        if (v == 1) g.mask = -1;
    }
    return g.col >= 0;
#endif
}

// ---- online softmax -------------------------------------------------------------

// Each thread holds two rows per m tile (g and g + 8), spread over the four
// threads of a quad: the row maximum is reduced across the quad; the row sum
// l stays a per-thread partial sum until the end. S becomes P in place;
// c > 0 is the scale still to apply (see above), m is in score units.
// softmax_step updates m, l and turns S into P; O still has to be scaled
// by alpha (rescale_o) when it returns true: the pipelined wgmma loop does
// that once the previous block's P V has landed in O. It returns false when
// no row of the warp has a new maximum (alpha = 1 for every row): the warp
// skips the rescale, one multiply per accumulator, and the alpha
// exponentials. That is the common case once the rows have seen their
// larger scores, and it changes no result. (Letting m lag behind by up to
// 8 in exp2 units, P <= 256, skipped more, but on an H200 it bought 2% on
// dense 64x64 wgmma tiles for 7% more error against an fp64 reference.)
// Pairwise reductions of n values (x is overwritten): log2(n) dependent
// steps instead of n, which is what the fixed-latency stalls of a 32-key
// block's softmax were made of.

template <int N>
__device__ __forceinline__ float pairwise_max(float (&x)[N]) {
#pragma unroll
    for (int w = 1; w < N; w *= 2)
#pragma unroll
        for (int i = 0; i + w < N; i += 2 * w) x[i] = fmaxf(x[i], x[i + w]);
    return x[0];
}

template <int N>
__device__ __forceinline__ float pairwise_sum(float (&x)[N]) {
#pragma unroll
    for (int w = 1; w < N; w *= 2)
#pragma unroll
        for (int i = 0; i + w < N; i += 2 * w) x[i] += x[i + w];
    return x[0];
}

// The maximum of the thread's scores of row `half` of tile mt.
__device__ __forceinline__ float row_max(const float (&s)[kMT][kNT][4], int mt, int half) {
    float part[kNT];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) part[nt] = fmaxf(s[mt][nt][half * 2], s[mt][nt][half * 2 + 1]);
    return pairwise_max(part);
}

// Row `half` of tile mt: scores to P = exp2(s c + neg_ref); their sum.
__device__ __forceinline__ float row_exp(float (&s)[kMT][kNT][4], int mt, int half, float c,
                                         float neg_ref) {
    float part[kNT];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e)
            s[mt][nt][half * 2 + e] = exp2f(fmaf(s[mt][nt][half * 2 + e], c, neg_ref));
        part[nt] = s[mt][nt][half * 2] + s[mt][nt][half * 2 + 1];
    }
    return pairwise_sum(part);
}

// nmc is -m c per row (0 while the row is empty: see softmax_ref), the
// exponent's offset; it changes only with m, so it is kept, not rebuilt.
__device__ __forceinline__ bool softmax_step(float (&s)[kMT][kNT][4], float (&m)[kMT][2],
                                             float (&l)[kMT][2], float (&nmc)[kMT][2],
                                             float (&alpha_out)[kMT][2], float c) {
    float m_new[kMT][2];
    bool move = false;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            float mx = row_max(s, mt, half);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            m_new[mt][half] = fmaxf(m[mt][half], mx);
            move = move || m_new[mt][half] > m[mt][half];
        }
    }
    move = __any_sync(0xffffffffu, move);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            float alpha = 1.0f;
            if (move) {
                nmc[mt][half] = -softmax_ref(m_new[mt][half]) * c;
                alpha = exp2f(fmaf(m[mt][half], c, nmc[mt][half]));  // 0 while the row was empty
                m[mt][half] = m_new[mt][half];
            }
            l[mt][half] = l[mt][half] * alpha + row_exp(s, mt, half, c, nmc[mt][half]);
            alpha_out[mt][half] = alpha;
        }
    }
    return move;
}

__device__ __forceinline__ void rescale_o(float (&o)[kMT][kDT][4], const float (&alpha)[kMT][2]) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[mt][dt][e] *= alpha[mt][e >> 1];
}

__device__ __forceinline__ void online_softmax(float (&s)[kMT][kNT][4], float (&m)[kMT][2],
                                               float (&l)[kMT][2], float (&nmc)[kMT][2],
                                               float (&o)[kMT][kDT][4], float c) {
    float alpha[kMT][2];
    if (softmax_step(s, m, l, nmc, alpha, c))
        rescale_o(o, alpha);
}

// ---- O += P V -----------------------------------------------------------------------

#if WGMMA
// P (fp32 C fragments) as the A fragments of P V, in the dtype.
__device__ __forceinline__ void pack_p(const float (&p)[kMT][kNT][4], unsigned (&a)[kKN][4]) {
#pragma unroll
    for (int kn = 0; kn < kKN; ++kn) {
        a[kn][0] = pack2<elem_t>(p[0][2 * kn][0], p[0][2 * kn][1]);
        a[kn][1] = pack2<elem_t>(p[0][2 * kn][2], p[0][2 * kn][3]);
        a[kn][2] = pack2<elem_t>(p[0][2 * kn + 1][0], p[0][2 * kn + 1][1]);
        a[kn][3] = pack2<elem_t>(p[0][2 * kn + 1][2], p[0][2 * kn + 1][3]);
    }
}

// O += P V for the warpgroup: P from registers, V MN-major from shared
// memory, BLOCK_N / 16 products, committed as one group and not waited for:
// O and the P fragments stay untouched until wg_wait, then keep_pv.
__device__ __forceinline__ void issue_pv(float (&o)[kMT][kDT][4], const unsigned (&a)[kKN][4],
                                         const elem_t *sV) {
    float(&d)[HEAD_DIM / 2] = reinterpret_cast<float(&)[HEAD_DIM / 2]>(o[0]);
#pragma unroll
    for (int kn = 0; kn < kKN; ++kn) {  // 16 keys = 2 row groups = 16 HEAD_DIM elements
        const elem_t *vk = sV + kn * 16 * HEAD_DIM;
        // MN-major: swizzled, LBO steps along N (64-column atoms) and SBO
        // along K (8 keys); unswizzled, the other way round
        const unsigned long long db =
            kSwizzle ? stof::wg::desc_sw128(vk, 1024, 1024 * (HEAD_DIM / 64))
                     : stof::wg::desc(vk, 16 * HEAD_DIM, 128);
        stof::wg::wg_mma<HEAD_DIM>::rs_tb(d, a[kn], db, 1);
    }
    stof::wg::commit();
}

__device__ __forceinline__ void keep_pv(float (&o)[kMT][kDT][4], unsigned (&a)[kKN][4]) {
    stof::wg::wg_mma<HEAD_DIM>::keep(reinterpret_cast<float(&)[HEAD_DIM / 2]>(o[0]));
#pragma unroll
    for (int kn = 0; kn < kKN; ++kn)
#pragma unroll
        for (int e = 0; e < 4; ++e) stof::wg::keep(a[kn][e]);
}
#else
__device__ __forceinline__ void compute_pv(float (&o)[kMT][kDT][4], const float (&p)[kMT][kNT][4],
                                           const kv_view &v, const warp_pos &w) {
#pragma unroll
    for (int kn = 0; kn < kKN; ++kn) {
        // P's C fragments of n tiles 2kn, 2kn+1 are the A fragment of k step kn
        unsigned a[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
            a[mt][0] = pack2<elem_t>(p[mt][2 * kn][0], p[mt][2 * kn][1]);
            a[mt][1] = pack2<elem_t>(p[mt][2 * kn][2], p[mt][2 * kn][3]);
            a[mt][2] = pack2<elem_t>(p[mt][2 * kn + 1][0], p[mt][2 * kn + 1][1]);
            a[mt][3] = pack2<elem_t>(p[mt][2 * kn + 1][2], p[mt][2 * kn + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < kDT / 2; ++dp) {
            unsigned b[4];
            ldmatrix_x4_trans_s(b, v_frag(v, w, kn, dp));
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
                mma_16816<elem_t>(o[mt][2 * dp], a[mt], b[0], b[1]);
                mma_16816<elem_t>(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
            }
        }
    }
}
#endif

// ---- O / l -> global -----------------------------------------------------------------

// Normalizes the warp's rows, stages them in the warp's own rows of the Q
// tile and writes them out with 16-byte stores. A row with no allowed key
// (l == 0) writes exact zeros.
__device__ __forceinline__ void store_output(const float (&o)[kMT][kDT][4], float (&l)[kMT][2],
                                             elem_t *sO, elem_t *out, long long out_stride,
                                             int valid_rows, const warp_pos &w) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            float sum = l[mt][half];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            const bool empty = !(sum > 0.0f);
            const float inv = empty ? 0.0f : 1.0f / sum;
            const int r = w.row0 + mt * 16 + w.g + half * 8;
#pragma unroll
            for (int dt = 0; dt < kDT; ++dt) {
                const float x = empty ? 0.0f : o[mt][dt][half * 2] * inv;
                const float y = empty ? 0.0f : o[mt][dt][half * 2 + 1] * inv;
                *reinterpret_cast<unsigned *>(sO + tile_off(r, dt * 8 + 2 * w.t)) =
                    pack2<elem_t>(x, y);
            }
        }
    }
    __syncwarp();
#pragma unroll 2
    for (int idx = w.lane; idx < kWarpRows * kDT; idx += 32) {
        const int r = w.row0 + idx / kDT, c = idx % kDT;
        if (r < valid_rows)
            *reinterpret_cast<uint4 *>(out + r * out_stride + c * 8) =
                *reinterpret_cast<const uint4 *>(sO + tile_off(r, c * 8));
    }
}

#if SPLIT
// ---- split rows: partials and their combination ---------------------------------------

// The workspace unit of (slot, batch, head): see attention_abi.cuh.
__device__ __forceinline__ long long partial_unit(const stof_attn_args &a, int slot, int b,
                                                  int h) {
    const long long per_batch = a.fmt_batch == 1 ? a.n_slots : 0;
    return ((long long)b * per_batch + slot) * a.heads + h;
}

// A slice of a block row: O unnormalized (fp32, relative to the row's
// maximum m) and the rows' m and l, straight from the fragments. Every
// BLOCK_M row is written (rows past q_len hold finite junk the combine
// never reads); a row that saw no allowed key has m = -inf, l = 0, O = 0.
__device__ __forceinline__ void store_partial(const float (&o)[kMT][kDT][4],
                                              const float (&m)[kMT][2], const float (&l)[kMT][2],
                                              float *po, float *pml, const warp_pos &w, float c) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            float sum = l[mt][half];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            const int r = w.row0 + mt * 16 + w.g + half * 8;
#pragma unroll
            for (int dt = 0; dt < kDT; ++dt)
                *reinterpret_cast<float2 *>(po + r * HEAD_DIM + dt * 8 + 2 * w.t) =
                    make_float2(o[mt][dt][half * 2], o[mt][dt][half * 2 + 1]);
            if (w.t == 0)
                *reinterpret_cast<float2 *>(pml + 2 * r) = make_float2(m[mt][half] * c, sum);
        }
    }
}

#endif

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
                                                       unsigned &phases, int h, int b) {
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
        load_kv_tma(sk, sv, refill, a, next, h, b, bar0 + 8 * refill);
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
    const int bm = item.x, start = item.y, end = item.z, slot = item.w;
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
    const int start = __ldg(a.load_row_ptr + ptr), end = __ldg(a.load_row_ptr + ptr + 1);
#endif

    const elem_t *q = static_cast<const elem_t *>(a.q) + b * a.q_batch_stride +
                      row_base * a.q_row_stride + h * HEAD_DIM;
#if !TMA  // (the TMA build addresses K and V through its tensor maps)
    const elem_t *k = static_cast<const elem_t *>(a.k) + b * a.k_batch_stride + h * HEAD_DIM;
    const elem_t *v = static_cast<const elem_t *>(a.v) + b * a.v_batch_stride + h * HEAD_DIM;
#endif
    elem_t *out = static_cast<elem_t *>(a.o) + b * a.o_batch_stride + row_base * a.o_row_stride +
                  h * HEAD_DIM;
#if TMA
    // Prologue: the barriers, Q by cp.async, blocks 0 .. kAhead-1 by copies.
    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) stof::tma::barrier_init(bar0 + 8 * s);
        stof::tma::fence_barrier_init();
    }
    __syncthreads();
    if (start < end) load_tile_async<BLOCK_M>(sQ, q, (int)a.q_row_stride, a.q_len - row_base);
    cp_async_commit();
    if (threadIdx.x == 0) {
#pragma unroll
        for (int j = 0; j < kAhead; ++j)
            if (start + j < end)
                load_kv_tma(sk, sv, j, a, load_cols(a, start + j, end), h, b, bar0 + 8 * j);
    }
#else
    const kv_thread kt = make_kv_thread(a, k, v, sK, sV);

    // Prologue: groups 0 .. kAhead-1 hold blocks 0 .. kAhead-1 (Q with block 0).
    if (start < end) load_tile_async<BLOCK_M>(sQ, q, (int)a.q_row_stride, a.q_len - row_base);
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
                                              bar0, phases, h, b);
#else
            key_group cur = pipeline_step(a, sK, sV, k, v, start, start, end, stage, next, sQ, w, qf, kt);
#endif
            float s[kMT][kNT][4];
            stof::wg::fence();
            issue_scores(s, sQ, sK + stage * kStageElems, w);
            stof::wg::wait<0>();
            keep_s(s);
            mask_and_scale(s, a, w, row_base, cur, h, prescale, far);
            float alpha[kMT][2];  // 0: O is still zero
            softmax_step(s, m, l, nmc, alpha, c);
            pack_p(s, pf);
            stage = 1;  // STAGES >= 3
        }
        for (int it = start + 1; it < end; ++it) {
#if TMA
            key_group cur = pipeline_step_tma(a, sk, sv, it, start, end, stage, next, sQ, w, qf,
                                              bar0, phases, h, b);
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
            mask_and_scale(p, a, w, row_base, cur, h, prescale, far);
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
                                          phases, h, b);
#else
        key_group cur = pipeline_step(a, sK, sV, k, v, it, start, end, stage, next, sQ, w, qf, kt);
#endif
        if (warp_group_view(a, w, cur)) {
            float s[kMT][kNT][4];
#if TMA
            const unsigned stage_off = stage * (kStageElems * (unsigned)sizeof(elem_t));
            const kv_view kk = {sK, sk_lane + stage_off}, vv = {sV, sv_lane + stage_off};
#else
            const kv_view kk = {sK + stage * kStageElems, 0}, vv = {sV + stage * kStageElems, 0};
#endif
            compute_scores(s, qf, sQ, kk, w);
            mask_and_scale(s, a, w, row_base, cur, h, prescale, far);
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
    __syncwarp();
    store_output(o, l, sQ, out, a.o_row_stride, a.q_len - row_base, w);
}

#if SPLIT
// ---- the combine kernel ------------------------------------------------------------------
//
// Grid (split rows, heads, batch), STOF_ATTN_COMBINE_THREADS threads. For
// each valid row of the split block row and each 8-dim chunk of it (one
// thread a (row, chunk) at a time):
//   M = max_s m_s;  w_s = exp2(m_s - M) (0 for a slice with no allowed key)
//   O = sum_s w_s O_s / sum_s w_s l_s   (zeros when that sum is 0)
// and one 16-byte store of the 8 output elements.
constexpr int kCombineThreads = STOF_ATTN_COMBINE_THREADS;

extern "C" __global__ void __launch_bounds__(kCombineThreads)
stof_attention_combine(const stof_attn_args a) {
    stof::grid_dependency_begin();  // before any read (common.cuh)
    const int h = blockIdx.y, b = blockIdx.z;
    const int wb = a.fmt_batch == 1 ? 0 : b;
    const int first = __ldg(a.split_ptr + wb);
    if ((int)blockIdx.x >= __ldg(a.split_ptr + wb + 1) - first) return;
    const int4 sr = __ldg(reinterpret_cast<const int4 *>(a.splits) + first + blockIdx.x);
    const int row_base = sr.x * BLOCK_M, first_slot = sr.y, n_slots = sr.z;
    const int valid_rows = min(BLOCK_M, a.q_len - row_base);
    elem_t *out = static_cast<elem_t *>(a.o) + b * a.o_batch_stride + row_base * a.o_row_stride +
                  h * HEAD_DIM;
    const long long u0 = partial_unit(a, first_slot, b, h);
    const long long unit_stride = a.heads;  // consecutive slots: units a.heads apart
    for (int idx = threadIdx.x; idx < valid_rows * kDT; idx += kCombineThreads) {
        const int r = idx / kDT, c = idx % kDT;
        float mx = STOF_NEG_INF;
        for (int s = 0; s < n_slots; ++s)
            mx = fmaxf(mx, a.partial_ml[(u0 + s * unit_stride) * (2 * BLOCK_M) + 2 * r]);
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sum = 0.0f;
        if (mx != STOF_NEG_INF) {
            for (int s = 0; s < n_slots; ++s) {
                const long long u = u0 + s * unit_stride;
                const float2 ml =
                    *reinterpret_cast<const float2 *>(a.partial_ml + u * (2 * BLOCK_M) + 2 * r);
                if (ml.x == STOF_NEG_INF) continue;  // nothing allowed in this slice
                const float wgt = exp2f(ml.x - mx);
                sum += wgt * ml.y;
                const float4 *po = reinterpret_cast<const float4 *>(
                    a.partial_o + u * (BLOCK_M * HEAD_DIM) + r * HEAD_DIM + c * 8);
                const float4 x = po[0], y = po[1];
                const float part[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[e] += wgt * part[e];
            }
        }
        const bool empty = !(sum > 0.0f);
        const float inv = empty ? 0.0f : 1.0f / sum;
        const uint4 v = make_uint4(pack2<elem_t>(acc[0] * inv, acc[1] * inv),
                                   pack2<elem_t>(acc[2] * inv, acc[3] * inv),
                                   pack2<elem_t>(acc[4] * inv, acc[5] * inv),
                                   pack2<elem_t>(acc[6] * inv, acc[7] * inv));
        *reinterpret_cast<uint4 *>(out + r * a.o_row_stride + c * 8) = v;
    }
}
#endif
