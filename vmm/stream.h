/*
 * Streams at the driver boundary: waiting for a stream's work in a way that cannot get stuck on a
 * destroyed stream, and telling whether a handle is a stream the driver knows.
 *
 * Context: callers make the device's context current first (drv_ctx_ensure). Locking: none
 * (the driver is thread-safe); callers may hold a device lock.
 */
#ifndef XSEG_VMM_STREAM_H
#define XSEG_VMM_STREAM_H

#include <stdbool.h>

#include <cuda.h>

#include "base/common.h"

/*
 * Wait until the work queued on @p stream so far has finished. When the stream cannot be
 * synchronized (destroyed since the caller saw it, a bogus handle, a transient failure) this
 * falls back to synchronizing the whole current context, which waits for every stream's work,
 * that stream's included: the driver finishes a destroyed stream's work in the background. A
 * capture error is not papered over (a context synchronize would invalidate the capture).
 * @p what describes the purpose for the message ("before unmapping pages of ...").
 * @return XSEG_SUCCESS once the work is known to be done, else XSEG_ERROR_DRIVER naming the
 *         stream's CUresult (and nothing is known to be finished).
 */
xseg_status vstream_wait(CUstream stream, const char *what);

/*
 * Wait until the work queued so far on every stream of the current context has finished (the
 * driver finishes a destroyed stream's work too): one cuCtxSynchronize. For work on streams the
 * caller cannot name. @p what describes the purpose for the message.
 * @return XSEG_SUCCESS, else XSEG_ERROR_DRIVER naming the CUresult.
 */
xseg_status vstream_wait_all(const char *what);

/*
 * Is @p stream a live stream handle of the current context? Asked with cuStreamIsCapturing,
 * which is legal during a capture and does not wait. NULL (the legacy stream) and the per-thread
 * default stream are streams. @return XSEG_SUCCESS, XSEG_ERROR_INVALID_VALUE naming the handle
 * and the driver's answer when the driver does not know it, or the status of another driver
 * failure (drv_fail).
 */
xseg_status vstream_check(CUstream stream, const char *caller);

/* Services: has every work item queued on @p stream so far completed? One
 * cuStreamQuery, never a wait; any error (a destroyed stream, a capture) answers false. */
bool vstream_idle(CUstream stream);

/* Services: a non-blocking stream of the current context for xseg's own copies (sleep and wake's
 * chunks), and its destruction (the driver finishes work still queued on it). */
xseg_status vstream_create(CUstream *out);
void vstream_destroy(CUstream stream);

#endif
