/*
 * The memory group: the shared table, membership, the responder thread and give-way
 * (core/services/group.h). Cross-process waits are futexes on words of the shared mapping; the table's
 * robust mutex serializes joins, reaping and asks (an owner's death is EOWNERDEAD, repaired).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/hostmem.h"
#include "base/witness.h"
#include "core/device/check.h"
#include "core/services/group.h"
#include "core/process/procstate.h"
#include "core/process/settings.h"
#include "core/index/stats.h"
#include "core/services/trim.h"
#include "vmm/driver.h"

#define GROUP_MAGIC 0x3170726767657378ull /* "xseggrp1" */
#define GROUP_VERSION 3u
#define GROUP_SLOTS 64
#define GROUP_PID_MAX 4194304 /* /proc/sys/kernel/pid_max's ceiling */
/* The responder republishes this often, so a member's figures are at most this old. */
#define GROUP_PUBLISH_NS 100000000ll
/* A member that has not answered when memory_group_wait_ms is over is waited for while it is
 * answering, or its responder is runnable (waiting for a CPU) with cache published, up to this
 * many times memory_group_wait_ms in all. */
#define GROUP_GRACE 4
/* An asker checks that the member it waits for is alive this often. */
#define GROUP_POLL_NS 10000000ll
/* Joining waits at most this long for the table's lock or a creator's initialization. */
#define GROUP_JOIN_NS 1000000000ll

struct gslot {
    _Atomic int32_t pid;        /* 0: free */
    _Atomic uint32_t req_seq;   /* futex: an asker bumps it to ask */
    _Atomic uint32_t ack_seq;   /* futex: the responder sets it to req_seq once answered */
    uint32_t pad;
    _Atomic uint64_t req_bytes, freed_bytes; /* the request, and what the answer gave back */
    _Atomic uint64_t reserved, allocated, reclaimable, budget;
    _Atomic uint64_t gave_count, gave_bytes, asked_count;
    _Atomic uint64_t foreign;    /* its estimate of the device memory it holds outside xseg */
    _Atomic uint64_t start_time; /* its process's start (/proc/PID/stat field 22): pid reuse */
    /* Under a group budget, the bytes a growth underway may add to reserved: published before
     * the member reads the others' figures and cleared once its new reserved is published, so
     * of two members growing at once at least one counts the other's (group_budget_measure). */
    _Atomic uint64_t growing;
    _Atomic uint32_t took_seq;  /* the request its responder is answering (set as it starts) */
    _Atomic int32_t tid;        /* its responder thread: runnable or not (an asker's grace) */
    _Atomic uint64_t ask_timeouts; /* its asks in which a member asked never answered */
};

/* ask_timeouts sits in the padding after pid: the public struct keeps its size and offsets. */
_Static_assert(offsetof(xseg_group_member, ask_timeouts) == 4 && offsetof(xseg_group_member, reserved_bytes) == 8 &&
               sizeof(xseg_group_member) == 8 + 9 * 8, "xseg_group_member's layout changed");

struct gtable {
    _Atomic uint64_t magic;     /* written last by the creator */
    uint32_t version, nslots;
    uint64_t size, total_mem;
    uint64_t group_budget;      /* memory_group_budget_mb of the first member, in bytes; 0: none */
    pthread_mutex_t lock;       /* robust, process-shared */
    char name[CFG_NAME_MAX + 1];
    struct gslot slot[GROUP_SLOTS];
};

struct group {
    struct dev_alloc *d;
    struct gtable *t;
    char path[96];
    char name[CFG_NAME_MAX + 1];
    int me;                     /* our slot */
    uint64_t total;             /* the device's memory: the bound of every byte field */
    uint64_t group_budget;      /* the table's memory_group_budget_mb (checked at join) */
    pthread_t responder;
    _Atomic bool stop, alone;
    _Atomic bool erring;        /* go_alone's message claimed */
    /* The table's lock was busy at join: the table stays mapped and the next growth tries a join
     * again (group_budget_measure, device lock held), with a try of the lock: no wait. */
    _Atomic bool rejoin;
    char error[512];            /* why the device is alone, "" when it is not */
    /* Why a retried join failed for good: written once, before rejoin_failed (release), so that
     * group_stats never reads a message being rewritten. */
    char rejoin_error[512];
    _Atomic bool rejoin_failed;
    unsigned seed;              /* rand_r: the back-off of a growth that steps aside */
    int fd;                     /* the mapped table's file, open: its size checked (table_intact) */
    /* The headroom a wake underway claimed (device lock held): a wake gives the lock back while
     * it restores, so a malloc's growth may come meanwhile; it publishes its bytes on top of
     * these, counts them as taken, and leaves them published when it is done. */
    size_t wake_growing;
    ino_t ino;                  /* the table's file, told apart from one created since */
    dev_t dev;
};

/* This module's state is xseg_rt.group (core/process/procstate.h), written only here (layering.sh). */
#define g_groups xseg_rt.group.devs

static long futex(_Atomic uint32_t *w, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)w, op, val, ts, NULL, 0);
}

