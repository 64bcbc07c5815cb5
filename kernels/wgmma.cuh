// Hopper warpgroup matrix multiply (wgmma, sm_90a): the pieces the
// -DWGMMA=1 builds of the block-wise attention kernel and of gemm_epilogue.cu
// use.
//
// A warpgroup is four consecutive warps (128 threads) that issue one
// m64nNk16 product together: 64 rows of A (16 per warp) times a 16 x N B
// tile, fp32 accumulators. Per thread the accumulator D holds N / 2 floats
// laid out exactly like N / 8 mma.sync m16n8 C fragments of the warp's 16
// rows (d[4 j + e]: rows g and g + 8, columns 8 j + 2 t, + 1), and A in
// registers is the mma.sync m16n8k16 A fragment: so the softmax code of the
// mma.sync kernel runs unchanged on wgmma results, and P goes from the
// softmax to P V without shared memory.
//
// Operands in shared memory are described by a 64-bit descriptor and must
// be in one of the canonical layouts. Head sizes that are multiples of 64
// use the 128-byte swizzle (desc_sw128 below). The others use "core
// matrices": a core matrix is 8 rows of 16 bytes stored as 128 contiguous
// bytes, and the tiles are [rows][D] element matrices with no swizzle:
// element (r, c) lives at
//   ((r / 8) * (D / 8) + c / 8) * 64 + (r % 8) * 8 + c % 8
// so stepping one core matrix along c is +128 bytes and along r (8 rows)
// is +16 D bytes. For Q K^T both operands are "K-major" (the head dim is
// contiguous): the leading byte offset (LBO) is the K step, 128, the stride
// byte offset (SBO) the 8-row step, 16 D. V is the B operand of P V with
// its N dim (the head dim) contiguous: "MN-major", read with the transpose
// flag, where the roles swap: LBO steps along K (8 keys: 16 D bytes) and
// SBO along N (128). (Checked on an H200 with a standalone product against
// a CPU reference: the other assignments give wrong sums or fault.)
//
// Element type: STOF_DTYPE (1 fp16, 2 bf16), as for every kernel here.
#pragma once

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "wgmma needs the sm_90a target (-arch=sm_90a)"
#endif

#if STOF_DTYPE == 1
#define STOF_WG_AB "f16"
#elif STOF_DTYPE == 2
#define STOF_WG_AB "bf16"
#else
#error "wgmma: STOF_DTYPE must be 1 (fp16) or 2 (bf16)"
#endif

