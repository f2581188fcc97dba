/* The idle-reclaim thread (core/services/idle.h). */
#include "core/services/idle.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/fork.h"
#include "base/witness.h"
#include "core/device/check.h"
#include "core/policy/events.h"
#include "core/process/settings.h"
#include "core/services/spill.h"
#include "core/services/trim.h"
#include "vmm/capture.h"

/* This module's state is xseg_rt.idle (core/process/procstate.h). */
FORK_MUTEX_AT(FORK_RANK_IDLE_CTL, idle_ctl_lock, xseg_rt.idle.ctl_lock)
FORK_MUTEX_AT(FORK_RANK_IDLE, idle_lock, xseg_rt.idle.lock)

/* settings_idle_thread_running is written only under xseg_rt.idle.ctl_lock (or in a forked child). */
static bool idle_running(void) { return settings_idle_thread_running(); }

/* One pass over a device: pending frees whose events completed, the idle tick (and its trim,
 * down to release_threshold_mb: with idle_release_ms set the threshold is that floor, not a trim
 * of its own: core/services/trim.h). Nothing while a capture is known on the device (queries
 * could invalidate it, and nothing is released during a capture anyway). */
static void idle_service(struct dev_alloc *d)
{
    dev_lock(d, DEV_NEED_OP);
    if (d->cfg.idle_release_ms && !cap_underway(d)) {
        if (ev_waiting(d))
            ev_process(d);
        trim_idle_tick(d);
    }
    /* Spilled pages whose blocks' streams are idle come home where device memory allows. */
    if (XSEG_UNLIKELY(d->spill.host_bytes) && !cap_underway(d))
        (void)spill_promote(d, false);
    dev_fast_update(d);
    dev_unlock(d);
}

/* The period: a quarter of idle_release_ms (the tick's own interval), at least 1 ms. */
static unsigned idle_period_ms(void)
{
    struct cfg c;
    unsigned gen;
    settings_copy(&c, &gen);
    unsigned ms = c.idle_release_ms / 4;
    return ms ? ms : 1;
}

static void *idle_main(void *arg)
{
    (void)arg;
    /* Its queries must never count as unsafe calls against another thread's GLOBAL capture. */
    (void)vmm_capture_relax_thread();
    mutex_lock(&xseg_rt.idle.lock);
    while (!xseg_rt.idle.stop) {
        mutex_unlock(&xseg_rt.idle.lock);
        for (int i = 0; i < xseg_rt.idle.ndevices; i++) {
            struct dev_alloc *d = xseg_rt.idle.device_at(i);
            if (d)
                idle_service(d);
        }
        unsigned ms = idle_period_ms();
        struct timespec until = clock_deadline(CLOCK_MONOTONIC, (int64_t)ms * 1000000);
        mutex_lock(&xseg_rt.idle.lock);
        while (!xseg_rt.idle.stop &&
               pthread_cond_timedwait(&xseg_rt.idle.cond, &xseg_rt.idle.lock, &until) != ETIMEDOUT)
            ;
    }
    mutex_unlock(&xseg_rt.idle.lock);
    return NULL;
}

/* Stop and join the thread (xseg_rt.idle.ctl_lock held). */
static void idle_stop_locked(void)
{
    if (!idle_running())
        return;
    mutex_lock(&xseg_rt.idle.lock);
    xseg_rt.idle.stop = true;
    pthread_cond_signal(&xseg_rt.idle.cond);
    mutex_unlock(&xseg_rt.idle.lock);
    pthread_join(xseg_rt.idle.tid, NULL);
    settings_set_idle_thread_running(false);
}

static void idle_atexit(void)
{
    mutex_lock(&xseg_rt.idle.ctl_lock);
    idle_stop_locked();
    mutex_unlock(&xseg_rt.idle.ctl_lock);
}

static void idle_cond_make(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&xseg_rt.idle.cond, &a);
    pthread_condattr_destroy(&a);
}

/* A forked child has no idle thread (the parent's is not copied; base/fork.c re-initialised both
 * locks): nothing may wait for it or join it, and the condition variable may hold the vanished
 * thread's wait. The parent's thread runs on. */
static void idle_fork_child(void)
{
    settings_set_idle_thread_running(false);
    if (xseg_rt.idle.cond_ready)
        idle_cond_make();
}
FORK_CHILD(FORK_RANK_IDLE, idle_fork_child)

static void idle_init(void)
{
    idle_cond_make();
    xseg_rt.idle.cond_ready = true;
    atexit(idle_atexit);
}

xseg_status idle_thread_sync(dev_peek_fn device_at, int ndevices)
{
    struct cfg c;
    unsigned gen;
    settings_copy(&c, &gen);
    bool want = c.idle_release_thread && c.idle_release_ms;
    if (want == idle_running())
        return XSEG_SUCCESS;
    pthread_once(&xseg_rt.idle.once, idle_init);
    xseg_status st = XSEG_SUCCESS;
    mutex_lock(&xseg_rt.idle.ctl_lock);
    /* Read again: another configuration change may have come first. */
    settings_copy(&c, &gen);
    want = c.idle_release_thread && c.idle_release_ms;
    if (!want) {
        idle_stop_locked();
    } else if (!idle_running()) {
        xseg_rt.idle.stop = false;
        xseg_rt.idle.device_at = device_at;
        xseg_rt.idle.ndevices = ndevices;
        int rc = pthread_create(&xseg_rt.idle.tid, NULL, idle_main, NULL);
        if (rc == 0)
            settings_set_idle_thread_running(true);
        else
            st = err_set(XSEG_ERROR_OUT_OF_MEMORY, "idle_release_thread: cannot start the thread (%s); the next "
                         "mallocs do the idle reclaim instead", strerror(rc));
    }
    mutex_unlock(&xseg_rt.idle.ctl_lock);
    return st;
}
