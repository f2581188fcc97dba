// Every virtual the adapter overrides, called with the argument shapes PyTorch passes (the `main`
// stub interface, through the stand-in fake_torch.cpp), on cudaemu with two devices; each check
// reads the effect on xseg (statistics, pools, snapshots, observers, errors). Not a PyTorch test:
// tests/torch_headers/README.md says what it shows.
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <unordered_set>
#include <vector>

#include <cuda.h>

#include "devmem.h"
#include "driver.h"

extern int fake_memcpy_plain, fake_memcpy_peer;
extern std::vector<std::pair<int, int>> fake_peer_calls;

namespace {
namespace cca = c10::cuda::CUDACachingAllocator;

int64_t stat(int dev, const char *key)
{
    int64_t v = -1;
    return xseg_stat(dev, key, &v) == XSEG_SUCCESS ? v : -1;
}

// f must raise c10::Error whose message holds every part.
template <class F>
void expect_error(const char *what, F f, std::vector<std::string> parts)
{
    try {
        f();
        EXPECT(false, "%s did not raise", what);
    } catch (const c10::Error &e) {
        std::string msg = e.what();
        for (auto &p : parts)
            EXPECT(contains(msg, p), "%s: message lacks '%s': %s", what, p.c_str(), msg.c_str());
        std::printf("ok   %s raises: %s\n", what, msg.c_str());
    }
}

// Which pool holds the segment under @p p (from xseg's snapshot).
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

// The state of the block at @p p in xseg's snapshot, or -1 when no block starts there.
int block_state(void *p)
{
    xseg_snapshot *snap = nullptr;
    int st = -1;
    if (xseg_take_snapshot(-1, &snap) != XSEG_SUCCESS)
        return st;
    for (size_t i = 0; i < snap->nsegments; i++)
        for (size_t j = 0; j < snap->segments[i].nblocks; j++)
            if (snap->segments[i].blocks[j].address == (uint64_t)p)
                st = (int)snap->segments[i].blocks[j].state;
    xseg_snapshot_free(snap);
    return st;
}

// A driver call or emulator control from the libcuda xseg loaded (XSEG_LIBCUDA), or nullptr.
template <class F>
F drv_sym(const char *name)
{
    const char *path = std::getenv("XSEG_LIBCUDA");
    void *lib = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOLOAD | RTLD_NOW);
    return reinterpret_cast<F>(lib ? dlsym(lib, name) : nullptr);
}

std::vector<cca::TraceEntry> traces;
} // namespace

