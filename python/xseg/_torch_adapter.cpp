// xseg as PyTorch's CUDA allocator with every hook wired (built by xseg.torch.enable() through
// torch.utils.cpp_extension, once per PyTorch version, and cached).
//
// A bare CUDAPluggableAllocator calls only malloc and free, and hands a NULL from malloc on as a
// tensor's data pointer. This adapter raises instead (c10::OutOfMemoryError with xseg's message
// when out of memory, so torch.cuda.OutOfMemoryError reaches Python), sets every set_* hook
// (record_stream, empty_cache, memory fraction, init, base allocation, and the allocate-to-pool
// hooks that torch.cuda.graph and MemPool need) and answers from xseg what the pluggable wrapper
// refuses: getDeviceStats, resetPeakStats, resetAccumulatedStats, cacheInfo, snapshot,
// recordHistory, attachOutOfMemoryObserver, and where the installed PyTorch has them,
// createOrIncrefPool and getPoolUseCount. So torch.cuda.memory_stats(), memory_summary(),
// reset_accumulated_memory_stats(), cuDNN's benchmark mode and MemPool work unchanged.
//
// Left refusing, as the pluggable wrapper does:
//  - shareIpcHandle / getIpcDevPtr: PyTorch sends the handle as a byte string, and xseg's usual
//    handle (one POSIX file descriptor per page) cannot travel as bytes; share blocks with
//    xseg.ipc_export / IpcHandle.send instead. (getBaseAllocation is answered: a classic block's
//    cuMemAlloc range, which cudaIpcGetMemHandle can share with a process on PyTorch's allocator.)
//  - attachAllocatorTraceTracker: its TraceEntry's constructor differs between releases; xseg's
//    segment observers (xseg_attach_segment_observer) report the same maps and unmaps.
//  - getCheckpointState / setCheckpointPoolState (cudagraph trees' checkpointing).
//
// The C++ interface this builds against changed across PyTorch 2.x (docs/python.md has the table
// and its sources):
//  - device arguments are int through 2.2 and c10::DeviceIndex from 2.3 (pytorch#119545);
//  - the allocate-to-pool hooks were set_begin_allocate_stream_to_pool(int, cudaStream_t,
//    MempoolId_t) / set_end_allocate_stream_to_pool_fn(int, cudaStream_t) in 2.1, and are
//    set_begin_allocate_to_pool(int, MempoolId_t, filter) / set_end_allocate_to_pool_fn(int,
//    MempoolId_t) later (pytorch#116199, which landed after 2.2's branch cut);
//  - snapshot() gained a MempoolId_t (2.8) and then an include_traces flag; recordHistory gained
//    clearHistory (2.8) and then skip_actions;
//  - DeviceStats gained num_sync_all_streams, num_device_alloc and num_device_free (2.3);
//  - createOrIncrefPool and getPoolUseCount exist only in releases with torch.cuda.MemPool.
// Device types are chosen by version (TORCH_VERSION_MAJOR/MINOR) and checked with `override`.
// Where the release that changed an interface is not established, the adapter asks the compiler
// instead: the pool-hook setters and the optional DeviceStats fields are detected, the snapshot
// and recordHistory variants are declared side by side (the one matching the installed header
// overrides; tests/torch_headers checks that one does for each interface), and the MemPool
// overrides exist only when PyTorch declares them.
//
// xseg's C functions resolve against libxseg, which the Python package has already loaded with
// RTLD_GLOBAL before importing this extension.
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/extension.h>
#include <torch/version.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "xseg.h"

#if TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 1)
#error "xseg's PyTorch adapter needs PyTorch 2.1 or newer (the allocate-to-pool hooks)"
#endif

// The device argument of the allocator's virtual functions.
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 3
#define XSEG_TORCH_DEV int
#else
#define XSEG_TORCH_DEV c10::DeviceIndex
#endif

namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
using PluggableBase = torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;
using MempoolId = c10::cuda::MempoolId_t;

