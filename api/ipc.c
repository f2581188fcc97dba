/* Public entry points for IPC, segment observers and block handles (include/xseg.h):
 * argument checks and device lookup; the work is in core/policy/ipc.c and core/policy/observe.c. */
#include "api/dispatch.h"
#include "base/error.h"
#include "core/policy/ipc.h"
#include "core/policy/observe.h"
#include "core/runtime.h"

static xseg_status export_on(struct dev_alloc *d, void *ptr, void *out, bool *owned)
{
    return ipc_export_block(d, ptr, out, owned);
}

XSEG_API xseg_status xseg_ipc_export(void *ptr, xseg_ipc_handle **out)
{
    if (!out)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_export: out is NULL");
    *out = NULL;
    if (!ptr)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_export: ptr is NULL");
    return api_on_owner("xseg_ipc_export", ptr, export_on, out, NULL);
}

XSEG_API xseg_status xseg_ipc_handle_info(const xseg_ipc_handle *handle, xseg_ipc_info *info)
{
    if (!handle || !info)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_handle_info: %s is NULL", handle ? "info" : "handle");
    info->type = handle->type;
    info->device = handle->device;
    info->size = handle->size;
    info->offset = handle->offset;
    info->nchunks = handle->nchunks;
    info->span = 0;
    for (size_t i = 0; i < handle->nchunks; i++)
        info->span += (size_t)handle->sizes[i];
    return XSEG_SUCCESS;
}

XSEG_API xseg_status xseg_ipc_send(int unix_socket, const xseg_ipc_handle *handle)
{
    if (!handle)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_send: handle is NULL");
    if (unix_socket < 0)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_send: socket %d is not a descriptor", unix_socket);
    return ipc_send(unix_socket, handle);
}

XSEG_API xseg_status xseg_ipc_recv(int unix_socket, xseg_ipc_handle **out)
{
    if (!out)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_recv: out is NULL");
    *out = NULL;
    if (unix_socket < 0)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_recv: socket %d is not a descriptor", unix_socket);
    return ipc_recv(unix_socket, out);
}

XSEG_API xseg_status xseg_ipc_serialize(const xseg_ipc_handle *handle, void *buf, size_t size, size_t *len)
{
    if (!handle)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_serialize: handle is NULL");
    if (!buf && size)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_serialize: buf is NULL but size is %zu", size);
    return ipc_serialize(handle, buf, size, len);
}

XSEG_API xseg_status xseg_ipc_deserialize(const void *buf, size_t len, xseg_ipc_handle **out)
{
    if (!out)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_deserialize: out is NULL");
    *out = NULL;
    if (!buf)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_deserialize: buf is NULL");
    return ipc_deserialize(buf, len, out);
}

XSEG_API xseg_status xseg_ipc_import(const xseg_ipc_handle *handle, int device, void **ptr)
{
    if (!ptr)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_import: ptr is NULL");
    *ptr = NULL;
    if (!handle)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_import: handle is NULL");
    struct dev_alloc *d;
    xseg_status st = rt_device(device, &d);
    if (st != XSEG_SUCCESS)
        return st;
    if (!d->info.vmm_supported)
        return err_set(XSEG_ERROR_NOT_SUPPORTED, "xseg_ipc_import: device %d has no VMM support", device);
    return ipc_import(d, handle, ptr);
}

XSEG_API xseg_status xseg_ipc_close(void *ptr)
{
    if (!ptr)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_ipc_close: ptr is NULL");
    return ipc_close(ptr);
}

XSEG_API void xseg_ipc_handle_free(xseg_ipc_handle *handle) { ipc_handle_free(handle); }

XSEG_API xseg_status xseg_attach_segment_observer(xseg_segment_observer fn, void *user)
{
    if (!fn)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_attach_segment_observer: fn is NULL");
    xseg_status st = rt_ensure();
    return st != XSEG_SUCCESS ? st : obs_attach(fn, user, rt_device_peek);
}

XSEG_API xseg_status xseg_detach_segment_observer(xseg_segment_observer fn, void *user)
{
    if (!fn)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_detach_segment_observer: fn is NULL");
    return obs_detach(fn, user);
}

struct handles_out {
    xseg_phys_range *ranges;
    size_t cap, *n;
};

static xseg_status handles_on(struct dev_alloc *d, void *ptr, void *ctx, bool *owned)
{
    struct handles_out *o = ctx;
    return ipc_block_handles(d, ptr, o->ranges, o->cap, o->n, owned);
}

XSEG_API xseg_status xseg_block_handles(void *ptr, xseg_phys_range *ranges, size_t cap, size_t *n)
{
    if (!n)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_block_handles: n is NULL");
    *n = 0;
    if (!ptr)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_block_handles: ptr is NULL");
    if (!ranges && cap)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_block_handles: ranges is NULL but cap is %zu", cap);
    struct handles_out o = {ranges, cap, n};
    return api_on_owner("xseg_block_handles", ptr, handles_on, &o, NULL);
}

static xseg_status handles_release_on(struct dev_alloc *d, void *ptr, void *ctx, bool *owned)
{
    (void)ctx;
    return ipc_block_handles_release(d, ptr, owned);
}

XSEG_API xseg_status xseg_block_handles_release(void *ptr)
{
    if (!ptr)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_block_handles_release: ptr is NULL");
    return api_on_owner("xseg_block_handles_release", ptr, handles_release_on, NULL,
                        " (freed already? a free ends its holds)");
}
