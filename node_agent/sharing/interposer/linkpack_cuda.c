/* Linkpack's CUDA driver-API interposer: the core.
 *
 * Loaded with LD_PRELOAD into share containers. This file reads the configuration, loads the real
 * driver (dlopen of libcuda.so.1, never RTLD_NEXT: runtimes dlopen the driver themselves), and
 * makes sure every way a program can reach a hooked entry point ends at the wrapper:
 *   - programs linked against libcuda bind to the wrappers exported here (LD_PRELOAD comes first);
 *   - dlsym() is interposed: a lookup that would return a real hooked function returns its wrapper;
 *   - cuGetProcAddress / cuGetProcAddress_v2 (how CUDA 12/13 runtimes get every entry point) are
 *     wrapped: the driver's answer is mapped to the wrapper of the same function, by address, or
 *     failing that by name, version and per-thread-stream flag.
 * The hooked entry points are listed once, in lp_hooks.h. The memory wrappers live in lp_memory.c,
 * the launch wrappers in lp_compute.c, the accounting file they share in lp_accounting.c.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "lp_internal.h"

struct lp_config lp_cfg;

#define LP_DEFINE_REAL(name, args) lp_pfn_##name lp_real_##name;
#define LP_DEFINE_HOOKED_REAL(name, family, since, per_thread, args) LP_DEFINE_REAL(name, args)
LP_HOOKED_FUNCS(LP_DEFINE_HOOKED_REAL)
LP_HELPER_FUNCS(LP_DEFINE_REAL)
#undef LP_DEFINE_HOOKED_REAL
#undef LP_DEFINE_REAL

/* ------------------------------------------------------------------------------------------------
 * reporting: one line per distinct problem on stderr, prefix "linkpack-interposer:" */

static pthread_mutex_t report_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t reported[128];
static unsigned n_reported;

void lp_report(const char *fmt, ...) {
    char line[512];
    int off = snprintf(line, sizeof line, "linkpack-interposer: ");
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line + off, sizeof line - (size_t)off - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)off + (n < 0 ? 0 : (size_t)n);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    uint64_t h = 1469598103934665603ULL; /* FNV-1a of the message: each distinct one only once */
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)line[i]) * 1099511628211ULL;
    pthread_mutex_lock(&report_lock);
    for (unsigned i = 0; i < n_reported; i++) {
        if (reported[i] == h) {
            pthread_mutex_unlock(&report_lock);
            return;
        }
    }
    if (n_reported < sizeof reported / sizeof reported[0])
        reported[n_reported++] = h;
    pthread_mutex_unlock(&report_lock);
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}

CUresult lp_missing(const char *name) {
    if (!lp_driver())
        lp_report("real CUDA driver %s could not be loaded; %s fails with CUDA_ERROR_NOT_FOUND", lp_cfg.real_lib, name);
    else
        lp_report("real driver has no %s; the call fails with CUDA_ERROR_NOT_FOUND", name);
    return CUDA_ERROR_NOT_FOUND;
}

uint64_t lp_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

void lp_sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ULL), (long)(ns % 1000000000ULL)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

/* ------------------------------------------------------------------------------------------------
 * configuration */

static int parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    while (*s == ' ')
        s++;
    if (*s == '-' || *s == '\0')
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    while (*end == ' ')
        end++;
    if (errno || end == s || *end != '\0')
        return -1;
    *out = v;
    return 0;
}

/* "a,b,c" -> one value per device; a single value applies to every device (as the framework shim
 * reads LINKPACK_MEMORY_LIMIT_MIB). Returns -1 when malformed (then nothing is set). */
static int parse_per_device(const char *name, uint64_t *vals) {
    const char *text = getenv(name);
    uint64_t got[LP_MAX_DEVICES];
    int n = 0;
    if (!text || !*text)
        return 0;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", text);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == LP_MAX_DEVICES || parse_u64(tok, &got[n]) != 0) {
            lp_report("%s=%s is not a list of whole numbers; it is ignored", name, text);
            return -1;
        }
        n++;
    }
    for (int d = 0; d < LP_MAX_DEVICES; d++)
        vals[d] = n == 1 ? got[0] : d < n ? got[d] : 0;
    return n;
}

