// Signature check stub (tests/torch_headers/README.md), not PyTorch: the host allocator interface
// that pytorch#151431 added (merged 2025-04-22, first in 2.8): at::HostAllocator with allocate,
// record_event, empty_cache, get_stats and the two resets, and the registry; no pool hooks yet.
// HostStats' fields are those of 2.14's header (the adapter sets each only where it is declared).
#pragma once
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
};

struct HostAllocator : public c10::Allocator {
  // c10::Allocator's (the stubs' Allocator leaves it out).
  virtual void copy_data(void* dest, const void* src, std::size_t count) const = 0;

  virtual bool record_event(void* ptr, void* ctx, c10::Stream stream) = 0;
  virtual void empty_cache() = 0;
  virtual HostStats get_stats() = 0;
  virtual void reset_accumulated_stats() = 0;
  virtual void reset_peak_stats() = 0;
};

void setHostAllocator(c10::DeviceType device_type, HostAllocator* allocator, uint8_t priority = 0);
HostAllocator* getHostAllocator(c10::DeviceType device_type);
} // namespace at
