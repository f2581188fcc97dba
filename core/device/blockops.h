/*
 * Split and merge of blocks, and the rules that decide them (PyTorch's get_free_block fit rule and
 * should_split; the merge on free), and the finders beside the rule: the cache's best fit
 * (bops_find_free, bops_take_free) and the placement's (bops_find_top, bops_find_class: one
 * bounded walk of the free index, index/bins.h's bins_walk, with placement.h's predicates). Every
 * finder (these and the stream slots' fast_fits in core/device/fast.c) asks BOPS_FITS or its bound
 * form bops_fit_end, every split asks should_split: a policy change is made here once. Also
 * malloc_at's finder (bops_find_at) and history's events of a block (hist_on_alloc,
 * hist_free_requested; dev_free_block completes a recorded free).
 */
#ifndef XSEG_CORE_DEVICE_BLOCKOPS_H
#define XSEG_CORE_DEVICE_BLOCKOPS_H

#include <stdbool.h>
#include <stddef.h>

#include "core/device/device.h"
#include "core/device/placement.h"

/* PyTorch's max_split_size rules: may a request of @p size rounded bytes take a free block of
 * @p bsize bytes (bsize >= size)? Below max_split_size, only a block below it too (an oversize
 * block is never split for a small request); from max_split_size on, only a block less than
 * max_non_split_rounding larger (no large waste). A macro for the finders' conditions: as an
 * inline function its bool result cost the device-lock pair 5-8 instructions
 * (benchmarks/callgrind_round_robin.sh). Each argument is evaluated once or twice: pass plain
 * values. */
#define BOPS_FITS(d, size, bsize)                                                                  \
    (!((size) < (d)->cfg.max_split_size && (bsize) >= (d)->cfg.max_split_size) &&                  \
     !((size) >= (d)->cfg.max_split_size && (bsize) >= (size) + (d)->cfg.max_non_split_rounding))

/* BOPS_FITS as a bound, for a walk of the index in size order: a request of @p size takes a free
 * block of bsize bytes, size <= bsize, exactly when bsize < bops_fit_end(d, size). */
static inline size_t bops_fit_end(const struct dev_alloc *d, size_t size)
{
    if (size < d->cfg.max_split_size)
        return d->cfg.max_split_size;
    size_t r = d->cfg.max_non_split_rounding;
    return size > SIZE_MAX - r ? SIZE_MAX : size + r;
}

/* A free block as best fit counts it in expandable mode: its size and the unmapped space after it
 * (PyTorch's expandable_size). */
static inline size_t bops_expandable_size(const struct block *b)
{
    return b->size + (b->next && !b->next->mapped ? b->next->size : 0);
}

/* A request as the cache's best fit reads it: rounded @p size in (@p pool, @p stream). Passed by
 * address, so the out-of-line walk below reads it from memory and the search inlined in
 * malloc_locked keeps its registers (as scalars, gcc spilled the pool pointer there: up to 0.6
 * more instructions a device-lock pair in debugoptimized, benchmarks/callgrind_round_robin.sh). */
struct bops_want {
    struct bpool *pool;
    CUstream stream;
    size_t size;
};

/* bops_find_free's search past an expandable first fit @p b for @p w: the index successors on
 * the stream while each counts less with its unmapped tail (PyTorch's walk, in index order and
 * stopping at the first that does not: its answer depends on that order, so it is not a bins_walk,
 * which visits a size range depth first); with expandable segments off, the first classic block on
 * the stream. NULL when none fits. Out of line: the rare case of the cache's search. */
struct block *bops_find_expandable_fit(struct dev_alloc *d, const struct bops_want *w, struct block *b);

/* PyTorch's get_free_block: best fit for @p w, with the max_split_size rules (BOPS_FITS). The
 * block found stays in the free index; *pred is its index predecessor (NULL: none), or *pred_ok is
 * false when the search moved past the first fit and the predecessor is unknown. Always inline:
 * the cached pair's search (core/alloc.c's malloc_cached). */
