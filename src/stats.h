/*
 * Statistics with PyTorch's names. The counters live in an xseg_device_stats (public layout) per
 * device, updated under the device lock; readers copy the struct under the same lock.
 */
#ifndef XSEG_SRC_STATS_H
#define XSEG_SRC_STATS_H

#include "src/common.h"

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

/* Change the "all" entry and the entry of @p pool (XSEG_STAT_SMALL_POOL or _LARGE_POOL). */
static inline void stat_add_pool(xseg_stat_counter arr[XSEG_STAT_POOLS], int pool, int64_t delta)
{
    stat_add(&arr[XSEG_STAT_ALL], delta);
    stat_add(&arr[pool], delta);
}

/* The same with the sign known, for the fast path: an increase by @p n >= 0 (current, allocated,
 * peak) or a decrease by @p n >= 0 (current, freed). Identical results to stat_add(±n). */
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
    s->current -= n;
    s->freed += n;
}

static inline void stat_up_pool(xseg_stat_counter arr[XSEG_STAT_POOLS], int pool, int64_t n)
{
    stat_up(&arr[XSEG_STAT_ALL], n);
    stat_up(&arr[pool], n);
}

static inline void stat_down_pool(xseg_stat_counter arr[XSEG_STAT_POOLS], int pool, int64_t n)
{
    stat_down(&arr[XSEG_STAT_ALL], n);
    stat_down(&arr[pool], n);
}

/* Number of keys, and the i-th key ("allocation.all.current", ...), in a stable order. */
size_t stats_key_count(void);
const char *stats_key_name(size_t index);

/* Look up @p key in @p stats. XSEG_ERROR_INVALID_VALUE naming the key when unknown. */
xseg_status stats_lookup(const xseg_device_stats *stats, const char *key, int64_t *value);

/* Reset every peak to current. */
void stats_reset_peaks(xseg_device_stats *stats);

/* A table like torch.cuda.memory_summary() (snprintf semantics; @p len gets the full length). */
void stats_format_summary(const xseg_device_stats *stats, int device, char *buf, size_t size,
                          size_t *len);

#endif
