/* A stand-in libcuda.so.1 for testing the interposer without a GPU.
 *
 * It implements the driver API subset the interposer hooks and calls, with the driver's ABI:
 *   - devices (FAKE_CUDA_DEVICES, default 1) with a big memory pool each (FAKE_CUDA_MEMORY_MIB,
 *     default 80 GiB) so that the interposer's caps are what fail first;
 *   - contexts, streams, events with GPU timestamps, cuGetProcAddress(_v2) with versioned and
 *     per-thread-stream variants;
 *   - kernels that take a set time: a CUfunction (or CUgraphExec) handle is its duration in
 *     microseconds. A device runs one kernel at a time: a kernel starts when its stream's previous
 *     work and the device's previous kernel are done. With FAKE_CUDA_SHARED_DEVICE=<file> the
 *     device's timeline lives in that file, so several processes share one "GPU".
 * A launch blocks while its stream has more than FAKE_CUDA_MAX_AHEAD_MS (default 200) of work
 * queued, as a real launch queue fills up. fake_cuda_stats() and fake_cuda_lookup() are for tests.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct fake_ctx *CUcontext;
typedef struct fake_stream *CUstream;
typedef struct fake_event *CUevent;
typedef struct CUfunc_st *CUfunction;
typedef struct fake_array *CUarray;
typedef struct fake_array *CUmipmappedArray;
typedef struct fake_pool *CUmemoryPool;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct {
    char bytes[16];
} CUuuid;
typedef struct {
    int type, id;
} CUmemLocation;
typedef struct {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    unsigned char allocFlags[8];
} CUmemAllocationProp;
typedef struct {
    size_t Width, Height;
    int Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;
typedef struct {
    size_t Width, Height, Depth;
    int Format;
    unsigned int NumChannels, Flags;
} CUDA_ARRAY3D_DESCRIPTOR;
typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

enum {
    OK = 0,
    E_INVALID_VALUE = 1,
    E_OUT_OF_MEMORY = 2,
    E_NOT_INITIALIZED = 3,
    E_INVALID_DEVICE = 101,
    E_INVALID_CONTEXT = 201,
    E_INVALID_HANDLE = 400,
    E_NOT_FOUND = 500,
    E_NOT_READY = 600,
};

#define MAX_DEV 8
#define MIB (1024ULL * 1024ULL)

struct fake_ctx {
    int dev;
};
struct fake_stream {
    uint64_t end; /* when the work queued on it so far is done */
};
struct fake_event {
    int recorded;
    unsigned flags;
    uint64_t t;
};
struct fake_array {
    uint64_t bytes;
    int dev;
};
struct fake_pool {
    int dev;
};

