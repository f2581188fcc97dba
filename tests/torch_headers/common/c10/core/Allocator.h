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

#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#define C10_CUDA_API
#define TORCH_CUDA_CPP_API

namespace c10 {
using DeviceIndex = int8_t;
using DeleterFnPtr = void (*)(void *);
struct Device {};
struct Stream {};
struct DataPtr {
    void *get() const { return nullptr; }
};
struct GatheredContext {
    virtual ~GatheredContext() = default;
};
struct Allocator {
    virtual ~Allocator() = default;
};
namespace cuda {
struct CUDAStream {};
} // namespace cuda
} // namespace c10
namespace at {
using c10::DataPtr;
namespace cuda {
using c10::cuda::CUDAStream;
} // namespace cuda
} // namespace at
