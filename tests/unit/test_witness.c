/*
 * base/witness.h: the lock order of base/fork.h checked per thread (debug_level >= 1 builds;
 * skips at 0, where the check compiles to nothing). Taking ranks upward works; taking a rank not
 * above one held aborts (in a child process), for the process-wide ranks, the device lock and the
 * stream slots' leaf rank.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include <cmocka.h>

#include "base/lock.h"
#include "base/witness.h"
#include "tests/common/testutil.h"

#if XSEG_DEBUG_LEVEL >= 1
static void expect_abort(int (*fn)(void *))
{
    int detail = 0;
    enum tu_child_outcome o = tu_run_child(fn, NULL, &detail);
    assert_int_equal(o, TU_CHILD_SIGNAL);
    assert_int_equal(detail, SIGABRT);
}

/* In order: xseg_rt.rt.lock, a group table, a device lock, the host cache's, xseg_rt.hist.lock, host_proc.lock;
 * then given back in any order. */
static void test_order_kept(void **state)
{
    (void)state;
    struct lock dev;
    lock_init(&dev);
    witness_take(FORK_RANK_RUNTIME);
    witness_take(FORK_RANK_GROUP_TABLE); /* a memory group's table: below a device lock */
    witness_give(FORK_RANK_GROUP_TABLE);
    lock_acquire(&dev);
    witness_take(FORK_RANK_HOSTALLOC); /* sleep's backups under a device lock */
    witness_give(FORK_RANK_HOSTALLOC);
    witness_take(FORK_RANK_HISTORY);
    witness_take(FORK_RANK_VMM_HOST);
    witness_give(FORK_RANK_HISTORY);
    lock_release(&dev);
    witness_give(FORK_RANK_VMM_HOST);
    witness_give(FORK_RANK_RUNTIME);
    /* A try-lock is recorded, never checked: a second device by try under the first. */
    struct lock dev2;
    lock_init(&dev2);
    lock_acquire(&dev);
    assert_true(lock_try(&dev2));
    lock_release(&dev2);
    lock_release(&dev);
}

static int history_then_runtime(void *arg)
{
    (void)arg;
    witness_take(FORK_RANK_HISTORY);
    witness_take(FORK_RANK_RUNTIME); /* aborts */
    return 0;
}

static int device_then_idle_ctl(void *arg)
{
    (void)arg;
    struct lock dev;
    lock_init(&dev);
    lock_acquire(&dev);
    witness_take(FORK_RANK_IDLE_CTL); /* aborts: the join of the idle thread under a device lock */
    return 0;
}

static int device_then_group_table(void *arg)
{
    (void)arg;
    struct lock dev;
    lock_init(&dev);
    lock_acquire(&dev);
    witness_take(FORK_RANK_GROUP_TABLE); /* aborts: give-way asks the group with the device lock dropped */
    return 0;
}

static int host_cache_then_host_ctl(void *arg)
{
    (void)arg;
    witness_take(FORK_RANK_HOSTALLOC);
    witness_take(FORK_RANK_HOSTALLOC_CTL); /* aborts: the event thread is joined without the cache's lock */
    return 0;
}

static int settings_then_device(void *arg)
{
    (void)arg;
    struct lock dev;
    lock_init(&dev);
    witness_take(FORK_RANK_SETTINGS);
    lock_acquire(&dev); /* aborts */
    return 0;
}

static int two_devices(void *arg)
{
    (void)arg;
    struct lock a, b;
    lock_init(&a);
    lock_init(&b);
    lock_acquire(&a);
    lock_acquire(&b); /* aborts: one rank, two blocking takes */
    return 0;
}

/* The stream slots' spin locks (FORK_RANK_SLOT), a leaf under the device lock: several at once under
 * it, a try without it; given back in any order. */
