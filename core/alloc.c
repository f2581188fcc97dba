/*
 * The device allocator (see alloc.h): malloc (the fast path and malloc_policy), free and
 * malloc_at, under the device lock. The finders (malloc_at's too) and history's events of a
 * block are core/device/blockops', the rounding core/device/sizes.h's, the request (struct
 * alloc_params, built by alloc_params_init alone) and growth core/grow.h's, the reclaim ladder
 * core/reclaim.c's, the out-of-memory report core/oom.c's, record_stream core/policy/events.c's.
 * Statistics follow PyTorch's DeviceCachingAllocator exactly, including what it leaves out for
 * expandable blocks (segment.*, inactive_split*).
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

#include "base/error.h"
#include "base/hostmem.h"
#include "core/policy/capreuse.h"
#include "core/device/blockops.h"
#include "core/device/check.h"
#include "core/policy/events.h"
#include "core/device/fast.h"
#include "core/device/quarantine.h"
#include "core/policy/observe.h"
#include "core/policy/registry.h"
#include "core/policy/pools.h"
#include "core/policy/release.h"
#include "core/device/placement.h"
#include "core/process/settings.h"
#include "core/oom.h"
#include "core/reclaim.h"
#include "core/device/sizes.h"
#include "core/services/sleep.h"
#include "core/services/spill.h"
#include "core/index/stats.h"
#include "core/services/trim.h"
#include "vmm/stream.h"

/* ---- statistics helpers ------------------------------------------------------------------ */

static inline void stat_pool(xseg_stat_counter *arr, const struct bpool *p, int64_t delta)
{
    stat_add_pool(arr, p->stat_index, delta);
}

/* ---- malloc ------------------------------------------------------------------------------ */

/* Free block @p b (of pool stat index @p si) becomes allocated for @p requested bytes: its flags
 * and the allocation statistics (the block's split statistics are the caller's). */
static inline __attribute__((always_inline)) void alloc_mark_taken(struct dev_alloc *d, struct block *b, int si,
                                                                   size_t requested)
{
    b->allocated = true;
    b->u.requested_size = requested; /* no side: it was free */
    stat_up_pool(d->acct.stats.allocation, si, 1);
    stat_up_pool(d->acct.stats.allocated_bytes, si, (int64_t)b->size);
    stat_up_pool(d->acct.stats.requested_bytes, si, (int64_t)requested);
    b->oversize = b->size >= d->cfg.max_split_size;
    if (b->oversize)
        stat_up(&d->acct.stats.oversize_allocations, 1);
}

/* Hand out p->block: split off the remainder, account. @p indexed: the block is still in the free
 * index with index predecessor @p pred (the fast path); else it was taken out of the index. */
static inline __attribute__((always_inline)) struct block *
alloc_found_block(struct dev_alloc *d, struct alloc_params *p, size_t orig_size, bool indexed, const struct block *pred)
{
    lock_assert_held(&d->lock);
    struct block *b = p->block;
    struct bpool *pool = p->pool;
    int si = pool->stat_index;
    bool already_split = block_is_split(b);
    bool whole = true;
    if (should_split(d, b, p->size)) {
        /* The allocated front gets a new block struct; b stays the free remainder after it. An
         * indexed b keeps its place in the free index unless its smaller key crosses its
         * predecessor's (bpool_free_take_front): no treap remove/insert in the common case. */
        struct block *a = d->spare; /* dev_block_spare written out: 2-3 instructions a pair less */
        if (XSEG_LIKELY(a))
            d->spare = a->next;
        else
            a = dev_block_carve(d);
        if (a) {
            whole = false;
            /* A spare struct (or a new one) is in no index and has no side struct
             * (dev_block_delete's contract); the index links are written when it enters an
             * index, and allocated / requested size / oversize below. So only the range and its
             * neighbours need writing here. */
            a->addr = b->addr;
            a->size = p->size;
            a->stream = b->stream;
            block_same_seg(a, b); /* expandable and the pool bits too */
            a->mapped = true;
            block_link_before(b, a);
            block_set_gc_base(b, pool->get_free_blocks_call_count);
            if (indexed) {
                bpool_free_take_front(pool, b, p->size, pred);
            } else {
                b->addr += p->size;
                b->size -= p->size;
                bpool_insert_free(pool, b);
            }
            if (!b->expandable) {
                if (already_split) {
                    stat_down_pool(d->acct.stats.inactive_split_bytes, si, (int64_t)a->size);
                } else {
                    stat_up_pool(d->acct.stats.inactive_split_bytes, si, (int64_t)b->size);
                    stat_up_pool(d->acct.stats.inactive_split, si, 1);
                }
            }
            b = a;
        }
        /* else no host memory for a split: hand out the whole block */
    }
    if (whole) {
        if (indexed)
            bpool_remove_free(pool, b);
        if (already_split && !b->expandable) {
            stat_down_pool(d->acct.stats.inactive_split_bytes, si, (int64_t)b->size);
            stat_down_pool(d->acct.stats.inactive_split, si, 1);
        }
    }
    alloc_mark_taken(d, b, si, orig_size);
    return b;
}

/* Hand out the top @p p->size bytes of p->block (out of the index) for @p requested bytes: the
 * free remainder stays below it, back in the index. The whole block when no struct is spare or
 * the rest is under BLOCK_MIN_SIZE. A classic block (cached from before expandable_segments was
 * turned on) is split as always: its split statistics are alloc_found_block's. */