struct alloc {
    uint64_t key;
    uint64_t bytes;
    int kind; /* 1 pointer, 2 vmm handle */
    int dev;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized, n_devices = 1;
static uint64_t total_bytes = 80ULL * 1024 * MIB, max_ahead_ns = 200000000ULL;
static uint64_t used[MAX_DEV], next_addr[MAX_DEV];
static struct alloc *allocs;
static size_t n_allocs, cap_allocs;
static uint64_t next_vmm = 0x1000;
static uint64_t local_free[MAX_DEV];
static uint64_t *dev_free = local_free; /* per device: when its last kernel ends */
static struct fake_stream legacy_stream;
static __thread struct fake_stream ptds_stream;
static __thread struct fake_ctx *current;
static struct fake_ctx primary[MAX_DEV];
static struct fake_pool default_pool[MAX_DEV];
static uint64_t stat_alloc_calls, stat_launches, stat_busy_ns;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t) {
    uint64_t n = now_ns();
    if (t <= n)
        return;
    uint64_t d = t - n;
    struct timespec ts = {(time_t)(d / 1000000000ULL), (long)(d % 1000000000ULL)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

static uint64_t env_u64(const char *name, uint64_t dflt) {
    const char *v = getenv(name);
    return v && *v ? strtoull(v, NULL, 10) : dflt;
}

/* ------------------------------------------------------------------------------------------------ */

static CUresult do_init(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    if (!initialized) {
        n_devices = (int)env_u64("FAKE_CUDA_DEVICES", 1);
        if (n_devices < 1 || n_devices > MAX_DEV)
            n_devices = 1;
        total_bytes = env_u64("FAKE_CUDA_MEMORY_MIB", 80 * 1024) * MIB;
        max_ahead_ns = env_u64("FAKE_CUDA_MAX_AHEAD_MS", 200) * 1000000ULL;
        for (int d = 0; d < MAX_DEV; d++) {
            next_addr[d] = 0x700000000000ULL + (uint64_t)d * 0x10000000000ULL;
            primary[d].dev = d;
            default_pool[d].dev = d;
        }
        const char *shared = getenv("FAKE_CUDA_SHARED_DEVICE");
        if (shared && *shared) {
            int fd = open(shared, O_RDWR | O_CREAT, 0666);
            if (fd >= 0 && ftruncate(fd, 4096) == 0) {
                void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (m != MAP_FAILED)
                    dev_free = m;
            }
            if (fd >= 0)
                close(fd);
        }
        initialized = 1;
    }
    pthread_mutex_unlock(&lock);
    return OK;
}

static int current_dev(int *dev) {
    if (!current)
        return -1;
    *dev = current->dev;
    return 0;
}

/* ------------------------------------------------------------------------------------------------
 * memory */

static CUresult mem_alloc(int dev, uint64_t bytes, int kind, uint64_t *key) {
    pthread_mutex_lock(&lock);
    stat_alloc_calls++;
    if (!bytes) {
        pthread_mutex_unlock(&lock);
        return E_INVALID_VALUE;
    }
    if (bytes > total_bytes - used[dev]) {
        pthread_mutex_unlock(&lock);
        return E_OUT_OF_MEMORY;
    }
    if (n_allocs == cap_allocs) {
        size_t ncap = cap_allocs ? cap_allocs * 2 : 256;
        struct alloc *n = realloc(allocs, ncap * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&lock);
            return E_OUT_OF_MEMORY;
        }
        allocs = n;
        cap_allocs = ncap;
    }
    uint64_t k;
    if (kind == 1) {
        k = next_addr[dev];
        next_addr[dev] += (bytes + 4 * MIB - 1) / (2 * MIB) * (2 * MIB);
    } else {
        k = next_vmm++;
    }
    allocs[n_allocs++] = (struct alloc){k, bytes, kind, dev};
    used[dev] += bytes;
    *key = k;
    pthread_mutex_unlock(&lock);
    return OK;
}

static CUresult mem_free(uint64_t key, int kind) {
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < n_allocs; i++) {
        if (allocs[i].key == key && allocs[i].kind == kind) {
            used[allocs[i].dev] -= allocs[i].bytes;
            allocs[i] = allocs[--n_allocs];
            pthread_mutex_unlock(&lock);
            return OK;
        }
    }
    pthread_mutex_unlock(&lock);
    return E_INVALID_VALUE;
}

static CUresult alloc_here(CUdeviceptr *p, uint64_t bytes) {
    int dev;
    if (!p)
        return E_INVALID_VALUE;
    if (current_dev(&dev))
        return E_INVALID_CONTEXT;
    uint64_t k = 0;
    CUresult rc = mem_alloc(dev, bytes, 1, &k);
    if (rc == OK)
        *p = k;
    return rc;
}

static CUresult array_new(struct fake_array **out, uint64_t bytes) {
    int dev;
    if (!out)
        return E_INVALID_VALUE;
    if (current_dev(&dev))
        return E_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    stat_alloc_calls++;
    if (bytes > total_bytes - used[dev]) {
        pthread_mutex_unlock(&lock);
        return E_OUT_OF_MEMORY;
    }
    struct fake_array *a = malloc(sizeof *a);
    if (!a) {
        pthread_mutex_unlock(&lock);
        return E_OUT_OF_MEMORY;
    }
    a->bytes = bytes;
    a->dev = dev;
    used[dev] += bytes;
    pthread_mutex_unlock(&lock);
    *out = a;
    return OK;
}

static CUresult array_free(struct fake_array *a) {
    if (!a)
        return E_INVALID_HANDLE;
    pthread_mutex_lock(&lock);
    used[a->dev] -= a->bytes;
    pthread_mutex_unlock(&lock);
    free(a);
    return OK;
}

static uint64_t array_size(size_t w, size_t h, size_t d, unsigned ch) {
    return (uint64_t)(w ? w : 1) * (h ? h : 1) * (d ? d : 1) * (ch ? ch : 1) * 4;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) { return alloc_here(p, bytes); }
