/*
 * The per-device mutex: one int word driven by C11 atomics, with the kernel's futex for sleeping
 * (the three-state protocol: 0 unlocked, 1 locked, 2 locked and maybe waited on).
 *
 * Why not pthread_mutex_t: a malloc+free pair on the device path takes this lock twice, and glibc's
 * uncontended lock + unlock adds type dispatch, owner/count bookkeeping and elision checks; this
 * lock costs one compare-exchange to take and one exchange to give back. It is a
 * plain (non-recursive, non-error-checking) mutex: taking it twice on one thread deadlocks, and
 * only the holder may release it, exactly as the allocator already uses PTHREAD_MUTEX_NORMAL.
 * Memory order: acquire on every successful take, release on every give-back, so everything
 * written under the lock is visible to the next holder (TSan sees the same edges).
 *
 * The global (non-hot) locks of runtime.c and settings.c stay pthread mutexes.
 */
#ifndef XSEG_BASE_LOCK_H
#define XSEG_BASE_LOCK_H

#include <stdatomic.h>
#include <stdbool.h>

#include "base/assert.h"
#include "base/common.h"
#include "base/witness.h"

struct lock {
    atomic_int word; /* 0 unlocked, 1 locked, 2 locked with possible sleepers */
    /* Starvation (base/lock.c): waiters that slept past LOCK_STARVE_NS, and 1 while a release
     * has handed the lock, still held, to one of them. A taker looping lock/unlock otherwise wins
     * every race against a woken sleeper (bench_services --lock-wait). */
    atomic_int starving;
    atomic_int handed;
    atomic_uint handoffs; /* hand-offs so far (tests/unit/test_lock.c) */
#if XSEG_DEBUG_LEVEL >= 1
    /* Debug builds only: the holder (lock_self() of its thread), for lock_assert_held. Written by
     * the holder alone, read by threads that claim to hold the lock: relaxed is enough. */
    _Atomic(const void *) owner;
#endif
};

#define LOCK_INIT {0}

#if XSEG_DEBUG_LEVEL >= 1
/* A per-thread address that names the calling thread. */
const void *lock_self(void);
/* Record the holder of @p l (a struct lock or struct spin). */
#define lock_set_owner(l, who) atomic_store_explicit(&(l)->owner, (who), memory_order_relaxed)
/* The calling thread holds @p l: what the "(lock held)" of a contract means, checked. */
#define lock_assert_held(l) xseg_assert(atomic_load_explicit(&(l)->owner, memory_order_relaxed) == lock_self())
#else
#define lock_set_owner(l, who) ((void)0)
#define lock_assert_held(l) ((void)sizeof(l))
#endif

static inline void lock_init(struct lock *l)
{
    atomic_init(&l->word, 0);
    atomic_init(&l->starving, 0);
    atomic_init(&l->handed, 0);
    atomic_init(&l->handoffs, 0);
    lock_set_owner(l, NULL);
}

/* Contended halves, out of line (base/lock.c). */
void lock_acquire_slow(struct lock *l);
void lock_wake(struct lock *l);
void lock_hand_off(struct lock *l);

/* Device locks rank FORK_RANK_DEVICE in the lock order (base/fork.h), checked at debug_level >= 1. */
static inline void lock_acquire(struct lock *l)
{
    witness_take(FORK_RANK_DEVICE);
    int expected = 0;
    if (XSEG_UNLIKELY(!atomic_compare_exchange_strong_explicit(&l->word, &expected, 1, memory_order_acquire,
                                                              memory_order_relaxed)))
        lock_acquire_slow(l);
    lock_set_owner(l, lock_self());
}

/* Non-blocking take: true when the lock was free and is now held by the caller. */
static inline bool lock_try(struct lock *l)
{
    int expected = 0;
    bool taken = atomic_compare_exchange_strong_explicit(&l->word, &expected, 1, memory_order_acquire,
                                                         memory_order_relaxed);
    if (taken) {
        witness_took(FORK_RANK_DEVICE);
        lock_set_owner(l, lock_self());
    }
    return taken;
}

