/* The CUDA driver API, opened at run time.
 *
 * stof does not link libcuda: a binary linked against it cannot even start on
 * a machine without the NVIDIA driver, and such machines must still be able
 * to build graphs, run the CPU reference, compile kernels through NVRTC and
 * write plans. The driver is opened on first use with dlopen, and every
 * entry point is resolved through cuGetProcAddress for the CUDA version the
 * headers describe, so versioned symbols (_v2, _v3...) come out right. */
#ifndef STOF_CORE_CUDA_DRIVER_H
#define STOF_CORE_CUDA_DRIVER_H

#include <cuda.h>

#include "stof.h"

/* field name, symbol's base name (a string), the cuda.h declaration to take
 * the type from. The declaration must be the one the driver hands out for
 * CUDA_VERSION: cuda.h keeps cuCtxSynchronize(void) for source compatibility,
 * but asking for "cuCtxSynchronize" at version 13000 returns
 * cuCtxSynchronize_v2(CUcontext) (NULL = the current context). */
#define CUDA_DRIVER_FUNCS(X)                                              \
    X(Init, "cuInit", cuInit)                                             \
    X(DriverGetVersion, "cuDriverGetVersion", cuDriverGetVersion)         \
    X(GetErrorName, "cuGetErrorName", cuGetErrorName)                     \
    X(GetErrorString, "cuGetErrorString", cuGetErrorString)               \
    X(DeviceGetCount, "cuDeviceGetCount", cuDeviceGetCount)               \
    X(DeviceGet, "cuDeviceGet", cuDeviceGet)                              \
    X(DeviceGetName, "cuDeviceGetName", cuDeviceGetName)                  \
    X(DeviceGetAttribute, "cuDeviceGetAttribute", cuDeviceGetAttribute)   \
    X(DeviceTotalMem, "cuDeviceTotalMem", cuDeviceTotalMem)               \
    X(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain) \
    X(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease) \
    X(CtxSetCurrent, "cuCtxSetCurrent", cuCtxSetCurrent)                  \
    X(CtxSynchronize, "cuCtxSynchronize", cuCtxSynchronize_v2)            \
    X(MemGetInfo, "cuMemGetInfo", cuMemGetInfo)                           \
    X(MemAlloc, "cuMemAlloc", cuMemAlloc)                                 \
    X(MemFree, "cuMemFree", cuMemFree)                                    \
    X(MemAllocHost, "cuMemAllocHost", cuMemAllocHost)                     \
    X(MemFreeHost, "cuMemFreeHost", cuMemFreeHost)                        \
    X(MemHostGetDevicePointer, "cuMemHostGetDevicePointer", cuMemHostGetDevicePointer) \
    X(MemcpyHtoD, "cuMemcpyHtoD", cuMemcpyHtoD)                           \
    X(MemcpyDtoH, "cuMemcpyDtoH", cuMemcpyDtoH)                           \
    X(MemcpyHtoDAsync, "cuMemcpyHtoDAsync", cuMemcpyHtoDAsync)            \
    X(MemcpyDtoHAsync, "cuMemcpyDtoHAsync", cuMemcpyDtoHAsync)            \
    X(MemcpyDtoDAsync, "cuMemcpyDtoDAsync", cuMemcpyDtoDAsync)            \
    X(MemsetD8Async, "cuMemsetD8Async", cuMemsetD8Async)                  \
    X(MemsetD16Async, "cuMemsetD16Async", cuMemsetD16Async)               \
    X(MemsetD32Async, "cuMemsetD32Async", cuMemsetD32Async)               \
    X(ModuleLoadData, "cuModuleLoadData", cuModuleLoadData)               \
    X(ModuleUnload, "cuModuleUnload", cuModuleUnload)                     \
    X(ModuleGetFunction, "cuModuleGetFunction", cuModuleGetFunction)      \
    X(FuncSetAttribute, "cuFuncSetAttribute", cuFuncSetAttribute)         \
    X(FuncGetAttribute, "cuFuncGetAttribute", cuFuncGetAttribute)         \
    X(LaunchKernel, "cuLaunchKernel", cuLaunchKernel)                     \
    X(LaunchKernelEx, "cuLaunchKernelEx", cuLaunchKernelEx)               \
    X(OccupancyMaxActiveClusters, "cuOccupancyMaxActiveClusters", cuOccupancyMaxActiveClusters) \
    X(OccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor", \
      cuOccupancyMaxActiveBlocksPerMultiprocessor)                        \
    X(StreamCreate, "cuStreamCreate", cuStreamCreate)                     \
    X(StreamDestroy, "cuStreamDestroy", cuStreamDestroy)                  \
    X(StreamSynchronize, "cuStreamSynchronize", cuStreamSynchronize)      \
    X(StreamWaitEvent, "cuStreamWaitEvent", cuStreamWaitEvent)            \
    X(StreamIsCapturing, "cuStreamIsCapturing", cuStreamIsCapturing)      \
    X(StreamBeginCapture, "cuStreamBeginCapture", cuStreamBeginCapture)   \
    X(StreamEndCapture, "cuStreamEndCapture", cuStreamEndCapture)         \
    X(GraphInstantiate, "cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags) \
    X(GraphLaunch, "cuGraphLaunch", cuGraphLaunch)                        \
    X(GraphExecDestroy, "cuGraphExecDestroy", cuGraphExecDestroy)         \
    X(GraphDestroy, "cuGraphDestroy", cuGraphDestroy)                     \
    X(GraphGetEdges, "cuGraphGetEdges", cuGraphGetEdges)                  \
    X(EventCreate, "cuEventCreate", cuEventCreate)                        \
    X(EventRecord, "cuEventRecord", cuEventRecord)                        \
    X(EventRecordWithFlags, "cuEventRecordWithFlags", cuEventRecordWithFlags) \
    X(EventSynchronize, "cuEventSynchronize", cuEventSynchronize)         \
    X(EventElapsedTime, "cuEventElapsedTime", cuEventElapsedTime)         \
    X(EventDestroy, "cuEventDestroy", cuEventDestroy)                     \
    X(TensorMapEncodeTiled, "cuTensorMapEncodeTiled", cuTensorMapEncodeTiled)

