/*
 * Segment observers: libraries that register device memory hear every map and unmap
 * (core/policy/observe.c says how attach and events are ordered).
 */
#ifndef XSEG_CORE_OBSERVE_H
#define XSEG_CORE_OBSERVE_H

#include "core/device/device.h"

/* Attach an observer; the devices created already (found through @p device_at) replay their
 * mappings to it. */
xseg_status obs_attach(xseg_segment_observer fn, void *user, dev_peek_fn device_at);
xseg_status obs_detach(xseg_segment_observer fn, void *user);
/* Detach every observer and free the list (xseg_shutdown). */
void obs_detach_all(void);
/* The segment hook (seg_params.observe); user is the struct dev_alloc. Device lock held. */
void obs_segment_hook(void *user, struct seg *seg, size_t first, size_t last, int mapped);
/* A classic segment [addr, addr + size) was mapped (cuMemAlloc) or is about to be freed. */
void obs_classic(struct dev_alloc *d, uintptr_t addr, size_t size, xseg_segment_event_kind kind);

#endif
