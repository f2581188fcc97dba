/*
 * Private memory pools and CUDA-graph capture (PyTorch's graph_pools, captures_underway,
 * beginAllocateToPool / endAllocateToPool / releasePool, and CUDAGraph's capture filter).
 *
 * A private pool (struct priv_pool, device.h) is two block pools of its own; alloc.c selects them
 * at pool selection (p.pool) for the allocations a route matches, and everything below pool
 * selection (best fit, split, merge, expandable growth, statistics) is the default pools' code.
 * A route is one allocate-to-pool in progress; routes are kept oldest first and matched newest
 * first. A pool lives while it has users, routes or segments: with no users its cached blocks
 * are released by release_cached_blocks (release.c) and its struct goes once no segment is left.
 *
 * Everything here runs under the device lock, except the driver's capture calls in
 * xseg_capture_begin / xseg_capture_end, which are made with it released (they may block, and
 * the route they need is set up or torn down under the lock on either side).
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/policy/pools.h"
#include "core/device/check.h"
#include "base/error.h"
#include "base/hostmem.h"
#include "base/vec.h"
#include "vmm/capture.h"

static inline bool id_eq(xseg_pool_id a, xseg_pool_id b) { return a.first == b.first && a.second == b.second; }

static struct priv_pool *pool_find(struct dev_alloc *d, xseg_pool_id id)
{
    lock_assert_held(&d->lock);
    for (struct priv_pool *pp = d->priv.pools; pp; pp = pp->next)
        if (id_eq(pp->id, id))
            return pp;
    return NULL;
}

struct priv_pool *pools_find(struct dev_alloc *d, xseg_pool_id id)
{
    lock_assert_held(&d->lock);
    return pool_find(d, id);
}

static bool pool_has_segments(const struct dev_alloc *d, const struct priv_pool *pp)
{
    lock_assert_held(&d->lock);
    for (const struct segrec *s = d->segs; s; s = s->next_seg)
        if (s->pool == &pp->small || s->pool == &pp->large)
            return true;
    return false;
}

static struct priv_pool *pool_new(struct dev_alloc *d, xseg_pool_id id)
{
    lock_assert_held(&d->lock);
    struct priv_pool *pp = xs_calloc(1, sizeof *pp);
    if (!pp)
        return NULL;
    pp->id = id;
    pp->small.is_small = true;
    pp->small.is_private = pp->large.is_private = true;
    pp->small.stat_index = XSEG_STAT_SMALL_POOL;
    pp->large.stat_index = XSEG_STAT_LARGE_POOL;
    pp->next = d->priv.pools;
    d->priv.pools = pp;
    return pp;
}

static void pool_unlink_free(struct dev_alloc *d, struct priv_pool *pp)
{
    lock_assert_held(&d->lock);
    for (struct priv_pool **link = &d->priv.pools; *link; link = &(*link)->next) {
        if (*link == pp) {
            *link = pp->next;
            if (pp->owner.forget) /* the owner's last call: its allocator may go */
                pp->owner.forget(pp->owner.user);
            xs_free(pp);
            return;
        }
    }
}

static ptrdiff_t route_of_pool(const struct dev_alloc *d, const struct priv_pool *pp)
{
    lock_assert_held(&d->lock);
    for (size_t i = 0; i < d->priv.nroutes; i++)
        if (d->priv.routes[i].pool == pp)
            return (ptrdiff_t)i;
    return -1;
}

static ptrdiff_t route_of_capture(const struct dev_alloc *d, CUstream stream)
{
    lock_assert_held(&d->lock);
    for (size_t i = 0; i < d->priv.nroutes; i++)
        if (d->priv.routes[i].by_capture && d->priv.routes[i].capture_stream == stream)
            return (ptrdiff_t)i;
    return -1;
}

static void route_remove(struct dev_alloc *d, size_t i)
{
    lock_assert_held(&d->lock);
    memmove(&d->priv.routes[i], &d->priv.routes[i + 1], (d->priv.nroutes - i - 1) * sizeof *d->priv.routes);
    d->priv.nroutes--;
}

/* Forget @p pp if nothing refers to it any more (no users, no route, no segment). */
static void pool_maybe_forget(struct dev_alloc *d, struct priv_pool *pp)
{
    lock_assert_held(&d->lock);
    if (pp->use_count == 0 && route_of_pool(d, pp) < 0 && !pool_has_segments(d, pp) && !pp->sleep)
        pool_unlink_free(d, pp);
}

/* ---- used by alloc.c, release.c and trim.c (device lock held, asserted) ------------------- */

