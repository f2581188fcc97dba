/*
 * Virtual memory management over host memory.
 *
 *   reserve     mmap(PROT_NONE, MAP_NORESERVE) at the hint when that range is free, else anywhere
 *   create      memfd_create + ftruncate: sparse, so a large device costs nothing until touched
 *   map         mmap(MAP_FIXED|MAP_SHARED, memfd, offset), left PROT_NONE: no access until
 *               cuMemSetAccess, as on the device
 *   set access  mprotect(PROT_READ[|PROT_WRITE])
 *   unmap       mmap(MAP_FIXED, anonymous, PROT_NONE, MAP_NORESERVE) over the range: reserved again
 *   release     drops the caller's reference; the memfd closes when no handle and no mapping is left
 *
 * The rules and error codes follow the driver's documentation (shared/reference/testing-and-vmm.md
 * §3); where the driver leaves behaviour undefined (an unknown handle) cudaemu returns
 * CUDA_ERROR_INVALID_VALUE. All state is under emu.lock.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cudaemu/emu.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

/* ---- allocation properties ---- */

/* Validate a CUmemAllocationProp; *dev receives its device. */
static CUresult vmm_prop_check(const CUmemAllocationProp *prop, int *dev)
{
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (!emu_dev_valid(prop->location.id))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!emu.cfg.vmm)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE &&
        prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    *dev = prop->location.id;
    return CUDA_SUCCESS;
}

static bool vmm_aligned(uintptr_t x) { return (x & (emu.cfg.granularity - 1)) == 0; }

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                               CUmemAllocationGranularity_flags option)
{
    EMU_ENTER(cuMemGetAllocationGranularity);
    int dev;
    if (!granularity)
        return CUDA_ERROR_INVALID_VALUE;
    /* Measured on an H100 (driver 580.159.04): the device id is not checked here. */
    CUmemAllocationProp p;
    if (prop) {
        p = *prop;
        p.location.id = 0;
        prop = &p;
    }
    CUresult r = vmm_prop_check(prop, &dev);
    if (r != CUDA_SUCCESS)
        return r;
    if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = emu.cfg.granularity;
    return CUDA_SUCCESS;
}

/* ---- reservations (sorted array of pointers, by base) ---- */

