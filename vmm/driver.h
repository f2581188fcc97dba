/*
 * The CUDA driver, loaded at run time.
 *
 * Nothing links libcuda: drv_load() dlopens $XSEG_LIBCUDA (tests point it at cudaemu) or
 * libcuda.so.1 and resolves every entry point below under the ABI name cuda.h maps it to
 * (cuMemAlloc is cuMemAlloc_v2, and so on). The table's fields carry those ABI names too, because
 * cuda.h's macros rename both the field and the use: `drv->cuMemAlloc(&p, n)` reads naturally and
 * calls cuMemAlloc_v2.
 */
#ifndef XSEG_VMM_DRIVER_H
#define XSEG_VMM_DRIVER_H

#include <stdbool.h>

#include <cuda.h>

#include "base/common.h"

/* Every driver entry point xseg (and its tests) uses. Adding one here is all it takes. */
#define DRV_FOREACH_ENTRY(X)                                                                      \
    X(cuInit)                                                                                     \
    X(cuDriverGetVersion)                                                                         \
    X(cuGetErrorName)                                                                             \
    X(cuGetErrorString)                                                                           \
    X(cuDeviceGetCount)                                                                           \
    X(cuDeviceGet)                                                                                \
    X(cuDeviceGetName)                                                                            \
    X(cuDeviceGetUuid)                                                                            \
    X(cuDeviceGetAttribute)                                                                       \
    X(cuDeviceTotalMem)                                                                           \
    X(cuDeviceCanAccessPeer)                                                                      \
    X(cuDevicePrimaryCtxRetain)                                                                   \
    X(cuDevicePrimaryCtxRelease)                                                                  \
    X(cuCtxSetCurrent)                                                                            \
    X(cuCtxGetCurrent)                                                                            \
    X(cuCtxGetDevice)                                                                             \
    X(cuCtxPushCurrent)                                                                           \
    X(cuCtxPopCurrent)                                                                            \
    X(cuCtxSynchronize)                                                                           \
    X(cuMemGetInfo)                                                                               \
    X(cuMemAlloc)                                                                                 \
    X(cuMemFree)                                                                                  \
    X(cuMemcpyHtoD)                                                                               \
    X(cuMemcpyDtoH)                                                                               \
    X(cuMemsetD8)                                                                                 \
    X(cuPointerGetAttribute)                                                                      \
    X(cuMemGetAllocationGranularity)                                                              \
    X(cuMemAddressReserve)                                                                        \
    X(cuMemAddressFree)                                                                           \
    X(cuMemCreate)                                                                                \
    X(cuMemRelease)                                                                               \
    X(cuMemMap)                                                                                   \
    X(cuMemUnmap)                                                                                 \
    X(cuMemSetAccess)                                                                             \
    X(cuMemGetAccess)                                                                             \
    X(cuMemRetainAllocationHandle)                                                                \
    X(cuMemExportToShareableHandle)                                                               \
    X(cuMemImportFromShareableHandle)                                                             \
    X(cuStreamCreate)                                                                             \
    X(cuStreamDestroy)                                                                            \
    X(cuStreamSynchronize)                                                                        \
    X(cuStreamQuery)                                                                              \
    X(cuStreamWaitEvent)                                                                          \
    X(cuStreamBeginCapture)                                                                       \
    X(cuStreamEndCapture)                                                                         \
    X(cuStreamIsCapturing)                                                                        \
    X(cuStreamGetCaptureInfo)                                                                     \
    X(cuThreadExchangeStreamCaptureMode)                                                          \
    X(cuGraphDestroy)                                                                             \
    X(cuEventCreate)                                                                              \
    X(cuEventDestroy)                                                                             \
    X(cuEventRecord)                                                                              \
    X(cuEventQuery)                                                                               \
    X(cuEventSynchronize)                                                                         \
    /* pinned host memory, async copies and memset (services: sleep offload, wake) */   \
    X(cuMemHostAlloc)                                                                             \
    X(cuMemFreeHost)                                                                              \
    X(cuMemHostRegister)                                                                          \
    X(cuMemHostUnregister)                                                                        \
    X(cuMemcpyHtoDAsync)                                                                          \
    X(cuMemcpyDtoHAsync)                                                                          \
    X(cuMemsetD8Async)                                                                            \
    X(cuMemcpyDtoDAsync)                                                                          \
    /* capture graph: graph_capture_record_stream_reuse (vmm/capture.c) */                       \
    X(cuStreamUpdateCaptureDependencies)                                                          \
    X(cuGraphAddEmptyNode)                                                                        \
    X(cuGraphNodeGetDependencies)                                                                 \
    X(cuGraphGetNodes)                                                                            \
    X(cuGraphNodeGetType)                                                                         \
    /* the allocator's own kernels: range fill and compare (vmm/kernel.c, debug_stale_access) */  \
    X(cuModuleLoadData)                                                                           \
    X(cuModuleGetFunction)                                                                        \
    X(cuModuleUnload)                                                                             \
    X(cuLaunchKernel)

