/* PyTorch's CUDAPluggableAllocator entry points. PyTorch keeps size/device/stream per pointer
 * itself and turns a NULL from malloc into its own OutOfMemoryError, so these only forward;
 * failures are left in xseg_last_error() and never printed. */
#include "src/api.h"
#include "src/common.h"
#include "src/runtime.h"

XSEG_API void *xseg_torch_malloc(size_t size, int device, struct CUstream_st *stream)
{
    void *p = NULL;
    if (api_malloc(&p, size, device, stream) != XSEG_SUCCESS)
        return NULL;
    return p;
}

XSEG_API void xseg_torch_free(void *ptr, size_t size, int device, struct CUstream_st *stream)
{
    (void)size;
    (void)device;
    (void)stream;
    (void)api_free(ptr);
}

XSEG_API void xseg_torch_init(int device_count)
{
    (void)device_count;
    (void)rt_ensure();
}

XSEG_API void xseg_torch_empty_cache(void) { (void)xseg_empty_cache(-1); }

XSEG_API void xseg_torch_set_memory_fraction(double fraction, int device)
{
    (void)xseg_set_memory_fraction(fraction, device);
}

XSEG_API void xseg_torch_record_stream(void *ptr, struct CUstream_st *stream)
{
    (void)xseg_record_stream(ptr, stream);
}
