/*
 * The classic path: cuMemAlloc / cuMemFree, PROT_NONE address space (never host-accessible, as on
 * a GPU) whose bytes are an anonymous private mapping at an address only the emulator knows (its
 * view: MAP_NORESERVE, so sparse; devmem.c moves them), sharing the per-device capacity
 * with cuMemCreate; managed memory (cuMemAllocManaged, host-accessible at its address, and
 * cuMemPrefetchAsync); cuMemGetInfo; and the synchronous copies and memset, which move the bytes
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

/* A block of @p bytesize on the current device, counted against its capacity (whole host pages).
 * Device memory (cuMemAlloc): PROT_NONE address space, its bytes a view only cudaemu knows.
 * Managed memory (cuMemAllocManaged): one read-write mapping that is both its address and its
 * view, so the host reaches it where the device does. */
static CUresult alloc_block(CUdeviceptr *dptr, size_t bytesize, bool managed)
{
    CUcontext c = emu_ctx_current();
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
    /* Page-aligned, so the driver's 256-byte alignment holds; the bytes read zero when new. */
    void *p = mmap(NULL, len, managed ? PROT_READ | PROT_WRITE : PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        goto fail_taken;
    void *view = managed ? p : mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (view == MAP_FAILED)
        goto fail_mapped;
    *ph = (struct emu_phys){.fd = -1, .dev = dev, .size = len, .handles = 1, .classic = true, .view = view};
    a->base = (uintptr_t)p;
    a->size = bytesize;
    a->mapped = len;
    a->dev = dev;
    a->managed = managed;
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
    if (!managed)
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

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
    EMU_ENTER(cuMemAlloc);
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    if (!emu_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_block(dptr, bytesize, false);
}

/*
 * Managed memory, as the driver documents it (cuda.h, CUDA 13.0): flags must be exactly
 * CU_MEM_ATTACH_GLOBAL or CU_MEM_ATTACH_HOST and a size of 0 is INVALID_VALUE; the memory is
 * valid on the host and on every device, freed by cuMemFree. The model: one copy of the bytes,
 * host-accessible at its address and reached by copies, memsets and kernels of any device (as
 * with CONCURRENT_MANAGED_ACCESS, which every emulated device reports), counted against the
 * allocating device's capacity from allocation to cuMemFree wherever it was prefetched
 * (cudaemu's choice: the driver may populate it at first touch; unmeasured). Stream attachment
 * (ATTACH_HOST, cuStreamAttachMemAsync) restricts nothing here.
 */
CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    EMU_ENTER(cuMemAllocManaged);
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    if (!emu_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (bytesize == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_block(dptr, bytesize, true);
}

/* Is every byte of [addr, addr + count) managed memory? Lock held. */
static bool managed_range_locked(uintptr_t addr, size_t count)
{
    if (addr + count < addr)
        return false;
    for (uintptr_t cur = addr; cur < addr + count;) {
        const struct emu_alloc *a = emu_alloc_at_locked(cur);
        if (!a || !a->managed)
            return false;
        cur = a->base + a->mapped;
    }
    return true;
}

/*
 * cuMemPrefetchAsync (the CUDA 13 form: a CUmemLocation and flags; ABI name
 * cuMemPrefetchAsync_v2). Documented: flags must be 0 and the range managed memory
 * (INVALID_VALUE), a device target a valid ordinal (INVALID_DEVICE); HOST and HOST_NUMA_CURRENT
 * ignore the id, HOST_NUMA needs a node the host has (INVALID_VALUE, cudaemu's choice). cudaemu's
 * choices, unmeasured: a count of 0 is INVALID_VALUE; on a capturing stream it invalidates the
 * capture (STREAM_CAPTURE_UNSUPPORTED); a destroyed or unknown stream is INVALID_HANDLE. With one
 * copy of the bytes a prefetch moves nothing: the address and the bytes stay as they were.
 */
CUresult CUDAAPI cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUmemLocation location, unsigned int flags,
                                    CUstream hStream)
{
    EMU_ENTER(cuMemPrefetchAsync);
    if (!emu_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (flags || !count || !devPtr)
        return CUDA_ERROR_INVALID_VALUE;
    switch (location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        if (!emu_dev_valid(location.id))
            return CUDA_ERROR_INVALID_DEVICE;
        break;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
        break;
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
        if (location.id < 0 || location.id >= emu.cfg.numa_nodes)
            return CUDA_ERROR_INVALID_VALUE;
        break;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    emu_lock();
    CUresult r = CUDA_SUCCESS;
    CUstream s = emu_stream_resolve_locked(hStream);
    if (!managed_range_locked((uintptr_t)devPtr, count)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (!s) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else {
        r = emu_capture_refuse_locked(s);
    }
    emu_unlock();
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
    if (!a->managed) /* a managed block's address is its view: it goes with its memory */
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
