/*
 * Initialization, devices, attributes and contexts. Every device has one context, its primary
 * context (retain/release count references: the context stays usable, as cudaemu has no
 * per-context state to tear down). While retained it holds one descriptor of its own, opened at
 * the first retain and closed at the last release, as the driver opens device files when a
 * context becomes active (a test that compares a process's descriptor count across the first use
 * of a device fails here as on a GPU). The current context is per thread, with a small push/pop
 * stack.
 */
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cudaemu/emu.h"

struct emu_state emu = {.lock = PTHREAD_MUTEX_INITIALIZER};
atomic_bool emu_initialized;

#define CTX_STACK_MAX 16
static _Thread_local CUcontext ctx_stack[CTX_STACK_MAX];
static _Thread_local int ctx_depth;   /* ctx_stack[ctx_depth - 1] is current; 0: none */

CUcontext emu_ctx_current(void) { return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL; }

bool emu_dev_valid(int dev) { return dev >= 0 && dev < emu.cfg.devices; }

static bool ctx_valid(CUcontext c)
{
    return c && c >= &emu.ctx[0] && c < &emu.ctx[emu.cfg.devices] &&
           ((uintptr_t)c - (uintptr_t)&emu.ctx[0]) % sizeof emu.ctx[0] == 0;
}

CUresult CUDAAPI cuInit(unsigned int Flags)
{
    CUresult r = emu_enter(EMU_E_cuInit);
    if (r != CUDA_SUCCESS)
        return r;
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* The real driver fails cuInit itself when it finds no device. */
    if (emu.cfg.devices == 0)
        return CUDA_ERROR_NO_DEVICE;
    emu_lock();
    if (!emu.initialized) {
        for (int d = 0; d < emu.cfg.devices; d++) {
            emu.ctx[d].ordinal = d;
            emu.ctx_fd[d] = -1;
        }
        /* Exportable handles and imports hold a memfd each: make room for many. */
        struct rlimit rl;
        if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
            rl.rlim_cur = rl.rlim_max;
            setrlimit(RLIMIT_NOFILE, &rl);
        }
        emu.initialized = true;
        atomic_store_explicit(&emu_initialized, true, memory_order_release);
    }
    emu_unlock();
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDriverGetVersion(int *driverVersion)
{
    CUresult r = emu_enter(EMU_E_cuDriverGetVersion);
    if (r != CUDA_SUCCESS)
        return r;
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = CUDA_VERSION;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetCount(int *count)
{
    EMU_ENTER(cuDeviceGetCount);
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = emu.cfg.devices;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal)
{
    EMU_ENTER(cuDeviceGet);
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!emu_dev_valid(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
    EMU_ENTER(cuDeviceGetName);
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!emu_dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "cudaemu device %d", dev);
    return CUDA_SUCCESS;
}

/* A stable 16-byte id: processes naming the same CUDAEMU_SHARED see the same UUID (shared.c). */
CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    EMU_ENTER(cuDeviceGetUuid);
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    if (!emu_dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    emu_device_uuid(dev, (unsigned char *)uuid->bytes);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice dev)
{
    EMU_ENTER(cuDeviceTotalMem);
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (!emu_dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = emu.cfg.total_mem;
    return CUDA_SUCCESS;
}

/* Values modelled on an H100 SXM where they matter to nobody but a curious caller. */
CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    EMU_ENTER(cuDeviceGetAttribute);
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    if (!emu_dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if ((int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    int v = 0;
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: v = emu.cfg.vmm; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: v = emu.cfg.vmm; break;
    /* Off unless CUDAEMU_FABRIC=1, like a GPU outside an NVLink/IMEX fabric. */
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED: v = emu.cfg.vmm && emu.cfg.fabric; break;
    /* Off unless CUDAEMU_DMA_BUF=1 / CUDAEMU_RDMA=1 (a device without them: the default). */
    case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: v = emu.cfg.dma_buf; break;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: v = emu.cfg.vmm && emu.cfg.rdma; break;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: v = emu.cfg.rdma; break; /* cuMemAlloc memory */
    /* Host-located VMM memory: both locations unless CUDAEMU_HOST_VMM says fewer. */
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
        v = emu.cfg.vmm && (emu.cfg.host_vmm & EMU_HOST_VMM_NUMA);
        break;
    case CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
        v = emu.cfg.vmm && (emu.cfg.host_vmm & EMU_HOST_VMM_HOST);
        break;
    /* The host node closest to the device, -1 on a system without NUMA (CUDAEMU_HOST_NUMA_ID;
     * default 0, what the H200 of the first acceptance run reported). */
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: v = emu.cfg.host_numa_id[dev]; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = 132; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: v = 1; break; /* cuMemAllocManaged (memory.c) */
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: v = dev; break;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: v = 0; break;
    default: v = 0; break;
    }
    *pi = v;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
    EMU_ENTER(cuDeviceCanAccessPeer);
    if (!canAccessPeer)
        return CUDA_ERROR_INVALID_VALUE;
    if (!emu_dev_valid(dev) || !emu_dev_valid(peerDev))
        return CUDA_ERROR_INVALID_DEVICE;
    *canAccessPeer = dev != peerDev;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    EMU_ENTER(cuDevicePrimaryCtxRetain);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!emu_dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    emu_lock();
    if (!emu.primary_refs[dev] && emu.ctx_fd[dev] < 0 &&
        (emu.ctx_fd[dev] = eventfd(0, EFD_CLOEXEC)) < 0) {
        emu_unlock();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    emu.primary_refs[dev]++;
    emu_unlock();
    *pctx = &emu.ctx[dev];
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
    EMU_ENTER(cuDevicePrimaryCtxRelease);
    if (!emu_dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult r = CUDA_SUCCESS;
    emu_lock();
    if (emu.primary_refs[dev]) {
        if (!--emu.primary_refs[dev] && emu.ctx_fd[dev] >= 0) {
            close(emu.ctx_fd[dev]);
            emu.ctx_fd[dev] = -1;
        }
    } else {
        r = CUDA_ERROR_INVALID_CONTEXT;
    }
    emu_unlock();
    return r;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
    EMU_ENTER(cuCtxSetCurrent);
    if (ctx && !ctx_valid(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    /* Like the driver: replace the top of the stack (push when empty); NULL pops it. */
    if (!ctx) {
        if (ctx_depth)
            ctx_depth--;
    } else if (ctx_depth) {
        ctx_stack[ctx_depth - 1] = ctx;
    } else {
        ctx_stack[ctx_depth++] = ctx;
    }
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
    EMU_ENTER(cuCtxGetCurrent);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = emu_ctx_current();
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice *device)
{
    EMU_ENTER(cuCtxGetDevice);
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext c = emu_ctx_current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    *device = c->ordinal;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx)
{
    EMU_ENTER(cuCtxPushCurrent);
    if (!ctx_valid(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == CTX_STACK_MAX)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ctx_stack[ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx)
{
    EMU_ENTER(cuCtxPopCurrent);
    if (!ctx_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = ctx_stack[--ctx_depth];
    if (pctx)
        *pctx = c;
    return CUDA_SUCCESS;
}

/* Completes all pending (held) work on every stream: a held stream models a GPU that has not
 * got round to the work yet, and synchronizing is waiting for it. Holds stay in force for work
 * recorded afterwards. During a capture it is illegal (the context encompasses a capturing
 * stream) and invalidates every capture. */
CUresult CUDAAPI cuCtxSynchronize(void)
{
    EMU_ENTER(cuCtxSynchronize);
    if (!emu_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    CUresult r = CUDA_SUCCESS;
    emu_lock();
    if (emu.captures_active) {
        size_t pos = 0;
        CUstream s;
        while ((s = emu_map_next(&emu.streams, &pos, NULL)))
            if (s->cap)
                s->cap->invalidated = true;
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    } else {
        emu_streams_complete_all_locked();
    }
    emu_unlock();
    emu_deferred_run();
    return r;
}
