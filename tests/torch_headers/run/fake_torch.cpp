// A stand-in for PyTorch's side of the `main` stub interface, so that the adapter can be loaded
// and its allocation path run without PyTorch (tests/torch_headers/README.md). Not PyTorch.
//
// Built as a shared library with -fvisibility=hidden, as libtorch and libc10 are: it exports only
// what the stub headers mark with PyTorch's export macros (../common/c10/macros/Export.h), where
// the real headers mark it, and the few names below marked FAKE_VISIBLE (the CUDA runtime's, which
// libcudart exports, and the drivers' probes). An adapter that needs anything else of it does not
// load, as it would not load into PyTorch.
//
// Where the check depends on it, it behaves as PyTorch's torch/csrc/cuda/CUDAPluggableAllocator.cpp
// does (read at the 2.1 interface, at commit 00a1abb and at a recent main; the same in each):
//  - malloc(size, device, stream) calls the alloc function, records (size, device, stream) for the
//    pointer it returned in allocation_metadata_ (a protected member, as in PyTorch), and returns it: a NULL is neither checked nor turned into an error;
//  - allocate / raw_alloc / raw_alloc_with_stream call malloc on the current device
//    (fake_current_device) and stream; allocate's DataPtr carries raw_deleter()'s function;
//  - raw_delete looks the pointer up (unknown: error) and calls the free function with what
//    malloc recorded;
//  - init calls the init function; setMemoryFraction, emptyCache, recordStream, getBaseAllocation
//    and the pool calls forward to their hooks when set; name() is "pluggable";
//  - changeCurrentAllocator / getCurrentAllocator keep the allocator installed;
//  - raw_deleter's function calls the current allocator's raw_delete; memcpyAsync is a plain
//    cudaMemcpyAsync (p2p_enabled unread); enablePeerAccess enables the context's peer access
//    (recorded here, as fake_peer_calls); c10::SetAllocator keeps the highest priority's;
//  - at::setHostAllocator / getHostAllocator keep one host allocator per device type, a later
//    registration replacing it when its priority is at least as high (2.8 to 2.14);
//    getCurrentCUDAStream returns fake_current_stream.
// The CUDA runtime's copies only count their calls (fake_memcpy_plain, fake_memcpy_peer).
// Everything else raises, as the check never reaches it. CUDAAllocator's defaults are the stub
// header's inline ones, as in PyTorch. The real class keeps the hooks in
// members the stub header leaves out; this one keeps them beside it, by object.
#include <ATen/core/CachingHostAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <map>
#include <mutex>
#include <tuple>

// Not PyTorch's: names the drivers and the adapter reach outside libtorch.
#define FAKE_VISIBLE __attribute__((visibility("default")))

namespace c10 {
Error::Error(SourceLocation, std::string msg) : msg_(std::move(msg)) {}
const char* Error::what() const noexcept { return msg_.c_str(); }
OutOfMemoryError::OutOfMemoryError(SourceLocation loc, std::string msg) : Error(loc, std::move(msg)) {}
bool Allocator::is_simple_data_ptr(const DataPtr& data_ptr) const { return data_ptr.get() == data_ptr.get_context(); }
DeviceAllocator::DeviceAllocator() = default;
DeviceAllocator::~DeviceAllocator() = default;
} // namespace c10

