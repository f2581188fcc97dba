/*
 * Deferred frees for record_stream (events.c): events per recorded stream, the deferred list
 * of frees that cannot record yet (during a capture, after a driver failure). Device lock held.
 */
#ifndef XSEG_CORE_EVENTS_H
#define XSEG_CORE_EVENTS_H

#include "core/device/device.h"

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
