/*
 * The device state (see device.h): creation, the configuration copy, block structs, the segment
 * list, memory accounting, the capture state (split and merge: blockops.c).
 */
#include "core/device/device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/assert.h"
#include "base/error.h"
#include "base/hostmem.h"
#include "base/vec.h"
#include "core/process/settings.h"
#include "vmm/capture.h"
#include "vmm/segment.h"

/* ---- creation and configuration --------------------------------------------------------- */

void dev_apply_fraction(struct dev_alloc *d, double fraction)
{
    lock_assert_held(&d->lock);
    d->acct.fraction = fraction;
    if (fraction < 1.0) {
        d->acct.set_fraction = true;
        d->acct.allowed_memory_maximum = (size_t)(fraction * (double)d->info.total_mem);
    } else {
        d->acct.set_fraction = false;
        d->acct.allowed_memory_maximum = d->info.total_mem;
    }
}

/* Device lock held (dev_create holds it too, before @p d is published). */
/* A free records xseg's event on its stream only while a policy that never waits is set
 * (core/policy/release.h release_note_on): frees made while neither was set recorded nothing
 * (their blocks' stamps are above every earlier record: uncovered), so when one is set again the
 * next free on each stream records. */
static bool note_on(const struct cfg *c)
{
    return c->idle_release_ms || c->release_threshold != SIZE_MAX;
}

static void pool_rearm_all(struct bpool *p)
{
    for (unsigned i = 0; i < p->nstreams; i++)
        p->by_stream[i]->rearm = true;
}

void dev_refresh_cfg_slow(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    double old_fraction = d->cfg.per_process_memory_fraction;
    bool first = d->cfg_gen == 0, noted = note_on(&d->cfg);
    settings_copy(&d->cfg, &d->cfg_gen);
    if (!noted && note_on(&d->cfg)) {
        pool_rearm_all(&d->small);
        pool_rearm_all(&d->large);
        for (struct priv_pool *pp = d->priv.pools; pp; pp = pp->next) {
            pool_rearm_all(&pp->small);
            pool_rearm_all(&pp->large);
        }
    }
    d->roundup_any = false;
    for (int i = 0; i < CFG_ROUNDUP_BUCKETS; i++)
        if (d->cfg.roundup_power2_divisions[i] > 1)
            d->roundup_any = true;
    d->use_expandable = d->cfg.expandable_segments && d->info.vmm_supported;
    atomic_store_explicit(&d->reg_above, d->cfg.register_blocks_above ? d->cfg.register_blocks_above : SIZE_MAX,
                          memory_order_relaxed);
    /* The config key sets the fraction when it changes; xseg_set_memory_fraction overrides it
     * until the key changes again. */
    if (first || d->cfg.per_process_memory_fraction != old_fraction)
        dev_apply_fraction(d, d->cfg.per_process_memory_fraction);
    d->acct.stats.max_split_size =
        d->cfg.max_split_size == SIZE_MAX ? INT64_MAX : (int64_t)d->cfg.max_split_size;
}

struct dev_alloc *dev_create(int device, const struct drv_device_info *info, void *home)
{
    struct dev_alloc *d = home; /* zeroed: a fresh pages_map, or one dev_destroy discarded */
    d->info = *info;
    lock_init(&d->lock);
    for (int i = 0; i < DEV_SLOTS; i++)
        spin_init(&d->fast.slots[i].lock);
    for (int k = 0; k < DEV_OWN_SLOTS; k++)
        for (int j = 0; j < FRONT_LANES; j++)
            spin_init(&d->fast.fronts[k].lane[j].lock);
    d->device = device;
    d->small.is_small = true;
    d->small.stat_index = XSEG_STAT_SMALL_POOL;
    d->large.stat_index = XSEG_STAT_LARGE_POOL;
    d->structs = (struct arena)ARENA_INIT;
    d->acct.stats.spill_numa_node = d->acct.stats.spill_numa_fallback = -1; /* no spill yet */
    lock_acquire(&d->lock); /* no other thread can see d yet; the lock keeps the helpers' contract */
    dev_refresh_cfg_slow(d);
    lock_release(&d->lock); /* not dev_unlock (core/device/check.h, above): a new device has nothing to walk */
    if (d->cfg.expandable_segments && !d->info.vmm_supported)
        log_warn("device %d does not support virtual memory management; using classic segments", device);
    return d;
}

void dev_destroy(struct dev_alloc *d)
{
    xseg_assert(!d->segs && !d->live.count);
    xs_free(d->cap.capturing);
    xs_free(d->exp.by_stream);
    xs_free(d->spill.tab); /* core/services/spill.c's records (empty: every block went) */
    xs_free(d->spill.order);
    ptrmap_destroy(&d->live);
    for (void *s = d->heap_slabs, *next; s; s = next) {
        next = *(void **)s;
        xs_free(s);
    }
    arena_release(&d->structs);
}

