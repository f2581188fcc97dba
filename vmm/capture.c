/* The capture-graph driver calls (see capture.h). */
#include "vmm/capture.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/error.h"
#include "base/hostmem.h"

xseg_status vmm_capture_info(CUstream stream, struct vmm_capture_info *out)
{
    *out = (struct vmm_capture_info){0};
    cuuint64_t id = 0;
    CUresult r = drv->cuStreamGetCaptureInfo(stream, &out->status, &id, &out->graph, &out->deps, NULL,
                                             &out->ndeps);
    if (r == CUDA_ERROR_LOSSY_QUERY) {
        /* Non-default edges on the stream's dependencies: ask with room for the edge data. */
        const CUgraphEdgeData *edges = NULL;
        r = drv->cuStreamGetCaptureInfo(stream, &out->status, &id, &out->graph, &out->deps, &edges,
                                        &out->ndeps);
    }
    if (r != CUDA_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "cuStreamGetCaptureInfo(stream %p)", (void *)stream);
        xseg_status st = drv_fail(r, what);
        return st == XSEG_ERROR_OUT_OF_MEMORY ? XSEG_ERROR_DRIVER : st;
    }
    out->id = id;
    if (out->status != CU_STREAM_CAPTURE_STATUS_ACTIVE) {
        out->graph = NULL;
        out->deps = NULL;
        out->ndeps = 0;
    }
    return XSEG_SUCCESS;
}

xseg_status vmm_capture_mark(CUstream stream, const struct vmm_capture_info *ci, CUgraphNode *node)
{
    if (ci->status != CU_STREAM_CAPTURE_STATUS_ACTIVE)
        return err_set(XSEG_ERROR_ILLEGAL_STATE, "stream %p is not capturing", (void *)stream);
    char what[128];
    xseg_status st;
    CUresult r = drv->cuGraphAddEmptyNode(node, ci->graph, ci->deps, ci->ndeps);
    if (r != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuGraphAddEmptyNode(%zu dependencies of stream %p)", ci->ndeps,
                 (void *)stream);
        st = drv_fail(r, what);
        return st == XSEG_ERROR_OUT_OF_MEMORY ? XSEG_ERROR_DRIVER : st;
    }
    r = drv->cuStreamUpdateCaptureDependencies(stream, node, NULL, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES);
    if (r != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuStreamUpdateCaptureDependencies(stream %p, SET)", (void *)stream);
        st = drv_fail(r, what);
        return st == XSEG_ERROR_OUT_OF_MEMORY ? XSEG_ERROR_DRIVER : st;
    }
    return XSEG_SUCCESS;
}

xseg_status vmm_node_deps(CUgraphNode node, CUgraphNode *out, size_t cap, size_t *n)
{
    enum { EDGE_BATCH = 32 };
    CUgraphEdgeData edges[EDGE_BATCH];
    CUgraphEdgeData *ed = cap <= EDGE_BATCH ? edges : xs_malloc(cap * sizeof *ed);
    if (!ed)
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory reading a graph node's dependencies");
    size_t got = cap;
    CUresult r = cap ? drv->cuGraphNodeGetDependencies(node, out, ed, &got) : CUDA_SUCCESS;
    /* A full buffer may mean there are more: ask for the count. */
    if (r == CUDA_SUCCESS && got == cap)
        r = drv->cuGraphNodeGetDependencies(node, NULL, NULL, &got);
    if (ed != edges)
        xs_free(ed);
    if (r != CUDA_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "cuGraphNodeGetDependencies(node %p)", (void *)node);
        xseg_status st = drv_fail(r, what);
        return st == XSEG_ERROR_OUT_OF_MEMORY ? XSEG_ERROR_DRIVER : st;
    }
    *n = got;
    return XSEG_SUCCESS;
}

/* ---- the capture calls of core/alloc.c and core/policy/pools.c (messages name the device) -------- */

/* drv_fail, with CUDA_ERROR_OUT_OF_MEMORY reported as a driver error: a capture query or
 * begin/end that runs out of memory is not the allocator's out-of-memory condition. */
static xseg_status capture_fail(CUresult r, const char *what)
{
    xseg_status st = drv_fail(r, what);
    return st == XSEG_ERROR_OUT_OF_MEMORY ? XSEG_ERROR_DRIVER : st;
}

xseg_status vmm_stream_capturing(CUstream stream, int device, bool *capturing)
{
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    *capturing = false;
    CUresult r = drv->cuStreamIsCapturing(stream, &cs);
    if (r != CUDA_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "cuStreamIsCapturing(stream %p) on device %d", (void *)stream, device);
        return capture_fail(r, what);
    }
    *capturing = cs != CU_STREAM_CAPTURE_STATUS_NONE;
    return XSEG_SUCCESS;
}

xseg_status vmm_capture_id(CUstream stream, int device, CUstreamCaptureStatus *status, unsigned long long *id)
{
    cuuint64_t cid = 0;
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult r = drv->cuStreamGetCaptureInfo(stream, status, &cid, NULL, NULL, NULL, NULL);
    *id = cid;
    if (r != CUDA_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "cuStreamGetCaptureInfo(stream %p) on device %d", (void *)stream, device);
        return capture_fail(r, what);
    }
    return XSEG_SUCCESS;
}

xseg_status vmm_capture_begin(CUstream stream, CUstreamCaptureMode mode, int device, unsigned long long *id)
{
    *id = 0;
    CUresult r = drv->cuStreamBeginCapture(stream, mode);
    if (r != CUDA_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "cuStreamBeginCapture(stream %p) on device %d", (void *)stream, device);
        return capture_fail(r, what);
    }
    CUstreamCaptureStatus cs;
    cuuint64_t cid = 0;
    if (drv->cuStreamGetCaptureInfo(stream, &cs, &cid, NULL, NULL, NULL, NULL) == CUDA_SUCCESS)
        *id = cid;
    return XSEG_SUCCESS;
}

xseg_status vmm_capture_end(CUstream stream, int device, CUgraph *graph)
{
    CUresult r = drv->cuStreamEndCapture(stream, graph);
    if (r != CUDA_SUCCESS) {
        *graph = NULL;
        char what[96];
        snprintf(what, sizeof what, "cuStreamEndCapture(stream %p) on device %d", (void *)stream, device);
        return capture_fail(r, what);
    }
    return XSEG_SUCCESS;
}

xseg_status vmm_capture_relax_thread(void)
{
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    CUresult r = drv->cuThreadExchangeStreamCaptureMode(&mode);
    return r == CUDA_SUCCESS ? XSEG_SUCCESS : drv_fail(r, "cuThreadExchangeStreamCaptureMode(RELAXED)");
}
