/*
 * Pools with their owner's allocator (xseg_pool_retain_owned, issue 73): the engines' patterns on
 * cudaemu, one process per test (argv[1] names it), in expandable mode (xseg's default) and in
 * classic mode.
 *
 * - nccl_*: vLLM's pynccl_allocator pattern, a MemPool whose allocator is ncclMemAlloc /
 *   ncclMemFree. The stand-in allocates as NCCL's ncclMemAlloc does with cuMem enabled
 *   (NVIDIA/nccl src/allocator.cc at 05d0ca5a5e879fce68088ccf168e11043ab87944): the size rounded
 *   up to the RECOMMENDED granularity of a pinned device allocation, cuMemCreate of that size,
 *   cuMemAddressReserve aligned to the granularity, cuMemMap of the whole handle at offset 0,
 *   cuMemSetAccess read-write for the device; ncclMemFree (ncclCuMemFree) unmaps, releases the
 *   handle and frees the reservation.
 * - saver_*: a torch_memory_saver-style hook pool: its callbacks cuMemCreate and map pages of
 *   their own (MINIMUM granularity, one handle a segment) and keep a table of them, as a sleep
 *   allocator does to unmap and remap them later itself.
 * - managed_*: Megatron's unified-memory pool (NVIDIA/Megatron-LM
 *   megatron/core/inference/unified_memory.py at 397c94a7e25a6c7f1be9d2733047ed5af2f2a052), a
 *   MemPool over a CUDAPluggableAllocator whose alloc is cudaMallocManaged(cudaMemAttachGlobal)
 *   and whose free is cudaFree: the stand-in allocates with cuMemAllocManaged
 *   (CU_MEM_ATTACH_GLOBAL, the size asked) and frees with cuMemFree. Besides the device's writes,
 *   the host writes and reads the tensors at their addresses (managed memory is the host's too),
 *   and they are prefetched to the host and back to the device (cuMemPrefetchAsync, as an engine
 *   moving such a pool does) at the same address, every byte read after each. (That file's
 *   cudaMemAdvise hints are not made: cudaemu has no cuMemAdvise.)
 * - bad_input, owner_oom, misaligned, capture: the API's refusals, an owner out of memory, an
 *   owner's address xseg cannot use, and a capture into such a pool (PyTorch's private-pool rules).
 *
 * Each pattern writes and reads bytes in the pool, frees, releases the pool (~MemPool),
 * empties the cache, and checks that the owner's free got every segment back (same size, device
 * and stream its alloc saw), that the pool was forgotten (the forget callback), and that xseg's
 * own pools and statistics are as before: a block of the default pool, live throughout, keeps
 * its bytes; the reserve returns to what it was.
 * */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/common/testutil.h"
#include "xseg.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define MAX_SEGS 64

/* ---- an owner's allocator with a ledger of what it handed out ------------------------------ */

struct owner_seg {
    CUdeviceptr ptr;
    size_t size;     /* what xseg asked for */
    size_t mapped;   /* what the owner reserved and mapped */
    CUmemGenericAllocationHandle handle;
    CUstream stream;
    bool live;
};

struct owner {
    CUmemAllocationGranularity_flags gran_kind;
    bool managed;         /* cuMemAllocManaged / cuMemFree (Megatron's), not cuMemCreate pages */
    struct owner_seg segs[MAX_SEGS];
    int nsegs, nlive, allocs, frees, bad_frees, forgets;
    int fail_n;           /* alloc returns NULL this many more times */
    size_t misalign;      /* alloc returns ptr + misalign (then free must get ptr + misalign back) */
};

/* The owner got every segment back through its free, none twice or unknown, and heard the pool
 * forgotten once: what every test checks once the pool is gone. */
static void owner_gave_all_back(const struct owner *o)
{
    assert_int_equal(o->nlive, 0);
    assert_int_equal(o->frees, o->nsegs);
    assert_int_equal(o->bad_frees, 0);
    assert_int_equal(o->forgets, 1);
}

