/*
 * Giving cached memory back (core/services/trim.h): one pass shared by xseg_trim, release_threshold_mb
 * and idle reclaim.
 *
 * Why "largest first": each run given back costs its segment's stream a synchronize (or, without
 * waiting, a query) and two driver calls per page; large runs give the most bytes per stream
 * touched, and the small gaps between live blocks are the likeliest to be reused by the next
 * small request. Ties go to the older segment so that a replay repeats its own figures (virtual
 * addresses differ between runs).
 */
#include "core/services/trim.h"

#include <stdlib.h>
#include <time.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/hostmem.h"
#include "base/vec.h"
#include "core/device/check.h"
#include "core/policy/events.h"
#include "core/policy/expandable.h"
#include "core/policy/pools.h"
#include "core/policy/release.h"
#include "core/services/sleep.h"
#include "core/index/stats.h"
#include "core/services/spill.h"
#include "vmm/segment.h"
#include "vmm/stream.h"

size_t trim_cached_bytes(const struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    int64_t reserved = stats_all_current(d->acct.stats.reserved_bytes);
    /* Sleeping pools' live blocks hold no reserved page (core/services/sleep.h), nor do spilled
     * pages (core/services/spill.h: on host memory). */
    int64_t allocated = stats_all_current(d->acct.stats.allocated_bytes) - (int64_t)sleep_allocated_bytes(d) -
                        d->acct.stats.spilled_bytes.current;
    return reserved > allocated ? (size_t)(reserved - allocated) : 0;
}

struct trim_cand {
    struct block *b;
    size_t bytes; /* what giving it back would release */
};

static int cand_cmp(const void *pa, const void *pb)
{
    const struct trim_cand *a = pa, *b = pb;
    if (a->bytes != b->bytes)
        return a->bytes > b->bytes ? -1 : 1;
    if (a->b == b->b)
        return 0;
    if (a->b->expandable != b->b->expandable)
        return a->b->expandable ? 1 : -1; /* a whole classic segment: no page walk */
    if (a->b->expandable)
        return exp_block_older(a->b, b->b) ? -1 : 1;
    return a->b->addr < b->b->addr ? -1 : 1;
}

/* Append the candidates of @p pool to (*v, *n); false on host OOM. */
static bool collect(const struct dev_alloc *d, struct bpool *pool, bool idle_only, struct trim_cand **v, size_t *n,
                    size_t *cap)
{
    struct block **arr;
    size_t na;
    /* Smaller blocks hold no whole segment nor granule (struct dev_alloc's release_floor). */
    if (!bpool_collect_free_from(pool, d->release_floor, &arr, &na))
        return false;
    for (size_t i = 0; i < na; i++) {
        struct block *b = arr[i];
        if (idle_only && block_gc_base(b) >= pool->idle_mark)
            continue; /* used (or merged into) less than idle_release_ms ago */
        if (b->seg->asleep)
            continue; /* its pool sleeps (core/services/sleep.h): only a wake touches its pages */
        size_t bytes;
        if (b->expandable)
            bytes = exp_whole_page_bytes(b);
        else
            bytes = block_is_split(b) || segrec_held(b->seg) ? 0 : b->size; /* held: a registered range */
        if (!bytes)
            continue;
        if (!VEC_RESERVE(*v, *cap, *n + 1)) {
            xs_free(arr);
            return false;
        }
        (*v)[(*n)++] = (struct trim_cand){b, bytes};
    }
    xs_free(arr);
    return true;
}

xseg_status trim_cache(struct dev_alloc *d, size_t keep, enum trim_wait wait, bool idle_only, size_t *released)
{
    lock_assert_held(&d->lock);
    if (released)
        *released = 0;
    size_t cached = trim_cached_bytes(d);
    if (cached <= keep)
        return XSEG_SUCCESS;
    /* Unmapping or freeing during a capture would invalidate it (and the graph's addresses). */
    if (dev_capture_underway(d))
        return XSEG_SUCCESS;

    struct trim_cand *v = NULL;
    size_t n = 0, cap = 0;
    bool ok = collect(d, &d->large, idle_only, &v, &n, &cap) && collect(d, &d->small, idle_only, &v, &n, &cap);
    for (struct priv_pool *pp = d->priv.pools; ok && pp; pp = pp->next)
        if (pp->use_count == 0)
            ok = collect(d, &pp->large, idle_only, &v, &n, &cap) && collect(d, &pp->small, idle_only, &v, &n, &cap);
    if (!ok) {
        xs_free(v);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory listing cached blocks to trim");
    }
    if (n > 1)
        qsort(v, n, sizeof *v, cand_cmp);

    struct stream_memo memo = {0};
    xseg_status st = XSEG_SUCCESS;
    size_t need = cached - keep, got = 0;
    /* Under pressure: streams known idle first, then (second pass) wait once per stream. */
    int passes = wait == TRIM_PRESSURE ? 2 : 1;
    for (int pass = 0; pass < passes; pass++)
    for (size_t i = 0; i < n && got < need && st == XSEG_SUCCESS; i++) {
        struct block *b = v[i].b;
        if (!b)
            continue; /* given back in the first pass */
        bool known = wait == TRIM_KNOWN_COMPLETE || (wait == TRIM_PRESSURE && pass == 0);
        /* Known idle: a default stream's query, or xseg's event on a program's stream (never the
         * stream itself, which may be destroyed: release.h memo_idle); under pressure the rest is
         * waited for in the second pass. */
        if (known && !memo_idle(d, &memo, b))
            continue;
        /* One wait per stream and pass (not one per run: empty_cache of 7,500 isolated free pages
         * of one stream waits once). Classic segments: cuMemFree waits by itself. */
        if (!known && b->expandable && (st = memo_wait(d, &memo, b)) != XSEG_SUCCESS)
            break;
        v[i].b = NULL;
        size_t before = d->acct.total_allocated_memory;
        if (b->expandable) {
            /* Chunks are whole: the callee takes as few of this run's highest chunks as cover the
             * rest of the need. Earlier unmaps never delete a later candidate: they merge only
             * unmapped neighbours, and candidates are mapped. */
            st = exp_unmap_pages(d, b, need - got, true);
        } else {
            st = release_block(d, b);
        }
        got += before - d->acct.total_allocated_memory;
    }
    memo_free(&memo);
    xs_free(v);
    exp_release_empty_segments(d);
    if (d->priv.pools)
        pools_reap(d);
    if (released)
        *released = got;
    return st;
}

