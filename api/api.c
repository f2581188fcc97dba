/* Public entry points (include/xseg.h): argument checks, lazy initialization, device lookup.
 * The work happens in core/ (alloc.c's operations, snapshot.c's segment walk) under each device's lock. */
#include <stdio.h>
#include <stdlib.h>

#include "base/hostmem.h"
#include "core/alloc.h"
#include "core/devops.h"
#include "api/api.h"
#include "api/dispatch.h"
#include "base/error.h"
#include "core/policy/events.h"
#include "core/policy/registry.h"
#include "core/runtime.h"
#include "core/services/hostalloc.h"
#include "core/snapshot.h"
#include "core/index/stats.h"

#define XSEG_STR2(x) #x
#define XSEG_STR(x) XSEG_STR2(x)

XSEG_API const char *xseg_version(void)
{
    return XSEG_STR(XSEG_API_VERSION_MAJOR) "." XSEG_STR(XSEG_API_VERSION_MINOR) "." XSEG_STR(XSEG_API_VERSION_PATCH);
}

XSEG_API unsigned xseg_version_api(void)
{
    return ((unsigned)XSEG_API_VERSION_MAJOR << 16) | ((unsigned)XSEG_API_VERSION_MINOR << 8) |
           (unsigned)XSEG_API_VERSION_PATCH;
}

/* The device that served the last free on this thread: tried first, since frees usually hit
 * the device of the previous one. Only used with several devices (api_free handles one). */
static _Thread_local int api_last_device;

xseg_status api_malloc_slow(void **ptr, size_t size, int device, struct CUstream_st *stream)
{
    if (!ptr)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_malloc: ptr is NULL");
    *ptr = NULL;
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    if (st != XSEG_SUCCESS)
        return st;
    if (size == 0)
        return XSEG_SUCCESS;
    return alloc_malloc(ptr, size, d, stream);
}

XSEG_API xseg_status xseg_malloc(void **ptr, size_t size, int device, struct CUstream_st *stream)
{
    return api_malloc(ptr, size, device, stream);
}

static xseg_status free_on(struct dev_alloc *d, void *ptr, void *ctx, bool *owned)
{
    (void)ctx;
    return alloc_free(d, ptr, owned);
}

xseg_status api_free_multi(void *ptr, int n)
{
    int first = n > 1 ? api_last_device : 0, dev;
    xseg_status st;
    if (!api_owner(ptr, first, free_on, NULL, &st, &dev))
        return alloc_free_unknown(ptr);
    if (dev != first)
        api_last_device = dev;
    return st;
}

xseg_status api_free_miss(void *ptr)
{
    if (fast_front_free(ptr))
        return XSEG_SUCCESS;
    xseg_status st = rt_ensure();
    if (XSEG_UNLIKELY(st != XSEG_SUCCESS))
        return st;
    int n = rt_device_count();
    /* One device (the common case): no search, no thread-local hint. */
    if (XSEG_LIKELY(n == 1)) {
        struct dev_alloc *d = rt_device_peek(0);
        if (XSEG_LIKELY(d))
            return alloc_free_sole(d, ptr);
        return alloc_free_unknown(ptr);
    }
    return api_free_multi(ptr, n);
}

XSEG_API xseg_status xseg_free(void *ptr) { return api_free(ptr); }

static xseg_status record_stream_on(struct dev_alloc *d, void *ptr, void *stream, bool *owned)
{
    return ev_record_stream(d, ptr, stream, owned);
}

XSEG_API xseg_status xseg_record_stream(void *ptr, struct CUstream_st *stream)
{
    if (!ptr)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_record_stream: ptr is NULL");
    return api_on_owner("xseg_record_stream", ptr, record_stream_on, stream, NULL);
}

struct base_out {
    void **base;
    size_t *size;
};

static xseg_status base_allocation_on(struct dev_alloc *d, void *ptr, void *ctx, bool *owned)
{
    struct base_out *o = ctx;
    return devops_base_allocation(d, ptr, o->base, o->size, owned);
}

XSEG_API xseg_status xseg_base_allocation(void *ptr, void **base, size_t *size)
{
    if (!ptr || !base)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_base_allocation: %s is NULL", ptr ? "base" : "ptr");
    struct base_out o = {base, size};
    return api_on_owner("xseg_base_allocation", ptr, base_allocation_on, &o, NULL);
}

static xseg_status empty_op(struct dev_alloc *d, void *arg)
{
    (void)arg;
    return devops_empty_cache(d);
}

/* Registrants of cached pages release them first (docs/registrations.md). */
static xseg_status do_empty(struct dev_alloc *d, void *arg)
{
    return reg_around(d, REG_SCOPE_FREE, (xseg_pool_id){0, 0}, XSEG_RANGE_RECLAIM, empty_op, arg);
}

XSEG_API xseg_status xseg_empty_cache(int device) { return api_each_device(device, do_empty, NULL); }

XSEG_API xseg_status xseg_check_stale(int device, size_t *found)
{
    if (found)
        *found = 0;
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    if (st != XSEG_SUCCESS)
        return st;
    /* The pinned host cache's quarantine too (host reads: also during a capture). */
    size_t host = 0;
    (void)hostalloc_check_stale("xseg_check_stale", false, &host);
    st = devops_check_stale(d, "xseg_check_stale", false, found);
    if (found)
        *found += host;
    return st;
}

