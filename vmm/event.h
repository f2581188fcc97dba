/*
 * Events at the driver boundary: the calls behind record_stream's deferred frees (core/policy/events.c
 * holds the policy: pooling, per-stream queues). Context: callers make the device's context
 * current. Locking: none of its own (the driver is thread-safe).
 */
#ifndef XSEG_VMM_EVENT_H
#define XSEG_VMM_EVENT_H

#include <stdbool.h>

#include "vmm/driver.h"

/* A timing-free event. @return XSEG_ERROR_DRIVER (or _OUT_OF_MEMORY) naming the call on failure. */
xseg_status vevent_create(CUevent *ev);
void vevent_destroy(CUevent ev);
/* Record @p ev on @p stream; false when the driver refused (the caller falls back to a wait). */
bool vevent_record(CUevent ev, CUstream stream);
/* Has the work before @p ev finished? False while pending, or when the query failed. */
bool vevent_done(CUevent ev);
/* vevent_done in the thread's RELAXED capture mode: a query (a potentially unsafe call) in the
 * default GLOBAL mode would invalidate a GLOBAL capture another thread runs, which xseg cannot
 * see; the event itself is never captured. */
bool vevent_done_relaxed(CUevent ev);
/* Wait for @p ev; false when the driver cannot wait for it. */
bool vevent_wait(CUevent ev);
/* vevent_wait in the thread's RELAXED capture mode (as vevent_done_relaxed): a wait for work
 * outside every capture never invalidates another thread's. */
bool vevent_wait_relaxed(CUevent ev);

#endif