xseg_status trim_pressure(struct dev_alloc *d, size_t need, size_t *released)
{
    lock_assert_held(&d->lock);
    size_t cached = trim_cached_bytes(d);
    return trim_cache(d, cached > need ? cached - need : 0, TRIM_PRESSURE, false, released);
}

void trim_threshold(struct dev_alloc *d, size_t handing_out)
{
    lock_assert_held(&d->lock);
    size_t threshold = d->cfg.release_threshold;
    if (threshold == SIZE_MAX || d->cfg.idle_release_ms || trim_cached_bytes(d) <= threshold + handing_out)
        return;
    release_note_poll(d); /* records seen complete: the next frees record again */
    threshold = threshold > SIZE_MAX - handing_out ? SIZE_MAX : threshold + handing_out;
    /* A failure leaves correct bookkeeping and is retried at the next point; the call that got
     * here did not ask for a release, so it does not report one. */
    (void)trim_cache(d, threshold, TRIM_KNOWN_COMPLETE, false, NULL);
}

xseg_status trim_device(struct dev_alloc *d, size_t keep, size_t *released)
{
    dev_lock(d, DEV_NEED_OP);
    /* Blocks whose record_stream events have completed go back to their pools first; pending
     * ones are not waited for (empty_cache does that). Event queries are illegal during a
     * capture, and nothing is released then anyway. */
    if (ev_waiting(d) && !cap_underway(d))
        ev_process(d);
    xseg_status st = trim_cache(d, keep, TRIM_SYNC, false, released);
    /* The streams it synchronized are known idle now: release_threshold_mb applies as well. */
    if (st == XSEG_SUCCESS && d->cfg.release_threshold < keep)
        trim_threshold(d, 0);
    /* Device memory went back: spilled pages come home where it allows (best effort). */
    if (XSEG_UNLIKELY(d->spill.host_bytes))
        (void)spill_promote(d, true);
    dev_fast_update(d);
    dev_unlock(d);
    return st;
}

static void pool_tick(struct bpool *p, uint64_t now, uint64_t window)
{
    p->tick_ns[p->tick_next] = now;
    p->tick_count[p->tick_next] = p->get_free_blocks_call_count++;
    p->tick_next = (p->tick_next + 1) % BPOOL_IDLE_TICKS;
    /* The newest tick at least `window` old: blocks stamped at or before its clock are idle. */
    uint64_t best_t = 0;
    bool found = false;
    for (unsigned i = 0; i < BPOOL_IDLE_TICKS; i++) {
        uint64_t t = p->tick_ns[i];
        if (t && now - t >= window && (!found || t > best_t)) {
            best_t = t;
            p->idle_mark = p->tick_count[i] + 1;
            found = true;
        }
    }
    if (!found)
        p->idle_mark = 0; /* nothing known idle yet */
}

void trim_idle_tick(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    unsigned ms = d->cfg.idle_release_ms;
    if (!ms)
        return;
    uint64_t now = (uint64_t)clock_mono_ns();
    uint64_t window = (uint64_t)ms * 1000000ull;
    if (d->idle_tick_ns && now - d->idle_tick_ns < window / 4)
        return;
    d->idle_tick_ns = now;
    pool_tick(&d->small, now, window);
    pool_tick(&d->large, now, window);
    for (struct priv_pool *pp = d->priv.pools; pp; pp = pp->next) {
        pool_tick(&pp->small, now, window);
        pool_tick(&pp->large, now, window);
    }
    /* release_threshold_mb is the cache to keep: idle runs go back down to it, not below (a
     * server keeps that much for its next burst and gives the rest back once idle). */
    size_t keep = d->cfg.release_threshold == SIZE_MAX ? 0 : d->cfg.release_threshold;
    release_note_poll(d); /* records a window old seen complete: the next frees record again */
    (void)trim_cache(d, keep, TRIM_KNOWN_COMPLETE, true, NULL);
}