static bool route_matches(struct dev_alloc *d, struct pool_route *r, CUstream stream, xseg_status *st)
{
    lock_assert_held(&d->lock);
    *st = XSEG_SUCCESS;
    if (!r->by_capture)
        return !r->filter || r->filter(stream, r->user) != 0;
    if (stream == r->capture_stream)
        return true;
    if (!stream)
        return false; /* the legacy stream never captures */
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    unsigned long long id = 0;
    if ((*st = drv_ctx_ensure(d->info.primary_ctx)) != XSEG_SUCCESS)
        return false;
    if (r->capture_id == 0) {
        /* The id could not be read when the capture began: read it now, or the streams that
         * join the capture would find no pool. */
        if ((*st = vmm_capture_id(r->capture_stream, d->device, &cs, &id)) != XSEG_SUCCESS)
            return false;
        if (cs != CU_STREAM_CAPTURE_STATUS_ACTIVE)
            return false;
        r->capture_id = id;
    }
    /* Another stream belongs to the capture once it joined it (waited on an event recorded on a
     * capturing stream): the driver gives it the same capture id (PyTorch's filter). */
    if ((*st = vmm_capture_id(stream, d->device, &cs, &id)) != XSEG_SUCCESS)
        return false;
    return cs == CU_STREAM_CAPTURE_STATUS_ACTIVE && id == r->capture_id;
}

xseg_status pools_select(struct dev_alloc *d, CUstream stream, struct priv_pool **out)
{
    lock_assert_held(&d->lock);
    *out = NULL;
    for (size_t i = d->priv.nroutes; i-- > 0;) {
        xseg_status st;
        if (route_matches(d, &d->priv.routes[i], stream, &st)) {
            *out = d->priv.routes[i].pool;
            return XSEG_SUCCESS;
        }
        if (st != XSEG_SUCCESS)
            return st;
    }
    return XSEG_SUCCESS;
}

void pools_reap(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    struct priv_pool *pp = d->priv.pools;
    while (pp) {
        struct priv_pool *next = pp->next;
        pool_maybe_forget(d, pp);
        pp = next;
    }
}

void pools_destroy(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    xseg_assert(!d->priv.nroutes);
    pools_reap(d);
    if (d->priv.pools)
        return; /* a pool still has users or segments: nothing more to give back */
    xs_free(d->priv.routes);
    d->priv = (struct pool_state){0};
}

size_t pools_cached_bytes(struct dev_alloc *d)
{
    lock_assert_held(&d->lock);
    size_t bytes = 0;
    for (const struct segrec *s = d->segs; s; s = s->next_seg) {
        if (!dev_pool_owner(d, s->pool) || s->asleep) /* a sleeping pool's pages are not there */
            continue;
        for (const struct block *b = s->first; b; b = b->next)
            if (block_in_free_index(b))
                bytes += b->size;
    }
    return bytes;
}

/* ---- begin / end / release ---------------------------------------------------------------- */

static const char *id_text(xseg_pool_id id, char buf[48])
{
    snprintf(buf, 48, "{%" PRIu64 ", %" PRIu64 "}", id.first, id.second);
    return buf;
}

/* Add a route to @p id (creating the pool, adding a use). Nothing changes on failure. */
static xseg_status begin_locked(struct dev_alloc *d, const char *fn, xseg_pool_id id, const struct pool_route *tmpl)
{
    lock_assert_held(&d->lock);
    char buf[48];
    struct priv_pool *pp = pool_find(d, id);
    if (pp && route_of_pool(d, pp) >= 0)
        return err_set(XSEG_ERROR_ILLEGAL_STATE, "%s: pool %s is already recording on device %d (end it first)",
                       fn, id_text(id, buf), d->device);
    if (tmpl->by_capture && route_of_capture(d, tmpl->capture_stream) >= 0)
        return err_set(XSEG_ERROR_ILLEGAL_STATE, "%s: stream %p already has a capture begun by xseg_capture_begin",
                       fn, (void *)tmpl->capture_stream);
    if (!VEC_RESERVE(d->priv.routes, d->priv.caproutes, d->priv.nroutes + 1))
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    if (!pp && !(pp = pool_new(d, id)))
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "%s: out of host memory for pool %s", fn, id_text(id, buf));
    pp->use_count++;
    struct pool_route *r = &d->priv.routes[d->priv.nroutes++];
    dev_fast_off(d);
    *r = *tmpl;
    r->pool = pp;
    return XSEG_SUCCESS;
}

/* Undo begin_locked for the route at @p i: remove it, drop the use it added. */
static void unbegin_locked(struct dev_alloc *d, size_t i)
{
    lock_assert_held(&d->lock);
    struct priv_pool *pp = d->priv.routes[i].pool;
    route_remove(d, i);
    pp->use_count--;
    pool_maybe_forget(d, pp);
}

