// xseg as PyTorch's CUDA allocator with every hook wired (built by xseg.torch.enable() through
// torch.utils.cpp_extension, once per PyTorch version, and cached).
//
// A bare CUDAPluggableAllocator calls only malloc and free, and hands a NULL from malloc on as a
// tensor's data pointer. This adapter allocates and frees its blocks itself (PyTorch's wrapper
// keeps no record of them), raises when an allocation fails (c10::OutOfMemoryError with xseg's
// message when out of memory, so torch.cuda.OutOfMemoryError reaches Python), sets every set_* hook
// (record_stream, empty_cache, memory fraction, init, base allocation, and the allocate-to-pool
// hooks that torch.cuda.graph and MemPool need) and answers from xseg what the pluggable wrapper
// refuses: getDeviceStats, resetPeakStats, resetAccumulatedStats, cacheInfo, snapshot,
// recordHistory, attachOutOfMemoryObserver, and where the installed PyTorch has them,
// createOrIncrefPool and getPoolUseCount. So torch.cuda.memory_stats(), memory_summary(),
// reset_accumulated_memory_stats(), cuDNN's benchmark mode and MemPool work unchanged.
//
// It also answers what the pluggable wrapper refuses or gets wrong (docs/python.md, issue 34):
// record_stream of an empty tensor or foreign memory (silently), cudagraph trees' checkpoints
// (getCheckpointState / setCheckpointPoolState: a pool's block layout captured and restored) and
// their check of a pool's live blocks (checkPoolLiveAllocations),
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
// RTLD_GLOBAL before importing this extension. Of libtorch and c10 the adapter uses only what
// their export macros (TORCH_CUDA_CPP_API, C10_API, ...) mark, and inline code: anything else is
// not in the libraries' dynamic symbols, and the import fails (tests/torch_headers checks both).

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/extension.h>
#include <torch/version.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
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
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_set>
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
// Never destroyed, as ipc below: a pool's end hook may run from a destructor at exit (~CUDAGraph,
// ~MemPool held by a static) after this module's statics would be gone. Accessors, not globals:
// a PyTorch that has no hook of one form leaves its state unallocated (a global's `new` would run,
// its unused pointer dropped by the compiler: LeakSanitizer's leak).
using FilterMap = std::map<std::pair<int, std::pair<uint64_t, uint64_t>>, std::unique_ptr<std::function<bool(cudaStream_t)>>>;
std::mutex &filters_mu()
{
    static std::mutex *m = new std::mutex;
    return *m;
}
FilterMap &filters()
{
    static FilterMap *m = new FilterMap;
    return *m;
}

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
    std::lock_guard<std::mutex> g(filters_mu());
    xseg_check(xseg_begin_allocate_to_pool(device, to_xseg(id), filter_trampoline, fn.get()), "begin_allocate_to_pool");
    filters()[{device, {id.first, id.second}}] = std::move(fn);
}

[[maybe_unused]] void end_to_pool(int device, MempoolId id)
{
    xseg_status st = xseg_end_allocate_to_pool(device, to_xseg(id));
    {
        std::lock_guard<std::mutex> g(filters_mu());
        filters().erase({device, {id.first, id.second}});
    }
    xseg_check(st, "end_allocate_to_pool");
}

// Stream form (2.1): one stream goes to the pool; the end hook names the stream only.
// Under filters_mu(); never destroyed (as filters()).
std::map<std::pair<int, cudaStream_t>, MempoolId> &stream_pools()
{
    static auto *m = new std::map<std::pair<int, cudaStream_t>, MempoolId>;
    return *m;
}

int stream_trampoline(struct CUstream_st *stream, void *user)
{
    return reinterpret_cast<cudaStream_t>(stream) == static_cast<cudaStream_t>(user) ? 1 : 0;
}

[[maybe_unused]] void begin_stream_to_pool(int device, cudaStream_t stream, MempoolId id)
{
    std::lock_guard<std::mutex> g(filters_mu());
    xseg_check(xseg_begin_allocate_to_pool(device, to_xseg(id), stream_trampoline, static_cast<void *>(stream)),
               "begin_allocate_stream_to_pool");
    stream_pools()[{device, stream}] = id;
}

