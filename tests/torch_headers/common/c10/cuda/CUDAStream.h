// Scaffolding (tests/torch_headers/common/README.md): the current stream, where the adapter's
// allocate() and raw_alloc() allocate and which its host allocator reads during a CUDA graph
// capture (C10_CUDA_API, as in c10/cuda/CUDAStream.h; run/fake_torch.cpp defines it).
#pragma once
#include <c10/core/Allocator.h>

namespace c10::cuda {
C10_CUDA_API CUDAStream getCurrentCUDAStream(DeviceIndex device_index = -1);
} // namespace c10::cuda
