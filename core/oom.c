/*
 * The out-of-memory report (see oom.h): PyTorch's message from the device's figures, with the
 * sentences their owners write (the budgets', the rungs', the snapshot's).
 */
#include "core/oom.h"

#include <stdio.h>

#include "base/error.h"
#include "core/device/check.h"
#include "core/index/stats.h"
#include "core/policy/pools.h"
#include "core/process/history.h"
#include "core/process/settings.h"
#include "core/reclaim.h"
#include "core/services/group.h"
#include "core/services/sleep.h"
#include "core/snapshot.h"
#include "vmm/classic.h"
#include "vmm/driver.h"

xseg_status oom_report(struct dev_alloc *d, size_t size, size_t alloc_size, CUstream stream)
{
    lock_assert_held(&d->lock);
    /* The last refusal was the address space's (a new segment's reservation), not memory's. */
    bool va = drv_take_va_oom();
    /* Or a pool's owner's: its alloc returned no memory (xseg_pool_allocator). */
    bool owner = classic_take_owner_oom();
    size_t dfree = 0, dtotal = d->info.total_mem;
    if (drv_ctx_ensure(d->info.primary_ctx) == XSEG_SUCCESS)
        (void)drv_mem_info(&dfree, &dtotal);
    d->acct.stats.num_ooms++;
    /* A sleeping pool's live blocks count as allocated but hold no reserved page; nor do spilled
     * pages (the spill sentence says how many). */
    size_t asleep = sleep_allocated_bytes(d);
    size_t allocated = (size_t)stats_all_current(d->acct.stats.allocated_bytes) - asleep -
                       (size_t)d->acct.stats.spilled_bytes.current;
    size_t reserved = (size_t)stats_all_current(d->acct.stats.reserved_bytes);
    /* PyTorch's "allocated in private pools": what graphs' pools hold cached (reserved for their
     * replays, not releasable), counted with the allocated memory rather than the unallocated. */
    size_t in_private = d->priv.pools ? pools_cached_bytes(d) : 0;
    bool set_fraction = d->acct.set_fraction;
    size_t allowed = d->acct.allowed_memory_maximum;
    bool expandable = d->use_expandable;
    int device = d->device;
    if (XSEG_UNLIKELY(hist_mode()))
        hist_record(HIST_OOM, device, dfree, alloc_size, (uintptr_t)stream, d->hist_cur);

    dev_unlock(d);
    /* Observers run first: they may call xseg (and overwrite this thread's message). */
    settings_run_oom_observers(device, alloc_size, set_fraction ? allowed : dtotal, dfree);
    /* Then the OOM snapshot, when one is asked for (it takes every device's lock). */
    char snap_info[640];
    snapshot_on_oom(snap_info, sizeof snap_info);
    dev_lock(d, DEV_NEED_SLOTS);

    char s_req[32], s_tot[32], s_free[32], s_allowed[32], s_alloc[32], s_unalloc[32], s_priv[32], s_asleep[32];
    char rungs_info[1424], budget_info[640];
    reclaim_oom_info(d, rungs_info, sizeof rungs_info); /* a sentence a rung that has one */
    group_budget_oom_info(d, alloc_size, budget_info, sizeof budget_info);
    char allowed_info[64] = "", over[128] = "", private_info[96] = "", asleep_info[96] = "";
    if (asleep)
        snprintf(asleep_info, sizeof asleep_info, " %s more is allocated in sleeping pools (xseg_sleep).",
                 err_format_size(asleep, s_asleep));
    size_t unalloc = reserved > allocated + in_private ? reserved - allocated - in_private : 0;
    if (in_private)
        snprintf(private_info, sizeof private_info, "with %s allocated in private pools (e.g., CUDA Graphs), ",
                 err_format_size(in_private, s_priv));
    if (set_fraction)
        snprintf(allowed_info, sizeof allowed_info, "%s allowed; ", err_format_size(allowed, s_allowed));
    if (size > dtotal)
        snprintf(over, sizeof over, " The request exceeds the device's total memory of %s.",
                 err_format_size(dtotal, s_allowed));
    return err_set(XSEG_ERROR_OUT_OF_MEMORY,
                   "%s. Tried to allocate %s. GPU %d has a total capacity of %s of "
                   "which %s is free. %sOf the allocated memory %s is allocated by xseg, %sand %s is "
                   "reserved by xseg but unallocated.%s%s%s%s%s%s",
                   va ? "Out of virtual address space: cuMemAddressReserve could not reserve the addresses "
                        "of a new segment (the address space is exhausted or limited; device memory is not)"
                   : owner ? "Out of memory in a pool of its owner's memory: the pool's allocator "
                             "(xseg_pool_allocator, a MemPool's allocator) returned no memory for a new segment"
                           : "CUDA out of memory",
                   err_format_size(alloc_size, s_req), device, err_format_size(dtotal, s_tot),
                   err_format_size(dfree, s_free), allowed_info, err_format_size(allocated + in_private, s_alloc),
                   private_info, err_format_size(unalloc, s_unalloc), asleep_info, budget_info, rungs_info, over,
                   expandable ? "" : " If reserved but unallocated memory is large try setting "
                                     "expandable_segments:True to avoid fragmentation.",
                   snap_info);
}
