/* Memory caps: one budget per container, across all its processes.
 *
 * The accounting file (LINKPACK_ACCOUNTING_FILE) is mmap'ed by every process of the container. It
 * holds one slot per process (pid, start time, bytes in use per device) and the compute token
 * buckets. Changes are made under flock() on a descriptor of the process's own (reopened after
 * fork) plus a process mutex: the kernel drops the file lock when a process dies, whatever kills it.
 * A slot whose process is gone (kill(pid, 0) fails with ESRCH, or /proc says zombie or a different
 * start time) is cleared the next time the table is touched, which reclaims the usage of a process
 * killed mid-allocation, SIGKILL included. Each process also keeps a private map from pointer or
 * handle to (size, device) so that frees are credited back exactly.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lp_internal.h"

#define LP_MAX_PROCS 128
#define LP_ACCT_MAGIC 0x31544343414b504cULL /* "LPKACCT1" */
#define LP_ACCT_VERSION 1u

struct lp_slot {
    int32_t pid;
    uint32_t reserved;
    uint64_t start_time; /* /proc/<pid>/stat field 22, to tell a reused pid */
    uint64_t used[LP_MAX_DEVICES];
};

struct lp_acct {
    uint64_t magic;
    uint32_t version;
    uint32_t nslots;
    uint32_t ndevices;
    uint32_t reserved0;
    uint64_t reserved[5];
    struct lp_bucket bucket[LP_MAX_DEVICES];
    struct lp_slot slot[LP_MAX_PROCS];
};

static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;
static struct lp_acct local_acct; /* when the shared file is unusable: this process alone */
static struct lp_acct *table;
static int acct_fd = -1;
static int my_slot = -1;
static pid_t my_pid;

/* ------------------------------------------------------------------------------------------------
 * the private map: (kind, pointer or handle) -> (bytes, device) */

struct lp_entry {
    uint64_t key;
    uint64_t bytes;
    int32_t kind; /* 0 empty, -1 deleted */
    int32_t dev;
};

static struct lp_entry *map;
static size_t map_cap, map_used, map_live;

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

/* ------------------------------------------------------------------------------------------------
 * processes: alive or gone */

static int proc_stat(pid_t pid, char *state, uint64_t *start) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (!p || p[1] != ' ')
        return -1;
    p += 2;
    *state = *p;
    /* field 3 is the state; the start time is field 22 */
    for (int field = 3; field < 22 && *p; p++)
        if (*p == ' ')
            field++;
    *start = strtoull(p, NULL, 10);
    return 0;
}

static int have_proc = -1;

static int slot_dead(const struct lp_slot *s, int thorough) {
    if (s->pid <= 0)
        return 0;
    if (kill(s->pid, 0) == -1 && errno == ESRCH)
        return 1;
    if (!thorough)
        return 0;
    if (have_proc < 0) {
        char st;
        uint64_t t;
        have_proc = proc_stat(getpid(), &st, &t) == 0;
    }
    if (!have_proc)
        return 0;
    char state;
    uint64_t start;
    if (proc_stat(s->pid, &state, &start) != 0)
        return 1;
    return state == 'Z' || state == 'X' || (s->start_time && start != s->start_time);
}

static void reclaim(int thorough) {
    for (int i = 0; i < (int)LP_MAX_PROCS; i++)
        if (i != my_slot && table->slot[i].pid && slot_dead(&table->slot[i], thorough))
            memset(&table->slot[i], 0, sizeof table->slot[i]);
}

static void use_local(void) {
    memset(&local_acct, 0, sizeof local_acct);
    table = &local_acct;
    my_slot = 0;
    local_acct.slot[0].pid = (int32_t)getpid();
}

