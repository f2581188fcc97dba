// xseg as PyTorch's CUDA allocator with every hook wired (built by xseg.torch.enable() through
// torch.utils.cpp_extension, once per PyTorch version, and cached).
//
// A bare CUDAPluggableAllocator calls only malloc and free. This adapter sets every set_* hook
// (record_stream, empty_cache, memory fraction, init, and the allocate-to-pool hooks that
// torch.cuda.graph and MemPool need) and answers what the pluggable wrapper refuses
// (getDeviceStats, resetPeakStats, snapshot, attachOutOfMemoryObserver) from xseg, so
// torch.cuda.memory_stats(), memory_summary() and memory._snapshot() work unchanged.
//
// xseg's C functions resolve against libxseg, which the Python package has already loaded with
// RTLD_GLOBAL before importing this extension.
//
// Signatures of the overridden virtual functions changed across PyTorch 2.x (device as int or
// DeviceIndex, snapshot's and recordHistory's arguments). Each known variant is declared below:
// the one that matches the installed PyTorch overrides, the others are plain overloads.
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/extension.h>
#include <torch/version.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "xseg.h"

#if TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 1)
#error "xseg's PyTorch adapter needs PyTorch 2.1 or newer (expandable segments, pool hooks)"
#endif

namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
using PluggableBase = torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

// Raise xseg's failure as a Python RuntimeError (through c10::Error).
void xseg_check(xseg_status st, const char *what)
{
    TORCH_CHECK(st == XSEG_SUCCESS, "xseg: ", what, ": ", xseg_last_error());
}

// The begin-allocate-to-pool hook hands over a std::function filter; xseg takes a C callback.
// Keep each filter alive, keyed by (device, pool), until the end hook.
std::mutex filters_mu;
std::map<std::pair<int, std::pair<uint64_t, uint64_t>>, std::unique_ptr<std::function<bool(cudaStream_t)>>>
    filters;

int filter_trampoline(struct CUstream_st *stream, void *user)
{
    return (*static_cast<std::function<bool(cudaStream_t)> *>(user))(reinterpret_cast<cudaStream_t>(stream)) ? 1 : 0;
}

void begin_to_pool(int device, c10::cuda::MempoolId_t id, std::function<bool(cudaStream_t)> filter)
{
    auto fn = std::make_unique<std::function<bool(cudaStream_t)>>(std::move(filter));
    xseg_pool_id pid{id.first, id.second};
    std::lock_guard<std::mutex> g(filters_mu);
    xseg_check(xseg_begin_allocate_to_pool(device, pid, filter_trampoline, fn.get()), "begin_allocate_to_pool");
    filters[{device, {id.first, id.second}}] = std::move(fn);
}

void end_to_pool(int device, c10::cuda::MempoolId_t id)
{
    xseg_pool_id pid{id.first, id.second};
    xseg_status st = xseg_end_allocate_to_pool(device, pid);
    {
        std::lock_guard<std::mutex> g(filters_mu);
        filters.erase({device, {id.first, id.second}});
    }
    xseg_check(st, "end_allocate_to_pool");
}

void release_pool(int device, c10::cuda::MempoolId_t id)
{
    xseg_pool_id pid{id.first, id.second};
    xseg_check(xseg_release_pool(device, pid), "release_pool");
}

template <class StatT>
void fill(StatT &out, const xseg_stat_counter &in)
{
    out.current = in.current;
    out.peak = in.peak;
    out.allocated = in.allocated;
    out.freed = in.freed;
}

struct OomObserver {
    cca::OutOfMemoryObserver fn;
};

void oom_trampoline(int device, size_t requested, size_t total, size_t free_bytes, void *user)
{
    try {
        static_cast<OomObserver *>(user)->fn(device, (int64_t)requested, (int64_t)total, (int64_t)free_bytes);
    } catch (...) {
        // An exception must not cross xseg's C frames; PyTorch raises its own OOM error next.
    }
}

class XsegAllocator : public PluggableBase {
  public:
    XsegAllocator()
        : PluggableBase(
              [](size_t size, int device, cudaStream_t stream) {
                  return xseg_torch_malloc(size, device, reinterpret_cast<struct CUstream_st *>(stream));
              },
              [](void *ptr, size_t size, int device, cudaStream_t stream) {
                  xseg_torch_free(ptr, size, device, reinterpret_cast<struct CUstream_st *>(stream));
              })
    {
        set_init_fn([](int n) { xseg_torch_init(n); });
        set_reset_fn([]() { xseg_torch_empty_cache(); });
        set_memory_fraction_fn([](double f, int dev) { xseg_check(xseg_set_memory_fraction(f, dev), "set_memory_fraction"); });
        set_record_stream_fn([](void *ptr, cudaStream_t s) {
            xseg_check(xseg_record_stream(ptr, reinterpret_cast<struct CUstream_st *>(s)), "record_stream");
        });
        set_begin_allocate_to_pool(begin_to_pool);
        set_end_allocate_to_pool_fn(end_to_pool);
        set_release_pool(release_pool);
    }

