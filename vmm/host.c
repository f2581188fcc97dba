/* Pinned host memory and asynchronous copies at the driver boundary (see host.h). */
#include "vmm/host.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/error.h"
#include "base/hostmem.h"
#include "base/fork.h"
#include "base/vec.h"
#include "base/witness.h"
#include "vmm/driver.h"

xseg_status vhost_alloc(size_t bytes, void **out)
{
    *out = NULL;
    CUresult r = drv->cuMemHostAlloc(out, bytes, CU_MEMHOSTALLOC_PORTABLE);
    if (r == CUDA_SUCCESS)
        return XSEG_SUCCESS;
    *out = NULL;
    char what[96];
    snprintf(what, sizeof what, "cuMemHostAlloc(%zu bytes, PORTABLE)", bytes);
    return drv_fail(r, what);
}

xseg_status vhost_register(void *p, size_t bytes)
{
    CUresult r = drv->cuMemHostRegister(p, bytes, CU_MEMHOSTREGISTER_PORTABLE);
    if (r == CUDA_SUCCESS)
        return XSEG_SUCCESS;
    char what[96];
    snprintf(what, sizeof what, "cuMemHostRegister(%p, %zu bytes, PORTABLE)", p, bytes);
    return drv_fail(r, what);
}

xseg_status vhost_unregister(void *p)
{
    CUresult r = drv->cuMemHostUnregister(p);
    if (r == CUDA_SUCCESS)
        return XSEG_SUCCESS;
    char what[64];
    snprintf(what, sizeof what, "cuMemHostUnregister(%p)", p);
    return drv_fail(r, what);
}

/* Host frees that failed, retried by vhost_retry (the leftovers of vmm/segment.c call it). */
struct host_left {
    void *p;
    CUdevice dev;
};
/* This file's process state. */
static struct host_proc {
    pthread_mutex_t lock;
    struct host_left *left;
    size_t nleft, capleft;
} host_proc = {.lock = PTHREAD_MUTEX_INITIALIZER};
FORK_MUTEX_AT(FORK_RANK_VMM_HOST, host_left_lock, host_proc.lock)

void vhost_free(void *p, CUdevice dev)
{
    if (!p || drv->cuMemFreeHost(p) == CUDA_SUCCESS)
        return;
    mutex_lock(&host_proc.lock);
    if (VEC_RESERVE(host_proc.left, host_proc.capleft, host_proc.nleft + 1))
        host_proc.left[host_proc.nleft++] = (struct host_left){p, dev};
    /* else out of host memory as well: the pinned buffer is lost, as it was before the list */
    mutex_unlock(&host_proc.lock);
}

size_t vhost_pending(void)
{
    mutex_lock(&host_proc.lock);
    size_t n = host_proc.nleft;
    mutex_unlock(&host_proc.lock);
    return n;
}

xseg_status vhost_retry(void)
{
    mutex_lock(&host_proc.lock);
    xseg_status first = XSEG_SUCCESS;
    size_t keep = 0;
    for (size_t i = 0; i < host_proc.nleft; i++) {
        struct host_left l = host_proc.left[i];
        CUcontext ctx = NULL;
        CUresult r = drv->cuDevicePrimaryCtxRetain(&ctx, l.dev);
        if (r == CUDA_SUCCESS) {
            r = drv_ctx_ensure(ctx) == XSEG_SUCCESS ? drv->cuMemFreeHost(l.p) : CUDA_ERROR_INVALID_CONTEXT;
            (void)drv->cuDevicePrimaryCtxRelease(l.dev);
        }
        if (r == CUDA_SUCCESS)
            continue;
        if (first == XSEG_SUCCESS) {
            char what[96];
            snprintf(what, sizeof what, "cuMemFreeHost(%p), kept from an earlier failure", l.p);
            first = drv_fail(r, what);
        }
        host_proc.left[keep++] = l;
    }
    host_proc.nleft = keep;
    if (!keep) { /* all freed: the list goes too */
        xs_free(host_proc.left);
        host_proc.left = NULL;
        host_proc.capleft = 0;
    }
    mutex_unlock(&host_proc.lock);
    return first;
}