static __attribute__((noinline)) struct block *alloc_top_block(struct dev_alloc *d, struct alloc_params *p,
                                                               size_t requested)
{
    lock_assert_held(&d->lock);
    struct block *b = p->block;
    struct bpool *pool = p->pool;
    if (!b->expandable)
        return alloc_found_block(d, p, requested, false, NULL);
    if (should_split(d, b, p->size)) {
        struct block *a = dev_block_spare(d);
        if (a) {
            a->addr = b->addr + b->size - p->size;
            a->size = p->size;
            a->stream = b->stream;
            block_same_seg(a, b);
            a->mapped = true;
            block_link_after(b, a);
            b->size -= p->size;
            block_set_gc_base(b, pool->get_free_blocks_call_count);
            bpool_insert_free(pool, b);
            b = a;
        }
    }
    alloc_mark_taken(d, b, pool->stat_index, requested);
    return b;
}

/* The free half of a malloc that could not record its pointer (host OOM): undo the accounting
 * and return the block to the pool. */
static void undo_alloc(struct dev_alloc *d, struct block *b)
{
    lock_assert_held(&d->lock);
    b->allocated = false;
    stat_pool(d->acct.stats.allocation, block_pool(b), -1);
    stat_pool(d->acct.stats.allocated_bytes, block_pool(b), -(int64_t)b->size);
    if (b->oversize)
        stat_add(&d->acct.stats.oversize_allocations, -1);
    dev_free_block(d, b);
}

/* What malloc_hand_out knows of the request's pool: nothing (it tests the rounded size), or, a
 * constant where the caller has branched on it already, small or large (no second test). */
enum hand_pool { HAND_POOL_TEST, HAND_POOL_SMALL, HAND_POOL_LARGE };

/* Hand out p->block, the end of every malloc once it is found (taken out of the index unless
 * @p indexed): split, account, record the pointer. @p home (a constant): place_predict_home ran
 * for this malloc with the lock held since, its life_state.home_tag is this key's. @p kind (a
 * constant): whether the caller knows the pool (enum hand_pool). Lock held (and kept). */
static inline __attribute__((always_inline)) xseg_status malloc_hand_out(struct dev_alloc *d, struct alloc_params *p,
                                                                         size_t size, bool indexed,
                                                                         const struct block *pred,
                                                                         bool home, enum hand_pool kind,
                                                                         void **out, struct hist_mctx *h)
{
    lock_assert_held(&d->lock);
    struct block *b = XSEG_UNLIKELY(p->top) ? alloc_top_block(d, p, size) : alloc_found_block(d, p, size, indexed, pred);
    if (XSEG_UNLIKELY(!ptrmap_put(&d->live, b->addr, b))) {
        undo_alloc(d, b);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory recording an allocation");
    }
    if (h && XSEG_UNLIKELY(!hist_on_alloc(d, b, h))) { /* h: a constant NULL on the fast path */
        (void)ptrmap_take(&d->live, b->addr);
        undo_alloc(d, b);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory recording an allocation's history");
    }
    fast_note_alloc(d, b);
    life_note(&d->life, 0);
    if (kind == HAND_POOL_TEST ? p->size > BLOCK_SMALL_SIZE : kind == HAND_POOL_LARGE) { /* the large pools */
        if (home)
            place_record_home(d, size, p->stream, p->pool, b); /* the prediction's entry: no second hash */
        else if (d->use_expandable)
            life_record(&d->life, size, p->stream, p->pool, b);
    }
    *out = (void *)b->addr;
    return XSEG_SUCCESS;
}

/*
 * PyTorch's DeviceCachingAllocator::malloc, top to bottom: the cache, the free-memory callbacks,
 * garbage collection, the quarantine, growth, the reclaim ladder, out of memory. @p p is resolved
 * (rounded size, pool, stream). @p searched: the fast path has already searched the cache and
 * found @p found (NULL: a miss; else a fit whose index predecessor it could not tell). Lock held on
 * entry and on return; dropped around the free-memory callbacks, inside the ladder (the group's
 * give-way) and inside the OOM report.
 */
