/*
 * Statistic keys with torch.cuda.memory_stats()'s names, and the memory_summary() table.
 *
 * One table row per key maps the name to an offset inside xseg_device_stats, so enumeration,
 * lookup and peak reset all read the same rows and cannot drift apart. Everything here works on
 * a caller's copy of the struct; the device lock is the caller's business (stats.h).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "core/index/stats.h"
#include "base/strbuf.h"

struct stats_row {
    const char *name;
    size_t offset; /* of an int64_t inside xseg_device_stats */
};

#define STATS_OFF(member) offsetof(xseg_device_stats, member)
#define STATS_COUNTER(name, member)                                                            \
    {name ".current", STATS_OFF(member.current)}, {name ".peak", STATS_OFF(member.peak)},      \
        {name ".allocated", STATS_OFF(member.allocated)},                                      \
        {name ".freed", STATS_OFF(member.freed)}
#define STATS_POOLED(arr)                                                                      \
    STATS_COUNTER(#arr ".all", arr[XSEG_STAT_ALL]),                                            \
        STATS_COUNTER(#arr ".small_pool", arr[XSEG_STAT_SMALL_POOL]),                          \
        STATS_COUNTER(#arr ".large_pool", arr[XSEG_STAT_LARGE_POOL])
#define STATS_SCALAR(member) {#member, STATS_OFF(member)}

static const struct stats_row stats_rows[] = {
    STATS_POOLED(allocation),
    STATS_POOLED(segment),
    STATS_POOLED(active),
    STATS_POOLED(inactive_split),
    STATS_POOLED(allocated_bytes),
    STATS_POOLED(reserved_bytes),
    STATS_POOLED(active_bytes),
    STATS_POOLED(inactive_split_bytes),
    STATS_POOLED(requested_bytes),
    STATS_COUNTER("oversize_allocations", oversize_allocations),
    STATS_COUNTER("oversize_segments", oversize_segments),
    STATS_SCALAR(num_alloc_retries),
    STATS_SCALAR(num_ooms),
    STATS_SCALAR(num_sync_all_streams),
    STATS_SCALAR(num_device_alloc),
    STATS_SCALAR(num_device_free),
    STATS_SCALAR(max_split_size),
    STATS_COUNTER("spilled_bytes.all", spilled_bytes), /* xseg's spill (core/services/spill.c) */
    STATS_SCALAR(num_spills),
    STATS_SCALAR(num_promotions),
    STATS_SCALAR(spill_copied_bytes),
    STATS_SCALAR(spill_numa_node),
    STATS_SCALAR(spill_numa_fallback),
};

#define STATS_NROWS (sizeof stats_rows / sizeof stats_rows[0])

static int64_t *stats_at(xseg_device_stats *s, size_t offset)
{
    return (int64_t *)(void *)((char *)s + offset);
}

static int64_t stats_get(const xseg_device_stats *s, size_t offset)
{
    int64_t v;
    memcpy(&v, (const char *)s + offset, sizeof v);
    return v;
}

size_t stats_key_count(void) { return STATS_NROWS; }

const char *stats_key_name(size_t index) { return index < STATS_NROWS ? stats_rows[index].name : NULL; }

xseg_status stats_lookup(const xseg_device_stats *stats, const char *key, int64_t *value)
{
    if (!key)
        return err_set(XSEG_ERROR_INVALID_VALUE, "statistic key is NULL");
    if (!stats || !value)
        return err_set(XSEG_ERROR_INVALID_VALUE, "stats_lookup('%s'): NULL %s", key,
                       !stats ? "stats" : "value");
    for (size_t i = 0; i < STATS_NROWS; i++) {
        if (!strcmp(stats_rows[i].name, key)) {
            *value = stats_get(stats, stats_rows[i].offset);
            return XSEG_SUCCESS;
        }
    }
    return err_set(XSEG_ERROR_INVALID_VALUE,
                   "unknown statistic key '%s' (expected a torch.cuda.memory_stats() key such as "
                   "'reserved_bytes.all.current'; xseg_stat_key lists them)",
                   key);
}

void stats_fill_all(xseg_device_stats *stats)
{
    xseg_stat_counter *arrs[] = {stats->allocation,      stats->segment,        stats->active,
                                 stats->inactive_split,  stats->allocated_bytes, stats->reserved_bytes,
                                 stats->active_bytes,    stats->inactive_split_bytes,
                                 stats->requested_bytes};
    for (size_t i = 0; i < sizeof arrs / sizeof arrs[0]; i++) {
        xseg_stat_counter *a = arrs[i];
        const xseg_stat_counter *sm = &a[XSEG_STAT_SMALL_POOL], *lg = &a[XSEG_STAT_LARGE_POOL];
        a[XSEG_STAT_ALL].current = sm->current + lg->current;
        a[XSEG_STAT_ALL].allocated = sm->allocated + lg->allocated;
    }
    /* freed = allocated - current, for every counter (the scalars after them are not counters). */
    _Static_assert(offsetof(xseg_device_stats, num_alloc_retries) ==
                       offsetof(xseg_device_stats, oversize_segments) + sizeof(xseg_stat_counter),
                   "the counters end with oversize_segments");
    xseg_stat_counter *c = (xseg_stat_counter *)(void *)stats;
    size_t ncounters = offsetof(xseg_device_stats, oversize_segments) / sizeof *c + 1;
    for (size_t i = 0; i < ncounters; i++)
        c[i].freed = c[i].allocated - c[i].current;
    stats->spilled_bytes.freed = stats->spilled_bytes.allocated - stats->spilled_bytes.current;
}

void stats_subtract_accumulated(xseg_device_stats *stats, const xseg_device_stats *base)
{
    xseg_stat_counter *c = (xseg_stat_counter *)(void *)stats;
    const xseg_stat_counter *b = (const xseg_stat_counter *)(const void *)base;
    size_t ncounters = offsetof(xseg_device_stats, oversize_segments) / sizeof *c + 1;
    for (size_t i = 0; i < ncounters; i++) {
        c[i].allocated -= b[i].allocated;
        c[i].freed -= b[i].freed;
    }
    stats->num_alloc_retries -= base->num_alloc_retries;
    stats->num_ooms -= base->num_ooms;
    stats->num_sync_all_streams -= base->num_sync_all_streams;
    stats->num_device_alloc -= base->num_device_alloc;
    stats->num_device_free -= base->num_device_free;
    stats->spilled_bytes.allocated -= base->spilled_bytes.allocated;
    stats->spilled_bytes.freed -= base->spilled_bytes.freed;
    stats->num_spills -= base->num_spills;
    stats->num_promotions -= base->num_promotions;
    stats->spill_copied_bytes -= base->spill_copied_bytes;
}

void stats_reset_peaks(xseg_device_stats *stats)
{
    static const char suffix[] = ".peak";
    const size_t slen = sizeof suffix - 1;
    for (size_t i = 0; i < STATS_NROWS; i++) {
        size_t n = strlen(stats_rows[i].name);
        if (n < slen || strcmp(stats_rows[i].name + n - slen, suffix))
            continue;
        /* The row names a counter's peak; its current sits in the same xseg_stat_counter. */
        size_t base = stats_rows[i].offset - offsetof(xseg_stat_counter, peak);
        *stats_at(stats, stats_rows[i].offset) =
            stats_get(stats, base + offsetof(xseg_stat_counter, current));
    }
}

/* ---- memory_summary -------------------------------------------------------------------- */


#define STATS_WIDTH 75 /* characters between the table's outer bars */

static void stats_rule(struct strbuf *o, char c)
{
    char line[STATS_WIDTH + 1];
    memset(line, c, STATS_WIDTH);
    line[STATS_WIDTH] = '\0';
    strbuf_printf(o, "|%s|\n", line);
}

/* A 10-character cell. The unit is chosen from @p pref (the "all" row's value in the same
 * column), so a metric's sub-rows share its unit, as memory_summary() does: the value is
 * divided by 1024 while pref is at least 768 KiB-equivalent of the current unit. */
static void stats_cell_size(char cell[16], int64_t v, int64_t pref)
{
    static const char *const units[] = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
    size_t u = 0;
    double p = (double)pref;
    while (u + 1 < sizeof units / sizeof units[0] && p >= 768.0 * 1024.0) {
        v /= 1024;
        p /= 1024.0;
        u++;
    }
    snprintf(cell, 16, "%6lld %s", (long long)v, units[u]);
}

/* Counts scale by 1000 (K, M) from 750 K on. */
static void stats_cell_count(char cell[16], int64_t v, int64_t pref)
{
    static const char units[] = {' ', 'K', 'M'};
    size_t u = 0;
    double p = (double)pref;
    while (u + 1 < sizeof units && p >= 750.0 * 1000.0) {
        v /= 1000;
        p /= 1000.0;
        u++;
    }
    snprintf(cell, 16, "%7lld %c ", (long long)v, units[u]);
}

typedef void (*stats_cell_fn)(char cell[16], int64_t v, int64_t pref);

static void stats_row_line(struct strbuf *o, const char *label, const xseg_stat_counter *c,
                           const xseg_stat_counter *pref, stats_cell_fn cell)
{
    char cur[16], peak[16], alloc[16], freed[16];
    cell(cur, c->current, pref->current);
    cell(peak, c->peak, pref->peak);
    cell(alloc, c->allocated, pref->allocated);
    cell(freed, c->freed, pref->freed);
    strbuf_printf(o, "| %-21s | %s | %s | %s | %s |\n", label, cur, peak, alloc, freed);
}

void stats_format_summary(const xseg_device_stats *stats, int device, char *buf, size_t size,
                          size_t *len)
{
    struct strbuf o = {buf, size, 0};
    if (size)
        buf[0] = '\0';

    static const struct {
        const char *label;
        size_t offset; /* of the xseg_stat_counter[XSEG_STAT_POOLS] array */
        bool bytes;
    } pooled[] = {
        {"Allocated memory", STATS_OFF(allocated_bytes), true},
        {"Active memory", STATS_OFF(active_bytes), true},
        {"Requested memory", STATS_OFF(requested_bytes), true},
        {"GPU reserved memory", STATS_OFF(reserved_bytes), true},
        {"Non-releasable memory", STATS_OFF(inactive_split_bytes), true},
        {"Allocations", STATS_OFF(allocation), false},
        {"Active allocs", STATS_OFF(active), false},
        {"GPU reserved segments", STATS_OFF(segment), false},
        {"Non-releasable allocs", STATS_OFF(inactive_split), false},
    };

    char title[STATS_WIDTH + 1];
    int tn = snprintf(title, sizeof title, "xseg memory summary, device ID %d", device);
    int pad = tn > 0 && tn < STATS_WIDTH ? (STATS_WIDTH - tn) / 2 : 0;
    stats_rule(&o, '=');
    strbuf_printf(&o, "|%*s%-*s|\n", pad, "", STATS_WIDTH - pad, title);
    stats_rule(&o, '-');
    char left[40], right[40];
    snprintf(left, sizeof left, "CUDA OOMs: %lld", (long long)stats->num_ooms);
    snprintf(right, sizeof right, "alloc retries: %lld", (long long)stats->num_alloc_retries);
    strbuf_printf(&o, "| %-35s| %-37s|\n", left, right);
    stats_rule(&o, '=');
    strbuf_printf(&o, "| %-21s | %-10s | %-10s | %-10s | %-10s |\n", "       Metric", "Cur Usage",
              "Peak Usage", "Tot Alloc", "Tot Freed");

    for (size_t m = 0; m < sizeof pooled / sizeof pooled[0]; m++) {
        const xseg_stat_counter *arr =
            (const xseg_stat_counter *)(const void *)((const char *)stats + pooled[m].offset);
        stats_cell_fn cell = pooled[m].bytes ? stats_cell_size : stats_cell_count;
        stats_rule(&o, '-');
        stats_row_line(&o, pooled[m].label, &arr[XSEG_STAT_ALL], &arr[XSEG_STAT_ALL], cell);
        stats_row_line(&o, "      from large pool", &arr[XSEG_STAT_LARGE_POOL], &arr[XSEG_STAT_ALL],
                       cell);
        stats_row_line(&o, "      from small pool", &arr[XSEG_STAT_SMALL_POOL], &arr[XSEG_STAT_ALL],
                       cell);
    }
    stats_rule(&o, '-');
    stats_row_line(&o, "Oversize allocations", &stats->oversize_allocations,
                   &stats->oversize_allocations, stats_cell_count);
    stats_rule(&o, '-');
    stats_row_line(&o, "Oversize GPU segments", &stats->oversize_segments,
                   &stats->oversize_segments, stats_cell_count);
    if (stats->spilled_bytes.allocated || stats->spilled_bytes.current) { /* spill_to_host ran */
        stats_rule(&o, '-');
        stats_row_line(&o, "Spilled to host", &stats->spilled_bytes, &stats->spilled_bytes, stats_cell_size);
        static const char *const how[] = {"the device's own node", "location HOST: the device names no node",
                                          "node 0: the device names no node, and has no location HOST"};
        char where[120];
        if (stats->spill_numa_fallback >= 0 && stats->spill_numa_fallback <= 2) {
            if (stats->spill_numa_node >= 0)
                snprintf(where, sizeof where, "on NUMA node %lld (%s)", (long long)stats->spill_numa_node,
                         how[stats->spill_numa_fallback]);
            else
                snprintf(where, sizeof where, "on %s", how[stats->spill_numa_fallback]);
            strbuf_printf(&o, "|   %-72s|\n", where);
        }
    }
    stats_rule(&o, '=');
    if (len)
        *len = o.len;
}
