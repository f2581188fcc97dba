/*
 * Expandable segments beneath the block pools (expandable.c), over vmm/segment.h: holes,
 * growth, chunks, reclaim. Device lock held.
 */
#ifndef XSEG_CORE_EXPANDABLE_H
#define XSEG_CORE_EXPANDABLE_H

#include "core/device/device.h"

/* Find or make room for @p size bytes (a rounded request) in an expandable segment of
 * (@p pool, @p stream), map what is missing, and return the free block at its start (removed
 * from the free index). XSEG_ERROR_OUT_OF_MEMORY when the fraction limit or the device is
 * exhausted; XSEG_ERROR_DRIVER on another driver failure. Bookkeeping stays consistent. */
xseg_status exp_allocate(struct dev_alloc *d, struct bpool *pool, CUstream stream, size_t size,
                         struct block **out);
/*
 * The OOM path's last step (expandable_segments_defrag): re-back partly used chunks of the
 * device's expandable segments with one-granule chunks (seg_refine), keeping the granules that
 * hold a byte of a block not free for reuse and giving the others back, the chunks with the most
 * free granules first, until at least @p need bytes came back or none is left. Live blocks keep
 * their addresses and bytes. Only the default large pool; skips segments that sleep or whose
 * handles were handed out. Lock
 * held, no capture underway, the cache already released (release_cached_blocks). A chunk whose
 * re-backing fails stays as it was. *@p more: another round after a failed retry may give more
 * (this one re-backed a page holding live bytes, and such pages are left). @return the bytes
 * given back.
 */
size_t exp_defragment(struct dev_alloc *d, size_t need, bool *more);
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
/* Spill (core/services/spill.h): unmap the host chunks inside free block @p b (in the free index;
 * its freed block's streams were waited for) and re-tile it as exp_unmap_pages does, so that no
 * free byte on host memory stays in the free index. @p dropped receives the bytes. With @p strand
 * (a capture is underway: no unmap) they are stranded instead, unmapped by the next reclaim. */
xseg_status exp_drop_host(struct dev_alloc *d, struct block *b, bool strand, size_t *dropped);
/*
 * Under pressure, memory given back goes straight to the growth that needed it (pytorch#166116):
 * between exp_recycle_begin and exp_recycle_end, the chunks exp_unmap_pages unmaps (known idle,
 * of a segment whose handles were never handed out) keep their handles in d->exp.handles, and
 * exp_allocate maps them again where it needs a chunk of their size, on any stream and in any
 * pool: one cuMemUnmap + cuMemMap instead of cuMemUnmap + cuMemRelease + cuMemCreate + cuMemMap.
 * exp_recycle_end releases what the growth did not take, so the driver gets it back as before.
 * Both with the lock held, in the same lock hold.
 */
void exp_recycle_begin(struct dev_alloc *d);
/* A new memory fraction: the refusals seen were against the old limit, so growth maps whole pages
 * again until the next one (exp_recycle_begin makes chunks small from there on). Lock held. */
void exp_pressure_reset(struct dev_alloc *d);
void exp_recycle_end(struct dev_alloc *d);
bool exp_block_older(const struct block *a, const struct block *b);

#endif
