/* The contended halves of base/lock.h: spin briefly, then sleep on the word with FUTEX_WAIT (the
 * mutex) or yield (the spin lock). */
#include <linux/futex.h>
#include <sched.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/lock.h"

static void futex_wait(atomic_int *word, int val, const struct timespec *timeout)
{
    /* Returns at once (EAGAIN) when *word no longer holds val; spurious wake-ups (EINTR) are
     * fine: the caller re-checks the word. The lock is process-private. */
    (void)syscall(SYS_futex, (int *)word, FUTEX_WAIT_PRIVATE, val, timeout, NULL, 0);
}

/* A waiter asleep this long takes the lock by hand-off (Go's sync.Mutex starvation mode uses the
 * same 1 ms): against a thread looping cached pairs through the lock, a woken sleeper otherwise
 * lost to it for up to 0.8 s (bench_services --lock-wait: docs/benchmarks.md). */
#define LOCK_STARVE_NS 1000000

/* Starving: counted in l->starving, so each release hands the lock over (lock_hand_off) until it
 * has it. Waits on l->handed with a timeout: a release that read l->starving before the count
 * made a plain release instead, and the retry then finds the word free. */
static void lock_starve(struct lock *l)
{
    static const struct timespec retry = {0, LOCK_STARVE_NS};
    atomic_fetch_add_explicit(&l->starving, 1, memory_order_seq_cst);
    for (;;) {
        if (atomic_exchange_explicit(&l->word, 2, memory_order_acquire) == 0)
            break;
        int one = 1;
        if (atomic_compare_exchange_strong_explicit(&l->handed, &one, 0, memory_order_acquire, memory_order_relaxed))
            break;
        futex_wait(&l->handed, 0, &retry);
    }
    atomic_fetch_sub_explicit(&l->starving, 1, memory_order_relaxed);
}

void lock_hand_off(struct lock *l)
{
    /* The word stays nonzero (held): the lock passes to whichever starving waiter takes handed. */
    atomic_fetch_add_explicit(&l->handoffs, 1, memory_order_relaxed);
    atomic_store_explicit(&l->handed, 1, memory_order_release);
    (void)syscall(SYS_futex, (int *)&l->handed, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
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
    int64_t since = 0;
    while (atomic_exchange_explicit(&l->word, 2, memory_order_acquire) != 0) {
        if (!since) {
            since = clock_mono_ns();
        } else if (clock_mono_ns() - since > LOCK_STARVE_NS) {
            lock_starve(l);
            return;
        }
        futex_wait(&l->word, 2, NULL);
    }
}

void lock_wake(struct lock *l)
{
    (void)syscall(SYS_futex, (int *)&l->word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

void spin_acquire_slow(struct spin *l)
{
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(&l->word, memory_order_relaxed) == 0 && spin_try_raw(l))
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
