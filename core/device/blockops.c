/*
 * Split and merge (see blockops.h): the merge on free (the general case out of line; the common
 * one, dev_free_block_inline, in the header), history's events of a block (alloc, free requested,
 * free completed), a free block's split into free pieces, and the finders' out-of-line parts.
 */
#include "core/device/blockops.h"

#include <stdint.h>

#include "base/assert.h"
#include "core/device/placement.h"
#include "core/process/history.h"

/* ---- merge / free ------------------------------------------------------------------------ */

/* Insert a free block into its pool's free index (resetting its GC clock). */
static inline void pool_insert_free(struct bpool *pool, struct block *b)
{
    block_set_gc_base(b, pool->get_free_blocks_call_count);
    bpool_insert_free(pool, b);
}

size_t dev_try_merge(struct dev_alloc *d, struct block *dst, struct block *src)
{
    lock_assert_held(&d->lock);
    if (!src || src->allocated || block_event_count(src) > 0 || block_uses_n(src) || dst->mapped != src->mapped)
        return 0;
    bpool_unindex(src);
    if (dst->prev == src)
        dst->addr = src->addr;
    block_splice_out(src->seg, src->prev, src->next);
    size_t sub = src->size;
    dst->size += sub;
    dev_block_delete(d, src);
    return sub;
}

/* dev_free_block_inline when b has no free neighbour or two: merge through dev_try_merge, re-index. Out
 * of line so that the common case keeps few registers live. */
__attribute__((noinline)) void dev_free_block_general(struct dev_alloc *d, struct block *b)
{
    lock_assert_held(&d->lock);
    struct bpool *pool = dev_block_pool(d, b);
    xseg_assert(!b->sided); /* callers drop the side first (block_side_drop) */
    size_t requested = b->u.requested_size;
    int64_t net_blocks = 0, net_bytes = 0;
    struct block *cands[2] = {b->prev, b->next};
    for (int i = 0; i < 2; i++) {
        size_t sub = dev_try_merge(d, b, cands[i]);
        if (sub) {
            net_blocks -= 1;
            net_bytes -= (int64_t)sub;
        }
    }
    pool_insert_free(pool, b);
    if (block_is_split(b)) {
        net_blocks += 1;
        net_bytes += (int64_t)b->size;
    }
    /* inactive_split leaves expandable blocks out: their free pages can always be released. */
    if (!b->expandable) {
        if (net_blocks)
            stat_add_pool(d->acct.stats.inactive_split, pool->stat_index, net_blocks);
        if (net_bytes)
            stat_add_pool(d->acct.stats.inactive_split_bytes, pool->stat_index, net_bytes);
    }
    dev_account_inactive(d, pool->stat_index, requested);
}

__attribute__((noinline)) bool hist_on_alloc(struct dev_alloc *d, struct block *b, struct hist_mctx *h)
{
    lock_assert_held(&d->lock);
    unsigned mode = hist_mode();
    struct block_side *sd = NULL;
    if ((mode & HIST_STATE) && h->stack && !(sd = block_side_get(b)))
        return false;
    if (d->hist_cur == h->stack)
        d->hist_cur = NULL;
    h->cur_cleared = true;
    if (!mode)
        return true; /* stopped meanwhile */
    b->recorded = true;
    struct hstack *kept = hist_on_malloc(d->device, b->addr, block_requested(b), (uintptr_t)b->stream, &h->stack, mode);
    if (sd)
        sd->hist_stack = kept;
    else
        xseg_assert(!kept);
    return true;
}

__attribute__((noinline)) void hist_free_requested(struct dev_alloc *d, struct block *b)
{
    lock_assert_held(&d->lock);
    bool completed = !block_uses_n(b) && !block_event_count(b); /* quarantined: completed when it leaves */
    struct block_side *sd = block_side(b);
    hist_on_free(d->device, b->addr, block_requested(b), (uintptr_t)b->stream, sd ? sd->hist_stack : NULL, true,
                 completed);
    if (completed) {
        if (sd)
            sd->hist_stack = NULL;
        b->recorded = false;
    }
}

/* The free of a recorded block is complete (its memory may be reused): the event, and the block
 * lets its stack go. */
static void hist_free_completed(struct dev_alloc *d, struct block *b)
{
    lock_assert_held(&d->lock);
    struct block_side *sd = block_side(b);
    hist_on_free(d->device, b->addr, block_requested(b), (uintptr_t)b->stream, sd ? sd->hist_stack : NULL, false,
                 true);
    if (sd)
        sd->hist_stack = NULL;
    b->recorded = false;
}