    cca::DeviceStats stats(int device)
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
        out.num_sync_all_streams = s.num_sync_all_streams;
        out.num_device_alloc = s.num_device_alloc;
        out.num_device_free = s.num_device_free;
        out.max_split_size = s.max_split_size;
        return out;
    }

    // getDeviceStats / resetPeakStats: int device (2.1) or c10::DeviceIndex (later).
    cca::DeviceStats getDeviceStats(int device) { return stats(device); }
    cca::DeviceStats getDeviceStats(c10::DeviceIndex device) { return stats(device); }
    void resetPeakStats(int device) { xseg_check(xseg_reset_peak_stats(device), "reset_peak_stats"); }
    void resetPeakStats(c10::DeviceIndex device) { xseg_check(xseg_reset_peak_stats(device), "reset_peak_stats"); }

    cca::SnapshotInfo take_snapshot()
    {
        xseg_snapshot *snap = nullptr;
        xseg_check(xseg_take_snapshot(-1, &snap), "snapshot");
        cca::SnapshotInfo out;
        for (size_t i = 0; i < snap->nsegments; i++) {
            const xseg_segment_info &s = snap->segments[i];
            cca::SegmentInfo seg;
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
                cca::BlockInfo bi;
                bi.size = (int64_t)b.size;
                bi.requested_size = (int64_t)b.requested_size;
                bi.allocated = b.state == XSEG_BLOCK_ACTIVE_ALLOCATED;
                bi.active = b.state != XSEG_BLOCK_INACTIVE;
                seg.blocks.push_back(std::move(bi));
            }
            out.segments.push_back(std::move(seg));
        }
        int n = 0;
        if (xseg_device_count(&n) == XSEG_SUCCESS && n > 0)
            out.device_traces.resize((size_t)n);
        xseg_snapshot_free(snap);
        return out;
    }

    // snapshot(): no arguments (2.1-2.6), a pool id (2.7-2.8), a pool id and include_traces.
    cca::SnapshotInfo snapshot() { return take_snapshot(); }
    cca::SnapshotInfo snapshot(c10::cuda::MempoolId_t) { return take_snapshot(); }
    cca::SnapshotInfo snapshot(c10::cuda::MempoolId_t, bool) { return take_snapshot(); }

    // recordHistory: C++ callers (torch.cuda.memory._record_memory_history is answered by the
    // Python package with Python frames, see xseg/torch.py). PyTorch's context recorder returns
    // frames xseg cannot read, so frames here are xseg's own C frames.
    void history(bool enabled, size_t max_entries, int when, bool clear)
    {
        xseg_history_options o{};
        o.enabled = enabled ? 1 : 0;
        o.record = XSEG_HISTORY_ALL;
        o.stacks = when == 0 ? XSEG_STACKS_NONE : XSEG_STACKS_C; // RecordContext::NEVER is 0
        o.max_entries = max_entries >= ((size_t)1 << 32) ? 0 : max_entries;
        o.clear = clear ? 1 : 0;
        xseg_check(xseg_record_memory_history(&o), "record_memory_history");
    }
    void recordHistory(bool enabled, cca::CreateContextFn, size_t max_entries, cca::RecordContext when)
    {
        history(enabled, max_entries, (int)when, false);
    }
    void recordHistory(bool enabled, cca::CreateContextFn, size_t max_entries, cca::RecordContext when,
                       bool clear)
    {
        history(enabled, max_entries, (int)when, clear);
    }
    void recordHistory(bool enabled, cca::CreateContextFn, size_t max_entries, cca::RecordContext when,
                       bool clear, const std::vector<std::string> &)
    {
        history(enabled, max_entries, (int)when, clear);
    }

    void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer)
    {
        auto *o = new OomObserver{std::move(observer)}; // lives as long as the process
        xseg_check(xseg_attach_oom_observer(oom_trampoline, o), "attach_oom_observer");
    }

    std::string name() { return "xseg"; }
};

std::shared_ptr<XsegAllocator> installed;

// Create the allocator, make it PyTorch's current CUDA allocator, and tell libxseg every hook is
// wired (which silences its bare-CUDAPluggableAllocator warning).
void install()
{
    if (installed)
        return;
    xseg_torch_adapter_attached(1);
    installed = std::make_shared<XsegAllocator>();
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(installed);
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.def("install", &install, "Install xseg as PyTorch's CUDA allocator with every hook wired.");
}
