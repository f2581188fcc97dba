/* Process-wide state (see runtime.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/vec.h"
#include "core/idle.h"
#include "core/runtime.h"

XSEG_HIDDEN _Atomic unsigned rt_cfg_generation;

static pthread_mutex_t rt_lock = PTHREAD_MUTEX_INITIALIZER; /* init, config, device creation */
XSEG_HIDDEN _Atomic int rt_ready;
static struct cfg rt_cfg;
XSEG_HIDDEN int rt_ndevices;
XSEG_HIDDEN struct dev_alloc *_Atomic rt_devs[ALLOC_MAX_DEVICES];

/* Callbacks: append-only arrays, guarded by cb_lock; callers copy and call without it. */
struct cb_entry {
    void (*fn)(void);
    void *user;
};
static pthread_mutex_t cb_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cb_entry *cb_oom, *cb_free;
static size_t n_oom, n_free, cap_oom, cap_free;
static _Atomic size_t n_free_atomic;

/* Load the driver and apply @p config (or the environment's). rt_lock held. */
static xseg_status init_locked(const char *config, bool explicit_config)
{
    xseg_status st = drv_load();
    if (st != XSEG_SUCCESS)
        return st;
    if (!atomic_load(&rt_ready)) {
        int count = 0;
        if ((st = drv_device_count(&count)) != XSEG_SUCCESS)
            return st;
        rt_ndevices = count < ALLOC_MAX_DEVICES ? count : ALLOC_MAX_DEVICES;
    }
    const char *var = NULL;
    if (!config) {
        config = cfg_from_env(&var);
    }
    struct cfg base, parsed;
    if (atomic_load(&rt_ready) && explicit_config)
        base = rt_cfg;
    else
        cfg_default(&base);
    if (config) {
        st = cfg_parse(config, &base, &parsed);
        if (st != XSEG_SUCCESS)
            return var ? err_prefix(st, "%s", var) : st;
    } else {
        parsed = base;
    }
    rt_cfg = parsed;
    atomic_fetch_add_explicit(&rt_cfg_generation, 1, memory_order_release);
    atomic_store(&rt_ready, 1);
    return XSEG_SUCCESS;
}

xseg_status rt_ensure_slow(void)
{
    if (XSEG_LIKELY(atomic_load_explicit(&rt_ready, memory_order_acquire)))
        return XSEG_SUCCESS;
    pthread_mutex_lock(&rt_lock);
    bool ran = !atomic_load(&rt_ready);
    xseg_status st = ran ? init_locked(NULL, false) : XSEG_SUCCESS;
    pthread_mutex_unlock(&rt_lock);
    /* The environment's configuration may ask for the idle-reclaim thread. */
    return ran && st == XSEG_SUCCESS ? idle_thread_sync() : st;
}

void rt_cfg_copy(struct cfg *out, unsigned *gen)
{
    pthread_mutex_lock(&rt_lock);
    *out = rt_cfg;
    *gen = atomic_load(&rt_cfg_generation);
    pthread_mutex_unlock(&rt_lock);
}

xseg_status rt_device_slow(int device, struct dev_alloc **out)
{
    xseg_status st = rt_ensure();
    if (st != XSEG_SUCCESS)
        return st;
    if (device < 0 || device >= rt_ndevices)
        return err_set(XSEG_ERROR_INVALID_DEVICE, "invalid device %d: the driver reports %d device%s", device,
                       rt_ndevices, rt_ndevices == 1 ? "" : "s");
    struct dev_alloc *d = atomic_load_explicit(&rt_devs[device], memory_order_acquire);
    if (XSEG_LIKELY(d)) {
        *out = d;
        return XSEG_SUCCESS;
    }
    pthread_mutex_lock(&rt_lock);
    d = atomic_load(&rt_devs[device]);
    if (!d) {
        /* dev_create reads the config through rt_cfg_copy, which takes rt_lock: build it with
         * the lock released and publish it under the lock. */
        pthread_mutex_unlock(&rt_lock);
        struct dev_alloc *nd = NULL;
        st = dev_create(device, &nd);
        pthread_mutex_lock(&rt_lock);
        if (st == XSEG_SUCCESS) {
            d = atomic_load(&rt_devs[device]);
            if (!d) {
                atomic_store_explicit(&rt_devs[device], nd, memory_order_release);
                d = nd;
            } else {
                free(nd); /* lost a race; nothing was allocated from the driver yet */
            }
        }
    }
    pthread_mutex_unlock(&rt_lock);
    if (st != XSEG_SUCCESS)
        return st;
    *out = d;
    return XSEG_SUCCESS;
}


