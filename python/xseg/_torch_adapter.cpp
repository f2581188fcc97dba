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
// It also answers what the pluggable wrapper refuses or gets wrong (docs/python.md, issue 34):
// record_stream of an empty tensor or foreign memory (silently), cudagraph trees' checkpoints
// (getCheckpointState / setCheckpointPoolState: a pool's block layout captured and restored),
// enablePeerAccess (xseg's mappings too) and memcpyAsync (a peer copy without p2p),
// getMemoryFraction, isHistoryEnabled, attachAllocatorTraceTracker (fed by xseg's segment
// observers), shareIpcHandle / getIpcDevPtr (xseg's IPC), 2.6's ensureExistsAndIncrefPool, and
// the device-generic registry; MemPool's use_on_oom / no_split are refused with what to do.
// From 2.8 install_host() also makes xseg's pinned host cache PyTorch's CUDA host allocator
// (at::HostAllocator: pin_memory(), non_blocking copies, torch.cuda.host_memory_stats()).
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

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "xseg.h"

#if TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 1)
#error "xseg's PyTorch adapter needs PyTorch 2.1 or newer (the allocate-to-pool hooks)"
#endif

// Pinned tensors: from 2.8 pin_memory(), empty(pin_memory=True), the pinned destinations of
// non_blocking copies to the CPU and the copy kernel's record_event reach the host allocator
// through at::getHostAllocator(at::kCUDA), a registry where another one can be installed
// (at::setHostAllocator; pytorch#151431, merged 2025-04-22, after 2.7's branch cut). Up to 2.7
// they call PyTorch's CachingHostAllocator directly, and the adapter leaves them to it.
#if (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 8) && __has_include(<ATen/core/CachingHostAllocator.h>)
#define XSEG_TORCH_HOST_REGISTRY 1
#include <ATen/core/CachingHostAllocator.h>
#include <c10/cuda/CUDAStream.h>
#else
#define XSEG_TORCH_HOST_REGISTRY 0
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

// Called from destructors (~CUDAGraph, ~MemPool): an exception there ends the process, so a
// failure is reported on stderr instead.
void release_pool(int device, MempoolId id) noexcept
{
    if (xseg_release_pool(device, to_xseg(id)) != XSEG_SUCCESS)
        std::fprintf(stderr, "xseg: warning: release_pool(device %d, pool (%llu, %llu)): %s\n", device,
                     (unsigned long long)id.first, (unsigned long long)id.second, xseg_last_error());
}

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

// The allocator settings a snapshot reports (SnapshotInfo::config_metadata, where the release has
// it): xseg's config string and the values PyTorch's fields name.
template <class S>
auto fill_config_metadata(S &out, int) -> decltype(out.config_metadata.last_allocator_settings, void())
{
    char buf[1024];
    size_t len = 0;
    if (xseg_get_config(buf, sizeof buf, &len) == XSEG_SUCCESS) {
        std::string cfg(buf);
        out.config_metadata.last_allocator_settings = cfg;
        out.config_metadata.expandable_segments = cfg.find("expandable_segments:True") != std::string::npos;
    }
    int64_t v = 0;
    if (xseg_stat(0, "max_split_size", &v) == XSEG_SUCCESS && v > 0)
        out.config_metadata.max_split_size = (size_t)v;
}
template <class S>
void fill_config_metadata(S &, long)
{
}

