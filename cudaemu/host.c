/*
 * Pinned host memory and the asynchronous copies and memset (services: sleep offload and wake;
 * cuMemcpyDtoDAsync for the tests' graph replays). Host memory is an anonymous mapping, tracked
 * so that cuMemFreeHost can refuse a pointer it did not hand out. Asynchronous work follows the
 * stream model of stream.c: on a capturing stream it becomes a graph node, keeping its arguments
 * for cuGraphLaunch, and does not run (as the driver records it); on a held stream it is pending
 * work (cuStreamQuery says NOT_READY until the hold ends or someone waits), but the bytes move at
 * once (no kernels, no asynchrony beyond the hold model: see the README's infidelities);
 * elsewhere it runs at once.
 */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cudaemu/emu.h"

/* Host allocations by base address -> length (page multiple). Under emu.lock. */
static struct emu_map host_allocs;
static size_t host_bytes;

#define HOST_ALLOC_FLAGS (CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED)

CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    EMU_ENTER(cuMemHostAlloc);
    if (!pp || (Flags & ~(unsigned)HOST_ALLOC_FLAGS))
        return CUDA_ERROR_INVALID_VALUE;
    if (!emu_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (bytesize > SIZE_MAX - page)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t len = (bytesize + page - 1) & ~(page - 1);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    emu_lock();
    /* The value is the length, stored as a pointer-sized integer (never 0: len >= one page). */
    int rc = emu_map_put(&host_allocs, (uint64_t)(uintptr_t)p, (void *)(uintptr_t)len);
    if (!rc)
        host_bytes += len;
    emu_unlock();
    if (rc) {
        munmap(p, len);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    emu_bytes_charge(EMU_E_cuMemHostAlloc, len); /* the driver allocates and pins every page */
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFreeHost(void *p)
{
    EMU_ENTER(cuMemFreeHost);
    if (!emu_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    emu_lock();
    void *v = emu_map_del(&host_allocs, (uint64_t)(uintptr_t)p);
    if (v)
        host_bytes -= (size_t)(uintptr_t)v;
    emu_unlock();
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    emu_bytes_charge(EMU_E_cuMemFreeHost, (size_t)(uintptr_t)v); /* unpinned and given back */
    munmap(p, (size_t)(uintptr_t)v);
    return CUDA_SUCCESS;
}

/* Registered host ranges (cuMemHostRegister) by base address -> length. Under emu.lock. */
static struct emu_map host_regs;
static size_t host_reg_bytes;

#define HOST_REGISTER_FLAGS (CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_IOMEMORY | \
                             CU_MEMHOSTREGISTER_READ_ONLY)

/* Does [p, p + len) overlap a registered range? Under emu.lock; a walk (tests register few). */
static bool host_reg_overlaps(uintptr_t p, size_t len)
{
    size_t pos = 0;
    uint64_t key;
    void *v;
    while ((v = emu_map_next(&host_regs, &pos, &key)))
        if ((uintptr_t)key < p + len && p < (uintptr_t)key + (size_t)(uintptr_t)v)
            return true;
    return false;
}

/* cudaemu's choices where the driver documentation lists errors without saying which case gets
 * which: a NULL pointer or 0 bytes is INVALID_VALUE; overlapping a registered range is
 * HOST_MEMORY_ALREADY_REGISTERED; the range is not pinned (nothing to pin over host memory). */
CUresult CUDAAPI cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
    EMU_ENTER(cuMemHostRegister);
    if (!p || !bytesize || (Flags & ~(unsigned)HOST_REGISTER_FLAGS))
        return CUDA_ERROR_INVALID_VALUE;
    if (!emu_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if ((uintptr_t)p > UINTPTR_MAX - bytesize)
        return CUDA_ERROR_INVALID_VALUE;
    emu_lock();
    CUresult r = CUDA_SUCCESS;
    if (host_reg_overlaps((uintptr_t)p, bytesize))
        r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    else if (emu_map_put(&host_regs, (uint64_t)(uintptr_t)p, (void *)(uintptr_t)bytesize))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    else
        host_reg_bytes += bytesize;
    emu_unlock();
    if (r == CUDA_SUCCESS)
        emu_bytes_charge(EMU_E_cuMemHostRegister, bytesize); /* every page faulted in and pinned */
    return r;
}

CUresult CUDAAPI cuMemHostUnregister(void *p)
{
    EMU_ENTER(cuMemHostUnregister);
    if (!emu_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    emu_lock();
    void *v = emu_map_del(&host_regs, (uint64_t)(uintptr_t)p);
    if (v)
        host_reg_bytes -= (size_t)(uintptr_t)v;
    emu_unlock();
    if (v)
        emu_bytes_charge(EMU_E_cuMemHostUnregister, (size_t)(uintptr_t)v);
    return v ? CUDA_SUCCESS : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

/* Does one range of @p m (base -> length) hold [p, p + n)? Under emu.lock; a walk (a process
 * pins few ranges, and only a model with a pageable rate asks). */
static bool host_within(const struct emu_map *m, uintptr_t p, size_t n)
{
    size_t pos = 0;
    uint64_t key;
    void *v;
    while ((v = emu_map_next(m, &pos, &key)))
        if ((uintptr_t)key <= p && p - (uintptr_t)key <= (size_t)(uintptr_t)v &&
            n <= (size_t)(uintptr_t)v - (p - (uintptr_t)key))
            return true;
    return false;
}

bool emu_host_pageable(const void *p, size_t n)
{
    if (!n || !emu_pageable_modelled())
        return false;
    emu_lock();
    bool pinned = host_within(&host_allocs, (uintptr_t)p, n) || host_within(&host_regs, (uintptr_t)p, n);
    emu_unlock();
    return !pinned;
}

void cudaemu_host_live(size_t *count, size_t *bytes)
{
    emu_env_once();
    emu_lock();
    if (count)
        *count = host_allocs.count + host_regs.count;
    if (bytes)
        *bytes = host_bytes + host_reg_bytes;
    emu_unlock();
}

size_t cudaemu_host_flip(size_t min_bytes, size_t off)
{
    emu_env_once();
    emu_lock();
    size_t pos = 0, n = 0;
    uint64_t key;
    void *v;
    while ((v = emu_map_next(&host_allocs, &pos, &key))) {
        size_t len = (size_t)(uintptr_t)v;
        if (len >= min_bytes && len > off) {
            ((unsigned char *)(uintptr_t)key)[off] ^= 0xFF;
            n++;
        }
    }
    emu_unlock();
    return n;
}

/* When each copy engine (0: host to device, 1: device to host, 2: device to device) is next free
 * on the model timeline (emu_model_now). Under emu.lock. */
static uint64_t engine_ready[3];

/* The model timeline of a copy of @p bytes by entry @p e on @p s, @p link of them in host-located
 * VMM memory (@p link_dir: 1 when they are the destination, as spill's copies to host memory, 0
 * when the source): it starts when the stream, its engine and the host (the call) are all ready
 * and lasts bytes / rate (emu_copy_ns). A device-to-device copy over the link takes the engine of
 * its direction across the link. A copy to or from @p pageable host memory (with a pageable rate
 * set) runs at that rate, and the host waits for it: the driver returns from a device-to-pageable
 * copy once it is done, and from a pageable-to-device one once its bytes are staged (CUDA's "API
 * synchronization behavior"), which for a copy larger than the staging buffers is its end. Lock
 * held. */
static void async_model_locked(CUstream s, enum emu_entry e, size_t bytes, size_t link, int link_dir, bool pageable)
{
    int eng = e == EMU_E_cuMemcpyHtoDAsync ? 0 : e == EMU_E_cuMemcpyDtoHAsync ? 1 : link ? link_dir : 2;
    uint64_t start = emu_model_now();
    if (s->model_ready > start)
        start = s->model_ready;
    if (eng < 2 && engine_ready[eng] > start)
        start = engine_ready[eng];
    s->model_ready = start + emu_copy_ns(e, bytes, link, pageable);
    if (eng < 2)
        engine_ready[eng] = s->model_ready;
    if (pageable)
        emu_model_advance_to(s->model_ready);
}

/* Queue one unit of async work of entry @p e on @p hStream: 1 when it runs now, 0 when it was
 * captured (a graph node keeping @p op for launches; nothing runs), or a CUresult error (negated). */
static int async_enqueue(CUstream hStream, enum emu_entry e, CUgraphNodeType type, const struct emu_op *op,
                         size_t link, int link_dir, bool pageable)
{
    emu_lock();
    int rc = 1;
    CUstream s = emu_stream_resolve_locked(hStream);
    if (!s) {
        rc = -(int)CUDA_ERROR_INVALID_HANDLE;
    } else if (s->cap) {
        CUresult r = emu_capture_add_locked(s, type, op);
        rc = r == CUDA_SUCCESS ? 0 : -(int)r;
    } else if (s->held) {
        /* A deferring stream's copy reads and writes after its earlier fills: they run first. */
        if (s->defer && op->kind != EMU_OP_MEMSET)
            emu_stream_complete_locked(s);
        /* Pending work: its device operands may not be unmapped until it completes (cuMemUnmap). */
        uint64_t seq = s->submitted + 1;
        if ((op->dst_dev && op->size && !emu_stream_pend_locked(s, op->dst, op->size, seq)) ||
            (op->src_dev && op->size && !emu_stream_pend_locked(s, op->src, op->size, seq)))
            rc = -(int)CUDA_ERROR_OUT_OF_MEMORY;
        else
            s->submitted = seq;
        /* A deferring stream's memset moves its bytes when its work completes. */
        if (rc > 0 && s->defer && op->kind == EMU_OP_MEMSET)
            rc = emu_stream_defer_set_locked(s, op->dst, op->size, (unsigned char)op->value) ? 0
                                                                                              : -(int)CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (rc > 0 && op->kind == EMU_OP_MEMCPY)
        async_model_locked(s, e, op->size, link, link_dir, pageable);
    emu_unlock();
    emu_deferred_run();
    return rc;
}

/* The current device may access [addr, addr + n) as @p need asks (the synchronous copies'
 * check): CUDA_ERROR_ILLEGAL_ADDRESS where a GPU would fault. */
static CUresult async_access(uintptr_t addr, size_t n, unsigned need)
{
    return n ? emu_dev_check(addr, n, emu_ctx_current()->ordinal, need) : CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)
{
    EMU_ENTER(cuMemcpyHtoDAsync);
    if (!emu_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ByteCount && (!dstDevice || !srcHost))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult acc = async_access((uintptr_t)dstDevice, ByteCount, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    if (acc != CUDA_SUCCESS)
        return acc;
    struct emu_op op = {EMU_OP_MEMCPY, (uintptr_t)dstDevice, (uintptr_t)srcHost, ByteCount, 0, true, false};
    size_t link = emu_vmm_link_bytes((uintptr_t)dstDevice, ByteCount);
    bool pageable = emu_host_pageable(srcHost, ByteCount);
    int rc = async_enqueue(hStream, EMU_E_cuMemcpyHtoDAsync, CU_GRAPH_NODE_TYPE_MEMCPY, &op, link, 0, pageable);
    if (rc < 0)
        return (CUresult)-rc;
    if (rc && ByteCount) {
        /* Charged to the call, as if the host waited for the copy (sleep and wake do). */
        uint64_t t0 = emu_now_ns();
        CUresult r = emu_dev_write((uintptr_t)dstDevice, srcHost, ByteCount);
        if (r != CUDA_SUCCESS)
            return r;
        emu_copy_wait(EMU_E_cuMemcpyHtoDAsync, ByteCount, link, pageable, t0);
    }
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
    EMU_ENTER(cuMemcpyDtoHAsync);
    if (!emu_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ByteCount && (!dstHost || !srcDevice))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult acc = async_access((uintptr_t)srcDevice, ByteCount, CU_MEM_ACCESS_FLAGS_PROT_READ);
    if (acc != CUDA_SUCCESS)
        return acc;
    struct emu_op op = {EMU_OP_MEMCPY, (uintptr_t)dstHost, (uintptr_t)srcDevice, ByteCount, 0, false, true};
    size_t link = emu_vmm_link_bytes((uintptr_t)srcDevice, ByteCount);
    bool pageable = emu_host_pageable(dstHost, ByteCount);
    int rc = async_enqueue(hStream, EMU_E_cuMemcpyDtoHAsync, CU_GRAPH_NODE_TYPE_MEMCPY, &op, link, 1, pageable);
    if (rc < 0)
        return (CUresult)-rc;
    if (rc && ByteCount) {
        uint64_t t0 = emu_now_ns();
        CUresult r = emu_dev_read(dstHost, (uintptr_t)srcDevice, ByteCount);
        if (r != CUDA_SUCCESS)
            return r;
        emu_copy_wait(EMU_E_cuMemcpyDtoHAsync, ByteCount, link, pageable, t0);
    }
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
    EMU_ENTER(cuMemsetD8Async);
    if (!emu_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (N && !dstDevice)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult acc = async_access((uintptr_t)dstDevice, N, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    if (acc != CUDA_SUCCESS)
        return acc;
    struct emu_op op = {EMU_OP_MEMSET, (uintptr_t)dstDevice, 0, N, uc, true, false};
    int rc = async_enqueue(hStream, EMU_E_cuMemsetD8Async, CU_GRAPH_NODE_TYPE_MEMSET, &op, 0, 0, false);
    if (rc < 0)
        return (CUresult)-rc;
    emu_bytes_note(EMU_E_cuMemsetD8Async, N);
    /* Zeros are punched out of the memory file (cuMemsetD8's reason). */
    return rc && N ? emu_dev_set((uintptr_t)dstDevice, uc, N) : CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
    EMU_ENTER(cuMemcpyDtoDAsync);
    if (!emu_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ByteCount && (!dstDevice || !srcDevice))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult acc = async_access((uintptr_t)srcDevice, ByteCount, CU_MEM_ACCESS_FLAGS_PROT_READ);
    if (acc == CUDA_SUCCESS)
        acc = async_access((uintptr_t)dstDevice, ByteCount, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    if (acc != CUDA_SUCCESS)
        return acc;
    struct emu_op op = {EMU_OP_MEMCPY, (uintptr_t)dstDevice, (uintptr_t)srcDevice, ByteCount, 0, true, true};
    /* Over the link: the larger of the host-located bytes of either side (spill's copies have one). */
    size_t lsrc = emu_vmm_link_bytes((uintptr_t)srcDevice, ByteCount);
    size_t ldst = emu_vmm_link_bytes((uintptr_t)dstDevice, ByteCount);
    size_t link = lsrc > ldst ? lsrc : ldst;
    int rc = async_enqueue(hStream, EMU_E_cuMemcpyDtoDAsync, CU_GRAPH_NODE_TYPE_MEMCPY, &op, link, ldst >= lsrc, false);
    if (rc < 0)
        return (CUresult)-rc;
    if (rc && ByteCount) {
        uint64_t t0 = emu_now_ns();
        CUresult r = emu_dev_copy((uintptr_t)dstDevice, (uintptr_t)srcDevice, ByteCount);
        if (r != CUDA_SUCCESS)
            return r;
        emu_copy_wait(EMU_E_cuMemcpyDtoDAsync, ByteCount, link, false, t0);
    }
    return CUDA_SUCCESS;
}

bool emu_host_range_locked(uintptr_t addr, size_t *avail)
{
    /* A walk: tests and services hold few pinned or registered ranges. */
    const struct emu_map *maps[2] = {&host_allocs, &host_regs};
    for (int k = 0; k < 2; k++) {
        size_t pos = 0;
        uint64_t key;
        void *v;
        while ((v = emu_map_next(maps[k], &pos, &key)))
            if (addr >= (uintptr_t)key && addr - (uintptr_t)key < (size_t)(uintptr_t)v) {
                *avail = (size_t)(uintptr_t)v - (addr - (uintptr_t)key);
                return true;
            }
    }
    return false;
}

/* Does @p a name device memory (VMM address space, mapped or not, or a cuMemAlloc block) rather
 * than host memory (pinned, registered or pageable)? A batch's pointers are untyped (unified
 * addressing): the driver tells the direction from the addresses, and so does cudaemu. */
static bool batch_is_dev(uintptr_t a)
{
    const struct emu_mapping *m;
    emu_lock();
    bool dev = emu_vmm_lookup_locked(a, &m) >= 0 || emu_alloc_at_locked(a);
    emu_unlock();
    return dev;
}

/* cuMemcpyBatchAsync, CUDA 13.0's form: cuda.h 13.0 (the toolkit headers xseg builds against,
 * pip nvidia-cuda-runtime 13.0.96, include/cuda.h, sha256 64025f81a9d6d2b1...: CUDA_VERSION 13000;
 * no repository holds it, so no commit to cite) maps the name to
 * cuMemcpyBatchAsync_v2, eight parameters, no failIdx; CUDA 12.8's cuMemcpyBatchAsync had a
 * size_t *failIdx before hStream and is not emulated (a driver without the _v2 symbol is one
 * without the call, for xseg). The checks are those the header's comment documents, all made
 * before any copy is queued: a count of 0 or a NULL array, numAttrs 0 or over count, attrsIdxs
 * not starting at 0, not strictly increasing or reaching count, a srcAccessOrder outside STREAM,
 * DURING_API_CALL, ANY, and the legacy NULL stream (NULL or CU_STREAM_LEGACY) are
 * CUDA_ERROR_INVALID_VALUE. Each copy's device operands are checked as the single async copies
 * check theirs (unmapped VA ILLEGAL_ADDRESS, no device memory INVALID_VALUE); the first failing
 * copy's error is returned and nothing runs (cudaemu's choice: the driver documents no partial
 * batch). A destroyed stream faults as every entry does. Then each copy is queued as the single
 * call of its direction would be: same stream rules (held, deferring, captured: a memcpy node per
 * copy), the same model rate and copy engine, its bytes counted under that entry; the call itself
 * costs its latency (CUDAEMU_LATENCY cuMemcpyBatchAsync:DURATION) plus batch_copy per copy. */
CUresult CUDAAPI cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                                    CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs, CUstream hStream)
{
    EMU_ENTER(cuMemcpyBatchAsync);
    if (!emu_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!count || !dsts || !srcs || !sizes || !attrs || !attrsIdxs)
        return CUDA_ERROR_INVALID_VALUE;
    if (!numAttrs || numAttrs > count || attrsIdxs[0] != 0 || attrsIdxs[numAttrs - 1] >= count)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t k = 0; k < numAttrs; k++) {
        if (k && attrsIdxs[k] <= attrsIdxs[k - 1])
            return CUDA_ERROR_INVALID_VALUE;
        CUmemcpySrcAccessOrder o = attrs[k].srcAccessOrder;
        if (o != CU_MEMCPY_SRC_ACCESS_ORDER_STREAM && o != CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL &&
            o != CU_MEMCPY_SRC_ACCESS_ORDER_ANY)
            return CUDA_ERROR_INVALID_VALUE;
    }
    if (!hStream || hStream == CU_STREAM_LEGACY)
        return CUDA_ERROR_INVALID_VALUE;
    emu_lock();
    bool live = emu_stream_resolve_locked(hStream) != NULL; /* a destroyed one faults here */
    emu_unlock();
    if (!live)
        return CUDA_ERROR_INVALID_HANDLE;
    /* Every copy checked first: a refused batch queues nothing. */
    for (size_t i = 0; i < count; i++) {
        if (!sizes[i])
            continue;
        if (!dsts[i] || !srcs[i])
            return CUDA_ERROR_INVALID_VALUE;
        CUresult acc = CUDA_SUCCESS;
        if (batch_is_dev((uintptr_t)srcs[i]))
            acc = async_access((uintptr_t)srcs[i], sizes[i], CU_MEM_ACCESS_FLAGS_PROT_READ);
        if (acc == CUDA_SUCCESS && batch_is_dev((uintptr_t)dsts[i]))
            acc = async_access((uintptr_t)dsts[i], sizes[i], CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
        if (acc != CUDA_SUCCESS)
            return acc;
    }
    emu_batch_charge(count);
    for (size_t i = 0; i < count; i++) {
        size_t n = sizes[i];
        if (!n)
            continue;
        uintptr_t d = (uintptr_t)dsts[i], s = (uintptr_t)srcs[i];
        bool ddev = batch_is_dev(d), sdev = batch_is_dev(s);
        enum emu_entry e = ddev && sdev ? EMU_E_cuMemcpyDtoDAsync
                           : ddev       ? EMU_E_cuMemcpyHtoDAsync
                           : sdev       ? EMU_E_cuMemcpyDtoHAsync
                                        : EMU_E_cuMemcpyBatchAsync;
        struct emu_op op = {EMU_OP_MEMCPY, d, s, n, 0, ddev, sdev};
        size_t ls = sdev ? emu_vmm_link_bytes(s, n) : 0, ld = ddev ? emu_vmm_link_bytes(d, n) : 0;
        size_t link = ls > ld ? ls : ld;
        bool pageable = !ddev ? emu_host_pageable((void *)d, n) : !sdev ? emu_host_pageable((void *)s, n) : false;
        int rc = async_enqueue(hStream, e, CU_GRAPH_NODE_TYPE_MEMCPY, &op, link, ld >= ls, pageable);
        if (rc < 0)
            return (CUresult)-rc;
        if (!rc)
            continue;
        uint64_t t0 = emu_now_ns();
        CUresult r = ddev && sdev ? emu_dev_copy(d, s, n)
                     : ddev       ? emu_dev_write(d, (const void *)s, n)
                     : sdev       ? emu_dev_read((void *)d, s, n)
                                  : (memmove((void *)d, (const void *)s, n), CUDA_SUCCESS);
        if (r != CUDA_SUCCESS)
            return r;
        emu_copy_wait(e, n, link, pageable, t0);
    }
    return CUDA_SUCCESS;
}