int main()
{
    Pluggable *a = install_adapter();
    if (!a)
        return 1;
    // torch.accelerator.* reach the allocator through the device-generic registry.
    EXPECT(c10::GetAllocator(c10::DeviceType::CUDA) == static_cast<c10::Allocator *>(a),
           "c10::GetAllocator(CUDA) is not the adapter");
    a->init(2);
    EXPECT(a->initialized(), "init");
    cudaStream_t s0 = nullptr;

    // ---- recordStream: empty tensor and foreign memory silently; a bad stream raises ----
    void *p = alloc_on(a, MiB, 0, s0);
    c10::cuda::CUDAStream legacy{};
    a->recordStream(c10::DataPtr(nullptr, nullptr, nullptr, c10::Device(c10::DeviceType::CUDA, 0)), legacy);
    static char foreign[64];
    a->recordStream(c10::DataPtr(foreign, foreign, nullptr, c10::Device(c10::DeviceType::CUDA, 0)), legacy);
    a->recordStream(c10::DataPtr(p, p, nullptr, c10::Device(c10::DeviceType::CUDA, 0)), legacy);
    std::printf("ok   recordStream of an empty tensor, foreign memory and a live block\n");
    c10::cuda::CUDAStream bogus{reinterpret_cast<cudaStream_t>(0x10)};
    expect_error("recordStream(live block, bad stream)",
                 [&] { a->recordStream(c10::DataPtr(p, p, nullptr, c10::Device(c10::DeviceType::CUDA, 0)), bogus); },
                 {"xseg: record_stream"});

    // ---- statistics, resets, cacheInfo, fraction, emptyCache ----
    EXPECT(a->getDeviceStats(0).allocated_bytes[0].current == (int64_t)MiB, "allocated %lld",
           (long long)a->getDeviceStats(0).allocated_bytes[0].current);
    a->raw_delete(p);
    size_t largest = 0;
    a->cacheInfo(0, &largest);
    EXPECT(largest >= MiB, "cacheInfo: largest cached block %zu", largest);
    a->resetPeakStats(0);
    EXPECT(stat(0, "allocated_bytes.all.peak") == 0, "peak after resetPeakStats: %lld",
           (long long)stat(0, "allocated_bytes.all.peak"));
    a->resetAccumulatedStats(0);
    EXPECT(stat(0, "allocation.all.allocated") == 0, "allocated count after resetAccumulatedStats");
    EXPECT(a->getMemoryFraction(0) == 1.0, "default fraction %g", a->getMemoryFraction(0));
    a->setMemoryFraction(0.5, 1);
    EXPECT(a->getMemoryFraction(1) == 0.5 && a->getMemoryFraction(0) == 1.0, "fraction %g / %g",
           a->getMemoryFraction(1), a->getMemoryFraction(0));
    a->setMemoryFraction(1.0, 1);
    a->emptyCache();
    EXPECT(stat(0, "reserved_bytes.all.current") == 0, "reserved after emptyCache: %lld",
           (long long)stat(0, "reserved_bytes.all.current"));
    std::printf("ok   getDeviceStats, cacheInfo, resets, get/setMemoryFraction, emptyCache\n");

    // ---- history ----
    EXPECT(!a->isHistoryEnabled(), "history on before recordHistory");
    a->recordHistory(true, nullptr, 1000, cca::RecordContext::ALL, false, {});
    EXPECT(a->isHistoryEnabled(), "isHistoryEnabled after recordHistory(true)");
    a->recordHistory(false, nullptr, 0, cca::RecordContext::NEVER, true, {});
    EXPECT(!a->isHistoryEnabled(), "isHistoryEnabled after recordHistory(false)");
    std::printf("ok   recordHistory / isHistoryEnabled\n");

    // ---- trace tracker: changes only, as PyTorch's SEGMENT_* entries ----
    void *before = alloc_on(a, 30 * MiB, 0, s0); // mapped before the attach: not reported
    a->attachAllocatorTraceTracker([](const cca::TraceEntry &te) { traces.push_back(te); });
    EXPECT(traces.empty(), "%zu entries at attach (the existing mapping was replayed)", traces.size());
    void *big = alloc_on(a, 64 * MiB, 0, s0);
    a->raw_delete(big);
    a->raw_delete(before);
    a->emptyCache();
    size_t mapped = 0;
    bool unmap = false;
    for (auto &te : traces) {
        if (te.action_ == cca::TraceEntry::SEGMENT_MAP && te.device_ == 0)
            mapped += te.size_;
        if (te.action_ == cca::TraceEntry::SEGMENT_UNMAP && te.device_ == 0)
            unmap = true;
        EXPECT(te.action_ == cca::TraceEntry::SEGMENT_MAP || te.action_ == cca::TraceEntry::SEGMENT_UNMAP,
               "action %d on expandable memory", (int)te.action_);
    }
    EXPECT(mapped >= 64 * MiB - 30 * MiB && unmap, "trace: %zu bytes mapped, unmap %d (%zu entries)", mapped, unmap,
           traces.size());
    xseg_set_config("expandable_segments:False");
    traces.clear();
    void *classic = alloc_on(a, 4 * MiB, 0, s0);
    EXPECT(!traces.empty() && traces.back().action_ == cca::TraceEntry::SEGMENT_ALLOC &&
               traces.back().addr_ <= (size_t)classic,
           "classic segment: %zu entries", traces.size());
    void *base_ptr = nullptr;
    size_t base_size = 0;
    base_ptr = a->getBaseAllocation(classic, &base_size);
    EXPECT(base_ptr == classic && base_size >= 4 * MiB, "getBaseAllocation %p size %zu", base_ptr, base_size);
    a->raw_delete(classic);
    a->emptyCache();
    EXPECT(traces.back().action_ == cca::TraceEntry::SEGMENT_FREE, "classic release: action %d",
           (int)traces.back().action_);
    xseg_set_config("expandable_segments:True");
    std::printf("ok   attachAllocatorTraceTracker: SEGMENT_MAP/UNMAP, SEGMENT_ALLOC/FREE, no replay\n");
    void *exp = alloc_on(a, MiB, 0, s0);
    expect_error("getBaseAllocation(expandable block)", [&] { a->getBaseAllocation(exp, &base_size); },
                 {"xseg: getBaseAllocation"});
    a->raw_delete(exp);

    // ---- peer access and copies ----
    a->enablePeerAccess(1, 0); // device 1 reads device 0's memory
    EXPECT(fake_peer_calls.size() == 1 && fake_peer_calls[0] == std::make_pair(1, 0), "base enablePeerAccess not called");
    void *on0 = alloc_on(a, 2 * MiB, 0, s0);
    auto get_access = reinterpret_cast<CUresult (*)(unsigned long long *, const CUmemLocation *, CUdeviceptr)>(
        dlsym(dlopen(std::getenv("XSEG_LIBCUDA"), RTLD_NOLOAD | RTLD_NOW), "cuMemGetAccess"));
    if (get_access) {
        CUmemLocation loc{};
        loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
        loc.id = 1;
        unsigned long long flags = 0;
        EXPECT(get_access(&flags, &loc, (CUdeviceptr)on0) == CUDA_SUCCESS && flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
               "device 1 has no access to device 0's block (flags %llu)", flags);
    }
    expect_error("enablePeerAccess(0, 7)", [&] { a->enablePeerAccess(0, 7); }, {"xseg: enablePeerAccess"});
    void *on1 = alloc_on(a, 2 * MiB, 1, s0);
    a->memcpyAsync(on1, 1, on0, 0, MiB, s0, false);
    EXPECT(fake_memcpy_peer == 1 && fake_memcpy_plain == 0, "p2p off: peer %d plain %d", fake_memcpy_peer, fake_memcpy_plain);
    a->memcpyAsync(on1, 1, on0, 0, MiB, s0, true);
    a->memcpyAsync(on0, 0, on0, 0, MiB, s0, false);
    EXPECT(fake_memcpy_peer == 1 && fake_memcpy_plain == 2, "p2p on / same device: peer %d plain %d", fake_memcpy_peer,
           fake_memcpy_plain);
    a->raw_delete(on1);
    std::printf("ok   enablePeerAccess (xseg's mappings), memcpyAsync honours p2p_enabled\n");

    // ---- CUDA IPC of tensors: a process may import its own export ----
    auto sh = a->shareIpcHandle(on0);
    EXPECT(sh.offset == 0 && contains(sh.handle, "xseg-ipc-"), "handle '%s' offset %lld", sh.handle.c_str(),
           (long long)sh.offset);
    EXPECT(dev_set(on0, 0x5a, 4096), "cuMemsetD8 of the block");
    {
        std::shared_ptr<void> imp = a->getIpcDevPtr(sh.handle);
        EXPECT(imp && imp.get() != on0 && dev_byte(static_cast<unsigned char *>(imp.get()) + 4095) == 0x5a,
               "import %p of %p does not see the bytes", imp.get(), on0);
        EXPECT(a->shareIpcHandle(on0).handle == sh.handle, "sharing twice gave another handle");
    }
    a->raw_delete(on0); // the export closes with the block
    expect_error("getIpcDevPtr(handle of a freed block)", [&] { a->getIpcDevPtr(sh.handle); }, {"xseg: getIpcDevPtr"});
    expect_error("getIpcDevPtr(foreign handle)", [&] { a->getIpcDevPtr(std::string(64, '\1')); },
                 {"not a handle of xseg's"});
    std::printf("ok   shareIpcHandle / getIpcDevPtr\n");

    // ---- private pools: capture hooks, MemPool hooks, snapshot by pool, checkpoints ----
    c10::cuda::MempoolId_t pool{7, 0};
    a->createOrIncrefPool(0, pool, nullptr);
    EXPECT(a->getPoolUseCount(0, pool) == 1, "use count %d", a->getPoolUseCount(0, pool));
    // MemPool(allocator=...): mempool_driver.cpp.
    expect_error("setUseOnOOM", [&] { a->setUseOnOOM(0, pool, true); }, {"use_on_oom", "Create the MemPool"});
    expect_error("setNoSplit", [&] { a->setNoSplit(0, pool); }, {"no_split", "max_split_size_mb"});
    a->beginAllocateToPool(0, pool, [](cudaStream_t) { return true; });
    void *x = alloc_on(a, MiB, 0, s0);
    void *y = alloc_on(a, 3 * MiB, 0, s0);
    a->endAllocateToPool(0, pool);
    void *outside = alloc_on(a, MiB, 0, s0);
    EXPECT(pool_of(x) == pool && pool_of(y) == pool && pool_of(outside) != pool, "pool routing");
    auto snap = a->snapshot(pool, true);
    bool only_pool = !snap.segments.empty();
    for (auto &seg : snap.segments)
        only_pool = only_pool && seg.owner_private_pool_id == pool;
    EXPECT(only_pool, "snapshot(pool): %zu segments, not all of the pool", snap.segments.size());
    EXPECT(a->snapshot({0, 0}, true).segments.size() > snap.segments.size(), "snapshot({0,0}) is not every segment");

    // checkPoolLiveAllocations, as cudagraph trees call it after each warm-up, recording and
    // checkpoint restore: true iff the pool's allocated blocks (every stream, both sizes) are the
    // expected set. PyTorch's base class throws "does not yet support" where it is not overridden.
    using LiveSet = std::unordered_set<void *>;
    EXPECT(a->checkPoolLiveAllocations(0, pool, LiveSet{x, y}), "live {x, y}: false");
    EXPECT(!a->checkPoolLiveAllocations(0, pool, LiveSet{x}), "live {x}: true without y");
    EXPECT(!a->checkPoolLiveAllocations(0, pool, LiveSet{}), "live {}: true");
    EXPECT(!a->checkPoolLiveAllocations(0, pool, LiveSet{x, y, outside}), "live {x, y, outside}: true (outside is "
                                                                         "the default pool's)");
    EXPECT(!a->checkPoolLiveAllocations(0, pool, LiveSet{x, outside}), "live {x, outside}: true");
    {
        // A block of the pool on another stream counts; freed, it no longer does; a block of
        // another private pool never does.
        auto stream_create = drv_sym<CUresult (*)(CUstream *, unsigned)>(XSEG_STUB_ABI(cuStreamCreate));
        auto stream_destroy = drv_sym<CUresult (*)(CUstream)>(XSEG_STUB_ABI(cuStreamDestroy));
        auto hold = drv_sym<void (*)(CUstream)>("cudaemu_stream_hold");
        auto release = drv_sym<void (*)(CUstream)>("cudaemu_stream_release");
        CUstream s1 = nullptr;
        EXPECT(dev_ctx() && stream_create && stream_destroy && stream_create(&s1, 0) == CUDA_SUCCESS,
               "cuStreamCreate for the second stream");
        a->beginAllocateToPool(0, pool, [](cudaStream_t) { return true; });
        void *w = alloc_on(a, 512, 0, reinterpret_cast<cudaStream_t>(s1)); // a small block, on s1
        a->endAllocateToPool(0, pool);
        EXPECT(pool_of(w) == pool, "w is not the pool's");
        EXPECT(!a->checkPoolLiveAllocations(0, pool, LiveSet{x, y}), "live {x, y}: true with w live on s1");
        EXPECT(a->checkPoolLiveAllocations(0, pool, LiveSet{x, y, w}), "live {x, y, w}: false");
        a->raw_delete(w);
        EXPECT(a->checkPoolLiveAllocations(0, pool, LiveSet{x, y}), "live {x, y}: false once w was freed");
        EXPECT(!a->checkPoolLiveAllocations(0, pool, LiveSet{x, y, w}), "live {x, y, w}: true with w freed");
        // Freed while s1's work is pending (record_stream): not allocated, as in PyTorch.
        EXPECT(hold && release, "the emulator's stream controls are missing");
        if (hold && release) {
            a->beginAllocateToPool(0, pool, [](cudaStream_t) { return true; });
            void *v = alloc_on(a, MiB, 0, s0);
            a->endAllocateToPool(0, pool);
            hold(s1);
            c10::DataPtr vp(v, v, nullptr, c10::Device(c10::DeviceType::CUDA, 0));
            a->recordStream(vp, c10::cuda::CUDAStream{reinterpret_cast<cudaStream_t>(s1)});
            a->raw_delete(v);
            EXPECT(block_state(v) == XSEG_BLOCK_ACTIVE_PENDING_FREE, "v is not pending its free: state %d",
                   block_state(v));
            EXPECT(a->checkPoolLiveAllocations(0, pool, LiveSet{x, y}), "live {x, y}: false with v pending its free");
            release(s1);
        }
        c10::cuda::MempoolId_t other{9, 0};
        a->createOrIncrefPool(0, other, nullptr);
        a->beginAllocateToPool(0, other, [](cudaStream_t) { return true; });
        void *o = alloc_on(a, MiB, 0, s0);
        a->endAllocateToPool(0, other);
        EXPECT(pool_of(o) == other, "o is not the other pool's");
        EXPECT(a->checkPoolLiveAllocations(0, pool, LiveSet{x, y}), "live {x, y}: false with another pool's block");
        EXPECT(!a->checkPoolLiveAllocations(0, pool, LiveSet{x, y, o}), "live {x, y, o}: true (o is another pool's)");
        EXPECT(a->checkPoolLiveAllocations(0, other, LiveSet{o}), "other pool: live {o}: false");
        expect_error("checkPoolLiveAllocations(a pool of device 0, on device 1)",
                     [&] { a->checkPoolLiveAllocations(1, other, LiveSet{o}); }, {"no pool {9, 0} on device 1"});
        a->raw_delete(o);
        EXPECT(a->checkPoolLiveAllocations(0, other, LiveSet{}), "other pool: live {} after o's free: false");
        a->releasePool(0, other);
        EXPECT(stream_destroy(s1) == CUDA_SUCCESS, "cuStreamDestroy");
    }
    expect_error("checkPoolLiveAllocations(unknown pool)", [&] { a->checkPoolLiveAllocations(0, {4242, 0}, LiveSet{}); },
                 {"xseg: checkPoolLiveAllocations", "no pool {4242, 0} on device 0"});
    std::printf("ok   checkPoolLiveAllocations: the pool's live blocks on every stream, freed and other pools' "
                "blocks not counted\n");

    auto cp = a->getCheckpointState(0, pool);
    a->beginAllocateToPool(0, pool, [](cudaStream_t) { return true; });
    void *z = alloc_on(a, 2 * MiB, 0, s0);
    a->endAllocateToPool(0, pool);
    int64_t alloc_before = stat(0, "allocated_bytes.all.current");
    cca::CheckpointDelta d = a->setCheckpointPoolState(0, cp);
    EXPECT(d.ptrs_freed.size() == 3 && d.dataptrs_allocd.size() == 2, "delta: %zu freed, %zu allocated",
           d.ptrs_freed.size(), d.dataptrs_allocd.size());
    EXPECT(stat(0, "allocated_bytes.all.current") == alloc_before - (int64_t)(2 * MiB), "z was not freed: %lld -> %lld",
           (long long)alloc_before, (long long)stat(0, "allocated_bytes.all.current"));
    EXPECT(xseg_free(z) == XSEG_ERROR_INVALID_VALUE, "z is still live");
    EXPECT(a->checkPoolLiveAllocations(0, pool, std::unordered_set<void *>{x, y}),
           "after the restore the pool's live blocks are not {x, y}");
    for (auto &dp : d.dataptrs_allocd)
        EXPECT((dp.get() == x || dp.get() == y) && dp.get_deleter() == a->raw_deleter(), "allocd %p", dp.get());
    // A checkpointed block freed since is placed at its address again (cudagraph trees then free
    // the dead ones through raw_delete, which must know them).
    void *gone = d.dataptrs_allocd[0].get();
    size_t gone_size = gone == x ? MiB : 3 * MiB;
    d.dataptrs_allocd[0].get_deleter()(gone); // PyTorch frees through the DataPtr
    void *kept = d.dataptrs_allocd[1].get();
    int64_t before_restore = stat(0, "allocated_bytes.all.current");
    cca::CheckpointDelta d2 = a->setCheckpointPoolState(0, cp);
    EXPECT(d2.ptrs_freed.size() == 1 && d2.dataptrs_allocd.size() == 2, "second delta: %zu freed, %zu allocated",
           d2.ptrs_freed.size(), d2.dataptrs_allocd.size());
    EXPECT(stat(0, "allocated_bytes.all.current") == before_restore + (int64_t)gone_size, "placed again: %lld -> %lld",
           (long long)before_restore, (long long)stat(0, "allocated_bytes.all.current"));
    a->raw_delete(gone); // cudagraph trees' raw_delete of a dead output
    // xseg_pool_malloc_at's refusals.
    xseg_pool_id xp{pool.first, pool.second};
    EXPECT(xseg_pool_malloc_at(0, xp, kept, MiB) == XSEG_ERROR_ILLEGAL_STATE, "placing over a live block");
    EXPECT(xseg_pool_malloc_at(0, xp, outside, MiB) == XSEG_ERROR_INVALID_VALUE, "placing outside the pool");
    EXPECT(xseg_pool_malloc_at(0, xseg_pool_id{0, 0}, kept, MiB) == XSEG_ERROR_INVALID_VALUE, "the default pool");
    expect_error("setCheckpointPoolState(other device)", [&] { a->setCheckpointPoolState(1, cp); }, {"device 0"});
    a->raw_delete(kept);
    a->raw_delete(outside);
    a->releasePool(0, pool);
    a->releasePool(0, pool); // a second release (a destructor's) must not throw

    // The same restore with classic segments (expandable_segments:False, PyTorch's default): a
    // checkpointed block freed since is placed again inside its classic segment.
    EXPECT(xseg_set_config("expandable_segments:False") == XSEG_SUCCESS, "%s", xseg_last_error());
    c10::cuda::MempoolId_t cpool{8, 0};
    a->createOrIncrefPool(0, cpool, nullptr);
    a->beginAllocateToPool(0, cpool, [](cudaStream_t) { return true; });
    void *cx = alloc_on(a, 2 * MiB, 0, s0);
    void *cy = alloc_on(a, 3 * MiB, 0, s0);
    a->endAllocateToPool(0, cpool);
    auto ccp = a->getCheckpointState(0, cpool);
    auto csnap = a->snapshot(cpool, true);
    EXPECT(csnap.segments.size() == 1 && !csnap.segments[0].is_expandable, "classic pool: %zu segments",
           csnap.segments.size());
    a->raw_delete(cx); // a dead output: cudagraph trees restore it, then free it through raw_delete
    int64_t split_before = stat(0, "inactive_split.all.current");
    int64_t alloc_classic = stat(0, "allocated_bytes.all.current");
    cca::CheckpointDelta cd = a->setCheckpointPoolState(0, ccp);
    EXPECT(cd.ptrs_freed.size() == 1 && cd.dataptrs_allocd.size() == 2, "classic delta: %zu freed, %zu allocated",
           cd.ptrs_freed.size(), cd.dataptrs_allocd.size());
    EXPECT(stat(0, "allocated_bytes.all.current") == alloc_classic + (int64_t)(2 * MiB),
           "classic: cx not placed again: %lld -> %lld", (long long)alloc_classic,
           (long long)stat(0, "allocated_bytes.all.current"));
    EXPECT(stat(0, "inactive_split.all.current") == split_before - 1, "classic: inactive_split %lld -> %lld",
           (long long)split_before, (long long)stat(0, "inactive_split.all.current"));
    a->raw_delete(cx);
    a->raw_delete(cy);
    a->releasePool(0, cpool);
    EXPECT(xseg_set_config("expandable_segments:True") == XSEG_SUCCESS, "%s", xseg_last_error());
    std::printf("ok   pools: allocate-to-pool, MemPool hooks, snapshot(pool), checkpoint state (both segment kinds)\n");

    // ---- OOM observer ----
    static int oom_calls = 0;
    a->attachOutOfMemoryObserver([](int64_t, size_t, size_t, size_t) { oom_calls++; });
    try {
        alloc_on(a, size_t(1) << 40, 0, s0);
    } catch (const c10::OutOfMemoryError &) {
    }
    EXPECT(oom_calls == 1, "OOM observer called %d times", oom_calls);

    a->emptyCache();
    EXPECT(stat(0, "allocated_bytes.all.current") == 0, "allocated at the end: %lld",
           (long long)stat(0, "allocated_bytes.all.current"));
    if (failures)
        return 1;
    std::printf("ok   every hook of the adapter\n");
    return 0;
}
