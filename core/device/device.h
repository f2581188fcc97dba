/*
 * The state of one device allocator (struct dev_alloc: a few shared fields and the named
 * sub-states of core/device/state.h, each written by its own module) and what every core module shares
 * about it: block structs, the segment list, the device's memory accounting, the capture state, the
 * configuration copy, and the free that returns a block to its pool (split/merge and its
 * statistics). It sits below every policy module (check, capreuse, pools, ipc, observe,
 * expandable, events, release, sleep, trim, idle, snapshot), which call it and never alloc.c;
 * alloc.c (malloc, free, empty_cache) sits above them all.
 *
 * Locking: every field of struct dev_alloc is guarded by `lock` (base/lock.h) unless marked
 * otherwise, and every function here needs it held (each asserts it) unless it says it takes it.
 * The lock is released only around user callbacks (free-memory callbacks, OOM observers),
 * history's stack capture and, with release_lock_on_cudamalloc, around cuMemAlloc; code that drops
 * it re-reads any state it uses.
 */
#ifndef XSEG_CORE_DEVICE_H
#define XSEG_CORE_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "base/arena.h"
#include "base/lock.h"
#include "core/index/bins.h"
#include "core/index/block.h"
#include "core/process/config.h"
#include "core/process/history.h"
#include "core/process/procstate.h" /* ALLOC_MAX_DEVICES */
#include "core/index/ptrmap.h"
#include "core/process/settings.h"
#include "core/device/state.h"
#include "core/index/stats.h"
#include "vmm/driver.h"
#include "vmm/segment.h"

struct dev_alloc;
/* The allocator of @p device if it was created, else NULL: how a module below runtime.c (which
 * owns the device table and hands this down) reaches every device without calling up. */
typedef struct dev_alloc *(*dev_peek_fn)(int device);

struct pool_sleep; /* core/services/sleep.c */

struct dev_alloc {
    struct lock lock;
    int device;
    struct drv_device_info info; /* read-only after creation */

    /* Configuration in force on this device: a copy of the global one, refreshed at the start
     * of each operation when the global generation moved (one relaxed load on the fast path). */
    struct cfg cfg;
    unsigned cfg_gen;
    bool roundup_any;    /* some roundup_power2_divisions bucket is > 1 */
    bool use_expandable; /* cfg.expandable_segments && the device supports VMM */
    /* registry.c: a released registration's pages were mapped again, reg_after is due (read
     * after every malloc through the device lock: one load here, benchmarks/callgrind_round_robin.sh) */
    _Atomic bool reg_due;
    /* register_blocks_above_mb in bytes, SIZE_MAX when off (dev_refresh_cfg_slow): the one
     * compare a malloc pays for it (core/alloc.c, malloc_register). */
    _Atomic size_t reg_above;

    struct bpool small, large;
    uint64_t idle_tick_ns; /* idle reclaim (core/services/trim.c): time of the last tick, CLOCK_MONOTONIC */
    struct ptrmap live;      /* allocated blocks by address (and the blocks of busy slots) */
    struct segrec *segs;     /* every segment, both kinds */
    /* A lower bound on what a free block must measure to give memory back: the least classic
     * segment size (only a whole segment is freed) or expandable granule (only whole granules are
     * unmapped) among the segments made so far; 0 before the first. dev_seglist_add lowers it and
     * nothing raises it, so it bounds every live segment (dev_check). release_cached_blocks and
     * trim look at the free blocks from this size up (bpool_collect_free_from), never the smaller
     * holes, which cannot hold anything to give back. */
    size_t release_floor;
    struct exp_state exp;    /* the expandable segments' order, spare handles, pressure (expandable.c) */
    struct block *spare;     /* recycled block structs (linked through next) */
    struct block *slab_next; /* block structs not yet handed out (dev_block_carve) */
    size_t slab_left, slab_made; /* left in the current slab; made in all slabs so far */
    struct arena structs;    /* where the slabs come from (dev_block_carve) */
    void *heap_slabs;        /* slabs calloc'd where the arena had none, linked through their first struct */

    struct acct acct; /* statistics, pending blocks, peaks, reserved bytes, memory fraction */

    struct ev_state ev; /* record_stream's events and deferred frees (events.c; ev_waiting) */
    /* graph_capture_record_stream_reuse: markers of deferred blocks, graph walks (capreuse.c) */
    struct capreuse cr;

    struct cap_state cap; /* streams seen capturing (device.c: dev_capture_note; cap_underway) */

    int peers[ALLOC_MAX_DEVICES]; /* devices given access to new expandable segments */
    int npeers;

    struct pool_state priv; /* private pools and allocate-to-pool routes (pools.c) */

    /* History (core/process/history.h): the stack of the recorded malloc in progress, for the segment
     * events it causes (best effort: a malloc that drops the lock may see another's). */
    struct hstack *hist_cur;

    struct sleep_state sleep; /* sleep and wake (sleep.c) */
    struct tag_state tags;    /* the pools' tags for xseg_sleep_tags (sleeptags.c) */

    /* The fast path's permit and stream slots (core/device/fast.h). */
    struct dev_fast fast;

