/*
 * Giving cached blocks back to the driver: PyTorch's release path (release_block, release_blocks,
 * release_cached_blocks, release_available_cached_blocks, garbage_collect_cached_blocks) for
 * malloc's OOM steps and empty_cache, and the stream memo that core/services/trim.c's passes share. Below
 * alloc.c and trim.c; above expandable, events and pools.
 *
 * Locking: every function here runs under the device lock.
 */
#ifndef XSEG_CORE_RELEASE_H
#define XSEG_CORE_RELEASE_H

#include "core/device/device.h"

/* The streams of one reclaim pass, each queried and waited for at most once. Zero-initialize;
 * free with memo_free. A cached block's stream is a default stream, or a program's stream that
 * may have been destroyed since the block's free (vmm/stream.h): such a stream is never asked
 * after the free; what the passes know of its blocks comes from xseg's own event, recorded on it
 * by the program's frees at most once per window (release_note_due, struct sbins), and waits for
 * the blocks no record covers wait for the whole context, once a pass. */
struct stream_memo {
    CUstream *s;
    signed char *state; /* -1 not asked, 0 busy, 1 idle (queried, or waited for) */
    size_t n, cap_s, cap_state;
    struct sbins **busy; /* bins whose event this pass found pending (asked once) */
    size_t nbusy, cap_busy;
    bool all_idle;      /* the context was waited for in this pass: every stream is idle */
};
/* Is the last use of free block @p b (in its pool's free index) known to have completed? A default
 * stream: one cuStreamQuery per stream and pass (any error counts as busy). A program's stream,
 * which is never asked: b's stamp is below its (pool, stream) bins' done_mark, or below rec_mark
 * and the event is seen complete now (queried in RELAXED capture mode, once a pass). Else known
 * only once the pass waited for the context. */
bool memo_idle(struct dev_alloc *d, struct stream_memo *m, const struct block *b);
/* A program's free on @p stream, alive (the free is its owner's promise), into @p pool: does it
 * record the bins' event? Only the first free on a stream, then the first after a pass saw the
 * last record complete at least a window (idle_release_ms) after it was made, or after a context
 * wait: at most one driver call per stream and window, none on the other frees. The frees
 * between two records stay uncovered (cached) until the later one. */
static inline bool release_note_due(const struct bpool *pool, CUstream stream)
{
    const struct sbins *sb = bpool_bins(pool, stream);
    return sb && (!sb->rec_ns || sb->rearm);
}
/* The due record (release_note_due), made after the free's block entered the index (or its
 * slot): the event recorded on @p stream (created on first use), the pool's clock advanced, so
 * that every block in the index now is covered and every later one is not. A driver failure, or
 * a capture underway, records nothing (tried again after a window). Only while a policy that
 * never waits is set (release_note_on). */
void release_note_record(struct dev_alloc *d, struct bpool *pool, CUstream stream);
static inline bool release_note_on(const struct dev_alloc *d)
{
    return d->cfg.idle_release_ms || d->cfg.release_threshold != SIZE_MAX;
}
/* A pass's look at every program stream's last record (the idle tick, the threshold pass; no
 * capture underway): one made at least a window ago and not yet seen complete is queried (RELAXED
 * mode); once seen complete, the next free on its stream records again. */
void release_note_poll(struct dev_alloc *d);
/* Wait for the work of free block @p b unless this pass already did or found it idle: a default
 * stream with vstream_wait; a program's stream by waiting for xseg's event when a record covers b
 * (RELAXED mode: never invalidates another thread's capture), else for the whole context (once a
 * pass; cuCtxSynchronize fails and invalidates any capture on the context, whatever its mode). */
xseg_status memo_wait(struct dev_alloc *d, struct stream_memo *m, const struct block *b);
void memo_free(struct stream_memo *m);

/* cuMemFree an unsplit free classic block (in the free index) and its segment (PyTorch's
 * release_block). */
xseg_status release_block(struct dev_alloc *d, struct block *b);

/* PyTorch's release_cached_blocks: the default pools, then the private pools nobody uses any
 * more; nothing while a capture is underway. Looks only at the free blocks of at least
 * d->release_floor (a whole classic segment, a whole granule): a heap of small holes costs nothing
 * per hole. Also retries what earlier driver failures left with
 * the driver (exp_reclaim_leftovers); its status goes to *@p left_st (NULL: ignored), so that the
 * OOM path's retry does not depend on it. */
xseg_status release_cached_blocks(struct dev_alloc *d, xseg_status *left_st);

/* PyTorch's release_available_cached_blocks for a request of @p size (rounded) on @p stream from
 * @p pool: with a max_split_size, free one oversize cached block that is large enough, else
 * several oversize blocks, largest first. True when enough was freed; false, freeing nothing,
 * while a capture is underway (dev_capture_underway). */
bool release_available_cached_blocks(struct dev_alloc *d, struct bpool *pool, CUstream stream, size_t size);

/* PyTorch's garbage_collect_cached_blocks: free aged unsplit classic blocks of the large pool
 * until the reserve is back under garbage_collection_threshold x the allowed memory. Frees nothing
 * while a capture is underway (dev_capture_underway): cuMemFree would invalidate it. */
void release_garbage_collect(struct dev_alloc *d);

#endif
