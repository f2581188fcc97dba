/*
 * The device allocator: one per device, one lock each (src/lock.h). PyTorch's DeviceCachingAllocator
 * semantics (rounding, best fit per stream, split/merge, deferred frees, OOM path, statistics)
 * over classic cuMemAlloc segments and expandable VMM segments (vmm/segment.h).
 *
 * Locking: every field of struct dev_alloc is guarded by `lock` unless marked otherwise. The lock
 * is released only around user callbacks (free-memory callbacks, OOM observers) and, with
 * release_lock_on_cudamalloc, around cuMemAlloc; code that drops it re-reads any state it uses.
 */
#ifndef XSEG_CORE_ALLOC_H
#define XSEG_CORE_ALLOC_H

#include <stdbool.h>
#include <stddef.h>

#include "core/block.h"
#include "core/capreuse.h"
#include "core/config.h"
#include "core/history.h"
#include "core/idle.h"
#include "base/lock.h"
#include "core/check.h"
#include "vmm/driver.h"

#define ALLOC_MAX_DEVICES 64

struct pool_sleep; /* core/sleep.c */

/* A per-stream FIFO of (event, block) pairs recorded by frees of record_stream'ed blocks. */
struct ev_item {
    CUevent event;
    struct block *block;
};
struct ev_queue {
    CUstream stream;
    struct ev_item *items;
    size_t head, count, cap; /* ring buffer */
};

struct dev_alloc {
    struct lock lock;
    int device;
    struct drv_device_info info; /* read-only after creation */

    /* Configuration in force on this device: a copy of the global one, refreshed at the start
     * of each operation when the global generation moved (one relaxed load on the fast path). */
    struct cfg cfg;
    unsigned cfg_gen;
    /* The fast path's permit: equal to cfg_gen while none of the rare conditions it skips holds
     * (streams seen capturing, routes, pending events, deferred frees, roundup divisions), else
     * 0 (no generation is 0). alloc_malloc compares it with the global generation: one test for
     * all of them. Every place that starts a rare condition calls alloc_fast_off; malloc_general
     * grants it again once they are all over (alloc_fast_update). */
    unsigned fast_gen;
    bool roundup_any;    /* some roundup_power2_divisions bucket is > 1 */
    bool use_expandable; /* cfg.expandable_segments && the device supports VMM */

    struct bpool small, large;
    uint64_t idle_tick_ns; /* idle reclaim (core/trim.c): time of the last tick, CLOCK_MONOTONIC */
    struct ptrmap live;      /* allocated blocks by address */
    struct segrec *segs;     /* every segment, both kinds */
    uint64_t seg_seq;        /* expandable segments created so far (segrec.seq) */
    /* Expandable segments ordered by (pool, stream, seq) (expandable.c): a growth finds the
     * segments of its (pool, stream) in O(log segments), whatever the number of streams. */
    struct segrec **by_stream;
    size_t nby_stream, capby_stream;
    struct block *spare;     /* recycled block structs (linked through next) */

    xseg_device_stats stats;
    /* The accumulated values (.allocated, .freed, the num_* counts) at the last
     * alloc_reset_accumulated, filled as a copy is: alloc_get_stats hands out stats minus these,
     * so the internal counters keep freed == allocated - current. */
    xseg_device_stats acc_base;
    size_t total_allocated_memory; /* bytes reserved from the driver (mapped or cuMemAlloc'd) */
    size_t allowed_memory_maximum;
    bool set_fraction;
    double fraction;

    /* Deferred frees (events.c). */
    struct ev_queue *evq;
    size_t nevq, capevq;
    size_t pending_events;    /* events in all queues: the fast path polls only when > 0 */
    CUevent *event_pool;
    size_t nevent_pool, capevent_pool;
    struct block **deferred;  /* freed during a capture: events recorded once it ends */
    size_t ndeferred, capdeferred;
    /* graph_capture_record_stream_reuse: markers of deferred blocks, graph walks (capreuse.c) */
    struct capreuse cr;

    /* Streams seen capturing. While non-empty every malloc re-checks them (and its own stream):
     * this is how the allocator "knows a capture might be underway" without a driver call on
     * the fast path otherwise. */
    CUstream *capturing;
    size_t ncapturing, capcapturing;

