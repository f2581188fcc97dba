/*
 * Giving cached blocks back to the driver (see release.h): PyTorch's release_block,
 * release_blocks, release_cached_blocks, release_available_cached_blocks and
 * garbage_collect_cached_blocks, and the per-pass stream memo they share with core/services/trim.c.
 */
#include "core/policy/release.h"

#include <stdlib.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/hostmem.h"
#include "base/vec.h"
#include "core/policy/events.h"
#include "core/policy/expandable.h"
#include "core/policy/observe.h"
#include "core/policy/pools.h"
#include "vmm/classic.h"
#include "vmm/event.h"
#include "vmm/stream.h"

/* ---- the streams of one pass ------------------------------------------------------------- */

/* The memo's entry for @p s, added as unknown (-1) when new; NULL on host OOM. */
static signed char *memo_slot(struct stream_memo *m, CUstream s)
{
    for (size_t i = 0; i < m->n; i++)
        if (m->s[i] == s)
            return &m->state[i];
    if (!VEC_RESERVE(m->s, m->cap_s, m->n + 1) || !VEC_RESERVE(m->state, m->cap_state, m->n + 1))
        return NULL;
    m->s[m->n] = s;
    m->state[m->n] = -1;
    return &m->state[m->n++];
}

/* The window a record stays pending without a new one (0: a threshold pass may rearm at once). */
static uint64_t note_window_ns(const struct dev_alloc *d)
{
    return (uint64_t)d->cfg.idle_release_ms * 1000000ull;
}

/* @p sb's last record is known complete: its blocks are done; the next free records again once
 * the record is a window old (release_note_poll rearms it later otherwise). */
static void note_seen_done(struct dev_alloc *d, struct sbins *sb, uint64_t now)
{
    if (sb->done_mark < sb->rec_mark)
        sb->done_mark = sb->rec_mark;
    if (now - sb->rec_ns >= note_window_ns(d))
        sb->rearm = true;
}

static bool memo_busy(const struct stream_memo *m, const struct sbins *sb)
{
    for (size_t i = 0; i < m->nbusy; i++)
        if (m->busy[i] == sb)
            return true;
    return false;
}

bool memo_idle(struct dev_alloc *d, struct stream_memo *m, const struct block *b)
{
    lock_assert_held(&d->lock);
    if (m->all_idle)
        return true;
    CUstream s = b->stream;
    if (!vstream_default(s)) {
        /* Freed on a program's stream, which may be gone: its event, never the stream. */
        struct sbins *sb = bpool_bins(block_pool(b), s);
        if (!sb)
            return false;
        uint64_t t = block_gc_base(b);
        if (t < sb->done_mark)
            return true;
        if (t >= sb->rec_mark || !sb->free_ev || memo_busy(m, sb))
            return false; /* no record after its free yet, or pending in this pass */
        if (drv_ctx_ensure(d->info.primary_ctx) == XSEG_SUCCESS && vevent_done_relaxed(sb->free_ev)) {
            note_seen_done(d, sb, (uint64_t)clock_mono_ns());
            return true;
        }
        if (VEC_RESERVE(m->busy, m->cap_busy, m->nbusy + 1))
            m->busy[m->nbusy++] = sb;
        return false;
    }
    signed char *st = memo_slot(m, s);
    if (!st)
        return false;
    /* A query, never a wait: CUDA_SUCCESS means every work item queued so far has completed, so
     * the last use of any block freed before now is over. Any error counts as busy. */
    if (*st < 0)
        *st = drv_ctx_ensure(d->info.primary_ctx) == XSEG_SUCCESS && vstream_idle(s);
    return *st == 1;
}

void release_note_record(struct dev_alloc *d, struct bpool *pool, CUstream stream)
{
    lock_assert_held(&d->lock);
    struct sbins *sb = bpool_bins(pool, stream);
    if (!sb)
        return;
    sb->rearm = false;
    sb->rec_ns = (uint64_t)clock_mono_ns();
    /* A default stream is asked directly (it lives as long as the context): never recorded on.
     * During a capture a record on a capturing stream would be captured: none, retried later. */
    if (vstream_default(stream) || dev_capture_underway(d) || drv_ctx_ensure(d->info.primary_ctx) != XSEG_SUCCESS)
        return;
    if (!sb->free_ev && vevent_create(&sb->free_ev) != XSEG_SUCCESS) {
        sb->free_ev = NULL;
        return;
    }
    if (vevent_record(sb->free_ev, stream)) {
        /* Every block in the index now is stamped at or below the clock: covered; every later
         * one is stamped above it. */
        sb->rec_mark = ++pool->get_free_blocks_call_count;
    } else {
        sb->rec_mark = sb->done_mark; /* what the event holds now is unknown: nothing pending */
    }
}

