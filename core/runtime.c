/* Process-wide state above the devices (see runtime.h). */
#include <pthread.h>
#include <stdlib.h>

#include "base/error.h"
#include "base/fork.h"
#include "base/hostmem.h"
#include "base/pages.h"
#include "base/witness.h"
#include "core/services/group.h"
#include "core/services/idle.h"
#include "core/runtime.h"
#include "core/process/settings.h"
#include "core/device/placement.h"

/* This module's state is xseg_rt.rt (core/process/procstate.h). */
FORK_MUTEX_AT(FORK_RANK_RUNTIME, rt_lock, xseg_rt.rt.lock)

/* In a forked child (base/fork.c runs this on its one thread): CUDA forbids using the parent's
 * driver state, so when the parent loaded the driver (cuInit ran), forget its devices (their
 * locks may be held by threads that do not exist here) and refuse every later call that needs
 * the runtime. A parent that never loaded it leaves nothing: the child initialises cleanly. */
static void rt_fork_child(void)
{
    if (!drv)
        return;
    atomic_store(&xseg_rt.rt.forked, true);
    atomic_store(&xseg_rt.rt.ready, 0);
    xseg_rt.rt.ndevices = 0;
    for (int i = 0; i < ALLOC_MAX_DEVICES; i++)
        atomic_store(&xseg_rt.rt.devs[i], NULL); /* the copies are left as they are: never touched again */
}
FORK_CHILD(FORK_RANK_RUNTIME, rt_fork_child)

bool rt_forked_child(void) { return atomic_load_explicit(&xseg_rt.rt.forked, memory_order_relaxed); }

static xseg_status rt_fork_refuse(void)
{
    return err_set(XSEG_ERROR_ILLEGAL_STATE,
                   "xseg: this process was forked from one that had initialised CUDA; the parent's GPU state "
                   "cannot be used after fork (CUDA's rule): use the 'spawn' start method, or call xseg in the "
                   "child only if the parent never did");
}

/* Start or stop the idle-reclaim thread to match the configuration in force, handing it the
 * device table (xseg_rt.rt.lock released: a stop joins the thread, which takes device locks). */
static xseg_status rt_idle_sync(void) { return idle_thread_sync(rt_device_peek, xseg_rt.rt.ndevices); }

/* The driver's dlopen and cuInit, with no lock of ours held: a library loaded there may register
 * fork handlers, which waits for glibc's fork-handler lock, held by a fork() whose prepare handler
 * (base/fork.c) would be waiting for xseg_rt.rt.lock. drv_load runs once (pthread_once, which a forked
 * child restarts if the parent was inside it). */
static xseg_status rt_load_driver(void) { return drv_load(); }

/* Load the driver (loaded already: rt_load_driver) and apply @p config (or the environment's). xseg_rt.rt.lock held. */
static xseg_status init_locked(const char *config, bool explicit_config)
{
    xseg_status st = drv_load();
    if (st != XSEG_SUCCESS)
        return st;
    if (!atomic_load(&xseg_rt.rt.ready)) {
        int count = 0;
        if ((st = drv_device_count(&count)) != XSEG_SUCCESS)
            return st;
        xseg_rt.rt.ndevices = count < ALLOC_MAX_DEVICES ? count : ALLOC_MAX_DEVICES;
    }
    const char *var = NULL;
    if (!config) {
        config = cfg_from_env(&var);
    }
    st = settings_apply(config, atomic_load(&xseg_rt.rt.ready) && explicit_config);
    if (st != XSEG_SUCCESS)
        return var ? err_prefix(st, "%s", var) : st;
    atomic_store(&xseg_rt.rt.ready, 1);
    return XSEG_SUCCESS;
}

/* Before initializing: refused in a forked child (rt_fork_refuse), else the driver loaded. */
static xseg_status rt_enter(void)
{
    if (rt_forked_child())
        return rt_fork_refuse();
    return rt_load_driver();
}

xseg_status rt_ensure_slow(void)
{
    if (XSEG_LIKELY(atomic_load_explicit(&xseg_rt.rt.ready, memory_order_acquire)))
        return XSEG_SUCCESS;
    xseg_status st = rt_enter();
    if (st != XSEG_SUCCESS)
        return st;
    mutex_lock(&xseg_rt.rt.lock);
    bool ran = !atomic_load(&xseg_rt.rt.ready);
    st = ran ? init_locked(NULL, false) : XSEG_SUCCESS;
    mutex_unlock(&xseg_rt.rt.lock);
    /* The environment's configuration may ask for the idle-reclaim thread. */
    return ran && st == XSEG_SUCCESS ? rt_idle_sync() : st;
}