    int peers[ALLOC_MAX_DEVICES]; /* devices given access to new expandable segments */
    int npeers;

    /* Private pools (pools.c) and the allocate-to-pool routes in force, oldest first (PyTorch's
     * graph_pools and captures_underway). While nroutes > 0 a capture is taken to be underway:
     * no event is queried, frees with recorded streams are deferred, nothing is released. */
    struct priv_pool *pools;
    struct pool_route *routes;
    size_t nroutes, caproutes;

    /* History (core/history.h): the stack of the recorded malloc in progress, for the segment
     * events it causes (best effort: a malloc that drops the lock may see another's). */
    struct hstack *hist_cur;

    /* Sleep and wake (core/sleep.c): the default pools' sleep (NULL: awake), how many pools sleep
     * (a rare condition: malloc takes the general path while > 0), and the device's counts. */
    struct pool_sleep *sleep_default;
    unsigned nasleep;
    int64_t num_sleeps, num_wakes;
};

/* A private pool of one device (PyTorch's PrivatePool): its own small and large block pools, so
 * its blocks are never reused by the default pools or other private pools, and theirs never by
 * it. Statistics count its blocks in the same counters as the default pools (PyTorch does). */
struct priv_pool {
    xseg_pool_id id;
    struct bpool small, large;
    int use_count;          /* begins (captures, graphs) not yet released */
    struct priv_pool *next; /* device's list */
    struct pool_sleep *sleep; /* core/sleep.c: NULL while awake; a sleeping pool is never reaped */
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

/* The private pool that owns @p p, or NULL for the default pools. */
static inline struct priv_pool *alloc_pool_owner(const struct dev_alloc *d, const struct bpool *p)
{
    if (p == &d->small || p == &d->large)
        return NULL;
    return (struct priv_pool *)(void *)((char *)(uintptr_t)p -
                                        (p->is_small ? offsetof(struct priv_pool, small)
                                                     : offsetof(struct priv_pool, large)));
}

/* Give the device lock back at the end of an operation (or before a callback): the state must
 * be whole here, and at debug_level=2 dev_check walks it first (core/check.h). */
static inline void alloc_unlock(struct dev_alloc *d)
{
    dev_check_expensive(d);
    lock_release(&d->lock);
}

/* A rare condition begins (see fast_gen): malloc takes the general path until it is over. */
static inline void alloc_fast_off(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    d->fast_gen = 0;
}

/* Grant the fast path again when no rare condition holds (config current). */
static inline void alloc_fast_update(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    /* Idle reclaim ticks in malloc_prepare unless its thread does (core/idle.c); a sleeping pool
     * refuses allocations there (core/sleep.c). */
    bool rare = d->ncapturing || d->nroutes || d->pending_events || d->ndeferred || d->roundup_any ||
                hist_mode() || (d->cfg.idle_release_ms && !(d->cfg.idle_release_thread && idle_thread_running())) ||
                d->nasleep;
    d->fast_gen = rare ? 0 : d->cfg_gen;
}

/* Create the allocator of @p device (drv loaded; device index validated by drv_device_query). */
xseg_status alloc_create(int device, struct dev_alloc **out);

xseg_status alloc_malloc(struct dev_alloc *d, size_t size, CUstream stream, void **out);
/* Free @p ptr if this device owns it: *owned = false (and nothing happens) when it does not. */
xseg_status alloc_free(struct dev_alloc *d, void *ptr, bool *owned);
/* alloc_free for the only device: a pointer it does not own is alloc_free_unknown's error. One
 * call with no out-parameter, for xseg_free's common case. */
xseg_status alloc_free_sole(struct dev_alloc *d, void *ptr);
/* The error of xseg_free for a pointer no device owns (XSEG_ERROR_INVALID_VALUE naming it). */
xseg_status alloc_free_unknown(void *ptr);
xseg_status alloc_record_stream(struct dev_alloc *d, void *ptr, CUstream stream, bool *owned);
xseg_status alloc_empty_cache(struct dev_alloc *d);
/* Take the device lock with the configuration in force refreshed (policies outside alloc.c). */
void alloc_lock(struct dev_alloc *d);
xseg_status alloc_set_fraction(struct dev_alloc *d, double fraction);
void alloc_get_stats(struct dev_alloc *d, xseg_device_stats *out);
void alloc_reset_peaks(struct dev_alloc *d);
/* Accumulated statistics start again from 0 (see acc_base). */
void alloc_reset_accumulated(struct dev_alloc *d);
/* xseg_cache_info: a 0 in *largest becomes the driver's free memory, then *largest is raised to
 * the device's largest free mapped block (every pool) if that is larger. */
xseg_status alloc_cache_info(struct dev_alloc *d, size_t *largest);
/* The classic segment holding the live block at @p ptr: *owned = false when this device does not
 * own @p ptr (nothing else is set); XSEG_ERROR_NOT_SUPPORTED for a block of an expandable segment. */
xseg_status alloc_base_allocation(struct dev_alloc *d, void *ptr, void **base, size_t *size, bool *owned);
xseg_status alloc_enable_peer(struct dev_alloc *d, int peer);
/* Segments gathered for a snapshot, across devices. With with_stacks, stacks[i] is a malloc'd
 * array of segment i's blocks' allocation stacks (NULL: none), each referenced. */
struct snap_acc {
    xseg_segment_info *segs;
    struct hstack ***stacks;
    size_t n, cap, cap_stacks; /* capacities of segs and stacks */
    bool with_stacks;
};
/* Append this device's segments to @p a (lock taken here). */
xseg_status alloc_snapshot(struct dev_alloc *d, struct snap_acc *a);
/* Free what @p a holds (blocks, stack references) and zero it. */
void snap_acc_free(struct snap_acc *a);
/* History starts (lock taken here): every live block gets its free recorded, and malloc leaves
 * the fast path (alloc_fast_update keeps it off while recording). */
void alloc_history_start(struct dev_alloc *d);
/* Total bytes of active (allocated or pending) blocks, for the `snapshot` event. */
size_t alloc_active_bytes(struct dev_alloc *d);

/* ---- shared between alloc.c, events.c and expandable.c (each asserts the device lock held) - */

/* Device memory accounting: alloc owns total_allocated_memory and the statistics; the other
 * modules report what they did through these. */
/* @p bytes of @p pool newly mapped, in @p pages driver allocations (chunks) (reserved_bytes, num_device_alloc). */
void alloc_count_mapped(struct dev_alloc *d, const struct bpool *pool, size_t bytes, size_t pages);
/* @p bytes of @p pool unmapped, in @p pages driver pages (reserved_bytes, num_device_free). */
void alloc_count_unmapped(struct dev_alloc *d, const struct bpool *pool, size_t bytes, size_t pages);
/* Would reserving @p more bytes stay within the memory fraction (always, when none is set)? */
bool alloc_fraction_allows(const struct dev_alloc *d, size_t more);
/* One synchronization of every stream with pending events (num_sync_all_streams). */
void alloc_count_sync_all(struct dev_alloc *d);

/* The device's segment list (d->segs, newest first): the one insert and remove. */
void alloc_seglist_add(struct dev_alloc *d, struct segrec *s);
void alloc_seglist_remove(struct dev_alloc *d, struct segrec *s);

struct block *alloc_block_new(struct dev_alloc *d);
void alloc_block_delete(struct dev_alloc *d, struct block *b);
/* Return a block whose events are done to its pool: merge, index, statistics. */
void alloc_free_block(struct dev_alloc *d, struct block *b);
/* Is a capture underway that the allocator knows of: a pool records (xseg_capture_begin,
 * xseg_begin_allocate_to_pool, the PyTorch hooks), or a stream was seen capturing (a malloc on it
 * missed the cache)? Re-checks only the streams seen capturing, dropping finished ones: O(1) in
 * the number of streams. As in PyTorch, a capture must be announced for the allocator to keep
 * its memory mapped. */
bool alloc_capture_underway(struct dev_alloc *d);
/* Absorb @p src (a neighbour of @p dst) into dst when both are free and equally mapped. dst must
 * not be in an index; src is removed from its index and deleted. Returns bytes absorbed. */
size_t alloc_try_merge(struct dev_alloc *d, struct block *dst, struct block *src);

/* cuMemFree-or-unmap every releasable free block of @p pool (PyTorch's release_blocks). */
xseg_status alloc_release_blocks(struct dev_alloc *d, struct bpool *pool);
/* cuMemFree an unsplit free classic block (in the free index) and its segment (services). */
xseg_status alloc_release_classic(struct dev_alloc *d, struct block *b);

/* pools.c */
/* The public pool operations (api/pools.c checks the arguments first). Each takes the device lock
 * itself; the capture pair makes its driver calls with the lock released. */
xseg_status pools_begin(struct dev_alloc *d, xseg_pool_id pool, xseg_stream_filter filter, void *user);
xseg_status pools_end(struct dev_alloc *d, xseg_pool_id pool);
xseg_status pools_release(struct dev_alloc *d, xseg_pool_id pool);
int pools_use_count(struct dev_alloc *d, xseg_pool_id pool);
/* The private pool @p id of @p d, or NULL (lock held). */
struct priv_pool *pools_find(struct dev_alloc *d, xseg_pool_id id);
/* Add a use to @p pool, creating it (no route). */
xseg_status pools_retain(struct dev_alloc *d, xseg_pool_id pool);
/* Route @p id's pool to the capture of @p stream, then begin it in @p capture_mode. */
xseg_status pools_capture_begin(struct dev_alloc *d, CUstream stream, xseg_pool_id id, int capture_mode);
xseg_status pools_capture_end(struct dev_alloc *d, CUstream stream, CUgraph *graph);
/* The private pool for an allocation on @p stream: the newest route that matches it (PyTorch's
 * get_pool checks captures_underway in LIFO order), or NULL for the default pools. Fails only
 * when the driver cannot tell a stream's capture. */
xseg_status pools_select(struct dev_alloc *d, CUstream stream, struct priv_pool **out);
/* Release the cached blocks of every pool with no users (no capture underway). */
xseg_status pools_release_freeable(struct dev_alloc *d);
/* Free the structs of pools with no users and no segments left. */
void pools_reap(struct dev_alloc *d);
/* Bytes cached free in private pools (the OOM message's "allocated in private pools"). */
size_t pools_cached_bytes(struct dev_alloc *d);

/* events.c */
xseg_status ev_insert(struct dev_alloc *d, struct block *b);
void ev_process(struct dev_alloc *d);
void ev_synchronize_all(struct dev_alloc *d);
void ev_destroy(struct dev_alloc *d);
/* Empty deferred-list @p slot, which holds @p b (reused during a capture, core/capreuse.c): b is
 * then the caller's to return to its pool, and no event is ever recorded for it. */
void ev_deferred_reuse(struct dev_alloc *d, size_t slot, struct block *b);

/* expandable.c */
/* Find or make room for @p size bytes (a rounded request) in an expandable segment of
 * (@p pool, @p stream), map what is missing, and return the free block at its start (removed
 * from the free index). XSEG_ERROR_OUT_OF_MEMORY when the fraction limit or the device is
 * exhausted; XSEG_ERROR_DRIVER on another driver failure. Bookkeeping stays consistent. */
xseg_status exp_allocate(struct dev_alloc *d, struct bpool *pool, CUstream stream, size_t size,
                         struct block **out);
/* Destroy expandable segments left with nothing mapped. */
void exp_release_empty_segments(struct dev_alloc *d);
/* Give back what earlier driver failures left with the driver: every segment's stranded pages
 * (seg_reclaim), then the process-wide leftovers (seg_leftovers_retry). Lock held, no capture
 * underway. @return the first failure (what failed stays for the next reclaim). */
xseg_status exp_reclaim_leftovers(struct dev_alloc *d);
/* Give back whole chunks inside free block @p b (in the free index): the highest ones, as few as
 * cover @p max_bytes (SIZE_MAX: all); the block is re-tiled by what the driver unmapped. With
 * @p idle the caller knows the stream's work has completed (it waited or queried): no
 * synchronize here. exp_whole_page_bytes: the bytes of whole chunks inside a free expandable
 * block (what giving it back can release); exp_block_older: the stable age order of expandable
 * blocks (older segment, then lower offset). */
xseg_status exp_unmap_pages(struct dev_alloc *d, struct block *b, size_t max_bytes, bool idle);
size_t exp_whole_page_bytes(const struct block *b);
bool exp_block_older(const struct block *a, const struct block *b);

#endif
