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
 * cuStreamWaitEvent is treated as satisfied at once (cross-stream ordering is not modelled
 * outside capture).
 *
 * Capture graph. A capture builds a graph (graph.c) as the driver does: each stream taking part
 * has a dependency set, the nodes its next captured node will depend on. Captured work
 * (cudaemu_stream_work) adds a node depending on that set and becomes the set;
 * cuStreamUpdateCaptureDependencies replaces or extends it. cuEventRecord on a capturing stream
 * copies the set into the event; cuStreamWaitEvent on such an event merges the event's set into
 * the waiting stream's, and a stream that was not capturing thereby joins the capture (fork).
 * cuStreamEndCapture must be called on the stream that began it
 * (CUDA_ERROR_STREAM_CAPTURE_UNMATCHED otherwise). A stream that forked off and was never joined
 * back does not fail the end: the driver documents CUDA_ERROR_STREAM_CAPTURE_UNJOINED for it, but
 * the H200's driver 580.159.04 ended such a capture with CUDA_SUCCESS, its graph holding the side
 * stream's nodes (2026-11-27, tests/driver/test_vmm.c test_capture_graph and the graph row "after
 * a fork never joined back"); cudaemu does the same. On success every stream of the capture
 * leaves it and the graph is the caller's. Waiting in a
 * capturing stream on an event recorded outside any capture, without CU_EVENT_WAIT_EXTERNAL, is
 * invalid (CUDA_ERROR_STREAM_CAPTURE_ISOLATION; the capture is invalidated); so is waiting on an
 * event of another capture (CUDA_ERROR_STREAM_CAPTURE_MERGE) or of a capture that has ended
 * (CUDA_ERROR_STREAM_CAPTURE_ISOLATION, cudaemu's choice: the driver documents no code for it).
 *
 * Capture. Following the driver API's documentation of cuStreamBeginCapture and
 * cuThreadExchangeStreamCaptureMode ("potentially unsafe API calls"), and the CUDA Programming
 * Guide's "Prohibited and Unhandled Operations" for stream capture:
 *   - a thread whose interaction mode is not RELAXED may not make a potentially unsafe call while
 *     it has a capture of its own that is not RELAXED, or (thread mode GLOBAL only) while another
 *     thread has a GLOBAL capture. Such a call returns CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and
 *     invalidates those captures (cuStreamEndCapture then returns
 *     CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and no graph).
 *   - cudaemu's unsafe calls: cuMemAlloc, cuMemFree, cuEventQuery, and cuStreamSynchronize of a
 *     stream that does not capture. Measured on an H100 (driver 580.159.04, tests/driver/test_vmm.c
 *     capture table): the first three are rejected in GLOBAL mode; cuMemUnmap, cuMemMap and
 *     cuMemSetAccess are not. On an H200 (same driver) cuStreamSynchronize of a non-blocking
 *     stream outside a GLOBAL capture made by the same thread was rejected
 *     (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED). cuStreamQuery and cuEventSynchronize of work
 *     outside the capture are not measured and cudaemu allows them.
 *   - synchronizing or querying a capturing stream, or cuCtxSynchronize while any stream
 *     captures, is invalid whatever the modes: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and the
 *     capture is invalidated. Synchronizing the legacy NULL stream while a blocking stream
 *     captures gives CUDA_ERROR_STREAM_CAPTURE_IMPLICIT and invalidates that capture;
 *     cuStreamIsCapturing of the legacy stream then gives IMPLICIT and leaves it valid (documented).
 *   - the legacy NULL stream cannot capture (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED).
 *   - cuEventRecord on a capturing stream is allowed; the event is then complete for queries.
 * All state is under emu.lock; the capture interaction mode is per thread.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudaemu/emu.h"

static _Thread_local CUstreamCaptureMode thread_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
static _Thread_local char thread_token;   /* its address identifies the thread */

/* Destroyed streams, kept (not freed, so no new stream takes their address) for the last
 * STREAM_DEAD_KEEP destroys: a call naming one faults (stream_dead_fault). */
#define STREAM_DEAD_KEEP 4096
static struct emu_map stream_dead;
static CUstream stream_dead_ring[STREAM_DEAD_KEEP];
static size_t stream_dead_next;
static unsigned long stream_dead_calls; /* calls that named one (cudaemu_dead_stream_calls) */

/* A driver call with a destroyed stream is undefined; on an H200 (driver 580) such calls
 * (cuLaunchKernel, cuStreamIsCapturing, cuStreamSynchronize) crashed the process with SIGSEGV,
 * so cudaemu faults too, naming the call, rather than answering an error the driver does not
 * promise: a program (an allocator) must not keep using a stream its owner may have destroyed.
 * Lock held; never returns (the lock is released first, so a handler that survives the signal
 * finds cudaemu usable). */
static void stream_dead_fault(CUstream s) __attribute__((noreturn));
static void stream_dead_fault(CUstream s)
{
    int e = emu_entry_now;
    stream_dead_calls++;
    fprintf(stderr, "cudaemu: %s: stream %p was destroyed (cuStreamDestroy); a driver call with it is undefined "
            "behaviour (the driver crashes), so cudaemu faults\n", e >= 0 && e < EMU_E_COUNT ? emu_api_names[e] : "?",
            (void *)s);
    emu_unlock();
    raise(SIGSEGV);
    abort();
}

CUstream emu_stream_resolve_locked(CUstream s)
{
    if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
        return &emu.null_stream;
    CUstream r = emu_map_get(&emu.streams, (uint64_t)(uintptr_t)s);
    if (!r && emu_map_get(&stream_dead, (uint64_t)(uintptr_t)s))
        stream_dead_fault(s);
    return r;
}

/* Each such call faults, so a count above 0 is seen only by a program that survives its SIGSEGV. */
unsigned long cudaemu_dead_stream_calls(void)
{
    emu_lock();
    unsigned long n = stream_dead_calls;
    emu_unlock();
    return n;
}

/* @p s's work up to @p seq completes: its deferred fills up to there become ready to run (in
 * queue order, after those already ready), run by the caller once it drops the lock
 * (emu_deferred_run). Lock held. */
static void stream_complete_to(CUstream s, uint64_t seq)
{
    if (seq > s->completed)
        s->completed = seq;
    size_t k = 0, keep = 0;
    for (; k < s->ndset; k++) {
        struct emu_dset *d = &s->dset[k];
        if (d->seq > s->completed) {
            s->dset[keep++] = *d;
            continue;
        }
        if (emu.nready == emu.capready) {
            size_t cap = emu.capready ? 2 * emu.capready : 16;
            struct emu_dset *v = realloc(emu.ready, cap * sizeof *v);
            if (!v) { /* no memory: the fill runs never (a test's own allocation failed) */
                fprintf(stderr, "cudaemu: out of memory for a deferred fill\n");
                continue;
            }
            emu.ready = v;
            emu.capready = cap;
        }
        emu.ready[emu.nready++] = *d;
    }
    s->ndset = keep;
}

/* Waiting for a stream completes its work: the modelled clock moves to its last copy's end. */
static void stream_complete(CUstream s)
{
    stream_complete_to(s, s->submitted);
    emu_model_advance_to(s->model_ready);
}

void emu_stream_complete_locked(CUstream s) { stream_complete(s); }

bool emu_stream_defer_set_locked(CUstream s, uintptr_t addr, size_t size, unsigned char value)
{
    if (s->ndset == s->capdset) {
        size_t cap = s->capdset ? 2 * s->capdset : 8;
        struct emu_dset *v = realloc(s->dset, cap * sizeof *v);
        if (!v)
            return false;
        s->dset = v;
        s->capdset = cap;
    }
    s->dset[s->ndset++] = (struct emu_dset){addr, size, value, s->submitted};
    return true;
}

void emu_deferred_run(void)
{
    for (;;) {
        emu_lock();
        struct emu_dset *v = emu.ready;
        size_t n = emu.nready;
        emu.ready = NULL;
        emu.nready = emu.capready = 0;
        emu_unlock();
        if (!n) {
            free(v);
            return;
        }
        for (size_t i = 0; i < n; i++)
            (void)emu_dev_set(v[i].addr, v[i].value, v[i].size); /* freed meanwhile: a GPU's fault, not modelled */
        free(v);
    }
}

bool emu_stream_pend_locked(CUstream s, uintptr_t addr, size_t size, uint64_t seq)
{
    size_t keep = 0;
    for (size_t i = 0; i < s->npend; i++)
        if (s->pend[i].seq > s->completed)
            s->pend[keep++] = s->pend[i];
    s->npend = keep;
    if (s->npend == s->cappend) {
        size_t cap = s->cappend ? 2 * s->cappend : 8;
        struct emu_pend *v = realloc(s->pend, cap * sizeof *v);
        if (!v)
            return false;
        s->pend = v;
        s->cappend = cap;
    }
    s->pend[s->npend++] = (struct emu_pend){addr, size, seq};
    return true;
}

static bool pend_touches(CUstream s, uintptr_t addr, size_t size)
{
    for (size_t i = 0; i < s->npend; i++) {
        const struct emu_pend *p = &s->pend[i];
        if (p->seq > s->completed && p->addr < addr + size && addr < p->addr + p->size)
            return true;
    }
    return false;
}

bool emu_streams_pending_touch_locked(uintptr_t addr, size_t size)
{
    if (pend_touches(&emu.null_stream, addr, size))
        return true;
    size_t pos = 0;
    CUstream s;
    while ((s = emu_map_next(&emu.streams, &pos, NULL)))
        if (pend_touches(s, addr, size))
            return true;
    return false;
}

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
    if (s->cap)
        s->cap->invalidated = true;
}

