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

#include "probe_cuda.h" /* the interposer's CUDA types and entry-point lists, and the tests' extras */

#define EXPORT __attribute__((visibility("default")))

#define MAX_DEV 8
#define MIB (1024ULL * 1024ULL)

/* what the driver's opaque handles point to here */
struct CUctx_st {
    int dev;
};
struct CUstream_st {
    uint64_t end; /* when the work queued on it so far is done */
};
struct CUevent_st {
    int recorded;
    unsigned flags;
    uint64_t t;
};
struct CUmemPoolHandle_st {
    int dev;
};
struct fake_array { /* behind a CUarray or a CUmipmappedArray handle */
    uint64_t bytes;
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
static struct CUstream_st legacy_stream;
static __thread struct CUstream_st ptds_stream;
static __thread struct CUctx_st *current;
static struct CUctx_st primary[MAX_DEV];
static struct CUmemPoolHandle_st default_pool[MAX_DEV];
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
    return CUDA_SUCCESS;
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
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (bytes > total_bytes - used[dev]) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (n_allocs == cap_allocs) {
        size_t ncap = cap_allocs ? cap_allocs * 2 : 256;
        struct alloc *n = realloc(allocs, ncap * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&lock);
            return CUDA_ERROR_OUT_OF_MEMORY;
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
    return CUDA_SUCCESS;
}

static CUresult mem_free(uint64_t key, int kind) {
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < n_allocs; i++) {
        if (allocs[i].key == key && allocs[i].kind == kind) {
            used[allocs[i].dev] -= allocs[i].bytes;
            allocs[i] = allocs[--n_allocs];
            pthread_mutex_unlock(&lock);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
}

static CUresult alloc_here(CUdeviceptr *p, uint64_t bytes) {
    int dev;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    if (current_dev(&dev))
        return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t k = 0;
    CUresult rc = mem_alloc(dev, bytes, 1, &k);
    if (rc == CUDA_SUCCESS)
        *p = k;
    return rc;
}

static CUresult array_new(struct fake_array **out, uint64_t bytes) {
    int dev;
    if (current_dev(&dev))
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    stat_alloc_calls++;
    if (bytes > total_bytes - used[dev]) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct fake_array *a = malloc(sizeof *a);
    if (!a) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->bytes = bytes;
    a->dev = dev;
    used[dev] += bytes;
    pthread_mutex_unlock(&lock);
    *out = a;
    return CUDA_SUCCESS;
}

static CUresult array_free(struct fake_array *a) {
    if (!a)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&lock);
    used[a->dev] -= a->bytes;
    pthread_mutex_unlock(&lock);
    free(a);
    return CUDA_SUCCESS;
}

static uint64_t array_size(size_t w, size_t h, size_t d, unsigned ch) {
    return (uint64_t)(w ? w : 1) * (h ? h : 1) * (d ? d : 1) * (ch ? ch : 1) * 4;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) { return alloc_here(p, bytes); }
EXPORT CUresult cuMemAlloc(unsigned int *p, unsigned int bytes) { /* the 32-bit legacy entry point */
    CUdeviceptr q = 0;
    CUresult rc = alloc_here(&q, bytes);
    if (rc == CUDA_SUCCESS && p)
        *p = (unsigned int)q;
    return rc;
}
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t width, size_t height, unsigned int elem) {
    (void)elem;
    if (!pitch)
        return CUDA_ERROR_INVALID_VALUE;
    size_t pt = (width + 511) / 512 * 512;
    CUresult rc = alloc_here(p, (uint64_t)pt * height);
    if (rc == CUDA_SUCCESS)
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
    return pool ? alloc_here(p, bytes) : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t bytes, CUmemoryPool pool, CUstream s) {
    (void)s;
    return pool ? alloc_here(p, bytes) : CUDA_ERROR_INVALID_VALUE;
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
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t k = 0;
    CUresult rc = mem_alloc(prop->location.id, size, 2, &k);
    if (rc == CUDA_SUCCESS)
        *h = k;
    return rc;
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return mem_free(h, 2); }
EXPORT CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d) {
    struct fake_array *x = NULL;
    CUresult rc = a && d ? array_new(&x, array_size(d->Width, d->Height, 1, d->NumChannels)) : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        *a = (CUarray)x;
    return rc;
}
EXPORT CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    struct fake_array *x = NULL;
    CUresult rc =
        a && d ? array_new(&x, array_size(d->Width, d->Height, d->Depth, d->NumChannels)) : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        *a = (CUarray)x;
    return rc;
}
EXPORT CUresult cuArrayDestroy(CUarray a) { return array_free((struct fake_array *)a); }
EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels) {
    (void)levels;
    struct fake_array *x = NULL;
    CUresult rc = a && d ? array_new(&x, array_size(d->Width, d->Height, d->Depth, d->NumChannels) * 4 / 3)
                         : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        *a = (CUmipmappedArray)x;
    return rc;
}
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) { return array_free((struct fake_array *)a); }
EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b) {
    int dev;
    if (!free_b || !total_b)
        return CUDA_ERROR_INVALID_VALUE;
    if (current_dev(&dev))
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    *free_b = total_bytes - used[dev];
    *total_b = total_bytes;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total_b) {
    size_t f, t;
    CUresult rc = cuMemGetInfo_v2(&f, &t);
    if (rc == CUDA_SUCCESS) {
        *free_b = f > 0xffffffffu ? 0xffffffffu : (unsigned)f;
        *total_b = t > 0xffffffffu ? 0xffffffffu : (unsigned)t;
    }
    return rc;
}
EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    if (!bytes || dev < 0 || dev >= n_devices)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = total_bytes;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
    if (!pool || dev < 0 || dev >= n_devices)
        return CUDA_ERROR_INVALID_VALUE;
    *pool = &default_pool[dev];
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------
 * devices, contexts */

