/*
 * The CUDA driver, loaded at run time (contract in vmm/driver.h).
 *
 * drv_load() runs once per process under pthread_once; its status and message are kept so that
 * every later caller, on any thread, gets the same answer and the same text. The table is filled
 * before `drv` is published and never written again, so readers need no lock.
 */
#include <dlfcn.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "vmm/driver.h"

#define DRV_STR2(x) #x
#define DRV_STR(x) DRV_STR2(x)

XSEG_HIDDEN const struct drv_api *drv;

static struct drv_api drv_table;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static xseg_status drv_load_status;
static char drv_load_msg[1024];

static xseg_status drv_load_fail(xseg_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static xseg_status drv_load_fail(xseg_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(drv_load_msg, sizeof drv_load_msg, fmt, ap);
    va_end(ap);
    return st;
}

/* cuMemGetHandleForAddressRange, resolved apart from the table because it is optional. */
static CUresult (*drv_dmabuf_fn)(void *, CUdeviceptr, size_t, CUmemRangeHandleType, unsigned long long);

drv_batch_fn *drv_memcpy_batch;
static drv_batch_fn *drv_batch_resolved;

void drv_batch_hide(bool hide) { drv_memcpy_batch = hide ? NULL : drv_batch_resolved; }

CUresult drv_range_dmabuf(CUdeviceptr ptr, size_t size, int *fd)
{
    *fd = -1;
    if (!drv_dmabuf_fn)
        return CUDA_ERROR_NOT_SUPPORTED;
    return drv_dmabuf_fn(fd, ptr, size, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
}

int drv_dmabuf_attribute(CUdevice dev)
{
    int v = -1;
    return drv->cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev) == CUDA_SUCCESS ? v : -1;
}

static xseg_status drv_do_load(void)
{
    const char *env = getenv("XSEG_LIBCUDA");
    const char *path = env && *env ? env : "libcuda.so.1";
    dlerror();
    /* RTLD_LOCAL: the driver's symbols must not satisfy anyone else's lookups (a test binary
     * may dlopen the same library itself). The handle is kept for the life of the process. */
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        return drv_load_fail(XSEG_ERROR_DRIVER, "cannot load the CUDA driver %s%s: %s%s", path,
                             env && *env ? " (from XSEG_LIBCUDA)" : "", e ? e : "unknown error",
                             env && *env ? ""
                                         : " (no GPU driver here? set XSEG_LIBCUDA to the driver's libcuda.so.1, "
                                           "or to cudaemu's libcudaemu.so to run on the emulator)");
    }
    /* Each entry under its ABI name: the stringified expansion of cuda.h's macro. */
#define DRV_RESOLVE(fn)                                                                           \
    do {                                                                                          \
        void *sym = dlsym(lib, DRV_STR(fn));                                                      \
        if (!sym)                                                                                 \
            return drv_load_fail(XSEG_ERROR_DRIVER,                                               \
                                 "the CUDA driver %s lacks entry point %s (%s); it is too old "   \
                                 "or not a CUDA driver", path, DRV_STR(fn), #fn);                 \
        memcpy(&drv_table.fn, &sym, sizeof sym);                                                  \
    } while (0);
    DRV_FOREACH_ENTRY(DRV_RESOLVE)
#undef DRV_RESOLVE
    /* Optional (CUDA 11.7 on): an older driver still loads, and drv_range_dmabuf says so. */
    void *dmabuf = dlsym(lib, "cuMemGetHandleForAddressRange");
    memcpy(&drv_dmabuf_fn, &dmabuf, sizeof dmabuf);
    /* Optional (CUDA 13.0's ABI of a CUDA 12.8 call): an older driver still loads, without it. */
    void *batch = dlsym(lib, DRV_STR(cuMemcpyBatchAsync));
    memcpy(&drv_batch_resolved, &batch, sizeof batch);
    drv_memcpy_batch = drv_batch_resolved;
    CUresult res = drv_table.cuInit(0);
    if (res != CUDA_SUCCESS) {
        const char *name = NULL;
        if (drv_table.cuGetErrorName(res, &name) != CUDA_SUCCESS || !name)
            name = NULL;
        if (name)
            return drv_load_fail(XSEG_ERROR_DRIVER, "cuInit(0) failed in the CUDA driver %s: %s%s",
                                 path, name,
                                 res == CUDA_ERROR_NO_DEVICE ? " (no CUDA device found)" : "");
        return drv_load_fail(XSEG_ERROR_DRIVER, "cuInit(0) failed in the CUDA driver %s: "
                             "CUDA_ERROR_%d", path, (int)res);
    }
    drv = &drv_table;
    return XSEG_SUCCESS;
}

static void drv_once_fn(void) { drv_load_status = drv_do_load(); }

xseg_status drv_load(void)
{
    pthread_once(&drv_once, drv_once_fn);
    if (drv_load_status != XSEG_SUCCESS)
        return err_set(drv_load_status, "%s", drv_load_msg);
    return XSEG_SUCCESS;
}

const char *drv_error_name(CUresult res)
{
    static _Thread_local char buf[32];
    const char *name = NULL;
    if (drv && drv->cuGetErrorName(res, &name) == CUDA_SUCCESS && name)
        return name;
    if (res == CUDA_SUCCESS)
        return "CUDA_SUCCESS";
    snprintf(buf, sizeof buf, "CUDA_ERROR_%d", (int)res);
    return buf;
}

static _Thread_local bool va_oom; /* drv_note_va_oom */

void drv_note_va_oom(CUresult res)
{
    if (res == CUDA_ERROR_OUT_OF_MEMORY)
        va_oom = true;
}

bool drv_take_va_oom(void)
{
    bool v = va_oom;
    va_oom = false;
    return v;
}

xseg_status drv_fail(CUresult res, const char *what)
{
    xseg_status st = res == CUDA_ERROR_OUT_OF_MEMORY ? XSEG_ERROR_OUT_OF_MEMORY : XSEG_ERROR_DRIVER;
    if (st == XSEG_ERROR_OUT_OF_MEMORY)
        va_oom = false; /* the latest OOM's cause is what counts */
    return err_set(st, "%s failed: %s", what ? what : "a CUDA driver call", drv_error_name(res));
}

/* The one granularity query (drv_granularity); the raw CUresult for drv_device_query's rollback. */
static CUresult drv_granularity_raw(CUdevice dev, unsigned handle_types, size_t *out)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.requestedHandleTypes = (CUmemAllocationHandleType)handle_types;
    *out = 0;
    return drv->cuMemGetAllocationGranularity(out, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
}

xseg_status drv_granularity(CUdevice dev, unsigned handle_types, size_t *out)
{
    CUresult res = drv_granularity_raw(dev, handle_types, out);
    if (res == CUDA_SUCCESS)
        return XSEG_SUCCESS;
    char what[96];
    snprintf(what, sizeof what, "cuMemGetAllocationGranularity(MINIMUM, device %d)", (int)dev);
    return drv_fail(res, what);
}

xseg_status drv_device_query(int ordinal, struct drv_device_info *info)
{
    if (!info)
        return err_set(XSEG_ERROR_INVALID_VALUE, "drv_device_query: info is NULL");
    xseg_status st = drv_load();
    if (st != XSEG_SUCCESS)
        return st;
    memset(info, 0, sizeof *info);
    int count = 0;
    CUresult res = drv->cuDeviceGetCount(&count);
    if (res != CUDA_SUCCESS)
        return drv_fail(res, "cuDeviceGetCount()");
    if (ordinal < 0 || ordinal >= count)
        return err_set(XSEG_ERROR_INVALID_DEVICE,
                       "device %d is out of range: the driver reports %d device(s)", ordinal, count);
    char what[96];
    if ((res = drv->cuDeviceGet(&info->dev, ordinal)) != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuDeviceGet(ordinal %d)", ordinal);
        return drv_fail(res, what);
    }
    if ((res = drv->cuDevicePrimaryCtxRetain(&info->primary_ctx, info->dev)) != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuDevicePrimaryCtxRetain(device %d)", ordinal);
        return drv_fail(res, what);
    }
    /* From here a failure must give the retained context back. */
    if ((res = drv->cuDeviceTotalMem(&info->total_mem, info->dev)) != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuDeviceTotalMem(device %d)", ordinal);
        goto fail;
    }
    if ((res = drv->cuDeviceGetAttribute(&info->vmm_supported,
                                         CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                         info->dev)) != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, "
                 "device %d)", ordinal);
        goto fail;
    }
    if (info->vmm_supported) {
        if ((res = drv_granularity_raw(info->dev, 0, &info->granularity)) != CUDA_SUCCESS) {
            snprintf(what, sizeof what, "cuMemGetAllocationGranularity(MINIMUM, device %d)", ordinal);
            goto fail;
        }
    }
    if ((res = drv->cuDeviceGetName(info->name, (int)sizeof info->name, info->dev)) != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuDeviceGetName(device %d)", ordinal);
        goto fail;
    }
    CUuuid uuid;
    if ((res = drv->cuDeviceGetUuid(&uuid, info->dev)) != CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuDeviceGetUuid(device %d)", ordinal);
        goto fail;
    }
    memcpy(info->uuid, uuid.bytes, sizeof info->uuid);
    return XSEG_SUCCESS;
fail:
    drv->cuDevicePrimaryCtxRelease(info->dev);
    info->primary_ctx = NULL;
    return drv_fail(res, what);
}