static CUstreamCaptureStatus capture_status(CUstream s)
{
    return !s->cap                ? CU_STREAM_CAPTURE_STATUS_NONE
           : s->cap->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                  : CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

/* @p s leaves its capture. */
static void capture_leave(CUstream s)
{
    s->cap = NULL;
    s->deps.n = 0;
    emu.captures_active--;
}

/* End capture sequence @p seq: every stream leaves it; the graph goes to the caller (@p keep)
 * or is freed. */
static void capture_finish(struct emu_capseq *seq, bool keep)
{
    size_t pos = 0;
    CUstream o;
    while ((o = emu_map_next(&emu.streams, &pos, NULL)))
        if (o->cap == seq)
            capture_leave(o);
    emu_map_del(&emu.captures, seq->id);
    seq->graph->capture = NULL;
    if (!keep)
        emu_graph_free_locked(seq->graph);
    free(seq);
}

CUresult emu_capture_refuse_locked(CUstream s)
{
    if (!s->cap)
        return CUDA_SUCCESS;
    capture_invalidate(s);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

CUresult emu_capture_unsafe_call_locked(void)
{
    if (!emu.captures_active || thread_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_SUCCESS;
    bool prohibited = false;
    size_t pos = 0;
    CUstream s;
    while ((s = emu_map_next(&emu.streams, &pos, NULL))) {
        if (!s->cap || s->cap->invalidated || s->cap->mode == CU_STREAM_CAPTURE_MODE_RELAXED)
            continue;
        bool own = s->cap->thread == &thread_token;
        if (own || (thread_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                    s->cap->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
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
    s->held = emu.hold_all;
    if (emu.defer_new && (Flags & CU_STREAM_NON_BLOCKING))
        s->held = s->defer = true;
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
 * become complete). A capture it takes part in is invalidated; one it began is dropped. */
CUresult CUDAAPI cuStreamDestroy(CUstream hStream)
{
    EMU_ENTER(cuStreamDestroy);
    if (!hStream || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD)
        return CUDA_ERROR_INVALID_HANDLE;
    emu_lock();
    CUstream s = emu_map_del(&emu.streams, (uint64_t)(uintptr_t)hStream);
    if (!s) {
        if (emu_map_get(&stream_dead, (uint64_t)(uintptr_t)hStream))
            stream_dead_fault(hStream); /* destroyed twice */
        emu_unlock();
        return CUDA_ERROR_INVALID_HANDLE;
    }
    if (s->cap) {
        /* Without its origin a capture can never end: it is dropped with its graph. */
        struct emu_capseq *seq = s->cap;
        capture_leave(s);
        if (seq->origin == s)
            capture_finish(seq, false);
        else
            seq->invalidated = true;
    }
    stream_complete(s); /* its deferred fills run (below, unlocked) */
    emu_nodeset_free(&s->deps);
    free(s->pend);
    free(s->dset);
    size_t pos = 0;
    CUevent e;
    while ((e = emu_map_next(&emu.events, &pos, NULL)))
        if (e->stream == s)
            e->stream = NULL;
    /* Kept as a tombstone (its state gone): the oldest one is freed when the ring is full. */
    memset(s, 0, sizeof *s);
    CUstream old = stream_dead_ring[stream_dead_next];
    if (emu_map_put(&stream_dead, (uint64_t)(uintptr_t)s, s)) {
        emu_unlock();
        free(s); /* no room to remember it: an ordinary unknown handle from now on */
        emu_deferred_run();
        return CUDA_SUCCESS;
    }
    stream_dead_ring[stream_dead_next] = s;
    stream_dead_next = (stream_dead_next + 1) % STREAM_DEAD_KEEP;
    if (old)
        emu_map_del(&stream_dead, (uint64_t)(uintptr_t)old);
    emu_unlock();
    free(old);
    emu_deferred_run();
    return CUDA_SUCCESS;
}

/* The legacy stream used or asked about while a blocking stream captures: IMPLICIT; a use
 * (@p invalidate) also invalidates the capture. Lock held. */
static CUresult stream_legacy_capture_check(bool invalidate)
{
    CUresult r = CUDA_SUCCESS;
    size_t pos = 0;
    CUstream s;
    while ((s = emu_map_next(&emu.streams, &pos, NULL))) {
        if (s->cap && !(s->flags & CU_STREAM_NON_BLOCKING)) {
            if (invalidate)
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
    } else if (s->cap) {
        capture_invalidate(s);
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    } else if (s == &emu.null_stream) {
        r = stream_legacy_capture_check(true);
        if (r == CUDA_SUCCESS)
            r = emu_capture_unsafe_call_locked();
        if (r == CUDA_SUCCESS) {
            /* The legacy stream waits for all work in blocking streams. */
            stream_complete(s);
            size_t pos = 0;
            CUstream o;
            while ((o = emu_map_next(&emu.streams, &pos, NULL)))
                if (!(o->flags & CU_STREAM_NON_BLOCKING))
                    stream_complete(o);
        }
    } else if ((r = emu_capture_unsafe_call_locked()) == CUDA_SUCCESS) {
        stream_complete(s);
    }
    emu_unlock();
    emu_deferred_run();
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
    } else if (s->cap) {
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
    CUstream s = emu_stream_resolve_locked(hStream);
    CUevent e = emu_map_get(&emu.events, (uint64_t)(uintptr_t)hEvent);
    if (!s || !e) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else if (Flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (e->cap_id && !(Flags & CU_EVENT_WAIT_EXTERNAL)) {
        /* A captured event: the waiting stream takes its dependencies (and joins the capture). */
        struct emu_capseq *seq = emu_map_get(&emu.captures, e->cap_id);
        if (!seq) {
            capture_invalidate(s);
            r = CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
        } else if (s->cap && s->cap != seq) {
            r = CUDA_ERROR_STREAM_CAPTURE_MERGE;
        } else if (s == &emu.null_stream) {
            capture_invalidate(seq->origin);
            r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        } else if (emu_nodeset_update(&s->deps, e->deps.v, e->deps.n, s->cap != NULL)) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else if (!s->cap) {
            s->cap = seq;
            emu.captures_active++;
        }
    } else if (s->cap && !(Flags & CU_EVENT_WAIT_EXTERNAL)) {
        /* An event from outside the capture would be a dependency across its boundary. */
        capture_invalidate(s);
        r = CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
    } else if (!s->cap) {
        if (e->model_ready > s->model_ready)
            s->model_ready = e->model_ready; /* the timeline model: later work starts after the event */
        /* Work queued on @p s from now on runs after the event's: a deferring stream's fills
         * before it run now (cudaemu has no later moment that knows the order). */
        if (e->stream && e->stream->defer && e->stream->completed < e->seq)
            stream_complete_to(e->stream, e->seq);
    }
    emu_unlock();
    emu_deferred_run();
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
    } else if (s->cap) {
        r = CUDA_ERROR_ILLEGAL_STATE;
    } else {
        struct emu_capseq *seq = calloc(1, sizeof *seq);
        CUgraph g = seq ? emu_graph_new_locked() : NULL;
        if (!g || emu_map_put(&emu.captures, emu.capture_seq + 1, seq)) {
            if (g)
                emu_graph_free_locked(g);
            free(seq);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            seq->id = ++emu.capture_seq;
            seq->graph = g;
            seq->origin = s;
            seq->mode = mode;
            seq->thread = &thread_token;
            g->capture = seq;
            s->cap = seq;
            s->deps.n = 0;
            emu.captures_active++;
        }
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
    struct emu_capseq *seq = s ? s->cap : NULL;
    if (!s) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else if (!seq) {
        r = CUDA_ERROR_ILLEGAL_STATE;
    } else if (seq->origin != s) {
        /* Ending it on a stream that joined it (not its origin) also invalidates the capture: on
         * the H200 the origin's end then said INVALIDATED (2026-11-26, test_capture_graph). */
        r = CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
        seq->invalidated = true;
    } else if (seq->mode != CU_STREAM_CAPTURE_MODE_RELAXED && seq->thread != &thread_token) {
        r = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    } else {
        *phGraph = NULL;
        if (seq->invalidated) {
            r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        } else {
            *phGraph = seq->graph;
        }
        capture_finish(seq, r == CUDA_SUCCESS);
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
        /* Asking about the legacy stream while a blocking stream captures is refused, and (as
         * documented, unlike using the legacy stream) leaves the capture valid. */
        r = stream_legacy_capture_check(false);
    } else {
        *captureStatus = capture_status(s);
    }
    if (r == CUDA_SUCCESS && s == &emu.null_stream)
        *captureStatus = CU_STREAM_CAPTURE_STATUS_NONE;
    emu_unlock();
    return r;
}

/* The dependency array handed out stays valid until the next call on the stream, as documented;
 * edge data is always the default (zeroed). Only the status is data unless the capture is ACTIVE
 * (documented: "valid data (other than capture status) is returned only if ... ACTIVE"): the
 * other outputs are then left as the caller had them, so a caller that reads them anyway reads
 * its own initial values, never a count or graph handed out by cudaemu alone. */
CUresult CUDAAPI cuStreamGetCaptureInfo(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                        cuuint64_t *id_out, CUgraph *graph_out,
                                        const CUgraphNode **dependencies_out,
                                        const CUgraphEdgeData **edgeData_out,
                                        size_t *numDependencies_out)
{
    EMU_ENTER(cuStreamGetCaptureInfo);
    if (!captureStatus_out || (edgeData_out && !dependencies_out))
        return CUDA_ERROR_INVALID_VALUE;
    emu_lock();
    CUstream s = emu_stream_resolve_locked(hStream);
    if (!s) {
        emu_unlock();
        return CUDA_ERROR_INVALID_HANDLE;
    }
    if (s == &emu.null_stream && emu.captures_active) {
        CUresult r = stream_legacy_capture_check(true);
        if (r != CUDA_SUCCESS) {
            emu_unlock();
            return r;
        }
    }
    CUstreamCaptureStatus st = capture_status(s);
    bool active = st == CU_STREAM_CAPTURE_STATUS_ACTIVE;
    *captureStatus_out = st;
    if (active) {
        if (id_out)
            *id_out = s->cap->id;
        if (graph_out)
            *graph_out = s->cap->graph;
        if (dependencies_out)
            *dependencies_out = s->deps.n ? s->deps.v : NULL;
        if (edgeData_out)
            *edgeData_out = s->deps.n ? s->deps.edges : NULL;
        if (numDependencies_out)
            *numDependencies_out = s->deps.n;
    }
    emu_unlock();
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    EMU_ENTER(cuThreadExchangeStreamCaptureMode);
    /* No check of mode: a NULL mode faults the H200's driver (580.159.04, the conformance table's
     * run of 2026-11-26 died there), so it faults here too (test_null_out_faults); and it took
     * mode 7 (CUDA_SUCCESS) in the run after. What the driver then does with a mode it does not
     * know is unmeasured: cudaemu keeps it and treats it as neither RELAXED nor THREAD_LOCAL. */
    CUstreamCaptureMode want = *(volatile CUstreamCaptureMode *)mode;
    CUstreamCaptureMode old = thread_capture_mode;
    thread_capture_mode = want;
    *mode = old;
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
    emu_nodeset_free(&e->deps);
    free(e);
    return CUDA_SUCCESS;
}

/* On a capturing stream the event takes the stream's capture dependencies (for waits in the
 * capture) and is complete for queries. */
CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream)
{
    EMU_ENTER(cuEventRecord);
    emu_lock();
    CUresult r = CUDA_SUCCESS;
    CUevent e = emu_map_get(&emu.events, (uint64_t)(uintptr_t)hEvent);
    CUstream s = emu_stream_resolve_locked(hStream);
    if (!e || !s) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else if (s->cap) {
        if (s->cap->invalidated) {
            r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        } else if (emu_nodeset_update(&e->deps, s->deps.v, s->deps.n, false)) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            e->cap_id = s->cap->id;
            e->stream = NULL;
        }
    } else if (s->held) {
        e->stream = s;
        e->seq = ++s->submitted;
        e->cap_id = 0;
        e->model_ready = s->model_ready;
    } else {
        e->stream = NULL;
        e->cap_id = 0;
        e->model_ready = s->model_ready;
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
        stream_complete_to(e->stream, e->seq);
    if (e)
        emu_model_advance_to(e->model_ready);
    emu_unlock();
    emu_deferred_run();
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
        s->held = s->defer; /* a deferring stream stays so */
        stream_complete(s);
    }
    emu_unlock();
    emu_deferred_run();
}

void cudaemu_stream_hold_all(int on)
{
    emu_env_once();
    emu_lock();
    emu.hold_all = on != 0;
    size_t pos = 0;
    CUstream s = &emu.null_stream;
    do {
        s->held = on != 0 || s->defer;
        if (!on)
            stream_complete(s);
    } while ((s = emu_map_next(&emu.streams, &pos, NULL)));
    emu_unlock();
    emu_deferred_run();
}

void cudaemu_stream_defer_new(int on)
{
    emu_env_once();
    emu_lock();
    emu.defer_new = on != 0;
    emu_unlock();
}

int cudaemu_stream_work(CUstream stream)
{
    emu_env_once();
    emu_lock();
    int rc = 0;
    CUstream s = emu_stream_resolve_locked(stream);
    if (!s) {
        rc = -1;
    } else if (s->cap) {
        if (emu_capture_add_locked(s, CU_GRAPH_NODE_TYPE_KERNEL, NULL) != CUDA_SUCCESS)
            rc = -1;
    } else if (s->held) {
        s->submitted++;
    }
    emu_unlock();
    return rc;
}
