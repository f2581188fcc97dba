/* Public entry points for long-running services (include/xseg.h): trim (core/services/trim.c), sleep and
 * wake (core/services/sleepwake.c: the lock and release_threshold_mb around core/services/sleep.c). */
#include "api/api.h"
#include "api/dispatch.h"
#include "base/error.h"
#include "core/alloc.h"
#include "core/services/group.h"
#include "core/policy/registry.h"
#include "core/runtime.h"
#include "core/services/sleep.h"
#include "core/services/sleepwake.h"
#include "core/services/trim.h"

static xseg_status trim_op(struct dev_alloc *d, void *keep_bytes)
{
    return trim_device(d, *(const size_t *)keep_bytes, NULL);
}

/* Registrants of cached pages release them first (docs/registrations.md). */
static xseg_status trim_on(struct dev_alloc *d, void *keep_bytes)
{
    return reg_around(d, REG_SCOPE_FREE, (xseg_pool_id){0, 0}, XSEG_RANGE_RECLAIM, trim_op, keep_bytes);
}

struct sleep_args {
    xseg_pool_id pool;
    unsigned flags;
    const char *path;
};

static xseg_status sleep_op(struct dev_alloc *d, void *arg)
{
    const struct sleep_args *a = arg;
    return sleep_device(d, a->pool, a->flags, a->path);
}

/* The pool's registrants release first; a sleep that fails gives them their pages back. */
static xseg_status sleep_on(int device, xseg_pool_id pool, unsigned flags, const char *path)
{
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    struct sleep_args a = {pool, flags, path};
    return st != XSEG_SUCCESS ? st : reg_around(d, REG_SCOPE_POOL, pool, XSEG_RANGE_SLEEP, sleep_op, &a);
}

XSEG_API xseg_status xseg_trim(int device, size_t keep_bytes)
{
    return api_each_device(device, trim_on, &keep_bytes);
}

XSEG_API xseg_status xseg_sleep(int device, xseg_pool_id pool, unsigned flags)
{
    if (flags != XSEG_SLEEP_OFFLOAD && flags != XSEG_SLEEP_DISCARD)
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "xseg_sleep: flags must be XSEG_SLEEP_OFFLOAD (%d) or XSEG_SLEEP_DISCARD (%d), got 0x%x%s",
                       XSEG_SLEEP_OFFLOAD, XSEG_SLEEP_DISCARD, flags,
                       flags == XSEG_SLEEP_OFFLOAD_FILE ? " (XSEG_SLEEP_OFFLOAD_FILE needs xseg_sleep_ex and a path)"
                                                        : "");
    return sleep_on(device, pool, flags, NULL);
}

XSEG_API xseg_status xseg_sleep_ex(int device, xseg_pool_id pool, unsigned flags, const char *path)
{
    if (flags != XSEG_SLEEP_OFFLOAD_FILE) {
        if (path)
            return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_sleep_ex: a path is only for XSEG_SLEEP_OFFLOAD_FILE (%d), "
                           "got flags 0x%x", XSEG_SLEEP_OFFLOAD_FILE, flags);
        return xseg_sleep(device, pool, flags);
    }
    if (!path || !*path)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_sleep_ex: XSEG_SLEEP_OFFLOAD_FILE needs a path (got %s)",
                       path ? "an empty string" : "NULL");
    return sleep_on(device, pool, flags, path);
}

XSEG_API xseg_status xseg_wake(int device, xseg_pool_id pool)
{
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    if (st == XSEG_SUCCESS && (st = wake_device(d, pool)) == XSEG_SUCCESS)
        st = reg_after(d, XSEG_RANGE_REMAPPED); /* the pool's registrants register the new pages */
    return st;
}

XSEG_API xseg_status xseg_get_sleep_stats(int device, const xseg_pool_id *pool, xseg_sleep_stats *stats)
{
    if (!stats)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_get_sleep_stats: stats is NULL");
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    return st != XSEG_SUCCESS ? st : sleep_stats(d, pool, stats);
}

XSEG_API xseg_status xseg_group_stats(int device, xseg_group_member *members, size_t capacity, size_t *count)
{
    return group_stats(device, members, capacity, count);
}

XSEG_API xseg_status xseg_group_read(const char *table, xseg_group_member *members, size_t capacity,
                                     size_t *count)
{
    return group_read(table, members, capacity, count);
}