/* The deferred free of a block whose events are done (events.c), or the undo of a malloc. */
void dev_free_block(struct dev_alloc *d, struct block *b)
{
    lock_assert_held(&d->lock);
    if (XSEG_UNLIKELY(b->recorded))
        hist_free_completed(d, b);
    block_side_drop(b); /* nothing left in it: no streams, events or stack */
    xseg_assert(!b->sided);
    if (XSEG_UNLIKELY(b->sided))
        block_side_free(b); /* release builds: the word must hold the requested size below */
    dev_free_block_inline(d, b);
}

void bops_split_free(struct bpool *pool, struct block *b, struct block *x, size_t n, bool front)
{
    x->size = n;
    x->stream = b->stream;
    block_same_seg(x, b);
    x->mapped = true;
    x->allocated = false;
    if (front) {
        x->addr = b->addr;
        block_link_before(b, x);
        b->addr += n;
    } else {
        x->addr = b->addr + b->size - n;
        block_link_after(b, x);
    }
    b->size -= n;
    block_set_gc_base(x, pool->get_free_blocks_call_count);
    bpool_insert_free(pool, x);
}

/* ---- the cache's best fit ---------------------------------------------------------------- */

__attribute__((noinline)) struct block *bops_find_expandable_fit(struct dev_alloc *d, const struct bops_want *w,
                                                                 struct block *b)
{
    lock_assert_held(&d->lock);
    struct bpool *pool = w->pool;
    CUstream stream = w->stream;
    if (d->use_expandable) {
        /* For best fit, an expandable block counts with the unmapped space after it. */
        struct block *n = bpool_next_free(pool, b);
        while (b->expandable && n && n->stream == stream && bops_expandable_size(n) < bops_expandable_size(b)) {
            b = n;
            n = bpool_next_free(pool, b);
        }
    } else {
        /* Expandable segments turned off: honour it by using classic blocks only. */
        do {
            b = bpool_next_free(pool, b);
        } while (b && b->expandable && b->stream == stream);
        if (!b || b->stream != stream)
            return NULL;
    }
    return b;
}

struct block *bops_take_free(struct dev_alloc *d, struct bpool *pool, CUstream stream, size_t size, bool top)
{
    lock_assert_held(&d->lock);
    struct block *pred;
    bool pred_ok;
    struct block *b = XSEG_UNLIKELY(top) ? bops_find_top(d, pool, stream, size)
                                         : bops_find_free(d, &(struct bops_want){pool, stream, size}, &pred, &pred_ok);
    if (b)
        bpool_remove_free(pool, b);
    return b;
}

/* ---- the placement's finders ------------------------------------------------------------- */

struct top_walk {
    const struct dev_alloc *d;
    size_t size;
    struct block *best;
    unsigned cls;
};

static void top_visit(void *ctx, struct block *b)
{
    struct top_walk *w = ctx;
    xseg_assert(BOPS_FITS(w->d, w->size, b->size));
    if (place_top_higher(b, w->best))
        w->best = b;
}

struct block *bops_find_top(struct dev_alloc *d, struct bpool *pool, CUstream stream, size_t size)
{
    lock_assert_held(&d->lock);
    struct sbins *s = bpool_bins(pool, stream);
    if (!s)
        return NULL;
    struct top_walk w = {d, size, NULL, 0};
    bins_walk(s, size, bops_fit_end(d, size), PLACE_TOP_WALK_MAX, top_visit, &w);
    return w.best;
}

static void class_visit(void *ctx, struct block *b)
{
    struct top_walk *w = ctx;
    xseg_assert(BOPS_FITS(w->d, w->size, b->size));
    if (place_block_ok(b, w->cls) && place_class_better(b, w->best))
        w->best = b;
}

struct block *bops_walk_class(struct dev_alloc *d, struct bpool *pool, CUstream stream, size_t size, unsigned cls)
{
    lock_assert_held(&d->lock);
    struct top_walk w = {d, size, NULL, cls};
    bins_walk(bpool_bins(pool, stream), size, bops_fit_end(d, size), PLACE_TOP_WALK_MAX, class_visit, &w);
    return w.best;
}

/* ---- malloc_at's finder ------------------------------------------------------------------ */

struct block *bops_find_at(struct dev_alloc *d, const struct bpool *small, const struct bpool *large, uintptr_t addr)
{
    lock_assert_held(&d->lock);
    for (struct segrec *s = d->segs; s; s = s->next_seg)
        if (s->pool == small || s->pool == large)
            for (struct block *x = s->first; x; x = x->next)
                if (x->addr <= addr && addr < x->addr + x->size)
                    return x;
    return NULL;
}
