/* The contended halves of base/lock.h: spin briefly, then sleep on the word with FUTEX_WAIT (the
 * mutex) or yield (the spin lock). */
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/lock.h"

static void futex_wait(atomic_int *word, int val)
{
    /* Returns at once (EAGAIN) when *word no longer holds val; spurious wake-ups (EINTR) are
     * fine: the caller re-checks the word. The lock is process-private. */
    (void)syscall(SYS_futex, (int *)word, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

void lock_acquire_slow(struct lock *l)
{
    /* Critical sections are short (tens of nanoseconds on the fast path): a brief spin often
     * sees the holder leave without a system call. Relaxed loads keep the cache line shared
     * while spinning; the exchange/compare-exchange that takes the lock is the acquire. */
    for (int i = 0; i < 100; i++) {
        int c = atomic_load_explicit(&l->word, memory_order_relaxed);
        if (c == 0) {
            int expected = 0;
            if (atomic_compare_exchange_weak_explicit(&l->word, &expected, 1, memory_order_acquire,
                                                      memory_order_relaxed))
                return;
        } else if (c == 2) {
            break; /* others already sleep: queue behind them */
        }
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    /* Mark the lock contended (2) whatever state it was in; if it was free we now hold it
     * (as "contended", which costs at most one needless wake-up at release). */
    while (atomic_exchange_explicit(&l->word, 2, memory_order_acquire) != 0)
        futex_wait(&l->word, 2);
}

void lock_wake(struct lock *l)
{
    (void)syscall(SYS_futex, (int *)&l->word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

void spin_acquire_slow(struct spin *l)
{
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(&l->word, memory_order_relaxed) == 0 && spin_try(l))
            return;
        if (i < 100) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        } else {
            sched_yield(); /* the holder may have been preempted inside its few instructions */
        }
    }
}

#if XSEG_DEBUG_LEVEL >= 1
const void *lock_self(void)
{
    static _Thread_local char self;
    return &self;
}
#endif