static inline __attribute__((always_inline)) struct block *bops_find_free(struct dev_alloc *d, const struct bops_want *w,
                                                                          struct block **pred, bool *pred_ok)
{
    lock_assert_held(&d->lock);
    struct bpool *pool = w->pool;
    CUstream stream = w->stream;
    size_t size = w->size;
    if (XSEG_UNLIKELY(dev_gc_on(d)))
        pool->get_free_blocks_call_count++;
    struct block *next;
    struct block *b = bpool_fit(pool, stream, size, pred, &next);
    *pred_ok = true;
    if (!b || b->stream != stream)
        return NULL;
    /* An expandable first fit stays the choice unless the next block of the stream counts less
     * with its unmapped tail (bops_find_expandable_fit goes on from there). The next block is at
     * least b's size, so only a b with an unmapped tail can lose to it: only then is it looked up
     * (bpool_fit gives it inside the fit's bin; past the bin's end, the next bin's first: only one
     * on the stream counts). */
    if (b->expandable && (!d->use_expandable || (b->next && !b->next->mapped &&
                                                 (next || (next = bpool_fit_next_bin(pool, b)) != NULL) &&
                                                 next->stream == stream &&
                                                 bops_expandable_size(next) < bops_expandable_size(b)))) {
        struct block *first = b;
        b = bops_find_expandable_fit(d, w, b);
        if (!b)
            return NULL;
        *pred_ok = b == first;
    }
    if (!BOPS_FITS(d, size, b->size))
        return NULL;
    return b;
}

/* The placement of a request predicted long-lived (core/device/placement.h, L2): among the free
 * blocks of (@p pool, @p stream) that fit @p size, the highest (place_top_higher), looking at the
 * PLACE_TOP_WALK_MAX smallest that fit at most (bins_walk). NULL when none fits. The block stays
 * in the free index. */
struct block *bops_find_top(struct dev_alloc *d, struct bpool *pool, CUstream stream, size_t size);

/* The placement by class (core/device/placement.h, S1) of @p size in (@p pool, @p stream), of class
 * @p cls: the best fit among the free blocks of its class's segments, NULL when none fits: the
 * index's best fit when it is of the class (*pred its index predecessor, as bops_find_free's),
 * else the best (place_class_better) of a walk as bops_find_top's (*pred_ok false). The block
 * stays in the free index. */
struct block *bops_walk_class(struct dev_alloc *d, struct bpool *pool, CUstream stream, size_t size, unsigned cls);
static inline struct block *bops_find_class(struct dev_alloc *d, struct bpool *pool, CUstream stream, size_t size,
                                            unsigned cls, struct block **pred, bool *pred_ok)
{
    lock_assert_held(&d->lock);
    struct block *next, *best = bpool_fit(pool, stream, size, pred, &next);
    *pred_ok = true;
    if (!best || (BOPS_FITS(d, size, best->size) && place_block_ok(best, cls)))
        return best;
    *pred_ok = false; /* the walk's (bops_walk_class, out of line: the index's fit is the common case) */
    return bops_walk_class(d, pool, stream, size, cls);
}

/* The cache's answer for the slow path (PyTorch's get_free_block): bops_find_top when @p top (a
 * request predicted long-lived), else bops_find_free; the block found is taken out of the free
 * index. NULL when none fits. */
struct block *bops_take_free(struct dev_alloc *d, struct bpool *pool, CUstream stream, size_t size, bool top);

/* malloc_at's finder: the block of a segment of pool @p small or @p large (a private pool's two)
 * whose range holds @p addr, free or not; NULL when none does. A walk of every segment and block:
 * for xseg_pool_malloc_at, never on the malloc path. */
struct block *bops_find_at(struct dev_alloc *d, const struct bpool *small, const struct bpool *large, uintptr_t addr);

/* PyTorch's should_split: is the rest of free block @p b after a request of @p size bytes worth a
 * block of its own? */
static inline bool should_split(const struct dev_alloc *d, const struct block *b, size_t size)
{
    lock_assert_held(&d->lock);
    size_t remaining = b->size - size;
    if (b->small_pool || d->use_expandable) /* the pool's is_small, without reading the segment */
        return remaining >= BLOCK_MIN_SIZE;
    return size < d->cfg.max_split_size && remaining > BLOCK_SMALL_SIZE;
}

/* Split @p n bytes off the front (@p front) or back of free, unindexed @p b into a new free block
 * @p x, which enters the pool's free index. */
void bops_split_free(struct bpool *pool, struct block *b, struct block *x, size_t n, bool front);

/* Absorb @p src (a neighbour of @p dst) into dst when both are free and equally mapped. dst must
 * not be in an index; src is removed from its index and deleted. Returns bytes absorbed. */
