/* xseg_shutdown (core/shutdown.h). */
#include "core/shutdown.h"

#include "base/error.h"
#include "base/hostmem.h"
#include "core/alloc.h"
#include "core/devops.h"
#include "core/policy/capreuse.h"
#include "core/device/check.h"
#include "core/device/quarantine.h"
#include "core/policy/events.h"
#include "core/services/group.h"
#include "core/process/history.h"
#include "core/services/hostalloc.h"
#include "core/policy/ipc.h"
#include "core/policy/observe.h"
#include "core/policy/pools.h"
#include "core/policy/registry.h"
#include "core/runtime.h"
#include "core/process/settings.h"
#include "core/services/sleep.h"
#include "core/services/spill.h"
#include "core/services/sleeptags.h"
#include "core/snapshot.h"

/* Refuse what cannot be undone safely: a capture under way (its graph would point at freed
 * memory) or a sleeping pool (its pages are lent out; xseg_wake first). */
static xseg_status shutdown_check(struct dev_alloc *d)
{
    xseg_status st = XSEG_SUCCESS;
    dev_lock(d, DEV_NEED_OP);
    bool by_capture = false;
    for (size_t i = 0; i < d->priv.nroutes; i++)
        by_capture |= d->priv.routes[i].by_capture;
    (void)dev_capture_underway(d); /* drops the streams seen capturing that finished */
    if (by_capture || d->cap.ncapturing)
        st = err_set(XSEG_ERROR_ILLEGAL_STATE,
                     "xseg_shutdown: a capture is under way on device %d; end it (xseg_capture_end or "
                     "cuStreamEndCapture) first", d->device);
    else if (d->sleep.nasleep)
        st = err_set(XSEG_ERROR_ILLEGAL_STATE, "xseg_shutdown: %u pool%s of device %d sleep%s; wake %s first",
                     d->sleep.nasleep, d->sleep.nasleep == 1 ? "" : "s", d->device, d->sleep.nasleep == 1 ? "s" : "",
                     d->sleep.nasleep == 1 ? "it" : "them");
    dev_unlock(d);
    return st;
}

/* The addresses of every live block of @p d (*out: xs_free it; NULL when none). */
static xseg_status shutdown_live(struct dev_alloc *d, void ***out, size_t *n)
{
    dev_lock(d, DEV_NEED_OP);
    fast_settle(d, FAST_ALL, NULL); /* a slot's block is allocated or free again, as it counts */
    size_t count = 0;
    for (struct segrec *s = d->segs; s; s = s->next_seg)
        for (struct block *b = s->first; b; b = b->next)
            count += b->allocated;
    void **v = count ? xs_malloc(count * sizeof *v) : NULL;
    if (count && !v) {
        dev_unlock(d);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "xseg_shutdown: out of host memory listing %zu live blocks",
                       count);
    }
    size_t k = 0;
    for (struct segrec *s = d->segs; s; s = s->next_seg)
        for (struct block *b = s->first; b; b = b->next)
            if (b->allocated)
                v[k++] = (void *)b->addr;
    dev_unlock(d);
    *out = v;
    *n = k;
    return XSEG_SUCCESS;
}

/* End the pools' recordings (none is a capture: shutdown_check) and release their uses. */
static xseg_status shutdown_pools(struct dev_alloc *d)
{
    for (;;) {
        dev_lock(d, DEV_NEED_OP);
        bool any = d->priv.nroutes > 0;
        xseg_pool_id id = any ? d->priv.routes[0].pool->id : (xseg_pool_id){0, 0};
        dev_unlock(d);
        if (!any)
            break;
        xseg_status st = pools_end(d, id);
        if (st != XSEG_SUCCESS)
            return st;
    }
    for (;;) {
        dev_lock(d, DEV_NEED_OP);
        xseg_pool_id id = {0, 0};
        bool any = false;
        for (struct priv_pool *pp = d->priv.pools; pp && !any; pp = pp->next)
            if (pp->use_count > 0) {
                id = pp->id;
                any = true;
            }
        dev_unlock(d);
        if (!any)
            return XSEG_SUCCESS;
        xseg_status st = pools_release(d, id);
        if (st != XSEG_SUCCESS)
            return st;
    }
}

