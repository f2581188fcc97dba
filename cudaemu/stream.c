/*
 * Streams, events, stream capture and the test hold.
 *
 * Work model: work on a stream completes at once, unless a test holds the stream
 * (cudaemu_stream_hold). Each cuEventRecord on a held stream is a unit of pending work with a
 * sequence number; the event stays CUDA_ERROR_NOT_READY (and cuStreamQuery of the stream too)
 * until that work completes. Work completes when the test releases the hold, or when someone
 * waits for it: cuStreamSynchronize of the stream, cuCtxSynchronize, cuStreamSynchronize of the
 * legacy NULL stream (which waits for every blocking stream), or cuEventSynchronize of the event
 * (completes the stream's work up to that event). Waiting does not end the hold: work recorded
 * afterwards is pending again, so a test can keep a stream stalled across several waits.
 * cuStreamWaitEvent is treated as satisfied at once (cross-stream ordering is not modelled).
 *
 * Capture. Following the driver API's documentation of cuStreamBeginCapture and
 * cuThreadExchangeStreamCaptureMode ("potentially unsafe API calls"), and the CUDA Programming
 * Guide's "Prohibited and Unhandled Operations" for stream capture:
 *   - a thread whose interaction mode is not RELAXED may not make a potentially unsafe call while
 *     it has a capture of its own that is not RELAXED, or (thread mode GLOBAL only) while another
 *     thread has a GLOBAL capture. Such a call returns CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and
 *     invalidates those captures (cuStreamEndCapture then returns
 *     CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and no graph).
 *   - cudaemu's unsafe calls: cuMemAlloc, cuMemFree, cuEventQuery. Measured on an H100 (driver
 *     580.159.04, tests/driver/test_vmm.c capture table): those three are rejected in GLOBAL
 *     mode; cuMemUnmap, cuMemMap and cuMemSetAccess are not.
 *   - synchronizing or querying a capturing stream, or cuCtxSynchronize while any stream
 *     captures, is invalid whatever the modes: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and the
 *     capture is invalidated. Synchronizing the legacy NULL stream while a blocking stream
 *     captures gives CUDA_ERROR_STREAM_CAPTURE_IMPLICIT and invalidates that capture.
 *   - the legacy NULL stream cannot capture (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED).
 *   - cuEventRecord on a capturing stream is allowed; the event is then complete for queries.
 * All state is under emu.lock; the capture interaction mode is per thread.
 */
#include <stdlib.h>

#include "cudaemu/emu.h"

static _Thread_local CUstreamCaptureMode thread_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
static _Thread_local char thread_token;   /* its address identifies the thread */

CUstream emu_stream_resolve_locked(CUstream s)
{
    if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
        return &emu.null_stream;
    return emu_map_get(&emu.streams, (uint64_t)(uintptr_t)s);
}

static void stream_complete(CUstream s) { s->completed = s->submitted; }

void emu_streams_complete_all_locked(void)
{
    stream_complete(&emu.null_stream);
    size_t pos = 0;
    CUstream s;
    while ((s = emu_map_next(&emu.streams, &pos, NULL)))
        stream_complete(s);
}

static void capture_invalidate(CUstream s)
{
    if (s->capture == EMU_CAP_ACTIVE)
        s->capture = EMU_CAP_INVALIDATED;
}

