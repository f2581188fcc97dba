/*
 * The allocator's own device kernels (debug_stale_access, issue 50): fill byte ranges with one
 * value, and find in each range the first byte that differs from it, many ranges a launch. Their
 * PTX is embedded in kernel.c and JIT-compiled by the driver (cuModuleLoadData) once per context,
 * on first use; nothing is compiled at build time and the library still needs only libcuda.
 * cudaemu runs these two kernels natively, by entry name, and refuses any other module
 * (cudaemu/README.md); the conformance rows run the same PTX on the real driver.
 *
 * Why: the quarantine's fill and check were a driver call per block (a memset at each free, a
 * read-back at each check); one launch over a list of ranges replaces a batch of them, and the
 * check compares on the device, so only one offset per range crosses to the host.
 *
 * Context: callers make the device's context current first (drv_ctx_ensure). Thread-safe (the
 * per-context module and result buffer have their own lock); callers may hold a device lock.
 * After fork(), the child forgets the parent's modules (never unloads them: their context is the
 * parent's). Errors: XSEG_SUCCESS or a status whose message names the call and its arguments;
 * XSEG_ERROR_NOT_SUPPORTED when the driver cannot load or run the module (the caller falls back
 * to vhost_fill / vhost_copy_dtoh), remembered per context so the load is tried once.
 */
#ifndef XSEG_VMM_KERNEL_H
#define XSEG_VMM_KERNEL_H

#include <stddef.h>

#include <cuda.h>

#include "base/common.h"

/* Ranges one launch takes (its parameter block stays under the driver's 4 KiB). More ranges in
 * one call are cut into launches of this many. */
#define VKERN_MAX_RANGES 128

struct vkern_range {
    CUdeviceptr addr; /* any alignment */
    size_t len;       /* bytes; 0 is allowed (nothing done) */
};

/* Load the module for the current context if not yet tried: XSEG_SUCCESS when the kernels can
 * run, XSEG_ERROR_NOT_SUPPORTED (the driver's answer in the message) when not. */
xseg_status vkern_ready(void);

/* Enqueue on @p stream: every byte of ranges[0, n) set to @p value (after everything queued on
 * @p stream before; nothing waits). One launch per VKERN_MAX_RANGES ranges. */
xseg_status vkern_fill(const struct vkern_range *ranges, size_t n, unsigned char value, CUstream stream);

/* Compare ranges[0, n) with @p value on @p stream, after everything queued there before, and wait
 * for the answer: first[i] = the offset of range i's first byte that differs, ranges[i].len when
 * none does. One launch per VKERN_MAX_RANGES ranges, one copy of the offsets to the host and one
 * wait of @p stream per call. */
xseg_status vkern_check(const struct vkern_range *ranges, size_t n, unsigned char value, CUstream stream,
                        size_t *first);

/* Unload the module of context @p ctx, if one was loaded (device teardown, shutdown). */
void vkern_release(CUcontext ctx);

#endif
