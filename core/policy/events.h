/*
 * record_stream (events.c): the streams a block is used on, events per recorded stream, the
 * deferred list of frees that cannot record yet (during a capture, after a driver failure).
 * Device lock held, except by ev_record_stream, which takes it.
 */
#ifndef XSEG_CORE_EVENTS_H
#define XSEG_CORE_EVENTS_H

#include <stdbool.h>

#include "core/device/device.h"

/* xseg_record_stream: @p ptr's block (if this device owns it: *@p owned) is used on @p stream too;
 * its free waits for the work queued there until then (an event a stream, ev_insert). A destroyed
 * or bogus stream is refused with nothing recorded. Takes the device lock (every slot settled). */
xseg_status ev_record_stream(struct dev_alloc *d, void *ptr, CUstream stream, bool *owned);
xseg_status ev_insert(struct dev_alloc *d, struct block *b);
void ev_process(struct dev_alloc *d);
void ev_synchronize_all(struct dev_alloc *d);
/* Destroy the pooled events; with no event pending and no deferred free (xseg_shutdown, after
 * empty_cache), give back the queues and the deferred list too (lock held). */
void ev_destroy(struct dev_alloc *d);
/* Before an allocation on @p stream during a capture (graph_capture_record_stream_reuse): the
 * deferred blocks that the capture graph lets @p stream reuse (core/policy/capreuse.h) go back to their
 * pools, and no event is ever recorded for them. */
void ev_capture_reuse(struct dev_alloc *d, CUstream stream);

#endif