namespace stof {
namespace wg {

// The descriptor of a no-swizzle operand at smem with the given byte offsets.
__device__ __forceinline__ unsigned long long desc(const void *smem, unsigned lbo,
                                                   unsigned sbo) {
    const unsigned long long addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    return ((addr & 0x3FFFFull) >> 4) | (static_cast<unsigned long long>(lbo >> 4) << 16) |
           (static_cast<unsigned long long>(sbo >> 4) << 32);
}

// The same for a tile in the 128-byte swizzle (layout type 1 in bits 62-63):
// rows of 128 bytes in 8-row atoms of 1024 bytes, the 16-byte chunk j of
// row r stored at chunk j ^ (r % 8). K-major, the start address steps 32
// bytes along K within a row and SBO is the 8-row step (LBO unused); MN-
// major, LBO is the step between 64-element atoms along N, SBO along K.
__device__ __forceinline__ unsigned long long desc_sw128(const void *smem, unsigned lbo,
                                                         unsigned sbo) {
    return desc(smem, lbo, sbo) | (1ull << 62);
}

// Orders this thread's register writes (accumulators, A fragments) before
// the wgmma that follows; required before the first wgmma and after any
// register access to its operands.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most N committed groups are in flight.
template <int N> __device__ __forceinline__ void wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared-memory writes of the generic proxy (st.shared, cp.async) made
// visible to wgmma's operand reads, which go through the async proxy.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps 32-bit registers (A fragments) alive and unmoved up to this point:
// wgmma reads them asynchronously, after its own instruction.
__device__ __forceinline__ void keep(unsigned &r) { asm volatile("" : "+r"(r)::"memory"); }

// m64nNk16 products, D (+)= A B, for the N the kernels use (256: the GEMM).
//   ss:    A and B from shared memory, both K-major;
//   rs_tb: A from registers, B from shared memory MN-major (transposed);
//   keep:  after wait(), pins the accumulators there: the compiler sees
//          them written by the asm statement and would otherwise be free
//          to read them before the wait.
// acc = 0 overwrites D (scale-d false).
template <int N> struct wg_mma;

// The accumulator operands: "%0, ..., %(R-1)" in the instruction text and
// "+f"(d[0]) ... "+f"(d[R-1]) as constraints, for R = N / 2.
#define STOF_WG_REGS_8 "%0, %1, %2, %3, %4, %5, %6, %7"
#define STOF_WG_REGS_16 STOF_WG_REGS_8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define STOF_WG_REGS_32 STOF_WG_REGS_16 ", %16, %17, %18, %19, %20, %21, %22, %23, "   \
                                        "%24, %25, %26, %27, %28, %29, %30, %31"
#define STOF_WG_REGS_40 STOF_WG_REGS_32 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define STOF_WG_REGS_64 STOF_WG_REGS_40 ", %40, %41, %42, %43, %44, %45, %46, %47, "   \
                                        "%48, %49, %50, %51, %52, %53, %54, %55, "   \
                                        "%56, %57, %58, %59, %60, %61, %62, %63"
#define STOF_WG_REGS_128 STOF_WG_REGS_64 ", %64, %65, %66, %67, %68, %69, %70, %71, "   \
                                         "%72, %73, %74, %75, %76, %77, %78, %79, "   \
                                         "%80, %81, %82, %83, %84, %85, %86, %87, "   \
                                         "%88, %89, %90, %91, %92, %93, %94, %95, "   \
                                         "%96, %97, %98, %99, %100, %101, %102, %103, " \
                                         "%104, %105, %106, %107, %108, %109, %110, "  \
                                         "%111, %112, %113, %114, %115, %116, %117, "  \
                                         "%118, %119, %120, %121, %122, %123, %124, "  \
                                         "%125, %126, %127"
#define STOF_WG_D8(i)                                                                      \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]),           \
        "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define STOF_WG_D16(i) STOF_WG_D8(i), STOF_WG_D8(i + 8)
#define STOF_WG_D32(i) STOF_WG_D16(i), STOF_WG_D16(i + 16)
#define STOF_WG_D40(i) STOF_WG_D32(i), STOF_WG_D8(i + 32)
#define STOF_WG_D64(i) STOF_WG_D32(i), STOF_WG_D32(i + 32)
#define STOF_WG_D128(i) STOF_WG_D64(i), STOF_WG_D64(i + 64)

// wg_mma<N> for R = N / 2 accumulators; O0..O5 name the operands after
// them ("%R" .. "%(R+5)"): ss takes descA O0, descB O1, acc O2; rs_tb takes
// A in O0..O3, descB O4, acc O5.
#define STOF_WG_MMA(N, R, O0, O1, O2, O3, O4, O5)                                          \
    template <> struct wg_mma<N> {                                                         \
        static __device__ __forceinline__ void ss(float (&d)[R], unsigned long long da,    \
                                                  unsigned long long db, int acc) {        \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " O2 ", 0;\n"                   \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." STOF_WG_AB     \
                         "." STOF_WG_AB " {" STOF_WG_REGS_##R "}, " O0 ", " O1             \
                         ", p, 1, 1, 0, 0;\n}\n"                                          \
                         : STOF_WG_D##R(0)                                                 \
                         : "l"(da), "l"(db), "r"(acc));                                    \
        }                                                                                  \
        static __device__ __forceinline__ void rs_tb(float (&d)[R], const unsigned (&a)[4], \
                                                     unsigned long long db, int acc) {     \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " O5 ", 0;\n"                   \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." STOF_WG_AB     \
                         "." STOF_WG_AB " {" STOF_WG_REGS_##R "}, {" O0 ", " O1 ", " O2   \
                         ", " O3 "}, " O4 ", p, 1, 1, 1;\n}\n"                             \
                         : STOF_WG_D##R(0)                                                 \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc)); \
        }                                                                                  \
        static __device__ __forceinline__ void keep(float (&d)[R]) {                       \
            _Pragma("unroll") for (int i = 0; i < R; ++i)                                  \
                asm volatile("" : "+f"(d[i])::"memory");                                   \
        }                                                                                  \
    };

STOF_WG_MMA(16, 8, "%8", "%9", "%10", "%11", "%12", "%13")
STOF_WG_MMA(32, 16, "%16", "%17", "%18", "%19", "%20", "%21")
STOF_WG_MMA(64, 32, "%32", "%33", "%34", "%35", "%36", "%37")
STOF_WG_MMA(80, 40, "%40", "%41", "%42", "%43", "%44", "%45")
STOF_WG_MMA(128, 64, "%64", "%65", "%66", "%67", "%68", "%69")
STOF_WG_MMA(256, 128, "%128", "%129", "%130", "%131", "%132", "%133")

}  // namespace wg
}  // namespace stof
