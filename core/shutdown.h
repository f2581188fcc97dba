/*
 * xseg_shutdown: the process back to its start. Every device is emptied (live blocks freed,
 * private pools ended and released, cached memory and pooled events given back to the driver),
 * IPC imports closed, history cleared and its tables freed, observers and callbacks detached, the
 * settings back to their defaults, the idle thread joined, and every sub-state of xseg_rt
 * (core/process/procstate.h) back to its start with what it pointed to freed, the devices' included
 * (rt_teardown); the next call initializes again. A device's state keeps its pages' address
 * range (runtime.c): another thread's last slot hit may still point into it (core/device/fast.h, fast_tls.slot).
 */
#ifndef XSEG_CORE_SHUTDOWN_H
#define XSEG_CORE_SHUTDOWN_H

#include "base/common.h"

/* XSEG_ERROR_ILLEGAL_STATE (nothing changed) when a capture is under way or a pool sleeps on a
 * device, or in a forked child; a driver failure stops it with that error (call it again). */
xseg_status shutdown_process(void);

#endif
