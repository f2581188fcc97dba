/* Events at the driver boundary (see event.h). */
#include "vmm/event.h"

xseg_status vevent_create(CUevent *ev)
{
    CUresult r = drv->cuEventCreate(ev, CU_EVENT_DISABLE_TIMING);
    return r == CUDA_SUCCESS ? XSEG_SUCCESS : drv_fail(r, "cuEventCreate(CU_EVENT_DISABLE_TIMING)");
}

void vevent_destroy(CUevent ev) { (void)drv->cuEventDestroy(ev); }

bool vevent_record(CUevent ev, CUstream stream) { return drv->cuEventRecord(ev, stream) == CUDA_SUCCESS; }

bool vevent_done(CUevent ev) { return drv->cuEventQuery(ev) == CUDA_SUCCESS; }

/* @p call(@p ev) with the thread in RELAXED capture mode, its mode restored after. */
static CUresult relaxed_call(CUresult (*call)(CUevent), CUevent ev)
{
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    bool relaxed = drv->cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS;
    CUresult r = call(ev);
    if (relaxed)
        (void)drv->cuThreadExchangeStreamCaptureMode(&mode);
    return r;
}

bool vevent_done_relaxed(CUevent ev) { return relaxed_call(drv->cuEventQuery, ev) == CUDA_SUCCESS; }

bool vevent_wait_relaxed(CUevent ev) { return relaxed_call(drv->cuEventSynchronize, ev) == CUDA_SUCCESS; }

bool vevent_wait(CUevent ev) { return drv->cuEventSynchronize(ev) == CUDA_SUCCESS; }
