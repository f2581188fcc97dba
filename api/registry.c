/* Public entry points of the registration ledger (include/xseg.h, docs/registrations.md; the work
 * is core/policy/registry.c). */
#include "api/dispatch.h"
#include "base/error.h"
#include "core/policy/registry.h"
#include "core/process/settings.h"
#include "core/runtime.h"

struct register_args {
    size_t size;
    const xseg_range_callbacks *callbacks;
    void *ctx;
};

static xseg_status register_on(struct dev_alloc *d, void *ptr, void *ctx, bool *owned)
{
    const struct register_args *a = ctx;
    return reg_add(d, (uintptr_t)ptr, a->size, a->callbacks, a->ctx, owned);
}

XSEG_API xseg_status xseg_register_range(void *ptr, size_t size, const xseg_range_callbacks *callbacks, void *ctx)
{
    if (!ptr || !callbacks || !size)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_register_range: %s", !ptr ? "ptr is NULL"
                       : !callbacks ? "callbacks is NULL" : "size is 0");
    if ((uintptr_t)ptr + size < (uintptr_t)ptr)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_register_range: [%p, +%zu) wraps around", ptr, size);
    struct register_args a = {size, callbacks, ctx};
    return api_on_owner_or(ptr, register_on, &a, "xseg_register_range: [%p, +%zu) is not inside one segment of "
                           "xseg (a range across two segments, or memory xseg did not allocate)", ptr, size);
}

XSEG_API xseg_status xseg_unregister_range(void *ptr, size_t size, void *ctx)
{
    return reg_remove((uintptr_t)ptr, size, ctx);
}

XSEG_API xseg_status xseg_registration_stats_get(int device, xseg_registration_stats *stats)
{
    if (!stats)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_registration_stats_get: stats is NULL");
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    if (st == XSEG_SUCCESS)
        reg_stats(d, stats);
    return st;
}

struct dmabuf_args {
    size_t size;
    int *fd;
    size_t *offset;
};

static xseg_status dmabuf_on(struct dev_alloc *d, void *ptr, void *ctx, bool *owned)
{
    const struct dmabuf_args *a = ctx;
    return reg_dmabuf(d, (uintptr_t)ptr, a->size, a->fd, a->offset, owned);
}

XSEG_API xseg_status xseg_range_dmabuf(void *ptr, size_t size, int *fd, size_t *offset)
{
    if (!ptr || !size || !fd || !offset)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_range_dmabuf: %s", !ptr ? "ptr is NULL" : !size ? "size is 0"
                       : !fd ? "fd is NULL" : "offset is NULL");
    *fd = -1;
    *offset = 0;
    if ((uintptr_t)ptr + size < (uintptr_t)ptr)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_range_dmabuf: [%p, +%zu) wraps around", ptr, size);
    struct dmabuf_args a = {size, fd, offset};
    return api_on_owner_or(ptr, dmabuf_on, &a, "xseg_range_dmabuf: [%p, +%zu) is not inside one segment of xseg",
                           ptr, size);
}

XSEG_API xseg_status xseg_registration_safe(int *safe, char *reason, size_t size, size_t *len)
{
    if (!safe)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_registration_safe: safe is NULL");
    if (!reason && size)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_registration_safe: reason is NULL but size is %zu", size);
    /* As xseg_get_config: the configuration in force, the lazy one read from the environment. */
    xseg_status st = rt_forked_child() ? XSEG_SUCCESS : rt_ensure();
    if (st != XSEG_SUCCESS)
        return st;
    struct cfg c;
    unsigned gen;
    settings_copy(&c, &gen);
    *safe = reg_config_safe(&c, reason, size, len);
    return XSEG_SUCCESS;
}