static void pool_note_poll(struct dev_alloc *d, struct bpool *p, uint64_t now, bool *ctx_ok)
{
    uint64_t window = note_window_ns(d);
    for (unsigned i = 0; i < p->nstreams; i++) {
        struct sbins *sb = p->by_stream[i];
        if (sb->rearm || !sb->rec_ns || now - sb->rec_ns < window || vstream_default(sb->stream))
            continue;
        if (sb->done_mark >= sb->rec_mark || !sb->free_ev) {
            sb->rearm = true; /* seen complete earlier (or nothing recorded): due again */
            continue;
        }
        if (!*ctx_ok)
            *ctx_ok = drv_ctx_ensure(d->info.primary_ctx) == XSEG_SUCCESS;
        if (*ctx_ok && vevent_done_relaxed(sb->free_ev))
            note_seen_done(d, sb, now);
    }
}

void release_note_poll(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    if (dev_capture_underway(d))
        return; /* no event query during a capture (it comes after) */
    uint64_t now = (uint64_t)clock_mono_ns();
    bool ctx_ok = false;
    pool_note_poll(d, &d->small, now, &ctx_ok);
    pool_note_poll(d, &d->large, now, &ctx_ok);
    for (struct priv_pool *pp = d->priv.pools; pp; pp = pp->next) {
        pool_note_poll(d, &pp->small, now, &ctx_ok);
        pool_note_poll(d, &pp->large, now, &ctx_ok);
    }
}

/* Every stream's queued work is done (the pass waited for the context): every free block of the
 * device is known idle, its stream alive or not; the clock moves on so that what enters the
 * index later is not, and the next free on each stream records again. */
static void bins_all_done(struct bpool *p)
{
    uint64_t mark = ++p->get_free_blocks_call_count;
    for (unsigned i = 0; i < p->nstreams; i++) {
        p->by_stream[i]->done_mark = mark;
        p->by_stream[i]->rearm = true;
    }
}

static void memo_all_done(struct dev_alloc *d)
{
    bins_all_done(&d->small);
    bins_all_done(&d->large);
    for (struct priv_pool *pp = d->priv.pools; pp; pp = pp->next) {
        bins_all_done(&pp->small);
        bins_all_done(&pp->large);
    }
}

xseg_status memo_wait(struct dev_alloc *d, struct stream_memo *m, const struct block *b)
{
    lock_assert_held(&d->lock);
    if (m->all_idle)
        return XSEG_SUCCESS;
    CUstream s = b->stream;
    bool dflt = vstream_default(s);
    signed char *st = dflt ? memo_slot(m, s) : NULL;
    if (st && *st == 1)
        return XSEG_SUCCESS;
    xseg_status r = drv_ctx_ensure(d->info.primary_ctx);
    if (r == XSEG_SUCCESS && dflt) {
        r = vstream_wait(s, "before giving cached memory back");
    } else if (r == XSEG_SUCCESS) {
        /* A program's stream, never asked: xseg's event when a record covers b (a wait in
         * RELAXED mode, no capture invalidated), else the context. */
        struct sbins *sb = bpool_bins(block_pool(b), s);
        uint64_t t = block_gc_base(b);
        if (sb && t < sb->done_mark)
            return XSEG_SUCCESS;
        if (sb && sb->free_ev && t < sb->rec_mark && vevent_wait_relaxed(sb->free_ev)) {
            note_seen_done(d, sb, (uint64_t)clock_mono_ns());
            return XSEG_SUCCESS;
        }
        r = vctx_wait("before giving cached memory back (the streams it was freed on may be gone)");
        if (r == XSEG_SUCCESS) {
            m->all_idle = true;
            memo_all_done(d);
        }
    }
    if (r == XSEG_SUCCESS && st)
        *st = 1;
    return r;
}

void memo_free(struct stream_memo *m)
{
    xs_free(m->s);
    xs_free(m->state);
    xs_free(m->busy);
    *m = (struct stream_memo){0};
}

/* ---- classic segments and pools ---------------------------------------------------------- */

/* cuMemFree an unsplit free classic block (in the free index) and its segment; an owned pool's
 * goes through its owner's free, with the size, device and stream its alloc was called with. A
 * segment a ledger entry holds (segrec_held) stays: every caller skips it first. */