static xseg_status copy_fail(CUresult r, const char *call, uintptr_t dst, uintptr_t src, size_t bytes,
                             CUstream stream)
{
    char what[160];
    snprintf(what, sizeof what, "%s(0x%" PRIxPTR " <- 0x%" PRIxPTR ", %zu bytes, stream %p)", call, dst, src, bytes,
             (void *)stream);
    xseg_status st = drv_fail(r, what);
    return st == XSEG_ERROR_OUT_OF_MEMORY ? XSEG_ERROR_DRIVER : st;
}

xseg_status vhost_copy_dtoh(void *dst, CUdeviceptr src, size_t bytes, CUstream stream)
{
    CUresult r = drv->cuMemcpyDtoHAsync(dst, src, bytes, stream);
    return r == CUDA_SUCCESS ? XSEG_SUCCESS
                             : copy_fail(r, "cuMemcpyDtoHAsync", (uintptr_t)dst, (uintptr_t)src, bytes, stream);
}

xseg_status vhost_copy_htod(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream)
{
    CUresult r = drv->cuMemcpyHtoDAsync(dst, src, bytes, stream);
    return r == CUDA_SUCCESS ? XSEG_SUCCESS
                             : copy_fail(r, "cuMemcpyHtoDAsync", (uintptr_t)dst, (uintptr_t)src, bytes, stream);
}

bool vhost_batch_supported(void) { return drv_memcpy_batch != NULL; }

xseg_status vhost_copy_batch(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t n, CUstream stream)
{
    if (!n)
        return XSEG_SUCCESS;
    if (!drv_memcpy_batch)
        return err_set(XSEG_ERROR_NOT_SUPPORTED, "cuMemcpyBatchAsync: the CUDA driver lacks it (CUDA 13.0's "
                       "cuMemcpyBatchAsync_v2)");
    /* STREAM: the source is read in stream order, as the single copies read theirs. */
    CUmemcpyAttributes attr = {.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM};
    size_t idx = 0;
    CUresult r = drv_memcpy_batch(dsts, srcs, sizes, n, &attr, &idx, 1, stream);
    if (r == CUDA_SUCCESS)
        return XSEG_SUCCESS;
    char what[256];
    snprintf(what, sizeof what, "cuMemcpyBatchAsync(%zu copies, stream %p; which failed is not reported: the first "
             "0x%llx <- 0x%llx, %zu bytes, the last 0x%llx <- 0x%llx, %zu bytes)", n, (void *)stream,
             (unsigned long long)dsts[0], (unsigned long long)srcs[0], sizes[0], (unsigned long long)dsts[n - 1],
             (unsigned long long)srcs[n - 1], sizes[n - 1]);
    xseg_status st = drv_fail(r, what);
    return st == XSEG_ERROR_OUT_OF_MEMORY ? XSEG_ERROR_DRIVER : st;
}

xseg_status vhost_fill(CUdeviceptr dst, unsigned char value, size_t bytes, CUstream stream)
{
    CUresult r = drv->cuMemsetD8Async(dst, value, bytes, stream);
    return r == CUDA_SUCCESS ? XSEG_SUCCESS : copy_fail(r, "cuMemsetD8Async", (uintptr_t)dst, 0, bytes, stream);
}

xseg_status vhost_zero(CUdeviceptr dst, size_t bytes, CUstream stream)
{
    CUresult r = drv->cuMemsetD8Async(dst, 0, bytes, stream);
    return r == CUDA_SUCCESS ? XSEG_SUCCESS : copy_fail(r, "cuMemsetD8Async", (uintptr_t)dst, 0, bytes, stream);
}