static CUmemAllocationProp pinned_prop(void)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    return prop;
}

/* Managed memory's entry points, which xseg's driver table does not load: resolved from the loaded
 * driver (NULL: it lacks them). cuda.h names CUDA 13's prefetch (a CUmemLocation and flags)
 * cuMemPrefetchAsync_v2. */
static __typeof__(cuMemAllocManaged) *alloc_managed;
static __typeof__(cuMemPrefetchAsync) *prefetch;

/* The driver xseg loads ($XSEG_LIBCUDA or libcuda.so.1; the same object when loaded already),
 * kept open for the process's life. */
static void resolve_managed(void)
{
    const char *path = getenv("XSEG_LIBCUDA");
    void *lib = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib) {
        *(void **)&alloc_managed = dlsym(lib, "cuMemAllocManaged");
        *(void **)&prefetch = dlsym(lib, "cuMemPrefetchAsync_v2");
    }
}

/* Megatron's managed_malloc: managed memory of exactly the size asked, attached globally. */
static void *owner_alloc_managed(struct owner *o, size_t size, CUstream stream)
{
    struct owner_seg *s = &o->segs[o->nsegs];
    memset(s, 0, sizeof *s);
    if (!alloc_managed || alloc_managed(&s->ptr, size, CU_MEM_ATTACH_GLOBAL) != CUDA_SUCCESS)
        return NULL;
    s->size = s->mapped = size;
    s->stream = stream;
    s->live = true;
    o->nsegs++;
    o->nlive++;
    return (void *)(uintptr_t)s->ptr;
}

static void *owner_alloc(size_t size, int device, CUstream stream, void *user)
{
    struct owner *o = user;
    o->allocs++;
    if (o->fail_n > 0) {
        o->fail_n--;
        return NULL;
    }
    if (device != 0 || o->nsegs == MAX_SEGS)
        return NULL;
    if (o->managed)
        return owner_alloc_managed(o, size, stream);
    CUmemAllocationProp prop = pinned_prop();
    size_t gran = 0;
    if (drv->cuMemGetAllocationGranularity(&gran, &prop, o->gran_kind) != CUDA_SUCCESS || !gran)
        return NULL;
    size_t mapped = (size + gran - 1) / gran * gran;
    struct owner_seg *s = &o->segs[o->nsegs];
    memset(s, 0, sizeof *s);
    if (drv->cuMemCreate(&s->handle, mapped, &prop, 0) != CUDA_SUCCESS)
        return NULL;
    if (drv->cuMemAddressReserve(&s->ptr, mapped, gran, 0, 0) != CUDA_SUCCESS) {
        (void)drv->cuMemRelease(s->handle);
        return NULL;
    }
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = 0;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (drv->cuMemMap(s->ptr, mapped, 0, s->handle, 0) != CUDA_SUCCESS) {
        (void)drv->cuMemAddressFree(s->ptr, mapped);
        (void)drv->cuMemRelease(s->handle);
        return NULL;
    }
    if (drv->cuMemSetAccess(s->ptr, mapped, &acc, 1) != CUDA_SUCCESS) {
        (void)drv->cuMemUnmap(s->ptr, mapped);
        (void)drv->cuMemAddressFree(s->ptr, mapped);
        (void)drv->cuMemRelease(s->handle);
        return NULL;
    }
    s->size = size;
    s->mapped = mapped;
    s->stream = stream;
    s->live = true;
    o->nsegs++;
    o->nlive++;
    return (void *)(uintptr_t)(s->ptr + o->misalign);
}