xseg_status rt_device_slow(int device, struct dev_alloc **out)
{
    xseg_status st = rt_ensure();
    if (st != XSEG_SUCCESS)
        return st;
    if (device < 0 || device >= xseg_rt.rt.ndevices)
        return err_set(XSEG_ERROR_INVALID_DEVICE, "invalid device %d: the driver reports %d device%s", device,
                       xseg_rt.rt.ndevices, xseg_rt.rt.ndevices == 1 ? "" : "s");
    struct dev_alloc *d = atomic_load_explicit(&xseg_rt.rt.devs[device], memory_order_acquire);
    if (XSEG_LIKELY(d)) {
        *out = d;
        return XSEG_SUCCESS;
    }
    /* The driver query with the lock released (an init or another device's creation need not
     * wait); the build, which allocates nothing, and the publication under it. */
    struct drv_device_info info;
    if ((st = drv_device_query(device, &info)) != XSEG_SUCCESS)
        return st;
    mutex_lock(&xseg_rt.rt.lock);
    d = atomic_load(&xseg_rt.rt.devs[device]);
    bool keep = false; /* this query's retain of the primary context is kept */
    bool created = false;
    if (!d) {
        void *home = xseg_rt.rt.homes[device];
        if (!home && (home = pages_map(DEV_HOME_BYTES)))
            xseg_rt.rt.homes[device] = home;
        if (home) {
            /* One retain for the process, like the driver's load: a re-creation after
             * xseg_shutdown gives its own back. */
            keep = !xseg_rt.rt.retained[device];
            xseg_rt.rt.retained[device] = true;
            d = dev_create(device, &info, home);
            if (d)
                place_device_init(d);
            created = true;
            atomic_store_explicit(&xseg_rt.rt.devs[device], d, memory_order_release);
        } else {
            st = err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory creating the allocator of device %d",
                         device);
        }
    }
    mutex_unlock(&xseg_rt.rt.lock);
    if (!keep)
        drv_device_unquery(&info); /* lost a race, failed, or retained already */
    if (st != XSEG_SUCCESS)
        return st;
    if (created)
        group_attach(d); /* memory_group: join with the device (this thread created it) */
    *out = d;
    return XSEG_SUCCESS;
}

void rt_teardown(void)
{
    mutex_lock(&xseg_rt.rt.lock);
    for (int i = 0; i < ALLOC_MAX_DEVICES; i++) {
        struct dev_alloc *d = atomic_load(&xseg_rt.rt.devs[i]);
        if (!d)
            continue;
        atomic_store(&xseg_rt.rt.devs[i], NULL);
        dev_destroy(d);
        pages_discard(xseg_rt.rt.homes[i], DEV_HOME_BYTES);
    }
    mutex_unlock(&xseg_rt.rt.lock);
}

xseg_status rt_reset(void)
{
    mutex_lock(&xseg_rt.rt.lock);
    atomic_store(&xseg_rt.rt.ready, 0);
    mutex_unlock(&xseg_rt.rt.lock);
    return rt_idle_sync();
}

/* ---- init and config -------------------------------------------------------------------- */

xseg_status rt_init(const char *config)
{
    xseg_status st = rt_enter();
    if (st != XSEG_SUCCESS)
        return st;
    mutex_lock(&xseg_rt.rt.lock);
    st = init_locked(config, config != NULL);
    mutex_unlock(&xseg_rt.rt.lock);
    /* The idle-reclaim thread follows the configuration. */
    return st == XSEG_SUCCESS ? rt_idle_sync() : st;
}

xseg_status rt_set_config(const char *config)
{
    /* A forked child keeps the parent's configuration and may change it; there is no device
     * and no idle thread to follow it. */
    if (rt_forked_child())
        return settings_apply(config, true);
    xseg_status st = rt_ensure();
    if (st != XSEG_SUCCESS)
        return st;
    st = settings_apply(config, true);
    return st == XSEG_SUCCESS ? rt_idle_sync() : st;
}