static void attach_shared(void) {
    const char *path = lp_cfg.accounting_path;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        lp_report("accounting file %s unusable (%s); limits are held per process, not per container",
                  path, strerror(errno));
        use_local();
        return;
    }
    (void)fchmod(fd, 0666); /* every user of the container shares it, whatever the umask */
    while (flock(fd, LOCK_EX) == -1) {
        if (errno != EINTR) {
            lp_report("accounting file %s cannot be locked (%s); limits are held per process", path,
                      strerror(errno));
            close(fd);
            use_local();
        return;
        }
    }
    void *m = MAP_FAILED;
    const char *why = NULL;
    off_t size = lseek(fd, 0, SEEK_END); /* not fstat: its symbol version is glibc 2.33's */
    if (size < 0)
        why = strerror(errno);
    else if ((size_t)size < sizeof(struct lp_acct) && ftruncate(fd, sizeof(struct lp_acct)) != 0)
        why = strerror(errno);
    else if ((m = mmap(NULL, sizeof(struct lp_acct), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
        why = strerror(errno);
    struct lp_acct *a = m == MAP_FAILED ? NULL : m;
    if (a && a->magic == 0) { /* new (all zero is a valid empty table) */
        a->version = LP_ACCT_VERSION;
        a->nslots = LP_MAX_PROCS;
        a->ndevices = LP_MAX_DEVICES;
        __atomic_store_n(&a->magic, LP_ACCT_MAGIC, __ATOMIC_RELEASE);
    } else if (a && (a->magic != LP_ACCT_MAGIC || a->version != LP_ACCT_VERSION || a->nslots != LP_MAX_PROCS ||
                     a->ndevices != LP_MAX_DEVICES)) {
        why = "unknown layout";
    }
    if (why) {
        flock(fd, LOCK_UN);
        close(fd);
        if (a)
            munmap(a, sizeof *a);
        lp_report("accounting file %s unusable (%s); limits are held per process, not per container",
                  path, why);
        use_local();
        return;
    }
    table = a;
    acct_fd = fd;
    my_slot = -1;
    reclaim(1);
    pid_t me = getpid();
    for (int i = 0; i < (int)LP_MAX_PROCS; i++)
        if (a->slot[i].pid == me) /* a stale slot of an earlier process with this pid */
            memset(&a->slot[i], 0, sizeof a->slot[i]);
    for (int i = 0; i < (int)LP_MAX_PROCS && my_slot < 0; i++) {
        if (a->slot[i].pid == 0) {
            char state;
            uint64_t start = 0;
            memset(&a->slot[i], 0, sizeof a->slot[i]);
            if (proc_stat(me, &state, &start) != 0)
                start = 0;
            a->slot[i].start_time = start;
            a->slot[i].pid = (int32_t)me;
            my_slot = i;
        }
    }
    flock(fd, LOCK_UN);
    if (my_slot < 0) {
        close(fd);
        acct_fd = -1;
        munmap(a, sizeof *a);
        lp_report("accounting file %s has no free slot (%d processes); limits are held per process", path,
                  LP_MAX_PROCS);
        use_local();
    }
}

/* With mem_lock held: attach once per process (again in a forked child). */
static void attach(void) {
    pid_t me = getpid();
    if (table && my_pid == me)
        return;
    if (table && table != &local_acct) /* a forked child: the parent's slot and descriptor are not ours */
        munmap(table, sizeof *table);
    if (acct_fd >= 0)
        close(acct_fd);
    acct_fd = -1;
    table = NULL;
    free(map);
    map = NULL;
    map_cap = map_used = map_live = 0;
    my_pid = me;
    attach_shared();
}

static void lock_table(void) {
    pthread_mutex_lock(&mem_lock);
    attach();
    if (acct_fd >= 0)
        while (flock(acct_fd, LOCK_EX) == -1 && errno == EINTR) {
        }
    reclaim(0);
}

static void unlock_table(void) {
    if (acct_fd >= 0)
        flock(acct_fd, LOCK_UN);
    pthread_mutex_unlock(&mem_lock);
}

static uint64_t used_on(int dev) {
    uint64_t sum = 0;
    for (int i = 0; i < (int)LP_MAX_PROCS; i++)
        if (table->slot[i].pid)
            sum += table->slot[i].used[dev];
    return sum;
}

static void add_used(int dev, uint64_t more, uint64_t less) {
    uint64_t *u = &table->slot[my_slot].used[dev];
    *u += more;
    *u = *u > less ? *u - less : 0;
}

struct lp_bucket *lp_acct_bucket(int dev) {
    if (!(table && my_pid == getpid())) {
        pthread_mutex_lock(&mem_lock);
        attach();
        pthread_mutex_unlock(&mem_lock);
    }
    return &table->bucket[dev];
}

void lp_memory_atfork_prepare(void) { pthread_mutex_lock(&mem_lock); }
void lp_memory_atfork_parent(void) { pthread_mutex_unlock(&mem_lock); }
void lp_memory_atfork_child(void) { pthread_mutex_init(&mem_lock, NULL); }

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
        lp_report("device %d is beyond the %d the interposer tracks; its memory is not capped", dev,
                  LP_MAX_DEVICES);
        return LP_PASS;
    }
    uint64_t cap = lp_cfg.mem_cap[dev];
    if (!cap)
        return LP_PASS;
    lock_table();
    uint64_t used = used_on(dev);
    if (bytes > cap || used > cap - bytes) {
        reclaim(1);
        used = used_on(dev);
    }
    if (bytes > cap || used > cap - bytes) {
        unlock_table();
        return LP_OOM;
    }
    add_used(dev, bytes, 0);
    unlock_table();
    *r = (struct lp_res){1, dev, bytes};
    return LP_RESERVED;
}