static __attribute__((noinline)) xseg_status malloc_policy(struct dev_alloc *d, struct alloc_params *p,
                                                           bool searched, struct block *found, size_t size,
                                                           void **out, struct hist_mctx *h)
{
    lock_assert_held(&d->lock);
    /* The cache: best fit on the stream, with the max_split_size rules (bops_find_free); a
     * request predicted long-lived (placement.h, L1), the highest fitting block (bops_find_top). */
    if (!searched) {
        struct block *pred;
        bool pred_ok = false;
        bool by_class = p->size > BLOCK_SMALL_SIZE && place_class_regime(d); /* S1 for L1 and L2 */
        p->top = !by_class && place_predict_long(d, p->size, size, p->stream, p->pool);
        if (by_class)
            p->cls = (uint8_t)place_class_of(d, size, p->stream, p->pool);
        found = by_class ? bops_find_class(d, p->pool, p->stream, p->size, p->cls, &pred, &pred_ok)
                : p->top ? bops_find_top(d, p->pool, p->stream, p->size)
                         : bops_find_free(d, &(struct bops_want){p->pool, p->stream, p->size}, &pred, &pred_ok);
        if (found && pred_ok) {
            p->block = found;
            return malloc_hand_out(d, p, size, true, pred, false, HAND_POOL_TEST, out, h);
        }
    }
    if (found) {
        bpool_remove_free(p->pool, found);
        p->block = found;
        return malloc_hand_out(d, p, size, false, NULL, false, HAND_POOL_TEST, out, h);
    }

    /* Admission: what no device holds is out of memory at once; a capturing stream no pool takes
     * is refused. */
    if (XSEG_UNLIKELY(!grow_holdable(d, p, size)))
        return oom_report(d, p->size, p->alloc_size, p->stream);
    xseg_status st = grow_admit(d, p);
    if (st != XSEG_SUCCESS)
        return st;

    /* Free-memory callbacks, with the lock released (they may call xseg); then the cache. */
    if (settings_have_free_memory_callbacks()) {
        dev_unlock(d);
        int freed = settings_run_free_memory_callbacks(d->device, p->size);
        dev_lock(d, DEV_NEED_SLOTS);
        if (grow_pool_fell_asleep(d, p->pool, &st))
            return st;
        if (freed && grow_recheck_cache(d, p))
            return malloc_hand_out(d, p, size, false, NULL, false, HAND_POOL_TEST, out, h);
    }

    /* Garbage collection: aged cached blocks, when a threshold is set. */
    if (XSEG_UNLIKELY(dev_gc_on(d)))
        release_garbage_collect(d);

    /* The quarantine (debug_stale_access): over a quarter of its bound, it empties before growth
     * (core/device/quarantine.h). */
    if (XSEG_UNLIKELY(d->quar.n) && quar_before_growth(d) && grow_recheck_cache(d, p))
        return malloc_hand_out(d, p, size, false, NULL, false, HAND_POOL_TEST, out, h);

    /* Growth: a new segment, or room in an expandable one. */
    st = grow_try(d, p);

    /* Refused: the reclaim ladder, each rung giving memory back, then growth again. */
    if (st == XSEG_ERROR_OUT_OF_MEMORY)
        st = reclaim_run(d, p);

    /* Out of memory: observers, then the message. */
    if (st == XSEG_ERROR_OUT_OF_MEMORY)
        return oom_report(d, p->size, p->alloc_size, p->stream);
    if (st != XSEG_SUCCESS)
        return st;
    /* A cache miss went to the driver anyway: keep the cache within release_threshold_mb by giving
     * back runs of streams known idle (no wait; core/services/trim.h). p->block is out of the free index,
     * so it cannot be a candidate. */
    if (XSEG_UNLIKELY(d->cfg.release_threshold != SIZE_MAX))
        trim_threshold(d, p->size);
    return malloc_hand_out(d, p, size, false, NULL, false, HAND_POOL_TEST, out, h);
}

/* Everything before the search that a plain malloc does not need: a new config, and the work of
 * the rare conditions (FAST_RARE, core/device/fast.h): streams seen capturing and routes to private
 * pools (which choose the pool), sleeping pools, pending events and deferred frees, capture reuse,
 * idle ticks, roundup_power2_divisions. Resolves @p p. Fails for an allocation on a capturing
 * stream that no pool takes. */
static xseg_status malloc_prepare(struct dev_alloc *d, size_t size, CUstream stream, struct alloc_params *p)
{
    lock_assert_held(&d->lock);
    dev_refresh_cfg(d);
    struct priv_pool *priv = NULL;
    if (XSEG_UNLIKELY(fast_rare_capture(d))) {
        xseg_status st = d->priv.nroutes ? pools_select(d, stream, &priv) : XSEG_SUCCESS, ignored;
        if (st == XSEG_SUCCESS && !priv && dev_capture_underway(d) &&
            dev_stream_capturing(d, stream, &ignored)) {
            dev_capture_note(d, stream);
            dev_fast_off(d);
            st = grow_capture_error(stream);
        }
        if (st != XSEG_SUCCESS)
            return st;
    }
    /* A sleeping pool hands nothing out (no wake behind the caller's back: core/services/sleep.h). */
    if (XSEG_UNLIKELY(fast_rare_asleep(d)) && sleep_pool_asleep(d, priv))
        return sleep_refuse(d, priv);
    if (XSEG_UNLIKELY(fast_rare_events(d)) && !fast_rare_capture(d)) {
        size_t pending = d->ev.pending_events + d->ev.ndeferred;
        ev_process(d);
        /* Events completed: work is known done, a point for release_threshold_mb (core/services/trim.h). */
        if (d->cfg.release_threshold != SIZE_MAX && d->ev.pending_events < pending)
            trim_threshold(d, 0);
    } else if (XSEG_UNLIKELY(d->cr.n) && d->cfg.graph_capture_record_stream_reuse) {
        ev_capture_reuse(d, stream); /* during a capture: blocks the graph lets us reuse */
    }
    if (XSEG_UNLIKELY(d->cr.nwalks) && !fast_rare_capture(d))
        capreuse_reset(d); /* the walks of captures that are over */
    if (XSEG_UNLIKELY(fast_rare_idle_tick(d)))
        trim_idle_tick(d); /* else the background thread ticks (core/services/idle.h) */
    dev_fast_update(d);

    size_t rounded = sizes_round(d, size);
    alloc_params_init(p, rounded, alloc_params_pool(d, priv, rounded), stream, false);
    return XSEG_SUCCESS;
}

/* Every malloc the fast path does not finish: @p searched, it searched the cache under the permit
 * and found @p found (NULL: a miss; else a fit whose index predecessor it could not tell); else
 * the permit was off, and history's stack and the rare conditions come first. Then the policy.
 * Lock held on entry and on return (dropped while history captures the stack: the stack
 * callback may take its time). Scalars only, so the fast path keeps its request in registers. */