static uint64_t env_ms(const char *name, uint64_t dflt) {
    const char *text = getenv(name);
    uint64_t v;
    if (!text || !*text)
        return dflt * 1000000ULL;
    if (parse_u64(text, &v) != 0 || v == 0 || v > 3600000) {
        lp_report("%s=%s is not a number of milliseconds; using %llu", name, text, (unsigned long long)dflt);
        v = dflt;
    }
    return v * 1000000ULL;
}

/* The locks in the order they are taken: compute's, then the accounting file's, then memory's map. */
static void atfork_prepare(void) {
    lp_compute_atfork_prepare();
    lp_accounting_atfork_prepare();
    lp_memory_atfork_prepare();
}
static void atfork_parent(void) {
    lp_memory_atfork_parent();
    lp_accounting_atfork_parent();
    lp_compute_atfork_parent();
}
static void atfork_child(void) {
    lp_memory_atfork_child();
    lp_accounting_atfork_child();
    lp_compute_atfork_child();
}

static void read_config(void) {
    const char *sw = getenv("LINKPACK_INTERPOSER");
    lp_cfg.enabled = !(sw && (!strcasecmp(sw, "off") || !strcmp(sw, "0") || !strcasecmp(sw, "false") ||
                              !strcasecmp(sw, "no") || !strcasecmp(sw, "disabled")));
    const char *lib = getenv("LINKPACK_REAL_LIBCUDA");
    snprintf(lp_cfg.real_lib, sizeof lp_cfg.real_lib, "%s", lib && *lib ? lib : "libcuda.so.1");
    if (!lp_cfg.enabled)
        return;

    uint64_t vals[LP_MAX_DEVICES] = {0};
    if (parse_per_device("LINKPACK_MEMORY_LIMIT_MIB", vals) > 0) {
        for (int d = 0; d < LP_MAX_DEVICES; d++) {
            lp_cfg.mem_cap[d] = vals[d] > (UINT64_MAX >> 20) ? UINT64_MAX : vals[d] << 20;
            lp_cfg.any_mem_cap |= lp_cfg.mem_cap[d] != 0;
        }
    }

    uint64_t upg = 100;
    const char *t = getenv("LINKPACK_UNITS_PER_GPU");
    if (t && *t && (parse_u64(t, &upg) != 0 || upg == 0 || upg > 1000000)) {
        lp_report("LINKPACK_UNITS_PER_GPU=%s is not a positive number; using 100", t);
        upg = 100;
    }
    lp_cfg.units_per_gpu = (int)upg;
    uint64_t units[LP_MAX_DEVICES] = {0};
    if (parse_per_device("LINKPACK_COMPUTE_UNITS", units) > 0) {
        for (int d = 0; d < LP_MAX_DEVICES; d++) {
            lp_cfg.units[d] = units[d] >= upg ? 0 : (int)units[d]; /* a whole GPU or more: no quota */
            lp_cfg.any_quota |= lp_cfg.units[d] != 0;
        }
    }
    lp_cfg.window_ns = env_ms("LINKPACK_COMPUTE_WINDOW_MS", 100);
    lp_cfg.hold_ns = env_ms("LINKPACK_PRIORITY_HOLD_MS", 20);

    const char *p = getenv("LINKPACK_COMPUTE_PRIORITY");
    lp_cfg.priority = LP_PRIO_NORMAL;
    if (p && *p) {
        if (!strcasecmp(p, "high"))
            lp_cfg.priority = LP_PRIO_HIGH;
        else if (!strcasecmp(p, "low"))
            lp_cfg.priority = LP_PRIO_LOW;
        else if (strcasecmp(p, "normal") != 0)
            lp_report("LINKPACK_COMPUTE_PRIORITY=%s is not high, normal or low; using normal", p);
    }
    const char *dir = getenv("LINKPACK_GPU_STATE_DIR");
    snprintf(lp_cfg.state_dir, sizeof lp_cfg.state_dir, "%s", dir ? dir : "");
    if (lp_cfg.priority != LP_PRIO_NORMAL && !lp_cfg.state_dir[0])
        lp_report("LINKPACK_COMPUTE_PRIORITY=%s needs LINKPACK_GPU_STATE_DIR; priority is not applied", p);

    const char *acct = getenv("LINKPACK_ACCOUNTING_FILE");
    snprintf(lp_cfg.accounting_path, sizeof lp_cfg.accounting_path, "%s",
             acct && *acct ? acct : "/tmp/linkpack-accounting");
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

static pthread_once_t config_once = PTHREAD_ONCE_INIT;

void lp_init(void) { pthread_once(&config_once, read_config); }

int lp_enabled(void) {
    lp_init();
    return lp_cfg.enabled;
}

/* ------------------------------------------------------------------------------------------------
 * the real dlsym, and the interposed one */

typedef void *(*lp_dlsym_fn)(void *, const char *);
LP_HIDDEN __attribute__((used)) lp_dlsym_fn lp_real_dlsym_ptr;

static lp_dlsym_fn real_dlsym(void) {
    lp_dlsym_fn fn = __atomic_load_n(&lp_real_dlsym_ptr, __ATOMIC_ACQUIRE);
    if (fn)
        return fn;
    /* glibc >= 2.34 puts dlsym in libc at GLIBC_2.34; older ones at the architecture's base version */
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.27",
                                           "GLIBC_2.3",  "GLIBC_2.4",   "GLIBC_2.0",  NULL};
    for (int i = 0; versions[i]; i++) {
        void *p = dlvsym(RTLD_NEXT, "dlsym", versions[i]);
        if (p && p != (void *)&dlsym) {
            fn = (lp_dlsym_fn)p;
            __atomic_store_n(&lp_real_dlsym_ptr, fn, __ATOMIC_RELEASE);
            return fn;
        }
    }
    lp_report("the C library's dlsym could not be found; symbol lookups fail");
    return NULL;
}

