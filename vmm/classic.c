/* Classic segments at the driver boundary (see classic.h). */
#include <inttypes.h>
#include <stdio.h>

#include "vmm/classic.h"

#include "base/error.h"

xseg_status classic_alloc(size_t size, bool relaxed, int device, CUdeviceptr *out)
{
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    char what[96];
    *out = 0;
    CUresult r = relaxed ? drv->cuThreadExchangeStreamCaptureMode(&mode) : CUDA_SUCCESS;
    if (r != CUDA_SUCCESS) {
        /* cuMemAlloc in the thread's own mode could invalidate a capture: fail instead. */
        snprintf(what, sizeof what, "cuThreadExchangeStreamCaptureMode(RELAXED) for cuMemAlloc on device %d", device);
        xseg_status st = drv_fail(r, what);
        return st == XSEG_ERROR_OUT_OF_MEMORY ? XSEG_ERROR_DRIVER : st;
    }
    r = drv->cuMemAlloc(out, size);
    if (relaxed)
        (void)drv->cuThreadExchangeStreamCaptureMode(&mode);
    if (r == CUDA_SUCCESS)
        return XSEG_SUCCESS;
    snprintf(what, sizeof what, "cuMemAlloc(%zu bytes) on device %d", size, device);
    return drv_fail(r, what);
}

xseg_status classic_free(CUdeviceptr ptr, int device)
{
    CUresult r = drv->cuMemFree(ptr);
    if (r == CUDA_SUCCESS)
        return XSEG_SUCCESS;
    char what[96];
    snprintf(what, sizeof what, "cuMemFree(0x%" PRIxPTR ") on device %d", (uintptr_t)ptr, device);
    xseg_status st = drv_fail(r, what);
    return st == XSEG_ERROR_OUT_OF_MEMORY ? XSEG_ERROR_DRIVER : st;
}

static _Thread_local bool owner_oom; /* classic_take_owner_oom */

bool classic_take_owner_oom(void)
{
    bool v = owner_oom;
    owner_oom = false;
    return v;
}

xseg_status classic_alloc_owned(const xseg_pool_allocator *owner, size_t size, bool relaxed, int device,
                                CUstream stream, CUdeviceptr *out)
{
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    *out = 0;
    CUresult r = relaxed ? drv->cuThreadExchangeStreamCaptureMode(&mode) : CUDA_SUCCESS;
    if (r != CUDA_SUCCESS) {
        char what[112];
        snprintf(what, sizeof what, "cuThreadExchangeStreamCaptureMode(RELAXED) for a pool allocator on device %d",
                 device);
        xseg_status st = drv_fail(r, what);
        return st == XSEG_ERROR_OUT_OF_MEMORY ? XSEG_ERROR_DRIVER : st;
    }
    void *p = owner->alloc(size, device, stream, owner->user);
    if (relaxed)
        (void)drv->cuThreadExchangeStreamCaptureMode(&mode);
    owner_oom = !p;
    if (!p)
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "the pool's allocator returned no memory for %zu bytes on device %d",
                       size, device);
    if ((uintptr_t)p % 512) {
        owner->free(p, size, device, stream, owner->user);
        return err_set(XSEG_ERROR_INVALID_VALUE,
                       "the pool's allocator returned %p for %zu bytes on device %d: not 512-byte aligned (xseg's "
                       "blocks are); the segment was given back through its free",
                       p, size, device);
    }
    *out = (CUdeviceptr)(uintptr_t)p;
    return XSEG_SUCCESS;
}

void classic_free_owned(const xseg_pool_allocator *owner, CUdeviceptr ptr, size_t size, int device, CUstream stream)
{
    owner->free((void *)(uintptr_t)ptr, size, device, stream, owner->user);
}
