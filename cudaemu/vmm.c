/*
 * Virtual memory management over host memory.
 *
 *   reserve     a range of the address arena: one PROT_NONE, MAP_NORESERVE mapping made once,
 *               from which reservations are handed out rising (next fit from the end of the last
 *               one), at the hint when it is free and allowed (the H100's rules, below)
 *   create      a range of the device's sparse memory file (one memfd per device, so no file
 *               descriptor per handle); a handle gets a sparse memfd of its own when first
 *               exported (vmm_phys_promote), so an exported descriptor names that memory only
 *   map         bookkeeping: the VA stays the arena's PROT_NONE, as device memory is never
 *               host-accessible (devmem.c moves its bytes through the file); host-located memory
 *               is mmap(MAP_FIXED|MAP_SHARED, fd, offset), left PROT_NONE until the CPU is granted
 *               access (a HOST_NUMA access descriptor)
 *   set access  per device, for the copies and kernels to check; mprotect of host-located memory
 *               as the CPU's access asks
 *   unmap       host-located memory: mmap(MAP_FIXED, anonymous, PROT_NONE, MAP_NORESERVE) over the
 *               range, reserved again
 *   release     drops the caller's reference; the memory goes (its file range punched out, or its
 *               own memfd closed) when no handle and no mapping is left
 *
 * The rules and error codes follow the driver's documentation of the VMM calls, checked against an
 * H100 (cudaemu/README.md); where the driver leaves behaviour undefined (an unknown handle) cudaemu returns
 * CUDA_ERROR_INVALID_VALUE. All state is under emu.lock.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cudaemu/emu.h"

/* ---- allocation properties ---- */

/* Validate a CUmemAllocationProp; *dev receives its device, or -1 for host memory. Host
 * locations, as documented (cuMemCreate): HOST_NUMA names a node of the emulated host (0 up to
 * the largest CUDAEMU_HOST_NUMA_ID; node 0 alone by default, as on a machine without NUMA, where
 * the driver documents id 0; any other: INVALID_VALUE); HOST ignores the id and is not IPC capable
 * (requestedHandleTypes other than 0: INVALID_VALUE); HOST_NUMA_CURRENT is INVALID_VALUE. */
