/*
 * What the user set, process-wide: the configuration in force with its generation, and the
 * callbacks (free-memory callbacks, OOM observers); plus whether the idle-reclaim thread runs.
 * The lowest of core/'s process state: it calls no other core module, so device.c reads the
 * configuration here (settings_gen, settings_copy) while runtime.c, above the devices, applies it.
 */
#ifndef XSEG_CORE_SETTINGS_H
#define XSEG_CORE_SETTINGS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/common.h"
#include "core/process/config.h"
#include "core/process/procstate.h"

/* Generation of the configuration: bumped by every successful settings_apply. */
static inline unsigned settings_gen(void)
{
    return atomic_load_explicit(&xseg_rt.settings.generation, memory_order_acquire);
}
/* Copy the configuration in force and its generation (takes the settings lock briefly). */
void settings_copy(struct cfg *out, unsigned *gen);

/* Parse @p config (NULL: none) over the configuration in force (@p over_current) or over the
 * defaults, and put the result in force. On a parse error nothing changes. */
xseg_status settings_apply(const char *config, bool over_current);
/* The defaults in force again (generation bumped) and every callback detached (xseg_shutdown). */
void settings_reset(void);

/* Append a callback (@p fn not NULL); XSEG_ERROR_OUT_OF_MEMORY when the list cannot grow. */
xseg_status settings_add_oom_observer(xseg_oom_observer fn, void *user);
xseg_status settings_add_free_memory_callback(xseg_free_memory_callback fn, void *user);

/* The stale-access observers (xseg_attach_stale_observer): run them on @p r (no allocator lock
 * held); false when none is attached (the report then goes to stderr). */
xseg_status settings_add_stale_observer(xseg_stale_observer fn, void *user);
bool settings_run_stale_observers(const xseg_stale_report *r);
/* Is debug_stale_access in force (the free path's one test: relaxed, no lock)? */
static inline bool settings_stale_on(void)
{
    return atomic_load_explicit(&xseg_rt.settings.stale_on, memory_order_relaxed);
}

/* Run the free-memory callbacks (no allocator lock held). Returns nonzero if any freed. */
int settings_run_free_memory_callbacks(int device, size_t requested);
bool settings_have_free_memory_callbacks(void);
/* Run the OOM observers (no allocator lock held). */
void settings_run_oom_observers(int device, size_t requested, size_t total, size_t free_bytes);

/* Whether idle.c's thread runs now (malloc ticks the idle reclaim when it does not). Kept here,
 * below the devices, so dev_fast_update reads it without calling up into idle.c, which sets it. */
bool settings_idle_thread_running(void);
void settings_set_idle_thread_running(bool running);

#endif
