// Scaffolding (tests/torch_headers/common/README.md): the c10 basics the stubs use.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <c10/macros/Export.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <torch/version.h>

namespace c10 {
using DeviceIndex = int8_t;
using DeleterFnPtr = void (*)(void *);
enum class DeviceType : int8_t { CPU = 0, CUDA = 1 };
struct Device {
    Device() = default;
    Device(DeviceType t, DeviceIndex i) : type(t), index(i) {}
    DeviceType type = DeviceType::CPU;
    DeviceIndex index = -1;
};
// A stream: its device and native handle (PyTorch's keeps a device type, index and id and asks
// the device's guard for the handle; the stubs keep the handle itself).
struct Stream {
    Stream() = default;
    Stream(DeviceIndex device, void *handle) : device_(device), handle_(handle) {}
    DeviceIndex device_index() const noexcept { return device_; }
    void *native_handle() const { return handle_; }
    DeviceIndex device_ = 0;
    void *handle_ = nullptr;
};
struct DataPtr {
    DataPtr() = default;
    DataPtr(void *data, void *ctx, DeleterFnPtr deleter, Device device)
        : data_(data), ctx_(ctx), deleter_(deleter), device_(device)
    {
    }
    void *get() const { return data_; }
    void *get_context() const { return ctx_; }
    DeleterFnPtr get_deleter() const { return deleter_; }
    Device device() const { return device_; }
    void *data_ = nullptr;
    void *ctx_ = nullptr;
    DeleterFnPtr deleter_ = nullptr;
    Device device_;
};
struct GatheredContext {
    virtual ~GatheredContext() = default;
};
// The members the adapter's allocator reaches. allocate is const in the 2.1 interface (its
// CUDAPluggableAllocator.cpp defines `allocate(size_t) const`) and not from 2.3 (00a1abb's).
// is_simple_data_ptr is defined in libc10 (run/fake_torch.cpp here), the rest inline.
struct C10_API Allocator {
    virtual ~Allocator() = default;
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 3
    virtual DataPtr allocate(size_t n) const = 0;
#else
    virtual DataPtr allocate(size_t n) = 0;
#endif
    virtual bool is_simple_data_ptr(const DataPtr &data_ptr) const;
    virtual DeleterFnPtr raw_deleter() const { return nullptr; }
};
C10_API void SetAllocator(DeviceType t, Allocator *alloc, uint8_t priority = 0);
C10_API Allocator *GetAllocator(const DeviceType &t);
namespace cuda {
struct CUDAStream {
    cudaStream_t stream_ = nullptr;
    cudaStream_t stream() const { return stream_; }
    Stream unwrap() const { return Stream(0, stream_); }
};
} // namespace cuda
} // namespace c10
namespace at {
using c10::DataPtr;
namespace cuda {
using c10::cuda::CUDAStream;
} // namespace cuda
} // namespace at