EXPORT CUresult cuMemAlloc(unsigned int *p, unsigned int bytes) { /* the 32-bit legacy entry point */
    CUdeviceptr q = 0;
    CUresult rc = alloc_here(&q, bytes);
    if (rc == OK && p)
        *p = (unsigned int)q;
    return rc;
}
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t width, size_t height, unsigned int elem) {
    (void)elem;
    if (!pitch)
        return E_INVALID_VALUE;
    size_t pt = (width + 511) / 512 * 512;
    CUresult rc = alloc_here(p, (uint64_t)pt * height);
    if (rc == OK)
        *pitch = pt;
    return rc;
}
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t bytes, unsigned int flags) {
    (void)flags;
    return alloc_here(p, bytes);
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t bytes, CUstream s) {
    (void)s;
    return alloc_here(p, bytes);
}
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t bytes, CUstream s) {
    (void)s;
    return alloc_here(p, bytes);
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t bytes, CUmemoryPool pool, CUstream s) {
    (void)s;
    return pool ? alloc_here(p, bytes) : E_INVALID_VALUE;
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t bytes, CUmemoryPool pool, CUstream s) {
    (void)s;
    return pool ? alloc_here(p, bytes) : E_INVALID_VALUE;
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) { return mem_free(p, 1); }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    (void)s;
    return mem_free(p, 1);
}
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
    (void)s;
    return mem_free(p, 1);
}
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
    (void)flags;
    if (!h || !prop || prop->location.id < 0 || prop->location.id >= n_devices)
        return E_INVALID_VALUE;
    uint64_t k = 0;
    CUresult rc = mem_alloc(prop->location.id, size, 2, &k);
    if (rc == OK)
        *h = k;
    return rc;
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return mem_free(h, 2); }
EXPORT CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d) {
    return d ? array_new(a, array_size(d->Width, d->Height, 1, d->NumChannels)) : E_INVALID_VALUE;
}
EXPORT CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    return d ? array_new(a, array_size(d->Width, d->Height, d->Depth, d->NumChannels)) : E_INVALID_VALUE;
}
EXPORT CUresult cuArrayDestroy(CUarray a) { return array_free(a); }
EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels) {
    (void)levels;
    return d ? array_new(a, array_size(d->Width, d->Height, d->Depth, d->NumChannels) * 4 / 3)
             : E_INVALID_VALUE;
}
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) { return array_free(a); }
EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b) {
    int dev;
    if (!free_b || !total_b)
        return E_INVALID_VALUE;
    if (current_dev(&dev))
        return E_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    *free_b = total_bytes - used[dev];
    *total_b = total_bytes;
    pthread_mutex_unlock(&lock);
    return OK;
}
EXPORT CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total_b) {
    size_t f, t;
    CUresult rc = cuMemGetInfo_v2(&f, &t);
    if (rc == OK) {
        *free_b = f > 0xffffffffu ? 0xffffffffu : (unsigned)f;
        *total_b = t > 0xffffffffu ? 0xffffffffu : (unsigned)t;
    }
    return rc;
}
EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    if (!bytes || dev < 0 || dev >= n_devices)
        return E_INVALID_VALUE;
    *bytes = total_bytes;
    return OK;
}
EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
    if (!pool || dev < 0 || dev >= n_devices)
        return E_INVALID_VALUE;
    *pool = &default_pool[dev];
    return OK;
}

/* ------------------------------------------------------------------------------------------------
 * devices, contexts */

EXPORT CUresult cuInit(unsigned int flags) { return do_init(flags); }
EXPORT CUresult cuDriverGetVersion(int *v) {
    if (!v)
        return E_INVALID_VALUE;
    *v = 12040;
    return OK;
}
EXPORT CUresult cuDeviceGetCount(int *n) {
    if (!initialized)
        return E_NOT_INITIALIZED;
    *n = n_devices;
    return OK;
}
EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (!initialized)
        return E_NOT_INITIALIZED;
    if (!d || ordinal < 0 || ordinal >= n_devices)
        return E_INVALID_DEVICE;
    *d = ordinal;
    return OK;
}
EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) {
    if (!u || d < 0 || d >= n_devices)
        return E_INVALID_VALUE;
    for (int i = 0; i < 16; i++)
        u->bytes[i] = (char)(0xa0 + i + d);
    return OK;
}
static CUresult ctx_create(CUcontext *c, unsigned int flags, CUdevice d) {
    (void)flags;
    if (!initialized)
        return E_NOT_INITIALIZED;
    if (!c || d < 0 || d >= n_devices)
        return E_INVALID_VALUE;
    struct fake_ctx *x = malloc(sizeof *x);
    if (!x)
        return E_OUT_OF_MEMORY;
    x->dev = d;
    current = x;
    *c = x;
    return OK;
}
EXPORT CUresult cuCtxCreate_v2(CUcontext *c, unsigned int flags, CUdevice d) { return ctx_create(c, flags, d); }
EXPORT CUresult cuCtxCreate(CUcontext *c, unsigned int flags, CUdevice d) { return ctx_create(c, flags, d); }
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    if (!c || d < 0 || d >= n_devices)
        return E_INVALID_VALUE;
    *c = &primary[d];
    return OK;
}
EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
    current = c;
    return OK;
}
EXPORT CUresult cuCtxGetCurrent(CUcontext *c) {
    if (!c)
        return E_INVALID_VALUE;
    *c = current;
    return OK;
}
EXPORT CUresult cuCtxGetDevice(CUdevice *d) {
    if (!current)
        return E_INVALID_CONTEXT;
    *d = current->dev;
    return OK;
}
EXPORT CUresult cuCtxDestroy_v2(CUcontext c) {
    if (current == c)
        current = NULL;
    if (c && (c < primary || c >= primary + MAX_DEV))
        free(c);
    return OK;
}

