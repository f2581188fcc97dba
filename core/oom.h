/*
 * The out-of-memory report (PyTorch's OOM path in DeviceCachingAllocator::malloc): num_ooms, the
 * history event, the OOM observers, the OOM snapshot, then the message, XSEG_ERROR_OUT_OF_MEMORY
 * with PyTorch's sentence (the device's total and free memory, what xseg holds allocated, in
 * private pools and reserved but unallocated) and the sentences of the modules that own them:
 * sleeping pools (core/services/sleep.h), budgets (core/services/group.h), the reclaim ladder's
 * rungs (core/reclaim.h), the snapshot (core/snapshot.h). Its own module: malloc reports out of
 * memory before any rung runs too (a request no device holds), so it is not the ladder's end only.
 */
#ifndef XSEG_CORE_OOM_H
#define XSEG_CORE_OOM_H

#include <stddef.h>

#include "core/device/device.h"

/* Report that a request of @p size bytes (a growth of @p alloc_size on @p stream) cannot be held:
 * returns XSEG_ERROR_OUT_OF_MEMORY with the message set. Lock held on entry and on return; given
 * back around the observers and the snapshot (they may call xseg, and the snapshot takes every
 * device's lock): nothing read before is trusted after. */
xseg_status oom_report(struct dev_alloc *d, size_t size, size_t alloc_size, CUstream stream);

#endif