// Segments of @p pool ({0, 0}: all), in PyTorch's structs.
cca::SnapshotInfo take_snapshot(MempoolId pool)
{
    xseg_snapshot *snap = nullptr;
    xseg_check(xseg_take_snapshot(-1, &snap), "snapshot");
    cca::SnapshotInfo out{}; // value-initialized: 2.6's config_metadata scalars are otherwise indeterminate
    fill_config_metadata(out, 0);
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

// ---- record_stream --------------------------------------------------------------------------

// An empty tensor (no pointer) and memory xseg did not allocate (DLPack imports, NCCL buffers) are
// skipped silently, as PyTorch's own allocators do; a live xseg block with a bad stream raises.
void record_stream(void *ptr, cudaStream_t s)
{
    if (!ptr)
        return;
    xseg_status st = xseg_record_stream(ptr, reinterpret_cast<struct CUstream_st *>(s));
    if (st == XSEG_ERROR_INVALID_VALUE) {
        size_t n = 0;
        if (xseg_block_handles(ptr, nullptr, 0, &n) == XSEG_ERROR_INVALID_VALUE)
            return; // not an xseg allocation
    }
    xseg_check(st, "record_stream");
}

// ---- allocator trace tracker, fed by xseg's segment observers --------------------------------

// PyTorch's TraceEntry for one map or unmap: SEGMENT_MAP/SEGMENT_UNMAP for expandable pages,
// SEGMENT_ALLOC/SEGMENT_FREE for a classic cuMemAlloc segment (what PyTorch's allocator reports;
// NCCL's registration hook acts on the latter). The constructor differs by release: the newest
// takes a stream as void* and a pool id, 2.6 a cudaStream_t and no pool. Time: 0 (the hooks that
// consume these read action, device, address and size).
template <class TE>
using TraceTime = decltype(std::declval<TE &>().time_.approx_t_);

template <class TE>
auto make_trace(typename TE::Action a, int dev, uint64_t addr, size_t size, int)
    -> decltype(TE(a, c10::DeviceIndex(), size_t(), size_t(), (void *)nullptr, MempoolId(), TraceTime<TE>()),
                std::optional<TE>())
{
    return TE(a, (c10::DeviceIndex)dev, (size_t)addr, size, (void *)nullptr, MempoolId{0, 0}, TraceTime<TE>());
}
template <class TE>
auto make_trace(typename TE::Action a, int dev, uint64_t addr, size_t size, long)
    -> decltype(TE(a, c10::DeviceIndex(), size_t(), size_t(), (cudaStream_t) nullptr, TraceTime<TE>()),
                std::optional<TE>())
{
    return TE(a, (c10::DeviceIndex)dev, (size_t)addr, size, (cudaStream_t) nullptr, TraceTime<TE>());
}
template <class TE>
std::optional<TE> make_trace(...)
{
    return std::nullopt;
}
struct TraceTracker {
    cca::AllocatorTraceTracker fn;
};
thread_local bool attaching_tracker = false; // xseg's replay of existing mappings at attach

template <class TE>
void trace_observer(const xseg_segment_event *ev, void *user)
{
    if (attaching_tracker)
        return; // PyTorch's trackers see changes only, not the mappings that exist at attach
    using A = typename TE::Action;
    A a = ev->is_expandable ? (ev->kind == XSEG_SEGMENT_MAP ? A::SEGMENT_MAP : A::SEGMENT_UNMAP)
                            : (ev->kind == XSEG_SEGMENT_MAP ? A::SEGMENT_ALLOC : A::SEGMENT_FREE);
    std::optional<TE> te = make_trace<TE>(a, ev->device, ev->address, ev->size, 0);
    try {
        if (te)
            static_cast<TraceTracker *>(user)->fn(*te);
    } catch (...) {
        // No exception may cross xseg's C frames (the device lock is held here).
    }
}

template <class TE>
auto attach_trace_tracker(cca::AllocatorTraceTracker tracker, int)
    -> decltype(make_trace<TE>(typename TE::Action(), 0, 0, 0, 0)->action_, void())
{
    auto *t = new TraceTracker{std::move(tracker)}; // lives as long as the process, as PyTorch's
    attaching_tracker = true;
    xseg_status st = xseg_attach_segment_observer(trace_observer<TE>, t);
    attaching_tracker = false;
    if (st != XSEG_SUCCESS)
        delete t;
    xseg_check(st, "attachAllocatorTraceTracker");
}
template <class TE>
void attach_trace_tracker(cca::AllocatorTraceTracker, long)
{
    TORCH_CHECK(false, "xseg: attachAllocatorTraceTracker: this PyTorch's TraceEntry has a constructor the adapter "
                       "does not know; register segments from C/C++ with xseg_attach_segment_observer instead");
}

// ---- CUDA IPC of tensors (torch.multiprocessing) ---------------------------------------------

// PyTorch moves a handle as a byte string. A fabric handle is bytes (xseg_ipc_serialize); POSIX
// file descriptors are not, so the exporting process serves them over a Unix socket (abstract
// name, this process's, with a random token): the string names the socket, the export's id and
// its token, and the importer fetches the descriptors with xseg_ipc_recv. Exports stay open until
// the block is freed (PyTorch's producer keeps the tensor alive while consumers use it).
struct IpcExports {
    std::mutex mu;
    std::map<uint64_t, std::pair<void *, xseg_ipc_handle *>> by_id; // id -> (block, handle)
    std::map<void *, uint64_t> by_ptr;
    uint64_t next_id = 1;
    std::string socket_name; // abstract (leading NUL dropped here); empty until the server runs
    std::string token;       // 32 hex digits: a connection must present it
    int listen_fd = -1;
};
IpcExports ipc;
std::atomic<int> ipc_live{0}; // exports open: the free path looks the pointer up only when > 0

const char IPC_FABRIC[] = "xseg-ipc-fabric:";
const char IPC_FD[] = "xseg-ipc-fd:";

sockaddr_un ipc_address(const std::string &name, socklen_t *len)
{
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    a.sun_path[0] = '\0';
    std::memcpy(a.sun_path + 1, name.data(), std::min(name.size(), sizeof a.sun_path - 2));
    *len = (socklen_t)(offsetof(sockaddr_un, sun_path) + 1 + std::min(name.size(), sizeof a.sun_path - 2));
    return a;
}

bool read_full(int fd, void *buf, size_t n)
{
    char *p = static_cast<char *>(buf);
    while (n) {
        ssize_t r = ::read(fd, p, n);
        if (r <= 0)
            return false;
        p += r;
        n -= (size_t)r;
    }
    return true;
}

// One request per connection: 8 bytes of export id and 32 of token, answered with
// xseg_ipc_send of that export (or a close when the id or token is wrong).
void ipc_serve(int lfd)
{
    for (;;) {
        int c = ::accept(lfd, nullptr, nullptr);
        if (c < 0)
            continue;
        uint64_t id = 0;
        char token[32];
        if (read_full(c, &id, sizeof id) && read_full(c, token, sizeof token)) {
            std::lock_guard<std::mutex> g(ipc.mu);
            auto it = ipc.by_id.find(id);
            if (it != ipc.by_id.end() && ipc.token.compare(0, 32, token, 32) == 0)
                (void)xseg_ipc_send(c, it->second.second);
        }
        ::close(c);
    }
}

// Under ipc.mu: start the descriptor server once.
void ipc_start_server()
{
    if (ipc.listen_fd >= 0)
        return;
    std::random_device rd;
    char hex[40];
    std::snprintf(hex, sizeof hex, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
    std::string name = "xseg-torch-ipc-" + std::to_string(::getpid()) + "-" + std::string(hex, 8);
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    TORCH_CHECK(fd >= 0, "xseg: shareIpcHandle: socket: ", std::strerror(errno));
    socklen_t len;
    sockaddr_un a = ipc_address(name, &len);
    if (::bind(fd, reinterpret_cast<sockaddr *>(&a), len) != 0 || ::listen(fd, 64) != 0) {
        int e = errno;
        ::close(fd);
        TORCH_CHECK(false, "xseg: shareIpcHandle: cannot serve file descriptors on a Unix socket (", std::strerror(e),
                    "); share blocks with xseg.ipc_export and IpcHandle.send instead");
    }
    std::thread(ipc_serve, fd).detach();
    ipc.listen_fd = fd;
    ipc.socket_name = name;
    ipc.token = std::string(hex, 32);
}

template <class Handle>
Handle share_ipc_handle(void *ptr)
{
    xseg_ipc_handle *h = nullptr;
    xseg_status st = xseg_ipc_export(ptr, &h);
    TORCH_CHECK(st != XSEG_ERROR_NOT_SUPPORTED, "xseg: shareIpcHandle: ", xseg_last_error(),
                ". CUDA IPC of tensors needs xseg's expandable segments with shareable pages "
                "(expandable_segments:True, expandable_segments_ipc:True, the defaults)");
    xseg_check(st, "shareIpcHandle");
    xseg_ipc_info info{};
    (void)xseg_ipc_handle_info(h, &info);
    Handle out{};
    out.offset = 0; // the import's address is the block's own
    if (info.type == XSEG_IPC_FABRIC) {
        size_t len = 0;
        (void)xseg_ipc_serialize(h, nullptr, 0, &len);
        std::string bytes(len, '\0');
        st = xseg_ipc_serialize(h, &bytes[0], len, &len);
        xseg_ipc_handle_free(h);
        xseg_check(st, "shareIpcHandle");
        out.handle = IPC_FABRIC + bytes;
        return out;
    }
    std::lock_guard<std::mutex> g(ipc.mu);
    try {
        ipc_start_server();
    } catch (...) {
        xseg_ipc_handle_free(h);
        throw;
    }
    auto old = ipc.by_ptr.find(ptr);
    if (old != ipc.by_ptr.end()) { // shared again: the export already served stays
        xseg_ipc_handle_free(h);
        out.handle = IPC_FD + ipc.socket_name + ":" + std::to_string(old->second) + ":" + ipc.token;
        return out;
    }
    uint64_t id = ipc.next_id++;
    ipc.by_id[id] = {ptr, h};
    ipc.by_ptr[ptr] = id;
    ipc_live.fetch_add(1, std::memory_order_relaxed);
    out.handle = IPC_FD + ipc.socket_name + ":" + std::to_string(id) + ":" + ipc.token;
    return out;
}

// The block at @p ptr is being freed: close its export, if any.
void ipc_forget(void *ptr)
{
    if (ipc_live.load(std::memory_order_relaxed) == 0)
        return;
    std::lock_guard<std::mutex> g(ipc.mu);
    auto it = ipc.by_ptr.find(ptr);
    if (it == ipc.by_ptr.end())
        return;
    auto e = ipc.by_id.find(it->second);
    xseg_ipc_handle_free(e->second.second);
    ipc.by_id.erase(e);
    ipc.by_ptr.erase(it);
    ipc_live.fetch_sub(1, std::memory_order_relaxed);
}

std::shared_ptr<void> get_ipc_dev_ptr(const std::string &handle)
{
    xseg_ipc_handle *h = nullptr;
    if (handle.compare(0, sizeof IPC_FABRIC - 1, IPC_FABRIC) == 0) {
        xseg_check(xseg_ipc_deserialize(handle.data() + sizeof IPC_FABRIC - 1, handle.size() - (sizeof IPC_FABRIC - 1), &h),
                   "getIpcDevPtr");
    } else if (handle.compare(0, sizeof IPC_FD - 1, IPC_FD) == 0) {
        std::string rest = handle.substr(sizeof IPC_FD - 1);
        size_t a = rest.find(':'), b = rest.find(':', a == std::string::npos ? a : a + 1);
        TORCH_CHECK(a != std::string::npos && b != std::string::npos && rest.size() - b - 1 == 32,
                    "xseg: getIpcDevPtr: malformed handle");
        std::string name = rest.substr(0, a), token = rest.substr(b + 1);
        uint64_t id = std::stoull(rest.substr(a + 1, b - a - 1));
        int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        TORCH_CHECK(fd >= 0, "xseg: getIpcDevPtr: socket: ", std::strerror(errno));
        socklen_t len;
        sockaddr_un addr = ipc_address(name, &len);
        if (::connect(fd, reinterpret_cast<sockaddr *>(&addr), len) != 0) {
            int e = errno;
            ::close(fd);
            TORCH_CHECK(false, "xseg: getIpcDevPtr: cannot reach the exporting process's socket (", std::strerror(e),
                        "): it must be alive and in this network namespace; otherwise share blocks with "
                        "xseg.ipc_export and IpcHandle.send over a Unix socket you pass");
        }
        bool sent = ::write(fd, &id, sizeof id) == (ssize_t)sizeof id &&
                    ::write(fd, token.data(), 32) == 32;
        xseg_status st = sent ? xseg_ipc_recv(fd, &h) : XSEG_ERROR_INVALID_VALUE;
        ::close(fd);
        TORCH_CHECK(st == XSEG_SUCCESS, "xseg: getIpcDevPtr: the exporting process did not send the block (",
                    sent ? xseg_last_error() : "write failed", "): it was freed, or the handle is stale");
    } else {
        TORCH_CHECK(false, "xseg: getIpcDevPtr: not a handle of xseg's (the exporting process must use xseg as "
                           "its CUDA allocator too: xseg.torch.enable())");
    }
    xseg_ipc_info info{};
    (void)xseg_ipc_handle_info(h, &info);
    void *p = nullptr;
    xseg_status st = xseg_ipc_import(h, info.device, &p);
    xseg_ipc_handle_free(h);
    xseg_check(st, "getIpcDevPtr");
    return std::shared_ptr<void>(p, [](void *q) {
        if (xseg_ipc_close(q) != XSEG_SUCCESS)
            std::fprintf(stderr, "xseg: warning: closing an IPC import: %s\n", xseg_last_error());
    });
}

// ---- checkpoints of private pools (cudagraph trees) -------------------------------------------

// The layout of a pool: its segments and their blocks, in address order.
struct XsegPoolState : cca::AllocatorState {
    int device = 0;
    MempoolId pool{0, 0};
    struct Block {
        uint64_t address;
        size_t size;
        bool allocated;
    };
    std::vector<Block> blocks; // every block of the pool's segments
};

std::vector<XsegPoolState::Block> pool_layout(int device, MempoolId pool)
{
    xseg_snapshot *snap = nullptr;
    xseg_check(xseg_take_snapshot(device, &snap), "getCheckpointState");
    std::vector<XsegPoolState::Block> out;
    for (size_t i = 0; i < snap->nsegments; i++) {
        const xseg_segment_info &s = snap->segments[i];
        if (s.pool_id[0] != pool.first || s.pool_id[1] != pool.second)
            continue;
        uint64_t a = s.address;
        for (size_t j = 0; j < s.nblocks; j++) {
            out.push_back({a, s.blocks[j].size, s.blocks[j].state == XSEG_BLOCK_ACTIVE_ALLOCATED});
            a += s.blocks[j].size;
        }
    }
    xseg_snapshot_free(snap);
    return out;
}

std::shared_ptr<cca::AllocatorState> get_checkpoint_state(int device, MempoolId id)
{
    auto st = std::make_shared<XsegPoolState>();
    st->device = device;
    st->pool = id;
    st->blocks = pool_layout(device, id);
    return st;
}

// Restores the checkpoint: every block allocated in the pool now is reported freed, and every
// block allocated at the checkpoint reported allocated again, at its address, as PyTorch's
// allocator does: the blocks allocated since are freed, then each checkpointed block freed since
// is placed at its address again (xseg_pool_malloc_at; the caller frees those it finds dead), so
// the pool's free space is what it was. @p note records a placed block with PyTorch's wrapper,
// whose raw_delete frees only what it knows.
template <class Delta, class Note>
Delta set_checkpoint_pool_state(int device, const std::shared_ptr<cca::AllocatorState> &pps,
                                c10::DeleterFnPtr deleter, Note note)
{
    auto *st = dynamic_cast<XsegPoolState *>(pps.get());
    TORCH_CHECK(st, "xseg: setCheckpointPoolState: not a checkpoint taken by xseg's getCheckpointState");
    TORCH_CHECK(st->device == device, "xseg: setCheckpointPoolState: the checkpoint is of device ", st->device,
                ", not ", device);
    std::vector<XsegPoolState::Block> now = pool_layout(device, st->pool);
    std::map<uint64_t, size_t> keep; // checkpointed blocks allocated now, same address and size
    std::map<uint64_t, size_t> live_now;
    for (const auto &b : now)
        if (b.allocated)
            live_now[b.address] = b.size;
    for (const auto &b : st->blocks) {
        auto it = live_now.find(b.address);
        if (b.allocated && it != live_now.end() && it->second == b.size)
            keep[b.address] = b.size;
    }
    Delta d;
    for (const auto &b : now)
        if (b.allocated) {
            d.ptrs_freed.push_back(reinterpret_cast<void *>(b.address));
            if (!keep.count(b.address)) {
                ipc_forget(reinterpret_cast<void *>(b.address));
                xseg_check(xseg_free(reinterpret_cast<void *>(b.address)), "setCheckpointPoolState");
            }
        }
    for (const auto &b : st->blocks)
        if (b.allocated && !keep.count(b.address)) {
            xseg_status s = xseg_pool_malloc_at(device, to_xseg(st->pool), reinterpret_cast<void *>(b.address), b.size);
            TORCH_CHECK(s == XSEG_SUCCESS, "xseg: setCheckpointPoolState: cannot place the checkpointed block at 0x",
                        std::hex, b.address, std::dec, " (", b.size, " bytes) again: ", xseg_last_error(),
                        ". Keep CUDA graph outputs alive, or turn cudagraph trees off ",
                        "(torch._inductor.config.triton.cudagraph_trees = False)");
            note(reinterpret_cast<void *>(b.address), b.size, device);
        }
    for (const auto &b : st->blocks)
        if (b.allocated) {
            void *p = reinterpret_cast<void *>(b.address);
            d.dataptrs_allocd.emplace_back(p, p, deleter, c10::Device(c10::DeviceType::CUDA, (c10::DeviceIndex)device));
        }
    return d;
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

// 2.6 names MemPool's hook ensureExistsAndIncrefPool.
template <class B, class = void>
struct WithEnsureExistsAndIncrefPool : B {
    using B::B;
};
template <class B>
struct WithEnsureExistsAndIncrefPool<B, std::void_t<decltype(&B::ensureExistsAndIncrefPool)>> : B {
    using B::B;
    void ensureExistsAndIncrefPool(XSEG_TORCH_DEV device, MempoolId id) override
    {
        xseg_check(xseg_pool_retain(device, to_xseg(id)), "ensure_exists_and_incref_pool");
    }
};

// MemPool(use_on_oom=True) / MemPool(no_split=True): refused with what to do instead.
template <class B, class = void>
struct WithPoolFlags : B {
    using B::B;
};
template <class B>
struct WithPoolFlags<B, std::void_t<decltype(&B::setUseOnOOM), decltype(&B::setNoSplit)>> : B {
    using B::B;
    void setUseOnOOM(XSEG_TORCH_DEV, MempoolId, bool use_on_oom) override
    {
        TORCH_CHECK(!use_on_oom, "xseg: MemPool(use_on_oom=True) is not supported: xseg does not serve ordinary "
                                 "allocations from a private pool when the device is out of memory. Create the MemPool "
                                 "without use_on_oom, and free its tensors or call torch.cuda.empty_cache() to give "
                                 "its memory back");
    }
    void setNoSplit(XSEG_TORCH_DEV, MempoolId) override
    {
        TORCH_CHECK(false, "xseg: MemPool(no_split=True) is not supported: xseg has no per-pool split rule. Create the "
                           "MemPool without no_split; max_split_size_mb (process-wide) keeps large blocks unsplit");
    }
};

// torch.cuda.get_per_process_memory_fraction (where PyTorch declares getMemoryFraction).
template <class B, class = void>
struct WithMemoryFraction : B {
    using B::B;
};
template <class B>
struct WithMemoryFraction<B, std::void_t<decltype(&B::getMemoryFraction)>> : B {
    using B::B;
    double getMemoryFraction(XSEG_TORCH_DEV device) override
    {
        double f = 1.0;
        xseg_check(xseg_get_memory_fraction(device, &f), "get_memory_fraction");
        return f;
    }
};

// memcpyAsync: a copy between devices without peer access must use the peer copy, since a plain
// device-to-device copy of cuMemMap memory is an error then (PyTorch's own allocator does the
// same for its expandable segments).
template <class B, class = void>
struct WithMemcpy : B {
    using B::B;
};
template <class B>
struct WithMemcpy<B, std::void_t<decltype(&B::memcpyAsync)>> : B {
    using B::B;
    cudaError_t memcpyAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count,
                            cudaStream_t stream, bool p2p_enabled) override
    {
        if (p2p_enabled || dstDevice == srcDevice)
            return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
        return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
    }
};

// CUDA IPC of tensors (where PyTorch declares shareIpcHandle).
template <class B, class = void>
struct WithIpc : B {
    using B::B;
};
template <class B>
struct WithIpc<B, std::void_t<decltype(&B::shareIpcHandle), decltype(&B::getIpcDevPtr)>> : B {
    using B::B;
    decltype(std::declval<B &>().shareIpcHandle(nullptr)) shareIpcHandle(void *ptr) override
    {
        return share_ipc_handle<decltype(std::declval<B &>().shareIpcHandle(nullptr))>(ptr);
    }
    std::shared_ptr<void> getIpcDevPtr(std::string handle) override { return get_ipc_dev_ptr(handle); }
};

using AdapterBase = WithIpc<WithMemcpy<WithMemoryFraction<
    WithPoolFlags<WithEnsureExistsAndIncrefPool<WithCreateOrIncrefPool<WithPoolUseCount<PluggableBase>>>>>>>;

// ---- the allocator -------------------------------------------------------------------------

class XsegAllocator : public AdapterBase {
  public:
    XsegAllocator()
        : AdapterBase(
              adapter_malloc,
              [](void *ptr, size_t size, int device, cudaStream_t stream) {
                  ipc_forget(ptr);
                  xseg_torch_free(ptr, size, device, reinterpret_cast<struct CUstream_st *>(stream));
              })
    {
        set_init_fn([](int n) { xseg_torch_init(n); });
        set_reset_fn([]() { xseg_check(xseg_empty_cache(-1), "empty_cache"); });
        set_memory_fraction_fn([](double f, int dev) { xseg_check(xseg_set_memory_fraction(f, dev), "set_memory_fraction"); });
        set_record_stream_fn(record_stream);
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

    bool isHistoryEnabled() override
    {
        int on = 0;
        xseg_check(xseg_history_enabled(&on), "is_history_enabled");
        return on != 0;
    }

    void attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) override
    {
        attach_trace_tracker<cca::TraceEntry>(std::move(tracker), 0);
    }

    // Peer access: the driver's context-level access (PyTorch's base class), then xseg's own
    // mappings of dev_to_access made accessible from dev (cuMemSetAccess), now and later.
    void enablePeerAccess(XSEG_TORCH_DEV dev, XSEG_TORCH_DEV dev_to_access) override
    {
        AdapterBase::enablePeerAccess(dev, dev_to_access);
        xseg_check(xseg_enable_peer_access(dev_to_access, dev), "enablePeerAccess");
    }

    std::shared_ptr<cca::AllocatorState> getCheckpointState(XSEG_TORCH_DEV device, MempoolId id) override
    {
        return get_checkpoint_state(device, id);
    }
    cca::CheckpointDelta setCheckpointPoolState(XSEG_TORCH_DEV device, std::shared_ptr<cca::AllocatorState> pps) override
    {
        return set_checkpoint_pool_state<cca::CheckpointDelta>(
            device, pps, raw_deleter(), [this](void *p, size_t size, int dev) { note_allocation(p, size, dev, 0); });
    }

    // A block placed by the adapter itself, made known to PyTorch's wrapper (its protected
    // allocation_metadata_, 2.6 and 2.14), whose raw_delete frees only pointers it has seen.
    template <class S = XsegAllocator>
    auto note_allocation(void *p, size_t size, int dev, int)
        -> decltype(static_cast<S *>(this)->allocation_metadata_, void())
    {
        S *self = static_cast<S *>(this);
        std::lock_guard<std::mutex> g(self->allocator_mutex_);
        self->allocation_metadata_[p] = {size, (c10::DeviceIndex)dev, nullptr};
    }
    template <class S = XsegAllocator>
    void note_allocation(void *, size_t, int, long)
    {
    }

    std::string name() override { return "xseg"; }
};

std::shared_ptr<XsegAllocator> installed;

// ---- pinned host memory: xseg's host cache as PyTorch's CUDA host allocator (2.8+) ---------

#if XSEG_TORCH_HOST_REGISTRY
// State of the installed host allocator. Never destroyed: pinned tensors may be freed at exit.
// A block allocated, or used by a stream, while a CUDA graph captures into a pool (the
// allocate-to-pool hooks, where the release has them) belongs to that pool: the graph's replays
// read it, so its free is deferred until the pool is released, as PyTorch's own host allocator
// never reuses such a block.
struct HostState {
    std::mutex mu;
    at::HostAllocator *prev = nullptr; // the allocator installed before (pinned tensors it made)
    std::atomic<size_t> ncapturing{0}; // capturing.size(), read without the lock
    std::vector<std::pair<MempoolId, std::function<bool(c10::Stream)>>> capturing;
    std::map<void *, MempoolId> held;                // live blocks of a pool
    std::map<MempoolId, std::vector<void *>> freed; // their frees, until the pool is released
};
HostState &host_state()
{
    static HostState *s = new HostState;
    return *s;
}

void host_free_now(void *p) noexcept
{
    if (xseg_host_free(p) != XSEG_SUCCESS)
        std::fprintf(stderr, "xseg: warning: freeing a pinned tensor: %s\n", xseg_last_error());
}

// The DataPtr deleter of every pinned tensor xseg made (called by PyTorch; must not throw).
void host_delete(void *p) noexcept
{
    if (!p)
        return;
    HostState &hs = host_state();
    {
        std::lock_guard<std::mutex> g(hs.mu);
        auto it = hs.held.find(p);
        if (it != hs.held.end()) {
            try {
                hs.freed[it->second].push_back(p);
            } catch (const std::bad_alloc &) {
                // Out of host memory: the block stays allocated (a replay may still read it).
                std::fprintf(stderr, "xseg: warning: out of host memory; a pinned block of a graph pool is kept\n");
            }
            hs.held.erase(it);
            return;
        }
    }
    host_free_now(p);
}

// The pool a capture routes @p stream to, if any (the filters run without the lock held).
std::optional<MempoolId> capture_pool_of(const c10::Stream &stream)
{
    HostState &hs = host_state();
    if (hs.ncapturing.load(std::memory_order_acquire) == 0)
        return std::nullopt;
    std::vector<std::pair<MempoolId, std::function<bool(c10::Stream)>>> caps;
    {
        std::lock_guard<std::mutex> g(hs.mu);
        if (hs.capturing.empty())
            return std::nullopt;
        caps = hs.capturing;
    }
    for (auto &c : caps)
        if (c.second(stream))
            return c.first;
    return std::nullopt;
}

void hold_for_pool(void *p, MempoolId pool)
{
    std::lock_guard<std::mutex> g(host_state().mu);
    host_state().held.emplace(p, pool);
}

template <class T, class = void>
struct HasPeak : std::false_type {
};
template <class T>
struct HasPeak<T, std::void_t<decltype(std::declval<T &>().peak)>> : std::true_type {
};

// One HostStats field from xseg's host statistic @p key: a count, a Stat (current, peak,
// allocated, freed) or a DurationStat (total, max, min, count; microseconds).
template <class StatT>
void host_fill(StatT &out, const std::string &key)
{
    auto get = [&](const char *part) {
        int64_t v = 0;
        xseg_check(xseg_host_stat((key + part).c_str(), &v), "host_memory_stats");
        return v;
    };
    if constexpr (std::is_integral_v<StatT>) {
        out = get("");
    } else if constexpr (HasPeak<StatT>::value) {
        out.current = get(".current");
        out.peak = get(".peak");
        out.allocated = get(".allocated");
        out.freed = get(".freed");
    } else {
        out.total = get(".total");
        out.max = get(".max");
        out.min = get(".min");
        out.count = get(".count");
    }
}

// HostStats' fields, set where this release declares them. PyTorch's host allocator does not
// split blocks, so its "allocations" (blocks, live and cached) and "allocated_bytes" (their
// bytes) are xseg's segments and reserved bytes; active requests and bytes are xseg's live blocks.
#define XSEG_HOST_FIELD(name)                                                                     \
    template <class S>                                                                            \
    auto host_##name(S &s, const char *key, int)->decltype(s.name, void())                        \
    {                                                                                             \
        host_fill(s.name, key);                                                                   \
    }                                                                                             \
    template <class S>                                                                            \
    void host_##name(S &, const char *, long)                                                     \
    {                                                                                             \
    }
XSEG_HOST_FIELD(active_requests)
XSEG_HOST_FIELD(active_bytes)
XSEG_HOST_FIELD(allocations)
XSEG_HOST_FIELD(allocated_bytes)
XSEG_HOST_FIELD(host_alloc_time)
XSEG_HOST_FIELD(host_free_time)
XSEG_HOST_FIELD(num_host_alloc)
XSEG_HOST_FIELD(num_host_free)
#undef XSEG_HOST_FIELD

at::HostStats host_stats()
{
    at::HostStats out;
    host_active_requests(out, "allocation", 0);
    host_active_bytes(out, "allocated_bytes", 0);
    host_allocations(out, "segment", 0);
    host_allocated_bytes(out, "reserved_bytes", 0);
    host_host_alloc_time(out, "host_alloc_time", 0);
    host_host_free_time(out, "host_free_time", 0);
    host_num_host_alloc(out, "num_host_alloc", 0);
    host_num_host_free(out, "num_host_free", 0);
    return out;
}

class XsegHostBase : public at::HostAllocator {
  public:
    at::DataPtr allocate(size_t size) override
    {
        c10::Device cpu(c10::DeviceType::CPU, -1);
        if (size == 0)
            return {nullptr, nullptr, host_delete, cpu};
        void *p = nullptr;
        xseg_status st = xseg_host_malloc(&p, size);
        TORCH_CHECK_WITH(OutOfMemoryError, st != XSEG_ERROR_OUT_OF_MEMORY, "xseg: ", xseg_last_error());
        xseg_check(st, "pinned host memory");
        try {
            if (auto pool = capture_pool_of(c10::cuda::getCurrentCUDAStream().unwrap()))
                hold_for_pool(p, *pool);
        } catch (...) {
            host_free_now(p);
            throw;
        }
        return {p, p, host_delete, cpu};
    }
    c10::DeleterFnPtr raw_deleter() const override { return host_delete; }
    void copy_data(void *dest, const void *src, std::size_t count) const override { std::memcpy(dest, src, count); }

    // The copy kernel's record_event: the block is reused only once @p stream's work queued up to
    // its free is done. A block of the allocator installed before xseg's (a tensor pinned earlier)
    // is passed on to that allocator.
    bool record_event(void *ptr, void *ctx, c10::Stream stream) override
    {
        void *block = ctx ? ctx : ptr;
        if (!block)
            return false;
        xseg_status st = xseg_host_record_stream(block, stream.device_index(),
                                                 static_cast<struct CUstream_st *>(stream.native_handle()));
        if (st == XSEG_ERROR_INVALID_VALUE) {
            at::HostAllocator *prev = host_state().prev;
            return prev ? prev->record_event(ptr, ctx, stream) : false;
        }
        xseg_check(st, "record_event");
        if (auto pool = capture_pool_of(stream))
            hold_for_pool(block, *pool);
        return true;
    }
    // torch.cuda.host_memory_stats() and its resets; empty_cache also empties the allocator
    // installed before (what it cached stays out of xseg's figures).
    void empty_cache() override
    {
        xseg_check(xseg_host_empty_cache(), "host_empty_cache");
        if (host_state().prev)
            host_state().prev->empty_cache();
    }
    at::HostStats get_stats() override { return host_stats(); }
    void reset_accumulated_stats() override
    {
        xseg_check(xseg_host_reset_accumulated_stats(), "reset_accumulated_host_memory_stats");
    }
    void reset_peak_stats() override { xseg_check(xseg_host_reset_peak_stats(), "reset_peak_host_memory_stats"); }
};

// The pool hooks CUDA graph capture calls on the host allocator (releases after 2.8 declare them;
// pytorch#167507): allocations and stream uses on the capturing streams join the pool.
template <class B, class = void>
struct WithHostPools : B {
};
template <class B>
struct WithHostPools<B, std::void_t<decltype(&B::begin_allocate_to_pool), decltype(&B::release_pool)>> : B {
    void begin_allocate_to_pool(MempoolId pool, std::function<bool(c10::Stream)> filter) override
    {
        std::lock_guard<std::mutex> g(host_state().mu);
        host_state().capturing.emplace_back(pool, std::move(filter));
        host_state().ncapturing.store(host_state().capturing.size(), std::memory_order_release);
    }
    void end_allocate_to_pool(MempoolId pool) override
    {
        std::lock_guard<std::mutex> g(host_state().mu);
        auto &caps = host_state().capturing;
        for (auto it = caps.begin(); it != caps.end();)
            it = it->first == pool ? caps.erase(it) : std::next(it);
        host_state().ncapturing.store(caps.size(), std::memory_order_release);
    }
    // The graph is gone: its blocks freed meanwhile return to the cache (after their streams'
    // work), and those still live are freed normally later.
    void release_pool(MempoolId pool) override
    {
        std::vector<void *> ready;
        {
            HostState &hs = host_state();
            std::lock_guard<std::mutex> g(hs.mu);
            auto it = hs.freed.find(pool);
            if (it != hs.freed.end()) {
                ready = std::move(it->second);
                hs.freed.erase(it);
            }
            for (auto h = hs.held.begin(); h != hs.held.end();)
                h = h->second == pool ? hs.held.erase(h) : std::next(h);
        }
        for (void *p : ready)
            host_free_now(p);
    }
};

using XsegHostAllocator = WithHostPools<XsegHostBase>;
#endif

// Make xseg's host cache PyTorch's CUDA host allocator, where the release has the registry.
// @return "" when installed, else why not (one line, for xseg.torch.pinned_reason()).
std::string install_host()
{
#if XSEG_TORCH_HOST_REGISTRY
    static at::HostAllocator *mine = nullptr; // never destroyed: pinned tensors outlive modules
    if (mine)
        return "";
    at::HostAllocator *prev = at::getHostAllocator(c10::DeviceType::CUDA);
    mine = new XsegHostAllocator;
    host_state().prev = prev;
    // The highest priority, as for the device allocator: a registration at PyTorch's default
    // priority (0) made later does not displace it.
    at::setHostAllocator(c10::DeviceType::CUDA, mine, UINT8_MAX);
    if (at::getHostAllocator(c10::DeviceType::CUDA) != mine)
        return "at::setHostAllocator(kCUDA) kept another host allocator";
    return "";
#else
    return "PyTorch " + std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) +
           " has no host allocator registry (at::setHostAllocator, 2.8 and later): pinned tensors keep "
           "PyTorch's CachingHostAllocator";
#endif
}

// Create the allocator, make it PyTorch's current CUDA allocator, and tell libxseg every hook is
// wired (which silences its bare-CUDAPluggableAllocator warning).
void install()
{
    if (installed)
        return;
    auto a = std::make_shared<XsegAllocator>();
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(a);
    // The device-generic registry (torch.accelerator.memory_stats(), empty_cache(), ...), which
    // changeCurrentAllocator may leave on PyTorch's own allocator; the highest priority wins.
    c10::SetAllocator(c10::DeviceType::CUDA, a.get(), UINT8_MAX);
    xseg_torch_adapter_attached(1);
    installed = std::move(a);
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.def("install", &install, "Install xseg as PyTorch's CUDA allocator with every hook wired.");
    m.def("install_host", &install_host,
          "Install xseg's pinned host cache as PyTorch's CUDA host allocator; returns \"\" or why not.");
}
