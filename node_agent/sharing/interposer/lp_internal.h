/* Internal interfaces shared by the interposer's files. Nothing here is exported from the library
 * except the CUDA entry points it wraps (and dlsym), which carry LP_EXPORT. */
#ifndef LP_INTERNAL_H
#define LP_INTERNAL_H

#include <limits.h>
#include <stdint.h>
#include <sys/types.h>

#include "lp_cuda_types.h"
#include "lp_hooks.h"

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

#define LP_DECLARE_REAL(name, args)                                                                                    \
    typedef CUresult(*lp_pfn_##name) args;                                                                             \
    extern LP_HIDDEN lp_pfn_##name lp_real_##name;
#define LP_DECLARE_HOOKED(name, family, since, per_thread, args)                                                       \
    LP_DECLARE_REAL(name, args)                                                                                        \
    extern LP_EXPORT CUresult name args;
LP_HOOKED_FUNCS(LP_DECLARE_HOOKED)
LP_HELPER_FUNCS(LP_DECLARE_REAL)
#undef LP_DECLARE_HOOKED
#undef LP_DECLARE_REAL

enum lp_priority { LP_PRIO_NORMAL = 0, LP_PRIO_HIGH = 1, LP_PRIO_LOW = 2 };

struct lp_config {
    int enabled;                      /* LINKPACK_INTERPOSER != off */
    int any_mem_cap;                  /* some device has a memory cap */
    uint64_t mem_cap[LP_MAX_DEVICES]; /* bytes; 0 = no cap */
    int units[LP_MAX_DEVICES];        /* compute units; 0 = no quota */
    int units_per_gpu;                /* LINKPACK_UNITS_PER_GPU, default 100 */
    int any_quota;                    /* some device has 0 < units < units_per_gpu */
    int priority;                     /* enum lp_priority */
    uint64_t window_ns;               /* pacing window (LINKPACK_COMPUTE_WINDOW_MS) */
    uint64_t hold_ns;                 /* how long a high-priority launch marks the GPU busy */
    char accounting_path[PATH_MAX];
    char state_dir[PATH_MAX]; /* empty: no priority coordination */
    char real_lib[PATH_MAX];
};

extern LP_HIDDEN struct lp_config lp_cfg;

/* linkpack_cuda.c */
LP_HIDDEN void lp_init(void);                    /* reads the environment once */
LP_HIDDEN int lp_enabled(void);                  /* lp_init + kill switch */
LP_HIDDEN int lp_driver(void);                   /* real driver loaded and resolved (1) or not (0) */
LP_HIDDEN CUresult lp_missing(const char *name); /* reports a missing real entry point */
LP_HIDDEN void lp_report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
LP_HIDDEN int lp_current_device(int *dev); /* 0 when the current context's device is known */
LP_HIDDEN uint64_t lp_now_ns(void);
LP_HIDDEN void lp_sleep_ns(uint64_t ns);

/* lp_accounting.c: the container's accounting file (LINKPACK_ACCOUNTING_FILE), mmap'ed by all its
 * processes: a slot per process with its memory use per device, and LP_ACCT_COMPUTE_WORDS words per
 * device (all zero at first) that lp_compute.c keeps its token bucket in. Without a usable file, a
 * table of this process's own.
 *   lp_acct_lock     takes the process's lock and the file's (attaching first, once per process) and
 *                    clears the slots of processes known dead; lp_acct_unlock lets both go.
 *   lp_acct_reclaim  (locked) clears the slots of dead processes, asking /proc too.
 *   lp_acct_used     (locked) the bytes the container's processes use on a device.
 *   lp_acct_add      (locked) adds to, and takes from (not below 0), this process's use of a device.
 *   lp_acct_compute  a device's words for the compute quota (attaching first if need be). */
#define LP_ACCT_COMPUTE_WORDS 4

LP_HIDDEN void lp_acct_lock(void);
LP_HIDDEN void lp_acct_unlock(void);
LP_HIDDEN void lp_acct_reclaim(void);
LP_HIDDEN uint64_t lp_acct_used(int dev);
LP_HIDDEN void lp_acct_add(int dev, uint64_t more, uint64_t less);
LP_HIDDEN uint64_t *lp_acct_compute(int dev);
LP_HIDDEN void lp_accounting_atfork_prepare(void);
LP_HIDDEN void lp_accounting_atfork_parent(void);
LP_HIDDEN void lp_accounting_atfork_child(void);

/* lp_memory.c */
LP_HIDDEN void lp_memory_atfork_prepare(void);
LP_HIDDEN void lp_memory_atfork_parent(void);
LP_HIDDEN void lp_memory_atfork_child(void);

/* lp_compute.c */
LP_HIDDEN void lp_compute_atfork_prepare(void);
LP_HIDDEN void lp_compute_atfork_parent(void);
LP_HIDDEN void lp_compute_atfork_child(void);

#endif