static bool pid_alive(int32_t pid)
{
    return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

/* When process @p pid started (/proc/PID/stat field 22, clock ticks since boot); 0 when it cannot
 * be read (no /proc, or the process is gone). */
static uint64_t proc_start_time(int32_t pid)
{
    char path[40], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    /* The command (field 2) may hold spaces and parentheses: count from the last ')'. */
    char *p = strrchr(buf, ')');
    for (int field = 2; p && field < 22; field++)
        p = strchr(p + 1, ' ');
    return p ? strtoull(p + 1, NULL, 10) : 0;
}

/* Is the member in slot @p s alive: its pid is, and (pid reuse) the process with that pid started
 * when the member recorded. A slot recording no start time is checked by pid alone only where
 * /proc cannot be read. */
static bool member_alive(const struct gslot *s, int32_t pid)
{
    if (!pid_alive(pid))
        return false;
    uint64_t now = proc_start_time(pid);
    return !now || now == atomic_load(&s->start_time);
}

/* A slot's figures, each bounds-checked against the device. @return false naming the bad
 * field in @p why. */
static bool slot_read(const struct gslot *s, uint64_t total, xseg_group_member *m, char *why, size_t n)
{
    memset(m, 0, sizeof *m);
    int32_t pid = atomic_load(&s->pid);
    m->pid = pid;
    m->reserved_bytes = atomic_load(&s->reserved);
    m->allocated_bytes = atomic_load(&s->allocated);
    m->reclaimable_bytes = atomic_load(&s->reclaimable);
    m->budget_bytes = atomic_load(&s->budget);
    m->gave_way_count = atomic_load(&s->gave_count);
    m->gave_way_bytes = atomic_load(&s->gave_bytes);
    m->asked_count = atomic_load(&s->asked_count);
    m->foreign_bytes = atomic_load(&s->foreign);
    /* Each field alone (a member rewrites several while others read): reclaimable is clamped to
     * reserved where it is used. */
    const char *bad = pid < 0 || pid > GROUP_PID_MAX ? "pid"
                      : m->reserved_bytes > total   ? "reserved bytes"
                      : m->allocated_bytes > total  ? "allocated bytes"
                      : m->reclaimable_bytes > total ? "reclaimable bytes"
                      : m->budget_bytes > total     ? "budget bytes"
                      : m->foreign_bytes > total    ? "foreign bytes"
                      : atomic_load(&s->growing) > total ? "growing bytes" : NULL;
    m->ask_timeouts = (uint32_t)atomic_load(&s->ask_timeouts);
    if (bad)
        snprintf(why, n, "its %s are out of range (%s)", bad, bad[0] == 'p' ? "pid" : "above the device");
    return !bad;
}

/* The header, checked. @return NULL, or what is wrong with it. */
static const char *header_bad(const struct gtable *t, uint64_t total)
{
    if (atomic_load_explicit(&t->magic, memory_order_acquire) != GROUP_MAGIC)
        return "bad magic";
    if (t->version != GROUP_VERSION)
        return "unknown version";
    if (t->nslots != GROUP_SLOTS || t->size != sizeof *t)
        return "bad size";
    if (t->total_mem != total)
        return "another device's capacity";
    if (t->group_budget > total)
        return "a group budget above the device";
    return NULL;
}

/* Every slot and the header checked; @return false with the reason in @p why. */
static bool table_ok(const struct gtable *t, uint64_t total, char *why, size_t n)
{
    const char *h = header_bad(t, total);
    if (h) {
        snprintf(why, n, "its header has %s", h);
        return false;
    }
    for (int i = 0; i < GROUP_SLOTS; i++) {
        xseg_group_member m;
        char w[96];
        if (!slot_read(&t->slot[i], total, &m, w, sizeof w)) {
            snprintf(why, n, "slot %d: %s", i, w);
            return false;
        }
    }
    return true;
}

/* Go alone after finding the table bad: the error kept for xseg_group_stats; the responder sees
 * `alone` and ends. The responder, an asker or a measure may call it: the first one writes the
 * message (`erring` claimed), before alone is published (release), so group_stats never reads it
 * torn. */
static void go_alone(struct group *g, const char *why)
{
    if (atomic_load(&g->alone) || atomic_exchange(&g->erring, true))
        return;
    snprintf(g->error, sizeof g->error, "memory group table /dev/shm%s is corrupted (%s): device %d "
             "goes on alone", g->path, why, g->d->device);
    atomic_store_explicit(&g->alone, true, memory_order_release);
}

/* The table's lock within @p ns; EOWNERDEAD (a member died holding it) is repaired. Taken with no
 * device lock held (rank FORK_RANK_GROUP_TABLE, base/fork.h); given back with table_unlock. */
static bool table_lock(struct gtable *t, int64_t ns)
{
    witness_take(FORK_RANK_GROUP_TABLE);
    struct timespec ts = clock_deadline(CLOCK_REALTIME, ns);
    int r = pthread_mutex_timedlock(&t->lock, &ts);
    if (r == EOWNERDEAD) {
        pthread_mutex_consistent(&t->lock);
        return true;
    }
    if (r)
        witness_give(FORK_RANK_GROUP_TABLE);
    return r == 0;
}

static void table_unlock(struct gtable *t)
{
    pthread_mutex_unlock(&t->lock);
    witness_give(FORK_RANK_GROUP_TABLE);
}

/* ---- a table file truncated under its mapping ------------------------------------------------
 * A page of a shared mapping past its file's end faults with SIGBUS. Another process of this user
 * may shrink the file at any time, so its size is checked (fstat) before the table is read at
 * each step (table_intact), and the guard below covers the instant between the check and the read:
 * the faulting table's pages are replaced by zero pages, which read as a bad table (the member goes
 * on alone at its next check), and the access is retried. Every other SIGBUS — a fault elsewhere,
 * or one a process sent (kill, sigqueue, tgkill) — gets the disposition the guard replaced, as if
 * the guard were not there, and the guard stays for the tables. */

/* A fault of this thread's own access (the kernel's report, si_code > 0), not a signal a process
 * or the kernel sent (si_code <= 0, SI_KERNEL) nor an asynchronous memory-error notice. */
static bool bus_is_fault(const siginfo_t *si)
{
#ifdef BUS_MCEERR_AO
    if (si->si_code == BUS_MCEERR_AO)
        return false;
#endif
    return si->si_code > 0 && si->si_code != SI_KERNEL;
}

/* The disposition the guard replaced, for a SIGBUS that is not a table's fault: the user's
 * handler (with its mask, and SIGBUS unblocked under SA_NODEFER; SA_RESETHAND is not emulated),
 * ignored (unless it is a fault, which the kernel never lets be ignored), or the default action:
 * the process ends by SIGBUS, here and now, whichever way the signal came. */
static void bus_forward(int sig, siginfo_t *si, void *uc)
{
    const struct sigaction *old = &xseg_rt.group.bus_old;
    sigset_t bus, prev;
    sigemptyset(&bus);
    sigaddset(&bus, SIGBUS);
    if ((old->sa_flags & SA_SIGINFO) || (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN)) {
        /* sigprocmask-like calls are async-signal-safe; a handler that jumps out restores its own. */
        pthread_sigmask(SIG_BLOCK, &old->sa_mask, &prev);
        if (old->sa_flags & SA_NODEFER)
            pthread_sigmask(SIG_UNBLOCK, &bus, NULL);
        if (old->sa_flags & SA_SIGINFO)
            old->sa_sigaction(sig, si, uc);
        else
            old->sa_handler(sig);
        pthread_sigmask(SIG_SETMASK, &prev, NULL);
        return;
    }
    if (old->sa_handler == SIG_IGN && !bus_is_fault(si))
        return;
    /* The default action: the guard steps aside (the process ends) and the signal is raised again
     * with SIGBUS unblocked, so it ends the process before this handler returns. A fault would come
     * again on return, a sent signal would not: raising serves both. */
    signal(SIGBUS, SIG_DFL);
    pthread_sigmask(SIG_UNBLOCK, &bus, NULL);
    raise(SIGBUS);
}

static void bus_guard(int sig, siginfo_t *si, void *uc)
{
    int saved = errno;
    uintptr_t a = (uintptr_t)si->si_addr;
    for (size_t i = 0; bus_is_fault(si) && i < sizeof xseg_rt.group.maps / sizeof xseg_rt.group.maps[0]; i++) {
        uintptr_t t = (uintptr_t)atomic_load(&xseg_rt.group.maps[i]);
        /* mmap is a plain system call on Linux: safe in a handler. */
        if (t && a >= t && a < t + sizeof(struct gtable) &&
            mmap((void *)t, sizeof(struct gtable), PROT_READ | PROT_WRITE, MAP_FIXED | MAP_SHARED | MAP_ANONYMOUS,
                 -1, 0) != MAP_FAILED) {
            errno = saved;
            return;
        }
    }
    bus_forward(sig, si, uc);
    errno = saved;
}

/* Map the table in @p fd (NULL on failure), known to the guard (installed once). */
static struct gtable *table_map(int fd)
{
    if (!atomic_exchange(&xseg_rt.group.bus_on, true)) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = bus_guard;
        sa.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGBUS, &sa, &xseg_rt.group.bus_old);
    }
    void *m = mmap(NULL, sizeof(struct gtable), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        return NULL;
    for (size_t i = 0; i < sizeof xseg_rt.group.maps / sizeof xseg_rt.group.maps[0]; i++) {
        void *none = NULL;
        if (atomic_compare_exchange_strong(&xseg_rt.group.maps[i], &none, m))
            return m;
    }
    munmap(m, sizeof(struct gtable)); /* never: two maps a device at most */
    errno = ENOMEM;
    return NULL;
}