/* ------------------------------------------------------------------------------------------------
 * streams, events, kernels */

static struct fake_stream *stream_of(CUstream s, int ptsz) {
    if (s == (CUstream)0x2 || (!s && ptsz))
        return &ptds_stream;
    if (!s || s == (CUstream)0x1)
        return &legacy_stream;
    return s;
}

static CUresult launch(CUstream hs, int ptsz, uint64_t us) {
    int dev;
    if (current_dev(&dev))
        return E_INVALID_CONTEXT;
    struct fake_stream *s = stream_of(hs, ptsz);
    uint64_t dur = us * 1000ULL;
    pthread_mutex_lock(&lock);
    uint64_t now = now_ns();
    if (s->end > now + max_ahead_ns) { /* the launch queue is full: wait as a real launch blocks */
        uint64_t until = s->end - max_ahead_ns;
        pthread_mutex_unlock(&lock);
        sleep_until(until);
        pthread_mutex_lock(&lock);
        now = now_ns();
    }
    uint64_t free_at = __atomic_load_n(&dev_free[dev], __ATOMIC_ACQUIRE), start, end;
    do {
        start = now > s->end ? now : s->end;
        start = start > free_at ? start : free_at;
        end = start + dur;
    } while (!__atomic_compare_exchange_n(&dev_free[dev], &free_at, end, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    s->end = end;
    stat_launches++;
    stat_busy_ns += dur;
    pthread_mutex_unlock(&lock);
    return OK;
}

EXPORT CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
    (void)flags;
    if (!s)
        return E_INVALID_VALUE;
    *s = calloc(1, sizeof **s);
    return *s ? OK : E_OUT_OF_MEMORY;
}
EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
    if (s && s != (CUstream)0x1 && s != (CUstream)0x2)
        free(s);
    return OK;
}
static CUresult stream_sync(CUstream s, int ptsz) {
    pthread_mutex_lock(&lock);
    uint64_t end = stream_of(s, ptsz)->end;
    pthread_mutex_unlock(&lock);
    sleep_until(end);
    return OK;
}
EXPORT CUresult cuStreamSynchronize(CUstream s) { return stream_sync(s, 0); }
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { return stream_sync(s, 1); }
EXPORT CUresult cuStreamIsCapturing(CUstream s, int *status) {
    (void)s;
    if (!status)
        return E_INVALID_VALUE;
    *status = 0;
    return OK;
}
EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream s, int *status) { return cuStreamIsCapturing(s, status); }
EXPORT CUresult cuCtxSynchronize(void) {
    int dev;
    if (current_dev(&dev))
        return E_INVALID_CONTEXT;
    sleep_until(__atomic_load_n(&dev_free[dev], __ATOMIC_ACQUIRE));
    return OK;
}

