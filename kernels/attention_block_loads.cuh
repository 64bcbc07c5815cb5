// Loads of the block-wise attention kernel: shared tile layout, Q, K and V
// by cp.async or the tensor memory accelerator, the BSR load list, and the
// ldmatrix addresses of the fragments. (After attention_block_config.cuh.)
// Part of attention_block.cu, which includes it after the parts it names;
// it uses that kernel's build constants (attention_block_config.cuh).
#ifndef STOF_KERNELS_ATTENTION_BLOCK_LOADS_CUH
#define STOF_KERNELS_ATTENTION_BLOCK_LOADS_CUH

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

// The end of load-list entries [start, end) whose key block starts below n_keys (>= 1):
// columns increase along a block row (ops/mask_format.h), so with padding the blocks wholly
// past a sequence's length are cut off the walk by a binary search.
__device__ __forceinline__ int entries_below(const stof_attn_args &a, int start, int end,
                                             int n_keys) {
    const int last_col = (n_keys - 1) / BLOCK_N;
    while (start < end) {
        const int mid = (start + end) >> 1;
        if (__ldg(a.load_col_idx + mid) <= last_col)
            start = mid + 1;
        else
            end = mid;
    }
    return start;
}

// Keys of entry column `col` that exist (below n_keys: k_len, or with padding the
// sequence's length; none past the list's end).
__device__ __forceinline__ int keys_in(int n_keys, int col) {
    return col >= 0 ? n_keys - col * BLOCK_N : 0;
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
    int n_keys;       // keys loaded (keys_in); rows past them are zero-filled
};

// BLOCK_N * stride < 2^30 elements (STOF_ATTN_MAX_ROW_STRIDE): byte offsets fit an int.
__device__ __forceinline__ kv_thread make_kv_thread(const stof_attn_args &a, const elem_t *k,
                                                    const elem_t *v, const elem_t *sK,
                                                    const elem_t *sV, int n_keys) {
    kv_thread t;
    t.n_keys = n_keys;
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
        const int rows = keys_in(t.n_keys, g.col) - t.row0;  // of this thread's chunks
#pragma unroll
        for (int i = 0; i < kKVPasses; ++i) {
            const bool valid = i * kRowStep < rows;
            cp_async_16_s(t.sk + soff + pass_off(i), kb + (valid ? t.k_off[i] : 0), valid);
            cp_async_16_s(t.sv + soff + pass_off(i), vb + (valid ? t.v_off[i] : 0), valid);
        }
    } else {
        const int col0 = g.col >= 0 ? g.col * BLOCK_N : 0;
        load_tile_async<BLOCK_N>(sK + off, k + col0 * a.k_row_stride, (int)a.k_row_stride,
                                 keys_in(t.n_keys, g.col));
        load_tile_async<BLOCK_N>(sV + off, v + col0 * a.v_row_stride, (int)a.v_row_stride,
                                 keys_in(t.n_keys, g.col));
    }
}

#if TMA
// Bytes a stage's copies bring: K and V, every box whole (rows past k_len
// and entries past the list's end arrive as zeros and count too).
constexpr unsigned kStageBytes = 2u * kStageElems * sizeof(elem_t);

// K and V of key block column g.col into stage `stage`, by one thread: a
// tensor copy per 64-column piece, all counted on the stage's barrier. An
// entry past the list's end reads rows at k_len (out of the tensor: zeros;
// in a ragged launch's map maybe rows of another sequence), never weighed.
// The sequence's keys start at row `first` of the map (ragged launches).
__device__ __forceinline__ void load_kv_tma(unsigned sk, unsigned sv, int stage,
                                            const stof_attn_args &a, const key_cols &g, int h,
                                            int b, int first, unsigned bar) {
    stof::tma::arrive_expect(bar, kStageBytes);
    const int row = g.col >= 0 ? first + g.col * BLOCK_N : a.k_len;
#pragma unroll
    for (int p = 0; p < HEAD_DIM / 64; ++p) {
        const unsigned off = (stage * kStageElems + p * (BLOCK_N * 64)) * sizeof(elem_t);
        const int x = (h / a.kv_group) * HEAD_DIM + p * 64;
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

#endif  // STOF_KERNELS_ATTENTION_BLOCK_LOADS_CUH