static inline __attribute__((always_inline)) xseg_status malloc_slow_body(struct dev_alloc *d, size_t size,
                                                                         CUstream stream, bool searched,
                                                                         struct block *found, bool top, void **out)
{
    lock_assert_held(&d->lock);
    (void)drv_take_va_oom(); /* an earlier malloc's cause is not this one's (oom_report) */
    /* Every policy step past the cache may touch any stream's blocks (release, reclaim, GC). An
     * own slot's settle (core/device/fast.h) frees its block into the index, perhaps into the block
     * found: the search runs again. */
    if (XSEG_UNLIKELY(fast_own_busy(d)))
        searched = false;
    fast_settle(d, FAST_ALL, NULL);
    struct alloc_params p;
    if (searched) {
        size_t rounded = fast_round(size);
        alloc_params_init(&p, rounded, alloc_params_pool(d, NULL, rounded), stream, top);
        xseg_assert(!d->acct.pending[XSEG_STAT_ALL]); /* the permit (dev_alloc.acct.pending) */
        return malloc_policy(d, &p, true, found, size, out, NULL);
    }
    struct hist_mctx h = {NULL, false}, *hp = NULL;
    struct hstack *cur = NULL;
    if (XSEG_UNLIKELY(fast_rare_history(d))) {
        dev_unlock(d);
        h.stack = cur = hist_capture();
        dev_lock(d, DEV_NEED_SLOTS);
        d->hist_cur = cur; /* the segment events of this malloc take it from here */
        hp = &h;
    }
    xseg_status st = malloc_prepare(d, size, stream, &p);
    if (st == XSEG_SUCCESS) {
        /* Sizes near SIZE_MAX cannot be rounded (p.size is meaningless); no device holds them. */
        if (XSEG_UNLIKELY(size > ((size_t)1 << 62)))
            st = oom_report(d, size, size, stream);
        else
            st = malloc_policy(d, &p, false, NULL, size, out, hp);
    }
    /* active rose with allocation: while blocks are pending it is above allocation, and its peak
     * is tracked apart (dev_alloc.acct.pending). The lock was held since the block was handed out. */
    if (XSEG_UNLIKELY(d->acct.pending[XSEG_STAT_ALL]) && st == XSEG_SUCCESS)
        dev_track_active_peak(d);
    if (hp) {
        if (cur && !h.cur_cleared && d->hist_cur == cur) /* failed: hist_on_alloc did not run */
            d->hist_cur = NULL;
        hist_stack_unref(h.stack); /* unless the block took it; the events hold their own */
    }
    return st;
}

/* malloc_slow's success when registrations are due (reg_after_due: this malloc mapped pages of a
 * released one): its caller runs the after pass once the device lock is given back
 * (malloc_reg_after). Only the slow path maps pages, so a cache hit never tests the ledger. Never
 * returned past malloc_locked. */
#define MALLOC_REG_DUE ((xseg_status)0x7fff)

/* malloc_slow_body, whose success says MALLOC_REG_DUE when registrations are due. */
static __attribute__((noinline)) xseg_status malloc_slow(struct dev_alloc *d, size_t size, CUstream stream,
                                                         bool searched, struct block *found, bool top, void **out)
{
    xseg_status st = malloc_slow_body(d, size, stream, searched, found, top, out);
    if (XSEG_UNLIKELY(reg_after_due(d)) && st == XSEG_SUCCESS)
        st = MALLOC_REG_DUE;
    return st;
}

/* The after pass a MALLOC_REG_DUE asked for, no lock held: pages of a released registration were
 * mapped again. The malloc succeeded whatever the pass says (docs/registrations.md). */
static __attribute__((noinline, cold)) xseg_status malloc_reg_after(struct dev_alloc *d)
{
    (void)reg_after(d, XSEG_RANGE_REMAPPED);
    return XSEG_SUCCESS;
}

/* A malloc under the permit in S1's regime (place_predict_home left the key's home entry in
 * life_state.home_tag): its class's best fit; a miss grows in the policy. Its request is built
 * here, not passed from the fast path: taking the fast path's by address cost every large pair
 * of the device lock 4 instructions and S1's 9 (callgrind_round_robin.sh). */
static __attribute__((noinline)) xseg_status malloc_class(struct dev_alloc *d, size_t size, CUstream stream, void **out)
{
    struct alloc_params pp, *p = &pp;
    alloc_params_init(p, fast_round(size), &d->large, stream, false);
    p->cls = (uint8_t)place_class_home(d, size, p->stream, p->pool);
    struct block *pred;
    bool pred_ok;
    struct block *c = bops_find_class(d, p->pool, p->stream, p->size, p->cls, &pred, &pred_ok);
    if (!c)
        return malloc_slow(d, size, p->stream, false, NULL, false, out);
    p->block = c;
    if (XSEG_LIKELY(pred_ok)) /* the index's best fit: its predecessor is known */
        return malloc_hand_out(d, p, size, true, pred, true, HAND_POOL_LARGE, out, NULL);
    bpool_remove_free(p->pool, c);
    return malloc_hand_out(d, p, size, false, NULL, true, HAND_POOL_LARGE, out, NULL);
}

/* A malloc under the permit predicted long-lived: the highest fitting free block, carved from its
 * top; else the policy's growth, which takes the top of what it maps. */
static __attribute__((noinline)) xseg_status malloc_top(struct dev_alloc *d, size_t size, CUstream stream, void **out)
{
    struct alloc_params p;
    alloc_params_init(&p, fast_round(size), &d->large, stream, true);
    /* place_predict_home left the key's home entry (or none) in life_state.home_tag: the records
     * below go there without a second hash (malloc_hand_out's home). */
    struct block *b = bops_find_top(d, p.pool, p.stream, p.size);
    if (!b)
        return malloc_slow(d, size, stream, true, NULL, true, out);
    bpool_remove_free(p.pool, b);
    p.block = b;
    return malloc_hand_out(d, &p, size, false, NULL, true, HAND_POOL_LARGE, out, NULL);
}

/* malloc_cached's best fit on the stream, in the pool @p kind says (a constant: the hand-out tests
 * no size again). Lock held. */
