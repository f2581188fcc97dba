/*
 * The per-device dispatch of the public entry points: a call on the device whose allocator owns
 * a pointer (record_stream, IPC export, block handles, free with several devices), or on one
 * device or every device created so far (empty_cache, trim, history).
 */
#ifndef XSEG_API_DISPATCH_H
#define XSEG_API_DISPATCH_H

#include <stdbool.h>

#include "core/runtime.h"

/* A call on device @p d for @p ptr: sets *owned when @p d's allocator owns @p ptr, and then its
 * status is the answer; otherwise the next device is asked. */
typedef xseg_status (*api_owned_fn)(struct dev_alloc *d, void *ptr, void *ctx, bool *owned);

/* A call on one device (api_each_device). */
typedef xseg_status (*api_device_fn)(struct dev_alloc *d, void *ctx);

/* Ask the created devices in turn, starting at @p first (modulo their count), until one owns
 * @p ptr: true, that call's status in *st and its device in *dev. false when none owns it. The
 * runtime must be initialized (rt_ensure). */
bool api_owner(void *ptr, int first, api_owned_fn fn, void *ctx, xseg_status *st, int *dev);

/* rt_ensure, then @p fn on the owner of @p ptr (from device 0): the one owner walk. None owns it:
 * XSEG_ERROR_INVALID_VALUE with the message @p fmt formats (the caller's words for what it asked). */
xseg_status api_on_owner_or(void *ptr, api_owned_fn fn, void *ctx, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* api_on_owner_or with the message "WHAT: pointer P is not a live allocation of xseg" and @p hint
 * (""/NULL for none) appended. */
xseg_status api_on_owner(const char *what, void *ptr, api_owned_fn fn, void *ctx, const char *hint);

/* rt_ensure, then @p fn on @p device (created on first use; a bad index is rt_device's error), or
 * on every device created so far when it is -1: the first failure's status, after all ran. */
xseg_status api_each_device(int device, api_device_fn fn, void *ctx);

#endif
