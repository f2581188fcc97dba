/*
 * Streams at the driver boundary: waiting for a stream's work, ordering one stream after
 * another's work so far, waiting for the whole context, and telling whether a handle is a stream
 * the driver knows.
 *
 * A stream handle is passed to the driver only while its owner keeps it alive: a call with a
 * destroyed stream is undefined (on an H200, cuLaunchKernel, cuStreamIsCapturing and
 * cuStreamSynchronize of one crashed the process; cudaemu faults there too). So a program's
 * stream is used while a block allocated or recorded on it is live and at its free; after the
 * free only xseg's own streams and events (vstream_join), or the whole context (vctx_wait), are.
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
 * Wait until the work queued on @p stream (alive) so far has finished. When the stream cannot be
 * synchronized (a transient failure) this falls back to synchronizing the whole current context,
 * which waits for every stream's work, that stream's included. A capture error is not papered
 * over (a context synchronize would invalidate the capture).
 * @p what describes the purpose for the message ("before unmapping pages of ...").
 * @return XSEG_SUCCESS once the work is known to be done, else XSEG_ERROR_DRIVER naming the
 *         stream's CUresult (and nothing is known to be finished).
 */
xseg_status vstream_wait(CUstream stream, const char *what);

/*
 * Is @p stream a live stream handle of the current context? Asked with cuStreamIsCapturing,
 * which is legal during a capture and does not wait. NULL (the legacy stream) and the per-thread
 * default stream are streams. @return XSEG_SUCCESS, XSEG_ERROR_INVALID_VALUE naming the handle
 * and the driver's answer when the driver does not know it, or the status of another driver
 * failure (drv_fail).
 */
xseg_status vstream_check(CUstream stream, const char *caller);

/* Services: has every work item queued on @p stream (alive) so far completed? One
 * cuStreamQuery, never a wait; any error (a capture) answers false. */
bool vstream_idle(CUstream stream);

/* Is @p stream one of the default streams (NULL, the legacy or the per-thread one), which live as
 * long as the context? */
bool vstream_default(CUstream stream);

/*
 * Order @p waiter's later work after the work queued on @p stream (alive) so far: @p ev recorded
 * on @p stream, @p waiter made to wait for it (cuEventRecord, cuStreamWaitEvent). After it
 * @p stream may be destroyed; @p ev may be recorded again at once. Where the driver refuses,
 * @p stream is waited for instead (vstream_wait). Not on a capturing @p stream (@p waiter would
 * join the capture). @p what describes the purpose for the message.
 */
xseg_status vstream_join(CUstream waiter, CUevent ev, CUstream stream, const char *what);

/* Wait for every stream's queued work on the current context (cuCtxSynchronize; the driver
 * finishes a destroyed stream's work too): what xseg waits for once the streams a piece of memory
 * was used on may be gone. @p what describes the purpose for the message.
 * @return XSEG_SUCCESS, else XSEG_ERROR_DRIVER naming the CUresult. */
xseg_status vctx_wait(const char *what);
/* vctx_wait in the thread's RELAXED capture mode (cuThreadExchangeStreamCaptureMode, put back
 * after): no GLOBAL capture of another thread is refused the call for this thread's mode. A
 * context wait while any stream captures is still invalid (the driver ends that capture), so the
 * caller checks first that no capture it knows of is underway (a sleep: sleep_wait_device). */
xseg_status vctx_wait_relaxed(const char *what);

/* Services: a non-blocking stream of the current context for xseg's own copies (sleep and wake's
 * chunks), and its destruction (the driver finishes work still queued on it). */
xseg_status vstream_create(CUstream *out);
void vstream_destroy(CUstream stream);

#endif
