/*
 * The process's state in one object (jemalloc's _structs.h idea, as core/device/state.h does for a
 * device): `xseg_rt`, a short list of named sub-states, each written only by the module that owns
 * it (tests/build/layering.sh checks the writes) and read elsewhere through that module's
 * accessors. A leaf header: types and the one object, no functions, so that the modules below
 * runtime.c keep their state here without including one another. xseg_shutdown
 * (core/shutdown.c) brings every sub-state back to its initial value, freeing what it points to.
 *
 * What stays outside, and why: constants and once-resolved lookups (vmm/driver.c's driver table,
 * history.c's unwinder and demangler symbols and its per-thread cache key, config.c's print-once
 * notice), per-thread caches (the error message, fast_tls.slot, api_last_device, history's
 * stack cache, witness_held), base/fork.c's and base/witness.c's rank tables (registered by
 * constructors before main), base/hostmem.c's test seam, vmm's own state (one struct per
 * module there: layers point one way), api/pools.c's id counter (never reset: an id from before
 * a shutdown names no later pool) and api/torch.c's adapter flag (the adapter outlives a
 * shutdown). tests/build/static_state.sh lists each with its reason and fails on a new one.
 */
#ifndef XSEG_CORE_PROCSTATE_H
#define XSEG_CORE_PROCSTATE_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/common.h"
#include "core/process/config.h"
#include "xseg.h"

#define ALLOC_MAX_DEVICES 64
/* Frames a C stack keeps until xseg_record_memory_history says otherwise. */
#define HIST_DEFAULT_FRAMES 16

struct dev_alloc;
struct hist_event;
struct hstack;
struct hframe;
struct observer;
struct ipc_import_rec;

/* ---- core/runtime.c: initialization and the device table (read inline by core/runtime.h) ----- */
struct rt_state {
    /* First: at offset 0 of xseg_rt, xseg_malloc indexes it with no add (callgrind_pairs.sh). */
    struct dev_alloc *_Atomic devs[ALLOC_MAX_DEVICES];
    _Atomic int ready;
    int ndevices; /* written once, before ready is released */
    _Atomic bool forked; /* a fork of a process that had initialised CUDA (set in the child) */
    pthread_mutex_t lock; /* init, device creation, teardown */
    /* Each device's state lives in pages of its own (base/pages.h), mapped at its first creation
     * and never unmapped: xseg_shutdown gives their memory back and the next creation of the
     * device reuses them, so a thread's cached slot pointer (fast_tls.slot) never dangles. */
    void *homes[ALLOC_MAX_DEVICES];
    /* The device's primary context is retained (once for the process, like the driver's load:
     * a program's streams on it outlive xseg_shutdown). */
    bool retained[ALLOC_MAX_DEVICES];
};

/* ---- core/process/settings.c: what the user set (core/process/settings.h) -------------------- */
struct settings_cb {
    void (*fn)(void);
    void *user;
};
struct settings_state {
    _Atomic unsigned generation;  /* bumped by every change: devices copy cfg when it moved */
    _Atomic bool idle_thread;     /* idle.c's thread runs (written by idle.c through settings.h) */
    _Atomic size_t nfree_atomic;  /* nfree, readable without the lock */
    _Atomic bool stale_on;        /* cfg.debug_stale_access, readable without the lock */
    pthread_mutex_t lock;         /* cfg */
    struct cfg cfg;
    /* Callbacks: append-only arrays under xseg_rt.settings.cb_lock; callers copy and call without it. */
    pthread_mutex_t cb_lock;
    struct settings_cb *oom, *free, *stale;
    size_t noom, nfree, capoom, capfree, nstale, capstale;
};

/* ---- core/services/idle.c: the idle-reclaim thread (core/services/idle.h) -------------------- */
struct idle_state {
    /* ctl_lock serializes starting and stopping (held across the join); lock guards stop and
     * the wait. The thread never takes ctl_lock. */
    pthread_mutex_t ctl_lock, lock;
    pthread_cond_t cond;
    bool cond_ready; /* cond made (written once, under once) */
    pthread_once_t once;
    pthread_t tid;
    bool stop; /* under lock */
    /* The devices served, handed over before the thread starts. */
    struct dev_alloc *(*device_at)(int device);
    int ndevices;
};

/* ---- core/process/history.c: the allocation history (core/process/history.h) ----------------- */
struct hist_state {
    _Atomic unsigned mode_word; /* HIST_* bits in force, read without the lock */
    _Atomic int opt_stacks;     /* also read without the lock: 0 skips the capture */
    pthread_mutex_t lock;       /* everything below */
    int opt_max_frames;
    xseg_stack_callback opt_callback;
    void *opt_user;
    /* The ring: cap slots, count used, the oldest at head. */
    struct hist_event *ring;
    size_t ring_cap, ring_head, ring_count;
    uint64_t ring_dropped;
    /* Stacks by hash (chained); frames by hash (chained). Power-of-two bucket counts. */
    struct hstack **stk_buckets;
    size_t stk_nbuckets, stk_count;
    struct hframe **frm_buckets;
    size_t frm_nbuckets, frm_count;
    /* Leading frames inside [self_lo, self_hi) (libxseg's own text, when it is a shared object)
     * are left out of C stacks; 0/0 when xseg is linked into the program. */
    uintptr_t self_lo, self_hi;
    bool self_known;
};

