/* Memory caps: one budget per container, across all its processes.
 *
 * Every allocation is counted against the cap of its device before the driver is called, in this
 * process's slot of the container's accounting file (lp_accounting.c), whose slots together are the
 * container's use; one that does not fit gets CUDA_ERROR_OUT_OF_MEMORY without reaching the driver.
 * Each process also keeps a private map from pointer or handle to (size, device) so that frees are
 * credited back exactly.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "lp_internal.h"

enum lp_kind { LP_KIND_DPTR = 1, LP_KIND_ARRAY = 2, LP_KIND_MIPMAP = 3, LP_KIND_VMM = 4 };

/* ------------------------------------------------------------------------------------------------
 * the private map: (kind, pointer or handle) -> (bytes, device) */

struct lp_entry {
    uint64_t key;
    uint64_t bytes;
    int32_t kind; /* 0 empty, -1 deleted */
    int32_t dev;
};

/* map_lock guards the map; it is taken inside the accounting lock, never the other way round */
static pthread_mutex_t map_lock = PTHREAD_MUTEX_INITIALIZER;
static struct lp_entry *map;
static size_t map_cap, map_used, map_live;
static pid_t map_pid; /* the process the map belongs to: a forked child's copy is its parent's */

static size_t map_slot(uint64_t key, int kind) {
    uint64_t h = key ^ ((uint64_t)kind * 0x9e3779b97f4a7c15ULL);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return (size_t)h & (map_cap - 1);
}

static int map_grow(void) {
    size_t ncap = map_cap ? map_cap * 2 : 1024;
    if (map_live * 4 < map_cap) /* mostly tombstones: rehash at the same size */
        ncap = map_cap;
    struct lp_entry *old = map, *fresh = calloc(ncap, sizeof *fresh);
    size_t ocap = map_cap;
    if (!fresh)
        return -1;
    map = fresh;
    map_cap = ncap;
    map_used = map_live = 0;
    for (size_t i = 0; i < ocap; i++) {
        if (old[i].kind > 0) {
            size_t j = map_slot(old[i].key, old[i].kind);
            while (map[j].kind != 0)
                j = (j + 1) & (map_cap - 1);
            map[j] = old[i];
            map_used++;
            map_live++;
        }
    }
    free(old);
    return 0;
}

static int map_put(int kind, uint64_t key, uint64_t bytes, int dev) {
    if ((map_used + 1) * 10 >= map_cap * 7 && map_grow() != 0)
        return -1;
    size_t j = map_slot(key, kind);
    while (map[j].kind > 0) {
        if (map[j].kind == kind && map[j].key == key) { /* the driver reused a handle we missed freeing */
            map[j].bytes = bytes;
            map[j].dev = dev;
            return 1;
        }
        j = (j + 1) & (map_cap - 1);
    }
    if (map[j].kind == 0)
        map_used++;
    map[j] = (struct lp_entry){key, bytes, kind, dev};
    map_live++;
    return 0;
}

/* With map_lock held: the map, made this process's own (emptied in a forked child). */
static void map_claim(void) {
    pid_t me = getpid();
    if (map_pid == me)
        return;
    free(map);
    map = NULL;
    map_cap = map_used = map_live = 0;
    map_pid = me;
}

static int map_take(int kind, uint64_t key, struct lp_entry *out) {
    if (!map_cap)
        return 0;
    size_t j = map_slot(key, kind);
    while (map[j].kind != 0) {
        if (map[j].kind == kind && map[j].key == key) {
            *out = map[j];
            map[j].kind = -1;
            map_live--;
            return 1;
        }
        j = (j + 1) & (map_cap - 1);
    }
    return 0;
}

void lp_memory_atfork_prepare(void) { pthread_mutex_lock(&map_lock); }
void lp_memory_atfork_parent(void) { pthread_mutex_unlock(&map_lock); }
void lp_memory_atfork_child(void) { pthread_mutex_init(&map_lock, NULL); }

/* ------------------------------------------------------------------------------------------------
 * reserve before the driver call, settle after it */

struct lp_res {
    int tracked;
    int dev;
    uint64_t bytes;
};

enum { LP_PASS = 0, LP_RESERVED = 1, LP_OOM = 2 };