/* ------------------------------------------------------------------------------------------------
 * the real driver */

static pthread_mutex_t driver_lock = PTHREAD_MUTEX_INITIALIZER;
static int driver_state; /* 0 not tried, 2 tried */
static void *driver_handle;
static __thread int loading_driver;

struct lp_hook {
    const char *name;
    void *wrapper;
    void **real;
};

#define LP_HOOK_ENTRY(name, family, since, per_thread, args) {#name, (void *)&name, (void **)&lp_real_##name},
static const struct lp_hook hooks[] = {LP_HOOKED_FUNCS(LP_HOOK_ENTRY){NULL, NULL, NULL}};
#undef LP_HOOK_ENTRY

static void load_driver(void) {
    lp_dlsym_fn sym = real_dlsym();
    driver_handle = sym ? dlopen(lp_cfg.real_lib, RTLD_LAZY | RTLD_LOCAL) : NULL;
    if (!driver_handle) {
        const char *err = dlerror();
        lp_report("real CUDA driver %s not loadable (%s); CUDA calls fail and no limit is held", lp_cfg.real_lib,
                  err ? err : "no dlsym");
        return;
    }
#define LP_RESOLVE(name, args) lp_real_##name = (lp_pfn_##name)sym(driver_handle, #name);
#define LP_RESOLVE_HOOKED(name, family, since, per_thread, args) LP_RESOLVE(name, args)
    LP_HOOKED_FUNCS(LP_RESOLVE_HOOKED)
    LP_HELPER_FUNCS(LP_RESOLVE)
#undef LP_RESOLVE_HOOKED
#undef LP_RESOLVE
    if (!lp_real_cuEventElapsedTime) /* renamed _v2 in CUDA 12.8+ drivers that might drop the old one */
        lp_real_cuEventElapsedTime = (lp_pfn_cuEventElapsedTime)sym(driver_handle, "cuEventElapsedTime_v2");
    for (const struct lp_hook *h = hooks; h->name; h++) {
        if (*h->real == h->wrapper) { /* the "driver" is this library: refuse to call ourselves */
            lp_report("%s resolves to the interposer itself; set LINKPACK_REAL_LIBCUDA to the driver", lp_cfg.real_lib);
            *h->real = NULL;
        }
    }
    if (lp_cfg.any_quota && (!lp_real_cuEventCreate || !lp_real_cuEventRecord || !lp_real_cuEventQuery ||
                             !lp_real_cuEventElapsedTime || !lp_real_cuCtxGetCurrent))
        lp_report("driver lacks the event entry points; the compute quota is not held");
}