typedef struct cuda_driver {
#define CUDA_DRIVER_FIELD(field, sym, decl) __typeof__(&decl) field;
    CUDA_DRIVER_FUNCS(CUDA_DRIVER_FIELD)
#undef CUDA_DRIVER_FIELD
    int version; /* cuDriverGetVersion */
} cuda_driver;

/* Opens the driver once per process and initialises it. STOF_ERR_NO_DEVICE
 * with the reason ("libcuda.so.1 not found: no NVIDIA driver on this
 * machine", "cuInit: CUDA_ERROR_NO_DEVICE ...") when it cannot. */
int cuda_driver_get(const cuda_driver **out, stof_error *err);

/* Launches f with grid[3] x block[3] threads and smem bytes of dynamic
 * shared memory on s. pdl: as a programmatic dependent launch (sm_90+):
 * the kernel may be scheduled before the previous kernel in s has
 * finished, and must wait for it (griddepcontrol.wait, as every kernel of
 * kernels/ does first) before reading what it wrote. what names the call in
 * errors. */
int cuda_launch(const cuda_driver *drv, CUfunction f, const unsigned *grid, const unsigned *block,
                unsigned smem, CUstream s, void **params, int pdl, const char *what,
                stof_error *err);
/* The same in clusters of cluster_x consecutive blocks along x (sm_90+;
 * grid[0] a multiple of it), so that they can read each other's shared
 * memory; cluster_x = 1 is cuda_launch. */
int cuda_launch_cluster(const cuda_driver *drv, CUfunction f, const unsigned *grid,
                        const unsigned *block, unsigned smem, CUstream s, void **params, int pdl,
                        unsigned cluster_x, const char *what, stof_error *err);

/* Turns a CUresult into a stof status and message naming the call. */
int cuda_check(const cuda_driver *drv, CUresult rc, const char *what, stof_error *err);

#endif