size_t dev_try_merge(struct dev_alloc *d, struct block *dst, struct block *src);
/* Return a block whose events are done to its pool: merge, index, statistics (events.c,
 * capreuse.c, the undo of a malloc). */
void dev_free_block(struct dev_alloc *d, struct block *b);

/* A malloc that history records: the stack captured before the lock was taken. */
struct hist_mctx {
    struct hstack *stack; /* the capture's reference (NULL once a block took it) */
    bool cur_cleared;     /* d->hist_cur no longer points at it */
};

/* A recorded malloc succeeded (lock held): the event, and the block takes the capture's reference
 * to its stack (HIST_STATE), kept in its side struct. The device's hist_cur stops pointing at it.
 * False on host OOM for the side struct: nothing recorded, nothing changed (the caller undoes the
 * malloc). */
bool hist_on_alloc(struct dev_alloc *d, struct block *b, struct hist_mctx *h);

/* xseg_free of a recorded block (lock held): free_requested, and free_completed unless the free
 * waits for other streams (then dev_free_block completes it). */
void hist_free_requested(struct dev_alloc *d, struct block *b);

/* The free path's merge when @p b has no free neighbour or two (out of line). */
void dev_free_block_general(struct dev_alloc *d, struct block *b);

/* Does exactly one neighbour of @p b lie in the free index (in_index && mapped)? Such a
 * neighbour is free, mapped, with no events and no recorded streams: dev_try_merge's rule holds
 * for it (b is mapped). A mergeable neighbour outside every index does not exist while a free
 * runs, so this is "exactly one can merge": dev_free_block_inline's own case. */
static inline bool dev_free_merges_one(const struct block *b)
{
    return block_in_free_index(b->prev) != block_in_free_index(b->next);
}

/* The block that holds @p b's bytes once dev_free_block(_inline) returned it: its one free
 * neighbour absorbs it, else it absorbs its free neighbours (kept next to the rule below). */
static inline struct block *dev_free_block_keeper(struct block *b)
{
    if (!dev_free_merges_one(b))
        return b;
    return block_in_free_index(b->next) ? b->next : b->prev;
}

/* Return allocated (or just freed) block @p b to its pool: merge with its free neighbours, index,
 * statistics. Inline for the free path (alloc.c); the other modules call dev_free_block. */
static inline __attribute__((always_inline)) void dev_free_block_inline(struct dev_alloc *d, struct block *b)
{
    lock_assert_held(&d->lock);
    struct block *prev = b->prev, *next = b->next;
    if (XSEG_UNLIKELY(!dev_free_merges_one(b))) {
        dev_free_block_general(d, b);
        return;
    }
    bool fn = block_in_free_index(next);
    /* One free neighbour, in the free index: it absorbs b and stays where it is in the index
     * unless its larger key crosses its successor's (bpool_free_grow). Same result as the general
     * path (the merged block is the same range), with no treap remove/insert. */
    struct bpool *pool = dev_block_pool(d, b);
    int si = pool->stat_index;
    xseg_assert(!b->sided); /* callers drop the side first (block_side_drop) */
    size_t orig_size = b->size, requested = b->u.requested_size;
    struct block *keep = fn ? next : prev;
    size_t keep_size = keep->size;
    if (keep == next) {
        bpool_free_grow(pool, next, b->addr, next->size + b->size);
        block_splice_out(next->seg, prev, next); /* per branch: one of the two is known non-NULL */
    } else {
        bpool_free_grow(pool, prev, prev->addr, prev->size + b->size);
        block_splice_out(prev->seg, prev, next);
    }
    block_set_gc_base(keep, pool->get_free_blocks_call_count);
    dev_block_delete(d, b);
    /* dev_free_block_general's accounting with its signs known: keep was an inactive split block of
     * keep_size bytes; the merged one is split (same count, orig_size more bytes) unless it now
     * spans its whole segment. */
    if (!keep->expandable) {
        if (XSEG_LIKELY(block_is_split(keep))) {
            stat_up_pool(d->acct.stats.inactive_split_bytes, si, (int64_t)orig_size);
        } else {
            stat_down_pool(d->acct.stats.inactive_split, si, 1);
            stat_down_pool(d->acct.stats.inactive_split_bytes, si, (int64_t)keep_size);
        }
    }
    dev_account_inactive(d, si, requested);
}

#endif
