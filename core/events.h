/*
 * Deferred frees for record_stream (events.c): events per recorded stream, the deferred list
 * of frees that cannot record yet (during a capture, after a driver failure). Device lock held.
 */
#ifndef XSEG_CORE_EVENTS_H
#define XSEG_CORE_EVENTS_H

#include "core/device.h"

xseg_status ev_insert(struct dev_alloc *d, struct block *b);
void ev_process(struct dev_alloc *d);
void ev_synchronize_all(struct dev_alloc *d);
void ev_destroy(struct dev_alloc *d);
/* Empty deferred-list @p slot, which holds @p b (reused during a capture, core/capreuse.c): b is
 * then the caller's to return to its pool, and no event is ever recorded for it. */
void ev_deferred_reuse(struct dev_alloc *d, size_t slot, struct block *b);

#endif
