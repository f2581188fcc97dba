// Scaffolding (tests/torch_headers/common/README.md): PyTorch's current device, where the
// adapter's allocate() and raw_alloc() allocate (c10/cuda/CUDAFunctions.h declares it with
// C10_CUDA_API; run/fake_torch.cpp defines it).
#pragma once
#include <c10/core/Allocator.h>

namespace c10::cuda {
C10_CUDA_API DeviceIndex current_device();
} // namespace c10::cuda
