/*
 * Sleep and wake at the same addresses (services; include/xseg.h, docs/services.md): a pool gives
 * back the physical memory of every page it has mapped and keeps its virtual addresses; a wake
 * maps pages there again and restores the live blocks (from pinned host memory, or zeros).
 *
 * The blocks of a sleeping pool keep their state (allocated, free, mapped) and their segments
 * are marked asleep (segrec.asleep); the pages are asleep in vmm/segment.c. Nothing but a wake
 * maps or unmaps them: malloc refuses the pool (sleep_refuse), and the reclaim paths (release,
 * trim, recycling, idle reclaim) skip asleep segments. Frees and completed record_stream events
 * only change the blocks' books.
 *
 * Locking: sleep_stats takes the device lock; the rest expect it held. core/services/sleepwake.c
 * (sleep_device, wake_device) takes it around a sleep or wake and applies release_threshold_mb after
 * it (core/services/trim.h, above this module: it reads sleep_allocated_bytes). A sleep or wake gives the lock back during
 * its waits and file I/O (core/services/sleep.c): the pool is not awake from its first check to its end,
 * so its own operations are refused, while the device's other pools go on.
 */
#ifndef XSEG_CORE_SLEEP_H
#define XSEG_CORE_SLEEP_H

#include "core/device/device.h"

/* xseg_sleep / xseg_wake on one device (arguments checked by api/services.c). Lock held on entry
 * and return, given back in between (nothing read before may be trusted after). @p limit: the most
 * total_allocated_memory may reach under the budgets (core/services/group.h, measured by the caller;
 * SIZE_MAX: none), checked with the memory fraction at the start and before each segment maps. */
xseg_status sleep_pool_locked(struct dev_alloc *d, xseg_pool_id pool, unsigned flags, const char *path);
xseg_status wake_pool_locked(struct dev_alloc *d, xseg_pool_id pool, size_t limit);
/* Would xseg_sleep of @p pool be admitted now: known, awake, no capture, nothing of it lent out
 * or spilled, no classic segment (the errors xseg_sleep would return, nothing changed)? Lock held. */
xseg_status sleep_check(struct dev_alloc *d, xseg_pool_id pool);
/* Where @p pool stands: awake, asleep, or a sleep or wake of it underway (busy); *exists: does
 * @p d know it ({0, 0} always)? An unknown pool is awake. Lock held. */
enum sleep_where { SLEEP_AWAKE, SLEEP_ASLEEP, SLEEP_BUSY };
enum sleep_where sleep_where(struct dev_alloc *d, xseg_pool_id pool, bool *exists);
/* xseg_shutdown: destroy the device's copy streams (sleep and wake wait for their chunks, so none
 * has work queued). Lock held. */
void sleep_teardown(struct dev_alloc *d);
/* xseg_get_sleep_stats: @p pool, or every pool of the device when NULL. */
xseg_status sleep_stats(struct dev_alloc *d, const xseg_pool_id *pool, xseg_sleep_stats *out);

/* Is @p pp (NULL: the default pools) not awake: asleep, or a sleep or wake of it underway? Lock
 * held. */
static inline bool sleep_pool_asleep(const struct dev_alloc *d, const struct priv_pool *pp)
{
    lock_assert_held(&d->lock);
    return pp ? pp->sleep != NULL : d->sleep.sleep_default != NULL;
}

/* The error of a malloc routed to a pool not awake (XSEG_ERROR_ILLEGAL_STATE naming it and its
 * state). Lock held. */
xseg_status sleep_refuse(const struct dev_alloc *d, const struct priv_pool *pp);

/* Bytes of allocated blocks in sleeping pools: allocated_bytes counts them, reserved_bytes does
 * not count their pages, so "cached" (reserved - allocated) must leave them out. 0 while nothing
 * sleeps. Lock held. */
size_t sleep_allocated_bytes(const struct dev_alloc *d);

#endif