static inline __attribute__((always_inline)) xseg_status malloc_cached_fit(struct dev_alloc *d, struct alloc_params *p,
                                                                           size_t size, CUstream stream, void **out,
                                                                           enum hand_pool kind)
{
    struct block *pred;
    bool pred_ok;
    struct block *b = bops_find_free(d, &(struct bops_want){p->pool, p->stream, p->size}, &pred, &pred_ok);
    if (XSEG_LIKELY(b && pred_ok)) {
        /* The pointer handed out is b's address: its map slot (a cache miss at many live
         * blocks) loads while the split and the counters run. */
        ptrmap_prefetch(&d->live, b->addr);
        p->block = b;
        /* The permit: nothing is pending, active moves with allocation (dev_alloc.acct.pending). */
        xseg_assert(!d->acct.pending[XSEG_STAT_ALL]);
        return malloc_hand_out(d, p, size, true, pred, true, kind, out, NULL);
    }
    return malloc_slow(d, size, stream, true, b, false, out); /* every slot settled first */
}

/*
 * malloc. The fast path is the policy's first step minus the rare conditions, which malloc_slow
 * handles: a best-fit search, a split that leaves the remainder in its index place, statistics,
 * one hash insert. No driver call, no allocation (block structs come from the spare list), no
 * atomic read-modify-write besides the lock's compare-exchange. A miss goes on to malloc_policy's
 * later steps. Lock held (malloc_locked takes and gives it back). The small and the large pool
 * each have their copy of the best fit's inline code (malloc_cached_fit), so that the hand-out
 * knows the pool without a second size test: 2 to 8 instructions of a pair through the lock
 * (docs/benchmarks-replay.md, the placement's cost).
 */
static inline __attribute__((always_inline)) xseg_status malloc_cached(struct dev_alloc *d, size_t size,
                                                                       CUstream stream, void **out)
{
    /* fast_gen stands for every rare condition (core/device/fast.h); a moved generation means a new config. */
    if (XSEG_UNLIKELY(!(settings_gen() == d->fast.fast_gen && size <= ((size_t)1 << 62))))
        return malloc_slow(d, size, stream, false, NULL, false, out);
    struct alloc_params p;
    size_t rounded = fast_round(size);
    /* The request is built in each branch, not once above it: there the pool is a constant of the
     * branch. Built once before the test, GCC chose the pool apart from the branch, and a
     * small-pool pair through the lock took 3 instructions more (callgrind_round_robin.sh,
     * release: 674.0 -> 677.3 expandable, 688.3 -> 691.7 classic; the large pool's 819.3 -> 819.0). */
    if (XSEG_UNLIKELY(rounded > BLOCK_SMALL_SIZE)) {
        alloc_params_init(&p, rounded, alloc_params_pool(d, NULL, rounded), stream, false);
        if (place_predict_home(d, p.size, size, stream, p.pool))
            return place_class_regime(d) ? malloc_class(d, size, stream, out) : malloc_top(d, size, stream, out);
        return malloc_cached_fit(d, &p, size, stream, out, HAND_POOL_LARGE);
    }
    alloc_params_init(&p, rounded, alloc_params_pool(d, NULL, rounded), stream, false);
    return malloc_cached_fit(d, &p, size, stream, out, HAND_POOL_SMALL);
}

/* malloc through the device lock: the door's bracket around the eager malloc (Note [the door] in
 * core/device/fast.h), unless the stream's classic slot widens to this size. */
static __attribute__((noinline)) xseg_status malloc_locked(struct dev_alloc *d, size_t size, CUstream stream,
                                                           void **out)
{
    dev_lock(d, DEV_NEED_NONE); /* its stream's slot settles below, unless a hit serves it here */
    FAST_COUNT(d, lock_mallocs);
    if (XSEG_UNLIKELY(d->fast.busy_slots != 0) && fast_lock_hit(d, size, stream, out)) {
        dev_unlock(d);
        return XSEG_SUCCESS;
    }
    struct fast_guard g;
    fast_lock_begin_malloc(d, stream, &g);
    xseg_status st = malloc_cached(d, size, stream, out);
    fast_lock_end(d, &g);
    dev_unlock(d);
    if (XSEG_UNLIKELY(st == MALLOC_REG_DUE))
        st = malloc_reg_after(d); /* pages of a released registration mapped again */
    return st;
}

/* register_blocks_above_mb: the block just handed out at *out enters the registration ledger
 * as xseg's own (core/policy/registry.h); where host memory for its entry runs out the block is
 * freed again and the malloc fails (nothing changed). */
static __attribute__((noinline)) xseg_status malloc_register(struct dev_alloc *d, size_t size, void **out)
{
    dev_lock(d, DEV_NEED_SLOTS);
    dev_refresh_cfg(d);
    struct block *b = ptrmap_get(&d->live, (uintptr_t)*out);
    xseg_status st = XSEG_SUCCESS;
    if (b && b->expandable && d->cfg.register_blocks_above && size >= d->cfg.register_blocks_above)
        st = reg_own_locked(d, b->addr, b->size, REG_OWNER_BLOCK, -1);
    dev_unlock(d);
    if (st != XSEG_SUCCESS) {
        struct err_kept kept = err_keep();
        bool owned;
        (void)alloc_free(d, *out, &owned);
        *out = NULL;
        return err_set(st, "xseg_malloc(%zu): %s", size, kept.msg);
    }
    return st;
}

/* malloc_locked, then register_blocks_above_mb's entry. */
static __attribute__((noinline, cold)) xseg_status malloc_locked_register(struct dev_alloc *d, size_t size,
                                                                          CUstream stream, void **out)
{
    xseg_status st = malloc_locked(d, size, stream, out);
    return st == XSEG_SUCCESS ? malloc_register(d, size, out) : st;
}

