/* Public entry points for long-running services (include/xseg.h): trim (core/services/trim.c), sleep and
 * wake (core/services/sleepwake.c: the lock and release_threshold_mb around core/services/sleep.c), and
 * by tag (the plan of core/services/sleeptags.c, run here pool by pool). */
#include <inttypes.h>
#include <stdio.h>

#include "api/api.h"
#include "api/dispatch.h"
#include "base/error.h"
#include "base/hostmem.h"
#include "core/alloc.h"
#include "core/services/group.h"
#include "core/policy/registry.h"
#include "core/runtime.h"
#include "core/services/sleep.h"
#include "core/services/sleeptags.h"
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

static xseg_status wake_on(struct dev_alloc *d, xseg_pool_id pool)
{
    xseg_status st = wake_device(d, pool);
    if (st == XSEG_SUCCESS)
        st = reg_after(d, XSEG_RANGE_REMAPPED); /* the pool's registrants register the new pages */
    return st;
}

XSEG_API xseg_status xseg_wake(int device, xseg_pool_id pool)
{
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    return st != XSEG_SUCCESS ? st : wake_on(d, pool);
}

/* ---- by tag: a plan of pools (core/services/sleeptags.c), each slept or woken as above ---- */

static const char *pool_words(xseg_pool_id id, char buf[64])
{
    if (!id.first && !id.second)
        return "the default pool";
    snprintf(buf, 64, "pool {%" PRIu64 ", %" PRIu64 "}", id.first, id.second);
    return buf;
}

XSEG_API xseg_status xseg_pool_set_tag(int device, xseg_pool_id pool, const char *tag)
{
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    return st != XSEG_SUCCESS ? st : tags_set(d, pool, tag);
}

XSEG_API xseg_status xseg_pool_get_tag(int device, xseg_pool_id pool, char *tag, size_t capacity)
{
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    return st != XSEG_SUCCESS ? st : tags_get(d, pool, tag, capacity);
}

/* A failed sleep of plan[k] (its message current): the pools slept before it are woken again,
 * newest first. */
static xseg_status sleep_tags_undo(struct dev_alloc *d, const struct tag_target *plan, size_t k, xseg_status st)
{
    struct err_kept first = err_keep();
    size_t left = 0, discarded = 0;
    struct err_kept wake = {""};
    for (size_t j = k; j-- > 0;) {
        if (wake_on(d, plan[j].pool) != XSEG_SUCCESS && !left++)
            wake = err_keep();
        discarded += plan[j].flags == XSEG_SLEEP_DISCARD;
    }
    char buf[64];
    const char *who = pool_words(plan[k].pool, buf);
    if (!k)
        return err_set(st, "xseg_sleep_tags: %s (tag '%s'): %s; no other pool slept", who, plan[k].tag, first.msg);
    if (left)
        return err_set(st, "xseg_sleep_tags: %s (tag '%s'): %s; of the %zu pool(s) this call put to sleep before it, "
                       "%zu could not be woken again (%s): they stay asleep with their bytes, xseg_wake_tags wakes "
                       "them", who, plan[k].tag, first.msg, k, left, wake.msg);
    return err_set(st, "xseg_sleep_tags: %s (tag '%s'): %s; the %zu pool(s) this call put to sleep before it were woken "
                   "again%s", who, plan[k].tag, first.msg, k, discarded ? " (the discarded ones read zero)" : "");
}

XSEG_API xseg_status xseg_sleep_tags(int device, const xseg_tag_sleep *tags, size_t count)
{
    struct dev_alloc *d;
    struct tag_target *plan = NULL;
    size_t n = 0, k = 0;
    xseg_status st = rt_device(device, &d);
    if (st == XSEG_SUCCESS)
        st = tags_plan_sleep(d, tags, count, &plan, &n);
    for (; st == XSEG_SUCCESS && k < n; k++)
        if ((st = sleep_on(device, plan[k].pool, plan[k].flags, NULL)) != XSEG_SUCCESS)
            st = sleep_tags_undo(d, plan, k, st);
    xs_free(plan);
    return st;
}

XSEG_API xseg_status xseg_wake_tags(int device, const char *const *tags, size_t count)
{
    struct dev_alloc *d;
    struct tag_target *plan = NULL;
    size_t n = 0, k = 0;
    xseg_status st = rt_device(device, &d);
    if (st == XSEG_SUCCESS)
        st = tags_plan_wake(d, tags, count, &plan, &n);
    for (; st == XSEG_SUCCESS && k < n; k++) {
        if ((st = wake_on(d, plan[k].pool)) == XSEG_SUCCESS)
            continue;
        char buf[64];
        st = err_prefix(st, "xseg_wake_tags: %s (tag '%s')", pool_words(plan[k].pool, buf), plan[k].tag);
        st = err_suffix(st, "; %zu pool(s) of these tags were woken before it, it and %zu after it stay asleep (the "
                        "same call retries them)", k, n - k - 1);
    }
    xs_free(plan);
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
