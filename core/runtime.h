/*
 * Process-wide state above the devices: initialization, the device table (creating each device's
 * allocator on first use), and the idle thread started or stopped with every configuration
 * change. The configuration itself and the callbacks are core/process/settings.h's, below the devices.
 */
#ifndef XSEG_CORE_RUNTIME_H
#define XSEG_CORE_RUNTIME_H

#include <stdatomic.h>

#include "core/device/device.h"
#include "core/process/procstate.h"

/* xseg_init: load the driver, apply @p config (NULL: the environment's) over the defaults. */
xseg_status rt_init(const char *config);
/* xseg_set_config: apply @p config (not NULL) over the config in force; initializes first. */
xseg_status rt_set_config(const char *config);

/* xseg_shutdown's step: the next call initializes again (as after load: the configuration from
 * the environment); the idle thread follows the configuration in force (joined when it is off).
 * The device table keeps its (emptied) allocators for that next use. */
xseg_status rt_reset(void);

/* xseg_shutdown's last step, once every device was emptied: each allocator gives back what it
 * holds (dev_destroy) and the pages of its state (kept mapped for its next creation); the
 * device table is empty. */
void rt_teardown(void);

/* True in a child forked from a process that had loaded the CUDA driver: every call that needs
 * the runtime (rt_ensure, rt_init, hence every device) fails with XSEG_ERROR_ILLEGAL_STATE
 * saying why; the configuration (settings.h) stays readable and writable. */
bool rt_forked_child(void);

/* Initialize lazily (config from the environment) if xseg_init has not run. */
xseg_status rt_ensure_slow(void);
static inline xseg_status rt_ensure(void)
{
    if (XSEG_LIKELY(atomic_load_explicit(&xseg_rt.rt.ready, memory_order_acquire)))
        return XSEG_SUCCESS;
    return rt_ensure_slow();
}

/* The allocator of @p device, created on first use. XSEG_ERROR_INVALID_DEVICE naming the index
 * and the device count when out of range. */
xseg_status rt_device_slow(int device, struct dev_alloc **out);
static inline xseg_status rt_device(int device, struct dev_alloc **out)
{
    /* rt_ndevices is written once, before rt_ready is released. */
    if (XSEG_LIKELY(atomic_load_explicit(&xseg_rt.rt.ready, memory_order_acquire) &&
                    (unsigned)device < (unsigned)xseg_rt.rt.ndevices)) {
        struct dev_alloc *d = atomic_load_explicit(&xseg_rt.rt.devs[device], memory_order_acquire);
        if (XSEG_LIKELY(d != NULL)) {
            *out = d;
            return XSEG_SUCCESS;
        }
    }
    return rt_device_slow(device, out);
}

/* The allocator of @p device if it exists already, else NULL (no creation). */
static inline struct dev_alloc *rt_device_peek(int device)
{
    if ((unsigned)device >= ALLOC_MAX_DEVICES)
        return NULL;
    return atomic_load_explicit(&xseg_rt.rt.devs[device], memory_order_acquire);
}

/* Devices the driver reports (capped at ALLOC_MAX_DEVICES); 0 before initialization. */
static inline int rt_device_count(void) { return xseg_rt.rt.ndevices; }

#endif
