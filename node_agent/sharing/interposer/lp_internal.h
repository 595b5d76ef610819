/* Internal interfaces shared by the interposer's files. Nothing here is exported from the library
 * except the CUDA entry points it wraps (and dlsym), which carry LP_EXPORT. */
#ifndef LP_INTERNAL_H
#define LP_INTERNAL_H

#include <limits.h>
#include <stdint.h>
#include <sys/types.h>

#include "lp_cuda_types.h"

/* The library is loaded into containers whose C library may be older than the build machine's: bind
 * the few entry points that glibc 2.33/2.34 gave new symbol versions to their original versions, so
 * that a build on a current distribution still loads with glibc 2.17 and later. */
#if defined(__GLIBC__) && !defined(LP_NO_SYMVER)
#if defined(__x86_64__)
#define LP_GLIBC_BASE "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define LP_GLIBC_BASE "GLIBC_2.17"
#endif
#endif
#ifdef LP_GLIBC_BASE
__asm__(".symver dlopen,dlopen@" LP_GLIBC_BASE);
__asm__(".symver dlerror,dlerror@" LP_GLIBC_BASE);
__asm__(".symver dlvsym,dlvsym@" LP_GLIBC_BASE);
__asm__(".symver pthread_once,pthread_once@" LP_GLIBC_BASE);
#endif

#define LP_EXPORT __attribute__((visibility("default")))
#define LP_HIDDEN __attribute__((visibility("hidden")))

#define LP_MAX_DEVICES 16

/* Driver entry points the interposer wraps: exported under the driver's own names. */
#define LP_HOOKED_FUNCS(X)                                                                             \
    X(cuMemAlloc_v2, (CUdeviceptr *, size_t))                                                          \
    X(cuMemAllocPitch_v2, (CUdeviceptr *, size_t *, size_t, size_t, unsigned int))                     \
    X(cuMemAllocManaged, (CUdeviceptr *, size_t, unsigned int))                                        \
    X(cuMemAllocAsync, (CUdeviceptr *, size_t, CUstream))                                              \
    X(cuMemAllocAsync_ptsz, (CUdeviceptr *, size_t, CUstream))                                         \
    X(cuMemAllocFromPoolAsync, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))                        \
    X(cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))                   \
    X(cuMemFree_v2, (CUdeviceptr))                                                                     \
    X(cuMemFreeAsync, (CUdeviceptr, CUstream))                                                         \
    X(cuMemFreeAsync_ptsz, (CUdeviceptr, CUstream))                                                    \
    X(cuMemCreate, (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long)) \
    X(cuMemRelease, (CUmemGenericAllocationHandle))                                                    \
    X(cuArrayCreate_v2, (CUarray *, const CUDA_ARRAY_DESCRIPTOR *))                                    \
    X(cuArray3DCreate_v2, (CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *))                                \
    X(cuArrayDestroy, (CUarray))                                                                       \
    X(cuMipmappedArrayCreate, (CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int))     \
    X(cuMipmappedArrayDestroy, (CUmipmappedArray))                                                     \
    X(cuMemGetInfo_v2, (size_t *, size_t *))                                                           \
    X(cuDeviceTotalMem_v2, (size_t *, CUdevice))                                                       \
    X(cuLaunchKernel, (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,              \
                       unsigned int, unsigned int, unsigned int, CUstream, void **, void **))           \
    X(cuLaunchKernel_ptsz, (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,         \
                            unsigned int, unsigned int, unsigned int, CUstream, void **, void **))      \
    X(cuLaunchKernelEx, (const CUlaunchConfig *, CUfunction, void **, void **))                        \
    X(cuLaunchKernelEx_ptsz, (const CUlaunchConfig *, CUfunction, void **, void **))                   \
    X(cuLaunchCooperativeKernel, (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,   \
                                  unsigned int, unsigned int, unsigned int, CUstream, void **))         \
    X(cuLaunchCooperativeKernel_ptsz, (CUfunction, unsigned int, unsigned int, unsigned int,           \
                                       unsigned int, unsigned int, unsigned int, unsigned int, CUstream, \
                                       void **))                                                       \
    X(cuGraphLaunch, (CUgraphExec, CUstream))                                                          \
    X(cuGraphLaunch_ptsz, (CUgraphExec, CUstream))                                                     \
    X(cuGetProcAddress, (const char *, void **, int, cuuint64_t))                                      \
    X(cuGetProcAddress_v2, (const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *))

