/*
 * The device operations that allocate nothing (see devops.h): empty_cache, the memory fraction,
 * statistics and their resets, cache_info, base_allocation, peer access, history's start. Each
 * takes the device lock (dev_lock) and gives it back.
 */
#include "core/devops.h"

#include <stdio.h>

#include "base/error.h"
#include "core/device/check.h"
#include "core/device/placement.h"
#include "core/device/quarantine.h"
#include "core/policy/events.h"
#include "core/policy/expandable.h"
#include "core/policy/pools.h"
#include "core/policy/release.h"
#include "core/services/spill.h"
#include "core/services/trim.h"
#include "vmm/segment.h"

xseg_status devops_empty_cache(struct dev_alloc *d)
{
    dev_lock(d, DEV_NEED_OP);
    place_phase_reset(d);
    /* debug_stale_access: every quarantined block is checked (they stay quarantined; during a
     * capture they wait for its end), its findings delivered with the lock given back. */
    struct quar_batch batch = {0};
    xseg_status quar_st = XSEG_SUCCESS;
    char quar_msg[512];
    if (XSEG_UNLIKELY(d->quar.n)) {
        quar_st = quar_check_all(d, "empty_cache", false, NULL);
        if (quar_st != XSEG_SUCCESS)
            snprintf(quar_msg, sizeof quar_msg, "%s", err_message());
        quar_take(d, &batch);
    }
    xseg_status left_st;
    xseg_status st = release_cached_blocks(d, &left_st);
    if (XSEG_UNLIKELY(d->quar.stuck) && st == XSEG_SUCCESS && quar_st != XSEG_SUCCESS)
        st = err_set(quar_st, "empty_cache: %s", quar_msg); /* a canary restore failed again: its block stays quarantined */
    /* It waited for the pending frees' streams: a point for release_threshold_mb (core/services/trim.h),
     * which can only matter for what empty_cache keeps (a pool in use, a capture). */
    if (d->cfg.release_threshold != SIZE_MAX)
        trim_threshold(d, 0);
    /* Device memory went back: spilled pages come home where it allows (best effort). */
    if (XSEG_UNLIKELY(d->spill.host_bytes))
        (void)spill_promote(d, true);
    if (st == XSEG_SUCCESS && left_st != XSEG_SUCCESS) {
        /* Everything cached went back; only an earlier failure's leftover is still stuck. */
        st = left_st;
        err_prefix(st, "empty_cache: memory kept from an earlier driver failure could not be given back yet");
    }
    dev_unlock(d);
    if (XSEG_UNLIKELY(batch.n))
        quar_deliver(&batch);
    return st;
}

xseg_status devops_check_stale(struct dev_alloc *d, const char *when, bool drain, size_t *found)
{
    dev_lock(d, DEV_NEED_OP);
    /* Frees whose record_stream events completed enter the quarantine first (filled there). */
    if (ev_waiting(d) && !cap_underway(d))
        ev_process(d);
    xseg_status st = quar_check_all(d, when, drain, found);
    struct quar_batch batch;
    quar_take(d, &batch);
    dev_unlock(d);
    quar_deliver(&batch); /* the findings go out with the lock given back */
    return st;
}

xseg_status devops_stale_flush(struct dev_alloc *d)
{
    dev_lock(d, DEV_NEED_OP);
    if (ev_waiting(d) && !cap_underway(d))
        ev_process(d); /* frees whose record_stream events completed enter (and wait) first */
    xseg_status st = quar_flush(d, "xseg_stale_flush");
    struct quar_batch batch;
    quar_take(d, &batch); /* findings made as blocks left while their frees entered */
    dev_unlock(d);
    quar_deliver(&batch);
    return st;
}

xseg_status devops_set_fraction(struct dev_alloc *d, double fraction)
{
    dev_lock(d, DEV_NEED_OP);
    dev_apply_fraction(d, fraction);
    exp_pressure_reset(d);
    dev_unlock(d);
    return XSEG_SUCCESS;
}

double devops_get_fraction(struct dev_alloc *d)
{
    dev_lock(d, DEV_NEED_OP);
    double f = d->acct.fraction;
    dev_unlock(d);
    return f;
}

void devops_get_stats(struct dev_alloc *d, xseg_device_stats *out)
{
    dev_lock(d, DEV_NEED_NONE); /* statistics only: the slots' debts are folded into the copy */
    dev_refresh_cfg(d);
    dev_stats_copy(d, out);
    xseg_device_stats base = d->acct.acc_base;
    dev_unlock(d);
    stats_subtract_accumulated(out, &base);
}

void devops_reset_accumulated(struct dev_alloc *d)
{
    dev_lock(d, DEV_NEED_NONE); /* statistics only: the slots' debts are folded into the copy */
    xseg_device_stats now;
    dev_stats_copy(d, &now);
    d->acct.acc_base = now;
    dev_unlock(d);
}