// Raise xseg's failure as a Python RuntimeError (through c10::Error).
void xseg_check(xseg_status st, const char *what)
{
    TORCH_CHECK(st == XSEG_SUCCESS, "xseg: ", what, ": ", xseg_last_error());
}

// A failed allocation. PyTorch's CUDAPluggableAllocator hands a NULL from its alloc function on
// as the tensor's data pointer (malloc, allocate and raw_alloc check nothing, 2.1 through main),
// so the adapter raises here, as PyTorch's own allocator does: out of memory as
// c10::OutOfMemoryError (torch.cuda.OutOfMemoryError in Python; cuDNN's workspace search catches
// it and retries smaller) with xseg's message, which names the OOM snapshot when one was written;
// any other failure as c10::Error (RuntimeError).
__attribute__((noinline, cold)) void alloc_failed(xseg_status st, size_t size, int device)
{
    TORCH_CHECK_WITH(OutOfMemoryError, st != XSEG_ERROR_OUT_OF_MEMORY, xseg_last_error());
    TORCH_CHECK(false, "xseg: allocating ", size, " bytes on device ", device, ": ", xseg_last_error());
}

void *adapter_malloc(size_t size, int device, cudaStream_t stream)
{
    void *p = nullptr;
    xseg_status st = xseg_malloc(&p, size, device, reinterpret_cast<struct CUstream_st *>(stream));
    if (__builtin_expect(st != XSEG_SUCCESS, 0))
        alloc_failed(st, size, device);
    return p;
}

xseg_pool_id to_xseg(MempoolId id) { return xseg_pool_id{id.first, id.second}; }

// ---- allocate-to-pool hooks ----------------------------------------------------------------

// Filter form: begin hands over a std::function filter; xseg takes a C callback. Each filter
// lives, keyed by (device, pool), until the end hook.
std::mutex filters_mu;
std::map<std::pair<int, std::pair<uint64_t, uint64_t>>, std::unique_ptr<std::function<bool(cudaStream_t)>>>
    filters;

int filter_trampoline(struct CUstream_st *stream, void *user)
{
    try {
        return (*static_cast<std::function<bool(cudaStream_t)> *>(user))(reinterpret_cast<cudaStream_t>(stream)) ? 1
                                                                                                                 : 0;
    } catch (...) {
        // No exception may cross xseg's C frames; an unmatched capturing stream is refused.
        return 0;
    }
}

[[maybe_unused]] void begin_to_pool(int device, MempoolId id, std::function<bool(cudaStream_t)> filter)
{
    auto fn = std::make_unique<std::function<bool(cudaStream_t)>>(std::move(filter));
    std::lock_guard<std::mutex> g(filters_mu);
    xseg_check(xseg_begin_allocate_to_pool(device, to_xseg(id), filter_trampoline, fn.get()), "begin_allocate_to_pool");
    filters[{device, {id.first, id.second}}] = std::move(fn);
}

[[maybe_unused]] void end_to_pool(int device, MempoolId id)
{
    xseg_status st = xseg_end_allocate_to_pool(device, to_xseg(id));
    {
        std::lock_guard<std::mutex> g(filters_mu);
        filters.erase({device, {id.first, id.second}});
    }
    xseg_check(st, "end_allocate_to_pool");
}

// Stream form (2.1): one stream goes to the pool; the end hook names the stream only.
std::map<std::pair<int, cudaStream_t>, MempoolId> stream_pools; // under filters_mu

int stream_trampoline(struct CUstream_st *stream, void *user)
{
    return reinterpret_cast<cudaStream_t>(stream) == static_cast<cudaStream_t>(user) ? 1 : 0;
}

[[maybe_unused]] void begin_stream_to_pool(int device, cudaStream_t stream, MempoolId id)
{
    std::lock_guard<std::mutex> g(filters_mu);
    xseg_check(xseg_begin_allocate_to_pool(device, to_xseg(id), stream_trampoline, static_cast<void *>(stream)),
               "begin_allocate_stream_to_pool");
    stream_pools[{device, stream}] = id;
}