static void owner_free(void *ptr, size_t size, int device, CUstream stream, void *user)
{
    struct owner *o = user;
    o->frees++;
    for (int i = 0; i < o->nsegs; i++) {
        struct owner_seg *s = &o->segs[i];
        if (!s->live || s->ptr + o->misalign != (CUdeviceptr)(uintptr_t)ptr)
            continue;
        if (s->size != size || device != 0 || s->stream != stream)
            o->bad_frees++;
        s->live = false;
        o->nlive--;
        if (o->managed) { /* managed_free: cudaFree */
            if (drv->cuMemFree(s->ptr) != CUDA_SUCCESS)
                o->bad_frees++;
            return;
        }
        if (drv->cuMemUnmap(s->ptr, s->mapped) != CUDA_SUCCESS || drv->cuMemRelease(s->handle) != CUDA_SUCCESS ||
            drv->cuMemAddressFree(s->ptr, s->mapped) != CUDA_SUCCESS)
            o->bad_frees++;
        return;
    }
    o->bad_frees++; /* not one of ours */
}

static void owner_forget(void *user) { ((struct owner *)user)->forgets++; }

static xseg_pool_allocator owner_of(struct owner *o)
{
    xseg_pool_allocator a = {owner_alloc, owner_free, owner_forget, o};
    return a;
}

static bool owner_holds(const struct owner *o, const void *p, size_t n)
{
    CUdeviceptr a = (CUdeviceptr)(uintptr_t)p;
    for (int i = 0; i < o->nsegs; i++)
        if (o->segs[i].live && a >= o->segs[i].ptr && a + n <= o->segs[i].ptr + o->segs[i].size)
            return true;
    return false;
}

/* ---- helpers ------------------------------------------------------------------------------- */

static void ok(xseg_status st, const char *what)
{
    if (st != XSEG_SUCCESS)
        fail_msg("%s: %s", what, xseg_last_error());
}

static void fill(void *p, size_t n, uint32_t tag) { tu_assert_cu(tu_fill((CUdeviceptr)(uintptr_t)p, n, tag)); }
static void check(void *p, size_t n, uint32_t tag) { assert_true(tu_check((CUdeviceptr)(uintptr_t)p, n, tag)); }

static xseg_pool_id pool_id_of(const void *p)
{
    xseg_snapshot *snap = NULL;
    ok(xseg_take_snapshot(0, &snap), "xseg_take_snapshot");
    xseg_pool_id id = {UINT64_MAX, UINT64_MAX};
    for (size_t i = 0; i < snap->nsegments; i++)
        for (size_t j = 0; j < snap->segments[i].nblocks; j++)
            if (snap->segments[i].blocks[j].address == (uint64_t)(uintptr_t)p) {
                id.first = snap->segments[i].pool_id[0];
                id.second = snap->segments[i].pool_id[1];
            }
    xseg_snapshot_free(snap);
    return id;
}

/* The byte the host writes at offset @p i of a managed tensor tagged @p tag. */
static unsigned char host_byte(size_t i, uint32_t tag) { return (unsigned char)(i * 31 + tag * 7 + (i >> 12)); }

/*
 * What managed memory allows beyond device memory, on a tensor of @p n bytes at @p p: the host
 * writes every byte at the tensor's address, the device overwrites a quarter (cuMemsetD8), the
 * tensor is prefetched to the host and every byte read there, then prefetched back to the device
 * (the same address) and every byte read by a device copy and by the host.
 */