XSEG_API xseg_status xseg_stale_flush(int device)
{
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    return st != XSEG_SUCCESS ? st : devops_stale_flush(d);
}

XSEG_API xseg_status xseg_set_memory_fraction(double fraction, int device)
{
    if (!(fraction >= 0.0 && fraction <= 1.0))
        return err_set(XSEG_ERROR_INVALID_VALUE, "invalid fraction: %g. Please set within [0, 1].", fraction);
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    return st != XSEG_SUCCESS ? st : devops_set_fraction(d, fraction);
}

XSEG_API xseg_status xseg_get_memory_fraction(int device, double *fraction)
{
    if (!fraction)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_get_memory_fraction: fraction is NULL");
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    if (st == XSEG_SUCCESS)
        *fraction = devops_get_fraction(d);
    return st;
}

XSEG_API xseg_status xseg_enable_peer_access(int device, int peer)
{
    struct dev_alloc *d, *p;
    xseg_status st = rt_device(device, &d);
    if (st != XSEG_SUCCESS)
        return st;
    if ((st = rt_device(peer, &p)) != XSEG_SUCCESS)
        return st;
    if (peer == device)
        return XSEG_SUCCESS;
    int can = 0;
    if ((st = drv_can_access_peer(p->info.dev, d->info.dev, &can)) != XSEG_SUCCESS)
        return st;
    if (!can)
        return err_set(XSEG_ERROR_NOT_SUPPORTED, "device %d cannot access the memory of device %d", peer, device);
    return devops_enable_peer(d, peer);
}

/* ---- statistics ---------------------------------------------------------------------------- */

XSEG_API xseg_status xseg_get_stats(int device, xseg_device_stats *stats)
{
    if (!stats)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_get_stats: stats is NULL");
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    if (st != XSEG_SUCCESS)
        return st;
    devops_get_stats(d, stats);
    return XSEG_SUCCESS;
}

XSEG_API xseg_status xseg_stat(int device, const char *key, int64_t *value)
{
    if (!key || !value)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_stat: %s is NULL", key ? "value" : "key");
    xseg_device_stats s;
    xseg_status st = xseg_get_stats(device, &s);
    return st != XSEG_SUCCESS ? st : stats_lookup(&s, key, value);
}

XSEG_API xseg_status xseg_stat_key(size_t index, const char **key)
{
    if (!key)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_stat_key: key is NULL");
    *key = stats_key_name(index);
    return XSEG_SUCCESS;
}

static xseg_status do_reset(struct dev_alloc *d, void *arg)
{
    (void)arg;
    devops_reset_peaks(d);
    return XSEG_SUCCESS;
}

XSEG_API xseg_status xseg_reset_peak_stats(int device) { return api_each_device(device, do_reset, NULL); }

static xseg_status do_reset_accumulated(struct dev_alloc *d, void *arg)
{
    (void)arg;
    devops_reset_accumulated(d);
    return XSEG_SUCCESS;
}

XSEG_API xseg_status xseg_reset_accumulated_stats(int device)
{
    return api_each_device(device, do_reset_accumulated, NULL);
}

XSEG_API xseg_status xseg_cache_info(int device, size_t *largest_block)
{
    if (!largest_block)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_cache_info: largest_block is NULL");
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    return st != XSEG_SUCCESS ? st : devops_cache_info(d, largest_block);
}

XSEG_API xseg_status xseg_mem_get_info(int device, size_t *free_bytes, size_t *total_bytes)
{
    if (!free_bytes || !total_bytes)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_mem_get_info: %s is NULL",
                       !free_bytes ? "free_bytes" : "total_bytes");
    *free_bytes = *total_bytes = 0;
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    return st != XSEG_SUCCESS ? st : devops_mem_info(d, free_bytes, total_bytes);
}

XSEG_API xseg_status xseg_memory_summary(int device, char *buf, size_t size, size_t *len)
{
    if (!buf && size)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_memory_summary: buf is NULL but size is %zu", size);
    xseg_device_stats s;
    xseg_status st = xseg_get_stats(device, &s);
    if (st != XSEG_SUCCESS)
        return st;
    stats_format_summary(&s, device, buf, size, len);
    return XSEG_SUCCESS;
}

/* ---- snapshots ----------------------------------------------------------------------------- */

static xseg_status do_snap(struct dev_alloc *d, void *arg) { return snapshot_segments(d, arg); }

XSEG_API xseg_status xseg_take_snapshot(int device, xseg_snapshot **snapshot)
{
    if (!snapshot)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_take_snapshot: snapshot is NULL");
    *snapshot = NULL;
    struct snap_acc a = {0};
    xseg_status st = api_each_device(device, do_snap, &a);
    xseg_snapshot *s = xs_calloc(1, sizeof *s);
    if (st != XSEG_SUCCESS || !s) {
        snap_acc_free(&a);
        xs_free(s);
        return st != XSEG_SUCCESS ? st : err_set(XSEG_ERROR_OUT_OF_MEMORY, "out of host memory taking a snapshot");
    }
    s->nsegments = a.n;
    s->segments = a.segs;
    *snapshot = s;
    return XSEG_SUCCESS;
}

XSEG_API void xseg_snapshot_free(xseg_snapshot *snapshot)
{
    if (!snapshot)
        return;
    for (size_t i = 0; i < snapshot->nsegments; i++)
        xs_free(snapshot->segments[i].blocks);
    xs_free(snapshot->segments);
    xs_free(snapshot);
}
