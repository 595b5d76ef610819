/* Compute: a time-slice quota on kernel launches, and priority between sharers of a GPU.
 *
 * Busy time is measured on the GPU with events. On each stream the interposer keeps an "interval":
 * an event recorded before the first launch of a run and one re-recorded after every launch. While
 * the GPU has not caught up with the stream (the end event is not complete when the next launch comes)
 * the kernels run back to back, so the interval's elapsed time is busy time with no idle gaps in it;
 * once it has caught up the interval is measured and a new one starts. An interval is also closed
 * after LP_K launches so that measurements keep coming while the GPU stays behind. Costs: one
 * cuEventQuery and one cuEventRecord per launch, one more record per interval.
 *
 * Pacing is a token bucket per device and container, kept in the words the accounting file
 * (lp_accounting.c) holds for it, so that the container's processes share it (updated with atomics):
 * it fills at units/units_per_gpu nanoseconds per nanosecond up to that share of the window
 * (LINKPACK_COMPUTE_WINDOW_MS), and every measured interval takes its busy time out. A launch waits
 * while the tokens, less the estimated duration of this process's launched-but-unmeasured work, are
 * negative. Under the quota nothing waits.
 *
 * Priority: a high-priority process stamps the GPU's state file (LINKPACK_GPU_STATE_DIR, one file per
 * GPU UUID) busy until now + LINKPACK_PRIORITY_HOLD_MS at every launch; a low-priority process waits
 * before launching while that stamp is in the future, and keeps at most LP_LOW_INFLIGHT_NS of work
 * queued so that a high-priority process never waits long behind it.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "lp_internal.h"

#define LP_K 16    /* launches in one interval at most */
#define LP_RING 64 /* closed intervals awaiting the GPU, per stream */
#define LP_MAX_STREAMS 64
#define LP_POOL 256                   /* spare events */
#define LP_LOW_INFLIGHT_NS 2000000ULL /* queued work a low-priority process may keep */
#define LP_STATE_BYTES 4096

struct lp_ival {
    CUevent start, end;
    uint32_t launches;
};

struct lp_stream {
    int used;
    int dev;
    CUcontext ctx;
    CUstream stream;
    pid_t tid; /* for the per-thread default stream, which is a different stream in every thread */
    struct lp_ival ring[LP_RING];
    unsigned head, count;
    int open_valid;
    struct lp_ival open;
    int calibrated;
    double ns_per_launch; /* running estimate, for launched but not yet measured work */
    uint64_t pending;     /* launches not yet measured */
    uint64_t last_use;
};

/* In the accounting file's words for the device (hence may_alias): its layout is shared with the
 * container's other processes. */
struct __attribute__((may_alias)) lp_bucket {
    int64_t tokens_ns;
    uint64_t last_ns;
    uint64_t reserved[2];
};
_Static_assert(sizeof(struct lp_bucket) == LP_ACCT_COMPUTE_WORDS * sizeof(uint64_t), "token bucket layout");

struct lp_gpu_state { /* the per-GPU file shared by the node's containers */
    uint64_t high_busy_until_ns;
    uint64_t high_launches;
    uint64_t reserved[6];
};

static pthread_mutex_t c_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t gpu_lock = PTHREAD_MUTEX_INITIALIZER;
static struct lp_stream streams[LP_MAX_STREAMS];
static uint64_t use_clock;
static struct {
    CUevent ev;
    CUcontext ctx;
} pool[LP_POOL];
static int npool;
static struct lp_gpu_state *gpu[LP_MAX_DEVICES];
static int gpu_tried[LP_MAX_DEVICES];

/* ------------------------------------------------------------------------------------------------
 * events */

static CUevent ev_get(CUcontext ctx) {
    for (int i = npool - 1; i >= 0; i--) {
        if (pool[i].ctx == ctx) {
            CUevent e = pool[i].ev;
            pool[i] = pool[--npool];
            return e;
        }
    }
    CUevent e = NULL;
    CUresult rc = lp_real_cuEventCreate(&e, CU_EVENT_DEFAULT);
    if (rc != CUDA_SUCCESS) {
        lp_report("cuEventCreate failed (error %d); launches are not timed and the compute quota is not held", rc);
        return NULL;
    }
    return e;
}

