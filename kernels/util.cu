// Utility kernels: poisoning buffers before a kernel under test runs (so an
// unwritten output is caught), and converting fp32 host values to the model
// dtype on the device.
#include "common.cuh"

#ifndef STOF_DTYPE
#define STOF_DTYPE 1
#endif

using elem_t = typename stof::dtype_of<STOF_DTYPE>::type;

// Fills n 16-bit words with a pattern (0x7e00 is a quiet NaN in fp16; 0x7fc0 in bf16).
extern "C" __global__ void stof_poison16(unsigned short *p, long long n, unsigned short pattern) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        p[i] = pattern;
}

// out[i] = (elem_t) in[i]
extern "C" __global__ void stof_convert_from_f32(const float *in, elem_t *out, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        out[i] = stof::from_float<elem_t>(in[i]);
}

// out[i] = (float) in[i]
extern "C" __global__ void stof_convert_to_f32(const elem_t *in, float *out, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        out[i] = stof::to_float(in[i]);
}

// Asks L2 for bytes (a multiple of 16) from base (16-byte aligned), in pieces of 16 KiB split
// over the grid's threads, and returns without waiting for any of it (sm_90's bulk prefetch;
// nothing elsewhere). A hint: nothing is read into registers, nothing is written. The host
// spreads the pieces over many blocks: one SM's copy engine alone takes them slowly.
extern "C" __global__ void stof_prefetch_l2(const char *base, long long bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const long long piece = 16 * 1024;
    for (long long at = (blockIdx.x * (long long)blockDim.x + threadIdx.x) * piece; at < bytes;
         at += (long long)gridDim.x * blockDim.x * piece) {
        const long long left = bytes - at;
        const unsigned n = (unsigned)(left < piece ? left : piece);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + at), "r"(n)
                     : "memory");
    }
#endif
}