CUresult emu_capture_unsafe_call_locked(void)
{
    if (!emu.captures_active || thread_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_SUCCESS;
    bool prohibited = false;
    size_t pos = 0;
    CUstream s;
    while ((s = emu_map_next(&emu.streams, &pos, NULL))) {
        if (s->capture != EMU_CAP_ACTIVE || s->capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
            continue;
        bool own = s->capture_thread == &thread_token;
        if (own || (thread_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                    s->capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
            capture_invalidate(s);
            prohibited = true;
        }
    }
    return prohibited ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

/* ---- streams ---- */

CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    EMU_ENTER(cuStreamCreate);
    if (!phStream || (Flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    if (!emu_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    CUstream s = calloc(1, sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->flags = Flags;
    emu_lock();
    int bad = emu_map_put(&emu.streams, (uint64_t)(uintptr_t)s, s);
    emu_unlock();
    if (bad) {
        free(s);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *phStream = s;
    return CUDA_SUCCESS;
}

/* Like the driver, destroying a stream lets its pending work complete (a held stream's events
 * become complete) and ends a capture on it. */
CUresult CUDAAPI cuStreamDestroy(CUstream hStream)
{
    EMU_ENTER(cuStreamDestroy);
    if (!hStream || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD)
        return CUDA_ERROR_INVALID_HANDLE;
    emu_lock();
    CUstream s = emu_map_del(&emu.streams, (uint64_t)(uintptr_t)hStream);
    if (!s) {
        emu_unlock();
        return CUDA_ERROR_INVALID_HANDLE;
    }
    if (s->capture != EMU_CAP_NONE)
        emu.captures_active--;
    size_t pos = 0;
    CUevent e;
    while ((e = emu_map_next(&emu.events, &pos, NULL)))
        if (e->stream == s)
            e->stream = NULL;
    emu_unlock();
    free(s);
    return CUDA_SUCCESS;
}

/* Synchronize of the legacy stream while a blocking stream captures. Lock held. */
static CUresult stream_legacy_capture_check(void)
{
    CUresult r = CUDA_SUCCESS;
    size_t pos = 0;
    CUstream s;
    while ((s = emu_map_next(&emu.streams, &pos, NULL))) {
        if (s->capture != EMU_CAP_NONE && !(s->flags & CU_STREAM_NON_BLOCKING)) {
            capture_invalidate(s);
            r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        }
    }
    return r;
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream)
{
    EMU_ENTER(cuStreamSynchronize);
    emu_lock();
    CUresult r = CUDA_SUCCESS;
    CUstream s = emu_stream_resolve_locked(hStream);
    if (!s) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else if (s->capture != EMU_CAP_NONE) {
        capture_invalidate(s);
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    } else if (s == &emu.null_stream) {
        r = stream_legacy_capture_check();
        if (r == CUDA_SUCCESS) {
            /* The legacy stream waits for all work in blocking streams. */
            stream_complete(s);
            size_t pos = 0;
            CUstream o;
            while ((o = emu_map_next(&emu.streams, &pos, NULL)))
                if (!(o->flags & CU_STREAM_NON_BLOCKING))
                    stream_complete(o);
        }
    } else {
        stream_complete(s);
    }
    emu_unlock();
    return r;
}

CUresult CUDAAPI cuStreamQuery(CUstream hStream)
{
    EMU_ENTER(cuStreamQuery);
    emu_lock();
    CUresult r = CUDA_SUCCESS;
    CUstream s = emu_stream_resolve_locked(hStream);
    if (!s) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else if (s->capture != EMU_CAP_NONE) {
        capture_invalidate(s);
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    } else if (s->completed < s->submitted) {
        r = CUDA_ERROR_NOT_READY;
    }
    emu_unlock();
    return r;
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    EMU_ENTER(cuStreamWaitEvent);
    emu_lock();
    CUresult r = CUDA_SUCCESS;
    if (!emu_stream_resolve_locked(hStream) || !emu_map_get(&emu.events, (uint64_t)(uintptr_t)hEvent))
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (Flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL)
        r = CUDA_ERROR_INVALID_VALUE;
    emu_unlock();
    return r;
}

/* ---- capture ---- */

CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream, CUstreamCaptureMode mode)
{
    EMU_ENTER(cuStreamBeginCapture);
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    emu_lock();
    CUresult r = CUDA_SUCCESS;
    CUstream s = emu_stream_resolve_locked(hStream);
    if (!s) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else if (s == &emu.null_stream) {
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    } else if (s->capture != EMU_CAP_NONE) {
        r = CUDA_ERROR_ILLEGAL_STATE;
    } else {
        s->capture = EMU_CAP_ACTIVE;
        s->capture_mode = mode;
        s->capture_thread = &thread_token;
        s->capture_id = ++emu.capture_seq;
        emu.captures_active++;
    }
    emu_unlock();
    return r;
}

CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    EMU_ENTER(cuStreamEndCapture);
    if (!phGraph)
        return CUDA_ERROR_INVALID_VALUE;
    emu_lock();
    CUresult r = CUDA_SUCCESS;
    CUstream s = emu_stream_resolve_locked(hStream);
    if (!s) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else if (s->capture == EMU_CAP_NONE) {
        r = CUDA_ERROR_ILLEGAL_STATE;
    } else if (s->capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED && s->capture_thread != &thread_token) {
        r = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    } else {
        bool invalid = s->capture == EMU_CAP_INVALIDATED;
        uint64_t id = s->capture_id;
        s->capture = EMU_CAP_NONE;
        emu.captures_active--;
        *phGraph = NULL;
        if (invalid) {
            r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        } else {
            CUgraph g = calloc(1, sizeof *g);
            if (!g || emu_map_put(&emu.graphs, (uint64_t)(uintptr_t)g, g)) {
                free(g);
                r = CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                g->capture_id = id;
                *phGraph = g;
            }
        }
    }
    emu_unlock();
    return r;
}

CUresult CUDAAPI cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    EMU_ENTER(cuStreamIsCapturing);
    if (!captureStatus)
        return CUDA_ERROR_INVALID_VALUE;
    emu_lock();
    CUresult r = CUDA_SUCCESS;
    CUstream s = emu_stream_resolve_locked(hStream);
    if (!s) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else if (s == &emu.null_stream && emu.captures_active) {
        /* Asking about the legacy stream while a blocking stream captures is itself an implicit
         * dependency on the capture. */
        r = stream_legacy_capture_check();
    } else {
        *captureStatus = s->capture == EMU_CAP_ACTIVE        ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                         : s->capture == EMU_CAP_INVALIDATED ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                                             : CU_STREAM_CAPTURE_STATUS_NONE;
    }
    if (r == CUDA_SUCCESS && s == &emu.null_stream)
        *captureStatus = CU_STREAM_CAPTURE_STATUS_NONE;
    emu_unlock();
    return r;
}

CUresult CUDAAPI cuStreamGetCaptureInfo(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                        cuuint64_t *id_out, CUgraph *graph_out,
                                        const CUgraphNode **dependencies_out,
                                        const CUgraphEdgeData **edgeData_out,
                                        size_t *numDependencies_out)
{
    EMU_ENTER(cuStreamGetCaptureInfo);
    if (!captureStatus_out)
        return CUDA_ERROR_INVALID_VALUE;
    emu_lock();
    CUstream s = emu_stream_resolve_locked(hStream);
    if (!s) {
        emu_unlock();
        return CUDA_ERROR_INVALID_HANDLE;
    }
    enum emu_capture c = s->capture;
    *captureStatus_out = c == EMU_CAP_ACTIVE        ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                         : c == EMU_CAP_INVALIDATED ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                                    : CU_STREAM_CAPTURE_STATUS_NONE;
    if (id_out)
        *id_out = c != EMU_CAP_NONE ? s->capture_id : 0;
    /* No graph is built while capturing: the graph only exists after cuStreamEndCapture. */
    if (graph_out)
        *graph_out = NULL;
    if (dependencies_out)
        *dependencies_out = NULL;
    if (edgeData_out)
        *edgeData_out = NULL;
    if (numDependencies_out)
        *numDependencies_out = 0;
    emu_unlock();
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    EMU_ENTER(cuThreadExchangeStreamCaptureMode);
    if (!mode || (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL && *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
                  *mode != CU_STREAM_CAPTURE_MODE_RELAXED))
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = thread_capture_mode;
    thread_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph)
{
    EMU_ENTER(cuGraphDestroy);
    emu_lock();
    CUgraph g = emu_map_del(&emu.graphs, (uint64_t)(uintptr_t)hGraph);
    emu_unlock();
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    free(g);
    return CUDA_SUCCESS;
}

/* ---- events ---- */

CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    EMU_ENTER(cuEventCreate);
    unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if (!phEvent || (Flags & ~known))
        return CUDA_ERROR_INVALID_VALUE;
    if (!emu_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    CUevent e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->flags = Flags;
    emu_lock();
    int bad = emu_map_put(&emu.events, (uint64_t)(uintptr_t)e, e);
    emu_unlock();
    if (bad) {
        free(e);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *phEvent = e;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventDestroy(CUevent hEvent)
{
    EMU_ENTER(cuEventDestroy);
    emu_lock();
    CUevent e = emu_map_del(&emu.events, (uint64_t)(uintptr_t)hEvent);
    emu_unlock();
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    free(e);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream)
{
    EMU_ENTER(cuEventRecord);
    emu_lock();
    CUresult r = CUDA_SUCCESS;
    CUevent e = emu_map_get(&emu.events, (uint64_t)(uintptr_t)hEvent);
    CUstream s = emu_stream_resolve_locked(hStream);
    if (!e || !s) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else if (s->held && s->capture == EMU_CAP_NONE) {
        e->stream = s;
        e->seq = ++s->submitted;
    } else {
        e->stream = NULL;
    }
    emu_unlock();
    return r;
}

static bool event_pending(CUevent e) { return e->stream && e->stream->completed < e->seq; }

CUresult CUDAAPI cuEventQuery(CUevent hEvent)
{
    EMU_ENTER(cuEventQuery);
    emu_lock();
    CUevent e = emu_map_get(&emu.events, (uint64_t)(uintptr_t)hEvent);
    CUresult r = e ? emu_capture_unsafe_call_locked() : CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS && event_pending(e))
        r = CUDA_ERROR_NOT_READY;
    emu_unlock();
    return r;
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent)
{
    EMU_ENTER(cuEventSynchronize);
    emu_lock();
    CUresult r = CUDA_SUCCESS;
    CUevent e = emu_map_get(&emu.events, (uint64_t)(uintptr_t)hEvent);
    if (!e)
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (event_pending(e))
        e->stream->completed = e->seq;
    emu_unlock();
    return r;
}

/* ---- test hold ---- */

void cudaemu_stream_hold(CUstream stream)
{
    emu_env_once();
    emu_lock();
    CUstream s = emu_stream_resolve_locked(stream);
    if (s)
        s->held = true;
    emu_unlock();
}

void cudaemu_stream_release(CUstream stream)
{
    emu_env_once();
    emu_lock();
    CUstream s = emu_stream_resolve_locked(stream);
    if (s) {
        s->held = false;
        stream_complete(s);
    }
    emu_unlock();
}
