/* What the user set, process-wide (see settings.h). */
#include "core/process/settings.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/fork.h"
#include "base/hostmem.h"
#include "base/vec.h"
#include "base/witness.h"

/* This module's state is xseg_rt.settings (core/process/procstate.h). */
FORK_MUTEX_AT(FORK_RANK_SETTINGS, settings_lock, xseg_rt.settings.lock)
FORK_MUTEX_AT(FORK_RANK_CALLBACKS, cb_lock, xseg_rt.settings.cb_lock)

/* ---- the configuration in force ---------------------------------------------------------- */

void settings_copy(struct cfg *out, unsigned *gen)
{
    mutex_lock(&xseg_rt.settings.lock);
    *out = xseg_rt.settings.cfg;
    *gen = atomic_load(&xseg_rt.settings.generation);
    mutex_unlock(&xseg_rt.settings.lock);
}

xseg_status settings_apply(const char *config, bool over_current)
{
    mutex_lock(&xseg_rt.settings.lock);
    struct cfg base, parsed;
    if (over_current)
        base = xseg_rt.settings.cfg;
    else
        cfg_default(&base);
    xseg_status st = config ? cfg_parse(config, &base, &parsed) : XSEG_SUCCESS;
    if (st == XSEG_SUCCESS) {
        xseg_rt.settings.cfg = config ? parsed : base;
        atomic_store_explicit(&xseg_rt.settings.stale_on, xseg_rt.settings.cfg.debug_stale_access,
                              memory_order_relaxed);
        atomic_fetch_add_explicit(&xseg_rt.settings.generation, 1, memory_order_release);
    }
    mutex_unlock(&xseg_rt.settings.lock);
    return st;
}

void settings_reset(void)
{
    mutex_lock(&xseg_rt.settings.lock);
    cfg_default(&xseg_rt.settings.cfg);
    atomic_store_explicit(&xseg_rt.settings.stale_on, false, memory_order_relaxed);
    atomic_fetch_add_explicit(&xseg_rt.settings.generation, 1, memory_order_release);
    mutex_unlock(&xseg_rt.settings.lock);
    mutex_lock(&xseg_rt.settings.cb_lock);
    xs_free(xseg_rt.settings.oom);
    xs_free(xseg_rt.settings.free);
    xs_free(xseg_rt.settings.stale);
    xseg_rt.settings.oom = xseg_rt.settings.free = xseg_rt.settings.stale = NULL;
    xseg_rt.settings.nstale = xseg_rt.settings.capstale = 0;
    xseg_rt.settings.noom = xseg_rt.settings.nfree = xseg_rt.settings.capoom = xseg_rt.settings.capfree = 0;
    atomic_store(&xseg_rt.settings.nfree_atomic, 0);
    mutex_unlock(&xseg_rt.settings.cb_lock);
}

/* ---- callbacks --------------------------------------------------------------------------- */

static xseg_status cb_add(struct settings_cb **arr, size_t *n, size_t *cap, void (*fn)(void), void *user)
{
    mutex_lock(&xseg_rt.settings.cb_lock);
    if (!VEC_RESERVE(*arr, *cap, *n + 1)) {
        mutex_unlock(&xseg_rt.settings.cb_lock);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory attaching a callback");
    }
    (*arr)[*n] = (struct settings_cb){fn, user};
    (*n)++;
    if (arr == &xseg_rt.settings.free)
        atomic_store(&xseg_rt.settings.nfree_atomic, *n);
    mutex_unlock(&xseg_rt.settings.cb_lock);
    return XSEG_SUCCESS;
}

/* Copy a callback list so it can be called with no lock held (attach may run meanwhile). */
static struct settings_cb *cb_copy(struct settings_cb *const *arr, const size_t *n, size_t *out_n)
{
    mutex_lock(&xseg_rt.settings.cb_lock);
    size_t cnt = *n;
    struct settings_cb *c = cnt ? xs_malloc(cnt * sizeof *c) : NULL;
    if (c)
        memcpy(c, *arr, cnt * sizeof *c);
    else
        cnt = 0;
    mutex_unlock(&xseg_rt.settings.cb_lock);
    *out_n = cnt;
    return c;
}

xseg_status settings_add_oom_observer(xseg_oom_observer fn, void *user)
{
    return cb_add(&xseg_rt.settings.oom, &xseg_rt.settings.noom, &xseg_rt.settings.capoom, (void (*)(void))fn, user);
}

xseg_status settings_add_free_memory_callback(xseg_free_memory_callback fn, void *user)
{
    return cb_add(&xseg_rt.settings.free, &xseg_rt.settings.nfree, &xseg_rt.settings.capfree, (void (*)(void))fn, user);
}

xseg_status settings_add_stale_observer(xseg_stale_observer fn, void *user)
{
    return cb_add(&xseg_rt.settings.stale, &xseg_rt.settings.nstale, &xseg_rt.settings.capstale, (void (*)(void))fn,
                  user);
}

bool settings_run_stale_observers(const xseg_stale_report *r)
{
    size_t n;
    struct settings_cb *c = cb_copy(&xseg_rt.settings.stale, &xseg_rt.settings.nstale, &n);
    for (size_t i = 0; i < n; i++)
        ((xseg_stale_observer)c[i].fn)(r, c[i].user);
    xs_free(c);
    return n > 0;
}

bool settings_have_free_memory_callbacks(void) { return atomic_load(&xseg_rt.settings.nfree_atomic) != 0; }

int settings_run_free_memory_callbacks(int device, size_t requested)
{
    size_t n;
    struct settings_cb *c = cb_copy(&xseg_rt.settings.free, &xseg_rt.settings.nfree, &n);
    int any = 0;
    for (size_t i = 0; i < n; i++)
        any |= ((xseg_free_memory_callback)c[i].fn)(device, requested, c[i].user) != 0;
    xs_free(c);
    return any;
}

void settings_run_oom_observers(int device, size_t requested, size_t total, size_t free_bytes)
{
    size_t n;
    struct settings_cb *c = cb_copy(&xseg_rt.settings.oom, &xseg_rt.settings.noom, &n);
    for (size_t i = 0; i < n; i++)
        ((xseg_oom_observer)c[i].fn)(device, requested, total, free_bytes, c[i].user);
    xs_free(c);
}

/* ---- the idle thread --------------------------------------------------------------------- */

bool settings_idle_thread_running(void)
{
    return atomic_load_explicit(&xseg_rt.settings.idle_thread, memory_order_relaxed);
}

void settings_set_idle_thread_running(bool running) { atomic_store(&xseg_rt.settings.idle_thread, running); }