void drv_device_unquery(const struct drv_device_info *info)
{
    (void)drv->cuDevicePrimaryCtxRelease(info->dev);
}

xseg_status drv_ctx_ensure(CUcontext ctx)
{
    xseg_status st = drv_load();
    if (st != XSEG_SUCCESS)
        return st;
    CUcontext cur = NULL;
    CUresult res = drv->cuCtxGetCurrent(&cur);
    if (res != CUDA_SUCCESS)
        return drv_fail(res, "cuCtxGetCurrent()");
    if (cur == ctx)
        return XSEG_SUCCESS;
    if ((res = drv->cuCtxSetCurrent(ctx)) != CUDA_SUCCESS)
        return drv_fail(res, "cuCtxSetCurrent()");
    return XSEG_SUCCESS;
}

xseg_status drv_can_access_peer(CUdevice dev, CUdevice peer, int *can)
{
    *can = 0;
    CUresult res = drv->cuDeviceCanAccessPeer(can, dev, peer);
    return res == CUDA_SUCCESS ? XSEG_SUCCESS : drv_fail(res, "cuDeviceCanAccessPeer");
}

xseg_status drv_device_count(int *count)
{
    *count = 0;
    CUresult res = drv->cuDeviceGetCount(count);
    return res == CUDA_SUCCESS ? XSEG_SUCCESS : drv_fail(res, "cuDeviceGetCount");
}

xseg_status drv_mem_info(size_t *free_bytes, size_t *total_bytes)
{
    CUresult res = drv->cuMemGetInfo(free_bytes, total_bytes);
    return res == CUDA_SUCCESS ? XSEG_SUCCESS : drv_fail(res, "cuMemGetInfo");
}
