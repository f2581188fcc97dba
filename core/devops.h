/*
 * The device operations that allocate nothing, beside the allocator (core/alloc.h): what api/
 * calls for empty_cache, the memory fraction, statistics, cache_info, base_allocation, peer access
 * and history's start. Each takes the device lock and gives it back. Sleep and wake are the
 * services' (core/services/sleepwake.h), as trim is.
 */
#ifndef XSEG_CORE_DEVOPS_H
#define XSEG_CORE_DEVOPS_H

#include <stdbool.h>
#include <stddef.h>

#include "core/device/fast.h"

/* Release every cached block it can (PyTorch's empty_cache), then release_threshold_mb. */
xseg_status devops_empty_cache(struct dev_alloc *d);
/* debug_stale_access: check every quarantined block (@p when names the occasion), release them
 * all with @p drain, deliver the findings (core/device/quarantine.h); *@p found: findings made. */
xseg_status devops_check_stale(struct dev_alloc *d, const char *when, bool drain, size_t *found);
/* debug_stale_access: queue the quarantine's waiting fills now (quar_flush). */
xseg_status devops_stale_flush(struct dev_alloc *d);
xseg_status devops_set_fraction(struct dev_alloc *d, double fraction);
double devops_get_fraction(struct dev_alloc *d);
void devops_get_stats(struct dev_alloc *d, xseg_device_stats *out);
void devops_reset_peaks(struct dev_alloc *d);
/* Accumulated statistics start again from 0 (see acc_base). */
void devops_reset_accumulated(struct dev_alloc *d);
/* xseg_cache_info: a 0 in *largest becomes the driver's free memory, then *largest is raised to
 * the device's largest free mapped block (every pool, private ones included, as PyTorch's
 * cacheInfo) if that is larger. Read from the index: flat in the number of free blocks. */
xseg_status devops_cache_info(struct dev_alloc *d, size_t *largest);
/* xseg_mem_get_info: cuMemGetInfo in @p d's primary context. */
xseg_status devops_mem_info(struct dev_alloc *d, size_t *free_bytes, size_t *total_bytes);
/* The classic segment holding the live block at @p ptr: *owned = false when this device does not
 * own @p ptr (nothing else is set); XSEG_ERROR_NOT_SUPPORTED for a block of an expandable segment. */
xseg_status devops_base_allocation(struct dev_alloc *d, void *ptr, void **base, size_t *size, bool *owned);
xseg_status devops_enable_peer(struct dev_alloc *d, int peer);
/* History starts (lock taken here): every live block gets its free recorded, and malloc leaves
 * the fast path (dev_fast_update keeps it off while recording). */
void devops_history_start(struct dev_alloc *d);
/* Spill (core/services/spill.h): xseg_promote, xseg_spill_hint, xseg_block_location on one device. */
xseg_status devops_promote(struct dev_alloc *d);
xseg_status devops_spill_hint(struct dev_alloc *d, void *ptr, int hint, bool *owned);
xseg_status devops_block_location(struct dev_alloc *d, void *ptr, int *location, size_t *host_bytes, int *numa_node,
                                  bool *owned);

#endif