/* Index of the last reservation with base <= addr, or -1. Lock held. */
static long vmm_resv_floor(uintptr_t addr)
{
    long lo = 0, hi = (long)emu.nresv - 1, best = -1;
    while (lo <= hi) {
        long mid = (lo + hi) / 2;
        if (emu.resv[mid]->base <= addr) {
            best = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return best;
}

/* The reservation holding all of [addr, addr + size), or NULL. Lock held. */
static struct emu_resv *vmm_resv_find(uintptr_t addr, size_t size)
{
    long i = vmm_resv_floor(addr);
    if (i < 0)
        return NULL;
    struct emu_resv *r = emu.resv[i];
    if (addr - r->base >= r->size || size > r->size - (addr - r->base))
        return NULL;
    return r;
}

/* Index of the last mapping of @p r with base <= addr, or -1. Lock held. */
static long vmm_map_floor(const struct emu_resv *r, uintptr_t addr)
{
    long lo = 0, hi = (long)r->nmaps - 1, best = -1;
    while (lo <= hi) {
        long mid = (lo + hi) / 2;
        if (r->maps[mid].base <= addr) {
            best = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return best;
}

/* The mapping containing @p addr, or NULL; *resv_out receives its reservation. Lock held. */
static struct emu_mapping *vmm_mapping_at(uintptr_t addr, struct emu_resv **resv_out)
{
    struct emu_resv *r = vmm_resv_find(addr, 1);
    if (!r)
        return NULL;
    long i = vmm_map_floor(r, addr);
    if (i < 0 || addr - r->maps[i].base >= r->maps[i].size)
        return NULL;
    if (resv_out)
        *resv_out = r;
    return &r->maps[i];
}

/* PROT_NONE, MAP_NORESERVE address space: at @p hint when that range is free, else anywhere
 * aligned to @p align. The kernel keeps these apart from cuMemAlloc blocks and each other. */
static void *vmm_mmap_reserve(void *hint, size_t size, size_t align)
{
    int fl = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    if (hint) {
        void *p = mmap(hint, size, PROT_NONE, fl | MAP_FIXED_NOREPLACE, -1, 0);
        if (p == hint)
            return p;
        if (p != MAP_FAILED)   /* a kernel without MAP_FIXED_NOREPLACE placed it elsewhere */
            munmap(p, size);
    }
    /* Over-reserve by the alignment and trim both ends. */
    if (size + align < size)
        return NULL;
    char *p = mmap(NULL, size + align, PROT_NONE, fl, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    uintptr_t start = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
    size_t head = start - (uintptr_t)p, tail = align - head;
    if (head)
        munmap(p, head);
    if (tail)
        munmap((char *)start + size, tail);
    return (void *)start;
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                     CUdeviceptr addr, unsigned long long flags)
{
    EMU_ENTER(cuMemAddressReserve);
    if (!ptr || flags != 0 || size == 0 || !vmm_aligned(size) || !vmm_aligned(addr) ||
        (alignment && !emu_is_pow2(alignment)))
        return CUDA_ERROR_INVALID_VALUE;
    size_t align = alignment > emu.cfg.granularity ? alignment : emu.cfg.granularity;
    if (addr & (align - 1))
        addr = 0;   /* a hint that breaks the alignment is not honoured */
    struct emu_resv *r = calloc(1, sizeof *r);
    if (!r)
        return CUDA_ERROR_OUT_OF_MEMORY;
    emu_lock();
    if (emu.nresv == emu.capresv) {
        size_t ncap = emu.capresv ? emu.capresv * 2 : 16;
        struct emu_resv **n = realloc(emu.resv, ncap * sizeof *n);
        if (!n) {
            emu_unlock();
            free(r);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        emu.resv = n;
        emu.capresv = ncap;
    }
    void *p = vmm_mmap_reserve((void *)(uintptr_t)addr, size, align);
    if (!p) {
        emu_unlock();
        free(r);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    r->base = (uintptr_t)p;
    r->size = size;
    long at = vmm_resv_floor(r->base) + 1;
    memmove(&emu.resv[at + 1], &emu.resv[at], (emu.nresv - (size_t)at) * sizeof *emu.resv);
    emu.resv[at] = r;
    emu.nresv++;
    emu_unlock();
    *ptr = (CUdeviceptr)r->base;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    EMU_ENTER(cuMemAddressFree);
    if (!ptr || !size)
        return CUDA_ERROR_INVALID_VALUE;
    emu_lock();
    long i = vmm_resv_floor((uintptr_t)ptr);
    struct emu_resv *r = i >= 0 ? emu.resv[i] : NULL;
    /* Only a whole reservation with nothing mapped. */
    if (!r || r->base != (uintptr_t)ptr || r->size != size || r->nmaps) {
        emu_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    munmap((void *)r->base, r->size);
    memmove(&emu.resv[i], &emu.resv[i + 1], (emu.nresv - (size_t)i - 1) * sizeof *emu.resv);
    emu.nresv--;
    emu_unlock();
    free(r->maps);
    free(r);
    return CUDA_SUCCESS;
}

/* ---- physical handles ---- */

static struct emu_handle *vmm_handle_get(CUmemGenericAllocationHandle h)
{
    struct emu_handle *hd = emu_map_get(&emu.handles, (uint64_t)h);
    return hd && hd->user_refs ? hd : NULL;
}

/* Destroy @p hd if nothing refers to it any more, and its memory with the last handle. */
static void vmm_handle_maybe_free(struct emu_handle *hd)
{
    if (hd->user_refs || hd->map_refs)
        return;
    emu_map_del(&emu.handles, hd->id);
    struct emu_phys *ph = hd->phys;
    free(hd);
    if (--ph->handles)
        return;
    close(ph->fd);
    if (ph->counted)
        emu.used[ph->dev] -= ph->size;
    emu.nphys--;
    free(ph);
}

/* A new handle object for @p ph with one user reference. Lock held. */
static CUresult vmm_handle_new(struct emu_phys *ph, CUmemGenericAllocationHandle *out)
{
    struct emu_handle *hd = calloc(1, sizeof *hd);
    if (!hd)
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* Ids start high and odd-free so that a small integer or a pointer is never a handle. */
    hd->id = 0x6d656d0000000000ULL + (++emu.next_handle) * 2;
    hd->phys = ph;
    hd->user_refs = 1;
    if (emu_map_put(&emu.handles, hd->id, hd)) {
        free(hd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ph->handles++;
    *out = hd->id;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                             const CUmemAllocationProp *prop, unsigned long long flags)
{
    EMU_ENTER(cuMemCreate);
    int dev;
    if (!handle || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = vmm_prop_check(prop, &dev);
    if (r != CUDA_SUCCESS)
        return r;
    if (size == 0 || !vmm_aligned(size))
        return CUDA_ERROR_INVALID_VALUE;
    struct emu_phys *ph = calloc(1, sizeof *ph);
    if (!ph)
        return CUDA_ERROR_OUT_OF_MEMORY;
    emu_lock();
    if (size > emu.cfg.total_mem - emu.used[dev]) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto fail;
    }
    ph->fd = memfd_create("cudaemu", MFD_CLOEXEC);
    if (ph->fd < 0) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto fail;
    }
    if (ftruncate(ph->fd, (off_t)size)) {
        close(ph->fd);
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto fail;
    }
    ph->dev = dev;
    ph->size = size;
    ph->counted = true;
    ph->exportable = prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    r = vmm_handle_new(ph, handle);
    if (r != CUDA_SUCCESS) {
        close(ph->fd);
        goto fail;
    }
    emu.used[dev] += size;
    emu.nphys++;
    emu_unlock();
    return CUDA_SUCCESS;
fail:
    emu_unlock();
    free(ph);
    return r;
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
    EMU_ENTER(cuMemRelease);
    emu_lock();
    struct emu_handle *hd = vmm_handle_get(handle);
    if (!hd) {
        emu_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    hd->user_refs--;
    vmm_handle_maybe_free(hd);
    emu_unlock();
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    EMU_ENTER(cuMemRetainAllocationHandle);
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    emu_lock();
    struct emu_mapping *m = vmm_mapping_at((uintptr_t)addr, NULL);
    if (!m) {
        emu_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    m->handle->user_refs++;
    *handle = m->handle->id;
    emu_unlock();
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType handleType,
                                              unsigned long long flags)
{
    EMU_ENTER(cuMemExportToShareableHandle);
    if (!shareableHandle || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    emu_lock();
    struct emu_handle *hd = vmm_handle_get(handle);
    /* Export needs the handle type requested at create time. */
    if (!hd || !hd->phys->exportable) {
        emu_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    int fd = fcntl(hd->phys->fd, F_DUPFD_CLOEXEC, 0);
    emu_unlock();
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *(int *)shareableHandle = fd;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                                CUmemAllocationHandleType shHandleType)
{
    EMU_ENTER(cuMemImportFromShareableHandle);
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    int fd = (int)(intptr_t)osHandle;
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
        !vmm_aligned((uintptr_t)st.st_size))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r;
    emu_lock();
    /* An fd exported by this process names memory we already track: share it, so the device's
     * accounting counts it once. */
    size_t pos = 0;
    struct emu_handle *hd;
    struct emu_phys *ph = NULL;
    while ((hd = emu_map_next(&emu.handles, &pos, NULL))) {
        struct stat hs;
        if (!fstat(hd->phys->fd, &hs) && hs.st_dev == st.st_dev && hs.st_ino == st.st_ino) {
            ph = hd->phys;
            break;
        }
    }
    if (ph) {
        r = vmm_handle_new(ph, handle);
        emu_unlock();
        return r;
    }
    /* Memory of another process: held here through our own descriptor, not counted on our
     * device (its owner counts it). */
    ph = calloc(1, sizeof *ph);
    int nfd = ph ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
    if (nfd < 0) {
        emu_unlock();
        free(ph);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ph->fd = nfd;
    ph->size = (size_t)st.st_size;
    ph->exportable = true;
    r = vmm_handle_new(ph, handle);
    if (r != CUDA_SUCCESS) {
        close(nfd);
        free(ph);
    } else {
        emu.nphys++;
    }
    emu_unlock();
    return r;
}

/* ---- map / unmap / access ---- */

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                          unsigned long long flags)
{
    EMU_ENTER(cuMemMap);
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    emu_lock();
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    struct emu_handle *hd = vmm_handle_get(handle);
    if (!hd)
        goto out;
    /* Measured on an H100 (driver 580.159.04): a handle maps whole or not at all; any other
     * offset or size gives CUDA_ERROR_NOT_SUPPORTED (the documentation says the offset "must
     * currently be zero"). */
    if (offset != 0 || size != hd->phys->size) {
        r = CUDA_ERROR_NOT_SUPPORTED;
        goto out;
    }
    r = CUDA_ERROR_INVALID_VALUE;
    if (!ptr || !vmm_aligned(ptr))
        goto out;
    struct emu_resv *rv = vmm_resv_find((uintptr_t)ptr, size);
    if (!rv)
        goto out;
    /* Only over VA that is not mapped: the mapping before must end at or before ptr, the one
     * after must start at or after ptr + size. */
    long i = vmm_map_floor(rv, (uintptr_t)ptr);
    if (i >= 0 && rv->maps[i].base + rv->maps[i].size > (uintptr_t)ptr)
        goto out;
    if ((size_t)(i + 1) < rv->nmaps && rv->maps[i + 1].base < (uintptr_t)ptr + size)
        goto out;
    if (rv->nmaps == rv->capmaps) {
        size_t ncap = rv->capmaps ? rv->capmaps * 2 : 8;
        struct emu_mapping *n = realloc(rv->maps, ncap * sizeof *n);
        if (!n) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
            goto out;
        }
        rv->maps = n;
        rv->capmaps = ncap;
    }
    if (mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, hd->phys->fd,
             (off_t)offset) == MAP_FAILED) {
        /* Out of kernel map entries, most likely; the range is still our PROT_NONE reserve. */
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    size_t at = (size_t)(i + 1);
    memmove(&rv->maps[at + 1], &rv->maps[at], (rv->nmaps - at) * sizeof *rv->maps);
    rv->maps[at] = (struct emu_mapping){.base = (uintptr_t)ptr, .size = size, .offset = offset,
                                        .handle = hd};
    rv->nmaps++;
    hd->map_refs++;
    emu.mapped_bytes += size;
    r = CUDA_SUCCESS;
out:
    emu_unlock();
    return r;
}

/* Unmap accepts exactly one whole mapping or several adjacent whole mappings: "the entire
 * contiguous address range that was mapped" (CUDA driver API, cuMemUnmap). A range that cuts a
 * mapping or covers unmapped VA is rejected, and nothing changes. */
CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    EMU_ENTER(cuMemUnmap);
    if (!ptr || size == 0 || !vmm_aligned(ptr) || !vmm_aligned(size))
        return CUDA_ERROR_INVALID_VALUE;
    emu_lock();
    /* Legal during capture: measured on an H100 (driver 580.159.04). */
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    struct emu_resv *rv = vmm_resv_find((uintptr_t)ptr, size);
    if (!rv)
        goto out;
    long first = vmm_map_floor(rv, (uintptr_t)ptr);
    if (first < 0 || rv->maps[first].base != (uintptr_t)ptr)
        goto out;
    size_t covered = 0, last = (size_t)first;
    for (;;) {
        if (last >= rv->nmaps || rv->maps[last].base != (uintptr_t)ptr + covered)
            goto out;
        covered += rv->maps[last].size;
        if (covered == size)
            break;
        if (covered > size)
            goto out;
        last++;
    }
    if (mmap((void *)(uintptr_t)ptr, size, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED) {
        r = CUDA_ERROR_UNKNOWN;
        goto out;
    }
    size_t n = last - (size_t)first + 1;
    /* A handle mapped several times in the range drops to zero references at its last
     * occurrence only, so no later iteration can touch a freed handle. */
    for (size_t k = 0; k < n; k++) {
        struct emu_handle *hd = rv->maps[(size_t)first + k].handle;
        if (--hd->map_refs == 0)
            vmm_handle_maybe_free(hd);
    }
    memmove(&rv->maps[first], &rv->maps[last + 1], (rv->nmaps - last - 1) * sizeof *rv->maps);
    rv->nmaps -= n;
    emu.mapped_bytes -= size;
    r = CUDA_SUCCESS;
out:
    emu_unlock();
    return r;
}

static int vmm_prot(const struct emu_mapping *m)
{
    unsigned best = 0;
    for (int d = 0; d < emu.cfg.devices; d++)
        best |= m->access[d];
    if (best & CU_MEM_ACCESS_FLAGS_PROT_READWRITE & ~CU_MEM_ACCESS_FLAGS_PROT_READ)
        return PROT_READ | PROT_WRITE;
    return best ? PROT_READ : PROT_NONE;
}

/* The host has one view of the memory: it gets the widest access any device was given. */
CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    EMU_ENTER(cuMemSetAccess);
    if (!ptr || size == 0 || !vmm_aligned(ptr) || !vmm_aligned(size) || !desc || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t k = 0; k < count; k++) {
        if (desc[k].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
            return CUDA_ERROR_INVALID_VALUE;
        /* INVALID_VALUE, not INVALID_DEVICE: measured on an H100 (driver 580.159.04). */
        if (!emu_dev_valid(desc[k].location.id))
            return CUDA_ERROR_INVALID_VALUE;
        if (desc[k].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
            desc[k].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
            desc[k].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUDA_ERROR_INVALID_VALUE;
    }
    emu_lock();
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    struct emu_resv *rv = vmm_resv_find((uintptr_t)ptr, size);
    if (!rv)
        goto out;
    /* The whole range must be mapped: contiguous mappings from the one holding ptr. */
    long first = vmm_map_floor(rv, (uintptr_t)ptr);
    if (first < 0)
        goto out;
    uintptr_t end = (uintptr_t)ptr + size, at = (uintptr_t)ptr;
    size_t i = (size_t)first;
    for (; at < end; i++) {
        if (i >= rv->nmaps || rv->maps[i].base > at || rv->maps[i].base + rv->maps[i].size <= at)
            goto out;
        at = rv->maps[i].base + rv->maps[i].size;
    }
    for (size_t j = (size_t)first; j < i; j++) {
        struct emu_mapping *m = &rv->maps[j];
        for (size_t k = 0; k < count; k++)
            m->access[desc[k].location.id] = (unsigned char)desc[k].flags;
        uintptr_t lo = m->base > (uintptr_t)ptr ? m->base : (uintptr_t)ptr;
        uintptr_t hi = m->base + m->size < end ? m->base + m->size : end;
        if (mprotect((void *)lo, hi - lo, vmm_prot(m))) {
            r = CUDA_ERROR_UNKNOWN;
            goto out;
        }
    }
    r = CUDA_SUCCESS;
out:
    emu_unlock();
    return r;
}

CUresult CUDAAPI cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr)
{
    EMU_ENTER(cuMemGetAccess);
    if (!flags || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (!emu_dev_valid(location->id))
        return CUDA_ERROR_INVALID_DEVICE;
    emu_lock();
    struct emu_mapping *m = vmm_mapping_at((uintptr_t)ptr, NULL);
    if (m)
        *flags = m->access[location->id];
    emu_unlock();
    return m ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
