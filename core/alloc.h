/*
 * The device allocator's operations: one allocator per device, one lock each (base/lock.h; the
 * state itself is core/device/device.h). PyTorch's DeviceCachingAllocator semantics (rounding, best fit
 * per stream, split/merge, deferred frees, OOM path, statistics) over classic cuMemAlloc segments
 * and expandable VMM segments (vmm/segment.h). These are the entry points api/ calls; each takes
 * the device lock and gives it back. The top of core/: it calls the policy modules (events,
 * expandable, pools, trim, sleep, snapshot, ...), which never call it.
 */
#ifndef XSEG_CORE_ALLOC_H
#define XSEG_CORE_ALLOC_H

#include <stdbool.h>
#include <stddef.h>

#include "core/device/fast.h"

xseg_status alloc_malloc(struct dev_alloc *d, size_t size, CUstream stream, void **out);
/* Free @p ptr if this device owns it: *owned = false (and nothing happens) when it does not. */
xseg_status alloc_free(struct dev_alloc *d, void *ptr, bool *owned);

/* alloc_free for the only device: a pointer it does not own is alloc_free_unknown's error. One
 * call with no out-parameter, for xseg_free's common case. */
xseg_status alloc_free_sole(struct dev_alloc *d, void *ptr);
/* The error of xseg_free for a pointer no device owns (XSEG_ERROR_INVALID_VALUE naming it). */
xseg_status alloc_free_unknown(void *ptr);
xseg_status alloc_record_stream(struct dev_alloc *d, void *ptr, CUstream stream, bool *owned);
xseg_status alloc_empty_cache(struct dev_alloc *d);
/* xseg_sleep / xseg_wake on one device (core/services/sleep.h), then release_threshold_mb (core/services/trim.h):
 * the pool's streams were waited for, or its pages mapped again. */
xseg_status alloc_sleep(struct dev_alloc *d, xseg_pool_id pool, unsigned flags, const char *path);
xseg_status alloc_wake(struct dev_alloc *d, xseg_pool_id pool);
xseg_status alloc_set_fraction(struct dev_alloc *d, double fraction);
double alloc_get_fraction(struct dev_alloc *d);
/* Allocate exactly [addr, addr + size) from the free, mapped block of private pool @p id that
 * holds it (xseg_pool_malloc_at). */
xseg_status alloc_malloc_at(struct dev_alloc *d, xseg_pool_id id, uintptr_t addr, size_t size);
void alloc_get_stats(struct dev_alloc *d, xseg_device_stats *out);
void alloc_reset_peaks(struct dev_alloc *d);
/* Spill (core/services/spill.h): xseg_promote, xseg_spill_hint, xseg_block_location on one device. */
xseg_status alloc_promote(struct dev_alloc *d);
xseg_status alloc_spill_hint(struct dev_alloc *d, void *ptr, int hint, bool *owned);
xseg_status alloc_block_location(struct dev_alloc *d, void *ptr, int *location, size_t *host_bytes, bool *owned);
/* Accumulated statistics start again from 0 (see acc_base). */
void alloc_reset_accumulated(struct dev_alloc *d);
/* xseg_cache_info: a 0 in *largest becomes the driver's free memory, then *largest is raised to
 * the device's largest free mapped block (every pool) if that is larger. */
xseg_status alloc_cache_info(struct dev_alloc *d, size_t *largest);
/* The classic segment holding the live block at @p ptr: *owned = false when this device does not
 * own @p ptr (nothing else is set); XSEG_ERROR_NOT_SUPPORTED for a block of an expandable segment. */
xseg_status alloc_base_allocation(struct dev_alloc *d, void *ptr, void **base, size_t *size, bool *owned);
xseg_status alloc_enable_peer(struct dev_alloc *d, int peer);
/* History starts (lock taken here): every live block gets its free recorded, and malloc leaves
 * the fast path (dev_fast_update keeps it off while recording). */
void alloc_history_start(struct dev_alloc *d);

#endif