[[maybe_unused]] void end_stream_to_pool(int device, cudaStream_t stream)
{
    MempoolId id;
    {
        std::lock_guard<std::mutex> g(filters_mu());
        auto it = stream_pools().find({device, stream});
        TORCH_CHECK(it != stream_pools().end(), "xseg: end_allocate_stream_to_pool: stream ",
                    static_cast<void *>(stream), " on device ", device, " is not allocating to a pool");
        id = it->second;
        stream_pools().erase(it);
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
// file descriptors are not, so the exporting process serves them over a Unix socket: the string
// names the socket, the export's id and that export's own token, and the importer fetches the
// descriptors with xseg_ipc_recv. Exports stay open until the block is freed (PyTorch's producer
// keeps the tensor alive while consumers use it).
//
// Handle strings travel through pickles, queues and logs, and the socket is visible to every
// local user, so the server trusts neither: the socket lives in a 0700 directory of its own
// (mkdtemp), a connection from another uid is closed before anything is read (SO_PEERCRED; other
// uids only where XSEG_TORCH_IPC_ALLOW_UIDS lists them), a token (128 random bits, one per export,
// drawn apart from the socket's name) opens only its export, and no peer can stall the server or
// crowd out another uid: it polls every connection, serves requests in the order they arrive,
// drops one that has not sent its request within IPC_PEER_MS, and holds at most
// IPC_PENDING_PER_UID waiting connections per peer uid (and IPC_PENDING_MAX in all): past that it
// drops that uid's oldest connection that has sent nothing, so a flood from one uid never drops
// the owner's imports, nor a request whose bytes have arrived. The importer bounds its own waits
// (IPC_CLIENT_S) and tells a dropped connection (retry) from a refused handle.
constexpr int IPC_PEER_MS = 10000;          // a request is 40 bytes written at once: generous under load
constexpr size_t IPC_PENDING_PER_UID = 64;  // one peer uid's connections awaiting their request
constexpr size_t IPC_PENDING_MAX = 256;     // all uids' together (the fds the server may hold)
constexpr size_t IPC_ACCEPT_BATCH = 64;     // connections taken between two rounds of reads
constexpr int IPC_CLIENT_S = 30;            // the importer's limit on connect, send and each receive
constexpr size_t IPC_TOKEN_HEX = 32;
constexpr char IPC_DROPPED = 'L';      // the one byte sent on a connection closed unread: under load
constexpr char IPC_NOT_ADMITTED = 'U'; // ... from a uid not admitted (an answer starts with 'X')
const char IPC_ALLOW_ENV[] = "XSEG_TORCH_IPC_ALLOW_UIDS";

using IpcHandlePtr = std::shared_ptr<xseg_ipc_handle>; // the server sends without holding ipc.mu
struct IpcExport {
    void *block;
    IpcHandlePtr handle;
    std::string token; // IPC_TOKEN_HEX hex digits
};
struct IpcExports {
    std::mutex mu;
    std::map<uint64_t, IpcExport> by_id;
    std::map<void *, uint64_t> by_ptr;
    uint64_t next_id = 1;
    std::string dir, path;    // the 0700 directory and the socket in it; empty until the server runs
    std::vector<uid_t> allow; // uids admitted besides this process's (XSEG_TORCH_IPC_ALLOW_UIDS)
    pid_t owner = 0;          // the process whose server thread serves path (not a forked child)
    int listen_fd = -1;
};
// Never destroyed: blocks are freed after this module's statics are gone (PyTorch's CUDA-IPC limbo,
// a static of libtorch_cuda, frees the blocks it still holds at exit; the H200's torch_checks.py
// died of heap corruption there, 2026-11-27, test torch-adapter-ipc-free-at-exit), and the
// detached server thread may still read it while the process exits.
IpcExports &ipc = *new IpcExports;
std::atomic<int> ipc_live{0}; // exports open: the free path looks the pointer up only when > 0

const char IPC_FABRIC[] = "xseg-ipc-fabric:";
const char IPC_FD[] = "xseg-ipc-fd:";

bool ipc_address(const std::string &path, sockaddr_un *a, socklen_t *len)
{
    *a = sockaddr_un{};
    a->sun_family = AF_UNIX;
    if (path.empty() || path[0] != '/' || path.size() >= sizeof a->sun_path || path.find('\0') != std::string::npos)
        return false;
    std::memcpy(a->sun_path, path.data(), path.size());
    *len = (socklen_t)(offsetof(sockaddr_un, sun_path) + path.size() + 1);
    return true;
}

// IPC_TOKEN_HEX hex digits of the kernel's random bits (getrandom, else /dev/urandom).
std::string ipc_new_token()
{
    unsigned char raw[IPC_TOKEN_HEX / 2];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t r = ::getrandom(raw + got, sizeof raw - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    if (got < sizeof raw) {
        int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
        while (fd >= 0 && got < sizeof raw) {
            ssize_t r = ::read(fd, raw + got, sizeof raw - got);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        if (fd >= 0)
            ::close(fd);
    }
    TORCH_CHECK(got == sizeof raw, "xseg: shareIpcHandle: no random bytes for the export's token (getrandom and "
                                   "/dev/urandom failed)");
    static const char digits[] = "0123456789abcdef";
    std::string t(IPC_TOKEN_HEX, '0');
    for (size_t i = 0; i < sizeof raw; i++) {
        t[2 * i] = digits[raw[i] >> 4];
        t[2 * i + 1] = digits[raw[i] & 15];
    }
    return t;
}

// Token comparison whose time does not depend on where the bytes differ.
bool ipc_same_token(const std::string &want, const char *got)
{
    if (want.size() != IPC_TOKEN_HEX) // never: every export's token has this length
        return false;
    unsigned char d = 0;
    for (size_t i = 0; i < IPC_TOKEN_HEX; i++)
        d |= (unsigned char)(want[i] ^ got[i]);
    return d == 0;
}

// The peer uid of connection @p c when it is this process's or an admitted one's.
std::optional<uid_t> ipc_peer_admitted(int c)
{
    ucred cr{};
    socklen_t len = sizeof cr;
    if (::getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0 || len != sizeof cr)
        return std::nullopt;
    if (cr.uid == ::geteuid())
        return cr.uid;
    std::lock_guard<std::mutex> g(ipc.mu);
    if (std::find(ipc.allow.begin(), ipc.allow.end(), cr.uid) != ipc.allow.end())
        return cr.uid;
    return std::nullopt;
}

// A complete request: 8 bytes of export id and IPC_TOKEN_HEX of token, answered with
// xseg_ipc_send of that export when the token is the export's (else the connection just closes).
void ipc_answer(int c, const char *req)
{
    uint64_t id;
    std::memcpy(&id, req, sizeof id);
    IpcHandlePtr h;
    {
        std::lock_guard<std::mutex> g(ipc.mu);
        auto it = ipc.by_id.find(id);
        if (it != ipc.by_id.end() && ipc_same_token(it->second.token, req + sizeof id))
            h = it->second.handle;
    }
    if (!h)
        return;
    int fl = ::fcntl(c, F_GETFL);
    timeval tv{IPC_PEER_MS / 1000, (IPC_PEER_MS % 1000) * 1000};
    if (fl >= 0 && ::fcntl(c, F_SETFL, fl & ~O_NONBLOCK) == 0 &&
        ::setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) == 0)
        (void)xseg_ipc_send(c, h.get()); // a peer that stops reading is dropped at the timeout
}

// Close connection @p c without reading its request, sending @p why first (one byte, never
// blocking: the importer tells a drop under load from a refused handle).
void ipc_close_unread(int c, char why)
{
    (void)::send(c, &why, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    ::close(c);
}

// The server: one thread polling the listening socket and every connection awaiting its request,
// so a silent or slow peer delays no one. Each round reads every connection with bytes in the
// order they arrived, then takes at most IPC_ACCEPT_BATCH new ones (a flood cannot keep the
// server accepting while requests wait), reading each at once: a request already sent is
// answered in its turn. Over a bound, the connection dropped is the crowding uid's oldest that
// has sent nothing (none arrived, none waiting: FIONREAD), never another uid's.
void ipc_serve(int lfd)
{
    constexpr size_t REQ = sizeof(uint64_t) + IPC_TOKEN_HEX;
    struct Pending {
        int fd;
        uid_t uid;
        size_t got;
        char req[REQ];
        std::chrono::steady_clock::time_point deadline;
    };
    std::vector<Pending> pend; // in arrival order
    std::vector<pollfd> pfd;
    // Read what @p p sent; @return whether it is done with (answered, closed by its peer, failed).
    auto serve = [](Pending &p) {
        ssize_t r = ::recv(p.fd, p.req + p.got, REQ - p.got, MSG_DONTWAIT);
        if (r > 0)
            p.got += (size_t)r;
        else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return true;
        if (p.got < REQ)
            return false;
        ipc_answer(p.fd, p.req);
        return true;
    };
    auto silent = [](const Pending &p) {
        int waiting = 0;
        return p.got == 0 && ::ioctl(p.fd, FIONREAD, &waiting) == 0 && waiting == 0;
    };
    auto count = [&](uid_t uid) {
        return (size_t)std::count_if(pend.begin(), pend.end(), [&](const Pending &q) { return q.uid == uid; });
    };
    auto close_at = [&](size_t i) { // unread: the importer is told why
        ipc_close_unread(pend[i].fd, IPC_DROPPED);
        pend.erase(pend.begin() + (std::ptrdiff_t)i);
    };
    // @p uid holds one connection too many: its oldest that has sent nothing goes. When each has
    // sent something, those are read first (a whole request is answered and leaves); if none
    // leaves, its oldest goes (each sent part of a request and stalls: a piecemeal writer).
    auto make_room = [&](uid_t uid) {
        for (size_t i = 0; i < pend.size(); i++)
            if (pend[i].uid == uid && silent(pend[i]))
                return close_at(i);
        size_t before = pend.size();
        for (size_t i = 0; i < pend.size();)
            if (pend[i].uid == uid && serve(pend[i]))
                close_at(i);
            else
                i++;
        for (size_t i = 0; i < pend.size() && pend.size() == before; i++)
            if (pend[i].uid == uid)
                return close_at(i);
    };
    const uid_t self = ::geteuid();
    for (;;) {
        auto now = std::chrono::steady_clock::now();
        int wait_ms = -1;
        pfd.assign(1, pollfd{lfd, POLLIN, 0});
        for (auto &p : pend) {
            pfd.push_back(pollfd{p.fd, POLLIN, 0});
            auto left = std::chrono::duration_cast<std::chrono::milliseconds>(p.deadline - now).count();
            int ms = (int)std::max<long long>(0, std::min<long long>(left + 1, IPC_PEER_MS));
            wait_ms = wait_ms < 0 ? ms : std::min(wait_ms, ms);
        }
        if (::poll(pfd.data(), pfd.size(), wait_ms) < 0) {
            if (errno != EINTR)
                std::this_thread::sleep_for(std::chrono::milliseconds(10)); // ENOMEM: try again
            continue;
        }
        now = std::chrono::steady_clock::now();
        std::vector<Pending> keep;
        for (size_t i = 0; i < pend.size(); i++) { // arrival order
            Pending &p = pend[i];
            bool done = pfd[i + 1].revents && serve(p);
            if (done)
                ::close(p.fd);
            else if (now >= p.deadline) // silent for IPC_PEER_MS: a stalled peer, or a host far behind
                ipc_close_unread(p.fd, IPC_DROPPED);
            else
                keep.push_back(p);
        }
        pend.swap(keep);
        if (!(pfd[0].revents & POLLIN))
            continue;
        for (size_t n = 0; n < IPC_ACCEPT_BATCH; n++) { // the listening socket is non-blocking
            int c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (c < 0) {
                if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
                    std::this_thread::sleep_for(std::chrono::milliseconds(50)); // EMFILE etc.: no spin
                break;
            }
            std::optional<uid_t> uid = ipc_peer_admitted(c);
            if (!uid) {
                ipc_close_unread(c, IPC_NOT_ADMITTED);
                continue;
            }
            Pending p{c, *uid, 0, {}, now + std::chrono::milliseconds(IPC_PEER_MS)};
            if (serve(p)) {
                ::close(c);
                continue;
            }
            pend.push_back(p);
            if (count(*uid) > IPC_PENDING_PER_UID) {
                make_room(*uid);
            } else if (pend.size() > IPC_PENDING_MAX) { // many admitted uids: the one holding most yields
                std::map<uid_t, size_t> held;
                for (auto &q : pend)
                    held[q.uid]++;
                auto most = std::max_element(held.begin(), held.end(), [&](const auto &a, const auto &b) {
                    return a.second != b.second ? a.second < b.second : a.first == self;
                });
                make_room(most->first);
            }
        }
    }
}

// At exit: the socket and its directory go (only by the process that made them).
void ipc_remove_socket()
{
    if (ipc.owner != ::getpid() || ipc.path.empty())
        return;
    (void)::unlink(ipc.path.c_str());
    (void)::rmdir(ipc.dir.c_str());
}

// XSEG_TORCH_IPC_ALLOW_UIDS: decimal uids separated by commas (unset or empty: none).
std::vector<uid_t> ipc_allowed_uids()
{
    std::vector<uid_t> out;
    const char *env = std::getenv(IPC_ALLOW_ENV);
    if (!env)
        return out;
    const char *s = env;
    while (*s) {
        char *end = nullptr;
        errno = 0;
        unsigned long long v = *s >= '0' && *s <= '9' ? std::strtoull(s, &end, 10) : 0;
        TORCH_CHECK(end && end != s && errno == 0 && v < (uid_t)-1 && (*end == ',' || *end == '\0'), "xseg: ",
                    IPC_ALLOW_ENV, "='", env, "': expected decimal uids separated by commas");
        out.push_back((uid_t)v);
        s = *end == ',' ? end + 1 : end;
    }
    return out;
}

// A new 0700 directory for the socket: under $XDG_RUNTIME_DIR when it is this user's and short
// enough for a socket path, else (and when other uids are admitted: the runtime directory is
// theirs to search only if it is 0711 or looser, so not relied on) under /tmp.
std::string ipc_make_dir(bool others)
{
    std::string uid = std::to_string(::geteuid());
    std::vector<std::string> bases;
    const char *xdg = std::getenv("XDG_RUNTIME_DIR");
    struct stat st {};
    if (!others && xdg && xdg[0] == '/' && std::strlen(xdg) < 64 && ::stat(xdg, &st) == 0 && S_ISDIR(st.st_mode) &&
        st.st_uid == ::geteuid())
        bases.push_back(xdg);
    bases.push_back("/tmp");
    int err = 0;
    for (auto &b : bases) {
        std::string tmpl = b + "/xseg-torch-ipc-" + uid + "-XXXXXX";
        if (::mkdtemp(&tmpl[0]))
            return tmpl;
        err = errno;
    }
    TORCH_CHECK(false, "xseg: shareIpcHandle: cannot make a directory for the descriptor socket under /tmp (",
                std::strerror(err), "); share blocks with xseg.ipc_export and IpcHandle.send instead");
    return {};
}

// Under ipc.mu: start the descriptor server once per process (a forked child starts its own).
void ipc_start_server()
{
    if (ipc.listen_fd >= 0 && ipc.owner == ::getpid())
        return;
    if (ipc.listen_fd >= 0) { // inherited through fork: the parent's server, not ours
        ::close(ipc.listen_fd);
        ipc.listen_fd = -1;
        ipc.dir.clear();
        ipc.path.clear();
    }
    std::vector<uid_t> allow = ipc_allowed_uids();
    std::string dir = ipc_make_dir(!allow.empty()), path = dir + "/socket";
    sockaddr_un a;
    socklen_t len = 0;
    int fd = -1, e = ENAMETOOLONG;
    if (ipc_address(path, &a, &len)) {
        fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        e = errno;
        // Admitted uids need to search the directory and write the socket; SO_PEERCRED keeps out
        // the rest.
        bool ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr *>(&a), len) == 0 &&
                  (allow.empty() || (::chmod(dir.c_str(), 0711) == 0 && ::chmod(path.c_str(), 0666) == 0)) &&
                  ::listen(fd, 64) == 0;
        e = errno;
        if (!ok && fd >= 0) {
            ::close(fd);
            fd = -1;
        }
    }
    if (fd < 0) {
        (void)::unlink(path.c_str());
        (void)::rmdir(dir.c_str());
        TORCH_CHECK(false, "xseg: shareIpcHandle: cannot serve file descriptors on the Unix socket ", path, " (",
                    std::strerror(e), "); share blocks with xseg.ipc_export and IpcHandle.send instead");
    }
    try {
        std::thread(ipc_serve, fd).detach();
    } catch (...) {
        ::close(fd);
        (void)::unlink(path.c_str());
        (void)::rmdir(dir.c_str());
        throw;
    }
    static bool at_exit = std::atexit(ipc_remove_socket) == 0;
    (void)at_exit;
    ipc.listen_fd = fd;
    ipc.dir = dir;
    ipc.path = path;
    ipc.allow = std::move(allow);
    ipc.owner = ::getpid();
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
    IpcHandlePtr hp(h, xseg_ipc_handle_free);
    xseg_ipc_info info{};
    (void)xseg_ipc_handle_info(h, &info);
    Handle out{};
    out.offset = 0; // the import's address is the block's own
    if (info.type == XSEG_IPC_FABRIC) {
        size_t len = 0;
        (void)xseg_ipc_serialize(h, nullptr, 0, &len);
        std::string bytes(len, '\0');
        xseg_check(xseg_ipc_serialize(h, &bytes[0], len, &len), "shareIpcHandle");
        out.handle = IPC_FABRIC + bytes;
        return out;
    }
    std::lock_guard<std::mutex> g(ipc.mu);
    ipc_start_server();
    auto old = ipc.by_ptr.find(ptr);
    if (old != ipc.by_ptr.end()) { // shared again: the export already served stays
        out.handle = IPC_FD + ipc.path + ":" + std::to_string(old->second) + ":" + ipc.by_id.at(old->second).token;
        return out;
    }
    std::string token = ipc_new_token();
    uint64_t id = ipc.next_id;
    ipc.by_id.emplace(id, IpcExport{ptr, hp, token});
    try {
        ipc.by_ptr[ptr] = id;
    } catch (...) {
        ipc.by_id.erase(id);
        throw;
    }
    ipc.next_id++;
    ipc_live.fetch_add(1, std::memory_order_relaxed);
    out.handle = IPC_FD + ipc.path + ":" + std::to_string(id) + ":" + token;
    return out;
}

// The block at @p ptr is being freed: close its export, if any (the descriptors close once a
// send in progress is done with them).
void ipc_forget(void *ptr)
{
    if (ipc_live.load(std::memory_order_relaxed) == 0)
        return;
    IpcHandlePtr h; // released after ipc.mu
    std::lock_guard<std::mutex> g(ipc.mu);
    auto it = ipc.by_ptr.find(ptr);
    if (it == ipc.by_ptr.end())
        return;
    auto e = ipc.by_id.find(it->second);
    h = std::move(e->second.handle);
    ipc.by_id.erase(e);
    ipc.by_ptr.erase(it);
    ipc_live.fetch_sub(1, std::memory_order_relaxed);
}

// ---- the blocks the adapter hands out -------------------------------------------------------

// The adapter allocates and frees its blocks itself (allocate, raw_alloc, raw_alloc_with_stream,
// raw_delete, raw_deleter and checkpoint restores), so PyTorch's wrapper never sees a pointer: its
// table of them holds _AllocationMetadata, whose members libtorch_cuda does not export (no
// TORCH_CUDA_CPP_API in 2.6, 2.11 or 2.14), and its DataPtr deleter changed between releases (a
// context object from pytorch#130472 until its revert, pytorch#162950). xseg knows each block's
// size, device and stream.

// Every block's deleter, whichever way PyTorch frees it (a DataPtr, raw_delete, raw_deallocate).
// Deleters run in destructors: a failure is reported on stderr.
void device_delete(void *ptr) noexcept
{
    if (!ptr)
        return;
    try {
        ipc_forget(ptr);
    } catch (...) {
        // std::mutex::lock failed: the export stays open until the process exits
    }
    if (xseg_free(ptr) != XSEG_SUCCESS)
        std::fprintf(stderr, "xseg: warning: freeing a tensor's block %p: %s\n", ptr, xseg_last_error());
}

// A block of @p size on PyTorch's current device for its current stream, as a DataPtr.
c10::DataPtr allocate_block(size_t size)
{
    c10::DeviceIndex dev = c10::cuda::current_device();
    void *p = adapter_malloc(size, dev, c10::cuda::getCurrentCUDAStream(dev).stream());
    return {p, p, device_delete, c10::Device(c10::DeviceType::CUDA, dev)};
}

// "xseg-ipc-fd:PATH:ID:TOKEN": fetch the descriptors from the exporting process's server.
xseg_ipc_handle *ipc_fetch(const std::string &rest)
{
    size_t b = rest.rfind(':');
    size_t a = b == std::string::npos || b == 0 ? std::string::npos : rest.rfind(':', b - 1);
    TORCH_CHECK(a != std::string::npos && rest.size() - b - 1 == IPC_TOKEN_HEX && b - a - 1 >= 1 && b - a - 1 <= 19 &&
                    rest.find_first_not_of("0123456789", a + 1) == b &&
                    rest.find_first_not_of("0123456789abcdef", b + 1) == std::string::npos,
                "xseg: getIpcDevPtr: malformed handle (xseg-ipc-fd:PATH:ID:TOKEN expected)");
    std::string path = rest.substr(0, a), token = rest.substr(b + 1);
    uint64_t id = std::strtoull(rest.c_str() + a + 1, nullptr, 10);
    sockaddr_un addr;
    socklen_t len = 0;
    TORCH_CHECK(ipc_address(path, &addr, &len), "xseg: getIpcDevPtr: malformed handle (the socket path '", path,
                "' is not an absolute path that fits a Unix socket address)");
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    TORCH_CHECK(fd >= 0, "xseg: getIpcDevPtr: socket: ", std::strerror(errno));
    timeval tv{IPC_CLIENT_S, 0}; // connect (a full backlog), the request and each receive
    bool bounded = ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) == 0 &&
                   ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0;
    if (!bounded || ::connect(fd, reinterpret_cast<sockaddr *>(&addr), len) != 0) {
        int e = errno;
        ::close(fd);
        TORCH_CHECK(false, "xseg: getIpcDevPtr: cannot reach the exporting process's socket ", path, " (",
                    std::strerror(e), "): it must be alive, in this mount namespace, and of this user (or admit "
                    "this uid with ", IPC_ALLOW_ENV, " in the exporting process); otherwise share blocks with "
                    "xseg.ipc_export and IpcHandle.send over a Unix socket you pass");
    }
    char req[sizeof id + IPC_TOKEN_HEX];
    std::memcpy(req, &id, sizeof id);
    std::memcpy(req + sizeof id, token.data(), IPC_TOKEN_HEX);
    // The answer starts with the handle's magic; a connection the server closes unread starts with
    // its reason instead (IPC_DROPPED, IPC_NOT_ADMITTED), which arrives even where our send failed
    // (EPIPE: closed before we wrote); a request it refused after reading gets end of file.
    ssize_t r;
    while ((r = ::send(fd, req, sizeof req, MSG_NOSIGNAL)) < 0 && errno == EINTR) {
    }
    bool sent = r == (ssize_t)sizeof req;
    int e = sent ? 0 : errno;
    char first = 0;
    ssize_t peek;
    while ((peek = ::recv(fd, &first, 1, MSG_PEEK)) < 0 && errno == EINTR) {
    }
    if (peek < 0)
        e = errno;
    bool answer = sent && peek == 1 && first != IPC_DROPPED && first != IPC_NOT_ADMITTED;
    xseg_ipc_handle *h = nullptr;
    xseg_status st = answer ? xseg_ipc_recv(fd, &h) : XSEG_ERROR_INVALID_VALUE;
    ::close(fd);
    TORCH_CHECK(!(peek == 1 && first == IPC_DROPPED),
                "xseg: getIpcDevPtr: the exporter dropped the connection under load before reading the request "
                "(its descriptor server keeps at most ", IPC_PENDING_PER_UID, " waiting connections per user, and "
                "processes of this uid filled them); the handle is still good while the exporting process lives: "
                "retry the import");
    TORCH_CHECK(!(peek == 1 && first == IPC_NOT_ADMITTED), "xseg: getIpcDevPtr: the exporting process does not "
                "admit this uid (", ::geteuid(), "): it serves its own uid and those its ", IPC_ALLOW_ENV, " lists");
    TORCH_CHECK(st == XSEG_SUCCESS, "xseg: getIpcDevPtr: the exporting process did not send the block (",
                answer ? xseg_last_error()
                       : peek == 0 ? "it closed the connection after reading the request"
                                   : e == EPIPE || e == ECONNRESET ? "it closed the connection unread: under load, "
                                                                     "or this uid is not admitted"
                                                                   : std::strerror(e),
                "): it was freed, the handle is stale or not this block's, this uid is not admitted (",
                IPC_ALLOW_ENV, "), or the exporter did not answer within ", IPC_CLIENT_S, " s");
    return h;
}

std::shared_ptr<void> get_ipc_dev_ptr(const std::string &handle)
{
    xseg_ipc_handle *h = nullptr;
    if (handle.compare(0, sizeof IPC_FABRIC - 1, IPC_FABRIC) == 0) {
        xseg_check(xseg_ipc_deserialize(handle.data() + sizeof IPC_FABRIC - 1, handle.size() - (sizeof IPC_FABRIC - 1), &h),
                   "getIpcDevPtr");
    } else if (handle.compare(0, sizeof IPC_FD - 1, IPC_FD) == 0) {
        h = ipc_fetch(handle.substr(sizeof IPC_FD - 1));
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
// the pool's free space is what it was. The DataPtrs carry the adapter's deleter, which frees
// any block of xseg's (cudagraph trees compare it with raw_deleter()).
template <class Delta>
Delta set_checkpoint_pool_state(int device, const std::shared_ptr<cca::AllocatorState> &pps)
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
        }
    for (const auto &b : st->blocks)
        if (b.allocated) {
            void *p = reinterpret_cast<void *>(b.address);
            d.dataptrs_allocd.emplace_back(p, p, device_delete, c10::Device(c10::DeviceType::CUDA, (c10::DeviceIndex)device));
        }
    return d;
}

// cudagraph trees' check of a private pool (torch._C._cuda_checkPoolLiveAllocations, after each
// warm-up, recording and checkpoint restore): true iff the pool's allocated blocks, on every
// stream and of both sizes, are exactly @p expected (PyTorch compares the block start pointers;
// blocks freed but pending their streams' work are not allocated). A pool unknown on the device
// raises, as PyTorch's does. Not a hot path: xseg walks the pool's blocks under its lock.
bool check_pool_live_allocations(int device, MempoolId id, const std::unordered_set<void *> &expected)
{
    // Room for one more than expected: a pool holding more blocks is told apart without them.
    std::vector<void *> live(expected.size() + 1);
    size_t n = 0;
    xseg_check(xseg_pool_live_blocks(device, to_xseg(id), live.data(), live.size(), &n), "checkPoolLiveAllocations");
    if (n != expected.size())
        return false;
    for (size_t i = 0; i < n; i++)
        if (!expected.count(live[i]))
            return false;
    return true;
}

// ---- MemPool(allocator=...): the owner's callbacks xseg calls (xseg_pool_allocator) ----------

// What xseg's callbacks reach: the MemPool's allocator, held while xseg knows the pool.
struct OwnedPool {
    std::shared_ptr<cca::CUDAAllocator> allocator;
    XSEG_TORCH_DEV device;
    MempoolId id;
};

// The live holders, so a second createOrIncrefPool of a pool finds the first one's (xseg checks
// the owner is the same). Never destroyed, as the export table: a pool may be forgotten at exit
// after this module's statics would be gone.
std::mutex &owned_pools_mu()
{
    static auto *m = new std::mutex;
    return *m;
}
std::vector<OwnedPool *> &owned_pools()
{
    static auto *v = new std::vector<OwnedPool *>;
    return *v;
}

// Called under xseg's device lock: the allocator must not call back into xseg (a
// CUDAPluggableAllocator calls its own alloc_fn / free_fn). An exception stops here: xseg sees
// no memory (an OOM it recovers from) or, for a free, nothing it could act on.
[[maybe_unused]] void *owned_alloc(size_t size, int, struct CUstream_st *stream, void *user)
{
    try {
        return static_cast<OwnedPool *>(user)->allocator->raw_alloc_with_stream(size, stream);
    } catch (...) {
        return nullptr;
    }
}

[[maybe_unused]] void owned_free(void *ptr, size_t, int, struct CUstream_st *, void *user)
{
    try {
        static_cast<OwnedPool *>(user)->allocator->raw_delete(ptr);
    } catch (...) {
    }
}

[[maybe_unused]] void owned_pool_unused(void *user)
{
    auto *op = static_cast<OwnedPool *>(user);
    {
        std::lock_guard<std::mutex> g(owned_pools_mu());
        auto &v = owned_pools();
        for (size_t i = 0; i < v.size(); i++)
            if (v[i] == op) {
                v.erase(v.begin() + (std::ptrdiff_t)i);
                break;
            }
    }
    delete op;
}

// xseg forgot the pool: no callback of it comes again (one holder a pool, so none other names it).
[[maybe_unused]] void owned_forget(void *user) { owned_pool_unused(user); }

// The owner for (@p device, @p id, @p a): the holder xseg knows already, or a new one (*@p created).
[[maybe_unused]] xseg_pool_allocator owned_pool_owner(XSEG_TORCH_DEV device, MempoolId id, const std::shared_ptr<cca::CUDAAllocator> &a,
                                     bool *created)
{
    *created = false;
    OwnedPool *op = nullptr;
    {
        std::lock_guard<std::mutex> g(owned_pools_mu());
        for (OwnedPool *p : owned_pools())
            if (p->device == device && p->id == id && p->allocator == a)
                op = p;
        if (!op) {
            op = new OwnedPool{a, device, id};
            owned_pools().push_back(op);
            *created = true;
        }
    }
    return xseg_pool_allocator{owned_alloc, owned_free, owned_forget, op};
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
    // MemPool(allocator=A): the pool's segments come from A and go back to A, as PyTorch's caching
    // allocator asks a MemPool's allocator (raw_alloc in alloc_block, raw_delete in release_block);
    // xseg caches, splits and merges them (xseg_pool_retain_owned). xseg holds A until it forgets
    // the pool (no users and no segment left): the forget callback drops that reference.
    void createOrIncrefPool(XSEG_TORCH_DEV device, MempoolId id,
                            std::shared_ptr<cca::CUDAAllocator> allocator) override
    {
        if (!allocator) {
            xseg_check(xseg_pool_retain(device, to_xseg(id)), "create_or_incref_pool");
            return;
        }
        // xseg as the pool's owner would allocate into itself under its own device lock.
        TORCH_CHECK(static_cast<const void *>(allocator.get()) != static_cast<const void *>(this),
                    "xseg: MemPool(allocator=...) was given xseg itself (the current allocator); create the MemPool "
                    "without an allocator to use xseg's memory");
        // One holder a (device, pool) while xseg knows the pool; a second MemPool use of the same
        // pool passes the same allocator, found here so xseg sees the same owner again.
        bool created = false;
        xseg_pool_allocator owner = owned_pool_owner(device, id, allocator, &created);
        xseg_status st = xseg_pool_retain_owned(device, to_xseg(id), &owner);
        if (st != XSEG_SUCCESS && created) // xseg keeps no copy: the new holder goes
            owned_pool_unused(owner.user);
        xseg_check(st, "create_or_incref_pool");
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
        // The wrapper's own functions, which nothing reaches while the overrides below stand.
        : AdapterBase(adapter_malloc, [](void *ptr, size_t, int, cudaStream_t) { device_delete(ptr); })
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

    // Allocation and free (the block section above says why the adapter does them itself).
    // allocate is const in the 2.1 interface, non-const later: the form this PyTorch declares overrides.
    c10::DataPtr allocate(size_t size) { return allocate_block(size); }
    c10::DataPtr allocate(size_t size) const { return allocate_block(size); }
    c10::DeleterFnPtr raw_deleter() const override { return device_delete; }
    void *raw_alloc(size_t size) override
    {
        c10::DeviceIndex dev = c10::cuda::current_device();
        return adapter_malloc(size, dev, c10::cuda::getCurrentCUDAStream(dev).stream());
    }
    void *raw_alloc_with_stream(size_t size, cudaStream_t stream) override
    {
        return adapter_malloc(size, c10::cuda::current_device(), stream);
    }
    // torch.cuda.caching_allocator_delete: a pointer xseg did not allocate raises, as PyTorch's does.
    void raw_delete(void *ptr) override
    {
        if (!ptr)
            return;
        ipc_forget(ptr);
        xseg_check(xseg_free(ptr), "raw_delete");
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

    bool checkPoolLiveAllocations(XSEG_TORCH_DEV device, MempoolId id,
                                  const std::unordered_set<void *> &expected_live_allocations) override
    {
        return check_pool_live_allocations(device, id, expected_live_allocations);
    }

    std::shared_ptr<cca::AllocatorState> getCheckpointState(XSEG_TORCH_DEV device, MempoolId id) override
    {
        return get_checkpoint_state(device, id);
    }
    cca::CheckpointDelta setCheckpointPoolState(XSEG_TORCH_DEV device, std::shared_ptr<cca::AllocatorState> pps) override
    {
        return set_checkpoint_pool_state<cca::CheckpointDelta>(device, pps);
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
