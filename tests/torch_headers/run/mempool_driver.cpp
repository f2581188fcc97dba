// torch.cuda.MemPool(allocator=A) with xseg as PyTorch's allocator (issue 73), called as PyTorch
// 2.11 calls the allocator (the `main` stub interface, through the stand-in fake_torch.cpp):
// MemPool.__init__ -> createOrIncrefPool(device, id, A); use_mem_pool -> beginAllocateToPool,
// allocations, endAllocateToPool, releasePool; ~MemPool -> releasePool, emptyCache(id). A is a
// CUDAPluggableAllocator over cuMemAlloc / cuMemFree with a ledger (vLLM's pynccl_allocator
// builds the same shape over ncclMemAlloc / ncclMemFree). Checks: the pool's blocks lie in A's
// segments and hold their bytes, statistics and use_count, empty_cache keeps the segments while
// the MemPool lives, ~MemPool gives every segment back through A's free, xseg drops its reference
// to A, and xseg's own blocks are untouched. Before issue 73 createOrIncrefPool refused A.
#include <dlfcn.h>

#include <cstdlib>
#include <map>
#include <memory>

#include <cuda.h>

#include "devmem.h"
#include "driver.h"

namespace {
int64_t stat(int dev, const char *key)
{
    int64_t v = -1;
    return xseg_stat(dev, key, &v) == XSEG_SUCCESS ? v : -1;
}

// The owner's ledger: what its alloc handed out and its free got back.
struct Ledger {
    std::map<void *, size_t> live;
    int allocs = 0, frees = 0, bad = 0;
} L;
decltype(&::cuMemAlloc) mem_alloc;
decltype(&::cuMemFree) mem_free;

bool in_owner(const void *p, size_t n)
{
    for (auto &kv : L.live)
        if ((const char *)p >= (const char *)kv.first && (const char *)p + n <= (const char *)kv.first + kv.second)
            return true;
    return false;
}

c10::cuda::MempoolId_t pool_of(void *p)
{
    xseg_snapshot *snap = nullptr;
    c10::cuda::MempoolId_t id{~0ull, ~0ull};
    if (xseg_take_snapshot(-1, &snap) != XSEG_SUCCESS)
        return id;
    for (size_t i = 0; i < snap->nsegments; i++) {
        const xseg_segment_info &s = snap->segments[i];
        if ((uint64_t)p >= s.address && (uint64_t)p < s.address + s.total_size)
            id = {s.pool_id[0], s.pool_id[1]};
    }
    xseg_snapshot_free(snap);
    return id;
}
} // namespace

