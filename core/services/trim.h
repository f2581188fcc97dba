/*
 * Giving cached memory back for long-running services: xseg_trim, the
 * release_threshold_mb policy and idle reclaim share one pass, trim_cache.
 *
 * "Cached" is reserved minus allocated bytes (PyTorch's "reserved but unallocated"): free blocks,
 * blocks waiting for record_stream events, and the free parts of pages shared with live blocks.
 * Only the first kind can be given back: whole pages inside free expandable blocks (unmapped,
 * address space kept) and unsplit free classic segments (cuMemFree).
 *
 * Locking: every function here runs under the device lock.
 */
#ifndef XSEG_CORE_TRIM_H
#define XSEG_CORE_TRIM_H

#include "core/device/device.h"

/* How trim_cache may wait for the GPU before it unmaps a page. */
enum trim_wait {
    /* Wait, once per stream, for the stream of each run it gives back (xseg_trim, like
     * empty_cache). */
    TRIM_SYNC,
    /* Never wait: a free run is given back only when its last use is known complete (memo_idle:
     * a default stream's cuStreamQuery, xseg's event for a program's stream), so seg_unmap's
     * synchronize returns at once. Used by
     * the policies that run inside other calls: release_threshold_mb and idle reclaim. */
    TRIM_KNOWN_COMPLETE,
    /* Under pressure (a growth the driver or the fraction limit refused): runs of streams known
     * idle first; then the rest, waiting once per stream. */
    TRIM_PRESSURE,
};

/* Reserved minus allocated bytes of @p d (every pool). */
size_t trim_cached_bytes(const struct dev_alloc *d);

/*
 * Give cached memory back until at most @p keep bytes of cache remain, or nothing more can go:
 * largest free runs first, ties to the older segment (then the lower offset), classic segments
 * before expandable runs of the same size. Only the pages needed are unmapped (the highest ones
 * of a run). Private pools that no graph uses any more count; pools in use keep their cache.
 * Releases nothing while a capture is underway. @p released (optional) receives the bytes given
 * back. A driver failure stops the pass with correct bookkeeping and is returned.
 * With @p idle_only, only runs that have been idle for idle_release_ms are candidates (their
 * GC clock stamp is below their pool's idle_mark, see trim_idle_tick).
 */
xseg_status trim_cache(struct dev_alloc *d, size_t keep, enum trim_wait wait, bool idle_only,
                       size_t *released);

/* Under pressure: give back at least @p need bytes of cache (TRIM_PRESSURE), or as much as can
 * go. @p released receives the bytes given back. */
xseg_status trim_pressure(struct dev_alloc *d, size_t need, size_t *released);

/* xseg_trim on one device: takes the lock, returns completed record_stream frees to their pools,
 * then trim_cache(keep, TRIM_SYNC). */
xseg_status trim_device(struct dev_alloc *d, size_t keep, size_t *released);

/* The release_threshold_mb policy: when it is set and the cache exceeds it, trim_cache down to it
 * without waiting (TRIM_KNOWN_COMPLETE). Called where xseg has just learnt that work completed.
 * @p handing_out: bytes of a block found but not yet counted allocated (the malloc in progress).
 * With idle_release_ms set it does nothing: the threshold is then the floor the idle tick gives
 * idle runs back down to (trim_idle_tick), and a run freed within the window stays cached, as the
 * service line promises ("keep 2 GiB, give the rest back 5 s after its last use": a burst a second
 * later maps nothing). */
void trim_threshold(struct dev_alloc *d, size_t handing_out);

/*
 * Idle reclaim (idle_release_ms): at most every idle_release_ms / 4, note the time and each pool's
 * GC clock (get_free_blocks_call_count, then advanced by one), so a free block whose clock stamp
 * (gc_count_base, set whenever it enters the free index) is below the clock noted at a tick
 * idle_release_ms ago has not been used since; then give back such runs whose stream is known
 * idle (trim_cache(keep, TRIM_KNOWN_COMPLETE, idle_only), keep: release_threshold_mb when set, so
 * that much cache stays for the next burst; else 0). Called by malloc's general path (the fast
 * path is off while idle_release_ms is set) and by xseg_trim's neighbours; a no-op when off.
 */
void trim_idle_tick(struct dev_alloc *d);

#endif