static int reserve(struct lp_res *r, uint64_t bytes, int dev) {
    *r = (struct lp_res){0, 0, 0};
    if (!lp_cfg.any_mem_cap)
        return LP_PASS;
    if (dev < 0 && lp_current_device(&dev) != 0)
        return LP_PASS; /* no current context: the driver will refuse the call itself */
    if (dev >= LP_MAX_DEVICES) {
        lp_report("device %d is beyond the %d the interposer tracks; its memory is not capped", dev, LP_MAX_DEVICES);
        return LP_PASS;
    }
    uint64_t cap = lp_cfg.mem_cap[dev];
    if (!cap)
        return LP_PASS;
    lp_acct_lock();
    uint64_t used = lp_acct_used(dev);
    if (bytes > cap || used > cap - bytes) {
        lp_acct_reclaim();
        used = lp_acct_used(dev);
    }
    if (bytes > cap || used > cap - bytes) {
        lp_acct_unlock();
        return LP_OOM;
    }
    lp_acct_add(dev, bytes, 0);
    lp_acct_unlock();
    *r = (struct lp_res){1, dev, bytes};
    return LP_RESERVED;
}

static void settle(const struct lp_res *r, int ok, int kind, uint64_t key, uint64_t actual) {
    if (!r->tracked)
        return;
    lp_acct_lock();
    if (ok) {
        lp_acct_add(r->dev, actual > r->bytes ? actual - r->bytes : 0, actual < r->bytes ? r->bytes - actual : 0);
        pthread_mutex_lock(&map_lock);
        map_claim();
        int put = map_put(kind, key, actual, r->dev);
        pthread_mutex_unlock(&map_lock);
        if (put < 0)
            lp_report("out of host memory for the allocation map; a free will not be credited back");
    } else {
        lp_acct_add(r->dev, 0, r->bytes);
    }
    lp_acct_unlock();
}

/* Before a free: take the entry out of the map (so a new allocation at the same address cannot be
 * confused with it). After: credit it back, or put it back if the driver refused the free. */
static int take(int kind, uint64_t key, struct lp_entry *e) {
    if (!lp_cfg.any_mem_cap)
        return 0;
    pthread_mutex_lock(&map_lock);
    int found = map_pid == getpid() ? map_take(kind, key, e) : 0;
    pthread_mutex_unlock(&map_lock);
    return found;
}

static void finish_free(const struct lp_entry *e, CUresult rc) {
    lp_acct_lock();
    int credit = rc == CUDA_SUCCESS;
    if (!credit) {
        pthread_mutex_lock(&map_lock);
        map_claim();
        credit = map_put(e->kind, e->key, e->bytes, e->dev) < 0;
        pthread_mutex_unlock(&map_lock);
    }
    if (credit)
        lp_acct_add(e->dev, 0, e->bytes);
    lp_acct_unlock();
}

/* ------------------------------------------------------------------------------------------------
 * sizes */

static uint64_t mul_sat(uint64_t a, uint64_t b) {
    if (a && b > UINT64_MAX / a)
        return UINT64_MAX;
    return a * b;
}

static uint64_t round_up(uint64_t v, uint64_t to) { return v > UINT64_MAX - to ? UINT64_MAX : (v + to - 1) / to * to; }

/* Bytes per pixel of an array format, in sixteenths (NV12 holds 1.5 bytes a pixel, BC blocks less
 * than one): a per-channel size times the channel count, or per pixel for the packed formats. */
static uint64_t pixel_sixteenths(int format, unsigned channels) {
    uint64_t ch = channels ? channels : 1;
    switch (format) {
    case 0x01:
    case 0x08:
    case 0xc0:
    case 0xc1:
    case 0xc2:
    case 0xc6:
    case 0xc7:
    case 0xc8:
        return 16 * ch; /* 8-bit */
    case 0x02:
    case 0x09:
    case 0x10:
    case 0xc3:
    case 0xc4:
    case 0xc5:
    case 0xc9:
    case 0xca:
    case 0xcb:
        return 32 * ch; /* 16-bit, half */
    case 0x03:
    case 0x0a:
    case 0x20:
        return 64 * ch; /* 32-bit, float */
    case 0xb0:
        return 24; /* NV12: 8-bit luma plus half-size chroma */
    default:
        if (format >= 0x91 && format <= 0x9e)
            return 16;  /* block-compressed: at most one byte a pixel */
        return 64 * ch; /* unknown: four bytes a channel, on the safe side */
    }
}

