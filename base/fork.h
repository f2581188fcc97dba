/*
 * fork() safety: every process-wide mutex of xseg, taken before a fork and given back after it.
 *
 * A child of a multi-threaded process starts with one thread; a mutex another thread held at the
 * fork stays held for ever in the child. So the prepare handler (pthread_atfork, registered once
 * at library load) takes every registered mutex in the rank order below, the parent handler gives
 * them back, and the child handler re-initialises them and then runs the child hooks (which reset
 * what the child cannot keep: the device table, the idle thread's state). The per-device locks
 * (struct lock) are not taken: a child never uses the parent's devices (core/runtime.c refuses).
 *
 * THE LOCK ORDER (the one place it is written): a lock of lower rank may be held while one of
 * higher rank is taken, never the reverse. Ranks below FORK_RANK_DEVICE are taken before a device
 * lock (or held across work that takes one: a join of the idle thread, driver init); ranks above
 * it are taken under a device lock, or alone. base/witness.h checks it at debug_level >= 1: the
 * mutexes are taken with mutex_lock (which finds their rank here), the device locks at
 * FORK_RANK_DEVICE, and a blocking take below or at a rank held aborts.
 */
#ifndef XSEG_BASE_FORK_H
#define XSEG_BASE_FORK_H

#include <pthread.h>

enum fork_rank {
    FORK_RANK_IDLE_CTL,     /* core/services/idle.c xseg_rt.idle.ctl_lock: held across the join */
    FORK_RANK_HOSTALLOC_CTL, /* core/services/hostalloc.c xseg_rt.host.ctl_lock: starting and joining its thread */
    FORK_RANK_RUNTIME,      /* core/runtime.c xseg_rt.rt.lock: init, settings_apply, device table */
    FORK_RANK_IDLE,         /* core/services/idle.c xseg_rt.idle.lock: the thread's stop flag and wait */
    FORK_RANK_GROUP_TABLE,  /* (not registered) core/services/group.c's table lock, in shared memory: with no device lock held */
    FORK_RANK_DEVICE,       /* (not a mutex) the per-device locks, base/lock.h: never taken here */
    FORK_RANK_HOSTALLOC,    /* core/services/hostalloc.c xseg_rt.host.lock: the host cache (sleep takes it alone, or under a device lock) */
    FORK_RANK_OBSERVERS,    /* core/policy/observe.c xseg_rt.obs.lock: under a device lock; takes vmm's below */
    FORK_RANK_REGISTRY,     /* core/policy/registry.c xseg_rt.reg.lock: under a device lock; never held across a callback */
    FORK_RANK_SETTINGS,     /* core/process/settings.c xseg_rt.settings.lock */
    FORK_RANK_CALLBACKS,    /* core/process/settings.c xseg_rt.settings.cb_lock */
    FORK_RANK_HISTORY,      /* core/process/history.c xseg_rt.hist.lock */
    FORK_RANK_OOM_SNAPSHOT, /* core/snapshot.c xseg_rt.oom.lock */
    FORK_RANK_IPC_IMPORTS,  /* core/policy/ipc.c xseg_rt.ipc.imports_lock */
    FORK_RANK_VMM_LEFT,     /* vmm/segment.c seg_proc.left_lock */
    FORK_RANK_VMM_CURSOR,   /* vmm/segment.c seg_proc.cursor_lock */
    FORK_RANK_VMM_HOST,     /* vmm/host.c host_proc.lock */
    FORK_RANK_VMM_KERNEL,   /* vmm/kernel.c vkern_proc.lock: held across the allocator's launches and its check's wait */
    FORK_RANK_SLOT,         /* (not a mutex) the stream slots' spin locks (struct spin, base/lock.h): a leaf
                             * but for FORK_RANK_LANE; blocking takes under the device lock (several at
                             * once, in slot order: that lock serialises such takers), or of one's own
                             * front alone (spin_acquire_leaf) */
    FORK_RANK_LANE,         /* (not a mutex) a front's lane slots' spin locks (core/device/fast.c): taken
                             * after their own slot's, nothing under one (spin_acquire_lane) */
    FORK_RANK_COUNT
};

/* Register @p m at @p rank (one mutex per rank), and @p child (may be NULL) to run in a forked
 * child after every mutex is re-initialised, in rank order. Called from library constructors
 * (FORK_MUTEX, FORK_CHILD), before any thread of the user can call xseg. */
void fork_register(enum fork_rank rank, pthread_mutex_t *m, void (*child)(void));

/* At file scope: register mutex @p m at rank @p rank (with no child hook). */
#define FORK_MUTEX(rank, m)                                                                       \
    __attribute__((constructor)) static void fork_register_##m(void) { fork_register(rank, &m, NULL); }

/* At file scope: register the mutex lvalue @p m (a field: xseg_rt.hist.lock) at @p rank, @p tag
 * naming the constructor. */
#define FORK_MUTEX_AT(rank, tag, m)                                                               \
    __attribute__((constructor)) static void fork_register_##tag(void) { fork_register(rank, &(m), NULL); }
/* At file scope: run @p fn in a forked child, in the slot of rank @p rank (no mutex). */
#define FORK_CHILD(rank, fn)                                                                      \
    __attribute__((constructor)) static void fork_register_##fn(void) { fork_register(rank, NULL, fn); }

#endif