xseg_status release_block(struct dev_alloc *d, struct block *b)
{
    lock_assert_held(&d->lock);
    if (segrec_held(b->seg))
        return err_set(XSEG_ERROR_ILLEGAL_STATE, "classic segment at %p of device %d holds a registered range "
                       "(registration ledger): not released", (void *)b->addr, d->device);
    if (drv_ctx_ensure(d->info.primary_ctx) != XSEG_SUCCESS)
        return XSEG_ERROR_DRIVER;
    obs_classic(d, b->addr, b->size, XSEG_SEGMENT_UNMAP); /* before the memory goes */
    const xseg_pool_allocator *owner = dev_pool_allocator(d, block_pool(b));
    xseg_status st = XSEG_SUCCESS;
    if (owner)
        classic_free_owned(owner, (CUdeviceptr)b->addr, b->size, d->device, b->seg->stream);
    else
        st = classic_free((CUdeviceptr)b->addr, d->device);
    if (st != XSEG_SUCCESS) {
        obs_classic(d, b->addr, b->size, XSEG_SEGMENT_MAP); /* still there after all */
        return st;
    }
    struct segrec *sr = b->seg;
    if (XSEG_UNLIKELY(hist_mode()))
        hist_record(HIST_SEGMENT_FREE, d->device, b->addr, b->size, (uintptr_t)b->stream, d->hist_cur);
    d->acct.stats.num_device_free++;
    d->acct.total_allocated_memory -= b->size;
    stat_add_pool(d->acct.stats.segment, block_pool(b)->stat_index, -1);
    stat_add_pool(d->acct.stats.reserved_bytes, block_pool(b)->stat_index, -(int64_t)b->size);
    if (sr->oversize)
        stat_add(&d->acct.stats.oversize_segments, -1);
    bpool_remove_free(block_pool(b), b);
    dev_seglist_remove(d, sr);
    bpool_bins_release(sr->pool, sr->stream);
    xs_free(sr);
    dev_block_delete(d, b);
    return XSEG_SUCCESS;
}

/* Give back every free block of @p pool: unsplit classic segments (cuMemFree) and the whole chunks
 * inside free expandable blocks, after waiting for each one's stream once per pass (@p memo).
 * Only the free blocks of at least release_floor bytes are looked at (a whole classic segment or
 * a whole granule is never smaller), in index order as before: the same blocks go back in the
 * same order, and a heap of small holes costs nothing per hole. */
static xseg_status release_blocks_memo(struct dev_alloc *d, struct bpool *pool, struct stream_memo *memo)
{
    lock_assert_held(&d->lock);
    struct block **arr;
    size_t n;
    if (!bpool_collect_free_from(pool, d->release_floor, &arr, &n))
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory releasing cached blocks");
    xseg_status first = XSEG_SUCCESS;
    /* Classic first: unmapping splits expandable blocks, which changes the index under us. */
    for (size_t i = 0; i < n; i++) {
        struct block *b = arr[i];
        if (!b->expandable && !block_is_split(b)) {
            /* A registered range holds it (NCCL's registration): it stays cached. */
            xseg_status st = segrec_held(b->seg) ? XSEG_SUCCESS : release_block(d, b);
            if (st != XSEG_SUCCESS && first == XSEG_SUCCESS)
                first = st;
            arr[i] = NULL;
        }
    }
    for (size_t i = 0; i < n; i++) {
        struct block *b = arr[i];
        /* A sleeping pool's pages wait for its wake. */
        if (!b || !b->expandable || b->seg->asleep || !exp_whole_page_bytes(b))
            continue;
        xseg_status st = memo_wait(d, memo, b);
        if (st == XSEG_SUCCESS)
            st = exp_unmap_pages(d, b, SIZE_MAX, true);
        if (st != XSEG_SUCCESS && first == XSEG_SUCCESS)
            first = st;
    }
    xs_free(arr);
    return first;
}

/* The cached blocks of every private pool with no users (pools.c's list, read only), each stream
 * waited for at most once in the pass (@p memo: the default pools' streams are known idle). */
static xseg_status release_unused_pools(struct dev_alloc *d, struct stream_memo *memo)
{
    lock_assert_held(&d->lock);
    xseg_status first = XSEG_SUCCESS;
    for (struct priv_pool *pp = d->priv.pools; pp; pp = pp->next) {
        if (pp->use_count > 0)
            continue;
        xseg_status st1 = release_blocks_memo(d, &pp->large, memo);
        xseg_status st2 = release_blocks_memo(d, &pp->small, memo);
        if (first == XSEG_SUCCESS)
            first = st1 != XSEG_SUCCESS ? st1 : st2;
    }
    return first;
}

