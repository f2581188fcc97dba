/* The allocator's own device kernels (see kernel.h). Not built yet: every call answers
 * XSEG_ERROR_NOT_SUPPORTED, so callers take their per-block fallback (issue 50 builds it). */
#include "vmm/kernel.h"

#include "base/error.h"

xseg_status vkern_ready(void)
{
    return err_set(XSEG_ERROR_NOT_SUPPORTED, "the allocator's kernels are not built in yet");
}

xseg_status vkern_fill(const struct vkern_range *ranges, size_t n, unsigned char value, CUstream stream)
{
    (void)ranges, (void)n, (void)value, (void)stream;
    return vkern_ready();
}

xseg_status vkern_check(const struct vkern_range *ranges, size_t n, unsigned char value, CUstream stream,
                        size_t *first)
{
    (void)ranges, (void)n, (void)value, (void)stream, (void)first;
    return vkern_ready();
}

void vkern_release(CUcontext ctx)
{
    (void)ctx;
}
