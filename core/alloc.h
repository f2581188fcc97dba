/*
 * The device allocator: one allocator per device, one lock each (base/lock.h; the
 * state itself is core/device/device.h). PyTorch's DeviceCachingAllocator semantics (rounding, best fit
 * per stream, split/merge, deferred frees, OOM path, statistics) over classic cuMemAlloc segments
 * and expandable VMM segments (vmm/segment.h). These are the entry points api/ calls to allocate
 * and free; each takes the device lock and gives it back (the operations that allocate nothing:
 * core/devops.h). The top of core/: it calls the policy modules (events,
 * expandable, pools, trim, sleep, snapshot, ...), which never call it.
 */
#ifndef XSEG_CORE_ALLOC_H
#define XSEG_CORE_ALLOC_H

#include <stdbool.h>
#include <stddef.h>

#include "core/device/fast.h"

/* malloc of @p size bytes on device @p d and @p stream into *@p out: the block, or NULL for size 0
 * (success, nothing counted) and on every failure. The arguments come in xseg_malloc's order, the
 * device where its index was, so that xseg_malloc's tail call moves no register (4 instructions
 * of the 93 of a cached pair). */
xseg_status alloc_malloc(void **out, size_t size, struct dev_alloc *d, CUstream stream);
/* Free @p ptr if this device owns it: *owned = false (and nothing happens) when it does not. */
xseg_status alloc_free(struct dev_alloc *d, void *ptr, bool *owned);

/* alloc_free for the only device: a pointer it does not own is alloc_free_unknown's error. One
 * call with no out-parameter, for xseg_free's common case. */
xseg_status alloc_free_sole(struct dev_alloc *d, void *ptr);
/* The error of xseg_free for a pointer no device owns (XSEG_ERROR_INVALID_VALUE naming it). */
xseg_status alloc_free_unknown(void *ptr);
/* Allocate exactly [addr, addr + size) from the free, mapped block of private pool @p id that
 * holds it (xseg_pool_malloc_at). */
xseg_status alloc_malloc_at(struct dev_alloc *d, xseg_pool_id id, uintptr_t addr, size_t size);

#endif
