/* base/lock: the per-device futex mutex under contention. Several threads increment plain
 * (non-atomic) counters under the lock; any lost update or torn critical section shows up as a
 * wrong total or as two threads inside at once. Sleeping holders force the FUTEX_WAIT/WAKE path. */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "base/lock.h"
#include "tests/common/testutil.h"

#define NTHREADS 4

static struct lock lk = LOCK_INIT;
static uint64_t counter;       /* plain: guarded by lk */
static uint64_t shadow;        /* plain: guarded by lk, must always equal counter there */
static atomic_int inside;      /* threads inside the critical section (must stay <= 1) */
static atomic_int max_inside;
static size_t iters;
static bool sleepy;            /* holders sometimes yield or sleep inside the section */

static void *hammer(void *arg)
{
    uintptr_t id = (uintptr_t)arg;
    for (size_t i = 0; i < iters; i++) {
        if (i % 7 == id % 7 && lock_try(&lk)) {
            /* the non-blocking form also excludes */
        } else {
            lock_acquire(&lk);
        }
        int now = atomic_fetch_add_explicit(&inside, 1, memory_order_relaxed) + 1;
        if (now > atomic_load_explicit(&max_inside, memory_order_relaxed))
            atomic_store_explicit(&max_inside, now, memory_order_relaxed);
        uint64_t c = counter;
        if (sleepy && i % 64 == id) {
            /* Hold the lock across a reschedule so other threads go to sleep in the kernel. */
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        } else if (i % 16 == 0) {
            sched_yield();
        }
        counter = c + 1;
        shadow += 1;
        atomic_fetch_sub_explicit(&inside, 1, memory_order_relaxed);
        lock_release(&lk);
    }
    return NULL;
}

static void run(bool with_sleeps, size_t n)
{
    counter = shadow = 0;
    atomic_store(&inside, 0);
    atomic_store(&max_inside, 0);
    iters = n;
    sleepy = with_sleeps;
    pthread_t th[NTHREADS];
    for (uintptr_t i = 0; i < NTHREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, hammer, (void *)i), 0);
    for (int i = 0; i < NTHREADS; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_int_equal(counter, (uint64_t)NTHREADS * n);
    assert_int_equal(shadow, counter);
    assert_int_equal(atomic_load(&max_inside), 1);
    /* Released and uncontended again: the word is back to 0 and a try succeeds once. */
    assert_int_equal(atomic_load(&lk.word), 0);
    assert_true(lock_try(&lk));
    assert_false(lock_try(&lk));
    lock_release(&lk);
}

static void test_lock_counts_exact(void **state)
{
    (void)state;
    run(false, tu_scaled(200000, 2000));
}

static void test_lock_sleeping_holders(void **state)
{
    (void)state;
    run(true, tu_scaled(4000, 400));
}

/* Starvation: one thread takes and gives back the lock in a loop, sometimes holding it across a
 * 2 ms sleep, while others take it now and then; a waiter asleep past 1 ms gets the lock handed
 * over at a release (base/lock.c) rather than losing every race to the loop. Counts exact, one
 * thread inside at a time, hand-offs happened, and nothing is left starving or handed.
 * Whether one given 2 ms hold ends in a hand-off depends on who runs first after the release (a
 * woken taker that beats the loop to the word needs none), and under TSan on two loaded cores
 * `iters` rounds can pass without one: the takers go on past `iters` until the first hand-off,
 * for at most STARVE_DEADLINE_S, so the assertion waits for the event rather than a lucky count. */
#define STARVE_DEADLINE_S 30
static atomic_bool looping;
static unsigned handoffs_before;
static struct timespec starve_deadline;

static bool taker_goes_on(size_t i)
{
    if (i < iters)
        return true;
    if (atomic_load(&lk.handoffs) != handoffs_before)
        return false;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec < starve_deadline.tv_sec;
}
static void *looper(void *arg)
{
    (void)arg;
    for (unsigned i = 0; atomic_load_explicit(&looping, memory_order_relaxed); i++) {
        lock_acquire(&lk);
        if (atomic_fetch_add_explicit(&inside, 1, memory_order_relaxed) != 0)
            atomic_store_explicit(&max_inside, 2, memory_order_relaxed);
        uint64_t c = counter;
        if (i % 256 == 0)
            nanosleep(&(struct timespec){0, 2000000}, NULL);
        counter = c + 1;
        atomic_fetch_sub_explicit(&inside, 1, memory_order_relaxed);
        lock_release(&lk);
    }
    return NULL;
}

static void *taker(void *arg)
{
    uint64_t *took = arg;
    for (size_t i = 0; taker_goes_on(i); i++) {
        nanosleep(&(struct timespec){0, 100000}, NULL);
        lock_acquire(&lk);
        if (atomic_fetch_add_explicit(&inside, 1, memory_order_relaxed) != 0)
            atomic_store_explicit(&max_inside, 2, memory_order_relaxed);
        counter++;
        (*took)++;
        atomic_fetch_sub_explicit(&inside, 1, memory_order_relaxed);
        lock_release(&lk);
    }
    return NULL;
}

static void test_lock_starving(void **state)
{
    (void)state;
    counter = 0;
    atomic_store(&inside, 0);
    atomic_store(&max_inside, 0);
    iters = tu_scaled(400, 40);
    unsigned handoffs0 = atomic_load(&lk.handoffs);
    handoffs_before = handoffs0;
    clock_gettime(CLOCK_MONOTONIC, &starve_deadline);
    starve_deadline.tv_sec += STARVE_DEADLINE_S;
    atomic_store(&looping, true);
    pthread_t loop, th[2];
    uint64_t took[2] = {0, 0};
    assert_int_equal(pthread_create(&loop, NULL, looper, NULL), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, taker, &took[i]), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    atomic_store(&looping, false);
    assert_int_equal(pthread_join(loop, NULL), 0);
    assert_true(took[0] >= iters && took[1] >= iters);
    assert_int_equal(atomic_load(&max_inside), 0);
    assert_true(counter >= took[0] + took[1]);
    print_message("%u hand-offs\n", atomic_load(&lk.handoffs) - handoffs0);
    assert_true(atomic_load(&lk.handoffs) > handoffs0);
    assert_int_equal(atomic_load(&lk.starving), 0);
    assert_int_equal(atomic_load(&lk.handed), 0);
    assert_int_equal(atomic_load(&lk.word), 0);
    assert_true(lock_try(&lk));
    lock_release(&lk);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lock_counts_exact),
        cmocka_unit_test(test_lock_sleeping_holders),
        cmocka_unit_test(test_lock_starving),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