namespace {
using namespace c10::cuda::CUDACachingAllocator;
using Pluggable = torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

struct Hooks {
  std::function<void*(size_t, int, cudaStream_t)> alloc_fn;
  std::function<void(void*, size_t, int, cudaStream_t)> free_fn;
  std::function<void(int)> init_fn;
  std::function<void()> reset_fn;
  std::function<void(double, int)> memory_fraction_fn;
  std::function<void*(void*, size_t*)> base_alloc_fn;
  std::function<void(void*, cudaStream_t)> record_stream_fn;
  std::function<void(int, c10::cuda::MempoolId_t, std::function<bool(cudaStream_t)>)> begin_fn;
  std::function<void(int, c10::cuda::MempoolId_t)> end_fn;
  std::function<void(int, c10::cuda::MempoolId_t)> release_fn;
  bool initialized = false;
};
std::mutex mu;
std::map<const Pluggable*, Hooks> hooks_of;

Hooks& hooks(const Pluggable* a) {
  std::lock_guard<std::mutex> g(mu);
  return hooks_of[a];
}

[[noreturn]] void not_in_stub(const char* what) {
  throw c10::Error({what, __FILE__, static_cast<uint32_t>(__LINE__)},
                   std::string("fake_torch: ") + what + " is not part of the stand-in");
}

std::shared_ptr<CUDAAllocator> current;
std::map<int, std::pair<c10::Allocator*, uint8_t>> registry;
} // namespace

FAKE_VISIBLE int fake_memcpy_plain = 0, fake_memcpy_peer = 0;
FAKE_VISIBLE std::vector<std::pair<int, int>> fake_peer_calls;

FAKE_VISIBLE cudaError_t cudaMemcpyAsync(void*, const void*, size_t, enum cudaMemcpyKind, cudaStream_t) {
  fake_memcpy_plain++;
  return cudaSuccess;
}
FAKE_VISIBLE cudaError_t cudaMemcpyPeerAsync(void*, int, const void*, int, size_t, cudaStream_t) {
  fake_memcpy_peer++;
  return cudaSuccess;
}

namespace c10 {
void SetAllocator(DeviceType t, Allocator* alloc, uint8_t priority) {
  auto& slot = registry[(int)t];
  if (!slot.first || priority >= slot.second)
    slot = {alloc, priority};
}
Allocator* GetAllocator(const DeviceType& t) { return registry[(int)t].first; }
} // namespace c10

// The host allocator registry, as ATen/core/CachingHostAllocator.cpp keeps it (2.8 to 2.14): one
// slot per device type, taken by a registration whose priority is at least the slot's.
namespace {
std::map<int, std::pair<at::HostAllocator*, uint8_t>> host_registry;
} // namespace
namespace at {
void setHostAllocator(c10::DeviceType t, HostAllocator* alloc, uint8_t priority) {
  auto& slot = host_registry[(int)t];
  if (priority >= slot.second)
    slot = {alloc, priority};
}
HostAllocator* getHostAllocator(c10::DeviceType t) { return host_registry[(int)t].first; }
} // namespace at

// The current device and stream (what current_device and getCurrentCUDAStream return; a driver
// sets them).
FAKE_VISIBLE cudaStream_t fake_current_stream = nullptr;
FAKE_VISIBLE c10::DeviceIndex fake_current_device = 0;
namespace c10::cuda {
CUDAStream getCurrentCUDAStream(DeviceIndex) { return CUDAStream{fake_current_stream}; }
DeviceIndex current_device() { return fake_current_device; }
} // namespace c10::cuda