EXPORT CUresult cuEventCreate(CUevent *e, unsigned int flags) {
    if (!e)
        return E_INVALID_VALUE;
    if (!current)
        return E_INVALID_CONTEXT;
    *e = calloc(1, sizeof **e);
    if (!*e)
        return E_OUT_OF_MEMORY;
    (*e)->flags = flags;
    return OK;
}
EXPORT CUresult cuEventDestroy_v2(CUevent e) {
    free(e);
    return OK;
}
static CUresult event_record(CUevent e, CUstream hs, int ptsz) {
    if (!e)
        return E_INVALID_HANDLE;
    struct fake_stream *s = stream_of(hs, ptsz);
    pthread_mutex_lock(&lock);
    uint64_t now = now_ns();
    e->t = s->end > now ? s->end : now;
    e->recorded = 1;
    pthread_mutex_unlock(&lock);
    return OK;
}
EXPORT CUresult cuEventRecord(CUevent e, CUstream s) { return event_record(e, s, 0); }
EXPORT CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return event_record(e, s, 1); }
EXPORT CUresult cuEventQuery(CUevent e) {
    if (!e)
        return E_INVALID_HANDLE;
    return !e->recorded || now_ns() >= e->t ? OK : E_NOT_READY;
}
EXPORT CUresult cuEventSynchronize(CUevent e) {
    if (!e)
        return E_INVALID_HANDLE;
    if (e->recorded)
        sleep_until(e->t);
    return OK;
}
EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
    if (!ms || !a || !b || !a->recorded || !b->recorded || (a->flags & 2) || (b->flags & 2))
        return E_INVALID_HANDLE;
    uint64_t now = now_ns();
    if (now < a->t || now < b->t)
        return E_NOT_READY;
    *ms = (float)(((double)b->t - (double)a->t) / 1e6);
    return OK;
}

#define US(f) ((uint64_t)(uintptr_t)(f))
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shmem, CUstream s, void **params, void **extra) {
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)params, (void)extra;
    return launch(s, 0, US(f));
}
EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                    unsigned bz, unsigned shmem, CUstream s, void **params, void **extra) {
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)params, (void)extra;
    return launch(s, 1, US(f));
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    (void)params, (void)extra;
    return c ? launch(c->hStream, 0, US(f)) : E_INVALID_VALUE;
}
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    (void)params, (void)extra;
    return c ? launch(c->hStream, 1, US(f)) : E_INVALID_VALUE;
}
EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                          unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params) {
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)params;
    return launch(s, 0, US(f));
}
EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                               unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params) {
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem, (void)params;
    return launch(s, 1, US(f));
}
EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { return launch(s, 0, US(g)); }
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { return launch(s, 1, US(g)); }

/* ------------------------------------------------------------------------------------------------
 * cuGetProcAddress: (name, since version, per-thread variant) -> entry point */

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status);