/* ---- block structs and the segment list ------------------------------------------------ */

struct block *dev_block_new(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    struct block *b = d->spare;
    if (b) {
        d->spare = b->next;
        memset(b, 0, sizeof *b);
        return b;
    }
    return dev_block_carve(d);
}

/* Carved from slabs (a block struct is never given back to libc, only to the spare list): no
 * allocator header a struct, and neighbours in time are neighbours in memory. A new slab holds
 * 1/32 of the structs made so far (64 to 4096). Slabs come from the device's arena (base/arena.h),
 * where only the pages touched are resident and, from ~420,000 structs (32 MiB of 80-byte structs:
 * a 2 MiB page is 1/16 of them), every struct lies on a 2 MiB huge page (a free's block is then a
 * cache miss without a TLB miss); from calloc where the arena cannot reserve address space, with
 * the unused tail of the last slab within 1/32 of the structs in use. */
__attribute__((noinline)) struct block *dev_block_carve(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    if (d->slab_left == 0) {
        size_t n = d->slab_made / 32;
        n = n < 64 ? 64 : n > 4096 ? 4096 : n;
        struct block *slab = arena_take(&d->structs, n * sizeof *slab);
        if (!slab) {
            /* From the heap: its first struct links it into heap_slabs, for dev_destroy. */
            if (!(slab = xs_calloc(n, sizeof *slab)))
                return NULL;
            ptrmap_admit(&d->live, slab, slab + n); /* the live map's fingerprints need room */
            *(void **)slab = d->heap_slabs;
            d->heap_slabs = slab++;
            n--;
        } else {
            ptrmap_admit(&d->live, slab, slab + n);
        }
        d->slab_next = slab;
        d->slab_left = n;
        d->slab_made += n;
    }
    d->slab_left--;
    return d->slab_next++; /* zeroed by the arena or calloc */
}

void dev_seglist_add(struct dev_alloc *d, struct segrec *s)
{
    lock_assert_held(&d->lock);
    size_t unit = s->vseg ? seg_gran(s->vseg) : s->size; /* the least a release gives back */
    if (!d->release_floor || unit < d->release_floor)
        d->release_floor = unit;
    s->prev_seg = NULL;
    s->next_seg = d->segs;
    if (d->segs)
        d->segs->prev_seg = s;
    d->segs = s;
}

void dev_seglist_remove(struct dev_alloc *d, struct segrec *s)
{
    lock_assert_held(&d->lock);
    if (s->prev_seg)
        s->prev_seg->next_seg = s->next_seg;
    else
        d->segs = s->next_seg;
    if (s->next_seg)
        s->next_seg->prev_seg = s->prev_seg;
}

/* ---- accounting for the other modules ------------------------------------------------- */

void dev_count_mapped(struct dev_alloc *d, const struct bpool *pool, size_t bytes, size_t pages)
{
    lock_assert_held(&d->lock);
    d->acct.total_allocated_memory += bytes;
    stat_add_pool(d->acct.stats.reserved_bytes, pool->stat_index, (int64_t)bytes);
    d->acct.stats.num_device_alloc += (int64_t)pages;
}

void dev_count_unmapped(struct dev_alloc *d, const struct bpool *pool, size_t bytes, size_t pages)
{
    lock_assert_held(&d->lock);
    xseg_assert(bytes <= d->acct.total_allocated_memory);
    d->acct.total_allocated_memory -= bytes;
    stat_add_pool(d->acct.stats.reserved_bytes, pool->stat_index, -(int64_t)bytes);
    d->acct.stats.num_device_free += (int64_t)pages;
}

void dev_note_spill_place(struct dev_alloc *d, int node, int rule)
{
    lock_assert_held(&d->lock);
    d->acct.stats.spill_numa_node = node;
    d->acct.stats.spill_numa_fallback = rule;
}

void dev_count_spill(struct dev_alloc *d, size_t bytes, int dir)
{
    lock_assert_held(&d->lock);
    xseg_stat_counter *c = &d->acct.stats.spilled_bytes;
    if (dir)
        d->acct.stats.spill_copied_bytes += (int64_t)bytes;
    if (dir > 0) {
        stat_up(c, (int64_t)bytes);
        d->acct.stats.num_spills++;
    } else {
        xseg_assert((int64_t)bytes <= c->current);
        stat_down(c, (int64_t)bytes);
        if (dir < 0)
            d->acct.stats.num_promotions++;
    }
}