static void managed_touch(void *p, size_t n, uint32_t tag)
{
    assert_non_null(prefetch);
    unsigned char *h = p;
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)p;
    for (size_t i = 0; i < n; i++)
        h[i] = host_byte(i, tag);
    size_t lo = n / 4, len = n / 4;
    tu_assert_cu(drv->cuMemsetD8(d + lo, (unsigned char)(0xa0 + tag % 16), len));
    CUmemLocation host = {CU_MEM_LOCATION_TYPE_HOST, 0}, dev = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    tu_assert_cu(prefetch(d, n, host, 0, NULL));
    tu_assert_cu(drv->cuStreamSynchronize(NULL));
    for (size_t i = 0; i < n; i++)
        if (h[i] != (i - lo < len ? (unsigned char)(0xa0 + tag % 16) : host_byte(i, tag)))
            fail_msg("managed tensor %p (%zu bytes): byte %zu on the host after the prefetch", p, n, i);
    tu_assert_cu(prefetch(d, n, dev, 0, NULL));
    tu_assert_cu(drv->cuStreamSynchronize(NULL));
    unsigned char *out = malloc(n);
    assert_non_null(out);
    tu_assert_cu(drv->cuMemcpyDtoH(out, d, n));
    for (size_t i = 0; i < n; i++)
        if (out[i] != h[i] || out[i] != (i - lo < len ? (unsigned char)(0xa0 + tag % 16) : host_byte(i, tag)))
            fail_msg("managed tensor %p (%zu bytes): byte %zu on the device after the prefetch", p, n, i);
    free(out);
}

/*
 * The pattern: a default-pool block lives throughout; a pool of @p o's memory takes allocations
 * of @p n sizes (small and large, some freed and reused to split and merge), each written and
 * read; then the MemPool's end: free, release, empty_cache; the owner got everything back.
 */