/* ---- init and config -------------------------------------------------------------------- */

xseg_status rt_init(const char *config)
{
    pthread_mutex_lock(&rt_lock);
    xseg_status st = init_locked(config, config != NULL);
    pthread_mutex_unlock(&rt_lock);
    /* The idle-reclaim thread follows the configuration (with rt_lock released: it takes it). */
    return st == XSEG_SUCCESS ? idle_thread_sync() : st;
}

xseg_status rt_set_config(const char *config)
{
    xseg_status st = rt_ensure();
    if (st != XSEG_SUCCESS)
        return st;
    pthread_mutex_lock(&rt_lock);
    struct cfg parsed;
    st = cfg_parse(config, &rt_cfg, &parsed);
    if (st == XSEG_SUCCESS) {
        rt_cfg = parsed;
        atomic_fetch_add_explicit(&rt_cfg_generation, 1, memory_order_release);
    }
    pthread_mutex_unlock(&rt_lock);
    return st == XSEG_SUCCESS ? idle_thread_sync() : st;
}

/* ---- callbacks --------------------------------------------------------------------------- */

static xseg_status cb_add(struct cb_entry **arr, size_t *n, size_t *cap, void (*fn)(void), void *user)
{
    pthread_mutex_lock(&cb_lock);
    if (!VEC_RESERVE(*arr, *cap, *n + 1)) {
        pthread_mutex_unlock(&cb_lock);
        return err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory attaching a callback");
    }
    (*arr)[*n] = (struct cb_entry){fn, user};
    (*n)++;
    if (arr == &cb_free)
        atomic_store(&n_free_atomic, *n);
    pthread_mutex_unlock(&cb_lock);
    return XSEG_SUCCESS;
}

/* Copy a callback list so it can be called with no lock held (attach may run meanwhile). */
static struct cb_entry *cb_copy(struct cb_entry *const *arr, const size_t *n, size_t *out_n)
{
    pthread_mutex_lock(&cb_lock);
    size_t cnt = *n;
    struct cb_entry *c = cnt ? malloc(cnt * sizeof *c) : NULL;
    if (c)
        memcpy(c, *arr, cnt * sizeof *c);
    else
        cnt = 0;
    pthread_mutex_unlock(&cb_lock);
    *out_n = cnt;
    return c;
}

xseg_status rt_add_oom_observer(xseg_oom_observer fn, void *user)
{
    return cb_add(&cb_oom, &n_oom, &cap_oom, (void (*)(void))fn, user);
}

xseg_status rt_add_free_memory_callback(xseg_free_memory_callback fn, void *user)
{
    return cb_add(&cb_free, &n_free, &cap_free, (void (*)(void))fn, user);
}

bool rt_have_free_memory_callbacks(void) { return atomic_load(&n_free_atomic) != 0; }

int rt_run_free_memory_callbacks(int device, size_t requested)
{
    size_t n;
    struct cb_entry *c = cb_copy(&cb_free, &n_free, &n);
    int any = 0;
    for (size_t i = 0; i < n; i++)
        any |= ((xseg_free_memory_callback)c[i].fn)(device, requested, c[i].user) != 0;
    free(c);
    return any;
}

void rt_run_oom_observers(int device, size_t requested, size_t total, size_t free_bytes)
{
    size_t n;
    struct cb_entry *c = cb_copy(&cb_oom, &n_oom, &n);
    for (size_t i = 0; i < n; i++)
        ((xseg_oom_observer)c[i].fn)(device, requested, total, free_bytes, c[i].user);
    free(c);
}