static CUresult vmm_prop_check(const CUmemAllocationProp *prop, int *dev)
{
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    bool numa = prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA;
    bool any = prop->location.type == CU_MEM_LOCATION_TYPE_HOST;
    bool host = numa || any;
    if (!host && prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (numa && (prop->location.id < 0 || prop->location.id >= emu.cfg.numa_nodes))
        return CUDA_ERROR_INVALID_VALUE;
    if (any && prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE)
        return CUDA_ERROR_INVALID_VALUE;
    if (!host && !emu_dev_valid(prop->location.id))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!emu.cfg.vmm)
        return CUDA_ERROR_NOT_SUPPORTED;
    /* A location the device says it lacks (its attribute reads 0; CUDAEMU_HOST_VMM). */
    if (host && !(emu.cfg.host_vmm & (numa ? EMU_HOST_VMM_NUMA : EMU_HOST_VMM_HOST)))
        return CUDA_ERROR_NOT_SUPPORTED;
    /* A bit mask: POSIX file descriptors always, fabric handles only when emulated
     * (CUDAEMU_FABRIC=1); any other type (Win32, KMT) is not supported. */
    unsigned types = (unsigned)prop->requestedHandleTypes;
    unsigned ok = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | (emu.cfg.fabric ? CU_MEM_HANDLE_TYPE_FABRIC : 0);
    if (types & ~ok)
        return CUDA_ERROR_NOT_SUPPORTED;
    *dev = host ? -1 : prop->location.id;
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
    if (prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
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

/* ---- the address arena ---- */

/* Measured on an H100 (driver 13.0): a reservation of 32 MiB or more is placed at its address
 * hint only when the hint is 32 MiB-aligned, and such reservations come back 32 MiB-aligned. */
#define EMU_VA_BIG ((size_t)32 << 20)

/* Arena size: most of the 128 TiB user address space is free, but sanitizers claim fixed parts
 * of it (ThreadSanitizer leaves a few TiB of application memory), and valgrind gives a process
 * under 64 GiB in all, so ask for less there: the largest size the host grants, within
 * EMU_ARENA_MIN of it (halving alone left 32 GiB under valgrind, less than a 51 GiB trace
 * reserves, and every growth past it took the out-of-address-space path). */
#if defined(__SANITIZE_THREAD__)
#define EMU_ARENA_MAX ((size_t)1 << 40)
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define EMU_ARENA_MAX ((size_t)1 << 40)
#endif
#endif
#ifndef EMU_ARENA_MAX
#define EMU_ARENA_MAX ((size_t)32 << 40)
#endif
#define EMU_ARENA_MIN ((size_t)1 << 30)

/* Reserve @p sz bytes of host address space, EMU_VA_BIG-aligned: its start, or 0. */
static uintptr_t vmm_arena_try(size_t sz)
{
    /* One extra EMU_VA_BIG so that the arena can start 32 MiB-aligned. */
    void *p = mmap(NULL, sz + EMU_VA_BIG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return 0;
    uintptr_t start = ((uintptr_t)p + EMU_VA_BIG - 1) & ~(uintptr_t)(EMU_VA_BIG - 1);
    if (start != (uintptr_t)p)
        munmap(p, start - (uintptr_t)p);
    uintptr_t end = (uintptr_t)p + sz + EMU_VA_BIG;
    if (end != start + sz)
        munmap((void *)(start + sz), end - (start + sz));
    return start;
}

/* Would the host grant an arena of @p sz bytes now? (Tried and given back.) */
static bool vmm_arena_grants(size_t sz)
{
    uintptr_t start = vmm_arena_try(sz);
    if (start)
        munmap((void *)start, sz);
    return start != 0;
}

static bool vmm_arena_ready_locked(void)
{
    if (emu.arena_size)
        return true;
    /* Halve until the host grants a size, then search between it and the refused one; never
     * above EMU_ARENA_MAX (granted at once: no search). */
    size_t ok = 0, refused = EMU_ARENA_MAX;
    for (size_t sz = EMU_ARENA_MAX; sz >= EMU_ARENA_MIN && !ok; sz /= 2) {
        if (vmm_arena_grants(sz))
            ok = sz;
        else
            refused = sz;
    }
    if (!ok)
        return false;
    while (refused - ok > EMU_ARENA_MIN) {
        size_t mid = ok + (refused - ok) / 2 / EMU_ARENA_MIN * EMU_ARENA_MIN;
        if (vmm_arena_grants(mid))
            ok = mid;
        else
            refused = mid;
    }
    /* Taken for good; should another thread have mapped part of it since, halve again. */
    for (size_t sz = ok; sz >= EMU_ARENA_MIN; sz /= 2) {
        uintptr_t start = vmm_arena_try(sz);
        if (start) {
            emu.arena_base = emu.arena_next = start;
            emu.arena_size = sz;
            return true;
        }
    }
    return false;
}

static inline uintptr_t vmm_align_up(uintptr_t x, size_t align)
{
    return (x + align - 1) & ~(uintptr_t)(align - 1);
}

/* Is [addr, addr + size) inside the arena and free of reservations? Lock held. */
static bool vmm_arena_free(uintptr_t addr, size_t size)
{
    uintptr_t lo = emu.arena_base, hi = emu.arena_base + emu.arena_size;
    if (addr < lo || addr >= hi || size > hi - addr)
        return false;
    long i = vmm_resv_floor(addr + size - 1);
    return i < 0 || emu.resv[i]->base + emu.resv[i]->size <= addr;
}

/* The lowest @p align-aligned start at or above @p from where @p size bytes fit in the arena
 * between reservations, or 0. Lock held. */
static uintptr_t vmm_arena_fit(uintptr_t from, size_t size, size_t align)
{
    uintptr_t hi = emu.arena_base + emu.arena_size;
    uintptr_t a = vmm_align_up(from, align);
    long i = vmm_resv_floor(a);
    if (i >= 0 && emu.resv[i]->base + emu.resv[i]->size > a)
        a = vmm_align_up(emu.resv[i]->base + emu.resv[i]->size, align);
    for (size_t j = (size_t)(i + 1); j < emu.nresv; j++) {
        if (a >= hi || size > hi - a)
            return 0;
        if (emu.resv[j]->base >= a + size)
            break;
        if (emu.resv[j]->base + emu.resv[j]->size > a)
            a = vmm_align_up(emu.resv[j]->base + emu.resv[j]->size, align);
    }
    if (a >= hi || size > hi - a)
        return 0;
    return a;
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                     CUdeviceptr addr, unsigned long long flags)
{
    EMU_ENTER(cuMemAddressReserve);
    if (!ptr || flags != 0 || size == 0 || !vmm_aligned(size) || !vmm_aligned(addr) ||
        (alignment && !emu_is_pow2(alignment)))
        return CUDA_ERROR_INVALID_VALUE;
    size_t align = alignment > emu.cfg.granularity ? alignment : emu.cfg.granularity;
    if (size >= EMU_VA_BIG && align < EMU_VA_BIG)
        align = EMU_VA_BIG;
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
    uintptr_t p = 0;
    if (vmm_arena_ready_locked()) {
        if (addr && vmm_arena_free((uintptr_t)addr, size))
            p = (uintptr_t)addr;
        if (!p)
            p = vmm_arena_fit(emu.arena_next, size, align);
        if (!p)
            p = vmm_arena_fit(emu.arena_base, size, align);
    }
    if (!p) {
        emu_unlock();
        free(r);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    emu.arena_next = p + size;
    r->base = p;
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
    /* Only a whole reservation with nothing mapped. Its range is PROT_NONE arena again already
     * (unmap put anonymous PROT_NONE memory back), so only the bookkeeping goes. */
    if (!r || r->base != (uintptr_t)ptr || r->size != size || r->nmaps) {
        emu_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
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
    ph->handles--;
    emu_phys_maybe_free_locked(ph);
}

void emu_phys_maybe_free_locked(struct emu_phys *ph)
{
    if (ph->handles || ph->pins)
        return;
    emu_phys_views_drop_locked(ph, true); /* a cuMemAlloc block's memory is its view alone */
    if (ph->own_fd)
        close(ph->fd);
    else if (ph->fd >= 0) /* give the pages back; the range itself is never handed out again */
        (void)fallocate(ph->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, ph->off, (off_t)ph->size);
    if (ph->counted)
        emu_mem_add_locked(ph->dev, ph->size, false);
    if (!ph->classic)
        emu.nphys--;
    free(ph);
}

int emu_dev_file_take_locked(int dev, size_t size, off_t *off)
{
    if (!emu.dev_fd_open[dev]) {
        int fd = memfd_create("cudaemu-device", MFD_CLOEXEC);
        if (fd < 0)
            return -1;
        emu.dev_fd[dev] = fd;
        emu.dev_fd_open[dev] = true;
    }
    off_t at = emu.dev_off[dev];
    if (ftruncate(emu.dev_fd[dev], at + (off_t)size))
        return -1;
    emu.dev_off[dev] = at + (off_t)size;
    *off = at;
    return emu.dev_fd[dev];
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

/* What new physical memory holds (CUDAEMU_FRESH). The driver promises nothing: recycled memory
 * may hold another allocation's bytes (vllm#45542), so code that needs zeros must write them. By
 * default (sparse) the first host page of the allocation holds a non-zero pattern, enough to catch
 * a missing memset at any page without costing host memory or time for the rest (the file stays
 * sparse; one write per cuMemCreate); garbage fills every byte (tests of code that must clear
 * memory); zero writes nothing. */
enum { VMM_FILL_CHUNK = 64 << 10 };
static unsigned char vmm_pattern[VMM_FILL_CHUNK];
static pthread_once_t vmm_pattern_once = PTHREAD_ONCE_INIT;

static void vmm_pattern_init(void)
{
    for (size_t i = 0; i < VMM_FILL_CHUNK; i++)
        vmm_pattern[i] = (unsigned char)(0x80 | ((i * 37 + 11) & 0x7f)); /* never 0 */
}

static void vmm_fresh_fill(int fd, off_t off, size_t size)
{
    if (emu.cfg.fresh == EMU_FRESH_ZERO)
        return;
    pthread_once(&vmm_pattern_once, vmm_pattern_init);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t step = emu.cfg.fresh == EMU_FRESH_SPARSE ? size : VMM_FILL_CHUNK;
    size_t len = emu.cfg.fresh == EMU_FRESH_SPARSE ? (page < VMM_FILL_CHUNK ? page : VMM_FILL_CHUNK) : VMM_FILL_CHUNK;
    /* A failed write only leaves zeros, which the driver may return as well. */
    for (size_t at = 0; at < size; at += step)
        (void)!pwrite(fd, vmm_pattern, size - at < len ? size - at : len, off + (off_t)at);
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
    unsigned types = (unsigned)prop->requestedHandleTypes;
    if (size == 0 || !vmm_aligned(size))
        return CUDA_ERROR_INVALID_VALUE;
    struct emu_phys *ph = calloc(1, sizeof *ph);
    if (!ph)
        return CUDA_ERROR_OUT_OF_MEMORY;
    bool host = dev < 0;
    emu_lock();
    if (!host && !emu_mem_take_locked(dev, size)) {
        emu_unlock();
        free(ph);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* Every handle starts as a range of the device file, exportable or not: xseg asks for
     * shareable pages by default (expandable_segments_ipc), and a descriptor per page would hit
     * the descriptor limit on large traces. A handle gets a memfd of its own when it is first
     * exported (vmm_phys_promote). */
    ph->handle_types = types;
    if (host) {
        /* Host memory: a memfd of its own, counted on no device. */
        int fd = memfd_create("cudaemu-host", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, (off_t)size)) {
            if (fd >= 0)
                close(fd);
            r = CUDA_ERROR_OUT_OF_MEMORY;
            goto fail;
        }
        ph->fd = fd;
        ph->own_fd = true;
    } else {
        off_t off;
        int fd = emu_dev_file_take_locked(dev, size, &off);
        if (fd < 0) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
            goto fail;
        }
        ph->fd = fd;
        ph->off = off;
    }
    ph->dev = dev;
    ph->size = size;
    ph->counted = !host;
    ph->prop = *prop;
    r = vmm_handle_new(ph, handle);
    if (r != CUDA_SUCCESS) {
        if (ph->own_fd)
            close(ph->fd);
        goto fail;
    }
    emu.nphys++;
    int fd = ph->fd;
    off_t off = ph->off;
    emu_unlock();
    /* The range is this handle's alone from here on: no lock needed to fill it. */
    vmm_fresh_fill(fd, off, size);
    return CUDA_SUCCESS;
fail:
    if (!host)
        emu_mem_add_locked(dev, size, false); /* taken above */
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

/* The properties the handle's memory was created with (documented: those given to cuMemCreate). */
CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle)
{
    EMU_ENTER(cuMemGetAllocationPropertiesFromHandle);
    if (!prop)
        return CUDA_ERROR_INVALID_VALUE;
    emu_lock();
    struct emu_handle *hd = vmm_handle_get(handle);
    if (hd)
        *prop = hd->phys->prop;
    emu_unlock();
    return hd ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Give @p ph a memfd of its own, so that an exported descriptor (or fabric handle) names this
 * memory only: its bytes are copied over from the device file (all-zero chunks skipped, so the
 * copy stays sparse) and its range of the device file is punched out. Its mappings need no change
 * (device memory is not mmapped at its VA: devmem.c reads ph->fd and ph->off at each copy; host
 * memory always has a memfd of its own). Lock held. A store by another thread into the memory
 * during the copy may be lost; the driver has no such window (cudaemu's infidelity, README). */
static CUresult vmm_phys_promote(struct emu_phys *ph)
{
    if (ph->own_fd)
        return CUDA_SUCCESS;
    int fd = memfd_create("cudaemu", MFD_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (ftruncate(fd, (off_t)ph->size)) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    enum { CHUNK = 1 << 20 };
    char *buf = malloc(CHUNK);
    if (!buf) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (size_t at = 0; at < ph->size; at += CHUNK) {
        size_t n = ph->size - at < CHUNK ? ph->size - at : CHUNK;
        ssize_t got = pread(ph->fd, buf, n, ph->off + (off_t)at);
        if (got != (ssize_t)n) {
            free(buf);
            close(fd);
            return CUDA_ERROR_UNKNOWN;
        }
        size_t k = 0;
        while (k < n && !buf[k])
            k++;
        if (k < n && pwrite(fd, buf, n, (off_t)at) != (ssize_t)n) {
            free(buf);
            close(fd);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    free(buf);
    (void)fallocate(ph->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, ph->off, (off_t)ph->size);
    ph->fd = fd;
    ph->off = 0;
    ph->own_fd = true;
    emu_phys_moved_locked(ph);
    return CUDA_SUCCESS;
}

/*
 * Emulated fabric handle (CUDAEMU_FABRIC=1). A real CUmemFabricHandle is 64 opaque bytes that
 * any process in the same NVLink/IMEX domain can import, with no descriptor passing. Here it
 * names the exporter's memfd through /proc: the exporting process id, the descriptor number of
 * the physical memory's memfd (open while the memory lives, as a fabric handle is valid while its
 * allocation is), and the file's device and inode, which the importer checks so that a stale
 * handle whose descriptor number was reused is refused rather than mapping other memory.
 */
#define EMU_FABRIC_MAGIC 0x4642434d55454443ULL /* "CDEUMCBF" */
struct emu_fabric {
    uint64_t magic;
    int32_t pid;
    int32_t fd;
    uint64_t st_dev;
    uint64_t st_ino;
    uint64_t size;
    unsigned char pad[64 - 40];
};
_Static_assert(sizeof(struct emu_fabric) == sizeof(CUmemFabricHandle), "fabric handle layout");

CUresult CUDAAPI cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType handleType,
                                              unsigned long long flags)
{
    EMU_ENTER(cuMemExportToShareableHandle);
    if (!shareableHandle || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* A Windows handle type on Linux: INVALID_VALUE, as measured on the H200 (driver 580.159.04);
     * WIN32_KMT unmeasured, answered alike. */
    if (handleType == CU_MEM_HANDLE_TYPE_WIN32 || handleType == CU_MEM_HANDLE_TYPE_WIN32_KMT)
        return CUDA_ERROR_INVALID_VALUE;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR &&
        !(handleType == CU_MEM_HANDLE_TYPE_FABRIC && emu.cfg.fabric))
        return CUDA_ERROR_NOT_SUPPORTED;
    emu_lock();
    struct emu_handle *hd = vmm_handle_get(handle);
    /* Export needs the handle type requested at create time. */
    if (!hd || !(hd->phys->handle_types & (unsigned)handleType)) {
        emu_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUresult pr = vmm_phys_promote(hd->phys);
    if (pr != CUDA_SUCCESS) {
        emu_unlock();
        return pr;
    }
    if (handleType == CU_MEM_HANDLE_TYPE_FABRIC) {
        struct stat st;
        if (fstat(hd->phys->fd, &st)) {
            emu_unlock();
            return CUDA_ERROR_UNKNOWN;
        }
        struct emu_fabric f;
        memset(&f, 0, sizeof f);
        f.magic = EMU_FABRIC_MAGIC;
        f.pid = (int32_t)getpid();
        f.fd = hd->phys->fd;
        f.st_dev = (uint64_t)st.st_dev;
        f.st_ino = (uint64_t)st.st_ino;
        f.size = hd->phys->size;
        emu_unlock();
        memcpy(shareableHandle, &f, sizeof f);
        return CUDA_SUCCESS;
    }
    int fd = fcntl(hd->phys->fd, F_DUPFD_CLOEXEC, 0);
    emu_unlock();
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *(int *)shareableHandle = fd;
    return CUDA_SUCCESS;
}

/* Open the memfd an emulated fabric handle names (another process's, through /proc). @return a
 * new descriptor, or -1 when the handle is malformed, its process is gone, or the descriptor
 * there is no longer that memory. */
static int vmm_fabric_open(const void *handle)
{
    struct emu_fabric f;
    memcpy(&f, handle, sizeof f);
    if (f.magic != EMU_FABRIC_MAGIC || f.pid <= 0 || f.fd < 0)
        return -1;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)f.pid, (int)f.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) || (uint64_t)st.st_dev != f.st_dev || (uint64_t)st.st_ino != f.st_ino ||
        (uint64_t)st.st_size != f.size) {
        close(fd);
        return -1;
    }
    return fd;
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                                CUmemAllocationHandleType shHandleType)
{
    EMU_ENTER(cuMemImportFromShareableHandle);
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    int fd, owned = -1; /* owned: a descriptor this call opened (fabric), closed before return */
    if (shHandleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        fd = (int)(intptr_t)osHandle;
    } else if (shHandleType == CU_MEM_HANDLE_TYPE_FABRIC && emu.cfg.fabric) {
        if (!osHandle)
            return CUDA_ERROR_INVALID_VALUE;
        fd = owned = vmm_fabric_open(osHandle);
        if (fd < 0)
            return CUDA_ERROR_INVALID_VALUE;
    } else {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    /* A negative descriptor: CUDA_ERROR_UNKNOWN on the H200's driver (580.159.04, 2026-11-26),
     * not the INVALID_VALUE of the other bad descriptors (unmeasured: cudaemu's). */
    if (fd < 0)
        return CUDA_ERROR_UNKNOWN;
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
        !vmm_aligned((uintptr_t)st.st_size)) {
        if (owned >= 0)
            close(owned);
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUresult r;
    emu_lock();
    /* An fd exported by this process names memory we already track: share it, so the device's
     * accounting counts it once. */
    size_t pos = 0;
    struct emu_handle *hd;
    struct emu_phys *ph = NULL;
    while ((hd = emu_map_next(&emu.handles, &pos, NULL))) {
        struct stat hs;
        if (hd->phys->own_fd && !fstat(hd->phys->fd, &hs) && hs.st_dev == st.st_dev && hs.st_ino == st.st_ino) {
            ph = hd->phys;
            break;
        }
    }
    if (ph) {
        r = vmm_handle_new(ph, handle);
        emu_unlock();
        if (owned >= 0)
            close(owned);
        return r;
    }
    /* Memory of another process: held here through our own descriptor, not counted on our
     * device (its owner counts it). */
    ph = calloc(1, sizeof *ph);
    int nfd = -1;
    if (ph && owned >= 0) {
        nfd = owned; /* the descriptor opened through /proc becomes ours */
        owned = -1;
    } else if (ph) {
        nfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    }
    if (nfd < 0) {
        emu_unlock();
        free(ph);
        if (owned >= 0)
            close(owned);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ph->fd = nfd;
    ph->own_fd = true;
    ph->size = (size_t)st.st_size;
    /* Re-exportable as the type it came in (a fabric import exports a fabric handle again). */
    ph->handle_types = (unsigned)shHandleType;
    const struct CUctx_st *cur = emu_ctx_current();
    ph->prop = (CUmemAllocationProp){.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                     .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = cur ? cur->ordinal : 0},
                                     .requestedHandleTypes = shHandleType};
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
    /* Device memory stays the arena's PROT_NONE (never host-accessible, as on a GPU); host-located
     * memory is mapped, without access until the CPU is granted it. */
    if (hd->phys->dev < 0 && mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, hd->phys->fd,
                                  hd->phys->off + (off_t)offset) == MAP_FAILED) {
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
    /* Emulator rule (undefined on the driver, where the copy would write into unmapped memory or
     * fault): a range that pending async work of a held stream still touches cannot be unmapped. */
    if (emu_streams_pending_touch_locked((uintptr_t)ptr, size)) {
        r = CUDA_ERROR_ILLEGAL_STATE;
        goto out;
    }
    size_t n = last - (size_t)first + 1;
    /* Host-located mappings go back to the arena's anonymous PROT_NONE (device ones never left it). */
    for (size_t k = 0; k < n; k++) {
        const struct emu_mapping *m = &rv->maps[(size_t)first + k];
        if (m->handle->phys->dev < 0 && mmap((void *)m->base, m->size, PROT_NONE,
                                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED) {
            r = CUDA_ERROR_UNKNOWN;
            goto out;
        }
    }
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

/* The CPU's protection of host-located memory: what a HOST_NUMA descriptor granted it (device
 * access gives the CPU none: unmeasured, cudaemu's choice, the stricter one). */
static int vmm_prot(const struct emu_mapping *m)
{
    if (m->host_access == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        return PROT_READ | PROT_WRITE;
    return m->host_access ? PROT_READ : PROT_NONE;
}

/* Device access is bookkeeping (copies, kernels and graph launches check it); only host-located
 * memory has a host mapping to protect. */
CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    EMU_ENTER(cuMemSetAccess);
    if (!ptr || size == 0 || !vmm_aligned(ptr) || !vmm_aligned(size) || !desc || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    bool host_desc = false;
    for (size_t k = 0; k < count; k++) {
        /* HOST_NUMA: the CPU's access, id ignored (documented); only for host-located memory. */
        host_desc |= desc[k].location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA;
        if (desc[k].location.type != CU_MEM_LOCATION_TYPE_DEVICE &&
            desc[k].location.type != CU_MEM_LOCATION_TYPE_HOST_NUMA)
            return CUDA_ERROR_INVALID_VALUE;
        /* INVALID_VALUE, not INVALID_DEVICE: measured on an H100 (driver 580.159.04). */
        if (desc[k].location.type == CU_MEM_LOCATION_TYPE_DEVICE && !emu_dev_valid(desc[k].location.id))
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
        if (host_desc && rv->maps[i].handle->phys->dev >= 0)
            goto out;
        at = rv->maps[i].base + rv->maps[i].size;
    }
    for (size_t j = (size_t)first; j < i; j++) {
        struct emu_mapping *m = &rv->maps[j];
        for (size_t k = 0; k < count; k++) {
            if (desc[k].location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA)
                m->host_access = (unsigned char)desc[k].flags;
            else
                m->access[desc[k].location.id] = (unsigned char)desc[k].flags;
        }
        uintptr_t lo = m->base > (uintptr_t)ptr ? m->base : (uintptr_t)ptr;
        uintptr_t hi = m->base + m->size < end ? m->base + m->size : end;
        if (m->handle->phys->dev < 0 && mprotect((void *)lo, hi - lo, vmm_prot(m))) {
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
    bool host = location && location->type == CU_MEM_LOCATION_TYPE_HOST_NUMA;
    if (!flags || !location || (!host && location->type != CU_MEM_LOCATION_TYPE_DEVICE))
        return CUDA_ERROR_INVALID_VALUE;
    if (!host && !emu_dev_valid(location->id))
        return CUDA_ERROR_INVALID_DEVICE;
    emu_lock();
    struct emu_mapping *m = vmm_mapping_at((uintptr_t)ptr, NULL);
    if (m)
        *flags = host ? m->host_access : m->access[location->id];
    emu_unlock();
    return m ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* A dma-buf descriptor for a range. Malformed requests are INVALID_VALUE (the documented rules:
 * one handle type, flags 0 or MAPPING_TYPE_PCIE, a host-page-aligned range). By default the
 * emulated device has no dma-buf exporter (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED reads 0) and a
 * well-formed request is NOT_SUPPORTED, as on a device without it. With CUDAEMU_DMA_BUF=1 every
 * byte of the range must be mapped to device memory of one device, across as many mappings
 * (physical handles) as it spans; a hole, host-located memory or two devices is INVALID_VALUE.
 * The descriptor is a memfd of the range's size (fstat reads it): it names no pages (a dma-buf
 * is a kernel object cudaemu cannot make), so only its size and lifetime are emulated. */
CUresult CUDAAPI cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size,
                                               CUmemRangeHandleType handleType, unsigned long long flags)
{
    EMU_ENTER(cuMemGetHandleForAddressRange);
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    if (!handle || handleType != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD ||
        (flags & ~(unsigned long long)CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE) || !dptr || !size ||
        ((uintptr_t)dptr | size) & (page - 1) || (uintptr_t)dptr + size < (uintptr_t)dptr)
        return CUDA_ERROR_INVALID_VALUE;
    if (!emu.cfg.dma_buf)
        return CUDA_ERROR_NOT_SUPPORTED;
    emu_lock();
    uintptr_t cur = (uintptr_t)dptr, end = cur + size;
    int dev = -2;
    bool ok = true;
    while (ok && cur < end) {
        struct emu_mapping *m = vmm_mapping_at(cur, NULL);
        ok = m && m->handle->phys->dev >= 0 && (dev == -2 || dev == m->handle->phys->dev);
        if (ok) {
            dev = m->handle->phys->dev;
            cur = m->base + m->size;
        }
    }
    if (!ok) { /* cuMemAlloc memory: one allocation holding the whole range */
        size_t pos = 0;
        uint64_t key;
        for (struct emu_alloc *a; cur == (uintptr_t)dptr && (a = emu_map_next(&emu.allocs, &pos, &key));)
            if ((uintptr_t)dptr >= a->base && end <= a->base + a->mapped) {
                ok = true;
                break;
            }
    }
    emu_unlock();
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = memfd_create("cudaemu-dmabuf", MFD_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *(int *)handle = fd;
    return CUDA_SUCCESS;
}

/* ---- lookup for devmem.c ---- */

int emu_vmm_lookup_locked(uintptr_t addr, const struct emu_mapping **m)
{
    struct emu_resv *r = vmm_resv_find(addr, 1);
    if (!r)
        return -1;
    long i = vmm_map_floor(r, addr);
    if (i < 0 || addr - r->maps[i].base >= r->maps[i].size)
        return 0;
    *m = &r->maps[i];
    return 1;
}

size_t emu_vmm_link_bytes(uintptr_t addr, size_t size)
{
    if (size == 0 || addr + size < addr)
        return 0;
    uintptr_t end = addr + size;
    size_t n = 0;
    emu_lock();
    long i = vmm_resv_floor(addr);
    for (i = i < 0 ? 0 : i; (size_t)i < emu.nresv && emu.resv[i]->base < end; i++) {
        struct emu_resv *rv = emu.resv[i];
        long j = vmm_map_floor(rv, addr);
        for (j = j < 0 ? 0 : j; (size_t)j < rv->nmaps && rv->maps[j].base < end; j++) {
            const struct emu_mapping *m = &rv->maps[j];
            if (m->base + m->size <= addr || m->handle->phys->dev >= 0)
                continue;
            uintptr_t lo = m->base > addr ? m->base : addr, hi = m->base + m->size < end ? m->base + m->size : end;
            n += hi - lo;
        }
    }
    emu_unlock();
    return n;
}