static void run_pattern(const char *config, struct owner *o, const size_t *sizes, size_t n)
{
    tu_xseg_init_or_skip(config);
    void *mine = tu_malloc(3 * MiB, NULL);
    fill(mine, 3 * MiB, 0xabc);
    int64_t reserved0 = tu_stat("reserved_bytes.all.current");
    int64_t segs0 = tu_stat("segment.all.current");
    int64_t dev_allocs0 = tu_stat("num_device_alloc");

    xseg_pool_id pool;
    ok(xseg_pool_create(&pool), "xseg_pool_create");
    xseg_pool_allocator a = owner_of(o);
    ok(xseg_pool_retain_owned(0, pool, &a), "xseg_pool_retain_owned");
    int uses = 0;
    ok(xseg_pool_use_count(0, pool, &uses), "xseg_pool_use_count");
    assert_int_equal(uses, 1);
    ok(xseg_begin_allocate_to_pool(0, pool, NULL, NULL), "xseg_begin_allocate_to_pool");

    void *ptrs[16];
    assert_true(n <= 16);
    for (int round = 0; round < 2; round++) { /* the second round reuses the cached blocks */
        for (size_t i = 0; i < n; i++) {
            ptrs[i] = tu_malloc(sizes[i], NULL);
            assert_true(owner_holds(o, ptrs[i], sizes[i]));
            fill(ptrs[i], sizes[i], (uint32_t)(round * 100 + i));
        }
        for (size_t i = 0; i < n; i++)
            check(ptrs[i], sizes[i], (uint32_t)(round * 100 + i));
        for (size_t i = 0; o->managed && i < n; i++)
            managed_touch(ptrs[i], sizes[i], (uint32_t)(round * 100 + i));
        xseg_pool_id got = pool_id_of(ptrs[0]);
        assert_true(got.first == pool.first && got.second == pool.second);
        size_t live = 0;
        ok(xseg_pool_live_blocks(0, pool, NULL, 0, &live), "xseg_pool_live_blocks");
        assert_int_equal(live, n);
        /* Statistics count the owner's segments like any pool's (as PyTorch does). */
        int64_t owned = 0;
        for (int i = 0; i < o->nsegs; i++)
            owned += o->segs[i].live ? (int64_t)o->segs[i].size : 0;
        assert_int_equal(tu_stat("reserved_bytes.all.current"), reserved0 + owned);
        assert_int_equal(tu_stat("segment.all.current"), segs0 + o->nlive);
        /* The registration ledger holds an owner's segment as a classic one (off release until
         * unregistered; tests/services/test_nccl_standin.c shows the hold); past its end: refused. */
        xseg_range_callbacks cb;
        memset(&cb, 0, sizeof cb);
        assert_int_equal(xseg_register_range(ptrs[1], 512, &cb, NULL), XSEG_SUCCESS);
        assert_int_equal(xseg_unregister_range(ptrs[1], 512, NULL), XSEG_SUCCESS);
        assert_int_equal(xseg_register_range(ptrs[1], (size_t)1 << 40, &cb, NULL), XSEG_ERROR_INVALID_VALUE);
        for (size_t i = 0; i < n; i += 2)
            tu_free(ptrs[i]);
        for (size_t i = 1; i < n; i += 2)
            tu_free(ptrs[i]);
    }
    int allocs = o->allocs;
    assert_true(allocs > 0);
    ok(xseg_end_allocate_to_pool(0, pool), "xseg_end_allocate_to_pool");
    ok(xseg_release_pool(0, pool), "xseg_release_pool (the begin's use, as use_mem_pool's exit)");

    /* The MemPool still holds its use: empty_cache keeps its segments (PyTorch: only pools with
     * no users are released). */
    ok(xseg_empty_cache(0), "xseg_empty_cache");
    assert_int_equal(o->frees, 0);
    ok(xseg_trim(0, 0), "xseg_trim"); /* nor does a trim */
    assert_int_equal(o->frees, 0);
    /* Nothing of xseg's sleeps such memory. */
    xseg_status slept = xseg_sleep(0, pool, XSEG_SLEEP_OFFLOAD);
    if (slept != XSEG_ERROR_NOT_SUPPORTED)
        fail_msg("xseg_sleep of an owned pool: %d %s", slept, xseg_last_error());

    /* ~MemPool: release, then empty_cache gives every segment back through the owner's free. */
    ok(xseg_release_pool(0, pool), "xseg_release_pool");
    ok(xseg_empty_cache(0), "xseg_empty_cache");
    owner_gave_all_back(o);
    assert_int_equal(o->allocs, allocs);
    ok(xseg_pool_use_count(0, pool, &uses), "xseg_pool_use_count");
    assert_int_equal(uses, 0);

    /* xseg's own: the default block's bytes, the reserve, the device allocations. */
    check(mine, 3 * MiB, 0xabc);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), reserved0);
    assert_int_equal(tu_stat("segment.all.current"), segs0);
    assert_int_equal(tu_stat("num_device_alloc"), dev_allocs0 + o->nsegs);
    assert_int_equal(tu_stat("num_device_free"), o->nsegs);
    tu_free(mine);
    ok(xseg_empty_cache(0), "xseg_empty_cache");
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    ok(xseg_shutdown(), "xseg_shutdown");
    struct cudaemu_live live;
    if (tu_live(&live)) {
        assert_int_equal(live.handles, 0);
        assert_int_equal(live.mapped_bytes, 0);
        assert_int_equal(live.reservations, 0);
        assert_int_equal(live.allocs, 0);
    }
}

/* Communication buffers: a few sizes from 4 KiB to 40 MiB (small and large pools). */
static const size_t comm_sizes[] = {4 * KiB, 700 * KiB, 3 * MiB, 8 * MiB, 40 * MiB, 512};

/* A MemPool(allocator=...) as PyTorch makes one: a new pool id, retained with @p o as its owner
 * through @p a (kept by the caller for the pool's life). */
static xseg_pool_id owned_pool(struct owner *o, xseg_pool_allocator *a)
{
    *a = owner_of(o);
    xseg_pool_id pool;
    ok(xseg_pool_create(&pool), "xseg_pool_create");
    ok(xseg_pool_retain_owned(0, pool, a), "xseg_pool_retain_owned");
    return pool;
}

static void test_nccl_expandable(void **state)
{
    (void)state;
    struct owner o = {.gran_kind = CU_MEM_ALLOC_GRANULARITY_RECOMMENDED};
    run_pattern("expandable_segments:True", &o, comm_sizes, sizeof comm_sizes / sizeof comm_sizes[0]);
}

