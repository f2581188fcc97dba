// Signature check stub (tests/torch_headers/README.md), not PyTorch: the host allocator interface
// of ATen/core/CachingHostAllocator.h as Debian's 2.14.1 headers declare it (at::HostAllocator,
// HostStats, the registry; TORCH_API where that header has it), trimmed to what the adapter
// overrides or calls. The pool hooks are
// those CUDA graph capture calls (pytorch#167507); the history and segment hooks are left out.
#pragma once
#include <functional>

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>

namespace c10::CachingAllocator {
using c10::CachingDeviceAllocator::Stat;
struct DurationStat {
  int64_t total = 0;
  int64_t max = 0;
  int64_t min = 0;
  int64_t count = 0;
};
} // namespace c10::CachingAllocator

namespace at {
using c10::CachingAllocator::DurationStat;
using c10::CachingAllocator::Stat;

struct HostStats {
  Stat active_requests;
  Stat active_bytes;
  Stat allocations;
  Stat allocated_bytes;
  DurationStat host_alloc_time;
  DurationStat host_free_time;
  int64_t num_host_alloc = 0;
  int64_t num_host_free = 0;
  std::vector<int64_t> bucket_allocation = std::vector<int64_t>(64);
};

struct TORCH_API HostAllocator : public c10::Allocator {
  // c10::Allocator's (the stubs' Allocator leaves it out).
  virtual void copy_data(void* dest, const void* src, std::size_t count) const = 0;

  virtual bool record_event(void* ptr, void* ctx, c10::Stream stream) = 0;
  virtual void empty_cache() = 0;
  virtual HostStats get_stats() = 0;
  virtual void reset_accumulated_stats() = 0;
  virtual void reset_peak_stats() = 0;
  virtual void begin_allocate_to_pool(c10::MempoolId_t pool_id, std::function<bool(c10::Stream)> filter) {
    TORCH_CHECK(false, "Not implemented for begin_allocate_to_pool");
  }
  virtual void end_allocate_to_pool(c10::MempoolId_t pool_id) {
    TORCH_CHECK(false, "Not implemented for end_allocate_to_pool");
  }
  virtual void release_pool(c10::MempoolId_t pool_id) {
    TORCH_CHECK(false, "Not implemented for release_pool");
  }
};

TORCH_API void setHostAllocator(c10::DeviceType device_type, HostAllocator* allocator, uint8_t priority = 0);
TORCH_API HostAllocator* getHostAllocator(c10::DeviceType device_type);
} // namespace at
