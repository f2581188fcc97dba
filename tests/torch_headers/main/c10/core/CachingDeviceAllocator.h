// Signature check stub (tests/torch_headers/README.md), not PyTorch: the declarations of
// c10/core/CachingDeviceAllocator.h of the newest interface that the adapter reaches (statistics
// and snapshot structs moved here from c10/cuda; c10::DeviceAllocator as the CUDA allocator's
// base, C10_API as in PyTorch), trimmed. SegmentInfo and BlockInfo keep the fields of the earlier headers (the adapter
// sets only those).
#pragma once
#include <array>
#include <ctime>

#include <c10/core/Allocator.h>

namespace c10 {
using CaptureId_t = unsigned long long;
using MempoolId_t = std::pair<CaptureId_t, CaptureId_t>;

namespace CachingDeviceAllocator {

struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;
  int64_t freed = 0;
};

enum struct StatType : uint64_t {
  AGGREGATE = 0,
  SMALL_POOL = 1,
  LARGE_POOL = 2,
  NUM_TYPES = 3
};

typedef std::array<Stat, static_cast<size_t>(StatType::NUM_TYPES)> StatArray;

struct DeviceStats {
  StatArray allocation;
  StatArray segment;
  StatArray active;
  StatArray inactive_split;
  StatArray allocated_bytes;
  StatArray reserved_bytes;
  StatArray active_bytes;
  StatArray inactive_split_bytes;
  StatArray requested_bytes;
  int64_t num_alloc_retries = 0;
  int64_t num_ooms = 0;
  Stat oversize_allocations;
  Stat oversize_segments;
  int64_t num_sync_all_streams = 0;
  int64_t num_device_alloc = 0;
  int64_t num_device_free = 0;
  int64_t max_split_size = 0;
};

typedef std::shared_ptr<GatheredContext> (*CreateContextFn)();

enum struct RecordContext {
  NEVER = 0,
  STATE = 1,
  ALLOC = 2,
  ALL = 3,
};

struct BlockInfo {
  int64_t size = 0;
  int64_t requested_size = 0;
  int32_t gc_counter = 0;
  bool allocated = false;
  bool active = false;
};

struct SegmentInfo {
  int64_t device = 0;
  int64_t address = 0;
  int64_t total_size = 0;
  int64_t requested_size = 0;
  int64_t allocated_size = 0;
  int64_t active_size = 0;
  cudaStream_t stream = 0;
  bool is_large = false;
  bool is_expandable = false;
  MempoolId_t owner_private_pool_id = {0, 0};
  std::vector<BlockInfo> blocks;
};

using approx_time_t = int64_t;
union trace_time_ {
  time_t t_;
  approx_time_t approx_t_;
};

struct TraceEntry {
  enum Action {
    ALLOC,
    FREE_REQUESTED,
    FREE_COMPLETED,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    SNAPSHOT,
    OOM,
    ANNOTATE
  };
  TraceEntry(
      Action action,
      c10::DeviceIndex device,
      size_t addr,
      size_t size,
      void* stream,
      MempoolId_t mempool,
      approx_time_t time,
      std::shared_ptr<GatheredContext> context = nullptr,
      std::string compile_context = "",
      std::string user_metadata = "")
      : action_(action),
        device_(device),
        addr_(addr),
        context_(std::move(context)),
        stream_(stream),
        size_(size),
        mempool_(std::move(mempool)),
        compile_context_(std::move(compile_context)),
        user_metadata_(std::move(user_metadata)) {
    time_.approx_t_ = time;
  }
  Action action_;
  c10::DeviceIndex device_;
  size_t addr_;
  std::shared_ptr<GatheredContext> context_;
  void* stream_{};
  size_t size_;
  MempoolId_t mempool_;
  trace_time_ time_{};
  std::string compile_context_;
  std::string user_metadata_;
};

using AllocatorTraceTracker = std::function<void(const TraceEntry&)>;

} // namespace CachingDeviceAllocator

struct C10_API DeviceAllocator : public c10::Allocator {
  DeviceAllocator(); // both defined in libc10 (2.14)
  ~DeviceAllocator() override;
  virtual bool initialized() = 0;
  virtual void emptyCache(MempoolId_t mempool_id = {0, 0}) = 0;
  virtual void recordStream(const DataPtr& ptr, c10::Stream stream) = 0;
  virtual CachingDeviceAllocator::DeviceStats getDeviceStats(
      c10::DeviceIndex device) = 0;
  virtual void resetAccumulatedStats(c10::DeviceIndex device) = 0;
  virtual void resetPeakStats(c10::DeviceIndex device) = 0;
  virtual std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) = 0;
};

} // namespace c10
