/*
 * Process-wide state: initialization, the configuration in force, the device table, and the
 * user callbacks. Device allocators read the configuration through rt_cfg_gen()/rt_cfg_copy().
 */
#ifndef XSEG_CORE_RUNTIME_H
#define XSEG_CORE_RUNTIME_H

#include <stdatomic.h>

#include "core/device.h"
#include "core/config.h"

/* Process state read by the inline fast paths below (defined in runtime.c). */
extern XSEG_HIDDEN _Atomic int rt_ready;
extern XSEG_HIDDEN int rt_ndevices;
extern XSEG_HIDDEN struct dev_alloc *_Atomic rt_devs[ALLOC_MAX_DEVICES];

/* xseg_init: load the driver, apply @p config (NULL: the environment's) over the defaults. */
xseg_status rt_init(const char *config);
/* xseg_set_config: apply @p config (not NULL) over the config in force; initializes first. */
xseg_status rt_set_config(const char *config);

/* Initialize lazily (config from the environment) if xseg_init has not run. */
xseg_status rt_ensure_slow(void);
static inline xseg_status rt_ensure(void)
{
    if (XSEG_LIKELY(atomic_load_explicit(&rt_ready, memory_order_acquire)))
        return XSEG_SUCCESS;
    return rt_ensure_slow();
}

/* Generation of the configuration: bumped by every successful xseg_init / xseg_set_config. */
extern XSEG_HIDDEN _Atomic unsigned rt_cfg_generation;
static inline unsigned rt_cfg_gen(void)
{
    return atomic_load_explicit(&rt_cfg_generation, memory_order_acquire);
}
/* Copy the configuration in force and its generation (takes the config lock briefly). */
void rt_cfg_copy(struct cfg *out, unsigned *gen);

/* The allocator of @p device, created on first use. XSEG_ERROR_INVALID_DEVICE naming the index
 * and the device count when out of range. */
xseg_status rt_device_slow(int device, struct dev_alloc **out);
static inline xseg_status rt_device(int device, struct dev_alloc **out)
{
    /* rt_ndevices is written once, before rt_ready is released. */
    if (XSEG_LIKELY(atomic_load_explicit(&rt_ready, memory_order_acquire) &&
                    (unsigned)device < (unsigned)rt_ndevices)) {
        struct dev_alloc *d = atomic_load_explicit(&rt_devs[device], memory_order_acquire);
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
    return atomic_load_explicit(&rt_devs[device], memory_order_acquire);
}

/* Devices the driver reports (capped at ALLOC_MAX_DEVICES); 0 before initialization. */
static inline int rt_device_count(void) { return rt_ndevices; }

/* Append a callback (@p fn not NULL); XSEG_ERROR_OUT_OF_MEMORY when the list cannot grow. */
xseg_status rt_add_oom_observer(xseg_oom_observer fn, void *user);
xseg_status rt_add_free_memory_callback(xseg_free_memory_callback fn, void *user);

/* Run the free-memory callbacks (no allocator lock held). Returns nonzero if any freed. */
int rt_run_free_memory_callbacks(int device, size_t requested);
bool rt_have_free_memory_callbacks(void);
/* Run the OOM observers (no allocator lock held). */
void rt_run_oom_observers(int device, size_t requested, size_t total, size_t free_bytes);

#endif
