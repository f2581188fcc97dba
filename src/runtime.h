/*
 * Process-wide state: initialization, the configuration in force, the device table, and the
 * user callbacks. Device allocators read the configuration through rt_cfg_gen()/rt_cfg_copy().
 */
#ifndef XSEG_SRC_RUNTIME_H
#define XSEG_SRC_RUNTIME_H

#include <stdatomic.h>

#include "src/alloc.h"
#include "src/config.h"

/* Initialize lazily (config from the environment) if xseg_init has not run. */
xseg_status rt_ensure(void);

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
xseg_status rt_device(int device, struct dev_alloc **out);
/* The allocator of @p device if it exists already, else NULL (no creation). */
struct dev_alloc *rt_device_peek(int device);
int rt_device_count(void);

/* Run the free-memory callbacks (no allocator lock held). Returns nonzero if any freed. */
int rt_run_free_memory_callbacks(int device, size_t requested);
bool rt_have_free_memory_callbacks(void);
/* Run the OOM observers (no allocator lock held). */
void rt_run_oom_observers(int device, size_t requested, size_t total, size_t free_bytes);

#endif