[[maybe_unused]] void end_stream_to_pool(int device, cudaStream_t stream)
{
    MempoolId id;
    {
        std::lock_guard<std::mutex> g(filters_mu);
        auto it = stream_pools.find({device, stream});
        TORCH_CHECK(it != stream_pools.end(), "xseg: end_allocate_stream_to_pool: stream ",
                    static_cast<void *>(stream), " on device ", device, " is not allocating to a pool");
        id = it->second;
        stream_pools.erase(it);
    }
    xseg_check(xseg_end_allocate_to_pool(device, to_xseg(id)), "end_allocate_stream_to_pool");
}

void release_pool(int device, MempoolId id) { xseg_check(xseg_release_pool(device, to_xseg(id)), "release_pool"); }

// The hooks this PyTorch declares: the filter form where set_begin_allocate_to_pool exists,
// else the 2.1 stream form.
template <class A>
auto wire_pool_hooks(A &a, int) -> decltype(a.set_begin_allocate_to_pool(begin_to_pool), void())
{
    a.set_begin_allocate_to_pool(begin_to_pool);
    a.set_end_allocate_to_pool_fn(end_to_pool);
}

template <class A>
auto wire_pool_hooks(A &a, long) -> decltype(a.set_begin_allocate_stream_to_pool(begin_stream_to_pool), void())
{
    a.set_begin_allocate_stream_to_pool(begin_stream_to_pool);
    a.set_end_allocate_stream_to_pool_fn(end_stream_to_pool);
}

// ---- statistics ----------------------------------------------------------------------------

template <class StatT>
void fill(StatT &out, const xseg_stat_counter &in)
{
    out.current = in.current;
    out.peak = in.peak;
    out.allocated = in.allocated;
    out.freed = in.freed;
}

// DeviceStats fields that only some releases have: set where the struct declares them.
#define XSEG_OPTIONAL_FIELD(name)                                                                 \
    template <class S>                                                                            \
    auto set_##name(S &s, int64_t v, int)->decltype(s.name = v, void())                           \
    {                                                                                             \
        s.name = v;                                                                               \
    }                                                                                             \
    template <class S>                                                                            \
    void set_##name(S &, int64_t, long)                                                           \
    {                                                                                             \
    }
XSEG_OPTIONAL_FIELD(num_sync_all_streams)
XSEG_OPTIONAL_FIELD(num_device_alloc)
XSEG_OPTIONAL_FIELD(num_device_free)
#undef XSEG_OPTIONAL_FIELD

cca::DeviceStats device_stats(int device)
{
    xseg_device_stats s;
    xseg_check(xseg_get_stats(device, &s), "memory_stats");
    cca::DeviceStats out;
    for (int i = 0; i < XSEG_STAT_POOLS; i++) {
        fill(out.allocation[i], s.allocation[i]);
        fill(out.segment[i], s.segment[i]);
        fill(out.active[i], s.active[i]);
        fill(out.inactive_split[i], s.inactive_split[i]);
        fill(out.allocated_bytes[i], s.allocated_bytes[i]);
        fill(out.reserved_bytes[i], s.reserved_bytes[i]);
        fill(out.active_bytes[i], s.active_bytes[i]);
        fill(out.inactive_split_bytes[i], s.inactive_split_bytes[i]);
        fill(out.requested_bytes[i], s.requested_bytes[i]);
    }
    fill(out.oversize_allocations, s.oversize_allocations);
    fill(out.oversize_segments, s.oversize_segments);
    out.num_alloc_retries = s.num_alloc_retries;
    out.num_ooms = s.num_ooms;
    out.max_split_size = s.max_split_size;
    set_num_sync_all_streams(out, s.num_sync_all_streams, 0);
    set_num_device_alloc(out, s.num_device_alloc, 0);
    set_num_device_free(out, s.num_device_free, 0);
    return out;
}

// ---- snapshots and history -----------------------------------------------------------------

