// Scaffolding (tests/torch_headers/common/README.md): PyTorch's export macros as its headers define
// them for GCC on Linux (c10/macros/Export.h; torch/headeronly/macros/Export.h in 2.14), where
// every one of them, exporting or importing, is default visibility. The stand-in libtorch
// (run/fake_torch.cpp) is built with -fvisibility=hidden, as libtorch and libc10 are, so it
// exports exactly what the stubs mark with these, where the real headers mark it.
#pragma once
#define C10_EXPORT __attribute__((__visibility__("default")))
#define C10_IMPORT C10_EXPORT
#define C10_API C10_EXPORT
#define C10_CUDA_API C10_EXPORT
#define TORCH_API C10_EXPORT
#define TORCH_CUDA_CPP_API C10_EXPORT