/* ---- core/policy/observe.c: segment observers (core/policy/observe.h) ------------------------ */
struct obs_state {
    _Atomic size_t count; /* n, readable without the lock: 0 means no work at all */
    pthread_mutex_t lock;
    struct observer *list;
    size_t n, cap;
};

/* ---- core/policy/registry.c: the registration ledger (core/policy/registry.h) ------------------------------ */
struct reg_entry;
struct reg_state {
    _Atomic size_t count; /* entries in the list, readable without the lock: 0 means no work at all */
    pthread_mutex_t lock;
    struct reg_entry *list;
    size_t failures[ALLOC_MAX_DEVICES], kept_bytes[ALLOC_MAX_DEVICES];
    uint64_t nccl_ids; /* the last handle xseg_nccl_register handed out (never reused) */
};

/* ---- core/policy/ipc.c: the table of imports (core/policy/ipc.h) ----------------------------- */
struct ipc_state {
    pthread_mutex_t imports_lock;
    struct ipc_import_rec *imports;
};

/* ---- core/snapshot.c: OOM snapshots (core/snapshot.h) ---------------------------------------- */
struct oomsnap_state {
    pthread_mutex_t lock;
    char *path;     /* set by xseg_set_oom_snapshot */
    bool path_set;  /* the API decided (even NULL): the environment is not read */
    int64_t last_us; /* when the last OOM snapshot was written (0: never) */
    bool writing;   /* an OOM inside the writer (observer, another thread) does not recurse */
};

/* ---- core/services/hostalloc.c: the pinned host cache (core/services/hostalloc.h) ------------ */
struct hc_block;
struct hc_event;
struct hc_counter {
    int64_t current, peak, allocated, freed;
};
struct hc_duration {
    int64_t total, max, min, count;
};
struct hc_free {
    struct hc_block **v; /* sorted by (size, address) */
    size_t n, cap;
};
/* debug_stale_access's host quarantine (core/services/hostquar.h), under the host cache's lock. */
struct hq_item;
struct quar_item;
struct hq_state {
    struct hq_item *q; /* q[head .. head + n): the oldest first */
    size_t head, n, cap;
    size_t bytes;      /* block bytes held */
    struct quar_item *found; /* findings not delivered yet (hostquar_take hands the array over) */
    size_t nfound, capfound;
    uint64_t entered, checked, reported, dropped;
};
struct host_state {
    pthread_mutex_t lock; /* everything below but the event thread's control */
    struct hc_free fr[2]; /* [small?] */
    /* Live map: block address -> block, open addressing (linear probing, backward-shift delete),
     * capacity a power of two at most half full. */
    struct hc_block **map;
    size_t mapcap, mapn;
    struct hc_event *pending, *spare; /* recorded events; spare events by context */
    size_t npending, cappending, nspare, capspare;
    /* Room is reserved ahead so that a free never allocates: the free index of a class holds at
     * most its blocks (nblocks), pending at most the streams recorded on live blocks (nuses),
     * spare at most the events made (nevents). */
    size_t nblocks[2], nuses, nevents;
    struct hc_counter allocation, segment, allocated_bytes, reserved_bytes;
    struct hc_duration alloc_time, free_time;
    int64_t num_host_alloc, num_host_free;
    struct hq_state quar; /* debug_stale_access: freed blocks held (core/services/hostquar.h) */
    size_t quar_bound;    /* debug_quarantine_mb as last read by an entry point (the event thread reads none) */
    /* The event thread (pinned_use_background_threads). ctl_lock serializes starting and
     * stopping (held across the join); the thread takes only lock, whose condition variable
     * carries the stop. */
    pthread_mutex_t ctl_lock;
    pthread_cond_t cond;
    bool cond_ready; /* cond made (written once, under once) */
    pthread_once_t once;
    pthread_t tid;
    bool stop;    /* under lock */
    bool running; /* the thread runs: written under ctl_lock, read relaxed anywhere */
};

/* ---- core/services/group.c: memory groups (core/services/group.h) ---------------------------- */
struct group;
struct group_state {
    /* One group per device: set by group_attach when the device is created, taken back by
     * group_detach_all at shutdown. */
    struct group *_Atomic devs[ALLOC_MAX_DEVICES];
    /* The tables mapped (NULL: a free entry), for the SIGBUS guard of a table file truncated
     * under its mapping; the disposition it replaced, installed once (bus_on). */
    void *_Atomic maps[2 * ALLOC_MAX_DEVICES];
    struct sigaction bus_old;
    _Atomic bool bus_on;
};

/* The process: each sub-state on cache lines of its own, so that a lock taken in one (the idle
 * thread's, history's) does not evict what the fast path reads in another (rt, settings). */
struct xseg_runtime {
    _Alignas(64) struct rt_state rt;
    _Alignas(64) struct settings_state settings;
    _Alignas(64) struct idle_state idle;
    _Alignas(64) struct hist_state hist;
    _Alignas(64) struct obs_state obs;
    _Alignas(64) struct reg_state reg;
    _Alignas(64) struct ipc_state ipc;
    _Alignas(64) struct oomsnap_state oom;
    _Alignas(64) struct host_state host;
    _Alignas(64) struct group_state group;
};

extern XSEG_HIDDEN struct xseg_runtime xseg_rt;

#endif
