/* The per-device dispatch of the public entry points (api/dispatch.h). */
#include "api/dispatch.h"

#include <stdarg.h>
#include <stdio.h>

#include "base/error.h"

bool api_owner(void *ptr, int first, api_owned_fn fn, void *ctx, xseg_status *st, int *dev)
{
    int n = rt_device_count();
    for (int i = 0; i < n; i++) {
        int k = (first + i) % n;
        struct dev_alloc *d = rt_device_peek(k);
        if (!d)
            continue;
        bool owned = false;
        xseg_status s = fn(d, ptr, ctx, &owned);
        if (owned) {
            *st = s;
            *dev = k;
            return true;
        }
    }
    return false;
}

xseg_status api_on_owner_or(void *ptr, api_owned_fn fn, void *ctx, const char *fmt, ...)
{
    xseg_status st = rt_ensure();
    if (st != XSEG_SUCCESS)
        return st;
    int dev;
    if (api_owner(ptr, 0, fn, ctx, &st, &dev))
        return st;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return err_set(XSEG_ERROR_INVALID_VALUE, "%s", msg);
}

xseg_status api_on_owner(const char *what, void *ptr, api_owned_fn fn, void *ctx, const char *hint)
{
    return api_on_owner_or(ptr, fn, ctx, "%s: pointer %p is not a live allocation of xseg%s", what, ptr,
                           hint ? hint : "");
}

xseg_status api_each_device(int device, api_device_fn fn, void *ctx)
{
    xseg_status st = rt_ensure();
    if (st != XSEG_SUCCESS)
        return st;
    if (device != -1) {
        struct dev_alloc *d;
        st = rt_device(device, &d);
        return st != XSEG_SUCCESS ? st : fn(d, ctx);
    }
    xseg_status first = XSEG_SUCCESS;
    for (int i = 0; i < rt_device_count(); i++) {
        struct dev_alloc *d = rt_device_peek(i);
        if (d && (st = fn(d, ctx)) != XSEG_SUCCESS && first == XSEG_SUCCESS)
            first = st;
    }
    return first;
}
