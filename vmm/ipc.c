/*
 * Export and import of expandable chunks (see vmm/ipc.h).
 */
#include "vmm/ipc.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "vmm/driver.h"
#include "vmm/segment.h"

#define IPC_MAX_DEVICES 64

/* Per device: 0 not decided yet, else 1 + the handle type mask. */
static _Atomic unsigned ipc_types_cache[IPC_MAX_DEVICES];

static xseg_status ipc_failf(CUresult res, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static xseg_status ipc_failf(CUresult res, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return drv_fail(res, what);
}

/* Does a cuMemCreate with @p types succeed on @p cudev? (The handle is released at once.) */
static int ipc_probe_create(int device, unsigned types)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.requestedHandleTypes = (CUmemAllocationHandleType)types;
    size_t gran = 0;
    if (drv_granularity((CUdevice)device, types, &gran) != XSEG_SUCCESS || gran == 0)
        return 0;
    CUmemGenericAllocationHandle h = 0;
    if (drv->cuMemCreate(&h, gran, &prop, 0) != CUDA_SUCCESS)
        return 0;
    (void)drv->cuMemRelease(h);
    return 1;
}

unsigned ipc_handle_types(int device, CUdevice cudev)
{
    if (device >= 0 && device < IPC_MAX_DEVICES) {
        unsigned c = atomic_load_explicit(&ipc_types_cache[device], memory_order_relaxed);
        if (c)
            return c - 1;
    }
    int posix = 0, fabric = 0;
    if (drv->cuDeviceGetAttribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                  cudev) != CUDA_SUCCESS)
        return CU_MEM_HANDLE_TYPE_NONE; /* not cached: asked again next time */
    if (drv->cuDeviceGetAttribute(&fabric, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, cudev) !=
        CUDA_SUCCESS)
        fabric = 0;
    unsigned types = posix ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : 0;
    /* The attribute says the GPU can; the allocation itself is refused without an IMEX channel
     * (or a fabric manager), so ask for real once. */
    if (fabric && ipc_probe_create(device, types | CU_MEM_HANDLE_TYPE_FABRIC))
        types |= CU_MEM_HANDLE_TYPE_FABRIC;
    if (device >= 0 && device < IPC_MAX_DEVICES)
        atomic_store_explicit(&ipc_types_cache[device], types + 1, memory_order_relaxed);
    return types;
}

xseg_status ipc_export_chunks(const struct seg *seg, const size_t *firsts, size_t n, unsigned type, int *fds,
                              unsigned char *fabric)
{
    size_t done = 0;
    xseg_status st = XSEG_SUCCESS;
    for (; done < n; done++) {
        CUmemGenericAllocationHandle h = 0;
        size_t c = 0;
        if (!seg_chunk(seg, firsts[done], &h, &c, NULL) || c != firsts[done]) {
            st = err_set(XSEG_ERROR_INVALID_VALUE, "ipc export: granule %zu of the segment starts no mapped chunk",
                         firsts[done]);
            break;
        }
        CUresult res;
        if (type == CU_MEM_HANDLE_TYPE_FABRIC) {
            CUmemFabricHandle fh;
            res = drv->cuMemExportToShareableHandle(&fh, h, CU_MEM_HANDLE_TYPE_FABRIC, 0);
            if (res == CUDA_SUCCESS)
                memcpy(fabric + done * IPC_FABRIC_BYTES, &fh, IPC_FABRIC_BYTES);
        } else {
            int fd = -1;
            res = drv->cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
            if (res == CUDA_SUCCESS)
                fds[done] = fd;
        }
        if (res != CUDA_SUCCESS) {
            st = ipc_failf(res, "cuMemExportToShareableHandle(chunk %zu of %zu, %s)", done + 1, n,
                           type == CU_MEM_HANDLE_TYPE_FABRIC ? "FABRIC" : "POSIX_FILE_DESCRIPTOR");
            break;
        }
    }
    if (st != XSEG_SUCCESS && type != CU_MEM_HANDLE_TYPE_FABRIC)
        for (size_t i = 0; i < done; i++)
            close(fds[i]);
    return st;
}

