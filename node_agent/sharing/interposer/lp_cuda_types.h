/* The few CUDA driver API types, constants and structures the interposer touches, declared here so
 * that no CUDA header is needed to build it. Values and layouts follow the driver ABI (cuda.h).
 * The tests' fake driver and probe programs (tests/interposer) include this same header; the layout
 * checks at the end hold it to cuda.h's sizes and offsets on 64-bit targets. */
#ifndef LP_CUDA_TYPES_H
#define LP_CUDA_TYPES_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef uint64_t cuuint64_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUfunc_st *CUfunction;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUlaunchAttribute_st CUlaunchAttribute;
typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
};

/* cuGetProcAddress flags and the _v2 query result */
enum {
    CU_GET_PROC_ADDRESS_DEFAULT = 0,
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1 << 0,
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 1 << 1,
};
typedef int CUdriverProcAddressQueryResult;

/* special stream handles */
#define LP_CU_STREAM_LEGACY ((CUstream)0x1)
#define LP_CU_STREAM_PER_THREAD ((CUstream)0x2)

enum { CU_STREAM_CAPTURE_STATUS_NONE = 0 };
enum { CU_EVENT_DEFAULT = 0, CU_EVENT_DISABLE_TIMING = 2 };
enum { CU_MEM_LOCATION_TYPE_DEVICE = 1 };
enum { CU_AD_FORMAT_FLOAT = 0x20 }; /* a CUarray_format */

typedef struct CUmemLocation_st {
    int type;
    int id;
} CUmemLocation;

typedef struct CUmemAllocationProp_st {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct CUDA_ARRAY_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    int Format; /* CUarray_format */
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    size_t Depth;
    int Format; /* CUarray_format */
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

/* CUDA_ARRAY3D_* flags that change how much memory an array holds */
#define LP_CUDA_ARRAY3D_LAYERED 0x01u
#define LP_CUDA_ARRAY3D_CUBEMAP 0x04u
#define LP_CUDA_ARRAY3D_SPARSE 0x40u
#define LP_CUDA_ARRAY3D_DEFERRED_MAPPING 0x80u

typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

/* cuda.h's sizes and offsets on LP64 targets, where the library runs: a slip in the declarations above
 * fails the build of the interposer and of the tests' fake driver alike. */
#if defined(__LP64__)
#define LP_LAYOUT(cond) _Static_assert(cond, "CUDA ABI layout: " #cond)
LP_LAYOUT(sizeof(CUuuid) == 16);
LP_LAYOUT(sizeof(CUmemLocation) == 8);
LP_LAYOUT(sizeof(CUmemAllocationProp) == 32);
LP_LAYOUT(offsetof(CUmemAllocationProp, location) == 8);
LP_LAYOUT(offsetof(CUmemAllocationProp, win32HandleMetaData) == 16);
LP_LAYOUT(offsetof(CUmemAllocationProp, allocFlags) == 24);
LP_LAYOUT(sizeof(CUDA_ARRAY_DESCRIPTOR) == 24);
LP_LAYOUT(offsetof(CUDA_ARRAY_DESCRIPTOR, Format) == 16);
LP_LAYOUT(offsetof(CUDA_ARRAY_DESCRIPTOR, NumChannels) == 20);
LP_LAYOUT(sizeof(CUDA_ARRAY3D_DESCRIPTOR) == 40);
LP_LAYOUT(offsetof(CUDA_ARRAY3D_DESCRIPTOR, Format) == 24);
LP_LAYOUT(offsetof(CUDA_ARRAY3D_DESCRIPTOR, NumChannels) == 28);
LP_LAYOUT(offsetof(CUDA_ARRAY3D_DESCRIPTOR, Flags) == 32);
LP_LAYOUT(sizeof(CUlaunchConfig) == 56);
LP_LAYOUT(offsetof(CUlaunchConfig, hStream) == 32);
LP_LAYOUT(offsetof(CUlaunchConfig, numAttrs) == 48);
#undef LP_LAYOUT
#endif

#endif