static void ev_put(CUevent e, CUcontext ctx, int healthy) {
    if (!e)
        return;
    if (healthy && npool < LP_POOL) {
        pool[npool].ev = e;
        pool[npool].ctx = ctx;
        npool++;
    } else if (lp_real_cuEventDestroy_v2) {
        lp_real_cuEventDestroy_v2(e);
    }
}

/* ------------------------------------------------------------------------------------------------
 * the token bucket */

static struct lp_bucket *bucket(int dev) { return (struct lp_bucket *)lp_acct_compute(dev); }

static double quota(int dev) {
    int u = lp_cfg.units[dev];
    return u > 0 ? (double)u / (double)lp_cfg.units_per_gpu : 0.0;
}

static int64_t refill(int dev, double q) {
    struct lp_bucket *b = bucket(dev);
    int64_t burst = (int64_t)(q * (double)lp_cfg.window_ns);
    uint64_t now = lp_now_ns();
    uint64_t last = __atomic_load_n(&b->last_ns, __ATOMIC_ACQUIRE);
    if (last == 0 || last > now + 1000000000ULL) { /* a new bucket, or stamped before a reboot: start empty */
        __atomic_compare_exchange_n(&b->last_ns, &last, now, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    } else if (now > last &&
               __atomic_compare_exchange_n(&b->last_ns, &last, now, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        double add = (double)(now - last) * q;
        if (add > 2.0 * (double)burst + 1.0)
            add = 2.0 * (double)burst + 1.0;
        int64_t t = __atomic_add_fetch(&b->tokens_ns, (int64_t)add, __ATOMIC_ACQ_REL);
        while (t > burst &&
               !__atomic_compare_exchange_n(&b->tokens_ns, &t, burst, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        }
    }
    return __atomic_load_n(&b->tokens_ns, __ATOMIC_ACQUIRE);
}

static void charge(int dev, uint64_t busy_ns) {
    if (quota(dev) > 0 && busy_ns)
        __atomic_sub_fetch(&bucket(dev)->tokens_ns, (int64_t)busy_ns, __ATOMIC_ACQ_REL);
}

/* ------------------------------------------------------------------------------------------------
 * streams and their intervals (c_lock held) */

static void measure(struct lp_stream *st, struct lp_ival *iv, CUresult done) {
    float ms = 0;
    uint64_t busy;
    int healthy = done == CUDA_SUCCESS;
    if (healthy && lp_real_cuEventElapsedTime(&ms, iv->start, iv->end) == CUDA_SUCCESS && ms >= 0)
        busy = (uint64_t)((double)ms * 1e6);
    else /* the context went away, or timing failed: assume the usual */
        busy = st->calibrated ? (uint64_t)(st->ns_per_launch * iv->launches) : 0;
    if (iv->launches) {
        double per = (double)busy / iv->launches;
        st->ns_per_launch = st->calibrated ? 0.7 * st->ns_per_launch + 0.3 * per : per;
        st->calibrated = 1;
    }
    st->pending -= iv->launches < st->pending ? iv->launches : st->pending;
    charge(st->dev, busy);
    ev_put(iv->start, st->ctx, healthy);
    ev_put(iv->end, st->ctx, healthy);
    iv->start = iv->end = NULL;
}

static void poll_stream(struct lp_stream *st) {
    while (st->count) {
        struct lp_ival *iv = &st->ring[st->head];
        CUresult done = lp_real_cuEventQuery(iv->end);
        if (done == CUDA_ERROR_NOT_READY)
            return;
        measure(st, iv, done);
        st->head = (st->head + 1) % LP_RING;
        st->count--;
    }
    if (st->open_valid && st->open.launches) {
        CUresult done = lp_real_cuEventQuery(st->open.end);
        if (done == CUDA_ERROR_NOT_READY)
            return;
        measure(st, &st->open, done); /* the GPU caught up: the next launch starts a new interval */
        st->open_valid = 0;
    }
}

static void poll_all(void) {
    for (int i = 0; i < LP_MAX_STREAMS; i++)
        if (streams[i].used && (streams[i].count || (streams[i].open_valid && streams[i].open.launches)))
            poll_stream(&streams[i]);
}

static double inflight(int dev) {
    double sum = 0;
    for (int i = 0; i < LP_MAX_STREAMS; i++)
        if (streams[i].used && streams[i].dev == dev && streams[i].calibrated)
            sum += (double)streams[i].pending * streams[i].ns_per_launch;
    return sum;
}

static struct lp_stream *stream_get(CUcontext ctx, CUstream s, pid_t tid, int dev) {
    struct lp_stream *fresh = NULL, *idle = NULL;
    for (int i = 0; i < LP_MAX_STREAMS; i++) {
        struct lp_stream *st = &streams[i];
        if (st->used && st->ctx == ctx && st->stream == s && st->tid == tid) {
            st->last_use = ++use_clock;
            return st;
        }
        if (!st->used) {
            if (!fresh)
                fresh = st;
        } else if (!st->count && !(st->open_valid && st->open.launches) && (!idle || st->last_use < idle->last_use)) {
            idle = st;
        }
    }
    struct lp_stream *st = fresh ? fresh : idle;
    if (!st)
        return NULL;
    if (st->used && st->open_valid)
        ev_put(st->open.start, st->ctx, 1);
    memset(st, 0, sizeof *st);
    st->used = 1;
    st->dev = dev;
    st->ctx = ctx;
    st->stream = s;
    st->tid = tid;
    st->last_use = ++use_clock;
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * priority: the per-GPU state file */

static void gpu_key(int dev, char *out, size_t n) {
    const char *nvd = getenv("NVIDIA_VISIBLE_DEVICES");
    char entry[128] = "";
    if (nvd) {
        const char *p = nvd;
        for (int i = 0; i < dev && p; i++) {
            p = strchr(p, ',');
            p = p ? p + 1 : NULL;
        }
        if (p) {
            size_t len = strcspn(p, ",");
            snprintf(entry, sizeof entry, "%.*s", (int)(len < sizeof entry - 1 ? len : sizeof entry - 1), p);
        }
    }
    CUuuid u;
    if (!strncmp(entry, "GPU-", 4) || !strncmp(entry, "MIG-", 4)) {
        snprintf(out, n, "%s", entry);
    } else if (lp_real_cuDeviceGetUuid && lp_real_cuDeviceGetUuid(&u, dev) == CUDA_SUCCESS) {
        const unsigned char *b = (const unsigned char *)u.bytes;
        snprintf(out, n, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
                 b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    } else if (isdigit((unsigned char)entry[0])) {
        snprintf(out, n, "index-%s", entry);
    } else {
        snprintf(out, n, "index-%d", dev);
    }
    for (char *c = out; *c; c++)
        if (!isalnum((unsigned char)*c) && *c != '-' && *c != '_' && *c != '.')
            *c = '_';
}

static struct lp_gpu_state *open_state(int dev) {
    char key[160], path[PATH_MAX + 200];
    gpu_key(dev, key, sizeof key);
    snprintf(path, sizeof path, "%s/%s.lpstate", lp_cfg.state_dir, key);
    const char *prio = lp_cfg.priority == LP_PRIO_HIGH ? "high" : "low";
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        lp_report("GPU state file %s unusable (%s); priority %s is not applied", path, strerror(errno), prio);
        return NULL;
    }
    (void)fchmod(fd, 0666);
    void *m = MAP_FAILED;
    off_t size = lseek(fd, 0, SEEK_END);
    if (size >= 0 && (size >= LP_STATE_BYTES || ftruncate(fd, LP_STATE_BYTES) == 0))
        m = mmap(NULL, LP_STATE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (m == MAP_FAILED) {
        lp_report("GPU state file %s unusable (%s); priority %s is not applied", path, strerror(err), prio);
        return NULL;
    }
    return m;
}

static struct lp_gpu_state *gpu_state(int dev) {
    if (lp_cfg.priority == LP_PRIO_NORMAL || !lp_cfg.state_dir[0])
        return NULL;
    if (__atomic_load_n(&gpu_tried[dev], __ATOMIC_ACQUIRE))
        return gpu[dev];
    pthread_mutex_lock(&gpu_lock);
    if (!gpu_tried[dev]) {
        gpu[dev] = open_state(dev);
        __atomic_store_n(&gpu_tried[dev], 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&gpu_lock);
    return gpu[dev];
}

static void mark_high(int dev) {
    struct lp_gpu_state *g = gpu[dev];
    uint64_t until = lp_now_ns() + lp_cfg.hold_ns;
    uint64_t cur = __atomic_load_n(&g->high_busy_until_ns, __ATOMIC_ACQUIRE);
    while (cur < until &&
           !__atomic_compare_exchange_n(&g->high_busy_until_ns, &cur, until, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
    __atomic_add_fetch(&g->high_launches, 1, __ATOMIC_RELAXED);
}

/* how long a low-priority launch must still wait for the high-priority ones (0: not at all) */
static uint64_t high_busy_for(int dev) {
    struct lp_gpu_state *g = gpu[dev];
    uint64_t until = __atomic_load_n(&g->high_busy_until_ns, __ATOMIC_ACQUIRE), now = lp_now_ns();
    return until > now ? until - now : 0;
}

/* ------------------------------------------------------------------------------------------------
 * around a launch */

struct lp_launch {
    int locked;
    int mark_dev;
    struct lp_stream *st;
    CUstream es;
    CUcontext ctx;
};

static void nap(uint64_t ns) { lp_sleep_ns(ns < 20000 ? 20000 : ns > 2000000 ? 2000000 : ns); }

static void launch_begin(struct lp_launch *L, CUstream stream, int ptsz) {
    memset(L, 0, sizeof *L);
    L->mark_dev = -1;
    if (!lp_cfg.any_quota && lp_cfg.priority == LP_PRIO_NORMAL)
        return;
    int dev, capturing = 0;
    if (lp_current_device(&dev) != 0 || dev >= LP_MAX_DEVICES)
        return;
    CUstream es = ptsz && !stream ? LP_CU_STREAM_PER_THREAD : stream;
    pid_t tid = es == LP_CU_STREAM_PER_THREAD ? (pid_t)syscall(SYS_gettid) : 0;
    if (lp_real_cuStreamIsCapturing &&
        (lp_real_cuStreamIsCapturing(es, &capturing) != CUDA_SUCCESS || capturing != CU_STREAM_CAPTURE_STATUS_NONE))
        return; /* captured into a graph: nothing runs now; the graph's launch is paced */
    double q = quota(dev);
    int prio = gpu_state(dev) ? lp_cfg.priority : LP_PRIO_NORMAL;
    if (prio == LP_PRIO_HIGH)
        L->mark_dev = dev;
    if (q <= 0 && prio != LP_PRIO_LOW)
        return;
    CUcontext ctx = NULL;
    if (!lp_real_cuEventCreate || !lp_real_cuEventRecord || !lp_real_cuEventQuery || !lp_real_cuEventElapsedTime ||
        !lp_real_cuCtxGetCurrent || lp_real_cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) {
        for (uint64_t w; prio == LP_PRIO_LOW && (w = high_busy_for(dev)) != 0;)
            nap(w);
        return;
    }
    uint64_t bound = 2 * lp_cfg.window_ns > 50000000ULL ? 2 * lp_cfg.window_ns : 50000000ULL;
    uint64_t deadline = lp_now_ns() + bound;
    struct lp_stream *st;
    for (;;) {
        pthread_mutex_lock(&c_lock);
        poll_all();
        st = stream_get(ctx, es, tid, dev);
        uint64_t wait = 0;
        int bounded = 1;
        if (prio == LP_PRIO_LOW && (wait = high_busy_for(dev)) != 0) {
            bounded = 0; /* yield for as long as a high-priority process keeps the GPU busy */
        } else if (!st) {
            wait = 1000000;
        } else if (st->count == LP_RING || (!st->calibrated && st->pending >= LP_K)) {
            wait = 200000; /* wait for the GPU to finish some work, or for a first measurement */
        } else {
            double infl = inflight(dev);
            if (q > 0) {
                double tokens = (double)refill(dev, q);
                if (tokens < 0) {
                    wait = (uint64_t)(-tokens / q); /* debt for measured work: no bound */
                    bounded = 0;
                } else if (tokens < infl) {
                    wait = (uint64_t)((infl - tokens) / q);
                }
            }
            if (!wait && prio == LP_PRIO_LOW && infl > (double)LP_LOW_INFLIGHT_NS)
                wait = (uint64_t)(infl - (double)LP_LOW_INFLIGHT_NS);
        }
        if (!wait || (bounded && lp_now_ns() >= deadline)) /* never wait on the GPU without end */
            break;
        pthread_mutex_unlock(&c_lock);
        nap(wait);
    }
    L->locked = 1;
    if (!st) {
        lp_report("more than %d streams launch at once; some launches are not timed", LP_MAX_STREAMS);
        return;
    }
    if (st->count == LP_RING)
        return;
    if (st->open_valid && st->open.launches >= LP_K) {
        st->ring[(st->head + st->count) % LP_RING] = st->open;
        st->count++;
        st->open_valid = 0;
    }
    if (!st->open_valid || st->open.launches == 0) {
        CUevent e = st->open_valid ? st->open.start : ev_get(ctx);
        st->open_valid = 0;
        if (!e)
            return;
        if (lp_real_cuEventRecord(e, es) != CUDA_SUCCESS) {
            ev_put(e, ctx, 0);
            return;
        }
        st->open = (struct lp_ival){e, NULL, 0};
        st->open_valid = 1;
    }
    L->st = st;
    L->es = es;
    L->ctx = ctx;
}

static void launch_end(struct lp_launch *L, CUresult rc) {
    struct lp_stream *st = L->st;
    if (st && rc == CUDA_SUCCESS) {
        if (!st->open.end)
            st->open.end = ev_get(L->ctx);
        if (st->open.end && lp_real_cuEventRecord(st->open.end, L->es) == CUDA_SUCCESS) {
            st->open.launches++;
            st->pending++;
        }
    }
    if (L->locked)
        pthread_mutex_unlock(&c_lock);
    if (L->mark_dev >= 0 && rc == CUDA_SUCCESS)
        mark_high(L->mark_dev);
}

void lp_compute_atfork_prepare(void) {
    pthread_mutex_lock(&c_lock);
    pthread_mutex_lock(&gpu_lock);
}

void lp_compute_atfork_parent(void) {
    pthread_mutex_unlock(&gpu_lock);
    pthread_mutex_unlock(&c_lock);
}

void lp_compute_atfork_child(void) { /* the parent's events and contexts mean nothing here */
    pthread_mutex_init(&gpu_lock, NULL);
    pthread_mutex_init(&c_lock, NULL);
    memset(streams, 0, sizeof streams);
    npool = 0;
}

/* ------------------------------------------------------------------------------------------------
 * the wrappers */

#define LP_LAUNCH(name, ptsz, stream, call)                                                                            \
    do {                                                                                                               \
        if (!lp_driver() || !lp_real_##name)                                                                           \
            return lp_missing(#name);                                                                                  \
        if (!lp_enabled())                                                                                             \
            return lp_real_##name call;                                                                                \
        struct lp_launch L_;                                                                                           \
        launch_begin(&L_, (stream), (ptsz));                                                                           \
        CUresult rc_ = lp_real_##name call;                                                                            \
        launch_end(&L_, rc_);                                                                                          \
        return rc_;                                                                                                    \
    } while (0)

LP_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                  unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void **params,
                                  void **extra) {
    LP_LAUNCH(cuLaunchKernel, 0, s, (f, gx, gy, gz, bx, by, bz, shmem, s, params, extra));
}

LP_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                       unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void **params,
                                       void **extra) {
    LP_LAUNCH(cuLaunchKernel_ptsz, 1, s, (f, gx, gy, gz, bx, by, bz, shmem, s, params, extra));
}

LP_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
    LP_LAUNCH(cuLaunchKernelEx, 0, config ? config->hStream : NULL, (config, f, params, extra));
}

LP_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
    LP_LAUNCH(cuLaunchKernelEx_ptsz, 1, config ? config->hStream : NULL, (config, f, params, extra));
}

LP_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                             unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                             CUstream s, void **params) {
    LP_LAUNCH(cuLaunchCooperativeKernel, 0, s, (f, gx, gy, gz, bx, by, bz, shmem, s, params));
}

LP_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                                  unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                                  CUstream s, void **params) {
    LP_LAUNCH(cuLaunchCooperativeKernel_ptsz, 1, s, (f, gx, gy, gz, bx, by, bz, shmem, s, params));
}

LP_EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { LP_LAUNCH(cuGraphLaunch, 0, s, (g, s)); }

LP_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { LP_LAUNCH(cuGraphLaunch_ptsz, 1, s, (g, s)); }