// Segments of @p pool ({0, 0}: all), in PyTorch's structs.
cca::SnapshotInfo take_snapshot(MempoolId pool)
{
    xseg_snapshot *snap = nullptr;
    xseg_check(xseg_take_snapshot(-1, &snap), "snapshot");
    cca::SnapshotInfo out;
    bool all = pool.first == 0 && pool.second == 0;
    for (size_t i = 0; i < snap->nsegments; i++) {
        const xseg_segment_info &s = snap->segments[i];
        if (!all && (s.pool_id[0] != pool.first || s.pool_id[1] != pool.second))
            continue;
        decltype(out.segments)::value_type seg;
        seg.device = s.device;
        seg.address = (int64_t)s.address;
        seg.total_size = (int64_t)s.total_size;
        seg.requested_size = (int64_t)s.requested_size;
        seg.allocated_size = (int64_t)s.allocated_size;
        seg.active_size = (int64_t)s.active_size;
        seg.stream = reinterpret_cast<cudaStream_t>(s.stream);
        seg.is_large = s.is_large != 0;
        seg.is_expandable = s.is_expandable != 0;
        seg.owner_private_pool_id = {s.pool_id[0], s.pool_id[1]};
        // PyTorch derives each block's address from the segment's and the sizes before it;
        // xseg's blocks tile each reported range, so the addresses agree.
        for (size_t j = 0; j < s.nblocks; j++) {
            const xseg_block_info &b = s.blocks[j];
            decltype(seg.blocks)::value_type bi;
            bi.size = (int64_t)b.size;
            bi.requested_size = (int64_t)b.requested_size;
            bi.allocated = b.state == XSEG_BLOCK_ACTIVE_ALLOCATED;
            bi.active = b.state != XSEG_BLOCK_INACTIVE;
            seg.blocks.push_back(std::move(bi));
        }
        out.segments.push_back(std::move(seg));
    }
    xseg_snapshot_free(snap);
    int n = 0;
    if (xseg_device_count(&n) == XSEG_SUCCESS && n > 0)
        out.device_traces.resize((size_t)n);
    return out;
}

// recordHistory from C++ callers (torch.cuda.memory._record_memory_history is answered by the
// Python package with Python frames, see xseg/torch.py). PyTorch's context recorder returns
// frames xseg cannot read, so frames here are xseg's own C frames.
void record_history(bool enabled, size_t max_entries, int when, bool clear)
{
    xseg_history_options o{};
    o.enabled = enabled ? 1 : 0;
    o.record = XSEG_HISTORY_ALL;
    o.stacks = when == 0 ? XSEG_STACKS_NONE : XSEG_STACKS_C; // RecordContext::NEVER is 0
    o.max_entries = max_entries >= ((size_t)1 << 32) ? 0 : max_entries;
    o.clear = clear ? 1 : 0;
    xseg_check(xseg_record_memory_history(&o), "record_memory_history");
}

struct OomObserver {
    cca::OutOfMemoryObserver fn;
};

void oom_trampoline(int device, size_t requested, size_t total, size_t free_bytes, void *user)
{
    try {
        static_cast<OomObserver *>(user)->fn(device, requested, total, free_bytes);
    } catch (...) {
        // An exception must not cross xseg's C frames; PyTorch raises its own OOM error next.
    }
}

// ---- MemPool: overrides that exist only where the installed PyTorch declares them ----------

template <class B, class = void>
struct WithPoolUseCount : B {
    using B::B;
};
template <class B>
struct WithPoolUseCount<B, std::void_t<decltype(&B::getPoolUseCount)>> : B {
    using B::B;
    int getPoolUseCount(XSEG_TORCH_DEV device, MempoolId id) override
    {
        int n = 0;
        xseg_check(xseg_pool_use_count(device, to_xseg(id), &n), "pool_use_count");
        return n;
    }
};

template <class B, class = void>
struct WithCreateOrIncrefPool : B {
    using B::B;
};
template <class B>
struct WithCreateOrIncrefPool<B, std::void_t<decltype(&B::createOrIncrefPool)>> : B {
    using B::B;
    void createOrIncrefPool(XSEG_TORCH_DEV device, MempoolId id,
                            std::shared_ptr<cca::CUDAAllocator> allocator) override
    {
        TORCH_CHECK(!allocator, "xseg: a MemPool with an allocator of its own is not supported while xseg is "
                                "PyTorch's allocator (its memory would come from that allocator, not xseg)");
        xseg_check(xseg_pool_retain(device, to_xseg(id)), "create_or_incref_pool");
    }
};