static void settle(const struct lp_res *r, int ok, int kind, uint64_t key, uint64_t actual) {
    if (!r->tracked)
        return;
    lock_table();
    if (ok) {
        add_used(r->dev, actual > r->bytes ? actual - r->bytes : 0, actual < r->bytes ? r->bytes - actual : 0);
        if (map_put(kind, key, actual, r->dev) < 0)
            lp_report("out of host memory for the allocation map; a free will not be credited back");
    } else {
        add_used(r->dev, 0, r->bytes);
    }
    unlock_table();
}

/* Before a free: take the entry out of the map (so a new allocation at the same address cannot be
 * confused with it). After: credit it back, or put it back if the driver refused the free. */
static int take(int kind, uint64_t key, struct lp_entry *e) {
    if (!lp_cfg.any_mem_cap)
        return 0;
    pthread_mutex_lock(&mem_lock);
    int found = table && my_pid == getpid() ? map_take(kind, key, e) : 0;
    pthread_mutex_unlock(&mem_lock);
    return found;
}

static void finish_free(const struct lp_entry *e, CUresult rc) {
    lock_table();
    if (rc == CUDA_SUCCESS)
        add_used(e->dev, 0, e->bytes);
    else if (map_put(e->kind, e->key, e->bytes, e->dev) < 0)
        add_used(e->dev, 0, e->bytes);
    unlock_table();
}

/* ------------------------------------------------------------------------------------------------
 * sizes */

static uint64_t mul_sat(uint64_t a, uint64_t b) {
    if (a && b > UINT64_MAX / a)
        return UINT64_MAX;
    return a * b;
}

static uint64_t round_up(uint64_t v, uint64_t to) {
    return v > UINT64_MAX - to ? UINT64_MAX : (v + to - 1) / to * to;
}

/* Bytes per pixel of an array format, in sixteenths (NV12 holds 1.5 bytes a pixel, BC blocks less
 * than one): a per-channel size times the channel count, or per pixel for the packed formats. */
static uint64_t pixel_sixteenths(int format, unsigned channels) {
    uint64_t ch = channels ? channels : 1;
    switch (format) {
    case 0x01: case 0x08: case 0xc0: case 0xc1: case 0xc2: case 0xc6: case 0xc7: case 0xc8:
        return 16 * ch; /* 8-bit */
    case 0x02: case 0x09: case 0x10: case 0xc3: case 0xc4: case 0xc5: case 0xc9: case 0xca: case 0xcb:
        return 32 * ch; /* 16-bit, half */
    case 0x03: case 0x0a: case 0x20:
        return 64 * ch; /* 32-bit, float */
    case 0xb0:
        return 24; /* NV12: 8-bit luma plus half-size chroma */
    default:
        if (format >= 0x91 && format <= 0x9e)
            return 16; /* block-compressed: at most one byte a pixel */
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

#define LP_NEED(name)                                                                                  \
    do {                                                                                               \
        if (!lp_driver() || !lp_real_##name)                                                           \
            return lp_missing(#name);                                                                  \
    } while (0)

#define LP_ALLOC(name, kind, want, dev, handle_expr, call)                                            \
    do {                                                                                               \
        LP_NEED(name);                                                                                 \
        if (!lp_enabled())                                                                             \
            return lp_real_##name call;                                                                \
        struct lp_res r_ = {0, 0, 0};                                                                            \
        if (reserve(&r_, (want), (dev)) == LP_OOM)                                                     \
            return CUDA_ERROR_OUT_OF_MEMORY;                                                           \
        CUresult rc_ = lp_real_##name call;                                                            \
        settle(&r_, rc_ == CUDA_SUCCESS, (kind), rc_ == CUDA_SUCCESS ? (uint64_t)(handle_expr) : 0,    \
               r_.bytes);                                                                              \
        return rc_;                                                                                    \
    } while (0)

#define LP_FREE(name, kind, key, call)                                                                 \
    do {                                                                                               \
        LP_NEED(name);                                                                                 \
        if (!lp_enabled())                                                                             \
            return lp_real_##name call;                                                                \
        struct lp_entry e_;                                                                            \
        int had_ = take((kind), (uint64_t)(key), &e_);                                                 \
        CUresult rc_ = lp_real_##name call;                                                            \
        if (had_)                                                                                      \
            finish_free(&e_, rc_);                                                                     \
        return rc_;                                                                                    \
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

LP_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                CUstream s) {
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
    lock_table();
    reclaim(1);
    uint64_t used = used_on(dev);
    unlock_table();
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
