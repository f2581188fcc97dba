/*
 * The bodies of xseg_malloc and xseg_free, inline so that the public entry points and PyTorch's
 * (torch.c) run the same code at the same cost: no call through the PLT, no extra layer.
 */
#ifndef XSEG_API_API_H
#define XSEG_API_API_H

#include "core/alloc.h"
#include "base/error.h"
#include "core/runtime.h"

/* xseg_free on a machine with several devices: tries the device of the thread's last free first. */
xseg_status api_free_multi(void *ptr, int ndevices);

/* api_malloc when ptr is NULL or the device's allocator is not at hand (first use, bad index):
 * the full checks, in the documented order. Cold and never inlined: inlined into xseg_malloc (gcc
 * -O3 does, in the same file), it gives the cached pair a stack frame. */
__attribute__((noinline, cold)) xseg_status api_malloc_slow(void **ptr, size_t size, int device,
                                                            struct CUstream_st *stream);

static inline xseg_status api_malloc(void **ptr, size_t size, int device, struct CUstream_st *stream)
{
    /* Every rare case goes to one out-of-line call with the same arguments, so this needs no
     * stack frame. xseg_rt.rt.ndevices is written once, before .ready is released. Size 0 and
     * the NULL of a failure are alloc_malloc's (its hits serve neither), off the cached pair. */
    struct dev_alloc *d = NULL;
    if (XSEG_LIKELY(ptr && atomic_load_explicit(&xseg_rt.rt.ready, memory_order_acquire) &&
                    (unsigned)device < (unsigned)xseg_rt.rt.ndevices))
        d = atomic_load_explicit(&xseg_rt.rt.devs[device], memory_order_acquire);
    if (XSEG_UNLIKELY(!d))
        return api_malloc_slow(ptr, size, device, stream);
    return alloc_malloc(ptr, size, d, stream);
}

/* api_free past the thread's last slot: its front (core/device/fast.h), then the device's free
 * through the lock. Out of line, so that the cached pair's free keeps no stack frame. */
__attribute__((noinline)) xseg_status api_free_miss(void *ptr);

static inline xseg_status api_free(void *ptr)
{
    if (!ptr)
        return XSEG_SUCCESS;
    /* The ping-pong's free: the block this thread's last hit handed out (any device). */
    if (fast_free_hit(ptr))
        return XSEG_SUCCESS;
    return api_free_miss(ptr);
}

#endif
