// Scaffolding (tests/torch_headers/common/README.md): the current stream, which the adapter's
// host allocator reads during a CUDA graph capture (run/fake_torch.cpp defines it).
#pragma once
#include <c10/core/Allocator.h>

namespace c10::cuda {
CUDAStream getCurrentCUDAStream(DeviceIndex device_index = -1);
} // namespace c10::cuda
