// Hopper's tensor memory accelerator (sm_90+) as the attention kernel and
// gemm_epilogue's wgmma build use it: tile copies global -> shared
// described by a tensor map the host encodes (cuTensorMapEncodeTiled; see
// attention_abi.cuh), completing on a shared-memory barrier that counts the
// bytes it expects.
//
// One thread issues a whole tile: the address arithmetic, the row loop and
// the zero fill of rows outside the tensor are the copy engine's, so a
// block-wise attention iteration spends a handful of instructions on its
// K and V instead of a few per 16-byte chunk per thread.
#pragma once

namespace stof {
namespace tma {

__device__ __forceinline__ unsigned smem_u32(const void *p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// A barrier that `count` arrivals complete: by default one (with the bytes
// it expects), once those bytes have landed. Before any other thread uses
// it: a __syncthreads.
__device__ __forceinline__ void barrier_init(unsigned bar, unsigned count = 1) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// Makes the initialized barriers visible to the copy engine.
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// The one arrival of this phase, announcing `bytes` of copies.
__device__ __forceinline__ void arrive_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}

// One plain arrival (no bytes): a consumer handing a stage back.
__device__ __forceinline__ void arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// Waits for the phase of parity `parity` to complete (its bytes landed and
// visible to the waiting thread).
__device__ __forceinline__ void wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "wait_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra wait_%=;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

// bytes (a multiple of 16) from global memory at src into shared memory at dst (both 16-byte
// aligned), counted on bar: a plain bulk copy, no tensor map.
__device__ __forceinline__ void copy_1d(unsigned dst, const void *src, unsigned bytes,
                                        unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                 "%2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

// The box of a 3-D tensor map at (c0, c1, c2) into shared memory at dst,
// counted on bar. The map lives in kernel parameter space (a
// __grid_constant__ argument): its generic address is what the copy takes.
__device__ __forceinline__ void copy_3d(unsigned dst, const void *map, int c0, int c1, int c2,
                                        unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
}

// The box of a 2-D tensor map at (c0, c1) (c0 the inner coordinate), as
// copy_3d.
__device__ __forceinline__ void copy_2d(unsigned dst, const void *map, int c0, int c1,
                                        unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}

// The box of a 2-D tensor map at (c0, c1) from shared memory at src, a
// bulk group of its own once committed. Parts of the box past the
// tensor's dims are not written. The writing threads must have made src
// visible to the async proxy (fence.proxy.async) first.
__device__ __forceinline__ void store_2d(const void *map, unsigned src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
                 ::"l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(src)
                 : "memory");
}

// Closes the bulk group of the stores issued since the last commit.
__device__ __forceinline__ void store_commit() {
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until at most N of this thread's committed store groups are still
// reading their shared memory (the source may be overwritten then).
template <int N> __device__ __forceinline__ void store_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// Waits until all of this thread's committed store groups are complete
// (written to global memory).
__device__ __forceinline__ void store_wait_all() {
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

}  // namespace tma
}  // namespace stof