static void test_nccl_classic(void **state)
{
    (void)state;
    struct owner o = {.gran_kind = CU_MEM_ALLOC_GRANULARITY_RECOMMENDED};
    run_pattern("expandable_segments:False", &o, comm_sizes, sizeof comm_sizes / sizeof comm_sizes[0]);
}

/* Weights and a KV cache in a sleep allocator's pool. */
static const size_t saver_sizes[] = {16 * MiB, 2 * MiB, 30 * MiB, 1 * MiB, 64 * KiB};

static void test_saver_expandable(void **state)
{
    (void)state;
    struct owner o = {.gran_kind = CU_MEM_ALLOC_GRANULARITY_MINIMUM};
    run_pattern("expandable_segments:True", &o, saver_sizes, sizeof saver_sizes / sizeof saver_sizes[0]);
}

static void test_saver_classic(void **state)
{
    (void)state;
    struct owner o = {.gran_kind = CU_MEM_ALLOC_GRANULARITY_MINIMUM};
    run_pattern("expandable_segments:False", &o, saver_sizes, sizeof saver_sizes / sizeof saver_sizes[0]);
}

/* Megatron's unified-memory pool: a KV cache's and activations' sizes (small and large pools). */
static const size_t managed_sizes[] = {20 * MiB, 512, 3 * MiB, 64 * KiB, 1 * MiB + 512};

static void run_managed(const char *config)
{
    resolve_managed();
    if (!alloc_managed || !prefetch)
        fail_msg("the driver ($XSEG_LIBCUDA) exports no cuMemAllocManaged or cuMemPrefetchAsync_v2");
    struct owner o = {.managed = true};
    run_pattern(config, &o, managed_sizes, sizeof managed_sizes / sizeof managed_sizes[0]);
}

static void test_managed_expandable(void **state)
{
    (void)state;
    run_managed("expandable_segments:True");
}

static void test_managed_classic(void **state)
{
    (void)state;
    run_managed("expandable_segments:False");
}

/* Bad input names what was wrong and changes nothing. */
static void test_bad_input(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True");
    struct owner o = {.gran_kind = CU_MEM_ALLOC_GRANULARITY_MINIMUM};
    xseg_pool_allocator a = owner_of(&o);
    xseg_pool_id pool, plain;
    ok(xseg_pool_create(&pool), "xseg_pool_create");
    ok(xseg_pool_create(&plain), "xseg_pool_create");
    xseg_pool_id none = {0, 0};
    assert_int_equal(xseg_pool_retain_owned(0, none, &a), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "default pool"));
    assert_int_equal(xseg_pool_retain_owned(0, pool, NULL), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "owner is NULL"));
    xseg_pool_allocator b = a;
    b.alloc = NULL;
    assert_int_equal(xseg_pool_retain_owned(0, pool, &b), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "owner->alloc"));
    b = a;
    b.free = NULL;
    assert_int_equal(xseg_pool_retain_owned(0, pool, &b), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "owner->free"));
    assert_int_not_equal(xseg_pool_retain_owned(99, pool, &a), XSEG_SUCCESS);
    /* A pool of xseg's memory cannot take an owner, nor an owned pool another owner. */
    ok(xseg_pool_retain(0, plain), "xseg_pool_retain");
    assert_int_equal(xseg_pool_retain_owned(0, plain, &a), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "xseg's own memory"));
    ok(xseg_pool_retain_owned(0, pool, &a), "xseg_pool_retain_owned");
    ok(xseg_pool_retain_owned(0, pool, &a), "xseg_pool_retain_owned (the same owner: a use)");
    b = a;
    b.user = NULL;
    assert_int_equal(xseg_pool_retain_owned(0, pool, &b), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "another allocator"));
    int uses = 0;
    ok(xseg_pool_use_count(0, pool, &uses), "xseg_pool_use_count");
    assert_int_equal(uses, 2);
    ok(xseg_release_pool(0, pool), "xseg_release_pool");
    assert_int_equal(o.forgets, 0);
    ok(xseg_release_pool(0, pool), "xseg_release_pool");
    assert_int_equal(o.forgets, 1); /* no memory: forgotten at once */
    ok(xseg_release_pool(0, plain), "xseg_release_pool");
    assert_int_equal(o.allocs, 0);
    ok(xseg_shutdown(), "xseg_shutdown");
}