static inline void lock_release(struct lock *l)
{
    lock_assert_held(l);
    witness_give(FORK_RANK_DEVICE);
    lock_set_owner(l, NULL);
    /* A waiter starves: the lock goes to it without being released (no barging taker can get it).
     * Seen here since it counted itself before its last try (or, if not yet, it retries in 1 ms). */
    if (XSEG_UNLIKELY(atomic_load_explicit(&l->starving, memory_order_relaxed))) {
        lock_hand_off(l);
        return;
    }
    /* 2 means a thread may be sleeping in the kernel: wake one. It will set 2 again when it
     * takes the lock, so any further sleeper is woken by its release in turn. */
    if (XSEG_UNLIKELY(atomic_exchange_explicit(&l->word, 0, memory_order_release) == 2))
        lock_wake(l);
}

/*
 * A spin lock for critical sections of a few dozen instructions that only try-lockers take on
 * the hot path (the stream slots, core/device/device.h): taking it is one compare-exchange, giving it
 * back one release store, with no read-modify-write (no sleeper can be waiting, so nothing to
 * wake). Waiting takers (spin_acquire) spin, then yield the CPU to a holder that was preempted.
 */
struct spin {
    atomic_int word; /* 0 free, 1 held */
#if XSEG_DEBUG_LEVEL >= 1
    _Atomic(const void *) owner; /* as struct lock's */
#endif
};

static inline void spin_init(struct spin *l)
{
    atomic_init(&l->word, 0);
    lock_set_owner(l, NULL);
}

/* The compare-exchange of spin_try and spin_acquire, with no lock-order record. */
static inline bool spin_try_raw(struct spin *l)
{
    int expected = 0;
    bool taken = atomic_compare_exchange_strong_explicit(&l->word, &expected, 1, memory_order_acquire,
                                                         memory_order_relaxed);
    if (taken)
        lock_set_owner(l, lock_self());
    return taken;
}

/* Spin locks rank FORK_RANK_SLOT (base/fork.h), a leaf: a try is recorded; a blocking take
 * (spin_acquire) is checked at debug_level >= 1 to hold the device lock. */
static inline bool spin_try(struct spin *l)
{
    bool taken = spin_try_raw(l);
    if (taken)
        witness_took(FORK_RANK_SLOT);
    return taken;
}

void spin_acquire_slow(struct spin *l);

/* The take itself, its lock-order check made by the caller (one body for the three takes). */
static inline void spin_take(struct spin *l)
{
    if (XSEG_UNLIKELY(!spin_try_raw(l)))
        spin_acquire_slow(l);
}

/* The release of a lock taken at @p rank (one body for both releases). */
static inline void spin_give(struct spin *l, enum fork_rank rank)
{
    lock_assert_held(l);
    witness_give(rank);
    (void)rank;
    lock_set_owner(l, NULL);
    atomic_store_explicit(&l->word, 0, memory_order_release);
}

static inline void spin_acquire(struct spin *l)
{
    witness_take_slot();
    spin_take(l);
}

/* A blocking take by a thread holding no other spin lock (its own front, core/device/fast.c): the
 * device lock's holders, who take several, wait for none while holding this one, so no order
 * among spin locks is needed; checked at debug_level >= 1 as a take of the top rank. */
static inline void spin_acquire_leaf(struct spin *l)
{
    witness_take(FORK_RANK_SLOT);
    spin_take(l);
}

static inline void spin_release(struct spin *l) { spin_give(l, FORK_RANK_SLOT); }

/* A blocking take of a front's lane lock (core/device/fast.c, Note [front lane]) after its own
 * slot's, with or without the device lock: its holders take nothing else, and a lane's fast paths
 * only try it, so the own slot's holder waits for none that waits for it. Given back with
 * spin_release_lane (a try of it, spin_try's, with spin_release). */
static inline void spin_acquire_lane(struct spin *l)
{
    witness_take_lane();
    spin_take(l);
}

static inline void spin_release_lane(struct spin *l) { spin_give(l, FORK_RANK_LANE); }

#endif