/* Unmap @p t (table_map's) and close @p fd (-1: none). */
static void table_unmap(struct gtable *t, int fd)
{
    for (size_t i = 0; i < sizeof xseg_rt.group.maps / sizeof xseg_rt.group.maps[0]; i++) {
        void *want = t;
        if (atomic_compare_exchange_strong(&xseg_rt.group.maps[i], &want, NULL))
            break;
    }
    munmap(t, sizeof *t);
    if (fd >= 0)
        close(fd);
}

/* Whether g's table file still has the table's size; @return false with the reason in @p why. */
static bool table_intact(const struct group *g, char *why, size_t n)
{
    struct stat st;
    if (g->fd >= 0 && !fstat(g->fd, &st) && st.st_size == (off_t)sizeof(struct gtable))
        return true;
    if (g->fd >= 0 && !fstat(g->fd, &st))
        snprintf(why, n, "its file was truncated to %lld bytes, not %zu", (long long)st.st_size,
                 sizeof(struct gtable));
    else
        snprintf(why, n, "its file cannot be checked: %s", strerror(errno));
    return false;
}

/* Free the slots of members that are gone (their memory went with them). Table lock held. */
static void reap_dead(struct gtable *t)
{
    for (int i = 0; i < GROUP_SLOTS; i++) {
        int32_t p = atomic_load(&t->slot[i].pid);
        if (p && !member_alive(&t->slot[i], p)) {
            struct gslot *s = &t->slot[i];
            atomic_store(&s->reserved, 0);
            atomic_store(&s->allocated, 0);
            atomic_store(&s->reclaimable, 0);
            atomic_store(&s->budget, 0);
            atomic_store(&s->foreign, 0);
            atomic_store(&s->growing, 0);
            atomic_store(&s->start_time, 0);
            atomic_store(&s->pid, 0);
        }
    }
}

/* Our own figures into our slot. Device lock held. */
static void publish_locked(struct group *g)
{
    struct dev_alloc *d = g->d;
    lock_assert_held(&d->lock);
    uint64_t reserved = (uint64_t)stats_all_current(d->acct.stats.reserved_bytes);
    uint64_t allocated = (uint64_t)stats_all_current(d->acct.stats.allocated_bytes);
    uint64_t cached = trim_cached_bytes(d);
    uint64_t budget = d->cfg.memory_budget;
    struct gslot *s = &g->t->slot[g->me];
    if (!atomic_load(&s->growing)) /* a growth underway keeps what it measured (group_budget_measure) */
        atomic_store(&s->reserved, reserved < g->total ? reserved : g->total);
    atomic_store(&s->allocated, allocated < reserved ? allocated : reserved);
    atomic_store(&s->reclaimable, cached < reserved ? cached : reserved);
    atomic_store(&s->budget, budget < g->total ? budget : g->total);
}

/* publish_locked, taking the device lock. */
static void publish(struct group *g)
{
    dev_lock(g->d, DEV_NEED_SLOTS);
    publish_locked(g);
    dev_unlock(g->d);
}

/* The responder: answers requests in our slot by trimming our cache, republishes our figures
 * every GROUP_PUBLISH_NS, and ends at stop (or when the table went bad). */
static void *responder(void *arg)
{
    struct group *g = arg;
    struct gslot *s = &g->t->slot[g->me];
    char why[160];
    if (table_intact(g, why, sizeof why))
        atomic_store(&s->tid, (int32_t)syscall(SYS_gettid));
    while (!atomic_load(&g->stop) && !atomic_load(&g->alone)) {
        if (!table_intact(g, why, sizeof why)) { /* before the table is read */
            go_alone(g, why);
            break;
        }
        uint32_t req = atomic_load(&s->req_seq);
        if (req != atomic_load(&s->ack_seq)) {
            uint64_t need = atomic_load(&s->req_bytes);
            if (need > g->total)
                need = g->total;
            atomic_store(&s->took_seq, req); /* the asker waits for an answer underway */
            publish(g); /* our cache now, not as last published */
            uint64_t cached = atomic_load(&s->reclaimable);
            size_t released = 0;
            /* Keep what the asker does not need: trim gives back the largest runs first. */
            (void)trim_device(g->d, cached > need ? (size_t)(cached - need) : 0, &released);
            atomic_store(&s->freed_bytes, released);
            atomic_fetch_add(&s->gave_count, released ? 1 : 0);
            atomic_fetch_add(&s->gave_bytes, released);
            publish(g);
            atomic_store(&s->ack_seq, req);
            futex(&s->ack_seq, FUTEX_WAKE, INT32_MAX, NULL);
            continue;
        }
        publish(g);
        if (atomic_load(&s->pid) != getpid()) {
            go_alone(g, "our slot was taken by another process");
            break;
        }
        if (!table_ok(g->t, g->total, why, sizeof why)) {
            go_alone(g, why);
            break;
        }
        struct timespec ts = {0, GROUP_PUBLISH_NS};
        futex(&s->req_seq, FUTEX_WAIT, req, &ts);
    }
    return NULL;
}

