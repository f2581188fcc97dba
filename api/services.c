/* Public entry points for long-running services (include/xseg.h, issue 14): trim. The policy
 * lives in core/trim.c. */
#include "api/api.h"
#include "base/error.h"
#include "core/runtime.h"
#include "core/trim.h"

XSEG_API xseg_status xseg_trim(int device, size_t keep_bytes)
{
    xseg_status st = rt_ensure();
    if (st != XSEG_SUCCESS)
        return st;
    if (device != -1) {
        struct dev_alloc *d;
        st = rt_device(device, &d);
        return st != XSEG_SUCCESS ? st : trim_device(d, keep_bytes, NULL);
    }
    xseg_status first = XSEG_SUCCESS;
    for (int i = 0; i < rt_device_count(); i++) {
        struct dev_alloc *d = rt_device_peek(i);
        if (d && (st = trim_device(d, keep_bytes, NULL)) != XSEG_SUCCESS && first == XSEG_SUCCESS)
            first = st;
    }
    return first;
}