    struct life_state life; /* the lifetime predictor of large expandable requests (placement.c, L1) */

    struct quar_state quar; /* debug_stale_access: freed blocks held and checked (quarantine.c) */
    struct spill_state spill; /* live pages moved to host memory (core/services/spill.c) */
};

/* A private pool of one device (PyTorch's PrivatePool): its own small and large block pools, so
 * its blocks are never reused by the default pools or other private pools, and theirs never by
 * it. Statistics count its blocks in the same counters as the default pools (PyTorch does). */
struct priv_pool {
    xseg_pool_id id;
    struct bpool small, large;
    int use_count;          /* begins (captures, graphs) not yet released */
    struct priv_pool *next; /* device's list */
    struct pool_sleep *sleep; /* core/services/sleep.c: NULL while awake; a sleeping pool is never reaped */
    /* The owner's allocator (xseg_pool_retain_owned), or all NULL: xseg's own memory. An owned
     * pool grows classic segments through owner.alloc only, and they go through owner.free only
     * (core/policy/classic.c, release.c); fixed for the pool's life. */
    xseg_pool_allocator owner;
};

/* One allocate-to-pool in progress: allocations on streams it matches go to its pool. */
struct pool_route {
    struct priv_pool *pool;
    xseg_stream_filter filter; /* NULL: every stream (unless by_capture) */
    void *user;
    bool by_capture;           /* xseg_capture_begin: streams of capture `capture_id` */
    CUstream capture_stream;
    unsigned long long capture_id; /* 0 until cuStreamBeginCapture returned */
};

/* Do record_stream's events or frees deferred to a capture's end wait (events.c's state, read)? */
static inline bool ev_waiting(const struct dev_alloc *d)
{
    return d->ev.pending_events || d->ev.ndeferred;
}

/* Is a capture taken to be underway without asking the driver: a stream was seen capturing (the
 * capture state, device.c) or an allocate-to-pool route is in force (pools.c)? While it is, no
 * event is queried and nothing is released. dev_capture_underway re-checks the streams. */
static inline bool cap_underway(const struct dev_alloc *d)
{
    return d->cap.ncapturing || d->priv.nroutes;
}

/* The private pool that owns @p p, or NULL for the default pools. */
static inline struct priv_pool *dev_pool_owner(const struct dev_alloc *d, const struct bpool *p)
{
    if (p == &d->small || p == &d->large)
        return NULL;
    return (struct priv_pool *)(void *)((char *)(uintptr_t)p -
                                        (p->is_small ? offsetof(struct priv_pool, small)
                                                     : offsetof(struct priv_pool, large)));
}

/* The owner's allocator of @p p, or NULL when its segments are xseg's own (growth and release
 * only: never the malloc/free path). */
static inline const xseg_pool_allocator *dev_pool_allocator(const struct dev_alloc *d, const struct bpool *p)
{
    if (!p->is_private)
        return NULL;
    const struct priv_pool *pp = dev_pool_owner(d, p);
    return pp->owner.alloc ? &pp->owner : NULL;
}

/* The pool of block @p b, from its pool bits: the device's own two without reading the segment
 * record, a private pool's through it (block_pool). */
static inline struct bpool *dev_block_pool(struct dev_alloc *d, const struct block *b)
{
    if (XSEG_UNLIKELY(b->private_pool))
        return block_pool(b);
    return b->small_pool ? &d->small : &d->large;
}

/* Does every search tick the GC clock (garbage_collection_threshold with a memory fraction set)? */
static inline bool dev_gc_on(const struct dev_alloc *d)
{
    return d->acct.set_fraction && d->cfg.garbage_collection_threshold > 0.0;
}

/* The bytes of a device's state: runtime.c keeps them in pages (base/pages.h) of its own. */
#define DEV_HOME_BYTES sizeof(struct dev_alloc)
/* Build the allocator of @p device, queried as @p info (drv_device_query), in @p home: zeroed,
 * DEV_HOME_BYTES, aligned for struct dev_alloc. Cannot fail: it allocates nothing. */
struct dev_alloc *dev_create(int device, const struct drv_device_info *info, void *home);
/* Give back what an emptied device still holds (no segment, no live block; the modules above
 * gave back their sub-states' arrays): its capture list, segment index, pointer map, block
 * structs (slabs and arena). @p d's own memory is the caller's (runtime.c discards its pages). */
void dev_destroy(struct dev_alloc *d);

/* Copy the global configuration again (its generation moved; the caller tested it). */
void dev_refresh_cfg_slow(struct dev_alloc *d);
/* The memory fraction in force: the config key's, or xseg_set_memory_fraction's. */
void dev_apply_fraction(struct dev_alloc *d, double fraction);

/* Device memory accounting: the policy modules (expandable, sleep) report what they mapped and
 * unmapped through these instead of writing total_allocated_memory and the statistics. */