/* The owner has no memory: the allocation fails as out of memory, and the pool stays usable. */
static void test_owner_oom(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True");
    struct owner o = {.gran_kind = CU_MEM_ALLOC_GRANULARITY_MINIMUM};
    xseg_pool_allocator a;
    xseg_pool_id pool = owned_pool(&o, &a);
    ok(xseg_begin_allocate_to_pool(0, pool, NULL, NULL), "xseg_begin_allocate_to_pool");
    int64_t reserved0 = tu_stat("reserved_bytes.all.current");
    int64_t ooms0 = tu_stat("num_ooms");
    void *p = NULL;
    /* An out-of-memory error naming the owner, nothing reserved, nothing left with the owner. */
    o.fail_n = 1000;
    assert_int_equal(xseg_malloc(&p, 5 * MiB, 0, NULL), XSEG_ERROR_OUT_OF_MEMORY);
    assert_non_null(strstr(xseg_last_error(), "the pool's allocator"));
    assert_int_equal(tu_stat("num_ooms"), ooms0 + 1);
    assert_int_equal(o.nlive, 0);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), reserved0);
    /* The owner has memory again: the pool is usable. */
    o.fail_n = 0;
    p = tu_malloc(5 * MiB, NULL);
    assert_true(owner_holds(&o, p, 5 * MiB));
    fill(p, 5 * MiB, 7);
    check(p, 5 * MiB, 7);
    tu_free(p);
    ok(xseg_end_allocate_to_pool(0, pool), "xseg_end_allocate_to_pool");
    ok(xseg_release_pool(0, pool), "xseg_release_pool (the begin's use, as use_mem_pool's exit)");
    ok(xseg_release_pool(0, pool), "xseg_release_pool");
    ok(xseg_empty_cache(0), "xseg_empty_cache");
    assert_int_equal(o.nlive, 0);
    assert_int_equal(o.bad_frees, 0);
    assert_int_equal(o.forgets, 1);
    ok(xseg_shutdown(), "xseg_shutdown");
}

/* An address xseg cannot use (not 512-byte aligned): refused with the reason, given back. */
static void test_misaligned(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True");
    struct owner o = {.gran_kind = CU_MEM_ALLOC_GRANULARITY_MINIMUM, .misalign = 256};
    xseg_pool_allocator a;
    xseg_pool_id pool = owned_pool(&o, &a);
    ok(xseg_begin_allocate_to_pool(0, pool, NULL, NULL), "xseg_begin_allocate_to_pool");
    void *p = NULL;
    assert_int_equal(xseg_malloc(&p, 1 * MiB, 0, NULL), XSEG_ERROR_INVALID_VALUE);
    assert_non_null(strstr(xseg_last_error(), "not 512-byte aligned"));
    assert_int_equal(o.nlive, 0);
    assert_int_equal(o.bad_frees, 0);
    assert_int_equal(tu_stat("reserved_bytes.all.current"), 0);
    ok(xseg_end_allocate_to_pool(0, pool), "xseg_end_allocate_to_pool");
    ok(xseg_release_pool(0, pool), "xseg_release_pool (the begin's use, as use_mem_pool's exit)");
    /* Outside the pool, xseg allocates as ever. */
    p = tu_malloc(1 * MiB, NULL);
    tu_free(p);
    ok(xseg_release_pool(0, pool), "xseg_release_pool");
    assert_int_equal(o.forgets, 1);
    ok(xseg_empty_cache(0), "xseg_empty_cache");
    ok(xseg_shutdown(), "xseg_shutdown");
}