int main()
{
    Pluggable *a = install_adapter();
    if (!a)
        return 1;
    auto owner = std::make_shared<Pluggable>(
        [](size_t size, int, cudaStream_t) -> void * {
            CUdeviceptr p = 0;
            if (mem_alloc(&p, size) != CUDA_SUCCESS)
                return nullptr;
            L.live[(void *)p] = size;
            L.allocs++;
            return (void *)p;
        },
        [](void *p, size_t size, int, cudaStream_t) {
            auto it = L.live.find(p);
            if (it == L.live.end() || it->second != size)
                L.bad++;
            else
                L.live.erase(it);
            L.frees++;
            if (mem_free((CUdeviceptr)p) != CUDA_SUCCESS)
                L.bad++;
        });

    // xseg's own memory, live throughout.
    void *mine = alloc_on(a, 2 * MiB, 0, nullptr); // initializes the driver
    if (!dev_ctx()) {
        std::fprintf(stderr, "FAIL no context on device 0\n");
        return 1;
    }
    // xseg loaded the driver by now (RTLD_NOLOAD finds it).
    const char *path = std::getenv("XSEG_LIBCUDA");
    void *lib = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOLOAD | RTLD_NOW);
    mem_alloc = reinterpret_cast<decltype(mem_alloc)>(lib ? dlsym(lib, "cuMemAlloc_v2") : nullptr);
    mem_free = reinterpret_cast<decltype(mem_free)>(lib ? dlsym(lib, "cuMemFree_v2") : nullptr);
    if (!mem_alloc || !mem_free) {
        std::fprintf(stderr, "FAIL no cuMemAlloc / cuMemFree in the loaded driver\n");
        return 1;
    }
    EXPECT(dev_set(mine, 0x11, 2 * MiB), "cuMemsetD8 of xseg's block");
    int64_t reserved0 = stat(0, "reserved_bytes.all.current"), segs0 = stat(0, "segment.all.current");

    // MemPool(allocator=torch.cuda.memory.get_current_allocator()): xseg itself, refused.
    try {
        a->createOrIncrefPool(0, {0, 72}, torch::cuda::CUDAPluggableAllocator::getCurrentAllocator());
        EXPECT(false, "a MemPool over xseg itself was taken");
    } catch (const c10::Error &e) {
        EXPECT(contains(e.what(), "given xseg itself"), "message: %s", e.what());
    }
    EXPECT(a->getPoolUseCount(0, {0, 72}) == 0, "the refused pool has users");

    // pool = torch.cuda.MemPool(allocator=owner)
    c10::cuda::MempoolId_t id{0, 73};
    a->createOrIncrefPool(0, id, owner);
    EXPECT(a->getPoolUseCount(0, id) == 1, "use_count %d", a->getPoolUseCount(0, id));
    EXPECT(owner.use_count() == 2, "xseg holds the MemPool's allocator: use_count %ld", owner.use_count());

    // with torch.cuda.use_mem_pool(pool): tensors of three sizes (small and large pools)
    a->beginAllocateToPool(0, id, [](cudaStream_t) { return true; });
    const size_t sizes[] = {4096, 3 * MiB, 25 * MiB};
    void *t[3];
    for (int i = 0; i < 3; i++) {
        t[i] = alloc_on(a, sizes[i], 0, nullptr);
        EXPECT(in_owner(t[i], sizes[i]), "tensor %d at %p is not in the owner's memory", i, t[i]);
        EXPECT(pool_of(t[i]) == id, "tensor %d is not in the MemPool's segments", i);
        EXPECT(dev_set(t[i], (unsigned char)(0x30 + i), sizes[i]), "cuMemsetD8 of tensor %d", i);
    }
    a->endAllocateToPool(0, id);
    a->releasePool(0, id);
    for (int i = 0; i < 3; i++)
        EXPECT(dev_byte(t[i]) == 0x30 + i && dev_byte((char *)t[i] + sizes[i] - 1) == 0x30 + i,
               "tensor %d's bytes", i);
    EXPECT(L.allocs >= 2 && L.bad == 0, "owner allocs %d, bad %d", L.allocs, L.bad);
    int64_t owned = 0;
    for (auto &kv : L.live)
        owned += (int64_t)kv.second;
    EXPECT(stat(0, "reserved_bytes.all.current") == reserved0 + owned, "reserved %lld, expected %lld",
           (long long)stat(0, "reserved_bytes.all.current"), (long long)(reserved0 + owned));
    EXPECT(stat(0, "segment.all.current") == segs0 + (int64_t)L.live.size(), "segments %lld",
           (long long)stat(0, "segment.all.current"));
    EXPECT(a->getPoolUseCount(0, id) == 1, "use_count after use_mem_pool %d", a->getPoolUseCount(0, id));

    // del tensors; torch.cuda.empty_cache(): the MemPool lives, its segments stay.
    for (int i = 0; i < 3; i++)
        a->raw_delete(t[i]);
    a->emptyCache();
    EXPECT(L.frees == 0, "empty_cache gave %d of a live MemPool's segments back", L.frees);

    // del pool (~MemPool): releasePool, emptyCache(id): every segment through the owner's free.
    a->releasePool(0, id);
    a->emptyCache(id);
    EXPECT(L.live.empty() && L.frees == L.allocs && L.bad == 0, "owner: %zu live, %d allocs, %d frees, %d bad",
           L.live.size(), L.allocs, L.frees, L.bad);
    EXPECT(a->getPoolUseCount(0, id) == 0, "use_count at the end %d", a->getPoolUseCount(0, id));
    EXPECT(owner.use_count() == 1, "xseg still holds the allocator: use_count %ld", owner.use_count());

    // xseg's own.
    EXPECT(dev_byte(mine) == 0x11 && dev_byte((char *)mine + 2 * MiB - 1) == 0x11, "xseg's block's bytes");
    EXPECT(stat(0, "reserved_bytes.all.current") == reserved0, "reserved %lld, was %lld",
           (long long)stat(0, "reserved_bytes.all.current"), (long long)reserved0);
    a->raw_delete(mine);
    a->emptyCache();
    EXPECT(stat(0, "reserved_bytes.all.current") == 0, "reserved at the end %lld",
           (long long)stat(0, "reserved_bytes.all.current"));
    if (failures)
        return 1;
    std::printf("ok   MemPool(allocator=CUDAPluggableAllocator): owner's segments, cached, given back\n");
    return 0;
}