/* A malloc the slot's hit did not serve: the stream's slot, when this thread's last slot (fast_hit's)
 * was another (a single-threaded program's misses: the same one, tried once), then malloc_locked,
 * then register_blocks_above_mb's entry. A slot never serves a size at or above that key
 * (fast_fill_* refuse such blocks), so the hit needs no test of its own and the cached pair is
 * unchanged. It makes tail calls only, so it has no frame: every malloc through the device lock
 * passes here (the front's try, a call, is malloc_front's). */
static __attribute__((noinline)) xseg_status malloc_miss(void **out, size_t size, struct dev_alloc *d, CUstream stream)
{
    struct dev_slot *ss = fast_slot_of(d, stream);
    if (ss != fast_tls.first && slot_peek_freed(ss) && fast_hit_at(d, ss, size, stream, out)) {
        fast_tls_last(ss);
        return XSEG_SUCCESS;
    }
    if (XSEG_UNLIKELY(size >= atomic_load_explicit(&d->reg_above, memory_order_relaxed)))
        return malloc_locked_register(d, size, stream, out);
    return malloc_locked(d, size, stream, out); /* a tail call: no frame of this function's */
}

/* A miss of a thread with a front (a shared stream's, Note [slot rule]): the front first
 * (alloc_malloc tried the lane of the size), then malloc_miss. Apart from it, so that a thread with
 * none pays no frame for this call. */
static __attribute__((noinline)) xseg_status malloc_front(void **out, size_t size, struct dev_alloc *d,
                                                          CUstream stream)
{
    if (fast_front_hit_in(fast_tls.front, d, size, stream, out))
        return XSEG_SUCCESS;
    return malloc_miss(out, size, d, stream);
}

/* A malloc the first slot did not serve (@p t: fast_tls, from alloc_malloc): the lane of its size
 * (sizes in turn on a shared stream), else malloc_miss. A function of its own, with no frame (malloc_miss's costs about 20
 * instructions of such a pair), and apart from alloc_malloc, whose registers the cached pair's
 * hit would otherwise share with it (one more move there). */
static __attribute__((noinline)) xseg_status malloc_lane(void **out, size_t size, struct dev_alloc *d, CUstream stream,
                                                         fast_tls_ref t)
{
    struct dev_slot *lanes = t->lanes; /* tested here: the cached pair's registers stay as they are */
    if (lanes && fast_lane_hit(t, lanes, d, size, stream, out))
        return XSEG_SUCCESS;
    /* alloc_malloc's NULL and size 0, here rather than in xseg_malloc's inline path (3
     * instructions of every cached pair): the tries above write *out only on a hit, and size 0
     * rounds to 0 there, which no slot or lane serves (fast_hit_sized); the front's rounding
     * would give it a 512 B block. */
    *out = NULL;
    if (XSEG_UNLIKELY(size == 0))
        return XSEG_SUCCESS;
    if (t->front) /* tested here: a thread with no front goes straight to malloc_miss */
        return malloc_front(out, size, d, stream);
    return malloc_miss(out, size, d, stream);
}

/* malloc: the slot's hit under its lock alone (core/device/fast.h), everything else in
 * malloc_lane and malloc_miss. */
xseg_status alloc_malloc(void **out, size_t size, struct dev_alloc *d, CUstream stream)
{
    /* In a register no argument uses: GCC put it in d's and moved size and d out of the way, and
     * back before the tail call when the hit missed (four moves). Tested apart from the hit, so a
     * thread whose sizes turn (fast_tls.first NULL) reaches malloc_lane with its arguments as they
     * came. */
    fast_tls_ref t = FAST_TLS_REF(); /* handed on to malloc_lane (fast_tls_ref) */
    register struct dev_slot *s XSEG_REG("r9") = t->first;
    __asm__("" : "+r"(s));
    if (!s)
        return malloc_lane(out, size, d, stream, t);
    if (XSEG_LIKELY(fast_hit(d, s, size, stream, out)))
        return XSEG_SUCCESS;
    return malloc_lane(out, size, d, stream, t);
}

/* ---- free -------------------------------------------------------------------------------- */

/* The rest of free_ptr for a block counted oversize, recorded by history, exported, or with a
 * side struct (lock held, kept). */
