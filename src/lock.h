/*
 * The per-device mutex: one int word driven by C11 atomics, with the kernel's futex for sleeping
 * (the three-state protocol: 0 unlocked, 1 locked, 2 locked and maybe waited on).
 *
 * Why not pthread_mutex_t: the cached malloc+free pair takes the device lock twice, and glibc's
 * uncontended lock + unlock cost ~55 instructions (type dispatch, owner/count bookkeeping, elision
 * checks); this lock costs one compare-exchange to take and one exchange to give back. It is a
 * plain (non-recursive, non-error-checking) mutex: taking it twice on one thread deadlocks, and
 * only the holder may release it, exactly as the allocator already uses PTHREAD_MUTEX_NORMAL.
 * Memory order: acquire on every successful take, release on every give-back, so everything
 * written under the lock is visible to the next holder (TSan sees the same edges).
 *
 * The global (non-hot) locks of runtime.c stay pthread mutexes.
 */
#ifndef XSEG_SRC_LOCK_H
#define XSEG_SRC_LOCK_H

#include <stdatomic.h>
#include <stdbool.h>

#include "src/common.h"

struct lock {
    atomic_int word; /* 0 unlocked, 1 locked, 2 locked with possible sleepers */
};

#define LOCK_INIT {0}

static inline void lock_init(struct lock *l) { atomic_init(&l->word, 0); }

/* Contended halves, out of line (src/lock.c). */
void lock_acquire_slow(struct lock *l);
void lock_wake(struct lock *l);

static inline void lock_acquire(struct lock *l)
{
    int expected = 0;
    if (XSEG_LIKELY(atomic_compare_exchange_strong_explicit(&l->word, &expected, 1, memory_order_acquire,
                                                            memory_order_relaxed)))
        return;
    lock_acquire_slow(l);
}

/* Non-blocking take: true when the lock was free and is now held by the caller. */
static inline bool lock_try(struct lock *l)
{
    int expected = 0;
    return atomic_compare_exchange_strong_explicit(&l->word, &expected, 1, memory_order_acquire,
                                                   memory_order_relaxed);
}

static inline void lock_release(struct lock *l)
{
    /* 2 means a thread may be sleeping in the kernel: wake one. It will set 2 again when it
     * takes the lock, so any further sleeper is woken by its release in turn. */
    if (XSEG_UNLIKELY(atomic_exchange_explicit(&l->word, 0, memory_order_release) == 2))
        lock_wake(l);
}

#endif