xseg_status pools_begin(struct dev_alloc *d, xseg_pool_id pool, xseg_stream_filter filter, void *user)
{
    struct pool_route tmpl = {.filter = filter, .user = user};
    dev_lock(d, DEV_NEED_SLOTS);
    xseg_status st = begin_locked(d, "xseg_begin_allocate_to_pool", pool, &tmpl);
    dev_unlock(d);
    return st;
}

xseg_status pools_end(struct dev_alloc *d, xseg_pool_id pool)
{
    int device = d->device;
    xseg_status st = XSEG_SUCCESS;
    char buf[48];
    dev_lock(d, DEV_NEED_SLOTS);
    struct priv_pool *pp = pool_find(d, pool);
    ptrdiff_t i = pp ? route_of_pool(d, pp) : -1;
    if (i < 0) {
        st = err_set(XSEG_ERROR_ILLEGAL_STATE, "xseg_end_allocate_to_pool: pool %s is not recording on device %d",
                     id_text(pool, buf), device);
    } else if (d->priv.routes[i].by_capture) {
        st = err_set(XSEG_ERROR_ILLEGAL_STATE,
                     "xseg_end_allocate_to_pool: pool %s records the capture of stream %p; end it with "
                     "xseg_capture_end", id_text(pool, buf), (void *)d->priv.routes[i].capture_stream);
    } else {
        route_remove(d, (size_t)i); /* the use stays until xseg_release_pool */
    }
    dev_unlock(d);
    return st;
}

xseg_status pools_release(struct dev_alloc *d, xseg_pool_id pool)
{
    int device = d->device;
    xseg_status st = XSEG_SUCCESS;
    char buf[48];
    dev_lock(d, DEV_NEED_SLOTS);
    struct priv_pool *pp = pool_find(d, pool);
    if (!pp) {
        st = err_set(XSEG_ERROR_INVALID_VALUE, "xseg_release_pool: no pool %s on device %d", id_text(pool, buf),
                     device);
    } else if (pp->use_count == 0) {
        st = err_set(XSEG_ERROR_INVALID_VALUE, "xseg_release_pool: pool %s on device %d has no users left "
                     "(released already)", id_text(pool, buf), device);
    } else if (pp->use_count == 1 && route_of_pool(d, pp) >= 0) {
        st = err_set(XSEG_ERROR_ILLEGAL_STATE, "xseg_release_pool: pool %s on device %d is still recording; end "
                     "it first", id_text(pool, buf), device);
    } else {
        pp->use_count--;
        pool_maybe_forget(d, pp); /* holds no memory: nothing to wait for */
    }
    dev_unlock(d);
    return st;
}

int pools_use_count(struct dev_alloc *d, xseg_pool_id pool)
{
    int count;
    dev_lock(d, DEV_NEED_SLOTS);
    struct priv_pool *pp = pool_find(d, pool);
    count = pp ? pp->use_count : 0;
    dev_unlock(d);
    return count;
}

xseg_status pools_live_blocks(struct dev_alloc *d, xseg_pool_id pool, void **ptrs, size_t cap, size_t *n)
{
    char buf[48];
    xseg_status st = XSEG_SUCCESS;
    size_t found = 0;
    dev_lock(d, DEV_NEED_SLOTS);
    struct priv_pool *pp = pool_find(d, pool);
    if (!pp) {
        st = err_set(XSEG_ERROR_INVALID_VALUE, "xseg_pool_live_blocks: no pool %s on device %d", id_text(pool, buf),
                     d->device);
    } else {
        /* A walk of the device's segments and of this pool's blocks under the lock: linear in the
         * heap, which is why it serves only checks off the malloc/free path (cudagraph trees'
         * checkPoolLiveAllocations). A sleeping pool's blocks stay allocated, so they count. */
        for (const struct segrec *s = d->segs; s; s = s->next_seg) {
            if (s->pool != &pp->small && s->pool != &pp->large)
                continue;
            for (const struct block *b = s->first; b; b = b->next)
                if (b->allocated) {
                    if (found < cap)
                        ptrs[found] = (void *)b->addr;
                    found++;
                }
        }
        *n = found;
    }
    dev_unlock(d);
    return st;
}

xseg_status pools_retain(struct dev_alloc *d, xseg_pool_id pool)
{
    char buf[48];
    xseg_status st = XSEG_SUCCESS;
    dev_lock(d, DEV_NEED_SLOTS);
    struct priv_pool *pp = pool_find(d, pool);
    if (!pp && !(pp = pool_new(d, pool)))
        st = err_set(XSEG_ERROR_OUT_OF_MEMORY, "xseg_pool_retain: out of host memory for pool %s",
                     id_text(pool, buf));
    else
        pp->use_count++;
    dev_unlock(d);
    return st;
}