/* Open or create the table (its file's identity in g->ino, g->dev); NULL with the reason in @p err. */
static struct gtable *table_open(struct group *g, char *err, size_t n)
{
    struct gtable *t = NULL;
    bool created = false;
    int fd = shm_open(g->path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
        created = true;
        if (ftruncate(fd, sizeof *t)) {
            snprintf(err, n, "memory group: cannot size /dev/shm%s: %s", g->path,
                     strerror(errno));
            close(fd);
            shm_unlink(g->path);
            return NULL;
        }
    } else if (errno == EEXIST) {
        fd = shm_open(g->path, O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
    }
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) {
        snprintf(err, n, "memory group: cannot open /dev/shm%s: %s", g->path,
                 strerror(errno));
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    /* Only the same user joins, and only a table of exactly our layout is mapped. */
    if (st.st_uid != geteuid() || (st.st_mode & 077) || st.st_size != (off_t)sizeof *t) {
        snprintf(err, n, "memory group table /dev/shm%s is not usable (%s): "
                 "device %d goes on alone", g->path,
                 st.st_uid != geteuid() ? "owned by another user"
                 : (st.st_mode & 077) ? "open to other users" : "wrong size", g->d->device);
        close(fd);
        return NULL;
    }
    g->ino = st.st_ino;
    g->dev = st.st_dev;
    t = table_map(fd);
    if (!t) {
        snprintf(err, n, "memory group: cannot map /dev/shm%s: %s", g->path,
                 strerror(errno));
        close(fd);
        return NULL;
    }
    g->fd = fd; /* kept: its size checked before the table is read (table_intact) */
    if (created) {
        pthread_mutexattr_t a;
        pthread_mutexattr_init(&a);
        pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
        pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
        pthread_mutex_init(&t->lock, &a);
        pthread_mutexattr_destroy(&a);
        t->version = GROUP_VERSION;
        t->nslots = GROUP_SLOTS;
        t->size = sizeof *t;
        t->total_mem = g->total;
        t->group_budget = g->group_budget;
        snprintf(t->name, sizeof t->name, "%s", g->name);
        atomic_store_explicit(&t->magic, GROUP_MAGIC, memory_order_release);
    } else {
        /* A creator may be initializing it this instant. */
        for (int64_t end = clock_mono_ns() + GROUP_JOIN_NS; clock_mono_ns() < end &&
             atomic_load_explicit(&t->magic, memory_order_acquire) != GROUP_MAGIC;)
            nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    char why[160];
    if (!table_intact(g, why, sizeof why) || !table_ok(t, g->total, why, sizeof why)) {
        snprintf(err, n, "memory group table /dev/shm%s is corrupted (%s): device %d "
                 "goes on alone", g->path, why, g->d->device);
        table_unmap(t, fd);
        g->fd = -1;
        return NULL;
    }
    /* The first member's group budget is the group's: a later member's other value is named in
     * one warning (at its join) and yields. */
    if (!created && t->group_budget != g->group_budget) {
        if (g->group_budget)
            log_warn("warning: memory_group_budget_mb:%llu differs from group '%s''s "
                    "%llu MiB (its first member's): device %d uses the group's",
                    (unsigned long long)(g->group_budget >> 20), g->name,
                    (unsigned long long)(t->group_budget >> 20), g->d->device);
        g->group_budget = t->group_budget;
    }
    return t;
}

/* Take a free slot (dead members' reaped first), table lock held and given back; -1 when the
 * group is full (the reason in @p err). */
static int slot_take(struct group *g, char *err, size_t n)
{
    reap_dead(g->t);
    int me = -1;
    for (int i = 0; i < GROUP_SLOTS && me < 0; i++) {
        struct gslot *s = &g->t->slot[i];
        if (atomic_load(&s->pid))
            continue;
        memset((void *)s, 0, sizeof *s);
        atomic_store(&s->start_time, proc_start_time(getpid()));
        atomic_store(&s->pid, (int32_t)getpid());
        me = i;
    }
    table_unlock(g->t);
    if (me < 0)
        snprintf(err, n, "memory group '%s' is full (%d members): device %d goes on alone", g->name,
                 GROUP_SLOTS, g->d->device);
    return me;
}

/* slot_take once the table's lock is had within GROUP_JOIN_NS; -1 otherwise, with g->rejoin set:
 * a member's ask holds the lock up to its memory_group_wait_ms, so the next growth tries again. */
static int slot_claim(struct group *g)
{
    if (!table_lock(g->t, GROUP_JOIN_NS)) {
        snprintf(g->error, sizeof g->error, "memory group table /dev/shm%s: its lock was held for over "
                 "1 s (a member's ask with memory_group_wait_ms over 1000, a stopped member, or a "
                 "corrupted table): device %d goes on alone for now and tries to join again at its "
                 "next growth", g->path, g->d->device);
        atomic_store(&g->rejoin, true);
        return -1;
    }
    return slot_take(g, g->error, sizeof g->error);
}

static void budget_measure(struct dev_alloc *d, struct group *g, struct budget_view *v, uint64_t grow);

void group_attach(struct dev_alloc *d)
{
    struct cfg cfg;
    unsigned gen;
    settings_copy(&cfg, &gen);
    if (!cfg.memory_group[0] || d->device < 0 || d->device >= ALLOC_MAX_DEVICES)
        return;
    struct group *g = xs_calloc(1, sizeof *g);
    if (!g)
        return; /* no host memory: the device works alone, as without the key */
    g->d = d;
    g->total = d->info.total_mem;
    g->group_budget = cfg.memory_group_budget < g->total ? cfg.memory_group_budget : g->total;
    g->me = -1;
    g->fd = -1;
    g->seed = (unsigned)getpid() ^ (unsigned)clock_mono_ns();
    snprintf(g->name, sizeof g->name, "%s", cfg.memory_group);
    int n = snprintf(g->path, sizeof g->path, "/xseg-group-");
    for (int i = 0; i < 16; i++)
        n += snprintf(g->path + n, sizeof g->path - (size_t)n, "%02x", d->info.uuid[i]);
    snprintf(g->path + n, sizeof g->path - (size_t)n, "-%s", cfg.memory_group);
    g->t = table_open(g, g->error, sizeof g->error);
    if (g->t && (g->me = slot_claim(g)) >= 0) {
        publish(g);
        struct budget_view v;
        dev_lock(d, DEV_NEED_SLOTS);
        budget_measure(d, g, &v, 0); /* our foreign bytes, published */
        dev_unlock(d);
        if (pthread_create(&g->responder, NULL, responder, g)) {
            snprintf(g->error, sizeof g->error, "memory group: no responder thread: device %d goes on "
                     "alone", d->device);
            atomic_store(&g->t->slot[g->me].pid, 0);
            g->me = -1;
        }
    }
    if (g->me < 0) {
        if (g->t && !atomic_load(&g->rejoin)) { /* a join to retry keeps the table mapped */
            table_unmap(g->t, g->fd);
            g->t = NULL;
            g->fd = -1;
        }
        atomic_store(&g->alone, true);
    }
    atomic_store(&g_groups[d->device], g);
}

/* A retried join for good failed: @p why kept for group_stats, no more retries. */
static void rejoin_fail(struct group *g, const char *why)
{
    snprintf(g->rejoin_error, sizeof g->rejoin_error, "%s", why);
    atomic_store_explicit(&g->rejoin_failed, true, memory_order_release);
    atomic_store(&g->rejoin, false);
}

/* The table's lock if free now (no wait; a try is outside the rank order: base/witness.h). */
static bool table_trylock(struct gtable *t)
{
    int r = pthread_mutex_trylock(&t->lock);
    if (r && r != EOWNERDEAD)
        return false;
    witness_took(FORK_RANK_GROUP_TABLE);
    if (r == EOWNERDEAD)
        pthread_mutex_consistent(&t->lock);
    return true;
}

/* Whether the file at g->path is still the table mapped: the last member out removes it (a
 * joiner still to retry holds no slot), and a process starting then creates another. */
static bool table_current(const struct group *g)
{
    int fd = shm_open(g->path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC, 0);
    struct stat st;
    bool same = fd >= 0 && !fstat(fd, &st) && st.st_ino == g->ino && st.st_dev == g->dev;
    if (fd >= 0)
        close(fd);
    return same;
}

/* The join group_attach could not finish (its table lock was busy), tried again at a growth:
 * a try of the lock, so a growth never waits for another member's ask. Device lock held: the
 * slot's figures are published here, and the responder (which takes the lock) starts waiting. */
static void rejoin(struct dev_alloc *d, struct group *g)
{
    lock_assert_held(&d->lock);
    if (!table_trylock(g->t))
        return; /* still busy: the next growth tries again */
    char why[160], err[512];
    if (!table_current(g)) {
        table_unlock(g->t);
        table_unmap(g->t, g->fd);
        g->fd = -1;
        if (!(g->t = table_open(g, err, sizeof err))) {
            rejoin_fail(g, err);
            return;
        }
        if (!table_trylock(g->t))
            return;
    }
    if (!table_intact(g, why, sizeof why) || !table_ok(g->t, g->total, why, sizeof why)) {
        table_unlock(g->t);
        snprintf(err, sizeof err, "memory group table /dev/shm%s is corrupted (%s): device %d goes on alone",
                 g->path, why, d->device);
        rejoin_fail(g, err);
        return;
    }
    if ((g->me = slot_take(g, err, sizeof err)) < 0) {
        rejoin_fail(g, err);
        return;
    }
    publish_locked(g);
    atomic_store_explicit(&g->alone, false, memory_order_release); /* before the responder looks */
    if (pthread_create(&g->responder, NULL, responder, g)) {
        atomic_store(&g->t->slot[g->me].pid, 0);
        g->me = -1;
        atomic_store(&g->alone, true);
        snprintf(err, sizeof err, "memory group: no responder thread: device %d goes on alone", d->device);
        rejoin_fail(g, err);
        return;
    }
    atomic_store(&g->rejoin, false);
}

void group_detach_all(void)
{
    for (int i = 0; i < ALLOC_MAX_DEVICES; i++) {
        struct group *g = atomic_exchange(&g_groups[i], NULL);
        if (!g)
            continue;
        char why[160];
        if (g->t && g->me < 0) {
            table_unmap(g->t, g->fd); /* a join still to retry: no slot, no responder */
        } else if (g->t) {
            atomic_store(&g->stop, true);
            if (table_intact(g, why, sizeof why))
                futex(&g->t->slot[g->me].req_seq, FUTEX_WAKE, INT32_MAX, NULL);
            pthread_join(g->responder, NULL); /* it wakes within GROUP_PUBLISH_NS anyway */
            /* The last member out removes the table (a crashed member's table stays, reused); a
             * truncated one is left alone. */
            if (table_intact(g, why, sizeof why) && table_lock(g->t, GROUP_JOIN_NS)) {
                if (atomic_load(&g->t->slot[g->me].pid) == getpid())
                    atomic_store(&g->t->slot[g->me].pid, 0);
                reap_dead(g->t);
                bool empty = true;
                for (int s = 0; s < GROUP_SLOTS; s++)
                    empty = empty && !atomic_load(&g->t->slot[s].pid);
                if (empty)
                    shm_unlink(g->path);
                table_unlock(g->t);
            }
            table_unmap(g->t, g->fd);
        }
        xs_free(g);
    }
    /* The guard goes with the last table, unless a handler was installed over it since. */
    struct sigaction cur;
    if (atomic_load(&xseg_rt.group.bus_on) && !sigaction(SIGBUS, NULL, &cur) && (cur.sa_flags & SA_SIGINFO) &&
        cur.sa_sigaction == bus_guard) {
        sigaction(SIGBUS, &xseg_rt.group.bus_old, NULL);
        atomic_store(&xseg_rt.group.bus_on, false);
    }
}

bool group_on(const struct dev_alloc *d)
{
    struct group *g = atomic_load_explicit(&g_groups[d->device], memory_order_acquire);
    return g && !atomic_load_explicit(&g->alone, memory_order_relaxed);
}

/* ---- budgets ------------------------------------------------------------------------------ */

/* The group @p d works in, or NULL. */
static struct group *group_live(const struct dev_alloc *d)
{
    struct group *g = atomic_load_explicit(&g_groups[d->device], memory_order_acquire);
    return g && g->t && !atomic_load_explicit(&g->alone, memory_order_relaxed) ? g : NULL;
}

size_t group_budget_cap(const struct dev_alloc *d)
{
    size_t cap = d->cfg.memory_budget ? d->cfg.memory_budget : SIZE_MAX;
    struct group *g = group_live(d);
    if (g && g->group_budget && g->group_budget < cap)
        cap = (size_t)g->group_budget;
    return cap;
}

/* Whether @p d's join is to be retried at this growth. */
static bool rejoin_due(const struct dev_alloc *d)
{
    struct group *g = atomic_load_explicit(&g_groups[d->device], memory_order_acquire);
    return g && atomic_load_explicit(&g->rejoin, memory_order_relaxed);
}

bool group_measure_on(const struct dev_alloc *d)
{
    return d->cfg.memory_budget || group_on(d) || rejoin_due(d);
}

/* The measure itself (group_budget_measure) for @p g (NULL: none); @p grow: the growth to
 * publish first (0: none; group budget only). Device lock held. */
static void budget_measure(struct dev_alloc *d, struct group *g, struct budget_view *v, uint64_t grow)
{
    lock_assert_held(&d->lock);
    memset(v, 0, sizeof *v);
    v->limit = v->own_limit = v->group_limit = SIZE_MAX;
    v->reserved = d->acct.total_allocated_memory;
    v->budget = d->cfg.memory_budget;
    size_t dfree = 0, dtotal = 0;
    /* No driver query while a capture is underway (a query is not capturable work in every
     * capture mode): the last estimate stands. */
    bool measured = !dev_capture_underway(d) && drv_ctx_ensure(d->info.primary_ctx) == XSEG_SUCCESS &&
                    drv_mem_info(&dfree, &dtotal) == XSEG_SUCCESS;
    size_t used = measured && dtotal > dfree ? dtotal - dfree : 0;
    struct gslot *mine = NULL;
    if (g) {
        mine = &g->t->slot[g->me];
        v->group_budget = (size_t)g->group_budget;
        /* Our intent first, then the others' figures (both sequentially consistent): a member
         * growing at once either sees ours or we see its. */
        if (grow && g->group_budget) {
            uint64_t w = grow < g->total ? grow + g->wake_growing : g->total;
            atomic_store(&mine->growing, w < g->total ? w : g->total);
        }
        /* The other live members' published figures, each bounded by the device (no overflow:
         * 64 slots of at most 2^47 bytes each on any device there is). */
        for (int i = 0; i < GROUP_SLOTS; i++) {
            const struct gslot *s = &g->t->slot[i];
            int32_t pid = atomic_load(&s->pid);
            if (i == g->me || !pid || !pid_alive(pid))
                continue;
            uint64_t r = atomic_load(&s->reserved), f = atomic_load(&s->foreign), w = atomic_load(&s->growing);
            v->others_reserved += r <= g->total ? (size_t)r : 0;
            v->others_foreign += f <= g->total ? (size_t)f : 0;
            v->others_growing += w <= g->total ? (size_t)w : (size_t)g->total;
        }
    }
    /* Others' growths underway may show in `used` before their reserved bytes do: they are theirs,
     * not ours, in the estimate we publish (else it would stay inflated after they publish). Our
     * own budget keeps the larger estimate (it never passes for a member's growth). */
    size_t accounted = v->others_reserved + v->others_foreign + v->reserved;
    size_t foreign_hi = 0;
    if (measured) {
        foreign_hi = used > accounted ? used - accounted : 0;
        accounted += v->others_growing;
        v->foreign = used > accounted ? used - accounted : 0;
    } else if (mine) {
        foreign_hi = v->foreign = (size_t)atomic_load(&mine->foreign); /* the last estimate stands */
    }
    if (mine) {
        atomic_store(&mine->reserved, v->reserved < g->total ? v->reserved : g->total);
        atomic_store(&mine->foreign, v->foreign < g->total ? v->foreign : g->total);
    }
    if (v->budget)
        v->own_limit = v->budget > foreign_hi ? v->budget - foreign_hi : 0;
    /* Growths underway count in full: what `used` shows of them is out of our estimate above. */
    size_t group_rest = v->others_reserved + v->others_foreign + v->foreign + v->others_growing +
                        (g && grow != g->total ? g->wake_growing : 0);
    if (v->group_budget)
        v->group_limit = v->group_budget > group_rest ? v->group_budget - group_rest : 0;
    v->limit = v->own_limit < v->group_limit ? v->own_limit : v->group_limit;
}

/* group_live, its table file checked first (one fstat): a truncated one sends us on alone. */
static struct group *group_checked(const struct dev_alloc *d)
{
    struct group *g = group_live(d);
    char why[160];
    if (g && !table_intact(g, why, sizeof why)) {
        go_alone(g, why);
        return NULL;
    }
    return g;
}

void group_budget_measure(struct dev_alloc *d, struct budget_view *v, size_t grow)
{
    if (rejoin_due(d))
        rejoin(d, atomic_load(&g_groups[d->device]));
    struct group *g = group_checked(d);
    if (!g && !d->cfg.memory_budget) { /* the join still to retry: nothing to measure */
        memset(v, 0, sizeof *v);
        v->reserved = d->acct.total_allocated_memory;
        v->limit = v->own_limit = v->group_limit = SIZE_MAX;
        return;
    }
    if (!g || !g->group_budget || !grow) {
        budget_measure(d, g, v, 0);
        return;
    }
    struct gslot *mine = &g->t->slot[g->me];
    bool unknown = grow == SIZE_MAX; /* a wake: up to the limit */
    int64_t end = clock_mono_ns() + (int64_t)d->cfg.memory_group_wait_ms * 1000000ll;
    for (long pause = 100000;; pause = pause < 4000000 ? pause * 2 : pause) {
        budget_measure(d, g, v, unknown ? g->total : grow);
        size_t want = v->reserved + (unknown ? 0 : grow);
        /* Refused only for others' growths underway: step aside (our intent withdrawn, so two
         * members never refuse each other for good) and measure again once they may be done,
         * for at most memory_group_wait_ms. */
        size_t rest = v->others_reserved + v->others_foreign + v->foreign;
        size_t alone = v->group_budget > rest ? v->group_budget - rest : 0;
        bool fits_alone = want <= alone && want <= v->own_limit;
        if (unknown || want <= v->limit || !v->others_growing || !fits_alone || clock_mono_ns() >= end)
            break;
        atomic_store(&mine->growing, g->wake_growing);
        struct timespec ts = {0, pause + (long)((uint64_t)rand_r(&g->seed) % (uint64_t)pause)};
        nanosleep(&ts, NULL);
    }
    /* What stays published bounds this growth: its limit is at most our reserved now plus
     * `growing`, and our reserved as published does not drop until group_note_reserved
     * (publish_locked), so members that count both never miss a byte of it. A refused growth
     * keeps only the headroom its retries (the reclaim ladder, after trimming our cache) may use. */
    if (!unknown && v->limit > v->reserved + grow)
        v->limit = v->reserved + grow;
    size_t head = v->limit > v->reserved ? v->limit - v->reserved : 0;
    if (unknown)
        g->wake_growing = head < g->total ? head : (size_t)g->total;
    else
        head += g->wake_growing;
    atomic_store(&mine->growing, head < g->total ? head : g->total);
}

void group_note_reserved(struct dev_alloc *d, bool wake)
{
    struct group *g = group_checked(d);
    if (g) {
        size_t r = d->acct.total_allocated_memory;
        struct gslot *s = &g->t->slot[g->me];
        if (wake)
            g->wake_growing = 0;
        atomic_store(&s->reserved, r < g->total ? r : g->total);
        atomic_store(&s->growing, g->wake_growing); /* after the reserved bytes that replace it */
    }
}

void group_budget_oom_info(struct dev_alloc *d, size_t alloc_size, char *buf, size_t size)
{
    lock_assert_held(&d->lock);
    if (size)
        buf[0] = '\0';
    struct group *g = group_checked(d);
    if (!size || (!d->cfg.memory_budget && !(g && g->group_budget)))
        return;
    struct budget_view v;
    budget_measure(d, g, &v, 0);
    char s1[32], s2[32], s3[32];
    size_t n = 0;
    if (v.budget)
        n += (size_t)snprintf(buf, size, " memory_budget_mb is %s: xseg holds %s reserved and an estimated "
                              "%s of device memory is this process's but not xseg's (CUDA context, "
                              "libraries; memory of processes outside a memory group counts too), so the "
                              "request %s it.", err_format_size(v.budget, s1), err_format_size(v.reserved, s2),
                              err_format_size(v.foreign, s3),
                              v.reserved + alloc_size > v.own_limit ? "would pass" : "stays within");
    if (v.group_budget && n < size) {
        size_t limit = v.group_limit;
        snprintf(buf + n, size - n, " memory_group_budget_mb of group '%s' is %s: its members hold %s "
                 "reserved by xseg and an estimated %s not xseg's, so the request %s it.", g->name,
                 err_format_size(v.group_budget, s1), err_format_size(v.reserved + v.others_reserved, s2),
                 err_format_size(v.foreign + v.others_foreign, s3),
                 v.reserved + alloc_size > limit ? "would pass" : "stays within");
    }
}

/* Send member @p i a request for @p need bytes; @return the sequence number its answer carries. */
static uint32_t ask_send(struct group *g, int i, uint64_t need)
{
    struct gslot *s = &g->t->slot[i];
    atomic_store(&s->req_bytes, need);
    uint32_t seq = atomic_fetch_add(&s->req_seq, 1) + 1;
    futex(&s->req_seq, FUTEX_WAKE, INT32_MAX, NULL);
    return seq;
}

/* The state letter of thread @p tid of process @p pid (/proc/PID/task/TID/stat field 3); '?'
 * when it cannot be read. */
static char thread_state(int32_t pid, int32_t tid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/task/%d/stat", (int)pid, (int)tid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return '?';
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return '?';
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command may hold spaces and parentheses */
    return p && p[1] == ' ' && p[2] ? p[2] : '?';
}

/* Whether member @p pid (slot @p s), asked @p seq, is worth more waiting once memory_group_wait_ms
 * is over: its responder answers now (took the request), or is runnable (a busy host has not
 * scheduled it yet) with cache published. Never a stopped one. */
static bool ask_underway(const struct gslot *s, int32_t pid, uint32_t seq, uint64_t total)
{
    int32_t tid = atomic_load(&s->tid);
    char st = tid > 0 && tid <= GROUP_PID_MAX ? thread_state(pid, tid) : '?';
    if (st == 'T' || st == 't' || st == '?' || st == 'Z' || st == 'X')
        return false;
    uint64_t cached = atomic_load(&s->reclaimable);
    return atomic_load(&s->took_seq) == seq || (st == 'R' && cached && cached <= total);
}

/* Wait for member @p i's answer @p seq until it answers, dies or @p end passes, and past @p end
 * while its answer is underway (ask_underway) until @p grace_end; @return the bytes it gave,
 * with @p timed_out set when it never answered. No member waits for a dead one: its pid is
 * checked between short waits. */
static uint64_t ask_wait(struct group *g, int i, int32_t pid, uint32_t seq, int64_t end, int64_t grace_end,
                         bool *died, bool *timed_out)
{
    struct gslot *s = &g->t->slot[i];
    for (;;) {
        uint32_t ack = atomic_load(&s->ack_seq);
        if (ack == seq) {
            uint64_t got = atomic_load(&s->freed_bytes);
            return got <= g->total ? got : 0;
        }
        int64_t now = clock_mono_ns();
        if (now >= end && (now >= grace_end || !ask_underway(s, pid, seq, g->total))) {
            *timed_out = true;
            return 0;
        }
        if (atomic_load(&s->pid) != pid || !member_alive(s, pid)) {
            reap_dead(g->t);
            *died = true; /* its memory went back to the driver with it */
            return 0;
        }
        int64_t left = (now < end ? end : grace_end) - now;
        struct timespec ts = {0, left < GROUP_POLL_NS ? left : GROUP_POLL_NS};
        futex(&s->ack_seq, FUTEX_WAIT, ack, &ts);
    }
}

bool group_give_way(struct dev_alloc *d, size_t need, const struct budget_view *bv)
{
    /* Not when our own budget refused: no member's memory counts in it. */
    size_t want = d->acct.total_allocated_memory + need;
    if (bv && want > bv->own_limit)
        return false;
    size_t over_budget = bv && want > bv->group_limit ? want - bv->group_limit : 0;
    struct group *g = atomic_load(&g_groups[d->device]);
    if (!g || atomic_load(&g->alone))
        return false;
    unsigned wait_ms = d->cfg.memory_group_wait_ms;
    dev_unlock(d);
    /* Ask for what the device lacks, not the whole request (the driver's free memory counts), or
     * what the group budget lacks where the device has room. */
    size_t dfree = 0, dtotal = 0;
    bool room = false;
    if (drv_ctx_ensure(d->info.primary_ctx) == XSEG_SUCCESS && drv_mem_info(&dfree, &dtotal) == XSEG_SUCCESS) {
        room = dfree >= need;
        if (!room)
            need -= dfree;
    }
    if (over_budget && (room || over_budget > need))
        need = over_budget;
    int64_t start = clock_mono_ns(), end = start + (int64_t)wait_ms * 1000000ll;
    int64_t grace_end = start + (int64_t)GROUP_GRACE * wait_ms * 1000000ll;
    uint64_t got = 0;
    bool died = false, timed_out = false;
    char why[160];
    if (!table_intact(g, why, sizeof why)) {
        go_alone(g, why);
        dev_lock(d, DEV_NEED_SLOTS);
        return false;
    }
    /* Another member's ask holds the lock for up to its own wait (or a stopped member holds
     * it): this ask gives up, and the process stays in the group for the next one. */
    if (table_lock(g->t, (int64_t)wait_ms * 1000000ll)) {
        reap_dead(g->t);
        if (!table_ok(g->t, g->total, why, sizeof why)) {
            go_alone(g, why);
        } else {
            atomic_fetch_add(&g->t->slot[g->me].asked_count, 1);
            /* Rounds of requests sent at once: members by reclaimable bytes, largest first
             * (then by reserved bytes), until their published cache covers what is missing; each
             * is asked for what the ones before it do not cover. A figure may be up to
             * GROUP_PUBLISH_NS old, so a member that last published no cache is asked in a later
             * round (it answers 0 at once if it has none). */
            bool asked[GROUP_SLOTS] = {false};
            while (got < need && clock_mono_ns() < end) {
                int batch[GROUP_SLOTS], nb = 0;
                int32_t pids[GROUP_SLOTS];
                uint32_t seqs[GROUP_SLOTS];
                uint64_t planned = 0, missing = need - got;
                while (planned < missing) {
                    int best = -1;
                    uint64_t most = 0, most_res = 0;
                    for (int i = 0; i < GROUP_SLOTS; i++) {
                        const struct gslot *s = &g->t->slot[i];
                        uint64_t r = atomic_load(&s->reclaimable), res = atomic_load(&s->reserved);
                        if (i == g->me || asked[i] || !atomic_load(&s->pid) || res > g->total)
                            continue;
                        if (best < 0 || r > most || (r == most && res > most_res)) {
                            best = i;
                            most = r;
                            most_res = res;
                        }
                    }
                    if (best < 0)
                        break;
                    asked[best] = true;
                    pids[nb] = atomic_load(&g->t->slot[best].pid);
                    seqs[nb] = ask_send(g, best, missing - planned);
                    batch[nb++] = best;
                    planned += most ? most : missing; /* no figure: it may hold all of it */
                }
                if (!nb)
                    break;
                for (int k = 0; k < nb; k++)
                    got += ask_wait(g, batch[k], pids[k], seqs[k], end, grace_end, &died, &timed_out);
            }
            if (timed_out)
                atomic_fetch_add(&g->t->slot[g->me].ask_timeouts, 1);
        }
        table_unlock(g->t);
    }
    dev_lock(d, DEV_NEED_SLOTS);
    return got > 0 || died;
}

void group_oom_info(const struct dev_alloc *d, char *buf, size_t size)
{
    if (size)
        buf[0] = '\0';
    struct group *g = atomic_load(&g_groups[d->device]);
    char bad[160];
    if (!g || !g->t || atomic_load(&g->alone) || !size || !table_intact(g, bad, sizeof bad))
        return;
    size_t n = (size_t)snprintf(buf, size, " Memory group '%s' (cached / live per member):", g->name);
    for (int i = 0; i < GROUP_SLOTS && n < size; i++) {
        xseg_group_member m;
        char why[96], s1[32], s2[32];
        if (!slot_read(&g->t->slot[i], g->total, &m, why, sizeof why) || !m.pid)
            continue;
        n += (size_t)snprintf(buf + n, size - n, " pid %d%s %s / %s;", m.pid, i == g->me ? " (this process)" : "",
                              err_format_size(m.reclaimable_bytes, s1),
                              err_format_size(m.allocated_bytes, s2));
    }
}

/* Copy a table's members out (validated) into @p members. */
static xseg_status table_members(const struct gtable *t, uint64_t total, const char *path,
                                 xseg_group_member *members, size_t capacity, size_t *count)
{
    char why[160];
    if (!table_ok(t, total, why, sizeof why))
        return err_set(XSEG_ERROR_INVALID_VALUE, "memory group table /dev/shm%s is corrupted (%s)", path, why);
    size_t k = 0;
    for (int i = 0; i < GROUP_SLOTS; i++) {
        xseg_group_member m;
        if (!slot_read(&t->slot[i], total, &m, why, sizeof why) || !m.pid || !member_alive(&t->slot[i], m.pid))
            continue;
        m.group_budget_bytes = t->group_budget;
        if (k < capacity)
            members[k] = m;
        k++;
    }
    *count = k;
    return XSEG_SUCCESS;
}

xseg_status group_stats(int device, xseg_group_member *members, size_t capacity, size_t *count)
{
    if (!count || (capacity && !members))
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_group_stats: count is NULL, or members is NULL "
                       "with a capacity of %zu", capacity);
    *count = 0;
    if (device < 0 || device >= ALLOC_MAX_DEVICES)
        return err_set(XSEG_ERROR_INVALID_DEVICE, "xseg_group_stats: invalid device %d", device);
    struct group *g = atomic_load(&g_groups[device]);
    if (!g)
        return err_set(XSEG_ERROR_ILLEGAL_STATE, "xseg_group_stats: device %d is in no memory group "
                       "(memory_group unset, or the device not used yet)", device);
    char why[160];
    if (!atomic_load(&g->alone) && !table_intact(g, why, sizeof why))
        return err_set(XSEG_ERROR_ILLEGAL_STATE, "xseg_group_stats: memory group table /dev/shm%s is corrupted "
                       "(%s): device %d goes on alone", g->path, why, device);
    if (atomic_load(&g->alone))
        return err_set(XSEG_ERROR_ILLEGAL_STATE, "xseg_group_stats: %s",
                       atomic_load_explicit(&g->rejoin_failed, memory_order_acquire) ? g->rejoin_error : g->error);
    return table_members(g->t, g->total, g->path, members, capacity, count);
}

/* @p in as printable ASCII (other bytes, quotes and backslash as \xNN): a table name is another
 * user's text and must not reach a terminal or a log through xseg_last_error() raw. */
static const char *name_shown(char *out, size_t cap, const char *in)
{
    size_t n = 0;
    for (const unsigned char *c = (const unsigned char *)in; *c && n + 5 < cap; c++) {
        if (*c < 0x20 || *c >= 0x7f || *c == '\\' || *c == '\'' || *c == '"')
            n += (size_t)snprintf(out + n, cap - n, "\\x%02x", *c);
        else
            out[n++] = (char)*c;
    }
    out[n] = 0;
    return out;
}

xseg_status group_read(const char *table, xseg_group_member *members, size_t capacity, size_t *count)
{
    if (!table || !count || (capacity && !members))
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_group_read: table or count is NULL, or members is "
                       "NULL with a capacity of %zu", capacity);
    *count = 0;
    char shown[4 * 100 + 8];
    if (strncmp(table, "xseg-group-", 11) || strchr(table, '/') || strlen(table) > 90)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_group_read: '%s' is not a memory group table "
                       "name (xseg-group-<uuid>-<name> in /dev/shm)", name_shown(shown, 4 * 100 + 5, table));
    char path[96];
    snprintf(path, sizeof path, "/%s", table);
    name_shown(shown, sizeof shown, path);
    int fd = shm_open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC, 0);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) {
        xseg_status e = err_set(XSEG_ERROR_INVALID_VALUE, "xseg_group_read: cannot open /dev/shm%s: %s",
                                shown, strerror(errno));
        if (fd >= 0)
            close(fd);
        return e;
    }
    if (st.st_uid != geteuid() || st.st_size != (off_t)sizeof(struct gtable)) {
        close(fd);
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_group_read: /dev/shm%s is %s", shown,
                       st.st_uid != geteuid() ? "another user's" : "not a memory group table (wrong size)");
    }
    /* A copy read, not a mapping: a file shrunk meanwhile reads short, never faults (SIGBUS). */
    struct gtable *t = xs_malloc(sizeof *t);
    size_t got = 0;
    while (t && got < sizeof *t) {
        ssize_t r = pread(fd, (char *)t + got, sizeof *t - got, (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (!t)
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "xseg_group_read: out of host memory reading /dev/shm%s", shown);
    xseg_status st2 = got < sizeof *t ? err_set(XSEG_ERROR_INVALID_VALUE, "xseg_group_read: /dev/shm%s is not a "
                                                "memory group table (it shrank to %zu bytes while read)", shown, got)
                      : !t->total_mem ? err_set(XSEG_ERROR_INVALID_VALUE, "memory group table /dev/shm%s is corrupted "
                                                "(no device capacity)", shown)
                      : table_members(t, t->total_mem, shown, members, capacity, count);
    xs_free(t);
    return st2;
}
