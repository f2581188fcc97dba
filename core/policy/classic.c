/*
 * Classic segments: growth by cuMemAlloc (see classic.h).
 */
#include "core/policy/classic.h"

#include "base/error.h"
#include "base/hostmem.h"
#include "core/device/check.h"
#include "core/index/stats.h"
#include "core/policy/observe.h"
#include "core/process/history.h"
#include "vmm/classic.h"

/* classic_grow's cuMemAlloc with the lock given back (release_lock_on_cudamalloc). The bins
 * reference is given back meanwhile (dev_check, which any unlock may run, finds no reference
 * without a segment) and taken again after (*held: it is); a pool that fell asleep meanwhile gets
 * nothing (the memory is freed). */
static xseg_status classic_alloc_unlocked(struct dev_alloc *d, struct bpool *pool, CUstream stream, size_t size,
                                          bool relax, classic_asleep_fn asleep, CUdeviceptr *ptr, bool *held)
{
    bpool_bins_release(pool, stream);
    dev_unlock(d);
    xseg_status st = classic_alloc(size, relax, d->device, ptr);
    dev_lock(d, DEV_NEED_SLOTS);
    *held = bpool_bins_acquire(pool, stream);
    xseg_status refused = XSEG_SUCCESS;
    if (st == XSEG_SUCCESS && (!*held || asleep(d, pool, &refused))) {
        (void)classic_free(*ptr, d->device);
        st = *held ? refused : err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory for segment metadata");
    }
    return st;
}

xseg_status classic_grow(struct dev_alloc *d, struct bpool *pool, CUstream stream, size_t size,
                         classic_asleep_fn asleep, struct block **out)
{
    lock_assert_held(&d->lock);
    if (drv_ctx_ensure(d->info.primary_ctx) != XSEG_SUCCESS)
        return XSEG_ERROR_DRIVER;
    struct segrec *sr = xs_calloc(1, sizeof *sr);
    struct block *b = dev_block_new(d);
    /* The segment's reference on its bins: indexing its blocks later never allocates. */
    if (!sr || !b || !bpool_bins_acquire(pool, stream)) {
        xs_free(sr);
        if (b)
            dev_block_delete(d, b);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory for segment metadata");
    }
    CUdeviceptr ptr = 0;
    xseg_status st;
    /* A capture may be underway: cuMemAlloc in relaxed capture mode (vmm/classic.h). The mode is
     * per thread, so dropping the lock is fine. */
    bool relax = cap_underway(d), held = true;
    const xseg_pool_allocator *owner = dev_pool_allocator(d, pool);
    if (owner) /* the owner's alloc runs under the lock, as PyTorch calls a MemPool's raw_alloc */
        st = classic_alloc_owned(owner, size, relax, d->device, stream, &ptr);
    else if (d->cfg.release_lock_on_cudamalloc)
        st = classic_alloc_unlocked(d, pool, stream, size, relax, asleep, &ptr, &held);
    else
        st = classic_alloc(size, relax, d->device, &ptr);
    if (st != XSEG_SUCCESS) {
        if (held)
            bpool_bins_release(pool, stream);
        xs_free(sr);
        dev_block_delete(d, b);
        return st;
    }
    d->acct.total_allocated_memory += size;
    b->addr = (uintptr_t)ptr;
    b->size = size;
    b->stream = stream;
    sr->pool = pool;
    block_set_seg(b, sr);
    b->mapped = true;
    sr->first = b;
    sr->last = b;
    sr->stream = stream;
    sr->size = size;
    dev_seglist_add(d, sr);
    stat_add_pool(d->acct.stats.segment, pool->stat_index, 1);
    stat_add_pool(d->acct.stats.reserved_bytes, pool->stat_index, (int64_t)size);
    if (size >= d->cfg.max_split_size) {
        sr->oversize = true;
        stat_add(&d->acct.stats.oversize_segments, 1);
    }
    d->acct.stats.num_device_alloc++;
    *out = b;
    if (XSEG_UNLIKELY(hist_mode()))
        hist_record(HIST_SEGMENT_ALLOC, d->device, b->addr, size, (uintptr_t)stream, d->hist_cur);
    obs_classic(d, b->addr, size, XSEG_SEGMENT_MAP);
    return XSEG_SUCCESS;
}
