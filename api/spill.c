/* Public entry points of spill (include/xseg.h; core/services/spill.h): argument checks, then the
 * device that owns the pointer, or each device. */
#include "api/api.h"
#include "api/dispatch.h"
#include "base/error.h"
#include "core/devops.h"

static xseg_status hint_on(struct dev_alloc *d, void *ptr, void *ctx, bool *owned)
{
    return devops_spill_hint(d, ptr, *(const int *)ctx, owned);
}

XSEG_API xseg_status xseg_spill_hint(void *ptr, int hint)
{
    if (!ptr)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_spill_hint: ptr is NULL");
    return api_on_owner("xseg_spill_hint", ptr, hint_on, &hint, NULL);
}

static xseg_status promote_on(struct dev_alloc *d, void *ctx)
{
    (void)ctx;
    return devops_promote(d);
}

XSEG_API xseg_status xseg_promote(int device) { return api_each_device(device, promote_on, NULL); }

struct location_out {
    int *location;
    size_t *host_bytes;
    int *numa_node;
};

static xseg_status location_on(struct dev_alloc *d, void *ptr, void *ctx, bool *owned)
{
    struct location_out *o = ctx;
    return devops_block_location(d, ptr, o->location, o->host_bytes, o->numa_node, owned);
}

XSEG_API xseg_status xseg_block_location(void *ptr, int *location, size_t *host_bytes, int *numa_node)
{
    if (!ptr || !location)
        return err_set(XSEG_ERROR_INVALID_VALUE, "xseg_block_location: %s is NULL", ptr ? "location" : "ptr");
    struct location_out o = {location, host_bytes, numa_node};
    return api_on_owner("xseg_block_location", ptr, location_on, &o, NULL);
}