EXPORT CUresult cuInit(unsigned int flags) { return do_init(flags); }
EXPORT CUresult cuDriverGetVersion(int *v) {
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    *v = 12040;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetCount(int *n) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    *n = n_devices;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!d || ordinal < 0 || ordinal >= n_devices)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) {
    if (!u || d < 0 || d >= n_devices)
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < 16; i++)
        u->bytes[i] = (char)(0xa0 + i + d);
    return CUDA_SUCCESS;
}
static CUresult ctx_create(CUcontext *c, unsigned int flags, CUdevice d) {
    (void)flags;
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!c || d < 0 || d >= n_devices)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *x = malloc(sizeof *x);
    if (!x)
        return CUDA_ERROR_OUT_OF_MEMORY;
    x->dev = d;
    current = x;
    *c = x;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxCreate_v2(CUcontext *c, unsigned int flags, CUdevice d) { return ctx_create(c, flags, d); }
EXPORT CUresult cuCtxCreate(CUcontext *c, unsigned int flags, CUdevice d) { return ctx_create(c, flags, d); }
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    if (!c || d < 0 || d >= n_devices)
        return CUDA_ERROR_INVALID_VALUE;
    *c = &primary[d];
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
    current = c;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetCurrent(CUcontext *c) {
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    *c = current;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetDevice(CUdevice *d) {
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    *d = current->dev;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxDestroy_v2(CUcontext c) {
    if (current == c)
        current = NULL;
    if (c && (c < primary || c >= primary + MAX_DEV))
        free(c);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------
 * streams, events, kernels */

static struct CUstream_st *stream_of(CUstream s, int ptsz) {
    if (s == LP_CU_STREAM_PER_THREAD || (!s && ptsz))
        return &ptds_stream;
    if (!s || s == LP_CU_STREAM_LEGACY)
        return &legacy_stream;
    return s;
}

static CUresult launch(CUstream hs, int ptsz, uint64_t us) {
    int dev;
    if (current_dev(&dev))
        return CUDA_ERROR_INVALID_CONTEXT;
    struct CUstream_st *s = stream_of(hs, ptsz);
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
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
    (void)flags;
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    *s = calloc(1, sizeof **s);
    return *s ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
    if (s && s != LP_CU_STREAM_LEGACY && s != LP_CU_STREAM_PER_THREAD)
        free(s);
    return CUDA_SUCCESS;
}
static CUresult stream_sync(CUstream s, int ptsz) {
    pthread_mutex_lock(&lock);
    uint64_t end = stream_of(s, ptsz)->end;
    pthread_mutex_unlock(&lock);
    sleep_until(end);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamSynchronize(CUstream s) { return stream_sync(s, 0); }
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { return stream_sync(s, 1); }
EXPORT CUresult cuStreamIsCapturing(CUstream s, int *status) {
    (void)s;
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    *status = 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream s, int *status) { return cuStreamIsCapturing(s, status); }
EXPORT CUresult cuCtxSynchronize(void) {
    int dev;
    if (current_dev(&dev))
        return CUDA_ERROR_INVALID_CONTEXT;
    sleep_until(__atomic_load_n(&dev_free[dev], __ATOMIC_ACQUIRE));
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventCreate(CUevent *e, unsigned int flags) {
    if (!e)
        return CUDA_ERROR_INVALID_VALUE;
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    *e = calloc(1, sizeof **e);
    if (!*e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    (*e)->flags = flags;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventDestroy_v2(CUevent e) {
    free(e);
    return CUDA_SUCCESS;
}
static CUresult event_record(CUevent e, CUstream hs, int ptsz) {
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    struct CUstream_st *s = stream_of(hs, ptsz);
    pthread_mutex_lock(&lock);
    uint64_t now = now_ns();
    e->t = s->end > now ? s->end : now;
    e->recorded = 1;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventRecord(CUevent e, CUstream s) { return event_record(e, s, 0); }
EXPORT CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return event_record(e, s, 1); }
EXPORT CUresult cuEventQuery(CUevent e) {
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    return !e->recorded || now_ns() >= e->t ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
EXPORT CUresult cuEventSynchronize(CUevent e) {
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    if (e->recorded)
        sleep_until(e->t);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
    if (!ms || !a || !b || !a->recorded || !b->recorded || (a->flags & CU_EVENT_DISABLE_TIMING) ||
        (b->flags & CU_EVENT_DISABLE_TIMING))
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t now = now_ns();
    if (now < a->t || now < b->t)
        return CUDA_ERROR_NOT_READY;
    *ms = (float)(((double)b->t - (double)a->t) / 1e6);
    return CUDA_SUCCESS;
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
    return c ? launch(c->hStream, 0, US(f)) : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    (void)params, (void)extra;
    return c ? launch(c->hStream, 1, US(f)) : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                          unsigned bz, unsigned shmem, CUstream s, void **params) {
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

struct entry {
    const char *base;
    int since;
    int ptsz;
    const char *exact;
    void *fn;
};
#define E(base, since, pt, fn)                                                                                         \
    { base, since, pt, #fn, (void *)&fn }
#define E_HOOKED(name, family, since, per_thread, args) E(#family, since, per_thread, name),
static const struct entry table[] = {
    LP_HOOKED_FUNCS(E_HOOKED) /* the interposer's hooks, mapped as lp_hooks.h says the driver does */
    E("cuInit", 2000, 0, cuInit),
    E("cuDriverGetVersion", 2020, 0, cuDriverGetVersion),
    E("cuDeviceGet", 2000, 0, cuDeviceGet),
    E("cuDeviceGetCount", 2000, 0, cuDeviceGetCount),
    E("cuDeviceGetUuid", 9020, 0, cuDeviceGetUuid),
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
    E("cuMemAlloc", 2000, 0, cuMemAlloc), /* legacy entry points, which the interposer does not wrap */
    E("cuMemGetInfo", 2000, 0, cuMemGetInfo),
    {NULL, 0, 0, NULL, NULL},
};
#undef E_HOOKED
#undef E

static CUresult lookup(const char *symbol, void **pfn, int version, uint64_t flags, int *status) {
    int want_pt = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0, named = 0;
    const struct entry *best = NULL;
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
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
    return best ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
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