static __attribute__((noinline)) xseg_status free_ptr_rare(struct dev_alloc *d, struct block *b)
{
    lock_assert_held(&d->lock);
    /* Spill's block (core/services/spill.h): its host chunks go once it merged into free memory. */
    struct segrec *spilled = NULL;
    uintptr_t spilled_at = b->addr;
    xseg_status spill_st = XSEG_SUCCESS;
    if (XSEG_UNLIKELY(b->spill) && spill_on_free(d, b, &spill_st))
        spilled = b->seg;
    if (b->oversize) {
        stat_down(&d->acct.stats.oversize_allocations, 1);
        b->oversize = false;
    }
    b->exported = false; /* the export ends with the block (its pool may sleep again) */
    if (b->sided) {
        b->u.side->handle_holds = 0; /* so do the holds of handed-out handles */
        if (XSEG_UNLIKELY(b->u.side->ledger)) { /* and xseg's own ledger entries over it */
            reg_disown_locked(d, b->addr, b->size);
            b->u.side->ledger = 0;
        }
    }
    /* debug_stale_access: held out of the pool (core/device/quarantine.h), its free completed when
     * it leaves; a block with recorded streams enters once their events are done (events.c). */
    bool held = XSEG_UNLIKELY(d->cfg.debug_stale_access) && !block_uses_n(b) && !(spilled && dev_capture_underway(d)) &&
                quar_enter(d, b, false); /* host chunks are given back by its canary swap: none during a capture */
    if (b->recorded)
        hist_free_requested(d, b);
    if (held) {
        if (XSEG_UNLIKELY(spilled))
            spill_after_quarantine(d);
        return spill_st;
    }
    xseg_status st = XSEG_SUCCESS;
    if (block_uses_n(b)) {
        dev_refresh_cfg(d);
        if (XSEG_UNLIKELY(d->cfg.debug_stale_access)) {
            quar_keep_free_stack(d, b); /* for its quarantine entry once the events are done */
            quar_join(d, b);            /* its stream may be gone by then */
        }
        st = ev_insert(d, b);
    } else {
        block_side_drop(b); /* nothing left in it: no streams, events or stack */
        xseg_assert(!b->sided);
        if (XSEG_UNLIKELY(b->sided))
            block_side_free(b); /* release builds: the word must hold the requested size below */
        dev_free_block_inline(d, b);
    }
    if (XSEG_UNLIKELY(spilled))
        spill_after_free(d, spilled, spilled_at);
    return st != XSEG_SUCCESS ? st : spill_st;
}

/* Every free but the slot's, lock held (free_locked takes and gives it back); the block goes to a
 * slot where the door's put takes it (fast_put, Note [slot rule] in core/device/fast.h). */
static inline __attribute__((always_inline)) xseg_status free_cached(struct dev_alloc *d, void *ptr, bool *owned,
                                                                     bool stale)
{
    struct block *b = ptrmap_take(&d->live, (uintptr_t)ptr);
    if (!b) {
        *owned = false;
        return XSEG_SUCCESS;
    }
    *owned = true;
    b->allocated = false;
    xseg_status st = XSEG_SUCCESS;
    /* The passes that never wait learn that the block's work is done from xseg's event, never
     * from its stream after this free (core/policy/release.h): recorded by the first free after
     * the last record was seen complete a window on, after the block entered the index (or its
     * slot); the other frees make no driver call, and with neither policy set pay one test. Not
     * the slot's cached pair. */
    struct bpool *note_pool = NULL;
    CUstream note_stream = b->stream;
    if (XSEG_UNLIKELY(release_note_on(d)) && release_note_due(dev_block_pool(d, b), note_stream))
        note_pool = dev_block_pool(d, b);
    if (fast_put(d, b)) {
        if (XSEG_UNLIKELY(note_pool != NULL))
            release_note_record(d, note_pool, note_stream);
        return XSEG_SUCCESS;
    }
    struct bpool *pool = dev_block_pool(d, b);
    int si = pool->stat_index;
    life_note_free(&d->life);
    if (XSEG_LIKELY(b->expandable && !b->small_pool)) /* in line: expandable mode's large frees */
        life_forget(&d->life, b);
    stat_down_pool(d->acct.stats.allocation, si, 1);
    stat_down_pool(d->acct.stats.allocated_bytes, si, (int64_t)b->size);
    /* oversize, recorded, exported and a side struct (recorded streams) in one test
     * (block_free_slow), handled out of line with the rest of the free: a call on this path would
     * make the compiler reload the block's fields after it. */
    if (XSEG_UNLIKELY(block_free_slow(b) || stale))
        st = free_ptr_rare(d, b);
    else
        dev_free_block_inline(d, b);
    if (XSEG_UNLIKELY(note_pool != NULL))
        release_note_record(d, note_pool, note_stream);
    return st;
}

/* free through the device lock: the door's bracket around the eager free (Note [the door] in
 * core/device/fast.h). */
static __attribute__((noinline)) xseg_status free_locked(struct dev_alloc *d, void *ptr, bool *owned)
{
    dev_lock(d, DEV_NEED_NONE);
    FAST_COUNT(d, lock_frees);
    struct fast_guard g;
    fast_lock_begin_free(d, ptr, &g);
    xseg_status st = free_cached(d, ptr, owned, false);
    fast_lock_end(d, &g);
    dev_unlock(d);
    return st;
}

/* A free with debug_stale_access in force (core/device/quarantine.h): the free's stack is taken
 * before the lock (history's callback may run), every slot settles (the permit is off while the
 * mode is on), the block enters the quarantine, and findings its entry made (older blocks left)
 * go to the observers once the lock is given back. */
static __attribute__((noinline)) xseg_status free_stale(struct dev_alloc *d, void *ptr, bool *owned)
{
    struct hstack *fs = hist_mode() ? hist_capture() : NULL;
    dev_lock(d, DEV_NEED_OP);
    quar_begin_free(d, fs);
    xseg_status st = free_cached(d, ptr, owned, d->cfg.debug_stale_access); /* no fill: no permit */
    quar_end_free(d);
    struct quar_batch batch;
    quar_take(d, &batch);
    dev_unlock(d);
    quar_deliver(&batch);
    return st;
}

/* free through the device lock (xseg_free tried the thread's slot first: fast_free_hit). */
static inline __attribute__((always_inline)) xseg_status free_ptr(struct dev_alloc *d, void *ptr, bool *owned)
{
    if (XSEG_UNLIKELY(settings_stale_on()))
        return free_stale(d, ptr, owned);
    return free_locked(d, ptr, owned);
}

xseg_status alloc_free(struct dev_alloc *d, void *ptr, bool *owned) { return free_ptr(d, ptr, owned); }

xseg_status alloc_free_unknown(void *ptr)
{
    return err_set(XSEG_ERROR_INVALID_VALUE,
                   "xseg_free: pointer %p was not returned by xseg_malloc or was freed already", ptr);
}

