/* What the user set, process-wide (see settings.h). */
#include "core/settings.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/fork.h"
#include "base/hostmem.h"
#include "base/vec.h"
#include "base/witness.h"

XSEG_HIDDEN _Atomic unsigned settings_generation;

static pthread_mutex_t settings_lock = PTHREAD_MUTEX_INITIALIZER; /* settings_cfg */
FORK_MUTEX(FORK_RANK_SETTINGS, settings_lock)
static struct cfg settings_cfg;
static _Atomic bool settings_idle_thread;

/* Callbacks: append-only arrays, guarded by cb_lock; callers copy and call without it. */
struct cb_entry {
    void (*fn)(void);
    void *user;
};
static pthread_mutex_t cb_lock = PTHREAD_MUTEX_INITIALIZER;
FORK_MUTEX(FORK_RANK_CALLBACKS, cb_lock)
static struct cb_entry *cb_oom, *cb_free;
static size_t n_oom, n_free, cap_oom, cap_free;
static _Atomic size_t n_free_atomic;

/* ---- the configuration in force ---------------------------------------------------------- */

void settings_copy(struct cfg *out, unsigned *gen)
{
    mutex_lock(&settings_lock);
    *out = settings_cfg;
    *gen = atomic_load(&settings_generation);
    mutex_unlock(&settings_lock);
}

xseg_status settings_apply(const char *config, bool over_current)
{
    mutex_lock(&settings_lock);
    struct cfg base, parsed;
    if (over_current)
        base = settings_cfg;
    else
        cfg_default(&base);
    xseg_status st = config ? cfg_parse(config, &base, &parsed) : XSEG_SUCCESS;
    if (st == XSEG_SUCCESS) {
        settings_cfg = config ? parsed : base;
        atomic_fetch_add_explicit(&settings_generation, 1, memory_order_release);
    }
    mutex_unlock(&settings_lock);
    return st;
}

void settings_reset(void)
{
    mutex_lock(&settings_lock);
    cfg_default(&settings_cfg);
    atomic_fetch_add_explicit(&settings_generation, 1, memory_order_release);
    mutex_unlock(&settings_lock);
    mutex_lock(&cb_lock);
    xs_free(cb_oom);
    xs_free(cb_free);
    cb_oom = cb_free = NULL;
    n_oom = n_free = cap_oom = cap_free = 0;
    atomic_store(&n_free_atomic, 0);
    mutex_unlock(&cb_lock);
}

/* ---- callbacks --------------------------------------------------------------------------- */

static xseg_status cb_add(struct cb_entry **arr, size_t *n, size_t *cap, void (*fn)(void), void *user)
{
    mutex_lock(&cb_lock);
    if (!VEC_RESERVE(*arr, *cap, *n + 1)) {
        mutex_unlock(&cb_lock);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory attaching a callback");
    }
    (*arr)[*n] = (struct cb_entry){fn, user};
    (*n)++;
    if (arr == &cb_free)
        atomic_store(&n_free_atomic, *n);
    mutex_unlock(&cb_lock);
    return XSEG_SUCCESS;
}

/* Copy a callback list so it can be called with no lock held (attach may run meanwhile). */
static struct cb_entry *cb_copy(struct cb_entry *const *arr, const size_t *n, size_t *out_n)
{
    mutex_lock(&cb_lock);
    size_t cnt = *n;
    struct cb_entry *c = cnt ? xs_malloc(cnt * sizeof *c) : NULL;
    if (c)
        memcpy(c, *arr, cnt * sizeof *c);
    else
        cnt = 0;
    mutex_unlock(&cb_lock);
    *out_n = cnt;
    return c;
}

xseg_status settings_add_oom_observer(xseg_oom_observer fn, void *user)
{
    return cb_add(&cb_oom, &n_oom, &cap_oom, (void (*)(void))fn, user);
}

xseg_status settings_add_free_memory_callback(xseg_free_memory_callback fn, void *user)
{
    return cb_add(&cb_free, &n_free, &cap_free, (void (*)(void))fn, user);
}

bool settings_have_free_memory_callbacks(void) { return atomic_load(&n_free_atomic) != 0; }

int settings_run_free_memory_callbacks(int device, size_t requested)
{
    size_t n;
    struct cb_entry *c = cb_copy(&cb_free, &n_free, &n);
    int any = 0;
    for (size_t i = 0; i < n; i++)
        any |= ((xseg_free_memory_callback)c[i].fn)(device, requested, c[i].user) != 0;
    xs_free(c);
    return any;
}

void settings_run_oom_observers(int device, size_t requested, size_t total, size_t free_bytes)
{
    size_t n;
    struct cb_entry *c = cb_copy(&cb_oom, &n_oom, &n);
    for (size_t i = 0; i < n; i++)
        ((xseg_oom_observer)c[i].fn)(device, requested, total, free_bytes, c[i].user);
    xs_free(c);
}

/* ---- the idle thread --------------------------------------------------------------------- */

bool settings_idle_thread_running(void)
{
    return atomic_load_explicit(&settings_idle_thread, memory_order_relaxed);
}

void settings_set_idle_thread_running(bool running) { atomic_store(&settings_idle_thread, running); }