/* Driver entry points the interposer only calls. */
#define LP_HELPER_FUNCS(X)                                                                             \
    X(cuCtxGetCurrent, (CUcontext *))                                                                  \
    X(cuCtxGetDevice, (CUdevice *))                                                                    \
    X(cuDeviceGetUuid, (CUuuid *, CUdevice))                                                           \
    X(cuEventCreate, (CUevent *, unsigned int))                                                        \
    X(cuEventRecord, (CUevent, CUstream))                                                              \
    X(cuEventQuery, (CUevent))                                                                         \
    X(cuEventElapsedTime, (float *, CUevent, CUevent))                                                 \
    X(cuEventDestroy_v2, (CUevent))                                                                    \
    X(cuStreamIsCapturing, (CUstream, int *))

#define LP_DECLARE_REAL(name, args)                                                                    \
    typedef CUresult(*lp_pfn_##name) args;                                                             \
    extern LP_HIDDEN lp_pfn_##name lp_real_##name;
LP_HOOKED_FUNCS(LP_DECLARE_REAL)
LP_HELPER_FUNCS(LP_DECLARE_REAL)
#undef LP_DECLARE_REAL

#define LP_DECLARE_WRAPPER(name, args) extern LP_EXPORT CUresult name args;
LP_HOOKED_FUNCS(LP_DECLARE_WRAPPER)
#undef LP_DECLARE_WRAPPER

enum lp_priority { LP_PRIO_NORMAL = 0, LP_PRIO_HIGH = 1, LP_PRIO_LOW = 2 };

struct lp_config {
    int enabled;                           /* LINKPACK_INTERPOSER != off */
    int any_mem_cap;                       /* some device has a memory cap */
    uint64_t mem_cap[LP_MAX_DEVICES];      /* bytes; 0 = no cap */
    int units[LP_MAX_DEVICES];             /* compute units; 0 = no quota */
    int units_per_gpu;                     /* LINKPACK_UNITS_PER_GPU, default 100 */
    int any_quota;                         /* some device has 0 < units < units_per_gpu */
    int priority;                          /* enum lp_priority */
    uint64_t window_ns;                    /* pacing window (LINKPACK_COMPUTE_WINDOW_MS) */
    uint64_t hold_ns;                      /* how long a high-priority launch marks the GPU busy */
    char accounting_path[PATH_MAX];
    char state_dir[PATH_MAX];              /* empty: no priority coordination */
    char real_lib[PATH_MAX];
};

extern LP_HIDDEN struct lp_config lp_cfg;

/* linkpack_cuda.c */
LP_HIDDEN void lp_init(void);                 /* reads the environment once */
LP_HIDDEN int lp_enabled(void);               /* lp_init + kill switch */
LP_HIDDEN int lp_driver(void);                /* real driver loaded and resolved (1) or not (0) */
LP_HIDDEN CUresult lp_missing(const char *name); /* reports a missing real entry point */
LP_HIDDEN void lp_report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
LP_HIDDEN int lp_current_device(int *dev);    /* 0 when the current context's device is known */
LP_HIDDEN uint64_t lp_now_ns(void);
LP_HIDDEN void lp_sleep_ns(uint64_t ns);

/* lp_memory.c */
enum lp_kind { LP_KIND_DPTR = 1, LP_KIND_ARRAY = 2, LP_KIND_MIPMAP = 3, LP_KIND_VMM = 4 };

struct lp_bucket {                             /* compute token bucket, one per device and container */
    int64_t tokens_ns;
    uint64_t last_ns;
    uint64_t reserved[2];
};

LP_HIDDEN struct lp_bucket *lp_acct_bucket(int dev);
LP_HIDDEN void lp_memory_atfork_prepare(void);
LP_HIDDEN void lp_memory_atfork_parent(void);
LP_HIDDEN void lp_memory_atfork_child(void);

/* lp_compute.c */
LP_HIDDEN void lp_compute_atfork_prepare(void);
LP_HIDDEN void lp_compute_atfork_parent(void);
LP_HIDDEN void lp_compute_atfork_child(void);

#endif