static uint64_t array_bytes(uint64_t w, uint64_t h, uint64_t d, int format, unsigned channels) {
    uint64_t row = round_up(round_up(mul_sat(w ? w : 1, pixel_sixteenths(format, channels)), 16) / 16, 512);
    return round_up(mul_sat(mul_sat(row, h ? h : 1), d ? d : 1), 4096);
}

static uint64_t array3d_bytes(const CUDA_ARRAY3D_DESCRIPTOR *a, unsigned levels) {
    if (a->Flags & (LP_CUDA_ARRAY3D_SPARSE | LP_CUDA_ARRAY3D_DEFERRED_MAPPING))
        return 0; /* backed later by cuMemCreate handles, counted there */
    int layered = (a->Flags & (LP_CUDA_ARRAY3D_LAYERED | LP_CUDA_ARRAY3D_CUBEMAP)) != 0;
    uint64_t total = 0, w = a->Width, h = a->Height, d = a->Depth;
    for (unsigned l = 0; l < (levels ? levels : 1) && l < 64; l++) {
        uint64_t b = array_bytes(w, h, d, a->Format, a->NumChannels);
        total = total > UINT64_MAX - b ? UINT64_MAX : total + b;
        w = w > 1 ? w / 2 : w;
        h = h > 1 ? h / 2 : h;
        d = layered || d <= 1 ? d : d / 2;
    }
    return total;
}

/* ------------------------------------------------------------------------------------------------
 * the wrappers */

#define LP_NEED(name)                                                                                                  \
    do {                                                                                                               \
        if (!lp_driver() || !lp_real_##name)                                                                           \
            return lp_missing(#name);                                                                                  \
    } while (0)

#define LP_ALLOC(name, kind, want, dev, handle_expr, call)                                                             \
    do {                                                                                                               \
        LP_NEED(name);                                                                                                 \
        if (!lp_enabled())                                                                                             \
            return lp_real_##name call;                                                                                \
        struct lp_res r_ = {0, 0, 0};                                                                                  \
        if (reserve(&r_, (want), (dev)) == LP_OOM)                                                                     \
            return CUDA_ERROR_OUT_OF_MEMORY;                                                                           \
        CUresult rc_ = lp_real_##name call;                                                                            \
        settle(&r_, rc_ == CUDA_SUCCESS, (kind), rc_ == CUDA_SUCCESS ? (uint64_t)(handle_expr) : 0, r_.bytes);         \
        return rc_;                                                                                                    \
    } while (0)

#define LP_FREE(name, kind, key, call)                                                                                 \
    do {                                                                                                               \
        LP_NEED(name);                                                                                                 \
        if (!lp_enabled())                                                                                             \
            return lp_real_##name call;                                                                                \
        struct lp_entry e_;                                                                                            \
        int had_ = take((kind), (uint64_t)(key), &e_);                                                                 \
        CUresult rc_ = lp_real_##name call;                                                                            \
        if (had_)                                                                                                      \
            finish_free(&e_, rc_);                                                                                     \
        return rc_;                                                                                                    \
    } while (0)

LP_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    LP_ALLOC(cuMemAlloc_v2, LP_KIND_DPTR, bytesize, -1, *dptr, (dptr, bytesize));
}

LP_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    LP_ALLOC(cuMemAllocManaged, LP_KIND_DPTR, bytesize, -1, *dptr, (dptr, bytesize, flags));
}

LP_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream s) {
    LP_ALLOC(cuMemAllocAsync, LP_KIND_DPTR, bytesize, -1, *dptr, (dptr, bytesize, s));
}

LP_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream s) {
    LP_ALLOC(cuMemAllocAsync_ptsz, LP_KIND_DPTR, bytesize, -1, *dptr, (dptr, bytesize, s));
}

LP_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream s) {
    LP_ALLOC(cuMemAllocFromPoolAsync, LP_KIND_DPTR, bytesize, -1, *dptr, (dptr, bytesize, pool, s));
}

LP_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream s) {
    LP_ALLOC(cuMemAllocFromPoolAsync_ptsz, LP_KIND_DPTR, bytesize, -1, *dptr, (dptr, bytesize, pool, s));
}

