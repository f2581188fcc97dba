/*
 * xseg's PyTorch pluggable-allocator entry points (xseg_torch_*), apart from the allocator's own
 * API (xseg.h, which includes this header; including this one alone includes xseg.h too).
 */
#ifndef XSEG_TORCH_H
#define XSEG_TORCH_H

#include "xseg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * PyTorch pluggable-allocator entry points:
 *   torch.cuda.memory.CUDAPluggableAllocator("libxseg.so", "xseg_torch_malloc", "xseg_torch_free")
 * They report failures through xseg_last_error() and return NULL / nothing. PyTorch does not
 * check the NULL (a tensor gets it as its data pointer); xseg.torch.enable()'s adapter calls
 * xseg_malloc instead and raises torch.cuda.OutOfMemoryError with xseg's message.
 * ------------------------------------------------------------------------------------------- */

/** PyTorch's malloc hook: xseg_malloc(); NULL on failure, with xseg_last_error() set. */
XSEG_API void *xseg_torch_malloc(size_t size, int device, struct CUstream_st *stream);
/** PyTorch's free hook: xseg_free() (@p size, @p device and @p stream are PyTorch's and unused). */
XSEG_API void xseg_torch_free(void *ptr, size_t size, int device, struct CUstream_st *stream);
/** PyTorch's init hook: initializes xseg as its first call would (the environment's configuration). */
XSEG_API void xseg_torch_init(int device_count);
/** PyTorch's empty_cache hook: xseg_empty_cache() on every device. */
XSEG_API void xseg_torch_empty_cache(void);
/** PyTorch's memory-fraction hook: xseg_set_memory_fraction(). */
XSEG_API void xseg_torch_set_memory_fraction(double fraction, int device);
/** PyTorch's record_stream hook: xseg_record_stream(). */
XSEG_API void xseg_torch_record_stream(void *ptr, struct CUstream_st *stream);

/**
 * Tell xseg that every hook of the pluggable allocator is wired (record_stream, empty_cache,
 * memory fraction, the pool hooks), as the Python package's adapter (xseg.torch.enable) does.
 * Without it, the first xseg_torch_malloc prints one warning on stderr: a bare
 * CUDAPluggableAllocator("libxseg.so", "xseg_torch_malloc", "xseg_torch_free") drops
 * Tensor.record_stream() silently. XSEG_NO_TORCH_WARNING=1 in the environment silences it too.
 * Call it before the first allocation. @p attached 0 re-arms the warning.
 */
XSEG_API void xseg_torch_adapter_attached(int attached);

/*
 * Private-pool hooks, for allocator.set_end_allocate_to_pool_fn / set_release_pool. They take
 * (int, MempoolId_t): a struct of two 64-bit integers passed by value has the same calling
 * convention as std::pair<unsigned long long, unsigned long long> (Itanium C++ ABI).
 *
 * set_begin_allocate_to_pool takes a std::function<void(int, MempoolId_t,
 * std::function<bool(cudaStream_t)>)>, which no C function can be. Without it, xseg refuses
 * allocations on a capturing stream (XSEG_ERROR_ILLEGAL_STATE), so torch.cuda.graph() fails
 * cleanly instead of capturing into the default pool. To capture graphs through the pluggable
 * allocator, register a small C++ adapter as the begin hook: keep the std::function filter alive
 * (e.g. in a map keyed by the pool id, erased by the end hook) and call
 * xseg_begin_allocate_to_pool(device, {id.first, id.second}, trampoline, &filter), where
 * trampoline(stream, user) returns (*(std::function<bool(cudaStream_t)> *)user)(stream).
 */
XSEG_API void xseg_torch_end_allocate_to_pool(int device, xseg_pool_id id);
XSEG_API void xseg_torch_release_pool(int device, xseg_pool_id id);

#ifdef __cplusplus
}
#endif

#endif /* XSEG_TORCH_H */
