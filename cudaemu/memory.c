/*
 * The classic path: cuMemAlloc / cuMemFree, PROT_NONE address space (never host-accessible, as on
 * a GPU) whose bytes are an anonymous private mapping at an address only the emulator knows (its
 * view: MAP_NORESERVE, so sparse; devmem.c moves them), sharing the per-device capacity
 * with cuMemCreate; cuMemGetInfo; and the synchronous copies and memset, which move the bytes
 * through devmem.c: an operand that is not device memory the current device may access is an
 * error (ILLEGAL_ADDRESS in a reservation, INVALID_VALUE elsewhere), where a host touch would fault.
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
    struct emu_phys *ph = calloc(1, sizeof *ph);
    if (!a || !ph) {
        free(a);
        free(ph);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    int dev = c->ordinal;
    emu_lock();
    CUresult r = emu_capture_unsafe_call_locked();
    if (r != CUDA_SUCCESS)
        goto fail;
    r = CUDA_ERROR_OUT_OF_MEMORY;
    /* Accounting counts whole host pages, what the mapping really takes. */
    if (!emu_mem_take_locked(dev, len))
        goto fail;
    /* Address space only (page-aligned, so the driver's 256-byte alignment holds); the bytes are
     * the view, zero when new. */
    void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        goto fail_taken;
    void *view = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (view == MAP_FAILED)
        goto fail_mapped;
    *ph = (struct emu_phys){.fd = -1, .dev = dev, .size = len, .handles = 1, .classic = true, .view = view};
    a->base = (uintptr_t)p;
    a->size = bytesize;
    a->mapped = len;
    a->dev = dev;
    a->phys = ph;
    if (emu_map_put(&emu.allocs, a->base, a))
        goto fail_view;
    if (emu_alloc_index_add_locked(a)) {
        emu_map_del(&emu.allocs, a->base);
        goto fail_view;
    }
    ph->counted = true; /* from here on its release gives the bytes back */
    emu_unlock();
    *dptr = (CUdeviceptr)a->base;
    return CUDA_SUCCESS;
fail_view:
    munmap(view, len);
fail_mapped:
    munmap(p, len);
fail_taken:
    emu_mem_add_locked(dev, len, false);
fail:
    emu_unlock();
    free(a);
    free(ph);
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
    emu_alloc_index_del_locked(a);
    munmap((void *)a->base, a->mapped);
    a->phys->handles = 0; /* its bytes and count go when no copy moves them any more */
    emu_phys_maybe_free_locked(a->phys);
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
    CUresult acc = emu_dev_check((uintptr_t)dstDevice, ByteCount, emu_ctx_current()->ordinal,
                                 CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    if (acc != CUDA_SUCCESS)
        return acc;
    bool pageable = emu_host_pageable(srcHost, ByteCount);
    uint64_t t0 = emu_now_ns();
    acc = emu_dev_write((uintptr_t)dstDevice, srcHost, ByteCount);
    if (acc != CUDA_SUCCESS)
        return acc;
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
    CUresult acc = emu_dev_check((uintptr_t)srcDevice, ByteCount, emu_ctx_current()->ordinal,
                                 CU_MEM_ACCESS_FLAGS_PROT_READ);
    if (acc != CUDA_SUCCESS)
        return acc;
    bool pageable = emu_host_pageable(dstHost, ByteCount);
    uint64_t t0 = emu_now_ns();
    acc = emu_dev_read(dstHost, (uintptr_t)srcDevice, ByteCount);
    if (acc != CUDA_SUCCESS)
        return acc;
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
    CUresult acc = emu_dev_check((uintptr_t)dstDevice, N, emu_ctx_current()->ordinal,
                                 CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    if (acc != CUDA_SUCCESS)
        return acc;
    /* Zeros are punched out of the memory file, so clearing gigabytes costs no host memory. */
    return emu_dev_set((uintptr_t)dstDevice, uc, N);
}

/* cuPointerGetAttribute: CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE only (what the tests and
 * xseg's GPU probes ask); any other attribute is CUDA_ERROR_NOT_SUPPORTED, cudaemu's limit
 * (README). The answer, an unsigned int as the driver writes it, is whether a NIC may register the
 * memory for GPUDirect RDMA: for a VMM mapping, its chunk was created with
 * allocFlags.gpuDirectRDMACapable on a device reporting GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED; for
 * a cuMemAlloc block, its device reports GPU_DIRECT_RDMA_SUPPORTED (both follow CUDAEMU_RDMA);
 * pinned or registered host memory is 0. An address nothing allocated, mapped or registered (a
 * reservation's unmapped VA included) is CUDA_ERROR_INVALID_VALUE, as the driver documents. */
CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    EMU_ENTER(cuPointerGetAttribute);
    if (!data || !ptr)
        return CUDA_ERROR_INVALID_VALUE;
    if (attribute != CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE)
        return CUDA_ERROR_NOT_SUPPORTED;
    unsigned v = 0;
    CUresult r = CUDA_SUCCESS;
    const struct emu_mapping *m = NULL;
    size_t avail;
    emu_lock();
    int where = emu_vmm_lookup_locked((uintptr_t)ptr, &m);
    if (where == 1) {
        const struct emu_phys *ph = m->handle->phys;
        v = ph->dev >= 0 && ph->prop.allocFlags.gpuDirectRDMACapable && emu.cfg.vmm && emu.cfg.rdma;
    } else if (where < 0 && emu_alloc_at_locked((uintptr_t)ptr)) {
        v = emu.cfg.rdma;
    } else if (where == 0 || !emu_host_range_locked((uintptr_t)ptr, &avail)) {
        r = CUDA_ERROR_INVALID_VALUE;
    }
    emu_unlock();
    if (r == CUDA_SUCCESS)
        *(unsigned *)data = v;
    return r;
}