static void test_slots_kept(void **state)
{
    (void)state;
    struct lock dev;
    struct spin s1, s2;
    lock_init(&dev);
    spin_init(&s1);
    spin_init(&s2);
    lock_acquire(&dev);
    spin_acquire(&s1);
    spin_acquire(&s2); /* settle and dev_check hold every busy slot */
    spin_release(&s1);
    spin_release(&s2);
    lock_release(&dev);
    assert_true(spin_try(&s1)); /* the fast path's hit: no device lock */
    spin_release(&s1);
}

/* A front's lane locks (FORK_RANK_LANE): after its own slot's, with the device lock (every lane
 * of every busy front) or without it (the owner's hit folding or entering a lane); a try alone. */
static void test_lanes_kept(void **state)
{
    (void)state;
    struct lock dev;
    struct spin own, l1, l2;
    lock_init(&dev);
    spin_init(&own);
    spin_init(&l1);
    spin_init(&l2);
    lock_acquire(&dev);
    spin_acquire(&own);
    spin_acquire_lane(&l1);
    spin_acquire_lane(&l2); /* fast_lock_busy: every lane of the front */
    spin_release_lane(&l2);
    spin_release_lane(&l1);
    spin_release(&own);
    lock_release(&dev);
    spin_acquire_leaf(&own); /* a front's hit, no device lock */
    spin_acquire_lane(&l1);
    spin_release_lane(&l1);
    spin_release(&own);
    assert_true(spin_try(&l1)); /* a lane's hit */
    spin_release(&l1);
}

static int two_lanes_without_device(void *arg)
{
    (void)arg;
    struct spin own, l1, l2;
    spin_init(&own);
    spin_init(&l1);
    spin_init(&l2);
    spin_acquire_leaf(&own);
    spin_acquire_lane(&l1);
    spin_acquire_lane(&l2); /* aborts: one lane at a time without the device lock */
    return 0;
}

static int lane_then_slot(void *arg)
{
    (void)arg;
    struct spin own, l;
    spin_init(&own);
    spin_init(&l);
    spin_acquire_lane(&l);
    spin_acquire_leaf(&own); /* aborts: the own slot's lock comes first */
    return 0;
}

static int slot_without_device(void *arg)
{
    (void)arg;
    struct spin s;
    spin_init(&s);
    spin_acquire(&s); /* aborts: a blocking take needs the device lock */
    return 0;
}

static int slot_then_history(void *arg)
{
    (void)arg;
    struct lock dev;
    struct spin s;
    lock_init(&dev);
    spin_init(&s);
    lock_acquire(&dev);
    spin_acquire(&s);
    witness_take(FORK_RANK_VMM_HOST); /* aborts: nothing is taken under a slot's lock */
    return 0;
}

static int tried_slot_then_device(void *arg)
{
    (void)arg;
    struct lock dev;
    struct spin s;
    lock_init(&dev);
    spin_init(&s);
    if (!spin_try(&s))
        return 0;
    lock_acquire(&dev); /* aborts: the device lock comes first */
    return 0;
}

static int give_unheld(void *arg)
{
    (void)arg;
    witness_give(FORK_RANK_CALLBACKS); /* aborts */
    return 0;
}

static void test_order_broken(void **state)
{
    (void)state;
    expect_abort(history_then_runtime);
    expect_abort(device_then_idle_ctl);
    expect_abort(device_then_group_table);
    expect_abort(host_cache_then_host_ctl);
    expect_abort(settings_then_device);
    expect_abort(two_devices);
    expect_abort(give_unheld);
    expect_abort(slot_without_device);
    expect_abort(slot_then_history);
    expect_abort(tried_slot_then_device);
    expect_abort(two_lanes_without_device);
    expect_abort(lane_then_slot);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_kept),
        cmocka_unit_test(test_order_broken),
        cmocka_unit_test(test_slots_kept),
        cmocka_unit_test(test_lanes_kept),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void)
{
    printf("unit-witness: skipped: the lock order is checked at debug_level >= 1 only\n");
    return 77;
}
#endif
