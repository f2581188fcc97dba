/*
 * The capture graph, as the driver reports it: the driver calls behind
 * graph_capture_record_stream_reuse (core/policy/capreuse.c holds the policy). Thread-safe as the driver
 * is; no state of its own.
 */
#ifndef XSEG_VMM_CAPTURE_H
#define XSEG_VMM_CAPTURE_H

#include <stdbool.h>
#include <stddef.h>

#include "vmm/driver.h"

/* A stream's capture state (cuStreamGetCaptureInfo). */
struct vmm_capture_info {
    CUstreamCaptureStatus status;
    unsigned long long id;      /* capture sequence id (0 when not capturing) */
    CUgraph graph;              /* the graph being captured (NULL unless ACTIVE) */
    const CUgraphNode *deps;    /* the stream's dependency set ("terminal nodes"); driver-owned,
                                   valid until the next driver call on the stream */
    size_t ndeps;
};

/* Is @p stream capturing (cuStreamIsCapturing: legal during a capture, never waits)? @p device
 * names the device in the message. @return XSEG_ERROR_DRIVER naming the call on failure. */
xseg_status vmm_stream_capturing(CUstream stream, int device, bool *capturing);

/* @p stream's capture status and id (cuStreamGetCaptureInfo, no graph or dependencies).
 * @return XSEG_ERROR_DRIVER naming the call, the stream and @p device on failure. */
xseg_status vmm_capture_id(CUstream stream, int device, CUstreamCaptureStatus *status, unsigned long long *id);

/* Begin a capture of @p stream in @p mode and read its capture id (0 when it cannot be read).
 * @return XSEG_ERROR_DRIVER naming cuStreamBeginCapture, the stream and @p device on failure. */
xseg_status vmm_capture_begin(CUstream stream, CUstreamCaptureMode mode, int device, unsigned long long *id);

/* End the capture of @p stream: *@p graph the captured graph (NULL on failure).
 * @return XSEG_ERROR_DRIVER naming cuStreamEndCapture, the stream and @p device on failure. */
xseg_status vmm_capture_end(CUstream stream, int device, CUgraph *graph);

/* Put the calling thread in relaxed capture mode for good (cuThreadExchangeStreamCaptureMode):
 * a background thread's event and stream queries must never invalidate a GLOBAL capture another
 * thread runs (core/services/idle.c). @return XSEG_ERROR_DRIVER naming the call when it fails. */
xseg_status vmm_capture_relax_thread(void);

/* Query @p stream. @return XSEG_ERROR_DRIVER naming the call and the stream when it fails. */
xseg_status vmm_capture_info(CUstream stream, struct vmm_capture_info *out);

/*
 * Put a marker into @p stream's capture: an empty node after the stream's current dependencies,
 * made the stream's only dependency (so everything captured on it later comes after the marker,
 * and nothing before changes). @p ci: the stream's capture info (vmm_capture_info), read with no
 * driver call on the stream since. @return XSEG_ERROR_ILLEGAL_STATE when it is not capturing,
 * XSEG_ERROR_DRIVER naming the failing call; on failure the stream's dependencies are as before
 * (the node, if one was added, has no successor and orders nothing).
 */
xseg_status vmm_capture_mark(CUstream stream, const struct vmm_capture_info *ci, CUgraphNode *node);

/*
 * The dependencies of @p node: up to @p cap of them into @p out; *@p n receives how many it has
 * in all (may exceed @p cap: call again with room for *n). Edge data is fetched and ignored, so
 * graphs with non-default edges do not fail the query (CUDA_ERROR_LOSSY_QUERY).
 */
xseg_status vmm_node_deps(CUgraphNode node, CUgraphNode *out, size_t cap, size_t *n);

#endif