int lp_driver(void) {
    if (__atomic_load_n(&driver_state, __ATOMIC_ACQUIRE) == 2)
        return driver_handle != NULL;
    if (loading_driver) /* dlsym or a wrapper called from the driver's own start-up */
        return 0;
    lp_init();
    pthread_mutex_lock(&driver_lock);
    if (driver_state != 2) {
        loading_driver = 1;
        load_driver();
        loading_driver = 0;
        __atomic_store_n(&driver_state, 2, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&driver_lock);
    return driver_handle != NULL;
}

int lp_current_device(int *dev) {
    CUdevice d;
    if (!lp_real_cuCtxGetDevice || lp_real_cuCtxGetDevice(&d) != CUDA_SUCCESS || d < 0)
        return -1;
    *dev = d;
    return 0;
}

static const struct lp_hook *hook_by_name(const char *name) {
    for (const struct lp_hook *h = hooks; h->name; h++)
        if (!strcmp(h->name, name))
            return h;
    return NULL;
}

static const struct lp_hook *hook_by_real(const void *fn) {
    for (const struct lp_hook *h = hooks; h->name; h++)
        if (*h->real && *h->real == fn)
            return h;
    return NULL;
}

/* How the driver maps cuGetProcAddress's (name, cudaVersion, per-thread flag) to an entry point, for
 * the hooked families (lp_hooks.h). variant NULL: an entry point the interposer does not wrap (the
 * 32-bit legacy ones), reported when asked for. */
struct lp_proc {
    const char *base;
    int since;
    int per_thread;
    const char *variant;
};

#define LP_PROC_HOOKED(name, family, since, per_thread, args) {#family, since, per_thread, #name},
#define LP_PROC_LEGACY(family, since) {#family, since, 0, NULL},
static const struct lp_proc procs[] = {
    LP_HOOKED_FUNCS(LP_PROC_HOOKED) /* the wrapped entry points */
    LP_LEGACY_FUNCS(LP_PROC_LEGACY) /* the legacy ones, not wrapped */
    {NULL, 0, 0, NULL},
};
#undef LP_PROC_LEGACY
#undef LP_PROC_HOOKED

/* The wrapper for (symbol, version, flags) by the table above; *family says whether the name is a
 * hooked family at all. */
static const struct lp_hook *hook_by_proc(const char *symbol, int version, cuuint64_t flags, int *family) {
    int want_pt = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const struct lp_proc *best = NULL;
    *family = 0;
    for (int pass = 0; pass < 2 && !best; pass++) {
        int pt = pass == 0 ? want_pt : 0; /* a family without per-thread variants uses the plain one */
        for (const struct lp_proc *p = procs; p->base; p++) {
            if (strcmp(p->base, symbol) != 0)
                continue;
            *family = 1;
            if (p->per_thread == pt && p->since <= version && (!best || p->since >= best->since))
                best = p;
        }
        if (!want_pt)
            break;
    }
    return best && best->variant ? hook_by_name(best->variant) : NULL;
}

/* What a hooked-family symbol that maps to no wrapper means for the limits. */
static void report_unwrapped(const char *symbol, int version, cuuint64_t flags) {
    lp_report("no wrapper for %s at CUDA version %d (flags %llu); calls through it are not held to the limits", symbol,
              version, (unsigned long long)flags);
}

static void fix_proc_address(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    int family = 0;
    const struct lp_hook *h = hook_by_real(*pfn);
    if (!h)
        h = hook_by_proc(symbol, version, flags, &family);
    if (!h && !family && (h = hook_by_name(symbol)) != NULL)
        family = 1;
    if (h && *h->real)
        *pfn = h->wrapper;
    else if (family)
        report_unwrapped(symbol, version, flags);
}

LP_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *symbolStatus) {
    if (!lp_driver() || !lp_real_cuGetProcAddress_v2)
        return lp_missing("cuGetProcAddress_v2");
    CUresult rc = lp_real_cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (rc == CUDA_SUCCESS && symbol && pfn && *pfn && lp_enabled())
        fix_proc_address(symbol, pfn, cudaVersion, flags);
    return rc;
}