using AdapterBase = WithCreateOrIncrefPool<WithPoolUseCount<PluggableBase>>;

// ---- the allocator -------------------------------------------------------------------------

class XsegAllocator : public AdapterBase {
  public:
    XsegAllocator()
        : AdapterBase(
              adapter_malloc,
              [](void *ptr, size_t size, int device, cudaStream_t stream) {
                  xseg_torch_free(ptr, size, device, reinterpret_cast<struct CUstream_st *>(stream));
              })
    {
        set_init_fn([](int n) { xseg_torch_init(n); });
        set_reset_fn([]() { xseg_check(xseg_empty_cache(-1), "empty_cache"); });
        set_memory_fraction_fn([](double f, int dev) { xseg_check(xseg_set_memory_fraction(f, dev), "set_memory_fraction"); });
        set_record_stream_fn([](void *ptr, cudaStream_t s) {
            xseg_check(xseg_record_stream(ptr, reinterpret_cast<struct CUstream_st *>(s)), "record_stream");
        });
        set_base_alloc_fn([](void *ptr, size_t *size) {
            void *base = nullptr;
            xseg_check(xseg_base_allocation(ptr, &base, size), "getBaseAllocation");
            return base;
        });
        wire_pool_hooks(*this, 0);
        set_release_pool(release_pool);
    }

    cca::DeviceStats getDeviceStats(XSEG_TORCH_DEV device) override { return device_stats(device); }
    void resetPeakStats(XSEG_TORCH_DEV device) override
    {
        xseg_check(xseg_reset_peak_stats(device), "reset_peak_stats");
    }
    void resetAccumulatedStats(XSEG_TORCH_DEV device) override
    {
        xseg_check(xseg_reset_accumulated_stats(device), "reset_accumulated_stats");
    }
    void cacheInfo(XSEG_TORCH_DEV device, size_t *largestBlock) override
    {
        xseg_check(xseg_cache_info(device, largestBlock), "cacheInfo");
    }

    // snapshot: no arguments (2.1-2.7), a pool id (2.8), a pool id and include_traces (later).
    cca::SnapshotInfo snapshot() { return take_snapshot({0, 0}); }
    cca::SnapshotInfo snapshot(MempoolId pool) { return take_snapshot(pool); }
    cca::SnapshotInfo snapshot(MempoolId pool, bool) { return take_snapshot(pool); }

    // recordHistory: RecordContext (2.1-2.7), + clearHistory (2.8), + skip_actions (later).
    void recordHistory(bool enabled, cca::CreateContextFn, size_t max_entries, cca::RecordContext when)
    {
        record_history(enabled, max_entries, (int)when, false);
    }
    void recordHistory(bool enabled, cca::CreateContextFn, size_t max_entries, cca::RecordContext when, bool clear)
    {
        record_history(enabled, max_entries, (int)when, clear);
    }
    void recordHistory(bool enabled, cca::CreateContextFn, size_t max_entries, cca::RecordContext when, bool clear,
                       const std::vector<std::string> &)
    {
        record_history(enabled, max_entries, (int)when, clear);
    }

    void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override
    {
        auto *o = new OomObserver{std::move(observer)}; // lives as long as the process
        xseg_check(xseg_attach_oom_observer(oom_trampoline, o), "attach_oom_observer");
    }

    std::string name() override { return "xseg"; }
};

std::shared_ptr<XsegAllocator> installed;

// Create the allocator, make it PyTorch's current CUDA allocator, and tell libxseg every hook is
// wired (which silences its bare-CUDAPluggableAllocator warning).
void install()
{
    if (installed)
        return;
    auto a = std::make_shared<XsegAllocator>();
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(a);
    xseg_torch_adapter_attached(1);
    installed = std::move(a);
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.def("install", &install, "Install xseg as PyTorch's CUDA allocator with every hook wired.");
}
