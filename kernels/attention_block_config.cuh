// The block-wise attention kernel's build: its switches (-D options, with
// their defaults), the element type and the tile constants every part of
// attention_block.cu is written in, checked once here.
#ifndef STOF_KERNELS_ATTENTION_BLOCK_CONFIG_CUH
#define STOF_KERNELS_ATTENTION_BLOCK_CONFIG_CUH

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
#ifndef PADDING  // 1: a run-time attention_mask (stof_attn_args.pad_mask)
#define PADDING 0
#endif
#ifndef STAGES
#define STAGES 2
#endif
#ifndef SPLIT
#define SPLIT 0
#endif
#ifndef LSE  // 1: each row's log-sum-exp to stof_attn_args.lse (attention_abi.cuh)
#define LSE 0
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

#endif  // STOF_KERNELS_ATTENTION_BLOCK_CONFIG_CUH