static bool owner_eq(const xseg_pool_allocator *a, const xseg_pool_allocator *b)
{
    return a->alloc == b->alloc && a->free == b->free && a->forget == b->forget && a->user == b->user;
}

xseg_status pools_retain_owned(struct dev_alloc *d, xseg_pool_id pool, const xseg_pool_allocator *owner)
{
    char buf[48];
    xseg_status st = XSEG_SUCCESS;
    dev_lock(d, DEV_NEED_SLOTS);
    struct priv_pool *pp = pool_find(d, pool);
    if (pp && !owner_eq(&pp->owner, owner))
        st = err_set(XSEG_ERROR_INVALID_VALUE,
                     "xseg_pool_retain_owned: pool %s exists on device %d with %s; a pool's allocator is fixed for "
                     "its life", id_text(pool, buf), d->device, pp->owner.alloc ? "another allocator" : "xseg's own memory");
    else if (!pp && !(pp = pool_new(d, pool)))
        st = err_set(XSEG_ERROR_OUT_OF_MEMORY, "xseg_pool_retain_owned: out of host memory for pool %s",
                     id_text(pool, buf));
    else {
        pp->owner = *owner;
        pp->use_count++;
    }
    dev_unlock(d);
    return st;
}

/* ---- capture ------------------------------------------------------------------------------ */

xseg_status pools_capture_begin(struct dev_alloc *d, CUstream stream, xseg_pool_id id, int capture_mode)
{
    int device = d->device;
    xseg_status st;
    /* Route first, then begin: nothing can allocate on the stream in between, and undoing a
     * route is simpler than undoing a capture. */
    struct pool_route tmpl = {.by_capture = true, .capture_stream = stream};
    dev_lock(d, DEV_NEED_SLOTS);
    st = begin_locked(d, "xseg_capture_begin", id, &tmpl);
    dev_unlock(d);
    if (st != XSEG_SUCCESS)
        return st;

    unsigned long long cid = 0;
    st = drv_ctx_ensure(d->info.primary_ctx);
    if (st == XSEG_SUCCESS)
        st = vmm_capture_begin(stream, (CUstreamCaptureMode)capture_mode, device, &cid);
    dev_lock(d, DEV_NEED_SLOTS);
    ptrdiff_t i = route_of_capture(d, stream);
    if (st != XSEG_SUCCESS) {
        if (i >= 0)
            unbegin_locked(d, (size_t)i);
    } else if (i >= 0) {
        d->priv.routes[i].capture_id = cid;
    }
    dev_unlock(d);
    return st == XSEG_SUCCESS ? st : err_prefix(st, "xseg_capture_begin");
}

xseg_status pools_capture_end(struct dev_alloc *d, CUstream stream, CUgraph *graph)
{
    int device = d->device;
    xseg_status st;
    dev_lock(d, DEV_NEED_SLOTS);
    bool known = route_of_capture(d, stream) >= 0;
    dev_unlock(d);
    if (!known)
        return err_set(XSEG_ERROR_ILLEGAL_STATE,
                       "xseg_capture_end: stream %p on device %d has no capture begun by xseg_capture_begin",
                       (void *)stream, device);
    st = drv_ctx_ensure(d->info.primary_ctx);
    if (st == XSEG_SUCCESS)
        st = vmm_capture_end(stream, device, graph);
    /* A failure that left the capture open (the end was never made, or failed before ending it):
     * keep routing, so that the capture goes on and a second call can end it. */
    bool still_open = false;
    if (st != XSEG_SUCCESS) {
        struct err_kept end = err_keep(); /* a failed query writes its own */
        bool capturing = false;
        still_open = vmm_stream_capturing(stream, device, &capturing) == XSEG_SUCCESS && capturing;
        err_set(st, "%s%s", end.msg, still_open ? "; the capture is still open (call xseg_capture_end again)" : "");
    }
    /* Otherwise stop routing whatever the driver said: the capture is over, and a route left
     * behind would keep the device in capture mode (PyTorch's capture_end leaks it there). */
    dev_lock(d, DEV_NEED_SLOTS);
    ptrdiff_t i = route_of_capture(d, stream);
    if (i >= 0 && !still_open)
        route_remove(d, (size_t)i); /* the use stays until xseg_release_pool */
    dev_unlock(d);
    if (st != XSEG_SUCCESS) {
        *graph = NULL;
        return err_prefix(st, "xseg_capture_end");
    }
    return XSEG_SUCCESS;
}