namespace torch::cuda::CUDAPluggableAllocator {

std::shared_ptr<CUDAAllocator> getCurrentAllocator() { return current; }

void changeCurrentAllocator(const std::shared_ptr<CUDAAllocator>& allocator) {
  TORCH_CHECK(!current || !current->initialized(), "Can't swap an already initialized allocator");
  current = allocator;
}

CUDAPluggableAllocator::CUDAPluggableAllocator(std::function<void*(size_t, int, cudaStream_t)> alloc_fn,
                                               std::function<void(void*, size_t, int, cudaStream_t)> free_fn) {
  hooks(this).alloc_fn = std::move(alloc_fn);
  hooks(this).free_fn = std::move(free_fn);
}
CUDAPluggableAllocator::CUDAPluggableAllocator(CUDAPluggableAllocator& other)
    : CUDAAllocator(other) { hooks(this) = hooks(&other); }

void CUDAPluggableAllocator::set_init_fn(std::function<void(int)> f) { hooks(this).init_fn = std::move(f); }
void CUDAPluggableAllocator::set_reset_fn(std::function<void()> f) { hooks(this).reset_fn = std::move(f); }
void CUDAPluggableAllocator::set_memory_fraction_fn(std::function<void(double, int)> f) {
  hooks(this).memory_fraction_fn = std::move(f);
}
void CUDAPluggableAllocator::set_base_alloc_fn(std::function<void*(void*, size_t*)> f) {
  hooks(this).base_alloc_fn = std::move(f);
}
void CUDAPluggableAllocator::set_record_stream_fn(std::function<void(void*, cudaStream_t)> f) {
  hooks(this).record_stream_fn = std::move(f);
}
void CUDAPluggableAllocator::set_begin_allocate_to_pool(
    std::function<void(int, c10::cuda::MempoolId_t, std::function<bool(cudaStream_t)>)> f) {
  hooks(this).begin_fn = std::move(f);
}
void CUDAPluggableAllocator::set_end_allocate_to_pool_fn(std::function<void(int, c10::cuda::MempoolId_t)> f) {
  hooks(this).end_fn = std::move(f);
}
void CUDAPluggableAllocator::set_release_pool(std::function<void(int, c10::cuda::MempoolId_t)> f) {
  hooks(this).release_fn = std::move(f);
}

_AllocationMetadata::_AllocationMetadata() : size(0), device_idx(-1) {}
_AllocationMetadata::_AllocationMetadata(size_t size, c10::DeviceIndex device_idx, cudaStream_t stream)
    : size(size), device_idx(device_idx), stream(stream) {}

void* CUDAPluggableAllocator::malloc(size_t size, c10::DeviceIndex device, cudaStream_t stream) {
  void* r = hooks(this).alloc_fn(size, device, stream);
  {
    const std::lock_guard<std::mutex> lock(allocator_mutex_);
    allocation_metadata_[r] = _AllocationMetadata(size, device, stream);
  }
  return r;
}

static void local_raw_delete(void* ptr) { current->raw_delete(ptr); }
c10::DataPtr CUDAPluggableAllocator::allocate(size_t size) {
  c10::DeviceIndex device = c10::cuda::current_device();
  void* r = malloc(size, device, c10::cuda::getCurrentCUDAStream(device).stream());
  return {r, r, raw_deleter(), c10::Device(c10::DeviceType::CUDA, device)};
}
c10::DeleterFnPtr CUDAPluggableAllocator::raw_deleter() const { return &local_raw_delete; }
void* CUDAPluggableAllocator::raw_alloc(size_t nbytes) {
  c10::DeviceIndex device = c10::cuda::current_device();
  return malloc(nbytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
}
void* CUDAPluggableAllocator::raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) {
  return malloc(nbytes, c10::cuda::current_device(), stream);
}
void CUDAPluggableAllocator::raw_delete(void* ptr) {
  _AllocationMetadata m;
  {
    const std::lock_guard<std::mutex> lock(allocator_mutex_);
    auto it = allocation_metadata_.find(ptr);
    TORCH_CHECK(it != allocation_metadata_.end(), "Trying to free a pointer not allocated here");
    m = it->second;
    allocation_metadata_.erase(it);
  }
  hooks(this).free_fn(ptr, m.size, m.device_idx, m.stream);
}
void CUDAPluggableAllocator::init(int device_count) {
  if (hooks(this).init_fn)
    hooks(this).init_fn(device_count);
  hooks(this).initialized = true;
}
bool CUDAPluggableAllocator::initialized() { return hooks(this).initialized; }
double CUDAPluggableAllocator::getMemoryFraction(c10::DeviceIndex) { not_in_stub("getMemoryFraction"); }
void CUDAPluggableAllocator::setMemoryFraction(double fraction, c10::DeviceIndex device) {
  if (hooks(this).memory_fraction_fn)
    hooks(this).memory_fraction_fn(fraction, device);
}
std::vector<StreamSegmentSize> CUDAPluggableAllocator::getExpandableSegmentSizes(c10::DeviceIndex) {
  not_in_stub("getExpandableSegmentSizes");
}
void CUDAPluggableAllocator::emptyCache(c10::cuda::MempoolId_t) {
  if (hooks(this).reset_fn)
    hooks(this).reset_fn();
}
void CUDAPluggableAllocator::cacheInfo(c10::DeviceIndex, size_t*) { not_in_stub("cacheInfo"); }
void* CUDAPluggableAllocator::getBaseAllocation(void* ptr, size_t* size) {
  return hooks(this).base_alloc_fn ? hooks(this).base_alloc_fn(ptr, size) : ptr;
}
void CUDAPluggableAllocator::recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) {
  if (hooks(this).record_stream_fn)
    hooks(this).record_stream_fn(ptr.get(), stream.stream());
}
DeviceStats CUDAPluggableAllocator::getDeviceStats(c10::DeviceIndex) { not_in_stub("getDeviceStats"); }
void CUDAPluggableAllocator::resetAccumulatedStats(c10::DeviceIndex) { not_in_stub("resetAccumulatedStats"); }
void CUDAPluggableAllocator::resetPeakStats(c10::DeviceIndex) { not_in_stub("resetPeakStats"); }
SnapshotInfo CUDAPluggableAllocator::snapshot(c10::cuda::MempoolId_t, bool) { not_in_stub("snapshot"); }
void CUDAPluggableAllocator::beginAllocateToPool(c10::DeviceIndex device, c10::cuda::MempoolId_t id,
                                                 std::function<bool(cudaStream_t)> filter) {
  if (hooks(this).begin_fn)
    hooks(this).begin_fn(device, id, std::move(filter));
}
void CUDAPluggableAllocator::endAllocateToPool(c10::DeviceIndex device, c10::cuda::MempoolId_t id) {
  if (hooks(this).end_fn)
    hooks(this).end_fn(device, id);
}
void CUDAPluggableAllocator::releasePool(c10::DeviceIndex device, c10::cuda::MempoolId_t id) {
  if (hooks(this).release_fn)
    hooks(this).release_fn(device, id);
}
std::shared_ptr<void> CUDAPluggableAllocator::getIpcDevPtr(std::string) { not_in_stub("getIpcDevPtr"); }
ShareableHandle CUDAPluggableAllocator::shareIpcHandle(void*) { not_in_stub("shareIpcHandle"); }
void CUDAPluggableAllocator::recordHistory(bool, CreateContextFn, size_t, RecordContext, bool,
                                           const std::vector<std::string>&) {
  not_in_stub("recordHistory");
}
void CUDAPluggableAllocator::attachOutOfMemoryObserver(OutOfMemoryObserver) {
  not_in_stub("attachOutOfMemoryObserver");
}
void CUDAPluggableAllocator::attachOomRejectionObserver(OomRejectionObserver) {
  not_in_stub("attachOomRejectionObserver");
}
void CUDAPluggableAllocator::attachAllocatorTraceTracker(AllocatorTraceTracker) {
  not_in_stub("attachAllocatorTraceTracker");
}
std::shared_ptr<AllocatorState> CUDAPluggableAllocator::getCheckpointState(c10::DeviceIndex,
                                                                          c10::cuda::MempoolId_t) {
  not_in_stub("getCheckpointState");
}
CheckpointDelta CUDAPluggableAllocator::setCheckpointPoolState(c10::DeviceIndex,
                                                               std::shared_ptr<AllocatorState>) {
  not_in_stub("setCheckpointPoolState");
}
void CUDAPluggableAllocator::enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) {
  fake_peer_calls.emplace_back(dev, dev_to_access);
}
cudaError_t CUDAPluggableAllocator::memcpyAsync(void* dst, int, const void* src, int, size_t count,
                                                cudaStream_t stream, bool) {
  return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
}
std::string CUDAPluggableAllocator::name() { return "pluggable"; }

} // namespace torch::cuda::CUDAPluggableAllocator
