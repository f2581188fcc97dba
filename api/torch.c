/* PyTorch's CUDAPluggableAllocator entry points. PyTorch keeps size/device/stream per pointer
 * itself, so these only forward; failures are left in xseg_last_error() and never printed.
 * PyTorch does not check what malloc returns: its CUDAPluggableAllocator (2.1 through main) hands
 * a NULL on as the tensor's data pointer instead of raising OutOfMemoryError. A bare pluggable
 * allocator over xseg_torch_malloc therefore fails late and obscurely at OOM; xseg's PyTorch
 * adapter (python/xseg/_torch_adapter.cpp) calls xseg_malloc itself and raises
 * c10::OutOfMemoryError with xseg's message. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "api/api.h"
#include "base/common.h"
#include "base/log.h"
#include "core/runtime.h"

/* Nonzero once the first xseg_torch_malloc has looked for the adapter (or the adapter said it is
 * there): the fast path pays one relaxed load and a predicted branch. */
static atomic_int torch_checked;

XSEG_API void xseg_torch_adapter_attached(int attached)
{
    atomic_store_explicit(&torch_checked, attached ? 1 : 0, memory_order_relaxed);
}

static inline __attribute__((always_inline)) void *torch_malloc(size_t size, int device, struct CUstream_st *stream)
{
    void *p; /* api_malloc writes it on every path (NULL unless it succeeds) */
    if (api_malloc(&p, size, device, stream) != XSEG_SUCCESS)
        return NULL;
    return p;
}

/* A bare CUDAPluggableAllocator calls only malloc and free: record_stream is dropped silently,
 * which lets a side stream's memory be reused under it. Say so once, where the user will look.
 * Cold and reached by a tail call, so the fast path saves no registers for it. */
__attribute__((noinline, cold)) static void *torch_malloc_first(size_t size, int device,
                                                                 struct CUstream_st *stream)
{
    const char *quiet = getenv("XSEG_NO_TORCH_WARNING");
    if (!atomic_exchange(&torch_checked, 1) && !(quiet && *quiet && *quiet != '0'))
        log_warn("warning: xseg_torch_malloc is called without xseg's PyTorch adapter, so "
                 "Tensor.record_stream(), torch.cuda.empty_cache(), memory_stats() and graph capture "
                 "do not reach xseg (a bare CUDAPluggableAllocator calls only malloc and free). "
                 "Install it with `import xseg.torch; xseg.torch.enable()`, or wire every hook in C++ "
                 "and call xseg_torch_adapter_attached(1); XSEG_NO_TORCH_WARNING=1 silences this.");
    return torch_malloc(size, device, stream);
}

XSEG_API void *xseg_torch_malloc(size_t size, int device, struct CUstream_st *stream)
{
    if (XSEG_UNLIKELY(!atomic_load_explicit(&torch_checked, memory_order_relaxed)))
        return torch_malloc_first(size, device, stream);
    return torch_malloc(size, device, stream);
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
