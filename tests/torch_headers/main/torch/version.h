// Signature check stub (tests/torch_headers/README.md): the newest interface (pytorch main,
// CUDAPluggableAllocator.h at commit 011c9ee); its release number is not established, so the
// version is given as 2.10, above every boundary the adapter tests.
#pragma once
#define TORCH_VERSION_MAJOR 2
#define TORCH_VERSION_MINOR 10
#define TORCH_VERSION_PATCH 0
