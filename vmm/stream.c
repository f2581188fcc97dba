/* Streams at the driver boundary (vmm/stream.h). */
#include "vmm/stream.h"

#include <stdbool.h>
#include <stdio.h>

#include "base/error.h"
#include "vmm/driver.h"

static bool is_capture_error(CUresult res)
{
    return res >= CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED && res <= CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
}

xseg_status vstream_wait(CUstream stream, const char *what)
{
    /* A synchronize is a capture-unsafe call: in the thread's default GLOBAL mode the driver
     * refuses it while any thread has a GLOBAL capture, whatever stream it names, and ends that
     * capture. Waiting for a stream outside every capture is safe, so the thread waits in RELAXED
     * mode; a capturing stream is still refused (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED). */
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    bool relaxed = drv->cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS;
    CUresult res = drv->cuStreamSynchronize(stream);
    if (relaxed)
        (void)drv->cuThreadExchangeStreamCaptureMode(&mode);
    if (res == CUDA_SUCCESS)
        return XSEG_SUCCESS;
    if (!is_capture_error(res) && drv->cuCtxSynchronize() == CUDA_SUCCESS)
        return XSEG_SUCCESS;
    char buf[256];
    snprintf(buf, sizeof buf, "cuStreamSynchronize(stream %p) %s", (void *)stream, what);
    xseg_status st = drv_fail(res, buf);
    return st == XSEG_ERROR_OUT_OF_MEMORY ? XSEG_ERROR_DRIVER : st;
}

xseg_status vstream_check(CUstream stream, const char *caller)
{
    /* The default streams always exist; and asking about the legacy one while a blocking stream
     * captures would itself invalidate that capture (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT). */
    if (!stream || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD)
        return XSEG_SUCCESS;
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult res = drv->cuStreamIsCapturing(stream, &cs);
    if (res == CUDA_SUCCESS)
        return XSEG_SUCCESS;
    if (res == CUDA_ERROR_INVALID_HANDLE || res == CUDA_ERROR_INVALID_VALUE || res == CUDA_ERROR_INVALID_CONTEXT ||
        res == CUDA_ERROR_CONTEXT_IS_DESTROYED)
        return err_set(XSEG_ERROR_INVALID_VALUE, "%s: stream %p is not a stream of this device (%s)", caller,
                       (void *)stream, drv_error_name(res));
    /* Any other failure says nothing about the stream: a driver error. */
    char what[160];
    snprintf(what, sizeof what, "%s: cuStreamIsCapturing(stream %p)", caller, (void *)stream);
    return drv_fail(res, what);
}

/* Services. */
bool vstream_idle(CUstream stream) { return drv->cuStreamQuery(stream) == CUDA_SUCCESS; }

bool vstream_default(CUstream stream)
{
    return !stream || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD;
}

xseg_status vstream_join(CUstream waiter, CUevent ev, CUstream stream, const char *what)
{
    if (ev && drv->cuEventRecord(ev, stream) == CUDA_SUCCESS && drv->cuStreamWaitEvent(waiter, ev, 0) == CUDA_SUCCESS)
        return XSEG_SUCCESS;
    return vstream_wait(stream, what);
}

xseg_status vctx_wait(const char *what)
{
    CUresult res = drv->cuCtxSynchronize();
    if (res == CUDA_SUCCESS)
        return XSEG_SUCCESS;
    char buf[256];
    snprintf(buf, sizeof buf, "cuCtxSynchronize %s", what);
    xseg_status st = drv_fail(res, buf);
    return st == XSEG_ERROR_OUT_OF_MEMORY ? XSEG_ERROR_DRIVER : st;
}

xseg_status vctx_wait_relaxed(const char *what)
{
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    bool relaxed = drv->cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS;
    xseg_status st = vctx_wait(what);
    if (relaxed)
        (void)drv->cuThreadExchangeStreamCaptureMode(&mode);
    return st;
}

xseg_status vstream_create(CUstream *out)
{
    *out = NULL;
    CUresult res = drv->cuStreamCreate(out, CU_STREAM_NON_BLOCKING);
    if (res == CUDA_SUCCESS)
        return XSEG_SUCCESS;
    *out = NULL;
    return drv_fail(res, "cuStreamCreate(CU_STREAM_NON_BLOCKING) for the copies of sleep and wake");
}

void vstream_destroy(CUstream stream)
{
    if (stream)
        (void)drv->cuStreamDestroy(stream);
}