xseg_status ipc_import_map(CUcontext ctx, unsigned type, const int *fds, const unsigned char *fabric, size_t n,
                           const uint64_t *sizes, const CUmemAccessDesc *access, int naccess, CUdeviceptr *base)
{
    xseg_status st = drv_ctx_ensure(ctx);
    if (st != XSEG_SUCCESS)
        return st;
    size_t size = 0;
    for (size_t i = 0; i < n; i++) {
        if (sizes[i] == 0 || sizes[i] > SIZE_MAX - size)
            return err_set(XSEG_ERROR_INVALID_VALUE, "ipc import: chunk %zu of %zu has an invalid size", i + 1, n);
        size += (size_t)sizes[i];
    }
    if (n == 0)
        return err_set(XSEG_ERROR_INVALID_VALUE, "ipc import: no chunks");
    CUdeviceptr va = 0;
    /* Exactly the chunks' bytes: PyTorch reserves 9/8 of device memory per import (#186213). */
    CUresult res = drv->cuMemAddressReserve(&va, size, 0, 0, 0);
    if (res != CUDA_SUCCESS)
        return ipc_failf(res, "cuMemAddressReserve(%zu bytes) for an imported block", size);
    size_t mapped = 0, at = 0;
    CUmemGenericAllocationHandle unreleased = 0; /* a mapped chunk's handle whose release failed */
    for (; mapped < n; mapped++) {
        CUmemGenericAllocationHandle h = 0;
        void *os = type == CU_MEM_HANDLE_TYPE_FABRIC ? (void *)(uintptr_t)(fabric + mapped * IPC_FABRIC_BYTES)
                                                     : (void *)(intptr_t)fds[mapped];
        res = drv->cuMemImportFromShareableHandle(&h, os, (CUmemAllocationHandleType)type);
        if (res != CUDA_SUCCESS) {
            st = ipc_failf(res, "cuMemImportFromShareableHandle(chunk %zu of %zu, %s)", mapped + 1, n,
                           type == CU_MEM_HANDLE_TYPE_FABRIC ? "FABRIC" : "POSIX_FILE_DESCRIPTOR");
            goto fail;
        }
        res = drv->cuMemMap(va + at, (size_t)sizes[mapped], 0, h, 0);
        /* The mapping holds the memory from here; our handle reference is not needed. */
        CUresult rel = drv->cuMemRelease(h);
        if (res != CUDA_SUCCESS) {
            st = ipc_failf(res, "cuMemMap(chunk %zu of %zu, %llu bytes) of an imported handle", mapped + 1, n,
                           (unsigned long long)sizes[mapped]);
            goto fail;
        }
        at += (size_t)sizes[mapped];
        if (rel != CUDA_SUCCESS) {
            mapped++;
            unreleased = h;
            st = ipc_failf(rel, "cuMemRelease of imported chunk %zu's handle (after mapping it)", mapped);
            goto fail;
        }
    }
    res = drv->cuMemSetAccess(va, size, access, (size_t)naccess);
    if (res != CUDA_SUCCESS) {
        st = ipc_failf(res, "cuMemSetAccess(%zu bytes, %d device(s)) of an imported block", size, naccess);
        goto fail;
    }
    *base = va;
    return XSEG_SUCCESS;

fail:
    /* Several adjacent whole mappings may be unmapped in one call. */
    if (at && drv->cuMemUnmap(va, at) != CUDA_SUCCESS) {
        size_t o = 0;
        for (size_t i = 0; i < mapped && o < at; i++) {
            (void)drv->cuMemUnmap(va + o, (size_t)sizes[i]);
            o += (size_t)sizes[i];
        }
    }
    (void)drv->cuMemAddressFree(va, size);
    if (unreleased)
        (void)drv->cuMemRelease(unreleased); /* retried once unmapped: nothing stays imported */
    return st;
}

xseg_status ipc_unmap(CUcontext ctx, CUdeviceptr base, size_t size, bool *unmapped)
{
    xseg_status st = drv_ctx_ensure(ctx);
    if (st != XSEG_SUCCESS)
        return st;
    if (!*unmapped) {
        CUresult res = drv->cuMemUnmap(base, size);
        if (res != CUDA_SUCCESS)
            return ipc_failf(res, "cuMemUnmap(0x%llx, %zu) of an imported block", (unsigned long long)base, size);
        *unmapped = true;
    }
    CUresult res = drv->cuMemAddressFree(base, size);
    if (res != CUDA_SUCCESS)
        return ipc_failf(res, "cuMemAddressFree(0x%llx, %zu) of an imported block (already unmapped)",
                         (unsigned long long)base, size);
    return XSEG_SUCCESS;
}