struct entry {
    const char *base;
    int since;
    int ptsz;
    const char *exact;
    void *fn;
};
#define E(base, since, pt, fn) {base, since, pt, #fn, (void *)&fn}
static const struct entry table[] = {
    E("cuInit", 2000, 0, cuInit),
    E("cuDriverGetVersion", 2020, 0, cuDriverGetVersion),
    E("cuDeviceGet", 2000, 0, cuDeviceGet),
    E("cuDeviceGetCount", 2000, 0, cuDeviceGetCount),
    E("cuDeviceGetUuid", 9020, 0, cuDeviceGetUuid),
    E("cuDeviceTotalMem", 3020, 0, cuDeviceTotalMem_v2),
    E("cuDeviceGetDefaultMemPool", 11020, 0, cuDeviceGetDefaultMemPool),
    E("cuDevicePrimaryCtxRetain", 7000, 0, cuDevicePrimaryCtxRetain),
    E("cuCtxCreate", 2000, 0, cuCtxCreate),
    E("cuCtxCreate", 3020, 0, cuCtxCreate_v2),
    E("cuCtxSetCurrent", 4000, 0, cuCtxSetCurrent),
    E("cuCtxGetCurrent", 4000, 0, cuCtxGetCurrent),
    E("cuCtxGetDevice", 2000, 0, cuCtxGetDevice),
    E("cuCtxSynchronize", 2000, 0, cuCtxSynchronize),
    E("cuCtxDestroy", 4000, 0, cuCtxDestroy_v2),
    E("cuStreamCreate", 2000, 0, cuStreamCreate),
    E("cuStreamDestroy", 4000, 0, cuStreamDestroy_v2),
    E("cuStreamSynchronize", 2000, 0, cuStreamSynchronize),
    E("cuStreamSynchronize", 7000, 1, cuStreamSynchronize_ptsz),
    E("cuStreamIsCapturing", 10000, 0, cuStreamIsCapturing),
    E("cuStreamIsCapturing", 10000, 1, cuStreamIsCapturing_ptsz),
    E("cuEventCreate", 2000, 0, cuEventCreate),
    E("cuEventRecord", 2000, 0, cuEventRecord),
    E("cuEventRecord", 7000, 1, cuEventRecord_ptsz),
    E("cuEventQuery", 2000, 0, cuEventQuery),
    E("cuEventSynchronize", 2000, 0, cuEventSynchronize),
    E("cuEventElapsedTime", 2000, 0, cuEventElapsedTime),
    E("cuEventDestroy", 4000, 0, cuEventDestroy_v2),
    E("cuMemAlloc", 2000, 0, cuMemAlloc),
    E("cuMemAlloc", 3020, 0, cuMemAlloc_v2),
    E("cuMemAllocPitch", 3020, 0, cuMemAllocPitch_v2),
    E("cuMemAllocManaged", 6000, 0, cuMemAllocManaged),
    E("cuMemAllocAsync", 11020, 0, cuMemAllocAsync),
    E("cuMemAllocAsync", 11020, 1, cuMemAllocAsync_ptsz),
    E("cuMemAllocFromPoolAsync", 11020, 0, cuMemAllocFromPoolAsync),
    E("cuMemAllocFromPoolAsync", 11020, 1, cuMemAllocFromPoolAsync_ptsz),
    E("cuMemFree", 3020, 0, cuMemFree_v2),
    E("cuMemFreeAsync", 11020, 0, cuMemFreeAsync),
    E("cuMemFreeAsync", 11020, 1, cuMemFreeAsync_ptsz),
    E("cuMemCreate", 10020, 0, cuMemCreate),
    E("cuMemRelease", 10020, 0, cuMemRelease),
    E("cuArrayCreate", 3020, 0, cuArrayCreate_v2),
    E("cuArray3DCreate", 3020, 0, cuArray3DCreate_v2),
    E("cuArrayDestroy", 2000, 0, cuArrayDestroy),
    E("cuMipmappedArrayCreate", 5000, 0, cuMipmappedArrayCreate),
    E("cuMipmappedArrayDestroy", 5000, 0, cuMipmappedArrayDestroy),
    E("cuMemGetInfo", 2000, 0, cuMemGetInfo),
    E("cuMemGetInfo", 3020, 0, cuMemGetInfo_v2),
    E("cuLaunchKernel", 4000, 0, cuLaunchKernel),
    E("cuLaunchKernel", 7000, 1, cuLaunchKernel_ptsz),
    E("cuLaunchKernelEx", 11060, 0, cuLaunchKernelEx),
    E("cuLaunchKernelEx", 11060, 1, cuLaunchKernelEx_ptsz),
    E("cuLaunchCooperativeKernel", 9000, 0, cuLaunchCooperativeKernel),
    E("cuLaunchCooperativeKernel", 9000, 1, cuLaunchCooperativeKernel_ptsz),
    E("cuGraphLaunch", 10000, 0, cuGraphLaunch),
    E("cuGraphLaunch", 10000, 1, cuGraphLaunch_ptsz),
    E("cuGetProcAddress", 11030, 0, cuGetProcAddress),
    E("cuGetProcAddress", 12000, 0, cuGetProcAddress_v2),
    {NULL, 0, 0, NULL, NULL},
};

static CUresult lookup(const char *symbol, void **pfn, int version, uint64_t flags, int *status) {
    int want_pt = (flags & 2) != 0, named = 0;
    const struct entry *best = NULL;
    if (!symbol || !pfn)
        return E_INVALID_VALUE;
    for (int pass = want_pt ? 0 : 1; pass < 2 && !best; pass++) {
        for (const struct entry *e = table; e->base; e++) {
            if (strcmp(e->base, symbol) != 0)
                continue;
            named = 1;
            if (e->ptsz == (pass == 0) && e->since <= version && (!best || e->since >= best->since))
                best = e;
        }
    }
    *pfn = best ? best->fn : NULL;
    if (status)
        *status = best ? 0 : named ? 2 : 1;
    return best ? OK : E_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags) {
    return lookup(symbol, pfn, version, flags, NULL);
}
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status) {
    return lookup(symbol, pfn, version, flags, status);
}

/* for tests: the fake's own address of an exported entry point (NULL if none), without dlsym */
EXPORT void *fake_cuda_lookup(const char *exact) {
    for (const struct entry *e = table; e->base; e++)
        if (!strcmp(e->exact, exact))
            return e->fn;
    return NULL;
}

/* for tests: allocation calls that reached the driver, kernels launched, their total duration */
EXPORT void fake_cuda_stats(uint64_t *alloc_calls, uint64_t *launches, uint64_t *busy_ns) {
    pthread_mutex_lock(&lock);
    if (alloc_calls)
        *alloc_calls = stat_alloc_calls;
    if (launches)
        *launches = stat_launches;
    if (busy_ns)
        *busy_ns = stat_busy_ns;
    pthread_mutex_unlock(&lock);
}
