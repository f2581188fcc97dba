/*
 * Classic segments at the driver boundary: one cuMemAlloc range each (core/alloc.c and core/policy/release.c hold the
 * policy: sizes, when to allocate and release, the bookkeeping). Context: callers make the
 * device's context current. Locking: none of its own; callers may hold the device lock (or drop
 * it around classic_alloc, with release_lock_on_cudamalloc).
 */
#ifndef XSEG_VMM_CLASSIC_H
#define XSEG_VMM_CLASSIC_H

#include <stdbool.h>

#include "vmm/driver.h"

/*
 * cuMemAlloc @p size bytes for @p device (named in the message). @p relaxed: a capture may be
 * underway, so the calling thread switches to relaxed capture mode around the call (a GLOBAL
 * capture elsewhere would otherwise reject it and be invalidated), as PyTorch's
 * cudaMallocMaybeCapturing does; when the mode cannot be switched, nothing is allocated (a
 * driver error). @return XSEG_ERROR_OUT_OF_MEMORY when the device is full, XSEG_ERROR_DRIVER
 * otherwise, with the message naming the call.
 */
xseg_status classic_alloc(size_t size, bool relaxed, int device, CUdeviceptr *out);

/* cuMemFree @p ptr of @p device. Any failure is XSEG_ERROR_DRIVER naming the call. */
xseg_status classic_free(CUdeviceptr ptr, int device);

/*
 * A segment from a pool's own allocator (xseg_pool_allocator): @p owner's alloc(size, device,
 * stream), in relaxed capture mode when @p relaxed (as classic_alloc). @return
 * XSEG_ERROR_OUT_OF_MEMORY when it returns NULL (recoverable, as a full device);
 * XSEG_ERROR_INVALID_VALUE when the address is not 512-byte aligned (every block address of xseg
 * is): the segment went back through the owner's free. Nothing is allocated on failure.
 */
xseg_status classic_alloc_owned(const xseg_pool_allocator *owner, size_t size, bool relaxed, int device,
                                CUstream stream, CUdeviceptr *out);

/* Did this thread's last classic_alloc_owned get no memory from its owner? Reads and forgets it
 * (the OOM message names the owner's allocator instead of the device's memory). */
bool classic_take_owner_oom(void);

/* Give a segment of classic_alloc_owned back through @p owner's free (it cannot fail). */
void classic_free_owned(const xseg_pool_allocator *owner, CUdeviceptr ptr, size_t size, int device, CUstream stream);

#endif
