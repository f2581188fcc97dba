/* Public entry points of the pinned host caching allocator (include/xseg.h; core/services/hostalloc.c):
 * argument checks, the context the driver calls run in (device 0's primary context, or the
 * stream's device's), then one call into core/. */
#include "api/api.h"
#include "base/error.h"
#include "core/services/hostalloc.h"
#include "core/runtime.h"

/* The primary context of @p device (initializing xseg and the device on first use). */
static xseg_status host_ctx(int device, CUcontext *ctx)
{
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    if (st == XSEG_SUCCESS)
        *ctx = d->info.primary_ctx;
    return st;
}

XSEG_API xseg_status xseg_host_malloc(void **ptr, size_t size)
{
    if (!ptr)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_host_malloc: ptr is NULL");
    *ptr = NULL;
    CUcontext ctx;
    xseg_status st = host_ctx(0, &ctx); /* pinned memory is PORTABLE: any context serves */
    if (st != XSEG_SUCCESS)
        return st;
    hostalloc_sync_thread();
    st = hostalloc_malloc_user(ctx, size, ptr);
    return st == XSEG_SUCCESS ? st : err_prefix(st, "xseg_host_malloc: pinned host memory for %zu bytes", size);
}

XSEG_API xseg_status xseg_host_free(void *ptr)
{
    if (!ptr)
        return XSEG_SUCCESS;
    xseg_status st = rt_ensure();
    return st != XSEG_SUCCESS ? st : hostalloc_free_user(ptr);
}

XSEG_API xseg_status xseg_host_record_stream(void *ptr, int device, struct CUstream_st *stream)
{
    CUcontext ctx;
    xseg_status st = host_ctx(device, &ctx);
    return st != XSEG_SUCCESS ? st : hostalloc_record_stream(ptr, ctx, stream);
}

XSEG_API xseg_status xseg_host_empty_cache(void)
{
    xseg_status st = rt_ensure();
    if (st != XSEG_SUCCESS)
        return st;
    hostalloc_sync_thread();
    return hostalloc_empty_cache();
}

XSEG_API xseg_status xseg_host_stat(const char *key, int64_t *value)
{
    if (!key || !value)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_host_stat: %s is NULL", !key ? "key" : "value");
    return hostalloc_stat(key, value);
}

XSEG_API xseg_status xseg_host_stat_key(size_t index, const char **key)
{
    if (!key)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_host_stat_key: key is NULL");
    *key = hostalloc_stat_key(index);
    return XSEG_SUCCESS;
}

XSEG_API xseg_status xseg_host_reset_peak_stats(void)
{
    hostalloc_reset_peaks();
    return XSEG_SUCCESS;
}

XSEG_API xseg_status xseg_host_reset_accumulated_stats(void)
{
    hostalloc_reset_accumulated();
    return XSEG_SUCCESS;
}
