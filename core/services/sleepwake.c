/*
 * xseg_sleep and xseg_wake on one device (see sleepwake.h): the entries api/ calls, around
 * core/services/sleep.c's work.
 */
#include "core/services/sleepwake.h"

#include "core/device/check.h"
#include "core/device/fast.h"
#include "core/device/quarantine.h"
#include "core/services/group.h"
#include "core/services/sleep.h"
#include "core/services/trim.h"

/* The end of a sleep or a wake (lock held, given back here): a sleep waited for the pool's
 * streams and a wake mapped pages again, so either is a point where release_threshold_mb
 * applies (core/services/trim.h); the permit follows the sleeping pools' count. */
static xseg_status sleep_wake_done(struct dev_alloc *d, xseg_status st)
{
    lock_assert_held(&d->lock);
    if (st == XSEG_SUCCESS && d->cfg.release_threshold != SIZE_MAX)
        trim_threshold(d, 0);
    dev_fast_update(d);
    dev_unlock(d);
    return st;
}

xseg_status sleep_device(struct dev_alloc *d, xseg_pool_id pool, unsigned flags, const char *path)
{
    dev_lock(d, DEV_NEED_OP);
    /* debug_stale_access: a sleep drains the quarantine first (checked, canary pages restored). */
    struct quar_batch batch = {0};
    if (XSEG_UNLIKELY(d->quar.n)) {
        (void)quar_check_all(d, "sleep", true, NULL);
        quar_take(d, &batch);
    }
    xseg_status st = sleep_wake_done(d, sleep_pool_locked(d, pool, flags, path));
    quar_deliver(&batch);
    return st;
}

/* The wake maps pages: under a budget its limit is measured first, as for a malloc's growth
 * (step 4 of malloc_policy, core/alloc.c), and our reserved bytes published after. */
xseg_status wake_device(struct dev_alloc *d, xseg_pool_id pool)
{
    dev_lock(d, DEV_NEED_OP);
    struct budget_view bv = {.limit = SIZE_MAX};
    bool budgeted = group_measure_on(d);
    if (budgeted)
        group_budget_measure(d, &bv, SIZE_MAX); /* the wake's growth: up to the limit */
    xseg_status st = wake_pool_locked(d, pool, bv.limit);
    if (budgeted)
        group_note_reserved(d, true);
    return sleep_wake_done(d, st);
}
