/*
 * The bodies of xseg_malloc and xseg_free, inline so that the public entry points and PyTorch's
 * (torch.c) run the same code at the same cost: no call through the PLT, no extra layer.
 */
#ifndef XSEG_SRC_API_H
#define XSEG_SRC_API_H

#include "src/alloc.h"
#include "src/error.h"
#include "src/runtime.h"

/* xseg_free on a machine with several devices: tries the device of the thread's last free first. */
xseg_status api_free_multi(void *ptr, int ndevices);
/* The error of xseg_free for a pointer no device owns. */
xseg_status api_free_unknown(void *ptr);

/* api_malloc when the device's allocator is not at hand (first use, bad index) or size is 0. */
xseg_status api_malloc_slow(void **ptr, size_t size, int device, struct CUstream_st *stream);

static inline xseg_status api_malloc(void **ptr, size_t size, int device, struct CUstream_st *stream)
{
    if (XSEG_UNLIKELY(!ptr))
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_malloc: ptr is NULL");
    *ptr = NULL;
    /* rt_ndevices is written once, before rt_ready is released. */
    struct dev_alloc *d = NULL;
    if (XSEG_LIKELY(atomic_load_explicit(&rt_ready, memory_order_acquire) &&
                    (unsigned)device < (unsigned)rt_ndevices))
        d = atomic_load_explicit(&rt_devs[device], memory_order_acquire);
    if (XSEG_UNLIKELY(!d || size == 0))
        return api_malloc_slow(ptr, size, device, stream);
    return alloc_malloc(d, size, stream, ptr);
}

static inline xseg_status api_free(void *ptr)
{
    if (!ptr)
        return XSEG_SUCCESS;
    xseg_status st = rt_ensure();
    if (XSEG_UNLIKELY(st != XSEG_SUCCESS))
        return st;
    int n = rt_device_count();
    /* One device (the common case): no search, no thread-local hint. */
    if (XSEG_LIKELY(n == 1)) {
        struct dev_alloc *d = rt_device_peek(0);
        bool owned = false;
        if (d && ((st = alloc_free(d, ptr, &owned)), owned))
            return st;
        return api_free_unknown(ptr);
    }
    return api_free_multi(ptr, n);
}

#endif