LP_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                      unsigned int elementSize) {
    LP_NEED(cuMemAllocPitch_v2);
    if (!lp_enabled())
        return lp_real_cuMemAllocPitch_v2(dptr, pitch, width, height, elementSize);
    /* the pitch is only known afterwards: reserve with the usual 512-byte alignment, then settle on
     * what the driver chose */
    struct lp_res r;
    if (reserve(&r, mul_sat(round_up(width, 512), height), -1) == LP_OOM)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = lp_real_cuMemAllocPitch_v2(dptr, pitch, width, height, elementSize);
    int ok = rc == CUDA_SUCCESS && dptr && pitch;
    settle(&r, ok, LP_KIND_DPTR, ok ? *dptr : 0, ok ? mul_sat(*pitch, height) : 0);
    return rc;
}

LP_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) { LP_FREE(cuMemFree_v2, LP_KIND_DPTR, dptr, (dptr)); }

LP_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) {
    LP_FREE(cuMemFreeAsync, LP_KIND_DPTR, dptr, (dptr, s));
}

LP_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s) {
    LP_FREE(cuMemFreeAsync_ptsz, LP_KIND_DPTR, dptr, (dptr, s));
}

LP_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags) {
    LP_NEED(cuMemCreate);
    if (!lp_enabled() || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id < 0)
        return lp_real_cuMemCreate(handle, size, prop, flags); /* host memory is not the GPU's */
    LP_ALLOC(cuMemCreate, LP_KIND_VMM, size, prop->location.id, *handle, (handle, size, prop, flags));
}

LP_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    LP_FREE(cuMemRelease, LP_KIND_VMM, handle, (handle));
}

LP_EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d) {
    uint64_t bytes = d ? array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels) : 0;
    LP_ALLOC(cuArrayCreate_v2, LP_KIND_ARRAY, bytes, -1, (uintptr_t)*pHandle, (pHandle, d));
}

LP_EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    uint64_t bytes = d ? array3d_bytes(d, 1) : 0;
    LP_ALLOC(cuArray3DCreate_v2, LP_KIND_ARRAY, bytes, -1, (uintptr_t)*pHandle, (pHandle, d));
}

LP_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                          unsigned int levels) {
    uint64_t bytes = d ? array3d_bytes(d, levels) : 0;
    LP_ALLOC(cuMipmappedArrayCreate, LP_KIND_MIPMAP, bytes, -1, (uintptr_t)*pHandle, (pHandle, d, levels));
}

LP_EXPORT CUresult cuArrayDestroy(CUarray a) { LP_FREE(cuArrayDestroy, LP_KIND_ARRAY, (uintptr_t)a, (a)); }

LP_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) {
    LP_FREE(cuMipmappedArrayDestroy, LP_KIND_MIPMAP, (uintptr_t)a, (a));
}

LP_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    LP_NEED(cuMemGetInfo_v2);
    CUresult rc = lp_real_cuMemGetInfo_v2(free_bytes, total_bytes);
    int dev;
    if (rc != CUDA_SUCCESS || !lp_enabled() || !lp_cfg.any_mem_cap || !free_bytes || !total_bytes ||
        lp_current_device(&dev) != 0 || dev >= LP_MAX_DEVICES || !lp_cfg.mem_cap[dev])
        return rc;
    uint64_t cap = lp_cfg.mem_cap[dev];
    lp_acct_lock();
    lp_acct_reclaim();
    uint64_t used = lp_acct_used(dev);
    lp_acct_unlock();
    uint64_t total = cap < *total_bytes ? cap : *total_bytes;
    uint64_t left = used >= total ? 0 : total - used;
    *total_bytes = (size_t)total;
    *free_bytes = (size_t)(left < *free_bytes ? left : *free_bytes);
    return rc;
}

LP_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    LP_NEED(cuDeviceTotalMem_v2);
    CUresult rc = lp_real_cuDeviceTotalMem_v2(bytes, dev);
    if (rc == CUDA_SUCCESS && bytes && lp_enabled() && dev >= 0 && dev < LP_MAX_DEVICES && lp_cfg.mem_cap[dev] &&
        lp_cfg.mem_cap[dev] < *bytes)
        *bytes = (size_t)lp_cfg.mem_cap[dev];
    return rc;
}