/* Empty @p d: its blocks freed (pointers into them are invalid from here), its pools released,
 * every segment and pooled event given back, the statistics started again. */
static xseg_status shutdown_device(struct dev_alloc *d)
{
    void **live = NULL;
    size_t n = 0;
    xseg_status st = shutdown_live(d, &live, &n);
    for (size_t i = 0; st == XSEG_SUCCESS && i < n; i++) {
        bool owned = false;
        st = alloc_free(d, live[i], &owned);
    }
    xs_free(live);
    if (st == XSEG_SUCCESS)
        st = shutdown_pools(d);
    if (st == XSEG_SUCCESS)
        st = devops_empty_cache(d); /* waits for the pending frees' events */
    if (st == XSEG_SUCCESS && quar_count(d, NULL)) {
        /* debug_stale_access: the quarantine is checked and drains, then its blocks go too */
        st = devops_check_stale(d, "xseg_shutdown", true, NULL);
        if (st == XSEG_SUCCESS)
            st = devops_empty_cache(d);
    }
    if (st != XSEG_SUCCESS)
        return err_prefix(st, "xseg_shutdown on device %d", d->device);
    dev_lock(d, DEV_NEED_OP);
    if (d->segs) {
        dev_unlock(d);
        return err_set(XSEG_ERROR_DRIVER, "xseg_shutdown: device %d still holds segments the driver would not take "
                       "back; call xseg_shutdown again", d->device);
    }
    ev_destroy(d);
    quar_destroy(d);
    sleep_teardown(d);
    spill_teardown(d);
    tags_teardown(d);
    capreuse_reset(d);
    pools_destroy(d);
    d->cfg_gen = 0; /* the next lock takes the configuration (and its memory fraction) afresh */
    dev_unlock(d);
    devops_reset_peaks(d);
    devops_reset_accumulated(d);
    return XSEG_SUCCESS;
}

xseg_status shutdown_process(void)
{
    if (rt_forked_child())
        return err_set(XSEG_ERROR_ILLEGAL_STATE, "xseg_shutdown: this process was forked from one that had "
                       "initialised CUDA; the parent's GPU state is not this process's to free");
    xseg_status st = XSEG_SUCCESS;
    for (int i = 0; i < ALLOC_MAX_DEVICES && st == XSEG_SUCCESS; i++) {
        struct dev_alloc *d = rt_device_peek(i);
        if (d)
            st = shutdown_check(d);
    }
    /* Registrants release every page first; one that does not: refused, nothing changed. */
    if (st == XSEG_SUCCESS)
        st = reg_shutdown(rt_device_peek);
    if (st != XSEG_SUCCESS)
        return st;
    /* debug_stale_access: the host quarantine is checked and drains while the observers are attached. */
    (void)hostalloc_check_stale("xseg_shutdown", true, NULL);
    /* The defaults first: the idle thread stops (joined) before the devices are emptied. */
    settings_reset();
    group_detach_all(); /* responders joined before the devices are emptied */
    if ((st = rt_reset()) != XSEG_SUCCESS)
        return st;
    if ((st = ipc_close_all()) != XSEG_SUCCESS)
        return err_prefix(st, "xseg_shutdown");
    for (int i = 0; i < ALLOC_MAX_DEVICES && st == XSEG_SUCCESS; i++) {
        struct dev_alloc *d = rt_device_peek(i);
        if (d)
            st = shutdown_device(d);
    }
    if (st != XSEG_SUCCESS)
        return st;
    /* The host cache: its event thread stops, its free pinned segments go back, and its arrays
     * when no block is left; live pinned blocks stay the program's (xseg_host_free them). */
    if ((st = hostalloc_shutdown()) != XSEG_SUCCESS)
        return err_prefix(st, "xseg_shutdown");
    rt_teardown(); /* every device emptied: their structs, maps and slabs go too */
    hist_shutdown();
    obs_detach_all();
    snapshot_oom_reset();
    return XSEG_SUCCESS;
}