LP_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    if (!lp_driver() || !lp_real_cuGetProcAddress)
        return lp_missing("cuGetProcAddress");
    CUresult rc = lp_real_cuGetProcAddress(symbol, pfn, cudaVersion, flags);
    if (rc == CUDA_SUCCESS && symbol && pfn && *pfn && lp_enabled())
        fix_proc_address(symbol, pfn, cudaVersion, flags);
    return rc;
}

/* Called by the dlsym entry below. Returns the wrapper to hand back, or NULL to let the C library's
 * dlsym answer (called so that it sees the original caller, which RTLD_NEXT depends on). */
LP_HIDDEN __attribute__((used)) void *lp_dlsym_hook(void *handle, const char *symbol) {
    if (!real_dlsym() || !symbol || symbol[0] != 'c' || symbol[1] != 'u' || loading_driver)
        return NULL;
    if (!lp_enabled())
        return NULL;
    const struct lp_hook *h = hook_by_name(symbol);
    if (!h) {
        int family = 0;
        hook_by_proc(symbol, 0, 0, &family); /* a legacy name of a hooked family, e.g. "cuMemAlloc" */
        if (family)
            lp_report("dlsym of legacy entry point %s: calls through it are not held to the limits", symbol);
        return NULL;
    }
    if (!lp_driver() || !*h->real)
        return NULL;
    if (handle == RTLD_NEXT) /* the next definition after a caller's is the driver's, or ours */
        return h->wrapper;
    void *found = lp_real_dlsym_ptr(handle, symbol);
    return found == *h->real ? h->wrapper : NULL;
}

#if defined(__x86_64__)
/* dlsym itself: ask the hook, and when it has no answer jump (not call) to the C library's dlsym so
 * that the return address it sees is our caller's: dlsym(RTLD_NEXT, ...) then still means "after the
 * caller", which a call from C here would turn into "after the interposer". */
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, @function\n"
        "dlsym:\n"
#if defined(__CET__)
        "    endbr64\n"
#endif
        "    push %rdi\n"
        "    push %rsi\n"
        "    sub $8, %rsp\n"
        "    call lp_dlsym_hook\n"
        "    add $8, %rsp\n"
        "    pop %rsi\n"
        "    pop %rdi\n"
        "    test %rax, %rax\n"
        "    jnz 1f\n"
        "    mov lp_real_dlsym_ptr(%rip), %rax\n"
        "    test %rax, %rax\n"
        "    jz 1f\n"
        "    jmp *%rax\n"
        "1:  ret\n"
        ".size dlsym, .-dlsym\n");
#else
/* Elsewhere the forward is a plain tail call, which GCC and Clang at -O2 compile to a jump. */
LP_EXPORT __attribute__((optimize("optimize-sibling-calls"))) void *dlsym(void *handle, const char *symbol) {
    void *w = lp_dlsym_hook(handle, symbol);
    if (w)
        return w;
    lp_dlsym_fn fn = __atomic_load_n(&lp_real_dlsym_ptr, __ATOMIC_ACQUIRE);
    return fn ? fn(handle, symbol) : NULL;
}
#endif
