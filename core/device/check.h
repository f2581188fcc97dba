/*
 * dev_check: the invariants of one device's state, checked by a walk over everything (the
 * expensive level of base/assert.h, debug_level=2). What it checks is what the comments of
 * core/index/block.h, core/index/bins.h, core/index/ptrmap.h, core/policy/expandable.c and core/index/stats.h promise:
 *   - segment list: prev/next links agree;
 *   - blocks tile each segment: first has no prev, neighbours link both ways, each starts where
 *     the previous ends, last is the final block, sizes add up to the segment's size; every block
 *     names its segment, pool and stream; classic blocks are mapped, expandable ones flagged;
 *   - no two neighbours both free (in the free index), nor (expandable) both unmapped;
 *   - index membership: a free mapped block with no events and no recorded streams is in its
 *     pool's free index, an unmapped one in the unmapped index, nothing allocated is in either;
 *     each treap is ordered and heap-ordered and holds only its pool's blocks; the free index's
 *     bins: each (pool, stream) once, in stream order, found by the hash, one reference per
 *     segment, every block in the bin its size says, bitmap bits set iff bins are non-empty,
 *     block counts per stream and per pool (nfree);
 *   - expandable pages: unmapped blocks start and end on page boundaries, the first and last
 *     page of every block are mapped exactly when the block is, and the segment's mapped bytes
 *     (vmm) equal the mapped blocks' bytes;
 *   - the live map holds exactly the allocated blocks;
 *   - statistics agree with a recount: allocation, active, requested, allocated/active/reserved
 *     bytes, segment, inactive_split(_bytes) per pool, oversize counters, and the bytes reserved
 *     from the driver.
 * A failure aborts with the condition (a bug in xseg).
 *
 * dev_unlock (below) runs it at the end of every locked operation, so it runs after each split,
 * merge, map, unmap and release; at debug levels below 2 it compiles to nothing. dev_unlock lives
 * here, above device.h, so that no include points up: a module that gives the lock back includes
 * this header.
 */
#ifndef XSEG_CORE_CHECK_H
#define XSEG_CORE_CHECK_H

#include "base/assert.h"
#include "core/device/fast.h"

#if XSEG_CHECK_EXPENSIVE
/* Walk @p d's state and abort on the first broken invariant. Device lock held. */
void dev_check(struct dev_alloc *d);
#define dev_check_expensive(d) dev_check(d)
#else
#define dev_check_expensive(d) ((void)0)
#endif

/* Give the device lock back at the end of an operation (or before a callback): the state must
 * be whole here, and at debug_level=2 dev_check walks it first. */
static inline void dev_unlock(struct dev_alloc *d)
{
    dev_check_expensive(d);
    lock_release(&d->lock);
}

#endif
