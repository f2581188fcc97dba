/*
 * Statistics with PyTorch's names. The counters live in an xseg_device_stats (public layout) per
 * device, updated under the device lock; readers copy the struct under the same lock.
 */
#ifndef XSEG_CORE_STATS_H
#define XSEG_CORE_STATS_H

#include "base/common.h"

/*
 * The allocator's own counters (struct dev_alloc.acct.stats) keep the "all" entry of each per-pool
 * array lazily, to halve the work of the fast path: arr[XSEG_STAT_ALL] holds only its peak, kept
 * exact at every increase (the peak of small + large); its current, allocated and freed are the
 * sums over the pools and are filled in by stats_fill_all on every copy handed out (and before a
 * peak reset). Likewise a decrease moves only current: every counter's freed is allocated - current
 * (no counter is ever set, only changed, and accumulated counts are never reset), so
 * stats_fill_all derives it too. Every change of a per-pool array goes through stat_add_pool / stat_up_pool /
 * stat_down_pool, and every read of an "all" entry through a filled copy (or stats_all_current).
 * The `active` and `active_bytes` rows are not counted at all: the device folds them from
 * allocation, allocated_bytes and its pending blocks when it copies the statistics out
 * (dev_stats_copy, core/device/device.h; struct dev_alloc.acct.pending says why that is exact).
 */

/* Change one counter by @p delta: current moves, allocated/freed accumulate, peak follows. */
static inline void stat_add(xseg_stat_counter *s, int64_t delta)
{
    s->current += delta;
    if (delta > 0) {
        s->allocated += delta;
        if (s->current > s->peak)
            s->peak = s->current;
    } else {
        s->freed -= delta;
    }
}

/* The sign-known forms of stat_add, for the fast path: an increase by @p n >= 0 (current,
 * allocated, peak) or a decrease by @p n >= 0 (current; freed derived, see above). Same results
 * as stat_add(±n) once filled in. */
static inline void stat_up(xseg_stat_counter *s, int64_t n)
{
    int64_t c = s->current + n;
    s->current = c;
    s->allocated += n;
    if (c > s->peak)
        s->peak = c;
}

static inline void stat_down(xseg_stat_counter *s, int64_t n)
{
    s->current -= n; /* freed is allocated - current, filled in by stats_fill_all */
}

/* Increase the entry of @p pool (XSEG_STAT_SMALL_POOL or _LARGE_POOL) by @p n >= 0; the "all"
 * entry's peak follows the sum of the pools (see above). */
static inline void stat_up_pool(xseg_stat_counter arr[XSEG_STAT_POOLS], int pool, int64_t n)
{
    int64_t c = arr[pool].current + n;
    arr[pool].current = c;
    arr[pool].allocated += n;
    if (c > arr[pool].peak)
        arr[pool].peak = c;
    /* The sum of the pools from the value at hand plus the other pool's (1 + 2 - pool): the
     * compiler cannot tell arr[pool] from arr[1] or arr[2], so re-reading both costs a load. */
    int64_t total = c + arr[XSEG_STAT_SMALL_POOL + XSEG_STAT_LARGE_POOL - pool].current;
    if (total > arr[XSEG_STAT_ALL].peak)
        arr[XSEG_STAT_ALL].peak = total;
}

/* Raise @p c's peak to @p v (a value the counter reached, accounted out of order). */
static inline void stat_peak_at_least(xseg_stat_counter *c, int64_t v)
{
    if (v > c->peak)
        c->peak = v;
}

/* Decrease the entry of @p pool by @p n >= 0 (a decrease never moves a peak). */
static inline void stat_down_pool(xseg_stat_counter arr[XSEG_STAT_POOLS], int pool, int64_t n)
{
    stat_down(&arr[pool], n);
}

/* Change the entry of @p pool by @p delta, and with it the "all" entry (see above). */
static inline void stat_add_pool(xseg_stat_counter arr[XSEG_STAT_POOLS], int pool, int64_t delta)
{
    if (delta > 0)
        stat_up_pool(arr, pool, delta);
    else
        stat_down_pool(arr, pool, -delta);
}

/* The current value of the "all" entry of a per-pool array of the allocator's counters. */
static inline int64_t stats_all_current(const xseg_stat_counter arr[XSEG_STAT_POOLS])
{
    return arr[XSEG_STAT_SMALL_POOL].current + arr[XSEG_STAT_LARGE_POOL].current;
}

/* Fill in current, allocated and freed of every "all" entry from the pools, and every counter's
 * freed (see above). */
void stats_fill_all(xseg_device_stats *stats);

/* Number of keys, and the i-th key ("allocation.all.current", ...), in a stable order. */
size_t stats_key_count(void);
const char *stats_key_name(size_t index);

/* Look up @p key in @p stats. XSEG_ERROR_INVALID_VALUE naming the key when unknown. */
xseg_status stats_lookup(const xseg_device_stats *stats, const char *key, int64_t *value);

/* Reset every peak to current. */
void stats_reset_peaks(xseg_device_stats *stats);

/* Subtract the accumulated values of @p base (a filled copy) from the filled copy @p stats: every
 * counter's allocated and freed, and the num_* counts (max_split_size is a setting, not a count). */
void stats_subtract_accumulated(xseg_device_stats *stats, const xseg_device_stats *base);

/* A table like torch.cuda.memory_summary() (snprintf semantics; @p len gets the full length). */
void stats_format_summary(const xseg_device_stats *stats, int device, char *buf, size_t size,
                          size_t *len);

#endif