/* The resolved entry points. Field names are the ABI names (see the top of this file). */
struct drv_api {
#define DRV_FIELD(fn) __typeof__(fn) *fn;
    DRV_FOREACH_ENTRY(DRV_FIELD)
#undef DRV_FIELD
};

/* The loaded driver, or NULL before a successful drv_load(). Read-only after load. */
extern XSEG_HIDDEN const struct drv_api *drv;

/*
 * Load and initialize the driver once (thread-safe; later calls return the first result).
 * Tries $XSEG_LIBCUDA when set, else "libcuda.so.1". Resolves every entry point, then cuInit(0).
 * @return XSEG_SUCCESS, or XSEG_ERROR_DRIVER with a message naming the library path tried, the
 *         missing symbol, or the failing call and its CUresult name.
 */
xseg_status drv_load(void);

/*
 * cuMemcpyBatchAsync (CUDA 12.8 on), resolved apart from the table because it is optional: NULL
 * where the driver lacks it, and every caller then queues one copy per call. Resolved under the
 * ABI name cuda.h 13.0 maps it to, cuMemcpyBatchAsync_v2 (eight parameters); a 12.8 driver, whose
 * cuMemcpyBatchAsync takes a ninth (size_t *failIdx), has no such symbol and is one without the
 * call here. drv_batch_hide(true) makes a loaded driver look like one without it (tests of the
 * fallback; cudaemu always exports it), false restores it.
 */
typedef __typeof__(cuMemcpyBatchAsync) drv_batch_fn;
extern XSEG_HIDDEN drv_batch_fn *drv_memcpy_batch;
void drv_batch_hide(bool hide);

/* The CUresult's name ("CUDA_ERROR_OUT_OF_MEMORY"), through cuGetErrorName when loaded.
 * Never NULL; unknown codes give "CUDA_ERROR_<number>" from a thread-local buffer. */
const char *drv_error_name(CUresult res);

/*
 * Turn a failed driver call into an xseg status with a message: "cuMemMap(...) failed:
 * CUDA_ERROR_OUT_OF_MEMORY". CUDA_ERROR_OUT_OF_MEMORY maps to XSEG_ERROR_OUT_OF_MEMORY,
 * everything else to XSEG_ERROR_DRIVER. @p what names the call and, ideally, its arguments.
 */
xseg_status drv_fail(CUresult res, const char *what);

/* Why this thread's last driver OOM happened: a virtual address reservation for a new segment
 * (cuMemAddressReserve: the address space is exhausted or limited) rather than device memory.
 * drv_fail forgets it at every OOM; drv_note_va_oom(res), after that reservation's drv_fail,
 * records it when res is CUDA_ERROR_OUT_OF_MEMORY. drv_take_va_oom reads and forgets it. */
void drv_note_va_oom(CUresult res);
bool drv_take_va_oom(void);

/* Device facts xseg reads once per device. */
struct drv_device_info {
    CUdevice dev;
    CUcontext primary_ctx;   /* retained primary context */
    size_t total_mem;
    size_t granularity;      /* minimum VMM granularity for a pinned device allocation */
    int vmm_supported;       /* CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
    char name[256];
    unsigned char uuid[16];  /* cuDeviceGetUuid: names the device's memory-group tables */
};

/* Query @p ordinal: handle, primary context (retained), memory, VMM support and granularity.
 * @return XSEG_ERROR_INVALID_DEVICE naming the index and the device count when out of range. */
xseg_status drv_device_query(int ordinal, struct drv_device_info *info);
/* Give back the primary context's retain of a drv_device_query whose result is not kept. */
void drv_device_unquery(const struct drv_device_info *info);

/* The minimum VMM granularity of a pinned allocation on @p dev with @p handle_types requested
 * (0: none): the one place it is asked (device query, segments, IPC probes). */
xseg_status drv_granularity(CUdevice dev, unsigned handle_types, size_t *out);

/* A dma-buf fd for [ptr, ptr + size) (cuMemGetHandleForAddressRange, DMA_BUF_FD, no flags): the
 * driver's result; CUDA_ERROR_NOT_SUPPORTED when the driver lacks the entry point. Context current. */
CUresult drv_range_dmabuf(CUdeviceptr ptr, size_t size, int *fd);
/* CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED of @p dev; -1 when unreadable. */
int drv_dmabuf_attribute(CUdevice dev);

/* Devices the driver reports (cuDeviceGetCount). Driver loaded. */
xseg_status drv_device_count(int *count);

/* Free and total memory of the current context's device (cuMemGetInfo). Context current. */
xseg_status drv_mem_info(size_t *free_bytes, size_t *total_bytes);

/* Can @p dev access the memory of @p peer (cuDeviceCanAccessPeer)? Driver loaded. */
xseg_status drv_can_access_peer(CUdevice dev, CUdevice peer, int *can);

/* Make @p ctx current on this thread if it is not already (cheap when it is). */
xseg_status drv_ctx_ensure(CUcontext ctx);

#endif