/* PyTorch's cache_info_aux: *largest raised to the pool's largest free block. From the index
 * (bpool_largest_free: per stream, the bitmap's highest bin and its treap's last block), so a
 * call costs the same at any number of free blocks (cuDNN's benchmark mode asks per new shape). */
static void largest_free(const struct bpool *p, size_t *largest)
{
    const struct block *b = bpool_largest_free(p);
    if (b && b->size > *largest)
        *largest = b->size;
}

xseg_status devops_cache_info(struct dev_alloc *d, size_t *largest)
{
    if (*largest == 0) {
        size_t total = 0;
        xseg_status st = drv_ctx_ensure(d->info.primary_ctx);
        if (st == XSEG_SUCCESS)
            st = drv_mem_info(largest, &total);
        if (st != XSEG_SUCCESS)
            return err_prefix(st, "xseg_cache_info(device %d)", d->device);
    }
    dev_lock(d, DEV_NEED_SLOTS);
    largest_free(&d->small, largest);
    largest_free(&d->large, largest);
    for (struct priv_pool *pp = d->priv.pools; pp; pp = pp->next) {
        largest_free(&pp->small, largest);
        largest_free(&pp->large, largest);
    }
    dev_unlock(d);
    return XSEG_SUCCESS;
}

xseg_status devops_mem_info(struct dev_alloc *d, size_t *free_bytes, size_t *total_bytes)
{
    xseg_status st = drv_ctx_ensure(d->info.primary_ctx);
    if (st == XSEG_SUCCESS)
        st = drv_mem_info(free_bytes, total_bytes);
    return st == XSEG_SUCCESS ? st : err_prefix(st, "xseg_mem_get_info(device %d)", d->device);
}

xseg_status devops_base_allocation(struct dev_alloc *d, void *ptr, void **base, size_t *size, bool *owned)
{
    dev_lock(d, DEV_NEED_SLOTS);
    struct block *b = ptrmap_get(&d->live, (uintptr_t)ptr);
    xseg_status st = XSEG_SUCCESS;
    *owned = b != NULL;
    if (b && b->seg->vseg) {
        st = err_set(XSEG_ERROR_NOT_SUPPORTED,
                     "xseg_base_allocation: %p is a block of an expandable segment, whose pages cannot be "
                     "shared with cuIpcGetMemHandle (use xseg_ipc_export, or expandable_segments:False)",
                     ptr);
    } else if (b) {
        *base = (void *)b->seg->first->addr;
        if (size)
            *size = b->seg->size;
    }
    dev_unlock(d);
    return st;
}

void devops_reset_peaks(struct dev_alloc *d)
{
    dev_lock(d, DEV_NEED_SLOTS); /* a peak becomes a current: the slots' debts are paid first */
    dev_stats_reset_peaks(d);
    dev_unlock(d);
}

xseg_status devops_enable_peer(struct dev_alloc *d, int peer)
{
    dev_lock(d, DEV_NEED_SLOTS);
    for (int i = 0; i < d->npeers; i++) {
        if (d->peers[i] == peer) {
            dev_unlock(d);
            return XSEG_SUCCESS;
        }
    }
    xseg_status st = XSEG_SUCCESS;
    for (struct segrec *s = d->segs; s && st == XSEG_SUCCESS; s = s->next_seg)
        if (s->vseg)
            st = seg_add_peer(s->vseg, peer);
    if (st == XSEG_SUCCESS && d->npeers < ALLOC_MAX_DEVICES)
        d->peers[d->npeers++] = peer;
    dev_unlock(d);
    return st;
}

/* ---- history ----------------------------------------------------------------------------- */

void devops_history_start(struct dev_alloc *d)
{
    dev_lock(d, DEV_NEED_SLOTS);
    dev_fast_off(d);
    for (size_t i = 0; i < d->live.cap; i++) {
        struct block *b = ptrmap_block(&d->live, d->live.slots[i]);
        if (b && !b->recorded)
            b->recorded = true; /* with no stack: a side struct, if any, holds none */
    }
    dev_unlock(d);
}

/* ---- spill (core/services/spill.h) -------------------------------------------------------- */

xseg_status devops_promote(struct dev_alloc *d)
{
    dev_lock(d, DEV_NEED_OP);
    /* Room first: the cache goes back to the driver (as empty_cache) while pages are on host. */
    if (d->spill.host_bytes)
        (void)release_cached_blocks(d, NULL);
    xseg_status st = spill_promote(d, true);
    dev_unlock(d);
    return st;
}

xseg_status devops_spill_hint(struct dev_alloc *d, void *ptr, int hint, bool *owned)
{
    dev_lock(d, DEV_NEED_SLOTS);
    xseg_status st = spill_hint(d, ptr, hint, owned);
    dev_unlock(d);
    return st;
}

xseg_status devops_block_location(struct dev_alloc *d, void *ptr, int *location, size_t *host_bytes, int *numa_node,
                                  bool *owned)
{
    dev_lock(d, DEV_NEED_SLOTS);
    xseg_status st = spill_location(d, ptr, location, host_bytes, numa_node, owned);
    dev_unlock(d);
    return st;
}
