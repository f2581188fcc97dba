/*
 * The classic path: cuMemAlloc / cuMemFree over private anonymous mappings (MAP_NORESERVE, so
 * sparse like the VMM memory), sharing the per-device capacity with cuMemCreate; cuMemGetInfo;
 * and the synchronous copies and memset, which are plain memcpy/memset on the device address:
 * touching unmapped or inaccessible memory faults (SIGSEGV), as a kernel would fault the GPU.
 * Copies take at least their bytes over the entry's bandwidth when one is set (CUDAEMU_LATENCY).
 */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdlib.h>

#include "cudaemu/emu.h"

CUresult CUDAAPI cuMemGetInfo(size_t *free_bytes, size_t *total)
{
    EMU_ENTER(cuMemGetInfo);
    if (!free_bytes || !total)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext c = emu_ctx_current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    emu_lock();
    *total = emu.cfg.total_mem;
    *free_bytes = emu_mem_free_locked(c->ordinal);
    emu_unlock();
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
    EMU_ENTER(cuMemAlloc);
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext c = emu_ctx_current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (bytesize > SIZE_MAX - page)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t len = (bytesize + page - 1) & ~(page - 1);
    struct emu_alloc *a = calloc(1, sizeof *a);
    if (!a)
        return CUDA_ERROR_OUT_OF_MEMORY;
    int dev = c->ordinal;
    emu_lock();
    CUresult r = emu_capture_unsafe_call_locked();
    if (r != CUDA_SUCCESS)
        goto fail;
    r = CUDA_ERROR_OUT_OF_MEMORY;
    /* Accounting counts whole host pages, what the mapping really takes. */
    if (!emu_mem_take_locked(dev, len))
        goto fail;
    /* Page-aligned, so the driver's 256-byte alignment holds. */
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED)
        goto fail_taken;
    a->base = (uintptr_t)p;
    a->size = bytesize;
    a->mapped = len;
    a->dev = dev;
    if (emu_map_put(&emu.allocs, a->base, a)) {
        munmap(p, len);
        goto fail_taken;
    }
    emu_unlock();
    *dptr = (CUdeviceptr)a->base;
    return CUDA_SUCCESS;
fail_taken:
    emu_mem_add_locked(dev, len, false);
fail:
    emu_unlock();
    free(a);
    return r;
}

CUresult CUDAAPI cuMemFree(CUdeviceptr dptr)
{
    EMU_ENTER(cuMemFree);
    if (!emu_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    emu_lock();
    CUresult r = emu_capture_unsafe_call_locked();
    if (r != CUDA_SUCCESS || !dptr) {   /* cuMemFree(0) succeeds (H100, driver 580.159.04) */
        emu_unlock();
        return r;
    }
    struct emu_alloc *a = emu_map_del(&emu.allocs, (uint64_t)dptr);
    if (!a) {
        emu_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    munmap((void *)a->base, a->mapped);
    emu_mem_add_locked(a->dev, a->mapped, false);
    emu_unlock();
    free(a);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    EMU_ENTER(cuMemcpyHtoD);
    if (!emu_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!ByteCount)
        return CUDA_SUCCESS;
    if (!dstDevice || !srcHost)
        return CUDA_ERROR_INVALID_VALUE;
    /* The current device must have been granted access (cuMemSetAccess) to VMM memory. */
    CUresult acc = emu_vmm_access_check((uintptr_t)dstDevice, ByteCount, emu_ctx_current()->ordinal,
                                        CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    if (acc != CUDA_SUCCESS)
        return acc;
    bool pageable = emu_host_pageable(srcHost, ByteCount);
    uint64_t t0 = emu_now_ns();
    memcpy((void *)(uintptr_t)dstDevice, srcHost, ByteCount);
    size_t link = emu_vmm_link_bytes((uintptr_t)dstDevice, ByteCount); /* host-located VMM memory */
    emu_copy_wait(EMU_E_cuMemcpyHtoD, ByteCount, link, pageable, t0);
    emu_model_advance_to(emu_model_now() + emu_copy_ns(EMU_E_cuMemcpyHtoD, ByteCount, link, pageable));
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyDtoH(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    EMU_ENTER(cuMemcpyDtoH);
    if (!emu_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!ByteCount)
        return CUDA_SUCCESS;
    if (!dstHost || !srcDevice)
        return CUDA_ERROR_INVALID_VALUE;
    /* The current device must have been granted access (cuMemSetAccess) to VMM memory. */
    CUresult acc = emu_vmm_access_check((uintptr_t)srcDevice, ByteCount, emu_ctx_current()->ordinal,
                                        CU_MEM_ACCESS_FLAGS_PROT_READ);
    if (acc != CUDA_SUCCESS)
        return acc;
    bool pageable = emu_host_pageable(dstHost, ByteCount);
    uint64_t t0 = emu_now_ns();
    memcpy(dstHost, (const void *)(uintptr_t)srcDevice, ByteCount);
    size_t link = emu_vmm_link_bytes((uintptr_t)srcDevice, ByteCount); /* host-located VMM memory */
    emu_copy_wait(EMU_E_cuMemcpyDtoH, ByteCount, link, pageable, t0);
    emu_model_advance_to(emu_model_now() + emu_copy_ns(EMU_E_cuMemcpyDtoH, ByteCount, link, pageable));
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemsetD8(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    EMU_ENTER(cuMemsetD8);
    if (!emu_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!N)
        return CUDA_SUCCESS;
    if (!dstDevice)
        return CUDA_ERROR_INVALID_VALUE;
    /* The current device must have been granted access (cuMemSetAccess) to VMM memory. */
    CUresult acc = emu_vmm_access_check((uintptr_t)dstDevice, N, emu_ctx_current()->ordinal,
                                        CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    if (acc != CUDA_SUCCESS)
        return acc;
    /* Zeros over VMM memory: punched out of the memory file, so clearing gigabytes costs no host
     * memory (the result reads the same). */
    if (uc || !emu_vmm_zero((uintptr_t)dstDevice, N))
        memset((void *)(uintptr_t)dstDevice, uc, N);
    return CUDA_SUCCESS;
}