/* @p bytes of @p pool newly mapped, in @p pages driver allocations (chunks) (reserved_bytes, num_device_alloc). */
void dev_count_mapped(struct dev_alloc *d, const struct bpool *pool, size_t bytes, size_t pages);
/* @p bytes of @p pool unmapped, in @p pages driver pages (reserved_bytes, num_device_free). */
void dev_count_unmapped(struct dev_alloc *d, const struct bpool *pool, size_t bytes, size_t pages);
/* Spill's statistics (core/services/spill.c): @p bytes of live pages went to host memory (@p dir
 * 1: num_spills counts a chunk), came back (-1: num_promotions), or were dropped with their
 * block's free (0); spill_copied_bytes counts the copies. */
void dev_count_spill(struct dev_alloc *d, size_t bytes, int dir);
/* Spill decided where its host memory goes: the stats spill_numa_node (@p node) and
 * spill_numa_fallback (@p rule: 0 own node, 1 location HOST, 2 node 0; both -1 until then). */
void dev_note_spill_place(struct dev_alloc *d, int node, int rule);
/* Would reserving @p more bytes stay within the memory fraction and a budget in force (always,
 * when none is set)? */
bool dev_fraction_allows(const struct dev_alloc *d, size_t more);
/* One synchronization of every stream with pending events (num_sync_all_streams). */
void dev_count_sync_all(struct dev_alloc *d);

/* The device's segment list (d->segs, newest first): the one insert and remove. */
void dev_seglist_add(struct dev_alloc *d, struct segrec *s);
void dev_seglist_remove(struct dev_alloc *d, struct segrec *s);

/* A block struct: a recycled one (zeroed) or a new one; NULL on host OOM. */
struct block *dev_block_new(struct dev_alloc *d);
/* A new (zeroed) block struct from the slabs, never a recycled one; NULL on host OOM. */
struct block *dev_block_carve(struct dev_alloc *d);
/* A struct for a split: a spare one as dev_block_delete left it (in no index, no side struct, not
 * zeroed: the caller writes every field a split needs), else a new one; NULL on host OOM. */
static inline struct block *dev_block_spare(struct dev_alloc *d)
{
    struct block *a = d->spare;
    if (XSEG_LIKELY(a))
        d->spare = a->next;
    else
        a = dev_block_carve(d);
    return a;
}
/* @p b must be in no index and have no pending events; its side struct (if any) is released
 * here, so a spare struct has `sided` clear. The split on the fast path relies on this to reuse a
 * spare struct without clearing it. Inline: the free path's merge calls it. */
static inline void dev_block_delete(struct dev_alloc *d, struct block *b)
{
    lock_assert_held(&d->lock);
    if (XSEG_UNLIKELY(b->sided))
        block_side_free(b);
    b->next = d->spare;
    d->spare = b;
}

/* Is @p stream capturing (cuStreamIsCapturing in the device's context)? *@p st: the driver's
 * failure, if any (then false). */
bool dev_stream_capturing(struct dev_alloc *d, CUstream stream, xseg_status *st);
/* Remember that @p stream was seen capturing (a rare condition: malloc re-checks it). */
void dev_capture_note(struct dev_alloc *d, CUstream stream);
/* Is a capture underway that the allocator knows of: a pool records (xseg_capture_begin,
 * xseg_begin_allocate_to_pool, the PyTorch hooks), or a stream was seen capturing (a malloc on it
 * missed the cache)? Re-checks only the streams seen capturing, dropping finished ones: O(1) in
 * the number of streams. As in PyTorch, a capture must be announced for the allocator to keep
 * its memory mapped. */
bool dev_capture_underway(struct dev_alloc *d);

/* The counters of a block that stops being active (every path of the free). `active` and
 * `active_bytes` are folded from allocation and pending (see dev_alloc.acct.pending). */
static inline void dev_account_inactive(struct dev_alloc *d, int si, size_t requested)
{
    lock_assert_held(&d->lock);
    stat_down_pool(d->acct.stats.requested_bytes, si, (int64_t)requested);
}

/* Freed block @p b becomes pending (@p sign 1: ev_insert) or stops being pending (-1: its events
 * are done, or a capture let it be reused; dev_free_block follows). */
static inline void dev_pending_add(struct dev_alloc *d, const struct block *b, int64_t sign)
{
    lock_assert_held(&d->lock);
    int si = block_pool(b)->stat_index;
    int64_t bytes = sign * (int64_t)b->size;
    d->acct.pending[si] += sign;
    d->acct.pending[XSEG_STAT_ALL] += sign;
    d->acct.pending_bytes[si] += bytes;
    d->acct.pending_bytes[XSEG_STAT_ALL] += bytes;
    xseg_assert(d->acct.pending[si] >= 0 && d->acct.pending_bytes[si] >= 0);
}

/* A malloc made while blocks are pending: active_peak follows active (see dev_alloc.acct.pending). */
void dev_track_active_peak(struct dev_alloc *d);
/* @p out, a copy of the statistics with the slots' debts added (core/device/fast.h, dev_stats_copy):
 * the `active` rows folded and the "all" entries filled (stats_fill_all). */
void dev_stats_fold(const struct dev_alloc *d, xseg_device_stats *out);
/* Every peak to its current (reset_peak_memory_stats). */
void dev_stats_reset_peaks(struct dev_alloc *d);

#endif