xseg_status alloc_free_sole(struct dev_alloc *d, void *ptr)
{
    bool owned;
    xseg_status st = free_ptr(d, ptr, &owned);
    if (XSEG_UNLIKELY(!owned))
        return alloc_free_unknown(ptr);
    return st;
}

/* Placing [addr, addr + size) in free block @p b (taken out of its index): head and tail stay
 * free blocks of the segment; statistics as alloc_found_block keeps them. In a classic segment
 * inactive_split counts the free blocks of a split segment (PyTorch's): b was one when its segment
 * was split, the head and tail are after. @p h, @p t: spare structs for a head and a tail. */
static void malloc_at_place(struct dev_alloc *d, struct block *b, uintptr_t addr, size_t size, struct block *h,
                            struct block *t)
{
    lock_assert_held(&d->lock);
    struct bpool *pool = block_pool(b);
    int si = pool->stat_index;
    size_t head = addr - b->addr, tail = b->addr + b->size - addr - size, was = b->size;
    bool was_split = block_is_split(b);
    bpool_remove_free(pool, b);
    if (h)
        bops_split_free(pool, b, h, head, true);
    if (t)
        bops_split_free(pool, b, t, tail, false);
    if (!b->expandable) {
        stat_add_pool(d->acct.stats.inactive_split, si, (int64_t)(!!h + !!t) - was_split);
        stat_add_pool(d->acct.stats.inactive_split_bytes, si, (int64_t)(head + tail) - (was_split ? (int64_t)was : 0));
    }
    alloc_mark_taken(d, b, si, size);
}

xseg_status alloc_malloc_at(struct dev_alloc *d, xseg_pool_id id, uintptr_t addr, size_t size)
{
    /* History records the placed block as an alloc with the caller's stack, as PyTorch's
     * setCheckpointPoolState does (alloc_found_block with its context); captured unlocked. */
    struct hist_mctx hm = {NULL, false}, *hp = NULL;
    if (XSEG_UNLIKELY(hist_mode())) {
        hm.stack = hist_capture();
        hp = &hm;
    }
    dev_lock(d, DEV_NEED_SLOTS);
    dev_refresh_cfg(d);
    struct priv_pool *pp = pools_find(d, id);
    struct block *b = pp ? bops_find_at(d, &pp->small, &pp->large, addr) : NULL;
    xseg_status st = XSEG_SUCCESS;
    /* Only a block of a layout xseg made can be placed: its size a nonzero multiple of
     * BLOCK_MIN_SIZE (sizes_round's unit, whichever rounding made it), its address on the same
     * grid from its segment's base (every block's address is; b's is). Anything else would leave
     * blocks off the grid, and later mallocs would hand out unaligned addresses. */
    if (size == 0 || size % BLOCK_MIN_SIZE)
        st = err_set(XSEG_ERROR_INVALID_VALUE, "xseg_pool_malloc_at: size %zu at 0x%" PRIxPTR " is not a block size "
                     "(a nonzero multiple of %zu bytes, as xseg rounds every request)", size, addr, BLOCK_MIN_SIZE);
    else if (!pp || !b)
        st = err_set(XSEG_ERROR_INVALID_VALUE, "xseg_pool_malloc_at: 0x%" PRIxPTR " is not in a segment of pool (%" PRIu64
                     ", %" PRIu64 ") on device %d", addr, id.first, id.second, d->device);
    else if ((addr - b->addr) % BLOCK_MIN_SIZE)
        st = err_set(XSEG_ERROR_INVALID_VALUE, "xseg_pool_malloc_at: 0x%" PRIxPTR " is not a block address: blocks "
                     "start at multiples of %zu bytes from their segment's base (the block there starts at 0x%"
                     PRIxPTR ")", addr, BLOCK_MIN_SIZE, b->addr);
    else if (sleep_pool_asleep(d, pp)) /* asleep, going to sleep or waking: its pages are not its own */
        st = sleep_refuse(d, pp);
    else if (b->allocated || !block_in_free_index(b) || size > b->addr + b->size - addr)
        st = err_set(XSEG_ERROR_ILLEGAL_STATE, "xseg_pool_malloc_at: [0x%" PRIxPTR ", +%zu) is not inside one free, "
                     "mapped block of the pool (the block there: %zu bytes at 0x%" PRIxPTR ", %s)", addr, size,
                     b->size, b->addr, b->allocated ? "allocated" : b->mapped ? "pending" : "unmapped");
    size_t head = st ? 0 : addr - b->addr, tail = st ? 0 : b->addr + b->size - addr - size;
    struct block *h = head ? dev_block_spare(d) : NULL, *t = tail ? dev_block_spare(d) : NULL;
    if (!st && ((head && !h) || (tail && !t) || !ptrmap_reserve(&d->live, 1))) {
        struct block *got[2] = {h, t};
        for (int i = 0; i < 2; i++)
            if (got[i])
                dev_block_delete(d, got[i]); /* back to the spare list, untouched */
        st = err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory placing a block");
    }
    if (!st) {
        malloc_at_place(d, b, addr, size, h, t);
        bool put = ptrmap_put(&d->live, b->addr, b); /* room reserved above */
        xseg_assert(put);
        (void)put;
        if (hp && !hist_on_alloc(d, b, hp)) {
            (void)ptrmap_take(&d->live, b->addr);
            undo_alloc(d, b); /* merges head and tail back: the block as it was */
            st = err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory recording a placed block's history");
        }
    }
    dev_unlock(d);
    if (hp)
        hist_stack_unref(hm.stack); /* unless the block took it */
    return st;
}