bool dev_fraction_allows(const struct dev_alloc *d, size_t more)
{
    lock_assert_held(&d->lock);
    size_t after = d->acct.total_allocated_memory + more;
    return (!d->acct.set_fraction || after <= d->acct.allowed_memory_maximum) &&
           (!d->acct.set_budget || after <= d->acct.budget_limit);
}

void dev_count_sync_all(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    d->acct.stats.num_sync_all_streams++;
}

/* ---- capture ----------------------------------------------------------------------------- */

bool dev_stream_capturing(struct dev_alloc *d, CUstream stream, xseg_status *st)
{
    lock_assert_held(&d->lock);
    bool capturing = false;
    if ((*st = drv_ctx_ensure(d->info.primary_ctx)) == XSEG_SUCCESS)
        *st = vmm_stream_capturing(stream, d->device, &capturing);
    return capturing;
}

void dev_capture_note(struct dev_alloc *d, CUstream stream)
{
    lock_assert_held(&d->lock);
    for (size_t i = 0; i < d->cap.ncapturing; i++)
        if (d->cap.capturing[i] == stream)
            return;
    if (!VEC_RESERVE(d->cap.capturing, d->cap.capcapturing, d->cap.ncapturing + 1))
        return; /* only a hint; the slow path re-checks anyway */
    d->cap.capturing[d->cap.ncapturing++] = stream;
}

bool dev_capture_underway(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    xseg_status st;
    bool any = false;
    if (d->priv.nroutes)
        return true; /* a pool records: take a capture to be underway without asking the driver */
    for (size_t i = 0; i < d->cap.ncapturing;) {
        if (dev_stream_capturing(d, d->cap.capturing[i], &st)) {
            any = true;
            i++;
        } else {
            d->cap.capturing[i] = d->cap.capturing[--d->cap.ncapturing];
        }
    }
    return any;
}

/* active's current per pool and for all (allocation + pending; see dev_alloc.acct.pending). */
static void active_current(const struct dev_alloc *d, const xseg_device_stats *st, int64_t cur[XSEG_STAT_POOLS],
                           int64_t bytes[XSEG_STAT_POOLS])
{
    lock_assert_held(&d->lock);
    const xseg_stat_counter *n = st->allocation, *b = st->allocated_bytes;
    cur[XSEG_STAT_ALL] = stats_all_current(n) + d->acct.pending[XSEG_STAT_ALL];
    bytes[XSEG_STAT_ALL] = stats_all_current(b) + d->acct.pending_bytes[XSEG_STAT_ALL];
    for (int i = XSEG_STAT_SMALL_POOL; i <= XSEG_STAT_LARGE_POOL; i++) {
        cur[i] = n[i].current + d->acct.pending[i];
        bytes[i] = b[i].current + d->acct.pending_bytes[i];
    }
}

void dev_track_active_peak(struct dev_alloc *d)
{
    int64_t cur[XSEG_STAT_POOLS], bytes[XSEG_STAT_POOLS];
    active_current(d, &d->acct.stats, cur, bytes);
    /* Every entry, the other pool's too: each value is one active has now, so a peak may take it. */
    for (int i = 0; i < XSEG_STAT_POOLS; i++) {
        if (cur[i] > d->acct.active_peak[i])
            d->acct.active_peak[i] = cur[i];
        if (bytes[i] > d->acct.active_bytes_peak[i])
            d->acct.active_bytes_peak[i] = bytes[i];
    }
}

void dev_stats_fold(const struct dev_alloc *d, xseg_device_stats *out)
{
    lock_assert_held(&d->lock);
    int64_t cur[XSEG_STAT_POOLS], bytes[XSEG_STAT_POOLS];
    active_current(d, out, cur, bytes);
    const xseg_stat_counter *n = out->allocation, *b = out->allocated_bytes;
    for (int i = XSEG_STAT_SMALL_POOL; i <= XSEG_STAT_LARGE_POOL; i++) {
        out->active[i].current = cur[i];
        out->active[i].allocated = n[i].allocated;
        out->active_bytes[i].current = bytes[i];
        out->active_bytes[i].allocated = b[i].allocated;
    }
    for (int i = 0; i < XSEG_STAT_POOLS; i++) {
        out->active[i].peak = d->acct.active_peak[i] > n[i].peak ? d->acct.active_peak[i] : n[i].peak;
        out->active_bytes[i].peak = d->acct.active_bytes_peak[i] > b[i].peak ? d->acct.active_bytes_peak[i] : b[i].peak;
    }
    stats_fill_all(out); /* the "all" currents and allocated, every freed */
}

void dev_stats_reset_peaks(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    stats_fill_all(&d->acct.stats);
    stats_reset_peaks(&d->acct.stats);
    active_current(d, &d->acct.stats, d->acct.active_peak, d->acct.active_bytes_peak);
}

