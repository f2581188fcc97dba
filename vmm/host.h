/*
 * Pinned host memory and the asynchronous copies and memset of sleep and wake (services,
 * core/services/sleep.c): a sleeping pool's live bytes wait in pinned host memory (from the host caching
 * allocator, core/services/hostalloc.c), and wake copies them back or clears the pages.
 *
 * Context: callers make the device's context current first (drv_ctx_ensure). Locking: none of
 * its own except the list of host frees to retry; callers may hold a device lock.
 * Errors: each returns XSEG_SUCCESS or a status whose message names the call and its arguments.
 */
#ifndef XSEG_VMM_HOST_H
#define XSEG_VMM_HOST_H

#include <stdbool.h>

#include <cuda.h>

#include "base/common.h"

/* cuMemHostAlloc(PORTABLE) of @p bytes: portable, so it can be freed with any context current.
 * XSEG_ERROR_OUT_OF_MEMORY when the driver says so. */
xseg_status vhost_alloc(size_t bytes, void **out);

/* cuMemFreeHost @p p (NULL: nothing). A failure keeps it for vhost_retry (with device @p dev's
 * primary context current then), so nothing leaks; the caller goes on either way. */
void vhost_free(void *p, CUdevice dev);

/* cuMemHostRegister(PORTABLE) of [p, p + bytes) (host memory the caller owns), and its undo.
 * Failures name the call; an unregister that fails leaves the range pinned (the caller keeps it). */
xseg_status vhost_register(void *p, size_t bytes);
xseg_status vhost_unregister(void *p);

/* Retry the host frees that failed; the first failure is reported. Thread-safe. */
xseg_status vhost_retry(void);
/* Host frees waiting for a retry. */
size_t vhost_pending(void);

/* Enqueue on @p stream: a copy device -> pinned host, host -> device, or a memset to zero. */
xseg_status vhost_copy_dtoh(void *dst, CUdeviceptr src, size_t bytes, CUstream stream);
xseg_status vhost_copy_htod(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream);
/* One cuMemcpyBatchAsync of @p n copies (srcs[i] -> dsts[i], sizes[i] bytes; host or device
 * addresses, unified addressing) on @p stream, which must not be the legacy NULL stream, with one
 * attribute for all: source accessed in stream order. Only where vhost_batch_supported(). A failure
 * names the call, the batch and its first and last copies: CUDA 13.0's call does not say which copy
 * failed (12.8's failIdx is gone). */
bool vhost_batch_supported(void);
xseg_status vhost_copy_batch(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t n, CUstream stream);
xseg_status vhost_zero(CUdeviceptr dst, size_t bytes, CUstream stream);
/* Enqueue on @p stream a memset of every byte to @p value (debug_stale_access's pattern). */
xseg_status vhost_fill(CUdeviceptr dst, unsigned char value, size_t bytes, CUstream stream);

#endif