/* Nothing is released while a capture is underway on a stream the allocator knows (or a pool
 * records). The leftovers of earlier driver failures are stranded pages, unreleased handles and
 * unfreed reservations. */
xseg_status release_cached_blocks(struct dev_alloc *d, xseg_status *left_st)
{
    lock_assert_held(&d->lock);
    if (left_st)
        *left_st = XSEG_SUCCESS;
    if (dev_capture_underway(d))
        return XSEG_SUCCESS;
    /* Earlier failures' leftovers first: what fails during this release is retried next time
     * (an immediate retry would mostly meet the same failure). */
    xseg_status st4 = exp_reclaim_leftovers(d);
    if (left_st)
        *left_st = st4;
    ev_synchronize_all(d);
    struct stream_memo memo = {0};
    xseg_status st1 = release_blocks_memo(d, &d->large, &memo);
    xseg_status st2 = release_blocks_memo(d, &d->small, &memo);
    xseg_status st3 = d->priv.pools ? release_unused_pools(d, &memo) : XSEG_SUCCESS;
    memo_free(&memo);
    exp_release_empty_segments(d);
    if (d->priv.pools)
        pools_reap(d);
    return st1 != XSEG_SUCCESS ? st1 : st2 != XSEG_SUCCESS ? st2 : st3;
}

/* PyTorch's release_available_cached_blocks: with a max_split_size, free one oversize cached
 * block that is large enough, else several oversize blocks, largest first. */
bool release_available_cached_blocks(struct dev_alloc *d, struct bpool *pool, CUstream stream, size_t size)
{
    lock_assert_held(&d->lock);
    size_t msplit = d->cfg.max_split_size;
    if (msplit == SIZE_MAX || dev_capture_underway(d))
        return false; /* nothing is freed during a capture (release_cached_blocks) */
    size_t key = size < msplit ? msplit : size;
    struct block *b = bpool_lower_bound(pool, stream, key, 0);
    if (!b || b->stream != stream || b->expandable) {
        size_t released = 0;
        struct block *c = bpool_prev_free(pool, stream, key, 0);
        while (c && released < key && c->size >= msplit && c->stream == stream) {
            struct block *prevb = bpool_prev_free(pool, c->stream, c->size, c->addr);
            if (!c->expandable && !block_is_split(c) && !segrec_held(c->seg)) {
                size_t sz = c->size;
                if (release_block(d, c) == XSEG_SUCCESS)
                    released += sz;
            }
            c = prevb;
        }
        return released >= key;
    }
    if (block_is_split(b) || segrec_held(b->seg)) /* held: a registered range keeps it */
        return false;
    return release_block(d, b) == XSEG_SUCCESS;
}

static inline uint64_t gc_age(const struct block *b)
{
    return block_pool(b)->get_free_blocks_call_count - block_gc_base(b);
}

/* PyTorch's garbage_collect_cached_blocks: free aged unsplit classic blocks of the large pool
 * until the reserve is back under threshold × allowed. Nothing while a capture is underway: a
 * cuMemFree then fails and invalidates a GLOBAL capture (the next malloc after it collects). */
void release_garbage_collect(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    if (dev_capture_underway(d))
        return;
    size_t threshold = (size_t)(d->cfg.garbage_collection_threshold * (double)d->acct.allowed_memory_maximum);
    if (d->acct.total_allocated_memory <= threshold)
        return;
    size_t target = d->acct.total_allocated_memory - threshold, reclaimed = 0;
    struct block **arr;
    size_t n;
    if (!bpool_collect_free(&d->large, &arr, &n))
        return;
    uint64_t total_age = 0;
    size_t freeable = 0;
    for (size_t i = 0; i < n; i++) {
        if (!block_is_split(arr[i]) && !arr[i]->expandable && !segrec_held(arr[i]->seg)) {
            total_age += gc_age(arr[i]);
            freeable++;
        }
    }
    bool freed = true;
    while (reclaimed < target && freed && freeable > 0) {
        double age_threshold = (double)total_age / (double)freeable;
        freed = false;
        for (size_t i = 0; i < n; i++) {
            struct block *b = arr[i];
            if (!b || block_is_split(b) || b->expandable || segrec_held(b->seg) || (double)gc_age(b) < age_threshold)
                continue;
            uint64_t age = gc_age(b);
            size_t sz = b->size;
            if (release_block(d, b) != XSEG_SUCCESS)
                continue;
            arr[i] = NULL;
            freed = true;
            reclaimed += sz;
            total_age -= age;
            freeable--;
        }
    }
    xs_free(arr);
}
