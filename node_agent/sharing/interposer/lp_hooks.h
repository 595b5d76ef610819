/* The driver entry points the interposer touches: the one list of what it hooks, as X-macros.
 *
 * Expanded by the interposer (the wrappers' declarations, the real entry points it resolves, the
 * dlsym and cuGetProcAddress maps) and by its tests (the fake driver's declarations and its
 * cuGetProcAddress table, the probe programs' declarations); tests/interposer/conftest.py reads this
 * file so that a test checks every entry of LP_HOOKED_FUNCS. */
#ifndef LP_HOOKS_H
#define LP_HOOKS_H

#include "lp_cuda_types.h"

/* LP_HOOKED_FUNCS(X): every entry point the interposer wraps, exported under the driver's own name,
 * as X(name, family, since, per_thread, args): cuGetProcAddress(family, version, flags) answers with
 * `name` from CUDA version `since` on (1000 * major + 10 * minor), for the per-thread default stream
 * (CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) where per_thread is 1. */
#define LP_HOOKED_FUNCS(X)                                                                                             \
    X(cuMemAlloc_v2, cuMemAlloc, 3020, 0, (CUdeviceptr *, size_t))                                                     \
    X(cuMemAllocPitch_v2, cuMemAllocPitch, 3020, 0, (CUdeviceptr *, size_t *, size_t, size_t, unsigned int))           \
    X(cuMemAllocManaged, cuMemAllocManaged, 6000, 0, (CUdeviceptr *, size_t, unsigned int))                            \
    X(cuMemAllocAsync, cuMemAllocAsync, 11020, 0, (CUdeviceptr *, size_t, CUstream))                                   \
    X(cuMemAllocAsync_ptsz, cuMemAllocAsync, 11020, 1, (CUdeviceptr *, size_t, CUstream))                              \
    X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 11020, 0, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))     \
    X(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync, 11020, 1,                                                 \
      (CUdeviceptr *, size_t, CUmemoryPool, CUstream))                                                                 \
    X(cuMemFree_v2, cuMemFree, 3020, 0, (CUdeviceptr))                                                                 \
    X(cuMemFreeAsync, cuMemFreeAsync, 11020, 0, (CUdeviceptr, CUstream))                                               \
    X(cuMemFreeAsync_ptsz, cuMemFreeAsync, 11020, 1, (CUdeviceptr, CUstream))                                          \
    X(cuMemCreate, cuMemCreate, 10020, 0,                                                                              \
      (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long))                       \
    X(cuMemRelease, cuMemRelease, 10020, 0, (CUmemGenericAllocationHandle))                                            \
    X(cuArrayCreate_v2, cuArrayCreate, 3020, 0, (CUarray *, const CUDA_ARRAY_DESCRIPTOR *))                            \
    X(cuArray3DCreate_v2, cuArray3DCreate, 3020, 0, (CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *))                      \
    X(cuArrayDestroy, cuArrayDestroy, 2000, 0, (CUarray))                                                              \
    X(cuMipmappedArrayCreate, cuMipmappedArrayCreate, 5000, 0,                                                         \
      (CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int))                                             \
    X(cuMipmappedArrayDestroy, cuMipmappedArrayDestroy, 5000, 0, (CUmipmappedArray))                                   \
    X(cuMemGetInfo_v2, cuMemGetInfo, 3020, 0, (size_t *, size_t *))                                                    \
    X(cuDeviceTotalMem_v2, cuDeviceTotalMem, 3020, 0, (size_t *, CUdevice))                                            \
    X(cuLaunchKernel, cuLaunchKernel, 4000, 0,                                                                         \
      (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,   \
       CUstream, void **, void **))                                                                                    \
    X(cuLaunchKernel_ptsz, cuLaunchKernel, 7000, 1,                                                                    \
      (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,   \
       CUstream, void **, void **))                                                                                    \
    X(cuLaunchKernelEx, cuLaunchKernelEx, 11060, 0, (const CUlaunchConfig *, CUfunction, void **, void **))            \
    X(cuLaunchKernelEx_ptsz, cuLaunchKernelEx, 11060, 1, (const CUlaunchConfig *, CUfunction, void **, void **))       \
    X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel, 9000, 0,                                                   \
      (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,   \
       CUstream, void **))                                                                                             \
    X(cuLaunchCooperativeKernel_ptsz, cuLaunchCooperativeKernel, 9000, 1,                                              \
      (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,   \
       CUstream, void **))                                                                                             \
    X(cuGraphLaunch, cuGraphLaunch, 10000, 0, (CUgraphExec, CUstream))                                                 \
    X(cuGraphLaunch_ptsz, cuGraphLaunch, 10000, 1, (CUgraphExec, CUstream))                                            \
    X(cuGetProcAddress, cuGetProcAddress, 11030, 0, (const char *, void **, int, cuuint64_t))                          \
    X(cuGetProcAddress_v2, cuGetProcAddress, 12000, 0,                                                                 \
      (const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *))

/* LP_LEGACY_FUNCS(X): X(family, since) for the 32-bit legacy entry points of hooked families (CUDA
 * before 3.2, named as their family), which the interposer does not wrap: calls through them pass
 * straight to the driver, and a program asking for one is reported. */
#define LP_LEGACY_FUNCS(X)                                                                                             \
    X(cuMemAlloc, 2000)                                                                                                \
    X(cuMemAllocPitch, 2000)                                                                                           \
    X(cuMemFree, 2000)                                                                                                 \
    X(cuArrayCreate, 2000)                                                                                             \
    X(cuArray3DCreate, 2000)                                                                                           \
    X(cuMemGetInfo, 2000)                                                                                              \
    X(cuDeviceTotalMem, 2000)

/* LP_HELPER_FUNCS(X): X(name, args) for the entry points the interposer only calls. */
#define LP_HELPER_FUNCS(X)                                                                                             \
    X(cuCtxGetCurrent, (CUcontext *))                                                                                  \
    X(cuCtxGetDevice, (CUdevice *))                                                                                    \
    X(cuDeviceGetUuid, (CUuuid *, CUdevice))                                                                           \
    X(cuEventCreate, (CUevent *, unsigned int))                                                                        \
    X(cuEventRecord, (CUevent, CUstream))                                                                              \
    X(cuEventQuery, (CUevent))                                                                                         \
    X(cuEventElapsedTime, (float *, CUevent, CUevent))                                                                 \
    X(cuEventDestroy_v2, (CUevent))                                                                                    \
    X(cuStreamIsCapturing, (CUstream, int *))

#endif