/* torch.cuda.graph(g, pool=mempool.id): a capture into an owned pool grows through the owner
 * (in relaxed capture mode) without breaking the capture; its memory stays for the graph until
 * the graph's use is released, then goes back through the owner's free. */
static void test_capture(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True");
    struct owner o = {.gran_kind = CU_MEM_ALLOC_GRANULARITY_RECOMMENDED};
    xseg_pool_allocator a;
    xseg_pool_id pool = owned_pool(&o, &a);
    CUstream cs;
    tu_assert_cu(drv->cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING));
    xseg_pool_id used = pool;
    ok(xseg_capture_begin(0, cs, &used, CU_STREAM_CAPTURE_MODE_GLOBAL), "xseg_capture_begin");
    assert_true(used.first == pool.first && used.second == pool.second);
    void *x = tu_malloc(6 * MiB, cs);
    assert_true(owner_holds(&o, x, 6 * MiB));
    tu_free(x);
    ok(xseg_empty_cache(0), "xseg_empty_cache"); /* during a capture: nothing goes */
    assert_int_equal(o.frees, 0);
    CUgraph g = NULL;
    ok(xseg_capture_end(0, cs, &g), "xseg_capture_end");
    assert_non_null(g);
    tu_assert_cu(drv->cuGraphDestroy(g));
    ok(xseg_release_pool(0, pool), "xseg_release_pool (the graph)");
    ok(xseg_empty_cache(0), "xseg_empty_cache");
    assert_int_equal(o.frees, 0); /* the MemPool's use holds it */
    ok(xseg_release_pool(0, pool), "xseg_release_pool (the MemPool)");
    ok(xseg_empty_cache(0), "xseg_empty_cache");
    owner_gave_all_back(&o);
    tu_assert_cu(drv->cuStreamDestroy(cs));
    ok(xseg_shutdown(), "xseg_shutdown");
}

/* xseg_shutdown with the pool still held (a MemPool alive at exit) and a block of it cached:
 * the segment goes back through the owner's free, and the owner hears the pool is forgotten. */
static void test_shutdown_held(void **state)
{
    (void)state;
    tu_xseg_init_or_skip("expandable_segments:True");
    struct owner o = {.gran_kind = CU_MEM_ALLOC_GRANULARITY_RECOMMENDED};
    xseg_pool_allocator a;
    xseg_pool_id pool = owned_pool(&o, &a);
    ok(xseg_begin_allocate_to_pool(0, pool, NULL, NULL), "xseg_begin_allocate_to_pool");
    void *p = tu_malloc(2 * MiB, NULL);
    fill(p, 2 * MiB, 5);
    check(p, 2 * MiB, 5);
    tu_free(p);
    ok(xseg_end_allocate_to_pool(0, pool), "xseg_end_allocate_to_pool");
    assert_int_equal(o.nlive, 1);
    ok(xseg_shutdown(), "xseg_shutdown");
    owner_gave_all_back(&o);
    struct cudaemu_live live;
    if (tu_live(&live)) {
        assert_int_equal(live.handles, 0);
        assert_int_equal(live.reservations, 0);
    }
}

int main(int argc, char **argv)
{
    const struct tu_named_test all_tests[] = {
        TU_NAMED(test_nccl_expandable), TU_NAMED(test_nccl_classic), TU_NAMED(test_saver_expandable),
        TU_NAMED(test_saver_classic),   TU_NAMED(test_bad_input),    TU_NAMED(test_owner_oom),
        TU_NAMED(test_misaligned),      TU_NAMED(test_capture),      TU_NAMED(test_shutdown_held),
        TU_NAMED(test_managed_expandable), TU_NAMED(test_managed_classic),
    };
    return tu_run_named("owned_pools", all_tests, sizeof all_tests / sizeof all_tests[0], argc, argv);
}
