/* Classic segments at the driver boundary (see classic.h). */
#include <inttypes.h>
#include <stdio.h>

#include "vmm/classic.h"

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
