/* The container's accounting file: what all its processes share.
 *
 * The accounting file (LINKPACK_ACCOUNTING_FILE) is mmap'ed by every process of the container. It
 * holds one slot per process (pid, start time, bytes in use per device), used by lp_memory.c, and a
 * few words per device in which lp_compute.c keeps the compute quota's token bucket. Changes to the
 * slots are made under flock() on a descriptor of the process's own (reopened after fork) plus a
 * process mutex: the kernel drops the file lock when a process dies, whatever kills it. A slot whose
 * process is gone (kill(pid, 0) fails with ESRCH, or /proc says zombie or a different start time) is
 * cleared the next time the table is touched, which reclaims the usage of a process killed
 * mid-allocation, SIGKILL included. When the file is unusable, this process keeps a table of its own
 * and its limits are held per process.
 *
 * Other processes read and write the file: its layout (struct lp_acct) is fixed, checked below.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
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
    uint64_t compute[LP_MAX_DEVICES][LP_ACCT_COMPUTE_WORDS]; /* lp_compute.c's token buckets */
    struct lp_slot slot[LP_MAX_PROCS];
};

/* the layout of version 1, which every process of a container must agree on */
_Static_assert(sizeof(struct lp_slot) == 144, "accounting file layout");
_Static_assert(offsetof(struct lp_acct, compute) == 64, "accounting file layout");
_Static_assert(offsetof(struct lp_acct, slot) == 576, "accounting file layout");
_Static_assert(sizeof(struct lp_acct) == 19008, "accounting file layout");

static pthread_mutex_t acct_lock = PTHREAD_MUTEX_INITIALIZER;
static struct lp_acct local_acct; /* when the shared file is unusable: this process alone */
static struct lp_acct *table;
static int acct_fd = -1;
static int my_slot = -1;
static pid_t my_pid;

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

/* ------------------------------------------------------------------------------------------------
 * attaching to the file */

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
        lp_report("accounting file %s unusable (%s); limits are held per process, not per container", path,
                  strerror(errno));
        use_local();
        return;
    }
    (void)fchmod(fd, 0666); /* every user of the container shares it, whatever the umask */
    while (flock(fd, LOCK_EX) == -1) {
        if (errno != EINTR) {
            lp_report("accounting file %s cannot be locked (%s); limits are held per process", path, strerror(errno));
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
        lp_report("accounting file %s unusable (%s); limits are held per process, not per container", path, why);
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

/* With acct_lock held: attach once per process (again in a forked child). */
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
    my_pid = me;
    attach_shared();
}

/* ------------------------------------------------------------------------------------------------
 * the interface */

void lp_acct_lock(void) {
    pthread_mutex_lock(&acct_lock);
    attach();
    if (acct_fd >= 0)
        while (flock(acct_fd, LOCK_EX) == -1 && errno == EINTR) {
        }
    reclaim(0);
}

void lp_acct_unlock(void) {
    if (acct_fd >= 0)
        flock(acct_fd, LOCK_UN);
    pthread_mutex_unlock(&acct_lock);
}

void lp_acct_reclaim(void) { reclaim(1); }

uint64_t lp_acct_used(int dev) {
    uint64_t sum = 0;
    for (int i = 0; i < (int)LP_MAX_PROCS; i++)
        if (table->slot[i].pid)
            sum += table->slot[i].used[dev];
    return sum;
}

void lp_acct_add(int dev, uint64_t more, uint64_t less) {
    uint64_t *u = &table->slot[my_slot].used[dev];
    *u += more;
    *u = *u > less ? *u - less : 0;
}

uint64_t *lp_acct_compute(int dev) {
    if (!(table && my_pid == getpid())) {
        pthread_mutex_lock(&acct_lock);
        attach();
        pthread_mutex_unlock(&acct_lock);
    }
    return table->compute[dev];
}

void lp_accounting_atfork_prepare(void) { pthread_mutex_lock(&acct_lock); }
void lp_accounting_atfork_parent(void) { pthread_mutex_unlock(&acct_lock); }
void lp_accounting_atfork_child(void) { pthread_mutex_init(&acct_lock, NULL); }
